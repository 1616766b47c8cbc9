#include "gen_sched.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"

struct tp_gen_seq {
    _Atomic int refs; /* the caller's, and the scheduler's until the end */
    _Atomic int cancelled;
    pthread_mutex_t mu; /* tokens, n_tokens, end, err, notify, armed */
    int64_t *prompt, n_prompt;
    int64_t prefilled;  /* prompt rows fed (scheduler thread only) */
    int64_t *tokens, n_tokens, cap_tokens, max_tokens;
    int64_t *stop_ids;
    int n_stop;
    int64_t slot; /* 1-based */
    tp_gen_end end;
    tp_status fail_st; /* TP_GEN_FAILED: the step's status */
    tp_err err;
    tp_gen_notify *notify;
    void *notify_arg;
    int armed; /* tp_gen_wake, 0: not armed */
    double t_first, t_last;
};

/* A step's rows and whom they belong to. */
typedef struct {
    int64_t *ids, *pos, *slot, *want, *next;
    tp_gen_seq **owner; /* the sequence whose next token is this row's output; NULL: a prompt row before its last */
    int64_t rows;
} step_rows;

struct tp_gen {
    tp_gen_opts o;
    pthread_t thread;
    pthread_mutex_t mu; /* seqs, free slots, stopping, stats */
    pthread_cond_t cv;
    int stopping;       /* the thread is to end: no new sequence */
    int started, stopped; /* the thread was started; joined and every sequence ended */
    tp_gen_seq **seqs;  /* by slot - 1; NULL: free */
    int64_t active;
    tp_gen_seq **pending; /* sequences with prompt rows still to feed, oldest first */
    int64_t n_pending;
    int last_prefill;   /* the last step was a prefill step (TP_GEN_PREFILL_SEPARATE) */
    step_rows sr;       /* the step being run, in causal order */
    step_rows piece;    /* the engine call being run: <= max_rows rows, wanted ones first */
    tp_gen_stats st;
};

const char *tp_gen_end_name(tp_gen_end e)
{
    static const char *const names[] = {"running", "stop", "length", "cache_full", "cancelled", "failed"};
    return (unsigned)e < sizeof names / sizeof *names ? names[e] : "?";
}

static void seq_unref(tp_gen_seq *q)
{
    if (atomic_fetch_sub(&q->refs, 1) != 1)
        return;
    pthread_mutex_destroy(&q->mu);
    free(q->prompt);
    free(q->tokens);
    free(q->stop_ids);
    free(q);
}

/* ---- the scheduler thread ------------------------------------------------ */

/* With q->mu held: wakes a reader armed for what just happened. */
static void wake_reader(tp_gen_seq *q)
{
    int due = q->armed == TP_GEN_WAKE_TOKEN || (q->armed && q->end != TP_GEN_RUNNING);
    if (due && q->notify) {
        q->armed = 0;
        q->notify(q->notify_arg);
    }
}

/* With g->mu held: q ends (why, err for TP_GEN_FAILED); its slot is free. */
static void finish(tp_gen *g, tp_gen_seq *q, tp_gen_end why, tp_status st, const tp_err *err)
{
    pthread_mutex_lock(&q->mu);
    q->end = why;
    q->fail_st = st;
    if (err)
        q->err = *err;
    wake_reader(q);
    pthread_mutex_unlock(&q->mu);
    g->st.failed += why == TP_GEN_FAILED;
    g->st.cancelled += why == TP_GEN_CANCELLED;
    if (q->n_tokens > 1) {
        g->st.decode_s += q->t_last - q->t_first;
        g->st.decode_tokens += (uint64_t)(q->n_tokens - 1);
    }
    if (q->prefilled < q->n_prompt) { /* still in pending */
        int64_t k = 0;
        while (g->pending[k] != q)
            k++;
        g->n_pending--;
        memmove(g->pending + k, g->pending + k + 1, (size_t)(g->n_pending - k) * sizeof *g->pending);
    }
    g->seqs[q->slot - 1] = NULL;
    g->active--;
    seq_unref(q);
}

static void add_row(step_rows *sr, int64_t id, int64_t pos, int64_t slot, tp_gen_seq *owner)
{
    sr->ids[sr->rows] = id;
    sr->pos[sr->rows] = pos;
    sr->slot[sr->rows] = slot;
    sr->want[sr->rows] = owner != NULL;
    sr->owner[sr->rows++] = owner;
}

static void add_decode_rows(tp_gen *g)
{
    for (int64_t s = 0; s < g->o.slots; s++) {
        tp_gen_seq *q = g->seqs[s];
        if (q && q->prefilled == q->n_prompt)
            add_row(&g->sr, q->tokens[q->n_tokens - 1], q->n_prompt + q->n_tokens - 1, q->slot, q);
    }
}

/* Up to budget prompt rows, oldest sequence first (first come, first
 * served: a prompt that arrives while another is being fed waits for it,
 * so prompts finish one after another rather than all late together).
 * Rows of one sequence stay in position order: a step that runs in pieces
 * writes a position before a later piece reads it. */
static void add_prompt_rows(tp_gen *g, int64_t budget)
{
    int64_t done = 0;
    for (int64_t k = 0; k < g->n_pending && budget > 0; k++) {
        tp_gen_seq *q = g->pending[k];
        int64_t take = q->n_prompt - q->prefilled < budget ? q->n_prompt - q->prefilled : budget;
        budget -= take;
        for (int64_t i = q->prefilled; i < q->prefilled + take; i++)
            add_row(&g->sr, q->prompt[i], i, q->slot, i == q->n_prompt - 1 ? q : NULL);
        q->prefilled += take;
        done += q->prefilled == q->n_prompt;
    }
    g->n_pending -= done; /* the finished ones are the first `done` */
    memmove(g->pending, g->pending + done, (size_t)g->n_pending * sizeof *g->pending);
}

/* With g->mu held: the next step's rows. A cancelled sequence leaves here.
 *
 * TP_GEN_PREFILL_MIXED (vLLM's chunked prefill): every running sequence's
 * next token, then prompt rows up to max_rows, and at least a quarter of
 * max_rows, so that neither the running sequences nor the waiting prompts
 * ever starve. TP_GEN_PREFILL_SEPARATE: a step is all prompt rows (up to
 * max_rows) or all decode rows; while both wait they alternate, so a
 * running sequence waits at most one prefill step for its next token. */
static void build_step(tp_gen *g)
{
    g->sr.rows = 0;
    int64_t decoding = 0;
    for (int64_t s = 0; s < g->o.slots; s++) {
        tp_gen_seq *q = g->seqs[s];
        if (q && atomic_load(&q->cancelled))
            finish(g, q, TP_GEN_CANCELLED, TP_OK, NULL);
        else if (q && q->prefilled == q->n_prompt)
            decoding++;
    }
    int64_t max = g->o.max_rows, quarter = max / 4 > 0 ? max / 4 : 1;
    if (g->o.prefill == TP_GEN_PREFILL_SEPARATE) {
        int prefill = g->n_pending > 0 && !(decoding > 0 && g->last_prefill);
        if (prefill)
            add_prompt_rows(g, max);
        else
            add_decode_rows(g);
        g->last_prefill = prefill;
        return;
    }
    add_decode_rows(g);
    add_prompt_rows(g, max - g->sr.rows > quarter ? max - g->sr.rows : quarter);
}

/* The rows [from, from + n) of the step into g->piece, the rows whose token
 * is wanted first (a stable partition): a graph with logit rows computes
 * its LM head only for those, as one run. Reordering inside one engine
 * call is safe because kv_attention writes every row before any row
 * reads. */
static void make_piece(tp_gen *g, int64_t from, int64_t n)
{
    step_rows *sr = &g->sr, *p = &g->piece;
    p->rows = 0;
    for (int pass = 1; pass >= 0; pass--)
        for (int64_t r = from; r < from + n; r++)
            if (sr->want[r] == pass)
                add_row(p, sr->ids[r], sr->pos[r], sr->slot[r], sr->owner[r]);
}

/* With g->mu held: q's next token is t. */
static void take_token(tp_gen *g, tp_gen_seq *q, int64_t t, double now)
{
    pthread_mutex_lock(&q->mu);
    q->tokens[q->n_tokens++] = t;
    if (q->n_tokens == 1)
        q->t_first = now;
    q->t_last = now;
    int stop = 0;
    for (int k = 0; k < q->n_stop; k++)
        stop |= q->stop_ids[k] == t;
    /* cap_tokens is max_tokens, or less when the slot fills up first: the
     * token just made would be fed back at position n_prompt + n_tokens - 1 */
    tp_gen_end end = stop                             ? TP_GEN_STOP
                     : q->n_tokens < q->cap_tokens    ? TP_GEN_RUNNING
                     : q->cap_tokens < q->max_tokens  ? TP_GEN_CACHE_FULL
                                                      : TP_GEN_LENGTH;
    wake_reader(q);
    pthread_mutex_unlock(&q->mu);
    g->st.output_tokens++;
    if (end != TP_GEN_RUNNING)
        finish(g, q, end, TP_OK, NULL);
}

/* With g->mu held (released while the engine runs): one engine call of
 * the step's rows from `from` on. When it fails, every sequence with a row
 * in it or after it ends TP_GEN_FAILED. */
static tp_status run_piece(tp_gen *g, int64_t from)
{
    int64_t n = g->sr.rows - from < g->o.max_rows ? g->sr.rows - from : g->o.max_rows;
    make_piece(g, from, n);
    step_rows *p = &g->piece;
    pthread_mutex_unlock(&g->mu);
    tp_err err = {0};
    double t0 = tp_now_s();
    tp_status st = g->o.step(g->o.step_arg, p->ids, p->pos, p->slot, p->want, p->rows, p->next, &err);
    double t1 = tp_now_s();
    pthread_mutex_lock(&g->mu);
    g->st.steps++;
    g->st.rows += (uint64_t)p->rows;
    g->st.step_s += t1 - t0;
    const step_rows *rows = st == TP_OK ? p : &g->sr;
    for (int64_t r = st == TP_OK ? 0 : from; r < rows->rows; r++) {
        tp_gen_seq *q = g->seqs[rows->slot[r] - 1];
        if (!q)
            continue; /* ended by an earlier row of this step */
        if (st != TP_OK)
            finish(g, q, TP_GEN_FAILED, st, &err);
        else if (p->owner[r] == q)
            take_token(g, q, p->next[r], t1);
    }
    return st;
}

static void *gen_main(void *arg)
{
    tp_gen *g = arg;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->stopping && g->active == 0)
            pthread_cond_wait(&g->cv, &g->mu);
        if (g->stopping)
            break;
        build_step(g);
        for (int64_t from = 0; from < g->sr.rows; from += g->o.max_rows)
            if (run_piece(g, from) != TP_OK)
                break;
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---- create, submit, read ------------------------------------------------ */

static int rows_alloc(step_rows *sr, int64_t n)
{
    sr->ids = malloc((size_t)n * sizeof(int64_t));
    sr->pos = malloc((size_t)n * sizeof(int64_t));
    sr->slot = malloc((size_t)n * sizeof(int64_t));
    sr->want = malloc((size_t)n * sizeof(int64_t));
    sr->next = malloc((size_t)n * sizeof(int64_t));
    sr->owner = malloc((size_t)n * sizeof(tp_gen_seq *));
    return sr->ids && sr->pos && sr->slot && sr->want && sr->next && sr->owner;
}

static void rows_free(step_rows *sr)
{
    free(sr->ids);
    free(sr->pos);
    free(sr->slot);
    free(sr->want);
    free(sr->next);
    free(sr->owner);
}

tp_status tp_gen_create(const tp_gen_opts *o, tp_gen **out, tp_err *err)
{
    *out = NULL;
    if (o->max_rows < 1 || o->slots < 1 || o->max_seq_len < 1 || o->vocab_size < 1 || !o->step ||
        (o->prefill != TP_GEN_PREFILL_MIXED && o->prefill != TP_GEN_PREFILL_SEPARATE))
        return tp_fail(err, TP_INVALID, "generation: rows per step (%lld), slots (%lld), max_seq_len (%lld) "
                       "and vocab_size (%lld) must be positive, prefill mixed or separate", (long long)o->max_rows, (long long)o->slots,
                       (long long)o->max_seq_len, (long long)o->vocab_size);
    tp_gen *g = calloc(1, sizeof *g);
    int ok = g != NULL;
    if (ok) {
        g->o = *o;
        g->seqs = calloc((size_t)o->slots, sizeof *g->seqs);
        g->pending = calloc((size_t)o->slots, sizeof *g->pending);
        /* every running sequence, and prompt rows */
        ok = g->seqs && g->pending && rows_alloc(&g->sr, o->slots + o->max_rows) && rows_alloc(&g->piece, o->max_rows);
        g->st.slots = o->slots;
        g->st.max_seq_len = o->max_seq_len;
    }
    if (!ok) {
        tp_gen_free(g);
        return tp_fail(err, TP_NOMEM, "generation: out of memory for %lld slots", (long long)o->slots);
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    if (pthread_create(&g->thread, NULL, gen_main, g) != 0) {
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
        tp_gen_free(g);
        return tp_fail(err, TP_INTERNAL, "generation: cannot start the scheduler thread");
    }
    g->started = 1;
    *out = g;
    return TP_OK;
}

void tp_gen_stop(tp_gen *g, const char *why)
{
    if (!g || g->stopped)
        return;
    pthread_mutex_lock(&g->mu);
    g->stopping = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    pthread_join(g->thread, NULL);
    tp_err e;
    tp_fail(&e, TP_UNAVAILABLE, "%s", why);
    pthread_mutex_lock(&g->mu);
    for (int64_t s = 0; s < g->o.slots; s++)
        if (g->seqs[s])
            finish(g, g->seqs[s], TP_GEN_FAILED, TP_UNAVAILABLE, &e);
    pthread_mutex_unlock(&g->mu);
    g->stopped = 1;
}

void tp_gen_free(tp_gen *g)
{
    if (!g)
        return;
    if (g->started) {
        tp_gen_stop(g, "the server is stopping");
        pthread_mutex_destroy(&g->mu);
        pthread_cond_destroy(&g->cv);
    }
    free(g->seqs);
    free(g->pending);
    rows_free(&g->sr);
    rows_free(&g->piece);
    free(g);
}

static tp_status check_request(const tp_gen *g, const tp_gen_request *rq, tp_err *err)
{
    if (rq->n_prompt < 1)
        return tp_fail(err, TP_INVALID, "input_ids is empty: a prompt needs at least one token");
    if (rq->n_prompt > g->o.max_seq_len)
        return tp_fail(err, TP_INVALID, "input_ids has %lld tokens, more than the model's max_seq_len %lld",
                       (long long)rq->n_prompt, (long long)g->o.max_seq_len);
    for (int64_t i = 0; i < rq->n_prompt; i++)
        if (rq->prompt[i] < 0 || rq->prompt[i] >= g->o.vocab_size)
            return tp_fail(err, TP_INVALID, "input_ids[%lld] = %lld is outside the vocabulary [0, %lld)",
                           (long long)i, (long long)rq->prompt[i], (long long)g->o.vocab_size);
    if (rq->max_tokens < 1)
        return tp_fail(err, TP_INVALID, "max_tokens is %lld: it must be at least 1", (long long)rq->max_tokens);
    if (rq->n_stop < 0)
        return tp_fail(err, TP_INVALID, "a negative number of stop ids");
    return TP_OK;
}

static tp_gen_seq *new_seq(const tp_gen *g, const tp_gen_request *rq)
{
    tp_gen_seq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    /* a prompt of P tokens leaves room for L - P + 1 more: the last one is
     * never fed back */
    int64_t room = g->o.max_seq_len - rq->n_prompt + 1;
    q->max_tokens = rq->max_tokens;
    q->cap_tokens = rq->max_tokens < room ? rq->max_tokens : room;
    q->prompt = malloc((size_t)rq->n_prompt * sizeof(int64_t));
    q->tokens = malloc((size_t)q->cap_tokens * sizeof(int64_t));
    q->stop_ids = malloc(((size_t)rq->n_stop + 1) * sizeof(int64_t));
    if (!q->prompt || !q->tokens || !q->stop_ids) {
        free(q->prompt);
        free(q->tokens);
        free(q->stop_ids);
        free(q);
        return NULL;
    }
    memcpy(q->prompt, rq->prompt, (size_t)rq->n_prompt * sizeof(int64_t));
    if (rq->n_stop)
        memcpy(q->stop_ids, rq->stop_ids, (size_t)rq->n_stop * sizeof(int64_t));
    q->n_prompt = rq->n_prompt;
    q->n_stop = rq->n_stop;
    q->notify = rq->notify;
    q->notify_arg = rq->notify_arg;
    atomic_init(&q->refs, 2);
    pthread_mutex_init(&q->mu, NULL);
    return q;
}

tp_status tp_gen_submit(tp_gen *g, const tp_gen_request *rq, tp_gen_seq **out, tp_err *err)
{
    *out = NULL;
    tp_status st = check_request(g, rq, err);
    if (st != TP_OK)
        return st;
    tp_gen_seq *q = new_seq(g, rq);
    if (!q)
        return tp_fail(err, TP_NOMEM, "out of memory for a sequence of %lld prompt tokens", (long long)rq->n_prompt);
    pthread_mutex_lock(&g->mu);
    int64_t s = 0;
    while (s < g->o.slots && g->seqs[s])
        s++;
    if (s == g->o.slots || g->stopping) {
        pthread_mutex_unlock(&g->mu);
        atomic_store(&q->refs, 1);
        seq_unref(q);
        return g->stopping ? tp_fail(err, TP_UNAVAILABLE, "the server is stopping")
                           : tp_fail(err, TP_UNAVAILABLE, "all %lld sequence slots are in use "
                                     "(generate_slots): retry later", (long long)g->o.slots);
    }
    q->slot = s + 1;
    g->seqs[s] = q;
    g->pending[g->n_pending++] = q;
    g->active++;
    g->st.sequences++;
    g->st.prompt_tokens += (uint64_t)rq->n_prompt;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
    *out = q;
    return TP_OK;
}

int64_t tp_gen_seq_read(tp_gen_seq *q, int64_t from, int64_t *ids, int64_t cap, tp_gen_wake wake_on,
                        void (*armed)(void *), void *armed_arg, tp_gen_end *end, tp_status *st, tp_err *err)
{
    pthread_mutex_lock(&q->mu);
    int64_t n = q->n_tokens > from ? q->n_tokens - from : 0;
    if (n > cap)
        n = cap;
    if (n > 0)
        memcpy(ids, q->tokens + from, (size_t)n * sizeof(int64_t));
    *end = q->end;
    if (st)
        *st = q->end == TP_GEN_FAILED ? q->fail_st : TP_OK;
    if (q->end == TP_GEN_FAILED && err)
        *err = q->err;
    if (n == 0 && q->end == TP_GEN_RUNNING) {
        q->armed = (int)wake_on;
        if (armed)
            armed(armed_arg);
    }
    pthread_mutex_unlock(&q->mu);
    return n;
}

int64_t tp_gen_seq_max_tokens(const tp_gen_seq *q) { return q->cap_tokens; }

void tp_gen_seq_cancel(tp_gen_seq *q) { atomic_store(&q->cancelled, 1); }

void tp_gen_seq_release(tp_gen_seq *q)
{
    if (!q)
        return;
    pthread_mutex_lock(&q->mu);
    q->notify = NULL;
    q->armed = 0;
    pthread_mutex_unlock(&q->mu);
    tp_gen_seq_cancel(q); /* a no-op once it has ended */
    seq_unref(q);
}

void tp_gen_get_stats(tp_gen *g, tp_gen_stats *out)
{
    pthread_mutex_lock(&g->mu);
    *out = g->st;
    out->slots_in_use = g->active;
    pthread_mutex_unlock(&g->mu);
}
