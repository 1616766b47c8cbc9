"""The planned program -> OUT.json (tpgraph v1) + OUT.safetensors (the
unsharded weights), written to temporary names and renamed into place only
when both are complete, so a failed import leaves nothing behind."""
import json
import os

import numpy as np

from gen_examples import KS_ST, save_safetensors


def _rank_major(arr, dim, segs, d):
    """Reorders dim so that plain shard(dim) gives rank r chunk r of every segment."""
    pieces, bounds = [], np.cumsum((0,) + tuple(segs))
    for r in range(d):
        for s, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            c = (hi - lo) // d
            pieces.append(np.take(arr, np.arange(lo + r * c, lo + (r + 1) * c), axis=dim))
    return np.concatenate(pieces, axis=dim)


def _rename_outputs(planner, prog, outs):
    """Gives each output node its ONNX output name."""
    nodes = planner.nodes
    names = {n["name"] for n in nodes}
    for emitted, onnx_name in zip(outs, prog.output_names):
        if emitted == onnx_name:
            continue
        if onnx_name in names:
            taken = onnx_name + ".local"
            while taken in names:
                taken += "_"
            _rename(nodes, onnx_name, taken)
            names.add(taken)
        _rename(nodes, emitted, onnx_name)
        names.add(onnx_name)


def _rename(nodes, old, new):
    for n in nodes:
        if n["name"] == old:
            n["name"] = new
        n["inputs"] = [new if i == old else i for i in n["inputs"]]


def build(planner, prog, outs, graph_name, weights_file):
    d = planner.d
    tensors, params = {}, []
    for name, p in planner.params.items():
        arr = prog.params[p["source"]]
        dt = prog.values[p["source"]].datatype
        key = p["source"]
        if p["segs"] is not None:
            arr = _rank_major(arr, p["dim"], p["segs"], d)
            key = p["source"] + ".rank_major%d" % d
        tensors[key] = (KS_ST[dt], arr)
        entry = {"name": name, "datatype": dt, "shape": [int(s) for s in arr.shape],
                 "placement": "replicate" if p["dim"] is None else "shard(%d)" % p["dim"]}
        if key != name:
            entry["tensor"] = key
        params.append(entry)
    _rename_outputs(planner, prog, outs)
    graph = {
        "format": "tpgraph", "version": 1, "name": graph_name, "world_size": d,
        "weights": weights_file,
        "inputs": [{"name": v.name, "datatype": v.datatype,
                    "shape": ["B" if k == v.bdim else int(s) for k, s in enumerate(v.shape)],
                    "placement": "replicate"} for v in prog.inputs],
        "params": params,
        "outputs": [{"name": o, "placement": "replicate"} for o in prog.output_names],
        "nodes": [{k: v for k, v in n.items() if k != "attrs" or v} for n in planner.nodes],
    }
    return graph, tensors


def write(out_json, graph, tensors):
    st_path = os.path.join(os.path.dirname(out_json) or ".", graph["weights"])
    tmp_json, tmp_st = out_json + ".tmp", st_path + ".tmp"
    try:
        save_safetensors(tmp_st, tensors)
        with open(tmp_json, "w") as f:
            json.dump(graph, f, indent=1)
            f.write("\n")
        os.replace(tmp_st, st_path)
        os.replace(tmp_json, out_json)
    finally:
        for t in (tmp_json, tmp_st):
            if os.path.exists(t):
                os.remove(t)
