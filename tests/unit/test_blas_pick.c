/* test_blas_pick.c — which OpenBLAS kernels tpserve forces, from what
 * OpenBLAS detected and the CPU's features, and how many threads each
 * product runs on (kernels/cpu/blas_pick.h). */
#include <cblas.h>
#include <check.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check_main.h"
#include "cpu/blas_pick.h"
#include "cpu/cpu_backend.h"
#include "cpu/ops_internal.h"
#include "spin_wait.h"

#define AVX512_ALL (TP_CPU_AVX | TP_CPU_AVX2_FMA | TP_CPU_AVX512)

static void expect(const char *detected, unsigned features, const char *want)
{
    const char *got = tp_blas_core_upgrade(detected, features);
    ck_assert_msg(want ? got && strcmp(got, want) == 0 : got == NULL, "detected %s, features %#x: %s, want %s",
                  detected ? detected : "(null)", features, got ? got : "none", want ? want : "none");
}

/* An OpenBLAS whose table predates the CPU falls back to its oldest
 * kernels (0.3.21 on an Emerald Rapids: Prescott); the newest set the
 * features run replaces them. */
START_TEST(old_kernels_on_a_newer_cpu_are_replaced)
{
    expect("Prescott", AVX512_ALL | TP_CPU_AVX512_BF16, "Cooperlake");
    expect("Prescott", AVX512_ALL, "SkylakeX");
    expect("Nehalem", TP_CPU_AVX | TP_CPU_AVX2_FMA, "Haswell");
    expect("Core2", TP_CPU_AVX, "Sandybridge");
    expect("Sandybridge", TP_CPU_AVX | TP_CPU_AVX2_FMA, "Haswell");
    expect("Zen", AVX512_ALL | TP_CPU_AVX512_BF16, "Cooperlake"); /* Zen 4: AVX-512 with BF16 */
    expect("haswell", AVX512_ALL, "SkylakeX");                    /* names compare without case */
}
END_TEST

/* What OpenBLAS picked stands when it is as new as the features allow, or
 * newer than this table knows, or the CPU has nothing newer (BF16 alone,
 * without the AVX-512 set, picks nothing). */
START_TEST(kernels_as_new_as_the_cpu_stand)
{
    expect("Cooperlake", AVX512_ALL | TP_CPU_AVX512_BF16, NULL);
    expect("SapphireRapids", AVX512_ALL | TP_CPU_AVX512_BF16, NULL);
    expect("SkylakeX", AVX512_ALL, NULL);
    expect("Haswell", TP_CPU_AVX | TP_CPU_AVX2_FMA, NULL);
    expect("Zen", TP_CPU_AVX | TP_CPU_AVX2_FMA, NULL);
    expect("Prescott", 0, NULL);
    expect("Prescott", TP_CPU_AVX512_BF16, NULL);
    expect("GraniteRapids", AVX512_ALL | TP_CPU_AVX512_BF16, NULL); /* unknown here: a newer OpenBLAS */
    expect(NULL, AVX512_ALL, NULL);
}
END_TEST

/* A user's OPENBLAS_CORETYPE, even empty, is never replaced. */
START_TEST(a_forced_core_type_wins)
{
    const char *was = getenv("OPENBLAS_CORETYPE");
    char *saved = was ? strdup(was) : NULL;
    setenv("OPENBLAS_CORETYPE", "", 1);
    ck_assert_int_eq(tp_blas_pick_for_exec(), 0);
    ck_assert_str_eq(getenv("OPENBLAS_CORETYPE"), "");
    ck_assert_ptr_null(getenv(TP_BLAS_DETECTED_ENV));
    if (saved)
        setenv("OPENBLAS_CORETYPE", saved, 1);
    else
        unsetenv("OPENBLAS_CORETYPE");
    free(saved);
}
END_TEST

/* The ranks come first; the cores they leave go to each rank's GEMMs. */
START_TEST(threads_share_out_the_cores)
{
    ck_assert_int_eq(tp_blas_threads_per_rank(1, 1), 1);
    ck_assert_int_eq(tp_blas_threads_per_rank(1, 2), 2);
    ck_assert_int_eq(tp_blas_threads_per_rank(2, 2), 1);
    ck_assert_int_eq(tp_blas_threads_per_rank(4, 2), 1); /* more ranks than cores: never 0 */
    ck_assert_int_eq(tp_blas_threads_per_rank(2, 16), 8);
    ck_assert_int_eq(tp_blas_threads_per_rank(3, 8), 2);
    ck_assert_int_eq(tp_blas_threads_per_rank(0, 8), 1);
}
END_TEST

/* A cpu backend of `world` ranks created on exactly `cpus` of this
 * process's CPUs (as under taskset): OpenBLAS runs want threads, and the
 * startup note says so. */
static void expect_threads(const cpu_set_t *allowed, int cpus, int world, int want)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    for (int c = 0, n = 0; c < CPU_SETSIZE && n < cpus; c++)
        if (CPU_ISSET(c, allowed)) {
            CPU_SET(c, &set);
            n++;
        }
    ck_assert_int_eq(sched_setaffinity(0, sizeof set, &set), 0);
    tp_backend *b = NULL;
    tp_err err;
    ck_assert_msg(tp_cpu_backend_create(world, NULL, &b, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(openblas_get_num_threads() == want, "%d CPUs, world %d: OpenBLAS on %d threads, want %d", cpus,
                  world, openblas_get_num_threads(), want);
    char says[96];
    snprintf(says, sizeof says, "GEMMs on %d thread%s per rank (%d usable core%s, %d rank%s)", want,
             want == 1 ? "" : "s", cpus, cpus == 1 ? "" : "s", world, world == 1 ? "" : "s");
    ck_assert_msg(strstr(b->note, says), "note '%s' lacks '%s'", b->note, says);
    b->iface->destroy(b);
    ck_assert_int_eq(sched_setaffinity(0, sizeof *allowed, allowed), 0);
}

START_TEST(gemm_threads_follow_the_affinity)
{
    cpu_set_t allowed;
    ck_assert_int_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    expect_threads(&allowed, 1, 1, 1);
    expect_threads(&allowed, 1, 2, 1);
    /* two CPUs, unless a cgroup quota of one core holds this process
     * (tp_spin_cores counts the quota too) */
    if (CPU_COUNT(&allowed) < 2 || tp_spin_cores() < 2) {
        printf("gemm_threads_follow_the_affinity: two CPUs skipped (%d allowed, %d usable)\n", CPU_COUNT(&allowed),
               tp_spin_cores());
        return;
    }
    expect_threads(&allowed, 2, 1, 2);
    expect_threads(&allowed, 2, 2, 1);
}
END_TEST

/* Products under TP_BLAS_THREADED_MIN_MACS or _ROWS run on one thread:
 * attention's per-head ones, a few rows of a large weight. */
START_TEST(small_products_run_on_one_thread)
{
    ck_assert_int_eq(tp_blas_product_threads(128, 128, 64, 2), 1); /* a head's q.k */
    ck_assert_int_eq(tp_blas_product_threads(128, 64, 128, 2), 1); /* its p.v */
    ck_assert_int_eq(tp_blas_product_threads(512, 128, 64, 8), 1); /* 2^22 */
    ck_assert_int_eq(tp_blas_product_threads(8, 3072, 768, 2), 1); /* 8 rows */
    ck_assert_int_eq(tp_blas_product_threads(15, 3072, 3072, 2), 1);
    ck_assert_int_eq(tp_blas_product_threads(16, 768, 768, 2), 2);
    ck_assert_int_eq(tp_blas_product_threads(128, 768, 768, 4), 4);
    ck_assert_int_eq(tp_blas_product_threads(1024, 128, 64, 2), 2); /* 2^23 */
    ck_assert_int_eq(tp_blas_product_threads(INT_MAX, INT_MAX, INT_MAX, 2), 2); /* M * N * K past int64 */
    ck_assert_int_eq(tp_blas_product_threads(128, 768, 768, 1), 1);
    ck_assert_int_eq(tp_blas_product_threads(128, 768, 768, 0), 1);
}
END_TEST

/* cblas_sgemm as ops_sgemm reaches it: this definition in the test binary
 * comes before OpenBLAS's (libtpserve is linked in statically), calls the
 * real one and counts the calls whose thread count was not the one their
 * size wants, at the start (what OpenBLAS reads) or at the end (no other
 * call may change it in between). */
static atomic_int calls, wrong_count;
static _Atomic int64_t want_threads_at; /* calls of at least these MACs expect the set count */
static int set_count;

void cblas_sgemm(OPENBLAS_CONST enum CBLAS_ORDER order, OPENBLAS_CONST enum CBLAS_TRANSPOSE ta,
                 OPENBLAS_CONST enum CBLAS_TRANSPOSE tb, OPENBLAS_CONST blasint M, OPENBLAS_CONST blasint N,
                 OPENBLAS_CONST blasint K, OPENBLAS_CONST float alpha, OPENBLAS_CONST float *A,
                 OPENBLAS_CONST blasint lda, OPENBLAS_CONST float *B, OPENBLAS_CONST blasint ldb,
                 OPENBLAS_CONST float beta, float *C, OPENBLAS_CONST blasint ldc)
{
    static void (*real)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, blasint, blasint, blasint,
                        float, const float *, blasint, const float *, blasint, float, float *, blasint);
    if (!real)
        *(void **)&real = dlsym(RTLD_NEXT, "cblas_sgemm");
    int64_t macs = (int64_t)M * N * K;
    int want = macs >= atomic_load(&want_threads_at) ? set_count : 1;
    int before = openblas_get_num_threads();
    real(order, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    /* read at the call's start; held to its end, where a race shows */
    if (before != want || openblas_get_num_threads() != want)
        atomic_fetch_add(&wrong_count, 1);
    atomic_fetch_add(&calls, 1);
}

typedef struct {
    int64_t M, N, K;
    float *a, *b, *c;
    int reps;
} product;

static product product_make(int64_t M, int64_t N, int64_t K, int reps)
{
    product p = {M, N, K, malloc(sizeof(float) * M * K), malloc(sizeof(float) * K * N), malloc(sizeof(float) * M * N),
                 reps};
    ck_assert(p.a && p.b && p.c);
    for (int64_t i = 0; i < M * K; i++)
        p.a[i] = (float)((i * 7919) % 61) / 61.0f - 0.5f;
    for (int64_t i = 0; i < K * N; i++)
        p.b[i] = (float)((i * 104729) % 53) / 53.0f - 0.5f;
    return p;
}

static void product_free(product *p)
{
    free(p->a);
    free(p->b);
    free(p->c);
}

/* Transposed b: OpenBLAS's, never small_gemm's. */
static void product_run(product *p)
{
    ops_buf sa = {0}, sb = {0};
    tp_err err;
    ck_assert_int_eq(ops_sgemm(p->M, p->N, p->K, 1.0f, p->a, p->K, 1, p->b, 1, p->K, p->c, p->N, &sa, &sb, &err),
                     TP_OK);
    ops_buf_free(&sa);
    ops_buf_free(&sb);
}

static void *run_products(void *arg)
{
    product *p = arg;
    for (int i = 0; i < p->reps; i++)
        product_run(p);
    return NULL;
}

/* Through ops_sgemm, with the count set to 2: a head-sized product runs
 * on one thread and a weight-sized one on two (whatever the cores), in
 * either order (OpenBLAS's count changes when a call needs another). */
START_TEST(ops_sgemm_runs_small_products_on_one_thread)
{
    set_count = 2;
    atomic_store(&want_threads_at, TP_BLAS_THREADED_MIN_MACS);
    tp_blas_set_threads(set_count);
    ck_assert_int_eq(tp_blas_threads(), 2);
    product small = product_make(128, 128, 64, 1), large = product_make(64, 768, 512, 1);
    atomic_store(&calls, 0);
    atomic_store(&wrong_count, 0);
    product_run(&small);
    product_run(&large);
    product_run(&small);
    ck_assert_int_eq(atomic_load(&calls), 3);
    ck_assert_int_eq(tp_blas_threads(), 2);
    ck_assert_msg(atomic_load(&wrong_count) == 0, "%d of 3 products ran on the wrong thread count",
                  atomic_load(&wrong_count));
    product_free(&small);
    product_free(&large);
    tp_blas_set_threads(1);
}
END_TEST

/* Two ranks' threads at once, one with head-sized products, one with
 * weight-sized ones: neither ever runs on the other's count (OpenBLAS's
 * count is one per process and its bits depend on it), and each weight
 * product's bits equal the same product run alone. */
START_TEST(concurrent_products_keep_their_counts)
{
    set_count = 2;
    atomic_store(&want_threads_at, TP_BLAS_THREADED_MIN_MACS);
    tp_blas_set_threads(set_count);
    product small = product_make(128, 128, 64, 200), large = product_make(64, 768, 512, 20);
    product_run(&large);
    size_t bytes = sizeof(float) * (size_t)(large.M * large.N);
    float *alone = malloc(bytes);
    ck_assert_ptr_nonnull(alone);
    memcpy(alone, large.c, bytes);
    atomic_store(&calls, 0);
    atomic_store(&wrong_count, 0);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, run_products, &small), 0);
    for (int i = 0; i < large.reps; i++) {
        product_run(&large);
        ck_assert_msg(memcmp(large.c, alone, bytes) == 0, "a weight product's bits changed beside head products");
    }
    pthread_join(t, NULL);
    ck_assert_int_eq(atomic_load(&calls), small.reps + large.reps);
    ck_assert_msg(atomic_load(&wrong_count) == 0, "%d of %d products ran on the other's thread count",
                  atomic_load(&wrong_count), atomic_load(&calls));
    free(alone);
    product_free(&small);
    product_free(&large);
    tp_blas_set_threads(1);
}
END_TEST

static Suite *blas_pick_suite(void)
{
    Suite *s = suite_create("blas_pick");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, old_kernels_on_a_newer_cpu_are_replaced);
    tcase_add_test(tc, kernels_as_new_as_the_cpu_stand);
    tcase_add_test(tc, a_forced_core_type_wins);
    tcase_add_test(tc, threads_share_out_the_cores);
    tcase_add_test(tc, gemm_threads_follow_the_affinity);
    tcase_add_test(tc, small_products_run_on_one_thread);
    tcase_add_test(tc, ops_sgemm_runs_small_products_on_one_thread);
    tcase_add_test(tc, concurrent_products_keep_their_counts);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(blas_pick_suite)
