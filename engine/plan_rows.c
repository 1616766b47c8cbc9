/* plan_rows.c — may a batch be padded up to a bucket (and split into
 * several runs past the largest)? Only if no op mixes batch rows: then the
 * first B rows of every output depend only on the first B rows of input.
 *
 * The batch dim of every value is found by inferring at two batch sizes
 * (the dim whose size changes) instead of tracking symbols; each op then
 * has a rule saying whether it reduces, splits or concatenates along it.
 * Anything unsure is reported as mixing: the engine then runs the exact
 * batch instead, which is always correct. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"

/* Batch dim of node i given shapes at two batches; -1 if none, -2 if more
 * than one dim changed (a view folded the batch into another dim). */
static int batch_dim(const int64_t *s1, const int64_t *s2, int nd)
{
    int bd = -1;
    for (int k = 0; k < nd; k++)
        if (s1[k] != s2[k])
            bd = bd == -1 ? k : -2;
    return bd;
}

/* The op's batch-rows rule (its descriptor names it). */
static int op_mixes_rows(const tp_graph *g, int i, const int *bd)
{
    const tp_node *n = &g->nodes[i];
    int b = bd[i], in0 = n->n_inputs ? bd[n->inputs[0]] : -1;
    const tp_attrs *a = &n->attrs;
    switch (tp_op_desc_of(n->op)->rows) {
    case TP_ROWS_INDEPENDENT: return 0;
    case TP_ROWS_ALONG_DIM: return a->dim == in0;
    case TP_ROWS_LAST_DIM: return in0 == g->nodes[n->inputs[0]].ndim - 1;
    case TP_ROWS_MATMUL: {
        const tp_node *an = &g->nodes[n->inputs[0]], *bn = &g->nodes[n->inputs[1]];
        int bb = bd[n->inputs[1]];
        return in0 == an->ndim - 1 || (bb != -1 && bb >= bn->ndim - 2);
    }
    case TP_ROWS_ATTENTION:
        for (int k = 0; k < 3; k++)
            if (bd[n->inputs[k]] > 1)
                return 1;
        /* the key-padding mask [B, T] keeps rows apart only batched on B */
        return n->n_inputs > 3 && bd[n->inputs[3]] > 0;
    case TP_ROWS_VIEW: return !(in0 == -1 || (in0 == 0 && b == 0));
    case TP_ROWS_FUSED:
        /* a folded reassembly permutes rows along piece_dim and cat_dim */
        if (a->n_pieces > 0 && in0 >= 0 && (a->piece_dim == in0 || a->cat_dim == in0))
            return 1;
        return b >= 0 && a->dim == b;
    case TP_ROWS_DIM_ATTR: return b >= 0 && a->dim == b;
    case TP_ROWS_ALL_TO_ALL: return in0 >= 0 && (a->split_dim == in0 || a->concat_dim == b);
    case TP_ROWS_KV_ATTENTION:
        /* q, k, v, slot, pos by row (dim 0); the caches are states */
        for (int k = 0; k < n->n_inputs; k++)
            if (bd[n->inputs[k]] > 0 || ((k == 3 || k == 4) && bd[n->inputs[k]] != -1))
                return 1;
        return 0;
    case TP_ROWS_UNSET: return 1; /* unknown: run exact batches, always correct */
    }
    return 1;
}

static tp_status batch_dims(tp_graph *g, int64_t b1, int *bd, tp_err *err)
{
    int n = g->n_nodes;
    int64_t(*s1)[TP_MAX_DIMS] = malloc(sizeof(*s1) * (size_t)(n + 1));
    if (!s1)
        return tp_fail(err, TP_NOMEM, "out of memory");
    tp_status st = tp_graph_infer(g, b1, err);
    for (int i = 0; st == TP_OK && i < n; i++)
        memcpy(s1[i], g->nodes[i].shape, sizeof s1[i]);
    if (st == TP_OK)
        st = tp_graph_infer(g, 2 * b1, err);
    for (int i = 0; st == TP_OK && i < n; i++)
        bd[i] = batch_dim(s1[i], g->nodes[i].shape, g->nodes[i].ndim);
    free(s1);
    return st;
}

tp_status tp_plan_rows_independent(tp_graph *g, int64_t b1, int *independent, char *why, size_t why_len,
                                   tp_err *err)
{
    int64_t keep = g->batch;
    int *bd = malloc(sizeof(int) * (size_t)(g->n_nodes + 1));
    if (!bd)
        return tp_fail(err, TP_NOMEM, "out of memory");
    tp_status st = batch_dims(g, b1, bd, err);
    *independent = st == TP_OK;
    for (int i = 0; st == TP_OK && *independent && i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        if (bd[i] == -2 || op_mixes_rows(g, i, bd)) {
            *independent = 0;
            snprintf(why, why_len, "node '%s' (%s) mixes batch rows", n->name, tp_op_name(n->op));
        }
    }
    for (int k = 0; st == TP_OK && *independent && k < g->n_outputs; k++) {
        int o = g->output_ids[k];
        int on_batch = bd[o] == 0 && g->output_place[k].kind == TP_PLACE_SHARD && g->output_place[k].dim == 0;
        if (bd[o] > 0 || on_batch) {
            *independent = 0;
            snprintf(why, why_len, "output '%s' %s", g->nodes[o].name,
                     on_batch ? "is sharded on the batch dim" : "does not keep the batch as dim 0");
        }
    }
    free(bd);
    if (st == TP_OK)
        st = tp_graph_infer(g, keep, err);
    return st;
}
