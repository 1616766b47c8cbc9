#!/bin/sh
# The op table fails closed at build time: an op added to TP_OP_LIST
# without its descriptor does not compile (ops.c), a shape or batch-rows
# rule added without its case in the engine's exhaustive switches fails
# -Wswitch-enum (shapes.c, plan_rows.c), and a kernel family added to
# TP_FAMILY_LIST without its kernel k_name in a backend does not compile
# there (cpu_ops.c; cuda_ops.c when the CUDA headers are present). Each check
# edits a copy of engine/ and compiles one file against it; the unedited copy
# must compile first. (A descriptor without its family is test_ops' job.)
# Usage: CC=cc sh tests/static/op_table.sh   (from the repository root)
CC=${CC:-cc}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail=0

# The CUDA and NCCL headers cuda_ops.c needs, if this machine has them.
cuda_inc=${CUDA_HOME:-/usr/local/cuda}/include
nccl_inc=
for d in "$cuda_inc" /usr/local/include /usr/include; do [ -f "$d/nccl.h" ] && { nccl_inc=$d; break; }; done
cuda_flags=
[ -f "$cuda_inc/cuda_runtime_api.h" ] && [ -f "$cuda_inc/cublasLt.h" ] && [ -n "$nccl_inc" ] &&
    cuda_flags="-DTP_HAVE_CUDA -I$cuda_inc -I$nccl_inc"

# compile FILE EXPECT [FLAGS]: EXPECT "ok" or a string the compiler error must
# name. engine/FILE is compiled from the copy; kernels/... from the tree,
# finding engine/'s headers in the copy (-Wswitch-enum as the Makefile: engine/
# only).
compile() {
    case $1 in engine/*) src=$tmp/$1 w=-Wswitch-enum ;; *) src=$1 w= ;; esac
    out=$($CC -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror $w $3 -I"$tmp" -I"$tmp/engine" -Iutil -Ikernels \
          -fsyntax-only "$src" 2>&1)
    rc=$?
    if [ "$2" = ok ]; then
        [ $rc -eq 0 ] || { echo "FAIL: unedited $1 does not compile: $out"; fail=1; }
    elif [ $rc -eq 0 ] || ! printf '%s' "$out" | grep -q "$2"; then
        echo "FAIL: $1 compiled (or failed without naming $2) after the edit"; fail=1
    else
        echo "ok: $1 refuses to build: $(printf '%s' "$out" | grep -m1 "$2")"
    fi
}

fresh() { rm -rf "$tmp/engine"; cp -r engine "$tmp/engine"; }

fresh
for f in ops.c shapes.c plan_rows.c; do compile engine/$f ok; done
compile kernels/cpu/cpu_ops.c ok
[ -n "$cuda_flags" ] && compile kernels/cuda/cuda_ops.c ok "$cuda_flags"

fresh
sed -i 's/^#define TP_OP_LIST(X) \\$/#define TP_OP_LIST(X) X(BOGUS) \\/' "$tmp/engine/ops.h"
compile engine/ops.c desc_BOGUS

fresh
sed -i 's/TP_SHAPE_UNSET = 0,/TP_SHAPE_UNSET = 0, TP_SHAPE_BOGUS,/' "$tmp/engine/ops.h"
compile engine/shapes.c TP_SHAPE_BOGUS

fresh
sed -i 's/TP_ROWS_UNSET = 0,/TP_ROWS_UNSET = 0, TP_ROWS_BOGUS,/' "$tmp/engine/ops.h"
compile engine/plan_rows.c TP_ROWS_BOGUS

fresh
sed -i 's/^#define TP_FAMILY_LIST(X) \\$/#define TP_FAMILY_LIST(X) X(BOGUS, bogus) \\/' "$tmp/engine/ops.h"
compile kernels/cpu/cpu_ops.c k_bogus
if [ -n "$cuda_flags" ]; then
    compile kernels/cuda/cuda_ops.c k_bogus "$cuda_flags"
else
    echo "skipped: kernels/cuda/cuda_ops.c (no CUDA/NCCL headers)"
fi

exit $fail
