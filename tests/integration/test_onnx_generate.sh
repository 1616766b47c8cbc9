#!/bin/sh
# test_onnx_generate.sh — `import_onnx.py --generate` end to end: the
# causal-LM fixtures tests/onnx/gpt2_gen.onnx (learned positions, vocab 251
# padded at 2 and 4 ranks) and llama_gen.onnx (RoPE, GQA 8 heads / 4 KV
# heads), exported by tests/onnx/export_generate.py with transformers'
# greedy tokens beside them (NAME.tokens.json: 3 prompts x 24 tokens),
# imported at world sizes 1, 2 and 4 — each import's own self-check (4
# greedy tokens of the written graph in NumPy against onnxruntime's loop)
# passing — then:
# - the graph's structure: inputs input_ids [B, 1], position_ids [B],
#   cache_slot [B], logit_rows [B]; next_token the one output; one
#   kv_attention per layer over two states split on the KV heads; the LM
#   head a matmul_rows over logit_rows; the argmax chain; no logits out;
# - the NumPy SPMD evaluation of each written graph (graphs/gen_examples.py,
#   the engine's FP32 arithmetic emulated) generates transformers' 24
#   reference tokens for every prompt (all prompts prefilled in one step,
#   only their last rows wanting logits, then decoded together);
# - `tpserve run` of each graph (ranks as threads and as processes) on the
#   rows of every prompt and its reference continuation, as prefills and as
#   one decode step per position with the caches persisting between steps:
#   logit_rows wants the rows from each prompt's last on, whose next_token
#   is transformers' next token; the earlier rows skip the head (id 0);
# - the refusals, one line, nothing written: a non-causal export
#   (bert_gen.onnx), a fixed sequence dim (bert.onnx), an attention_mask
#   input (gpt2_mask.onnx), --max-seq-len above the position limit (the
#   metadata's, or without it GPT-2's position table's rows), no limit
#   known (RoPE without metadata);
# - --sequence-parallel: the same files as without it, and a note why.
#
# Served through /generate and /generate_stream, the same imports are
# checked by test_generate_http.sh.
#
# env: TPSERVE (binary), PYTHON (python3 with numpy, onnx, onnxruntime);
#      KEEP_TMP=1 keeps the files.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_onnx_gen.XXXXXX")
. "$HERE/lib/server.sh"
. "$HERE/lib/onnx.sh"

# ---- imports at 1, 2 and 4 ranks, with their self-check -----------------------
for m in gpt2_gen llama_gen; do
    for ws in 1 2 4; do
        g=${m}_tp$ws
        if $IMPORT "$FIX/$m.onnx" --world-size $ws --generate --out "$TMP/$g.json" 2>"$TMP/err"; then
            pass "import $g --generate (self-check: greedy tokens equal onnxruntime's)"
        else
            fail "import $g --generate: $(cat "$TMP/err")"
        fi
    done
done

# ---- structure -----------------------------------------------------------------
$PYTHON - "$TMP" <<'PY' && pass "generation graphs: token-row inputs, kv_attention over KV-head-split states, matmul_rows head (fallback), argmax chain" ||
import json, os, sys
for m, heads_kv, dim, vocab in (("gpt2_gen", 4, 16, 251), ("llama_gen", 4, 8, 256)):
    for ws in (1, 2, 4):
        g = json.load(open(os.path.join(sys.argv[1], "%s_tp%d.json" % (m, ws))))
        ins = {i["name"]: (i["datatype"], i["shape"]) for i in g["inputs"]}
        assert ins == {"input_ids": ("INT64", ["B", 1]), "position_ids": ("INT64", ["B"]),
                       "cache_slot": ("INT64", ["B"]), "logit_rows": ("INT64", ["B"])}, ins
        assert [o["name"] for o in g["outputs"]] == ["next_token"], g["outputs"]
        assert g["generate"] == {"input_ids": "input_ids", "positions": "position_ids", "slots": "cache_slot",
                                 "next_token": "next_token", "max_seq_len": 64, "vocab_size": vocab,
                                 "logit_rows": "logit_rows"}, g["generate"]
        # the LM head: the one matmul_rows, over logit_rows, which the argmax reads (through views),
        # and the one fallback node (eager: the cuda backend multiplies only the wanted rows)
        nodes = {n["name"]: n for n in g["nodes"]}
        head = [n for n in g["nodes"] if n["op"] == "matmul_rows"]
        assert len(head) == 1 and head[0]["inputs"][2] == "logit_rows", head
        assert [n["name"] for n in g["nodes"] if n.get("fallback")] == [head[0]["name"]], head
        v = next(n for n in g["nodes"] if n["op"] == "argmax")["inputs"][0]
        while nodes[v]["op"] in ("view", "reshape"):
            v = nodes[v]["inputs"][0]
        assert nodes[v] is head[0], nodes[v]
        kv = [n for n in g["nodes"] if n["op"] == "kv_attention"]
        assert len(kv) == 2 and not any(n["op"] == "attention" for n in g["nodes"])
        states = {s["name"]: s for s in g["states"]}
        assert sorted(states) == ["k_cache.0", "k_cache.1", "v_cache.0", "v_cache.1"], sorted(states)
        for s in states.values():
            assert s["shape"] == ["S", heads_kv, 64, dim] and s["datatype"] == "FP32", s
            assert s["placement"] == ("replicate" if ws == 1 else "shard(1)"), s
        for n in kv:
            assert n["inputs"][3:] == ["k_cache.%s" % n["inputs"][3][-1], "v_cache.%s" % n["inputs"][3][-1],
                                       "cache_slot", "position_ids"], n
        # the positions come from position_ids through a replicated table of 64 rows
        pos = [n for n in g["nodes"] if n["op"] == "embedding" and n["inputs"][0] == "position_ids"]
        params = {p["name"]: p for p in g["params"]}
        assert pos and all(params[n["inputs"][1]]["shape"][0] == 64 and
                           params[n["inputs"][1]]["placement"] == "replicate" for n in pos), pos
        tail = [(n["op"], n.get("attrs")) for n in g["nodes"][-4:]]
        if ws == 1:
            assert tail[-3:] == [("argmax", {"limit": vocab}), ("argmax_index", None), ("view", {"shape": [-1]})], tail
        else:
            assert tail == [("argmax", {"limit": vocab, "vocab_parallel": True}), ("all_reduce", {"op": "max"}),
                            ("argmax_index", None), ("view", {"shape": [-1]})], tail
        assert not any(n["op"] == "all_gather" for n in g["nodes"]), "logits gathered"
PY
    fail "generation graph structure"

# ---- the written graphs generate transformers' tokens (NumPy SPMD evaluation) ----
$PYTHON - "$ROOT/graphs" "$FIX" "$TMP" <<'PY' >"$TMP/tokens" 2>&1 &&
import json, os, sys
sys.path.insert(0, sys.argv[1])
from onnx_import.generate import graph_greedy
for m in ("gpt2_gen", "llama_gen"):
    ref = json.load(open(os.path.join(sys.argv[2], m + ".tokens.json")))
    for ws in (1, 2, 4):
        got = graph_greedy(os.path.join(sys.argv[3], "%s_tp%d.json" % (m, ws)), ref["prompts"], ref["max_new_tokens"])
        assert got == ref["output_ids"], (m, ws, got, ref["output_ids"])
print("%d prompts x %d tokens" % (len(ref["prompts"]), ref["max_new_tokens"]))
PY
    pass "NumPy evaluation of every imported graph: $(cat "$TMP/tokens") equal to transformers' generate" ||
    fail "NumPy evaluation vs transformers' tokens: $(tail -3 "$TMP/tokens")"

# ---- tpserve runs the imported graphs: transformers' tokens -----------------------
# Token rows holding every prompt followed by its reference continuation (all
# but the last token), each sequence in its own 1-based slot at positions
# 0..n-1, run by `tpserve run` in two layouts:
# - prefill: sequence after sequence, 88 rows run in pieces of the largest
#   bucket (16): a row reads what its own and earlier pieces wrote;
# - steps: position-major with --buckets 1,2,3, so the engine runs 30
#   pieces of 3 rows in order, the caches persisting across them: up to
#   position 23 each piece is one decode step of the three sequences (a
#   server's decode loop, teacher-forced).
# Each row's next_token from the prompt's last row on must be the next
# reference token (greedy decoding: 24 tokens x 3 prompts).
# rows.py inputs|check prefill|steps TOKENS FILE GRAPHS_DIR
cat >"$TMP/rows.py" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[5])
from gen_examples import load_safetensors, save_safetensors
mode, layout, ref, path = sys.argv[1], sys.argv[2], json.load(open(sys.argv[3])), sys.argv[4]
seqs = [p + o[:-1] for p, o in zip(ref["prompts"], ref["output_ids"])]
rows = [(k, pos, t) for k, s in enumerate(seqs) for pos, t in enumerate(s)]  # (sequence, position, token)
wanted = lambda r: r[1] >= len(ref["prompts"][r[0]]) - 1  # logit_rows: from the prompt's last row on
if layout == "steps":
    rows.sort(key=lambda r: (r[1], r[0]))
if mode == "inputs":
    save_safetensors(path, {"input_ids": ("I64", np.array([[r[2]] for r in rows], np.int64)),
                            "position_ids": ("I64", np.array([r[1] for r in rows], np.int64)),
                            "cache_slot": ("I64", np.array([r[0] + 1 for r in rows], np.int64)),
                            "logit_rows": ("I64", np.array([int(wanted(r)) for r in rows], np.int64))})
    sys.exit(0)
picks = {(r[0], r[1]): int(t) for r, t in zip(rows, load_safetensors(path)["next_token"][1])}
skipped = sorted({picks[(r[0], r[1])] for r in rows if not wanted(r)})
if skipped != [0]:  # the argmax of a skipped row's zero logits: id 0, the lowest of the tie
    sys.exit("rows logit_rows does not want: next tokens %s, want 0" % skipped)
for k, (p, o) in enumerate(zip(ref["prompts"], ref["output_ids"])):
    got = [picks[(k, pos)] for pos in range(len(p) - 1, len(seqs[k]))]
    if got != o:
        sys.exit("prompt %s: tpserve %s, transformers %s" % (p, got, o))
print("%d rows, %d x %d tokens" % (len(rows), len(seqs), len(ref["output_ids"][0])))
PY
GEN_SIZES="1 2 4"
[ -n "${TP_SANITIZED:-}" ] && GEN_SIZES=2 # the kernels of 1 and 4 ranks are those of 2
for m in gpt2_gen llama_gen; do
    for layout in prefill steps; do
        $PYTHON "$TMP/rows.py" inputs $layout "$FIX/$m.tokens.json" "$TMP/$m.$layout.safetensors" "$ROOT/graphs" ||
            { fail "$m: $layout inputs"; continue; }
        buckets=
        [ $layout = steps ] && buckets="--buckets 1,2,3"
        for ws in $GEN_SIZES; do
            for r in threads processes; do
                # shellcheck disable=SC2086
                if "$TPSERVE" run "$TMP/${m}_tp$ws.json" --inputs "$TMP/$m.$layout.safetensors" \
                    --output "$TMP/out.safetensors" --backend cpu --ranks $r $buckets >"$TMP/run.log" 2>&1 &&
                    $PYTHON "$TMP/rows.py" check $layout "$FIX/$m.tokens.json" "$TMP/out.safetensors" "$ROOT/graphs" \
                        >"$TMP/cmp" 2>&1; then
                    pass "tpserve run ${m}_tp$ws ($r, $layout): $(cat "$TMP/cmp") equal to transformers' generate"
                else
                    fail "tpserve run ${m}_tp$ws ($r, $layout): $(cat "$TMP/run.log" "$TMP/cmp" 2>/dev/null | tail -3)"
                fi
            done
        done
    done
done

# ---- the self-check catches a wrong graph ----------------------------------------
# gpt2_gen_tp2 with its position table's rows reversed: the written graph no
# longer generates onnxruntime's tokens, and selfcheck() says so.
$PYTHON - "$ROOT/graphs" "$FIX" "$TMP" <<'PY' >"$TMP/bad" 2>&1 &&
import json, os, shutil, sys
sys.path.insert(0, sys.argv[1])
from gen_examples import load_safetensors, save_safetensors
from onnx_import.errors import ImportFailure
from onnx_import.generate import Export, selfcheck
src, dst = os.path.join(sys.argv[3], "gpt2_gen_tp2.json"), os.path.join(sys.argv[3], "bad.json")
g = json.load(open(src))
g["weights"] = "bad.safetensors"
json.dump(g, open(dst, "w"))
t = load_safetensors(os.path.join(sys.argv[3], "gpt2_gen_tp2.safetensors"))
key = [p for p in g["params"] if p["name"].endswith(".by_position")][0]["name"]
t[key] = (t[key][0], t[key][1][::-1].copy())
save_safetensors(os.path.join(sys.argv[3], "bad.safetensors"), t)
try:
    selfcheck(dst, Export(os.path.join(sys.argv[2], "gpt2_gen.onnx")), g["generate"])
    sys.exit("self-check passed a graph with reversed positions")
except ImportFailure as e:
    assert "self-check" in str(e), e
PY
    pass "self-check fails a graph whose position table is reversed" || fail "self-check on a wrong graph: $(tail -3 "$TMP/bad")"

# argmax keys (the engine's packing, kernels/common/tp_generate.h) over
# vocab shards, reduced by a signed max: the global argmax below the limit,
# lowest id on ties, negative and positive logits alike.
$PYTHON - "$ROOT/graphs" <<'PY' && pass "NumPy argmax keys: signed max over shards = argmax below the limit, lowest id on ties" ||
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from gen_examples import _argmax_keys
rng = np.random.default_rng(1)
for trial in range(200):
    ws, n = int(rng.choice([1, 2, 4])), int(rng.integers(1, 9))
    x = rng.choice([-3.5, -1.0, -0.0, 0.0, 0.5, 2.0, np.nan], size=(3, ws * n)).astype(np.float32)
    limit = int(rng.integers(1, ws * n + 1))
    keys = np.max([_argmax_keys(x[:, r * n:(r + 1) * n], {"vocab_parallel": True, "limit": limit}, r)
                   for r in range(ws)], axis=0)
    ids = 0xFFFFFFFF - (keys & 0xFFFFFFFF)
    want = np.argmax(np.where(np.isnan(x[:, :limit]), -np.inf, x[:, :limit]) + np.float32(0), axis=-1)
    assert (ids == want).all(), (x, limit, ids, want)
PY
    fail "NumPy argmax keys"

# ---- refusals: one line naming why, non-zero exit, nothing written --------------
# refuse NAME WHY MODEL.onnx ARGS...: the import fails with WHY in its one line.
refuse() {
    name=$1 why=$2 model=$3
    shift 3
    if $IMPORT "$model" --world-size 2 --generate "$@" --out "$TMP/refused.json" 2>"$TMP/err"; then
        fail "$name: imported"
    elif [ "$(wc -l <"$TMP/err")" = 1 ] && grep -q "$why" "$TMP/err" && [ ! -e "$TMP/refused.json" ] &&
        [ ! -e "$TMP/refused.safetensors" ]; then
        pass "$name refused: $(cat "$TMP/err")"
    else
        fail "$name: $(cat "$TMP/err")"
    fi
}
refuse "non-causal attention" "is not causal" "$FIX/bert_gen.onnx"
refuse "fixed sequence dim" "no dynamic sequence dim" "$FIX/bert.onnx"
refuse "an attention_mask input" "fed the token ids alone" "$FIX/gpt2_mask.onnx"
# --sequence-parallel: token rows have no sequence dim to split; the graph
# written is the tensor-parallel one, and the importer says so
if $IMPORT "$FIX/llama_gen.onnx" --world-size 2 --generate --sequence-parallel --out "$TMP/sp/llama_gen_tp2.json" \
    2>"$TMP/err" && grep -q "one token per row" "$TMP/err" && cmp -s "$TMP/sp/llama_gen_tp2.json" "$TMP/llama_gen_tp2.json" &&
    cmp -s "$TMP/sp/llama_gen_tp2.safetensors" "$TMP/llama_gen_tp2.safetensors"; then
    pass "--sequence-parallel --generate: the tensor-parallel generation graph, byte for byte, with a note why"
else
    fail "--sequence-parallel --generate: $(cat "$TMP/err")"
fi
refuse "--max-seq-len above n_positions" "above the model's position limit 64" "$FIX/gpt2_gen.onnx" --max-seq-len 65
refuse "--max-seq-len above max_position_embeddings" "above the model's position limit 64" "$FIX/llama_gen.onnx" \
    --max-seq-len 65
# Without the max_position_embeddings property (a plain torch.onnx.export):
# GPT-2's limit is its position table's 64 rows; a RoPE model has none to
# show, so --max-seq-len is needed.
$PYTHON - "$FIX" "$TMP" <<'PY' || fail "exports without metadata"
import os, sys
import onnx
for m in ("gpt2_gen", "llama_gen"):
    model = onnx.load(os.path.join(sys.argv[1], m + ".onnx"))
    del model.metadata_props[:]
    onnx.save(model, os.path.join(sys.argv[2], m + "_nometa.onnx"))
PY
if $IMPORT "$TMP/gpt2_gen_nometa.onnx" --world-size 2 --generate --out "$TMP/nometa.json" 2>"$TMP/err" &&
    grep -q '"max_seq_len": 64' "$TMP/nometa.json"; then
    pass "no metadata: GPT-2's limit from its position table (64 rows)"
else
    fail "no metadata, GPT-2: $(cat "$TMP/err")"
fi
refuse "no metadata, --max-seq-len above the table" "above the model's position limit 64 (its position table's rows)" \
    "$TMP/gpt2_gen_nometa.onnx" --max-seq-len 65
refuse "no metadata, RoPE" "give --max-seq-len" "$TMP/llama_gen_nometa.onnx"
if $IMPORT "$TMP/llama_gen_nometa.onnx" --world-size 2 --generate --max-seq-len 48 --out "$TMP/nometa.json" \
    2>"$TMP/err" && grep -q '"max_seq_len": 48' "$TMP/nometa.json"; then
    pass "no metadata, RoPE with --max-seq-len 48: imported, self-check passing"
else
    fail "no metadata, RoPE --max-seq-len 48: $(cat "$TMP/err")"
fi
# a shorter cache is fine: states of 20 positions, position tables of 20 rows
if $IMPORT "$FIX/llama_gen.onnx" --world-size 2 --generate --max-seq-len 20 --out "$TMP/short.json" 2>"$TMP/err" &&
    grep -q '"max_seq_len": 20' "$TMP/short.json"; then
    pass "--max-seq-len 20 below the limit: imported, self-check passing"
else
    fail "--max-seq-len 20: $(cat "$TMP/err")"
fi

echo "test_onnx_generate: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
