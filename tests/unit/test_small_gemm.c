/* test_small_gemm.c — the small-product sgemm (kernels/cpu/small_gemm.h)
 * against the same arithmetic in portable C, bit for bit: each element is
 * one chain of fused multiply-adds over k from zero, then one product
 * with alpha, which fmaf and the kernel's vector FMAs round identically
 * on every x86-64 CPU that runs the kernel (IEEE 754 fusedMultiplyAdd).
 * Both instruction sets' blocks are checked where the CPU runs them
 * (AVX-512's 32 columns wide, AVX2's 16): the same bits.
 * On a CPU without AVX2/FMA the kernel never runs and these checks say so. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/ops_internal.h"
#include "cpu/small_gemm.h"
#include "testutil.h"

#define PAD 3 /* extra elements per row of a, b and c: strides the kernel must honour */
static const float SENTINEL = -12345.5f;

static void reference(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                      const float *b, int64_t ldb, float *c, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < K; k++)
                acc = fmaf(a[i * lda + k], b[k * ldb + j], acc);
            c[i * ldc + j] = acc * alpha;
        }
}

static int skip_without_kernel(void)
{
    if (small_sgemm_supported())
        return 0;
    printf("test_small_gemm: skipped: no AVX2/FMA on this CPU (OpenBLAS runs every product)\n");
    return 1;
}

typedef struct {
    float *a, *b, *c, *ref;
    int64_t lda, ldb, ldc;
} operands;

static operands make(int64_t M, int64_t N, int64_t K, unsigned seed)
{
    operands o = {.lda = K + PAD, .ldb = N + PAD, .ldc = N + PAD};
    o.a = malloc(sizeof(float) * (size_t)(M * o.lda));
    o.b = malloc(sizeof(float) * (size_t)(K * o.ldb));
    o.c = malloc(sizeof(float) * (size_t)(M * o.ldc));
    o.ref = malloc(sizeof(float) * (size_t)(M * o.ldc));
    ck_assert(o.a && o.b && o.c && o.ref);
    tu_fill(o.a, M * o.lda, seed);
    tu_fill(o.b, K * o.ldb, seed + 1);
    for (int64_t i = 0; i < M * o.ldc; i++)
        o.c[i] = o.ref[i] = SENTINEL;
    return o;
}

static void release(operands *o)
{
    free(o->a);
    free(o->b);
    free(o->c);
    free(o->ref);
}

typedef void (*sgemm_fn)(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t lda,
                         const float *b, int64_t ldb, float *c, int64_t ldc);

/* Every M through two row blocks and a tail, N through one, two and three
 * column blocks of either width with every tail, K from 1 up, alpha 1 and
 * not: equal bits, and nothing written past N in a row (the sentinels). */
static int check_fma_chains(sgemm_fn f, const char *which)
{
    static const int64_t Ms[] = {1, 2, 3, 4, 5, 7, 8, 9, 31, 32};
    static const int64_t Ks[] = {1, 2, 7, 32, 100};
    int shapes = 0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int64_t N = 1; N <= 72; N++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof Ks[0]; ki++) {
                int64_t M = Ms[mi], K = Ks[ki];
                float alpha = (N % 3) ? 1.0f : 0.125f * (float)(N % 7) - 0.3f;
                operands o = make(M, N, K, (unsigned)(M * 131 + N * 7 + K));
                f(M, N, K, alpha, o.a, o.lda, o.b, o.ldb, o.c, o.ldc);
                reference(M, N, K, alpha, o.a, o.lda, o.b, o.ldb, o.ref, o.ldc);
                if (memcmp(o.c, o.ref, sizeof(float) * (size_t)(M * o.ldc)) != 0)
                    ck_abort_msg("%s: %lld x %lld x %lld (alpha %g): the kernel's bits differ from the FMA "
                                 "chain's", which, (long long)M, (long long)K, (long long)N, alpha);
                release(&o);
                shapes++;
            }
    return shapes;
}

START_TEST(equals_fma_chains_bit_for_bit)
{
    if (skip_without_kernel())
        return;
    ck_assert_int_eq(check_fma_chains(small_sgemm_avx2, "AVX2 blocks"), 10 * 72 * 5);
    if (small_sgemm_avx512_supported())
        ck_assert_int_eq(check_fma_chains(small_sgemm, "AVX-512 blocks"), 10 * 72 * 5);
    else
        printf("test_small_gemm: AVX-512 blocks not checked: this CPU has no AVX-512F\n");
}
END_TEST

/* A row alone gives the bits it gives among 31 others, in any block and
 * tail position: requests batched together get the answers they get alone. */
START_TEST(a_row_alone_equals_it_in_a_batch)
{
    if (skip_without_kernel())
        return;
    const int64_t M = 31, N = 37, K = 32;
    operands o = make(M, N, K, 7);
    small_sgemm(M, N, K, 1.0f, o.a, o.lda, o.b, o.ldb, o.c, o.ldc);
    for (int64_t i = 0; i < M; i++) {
        float row[N];
        small_sgemm(1, N, K, 1.0f, o.a + i * o.lda, o.lda, o.b, o.ldb, row, N);
        ck_assert_msg(memcmp(row, o.c + i * o.ldc, sizeof row) == 0, "row %lld alone differs", (long long)i);
    }
    release(&o);
}
END_TEST

/* The sizes the kernel is measured to win (small_gemm.h), and none else:
 * against OpenBLAS's packing (its AVX2 cores) up to 512 rows of a small
 * b; against its own small kernels (its AVX-512 cores) only the smallest
 * products, and only with AVX-512 blocks. */
START_TEST(takes_only_the_sizes_it_wins)
{
    small_sgemm_use use = small_sgemm_init();
    ck_assert_int_eq(small_sgemm_init(), use); /* decided once */
    if (use != SMALL_SGEMM_UNUSED)
        ck_assert(small_sgemm_supported());
    if (use == SMALL_SGEMM_TINY_PRODUCTS)
        ck_assert(small_sgemm_avx512_supported());
    int used = use != SMALL_SGEMM_UNUSED, all = use == SMALL_SGEMM_SMALL_PRODUCTS;
    ck_assert_int_eq(small_sgemm_takes(8, 32, 32), used);  /* the example MLP's step */
    ck_assert_int_eq(small_sgemm_takes(16, 32, 32), used);
    ck_assert_int_eq(small_sgemm_takes(17, 32, 32), all);
    ck_assert_int_eq(small_sgemm_takes(8, 64, 64), all);   /* b of 4096 floats */
    ck_assert_int_eq(small_sgemm_takes(32, 256, 256), all);
    ck_assert_int_eq(small_sgemm_takes(8, 768, 3072), all);
    ck_assert_int_eq(small_sgemm_takes(512, 32, 32), all); /* b in L1: any M measured */
    ck_assert_int_eq(small_sgemm_takes(513, 32, 32), 0);
    ck_assert_int_eq(small_sgemm_takes(33, 64, 64), 0);   /* rows enough to pack */
    ck_assert_int_eq(small_sgemm_takes(9, 768, 768), 0);  /* b past 256 KiB: up to 8 rows */
    ck_assert_int_eq(small_sgemm_takes(2, 768, 768), all);
    ck_assert_int_eq(small_sgemm_takes(1, 768, 768), 0);  /* ... from 2: one row is an sgemv */
    ck_assert_int_eq(small_sgemm_takes(1, 768, 3072), 0);
    ck_assert_int_eq(small_sgemm_takes(1, 3072, 768), 0); /* columns too far apart */
    ck_assert_int_eq(small_sgemm_takes(0, 32, 32), 0);
    ck_assert_int_eq(small_sgemm_takes(4, 32, 0), 0);
}
END_TEST

/* max|c - ref| / max|ref| over an M x N block (graphs/README.md's metric) */
static double rel_diff(const float *c, int64_t ldc, const float *ref, int64_t ldr, int64_t M, int64_t N)
{
    double worst = 0, scale = 1e-6;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            worst = fmax(worst, fabs(c[i * ldc + j] - ref[i * ldr + j]));
            scale = fmax(scale, fabs(ref[i * ldr + j]));
        }
    return worst / scale;
}

/* Through ops_sgemm: a row-major product the kernel takes gives its bits
 * (equal to the chain), one BLAS must take (a transposed) stays within
 * TU_RTOL_REORDER of it (OpenBLAS sums in its own order). */
START_TEST(ops_sgemm_routes_small_products)
{
    const int64_t M = 6, N = 32, K = 32;
    int used = small_sgemm_init();
    operands o = make(M, N, K, 3);
    ops_buf sa = {0}, sb = {0};
    tp_err err = {0};
    ck_assert_int_eq(ops_sgemm(M, N, K, 1.0f, o.a, o.lda, 1, o.b, o.ldb, 1, o.c, o.ldc, &sa, &sb, &err), TP_OK);
    reference(M, N, K, 1.0f, o.a, o.lda, o.b, o.ldb, o.ref, o.ldc);
    double worst = rel_diff(o.c, o.ldc, o.ref, o.ldc, M, N);
    if (used)
        ck_assert_msg(worst == 0.0, "the kernel was chosen, yet ops_sgemm's bits differ (%g)", worst);
    else
        ck_assert_double_le(worst, TU_RTOL_REORDER);
    /* a as its transpose's columns: [K, M] stored, read with strides (1, M) */
    float at[K * M], c2[M * N];
    for (int64_t i = 0; i < M; i++)
        for (int64_t k = 0; k < K; k++)
            at[k * M + i] = o.a[i * o.lda + k];
    ck_assert_int_eq(ops_sgemm(M, N, K, 1.0f, at, 1, M, o.b, o.ldb, 1, c2, N, &sa, &sb, &err), TP_OK);
    ck_assert_double_le(rel_diff(c2, N, o.ref, o.ldc, M, N), TU_RTOL_REORDER);
    ops_buf_free(&sa);
    ops_buf_free(&sb);
    release(&o);
}
END_TEST

static Suite *small_gemm_suite(void)
{
    Suite *s = suite_create("small_gemm");
    TCase *tc = tcase_create("core");
    /* 3,600 shapes against the FMA chain, twice: 14 s under ASan on a
     * 2.3 GHz Xeon, past Check's default of 4 */
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, equals_fma_chains_bit_for_bit);
    tcase_add_test(tc, a_row_alone_equals_it_in_a_batch);
    tcase_add_test(tc, takes_only_the_sizes_it_wins);
    tcase_add_test(tc, ops_sgemm_routes_small_products);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(small_gemm_suite)
