#include "weights.h"

#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

/* How a param is read, for the backend's prepare_matmul_weight. */
typedef struct {
    int matmuls;     /* reads as the b of a matmul or matmul_rows */
    int transpose_b; /* the first such read's */
    int sole;        /* nothing else reads it: no other op, view or output */
} weight_use;

struct tp_weights {
    tp_backend *b;
    int world, n, n_states;
    void **data;   /* [rank * n + p] */
    void **states; /* [rank * n_states + s] */
    size_t bytes, state_bytes;
    /* load-time only */
    const tp_graph *g;
    st_file *f;
    weight_use *use; /* [p] */
};

/* Every read of param node pid: inputs of later nodes, views of its
 * memory, the graph's outputs. A matmul read is input 1 of matmul or
 * matmul_rows, the same transpose_b as the first one. */
static weight_use use_of(const tp_graph *g, int pid)
{
    weight_use u = {0, 0, 1};
    for (int o = 0; o < g->n_outputs; o++)
        if (g->output_ids[o] == pid)
            u.sole = 0;
    for (int i = pid + 1; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        if (n->storage == pid)
            u.sole = 0;
        for (int k = 0; k < n->n_inputs; k++) {
            if (n->inputs[k] != pid)
                continue;
            int matmul = k == 1 && (n->op == TP_OP_MATMUL || n->op == TP_OP_MATMUL_ROWS);
            if (matmul && u.matmuls++ == 0)
                u.transpose_b = n->attrs.transpose_b != 0;
            else if (!matmul || u.transpose_b != (n->attrs.transpose_b != 0))
                u.sole = 0;
        }
    }
    return u;
}

/* Offers a loaded param that matmuls read to the backend. */
static tp_status prepare_param(tp_weights *w, int rank, int p, tp_err *err)
{
    const tp_node *n = &w->g->nodes[w->g->param_ids[p]];
    const weight_use *u = &w->use[p];
    if (!w->b->iface->prepare_matmul_weight || !u->matmuls)
        return TP_OK;
    tp_tensor t = tp_tensor_make(w->data[rank * w->n + p], n->dtype, n->ndim, n->shape);
    return w->b->iface->prepare_matmul_weight(w->b, rank, &t, u->transpose_b, u->sole, err);
}

/* A shard whose file dtype is FP16/BF16 read into dst as FP32 (pass
 * widen_activations): through a buffer of the file's bytes, freed here. */
static tp_status read_widened(const tp_weights *w, const tp_node *n, const st_tensor_info *t, int dim, int rank,
                              float *dst, tp_err *err)
{
    int64_t count = tp_node_bytes(n) / (int64_t)sizeof(float);
    uint16_t *narrow = malloc(sizeof *narrow * (size_t)(count ? count : 1));
    if (!narrow)
        return tp_fail(err, TP_NOMEM, "cannot allocate %lld %s elements to widen", (long long)count,
                       tp_dtype_name(n->stored));
    tp_status st = st_read_shard(w->f, t, dim, rank, w->world, narrow, err);
    for (int64_t i = 0; st == TP_OK && i < count; i++)
        dst[i] = tp_load_f32(narrow, n->stored, i);
    free(narrow);
    return st;
}

/* The rank's shard of param n into dst, in n's dtype. */
static tp_status read_param(const tp_weights *w, const tp_node *n, int rank, void *dst, tp_err *err)
{
    const st_tensor_info *t = st_find(w->f, n->tensor_key);
    int dim = n->placement.kind == TP_PLACE_SHARD ? n->placement.dim : -1;
    if (n->stored != n->dtype)
        return read_widened(w, n, t, dim, rank, dst, err);
    return st_read_shard(w->f, t, dim, rank, w->world, dst, err);
}

static tp_status load_param(tp_weights *w, int rank, int p, tp_err *err)
{
    const tp_node *n = &w->g->nodes[w->g->param_ids[p]];
    size_t bytes = (size_t)tp_node_bytes(n);
    void **slot = &w->data[rank * w->n + p];
    tp_status st = w->b->iface->alloc(w->b, rank, bytes, slot, err);
    if (st != TP_OK)
        return st;
    if (w->b->iface->host_addressable)
        return read_param(w, n, rank, *slot, err);
    void *staging = malloc(bytes ? bytes : 1);
    if (!staging)
        return tp_fail(err, TP_NOMEM, "param '%s': cannot allocate %zu staging bytes", n->name, bytes);
    st = read_param(w, n, rank, staging, err);
    if (st == TP_OK) {
        tp_tensor src = tp_tensor_make(staging, n->dtype, n->ndim, n->shape);
        tp_tensor dst = tp_tensor_make(*slot, n->dtype, n->ndim, n->shape);
        st = w->b->iface->copy_in(w->b, rank, &dst, &src, err);
        if (st == TP_OK)
            st = w->b->iface->synchronize(w->b, rank, err);
    }
    free(staging);
    return st;
}

/* A state starts as zeros (every float type's 0.0): a slot's cache holds
 * nothing a sequence has not written, and no uninitialised byte is ever
 * read (a new sequence reads only positions it wrote). */
static tp_status alloc_state(tp_weights *w, int rank, int s, tp_err *err)
{
    const tp_node *n = &w->g->nodes[w->g->state_ids[s]];
    size_t bytes = (size_t)tp_node_bytes(n);
    void **slot = &w->states[rank * w->n_states + s];
    tp_status st = w->b->iface->alloc(w->b, rank, bytes, slot, err);
    if (st != TP_OK || bytes == 0)
        return st;
    if (w->b->iface->host_addressable) {
        memset(*slot, 0, bytes);
        return TP_OK;
    }
    void *zeros = calloc(1, bytes);
    if (!zeros)
        return tp_fail(err, TP_NOMEM, "cannot allocate %zu bytes of zeros", bytes);
    tp_tensor src = tp_tensor_make(zeros, n->dtype, n->ndim, n->shape);
    tp_tensor dst = tp_tensor_make(*slot, n->dtype, n->ndim, n->shape);
    st = w->b->iface->copy_in(w->b, rank, &dst, &src, err);
    if (st == TP_OK)
        st = w->b->iface->synchronize(w->b, rank, err);
    free(zeros);
    return st;
}

static tp_status load_rank(void *ctx, int rank, tp_err *err)
{
    tp_weights *w = ctx;
    for (int s = 0; s < w->n_states; s++) {
        tp_status st = alloc_state(w, rank, s, err);
        if (st != TP_OK) {
            tp_err_prefix(err, "state '%s': ", w->g->nodes[w->g->state_ids[s]].name);
            return st;
        }
    }
    for (int p = 0; p < w->n; p++) {
        tp_status st = load_param(w, rank, p, err);
        if (st == TP_OK)
            st = prepare_param(w, rank, p, err);
        if (st != TP_OK) {
            tp_err_prefix(err, "param '%s': ", w->g->nodes[w->g->param_ids[p]].name);
            return st;
        }
    }
    return TP_OK;
}

tp_status tp_weights_load(const tp_graph *g, tp_backend *b, tp_rank_group *rg, tp_weights **out,
                          tp_err *err)
{
    tp_weights *w = calloc(1, sizeof *w);
    if (!w)
        return tp_fail(err, TP_NOMEM, "weights: out of memory");
    w->b = b;
    w->world = g->world_size;
    w->n = g->n_params;
    w->n_states = g->n_states;
    w->g = g;
    w->data = calloc((size_t)(w->world * w->n) + 1, sizeof *w->data);
    w->states = calloc((size_t)(w->world * w->n_states) + 1, sizeof *w->states);
    w->use = calloc((size_t)w->n + 1, sizeof *w->use);
    if (!w->data || !w->states || !w->use) {
        tp_weights_free(w);
        return tp_fail(err, TP_NOMEM, "weights: out of memory");
    }
    for (int p = 0; p < w->n; p++) {
        w->bytes += (size_t)tp_node_bytes(&g->nodes[g->param_ids[p]]);
        if (b->iface->prepare_matmul_weight) /* the scan only serves that hook */
            w->use[p] = use_of(g, g->param_ids[p]);
    }
    for (int s = 0; s < w->n_states; s++)
        w->state_bytes += (size_t)tp_node_bytes(&g->nodes[g->state_ids[s]]);
    tp_status st = TP_OK;
    if (w->n > 0)
        st = st_open(g->weights, &w->f, err);
    if (st == TP_OK && w->n + w->n_states > 0)
        st = tp_rank_group_run(rg, load_rank, w, NULL, err);
    if (w->f)
        st_close(w->f);
    w->f = NULL;
    w->g = NULL;
    free(w->use);
    w->use = NULL;
    if (st != TP_OK) {
        tp_weights_free(w);
        return st;
    }
    *out = w;
    return TP_OK;
}

void tp_weights_free(tp_weights *w)
{
    if (!w)
        return;
    for (int i = 0; w->data && i < w->world * w->n; i++)
        if (w->data[i])
            w->b->iface->free(w->b, i / w->n, w->data[i]);
    for (int i = 0; w->states && i < w->world * w->n_states; i++)
        if (w->states[i])
            w->b->iface->free(w->b, i / w->n_states, w->states[i]);
    free(w->data);
    free(w->states);
    free(w->use);
    free(w);
}

void *tp_weights_get(const tp_weights *w, int rank, int p) { return w->data[rank * w->n + p]; }
size_t tp_weights_bytes(const tp_weights *w) { return w->bytes; }
void *tp_weights_state(const tp_weights *w, int rank, int s) { return w->states[rank * w->n_states + s]; }
size_t tp_weights_state_bytes(const tp_weights *w) { return w->state_bytes; }
