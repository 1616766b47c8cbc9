/* widen_activations — on a backend whose caps say f32_activations (cpu),
 * an FP16/BF16 graph computes in FP32 between its narrow edges: every
 * narrow node becomes FP32, and
 *  - params read by those nodes are loaded as FP32 (tp_node.stored keeps
 *    the file's dtype; matmul weights become FP32 panels either way);
 *  - a narrow graph input, or a node that stays narrow, is read through one
 *    shared `cast` to FP32;
 *  - an output keeps its dtype: a `cast` back takes the output's name;
 *  - a `cast` to FP16/BF16 inside the graph (exports round around norms)
 *    now casts to FP32.
 * A node stays narrow when every float input is a narrow source that stays
 * narrow (an embedding of its table, a position table's gather: nothing is
 * lost by computing them as written), a view when what it views stays,
 * and kv_attention stays narrow with its caches, its FP32 inputs cast to
 * the caches' dtype.
 *
 * Why: a CPU has no FP16 arithmetic to gain from, so every narrow op
 * widened its inputs and rounded its result; that was 8-14% of an FP16
 * model's time, and onnxruntime's CPU provider computes FP16 models in
 * FP32 between casts too. The results are FP32's: more precise than
 * rounding after every node, not bit-equal to it (--disable-pass
 * widen_activations gives that back). */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

static int is_narrow(tp_dtype t) { return t == TP_F16 || t == TP_BF16; }

static int is_source(const tp_node *n) { return tp_op_kind_of(n->op) == TP_KIND_SOURCE; }

/* Whether node i, narrow, stays narrow given the nodes and params chosen
 * to widen so far (wide[]): kv_attention; a view of a narrow node that
 * stays (a view costs nothing, its readers cast what they read); or every
 * float input a narrow source not widened (and at least one). */
static int stays_narrow(const tp_graph *g, int i, const unsigned char *wide)
{
    const tp_node *n = &g->nodes[i];
    if (n->op == TP_OP_KV_ATTENTION)
        return 1;
    if (tp_op_kind_of(n->op) == TP_KIND_VIEW)
        return !wide[n->inputs[0]];
    int floats = 0;
    for (int k = 0; k < n->n_inputs; k++) {
        const tp_node *in = &g->nodes[n->inputs[k]];
        if (!tp_dtype_is_float(in->dtype))
            continue;
        if (!is_source(in) || !is_narrow(in->dtype) || wide[n->inputs[k]])
            return 0;
        floats++;
    }
    return floats > 0;
}

/* Chooses, on the unedited graph, the narrow nodes that become FP32
 * (widen[i]) and the params loaded as FP32 (widen[p]): a param read by a
 * widened node is widened, which can widen the nodes that read it in turn
 * (GPT-2's tied table: its head widens it, so its embedding follows). */
static void choose(const tp_graph *g, unsigned char *widen)
{
    for (int changed = 1; changed;) {
        changed = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const tp_node *n = &g->nodes[i];
            if (is_source(n) || !is_narrow(n->dtype) || widen[i] || stays_narrow(g, i, widen))
                continue;
            widen[i] = 1;
            changed = 1;
            for (int k = 0; k < n->n_inputs; k++) {
                const tp_node *in = &g->nodes[n->inputs[k]];
                if (in->op == TP_OP_PARAM && is_narrow(in->dtype))
                    widen[n->inputs[k]] = 1;
            }
        }
    }
}

/* The pass's bookkeeping, indexed by node and kept in step with the
 * graph's inserts: widen (choose's answer) and cast_of (the FP32 cast of a
 * narrow value, or -1). */
typedef struct {
    tp_graph *g;
    unsigned char *widen;
    int *cast_of;
} widen_ctx;

/* Inserts `value.suffix = cast(value, to)` right after value; *out is its
 * index. Indices from value + 1 on shift by one, in the graph and here. */
static tp_status insert_cast(widen_ctx *c, int value, tp_dtype to, const char *suffix, int *out, tp_err *err)
{
    tp_graph *g = c->g;
    int n = g->n_nodes;
    unsigned char *widen = realloc(c->widen, (size_t)n + 1);
    if (widen)
        c->widen = widen;
    int *cast_of = realloc(c->cast_of, sizeof *cast_of * ((size_t)n + 1));
    if (cast_of)
        c->cast_of = cast_of;
    if (!widen || !cast_of)
        return tp_fail(err, TP_NOMEM, "out of memory casting '%s'", g->nodes[value].name);
    tp_status st = tp_graph_insert_copy(g, value, TP_OP_CAST, suffix, out, err);
    if (st != TP_OK)
        return st;
    g->nodes[*out].attrs.cast_to = (int)to;
    g->nodes[*out].dtype = to;
    memmove(&c->widen[*out + 1], &c->widen[*out], (size_t)(n - *out));
    memmove(&c->cast_of[*out + 1], &c->cast_of[*out], sizeof *c->cast_of * (size_t)(n - *out));
    c->widen[*out] = 0;
    c->cast_of[*out] = -1;
    for (int i = 0; i <= n; i++)
        if (c->cast_of[i] >= *out)
            c->cast_of[i]++;
    return TP_OK;
}

/* Node *i (a widened one) reads its narrow inputs through their shared
 * FP32 casts; *i follows the inserts. */
static tp_status read_wide(widen_ctx *c, int *i, int *changed, tp_err *err)
{
    for (int k = 0; k < c->g->nodes[*i].n_inputs; k++) {
        int v = c->g->nodes[*i].inputs[k];
        if (!is_narrow(c->g->nodes[v].dtype))
            continue;
        if (c->cast_of[v] < 0) {
            int at;
            tp_status st = insert_cast(c, v, TP_F32, "f32", &at, err);
            if (st != TP_OK)
                return st;
            c->cast_of[v] = at;
            (*i)++;
            (*changed)++;
        }
        c->g->nodes[*i].inputs[k] = c->cast_of[v];
    }
    return TP_OK;
}

/* kv_attention *i reads its FP32 inputs through casts to its own dtype
 * (its caches'); *i follows the inserts. */
static tp_status read_narrow(widen_ctx *c, int *i, int *changed, tp_err *err)
{
    tp_dtype to = c->g->nodes[*i].dtype;
    for (int k = 0; k < c->g->nodes[*i].n_inputs; k++) {
        int v = c->g->nodes[*i].inputs[k], at;
        if (c->g->nodes[v].dtype != TP_F32)
            continue;
        tp_status st = insert_cast(c, v, to, tp_dtype_name(to), &at, err);
        if (st != TP_OK)
            return st;
        (*i)++;
        (*changed)++;
        c->g->nodes[*i].inputs[k] = at;
    }
    return TP_OK;
}

/* Outputs that were narrow get a cast back that takes their name (clients
 * ask for outputs by name); outputs of one node share it. */
static tp_status cast_outputs_back(widen_ctx *c, const tp_dtype *was, int *changed, tp_err *err)
{
    tp_graph *g = c->g;
    for (int o = 0; o < g->n_outputs; o++) {
        int x = g->output_ids[o];
        if (!is_narrow(was[o]) || g->nodes[x].dtype != TP_F32)
            continue;
        int at;
        tp_status st = insert_cast(c, x, was[o], "out", &at, err);
        if (st != TP_OK)
            return st;
        char *name = g->nodes[x].name;
        g->nodes[x].name = g->nodes[at].name;
        g->nodes[at].name = name;
        for (int p = o; p < g->n_outputs; p++)
            if (g->output_ids[p] == x)
                g->output_ids[p] = at;
        (*changed)++;
    }
    return TP_OK;
}

static tp_status rewrite(widen_ctx *c, int *changed, tp_err *err)
{
    tp_graph *g = c->g;
    for (int i = 0; i < g->n_nodes; i++) {
        tp_node *n = &g->nodes[i];
        tp_status st = TP_OK;
        if (n->op == TP_OP_PARAM && c->widen[i]) {
            n->stored = n->dtype;
            n->dtype = TP_F32;
            (*changed)++;
        } else if (n->op == TP_OP_KV_ATTENTION && is_narrow(n->dtype)) {
            st = read_narrow(c, &i, changed, err);
        } else if (c->widen[i]) {
            st = read_wide(c, &i, changed, err);
            n = &g->nodes[i];
            if (n->op == TP_OP_CAST)
                n->attrs.cast_to = TP_F32;
            /* every float input is FP32 now; inference at the end agrees */
            n->dtype = TP_F32;
            (*changed)++;
        }
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

tp_status tp_pass_widen_activations(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    *changed = 0;
    if (!o->f32_activations)
        return TP_OK;
    widen_ctx c = {g, calloc((size_t)g->n_nodes + 1, 1), malloc(sizeof(int) * ((size_t)g->n_nodes + 1))};
    tp_dtype *was = malloc(sizeof *was * ((size_t)g->n_outputs + 1));
    tp_status st = TP_OK;
    if (!c.widen || !c.cast_of || !was) {
        st = tp_fail(err, TP_NOMEM, "out of memory for %d nodes", g->n_nodes);
    } else {
        for (int i = 0; i < g->n_nodes; i++)
            c.cast_of[i] = -1;
        for (int k = 0; k < g->n_outputs; k++)
            was[k] = g->nodes[g->output_ids[k]].dtype;
        choose(g, c.widen);
        st = rewrite(&c, changed, err);
        if (st == TP_OK)
            st = cast_outputs_back(&c, was, changed, err);
    }
    free(c.widen);
    free(c.cast_of);
    free(was);
    return st == TP_OK ? tp_graph_infer(g, g->batch, err) : st;
}
