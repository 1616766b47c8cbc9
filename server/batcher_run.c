/* batcher_run.c — a batch run on an engine instance (inputs stacked, the
 * outputs split back per request), and the submission paths: a request run
 * inline by its submitter, held to run with the submitter's next ones, or
 * queued for the batcher thread (batcher.h). */
#include "batcher_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "invariant.h"
#include "spin_wait.h"
#include "text.h"
#include "zalloc.h"

/* ---- running a batch (no lock held) ------------------------------------- */

static void finish_job(job *j, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                       const tp_batch_info *info)
{
    j->r.done(j->r.ctx, st, outs, n_outs, err, info);
    free(j);
}

void batcher_fail_all(job *list, tp_status st, const tp_err *err)
{
    while (list) {
        job *next = list->next;
        finish_job(list, st, NULL, 0, err, NULL);
        list = next;
    }
}

void batcher_answer_expired(job *list, double now)
{
    while (list) {
        job *next = list->next;
        tp_err err;
        tp_fail(&err, TP_TIMEOUT, "request waited %.1f ms in the queue, over %s",
                (now - list->t_arrival) * 1e3, list->timeout_what);
        finish_job(list, TP_TIMEOUT, NULL, 0, &err, NULL);
        list = next;
    }
}

static const tp_host_tensor *find_input(const job *j, const char *name)
{
    for (int i = 0; i < j->r.n_inputs; i++)
        if (strcmp(j->r.inputs[i].name, name) == 0)
            return &j->r.inputs[i];
    return NULL; /* unreachable: submit checked every input is there */
}

/* Rows [row, row + n) of every output, as a request's own result: views
 * into the batch's output block, each holding a reference on it, so the
 * block lives until the last request of the batch lets go. */
static tp_host_tensor *slice_outputs(tp_batcher *b, const tp_host_tensor *all, int n_outs,
                                     int64_t rows, int64_t row, int64_t n)
{
    tp_host_tensor *o = tp_zalloc((size_t)n_outs + 1, sizeof *o);
    if (!o)
        return NULL;
    for (int i = 0; i < n_outs; i++) {
        int64_t per = tp_engine_output_rows(b->e, i);
        size_t row_bytes = rows ? all[i].nbytes / (size_t)(rows * per) : 0;
        o[i] = all[i];
        o[i].shape[0] = n * per;
        o[i].nbytes = (size_t)(n * per) * row_bytes;
        o[i].data = (char *)all[i].data + (size_t)(row * per) * row_bytes;
        tp_host_block_retain(o[i].owner);
    }
    return o;
}

/* The engine must have answered rows * output_rows rows per output, or the
 * split would hand one request another's rows. */
static tp_status check_split(tp_batcher *b, const tp_host_tensor *outs, int n_outs, int64_t rows,
                             tp_err *err)
{
    for (int i = 0; i < n_outs; i++) {
        int64_t want = rows * tp_engine_output_rows(b->e, i);
        if (outs[i].ndim < 1 || outs[i].shape[0] != want)
            return tp_fail(err, TP_INTERNAL, "batch of %lld rows: output '%s' has %lld rows, "
                           "expected %lld; not splitting it", (long long)rows, outs[i].name,
                           outs[i].ndim ? (long long)outs[i].shape[0] : 0LL, (long long)want);
    }
    return TP_OK;
}

static void deliver(tp_batcher *b, job *j, tp_status st, tp_host_tensor *outs, int n_outs,
                    const tp_err *err, tp_batch_info info, double t0)
{
    info.queue_s = t0 - j->t_submit;
    if (st == TP_OK && b->o.metrics)
        tp_metrics_inferred(b->o.metrics, j->rows, info.queue_s, info.compute_s);
    finish_job(j, st, outs, n_outs, err, st == TP_OK ? &info : NULL);
}

/* Every request's rows first, then the callbacks: *split_s is the time
 * spent slicing, timed once for the batch (two clock reads a request
 * were a tenth of the server's clock reads) from ts, the engine's end
 * (the batch's bookkeeping between the two is part of it: a read fewer). */
static void split_and_deliver(tp_batcher *b, job *batch, tp_host_tensor *outs, int n_outs,
                              tp_batch_info info, double t0, double ts, double *split_s)
{
    int64_t row = 0;
    for (job *j = batch; j; j = j->next) {
        j->mine = slice_outputs(b, outs, n_outs, info.batch_rows, row, j->rows);
        row += j->rows;
    }
    *split_s += tp_now_s() - ts;
    while (batch) {
        job *next = batch->next;
        tp_err err = {{0}};
        tp_status st = batch->mine ? TP_OK : tp_fail(&err, TP_NOMEM, "splitting a batch: out of memory");
        deliver(b, batch, st, batch->mine, st == TP_OK ? n_outs : 0, &err, info, t0);
        batch = next;
    }
}

/* Every instance's counters added up, as /metrics shows them. */
void batcher_sum_stats(const tp_engine_stats *snap, int n, tp_engine_stats *sum)
{
    *sum = snap[0];
    for (int k = 1; k < n; k++) {
        const tp_engine_stats *s = &snap[k];
        sum->requests += s->requests;
        sum->rows += s->rows;
        sum->executions += s->executions;
        for (int i = 0; i < TP_MAX_BUCKETS; i++)
            sum->bucket_runs[i] += s->bucket_runs[i];
        sum->exact_runs += s->exact_runs;
        sum->symmetric_copy_bytes += s->symmetric_copy_bytes;
        sum->regular_copy_bytes += s->regular_copy_bytes;
        for (int m = 0; m < TP_MEM_KINDS; m++)
            sum->arena_bytes[m] += s->arena_bytes[m];
        sum->rank_group_up = sum->rank_group_up && s->rank_group_up;
        sum->serial_steps += s->serial_steps;
    }
}

/* After instance k ran a batch of step_s seconds: the step-time and
 * serial averages, and k's counters into /metrics. The averages run over
 * the last few steps: one slow outlier (a page fault, a preempted rank)
 * does not send requests off the inline path for long, and a slow model
 * leaves it after its first step. */
static void note_step(tp_batcher *b, int k, double step_s, const tp_engine_stats *s)
{
    int serial = s->serial_steps != b->serial_steps_seen[k];
    b->serial_steps_seen[k] = s->serial_steps;
    tp_engine_stats sum;
    pthread_mutex_lock(&b->mu);
    b->recent_step_s = b->recent_step_s == 0 ? step_s : 0.5 * b->recent_step_s + 0.5 * step_s;
    b->recent_serial = 0.5 * b->recent_serial + (serial ? 0.5 : 0.0);
    b->snap[k] = *s;
    if (b->o.metrics)
        batcher_sum_stats(b->snap, b->n_inst, &sum);
    pthread_mutex_unlock(&b->mu);
    if (b->o.metrics)
        tp_metrics_engine_stats(b->o.metrics, &sum);
}

/* Every request's rows go to the engine as pieces, copied once, straight
 * into its staging (never concatenated here first). */
static tp_status infer_batch(tp_batcher *b, int k, const job *batch, int n, int64_t rows,
                             tp_host_tensor **outs, int *n_outs, tp_err *err)
{
    int ni = tp_engine_n_inputs(b->e);
    const tp_host_tensor **pieces = malloc(((size_t)ni * (size_t)n + 1) * sizeof *pieces);
    if (!pieces)
        return tp_fail(err, TP_NOMEM, "batching %d requests: out of memory", n);
    for (int i = 0; i < ni; i++) {
        const char *name = tp_engine_input(b->e, i)->name;
        int p = 0;
        for (const job *j = batch; j; j = j->next)
            pieces[(size_t)i * (size_t)n + (size_t)p++] = find_input(j, name);
    }
    /* submit checked every request: the engine need not check again */
    tp_status st = tp_engine_infer_parts(b->inst[k], pieces, n, rows, outs, n_outs, err);
    free(pieces);
    if (st == TP_OK && n > 1 && (st = check_split(b, *outs, *n_outs, rows, err)) != TP_OK) {
        tp_host_tensors_free(*outs, *n_outs);
        *outs = NULL;
    }
    return st;
}

void batcher_run_batch(tp_batcher *b, int k, job *batch)
{
    int n = 0, n_outs = 0;
    int64_t rows = 0;
    for (const job *j = batch; j; j = j->next, n++)
        rows += j->rows;
    tp_host_tensor *outs = NULL;
    tp_err err = {{0}};
    int64_t t0_ns = tp_now_ns();
    double t0 = (double)t0_ns / 1e9, split_s = 0;
    /* relaxed: a probe reading a stale value misjudges a step's age by
     * nanoseconds; a fence here would cost every batch */
    atomic_store_explicit(&b->step_t0[k], t0_ns, memory_order_relaxed);
    tp_status st = infer_batch(b, k, batch, n, rows, &outs, &n_outs, &err);
    atomic_store_explicit(&b->step_t0[k], 0, memory_order_relaxed);
    double t_end = tp_now_s();
    tp_batch_info info = {0, t_end - t0, rows, n};
    tp_engine_stats s;
    tp_engine_get_stats(b->inst[k], &s); /* uncontended: this thread is the instance's only caller */
    note_step(b, k, info.compute_s, &s);
    if (b->o.metrics)
        tp_metrics_batch(b->o.metrics, rows);
    if (st == TP_INVALID && n > 1) {
        /* a request's data the per-request checks could not judge: each
         * runs alone, so a bad one fails only its sender, with its own
         * positions in the message */
        for (job *next; batch; batch = next) {
            next = batch->next;
            batch->next = NULL;
            batcher_run_batch(b, k, batch);
        }
    } else if (st != TP_OK) {
        if (n > 1)
            tp_err_prefix(&err, "batch of %d requests (%lld rows): ", n, (long long)rows);
        batcher_fail_all(batch, st, &err);
    } else if (n == 1) {
        deliver(b, batch, TP_OK, outs, n_outs, &err, info, t0);
    } else {
        split_and_deliver(b, batch, outs, n_outs, info, t0, t_end, &split_s);
        tp_host_tensors_free(outs, n_outs);
    }
    if (st == TP_OK && b->o.stats)
        tp_model_stats_execution(b->o.stats, rows, 0, info.compute_s, split_s);
}

/* Requests that arrived while a batch ran mean clients are keeping the
 * engine busy: they are better served in batches by the batcher thread than
 * one at a time by whichever HTTP thread finds the engine idle for a moment
 * (that batch of one then delays the requests queued behind it, and stalls
 * the HTTP thread's other connections). A few quiet batches (two after
 * one busy one) bring the inline path back. */
void batcher_batch_ended(tp_batcher *b, int k)
{
    TP_ASSERT_HELD(&b->mu);
    assert(b->busy & (1u << k));
    b->busy &= ~(1u << k);
    b->recent_backlog = 0.5 * b->recent_backlog + (b->head || b->held ? 0.5 : 0.0);
    if (b->engine_waiters)
        pthread_cond_signal(&b->engine_cv);
    if (b->head || b->stopping)
        pthread_cond_signal(&b->cv); /* what queued meanwhile is the batcher thread's */
}

/* The lowest idle instance (__builtin_ctz of 0 is undefined: there must
 * be one). */
static int idle_instance(const tp_batcher *b)
{
    TP_ASSERT_HELD(&b->mu);
    assert(running(b) < b->n_inst);
    return __builtin_ctz(~b->busy);
}

/* Takes an idle instance. */
int batcher_take_instance(tp_batcher *b)
{
    int k = idle_instance(b);
    assert(k < b->n_inst);
    b->busy |= 1u << k;
    return k;
}

/* Waits until an instance is idle, then takes it; *slept says whether it
 * had to sleep for one. */
static int claim_engine(tp_batcher *b, int *slept)
{
    TP_ASSERT_HELD(&b->mu);
    *slept = 0;
    while (running(b) == b->n_inst) {
        *slept = 1;
        b->engine_waiters++;
        pthread_cond_wait(&b->engine_cv, &b->mu);
        b->engine_waiters--;
    }
    return batcher_take_instance(b);
}

/* An idle batcher with nothing queued and no delay to wait out would only
 * take the next request and run it alone: its submitter runs it itself,
 * sparing two thread hand-offs — while recent steps were short enough
 * (inline_max_us) not to hold up the submitter's other work, and while
 * requests did not pile up behind recent batches (batcher_batch_ended). b->mu held. */
static int short_steps(const tp_batcher *b)
{
    return b->o.inline_max_us == 0 ||
           (b->o.inline_max_us > 0 && b->recent_step_s * 1e6 <= (double)b->o.inline_max_us);
}

static int would_run_on_submitter(const tp_batcher *b)
{
    return !b->stopping && running(b) < b->n_inst && !b->head && !b->held && b->delay_s == 0 &&
           short_steps(b) && b->recent_backlog < 0.25;
}

/* Under load the submitter keeps the request and runs it a moment later
 * with the others it received meanwhile (tp_batcher_run_held), on its own
 * thread: a batch without the hand-off to the batcher thread and back
 * (server/README.md at 27cb4dd, "Held requests"). Only for steps short enough to run
 * on the submitter, without a queue delay to wait out, and run as serial
 * steps (every rank on the calling thread): a step whose ranks run on
 * threads or processes of their own pays a fixed cost to wake and wait for
 * them, so the batcher thread's larger batches, gathered from every HTTP
 * thread, serve more (one process per rank at 32 connections: 49k req/s
 * with batches of 9.4 rows there, 29-35k held, in batches of 2.4). b->mu
 * held. */
static int would_hold(const tp_batcher *b)
{
    return !b->stopping && b->delay_s == 0 && b->batchable && short_steps(b) &&
           b->recent_serial >= 0.5 && !b->may_stall;
}

static job *new_job(const tp_batch_req *r, int64_t rows)
{
    job *j = tp_zalloc(1, sizeof *j);
    if (!j)
        return NULL;
    j->r = *r;
    tp_text_copy(j->timeout_what, sizeof j->timeout_what, r->timeout_what ? r->timeout_what : "its timeout");
    j->r.timeout_what = j->timeout_what;
    j->rows = rows;
    j->t_submit = r->t_now > 0 ? r->t_now : tp_now_s();
    j->t_arrival = r->t_arrival > 0 ? r->t_arrival : j->t_submit;
    j->deadline = r->timeout_us > 0 ? j->t_arrival + (double)r->timeout_us / 1e6 : 0;
    return j;
}

tp_status tp_batcher_submit(tp_batcher *b, const tp_batch_req *r, tp_err *err)
{
    return tp_batcher_submit_held(b, r, NULL, NULL, err);
}

static void append_job(job **head, job **tail, job *j)
{
    if (*tail)
        (*tail)->next = j;
    else
        *head = j;
    *tail = j;
}

/* Adds j to *held (a new group when it is NULL); 0 when out of memory. */
static int hold_job(tp_batcher *b, tp_batch_held **held, job *j)
{
    TP_ASSERT_HELD(&b->mu);
    if (!*held && !(*held = tp_zalloc(1, sizeof **held)))
        return 0;
    append_job(&(*held)->head, &(*held)->tail, j);
    (*held)->n++;
    b->held++;
    return 1;
}

tp_status tp_batcher_submit_held(tp_batcher *b, const tp_batch_req *r, tp_batch_held **held,
                                 int *was_held, tp_err *err)
{
    if (was_held)
        *was_held = 0;
    /* rows: the batch every batched input agrees on (dim 0; never 0) */
    int64_t rows = 0;
    tp_status st = r->decoded && r->n_inputs == tp_engine_n_inputs(b->e)
                       ? tp_engine_check_decoded(b->e, r->inputs, &rows, err)
                       : tp_engine_check_inputs(b->e, r->inputs, r->n_inputs, &rows, err);
    if (st != TP_OK)
        return st;
    job *j = new_job(r, rows);
    if (!j)
        return tp_fail(err, TP_NOMEM, "batcher: out of memory queueing a request");
    pthread_mutex_lock(&b->mu);
    int stopping = b->stopping, full = b->queued >= b->o.max_queue;
    int may_hold = held && would_hold(b);
    /* done is called before submit returns; not when the submitter holds
     * requests already, or expects more (r->more_may_follow) and may hold,
     * nor for a step that may stall on a submitter others depend on */
    int run_here = would_run_on_submitter(b) && !(held && *held) && !(may_hold && r->more_may_follow) &&
                   (!b->may_stall || r->alone);
    int hold = !run_here && may_hold && hold_job(b, held, j);
    int k = run_here ? batcher_take_instance(b) : -1;
    if (hold) {
        *was_held = 1;
    } else if (!run_here && !stopping && !full) {
        append_job(&b->head, &b->tail, j);
        b->queued++;
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    if (run_here) {
        batcher_run_batch(b, k, j);
        pthread_mutex_lock(&b->mu);
        batcher_batch_ended(b, k);
        pthread_mutex_unlock(&b->mu);
        return TP_OK;
    }
    if (hold || (!stopping && !full))
        return TP_OK;
    free(j);
    if (stopping)
        return tp_fail(err, TP_UNAVAILABLE, "server is shutting down: the batcher takes no new "
                       "requests");
    return tp_fail(err, TP_UNAVAILABLE, "server overloaded: %d inference requests already queued "
                   "for the engine (max_queue)", b->o.max_queue);
}

static int engine_idle(const void *arg)
{
    const tp_batcher *b = arg;
    return running(b) < b->n_inst;
}

/* A thread that finds every instance busy when its held batch is due (the
 * other HTTP thread's batch is in the engine, a few microseconds of
 * serial steps) polls for an idle one before it sleeps on engine_cv: the
 * sleep and the wake-up cost two context switches, and tens of
 * microseconds of wake-up latency on a VM whose idle vCPU halts
 * (server/README.md at 27cb4dd, "Waiting for the engine"), for a wait shorter than
 * either. Each thread learns whether its spins pay (tp_spin_site): they
 * stop while most run out (the other batch long, or its thread preempted). */
static void spin_for_engine(tp_batcher *b)
{
    static _Thread_local tp_spin_site site;
    tp_spin_site_until(&site, engine_idle, b, b->engine_spin_ns);
}

int tp_batcher_run_held(tp_batcher *b, tp_batch_held *held)
{
    if (!held)
        return 0;
    int n = held->n;
    job *list = held->head, *tail, *expired = NULL;
    free(held);
    int waited = running(b) == b->n_inst, slept;
    if (waited)
        spin_for_engine(b);
    pthread_mutex_lock(&b->mu);
    int k = claim_engine(b, &slept);
    b->held -= n;
    pthread_mutex_unlock(&b->mu);
    if ((waited || slept) && b->o.metrics)
        tp_metrics_engine_wait(b->o.metrics, slept);
    double now = tp_now_s();
    batcher_cut_expired(&list, &tail, now, &expired);
    batcher_answer_expired(expired, now);
    while (list) {
        int full, m = batcher_batch_prefix(b, list, &full);
        batcher_run_batch(b, k, batcher_cut_prefix(&list, m));
    }
    pthread_mutex_lock(&b->mu);
    batcher_batch_ended(b, k);
    pthread_mutex_unlock(&b->mu);
    return n;
}

void tp_batcher_prewake(tp_batcher *b)
{
    pthread_mutex_lock(&b->mu);
    int idle = would_run_on_submitter(b) ? idle_instance(b) : -1; /* the instance it would take */
    pthread_mutex_unlock(&b->mu);
    if (idle >= 0)
        tp_engine_prewake(b->inst[idle]);
}
