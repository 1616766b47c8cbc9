/* exec.c — bind the plan to memory, capture, replay.
 *
 * Every buffer is placed before any capture: one arena per kind per rank
 * (regular, symmetric, input slots, outputs) — the executable's own, or
 * the engine's pool shared by every executable (tp_exec_pool) — each value
 * at its planned offset, views pointing into their owner. Capture then
 * records each captured partition's kernels with those addresses baked in,
 * so a run is: copy in, replay / run fallbacks, copy out. */
#include "exec.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    void *arena[TP_MEM_KINDS];
    tp_tensor *t;       /* per node: the rank-local tensor */
    tp_tensor *ws;      /* per node: fused workspace, if any */
    tp_capture **cap;   /* per partition: the record (captured ones) */
} rank_state;

struct tp_exec {
    tp_graph *g; /* our own copy, lowered for this batch: nodes and attrs never change after create */
    tp_backend *b;
    tp_exec_pool *pool; /* the arenas' owner; NULL: ours (freed with us) */
    tp_rank_group *rg;
    tp_rank_hooks hooks; /* a failing rank aborts the backend's collectives */
    const tp_weights *w;
    tp_plan *plan;
    tp_exec_opts opts;
    int64_t batch;
    int world;
    rank_state *rs;
    tp_tensor *out_desc;
    /* per-run arguments */
    const tp_tensor *run_in;
    tp_tensor *run_out;
    tp_exec_stats *stats;
};

static void *param_data(const tp_exec *x, int rank, int node)
{
    for (int p = 0; p < x->g->n_params; p++)
        if (x->g->param_ids[p] == node)
            return tp_weights_get(x->w, rank, p);
    for (int s = 0; s < x->g->n_states; s++)
        if (x->g->state_ids[s] == node)
            return tp_weights_state(x->w, rank, s);
    return NULL;
}

/* One arena of one rank (symmetric: every rank calls it in the same
 * order with the same size, the backend's symmetric contract). */
static tp_status alloc_arena(tp_backend *b, int rank, int k, size_t bytes, void **out, tp_err *err)
{
    const tp_backend_iface *bi = b->iface;
    tp_status st = k == TP_MEM_SYMMETRIC ? bi->alloc_symmetric(b, rank, bytes, out, err)
                                         : bi->alloc(b, rank, bytes, out, err);
    if (st != TP_OK) /* a prefix: formatting err->msg into itself garbles it */
        tp_err_prefix(err, "%s arena of %zu bytes: ", tp_mem_kind_name((tp_mem_kind)k), bytes);
    return st;
}

/* ------------------------------------------------------------ the pool */

struct tp_exec_pool {
    tp_backend *b;
    tp_rank_group *rg;
    tp_rank_hooks hooks;
    int world;
    int64_t bytes[TP_MEM_KINDS];  /* per rank, what every arena of that kind holds */
    int64_t want[TP_MEM_KINDS];   /* during a (re)allocation: the new size, or -1 to keep */
    void *(*arena)[TP_MEM_KINDS]; /* per rank; NULL for ranks of other processes */
};

static void abort_backend(void *b) { ((tp_backend *)b)->iface->abort(b); }
static void lose_backend(void *b) { ((tp_backend *)b)->iface->peer_lost(b); }
static const char *backend_fault(void *b) { return tp_backend_fault(b); }

/* Reallocates the rank's arenas whose want is set, in kind order on every
 * rank (the symmetric contract). The old one is freed first (though a
 * cuda window's memory stays until the communicator ends: cuda_free). */
static tp_status pool_alloc_rank(void *ctx, int rank, tp_err *err)
{
    tp_exec_pool *p = ctx;
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++) {
        if (p->want[k] < 0)
            continue;
        if (p->arena[rank][k])
            p->b->iface->free(p->b, rank, p->arena[rank][k]);
        p->arena[rank][k] = NULL;
        tp_status st = alloc_arena(p->b, rank, k, (size_t)p->want[k], &p->arena[rank][k], err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

/* Runs the (re)allocation of want[] on every rank; bytes[] follows. */
static tp_status pool_realloc(tp_exec_pool *p, tp_err *err)
{
    tp_status st = tp_rank_group_run(p->rg, pool_alloc_rank, p, &p->hooks, err);
    p->b->iface->reset(p->b);
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        if (p->want[k] >= 0)
            p->bytes[k] = st == TP_OK ? p->want[k] : 0; /* failed: empty, grown again when needed */
    if (st != TP_OK)
        tp_err_prefix(err, "shared arena pool: ");
    return st;
}

tp_status tp_exec_pool_create(tp_backend *b, tp_rank_group *rg, const int64_t bytes[TP_MEM_KINDS],
                              tp_exec_pool **out, tp_err *err)
{
    *out = NULL;
    tp_exec_pool *p = calloc(1, sizeof *p);
    if (!p)
        return tp_fail(err, TP_NOMEM, "out of memory");
    *p = (tp_exec_pool){.b = b, .rg = rg, .world = tp_rank_group_world(rg),
                        .hooks = {.fail = abort_backend, .lost = lose_backend, .ctx = b, .fault = backend_fault}};
    p->arena = calloc((size_t)p->world + 1, sizeof *p->arena);
    if (!p->arena) {
        free(p);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        p->want[k] = bytes[k];
    tp_status st = pool_realloc(p, err);
    if (st != TP_OK) {
        tp_exec_pool_free(p);
        return st;
    }
    *out = p;
    return TP_OK;
}

void tp_exec_pool_free(tp_exec_pool *p)
{
    if (!p)
        return;
    for (int r = 0; r < p->world; r++)
        for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
            if (p->arena[r][k])
                p->b->iface->free(p->b, r, p->arena[r][k]);
    free(p->arena);
    free(p);
}

void tp_exec_pool_bytes(const tp_exec_pool *p, int64_t bytes[TP_MEM_KINDS])
{
    memcpy(bytes, p->bytes, sizeof p->bytes);
}

int tp_exec_pool_fits(const tp_exec_pool *p, const tp_plan *plan)
{
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        if (plan->arena_bytes[k] > p->bytes[k])
            return 0;
    return 1;
}

tp_status tp_exec_pool_grow(tp_exec_pool *p, const int64_t need[TP_MEM_KINDS], tp_err *err)
{
    int any = 0;
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++) {
        p->want[k] = -1;
        if (need[k] > p->bytes[k]) {
            p->want[k] = need[k] > 2 * p->bytes[k] ? need[k] : 2 * p->bytes[k];
            any = 1;
        }
    }
    return any ? pool_realloc(p, err) : TP_OK;
}

/* --------------------------------------------------------- executables */

/* Arenas reused from earlier executables hold what those left: a warm-up
 * before capture (which runs captured partitions eagerly, fallbacks not,
 * so a captured node may read a hoisted buffer nothing wrote yet) must
 * see the zeros of fresh memory (cuda: A4), e.g. never garbage ids. */
static tp_status zero_pool_extent(tp_exec *x, int rank, tp_err *err)
{
    enum { CHUNK = 1 << 20 };
    int32_t *zeros = NULL;
    tp_status st = TP_OK;
    for (int k = TP_MEM_REGULAR; st == TP_OK && k < TP_MEM_KINDS; k++) {
        for (int64_t off = 0; st == TP_OK && off < x->plan->arena_bytes[k]; off += CHUNK) {
            int64_t n = x->plan->arena_bytes[k] - off < CHUNK ? x->plan->arena_bytes[k] - off : CHUNK;
            int64_t shape[1] = {n / (int64_t)sizeof(int32_t)}; /* arenas are 64-byte multiples */
            if (!zeros && !(zeros = calloc(CHUNK / sizeof(int32_t), sizeof(int32_t))))
                return tp_fail(err, TP_NOMEM, "out of memory");
            tp_tensor dst = tp_tensor_make((char *)x->rs[rank].arena[k] + off, TP_I32, 1, shape);
            tp_tensor src = tp_tensor_make(zeros, TP_I32, 1, shape);
            st = x->b->iface->copy_in(x->b, rank, &dst, &src, err);
        }
    }
    free(zeros);
    if (st == TP_OK) /* copy_in may be asynchronous, and zeros goes now */
        st = x->b->iface->synchronize(x->b, rank, err);
    return st;
}

static tp_status alloc_arenas(tp_exec *x, int rank, tp_err *err)
{
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++) {
        tp_status st = x->pool ? TP_OK
                               : alloc_arena(x->b, rank, k, (size_t)x->plan->arena_bytes[k], &x->rs[rank].arena[k], err);
        if (x->pool)
            x->rs[rank].arena[k] = x->pool->arena[rank][k];
        if (st != TP_OK)
            return st;
    }
    return x->pool && x->b->iface->warm_up_before_capture ? zero_pool_extent(x, rank, err) : TP_OK;
}

static tp_status bind_rank(tp_exec *x, int rank, tp_err *err)
{
    rank_state *s = &x->rs[rank];
    tp_graph *g = x->g;
    tp_status st = alloc_arenas(x, rank, err);
    for (int i = 0; st == TP_OK && i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        const tp_buf *ob = &x->plan->buf[n->storage];
        char *base = ob->kind == TP_MEM_NONE ? param_data(x, rank, n->storage)
                                             : (char *)s->arena[ob->kind] + ob->offset;
        tp_tensor *t = &s->t[i];
        t->data = base + n->offset * (int64_t)tp_dtype_size(n->dtype);
        t->dtype = n->dtype;
        t->ndim = n->ndim;
        memcpy(t->shape, n->shape, sizeof t->shape);
        memcpy(t->stride, n->stride, sizeof t->stride);
        const tp_buf *b = &x->plan->buf[i];
        if (b->ws_bytes) {
            int64_t shape[1] = {b->ws_bytes / (int64_t)tp_dtype_size(n->dtype)};
            s->ws[i] = tp_tensor_make((char *)s->arena[TP_MEM_SYMMETRIC] + b->ws_offset, n->dtype, 1, shape);
        }
    }
    return st;
}

/* Issues node i's kernel on a rank: recorded when capturing, else run. */
static tp_status issue_node(tp_exec *x, int rank, int i, tp_err *err)
{
    const tp_node *n = &x->g->nodes[i];
    rank_state *s = &x->rs[rank];
    const tp_backend_iface *bi = x->b->iface;
    tp_tensor ins[TP_OP_MAX_INPUTS + 1]; /* + the fused workspace */
    int nin = n->n_inputs;
    for (int j = 0; j < nin; j++)
        ins[j] = s->t[n->inputs[j]];
    if (x->plan->buf[i].ws_bytes)
        ins[nin++] = s->ws[i];
    tp_op_kind k = tp_op_kind_of(n->op);
    tp_status st = k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED
                       ? bi->collective(x->b, rank, n->op, &n->attrs, ins, nin, &s->t[i], err)
                       : bi->run_op(x->b, rank, n->op, &n->attrs, ins, nin, &s->t[i], err);
    if (st != TP_OK)
        tp_err_prefix(err, "node '%s': ", n->name);
    return st;
}

static tp_status run_partition_eager(tp_exec *x, int rank, const tp_partition *p, tp_err *err)
{
    for (int k = 0; k < p->n_nodes; k++) {
        tp_status st = issue_node(x, rank, p->nodes[k], err);
        if (st != TP_OK)
            return st;
    }
    if (x->stats && rank == 0)
        x->stats->eager_nodes += p->n_nodes;
    return TP_OK;
}

static tp_status capture_rank(tp_exec *x, int rank, tp_err *err)
{
    const tp_backend_iface *bi = x->b->iface;
    for (int p = 0; p < x->plan->n_parts; p++) {
        const tp_partition *part = &x->plan->parts[p];
        if (part->kind != TP_PART_CAPTURED || x->opts.eager)
            continue;
        tp_status st = TP_OK;
        if (bi->warm_up_before_capture) {
            st = run_partition_eager(x, rank, part, err);
            if (st == TP_OK)
                st = bi->synchronize(x->b, rank, err);
            if (st != TP_OK)
                return st;
        }
        st = bi->begin_capture(x->b, rank, err);
        if (st != TP_OK)
            return st;
        st = run_partition_eager(x, rank, part, err); /* recorded, not run */
        tp_status st2 = bi->end_capture(x->b, rank, &x->rs[rank].cap[p], st == TP_OK ? err : NULL);
        if (st != TP_OK || st2 != TP_OK)
            return st != TP_OK ? st : st2;
    }
    return TP_OK;
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
    if (p.kind != TP_PLACE_SHARD)
        return *global;
    int64_t len = global->shape[p.dim] / world;
    return tp_tensor_narrow(global, p.dim, rank * len, len);
}

static tp_status copy_inputs(tp_exec *x, int rank, tp_err *err)
{
    tp_graph *g = x->g;
    for (int i = 0; i < g->n_inputs; i++) {
        int id = g->input_ids[i];
        tp_tensor src = rank_part(&x->run_in[i], g->nodes[id].placement, rank, x->world);
        tp_status st = x->b->iface->copy_in(x->b, rank, &x->rs[rank].t[id], &src, err);
        if (st != TP_OK)
            return st;
        if (x->stats && rank == 0)
            x->stats->input_copy_bytes[x->plan->buf[id].kind] +=
                tp_tensor_numel(&src) * (int64_t)tp_dtype_size(src.dtype) * x->world;
    }
    return TP_OK;
}

/* The part of output `global` this rank writes, and the part of its own
 * tensor `local` that goes there: all of both for replicate; for shard,
 * the rank's chunk (local's size along the dim) at rank x chunk, clipped
 * at the end of global, which a shard cut short (placement length, pass
 * shard_outputs) ends inside the last chunks. 0: none of the chunk is
 * inside. */
static int out_part(const tp_tensor *global, tp_placement p, int rank, tp_tensor *local, tp_tensor *part)
{
    *part = *global;
    if (p.kind != TP_PLACE_SHARD)
        return 1;
    int64_t chunk = local->shape[p.dim], start = rank * chunk, size = global->shape[p.dim];
    int64_t n = size - start < chunk ? size - start : chunk;
    if (n <= 0)
        return 0;
    *part = tp_tensor_narrow(global, p.dim, start, n);
    *local = tp_tensor_narrow(local, p.dim, 0, n);
    return 1;
}

static tp_status copy_outputs(tp_exec *x, int rank, tp_err *err)
{
    tp_graph *g = x->g;
    for (int i = 0; i < g->n_outputs; i++) {
        tp_placement p = g->output_place[i];
        tp_tensor src = x->rs[rank].t[g->output_ids[i]], dst;
        if ((p.kind == TP_PLACE_REPLICATE && rank != 0) || !out_part(&x->run_out[i], p, rank, &src, &dst))
            continue;
        /* a padded step's results take the batch's rows only (engine.c's
         * results_in_place); out_part already cut a shard along dim 0 */
        if (dst.ndim > 0 && dst.shape[0] < src.shape[0] && !(p.kind == TP_PLACE_SHARD && p.dim == 0))
            src = tp_tensor_narrow(&src, 0, 0, dst.shape[0]);
        tp_status st = x->b->iface->copy_out(x->b, rank, &dst, &src, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

static tp_status run_rank(void *ctx, int rank, tp_err *err)
{
    tp_exec *x = ctx;
    rank_state *s = &x->rs[rank];
    tp_status st = copy_inputs(x, rank, err);
    for (int p = 0; st == TP_OK && p < x->plan->n_parts; p++) {
        if (s->cap[p]) {
            st = x->b->iface->replay(x->b, rank, s->cap[p], err);
            if (x->stats && rank == 0)
                x->stats->replays++;
        } else {
            st = run_partition_eager(x, rank, &x->plan->parts[p], err);
        }
    }
    if (st == TP_OK) {
        st = copy_outputs(x, rank, err);
        if (st == TP_OK)
            st = x->b->iface->synchronize(x->b, rank, err);
        /* Bad data a device reports once the step's work is done (copy_out
         * and synchronize wait for it first): every collective completed,
         * nobody is blocked, so no rank's backend must be aborted for it. */
        if (st == TP_INVALID)
            tp_rank_group_benign(x->rg, rank);
    }
    return st;
}

static tp_status build_output_descs(tp_exec *x, tp_err *err)
{
    tp_graph *g = x->g;
    x->out_desc = calloc((size_t)g->n_outputs + 1, sizeof *x->out_desc);
    if (!x->out_desc)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_outputs; i++) {
        int64_t shape[TP_MAX_DIMS];
        int nd = tp_graph_output_shape(g, i, shape);
        x->out_desc[i] = tp_tensor_make(NULL, g->nodes[g->output_ids[i]].dtype, nd, shape);
    }
    return TP_OK;
}

static tp_status alloc_rank_states(tp_exec *x, tp_err *err)
{
    int n = x->g->n_nodes + 1, np = x->plan->n_parts + 1;
    x->rs = calloc((size_t)x->world, sizeof *x->rs);
    if (!x->rs)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int r = 0; r < x->world; r++) {
        x->rs[r].t = calloc((size_t)n, sizeof(tp_tensor));
        x->rs[r].ws = calloc((size_t)n, sizeof(tp_tensor));
        x->rs[r].cap = calloc((size_t)np, sizeof(tp_capture *));
        if (!x->rs[r].t || !x->rs[r].ws || !x->rs[r].cap)
            return tp_fail(err, TP_NOMEM, "out of memory");
    }
    return TP_OK;
}

tp_status tp_exec_lower(const tp_graph *g, int64_t batch, const tp_pass_opts *lowering, tp_graph **out,
                        tp_err *err)
{
    tp_status st = tp_graph_clone(g, out, err);
    if (st == TP_OK)
        st = tp_graph_infer(*out, batch, err);
    int lowered;
    if (st == TP_OK && lowering && !lowering->disabled[TP_PASS_CHOOSE_COLLECTIVES])
        st = tp_pass_choose_collectives(*out, lowering, &lowered, err);
    if (st != TP_OK) {
        tp_graph_free(*out);
        *out = NULL;
    }
    return st;
}

tp_status tp_exec_prepare(const tp_graph *g0, int64_t batch, tp_backend *b, tp_rank_group *rg,
                          const tp_weights *w, const tp_exec_opts *o, tp_exec **out, tp_err *err)
{
    *out = NULL;
    tp_graph *g;
    tp_status st = tp_exec_lower(g0, batch, o ? o->lowering : NULL, &g, err);
    if (st != TP_OK)
        return st;
    tp_exec *x = calloc(1, sizeof *x);
    if (!x) {
        tp_graph_free(g);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    *x = (tp_exec){.g = g, .b = b, .rg = rg, .w = w, .batch = batch, .world = g->world_size,
                   .hooks = {.fail = abort_backend, .lost = lose_backend, .ctx = b, .fault = backend_fault}};
    if (o)
        x->opts = *o;
    st = tp_plan_build(g, &x->plan, err);
    if (st == TP_OK)
        st = alloc_rank_states(x, err);
    if (st == TP_OK)
        st = build_output_descs(x, err);
    if (st != TP_OK) {
        tp_exec_free(x);
        return st;
    }
    *out = x;
    return TP_OK;
}

tp_status tp_exec_arena_bytes(const tp_graph *g, int64_t batch, const tp_pass_opts *lowering,
                              int64_t bytes[TP_MEM_KINDS], tp_err *err)
{
    tp_graph *lowered = NULL;
    tp_plan *plan = NULL;
    tp_status st = tp_exec_lower(g, batch, lowering, &lowered, err);
    if (st == TP_OK)
        st = tp_plan_build(lowered, &plan, err);
    if (st == TP_OK)
        memcpy(bytes, plan->arena_bytes, sizeof plan->arena_bytes);
    tp_plan_free(plan);
    tp_graph_free(lowered);
    return st;
}

tp_status tp_exec_bind(tp_exec *x, tp_exec_pool *pool, tp_err *err)
{
    for (int k = TP_MEM_REGULAR; pool && k < TP_MEM_KINDS; k++)
        if (x->plan->arena_bytes[k] > pool->bytes[k])
            return tp_fail(err, TP_INTERNAL,
                           "batch %lld needs a %s arena of %lld bytes per rank; the shared pool has %lld",
                           (long long)x->batch, tp_mem_kind_name((tp_mem_kind)k), (long long)x->plan->arena_bytes[k],
                           (long long)pool->bytes[k]);
    x->pool = pool;
    tp_status st = tp_rank_group_run(x->rg, setup_rank, x, &x->hooks, err);
    x->b->iface->reset(x->b);
    return st;
}

tp_status tp_exec_create(const tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                         const tp_weights *w, const tp_exec_opts *o, tp_exec **out, tp_err *err)
{
    tp_exec *x;
    tp_status st = tp_exec_prepare(g, batch, b, rg, w, o, &x, err);
    if (st == TP_OK && (st = tp_exec_bind(x, NULL, err)) != TP_OK) {
        tp_exec_free(x);
        x = NULL;
    }
    *out = x;
    return st;
}

void tp_exec_free(tp_exec *x)
{
    if (!x)
        return;
    for (int r = 0; x->rs && r < x->world; r++) {
        rank_state *s = &x->rs[r];
        for (int p = 0; s->cap && p < x->plan->n_parts; p++)
            if (s->cap[p])
                x->b->iface->capture_free(x->b, s->cap[p]);
        for (int k = 0; !x->pool && k < TP_MEM_KINDS; k++)
            if (s->arena[k])
                x->b->iface->free(x->b, r, s->arena[k]);
        free(s->t);
        free(s->ws);
        free(s->cap);
    }
    free(x->rs);
    free(x->out_desc);
    tp_plan_free(x->plan);
    tp_graph_free(x->g);
    free(x);
}

int64_t tp_exec_batch(const tp_exec *x) { return x->batch; }
const tp_plan *tp_exec_plan(const tp_exec *x) { return x->plan; }
const tp_graph *tp_exec_graph(const tp_exec *x) { return x->g; }
tp_tensor tp_exec_output_desc(const tp_exec *x, int i) { return x->out_desc[i]; }
tp_tensor tp_exec_node_tensor(const tp_exec *x, int rank, int i) { return x->rs[rank].t[i]; }

tp_status tp_exec_run(tp_exec *x, const tp_tensor *inputs, tp_tensor *outputs, tp_exec_stats *stats,
                      tp_err *err)
{
    x->run_in = inputs;
    x->run_out = outputs;
    x->stats = stats;
    tp_status st = tp_rank_group_run_rows(x->rg, x->batch, run_rank, x, &x->hooks, err);
    x->b->iface->reset(x->b);
    x->stats = NULL;
    return st;
}
