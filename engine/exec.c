/* exec.c — bind, capture, replay.
 *
 * Every node that owns memory gets one buffer per rank here, before capture
 * (the memory planner of a later stage replaces the one-buffer-per-node
 * policy with liveness-based arenas). Views are tensors pointing into their
 * owner's buffer. Capture then records each rank's kernels with those
 * pointers baked in, so a run is: copy in, replay, copy out. */
#include "exec.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    tp_tensor *t; /* per node: the rank-local tensor */
    void **buf;   /* per node: memory this rank allocated for it, or NULL */
    tp_capture *cap;
} rank_state;

struct tp_exec {
    tp_graph *g;
    tp_backend *b;
    tp_rank_group *rg;
    const tp_weights *w;
    int64_t batch;
    int world;
    rank_state *rs;
    tp_tensor *out_desc; /* global output descriptors */
    /* per-run arguments */
    const tp_tensor *run_in;
    tp_tensor *run_out;
};

static size_t tensor_bytes(const tp_node *n)
{
    size_t e = tp_dtype_size(n->dtype);
    for (int i = 0; i < n->ndim; i++)
        e *= (size_t)n->shape[i];
    return e;
}

static tp_status bind_rank(tp_exec *x, int rank, tp_err *err)
{
    rank_state *s = &x->rs[rank];
    tp_graph *g = x->g;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        if (n->op == TP_OP_PARAM || !tp_node_owns(g, i))
            continue;
        tp_status st = x->b->iface->alloc(x->b, rank, tensor_bytes(n), &s->buf[i], err);
        if (st != TP_OK)
            return tp_fail(err, st, "node '%s': %s", n->name, err->msg);
    }
    for (int p = 0; p < g->n_params; p++)
        s->buf[g->param_ids[p]] = NULL;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        const tp_node *owner = &g->nodes[n->storage];
        char *base = owner->op == TP_OP_PARAM ? NULL : s->buf[n->storage];
        if (owner->op == TP_OP_PARAM) {
            for (int p = 0; p < g->n_params; p++)
                if (g->param_ids[p] == n->storage)
                    base = tp_weights_get(x->w, rank, p);
        }
        tp_tensor *t = &s->t[i];
        t->data = base + n->offset * (int64_t)tp_dtype_size(n->dtype);
        t->dtype = n->dtype;
        t->ndim = n->ndim;
        memcpy(t->shape, n->shape, sizeof t->shape);
        memcpy(t->stride, n->stride, sizeof t->stride);
    }
    return TP_OK;
}

/* Records one rank's kernels: every node that owns memory and is computed
 * (views and aliasing reshapes/contiguous have nothing to run). */
static tp_status capture_rank(tp_exec *x, int rank, tp_err *err)
{
    tp_graph *g = x->g;
    rank_state *s = &x->rs[rank];
    const tp_backend_iface *bi = x->b->iface;
    tp_status st = bi->begin_capture(x->b, rank, err);
    for (int i = 0; st == TP_OK && i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        tp_op_kind k = tp_op_kind_of(n->op);
        if (k == TP_KIND_SOURCE || !tp_node_owns(g, i))
            continue;
        tp_tensor ins[64];
        for (int j = 0; j < n->n_inputs; j++)
            ins[j] = s->t[n->inputs[j]];
        if (k == TP_KIND_COLLECTIVE)
            st = bi->collective(x->b, rank, n->op, &n->attrs, &ins[0], &s->t[i], err);
        else
            st = bi->run_op(x->b, rank, n->op, &n->attrs, ins, n->n_inputs, &s->t[i], err);
        if (st != TP_OK)
            tp_err_prefix(err, "node '%s': ", n->name);
    }
    tp_capture *cap = NULL;
    tp_status st2 = bi->end_capture(x->b, rank, &cap, st == TP_OK ? err : NULL);
    s->cap = cap;
    return st != TP_OK ? st : st2;
}

static tp_status setup_rank(void *ctx, int rank, tp_err *err)
{
    tp_exec *x = ctx;
    tp_status st = bind_rank(x, rank, err);
    return st == TP_OK ? capture_rank(x, rank, err) : st;
}

/* The rank's part of a global tensor under a placement: a strided view. */
static tp_tensor rank_part(const tp_tensor *global, tp_placement p, int rank, int world)
{
    tp_tensor v = *global;
    if (p.kind == TP_PLACE_SHARD) {
        v.shape[p.dim] /= world;
        v.data = (char *)v.data + rank * v.shape[p.dim] * v.stride[p.dim] * (int64_t)tp_dtype_size(v.dtype);
    }
    return v;
}

static tp_status run_rank(void *ctx, int rank, tp_err *err)
{
    tp_exec *x = ctx;
    tp_graph *g = x->g;
    rank_state *s = &x->rs[rank];
    const tp_backend_iface *bi = x->b->iface;
    tp_status st = TP_OK;
    for (int i = 0; st == TP_OK && i < g->n_inputs; i++) {
        const tp_node *n = &g->nodes[g->input_ids[i]];
        tp_tensor src = rank_part(&x->run_in[i], n->placement, rank, x->world);
        st = bi->copy_in(x->b, rank, &s->t[g->input_ids[i]], &src, err);
    }
    if (st == TP_OK)
        st = bi->replay(x->b, rank, s->cap, err);
    for (int i = 0; st == TP_OK && i < g->n_outputs; i++) {
        tp_placement p = g->output_place[i];
        if (p.kind == TP_PLACE_REPLICATE && rank != 0)
            continue;
        tp_tensor dst = rank_part(&x->run_out[i], p, rank, x->world);
        st = bi->copy_out(x->b, rank, &dst, &s->t[g->output_ids[i]], err);
    }
    if (st == TP_OK)
        st = bi->synchronize(x->b, rank, err);
    return st;
}

static void abort_backend(void *b) { ((tp_backend *)b)->iface->abort(b); }

static tp_status build_output_descs(tp_exec *x, tp_err *err)
{
    tp_graph *g = x->g;
    x->out_desc = calloc((size_t)g->n_outputs + 1, sizeof *x->out_desc);
    if (!x->out_desc)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_outputs; i++) {
        const tp_node *n = &g->nodes[g->output_ids[i]];
        int64_t shape[TP_MAX_DIMS];
        memcpy(shape, n->shape, sizeof shape);
        if (g->output_place[i].kind == TP_PLACE_SHARD)
            shape[g->output_place[i].dim] *= x->world;
        x->out_desc[i] = tp_tensor_make(NULL, n->dtype, n->ndim, shape);
    }
    return TP_OK;
}

tp_status tp_exec_create(tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                         const tp_weights *w, tp_exec **out, tp_err *err)
{
    tp_status st = tp_graph_infer(g, batch, err);
    if (st != TP_OK)
        return st;
    tp_exec *x = calloc(1, sizeof *x);
    if (!x)
        return tp_fail(err, TP_NOMEM, "out of memory");
    *x = (tp_exec){.g = g, .b = b, .rg = rg, .w = w, .batch = batch, .world = g->world_size};
    x->rs = calloc((size_t)x->world, sizeof *x->rs);
    for (int r = 0; x->rs && r < x->world; r++) {
        x->rs[r].t = calloc((size_t)g->n_nodes + 1, sizeof(tp_tensor));
        x->rs[r].buf = calloc((size_t)g->n_nodes + 1, sizeof(void *));
        if (!x->rs[r].t || !x->rs[r].buf)
            st = TP_NOMEM;
    }
    if (!x->rs || st != TP_OK) {
        tp_exec_free(x);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    st = build_output_descs(x, err);
    if (st == TP_OK)
        st = tp_rank_group_run(rg, setup_rank, x, abort_backend, b, err);
    b->iface->reset(b);
    if (st != TP_OK) {
        tp_exec_free(x);
        return st;
    }
    *out = x;
    return TP_OK;
}

void tp_exec_free(tp_exec *x)
{
    if (!x)
        return;
    for (int r = 0; x->rs && r < x->world; r++) {
        rank_state *s = &x->rs[r];
        if (s->cap)
            x->b->iface->capture_free(x->b, s->cap);
        for (int i = 0; s->buf && i < x->g->n_nodes; i++)
            if (s->buf[i])
                x->b->iface->free(x->b, r, s->buf[i]);
        free(s->t);
        free(s->buf);
    }
    free(x->rs);
    free(x->out_desc);
    free(x);
}

int64_t tp_exec_batch(const tp_exec *x) { return x->batch; }
tp_tensor tp_exec_output_desc(const tp_exec *x, int i) { return x->out_desc[i]; }

tp_status tp_exec_run(tp_exec *x, const tp_tensor *inputs, tp_tensor *outputs, tp_err *err)
{
    x->run_in = inputs;
    x->run_out = outputs;
    tp_status st = tp_rank_group_run(x->rg, run_rank, x, abort_backend, x->b, err);
    x->b->iface->reset(x->b);
    return st;
}
