#!/bin/sh
# test_batching.sh — dynamic batching and /metrics on the real server:
# 16 concurrent curl clients with distinct rows each get exactly the answer
# their request gets alone; the engine ran fewer times than it was asked
# (execution_count < inference_count); a tiny max_queue gives 503 with an
# error body and the server stays healthy; a tiny timeout (request parameter
# or request_timeout_ms) gives 504 and never runs; /metrics counters move as
# expected and the text is Prometheus format; with no queue delay, clients
# overlapping on keep-alive connections are served by held requests (run
# together on their HTTP thread), each answer its own request's rows.
#
# env: TPSERVE (binary), TP_GRAPHS (generated graphs), PYTHON (python3);
#      KEEP_TMP=1 keeps the server logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
G=mlp_sp_tp2
N=16
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_batch.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"

# start_graph NAME ARGS...: the example graph, debug logs (see lib/server.sh).
start_graph() {
    start "$@" --graph "$TP_GRAPHS/$G.json" --log-level debug
}

stop() {
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
}

# metric NAME[{labels}]: its value in a fresh scrape (empty when absent).
metric() {
    curl -s "$URL/metrics" | awk -v k="$1" '$1 == k { print $2 }'
}

# post FILE OUT: POSTs a JSON body to infer; prints the HTTP code.
post() {
    curl -s -o "$2" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$1" \
        "$URL/v2/models/$G/infer"
}

# make_requests DIR COUNT: COUNT JSON requests of 1..3 distinct rows each.
make_requests() {
    $PYTHON - "$1" "$2" <<'EOF'
import json, sys
import numpy as np
d, n = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(7)
for i in range(n):
    rows = 1 + i % 3
    x = rng.uniform(-1, 1, (rows, 8, 32)).astype(np.float32)
    doc = {"id": "client-%d" % i,
           "inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32",
                       "data": [float(v) for v in x.reshape(-1)]}]}
    with open("%s/req.%d" % (d, i), "w") as f:
        json.dump(doc, f)
EOF
}

# same_answer GOT REF: the two infer answers carry the same id and outputs.
same_answer() {
    $PYTHON - "$1" "$2" <<'EOF'
import json, sys
import numpy as np
got, ref = (json.load(open(p)) for p in sys.argv[1:3])
assert got["id"] == ref["id"], "id %s, reference %s" % (got["id"], ref["id"])
for g, r in zip(got["outputs"], ref["outputs"]):
    assert g["shape"] == r["shape"], "shape %s, reference %s" % (g["shape"], r["shape"])
    a, b = np.array(g["data"]), np.array(r["data"])
    err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-6)
    # TU_RTOL_REORDER (tests/unit/testutil.h): batched rows may sum in another order
    assert err <= 1e-5, "%s: rel error %.3g against the request alone" % (g["name"], err)
EOF
}

# post_many NAME COUNT: requests 0..COUNT-1 at once, answers in $TMP/NAME.i,
# HTTP codes in $TMP/NAME.code.i.
post_many() {
    i=0
    jobs_=""
    while [ $i -lt "$2" ]; do
        post "$TMP/req.$i" "$TMP/$1.$i" >"$TMP/$1.code.$i" &
        jobs_="$jobs_ $!"
        i=$((i + 1))
    done
    for j in $jobs_; do wait "$j"; done
}

# post_all NAME: post_many NAME N, then each answer checked against its
# reference (a fail line per bad one); returns 1 when any was bad.
post_all() {
    post_many "$1" $N
    bad=0
    i=0
    while [ $i -lt $N ]; do
        if [ "$(cat "$TMP/$1.code.$i")" != 200 ]; then
            fail "client $i: HTTP $(cat "$TMP/$1.code.$i"): $(head -c 300 "$TMP/$1.$i")"
            bad=1
        elif ! same_answer "$TMP/$1.$i" "$TMP/ref.$i" >"$TMP/cmp" 2>&1; then
            fail "client $i got other rows than its request alone: $(tail -n 1 "$TMP/cmp")"
            bad=1
        fi
        i=$((i + 1))
    done
    return $bad
}

echo "== batching: $N concurrent clients, distinct rows"
# a 50 ms queue delay lets 16 curl processes started from a shell meet
start_graph batch --max-queue-delay-us 50000 --threads 4 || exit 1
make_requests "$TMP" $N
i=0
while [ $i -lt $N ]; do # references: each request alone
    code=$(post "$TMP/req.$i" "$TMP/ref.$i")
    [ "$code" = 200 ] || fail "reference request $i: HTTP $code: $(head -c 300 "$TMP/ref.$i")"
    i=$((i + 1))
done
exec0=$(metric tpserve_execution_count_total)
rows0=$(metric tpserve_inference_count_total)
ok0=$(metric tpserve_request_success_total)
post_all got && pass "$N concurrent clients each got exactly their own rows (vs. each request alone)"
exec1=$(metric tpserve_execution_count_total)
rows1=$(metric tpserve_inference_count_total)
ok1=$(metric tpserve_request_success_total)
rows_sent=$($PYTHON -c "print(sum(1 + i % 3 for i in range($N)))")
[ $((rows1 - rows0)) -eq "$rows_sent" ] && pass "inference_count grew by the $rows_sent rows sent" ||
    fail "inference_count grew by $((rows1 - rows0)), sent $rows_sent rows"
[ $((ok1 - ok0)) -eq $N ] && pass "request_success_total grew by $N" ||
    fail "request_success_total grew by $((ok1 - ok0)), want $N"
if [ $((exec1 - exec0)) -lt $N ] && [ "$exec1" -lt "$rows1" ]; then
    pass "batching happened: $N concurrent requests took $((exec1 - exec0)) engine executions; execution_count $exec1 < inference_count $rows1"
else
    fail "no batching: $((exec1 - exec0)) executions for $N concurrent requests (execution_count $exec1, inference_count $rows1)"
fi
grep -q "batching: up to 16 rows per engine run, max_queue_delay_us=50000" "$TMP/batch.log" &&
    pass "startup log states the batching limits" || fail "no batching line in the log"

# ---- /metrics format and counters ---------------------------------------------
curl -s -D "$TMP/mhdr" -o "$TMP/metrics" "$URL/metrics"
ctype=$(tr -d '\r' <"$TMP/mhdr" | sed -n 's/^[Cc]ontent-[Tt]ype: *//p')
[ "$ctype" = "text/plain; version=0.0.4; charset=utf-8" ] && pass "/metrics Content-Type $ctype" ||
    fail "/metrics Content-Type '$ctype'"
if $PYTHON - "$TMP/metrics" <<'EOF' >"$TMP/fmt" 2>&1; then
import re, sys
text = open(sys.argv[1]).read()
fams, last = {}, None
for line in text.splitlines():
    if line.startswith("# HELP "):
        last = line.split()[2]
        assert last not in fams, "family %s twice" % last
        fams[last] = None
    elif line.startswith("# TYPE "):
        _, _, name, typ = line.split()
        assert name == last and typ in ("counter", "gauge", "histogram"), line
        fams[name] = typ
    else:
        m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+)', line)
        assert m, "bad sample line: %r" % line
        base = re.sub(r"_(bucket|sum|count)$", "", m.group(1)) if fams.get(last) == "histogram" else m.group(1)
        assert base == last, "%s is not in family %s" % (m.group(1), last)
        float(m.group(4))
for f in ("tpserve_request_success_total", "tpserve_request_failure_total", "tpserve_inference_count_total",
          "tpserve_execution_count_total", "tpserve_queue_duration_seconds", "tpserve_compute_duration_seconds",
          "tpserve_inflight_requests", "tpserve_bucket_replays_total", "tpserve_input_copy_bytes_total",
          "tpserve_arena_bytes"):
    assert f in fams, "missing family " + f
# histograms: cumulative buckets, +Inf == _count
for h in [f for f, t in fams.items() if t == "histogram"]:
    vals = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(h + "_bucket{")]
    assert vals == sorted(vals), h + " buckets not cumulative"
    cnt = [float(l.split()[-1]) for l in text.splitlines() if l.startswith(h + "_count ")]
    assert cnt == [vals[-1]], h + " _count != +Inf bucket"
print(len(fams), "families")
EOF
    pass "/metrics is Prometheus text format: $(cat "$TMP/fmt"), cumulative histograms"
else
    fail "/metrics format: $(cat "$TMP/fmt")"
fi
replays=$(awk '/^tpserve_bucket_replays_total\{/ { s += $2 } END { print s + 0 }' "$TMP/metrics")
execs=$(awk '$1 == "tpserve_execution_count_total" { print $2 }' "$TMP/metrics")
[ "$replays" = "$execs" ] && pass "bucket replays sum to execution_count ($execs)" ||
    fail "bucket replays $replays != execution_count $execs"
qc=$(awk '$1 == "tpserve_queue_duration_seconds_count" { print $2 }' "$TMP/metrics")
[ "$qc" -eq $((2 * N)) ] && pass "queue_duration_seconds_count counts every inferred request ($qc)" ||
    fail "queue_duration_seconds_count $qc, want $((2 * N))"
for k in symmetric regular; do
    v=$(awk -v k="tpserve_input_copy_bytes_total{slot=\"$k\"}" '$1 == k { print $2 }' "$TMP/metrics")
    [ -n "$v" ] && pass "input copy bytes ($k slots): $v" || fail "no input copy bytes for $k"
done
arena=$(awk '/^tpserve_arena_bytes\{/ { s += $2 } END { print s + 0 }' "$TMP/metrics")
[ "$arena" -gt 0 ] && pass "arena bytes reported ($arena)" || fail "arena bytes are 0"
[ "$(awk '$1 == "tpserve_inflight_requests" { print $2 }' "$TMP/metrics")" = 0 ] &&
    pass "inflight_requests is 0 when idle" || fail "inflight_requests not 0 when idle"

f400=$(metric 'tpserve_request_failure_total{code="400"}')
printf '%s' '{"inputs":[{"name":"x","shape":[1,8,16],"datatype":"FP32","data":[1]}]}' >"$TMP/bad"
code=$(post "$TMP/bad" "$TMP/o")
[ "$code" = 400 ] && [ "$(metric 'tpserve_request_failure_total{code="400"}')" -eq $((f400 + 1)) ] &&
    pass "a 400 moves request_failure_total{code=\"400\"} by one" ||
    fail "400: HTTP $code, counter $f400 -> $(metric 'tpserve_request_failure_total{code="400"}')"
serial=$(awk '$1 == "tpserve_serial_step_count_total" { print $2 }' "$TMP/metrics")
[ "${serial:-0}" -gt 0 ] && [ "$serial" -le "$execs" ] &&
    pass "short steps ran serially, the ranks on one thread ($serial of $execs executions)" ||
    fail "serial_step_count ${serial:-missing}, executions $execs"
grep -q "ranks=2 (threads, serial steps up to 2000 us)" "$TMP/batch.log" &&
    pass "startup log states the serial-step limit" || fail "no serial-step limit in the ready line"
stop

# ---- held requests: no queue delay, clients overlapping -------------------------
# Requests that arrive while the engine is busy are held by their HTTP thread
# and run together on its next pass over its connections (server/README.md at 27cb4dd,
# "Held requests"): 8 keep-alive clients x 100 requests, the 16 distinct
# requests above in turn, each answer against that request alone, while 2
# more clients send 40 requests each and hang up without reading.
echo "== held requests: 8 keep-alive clients, no queue delay"
start_graph held --threads 2 || exit 1
if $PYTHON - "$PORT" "$G" "$TMP" $N <<'EOF' >"$TMP/held.out" 2>&1; then
import http.client, json, sys, threading
import numpy as np
port, g, d, n = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
bodies = [open("%s/req.%d" % (d, i), "rb").read() for i in range(n)]
refs = [json.load(open("%s/ref.%d" % (d, i))) for i in range(n)]
errors, done = [], [0]
lock = threading.Lock()
def client(t):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    for k in range(100):
        i = (t * 5 + k) % n
        c.request("POST", "/v2/models/%s/infer" % g, bodies[i], {"Content-Type": "application/json"})
        r = c.getresponse()
        body = r.read()
        try:
            assert r.status == 200, "HTTP %d: %s" % (r.status, body[:200])
            got, ref = json.loads(body), refs[i]
            assert got["id"] == ref["id"], "id %s for request %s" % (got["id"], ref["id"])
            a = np.array(got["outputs"][0]["data"]); b = np.array(ref["outputs"][0]["data"])
            assert a.shape == b.shape, "%d values, reference %d" % (a.size, b.size)
            # TU_RTOL_REORDER (tests/unit/testutil.h): batched rows may sum in another order
            err = np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-6)
            assert err <= 1e-5, "rel error %.3g against the request alone" % err
        except AssertionError as e:
            with lock: errors.append("client %d request %d: %s" % (t, k, e))
        with lock: done[0] += 1
def quitter(t):
    # sends whole requests and resets the connection without reading: a
    # connection may close while its request is held (its HTTP thread runs
    # the held batch first)
    import socket, struct
    for k in range(40):
        body = bodies[(t + k) % n]
        s = socket.create_connection(("127.0.0.1", port))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset
        s.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % (g.encode(), len(body)) + body)
        s.close()
ths = [threading.Thread(target=client, args=(t,)) for t in range(8)]
ths += [threading.Thread(target=quitter, args=(t,)) for t in range(2)]
for t in ths: t.start()
for t in ths: t.join()
print("%d answers, %d wrong" % (done[0], len(errors)))
for e in errors[:5]: print(e)
sys.exit(1 if errors or done[0] != 800 else 0)
EOF
    pass "8 overlapping keep-alive clients: $(head -n 1 "$TMP/held.out"), each its own request's rows"
else
    fail "held requests: $(head -n 6 "$TMP/held.out" | tr '\n' ' ')"
fi
i=0
while [ "$(metric tpserve_inflight_requests)" != 0 ] && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
[ "$(metric tpserve_inflight_requests)" = 0 ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] &&
    pass "clients hanging up mid-load: nothing left in flight, still ready" ||
    fail "after clients hung up: inflight_requests $(metric tpserve_inflight_requests)"
held_runs=$(grep -c "held requests together on their HTTP thread" "$TMP/held.log")
[ "$held_runs" -gt 0 ] && pass "HTTP threads ran held requests together ($held_runs times)" ||
    fail "no held requests ran: the busy engine's requests went elsewhere"
stop

# ---- one HTTP thread, several connections: one batch per pass ----------------
# An idle engine used to run each request alone on the thread that read
# it, so a thread serving many connections never batched (one HTTP thread,
# or two sharing a core: every execution one request). With more than one
# connection on its thread a request is held, and what the thread reads in
# the same pass joins its batch (tp_batch_req's more_may_follow). One
# connection alone is never held: its request runs at once.
echo "== one HTTP thread: one connection runs alone, several batch"
start_graph one_thread --threads 1 || exit 1
i=0
while [ $i -lt 20 ]; do
    [ $i -gt 0 ] && echo "next" # each URL its own body, on the same connection
    echo "url = \"$URL/v2/models/$G/infer\""
    echo "data-binary = \"@$TMP/req.0\""
    echo "header = \"Content-Type: application/json\""
    echo "output = \"$TMP/one.$i\""
    i=$((i + 1))
done >"$TMP/one.curl"
curl -s -K "$TMP/one.curl" && same_answer "$TMP/one.19" "$TMP/ref.0" >/dev/null &&
    ! grep -q "held requests together on their HTTP thread" "$TMP/one_thread.log" &&
    pass "20 requests on one keep-alive connection: answered, none held" ||
    fail "one connection: $(grep -c 'held requests together' "$TMP/one_thread.log") held runs, or a wrong answer"
if command -v wrk >/dev/null 2>&1; then
    r0=$(metric tpserve_inference_count_total) e0=$(metric tpserve_execution_count_total)
    wrk -t1 -c16 -d1s -s "$HERE/../load/infer_binary.lua" "$URL/v2/models/$G/infer" >"$TMP/wrk1.out" 2>&1
    r1=$(metric tpserve_inference_count_total) e1=$(metric tpserve_execution_count_total)
    # a count, not a time: any pass that read two requests ran them as one
    [ $((r1 - r0)) -gt 100 ] && [ $((e1 - e0)) -lt $((r1 - r0)) ] &&
        pass "16 connections on one thread: $((r1 - r0)) requests in $((e1 - e0)) executions" ||
        fail "16 connections on one thread: $((r1 - r0)) requests in $((e1 - e0)) executions (none batched)"
else
    echo "SKIP: 16 connections on one thread: wrk not installed"
fi
stop

# ---- every rank on its own thread: the same answers ---------------------------
echo "== serial steps off (--serial-step-max-us 0)"
start_graph threads --serial-step-max-us 0 || exit 1
code=$(post "$TMP/req.1" "$TMP/thr.1")
[ "$code" = 200 ] && same_answer "$TMP/thr.1" "$TMP/ref.1" >"$TMP/cmp" 2>&1 &&
    [ "$(metric tpserve_serial_step_count_total)" = 0 ] &&
    pass "rank threads answer what serial steps answered, and no step ran serially" ||
    fail "rank threads: HTTP $code, $(tail -n 1 "$TMP/cmp"), serial steps $(metric tpserve_serial_step_count_total)"
grep -q "ranks=2 (threads) " "$TMP/threads.log" && pass "and its ready line says plain threads" ||
    fail "ready line with serial steps off: $(grep 'ready:' "$TMP/threads.log")"
stop

# ---- overflow: a queue of one, a long queue delay ----------------------------
echo "== overflow: max_queue 1"
start_graph overflow --threads 1 --max-queue 1 --max-queue-delay-us 300000 || exit 1
post_many ov 8
n503=0
n200=0
bodies_ok=1
i=0
while [ $i -lt 8 ]; do
    case $(cat "$TMP/ov.code.$i") in
    200) n200=$((n200 + 1)) ;;
    503) n503=$((n503 + 1))
        grep -q '"error":"server overloaded: ' "$TMP/ov.$i" || bodies_ok=0 ;;
    esac
    i=$((i + 1))
done
if [ "$n503" -ge 1 ] && [ "$n200" -ge 1 ] && [ $((n503 + n200)) -eq 8 ] && [ $bodies_ok = 1 ]; then
    pass "overflow: $n200 answered 200, $n503 got 503 with a 'server overloaded' error body"
else
    fail "overflow: 200 x $n200, 503 x $n503 of 8: $(cat "$TMP"/ov.* | head -c 600)"
fi
m503=$(metric 'tpserve_request_failure_total{code="503"}')
[ "$m503" = "$n503" ] && pass "request_failure_total{code=\"503\"} = $m503" ||
    fail "request_failure_total{code=\"503\"} = $m503, clients saw $n503"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] &&
    [ "$(post "$TMP/req.0" "$TMP/o")" = 200 ] && same_answer "$TMP/o" "$TMP/ref.0" &&
    pass "healthy after overflow: ready, and the next request is answered correctly" ||
    fail "unhealthy after overflow"
stop

# ---- timeouts: the request's own, and request_timeout_ms ---------------------
echo "== timeouts"
start_graph timeout --max-queue-delay-us 300000 || exit 1
$PYTHON - "$TMP/req.0" "$TMP/req.t" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["parameters"] = {"timeout": 1000}  # microseconds, as Triton
json.dump(doc, open(sys.argv[2], "w"))
EOF
exec0=$(metric tpserve_execution_count_total)
code=$(post "$TMP/req.t" "$TMP/o")
if [ "$code" = 504 ] && grep -q 'in the queue, over parameters.timeout 1000 us' "$TMP/o"; then
    pass "parameters.timeout 1000 us with a 300 ms queue delay: 504 ($(cat "$TMP/o"))"
else
    fail "parameters.timeout: HTTP $code: $(cat "$TMP/o")"
fi
[ "$(metric tpserve_execution_count_total)" = "$exec0" ] && pass "the timed-out request never ran (execution_count unchanged)" ||
    fail "execution_count moved from $exec0 to $(metric tpserve_execution_count_total)"
[ "$(metric 'tpserve_request_failure_total{code="504"}')" = 1 ] && pass "request_failure_total{code=\"504\"} = 1" ||
    fail "request_failure_total{code=\"504\"} = $(metric 'tpserve_request_failure_total{code="504"}')"
$PYTHON - "$TMP/req.0" "$TMP/badt" <<'EOF'
import json, sys
doc = json.load(open(sys.argv[1]))
doc["parameters"] = {"timeout": -5}
json.dump(doc, open(sys.argv[2], "w"))
EOF
code=$(post "$TMP/badt" "$TMP/o")
[ "$code" = 400 ] && grep -q "parameters.timeout must be a non-negative integer" "$TMP/o" &&
    pass "a negative parameters.timeout is 400" || fail "bad timeout: HTTP $code: $(cat "$TMP/o")"
[ "$(post "$TMP/req.0" "$TMP/o")" = 200 ] && same_answer "$TMP/o" "$TMP/ref.0" &&
    pass "without a timeout the same request waits the queue delay and is answered" ||
    fail "request without timeout after 504s"
stop
start_graph timeout_cfg --max-queue-delay-us 300000 --request-timeout-ms 5 || exit 1
code=$(post "$TMP/req.1" "$TMP/o")
[ "$code" = 504 ] && grep -q 'in the queue, over request_timeout_ms 5' "$TMP/o" &&
    pass "request_timeout_ms 5: 504 ($(cat "$TMP/o"))" || fail "request_timeout_ms: HTTP $code: $(cat "$TMP/o")"
[ "$(metric tpserve_execution_count_total)" = 0 ] && pass "and it never ran (execution_count 0)" ||
    fail "execution_count $(metric tpserve_execution_count_total) after a 504"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/live")" = 200 ] && pass "live after 504s" || fail "not live after 504s"
stop

# ---- shutdown drains the batcher queue ----------------------------------------
echo "== SIGTERM with requests waiting in the batcher queue"
start_graph drain --max-queue-delay-us 2000000 || exit 1
i=0
jobs_=""
while [ $i -lt 4 ]; do
    post "$TMP/req.$i" "$TMP/dr.$i" >"$TMP/drc.$i" &
    jobs_="$jobs_ $!"
    i=$((i + 1))
done
sleep 0.5 # queued, waiting for the 2 s delay
kill -TERM "$PID"
wait "$PID"
rc=$?
for j in $jobs_; do wait "$j"; done
ok=0
i=0
while [ $i -lt 4 ]; do
    [ "$(cat "$TMP/drc.$i")" = 200 ] && same_answer "$TMP/dr.$i" "$TMP/ref.$i" && ok=$((ok + 1))
    i=$((i + 1))
done
[ $rc -eq 0 ] && [ $ok -eq 4 ] && pass "SIGTERM: the 4 queued requests ran and were answered correctly, exit 0" ||
    fail "SIGTERM with a queued batch: exit $rc, $ok of 4 answered 200 correctly"

# ---- model instances ------------------------------------------------------------
echo "== two model instances (--instances 2)"
start_graph one_inst --threads 4 || exit 1
arena1=$(curl -s "$URL/metrics" | awk '/^tpserve_arena_bytes\{/ { s += $2 } END { print s + 0 }')
stop
start_graph inst --instances 2 --threads 4 || exit 1
count=$(curl -s "$URL/v2/models/$G/config" | $PYTHON -c 'import json,sys; print(json.load(sys.stdin)["instance_group"][0]["count"])')
[ "$count" = 2 ] && pass "model configuration: instance_group count 2" || fail "instance_group count '$count'"
grep -q "threads=4 instances=2" "$TMP/inst.log" && pass "startup log states instances=2" ||
    fail "no instances=2 in the ready line"
post_all inst && pass "$N concurrent clients on two instances each got their own rows"
curl -s -o "$TMP/metrics2" "$URL/metrics"
arena2=$(awk '/^tpserve_arena_bytes\{/ { s += $2 } END { print s + 0 }' "$TMP/metrics2")
[ "$arena2" -eq $((2 * arena1)) ] && pass "arena bytes add up both instances ($arena1 -> $arena2)" ||
    fail "arena bytes with two instances $arena2, one instance $arena1"
replays=$(awk '/^tpserve_bucket_replays_total\{/ { s += $2 } END { print s + 0 }' "$TMP/metrics2")
execs=$(awk '$1 == "tpserve_execution_count_total" { print $2 }' "$TMP/metrics2")
[ "$replays" = "$execs" ] && [ "$execs" -gt 0 ] && pass "bucket replays of both instances sum to execution_count ($execs)" ||
    fail "two instances: bucket replays $replays, execution_count $execs"
stop
"$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --instances 2 --ranks processes >"$TMP/o" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "'instances' 2 needs backend cpu and ranks threads" "$TMP/o" &&
    pass "--instances 2 --ranks processes refused: $(head -n 1 "$TMP/o")" ||
    fail "--instances 2 --ranks processes: exit $rc: $(head -n 1 "$TMP/o")"

# ---- steady state without page faults --------------------------------------------
# Batches of 16 connections' 8-row JSON requests (answers of ~22 KB of text,
# batch outputs of varying size): glibc used to hand freed arena memory back
# and the next requests faulted it in again, 2 faults a request; kept
# (keep_freed_memory in server/serve.c) it is ~0.0001. A count, not a time.
echo "== page faults under load"
if [ -n "${TP_SANITIZED:-}" ]; then
    echo "SKIP: page faults: a sanitizer's allocator does not take glibc's malloc settings"
elif ! command -v wrk >/dev/null 2>&1; then
    echo "SKIP: page faults: wrk not installed"
else
    start_graph faults --threads 2 --log-level warn || exit 1
    load() {
        TP_ROWS=8 wrk -t2 -c16 -d"$1" -s "$HERE/../load/infer_json.lua" "$URL/v2/models/$G/infer" >"$TMP/wrk.out" 2>&1
    }
    load 1s # warm-up: arenas and pools grow to what this load needs
    f0=$(awk '{ print $10 }' "/proc/$PID/stat")
    load 2s
    f1=$(awk '{ print $10 }' "/proc/$PID/stat")
    n=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$TMP/wrk.out")
    non2xx=$(sed -n 's/.*Non-2xx or 3xx responses: *\([0-9]*\).*/\1/p' "$TMP/wrk.out")
    if [ "${n:-0}" -gt 1000 ] && [ -z "$non2xx" ] && [ $(((f1 - f0) * 20)) -lt "$n" ]; then
        pass "8-row JSON under wrk: $((f1 - f0)) page faults in $n requests (under 0.05 a request)"
    else
        fail "8-row JSON under wrk: $((f1 - f0)) page faults in ${n:-no} requests, non-2xx ${non2xx:-0}"
        cat "$TMP/wrk.out"
    fi
    stop
fi

echo "test_batching: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
