#!/usr/bin/env python3
"""make_repo.py GRAPHS_DIR GRAPH TPSERVE_CONFIG.json OUT_DIR

Writes a Triton model repository, OUT_DIR/GRAPH/{config.pbtxt, 1/model.py,
1/weights.npz}, serving with Triton's Python backend the same function
tpserve serves for GRAPH, so `make bench-http` can compare the two servers.

Only the sequence-parallel MLP of graphs/gen_examples.py (ex_mlp_sp, FP32) is
modelled: x -> all_gather -> matmul w_in -> gelu -> matmul w_out ->
reduce_scatter(sum). On the global tensors the two collectives are the
identity (the gather undoes the input's sequence sharding, the scatter
re-shards the summed partial products along the output's), so the global
answer is gelu(x @ w_in) @ w_out; model.py computes that in NumPy. Any other
graph is refused with a message: a benchmark against a different model
would be worthless.

TPSERVE_CONFIG.json is tpserve's own GET /v2/models/GRAPH/config answer; the
Triton config copies its inputs, outputs, max_batch_size, instance count and
dynamic batching settings, so both servers batch alike.

Exit status 0, or 1 with one line on stderr saying why. Needs numpy.
"""
import json
import os
import shutil
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "integration"))
import compare  # noqa: E402  (the project's safetensors reader)

MLP_OPS = ["all_gather", "matmul", "gelu", "matmul", "reduce_scatter"]


class NotModelled(Exception):
    pass


def shard_dim(placement):
    """'shard(1)' -> 1; anything else -> None."""
    if placement.startswith("shard(") and placement.endswith(")"):
        return int(placement[6:-1])
    return None


def mlp_params(g):
    """-> (w_in, w_out weight keys, gelu approximation) of an SP MLP graph."""
    nodes = g.get("nodes", [])
    if [n["op"] for n in nodes] != MLP_OPS:
        raise NotModelled("it is not the sequence-parallel MLP (ops %s)" % ", ".join(MLP_OPS))
    if len(g["inputs"]) != 1 or len(g["outputs"]) != 1:
        raise NotModelled("it has %d inputs and %d outputs, the MLP has one of each"
                          % (len(g["inputs"]), len(g["outputs"])))
    x, y = g["inputs"][0], g["outputs"][0]
    gather, mm_in, gelu, mm_out, scatter = nodes
    params = {p["name"]: p for p in g["params"]}
    wired = (gather["inputs"] == [x["name"]]
             and mm_in["inputs"][0] == gather["name"] and mm_in["inputs"][1] in params
             and gelu["inputs"] == [mm_in["name"]]
             and mm_out["inputs"][0] == gelu["name"] and mm_out["inputs"][1] in params
             and scatter["inputs"] == [mm_out["name"]] and y["name"] == scatter["name"])
    if not wired:
        raise NotModelled("its nodes are not wired as x -> gather -> matmul -> gelu -> matmul -> scatter")
    if any(n.get("attrs", {}).get("transpose_b") for n in (mm_in, mm_out)):
        raise NotModelled("a matmul has transpose_b")
    identity = (gather["attrs"]["dim"] == shard_dim(x["placement"])
                and scatter["attrs"]["dim"] == shard_dim(y["placement"])
                and scatter["attrs"].get("op") == "sum")
    if not identity:
        raise NotModelled("its collectives do not cancel the input's and output's sharding")
    w_in, w_out = mm_in["inputs"][1], mm_out["inputs"][1]
    dtypes = {x["datatype"], params[w_in]["datatype"], params[w_out]["datatype"]}
    if dtypes != {"FP32"}:
        raise NotModelled("it computes in %s; the NumPy model is FP32 only" % sorted(dtypes))
    # A param's weights are stored under its "tensor" key, default its name.
    key = lambda w: params[w].get("tensor", w)  # noqa: E731
    return key(w_in), key(w_out), gelu.get("attrs", {}).get("approximate", "none")


def tensor_pbtxt(t):
    return '  { name: "%s" data_type: %s dims: [ %s ] }' % (
        t["name"], t["data_type"], ", ".join(str(d) for d in t["dims"]))


def config_pbtxt(cfg, gelu_approximate):
    """Triton's text config from tpserve's JSON one (the fields that matter
    for serving the same requests the same way)."""
    db = cfg.get("dynamic_batching")
    lines = ['name: "%s"' % cfg["name"], 'backend: "python"',
             "max_batch_size: %d" % cfg["max_batch_size"],
             "input [\n%s\n]" % ",\n".join(tensor_pbtxt(t) for t in cfg["input"]),
             "output [\n%s\n]" % ",\n".join(tensor_pbtxt(t) for t in cfg["output"]),
             "instance_group [ { kind: KIND_CPU count: %d } ]"
             % sum(g.get("count", 1) for g in cfg.get("instance_group", [{}]))]
    # tpserve's default_queue_policy (its queue bound) is left out: with any
    # queue policy, Triton 2.51's dynamic batcher stalls requests for ~500 ms
    # at 8 connections and more (measured here: 19-290 req/s instead of
    # ~6000), and the bound is never reached by the bench's <= 32 requests
    # in flight.
    if db is not None:
        lines.append("dynamic_batching {\n  max_queue_delay_microseconds: %d\n"
                     "  preserve_ordering: %s\n}"
                     % (db.get("max_queue_delay_microseconds", 0),
                        "true" if db.get("preserve_ordering") else "false"))
    lines.append('parameters { key: "gelu_approximate" value: { string_value: "%s" } }'
                 % gelu_approximate)
    return "\n".join(lines) + "\n"


def main(argv):
    if len(argv) != 5:
        print("usage: make_repo.py GRAPHS_DIR GRAPH TPSERVE_CONFIG.json OUT_DIR", file=sys.stderr)
        return 1
    graphs, name, cfg_path, out = argv[1:]
    try:
        with open(os.path.join(graphs, name + ".json")) as f:
            g = json.load(f)
        with open(cfg_path) as f:
            cfg = json.load(f)
        if cfg.get("name") != name:
            raise NotModelled("%s is the configuration of %r" % (cfg_path, cfg.get("name")))
        w_in, w_out, approx = mlp_params(g)
        weights = compare.load(os.path.join(graphs, g["weights"]))
    except (OSError, ValueError, KeyError, TypeError, NotModelled, compare.FormatError) as e:
        print("make_repo: no Triton model for %s: %s" % (name, e), file=sys.stderr)
        return 1
    version = os.path.join(out, name, "1")
    os.makedirs(version, exist_ok=True)
    with open(os.path.join(out, name, "config.pbtxt"), "w") as f:
        f.write(config_pbtxt(cfg, approx))
    shutil.copy(os.path.join(HERE, "model.py"), version)
    np.savez(os.path.join(version, "weights.npz"),
             w_in=weights[w_in][1], w_out=weights[w_out][1])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
