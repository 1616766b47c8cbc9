#!/bin/sh
# run_fuzz.sh NAME SECONDS — runs the libFuzzer harness build/fuzz/NAME for
# SECONDS over its seeds and its growing corpus, then prints one markdown
# table row: seconds it ran (less after a finding), executions, coverage
# (edges, features), corpus size, findings.
# A finding (crash, leak, sanitizer report, timeout, out of memory) leaves
# its input in build/fuzz/artifacts/ and makes the exit code 1.
#
# Seeds: tests/fuzz/corpus/KIND/ (checked in) and, for the graph harness,
# build/fuzz/seeds/graph/ (the example graphs and the hostile graphs, made
# by the Makefile). New inputs go to build/fuzz/corpus/NAME/ (kept between
# runs). env: FUZZ_BUILD (build/fuzz), TP_GRAPHS (example graphs' weights).
set -u
NAME=$1
SECONDS_=$2
B=${FUZZ_BUILD:-build/fuzz}
HERE=$(dirname "$0")
KIND=${NAME#fuzz_}
# the same server with its ranks as processes takes the same seeds
KIND=${KIND%_processes}
# fuzz_http_generate: corpus/generate, generate.dict
KIND=${KIND#http_}
mkdir -p "$B/corpus/$NAME" "$B/artifacts" "$B/logs"
seeds=""
for d in "$HERE/corpus/$KIND" "$B/seeds/$KIND"; do
    [ -d "$d" ] && seeds="$seeds $d"
done
dict=""
case $KIND in
kserve_*) dict="-dict=$HERE/kserve.dict" ;;
http) # HTTP's words and the tensor keys of the bodies it carries
    cat "$HERE/http.dict" "$HERE/kserve.dict" >"$B/http_full.dict"
    dict="-dict=$B/http_full.dict" ;;
*) [ -f "$HERE/$KIND.dict" ] && dict="-dict=$HERE/$KIND.dict" ;;
esac
log="$B/logs/$NAME.log"
# allocator_may_return_null: a graph or request asking for more memory than
# exists must get an error from malloc, which is the behaviour under test.
t0=$(date +%s)
# shellcheck disable=SC2086 # $dict and $seeds are word lists
ASAN_OPTIONS=${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1} \
    "$B/$NAME" -max_total_time="$SECONDS_" -print_final_stats=1 -timeout=30 -rss_limit_mb=4096 \
    -malloc_limit_mb=4096 -artifact_prefix="$B/artifacts/$NAME-" $dict "$B/corpus/$NAME" $seeds >"$log" 2>&1
rc=$?
took=$(($(date +%s) - t0))
execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
# -a: libFuzzer's log can carry raw bytes (a dictionary entry it
# recommends), and grep would then answer "binary file matches"
last=$(grep -a -E '^#[0-9]+' "$log" | tail -1)
cov=$(echo "$last" | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
ft=$(echo "$last" | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
corp=$(echo "$last" | sed -n 's/.*corp: \([0-9]*\).*/\1/p')
rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
if [ $rc -eq 0 ]; then
    found=none
else
    found="exit $rc: $(grep -a -m1 -E 'ERROR|runtime error|Sanitizer|deadly signal|out-of-memory|timeout' "$log" | cut -c1-120)"
    found="$found; input $(ls -t "$B/artifacts/$NAME-"* 2>/dev/null | head -1)"
fi
echo "| $NAME | $took | ${execs:-?} | ${rate:-?} | ${cov:-?} | ${ft:-?} | ${corp:-?} | $found |"
exit $rc
