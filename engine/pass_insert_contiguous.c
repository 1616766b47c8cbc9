/* insert_contiguous — collectives move contiguous buffers (NCCL, peer
 * copies), but a graph may hand them a view. Insert one `contiguous` copy
 * before a collective only when its input is strided, and share it between
 * collectives that read the same view. Contiguous inputs are left alone.
 * all_to_all is exempt: its lowering packs each destination's chunk itself
 * (a strided gather), so a prior full copy would only double the traffic. */
#include "passes.h"

static int is_collective(const tp_node *n)
{
    return tp_op_kind_of(n->op) == TP_KIND_COLLECTIVE && n->op != TP_OP_ALL_TO_ALL;
}

tp_status tp_pass_insert_contiguous(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)o;
    *changed = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        if (!is_collective(n) || !tp_pass_is_strided(g, tp_comm_input(n)))
            continue;
        int view = tp_comm_input(n), copy;
        tp_status st = tp_graph_insert_copy(g, view, TP_OP_CONTIGUOUS, "contiguous", &copy, err);
        if (st != TP_OK)
            return st;
        /* every later collective reading the view shares this copy */
        for (int j = copy + 1; j < g->n_nodes; j++)
            if (is_collective(&g->nodes[j]) && tp_comm_input(&g->nodes[j]) == view)
                *tp_comm_slot(&g->nodes[j]) = copy;
        (*changed)++;
        i++; /* the collective moved one slot down */
        if ((st = tp_graph_infer(g, g->batch, err)) != TP_OK)
            return st;
    }
    return TP_OK;
}
