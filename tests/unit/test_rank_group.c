/* The process rank group: workers are this test binary run again as
 * "test_rank_group worker SCENARIO" (that is how `tpserve worker` runs).
 * Every step reaches every process in lockstep through the shared memory;
 * a failure anywhere is the same error everywhere; a dead worker makes the
 * step fail naming its rank and signal, without hanging a rank that waits
 * for it; external ranks join over the rendezvous socket and bad ones are
 * refused (a foreign uid, a wrong group secret: impostors take no rank's
 * slot, and one that says nothing holds nobody up); each process's caller
 * runs its rank itself; an idle group sleeps and hears of a death at once.
 *
 * The thread rank group: steps back to back from several callers, a rank
 * failing mid-step, an abort reaching ranks that sleep or spin in a
 * collective, and no spinning when the ranks outnumber the cores. */
#include <check.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "clock.h"
#include "cpu/collectives.h"
#include "rank_group.h"
#include "rank_procs.h"
#include "spin_wait.h"
#include "testutil.h"

typedef struct {
    int step;
    const tp_rank_shared *sh;
    const char *scenario;
} step_ctx;

/* staging words: [r] = what rank r wrote this step; [64 + r] = the error a
 * worker saw from a failed step (first 4 bytes of the message kept as int) */
static int *words(const tp_rank_shared *sh) { return (int *)(sh->base + sh->staging_offset); }

static tp_status write_rank(void *p, int rank, tp_err *err)
{
    step_ctx *c = p;
    if (strcmp(c->scenario, "fail") == 0 && c->step == 2 && rank == 2)
        return tp_fail(err, TP_BACKEND, "boom at step %d", c->step);
    if (strcmp(c->scenario, "die") == 0 && c->step == 1 && rank == 1)
        kill(getpid(), SIGKILL);
    if (strcmp(c->scenario, "hang") == 0 && c->step == 1 && rank == 1)
        raise(SIGSTOP); /* alive, but never finishes the step */
    if (strcmp(c->scenario, "fail_at_once") == 0 && c->step == 1 && rank == 1)
        return tp_fail(err, TP_BACKEND, "rank 1 gave up");
    /* [128 + r]: whether rank r ran on its process's main thread (the
     * caller of run in a worker) */
    words(c->sh)[128 + rank] = gettid() == getpid();
    words(c->sh)[192 + rank] = getpid(); /* [192 + r]: rank r's process */
    words(c->sh)[rank] = 1000 * c->step + rank;
    return TP_OK;
}

/* Worker side: follow the leader's commands until it quits. */
static int worker_main(const char *scenario)
{
    tp_rank_group_opts o = {.mode = TP_GROUP_WORKER, .rank = atoi(getenv("TP_RANK")),
                            .world = atoi(getenv("TP_WORLD_SIZE")), .rendezvous = getenv("TEST_RENDEZVOUS"),
                            .secret_file = getenv("TEST_SECRET_FILE")};
    if (strcmp(scenario, "prewake") == 0)
        o.spin_ns = 300 * 1000000LL; /* long enough to see it spin */
    tp_rank_group *g;
    tp_err err;
    if (tp_rank_group_create(&o, &g, &err) != TP_OK) {
        fprintf(stderr, "worker: %s\n", err.msg);
        return 3;
    }
    for (;;) {
        step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = scenario};
        size_t len;
        int quit;
        if (tp_rank_group_next(g, &c.step, sizeof c.step, &len, &quit, &err) != TP_OK)
            break;
        if (tp_rank_group_run(g, write_rank, &c, NULL, &err) != TP_OK)
            words(c.sh)[64 + o.rank] = strstr(err.msg, "rank 2: boom") ? 1 : -1;
    }
    tp_rank_group_free(g);
    return 0;
}

static char *argv_worker[] = {"/proc/self/exe", "worker", "plain", NULL};

/* on_lost of the groups leader() makes: counts the calls */
static _Atomic int told_lost;
static void count_lost(void *arg)
{
    (void)arg;
    atomic_fetch_add(&told_lost, 1);
}

static tp_rank_group *leader(int world, const char *scenario)
{
    argv_worker[2] = (char *)scenario;
    tp_rank_group_opts o = {.mode = TP_GROUP_PROCESSES, .world = world, .worker_argv = argv_worker,
                            .staging_bytes = 1 << 20, .heap_bytes = 1 << 20, .timeout_ms = 20000,
                            .step_timeout_ms = strcmp(scenario, "hang") == 0 ? 500 : 0, .on_lost = count_lost};
    atomic_store(&told_lost, 0);
    tp_rank_group *g;
    tp_err err;
    ck_assert_msg(tp_rank_group_create(&o, &g, &err) == TP_OK, "%s", err.msg);
    return g;
}

static tp_status leader_step(tp_rank_group *g, step_ctx *c, tp_err *err)
{
    tp_status st = tp_rank_group_post(g, &c->step, sizeof c->step, err);
    return st == TP_OK ? tp_rank_group_run(g, write_rank, c, NULL, err) : st;
}

START_TEST(steps_reach_every_process_in_lockstep)
{
    tp_rank_group *g = leader(3, "plain");
    int lo, hi;
    tp_rank_group_local(g, &lo, &hi);
    ck_assert(lo == 0 && hi == 1 && tp_rank_group_leads(g));
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain"};
    for (c.step = 1; c.step <= 50; c.step++) {
        tp_err err;
        ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
        for (int r = 0; r < 3; r++) /* every rank wrote before run returned */
            ck_assert_int_eq(words(c.sh)[r], 1000 * c.step + r);
    }
    ck_assert_ptr_null(tp_rank_group_lost(g));
    tp_rank_group_free(g); /* quit: the workers exit; free reaps them */
}
END_TEST

START_TEST(a_failure_is_the_same_error_in_every_process)
{
    tp_rank_group *g = leader(3, "fail");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "fail"};
    tp_err err;
    c.step = 1;
    ck_assert(leader_step(g, &c, &err) == TP_OK);
    c.step = 2;
    ck_assert(leader_step(g, &c, &err) == TP_BACKEND);
    ck_assert_msg(strcmp(err.msg, "rank 2: boom at step 2") == 0, "%s", err.msg);
    c.step = 3; /* the group is still usable after an ordinary failure */
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(words(c.sh)[2], 3002);
    /* written by each worker after its step 2 returned, so before step 3 */
    ck_assert_int_eq(words(c.sh)[64 + 1], 1); /* rank 1 got rank 2's error */
    ck_assert_int_eq(words(c.sh)[64 + 2], 1);
    tp_rank_group_free(g);
}
END_TEST

/* Rank 0 waits for a peer "inside a collective" until hooks->lost frees it. */
static _Atomic int released;
static void release(void *p)
{
    (void)p;
    atomic_store(&released, 1);
}

static tp_status wait_for_peer(void *p, int rank, tp_err *err)
{
    step_ctx *c = p;
    if (rank == 0)
        while (!atomic_load(&released))
            usleep(1000);
    return rank == 0 ? tp_fail(err, TP_BACKEND, "collective aborted") : write_rank(c, rank, err);
}

/* Posts c's step and runs fn on it; a hang fails the test instead of the
 * whole suite. */
static tp_status guarded_step(tp_rank_group *g, step_ctx *c, tp_rank_fn fn, const tp_rank_hooks *hooks, tp_err *err)
{
    ck_assert(tp_rank_group_post(g, &c->step, sizeof c->step, err) == TP_OK);
    alarm(20);
    tp_status st = tp_rank_group_run(g, fn, c, hooks, err);
    alarm(0);
    return st;
}

START_TEST(a_dead_worker_fails_the_step_and_the_group)
{
    tp_rank_group *g = leader(2, "die");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "die", .step = 1};
    tp_rank_hooks hooks = {.lost = release};
    tp_err err;
    tp_status st = guarded_step(g, &c, wait_for_peer, &hooks, &err);
    ck_assert_int_eq(st, TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "rank 1 (pid") && strstr(err.msg, "killed by signal 9"), "%s", err.msg);
    ck_assert(atomic_load(&released));
    ck_assert_ptr_nonnull(tp_rank_group_lost(g));
    c.step = 2; /* later steps fail at once, naming the same cause */
    ck_assert_int_eq(tp_rank_group_run(g, write_rank, &c, NULL, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "killed by signal 9"), "%s", err.msg);
    tp_rank_group_free(g);
}
END_TEST

/* Context switches so far of every thread of process pid. */
static long process_switches(int pid)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd,
             "cat /proc/%d/task/*/status 2>/dev/null | awk '/ctxt_switches/ { s += $2 } END { print s }'", pid);
    FILE *f = popen(cmd, "r");
    long n = -1;
    if (f) {
        if (fscanf(f, "%ld", &n) != 1)
            n = -1;
        pclose(f);
    }
    return n;
}

/* Between steps nothing polls: the worker waiting for its next command and
 * both processes' peer watchers sleep until something happens (a 20 ms
 * poll woke each process 50 times a second). A worker killed while the
 * group idles is found at once by the leader's watcher, which loses the
 * group and tells on_lost without anyone asking (lost_known: no look). */
START_TEST(an_idle_group_sleeps_and_hears_of_a_death_at_once)
{
    tp_rank_group *g = leader(2, "plain");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain", .step = 1};
    tp_err err;
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    int worker = words(c.sh)[192 + 1];
    ck_assert_msg(tu_thread_reaches(worker, 'S', 5000), "the worker never sleeps between steps");
    usleep(1200 * 1000); /* past the step watchdogs' IDLE_MS (rank_group.c): they sleep too */
    long before = process_switches(worker);
    usleep(500 * 1000);
    long woke = process_switches(worker) - before;
    ck_assert_msg(before >= 0 && woke <= 3, "an idle worker woke %ld times in 500 ms", woke);
    ck_assert_int_eq(atomic_load(&told_lost), 0);
    kill(worker, SIGKILL);
    for (int i = 0; i < 10000 && !atomic_load(&told_lost); i++)
        usleep(1000);
    ck_assert_int_eq(atomic_load(&told_lost), 1);
    const char *lost = tp_rank_group_lost_known(g);
    ck_assert_msg(lost && strstr(lost, "rank 1 (pid") && strstr(lost, "killed by signal 9"), "%s", lost ? lost : "");
    c.step = 2; /* the next step fails at once, naming it */
    ck_assert_int_eq(tp_rank_group_run(g, write_rank, &c, NULL, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "killed by signal 9"), "%s", err.msg);
    tp_rank_group_free(g);
    ck_assert_int_eq(atomic_load(&told_lost), 1); /* once */
}
END_TEST

/* Commands a little further apart than the worker's spin for them (a
 * client's round trip at one connection when a CPU has halted): the spins
 * stretch to meet them (tp_spin_site_ended) and the worker keeps spinning,
 * where it used to count each as a miss, stop spinning after a few and
 * sleep between all later steps (server/README.md at 27cb4dd, "Spins that stretch to
 * meet a waking peer"). The gap is 1.5x the command spin, against the 4x
 * a stretched spin reaches. Measured, context switches of the worker's
 * threads over the 200 steps: 36-51 with the stretch (its watchdog's ticks
 * among them), 388-417 without. */
START_TEST(a_worker_keeps_spinning_for_commands_a_little_slower_than_its_spin)
{
    if (tp_spin_cores() < 2)
        return; /* ranks may not spin here */
    tp_rank_group *g = leader(2, "plain");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain", .step = 1};
    tp_err err;
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    int worker = words(c.sh)[192 + 1];
    /* a CPU each, as the server's pinned HTTP thread and its worker have:
     * spawned from this thread, the worker starts on its CPU and two
     * spinning threads there would take turns instead */
    cpu_set_t all, one;
    ck_assert_int_eq(sched_getaffinity(0, sizeof all, &all), 0);
    int cpu[2];
    ck_assert_int_eq(tu_allowed_cpus(cpu, 2), 2);
    CPU_ZERO(&one);
    CPU_SET(cpu[0], &one);
    ck_assert_int_eq(sched_setaffinity(0, sizeof one, &one), 0);
    CPU_ZERO(&one);
    CPU_SET(cpu[1], &one);
    ck_assert_int_eq(sched_setaffinity(worker, sizeof one, &one), 0);
    const int steps = 200;
    const int64_t gap_ns = 6 * TP_SPIN_NS; /* the command spin is 4x TP_SPIN_NS (rank_procs.c) */
    long before = process_switches(worker);
    for (int i = 0; i < steps; i++) {
        for (int64_t end = tp_now_ns() + gap_ns; tp_now_ns() < end;)
            ;
        c.step = 2 + i;
        ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    }
    long slept = process_switches(worker) - before;
    sched_setaffinity(0, sizeof all, &all);
    ck_assert_msg(before >= 0 && slept <= steps * 3 / 4, "the worker slept %ld times in %d steps", slept, steps);
    tp_rank_group_free(g);
}
END_TEST

/* The group secret these tests' hellos carry (the fuzz_rendezvous
 * harness's too), and one that differs from it in its last digit only. */
static const char group_secret[] = "00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdef";
static const char near_secret[] = "00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdee";

/* A rendezvous hello, as the bytes a joining rank sends. */
static size_t hello_bytes(unsigned char *b, uint32_t magic, int32_t rank, int32_t world, int32_t pid,
                          const char *secret)
{
    int32_t f[3] = {rank, world, pid};
    memcpy(b, &magic, 4);
    memcpy(b + 4, f, sizeof f);
    memcpy(b + 16, secret, TP_RANK_SECRET_CHARS);
    return TP_RANK_HELLO_BYTES;
}

/* What the leader admits at its rendezvous, and what it answers the rest
 * (the fuzz_rendezvous seeds are these hellos). A hello without the
 * group's secret learns nothing of the group: it is refused for that
 * before its rank is looked at. */
START_TEST(the_leader_checks_each_hello)
{
    ck_assert_int_eq((int)strlen(group_secret), TP_RANK_SECRET_CHARS);
    unsigned char b[TP_RANK_HELLO_BYTES];
    int32_t joined[4] = {100, -1, 4242, -1}; /* rank 2 is in already */
    char why[200];
    const uint32_t magic = 0x74707267u;
    const char *s = group_secret;
    ck_assert_int_eq(tp_rank_hello_check(b, hello_bytes(b, magic, 1, 4, 777, s), 4, joined, s, why, sizeof why), 1);
    /* the pid it names is not used: a false one (1, or another namespace's) changes nothing */
    ck_assert_int_eq(tp_rank_hello_check(b, hello_bytes(b, magic, 3, 4, 1, s), 4, joined, s, why, sizeof why), 3);
    static const char zeros[TP_RANK_SECRET_CHARS];
    struct {
        uint32_t magic;
        int32_t rank, world;
        size_t n;
        const char *secret, *why;
    } refused[] = {
        {0xdeadbeef, 1, 4, TP_RANK_HELLO_BYTES, s, "error: not a tpserve rank"},
        {magic, 1, 4, TP_RANK_HELLO_BYTES + 1, s, "error: not a tpserve rank"}, /* long */
        {magic, 1, 4, 15, s, "error: not a tpserve rank"},                      /* not even a rank */
        {magic, 1, 4, 0, s, "error: not a tpserve rank"},                       /* nothing */
        {magic, 1, 4, TP_RANK_HELLO_BYTES - 1, s,                               /* a digit short */
         "error: the hello has no whole group secret (63 of its 64 hex digits; a worker older than its leader?)"},
        {magic, 1, 4, 16, s, /* the hello before secrets */
         "error: the hello has no whole group secret (0 of its 64 hex digits; a worker older than its leader?)"},
        {magic, 1, 4, TP_RANK_HELLO_BYTES, near_secret, "error: wrong group secret"},
        {magic, 1, 4, TP_RANK_HELLO_BYTES, zeros, "error: wrong group secret"},
        /* not "already joined (pid 4242)": an impostor learns nothing */
        {magic, 2, 4, TP_RANK_HELLO_BYTES, near_secret, "error: wrong group secret"},
        {magic, 1, 3, TP_RANK_HELLO_BYTES, s, "error: WORLD_SIZE 3, but the graph has world_size 4"},
        {magic, 0, 4, TP_RANK_HELLO_BYTES, s, "error: RANK 0 out of range 1..3 (rank 0 is the leader)"},
        {magic, 4, 4, TP_RANK_HELLO_BYTES, s, "error: RANK 4 out of range 1..3 (rank 0 is the leader)"},
        {magic, -2147483647 - 1, 4, TP_RANK_HELLO_BYTES, s, "error: RANK -2147483648 out of range 1..3 (rank 0 is the leader)"},
        {magic, 2, 4, TP_RANK_HELLO_BYTES, s, "error: rank 2 already joined (pid 4242)"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        unsigned char big[TP_RANK_HELLO_BYTES + 1] = {0};
        hello_bytes(big, refused[i].magic, refused[i].rank, refused[i].world, 5, refused[i].secret);
        why[0] = 'x';
        ck_assert_int_eq(tp_rank_hello_check(big, refused[i].n, 4, joined, s, why, sizeof why), 0);
        ck_assert_str_eq(why, refused[i].why);
    }
}
END_TEST

/* Who may join, by the uid the kernel gives for the connection: the
 * leader's own, and rendezvous_uid when set (-1: nobody else). */
START_TEST(the_leader_checks_each_joiners_uid)
{
    char why[200] = "";
    ck_assert_int_eq(tp_rank_uid_check(1000, 1000, -1, why, sizeof why), 1);
    ck_assert_int_eq(tp_rank_uid_check(1001, 1000, 1001, why, sizeof why), 1);
    ck_assert_int_eq(tp_rank_uid_check(0, 0, 1001, why, sizeof why), 1);
    ck_assert_int_eq(tp_rank_uid_check(65534, 1000, -1, why, sizeof why), 0);
    ck_assert_str_eq(why, "error: uid 65534 may not join: only the leader's (1000) may (see rendezvous_uid)");
    ck_assert_int_eq(tp_rank_uid_check(65534, 1000, 1001, why, sizeof why), 0);
    ck_assert_str_eq(why, "error: uid 65534 may not join: only the leader's (1000) and rendezvous_uid 1001 may");
    /* root is not anyone's by default */
    ck_assert_int_eq(tp_rank_uid_check(0, 1000, -1, why, sizeof why), 0);
    ck_assert_int_eq(tp_rank_uid_check(1000, 0, -1, why, sizeof why), 0);
}
END_TEST

/* Rank 0 runs on the thread calling run, a worker's rank on its main
 * thread (the one that called run there): no hand-off to a rank thread. */
static _Atomic int caller_tid, rank0_tid;

static tp_status note_tid(void *p, int rank, tp_err *err)
{
    if (rank == 0)
        atomic_store(&rank0_tid, gettid());
    return write_rank(p, rank, err);
}

START_TEST(every_process_runs_its_rank_on_the_caller)
{
    tp_rank_group *g = leader(3, "plain");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain", .step = 1};
    tp_err err;
    atomic_store(&caller_tid, gettid());
    ck_assert(tp_rank_group_post(g, &c.step, sizeof c.step, &err) == TP_OK);
    ck_assert_msg(tp_rank_group_run(g, note_tid, &c, NULL, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(atomic_load(&rank0_tid), atomic_load(&caller_tid));
    ck_assert_int_eq(words(c.sh)[128 + 1], 1);
    ck_assert_int_eq(words(c.sh)[128 + 2], 1);
    tp_rank_group_free(g);
}
END_TEST

/* A pre-wake reaches a worker process asleep waiting for the leader's next
 * message: it spins (for its budget), then sleeps again; the next step
 * runs as usual. */
START_TEST(a_prewake_spins_the_workers_for_the_next_message)
{
    if (tp_spin_cores() < 2)
        return; /* ranks may not spin here: a pre-wake is a no-op (see the threads case) */
    tp_rank_group *g = leader(2, "prewake");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "prewake", .step = 1};
    tp_err err;
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    int worker = words(c.sh)[192 + 1];
    ck_assert_msg(tu_thread_reaches(worker, 'S', 5000), "the worker never sleeps between steps");
    tp_rank_group_prewake(g);
    ck_assert_msg(tu_thread_reaches(worker, 'R', 200), "a pre-woken worker does not spin");
    ck_assert_msg(tu_thread_reaches(worker, 'S', 5000), "the worker spins past its budget");
    c.step = 2;
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(words(c.sh)[1], 2001);
    tp_rank_group_free(g);
}
END_TEST

/* A rank failing in another process must reach our rank blocked "in a
 * collective" (here: until hooks->fail): the watchdog tells the hook, and
 * the step fails with the other rank's error. */
static void release_fail(void *p)
{
    (void)p;
    atomic_store(&released, 2);
}

static tp_status wait_for_abort(void *p, int rank, tp_err *err)
{
    if (rank != 0)
        return write_rank(p, rank, err);
    while (atomic_load(&released) != 2)
        usleep(1000);
    return tp_fail(err, TP_BACKEND, "collective aborted");
}

START_TEST(a_failure_elsewhere_wakes_a_blocked_rank)
{
    tp_rank_group *g = leader(2, "fail_at_once");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "fail_at_once", .step = 1};
    tp_rank_hooks hooks = {.fail = release_fail};
    tp_err err;
    atomic_store(&released, 0);
    tp_status st = guarded_step(g, &c, wait_for_abort, &hooks, &err);
    ck_assert_int_eq(st, TP_BACKEND);
    ck_assert_msg(strcmp(err.msg, "rank 1: rank 1 gave up") == 0, "%s", err.msg);
    c.step = 2; /* the group goes on */
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(words(c.sh)[1], 2001);
    tp_rank_group_free(g);
}
END_TEST

/* A fault only this process's backend can see (NCCL's async error while
 * our rank waits in a collective that will never complete): the watchdog
 * asks hooks->fault every tick of the step, and a fault it names gets
 * hooks->fail (once from the watchdog), as a failed rank would. Rank 0
 * here waits until fail is called, so the step ends only through it.
 * Never asked outside a step. */
static _Atomic int faults_asked;
static const char *fault_on_second_look(void *p)
{
    (void)p;
    return atomic_fetch_add(&faults_asked, 1) >= 1 ? "async error" : NULL;
}

static _Atomic int fails_told;
static void count_fail_release(void *p)
{
    atomic_fetch_add(&fails_told, 1);
    release_fail(p);
}

START_TEST(a_backend_fault_wakes_the_blocked_rank)
{
    tp_rank_group *g = leader(2, "plain");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain", .step = 1};
    tp_rank_hooks hooks = {.fail = count_fail_release, .fault = fault_on_second_look};
    tp_err err;
    atomic_store(&released, 0);
    atomic_store(&faults_asked, 0);
    atomic_store(&fails_told, 0);
    tp_status st = guarded_step(g, &c, wait_for_abort, &hooks, &err);
    ck_assert_int_eq(st, TP_BACKEND);
    ck_assert_msg(strcmp(err.msg, "rank 0: collective aborted") == 0, "%s", err.msg);
    /* the watchdog's, once, then the one rank 0's own failure makes */
    ck_assert_int_eq(atomic_load(&fails_told), 2);
    int asked = atomic_load(&faults_asked);
    ck_assert_int_ge(asked, 2);
    usleep(100 * 1000); /* five ticks: nobody asks between steps */
    ck_assert_int_eq(atomic_load(&faults_asked), asked);
    c.step = 2; /* the group goes on (the backend's state is the backend's) */
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(words(c.sh)[1], 2001);
    tp_rank_group_free(g);
}
END_TEST

/* tp_rank_group_pending as rank 0 finds it inside the step (a readiness
 * probe asks so, from another thread): how many, and the first */
static tp_rank_group *pending_group;
static int pending_n = -2, pending_first = -1;
static tp_status note_pending(void *p, int rank, tp_err *err)
{
    if (rank == 0) {
        int r[4] = {-1, -1, -1, -1};
        pending_n = tp_rank_group_pending(pending_group, r, 4);
        pending_first = r[0];
    }
    return wait_for_peer(p, rank, err);
}

START_TEST(a_hung_worker_loses_the_group_at_the_step_deadline)
{
    tp_rank_group *g = leader(2, "hang");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "hang", .step = 1};
    tp_rank_hooks hooks = {.lost = release};
    tp_err err;
    int r[4];
    atomic_store(&released, 0);
    ck_assert_int_eq(tp_rank_group_pending(g, r, 4), 0); /* no step in flight */
    pending_group = g;
    tp_status st = guarded_step(g, &c, note_pending, &hooks, &err);
    ck_assert_int_eq(st, TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "rank 1 (pid") && strstr(err.msg, "did not finish a step within 500 ms"), "%s",
                  err.msg);
    ck_assert(atomic_load(&released));
    /* inside the step, the worker (stopped, or about to) had not finished it */
    ck_assert_int_eq(pending_n, 1);
    ck_assert_int_eq(pending_first, 1);
    ck_assert_int_eq(tp_rank_group_pending(g, r, 4), 0); /* the step is over */
    tp_rank_group_free(g); /* the stopped worker is killed, not waited for */
}
END_TEST

START_TEST(a_worker_that_exits_before_joining_is_an_error)
{
    char *argv[] = {"/bin/false", NULL};
    tp_rank_group_opts o = {.mode = TP_GROUP_PROCESSES, .world = 2, .worker_argv = argv, .timeout_ms = 20000,
                            .staging_bytes = 1 << 20, .heap_bytes = 1 << 20};
    tp_rank_group *g;
    tp_err err;
    ck_assert_int_eq(tp_rank_group_create(&o, &g, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "rank 1") && strstr(err.msg, "exited with status 1") &&
                      strstr(err.msg, "before joining"),
                  "%s", err.msg);
}
END_TEST

static pid_t start_external(const char *path, const char *rank, const char *world, int delay_ms, const char *log)
{
    pid_t pid = fork();
    if (pid == 0) {
        usleep((useconds_t)delay_ms * 1000);
        if (log)
            (void)!freopen(log, "w", stderr);
        setenv("TP_RANK", rank, 1);
        setenv("TP_WORLD_SIZE", world, 1);
        setenv("TEST_RENDEZVOUS", path, 1);
        execl("/proc/self/exe", "test_rank_group", "worker", "plain", (char *)NULL);
        _exit(127);
    }
    return pid;
}

START_TEST(external_ranks_join_at_the_rendezvous)
{
    char path[64], log[64];
    snprintf(path, sizeof path, "/tmp/tp_rg_%d.sock", (int)getpid());
    snprintf(log, sizeof log, "/tmp/tp_rg_%d.log", (int)getpid());
    /* joins first and is refused by the leader: another world size */
    pid_t bad = start_external(path, "1", "4", 0, log);
    pid_t w2 = start_external(path, "2", "3", 500, NULL);
    pid_t w1 = start_external(path, "1", "3", 500, NULL);
    tp_rank_group_opts o = {.mode = TP_GROUP_PROCESSES, .world = 3, .rendezvous = path, .timeout_ms = 20000,
                            .staging_bytes = 1 << 20, .heap_bytes = 1 << 20};
    tp_rank_group *g;
    tp_err err;
    ck_assert_msg(tp_rank_group_create(&o, &g, &err) == TP_OK, "%s", err.msg);
    int ws;
    ck_assert_int_eq(waitpid(bad, &ws, 0), bad);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 3); /* worker_main: create failed */
    char msg[512] = "";
    FILE *f = fopen(log, "r");
    ck_assert_ptr_nonnull(f);
    (void)!fread(msg, 1, sizeof msg - 1, f);
    fclose(f);
    unlink(log);
    ck_assert_msg(strstr(msg, "refused rank 1") && strstr(msg, "WORLD_SIZE 4, but the graph has world_size 3"), "%s", msg);
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "plain", .step = 7};
    ck_assert_msg(leader_step(g, &c, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(words(c.sh)[2], 7002);
    tp_rank_group_free(g);
    ck_assert_int_eq(waitpid(w1, &ws, 0), w1);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ck_assert_int_eq(waitpid(w2, &ws, 0), w2);
    ck_assert(access(path, F_OK) != 0); /* the socket is removed once all joined */
}
END_TEST

/* A process at the rendezvous socket, as anyone local may write one. */
static int connect_rendezvous(const char *path)
{
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    for (int i = 0; i < 1000; i++) { /* the leader may not listen yet */
        int s = socket(AF_UNIX, SOCK_STREAM, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0)
            return s;
        if (s >= 0)
            close(s);
        usleep(20 * 1000);
    }
    return -1;
}

/* An impostor: connects, sends n bytes of bytes, tells `ready` (a pipe)
 * it is connected, and writes what the leader answers to answer_file. As
 * uid 65534 (nobody) when as_nobody, once connected: the kernel keeps the
 * uid of the connect, so it drops to nobody first. */
static pid_t impostor(const char *path, const void *bytes, size_t n, int ready, const char *answer_file, int as_nobody)
{
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    if (as_nobody && (setgid(65534) != 0 || setuid(65534) != 0))
        _exit(4);
    int s = connect_rendezvous(path);
    if (s < 0)
        _exit(5);
    if (n && write(s, bytes, n) != (ssize_t)n)
        _exit(6);
    (void)!write(ready, "c", 1);
    char buf[257] = "";
    ssize_t got = recv(s, buf, 256, MSG_WAITALL);
    FILE *f = fopen(answer_file, "w");
    if (f) {
        fprintf(f, "%s", got > 0 ? buf : "(no answer)");
        fclose(f);
    }
    _exit(0);
}

static void read_text(const char *file, char *buf, size_t cap)
{
    buf[0] = 0;
    FILE *f = fopen(file, "r");
    ck_assert_msg(f != NULL, "%s: missing", file);
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = 0;
    fclose(f);
}

typedef struct {
    tp_rank_group_opts o;
    tp_rank_group *g;
    tp_status st;
    tp_err err;
} leader_job;

static void *create_leader_job(void *arg)
{
    leader_job *j = arg;
    j->st = tp_rank_group_create(&j->o, &j->g, &j->err);
    return NULL;
}

/* Impostors reach the rendezvous before the real rank 1: one that sends a
 * few bytes and then nothing, one with a wrong group secret, and (as root,
 * where the test can be someone else) one that knows the secret but runs
 * as another uid. Each is refused, saying why, none takes rank 1's slot,
 * and the real rank 1 then joins and runs a step. Before, the first held
 * the leader in a recv for ever, and a hello without a secret (there was
 * none) for rank 1 got the group's memory. */
START_TEST(impostors_at_the_rendezvous_take_no_rank)
{
    char path[64], secret[80], ans[3][80];
    snprintf(path, sizeof path, "/tmp/tp_rgi_%d.sock", (int)getpid());
    snprintf(secret, sizeof secret, "%s.secret", path);
    for (int i = 0; i < 3; i++)
        snprintf(ans[i], sizeof ans[i], "/tmp/tp_rgi_%d.ans%d", (int)getpid(), i);
    leader_job j = {.o = {.mode = TP_GROUP_PROCESSES, .world = 2, .rendezvous = path, .timeout_ms = 40000,
                          .staging_bytes = 1 << 20, .heap_bytes = 1 << 20, .join_uid = -1}};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, create_leader_job, &j), 0);
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    char c;
    pid_t partial = impostor(path, "\x67\x72\x70\x74\x01\0\0\0", 8, ready[1], ans[0], 0);
    ck_assert_int_eq(read(ready[0], &c, 1), 1); /* connected first: admitted first */
    /* the leader writes its secret before it listens, owner-only */
    struct stat sb;
    ck_assert_int_eq(stat(secret, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 0777, 0600);
    unsigned char h[TP_RANK_HELLO_BYTES];
    hello_bytes(h, 0x74707267u, 1, 2, 1, near_secret);
    pid_t wrong = impostor(path, h, sizeof h, ready[1], ans[1], 0);
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    pid_t other = -1;
    if (geteuid() == 0) {
        /* it even has the secret (read as root here): its uid alone refuses it */
        char real[TP_RANK_SECRET_CHARS + 1];
        read_text(secret, real, sizeof real);
        hello_bytes(h, 0x74707267u, 1, 2, 1, real);
        chmod(path, 0777); /* nobody may connect; the leader must still refuse it */
        other = impostor(path, h, sizeof h, ready[1], ans[2], 1);
        ck_assert_int_eq(read(ready[0], &c, 1), 1);
    }
    int ws;
    pid_t waits[] = {partial, wrong, other};
    for (int i = 0; i < 3; i++)
        if (waits[i] > 0) {
            ck_assert_int_eq(waitpid(waits[i], &ws, 0), waits[i]);
            ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
        }
    pid_t w1 = start_external(path, "1", "2", 0, NULL);
    pthread_join(th, NULL);
    ck_assert_msg(j.st == TP_OK, "%s", j.err.msg);
    char msg[300];
    read_text(ans[0], msg, sizeof msg);
    ck_assert_str_eq(msg, "error: not a tpserve rank");
    read_text(ans[1], msg, sizeof msg);
    ck_assert_str_eq(msg, "error: wrong group secret");
    if (other > 0) {
        read_text(ans[2], msg, sizeof msg);
        ck_assert_str_eq(msg, "error: uid 65534 may not join: only the leader's (0) may (see rendezvous_uid)");
    } else {
        fprintf(stderr, "impostors_at_the_rendezvous_take_no_rank: another uid's impostor skipped: not root\n");
    }
    for (int i = 0; i < 3; i++)
        unlink(ans[i]);
    ck_assert(access(secret, F_OK) != 0); /* removed with the socket */
    step_ctx sc = {.sh = tp_rank_group_shared(j.g), .scenario = "plain", .step = 5};
    ck_assert_msg(leader_step(j.g, &sc, &j.err) == TP_OK, "%s", j.err.msg);
    ck_assert_int_eq(words(sc.sh)[1], 5001);
    tp_rank_group_free(j.g);
    ck_assert_int_eq(waitpid(w1, &ws, 0), w1);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    close(ready[0]);
    close(ready[1]);
}
END_TEST

/* A leader given a secret file refuses to start on one anybody else may
 * read (or write), or not its own, or not holding a secret; with a good
 * one, a rank given the same file joins, and the file is left in place. */
START_TEST(a_leader_checks_its_secret_file)
{
    char path[64], file[64];
    snprintf(path, sizeof path, "/tmp/tp_rgs_%d.sock", (int)getpid());
    snprintf(file, sizeof file, "/tmp/tp_rgs_%d.key", (int)getpid());
    tp_rank_group_opts o = {.mode = TP_GROUP_PROCESSES, .world = 2, .rendezvous = path, .timeout_ms = 20000,
                            .staging_bytes = 1 << 20, .heap_bytes = 1 << 20, .join_uid = -1, .secret_file = file};
    tp_rank_group *g;
    tp_err err;
    struct {
        const char *text;
        int mode, uid;
        const char *why;
    } bad[] = {
        {group_secret, 0644, -1, "is open to group or others (mode 0644): chmod 600 it"},
        {group_secret, 0602, -1, "is open to group or others (mode 0602): chmod 600 it"},
        {"0123456789abcdef\n", 0600, -1, "does not hold a secret of 64 hex digits"},
        {"00112233445566778899aabbccddeeff0123456789abcdef0123456789abcdefX", 0600, -1, "does not hold a secret"},
        {"", 0600, -1, "does not hold a secret"},
        {group_secret, 0600, 65534, "is owned by uid 65534, not by this process's (0)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        if (bad[i].uid >= 0 && geteuid() != 0)
            continue; /* only root can give a file away */
        unlink(file);
        FILE *f = fopen(file, "w");
        ck_assert_ptr_nonnull(f);
        fputs(bad[i].text, f);
        fclose(f);
        ck_assert_int_eq(chmod(file, (mode_t)bad[i].mode), 0);
        if (bad[i].uid >= 0)
            ck_assert_int_eq(chown(file, (uid_t)bad[i].uid, (gid_t)-1), 0);
        ck_assert_int_ne(tp_rank_group_create(&o, &g, &err), TP_OK);
        ck_assert_msg(strstr(err.msg, file) && strstr(err.msg, bad[i].why), "%zu: %s", i, err.msg);
        ck_assert(access(path, F_OK) != 0); /* refused before it listens */
    }
    unlink(file);
    o.secret_file = "/nonexistent/tp.key";
    ck_assert_int_ne(tp_rank_group_create(&o, &g, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "rendezvous secret file '/nonexistent/tp.key': cannot open: No such file"), "%s",
                  err.msg);
    o.secret_file = file;
    FILE *f = fopen(file, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "%s\n", group_secret);
    fclose(f);
    ck_assert_int_eq(chmod(file, 0600), 0);
    setenv("TEST_SECRET_FILE", file, 1); /* the rank's: inherited by start_external's child */
    pid_t w1 = start_external(path, "1", "2", 0, NULL);
    unsetenv("TEST_SECRET_FILE");
    ck_assert_msg(tp_rank_group_create(&o, &g, &err) == TP_OK, "%s", err.msg);
    char own[80];
    snprintf(own, sizeof own, "%s.secret", path);
    ck_assert(access(own, F_OK) != 0); /* given a file, the leader writes none */
    tp_rank_group_free(g);
    int ws;
    ck_assert_int_eq(waitpid(w1, &ws, 0), w1);
    ck_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    ck_assert_int_eq(access(file, F_OK), 0); /* the operator's, left alone */
    unlink(file);
}
END_TEST

START_TEST(threads_are_the_same_interface)
{
    tp_rank_group *g;
    tp_err err;
    ck_assert(tp_rank_group_create(&(tp_rank_group_opts){.world = 4}, &g, &err) == TP_OK);
    int lo, hi;
    tp_rank_group_local(g, &lo, &hi);
    ck_assert(lo == 0 && hi == 4 && !tp_rank_group_shared(g) && !tp_rank_group_lost(g));
    ck_assert(tp_rank_group_post(g, "x", 1, &err) == TP_OK); /* nobody to tell */
    tp_rank_group_free(g);
}
END_TEST

/* ------------------------------------------------------------ threads */

static tp_rank_group *thread_group(int world, int cores, int64_t spin_ns)
{
    tp_rank_group *g;
    tp_err err;
    tp_rank_group_opts o = {.mode = TP_GROUP_THREADS, .world = world, .cores = cores, .spin_ns = spin_ns};
    ck_assert_msg(tp_rank_group_create(&o, &g, &err) == TP_OK, "%s", err.msg);
    return g;
}

#define CALLERS 4
#define STEPS_EACH 300

typedef struct {
    tp_rank_group *g;
    pthread_mutex_t *mu; /* run is not reentrant: callers take turns */
    _Atomic int *ran;    /* [rank]: steps rank ran */
    int world, bad;      /* bad: a step returned before a rank ran it */
    int step;            /* the step in flight (under mu) */
    int seen[8];         /* [rank]: the step rank last ran */
} many_ctx;

static tp_status count_rank(void *p, int rank, tp_err *err)
{
    (void)err;
    many_ctx *m = p;
    m->seen[rank] = m->step;
    atomic_fetch_add(&m->ran[rank], 1);
    return TP_OK;
}

static void *caller_main(void *p)
{
    many_ctx *m = p;
    for (int i = 0; i < STEPS_EACH; i++) {
        pthread_mutex_lock(m->mu);
        m->step++;
        tp_err err;
        if (tp_rank_group_run(m->g, count_rank, m, NULL, &err) != TP_OK)
            m->bad++;
        for (int r = 0; r < m->world; r++)
            m->bad += m->seen[r] != m->step;
        pthread_mutex_unlock(m->mu);
    }
    return NULL;
}

/* Every step reaches every rank exactly once and run returns only once all
 * are done, whoever calls it: with this machine's spin policy, sleeping at
 * once (ranks > cores), and spinning long (1 ms) whatever the cores. */
START_TEST(steps_back_to_back_from_several_callers)
{
    struct {
        int cores;
        int64_t spin_ns;
    } cfg[] = {{0, 0}, {1, 0}, {64, 1000 * 1000}};
    for (size_t k = 0; k < sizeof cfg / sizeof cfg[0]; k++) {
        int world = 3;
        tp_rank_group *g = thread_group(world, cfg[k].cores, cfg[k].spin_ns);
        pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
        _Atomic int ran[8] = {0};
        many_ctx m = {.g = g, .mu = &mu, .ran = ran, .world = world};
        pthread_t th[CALLERS];
        for (int i = 0; i < CALLERS; i++)
            ck_assert_int_eq(pthread_create(&th[i], NULL, caller_main, &m), 0);
        for (int i = 0; i < CALLERS; i++)
            pthread_join(th[i], NULL);
        ck_assert_int_eq(m.bad, 0);
        for (int r = 0; r < world; r++)
            ck_assert_int_eq(atomic_load(&ran[r]), CALLERS * STEPS_EACH);
        tp_rank_group_free(g);
    }
}
END_TEST

typedef struct {
    int step;
    int fail_mask;   /* ranks that fail this step */
    int benign_mask; /* ranks whose failure is benign */
    _Atomic int hook_calls;
} fail_ctx;

static tp_rank_group *fail_group;

static tp_status maybe_fail(void *p, int rank, tp_err *err)
{
    fail_ctx *f = p;
    if (!(f->fail_mask >> rank & 1))
        return TP_OK;
    if (f->benign_mask >> rank & 1) {
        tp_rank_group_benign(fail_group, rank);
        return tp_fail(err, TP_INVALID, "bad data at step %d", f->step);
    }
    return tp_fail(err, TP_BACKEND, "boom at step %d", f->step);
}

static void count_hook(void *p) { atomic_fetch_add(&((fail_ctx *)p)->hook_calls, 1); }

/* A rank failing mid-step: the step fails on its error, prefixed with its
 * rank; the fail hook runs once (first failure only, never for a benign
 * one); the next step works. The caller's own rank counts the same. */
START_TEST(a_failing_rank_fails_the_step_once)
{
    tp_rank_group *g = thread_group(3, 0, 0);
    fail_group = g;
    fail_ctx f = {0};
    tp_rank_hooks hooks = {.fail = count_hook, .ctx = &f};
    struct {
        int fail, benign;
        tp_status want;
        const char *msg; /* NULL: either failing rank's */
    } cases[] = {
        {1 << 2, 0, TP_BACKEND, "rank 2: boom at step 1"},
        {1 << 0, 0, TP_BACKEND, "rank 0: boom at step 2"},
        {(1 << 1) | (1 << 2), 0, TP_BACKEND, NULL},
        {1 << 1, 1 << 1, TP_INVALID, "rank 1: bad data at step 4"},
        {0, 0, TP_OK, ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        f.step = (int)k + 1;
        f.fail_mask = cases[k].fail;
        f.benign_mask = cases[k].benign;
        atomic_store(&f.hook_calls, 0);
        tp_err err = {{0}};
        ck_assert_int_eq(tp_rank_group_run(g, maybe_fail, &f, &hooks, &err), cases[k].want);
        if (cases[k].msg && cases[k].want != TP_OK)
            ck_assert_str_eq(err.msg, cases[k].msg);
        if (!cases[k].msg)
            ck_assert_msg(strcmp(err.msg, "rank 1: boom at step 3") == 0 || strcmp(err.msg, "rank 2: boom at step 3") == 0,
                          "%s", err.msg);
        ck_assert_int_eq(atomic_load(&f.hook_calls), cases[k].fail && !cases[k].benign ? 1 : 0);
    }
    tp_rank_group_free(g);
}
END_TEST

/* Rank 1 fails once the test says go; ranks 0 and 2 wait in a barrier of a
 * cpu comm whose abort is the group's fail hook. */
typedef struct {
    tp_rank_group *g;
    cpu_comm *c;
    _Atomic int tid[3];
    _Atomic int go;
    tp_status st[3];
    tp_err err[3];
    tp_status run_st;
    tp_err run_err;
} abort_ctx;

static tp_status barrier_or_fail(void *p, int rank, tp_err *err)
{
    abort_ctx *a = p;
    atomic_store(&a->tid[rank], gettid());
    if (rank != 1) {
        a->st[rank] = cpu_comm_barrier(a->c, rank, &a->err[rank]);
        *err = a->err[rank];
        return a->st[rank];
    }
    while (!atomic_load(&a->go))
        usleep(1000);
    return tp_fail(err, TP_BACKEND, "rank 1 broke");
}

static tp_status every_barrier(void *p, int rank, tp_err *err) { return cpu_comm_barrier(p, rank, err); }

static void abort_comm(void *p) { cpu_comm_abort(((abort_ctx *)p)->c); }

static void *run_abort_step(void *p)
{
    abort_ctx *a = p;
    tp_rank_hooks hooks = {.fail = abort_comm, .ctx = a};
    a->run_st = tp_rank_group_run(a->g, barrier_or_fail, a, &hooks, &a->run_err);
    return NULL;
}

/* state: what ranks 0 and 2 are while they wait ('S' asleep, 'R' spinning). */
static void abort_in_collective(int cores, int64_t spin_ns, int64_t comm_spin_ns, char state)
{
    abort_ctx a = {0};
    a.g = thread_group(3, cores, spin_ns);
    tp_err err;
    a.c = cpu_comm_create(3, &err);
    ck_assert_msg(a.c, "%s", err.msg);
    cpu_comm_set_spin(a.c, comm_spin_ns);
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_abort_step, &a), 0);
    for (int r = 0; r < 3; r++)
        while (!atomic_load(&a.tid[r]))
            usleep(1000);
    for (int r = 0; r < 3; r += 2)
        if (state == 'S')
            ck_assert_msg(tu_thread_reaches(atomic_load(&a.tid[r]), 'S', 5000), "rank %d does not sleep", r);
        else
            ck_assert_msg(tu_thread_stays(atomic_load(&a.tid[r]), 'R', 100), "rank %d does not spin", r);
    int64_t t0 = tp_now_ns();
    atomic_store(&a.go, 1);
    pthread_join(th, NULL);
    /* the abort ends a spin at once, not when its budget runs out */
    ck_assert_int_lt(tp_now_ns() - t0, comm_spin_ns / 2 + 5000000000LL);
    ck_assert_int_eq(a.run_st, TP_BACKEND);
    ck_assert_str_eq(a.run_err.msg, "rank 1: rank 1 broke");
    for (int r = 0; r < 3; r += 2) {
        ck_assert_int_eq(a.st[r], TP_BACKEND);
        ck_assert_str_eq(a.err[r].msg, "collective aborted: a peer rank failed");
    }
    /* after a reset the group and the comm work again */
    cpu_comm_reset(a.c);
    ck_assert_msg(tp_rank_group_run(a.g, every_barrier, a.c, NULL, &err) == TP_OK, "%s", err.msg);
    cpu_comm_free(a.c);
    tp_rank_group_free(a.g);
}

START_TEST(an_abort_reaches_ranks_sleeping_in_a_collective)
{
    abort_in_collective(1, 0, 0, 'S');
}
END_TEST

START_TEST(an_abort_reaches_ranks_spinning_in_a_collective)
{
    /* budgets far longer than the test: only the abort can end the spins */
    abort_in_collective(64, 60 * 1000000000LL, 60 * 1000000000LL, 'R');
}
END_TEST

/* ------------------------------------------------------------ serial steps */

typedef struct {
    cpu_comm *c;
    _Atomic int tid[3];
    int arrived[3], bad;
    int64_t slow_us; /* rank 1 takes this long */
} serial_ctx;

/* Three barriers; after each, every rank must have arrived at it. */
static tp_status barriers_and_tids(void *p, int rank, tp_err *err)
{
    serial_ctx *s = p;
    atomic_store(&s->tid[rank], gettid());
    /* slow in CPU time, which is what a serial step is timed by (a sleep
     * would not count) */
    for (int64_t t0 = tp_now_ns(); rank == 1 && tp_now_ns() - t0 < s->slow_us * 1000;)
        ;
    for (int k = 0; k < 3; k++) {
        s->arrived[rank]++;
        tp_status st = cpu_comm_barrier(s->c, rank, err);
        if (st != TP_OK)
            return st;
        for (int r = 0; r < 3; r++)
            s->bad += s->arrived[r] < s->arrived[rank];
    }
    return TP_OK;
}

static tp_rank_group *serial_group(int max_us, serial_ctx *s)
{
    tp_rank_group *g = thread_group(3, 0, 0);
    tp_err err;
    ck_assert_msg(tp_rank_group_set_serial(g, max_us, &err) == TP_OK, "%s", err.msg);
    s->c = cpu_comm_create(3, &err);
    ck_assert_msg(s->c, "%s", err.msg);
    return g;
}

static int ran_on_caller(serial_ctx *s)
{
    int me = gettid(), all = 1;
    for (int r = 0; r < 3; r++)
        all &= atomic_load(&s->tid[r]) == me;
    return all;
}

/* Whichever mode the policy picks for a step (serial_policy.c, tested on
 * its own with made-up times), a serial step runs every rank on the
 * caller's thread, a threads step runs them elsewhere, and the barriers
 * between ranks hold either way. */
START_TEST(serial_steps_run_every_rank_on_the_caller)
{
    serial_ctx s = {0};
    tp_rank_group *g = serial_group(100 * 1000, &s); /* 100 ms: every step here may run serially */
    for (int i = 0; i < 100; i++) {
        tp_err err;
        uint64_t before = tp_rank_group_serial_steps(g);
        ck_assert_msg(tp_rank_group_run(g, barriers_and_tids, &s, NULL, &err) == TP_OK, "%s", err.msg);
        int serial = tp_rank_group_serial_steps(g) > before;
        ck_assert_int_eq(ran_on_caller(&s), serial);
        if (i == 0)
            ck_assert(serial); /* nothing measured yet: serial first */
    }
    ck_assert_int_eq(s.bad, 0);
    ck_assert_int_eq(s.arrived[0], 300);
    tp_rank_group_free(g);
    cpu_comm_free(s.c);
}
END_TEST

/* A serial step over the limit sends the next steps to the rank threads,
 * and none is tried serially while the threads' steps, times the ranks,
 * stay over it; once steps are short a serial probe runs within a few
 * dozen steps. */
START_TEST(long_steps_go_to_the_threads_and_short_ones_are_probed)
{
    serial_ctx s = {.slow_us = 20 * 1000};
    tp_rank_group *g = serial_group(5 * 1000, &s);
    tp_err err;
    for (int k = 0; k < 20; k++) {
        ck_assert(tp_rank_group_run(g, barriers_and_tids, &s, NULL, &err) == TP_OK);
        ck_assert_int_eq(ran_on_caller(&s), k == 0); /* the first measures */
    }
    ck_assert_uint_eq(tp_rank_group_serial_steps(g), 1);
    s.slow_us = 0;
    int steps = 0;
    while (tp_rank_group_serial_steps(g) == 1 && steps < 100) {
        ck_assert(tp_rank_group_run(g, barriers_and_tids, &s, NULL, &err) == TP_OK);
        steps++;
    }
    ck_assert_int_lt(steps, 100);
    ck_assert(ran_on_caller(&s));
    ck_assert_int_eq(s.bad, 0);
    tp_rank_group_free(g);
    cpu_comm_free(s.c);
}
END_TEST

/* Each step size decides on its own: 8-row steps over the limit go to
 * the rank threads, while the 1-row steps between them, short, stay
 * serial (one policy for both sent them to the threads with the long
 * ones). */
START_TEST(step_sizes_choose_their_mode_apart)
{
    serial_ctx s = {0};
    tp_rank_group *g = serial_group(5 * 1000, &s);
    tp_err err;
    for (int k = 0; k < 10; k++) {
        s.slow_us = 20 * 1000;
        ck_assert(tp_rank_group_run_rows(g, 8, barriers_and_tids, &s, NULL, &err) == TP_OK);
        ck_assert_int_eq(ran_on_caller(&s), k == 0); /* the first measures */
        s.slow_us = 0;
        ck_assert(tp_rank_group_run_rows(g, 1, barriers_and_tids, &s, NULL, &err) == TP_OK);
        ck_assert(ran_on_caller(&s));
    }
    ck_assert_uint_eq(tp_rank_group_serial_steps(g), 11);
    ck_assert_int_eq(s.bad, 0);
    tp_rank_group_free(g);
    cpu_comm_free(s.c);
}
END_TEST

/* Rank 1 fails while ranks 0 and 2 wait for it in a barrier: the abort
 * (the group's fail hook) ends their waits, as with threads. */
START_TEST(a_failing_rank_fails_a_serial_step)
{
    abort_ctx a = {0};
    a.g = thread_group(3, 0, 0);
    tp_err err;
    ck_assert(tp_rank_group_set_serial(a.g, 100 * 1000, &err) == TP_OK);
    a.c = cpu_comm_create(3, &err);
    atomic_store(&a.go, 1);
    run_abort_step(&a);
    ck_assert_int_eq(a.run_st, TP_BACKEND);
    ck_assert_str_eq(a.run_err.msg, "rank 1: rank 1 broke");
    for (int r = 0; r < 3; r += 2)
        ck_assert_str_eq(a.err[r].msg, "collective aborted: a peer rank failed");
    cpu_comm_reset(a.c);
    ck_assert_msg(tp_rank_group_run(a.g, every_barrier, a.c, NULL, &err) == TP_OK, "%s", err.msg);
    ck_assert_uint_eq(tp_rank_group_serial_steps(a.g), 2);
    cpu_comm_free(a.c);
    tp_rank_group_free(a.g);
}
END_TEST

static tp_status note_rank_tid(void *p, int rank, tp_err *err)
{
    (void)err;
    ((_Atomic int *)p)[rank] = gettid();
    return TP_OK;
}

/* One rank already runs on the caller: serial steps have nothing to save. */
START_TEST(a_single_rank_never_runs_serially)
{
    tp_rank_group *g = thread_group(1, 0, 0);
    tp_err err;
    ck_assert(tp_rank_group_set_serial(g, 100 * 1000, &err) == TP_OK);
    _Atomic int tid[1] = {0};
    ck_assert(tp_rank_group_run(g, note_rank_tid, tid, NULL, &err) == TP_OK);
    ck_assert_int_eq(tid[0], gettid());
    ck_assert_uint_eq(tp_rank_group_serial_steps(g), 0);
    tp_rank_group_free(g);
}
END_TEST

static tp_status rank1_skips_the_barrier(void *p, int rank, tp_err *err)
{
    return rank == 1 ? TP_OK : cpu_comm_barrier(p, rank, err);
}

/* Ranks that disagree on the step's collectives (rank 1 skips a barrier):
 * a hang with threads; serial, the step fails with why. */
START_TEST(ranks_that_disagree_fail_a_serial_step_instead_of_hanging)
{
    serial_ctx s = {0};
    tp_rank_group *g = serial_group(100 * 1000, &s);
    tp_err err;
    ck_assert_int_eq(tp_rank_group_run(g, rank1_skips_the_barrier, s.c, NULL, &err), TP_INTERNAL);
    ck_assert_msg(strstr(err.msg, "disagree on the step's collectives"), "%s", err.msg);
    tp_rank_group_free(g);
    cpu_comm_free(s.c);
}
END_TEST

/* Rank 1 holds the step until go; rank 0 (the caller) is done at once and
 * waits for it. Then rank 1 waits for the next step. */
typedef struct {
    tp_rank_group *g;
    _Atomic int go, caller_tid, rank1_tid;
    tp_status st;
} hold_ctx;

static tp_status hold_rank1(void *p, int rank, tp_err *err)
{
    (void)err;
    hold_ctx *h = p;
    if (rank == 1) {
        atomic_store(&h->rank1_tid, gettid());
        while (!atomic_load(&h->go))
            usleep(1000);
    }
    return TP_OK;
}

static void *run_hold_step(void *p)
{
    hold_ctx *h = p;
    atomic_store(&h->caller_tid, gettid());
    tp_err err;
    h->st = tp_rank_group_run(h->g, hold_rank1, h, NULL, &err);
    return NULL;
}

/* state: what the caller waiting for rank 1, then rank 1 waiting for the
 * next step, are ('S' asleep, 'R' spinning). */
static void waits_are(int cores, char state)
{
    hold_ctx h = {.g = thread_group(2, cores, 60 * 1000000000LL)};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, run_hold_step, &h), 0);
    while (!atomic_load(&h.rank1_tid) || !atomic_load(&h.caller_tid))
        usleep(1000);
    int caller = atomic_load(&h.caller_tid), rank1 = atomic_load(&h.rank1_tid);
    if (state == 'S')
        ck_assert_msg(tu_thread_reaches(caller, 'S', 5000), "the caller spins");
    else
        ck_assert_msg(tu_thread_stays(caller, 'R', 100), "the caller does not spin");
    atomic_store(&h.go, 1);
    pthread_join(th, NULL);
    ck_assert_int_eq(h.st, TP_OK);
    if (state == 'S')
        ck_assert_msg(tu_thread_reaches(rank1, 'S', 5000), "rank 1 spins for the next step");
    else
        ck_assert_msg(tu_thread_stays(rank1, 'R', 100), "rank 1 does not spin for the next step");
    /* the next step and the teardown end the spin (or the sleep) */
    tp_err err;
    ck_assert_int_eq(tp_rank_group_run(h.g, hold_rank1, &h, NULL, &err), TP_OK);
    int64_t t0 = tp_now_ns();
    tp_rank_group_free(h.g);
    ck_assert_int_lt(tp_now_ns() - t0, 5000000000LL);
}

START_TEST(no_spin_when_the_ranks_outnumber_the_cores)
{
    waits_are(1, 'S'); /* a 60 s budget, but 2 ranks on 1 core: never used */
}
END_TEST

START_TEST(waits_spin_when_every_rank_has_a_core)
{
    waits_are(2, 'R');
}
END_TEST

/* A pre-wake (a request arriving at an idle server) makes a sleeping rank
 * thread spin for the coming step — then sleep again when none comes — and
 * the next step runs as usual; where ranks may not spin it wakes nobody. */
static void prewake_makes_rank1(int cores, char state)
{
    hold_ctx h = {.g = thread_group(2, cores, 300 * 1000000LL), .go = 1};
    tp_err err;
    ck_assert_int_eq(tp_rank_group_run(h.g, hold_rank1, &h, NULL, &err), TP_OK);
    int rank1 = atomic_load(&h.rank1_tid);
    ck_assert_msg(tu_thread_reaches(rank1, 'S', 5000), "rank 1 never sleeps between steps");
    tp_rank_group_prewake(h.g);
    if (state == 'R') {
        ck_assert_msg(tu_thread_reaches(rank1, 'R', 200), "a pre-woken rank 1 does not spin");
        ck_assert_msg(tu_thread_reaches(rank1, 'S', 5000), "rank 1 spins past its budget");
    } else {
        ck_assert_msg(tu_thread_stays(rank1, 'S', 100), "rank 1 woke on a shared core");
    }
    ck_assert_int_eq(tp_rank_group_run(h.g, hold_rank1, &h, NULL, &err), TP_OK);
    tp_rank_group_free(h.g);
}

START_TEST(a_prewake_spins_the_ranks_for_the_coming_step)
{
    prewake_makes_rank1(2, 'R');
    prewake_makes_rank1(1, 'S');
}
END_TEST

static Suite *rank_group_suite(void)
{
    Suite *s = suite_create("rank_group");
    TCase *t = tcase_create("processes");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, steps_reach_every_process_in_lockstep);
    tcase_add_test(t, a_failure_is_the_same_error_in_every_process);
    tcase_add_test(t, a_dead_worker_fails_the_step_and_the_group);
    tcase_add_test(t, an_idle_group_sleeps_and_hears_of_a_death_at_once);
    tcase_add_test(t, a_hung_worker_loses_the_group_at_the_step_deadline);
    tcase_add_test(t, a_worker_that_exits_before_joining_is_an_error);
    tcase_add_test(t, external_ranks_join_at_the_rendezvous);
    tcase_add_test(t, the_leader_checks_each_hello);
    tcase_add_test(t, the_leader_checks_each_joiners_uid);
    tcase_add_test(t, impostors_at_the_rendezvous_take_no_rank);
    tcase_add_test(t, a_leader_checks_its_secret_file);
    tcase_add_test(t, threads_are_the_same_interface);
    tcase_add_test(t, every_process_runs_its_rank_on_the_caller);
    tcase_add_test(t, a_failure_elsewhere_wakes_a_blocked_rank);
    tcase_add_test(t, a_backend_fault_wakes_the_blocked_rank);
    tcase_add_test(t, a_prewake_spins_the_workers_for_the_next_message);
    tcase_add_test(t, a_worker_keeps_spinning_for_commands_a_little_slower_than_its_spin);
    suite_add_tcase(s, t);
    TCase *th = tcase_create("threads");
    tcase_set_timeout(th, 60);
    tcase_add_test(th, steps_back_to_back_from_several_callers);
    tcase_add_test(th, a_failing_rank_fails_the_step_once);
    tcase_add_test(th, an_abort_reaches_ranks_sleeping_in_a_collective);
    tcase_add_test(th, an_abort_reaches_ranks_spinning_in_a_collective);
    tcase_add_test(th, no_spin_when_the_ranks_outnumber_the_cores);
    tcase_add_test(th, waits_spin_when_every_rank_has_a_core);
    tcase_add_test(th, a_prewake_spins_the_ranks_for_the_coming_step);
    suite_add_tcase(s, th);
    TCase *se = tcase_create("serial");
    tcase_set_timeout(se, 60);
    tcase_add_test(se, serial_steps_run_every_rank_on_the_caller);
    tcase_add_test(se, long_steps_go_to_the_threads_and_short_ones_are_probed);
    tcase_add_test(se, step_sizes_choose_their_mode_apart);
    tcase_add_test(se, a_failing_rank_fails_a_serial_step);
    tcase_add_test(se, ranks_that_disagree_fail_a_serial_step_instead_of_hanging);
    tcase_add_test(se, a_single_rank_never_runs_serially);
    suite_add_tcase(s, se);
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "worker") == 0)
        return worker_main(argv[2]);
    return tp_check_run(rank_group_suite()); /* argv: workers are this binary */
}
