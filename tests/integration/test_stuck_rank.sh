#!/bin/sh
# test_stuck_rank.sh — a rank process that stops (SIGSTOP: alive, never
# finishing its step) must not take the server's probes with it. With
# ranks=processes and stuck_step_ms 1000:
#  - while the worker is stopped, with inference requests on several
#    connections (one of which an idle server would run on its HTTP thread),
#    every probe (/v2/health/live, /v2/health/ready, /metrics, model
#    metadata) on connections opened before the stop (kept alive) and on new
#    ones is answered within 1 s (before, 1 trial in 2-6 left probes on the
#    thread running the step unanswered for minutes);
#  - readiness turns 503 once the step has run stuck_step_ms, saying why and
#    naming the rank, logged once, counted in /metrics;
#  - a request queued meanwhile gets its 504 at its own timeout, not when
#    the step ends;
#  - SIGCONT: readiness is 200 again and every request gets its right answer;
#  - the same with one connection alone on its HTTP thread (the inline run a
#    step may take there) and probes on new connections.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_stuck.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
TPSERVE=$(cd "$(dirname "$TPSERVE")" && pwd)/$(basename "$TPSERVE")

G=mlp_sp_tp2
W=""
# a stopped worker cannot see its leader go: never leave one behind
stop_all() {
    [ -n "$W" ] && kill -CONT "$W" 2>/dev/null && kill -9 "$W" 2>/dev/null
    cleanup
}
trap stop_all EXIT

workers() { pgrep -P "$1" -f "tpserve.* worker|exe worker" 2>/dev/null | tr '\n' ' '; }
code_of() { curl -s -m 1 -o "${2:-/dev/null}" -w '%{http_code}' "$URL$1"; }

# wait_ready CODE: until readiness answers CODE (10 s at most); WAITED_MS.
wait_ready() {
    WAITED_MS=0
    while [ $WAITED_MS -lt 10000 ] && [ "$(code_of /v2/health/ready "$TMP/ready")" != "$1" ]; do
        sleep 0.1; WAITED_MS=$((WAITED_MS + 100))
    done
    [ "$(code_of /v2/health/ready "$TMP/ready")" = "$1" ]
}

# infer_bg N: an inference on a new connection, in the background; its
# status goes to $TMP/code.N and its body to $TMP/resp.N
infer_bg() {
    curl -s -m 60 -o "$TMP/resp.$1" -w '%{http_code}' -H 'Content-Type: application/json' \
        --data-binary @"$TMP/body" "$URL/v2/models/$G/infer" >"$TMP/code.$1" &
    INFERS="$INFERS $!"
}
INFERS=""

# check_answers N...: each request answered 200 with the reference numbers
check_answers() {
    bad=""
    for n in "$@"; do
        [ "$(cat "$TMP/code.$n")" = 200 ] &&
            $PYTHON "$HERE/kserve_client.py" check --graphs "$TP_GRAPHS" --graph "$G" --body "$TMP/resp.$n" >/dev/null 2>&1 ||
            bad="$bad $n:$(cat "$TMP/code.$n")"
    done
    [ -z "$bad" ]
}

cat >"$TMP/prober.py" <<'EOF'
# Keep-alive connections opened before the stop, then probes on each of
# them and on new ones, each allowed 1 s; one line per probe.
import http.client, os, sys, time
port, tmp, model, rounds = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
paths = ["/v2/health/live", "/v2/health/ready", "/metrics", "/v2/models/" + model]
keep = [http.client.HTTPConnection("127.0.0.1", port, timeout=5) for _ in range(4)]
for c in keep:
    c.request("GET", "/v2/health/live")
    c.getresponse().read()
open(os.path.join(tmp, "prober.ready"), "w").close()
while not os.path.exists(os.path.join(tmp, "prober.go")):
    time.sleep(0.02)
for rnd in range(rounds):
    for i in range(len(keep) + 1):
        path = paths[(rnd + i) % len(paths)]
        fresh = i == len(keep)
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0) if fresh else keep[i]
        if not fresh and c.sock:
            c.sock.settimeout(1.0)
        t0 = time.monotonic()
        try:
            c.request("GET", path)
            r = c.getresponse()
            r.read()
            code = str(r.status)
        except Exception as e:  # a probe left unanswered: say so, go on
            code = "none(" + type(e).__name__ + ")"
            c.close()
        ms = (time.monotonic() - t0) * 1e3
        print("%s %s %s %.1f" % ("new" if fresh else "keep%d" % i, path, code, ms), flush=True)
        if fresh:
            c.close()
EOF

# judge FILE WHAT: every probe answered (200; readiness 200 or 503) within 1 s
judge() {
    n=$(wc -l <"$1")
    slow=$(awk '!($3 == 200 || ($2 == "/v2/health/ready" && $3 == 503)) || $4 >= 1000' "$1")
    stats=$(awk '{ if ($4 > m) m = $4; s += $4 } END { printf "max %.1f ms, mean %.1f ms", m, s / NR }' "$1")
    [ "$n" -ge 20 ] && [ -z "$slow" ] && pass "$2: all $n probes answered within 1 s ($stats)" ||
        fail "$2: $n probes, unanswered or slow: $(echo "$slow" | tr '\n' ';')"
}

$PYTHON "$HERE/kserve_client.py" make --graphs "$TP_GRAPHS" --graph "$G" --out "$TMP/body" >/dev/null
# the same request with a 2 s timeout of its own
$PYTHON -c 'import json, sys; d = json.load(open(sys.argv[1])); d["parameters"] = {"timeout": 2000000}; json.dump(d, open(sys.argv[2], "w"))' \
    "$TMP/body" "$TMP/body_2s"

# 1. keep-alive and new connections, inference on several connections
if start stuck --graph "$TP_GRAPHS/$G.json" --ranks processes --threads 2 --stuck-step-ms 1000; then
    W=$(workers "$PID" | awk '{print $1}')
    $PYTHON "$TMP/prober.py" "$PORT" "$TMP" "$G" 5 >"$TMP/probes1" 2>&1 &
    PROBER=$!
    i=0
    while [ $i -lt 100 ] && [ ! -e "$TMP/prober.ready" ]; do sleep 0.05; i=$((i + 1)); done
    $PYTHON "$HERE/kserve_client.py" infer --url "$URL" --graphs "$TP_GRAPHS" --graph "$G" >"$TMP/c" 2>&1 &&
        pass "before the stop: an inference matches the reference" || fail "before the stop: $(tail -3 "$TMP/c")"
    kill -STOP "$W"
    for n in 1 2 3 4; do infer_bg "$n"; sleep 0.1; done
    sleep 0.2
    touch "$TMP/prober.go"
    wait "$PROBER"
    judge "$TMP/probes1" "worker stopped, 4 keep-alive connections and new ones"
    wait_ready 503 && grep -q "not ready: engine step running for [0-9]* ms (stuck_step_ms 1000): rank 1 has not finished" "$TMP/ready" &&
        pass "readiness 503 after stuck_step_ms, naming the rank: $(cat "$TMP/ready")" ||
        fail "readiness while stopped: $(code_of /v2/health/ready) $(cat "$TMP/ready")"
    [ "$(code_of /v2/health/live)" = 200 ] && pass "liveness stays 200 (the step may yet end)" ||
        fail "liveness while stopped: $(code_of /v2/health/live)"
    code_of /metrics "$TMP/metrics" >/dev/null
    m=$(awk '$1 == "tpserve_stuck_steps_total" { s = $2 } $1 == "tpserve_engine_step_age_seconds" { a = $2 }
             END { print (s == 1 && a >= 1) ? "ok" : "stuck_steps " s " step_age " a }' "$TMP/metrics")
    [ "$m" = ok ] && pass "/metrics: tpserve_stuck_steps_total 1, tpserve_engine_step_age_seconds >= 1" || fail "/metrics: $m"
    n=$(grep -c "warn .*engine step running for [0-9]* ms (stuck_step_ms 1000): rank 1 has not finished: readiness 503" "$TMP/stuck.log")
    [ "$n" = 1 ] && pass "the stuck step logged once as a warning" ||
        fail "stuck step logged $n times: $(grep "engine step" "$TMP/stuck.log" | tail -3)"
    # queued behind the stuck step, each with a 2 s timeout of its own
    for n in 6 7; do
        curl -s -m 10 -o "$TMP/resp.$n" -w '%{http_code}' -H 'Content-Type: application/json' \
            --data-binary @"$TMP/body_2s" "$URL/v2/models/$G/infer" >"$TMP/code.$n" &
        eval "T$n=\$!"
    done
    wait "$T6" "$T7"
    [ "$(cat "$TMP/code.6") $(cat "$TMP/code.7")" = "504 504" ] && grep -q "in the queue, over parameters.timeout 2000000 us" "$TMP/resp.6" &&
        pass "queued behind the stuck step: 504 at the request's own timeout, the worker still stopped" ||
        fail "queued with a 2 s timeout: $(cat "$TMP/code.6") $(cat "$TMP/resp.6"), $(cat "$TMP/code.7")"
    kill -CONT "$W"
    wait_ready 200 && pass "SIGCONT: readiness 200 again within $WAITED_MS ms" ||
        fail "SIGCONT: readiness $(code_of /v2/health/ready) $(cat "$TMP/ready")"
    # shellcheck disable=SC2086 # a list of pids
    wait $INFERS
    INFERS=""
    check_answers 1 2 3 4 && pass "SIGCONT: the 4 inferences sent meanwhile get their right answers" ||
        fail "SIGCONT: inferences wrong or failed:$bad"
    wait_log "$TMP/stuck.log" "the stuck engine step has ended: readiness 200 again" &&
        pass "the step's end logged" || fail "the step's end not logged: $(tail -2 "$TMP/stuck.log")"

    # 2. one connection alone on its HTTP thread: its inference may run there;
    # new connections must then go to the other thread. Quiet, short steps
    # first, so the engine's recent step time is short again.
    for n in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16; do
        curl -s -m 10 -o /dev/null -H 'Content-Type: application/json' --data-binary @"$TMP/body" \
            "$URL/v2/models/$G/infer"
    done
    kill -STOP "$W"
    infer_bg 5
    sleep 0.3
    : >"$TMP/probes2"
    for n in 1 2 3 4 5; do
        for p in /v2/health/live /v2/health/ready /metrics "/v2/models/$G"; do
            curl -s -m 1 -o /dev/null -w "new $p %{http_code} %{time_total}\n" "$URL$p" |
                awk '{ printf "%s %s %s %.1f\n", $1, $2, $3, $4 * 1000 }' >>"$TMP/probes2"
        done
    done
    judge "$TMP/probes2" "worker stopped, one inference alone on its thread, probes on new connections"
    wait_ready 503 && pass "readiness 503 again for the second stuck step" || fail "second stuck step: readiness $(code_of /v2/health/ready)"
    kill -CONT "$W"
    wait_ready 200 && pass "SIGCONT: ready again" || fail "second SIGCONT: readiness $(code_of /v2/health/ready)"
    # shellcheck disable=SC2086 # a list of pids
    wait $INFERS
    check_answers 5 && pass "SIGCONT: the inference sent while stopped gets its right answer" ||
        fail "second SIGCONT: inference wrong or failed:$bad"
    kill "$PID"
    wait "$PID" 2>/dev/null
fi

echo "$npass passed, $nfail failed"
[ "$nfail" = 0 ]
