#!/usr/bin/env python3
"""kserve_client.py — a tiny KServe v2 client for the integration tests
(python3 stdlib + numpy only).

Builds infer requests from a graph's NAME.inputs.safetensors (JSON, nested
JSON, or the binary tensor data extension), and checks responses against
NAME.ref.safetensors with the manifest's rtol and the metric of
graphs/README.md (compare.py's functions).

  kserve_client.py make  --graphs D --graph G --out BODY [--binary] [--nested]
                         [--binary-out] [--outputs a,b] [--id ID] [--repeat K]
      write a request body; print the Inference-Header-Content-Length
      (-1 for a pure JSON body)
  kserve_client.py check --graphs D --graph G --body RESP [--header-len N]
                         [--outputs a,b] [--id ID] [--repeat K]
      check a saved response body; exit 1 on any mismatch
  kserve_client.py infer --url U --graphs D --graph G [make options]
      send one request with http.client and check the answer
  kserve_client.py early413 --url U --path P --content-length N
      send only headers announcing N body bytes; expect a 413 without the
      server waiting for the body
  kserve_client.py chunked --url U --path P --bytes N
      stream N bytes chunked; expect 413 once the limit is passed
  kserve_client.py drain --url U --pid PID --graphs D --graph G
      SIGTERM the server while a request is in flight (half uploaded):
      readiness on an open keep-alive connection turns 503, new connections
      are refused, and the in-flight request still gets its correct answer

--repeat K tiles the inputs (and the reference) K times along the batch dim,
to make heavier requests for load tests.
"""
import argparse
import http.client
import json
import os
import signal
import socket
import sys
import threading
import time
import urllib.parse

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (graphs' reference metric and safetensors reader)

ST_TO_KSERVE = {"F32": "FP32", "F16": "FP16", "BF16": "BF16", "I32": "INT32", "I64": "INT64"}
KSERVE_NP = {"FP32": np.dtype("<f4"), "FP16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
             "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8")}


def manifest_entry(graphs, graph):
    with open(os.path.join(graphs, "manifest.json")) as f:
        for g in json.load(f)["graphs"]:
            if g["name"] == graph:
                return g
    raise SystemExit("kserve_client: graph %s not in %s/manifest.json" % (graph, graphs))


def load_tensors(graphs, fname, repeat):
    """-> {name: (kserve dtype, ndarray)}, batch-tiled repeat times."""
    out = {}
    for name, (st, a) in compare.load(os.path.join(graphs, fname)).items():
        if repeat > 1:
            a = np.concatenate([a] * repeat, axis=0)
        out[name] = (ST_TO_KSERVE[st], a)
    return out


def json_values(dt, a):
    """Flat list of JSON numbers; FP16/BF16 widened exactly to float."""
    if dt in ("INT32", "INT64"):
        return [int(v) for v in a.reshape(-1)]
    return [float(v) for v in compare.to_f64("BF16" if dt == "BF16" else "F32", a).reshape(-1)]


def nest(flat, shape):
    if len(shape) <= 1:
        return flat
    step = len(flat) // shape[0]
    return [nest(flat[i * step:(i + 1) * step], shape[1:]) for i in range(shape[0])]


def build_request(inputs, binary=False, nested=False, binary_out=False, outputs=None, rid=None):
    """-> (body bytes, header_len or -1)."""
    doc = {}
    if rid is not None:
        doc["id"] = rid
    tail = []
    doc["inputs"] = []
    for name, (dt, a) in inputs.items():
        e = {"name": name, "shape": list(a.shape), "datatype": dt}
        if binary:
            raw = np.ascontiguousarray(a).tobytes()
            e["parameters"] = {"binary_data_size": len(raw)}
            tail.append(raw)
        else:
            vals = json_values(dt, a)
            e["data"] = nest(vals, list(a.shape)) if nested else vals
        doc["inputs"].append(e)
    if outputs:
        doc["outputs"] = [{"name": o, "parameters": {"binary_data": binary_out}} for o in outputs]
    elif binary_out:
        doc["parameters"] = {"binary_data_output": True}
    head = json.dumps(doc).encode()
    if not binary:
        return head, -1
    return head + b"".join(tail), len(head)


def parse_response(body, header_len):
    """-> (doc, {name: (dtype, shape, float64 ndarray)})."""
    hl = len(body) if header_len is None or header_len < 0 else header_len
    doc = json.loads(body[:hl].decode())
    off, outs = hl, {}
    for o in doc["outputs"]:
        dt, shape = o["datatype"], tuple(o["shape"])
        size = (o.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = np.frombuffer(body[off:off + size], dtype=KSERVE_NP[dt])
            off += size
            st = "BF16" if dt == "BF16" else "F32"
            vals = compare.to_f64(st, raw) if dt != "INT32" and dt != "INT64" else raw.astype(np.float64)
        else:
            vals = np.asarray(o["data"], dtype=np.float64).reshape(-1)
        outs[o["name"]] = (dt, shape, vals.reshape(shape))
    if off != len(body):
        raise ValueError("response has %d bytes after its binary outputs" % (len(body) - off))
    return doc, outs


def check_outputs(doc, outs, ref, rtol, want_names, rid, say=print):
    """Says one line per output (print by default); returns the number of failures."""
    fails = 0
    if rid is not None and doc.get("id") != rid:
        say("FAIL id: sent %r, got %r" % (rid, doc.get("id")))
        fails += 1
    if sorted(outs) != sorted(want_names):
        say("FAIL outputs: got %s, expected %s" % (sorted(outs), sorted(want_names)))
        return fails + 1
    for name in want_names:
        rdt, r = ref[name]
        dt, shape, o = outs[name]
        if dt != rdt or shape != r.shape:
            say("FAIL %s: got %s %s, expected %s %s" % (name, dt, list(shape), rdt, list(r.shape)))
            fails += 1
            continue
        err = compare.rel_err(o, compare.to_f64("BF16" if rdt == "BF16" else "F32", r))
        ok = err <= rtol
        fails += 0 if ok else 1
        say("%s %s %s %s err=%.3e rtol=%.1e" % ("ok  " if ok else "FAIL", name, dt, list(shape),
                                                  err, rtol))
    return fails


def split_url(url):
    u = urllib.parse.urlsplit(url)
    return u.hostname, u.port or 80


def post(url, path, body, header_len):
    host, port = split_url(url)
    c = http.client.HTTPConnection(host, port, timeout=60)
    headers = {"Content-Type": "application/octet-stream" if header_len >= 0 else "application/json"}
    if header_len >= 0:
        headers["Inference-Header-Content-Length"] = str(header_len)
    c.request("POST", path, body, headers)
    r = c.getresponse()
    data = r.read()
    hl = r.getheader("Inference-Header-Content-Length")
    c.close()
    return r.status, data, int(hl) if hl is not None else -1


def cmd_make(a):
    inputs = load_tensors(a.graphs, manifest_entry(a.graphs, a.graph)["inputs"], a.repeat)
    body, hl = build_request(inputs, a.binary, a.nested, a.binary_out, a.outputs, a.id)
    with open(a.out, "wb") as f:
        f.write(body)
    print(hl)
    return 0


def check_body(a, body, header_len):
    m = manifest_entry(a.graphs, a.graph)
    ref = load_tensors(a.graphs, m["ref"], a.repeat)
    try:
        doc, outs = parse_response(body, header_len)
    except (ValueError, KeyError, TypeError) as e:
        print("FAIL response does not parse: %s: %r" % (e, body[:300]))
        return 1
    if doc.get("model_name") != a.graph:
        print("FAIL model_name %r, expected %r" % (doc.get("model_name"), a.graph))
        return 1
    return 1 if check_outputs(doc, outs, ref, m["rtol"], a.outputs or list(ref), a.id) else 0


def cmd_check(a):
    with open(a.body, "rb") as f:
        return check_body(a, f.read(), a.header_len)


def cmd_infer(a):
    inputs = load_tensors(a.graphs, manifest_entry(a.graphs, a.graph)["inputs"], a.repeat)
    body, hl = build_request(inputs, a.binary, a.nested, a.binary_out, a.outputs, a.id)
    status, data, rhl = post(a.url, "/v2/models/%s/infer" % a.graph, body, hl)
    if status != 200:
        print("FAIL HTTP %d: %r" % (status, data[:300]))
        return 1
    return check_body(a, data, rhl)


def read_status(s):
    s.settimeout(10)
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            break
        buf += chunk
    line = buf.split(b"\r\n", 1)[0].decode(errors="replace")
    return line, buf


def cmd_early413(a):
    host, port = split_url(a.url)
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(("POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
               "Content-Length: %d\r\n\r\n" % (a.path, host, a.content_length)).encode())
    line, buf = read_status(s)  # no body was sent: the answer must not wait for it
    s.close()
    print(line)
    return 0 if " 413 " in line + " " and b"max_body_bytes" in buf else 1


def cmd_chunked(a):
    host, port = split_url(a.url)
    s = socket.create_connection((host, port), timeout=10)
    s.sendall(("POST %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n"
               % (a.path, host)).encode())
    chunk = b"x" * 1024
    sent = 0
    try:
        while sent < a.bytes:
            s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            sent += len(chunk)
        s.sendall(b"0\r\n\r\n")
    except OSError:
        pass  # the server may close once it has answered 413
    line, buf = read_status(s)
    s.close()
    print(line)
    return 0 if " 413 " in line + " " else 1


def read_http_response(s):
    """Reads one response from a socket the server closes after it ->
    (status, headers dict with lower-case keys, body)."""
    buf = b""
    while True:
        chunk = s.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    lines = head.decode(errors="replace").split("\r\n")
    status = int(lines[0].split()[1]) if lines[0].startswith("HTTP/") else 0
    headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:])}
    n = int(headers.get("content-length", len(body)))
    return status, headers, body[:n]


def cmd_drain(a):
    host, port = split_url(a.url)
    fails = 0

    def result(ok, what):
        nonlocal fails
        fails += 0 if ok else 1
        print("%s: drain: %s" % ("PASS" if ok else "FAIL", what))

    keep = http.client.HTTPConnection(host, port, timeout=30)
    keep.request("GET", "/v2/health/live")
    r = keep.getresponse()
    r.read()
    result(r.status == 200, "keep-alive connection open before SIGTERM (live %d)" % r.status)
    # An infer request whose upload is still going on at SIGTERM: in flight,
    # and held open by this client for as long as the checks below take.
    inputs = load_tensors(a.graphs, manifest_entry(a.graphs, a.graph)["inputs"], a.repeat)
    body, hl = build_request(inputs, binary=True, binary_out=True)
    slow = socket.create_connection((host, port), timeout=30)
    slow.sendall(("POST /v2/models/%s/infer HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n"
                  "Inference-Header-Content-Length: %d\r\n\r\n" % (a.graph, host, len(body), hl)).encode())
    half = len(body) // 2
    slow.sendall(body[:half])
    time.sleep(0.2)
    os.kill(a.pid, signal.SIGTERM)
    time.sleep(0.3)
    keep.request("GET", "/v2/health/ready")
    r = keep.getresponse()
    r.read()
    result(r.status == 503 and (r.getheader("Connection") or "").lower() == "close",
           "readiness on the open connection is %d with Connection: %s"
           % (r.status, r.getheader("Connection")))
    keep.close()
    try:
        socket.create_connection((host, port), timeout=5).close()
        result(False, "a new connection was accepted while draining")
    except ConnectionRefusedError:
        result(True, "new connections are refused while draining")
    except OSError as e:
        result(False, "new connection failed with %s, not a refusal" % e)
    slow.sendall(body[half:])
    status, headers, data = read_http_response(slow)
    slow.close()
    ok = status == 200
    if ok:
        a.outputs, a.id = None, None
        ok = check_body(a, data, int(headers.get("inference-header-content-length", -1))) == 0
    result(ok, "the request in flight at SIGTERM was answered %d with correct outputs" % status)
    return 1 if fails else 0


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)

    def graph_args(sp):
        sp.add_argument("--graphs", required=True)
        sp.add_argument("--graph", required=True)
        sp.add_argument("--outputs", type=lambda s: s.split(","), default=None)
        sp.add_argument("--id", default=None)
        sp.add_argument("--repeat", type=int, default=1)

    def make_args(sp):
        sp.add_argument("--binary", action="store_true")
        sp.add_argument("--nested", action="store_true")
        sp.add_argument("--binary-out", action="store_true")

    sp = sub.add_parser("make")
    graph_args(sp)
    make_args(sp)
    sp.add_argument("--out", required=True)
    sp = sub.add_parser("check")
    graph_args(sp)
    sp.add_argument("--body", required=True)
    sp.add_argument("--header-len", type=int, default=-1)
    sp = sub.add_parser("infer")
    graph_args(sp)
    make_args(sp)
    sp.add_argument("--url", required=True)
    sp = sub.add_parser("early413")
    sp.add_argument("--url", required=True)
    sp.add_argument("--path", required=True)
    sp.add_argument("--content-length", type=int, required=True)
    sp = sub.add_parser("chunked")
    sp.add_argument("--url", required=True)
    sp.add_argument("--path", required=True)
    sp.add_argument("--bytes", type=int, required=True)
    sp = sub.add_parser("drain")
    graph_args(sp)
    sp.add_argument("--url", required=True)
    sp.add_argument("--pid", type=int, required=True)
    a = p.parse_args(argv[1:])
    return {"make": cmd_make, "check": cmd_check, "infer": cmd_infer, "early413": cmd_early413,
            "chunked": cmd_chunked, "drain": cmd_drain}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
