/* test_batcher.c — the dynamic batcher on real engines: concurrent
 * submitters get exactly their own rows back (checked against each request
 * run alone), batches really form, the queue bound (503), deadlines (504,
 * never executed), bad requests refused alone, a failing batch failing each
 * of its requests, graphs that cannot batch running one by one, cancel, and
 * the drain on free. Tests that must not depend on timing use a 10 s queue
 * delay, so a batch forms only when it is full or the batcher stops. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend.h"
#include "batcher.h"
#include "check_main.h"
#include "clock.h"
#include "kserve.h"
#include "metrics.h"
#include "testutil.h"

#define ROW_FLOATS (8 * 32) /* mlp_sp_tp2: x and y are [-1, 8, 32] */
#define LONG_DELAY_US 10000000

static const char *mlp_path(char *path, size_t size)
{
    const char *d = getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs";
    snprintf(path, size, "%s/mlp_sp_tp2.json", d);
    return path;
}

static tp_engine *open_mlp(void)
{
    char path[512];
    return tu_engine(mlp_path(path, sizeof path), 1, 0);
}

/* The same with serial steps (every rank a fiber of the calling thread),
 * as `tpserve serve` runs it: the first steps run so (nothing measured yet,
 * engine/serial_policy.h), whatever the timing. */
static tp_engine *open_mlp_serial(void)
{
    char path[512];
    tp_engine_opts o = {.backend = "cpu", .serial_step_max_us = 1000000};
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(mlp_path(path, sizeof path), &o, &e, &err) == TP_OK, "%s", err.msg);
    return e;
}

static tp_batcher *new_batcher(tp_engine *e, int64_t max_batch, int64_t delay_us, int max_queue,
                               tp_metrics *m)
{
    tp_batcher_opts o = {max_batch, delay_us, max_queue, m, NULL, 0, 0};
    tp_batcher *b;
    tp_err err = {{0}};
    ck_assert_msg(tp_batcher_create(e, &o, &b, &err) == TP_OK, "%s", err.msg);
    return b;
}

static tp_engine_stats stats(tp_engine *e)
{
    tp_engine_stats s;
    tp_engine_get_stats(e, &s);
    return s;
}

/* x of rows rows, deterministic per seed; data is malloc'ed (owned by t). */
static tp_host_tensor make_x(int64_t rows, unsigned seed)
{
    int64_t shape[3] = {rows, 8, 32};
    float *buf = malloc((size_t)(rows * ROW_FLOATS) * sizeof *buf + 1);
    tu_fill(buf, rows * ROW_FLOATS, seed);
    return tu_f32("x", buf, 3, shape);
}

/* ---- concurrent submitters ---------------------------------------------- */

#define MAX_REQ 4

typedef struct {
    tp_batcher *b;
    pthread_barrier_t *start;
    int n_req;
    tp_host_tensor in[MAX_REQ];
    tp_host_tensor *ref[MAX_REQ]; /* the request run alone */
    int n_ref;
    tp_status st[MAX_REQ];
    char msg[MAX_REQ][1024];
    double diff[MAX_REQ];
    int batched_with_others;
} client;

static void *client_main(void *arg)
{
    client *c = arg;
    pthread_barrier_wait(c->start);
    for (int r = 0; r < c->n_req; r++) {
        tp_host_tensor *out;
        int n_out;
        tp_batch_info info = {0};
        tp_err err = {{0}};
        c->st[r] = tp_batcher_infer(c->b, &c->in[r], 1, 0, &out, &n_out, &info, &err);
        snprintf(c->msg[r], sizeof c->msg[r], "%s", err.msg);
        if (c->st[r] != TP_OK)
            continue;
        /* shapes first: tu_rel_diff needs equal sizes */
        int same = n_out == 1 && out[0].nbytes == c->ref[r][0].nbytes &&
                   out[0].shape[0] == c->in[r].shape[0];
        c->diff[r] = same ? tu_rel_diff(out, c->ref[r], 1) : 1e9;
        c->batched_with_others |= info.batch_requests > 1;
        tp_host_tensors_free(out, n_out);
    }
    return NULL;
}

/* Runs n clients concurrently; references computed first on the bare engine. */
static void run_clients(tp_engine *e, tp_batcher *b, client *c, int n)
{
    pthread_barrier_t start;
    pthread_t th[n];
    pthread_barrier_init(&start, NULL, (unsigned)n);
    for (int i = 0; i < n; i++) {
        c[i].b = b;
        c[i].start = &start;
        for (int r = 0; r < c[i].n_req; r++)
            if (c[i].st[r] == TP_OK) /* requests meant to be bad have no reference */
                c[i].ref[r] = tu_infer(e, &c[i].in[r], 1, &c[i].n_ref);
    }
    for (int i = 0; i < n; i++)
        pthread_create(&th[i], NULL, client_main, &c[i]);
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
}

static void free_clients(client *c, int n)
{
    for (int i = 0; i < n; i++)
        for (int r = 0; r < c[i].n_req; r++) {
            free(c[i].in[r].data);
            tp_host_tensors_free(c[i].ref[r], c[i].ref[r] ? c[i].n_ref : 0);
        }
}

/* 12 clients x 4 requests of 1..3 rows (one client sends 20 rows, over
 * max_batch): each answer equals its request run alone, and batching cut
 * the engine executions below the request count. */
START_TEST(concurrent_clients_get_their_own_rows)
{
    enum { N = 12 };
    tp_engine *e = open_mlp();
    client c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].n_req = MAX_REQ;
        for (int r = 0; r < MAX_REQ; r++)
            c[i].in[r] = make_x(i == 7 && r == 1 ? 20 : 1 + (i + r) % 3, (unsigned)(100 * i + r));
    }
    tp_batcher *b = new_batcher(e, 0, 5000, 0, NULL);
    ck_assert_int_eq(tp_batcher_max_batch(b), 16); /* 0: the largest bucket */
    ck_assert_int_eq(tp_batcher_batching(b), 1);
    run_clients(e, b, c, N);
    tp_engine_stats before = stats(e);
    tp_batcher_free(b);
    int batched = 0;
    for (int i = 0; i < N; i++) {
        batched += c[i].batched_with_others;
        for (int r = 0; r < MAX_REQ; r++) {
            ck_assert_msg(c[i].st[r] == TP_OK, "client %d request %d: %s", i, r, c[i].msg[r]);
            ck_assert_msg(c[i].diff[r] <= TU_RTOL_REORDER, "client %d request %d: rows differ from the "
                          "request run alone (rel diff %g)", i, r, c[i].diff[r]);
        }
    }
    /* N * MAX_REQ references ran alone first (the 20-row one in 2 executions) */
    uint64_t alone = N * MAX_REQ + 1, batched_runs = before.executions - alone;
    ck_assert_msg(batched_runs < N * MAX_REQ, "%llu engine executions for %d requests",
                  (unsigned long long)batched_runs, N * MAX_REQ);
    ck_assert_int_gt(batched, 0);
    free_clients(c, N);
    tp_engine_free(e);
}
END_TEST

/* Exactly max_batch rows from 8 clients form one batch, one execution. */
START_TEST(full_batch_runs_once)
{
    enum { N = 8 };
    tp_engine *e = open_mlp();
    tp_metrics *m = tp_metrics_create();
    client c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].n_req = 1;
        c[i].in[0] = make_x(1, (unsigned)(7 + i));
    }
    tp_batcher *b = new_batcher(e, N, LONG_DELAY_US, 0, m);
    tp_engine_stats s0 = stats(e);
    uint64_t refs = N; /* run_clients computes N references first */
    run_clients(e, b, c, N);
    tp_engine_stats s1 = stats(e);
    ck_assert_uint_eq(s1.executions - s0.executions - refs, 1);
    ck_assert_uint_eq(s1.bucket_runs[3] - s0.bucket_runs[3], 1); /* bucket 8 */
    for (int i = 0; i < N; i++) {
        ck_assert_msg(c[i].st[0] == TP_OK, "client %d: %s", i, c[i].msg[0]);
        ck_assert_msg(c[i].diff[0] <= TU_RTOL_REORDER, "client %d got other rows (%g)", i, c[i].diff[0]);
        ck_assert(c[i].batched_with_others);
    }
    char *text = tp_metrics_render(m, NULL);
    ck_assert_ptr_nonnull(strstr(text, "\ntpserve_batch_count_total 1\n"));
    ck_assert_ptr_nonnull(strstr(text, "\ntpserve_inference_count_total 8\n"));
    ck_assert_ptr_nonnull(strstr(text, "tpserve_batch_size_bucket{le=\"4\"} 0\n"));
    ck_assert_ptr_nonnull(strstr(text, "tpserve_batch_size_bucket{le=\"8\"} 1\n"));
    ck_assert_ptr_nonnull(strstr(text, "tpserve_queue_duration_seconds_count 8\n"));
    free(text);
    tp_batcher_free(b);
    tp_metrics_free(m);
    free_clients(c, N);
    tp_engine_free(e);
}
END_TEST

/* One client sends a wrong shape, one a wrong datatype, one zero rows:
 * each is refused alone (400 material) while the rest are served. */
START_TEST(bad_request_in_a_crowd)
{
    enum { N = 8 };
    tp_engine *e = open_mlp();
    client c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].n_req = 1;
        c[i].in[0] = make_x(2, (unsigned)(50 + i));
    }
    c[2].in[0].shape[2] = 16;
    c[2].in[0].nbytes /= 2;
    c[2].st[0] = TP_INVALID; /* marks "no reference" for run_clients */
    c[4].in[0].dtype = TP_I32;
    c[4].st[0] = TP_INVALID;
    c[6].in[0].shape[0] = 0;
    c[6].in[0].nbytes = 0;
    c[6].st[0] = TP_INVALID;
    tp_batcher *b = new_batcher(e, 0, 20000, 0, NULL);
    run_clients(e, b, c, N);
    tp_batcher_free(b);
    const char *want[N] = {[2] = "input 'x': shape [2, 8, 16] does not match model shape [-1, 8, 32]",
                           [4] = "input 'x': datatype INT32 does not match model datatype FP32",
                           [6] = "input 'x': shape [0, 8, 32] has no elements"};
    for (int i = 0; i < N; i++) {
        if (want[i]) {
            ck_assert_int_eq(c[i].st[0], TP_INVALID);
            ck_assert_msg(strstr(c[i].msg[0], want[i]), "client %d: %s", i, c[i].msg[0]);
        } else {
            ck_assert_msg(c[i].st[0] == TP_OK, "client %d: %s", i, c[i].msg[0]);
            ck_assert_msg(c[i].diff[0] <= TU_RTOL_REORDER, "client %d got other rows", i);
        }
    }
    free_clients(c, N);
    tp_engine_free(e);
}
END_TEST

/* ---- asynchronous requests ---------------------------------------------- */

typedef struct {
    pthread_mutex_t *mu;
    pthread_cond_t *cv;
    int *n_done;
    int done;
    tp_status st;
    char msg[1024];
    int64_t rows;
    double t_done;
    pthread_t thread; /* the one done ran on (inline: the submitter) */
} slot;

static void slot_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                      const tp_batch_info *info)
{
    (void)info;
    slot *s = ctx;
    pthread_mutex_lock(s->mu);
    s->st = st;
    s->rows = outs ? outs[0].shape[0] : -1;
    snprintf(s->msg, sizeof s->msg, "%s", st == TP_OK ? "" : err->msg);
    s->t_done = tp_now_s();
    s->thread = pthread_self();
    s->done = 1;
    (*s->n_done)++;
    pthread_cond_broadcast(s->cv);
    pthread_mutex_unlock(s->mu);
    tp_host_tensors_free(outs, n_outs);
}

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_done;

static slot new_slot(void) { return (slot){&g_mu, &g_cv, &g_done, 0, TP_OK, "", 0, 0, 0}; }

static tp_status submit(tp_batcher *b, tp_host_tensor *x, slot *s, double t_arrival,
                        int64_t timeout_us, tp_err *err)
{
    tp_batch_req r = {x, 1, t_arrival, timeout_us, "parameters.timeout", slot_done, s, 0, 0, 0, 0};
    return tp_batcher_submit(b, &r, err);
}

static void wait_done(slot *s)
{
    pthread_mutex_lock(&g_mu);
    while (!s->done)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
}

/* An idle batcher runs a request on the submitting thread (done is called
 * before submit returns) while recent steps were within inline_max_us; once
 * a step took longer, requests go to the batcher thread, so a slow model
 * never holds up a submitter (an HTTP thread) again. inline_max_us < 0:
 * never inline. */
static int ran_on_submitter(tp_batcher *b, tp_host_tensor *x)
{
    slot s = new_slot();
    tp_err err = {{0}};
    ck_assert_int_eq(submit(b, x, &s, 0, 0, &err), TP_OK);
    int inline_ = s.done && pthread_equal(s.thread, pthread_self());
    wait_done(&s);
    ck_assert_int_eq(s.st, TP_OK);
    return inline_;
}

/* A batcher of 16 rows, no queue delay, the given inline_max_us. */
static tp_batcher *inline_batcher(tp_engine *e, int64_t inline_max_us)
{
    tp_batcher_opts o = {16, 0, 0, NULL, NULL, inline_max_us, 0};
    tp_batcher *b;
    tp_err err = {{0}};
    ck_assert_msg(tp_batcher_create(e, &o, &b, &err) == TP_OK, "%s", err.msg);
    return b;
}

START_TEST(inline_run_only_while_steps_are_short)
{
    tp_engine *e = open_mlp();
    tp_host_tensor x = make_x(1, 9);
    /* no limit: every idle request runs on the submitter */
    tp_batcher *b = inline_batcher(e, 0);
    for (int i = 0; i < 3; i++)
        ck_assert(ran_on_submitter(b, &x));
    tp_batcher_free(b);
    /* 1 us: the first step (no history yet) runs inline and is longer than
     * that, so the next ones go to the batcher thread */
    b = inline_batcher(e, 1);
    ck_assert(ran_on_submitter(b, &x));
    ck_assert(!ran_on_submitter(b, &x));
    ck_assert(!ran_on_submitter(b, &x));
    tp_batcher_free(b);
    b = inline_batcher(e, -1);
    ck_assert(!ran_on_submitter(b, &x));
    tp_batcher_free(b);
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* A done callback that submits one more request (its ctx: the batcher and
 * the slot), as a client answered inline would send its next request while
 * the engine is still busy: it queues behind the running batch. */
typedef struct {
    slot s;
    tp_batcher *b;
    tp_host_tensor *x;
    slot *next;
} chain;

static void chain_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                       const tp_batch_info *info)
{
    chain *c = ctx;
    tp_err e2 = {{0}};
    ck_assert_int_eq(submit(c->b, c->x, c->next, 0, 0, &e2), TP_OK);
    slot_done(&c->s, st, outs, n_outs, err, info);
}

/* A request left waiting when a batch ended means the engine is busy: the
 * next idle moment's request goes to the batcher thread (where it can batch
 * with others) instead of running alone on its submitter; after quiet
 * batches the inline path comes back. Without the rule the request after
 * the busy batch would run inline (the batcher is idle by then). */
START_TEST(inline_run_stops_while_requests_pile_up)
{
    tp_engine *e = open_mlp();
    tp_host_tensor x = make_x(1, 9);
    tp_batcher *b = inline_batcher(e, 0);
    tp_err err = {{0}};
    ck_assert(ran_on_submitter(b, &x));
    slot queued = new_slot();
    chain c = {new_slot(), b, &x, &queued};
    tp_batch_req r = {&x, 1, 0, 0, "parameters.timeout", chain_done, &c, 0, 0, 0, 0};
    ck_assert_int_eq(tp_batcher_submit(b, &r, &err), TP_OK);
    ck_assert(c.s.done && pthread_equal(c.s.thread, pthread_self())); /* ran inline */
    wait_done(&queued);
    ck_assert_int_eq(queued.st, TP_OK);
    ck_assert(!ran_on_submitter(b, &x));
    /* A request sent the moment the previous answer arrives may find that
     * batch not yet ended on the batcher thread (its done callback comes
     * first) and count as waiting behind it, as a client that fast would:
     * a pause between requests, as a network round trip gives, lets the
     * batches end quiet. Only the number of tries is bounded, not time. */
    int back = 0;
    for (int i = 0; i < 20 && !back; i++) {
        nanosleep(&(struct timespec){0, 5000000}, NULL);
        back = ran_on_submitter(b, &x);
    }
    ck_assert_msg(back, "quiet batches did not bring the inline path back");
    tp_batcher_free(b);
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* ---- instances ---------------------------------------------------------- */

/* A batch's done callback (on the thread running it, its instance still
 * taken) submits another request and notes whether that one was answered
 * before submit returned, on this same thread. */
typedef struct {
    slot s, inner;
    tp_batcher *b;
    tp_host_tensor *x;
    int inner_inline;
} nested;

static void nested_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                        const tp_batch_info *info)
{
    nested *n = ctx;
    tp_err e2 = {{0}};
    ck_assert_int_eq(submit(n->b, n->x, &n->inner, 0, 0, &e2), TP_OK);
    n->inner_inline = n->inner.done && pthread_equal(n->inner.thread, pthread_self());
    slot_done(&n->s, st, outs, n_outs, err, info);
}

/* Two instances of the model (Triton's instance_group count): a request
 * submitted while instance 0 runs a batch (from that batch's own callback)
 * runs at once on instance 1, on the submitting thread, and gives the
 * answer of the request run alone; the counters add up both. With one
 * instance the same request waits for the batcher thread
 * (inline_run_stops_while_requests_pile_up). 0 or 9 instances are refused. */
START_TEST(second_instance_runs_while_the_first_is_busy)
{
    tp_engine *e[2] = {open_mlp(), open_mlp()};
    tp_host_tensor x = make_x(1, 9);
    tp_batcher_opts o = {16, 0, 0, NULL, NULL, 0, 0};
    tp_batcher *b;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_batcher_create_instances(e, 0, &o, &b, &err), TP_INVALID);
    ck_assert_int_eq(tp_batcher_create_instances(e, TP_BATCHER_MAX_INSTANCES + 1, &o, &b, &err), TP_INVALID);
    ck_assert_msg(tp_batcher_create_instances(e, 2, &o, &b, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(tp_batcher_instances(b), 2);
    nested n = {new_slot(), new_slot(), b, &x, 0};
    tp_batch_req r = {&x, 1, 0, 0, "parameters.timeout", nested_done, &n, 0, 0, 0, 0};
    ck_assert_int_eq(tp_batcher_submit(b, &r, &err), TP_OK);
    wait_done(&n.s);
    wait_done(&n.inner);
    ck_assert_int_eq(n.s.st, TP_OK);
    ck_assert_int_eq(n.inner.st, TP_OK);
    ck_assert_msg(n.inner_inline, "the second request did not run at once on the idle instance");
    ck_assert_int_eq(stats(e[0]).executions, 1);
    ck_assert_int_eq(stats(e[1]).executions, 1);
    tp_engine_stats sum;
    tp_batcher_engine_stats(b, &sum);
    ck_assert_int_eq(sum.executions, 2);
    ck_assert_int_eq(sum.arena_bytes[0], stats(e[0]).arena_bytes[0] + stats(e[1]).arena_bytes[0]);
    tp_batcher_free(b);
    /* the same numbers from either instance as from a request run alone */
    ck_assert_msg(tp_batcher_create_instances(e, 2, &o, &b, &err) == TP_OK, "%s", err.msg);
    int n_ref, n_out;
    tp_host_tensor *ref = tu_infer(e[0], &x, 1, &n_ref), *out;
    tp_batch_info info = {0};
    ck_assert_int_eq(tp_batcher_infer(b, &x, 1, 0, &out, &n_out, &info, &err), TP_OK);
    ck_assert(tu_rel_diff(out, ref, 1) <= TU_RTOL_REORDER);
    tp_host_tensors_free(out, n_out);
    tp_host_tensors_free(ref, n_ref);
    tp_batcher_free(b);
    free(x.data);
    tp_engine_free(e[0]);
    tp_engine_free(e[1]);
}
END_TEST

/* 12 clients x 4 requests on two instances: each answer equals its request
 * run alone. */
START_TEST(concurrent_clients_on_two_instances)
{
    enum { N = 12 };
    tp_engine *e[2] = {open_mlp_serial(), open_mlp_serial()};
    client c[N];
    memset(c, 0, sizeof c);
    for (int i = 0; i < N; i++) {
        c[i].n_req = MAX_REQ;
        for (int r = 0; r < MAX_REQ; r++)
            c[i].in[r] = make_x(1 + (i + r) % 3, (unsigned)(100 * i + r));
    }
    tp_batcher_opts o = {0, 0, 0, NULL, NULL, 0, 0};
    tp_batcher *b;
    tp_err err = {{0}};
    ck_assert_msg(tp_batcher_create_instances(e, 2, &o, &b, &err) == TP_OK, "%s", err.msg);
    run_clients(e[0], b, c, N);
    tp_batcher_free(b);
    for (int i = 0; i < N; i++)
        for (int r = 0; r < MAX_REQ; r++) {
            ck_assert_msg(c[i].st[r] == TP_OK, "client %d request %d: %s", i, r, c[i].msg[r]);
            ck_assert_msg(c[i].diff[r] <= TU_RTOL_REORDER, "client %d request %d: rows differ from the "
                          "request run alone (rel diff %g)", i, r, c[i].diff[r]);
        }
    free_clients(c, N);
    tp_engine_free(e[0]);
    tp_engine_free(e[1]);
}
END_TEST

/* ---- held requests ------------------------------------------------------ */

/* A held request's answer, kept to compare with the request run alone. */
typedef struct {
    int done;
    tp_status st;
    char msg[1024];
    tp_host_tensor *outs;
    int n_outs;
    int batch_requests;
    pthread_t thread;
} held_slot;

static void held_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                      const tp_batch_info *info)
{
    held_slot *s = ctx;
    s->done = 1;
    s->st = st;
    snprintf(s->msg, sizeof s->msg, "%s", st == TP_OK ? "" : err->msg);
    s->outs = outs;
    s->n_outs = n_outs;
    s->batch_requests = info ? info->batch_requests : 0;
    s->thread = pthread_self();
}

#define N_HELD 4

/* What a busy engine's submitter holds: N_HELD requests of 1..3 rows, sent
 * from the done callback of a request running inline (the engine is busy
 * then), and one past its deadline. */
typedef struct {
    tp_batcher *b;
    tp_batch_held *held;
    tp_host_tensor x[N_HELD];
    held_slot s[N_HELD + 1];
    int was_held[N_HELD + 1];
} holder;

static void hold_req(holder *h, int i, tp_host_tensor *x, double t_arrival, int64_t timeout_us)
{
    tp_batch_req r = {x, 1, t_arrival, timeout_us, "parameters.timeout", held_done, &h->s[i], 0, 0, 0, 0};
    tp_err err = {{0}};
    ck_assert_msg(tp_batcher_submit_held(h->b, &r, &h->held, &h->was_held[i], &err) == TP_OK, "%s",
                  err.msg);
}

static void hold_while_busy(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
                            const tp_err *err, const tp_batch_info *info)
{
    (void)err;
    (void)info;
    holder *h = ctx;
    ck_assert_int_eq(st, TP_OK);
    tp_host_tensors_free(outs, n_outs);
    for (int i = 0; i < N_HELD; i++)
        hold_req(h, i, &h->x[i], 0, 0);
}

/* Requests submitted while the engine is busy are held by their submitter
 * (never queued for the batcher thread) and run together, on the
 * submitter's thread, when it calls tp_batcher_run_held: one engine
 * execution, each request its own rows (the request run alone, within the
 * reordering tolerance: a batch changes the GEMM shapes), one past its
 * deadline answered TP_TIMEOUT without running. While a thread holds
 * requests, its next one is held too, even with the engine idle: running
 * it alone first would delay the held ones. */
START_TEST(held_requests_run_together_on_their_thread)
{
    tp_engine *e = open_mlp_serial();
    tp_batcher *b = inline_batcher(e, 0);
    holder h = {.b = b};
    tp_host_tensor *ref[N_HELD];
    int n_ref;
    for (int i = 0; i < N_HELD; i++) {
        h.x[i] = make_x(1 + i % 3, (unsigned)(40 + i));
        ref[i] = tu_infer(e, &h.x[i], 1, &n_ref);
    }
    tp_host_tensor x0 = make_x(1, 3);
    tp_batch_req r0 = {&x0, 1, 0, 0, NULL, hold_while_busy, &h, 0, 0, 0, 0};
    tp_err err = {{0}};
    ck_assert_int_eq(tp_batcher_submit(b, &r0, &err), TP_OK); /* idle: runs here */
    for (int i = 0; i < N_HELD; i++)
        ck_assert_msg(h.was_held[i] && !h.s[i].done, "request %d was not held", i);
    /* the engine is idle now, but this thread holds requests */
    hold_req(&h, N_HELD, &x0, tp_now_s() - 1.0, 1000);
    ck_assert(h.was_held[N_HELD] && !h.s[N_HELD].done);
    tp_engine_stats s0 = stats(e);
    ck_assert_int_eq(tp_batcher_run_held(b, h.held), N_HELD + 1);
    ck_assert_uint_eq(stats(e).executions - s0.executions, 1);
    for (int i = 0; i < N_HELD; i++) {
        held_slot *s = &h.s[i];
        ck_assert_msg(s->done && s->st == TP_OK, "request %d: %s", i, s->msg);
        ck_assert(pthread_equal(s->thread, pthread_self()));
        ck_assert_int_eq(s->batch_requests, N_HELD);
        ck_assert(s->n_outs == 1 && s->outs[0].shape[0] == h.x[i].shape[0]);
        ck_assert_msg(tu_rel_diff(s->outs, ref[i], 1) <= TU_RTOL_REORDER, "request %d got other rows", i);
        tp_host_tensors_free(s->outs, s->n_outs);
        tp_host_tensors_free(ref[i], n_ref);
        free(h.x[i].data);
    }
    held_slot *late = &h.s[N_HELD];
    ck_assert_int_eq(late->st, TP_TIMEOUT);
    ck_assert_ptr_nonnull(strstr(late->msg, "over parameters.timeout"));
    ck_assert_ptr_null(late->outs);
    ck_assert_int_eq(tp_batcher_run_held(b, NULL), 0);
    tp_batcher_free(b);
    free(x0.data);
    tp_engine_free(e);
}
END_TEST

/* A second HTTP thread whose held batch is due while the first thread's
 * batch is in the engine: it runs them (held_runner, on its own thread)
 * while the busy request's done callback (busy_then_release) keeps the
 * engine for BUSY_MS. */
#define BUSY_MS 200

typedef struct {
    holder h;
    pthread_t runner;
    _Atomic int running;
    int ran;
} busy_engine;

static void *held_runner(void *arg)
{
    busy_engine *be = arg;
    atomic_store(&be->running, 1);
    be->ran = tp_batcher_run_held(be->h.b, be->h.held);
    return NULL;
}

static void busy_then_release(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
                              const tp_err *err, const tp_batch_info *info)
{
    busy_engine *be = ctx;
    hold_while_busy(&be->h, st, outs, n_outs, err, info);
    ck_assert_int_eq(pthread_create(&be->runner, NULL, held_runner, be), 0);
    while (!atomic_load(&be->running))
        sched_yield();
    nanosleep(&(struct timespec){0, BUSY_MS * 1000000L}, NULL); /* the runner finds the engine busy */
}

/* The counter `name` of a /metrics text (it must be there). */
static uint64_t counter_in(const char *text, const char *name)
{
    const char *at = strstr(text, name);
    ck_assert_msg(at != NULL, "no %s in /metrics", name);
    return strtoull(at + strlen(name), NULL, 10);
}

/* Runs the scenario under a spin budget; *spun and *slept: how the
 * runner's wait for the engine ended, as /metrics counts it. Every held
 * request is answered on the runner's thread, in one batch. */
static void wait_for_busy_engine(int64_t engine_spin_us, uint64_t *spun, uint64_t *slept)
{
    tp_engine *e = open_mlp_serial();
    tp_metrics *m = tp_metrics_create();
    tp_batcher_opts o = {16, 0, 0, m, NULL, 0, engine_spin_us};
    tp_batcher *b;
    tp_err err = {{0}};
    ck_assert_msg(tp_batcher_create(e, &o, &b, &err) == TP_OK, "%s", err.msg);
    busy_engine be = {.h = {.b = b}};
    for (int i = 0; i < N_HELD; i++)
        be.h.x[i] = make_x(1, (unsigned)(80 + i));
    tp_host_tensor x0 = make_x(1, 7);
    tp_batch_req r0 = {&x0, 1, 0, 0, NULL, busy_then_release, &be, 0, 0, 0, 0};
    ck_assert_int_eq(tp_batcher_submit(b, &r0, &err), TP_OK); /* idle: runs here */
    ck_assert_int_eq(pthread_join(be.runner, NULL), 0);
    ck_assert_int_eq(be.ran, N_HELD);
    for (int i = 0; i < N_HELD; i++) {
        held_slot *s = &be.h.s[i];
        ck_assert_msg(be.h.was_held[i] && s->done && s->st == TP_OK, "request %d: %s", i, s->msg);
        ck_assert(pthread_equal(s->thread, be.runner) && s->batch_requests == N_HELD);
        tp_host_tensors_free(s->outs, s->n_outs);
        free(be.h.x[i].data);
    }
    char *text = tp_metrics_render(m, NULL);
    *spun = counter_in(text, "\ntpserve_engine_wait_total{ended=\"spin\"} ");
    *slept = counter_in(text, "\ntpserve_engine_wait_total{ended=\"sleep\"} ");
    free(text);
    tp_batcher_free(b);
    tp_metrics_free(m);
    free(x0.data);
    tp_engine_free(e);
}

/* A thread whose held batch finds the engine busy polls for it before it
 * sleeps (two context switches and a wake-up, which cost more than the
 * short batch it waits for): with a budget longer than the other batch
 * the wait ends polling, with none it ends asleep; either way the
 * requests run, on their thread, once the engine is free. The runner
 * gets BUSY_MS to reach its wait; it needs microseconds. */
START_TEST(held_batch_polls_for_a_busy_engine)
{
    uint64_t spun, slept;
    wait_for_busy_engine(10 * BUSY_MS * 1000, &spun, &slept);
    ck_assert_msg(spun == 1 && slept == 0, "polling for %d ms: %llu polled, %llu slept", 10 * BUSY_MS,
                  (unsigned long long)spun, (unsigned long long)slept);
    wait_for_busy_engine(-1, &spun, &slept);
    ck_assert_msg(spun == 0 && slept == 1, "no polling: %llu polled, %llu slept",
                  (unsigned long long)spun, (unsigned long long)slept);
}
END_TEST

/* Only serial steps short enough to run on the submitter, without a queue
 * delay, are held: with a delay the request is queued for the batcher
 * thread (which runs it when freed), and an idle engine runs it at once.
 * Steps on rank threads (or processes) are not held while the engine is
 * busy either: they go to the batcher thread, whose batches gather every
 * submitter's requests. */
START_TEST(held_only_serial_steps_without_queue_delay)
{
    tp_engine *e = open_mlp_serial();
    tp_host_tensor x = make_x(1, 5);
    tp_batch_held *held = NULL;
    held_slot s = {0};
    int was_held = 1;
    tp_batch_req r = {&x, 1, 0, 0, NULL, held_done, &s, 0, 0, 0, 0};
    tp_err err = {{0}};
    tp_batcher *b = new_batcher(e, 16, LONG_DELAY_US, 0, NULL);
    ck_assert_int_eq(tp_batcher_submit_held(b, &r, &held, &was_held, &err), TP_OK);
    ck_assert(!was_held && !held && !s.done);
    tp_batcher_free(b); /* the drain runs it */
    ck_assert(s.done && s.st == TP_OK);
    tp_host_tensors_free(s.outs, s.n_outs);
    s = (held_slot){0};
    b = inline_batcher(e, 0);
    ck_assert_int_eq(tp_batcher_submit_held(b, &r, &held, &was_held, &err), TP_OK);
    ck_assert(!was_held && !held && s.done && pthread_equal(s.thread, pthread_self()));
    tp_host_tensors_free(s.outs, s.n_outs);
    tp_batcher_free(b);
    tp_engine_free(e);
    /* rank threads: a request sent while the engine is busy is queued */
    e = open_mlp();
    b = inline_batcher(e, 0);
    holder h = {.b = b};
    for (int i = 0; i < N_HELD; i++)
        h.x[i] = make_x(1, (unsigned)(60 + i));
    tp_batch_req r0 = {&x, 1, 0, 0, NULL, hold_while_busy, &h, 0, 0, 0, 0};
    ck_assert_int_eq(tp_batcher_submit(b, &r0, &err), TP_OK);
    ck_assert_ptr_null(h.held);
    tp_batcher_free(b); /* runs the queued ones */
    for (int i = 0; i < N_HELD; i++) {
        ck_assert_msg(!h.was_held[i] && h.s[i].done && h.s[i].st == TP_OK, "request %d", i);
        ck_assert(!pthread_equal(h.s[i].thread, pthread_self()));
        tp_host_tensors_free(h.s[i].outs, h.s[i].n_outs);
        free(h.x[i].data);
    }
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* A submitter that may have more requests waiting (r.more_may_follow: an
 * HTTP thread serving several connections) holds its request even on an
 * idle engine, once steps have run serially, and runs it with the ones it
 * gets meanwhile as one batch; without the flag the idle engine runs it at
 * once. With a queue delay it is queued as before (holding never waits). */
START_TEST(more_may_follow_holds_on_an_idle_engine)
{
    tp_engine *e = open_mlp_serial();
    tp_batcher *b = inline_batcher(e, 0);
    tp_host_tensor x = make_x(1, 11);
    held_slot s[3] = {{0}};
    tp_batch_held *held = NULL;
    int was_held = 0;
    tp_err err = {{0}};
    for (int i = 0; i < 2; i++) { /* serial steps, as the policy counts them */
        tp_batch_req r = {&x, 1, 0, 0, NULL, held_done, &s[0], .more_may_follow = 0};
        ck_assert_int_eq(tp_batcher_submit_held(b, &r, &held, &was_held, &err), TP_OK);
        ck_assert(!was_held && s[0].done);
        tp_host_tensors_free(s[0].outs, s[0].n_outs);
        s[0] = (held_slot){0};
    }
    tp_engine_stats s0 = stats(e);
    for (int i = 0; i < 2; i++) {
        tp_batch_req r = {&x, 1, 0, 0, NULL, held_done, &s[i], .more_may_follow = 1};
        ck_assert_int_eq(tp_batcher_submit_held(b, &r, &held, &was_held, &err), TP_OK);
        ck_assert_msg(was_held && !s[i].done, "request %d ran instead of being held", i);
    }
    ck_assert_int_eq(tp_batcher_run_held(b, held), 2);
    ck_assert_uint_eq(stats(e).executions - s0.executions, 1);
    for (int i = 0; i < 2; i++) {
        ck_assert(s[i].done && s[i].st == TP_OK && s[i].batch_requests == 2);
        ck_assert(pthread_equal(s[i].thread, pthread_self()));
        tp_host_tensors_free(s[i].outs, s[i].n_outs);
    }
    tp_batcher_free(b);
    /* a queue delay: queued for the batcher thread, never held */
    b = new_batcher(e, 16, LONG_DELAY_US, 0, NULL);
    held = NULL;
    s[2] = (held_slot){0};
    tp_batch_req r = {&x, 1, 0, 0, NULL, held_done, &s[2], .more_may_follow = 1};
    ck_assert_int_eq(tp_batcher_submit_held(b, &r, &held, &was_held, &err), TP_OK);
    ck_assert(!was_held && !held && !s[2].done);
    tp_batcher_free(b); /* the drain runs it */
    ck_assert(s[2].done && s[2].st == TP_OK);
    tp_host_tensors_free(s[2].outs, s[2].n_outs);
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* A full queue refuses with TP_UNAVAILABLE naming max_queue; freeing the
 * batcher still runs what was queued (the drain). */
START_TEST(queue_overflow_then_drain)
{
    tp_engine *e = open_mlp();
    tp_batcher *b = new_batcher(e, 16, LONG_DELAY_US, 2, NULL);
    tp_host_tensor x = make_x(1, 3);
    slot s[3] = {new_slot(), new_slot(), new_slot()};
    tp_err err = {{0}};
    ck_assert_int_eq(submit(b, &x, &s[0], 0, 0, &err), TP_OK);
    ck_assert_int_eq(submit(b, &x, &s[1], 0, 0, &err), TP_OK);
    ck_assert_int_eq(tp_batcher_queued(b), 2);
    ck_assert_int_eq(submit(b, &x, &s[2], 0, 0, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "server overloaded: 2 inference requests already queued") &&
                  strstr(err.msg, "(max_queue)"), "%s", err.msg);
    ck_assert_int_eq(tp_status_http(TP_UNAVAILABLE), 503);
    uint64_t rows0 = stats(e).rows;
    tp_batcher_free(b); /* drains: both queued requests run, in one batch */
    ck_assert(s[0].done && s[1].done && !s[2].done);
    ck_assert_int_eq(s[0].st, TP_OK);
    ck_assert_int_eq(s[1].st, TP_OK);
    ck_assert_int_eq(s[0].rows, 1);
    ck_assert_uint_eq(stats(e).rows - rows0, 2);
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* A request past its deadline is answered TP_TIMEOUT (504) at the deadline,
 * even while the batcher is waiting for more rows, and never runs. */
START_TEST(timeout_is_504_and_never_runs)
{
    tp_engine *e = open_mlp();
    tp_batcher *b = new_batcher(e, 16, LONG_DELAY_US, 0, NULL);
    tp_host_tensor x = make_x(1, 4);
    slot late = new_slot(), past = new_slot(), keep = new_slot(), dated = new_slot();
    tp_err err = {{0}};
    uint64_t rows0 = stats(e).rows;
    double t0 = tp_now_s();
    ck_assert_int_eq(submit(b, &x, &late, 0, 20000, &err), TP_OK);     /* 20 ms */
    ck_assert_int_eq(submit(b, &x, &past, t0 - 1, 1000, &err), TP_OK); /* due 1 s ago */
    /* the caller's clock reading dates the submit, and the deadline with it */
    tp_batch_req by_caller = {&x, 1, 0, 5000000, "parameters.timeout", slot_done, &dated, 0, t0 - 10, 0, 0};
    ck_assert_int_eq(tp_batcher_submit(b, &by_caller, &err), TP_OK);
    wait_done(&dated);
    ck_assert_int_eq(dated.st, TP_TIMEOUT);
    ck_assert_msg(dated.t_done - t0 < 2.5, "dated 10 s back with 5 s to go: answered after %.3f s, "
                  "not at once", dated.t_done - t0);
    ck_assert_int_eq(submit(b, &x, &keep, 0, 0, &err), TP_OK);
    wait_done(&late);
    wait_done(&past);
    ck_assert_int_eq(late.st, TP_TIMEOUT);
    ck_assert_int_eq(past.st, TP_TIMEOUT);
    ck_assert_int_eq(tp_status_http(TP_TIMEOUT), 504);
    ck_assert_msg(strstr(late.msg, "in the queue, over parameters.timeout"), "%s", late.msg);
    double waited = late.t_done - t0;
    ck_assert_msg(waited >= 0.019 && waited < 5, "answered after %.3f s", waited);
    ck_assert_int_eq(tp_batcher_queued(b), 1);
    ck_assert_uint_eq(stats(e).rows, rows0); /* neither ran */
    tp_batcher_free(b);
    ck_assert_int_eq(keep.st, TP_OK);
    ck_assert_uint_eq(stats(e).rows - rows0, 1); /* only the one without a deadline */
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* Cancel answers every queued request with the given status, unrun. */
START_TEST(cancel_answers_queued)
{
    tp_engine *e = open_mlp();
    tp_batcher *b = new_batcher(e, 16, LONG_DELAY_US, 0, NULL);
    tp_host_tensor x = make_x(1, 5);
    slot s[2] = {new_slot(), new_slot()};
    tp_err err = {{0}};
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(submit(b, &x, &s[i], 0, 0, &err), TP_OK);
    uint64_t rows0 = stats(e).rows;
    tp_batcher_cancel(b, TP_UNAVAILABLE, "drain timeout");
    for (int i = 0; i < 2; i++) {
        ck_assert(s[i].done);
        ck_assert_int_eq(s[i].st, TP_UNAVAILABLE);
        ck_assert_str_eq(s[i].msg, "drain timeout");
    }
    tp_batcher_free(b);
    ck_assert_uint_eq(stats(e).rows, rows0);
    tp_host_tensor *o;
    int n;
    b = new_batcher(e, 0, 0, 0, NULL); /* the engine still serves a fresh batcher */
    ck_assert_msg(tp_batcher_infer(b, &x, 1, 0, &o, &n, NULL, &err) == TP_OK, "%s", err.msg);
    tp_host_tensors_free(o, n);
    tp_batcher_free(b);
    free(x.data);
    tp_engine_free(e);
}
END_TEST

/* ---- copies: inputs read in place, outputs as views of one block -------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    tp_status st[MAX_REQ];
    tp_host_tensor *outs[MAX_REQ];
    int n_outs[MAX_REQ];
} collector;

typedef struct {
    collector *c;
    int slot;
} slot_ctx;

static void collect(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                    const tp_batch_info *info)
{
    (void)err;
    (void)info;
    slot_ctx *s = ctx;
    collector *c = s->c;
    pthread_mutex_lock(&c->mu);
    c->st[s->slot] = st;
    c->outs[s->slot] = outs;
    c->n_outs[s->slot] = n_outs;
    c->done++;
    pthread_cond_signal(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void *release_outputs(void *arg)
{
    tp_host_tensor **outs = arg;
    tp_host_tensors_free(*outs, 1);
    return NULL;
}

/* Requests of 1, 3, 2 and 5 rows form one batch: each gets its own rows
 * as a view into the batch's one output block (adjacent, no copy per
 * request), equal to its rows run alone; the views are released from four
 * threads at once, in no set order, and the block goes with the last
 * (ASan reports a leak or a use after free otherwise). */
START_TEST(outputs_are_views_released_in_any_order)
{
    static const int64_t rows[MAX_REQ] = {1, 3, 2, 5};
    tp_engine *e = open_mlp();
    tp_batcher *b = new_batcher(e, 11, LONG_DELAY_US, 0, NULL);
    collector c = {.done = 0};
    pthread_mutex_init(&c.mu, NULL);
    pthread_cond_init(&c.cv, NULL);
    tp_host_tensor in[MAX_REQ];
    slot_ctx ctx[MAX_REQ];
    for (int p = 0; p < MAX_REQ; p++) {
        in[p] = make_x(rows[p], (unsigned)(40 + p));
        ctx[p] = (slot_ctx){&c, p};
        tp_batch_req r = {.inputs = &in[p], .n_inputs = 1, .done = collect, .ctx = &ctx[p]};
        tp_err err = {{0}};
        ck_assert_msg(tp_batcher_submit(b, &r, &err) == TP_OK, "%s", err.msg);
    }
    pthread_mutex_lock(&c.mu);
    while (c.done < MAX_REQ)
        pthread_cond_wait(&c.cv, &c.mu);
    pthread_mutex_unlock(&c.mu);
    const char *next = NULL;
    for (int p = 0; p < MAX_REQ; p++) {
        ck_assert_int_eq(c.st[p], TP_OK);
        ck_assert_int_eq(c.n_outs[p], 1);
        tp_host_tensor *y = c.outs[p];
        ck_assert_int_eq(y->shape[0], rows[p]);
        ck_assert_ptr_nonnull(y->owner);
        ck_assert_ptr_eq(y->owner, c.outs[0]->owner);
        if (next)
            ck_assert_ptr_eq(y->data, next); /* request p's rows follow p-1's */
        next = (const char *)y->data + y->nbytes;
        int n_ref;
        tp_host_tensor *ref = tu_infer(e, &in[p], 1, &n_ref);
        ck_assert_double_le(tu_rel_diff(y, ref, 1), TU_RTOL_REORDER);
        tp_host_tensors_free(ref, n_ref);
    }
    pthread_t th[MAX_REQ];
    for (int p = MAX_REQ - 1; p >= 0; p--)
        pthread_create(&th[p], NULL, release_outputs, &c.outs[p]);
    for (int p = 0; p < MAX_REQ; p++) {
        pthread_join(th[p], NULL);
        free(in[p].data);
    }
    tp_batcher_free(b);
    pthread_cond_destroy(&c.cv);
    pthread_mutex_destroy(&c.mu);
    tp_engine_free(e);
}
END_TEST

/* A binary request's input is a view into its body, not a copy: bytes
 * changed in the body after decoding are what the engine runs on, and
 * freeing the request leaves the body alone. Bit-equal to the engine on
 * the same bytes: the same executable (bucket 2) stages the same bytes. */
START_TEST(binary_input_read_from_the_body)
{
    tp_engine *e = open_mlp();
    tp_batcher *b = new_batcher(e, 0, 0, 0, NULL);
    tp_io_desc ins[1] = {*tp_engine_input(e, 0)}, outs[1] = {*tp_engine_output(e, 0)};
    tp_kserve_model m = {.name = "mlp", .version = "1", .inputs = ins, .n_inputs = 1,
                         .outputs = outs, .n_outputs = 1};
    size_t nbytes = 2 * ROW_FLOATS * sizeof(float);
    char hdr[256];
    int hlen = snprintf(hdr, sizeof hdr, "{\"inputs\":[{\"name\":\"x\",\"shape\":[2,8,32],"
                        "\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":%zu}}]}", nbytes);
    if (hlen % 2 == 0) /* an odd header: the tail is unaligned for FP32, as bodies may be */
        hdr[hlen++] = ' ';
    char *body = malloc((size_t)hlen + nbytes);
    memcpy(body, hdr, (size_t)hlen);
    tp_host_tensor x1 = make_x(2, 1), x2 = make_x(2, 2);
    memcpy(body + hlen, x1.data, nbytes);
    tp_kserve_request r;
    tp_err err = {{0}};
    ck_assert_msg(tp_kserve_parse_infer(&m, body, (size_t)hlen + nbytes, hlen, NULL, &r, &err) == TP_OK, "%s",
                  err.msg);
    ck_assert_ptr_eq(r.inputs[0].data, body + hlen);
    ck_assert_ptr_eq(r.inputs[0].owner, TP_HOST_BORROWED);
    memcpy(body + hlen, x2.data, nbytes); /* after decoding: the engine must see these */
    tp_host_tensor *got, *want;
    int n_got, n_want;
    ck_assert_msg(tp_batcher_infer(b, r.inputs, r.n_inputs, 0, &got, &n_got, NULL, &err) == TP_OK, "%s",
                  err.msg);
    want = tu_infer(e, &x2, 1, &n_want);
    ck_assert_mem_eq(got[0].data, want[0].data, want[0].nbytes);
    tp_kserve_request_free(&r); /* the body is the caller's: not freed here */
    ck_assert_mem_eq(body + hlen, x2.data, nbytes);
    tp_host_tensors_free(got, n_got);
    tp_host_tensors_free(want, n_want);
    free(body);
    free(x1.data);
    free(x2.data);
    tp_batcher_free(b);
    tp_engine_free(e);
}
END_TEST

/* ---- a tiny embedding graph: failing batches, unbatchable graphs -------- */

/* Embedding of ids [B or 1, 2] (shard(1) over 2 ranks) then all_gather.
 * batch_dim 0: a static input, so the graph cannot batch. sliced: the ids
 * reach the embedding through a (whole-dim) slice, which the per-request
 * value checks do not follow, so out-of-range ids fail only at run time. */
static tp_engine *open_embedding(char *dir, int batch_dim, int sliced)
{
    static float table[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ts[2] = {4, 2};
    st_write_item item = {"t", TP_F32, 2, ts, table};
    char json[1200], path[128];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"emb\",\"world_size\":2,"
             "\"weights\":\"w.safetensors\",\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT32\","
             "\"shape\":[%s,2],\"placement\":\"shard(1)\"}],"
             "\"params\":[{\"name\":\"t\",\"datatype\":\"FP32\",\"shape\":[4,2]}],"
             "\"nodes\":[%s{\"name\":\"e\",\"op\":\"embedding\",\"inputs\":[\"%s\",\"t\"]},"
             "{\"name\":\"g\",\"op\":\"all_gather\",\"inputs\":[\"e\"],\"attrs\":{\"dim\":1}}],"
             "\"outputs\":[{\"name\":\"g\"}]}", batch_dim ? "\"B\"" : "1",
             sliced ? "{\"name\":\"s\",\"op\":\"slice\",\"inputs\":[\"ids\"],"
                      "\"attrs\":{\"dim\":1,\"start\":0,\"length\":1}}," : "",
             sliced ? "s" : "ids");
    tu_write_graph(dir, path, json, &item, 1);
    return tu_engine(path, 1, 0);
}

static tp_host_tensor ids_tensor(int32_t *ids)
{
    return (tp_host_tensor){.name = "ids", .dtype = TP_I32, .ndim = 2, .shape = {1, 2},
                            .data = ids, .nbytes = 2 * sizeof(int32_t)};
}

/* Out-of-range ids are refused at submit, naming the request's own
 * element: the request never joins (and never fails) a batch. */
START_TEST(bad_ids_refused_alone_at_submit)
{
    char dir[64];
    tp_engine *e = open_embedding(dir, 1, 0);
    tp_batcher *b = new_batcher(e, 2, 0, 0, NULL);
    int32_t good[2] = {1, 3}, bad[2] = {1, 9};
    tp_host_tensor g = ids_tensor(good), x = ids_tensor(bad);
    slot s = new_slot();
    tp_err err = {{0}};
    ck_assert_int_eq(submit(b, &x, &s, 0, 0, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "input 'ids': element 1 holds id 9, outside [0, 4)") &&
                  strstr(err.msg, "embedding 'e'"), "%s", err.msg);
    tp_host_tensor *o;
    int n;
    ck_assert_msg(tp_batcher_infer(b, &g, 1, 0, &o, &n, NULL, &err) == TP_OK, "%s", err.msg);
    float want[4] = {3, 4, 7, 8};
    ck_assert_mem_eq(o[0].data, want, sizeof want);
    tp_host_tensors_free(o, n);
    tp_batcher_free(b);
    tp_engine_free(e);
    tu_rmdir(dir);
}
END_TEST

/* A batch that fails on a request's data (here ids no submit check sees)
 * is retried request by request: the good one gets its rows, the bad one
 * its own error, which never mentions the batch. */
START_TEST(batch_failing_on_data_retries_each_request_alone)
{
    char dir[64];
    tp_engine *e = open_embedding(dir, 1, 1);
    tp_batcher *b = new_batcher(e, 2, LONG_DELAY_US, 0, NULL);
    int32_t good[2] = {1, 3}, bad[2] = {1, 9};
    tp_host_tensor g = ids_tensor(good), x = ids_tensor(bad);
    slot s[2] = {new_slot(), new_slot()};
    tp_err err = {{0}};
    ck_assert_int_eq(submit(b, &g, &s[0], 0, 0, &err), TP_OK);
    ck_assert_int_eq(submit(b, &x, &s[1], 0, 0, &err), TP_OK); /* full: runs now */
    wait_done(&s[0]);
    wait_done(&s[1]);
    ck_assert_msg(s[0].st == TP_OK, "%s", s[0].msg);
    ck_assert_int_eq(s[1].st, TP_INVALID);
    ck_assert_msg(strstr(s[1].msg, "id 9") && !strstr(s[1].msg, "batch of"), "%s", s[1].msg);
    tp_batcher_free(b);
    tp_engine_free(e);
    tu_rmdir(dir);
}
END_TEST

typedef struct {
    tp_batcher *b;
    int32_t ids[2];
    tp_status st;
    tp_batch_info info;
    float got[4];
} emb_client;

static void *emb_client_main(void *arg)
{
    emb_client *c = arg;
    tp_host_tensor x = ids_tensor(c->ids), *o;
    int n;
    tp_err err;
    c->st = tp_batcher_infer(c->b, &x, 1, 0, &o, &n, &c->info, &err);
    if (c->st == TP_OK)
        memcpy(c->got, o[0].data, sizeof c->got);
    tp_host_tensors_free(o, n);
    return NULL;
}

/* A graph without a batch dim runs each request alone, even when several
 * wait together, and each gets its own answer. */
START_TEST(unbatchable_graph_runs_one_by_one)
{
    enum { N = 6 };
    char dir[64];
    tp_engine *e = open_embedding(dir, 0, 0);
    tp_batcher *b = new_batcher(e, 0, 2000, 0, NULL);
    ck_assert_int_eq(tp_batcher_batching(b), 0);
    emb_client c[N];
    pthread_t th[N];
    uint64_t x0 = stats(e).executions;
    for (int i = 0; i < N; i++) {
        c[i] = (emb_client){.b = b, .ids = {i % 4, (i + 1) % 4}};
        pthread_create(&th[i], NULL, emb_client_main, &c[i]);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    ck_assert_uint_eq(stats(e).executions - x0, N);
    for (int i = 0; i < N; i++) {
        ck_assert_int_eq(c[i].st, TP_OK);
        ck_assert_int_eq(c[i].info.batch_requests, 1);
        /* ids {a, b}: rank 0 embeds a, rank 1 embeds b; gathered on dim 1 */
        float want[4] = {(float)(2 * c[i].ids[0] + 1), (float)(2 * c[i].ids[0] + 2),
                         (float)(2 * c[i].ids[1] + 1), (float)(2 * c[i].ids[1] + 2)};
        ck_assert_mem_eq(c[i].got, want, sizeof want);
    }
    tp_batcher_free(b);
    tp_engine_free(e);
    tu_rmdir(dir);
}
END_TEST

/* ---- steps that stall ------------------------------------------------------ */

/* An engine whose steps block until the test opens the gate: a rank that
 * stopped mid-step, as a SIGSTOPped worker or a hung GPU does. */
static const tp_backend_iface *cpu_iface;
static tp_backend_iface gated_iface;
static _Atomic int gate_open;

static void wait_gate(void)
{
    while (!atomic_load(&gate_open))
        usleep(1000);
}

static tp_status gated_replay(tp_backend *b, int rank, tp_capture *c, tp_err *err)
{
    wait_gate();
    return cpu_iface->replay(b, rank, c, err);
}

static tp_status gated_run_op(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                              tp_tensor *out, tp_err *err)
{
    wait_gate();
    return cpu_iface->run_op(b, rank, op, a, ins, n_ins, out, err);
}

static tp_engine *open_gated(void)
{
    tp_engine *e = open_mlp();
    tp_backend *bk = tp_engine_backend(e);
    cpu_iface = bk->iface;
    gated_iface = *cpu_iface;
    gated_iface.replay = gated_replay;
    gated_iface.run_op = gated_run_op;
    bk->iface = &gated_iface;
    atomic_store(&gate_open, 0);
    return e;
}

static void close_gated(tp_engine *e)
{
    atomic_store(&gate_open, 1);
    tp_engine_backend(e)->iface = cpu_iface;
    tp_engine_free(e);
}

/* Until the batcher reports a step running (a liveness bound, not a
 * timing: 10 s). */
static int64_t step_start(tp_batcher *b)
{
    int64_t t0 = 0;
    tp_engine *inst = NULL;
    for (int i = 0; i < 10000 && !tp_batcher_oldest_step(b, &t0, &inst); i++)
        usleep(1000);
    ck_assert_msg(t0 > 0, "no step reported running");
    return t0;
}

/* A step that has run stuck_ms is stuck (readiness 503, with why), judged
 * at the time the caller gives, so nothing here depends on timing; not
 * before, never with stuck_ms 0, and no longer once it ends. Ranks as
 * threads: the engine cannot say which rank is behind, and says so. */
START_TEST(stuck_step_reported_until_it_ends)
{
    tp_engine *e = open_gated();
    tp_batcher *b = inline_batcher(e, -1); /* on the batcher thread: submit returns */
    tp_host_tensor x = make_x(1, 21);
    slot s = new_slot();
    tp_err err = {{0}};
    int64_t t0 = 0;
    tp_engine *inst = NULL;
    char msg[512] = "";
    ck_assert_int_eq(tp_batcher_oldest_step(b, &t0, &inst), 0);
    ck_assert_int_eq(tp_batcher_stuck(b, 50, tp_now_ns(), &t0, msg, sizeof msg), 0);
    ck_assert_int_eq(submit(b, &x, &s, 0, 0, &err), TP_OK);
    int64_t start = step_start(b);
    ck_assert_int_eq(tp_batcher_oldest_step(b, &t0, &inst), 1);
    ck_assert(t0 == start && inst == e);
    ck_assert_int_eq(tp_batcher_stuck(b, 50, start + 49999999, &t0, msg, sizeof msg), 0);
    ck_assert_int_eq(tp_batcher_stuck(b, 0, start + 3600 * 1000000000LL, &t0, msg, sizeof msg), 0);
    ck_assert_int_eq(tp_batcher_stuck(b, 50, start + 50000000, &t0, msg, sizeof msg), 1);
    ck_assert(t0 == start); /* the step's identity: one log line per stuck step */
    ck_assert_str_eq(msg, "engine step running for 50 ms (stuck_step_ms 50): the engine cannot tell which rank "
                          "(ranks as threads)");
    ck_assert_int_eq(tp_batcher_stuck(b, 60000, start + 61234000000LL, &t0, msg, sizeof msg), 1);
    ck_assert_msg(strstr(msg, "engine step running for 61234 ms (stuck_step_ms 60000)"), "%s", msg);
    ck_assert_int_eq(s.done, 0);
    atomic_store(&gate_open, 1);
    wait_done(&s);
    ck_assert_int_eq(s.st, TP_OK);
    ck_assert_int_eq(tp_batcher_oldest_step(b, &t0, &inst), 0);
    ck_assert_int_eq(tp_batcher_stuck(b, 50, tp_now_ns() + 3600 * 1000000000LL, &t0, msg, sizeof msg), 0);
    tp_batcher_free(b);
    free(x.data);
    close_gated(e);
}
END_TEST

static int is_done(slot *s)
{
    pthread_mutex_lock(&g_mu);
    int done = s->done;
    pthread_mutex_unlock(&g_mu);
    return done;
}

/* While the batcher thread is stuck in a step, a queued request still gets
 * its 504 once past its deadline: tp_batcher_expire (the server's main
 * thread calls it) answers what the batcher thread cannot. Before, nothing
 * answered it until the step ended (a stopped rank: step_timeout_ms, 10
 * minutes by default). */
START_TEST(queued_request_times_out_behind_a_stuck_step)
{
    tp_engine *e = open_gated();
    tp_batcher *b = inline_batcher(e, -1);
    tp_host_tensor x = make_x(1, 22);
    slot stuck = new_slot(), queued = new_slot();
    tp_err err = {{0}};
    ck_assert_int_eq(submit(b, &x, &stuck, 0, 0, &err), TP_OK);
    step_start(b);
    double t_submit = tp_now_s();
    ck_assert_int_eq(submit(b, &x, &queued, 0, 20000, &err), TP_OK); /* 20 ms */
    double next = tp_batcher_expire(b, t_submit - 1); /* nothing due yet: when to look again */
    ck_assert_msg(next >= t_submit + 0.02 && next < t_submit + 1, "next look at %+.3f s", next - t_submit);
    ck_assert_int_eq(is_done(&queued), 0);
    /* a liveness bound (10 s), then the gate opens either way, so a
     * failing run ends */
    for (int i = 0; i < 10000 && !is_done(&queued); i++) {
        tp_batcher_expire(b, tp_now_s());
        usleep(1000);
    }
    int answered = is_done(&queued), stuck_done = is_done(&stuck);
    atomic_store(&gate_open, 1);
    wait_done(&queued);
    wait_done(&stuck);
    ck_assert_msg(answered, "the queued request was not answered while the step was stuck");
    ck_assert_int_eq(stuck_done, 0);
    ck_assert_int_eq(queued.st, TP_TIMEOUT);
    ck_assert_msg(strstr(queued.msg, "in the queue, over parameters.timeout"), "%s", queued.msg);
    ck_assert_int_eq(stuck.st, TP_OK);
    ck_assert(tp_batcher_expire(b, tp_now_s()) == 0); /* the batcher thread is back: its business */
    tp_batcher_free(b);
    free(x.data);
    close_gated(e);
}
END_TEST

typedef struct {
    tp_batcher *b;
    tp_host_tensor *x;
    slot s;
} inline_run;

static void *submit_inline(void *arg)
{
    inline_run *in = arg;
    tp_err err = {{0}};
    ck_assert_int_eq(submit(in->b, in->x, &in->s, 0, 0, &err), TP_OK);
    return NULL;
}

/* The same when the stuck step runs on its submitter (the inline run): the
 * batcher thread, waiting for the engine, wakes at the queued request's
 * deadline to answer it, where it used to sleep until the step's end. */
START_TEST(queued_request_times_out_behind_a_stuck_inline_step)
{
    tp_engine *e = open_gated();
    tp_batcher *b = inline_batcher(e, 0);
    tp_host_tensor x = make_x(1, 24);
    inline_run in = {b, &x, new_slot()};
    slot queued = new_slot();
    tp_err err = {{0}};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, submit_inline, &in), 0);
    step_start(b);
    ck_assert_int_eq(submit(b, &x, &queued, 0, 20000, &err), TP_OK); /* 20 ms, queued: the engine is busy */
    for (int i = 0; i < 10000 && !is_done(&queued); i++) /* a liveness bound, 10 s */
        usleep(1000);
    int answered = is_done(&queued), stuck_done = is_done(&in.s);
    atomic_store(&gate_open, 1);
    pthread_join(th, NULL);
    wait_done(&queued);
    ck_assert_msg(answered, "the queued request was not answered while the inline step was stuck");
    ck_assert_int_eq(stuck_done, 0);
    ck_assert_int_eq(queued.st, TP_TIMEOUT);
    ck_assert_int_eq(in.s.st, TP_OK);
    ck_assert(pthread_equal(in.s.thread, th)); /* it did run on its submitter */
    tp_batcher_free(b);
    free(x.data);
    close_gated(e);
}
END_TEST

/* A request whose step may stall (a device, rank processes:
 * tp_engine_steps_may_stall) runs on its submitter only when the submitter
 * serves no one else (r->alone): otherwise the batcher thread runs it, so
 * an HTTP thread's other clients never wait behind a stopped rank. Steps
 * that cannot stall keep running inline either way. */
static tp_backend_kind stall_kind;
static tp_backend_caps stall_caps;

static int ran_here(tp_batcher *b, tp_host_tensor *x, int alone)
{
    slot s = new_slot();
    tp_err err = {{0}};
    tp_batch_req r = {x, 1, 0, 0, "parameters.timeout", slot_done, &s, 0, 0, 0, .alone = alone};
    ck_assert_int_eq(tp_batcher_submit(b, &r, &err), TP_OK);
    int here = s.done && pthread_equal(s.thread, pthread_self());
    wait_done(&s);
    ck_assert_int_eq(s.st, TP_OK);
    return here;
}

START_TEST(step_that_may_stall_runs_inline_only_alone)
{
    tp_engine *e = open_mlp();
    tp_host_tensor x = make_x(1, 23);
    ck_assert_int_eq(tp_engine_steps_may_stall(e), 0); /* cpu, ranks as threads */
    tp_batcher *b = inline_batcher(e, 0);
    ck_assert(ran_here(b, &x, 0));
    ck_assert(ran_here(b, &x, 1));
    tp_batcher_free(b);
    tp_backend *bk = tp_engine_backend(e); /* now as a device backend's would */
    const tp_backend_kind *kind = bk->kind;
    stall_kind = *kind;
    stall_caps = *kind->caps;
    stall_caps.dma_input_copies = 1;
    stall_kind.caps = &stall_caps;
    bk->kind = &stall_kind;
    ck_assert_int_eq(tp_engine_steps_may_stall(e), 1);
    b = inline_batcher(e, 0);
    /* alone first: a run on the batcher thread leaves its instance busy
     * for a moment after its answer, which would keep the next one off
     * the submitter whatever it said */
    for (int i = 0; i < 3; i++)
        ck_assert(ran_here(b, &x, 1));
    for (int i = 0; i < 3; i++)
        ck_assert(!ran_here(b, &x, 0));
    tp_batcher_free(b);
    bk->kind = kind;
    free(x.data);
    tp_engine_free(e);
}
END_TEST

Suite *batcher_suite(void)
{
    Suite *s = suite_create("batcher");
    TCase *tc = tcase_create("batcher");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, concurrent_clients_get_their_own_rows);
    tcase_add_test(tc, full_batch_runs_once);
    tcase_add_test(tc, bad_request_in_a_crowd);
    tcase_add_test(tc, inline_run_only_while_steps_are_short);
    tcase_add_test(tc, inline_run_stops_while_requests_pile_up);
    tcase_add_test(tc, second_instance_runs_while_the_first_is_busy);
    tcase_add_test(tc, concurrent_clients_on_two_instances);
    tcase_add_test(tc, held_requests_run_together_on_their_thread);
    tcase_add_test(tc, held_batch_polls_for_a_busy_engine);
    tcase_add_test(tc, held_only_serial_steps_without_queue_delay);
    tcase_add_test(tc, more_may_follow_holds_on_an_idle_engine);
    tcase_add_test(tc, queue_overflow_then_drain);
    tcase_add_test(tc, timeout_is_504_and_never_runs);
    tcase_add_test(tc, cancel_answers_queued);
    tcase_add_test(tc, bad_ids_refused_alone_at_submit);
    tcase_add_test(tc, batch_failing_on_data_retries_each_request_alone);
    tcase_add_test(tc, unbatchable_graph_runs_one_by_one);
    tcase_add_test(tc, outputs_are_views_released_in_any_order);
    tcase_add_test(tc, binary_input_read_from_the_body);
    tcase_add_test(tc, stuck_step_reported_until_it_ends);
    tcase_add_test(tc, queued_request_times_out_behind_a_stuck_step);
    tcase_add_test(tc, queued_request_times_out_behind_a_stuck_inline_step);
    tcase_add_test(tc, step_that_may_stall_runs_inline_only_alone);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(batcher_suite)
