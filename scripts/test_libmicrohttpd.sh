#!/bin/sh
# test_libmicrohttpd.sh SRC — the unit and integration suites against a
# libmicrohttpd built from SRC (a release tarball's tree, or a git checkout
# such as github.com/Karlson2k/libmicrohttpd at tag v1.0.1) instead of the
# system's: `make test` runs against Debian 12's 0.9.75, and Debian 13 ships
# 1.0.1, which differs where tpserve leans on it (MHD_get_connection_info
# answers, a suspended connection's event-loop state, what it refuses
# itself). tpserve is not rebuilt: the library's ABI (libmicrohttpd.so.12)
# is the same, so the one built here is loaded in the system's place
# (LD_LIBRARY_PATH).
#
# Every integration script runs but test_docker.sh, which checks that each
# library the image ships comes from a Debian package, and this one does not.
# Prints each suite's summary; exit 1 if any failed. Run it as
# `make test-libmicrohttpd MHD_SRC=DIR`, which builds the tests and graphs
# first. env: BUILD (build), PYTHON (python3).
set -eu
SRC=${1:?usage: test_libmicrohttpd.sh LIBMICROHTTPD_SOURCE_DIR}
SRC=$(cd "$SRC" && pwd)
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
OUT="$ROOT/$BUILD/libmicrohttpd-$(basename "$SRC")"
LOG="$OUT/build.log"
mkdir -p "$OUT/tree"

if [ ! -f "$OUT/inst/lib/libmicrohttpd.so.12" ]; then
    # a git checkout has no configure script: autotools make it
    if [ ! -x "$SRC/configure" ] && ! command -v autoreconf >/dev/null 2>&1; then
        echo "installing autotools to bootstrap $SRC"
        apt-get install -y -q autoconf automake libtool autopoint texinfo >"$OUT/apt.log" 2>&1 ||
            { echo "test_libmicrohttpd: cannot install autotools (see $OUT/apt.log)"; exit 1; }
    fi
    # built out of SRC's tree (a copy), so SRC is never written to
    cp -a "$SRC/." "$OUT/tree/"
    (
        cd "$OUT/tree"
        [ -x configure ] || ./autogen.sh
        ./configure --prefix="$OUT/inst" --disable-doc --disable-examples --disable-https --disable-curl
        make -j"$(nproc)"
        make install
    ) >"$LOG" 2>&1 || { echo "test_libmicrohttpd: building $SRC failed; the end of $LOG:"; tail -20 "$LOG"; exit 1; }
fi
LIB="$OUT/inst/lib"
echo "libmicrohttpd from $SRC ($(sed -n 's/^Version: //p' "$LIB/pkgconfig/libmicrohttpd.pc")), loaded from $LIB"

if ! LD_LIBRARY_PATH="$LIB" ldd "$BUILD/tpserve" | grep -q "$LIB/libmicrohttpd.so.12"; then
    echo "test_libmicrohttpd: $BUILD/tpserve does not load $LIB/libmicrohttpd.so.12"
    exit 1
fi
fail=0
LD_LIBRARY_PATH="$LIB" make --no-print-directory BUILD="$BUILD" unit || fail=1
for t in tests/integration/*.sh; do
    [ "$(basename "$t")" = test_docker.sh ] && continue
    echo "== $t"
    LD_LIBRARY_PATH="$LIB" TPSERVE="$BUILD/tpserve" TP_GRAPHS="$BUILD/graphs" PYTHON="$PYTHON" sh "$t" || fail=1
done
echo "test_libmicrohttpd: $([ $fail -eq 0 ] && echo passed || echo FAILED) against $SRC"
exit $fail
