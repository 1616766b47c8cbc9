#!/bin/sh
# test_onnx.sh — the ONNX importer end to end: every fixture in tests/onnx
# (and the hand-built models of tests/onnx/synthetic.py) imported at world
# sizes 1, 2 and 4 (4 only where the heads divide; Llama's 2 KV heads must
# give the heads error), run with `tpserve run` at batch 1 and 3 with ranks
# as threads and as processes, and compared with onnxruntime (FP32, rtol
# 1e-4) — including synthetic models of the ops ONNX exports need after
# folding (unary_ops, index_ops; gather_elements: BERT's token_type buffer, folded
# past 64 entries); --sequence-parallel and --plan overrides; the error cases (one
# line, non-zero exit, nothing written); one imported model served over HTTP
# with INT64 input_ids as JSON and as binary tensor data.
#
# env: TPSERVE (binary), PYTHON (python3 with numpy, onnx, onnxruntime);
#      KEEP_TMP=1 keeps the files.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_onnx.XXXXXX")
. "$HERE/lib/server.sh"
. "$HERE/lib/onnx.sh"
RTOL=1e-4

$PYTHON "$FIX/synthetic.py" "$TMP" || { fail "synthetic.py"; exit 1; }
for m in mlp mlp_legacy gpt2 gpt2_vocab257 bert bert512 bert_legacy llama; do cp "$FIX/$m.onnx" "$TMP/"; done

# reference MODEL BATCH: onnxruntime's answer to a random request.
reference() {
    $REFERENCE "$TMP/$1.onnx" --batch "$2" \
        --inputs "$TMP/$1.in$2.safetensors" --ref "$TMP/$1.ref$2.safetensors"
}

# run_all GRAPH MODEL WS: batch 1 and 3 with ranks as threads, and batch 3
# with ranks as processes when there are several (the process transport
# carries rows the same way at any batch; one rank is one process either
# way). Under a sanitizer (make asan) batch 3 only: the importer is Python,
# the same in both runs, and batch 1 runs the same kernels on fewer rows;
# what ASan checks is tpserve running every graph, which batch 3 does.
RUN_BATCHES="1 3"
[ -n "${TP_SANITIZED:-}" ] && RUN_BATCHES=3
# World sizes per model: 1, 2 and 4; under a sanitizer 2 alone (its
# collectives and split kernels are what 1 and 4 run too), but every size
# for odd_vocab, whose padded plans are checked below.
sizes_for() {
    if [ -n "${TP_SANITIZED:-}" ] && [ "$1" != odd_vocab ]; then echo 2; else echo 1 2 4; fi
}
run_all() {
    for b in $RUN_BATCHES; do run_check "$1" "$2" $b threads; done
    [ "$3" = 1 ] || run_check "$1" "$2" 3 processes
}

# ---- every model at world sizes 1, 2, 4 --------------------------------------
for m in mlp mlp_legacy gpt2 gpt2_vocab257 bert bert512 bert_legacy llama decomposed fused_gqa unary_ops index_ops \
    gather_elements odd_vocab; do
    reference $m 1 && reference $m 3 || { fail "$m: onnxruntime reference"; continue; }
    for ws in $(sizes_for $m); do
        g=${m}_tp$ws
        if [ $ws = 4 ] && { [ "$m" = llama ] || [ "$m" = fused_gqa ]; }; then
            continue # 2 KV heads: the heads errors below
        fi
        if $IMPORT "$TMP/$m.onnx" --world-size $ws --out "$TMP/$g.json" 2>"$TMP/err"; then
            run_all "$g" "$m" $ws
        else
            fail "import $g: $(cat "$TMP/err")"
        fi
    done
done

# Weights in an external data file (large exports): imported like the rest;
# without the data file the import fails naming it.
$IMPORT "$TMP/external.onnx" --world-size 2 --out "$TMP/external_tp2.json" 2>"$TMP/err" && reference external 3 &&
    run_check external_tp2 external 3 threads || fail "external data: $(cat "$TMP/err")"

# ---- a vocab no world size divides (GPT-2's 50257): padded, not refused -------
# 8 ranks too (GPT-2's vocab at every degree a node has).
if $IMPORT "$TMP/odd_vocab.onnx" --world-size 8 --out "$TMP/odd_vocab_tp8.json" 2>"$TMP/err"; then
    run_check odd_vocab_tp8 odd_vocab 3 threads
else
    fail "import odd_vocab_tp8: $(cat "$TMP/err")"
fi
# An untied head [16, 50257] (column-parallel on dim 1): padded along dim 1.
if $IMPORT "$TMP/odd_vocab_untied.onnx" --world-size 4 --out "$TMP/odd_vocab_untied_tp4.json" 2>"$TMP/err" &&
    reference odd_vocab_untied 3; then
    run_check odd_vocab_untied_tp4 odd_vocab_untied 3 threads
    $PYTHON -c "
import json, sys
g = json.load(open(sys.argv[1]))
head = [p for p in g['params'] if p['name'] == 'head'][0]
assert head['shape'] == [16, 50688] and head['placement'] == 'shard(1)', head
" "$TMP/odd_vocab_untied_tp4.json" && pass "odd vocab: untied head padded to [16, 50688], shard(1)" ||
        fail "odd vocab: untied head placement"
else
    fail "import odd_vocab_untied_tp4: $(cat "$TMP/err")"
fi
$PYTHON - "$TMP" <<'PY' && pass "odd vocab: table padded to 128 x world size with zero rows, head vocab-parallel, logits sliced back to 50257" || fail "odd vocab: padded plan structure"
import json, os, sys
for ws, padded in ((1, 50257), (2, 50432), (4, 50688), (8, 51200)):
    g = json.load(open(os.path.join(sys.argv[1], "odd_vocab_tp%d.json" % ws)))
    t = [p for p in g["params"] if p["name"] == "table"][0]
    assert t["shape"] == [padded, 16], (ws, t)
    assert ws == 1 or t["placement"] == "shard(0)", (ws, t)
    head = [n for n in g["nodes"] if n["op"] == "matmul" and "table" in n["inputs"]]
    assert len(head) == 1 and head[0]["attrs"] == {"transpose_b": True}, head  # column-parallel on the vocab
    if ws > 1:
        ops = [(n["op"], n.get("attrs")) for n in g["nodes"][-2:]]
        assert ops == [("all_gather", {"dim": 2}), ("slice", {"dim": 2, "start": 0, "length": 50257})], ops
        assert g["nodes"][-1]["name"] == "logits"
PY
$PYTHON - "$ROOT/graphs" "$TMP/odd_vocab_tp4.json" <<'PY' && pass "odd vocab: the padding rows are zeros, the table rows unchanged" || fail "odd vocab: padded table contents"
import json, os, sys
sys.path.insert(0, sys.argv[1])
from gen_examples import load_safetensors
import onnx
from onnx import numpy_helper
g = json.load(open(sys.argv[2]))
t = [p for p in g["params"] if p["name"] == "table"][0]
_, stored = load_safetensors(os.path.join(os.path.dirname(sys.argv[2]), g["weights"]))[t["tensor"]]
model = onnx.load(sys.argv[2].replace("_tp4.json", ".onnx"))
table = numpy_helper.to_array([i for i in model.graph.initializer if i.name == "table"][0])
assert (stored[:50257] == table).all() and not stored[50257:].any()
PY

# ---- --sequence-parallel: reduce_scatter + all_gather, fused by fuse_tp -------
for m in gpt2 bert llama decomposed; do
    g=${m}_sp2
    $IMPORT "$TMP/$m.onnx" --world-size 2 --sequence-parallel --out "$TMP/$g.json" 2>"$TMP/err" ||
        { fail "import $g: $(cat "$TMP/err")"; continue; }
    run_check "$g" "$m" 3 threads
    run_check "$g" "$m" 1 processes
    "$TPSERVE" plan "$TMP/$g.json" --json --batch 2 >"$TMP/plan.json" &&
        $PYTHON - "$TMP/$g.json" "$TMP/plan.json" <<'PY' && pass "$g: reduce_scatter in the graph, fused by fuse_tp" || fail "$g: sequence-parallel structure"
import json, sys
g, p = (json.load(open(f)) for f in sys.argv[1:])
ops = [n["op"] for n in g["nodes"]]
assert "reduce_scatter" in ops and "all_reduce" not in ops, ops
fused = {n["op"] for n in p["nodes"] if n["op"].startswith("fused_")}
want = {"fused_all_gather_matmul", "fused_matmul_reduce_scatter"}
# decomposed.onnx has one block whose input arrives replicated: nothing to gather before its matmul
assert fused == want or (g["name"] == "decomposed_sp2" and fused == {"fused_matmul_reduce_scatter"}), fused
PY
done

# ---- the ops of ONNX exports: each lowered to its own tpgraph op ----------------
$PYTHON - "$TMP/unary_ops_tp2.json" "$TMP/index_ops_tp2.json" <<'PY' && pass "ONNX ops lowered directly: div sqrt rsqrt exp neg tanh erf sigmoid pow reduce_mean reduce_sum where gather expand cast" || fail "ONNX ops not lowered to their tpgraph ops"
import json, sys
u, i = (json.load(open(p)) for p in sys.argv[1:])
ops = {n["op"] for g in (u, i) for n in g["nodes"]}
want = {"div", "sqrt", "rsqrt", "exp", "neg", "tanh", "erf", "sigmoid", "pow", "reduce_mean", "reduce_sum",
        "where", "gather", "expand", "cast"}
assert want <= ops, want - ops
pw = sorted(n["attrs"]["exponent"] for n in u["nodes"] if n["op"] == "pow")
assert pw == [-1.0, 1.5, 3.0], pw
casts = [n["attrs"]["to"] for n in i["nodes"] if n["op"] == "cast"]
assert casts == ["FP16", "FP32", "INT32", "FP32"], casts
ex = [n["attrs"]["shape"] for n in i["nodes"] if n["op"] == "expand"]
assert ex == [[1, 4, 1]], ex  # 1 keeps the batch and the split dim (local 16 of 32)
mask = [p for p in i["params"] if p["name"].startswith("mask")]
assert mask and mask[0]["datatype"] == "INT32" and mask[0]["placement"] == "shard(1)", mask
PY

# ---- the default plan's structure, and --plan overrides --------------------------
$PYTHON - "$TMP/gpt2_tp2.json" "$TMP/llama_tp2.json" "$TMP/fused_gqa_tp2.json" "$TMP/gpt2_vocab257_tp2.json" <<'PY' && pass "default plan: Megatron placements and collectives" || fail "default plan structure"
import json, sys
g, l, f, v = (json.load(open(p)) for p in sys.argv[1:])
pl = {p["name"]: p for p in g["params"]}
# GPT-2: fused QKV column-parallel stored rank-major, c_proj row-parallel,
# tied embedding / LM head vocab-parallel (one param), logits left sharded
# (the server concatenates the ranks' vocab chunks); a padded vocab's are
# all_gathered and sliced back instead.
assert pl["m.transformer.h.0.attn.c_attn.weight"]["placement"] == "shard(1)"
assert pl["m.transformer.h.0.attn.c_attn.weight"]["tensor"].endswith(".rank_major2")
assert pl["m.transformer.h.0.attn.c_proj.weight"]["placement"] == "shard(0)"
assert pl["m.transformer.h.0.mlp.c_fc.weight"]["placement"] == "shard(1)"
assert pl["m.lm_head.weight"]["placement"] == "shard(0)"
ops = [n["op"] for n in g["nodes"]]
assert ops.count("all_reduce") == 5 and ops[-1] == "matmul" and "all_gather" not in ops, ops
assert [o["placement"] for o in g["outputs"]] == ["shard(2)"], g["outputs"]
assert [n["op"] for n in v["nodes"]][-2:] == ["all_gather", "slice"], [n["op"] for n in v["nodes"]][-3:]
assert [o["placement"] for o in v["outputs"]] == ["replicate"], v["outputs"]
emb = [n for n in g["nodes"] if n["op"] == "embedding"][0]
assert emb["attrs"] == {"vocab_parallel": True}
assert [n["op"] for n in l["nodes"]].count("attention") == 2
assert all(n["attrs"].get("causal") for n in l["nodes"] if n["op"] == "attention")
# fused GQA projection q 32 | k 16 | v 16: split per segment, stored rank-major
fp = {p["name"]: p for p in f["params"]}
assert fp["w_qkv"]["placement"] == "shard(1)" and fp["w_qkv"]["tensor"] == "w_qkv.rank_major2"
assert [(n["attrs"]["start"], n["attrs"]["length"]) for n in f["nodes"] if n["op"] == "slice"] == [(0, 16), (16, 8), (24, 8)]
assert [n["attrs"] for n in f["nodes"] if n["op"] == "attention"] == [{"causal": True, "scale": 0.1767766922712326}]
PY
echo '{"*": "replicate"}' >"$TMP/all_rep.json"
if $IMPORT "$TMP/gpt2.onnx" --world-size 2 --plan "$TMP/all_rep.json" --out "$TMP/gpt2_rep2.json" 2>"$TMP/err"; then
    $PYTHON -c "
import json, sys
g = json.load(open(sys.argv[1]))
assert all(p['placement'] == 'replicate' for p in g['params'])
assert not any(n['op'] in ('all_reduce', 'all_gather', 'reduce_scatter') for n in g['nodes'])
" "$TMP/gpt2_rep2.json" && pass "--plan '*': replicate leaves no collective" || fail "--plan replicate structure"
    run_check gpt2_rep2 gpt2 3 threads
else
    fail "import with --plan: $(cat "$TMP/err")"
fi
echo '{"*mlp.c_proj.weight": "replicate", "*.c_fc.weight": "colwise"}' >"$TMP/mixed.json"
if $IMPORT "$TMP/gpt2.onnx" --world-size 2 --plan "$TMP/mixed.json" --out "$TMP/gpt2_mix2.json" 2>"$TMP/err"; then
    run_check gpt2_mix2 gpt2 3 threads
else
    fail "import with a mixed --plan: $(cat "$TMP/err")"
fi

# Llama at 4 ranks has too few KV heads (the error below); replicating the
# k/v projections through a plan file makes it run (attention then gathers q).
echo '{"val_34": "replicate", "val_41": "replicate", "val_175": "replicate", "val_182": "replicate"}' >"$TMP/kv_rep.json"
if $IMPORT "$TMP/llama.onnx" --world-size 4 --plan "$TMP/kv_rep.json" --out "$TMP/llama_kvrep4.json" 2>"$TMP/err"; then
    run_check llama_kvrep4 llama 3 threads
else
    fail "llama at 4 ranks with k/v replicated: $(cat "$TMP/err")"
fi

# ---- sibling matmuls: q, k, v (and gate, up) of one input joined -------------------
$PYTHON - "$TMP/llama_tp2.json" "$TMP/bert_tp2.json" "$TMP/llama_kvrep4.json" <<'PY' && pass "sibling matmuls joined: q|k|v and gate|up one product each, biases one add, rank-major; a planned weight left alone" || fail "sibling matmul fusion structure"
import json, sys
l, b, r = (json.load(open(p)) for p in sys.argv[1:])
def joined(g, n):
    return [p for p in g["params"] if p["name"].endswith(".cat%d" % n)]
# Llama (GQA, q 64 | k 32 | v 32): one [64, 128] product a layer for q, k, v
# and one for gate | up, each split per segment and stored rank-major
qkv, gu = joined(l, 3), joined(l, 2)
assert len(qkv) == 2 and len(gu) == 2, ([p["name"] for p in l["params"]])
assert all(p["placement"] == "shard(1)" and p["tensor"].endswith(".rank_major2") for p in qkv + gu), qkv + gu
mm = [n for n in l["nodes"] if n["op"] == "matmul" and n["inputs"][1] == qkv[0]["name"]][0]
cuts = [(n["attrs"]["start"], n["attrs"]["length"]) for n in l["nodes"] if n["op"] == "slice" and n["inputs"] == [mm["name"]]]
assert cuts == [(0, 32), (32, 16), (48, 16)], cuts  # local: rank r's q, k, v heads side by side
# a layer: q|k|v, o, gate|up, down (the fixture has no head)
assert sum(n["op"] == "matmul" for n in l["nodes"]) == 2 * 4, [n["op"] for n in l["nodes"]]
# BERT: q, k, v with biases: one product and one add of the joined bias
bias = [p for p in b["params"] if p["name"].endswith(".cat3") and len(p["shape"]) == 1]
assert len(bias) == 2 and all(p["placement"] == "shard(0)" for p in bias), bias
# a --plan naming k and v keeps them out: q alone is left as it was
assert not joined(r, 3) and len(joined(r, 2)) == 2, [p["name"] for p in r["params"]]
PY

# ---- GQA: attention reads k and v with their kv heads --------------------------
# Llama's repeat_kv (reshape, expand, reshape to H heads) is dropped: attention
# takes k and v [B, Hkv, T, D] and each query head reads its kv head, so no
# layer copies them H / Hkv times; replicated k/v (kvrep4) too. The outputs
# are checked against onnxruntime above.
$PYTHON - "$TMP/llama_tp1.json" "$TMP/llama_tp2.json" "$TMP/fused_gqa_tp2.json" "$TMP/llama_kvrep4.json" <<'PY' && pass "GQA: attention reads k and v with their kv heads, no repeat_kv expand; RoPE one rope op" || fail "GQA attention and rope structure"
import json, os, sys
# world size 1 is not imported under a sanitizer (sizes_for)
paths = [p for p in sys.argv[1:] if os.path.exists(p)]
assert len(paths) >= 3, paths
for path in paths:
    g = json.load(open(path))
    by = {n["name"]: n for n in g["nodes"]}
    att = [n for n in g["nodes"] if n["op"] == "attention"]
    assert att and not [n for n in g["nodes"] if n["op"] == "expand"], (path, [n["op"] for n in g["nodes"]])
    for n in att:
        for kv in n["inputs"][1:3]:
            assert by[kv]["op"] != "reshape" or by[by[kv]["inputs"][0]]["op"] != "expand", (path, kv)
    # Llama's RoPE (mul, slice, neg, cat, mul, add on q and on k) is one rope
    # op each: 2 layers x q, k; nothing of the decomposed form is left
    if os.path.basename(path).startswith("llama"):
        ops = [n["op"] for n in g["nodes"]]
        assert ops.count("rope") == 4 and "neg" not in ops and "cat" not in ops, (path, ops)
PY

# ---- errors: one line naming the culprit, exit 1, nothing written ---------------
# expect_error DESC SUBSTRING ARGS...
expect_error() {
    desc=$1
    want=$2
    shift 2
    rm -f "$TMP/bad.json" "$TMP/bad.safetensors"
    $IMPORT "$@" --out "$TMP/bad.json" 2>"$TMP/err" >/dev/null
    rc=$?
    if [ $rc = 1 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && grep -qF -- "$want" "$TMP/err" &&
        [ ! -e "$TMP/bad.json" ] && [ ! -e "$TMP/bad.safetensors" ] && [ -z "$(ls "$TMP" | grep '\.tmp$')" ]; then
        pass "error: $desc: $(cat "$TMP/err")"
    else
        fail "error: $desc: exit $rc, wanted one line with '$want': $(cat "$TMP/err")"
    fi
}
expect_error "op without a mapping" "ONNX node 'the_sine' (op Sin): no tpgraph mapping" "$TMP/unmapped_op.onnx" --world-size 2
expect_error "Pow by a non-constant" "ONNX node 'the_pow' (op Pow): no tpgraph mapping: an exponent that is not one constant" "$TMP/pow_dynamic.onnx" --world-size 1
expect_error "unfixed dynamic dim" "input 'x' dim 1 ('seq') is dynamic: fix it with --dim seq=VALUE" "$TMP/two_dynamic.onnx" --world-size 1
expect_error "heads not divisible" "[64, 32]: 'view_1' splits its dim of 32 into 2 x 16 and 2 (heads) is not divisible by world size 4: replicate it with a --plan file holding {\"val_34\": \"replicate\"}" "$TMP/llama.onnx" --world-size 4
expect_error "KV heads of a fused QKV not divisible" "weight 'w_qkv' [32, 64]: 'k4' splits its dim of 16 into 2 x 8 and 2 (heads) is not divisible by world size 4" "$TMP/fused_gqa.onnx" --world-size 4
head -c 300000 "$TMP/gpt2.onnx" >"$TMP/truncated.onnx"
expect_error "truncated .onnx" "truncated.onnx: not a valid ONNX file (truncated or corrupt?)" "$TMP/truncated.onnx" --world-size 2
head -c 3 "$TMP/gpt2.onnx" >"$TMP/truncated3.onnx"
expect_error "3-byte .onnx" "truncated3.onnx: not a valid ONNX" "$TMP/truncated3.onnx" --world-size 2
mv "$TMP/external.onnx.data" "$TMP/moved.data"
expect_error "external data missing" "external.onnx: cannot read its external tensor data: initializer 'w1': $TMP/external.onnx.data: No such file" "$TMP/external.onnx" --world-size 2
head -c 1000 "$TMP/moved.data" >"$TMP/external.onnx.data"
expect_error "external data truncated" "external.onnx: cannot read its external tensor data: initializer 'w1': 'external.onnx.data': bytes 0..8192 of a file of 1000 bytes (truncated?)" "$TMP/external.onnx" --world-size 2
# Folding evaluates every constant: an index past a buffer (BERT's token_type
# GatherElements) is an error naming the node, never a wrapped-around value.
expect_error "folding a bad GatherElements" "ONNX node 'type_ids_gather' (op GatherElements): evaluating at batch 3 failed: index 100 is out of bounds" "$TMP/gather_elements_oob.onnx" --world-size 2
expect_error "a node that fails to evaluate" "ONNX node 'the_matmul' (op MatMul): evaluating at batch 3 failed: shapes (3,16) and (12,16) not aligned" "$TMP/bad_matmul.onnx" --world-size 2
# Products of the inputs' values are not computed at import (only their
# shapes matter; half of a 0.85B Llama's import); products of constants
# are, since their values are folded in. Counts onnx's numpy_matmul calls.
$PYTHON - "$ROOT/graphs" <<'PY' && pass "import computes products of constants, not of inputs" ||
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, onnx, tempfile, os
from onnx import helper, numpy_helper, TensorProto as TP
import onnx.reference.ops.op_matmul as op_matmul
from onnx_import.normalize import normalize
rng = np.random.default_rng(5)
w1, w2, w3 = (rng.standard_normal(s).astype(np.float32) for s in ((8, 6), (6, 4), (4, 5)))
nodes = [helper.make_node("MatMul", ["w1", "w2"], ["w12"]),  # a constant: folded
         helper.make_node("MatMul", ["x", "w12"], ["h"]),     # of the input: shape only
         helper.make_node("Gemm", ["h", "w3"], ["y"])]
g = helper.make_graph(nodes, "products", [helper.make_tensor_value_info("x", TP.FLOAT, ["B", 8])],
                      [helper.make_tensor_value_info("y", TP.FLOAT, ["B", 5])],
                      [numpy_helper.from_array(w, n) for w, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))])
path = os.path.join(tempfile.mkdtemp(), "products.onnx")
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), path)
calls, real = [], op_matmul.numpy_matmul
op_matmul.numpy_matmul = lambda a, b: calls.append((a.shape, b.shape)) or real(a, b)
nm = normalize(path, {})
assert calls == [((8, 6), (6, 4))] * 2, calls  # the constant at both probe batches, nothing else
assert np.array_equal(nm.const["w12"], w1 @ w2)
assert nm.shape["h"] == (3, 4) and nm.shape["y"] == (3, 5) and nm.bdim["y"] == 0, (nm.shape, nm.bdim)
PY
    fail "import computes products of constants, not of inputs"
expect_error "onnxruntime fusion" "ONNX node 'the_fusion' (op FastGelu): not a standard ONNX op (domain 'com.microsoft'), so it cannot be folded or lowered: export with standard ops only" "$TMP/foreign_op.onnx" --world-size 2
expect_error "missing file" "nope.onnx: cannot read" "$TMP/nope.onnx" --world-size 2
expect_error "--dim of no input" "--dim nosuch: no input has a dynamic dim of that name" "$TMP/mlp.onnx" --world-size 1 --dim nosuch=4
expect_error "dim not divisible" "weight '0.weight' [256, 64]: dim 0 (256) is not divisible by world size 3: replicate it with a --plan file holding {\"0.weight\": \"replicate\"}" "$TMP/mlp.onnx" --world-size 3
echo '{"*": "sideways"}' >"$TMP/badmode.json"
expect_error "bad plan mode" "'*': mode 'sideways' is not one of colwise, rowwise, replicate, vocab_parallel" "$TMP/mlp.onnx" --world-size 2 --plan "$TMP/badmode.json"
echo '{"0.weight": "rowwise"}' >"$TMP/rowwise.json"
expect_error "rowwise weight on a replicated input" "weight '0.weight' is rowwise but its input 'x' is not split on the contraction dim: make it colwise or replicate" "$TMP/mlp.onnx" --world-size 2 --plan "$TMP/rowwise.json"
echo '{"nothing*": "replicate"}' >"$TMP/nomatch.json"
expect_error "plan glob matching nothing" "pattern 'nothing*' matches no weight" "$TMP/mlp.onnx" --world-size 2 --plan "$TMP/nomatch.json"
echo '{"*": "replicate"' >"$TMP/badjson.json"
expect_error "plan with bad JSON" "bad JSON at line 2" "$TMP/mlp.onnx" --world-size 2 --plan "$TMP/badjson.json"
# A request id outside index_ops' gather table (5 rows: ids in [-5, 5)):
# the run fails with one line naming the id, on threads and on processes.
$PYTHON - "$ROOT/graphs" "$TMP/index_ops.in3.safetensors" "$TMP/bad_ids.safetensors" <<'PY' || fail "bad ids: writing the request"
import sys
sys.path.insert(0, sys.argv[1])
from gen_examples import load_safetensors, save_safetensors
t = load_safetensors(sys.argv[2])
st, ids = t["idx"]
ids = ids.copy()
ids[1, 2] = 9
t["idx"] = (st, ids)
save_safetensors(sys.argv[3], t)
PY
for r in threads processes; do
    "$TPSERVE" run "$TMP/index_ops_tp2.json" --inputs "$TMP/bad_ids.safetensors" --output "$TMP/bad.out" \
        --backend cpu --ranks $r >/dev/null 2>"$TMP/err"
    rc=$?
    if [ $rc = 1 ] && grep -qF "gather: id 9 (position 6) is outside [-5, 5)" "$TMP/err"; then
        pass "request id out of the gather table ($r): $(grep -F 'gather' "$TMP/err" | head -1)"
    else
        fail "request id out of the gather table ($r): exit $rc: $(cat "$TMP/err")"
    fi
done

# --out: a missing directory is created; a path through a file is one line.
$IMPORT "$TMP/mlp.onnx" --world-size 2 --out "$TMP/new/dir/mlp.json" 2>"$TMP/err" && [ -s "$TMP/new/dir/mlp.safetensors" ] &&
    pass "--out into a missing directory: created" || fail "--out into a missing directory: $(cat "$TMP/err")"
$IMPORT "$TMP/mlp.onnx" --world-size 2 --out "$TMP/mlp.onnx/g.json" 2>"$TMP/err"
rc=$?
[ $rc = 1 ] && [ "$(wc -l <"$TMP/err")" = 1 ] && grep -qF -- "--out $TMP/mlp.onnx/g.json: $TMP/mlp.onnx is not a directory" "$TMP/err" &&
    pass "error: --out through a file: $(cat "$TMP/err")" || fail "error: --out through a file: exit $rc: $(cat "$TMP/err")"

# --dim makes the two-dynamic model importable; it then runs like any other.
if $IMPORT "$TMP/two_dynamic.onnx" --world-size 2 --dim seq=8 --out "$TMP/two_dynamic_tp2.json" 2>"$TMP/err" &&
    $REFERENCE "$TMP/two_dynamic.onnx" --batch 3 --dim seq=8 \
        --inputs "$TMP/two_dynamic.in3.safetensors" --ref "$TMP/two_dynamic.ref3.safetensors"; then
    run_check two_dynamic_tp2 two_dynamic 3 threads
else
    fail "--dim seq=8: $(cat "$TMP/err")"
fi

# ---- served over HTTP: INT64 input_ids as JSON and as binary ---------------------
G=gpt2_tp2
cat >"$TMP/manifest.json" <<EOF
{"graphs": [{"name": "$G", "json": "$G.json", "inputs": "gpt2.in3.safetensors",
             "ref": "gpt2.ref3.safetensors", "world_size": 2, "dtype": "FP32", "rtol": $RTOL}]}
EOF
if start http --graph "$TMP/$G.json" --backend cpu --ranks processes; then
    $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TMP" --graph $G >"$TMP/h1" 2>&1 &&
        pass "HTTP $G: JSON input_ids, logits match onnxruntime" || fail "HTTP JSON: $(tail -3 "$TMP/h1")"
    $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TMP" --graph $G --binary --binary-out >"$TMP/h2" 2>&1 &&
        pass "HTTP $G: binary input_ids and logits match onnxruntime" || fail "HTTP binary: $(tail -3 "$TMP/h2")"
    curl -s "$URL/v2/models/$G" | grep -qF '"inputs":[{"name":"input_ids","datatype":"INT64","shape":[-1,16]}]' &&
        pass "HTTP $G metadata: INT64 input_ids [-1, 16]" || fail "HTTP metadata: $(curl -s "$URL/v2/models/$G")"
fi

echo "test_onnx: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
