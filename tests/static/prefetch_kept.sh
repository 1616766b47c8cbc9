#!/bin/sh
# The packed GEMM's kernels prefetch the next panels' weights inside their
# k loops (kernels/cpu/packed_gemm.c, tile_prefetch), and those prefetches
# must reach the object code. GCC 12 took a function whose only effect was
# _mm_prefetch (__builtin_prefetch) for one without side effects and
# deleted every call to it, inlined or not: for a while the weights of
# every product came from memory on demand (128 x 768 x 3072 with cold
# weights at 133-136 GFLOP/s on a Xeon core instead of 143, before the
# prefetch moved into the k loop). Each kernel also prefetches the rows of
# c it writes: two lines a row (kernel_6: 12), three in the wide kernel
# (kernel_wide_6: 18); the weights' prefetch comes on top of those.
# Usage: CC=cc sh tests/static/prefetch_kept.sh   (from the repository root)
CC=${CC:-cc}
asm=$($CC -std=c11 -D_GNU_SOURCE -O2 -DNDEBUG -Iutil -Iengine -Ikernels -Ikernels/cpu -S -o - \
    kernels/cpu/packed_gemm.c) || { echo "prefetch_kept: cannot compile kernels/cpu/packed_gemm.c"; exit 1; }
counts=$(printf '%s\n' "$asm" | awk '
    /^[A-Za-z_][A-Za-z0-9_.]*:/ { fn = $1 }
    /^[ \t]+prefetch/ { n[fn]++ }
    END { printf "%d %d", n["kernel_6:"], n["kernel_wide_6:"] }')
k6=${counts% *}
w6=${counts#* }
if [ "$k6" -le 12 ] || [ "$w6" -le 18 ]; then
    echo "prefetch_kept: FAILED: kernel_6 has $k6 prefetches (its c takes 12), kernel_wide_6 $w6 (18):" \
        "the weights' prefetch is gone from kernels/cpu/packed_gemm.c"
    exit 1
fi
echo "prefetch_kept: ok (kernel_6 $k6 prefetches, kernel_wide_6 $w6)"
