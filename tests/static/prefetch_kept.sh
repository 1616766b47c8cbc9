#!/bin/sh
# The packed GEMM's prefetch of the next panel's weights must reach the
# object code. GCC 12 deemed a function whose only effect is
# _mm_prefetch (__builtin_prefetch) free of side effects and deleted every
# call to it, inlined or not: the weights of a product streamed from memory
# on demand, 128 x 768 x 3072 with cold weights at 133-136 GFLOP/s on one
# Xeon core instead of 143 (kernels/cpu/packed_gemm.c, prefetch_share). The
# kernels' own prefetches of c sit beside their stores and were kept, so
# this looks for a prefetch outside the kernel_* functions (the AVX2
# path's prefetch_share; the wide kernel's asm prefetches are inside it).
# Usage: CC=cc sh tests/static/prefetch_kept.sh   (from the repository root)
CC=${CC:-cc}
asm=$($CC -std=c11 -D_GNU_SOURCE -O2 -DNDEBUG -Iutil -Iengine -Ikernels -Ikernels/cpu -S -o - \
    kernels/cpu/packed_gemm.c) || { echo "prefetch_kept: cannot compile kernels/cpu/packed_gemm.c"; exit 1; }
n=$(printf '%s\n' "$asm" | awk '
    /^[A-Za-z_][A-Za-z0-9_.]*:/ { fn = $1 }
    /^[ \t]+prefetch/ && fn !~ /^kernel_/ { n++ }
    END { print n + 0 }')
if [ "$n" -eq 0 ]; then
    echo "prefetch_kept: FAILED: no prefetch outside kernel_* in kernels/cpu/packed_gemm.c (the compiler dropped prefetch_share's)"
    exit 1
fi
echo "prefetch_kept: ok ($n prefetch instructions outside the kernels)"
