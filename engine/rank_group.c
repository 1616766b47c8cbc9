#include "rank_group.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    tp_rank_group *g;
    int rank;
} rank_arg;

struct tp_rank_group {
    int world;
    pthread_t *threads;
    rank_arg *args;
    pthread_mutex_t mu;
    pthread_cond_t start, done;
    unsigned long generation; /* bumped per run; threads wait for a change */
    int quit, n_done;
    tp_rank_fn fn;
    void *ctx;
    void (*on_fail)(void *);
    void *fail_ctx;
    int failed_rank;
    tp_status status;
    tp_err first_err;
};

static void finish_rank(tp_rank_group *g, int rank, tp_status st, const tp_err *e)
{
    pthread_mutex_lock(&g->mu);
    if (st != TP_OK && g->status == TP_OK) {
        g->status = st;
        g->failed_rank = rank;
        g->first_err = *e;
        if (g->on_fail)
            g->on_fail(g->fail_ctx);
    }
    if (++g->n_done == g->world)
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

tp_status tp_rank_group_create(int world, tp_rank_group **out, tp_err *err)
{
    tp_rank_group *g = calloc(1, sizeof *g);
    if (!g)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    g->world = world;
    g->threads = calloc((size_t)world, sizeof *g->threads);
    g->args = calloc((size_t)world, sizeof *g->args);
    if (!g->threads || !g->args) {
        free(g->threads);
        free(g->args);
        free(g);
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    }
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->start, NULL);
    pthread_cond_init(&g->done, NULL);
    for (int r = 0; r < world; r++) {
        g->args[r] = (rank_arg){g, r};
        if (pthread_create(&g->threads[r], NULL, rank_main, &g->args[r]) != 0) {
            g->world = r; /* join only the threads that exist */
            tp_rank_group_free(g);
            return tp_fail(err, TP_INTERNAL, "rank group: cannot start thread for rank %d", r);
        }
    }
    *out = g;
    return TP_OK;
}

void tp_rank_group_free(tp_rank_group *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->mu);
    g->quit = 1;
    pthread_cond_broadcast(&g->start);
    pthread_mutex_unlock(&g->mu);
    for (int r = 0; r < g->world; r++)
        pthread_join(g->threads[r], NULL);
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->start);
    pthread_cond_destroy(&g->done);
    free(g->threads);
    free(g->args);
    free(g);
}

int tp_rank_group_world(const tp_rank_group *g) { return g->world; }

tp_status tp_rank_group_run(tp_rank_group *g, tp_rank_fn fn, void *ctx, void (*on_fail)(void *),
                            void *fail_ctx, tp_err *err)
{
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->ctx = ctx;
    g->on_fail = on_fail;
    g->fail_ctx = fail_ctx;
    g->status = TP_OK;
    g->n_done = 0;
    g->generation++;
    pthread_cond_broadcast(&g->start);
    while (g->n_done < g->world)
        pthread_cond_wait(&g->done, &g->mu);
    tp_status st = g->status;
    if (st != TP_OK && err) {
        *err = g->first_err;
        tp_err_prefix(err, "rank %d: ", g->failed_rank);
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}
