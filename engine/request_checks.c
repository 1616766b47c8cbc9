#include "request_checks.h"

#include <string.h>

/* Ops whose output holds exactly the elements of their first input. */
static int keeps_elements(tp_op op)
{
    return op == TP_OP_VIEW || op == TP_OP_RESHAPE || op == TP_OP_PERMUTE || op == TP_OP_TRANSPOSE ||
           op == TP_OP_CONTIGUOUS || op == TP_OP_IDENTITY_COPY;
}

static int source_of(const tp_graph *g, int k)
{
    while (keeps_elements(g->nodes[k].op))
        k = g->nodes[k].inputs[0];
    return k;
}

static int input_index(const tp_graph *g, int node)
{
    for (int i = 0; i < g->n_inputs; i++)
        if (g->input_ids[i] == node)
            return i;
    return -1;
}

static int64_t id_at(const tp_host_tensor *t, size_t i)
{
    if (t->dtype == TP_I32) {
        int32_t v;
        memcpy(&v, (const char *)t->data + i * sizeof v, sizeof v);
        return v;
    }
    int64_t v;
    memcpy(&v, (const char *)t->data + i * sizeof v, sizeof v);
    return v;
}

static tp_status check_ids(const tp_host_tensor *t, int64_t rows, const tp_node *emb, tp_err *err)
{
    if (t->dtype != TP_I32 && t->dtype != TP_I64)
        return TP_OK; /* the engine refuses the dtype itself */
    size_t n = t->nbytes / tp_dtype_size(t->dtype);
    for (size_t i = 0; i < n; i++) {
        int64_t id = id_at(t, i);
        if (id < 0 || id >= rows)
            return tp_fail(err, TP_INVALID, "input '%s': element %zu holds id %lld, outside [0, %lld), the rows "
                           "of the table of embedding '%s'", t->name, i, (long long)id, (long long)rows,
                           emb->name);
    }
    return TP_OK;
}

/* Every element of t in [lo, hi]; what: the range's meaning. */
static tp_status check_range(const tp_host_tensor *t, int64_t lo, int64_t hi, const tp_node *n, const char *what,
                             tp_err *err)
{
    if (t->dtype != TP_I32 && t->dtype != TP_I64)
        return TP_OK; /* the engine refuses the dtype itself */
    size_t count = t->nbytes / tp_dtype_size(t->dtype);
    for (size_t i = 0; i < count; i++) {
        int64_t v = id_at(t, i);
        if (v < lo || v > hi)
            return tp_fail(err, TP_INVALID, "input '%s': element %zu holds %lld, outside %lld..%lld (%s of '%s')",
                           t->name, i, (long long)v, (long long)lo, (long long)hi, what, n->name);
    }
    return TP_OK;
}

/* kv_attention's slot and pos, where they come straight from graph inputs:
 * slots 0 (inactive) .. S, positions 0 .. L - T. */
static tp_status check_kv_attention(const tp_graph *g, const tp_node *n, const tp_host_tensor *const *ordered,
                                    tp_err *err)
{
    const tp_node *q = &g->nodes[n->inputs[0]], *cache = &g->nodes[n->inputs[3]];
    int slot = input_index(g, source_of(g, n->inputs[5])), pos = input_index(g, source_of(g, n->inputs[6]));
    tp_status st = TP_OK;
    if (slot >= 0)
        st = check_range(ordered[slot], 0, cache->shape[0], n, "the cache slots; 0: an inactive row", err);
    if (st == TP_OK && pos >= 0)
        st = check_range(ordered[pos], 0, cache->shape[2] - q->shape[2], n, "the positions the cache holds", err);
    return st;
}

/* A generation graph's input_ids: below the true vocabulary (the padded
 * rows of a vocab-parallel table are not tokens). */
static tp_status check_generate(const tp_graph *g, const tp_host_tensor *const *ordered, tp_err *err)
{
    int in = input_index(g, tp_graph_find(g, g->gen->input_ids));
    if (in < 0)
        return TP_OK;
    const tp_node *n = &g->nodes[g->input_ids[in]];
    return check_range(ordered[in], 0, g->gen->vocab_size - 1, n, "the token ids: generate.vocab_size", err);
}

tp_status tp_check_request_values(const tp_graph *g, const tp_host_tensor *const *ordered, tp_err *err)
{
    tp_status st = g->gen ? check_generate(g, ordered, err) : TP_OK;
    for (int k = 0; st == TP_OK && k < g->n_nodes; k++)
        if (g->nodes[k].op == TP_OP_KV_ATTENTION)
            st = check_kv_attention(g, &g->nodes[k], ordered, err);
    if (st != TP_OK)
        return st;
    for (int k = 0; k < g->n_nodes; k++) {
        const tp_node *n = &g->nodes[k];
        if (n->op != TP_OP_EMBEDDING || n->n_inputs < 2)
            continue;
        int in = input_index(g, source_of(g, n->inputs[0]));
        const tp_node *table = &g->nodes[source_of(g, n->inputs[1])];
        if (in < 0 || table->op != TP_OP_PARAM || table->g_ndim < 1)
            continue;
        /* vocab_parallel: the ranks' row shards together are the range;
         * otherwise each rank looks ids up in the rows it holds */
        int64_t rows = table->gshape[0];
        if (!n->attrs.vocab_parallel && table->placement.kind == TP_PLACE_SHARD && table->placement.dim == 0)
            rows /= g->world_size;
        tp_status st = check_ids(ordered[in], rows, n, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}
