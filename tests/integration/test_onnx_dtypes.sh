#!/bin/sh
# test_onnx_dtypes.sh — FP16 and BF16 ONNX exports (tests/onnx/*_fp16.onnx,
# *_bf16.onnx) imported with their dtype kept: every float param stored F16 /
# BF16 in the safetensors (no upcast), no cast node left in the graph (the
# Casts FP16 exports put around norms and softmax fold into the fused ops),
# the fused ops of the FP32 import; then imported at world sizes 1, 2 and 4
# (where the heads divide), run with `tpserve run` at batch 1 and 3 with
# ranks as threads and as processes, and compared with onnxruntime:
#   - FP16 models: onnxruntime's output for the model itself;
#   - BF16 models: onnxruntime's output for the FP32 twin (the same
#     BF16-rounded weights, *_bf16_f32.onnx; onnxruntime's CPU provider has
#     no BF16 kernels), rounded to BF16 (tests/onnx/reference.py --twin).
# Also: gpt2_fp16 and bert_bf16 with --sequence-parallel; hand-built FP16
# models with Casts around a LayerNormalization and a Softmax; a BF16 model
# whose folded constants are reductions (accumulated in FP32 at import).
#
# env: TPSERVE (binary), PYTHON (python3 with numpy, ml_dtypes, onnx,
#      onnxruntime); KEEP_TMP=1 keeps the files.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_onnx_dtypes.XXXXXX")
ONNX_MODULES=ml_dtypes
. "$HERE/lib/server.sh"
. "$HERE/lib/onnx.sh"

# Tolerances (compare.py's max|out - ref| / max|ref|). Our kernels widen
# FP16/BF16 to FP32, accumulate in FP32 and round once per op on store;
# every op's rounding compounds through the two layers.
# FP16 (11-bit significand: unit roundoff 2^-11 = 4.9e-4) against
# onnxruntime's FP16 run, which rounds at other points (its FP16 kernels, or
# FP32 ones between the Casts it inserts): measured up to 2.8e-3 (Llama).
RTOL_FP16=1e-2
# BF16 (8-bit significand: unit roundoff 2^-8 = 3.9e-3) against FP32
# compute with the same weights, rounded to BF16 once: measured up to 7.3e-3.
RTOL_BF16=3e-2


# model:reference (the model itself, or its FP32 twin):tolerance:world sizes
# (Llama's 2 KV heads do not divide by 4)
MODELS="gpt2_fp16:-:$RTOL_FP16:1 2 4
bert_fp16:-:$RTOL_FP16:1 2 4
llama_fp16:-:$RTOL_FP16:1 2
llama_fp16_legacy:-:$RTOL_FP16:1 2
gpt2_bf16:gpt2_bf16_f32:$RTOL_BF16:1 2 4
bert_bf16:bert_bf16_f32:$RTOL_BF16:1 2 4"

# reference MODEL TWIN BATCH
reference() {
    twin_arg=""
    [ "$2" = - ] || twin_arg="--twin $FIX/$2.onnx"
    # shellcheck disable=SC2086 # $twin_arg: zero or two words
    $PYTHON "$FIX/reference.py" "$FIX/$1.onnx" --batch "$3" $twin_arg \
        --inputs "$TMP/$1.in$3.safetensors" --ref "$TMP/$1.ref$3.safetensors"
}

# check_graph GRAPH DATATYPE: the params and the weights file keep the
# dtype, no cast node, and the fused ops of the FP32 export.
check_graph() {
    $PYTHON - "$TMP/$1.json" "$2" "$HERE" <<'PY'
import collections, json, os, sys
sys.path.insert(0, sys.argv[3])
import compare
path, dt = sys.argv[1], sys.argv[2]
g = json.load(open(path))
st = {"FP16": "F16", "BF16": "BF16"}[dt]
floats = [p for p in g["params"] if p["datatype"] in ("FP32", "FP16", "BF16")]
bad = [(p["name"], p["datatype"]) for p in floats if p["datatype"] != dt]
assert floats and not bad, "params not %s: %s" % (dt, bad[:4])
tensors = compare.load(os.path.join(os.path.dirname(path), g["weights"]))
bad = [(k, s) for k, (s, _) in tensors.items() if s not in (st, "I32", "I64")]
assert not bad, "weights file tensors not %s: %s" % (st, bad[:4])
assert all(i["datatype"] == "INT64" for i in g["inputs"]), g["inputs"]
ops = collections.Counter(n["op"] for n in g["nodes"])
assert "cast" not in ops, "cast nodes: %d" % ops["cast"]
want = {"gpt2": {"attention": 2, "layer_norm": 5, "gelu": 2}, "bert": {"attention": 2, "layer_norm": 5, "gelu": 2},
        "llama": {"attention": 2, "rms_norm": 5, "silu": 2}}[os.path.basename(path).split("_")[0]]
got = {op: ops[op] for op in want}
assert got == want, "fused ops %s, want %s" % (got, want)
PY
}

# Under a sanitizer (make asan) batch 3 only, as in test_onnx.sh: the
# importer is the same Python in both runs; ASan checks tpserve's FP16/BF16
# kernels, which batch 3 runs as batch 1 does.
RUN_BATCHES="1 3"
[ -n "${TP_SANITIZED:-}" ] && RUN_BATCHES=3
while IFS=: read -r m twin rtol sizes <&3; do
    dt=FP16
    case $m in *bf16*) dt=BF16 ;; esac
    reference "$m" "$twin" 1 && reference "$m" "$twin" 3 || { fail "$m: onnxruntime reference"; continue; }
    # under a sanitizer world size 2 alone: its kernels are those of 1 and 4
    [ -n "${TP_SANITIZED:-}" ] && sizes=2
    for ws in $sizes; do
        g=${m}_tp$ws
        if ! $IMPORT "$FIX/$m.onnx" --world-size "$ws" --out "$TMP/$g.json" 2>"$TMP/err"; then
            fail "import $g: $(tail -1 "$TMP/err")"
            continue
        fi
        check_graph "$g" $dt >"$TMP/chk" 2>&1 && pass "$g: params and weights $dt, no cast, fused ops kept" ||
            fail "$g: $(tail -1 "$TMP/chk")"
        for b in $RUN_BATCHES; do run_check "$g" "$m" $b threads "$rtol"; done
        # processes at batch 3 when there are several ranks (as test_onnx.sh)
        [ "$ws" = 1 ] || run_check "$g" "$m" 3 processes "$rtol"
    done
done 3<<EOF
$MODELS
EOF

# ---- --sequence-parallel: reduce_scatter/all_gather in FP16/BF16, fused by fuse_tp
for spec in gpt2_fp16:$RTOL_FP16 bert_bf16:$RTOL_BF16; do
    m=${spec%%:*}
    g=${m}_sp2
    if $IMPORT "$FIX/$m.onnx" --world-size 2 --sequence-parallel --out "$TMP/$g.json" 2>"$TMP/err"; then
        run_check "$g" "$m" 3 threads "${spec#*:}"
        run_check "$g" "$m" 1 processes "${spec#*:}"
    else
        fail "import $g: $(tail -1 "$TMP/err")"
    fi
done

# ---- Casts around a LayerNormalization and a Softmax, a round-trip Cast pair --
# An FP16 model computing them in FP32 between Casts (as float16 converters
# that keep norms in FP32 do): the op in FP16 when the FP32 norm params
# (weight and bias) are exact in FP16 (casts_exact), the Casts kept when
# they are not (casts_inexact); the pair FP16 -> FP32 -> FP16 is no node.
$PYTHON - "$TMP" <<'PY' || fail "casts: writing the models"
import sys
import numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as TP
rng = np.random.default_rng(3)
for name, w in (("casts_exact", rng.standard_normal(64).astype(np.float16).astype(np.float32)),
                ("casts_inexact", rng.standard_normal(64).astype(np.float32))):
    nodes = [helper.make_node("Cast", ["x"], ["xf"], to=TP.FLOAT),
             helper.make_node("LayerNormalization", ["xf", "w", "b"], ["yf"], epsilon=1e-5),
             helper.make_node("Cast", ["yf"], ["y"], to=TP.FLOAT16),
             helper.make_node("Cast", ["x"], ["x32"], to=TP.FLOAT), helper.make_node("Softmax", ["x32"], ["s32"]),
             helper.make_node("Cast", ["s32"], ["s"], to=TP.FLOAT16), helper.make_node("Add", ["y", "s"], ["z0"]),
             helper.make_node("Cast", ["z0"], ["z1"], to=TP.FLOAT), helper.make_node("Cast", ["z1"], ["z"], to=TP.FLOAT16)]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.linspace(-1, 1, 64).astype(np.float16).astype(np.float32), "b")]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", TP.FLOAT16, ["B", 64])],
                          [helper.make_tensor_value_info("z", TP.FLOAT16, ["B", 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), "%s/%s.onnx" % (sys.argv[1], name))
PY
for m in casts_exact casts_inexact; do
    if ! $IMPORT "$TMP/$m.onnx" --world-size 1 --out "$TMP/$m.json" 2>"$TMP/err" ||
        ! $PYTHON "$FIX/reference.py" "$TMP/$m.onnx" --batch 3 --inputs "$TMP/$m.in3.safetensors" --ref "$TMP/$m.ref3.safetensors"; then
        fail "$m: $(tail -1 "$TMP/err")"
        continue
    fi
    $PYTHON - "$TMP/$m.json" <<'PY' && pass "$m: $(cat "$TMP/ops")" || fail "$m: $(cat "$TMP/ops")"
import json, os, sys
g = json.load(open(sys.argv[1]))
ops = " ".join("%s%s" % (n["op"], "(%s)" % n["attrs"]["to"] if n["op"] == "cast" else "") for n in g["nodes"])
dts = sorted({p["datatype"] for p in g["params"]})
open(os.path.join(os.path.dirname(sys.argv[1]), "ops"), "w").write("%s; params %s" % (ops, " ".join(dts)))
want = {"casts_exact": ("layer_norm softmax add", ["FP16"]),
        "casts_inexact": ("cast(FP32) layer_norm cast(FP16) softmax add", ["FP32"])}[g["name"]]
assert (ops, dts) == want, (ops, dts)
PY
    run_check "$m" "$m" 3 threads "$RTOL_FP16"
done

# ---- folding in BF16: reductions of constants accumulate in FP32 ------------
# y = x * ReduceMean(c) + ReduceSum(d), c 4096 values near 1 and d 1000 near
# 0.01 (BF16 initializers), folded at import. Accumulated in BF16, as onnx's
# reference evaluator does, they would be 0.0625 (stuck at 256 / 4096) and 4
# (stuck where the BF16 step passes 0.02); narrow_eval.py accumulates in FP32.
# Reference: the FP32 twin holding the same BF16-exact values.
$PYTHON - "$TMP" <<'PY' || fail "folded_bf16: writing the models"
import sys
import ml_dtypes, numpy as np, onnx
from onnx import helper, numpy_helper, TensorProto as TP
rng = np.random.default_rng(7)
c = (1 + 0.01 * rng.standard_normal(4096)).astype(ml_dtypes.bfloat16)
d = (0.01 + 0.001 * rng.standard_normal(1000)).astype(ml_dtypes.bfloat16)
for name, et, dt in (("folded_bf16", TP.BFLOAT16, ml_dtypes.bfloat16), ("folded_bf16_f32", TP.FLOAT, np.float32)):
    nodes = [helper.make_node("ReduceMean", ["c", "ax"], ["m"]), helper.make_node("ReduceSum", ["d", "ax"], ["s"]),
             helper.make_node("Mul", ["x", "m"], ["xm"]), helper.make_node("Add", ["xm", "s"], ["y"])]
    inits = [numpy_helper.from_array(c.astype(dt), "c"), numpy_helper.from_array(d.astype(dt), "d"),
             numpy_helper.from_array(np.array([0], np.int64), "ax")]
    g = helper.make_graph(nodes, name, [helper.make_tensor_value_info("x", et, ["B", 64])],
                          [helper.make_tensor_value_info("y", et, ["B", 64])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]), "%s/%s.onnx" % (sys.argv[1], name))
PY
if $IMPORT "$TMP/folded_bf16.onnx" --world-size 2 --out "$TMP/folded_bf16_tp2.json" 2>"$TMP/err" &&
    $PYTHON "$FIX/reference.py" "$TMP/folded_bf16.onnx" --twin "$TMP/folded_bf16_f32.onnx" --batch 3 \
        --inputs "$TMP/folded_bf16.in3.safetensors" --ref "$TMP/folded_bf16.ref3.safetensors"; then
    run_check folded_bf16_tp2 folded_bf16 3 threads "$RTOL_BF16"
else
    fail "folded_bf16: $(tail -1 "$TMP/err")"
fi

# ---- FP16/BF16 products in the import's evaluator run in FP32 --------------
# NumPy's float16 matmul has no BLAS: evaluating an FP16 GPT-2 small at the
# probe batches took 9 minutes (10 s in FP32). fold_in_fp32 widens MatMul
# and Gemm like the reductions: each node's own code must see FP32 inputs
# and the node still gives the narrow dtype, with the FP32 result rounded once.
$PYTHON - "$ROOT/graphs" <<'PY' && pass "narrow products evaluated in FP32" || fail "narrow products evaluated in FP32"
import sys
sys.path.insert(0, sys.argv[1])
import ml_dtypes, numpy as np
from onnx import helper, TensorProto as TP
from onnx.reference import ReferenceEvaluator
from onnx_import.narrow_eval import fold_in_fp32
rng = np.random.default_rng(3)
for et, dt in ((TP.FLOAT16, np.float16), (TP.BFLOAT16, ml_dtypes.bfloat16)):
    nodes = [helper.make_node("MatMul", ["a", "b"], ["p"]), helper.make_node("Gemm", ["a", "b", "c"], ["q"])]
    vi = lambda n, s: helper.make_tensor_value_info(n, et, s)
    g = helper.make_graph(nodes, "products", [vi("a", [4, 300]), vi("b", [300, 5]), vi("c", [5])],
                          [vi("p", [4, 5]), vi("q", [4, 5])])
    ev = ReferenceEvaluator(helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]))
    seen = []
    for node in ev.rt_nodes_:
        def spy(*args, _run=node._run, _op=node.op_type, **kw):
            seen.append((_op, {np.asarray(x).dtype for x in args if x is not None}))
            return _run(*args, **kw)
        node._run = spy
    fold_in_fp32(ev)
    a, b, c = (rng.standard_normal(s).astype(dt) for s in ((4, 300), (300, 5), (5,)))
    p, q = ev.run(None, {"a": a, "b": b, "c": c})
    want = a.astype(np.float32) @ b.astype(np.float32)
    assert sorted(op for op, _ in seen) == ["Gemm", "MatMul"], seen
    assert all(d == {np.dtype(np.float32)} for _, d in seen), seen
    assert p.dtype == dt and q.dtype == dt, (p.dtype, q.dtype)
    assert np.array_equal(p, want.astype(dt)), "MatMul not the FP32 product rounded once"
    assert np.array_equal(q, (want + c.astype(np.float32)).astype(dt)), "Gemm not the FP32 result rounded once"
PY

echo "test_onnx_dtypes: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
