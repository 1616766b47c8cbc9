#include "plan_report.h"

#include <jansson.h>
#include <stdlib.h>

#include "plan.h"

static json_t *int_array(int n, const int64_t *v)
{
    json_t *a = json_array();
    for (int i = 0; i < n; i++)
        json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *node_json(const tp_graph *g, const tp_plan *p, int i)
{
    const tp_node *n = &g->nodes[i];
    json_t *ins = json_array();
    for (int k = 0; k < n->n_inputs; k++)
        json_array_append_new(ins, json_string(g->nodes[n->inputs[k]].name));
    json_t *o = json_pack("{s:s, s:s, s:o, s:o, s:s, s:o, s:b, s:s, s:I}", "name", n->name, "op",
                          tp_op_name(n->op), "inputs", ins, "shape", int_array(n->ndim, n->shape), "dtype",
                          tp_dtype_name(n->dtype), "strides", int_array(n->ndim, n->stride), "contiguous",
                          tp_node_contiguous(n), "storage", g->nodes[n->storage].name, "offset", (json_int_t)n->offset);
    const tp_buf *b = &p->buf[i];
    if (b->kind != TP_MEM_NONE)
        json_object_set_new(o, "memory", json_pack("{s:s, s:I, s:I}", "arena", tp_mem_kind_name(b->kind), "offset",
                                                   (json_int_t)b->offset, "bytes", (json_int_t)b->bytes));
    if (n->fallback)
        json_object_set_new(o, "fallback", json_true());
    return o;
}

static json_t *collectives_json(const tp_graph *g)
{
    json_t *a = json_array();
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        tp_op_kind k = tp_op_kind_of(n->op);
        if (k != TP_KIND_COLLECTIVE && k != TP_KIND_FUSED)
            continue;
        json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:I}", "node", n->name, "op", tp_op_name(n->op),
                                           "algorithm", tp_algo_name(n->attrs.algo), "bytes",
                                           (json_int_t)tp_node_bytes(&g->nodes[tp_comm_input(n)])));
    }
    return a;
}

static json_t *partitions_json(const tp_graph *g, const tp_plan *p, json_t **hoisted)
{
    json_t *a = json_array();
    *hoisted = json_array();
    for (int i = 0; i < p->n_parts; i++) {
        json_t *names = json_array();
        for (int k = 0; k < p->parts[i].n_nodes; k++)
            json_array_append_new(names, json_string(g->nodes[p->parts[i].nodes[k]].name));
        json_array_append_new(a, json_pack("{s:i, s:s, s:o}", "id", i, "kind",
                                           p->parts[i].kind == TP_PART_CAPTURED ? "captured" : "fallback", "nodes", names));
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (p->buf[i].hoisted)
            json_array_append_new(*hoisted, json_pack("{s:s, s:I, s:i}", "node", g->nodes[i].name, "bytes",
                                                      (json_int_t)p->buf[i].bytes, "partition", p->part_of[i]));
    return a;
}

static json_t *input_copies_json(const tp_graph *g, int dma)
{
    json_t *a = json_array();
    for (int i = 0; i < g->n_inputs; i++) {
        const tp_node *n = &g->nodes[g->input_ids[i]];
        json_array_append_new(a, json_pack("{s:s, s:s, s:s}", "input", n->name, "into",
                                           n->symmetric ? "symmetric" : "regular", "method", dma ? "dma" : "memcpy"));
    }
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TP_OP_IDENTITY_COPY)
            json_array_append_new(a, json_pack("{s:s, s:s, s:s, s:s}", "input", g->nodes[g->nodes[i].inputs[0]].name,
                                               "into", "symmetric", "method", "identity_copy", "node", g->nodes[i].name));
    return a;
}

static json_t *memory_json(const tp_plan *p)
{
    return json_pack("{s:i, s:i, s:I, s:I, s:b, s:{s:I, s:I, s:I, s:I}}", "regular_buffers",
                     p->n_buffers[TP_MEM_REGULAR], "symmetric_buffers", p->n_buffers[TP_MEM_SYMMETRIC], "peak_bytes",
                     (json_int_t)p->peak_bytes, "naive_bytes", (json_int_t)p->naive_bytes, "symmetric_offsets_equal",
                     p->symmetric_offsets_equal, "arena_bytes", "regular", (json_int_t)p->arena_bytes[TP_MEM_REGULAR],
                     "symmetric", (json_int_t)p->arena_bytes[TP_MEM_SYMMETRIC], "input",
                     (json_int_t)p->arena_bytes[TP_MEM_INPUT], "output", (json_int_t)p->arena_bytes[TP_MEM_OUTPUT]);
}

/* Bytes per rank of every state (resident beside the weights, outside the
 * arenas). */
static int64_t states_bytes(const tp_graph *g)
{
    int64_t t = 0;
    for (int s = 0; s < g->n_states; s++)
        t += tp_node_bytes(&g->nodes[g->state_ids[s]]);
    return t;
}

/* Only for a graph with states: other graphs' reports stay as they were. */
static json_t *states_json(const tp_graph *g)
{
    json_t *list = json_array();
    for (int s = 0; s < g->n_states; s++) {
        const tp_node *n = &g->nodes[g->state_ids[s]];
        char pl[32];
        json_array_append_new(list, json_pack("{s:s, s:s, s:o, s:s, s:I}", "name", n->name, "dtype",
                                              tp_dtype_name(n->dtype), "shape", int_array(n->ndim, n->shape),
                                              "placement", tp_placement_str(n->placement, pl, sizeof pl), "bytes",
                                              (json_int_t)tp_node_bytes(n)));
    }
    return json_pack("{s:I, s:I, s:o}", "slots", (json_int_t)g->state_slots, "bytes", (json_int_t)states_bytes(g),
                     "tensors", list);
}

static int64_t arenas_total(const int64_t *a)
{
    int64_t t = 0;
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        t += a[k];
    return t;
}

/* The shared pool: the largest arena of each kind over the buckets; sum:
 * what one set of arenas per bucket would take. */
static void pool_of(const tp_report_opts *o, int64_t pool[TP_MEM_KINDS], int64_t *sum)
{
    *sum = 0;
    for (int k = 0; k < TP_MEM_KINDS; k++)
        pool[k] = 0;
    for (int b = 0; b < o->n_buckets; b++) {
        for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
            pool[k] = o->bucket_arena[b][k] > pool[k] ? o->bucket_arena[b][k] : pool[k];
        *sum += arenas_total(o->bucket_arena[b]);
    }
}

static json_t *arenas_obj(const int64_t *a)
{
    json_t *o = json_object();
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        json_object_set_new(o, tp_mem_kind_name((tp_mem_kind)k), json_integer(a[k]));
    json_object_set_new(o, "total", json_integer(arenas_total(a)));
    return o;
}

/* {"buckets": [{"batch", arenas..., "total"}], "shared_pool": {arenas...,
 * "total"}, "sum_over_buckets"}: bytes per rank. */
static json_t *arenas_json(const tp_report_opts *o)
{
    int64_t pool[TP_MEM_KINDS], sum;
    pool_of(o, pool, &sum);
    json_t *buckets = json_array();
    for (int b = 0; b < o->n_buckets; b++) {
        json_t *one = arenas_obj(o->bucket_arena[b]);
        json_object_set_new(one, "batch", json_integer(o->bucket[b]));
        json_array_append_new(buckets, one);
    }
    return json_pack("{s:o, s:o, s:I}", "buckets", buckets, "shared_pool", arenas_obj(pool), "sum_over_buckets",
                     (json_int_t)sum);
}

static void print_arenas(const tp_report_opts *o, FILE *out)
{
    int64_t pool[TP_MEM_KINDS], sum;
    pool_of(o, pool, &sum);
    fprintf(out, "arenas per rank by bucket (bytes; every bucket's executable binds into one shared pool):\n"
                 "  %-12s %12s %12s %12s %12s %12s\n", "bucket", "regular", "symmetric", "input", "output", "total");
    for (int b = 0; b < o->n_buckets; b++) {
        const int64_t *a = o->bucket_arena[b];
        fprintf(out, "  %-12lld %12lld %12lld %12lld %12lld %12lld\n", (long long)o->bucket[b],
                (long long)a[TP_MEM_REGULAR], (long long)a[TP_MEM_SYMMETRIC], (long long)a[TP_MEM_INPUT],
                (long long)a[TP_MEM_OUTPUT], (long long)arenas_total(a));
    }
    int64_t largest = o->n_buckets ? arenas_total(o->bucket_arena[o->n_buckets - 1]) : 0;
    fprintf(out, "  %-12s %12lld %12lld %12lld %12lld %12lld\n", "shared pool", (long long)pool[TP_MEM_REGULAR],
            (long long)pool[TP_MEM_SYMMETRIC], (long long)pool[TP_MEM_INPUT], (long long)pool[TP_MEM_OUTPUT],
            (long long)arenas_total(pool));
    fprintf(out, "  total: %lld B per rank for all %d buckets (%.2fx the largest bucket's %lld B; one set of arenas "
                 "per bucket would take %lld B)%s\n",
            (long long)arenas_total(pool), o->n_buckets, largest ? (double)arenas_total(pool) / (double)largest : 0.0,
            (long long)largest, (long long)sum,
            o->padding ? "; exact batches past the largest bucket grow the pool" : "");
}

static json_t *report_json(const tp_graph *g, const tp_plan *p, const tp_report_opts *o)
{
    json_t *nodes = json_array(), *passes = json_array(), *hoisted;
    for (int i = 0; i < g->n_nodes; i++)
        json_array_append_new(nodes, node_json(g, p, i));
    for (int i = 0; o->passes && i < TP_PASS_COUNT; i++)
        json_array_append_new(passes, json_pack("{s:s, s:b, s:i}", "name", o->passes[i].name, "ran",
                                                o->passes[i].ran, "changed", o->passes[i].changed));
    json_t *parts = partitions_json(g, p, &hoisted);
    json_t *root = json_pack("{s:s, s:i, s:I, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "name", g->name, "world_size",
                     g->world_size, "batch", (json_int_t)g->batch, "batching",
                     o->padding ? o->padding : "padded into buckets", "nodes", nodes, "passes", passes, "collectives",
                     collectives_json(g), "partitions", parts, "hoisted", hoisted, "input_copies",
                     input_copies_json(g, o->dma), "memory", memory_json(p));
    if (root && o->n_buckets)
        json_object_set_new(root, "arenas", arenas_json(o));
    if (root && g->n_states > 0)
        json_object_set_new(root, "states", states_json(g));
    return root;
}

static void print_nodes(const tp_graph *g, const tp_plan *p, FILE *out)
{
    fprintf(out, "%-28s %-27s %-6s %-18s %-18s %-10s %s\n", "node", "op", "dtype", "shape", "strides", "memory", "inputs");
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        char shape[96], strides[96], mem[64], ins[256] = "";
        int off = 0;
        for (int k = 0; k < n->n_inputs && off < (int)sizeof ins; k++)
            off += snprintf(ins + off, sizeof ins - (size_t)off, "%s%s", k ? ", " : "", g->nodes[n->inputs[k]].name);
        const tp_buf *b = &p->buf[i];
        if (b->kind != TP_MEM_NONE)
            snprintf(mem, sizeof mem, "%s@%lld", tp_mem_kind_name(b->kind), (long long)b->offset);
        else if (n->op == TP_OP_PARAM)
            snprintf(mem, sizeof mem, "param");
        else if (n->op == TP_OP_STATE)
            snprintf(mem, sizeof mem, "state");
        else
            snprintf(mem, sizeof mem, "view:%s%s", g->nodes[n->storage].name, tp_node_contiguous(n) ? "" : "*");
        fprintf(out, "%-28s %-27s %-6s %-18s %-18s %-10s %s%s\n", n->name, tp_op_name(n->op), tp_dtype_name(n->dtype),
                tp_shape_str(shape, sizeof shape, n->ndim, n->shape), tp_shape_str(strides, sizeof strides, n->ndim, n->stride),
                mem, ins, n->fallback ? "  [fallback]" : "");
    }
}

static void print_text(const tp_graph *g, const tp_plan *p, const tp_report_opts *o, FILE *out)
{
    fprintf(out, "graph %s: world_size %d, batch %lld, %d nodes, batching: %s\n\n", g->name, g->world_size,
            (long long)g->batch, g->n_nodes, o->padding ? o->padding : "padded into buckets");
    print_nodes(g, p, out);
    fprintf(out, "\npasses:");
    for (int i = 0; o->passes && i < TP_PASS_COUNT; i++)
        fprintf(out, " %s=%s", o->passes[i].name, o->passes[i].ran ? (o->passes[i].changed ? "changed" : "no-op") : "off");
    fprintf(out, "\ncollectives:\n");
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        tp_op_kind k = tp_op_kind_of(n->op);
        if (k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED)
            fprintf(out, "  %-28s %-27s %-9s %lld bytes\n", n->name, tp_op_name(n->op), tp_algo_name(n->attrs.algo),
                    (long long)tp_node_bytes(&g->nodes[tp_comm_input(n)]));
    }
    fprintf(out, "partitions:\n");
    for (int i = 0; i < p->n_parts; i++)
        fprintf(out, "  %d %-9s %d nodes (%s .. %s)\n", i, p->parts[i].kind == TP_PART_CAPTURED ? "captured" : "fallback",
                p->parts[i].n_nodes, g->nodes[p->parts[i].nodes[0]].name,
                g->nodes[p->parts[i].nodes[p->parts[i].n_nodes - 1]].name);
    for (int i = 0; i < g->n_nodes; i++)
        if (p->buf[i].hoisted)
            fprintf(out, "hoisted: %s (%lld bytes, partition %d)\n", g->nodes[i].name, (long long)p->buf[i].bytes, p->part_of[i]);
    for (int i = 0; i < g->n_inputs; i++)
        fprintf(out, "input copy: %s -> %s slot (%s)\n", g->nodes[g->input_ids[i]].name,
                g->nodes[g->input_ids[i]].symmetric ? "symmetric" : "regular", o->dma ? "dma" : "memcpy");
    fprintf(out, "memory per rank: regular %lld B in %d buffers, symmetric %lld B in %d buffers, inputs %lld B, outputs %lld B\n"
                 "  intermediates: planned %lld B vs naive %lld B; symmetric offsets equal on every rank: %s\n",
            (long long)p->arena_bytes[TP_MEM_REGULAR], p->n_buffers[TP_MEM_REGULAR], (long long)p->arena_bytes[TP_MEM_SYMMETRIC],
            p->n_buffers[TP_MEM_SYMMETRIC], (long long)p->arena_bytes[TP_MEM_INPUT], (long long)p->arena_bytes[TP_MEM_OUTPUT],
            (long long)p->peak_bytes, (long long)p->naive_bytes, p->symmetric_offsets_equal ? "yes" : "NO");
    if (g->n_states > 0)
        fprintf(out, "states per rank: %lld B in %d tensors (%lld slots), resident beside the weights\n",
                (long long)states_bytes(g), g->n_states, (long long)g->state_slots);
    if (o->n_buckets)
        print_arenas(o, out);
}

tp_status tp_plan_report(tp_graph *g, const tp_report_opts *o, FILE *out, tp_err *err)
{
    tp_plan *p;
    tp_status st = tp_graph_infer(g, o->batch, err);
    if (st == TP_OK)
        st = tp_plan_build(g, &p, err);
    if (st != TP_OK)
        return st;
    if (o->json) {
        json_t *root = report_json(g, p, o);
        char *s = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
        json_decref(root);
        if (!s)
            st = tp_fail(err, TP_NOMEM, "plan: out of memory");
        else
            fprintf(out, "%s\n", s);
        free(s);
    } else {
        print_text(g, p, o, out);
    }
    tp_plan_free(p);
    return st;
}
