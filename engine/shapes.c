/* shapes.c — shape, stride and aliasing inference for one batch size.
 *
 * Views are resolved here, once: a view node records the node that owns the
 * memory and an element offset, so kernels receive strided tensors and no
 * view ever copies. Errors name the node and show both shapes. */
#include <stdio.h>
#include <string.h>

#include "checked_math.h"
#include "graph.h"
#include "reassembly.h"

#define SHAPE(buf, n) tp_shape_str(buf, sizeof buf, (n)->ndim, (n)->shape)

static tp_status node_fail(tp_err *err, const tp_node *n, const char *fmt, const char *a,
                           const char *b)
{
    char msg[600];
    snprintf(msg, sizeof msg, fmt, a, b);
    return tp_fail(err, TP_INVALID, "node '%s' (%s): %s", n->name, tp_op_name(n->op), msg);
}

static tp_status norm_dim(tp_err *err, const tp_node *n, int *dim, int ndim, const char *what)
{
    if (*dim < -ndim || *dim >= ndim) {
        char d[64], nd[32];
        snprintf(d, sizeof d, "%s %d", what, *dim);
        snprintf(nd, sizeof nd, "%d", ndim);
        return node_fail(err, n, "%s is out of range for a %s-d input", d, nd);
    }
    if (*dim < 0)
        *dim += ndim;
    return TP_OK;
}

static void contiguous_strides(tp_node *n)
{
    tp_tensor t = {0};
    t.ndim = n->ndim;
    memcpy(t.shape, n->shape, sizeof t.shape);
    tp_tensor_set_contiguous(&t);
    memcpy(n->stride, t.stride, sizeof n->stride);
}

static void own_contiguous(tp_node *n, int self)
{
    contiguous_strides(n);
    n->storage = self;
    n->offset = 0;
}

static void alias_of(tp_node *n, const tp_node *in)
{
    n->storage = in->storage;
    n->offset = in->offset;
    n->dtype = in->dtype;
}

int tp_node_contiguous(const tp_node *n)
{
    tp_tensor t = {0};
    t.ndim = n->ndim;
    memcpy(t.shape, n->shape, sizeof t.shape);
    memcpy(t.stride, n->stride, sizeof t.stride);
    return tp_tensor_is_contiguous(&t);
}

int64_t tp_node_bytes(const tp_node *n)
{
    int64_t b = (int64_t)tp_dtype_size(n->dtype);
    for (int i = 0; i < n->ndim; i++)
        b *= n->shape[i];
    return b;
}

int tp_graph_output_shape(const tp_graph *g, int i, int64_t *shape)
{
    const tp_node *n = &g->nodes[g->output_ids[i]];
    memcpy(shape, n->shape, sizeof(int64_t) * TP_MAX_DIMS);
    const tp_placement *p = &g->output_place[i];
    if (p->kind == TP_PLACE_SHARD)
        shape[p->dim] = p->length ? p->length : shape[p->dim] * g->world_size;
    return n->ndim;
}

int tp_graph_batch_sharded(const tp_graph *g)
{
    for (int i = 0; i < g->n_inputs; i++) {
        const tp_node *n = &g->nodes[g->input_ids[i]];
        if (n->batched && n->placement.kind == TP_PLACE_SHARD && n->placement.dim == 0)
            return 1;
    }
    return 0;
}

tp_status tp_source_local_shape(const tp_graph *g, const tp_node *n, int64_t batch, int64_t *shape,
                                tp_err *err)
{
    memcpy(shape, n->gshape, sizeof(int64_t) * (size_t)n->g_ndim);
    if (n->batched)
        shape[0] = batch;
    if (n->slotted)
        shape[0] = g->state_slots;
    if (n->placement.kind == TP_PLACE_SHARD) {
        int k = n->placement.dim;
        if (shape[k] % g->world_size != 0)
            return tp_fail(err, TP_INVALID, "%s '%s': shard(%d) of dim size %lld is not divisible by world_size %d",
                           n->op == TP_OP_INPUT ? "input" : n->op == TP_OP_PARAM ? "param" : "state", n->name, k, (long long)shape[k],
                           g->world_size);
        shape[k] /= g->world_size;
    }
    return TP_OK;
}

/* NumPy broadcasting of shapes a and b into out (nd_out dims); -1 if they
 * do not broadcast. */
static int broadcast_shapes(int nd_a, const int64_t *a, int nd_b, const int64_t *b, int *nd_out, int64_t *out)
{
    int nd = nd_a > nd_b ? nd_a : nd_b;
    for (int i = 0; i < nd; i++) {
        int ia = i - (nd - nd_a), ib = i - (nd - nd_b);
        int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return -1;
        out[i] = da == 1 ? db : da;
    }
    *nd_out = nd;
    return 0;
}

/* NumPy broadcasting of two shapes. */
static tp_status infer_binary(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *a = &g->nodes[n->inputs[0]], *b = &g->nodes[n->inputs[1]];
    char sa[128], sb[128];
    if (a->dtype != b->dtype)
        return node_fail(err, n, "input dtypes differ: %s vs %s", tp_dtype_name(a->dtype), tp_dtype_name(b->dtype));
    if ((tp_op_desc_of(n->op)->flags & TP_OPF_FLOAT_ONLY) && !tp_dtype_is_float(a->dtype))
        return node_fail(err, n, "needs floating-point inputs, got %s%s", tp_dtype_name(a->dtype), "");
    if (broadcast_shapes(a->ndim, a->shape, b->ndim, b->shape, &n->ndim, n->shape) != 0)
        return node_fail(err, n, "shapes %s and %s do not broadcast", SHAPE(sa, a), SHAPE(sb, b));
    n->dtype = a->dtype;
    return TP_OK;
}

/* where(cond, x, y): the broadcast of all three; cond is a constant mask. */
static tp_status infer_where(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *c = &g->nodes[n->inputs[0]], *x = &g->nodes[n->inputs[1]], *y = &g->nodes[n->inputs[2]];
    char sa[128], sb[128];
    if (c->op != TP_OP_PARAM || (c->dtype != TP_I32 && c->dtype != TP_I64))
        return node_fail(err, n, "cond '%s' must be an INT32 or INT64 param (a constant mask), got %s", c->name,
                         c->op == TP_OP_PARAM ? tp_dtype_name(c->dtype) : tp_op_name(c->op));
    if (x->dtype != y->dtype)
        return node_fail(err, n, "input dtypes differ: %s vs %s", tp_dtype_name(x->dtype), tp_dtype_name(y->dtype));
    int nd;
    int64_t xy[TP_MAX_DIMS];
    if (broadcast_shapes(x->ndim, x->shape, y->ndim, y->shape, &nd, xy) != 0)
        return node_fail(err, n, "shapes %s and %s do not broadcast", SHAPE(sa, x), SHAPE(sb, y));
    if (broadcast_shapes(c->ndim, c->shape, nd, xy, &n->ndim, n->shape) != 0)
        return node_fail(err, n, "cond shape %s does not broadcast with %s", SHAPE(sa, c),
                         tp_shape_str(sb, sizeof sb, nd, xy));
    n->dtype = x->dtype;
    return TP_OK;
}

/* rope(x, cos, sin): x's shape and dtype; x floating point with an even,
 * non-empty last dim; cos and sin of x's dtype, each broadcasting to x's
 * shape without growing it. */
static tp_status infer_rope(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    char sa[128], sb[128];
    if (!tp_dtype_is_float(x->dtype) || x->ndim < 1 || x->shape[x->ndim - 1] < 2 || x->shape[x->ndim - 1] % 2)
        return node_fail(err, n, "x must be floating point with an even last dim of at least 2, got %s %s",
                         tp_dtype_name(x->dtype), SHAPE(sa, x));
    for (int i = 1; i <= 2; i++) {
        tp_node *t = &g->nodes[n->inputs[i]];
        int nd;
        int64_t b[TP_MAX_DIMS];
        if (t->dtype != x->dtype)
            return node_fail(err, n, i == 1 ? "cos '%s' is not of x's dtype %s" : "sin '%s' is not of x's dtype %s",
                             t->name, tp_dtype_name(x->dtype));
        if (broadcast_shapes(x->ndim, x->shape, t->ndim, t->shape, &nd, b) != 0 || nd != x->ndim ||
            memcmp(b, x->shape, sizeof(int64_t) * (size_t)nd) != 0)
            return node_fail(err, n, i == 1 ? "cos %s does not broadcast to x %s" : "sin %s does not broadcast to x %s",
                             SHAPE(sa, t), SHAPE(sb, x));
    }
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = x->dtype;
    return TP_OK;
}

/* reduce_mean / reduce_sum over attr dim. */
static tp_status infer_reduce(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    if (!tp_dtype_is_float(x->dtype) || x->ndim < 1)
        return node_fail(err, n, "needs a floating-point input of rank >= 1, got %s%s", tp_dtype_name(x->dtype),
                         x->ndim < 1 ? " scalar" : "");
    tp_status st = norm_dim(err, n, &n->attrs.dim, x->ndim, "dim");
    if (st != TP_OK)
        return st;
    int d = n->attrs.dim;
    n->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i != d)
            n->shape[n->ndim++] = x->shape[i];
        else if (n->attrs.keepdim)
            n->shape[n->ndim++] = 1;
    }
    n->dtype = x->dtype;
    return TP_OK;
}

/* gather(x, ids) along dim: x.shape[:dim] + ids.shape + x.shape[dim+1:]. */
static tp_status infer_gather(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]], *ids = &g->nodes[n->inputs[1]];
    if (ids->dtype != TP_I32 && ids->dtype != TP_I64)
        return node_fail(err, n, "ids must be INT32 or INT64, got %s%s", tp_dtype_name(ids->dtype), "");
    if (x->ndim < 1)
        return node_fail(err, n, "needs an input of rank >= 1%s%s", "", "");
    tp_status st = norm_dim(err, n, &n->attrs.dim, x->ndim, "dim");
    if (st != TP_OK)
        return st;
    int d = n->attrs.dim;
    if (x->ndim - 1 + ids->ndim > TP_MAX_DIMS)
        return node_fail(err, n, "the result would have more than %s dims%s", "8", "");
    n->ndim = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i != d) {
            n->shape[n->ndim++] = x->shape[i];
            continue;
        }
        for (int k = 0; k < ids->ndim; k++)
            n->shape[n->ndim++] = ids->shape[k];
    }
    n->dtype = x->dtype;
    return TP_OK;
}

/* expand: ONNX Expand's bidirectional broadcast of the input and attr
 * shape (a 1 in the shape keeps the input's size: the batch dim, a split). */
static tp_status infer_expand(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    char sa[128], sb[128];
    for (int i = 0; i < n->attrs.n_shape; i++)
        if (n->attrs.shape[i] < 1)
            return node_fail(err, n, "target shape %s has a size below 1%s",
                             tp_shape_str(sb, sizeof sb, n->attrs.n_shape, n->attrs.shape), "");
    if (broadcast_shapes(x->ndim, x->shape, n->attrs.n_shape, n->attrs.shape, &n->ndim, n->shape) != 0)
        return node_fail(err, n, "input %s does not broadcast to %s", SHAPE(sa, x),
                         tp_shape_str(sb, sizeof sb, n->attrs.n_shape, n->attrs.shape));
    n->dtype = x->dtype;
    return TP_OK;
}

static tp_status infer_cast(tp_graph *g, tp_node *n)
{
    const tp_node *x = &g->nodes[n->inputs[0]];
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = (tp_dtype)n->attrs.cast_to;
    return TP_OK;
}

static tp_status infer_norm(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    char sa[128], sb[128];
    if (!tp_dtype_is_float(x->dtype) || x->ndim < 1)
        return node_fail(err, n, "needs a floating-point input of rank >= 1, got %s %s", tp_dtype_name(x->dtype), SHAPE(sa, x));
    for (int i = 1; i < n->n_inputs; i++) {
        tp_node *w = &g->nodes[n->inputs[i]];
        if (w->ndim != 1 || w->shape[0] != x->shape[x->ndim - 1])
            return node_fail(err, n, "weight/bias shape %s does not match the last dim of input %s", SHAPE(sb, w), SHAPE(sa, x));
        if (w->dtype != x->dtype)
            return node_fail(err, n, "weight/bias dtype %s differs from input dtype %s", tp_dtype_name(w->dtype), tp_dtype_name(x->dtype));
    }
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = x->dtype;
    return TP_OK;
}

static tp_status infer_unary(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    if (!tp_dtype_is_float(x->dtype))
        return node_fail(err, n, "needs a floating-point input, got %s%s", tp_dtype_name(x->dtype), "");
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = x->dtype;
    if (tp_op_desc_of(n->op)->shape == TP_SHAPE_UNARY_DIM)
        return norm_dim(err, n, &n->attrs.dim, n->ndim, "dim");
    return TP_OK;
}

static tp_status infer_matmul(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *a = &g->nodes[n->inputs[0]], *b = &g->nodes[n->inputs[1]];
    char sa[128], sb[128];
    if (a->ndim < 2 || b->ndim < 2)
        return node_fail(err, n, "needs inputs of rank >= 2, got %s and %s", SHAPE(sa, a), SHAPE(sb, b));
    if (a->dtype != b->dtype || !tp_dtype_is_float(a->dtype))
        return node_fail(err, n, "needs matching floating-point dtypes, got %s and %s", tp_dtype_name(a->dtype), tp_dtype_name(b->dtype));
    int tb = n->attrs.transpose_b;
    int64_t K = a->shape[a->ndim - 1];
    int64_t bK = b->shape[b->ndim - (tb ? 1 : 2)], N = b->shape[b->ndim - (tb ? 2 : 1)];
    if (K != bK)
        return node_fail(err, n, "inner dims differ: a %s vs b %s", SHAPE(sa, a), SHAPE(sb, b));
    n->ndim = a->ndim > b->ndim ? a->ndim : b->ndim;
    for (int i = 0; i < n->ndim - 2; i++) {
        int ia = i - (n->ndim - a->ndim), ib = i - (n->ndim - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1)
            return node_fail(err, n, "batch dims of %s and %s do not broadcast", SHAPE(sa, a), SHAPE(sb, b));
        n->shape[i] = da == 1 ? db : da;
    }
    n->shape[n->ndim - 2] = a->shape[a->ndim - 2];
    n->shape[n->ndim - 1] = N;
    n->dtype = a->dtype;
    return TP_OK;
}

/* matmul_rows: matmul of x by a 2-d w (no batch broadcast: rows are x's
 * alone), and a mask with one INT32/INT64 flag per row of x's dim 0. */
static tp_status infer_matmul_rows(tp_graph *g, tp_node *n, tp_err *err)
{
    const tp_node *w = &g->nodes[n->inputs[1]], *m = &g->nodes[n->inputs[2]];
    char sa[128], sb[128];
    if (w->ndim != 2)
        return node_fail(err, n, "the weight '%s' must be 2-d, got %s", w->name, SHAPE(sb, w));
    tp_status st = infer_matmul(g, n, err);
    if (st != TP_OK)
        return st;
    const tp_node *x = &g->nodes[n->inputs[0]];
    if (m->dtype != TP_I32 && m->dtype != TP_I64)
        return node_fail(err, n, "the row mask '%s' must be INT32 or INT64, got %s", m->name, tp_dtype_name(m->dtype));
    if (m->ndim != 1 || m->shape[0] != x->shape[0]) {
        char want[160];
        snprintf(want, sizeof want, "[%lld], one flag per row of dim 0 of x %s", (long long)x->shape[0], SHAPE(sb, x));
        return node_fail(err, n, "the row mask %s must be %s", SHAPE(sa, m), want);
    }
    return TP_OK;
}

static tp_status infer_attention(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *q = &g->nodes[n->inputs[0]], *k = &g->nodes[n->inputs[1]], *v = &g->nodes[n->inputs[2]];
    char sa[128], sb[128];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return node_fail(err, n, "q, k, v must be 4-d [B, H, S, D]; q is %s, k is %s", SHAPE(sa, q), SHAPE(sb, k));
    /* GQA: k and v may have Hkv heads that divide q's H (tp_attn_kv_head) */
    if (k->shape[0] != q->shape[0] || k->shape[3] != q->shape[3] ||
        (k->shape[1] != q->shape[1] && (k->shape[1] < 1 || q->shape[1] % k->shape[1] != 0)))
        return node_fail(err, n, "k %s does not fit q %s (same B and D; q's heads, or a number of heads that "
                         "divides them)", SHAPE(sb, k), SHAPE(sa, q));
    if (memcmp(k->shape, v->shape, 4 * sizeof(int64_t)) != 0)
        return node_fail(err, n, "v %s does not match k %s", SHAPE(sa, v), SHAPE(sb, k));
    if (q->dtype != k->dtype || q->dtype != v->dtype || !tp_dtype_is_float(q->dtype))
        return node_fail(err, n, "q, k, v need one floating-point dtype%s%s", "", "");
    if (n->n_inputs > 3) {
        /* the key-padding mask: one flag per batch row and key, every head */
        tp_node *m = &g->nodes[n->inputs[3]];
        if (m->dtype != TP_I32 && m->dtype != TP_I64)
            return node_fail(err, n, "the key-padding mask '%s' must be INT32 or INT64, got %s", m->name,
                             tp_dtype_name(m->dtype));
        if (m->ndim != 2 || m->shape[0] != k->shape[0] || m->shape[1] != k->shape[2]) {
            char want[160];
            snprintf(want, sizeof want, "[B, T] = [%lld, %lld] of k %s", (long long)k->shape[0],
                     (long long)k->shape[2], SHAPE(sb, k));
            return node_fail(err, n, "the key-padding mask %s must be %s", SHAPE(sa, m), want);
        }
    }
    n->ndim = 4;
    memcpy(n->shape, q->shape, sizeof n->shape);
    n->dtype = q->dtype;
    return TP_OK;
}

/* kv_attention(q [B,H,T,D], k, v [B,Hkv,T,D], k_cache, v_cache [S,Hkv,L,D]
 * (states), slot, pos [B] INT32/INT64): local shapes, so H and Hkv are
 * per rank and GQA's H % Hkv holds on each. */
static tp_status infer_kv_attention(tp_graph *g, tp_node *n, tp_err *err)
{
    const tp_node *q = &g->nodes[n->inputs[0]], *k = &g->nodes[n->inputs[1]], *v = &g->nodes[n->inputs[2]];
    const tp_node *kc = &g->nodes[n->inputs[3]], *vc = &g->nodes[n->inputs[4]];
    char sa[128], sb[128];
    if (q->ndim != 4 || k->ndim != 4 || v->ndim != 4)
        return node_fail(err, n, "q, k, v must be 4-d [B, H, T, D]; q is %s, k is %s", SHAPE(sa, q), SHAPE(sb, k));
    if (memcmp(k->shape, v->shape, 4 * sizeof(int64_t)) != 0)
        return node_fail(err, n, "v %s does not match k %s", SHAPE(sa, v), SHAPE(sb, k));
    if (k->shape[0] != q->shape[0] || k->shape[2] != q->shape[2] || k->shape[3] != q->shape[3] ||
        k->shape[1] < 1 || q->shape[1] % k->shape[1] != 0)
        return node_fail(err, n, "k %s does not fit q %s (same B, T, D; q's heads a multiple of k's)", SHAPE(sb, k),
                         SHAPE(sa, q));
    for (int c = 3; c <= 4; c++) {
        const tp_node *cache = &g->nodes[n->inputs[c]];
        if (cache->op != TP_OP_STATE)
            return node_fail(err, n, "%s '%s' must be a state", c == 3 ? "k_cache" : "v_cache", cache->name);
    }
    if (kc->ndim != 4 || memcmp(kc->shape, vc->shape, 4 * sizeof(int64_t)) != 0 || kc->shape[1] != k->shape[1] ||
        kc->shape[3] != k->shape[3])
        return node_fail(err, n, "caches must be [S, Hkv, L, D] with k's Hkv and D; k_cache is %s, v_cache %s",
                         SHAPE(sa, kc), SHAPE(sb, vc));
    if (q->dtype != k->dtype || q->dtype != v->dtype || q->dtype != kc->dtype || q->dtype != vc->dtype ||
        !tp_dtype_is_float(q->dtype))
        return node_fail(err, n, "q, k, v and the caches need one floating-point dtype%s%s", "", "");
    for (int c = 5; c <= 6; c++) {
        const tp_node *x = &g->nodes[n->inputs[c]];
        if ((x->dtype != TP_I32 && x->dtype != TP_I64) || x->ndim != 1 || x->shape[0] != q->shape[0]) {
            char want[64];
            snprintf(want, sizeof want, "INT32/INT64 [%lld]", (long long)q->shape[0]);
            return node_fail(err, n, c == 5 ? "slot must be %s, got %s" : "pos must be %s, got %s", want,
                             SHAPE(sa, x));
        }
    }
    n->ndim = 4;
    memcpy(n->shape, q->shape, sizeof n->shape);
    n->dtype = q->dtype;
    return TP_OK;
}

/* argmax: x [..., N] floating point -> INT64 keys [...]; argmax_index:
 * INT64 keys -> INT64 ids of the same shape. */
static tp_status infer_argmax(tp_graph *g, tp_node *n, tp_err *err)
{
    const tp_node *x = &g->nodes[n->inputs[0]];
    char sa[128];
    if (n->op == TP_OP_ARGMAX_INDEX) {
        if (x->dtype != TP_I64)
            return node_fail(err, n, "needs the INT64 keys of argmax, got %s%s", tp_dtype_name(x->dtype), "");
        n->ndim = x->ndim;
        memcpy(n->shape, x->shape, sizeof n->shape);
        n->dtype = TP_I64;
        return TP_OK;
    }
    if (!tp_dtype_is_float(x->dtype) || x->ndim < 1 || x->shape[x->ndim - 1] < 1)
        return node_fail(err, n, "needs a floating-point input with a non-empty last dim, got %s %s",
                         tp_dtype_name(x->dtype), SHAPE(sa, x));
    if (x->shape[x->ndim - 1] > UINT32_MAX)
        return node_fail(err, n, "last dim %s is too long for a 32-bit index%s", SHAPE(sa, x), "");
    if (n->attrs.has_limit && n->attrs.limit < 1)
        return node_fail(err, n, "limit must be positive%s%s", "", "");
    n->ndim = x->ndim - 1;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = TP_I64;
    return TP_OK;
}

static tp_status infer_embedding(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *ids = &g->nodes[n->inputs[0]], *t = &g->nodes[n->inputs[1]];
    char sa[128];
    if (ids->dtype != TP_I32 && ids->dtype != TP_I64)
        return node_fail(err, n, "ids must be INT32 or INT64, got %s%s", tp_dtype_name(ids->dtype), "");
    if (t->ndim != 2 || !tp_dtype_is_float(t->dtype))
        return node_fail(err, n, "table must be a 2-d floating-point tensor, got %s %s", tp_dtype_name(t->dtype), SHAPE(sa, t));
    if (ids->ndim + 1 > TP_MAX_DIMS)
        return node_fail(err, n, "ids have too many dims%s%s", "", "");
    n->ndim = ids->ndim + 1;
    memcpy(n->shape, ids->shape, sizeof(int64_t) * (size_t)ids->ndim);
    n->shape[ids->ndim] = t->shape[1];
    n->dtype = t->dtype;
    return TP_OK;
}

/* target (one -1 allowed) resolved against numel into out; -1 on error. */
static int resolve_shape(const int64_t *target, int nt, int64_t numel, int64_t *out)
{
    int64_t known = 1;
    int neg = -1;
    for (int i = 0; i < nt; i++) {
        if (target[i] == -1 && neg < 0)
            neg = i;
        else if (target[i] < 0)
            return -1;
        else if (tp_mul_i64(known, target[i], &known) != 0)
            return -1;
        out[i] = target[i];
    }
    if (neg >= 0) {
        if (known == 0 || numel % known != 0)
            return -1;
        out[neg] = numel / known;
        known = numel;
    }
    return known == numel && tp_shape_bounded(nt, out) == 0 ? 0 : -1;
}

/* A shape whose strides or byte count would overflow is an error before
 * any stride is computed from it. */
static tp_status check_extent(const tp_node *n, int64_t batch, tp_err *err)
{
    if (tp_shape_bounded(n->ndim, n->shape) == 0)
        return TP_OK;
    char sh[128], b[32];
    snprintf(b, sizeof b, "%lld", (long long)batch);
    return node_fail(err, n, "shape %s (at batch %s) has more than 2^48 elements", SHAPE(sh, n), b);
}

static int64_t numel_of(int nd, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < nd; i++)
        n *= shape[i];
    return n;
}

/* Target shape of view/reshape with one -1 resolved. */
static tp_status resolve_target(tp_node *n, const tp_node *x, tp_err *err)
{
    char sa[128], sb[128];
    n->ndim = n->attrs.n_shape;
    if (resolve_shape(n->attrs.shape, n->ndim, numel_of(x->ndim, x->shape), n->shape) != 0)
        return node_fail(err, n, "cannot view input %s as %s", SHAPE(sa, x),
                         tp_shape_str(sb, sizeof sb, n->ndim, n->attrs.shape));
    return TP_OK;
}

/* Strides for viewing x as n->shape without copying (PyTorch's
 * computeStride): the input dims split into runs that are contiguous with
 * each other, and every output dim must fall inside one run. Returns 0 when
 * impossible, which makes view an error and reshape a copy. */
static int view_strides(const tp_node *x, tp_node *n)
{
    int64_t numel = 1;
    for (int i = 0; i < x->ndim; i++)
        numel *= x->shape[i];
    if (numel == 0 || x->ndim == 0) {
        contiguous_strides(n);
        return 1;
    }
    int vd = n->ndim - 1;
    int64_t base = x->stride[x->ndim - 1], tnumel = 1, vnumel = 1;
    for (int td = x->ndim - 1; td >= 0; td--) {
        tnumel *= x->shape[td];
        if (td > 0 && (x->shape[td - 1] == 1 || x->stride[td - 1] == tnumel * base))
            continue; /* run goes on */
        while (vd >= 0 && (vnumel < tnumel || n->shape[vd] == 1)) {
            n->stride[vd] = vnumel * base;
            vnumel *= n->shape[vd];
            vd--;
        }
        if (vnumel != tnumel)
            return 0;
        if (td > 0) {
            base = x->stride[td - 1];
            tnumel = vnumel = 1;
        }
    }
    return vd == -1;
}

static tp_status infer_view(tp_graph *g, tp_node *n, int self, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    tp_status st = resolve_target(n, x, err);
    if (st != TP_OK)
        return st;
    if (view_strides(x, n)) {
        alias_of(n, x);
        return TP_OK;
    }
    if (n->op == TP_OP_VIEW) {
        char sa[128], sb[128];
        return node_fail(err, n, "the strides of input %s do not allow a view as %s (use reshape)",
                         SHAPE(sa, x), SHAPE(sb, n));
    }
    n->dtype = x->dtype;
    own_contiguous(n, self);
    return TP_OK;
}

static tp_status infer_permute(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    int dims[TP_MAX_DIMS], seen[TP_MAX_DIMS] = {0};
    int nd = n->op == TP_OP_PERMUTE ? n->attrs.n_dims : x->ndim;
    if (nd != x->ndim) {
        char sa[128], c[32];
        snprintf(c, sizeof c, "%d", nd);
        return node_fail(err, n, "dims has %s entries for input %s", c, SHAPE(sa, x));
    }
    for (int i = 0; i < nd; i++)
        dims[i] = n->op == TP_OP_PERMUTE ? n->attrs.dims[i] : i;
    if (n->op == TP_OP_TRANSPOSE) {
        tp_status st = norm_dim(err, n, &n->attrs.dim0, nd, "dim0");
        if (st == TP_OK)
            st = norm_dim(err, n, &n->attrs.dim1, nd, "dim1");
        if (st != TP_OK)
            return st;
        dims[n->attrs.dim0] = n->attrs.dim1;
        dims[n->attrs.dim1] = n->attrs.dim0;
    }
    for (int i = 0; i < nd; i++) {
        tp_status st = norm_dim(err, n, &dims[i], nd, "dims entry");
        if (st != TP_OK)
            return st;
        if (seen[dims[i]]++)
            return node_fail(err, n, "dims is not a permutation (repeats a dim)%s%s", "", "");
        if (n->op == TP_OP_PERMUTE)
            n->attrs.dims[i] = dims[i];
    }
    n->ndim = nd;
    for (int i = 0; i < nd; i++) {
        n->shape[i] = x->shape[dims[i]];
        n->stride[i] = x->stride[dims[i]];
    }
    alias_of(n, x);
    return TP_OK;
}

static tp_status infer_slice(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    tp_status st = norm_dim(err, n, &n->attrs.dim, x->ndim, "dim");
    if (st != TP_OK)
        return st;
    int d = n->attrs.dim;
    int64_t s = n->attrs.start, len = n->attrs.length;
    if (s < 0 || len < 0 || s > x->shape[d] - len) {
        char a[96], b[128];
        snprintf(a, sizeof a, "start %lld + length %lld", (long long)s, (long long)len);
        return node_fail(err, n, "%s runs past dim of size %s", a,
                         (snprintf(b, sizeof b, "%lld", (long long)x->shape[d]), b));
    }
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    memcpy(n->stride, x->stride, sizeof n->stride);
    n->shape[d] = len;
    alias_of(n, x);
    n->offset += s * x->stride[d];
    return TP_OK;
}

static tp_status infer_cat(tp_graph *g, tp_node *n, tp_err *err)
{
    tp_node *x0 = &g->nodes[n->inputs[0]];
    tp_status st = norm_dim(err, n, &n->attrs.dim, x0->ndim, "dim");
    if (st != TP_OK)
        return st;
    n->ndim = x0->ndim;
    memcpy(n->shape, x0->shape, sizeof n->shape);
    n->dtype = x0->dtype;
    for (int i = 1; i < n->n_inputs; i++) {
        tp_node *x = &g->nodes[n->inputs[i]];
        char sa[128], sb[128];
        int ok = x->ndim == x0->ndim && x->dtype == x0->dtype;
        for (int k = 0; ok && k < x->ndim; k++)
            ok = k == n->attrs.dim || x->shape[k] == x0->shape[k];
        if (!ok)
            return node_fail(err, n, "input shapes %s and %s differ outside the cat dim (or dtypes differ)",
                             SHAPE(sa, x0), SHAPE(sb, x));
        n->shape[n->attrs.dim] += x->shape[n->attrs.dim];
    }
    return TP_OK;
}

static tp_status divisible(tp_err *err, const tp_node *n, const tp_node *x, int dim, int d)
{
    if (x->shape[dim] % d == 0)
        return TP_OK;
    char a[160], b[64];
    snprintf(a, sizeof a, "split dim %d of size %lld", dim, (long long)x->shape[dim]);
    snprintf(b, sizeof b, "world_size %d", d);
    return node_fail(err, n, "%s is not divisible by %s", a, b);
}

/* The collectives' shapes: the input's, with the rule's dims changed. */
static tp_status infer_collective(tp_graph *g, tp_node *n, tp_shape_rule rule, tp_err *err)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    int d = g->world_size;
    tp_attrs *a = &n->attrs;
    tp_status st = TP_OK;
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = x->dtype;
    if (rule == TP_SHAPE_GATHER_DIM) {
        if ((st = norm_dim(err, n, &a->dim, x->ndim, "dim")) == TP_OK)
            n->shape[a->dim] *= d;
    } else if (rule == TP_SHAPE_SCATTER_DIM) {
        if ((st = norm_dim(err, n, &a->dim, x->ndim, "dim")) == TP_OK &&
            (st = divisible(err, n, x, a->dim, d)) == TP_OK)
            n->shape[a->dim] /= d;
    } else if (rule == TP_SHAPE_ALL_TO_ALL) {
        if ((st = norm_dim(err, n, &a->split_dim, x->ndim, "split_dim")) == TP_OK &&
            (st = norm_dim(err, n, &a->concat_dim, x->ndim, "concat_dim")) == TP_OK &&
            (st = divisible(err, n, x, a->split_dim, d)) == TP_OK) {
            n->shape[a->split_dim] /= d;
            n->shape[a->concat_dim] *= d;
        }
    } else if (rule == TP_SHAPE_FROM_SRC && a->src >= d) {
        char s[32], w[32];
        snprintf(s, sizeof s, "%d", a->src);
        snprintf(w, sizeof w, "%d", d);
        return node_fail(err, n, "src rank %s is not below world_size %s", s, w);
    }
    return st;
}

/* fused_all_gather_matmul: gathered x (optionally re-viewed, K kept last)
 * times each weight, products side by side along the last dim. */
static tp_status infer_fused_ag_mm(tp_graph *g, tp_node *n, tp_err *err)
{
    const tp_node *x = &g->nodes[n->inputs[0]];
    int64_t lead[TP_MAX_DIMS];
    int nd = x->ndim;
    memcpy(lead, x->shape, sizeof lead);
    lead[n->attrs.dim] *= g->world_size;
    if (n->attrs.n_pieces > 0) {
        int64_t r[TP_MAX_DIMS];
        if (tp_reassembled_shape(&n->attrs, nd, lead, r) != 0)
            return node_fail(err, n, "its slices no longer cat into one tensor%s%s", "", "");
        memcpy(lead, r, sizeof lead);
    }
    if (n->attrs.n_shape > 0) {
        int64_t v[TP_MAX_DIMS];
        if (resolve_shape(n->attrs.shape, n->attrs.n_shape, numel_of(nd, lead), v) != 0 ||
            v[n->attrs.n_shape - 1] != lead[nd - 1])
            return node_fail(err, n, "the view around the matmul no longer fits the gathered input%s%s", "", "");
        nd = n->attrs.n_shape;
        memcpy(lead, v, sizeof lead);
    }
    int64_t K = lead[nd - 1], N = 0;
    for (int i = 1; i < n->n_inputs; i++) {
        const tp_node *w = &g->nodes[n->inputs[i]];
        int tb = n->attrs.transpose_b;
        if (w->ndim != 2 || w->shape[tb ? 1 : 0] != K)
            return node_fail(err, n, "weight '%s' does not match K of the gathered input%s", w->name, "");
        N += w->shape[tb ? 0 : 1];
    }
    n->ndim = nd;
    memcpy(n->shape, lead, sizeof n->shape);
    n->shape[nd - 1] = N;
    n->dtype = x->dtype;
    return TP_OK;
}

/* fused_matmul_reduce_scatter: the product a @ w (optionally re-viewed)
 * split along dim and reduced over ranks. */
static tp_status infer_fused_mm_rs(tp_graph *g, tp_node *n, tp_err *err)
{
    const tp_node *a = &g->nodes[n->inputs[0]], *w = &g->nodes[n->inputs[1]];
    int tb = n->attrs.transpose_b;
    if (w->ndim != 2 || w->shape[tb ? 1 : 0] != a->shape[a->ndim - 1])
        return node_fail(err, n, "weight '%s' does not match K of '%s'", w->name, a->name);
    int64_t p[TP_MAX_DIMS];
    int nd = a->ndim;
    memcpy(p, a->shape, sizeof p);
    p[nd - 1] = w->shape[tb ? 0 : 1];
    if (n->attrs.n_pieces > 0) {
        int64_t r[TP_MAX_DIMS];
        if (tp_reassembled_shape(&n->attrs, nd, p, r) != 0)
            return node_fail(err, n, "its slices no longer cat into one tensor%s%s", "", "");
        memcpy(p, r, sizeof p);
    }
    if (n->attrs.n_shape > 0) {
        int64_t v[TP_MAX_DIMS];
        if (resolve_shape(n->attrs.shape, n->attrs.n_shape, numel_of(nd, p), v) != 0)
            return node_fail(err, n, "the view after the matmul no longer fits its product%s%s", "", "");
        nd = n->attrs.n_shape;
        memcpy(p, v, sizeof p);
    }
    n->ndim = nd;
    memcpy(n->shape, p, sizeof n->shape);
    n->dtype = a->dtype;
    if (n->shape[n->attrs.dim] % g->world_size != 0)
        return divisible(err, n, n, n->attrs.dim, g->world_size);
    n->shape[n->attrs.dim] /= g->world_size;
    return TP_OK;
}

static tp_status infer_contiguous(tp_graph *g, tp_node *n, int *aliased)
{
    tp_node *x = &g->nodes[n->inputs[0]];
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    memcpy(n->stride, x->stride, sizeof n->stride);
    if (tp_node_contiguous(x)) {
        alias_of(n, x);
        *aliased = 1;
        return TP_OK;
    }
    n->dtype = x->dtype;
    return TP_OK;
}

static tp_status infer_copy(tp_graph *g, tp_node *n)
{
    const tp_node *x = &g->nodes[n->inputs[0]];
    n->ndim = x->ndim;
    memcpy(n->shape, x->shape, sizeof n->shape);
    n->dtype = x->dtype;
    return TP_OK;
}

/* The op's shape rule (its descriptor names it). Rules that alias or lay
 * out their own strides return directly; the rest own a contiguous buffer. */
static tp_status infer_node(tp_graph *g, int i, int64_t batch, tp_err *err)
{
    tp_node *n = &g->nodes[i];
    tp_status st = TP_OK;
    int aliased = 0;
    tp_shape_rule rule = tp_op_desc_of(n->op)->shape;
    n->storage = i;
    n->offset = 0;
    switch (rule) {
    case TP_SHAPE_SOURCE:
        n->ndim = n->g_ndim;
        st = tp_source_local_shape(g, n, batch, n->shape, err);
        break;
    case TP_SHAPE_BINARY:
        st = infer_binary(g, n, err);
        break;
    case TP_SHAPE_UNARY:
    case TP_SHAPE_UNARY_DIM:
        st = infer_unary(g, n, err);
        break;
    case TP_SHAPE_NORM:
        st = infer_norm(g, n, err);
        break;
    case TP_SHAPE_MATMUL:
        st = infer_matmul(g, n, err);
        break;
    case TP_SHAPE_MATMUL_ROWS:
        st = infer_matmul_rows(g, n, err);
        break;
    case TP_SHAPE_ATTENTION:
        st = infer_attention(g, n, err);
        break;
    case TP_SHAPE_EMBEDDING:
        st = infer_embedding(g, n, err);
        break;
    case TP_SHAPE_VIEW:
        return infer_view(g, n, i, err);
    case TP_SHAPE_PERMUTE:
        return infer_permute(g, n, err);
    case TP_SHAPE_SLICE:
        return infer_slice(g, n, err);
    case TP_SHAPE_CONTIGUOUS:
        st = infer_contiguous(g, n, &aliased);
        if (aliased)
            return st;
        break;
    case TP_SHAPE_COPY:
        st = infer_copy(g, n);
        break;
    case TP_SHAPE_CAT:
        st = infer_cat(g, n, err);
        break;
    case TP_SHAPE_FUSED_AG_MM:
        st = infer_fused_ag_mm(g, n, err);
        break;
    case TP_SHAPE_FUSED_MM_RS:
        st = infer_fused_mm_rs(g, n, err);
        break;
    case TP_SHAPE_GATHER_DIM:
    case TP_SHAPE_SCATTER_DIM:
    case TP_SHAPE_ALL_TO_ALL:
    case TP_SHAPE_SAME:
    case TP_SHAPE_FROM_SRC:
        st = infer_collective(g, n, rule, err);
        break;
    case TP_SHAPE_REDUCE:
        st = infer_reduce(g, n, err);
        break;
    case TP_SHAPE_WHERE:
        st = infer_where(g, n, err);
        break;
    case TP_SHAPE_ROPE:
        st = infer_rope(g, n, err);
        break;
    case TP_SHAPE_GATHER_IDS:
        st = infer_gather(g, n, err);
        break;
    case TP_SHAPE_EXPAND:
        st = infer_expand(g, n, err);
        break;
    case TP_SHAPE_CAST:
        st = infer_cast(g, n);
        break;
    case TP_SHAPE_KV_ATTENTION:
        st = infer_kv_attention(g, n, err);
        break;
    case TP_SHAPE_ARGMAX:
    case TP_SHAPE_ARGMAX_INDEX:
        st = infer_argmax(g, n, err);
        break;
    case TP_SHAPE_UNSET:
        return tp_fail(err, TP_INTERNAL, "node '%s': op '%s' has no shape rule in its descriptor", n->name,
                       tp_op_name(n->op));
    }
    if (st == TP_OK && (st = check_extent(n, batch, err)) == TP_OK)
        own_contiguous(n, i);
    return st;
}

tp_status tp_graph_infer(tp_graph *g, int64_t batch, tp_err *err)
{
    if (batch < 1)
        return tp_fail(err, TP_INVALID, "batch size must be >= 1, got %lld", (long long)batch);
    for (int i = 0; i < g->n_nodes; i++) {
        tp_status st = infer_node(g, i, batch, err);
        if (st != TP_OK)
            return st;
    }
    for (int i = 0; i < g->n_outputs; i++) {
        tp_placement *p = &g->output_place[i];
        const tp_node *o = &g->nodes[g->output_ids[i]];
        if (p->kind == TP_PLACE_SHARD && p->dim < 0)
            p->dim += o->ndim;
        if (p->kind == TP_PLACE_SHARD && (p->dim < 0 || p->dim >= o->ndim))
            return tp_fail(err, TP_INVALID, "output '%s': placement shard names a dim outside its %d-d shape",
                           o->name, o->ndim);
    }
    g->batch = batch;
    return TP_OK;
}
