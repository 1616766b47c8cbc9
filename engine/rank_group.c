/* rank_group.c — the local ranks of a group are persistent threads; in a
 * process group every step is also announced to (leader) or taken from
 * (worker) the other processes, and its result merged across them.
 *
 * The calling thread never runs a rank itself: it waits for the local ranks
 * and, in a process group, looks every few milliseconds for a failure
 * elsewhere (wake our ranks blocked in a collective) or a dead process. */
#include "rank_group.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rank_procs.h"

#define POLL_MS 20

typedef struct {
    tp_rank_group *g;
    int rank;
} rank_arg;

struct tp_rank_group {
    int world, lo, hi;
    tp_rank_procs *procs; /* NULL: a thread group */
    pthread_t *threads;
    rank_arg *args;
    unsigned char *benign; /* per local rank: its failure this step is benign */
    int woke;              /* this step already called hooks->fail */
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation; /* bumped per run; threads wait for a change */
    int quit, n_done, n_threads;
    /* Thread groups: the thread calling run runs rank lo itself, sparing a
     * wake-up and a wait per step. Process groups keep a thread per local
     * rank: the caller must stay free to watch for dead processes. */
    int caller_runs;
    tp_rank_fn fn;
    void *ctx;
    const tp_rank_hooks *hooks;
    tp_status status;
    uint32_t ticket;
    tp_err first_err;
};

static void call_hook(const tp_rank_hooks *h, int lost)
{
    void (*f)(void *) = !h ? NULL : lost ? h->lost : h->fail;
    if (f)
        f(h->ctx);
}

/* The fail hook runs outside the mutex: a backend's abort may block (NCCL
 * revoke waits for its own streams) and must never hold up the other
 * ranks' finish or the poller. A benign failure (tp_rank_group_benign)
 * wakes nobody, here or in the other processes. */
static void finish_rank(tp_rank_group *g, int rank, tp_status st, tp_err *e)
{
    int wake = 0;
    pthread_mutex_lock(&g->mu);
    const tp_rank_hooks *hooks = g->hooks;
    if (st != TP_OK && g->status == TP_OK) {
        g->status = st;
        tp_err_prefix(e, "rank %d: ", rank);
        g->first_err = *e;
        wake = !g->benign[rank - g->lo];
        g->ticket = g->procs ? tp_rank_procs_fail_ticket(g->procs, wake) : 0;
        g->woke |= wake;
    }
    pthread_mutex_unlock(&g->mu);
    if (wake)
        call_hook(hooks, 0);
    pthread_mutex_lock(&g->mu);
    if (++g->n_done == g->n_threads + g->caller_runs)
        pthread_cond_signal(&g->done);
    pthread_mutex_unlock(&g->mu);
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    tp_rank_group *g = a->g;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&g->mu);
        while (!g->quit && g->generation == seen)
            pthread_cond_wait(&g->start, &g->mu);
        if (g->quit) {
            pthread_mutex_unlock(&g->mu);
            return NULL;
        }
        seen = g->generation;
        tp_rank_fn fn = g->fn;
        void *ctx = g->ctx;
        pthread_mutex_unlock(&g->mu);
        tp_err e = {{0}};
        tp_status st = fn(ctx, a->rank, &e);
        finish_rank(g, a->rank, st, &e);
    }
}

static tp_status start_threads(tp_rank_group *g, tp_err *err)
{
    g->caller_runs = !g->procs;
    g->n_threads = g->hi - g->lo - g->caller_runs;
    g->threads = calloc((size_t)g->n_threads, sizeof *g->threads);
    g->args = calloc((size_t)g->n_threads, sizeof *g->args);
    g->benign = calloc((size_t)(g->hi - g->lo), 1); /* every local rank, the caller's too */
    if (!g->threads || !g->args || !g->benign)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    for (int i = 0; i < g->n_threads; i++) {
        g->args[i] = (rank_arg){g, g->lo + g->caller_runs + i};
        if (pthread_create(&g->threads[i], NULL, rank_main, &g->args[i]) != 0) {
            g->n_threads = i; /* join only the threads that exist */
            return tp_fail(err, TP_INTERNAL, "rank group: cannot start thread for rank %d",
                           g->args[i].rank);
        }
    }
    return TP_OK;
}

tp_status tp_rank_group_create(const tp_rank_group_opts *o, tp_rank_group **out, tp_err *err)
{
    tp_rank_group *g = calloc(1, sizeof *g);
    if (!g)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->start, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->done, &ca);
    pthread_condattr_destroy(&ca);
    g->world = o->world;
    g->hi = o->world;
    tp_status st = TP_OK;
    if (o->mode != TP_GROUP_THREADS) {
        st = tp_rank_procs_create(o, &g->procs, err);
        if (st == TP_OK) {
            g->lo = tp_rank_procs_rank(g->procs);
            g->hi = g->lo + 1;
        }
    } else if (o->world < 1) {
        st = tp_fail(err, TP_INVALID, "rank group: world size %d", o->world);
    }
    if (st == TP_OK)
        st = start_threads(g, err);
    if (st != TP_OK) {
        tp_rank_group_free(g);
        return st;
    }
    *out = g;
    return TP_OK;
}

void tp_rank_group_stop(tp_rank_group *g)
{
    if (g->procs)
        tp_rank_procs_stop(g->procs);
}

void tp_rank_group_free(tp_rank_group *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = 1;
    pthread_cond_broadcast(&g->start);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; g->threads && i < g->n_threads; i++)
        pthread_join(g->threads[i], NULL);
    tp_rank_procs_free(g->procs);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->start);
    pthread_cond_destroy(&g->done);
    free(g->threads);
    free(g->args);
    free(g->benign);
    free(g);
}

int tp_rank_group_world(const tp_rank_group *g) { return g->world; }

void tp_rank_group_local(const tp_rank_group *g, int *lo, int *hi)
{
    *lo = g->lo;
    *hi = g->hi;
}

int tp_rank_group_leads(const tp_rank_group *g) { return g->lo == 0; }
const tp_rank_shared *tp_rank_group_shared(const tp_rank_group *g) { return g->procs ? tp_rank_procs_shared(g->procs) : NULL; }
const char *tp_rank_group_lost(const tp_rank_group *g) { return g->procs ? tp_rank_procs_lost(g->procs) : NULL; }

/* Tells the hooks what poll reports and they were not told yet (outside
 * the mutex: the hooks may wait for our ranks' threads). */
static int tell_hooks(tp_rank_group *g, const tp_rank_hooks *hooks, int told)
{
    int f = tp_rank_procs_poll(g->procs) & ~told;
    if (f & TP_POLL_ABORT)
        call_hook(hooks, 0);
    if (f & TP_POLL_LOST)
        call_hook(hooks, 1);
    return told | f;
}

/* Waits for the local ranks; in a process group, passes a failure elsewhere
 * to hooks->fail and a lost process to hooks->lost, once each. Returns what
 * it told. */
static int wait_local(tp_rank_group *g)
{
    int told = 0;
    while (g->n_done < g->n_threads + g->caller_runs) {
        if (!g->procs) {
            pthread_cond_wait(&g->done, &g->mu);
            continue;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += POLL_MS * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        if (pthread_cond_timedwait(&g->done, &g->mu, &ts) != ETIMEDOUT)
            continue;
        const tp_rank_hooks *hooks = g->hooks;
        pthread_mutex_unlock(&g->mu);
        told = tell_hooks(g, hooks, told);
        pthread_mutex_lock(&g->mu);
    }
    return told;
}

/* A lost group fails every later step at once, with the same message. */
static tp_status fail_if_lost(tp_rank_group *g, tp_err *err)
{
    const char *lost = tp_rank_procs_lost(g->procs);
    return lost ? tp_fail(err, TP_UNAVAILABLE, "%s", lost) : TP_OK;
}

tp_status tp_rank_group_run(tp_rank_group *g, tp_rank_fn fn, void *ctx, const tp_rank_hooks *hooks, tp_err *err)
{
    tp_err tmp;
    err = err ? err : &tmp;
    if (g->procs) {
        int quit;
        tp_status st = fail_if_lost(g, err);
        if (st != TP_OK)
            return st;
        st = g->lo == 0 ? tp_rank_procs_send(g->procs, TP_MSG_RUN, NULL, 0, err)
                                  : tp_rank_procs_recv(g->procs, TP_MSG_RUN, NULL, 0, NULL, &quit, err);
        if (st != TP_OK)
            return st;
    }
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->ctx = ctx;
    g->hooks = hooks;
    g->status = TP_OK;
    g->n_done = 0;
    memset(g->benign, 0, (size_t)(g->hi - g->lo));
    g->woke = 0;
    g->generation++;
    pthread_cond_broadcast(&g->start);
    if (g->caller_runs) {
        pthread_mutex_unlock(&g->mu);
        tp_err e = {{0}};
        tp_status rst = fn(ctx, g->lo, &e);
        finish_rank(g, g->lo, rst, &e);
        pthread_mutex_lock(&g->mu);
    }
    int told = wait_local(g) | (g->woke ? TP_POLL_ABORT : 0);
    tp_status st = g->status;
    tp_err first = g->first_err;
    uint32_t ticket = g->ticket;
    pthread_mutex_unlock(&g->mu);
    if (g->procs) {
        st = tp_rank_procs_finish(g->procs, st, &first, ticket, err);
        /* A rank elsewhere failed (not benignly) after ours were done: our
         * backend must learn it too, or it would stay healthy while the
         * failing rank's is torn down, and the next collective (or a
         * collective teardown) would wait for a peer that left. */
        if (st != TP_OK)
            tell_hooks(g, hooks, told);
        return st;
    }
    if (st != TP_OK)
        *err = first;
    return st;
}

void tp_rank_group_benign(tp_rank_group *g, int rank)
{
    pthread_mutex_lock(&g->mu);
    if (rank >= g->lo && rank < g->hi)
        g->benign[rank - g->lo] = 1;
    pthread_mutex_unlock(&g->mu);
}

tp_status tp_rank_group_share(tp_rank_group *g, void *buf, size_t *len, size_t cap, tp_err *err)
{
    int quit;
    if (!g->procs)
        return TP_OK;
    return g->lo == 0 ? tp_rank_procs_send(g->procs, TP_MSG_SHARE, buf, *len, err)
                      : tp_rank_procs_recv(g->procs, TP_MSG_SHARE, buf, cap, len, &quit, err);
}

tp_status tp_rank_group_post(tp_rank_group *g, const void *cmd, size_t len, tp_err *err)
{
    if (!g->procs)
        return TP_OK;
    tp_status st = fail_if_lost(g, err);
    return st == TP_OK ? tp_rank_procs_send(g->procs, TP_MSG_CMD, cmd, len, err) : st;
}

tp_status tp_rank_group_next(tp_rank_group *g, void *cmd, size_t cap, size_t *len, int *quit, tp_err *err)
{
    *quit = 0;
    if (!g->procs || g->lo == 0)
        return tp_fail(err, TP_INTERNAL, "rank group: only a worker process waits for commands");
    return tp_rank_procs_recv(g->procs, TP_MSG_CMD, cmd, cap, len, quit, err);
}
