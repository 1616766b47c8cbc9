/* test_util.c — the header-only helpers: tp_zalloc zeroes what malloc gave
 * (memory a free just returned, not only fresh pages) and refuses the
 * sizes calloc refuses; the clock's three units read the same clock. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "clock.h"
#include "grow.h"
#include "zalloc.h"

START_TEST(zalloc_zeroes_reused_memory)
{
    /* a freed block of the same size is what malloc hands back next (the
     * thread cache), dirty: tp_zalloc must clear it */
    for (int round = 0; round < 8; round++) {
        unsigned char *dirty = malloc(200);
        ck_assert_ptr_nonnull(dirty);
        memset(dirty, 0xa5, 200);
        free(dirty);
        unsigned char *z = tp_zalloc(5, 40);
        ck_assert_ptr_nonnull(z);
        for (int i = 0; i < 200; i++)
            ck_assert_int_eq(z[i], 0);
        free(z);
    }
}
END_TEST

START_TEST(zalloc_refuses_overflow)
{
    ck_assert_ptr_null(tp_zalloc(SIZE_MAX / 2 + 1, 2));
    ck_assert_ptr_null(tp_zalloc(2, SIZE_MAX / 2 + 1));
    void *p = tp_zalloc(1, 1);
    ck_assert_ptr_nonnull(p);
    free(p);
}
END_TEST

/* From nothing to `first`, then doubling; each element kept across moves. */
START_TEST(grow_doubles_from_first_and_keeps_elements)
{
    int *v = NULL, cap = 0, n = 0;
    int caps[] = {4, 4, 4, 4, 8, 8, 8, 8, 16};
    for (int i = 0; i < 9; i++) {
        ck_assert_int_eq(TP_GROW(v, cap, n, 4), 0);
        ck_assert_int_eq(cap, caps[i]);
        v[n++] = 100 + i;
    }
    for (int i = 0; i < n; i++)
        ck_assert_int_eq(v[i], 100 + i);
    free(v);
}
END_TEST

/* A capacity that would double past INT_MAX is refused, the array kept. */
START_TEST(grow_refuses_past_int_max)
{
    char *v = malloc(1), *before = v;
    int cap = INT_MAX / 2 + 1, n = cap;
    ck_assert_int_eq(TP_GROW(v, cap, n, 4), -1);
    ck_assert_ptr_eq(v, before);
    ck_assert_int_eq(cap, INT_MAX / 2 + 1);
    free(v);
}
END_TEST

START_TEST(clock_units_agree)
{
    int64_t a = tp_now_ns();
    double ms = tp_now_ms(), s = tp_now_s();
    int64_t whole = tp_now_ms_int(), coarse = tp_now_ms_coarse();
    int64_t b = tp_now_ns();
    ck_assert(whole >= a / 1000000 && whole <= b / 1000000);
    /* the coarse clock is the same clock at the last tick: never ahead,
     * and behind by at most a tick (10 ms at the slowest HZ; 50 allowed) */
    ck_assert_int_le(coarse, b / 1000000);
    ck_assert_int_ge(coarse, a / 1000000 - 50);
    ck_assert_int_ge(b, a); /* monotonic */
    /* each read lies between the first and the last nanosecond read (a
     * double holds these nanoseconds exactly; the division rounds by at
     * most 1 ulp, far under the 1 us slack) */
    ck_assert(ms >= (double)a / 1e6 - 1e-3 && ms <= (double)b / 1e6 + 1e-3);
    ck_assert(s >= (double)a / 1e9 - 1e-6 && s <= (double)b / 1e9 + 1e-6);
}
END_TEST

static Suite *util_suite(void)
{
    Suite *s = suite_create("util");
    TCase *t = tcase_create("core");
    tcase_add_test(t, zalloc_zeroes_reused_memory);
    tcase_add_test(t, zalloc_refuses_overflow);
    tcase_add_test(t, grow_doubles_from_first_and_keeps_elements);
    tcase_add_test(t, grow_refuses_past_int_max);
    tcase_add_test(t, clock_units_agree);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(util_suite)
