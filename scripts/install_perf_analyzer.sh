#!/bin/sh
# install_perf_analyzer.sh — Triton's load generator, perf_analyzer, for
# `make bench-http` and tests/integration/test_perf_analyzer.sh. Optional:
# nothing else needs it. Idempotent.
#
# perf_analyzer ships as a binary inside the tritonclient 2.49 wheel (later
# wheels dropped it); it links libb64 (Debian's libb64-0d) and libcudart
# (pip's nvidia-cuda-runtime-cu12; no GPU is used). Installed into a venv at
# $PERF_VENV (build/venv-perf). On success prints lines for eval:
#   PERF_ANALYZER=<binary>
#   PERF_LIBS=<directory for LD_LIBRARY_PATH>
#   PERF_ARGS_binary, PERF_ARGS_json, PERF_ARGS_shm: its flags for each way
#   of sending tensors (binary is its default)
#   PERF_WINDOW_ARGS: the time windows every caller measures with: 0.25 s
#   (it sleeps 1.2x that), never its default 5 s. Its end-of-window
#   bookkeeping (InferenceProfiler::ValidLatencyMeasurement) erases the
#   window's records one vector element at a time, costing (records in the
#   window) x (records that completed after the window ended, before it took
#   them), and the second factor grows with the first. The next window
#   starts where the last one ended, so it includes that bookkeeping: past
#   about rate^2 x window = 2e9 (5 s windows at 20k requests/s on 2 cores)
#   the windows never end (server/README.md at 27cb4dd, "perf_analyzer's stalled row").
#   A CI machine about twice as fast as ours timed out once in 1 s windows
#   at 32 connections (not reproduced here at ~18k requests/s); 0.5 s
#   windows halved rate^2 x window again, until HTTP threads pinned by
#   default (~22k requests/s) made that row take 8-43 s here, once past the
#   bench's 120 s; 0.25 s windows: 1-6 s.
#   tests/integration/test_perf_analyzer.sh does not rely on this: when
#   its 32-connection row stalls, it checks that tpserve answered every
#   request instead.
# and exits 0; otherwise says why on stderr and exits 1.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${PERF_VENV:-$HERE/../build/venv-perf}
PYTHON=${PYTHON:-python3}
fail() {
    echo "install_perf_analyzer: $*" >&2
    exit 1
}
if ! dpkg -s libb64-0d >/dev/null 2>&1; then
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq libb64-0d >/dev/null 2>&1 ||
        fail "cannot install libb64-0d with apt-get"
fi
PA="$VENV/bin/perf_analyzer"
if [ ! -x "$PA" ]; then
    "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 || fail "cannot create a venv with $PYTHON"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --timeout 30 --retries 2 \
        'tritonclient[http]==2.49.0' nvidia-cuda-runtime-cu12 >/dev/null 2>&1 ||
        fail "pip cannot install tritonclient[http]==2.49.0 and nvidia-cuda-runtime-cu12"
fi
LIBS=$(ls -d "$VENV"/lib/python3*/site-packages/nvidia/cuda_runtime/lib 2>/dev/null | head -n 1)
[ -x "$PA" ] && [ -n "$LIBS" ] || fail "no perf_analyzer or libcudart in $VENV"
missing=$(LD_LIBRARY_PATH="$LIBS" ldd "$PA" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p' | tr '\n' ' ')
[ -z "$missing" ] || fail "perf_analyzer lacks libraries: $missing"
echo "PERF_ANALYZER=$PA"
echo "PERF_LIBS=$LIBS"
echo "PERF_ARGS_binary=''"
echo "PERF_ARGS_json='--input-tensor-format json --output-tensor-format json'"
echo "PERF_ARGS_shm='--shared-memory system'"
echo "PERF_WINDOW_ARGS='--measurement-mode time_windows --measurement-interval 250'"
