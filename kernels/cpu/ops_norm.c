/* ops_norm.c — softmax (any dim), layer_norm and rms_norm (last dim).
 *
 * Each op runs the tp_math.h row function (through ops_util.c, which
 * builds it in both clones) once per row. An FP32 row with unit stride is
 * read straight from the input; any other row is first widened into an FP32
 * scratch row, and rows are rounded once on store. */
#include <stdlib.h>
#include <string.h>

#include "ops_internal.h"

/* The layout of every dim but d, over x (operand 0) and out (operand 1). */
static void layout_except(ops_layout *l, const tp_tensor *x, const tp_tensor *out, int d)
{
    int64_t shape[TP_MAX_DIMS], sx[TP_MAX_DIMS], so[TP_MAX_DIMS];
    int nd = 0;
    for (int i = 0; i < x->ndim; i++) {
        if (i == d)
            continue;
        shape[nd] = x->shape[i];
        sx[nd] = x->stride[i];
        so[nd] = out->stride[i];
        nd++;
    }
    const int64_t *st[2] = {sx, so};
    ops_layout_init(l, nd, shape, 2, st);
}

static tp_status check_float_same(const char *what, const tp_tensor *x, const tp_tensor *out,
                                  tp_err *err)
{
    char s1[96], s2[96];
    if (x->dtype != out->dtype || !tp_dtype_is_float(x->dtype))
        return tp_fail(err, TP_INVALID, "%s: needs a float input of the output dtype, got %s -> %s",
                       what, tp_dtype_name(x->dtype), tp_dtype_name(out->dtype));
    if (!tp_tensor_same_shape(x, out))
        return tp_fail(err, TP_INVALID, "%s: input shape %s does not match output %s", what,
                       tp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

tp_status cpu_softmax(const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, tp_err *err)
{
    tp_status s = check_float_same("softmax", x, out, err);
    if (s != TP_OK)
        return s;
    if (x->ndim == 0) { /* softmax of one element */
        ops_store_row(out->data, out->dtype, 1, 1, (const float[]){1.0f});
        return TP_OK;
    }
    int d = attrs ? attrs->dim : x->ndim - 1;
    if (d < 0 || d >= x->ndim)
        return tp_fail(err, TP_INVALID, "softmax: dim %d out of range for %d dims", d, x->ndim);
    if (tp_tensor_numel(x) == 0)
        return TP_OK;
    int64_t n = x->shape[d], sx = x->stride[d], so = out->stride[d];
    ops_layout l;
    layout_except(&l, x, out, d);
    int fast = x->dtype == TP_F32 && sx == 1 && so == 1;
    float *row = NULL;
    if (!fast && (s = ops_alloc_f32(&row, (size_t)n, "softmax", err)) != TP_OK)
        return s;
    int64_t rows = ops_layout_count(&l, l.nd);
    ops_pos p;
    memset(&p, 0, sizeof p);
    for (int64_t r = 0; r < rows; r++, ops_pos_next(&l, &p, l.nd)) {
        char *xp = ops_at(x->data, x->dtype, p.off[0]), *op = ops_at(out->data, out->dtype, p.off[1]);
        if (fast) {
            ops_softmax_row((const float *)xp, (float *)op, n);
            continue;
        }
        ops_load_row(xp, x->dtype, sx, n, row);
        ops_softmax_row(row, row, n);
        ops_store_row(op, out->dtype, so, n, row);
    }
    free(row);
    return TP_OK;
}

static tp_status norm_param(const char *what, const char *name, const tp_tensor *t, int64_t n,
                            tp_err *err)
{
    char s1[96];
    if (!tp_dtype_is_float(t->dtype) || tp_tensor_numel(t) != n)
        return tp_fail(err, TP_INVALID, "%s: %s must be a float tensor of %lld elements, got %s %s",
                       what, name, (long long)n, tp_dtype_name(t->dtype),
                       tp_shape_str(s1, sizeof s1, t->ndim, t->shape));
    return TP_OK;
}

/* Runs the row function over every row of x (operand 0) into out (1). */
static void norm_rows(int is_ln, const tp_tensor *x, tp_tensor *out, const float *w,
                      const float *b, float eps, float *row)
{
    int d = x->ndim - 1;
    int64_t n = x->shape[d], sx = x->stride[d];
    ops_layout l;
    layout_except(&l, x, out, d);
    int64_t rows = ops_layout_count(&l, l.nd);
    ops_pos p;
    memset(&p, 0, sizeof p);
    for (int64_t r = 0; r < rows; r++, ops_pos_next(&l, &p, l.nd)) {
        char *xp = ops_at(x->data, x->dtype, p.off[0]), *op = ops_at(out->data, out->dtype, p.off[1]);
        const float *xr = (const float *)xp;
        if (x->dtype != TP_F32 || sx != 1) {
            ops_load_row(xp, x->dtype, sx, n, row);
            xr = row;
        }
        float *yr = out->dtype == TP_F32 ? (float *)op : row;
        if (is_ln)
            ops_layer_norm_row(xr, w, b, yr, n, eps);
        else
            ops_rms_norm_row(xr, w, yr, n, eps);
        if (out->dtype != TP_F32)
            ops_store_row(op, out->dtype, 1, n, yr);
    }
}

tp_status cpu_norm(tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                   tp_tensor *out, tp_err *err)
{
    int is_ln = op == TP_OP_LAYER_NORM;
    const char *what = tp_op_name(op);
    const tp_tensor *x = &ins[0];
    tp_status s = check_float_same(what, x, out, err);
    if (s != TP_OK)
        return s;
    if (x->ndim == 0)
        return tp_fail(err, TP_INVALID, "%s: input must have at least one dim", what);
    int64_t n = x->shape[x->ndim - 1];
    const tp_tensor *w = n_ins > 1 ? &ins[1] : NULL, *b = is_ln && n_ins > 2 ? &ins[2] : NULL;
    if ((w && (s = norm_param(what, "weight", w, n, err)) != TP_OK) ||
        (b && (s = norm_param(what, "bias", b, n, err)) != TP_OK))
        return s;
    if (tp_tensor_numel(x) == 0)
        return TP_OK;
    float eps = attrs ? attrs->eps : (is_ln ? 1e-5f : 1e-6f);
    float *buf; /* weight | bias | row */
    if ((s = ops_alloc_f32(&buf, (size_t)n * 3, what, err)) != TP_OK)
        return s;
    float *wf = w ? buf : NULL, *bf = b ? buf + n : NULL;
    if (w)
        ops_gather_f32(w, wf);
    if (b)
        ops_gather_f32(b, bf);
    norm_rows(is_ln, x, out, wf, bf, eps, buf + 2 * n);
    free(buf);
    return TP_OK;
}
