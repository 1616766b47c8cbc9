#!/bin/sh
# bench_http.sh — `make bench-http`: wrk against tpserve serving the example
# graph, then against bare_http (libmicrohttpd alone, the same daemons fed
# by the same accept thread, answering the bytes tpserve answered) with the same scripts and
# concurrencies, then against bare_http --graph (the same plus the graph's
# engine run on one row before each answer: the HTTP stack and one engine
# step per request, no codec, no batching), and a markdown table: requests/s, p50/p99 latency, the
# average batch (rows per engine execution, from /metrics) and tpserve's
# throughput as a fraction of the bare HTTP stack (and of bare + model) on this machine, and for
# both servers the server-side CPU time and context switches per request
# (/proc/PID/stat utime+stime and /proc/PID/task/*/status ctxt_switches,
# summed over the server and its direct children: with --ranks processes the
# rank workers count too).
#
# env: TPSERVE (build/tpserve), BARE_HTTP (build/bench/bare_http),
#      WAKE_COST (build/bench/wake_cost: a line on what a wake-up costs here),
#      TP_GRAPHS (build/graphs), PYTHON (python3), GRAPH (mlp_sp_tp2),
#      DURATION (seconds per run, 4), ROUNDS (3), CONNS (connection counts, "1 8 32"),
#      THREADS (server threads for every server; default tpserve's own
#      choice, one per usable core from 2 to 16), TPSERVE_ARGS (extra
#      serve flags, e.g. "--max-queue-delay-us 0"), KEEP_TMP=1.
#      TRITON: 1 installs Triton (scripts/install_triton.sh, build/venv-triton)
#      for the Triton columns, 0 leaves them out; unset, they are there when
#      Triton is already installed (in TRITON_VENV, build/venv-triton).
# The Triton columns: the same scripts against Triton's tritonserver serving
# the same function with its Python backend (tests/load/triton/: a NumPy
# model with the graph's weights, config copied from tpserve's), checked to
# answer what tpserve answers before it is timed. Triton that cannot be
# installed, started or checked leaves its columns empty with the reason,
# never fails the run.
# With perf_analyzer installed (scripts/install_perf_analyzer.sh; it lives in
# build/venv-perf), a second table: Triton's own load generator against
# tpserve with binary tensors, JSON tensors and system shared memory, in its
# 0.25 s windows (PERF_WINDOW_ARGS; DURATION does not apply: longer windows run
# away in perf_analyzer's own bookkeeping, server/README.md at 27cb4dd).
# When the environment forces OpenBLAS's kernel set (OPENBLAS_CORETYPE), a
# third table: a second tpserve started without it, in the same rounds.
# Timings never fail the run (noisy machines); wrk errors are reported.
set -u
TPSERVE=${TPSERVE:-build/tpserve}
BARE_HTTP=${BARE_HTTP:-build/bench/bare_http}
TP_GRAPHS=${TP_GRAPHS:-build/graphs}
PYTHON=${PYTHON:-python3}
G=${GRAPH:-mlp_sp_tp2}
DURATION=${DURATION:-4}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-"1 8 32"}
TOP_CONNS=$(echo "$CONNS" | tr ' ' '\n' | sort -n | tail -n 1)
# the client-without-preemption rows: chrt (util-linux) runs wrk as SCHED_BATCH
BATCH_WRK=$(command -v chrt || true)
THREADS=${THREADS:-0}
TPSERVE_ARGS=${TPSERVE_ARGS:-}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
# the server-on-one-core and pinned rows: taskset (util-linux) and two CPUs to split
# shellcheck source=tests/integration/lib/cpus.sh
. "$ROOT/tests/integration/lib/cpus.sh"
PIN_CPUS=$(two_cpus)
BENCH_NAME=bench_http
# shellcheck source=tests/load/bench_lib.sh
. "$HERE/bench_lib.sh"
[ -x "$BARE_HTTP" ] || die "no bare_http binary at $BARE_HTTP (make build/bench/bare_http)"
# What a wake-up costs here (tests/bench/wake_cost.c), measured before any
# server runs: the ratios below move with it from one machine to another.
WAKE_LINE=""
[ -x "${WAKE_COST:-}" ] && WAKE_LINE=$("$WAKE_COST")

free_port() {
    $PYTHON -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_up URL NAME: until URL answers 200; 1 with the reason in WHY when the
# server ($PID, its output in $TMP/NAME.log) exits or is not up after 60 s.
wait_up() {
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = 200 ]; do
        if ! kill -0 "$PID" 2>/dev/null; then
            WHY="$2 exited during startup: $(cat "$TMP/$2.log")"
            return 1
        fi
        i=$((i + 1))
        [ $i -gt 600 ] && WHY="$2 not up after 60 s" && return 1
        sleep 0.1
    done
}

stop_server() {
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=""
}

# metric NAME: its value from tpserve's /metrics.
metric() {
    curl -s "$BASE/metrics" | awk -v k="$1" '$1 == k { print $2 }'
}

# proc_sample: "CPU_TICKS CTX_SWITCHES" of $PID and its direct children.
proc_sample() {
    pids="$PID $(cat /proc/"$PID"/task/*/children 2>/dev/null)"
    ticks=0
    ctx=0
    for p in $pids; do
        t=$(sed 's/^.*) //' /proc/"$p"/stat 2>/dev/null | awk '{ print $12 + $13 }')
        c=$(cat /proc/"$p"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s + 0 }')
        ticks=$((ticks + ${t:-0}))
        ctx=$((ctx + ${c:-0}))
    done
    echo "$ticks $ctx"
}

# run_wrk SCRIPT CONNS: one wrk run against $BASE; sets RPS P50 P99 ERR
# (latencies in ms) and CPU_US CTX (server CPU microseconds and context
# switches per request). WRK_BATCH=1: wrk runs as SCHED_BATCH (chrt -b);
# WRK_CPU=N: wrk runs on CPU N only, with WRK_THREADS threads.
run_wrk() {
    t=2
    [ "$2" -lt 2 ] && t=1
    s0=$(proc_sample)
    # shellcheck disable=SC2046 # the prefix is words or nothing
    $([ -z "${WRK_BATCH:-}" ] || echo chrt -b 0) $([ -z "${WRK_CPU:-}" ] || echo taskset -c "$WRK_CPU") \
        wrk -t"${WRK_THREADS:-$t}" -c"$2" -d"${DURATION}s" -s "$HERE/$1" "$BASE/v2/models/$G/infer" >"$TMP/wrk.out" 2>&1
    s1=$(proc_sample)
    line=$(sed -n 's/^TPBENCH //p' "$TMP/wrk.out")
    [ -n "$line" ] || die "wrk printed no summary: $(cat "$TMP/wrk.out")"
    n=$(echo "$line" | sed 's/^requests=\([0-9]*\).*/\1/')
    hz=$(getconf CLK_TCK)
    CPU_US=$(echo "$s0 $s1" | awk -v n="$n" -v hz="$hz" '{ printf "%.0f", n ? ($3 - $1) * 1e6 / hz / n : 0 }')
    CTX=$(echo "$s0 $s1" | awk -v n="$n" '{ printf "%.2f", n ? ($4 - $2) / n : 0 }')
    RPS=$(echo "$line" | sed 's/.*rps=\([^ ]*\).*/\1/')
    P50=$(echo "$line" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^p50_us=/) printf "%.2f", substr($i, 8) / 1000 }')
    P99=$(echo "$line" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^p99_us=/) printf "%.2f", substr($i, 8) / 1000 }')
    ERR=$(echo "$line" | awk '{ e = 0; for (i = 1; i <= NF; i++) if ($i ~ /^(errors|non2xx)=/) { split($i, a, "="); e += a[2] } print e }')
}

# script_for LOAD: the wrk script of a kind of load.
script_for() {
    case $1 in
    json) echo infer_json.lua ;;
    binary) echo infer_binary.lua ;;
    mixed) echo mixed_batch.lua ;;
    esac
}

# counts_tpserve, counts_triton, counts_none: "ROWS EXECUTIONS" so far (rows
# inferred, model executions) from tpserve's /metrics, Triton's statistics
# extension, or nowhere (bare_http runs no model).
counts_tpserve() {
    echo "$(metric tpserve_inference_count_total) $(metric tpserve_execution_count_total)"
}
counts_triton() {
    curl -s "$BASE/v2/models/$G/stats" |
        sed -n 's/.*"inference_count":\([0-9]*\),"execution_count":\([0-9]*\).*/\1 \2/p'
}
counts_none() {
    echo "0 0"
}

# keep_server NAME: the server just started ($PID, answering at $BASE) stays
# up for the rounds under NAME; use_server NAME makes it $PID and $BASE again.
keep_server() {
    echo "$1 $PID $BASE" >>"$TMP/servers"
    SERVERS="$SERVERS $PID"
    PID=""
}
use_server() {
    PID=$(awk -v n="$1" '$1 == n { print $2 }' "$TMP/servers")
    BASE=$(awk -v n="$1" '$1 == n { print $3 }' "$TMP/servers")
}

# run_row NAME COUNTS RESULTS ROUND LOAD CONNS: one wrk run against server
# NAME, a line appended to RESULTS: "round load conns req/s p50 p99 errors
# cpu_us ctx batch", batch being rows per model execution (from the COUNTS
# function; - when it counts none).
run_row() {
    use_server "$1"
    n0=$($2)
    run_wrk "$(script_for "$5")" "$6"
    n1=$($2)
    batch=$(echo "$n0 $n1" | awk '{ e = $4 - $2; if (e > 0) printf "%.2f", ($3 - $1) / e; else print "-" }')
    echo "$4 $5 $6 $RPS $P50 $P99 $ERR $CPU_US $CTX $batch" >>"$3"
    echo "  round $4, $1 $5 c=$6: $RPS req/s, p50 $P50 ms, p99 $P99 ms, batch $batch, errors $ERR, $CPU_US us CPU and $CTX context switches per request" >&2
    PID=""
}

# warm_up NAME LOAD: a run not reported.
warm_up() {
    use_server "$1"
    run_wrk "$(script_for "$2")" 8
    PID=""
}

# ---- tpserve ------------------------------------------------------------------
PORT=$(free_port)
BASE="http://127.0.0.1:$PORT"
# shellcheck disable=SC2086 # TPSERVE_ARGS splits into flags on purpose
"$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --port "$PORT" --threads "$THREADS" \
    --log-level info --allow-client-shm 1 $TPSERVE_ARGS >"$TMP/tpserve.log" 2>&1 &
PID=$!
wait_up "$BASE/v2/health/ready" tpserve || die "$WHY"
# THREADS 0: the other servers get as many threads as tpserve chose
for _ in 1 2 3 4 5 6 7 8 9 10; do
    grep -q ' ready: .* threads=' "$TMP/tpserve.log" && break
    sleep 0.1
done
THREADS=$(sed -n 's/.* ready: .* threads=\([0-9]*\).*/\1/p' "$TMP/tpserve.log" | head -1)
[ -n "$THREADS" ] || die "tpserve's log has no 'ready: ... threads=N' line"

# The answers bare_http will send: tpserve's own, for 1-row requests.
$PYTHON "$HERE/sample_answers.py" save "$BASE" "$G" "$TMP" || die "cannot save tpserve's answers"
BIN_HL=$(cat "$TMP/ans.bin.hl")
# Triton's model configuration is copied from this one.
curl -s -o "$TMP/config.json" "$BASE/v2/models/$G/config"
# ---- perf_analyzer (when installed) ---------------------------------------------
if [ -x "$HERE/../../build/venv-perf/bin/perf_analyzer" ] &&
    "$HERE/../../scripts/install_perf_analyzer.sh" >"$TMP/pa.env" 2>/dev/null; then
    eval "$(cat "$TMP/pa.env")"
    for mode in binary json shm; do
        eval "args=\$PERF_ARGS_$mode"
        for c in $CONNS; do
            # shellcheck disable=SC2086 # args splits into flags on purpose
            LD_LIBRARY_PATH="$PERF_LIBS" timeout 120 "$PERF_ANALYZER" -m "$G" -u "127.0.0.1:$PORT" \
                -i http --concurrency-range "$c" $PERF_WINDOW_ARGS -s 1000 --percentile=50 \
                $args >"$TMP/pa.out" 2>&1
            line=$(sed -n "s/^Concurrency: $c, throughput: \([0-9.]*\) infer\/sec, latency \([0-9]*\) usec.*/\1 \2/p" "$TMP/pa.out")
            if [ -z "$line" ]; then
                line="failed -"
                # why, under the table: its last message (e.g. no stable window in time)
                echo "perf_analyzer $mode c=$c: $(grep -v '^ *$' "$TMP/pa.out" | tail -n 1)" >>"$TMP/pa.why"
            fi
            echo "$mode $c $line" >>"$TMP/pa.res"
            echo "  perf_analyzer $mode c=$c: $line" >&2
        done
    done
fi
keep_server tpserve

# start_more_tpserve NAME GRAPH [ENV ARGS...]: another tpserve, with the
# first one's threads and TPSERVE_ARGS, serving GRAPH on a fresh port ($PORT,
# $BASE, $PID) under `env ENV ARGS`, its log $TMP/NAME.log; waited until ready.
start_more_tpserve() {
    name=$1 graph=$2
    shift 2
    PORT=$(free_port)
    BASE="http://127.0.0.1:$PORT"
    # shellcheck disable=SC2086 # TPSERVE_ARGS splits into flags on purpose
    env "$@" "$TPSERVE" serve --graph "$graph" --port "$PORT" --threads "$THREADS" --log-level info \
        $TPSERVE_ARGS >"$TMP/$name.log" 2>&1 &
    PID=$!
    wait_up "$BASE/v2/health/ready" "$name" || die "$WHY"
}

# start_more_tpserve with more tpserve flags: FLAGS NAME GRAPH [VAR=VALUE...]
start_more_tpserve_with() {
    args_before=$TPSERVE_ARGS
    TPSERVE_ARGS="$TPSERVE_ARGS $1"
    shift
    start_more_tpserve "$@"
    TPSERVE_ARGS=$args_before
}

# ---- tpserve with this CPU's own OpenBLAS kernels --------------------------------
# When the environment forces a kernel set (OPENBLAS_CORETYPE; this project's
# VMs set Haswell's AVX2 kernels on an AVX-512 CPU), a second tpserve
# without the variable runs the same rows: what a machine that does not
# force them gets. Its own table, with its ratios to bare_http and to the
# forced tpserve of the same round.
OWN_KERNELS=""
if [ -n "${OPENBLAS_CORETYPE:-}" ] && [ -x "${BLAS_CORE:-}" ] &&
    [ "$("$BLAS_CORE")" != "$(env -u OPENBLAS_CORETYPE "$BLAS_CORE")" ]; then
    OWN_KERNELS=$(env -u OPENBLAS_CORETYPE "$BLAS_CORE")
    start_more_tpserve tpserve_own "$TP_GRAPHS/$G.json" -u OPENBLAS_CORETYPE
    keep_server tpserve_own
fi

# ---- tpserve serving the graph's input and output without its model -----------
# serving_path_graph.py: the same name, input and output, one relu per rank
# (no collective, no weights). Its answers must be as long as the graph's
# (same datatype and shape), or the row is left out with the reason.
SP_SKIP=""
if $PYTHON "$HERE/serving_path_graph.py" "$TP_GRAPHS/$G.json" "$TMP/serving_path.json" 2>"$TMP/sp.err"; then
    start_more_tpserve tpserve_sp "$TMP/serving_path.json"
    mkdir -p "$TMP/sp"
    if ! $PYTHON "$HERE/sample_answers.py" save "$BASE" "$G" "$TMP/sp" >/dev/null 2>"$TMP/sp.err"; then
        SP_SKIP="its sample request failed: $(tail -n 1 "$TMP/sp.err")"
    elif [ "$(wc -c <"$TMP/sp/ans.bin")" != "$(wc -c <"$TMP/ans.bin")" ] ||
        ! cmp -s "$TMP/sp/ans.bin.hl" "$TMP/ans.bin.hl"; then
        SP_SKIP="its binary answer is not the length of the graph's (another output datatype or shape)"
    fi
    if [ -n "$SP_SKIP" ]; then stop_server; else keep_server tpserve_sp; fi
else
    SP_SKIP=$(tail -n 1 "$TMP/sp.err")
fi

# ---- Triton (TRITON=1, or when installed) ---------------------------------------
# triton_start: Triton installed (or checked), a model repository computing
# the graph written, tritonserver serving it on $BASE with the HTTP thread
# count tpserve had, and its answers checked against tpserve's; 1 with the
# reason in WHY when a step fails.
triton_start() {
    case ${TRITON:-} in
    0) WHY="TRITON=0" && return 1 ;;
    1) ;;
    *) [ -x "${TRITON_VENV:-$ROOT/build/venv-triton}/bin/python" ] ||
        { WHY="Triton not installed (TRITON=1 installs it: scripts/install_triton.sh)" && return 1; } ;;
    esac
    PYTHON=$PYTHON sh "$ROOT/scripts/install_triton.sh" >"$TMP/triton.env" 2>"$TMP/triton.err" ||
        { WHY=$(tail -n 1 "$TMP/triton.err") && return 1; }
    eval "$(cat "$TMP/triton.env")"
    $PYTHON "$HERE/triton/make_repo.py" "$TP_GRAPHS" "$G" "$TMP/config.json" "$TMP/triton_repo" 2>"$TMP/triton.err" ||
        { WHY=$(tail -n 1 "$TMP/triton.err") && return 1; }
    PORT=$(free_port)
    BASE="http://127.0.0.1:$PORT"
    PATH="$TRITON_BIN:$PATH" LD_LIBRARY_PATH="$TRITON_LIBS" "$TRITON_SERVER" \
        --model-repository "$TMP/triton_repo" --backend-directory "$TRITON_BACKENDS" \
        --http-address 127.0.0.1 --http-port "$PORT" --http-thread-count "$THREADS" \
        --allow-grpc false --allow-metrics false --log-info false --exit-timeout-secs 5 >"$TMP/triton.log" 2>&1 &
    PID=$!
    if ! wait_up "$BASE/v2/health/ready" triton; then
        # Triton always logs an error for the missing CUDA driver; the cause is another line.
        WHY="tritonserver did not start: $(grep -v CudaDriverHelper "$TMP/triton.log" | grep -m 1 '^E\|^error' ||
            tail -n 1 "$TMP/triton.log")"
        stop_server
        return 1
    fi
    if ! $PYTHON "$HERE/sample_answers.py" check "$TP_GRAPHS/manifest.json" "$G" "$TMP" "$BASE" \
        >"$TMP/triton_check.out" 2>"$TMP/triton.err"; then
        WHY=$(tail -n 1 "$TMP/triton.err")
        stop_server
        return 1
    fi
    TRITON_VERSION=$(curl -s "$BASE/v2" | sed -n 's/.*"version":"\([^"]*\)".*/\1/p')
}
TRITON_SKIP=""
if triton_start; then
    cat "$TMP/triton_check.out" >&2
    keep_server triton
else
    TRITON_SKIP=$WHY
    echo "bench_http: no Triton columns: $TRITON_SKIP" >&2
fi

# ---- bare libmicrohttpd -------------------------------------------------------
for load in json binary; do
    PORT=$(free_port)
    BASE="http://127.0.0.1:$PORT"
    if [ $load = json ]; then
        "$BARE_HTTP" --port "$PORT" --threads "$THREADS" --body "$TMP/ans.json" >"$TMP/bare.log" 2>&1 &
    else
        "$BARE_HTTP" --port "$PORT" --threads "$THREADS" --body "$TMP/ans.bin" --header-len "$BIN_HL" \
            >"$TMP/bare.log" 2>&1 &
    fi
    PID=$!
    wait_up "$BASE/" bare || die "$WHY"
    keep_server bare_$load
done
# The same with the graph's engine run once per request (bare_http --graph):
# the HTTP stack plus one engine step a request and nothing else, so the
# ratio to it shows what tpserve's own serving path (codec, checks,
# batching) costs or, under load, gains.
# It runs the OpenBLAS kernels tpserve picked where OpenBLAS's own table
# predates the CPU (kernels/cpu/blas_pick.h; bare_http does not re-execute).
PICKED=$(sed -n 's/.*OpenBLAS kernels \([A-Za-z0-9]*\), picked by tpserve.*/\1/p' "$TMP/tpserve.log" | head -n 1)
KERNELS_ENV=${PICKED:+OPENBLAS_CORETYPE=$PICKED}
for load in json binary; do
    PORT=$(free_port)
    BASE="http://127.0.0.1:$PORT"
    # shellcheck disable=SC2086 # KERNELS_ENV is one word or nothing
    if [ $load = json ]; then
        env $KERNELS_ENV "$BARE_HTTP" --port "$PORT" --threads "$THREADS" --body "$TMP/ans.json" \
            --graph "$TP_GRAPHS/$G.json" >"$TMP/bare_model.log" 2>&1 &
    else
        env $KERNELS_ENV "$BARE_HTTP" --port "$PORT" --threads "$THREADS" --body "$TMP/ans.bin" \
            --header-len "$BIN_HL" --graph "$TP_GRAPHS/$G.json" >"$TMP/bare_model.log" 2>&1 &
    fi
    PID=$!
    wait_up "$BASE/" bare_model || die "$WHY"
    keep_server model_$load
done

# ---- a server on one core, wrk on another ----------------------------------------
# tpserve and bare, each started again and then confined (every thread) to
# the first CPU, with the same thread count, while wrk runs on the second:
# the server has a core to itself and no client wakes on it, as with a
# client on cores of its own or another machine; and a server on one core
# is what a container given one CPU gets.
if [ -n "$PIN_CPUS" ]; then
    SERVER_CPU=${PIN_CPUS%% *}
    # unpinned, as in a container given one CPU (pin_threads needs two)
    start_more_tpserve_with "--pin-threads 0" tpserve_pin "$TP_GRAPHS/$G.json"
    taskset -a -c -p "$SERVER_CPU" "$PID" >/dev/null || die "taskset on tpserve failed"
    keep_server tpserve_pin
    PORT=$(free_port)
    BASE="http://127.0.0.1:$PORT"
    "$BARE_HTTP" --port "$PORT" --threads "$THREADS" --body "$TMP/ans.bin" --header-len "$BIN_HL" \
        >"$TMP/bare_pin.log" 2>&1 &
    PID=$!
    wait_up "$BASE/" bare_pin || die "$WHY"
    taskset -a -c -p "$SERVER_CPU" "$PID" >/dev/null || die "taskset on bare_http failed"
    keep_server bare_pin
fi

# ---- pin_threads off: the scheduler places the HTTP threads ----------------------
# tpserve pins its HTTP threads one per CPU and gives each connection to
# the thread on the CPU the client sent from (pin_threads, on by default
# with two CPUs). A third tpserve, started with --pin-threads 0, runs the
# JSON and binary rows at the top connection count right after tpserve's
# own: what pinning is worth, round by round.
if [ -n "$PIN_CPUS" ]; then
    start_more_tpserve_with "--pin-threads 0" tpserve_cpu "$TP_GRAPHS/$G.json"
    keep_server tpserve_cpu
fi

# ---- the rounds ---------------------------------------------------------------
# Every server stays up and each row's runs follow each other, round after
# round: a machine whose speed drifts (a VM's neighbours, turbo) moves all of
# a row's servers alike, and the ratios are taken per round.
peers="bare_http"
[ -n "$TRITON_SKIP" ] || peers="$peers, Triton $TRITON_VERSION (Python backend)"
echo "bench_http: tpserve ($G, --threads $THREADS${TPSERVE_ARGS:+ $TPSERVE_ARGS}), $peers; $ROUNDS rounds of ${DURATION} s runs" >&2
warm_up tpserve json
[ -z "$OWN_KERNELS" ] || warm_up tpserve_own json
[ -n "$SP_SKIP" ] || warm_up tpserve_sp binary
warm_up bare_json json
warm_up bare_binary binary
warm_up model_json json
warm_up model_binary binary
[ -z "$TRITON_SKIP" ] && warm_up triton json
r=1
while [ $r -le "$ROUNDS" ]; do
    for load in json binary mixed; do
        for c in $CONNS; do
            run_row tpserve counts_tpserve "$TMP/tp.res" $r $load "$c"
            if [ -n "$PIN_CPUS" ] && [ $load != mixed ] && [ "$c" = "$TOP_CONNS" ]; then
                run_row tpserve_cpu counts_tpserve "$TMP/tpc.res" $r $load "$c"
            fi
            [ -z "$OWN_KERNELS" ] || run_row tpserve_own counts_tpserve "$TMP/own.res" $r $load "$c"
            [ $load = mixed ] || run_row bare_$load counts_none "$TMP/bare.res" $r $load "$c"
            [ $load = mixed ] || run_row model_$load counts_none "$TMP/model.res" $r $load "$c"
            [ $load = mixed ] || [ -n "$SP_SKIP" ] || run_row tpserve_sp counts_tpserve "$TMP/sp.res" $r $load "$c"
            [ -n "$TRITON_SKIP" ] || run_row triton counts_triton "$TMP/triton.res" $r $load "$c"
        done
    done
    if [ -n "$BATCH_WRK" ]; then
        WRK_BATCH=1 run_row tpserve counts_tpserve "$TMP/tpb.res" $r binary "$TOP_CONNS"
        WRK_BATCH=1 run_row bare_binary counts_none "$TMP/bareb.res" $r binary "$TOP_CONNS"
    fi
    if [ -n "$PIN_CPUS" ]; then
        WRK_CPU=${PIN_CPUS#* } WRK_THREADS=1 run_row tpserve_pin counts_tpserve "$TMP/tpp.res" $r binary "$TOP_CONNS"
        WRK_CPU=${PIN_CPUS#* } WRK_THREADS=1 run_row bare_pin counts_none "$TMP/barep.res" $r binary "$TOP_CONNS"
    fi
    r=$((r + 1))
done

# ---- the table ----------------------------------------------------------------
# An awk function for medians and ratios: sorts x[1..m] in place (so x[1]
# and x[m] are then its least and greatest) and returns its median.
SORT_MEDIAN='
    function sort_median(x, m,   i, j, t) {
        for (i = 2; i <= m; i++) {
            t = x[i]
            for (j = i - 1; j >= 1 && x[j] > t; j--) x[j + 1] = x[j]
            x[j + 1] = t
        }
        return m % 2 ? x[(m + 1) / 2] : (x[m / 2] + x[m / 2 + 1]) / 2
    }'

# medians RESULTS: per load and connection count, in the order first run,
# the median over the rounds of each column (errors summed): "load conns
# req/s p50 p99 errors cpu_us ctx batch".
medians() {
    awk "$SORT_MEDIAN"'
        function median(key, col,   i, x) {
            if (dash[key, col]) return "-"
            for (i = 1; i <= n[key]; i++) x[i] = v[key, col, i] + 0
            return sort_median(x, n[key])
        }
        {
            key = $2 " " $3
            if (!(key in n)) order[++keys] = key
            n[key]++
            for (c = 4; c <= 10; c++) {
                v[key, c, n[key]] = $c
                if ($c == "-") dash[key, c] = 1
            }
            err[key] += $7
        }
        END {
            for (i = 1; i <= keys; i++) {
                k = order[i]
                b = median(k, 10)
                printf "%s %.0f %.2f %.2f %d %.0f %.2f %s\n", k, median(k, 4), median(k, 5), median(k, 6), err[k],
                    median(k, 8), median(k, 9), b == "-" ? b : sprintf("%.2f", b)
            }
        }' "$1"
}

# ratios RESULTS PEER_RESULTS: per load and connection count, tpserve req/s
# over the peer's in the same round: "load conns median min max".
ratios() {
    awk "$SORT_MEDIAN"'
        function summary(key,   i, x, mid) {
            for (i = 1; i <= n[key]; i++) x[i] = r[key, i]
            mid = sort_median(x, n[key])
            return mid " " x[1] " " x[n[key]]
        }
        FILENAME == ARGV[1] { peer[$1, $2, $3] = $4; next }
        peer[$1, $2, $3] > 0 {
            key = $2 " " $3
            if (!(key in n)) order[++keys] = key
            r[key, ++n[key]] = $4 / peer[$1, $2, $3]
        }
        END {
            for (i = 1; i <= keys; i++)
                print order[i], summary(order[i])
        }' "$2" "$1"
}

# peer_cols MEDIANS RATIOS NAME LOAD CONNS SCALE FORMAT [batch]: another
# server's cells for the row (median req/s, p50, p99, with "batch" its avg
# batch, CPU, ctx sw), then tpserve's req/s over its, the median of the
# rounds' ratios and their range, times SCALE printed with FORMAT; dashes
# when it has no such row.
peer_cols() {
    awk -v n="$3" -v l="$4" -v c="$5" -v k="$6" -v f="$7" -v b="${8:-}" '
        FILENAME == ARGV[1] { if ($1 == l && $2 == c) r = sprintf(f " (" f "-" f ")", k * $3, k * $4, k * $5); next }
        $1 == l && $2 == c {
            if ($6 != 0) r = r " (" n ": " $6 " errors)"
            printf "%s | %s | %s | %s%s | %s | %s", $3, $4, $5, b ? $9 " | " : "", $7, $8, r
            found = 1
        }
        END { if (!found) printf "— | — | — | %s— | — | —", b ? "— | " : "" }' "$2" "$1"
}
# ratio_cell RATIOS LOAD CONNS SCALE FORMAT: "median (least-greatest)" of
# the row's ratios times SCALE, or a dash.
ratio_cell() {
    cell=$(awk -v l="$2" -v c="$3" -v k="$4" -v f="$5" \
        '$1 == l && $2 == c { printf f " (" f "-" f ")", k * $3, k * $4, k * $5 }' "$1")
    echo "${cell:-—}"
}
# model_cols LOAD CONNS: bare + model's median req/s and tpserve's ratio to
# it (median of the rounds', range in brackets); dashes without such a row.
model_cols() {
    rps=$(awk -v l="$1" -v c="$2" '$1 == l && $2 == c { print $3 }' "$TMP/model.med")
    echo "${rps:-—} | $(ratio_cell "$TMP/model.ratio" "$1" "$2" 100 "%.1f%%")"
}
touch "$TMP/bare.res" "$TMP/model.res" "$TMP/triton.res" "$TMP/own.res" "$TMP/sp.res" "$TMP/tpb.res" "$TMP/bareb.res" \
    "$TMP/tpp.res" "$TMP/barep.res" "$TMP/tpc.res"
for f in tp bare model triton own sp tpb bareb tpp barep tpc; do medians "$TMP/$f.res" >"$TMP/$f.med"; done
ratios "$TMP/tpb.res" "$TMP/bareb.res" >"$TMP/tpb_bare.ratio"
ratios "$TMP/tpp.res" "$TMP/barep.res" >"$TMP/tpp_bare.ratio"
ratios "$TMP/tpc.res" "$TMP/bare.res" >"$TMP/tpc_bare.ratio"
ratios "$TMP/tp.res" "$TMP/tpc.res" >"$TMP/tp_tpc.ratio"
ratios "$TMP/sp.res" "$TMP/bare.res" >"$TMP/sp_bare.ratio"
ratios "$TMP/tp.res" "$TMP/bare.res" >"$TMP/bare.ratio"
ratios "$TMP/own.res" "$TMP/bare.res" >"$TMP/own_bare.ratio"
ratios "$TMP/own.res" "$TMP/tp.res" >"$TMP/own_tp.ratio"
ratios "$TMP/tp.res" "$TMP/model.res" >"$TMP/model.ratio"
ratios "$TMP/tp.res" "$TMP/triton.res" >"$TMP/triton.ratio"
cpu=$(sed -n 's/^model name[[:space:]]*: *//p' /proc/cpuinfo 2>/dev/null | head -n 1)
echo
echo "\`make bench-http\` on $(nproc) cores (${cpu:-unknown cpu}), $(uname -sr), $(date -u +%Y-%m-%d):"
echo "graph $G (cpu backend), server threads $THREADS${TPSERVE_ARGS:+, $TPSERVE_ARGS}; $ROUNDS rounds, in each a ${DURATION} s wrk"
echo "run per row and server, one after the other (2 wrk threads; 1 for 1 connection); 1-row requests unless"
echo "noted. Cells are medians over the rounds; a ratio is the median of the rounds' ratios (range in brackets)."
if [ -x "${BLAS_CORE:-}" ]; then
    sh "$HERE/../cpus/blas_kernels.sh" "$BLAS_CORE"
fi
echo "tpserve's startup log: $(grep -o 'OpenBLAS kernels[^;]*' "$TMP/tpserve.log" | head -n 1)${PICKED:+ (bare + model runs them too)}."
[ -z "$WAKE_LINE" ] || echo "$WAKE_LINE."
echo
echo "| load | conns | tpserve req/s | p50 ms | p99 ms | avg batch | CPU us/req | ctx sw/req | bare HTTP req/s | bare p50 ms | bare p99 ms | bare CPU us/req | bare ctx sw/req | tpserve / bare | bare + model req/s | tpserve / (bare + model) | Triton req/s | Triton p50 ms | Triton p99 ms | Triton avg batch | Triton CPU us/req | Triton ctx sw/req | tpserve / Triton |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
# load_label LOAD ERRORS: the row's first cell.
load_label() {
    case $1 in
    json) printf "JSON" ;;
    binary) printf "binary (in and out)" ;;
    mixed) printf "JSON, batch 1..8 rows" ;;
    *) printf "%s" "$1" ;;
    esac
    [ "$2" = 0 ] || printf " (%s errors)" "$2"
}
while read -r load c rps p50 p99 err cpu ctx batch; do
    label=$(load_label "$load" "$err")
    bare=$(peer_cols "$TMP/bare.med" "$TMP/bare.ratio" bare "$load" "$c" 100 "%.1f%%")
    model=$(model_cols "$load" "$c")
    triton=$(peer_cols "$TMP/triton.med" "$TMP/triton.ratio" Triton "$load" "$c" 1 "%.2fx" batch)
    echo "| $label | $c | $rps | $p50 | $p99 | $batch | $cpu | $ctx | $bare | $model | $triton |"
done <"$TMP/tp.med"
echo
# side_table MEDIANS HEADERS [RATIOS SCALE FORMAT]...: a server's rows (its
# medians), then a ratio cell per RATIOS file; HEADERS names those columns
# ("a | b").
side_table() {
    med=$1
    echo "| load | conns | tpserve req/s | p50 ms | p99 ms | avg batch | CPU us/req | ctx sw/req | $2 |"
    printf "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    shift 2
    specs=$*
    # shellcheck disable=SC2034 # the loop counts the specs
    for _ in $(seq $(($# / 3))); do printf " ---: |"; done
    echo
    while read -r load c rps p50 p99 err cpu ctx batch; do
        row="| $(load_label "$load" "$err") | $c | $rps | $p50 | $p99 | $batch | $cpu | $ctx |"
        # shellcheck disable=SC2086 # specs: words without spaces
        set -- $specs
        while [ $# -ge 3 ]; do
            row="$row $(ratio_cell "$1" "$load" "$c" "$2" "$3") |"
            shift 3
        done
        echo "$row"
    done <"$med"
    echo
}
# versus_bare MEDIANS RATIOS BARE_MEDIANS BARE_LABEL WHY_NOT RAN: a side
# table of tpserve against bare and bare's median req/s, or (RAN empty)
# why it was not run.
versus_bare() {
    if [ -n "$6" ]; then
        side_table "$1" "tpserve / bare" "$2" 100 "%.1f%%"
        echo "$4: $(awk '{ print $3 }' "$3") req/s (median)."
    else
        echo "(not run: $5)"
    fi
    echo
}
if [ -n "$OWN_KERNELS" ]; then
    echo "The same rows, same rounds, against a tpserve started without OPENBLAS_CORETYPE: OpenBLAS's kernels"
    echo "for this CPU ($OWN_KERNELS), what a machine whose environment does not force a set gets."
    echo
    side_table "$TMP/own.med" "tpserve / bare | tpserve / tpserve with $OPENBLAS_CORETYPE kernels" \
        "$TMP/own_bare.ratio" 100 "%.1f%%" "$TMP/own_tp.ratio" 1 "%.2fx"
fi
echo "The serving path alone: tpserve serving a graph with $G's name, input and output whose only node is a"
echo "relu of the input on each rank (tests/load/serving_path_graph.py: no collective, no weights), in the"
echo "same rounds: its HTTP handling, codec, checks, batching, staging and replay without the model's arithmetic."
echo
if [ -n "$SP_SKIP" ]; then
    echo "(not run: $SP_SKIP)"
    echo
else
    side_table "$TMP/sp.med" "serving path / bare" "$TMP/sp_bare.ratio" 100 "%.1f%%"
fi
echo "A client that does not preempt the server: the binary row at $TOP_CONNS connections again, in the same"
echo "rounds, with wrk as SCHED_BATCH (chrt -b 0) against tpserve and against bare. On these shared cores a woken"
echo "wrk thread preempts the server thread it shares a core with; one that is more often waiting for answers"
echo "(tpserve's, which cost more CPU) is woken, and preempts, more often. A batch-policy wrk never preempts on"
echo "waking: what a client on cores of its own, or another machine, costs the server."
echo
versus_bare "$TMP/tpb.med" "$TMP/tpb_bare.ratio" "$TMP/bareb.med" "bare HTTP with wrk as SCHED_BATCH" \
    "no chrt" "$BATCH_WRK"
echo "HTTP threads unpinned (--pin-threads 0): the JSON and binary rows at $TOP_CONNS connections again, each"
echo "right after tpserve's, against a tpserve whose HTTP threads the scheduler places. By default each HTTP thread"
echo "keeps to a CPU and takes the connections its clients open from there, so a client and the thread serving it"
echo "wake each other on one CPU (server/README.md at 27cb4dd, \"HTTP threads pinned, connections by CPU\"); the last column is"
echo "tpserve's gain from it: the pinned tpserve's requests/s over this one's, round by round."
echo
if [ -n "$PIN_CPUS" ]; then
    side_table "$TMP/tpc.med" "unpinned / bare | pinned / unpinned" \
        "$TMP/tpc_bare.ratio" 100 "%.1f%%" "$TMP/tp_tpc.ratio" 1 "%.2fx"
else
    echo "(not run: no taskset, or fewer than two CPUs)"
    echo
fi
echo "A server on one core, wrk on another: the binary row at $TOP_CONNS connections again, in the same rounds,"
echo "against a tpserve and a bare started for it and confined (taskset, every thread) to one CPU with the same"
echo "$THREADS threads, wrk (one thread) confined to another. No client shares the server's core: what a client"
echo "on cores of its own or another machine sees, and what a container given one CPU serves."
echo
versus_bare "$TMP/tpp.med" "$TMP/tpp_bare.ratio" "$TMP/barep.med" "bare HTTP on one core" \
    "no taskset, or fewer than two CPUs" "$PIN_CPUS"
if [ -f "$TMP/pa.res" ]; then
    echo
    echo "perf_analyzer (tritonclient 2.49) against tpserve, 3 windows of 0.25 s (longer ones run away: server/README.md at 27cb4dd):"
    echo
    echo "| perf_analyzer tensors | conns | req/s | p50 ms |"
    echo "| --- | ---: | ---: | ---: |"
    while read -r mode c rps p50; do
        case $mode in
        binary) label="binary (its default)" ;;
        json) label="JSON (--input/output-tensor-format json)" ;;
        shm) label="system shared memory (--shared-memory system)" ;;
        esac
        ms=$(awk -v u="$p50" 'BEGIN { if (u == "-") print "—"; else printf "%.2f", u / 1000 }')
        echo "| $label | $c | $rps | $ms |"
    done <"$TMP/pa.res"
    [ -f "$TMP/pa.why" ] && sed 's/^/failed: /' "$TMP/pa.why"
    echo
fi
echo "CPU us/req, ctx sw/req: server CPU time (user+system) and context switches (voluntary and not, all"
echo "threads) per request during the row's run, the server and its child processes together (tpserve's"
echo "rank processes with --ranks processes, Triton's Python-backend stub)."
echo "avg batch: rows per engine execution (Δ tpserve_inference_count_total / Δ tpserve_execution_count_total;"
echo "Triton's: Δ inference_count / Δ execution_count of /v2/models/$G/stats)."
echo "bare HTTP: tests/bench/bare_http.c, libmicrohttpd with tpserve's daemons and accept thread, reading each body and"
echo "answering the bytes tpserve answered (no suspend/resume, no codec, no engine)."
echo "bare + model: the same, running the graph's engine (cpu backend, ranks as threads, serial steps) on one"
echo "fixed row before each answer, one request at a time (bare_http --graph): the HTTP stack and one engine step"
echo "per request, with no codec, no checks and no batching (which lets tpserve pass it under load)."
if [ -n "$TRITON_SKIP" ]; then
    echo "Triton: no columns: $TRITON_SKIP."
else
    echo "Triton: tritonserver $TRITON_VERSION (PyPI's nvidia-pytriton), --http-thread-count $THREADS, the Python"
    echo "backend running tests/load/triton/model.py (the graph's function in NumPy, the graph's weights), config"
    echo "copied from tpserve's (max_batch_size, dynamic batching, one instance); gRPC and metrics off."
    echo "Its answers to the sample request were checked against tpserve's before the runs:"
    sed 's/^/  /' "$TMP/triton_check.out"
fi
