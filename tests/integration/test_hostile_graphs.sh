#!/bin/sh
# Hostile graph files (issue 16): each gets a one-line error naming the node
# (or input, param, weights file) and the reason, never a crash, a sanitizer
# report or a hang; `serve` on a FIFO weights path exits instead of staying
# "loading". Env: TPSERVE, PYTHON.
set -u
TPSERVE=${TPSERVE:-build/tpserve}
PYTHON=${PYTHON:-python3}
HERE=$(dirname "$0")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fail=0
$PYTHON "$HERE/../hostile/hostile_graphs.py" write "$TMP" || exit 1
TPSERVE=$TPSERVE $PYTHON "$HERE/../hostile/hostile_graphs.py" check "$TMP" || fail=1

# serve: the graph fails to load, so the process exits 1 (bounded wait).
timeout 30 "$TPSERVE" serve "$TMP/weights_fifo.json" --port 0 >"$TMP/serve.log" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "not a regular file" "$TMP/serve.log"; then
    echo "PASS: serve with FIFO weights exits 1: $(grep 'not a regular file' "$TMP/serve.log")"
else
    echo "FAIL: serve with FIFO weights: exit $rc"; sed 's/^/    /' "$TMP/serve.log"; fail=1
fi
exit $fail
