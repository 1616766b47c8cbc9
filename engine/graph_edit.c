/* graph_edit.c — the few edits passes need on the flat node list. Indices
 * are positions, so inserting or removing shifts every later reference;
 * each function here fixes all of them (node inputs, source/output lists,
 * storage owners) in one place. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "graph.h"

static void shift_refs(tp_graph *g, int from, int delta)
{
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        for (int k = 0; k < n->n_inputs; k++)
            if (n->inputs[k] >= from)
                n->inputs[k] += delta;
        if (n->storage >= from)
            n->storage += delta;
    }
    for (int i = 0; i < g->n_inputs; i++)
        if (g->input_ids[i] >= from)
            g->input_ids[i] += delta;
    for (int i = 0; i < g->n_params; i++)
        if (g->param_ids[i] >= from)
            g->param_ids[i] += delta;
    for (int i = 0; i < g->n_states; i++)
        if (g->state_ids[i] >= from)
            g->state_ids[i] += delta;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->output_ids[i] >= from)
            g->output_ids[i] += delta;
}

tp_status tp_graph_insert(tp_graph *g, int pos, tp_node *n, tp_err *err)
{
    tp_node *nodes = realloc(g->nodes, (size_t)(g->n_nodes + 1) * sizeof *nodes);
    if (!nodes)
        return tp_fail(err, TP_NOMEM, "pass: out of memory inserting '%s'", n->name);
    g->nodes = nodes;
    shift_refs(g, pos, 1);
    memmove(&g->nodes[pos + 1], &g->nodes[pos], (size_t)(g->n_nodes - pos) * sizeof *nodes);
    g->nodes[pos] = *n;
    g->nodes[pos].storage = pos;
    g->n_nodes++;
    return TP_OK;
}

tp_status tp_graph_insert_copy(tp_graph *g, int value, tp_op op, const char *suffix, int *out, tp_err *err)
{
    char base[300];
    snprintf(base, sizeof base, "%s.%s", g->nodes[value].name, suffix);
    tp_node n = {0};
    n.op = op;
    n.name = tp_graph_fresh_name(g, base);
    n.inputs = malloc(sizeof(int));
    if (!n.name || !n.inputs) {
        free(n.name);
        free(n.inputs);
        return tp_fail(err, TP_NOMEM, "out of memory inserting a copy of '%s'", g->nodes[value].name);
    }
    n.n_inputs = 1;
    n.inputs[0] = value;
    *out = value + 1;
    return tp_graph_insert(g, value + 1, &n, err);
}

void tp_graph_remove(tp_graph *g, int pos)
{
    tp_node *n = &g->nodes[pos];
    free(n->name);
    free(n->inputs);
    free(n->tensor_key);
    memmove(&g->nodes[pos], &g->nodes[pos + 1], (size_t)(g->n_nodes - pos - 1) * sizeof *n);
    g->n_nodes--;
    shift_refs(g, pos + 1, -1);
}

void tp_graph_replace_uses(tp_graph *g, int from, int to, int start)
{
    for (int i = start; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_inputs; k++)
            if (g->nodes[i].inputs[k] == from)
                g->nodes[i].inputs[k] = to;
    for (int i = 0; i < g->n_outputs; i++)
        if (g->output_ids[i] == from)
            g->output_ids[i] = to;
}

int tp_graph_n_users(const tp_graph *g, int i)
{
    int n = 0;
    for (int j = i + 1; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            n += g->nodes[j].inputs[k] == i;
    for (int j = 0; j < g->n_outputs; j++)
        n += g->output_ids[j] == i;
    return n;
}

int tp_graph_sole_user(const tp_graph *g, int i)
{
    int user = -1;
    for (int j = 0; j < g->n_outputs; j++)
        if (g->output_ids[j] == i)
            return -1;
    for (int j = i + 1; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            if (g->nodes[j].inputs[k] == i) {
                if (user >= 0)
                    return -1;
                user = j;
            }
    return user;
}

char *tp_graph_fresh_name(const tp_graph *g, const char *base)
{
    size_t len = strlen(base) + 24;
    char *s = malloc(len);
    if (!s)
        return NULL;
    snprintf(s, len, "%s", base);
    for (int k = 1; tp_graph_find(g, s) >= 0; k++)
        snprintf(s, len, "%s_%d", base, k);
    return s;
}
