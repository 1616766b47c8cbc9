/* place_symmetric — which values must live in symmetric (peer-mapped)
 * memory: the inputs peers read directly, i.e. the operand of every
 * collective lowered one_shot or ring and the communicated operand of every
 * fused node. For each such value, by priority:
 *  1. computed by us      -> its storage is allocated in the symmetric arena
 *                            (zero copy);
 *  2. a graph input       -> a persistent symmetric input slot, filled by a
 *                            copy (DMA on cuda) before replay, outside capture;
 *  3. anything else (a param, or the output of a fallback node, whose memory
 *     an opaque kernel owns) -> an identity_copy node into a symmetric buffer,
 *                            shared by every reader of that value.
 * NCCL-lowered collectives need none of this. */
#include "passes.h"

static int reads_peers(const tp_node *n)
{
    tp_op_kind k = tp_op_kind_of(n->op);
    if (k == TP_KIND_FUSED)
        return n->op == TP_OP_FUSED_AG_MM; /* mm_rs: its workspace, planned later */
    return k == TP_KIND_COLLECTIVE && (n->attrs.algo == TP_ALGO_ONE_SHOT || n->attrs.algo == TP_ALGO_RING ||
                                       n->attrs.algo == TP_ALGO_DEFAULT);
}

tp_status tp_pass_place_symmetric(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)o;
    *changed = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        if (!reads_peers(&g->nodes[i]))
            continue;
        int v = tp_comm_input(&g->nodes[i]);
        tp_node *owner = &g->nodes[g->nodes[v].storage];
        if (owner->op == TP_OP_PARAM || owner->fallback) {
            int copy;
            tp_status st = tp_graph_insert_copy(g, v, TP_OP_IDENTITY_COPY, "symmetric", &copy, err);
            if (st != TP_OK)
                return st;
            g->nodes[copy].symmetric = 1;
            for (int j = copy + 1; j < g->n_nodes; j++)
                if (reads_peers(&g->nodes[j]) && tp_comm_input(&g->nodes[j]) == v)
                    *tp_comm_slot(&g->nodes[j]) = copy;
            i++;
            if ((st = tp_graph_infer(g, g->batch, err)) != TP_OK)
                return st;
        } else if (!owner->symmetric) {
            owner->symmetric = 1;
        } else {
            continue;
        }
        (*changed)++;
    }
    return TP_OK;
}
