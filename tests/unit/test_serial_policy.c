/* test_serial_policy.c — the choice between serial steps and rank threads,
 * driven with made-up step times (the policy has no clock of its own). */
#include <check.h>

#include "check_main.h"
#include "serial_policy.h"

#define US 1000

/* Runs n steps whose times are serial_ns / threads_ns; returns how many
 * ran serially. peek() must foretell every step's mode (the pre-wake
 * relies on it). */
static int run_steps(tp_serial_policy *p, int n, int64_t serial_ns, int64_t threads_ns)
{
    int serial = 0;
    for (int i = 0; i < n; i++) {
        int foretold = tp_serial_policy_peek(p), s = tp_serial_policy_next(p);
        ck_assert_int_eq(s, foretold);
        serial += s;
        tp_serial_policy_took(p, s, s ? serial_ns : threads_ns);
    }
    return serial;
}

/* Serial faster: nearly every step serial, the rank threads probed ever
 * more rarely (16, then 32, 64 ... 1024 steps apart, two steps a probe). */
START_TEST(serial_faster_stays_serial)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 2000 * US, 2);
    int serial = run_steps(&p, 4000, 10 * US, 40 * US);
    ck_assert_int_ge(serial, 4000 - 8 * TP_SERIAL_PROBE_STEPS);
    ck_assert_int_lt(serial, 4000);    /* the threads were probed */
    ck_assert_int_eq(p.probe_every, TP_SERIAL_PROBE_LAST);
    ck_assert_int_eq(p.serial, 1);
}
END_TEST

/* Threads faster: the first probe of the threads takes over; serial
 * probes then back off the same way. */
START_TEST(threads_faster_take_over)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 2000 * US, 2);
    int serial = run_steps(&p, TP_SERIAL_PROBE_FIRST + TP_SERIAL_PROBE_STEPS - 1, 600 * US, 300 * US);
    ck_assert_int_eq(serial, TP_SERIAL_PROBE_FIRST - 1); /* then the probe's two steps */
    ck_assert_int_eq(p.serial, 0);
    serial = run_steps(&p, 4000, 600 * US, 300 * US);
    ck_assert_int_le(serial, 8 * TP_SERIAL_PROBE_STEPS);
    ck_assert_int_gt(serial, 0); /* serial was probed */
}
END_TEST

/* A cold first step (10x its usual time) does not keep steps off the mode
 * that is faster once warm: within a few probes they are back. */
START_TEST(a_cold_first_step_is_outgrown)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 2000 * US, 2);
    int s = tp_serial_policy_next(&p);
    ck_assert_int_eq(s, 1);
    tp_serial_policy_took(&p, s, 500 * US); /* cold */
    run_steps(&p, 200, 20 * US, 60 * US);
    ck_assert_int_eq(p.serial, 1);
    ck_assert_int_ge(run_steps(&p, 100, 20 * US, 60 * US), 95);
}
END_TEST

/* A probe's first step is not measured: a cold one (rank threads woken
 * from a long sleep) does not decide. */
START_TEST(a_probe_measures_its_second_step)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 2000 * US, 2);
    run_steps(&p, TP_SERIAL_PROBE_FIRST - 1, 300 * US, 0);
    ck_assert_int_eq(tp_serial_policy_next(&p), 0); /* the probe */
    tp_serial_policy_took(&p, 0, 900 * US);        /* cold */
    ck_assert_int_eq(tp_serial_policy_next(&p), 0);
    tp_serial_policy_took(&p, 0, 200 * US);        /* warm: faster than serial */
    ck_assert_int_eq(p.avg_ns[0], 200 * US);
    ck_assert_int_eq(p.serial, 0);
}
END_TEST

/* Two modes within an eighth of each other do not trade places. */
START_TEST(close_times_do_not_flip)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 2000 * US, 2);
    run_steps(&p, 100, 105 * US, 100 * US); /* serial 5% slower: stays */
    ck_assert_int_eq(p.serial, 1);
    run_steps(&p, 100, 120 * US, 100 * US); /* 20% slower: threads */
    ck_assert_int_eq(p.serial, 0);
}
END_TEST

/* Over the limit: a serial step over max_ns sends the steps to the
 * threads, and while the threads' time times the ranks stays over it no
 * serial probe runs; once steps are short again a probe lets serial back. */
START_TEST(long_steps_never_probe_serial)
{
    tp_serial_policy p;
    tp_serial_policy_init(&p, 1000 * US, 2);
    int s = tp_serial_policy_next(&p);
    tp_serial_policy_took(&p, s, 3000 * US);
    ck_assert_int_eq(p.serial, 0);
    ck_assert_int_eq(run_steps(&p, 5000, 3000 * US, 1500 * US), 0);
    /* short steps: threads 100 us (x2 ranks under the limit), serial 40 us */
    int serial = run_steps(&p, 2 * TP_SERIAL_PROBE_LAST, 40 * US, 100 * US);
    ck_assert_int_gt(serial, TP_SERIAL_PROBE_LAST);
    ck_assert_int_eq(p.serial, 1);
}
END_TEST

/* Size classes: 1 row, 2, 3-4, 5-8, ... and everything past 64 in the last. */
START_TEST(rows_map_to_size_classes)
{
    static const struct { int64_t rows; int cls; } want[] = {
        {0, 0}, {1, 0}, {2, 1}, {3, 2}, {4, 2}, {5, 3}, {8, 3}, {9, 4}, {16, 4},
        {17, 5}, {32, 5}, {33, 6}, {64, 6}, {65, 7}, {1 << 20, 7},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(tp_serial_class(want[i].rows) == want[i].cls, "rows %lld: class %d, want %d",
                      (long long)want[i].rows, tp_serial_class(want[i].rows), want[i].cls);
}
END_TEST

/* A mixed load: 1-row steps faster serially (10 us against 40 on the
 * threads), 8-row steps faster on the threads (300 against 600), in
 * turn. Each size settles on its own mode; the threads' 1-row probes
 * (40 us) no longer beat the serial average of 8-row steps (600 us), which
 * sent every size to the threads with one policy for all. */
START_TEST(step_sizes_settle_apart)
{
    tp_serial_policies ps;
    tp_serial_policies_init(&ps, 2000 * US, 2);
    int serial1 = 0, serial8 = 0;
    for (int i = 0; i < 4000; i++) {
        serial1 += run_steps(tp_serial_policies_for(&ps, 1), 1, 10 * US, 40 * US);
        serial8 += run_steps(tp_serial_policies_for(&ps, 8), 1, 600 * US, 300 * US);
    }
    ck_assert_int_ge(serial1, 4000 - 8 * TP_SERIAL_PROBE_STEPS);
    ck_assert_int_le(serial8, TP_SERIAL_PROBE_FIRST + 8 * TP_SERIAL_PROBE_STEPS);
    ck_assert_int_eq(tp_serial_policies_for(&ps, 1)->serial, 1);
    ck_assert_int_eq(tp_serial_policies_for(&ps, 5)->serial, 0);
}
END_TEST

static Suite *serial_policy_suite(void)
{
    Suite *s = suite_create("serial_policy");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, serial_faster_stays_serial);
    tcase_add_test(tc, threads_faster_take_over);
    tcase_add_test(tc, a_cold_first_step_is_outgrown);
    tcase_add_test(tc, a_probe_measures_its_second_step);
    tcase_add_test(tc, close_times_do_not_flip);
    tcase_add_test(tc, long_steps_never_probe_serial);
    tcase_add_test(tc, rows_map_to_size_classes);
    tcase_add_test(tc, step_sizes_settle_apart);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(serial_policy_suite)
