#!/usr/bin/env python3
"""bench_import.py --tpserve BIN [--models mlp,gpt2,bert,llama] [--iters N (100)]

tpserve serving the imported ONNX fixtures (world size 1 and 2, ranks as
threads, binary KServe requests on one keep-alive connection) against
onnxruntime's CPU provider on the same machine with the same number of
threads (intra_op threads = world size), per request at batch 1 and 8.
Prints a markdown table of median milliseconds; every tpserve answer is
checked against onnxruntime's first (a table of wrong answers is no
benchmark). Never fails on timings. Needs numpy, onnx, onnxruntime."""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import numpy as np
import onnx

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
sys.path.insert(0, os.path.join(ROOT, "tests", "onnx"))
import kserve_client  # noqa: E402
import reference  # noqa: E402

NP_KS = {np.dtype(np.float32): "FP32", np.dtype(np.int64): "INT64", np.dtype(np.int32): "INT32"}
RTOL = 1e-4


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def start_server(tpserve, graph, log, extra=()):
    """EXTRA: more serve flags (a later flag overrides an earlier one)."""
    port = free_port()
    p = subprocess.Popen([tpserve, "serve", "--graph", graph, "--port", str(port), "--backend", "cpu",
                          "--threads", "1", "--log-level", "info", *extra], stdout=log, stderr=log)
    for _ in range(300):
        if p.poll() is not None:
            raise SystemExit("bench_import: tpserve exited at startup (see %s)" % log.name)
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            c.request("GET", "/v2/health/ready")
            if c.getresponse().status == 200:
                c.close()
                return p, port
        except OSError:
            pass
        time.sleep(0.1)
    p.kill()
    raise SystemExit("bench_import: tpserve not ready after 30 s")


def compute_infer(port, model_name):
    """(ns, count) of the model's compute_infer statistics so far: the
    engine's own time, without HTTP or the codec."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/v2/models/%s/stats" % model_name)
    d = json.loads(c.getresponse().read())["model_stats"][0]["inference_stats"]["compute_infer"]
    c.close()
    return d["ns"], d["count"]


def time_tpserve(port, model_name, feeds, ref, iters, rtol=RTOL, between=None):
    """(median HTTP ms, median engine ms) of ITERS requests after 3
    warm-ups, the first checked against REF; a request's engine ms is what
    compute_infer gained over it. Medians, as the anchors are timed: a
    mean let one request slowed by the machine move a cell by 10%. BETWEEN,
    when given, runs after each timed request (an anchor timed alternately
    with tpserve, so both see the same moments of a noisy machine)."""
    body, hl = kserve_client.build_request({k: (NP_KS[v.dtype], v) for k, v in feeds.items()},
                                           binary=True, binary_out=True)
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(hl)}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    path = "/v2/models/%s/infer" % model_name
    times, engine = [], []
    for i in range(iters + 3):
        if i >= 3:
            ns0, n0 = compute_infer(port, model_name)
        t0 = time.perf_counter()
        c.request("POST", path, body, headers)
        r = c.getresponse()
        data = r.read()
        dt = time.perf_counter() - t0
        if r.status != 200:
            raise SystemExit("bench_import: %s: HTTP %d: %s" % (model_name, r.status, data[:200]))
        if i == 0:
            _, outs = kserve_client.parse_response(data, int(r.getheader("Inference-Header-Content-Length")))
            for name, want in ref.items():
                err = kserve_client.compare.rel_err(outs[name][2], want.astype(np.float64))
                if not err <= rtol:
                    raise SystemExit("bench_import: %s output %s: err %.3e > %g" % (model_name, name, err, rtol))
        if i >= 3:
            times.append(dt)
            ns1, n1 = compute_infer(port, model_name)
            engine.append((ns1 - ns0) / 1e6 / max(n1 - n0, 1))
            if between:
                between()
    c.close()
    return 1e3 * float(np.median(times)), float(np.median(engine))


def time_ort(path, feeds, threads, iters):
    _, sess = reference.run_reference(path, feeds, threads)
    return time_session(sess, feeds, iters)


def time_session(sess, feeds, iters):
    """Median ms of an onnxruntime session's run, after 3 warm-ups."""
    names = [o.name for o in sess.get_outputs()]
    times = []
    for i in range(iters + 3):
        t0 = time.perf_counter()
        sess.run(names, feeds)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(times))


def blas_kernels(prog):
    """The OpenBLAS kernel set tpserve runs, and whether the environment
    forced it (tests/cpus/blas_kernels.sh says it for bench-http too)."""
    if not prog:
        return "OpenBLAS kernels: not asked (--blas-core)."
    script = os.path.join(ROOT, "tests", "cpus", "blas_kernels.sh")
    return subprocess.run(["sh", script, prog], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpserve", required=True)
    ap.add_argument("--models", default="mlp,gpt2,bert,llama")
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--blas-core", help="a program printing the OpenBLAS kernel set in use (make's blas_core)")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench_import.")
    rows = []
    kernels = ""  # what tpserve's startup log says it runs (it may force newer ones: blas_pick.h)
    try:
        for m in a.models.split(","):
            src = os.path.join(ROOT, "tests", "onnx", m + ".onnx")
            model = onnx.load(src)
            for ws in (1, 2):
                g = os.path.join(tmp, "%s_tp%d.json" % (m, ws))
                subprocess.run([sys.executable, os.path.join(ROOT, "graphs", "import_onnx.py"), src,
                                "--world-size", str(ws), "--out", g], check=True)
                with open(os.path.join(tmp, "%s_tp%d.log" % (m, ws)), "w") as log:
                    proc, port = start_server(a.tpserve, g, log)
                    with open(log.name) as text:
                        found = re.search(r"OpenBLAS kernels [^;\n]*", text.read())
                    kernels = kernels or (found.group(0) if found else "")
                    try:
                        for b in (1, 8):
                            feeds = reference.make_feeds(model, b, {}, seed=b)
                            ref, _ = reference.run_reference(src, feeds)
                            tp, engine = time_tpserve(port, "%s_tp%d" % (m, ws), feeds, ref, a.iters)
                            ort_ms = time_ort(src, feeds, ws, a.iters)
                            rows.append((m, b, ws, ort_ms, tp, engine))
                    finally:
                        proc.terminate()
                        proc.wait(timeout=30)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("\nper request, median of %d (ms); onnxruntime in-process, tpserve over HTTP (binary, keep-alive)"
          % a.iters)
    print("and its engine alone (statistics' compute_infer, median over requests: no HTTP, codec or Python client)")
    print(blas_kernels(a.blas_core))
    print("tpserve's startup log: %s.\n" % (kernels or "no OpenBLAS kernels line"))
    print("| model | batch | threads = world size | onnxruntime | tpserve | tpserve / ort | tpserve engine"
          " | engine / ort |")
    print("|---|---|---|---|---|---|---|---|")
    for m, b, ws, o, t, e in sorted(rows):
        print("| %s | %d | %d | %.3f | %.3f | %.2f | %.3f | %.2f |" % (m, b, ws, o, t, t / o, e, e / o))


if __name__ == "__main__":
    main()
