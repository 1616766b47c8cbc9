#!/bin/sh
# test_backend_dl.sh — the cuda backend's device code is loaded on demand
# (kernels/cuda/cuda_kind.c, docs/architecture.md): a cpu-only `tpserve
# serve`, ranks as threads and as processes, and one of its rank processes
# map no CUDA library (libcuda, libcudart, libcublas, libcublasLt, libnccl,
# libtpserve-cuda: read from /proc/PID/maps); their idle VmRSS is printed.
# In a cuda build (`tpserve plan --backend cuda` works): the library is
# next to tpserve; `auto` on a machine without a GPU device node falls back
# to cpu without loading it and logs why; TP_CUDA_PROBE=1 makes it load the
# library (every symbol resolves against tpserve) and fall back with CUDA's
# reason; a tpserve whose directory lacks the library refuses `--backend
# cuda` naming the path it tried and dlerror()'s reason.
#
# env: TPSERVE, TP_GRAPHS, PYTHON; KEEP_TMP=1 keeps the logs.
# shellcheck disable=SC2015 # "A && pass || fail": pass always succeeds
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_backend_dl.XXXXXX")
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/lib/server.sh"
TPSERVE=$(cd "$(dirname "$TPSERVE")" && pwd)/$(basename "$TPSERVE")
G=$TP_GRAPHS/mlp_sp_tp2.json
LIB=$(dirname "$TPSERVE")/libtpserve-cuda.so

# cuda_maps PID: the CUDA libraries PID maps, one a line (none: empty).
cuda_maps() {
    sed -n 's#.*/\(lib\(cuda\|cudart\|cublas\|cublasLt\|nccl\|tpserve-cuda\)\.so[.0-9]*\)$#\1#p' "/proc/$1/maps" | sort -u
}
rss_kb() { awk '/^VmRSS:/ { print $2 }' "/proc/$1/status"; }
worker_of() { pgrep -P "$1" -f "tpserve.* worker|exe worker" 2>/dev/null | head -n 1; }
# no_cuda WHAT PID: passes when PID maps no CUDA library.
no_cuda() {
    libs=$(cuda_maps "$2" | tr '\n' ' ')
    [ -z "$libs" ] && pass "$1 maps no CUDA library (idle VmRSS $(rss_kb "$2") kB)" ||
        fail "$1 (pid $2) maps $libs"
}

# 1. cpu-only servers and a rank process map no CUDA library
if start threads --graph "$G" --backend cpu --ranks threads; then
    no_cuda "serve --backend cpu --ranks threads" "$PID"
    kill "$PID"
fi
if start procs --graph "$G" --backend cpu --ranks processes; then
    no_cuda "serve --backend cpu --ranks processes" "$PID"
    w=$(worker_of "$PID")
    [ -n "$w" ] && no_cuda "its rank process" "$w" || fail "serve --ranks processes: no worker of $PID"
    kill "$PID"
fi

# 2. a cuda build: the library and where it is loaded
if ! "$TPSERVE" plan "$G" --backend cuda >/dev/null 2>&1; then
    echo "skipped: this tpserve has no cuda backend (built without nvcc)"
else
    [ -f "$LIB" ] && pass "cuda build: $LIB next to tpserve" || fail "cuda build without $LIB"
    if ls /dev/nvidia[0-9]* >/dev/null 2>&1; then
        echo "skipped: auto's fallback (this machine has a GPU device node)"
    else
        if start auto --graph "$G" --backend auto; then
            grep -q "backend auto chose cpu: no NVIDIA GPU device node" "$TMP/auto.log" &&
                pass "auto without a GPU node: cpu, the log says why" ||
                fail "auto: $(grep 'auto' "$TMP/auto.log" | tail -1)"
            no_cuda "serve --backend auto (no GPU node)" "$PID"
            kill "$PID"
        fi
        export TP_CUDA_PROBE=1
        if start probe --graph "$G" --backend auto; then
            libs=$(cuda_maps "$PID" | tr '\n' ' ')
            case "$libs" in
            *libtpserve-cuda.so*libcudart*|*libcudart*libtpserve-cuda.so*) pass "TP_CUDA_PROBE=1: auto loads $libs" ;;
            *) fail "TP_CUDA_PROBE=1: the library was not loaded (maps: $libs)" ;;
            esac
            grep -q "backend auto chose cpu: cudaGetDeviceCount" "$TMP/probe.log" &&
                pass "TP_CUDA_PROBE=1: falls back to cpu with CUDA's reason" ||
                fail "TP_CUDA_PROBE=1: $(grep 'auto' "$TMP/probe.log" | tail -1)"
            kill "$PID"
        fi
        unset TP_CUDA_PROBE
    fi
    mkdir "$TMP/bin" && cp "$TPSERVE" "$TMP/bin/tpserve"
    "$TMP/bin/tpserve" run "$G" --inputs "$TP_GRAPHS/mlp_sp_tp2.inputs.safetensors" --output "$TMP/out" \
        --backend cuda --ranks processes 2>"$TMP/missing.err"
    rc=$?
    [ "$rc" != 0 ] && grep -qF "$TMP/bin/libtpserve-cuda.so: cannot open shared object file" "$TMP/missing.err" &&
        pass "--backend cuda without the library: refused naming $TMP/bin/libtpserve-cuda.so and dlerror()" ||
        fail "--backend cuda without the library: rc=$rc $(tail -2 "$TMP/missing.err")"
fi

echo "test_backend_dl: $npass passed, $nfail failed"
[ "$nfail" = 0 ]
