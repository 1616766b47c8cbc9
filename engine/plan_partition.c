/* plan_partition.c — maximal runs of capturable nodes become captured
 * partitions; runs of fallback nodes become fallback partitions, executed
 * eagerly between replays. A fallback output read by a later captured
 * partition is hoisted: its buffer is planned before capture like any other,
 * so the address the capture baked in is where the eager kernel writes. */
#include <stdlib.h>

#include "plan.h"

int tp_plan_node_runs(const tp_graph *g, int i)
{
    const tp_node *n = &g->nodes[i];
    return tp_op_kind_of(n->op) != TP_KIND_SOURCE && tp_node_owns(g, i);
}

static tp_status add_partition(tp_plan *p, tp_part_kind kind, tp_err *err)
{
    tp_partition *parts = realloc(p->parts, (size_t)(p->n_parts + 1) * sizeof *parts);
    if (!parts)
        return tp_fail(err, TP_NOMEM, "plan: out of memory");
    p->parts = parts;
    parts[p->n_parts] = (tp_partition){.id = p->n_parts, .kind = kind};
    parts[p->n_parts].nodes = malloc((size_t)p->n_nodes * sizeof(int));
    if (!parts[p->n_parts].nodes)
        return tp_fail(err, TP_NOMEM, "plan: out of memory");
    p->n_parts++;
    return TP_OK;
}

static void mark_hoisted(const tp_graph *g, tp_plan *p)
{
    for (int j = 0; j < g->n_nodes; j++) {
        int pj = p->part_of[j];
        if (pj < 0 || p->parts[pj].kind != TP_PART_CAPTURED)
            continue;
        for (int k = 0; k < g->nodes[j].n_inputs; k++) {
            int owner = g->nodes[g->nodes[j].inputs[k]].storage;
            int po = p->part_of[owner];
            if (po >= 0 && po < pj && p->parts[po].kind == TP_PART_FALLBACK)
                p->buf[owner].hoisted = 1;
        }
    }
}

tp_status tp_plan_partition(const tp_graph *g, tp_plan *p, tp_err *err)
{
    for (int i = 0; i < g->n_nodes; i++) {
        p->part_of[i] = -1;
        if (!tp_plan_node_runs(g, i))
            continue;
        tp_part_kind kind = g->nodes[i].fallback ? TP_PART_FALLBACK : TP_PART_CAPTURED;
        if (p->n_parts == 0 || p->parts[p->n_parts - 1].kind != kind) {
            tp_status st = add_partition(p, kind, err);
            if (st != TP_OK)
                return st;
        }
        tp_partition *part = &p->parts[p->n_parts - 1];
        part->nodes[part->n_nodes++] = i;
        p->part_of[i] = part->id;
    }
    mark_hoisted(g, p);
    return TP_OK;
}
