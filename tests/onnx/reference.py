#!/usr/bin/env python3
"""reference.py MODEL.onnx --batch B --inputs IN.safetensors --ref REF.safetensors [--dim NAME=VALUE ...] [--seed S]
                [--twin TWIN.onnx]

Writes a random request for MODEL at batch B (integer inputs: ids below the
smallest embedding table they index; float inputs: standard normal) and the
outputs onnxruntime's CPU provider computes for it, as safetensors keyed by
the model's input and output names: the reference an imported tpgraph is
compared with (tests/integration/compare.py).

--twin: the outputs are TWIN's (the same graph in another float dtype, e.g.
the FP32 twin of a BF16 model, which onnxruntime's CPU provider has no
kernels for), given the request (float inputs cast to TWIN's dtypes) and
rounded to MODEL's output dtypes. Needs numpy, ml_dtypes, onnx, onnxruntime."""
import argparse
import os
import sys

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "graphs"))
from gen_examples import save_safetensors  # noqa: E402

NP_ST = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16",
         np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}


def id_limit(model, name):
    """Rows of the smallest constant table `name` indexes (Gather axis 0)."""
    inits = {i.name: list(i.dims) for i in model.graph.initializer}
    rows = [inits[n.input[0]][0] for n in model.graph.node
            if n.op_type == "Gather" and n.input[1] == name and n.input[0] in inits]
    return min(rows) if rows else 2


def make_feeds(model, batch, dims, seed):
    rng = np.random.default_rng(seed)
    inits = {i.name for i in model.graph.initializer}
    feeds = {}
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        tt = inp.type.tensor_type
        shape = []
        for k, d in enumerate(tt.shape.dim):
            shape.append(d.dim_value if d.HasField("dim_value") else dims.get(d.dim_param, batch if k == 0 else None))
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if np.issubdtype(dt, np.integer):
            feeds[inp.name] = rng.integers(0, id_limit(model, inp.name), size=shape).astype(dt)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dt)
    return feeds


def run_reference(path, feeds, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, feeds))), sess


def np_types(values):
    """ValueInfos -> {name: numpy dtype}."""
    return {v.name: np.dtype(onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)) for v in values}


def run_twin(model, twin_path, feeds):
    """TWIN's outputs for feeds, in MODEL's output dtypes."""
    twin = onnx.load(twin_path)
    tin, tout, mout = np_types(twin.graph.input), np_types(twin.graph.output), np_types(model.graph.output)
    if set(tin) != set(feeds) or set(tout) != set(mout):
        sys.exit("reference.py: %s: inputs %s, outputs %s: not those of the model (%s, %s)"
                 % (twin_path, sorted(tin), sorted(tout), sorted(feeds), sorted(mout)))
    outs, _ = run_reference(twin_path, {k: v.astype(tin[k]) for k, v in feeds.items()})
    return {k: v.astype(mout[k]) for k, v in outs.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--inputs", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--dim", action="append", default=[])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--twin")
    a = ap.parse_args()
    dims = {k: int(v) for k, v in (d.split("=", 1) for d in a.dim)}
    model = onnx.load(a.model)
    feeds = make_feeds(model, a.batch, dims, a.seed)
    outs = run_twin(model, a.twin, feeds) if a.twin else run_reference(a.model, feeds)[0]
    save_safetensors(a.inputs, {k: (NP_ST[v.dtype], v) for k, v in feeds.items()})
    save_safetensors(a.ref, {k: (NP_ST[v.dtype], v) for k, v in outs.items()})


if __name__ == "__main__":
    main()
