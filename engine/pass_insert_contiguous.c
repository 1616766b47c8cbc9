/* insert_contiguous — collectives move contiguous buffers (NCCL, peer
 * copies), but a graph may hand them a view. Insert one `contiguous` copy
 * before a collective only when its input is strided, and share it between
 * collectives that read the same view. Contiguous inputs are left alone.
 * all_to_all is exempt: its lowering packs each destination's chunk itself
 * (a strided gather), so a prior full copy would only double the traffic. */
#include <stdio.h>
#include <stdlib.h>

#include "passes.h"

static int is_collective(const tp_node *n)
{
    return tp_op_kind_of(n->op) == TP_KIND_COLLECTIVE && n->op != TP_OP_ALL_TO_ALL;
}

/* Inserts `VIEW.contiguous = contiguous(VIEW)` right after the view;
 * returns its index. */
static tp_status insert_copy(tp_graph *g, int view, int *out, tp_err *err)
{
    char base[300];
    snprintf(base, sizeof base, "%s.contiguous", g->nodes[view].name);
    tp_node n = {0};
    n.op = TP_OP_CONTIGUOUS;
    n.name = tp_graph_fresh_name(g, base);
    n.inputs = malloc(sizeof(int));
    if (!n.name || !n.inputs) {
        free(n.name);
        free(n.inputs);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    n.n_inputs = 1;
    n.inputs[0] = view;
    *out = view + 1;
    return tp_graph_insert(g, view + 1, &n, err);
}

tp_status tp_pass_insert_contiguous(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)o;
    *changed = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        if (!is_collective(n) || !tp_pass_is_strided(g, n->inputs[0]))
            continue;
        int view = n->inputs[0], copy;
        tp_status st = insert_copy(g, view, &copy, err);
        if (st != TP_OK)
            return st;
        /* every later collective reading the view shares this copy */
        for (int j = copy + 1; j < g->n_nodes; j++)
            if (is_collective(&g->nodes[j]) && g->nodes[j].inputs[0] == view)
                g->nodes[j].inputs[0] = copy;
        (*changed)++;
        i++; /* the collective moved one slot down */
        if ((st = tp_graph_infer(g, g->batch, err)) != TP_OK)
            return st;
    }
    return TP_OK;
}
