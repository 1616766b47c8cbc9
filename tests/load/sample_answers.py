#!/usr/bin/env python3
"""sample_answers.py save URL GRAPH DIR
   sample_answers.py check MANIFEST GRAPH DIR URL

The sample request of `make bench-http` and the answers to it.

save: writes one 1-row request for the example graph (input x [1, 8, 32],
FP32, fixed random values) as DIR/req.json (JSON tensors) and DIR/req.bin
(binary tensor data both ways; DIR/req.bin.hl holds the length of its JSON
header), sends both to POST URL/v2/models/GRAPH/infer and saves the answers
as DIR/ans.json and DIR/ans.bin (+ DIR/ans.bin.hl). bare_http replays these
bytes; they are tpserve's answers.

check: sends the saved requests to another server at URL and compares each
answer with the saved one: same output names, datatypes and shapes, and

    max|got - saved| / max(max|saved|, 1e-6)  <=  rtol

(tests/integration/compare.py's metric, graphs/README.md), rtol being the
graph's tolerance in MANIFEST (1e-4 for FP32). The bench checks Triton this
way before timing it: a comparison against a different function is
worthless.

Prints what it did; exit status 0, or 1 with the reason on stderr.
"""
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "integration"))
import compare  # noqa: E402  (the project's tolerance metric)

NP_DTYPE = {"FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT32": "<i4", "INT64": "<i8"}
HEADER_LEN = "Inference-Header-Content-Length"


class BadAnswer(Exception):
    pass


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def write(path, data):
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


def post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        raise BadAnswer("%s answered %d: %s" % (url, e.code, e.read()[:300]))
    except urllib.error.URLError as e:
        raise BadAnswer("%s: %s" % (url, e.reason))


def write_requests(d):
    x = np.random.default_rng(1).uniform(-1, 1, (1, 8, 32)).astype(np.float32)
    doc = {"inputs": [{"name": "x", "shape": [1, 8, 32], "datatype": "FP32",
                       "data": [float(v) for v in x.reshape(-1)]}]}
    write(os.path.join(d, "req.json"), json.dumps(doc))
    raw = x.tobytes()
    hdr = json.dumps({"inputs": [{"name": "x", "shape": [1, 8, 32], "datatype": "FP32",
                                  "parameters": {"binary_data_size": len(raw)}}],
                      "parameters": {"binary_data_output": True}}).encode()
    write(os.path.join(d, "req.bin"), hdr + raw)
    write(os.path.join(d, "req.bin.hl"), str(len(hdr)))


def ask(url, graph, d):
    """The server's (JSON answer, binary answer, binary header length) to
    the saved requests, as bytes."""
    url = "%s/v2/models/%s/infer" % (url, graph)
    as_json, _ = post(url, read(os.path.join(d, "req.json")), {"Content-Type": "application/json"})
    as_bin, headers = post(url, read(os.path.join(d, "req.bin")),
                           {"Content-Type": "application/octet-stream",
                            HEADER_LEN: read(os.path.join(d, "req.bin.hl"), "r").strip()})
    if headers.get(HEADER_LEN) is None:
        raise BadAnswer("the binary answer has no %s header: %r" % (HEADER_LEN, as_bin[:200]))
    return as_json, as_bin, int(headers[HEADER_LEN])


def json_outputs(body):
    """{name: (datatype, array)} from a JSON-tensor answer."""
    doc = json.loads(body)
    return {o["name"]: (o["datatype"], np.array(o["data"], dtype=NP_DTYPE[o["datatype"]])
                        .reshape(o["shape"])) for o in doc["outputs"]}


def binary_outputs(body, header_len):
    """{name: (datatype, array)} from a binary-tensor answer whose JSON
    header is header_len bytes long."""
    doc = json.loads(body[:header_len])
    out, pos = {}, header_len
    for o in doc["outputs"]:
        n = o["parameters"]["binary_data_size"]
        a = np.frombuffer(body[pos:pos + n], dtype=NP_DTYPE[o["datatype"]])
        out[o["name"]] = (o["datatype"], a.reshape(o["shape"]))
        pos += n
    return out


def compare_answer(got, want, rtol):
    """(None, "name err E, ...") when got matches want within rtol, else
    (what differs, "")."""
    if set(got) != set(want):
        return "outputs %s, saved %s" % (sorted(got), sorted(want)), ""
    errs = []
    for name, (wdt, w) in sorted(want.items()):
        gdt, g = got[name]
        if gdt != wdt or g.shape != w.shape:
            return "%s is %s %s, saved %s %s" % (name, gdt, list(g.shape), wdt, list(w.shape)), ""
        err = compare.rel_err(g.astype(np.float64), w.astype(np.float64))
        if err > rtol:
            return "%s differs: err %.3e > rtol %.1e" % (name, err, rtol), ""
        errs.append("%s err %.1e" % (name, err))
    return None, ", ".join(errs)


def save(url, graph, d):
    write_requests(d)
    as_json, as_bin, hl = ask(url, graph, d)
    write(os.path.join(d, "ans.json"), as_json)
    write(os.path.join(d, "ans.bin"), as_bin)
    write(os.path.join(d, "ans.bin.hl"), str(hl))
    return 0


def check(manifest, graph, d, url):
    rtol = next((g["rtol"] for g in json.loads(read(manifest))["graphs"] if g["name"] == graph), None)
    if rtol is None:
        raise BadAnswer("%s is not in %s" % (graph, manifest))
    want = (json_outputs(read(os.path.join(d, "ans.json"))),
            binary_outputs(read(os.path.join(d, "ans.bin")), int(read(os.path.join(d, "ans.bin.hl"), "r"))))
    as_json, as_bin, hl = ask(url, graph, d)
    got = (json_outputs(as_json), binary_outputs(as_bin, hl))
    failed = 0
    for kind, g, w in (("JSON", got[0], want[0]), ("binary", got[1], want[1])):
        why, errs = compare_answer(g, w, rtol)
        if why:
            print("sample_answers: %s's %s answer is not the saved one: %s" % (url, kind, why),
                  file=sys.stderr)
            failed += 1
        else:
            print("%s answer: the saved one (%s <= rtol %.0e)" % (kind, errs, rtol))
    return 1 if failed else 0


def main(argv):
    try:
        if len(argv) == 5 and argv[1] == "save":
            return save(*argv[2:])
        if len(argv) == 6 and argv[1] == "check":
            return check(*argv[2:])
    except (OSError, ValueError, KeyError, BadAnswer) as e:
        print("sample_answers: %s" % e, file=sys.stderr)
        return 1
    print("usage: " + __doc__.split("\n\n")[0], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
