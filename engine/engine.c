/* engine.c — the public engine: load once, validate requests, pick (or
 * build and capture) the executable for the request's batch, run it.
 *
 * Executables are cached per batch size; the cache is bounded so a client
 * cycling through batch sizes cannot grow memory without limit (the batch
 * buckets of the execution plan replace this with a fixed set). */
#include "engine.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "exec.h"
#include "graph.h"
#include "rank_group.h"
#include "weights.h"

#define EXEC_CACHE 8

struct tp_engine {
    tp_graph *g;
    tp_backend *b;
    tp_rank_group *rg;
    tp_weights *w;
    tp_io_desc *in_desc, *out_desc;
    tp_exec *cache[EXEC_CACHE];
    unsigned long last_use[EXEC_CACHE], clock;
    pthread_mutex_t mu;
};

/* Global shape of a graph output at the graph's current batch. */
static void output_global_shape(const tp_graph *g, int i, int64_t *shape, int *ndim)
{
    const tp_node *n = &g->nodes[g->output_ids[i]];
    *ndim = n->ndim;
    memcpy(shape, n->shape, sizeof(int64_t) * TP_MAX_DIMS);
    if (g->output_place[i].kind == TP_PLACE_SHARD)
        shape[g->output_place[i].dim] *= g->world_size;
}

/* Output dims that change with the batch are reported as -1: found by
 * inferring at two batch sizes rather than by tracking symbols. */
static tp_status build_io_descs(tp_engine *e, tp_err *err)
{
    tp_graph *g = e->g;
    e->in_desc = calloc((size_t)g->n_inputs + 1, sizeof *e->in_desc);
    e->out_desc = calloc((size_t)g->n_outputs + 1, sizeof *e->out_desc);
    if (!e->in_desc || !e->out_desc)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_inputs; i++) {
        const tp_node *n = &g->nodes[g->input_ids[i]];
        tp_io_desc *d = &e->in_desc[i];
        *d = (tp_io_desc){.name = n->name, .dtype = n->dtype, .ndim = n->g_ndim};
        memcpy(d->shape, n->gshape, sizeof d->shape);
        if (n->batched)
            d->shape[0] = -1;
    }
    int64_t b1 = g->batch, s1[TP_MAX_DIMS], s2[TP_MAX_DIMS];
    tp_status st = tp_graph_infer(g, 2 * b1, err);
    for (int i = 0; st == TP_OK && i < g->n_outputs; i++) {
        tp_io_desc *d = &e->out_desc[i];
        output_global_shape(g, i, s2, &d->ndim);
        d->name = g->nodes[g->output_ids[i]].name;
        d->dtype = g->nodes[g->output_ids[i]].dtype;
        memcpy(d->shape, s2, sizeof d->shape);
    }
    if (st == TP_OK)
        st = tp_graph_infer(g, b1, err);
    for (int i = 0; st == TP_OK && i < g->n_outputs; i++) {
        int nd;
        output_global_shape(g, i, s1, &nd);
        for (int k = 0; k < nd; k++)
            if (s1[k] != e->out_desc[i].shape[k])
                e->out_desc[i].shape[k] = -1;
            else
                e->out_desc[i].shape[k] = s1[k];
    }
    return st;
}

tp_status tp_engine_create(const char *graph_path, const tp_engine_opts *opts, tp_engine **out,
                           tp_err *err)
{
    *out = NULL;
    tp_engine *e = calloc(1, sizeof *e);
    if (!e)
        return tp_fail(err, TP_NOMEM, "engine: out of memory");
    pthread_mutex_init(&e->mu, NULL);
    tp_status st = tp_graph_load(graph_path, &e->g, err);
    if (st == TP_OK)
        st = tp_backend_create(opts ? opts->backend : NULL, e->g->world_size, &e->b, err);
    if (st == TP_OK)
        st = tp_rank_group_create(e->g->world_size, &e->rg, err);
    if (st == TP_OK)
        st = tp_weights_load(e->g, e->b, e->rg, &e->w, err);
    if (st == TP_OK)
        st = build_io_descs(e, err);
    if (st != TP_OK) {
        tp_engine_free(e);
        return st;
    }
    *out = e;
    return TP_OK;
}

void tp_engine_free(tp_engine *e)
{
    if (!e)
        return;
    for (int i = 0; i < EXEC_CACHE; i++)
        tp_exec_free(e->cache[i]);
    tp_weights_free(e->w);
    tp_rank_group_free(e->rg);
    tp_backend_destroy(e->b);
    tp_graph_free(e->g);
    free(e->in_desc);
    free(e->out_desc);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

const char *tp_engine_model_name(const tp_engine *e) { return e->g->name; }
const char *tp_engine_backend_name(const tp_engine *e) { return e->b->iface->name; }
int tp_engine_world_size(const tp_engine *e) { return e->g->world_size; }
int tp_engine_n_inputs(const tp_engine *e) { return e->g->n_inputs; }
int tp_engine_n_outputs(const tp_engine *e) { return e->g->n_outputs; }
const tp_io_desc *tp_engine_input(const tp_engine *e, int i) { return &e->in_desc[i]; }
const tp_io_desc *tp_engine_output(const tp_engine *e, int i) { return &e->out_desc[i]; }

static tp_status check_shape(const tp_io_desc *d, const tp_host_tensor *t, tp_err *err)
{
    char want[160], got[160];
    int ok = t->ndim == d->ndim;
    for (int k = 0; ok && k < d->ndim; k++)
        ok = d->shape[k] < 0 ? t->shape[k] >= 1 : t->shape[k] == d->shape[k];
    if (!ok)
        return tp_fail(err, TP_INVALID, "input '%s': expected shape %s, got %s", d->name,
                       tp_shape_str(want, sizeof want, d->ndim, d->shape),
                       tp_shape_str(got, sizeof got, t->ndim, t->shape));
    size_t need = tp_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim; k++)
        need *= (size_t)t->shape[k];
    if (t->nbytes != need)
        return tp_fail(err, TP_INVALID, "input '%s': %zu bytes of data for shape %s %s (needs %zu)",
                       d->name, t->nbytes, got, tp_dtype_name(t->dtype), need);
    return TP_OK;
}

/* Orders the request's tensors as the graph's inputs and finds the batch. */
static tp_status match_inputs(tp_engine *e, const tp_host_tensor *in, int n, const tp_host_tensor **ordered,
                              int64_t *batch, tp_err *err)
{
    int ni = e->g->n_inputs;
    for (int i = 0; i < ni; i++)
        ordered[i] = NULL;
    for (int j = 0; j < n; j++) {
        int i = 0;
        while (i < ni && strcmp(e->in_desc[i].name, in[j].name) != 0)
            i++;
        if (i == ni)
            return tp_fail(err, TP_INVALID, "unknown input '%s' (model '%s' has %d input%s, the first is '%s')",
                           in[j].name, e->g->name, ni, ni == 1 ? "" : "s", ni ? e->in_desc[0].name : "");
        if (ordered[i])
            return tp_fail(err, TP_INVALID, "input '%s' is given twice", in[j].name);
        ordered[i] = &in[j];
    }
    *batch = 0;
    const char *batch_from = NULL;
    for (int i = 0; i < ni; i++) {
        const tp_io_desc *d = &e->in_desc[i];
        if (!ordered[i])
            return tp_fail(err, TP_INVALID, "missing input '%s'", d->name);
        if (ordered[i]->dtype != d->dtype)
            return tp_fail(err, TP_INVALID, "input '%s': expected datatype %s, got %s", d->name,
                           tp_dtype_name(d->dtype), tp_dtype_name(ordered[i]->dtype));
        tp_status st = check_shape(d, ordered[i], err);
        if (st != TP_OK)
            return st;
        if (d->ndim > 0 && d->shape[0] < 0) {
            if (*batch && ordered[i]->shape[0] != *batch)
                return tp_fail(err, TP_INVALID, "input '%s': batch %lld differs from batch %lld of input '%s'",
                               d->name, (long long)ordered[i]->shape[0], (long long)*batch, batch_from);
            *batch = ordered[i]->shape[0];
            batch_from = d->name;
        }
    }
    if (*batch == 0)
        *batch = 1; /* no batched input: the graph's shapes are all static */
    return TP_OK;
}

static tp_status get_exec(tp_engine *e, int64_t batch, tp_exec **out, tp_err *err)
{
    int victim = 0;
    e->clock++;
    for (int i = 0; i < EXEC_CACHE; i++) {
        if (e->cache[i] && tp_exec_batch(e->cache[i]) == batch) {
            e->last_use[i] = e->clock;
            *out = e->cache[i];
            return TP_OK;
        }
        if (!e->cache[i] || (e->cache[victim] && e->last_use[i] < e->last_use[victim]))
            victim = i;
    }
    tp_exec *x;
    tp_status st = tp_exec_create(e->g, batch, e->b, e->rg, e->w, &x, err);
    if (st != TP_OK)
        return st;
    tp_exec_free(e->cache[victim]);
    e->cache[victim] = x;
    e->last_use[victim] = e->clock;
    *out = x;
    return TP_OK;
}

static tp_status alloc_outputs(tp_engine *e, tp_exec *x, tp_host_tensor *outs, tp_tensor *desc, tp_err *err)
{
    for (int i = 0; i < e->g->n_outputs; i++) {
        desc[i] = tp_exec_output_desc(x, i);
        tp_host_tensor *o = &outs[i];
        snprintf(o->name, sizeof o->name, "%s", e->out_desc[i].name);
        o->dtype = desc[i].dtype;
        o->ndim = desc[i].ndim;
        memcpy(o->shape, desc[i].shape, sizeof o->shape);
        o->nbytes = (size_t)tp_tensor_numel(&desc[i]) * tp_dtype_size(o->dtype);
        o->data = malloc(o->nbytes ? o->nbytes : 1);
        if (!o->data)
            return tp_fail(err, TP_NOMEM, "output '%s': cannot allocate %zu bytes", o->name, o->nbytes);
        desc[i].data = o->data;
    }
    return TP_OK;
}

static tp_status infer_locked(tp_engine *e, const tp_host_tensor *inputs, int n_inputs,
                              tp_host_tensor *outs, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    const tp_host_tensor *ordered[ni + 1];
    tp_tensor in_t[ni + 1], out_t[no + 1];
    int64_t batch = 0;
    tp_exec *x;
    tp_status st = match_inputs(e, inputs, n_inputs, ordered, &batch, err);
    if (st == TP_OK)
        st = get_exec(e, batch, &x, err);
    if (st == TP_OK)
        st = alloc_outputs(e, x, outs, out_t, err);
    if (st != TP_OK)
        return st;
    for (int i = 0; i < ni; i++)
        in_t[i] = tp_tensor_make(ordered[i]->data, ordered[i]->dtype, ordered[i]->ndim, ordered[i]->shape);
    return tp_exec_run(x, in_t, out_t, err);
}

tp_status tp_engine_infer(tp_engine *e, const tp_host_tensor *inputs, int n_inputs,
                          tp_host_tensor **outputs, int *n_outputs, tp_err *err)
{
    *outputs = NULL;
    *n_outputs = 0;
    tp_host_tensor *outs = calloc((size_t)e->g->n_outputs, sizeof *outs);
    if (!outs)
        return tp_fail(err, TP_NOMEM, "out of memory");
    pthread_mutex_lock(&e->mu);
    tp_status st = infer_locked(e, inputs, n_inputs, outs, err);
    pthread_mutex_unlock(&e->mu);
    if (st != TP_OK) {
        tp_host_tensors_free(outs, e->g->n_outputs);
        return st;
    }
    *outputs = outs;
    *n_outputs = e->g->n_outputs;
    return TP_OK;
}

void tp_host_tensors_free(tp_host_tensor *t, int n)
{
    if (!t)
        return;
    for (int i = 0; i < n; i++)
        free(t[i].data);
    free(t);
}
