/* small_gemm.c — the small-product sgemm (small_gemm.h).
 *
 * c is computed in blocks of up to 4 rows by 16 columns: 8 accumulators
 * (two 8-float vectors a row) stay in registers over the whole k loop,
 * which per k loads b's 16 columns once and broadcasts each row's a
 * element: 8 fused multiply-adds for 2 loads and 4 broadcasts, about the
 * two FMAs a cycle these cores retire. Columns past N in the last block
 * are masked, so no scratch and no copy; rows past M use a shorter block
 * (the same arithmetic per element). The size rule comes from the
 * measurements in small_gemm.h. */
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

SG_TARGET void small_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                           const float *b, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t j = 0; j < N; j += SG_COLS) {
        int64_t cols = N - j < SG_COLS ? N - j : SG_COLS;
        int64_t i = 0;
        for (; i + SG_ROWS <= M; i += SG_ROWS)
            block(4, cols, K, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
        switch (M - i) {
        case 3:
            block(3, cols, K, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
            break;
        case 2:
            block(2, cols, K, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
            break;
        case 1:
            block(1, cols, K, alpha, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc);
            break;
        default:
            break;
        }
    }
}

int small_sgemm_supported(void)
{
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

/* OpenBLAS 0.3.21's cores with small-matrix sgemm kernels of their own
 * (kernel/x86_64/KERNEL.SKYLAKEX, which the other two build on): faster
 * than this kernel there (80 ns against 133 at 8 x 32 x 32). */
static int blas_has_small_kernels(void)
{
    static const char *const cores[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    const char *name = openblas_get_corename();
    for (size_t i = 0; name && i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(name, cores[i]) == 0)
            return 1;
    return 0;
}

static int use_kernel;
static pthread_once_t decided = PTHREAD_ONCE_INIT;

static void decide(void) { use_kernel = small_sgemm_supported() && !blas_has_small_kernels(); }

int small_sgemm_init(void)
{
    pthread_once(&decided, decide);
    return use_kernel;
}

/* b is read once per 4 rows: while it fits in 8 KiB (L1) the kernel wins
 * at every M measured (up to 512 rows: 1.1-1.7x); up to 32 rows while it
 * fits in 256 KiB (L2), up to 8 beyond; never N over 1024, whose column
 * blocks are too far apart to stream (small_gemm.h's measurements). */
int small_sgemm_takes(int64_t M, int64_t N, int64_t K)
{
    if (!small_sgemm_init() || M < 1 || N < 1 || K < 1 || N > 1024)
        return 0;
    int64_t b_floats = N * K;
    return M <= (b_floats <= 2048 ? 512 : b_floats <= 65536 ? 32 : 8);
}
