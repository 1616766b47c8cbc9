"""The planned program -> OUT.json (tpgraph v1) + OUT.safetensors (the
unsharded weights), written to temporary names and renamed into place only
when both are complete, so a failed import leaves nothing behind.

The safetensors file is streamed: each tensor is laid out (reordered rank
major, padded) just before its bytes are written, so at most one converted
tensor exists at a time besides the weights the import already holds."""
import json
import os

import numpy as np

from gen_examples import KS_ST, ST_NP, stream_safetensors

from .errors import ImportFailure


def _rank_major(arr, dim, segs, d):
    """Reorders dim so that plain shard(dim) gives rank r chunk r of every segment."""
    arr = np.asarray(arr)  # an ir.Joined is made once here
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


def _padded(arr, dim, pad):
    """arr with `pad` zero entries appended along dim."""
    zeros = np.zeros(arr.shape[:dim] + (pad,) + arr.shape[dim + 1:], arr.dtype)
    return np.concatenate([arr, zeros], axis=dim)


def _layout(arr, p, d):
    """The stored form of param p: (shape, a function giving its array)."""
    shape = list(arr.shape)
    if p["pad"]:
        shape[p["dim"]] += p["pad"]
        return shape, lambda: _padded(arr, p["dim"], p["pad"])
    if p["segs"] is not None:
        return shape, lambda: _rank_major(arr, p["dim"], p["segs"], d)
    return shape, lambda: np.asarray(arr)


def build(planner, prog, outs, graph_name, weights_file):
    """-> (graph dict, tensors {key: (safetensors dtype, shape, make)}).
    A generation graph (planner.generate) returns next_token alone and
    declares its states and its "generate" block."""
    d = planner.d
    tensors, params = {}, []
    for name, p in planner.params.items():
        arr = prog.params[p["source"]]
        dt = prog.values[p["source"]].datatype
        key = p["source"]
        if p["segs"] is not None:
            key = p["source"] + ".rank_major%d" % d
        elif p["pad"]:
            key = p["source"] + ".pad%d" % p["pad"]
        shape, make = _layout(arr, p, d)
        tensors[key] = (KS_ST[dt], shape, make)
        entry = {"name": name, "datatype": dt, "shape": [int(s) for s in shape],
                 "placement": "replicate" if p["dim"] is None else "shard(%d)" % p["dim"]}
        if key != name:
            entry["tensor"] = key
        params.append(entry)
    if planner.generate:
        out_names, places = list(outs), ["replicate"] * len(outs)
    else:
        places = [planner.out_place.get(o, "replicate") for o in outs]
        _rename_outputs(planner, prog, outs)
        out_names = prog.output_names
    graph = {
        "format": "tpgraph", "version": 1, "name": graph_name, "world_size": d,
        "weights": weights_file,
        "inputs": [{"name": v.name, "datatype": v.datatype,
                    "shape": ["B" if k == v.bdim else int(s) for k, s in enumerate(v.shape)],
                    "placement": "replicate"} for v in prog.inputs],
        "params": params,
        "outputs": [{"name": o, "placement": pl} for o, pl in zip(out_names, places)],
        "nodes": [{k: v for k, v in n.items() if k != "attrs" or v} for n in planner.nodes],
    }
    if planner.generate:
        graph["states"] = [{"name": s.name, "datatype": s.datatype,
                            "shape": [d if d == "S" else int(d) for d in s.shape],
                            "placement": planner.state_place[s.name]} for s in planner.states]
        graph["generate"] = dict(planner.generate)
    return graph, tensors


def write(out_json, graph, tensors):
    """Writes both files, creating --out's directory when missing."""
    out_dir = os.path.dirname(out_json) or "."
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ImportFailure("--out %s: %s is not a directory" % (out_json, out_dir))
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as e:
        raise ImportFailure("--out %s: cannot create its directory %s: %s" % (out_json, out_dir, e.strerror))
    st_path = os.path.join(out_dir, graph["weights"])
    tmp_json, tmp_st = out_json + ".tmp", st_path + ".tmp"
    try:
        stream_safetensors(tmp_st, tensors)
        with open(tmp_json, "w") as f:
            json.dump(graph, f, indent=1)
            f.write("\n")
        os.replace(tmp_st, st_path)
        os.replace(tmp_json, out_json)
    except OSError as e:
        raise ImportFailure("--out %s: cannot write %s: %s" % (out_json, e.filename or out_json, e.strerror))
    finally:
        for t in (tmp_json, tmp_st):
            if os.path.exists(t):
                os.remove(t)
