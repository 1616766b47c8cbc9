/* test_fiber.c — fibers take turns in order, yield and end as documented,
 * run on their own stacks, and keep to the thread that runs them. */
#include <check.h>
#include <fenv.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "fiber.h"

#define N 3
#define LOG_MAX 64

typedef struct {
    int log[LOG_MAX], n_log;
    int yields[N];      /* how many times fiber i yields before it returns */
    int ended_seen[N];  /* tp_fiber_ended() when fiber i returned */
    int running_inside;
} turns;

static void take_turns(void *p, int i)
{
    turns *t = p;
    t->running_inside &= tp_fiber_running();
    for (int k = 0; k <= t->yields[i]; k++) {
        t->log[t->n_log++] = i;
        if (k < t->yields[i])
            tp_fiber_yield();
    }
    t->ended_seen[i] = tp_fiber_ended();
}

static tp_fibers *fibers(int n)
{
    tp_fibers *f;
    tp_err err;
    ck_assert_msg(tp_fibers_create(n, 0, &f, &err) == TP_OK, "%s", err.msg);
    return f;
}

/* Round robin from fiber 0, skipping the ones that returned; the last one
 * left yields to itself. */
START_TEST(fibers_take_turns_round_robin)
{
    tp_fibers *f = fibers(N);
    turns t = {.yields = {1, 0, 3}, .running_inside = 1};
    tp_fibers_run(f, take_turns, &t);
    int want[] = {0, 1, 2, 0, 2, 2, 2};
    ck_assert_int_eq(t.n_log, 7);
    ck_assert_mem_eq(t.log, want, sizeof want);
    /* fiber 1 ended first (0 had ended before it), then 0, then 2 */
    ck_assert_int_eq(t.ended_seen[1], 0);
    ck_assert_int_eq(t.ended_seen[0], 1);
    ck_assert_int_eq(t.ended_seen[2], 2);
    ck_assert(t.running_inside);
    ck_assert(!tp_fiber_running());
    ck_assert_int_eq(tp_fiber_ended(), 0);
    tp_fiber_yield(); /* outside a run: nothing to do */
    tp_fibers_free(f);
}
END_TEST

/* The same set runs again and again (each run starts every fiber afresh). */
START_TEST(a_set_runs_many_times)
{
    tp_fibers *f = fibers(2);
    for (int r = 0; r < 1000; r++) {
        turns t = {.yields = {2, 2}, .running_inside = 1};
        tp_fibers_run(f, take_turns, &t);
        int want[] = {0, 1, 0, 1, 0, 1};
        ck_assert_int_eq(t.n_log, 6);
        ck_assert_mem_eq(t.log, want, sizeof want);
    }
    tp_fibers_free(f);
}
END_TEST

/* Each fiber has a stack of its own, deep enough for what a rank's
 * kernels put there (a thread's 8 MiB): 4 MiB of locals in each, alive
 * across yields. */
static void deep(void *p, int i)
{
    volatile char *last = p;
    char big[4 << 20];
    memset(big, 'a' + i, sizeof big);
    tp_fiber_yield();
    for (size_t k = 0; k < sizeof big; k += 4096)
        ck_assert_int_eq(big[k], 'a' + i);
    last[i] = big[sizeof big - 1];
}

START_TEST(every_fiber_has_its_own_deep_stack)
{
    tp_fibers *f = fibers(2);
    char last[2] = {0};
    tp_fibers_run(f, deep, last);
    ck_assert(last[0] == 'a' && last[1] == 'b');
    tp_fibers_free(f);
}
END_TEST

/* Two threads, each running its own set at the same time: a yield stays
 * within the caller's thread. */
static void *thread_runs(void *p)
{
    turns *t = p;
    tp_fibers *f = fibers(N);
    for (int r = 0; r < 200; r++) {
        t->n_log = 0;
        tp_fibers_run(f, take_turns, t);
    }
    tp_fibers_free(f);
    return NULL;
}

START_TEST(threads_run_their_own_fibers)
{
    turns a = {.yields = {2, 2, 2}, .running_inside = 1}, b = {.yields = {0, 4, 1}, .running_inside = 1};
    pthread_t ta, tb;
    ck_assert_int_eq(pthread_create(&ta, NULL, thread_runs, &a), 0);
    ck_assert_int_eq(pthread_create(&tb, NULL, thread_runs, &b), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    int want_a[] = {0, 1, 2, 0, 1, 2, 0, 1, 2}, want_b[] = {0, 1, 2, 1, 2, 1, 1, 1};
    ck_assert_int_eq(a.n_log, 9);
    ck_assert_mem_eq(a.log, want_a, sizeof want_a);
    ck_assert_int_eq(b.n_log, 8);
    ck_assert_mem_eq(b.log, want_b, sizeof want_b);
}
END_TEST

/* What a switch must keep per fiber: the rounding mode (MXCSR and the x87
 * control word are callee-saved in the x86-64 ABI, so each fiber has its
 * own), locals in callee-saved registers across a yield, and a stack
 * aligned for SSE spills (snprintf of a double faults on a misaligned one). */
typedef struct {
    int round_seen[2];
    char text[2][32];
    long sum[2];
} fpenv;

static void keep_state(void *p, int i)
{
    fpenv *e = p;
    fesetround(i ? FE_TONEAREST : FE_UPWARD);
    volatile double third = 1.0;
    long acc = 0;
    for (int k = 0; k < 5; k++) {
        acc += k * (i + 1);
        tp_fiber_yield();
    }
    e->round_seen[i] = fegetround();
    snprintf(e->text[i], sizeof e->text[i], "%a", third / 3.0);
    e->sum[i] = acc;
    fesetround(FE_TONEAREST);
}

START_TEST(each_fiber_keeps_its_registers_and_rounding)
{
    tp_fibers *f = fibers(2);
    fpenv e;
    memset(&e, 0, sizeof e);
    tp_fibers_run(f, keep_state, &e);
    ck_assert_int_eq(e.round_seen[0], FE_UPWARD);
    ck_assert_int_eq(e.round_seen[1], FE_TONEAREST);
    ck_assert_int_eq(fegetround(), FE_TONEAREST);
    ck_assert_str_eq(e.text[1], "0x1.5555555555555p-2"); /* 1/3 rounded to nearest */
    ck_assert_str_eq(e.text[0], "0x1.5555555555556p-2"); /* rounded up */
    ck_assert_int_eq(e.sum[0], 10);
    ck_assert_int_eq(e.sum[1], 20);
    tp_fibers_free(f);
}
END_TEST

START_TEST(bad_counts_are_errors)
{
    tp_fibers *f = NULL;
    tp_err err;
    ck_assert_int_eq(tp_fibers_create(0, 0, &f, &err), TP_INVALID);
    ck_assert_str_eq(err.msg, "fibers: 0 fibers");
    ck_assert_ptr_null(f);
}
END_TEST

static Suite *fiber_suite(void)
{
    Suite *s = suite_create("fiber");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, fibers_take_turns_round_robin);
    tcase_add_test(tc, a_set_runs_many_times);
    tcase_add_test(tc, every_fiber_has_its_own_deep_stack);
    tcase_add_test(tc, threads_run_their_own_fibers);
    tcase_add_test(tc, each_fiber_keeps_its_registers_and_rounding);
    tcase_add_test(tc, bad_counts_are_errors);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(fiber_suite)
