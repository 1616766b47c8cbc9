#!/usr/bin/env python3
"""serving_path_graph.py GRAPH.json OUT.json

The "serving path alone" server of `make bench-http`: a graph with GRAPH's
name, world size, input and output, whose only node is a relu of the
input (each rank its own shard: no collective, no weights). Served by
tpserve it takes the same requests and answers with the same datatype and
shape (the bench checks the answer's length), so its rate against bare
libmicrohttpd is what tpserve's HTTP handling, codec, checks, batching,
staging and replay cost without the model's arithmetic.

Only for graphs with one input and one output (the example graphs); exit
status 1 with the reason on stderr otherwise.
"""
import json
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    with open(src) as f:
        g = json.load(f)
    ins, outs = g.get("inputs", []), g.get("outputs", [])
    if len(ins) != 1 or len(outs) != 1:
        sys.exit(f"{src}: {len(ins)} inputs and {len(outs)} outputs; the serving-path graph needs one of each")
    x, y = ins[0], outs[0]
    trivial = {
        "format": g["format"],
        "version": g["version"],
        "name": g["name"],
        "world_size": g["world_size"],
        "inputs": [x],
        "params": [],
        "outputs": [{"name": y["name"], "placement": x.get("placement", "replicate")}],
        "nodes": [{"name": y["name"], "op": "relu", "inputs": [x["name"]]}],
    }
    with open(out, "w") as f:
        json.dump(trivial, f)


if __name__ == "__main__":
    main()
