/* cpu_ops.c — the cpu backend's op dispatcher, plus the copy ops (cat,
 * reshape, contiguous). The compute kernels live in kernels/cpu/ops_*.c. */
#include <string.h>

#include "ops_internal.h"
#include "common/tp_checks.h"

tp_status cpu_cat(const tp_attrs *attrs, const tp_tensor *ins, int n_ins, tp_tensor *out,
                  tp_err *err)
{
    int d = attrs ? attrs->dim : 0;
    tp_status st = tp_check_cat(d, ins, n_ins, out, err);
    if (st != TP_OK)
        return st;
    int64_t off = 0;
    for (int i = 0; i < n_ins; i++) {
        tp_tensor view = *out; /* out's strides, the input's shape */
        view.data = ops_at(out->data, out->dtype, off * out->stride[d]);
        memcpy(view.shape, ins[i].shape, sizeof view.shape);
        tp_tensor_copy(&view, &ins[i]);
        off += ins[i].shape[d];
    }
    return TP_OK;
}

/* reshape and contiguous: x's elements in row-major order into out. */
tp_status cpu_copy(tp_op op, const tp_tensor *x, tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if (x->dtype != out->dtype || tp_tensor_numel(x) != tp_tensor_numel(out))
        return tp_fail(err, TP_INVALID, "%s: %s %s cannot become %s %s", tp_op_name(op),
                       tp_dtype_name(x->dtype), tp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       tp_dtype_name(out->dtype),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    if (x->data == out->data && tp_tensor_is_contiguous(x))
        return TP_OK; /* already in place */
    tp_tensor dst = tp_tensor_make(out->data, out->dtype, x->ndim, x->shape);
    tp_tensor_copy(&dst, x);
    return TP_OK;
}

tp_status cpu_op_run(tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                     tp_tensor *out, int rank, int world, tp_err *err)
{
    if ((unsigned)op >= TP_OP_COUNT)
        return tp_fail(err, TP_INTERNAL, "cpu backend: unknown op %d", (int)op);
    if (!out || (n_ins > 0 && !ins) || n_ins < tp_op_min_inputs(op) || n_ins > tp_op_max_inputs(op))
        return tp_fail(err, TP_INTERNAL, "cpu backend: %s called with %d inputs (wants %d..%d)",
                       tp_op_name(op), n_ins, tp_op_min_inputs(op), tp_op_max_inputs(op));
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cpu backend: %s output must be contiguous", tp_op_name(op));
    switch (op) {
    case TP_OP_ADD:
    case TP_OP_SUB:
    case TP_OP_MUL:
        return cpu_binary(op, &ins[0], &ins[1], out, err);
    case TP_OP_GELU:
    case TP_OP_SILU:
    case TP_OP_RELU:
        return cpu_unary(op, attrs, &ins[0], out, err);
    case TP_OP_SOFTMAX:
        return cpu_softmax(attrs, &ins[0], out, err);
    case TP_OP_LAYER_NORM:
    case TP_OP_RMS_NORM:
        return cpu_norm(op, attrs, ins, n_ins, out, err);
    case TP_OP_MATMUL:
        return cpu_matmul(attrs, &ins[0], &ins[1], out, err);
    case TP_OP_ATTENTION:
        return cpu_attention(attrs, &ins[0], &ins[1], &ins[2], out, err);
    case TP_OP_EMBEDDING:
        return cpu_embedding(attrs, &ins[0], &ins[1], out, rank, world, err);
    case TP_OP_CAT:
        return cpu_cat(attrs, ins, n_ins, out, err);
    case TP_OP_RESHAPE:
    case TP_OP_CONTIGUOUS:
    case TP_OP_IDENTITY_COPY:
        return cpu_copy(op, &ins[0], out, err);
    default:
        return tp_fail(err, TP_INTERNAL, "cpu backend: op '%s' has no cpu kernel", tp_op_name(op));
    }
}
