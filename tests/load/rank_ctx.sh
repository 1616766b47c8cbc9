#!/bin/sh
# rank_ctx.sh — `make bench-ranks-ctx`: what one request costs the server's
# threads at concurrency 1, per thread, for --ranks threads and --ranks
# processes: voluntary and involuntary context switches and CPU
# microseconds per request, summed over the server and its rank worker
# processes (issue 17's target: <= 4 switches, <= 60 us per request).
#
# Per thread: /proc/PID/task/TID/status (voluntary_ctxt_switches,
# nonvoluntary_ctxt_switches) and /proc/PID/task/TID/schedstat (time on
# CPU in ns, finer than utime+stime's clock ticks), sampled around one wrk
# run (-t1 -c1, binary tensors: the JSON codec's cost is not the point).
# Each mode runs ROUNDS times; every round prints its table, then a
# markdown table gives, per mode, the totals of the round with the median
# CPU (the machine is noisy: read every round). Timings never fail.
#
# env: TPSERVE (build/tpserve), TP_GRAPHS (build/graphs), GRAPH
#      (mlp_sp_tp2), DURATION (seconds per round, 3), ROUNDS (3), MODES
#      ("threads processes"), THREADS (--threads, 0: one per usable core), TPSERVE_ARGS (extra
#      serve flags).
set -u
TPSERVE=${TPSERVE:-build/tpserve}
TP_GRAPHS=${TP_GRAPHS:-build/graphs}
G=${GRAPH:-mlp_sp_tp2}
DURATION=${DURATION:-3}
ROUNDS=${ROUNDS:-3}
MODES=${MODES:-"threads processes"}
THREADS=${THREADS:-0}
TPSERVE_ARGS=${TPSERVE_ARGS:-}
HERE=$(cd "$(dirname "$0")" && pwd)
BENCH_NAME=rank_ctx
# shellcheck source=tests/load/bench_lib.sh
. "$HERE/bench_lib.sh"

# snapshot: one line per thread of the server and its direct children (the
# rank workers, named worker:...): "PID/TID NAME VOLUNTARY INVOLUNTARY CPU_NS".
snapshot() {
    for p in $PID $(cat /proc/"$PID"/task/*/children 2>/dev/null); do
        for t in /proc/"$p"/task/*; do
            [ -r "$t/schedstat" ] || continue
            name=$(tr ' ' '_' <"$t/comm")
            [ "$p" = "$PID" ] || name="worker:$name"
            sw=$(awk '/^voluntary_ctxt_switches/ { v = $2 } /^nonvoluntary_ctxt_switches/ { n = $2 }
                      END { print v + 0, n + 0 }' "$t/status")
            echo "$p/${t##*/} $name $sw $(cut -d' ' -f1 "$t/schedstat")"
        done
    done | sort
}

# round MODE: one wrk run; prints the per-thread table and appends
# "VOL INVOL CPU_US" (totals per request) to $TMP/MODE.tot.
round() {
    snapshot >"$TMP/a"
    wrk -t1 -c1 -d"${DURATION}s" -s "$HERE/infer_binary.lua" "$BASE/v2/models/$G/infer" >"$TMP/wrk.out" 2>&1
    snapshot >"$TMP/b"
    line=$(sed -n 's/^TPBENCH //p' "$TMP/wrk.out")
    [ -n "$line" ] || die "wrk printed no summary: $(cat "$TMP/wrk.out")"
    n=$(echo "$line" | sed 's/^requests=\([0-9]*\).*/\1/')
    bad=$(echo "$line" | awk '{ e = 0; for (i = 1; i <= NF; i++) if ($i ~ /^(errors|non2xx)=/) { split($i, a, "="); e += a[2] } print e }')
    [ "$bad" = 0 ] || die "$1: $bad failed requests: $line"
    echo "  $1: $(echo "$line" | sed 's/.*\(rps=[^ ]*\).*\(p50_us=[^ ]*\).*/\1 \2/')"
    join "$TMP/a" "$TMP/b" | awk -v n="$n" -v tot="$TMP/$1.tot" '
        $2 == $6 {
            v = ($7 - $3) / n; iv = ($8 - $4) / n; us = ($9 - $5) / 1000 / n
            tv += v; ti += iv; tu += us
            if (v + iv >= 0.01 || us >= 0.5)
                printf "    %-16s %-16s %8.2f %8.2f %8.1f\n", $1, $2, v, iv, us
        }
        END {
            printf "    %-33s %8.2f %8.2f %8.1f\n", "total", tv, ti, tu
            printf "%.2f %.2f %.1f\n", tv, ti, tu >> tot
        }'
}

for mode in $MODES; do
    # port 0: the server picks a free one and logs it in its "ready" line
    # shellcheck disable=SC2086 # TPSERVE_ARGS splits into flags on purpose
    "$TPSERVE" serve --graph "$TP_GRAPHS/$G.json" --port 0 --threads "$THREADS" --ranks "$mode" \
        --log-level info $TPSERVE_ARGS >"$TMP/tpserve.log" 2>&1 &
    PID=$!
    i=0
    until BASE=$(grep -o 'listen=http://[0-9.:]*' "$TMP/tpserve.log" | sed 's/^listen=//') && [ -n "$BASE" ] &&
        [ "$(curl -s -o /dev/null -w '%{http_code}' "$BASE/v2/health/ready")" = 200 ]; do
        kill -0 "$PID" 2>/dev/null || die "tpserve --ranks $mode exited during startup: $(cat "$TMP/tpserve.log")"
        i=$((i + 1))
        [ $i -gt 300 ] && die "tpserve --ranks $mode not ready after 30 s"
        sleep 0.1
    done
    wrk -t1 -c1 -d1s -s "$HERE/infer_binary.lua" "$BASE/v2/models/$G/infer" >/dev/null 2>&1 # warm-up
    echo "rank_ctx: --ranks $mode, $G, wrk -t1 -c1 binary, $DURATION s x $ROUNDS rounds; per request:"
    printf "    %-16s %-16s %8s %8s %8s\n" "pid/tid" "thread" "vol" "invol" "cpu_us"
    r=1
    while [ $r -le "$ROUNDS" ]; do
        round "$mode"
        r=$((r + 1))
    done
    kill "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    PID=""
done

echo
echo "| ranks | voluntary | involuntary | switches | CPU us |"
echo "|---|---|---|---|---|"
for mode in $MODES; do
    # the round with the median CPU
    sort -n -k3 "$TMP/$mode.tot" | awk -v m="$mode" '{ l[NR] = $0 } END {
        split(l[int((NR + 1) / 2)], a, " ")
        printf "| %s | %.2f | %.2f | %.2f | %.1f |\n", m, a[1], a[2], a[1] + a[2], a[3] }'
done
echo "(median round by CPU; switches and CPU summed over every thread of the server and its rank processes)"
