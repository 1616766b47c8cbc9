#!/bin/sh
# install_triton.sh — NVIDIA Triton Inference Server, for the comparison rows
# of `make bench-http` (TRITON=1). Optional: `make` and `make test` never call
# it. Idempotent.
#
# tritonserver ships inside PyPI's nvidia-pytriton wheel (0.7.0 holds Triton
# 2.51.0) with its Python backend, one backend stub per CPython minor version
# and its own copies of the libraries it links, except glibc, libstdc++, zlib
# and libpython (the stub embeds CPython). No GPU is used. Installed into a
# venv at $TRITON_VENV (build/venv-triton) together with numpy, which the
# Python-backend model imports. On success prints lines for eval:
#   TRITON_SERVER=<the tritonserver binary>
#   TRITON_BACKENDS=<its --backend-directory>
#   TRITON_LIBS=<the wheel's libraries, for LD_LIBRARY_PATH>
#   TRITON_BIN=<the venv's bin, to put first on PATH: the stub's embedded
#     CPython finds its prefix, and so the venv's numpy, through the python3
#     it finds on PATH>
# and exits 0; otherwise says why in one line on stderr and exits 1.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
VENV=${TRITON_VENV:-$HERE/../build/venv-triton}
PYTHON=${PYTHON:-python3}
PYTRITON_VERSION=0.7.0
fail() {
    echo "install_triton: $*" >&2
    exit 1
}
# The venv directory must exist before cd can resolve it; create it first.
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 || fail "cannot create a venv with $PYTHON"
fi
VENV=$(cd "$VENV" && pwd)
if ! "$VENV/bin/python" -c 'import pytriton, numpy' >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q --timeout 30 --retries 2 \
        "nvidia-pytriton==$PYTRITON_VERSION" numpy >/dev/null 2>&1 ||
        fail "pip cannot install nvidia-pytriton==$PYTRITON_VERSION and numpy"
fi
PY_VER=$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
DIST=$("$VENV/bin/python" -c 'import os, pytriton; print(os.path.join(os.path.dirname(pytriton.__file__), "tritonserver"))')
LIBS=$(cd "$DIST/../../nvidia_pytriton.libs" 2>/dev/null && pwd) || fail "no nvidia_pytriton.libs next to $DIST"
SERVER=$DIST/bin/tritonserver
STUB_SRC=$DIST/python_backend_stubs/$PY_VER/triton_python_backend_stub
STUB=$DIST/backends/python/triton_python_backend_stub
[ -x "$SERVER" ] || fail "no tritonserver in $DIST"
[ -x "$STUB_SRC" ] || fail "nvidia-pytriton has no Python-backend stub for Python $PY_VER"
# The Python backend runs backends/python/triton_python_backend_stub; the
# wheel keeps one per Python version aside (pytriton copies the matching one
# the same way before it starts the server).
cmp -s "$STUB_SRC" "$STUB" || cp "$STUB_SRC" "$STUB" || fail "cannot copy the stub into $DIST/backends/python"

# missing_libs: the libraries the dynamic linker cannot find for the server,
# the Python backend and the stub.
missing_libs() {
    for f in "$SERVER" "$DIST/backends/python/libtriton_python.so" "$STUB"; do
        LD_LIBRARY_PATH="$LIBS" ldd "$f" 2>&1 | sed -n 's/^[[:space:]]*\([^ ]*\) => not found.*/\1/p'
    done | sort -u | tr '\n' ' '
}
missing=$(missing_libs)
case $missing in
*libpython"$PY_VER"*)
    # Debian's libpython3.X: the stub embeds CPython through it.
    SUDO=""
    [ "$(id -u)" -eq 0 ] || SUDO="sudo"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "libpython$PY_VER" >/dev/null 2>&1 ||
        fail "the stub needs libpython$PY_VER and apt-get cannot install it"
    missing=$(missing_libs)
    ;;
esac
[ -z "$missing" ] || fail "tritonserver lacks libraries: $missing"
echo "TRITON_SERVER=$SERVER"
echo "TRITON_BACKENDS=$DIST/backends"
echo "TRITON_LIBS=$LIBS"
echo "TRITON_BIN=$VENV/bin"
