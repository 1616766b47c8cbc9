/* choose_collectives — pick each collective's lowering from its message
 * size, the world size and what the backend offers (tp_lowering, from its
 * caps). all_reduce is the one with a real choice: one_shot below the
 * threshold (latency-bound: one barrier, each rank reads every peer's
 * symmetric buffer), the backend's large lowering above it (cpu: ring,
 * bandwidth-bound, 2(d-1) steps moving 1/d of the data each; cuda: nccl).
 * The other collectives take the backend's other lowering (cpu: one_shot,
 * reading peers' buffers directly; cuda: nccl). Lowerings are blocking, so
 * no separate wait/synchronize follows them. */
#include "passes.h"

tp_status tp_pass_choose_collectives(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)err;
    *changed = 0;
    int d = g->world_size > 8 ? 8 : g->world_size;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        tp_op_kind k = tp_op_kind_of(n->op);
        tp_algo algo;
        if (k == TP_KIND_FUSED)
            algo = TP_ALGO_FUSED;
        else if (k != TP_KIND_COLLECTIVE)
            continue;
        else if (n->op != TP_OP_ALL_REDUCE)
            algo = o->lowering.other_collectives;
        else if (tp_node_bytes(&g->nodes[tp_comm_input(n)]) > o->lowering.one_shot_max_bytes[d])
            algo = o->lowering.large_all_reduce;
        else
            algo = TP_ALGO_ONE_SHOT;
        *changed += n->attrs.algo != algo;
        n->attrs.algo = algo;
    }
    return TP_OK;
}
