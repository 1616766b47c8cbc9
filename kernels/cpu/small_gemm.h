/* small_gemm.h — c = alpha * a . b for products too small to pay for
 * OpenBLAS's call: a register-blocked AVX2/FMA kernel (with blocks twice
 * as wide on AVX-512), no packing, no scratch.
 *
 * Why: a step of a small model at a small batch is a handful of sgemm
 * calls of a few rows (the example MLP: M = 4-8 rows, N = K = 32), and
 * OpenBLAS 0.3.21 on its AVX2 cores (Haswell, Zen: no small-matrix
 * kernels there, unlike its SkylakeX/Cooperlake/SapphireRapids ones) packs
 * both operands on every call: 160-260 ns where the arithmetic takes
 * 35-135. Measured on the 2026-11-27 VM (AMD EPYC, OpenBLAS Haswell
 * kernels), OpenBLAS's time over this kernel's: 5.5x at 1 x 32 x 32, 1.9x
 * at 8 x 32 x 32, 1.2x at 512 x 32 x 32, 1.3x at 8 x 768 x 768, 0.4-0.8x
 * with N = 3072 (B's columns far apart) or 64+ rows of 768 (packing pays
 * off): small_sgemm_takes keeps to the sizes it wins. Its AVX-512
 * blocks, where the CPU has AVX-512F, are 1.7-1.9x faster again at 1-512
 * rows of 32 x 32 (8 x 32 x 32: 232 ns OpenBLAS Haswell, 137 AVX2, 73
 * AVX-512), so the rule stays on the safe side there.
 *
 * Against OpenBLAS's own small-matrix kernels (its AVX-512 cores) only
 * the AVX-512 blocks win, and only the smallest products: OpenBLAS
 * Cooperlake's time over theirs 1.4x at 1 x 32 x 32, 1.5x at 4, 1.1x at 8
 * and 16 rows; 0.9x at 32 rows, and 0.8-0.9x once b has 4096 floats
 * (8 x 64 x 64, 8 x 128 x 32), so there they take up to 16 rows of a b
 * of up to 1024 floats (SMALL_SGEMM_TINY_PRODUCTS).
 *
 * Rounding: each element of c is one chain of fused multiply-adds over k
 * in order, from zero, then one multiplication by alpha: the same bits
 * whatever M, N, the row's or column's place, and the instruction set
 * used. A row computed alone equals the same row in any batch this kernel
 * takes (the cpu backend's batch invariance is exact here, within a
 * tolerance across OpenBLAS's sizes). */
#ifndef TP_SMALL_GEMM_H
#define TP_SMALL_GEMM_H

#include <stdint.h>

/* Whether this CPU can run the kernel (AVX2 and FMA: its AVX2 blocks). */
int small_sgemm_supported(void);

/* Which products this process gives the kernel. */
typedef enum {
    SMALL_SGEMM_UNUSED,         /* none: no AVX2/FMA, or OpenBLAS's small kernels and no AVX-512 */
    SMALL_SGEMM_SMALL_PRODUCTS, /* the sizes it wins over OpenBLAS's packing (its AVX2 cores) */
    SMALL_SGEMM_TINY_PRODUCTS,  /* the few it wins over OpenBLAS's small kernels (its AVX-512 cores) */
} small_sgemm_use;

/* Decides once which products this process gives the kernel, from what
 * the CPU runs and whether OpenBLAS's kernels (openblas_get_corename) have
 * a small-matrix path of their own. Thread-safe, idempotent. */
small_sgemm_use small_sgemm_init(void);
/* For the startup log: "small products", ... */
const char *small_sgemm_use_name(small_sgemm_use u);

/* Whether the kernel takes an M x K by K x N product of row-major operands
 * (unit column strides): small_sgemm_init's choice (made on the first
 * call, if nothing asked before) and sizes it wins. */
int small_sgemm_takes(int64_t M, int64_t N, int64_t K);

/* c[M, N] (rows ldc apart) = alpha * a[M, K] (rows lda apart) . b[K, N]
 * (rows ldb apart), M, N, K >= 1; only where small_sgemm_supported. On
 * AVX-512 the blocks are twice as wide; the bits are the same. */
void small_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float *c, int64_t ldc);

/* Whether small_sgemm runs its AVX-512 blocks here (AVX-512F, saved by
 * the OS). */
int small_sgemm_avx512_supported(void);
/* small_sgemm's AVX2 blocks whatever the CPU has (for tests: both
 * paths give the same bits). */
void small_sgemm_avx2(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float *c, int64_t ldc);

#endif
