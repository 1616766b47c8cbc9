/* shard_outputs — a replicated graph output that is
 * slice(all_gather(x, dim d), dim d, start 0, length L), read by nothing
 * else, becomes x itself, placed shard(d) with global length L: each rank
 * copies its chunk of x straight into the request's output, the last
 * chunks cut at L (exec.c's copy_outputs), and the gather and the slice
 * are gone.
 *
 * That is how an importer gives back a vocab it padded to divide the world
 * size (GPT-2's 50257 is 50432 at 2 ranks): the logits were gathered whole
 * on every rank, and rank 0 then copied the slice out, 25 MB twice for one
 * 128-token request. The format's shard(k) has no length, so such a graph
 * cannot say it itself; an output gathered without a slice can, and is
 * left as written. */
#include "passes.h"

/* The all_gather under output i when the output is slice(all_gather(x))
 * from 0 along the gathered dim, each read only there; -1 otherwise. */
static int gathered_then_cut(const tp_graph *g, int i)
{
    int s = g->output_ids[i];
    const tp_node *slice = &g->nodes[s];
    if (g->output_place[i].kind != TP_PLACE_REPLICATE || slice->op != TP_OP_SLICE || slice->attrs.start != 0 ||
        tp_graph_n_users(g, s) != 1)
        return -1;
    int a = slice->inputs[0];
    const tp_node *gather = &g->nodes[a];
    /* not along dim 0, which may be the batch: a cut there would be a cut
     * of the request's rows, which the server assembles itself */
    if (gather->op != TP_OP_ALL_GATHER || gather->attrs.dim != slice->attrs.dim || gather->attrs.dim == 0 ||
        tp_graph_n_users(g, a) != 1)
        return -1;
    int x = tp_comm_input(gather);
    for (int k = 0; k < g->n_outputs; k++)
        if (g->output_ids[k] == x)
            return -1; /* x is an output already, under its own placement */
    return a;
}

tp_status tp_pass_shard_outputs(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)o;
    (void)err;
    *changed = 0;
    for (int i = 0; i < g->n_outputs; i++) {
        int a = gathered_then_cut(g, i);
        if (a < 0)
            continue;
        int s = g->output_ids[i], x = tp_comm_input(&g->nodes[a]);
        tp_placement p = {.kind = TP_PLACE_SHARD, .dim = g->nodes[s].attrs.dim, .length = g->nodes[s].attrs.length};
        /* x takes the output's name: clients ask for outputs by name */
        char *name = g->nodes[x].name;
        g->nodes[x].name = g->nodes[s].name;
        g->nodes[s].name = name;
        g->output_ids[i] = x;
        g->output_place[i] = p;
        tp_graph_remove(g, s); /* s > a > x: removing s first keeps a's index */
        tp_graph_remove(g, a);
        *changed += 2;
    }
    return TP_OK;
}
