#!/usr/bin/env python3
"""tritonclient_conformance.py --url HOST:PORT --graphs DIR --graph NAME

Drives a running `tpserve serve` with NVIDIA's official tritonclient[http]
(the client Triton and KServe users already have): health, server and model
metadata, model readiness, Triton's model configuration and statistics
extensions, infer with JSON tensors and with the binary tensor extension
(each input/output combination), requested outputs, request ids, and error
reporting, the model repository (index; load and unload refused),
logging, classification (class_count) and trace extensions. Infer results
are checked against NAME.ref.safetensors
with the manifest rtol (graphs/README.md metric, via compare.py).

Prints PASS/FAIL lines and "N passed, N failed"; exit 1 on any failure.
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402

ST_TO_KSERVE = {"F32": "FP32", "F16": "FP16", "BF16": "BF16", "I32": "INT32", "I64": "INT64"}


class Results:
    def __init__(self):
        self.passed = self.failed = 0

    def check(self, ok, what):
        print("%s: %s" % ("PASS" if ok else "FAIL", what))
        if ok:
            self.passed += 1
        else:
            self.failed += 1
        return ok


try:  # tritonclient >= r26.06 takes and returns BF16 as ml_dtypes.bfloat16
    import ml_dtypes
except ImportError:  # older clients take float32 and truncate it themselves
    ml_dtypes = None


def client_array(st, a):
    """The numpy array tritonclient expects for a datatype (compare.load
    gives BF16 as its raw uint16 bits)."""
    if st != "BF16":
        return a
    if ml_dtypes is not None:
        return a.view(ml_dtypes.bfloat16)
    return compare.to_f64("BF16", a).astype(np.float32)


def as_f64(dt, a):
    return np.asarray(a).astype(np.float64)


def check_health(c, g, r):
    r.check(c.is_server_live(), "is_server_live")
    r.check(c.is_server_ready(), "is_server_ready")
    r.check(c.is_model_ready(g), "is_model_ready(%s)" % g)
    r.check(c.is_model_ready(g, model_version="1"), "is_model_ready(%s, version 1)" % g)
    r.check(not c.is_model_ready("no_such_model"), "is_model_ready(no_such_model) is false")


def check_metadata(c, g, inputs, ref, r):
    sm = c.get_server_metadata()
    r.check(sm.get("name") == "tpserve" and "binary_tensor_data" in sm.get("extensions", []),
            "server metadata: %s" % json.dumps(sm))
    mm = c.get_model_metadata(g)
    r.check(mm.get("name") == g and mm.get("platform") == "tpserve" and "1" in mm.get("versions", []),
            "model metadata name/platform/versions: %s %s %s"
            % (mm.get("name"), mm.get("platform"), mm.get("versions")))
    by_name = {i["name"]: i for i in mm.get("inputs", [])}
    for name, (st, a) in inputs.items():
        m = by_name.get(name, {})
        ok = (m.get("datatype") == ST_TO_KSERVE[st] and len(m.get("shape", [])) == a.ndim
              and all(s == -1 or s == d for s, d in zip(m["shape"], a.shape)))
        r.check(ok, "model metadata input %s: %s" % (name, m))
    outs = {o["name"]: o for o in mm.get("outputs", [])}
    r.check(sorted(outs) == sorted(ref), "model metadata outputs %s" % sorted(outs))
    mv = c.get_model_metadata(g, model_version="1")
    r.check(mv.get("name") == g, "model metadata with model_version='1'")


def check_config(c, g, inputs, ref, r):
    """Triton's model configuration extension, as perf_analyzer reads it."""
    sm = c.get_server_metadata()
    for ext in ("classification", "model_configuration", "statistics", "system_shared_memory", "model_repository",
                "logging", "trace"):
        r.check(ext in sm.get("extensions", []), "server metadata lists extension %s" % ext)
    cfg = c.get_model_config(g)
    mbs = cfg.get("max_batch_size")
    r.check(cfg.get("name") == g and isinstance(mbs, int) and mbs >= 0,
            "model config name %s, max_batch_size %s" % (cfg.get("name"), mbs))
    by_name = {i["name"]: i for i in cfg.get("input", [])}
    for name, (st, a) in inputs.items():
        i = by_name.get(name, {})
        want = list(a.shape[1:]) if mbs > 0 else list(a.shape)
        dims = i.get("dims", [])
        ok = (i.get("data_type") == "TYPE_" + ST_TO_KSERVE[st] and len(dims) == len(want)
              and all(d == -1 or d == w for d, w in zip(dims, want)))
        r.check(ok, "model config input %s: %s" % (name, i))
    r.check(sorted(o["name"] for o in cfg.get("output", [])) == sorted(ref),
            "model config outputs %s" % [o["name"] for o in cfg.get("output", [])])
    r.check((mbs > 0) == ("dynamic_batching" in cfg),
            "dynamic_batching present exactly when max_batch_size > 0 (%s)" % mbs)
    r.check(c.get_model_config(g, model_version="1").get("name") == g, "model config, version 1")


def model_stat(c, g):
    st = c.get_inference_statistics(g)["model_stats"]
    return st[0] if len(st) == 1 and st[0].get("name") == g else None


def check_stats(c, g, before, r):
    """Triton's statistics extension after the infer_modes requests."""
    s = model_stat(c, g)
    if not r.check(s is not None, "statistics for %s" % g):
        return
    inf = s["inference_stats"]
    done = inf["success"]["count"] - before
    r.check(done >= 6, "statistics: %d successful requests counted (>= 6 sent)" % done)
    for k in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        r.check(inf[k]["count"] >= done and inf[k]["ns"] > 0, "statistics %s: %s" % (k, inf[k]))
    # the phases tile each request from its body in to its answer encoded
    # (nanoseconds rounded per request: a count's worth of slack)
    parts = sum(inf[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    r.check(parts <= inf["success"]["ns"] + 4 * inf["success"]["count"],
            "statistics: queue + compute phases %d ns within success %d ns" % (parts, inf["success"]["ns"]))
    per_batch = sum(b["compute_infer"]["count"] for b in s["batch_stats"])
    r.check(s["execution_count"] >= 1 and per_batch == s["execution_count"]
            and s["inference_count"] >= s["execution_count"] and s["last_inference"] > 0,
            "statistics: %d executions, %d by batch size, %d inferences"
            % (s["execution_count"], per_batch, s["inference_count"]))
    all_models = c.get_inference_statistics()["model_stats"]
    r.check([m["name"] for m in all_models] == [g], "statistics of all models: %s"
            % [m["name"] for m in all_models])


def compare_outputs(res, ref, rtol, names, r, what):
    ok = True
    for name in names:
        st, want = ref[name]
        got = res.as_numpy(name)
        if got is None or tuple(got.shape) != want.shape:
            r.check(False, "%s: output %s shape %s, expected %s"
                    % (what, name, None if got is None else got.shape, want.shape))
            ok = False
            continue
        err = compare.rel_err(as_f64(st, got), compare.to_f64(st, want))
        ok = r.check(err <= rtol, "%s: %s err=%.3e rtol=%.1e" % (what, name, err, rtol)) and ok
    return ok


def infer_modes(c, g, inputs, ref, rtol, r):
    for bin_in in (False, True):
        for bin_out in (False, True):
            what = "infer %s in, %s out" % ("binary" if bin_in else "JSON",
                                            "binary" if bin_out else "JSON")
            ins = []
            for name, (st, a) in inputs.items():
                i = httpclient.InferInput(name, list(a.shape), ST_TO_KSERVE[st])
                i.set_data_from_numpy(client_array(st, a), binary_data=bin_in or st == "BF16")
                ins.append(i)
            outs = [httpclient.InferRequestedOutput(n, binary_data=bin_out) for n in sorted(ref)]
            rid = "tc-%d%d" % (bin_in, bin_out)
            res = c.infer(g, ins, outputs=outs, request_id=rid)
            r.check(res.get_response().get("id") == rid, "%s: id %s echoed" % (what, rid))
            compare_outputs(res, ref, rtol, sorted(ref), r, what)
    # no outputs named: the client asks for all of them (as binary)
    ins = []
    for name, (st, a) in inputs.items():
        i = httpclient.InferInput(name, list(a.shape), ST_TO_KSERVE[st])
        i.set_data_from_numpy(client_array(st, a))
        ins.append(i)
    res = c.infer(g, ins, model_version="1")
    compare_outputs(res, ref, rtol, sorted(ref), r, "infer (version 1, all outputs by default)")
    # tritonclient's compressed requests (Content-Encoding), binary and JSON
    # tensors; its answers asked compressed too (Accept-Encoding), which
    # tpserve answers uncompressed, as HTTP allows and tritonclient reads
    for algo in ("gzip", "deflate"):
        for binary in (True, False):
            cins = []
            for name, (st, a) in inputs.items():
                i = httpclient.InferInput(name, list(a.shape), ST_TO_KSERVE[st])
                i.set_data_from_numpy(client_array(st, a), binary_data=binary or st == "BF16")
                cins.append(i)
            res = c.infer(g, cins, request_compression_algorithm=algo, response_compression_algorithm=algo)
            compare_outputs(res, ref, rtol, sorted(ref), r,
                            "infer sent %s-compressed (%s tensors)" % (algo, "binary" if binary else "JSON"))
    first = sorted(ref)[0]
    res = c.infer(g, ins, outputs=[httpclient.InferRequestedOutput(first)])
    names = [o["name"] for o in res.get_response()["outputs"]]
    r.check(names == [first], "only the requested output %s is returned (%s)" % (first, names))
    return ins


def check_shm(c, g, inputs, ref, rtol, r):
    """Triton's system shared memory extension: inputs read from and outputs
    written to regions the client registered; bad registrations refused."""
    import tritonclient.utils.shared_memory as shm
    tag = "%d" % os.getpid()
    in_arrays = [a for _, (st, a) in inputs.items()]
    in_size = sum(a.nbytes for a in in_arrays)
    out_size = sum(ref[n][1].nbytes for n in sorted(ref))
    ih = shm.create_shared_memory_region("tp_in", "/tp_in_" + tag, in_size)
    oh = shm.create_shared_memory_region("tp_out", "/tp_out_" + tag, out_size)
    try:
        shm.set_shared_memory_region(ih, in_arrays)
        c.unregister_system_shared_memory()
        c.register_system_shared_memory("tp_in", "/tp_in_" + tag, in_size)
        c.register_system_shared_memory("tp_out", "/tp_out_" + tag, out_size)
        names = sorted(x["name"] for x in c.get_system_shared_memory_status())
        r.check(names == ["tp_in", "tp_out"], "system shared memory status lists %s" % names)
        one = c.get_system_shared_memory_status("tp_in")
        r.check(len(one) == 1 and one[0]["byte_size"] == in_size and one[0]["key"] == "/tp_in_" + tag,
                "status of one region: %s" % one)
        ins, off = [], 0
        for name, (st, a) in inputs.items():
            i = httpclient.InferInput(name, list(a.shape), ST_TO_KSERVE[st])
            i.set_shared_memory("tp_in", a.nbytes, offset=off)
            ins.append(i)
            off += a.nbytes
        outs, where, off = [], {}, 0
        for name in sorted(ref):
            o = httpclient.InferRequestedOutput(name)
            o.set_shared_memory("tp_out", ref[name][1].nbytes, offset=off)
            outs.append(o)
            where[name] = off
            off += ref[name][1].nbytes
        res = c.infer(g, ins, outputs=outs)
        for name in sorted(ref):
            st, want = ref[name]
            got = shm.get_contents_as_numpy(oh, want.dtype, want.shape, offset=where[name])
            out = res.get_output(name)
            r.check("data" not in out and "parameters" not in out,
                    "shm output %s answered without data or parameters: %s" % (name, out))
            err = compare.rel_err(compare.to_f64(st, got), compare.to_f64(st, want))
            r.check(err <= rtol, "infer through system shared memory: %s err=%.3e" % (name, err))
        expect_error(r, "register a name twice",
                     lambda: c.register_system_shared_memory("tp_in", "/tp_in_" + tag, in_size),
                     "already registered")
        expect_error(r, "register past the object's end",
                     lambda: c.register_system_shared_memory("tp_big", "/tp_in_" + tag, in_size + 1),
                     "does not fit")
        expect_error(r, "register an object that does not exist",
                     lambda: c.register_system_shared_memory("tp_none", "/tp_none_" + tag, 8),
                     "cannot open")
        big = httpclient.InferInput(ins[0].name(), ins[0].shape(), ins[0].datatype())
        big.set_shared_memory("tp_in", in_size + 8)
        expect_error(r, "input byte size vs shape", lambda: c.infer(g, [big] + ins[1:]),
                     "shared_memory_byte_size")
        c.unregister_system_shared_memory("tp_in")
        expect_error(r, "infer from an unregistered region", lambda: c.infer(g, ins, outputs=outs),
                     "no shared memory region 'tp_in'")
    finally:
        c.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(ih)
        shm.destroy_shared_memory_region(oh)
    r.check(c.get_system_shared_memory_status() == [], "every region unregistered")


def check_repository_and_logging(c, g, r):
    """Triton's model repository (index; load and unload refused, as in
    Triton without explicit model control) and logging extensions."""
    idx = c.get_model_repository_index()
    r.check([(m.get("name"), m.get("version"), m.get("state")) for m in idx] == [(g, "1", "READY")],
            "repository index %s" % idx)
    expect_error(r, "load refused", lambda: c.load_model(g), "cannot be loaded", "restart it")
    expect_error(r, "unload refused", lambda: c.unload_model(g), "cannot be unloaded")
    r.check(c.is_model_ready(g), "model still ready after the refused load and unload")
    before = c.get_log_settings()
    r.check(before.get("log_error") is True and before.get("log_format") == "ISO8601",
            "log settings %s" % before)
    quiet = c.update_log_settings({"log_info": False})
    r.check(quiet.get("log_info") is False and quiet.get("log_warning") is True
            and quiet.get("log_verbose_level") == 0, "info lines off: %s" % quiet)
    after = c.update_log_settings({"log_verbose_level": 1})
    r.check(after.get("log_verbose_level") == 1 and after.get("log_info") is True,
            "verbose logging on: %s" % after)
    r.check(c.get_log_settings() == after, "log settings read back as set")
    expect_error(r, "info without warnings refused",
                 lambda: c.update_log_settings({"log_info": True, "log_warning": False}), "one threshold")
    r.check(c.get_log_settings() == after, "a refused change changes nothing")
    restored = c.update_log_settings({k: before[k] for k in ("log_info", "log_warning", "log_verbose_level")})
    r.check(restored == before, "log settings restored: %s" % restored)


def expect_error(r, what, fn, *words):
    try:
        fn()
        r.check(False, "%s: no error raised" % what)
    except InferenceServerException as e:
        msg = str(e)
        r.check(all(w in msg for w in words), "%s: %s" % (what, msg))


def expected_classes(a, batched, count):
    """tpserve's classes of each batch entry of a, as classify.h ranks them
    (larger first, then the lower index, NaN last) and prints them ("%f"
    for floats, decimal for integers)."""
    entries = a.reshape(a.shape[0], -1) if batched else a.reshape(1, -1)
    out = []
    for e in entries:
        v = e.astype(np.float64) if e.dtype.kind == "f" or e.dtype.name == "bfloat16" else e
        order = sorted(range(len(v)), key=lambda i: (bool(np.isnan(v[i])) if v.dtype.kind == "f" else False,
                                                     -v[i] if v.dtype.kind != "f" or not np.isnan(v[i]) else 0, i))
        fmt = "%f:%d" if v.dtype.kind == "f" else "%d:%d"
        out.append([(fmt % (v[i], i)).encode() for i in order[:count]])
    k = min(count, entries.shape[1])
    return np.array(out, dtype=object).reshape((a.shape[0], k) if batched else (k,))


def check_classification(c, g, ins, r):
    """Triton's classification extension: InferRequestedOutput(class_count=N)
    answers the top N classes of each batch entry as BYTES, checked against
    the same request's values (the same batch replays bit for bit)."""
    batched = c.get_model_config(g).get("max_batch_size", 0) > 0
    name = sorted(o["name"] for o in c.get_model_metadata(g)["outputs"])[0]
    values = c.infer(g, ins, outputs=[httpclient.InferRequestedOutput(name, binary_data=True)]).as_numpy(name)
    want = expected_classes(values, batched, 3)
    for binary in (True, False):
        res = c.infer(g, ins, outputs=[httpclient.InferRequestedOutput(name, binary_data=binary, class_count=3)])
        got = res.as_numpy(name)
        out = res.get_output(name)
        ok = (out["datatype"] == "BYTES" and got is not None and got.shape == want.shape
              and [bytes(x) if binary else str(x).encode() for x in got.flat] == list(want.flat))
        r.check(ok, "classification (%s): %s top 3 %s" % ("binary" if binary else "JSON", name,
                                                         list(got.flat)[:3] if got is not None else None))


def check_trace(c, g, ins, r):
    """Triton's trace extension through tritonclient (the server was started
    with a trace_file): the model's settings over the global ones, a
    request traced to the file, tracing off again, the file never chosen by
    a client."""
    path = c.get_trace_settings().get("trace_file")
    s = c.update_trace_settings(settings={"log_frequency": "1"})
    r.check(bool(path) and s.get("trace_file") == path and s.get("trace_level") == ["OFF"],
            "global trace settings: %s" % s)
    s = c.update_trace_settings(model_name=g, settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"})
    r.check(s.get("trace_level") == ["TIMESTAMPS"] and s.get("trace_file") == path,
            "model trace settings over the global ones: %s" % s)
    r.check(c.get_trace_settings().get("trace_level") == ["OFF"], "global trace level still OFF")
    c.infer(g, ins, request_id="traced-1")
    # the trace is taken once the answer is out, so it may land just after
    # the client has it
    for _ in range(100):
        try:
            with open(path + ".0") as f:
                t = json.load(f)
            break
        except (OSError, ValueError, TypeError) as e:
            t = [str(e)]
            time.sleep(0.05)
    r.check(len(t) == 1 and isinstance(t[0], dict) and t[0].get("request_id") == "traced-1"
            and t[0].get("model_name") == g and len(t[0].get("timestamps", [])) == 11,
            "one request traced to %s.0: %s" % (path, str(t)[:160]))
    s = c.update_trace_settings(model_name=g, settings={})
    r.check(s.get("trace_level") == ["OFF"], "model trace settings given back to the global ones")
    expect_error(r, "trace_file chosen by a client", lambda: c.update_trace_settings(
        settings={"trace_file": "/tmp/elsewhere.json"}), "trace_file cannot be changed here")
    c.update_trace_settings(settings={"log_frequency": None})


def check_errors(c, g, inputs, ins, r):
    expect_error(r, "unknown model", lambda: c.infer("no_such_model", ins), "unknown model")
    name, (st, a) = next(iter(inputs.items()))
    bad_shape = list(a.shape)
    bad_shape[-1] += 1
    i = httpclient.InferInput(name, bad_shape, ST_TO_KSERVE[st])
    arr = np.zeros(bad_shape, dtype=client_array(st, a).dtype)
    i.set_data_from_numpy(arr, binary_data=True)
    expect_error(r, "wrong shape", lambda: c.infer(g, [i]), "input '%s'" % name, "does not match")
    i = httpclient.InferInput("no_such_input", list(a.shape), ST_TO_KSERVE[st])
    i.set_data_from_numpy(client_array(st, a), binary_data=True)
    expect_error(r, "unknown input", lambda: c.infer(g, ins + [i]), "unknown input 'no_such_input'")
    r.check(c.is_server_live(), "server still live after the errors")
    s = model_stat(c, g)
    r.check(s is not None and s["inference_stats"]["fail"]["count"] >= 2,
            "statistics count the failed requests: %s" % (s and s["inference_stats"]["fail"]))


def main(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True, help="HOST:PORT")
    p.add_argument("--graphs", required=True)
    p.add_argument("--graph", required=True)
    a = p.parse_args(argv[1:])
    with open(os.path.join(a.graphs, "manifest.json")) as f:
        m = next(x for x in json.load(f)["graphs"] if x["name"] == a.graph)
    inputs = compare.load(os.path.join(a.graphs, m["inputs"]))
    ref = compare.load(os.path.join(a.graphs, m["ref"]))
    r = Results()
    c = httpclient.InferenceServerClient(url=a.url)
    try:
        check_health(c, a.graph, r)
        check_metadata(c, a.graph, inputs, ref, r)
        check_config(c, a.graph, inputs, ref, r)
        before = model_stat(c, a.graph)["inference_stats"]["success"]["count"]
        ins = infer_modes(c, a.graph, inputs, ref, m["rtol"], r)
        check_stats(c, a.graph, before, r)
        check_shm(c, a.graph, inputs, ref, m["rtol"], r)
        check_classification(c, a.graph, ins, r)
        check_trace(c, a.graph, ins, r)
        check_errors(c, a.graph, inputs, ins, r)
        check_repository_and_logging(c, a.graph, r)
    except Exception as e:  # a client-side surprise is a failure, not a crash
        r.check(False, "unexpected %s: %s" % (type(e).__name__, e))
    finally:
        c.close()
    print("tritonclient %s: %d passed, %d failed" % (a.graph, r.passed, r.failed))
    return 1 if r.failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
