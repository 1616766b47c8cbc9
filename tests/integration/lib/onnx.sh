# onnx.sh — shared by the importer's integration tests (test_onnx*.sh;
# sourced after server.sh, with HERE, TMP and PYTHON set): where the
# fixtures and the importer are, and the Python packages they need.
# ONNX_MODULES: extra modules to require (e.g. "ml_dtypes").
# shellcheck shell=sh
ROOT=$(cd "$HERE/../.." && pwd)
FIX=$ROOT/tests/onnx
IMPORT="$PYTHON $ROOT/graphs/import_onnx.py"

for mod in ${ONNX_MODULES:-} onnx onnxruntime; do
    if ! $PYTHON -c "import $mod" 2>"$TMP/deps"; then
        fail "python deps: $(tail -1 "$TMP/deps") (scripts/deps.sh installs ${ONNX_MODULES:+$ONNX_MODULES, }onnx and onnxruntime)"
        exit 1
    fi
done
