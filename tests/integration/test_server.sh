#!/bin/sh
# test_server.sh — drives the real `tpserve serve` over loopback with curl:
# every KServe v2 endpoint, every error class, infer results against the
# reference outputs, limits, and SIGTERM while loaded (every accepted request
# answered, exit 0).
#
# env: TPSERVE (binary), TP_GRAPHS (generated graphs with manifest.json),
#      PYTHON (python3 with numpy); KEEP_TMP=1 keeps the server logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
G=mlp_sp_tp2
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_it.XXXXXX")
. "$HERE/lib/server.sh"
. "$HERE/lib/cpus.sh"
. "$HERE/lib/pyrun.sh"
CLIENT="pyrun $HERE/kserve_client.py"

# req METHOD PATH [curl args...]: sets CODE; body in $TMP/body, headers in $TMP/hdr.
req() {
    m=$1
    p=$2
    shift 2
    CODE=$(curl -s -X "$m" -D "$TMP/hdr" -o "$TMP/body" -w '%{http_code}' "$@" "$URL$p")
}

# expect DESC CODE SUBSTRING METHOD PATH [curl args...]
expect() {
    desc=$1
    want=$2
    sub=$3
    shift 3
    req "$@"
    if [ "$CODE" = "$want" ] && grep -qF -- "$sub" "$TMP/body"; then
        pass "$desc ($CODE)"
    else
        fail "$desc: wanted $want with '$sub', got $CODE: $(head -c 400 "$TMP/body")"
    fi
}

# expect_json DESC CODE SUBSTRING JSON [PATH]: POSTs a JSON body to infer.
expect_json() {
    expect "$1" "$2" "$3" POST "${5:-/v2/models/$G/infer}" -H 'Content-Type: application/json' \
        --data-binary "$4"
}

header() { tr -d '\r' <"$TMP/hdr" | grep -i "^$1:" | sed 's/^[^:]*: *//' | tail -n 1; }

# term_exits_logging DESC LOG LINE: SIGTERM to $PID; passes when it exits 0
# having logged LINE
term_exits_logging() {
    kill -TERM "$PID"
    wait "$PID"
    rc=$?
    if [ $rc -eq 0 ] && grep -q "$3" "$2"; then
        pass "$1"
    else
        fail "$1: exit $rc: $(tail -5 "$2")"
    fi
}

echo "== tpserve serve: $G on the cpu backend"
TR=$TMP/trace.json
start main --graph "$TP_GRAPHS/$G.json" --backend cpu --log-level debug --trace-file "$TR" || exit 1
# the accept queue is the longest the kernel allows (a burst of connections
# past a short one has its SYNs dropped: 1-3 s retransmissions)
if command -v ss >/dev/null 2>&1 && [ -r /proc/sys/net/core/somaxconn ]; then
    want=$(cat /proc/sys/net/core/somaxconn)
    [ "$want" -gt 65535 ] && want=65535
    got=$(ss -ltnH "sport = :$(echo "$URL" | sed 's/.*://')" | awk '{print $3}' | head -n 1)
    [ "$got" = "$want" ] && pass "accept queue $got (net.core.somaxconn)" ||
        fail "accept queue ${got:-unknown}, wanted $want (net.core.somaxconn)"
else
    echo "SKIP: accept queue length: no ss or /proc/sys/net/core/somaxconn"
fi
MAIN_URL=$URL
MAIN_PID=$PID

# ---- health and metadata ---------------------------------------------------
expect "live" 200 '{"live":true}' GET /v2/health/live
expect "ready" 200 '{"ready":true}' GET /v2/health/ready
expect "server metadata names tpserve" 200 '"name":"tpserve"' GET /v2
expect "server metadata lists binary_tensor_data" 200 '"binary_tensor_data"' GET /v2
expect "model metadata: -1 batch dim" 200 '"inputs":[{"name":"x","datatype":"FP32","shape":[-1,8,32]}]' GET /v2/models/$G
expect "model metadata: outputs" 200 '"outputs":[{"name":"y","datatype":"FP32","shape":[-1,8,32]}]' GET /v2/models/$G
expect "model metadata: platform and versions" 200 '"versions":["1"],"platform":"tpserve"' GET /v2/models/$G
expect "versioned model metadata" 200 "\"name\":\"$G\"" GET /v2/models/$G/versions/1
expect "model ready" 200 '{"ready":true}' GET /v2/models/$G/ready
expect "versioned model ready" 200 '{"ready":true}' GET /v2/models/$G/versions/1/ready
req HEAD /v2/health/live -I
[ "$CODE" = 200 ] && pass "HEAD live (200)" || fail "HEAD live: $CODE"
expect "trailing slash routes the same" 200 '{"live":true}' GET /v2/health/live/
# Triton's model repository and logging extensions
expect "repository index" 200 "[{\"name\":\"$G\",\"version\":\"1\",\"state\":\"READY\"}]" POST /v2/repository/index
expect "repository index, ready only" 200 "\"state\":\"READY\"" POST /v2/repository/index -d '{"ready":true}'
expect "repository index: bad body" 400 "'ready' must be true or false" POST /v2/repository/index -d '{"ready":"y"}'
expect "model load refused" 400 "cannot be loaded: tpserve serves the graph it was started with" \
    POST /v2/repository/models/$G/load
expect "model unload refused" 400 "cannot be unloaded" POST /v2/repository/models/$G/unload
expect "unload of another model" 404 "unknown model 'nope'" POST /v2/repository/models/nope/unload
expect "still ready after load and unload" 200 '{"ready":true}' GET /v2/models/$G/ready
# the verb comes from the route, not from the path: a model named "unloader"
mkdir -p "$TMP/unloader"
sed 's/"name": "'"$G"'"/"name": "unloader"/' "$TP_GRAPHS/$G.json" >"$TMP/unloader/$G.json"
cp "$TP_GRAPHS/$G.safetensors" "$TMP/unloader/"
if start unloader --graph "$TMP/unloader/$G.json"; then
    expect "load of a model named unloader" 400 "model 'unloader' cannot be loaded:" \
        POST /v2/repository/models/unloader/load
    kill "$PID"
    wait "$PID" 2>/dev/null
fi
PID=$MAIN_PID
URL=$MAIN_URL
expect "log settings" 200 '"log_error":true' GET /v2/logging
expect "log settings: warnings only" 200 '"log_info":false,"log_warning":true' POST /v2/logging -d '{"log_info":false}'
expect "log settings: refused" 400 "log_warning off together with log_info on" \
    POST /v2/logging -d '{"log_info":true,"log_warning":false}'
expect "log settings: back to debug" 200 '"log_verbose_level":1' POST /v2/logging -d '{"log_verbose_level":1}'
# the ranks are the parallelism: the served process runs OpenBLAS without a
# pool thread of its own (main.c sets it before the re-exec)
if tr '\0' '\n' <"/proc/$PID/environ" 2>/dev/null | grep -qx 'OPENBLAS_NUM_THREADS=1'; then
    pass "serve runs with OPENBLAS_NUM_THREADS=1"
else
    fail "serve's environment lacks OPENBLAS_NUM_THREADS=1"
fi

# ---- infer: JSON, nested, binary, versions, outputs, id --------------------
# ENCODING=gzip or deflate: the body is sent compressed (Content-Encoding),
# its Inference-Header-Content-Length still the plain header's, as in Triton.
compress_body() { # ENCODING FILE: FILE compressed in place
    $PYTHON -c 'import gzip, sys, zlib
p = sys.argv[2]
b = open(p, "rb").read()
open(p, "wb").write(gzip.compress(b) if sys.argv[1] == "gzip" else zlib.compress(b))' "$1" "$2"
}
infer_curl() { # DESC PATH MAKE-OPTS...
    desc=$1
    path=$2
    shift 2
    hl=$($CLIENT make --graphs "$TP_GRAPHS" --graph $G --out "$TMP/req" "$@") || { fail "$desc: make"; return; }
    ce=""
    if [ -n "${ENCODING:-}" ]; then
        compress_body "$ENCODING" "$TMP/req"
        ce="Content-Encoding: $ENCODING"
    fi
    if [ "$hl" -ge 0 ]; then
        req POST "$path" -H "Inference-Header-Content-Length: $hl" -H 'Content-Type: application/octet-stream' ${ce:+-H} ${ce:+"$ce"} --data-binary @"$TMP/req"
    else
        req POST "$path" -H 'Content-Type: application/json' ${ce:+-H} ${ce:+"$ce"} --data-binary @"$TMP/req"
    fi
    rhl=$(header Inference-Header-Content-Length)
    [ -n "$rhl" ] || rhl=-1
    # shellcheck disable=SC2046 # the make options split into words on purpose
    if [ "$CODE" != 200 ]; then
        fail "$desc: HTTP $CODE: $(head -c 300 "$TMP/body")"
    elif $CLIENT check --graphs "$TP_GRAPHS" --graph $G --body "$TMP/body" --header-len "$rhl" \
        $(echo "$@" | sed 's/--binary-out//; s/--binary//; s/--nested//') >"$TMP/check" 2>&1; then
        pass "$desc matches the reference ($(tr '\n' ' ' <"$TMP/check"))"
    else
        fail "$desc: $(cat "$TMP/check")"
    fi
}
infer_curl "infer JSON flat" /v2/models/$G/infer
infer_curl "infer JSON nested" /v2/models/$G/infer --nested
infer_curl "infer binary in, JSON out" /v2/models/$G/infer --binary
infer_curl "infer binary in, binary out" /v2/models/$G/infer --binary --binary-out
infer_curl "infer JSON in, binary out (binary_data_output)" /v2/models/$G/infer --binary-out
# Small binary answers are copied into one body (one send); over 64 KiB
# they go out from the engine's outputs: both must carry the same bytes.
infer_curl "infer binary out of 80 rows (over 64 KiB, sent from the outputs)" /v2/models/$G/infer --binary --binary-out --repeat 80
infer_curl "infer versioned path, requested output, id echoed" /v2/models/$G/versions/1/infer --outputs y --id req-42
ENCODING=gzip infer_curl "infer JSON sent gzip-compressed" /v2/models/$G/infer
ENCODING=deflate infer_curl "infer JSON sent deflate-compressed" /v2/models/$G/infer
ENCODING=gzip infer_curl "infer binary in and out sent gzip-compressed" /v2/models/$G/infer --binary --binary-out
ENCODING=deflate infer_curl "infer binary sent deflate-compressed, 80 rows" /v2/models/$G/infer --binary --repeat 80
$CLIENT make --graphs "$TP_GRAPHS" --graph $G --out "$TMP/plain" >/dev/null
expect "Content-Encoding br refused" 415 "Content-Encoding 'br' is not supported" POST /v2/models/$G/infer \
    -H 'Content-Encoding: br' --data-binary @"$TMP/plain"
expect "a body declared gzip that is not" 400 "gzip body is not valid gzip data" POST /v2/models/$G/infer \
    -H 'Content-Encoding: gzip' --data-binary @"$TMP/plain"
cp "$TMP/plain" "$TMP/cut" && compress_body gzip "$TMP/cut" && head -c 40 "$TMP/cut" >"$TMP/cut40"
expect "a gzip body cut short" 400 "gzip body is truncated" POST /v2/models/$G/infer \
    -H 'Content-Encoding: gzip' --data-binary @"$TMP/cut40"
head -c 200000000 /dev/zero | gzip -c >"$TMP/bomb"
expect "a gzip bomb (200 MB of zeros in $(wc -c <"$TMP/bomb") bytes) stops at max_body_bytes" 413 \
    "gzip body inflates past max_body_bytes" POST /v2/models/$G/infer -H 'Content-Encoding: gzip' \
    --data-binary @"$TMP/bomb"
rm -f "$TMP/bomb"
printf '{"log_info":true}' >"$TMP/settings" && compress_body gzip "$TMP/settings"
expect "other POST routes take compressed bodies too (/v2/logging)" 200 '"log_info":true' POST /v2/logging \
    -H 'Content-Encoding: gzip' --data-binary @"$TMP/settings"
expect "ready after the compressed bodies" 200 '"ready":true' GET /v2/health/ready
if [ "$(header Content-Type)" = application/json ]; then pass "JSON answer has Content-Type application/json"; else fail "Content-Type $(header Content-Type)"; fi
hl=$($CLIENT make --graphs "$TP_GRAPHS" --graph $G --out "$TMP/req" --binary --binary-out)
req POST /v2/models/$G/infer -H "Inference-Header-Content-Length: $hl" --data-binary @"$TMP/req"
if [ "$CODE" = 200 ] && [ "$(header Content-Type)" = application/octet-stream ] && [ -n "$(header Inference-Header-Content-Length)" ]; then
    pass "binary answer has Inference-Header-Content-Length $(header Inference-Header-Content-Length) and application/octet-stream"
else
    fail "binary answer headers: $CODE $(tr '\r\n' '  ' <"$TMP/hdr")"
fi

# ---- error classes -------------------------------------------------------------
X3='"shape":[1,8,32],"datatype":"FP32"'
DATA=$($PYTHON -c 'print(",".join(["0.5"] * 256))')
expect_json "malformed JSON" 400 'malformed JSON in request body at line 1' '{"inputs": [}'
expect_json "body not an object" 400 'must be a JSON object' '[1,2,3]'
expect_json "unknown model" 404 "unknown model 'nope' (this server serves '$G')" '{}' /v2/models/nope/infer
expect "unknown model metadata" 404 "unknown model 'nope'" GET /v2/models/nope
expect "unknown model ready" 404 "unknown model 'nope'" GET /v2/models/nope/ready
expect_json "unknown version" 404 "has no version '7'" '{}' /v2/models/$G/versions/7/infer
expect_json "unknown input" 400 "unknown input 'q' (model '$G' inputs: 'x')" "{\"inputs\":[{\"name\":\"q\",$X3,\"data\":[$DATA]}]}"
expect_json "missing input" 400 "missing input 'x'" '{"inputs":[]}'
expect_json "no inputs" 400 "request has no 'inputs'" '{"id":"a"}'
expect_json "wrong shape" 400 "input 'x': shape [1, 8, 16] does not match model shape [-1, 8, 32]" \
    "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,8,16],\"datatype\":\"FP32\",\"data\":[1]}]}"
expect_json "wrong datatype" 400 "input 'x': datatype INT32 does not match model datatype FP32" \
    "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,8,32],\"datatype\":\"INT32\",\"data\":[1]}]}"
expect_json "unsupported datatype" 400 "input 'x': unsupported datatype 'BOOL'" \
    "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,8,32],\"datatype\":\"BOOL\",\"data\":[true]}]}"
expect_json "element count vs shape" 400 "input 'x': data has 3 elements, shape [1, 8, 32] needs 256" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[1,2,3]}]}"
expect_json "nested data vs shape" 400 "input 'x': data has 2 elements, shape [1, 8, 32] needs 1 at dim 0" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[[1],[2]]}]}"
# 16 Mi small numbers (a 32 MiB body): the data is read from the body text,
# never a parsed node per element, so the server's peak memory grows by about
# the body (a DOM cost ~20x: 63 MiB of "0," once took 1.3 GB). The bound
# leaves room for ASan's quarantine.
$PYTHON -c "import sys; sys.stdout.write('{\"inputs\":[{\"name\":\"x\",\"shape\":[1,8,32],\"datatype\":\"FP32\",\"data\":[' + ','.join(['0'] * (16 << 20)) + ']}]}')" >"$TMP/big.json"
hwm0=$(awk '/^VmHWM/ { print $2 }' "/proc/$MAIN_PID/status")
expect "32 MiB JSON body with the wrong element count" 400 \
    "input 'x': data has 16777216 elements, shape [1, 8, 32] needs 256" \
    POST /v2/models/$G/infer --data-binary @"$TMP/big.json"
hwm1=$(awk '/^VmHWM/ { print $2 }' "/proc/$MAIN_PID/status")
[ $((hwm1 - hwm0)) -lt $((6 * 32 * 1024)) ] && pass "peak memory grew by $(((hwm1 - hwm0) / 1024)) MiB for it (< 6x the body)" ||
    fail "peak memory grew by $(((hwm1 - hwm0) / 1024)) MiB for a 32 MiB body"
rm -f "$TMP/big.json"
expect_json "non-number element" 400 "input 'x': data element 0 is a string" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[\"a\"$(printf ',1%.0s' $(seq 255))]}]}"
expect_json "unknown output" 400 "unknown output 'z' (model '$G' outputs: 'y')" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$DATA]}],\"outputs\":[{\"name\":\"z\"}]}"
J="{\"inputs\":[{\"name\":\"x\",$X3,\"parameters\":{\"binary_data_size\":12}}]}"
printf '%s%s' "$J" 'twelve bytes' >"$TMP/req"
expect "binary size mismatch" 400 "input 'x': binary_data_size 12 does not match shape [1, 8, 32] of FP32 (1024 bytes)" \
    POST /v2/models/$G/infer -H "Inference-Header-Content-Length: ${#J}" --data-binary @"$TMP/req"
J="{\"inputs\":[{\"name\":\"x\",$X3,\"parameters\":{\"binary_data_size\":1024}}]}"
printf '%s%s' "$J" 'twelve bytes' >"$TMP/req"
expect "binary tail shorter than binary_data_size" 400 "input 'x': binary data needs 1024 bytes at offset 0 of the binary section, but only 12 remain" \
    POST /v2/models/$G/infer -H "Inference-Header-Content-Length: ${#J}" --data-binary @"$TMP/req"
expect "bad Inference-Header-Content-Length" 400 "Inference-Header-Content-Length 'abc' is not a non-negative integer" \
    POST /v2/models/$G/infer -H 'Inference-Header-Content-Length: abc' --data-binary '{}'
expect "binary tail without the header" 400 "needs the Inference-Header-Content-Length header" \
    POST /v2/models/$G/infer --data-binary "{\"inputs\":[]}xyz"
expect "wrong method on infer" 405 "method GET not allowed on /v2/models/$G/infer (allowed: POST)" GET /v2/models/$G/infer
[ "$(header Allow)" = POST ] && pass "405 carries Allow: POST" || fail "405 Allow header: '$(header Allow)'"
expect "wrong method on health" 405 "method DELETE not allowed" DELETE /v2/health/live
[ "$(header Allow)" = "GET, HEAD" ] && pass "405 carries Allow: GET, HEAD" || fail "405 Allow header: '$(header Allow)'"
expect "POST to metadata" 405 "method POST not allowed" POST /v2/models/$G --data-binary '{}'
expect "unknown path" 404 "unknown path '/v2/foo'" GET /v2/foo
expect "unknown path outside /v2" 404 "unknown path '/stats'" GET /stats
expect "unknown model action" 404 "unknown path" GET /v2/models/$G/nope
# The engine's output overflows to Inf/NaN: JSON cannot carry it -> 500, binary can.
BIG=$($PYTHON -c 'print(",".join(["3e38"] * 256))')
expect_json "server-side failure (non-finite output as JSON)" 500 "which JSON cannot carry" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$BIG]}]}"
expect_json "same request with binary output" 200 '"binary_data_size":1024' \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$BIG]}],\"parameters\":{\"binary_data_output\":true}}"
# Triton's classification extension: y's top 3 as BYTES "value:index",
# checked against y's own values from the same request without it (a
# request alone replays the same batch, bit for bit); "%f" of the exact
# FP32 value, as the server prints it.
Z=$($PYTHON -c 'print(",".join(str((i % 7) / 7.0 - 0.4) for i in range(256)))')
req POST /v2/models/$G/infer -H 'Content-Type: application/json' --data-binary "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$Z]}]}"
cp "$TMP/body" "$TMP/values"
expect_json "classification: top 3 of y as BYTES" 200 '"datatype":"BYTES","shape":[1,3]' \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$Z]}],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":3}}]}"
if $PYTHON - "$TMP/values" "$TMP/body" <<'EOF'
import json, struct, sys
y = [struct.unpack("f", struct.pack("f", v))[0] for v in json.load(open(sys.argv[1]))["outputs"][0]["data"]]
got = json.load(open(sys.argv[2]))["outputs"][0]["data"]
want = ["%f:%d" % (y[i], i) for i in sorted(range(len(y)), key=lambda i: (-y[i], i))[:3]]
sys.exit(0 if got == want else 1)
EOF
then pass "classification: the top 3 of y's own values, best first"; else fail "classification: not y's top 3"; fi
expect_json "classification of 0 classes refused" 400 "output 'y': parameters.classification must be at least 1" \
    "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$Z]}],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":0}}]}"
# Triton's trace extension (trace_file given at startup): three requests
# traced, written as one file of three (log_frequency 3), each with its id
# and timestamps in order
expect "trace: no client chooses the file" 400 "trace_file cannot be changed here" POST /v2/trace/setting \
    --data-binary '{"trace_file":"/tmp/elsewhere.json","trace_level":["TIMESTAMPS"]}'
expect "trace: enabled" 200 '"trace_level":["TIMESTAMPS"]' POST /v2/trace/setting \
    --data-binary '{"trace_level":["TIMESTAMPS"],"trace_rate":"1","log_frequency":"3"}'
for i in 1 2 3; do
    req POST /v2/models/$G/infer -H 'Content-Type: application/json' \
        --data-binary "{\"id\":\"tr$i\",\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$Z]}]}"
done
i=0 # the third trace is taken once its answer is out: the file may come just after
while [ ! -f "$TR.0" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
if $PYTHON - "$TR.0" <<'EOF'
import json, sys
names = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
         "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END"]
t = json.load(open(sys.argv[1]))
ok = [x["request_id"] for x in t] == ["tr1", "tr2", "tr3"] and all(
    [s["name"] for s in x["timestamps"]] == names and
    all(a["ns"] <= b["ns"] for a, b in zip(x["timestamps"], x["timestamps"][1:])) for x in t)
sys.exit(0 if ok else 1)
EOF
then pass "trace: 3 requests in $TR.0, every timestamp in order"; else fail "trace file: $(head -c 400 "$TR.0" 2>&1)"; fi
expect "trace: the model's settings follow the global ones" 200 "\"trace_file\":\"$TR\"" GET /v2/models/$G/trace/setting
expect "trace: a bad setting refused" 400 "trace_rate must be an integer of at least 1" POST /v2/trace/setting \
    --data-binary '{"trace_rate":"0"}'
expect "trace: off" 200 '"trace_level":["OFF"]' POST /v2/trace/setting --data-binary '{"trace_level":["OFF"]}'
if grep -q " -> 400 (.*): unknown input 'q'" "$TMP/main.log" && grep -q " -> 404 (" "$TMP/main.log"; then
    pass "request errors are logged (debug level)"
else
    fail "request errors missing from the log"
fi

for body in '{"inputs":[{"name":"x","shape":[1,8,32],"datatype":"FP32","data":[[[[[[[[[[1]]]]]]]]]]}]}' \
    '{"inputs":[{"name":"x","shape":[99999999999,99999999999,32],"datatype":"FP32","data":[1]}]}' \
    '{"inputs":[{"name":"x","shape":[1,8,32],"datatype":"FP32","parameters":{"binary_data_size":-1}}]}' \
    "$($PYTHON -c 'print("[" * 100000)')" '{"id":"\ud800"}' 'null' '{"inputs":null,"outputs":7}'; do
    req POST /v2/models/$G/infer -H 'Inference-Header-Content-Length: 0' --data-binary "$body"
    req POST /v2/models/$G/infer --data-binary "$body"
done
# A client that half-closes once it has sent its requests (nc -N, HTTP
# conformance probes) gets every answer, then the close at once, not after
# request_timeout_ms (30 s): one request, three pipelined, and ("later")
# one answered on a kept-alive connection before a second comes with the
# FIN (the watcher's late peek, server/http_guard.c; it took the 30 s
# before).
for n in 1 3 later; do
    if out=$($PYTHON - "$URL" $n <<'EOF'
import socket, sys, time
host, port = sys.argv[1].rsplit("/", 1)[1].split(":")
req = b"GET /v2/health/live HTTP/1.1\r\nHost: t\r\n\r\n"
s = socket.create_connection((host, int(port)), timeout=20)
if sys.argv[2] == "later":
    n = 2
    s.sendall(req)
    first = b""
    while b'{"live":true}' not in first:
        d = s.recv(65536)
        if not d:
            break
        first += d
    time.sleep(0.05)
    # corked, the request and the FIN leave in one segment: libmicrohttpd
    # reads both in one edge and never sees the end (the case the peek is for)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_CORK, 1)
    s.send(req)
    s.shutdown(socket.SHUT_WR)
    data = first
else:
    n = int(sys.argv[2])
    s.sendall(req * n)
    s.shutdown(socket.SHUT_WR)
    data = b""
t0 = time.time()
while True:
    d = s.recv(65536)
    if not d:
        break
    data += d
took = time.time() - t0
print("%d answers, closed after %.3f s" % (data.count(b"HTTP/1.1 200"), took))
sys.exit(0 if data.count(b"HTTP/1.1 200") == n and took < 5 else 1)
EOF
    ); then
        pass "half-closed client with $n request(s): $out"
    else
        fail "half-closed client with $n request(s): ${out:-no answer}"
    fi
done
expect "still live after malformed requests" 200 '{"live":true}' GET /v2/health/live
infer_curl "still serving correct answers after every error" /v2/models/$G/infer --binary

# ---- other graphs and datatypes --------------------------------------------------
for g in vocab_embed_tp2 mlp_sp_bf16_tp2 mlp_sp_fp16_tp4 megatron_block_tp4; do
    start "$g" --graph "$TP_GRAPHS/$g.json" || continue
    for mode in "" --binary "--binary --binary-out"; do
        # shellcheck disable=SC2086
        if $CLIENT infer --url "$URL" --graphs "$TP_GRAPHS" --graph $g $mode >"$TMP/check" 2>&1; then
            pass "$g infer ${mode:-JSON} matches the reference"
        else
            fail "$g infer ${mode:-JSON}: $(cat "$TMP/check")"
        fi
    done
    kill "$PID"
    wait "$PID" 2>/dev/null
done

# ---- classification labels (--labels OUTPUT=FILE) --------------------------------
$PYTHON -c 'print("\n".join("class %d" % i for i in range(256)))' >"$TMP/labels.txt"
if start labels --graph "$TP_GRAPHS/$G.json" --labels "y=$TMP/labels.txt"; then
    expect_json "classification with labels" 200 '"datatype":"BYTES"' \
        "{\"inputs\":[{\"name\":\"x\",$X3,\"data\":[$Z]}],\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":4}}]}"
    if $PYTHON - "$TMP/body" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))["outputs"][0]["data"]
sys.exit(0 if len(d) == 4 and all(s.split(":")[2] == "class " + s.split(":")[1] for s in d) else 1)
EOF
    then pass "each class carries its line of the labels file"; else fail "labels: $(head -c 300 "$TMP/body")"; fi
    expect "model config names the labels file" 200 "\"label_filename\":\"$TMP/labels.txt\"" GET /v2/models/$G/config
    kill "$PID"
    wait "$PID" 2>/dev/null
fi
for bad in "z=$TMP/labels.txt|labels: 'z' is not an output of the graph (outputs: 'y')" \
    "y=$TMP/no_such_file|labels file $TMP/no_such_file: cannot open: No such file or directory" \
    "y|labels: 'y' is not OUTPUT=FILE"; do
    timeout 60 "$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --port 0 --labels "${bad%%|*}" >"$TMP/labels.log" 2>&1
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "${bad#*|}" "$TMP/labels.log"; then
        pass "serve refuses --labels ${bad%%|*} (exit $rc): ${bad#*|}"
    else
        fail "--labels ${bad%%|*}: exit $rc, $(tail -n 2 "$TMP/labels.log")"
    fi
done

# ---- while loading: live, but not ready; SIGTERM while loading ---------------------
# A FIFO as the graph file holds the load until the test writes the graph.
mkdir "$TMP/fifo"
cp "$TP_GRAPHS/$G.safetensors" "$TMP/fifo/"
start_loading() {
    rm -f "$TMP/fifo/$G.json"
    mkfifo "$TMP/fifo/$G.json"
    PORT=$(free_port)
    URL="http://127.0.0.1:$PORT"
    "$TPSERVE" serve --graph "$TMP/fifo/$G.json" --port "$PORT" --log-level debug >"$TMP/$1.log" 2>&1 &
    PID=$!
    PIDS="$PIDS $PID"
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/live")" = 200 ]; do
        i=$((i + 1))
        [ $i -gt 300 ] && { fail "$1: never live"; return 1; }
        sleep 0.1
    done
}
if start_loading loading; then
    expect "loading: live" 200 '{"live":true}' GET /v2/health/live
    expect "loading: not ready" 503 '{"ready":false}' GET /v2/health/ready
    expect "loading: model metadata unavailable" 503 "not ready: the graph is still loading" GET /v2/models/$G
    expect "loading: model not ready" 503 "still loading" GET /v2/models/$G/ready
    expect "loading: repository index empty (the name comes from the graph)" 200 "[]" POST /v2/repository/index
    expect_json "loading: infer refused" 503 "still loading" '{}'
    cat "$TP_GRAPHS/$G.json" >"$TMP/fifo/$G.json"
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] || [ $i -gt 300 ]; do
        i=$((i + 1))
        sleep 0.1
    done
    expect "ready once the graph has loaded" 200 '{"ready":true}' GET /v2/health/ready
    kill "$PID"
    wait "$PID" 2>/dev/null
fi
if start_loading loading2; then
    term_exits_logging "SIGTERM while loading: exit 0 without waiting for the load" "$TMP/loading2.log" \
        "while loading: exiting without serving"
fi

# ---- limits: 413, overload 503, config file + flag overrides ----------------------
cat >"$TMP/small.json" <<EOF
{"graph": "$TP_GRAPHS/$G.json", "max_body_bytes": 1, "threads": 1, "max_queue": 1, "log_level": "debug"}
EOF
start limits --config "$TMP/small.json" --max-body-bytes 4096 --connection-memory-bytes 8192 || exit 1
expect "config file + flag override in effect" 200 '{"ready":true}' GET /v2/health/ready
grep -q "max_body_bytes=4096" "$TMP/limits.log" && pass "flag overrides the config file (max_body_bytes=4096)" \
    || fail "startup line lacks max_body_bytes=4096: $(cat "$TMP/limits.log")"
if $CLIENT early413 --url "$URL" --path /v2/models/$G/infer --content-length 100000 >"$TMP/o" 2>&1; then
    pass "413 decided from Content-Length before the body is sent ($(cat "$TMP/o"))"
else
    fail "early 413: $(cat "$TMP/o")"
fi
head -c 8192 /dev/zero >"$TMP/8k"
expect "body over max_body_bytes" 413 "exceeds max_body_bytes 4096" POST /v2/models/$G/infer --data-binary @"$TMP/8k"
if $CLIENT chunked --url "$URL" --path /v2/models/$G/infer --bytes 65536 >"$TMP/o" 2>&1; then
    pass "chunked body growing past max_body_bytes gets 413 ($(cat "$TMP/o"))"
else
    fail "chunked 413: $(cat "$TMP/o")"
fi
# garbage on the wire (on this instance: a half-sent request can hold a
# connection until its timeout, which would only slow the main drain test)
$PYTHON - "$PORT" <<'EOF'
import socket, sys
port = int(sys.argv[1])
junk = [b"GARBAGE\r\n\r\n", b"\x00\xff\xfe" * 100 + b"\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /v2/models/mlp_sp_tp2/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{",
        b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n" + b"X-A: " + b"b" * 100000 + b"\r\n\r\n"]
for j in junk:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        s.sendall(j)
        s.shutdown(socket.SHUT_WR)
        s.recv(4096)
    except OSError:
        pass
    s.close()
EOF
expect "still live after 413s and garbage" 200 '{"live":true}' GET /v2/health/live
# headers live in the connection's pool (connection_memory_bytes, 8192 here
# as by default): what does not fit is refused with 431, nothing else
big_header() { head -c "$1" /dev/zero | tr '\0' a; }
expect "a 7000-byte header fits connection_memory_bytes 8192" 200 '{"live":true}' GET /v2/health/live \
    -H "X-Big: $(big_header 7000)"
expect "a 9000-byte header does not: 431" 431 "" GET /v2/health/live -H "X-Big: $(big_header 9000)"
expect "still live after 431" 200 '{"live":true}' GET /v2/health/live
kill "$PID"
wait "$PID" 2>/dev/null
# overload: a queue of one, held: the batcher waits up to 1 s for a fuller
# batch (max_queue_delay_us), so the first request sits in the queue and the
# 7 that follow find it full. Deterministic on any machine, unlike a race
# between uploads and steps (a faster engine once drained a queue of heavy
# requests before it filled).
# (and its startup log names the OpenBLAS kernels an environment forced:
# this VM's forces Haswell's where OpenBLAS would pick AVX-512 ones)
blas_env=${OPENBLAS_CORETYPE-unset}
export OPENBLAS_CORETYPE=Sandybridge
start overload --graph "$TP_GRAPHS/$G.json" --max-queue 1 --max-queue-delay-us 1000000 || exit 1
if [ "$blas_env" = unset ]; then unset OPENBLAS_CORETYPE; else OPENBLAS_CORETYPE=$blas_env; fi
grep -q "cpu backend: OpenBLAS kernels Sandybridge, forced by OPENBLAS_CORETYPE=Sandybridge" "$TMP/overload.log" &&
    grep -q "cpu backend: OpenBLAS kernels [A-Za-z0-9]*\( (detected)\|, forced by OPENBLAS_CORETYPE=\|, picked by tpserve for this CPU (OpenBLAS detected [A-Za-z0-9_]*, older kernels)\)" "$TMP/main.log" &&
    pass "startup log names the OpenBLAS kernels: $(grep -o 'OpenBLAS kernels.*' "$TMP/main.log")" ||
    fail "startup log lacks the OpenBLAS kernels line: $(grep -i blas "$TMP/overload.log" "$TMP/main.log")"
# Where OpenBLAS's table predates the CPU (0.3.21 on an Emerald Rapids runs
# Prescott's SSE3 kernels) tpserve forces newer ones and re-executes itself
# (kernels/cpu/blas_pick.h): the kernels named are the ones OpenBLAS then
# runs (openblas_get_corename), not the ones it detected, and the main
# server's answers above came from them.
picked=$(sed -n 's/.*OpenBLAS kernels \([A-Za-z0-9]*\), picked by tpserve for this CPU (OpenBLAS detected \([A-Za-z0-9_]*\),.*/\1 \2/p' "$TMP/main.log")
if [ -n "$picked" ]; then
    set -- $picked
    [ "$1" != "$2" ] && pass "tpserve runs OpenBLAS's $1 kernels where OpenBLAS detected $2" ||
        fail "picked kernels are the detected ones: $picked"
fi
LIGHT_HL=$($CLIENT make --graphs "$TP_GRAPHS" --graph $G --binary --binary-out --out "$TMP/light")
i=0
jobs_=""
while [ $i -lt 8 ]; do
    curl -s -o "$TMP/ov.$i" -w '%{http_code}\n' -H "Inference-Header-Content-Length: $LIGHT_HL" \
        --data-binary @"$TMP/light" "$URL/v2/models/$G/infer" >"$TMP/ovc.$i" &
    jobs_="$jobs_ $!"
    i=$((i + 1))
done
for j in $jobs_; do wait "$j"; done
n503=$(cat "$TMP"/ovc.* | grep -c '^503$')
n200=$(cat "$TMP"/ovc.* | grep -c '^200$')
if [ "$n503" -ge 1 ] && [ "$n200" -ge 1 ] && [ $((n503 + n200)) -eq 8 ] &&
    grep -q "server overloaded" "$TMP"/ov.*; then
    pass "overload: $n200 answered 200, $n503 got 503 'server overloaded'"
else
    fail "overload: 200 x $n200, 503 x $n503 of 8"
fi
expect "live after overload" 200 '{"live":true}' GET /v2/health/live
kill "$PID"
wait "$PID" 2>/dev/null

# queue wait over request_timeout_ms: 504, the request never runs. 4
# requests of 3 rows never fill a batch of 16, and the batcher would wait 1
# s for more: each expires in the queue at 30 ms, whatever the machine.
start timeout --graph "$TP_GRAPHS/$G.json" --request-timeout-ms 30 --max-queue-delay-us 1000000 || exit 1
i=0
jobs_=""
while [ $i -lt 4 ]; do
    curl -s -o "$TMP/to.$i" -w '%{http_code}\n' -H "Inference-Header-Content-Length: $LIGHT_HL" \
        --data-binary @"$TMP/light" "$URL/v2/models/$G/infer" >"$TMP/toc.$i" &
    jobs_="$jobs_ $!"
    i=$((i + 1))
done
for j in $jobs_; do wait "$j"; done
n504=$(cat "$TMP"/toc.* | grep -c '^504$')
inferred=$(curl -s "$URL/metrics" | awk '$1 == "tpserve_inference_count_total" { print $2 }')
if [ "$n504" -eq 4 ] && grep -q "in the queue, over request_timeout_ms 30" "$TMP"/to.* && [ "$inferred" = 0 ]; then
    pass "queue wait over request_timeout_ms: $n504 of 4 got 504, none ran"
else
    fail "request timeout: codes $(cat "$TMP"/toc.* | tr '\n' ' '), rows inferred $inferred"
fi
kill "$PID"
wait "$PID" 2>/dev/null

# ---- startup errors -----------------------------------------------------------------
"$TPSERVE" serve --graph "$TP_GRAPHS/nonexistent.json" --port 0 >"$TMP/bad.log" 2>&1
rc=$?
if [ $rc -ne 0 ] && grep -q "cannot load graph" "$TMP/bad.log"; then pass "missing graph: exit $rc, logged"; else fail "missing graph: exit $rc: $(cat "$TMP/bad.log")"; fi
"$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --bogus 1 >"$TMP/bad.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "unknown option '--bogus'" "$TMP/bad.log"; then pass "unknown flag: exit 2"; else fail "unknown flag: exit $rc: $(cat "$TMP/bad.log")"; fi
echo '{"colour": 1}' >"$TMP/badcfg.json"
"$TPSERVE" serve --config "$TMP/badcfg.json" >"$TMP/bad.log" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "unknown key 'colour'" "$TMP/bad.log"; then pass "unknown config key: exit 2, named"; else fail "unknown config key: exit $rc: $(cat "$TMP/bad.log")"; fi
"$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --port "$(echo "$MAIN_URL" | sed 's/.*://')" >"$TMP/bad.log" 2>&1
rc=$?
if [ $rc -eq 1 ] && grep -q "cannot listen on 127.0.0.1" "$TMP/bad.log"; then pass "port in use: exit 1, named"; else fail "port in use: exit $rc: $(cat "$TMP/bad.log")"; fi

# ---- graceful shutdown ---------------------------------------------------------------
# main server: SIGTERM with a request in flight and an idle keep-alive client
if $CLIENT drain --url "$MAIN_URL" --pid "$MAIN_PID" --graphs "$TP_GRAPHS" --graph $G >"$TMP/o" 2>&1; then
    sed 's/^/    /' "$TMP/o"
    pass "drain with an in-flight request"
else
    sed 's/^/    /' "$TMP/o"
    fail "drain with an in-flight request"
fi
wait "$MAIN_PID"
rc=$?
[ $rc -eq 0 ] && pass "exit code 0 after the drain" || fail "exit code $rc after the drain"

# SIGTERM under concurrent load: 20 curl loops; each request must end either
# answered (200, or 503 once draining) or refused at connect (curl exit 7).
start load --graph "$TP_GRAPHS/$G.json" --threads 2 || exit 1
$CLIENT make --graphs "$TP_GRAPHS" --graph $G --repeat 30 --out "$TMP/load" >/dev/null
i=0
jobs_=""
while [ $i -lt 20 ]; do
    (
        n=0
        while [ $n -lt 200 ] && [ ! -f "$TMP/stop" ]; do
            code=$(curl -s -o "$TMP/lb.$i" -w '%{http_code}' --max-time 30 --data-binary @"$TMP/load" "$URL/v2/models/$G/infer")
            rc=$?
            echo "$rc $code" >>"$TMP/lr.$i"
            [ $rc -eq 7 ] && break
            n=$((n + 1))
        done
    ) &
    jobs_="$jobs_ $!"
    i=$((i + 1))
done
sleep 1.5
kill -TERM "$PID"
t0=$(date +%s)
wait "$PID"
rc=$?
touch "$TMP/stop"
for j in $jobs_; do wait "$j"; done
[ $rc -eq 0 ] && pass "exit code 0 after SIGTERM under load ($(($(date +%s) - t0)) s)" || fail "exit code $rc after SIGTERM under load"
cat "$TMP"/lr.* >"$TMP/load.all"
total=$(wc -l <"$TMP/load.all")
ok200=$(grep -c '^0 200$' "$TMP/load.all")
ok503=$(grep -c '^0 503$' "$TMP/load.all")
refused=$(grep -c '^7 ' "$TMP/load.all")
bad=$(grep -v -e '^0 200$' -e '^0 503$' -e '^7 ' "$TMP/load.all" | sort | uniq -c | tr '\n' ';')
inflight=$(sed -n 's/.*received SIGTERM.* for \([0-9]*\) in-flight.*/\1/p' "$TMP/load.log")
if [ -z "$bad" ] && [ "$ok200" -gt 0 ]; then
    pass "SIGTERM under load: $total requests, $ok200 answered 200, $ok503 answered 503, $refused refused at connect, none dropped (${inflight:-?} in flight at SIGTERM)"
else
    fail "SIGTERM under load: dropped or failed requests (curl-exit http-code: count): $bad"
fi
grep -q "drained: every accepted request was answered" "$TMP/load.log" && pass "drain logged" || fail "no drain line in the log"

# pin_threads (the default): each HTTP thread keeps to one CPU, and a
# client's connection goes to the thread on the CPU it sent from (two CPUs
# needed to see it)
cpus=$(two_cpus)
if [ -z "$cpus" ]; then
    echo "pin_threads: skipped: one CPU (or no taskset)"
else
    # shellcheck disable=SC2086 # the two CPUs become $1 and $2
    set -- $cpus
    # servers and clients on these two CPUs only, until this check ends:
    # pin_threads wants a thread for each CPU
    shell_cpus=$(taskset -c -p $$ | sed 's/.*: //')
    taskset -c -p "$1,$2" $$ >/dev/null
    start pinned --graph "$TP_GRAPHS/$G.json" --threads 2 --log-level info || exit 1
    $CLIENT make --graphs "$TP_GRAPHS" --graph $G --out "$TMP/pin_req" >/dev/null
    ok=1
    for c in "$1" "$2" "$1" "$2"; do
        code=$(taskset -c "$c" curl -s -o "$TMP/pin_out.$c" -w '%{http_code}' --data-binary @"$TMP/pin_req" "$URL/v2/models/$G/infer")
        [ "$code" = 200 ] && cmp -s "$TMP/pin_out.$1" "$TMP/pin_out.$c" || ok=0
    done
    pinned=$(for t in /proc/$PID/task/*; do [ "$(cat "$t/comm")" = MHD-single ] && taskset -pc "${t##*/}" | sed 's/.*: //'; done | sort | tr '\n' ' ')
    want=$(printf '%s\n%s\n' "$1" "$2" | sort | tr '\n' ' ')
    if [ $ok = 1 ] && [ "$pinned" = "$want" ] && grep -q "pin_threads: HTTP threads on CPUs $1,$2; each connection goes to the thread on the CPU" "$TMP/pinned.log"; then
        pass "pin_threads: the HTTP threads run on CPUs $want(one each), requests from either CPU answered alike"
    else
        fail "pin_threads: answers ok=$ok, HTTP threads' CPUs '$pinned' (want '$want'): $(grep -a pin_threads "$TMP/pinned.log")"
    fi
    # A client that connects from CPU $1 and then moves to $2, while two
    # busy loops keep $1: the thread pinned there waits for its CPU while
    # $2 idles, so the guard lets it go (cpu_pin.h), logged and counted.
    $PYTHON - "$PORT" "$G" "$TMP/pin_req" "$TMP/pinned.log" "$1" "$2" <<'EOF' >"$TMP/o" 2>&1
import http.client, os, subprocess, sys, time
port, model, req, log, a, b = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
body = open(req, "rb").read()
os.sched_setaffinity(0, {a})
c = http.client.HTTPConnection("127.0.0.1", int(port), timeout=10)
def infer():
    c.request("POST", f"/v2/models/{model}/infer", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    r.read()
    assert r.status == 200, r.status
infer()  # connected from CPU a: the thread pinned there serves it
os.sched_setaffinity(0, {b})
hogs = [subprocess.Popen(["taskset", "-c", str(a), "sh", "-c", "while :; do :; done"]) for _ in range(2)]
def idle_s(cpu):  # CPU cpu's idle + iowait time so far
    for line in open("/proc/stat"):
        f = line.split()
        if f[0] == f"cpu{cpu}":
            return (int(f[4]) + int(f[5])) / os.sysconf("SC_CLK_TCK")
    return 0.0
n, seen, start, idle0 = 0, False, time.time(), idle_s(b)
try:
    while not seen and time.time() - start < 15:
        infer()
        n += 1
        seen = n % 100 == 0 and "unpinned: in" in open(log, errors="replace").read()
finally:
    for h in hogs:
        h.kill()
took = time.time() - start
print(f"{n} requests in {took:.1f} s, unpinned: {seen}, CPU {b} idle {100 * (idle_s(b) - idle0) / took:.0f}%")
EOF
    unpins=$(curl -s "$URL/metrics" | sed -n 's/^tpserve_http_thread_pin_changes_total{to="unpinned"} //p')
    # starvation needs CPU $2 to idle: busy with other work, the pin stays
    b_idle=$(sed -n 's/.* idle \([0-9]*\)%$/\1/p' "$TMP/o")
    if grep -q "unpinned: False" "$TMP/o" && [ "${b_idle:-100}" -lt 25 ]; then
        echo "pin_threads: unpinning skipped: CPU $2 was busy with other work ($(cat "$TMP/o"))"
    elif grep -q "unpinned: True" "$TMP/o" && [ "${unpins:-0}" -ge 1 ]; then
        pass "pin_threads: a thread its CPU starves while another idles is unpinned ($(cat "$TMP/o"); $(grep -a -m1 'unpinned: in' "$TMP/pinned.log" | sed 's/.*unpinned: //'))"
    else
        fail "pin_threads: no unpin beside two busy loops (metrics: ${unpins:-none}): $(cat "$TMP/o")"
    fi
    kill "$PID"
    wait "$PID"
    # A pinned thread that someone moves (taskset -p) stays where it was
    # put: the guard sees its CPUs changed when its window ends.
    start moved --graph "$TP_GRAPHS/$G.json" --threads 2 --log-level info || exit 1
    taskset -c "$1" curl -s -o /dev/null --data-binary @"$TMP/pin_req" "$URL/v2/models/$G/infer"
    tid=$(for t in /proc/$PID/task/*; do [ "$(cat "$t/comm")" = MHD-single ] && [ "$(taskset -pc "${t##*/}" | sed 's/.*: //')" = "$1" ] && echo "${t##*/}"; done | head -n 1)
    if [ -n "$tid" ] && taskset -c -p "$2" "$tid" >/dev/null; then
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            taskset -c "$1" curl -s -o /dev/null --data-binary @"$TMP/pin_req" "$URL/v2/models/$G/infer"
            sleep 0.1
        done
    fi
    now=$(taskset -pc "${tid:-0}" 2>/dev/null | sed 's/.*: //')
    if [ -n "$tid" ] && [ "$now" = "$2" ] && grep -q "unpinned: its CPUs changed since it was pinned (taskset?); left as they are" "$TMP/moved.log"; then
        pass "pin_threads: a pinned thread moved by taskset stays on CPU $2, where it was put, and the log says so"
    else
        fail "pin_threads: thread '${tid:-none}' moved to CPU $2 is on '$now': $(grep -a pin_threads "$TMP/moved.log")"
    fi
    kill "$PID"
    wait "$PID"
    # left unpinned: when asked, and with fewer HTTP threads than CPUs
    for args in "--pin-threads 0" "--threads 1"; do
        # shellcheck disable=SC2086 # args splits into flags on purpose
        start unpinned --graph "$TP_GRAPHS/$G.json" --log-level info $args || exit 1
        code=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @"$TMP/pin_req" "$URL/v2/models/$G/infer")
        one_cpu=$(for t in /proc/$PID/task/*; do [ "$(cat "$t/comm")" = MHD-single ] && taskset -pc "${t##*/}" | sed 's/.*: //'; done | grep -cv '[,-]')
        said=yes
        [ "$args" = "--threads 1" ] && ! grep -q "pin_threads: HTTP threads left unpinned: 1 for the 2 CPUs" "$TMP/unpinned.log" && said=no
        if [ "$code" = 200 ] && [ "$one_cpu" = 0 ] && [ $said = yes ]; then
            pass "pin_threads: $args leaves every HTTP thread free to use both CPUs"
        else
            fail "pin_threads: $args: answer $code, $one_cpu HTTP threads on one CPU, log said it: $said"
        fi
        kill "$PID"
        wait "$PID"
    done
    taskset -c -p "$shell_cpus" $$ >/dev/null
fi

# a client that stalls mid-upload cannot hold the shutdown past drain_timeout_ms
start stall --graph "$TP_GRAPHS/$G.json" --drain-timeout-ms 1000 || exit 1
$PYTHON - "$PORT" "$PID" <<'EOF' >"$TMP/o" 2>&1
import os, signal, socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
s.sendall(b"POST /v2/models/mlp_sp_tp2/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"in")
time.sleep(0.3)
os.kill(int(sys.argv[2]), signal.SIGTERM)
# held until the server lets go of it (its exit closes it), 4 s at most
s.settimeout(4)
try:
    while s.recv(4096):
        pass
except OSError:
    pass
s.close()
EOF
wait "$PID"
rc=$?
if [ $rc -eq 0 ] && grep -q "dropping 1 requests whose body never finished arriving" "$TMP/stall.log"; then
    pass "stalled upload: drain cut at drain_timeout_ms, exit 0"
else
    fail "stalled upload: exit $rc: $(cat "$TMP/o" "$TMP/stall.log")"
fi

# wrk_post_script BODY LUA: a wrk script that POSTs the JSON request in BODY
wrk_post_script() {
    cat >"$2" <<EOF
local f = io.open("$1", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
EOF
}

# the same under wrk, when installed: no read errors or timeouts (connect and
# write errors are refused reconnects after the listener closed)
if command -v wrk >/dev/null 2>&1; then
    start wrk --graph "$TP_GRAPHS/$G.json" --threads 2 || exit 1
    wrk_post_script "$TMP/load" "$TMP/post.lua"
    wrk -t2 -c16 -d4s --timeout 10s -s "$TMP/post.lua" "$URL/v2/models/$G/infer" >"$TMP/wrk.out" 2>&1 &
    WRK=$!
    sleep 1.5
    kill -TERM "$PID"
    wait "$PID"
    rc=$?
    kill -INT "$WRK" # its report now: nothing is listening any more
    wait "$WRK"
    errs=$(sed -n 's/.*Socket errors: \(.*\)/\1/p' "$TMP/wrk.out")
    reqs=$(sed -n 's/^ *\([0-9]*\) requests in.*/\1/p' "$TMP/wrk.out")
    case "$errs" in *"read 0,"*"timeout 0"* | "") rerr=0 ;; *) rerr=1 ;; esac
    if [ $rc -eq 0 ] && [ $rerr -eq 0 ] && [ "${reqs:-0}" -gt 0 ]; then
        pass "SIGTERM during wrk: exit 0, $reqs responses, socket errors: ${errs:-none}"
    else
        fail "SIGTERM during wrk: exit $rc, socket errors: $errs"
        cat "$TMP/wrk.out"
    fi
else
    echo "SKIP: wrk not installed (the curl load above covers SIGTERM under load)"
fi

# Clients that leave early, under load (wrk, 32 connections). Under load
# their requests go to the batcher thread and their connections are
# suspended until the result comes (server/http_request.c).
# - Half-closed: each sends one request, shuts its write side and reads the
#   answer. Suspended from the pass that read the body, libmicrohttpd 0.9.75
#   read the EOF on resume, took it as an abort and dropped the answer (1-9
#   of 200 in half of the runs by hand; this check failed 3 of 3 tries on
#   that code). Timing decides, so it may not fail every run if that comes
#   back.
# - Reset: each sends one request and resets the connection at once. A reset
#   read between the pass that submitted the request and the one that would
#   suspend it leaves the request to its batch (server/handoff.h; a few in
#   3,000); under the sanitizers a use after free or a leak there fails.
#   Every request is still accounted for: the drain at SIGTERM finds none
#   left in flight.
if command -v wrk >/dev/null 2>&1; then
    start early --graph "$TP_GRAPHS/$G.json" --threads 2 --log-level debug || exit 1
    $CLIENT make --graphs "$TP_GRAPHS" --graph $G --out "$TMP/early_req" >/dev/null
    wrk_post_script "$TMP/early_req" "$TMP/early.lua"
    # until the clients below are done (stopped then, -d is only a bound)
    wrk -t2 -c32 -d60s -s "$TMP/early.lua" "$URL/v2/models/$G/infer" >"$TMP/early_wrk.out" 2>&1 &
    WRK=$!
    sleep 1
    out=$($PYTHON - "$URL" "$G" "$TMP/early_req" <<'EOF'
import socket, struct, sys, time
host, port = sys.argv[1].rsplit("/", 1)[1].split(":")
body = open(sys.argv[3], "rb").read()
req = (b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
       b"Content-Length: %d\r\n\r\n" % (sys.argv[2].encode(), len(body))) + body
for k in range(3000):
    s = socket.create_connection((host, int(port)), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.sendall(req)
    if k % 10:
        time.sleep(k % 10 * 2e-5)
    s.close()
answered = tried = 0
t_end = time.time() + 4
while time.time() < t_end:
    s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(req)
    s.shutdown(socket.SHUT_WR)
    data = b""
    while True:
        d = s.recv(65536)
        if not d:
            break
        data += d
    s.close()
    tried += 1
    answered += data.startswith(b"HTTP/1.1 200")
print("%d of %d answered" % (answered, tried))
sys.exit(0 if answered == tried and tried > 50 else 1)
EOF
    ) && ok=1 || ok=0
    if [ $ok -eq 1 ]; then
        pass "half-closed clients under wrk load: $out"
    else
        fail "half-closed clients under wrk load: ${out:-no answer}"
    fi
    kill -INT "$WRK"
    wait "$WRK"
    infer_curl "after 3,000 reset clients under wrk load, still answering" /v2/models/$G/infer
    orphans=$(grep -c "connection closed before its request ran" "$TMP/early.log")
    term_exits_logging "reset clients under wrk load: every request accounted for at the drain, exit 0 \
($orphans left to their batch)" "$TMP/early.log" "drained: every accepted request was answered"
fi

echo "test_server: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
