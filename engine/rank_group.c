/* rank_group.c — how a step reaches the local ranks of a group.
 *
 * The thread calling run runs the first local rank itself. In a thread
 * group the other ranks are persistent threads; a process runs one rank, so
 * its caller runs it and no hand-off is left (the step is still announced
 * to, or taken from, the other processes, and its result merged across
 * them: rank_procs.c).
 *
 * Starting and finishing a step takes no lock: the caller publishes the
 * step and bumps `gen`, which rank threads wait to see change; each rank
 * thread counts `running` down, which the caller waits to see reach 0. A
 * waiter spins for a bounded time before it sleeps on the word with a
 * futex (util/spin_wait.h: never when the ranks outnumber the cores),
 * counted in a sleepers word so that the other side makes the wake-up
 * syscall only when someone sleeps. Each wait site keeps its own
 * history (tp_spin_site): a rank thread waiting for the next step at one
 * request at a time finds the step a whole HTTP round trip away, its spins
 * run out, and it soon sleeps at once; with steps back to back they pay.
 *
 * Serial steps (tp_rank_group_set_serial): every local rank runs as a
 * fiber of the caller's thread, in turn, and the rank threads are not told
 * of the step at all, when that has been faster (serial_policy.h). With two
 * ranks of a few microseconds each, the wake-up of the other rank's thread
 * cost more than the step (at one request at a time it was half the
 * server's CPU: the futex wake-up's interrupt to a halted vCPU on the
 * waker, and the waker spinning until the peer ran).
 *
 * Process groups: while a step is in flight, a watchdog thread looks every
 * POLL_MS for a failure in another process (our rank may be blocked in a
 * collective waiting for the failed one: hooks->fail), a dead or hung
 * process (hooks->lost), or an error the backend learnt of asynchronously
 * while our rank waits (hooks->fault, then hooks->fail) — what the caller
 * did itself when it only waited for a rank thread, now off the step's
 * path. It sleeps for good once no step has run for IDLE_MS, so steps back
 * to back never wake it and an idle server is not woken 50 times a second. */
#include "rank_group.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "fiber.h"
#include "rank_procs.h"
#include "serial_policy.h"
#include "spin_wait.h"

#define POLL_MS 20
#define IDLE_MS 1000

typedef struct {
    tp_rank_group *g;
    int rank;
} rank_arg;

struct tp_rank_group {
    int world, lo, hi;
    tp_rank_procs *procs; /* NULL: a thread group */
    pthread_t *threads;
    rank_arg *args;
    int n_threads; /* rank threads: every local rank but the caller's */
    int64_t spin_ns;
    tp_spin_site caller_site; /* the caller's wait for the rank threads */

    /* Serial steps: every local rank a fiber of the caller's thread. */
    tp_fibers *fibers;        /* NULL: never */
    tp_serial_policies policies; /* the stepping thread's */
    _Atomic int serial;       /* the mode the last step's size class runs next, for prewake */
    _Atomic uint64_t serial_steps;

    /* The step in flight: written by the caller before it bumps gen. */
    tp_rank_fn fn;
    void *ctx;
    const tp_rank_hooks *hooks;
    unsigned char *benign; /* per local rank, written by its own thread */
    /* The first failure: the rank that wins `failed` writes the rest before
     * it counts itself out of `running`. */
    _Atomic int failed;
    tp_status status;
    tp_err first_err;
    uint32_t ticket;
    int woke; /* the first failure called hooks->fail */

    _Atomic uint32_t gen;     /* futex: steps started (quit bumps it too) */
    _Atomic uint32_t running; /* futex: rank threads not done with this step */
    _Atomic uint32_t gen_sleepers, running_sleepers;
    _Atomic uint32_t quit;    /* futex: the watchdog's tick sleeps on it */

    /* Process groups: the watchdog. */
    int has_watchdog;
    pthread_t watchdog;
    pthread_mutex_t watch_mu;  /* held by a tick; the caller takes it to end a step's watch */
    _Atomic uint32_t steps;    /* futex: watched steps begun (quit bumps it too) */
    _Atomic int in_step, watch_idle;
    int told;                  /* TP_POLL_* the hooks were told this step (watch_mu) */
};

static void call_hook(const tp_rank_hooks *h, int lost)
{
    void (*f)(void *) = !h ? NULL : lost ? h->lost : h->fail;
    if (f)
        f(h->ctx);
}

/* ------------------------------------------------------------ waiting */

typedef struct {
    _Atomic uint32_t *w;
    uint32_t v;
} word_is;

static int word_moved(const void *p)
{
    const word_is *x = p;
    return atomic_load(x->w) != x->v;
}

static int ranks_done(const void *p) { return atomic_load(&((tp_rank_group *)p)->running) == 0; }

/* The caller: until every rank thread is done with the step. */
static void wait_ranks(tp_rank_group *g)
{
    if (tp_spin_site_until(&g->caller_site, ranks_done, g, g->spin_ns))
        return;
    for (uint32_t v; (v = atomic_load(&g->running)) != 0;)
        tp_futex_sleep(&g->running, v, &g->running_sleepers, -1, 0);
}

/* A rank thread: until gen moves past seen. Woken without a step (a
 * pre-wake: tp_rank_group_prewake), it spins for the step that is on its
 * way before it sleeps again. A wait between steps: its site may stretch
 * its spins (tp_spin_site_ended; rank_procs.c's wait for the next command
 * says why only such waits). */
static void wait_step(tp_rank_group *g, uint32_t seen, tp_spin_site *site)
{
    word_is moved = {&g->gen, seen};
    if (tp_spin_site_until(site, word_moved, &moved, g->spin_ns))
        return;
    while (atomic_load(&g->gen) == seen) {
        tp_futex_sleep(&g->gen, seen, &g->gen_sleepers, -1, 0);
        tp_spin_until(word_moved, &moved, g->spin_ns);
    }
    tp_spin_site_ended(site);
}

void tp_rank_group_prewake(tp_rank_group *g)
{
    /* Only where ranks may spin: a pre-woken rank on a shared core would
     * take the core from the thread about to start the step. Not for a
     * serial step either: the caller runs every rank. */
    if (g->procs)
        tp_rank_procs_prewake(g->procs);
    else if (g->spin_ns > 0 && !atomic_load_explicit(&g->serial, memory_order_relaxed))
        tp_futex_wake_sleepers(&g->gen, &g->gen_sleepers, 0);
}

/* ------------------------------------------------------------ ranks */

/* The first failing rank records the step's status and, unless its failure
 * is benign (tp_rank_group_benign), wakes the peers through hooks->fail —
 * before it counts itself done, so the step never ends with the hook still
 * running. A backend's abort may block (NCCL revoke waits for its own
 * streams): it holds up nobody but this rank. */
static void finish_rank(tp_rank_group *g, int rank, tp_status st, tp_err *e)
{
    int none = 0;
    if (st == TP_OK || !atomic_compare_exchange_strong(&g->failed, &none, 1))
        return;
    int wake = !g->benign[rank - g->lo];
    g->status = st;
    tp_err_prefix(e, "rank %d: ", rank);
    g->first_err = *e;
    g->ticket = g->procs ? tp_rank_procs_fail_ticket(g->procs, wake) : 0;
    g->woke = wake;
    if (wake)
        call_hook(g->hooks, 0);
}

static void run_local(tp_rank_group *g, int rank)
{
    tp_err e = {{0}};
    tp_status st = g->fn(g->ctx, rank, &e);
    finish_rank(g, rank, st, &e);
}

static void run_fiber(void *p, int i)
{
    tp_rank_group *g = p;
    run_local(g, g->lo + i);
}

static void *rank_main(void *p)
{
    rank_arg *a = p;
    tp_rank_group *g = a->g;
    char name[16];
    snprintf(name, sizeof name, "rank %d", a->rank);
    pthread_setname_np(pthread_self(), name);
    uint32_t seen = 0;
    tp_spin_site site = {0};
    for (;;) {
        wait_step(g, seen, &site);
        if (atomic_load(&g->quit))
            return NULL;
        seen = atomic_load(&g->gen); /* moves once per step: run waits for us */
        run_local(g, a->rank);
        if (atomic_fetch_sub(&g->running, 1) == 1)
            tp_futex_wake_sleepers(&g->running, &g->running_sleepers, 0);
    }
}

static tp_status start_threads(tp_rank_group *g, tp_err *err)
{
    g->n_threads = g->hi - g->lo - 1;
    g->threads = calloc((size_t)g->n_threads + 1, sizeof *g->threads);
    g->args = calloc((size_t)g->n_threads + 1, sizeof *g->args);
    g->benign = calloc((size_t)(g->hi - g->lo), 1); /* every local rank, the caller's too */
    if (!g->threads || !g->args || !g->benign)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    for (int i = 0; i < g->n_threads; i++) {
        g->args[i] = (rank_arg){g, g->lo + 1 + i};
        if (pthread_create(&g->threads[i], NULL, rank_main, &g->args[i]) != 0) {
            g->n_threads = i; /* join only the threads that exist */
            return tp_fail(err, TP_INTERNAL, "rank group: cannot start thread for rank %d", g->args[i].rank);
        }
    }
    return TP_OK;
}

/* ------------------------------------------------------------ watchdog */

/* Tells the hooks what poll reports, or the backend's own fault, and they
 * were not told yet. */
static int tell_hooks(tp_rank_group *g, const tp_rank_hooks *hooks, int told)
{
    int f = tp_rank_procs_poll(g->procs) & ~told;
    if (!(told & TP_POLL_ABORT) && hooks && hooks->fault && hooks->fault(hooks->ctx))
        f |= TP_POLL_ABORT;
    if (f & TP_POLL_ABORT)
        call_hook(hooks, 0);
    if (f & TP_POLL_LOST)
        call_hook(hooks, 1);
    return told | f;
}

/* Sleeps until a step begins or quit, if none began since `seen`. */
static void watch_idle(tp_rank_group *g, uint32_t seen)
{
    atomic_store(&g->watch_idle, 1);
    if (atomic_load(&g->steps) == seen && !atomic_load(&g->quit))
        tp_futex_wait(&g->steps, seen, -1, 0);
    atomic_store(&g->watch_idle, 0);
}

static void *watch_main(void *p)
{
    tp_rank_group *g = p;
    pthread_setname_np(pthread_self(), "rank watchdog"); /* the cuda test double knows it by this name */
    uint32_t seen = atomic_load(&g->steps);
    int64_t quiet_since = tp_now_ns();
    while (!atomic_load(&g->quit)) {
        uint32_t s = atomic_load(&g->steps);
        int64_t now = tp_now_ns();
        if (s != seen || atomic_load(&g->in_step)) {
            seen = s;
            quiet_since = now;
        } else if (now - quiet_since > (int64_t)IDLE_MS * 1000000) {
            watch_idle(g, s);
            continue;
        }
        tp_futex_wait(&g->quit, 0, POLL_MS, 0);
        pthread_mutex_lock(&g->watch_mu);
        if (atomic_load(&g->in_step))
            g->told = tell_hooks(g, g->hooks, g->told);
        pthread_mutex_unlock(&g->watch_mu);
    }
    return NULL;
}

static tp_status start_watchdog(tp_rank_group *g, tp_err *err)
{
    if (pthread_create(&g->watchdog, NULL, watch_main, g) != 0)
        return tp_fail(err, TP_INTERNAL, "rank group: cannot start the watchdog thread");
    g->has_watchdog = 1;
    return TP_OK;
}

static void stop_watchdog(tp_rank_group *g)
{
    if (!g->has_watchdog)
        return;
    atomic_store(&g->quit, 1);
    atomic_fetch_add(&g->steps, 1);
    tp_futex_wake(&g->steps, 0);
    tp_futex_wake(&g->quit, 0);
    pthread_join(g->watchdog, NULL);
    g->has_watchdog = 0;
}

static void watch_begin(tp_rank_group *g)
{
    g->told = 0;
    atomic_store(&g->in_step, 1);
    atomic_fetch_add(&g->steps, 1);
    if (atomic_load(&g->watch_idle))
        tp_futex_wake(&g->steps, 0);
}

/* After it, the watchdog is not inside (and never again calls) this step's
 * hooks, which may live on the caller's stack. Returns what they were told. */
static int watch_end(tp_rank_group *g)
{
    pthread_mutex_lock(&g->watch_mu);
    atomic_store(&g->in_step, 0);
    int told = g->told;
    pthread_mutex_unlock(&g->watch_mu);
    return told;
}

/* ------------------------------------------------------------ group */

static int64_t spin_budget(const tp_rank_group_opts *o)
{
    int64_t ns = tp_spin_budget(o->world, o->cores > 0 ? o->cores : tp_spin_cores());
    return ns > 0 && o->spin_ns > 0 ? o->spin_ns : ns;
}

tp_status tp_rank_group_create(const tp_rank_group_opts *o, tp_rank_group **out, tp_err *err)
{
    tp_rank_group *g = calloc(1, sizeof *g);
    if (!g)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    pthread_mutex_init(&g->watch_mu, NULL);
    g->world = o->world;
    g->hi = o->world;
    g->spin_ns = spin_budget(o);
    tp_status st = TP_OK;
    if (o->mode != TP_GROUP_THREADS) {
        st = tp_rank_procs_create(o, g->spin_ns, &g->procs, err);
        if (st == TP_OK) {
            g->lo = tp_rank_procs_rank(g->procs);
            g->hi = g->lo + 1;
            st = start_watchdog(g, err);
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
    stop_watchdog(g); /* it must not look at workers being reaped */
    if (g->procs)
        tp_rank_procs_stop(g->procs);
}

void tp_rank_group_free(tp_rank_group *g)
{
    if (!g)
        return;
    stop_watchdog(g);
    atomic_store(&g->quit, 1);
    atomic_fetch_add(&g->gen, 1);
    tp_futex_wake(&g->gen, 0);
    for (int i = 0; g->threads && i < g->n_threads; i++)
        pthread_join(g->threads[i], NULL);
    tp_rank_procs_free(g->procs);
    tp_fibers_free(g->fibers);
    pthread_mutex_destroy(&g->watch_mu);
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
const char *tp_rank_group_lost_known(const tp_rank_group *g)
{
    return g->procs ? tp_rank_procs_lost_known(g->procs) : NULL;
}

int tp_rank_group_pending(const tp_rank_group *g, int *ranks, int cap)
{
    return g->procs ? tp_rank_procs_pending(g->procs, ranks, cap) : -1;
}

/* A lost group fails every later step at once, with the same message
 * (a death not found yet fails the step in its first wait). */
static tp_status fail_if_lost(tp_rank_group *g, tp_err *err)
{
    const char *lost = tp_rank_procs_lost_known(g->procs);
    return lost ? tp_fail(err, TP_UNAVAILABLE, "%s", lost) : TP_OK;
}

tp_status tp_rank_group_set_serial(tp_rank_group *g, int max_us, tp_err *err)
{
    if (g->procs || max_us <= 0 || g->fibers || g->n_threads == 0)
        return TP_OK; /* no rank thread to spare a wake-up of */
    tp_status st = tp_fibers_create(g->hi - g->lo, 0, &g->fibers, err);
    if (st != TP_OK)
        return st;
    tp_serial_policies_init(&g->policies, (int64_t)max_us * 1000, g->hi - g->lo);
    atomic_store(&g->serial, tp_serial_policy_peek(tp_serial_policies_for(&g->policies, 0)));
    return TP_OK;
}

uint64_t tp_rank_group_serial_steps(const tp_rank_group *g) { return atomic_load(&g->serial_steps); }
int tp_rank_group_serial_max_us(const tp_rank_group *g)
{
    return g->fibers ? (int)(g->policies.by_class[0].max_ns / 1000) : 0;
}

/* Publishes the step: the watchdog sees it once in_step is set, the rank
 * threads once gen moves (not for a serial step: they sit it out). */
static void begin_step(tp_rank_group *g, tp_rank_fn fn, void *ctx, const tp_rank_hooks *hooks, int serial)
{
    g->fn = fn;
    g->ctx = ctx;
    g->hooks = hooks;
    g->status = TP_OK;
    g->woke = 0;
    memset(g->benign, 0, (size_t)(g->hi - g->lo));
    atomic_store(&g->failed, 0);
    atomic_store(&g->running, serial ? 0 : (uint32_t)g->n_threads);
    if (g->procs)
        watch_begin(g);
    if (g->n_threads && !serial) {
        atomic_fetch_add(&g->gen, 1);
        tp_futex_wake_sleepers(&g->gen, &g->gen_sleepers, 0);
    }
}

/* Every local rank on the calling thread, in turn (util/fiber.h); a rank
 * waiting for its peers in a collective yields to them. */
static void run_serial(tp_rank_group *g)
{
    tp_fibers_run(g->fibers, run_fiber, g);
    atomic_fetch_add(&g->serial_steps, 1);
}

tp_status tp_rank_group_run(tp_rank_group *g, tp_rank_fn fn, void *ctx, const tp_rank_hooks *hooks, tp_err *err)
{
    return tp_rank_group_run_rows(g, 0, fn, ctx, hooks, err);
}

tp_status tp_rank_group_run_rows(tp_rank_group *g, int64_t rows, tp_rank_fn fn, void *ctx,
                                 const tp_rank_hooks *hooks, tp_err *err)
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
    tp_serial_policy *policy = g->fibers ? tp_serial_policies_for(&g->policies, rows) : NULL;
    int serial = policy && tp_serial_policy_next(policy);
    int64_t t0 = policy ? tp_now_ns() : 0;
    begin_step(g, fn, ctx, hooks, serial);
    if (serial) {
        run_serial(g);
    } else {
        run_local(g, g->lo);
        wait_ranks(g);
    }
    if (policy) {
        tp_serial_policy_took(policy, serial, tp_now_ns() - t0);
        atomic_store(&g->serial, tp_serial_policy_peek(policy));
    }
    if (!g->procs) {
        if (g->status != TP_OK)
            *err = g->first_err;
        return g->status;
    }
    int told = watch_end(g) | (g->woke ? TP_POLL_ABORT : 0);
    tp_status st = tp_rank_procs_finish(g->procs, g->status, &g->first_err, g->ticket, err);
    /* A rank elsewhere failed (not benignly) after ours was done: our
     * backend must learn it too, or it would stay healthy while the failing
     * rank's is torn down, and the next collective (or a collective
     * teardown) would wait for a peer that left. */
    if (st != TP_OK)
        tell_hooks(g, hooks, told);
    return st;
}

void tp_rank_group_benign(tp_rank_group *g, int rank)
{
    if (rank >= g->lo && rank < g->hi)
        g->benign[rank - g->lo] = 1;
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
