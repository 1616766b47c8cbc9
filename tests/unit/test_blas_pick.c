/* test_blas_pick.c — which OpenBLAS kernels tpserve forces, from what
 * OpenBLAS detected and the CPU's features (kernels/cpu/blas_pick.h). */
#include <check.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/blas_pick.h"

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

static Suite *blas_pick_suite(void)
{
    Suite *s = suite_create("blas_pick");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, old_kernels_on_a_newer_cpu_are_replaced);
    tcase_add_test(tc, kernels_as_new_as_the_cpu_stand);
    tcase_add_test(tc, a_forced_core_type_wins);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(blas_pick_suite)
