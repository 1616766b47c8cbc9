#!/bin/sh
# test_onnx_mask.sh — attention_mask as an input, end to end: the
# Optimum-style fixtures tests/onnx/bert_mask.onnx (input_ids,
# attention_mask, token_type_ids) and gpt2_mask.onnx (input_ids,
# attention_mask), and legacy_mask (BERT's (1 - mask) * finfo.min, built
# here), imported at world sizes 1, 2 and 4 (legacy_mask, 2 heads: 1 and 2) —
# the mask subgraph of
# every layer becomes the attention op's key-padding input, the graph input
# stays attention_mask INT64 — then run with `tpserve run` (ranks as threads
# and as processes) on batches whose rows have different padding, and served
# over HTTP once. Compared with onnxruntime on the real (unpadded) positions
# only: what a padded position computes is not part of the contract.
#
# Rows of a batch (1 = token, 0 = padding), batch 3: full, trailing padding
# after 11 tokens, after 5 (BERT) or left padding of 6 (GPT-2: with causal
# attention and trailing padding no real query sees a padded key, so a left
# padded row is what tests the mask there); batch 4 adds a fully padded row
# (a query that sees no key: zeros in tpserve, nothing compared).
#
# env: TPSERVE (binary), PYTHON (python3 with numpy, onnx, onnxruntime);
#      KEEP_TMP=1 keeps the files.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_onnx_mask.XXXXXX")
. "$HERE/lib/server.sh"
. "$HERE/lib/onnx.sh"
# FP32 against onnxruntime's FP32, the metric of compare.py (graphs/README.md):
# the same tolerance test_onnx.sh uses for these architectures unmasked.
RTOL=1e-4


# masked.py request MODEL ROWS IN REF: a random request whose attention_mask
# rows are ROWS (comma-separated: N = N tokens then padding, -N = N padding
# then tokens) and onnxruntime's outputs for it. Fails when the mask does not
# change the compared outputs (the check would then prove nothing).
# masked.py legacy OUT.onnx [FILL]: BERT's legacy mask arithmetic by hand (no
# fixture exports it any more: transformers 5 builds the SDPA mask even under
# TorchScript): one attention layer over x [B, 16, 16] (2 heads of 8) whose
# scores get (1 - Cast(Unsqueeze(attention_mask))) * FILL (finfo(float32).min).
# masked.py compare OUT REF IN: compare.py's metric over the positions whose
# attention_mask is 1 (outputs are [B, S, ...]).
# masked.py http URL GRAPH IN REF: the request over KServe v2 JSON, compared so.
cat >"$TMP/masked.py" <<'PY'
import json, os, sys, urllib.request
import numpy as np
sys.path.insert(0, sys.argv[-1])
sys.path.insert(0, os.path.join(sys.argv[-1], "..", "integration"))
import onnx
from reference import make_feeds, run_reference, save_safetensors, NP_ST
from compare import load

RTOL = float(os.environ["RTOL"])

def rows_mask(spec, s):
    rows = [int(r) for r in spec.split(",")]
    m = np.zeros((len(rows), s), np.int64)
    for b, n in enumerate(rows):
        if n >= 0:
            m[b, :n] = 1
        else:
            m[b, -n:] = 1
    return m

def err(out, ref, mask):
    keep = mask.astype(bool)
    o, r = out[keep].astype(np.float64), ref[keep].astype(np.float64)
    return float(np.max(np.abs(o - r)) / max(np.max(np.abs(r)), 1e-6))

def masks(path):
    return {k: v for k, (_, v) in load(path).items()}

cmd = sys.argv[1]
if cmd == "request":
    model_path, spec, inp, refp = sys.argv[2:6]
    model = onnx.load(model_path)
    mask = rows_mask(spec, 16)
    feeds = make_feeds(model, mask.shape[0], {}, 1)
    feeds["attention_mask"] = mask
    outs = run_reference(model_path, feeds)[0]
    ones = dict(feeds, attention_mask=np.ones_like(mask))
    unmasked = run_reference(model_path, ones)[0]
    for k, v in outs.items():
        e = err(unmasked[k], v, mask)
        if not e > 100 * RTOL:
            sys.exit("%s: the mask changes the real positions by only %.3g: no test" % (k, e))
    save_safetensors(inp, {k: (NP_ST[v.dtype], v) for k, v in feeds.items()})
    save_safetensors(refp, {k: (NP_ST[v.dtype], v) for k, v in outs.items()})
elif cmd == "legacy":
    from onnx import TensorProto, helper, numpy_helper
    c = lambda name, v: numpy_helper.from_array(np.asarray(v), name)
    nodes = [
        helper.make_node("Reshape", ["x", "heads"], ["xh"]),
        helper.make_node("Transpose", ["xh"], ["q"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["q"], ["kT"], perm=[0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "kT"], ["qk"]),
        helper.make_node("Mul", ["qk", "scale"], ["scores"]),
        helper.make_node("Unsqueeze", ["attention_mask", "axes12"], ["ext"]),
        helper.make_node("Cast", ["ext"], ["extf"], to=TensorProto.FLOAT),
        helper.make_node("Sub", ["one", "extf"], ["inv"]),
        helper.make_node("Mul", ["inv", "fmin"], ["bias"]),
        helper.make_node("Add", ["scores", "bias"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "q"], ["o"]),
        helper.make_node("Transpose", ["o"], ["ot"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ot", "flat"], ["y"]),
    ]
    inits = [c("heads", np.array([-1, 16, 2, 8], np.int64)), c("flat", np.array([-1, 16, 16], np.int64)),
             c("scale", np.float32(8 ** -0.5)), c("axes12", np.array([1, 2], np.int64)), c("one", np.float32(1)),
             c("fmin", np.float32(sys.argv[3]) if len(sys.argv) > 4 else np.finfo(np.float32).min)]
    g = helper.make_graph(nodes, "legacy_mask",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 16]),
                           helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16, 16])], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), sys.argv[2])
elif cmd == "compare":
    out, ref, req = (masks(p) for p in sys.argv[2:5])
    worst = 0.0
    for k, r in ref.items():
        e = err(out[k], r, req["attention_mask"])
        assert out[k].shape == r.shape, (k, out[k].shape, r.shape)
        assert np.isfinite(out[k]).all(), "%s: NaN/Inf, padded positions included" % k
        worst = max(worst, e)
    print("err=%.3g" % worst)
    sys.exit(0 if worst <= RTOL else 1)
elif cmd == "http":
    url, graph, inp, refp = sys.argv[2:6]
    req = masks(inp)
    body = {"inputs": [{"name": k, "datatype": "INT64", "shape": list(v.shape), "data": v.reshape(-1).tolist()}
                       for k, v in req.items()]}
    r = urllib.request.urlopen(urllib.request.Request(url + "/v2/models/%s/infer" % graph, json.dumps(body).encode(),
                                                      {"Content-Type": "application/json"}), timeout=60)
    got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in json.load(r)["outputs"]}
    worst = max(err(got[k], v, req["attention_mask"]) for k, v in masks(refp).items())
    print("err=%.3g" % worst)
    sys.exit(0 if worst <= RTOL else 1)
PY
masked() { RTOL=$RTOL $PYTHON "$TMP/masked.py" "$@" "$FIX"; }

# run_check GRAPH REQ RANKS: tpserve run vs the reference on real positions.
run_check() {
    if "$TPSERVE" run "$TMP/$1.json" --inputs "$TMP/$2.in.safetensors" --output "$TMP/$1.out" \
        --backend cpu --ranks "$3" >"$TMP/run.log" 2>&1 &&
        masked compare "$TMP/$1.out" "$TMP/$2.ref.safetensors" "$TMP/$2.in.safetensors" >"$TMP/cmp" 2>&1; then
        pass "$1 $2 ranks $3: $(cat "$TMP/cmp") vs onnxruntime on the real positions"
    else
        fail "$1 $2 ranks $3: $(cat "$TMP/run.log" "$TMP/cmp" 2>/dev/null | tail -3)"
    fi
}

masked legacy "$TMP/legacy_mask.onnx" || fail "legacy_mask.onnx"
for m in bert_mask gpt2_mask legacy_mask; do
    src=$FIX/$m.onnx
    [ $m = legacy_mask ] && src=$TMP/$m.onnx
    if [ $m = gpt2_mask ]; then rows3=16,11,-6; else rows3=16,11,5; fi
    masked request "$src" "$rows3" "$TMP/$m.b3.in.safetensors" "$TMP/$m.b3.ref.safetensors" 2>"$TMP/err" &&
        masked request "$src" "$rows3,0" "$TMP/$m.b4.in.safetensors" "$TMP/$m.b4.ref.safetensors" 2>>"$TMP/err" ||
        { fail "$m: onnxruntime reference: $(tail -2 "$TMP/err")"; continue; }
    sizes="1 2 4"
    [ -n "${TP_SANITIZED:-}" ] && sizes=2 # under a sanitizer: the mask kernels of 1 and 4 ranks are those of 2
    for ws in $sizes; do
        [ $ws = 4 ] && [ $m = legacy_mask ] && continue # 2 heads
        g=${m}_tp$ws
        $IMPORT "$src" --world-size $ws --out "$TMP/$g.json" 2>"$TMP/err" ||
            { fail "import $g: $(cat "$TMP/err")"; continue; }
        # every attention takes attention_mask (replicated) as its 4th input;
        # nothing of the exporter's mask arithmetic is left in the graph
        $PYTHON - "$TMP/$g.json" <<'PY' && pass "$g: attention_mask INT64 [B, 16], replicated, the key-padding input of every attention" || fail "$g: graph structure"
import json, sys
g = json.load(open(sys.argv[1]))
mi = [i for i in g["inputs"] if i["name"] == "attention_mask"]
assert mi == [{"name": "attention_mask", "datatype": "INT64", "shape": ["B", 16], "placement": "replicate"}], mi
att = [n for n in g["nodes"] if n["op"] == "attention"]
assert len(att) == (1 if "legacy" in g["name"] else 2) and all(len(n["inputs"]) == 4 and n["inputs"][3] == "attention_mask" for n in att), att
assert [n for n in g["nodes"] if "attention_mask" in n["inputs"]] == att
assert all(n["attrs"]["causal"] == ("gpt2" in g["name"]) for n in att), att
assert not any(n["op"] in ("where", "cast", "sub", "mul", "add") for n in g["nodes"] if "legacy" in g["name"]), g["nodes"]
assert not any(n["op"] in ("where", "cast") for n in g["nodes"]), [n["op"] for n in g["nodes"]]
PY
        # ranks as processes for the padded batch of 4 when there are
        # several: the transport carries the mask as any input
        for b in b3 b4; do run_check "$g" "$m.$b" threads; done
        [ $ws = 1 ] || run_check "$g" "$m.b4" processes
    done
done

# A mask that only lowers padded scores (by 1, not to -inf) is not a key-padding
# mask: it must not become the attention op's mask input.
masked legacy "$TMP/soft_mask.onnx" -1 || fail "soft_mask.onnx"
if $IMPORT "$TMP/soft_mask.onnx" --world-size 1 --out "$TMP/soft_mask.json" 2>"$TMP/err"; then
    $PYTHON -c "
import json, sys
g = json.load(open(sys.argv[1]))
assert not any(n['op'] == 'attention' and len(n['inputs']) == 4 for n in g['nodes']), g['nodes']
" "$TMP/soft_mask.json" && pass "soft_mask: (1 - mask) * -1 stays arithmetic, no key-padding input" ||
        fail "soft_mask: taken for a key-padding mask"
    masked request "$TMP/soft_mask.onnx" 16,11,5 "$TMP/soft_mask.b3.in.safetensors" "$TMP/soft_mask.b3.ref.safetensors" &&
        run_check soft_mask soft_mask.b3 threads
else
    pass "soft_mask: (1 - mask) * -1 is no key-padding mask: $(tail -1 "$TMP/err")"
fi

# ---- served over HTTP: one padded batch as KServe v2 JSON ------------------------
# The mask keeps batch rows apart, so the plan pads batches into buckets: the
# batch of 3 runs in the bucket of 4, its 4th row all padding.
G=bert_mask_tp2
"$TPSERVE" plan "$TMP/$G.json" --batch 3 >"$TMP/plan" 2>&1 && grep -q "batch 4, .*batching: padded into buckets" "$TMP/plan" &&
    pass "$G: batch 3 padded into the bucket of 4" || fail "$G plan: $(head -3 "$TMP/plan")"
if [ -f "$TMP/$G.json" ] && start http --graph "$TMP/$G.json" --backend cpu --ranks processes; then
    masked http "$URL" $G "$TMP/bert_mask.b3.in.safetensors" "$TMP/bert_mask.b3.ref.safetensors" >"$TMP/h1" 2>&1 &&
        pass "HTTP $G: padded batch 3, $(cat "$TMP/h1") vs onnxruntime on the real positions" ||
        fail "HTTP $G: $(tail -3 "$TMP/h1")"
    curl -s "$URL/v2/models/$G" | grep -qF '{"name":"attention_mask","datatype":"INT64","shape":[-1,16]}' &&
        pass "HTTP $G metadata: INT64 attention_mask [-1, 16]" || fail "HTTP metadata: $(curl -s "$URL/v2/models/$G")"
fi

echo "test_onnx_mask: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
