#!/bin/sh
# test_cuda_double_server.sh — `tpserve serve --backend cuda --ranks
# processes` on the CUDA/NCCL/cuBLASLt test double (tests/cuda_double,
# TP_DOUBLE_FAIL injection points), a 2-rank graph, no GPU:
#  - healthy: readiness 200, an inference answered 200 with the reference's
#    output names and shapes (the double computes no values), SIGTERM exits
#    0 with no worker left;
#  - a failure at serve time (replay, NCCL async error, a stalled
#    collective, peer death mid-replay, a bad id together with an NCCL
#    error, on the worker rank 1 or the leader rank 0), under requests on
#    three connections: every request in flight gets an error naming the
#    rank (or its connection ends, when the process dies), readiness (a
#    probe kept alive, polled every 20 ms) turns 503 before the process
#    exits, the server exits non-zero within 20 s, and no process of the
#    group is left; a leader that dies (die:0) cannot answer anything: its
#    worker must still leave;
#  - a failure at startup (alloc, window, NCCL init, capture, a stalled
#    collective at warm-up): the server never becomes ready, exits non-zero
#    within 20 s saying why and naming the rank, and leaves no process;
#  - a benign bad id (embedding, gather): a 400 naming the rank and the id,
#    readiness stays 200, the next request is answered 200;
#  - a worker killed (kill -9) while idle: readiness and liveness 503 within
#    1 s, the server stays up (nothing was in flight: no rank revoked) until
#    SIGTERM, which exits at once leaving nothing.
# Each also checks the double saw no rule broken (TP_DOUBLE_LOG stays empty).
# A table (point, what happened, ms to 503, ms to exit, exit status) is
# printed at the end.
#
# env: TPSERVE_DBL (build/tests/tpserve_dbl: tpserve linked against the
# double, built only when the CUDA headers exist), TP_GRAPHS, PYTHON;
# KEEP_TMP=1 keeps the logs. Run by `make cuda-double` (part of `make
# test`), which sets TPSERVE_DBL; the integration glob runs this file too,
# without it, and then it says skipped (TPSERVE is the real server, which
# must never load the double).
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
if [ -z "${TPSERVE_DBL:-}" ]; then
    echo "SKIP: the server on the cuda double: skipped: TPSERVE_DBL not set (make cuda-double runs this test)"
    exit 0
fi
if [ ! -x "$TPSERVE_DBL" ]; then
    echo "SKIP: the server on the cuda double: skipped: no $TPSERVE_DBL (built only with the CUDA headers)"
    exit 0
fi
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_dblsrv.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
TPSERVE=$(cd "$(dirname "$TPSERVE_DBL")" && pwd)/$(basename "$TPSERVE_DBL")
BOUND_MS=20000

# The double's setup, as the host tests have it: one "device" per rank
# (LOCAL_RANK: the leader sets its workers'), a shared rule log, a short
# hang limit; small device buffers.
export TP_DOUBLE_DEVICES=2 TP_DOUBLE_LOG="$TMP/rules.log" TP_DOUBLE_HANG_MS=10000
unset TP_DOUBLE_FAIL TP_DOUBLE_SYMMETRIC LOCAL_RANK TP_RANK 2>/dev/null
SMALL="--cuda-scratch-mb 1 --cuda-gemm-workspace-mb 1"

now_ms() { echo $(($(date +%s%N) / 1000000)); }

# group_left: processes of this binary started by this test (their
# environment names $TMP) still running, zombies excluded.
group_left() {
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/exe" 2>/dev/null)" = "$TPSERVE" ] || continue
        tr '\0' '\n' <"$p/environ" 2>/dev/null | grep -qx "TP_DOUBLE_LOG=$TMP/rules.log" || continue
        st=$(awk '{ print $3 }' "$p/stat" 2>/dev/null)
        [ -n "$st" ] && [ "$st" != Z ] && printf '%s ' "${p#/proc/}"
    done
}

# wait_gone: until no process of the group is left (2 s at most); the
# leader is gone already, its workers may take a moment to see it.
wait_gone() {
    i=0
    while [ -n "$(group_left)" ] && [ $i -lt 20 ]; do sleep 0.1; i=$((i + 1)); done
    LEFT=$(group_left)
    for p in $LEFT; do kill -9 "$p" 2>/dev/null; done
    [ -z "$LEFT" ]
}

# wait_exit T0_MS: until the server PID exits (BOUND_MS after T0_MS at
# most; then it is killed: a hang). Sets RC (its status) and EXIT_MS.
wait_exit() {
    while kill -0 "$PID" 2>/dev/null && [ "$(ps -o stat= -p "$PID" | cut -c1)" != Z ] &&
        [ $(($(now_ms) - $1)) -lt $BOUND_MS ]; do
        sleep 0.05
    done
    EXIT_MS=$(($(now_ms) - $1))
    HUNG=0
    if [ "$(ps -o stat= -p "$PID" 2>/dev/null | cut -c1)" != Z ] && kill -0 "$PID" 2>/dev/null; then
        HUNG=1
        kill -9 "$PID" 2>/dev/null
    fi
    wait "$PID" 2>/dev/null
    RC=$?
}

# The readiness watcher: one kept-alive connection (as a load balancer's
# probe), polled every 20 ms for up to BOUND_MS; prints "EPOCH_MS CODE" at
# each change (0: no answer). Python takes up to a second to start on a
# loaded machine: it is started once the server is ready, and the requests
# only once it has seen readiness. Stops once the server refuses or drops three
# polls in a row after answering one (it is gone), or 2 s after it began
# without an answer.
cat >"$TMP/watch.py" <<'EOF'
import http.client, sys, time
port, limit = int(sys.argv[1]), float(sys.argv[2]) / 1000
t0, c, last, gone, seen = time.time(), None, None, 0, False
while time.time() - t0 < limit and not (gone >= 3 and (seen or time.time() - t0 > 2)):
    try:
        if c is None:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        c.request("GET", "/v2/health/ready")
        r = c.getresponse()
        r.read()
        code, gone, seen = r.status, 0, True
        if (r.getheader("Connection") or "").lower() == "close":
            c.close()
            c = None
    except (OSError, http.client.HTTPException):
        c, code, gone = None, 0, gone + 1
    if code != last:
        print("%d %d" % (time.time() * 1000, code), flush=True)
        last = code
    time.sleep(0.02)
EOF

# The reference's output names and shapes against an answer's.
cat >"$TMP/shapes.py" <<'EOF'
import json, struct, sys
doc = json.load(open(sys.argv[1]))
with open(sys.argv[2], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    ref = {k: v["shape"] for k, v in json.loads(f.read(n)).items() if k != "__metadata__"}
got = {o["name"]: o["shape"] for o in doc["outputs"]}
if got != ref:
    print("outputs %s, reference %s" % (got, ref))
    sys.exit(1)
print(" ".join("%s%s" % (k, v) for k, v in sorted(got.items())))
EOF

# A 2-rank graph with a gather (no example has one), replicated.
cat >"$TMP/gather.py" <<'EOF'
import json, struct, sys
d = sys.argv[1]
json.dump({"format": "tpgraph", "version": 1, "name": "gather_tp2", "world_size": 2,
           "weights": "gather_tp2.safetensors",
           "inputs": [{"name": "ids", "datatype": "INT32", "shape": ["B", 2], "placement": "replicate"}],
           "params": [{"name": "w", "datatype": "FP32", "shape": [8, 4], "placement": "replicate"}],
           "nodes": [{"name": "g", "op": "gather", "inputs": ["w", "ids"], "attrs": {"dim": 0}}],
           "outputs": [{"name": "g", "placement": "replicate"}]}, open(d + "/gather_tp2.json", "w"))
h = json.dumps({"w": {"dtype": "F32", "shape": [8, 4], "data_offsets": [0, 128]}}).encode()
h += b" " * (-len(h) % 8)
with open(d + "/gather_tp2.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h + struct.pack("<32f", *range(32)))
json.dump({"inputs": [{"name": "ids", "shape": [3, 2], "datatype": "INT32", "data": [0, 1, 2, 3, 4, 5]}]},
          open(d + "/gather_tp2.body", "w"))
EOF
$PYTHON "$TMP/gather.py" "$TMP" || fail "cannot write the gather graph"
for g in mlp_sp_tp2 vocab_embed_i32_tp2 megatron_block_tp2; do
    $PYTHON "$HERE/kserve_client.py" make --graphs "$TP_GRAPHS" --graph $g --out "$TMP/$g.body" >/dev/null ||
        fail "cannot make a request for $g"
done
graph_path() { if [ "$1" = gather_tp2 ]; then echo "$TMP/$1.json"; else echo "$TP_GRAPHS/$1.json"; fi; }

# infer G [FILE]: one request; prints its status, the body goes to FILE.
infer() {
    curl -s -m 20 -o "${2:-/dev/null}" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$TMP/$1.body" "$URL/v2/models/$1/infer"
}
ready_code() { curl -s -m 2 -o /dev/null -w '%{http_code}' "$URL/v2/health/ready"; }

# client N G: requests one after another until one is not 200 (40 at
# most): "CODE COUNT" in $TMP/client.N, the last body in $TMP/client.N.body.
client() {
    k=0
    while [ $k -lt 40 ]; do
        c=$(infer "$2" "$TMP/client.$1.body")
        [ "$c" = 200 ] || break
        k=$((k + 1))
    done
    echo "$c $k" >"$TMP/client.$1"
}

rules_clean() {
    [ ! -s "$TMP/rules.log" ] && return 0
    fail "$1: the double saw rules broken: $(head -3 "$TMP/rules.log")"
    : >"$TMP/rules.log"
    return 1
}

TABLE=""
row() { TABLE="$TABLE$(printf '| %-34s | %-19s | %-64.64s | %6s | %6s | %s |' "$@")
"; }

# 1. healthy
if start healthy --graph "$TP_GRAPHS/mlp_sp_tp2.json" --backend cuda --ranks processes $SMALL; then
    pass "healthy: ready 200 on the cuda double, 2 ranks in processes"
    c=$(infer mlp_sp_tp2 "$TMP/ok.json")
    s=$($PYTHON "$TMP/shapes.py" "$TMP/ok.json" "$TP_GRAPHS/mlp_sp_tp2.ref.safetensors" 2>&1)
    src=$?
    [ "$c" = 200 ] && [ "$src" = 0 ] && pass "healthy: an inference answered 200, outputs $s" ||
        fail "healthy: inference $c: $s $(head -c 300 "$TMP/ok.json")"
    t0=$(now_ms)
    kill "$PID"
    wait_exit "$t0"
    wait_gone && [ "$RC" = 0 ] && pass "healthy: SIGTERM: exit 0 in $EXIT_MS ms, no worker left" ||
        fail "healthy: SIGTERM: exit $RC (hung: $HUNG), left: $LEFT"
    rules_clean healthy
    row "(none)" "healthy" "200, shapes $s" - "$EXIT_MS" "$RC"
fi

# 2. failures at serve time: POINT GRAPH RANK (the rank the error must name)
serve_failure() {
    fp=$1 g=$2 rank=$3
    export TP_DOUBLE_FAIL="$fp"
    name=$(echo "$fp" | tr ':,' '__')
    if ! start "$name" --graph "$(graph_path "$g")" --backend cuda --ranks processes $SMALL; then
        unset TP_DOUBLE_FAIL
        wait_gone
        row "$fp" "serve time" "FAILED AT STARTUP" - - -
        return
    fi
    unset TP_DOUBLE_FAIL
    $PYTHON "$TMP/watch.py" "$PORT" "$BOUND_MS" >"$TMP/watch.$name" 2>&1 &
    # its probe connection is open (readiness seen 200) before any request
    i=0
    while [ ! -s "$TMP/watch.$name" ] && [ $i -lt 100 ]; do sleep 0.02; i=$((i + 1)); done
    t0=$(now_ms)
    for n in 1 2 3; do client "$n" "$g" & done
    wait_exit "$t0"
    wait # the clients and the watcher
    what="exit $RC"
    [ "$HUNG" = 1 ] && fail "$fp: the server still ran $BOUND_MS ms after the requests began (killed)"
    [ "$RC" != 0 ] && [ "$HUNG" = 0 ] && pass "$fp: the server exited with status $RC, $EXIT_MS ms after the requests began" ||
        fail "$fp: exit status $RC (hung: $HUNG)"
    # every client's last request: an error naming the rank, or its connection ended
    named=0 bad="" first=""
    for n in 1 2 3; do
        read -r code count <"$TMP/client.$n"
        body=$(head -c 400 "$TMP/client.$n.body" 2>/dev/null)
        if [ "$code" = 000 ]; then
            :
        elif [ "$code" -ge 400 ] && echo "$body" | grep -q "rank $rank"; then
            named=$((named + 1))
            [ -n "$first" ] || first="$code $body"
        else
            bad="$bad [client $n after $count: $code $body]"
        fi
    done
    if [ "$rank" = 0 ] && [ "${fp%%:*}" = die ]; then
        # the leader itself died: nobody is left to answer
        [ -z "$bad" ] && pass "$fp: the leader died; every request's connection ended" ||
            fail "$fp: answers:$bad"
        first="connections ended (leader gone)"
    else
        [ -z "$bad" ] && [ "$named" -gt 0 ] &&
            pass "$fp: in-flight requests: $named answered with an error naming rank $rank, the rest's connections ended" ||
            fail "$fp: answers not naming rank $rank:$bad (named: $named)"
    fi
    # readiness: 200, then 503 while the process still answered
    t503=$(awk -v t0="$t0" '$2 == 503 { print $1 - t0; exit }' "$TMP/watch.$name")
    if [ "$rank" = 0 ] && [ "${fp%%:*}" = die ]; then
        t503=-
    elif [ -n "$t503" ] && head -1 "$TMP/watch.$name" | grep -q ' 200$'; then
        pass "$fp: readiness 200, then 503 at $t503 ms, before the process exited ($EXIT_MS ms)"
    else
        fail "$fp: readiness never seen 503 before the exit: $(tr '\n' ' ' <"$TMP/watch.$name")"
        t503=never
    fi
    wait_gone && pass "$fp: no process of the group left" || fail "$fp: processes left: $LEFT"
    rules_clean "$fp"
    grep -q "rank $rank" "$TMP/$name.log" || fail "$fp: the log does not name rank $rank"
    row "$fp" "$g" "$(echo "$first" | tr -s '\n' ' ')" "$t503" "$EXIT_MS" "$RC"
}

serve_failure replay:1:1 mlp_sp_tp2 1
serve_failure replay:0:1 mlp_sp_tp2 0
serve_failure nccl_async:1:33 mlp_sp_tp2 1
serve_failure nccl_stall:1:22 mlp_sp_tp2 1
serve_failure die:1:1 megatron_block_tp2 1
serve_failure die:0:1 mlp_sp_tp2 0
serve_failure embed_id:1:1,nccl_async:1:21 vocab_embed_i32_tp2 1

# 3. failures at startup
startup_failure() {
    fp=$1 rank=$2
    export TP_DOUBLE_FAIL="$fp"
    name=$(echo "$fp" | tr ':,' '__')
    t0=$(now_ms)
    launch "$name" --graph "$TP_GRAPHS/mlp_sp_tp2.json" --backend cuda --ranks processes $SMALL
    unset TP_DOUBLE_FAIL
    # readiness from the first moment (curl: Python may start too late): never 200
    : >"$TMP/ready.$name"
    while kill -0 "$PID" 2>/dev/null && [ "$(ps -o stat= -p "$PID" | cut -c1)" != Z ] &&
        [ $(($(now_ms) - t0)) -lt $BOUND_MS ]; do
        ready_code >>"$TMP/ready.$name"
        echo >>"$TMP/ready.$name"
        sleep 0.02
    done
    wait_exit "$t0"
    polls=$(sort "$TMP/ready.$name" | uniq -c | awk '{ printf "%s %sx ", $2, $1 }')
    msg=$(grep -m1 "cannot load graph" "$TMP/$name.log" | sed 's/.*cannot load graph [^:]*: //')
    [ "$RC" != 0 ] && [ "$HUNG" = 0 ] && echo "$msg" | grep -q "rank $rank" &&
        pass "$fp: startup failed in $EXIT_MS ms, exit $RC: $(echo "$msg" | cut -c1-110)" ||
        fail "$fp: exit $RC (hung: $HUNG), message: $(tail -3 "$TMP/$name.log")"
    # (a load this short may end before curl's first poll is answered: 503
    # or no answer, never 200, and no "ready:" line)
    ! grep -q "ready: graph=" "$TMP/$name.log" && ! grep -qx 200 "$TMP/ready.$name" &&
        pass "$fp: never ready (readiness polled while it ran: $polls)" || fail "$fp: readiness polled: $polls"
    wait_gone && pass "$fp: no process of the group left" || fail "$fp: processes left: $LEFT"
    rules_clean "$fp"
    row "$fp" "startup" "$(echo "$msg" | cut -c1-64)" never "$EXIT_MS" "$RC"
}

startup_failure alloc:1:1 1
startup_failure alloc:0:3 0
startup_failure window:1:1 1
startup_failure comm_init:1:1 1
startup_failure capture:1:1 1
startup_failure nccl_stall:1:10 1

# 4. a benign bad id: 400 naming the rank and the id, still ready, the next
# request runs
benign() {
    fp=$1 g=$2 rank=$3 word=$4
    export TP_DOUBLE_FAIL="$fp"
    name=$(echo "$fp" | tr ':,' '__')
    if ! start "$name" --graph "$(graph_path "$g")" --backend cuda --ranks processes $SMALL; then
        unset TP_DOUBLE_FAIL
        wait_gone
        row "$fp" "$g" "FAILED AT STARTUP" - - -
        return
    fi
    unset TP_DOUBLE_FAIL
    client 1 "$g"
    read -r code count <"$TMP/client.1"
    body=$(head -c 300 "$TMP/client.1.body")
    [ "$code" = 400 ] && echo "$body" | grep -q "rank $rank" && echo "$body" | grep -q "$word" &&
        pass "$fp: request $((count + 1)): 400 naming rank $rank and the $word: $body" ||
        fail "$fp: request $((count + 1)): $code $body"
    r=$(ready_code)
    c=$(infer "$g")
    [ "$r" = 200 ] && [ "$c" = 200 ] && pass "$fp: still ready (200), the next request answered 200" ||
        fail "$fp: after the bad id: ready $r, next request $c"
    t0=$(now_ms)
    kill "$PID"
    wait_exit "$t0"
    wait_gone && [ "$RC" = 0 ] && pass "$fp: SIGTERM: exit 0, no worker left" ||
        fail "$fp: SIGTERM: exit $RC (hung: $HUNG), left: $LEFT"
    rules_clean "$fp"
    row "$fp" "$g" "$code $(echo "$body" | cut -c1-60)" "stays 200" "$EXIT_MS" "$RC"
}

benign embed_id:1:1 vocab_embed_i32_tp2 1 embedding
benign gather_id:1:8 gather_tp2 1 gather

# 5. a worker killed while idle (GPU_ASSUMPTIONS.md section 9, step 3,
# without the load): nothing was in flight, so no rank revoked and the
# device needs no process exit (cuda_backend.h, "After an abort"): the
# server stays up, not ready and not live, until its orchestrator stops it;
# SIGTERM then exits at once and leaves nothing.
if start idle_kill --graph "$TP_GRAPHS/mlp_sp_tp2.json" --backend cuda --ranks processes $SMALL; then
    c=$(infer mlp_sp_tp2)
    w=$(pgrep -P "$PID" | tr '\n' ' ')
    t0=$(now_ms)
    # shellcheck disable=SC2086
    kill -9 $w
    while [ "$(ready_code)" != 503 ] && [ $(($(now_ms) - t0)) -lt 5000 ]; do sleep 0.02; done
    t503=$(($(now_ms) - t0))
    live=$(curl -s -m 2 -o /dev/null -w '%{http_code}' "$URL/v2/health/live")
    [ "$c" = 200 ] && [ "$t503" -lt 1000 ] && [ "$live" = 503 ] && grep -q "rank 1 .*killed by signal 9" "$TMP/idle_kill.log" &&
        pass "kill -9 of an idle worker: readiness 503 after $t503 ms, liveness 503, the log names rank 1" ||
        fail "kill -9 of an idle worker: request $c, 503 after $t503 ms, live $live: $(grep -i 'lost' "$TMP/idle_kill.log")"
    t0=$(now_ms)
    kill "$PID"
    wait_exit "$t0"
    [ "$HUNG" = 0 ] && wait_gone && pass "kill -9 of an idle worker: SIGTERM: exit $RC in $EXIT_MS ms, nothing left" ||
        fail "kill -9 of an idle worker: SIGTERM: exit $RC (hung: $HUNG), left: $LEFT"
    rules_clean idle_kill
    row "(kill -9 rank 1, idle)" "mlp_sp_tp2" "$(grep -m1 -o 'rank group lost: [^:]*' "$TMP/idle_kill.log")" \
        "$t503" "SIGTERM $EXIT_MS" "$RC"
fi

echo "| TP_DOUBLE_FAIL                     | where               | first answer / message                                           | 503 ms | exit ms | status"
printf '%s' "$TABLE"
echo "test_cuda_double_server: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
