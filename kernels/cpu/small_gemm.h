/* small_gemm.h — c = alpha * a . b for products too small to pay for
 * OpenBLAS's call: a register-blocked AVX2/FMA kernel, no packing, no
 * scratch.
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
 * off): small_sgemm_takes keeps to the sizes it wins.
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

/* Whether this CPU can run the kernel (AVX2 and FMA). */
int small_sgemm_supported(void);

/* Decides once whether this process uses the kernel: it is supported, and
 * OpenBLAS's kernels (openblas_get_corename) have no small-matrix path of
 * their own. Thread-safe, idempotent; returns the decision. */
int small_sgemm_init(void);

/* Whether the kernel takes an M x K by K x N product of row-major operands
 * (unit column strides): small_sgemm_init chooses it (on the first call,
 * if nothing asked before), and the sizes are ones it wins. */
int small_sgemm_takes(int64_t M, int64_t N, int64_t K);

/* c[M, N] (rows ldc apart) = alpha * a[M, K] (rows lda apart) . b[K, N]
 * (rows ldb apart), M, N, K >= 1; only where small_sgemm_supported. */
void small_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                 const float *b, int64_t ldb, float *c, int64_t ldc);

#endif
