#!/bin/sh
# tpserve run / plan from the command line, on every example graph and on
# broken graphs. Env: TPSERVE (binary), TP_GRAPHS (generated graphs), PYTHON.
set -u
TPSERVE=${TPSERVE:-build/tpserve}
G=${TP_GRAPHS:-build/graphs}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
pass() { echo "PASS: $*"; }
bad() { echo "FAIL: $*"; fail=1; }

# Every example: run through the CLI, compare with the unsharded reference.
for entry in $($PYTHON -c "import json,sys; m=json.load(open(sys.argv[1])); print(' '.join(g['name']+':'+repr(g['rtol']) for g in m['graphs']))" "$G/manifest.json"); do
    name=${entry%%:*}; rtol=${entry##*:}
    if "$TPSERVE" run "$G/$name.json" --inputs "$G/$name.inputs.safetensors" --output "$TMP/$name.out" --backend cpu 2>"$TMP/err" \
       && $PYTHON "$HERE/compare.py" "$TMP/$name.out" "$G/$name.ref.safetensors" "$rtol" >"$TMP/cmp"; then
        pass "run $name matches reference (rtol $rtol)"
    else
        bad "run $name: $(cat "$TMP/err" "$TMP/cmp" 2>/dev/null | tail -3)"
    fi
done

# plan --json: one JSON object with the documented node fields.
if "$TPSERVE" plan "$G/megatron_block_tp2.json" --json --batch 2 >"$TMP/plan.json" &&
   $PYTHON - "$TMP/plan.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
nodes = {n["name"]: n for n in p["nodes"]}
for n in p["nodes"]:
    assert set(["name", "op", "inputs", "shape", "dtype", "contiguous"]) <= set(n), n
assert p["world_size"] == 2 and p["batch"] == 2
views = [n for n in p["nodes"] if n["op"] in ("permute", "transpose", "slice")]
assert views and any(not n["contiguous"] for n in views), "expected a strided view"
PY
then pass "plan --json fields"; else bad "plan --json"; fi
"$TPSERVE" plan "$G/mlp_sp_tp2.json" >"$TMP/plan.txt" && grep -q "all_gather" "$TMP/plan.txt" \
    && pass "plan text" || bad "plan text"

# Broken inputs: non-zero exit and a one-line reason naming the culprit.
expect_fail() { # description, expected substring, command...
    desc=$1; want=$2; shift 2
    if "$@" >/dev/null 2>"$TMP/err"; then bad "$desc: exit 0"; return; fi
    if grep -q -- "$want" "$TMP/err" && [ "$(wc -l <"$TMP/err")" -eq 1 ]; then pass "$desc"; else bad "$desc: $(cat "$TMP/err")"; fi
}
sed 's/"op": "gelu"/"op": "gelu_new"/' "$G/mlp_sp_tp2.json" >"$TMP/badop.json"
cp "$G/mlp_sp_tp2.safetensors" "$TMP/"
expect_fail "unknown op" "unknown op 'gelu_new'" "$TPSERVE" plan "$TMP/badop.json"
printf '{"format": "tpgraph",\n "version": 1\n "name": "x"}' >"$TMP/badjson.json"
expect_fail "bad JSON" "line 3" "$TPSERVE" plan "$TMP/badjson.json"
expect_fail "missing graph" "cannot open graph" "$TPSERVE" run "$TMP/nope.json" --inputs "$G/mlp_sp_tp2.inputs.safetensors" --output "$TMP/o"
expect_fail "inputs of another graph" "input" "$TPSERVE" run "$G/mlp_sp_tp2.json" --inputs "$G/megatron_block_tp2.inputs.safetensors" --output "$TMP/o"
expect_fail "missing inputs file" "No such file" "$TPSERVE" run "$G/mlp_sp_tp2.json" --inputs "$TMP/none.safetensors" --output "$TMP/o"
expect_fail "unknown backend" "unknown backend" "$TPSERVE" run "$G/mlp_sp_tp2.json" --inputs "$G/mlp_sp_tp2.inputs.safetensors" --output "$TMP/o" --backend tpu
exit $fail
