#include "plan_report.h"

#include <jansson.h>
#include <stdlib.h>

static json_t *int_array(int n, const int64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static int node_contiguous(const tp_node *n)
{
    tp_tensor t = {0};
    t.ndim = n->ndim;
    for (int i = 0; i < n->ndim; i++) {
        t.shape[i] = n->shape[i];
        t.stride[i] = n->stride[i];
    }
    return tp_tensor_is_contiguous(&t);
}

static json_t *node_json(const tp_graph *g, int i)
{
    const tp_node *n = &g->nodes[i];
    json_t *o = json_object();
    json_t *ins = json_array();
    for (int k = 0; k < n->n_inputs; k++)
        json_array_append_new(ins, json_string(g->nodes[n->inputs[k]].name));
    json_object_set_new(o, "name", json_string(n->name));
    json_object_set_new(o, "op", json_string(tp_op_name(n->op)));
    json_object_set_new(o, "inputs", ins);
    json_object_set_new(o, "shape", int_array(n->ndim, n->shape));
    json_object_set_new(o, "dtype", json_string(tp_dtype_name(n->dtype)));
    json_object_set_new(o, "strides", int_array(n->ndim, n->stride));
    json_object_set_new(o, "contiguous", json_boolean(node_contiguous(n)));
    json_object_set_new(o, "storage", json_string(g->nodes[n->storage].name));
    json_object_set_new(o, "offset", json_integer(n->offset));
    if (n->fallback)
        json_object_set_new(o, "fallback", json_true());
    return o;
}

static tp_status print_json(const tp_graph *g, FILE *out, tp_err *err)
{
    json_t *root = json_object(), *nodes = json_array();
    json_object_set_new(root, "name", json_string(g->name));
    json_object_set_new(root, "world_size", json_integer(g->world_size));
    json_object_set_new(root, "batch", json_integer(g->batch));
    for (int i = 0; i < g->n_nodes; i++)
        json_array_append_new(nodes, node_json(g, i));
    json_object_set_new(root, "nodes", nodes);
    char *s = json_dumps(root, JSON_INDENT(1));
    json_decref(root);
    if (!s)
        return tp_fail(err, TP_NOMEM, "plan: out of memory");
    fprintf(out, "%s\n", s);
    free(s);
    return TP_OK;
}

static void print_text(const tp_graph *g, FILE *out)
{
    fprintf(out, "graph %s: world_size %d, batch %lld, %d nodes\n", g->name, g->world_size,
            (long long)g->batch, g->n_nodes);
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        char shape[160], strides[160], ins[256] = "";
        int off = 0;
        for (int k = 0; k < n->n_inputs && off < (int)sizeof ins; k++)
            off += snprintf(ins + off, sizeof ins - (size_t)off, "%s%s", k ? ", " : "", g->nodes[n->inputs[k]].name);
        fprintf(out, "  %-20s %-15s %-6s %-18s strides %-18s %s", n->name, tp_op_name(n->op),
                tp_dtype_name(n->dtype), tp_shape_str(shape, sizeof shape, n->ndim, n->shape),
                tp_shape_str(strides, sizeof strides, n->ndim, n->stride),
                node_contiguous(n) ? "contiguous" : "strided");
        if (!tp_node_owns(g, i) && n->op != TP_OP_PARAM && n->op != TP_OP_INPUT)
            fprintf(out, " view of %s+%lld", g->nodes[n->storage].name, (long long)n->offset);
        if (n->fallback)
            fprintf(out, " fallback");
        fprintf(out, "%s%s%s\n", n->n_inputs ? " <- (" : "", ins, n->n_inputs ? ")" : "");
    }
}

tp_status tp_plan_report(tp_graph *g, int64_t batch, int json, FILE *out, tp_err *err)
{
    tp_status st = tp_graph_infer(g, batch, err);
    if (st != TP_OK)
        return st;
    if (json)
        return print_json(g, out, err);
    print_text(g, out);
    return TP_OK;
}
