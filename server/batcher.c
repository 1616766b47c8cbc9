/* batcher.c — dynamic batching: the queue, the batcher thread that takes
 * batches off it, and the batcher's life (create, expire, cancel, free;
 * batcher.h). Running a batch and taking submissions: batcher_run.c. */
#include "batcher_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "invariant.h"
#include "spin_wait.h"
#include "text.h"
#include "zalloc.h"

#define DEFAULT_MAX_QUEUE 1024
#define DEFAULT_MAX_BATCH 16

/* ---- the queue (b->mu held: TP_ASSERT_HELD where it is relied on) -------- */

/* Moves every request of the list whose deadline has passed onto
 * *expired; *tail becomes the last one left. Returns how many moved. */
int batcher_cut_expired(job **head, job **tail, double now, job **expired)
{
    int n = 0;
    *tail = NULL;
    for (job **pp = head; *pp;) {
        job *j = *pp;
        if (j->deadline > 0 && now >= j->deadline) {
            *pp = j->next;
            j->next = *expired;
            *expired = j;
            n++;
        } else {
            *tail = j;
            pp = &j->next;
        }
    }
    return n;
}

static void take_expired(tp_batcher *b, double now, job **expired)
{
    TP_ASSERT_HELD(&b->mu);
    b->queued -= batcher_cut_expired(&b->head, &b->tail, now, expired);
}

/* How many requests from the head form the next batch (their rows fit in
 * max_batch; a request alone over max_batch runs alone and the engine splits
 * it into buckets). *full: nothing more could join, so waiting is useless. */
int batcher_batch_prefix(const tp_batcher *b, const job *head, int *full)
{
    int64_t rows = 0, max = b->o.max_batch;
    int n = 0;
    *full = 1;
    if (!b->batchable || head->rows >= max)
        return 1;
    for (const job *j = head; j; j = j->next) {
        if (rows + j->rows > max)
            return n;
        rows += j->rows;
        n++;
    }
    *full = rows == max;
    return n;
}

/* The first n jobs of *head, cut off it as a list of their own. */
job *batcher_cut_prefix(job **head, int n)
{
    job *first = *head, *last = first;
    for (int i = 1; i < n; i++)
        last = last->next;
    *head = last->next;
    last->next = NULL;
    return first;
}

static job *unlink_prefix(tp_batcher *b, int n)
{
    TP_ASSERT_HELD(&b->mu);
    assert(n >= 1 && n <= b->queued);
    job *first = batcher_cut_prefix(&b->head, n);
    if (!b->head)
        b->tail = NULL;
    b->queued -= n;
    return first;
}

static double earliest_deadline(const tp_batcher *b)
{
    double t = 0;
    for (const job *j = b->head; j; j = j->next)
        if (j->deadline > 0 && (t == 0 || j->deadline < t))
            t = j->deadline;
    return t;
}

static void wait_until(tp_batcher *b, double t)
{
    struct timespec ts = {(time_t)t, (long)((t - (double)(time_t)t) * 1e9)};
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&b->cv, &b->mu, &ts);
}

/* Waits until a batch is due (full, its oldest request waited the queue
 * delay, or stopping) or requests expired. Returns 0 when stopping with
 * nothing left. */
static int next_batch(tp_batcher *b, job **batch, job **expired)
{
    for (;;) {
        double now = tp_now_s();
        take_expired(b, now, expired);
        if (*expired)
            return 1;
        if (running(b) == b->n_inst) { /* submitters run them inline; they signal when done */
            /* ...which may be never (a stuck step): queued requests still
             * get their 504 at their deadline */
            double dl = earliest_deadline(b);
            if (dl > 0)
                wait_until(b, dl);
            else
                pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        if (!b->head) {
            if (b->stopping)
                return 0;
            pthread_cond_wait(&b->cv, &b->mu);
            continue;
        }
        int full, n = batcher_batch_prefix(b, b->head, &full);
        double due = b->head->t_submit + b->delay_s, dl = earliest_deadline(b);
        if (full || b->stopping || now >= due) {
            *batch = unlink_prefix(b, n);
            return 1;
        }
        wait_until(b, dl > 0 && dl < due ? dl : due);
    }
}

static void *batcher_main(void *arg)
{
    tp_batcher *b = arg;
    int more = 1;
    while (more) {
        job *batch = NULL, *expired = NULL;
        pthread_mutex_lock(&b->mu);
        more = next_batch(b, &batch, &expired);
        int k = batch ? batcher_take_instance(b) : -1; /* next_batch waits for an idle one */
        b->thread_in_batch = batch != NULL;
        pthread_mutex_unlock(&b->mu);
        /* callbacks run unlocked: they may take their own locks or submit */
        batcher_answer_expired(expired, tp_now_s());
        if (batch)
            batcher_run_batch(b, k, batch);
        pthread_mutex_lock(&b->mu);
        if (batch)
            batcher_batch_ended(b, k);
        b->thread_in_batch = 0;
        pthread_mutex_unlock(&b->mu);
    }
    return NULL;
}

/* ---- the public side ---------------------------------------------------- */

static int64_t largest_bucket(tp_engine *e)
{
    tp_engine_stats s;
    tp_engine_get_stats(e, &s);
    return s.n_buckets > 0 ? s.bucket[s.n_buckets - 1] : DEFAULT_MAX_BATCH;
}

tp_status tp_batcher_create(tp_engine *e, const tp_batcher_opts *o, tp_batcher **out, tp_err *err)
{
    return tp_batcher_create_instances(&e, 1, o, out, err);
}

tp_status tp_batcher_create_instances(tp_engine *const *inst, int n_inst, const tp_batcher_opts *o,
                                      tp_batcher **out, tp_err *err)
{
    *out = NULL;
    if (n_inst < 1 || n_inst > TP_BATCHER_MAX_INSTANCES)
        return tp_fail(err, TP_INVALID, "batcher: %d model instances (1 to %d)", n_inst, TP_BATCHER_MAX_INSTANCES);
    tp_batcher *b = calloc(1, sizeof *b);
    if (!b)
        return tp_fail(err, TP_NOMEM, "batcher: out of memory");
    tp_engine *e = inst[0];
    b->e = e;
    b->n_inst = n_inst;
    for (int k = 0; k < n_inst; k++) {
        b->inst[k] = inst[k];
        tp_engine_get_stats(inst[k], &b->snap[k]);
        b->serial_steps_seen[k] = b->snap[k].serial_steps;
    }
    b->o = o ? *o : (tp_batcher_opts){0};
    if (b->o.max_batch <= 0)
        b->o.max_batch = largest_bucket(e);
    if (b->o.max_queue <= 0)
        b->o.max_queue = DEFAULT_MAX_QUEUE;
    /* the thread whose batch is in the engine and the one waiting for it */
    b->engine_spin_ns = b->o.engine_spin_us > 0   ? b->o.engine_spin_us * 1000
                        : b->o.engine_spin_us < 0 ? 0
                                                  : tp_spin_budget(2, tp_spin_cores());
    b->delay_s = b->o.max_queue_delay_us > 0 ? (double)b->o.max_queue_delay_us / 1e6 : 0;
    b->batchable = tp_engine_batchable(e);
    b->may_stall = tp_engine_steps_may_stall(e);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&b->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&b->engine_cv, NULL);
    pthread_mutex_init(&b->mu, NULL);
    if (b->o.metrics) {
        tp_engine_stats sum;
        batcher_sum_stats(b->snap, n_inst, &sum);
        tp_metrics_engine_stats(b->o.metrics, &sum);
    }
    if (pthread_create(&b->th, NULL, batcher_main, b) != 0) {
        pthread_cond_destroy(&b->engine_cv);
        pthread_cond_destroy(&b->cv);
        pthread_mutex_destroy(&b->mu);
        free(b);
        return tp_fail(err, TP_INTERNAL, "batcher: cannot start its thread");
    }
    *out = b;
    return TP_OK;
}

void tp_batcher_engine_stats(tp_batcher *b, tp_engine_stats *out)
{
    tp_engine_stats now[TP_BATCHER_MAX_INSTANCES];
    for (int k = 0; k < b->n_inst; k++)
        tp_engine_get_stats(b->inst[k], &now[k]);
    batcher_sum_stats(now, b->n_inst, out);
}

int tp_batcher_instances(const tp_batcher *b) { return b->n_inst; }

int tp_batcher_oldest_step(tp_batcher *b, int64_t *t_start_ns, tp_engine **inst)
{
    int found = 0;
    for (int k = 0; k < b->n_inst; k++) {
        int64_t t = atomic_load_explicit(&b->step_t0[k], memory_order_relaxed);
        if (t && (!found || t < *t_start_ns)) {
            *t_start_ns = t;
            *inst = b->inst[k];
            found = 1;
        }
    }
    return found;
}

/* "rank 1 has not finished", "ranks 1, 3 have not finished", or why
 * no rank is named. */
static void describe_pending(tp_engine *e, char *out, size_t cap)
{
    int ranks[8];
    int n = tp_engine_step_pending(e, ranks, 8);
    if (n < 0) {
        snprintf(out, cap, "the engine cannot tell which rank (ranks as threads)");
        return;
    }
    if (n == 0) {
        snprintf(out, cap, "no rank step in flight (the batch is between steps)");
        return;
    }
    size_t at = (size_t)snprintf(out, cap, "rank%s ", n > 1 ? "s" : "");
    for (int i = 0; i < n && i < 8 && at < cap; i++)
        at += (size_t)snprintf(out + at, cap - at, "%s%d", i ? ", " : "", ranks[i]);
    if (at < cap)
        snprintf(out + at, cap - at, "%s %s not finished", n > 8 ? ", ..." : "", n > 1 ? "have" : "has");
}

int tp_batcher_stuck(tp_batcher *b, int stuck_ms, int64_t now_ns, int64_t *t_start_ns, char *msg, size_t cap)
{
    tp_engine *inst = NULL;
    if (stuck_ms <= 0 || !tp_batcher_oldest_step(b, t_start_ns, &inst))
        return 0;
    int64_t age_ms = (now_ns - *t_start_ns) / 1000000;
    if (age_ms < stuck_ms)
        return 0;
    char who[160];
    describe_pending(inst, who, sizeof who);
    snprintf(msg, cap, "engine step running for %lld ms (stuck_step_ms %d): %s", (long long)age_ms, stuck_ms, who);
    return 1;
}

double tp_batcher_expire(tp_batcher *b, double now)
{
    job *expired = NULL;
    pthread_mutex_lock(&b->mu);
    double next = 0;
    if (b->thread_in_batch) {
        take_expired(b, now, &expired);
        next = earliest_deadline(b);
    }
    pthread_mutex_unlock(&b->mu);
    batcher_answer_expired(expired, now);
    return next;
}

int tp_batcher_queued(tp_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    int n = b->queued;
    pthread_mutex_unlock(&b->mu);
    return n;
}

int64_t tp_batcher_max_batch(const tp_batcher *b) { return b->o.max_batch; }
int tp_batcher_batching(const tp_batcher *b) { return b->batchable; }

void tp_batcher_cancel(tp_batcher *b, tp_status st, const char *msg)
{
    pthread_mutex_lock(&b->mu);
    job *list = b->head;
    b->head = b->tail = NULL;
    b->queued = 0;
    pthread_mutex_unlock(&b->mu);
    tp_err err;
    tp_fail(&err, st, "%s", msg);
    batcher_fail_all(list, st, &err);
}

void tp_batcher_free(tp_batcher *b)
{
    if (!b)
        return;
    pthread_mutex_lock(&b->mu);
    b->stopping = 1;
    pthread_cond_broadcast(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->th, NULL);
    pthread_cond_destroy(&b->engine_cv);
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
    free(b);
}

/* ---- blocking submit ---------------------------------------------------- */

typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    tp_status st;
    tp_host_tensor *outs;
    int n_outs;
    tp_err err;
    tp_batch_info info;
} waiter;

static void wake_waiter(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
                        const tp_err *err, const tp_batch_info *info)
{
    waiter *w = ctx;
    pthread_mutex_lock(&w->mu);
    w->st = st;
    w->outs = outs;
    w->n_outs = n_outs;
    if (err)
        w->err = *err;
    if (info)
        w->info = *info;
    w->done = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

tp_status tp_batcher_infer(tp_batcher *b, const tp_host_tensor *inputs, int n_inputs,
                           int64_t timeout_us, tp_host_tensor **outs, int *n_outs,
                           tp_batch_info *info, tp_err *err)
{
    waiter w = {.st = TP_OK};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    tp_batch_req r = {inputs, n_inputs, 0, timeout_us, NULL, wake_waiter, &w, .decoded = 0};
    *outs = NULL;
    *n_outs = 0;
    tp_status st = tp_batcher_submit(b, &r, err);
    pthread_mutex_lock(&w.mu);
    while (st == TP_OK && !w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    if (st == TP_OK && (st = w.st) == TP_OK) {
        *outs = w.outs;
        *n_outs = w.n_outs;
    } else if (w.done) {
        *err = w.err;
    }
    if (info)
        *info = w.info;
    pthread_cond_destroy(&w.cv);
    pthread_mutex_destroy(&w.mu);
    return st;
}
