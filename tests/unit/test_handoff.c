/* test_handoff.c — server/handoff.h: in every order, and racing on two
 * threads, exactly one side follows up: one resume for a suspended
 * connection (none when the result came first), one free for a request
 * whose connection went before its result. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

#include "check_main.h"
#include "handoff.h"

enum { ANSWERED_AT_ONCE, RESUMES_ITSELF, WAITS_FOR_RESUME };

/* The HTTP thread's side of a suspend (server/http_request.c). */
static int suspend_side(_Atomic int *w)
{
    if (!tp_handoff_begin_suspend(w))
        return ANSWERED_AT_ONCE;
    return tp_handoff_end_suspend(w) ? WAITS_FOR_RESUME : RESUMES_ITSELF;
}

START_TEST(each_order)
{
    _Atomic int w = TP_HANDOFF_NONE;
    /* delivered before the suspend: answered at once, nobody resumes */
    ck_assert_int_eq(tp_handoff_deliver(&w), TP_DELIVERED_DONE);
    ck_assert(tp_handoff_delivered(&w));
    ck_assert_int_eq(suspend_side(&w), ANSWERED_AT_ONCE);

    /* delivered after the suspend: the deliverer resumes */
    atomic_store(&w, TP_HANDOFF_NONE);
    ck_assert_int_eq(suspend_side(&w), WAITS_FOR_RESUME);
    ck_assert(!tp_handoff_delivered(&w));
    ck_assert_int_eq(tp_handoff_deliver(&w), TP_DELIVERED_RESUME);

    /* delivered during the suspend call: the HTTP thread resumes */
    atomic_store(&w, TP_HANDOFF_NONE);
    ck_assert(tp_handoff_begin_suspend(&w));
    ck_assert_int_eq(tp_handoff_deliver(&w), TP_DELIVERED_DONE);
    ck_assert(!tp_handoff_end_suspend(&w));

    /* the connection went first: the deliverer frees */
    atomic_store(&w, TP_HANDOFF_NONE);
    ck_assert(!tp_handoff_orphan(&w));
    ck_assert_int_eq(tp_handoff_deliver(&w), TP_DELIVERED_FREE);

    /* the result came first: the closing connection frees */
    atomic_store(&w, TP_HANDOFF_NONE);
    ck_assert_int_eq(tp_handoff_deliver(&w), TP_DELIVERED_DONE);
    ck_assert(tp_handoff_orphan(&w));
}
END_TEST

/* The two sides race ROUNDS times. Each round the delivering thread says
 * it is ready and spins for the round to start; the main thread waits for
 * that, resets the word, starts the round, and acts after a delay that
 * varies from round to round (0 to 127 pauses), so that every interleaving
 * comes up. Waits for the other side's readiness yield: on a machine with
 * fewer free cores than spinning threads a bare spin would take a time
 * slice. */
enum { ROUNDS = 20000 };

typedef struct {
    _Atomic int w;
    _Atomic int ready; /* rounds the delivering side is ready for */
    _Atomic int round; /* started */
    _Atomic int done;  /* rounds the delivering side finished */
    int orphan;        /* 0: suspend vs delivery, 1: close vs delivery */
    int out[2][ROUNDS];
} race;

static void *delivering_side(void *arg)
{
    race *r = arg;
    for (int k = 1; k <= ROUNDS; k++) {
        atomic_store(&r->ready, k);
        while (atomic_load(&r->round) < k)
            ;
        r->out[1][k - 1] = (int)tp_handoff_deliver(&r->w);
        atomic_store(&r->done, k);
    }
    return NULL;
}

static void run_race(race *r)
{
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, delivering_side, r), 0);
    for (int k = 1; k <= ROUNDS; k++) {
        while (atomic_load(&r->ready) < k)
            sched_yield();
        atomic_store(&r->w, TP_HANDOFF_NONE);
        atomic_store(&r->round, k);
        for (int i = 0; i < (k * 37) % 128; i++)
            __builtin_ia32_pause();
        r->out[0][k - 1] = r->orphan ? tp_handoff_orphan(&r->w) : suspend_side(&r->w);
        while (atomic_load(&r->done) < k)
            sched_yield();
    }
    pthread_join(t, NULL);
}

START_TEST(suspend_races_delivery)
{
    static race r = {.orphan = 0};
    run_race(&r);
    for (int k = 0; k < ROUNDS; k++) {
        int http = r.out[0][k], dlv = r.out[1][k];
        ck_assert_int_ne(dlv, TP_DELIVERED_FREE);
        /* a suspended connection is resumed exactly once, by one side */
        int resumes = (http == RESUMES_ITSELF) + (dlv == TP_DELIVERED_RESUME);
        ck_assert_int_eq(resumes, http == ANSWERED_AT_ONCE ? 0 : 1);
    }
}
END_TEST

START_TEST(close_races_delivery)
{
    static race r = {.orphan = 1};
    run_race(&r);
    for (int k = 0; k < ROUNDS; k++) {
        int frees = r.out[0][k] + (r.out[1][k] == TP_DELIVERED_FREE);
        ck_assert_int_eq(frees, 1);
        ck_assert_int_ne(r.out[1][k], TP_DELIVERED_RESUME);
    }
}
END_TEST

static Suite *handoff_suite(void)
{
    Suite *s = suite_create("handoff");
    TCase *tc = tcase_create("handoff");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, each_order);
    tcase_add_test(tc, suspend_races_delivery);
    tcase_add_test(tc, close_races_delivery);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(handoff_suite)
