# pyrun.sh — sourced by integration tests that run many short Python
# scripts (after server.sh, with HERE, TMP and PYTHON set; again is a no-op).
# shellcheck shell=sh

# pyrun SCRIPT ARGS...: `$PYTHON SCRIPT ARGS`, its output, errors and exit
# status, run by one interpreter kept for the test (lib/pyrun.py): the
# scripts' imports (numpy; onnx and onnxruntime for the importer and
# reference.py) happen once, not once a call. A script that kills the
# interpreter fails, and the next call starts another.
pyrun_start() {
    $PYTHON "$HERE/lib/pyrun.py" "$PYRUN" &
    PIDS="$PIDS $!"
}
pyrun() {
    { pwd; printf '%s\n' "$@"; } >"$PYRUN/req"
    pyrun_rc=$(cat "$PYRUN/rep")
    cat "$PYRUN/out"
    cat "$PYRUN/err" >&2
    if [ -z "$pyrun_rc" ]; then
        echo "pyrun: the interpreter died running $*" >&2
        pyrun_start
        return 1
    fi
    return "$pyrun_rc"
}
if [ -z "${PYRUN:-}" ]; then
    PYRUN=$TMP/pyrun
    mkdir "$PYRUN" && mkfifo "$PYRUN/req" "$PYRUN/rep" || exit 1
    pyrun_start
fi
