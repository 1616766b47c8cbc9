#!/bin/sh
# Installs what tpserve needs to build and test on a fresh Debian machine.
# Idempotent: checks each package first, so `make` can call it cheaply.
set -e
PKGS="build-essential pkg-config python3 python3-pip python3-venv libmicrohttpd-dev libjansson-dev zlib1g-dev check libopenblas-dev libcurl4-openssl-dev curl wrk clang"
missing=""
for p in $PKGS; do
    dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"
done
if [ -n "$missing" ]; then
    echo "deps: installing$missing"
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $missing >/dev/null
fi
# numpy drives the example-graph generator and its unsharded reference.
PY=${PYTHON:-python3}
if ! $PY -c "import numpy" >/dev/null 2>&1; then
    echo "deps: installing numpy for $PY"
    $PY -m pip install -q numpy 2>/dev/null ||
        $PY -m pip install -q --break-system-packages numpy 2>/dev/null || {
        SUDO=""
        [ "$(id -u)" -eq 0 ] || SUDO="sudo"
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-numpy >/dev/null
    }
    $PY -c "import numpy" || { echo "deps: numpy is still missing for $PY" >&2; exit 1; }
fi
# onnx + onnxruntime: graphs/import_onnx.py (the ONNX importer; onnx's shape
# inference and reference evaluator) and its tests' references (onnxruntime);
# ml_dtypes: BF16 in NumPy (onnx's BFLOAT16 arrays, the BF16 references).
if ! $PY -c "import onnx, onnxruntime, ml_dtypes" >/dev/null 2>&1; then
    echo "deps: installing onnx, onnxruntime and ml_dtypes for $PY"
    $PY -m pip install -q onnx onnxruntime ml_dtypes 2>/dev/null ||
        $PY -m pip install -q --break-system-packages onnx onnxruntime ml_dtypes
    $PY -c "import onnx, onnxruntime, ml_dtypes" || { echo "deps: onnx/onnxruntime/ml_dtypes still missing for $PY" >&2; exit 1; }
fi
