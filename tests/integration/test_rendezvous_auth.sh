#!/bin/sh
# test_rendezvous_auth.sh — who may join a leader's rendezvous socket
# (ranks=processes with --rendezvous). Impostors reach the socket before
# the real rank 1: one that says nothing, one sending the hello without a
# group secret (as every rank did before secrets), one with a wrong secret,
# and one running as another user (nobody, via setpriv or runuser; skipped
# with a message where neither works). Each is refused with why, and the
# leader's log names each (pid, uid, why); none takes rank 1's slot: the
# real `tpserve worker` then joins, the server becomes ready and answers
# an infer with the reference numbers. The leader's own secret file is
# 0600 and gone once the ranks joined. A rendezvous_secret_file open to
# others stops the server at startup, saying so; a good one works with
# `worker --rendezvous-secret-file`; a worker without the secret says
# which file it could not read; rendezvous_uid admits that user.
#
# Before, the first hello for rank 1 got the group's memory (every rank's
# heap, the requests' staging) and the real rank was refused as "already
# joined", and one that sent part of a hello held the leader for ever.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_rdv.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
TPSERVE=$(cd "$(dirname "$TPSERVE")" && pwd)/$(basename "$TPSERVE")
G=mlp_sp_tp2

# An impostor: connects to SOCK (waiting for it), says MODE's bytes, writes
# its pid to READY, then the leader's answer (or "(closed)") to ANSWER.
cat >"$TMP/impostor.py" <<'EOF'
import os, socket, struct, sys, time
mode, path, ready, answer = sys.argv[1:5]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
for _ in range(600):
    try:
        s.connect(path)
        break
    except OSError:
        time.sleep(0.05)
else:
    sys.exit("impostor %s: no socket at %s" % (mode, path))
hello = struct.pack("<Iiii", 0x74707267, 1, 2, os.getpid())  # rank 1 of 2, as a real rank says it
if mode == "nosecret":
    s.sendall(hello)  # the hello before group secrets
elif mode == "wrongsecret":
    s.sendall(hello + os.urandom(32).hex().encode())
if mode != "silent":
    s.shutdown(socket.SHUT_WR)
open(ready, "w").write("%d\n" % os.getpid())
got = b""
while True:
    b = s.recv(4096)
    if not b:
        break
    got += b
text = got.split(b"\0")[0].decode(errors="replace")
open(answer, "w").write(text or "(closed)")
EOF

# as_nobody CMD...: CMD as user nobody (65534), or 1 when that cannot be
# done here (not root, no setpriv or runuser)
as_nobody() {
    if setpriv --reuid=65534 --regid=65534 --clear-groups true 2>/dev/null; then
        setpriv --reuid=65534 --regid=65534 --clear-groups "$@"
    elif runuser -u nobody -- true 2>/dev/null; then
        runuser -u nobody -- "$@"
    else
        return 1
    fi
}
NOBODY=0
as_nobody true 2>/dev/null && NOBODY=1
# a Python nobody can run ($PYTHON may live in root's home, e.g. pyenv's)
NOBODY_PY=""
for py in "$($PYTHON -c 'import sys; print(sys.executable)')" /usr/bin/python3; do
    [ $NOBODY = 1 ] && [ -z "$NOBODY_PY" ] && as_nobody "$py" -c pass 2>/dev/null && NOBODY_PY=$py
done

# impostor MODE [nobody]: starts one and waits until it is connected, so
# the leader admits it before whoever connects next; IMP_PID is the
# background job, IMP_SELF the impostor's own pid (the leader logs that).
impostor() {
    if [ "${2:-}" = nobody ]; then
        as_nobody "$NOBODY_PY" "$TMP/impostor.py" "$1" "$SOCK" "$TMP/imp/$1.ready" "$TMP/imp/$1.answer" &
    else
        "$PYTHON" "$TMP/impostor.py" "$1" "$SOCK" "$TMP/imp/$1.ready" "$TMP/imp/$1.answer" &
    fi
    IMP_PID=$!
    PIDS="$PIDS $IMP_PID"
    i=0
    while [ $i -lt 300 ] && [ ! -s "$TMP/imp/$1.ready" ] && kill -0 $IMP_PID 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    IMP_SELF=$(cat "$TMP/imp/$1.ready" 2>/dev/null)
}


# wait_ready: until the server answers ready (60 s at most: the impostors
# cost the rendezvous a few seconds); 1 if it never does or exits.
wait_ready() {
    i=0
    while [ $i -lt 600 ] && kill -0 "$PID" 2>/dev/null; do
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# wait_socket: until SOCK exists (30 s at most).
wait_socket() {
    i=0
    while [ $i -lt 300 ] && [ ! -S "$SOCK" ]; do sleep 0.1; i=$((i + 1)); done
    [ -S "$SOCK" ]
}

# 1. impostors first, then the real rank
mkdir "$TMP/rdv" "$TMP/imp"
# nobody must reach the socket to be refused by the leader, and write its answer
chmod 711 "$TMP" "$TMP/rdv"
chmod 1777 "$TMP/imp"
SOCK="$TMP/rdv/tp.sock"
launch auth --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK"
if wait_socket; then
    mode=$(stat -c %a "$SOCK.secret" 2>/dev/null)
    [ "$mode" = 600 ] && grep -q "group secret written to '$SOCK.secret' (mode 0600" "$TMP/auth.log" &&
        pass "the leader writes its group secret to $SOCK.secret, mode 0600, and logs where" ||
        fail "the secret file: mode '$mode'; $(grep -m1 secret "$TMP/auth.log")"
    chmod 777 "$SOCK"
    impostor silent;      P_SILENT=$IMP_SELF; J="$IMP_PID"
    impostor nosecret;    P_NOSECRET=$IMP_SELF; J="$J $IMP_PID"
    impostor wrongsecret; P_WRONG=$IMP_SELF; J="$J $IMP_PID"
    if [ -n "$NOBODY_PY" ]; then
        impostor other nobody
        P_OTHER=$IMP_SELF; J="$J $IMP_PID"
    else
        echo "SKIP: an impostor of another uid: skipped: cannot run Python as nobody here (not root, no setpriv/runuser, or no Python it may run)"
    fi
    RANK=1 WORLD_SIZE=2 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK" >"$TMP/w1.log" 2>&1 &
    W1=$!
    PIDS="$PIDS $W1"
    if wait_ready; then
        pass "impostors at the rendezvous first: the real rank 1 still joins and the server is ready"
        $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
            pass "infer across the leader and the real rank matches the reference" || fail "infer: $(tail -3 "$TMP/c")"
    else
        fail "not ready with the real rank: $(tail -3 "$TMP/auth.log"); rank: $(tail -2 "$TMP/w1.log")"
    fi
    [ ! -e "$SOCK.secret" ] && pass "the secret file is gone once the ranks joined" || fail "$SOCK.secret left behind"
    for j in $J; do wait "$j" 2>/dev/null; done
    check_impostor() { # NAME PID UID ANSWER
        ans=$(cat "$TMP/imp/$1.answer" 2>/dev/null)
        case $ans in
        "error: $4"*) ;;
        *) fail "impostor $1 (pid $2): answered '$ans', not 'error: $4...'"; return ;;
        esac
        grep -q "rendezvous '$SOCK': refused a joiner (pid $2, uid $3): $4" "$TMP/auth.log" &&
            pass "impostor $1 refused ('$ans'), logged with its pid $2 and uid $3" ||
            fail "impostor $1: no log line naming pid $2, uid $3: $(grep refused "$TMP/auth.log")"
    }
    me=$(id -u)
    check_impostor silent "$P_SILENT" "$me" "not a tpserve rank"
    check_impostor nosecret "$P_NOSECRET" "$me" "the hello has no whole group secret"
    check_impostor wrongsecret "$P_WRONG" "$me" "wrong group secret"
    [ -n "$NOBODY_PY" ] && check_impostor other "$P_OTHER" 65534 "uid 65534 may not join"
    kill "$PID"
    wait "$PID" 2>/dev/null
    wait "$W1" 2>/dev/null && pass "the real rank exits 0 when the leader stops" || fail "real rank: $(tail -2 "$TMP/w1.log")"
else
    fail "no rendezvous socket: $(tail -3 "$TMP/auth.log")"
fi

# 2. the operator's secret file: refused when others may read it; used
# as it is (and left in place) when 0600; a rank without it says so
KEY="$TMP/group.key"
$PYTHON -c 'import os; print(os.urandom(32).hex())' >"$KEY"
chmod 644 "$KEY"
PORT=$(free_port)
"$TPSERVE" serve --port "$PORT" --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$TMP/k.sock" \
    --rendezvous-secret-file "$KEY" >"$TMP/key644.log" 2>&1
rc=$?
[ "$rc" != 0 ] && grep -q "rendezvous secret file '$KEY' is open to group or others (mode 0644): chmod 600 it" "$TMP/key644.log" &&
    pass "a rendezvous_secret_file of mode 0644: the server refuses to start, saying so" ||
    fail "secret file 0644: rc=$rc $(tail -2 "$TMP/key644.log")"
chmod 600 "$KEY"
SOCK="$TMP/k.sock"
launch key --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK" --rendezvous-secret-file "$KEY"
# (bounded: a rank let in without the secret would serve until the leader ends)
RANK=1 WORLD_SIZE=2 timeout 60 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK" >"$TMP/wk0.log" 2>&1
grep -q "cannot open: No such file" "$TMP/wk0.log" && grep -q "$SOCK.secret" "$TMP/wk0.log" &&
    pass "a rank without the group secret fails, naming the file it could not read" ||
    fail "rank without the secret: $(cat "$TMP/wk0.log")"
RANK=1 WORLD_SIZE=2 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK" --rendezvous-secret-file "$KEY" \
    >"$TMP/wk.log" 2>&1 &
WK=$!
PIDS="$PIDS $WK"
if wait_ready && $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1; then
    pass "rendezvous_secret_file 0600 and worker --rendezvous-secret-file: joined, infer matches"
else
    fail "secret file: $(tail -2 "$TMP/key.log"); rank: $(tail -2 "$TMP/wk.log"); $(tail -2 "$TMP/c")"
fi
[ -e "$KEY" ] && [ ! -e "$SOCK.secret" ] && pass "the operator's secret file is left alone, none written" ||
    fail "key files: $(ls "$TMP")"
kill "$PID"
wait "$PID" 2>/dev/null
wait "$WK" 2>/dev/null

# 3. rendezvous_uid: a rank running as that user joins (its own copy of
# the secret, 0600, owned by it, passed by TP_RENDEZVOUS_SECRET_FILE)
if [ $NOBODY = 1 ] && as_nobody test -r "$TP_GRAPHS/$G.json" 2>/dev/null && as_nobody test -x "$TPSERVE" 2>/dev/null; then
    SOCK="$TMP/rdv/u.sock"
    cp "$KEY" "$TMP/rdv/nobody.key"
    chown 65534 "$TMP/rdv/nobody.key"
    chmod 600 "$TMP/rdv/nobody.key"
    launch uid --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK" --rendezvous-secret-file "$KEY" \
        --rendezvous-uid 65534
    if wait_socket; then
        chmod 777 "$SOCK"
        as_nobody env RANK=1 WORLD_SIZE=2 TP_RENDEZVOUS_SECRET_FILE="$TMP/rdv/nobody.key" \
            "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK" >"$TMP/wu.log" 2>&1 &
        WU=$!
        PIDS="$PIDS $WU"
        wait_ready && $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
            pass "rendezvous_uid 65534: a rank running as nobody joins, infer matches" ||
            fail "rendezvous_uid: $(tail -2 "$TMP/uid.log"); rank: $(tail -2 "$TMP/wu.log")"
        kill "$PID"
        wait "$PID" 2>/dev/null
        wait "$WU" 2>/dev/null
    else
        fail "rendezvous_uid: no socket: $(tail -2 "$TMP/uid.log")"
    fi
else
    echo "SKIP: rendezvous_uid: skipped: cannot run a rank as nobody here (the graphs or tpserve unreadable to it, or no setpriv/runuser)"
fi

echo "test_rendezvous_auth: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
