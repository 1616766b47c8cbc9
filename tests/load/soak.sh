#!/bin/sh
# soak.sh — `make soak`: SOAK_SECONDS of mixed traffic against a real server
# serving the example graph, SOAK_CONNS clients at a time: valid requests
# (JSON and binary, every answer checked against the reference), invalid
# ones (malformed JSON, wrong shape, short binary tensor, unknown model,
# wrong method: each must get its own 4xx) and health, metadata and
# metrics. Prints a table of requests and failures by class, then RSS at
# start and end (tests/integration/abuse_client.py soak). Exit 1 on any
# wrong answer or status, or a server that did not exit 0 on SIGTERM.
#
# env: TPSERVE, TP_GRAPHS, PYTHON, SOAK_SECONDS (30), SOAK_CONNS (8),
#      GRAPH (mlp_sp_tp2), KEEP_TMP=1 keeps the server log.
set -u
TPSERVE=${TPSERVE:-build/tpserve}
TP_GRAPHS=${TP_GRAPHS:-build/graphs}
PYTHON=${PYTHON:-python3}
G=${GRAPH:-mlp_sp_tp2}
HERE=$(cd "$(dirname "$0")" && pwd)
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_soak.XXXXXX")
. "$HERE/../integration/lib/server.sh"

start soak --graph "$TP_GRAPHS/$G.json" || exit 1
echo "soak: $G, ${SOAK_SECONDS:-30} s, ${SOAK_CONNS:-8} connections, server pid $PID ($TPSERVE)"
$PYTHON "$HERE/../integration/abuse_client.py" soak --url "$URL" --pid "$PID" --graphs "$TP_GRAPHS" --graph "$G" \
    --seconds "${SOAK_SECONDS:-30}" --conns "${SOAK_CONNS:-8}"
rc=$?
kill -TERM "$PID"
wait "$PID"
src=$?
[ $src -eq 0 ] || { echo "soak: server exited $src after SIGTERM"; rc=1; }
exit $rc
