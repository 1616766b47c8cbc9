#!/bin/sh
# test_triton_model.sh — what `make bench-http` compares Triton with, checked
# without Triton (which the suite never installs): the model repository
# tests/load/triton/make_repo.py writes from tpserve's own configuration and
# its NumPy model answering each FP32 SP MLP graph's reference (the cases of
# tests/load/triton/test_model.py), and tests/load/sample_answers.py saving
# tpserve's answers, accepting a server that answers the same and refusing
# one that answers differently; and the "serving path alone" graph
# tests/load/serving_path_graph.py writes.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the files.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
G=mlp_sp_tp2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_triton_model.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
LOAD=$HERE/../load
. "$HERE/lib/server.sh"

start triton_model --graph "$TP_GRAPHS/$G.json" --log-level warn || exit 1
curl -s -o "$TMP/config.json" "$URL/v2/models/$G/config"

# Its PASS/FAIL lines count here; anything on stderr is a crash.
$PYTHON "$LOAD/triton/test_model.py" "$TP_GRAPHS" "$TMP/config.json" "$TMP/repo" >"$TMP/model.out" 2>"$TMP/model.err"
[ -s "$TMP/model.err" ] && fail "test_model.py: $(cat "$TMP/model.err")"
while read -r verdict what; do
    case $verdict in
    PASS:) pass "$what" ;;
    FAIL:) fail "$what" ;;
    *) fail "test_model.py: $verdict $what" ;;
    esac
done <"$TMP/model.out"

mkdir "$TMP/ans"
$PYTHON "$LOAD/sample_answers.py" save "$URL" "$G" "$TMP/ans" >"$TMP/o" 2>&1 &&
    [ -s "$TMP/ans/ans.json" ] && [ -s "$TMP/ans/ans.bin" ] && [ -s "$TMP/ans/ans.bin.hl" ] &&
    pass "sample_answers save: requests and tpserve's JSON and binary answers written" ||
    fail "sample_answers save: $(cat "$TMP/o")"
$PYTHON "$LOAD/sample_answers.py" check "$TP_GRAPHS/manifest.json" "$G" "$TMP/ans" "$URL" >"$TMP/o" 2>&1 &&
    pass "sample_answers check: the same server's answers are accepted: $(tr '\n' ';' <"$TMP/o")" ||
    fail "sample_answers check of the same server: $(cat "$TMP/o")"

# An answer off by 1e-3 relative (ten times the FP32 tolerance) is refused.
$PYTHON - "$TMP/ans/ans.json" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["outputs"][0]["data"] = [v * 1.001 for v in doc["outputs"][0]["data"]]
json.dump(doc, open(sys.argv[1], "w"))
PY
$PYTHON "$LOAD/sample_answers.py" check "$TP_GRAPHS/manifest.json" "$G" "$TMP/ans" "$URL" >"$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "JSON answer is not the saved one: y differs" "$TMP/o" &&
    pass "sample_answers check: a different JSON answer is refused" ||
    fail "sample_answers check accepted a different answer: $(cat "$TMP/o")"
$PYTHON "$LOAD/sample_answers.py" check "$TP_GRAPHS/manifest.json" "$G" "$TMP/ans" "http://127.0.0.1:1" \
    >"$TMP/o" 2>&1
[ $? -eq 1 ] && grep -q "Connection refused" "$TMP/o" &&
    pass "sample_answers check: no server is a one-line failure" ||
    fail "sample_answers check without a server: $(cat "$TMP/o")"

# The "serving path alone" server of make bench-http: the graph's name, input
# and output around one relu (tests/load/serving_path_graph.py). It loads,
# answers the sample request with the graph's answer length (what the bench
# checks before timing it) and with relu(x); a graph of two inputs is refused.
$PYTHON "$LOAD/serving_path_graph.py" "$TP_GRAPHS/$G.json" "$TMP/sp.json" 2>"$TMP/o" &&
    pass "serving_path_graph: written for $G" || fail "serving_path_graph for $G: $(cat "$TMP/o")"
if start serving_path --graph "$TMP/sp.json" --log-level warn; then
    mkdir "$TMP/sp"
    $PYTHON "$LOAD/sample_answers.py" save "$URL" "$G" "$TMP/sp" >"$TMP/o" 2>&1 &&
        [ "$(wc -c <"$TMP/sp/ans.bin")" = "$(wc -c <"$TMP/ans/ans.bin")" ] &&
        cmp -s "$TMP/sp/ans.bin.hl" "$TMP/ans/ans.bin.hl" &&
        pass "serving_path_graph: its binary answer is as long as $G's, header included" ||
        fail "serving_path_graph: answer length differs from $G's: $(cat "$TMP/o")"
    # relu is exact: every output is max(x, 0) of the input's FP32 value, bit
    # for bit (the answer's shortest spelling reads back to the same FP32)
    $PYTHON - "$TMP/sp/req.json" "$TMP/sp/ans.json" >"$TMP/o" 2>&1 <<'PY' &&
import json, sys
import numpy as np
x = np.array(json.load(open(sys.argv[1]))["inputs"][0]["data"], dtype=np.float32)
y = np.array(json.load(open(sys.argv[2]))["outputs"][0]["data"], dtype=np.float32)
bad = [] if len(x) != len(y) else np.flatnonzero(y != np.maximum(x, np.float32(0))).tolist()
sys.exit(f"{len(bad)} of {len(y)} outputs are not relu(x), first at {bad[:1]}" if bad or len(x) != len(y) else 0)
PY
        pass "serving_path_graph: it answers relu(x)" || fail "serving_path_graph: $(cat "$TMP/o")"
fi
$PYTHON - "$TP_GRAPHS/$G.json" "$TMP/two.json" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
g["inputs"].append(dict(g["inputs"][0], name="x2"))
json.dump(g, open(sys.argv[2], "w"))
PY
$PYTHON "$LOAD/serving_path_graph.py" "$TMP/two.json" "$TMP/sp2.json" 2>"$TMP/o"
[ $? -eq 1 ] && grep -q "2 inputs and 1 outputs" "$TMP/o" && [ ! -e "$TMP/sp2.json" ] &&
    pass "serving_path_graph: a graph of two inputs is refused with the reason" ||
    fail "serving_path_graph with two inputs: $(cat "$TMP/o")"

echo "test_triton_model: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
