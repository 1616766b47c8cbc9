# bench_lib.sh — sourced by the load scripts (bench_http.sh, rank_ctx.sh):
# a temporary directory $TMP removed at exit (KEEP_TMP=1 keeps it), the
# server whose pid is in $PID stopped at exit, die, and the checks that
# wrk, the tpserve binary and the graph are there. Set BENCH_NAME,
# TPSERVE, TP_GRAPHS and G first. Servers kept running beside $PID (their
# pids in $SERVERS) are stopped at exit too.
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_$BENCH_NAME.XXXXXX")
PID=""
SERVERS=""

cleanup() {
    for p in $PID $SERVERS; do
        kill "$p" 2>/dev/null && wait "$p" 2>/dev/null
    done
    if [ -n "${KEEP_TMP:-}" ]; then echo "files kept in $TMP" >&2; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

die() {
    echo "$BENCH_NAME: $*" >&2
    exit 1
}

command -v wrk >/dev/null 2>&1 || die "wrk not found (scripts/deps.sh installs it)"
[ -x "$TPSERVE" ] || die "no tpserve binary at $TPSERVE (make build/tpserve)"
[ -f "$TP_GRAPHS/$G.json" ] || die "no graph $TP_GRAPHS/$G.json (make graphs)"
