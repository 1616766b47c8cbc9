#!/bin/sh
# test_perf_analyzer.sh — Triton's perf_analyzer drives tpserve unchanged:
# `perf_analyzer -m mlp_sp_tp2 -u HOST:PORT -i http` with binary tensors (its
# default), JSON tensors, and `--shared-memory system`, and binary requests
# over 32 connections, every one answered. It reads /v2, /v2/models/M,
# /v2/models/M/config (max_batch_size: no --shape needed) and
# /v2/models/M/stats, registers and unregisters regions, and infers.
#
# perf_analyzer comes from scripts/install_perf_analyzer.sh (pip and apt);
# when that cannot install it the test prints "SKIPPED: ..." and exits 0.
# env: TPSERVE, TP_GRAPHS, PYTHON (see test_server.sh); KEEP_TMP=1.
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
G=mlp_sp_tp2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_pa.XXXXXX")
PID=""
cleanup() {
    [ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
    if [ -n "${KEEP_TMP:-}" ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

if ! PYTHON=$PYTHON "$HERE/../../scripts/install_perf_analyzer.sh" >"$TMP/install.out" 2>"$TMP/install.err"; then
    echo "SKIPPED: perf_analyzer not installable: $(tail -n 1 "$TMP/install.err")"
    exit 0
fi
eval "$(cat "$TMP/install.out")"

port=$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --port "$port" --allow-client-shm 1 --log-level warn \
    >"$TMP/server.log" 2>&1 &
PID=$!
i=0
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/health/ready")" = 200 ]; do
    i=$((i + 1))
    if [ $i -gt 300 ] || ! kill -0 "$PID" 2>/dev/null; then
        echo "FAIL: server not ready: $(cat "$TMP/server.log")"
        exit 1
    fi
    sleep 0.1
done

npass=0
nfail=0
# count windows of 300 requests: a busy machine cannot make it "unstable"
# report WHAT RC LINE OUT: PASS with perf_analyzer's throughput line, or FAIL
# with its exit status (124: timed out) and the end of its output.
report() {
    if [ "$2" -eq 0 ] && [ -n "$3" ] && ! grep -qi 'error\|unable' "$4"; then
        echo "PASS: perf_analyzer $1: $3"
        npass=$((npass + 1))
    else
        echo "FAIL: perf_analyzer $1 (exit $2):"
        sed 's/^/    /' "$4" | tail -n 15
        nfail=$((nfail + 1))
    fi
}
for mode in binary json shm; do
    eval "args=\$PERF_ARGS_$mode"
    # shellcheck disable=SC2086 # args splits into flags on purpose
    LD_LIBRARY_PATH="$PERF_LIBS" timeout 120 "$PERF_ANALYZER" -m "$G" -u "127.0.0.1:$port" -i http \
        --concurrency-range 2 --measurement-mode count_windows --measurement-request-count 300 \
        -s 1000 $args >"$TMP/$mode.out" 2>&1
    rc=$?
    report "$mode" $rc "$(grep -m 1 '^Concurrency: 2, throughput' "$TMP/$mode.out")" "$TMP/$mode.out"
done
# metric NAME: the server's value of one /metrics sample ("?" if absent).
metric() {
    v=$(curl -s --max-time 5 "http://127.0.0.1:$port/metrics" | awk -v n="$1" '$1 == n { print $2 }')
    echo "${v:-?}"
}
# The bench's heaviest row, as the bench runs it: binary tensors, 32
# connections, time windows ($PERF_WINDOW_ARGS). What this row checks is
# tpserve: every request perf_analyzer sends gets its answer. perf_analyzer
# 2.49 can stall on its own at this rate (its end-of-window bookkeeping grows
# with rate^2 x window, server/README.md at 27cb4dd "perf_analyzer's stalled row"; and
# --request-count can wait forever for records it dropped at the start, so
# neither fixes it). So when it has not finished within 30 s it is stopped
# (SIGSTOP: no new requests) and the server must then have nothing in
# flight: an answer never sent would keep its request there.
ok0=$(metric tpserve_request_success_total)
t0=$(date +%s)
# shellcheck disable=SC2086 # the window flags split on purpose
LD_LIBRARY_PATH="$PERF_LIBS" "$PERF_ANALYZER" -m "$G" -u "127.0.0.1:$port" -i http \
    --concurrency-range 32 $PERF_WINDOW_ARGS -s 1000 >"$TMP/binary32.out" 2>&1 &
PA=$!
while kill -0 "$PA" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 30 ]; do sleep 0.2; done
if kill -0 "$PA" 2>/dev/null; then
    kill -STOP "$PA"
    sleep 1
    inflight=$(metric tpserve_inflight_requests)
    ok1=$(metric tpserve_request_success_total)
    kill -KILL "$PA"
    wait "$PA" 2>/dev/null
    if [ "$inflight" = 0 ]; then
        echo "PASS: perf_analyzer binary at 32 connections: every request answered ($ok0 -> $ok1 answered 200," \
            "none in flight with perf_analyzer stopped); perf_analyzer itself had no result after 30 s"
        npass=$((npass + 1))
    else
        echo "FAIL: perf_analyzer binary at 32 connections: $inflight requests still in flight 1 s after" \
            "perf_analyzer stopped sending: answers lost"
        sed 's/^/    /' "$TMP/binary32.out" | tail -n 15
        nfail=$((nfail + 1))
    fi
else
    wait "$PA"
    rc=$?
    report "binary at 32 connections, $(($(date +%s) - t0)) s" $rc \
        "$(grep -m 1 '^Concurrency: 32, throughput' "$TMP/binary32.out")" "$TMP/binary32.out"
fi
if kill -0 "$PID" 2>/dev/null; then
    echo "PASS: server alive after perf_analyzer"
    npass=$((npass + 1))
else
    echo "FAIL: server died: $(tail -n 5 "$TMP/server.log")"
    nfail=$((nfail + 1))
fi
shm_left=$(curl -s "http://127.0.0.1:$port/v2/systemsharedmemory/status")
[ "$shm_left" = "[]" ] && { echo "PASS: perf_analyzer unregistered its regions"; npass=$((npass + 1)); } ||
    { echo "FAIL: regions left registered: $shm_left"; nfail=$((nfail + 1)); }
echo "test_perf_analyzer: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
