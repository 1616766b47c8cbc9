/* test_cpu_pin.c — pin_threads' guard (cpu_pin.h): the starvation verdict
 * on windows measured on this project's VMs, the policy's strikes and
 * doubling holds on a clock of the test's own, /proc/stat's parsing, and
 * a real thread pinned to a CPU two busy threads share, unpinned once the
 * guard sees it starve while another CPU idles, then pinned again; and a
 * thread moved by someone else, before its first tick or once pinned, left
 * where it is. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "clock.h"
#include "cpu_pin.h"

#define MS(x) ((int64_t)(x) * 1000000)

/* Windows read off tpserve's HTTP threads (wall, run, wait, idlest other
 * CPU's idle; server/README.md at 27cb4dd, "A pinned thread its CPU starves"). */
START_TEST(starved_only_waiting_as_long_as_running_while_another_cpu_idles)
{
    /* one connection, client and server sharing a CPU: the other idles,
     * but the thread waits less than it runs */
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(2000), MS(1278), MS(788), MS(2000)}));
    /* 32 connections: both CPUs busy */
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(2000), MS(1171), MS(791), MS(30)}));
    /* a busy loop on the thread's CPU under full load: waits, nothing idles */
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(2000), MS(742), MS(1012), MS(110)}));
    /* a busy loop on its CPU, its client moved to the other CPU */
    ck_assert(tp_pin_window_starved(&(tp_pin_window){MS(252), MS(81), MS(83), MS(160)}));
    /* an idle thread waits for nothing */
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(250), 0, 0, MS(250)}));
    /* the quarter bounds, each just missed */
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(400), MS(90), MS(99), MS(100)}));
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){MS(400), MS(90), MS(100), MS(99)}));
    ck_assert(tp_pin_window_starved(&(tp_pin_window){MS(400), MS(90), MS(100), MS(100)}));
    ck_assert(!tp_pin_window_starved(&(tp_pin_window){0, 0, 0, 0}));
}
END_TEST

/* Unpins on the TP_PIN_STRIKES-th starved window in a row at now; pinned
 * again exactly hold ms later. Returns that time. */
static int64_t starve_and_wait(tp_pin_policy *pp, int64_t now, int64_t hold)
{
    for (int i = 1; i < TP_PIN_STRIKES; i++)
        ck_assert_int_eq(tp_pin_policy_window(pp, 1, now), TP_PIN_SAME);
    ck_assert_int_eq(tp_pin_policy_window(pp, 1, now), TP_PIN_UNPINNED);
    ck_assert(!pp->pinned);
    ck_assert_int_eq(tp_pin_policy_window(pp, 1, now), TP_PIN_SAME); /* unpinned: no windows */
    ck_assert_int_eq(tp_pin_policy_poll(pp, now + hold - 1), TP_PIN_SAME);
    ck_assert_int_eq(tp_pin_policy_poll(pp, now + hold), TP_PIN_PINNED);
    ck_assert_int_eq(tp_pin_policy_poll(pp, now + hold + 1), TP_PIN_SAME);
    return now + hold;
}

START_TEST(policy_unpins_on_strikes_for_doubling_holds)
{
    tp_pin_policy pp;
    tp_pin_policy_init(&pp, 0);
    ck_assert(pp.pinned);
    /* a calm window between starved ones starts the count again */
    ck_assert_int_eq(tp_pin_policy_window(&pp, 1, 250), TP_PIN_SAME);
    ck_assert_int_eq(tp_pin_policy_window(&pp, 0, 500), TP_PIN_SAME);
    int64_t now = starve_and_wait(&pp, 750, 1000);
    int64_t hold = 2000;
    for (; hold < TP_PIN_HOLD_MAX_MS; hold *= 2)
        now = starve_and_wait(&pp, now + 10, hold);
    now = starve_and_wait(&pp, now + 10, TP_PIN_HOLD_MAX_MS);
    now = starve_and_wait(&pp, now + 10, TP_PIN_HOLD_MAX_MS); /* the cap holds */
    /* pinned and calm a whole longest hold: the next spell is the shortest */
    ck_assert_int_eq(tp_pin_policy_window(&pp, 0, now + TP_PIN_HOLD_MAX_MS), TP_PIN_SAME);
    now = starve_and_wait(&pp, now + TP_PIN_HOLD_MAX_MS, 1000);
    starve_and_wait(&pp, now + 10, 2000);
}
END_TEST

START_TEST(parse_idle_reads_each_cpus_line)
{
    const char *stat = "cpu  900 1 2 300000 7 0 0 0 0 0\n"
                       "cpu0 400 0 1 100000 3 0 0 0 0 0\n"
                       "cpu1 500 1 1 200000 4 0 0 0 0 0\n"
                       "cpu10 5 0 0 42 8 0 0 0 0 0\n"
                       "intr 12345 1 2 3\n";
    uint64_t idle[3];
    ck_assert_int_eq(tp_cpu_pin_parse_idle(stat, (int[]){10, 1}, 2, idle), 0);
    ck_assert_uint_eq(idle[0], 50);     /* 42 idle + 8 iowait */
    ck_assert_uint_eq(idle[1], 200004);
    ck_assert_int_eq(tp_cpu_pin_parse_idle(stat, (int[]){0, 3}, 2, idle), -1); /* no cpu3 */
    ck_assert_int_eq(tp_cpu_pin_parse_idle("cpu0 1 2 3\n", (int[]){0}, 1, idle), -1); /* too short */
    ck_assert_int_eq(tp_cpu_pin_parse_idle("", (int[]){0}, 1, idle), -1);
    ck_assert_int_eq(tp_cpu_pin_parse_idle(stat, NULL, 0, idle), 0);
}
END_TEST

static int affinity_is(const cpu_set_t *want)
{
    cpu_set_t now;
    CPU_ZERO(&now);
    return pthread_getaffinity_np(pthread_self(), sizeof now, &now) == 0 && CPU_EQUAL(&now, want);
}

typedef struct {
    int cpu;
    atomic_int stop;
} hog_args;

static void *hog(void *arg)
{
    hog_args *h = arg;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(h->cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof one, &one);
    while (!atomic_load_explicit(&h->stop, memory_order_relaxed))
        ;
    return NULL;
}

/* The CPUs of allowed but cpu (what a pin of cpu watches), their idle
 * ticks so far in idle[] (/proc/stat, parsed as the pin parses it), n of them. */
typedef struct {
    int n, cpus[CPU_SETSIZE];
    uint64_t idle[CPU_SETSIZE];
} other_cpus;

static void read_other_cpus(other_cpus *o, int cpu, const cpu_set_t *allowed)
{
    static char stat[1 << 16];
    o->n = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (c != cpu && CPU_ISSET(c, allowed))
            o->cpus[o->n++] = c;
    FILE *f = fopen("/proc/stat", "r");
    ck_assert_ptr_nonnull(f);
    size_t len = fread(stat, 1, sizeof stat - 1, f);
    fclose(f);
    stat[len] = '\0';
    ck_assert_int_eq(tp_cpu_pin_parse_idle(stat, o->cpus, o->n, o->idle), 0);
}

/* The fraction of ms that the idlest of before's CPUs idled since it was
 * read. */
static double idlest_since(const other_cpus *before, int cpu, const cpu_set_t *allowed, int64_t ms)
{
    static other_cpus after;
    read_other_cpus(&after, cpu, allowed);
    uint64_t most = 0;
    for (int i = 0; i < before->n; i++)
        if (after.idle[i] - before->idle[i] > most)
            most = after.idle[i] - before->idle[i];
    return (double)most * 1000.0 / (double)sysconf(_SC_CLK_TCK) / (double)(ms > 0 ? ms : 1);
}

/* Ticks p as a busy thread would (on every "request") until it reports
 * want or deadline_ms passes; what the last tick reported, at *at. */
static tp_pin_change tick_until(tp_cpu_pin *p, tp_pin_change want, int64_t deadline_ms, int64_t *at, char *why,
                                size_t len)
{
    tp_pin_change got = TP_PIN_SAME;
    while (got != want && (*at = tp_now_ms_int()) < deadline_ms)
        got = tp_cpu_pin_tick(p, *at, why, len);
    return got;
}

/* Two busy threads on the pinned thread's CPU: it runs a third of the time
 * and waits the rest, while the other CPUs have nothing to do. Ticks until
 * the guard unpins it: 1, *at the time; 0 when the other CPUs were busy
 * with other work all along (starvation needs one that idles: keeping
 * the pin was right), said on stdout. */
static int starve(tp_cpu_pin *p, int cpu, const cpu_set_t *allowed, int64_t *at, char *why, size_t len)
{
    hog_args h = {.cpu = cpu};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(pthread_create(&t[i], NULL, hog, &h), 0);
    int64_t start = tp_now_ms_int();
    static other_cpus idle0;
    read_other_cpus(&idle0, cpu, allowed);
    tp_pin_change got = tick_until(p, TP_PIN_UNPINNED, start + 40 * TP_PIN_WINDOW_MS, at, why, len);
    int64_t took = *at - start;
    atomic_store(&h.stop, 1);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    double idle = idlest_since(&idle0, cpu, allowed, took);
    if (got != TP_PIN_UNPINNED && idle < 0.25) {
        printf("a_starved_thread_is_unpinned_then_pinned_again: skipped: the other CPUs were busy "
               "(the idlest idled %.0f%% of %lld ms)\n", 100 * idle, (long long)took);
        return 0;
    }
    ck_assert_msg(got == TP_PIN_UNPINNED, "not unpinned in %lld ms beside two busy threads (another CPU idled %.0f%%)",
                  (long long)took, 100 * idle);
    printf("unpinned after %lld ms: %s\n", (long long)took, why);
    return 1;
}

START_TEST(a_starved_thread_is_unpinned_then_pinned_again)
{
    cpu_set_t allowed;
    ck_assert_int_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    char why[256] = "";
    if (CPU_COUNT(&allowed) < 2 || !tp_cpu_pin_watchable(why, sizeof why)) {
        printf("a_starved_thread_is_unpinned_then_pinned_again: skipped: %s\n",
               CPU_COUNT(&allowed) < 2 ? "one CPU" : why);
        return;
    }
    int cpu = 0, other;
    while (!CPU_ISSET(cpu, &allowed))
        cpu++;
    for (other = cpu + 1; !CPU_ISSET(other, &allowed); other++)
        ;
    cpu_set_t one, moved;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    CPU_ZERO(&moved);
    CPU_SET(other, &moved);
    tp_cpu_pin *p = tp_cpu_pin_create(cpu, &allowed);
    ck_assert_ptr_nonnull(p);
    ck_assert_int_eq(tp_cpu_pin_tick(p, tp_now_ms_int(), why, sizeof why), TP_PIN_SAME);
    ck_assert_msg(affinity_is(&one), "the first tick pins the thread to CPU %d", cpu);

    int64_t at;
    if (starve(p, cpu, &allowed, &at, why, sizeof why)) {
        ck_assert_msg(strstr(why, "for CPU") && strstr(why, "unpinned for 1000 ms"), "why: %s", why);
        ck_assert_msg(affinity_is(&allowed), "unpinned, the thread may use every CPU again");
        /* the hold over (the clock is the caller's), the next tick pins it */
        int64_t later = at + TP_PIN_HOLD_MIN_MS;
        ck_assert_int_eq(tp_cpu_pin_tick(p, later - 1, why, sizeof why), TP_PIN_SAME);
        ck_assert_msg(affinity_is(&allowed), "still unpinned before its hold is over");
        ck_assert_int_eq(tp_cpu_pin_tick(p, later, why, sizeof why), TP_PIN_PINNED);
        ck_assert_msg(affinity_is(&one), "pinned again: %s", why);
        /* starved again soon: away twice as long; moved by someone else
         * meanwhile, it is left where it was put, and that is no change */
        if (starve(p, cpu, &allowed, &at, why, sizeof why)) {
            ck_assert_msg(strstr(why, "unpinned for 2000 ms"), "the second hold doubles: %s", why);
            ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof moved, &moved), 0);
            ck_assert_int_eq(tp_cpu_pin_tick(p, at + 2 * TP_PIN_HOLD_MIN_MS, why, sizeof why), TP_PIN_LEFT);
            ck_assert_msg(strstr(why, "changed since it was unpinned") && strstr(why, "not pinned"), "why: %s", why);
            ck_assert_msg(affinity_is(&moved), "left on CPU %d, where it was moved while unpinned", other);
            ck_assert_int_eq(tp_cpu_pin_tick(p, at + 100 * TP_PIN_HOLD_MIN_MS, why, sizeof why), TP_PIN_SAME);
            ck_assert_msg(affinity_is(&moved), "and never pinned again");
        }
    }
    tp_cpu_pin_free(p);
    /* the test thread's own CPUs back as they were */
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed), 0);
}
END_TEST

/* A thread moved by someone else (taskset -p), before its first request or
 * once pinned, keeps the CPUs it was given. */
START_TEST(a_thread_moved_by_someone_else_is_left_where_it_was_put)
{
    cpu_set_t allowed;
    ck_assert_int_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    if (CPU_COUNT(&allowed) < 2) {
        printf("a_thread_moved_by_someone_else_is_left_where_it_was_put: skipped: one CPU\n");
        return;
    }
    int first = 0, second;
    while (!CPU_ISSET(first, &allowed))
        first++;
    for (second = first + 1; !CPU_ISSET(second, &allowed); second++)
        ;
    cpu_set_t moved;
    CPU_ZERO(&moved);
    CPU_SET(second, &moved);
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof moved, &moved), 0);
    tp_cpu_pin *p = tp_cpu_pin_create(first, &allowed);
    ck_assert_ptr_nonnull(p);
    char why[256] = "";
    ck_assert_int_eq(tp_cpu_pin_tick(p, tp_now_ms_int(), why, sizeof why), TP_PIN_LEFT);
    ck_assert_msg(strstr(why, "changed since startup") && strstr(why, "not pinned"), "why: %s", why);
    ck_assert_msg(affinity_is(&moved), "left on CPU %d, where it was moved", second);
    ck_assert_int_eq(tp_cpu_pin_tick(p, tp_now_ms_int() + 100000, why, sizeof why), TP_PIN_SAME);
    ck_assert_msg(affinity_is(&moved), "and never pinned later");
    tp_cpu_pin_free(p);

    /* pinned first, then moved: left there when its window ends, and for good */
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed), 0);
    p = tp_cpu_pin_create(first, &allowed);
    ck_assert_ptr_nonnull(p);
    int64_t now = tp_now_ms_int();
    ck_assert_int_eq(tp_cpu_pin_tick(p, now, why, sizeof why), TP_PIN_SAME);
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof moved, &moved), 0);
    ck_assert_int_eq(tp_cpu_pin_tick(p, now + TP_PIN_WINDOW_MS, why, sizeof why), TP_PIN_UNPINNED);
    ck_assert_msg(strstr(why, "changed since it was pinned"), "why: %s", why);
    ck_assert_msg(affinity_is(&moved), "left on CPU %d, where it was moved after its pin", second);
    for (int k = 2; k < 8; k++)
        ck_assert_int_eq(tp_cpu_pin_tick(p, now + k * TP_PIN_HOLD_MAX_MS, why, sizeof why), TP_PIN_SAME);
    ck_assert_msg(affinity_is(&moved), "and never pinned or unpinned later");
    tp_cpu_pin_free(p);
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof allowed, &allowed), 0);
}
END_TEST

static Suite *cpu_pin_suite(void)
{
    Suite *s = suite_create("cpu_pin");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, starved_only_waiting_as_long_as_running_while_another_cpu_idles);
    tcase_add_test(t, policy_unpins_on_strikes_for_doubling_holds);
    tcase_add_test(t, parse_idle_reads_each_cpus_line);
    tcase_add_test(t, a_starved_thread_is_unpinned_then_pinned_again);
    tcase_add_test(t, a_thread_moved_by_someone_else_is_left_where_it_was_put);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(cpu_pin_suite)
