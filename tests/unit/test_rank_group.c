/* The process rank group: workers are this test binary run again as
 * "test_rank_group worker SCENARIO" (that is how `tpserve worker` runs).
 * Every step reaches every process in lockstep through the shared memory;
 * a failure anywhere is the same error everywhere; a dead worker makes the
 * step fail naming its rank and signal, without hanging a rank that waits
 * for it; external ranks join over the rendezvous socket and bad ones are
 * refused. */
#include <check.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "rank_group.h"

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
    words(c->sh)[rank] = 1000 * c->step + rank;
    return TP_OK;
}

/* Worker side: follow the leader's commands until it quits. */
static int worker_main(const char *scenario)
{
    tp_rank_group_opts o = {.mode = TP_GROUP_WORKER, .rank = atoi(getenv("TP_RANK")),
                            .world = atoi(getenv("TP_WORLD_SIZE")), .rendezvous = getenv("TEST_RENDEZVOUS")};
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

static tp_rank_group *leader(int world, const char *scenario)
{
    argv_worker[2] = (char *)scenario;
    tp_rank_group_opts o = {.mode = TP_GROUP_PROCESSES, .world = world, .worker_argv = argv_worker,
                            .staging_bytes = 1 << 20, .heap_bytes = 1 << 20, .timeout_ms = 20000,
                            .step_timeout_ms = strcmp(scenario, "hang") == 0 ? 500 : 0};
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

START_TEST(a_dead_worker_fails_the_step_and_the_group)
{
    tp_rank_group *g = leader(2, "die");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "die", .step = 1};
    tp_rank_hooks hooks = {NULL, release, NULL};
    tp_err err;
    ck_assert(tp_rank_group_post(g, &c.step, sizeof c.step, &err) == TP_OK);
    alarm(20); /* a hang fails the test instead of the whole suite */
    tp_status st = tp_rank_group_run(g, wait_for_peer, &c, &hooks, &err);
    alarm(0);
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

START_TEST(a_hung_worker_loses_the_group_at_the_step_deadline)
{
    tp_rank_group *g = leader(2, "hang");
    step_ctx c = {.sh = tp_rank_group_shared(g), .scenario = "hang", .step = 1};
    tp_rank_hooks hooks = {NULL, release, NULL};
    tp_err err;
    atomic_store(&released, 0);
    ck_assert(tp_rank_group_post(g, &c.step, sizeof c.step, &err) == TP_OK);
    alarm(20);
    tp_status st = tp_rank_group_run(g, wait_for_peer, &c, &hooks, &err);
    alarm(0);
    ck_assert_int_eq(st, TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "rank 1 (pid") && strstr(err.msg, "did not finish a step within 500 ms"), "%s",
                  err.msg);
    ck_assert(atomic_load(&released));
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

static Suite *rank_group_suite(void)
{
    Suite *s = suite_create("rank_group");
    TCase *t = tcase_create("processes");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, steps_reach_every_process_in_lockstep);
    tcase_add_test(t, a_failure_is_the_same_error_in_every_process);
    tcase_add_test(t, a_dead_worker_fails_the_step_and_the_group);
    tcase_add_test(t, a_hung_worker_loses_the_group_at_the_step_deadline);
    tcase_add_test(t, a_worker_that_exits_before_joining_is_an_error);
    tcase_add_test(t, external_ranks_join_at_the_rendezvous);
    tcase_add_test(t, threads_are_the_same_interface);
    suite_add_tcase(s, t);
    return s;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "worker") == 0)
        return worker_main(argv[2]);
    return tp_check_run(rank_group_suite()); /* argv: workers are this binary */
}
