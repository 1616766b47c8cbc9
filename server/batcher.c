#include "batcher.h"

#include <pthread.h>
#include <stdatomic.h>
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

typedef struct job {
    struct job *next;
    tp_batch_req r;
    char timeout_what[64]; /* r.timeout_what points here */
    int64_t rows;
    double t_arrival, t_submit, deadline; /* deadline 0: none */
    tp_host_tensor *mine; /* its rows of its batch's outputs (split_and_deliver) */
} job;

/* Requests one thread holds to run together (tp_batcher_run_held). */
struct tp_batch_held {
    job *head, *tail;
    int n;
};

struct tp_batcher {
    tp_engine *e; /* instance 0: the graph's signature, checks (every instance has the same) */
    /* Instances of the model (Triton's instance_group count): each runs
     * one batch at a time, on whichever thread claimed it. */
    tp_engine *inst[TP_BATCHER_MAX_INSTANCES];
    int n_inst;
    /* bit k: instance k runs a batch, on the batcher thread or a
     * submitter's (written under mu; read without it by a thread spinning
     * for an idle instance, tp_batcher_run_held) */
    _Atomic unsigned busy;
    int64_t engine_spin_ns; /* how long a held batch spins for a busy engine */
    tp_engine_stats snap[TP_BATCHER_MAX_INSTANCES]; /* each instance's after its last batch (mu) */
    tp_batcher_opts o;
    int batchable;
    double delay_s;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC, like every time here */
    pthread_cond_t engine_cv; /* for threads waiting to run their held requests */
    job *head, *tail;
    int queued, stopping;
    int held;           /* requests held by submitters, not yet running */
    int engine_waiters; /* threads waiting on engine_cv */
    double recent_step_s; /* moving average of engine time per batch (under mu) */
    double recent_serial; /* moving average of "the batch ran as serial steps" (mu) */
    uint64_t serial_steps_seen[TP_BATCHER_MAX_INSTANCES]; /* each instance's serial step count
                                 * after its last batch (only the thread running it touches it) */
    double recent_backlog; /* moving average of "requests were waiting when a batch ended" (mu) */
    /* Steps may wait on other processes or a device (tp_engine_steps_may_stall):
     * they run on a submitter only when it serves no one else (r->alone). */
    int may_stall;
    int thread_in_batch; /* the batcher thread runs a batch: its queue's deadlines are tp_batcher_expire's (mu) */
    /* Instance k's running batch began at this tp_now_ns (0: none runs),
     * for tp_batcher_oldest_step: written by the thread running it, read
     * by probes, never under a lock. */
    _Atomic int64_t step_t0[TP_BATCHER_MAX_INSTANCES];
    pthread_t th;
};

/* ---- the queue (b->mu held: TP_ASSERT_HELD where it is relied on) -------- */

/* Moves every request of the list whose deadline has passed onto
 * *expired; *tail becomes the last one left. Returns how many moved. */
static int cut_expired(job **head, job **tail, double now, job **expired)
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
    b->queued -= cut_expired(&b->head, &b->tail, now, expired);
}

/* How many requests from the head form the next batch (their rows fit in
 * max_batch; a request alone over max_batch runs alone and the engine splits
 * it into buckets). *full: nothing more could join, so waiting is useless. */
static int batch_prefix(const tp_batcher *b, const job *head, int *full)
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
static job *cut_prefix(job **head, int n)
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
    job *first = cut_prefix(&b->head, n);
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

/* How many instances run a batch. busy is atomic: a thread about to take
 * b->mu peeks at it (engine_idle, tp_batcher_run_held); what it decides
 * it decides again under b->mu (claim_engine). */
static int running(const tp_batcher *b) { return __builtin_popcount(b->busy); }

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
        int full, n = batch_prefix(b, b->head, &full);
        double due = b->head->t_submit + b->delay_s, dl = earliest_deadline(b);
        if (full || b->stopping || now >= due) {
            *batch = unlink_prefix(b, n);
            return 1;
        }
        wait_until(b, dl > 0 && dl < due ? dl : due);
    }
}

/* ---- running a batch (no lock held) ------------------------------------- */

static void finish_job(job *j, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                       const tp_batch_info *info)
{
    j->r.done(j->r.ctx, st, outs, n_outs, err, info);
    free(j);
}

static void fail_all(job *list, tp_status st, const tp_err *err)
{
    while (list) {
        job *next = list->next;
        finish_job(list, st, NULL, 0, err, NULL);
        list = next;
    }
}

static void answer_expired(job *list, double now)
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
static void sum_stats(const tp_engine_stats *snap, int n, tp_engine_stats *sum)
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
        sum_stats(b->snap, b->n_inst, &sum);
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

static void run_batch(tp_batcher *b, int k, job *batch)
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
            run_batch(b, k, batch);
        }
    } else if (st != TP_OK) {
        if (n > 1)
            tp_err_prefix(&err, "batch of %d requests (%lld rows): ", n, (long long)rows);
        fail_all(batch, st, &err);
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
static void batch_ended(tp_batcher *b, int k)
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
static int take_instance(tp_batcher *b)
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
    return take_instance(b);
}

static void *batcher_main(void *arg)
{
    tp_batcher *b = arg;
    int more = 1;
    while (more) {
        job *batch = NULL, *expired = NULL;
        pthread_mutex_lock(&b->mu);
        more = next_batch(b, &batch, &expired);
        int k = batch ? take_instance(b) : -1; /* next_batch waits for an idle one */
        b->thread_in_batch = batch != NULL;
        pthread_mutex_unlock(&b->mu);
        /* callbacks run unlocked: they may take their own locks or submit */
        answer_expired(expired, tp_now_s());
        if (batch)
            run_batch(b, k, batch);
        pthread_mutex_lock(&b->mu);
        if (batch)
            batch_ended(b, k);
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
        sum_stats(b->snap, n_inst, &sum);
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

/* An idle batcher with nothing queued and no delay to wait out would only
 * take the next request and run it alone: its submitter runs it itself,
 * sparing two thread hand-offs — while recent steps were short enough
 * (inline_max_us) not to hold up the submitter's other work, and while
 * requests did not pile up behind recent batches (batch_ended). b->mu held. */
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
    int k = run_here ? take_instance(b) : -1;
    if (hold) {
        *was_held = 1;
    } else if (!run_here && !stopping && !full) {
        append_job(&b->head, &b->tail, j);
        b->queued++;
        pthread_cond_signal(&b->cv);
    }
    pthread_mutex_unlock(&b->mu);
    if (run_here) {
        run_batch(b, k, j);
        pthread_mutex_lock(&b->mu);
        batch_ended(b, k);
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
    cut_expired(&list, &tail, now, &expired);
    answer_expired(expired, now);
    while (list) {
        int full, m = batch_prefix(b, list, &full);
        run_batch(b, k, cut_prefix(&list, m));
    }
    pthread_mutex_lock(&b->mu);
    batch_ended(b, k);
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

void tp_batcher_engine_stats(tp_batcher *b, tp_engine_stats *out)
{
    tp_engine_stats now[TP_BATCHER_MAX_INSTANCES];
    for (int k = 0; k < b->n_inst; k++)
        tp_engine_get_stats(b->inst[k], &now[k]);
    sum_stats(now, b->n_inst, out);
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
    answer_expired(expired, now);
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
    fail_all(list, st, &err);
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
