#!/bin/sh
# test_memory_budget.sh — one small request must not kill the server
# (issue 50): in a memory cgroup of 768 MiB (v2 memory.max or v1
# memory.limit_in_bytes; CI runs as root), with the budget derived from it,
# gzip bodies of ~60 KB that inflate to 60 MiB of {} (which jansson once
# built at ~80x) are answered and the server keeps serving; 32 uploads of 48
# MiB stalled short and 32 clients never reading their 9 MB answers are held
# within the budget, others are refused 503 with Retry-After, and all of it
# is given back when they go. Without a writable memory controller the
# cgroup part is skipped with a message; the rest runs anyway: peak RSS
# growth for the 60 MiB bodies stays below 4x their size, and max_memory_mb
# bounds stalled uploads and slow readers.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the server logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_mem.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
CLIENT="$PYTHON $HERE/memory_client.py"
REAL_TPSERVE=$TPSERVE
CG=""

stop() {
    kill -TERM "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
}

# cg_make BYTES: a memory cgroup limited to BYTES (no swap), in CG; 1 when
# no memory controller here can be written
cg_make() {
    if grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo +memory >/sys/fs/cgroup/cgroup.subtree_control 2>/dev/null
        d=/sys/fs/cgroup/tpserve_mem.$$
        if mkdir "$d" 2>/dev/null && echo "$1" >"$d/memory.max" 2>/dev/null; then
            echo 0 >"$d/memory.swap.max" 2>/dev/null
            CG=$d LIMIT_FILE=memory.max
            return 0
        fi
        rmdir "$d" 2>/dev/null
    fi
    for base in /sys/fs/cgroup/memory /sys/fs/cgroup/unified; do
        d=$base/tpserve_mem.$$
        [ -d "$base" ] || continue
        if mkdir "$d" 2>/dev/null; then
            for f in memory.limit_in_bytes memory.max; do
                if [ -f "$d/$f" ] && echo "$1" >"$d/$f" 2>/dev/null; then
                    [ -f "$d/memory.memsw.limit_in_bytes" ] && echo "$1" >"$d/memory.memsw.limit_in_bytes" 2>/dev/null
                    CG=$d LIMIT_FILE=$f
                    return 0
                fi
            done
            rmdir "$d" 2>/dev/null
        fi
    done
    return 1
}

# Under a sanitizer the server in the cgroup keeps ASan's quarantine small:
# freed blocks (each growth of a 48 MiB upload frees the last buffer) stay
# there, 256 MiB by default, on top of what the budget counts, and that with
# the shadow memory takes a server holding its whole budget past the limit
# (OOM-killed in CI). The budget bounds what the server holds, not what a
# sanitizer keeps; every other test keeps the default quarantine.
CG_ASAN=""
[ -n "${TP_SANITIZED:-}" ] && CG_ASAN="ASAN_OPTIONS=\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}quarantine_size_mb=16"

# the server started inside CG: a wrapper that joins it, then execs tpserve
in_cgroup() {
    cat >"$TMP/in_cg" <<SH
#!/bin/sh
echo \$\$ >"$CG/cgroup.procs" || exit 97
${CG_ASAN:+export $CG_ASAN}
exec "$REAL_TPSERVE" "\$@"
SH
    chmod +x "$TMP/in_cg"
    TPSERVE=$TMP/in_cg
}

cg_remove() {
    [ -n "$CG" ] || return 0
    i=0
    while [ $i -lt 50 ] && ! rmdir "$CG" 2>/dev/null; do sleep 0.1; i=$((i + 1)); done
    CG=""
}

# check NAME CMD...: PASS/FAIL by the client's exit status, its lines kept
check() {
    name=$1
    shift
    if "$@" >"$TMP/o" 2>&1; then pass "$name: $(tr '\n' ';' <"$TMP/o")"; else fail "$name: $(tr '\n' ';' <"$TMP/o")"; fi
}

LIMIT=$((768 << 20))
if cg_make $LIMIT; then
    in_cgroup
    start cg_mlp --graph "$TP_GRAPHS/mlp_sp_tp2.json" || exit 1
    grep -q "memory budget for requests: .*cgroup limit 768 MiB" "$TMP/cg_mlp.log" &&
        pass "budget from the cgroup: $(grep -o 'memory budget for requests: [0-9]* MiB' "$TMP/cg_mlp.log")" ||
        fail "the budget does not name the cgroup's limit: $(grep 'memory budget' "$TMP/cg_mlp.log")"
    check "cgroup $((LIMIT >> 20)) MiB, gzip bombs" $CLIENT bomb "$URL" --pid "$PID"
    check "cgroup $((LIMIT >> 20)) MiB, 32 stalled uploads" $CLIENT stalled "$URL" 32 48 --pid "$PID"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/v2/health/ready")" = 200 ] &&
        pass "ready after the bombs and stalls" || fail "not ready after the bombs and stalls"
    stop
    start cg_embed --graph "$TP_GRAPHS/vocab_embed_tp2.json" || exit 1
    check "cgroup $((LIMIT >> 20)) MiB, 32 slow readers" $CLIENT slow "$URL" 32 2048 --pid "$PID"
    stop
    TPSERVE=$REAL_TPSERVE
    cg_remove
else
    echo "SKIP: no writable memory cgroup controller (v2 /sys/fs/cgroup or v1 /sys/fs/cgroup/memory): the" \
        "server is not run under a container limit here"
fi

# Anywhere: the bombs' peak RSS growth, and max_memory_mb's bound
start mlp --graph "$TP_GRAPHS/mlp_sp_tp2.json" --max-memory-mb 300 --max-body-bytes $((1 << 30)) || exit 1
before=$(awk '/VmHWM/ { print $2 }' /proc/"$PID"/status)
check "gzip bombs" $CLIENT bomb "$URL" --pid "$PID"
after=$(awk '/VmHWM/ { print $2 }' /proc/"$PID"/status)
growth=$(((after - before) / 1024))
# 60 MiB inflated: the body itself, held once; built whole it was ~4.8 GB.
# Under a sanitizer RSS measures its allocator, not ours: ASan keeps freed
# blocks in a 256 MiB quarantine, so growth there says nothing about what
# the server holds (the cgroup runs above still prove it survives).
if [ -n "${TP_SANITIZED:-}" ]; then
    echo "SKIP: peak RSS growth ($growth MiB): a sanitizer's allocator quarantines freed memory"
elif [ "$growth" -lt 240 ]; then
    pass "peak RSS grew $growth MiB for 60 MiB inflated bodies (< 4x)"
else
    fail "peak RSS grew $growth MiB for 60 MiB inflated bodies (4x is 240)"
fi
check "max_memory_mb 300, 32 stalled uploads" $CLIENT stalled "$URL" 32 48 --pid "$PID"
grep -q 'tpserve_memory_refusals_total{code="503"} [1-9]' "$TMP/o" 2>/dev/null ||
    curl -s "$URL/metrics" | grep -q 'tpserve_memory_refusals_total{code="503"} [1-9]' &&
    pass "refusals counted in /metrics" || fail "no 503 refusal counted in /metrics"
# a body announced larger than the whole budget: 413 before it is read
code=$(curl -s -o "$TMP/big" -w '%{http_code}' -H 'Content-Type: application/json' -H 'Expect:' \
    -H "Content-Length: $((400 << 20))" --data-binary @/dev/null --max-time 5 "$URL/v2/models/mlp_sp_tp2/infer")
[ "$code" = 413 ] && grep -q "memory budget" "$TMP/big" && pass "Content-Length past the budget: 413" ||
    fail "Content-Length past the budget: $code $(cat "$TMP/big")"
stop
start embed --graph "$TP_GRAPHS/vocab_embed_tp2.json" --max-memory-mb 300 || exit 1
check "max_memory_mb 300, 32 slow readers" $CLIENT slow "$URL" 32 2048 --pid "$PID"
stop

echo "test_memory_budget: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
