/* cpu_pool.c — see cpu_pool.h.
 *
 * A job is published under the mutex with a new generation number and
 * the workers woken; every participant then takes tasks from one atomic
 * counter until none is left (or one failed). A worker joins the job
 * (busy) only while it is open: once the caller has run out of tasks it
 * closes the job and waits for the workers inside it alone, so a worker
 * the scheduler wakes late (a busy machine) costs the job nothing; it
 * finds the job closed and sleeps again. The job's arguments live in the
 * caller's frame: no worker touches them after the caller returns.
 *
 * Both waits spin before they sleep (tp_spin_site), when every thread of
 * every pool has a core: a worker for the next job, the caller for the
 * workers still inside its job. A request is a chain of jobs back to
 * back (each op of a step), and a sleeping thread on this VM takes
 * 20-60 us to wake from its futex: two jobs of 1 ms tasks on a pool of 2
 * took 1.06-1.14 ms where one task alone takes 0.98, because the worker
 * started late and the caller then slept until it finished. */
#include "cpu_pool.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "blas_pick.h"
#include "spin_wait.h"

typedef struct {
    cpu_pool *pool;
    int slot;
    uint64_t seen;     /* the last job it looked at */
    tp_spin_site site; /* its wait for the next job */
} worker_arg;

typedef struct {
    float *p;
    size_t cap; /* floats */
} pool_scratch;

struct cpu_pool {
    int threads, started; /* participants; workers started (threads - 1 once created) */
    pthread_t *workers;
    worker_arg *args;
    pthread_mutex_t run_mu; /* one job at a time */
    pthread_mutex_t mu;     /* guards everything below but next and failed */
    pthread_cond_t wake, done;
    int64_t spin_ns;          /* how long a wait spins before it sleeps (0: never) */
    tp_spin_site caller_site; /* the caller's wait for its workers (one job at a time) */
    /* Written under mu; atomic so that spinning threads read them without it. */
    _Atomic uint64_t gen; /* the current job's number: a worker joins each once */
    atomic_int stop;
    int open;         /* open: workers may still join the current job */
    atomic_int busy;  /* workers inside the current job */
    cpu_pool_fn fn;
    void *arg;
    int64_t n;
    atomic_int_fast64_t next;
    atomic_int failed;
    tp_status st;
    tp_err err;
    pool_scratch *scratch; /* [threads * CPU_POOL_SCRATCHES] */
};

/* Tasks until none is left or one failed; the first failure is kept. */
static void take_tasks(cpu_pool *p, int slot)
{
    int was = tp_blas_one_thread(1);
    int64_t i;
    while (!atomic_load(&p->failed) && (i = atomic_fetch_add(&p->next, 1)) < p->n) {
        tp_err e;
        tp_status st = p->fn(p->arg, i, slot, &e);
        if (st == TP_OK)
            continue;
        pthread_mutex_lock(&p->mu);
        if (!atomic_exchange(&p->failed, 1)) {
            p->st = st;
            p->err = e;
        }
        pthread_mutex_unlock(&p->mu);
    }
    tp_blas_one_thread(was);
}

static int job_posted(const void *v)
{
    const worker_arg *w = v;
    return atomic_load(&w->pool->stop) || atomic_load(&w->pool->gen) != w->seen;
}

static int workers_out(const void *v) { return atomic_load(&((const cpu_pool *)v)->busy) == 0; }

static void *worker_main(void *v)
{
    worker_arg *w = v;
    cpu_pool *p = w->pool;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        if (!job_posted(w)) {
            pthread_mutex_unlock(&p->mu);
            tp_spin_site_until(&w->site, job_posted, w, p->spin_ns);
            pthread_mutex_lock(&p->mu);
        }
        while (!job_posted(w))
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop)
            break;
        w->seen = p->gen;
        if (!p->open)
            continue;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        take_tasks(p, w->slot);
        pthread_mutex_lock(&p->mu);
        if (--p->busy == 0 && !p->open)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

tp_status cpu_pool_create(int threads, int64_t spin_ns, cpu_pool **out, tp_err *err)
{
    *out = NULL;
    if (threads < 1)
        return tp_fail(err, TP_INVALID, "cpu pool: %d threads (at least 1)", threads);
    cpu_pool *p = calloc(1, sizeof *p);
    if (p) {
        p->workers = calloc((size_t)threads, sizeof *p->workers);
        p->args = calloc((size_t)threads, sizeof *p->args);
        p->scratch = calloc((size_t)threads * CPU_POOL_SCRATCHES, sizeof *p->scratch);
    }
    if (!p || !p->workers || !p->args || !p->scratch) {
        if (p) {
            free(p->workers);
            free(p->args);
            free(p->scratch);
        }
        free(p);
        return tp_fail(err, TP_NOMEM, "cpu pool: out of memory for %d threads", threads);
    }
    p->threads = threads;
    p->spin_ns = spin_ns;
    pthread_mutex_init(&p->run_mu, NULL);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int s = 1; s < threads; s++) {
        p->args[s] = (worker_arg){.pool = p, .slot = s};
        int rc = pthread_create(&p->workers[s], NULL, worker_main, &p->args[s]);
        if (rc != 0) {
            cpu_pool_free(p);
            return tp_fail(err, TP_INTERNAL, "cpu pool: cannot start worker %d of %d: %s", s, threads - 1,
                           strerror(rc));
        }
        p->started++;
    }
    *out = p;
    return TP_OK;
}

void cpu_pool_free(cpu_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int s = 1; s <= p->started; s++)
        pthread_join(p->workers[s], NULL);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->mu);
    pthread_mutex_destroy(&p->run_mu);
    for (int i = 0; i < p->threads * CPU_POOL_SCRATCHES; i++)
        free(p->scratch[i].p);
    free(p->scratch);
    free(p->workers);
    free(p->args);
    free(p);
}

/* Buffer `which` of `slot`, at least `floats` floats; NULL when out of
 * range or out of memory. *grown: whether it was (re)allocated. */
static pool_scratch *scratch_at(cpu_pool *p, int slot, int which, size_t floats, int *grown)
{
    *grown = 0;
    if (!p || slot < 0 || slot >= p->threads || which < 0 || which >= CPU_POOL_SCRATCHES)
        return NULL;
    pool_scratch *b = &p->scratch[slot * CPU_POOL_SCRATCHES + which];
    if (b->cap < floats) {
        free(b->p);
        size_t bytes = (floats * sizeof(float) + 63) & ~(size_t)63;
        b->p = aligned_alloc(64, bytes);
        b->cap = b->p ? floats : 0;
        *grown = b->p != NULL;
    }
    return b->p ? b : NULL;
}

float *cpu_pool_scratch(cpu_pool *p, int slot, int which, size_t floats)
{
    int grown;
    pool_scratch *b = scratch_at(p, slot, which, floats, &grown);
    return b ? b->p : NULL;
}

int cpu_pool_reserve(cpu_pool *p, int which, int slots, size_t floats)
{
    for (int slot = 0; p && slot < slots && slot < p->threads; slot++) {
        int grown;
        pool_scratch *b = scratch_at(p, slot, which, floats, &grown);
        if (!b)
            return -1;
        if (grown) /* resident now, as the model is when the budget is set */
            memset(b->p, 0, b->cap * sizeof(float));
    }
    return 0;
}

size_t cpu_pool_scratch_bytes(const cpu_pool *p)
{
    size_t n = 0;
    for (int i = 0; p && i < p->threads * CPU_POOL_SCRATCHES; i++)
        n += p->scratch[i].cap * sizeof(float);
    return n;
}

int cpu_pool_threads(const cpu_pool *p) { return p ? p->threads : 1; }

/* Every task on the caller: a pool without workers, or NULL. */
static tp_status run_here(int64_t n_tasks, cpu_pool_fn fn, void *arg, tp_err *err)
{
    int was = tp_blas_one_thread(1);
    tp_status st = TP_OK;
    for (int64_t i = 0; i < n_tasks && st == TP_OK; i++)
        st = fn(arg, i, 0, err);
    tp_blas_one_thread(was);
    return st;
}

tp_status cpu_pool_run(cpu_pool *p, int64_t n_tasks, cpu_pool_fn fn, void *arg, tp_err *err)
{
    if (!p || p->threads == 1 || n_tasks <= 1)
        return run_here(n_tasks, fn, arg, err);
    pthread_mutex_lock(&p->run_mu);
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->failed, 0);
    p->st = TP_OK;
    p->open = 1;
    p->gen++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    take_tasks(p, 0);
    pthread_mutex_lock(&p->mu);
    p->open = 0;
    if (!workers_out(p)) {
        pthread_mutex_unlock(&p->mu);
        tp_spin_site_until(&p->caller_site, workers_out, p, p->spin_ns);
        pthread_mutex_lock(&p->mu);
    }
    while (p->busy)
        pthread_cond_wait(&p->done, &p->mu);
    tp_status st = p->st;
    if (st != TP_OK && err)
        *err = p->err;
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_unlock(&p->run_mu);
    return st;
}
