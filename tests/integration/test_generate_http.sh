#!/bin/sh
# test_generate_http.sh — the generate extension on the example decoder
# (graphs/gen_examples.py: gen_decoder_tp1/2/4, GQA, a vocab-parallel head
# whose padding argmax must skip): each prompt's continuation equals the
# NumPy greedy reference token for token, through /generate and
# /generate_stream, alone and 8 at once, at world sizes 1, 2 and 4, ranks
# as threads and as processes; bad requests get 400 naming what is wrong;
# a server whose slots are all busy answers 503; a stream whose client goes frees its slot; /infer is
# refused on a generation model; model config, statistics and /metrics
# report the scheduler. Then the imported causal LMs (tests/onnx/gpt2_gen
# and llama_gen, `import_onnx.py --generate`; RoPE and GQA in the second)
# generate transformers' greedy tokens (NAME.tokens.json: 24 per prompt)
# the same ways, and 32 requests at once each get the tokens it gets alone.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_generate.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
. "$HERE/lib/server.sh"
CLIENT="$HERE/generate_client.py"

# The reference continuations in the client's format, from the steps file
# gen_examples.py writes beside the graphs (full token lists, prompts first).
$PYTHON - "$TP_GRAPHS/gen_decoder.steps.json" "$TMP/tokens.json" "$ROOT/graphs" <<'EOF' || exit 1
import json, sys
sys.path.insert(0, sys.argv[3])
from gen_examples import GEN_SEQS
toks = json.load(open(sys.argv[1]))["tokens"]
prompts = [GEN_SEQS[s][1] for s in sorted(GEN_SEQS)]
outs = [toks[s][len(GEN_SEQS[s][1]):] for s in sorted(GEN_SEQS)]
json.dump({"prompts": prompts, "output_ids": outs}, open(sys.argv[2], "w"))
EOF

post() { curl -s -o "$TMP/body" -w '%{http_code}' "$URL/v2/models/$1" -d "$2"; }
# expect_status ROUTE BODY CODE TEXT: the answer's status and that its
# error names TEXT
expect_status() {
    code=$(post "$1" "$2")
    [ "$code" = "$3" ] && grep -q "$4" "$TMP/body" && pass "$1 $2 -> $3 ($(cat "$TMP/body"))" ||
        fail "$1 $2: got $code $(cat "$TMP/body"), want $3 naming '$4'"
}

# check_every_way GRAPH_FILE TOKENS WHAT SERVE_ARGS...: a server of GRAPH_FILE
# answers each prompt of TOKENS with its reference continuation through
# generate and generate_stream, alone and 8 at once (then stopped)
check_every_way() {
    g=$1 toks=$2 what=$3
    shift 3
    G=$(basename "$g" .json)
    start "$G-$*" --graph "$g" "$@" || return
    for mode in "" --stream; do
        for n in 1 8; do
            # shellcheck disable=SC2086
            $PYTHON "$CLIENT" check "$URL" "$G" "$toks" --concurrent $n $mode >"$TMP/c" 2>&1 &&
                pass "$G $*: ${mode:-generate} x$n: $what" || fail "$G $* ${mode:-generate} x$n: $(head -3 "$TMP/c")"
        done
    done
    kill "$PID"; wait "$PID" 2>/dev/null
}

# 1. every world size and rank mode, every way of asking, alone and 8 at once
for ws in 1 2 4; do
    for ranks in threads processes; do
        [ "$ws" = 1 ] && [ "$ranks" = processes ] && continue
        check_every_way "$TP_GRAPHS/gen_decoder_tp$ws.json" "$TMP/tokens.json" "the greedy reference" --ranks $ranks
    done
done
# prompts in steps of their own: the same tokens; the log names the mode and
# that the LM head runs only on the rows that give a token (logit rows)
check_every_way "$TP_GRAPHS/gen_decoder_tp2.json" "$TMP/tokens.json" "the greedy reference" --generate-prefill separate
grep -q "separate prefill, LM head on the rows that give a token" "$TMP/gen_decoder_tp2---generate-prefill separate.log" &&
    pass "the log says: separate prefill, LM head on the rows that give a token" ||
    fail "no 'separate prefill, LM head on the rows that give a token' in the log"

# 2. bad requests, /infer, what the server reports
G=gen_decoder_tp2
if start bad --graph "$TP_GRAPHS/$G.json"; then
    expect_status "$G/generate" '{"input_ids":[1,37]}' 400 "input_ids\[1\] = 37 is outside the vocabulary \[0, 37)"
    expect_status "$G/generate" '{"input_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}' 400 "more than the model's max_seq_len 16"
    expect_status "$G/generate" '{"input_ids":[]}' 400 "empty"
    expect_status "$G/generate" '{"input_ids":[1], "max_tokens":0}' 400 "max_tokens is 0"
    expect_status "$G/generate" '{"input_ids":[1.5]}' 400 "input_ids\[0\] is not an integer"
    expect_status "$G/generate" '{"input_ids":[1], "temperature":0.7}' 400 "unknown key 'temperature'"
    expect_status "$G/generate_stream" '{"prompt":"hi"}' 400 "missing 'input_ids'"
    expect_status "$G/generate" '{"input_ids":[1' 400 "not JSON"
    expect_status "$G/infer" '{"inputs":[]}' 400 "is a generation graph"
    code=$(post "$G/generate" '{"input_ids":[3,14,15,9,26], "parameters":{"max_tokens":3, "stop_ids":[999]}}')
    [ "$code" = 200 ] && grep -q '"output_ids":\[23,11,23\],"finish_reason":"length"' "$TMP/body" &&
        pass "parameters.max_tokens (Triton's place) is honoured" || fail "parameters: $code $(cat "$TMP/body")"
    code=$(post "$G/generate" '{"input_ids":[3,14,15,9,26], "max_tokens":7, "stop_ids":[17]}')
    [ "$code" = 200 ] && grep -q '"output_ids":\[23,11,23,17\],"finish_reason":"stop"' "$TMP/body" &&
        pass "stop_ids end the sequence at the stop token (kept)" || fail "stop_ids: $code $(cat "$TMP/body")"
    code=$(post "$G/generate" '{"input_ids":[3,14,15,9,26,1,2,3,4,5,6,7], "max_tokens":70}')
    [ "$code" = 200 ] && grep -q '"finish_reason":"cache_full"' "$TMP/body" &&
        [ "$($PYTHON -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["output_ids"]))' "$TMP/body")" = 5 ] &&
        pass "a sequence ends when its slot's 16 positions are used (12 + 5 - 1)" ||
        fail "cache_full: $code $(cat "$TMP/body")"
    curl -s "$URL/v2/models/$G/config" >"$TMP/cfg"
    grep -q '"generate":{"max_seq_len":16,"slots":16' "$TMP/cfg" && pass "model config reports max_seq_len and slots" ||
        fail "config: $(head -c 300 "$TMP/cfg")"
    curl -s "$URL/v2/models/$G/stats" >"$TMP/stats"
    grep -q '"generate_stats":{' "$TMP/stats" && pass "statistics carry generate_stats" ||
        fail "stats: $(head -c 300 "$TMP/stats")"
    curl -s "$URL/metrics" >"$TMP/metrics"
    for m in tpserve_generate_output_tokens_total tpserve_generate_steps_total tpserve_generate_slots_in_use \
             tpserve_generate_time_per_output_token_seconds_count; do
        grep -q "^$m [0-9]" "$TMP/metrics" && pass "/metrics has $m" || fail "/metrics lacks $m"
    done
    [ "$(awk '$1 == "tpserve_generate_output_tokens_total" {print $2}' "$TMP/metrics")" -eq 12 ] &&
        pass "/metrics counted the 12 tokens (3 + 4 + 5)" || fail "output tokens: $(grep output_tokens_total "$TMP/metrics")"
    kill "$PID"; wait "$PID" 2>/dev/null
fi

# 3. a model with a long cache (the example decoder's positions tiled to
# 2048), so a sequence runs long enough for its client to go first
$PYTHON - "$TP_GRAPHS/gen_decoder_tp2" "$TMP/gen_long" "$ROOT/graphs" <<'EOF' || exit 1
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[3])
from gen_examples import load_safetensors, save_safetensors
src, dst, L = sys.argv[1], sys.argv[2], 2048
g = json.load(open(src + ".json"))
g["name"], g["weights"] = "gen_long", "gen_long.safetensors"
g["generate"]["max_seq_len"] = L
for s in g["states"]:
    s["shape"][2] = L
for p in g["params"]:
    if p["name"] == "pos_emb":
        p["shape"][0] = L
w = load_safetensors(src + ".safetensors")
st, pe = w["pos_emb"]
w["pos_emb"] = (st, np.tile(pe, (L // pe.shape[0], 1)))
json.dump(g, open(dst + ".json", "w"))
save_safetensors(dst + ".safetensors", w)
EOF
if start slots --graph "$TMP/gen_long.json" --generate-slots 2; then
    for route in generate_stream generate; do
        $PYTHON "$CLIENT" disconnect "$URL" gen_long 3 $route >"$TMP/c" 2>&1 &&
            pass "a $route client that goes mid-sequence frees its slot (counted as cancelled)" ||
            fail "disconnect from $route: $(cat "$TMP/c")"
    done
    $PYTHON "$CLIENT" saturate "$URL" gen_long 2 >"$TMP/c" 2>&1 &&
        pass "3 long sequences on 2 slots: one gets 503 naming the slots, the others run to cache_full" ||
        fail "saturate: $(cat "$TMP/c")"
    kill "$PID"; wait "$PID" 2>/dev/null
fi

# 4. the imported fixtures: transformers' tokens over HTTP
. "$HERE/lib/onnx.sh"
SIZES="1 2 4"
[ -n "${TP_SANITIZED:-}" ] && SIZES=2 # the kernels of 1 and 4 ranks are those of 2
for m in gpt2_gen llama_gen; do
    for ws in $SIZES; do
        G=${m}_tp$ws
        $IMPORT "$FIX/$m.onnx" --world-size "$ws" --generate --out "$TMP/$G.json" >"$TMP/imp" 2>&1 ||
            { fail "import $G: $(tail -2 "$TMP/imp")"; continue; }
        for ranks in threads processes; do
            [ "$ws" = 1 ] && [ "$ranks" = processes ] && continue
            check_every_way "$TMP/$G.json" "$FIX/$m.tokens.json" "transformers' 24 greedy tokens per prompt" \
                --ranks $ranks
        done
        # 32 at once, each prefill mode on one model
        prefill=mixed
        [ "$m" = llama_gen ] && prefill=separate
        [ "$ws" = 2 ] && start "$G-32" --graph "$TMP/$G.json" --generate-slots 32 --generate-prefill $prefill || continue
        $PYTHON "$CLIENT" check "$URL" "$G" "$FIX/$m.tokens.json" --concurrent 32 >"$TMP/c" 2>&1 &&
            pass "$G: 32 requests at once ($prefill prefill), each with transformers' tokens (as alone)" ||
            fail "$G x32 ($prefill prefill): $(head -3 "$TMP/c")"
        kill "$PID"; wait "$PID" 2>/dev/null
    done
done

echo "test_generate_http: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
