#!/bin/sh
# docker/build.sh — the build steps of docker/Dockerfile, as a script that CI
# and a developer's machine run unchanged (Debian 12 here, Ubuntu 24.04 in the
# image's build stage).
#
#   docker/build.sh                  = deps build
#   docker/build.sh STEP [STEP...]   steps, in the order given:
#     deps           scripts/deps.sh: the package installer `make` and CI use
#     build          make (build/tpserve, and kernels/cuda when nvcc is on PATH),
#                    then make graphs (the example graphs)
#     unit           make unit (Check unit tests, needs build)
#     stage DESTDIR  lay out, under DESTDIR, the files the runtime image gets
#                    (needs build; never compiles):
#                      usr/local/bin/tpserve
#                      usr/local/lib/tpserve/libtpserve-cuda.so
#                                                  the cuda backend's device code
#                                                  (a cuda build only), where
#                                                  tpserve looks for it
#                      opt/tpserve/graphs/         example graphs, weights, inputs, refs
#                      etc/tpserve/tpserve.json    config/default.json with
#                                                  graph -> /opt/tpserve/graphs/<name>,
#                                                  host -> 0.0.0.0
#                      usr/share/tpserve/runtime-packages.txt
#                                                  apt packages owning the shared
#                                                  libraries tpserve and the cuda
#                                                  library link (dpkg -S),
#                                                  one a line: what the runtime
#                                                  stage installs
#
# env: BUILD (make's build directory, default build), PYTHON (default python3),
#      JOBS (make -j, default nproc).
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
PYTHON=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}

die() {
    echo "docker/build.sh: $*" >&2
    exit 1
}

step_deps() {
    PYTHON=$PYTHON ./scripts/deps.sh
}

step_build() {
    make -j"$JOBS" BUILD="$BUILD" PYTHON="$PYTHON"
    make BUILD="$BUILD" PYTHON="$PYTHON" graphs
}

step_unit() {
    make BUILD="$BUILD" PYTHON="$PYTHON" unit
}

# pkg_of LIBPATH: the Debian package that owns a shared library. dpkg knows a
# file by the path its package shipped, which after the /usr merge may be the
# /lib or the /usr/lib spelling, and through alternatives (libopenblas.so.0)
# only by the resolved target.
pkg_of() {
    real=$(readlink -f "$1")
    for p in "$real" "$1" "/usr$1" "${real#/usr}" "${1#/usr}"; do
        out=$(dpkg -S "$p" 2>/dev/null) || continue
        # "pkg:amd64: /path" or "pkg1, pkg2: /path"
        echo "$out" | sed -n '1s/: \/.*//p' | tr ',' '\n' | sed 's/:.*//; s/ //g'
        return 0
    done
    return 1
}

# runtime_packages BINARY: packages for each DT_NEEDED library of BINARY.
# CUDA's own libraries (cudart, cuBLAS, NCCL: under /usr/local/cuda or from
# NVIDIA's packages) come with the CUDA runtime image and are held there, so
# they are left out; the driver (libcuda, libnvidia-*) is mounted into the
# container by the NVIDIA container toolkit and is not found at build time.
runtime_packages() {
    bin=$1
    needed=$(readelf -d "$bin" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
    [ -n "$needed" ] || die "$bin: no DT_NEEDED entries (static binary?)"
    ldd "$bin" >"$STAGE_TMP/ldd" || die "ldd $bin failed"
    : >"$STAGE_TMP/pkgs"
    for lib in $needed; do
        case "$lib" in
        libcuda.so* | libnvidia-*) continue ;;
        esac
        path=$(awk -v n="$lib" '$1 == n && $2 == "=>" { print $3 }' "$STAGE_TMP/ldd")
        if [ -z "$path" ] || [ "$path" = "not" ]; then
            die "$bin needs $lib, which ldd does not find"
        fi
        case "$(readlink -f "$path")" in
        /usr/local/cuda*) continue ;;
        esac
        pkg=$(pkg_of "$path") || die "no Debian package owns $path ($lib)"
        echo "$pkg" >>"$STAGE_TMP/pkgs"
    done
    grep -Ev '^(cuda-|libcublas|libcudart|libnccl|libcufft|libcurand|libcusparse|libcusolver|libnpp)' \
        "$STAGE_TMP/pkgs" | sort -u || true
}

step_stage() {
    dest=$1
    bin="$BUILD/tpserve"
    [ -x "$bin" ] || die "$bin is missing: run 'docker/build.sh build' first"
    [ -f "$BUILD/graphs/manifest.json" ] || die "$BUILD/graphs is missing: run 'docker/build.sh build' first"
    STAGE_TMP=$(mktemp -d "${TMPDIR:-/tmp}/tpserve_stage.XXXXXX")
    mkdir -p "$dest/usr/local/bin" "$dest/opt/tpserve/graphs" "$dest/etc/tpserve" "$dest/usr/share/tpserve"
    install -m 0755 "$bin" "$dest/usr/local/bin/tpserve"
    libs="$bin"
    if [ -f "$BUILD/libtpserve-cuda.so" ]; then
        mkdir -p "$dest/usr/local/lib/tpserve"
        install -m 0644 "$BUILD/libtpserve-cuda.so" "$dest/usr/local/lib/tpserve/"
        libs="$libs $BUILD/libtpserve-cuda.so"
    fi
    for f in "$BUILD"/graphs/*.json "$BUILD"/graphs/*.safetensors; do
        install -m 0644 "$f" "$dest/opt/tpserve/graphs/"
    done
    "$PYTHON" - config/default.json "$dest/etc/tpserve/tpserve.json" <<'PY'
import json, os, sys
c = json.load(open(sys.argv[1]))
c["graph"] = "/opt/tpserve/graphs/" + os.path.basename(c["graph"])
c["host"] = "0.0.0.0"
with open(sys.argv[2], "w") as f:
    json.dump(c, f, indent=1)
    f.write("\n")
PY
    chmod 0644 "$dest/etc/tpserve/tpserve.json"
    g=$("$PYTHON" -c 'import json,sys; print(json.load(open(sys.argv[1]))["graph"])' "$dest/etc/tpserve/tpserve.json")
    [ -f "$dest$g" ] || die "config graph $g is not among the staged graphs"
    for f in $libs; do runtime_packages "$f"; done | sort -u >"$dest/usr/share/tpserve/runtime-packages.txt"
    rm -rf "$STAGE_TMP"
    [ -s "$dest/usr/share/tpserve/runtime-packages.txt" ] || die "no runtime packages found for $bin"
    echo "staged into $dest: tpserve, $(find "$dest/opt/tpserve/graphs" -name '*.json' | wc -l) graph/manifest files," \
        "runtime packages: $(tr '\n' ' ' <"$dest/usr/share/tpserve/runtime-packages.txt")"
}

[ $# -gt 0 ] || set -- deps build
while [ $# -gt 0 ]; do
    case "$1" in
    deps) step_deps ;;
    build) step_build ;;
    unit) step_unit ;;
    stage)
        [ $# -ge 2 ] || die "stage needs a DESTDIR"
        step_stage "$2"
        shift
        ;;
    -h | --help)
        sed -n '2,30p' "$0" | sed 's/^# \{0,1\}//'
        exit 0
        ;;
    *) die "unknown step '$1' (deps, build, unit, stage DESTDIR)" ;;
    esac
    shift
done
