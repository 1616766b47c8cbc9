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

tp_status tp_check_request_values(const tp_graph *g, const tp_host_tensor *const *ordered, tp_err *err)
{
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
