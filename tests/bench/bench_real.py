#!/usr/bin/env python3
"""bench_real.py --tpserve BIN [--cache build/real] [--models gpt2,bert,llama] [--iters N (20)]
                [--import-only] [--keep DIR]

Full-size models (tests/bench/export_real.py exports them into the cache
when missing: GPT-2 small with its LM head, BERT-base, a ~125M Llama; FP32,
random weights, sequence 128), each imported at world size 1 and 2 and
served by tpserve on the cpu backend, against onnxruntime's CPU provider
with as many intra-op threads as tpserve runs GEMMs on (its startup log:
threads per rank x ranks). Prints one markdown table:

- import s, peak RSS / weights: graphs/import_onnx.py's wall time and its
  peak RSS (the child's ru_maxrss) over the bytes of the ONNX initializers
- engine ms b1/b4: tpserve's compute_infer statistics (the engine alone;
  median over requests) at batch 1 and 4; HTTP ms: one binary KServe request on a keep-alive
  connection from this process (median); ort ms: onnxruntime in-process
  (median), one run after each timed tpserve request, so both see the same
  moments of a noisy machine; tpserve / ort: engine and HTTP over onnxruntime
- GEMM GFLOP/s: the FLOPs of the model's weight matmuls per request over the
  engine time, beside OpenBLAS's cblas_sgemm alone (the library tpserve
  links, the kernels it runs, the same thread count) on the model's largest
  weight matmul at the same rows (batch x 128): how far the whole model is
  from the machine's GEMM rate

Every tpserve answer is checked against onnxruntime's (relative error
<= 1e-3; 1e-2 for the FP16 exports, gpt2_fp16 and so on, by name in
--models) before it is timed. Never fails on timings; exits 1 when an import
fails or an answer is wrong (or tpserve cannot serve a graph), with the
reason in that row and under the table.

--import-only: import rows alone (e.g. `--models llama1b --import-only`, the
0.85B-parameter Llama of export_real.py --llama-1b, by hand). Needs numpy, onnx,
onnxruntime, and torch + transformers + onnxscript for the exports."""
import argparse
import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, HERE)
import bench_import as bi  # noqa: E402  (its path setup makes kserve_client and reference importable)
import reference  # noqa: E402

RTOL = 1e-3
# FP16 rows (*_fp16, model.half() exports) against onnxruntime's FP16 run:
# unit roundoff 4.9e-4 compounding through 12 layers, rounded at other
# points by each side; tests/integration/test_onnx_dtypes.sh's tolerance.
RTOL_FP16 = 1e-2
BATCHES = (1, 4)
SEQ = 128


def one_line(text):
    """The importer's one-line error (its last non-empty stderr line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else "no message"


# Run by a small interpreter of its own: a child forked from this process
# (large: onnxruntime, the model) would count this process's pages in its
# ru_maxrss, which Linux keeps across exec.
MEASURE = """import os, sys, time
t0 = time.perf_counter()
pid = os.spawnv(os.P_NOWAIT, sys.argv[1], sys.argv[1:])
_, status, ru = os.wait4(pid, 0)
print(time.perf_counter() - t0, ru.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


# Seconds between a tpserve request and an onnxruntime run (ort_once).
QUIET_S = 0.05


def run_import(src, ws, out, extra=()):
    """(seconds, peak RSS bytes, error or None) of import_onnx.py SRC at WS
    (EXTRA: more importer flags)."""
    r = subprocess.run([sys.executable, "-c", MEASURE, sys.executable, os.path.join(ROOT, "graphs", "import_onnx.py"),
                        src, "--world-size", str(ws), "--out", out, *extra], capture_output=True, text=True)
    try:
        dt, kb, rc = r.stdout.split()[-3:]
    except ValueError:
        return 0.0, 0, "bench_real: measuring the import failed: %s" % one_line(r.stderr)
    return float(dt), int(kb) * 1024, (one_line(r.stderr) if int(rc) != 0 else None)


def weights_info(model):
    """(bytes of the initializers, FLOPs per token of the weight matmuls,
    the largest weight matmul's (K, N)) of a model loaded without its data."""
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    size = sum(int(np.prod(d, dtype=np.int64)) * onnx.helper.tensor_dtype_to_np_dtype(i.data_type).itemsize
               for i, d in ((i, list(i.dims)) for i in model.graph.initializer))
    transposed = {n.output[0]: inits[n.input[0]][::-1] for n in model.graph.node
                  if n.op_type == "Transpose" and n.input[0] in inits and len(inits[n.input[0]]) == 2}
    flops, big = 0, (0, 0)
    for n in model.graph.node:
        kn = None
        if n.op_type == "MatMul":
            kn = inits.get(n.input[1]) or transposed.get(n.input[1])
        elif n.op_type == "Gemm":
            kn = inits.get(n.input[1]) or transposed.get(n.input[1])
            if kn and any(a.name == "transB" and a.i for a in n.attribute):
                kn = kn[::-1]
        if kn and len(kn) == 2:
            flops += 2 * kn[0] * kn[1]
            big = max(big, tuple(kn), key=lambda s: s[0] * s[1])
    return size, flops, big


def openblas_path(tpserve):
    """The libopenblas tpserve is linked with (ldd), or None."""
    try:
        out = subprocess.run(["ldd", tpserve], capture_output=True, text=True).stdout
    except OSError:
        return None
    m = re.search(r"libopenblas\S*\s+=>\s+(\S+)", out)
    return m.group(1) if m else None


def sgemm_child(lib, m, k, n, threads):
    """Run in a child (its environment picks OpenBLAS's kernels): the best
    GFLOP/s of cblas_sgemm M x K by K x N, row-major as ops_matmul.c calls it."""
    blas = ctypes.CDLL(lib)
    blas.openblas_set_num_threads(ctypes.c_int(threads))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32) * 0.1
    b = rng.standard_normal((k, n), dtype=np.float32) * 0.1
    c = np.empty((m, n), np.float32)
    f = blas.cblas_sgemm
    f.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                       ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    args = (101, 111, 111, m, n, k, 1.0, a.ctypes.data, k, b.ctypes.data, n, 0.0, c.ctypes.data, n)
    f(*args)
    t0 = time.perf_counter()
    f(*args)
    reps = max(1, min(1000, int(0.2 / max(time.perf_counter() - t0, 1e-6))))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            f(*args)
        best = min(best, (time.perf_counter() - t0) / reps)
    if not np.allclose(c, a @ b, rtol=1e-3, atol=1e-3):
        print("nan")
        return
    print("%.3f" % (2.0 * m * k * n / best / 1e9))


def openblas_gflops(lib, kernels, m, k, n, threads):
    """cblas_sgemm's GFLOP/s in a child process with OPENBLAS_CORETYPE set to
    the kernels tpserve's log names, or None."""
    if not lib or not k:
        return None
    env = dict(os.environ)
    if kernels:
        env["OPENBLAS_CORETYPE"] = kernels
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--sgemm",
                        "%s,%d,%d,%d,%d" % (lib, m, k, n, threads)], capture_output=True, text=True, env=env)
    try:
        v = float(r.stdout.strip().splitlines()[-1])
        return v if v == v else None
    except (ValueError, IndexError):
        return None


def server_error(log_path):
    """The reason in tpserve's log: its last error line, else its last line."""
    with open(log_path) as f:
        lines = [ln.strip() for ln in f if ln.strip()]
    errs = [ln for ln in lines if " error " in ln or "fatal" in ln.lower()]
    return (errs or lines or ["no log"])[-1]


def bench_one(a, name, src, model, ws, tmp, sessions, refs, lib):
    """One table row (a dict) for NAME at world size WS."""
    g = os.path.join(tmp, "%s_tp%d.json" % (name, ws))
    row = {"model": name, "ws": ws}
    row["import_s"], row["rss"], err = run_import(src, ws, g)
    if err:
        row["error"] = err
        return row
    if a.import_only:
        return row
    log_path = os.path.join(tmp, "%s_tp%d.log" % (name, ws))
    with open(log_path, "w") as log:
        try:
            proc, port = bi.start_server(a.tpserve, g, log)
        except SystemExit as e:
            row["error"] = "tpserve: %s (%s)" % (server_error(log_path), e)
            return row
        try:
            with open(log_path) as text:
                found = re.search(r"OpenBLAS kernels (\S+)[^;\n]*; GEMMs on (\d+) threads? per rank", text.read())
            kernels, per_rank = (found.group(1), int(found.group(2))) if found else ("", 1)
            threads = per_rank * ws
            row["threads"], row["kernels"] = threads, kernels
            if threads not in sessions:
                sessions.clear()  # one model's session at a time: they hold its weights
                so = reference.ort.SessionOptions()
                so.intra_op_num_threads = threads
                so.inter_op_num_threads = 1
                sessions[threads] = reference.ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
            sess = sessions[threads]
            names = [o.name for o in sess.get_outputs()]
            for b in BATCHES:
                feeds = reference.make_feeds(model, b, {}, seed=b)
                if b not in refs:
                    refs[b] = dict(zip(names, sess.run(names, feeds)))
                ort_ms = []

                def ort_once():
                    # Each side's threads idle before the other runs:
                    # onnxruntime's spin after a run for more work, and a
                    # tpserve request right after it ran 260 ms instead of
                    # 227 (Llama, world size 2).
                    time.sleep(QUIET_S)
                    t0 = time.perf_counter()
                    sess.run(names, feeds)
                    ort_ms.append(1e3 * (time.perf_counter() - t0))
                    time.sleep(QUIET_S)

                for _ in range(3):
                    sess.run(names, feeds)  # onnxruntime's warm-ups
                try:
                    http_ms, engine_ms = bi.time_tpserve(port, "%s_tp%d" % (name, ws), feeds, refs[b], a.iters,
                                                         rtol=RTOL_FP16 if name.endswith("_fp16") else RTOL,
                                                         between=ort_once)
                except SystemExit as e:
                    row["error"] = str(e.code).replace("bench_import: ", "")
                    if proc.poll() is not None:
                        row["error"] += " (tpserve exited: %s)" % server_error(log_path)
                    return row
                row["http%d" % b], row["engine%d" % b] = http_ms, engine_ms
                row["ort%d" % b] = float(np.median(ort_ms))
        finally:
            if proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=60)
    return row


def fmt(v, spec="%.1f"):
    return "-" if v is None else spec % v


def pair(row, key, spec="%.1f"):
    return " / ".join(fmt(row.get("%s%d" % (key, b)), spec) for b in BATCHES)


def ratio(row, key):
    return " / ".join(fmt(row["%s%d" % (key, b)] / row["ort%d" % b] if "%s%d" % (key, b) in row and
                          row.get("ort%d" % b) else None, "%.2f") for b in BATCHES)


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--sgemm":
        lib, *mknt = sys.argv[2].rsplit(",", 4)
        sgemm_child(lib, *map(int, mknt))
        return 0
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpserve", required=True)
    ap.add_argument("--cache", default=os.path.join(ROOT, "build", "real"), help="the exported models (export_real.py)")
    ap.add_argument("--models", default="gpt2,bert,llama")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--import-only", action="store_true", help="import rows only (time and memory)")
    ap.add_argument("--keep", help="write the imported graphs and server logs here (default: a temporary directory)")
    a = ap.parse_args()
    models = a.models.split(",")
    for m in models:  # exported in a child: torch is only needed there, and its memory is given back
        path = os.path.join(a.cache, m + ".onnx")
        if not os.path.exists(path):
            r = subprocess.run([sys.executable, os.path.join(HERE, "export_real.py"), "--cache", a.cache, m])
            if r.returncode != 0:
                sys.exit("bench_real: exporting %s failed (export_real.py, above)" % m)
    tmp = a.keep or tempfile.mkdtemp(prefix="bench_real.")
    os.makedirs(tmp, exist_ok=True)
    lib = openblas_path(a.tpserve)
    rows = []
    try:
        for m in models:
            src = os.path.join(a.cache, m + ".onnx")
            model = onnx.load(src, load_external_data=False)
            wbytes, wflops, big = weights_info(model)
            sessions, refs = {}, {}
            for ws in (1, 2):
                row = bench_one(a, m, src, model, ws, tmp, sessions, refs, lib)
                row["weights"], row["flops_tok"], row["big"] = wbytes, wflops, big
                for b in BATCHES:
                    if row.get("engine%d" % b):
                        row["gf%d" % b] = wflops * b * SEQ / (row["engine%d" % b] * 1e-3) / 1e9
                        row["blas%d" % b] = openblas_gflops(lib, row.get("kernels"), b * SEQ, big[0], big[1],
                                                            row["threads"])
                rows.append(row)
                print("bench_real: %s ws %d: %s" % (m, ws, row.get("error", "ok")), file=sys.stderr, flush=True)
                weights = os.path.join(tmp, "%s_tp%d.safetensors" % (m, ws))
                if not a.keep and os.path.exists(weights):
                    os.remove(weights)  # the next import's disk
            del sessions, model
    finally:
        if not a.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    kernels = next((r["kernels"] for r in rows if r.get("kernels")), "")
    threads = sorted({r["threads"] for r in rows if "threads" in r})
    print("\nsequence %d, FP32 (FP16 in *_fp16 rows), random weights%s. import: graphs/import_onnx.py's wall time, its peak RSS over the"
          " ONNX initializers' bytes." % (SEQ, "" if a.import_only else "; batch 1 / batch 4"))
    if not a.import_only:
        print("engine: compute_infer statistics (median of %d requests); HTTP: binary KServe, keep-alive, median of %d;"
              " ort: onnxruntime CPU provider in-process, median of %d, alternating with tpserve's requests, intra-op"
              " threads %s (tpserve's GEMM threads x ranks). OpenBLAS kernels %s." % (a.iters, a.iters, a.iters, "/".join(map(str, threads)) or "-",
                                                    kernels or "unknown"))
        print("GEMM GFLOP/s: weight-matmul FLOPs per request / engine time, vs cblas_sgemm alone on the largest"
              " weight matmul (K x N in the column) at batch x %d rows, same threads.\n" % SEQ)
        print("| model | ws | import s | peak RSS / weights | engine ms | HTTP ms | ort ms | engine / ort |"
              " HTTP / ort | GEMM GFLOP/s tpserve | OpenBLAS GFLOP/s (K x N) |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
    else:
        print("\n| model | ws | import s | peak RSS | weights | peak RSS / weights |")
        print("|---|---|---|---|---|---|")
    failed = []
    for r in rows:
        imp = "%.1f | %.2f (%.0f MiB / %.0f MiB)" % (r["import_s"], r["rss"] / r["weights"], r["rss"] / 2**20,
                                                   r["weights"] / 2**20)
        if a.import_only:
            print("| %s | %d | %.1f | %.0f MiB | %.0f MiB | %.2f |%s" % (
                r["model"], r["ws"], r["import_s"], r["rss"] / 2**20, r["weights"] / 2**20, r["rss"] / r["weights"],
                " **failed: %s**" % r["error"] if "error" in r else ""))
        elif "error" in r:
            print("| %s | %d | %s | **failed: %s** |%s" % (r["model"], r["ws"], imp, r["error"].replace("|", "/"),
                                                          " |" * 6))
        else:
            print("| %s | %d | %s | %s | %s | %s | %s | %s | %s | %s (%dx%d) |" % (
                r["model"], r["ws"], imp, pair(r, "engine"), pair(r, "http"), pair(r, "ort"), ratio(r, "engine"),
                ratio(r, "http"), pair(r, "gf"), pair(r, "blas"), r["big"][0], r["big"][1]))
        if "error" in r:
            failed.append("%s ws %d: %s" % (r["model"], r["ws"], r["error"]))
    if failed:
        print("\nbench_real: failed:\n" + "\n".join("  " + f for f in failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
