/* test_packed_gemm.c — tpserve's FP32 GEMM by weights packed once at load
 * (kernels/cpu/packed_gemm.h), the registry of packed weights
 * (weight_packs.h), cpu_matmul on a registered weight (FP32, and FP16/BF16
 * widened into FP32 panels), and the engine's
 * choice of which params to pack and whether in place (engine/weights.c).
 *
 * The kernel against a double-precision reference over shapes that cross
 * every blocking edge (MR 6, NR 16, KC 256, MC 132); bit for bit the same
 * row alone or in a batch and over any split of the panels (the kernel's
 * promise: each element is one fixed FMA chain); never a write outside
 * c's M x N. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"
#include "check_main.h"
#include "cpu/cpu_backend.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_pool.h"
#include "cpu/ops_internal.h"
#include "cpu/packed_gemm.h"
#include "cpu/weight_packs.h"
#include "rank_group.h"
#include "spin_wait.h"
#include "testutil.h"
#include "weights.h"

/* An FP32 result against its double reference: each element is a chain
 * of K fused multiply-adds in FP32 (and one add per KC block), each
 * rounding once by at most 2^-24 relative to the partial sum, itself at
 * most sum_k |a_ik * b_kj|; so |got - ref| <= ~K * 2^-24 * that absolute
 * sum in the worst case (K 600: 3.6e-5), and a random walk of roundings
 * stays near sqrt(K) * 2^-24 (1.5e-6). 1e-5 of the absolute sum is far
 * above what such chains give yet far below a missed or doubled product
 * (|a * b| ~ 0.3 of values in [-1, 1)) or a wrong column. The 1e-30
 * admits an exact zero against a reference of a denormal's size. */
#define PGEMM_RTOL_ABS_SUM 1e-5
#define PGEMM_ATOL 1e-30

static float *falloc(size_t n)
{
    float *p = aligned_alloc(64, (n * sizeof(float) + 63) & ~(size_t)63);
    ck_assert(p);
    return p;
}

static float *filled(size_t n, unsigned seed)
{
    float *p = falloc(n);
    tu_fill(p, (int64_t)n, seed);
    return p;
}

/* A 0xa5 pattern in every byte of c: a NaN, never a product's result. */
static void sentinel(float *c, size_t n) { memset(c, 0xa5, n * sizeof(float)); }

static int is_sentinel(const float *x)
{
    static const unsigned char s[4] = {0xa5, 0xa5, 0xa5, 0xa5};
    return memcmp(x, s, 4) == 0;
}

/* Whether this process packs; when the CPU cannot run the kernel, says so
 * once and checks the registry is off, so the caller skips. */
static int kernel_runs(const char *test)
{
    if (pgemm_supported())
        return 1;
    printf("%s: skipped, this CPU lacks AVX2 or FMA\n", test);
    ck_assert_int_eq(weight_packs_enabled(), 0);
    return 0;
}

/* Whether weights are packed in this process: kernel_runs, and
 * TPSERVE_CPU_GEMM is not openblas (says so once when it is). */
static int packing_runs(const char *test)
{
    if (!kernel_runs(test))
        return 0;
    if (weight_packs_enabled())
        return 1;
    printf("%s: skipped, TPSERVE_CPU_GEMM=openblas\n", test);
    return 0;
}

/* c = a . b through pgemm_pack and pgemm_run over all panels. */
static void pgemm(int64_t M, int64_t K, int64_t N, const float *a, int64_t lda, const float *b, int64_t sbk,
                  int64_t sbn, float *c, int64_t ldc, int64_t p0, int64_t p1)
{
    float *packed = falloc(pgemm_packed_floats(K, N));
    pgemm_pack(b, K, N, sbk, sbn, packed);
    pgemm_run(M, K, N, a, lda, packed, c, ldc, p0, p1);
    free(packed);
}

/* ------------------------------------------------------------ kernel */

START_TEST(kernel_matches_double_reference)
{
    if (!kernel_runs("kernel_matches_double_reference"))
        return;
    /* 7-9 rows and blocks ending in them (128, 141) take split tiles */
    const int64_t Ms[] = {1, 2, 5, 6, 7, 8, 9, 128, 131, 132, 133, 141, 300}, Ks[] = {1, 7, 256, 257, 600},
                  Ns[] = {1, 15, 16, 17, 40, 100};
    float *a = filled(300 * 603, 1), *b = filled(600 * 100, 2), *c = falloc(300 * 100);
    double *ref = malloc(sizeof(double) * 300 * 100), *abs_sum = malloc(sizeof(double) * 300 * 100);
    ck_assert(ref && abs_sum);
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
            for (int tb = 0; tb <= 1; tb++) {
                /* tb: b is a [N, K] weight read transposed */
                int64_t K = Ks[ki], N = Ns[ni], sbk = tb ? 1 : N, sbn = tb ? K : 1, lda = tb ? K + 3 : K;
                int64_t M = Ms[sizeof Ms / sizeof *Ms - 1];
                for (int64_t i = 0; i < M; i++)
                    for (int64_t j = 0; j < N; j++) {
                        double s = 0, s_abs = 0;
                        for (int64_t k = 0; k < K; k++) {
                            double p = (double)a[i * lda + k] * (double)b[k * sbk + j * sbn];
                            s += p;
                            s_abs += fabs(p);
                        }
                        ref[i * N + j] = s;
                        abs_sum[i * N + j] = s_abs;
                    }
                /* Rows of the reference do not depend on M: one reference
                 * of 300 rows serves every M. */
                for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                    M = Ms[mi];
                    sentinel(c, (size_t)(M * N));
                    pgemm(M, K, N, a, lda, b, sbk, sbn, c, N, 0, pgemm_panels(N));
                    int64_t bad = -1;
                    for (int64_t e = 0; e < M * N && bad < 0; e++)
                        if (!(fabs(c[e] - ref[e]) <= PGEMM_RTOL_ABS_SUM * abs_sum[e] + PGEMM_ATOL))
                            bad = e;
                    ck_assert_msg(bad < 0, "%lld x %lld x %lld%s: c[%lld][%lld] = %.9g, reference %.9g", (long long)M,
                                  (long long)K, (long long)N, tb ? " (b transposed)" : "",
                                  (long long)(bad / N), (long long)(bad % N), bad < 0 ? 0.0 : (double)c[bad],
                                  bad < 0 ? 0.0 : ref[bad]);
                }
            }
    free(a), free(b), free(c), free(ref), free(abs_sum);
}
END_TEST

/* Bit equality, no tolerance: packed_gemm.h promises each element of c is
 * the same chain of operations whatever M, the rows packed beside it and
 * the panels a call covers (KC-long FMA chains in k order, added to c in
 * k order), so a row alone, a row in a batch of 297 (three MC blocks, the
 * last ending in tiles of 5 and 4 rows) and any split of the panels
 * between calls give the same bits. */
START_TEST(rows_and_panel_splits_same_bits)
{
    if (!kernel_runs("rows_and_panel_splits_same_bits"))
        return;
    const int64_t M = 297, Ks[] = {257, 600}, Ns[] = {40, 100};
    float *a = filled(M * 600, 3), *b = filled(600 * 100, 4), *whole = falloc(M * 100), *part = falloc(M * 100);
    float *packed = falloc(pgemm_packed_floats(600, 100));
    for (size_t ki = 0; ki < 2; ki++)
        for (size_t ni = 0; ni < 2; ni++) {
            int64_t K = Ks[ki], N = Ns[ni], P = pgemm_panels(N);
            pgemm_pack(b, K, N, N, 1, packed);
            pgemm_run(M, K, N, a, K, packed, whole, N, 0, P);
            for (int64_t i = 0; i < M; i++) {
                sentinel(part, (size_t)N);
                pgemm_run(1, K, N, a + i * K, K, packed, part, N, 0, P);
                ck_assert_msg(memcmp(part, whole + i * N, sizeof(float) * (size_t)N) == 0,
                              "%lld x %lld: row %lld alone differs from the same row of %lld", (long long)K,
                              (long long)N, (long long)i, (long long)M);
            }
            for (int64_t p = 1; p < P; p++) {
                sentinel(part, (size_t)(M * N));
                pgemm_run(M, K, N, a, K, packed, part, N, 0, p);
                /* the first call leaves the second's columns alone */
                int64_t touched = -1;
                for (int64_t e = 0; e < M * N && touched < 0; e++)
                    if (e % N >= p * PGEMM_NR && !is_sentinel(&part[e]))
                        touched = e;
                ck_assert_msg(touched < 0, "%lld x %lld, panels [0, %lld): wrote c[%lld][%lld]", (long long)K,
                              (long long)N, (long long)p, (long long)(touched / N), (long long)(touched % N));
                pgemm_run(M, K, N, a, K, packed, part, N, p, P);
                ck_assert_msg(memcmp(part, whole, sizeof(float) * (size_t)(M * N)) == 0,
                              "%lld x %lld x %lld: panels [0, %lld) then [%lld, %lld) differ from the whole",
                              (long long)M, (long long)K, (long long)N, (long long)p, (long long)p, (long long)P);
            }
        }
    free(a), free(b), free(whole), free(part), free(packed);
}
END_TEST

/* The wide kernel (two panels at once in AVX-512 registers) runs each
 * element's chain as the AVX2 kernel does: the same bits, for tiles of 1-6
 * rows, pairs and lone panels (an odd p0 or p1, a last panel past N), one
 * or more KC blocks, and b read transposed. Skipped where the CPU lacks
 * AVX-512: there only the AVX2 kernel runs. */
START_TEST(wide_and_avx2_kernels_same_bits)
{
    if (!kernel_runs("wide_and_avx2_kernels_same_bits"))
        return;
    if (!pgemm_wide_supported()) {
        printf("wide_and_avx2_kernels_same_bits: skipped, this CPU lacks AVX-512\n");
        return;
    }
    const int64_t Ms[] = {1, 2, 3, 5, 6, 7, 9, 128, 141, 297}, Ks[] = {1, 5, 257, 600}, Ns[] = {16, 31, 32, 33, 100, 161};
    float *a = filled(297 * 600, 11), *b = filled(600 * 161, 12), *wide = falloc(297 * 161), *avx2 = falloc(297 * 161);
    float *packed = falloc(pgemm_packed_floats(600, 161));
    int was = pgemm_set_wide(1);
    for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
            for (int tb = 0; tb <= 1; tb++) {
                int64_t K = Ks[ki], N = Ns[ni], P = pgemm_panels(N);
                pgemm_pack(b, K, N, tb ? 1 : N, tb ? K : 1, packed);
                for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
                    for (int64_t p0 = 0; p0 < 2 && p0 < P; p0++) {
                        int64_t M = Ms[mi];
                        sentinel(wide, (size_t)(M * N));
                        sentinel(avx2, (size_t)(M * N));
                        pgemm_set_wide(1);
                        pgemm_run(M, K, N, a, K, packed, wide, N, p0, P);
                        pgemm_set_wide(0);
                        pgemm_run(M, K, N, a, K, packed, avx2, N, p0, P);
                        ck_assert_msg(memcmp(wide, avx2, sizeof(float) * (size_t)(M * N)) == 0,
                                      "%lld x %lld x %lld%s, panels [%lld, %lld): the wide kernel's bits differ",
                                      (long long)M, (long long)K, (long long)N, tb ? " (b transposed)" : "",
                                      (long long)p0, (long long)P);
                    }
            }
    pgemm_set_wide(was);
    ck_assert_int_eq(pgemm_wide(), was);
    free(a), free(b), free(wide), free(avx2), free(packed);
}
END_TEST

/* The kernels read a where it lies, rows lda apart: the bits of the same
 * rows copied contiguous, with NaN in the lda - K floats between rows
 * (never read, or c would be NaN), for tiles of 1-6 rows and split
 * tiles, KC blocks and rows from a later MC block on; in both kernels
 * where the CPU has the wide one. */
START_TEST(a_read_where_it_lies)
{
    if (!kernel_runs("a_read_where_it_lies"))
        return;
    const int64_t Ms[] = {1, 7, 8, 9, 128, 133, 141, 300}, Ks[] = {5, 263, 600}, N = 100, P = pgemm_panels(N);
    float *a = falloc(300 * 613), *dense = filled(300 * 600, 7), *b = filled(600 * 100, 8);
    float *spread = falloc(300 * 100), *packed_rows = falloc(300 * 100), *packed = falloc(pgemm_packed_floats(600, 100));
    int was = pgemm_wide();
    for (int wide = 0; wide <= pgemm_wide_supported(); wide++) {
        pgemm_set_wide(wide);
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
            int64_t K = Ks[ki], lda = K + 13;
            for (int64_t i = 0; i < 300; i++)
                for (int64_t k = 0; k < lda; k++)
                    a[i * lda + k] = k < K ? dense[i * K + k] : NAN;
            pgemm_pack(b, K, N, N, 1, packed);
            for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                int64_t M = Ms[mi], r0 = PGEMM_MC * ((M - 1) / PGEMM_MC); /* the last MC block */
                sentinel(spread, (size_t)(M * N));
                sentinel(packed_rows, (size_t)(M * N));
                pgemm_run(M, K, N, a, lda, packed, spread, N, 0, P);
                pgemm_run(M, K, N, dense, K, packed, packed_rows, N, 0, P);
                ck_assert_msg(memcmp(spread, packed_rows, sizeof(float) * (size_t)(M * N)) == 0,
                              "%lld x %lld x %lld%s: rows %lld apart differ from the same rows contiguous",
                              (long long)M, (long long)K, (long long)N, wide ? " (wide)" : "", (long long)lda);
                sentinel(spread, (size_t)(M * N));
                pgemm_run(M - r0, K, N, a + r0 * lda, lda, packed, spread, N, 0, P);
                ck_assert_msg(memcmp(spread, packed_rows + r0 * N, sizeof(float) * (size_t)((M - r0) * N)) == 0,
                              "%lld x %lld%s: rows from %lld on differ from the same rows of the whole",
                              (long long)M, (long long)K, wide ? " (wide)" : "", (long long)r0);
            }
        }
    }
    pgemm_set_wide(was);
    free(a), free(dense), free(b), free(spread), free(packed_rows), free(packed);
}
END_TEST

/* More panels than one group (pgemm_group_panels): every group's columns
 * against the double reference, and calls split inside and across groups
 * (which moves the group boundaries) give the whole's bits. */
START_TEST(panel_groups_match_reference_and_split)
{
    if (!kernel_runs("panel_groups_match_reference_and_split"))
        return;
    const int64_t M = 140, K = 300, G = pgemm_group_panels(M), N = PGEMM_NR * G + 40, P = pgemm_panels(N);
    const int64_t splits[] = {5, G, G + 1};
    float *a = filled(M * K, 5), *b = filled(K * N, 6), *whole = falloc(M * N), *part = falloc(M * N);
    pgemm(M, K, N, a, K, b, N, 1, whole, N, 0, P);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, s_abs = 0;
            for (int64_t k = 0; k < K; k++) {
                double x = (double)a[i * K + k] * (double)b[k * N + j];
                s += x;
                s_abs += fabs(x);
            }
            ck_assert_msg(fabs(whole[i * N + j] - s) <= PGEMM_RTOL_ABS_SUM * s_abs + PGEMM_ATOL,
                          "%lld x %lld x %lld: c[%lld][%lld] = %.9g, reference %.9g", (long long)M, (long long)K,
                          (long long)N, (long long)i, (long long)j, (double)whole[i * N + j], s);
        }
    for (size_t si = 0; si < sizeof splits / sizeof *splits; si++) {
        sentinel(part, (size_t)(M * N));
        pgemm(M, K, N, a, K, b, N, 1, part, N, 0, splits[si]);
        pgemm(M, K, N, a, K, b, N, 1, part, N, splits[si], P);
        ck_assert_msg(memcmp(part, whole, sizeof(float) * (size_t)(M * N)) == 0,
                      "panels [0, %lld) then [%lld, %lld) differ from the whole", (long long)splits[si],
                      (long long)splits[si], (long long)P);
    }
    free(a), free(b), free(whole), free(part);
}
END_TEST

/* c's rows ldc apart with ldc > N, and rows past M: the kernel writes
 * exactly the M x N block (its edge tiles go through a scratch tile). */
START_TEST(writes_only_m_by_n)
{
    if (!kernel_runs("writes_only_m_by_n"))
        return;
    const int64_t Ms[] = {1, 5, 7, 133}, Ks[] = {7, 257}, Ns[] = {1, 15, 17, 40};
    float *a = filled(133 * 257, 5), *b = filled(257 * 40, 6), *c = falloc(135 * 47);
    for (size_t mi = 0; mi < 4; mi++)
        for (size_t ki = 0; ki < 2; ki++)
            for (size_t ni = 0; ni < 4; ni++) {
                int64_t M = Ms[mi], K = Ks[ki], N = Ns[ni], ldc = N + 7, rows = M + 2;
                sentinel(c, (size_t)(rows * ldc));
                pgemm(M, K, N, a, K, b, N, 1, c, ldc, 0, pgemm_panels(N));
                for (int64_t i = 0; i < rows; i++)
                    for (int64_t j = 0; j < ldc; j++) {
                        int inside = i < M && j < N;
                        if (inside == is_sentinel(&c[i * ldc + j]))
                            ck_assert_msg(0, "%lld x %lld x %lld, ldc %lld: c[%lld][%lld] %s", (long long)M,
                                          (long long)K, (long long)N, (long long)ldc, (long long)i, (long long)j,
                                          inside ? "not written" : "written outside M x N");
                    }
            }
    free(a), free(b), free(c);
}
END_TEST

/* ---------------------------------------------------------- registry */

START_TEST(registry_add_find_forget)
{
    if (!packing_runs("registry_add_find_forget"))
        return;
    const int64_t K = 10;
    tp_err err = {{0}};
    /* N 32: panels exactly as large as w, w aligned -> packed in place */
    float *w = filled(K * 32, 7), *want = falloc(pgemm_packed_floats(K, 32));
    pgemm_pack(w, K, 32, 32, 1, want);
    ck_assert_msg(weight_packs_add(w, TP_F32, K, 32, 32, 1, 1, &err) == TP_OK, "%s", err.msg);
    ck_assert_ptr_eq(weight_packs_find(w, TP_F32, K, 32, 32, 1), w);
    ck_assert_mem_eq(w, want, sizeof(float) * pgemm_packed_floats(K, 32));
    /* another view of the same memory, or another address: not these panels */
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K, 32, 33, 1));
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K, 32, 1, K));
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K - 1, 32, 32, 1));
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K, 16, 32, 1));
    ck_assert_ptr_null(weight_packs_find(w + 1, TP_F32, K, 32, 32, 1));

    /* N 20: the panels are larger than w -> beside it, w unchanged */
    float *v = filled(K * 20, 8), *v0 = falloc(K * 20), *vwant = falloc(pgemm_packed_floats(K, 20));
    memcpy(v0, v, sizeof(float) * K * 20);
    pgemm_pack(v, K, 20, 20, 1, vwant);
    ck_assert_msg(weight_packs_add(v, TP_F32, K, 20, 20, 1, 1, &err) == TP_OK, "%s", err.msg);
    const float *vp = weight_packs_find(v, TP_F32, K, 20, 20, 1);
    ck_assert_ptr_nonnull(vp);
    ck_assert_ptr_ne(vp, v);
    ck_assert_mem_eq(vp, vwant, sizeof(float) * pgemm_packed_floats(K, 20));
    ck_assert_mem_eq(v, v0, sizeof(float) * K * 20);

    /* N 32 but not in place (another reader), and N 32 in place but at an
     * address the kernel's aligned loads cannot take: beside, unchanged */
    float *u = filled(K * 32 + 8, 9), *u0 = falloc(K * 32 + 8);
    memcpy(u0, u, sizeof(float) * (K * 32 + 8));
    ck_assert_msg(weight_packs_add(u, TP_F32, K, 32, 32, 1, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(weight_packs_add(u + 1, TP_F32, K, 32, 32, 1, 1, &err) == TP_OK, "%s", err.msg);
    for (int off = 0; off <= 1; off++) {
        const float *up = weight_packs_find(u + off, TP_F32, K, 32, 32, 1);
        ck_assert_ptr_nonnull(up);
        ck_assert_ptr_ne(up, u + off);
        pgemm_pack(u0 + off, K, 32, 32, 1, want);
        ck_assert_mem_eq(up, want, sizeof(float) * pgemm_packed_floats(K, 32));
    }
    ck_assert_mem_eq(u, u0, sizeof(float) * (K * 32 + 8));

    /* a second add of the same address is refused, the first entry kept */
    memset(&err, 0, sizeof err);
    ck_assert_int_eq(weight_packs_add(v, TP_F32, K, 20, 20, 1, 0, &err), TP_INTERNAL);
    ck_assert_msg(strstr(err.msg, "already packed") != NULL, "%s", err.msg);
    ck_assert_int_eq(weight_packs_add(w, TP_F32, K, 16, 16, 1, 0, &err), TP_INTERNAL);
    ck_assert_ptr_eq(weight_packs_find(v, TP_F32, K, 20, 20, 1), vp);
    ck_assert_ptr_eq(weight_packs_find(w, TP_F32, K, 32, 32, 1), w);

    /* forgetting memory never packed changes nothing */
    float other[4];
    weight_packs_forget(other);
    weight_packs_forget(w + 2);
    ck_assert_ptr_eq(weight_packs_find(w, TP_F32, K, 32, 32, 1), w);
    ck_assert_ptr_eq(weight_packs_find(v, TP_F32, K, 20, 20, 1), vp);

    weight_packs_forget(w);
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K, 32, 32, 1));
    ck_assert_ptr_eq(weight_packs_find(v, TP_F32, K, 20, 20, 1), vp);
    weight_packs_forget(v);
    weight_packs_forget(u);
    weight_packs_forget(u + 1);
    ck_assert_ptr_null(weight_packs_find(v, TP_F32, K, 20, 20, 1));
    ck_assert_ptr_null(weight_packs_find(u, TP_F32, K, 32, 32, 1));
    /* and a forgotten address may be packed again */
    ck_assert_msg(weight_packs_add(v, TP_F32, K, 20, 20, 1, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(weight_packs_find(v, TP_F32, K, 20, 20, 1));
    weight_packs_forget(v);
    free(w), free(want), free(v), free(v0), free(vwant), free(u), free(u0);
}
END_TEST

/* A sole weight packed beside its memory (FP16: panels twice its size)
 * is dead: the whole pages inside it are given back and read as zeros,
 * while the bytes it shares with its neighbours' pages stay; a weight
 * with other readers keeps every byte. */
START_TEST(sole_weight_beside_released)
{
    if (!packing_runs("sole_weight_beside_released"))
        return;
    const int64_t K = 64, N = 512;
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = sizeof(uint16_t) * (size_t)(K * N);
    unsigned char *block[2];
    uint16_t *w[2];
    tp_err err = {{0}};
    for (int sole = 0; sole < 2; sole++) {
        block[sole] = aligned_alloc(page, bytes + 2 * page);
        ck_assert_ptr_nonnull(block[sole]);
        w[sole] = (uint16_t *)(block[sole] + 100); /* partial pages at both ends */
        for (int64_t i = 0; i < K * N; i++)
            w[sole][i] = 0x3c00; /* 1.0 */
        ck_assert_msg(weight_packs_add(w[sole], TP_F16, K, N, N, 1, sole, &err) == TP_OK, "%s", err.msg);
        ck_assert_ptr_nonnull(weight_packs_find(w[sole], TP_F16, K, N, N, 1));
    }
    size_t zeros = 0;
    for (size_t i = 0; i < bytes; i++) {
        uintptr_t at = (uintptr_t)((unsigned char *)w[1] + i);
        int inside = at >= (((uintptr_t)w[1] + page - 1) & ~(uintptr_t)(page - 1)) &&
                     at < (((uintptr_t)w[1] + bytes) & ~(uintptr_t)(page - 1));
        unsigned char want = inside ? 0 : (i % 2 ? 0x3c : 0x00);
        if (((unsigned char *)w[1])[i] != want)
            ck_assert_msg(0, "sole weight byte %zu (%s a whole page): 0x%02x", i, inside ? "inside" : "outside",
                          ((unsigned char *)w[1])[i]);
        zeros += inside;
    }
    ck_assert_uint_ge(zeros, bytes - 2 * page); /* pages were released */
    for (int64_t i = 0; i < K * N; i++)
        if (w[0][i] != 0x3c00)
            ck_assert_msg(0, "weight with other readers: element %lld changed", (long long)i);
    for (int sole = 0; sole < 2; sole++) {
        weight_packs_forget(w[sole]);
        free(block[sole]);
    }
}
END_TEST

/* A TPSERVE_CPU_GEMM the backend has no GEMM for stops the backend,
 * naming the value; the two names and unset/empty pass. */
START_TEST(unknown_gemm_setting_refused)
{
    const char *ok[] = {"", "packed", "openblas"};
    tp_err err = {{0}};
    ck_assert_int_eq(unsetenv("TPSERVE_CPU_GEMM"), 0);
    ck_assert_int_eq(weight_packs_check_setting(&err), TP_OK);
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ck_assert_int_eq(setenv("TPSERVE_CPU_GEMM", ok[i], 1), 0);
        ck_assert_msg(weight_packs_check_setting(&err) == TP_OK, "'%s' refused: %s", ok[i], err.msg);
    }
    ck_assert_int_eq(setenv("TPSERVE_CPU_GEMM", "opnblas", 1), 0);
    ck_assert_int_eq(weight_packs_check_setting(&err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "TPSERVE_CPU_GEMM=opnblas") && strstr(err.msg, "openblas)"), "%s", err.msg);
    tp_backend *b = NULL;
    ck_assert_int_eq(tp_cpu_backend_create(1, NULL, &b, &err), TP_INVALID);
    ck_assert_ptr_null(b);
    ck_assert_msg(strstr(err.msg, "cpu backend: TPSERVE_CPU_GEMM=opnblas"), "%s", err.msg);
    ck_assert_int_eq(unsetenv("TPSERVE_CPU_GEMM"), 0);
}
END_TEST

/* TPSERVE_CPU_GEMM=openblas turns packing off. weight_packs_enabled
 * reads the variable once per process (pthread_once): Check forks each
 * test from a runner that never asks, so the setenv here comes first.
 * Under CK_FORK=no an earlier test may have asked already, and the rest
 * of the suite would run with packing off: skipped there. */
START_TEST(openblas_env_turns_packing_off)
{
    const char *fork_mode = getenv("CK_FORK");
    if (fork_mode && strcmp(fork_mode, "no") == 0) {
        printf("openblas_env_turns_packing_off: skipped, CK_FORK=no (needs a fresh process)\n");
        return;
    }
    ck_assert_int_eq(setenv("TPSERVE_CPU_GEMM", "openblas", 1), 0);
    ck_assert_int_eq(weight_packs_enabled(), 0);
    float *w = filled(4 * 32, 10), *w0 = falloc(4 * 32);
    memcpy(w0, w, sizeof(float) * 4 * 32);
    tp_err err = {{0}};
    ck_assert_msg(weight_packs_add(w, TP_F32, 4, 32, 32, 1, 1, &err) == TP_OK, "%s", err.msg);
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, 4, 32, 32, 1));
    ck_assert_mem_eq(w, w0, sizeof(float) * 4 * 32); /* not packed in place either */
    free(w), free(w0);
}
END_TEST

/* -------------------------------------------------------- cpu_matmul */

/* OpenBLAS (the unregistered copy) and our kernel sum in other orders:
 * tolerance as in testutil.h's TU_RTOL_REORDER (K 200 products of values
 * under 1), relative to the element with 1 as a floor. */
static void expect_close(const float *got, const float *want, int64_t n, const char *what)
{
    for (int64_t e = 0; e < n; e++)
        ck_assert_msg(fabsf(got[e] - want[e]) <= TU_RTOL_REORDER * (fabsf(want[e]) + 1.0f),
                      "%s: c[%lld] = %.9g, OpenBLAS on the unpacked weight %.9g", what, (long long)e, got[e],
                      want[e]);
}

static void run_on(cpu_pool *pool, const tp_attrs *at, tp_tensor *a, tp_tensor *b, tp_tensor *out)
{
    tp_tensor ins[2] = {*a, *b};
    tp_err err = {{0}};
    ck_assert_msg(cpu_op_run_on(pool, TP_OP_MATMUL, at, ins, 2, out, 0, 1, &err) == TP_OK, "%s", err.msg);
}

/* run_on a pool after reserving what the product takes from it
 * (cpu_op_reserve, as a capture does): neither the product nor one of
 * fewer rows (matmul_rows runs row subsets) grows what the pool keeps.
 * Only an FP16/BF16 product keeps any (its widened a, its FP32 chunks):
 * an FP32 one reads a where it lies and writes c in place. */
static void run_reserved(cpu_pool *pool, const tp_attrs *at, tp_tensor *a, tp_tensor *b, tp_tensor *out)
{
    tp_tensor ins[2] = {*a, *b};
    tp_err err = {{0}};
    ck_assert_msg(cpu_op_reserve(pool, TP_OP_MATMUL, at, ins, 2, out, &err) == TP_OK, "%s", err.msg);
    size_t kept = cpu_pool_scratch_bytes(pool);
    if (out->dtype == TP_F32)
        ck_assert_uint_eq(kept, 0);
    else
        ck_assert_uint_gt(kept, 0);
    tp_tensor a1 = tp_tensor_narrow(a, 0, 0, 1), o1 = tp_tensor_narrow(out, 0, 0, 1);
    run_on(pool, at, &a1, b, &o1);
    run_on(pool, at, a, b, out);
    ck_assert_msg(cpu_pool_scratch_bytes(pool) == kept, "scratch grew from %zu to %zu bytes past its reservation",
                  kept, cpu_pool_scratch_bytes(pool));
}

/* One weight case: w [K, N] (or [N, K] with tb) registered (in place
 * when it may be), against a copy nobody registered; a contiguous, a
 * strided a whose rows still fold (every other row), a strided a whose
 * rows do not (copied), an out whose rows do not fold; and a pool of 2
 * threads bit-equal to none (each element one chain whatever the panel
 * split, as above). */
static void matmul_case(int64_t K, int64_t N, int tb, int in_place)
{
    const int64_t B = 3, S = 50, R = 20;
    tp_attrs at;
    memset(&at, 0, sizeof at);
    at.transpose_b = tb;
    float *w = filled((size_t)(K * N), 11), *copy = falloc((size_t)(K * N));
    memcpy(copy, w, sizeof(float) * (size_t)(K * N));
    tp_err err = {{0}};
    int64_t sbk = tb ? 1 : N, sbn = tb ? K : 1;
    ck_assert_msg(weight_packs_add(w, TP_F32, K, N, sbk, sbn, in_place, &err) == TP_OK, "%s", err.msg);
    const float *panels = weight_packs_find(w, TP_F32, K, N, sbk, sbn);
    ck_assert_ptr_nonnull(panels);
    ck_assert_int_eq(panels == w, in_place && N % PGEMM_NR == 0);
    int64_t ws[2] = {tb ? N : K, tb ? K : N};
    tp_tensor tw = tp_tensor_make(w, TP_F32, 2, ws), tc = tp_tensor_make(copy, TP_F32, 2, ws);

    float *a = filled((size_t)(B * S * K), 12), *want = falloc((size_t)(B * S * N)),
          *got = falloc((size_t)(B * S * N)), *big = falloc((size_t)(B * S * N));
    int64_t as[3] = {B, S, K}, os[3] = {B, S, N};
    tp_tensor ta = tp_tensor_make(a, TP_F32, 3, as);
    char what[128];

    /* contiguous [3, 50, K] */
    tp_tensor ow = tp_tensor_make(want, TP_F32, 3, os), og = tp_tensor_make(got, TP_F32, 3, os);
    run_on(NULL, &at, &ta, &tc, &ow);
    sentinel(got, (size_t)(B * S * N));
    run_on(NULL, &at, &ta, &tw, &og);
    snprintf(what, sizeof what, "K %lld N %lld%s, a contiguous", (long long)K, (long long)N, tb ? " transposed" : "");
    expect_close(got, want, B * S * N, what);
    cpu_pool *pool = NULL;
    ck_assert_msg(cpu_pool_create(2, TP_SPIN_NS, &pool, &err) == TP_OK, "%s", err.msg);
    memcpy(big, got, sizeof(float) * (size_t)(B * S * N));
    sentinel(got, (size_t)(B * S * N));
    run_reserved(pool, &at, &ta, &tw, &og);
    ck_assert_msg(memcmp(got, big, sizeof(float) * (size_t)(B * S * N)) == 0,
                  "%s: other bits on a pool of 2 threads", what);

    /* every other row: [3, 25, K], rows 2K apart, which fold into one matrix */
    tp_tensor sa = ta;
    sa.shape[1] = S / 2;
    sa.stride[1] = 2 * K;
    int64_t os2[3] = {B, S / 2, N};
    ow = tp_tensor_make(want, TP_F32, 3, os2), og = tp_tensor_make(got, TP_F32, 3, os2);
    run_on(NULL, &at, &sa, &tc, &ow);
    sentinel(got, (size_t)(B * S * N));
    run_on(NULL, &at, &sa, &tw, &og);
    snprintf(what, sizeof what, "K %lld N %lld%s, every other row of a", (long long)K, (long long)N,
             tb ? " transposed" : "");
    expect_close(got, want, B * S / 2 * N, what);

    /* every other row of the first 20 of each batch row: [3, 20, K], which
     * does not fold (copied); and out's rows 50 apart in [3, 50, N] */
    sa.shape[1] = R;
    int64_t os3[3] = {B, R, N};
    ow = tp_tensor_make(want, TP_F32, 3, os3);
    run_on(NULL, &at, &sa, &tc, &ow);
    og = tp_tensor_make(big, TP_F32, 3, os3);
    og.stride[0] = S * N;
    for (int t = 0; t < 2; t++) {
        sentinel(big, (size_t)(B * S * N));
        /* cpu_op_run_on takes contiguous outputs only; a fused matmul's
         * block (fused.c) calls cpu_matmul with such an out directly */
        ck_assert_msg(cpu_matmul(&at, &sa, &tw, &og, t ? pool : NULL, &err) == TP_OK, "%s", err.msg);
        for (int64_t i = 0; i < B; i++)
            for (int64_t r = 0; r < S; r++)
                for (int64_t j = 0; j < N; j++) {
                    const float *x = &big[(i * S + r) * N + j];
                    if (r >= R) {
                        ck_assert_msg(is_sentinel(x), "K %lld N %lld: wrote out's gap [%lld][%lld][%lld]",
                                      (long long)K, (long long)N, (long long)i, (long long)r, (long long)j);
                        continue;
                    }
                    got[(i * R + r) * N + j] = *x;
                }
        snprintf(what, sizeof what, "K %lld N %lld%s, rows that do not fold, %s", (long long)K, (long long)N,
                 tb ? " transposed" : "", t ? "pool of 2" : "no pool");
        expect_close(got, want, B * R * N, what);
    }
    cpu_pool_free(pool);
    weight_packs_forget(w);
    free(w), free(copy), free(a), free(want), free(got), free(big);
}

START_TEST(matmul_by_registered_weight)
{
    if (!packing_runs("matmul_by_registered_weight"))
        return;
    /* in place: a matmul that missed the panels would read them as the
     * weight and fail the comparison, so this also proves they are used */
    matmul_case(200, 64, 0, 1);
    matmul_case(200, 48, 1, 1);
    matmul_case(200, 40, 0, 1); /* beside: N not a multiple of 16 */
    matmul_case(200, 40, 1, 0);
}
END_TEST

/* An FP16/BF16 weight, widened once into panels beside it (never in
 * place: FP32 panels are twice its size). Its memory is overwritten once
 * registered, so only a product that reads the panels still gives the
 * product of its original values: here OpenBLAS on an unregistered copy
 * (widened per call, cpu_matmul's matmul_half). Both sum the same FP32
 * products in other orders and round once to the dtype, so they may
 * differ by one unit in its last place: 2^-10 relative for FP16, 2^-7
 * for BF16 (plus TU_RTOL_REORDER for the sums, relative to 1 at least). */
static void narrow_case(tp_dtype dt, int64_t M, int64_t K, int64_t N, int tb)
{
    tp_attrs at;
    memset(&at, 0, sizeof at);
    at.transpose_b = tb;
    float *wf = filled((size_t)(K * N), 41), *af = filled((size_t)(M * K), 42);
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(K * N)), *copy = malloc(sizeof(uint16_t) * (size_t)(K * N)),
             *a = malloc(sizeof(uint16_t) * (size_t)(M * K)), *want = malloc(sizeof(uint16_t) * (size_t)(M * N)),
             *got = malloc(sizeof(uint16_t) * (size_t)(M * N)), *pooled = malloc(sizeof(uint16_t) * (size_t)(M * N));
    ck_assert(w && copy && a && want && got && pooled);
    for (int64_t i = 0; i < K * N; i++)
        tp_store_f32(w, dt, i, wf[i]);
    for (int64_t i = 0; i < M * K; i++)
        tp_store_f32(a, dt, i, af[i]);
    memcpy(copy, w, sizeof(uint16_t) * (size_t)(K * N));
    tp_err err = {{0}};
    int64_t sbk = tb ? 1 : N, sbn = tb ? K : 1;
    ck_assert_msg(weight_packs_add(w, dt, K, N, sbk, sbn, 1, &err) == TP_OK, "%s", err.msg);
    const float *panels = weight_packs_find(w, dt, K, N, sbk, sbn);
    ck_assert_ptr_nonnull(panels);
    ck_assert_ptr_ne(panels, (const void *)w);
    ck_assert_ptr_null(weight_packs_find(w, TP_F32, K, N, sbk, sbn)); /* the dtype is part of the key */
    memset(w, 0x7b, sizeof(uint16_t) * (size_t)(K * N)); /* 60768 as FP16, 1.3e36 as BF16 */

    int64_t ws[2] = {tb ? N : K, tb ? K : N}, as[2] = {M, K}, os[2] = {M, N};
    tp_tensor tw = tp_tensor_make(w, dt, 2, ws), tc = tp_tensor_make(copy, dt, 2, ws);
    tp_tensor ta = tp_tensor_make(a, dt, 2, as), ow = tp_tensor_make(want, dt, 2, os),
              og = tp_tensor_make(got, dt, 2, os), op = tp_tensor_make(pooled, dt, 2, os);
    run_on(NULL, &at, &ta, &tc, &ow);
    run_on(NULL, &at, &ta, &tw, &og);
    cpu_pool *pool = NULL;
    ck_assert_msg(cpu_pool_create(2, TP_SPIN_NS, &pool, &err) == TP_OK, "%s", err.msg);
    run_reserved(pool, &at, &ta, &tw, &op);
    cpu_pool_free(pool);
    /* Both sides sum the same K products in FP32, in other orders (the
     * unpacked weight goes to OpenBLAS, whose kernel differs by CPU), then
     * round once to the narrow type. Each order is within K * 2^-24 *
     * sum |a||w| of the exact sum (Higham, Accuracy and Stability, 3.1), so
     * the two within twice that, plus an ulp of the narrow type for their
     * roundings. A relative bound on |c| does not hold across CPUs: an
     * element that cancels to 4e-4 from terms of magnitude ~1 differed by
     * 1.1e-5 between this kernel and OpenBLAS's SkylakeX one (K 480). A
     * wrong panel, row or chunk is off by whole products (~0.1 each). */
    double ulp = dt == TP_F16 ? 0x1p-10 : 0x1p-7;
    for (int64_t e = 0; e < M * N; e++) {
        float g = tp_load_f32(got, dt, e), x = tp_load_f32(want, dt, e);
        int64_t m = e / N, j = e % N;
        double mag = 0;
        for (int64_t k = 0; k < K; k++)
            mag += fabs((double)tp_load_f32(a, dt, m * K + k) * (double)tp_load_f32(copy, dt, tb ? j * K + k : k * N + j));
        if (fabsf(g - x) > ulp * fmaxf(fabsf(g), fabsf(x)) + 2.0 * (double)K * 0x1p-24 * mag)
            ck_assert_msg(0, "%s K %lld N %lld%s: c[%lld] = %.6g on the panels, %.6g on the unpacked weight",
                          tp_dtype_name(dt), (long long)K, (long long)N, tb ? " transposed" : "", (long long)e,
                          (double)g, (double)x);
    }
    ck_assert_msg(memcmp(got, pooled, sizeof(uint16_t) * (size_t)(M * N)) == 0,
                  "%s: other bits on a pool of 2 threads", tp_dtype_name(dt));
    weight_packs_forget(w);
    free(wf), free(af), free(w), free(copy), free(a), free(want), free(got), free(pooled);
}

START_TEST(matmul_by_narrow_weight)
{
    if (!packing_runs("matmul_by_narrow_weight"))
        return;
    for (int d = 0; d < 2; d++) {
        tp_dtype dt = d ? TP_BF16 : TP_F16;
        narrow_case(dt, 37, 200, 64, 0);
        narrow_case(dt, 37, 300, 40, 1); /* a last panel past N, and KC blocks */
        /* 131 panels: chunks of the narrow result (ops_matmul.c's
         * NARROW_CHUNK_PANELS, 64) inside each thread's share of 65-66 */
        narrow_case(dt, 37, 100, 2088, 0);
        /* 1100 rows: blocks of NARROW_CHUNK_ROWS (528), a packed once */
        narrow_case(dt, 1100, 24, 70, 1);
        /* a past PGEMM_A_ONCE_MAX_FLOATS: packed a block at a time */
        narrow_case(dt, 4400, 480, 20, 0);
    }
}
END_TEST

/* ------------------------------------------------------------ engine */

/* A GPT-2-like tie: e is both the embedding table and, transposed, the
 * head's weight; w and v are read by one matmul each. */
static const char *PACK_GRAPH =
    "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"packs\",\"world_size\":1,\"weights\":\"w.safetensors\","
    "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[\"B\",4]},"
    "{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",4,8]}],"
    "\"params\":[{\"name\":\"e\",\"datatype\":\"FP32\",\"shape\":[16,8]},"
    "{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[8,32]},"
    "{\"name\":\"v\",\"datatype\":\"FP32\",\"shape\":[8,20]}],"
    "\"nodes\":[{\"name\":\"emb\",\"op\":\"embedding\",\"inputs\":[\"ids\",\"e\"]},"
    "{\"name\":\"logits\",\"op\":\"matmul\",\"inputs\":[\"emb\",\"e\"],\"attrs\":{\"transpose_b\":true}},"
    "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]},"
    "{\"name\":\"u\",\"op\":\"matmul\",\"inputs\":[\"x\",\"v\"]}],"
    "\"outputs\":[{\"name\":\"logits\"},{\"name\":\"h\"},{\"name\":\"u\"}]}";

static float e_data[16 * 8], w_data[8 * 32], v_data[8 * 20];

static void write_pack_graph(char *dir, char *path)
{
    static const int64_t es[2] = {16, 8}, wsh[2] = {8, 32}, vs[2] = {8, 20};
    tu_fill(e_data, 16 * 8, 21);
    tu_fill(w_data, 8 * 32, 22);
    tu_fill(v_data, 8 * 20, 23);
    st_write_item items[3] = {
        {"e", TP_F32, 2, es, e_data}, {"w", TP_F32, 2, wsh, w_data}, {"v", TP_F32, 2, vs, v_data}};
    tu_write_graph(dir, path, PACK_GRAPH, items, 3);
}

static const tp_host_tensor *output_named(const tp_host_tensor *out, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(out[i].name, name) == 0)
            return &out[i];
    ck_assert_msg(0, "no output %s", name);
    return NULL;
}

/* out [rows, N] against rows of a (K 8) times b (element (k, n) at
 * b[k * sbk + n * sbn]) in double; tolerance as for the kernel (K 8
 * products: OpenBLAS or the packed kernel, either within it). */
static void expect_product(const tp_host_tensor *out, const float *a, int64_t rows, const float *b, int64_t N,
                           int64_t sbk, int64_t sbn, const char *what)
{
    ck_assert_int_eq(out->dtype, TP_F32);
    ck_assert_uint_eq(out->nbytes, sizeof(float) * (size_t)(rows * N));
    const float *c = out->data;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, s_abs = 0;
            for (int64_t k = 0; k < 8; k++) {
                double p = (double)a[i * 8 + k] * (double)b[k * sbk + j * sbn];
                s += p;
                s_abs += fabs(p);
            }
            ck_assert_msg(fabs(c[i * N + j] - s) <= PGEMM_RTOL_ABS_SUM * s_abs + PGEMM_ATOL,
                          "%s[%lld][%lld] = %.9g, reference %.9g", what, (long long)i, (long long)j,
                          (double)c[i * N + j], s);
        }
}

/* The engine, its tied, in-place and beside weights included, gives the
 * products of the unpacked weights; its pools' scratch is all reserved at
 * load. */
START_TEST(engine_outputs_with_packed_weights)
{
    char dir[64], path[128];
    write_pack_graph(dir, path);
    tp_engine *eng = tu_engine(path, 1, 0);
    /* the captures reserved every product's scratch: requests keep no more */
    size_t kept = tp_cpu_backend_scratch_bytes(tp_engine_backend(eng));
    for (int64_t B = 1; B <= 3; B += 2) {
        int64_t ids[3 * 4], is[2] = {B, 4}, xs[3] = {B, 4, 8};
        float x[3 * 4 * 8], emb[3 * 4 * 8];
        tu_fill(x, B * 32, 30u + (unsigned)B);
        for (int64_t i = 0; i < B * 4; i++) {
            ids[i] = (i * 7 + 3) % 16;
            memcpy(&emb[i * 8], &e_data[ids[i] * 8], sizeof(float) * 8);
        }
        tp_host_tensor in[2] = {tu_tensor("ids", TP_I64, ids, 2, is), tu_f32("x", x, 3, xs)};
        int n_out;
        tp_host_tensor *out = tu_infer(eng, in, 2, &n_out);
        ck_assert_int_eq(n_out, 3);
        expect_product(output_named(out, n_out, "logits"), emb, B * 4, e_data, 16, 1, 8, "logits");
        expect_product(output_named(out, n_out, "h"), x, B * 4, w_data, 32, 32, 1, "h");
        expect_product(output_named(out, n_out, "u"), x, B * 4, v_data, 20, 20, 1, "u");
        tp_host_tensors_free(out, n_out);
    }
    ck_assert_uint_eq(tp_cpu_backend_scratch_bytes(tp_engine_backend(eng)), kept);
    tp_engine_free(eng);
    tu_rmdir(dir);
}
END_TEST

static int param_index(const tp_graph *g, const char *name)
{
    for (int p = 0; p < g->n_params; p++)
        if (strcmp(g->nodes[g->param_ids[p]].name, name) == 0)
            return p;
    ck_assert_msg(0, "no param %s", name);
    return -1;
}

/* weights.c's decision, seen in the registry: w (read by one matmul only,
 * N 32) packed in place; v (one matmul, N 20) beside; e (the embedding
 * reads it too) beside, under its transposed view, its memory untouched. */
START_TEST(engine_packs_sole_weights_in_place)
{
    if (!packing_runs("engine_packs_sole_weights_in_place"))
        return;
    char dir[64], path[128];
    write_pack_graph(dir, path);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    tp_backend *b;
    tp_rank_group *rg;
    tp_weights *wt;
    tp_err err = {{0}};
    ck_assert_msg(tp_backend_create("cpu", 1, &b, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(tp_rank_group_create(&(tp_rank_group_opts){.world = 1}, &rg, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(tp_weights_load(g, b, rg, &wt, &err) == TP_OK, "%s", err.msg);

    float *w = tp_weights_get(wt, 0, param_index(g, "w"));
    float *v = tp_weights_get(wt, 0, param_index(g, "v"));
    float *e = tp_weights_get(wt, 0, param_index(g, "e"));
    float *want = falloc(pgemm_packed_floats(8, 32)); /* also holds e's 8 x 16 */
    ck_assert_ptr_eq(weight_packs_find(w, TP_F32, 8, 32, 32, 1), w);
    pgemm_pack(w_data, 8, 32, 32, 1, want);
    ck_assert_mem_eq(w, want, sizeof(float) * pgemm_packed_floats(8, 32));

    const float *vp = weight_packs_find(v, TP_F32, 8, 20, 20, 1);
    ck_assert_ptr_nonnull(vp);
    ck_assert_ptr_ne(vp, v);
    ck_assert_mem_eq(v, v_data, sizeof v_data);

    const float *ep = weight_packs_find(e, TP_F32, 8, 16, 1, 8);
    ck_assert_ptr_nonnull(ep);
    ck_assert_ptr_ne(ep, e);
    ck_assert_mem_eq(e, e_data, sizeof e_data);
    pgemm_pack(e_data, 8, 16, 1, 8, want);
    ck_assert_mem_eq(ep, want, sizeof(float) * pgemm_packed_floats(8, 16));
    ck_assert_ptr_null(weight_packs_find(e, TP_F32, 16, 8, 8, 1)); /* not as a [K, N] weight */

    tp_weights_free(wt);
    tp_rank_group_free(rg);
    tp_backend_destroy(b);
    tp_graph_free(g);
    free(want);
    tu_rmdir(dir);
}
END_TEST

static Suite *packed_gemm_suite(void)
{
    Suite *s = suite_create("packed_gemm");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, kernel_matches_double_reference);
    tcase_add_test(tc, rows_and_panel_splits_same_bits);
    tcase_add_test(tc, wide_and_avx2_kernels_same_bits);
    tcase_add_test(tc, a_read_where_it_lies);
    tcase_add_test(tc, panel_groups_match_reference_and_split);
    tcase_add_test(tc, unknown_gemm_setting_refused);
    tcase_add_test(tc, writes_only_m_by_n);
    tcase_add_test(tc, registry_add_find_forget);
    tcase_add_test(tc, sole_weight_beside_released);
    tcase_add_test(tc, openblas_env_turns_packing_off);
    tcase_add_test(tc, matmul_by_registered_weight);
    tcase_add_test(tc, matmul_by_narrow_weight);
    tcase_add_test(tc, engine_outputs_with_packed_weights);
    tcase_add_test(tc, engine_packs_sole_weights_in_place);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(packed_gemm_suite)
