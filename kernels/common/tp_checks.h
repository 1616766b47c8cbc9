/* tp_checks.h — argument checks every backend's kernels repeat before
 * touching memory (shape inference already validated the graph; these keep
 * a kernel safe when called directly). Header-only, shared by cpu and cuda. */
#ifndef TP_CHECKS_H
#define TP_CHECKS_H

#include "common/tp_cuda_plan.h"
#include "common/tp_math.h"
#include "ops.h"
#include "status.h"
#include "tensor.h"

/* cat: dim in range, every input matching out except along dim, and the
 * inputs filling out's dim exactly. */
static inline tp_status tp_check_cat(int d, const tp_tensor *ins, int n_ins, const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if (d < 0 || d >= out->ndim)
        return tp_fail(err, TP_INVALID, "cat: dim %d out of range for %d dims", d, out->ndim);
    int64_t total = 0;
    for (int i = 0; i < n_ins; i++) {
        const tp_tensor *t = &ins[i];
        int ok = t->dtype == out->dtype && t->ndim == out->ndim;
        for (int j = 0; ok && j < t->ndim; j++)
            ok = j == d || t->shape[j] == out->shape[j];
        if (!ok)
            return tp_fail(err, TP_INVALID, "cat: input %d (%s %s) does not fit output %s %s on dim %d", i,
                           tp_dtype_name(t->dtype), tp_shape_str(s1, sizeof s1, t->ndim, t->shape),
                           tp_dtype_name(out->dtype), tp_shape_str(s2, sizeof s2, out->ndim, out->shape), d);
        total += t->shape[d];
    }
    if (total != out->shape[d])
        return tp_fail(err, TP_INVALID, "cat: inputs add up to %lld along dim %d, output has %lld", (long long)total,
                       d, (long long)out->shape[d]);
    return TP_OK;
}

/* matmul_rows: a row mask INT32/INT64 [B] for x [B, ..., K] and out
 * [B, ..., N], the weight 2-d (the product's own checks are matmul's). */
static inline tp_status tp_check_matmul_rows(const tp_tensor *x, const tp_tensor *w, const tp_tensor *mask,
                                             const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if ((mask->dtype != TP_I32 && mask->dtype != TP_I64) || mask->ndim != 1 || x->ndim < 2 || w->ndim != 2 ||
        out->ndim != x->ndim || mask->shape[0] != x->shape[0] || out->shape[0] != x->shape[0])
        return tp_fail(err, TP_INVALID, "matmul_rows: a %s row mask %s does not fit x %s", tp_dtype_name(mask->dtype),
                       tp_shape_str(s1, sizeof s1, mask->ndim, mask->shape),
                       tp_shape_str(s2, sizeof s2, x->ndim, x->shape));
    return TP_OK;
}

/* attention: q [B,H,S,D], k [B,Hkv,T,D], v [B,Hkv,T,Dv] of out's float
 * dtype give out [B,H,S,Dv], Hkv = H or a divisor of it (GQA,
 * tp_attn_kv_head); the optional key-padding mask (NULL if absent) is
 * INT32/INT64 [B, T] (tp_attn_mask.h). */
static inline tp_status tp_check_attention(const tp_tensor *q, const tp_tensor *k, const tp_tensor *v,
                                           const tp_tensor *mask, const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96], s4[96];
    tp_dtype dt = out->dtype;
    if (q->dtype != dt || k->dtype != dt || v->dtype != dt || !tp_dtype_is_float(dt))
        return tp_fail(err, TP_INVALID, "attention: q, k, v must be float of the output dtype %s",
                       tp_dtype_name(dt));
    int ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && out->ndim == 4;
    ok = ok && k->shape[0] == q->shape[0] && v->shape[0] == q->shape[0] && out->shape[0] == q->shape[0] &&
         out->shape[1] == q->shape[1] && v->shape[1] == k->shape[1] &&
         (k->shape[1] == q->shape[1] || (k->shape[1] > 0 && q->shape[1] % k->shape[1] == 0));
    ok = ok && k->shape[3] == q->shape[3] && v->shape[2] == k->shape[2] && out->shape[2] == q->shape[2] &&
         out->shape[3] == v->shape[3];
    if (!ok)
        return tp_fail(err, TP_INVALID,
                       "attention: q %s, k %s, v %s do not give output %s (k and v: q's B and D, and q's heads "
                       "or a number of heads that divides them)",
                       tp_shape_str(s1, sizeof s1, q->ndim, q->shape), tp_shape_str(s2, sizeof s2, k->ndim, k->shape),
                       tp_shape_str(s3, sizeof s3, v->ndim, v->shape),
                       tp_shape_str(s4, sizeof s4, out->ndim, out->shape));
    if (!mask)
        return TP_OK;
    if (mask->dtype != TP_I32 && mask->dtype != TP_I64)
        return tp_fail(err, TP_INVALID, "attention: the key-padding mask must be INT32 or INT64, got %s",
                       tp_dtype_name(mask->dtype));
    if (mask->ndim != 2 || mask->shape[0] != k->shape[0] || mask->shape[1] != k->shape[2])
        return tp_fail(err, TP_INVALID, "attention: the key-padding mask %s is not [B, T] of k %s",
                       tp_shape_str(s1, sizeof s1, mask->ndim, mask->shape),
                       tp_shape_str(s2, sizeof s2, k->ndim, k->shape));
    return TP_OK;
}

/* The tp_math.h function of a unary op (and its parameter); -1 if op is
 * not one of them. */
static inline int tp_unary_fn_of(tp_op op, const tp_attrs *a, tp_unary_fn *fn, float *p)
{
    *p = 0.0f;
    switch (op) {
    case TP_OP_GELU: *fn = a && a->gelu_tanh ? TP_UN_GELU_TANH : TP_UN_GELU; return 0;
    case TP_OP_SILU: *fn = TP_UN_SILU; return 0;
    case TP_OP_RELU: *fn = TP_UN_RELU; return 0;
    case TP_OP_SQRT: *fn = TP_UN_SQRT; return 0;
    case TP_OP_RSQRT: *fn = TP_UN_RSQRT; return 0;
    case TP_OP_EXP: *fn = TP_UN_EXP; return 0;
    case TP_OP_NEG: *fn = TP_UN_NEG; return 0;
    case TP_OP_TANH: *fn = TP_UN_TANH; return 0;
    case TP_OP_ERF: *fn = TP_UN_ERF; return 0;
    case TP_OP_SIGMOID: *fn = TP_UN_SIGMOID; return 0;
    case TP_OP_POW:
        *fn = TP_UN_POW;
        *p = a ? a->exponent : 1.0f;
        return 0;
    default: return -1;
    }
}

/* reduce_*: a float input, dim in range, out its shape without dim (or
 * with dim as 1). */
static inline tp_status tp_check_reduce(tp_op op, const tp_attrs *a, const tp_tensor *x, const tp_tensor *out,
                                        tp_err *err)
{
    char s1[96], s2[96];
    int d = a ? a->dim : -1, keep = a ? a->keepdim : 0;
    int ok = x->dtype == out->dtype && tp_dtype_is_float(x->dtype) && d >= 0 && d < x->ndim &&
             out->ndim == x->ndim - (keep ? 0 : 1);
    for (int i = 0, j = 0; ok && i < x->ndim; i++) {
        if (i == d && !keep)
            continue;
        ok = out->shape[j++] == (i == d ? 1 : x->shape[i]);
    }
    if (!ok)
        return tp_fail(err, TP_INVALID, "%s: %s %s over dim %d (keepdim %d) does not give %s %s", tp_op_name(op),
                       tp_dtype_name(x->dtype), tp_shape_str(s1, sizeof s1, x->ndim, x->shape), d, keep,
                       tp_dtype_name(out->dtype), tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

/* gather: INT32/INT64 ids, dim in range, out x.shape[:d] + ids.shape +
 * x.shape[d+1:] of x's dtype. */
static inline tp_status tp_check_gather(const tp_attrs *a, const tp_tensor *x, const tp_tensor *ids,
                                        const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96];
    int d = a ? a->dim : 0;
    if (ids->dtype != TP_I32 && ids->dtype != TP_I64)
        return tp_fail(err, TP_INVALID, "gather: ids must be INT32 or INT64, got %s", tp_dtype_name(ids->dtype));
    int ok = x->dtype == out->dtype && d >= 0 && d < x->ndim && out->ndim == x->ndim - 1 + ids->ndim;
    for (int i = 0, j = 0; ok && i < x->ndim; i++) {
        if (i != d) {
            ok = out->shape[j++] == x->shape[i];
            continue;
        }
        for (int k = 0; ok && k < ids->ndim; k++)
            ok = out->shape[j++] == ids->shape[k];
    }
    if (!ok)
        return tp_fail(err, TP_INVALID, "gather: x %s along dim %d with ids %s does not give %s %s",
                       tp_shape_str(s1, sizeof s1, x->ndim, x->shape), d,
                       tp_shape_str(s2, sizeof s2, ids->ndim, ids->shape), tp_dtype_name(out->dtype),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    return TP_OK;
}

/* where: an INT32/INT64 cond, x and y of out's dtype, all three broadcast
 * to out (their strides in st[0..2]). */
static inline tp_status tp_check_where(const tp_tensor *ins, const tp_tensor *out, int64_t st[3][TP_MAX_DIMS],
                                       tp_err *err)
{
    char s1[96], s2[96];
    if (ins[0].dtype != TP_I32 && ins[0].dtype != TP_I64)
        return tp_fail(err, TP_INVALID, "where: cond must be INT32 or INT64, got %s", tp_dtype_name(ins[0].dtype));
    if (ins[1].dtype != out->dtype || ins[2].dtype != out->dtype)
        return tp_fail(err, TP_INVALID, "where: x %s and y %s differ from the output's %s",
                       tp_dtype_name(ins[1].dtype), tp_dtype_name(ins[2].dtype), tp_dtype_name(out->dtype));
    for (int k = 0; k < 3; k++)
        if (tp_broadcast_strides(&ins[k], out->ndim, out->shape, st[k]))
            return tp_fail(err, TP_INVALID, "where: input %d %s does not broadcast to %s", k,
                           tp_shape_str(s1, sizeof s1, ins[k].ndim, ins[k].shape),
                           tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

/* rope: x of out's shape and float dtype, with an even last dim of at
 * least 2; cos and sin of its dtype broadcasting to it. st: the strides
 * of x, cos and sin over out's shape. */
static inline tp_status tp_check_rope(const tp_tensor *ins, const tp_tensor *out, int64_t st[3][TP_MAX_DIMS],
                                      tp_err *err)
{
    char s1[96], s2[96];
    int64_t D = out->ndim > 0 ? out->shape[out->ndim - 1] : 0;
    if (!tp_dtype_is_float(out->dtype) || !tp_tensor_same_shape(&ins[0], out) || D < 2 || D % 2)
        return tp_fail(err, TP_INVALID, "rope: x %s %s must be float, of the output's shape %s, its last dim even",
                       tp_dtype_name(ins[0].dtype), tp_shape_str(s1, sizeof s1, ins[0].ndim, ins[0].shape),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    for (int k = 0; k < 3; k++)
        if (ins[k].dtype != out->dtype || tp_broadcast_strides(&ins[k], out->ndim, out->shape, st[k]))
            return tp_fail(err, TP_INVALID, "rope: input %d %s %s does not broadcast to %s %s", k,
                           tp_dtype_name(ins[k].dtype), tp_shape_str(s1, sizeof s1, ins[k].ndim, ins[k].shape),
                           tp_dtype_name(out->dtype), tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

/* rope's rows, what both backends iterate: out's dims but the last (one
 * dim of 1 for a 1-d out), with the strides there of x, cos, sin (st) and
 * out. Returns the number of dims. */
static inline int tp_rope_rows(const tp_tensor *out, const int64_t st[3][TP_MAX_DIMS], int64_t shape[TP_MAX_DIMS],
                               int64_t rs[4][TP_MAX_DIMS])
{
    int nd = out->ndim - 1;
    for (int d = 0; d < nd; d++) {
        shape[d] = out->shape[d];
        for (int k = 0; k < 3; k++)
            rs[k][d] = st[k][d];
        rs[3][d] = out->stride[d];
    }
    if (nd > 0)
        return nd;
    shape[0] = 1;
    for (int k = 0; k < 4; k++)
        rs[k][0] = 0;
    return 1;
}

/* expand: x broadcast to out's shape, as a view with zero strides. */
static inline tp_status tp_expand_view(const tp_tensor *x, const tp_tensor *out, tp_tensor *view, tp_err *err)
{
    char s1[96], s2[96];
    *view = *out;
    view->data = x->data;
    if (x->dtype != out->dtype || tp_broadcast_strides(x, out->ndim, out->shape, view->stride))
        return tp_fail(err, TP_INVALID, "expand: %s %s does not broadcast to %s %s", tp_dtype_name(x->dtype),
                       tp_shape_str(s1, sizeof s1, x->ndim, x->shape), tp_dtype_name(out->dtype),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

/* cast: same shape, any dtypes. */
static inline tp_status tp_check_cast(const tp_tensor *x, const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if (!tp_tensor_same_shape(x, out))
        return tp_fail(err, TP_INVALID, "cast: input shape %s does not match output %s",
                       tp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

#endif
