/* small_gemm.c — the small-product sgemm (small_gemm.h).
 *
 * c is computed in blocks of up to 4 rows by 16 columns: 8 accumulators
 * (two 8-float vectors a row) stay in registers over the whole k loop,
 * which per k loads b's 16 columns once and broadcasts each row's a
 * element: 8 fused multiply-adds for 2 loads and 4 broadcasts, about the
 * two FMAs a cycle these cores retire. Columns past N in the last block
 * are masked, so no scratch and no copy; rows past M use a shorter block
 * (the same arithmetic per element). On AVX-512 the same blocks are 32
 * columns wide (16-float vectors, mask registers for the tail): twice the
 * work per instruction, the same chain per element. The size rules come
 * from the measurements in small_gemm.h. */
#include "small_gemm.h"

#include <cblas.h>
#include <immintrin.h>
#include <pthread.h>
#include <strings.h>

#define SG_TARGET __attribute__((target("avx2,fma")))
#define SG_ROWS 4
#define SG_COLS 16

/* Lanes [0, n) of an 8-float vector on (n in 0..8). */
SG_TARGET static inline __m256i lanes(int64_t n)
{
    static const int32_t on[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(on + 8 - n));
}

/* rows (1..SG_ROWS) x cols (1..SG_COLS) of c. always_inline with a
 * constant rows: each caller gets its accumulators in registers. */
SG_TARGET __attribute__((always_inline)) static inline void block(int rows, int64_t cols, int64_t K,
                                                                   float alpha, const float *a,
                                                                   int64_t lda, const float *b,
                                                                   int64_t ldb, float *c, int64_t ldc)
{
    int full = cols == SG_COLS;
    __m256i m0 = lanes(cols < 8 ? cols : 8), m1 = lanes(cols > 8 ? cols - 8 : 0);
    __m256 lo[SG_ROWS], hi[SG_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
        lo[r] = hi[r] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m256 b0 = full ? _mm256_loadu_ps(bk) : _mm256_maskload_ps(bk, m0);
        __m256 b1 = full ? _mm256_loadu_ps(bk + 8) : _mm256_maskload_ps(bk + 8, m1);
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m256 x = _mm256_broadcast_ss(a + r * lda + k);
            lo[r] = _mm256_fmadd_ps(x, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(x, b1, hi[r]);
        }
    }
    __m256 s = _mm256_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        float *cr = c + r * ldc;
        if (full) {
            _mm256_storeu_ps(cr, _mm256_mul_ps(lo[r], s));
            _mm256_storeu_ps(cr + 8, _mm256_mul_ps(hi[r], s));
        } else {
            _mm256_maskstore_ps(cr, m0, _mm256_mul_ps(lo[r], s));
            _mm256_maskstore_ps(cr + 8, m1, _mm256_mul_ps(hi[r], s));
        }
    }
}

/* The same blocks 32 columns wide on AVX-512's 16-float vectors, with
 * mask registers for the last columns. wide: the block has more than 16
 * columns (the second vector of each row is live). */
#define SG512_TARGET __attribute__((target("avx512f")))
#define SG512_COLS 32

/* Lanes [0, n) of a 16-float vector (n in 0..16). */
static inline __mmask16 lanes16(int64_t n) { return (__mmask16)((1u << n) - 1u); }

SG512_TARGET __attribute__((always_inline)) static inline void block512(int rows, int wide, int64_t cols,
                                                                         int64_t K, float alpha,
                                                                         const float *a, int64_t lda,
                                                                         const float *b, int64_t ldb,
                                                                         float *c, int64_t ldc)
{
    __mmask16 m0 = lanes16(cols < 16 ? cols : 16), m1 = lanes16(cols > 16 ? cols - 16 : 0);
    __m512 lo[SG_ROWS], hi[SG_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
        lo[r] = hi[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const float *bk = b + k * ldb;
        __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
        __m512 b1 = wide ? _mm512_maskz_loadu_ps(m1, bk + 16) : b0;
#pragma GCC unroll 4
        for (int r = 0; r < rows; r++) {
            __m512 x = _mm512_set1_ps(a[r * lda + k]);
            lo[r] = _mm512_fmadd_ps(x, b0, lo[r]);
            if (wide)
                hi[r] = _mm512_fmadd_ps(x, b1, hi[r]);
        }
    }
    __m512 s = _mm512_set1_ps(alpha);
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++) {
        _mm512_mask_storeu_ps(c + r * ldc, m0, _mm512_mul_ps(lo[r], s));
        if (wide)
            _mm512_mask_storeu_ps(c + r * ldc + 16, m1, _mm512_mul_ps(hi[r], s));
    }
}

/* The rows of column block j: blocks of SG_ROWS, then the rest as one
 * shorter block, each call with a constant row count (the blocks are
 * always_inline: each count gets its accumulators in registers).
 * BLOCK(rows, i) computes rows [i, i + rows) of the column block. */
#define FOR_ROW_BLOCKS(BLOCK)                      \
    do {                                           \
        int64_t i = 0;                             \
        for (; i + SG_ROWS <= M; i += SG_ROWS)     \
            BLOCK(4, i);                           \
        switch (M - i) {                           \
        case 3: BLOCK(3, i); break;                \
        case 2: BLOCK(2, i); break;                \
        case 1: BLOCK(1, i); break;                \
        default: break;                            \
        }                                          \
    } while (0)

#define AT_ROWS(rows, i) a + (i) * lda, lda, b + j, ldb, c + (i) * ldc + j, ldc
#define BLOCK512_WIDE(rows, i) block512(rows, 1, cols, K, alpha, AT_ROWS(rows, i))
#define BLOCK512_NARROW(rows, i) block512(rows, 0, cols, K, alpha, AT_ROWS(rows, i))
#define BLOCK256(rows, i) block(rows, cols, K, alpha, AT_ROWS(rows, i))

SG512_TARGET static void sgemm_avx512(int64_t M, int64_t N, int64_t K, float alpha, const float *a,
                                      int64_t lda, const float *b, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < N; j += SG512_COLS) {
        int64_t cols = N - j < SG512_COLS ? N - j : SG512_COLS;
        if (cols > 16)
            FOR_ROW_BLOCKS(BLOCK512_WIDE);
        else
            FOR_ROW_BLOCKS(BLOCK512_NARROW);
    }
}

SG_TARGET static void sgemm_avx2(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                                 const float *b, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < N; j += SG_COLS) {
        int64_t cols = N - j < SG_COLS ? N - j : SG_COLS;
        FOR_ROW_BLOCKS(BLOCK256);
    }
}

int small_sgemm_supported(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int small_sgemm_avx512_supported(void) { return __builtin_cpu_supports("avx512f"); }

void small_sgemm_avx2(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float *c, int64_t ldc)
{
    sgemm_avx2(M, N, K, alpha, a, lda, b, ldb, c, ldc);
}

/* libgcc reads the CPU's features once at startup (and checks that the OS
 * saves AVX-512 state): a load and a test per call. */
void small_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda, const float *b,
                 int64_t ldb, float *c, int64_t ldc)
{
    if (small_sgemm_avx512_supported())
        sgemm_avx512(M, N, K, alpha, a, lda, b, ldb, c, ldc);
    else
        sgemm_avx2(M, N, K, alpha, a, lda, b, ldb, c, ldc);
}

/* OpenBLAS 0.3.21's cores with small-matrix sgemm kernels of their own
 * (kernel/x86_64/KERNEL.SKYLAKEX, which the other two build on). */
static int blas_has_small_kernels(void)
{
    static const char *const cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    const char *name = openblas_get_corename();
    for (size_t i = 0; name && i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(name, cores[i]) == 0)
            return 1;
    return 0;
}

static small_sgemm_use use;
static pthread_once_t decided = PTHREAD_ONCE_INIT;

/* Against OpenBLAS's small-matrix kernels only the AVX-512 blocks win, and
 * only the smallest products (small_gemm.h): 1.1-1.5x at 1-16 rows of a
 * 32 x 32 b, 0.8-0.9x once b has 4096 floats, fewer at 32+ rows. */
static void decide(void)
{
    if (!small_sgemm_supported())
        use = SMALL_SGEMM_UNUSED;
    else if (!blas_has_small_kernels())
        use = SMALL_SGEMM_SMALL_PRODUCTS;
    else
        use = small_sgemm_avx512_supported() ? SMALL_SGEMM_TINY_PRODUCTS : SMALL_SGEMM_UNUSED;
}

small_sgemm_use small_sgemm_init(void)
{
    pthread_once(&decided, decide);
    return use;
}

/* b is read once per 4 rows: while it fits in 8 KiB (L1) the kernel wins
 * at every M measured (up to 512 rows: 1.1-1.7x); up to 32 rows while it
 * fits in 256 KiB (L2), up to 8 beyond; never N over 1024, whose column
 * blocks are too far apart to stream (small_gemm.h's measurements). */
int small_sgemm_takes(int64_t M, int64_t N, int64_t K)
{
    small_sgemm_use u = small_sgemm_init();
    if (u == SMALL_SGEMM_UNUSED || M < 1 || N < 1 || K < 1 || N > 1024)
        return 0;
    int64_t b_floats = N * K;
    if (u == SMALL_SGEMM_TINY_PRODUCTS)
        return M <= 16 && b_floats <= 1024;
    /* One row of a b past 256 KiB is a matrix-vector product, which
     * OpenBLAS's sgemv streams faster than this kernel reads b
     * (ops_matmul.c's one_row; one thread, same run: 768 x 768 171 us
     * here vs 65, 768 x 3072 from 3072 rows 4519 vs 723): a decode step. */
    if (b_floats > 65536)
        return M >= 2 && M <= 8;
    return M <= (b_floats <= 2048 ? 512 : 32);
}

const char *small_sgemm_use_name(small_sgemm_use u)
{
    switch (u) {
    case SMALL_SGEMM_SMALL_PRODUCTS:
        return "small products";
    case SMALL_SGEMM_TINY_PRODUCTS:
        return "products of up to 16 rows by a b of up to 1024 floats";
    case SMALL_SGEMM_UNUSED:
        break;
    }
    return "none";
}
