#!/usr/bin/env python3
"""import_onnx.py MODEL.onnx --world-size N --out OUT.json [--plan PLAN.json]
                 [--dim NAME=VALUE ...] [--sequence-parallel] [--stats]
                 [--generate [--max-seq-len L]]

Imports an ONNX model as a tpgraph v1 program for N tensor-parallel ranks:
OUT.json plus its unsharded weights OUT.safetensors beside it. Input and
output names and datatypes stay as in the model; the first dynamic input dim
is the batch dim B, every other dynamic dim must be fixed with --dim.

Steps (graphs/onnx_import/): normalize (shape inference + folding of all
that does not depend on the inputs' values, with onnx's reference
evaluator), lower (pattern matching to fused ops, then one tpgraph op per
remaining ONNX node), tp_plan (Megatron placement + collectives), write.

--generate: MODEL is a causal LM (input_ids [batch, seq] -> logits, both
dims dynamic, no past_key_values); OUT.json is its generation graph (token
rows, kv_attention over per-layer cache states, greedy next_token out; see
onnx_import/generate.py and docs/models.md), checked before it is kept by
greedy-generating a few tokens against onnxruntime (which it then needs).

Errors are one line on stderr, exit status 1, and nothing is written.
Needs python3 with numpy and onnx (scripts/deps.sh installs them)."""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from onnx_import.errors import ImportFailure  # noqa: E402


def parse_dims(items):
    dims = {}
    for it in items:
        name, sep, value = it.partition("=")
        if not sep or not value.isdigit() or int(value) < 1:
            raise ImportFailure("--dim %s: expected NAME=VALUE with a positive integer VALUE" % it)
        dims[name] = int(value)
    return dims


def read_plan(path):
    from onnx_import.tp_plan import MODES
    try:
        with open(path) as f:
            plan = json.load(f)
    except OSError as e:
        raise ImportFailure("%s: cannot read: %s" % (path, e.strerror))
    except json.JSONDecodeError as e:
        raise ImportFailure("%s: bad JSON at line %d column %d: %s" % (path, e.lineno, e.colno, e.msg))
    if not isinstance(plan, dict):
        raise ImportFailure("%s: expected an object {weight-name glob: mode}" % path)
    for glob, mode in plan.items():
        if mode not in MODES:
            raise ImportFailure("%s: '%s': mode '%s' is not one of %s" % (path, glob, mode, ", ".join(MODES)))
    return plan


def import_model(args):
    from onnx_import.lower import lower
    from onnx_import.normalize import normalize
    from onnx_import.passes import attention_reads_kv_heads, fuse_sibling_matmuls, simplify
    from onnx_import.tp_plan import Planner
    from onnx_import.write import build, write

    if args.world_size < 1:
        raise ImportFailure("--world-size %d: must be at least 1" % args.world_size)
    if not args.out.endswith(".json"):
        raise ImportFailure("--out %s: must end in .json" % args.out)
    plan = read_plan(args.plan) if args.plan else None
    if args.generate:
        nm, prog, planner = import_generation(args, plan)
    else:
        if args.max_seq_len is not None:
            raise ImportFailure("--max-seq-len: only with --generate")
        nm = normalize(args.model, parse_dims(args.dim))
        prog = lower(nm)
        simplify(prog)
        attention_reads_kv_heads(prog)
        fuse_sibling_matmuls(prog, plan or {})
        planner = Planner(prog, args.world_size, plan, args.sequence_parallel)
    outs = planner.run()
    base = os.path.basename(args.out)[:-len(".json")]
    graph, tensors = build(planner, prog, outs, base, base + ".safetensors")
    if args.generate:
        from onnx_import.generate import rows_head
        if not rows_head(graph):
            print("import_onnx: --generate: no matmul by a 2-d weight gives the logits, so every row computes "
                  "them (no logit_rows)", file=sys.stderr)
    write(args.out, graph, tensors)
    if args.generate:
        from onnx_import.generate import selfcheck
        try:
            selfcheck(args.out, planner.export, planner.generate)
        except BaseException:
            for f in (args.out, os.path.join(os.path.dirname(args.out) or ".", graph["weights"])):
                if os.path.exists(f):
                    os.remove(f)
            raise
    if args.stats:
        print(json.dumps({"onnx_nodes": nm.onnx_node_count, "tpgraph_nodes": len(graph["nodes"])}))


def import_generation(args, plan):
    """--generate: the program at sequence length 1 (token rows), made a
    generation program (onnx_import/generate.py) -> (nm, prog, planner)."""
    from onnx_import.generate import Export, make_generation, probe_causal
    from onnx_import.lower import lower
    from onnx_import.normalize import normalize
    from onnx_import.passes import fuse_sibling_matmuls, simplify
    from onnx_import.tp_plan import Planner

    if args.sequence_parallel:
        # Sequence parallelism splits a [B, T, E] activation on T between the
        # row- and column-parallel halves; a generation step's rows are
        # single tokens (T = 1) of a step of at most the largest bucket, so
        # there is nothing to split and no activation memory to save: the
        # graph is the tensor-parallel one, and the user is told.
        print("import_onnx: --sequence-parallel with --generate: a generation step has one token per row, "
              "so its graph splits heads and the MLP as without it", file=sys.stderr)
        args.sequence_parallel = False
    if args.max_seq_len is not None and args.max_seq_len < 1:
        raise ImportFailure("--max-seq-len %d: must be at least 1" % args.max_seq_len)
    export = Export(args.model)
    dims = parse_dims(args.dim)
    if export.seq in dims:
        raise ImportFailure("--dim %s: the sequence dim is set by --generate" % export.seq)

    def program(seq):
        prog = lower(normalize(args.model, dict(dims, **{export.seq: seq})))
        simplify(prog)
        return prog

    causal = probe_causal(export, lambda s: program(s).nodes)
    nm = normalize(args.model, dict(dims, **{export.seq: 1}))
    prog = lower(nm)
    simplify(prog)
    gen, states, replicate = make_generation(export, nm, prog, causal, args.max_seq_len)
    # position tables stay whole on every rank: one row per token, no collective
    plan = dict({name: "replicate" for name in replicate}, **(plan or {}))
    fuse_sibling_matmuls(prog, plan)
    planner = Planner(prog, args.world_size, plan, False, gen, states)
    planner.export = export
    return nm, prog, planner


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--world-size", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--plan")
    ap.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--sequence-parallel", action="store_true")
    ap.add_argument("--stats", action="store_true", help="print ONNX and tpgraph node counts as JSON")
    ap.add_argument("--generate", action="store_true", help="a causal LM's generation graph (KV cache, greedy tokens)")
    ap.add_argument("--max-seq-len", type=int, metavar="L",
                    help="--generate: cache length (default: the model's position limit)")
    args = ap.parse_args(argv)
    try:
        import_model(args)
    except ImportFailure as e:
        print("import_onnx: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
