#!/bin/sh
# test_shm_chaos.sh — system shared memory against a hostile client (issue
# 17): while requests read inputs from and write outputs to a registered
# region, another thread of the client truncates the shm object and grows it
# back, and another unregisters and registers the region, in loops. The
# server must never fault (it once died of SIGBUS on a mapped page past the
# object's new end): every answer is 200 and correct, or a 400 naming the
# region, and the server is still ready and correct afterwards.
#
# env: TPSERVE (binary), TP_GRAPHS (generated graphs), PYTHON (python3);
#      KEEP_TMP=1 keeps the server log.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
G=mlp_sp_tp2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_shm.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"

if [ ! -d /dev/shm ]; then
    echo "SKIPPED: no /dev/shm (POSIX shared memory) on this machine"
    exit 0
fi

# a queue delay lets concurrent shm requests share batches
start shm --graph "$TP_GRAPHS/$G.json" --allow-client-shm 1 --max-queue-delay-us 200 || exit 1

"$PYTHON" "$HERE/shm_chaos_client.py" --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" \
    --clients 4 --seconds 4 >"$TMP/chaos.out" 2>&1
rc=$?
sed 's/^/    /' "$TMP/chaos.out"
[ $rc -eq 0 ] && pass "truncated and re-registered under load: only correct 200s and 400s naming the region" ||
    fail "hostile shm client (exit $rc)"

kill -0 "$PID" 2>/dev/null && pass "server alive after the hostile shm client" ||
    { fail "server died:"; tail -n 20 "$TMP/shm.log" | sed 's/^/    /'; }
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] &&
    pass "server ready after the hostile shm client" || fail "server not ready afterwards"
"$PYTHON" "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" --binary \
    >"$TMP/after.out" 2>&1 && pass "a plain binary request is still answered correctly" ||
    { fail "plain request after the chaos:"; sed 's/^/    /' "$TMP/after.out"; }
[ "$(curl -s "$URL/v2/systemsharedmemory/status")" = "[]" ] &&
    pass "no region left registered" || fail "regions left: $(curl -s "$URL/v2/systemsharedmemory/status")"

echo "shm chaos: $npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
