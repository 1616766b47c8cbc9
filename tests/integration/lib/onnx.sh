# onnx.sh — shared by the importer's integration tests (test_onnx*.sh;
# sourced after server.sh, with HERE, TMP and PYTHON set): where the
# fixtures and the importer are, and the Python packages they need.
# ONNX_MODULES: extra modules to require (e.g. "ml_dtypes").
# shellcheck shell=sh
ROOT=$(cd "$HERE/../.." && pwd)
FIX=$ROOT/tests/onnx

for mod in ${ONNX_MODULES:-} onnx onnxruntime; do
    if ! $PYTHON -c "import $mod" 2>"$TMP/deps"; then
        fail "python deps: $(tail -1 "$TMP/deps") (scripts/deps.sh installs ${ONNX_MODULES:+$ONNX_MODULES, }onnx and onnxruntime)"
        exit 1
    fi
done

. "$HERE/lib/pyrun.sh"
IMPORT="pyrun $ROOT/graphs/import_onnx.py"
REFERENCE="pyrun $FIX/reference.py"

# run_check GRAPH MODEL BATCH RANKS [RTOL]: `tpserve run` of GRAPH on MODEL's
# request at BATCH against its onnxruntime reference (reference writes
# $TMP/MODEL.inBATCH / .refBATCH), within RTOL (default $RTOL).
run_check() {
    rtol=${5:-$RTOL}
    if "$TPSERVE" run "$TMP/$1.json" --inputs "$TMP/$2.in$3.safetensors" --output "$TMP/$1.out" \
        --backend cpu --ranks "$4" >"$TMP/run.log" 2>&1 &&
        pyrun "$HERE/compare.py" "$TMP/$1.out" "$TMP/$2.ref$3.safetensors" "$rtol" >"$TMP/cmp"; then
        pass "$1 batch $3 ranks $4: $(grep -o '[A-Z0-9]* \[[0-9, ]*\] err=[^ ]*' "$TMP/cmp" | head -1) vs onnxruntime (rtol $rtol)"
    else
        fail "$1 batch $3 ranks $4: $(cat "$TMP/run.log" "$TMP/cmp" 2>/dev/null | tail -3)"
    fi
}
