/* loader.c — tpgraph v1 JSON -> tp_graph, with every validation of the
 * format's "Errors a loader must name" list. Each message starts with the
 * file and names the node (or input/param/output) and the reason. */
#include "graph.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked_math.h"
#include "safetensors.h"

typedef struct {
    const char *file;
    tp_err *err;
} load_ctx;

static tp_status lfail_prefix(load_ctx *L, tp_status st)
{
    tp_err_prefix(L->err, "%s: ", L->file);
    return st;
}
#define LFAIL(L, st, ...) lfail_prefix((L), tp_fail((L)->err, st, __VA_ARGS__))

static char *dupstr(const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

static tp_status get_int(load_ctx *L, json_t *v, const char *what, const char *key, int64_t *out)
{
    if (!json_is_integer(v))
        return LFAIL(L, TP_INVALID, "%s: attr '%s' must be an integer", what, key);
    *out = json_integer_value(v);
    return TP_OK;
}

static tp_status get_dim_attr(load_ctx *L, json_t *v, const char *what, const char *key, int *out)
{
    int64_t x = 0;
    tp_status st = get_int(L, v, what, key, &x);
    if (st != TP_OK)
        return st;
    if (x < -TP_MAX_DIMS || x >= TP_MAX_DIMS)
        return LFAIL(L, TP_INVALID, "%s: attr '%s' = %lld is not a valid dim", what, key, (long long)x);
    *out = (int)x;
    return TP_OK;
}

static tp_status get_bool(load_ctx *L, json_t *v, const char *what, const char *key, int *out)
{
    if (!json_is_boolean(v))
        return LFAIL(L, TP_INVALID, "%s: attr '%s' must be true or false", what, key);
    *out = json_is_true(v);
    return TP_OK;
}

static tp_status get_float(load_ctx *L, json_t *v, const char *what, const char *key, float *out)
{
    if (!json_is_number(v))
        return LFAIL(L, TP_INVALID, "%s: attr '%s' must be a number", what, key);
    *out = (float)json_number_value(v);
    return TP_OK;
}

static tp_status get_int_list(load_ctx *L, json_t *v, const char *what, const char *key,
                              int64_t *out, int *n)
{
    if (!json_is_array(v) || json_array_size(v) > TP_MAX_DIMS)
        return LFAIL(L, TP_INVALID, "%s: attr '%s' must be an array of at most %d integers", what,
                     key, TP_MAX_DIMS);
    *n = (int)json_array_size(v);
    for (int i = 0; i < *n; i++) {
        json_t *e = json_array_get(v, (size_t)i);
        if (!json_is_integer(e))
            return LFAIL(L, TP_INVALID, "%s: attr '%s'[%d] must be an integer", what, key, i);
        out[i] = json_integer_value(e);
    }
    return TP_OK;
}

/* A TP_ATTR_CHOICE value: the index of its word in spec->choices. */
static tp_status get_choice(load_ctx *L, json_t *v, const char *what, const tp_attr_spec *spec, int *out)
{
    const char *s = json_string_value(v);
    int idx = 0;
    char list[160] = "";
    size_t used = 0;
    for (const char *p = spec->choices; *p; idx++) {
        size_t len = strcspn(p, " ");
        if (s && strlen(s) == len && strncmp(s, p, len) == 0) {
            *out = idx;
            return TP_OK;
        }
        const char *next = p + len + (p[len] == ' ');
        used += (size_t)snprintf(list + used, sizeof list - used, "%s\"%.*s\"",
                                 idx == 0 ? "" : *next ? ", " : " or ", (int)len, p);
        if (used >= sizeof list)
            used = sizeof list - 1;
        p = next;
    }
    return LFAIL(L, TP_INVALID, "%s: attr '%s' must be %s", what, spec->key, list);
}

#define ATTR_AT(a, off, type) ((type *)((char *)(a) + (off)))

/* One attr, by its spec's type, into its tp_attrs field. */
static tp_status parse_attr(load_ctx *L, tp_attrs *a, const char *what, const tp_attr_spec *spec, json_t *v)
{
    const char *key = spec->key;
    int64_t x = 0, list[TP_MAX_DIMS];
    tp_status st = TP_OK;
    if (spec->present != TP_ATTR_NO_FIELD)
        *ATTR_AT(a, spec->present, int) = 1;
    switch (spec->type) {
    case TP_ATTR_DIM:
        return get_dim_attr(L, v, what, key, ATTR_AT(a, spec->field, int));
    case TP_ATTR_INT:
        return get_int(L, v, what, key, ATTR_AT(a, spec->field, int64_t));
    case TP_ATTR_RANK:
        st = get_int(L, v, what, key, &x);
        if (st == TP_OK && (x < 0 || x > INT_MAX))
            return LFAIL(L, TP_INVALID, "%s: attr '%s' = %lld is not a rank", what, key, (long long)x);
        *ATTR_AT(a, spec->field, int) = (int)x;
        return st;
    case TP_ATTR_SHAPE:
        return get_int_list(L, v, what, key, ATTR_AT(a, spec->field, int64_t), ATTR_AT(a, spec->count, int));
    case TP_ATTR_DIMS: {
        int *n = ATTR_AT(a, spec->count, int);
        st = get_int_list(L, v, what, key, list, n);
        for (int i = 0; st == TP_OK && i < *n; i++)
            ATTR_AT(a, spec->field, int)[i] = (int)list[i];
        return st;
    }
    case TP_ATTR_FLOAT:
        return get_float(L, v, what, key, ATTR_AT(a, spec->field, float));
    case TP_ATTR_BOOL:
        return get_bool(L, v, what, key, ATTR_AT(a, spec->field, int));
    case TP_ATTR_CHOICE:
        return get_choice(L, v, what, spec, ATTR_AT(a, spec->field, int));
    }
    return LFAIL(L, TP_INTERNAL, "%s: attr '%s' has no type", what, key);
}

/* Defaults of absent scalar attrs (lists are always required). */
static void set_default(tp_attrs *a, const tp_attr_spec *spec)
{
    switch (spec->type) {
    case TP_ATTR_DIM:
    case TP_ATTR_RANK:
    case TP_ATTR_BOOL:
    case TP_ATTR_CHOICE:
        *ATTR_AT(a, spec->field, int) = (int)spec->fallback;
        break;
    case TP_ATTR_INT:
        *ATTR_AT(a, spec->field, int64_t) = (int64_t)spec->fallback;
        break;
    case TP_ATTR_FLOAT:
        *ATTR_AT(a, spec->field, float) = (float)spec->fallback;
        break;
    case TP_ATTR_SHAPE:
    case TP_ATTR_DIMS:
        break;
    }
}

static const tp_attr_spec *find_attr(const tp_attr_spec *specs, const char *key)
{
    for (; specs->key; specs++)
        if (strcmp(specs->key, key) == 0)
            return specs;
    return NULL;
}

static tp_status parse_attrs(load_ctx *L, tp_node *n, json_t *attrs, const char *what)
{
    const tp_attr_spec *specs = tp_op_desc_of(n->op)->attrs;
    if (attrs && !json_is_object(attrs))
        return LFAIL(L, TP_INVALID, "%s: 'attrs' must be an object", what);
    const char *key;
    json_t *v;
    json_object_foreach(attrs, key, v) {
        if (!find_attr(specs, key))
            return LFAIL(L, TP_INVALID, "%s: unknown attr '%s' for op '%s'", what, key,
                         tp_op_name(n->op));
    }
    for (const tp_attr_spec *spec = specs; spec->key; spec++) {
        json_t *given = json_object_get(attrs, spec->key);
        if (!given && spec->required)
            return LFAIL(L, TP_INVALID, "%s: op '%s' needs attr '%s'", what, tp_op_name(n->op), spec->key);
        if (!given) {
            set_default(&n->attrs, spec);
            continue;
        }
        tp_status st = parse_attr(L, &n->attrs, what, spec, given);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

/* "replicate" | "shard(k)"; k is checked against ndim (negative from the end). */
static tp_status parse_placement(load_ctx *L, json_t *v, const char *what, int ndim, tp_placement *p)
{
    const char *s = json_string_value(v);
    if (!v) {
        p->kind = TP_PLACE_REPLICATE;
        return TP_OK;
    }
    if (s && strcmp(s, "replicate") == 0) {
        p->kind = TP_PLACE_REPLICATE;
        return TP_OK;
    }
    int k, used = 0;
    if (s && sscanf(s, "shard(%d)%n", &k, &used) == 1 && used == (int)strlen(s)) {
        if (ndim >= 0 && (k < -ndim || k >= ndim))
            return LFAIL(L, TP_INVALID, "%s: placement '%s' names dim %d of a %d-d tensor", what, s,
                         k, ndim);
        p->kind = TP_PLACE_SHARD;
        p->dim = k < 0 ? k + ndim : k;
        return TP_OK;
    }
    return LFAIL(L, TP_INVALID, "%s: unknown placement '%s' (expected \"replicate\" or \"shard(k)\")",
                 what, s ? s : "(not a string)");
}

static int add_name_check(load_ctx *L, tp_graph *g, const char *name, const char *what)
{
    if (tp_graph_find(g, name) >= 0) {
        LFAIL(L, TP_INVALID, "%s: name '%s' is used twice", what, name);
        return -1;
    }
    return 0;
}

static const char *source_kind(tp_op op)
{
    return op == TP_OP_INPUT ? "input" : op == TP_OP_PARAM ? "param" : "state";
}

/* shape[i] of a source: an integer, or the batch "B" at dim 0 of an input,
 * or the slot count "S" at dim 0 of a state. */
static tp_status parse_dim(load_ctx *L, tp_node *n, json_t *d, int i, const char *what)
{
    const char *sym = json_is_string(d) ? json_string_value(d) : NULL;
    if (i == 0 && sym && n->op == TP_OP_INPUT && strcmp(sym, "B") == 0) {
        n->batched = 1;
        n->gshape[0] = 1;
    } else if (i == 0 && sym && n->op == TP_OP_STATE && strcmp(sym, "S") == 0) {
        n->slotted = 1;
        n->gshape[0] = 1;
    } else if (json_is_integer(d) && json_integer_value(d) >= 0) {
        n->gshape[i] = json_integer_value(d);
    } else {
        return LFAIL(L, TP_INVALID, "%s: shape[%d] must be a non-negative integer%s", what, i,
                     i > 0 ? "" : n->op == TP_OP_INPUT ? " or \"B\"" : n->op == TP_OP_STATE ? " or \"S\"" : "");
    }
    return TP_OK;
}

/* Common part of inputs[], params[] and states[] entries. */
static tp_status parse_source(load_ctx *L, tp_graph *g, json_t *obj, tp_op op, int idx)
{
    const char *kind = source_kind(op);
    char what[256];
    snprintf(what, sizeof what, "%ss[%d]", kind, idx);
    if (!json_is_object(obj))
        return LFAIL(L, TP_INVALID, "%s: must be an object", what);
    const char *name = json_string_value(json_object_get(obj, "name"));
    if (!name || !*name)
        return LFAIL(L, TP_INVALID, "%s: missing 'name'", what);
    snprintf(what, sizeof what, "%s '%s'", kind, name);
    if (add_name_check(L, g, name, what))
        return TP_INVALID;
    tp_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->storage = g->n_nodes;
    if (!(n->name = dupstr(name)))
        return LFAIL(L, TP_NOMEM, "%s: out of memory", what);
    g->n_nodes++;
    const char *dt = json_string_value(json_object_get(obj, "datatype"));
    if (!dt || tp_dtype_from_name(dt, &n->dtype) != 0)
        return LFAIL(L, TP_INVALID, "%s: unknown datatype '%s' (expected FP32, FP16, BF16, INT32 or INT64)",
                     what, dt ? dt : "(missing)");
    n->stored = n->dtype;
    json_t *shape = json_object_get(obj, "shape");
    if (!json_is_array(shape) || json_array_size(shape) > TP_MAX_DIMS)
        return LFAIL(L, TP_INVALID, "%s: 'shape' must be an array of at most %d dims", what, TP_MAX_DIMS);
    n->g_ndim = (int)json_array_size(shape);
    for (int i = 0; i < n->g_ndim; i++) {
        tp_status st = parse_dim(L, n, json_array_get(shape, (size_t)i), i, what);
        if (st != TP_OK)
            return st;
    }
    if (tp_shape_bounded(n->g_ndim, n->gshape) != 0)
        return LFAIL(L, TP_INVALID, "%s: 'shape' has more than 2^48 elements", what);
    tp_status st = parse_placement(L, json_object_get(obj, "placement"), what, n->g_ndim, &n->placement);
    if (st != TP_OK)
        return st;
    if (n->slotted && n->placement.kind == TP_PLACE_SHARD && n->placement.dim == 0)
        return LFAIL(L, TP_INVALID, "%s: shard(0) would split the slot dim \"S\" (shard another dim)", what);
    if (n->placement.kind == TP_PLACE_SHARD && !(n->batched && n->placement.dim == 0) &&
        n->gshape[n->placement.dim] % g->world_size != 0)
        return LFAIL(L, TP_INVALID, "%s: shard(%d) of dim size %lld is not divisible by world_size %d",
                     what, n->placement.dim, (long long)n->gshape[n->placement.dim], g->world_size);
    if (op == TP_OP_PARAM) {
        json_t *t = json_object_get(obj, "tensor");
        if (t && !json_is_string(t))
            return LFAIL(L, TP_INVALID, "%s: 'tensor' must be a string", what);
        if (!(n->tensor_key = dupstr(t ? json_string_value(t) : name)))
            return LFAIL(L, TP_NOMEM, "%s: out of memory", what);
    }
    return TP_OK;
}

static tp_status parse_node(load_ctx *L, tp_graph *g, json_t *obj, int idx)
{
    char what[256];
    snprintf(what, sizeof what, "nodes[%d]", idx);
    if (!json_is_object(obj))
        return LFAIL(L, TP_INVALID, "%s: must be an object", what);
    const char *name = json_string_value(json_object_get(obj, "name"));
    if (!name || !*name)
        return LFAIL(L, TP_INVALID, "%s: missing 'name'", what);
    snprintf(what, sizeof what, "node '%s'", name);
    if (add_name_check(L, g, name, what))
        return TP_INVALID;
    const char *opname = json_string_value(json_object_get(obj, "op"));
    tp_op op;
    if (!opname || tp_op_from_name(opname, &op) != 0)
        return LFAIL(L, TP_INVALID, "%s: unknown op '%s'", what, opname ? opname : "(missing)");
    json_t *ins = json_object_get(obj, "inputs");
    if (!json_is_array(ins))
        return LFAIL(L, TP_INVALID, "%s: 'inputs' must be an array of names", what);
    int nin = (int)json_array_size(ins);
    if (nin < tp_op_min_inputs(op) || nin > tp_op_max_inputs(op))
        return LFAIL(L, TP_INVALID, "%s: op '%s' takes %d%s%d inputs, got %d", what, opname,
                     tp_op_min_inputs(op), tp_op_min_inputs(op) == tp_op_max_inputs(op) ? "" : "..",
                     tp_op_min_inputs(op) == tp_op_max_inputs(op) ? 0 : tp_op_max_inputs(op), nin);
    tp_node *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->storage = g->n_nodes;
    n->name = dupstr(name);
    n->inputs = calloc((size_t)nin, sizeof *n->inputs);
    g->n_nodes++;
    if (!n->name || !n->inputs)
        return LFAIL(L, TP_NOMEM, "%s: out of memory", what);
    n->n_inputs = nin;
    for (int i = 0; i < nin; i++) {
        const char *in = json_string_value(json_array_get(ins, (size_t)i));
        int id = in ? tp_graph_find(g, in) : -1;
        if (id < 0 || id == g->n_nodes - 1)
            return LFAIL(L, TP_INVALID, "%s: input '%s' is not defined before this node", what,
                         in ? in : "(not a string)");
        n->inputs[i] = id;
    }
    json_t *fb = json_object_get(obj, "fallback");
    if (fb && !json_is_boolean(fb))
        return LFAIL(L, TP_INVALID, "%s: 'fallback' must be true or false", what);
    n->fallback = fb && json_is_true(fb);
    return parse_attrs(L, n, json_object_get(obj, "attrs"), what);
}

static tp_status parse_outputs(load_ctx *L, tp_graph *g, json_t *outs)
{
    if (!json_is_array(outs) || json_array_size(outs) == 0)
        return LFAIL(L, TP_INVALID, "'outputs' must be a non-empty array");
    g->n_outputs = (int)json_array_size(outs);
    g->output_ids = calloc((size_t)g->n_outputs, sizeof *g->output_ids);
    g->output_place = calloc((size_t)g->n_outputs, sizeof *g->output_place);
    if (!g->output_ids || !g->output_place)
        return LFAIL(L, TP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_outputs; i++) {
        json_t *o = json_array_get(outs, (size_t)i);
        const char *name = json_string_value(json_object_get(o, "name"));
        int id = name ? tp_graph_find(g, name) : -1;
        if (id < 0 || g->nodes[id].op == TP_OP_PARAM || g->nodes[id].op == TP_OP_STATE)
            return LFAIL(L, TP_INVALID, "outputs[%d]: '%s' names no node or input", i,
                         name ? name : "(missing name)");
        for (int j = 0; j < i; j++)
            if (g->output_ids[j] == id)
                return LFAIL(L, TP_INVALID, "outputs[%d]: name '%s' is used twice", i, name);
        g->output_ids[i] = id;
        char what[256];
        snprintf(what, sizeof what, "output '%s'", name);
        tp_status st = parse_placement(L, json_object_get(o, "placement"), what, -1, &g->output_place[i]);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

static tp_status parse_header(load_ctx *L, tp_graph *g, json_t *root)
{
    if (!json_is_object(root))
        return LFAIL(L, TP_PARSE, "top level must be a JSON object");
    const char *fmt = json_string_value(json_object_get(root, "format"));
    if (!fmt || strcmp(fmt, "tpgraph") != 0)
        return LFAIL(L, TP_INVALID, "unknown format '%s' (expected \"tpgraph\")", fmt ? fmt : "(missing)");
    json_t *ver = json_object_get(root, "version");
    if (!json_is_integer(ver) || json_integer_value(ver) != 1)
        return LFAIL(L, TP_INVALID, "unsupported version %s (this loader reads tpgraph version 1)",
                     json_is_integer(ver) ? "other than 1" : "(missing or not an integer)");
    const char *name = json_string_value(json_object_get(root, "name"));
    if (!name || !*name)
        return LFAIL(L, TP_INVALID, "missing 'name'");
    json_t *ws = json_object_get(root, "world_size");
    if (!json_is_integer(ws) || json_integer_value(ws) < 1 || json_integer_value(ws) > 1024)
        return LFAIL(L, TP_INVALID, "'world_size' must be an integer in 1..1024");
    g->world_size = (int)json_integer_value(ws);
    if (!(g->name = dupstr(name)))
        return LFAIL(L, TP_NOMEM, "out of memory");
    return TP_OK;
}

static tp_status parse_lists(load_ctx *L, tp_graph *g, json_t *root)
{
    json_t *inputs = json_object_get(root, "inputs"), *params = json_object_get(root, "params");
    json_t *states = json_object_get(root, "states"), *nodes = json_object_get(root, "nodes");
    if (!json_is_array(inputs))
        return LFAIL(L, TP_INVALID, "'inputs' must be an array");
    if (params && !json_is_array(params))
        return LFAIL(L, TP_INVALID, "'params' must be an array");
    if (states && !json_is_array(states))
        return LFAIL(L, TP_INVALID, "'states' must be an array");
    if (!json_is_array(nodes))
        return LFAIL(L, TP_INVALID, "'nodes' must be an array");
    size_t total = json_array_size(inputs) + json_array_size(params) + json_array_size(states) +
                   json_array_size(nodes);
    g->nodes = calloc(total ? total : 1, sizeof *g->nodes);
    g->input_ids = calloc(json_array_size(inputs) + 1, sizeof(int));
    g->param_ids = calloc(json_array_size(params) + 1, sizeof(int));
    g->state_ids = calloc(json_array_size(states) + 1, sizeof(int));
    if (!g->nodes || !g->input_ids || !g->param_ids || !g->state_ids)
        return LFAIL(L, TP_NOMEM, "out of memory");
    tp_status st = TP_OK;
    for (size_t i = 0; st == TP_OK && i < json_array_size(inputs); i++) {
        g->input_ids[g->n_inputs++] = g->n_nodes;
        st = parse_source(L, g, json_array_get(inputs, i), TP_OP_INPUT, (int)i);
    }
    for (size_t i = 0; st == TP_OK && i < json_array_size(params); i++) {
        g->param_ids[g->n_params++] = g->n_nodes;
        st = parse_source(L, g, json_array_get(params, i), TP_OP_PARAM, (int)i);
    }
    for (size_t i = 0; st == TP_OK && i < json_array_size(states); i++) {
        g->state_ids[g->n_states++] = g->n_nodes;
        st = parse_source(L, g, json_array_get(states, i), TP_OP_STATE, (int)i);
    }
    for (size_t i = 0; st == TP_OK && i < json_array_size(nodes); i++)
        st = parse_node(L, g, json_array_get(nodes, i), (int)i);
    if (st == TP_OK)
        st = parse_outputs(L, g, json_object_get(root, "outputs"));
    return st;
}

/* A state is written by kv_attention and read by nothing else (its k_cache
 * or v_cache, inputs 3 and 4): any other reader would see a cache the
 * kernels rewrite under it, and a state nobody writes is a mistake. */
static tp_status check_state_uses(load_ctx *L, tp_graph *g)
{
    for (int s = 0; s < g->n_states; s++) {
        int id = g->state_ids[s], written = 0;
        for (int i = id + 1; i < g->n_nodes; i++) {
            const tp_node *n = &g->nodes[i];
            for (int k = 0; k < n->n_inputs; k++) {
                if (n->inputs[k] != id)
                    continue;
                if (n->op != TP_OP_KV_ATTENTION || (k != 3 && k != 4))
                    return LFAIL(L, TP_INVALID, "state '%s': node '%s' (%s) reads it as input %d; a state is only "
                                 "the k_cache or v_cache of kv_attention", g->nodes[id].name, n->name,
                                 tp_op_name(n->op), k);
                written = 1;
            }
        }
        if (!written)
            return LFAIL(L, TP_INVALID, "state '%s': no kv_attention writes it", g->nodes[id].name);
    }
    return TP_OK;
}

static tp_status gen_name(load_ctx *L, json_t *gen, const char *key, char **out)
{
    const char *s = json_string_value(json_object_get(gen, key));
    if (!s || !*s)
        return LFAIL(L, TP_INVALID, "generate: '%s' must name a graph %s", key,
                     strcmp(key, "next_token") == 0 ? "output" : "input");
    return (*out = dupstr(s)) ? TP_OK : LFAIL(L, TP_NOMEM, "out of memory");
}

static tp_status gen_count(load_ctx *L, json_t *gen, const char *key, int64_t *out)
{
    json_t *v = json_object_get(gen, key);
    if (!json_is_integer(v) || json_integer_value(v) < 1)
        return LFAIL(L, TP_INVALID, "generate: '%s' must be a positive integer", key);
    *out = json_integer_value(v);
    return TP_OK;
}

/* The optional "generate" block: names and counts only; what they name is
 * checked once shapes are known (check_generate). */
static tp_status parse_generate(load_ctx *L, tp_graph *g, json_t *root)
{
    static const char *const keys[] = {"input_ids", "positions", "slots", "next_token", "max_seq_len",
                                       "vocab_size", "logit_rows", NULL};
    json_t *gen = json_object_get(root, "generate");
    if (!gen)
        return TP_OK;
    if (!json_is_object(gen))
        return LFAIL(L, TP_INVALID, "'generate' must be an object");
    const char *key;
    json_t *v;
    json_object_foreach(gen, key, v) {
        int known = 0;
        for (int k = 0; keys[k]; k++)
            known |= strcmp(keys[k], key) == 0;
        if (!known)
            return LFAIL(L, TP_INVALID, "generate: unknown key '%s' (expected input_ids, positions, slots, "
                         "next_token, max_seq_len, vocab_size, logit_rows)", key);
    }
    if (!(g->gen = calloc(1, sizeof *g->gen)))
        return LFAIL(L, TP_NOMEM, "out of memory");
    tp_graph_generate *G = g->gen;
    tp_status st = gen_name(L, gen, "input_ids", &G->input_ids);
    if (st == TP_OK)
        st = gen_name(L, gen, "positions", &G->positions);
    if (st == TP_OK)
        st = gen_name(L, gen, "slots", &G->slots);
    if (st == TP_OK)
        st = gen_name(L, gen, "next_token", &G->next_token);
    if (st == TP_OK)
        st = gen_count(L, gen, "max_seq_len", &G->max_seq_len);
    if (st == TP_OK)
        st = gen_count(L, gen, "vocab_size", &G->vocab_size);
    if (st == TP_OK && json_object_get(gen, "logit_rows"))
        st = gen_name(L, gen, "logit_rows", &G->logit_rows);
    return st;
}

/* A generate input: a replicated INT64 graph input of global shape
 * [B] (rank 1) or [B, 1] (rank 2); INT32 too when int32_ok. */
static tp_status check_gen_input(load_ctx *L, const tp_graph *g, const char *key, const char *name, int rank,
                                 int int32_ok)
{
    int id = tp_graph_find(g, name);
    const tp_node *n = id >= 0 ? &g->nodes[id] : NULL;
    if (!n || n->op != TP_OP_INPUT)
        return LFAIL(L, TP_INVALID, "generate: '%s' names '%s', which is not a graph input", key, name);
    int dtype_ok = n->dtype == TP_I64 || (int32_ok && n->dtype == TP_I32);
    if (!dtype_ok || !n->batched || n->g_ndim != rank || (rank == 2 && n->gshape[1] != 1) ||
        n->placement.kind != TP_PLACE_REPLICATE)
        return LFAIL(L, TP_INVALID, "generate: %s input '%s' must be %s %s, replicated; it is %s%s%s", key,
                     name, int32_ok ? "INT64 or INT32" : "INT64", rank == 2 ? "[\"B\", 1]" : "[\"B\"]",
                     tp_dtype_name(n->dtype),
                     n->batched ? "" : " without the batch dim \"B\"",
                     n->placement.kind == TP_PLACE_SHARD ? " and sharded" : "");
    return TP_OK;
}

/* What the generate block names, on the inferred graph: its inputs and
 * output, and max_seq_len = every kv_attention cache's length. */
static tp_status check_generate(load_ctx *L, tp_graph *g)
{
    const tp_graph_generate *G = g->gen;
    if (!G)
        return TP_OK;
    tp_status st = check_gen_input(L, g, "input_ids", G->input_ids, 2, 0);
    if (st == TP_OK)
        st = check_gen_input(L, g, "positions", G->positions, 1, 0);
    if (st == TP_OK)
        st = check_gen_input(L, g, "slots", G->slots, 1, 0);
    if (st == TP_OK && G->logit_rows)
        st = check_gen_input(L, g, "logit_rows", G->logit_rows, 1, 1);
    if (st != TP_OK)
        return st;
    int out = -1, id = tp_graph_find(g, G->next_token);
    for (int i = 0; i < g->n_outputs; i++)
        if (g->output_ids[i] == id)
            out = i;
    if (out < 0)
        return LFAIL(L, TP_INVALID, "generate: 'next_token' names '%s', which is not a graph output", G->next_token);
    const tp_node *t = &g->nodes[id];
    if (t->dtype != TP_I64 || t->ndim != 1 || t->shape[0] != g->batch || g->output_place[out].kind != TP_PLACE_REPLICATE)
        return LFAIL(L, TP_INVALID, "generate: next_token output '%s' must be INT64 [B], replicated; it is %s of "
                     "%d dims%s", G->next_token, tp_dtype_name(t->dtype), t->ndim,
                     g->output_place[out].kind == TP_PLACE_SHARD ? ", sharded" : "");
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        if (n->op == TP_OP_KV_ATTENTION && g->nodes[n->inputs[3]].shape[2] != G->max_seq_len)
            return LFAIL(L, TP_INVALID, "generate: max_seq_len %lld differs from the cache length %lld of "
                         "kv_attention '%s'", (long long)G->max_seq_len,
                         (long long)g->nodes[n->inputs[3]].shape[2], n->name);
    }
    return TP_OK;
}

/* weights is relative to the JSON file's directory. */
static tp_status resolve_weights(load_ctx *L, tp_graph *g, json_t *root)
{
    json_t *w = json_object_get(root, "weights");
    if (!w) {
        if (g->n_params > 0)
            return LFAIL(L, TP_INVALID, "graph has params but no 'weights' file");
        return TP_OK;
    }
    if (!json_is_string(w) || !*json_string_value(w))
        return LFAIL(L, TP_INVALID, "'weights' must be a file name");
    const char *wp = json_string_value(w);
    const char *slash = strrchr(g->path, '/');
    int dirlen = (wp[0] == '/' || !slash) ? 0 : (int)(slash - g->path + 1);
    size_t n = (size_t)dirlen + strlen(wp) + 1;
    if (!(g->weights = malloc(n)))
        return LFAIL(L, TP_NOMEM, "out of memory");
    snprintf(g->weights, n, "%.*s%s", dirlen, g->path, wp);
    return TP_OK;
}

/* Every param must exist in the safetensors file with its declared global
 * shape and dtype; the header is read, not the data. */
static tp_status check_params(load_ctx *L, tp_graph *g)
{
    if (!g->weights)
        return TP_OK;
    st_file *f;
    tp_status st = st_open(g->weights, &f, L->err);
    if (st != TP_OK) {
        tp_err_prefix(L->err, "%s: weights: ", L->file);
        return st;
    }
    for (int i = 0; st == TP_OK && i < g->n_params; i++) {
        tp_node *n = &g->nodes[g->param_ids[i]];
        const st_tensor_info *t = st_find(f, n->tensor_key);
        char a[128], b[128];
        if (!t)
            st = LFAIL(L, TP_INVALID, "param '%s': tensor '%s' is missing from %s", n->name,
                       n->tensor_key, g->weights);
        else if (t->dtype != n->dtype)
            st = LFAIL(L, TP_INVALID, "param '%s': declared %s but %s holds %s", n->name,
                       tp_dtype_name(n->dtype), g->weights, tp_dtype_name(t->dtype));
        else if (t->ndim != n->g_ndim || memcmp(t->shape, n->gshape, sizeof(int64_t) * (size_t)t->ndim))
            st = LFAIL(L, TP_INVALID, "param '%s': declared shape %s but %s holds %s", n->name,
                       tp_shape_str(a, sizeof a, n->g_ndim, n->gshape), g->weights,
                       tp_shape_str(b, sizeof b, t->ndim, t->shape));
    }
    st_close(f);
    return st;
}

/* Shapes are checked at two batch sizes so errors that only appear for
 * B > 1 (a view whose strides work only because a dim is 1) surface at
 * load time rather than on the first real request. */
static tp_status check_shapes(load_ctx *L, tp_graph *g)
{
    int64_t b0 = tp_graph_batch_sharded(g) ? g->world_size : 1;
    tp_status st = tp_graph_infer(g, b0, L->err);
    if (st == TP_OK)
        st = tp_graph_infer(g, 2 * b0, L->err);
    if (st == TP_OK)
        st = tp_graph_infer(g, b0, L->err);
    if (st != TP_OK)
        tp_err_prefix(L->err, "%s: ", L->file);
    return st;
}

static tp_status load_json(load_ctx *L, json_t **root)
{
    json_error_t je;
    FILE *fp = fopen(L->file, "rb");
    if (!fp)
        return LFAIL(L, TP_IO, "cannot open graph: %s", strerror(errno));
    *root = json_loadf(fp, JSON_REJECT_DUPLICATES, &je);
    fclose(fp);
    if (!*root)
        return LFAIL(L, TP_PARSE, "bad JSON at line %d, column %d: %s", je.line, je.column, je.text);
    return TP_OK;
}

tp_status tp_graph_load(const char *path, tp_graph **out, tp_err *err)
{
    load_ctx L = {path, err};
    *out = NULL;
    tp_graph *g = calloc(1, sizeof *g);
    if (g)
        g->state_slots = TP_DEFAULT_STATE_SLOTS;
    if (!g || !(g->path = dupstr(path))) {
        free(g);
        return tp_fail(err, TP_NOMEM, "%s: out of memory", path);
    }
    json_t *root = NULL;
    tp_status st = load_json(&L, &root);
    if (st == TP_OK)
        st = parse_header(&L, g, root);
    if (st == TP_OK)
        st = parse_lists(&L, g, root);
    if (st == TP_OK)
        st = check_state_uses(&L, g);
    if (st == TP_OK)
        st = parse_generate(&L, g, root);
    if (st == TP_OK)
        st = resolve_weights(&L, g, root);
    json_decref(root);
    if (st == TP_OK)
        st = check_params(&L, g);
    if (st == TP_OK)
        st = check_shapes(&L, g);
    if (st == TP_OK)
        st = check_generate(&L, g);
    if (st != TP_OK) {
        tp_graph_free(g);
        return st;
    }
    *out = g;
    return TP_OK;
}

static void generate_free(tp_graph_generate *G)
{
    if (!G)
        return;
    free(G->input_ids);
    free(G->positions);
    free(G->slots);
    free(G->next_token);
    free(G->logit_rows);
    free(G);
}

static tp_graph_generate *generate_clone(const tp_graph_generate *G)
{
    tp_graph_generate *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    *c = *G;
    c->input_ids = dupstr(G->input_ids);
    c->positions = dupstr(G->positions);
    c->slots = dupstr(G->slots);
    c->next_token = dupstr(G->next_token);
    c->logit_rows = G->logit_rows ? dupstr(G->logit_rows) : NULL;
    if (!c->input_ids || !c->positions || !c->slots || !c->next_token || (G->logit_rows && !c->logit_rows)) {
        generate_free(c);
        return NULL;
    }
    return c;
}

void tp_graph_free(tp_graph *g)
{
    if (!g)
        return;
    for (int i = 0; i < g->n_nodes; i++) {
        free(g->nodes[i].name);
        free(g->nodes[i].inputs);
        free(g->nodes[i].tensor_key);
    }
    free(g->nodes);
    free(g->input_ids);
    free(g->param_ids);
    free(g->state_ids);
    generate_free(g->gen);
    free(g->output_ids);
    free(g->output_place);
    free(g->path);
    free(g->name);
    free(g->weights);
    free(g);
}

static int *dup_ints(const int *v, int n)
{
    int *d = malloc(sizeof(int) * (size_t)(n + 1));
    if (d && n > 0)
        memcpy(d, v, sizeof(int) * (size_t)n);
    return d;
}

static int clone_node(tp_node *d, const tp_node *s)
{
    *d = *s;
    d->name = dupstr(s->name);
    d->inputs = dup_ints(s->inputs, s->n_inputs);
    d->tensor_key = s->tensor_key ? dupstr(s->tensor_key) : NULL;
    return d->name && d->inputs && (d->tensor_key || !s->tensor_key) ? 0 : -1;
}

tp_status tp_graph_clone(const tp_graph *g, tp_graph **out, tp_err *err)
{
    tp_graph *c = calloc(1, sizeof *c);
    *out = NULL;
    if (!c)
        return tp_fail(err, TP_NOMEM, "graph '%s': out of memory copying it", g->name);
    *c = *g;
    c->path = dupstr(g->path);
    c->name = dupstr(g->name);
    c->weights = g->weights ? dupstr(g->weights) : NULL;
    c->nodes = calloc((size_t)g->n_nodes + 1, sizeof *c->nodes);
    c->input_ids = dup_ints(g->input_ids, g->n_inputs);
    c->param_ids = dup_ints(g->param_ids, g->n_params);
    c->state_ids = dup_ints(g->state_ids, g->n_states);
    c->gen = g->gen ? generate_clone(g->gen) : NULL;
    c->output_ids = dup_ints(g->output_ids, g->n_outputs);
    c->output_place = malloc(sizeof *c->output_place * (size_t)(g->n_outputs + 1));
    int ok = c->path && c->name && (c->weights || !g->weights) && c->nodes && c->input_ids && c->param_ids &&
             c->state_ids && (c->gen || !g->gen) && c->output_ids && c->output_place;
    c->n_nodes = 0;
    /* n_nodes counts a node that failed half-way too: its copies are freed */
    for (int i = 0; ok && i < g->n_nodes; i++, c->n_nodes++)
        ok = clone_node(&c->nodes[i], &g->nodes[i]) == 0;
    if (ok && g->n_outputs > 0)
        memcpy(c->output_place, g->output_place, sizeof *c->output_place * (size_t)g->n_outputs);
    if (!ok) {
        tp_graph_free(c);
        return tp_fail(err, TP_NOMEM, "graph '%s': out of memory copying it", g->name);
    }
    *out = c;
    return TP_OK;
}

int tp_graph_find(const tp_graph *g, const char *name)
{
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].name && strcmp(g->nodes[i].name, name) == 0)
            return i;
    return -1;
}

const char *tp_placement_str(tp_placement p, char *buf, int len)
{
    if (p.kind == TP_PLACE_REPLICATE)
        snprintf(buf, (size_t)len, "replicate");
    else if (p.length)
        snprintf(buf, (size_t)len, "shard(%d) cut to %lld", p.dim, (long long)p.length);
    else
        snprintf(buf, (size_t)len, "shard(%d)", p.dim);
    return buf;
}
