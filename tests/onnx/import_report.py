#!/usr/bin/env python3
"""import_report.py --tpserve BIN [--models a,b] [--world-sizes 1,2,4]

For every fixture and world size: ONNX nodes -> tpgraph nodes after import
-> nodes after tpserve's passes (`tpserve plan --json`), the collectives in
the imported graph, the fused nodes after passes, and the max relative error
of `tpserve run` (batch 3) against onnxruntime. Prints a markdown table
(graphs/README.md quotes it). Needs numpy, onnx, onnxruntime."""
import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile

import onnx

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
import compare  # noqa: E402

COLLECTIVES = ("all_gather", "all_reduce", "reduce_scatter", "all_to_all", "broadcast")


def counts(ops, keep):
    c = collections.Counter(o for o in ops if keep(o))
    return ", ".join("%d %s" % (n, op) for op, n in sorted(c.items())) or "-"


def row(tpserve, tmp, model, ws, sp):
    src = os.path.join(HERE, model + ".onnx")
    g = os.path.join(tmp, "%s_%s%d.json" % (model, "sp" if sp else "tp", ws))
    cmd = [sys.executable, os.path.join(ROOT, "graphs", "import_onnx.py"), src, "--world-size", str(ws), "--out", g]
    r = subprocess.run(cmd + (["--sequence-parallel"] if sp else []), capture_output=True, text=True)
    label = "%d%s" % (ws, " SP" if sp else "")
    n_onnx = len(onnx.load(src).graph.node)
    if r.returncode:
        return "| %s | %s | %d | %s |||||" % (model, label, n_onnx, r.stderr.strip().replace("import_onnx: ", ""))
    graph = json.load(open(g))
    plan = json.loads(subprocess.run([tpserve, "plan", g, "--json", "--batch", "3"], capture_output=True,
                                     text=True, check=True).stdout)
    after = [n["op"] for n in plan["nodes"] if n["op"] not in ("input", "param")]
    inputs, ref, out = (os.path.join(tmp, model + s) for s in (".in3.safetensors", ".ref3.safetensors", ".out"))
    if not os.path.exists(ref):
        subprocess.run([sys.executable, os.path.join(HERE, "reference.py"), src, "--batch", "3",
                        "--inputs", inputs, "--ref", ref], check=True)
    subprocess.run([tpserve, "run", g, "--inputs", inputs, "--output", out, "--backend", "cpu"],
                   check=True, capture_output=True)
    got, want = compare.load(out), compare.load(ref)
    err = max(compare.rel_err(compare.to_f64(*got[k]), compare.to_f64(*want[k])) for k in want)
    ops = [n["op"] for n in graph["nodes"]]
    return "| %s | %s | %d | %d | %d | %s | %s | %.1e |" % (
        model, label, n_onnx, len(ops), len(after), counts(ops, lambda o: o in COLLECTIVES),
        counts(after, lambda o: o.startswith("fused_")), err)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tpserve", required=True)
    ap.add_argument("--models", default="mlp,mlp_legacy,gpt2,bert,bert_legacy,llama")
    ap.add_argument("--world-sizes", default="1,2,4")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="import_report.")
    try:
        print("| model | world size | ONNX nodes | tpgraph nodes | after passes | collectives | fused after passes | max rel err vs onnxruntime |")
        print("|---|---|---|---|---|---|---|---|")
        for m in a.models.split(","):
            for ws in (int(w) for w in a.world_sizes.split(",")):
                print(row(a.tpserve, tmp, m, ws, False))
            if m not in ("mlp", "mlp_legacy"):
                print(row(a.tpserve, tmp, m, 2, True))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
