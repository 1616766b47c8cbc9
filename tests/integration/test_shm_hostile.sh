#!/bin/sh
# test_shm_hostile.sh — system shared memory registrations from a hostile
# client (issue 50), against the real server run as an unprivileged user
# (as in a pod), where a key naming a FIFO of mode 0444 used to hang it:
# read-write was refused (EACCES), and the read-only open then waited for a
# writer for ever, taking readiness, inference and SIGTERM with it. A FIFO,
# a directory and a symbolic link must be refused with 400 at once, naming
# what the key is; max_shm_regions caps the registrations (each holds an
# fd) and /metrics counts them; the server stays ready, infers correctly
# and ends on SIGTERM.
#
# Run as root (CI) the server drops to nobody with setpriv (or runuser);
# without either the test says SKIPPED. Run as another user, the FIFO's
# 0444 keeps that user out of read-write just the same.
#
# env: TPSERVE (binary), TP_GRAPHS (generated graphs), PYTHON (python3);
#      KEEP_TMP=1 keeps the server log.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
G=mlp_sp_tp2
CAP=3
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_shm_hostile.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"

if [ ! -d /dev/shm ]; then
    echo "SKIPPED: no /dev/shm (POSIX shared memory) on this machine"
    exit 0
fi

# ---- the server as an unprivileged user -------------------------------------
AS=""
if [ "$(id -u)" = 0 ]; then
    if setpriv --reuid=nobody --regid=nogroup --clear-groups true 2>/dev/null; then
        AS="setpriv --reuid=nobody --regid=nogroup --clear-groups"
    elif runuser -u nobody -- true 2>/dev/null; then
        AS="runuser -u nobody --"
    else
        echo "SKIPPED: running as root and neither setpriv nor runuser can switch to nobody"
        exit 0
    fi
fi
# nobody must reach the binary and the graph: copies in a directory it may
# read (the build tree may sit under a private home)
chmod 755 "$TMP"
mkdir "$TMP/graphs"
cp "$TPSERVE" "$TMP/tpserve"
cp "$TP_GRAPHS/$G".* "$TP_GRAPHS/manifest.json" "$TMP/graphs/"
chmod -R a+rX "$TMP/tpserve" "$TMP/graphs"
# exec all the way down, so start's PID is the server itself (setpriv execs;
# runuser stays the parent and passes signals on)
printf '#!/bin/sh\nexec %s "%s" "$@"\n' "$AS" "$TMP/tpserve" >"$TMP/tpserve_as_user"
chmod 755 "$TMP/tpserve_as_user"
TPSERVE="$TMP/tpserve_as_user"

# ---- the odd objects under /dev/shm -----------------------------------------
P=tp_hostile_$$
FIFO=/dev/shm/${P}_fifo DIR=/dev/shm/${P}_dir LINK=/dev/shm/${P}_link OBJ=/dev/shm/${P}_obj
remove_objects() { rm -rf "$FIFO" "$DIR" "$LINK" "$OBJ"; }
trap 'remove_objects; cleanup' EXIT
remove_objects
mkfifo -m 0444 "$FIFO"
mkdir -m 0755 "$DIR"
head -c 4096 /dev/zero >"$OBJ"
chmod 0644 "$OBJ" # readable, not writable, by the server: a read-only region
ln -s "$OBJ" "$LINK"

start hostile --graph "$TMP/graphs/$G.json" --allow-client-shm 1 --max-shm-regions $CAP || exit 1
SRV=$PID
[ -n "$AS" ] && case "$AS" in runuser*) SRV=$(cat /proc/"$PID"/task/*/children | awk '{print $1}') ;; esac
uid=$(awk '/^Uid:/ {print $2}' /proc/"$SRV"/status)
[ "$uid" != 0 ] && pass "server runs as uid $uid" || fail "server runs as root: the FIFO case is not exercised"

# register NAME KEY: the HTTP code and body of the registration, 5 s at most
register() {
    rm -f "$TMP/reg.out"
    curl -s -m 5 -o "$TMP/reg.out" -w '%{http_code}' \
        -d "{\"key\":\"$2\",\"offset\":0,\"byte_size\":16}" "$URL/v2/systemsharedmemory/region/$1/register"
}

# expect_refused NAME KEY WORDS: 400 naming the key and what it is
expect_refused() {
    code=$(register "$1" "$2")
    [ "$code" = 400 ] && grep -q "key '$2' is $3, not a shared memory object" "$TMP/reg.out" &&
        pass "$3 key refused with 400 at once: $(cat "$TMP/reg.out")" ||
        fail "$3 key '$2': HTTP $code (000: none within 5 s), body: $(cat "$TMP/reg.out" 2>/dev/null)"
}

expect_refused fifo "/${P}_fifo" "a FIFO"
expect_refused dir "/${P}_dir" "a directory"
expect_refused link "/${P}_link" "a symbolic link"

ready=$(curl -s -m 5 -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")
[ "$ready" = 200 ] && pass "ready after the refused keys" || fail "readiness after the refused keys: HTTP $ready"
timeout 30 "$PYTHON" "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TMP/graphs" --graph "$G" \
    --binary >"$TMP/infer.out" 2>&1 && pass "an infer after the refused keys is answered correctly" ||
    { fail "infer after the refused keys:"; sed 's/^/    /' "$TMP/infer.out"; }

# ---- the cap ------------------------------------------------------------------
metric() { curl -s -m 5 "$URL/metrics" | awk '$1 == "tpserve_shm_regions" {print $2}'; }
i=0 codes="" want=""
while [ $i -lt $CAP ]; do
    codes="$codes $(register "r$i" "/${P}_obj")"
    want="$want 200"
    i=$((i + 1))
done
[ "$codes" = "$want" ] && pass "$CAP regions registered" || fail "registering $CAP regions:$codes"
[ "$(metric)" = $CAP ] && pass "tpserve_shm_regions $CAP" || fail "tpserve_shm_regions $(metric), want $CAP"
code=$(register over "/${P}_obj")
[ "$code" = 400 ] && grep -q "limit of $CAP registered regions (max_shm_regions)" "$TMP/reg.out" &&
    grep -q "/${P}_obj" "$TMP/reg.out" && pass "region $((CAP + 1)) refused: $(cat "$TMP/reg.out")" ||
    fail "region $((CAP + 1)): HTTP $code: $(cat "$TMP/reg.out")"
code=$(register r0 "/${P}_obj")
[ "$code" = 400 ] && grep -q "already registered" "$TMP/reg.out" && pass "a registered name is still told so" ||
    fail "re-registering r0: HTTP $code: $(cat "$TMP/reg.out")"
curl -s -m 5 -o /dev/null -X POST "$URL/v2/systemsharedmemory/region/r1/unregister"
code=$(register over "/${P}_obj")
[ "$code" = 200 ] && pass "after one unregister, one more registers" || fail "after unregistering r1: HTTP $code: $(cat "$TMP/reg.out")"
curl -s -m 5 -o /dev/null -X POST "$URL/v2/systemsharedmemory/unregister"
[ "$(metric)" = 0 ] && [ "$(curl -s -m 5 "$URL/v2/systemsharedmemory/status")" = "[]" ] &&
    pass "all unregistered: tpserve_shm_regions 0" || fail "after unregistering all: tpserve_shm_regions $(metric)"

# ---- SIGTERM ends it ----------------------------------------------------------
# a watchdog bounds the wait: the old server never finished with a thread
# stuck in open() on the FIFO
kill -TERM "$SRV"
(sleep 20 && kill -9 "$SRV" 2>/dev/null) &
WD=$!
wait "$PID"
rc=$?
kill "$WD" 2>/dev/null
[ $rc -eq 0 ] && pass "SIGTERM: exit 0" || { fail "SIGTERM: exit $rc (137: killed after 20 s)"; tail -n 5 "$TMP/hostile.log" | sed 's/^/    /'; }

echo "shm hostile: $npass passed, $nfail failed"
[ "$nfail" -eq 0 ]
