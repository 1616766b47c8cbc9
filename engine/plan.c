/* plan.c — builds the execution plan of one bucket: partitions, then the
 * liveness of every buffer, then one arena per memory kind. */
#include "plan.h"

#include <stdlib.h>
#include <string.h>

static int is_output_owner(const tp_graph *g, int i)
{
    for (int k = 0; k < g->n_outputs; k++)
        if (g->nodes[g->output_ids[k]].storage == i)
            return 1;
    return 0;
}

/* Kind, size and liveness of every buffer the plan owns. */
static void assign_buffers(const tp_graph *g, tp_plan *p)
{
    int end = g->n_nodes;
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        tp_buf *b = &p->buf[i];
        int pinned = is_output_owner(g, i);
        if (n->op == TP_OP_INPUT)
            b->kind = n->symmetric ? TP_MEM_SYMMETRIC : TP_MEM_INPUT;
        else if (!tp_plan_node_runs(g, i))
            continue;
        else if (n->symmetric)
            b->kind = TP_MEM_SYMMETRIC;
        else
            b->kind = pinned ? TP_MEM_OUTPUT : TP_MEM_REGULAR;
        b->bytes = tp_node_bytes(n);
        b->first = n->op == TP_OP_INPUT ? 0 : i;
        b->last = (n->op == TP_OP_INPUT || pinned) ? end : i;
        if (n->op == TP_OP_FUSED_MM_RS)
            b->ws_bytes = b->bytes * g->world_size; /* every peer's partial chunk */
    }
    /* a buffer lives until the last reader of it or of any view of it */
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_inputs; k++) {
            int owner = g->nodes[g->nodes[j].inputs[k]].storage;
            if (p->buf[owner].kind != TP_MEM_NONE && p->buf[owner].last < j)
                p->buf[owner].last = j;
        }
}

static int elementwise(tp_op op) { return (tp_op_desc_of(op)->flags & TP_OPF_ELEMENTWISE) != 0; }

/* An elementwise node may write over an input that dies with it (reads
 * element e, writes element e): same arena, same size, the input read
 * directly (not through a view) and not pinned. Saves one buffer per
 * activation (ggml-alloc does the same). */
static void choose_inplace(const tp_graph *g, tp_plan *p)
{
    for (int i = 0; i < g->n_nodes; i++) {
        p->buf[i].inplace_of = -1;
        const tp_buf *b = &p->buf[i];
        if (!elementwise(g->nodes[i].op) || b->kind == TP_MEM_NONE || b->last == g->n_nodes)
            continue;
        for (int k = 0; k < g->nodes[i].n_inputs && p->buf[i].inplace_of < 0; k++) {
            int o = g->nodes[i].inputs[k];
            const tp_buf *ob = &p->buf[o];
            if (g->nodes[o].storage == o && g->nodes[o].op != TP_OP_INPUT && ob->kind == b->kind &&
                ob->bytes == b->bytes && ob->last == i && !ob->ws_bytes)
                p->buf[i].inplace_of = o;
        }
    }
}

/* Plans one arena: pinned items (whole run) first, then intermediates by
 * liveness after them. Returns the intermediates' bytes and blocks. */
static tp_status plan_kind(const tp_graph *g, tp_plan *p, tp_mem_kind kind, int rank_check, tp_err *err)
{
    int n = g->n_nodes;
    tp_mem_item *pin = calloc((size_t)n + 1, sizeof *pin), *mid = calloc((size_t)2 * n + 1, sizeof *mid);
    int *pin_of = calloc((size_t)n + 1, sizeof(int)), *mid_of = calloc((size_t)2 * n + 1, sizeof(int));
    tp_status st = TP_OK;
    if (!pin || !mid || !pin_of || !mid_of)
        st = tp_fail(err, TP_NOMEM, "plan: out of memory");
    int np = 0, nm = 0;
    for (int i = 0; st == TP_OK && i < n; i++) {
        tp_buf *b = &p->buf[i];
        int pinned = g->nodes[i].op == TP_OP_INPUT || b->last == n;
        if (b->kind == kind && pinned) {
            pin_of[np] = i;
            pin[np++] = (tp_mem_item){b->bytes, 0, n, 0, -1};
        } else if (b->kind == kind) {
            mid_of[nm] = i;
            mid[nm++] = (tp_mem_item){b->bytes, b->first, b->last, 0, -1};
        }
        if (kind == TP_MEM_SYMMETRIC && b->ws_bytes) {
            mid_of[nm] = -1 - i; /* workspace of node i */
            mid[nm++] = (tp_mem_item){b->ws_bytes, i, i, 0, -1};
        }
    }
    /* in-place links point at item indices, not node indices */
    for (int k = 0; k < nm; k++) {
        int id = mid_of[k];
        int src = id >= 0 ? p->buf[id].inplace_of : -1;
        for (int j = 0; src >= 0 && j < nm; j++)
            if (mid_of[j] == src)
                mid[k].inplace_of = j;
    }
    int64_t pin_bytes = 0, mid_bytes = 0;
    int pin_blocks, mid_blocks = 0;
    if (st == TP_OK)
        st = tp_plan_arena(pin, np, &pin_bytes, &pin_blocks, err);
    if (st == TP_OK)
        st = tp_plan_arena(mid, nm, &mid_bytes, &mid_blocks, err);
    for (int k = 0; st == TP_OK && k < np + nm; k++) {
        int id = k < np ? pin_of[k] : mid_of[k - np];
        int64_t off = k < np ? pin[k].offset : pin_bytes + mid[k - np].offset;
        int64_t *slot = id >= 0 ? &p->buf[id].offset : &p->buf[-1 - id].ws_offset;
        if (rank_check && *slot != off)
            p->symmetric_offsets_equal = 0;
        *slot = off;
        if (k >= np)
            p->naive_bytes += rank_check ? 0 : mid[k - np].bytes;
    }
    if (st == TP_OK && !rank_check) {
        p->arena_bytes[kind] = pin_bytes + mid_bytes;
        p->n_buffers[kind] = mid_blocks;
        p->peak_bytes += mid_bytes;
    }
    free(pin);
    free(mid);
    free(pin_of);
    free(mid_of);
    return st;
}

tp_status tp_plan_build(const tp_graph *g, tp_plan **out, tp_err *err)
{
    tp_plan *p = calloc(1, sizeof *p);
    if (!p)
        return tp_fail(err, TP_NOMEM, "plan: out of memory");
    p->n_nodes = g->n_nodes;
    p->buf = calloc((size_t)g->n_nodes + 1, sizeof *p->buf);
    p->part_of = calloc((size_t)g->n_nodes + 1, sizeof *p->part_of);
    p->symmetric_offsets_equal = 1;
    tp_status st = p->buf && p->part_of ? tp_plan_partition(g, p, err) : tp_fail(err, TP_NOMEM, "plan: out of memory");
    if (st == TP_OK) {
        assign_buffers(g, p);
        choose_inplace(g, p);
    }
    for (int k = TP_MEM_REGULAR; st == TP_OK && k < TP_MEM_KINDS; k++)
        st = plan_kind(g, p, (tp_mem_kind)k, 0, err);
    /* The symmetric contract: planning again as every other rank must give
     * the same offsets (the plan may use nothing rank-specific). */
    for (int r = 1; st == TP_OK && r < g->world_size; r++)
        st = plan_kind(g, p, TP_MEM_SYMMETRIC, 1, err);
    if (st != TP_OK) {
        tp_plan_free(p);
        return st;
    }
    *out = p;
    return TP_OK;
}

void tp_plan_free(tp_plan *p)
{
    if (!p)
        return;
    for (int i = 0; i < p->n_parts; i++)
        free(p->parts[i].nodes);
    free(p->parts);
    free(p->buf);
    free(p->part_of);
    free(p);
}

const char *tp_mem_kind_name(tp_mem_kind k)
{
    static const char *names[TP_MEM_KINDS] = {"none", "regular", "symmetric", "input", "output"};
    return k < TP_MEM_KINDS ? names[k] : "?";
}
