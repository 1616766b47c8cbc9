# server.sh — shared by the integration tests that start a real server
# (sourced, not run: it sits outside the tests/integration/*.sh glob).
# The caller sets TMP (a fresh directory) and PYTHON before sourcing.
# shellcheck shell=sh
PIDS=""
npass=0
nfail=0

pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }

cleanup() {
    for p in $PIDS; do kill -9 "$p" 2>/dev/null; done
    if [ -n "${KEEP_TMP:-}" ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# switches_over PID SECONDS: the context switches of every thread of PID
# and of its child processes (rank workers) over SECONDS.
switches_over() {
    count() {
        for p in "$1" $(cat /proc/"$1"/task/*/children 2>/dev/null); do cat /proc/"$p"/task/*/status 2>/dev/null; done |
            awk '/ctxt_switches/ { s += $2 } END { print s + 0 }'
    }
    a=$(count "$1")
    sleep "$2"
    echo $(($(count "$1") - a))
}

# wait_log FILE TEXT: until FILE has a line with TEXT (5 s at most); 1 if
# it never came. WAITED_MS: how long it took.
wait_log() {
    WAITED_MS=0
    while [ $WAITED_MS -lt 5000 ] && ! grep -q "$2" "$1"; do
        sleep 0.1; WAITED_MS=$((WAITED_MS + 100))
    done
    grep -q "$2" "$1"
}

free_port() {
    $PYTHON -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# launch NAME ARGS...: `tpserve serve ARGS` on a fresh port in the
# background, not waited for; sets PORT, PID, URL; the log is $TMP/NAME.log.
launch() {
    name=$1
    shift
    PORT=$(free_port)
    URL="http://127.0.0.1:$PORT"
    "$TPSERVE" serve --port "$PORT" "$@" >"$TMP/$name.log" 2>&1 &
    PID=$!
    PIDS="$PIDS $PID"
}

# start NAME ARGS...: launch, then wait until ready (30 s at most).
start() {
    launch "$@"
    i=0
    while [ $i -lt 300 ]; do
        if ! kill -0 "$PID" 2>/dev/null; then
            fail "$name: server exited during startup:"
            sed 's/^/    /' "$TMP/$name.log"
            return 1
        fi
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    fail "$name: not ready after 30 s"
    return 1
}
