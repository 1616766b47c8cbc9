#!/bin/sh
# test_processes.sh — one process per rank (ranks=processes), on the cpu
# backend: every example graph gives its reference numbers with the ranks in
# separate processes (tpserve run); the server spawns world_size-1 workers
# and answers correctly; an idle server (ranks as threads or processes)
# does not wake; SIGKILL of a worker is logged at once, naming the rank and
# signal, with no request made, turns readiness and liveness 503, requests
# get 503 naming it, and SIGTERM still exits at once; a normal SIGTERM leaves no worker
# behind; external ranks (`tpserve worker --rendezvous`, RANK/WORLD_SIZE)
# join a leader, also from a pid namespace of their own, and a rank started
# with other options or another world size
# is refused with a message saying so; the shared staging fits the largest
# bucket by default, and a smaller one asked for is a load error naming the
# size that fits; a stopped worker loses the group at step_timeout_ms.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_procs.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
TPSERVE=$(cd "$(dirname "$TPSERVE")" && pwd)/$(basename "$TPSERVE")

# workers PID: the worker processes the server PID spawned.
workers() { pgrep -P "$1" -f "tpserve.* worker|exe worker" 2>/dev/null | tr '\n' ' '; }
nworkers() { set -- $(workers "$1"); echo $#; }
# alive PID: running (a zombie has exited; who reaps it is not ours to time).
alive() { st=$(ps -o stat= -p "$1" 2>/dev/null); [ -n "$st" ] && [ "${st#Z}" = "$st" ]; }

# 1. every example, ranks in processes, against the unsharded reference
for entry in $($PYTHON -c "import json,sys; m=json.load(open(sys.argv[1])); print(' '.join(g['name']+':'+repr(g['rtol']) for g in m['graphs']))" "$TP_GRAPHS/manifest.json"); do
    name=${entry%%:*}; rtol=${entry##*:}
    if "$TPSERVE" run "$TP_GRAPHS/$name.json" --inputs "$TP_GRAPHS/$name.inputs.safetensors" \
           --output "$TMP/$name.out" --ranks processes 2>"$TMP/err" &&
       $PYTHON "$HERE/compare.py" "$TMP/$name.out" "$TP_GRAPHS/$name.ref.safetensors" "$rtol" >"$TMP/cmp"; then
        pass "run --ranks processes: $name matches its reference"
    else
        fail "run --ranks processes: $name: $(cat "$TMP/err" "$TMP/cmp" 2>/dev/null | tail -3)"
    fi
done

# 2. the server spawns world_size-1 workers and answers correctly
G=megatron_block_tp4
if start procs --graph "$TP_GRAPHS/$G.json" --ranks processes; then
    n=$(nworkers "$PID")
    [ "$n" = 3 ] && pass "serve ranks=processes on a 4-rank graph: 3 worker processes" ||
        fail "expected 3 workers of $PID, found $n ($(ps -o pid,ppid,args --ppid "$PID" | tail -n +2))"
    m=$(curl -s "$URL/metrics" | awk '$1 ~ /^tpserve_(world_size|rank_processes|rank_group_up)$/ { printf "%s=%s ", $1, $2 }')
    [ "$m" = "tpserve_world_size=4 tpserve_rank_processes=1 tpserve_rank_group_up=1 " ] &&
        pass "/metrics: world_size 4, rank_processes 1, rank_group_up 1" || fail "/metrics: $m"
    grep -q "ranks=4 (processes)" "$TMP/procs.log" && pass "ready line says ranks=4 (processes)" ||
        fail "ready line: $(grep ready: "$TMP/procs.log")"
    for mode in "" "--binary"; do
        # shellcheck disable=SC2086
        $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" $mode >"$TMP/c" 2>&1 &&
            pass "infer ${mode:-json} across 4 processes matches the reference" ||
            fail "infer ${mode:-json}: $(tail -3 "$TMP/c")"
    done
    ws=$(workers "$PID")
    kill "$PID"
    wait "$PID" 2>/dev/null
    rc=$?
    sleep 0.2
    left=0
    for w in $ws; do alive "$w" && left=$((left + 1)); done
    [ "$rc" = 0 ] && [ "$left" = 0 ] && pass "SIGTERM: exit 0 and no worker left behind" ||
        fail "SIGTERM: exit $rc, $left of the workers ($ws) still running"
fi

# 3. an idle server sleeps, in both rank modes: no thread of the server or
# of its workers polls (it used to wake 50 times a second per process).
# Past the first second after a request, when the step watchdogs sleep too.
G=mlp_sp_tp2
for mode in threads processes; do
    if start "idle_$mode" --graph "$TP_GRAPHS/$G.json" --ranks "$mode"; then
        sleep 1.5
        n=$(switches_over "$PID" 2)
        [ "$n" -le 10 ] && pass "idle, ranks $mode: $n context switches in 2 s over every thread" ||
            fail "idle, ranks $mode: $n context switches in 2 s (a thread polls)"
        kill "$PID"
        wait "$PID" 2>/dev/null
    fi
done

# 3. a worker killed: the server notices with no request made (its peer
# watcher), not ready, not live, 503 naming it, no hang
if start dead --graph "$TP_GRAPHS/$G.json" --ranks processes; then
    w=$(workers "$PID" | awk '{print $1}')
    kill -9 "$w"
    wait_log "$TMP/dead.log" "rank group lost: rank 1 (pid $w) was killed by signal 9" &&
        pass "worker SIGKILL on an idle server: logged within $WAITED_MS ms, no request needed" ||
        fail "worker SIGKILL on an idle server: not logged within 5 s: $(tail -2 "$TMP/dead.log")"
    i=0
    while [ $i -lt 50 ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" != 503 ]; do
        sleep 0.1; i=$((i + 1))
    done
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 503 ] &&
        pass "worker SIGKILL: readiness 503 within $((i * 100)) ms" || fail "worker SIGKILL: still ready after 5 s"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/live")" = 503 ] &&
        pass "worker SIGKILL: liveness 503 (the pod gets restarted)" || fail "worker SIGKILL: still live"
    code=$($PYTHON "$HERE/kserve_client.py" make --graphs "$TP_GRAPHS" --graph "$G" --out "$TMP/body" >/dev/null &&
        curl -s -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$TMP/body" \
            "$URL/v2/models/$G/infer")
    [ "$code" = 503 ] && grep -q "rank 1 (pid $w) was killed by signal 9" "$TMP/resp" &&
        pass "infer after the death: 503 naming rank 1, its pid and the signal" ||
        fail "infer after the death: $code $(cat "$TMP/resp")"
    up=$(curl -s "$URL/metrics" | awk '$1 == "tpserve_rank_group_up" { print $2 }')
    [ "$up" = 0 ] && pass "/metrics: tpserve_rank_group_up 0" || fail "/metrics: tpserve_rank_group_up '$up'"
    kill "$PID"
    i=0
    while kill -0 "$PID" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
    kill -0 "$PID" 2>/dev/null && fail "SIGTERM after a worker died: still running after 10 s" ||
        pass "SIGTERM after a worker died: exits in $((i * 100)) ms"
fi

# 3a. a worker killed while requests stream in: every request is answered
# (200 before, 503 after), none hangs, and the server stays up
if start load --graph "$TP_GRAPHS/$G.json" --ranks processes; then
    $PYTHON "$HERE/kserve_client.py" make --graphs "$TP_GRAPHS" --graph "$G" --out "$TMP/lbody" --repeat 8 >/dev/null
    loops=""
    for c in 1 2 3 4; do
        ( k=0; while [ $k -lt 40 ]; do
              curl -s -m 10 -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' \
                  --data-binary @"$TMP/lbody" "$URL/v2/models/$G/infer"; k=$((k + 1)); done ) >"$TMP/codes.$c" &
        loops="$loops $!"
    done
    i=0 # kill once requests are flowing (slow under ASan), not at a fixed time
    while [ $i -lt 200 ] && ! cat "$TMP"/codes.* 2>/dev/null | grep -q '^200$'; do sleep 0.05; i=$((i + 1)); done
    kill -9 "$(workers "$PID" | awk '{print $1}')"
    for j in $loops; do wait "$j"; done
    total=$(cat "$TMP"/codes.* | wc -l)
    other=$(cat "$TMP"/codes.* | grep -cv '^\(200\|503\)$')
    ok=$(cat "$TMP"/codes.* | grep -c '^200$')
    [ "$total" = 160 ] && [ "$other" = 0 ] && [ "$ok" -gt 0 ] && kill -0 "$PID" &&
        pass "worker SIGKILL under load: all 160 requests answered ($ok x 200, $((total - ok)) x 503), server up" ||
        fail "worker SIGKILL under load: $total answers, $other neither 200 nor 503: $(sort "$TMP"/codes.* | uniq -c | tr '\n' ' ')"
    kill "$PID"
    wait "$PID" 2>/dev/null
fi

# 3c. a worker stopped (alive, never finishing): the step deadline loses the
# group like a death, the request gets 503 naming it, the worker is killed
if start hung --graph "$TP_GRAPHS/$G.json" --ranks processes --step-timeout-ms 3000 --stuck-step-ms 1000; then
    w=$(workers "$PID" | awk '{print $1}')
    kill -STOP "$w"
    $PYTHON "$HERE/kserve_client.py" make --graphs "$TP_GRAPHS" --graph "$G" --out "$TMP/hbody" >/dev/null
    code=$(curl -s -m 20 -o "$TMP/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$TMP/hbody" "$URL/v2/models/$G/infer")
    [ "$code" = 503 ] && grep -q "rank 1 (pid $w) did not finish a step within 3000 ms (step_timeout_ms)" "$TMP/resp" &&
        pass "worker SIGSTOP: the request gets 503 after step_timeout_ms, naming the hung rank" ||
        fail "worker SIGSTOP: $code $(cat "$TMP/resp")"
    sleep 0.5
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 503 ] && ! alive "$w" &&
        pass "worker SIGSTOP: not ready, and the hung worker was killed" ||
        fail "worker SIGSTOP: ready=$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready"), worker $(ps -o stat= -p "$w")"
    kill "$PID"
    wait "$PID" 2>/dev/null
fi

# 3b. the server killed: its workers notice and exit on their own
if start orphan --graph "$TP_GRAPHS/$G.json" --ranks processes; then
    ws=$(workers "$PID")
    kill -9 "$PID"
    wait "$PID" 2>/dev/null
    i=0
    while [ $i -lt 50 ]; do
        left=0
        for w in $ws; do alive "$w" && left=$((left + 1)); done
        [ "$left" = 0 ] && break
        sleep 0.1; i=$((i + 1))
    done
    [ "$left" = 0 ] && grep -q "the leader (rank 0, pid $PID) is gone" "$TMP/orphan.log" &&
        pass "server SIGKILL: its worker exits within $((i * 100)) ms, saying the leader is gone" ||
        fail "server SIGKILL: $left workers of ($ws) still running; $(tail -2 "$TMP/orphan.log")"
fi

# 4. external ranks join at a rendezvous (torchrun-style RANK/WORLD_SIZE)
SOCK="$TMP/rdzv.sock"
RANK=1 WORLD_SIZE=2 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK" >"$TMP/w1.log" 2>&1 &
W1=$!
PIDS="$PIDS $W1"
if start ext --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK"; then
    $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
        pass "an external rank joined at the rendezvous; infer matches" || fail "external rank: $(tail -3 "$TMP/c")"
    [ "$(nworkers "$PID")" = 0 ] && pass "with a rendezvous the leader spawns no worker" || fail "leader spawned workers"
    kill "$PID"
    wait "$PID" 2>/dev/null
    wait "$W1" 2>/dev/null && pass "the external rank exits 0 when the leader stops" || fail "external rank: $(cat "$TMP/w1.log")"
fi

# 4b. an external rank in a pid namespace of its own (a container of its
# own): its pid here is the kernel's (SO_PEERCRED), not the 1 it sees for
# itself, and each end watches the other through the join connection. A
# rank that says pid 1 used to be taken at its word, and its leader, whose
# pid it cannot see, for gone at its first step.
if ! unshare --pid --fork true 2>/dev/null; then
    echo "SKIP: a rank in another pid namespace: skipped: unshare --pid is not permitted here"
else
    for dies in rank leader; do
        SOCK3="$TMP/rdzv3_$dies.sock"
        RANK=1 WORLD_SIZE=2 unshare --pid --fork "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK3" \
            >"$TMP/ns_$dies.log" 2>&1 &
        U=$!
        PIDS="$PIDS $U"
        start "ns_$dies" --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK3" || continue
        W=$(pgrep -P "$U")
        if [ $dies = rank ]; then
            $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
                pass "a rank in its own pid namespace joins and infer matches" || fail "namespaced rank: $(tail -3 "$TMP/c")"
            kill -9 "$W"
            wait_log "$TMP/ns_rank.log" "rank group lost: rank 1 (pid $W) is gone" &&
                pass "the namespaced rank killed: logged within $WAITED_MS ms with its pid here ($W)" ||
                fail "the namespaced rank killed: $(grep -m1 'lost' "$TMP/ns_rank.log")"
            kill "$PID"
            wait "$PID" 2>/dev/null
        else
            kill -9 "$PID"
            i=0
            while [ $i -lt 50 ] && kill -0 "$W" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
            ! kill -0 "$W" 2>/dev/null && grep -q "the leader (rank 0, pid $PID) is gone" "$TMP/ns_leader.log" &&
                pass "its leader killed: the namespaced rank exits within $((i * 100)) ms, saying why" ||
                fail "its leader killed: the namespaced rank $(kill -0 "$W" 2>/dev/null && echo runs on): $(tail -1 "$TMP/ns_leader.log")"
        fi
        wait "$U" 2>/dev/null
    done
fi

# 5. a rank with other options, or another world size, is refused
SOCK2="$TMP/rdzv2.sock"
RANK=1 WORLD_SIZE=2 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$SOCK2" --buckets 1,2 >"$TMP/w2.log" 2>&1 &
W2=$!
PIDS="$PIDS $W2"
PORT=$(free_port)
"$TPSERVE" serve --port "$PORT" --graph "$TP_GRAPHS/$G.json" --ranks processes --rendezvous "$SOCK2" >"$TMP/mis.log" 2>&1
rc=$?
[ "$rc" != 0 ] && grep -q "rank 1: started with other options than rank 0: .*buckets 1,2, passes all; rank 0 has .*buckets 1,2,4,8,16" "$TMP/mis.log" &&
    pass "a rank started with other buckets: the leader refuses to serve, saying which options differ" ||
    fail "options mismatch: rc=$rc $(tail -2 "$TMP/mis.log")"
wait "$W2" 2>/dev/null
[ $? != 0 ] && pass "the mismatched rank exits non-zero" || fail "mismatched rank exited 0"
RANK=1 WORLD_SIZE=4 "$TPSERVE" worker "$TP_GRAPHS/$G.json" --rendezvous "$TMP/none.sock" >"$TMP/w3.log" 2>&1
grep -q "WORLD_SIZE 4, but graph 'mlp_sp_tp2' has world_size 2" "$TMP/w3.log" &&
    pass "a worker with another WORLD_SIZE fails at once, saying so" || fail "world mismatch: $(cat "$TMP/w3.log")"

env -u RANK -u TP_RANK "$TPSERVE" worker "$TP_GRAPHS/$G.json" >"$TMP/w4.log" 2>&1
[ $? = 1 ] && grep -q "needs RANK (1..WORLD_SIZE-1) and WORLD_SIZE (>= 2)" "$TMP/w4.log" &&
    pass "a worker without RANK/WORLD_SIZE says what it needs" || fail "worker without env: $(cat "$TMP/w4.log")"
TP_GROUP_FD=0 RANK=1 WORLD_SIZE=2 "$TPSERVE" worker "$TP_GRAPHS/$G.json" </dev/null >"$TMP/w5.log" 2>&1
[ $? = 1 ] && grep -q "fd 0 is not a tpserve rank group" "$TMP/w5.log" &&
    pass "a worker handed a wrong group fd refuses it" || fail "wrong group fd: $(cat "$TMP/w5.log")"

# 6. staging: sized for the largest bucket by default, here one whose
# inputs and outputs need 78 MiB (more than the 64 MiB that used to be the
# default: GPT-2 needs 412); an explicit size too small is refused at load
# naming the --staging-mb that fits, and that value runs.
G=mlp_sp_tp2
run_big() { # extra run options...
    "$TPSERVE" run "$TP_GRAPHS/$G.json" --inputs "$TP_GRAPHS/$G.inputs.safetensors" --output "$TMP/big.out" \
        --ranks processes --buckets 1,4,40000 "$@" 2>"$TMP/big.err" &&
        $PYTHON "$HERE/compare.py" "$TMP/big.out" "$TP_GRAPHS/$G.ref.safetensors" 1e-4 >"$TMP/cmp"
}
run_big && pass "run --ranks processes, a bucket needing 78 MiB of staging: the default fits it" ||
    fail "default staging: $(cat "$TMP/big.err" "$TMP/cmp" 2>/dev/null | tail -2)"
if start big --graph "$TP_GRAPHS/$G.json" --ranks processes --buckets 1,4,40000; then
    $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
        pass "serve ranks=processes, the same buckets, default staging: loads and answers" ||
        fail "serve, default staging: $(tail -3 "$TMP/c")"
    kill "$PID"
    wait "$PID" 2>/dev/null
fi
run_big --staging-mb 64
rc=$?
want="request staging of 67108864 bytes is too small: the largest bucket (a batch of 40000) needs 81920000; --staging-mb 79 would do"
[ "$rc" = 1 ] && grep -qF "$want" "$TMP/big.err" &&
    pass "run --staging-mb 64: refused at load, naming --staging-mb 79" || fail "staging 64: rc=$rc $(tail -2 "$TMP/big.err")"
mb=$(sed -n 's/.*--staging-mb \([0-9]*\) would do.*/\1/p' "$TMP/big.err")
run_big --staging-mb "${mb:-none}" && pass "run --staging-mb $mb, the value the error named: runs" ||
    fail "staging $mb: $(cat "$TMP/big.err" "$TMP/cmp" 2>/dev/null | tail -2)"
PORT=$(free_port)
"$TPSERVE" serve --port "$PORT" --graph "$TP_GRAPHS/$G.json" --ranks processes --staging-mb 1 --buckets 1,4,4096 \
    >"$TMP/small.log" 2>&1
rc=$?
[ "$rc" = 1 ] && grep -qF "request staging of 1048576 bytes is too small: the largest bucket (a batch of 4096) needs 8388608; --staging-mb 8 would do" "$TMP/small.log" &&
    pass "serve --staging-mb 1 below the largest bucket's need: load fails naming --staging-mb 8" ||
    fail "staging overflow: rc=$rc $(tail -2 "$TMP/small.log")"

echo "test_processes: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
