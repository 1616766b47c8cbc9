/* test_spin_wait.c — bounded spinning: the budget is time, not a count;
 * no spin when the parties outnumber the cores; a wait site stops spinning
 * where spins run out and comes back once they pay again; a site whose
 * peer comes just after its spins run out stretches them instead. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "check_main.h"
#include "clock.h"
#include "spin_wait.h"

typedef struct {
    int calls;    /* done() calls so far */
    int done_at;  /* the call that answers 1 (0: never) */
} poller;

static int poll_done(const void *p)
{
    poller *x = (poller *)p;
    x->calls++;
    return x->done_at && x->calls >= x->done_at;
}

START_TEST(budget_only_when_every_party_has_a_core)
{
    ck_assert_int_eq(tp_spin_budget(2, 2), TP_SPIN_NS);
    ck_assert_int_eq(tp_spin_budget(2, 64), TP_SPIN_NS);
    ck_assert_int_eq(tp_spin_budget(3, 2), 0);
    ck_assert_int_eq(tp_spin_budget(2, 1), 0);
    int cores = tp_spin_cores();
    ck_assert_int_ge(cores, 1);
    ck_assert_int_le(cores, (int)sysconf(_SC_NPROCESSORS_CONF));
}
END_TEST

START_TEST(a_spin_is_bounded_by_time)
{
    poller never = {0, 0};
    int64_t budget = 20 * 1000 * 1000, t0 = tp_now_ns();
    ck_assert_int_eq(tp_spin_until(poll_done, &never, budget), 0);
    int64_t spent = tp_now_ns() - t0;
    ck_assert_int_ge(spent, budget);
    ck_assert_int_lt(spent, 20 * budget); /* a loaded machine may preempt us, not forever */
    ck_assert_int_gt(never.calls, 1);
    /* done at the first look: one call, however large the budget */
    poller now = {0, 1};
    ck_assert_int_eq(tp_spin_until(poll_done, &now, budget), 1);
    ck_assert_int_eq(now.calls, 1);
    /* no budget: one look */
    poller late = {0, 5};
    ck_assert_int_eq(tp_spin_until(poll_done, &late, 0), 0);
    ck_assert_int_eq(late.calls, 1);
    ck_assert_int_eq(tp_spin_until(poll_done, &late, budget), 1);
    ck_assert_int_eq(late.calls, 5);
}
END_TEST

/* One wait at the site: 1 when done() was answered 1; *spun says whether
 * done() was polled more than once (a spin, not a sleep at once). */
static int wait_at(tp_spin_site *s, int done_at, int *spun)
{
    poller x = {0, done_at};
    int ok = tp_spin_site_until(s, poll_done, &x, 100 * 1000);
    *spun = x.calls > 1;
    return ok;
}

START_TEST(a_site_stops_spinning_where_spins_run_out)
{
    tp_spin_site s = {0};
    int spun, spins = 0;
    /* spins that pay: the site keeps spinning */
    for (int i = 0; i < 50; i++) {
        ck_assert_int_eq(wait_at(&s, 3, &spun), 1);
        ck_assert(spun);
    }
    /* a miss now and then: still spinning */
    ck_assert_int_eq(wait_at(&s, 0, &spun), 0);
    ck_assert(spun);
    ck_assert_int_eq(wait_at(&s, 3, &spun), 1);
    ck_assert(spun);
    /* a peer that never comes in time: after a few misses most waits sleep
     * at once, and the skips between probes grow */
    for (int i = 0; i < 200; i++) {
        wait_at(&s, 0, &spun);
        spins += spun;
    }
    ck_assert_int_lt(spins, 20);
    ck_assert_int_gt(spins, 3); /* probes */
    /* once the peer is quick again, probes pay and the site is back to
     * spinning at every wait within some 70 waits */
    for (int i = 0; i < 80; i++)
        wait_at(&s, 3, &spun);
    for (int i = 0; i < 10; i++) {
        ck_assert_int_eq(wait_at(&s, 3, &spun), 1);
        ck_assert(spun);
    }
    /* no budget: never a spin, whatever the history */
    poller x = {0, 3};
    ck_assert_int_eq(tp_spin_site_until(&s, poll_done, &x, 0), 0);
    ck_assert_int_eq(x.calls, 1);
}
END_TEST

/* The test's clock (tp_spin_set_clock): each read by the spin moves it on
 * 1 us, the caller's sleep moves it to the peer's arrival. Exact where the
 * machine's clock is not: preempted for a quarter budget at the wrong
 * moment, a real spin "meets" a peer it ran out before. */
static int64_t fake_ns;
static int64_t fake_now(void) { return fake_ns += 1000; }

/* A peer that arrives at a set time of the test's clock. */
static int arrived(const void *p) { return fake_ns >= *(const int64_t *)p; }

/* One wait at the site for a peer arriving `after` ns from now: spins
 * under the site, then "sleeps" until the peer is there (the caller's
 * futex sleep) and tells the site it is over. 1 when the spin met the
 * peer. */
static int wait_for_peer(tp_spin_site *s, int64_t budget, int64_t after)
{
    int64_t at = fake_ns + after;
    int met = tp_spin_site_until(s, arrived, &at, budget);
    if (!arrived(&at))
        fake_ns = at;
    tp_spin_site_ended(s);
    return met;
}

START_TEST(a_spin_that_ends_just_before_its_peer_stretches)
{
    const int64_t B = 20 * 1000 * 1000;
    tp_spin_site s = {0};
    fake_ns = 1000 * 1000 * 1000;
    tp_spin_set_clock(fake_now);
    /* the peer comes a quarter budget after the spin gave up (a halted
     * vCPU waking up): not a miss; the next spin is twice as long */
    ck_assert_int_eq(wait_for_peer(&s, B, B + B / 4), 0);
    ck_assert_int_eq(s.stretch, 1);
    ck_assert_int_eq(s.misses, 0);
    ck_assert_int_eq(s.skip, 0);
    /* and meets it, every time: the site never stops spinning */
    for (int i = 0; i < 8; i++) {
        ck_assert_int_eq(wait_for_peer(&s, B, B + B / 4), 1);
        ck_assert_int_eq(s.stretch, 1);
    }
    /* a peer that comes within the plain budget: the stretch goes */
    ck_assert_int_eq(wait_for_peer(&s, B, B / 4), 1);
    ck_assert_int_eq(s.stretch, 0);
    /* never more than TP_SPIN_STRETCH_MAX doublings */
    for (int i = 0; i <= TP_SPIN_STRETCH_MAX; i++)
        wait_for_peer(&s, B, (1 << i) * B + B / 4);
    ck_assert_int_eq(s.stretch, TP_SPIN_STRETCH_MAX);
    ck_assert_int_eq(s.misses, 0);
    /* a peer later than the longest spin again after it ran out (9
     * budgets against 4 + 4) is a miss, as without tp_spin_site_ended */
    ck_assert_int_eq(wait_for_peer(&s, B, 9 * B), 0);
    ck_assert_int_gt(s.misses, 0);
    tp_spin_set_clock(NULL);
}
END_TEST

static _Atomic uint32_t word;

static void *bump_later(void *p)
{
    (void)p;
    usleep(20 * 1000);
    atomic_store(&word, 1);
    tp_futex_wake(&word, 0);
    return NULL;
}

START_TEST(futex_wait_and_wake)
{
    atomic_store(&word, 0);
    int64_t t0 = tp_now_ns();
    tp_futex_wait(&word, 0, 30, 0); /* nobody wakes: the timeout */
    ck_assert_int_ge(tp_now_ns() - t0, 29 * 1000 * 1000);
    tp_futex_wait(&word, 1, -1, 0); /* not the expected value: at once */
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, bump_later, NULL), 0);
    while (atomic_load(&word) == 0)
        tp_futex_wait(&word, 0, -1, 0);
    pthread_join(th, NULL);
}
END_TEST

static Suite *spin_wait_suite(void)
{
    Suite *s = suite_create("spin_wait");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 30);
    tcase_add_test(t, budget_only_when_every_party_has_a_core);
    tcase_add_test(t, a_spin_is_bounded_by_time);
    tcase_add_test(t, a_site_stops_spinning_where_spins_run_out);
    tcase_add_test(t, a_spin_that_ends_just_before_its_peer_stretches);
    tcase_add_test(t, futex_wait_and_wake);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(spin_wait_suite)
