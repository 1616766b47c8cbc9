#!/bin/sh
# test_tritonclient.sh — conformance with NVIDIA's official tritonclient[http]
# (pip): health, metadata, model configuration, statistics, infer with JSON
# and binary tensors and through system shared memory, errors, against
# the reference outputs, for FP32, FP16, BF16 and INT64/INT32-input graphs.
#
# The client is installed into a venv under build/ (reused across runs). If
# pip cannot install it (no network, no venv support), the test prints
# "SKIPPED: tritonclient not installable: <reason>" and exits 0.
#
# env: TPSERVE, TP_GRAPHS, PYTHON (see test_server.sh); TP_TRITON_VENV
#      overrides the venv location; KEEP_TMP=1 keeps the server logs.
set -u
: "${TPSERVE:?set TPSERVE to the tpserve binary}"
: "${TP_GRAPHS:?set TP_GRAPHS to the generated graphs directory}"
PYTHON=${PYTHON:-python3}
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${TP_TRITON_VENV:-$HERE/../../build/venv-tritonclient}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_tc.XXXXXX")
PID=""
cleanup() {
    [ -n "$PID" ] && kill -9 "$PID" 2>/dev/null
    if [ -n "${KEEP_TMP:-}" ]; then echo "logs kept in $TMP"; else rm -rf "$TMP"; fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

skip() {
    echo "SKIPPED: tritonclient not installable: $*"
    exit 0
}

# ---- install (once) -------------------------------------------------------------
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import tritonclient.http, numpy' 2>/dev/null; then
    echo "installing tritonclient[http] into $VENV"
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >"$TMP/venv.log" 2>&1 ||
        skip "cannot create a venv with $PYTHON: $(tail -n 1 "$TMP/venv.log")"
    "$VPY" -m pip install --disable-pip-version-check -q --timeout 30 --retries 2 \
        'tritonclient[http]' numpy >"$TMP/pip.log" 2>&1 ||
        { rm -rf "$VENV"; skip "pip install failed: $(grep -i error "$TMP/pip.log" | tail -n 1)"; }
    "$VPY" -c 'import tritonclient.http, numpy' >"$TMP/import.log" 2>&1 ||
        { rm -rf "$VENV"; skip "installed but does not import: $(tail -n 1 "$TMP/import.log")"; }
fi
echo "tritonclient $("$VPY" -c 'import importlib.metadata as m; print(m.version("tritonclient"))')"

free_port() {
    "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

npass=0
nfail=0
for g in mlp_sp_tp2 mlp_sp_fp16_tp2 mlp_sp_bf16_tp2 vocab_embed_tp2 vocab_embed_i32_tp2 megatron_block_tp2; do
    [ -f "$TP_GRAPHS/$g.json" ] || { echo "FAIL: $g: no $TP_GRAPHS/$g.json"; nfail=$((nfail + 1)); continue; }
    port=$(free_port)
    "$TPSERVE" serve --graph "$TP_GRAPHS/$g.json" --port "$port" --backend cpu --log-level debug \
        --allow-client-shm 1 --trace-file "$TMP/trace_$g.json" \
        >"$TMP/$g.log" 2>&1 &
    PID=$!
    i=0
    until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/v2/health/ready")" = 200 ]; do
        i=$((i + 1))
        if [ $i -gt 300 ] || ! kill -0 "$PID" 2>/dev/null; then
            echo "FAIL: $g: server not ready"
            sed 's/^/    /' "$TMP/$g.log"
            nfail=$((nfail + 1))
            kill -9 "$PID" 2>/dev/null
            PID=""
            continue 2
        fi
        sleep 0.1
    done
    echo "== tritonclient against $g"
    "$VPY" "$HERE/tritonclient_conformance.py" --url "127.0.0.1:$port" --graphs "$TP_GRAPHS" \
        --graph "$g" >"$TMP/$g.out" 2>&1
    rc=$?
    cat "$TMP/$g.out"
    p=$(sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed$/\1/p' "$TMP/$g.out")
    f=$(sed -n 's/.*: \([0-9]*\) passed, \([0-9]*\) failed$/\2/p' "$TMP/$g.out")
    npass=$((npass + ${p:-0}))
    nfail=$((nfail + ${f:-0}))
    [ $rc -eq 0 ] || [ "${f:-0}" -gt 0 ] || nfail=$((nfail + 1)) # crashed before counting
    kill -TERM "$PID"
    wait "$PID"
    rc=$?
    PID=""
    if [ $rc -ne 0 ]; then
        echo "FAIL: $g: server exit code $rc after SIGTERM"
        nfail=$((nfail + 1))
    fi
done
echo "test_tritonclient: $npass passed, $nfail failed"
[ $nfail -eq 0 ]
