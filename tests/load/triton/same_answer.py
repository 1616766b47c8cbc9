#!/usr/bin/env python3
"""same_answer.py MANIFEST GRAPH DIR TRITON_URL

Before `make bench-http` times Triton it checks that Triton computes what
tpserve computes: it sends DIR/req.json (JSON tensors) and DIR/req.bin
(binary tensor data both ways; DIR/req.bin.hl holds the length of its JSON
header) to POST TRITON_URL/v2/models/GRAPH/infer and compares every output
with tpserve's answers to the same requests, DIR/ans.json and DIR/ans.bin
(+ ans.bin.hl): same names, datatypes and shapes, and

    max|triton - tpserve| / max(max|tpserve|, 1e-6)  <=  rtol

(tests/integration/compare.py's metric, graphs/README.md), rtol being the
graph's tolerance in MANIFEST (1e-4 for FP32: the NumPy model's erf
approximation and summation order are far inside it).

Prints one line per answer; exit status 0 when both match, 1 otherwise.
"""
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import compare  # noqa: E402  (the project's tolerance metric)

NP_DTYPE = {"FP32": "<f4", "FP16": "<f2", "FP64": "<f8", "INT32": "<i4", "INT64": "<i8"}
HEADER_LEN = "Inference-Header-Content-Length"


class BadAnswer(Exception):
    pass


def post(url, body, headers):
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read(), r.headers
    except urllib.error.HTTPError as e:
        raise BadAnswer("%s answered %d: %s" % (url, e.code, e.read()[:300]))
    except urllib.error.URLError as e:
        raise BadAnswer("%s: %s" % (url, e.reason))


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


def read(path, mode="rb"):
    with open(path, mode) as f:
        return f.read()


def triton_answers(base, graph, d):
    """(JSON answer, binary answer) of the server at base."""
    url = "%s/v2/models/%s/infer" % (base, graph)
    body, _ = post(url, read(os.path.join(d, "req.json")), {"Content-Type": "application/json"})
    as_json = json_outputs(body)
    body, headers = post(url, read(os.path.join(d, "req.bin")),
                         {"Content-Type": "application/octet-stream",
                          HEADER_LEN: read(os.path.join(d, "req.bin.hl"), "r").strip()})
    if headers.get(HEADER_LEN) is None:
        raise BadAnswer("the binary answer has no %s header: %r" % (HEADER_LEN, body[:200]))
    return as_json, binary_outputs(body, int(headers[HEADER_LEN]))


def tpserve_answers(d):
    """tpserve's answers, saved by the bench."""
    return (json_outputs(read(os.path.join(d, "ans.json"))),
            binary_outputs(read(os.path.join(d, "ans.bin")), int(read(os.path.join(d, "ans.bin.hl"), "r"))))


def compare_answer(got, want, rtol):
    """(None, "name err E, ...") when got matches want within rtol, else
    (what differs, "")."""
    if set(got) != set(want):
        return "outputs %s, tpserve's %s" % (sorted(got), sorted(want)), ""
    errs = []
    for name, (wdt, w) in sorted(want.items()):
        gdt, g = got[name]
        if gdt != wdt or g.shape != w.shape:
            return "%s is %s %s, tpserve's %s %s" % (name, gdt, list(g.shape), wdt, list(w.shape)), ""
        err = compare.rel_err(g.astype(np.float64), w.astype(np.float64))
        if err > rtol:
            return "%s differs: err %.3e > rtol %.1e" % (name, err, rtol), ""
        errs.append("%s err %.1e" % (name, err))
    return None, ", ".join(errs)


def main(argv):
    if len(argv) != 5:
        print("usage: " + __doc__.split("\n")[0], file=sys.stderr)
        return 1
    manifest, graph, d, triton = argv[1:]
    try:
        rtol = next(g["rtol"] for g in json.loads(read(manifest))["graphs"] if g["name"] == graph)
        want = tpserve_answers(d)
        got = triton_answers(triton, graph, d)
    except StopIteration:
        print("same_answer: %s is not in %s" % (graph, manifest), file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, BadAnswer) as e:
        print("same_answer: %s" % e, file=sys.stderr)
        return 1
    failed = 0
    for kind, g, w in (("JSON", got[0], want[0]), ("binary", got[1], want[1])):
        why, errs = compare_answer(g, w, rtol)
        if why:
            print("same_answer: Triton's %s answer is not tpserve's: %s" % (kind, why), file=sys.stderr)
            failed += 1
        else:
            print("same_answer: Triton's %s answer is tpserve's (%s <= rtol %.0e)" % (kind, errs, rtol))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
