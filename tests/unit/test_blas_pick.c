/* test_blas_pick.c — which OpenBLAS kernels tpserve forces, from what
 * OpenBLAS detected and the CPU's features (kernels/cpu/blas_pick.h). */
#include <cblas.h>
#include <check.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check_main.h"
#include "cpu/blas_pick.h"
#include "cpu/cpu_backend.h"
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

static Suite *blas_pick_suite(void)
{
    Suite *s = suite_create("blas_pick");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, old_kernels_on_a_newer_cpu_are_replaced);
    tcase_add_test(tc, kernels_as_new_as_the_cpu_stand);
    tcase_add_test(tc, a_forced_core_type_wins);
    tcase_add_test(tc, threads_share_out_the_cores);
    tcase_add_test(tc, gemm_threads_follow_the_affinity);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(blas_pick_suite)
