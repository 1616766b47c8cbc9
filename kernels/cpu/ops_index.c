/* ops_index.c — the cpu kernels that move elements by index: reduce_mean /
 * reduce_sum over one dim, gather along a dim, expand (broadcast copy).
 * Their index math is kernels/common/tp_cuda_plan.h's (tp_reduce_plan,
 * tp_gather_plan), the same the cuda kernels run. */
#include <string.h>

#include "common/tp_checks.h"
#include "common/tp_math.h"
#include "ops_internal.h"

/* Sums in FP32 in index order, as the cuda kernel does. */
tp_status cpu_reduce(tp_op op, const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, tp_err *err)
{
    tp_status s = tp_check_reduce(op, attrs, x, out, err);
    if (s != TP_OK)
        return s;
    int64_t n_out = tp_tensor_numel(out);
    if (n_out == 0)
        return TP_OK;
    tp_reduce_plan p;
    tp_reduce_plan_init(&p, x, attrs->dim);
    int mean = op == TP_OP_REDUCE_MEAN;
    for (int64_t i = 0; i < n_out; i++) {
        int64_t base = tp_reduce_base(&p, i);
        float sum = 0.0f;
        for (int64_t k = 0; k < p.n; k++)
            sum += tp_load_f32(x->data, x->dtype, base + k * p.sd);
        tp_store_f32(out->data, out->dtype, i, tp_reduce_finish(sum, p.n, mean));
    }
    return TP_OK;
}

static int64_t id_at(const tp_tensor *ids, int64_t off)
{
    return ids->dtype == TP_I32 ? (int64_t)((const int32_t *)ids->data)[off] : ((const int64_t *)ids->data)[off];
}

/* An id outside [-n, n) fails naming the id and its position (nothing of
 * the output is promised then). */
tp_status cpu_gather(const tp_attrs *attrs, const tp_tensor *x, const tp_tensor *ids, tp_tensor *out, tp_err *err)
{
    tp_status s = tp_check_gather(attrs, x, ids, out, err);
    if (s != TP_OK)
        return s;
    int64_t n_out = tp_tensor_numel(out);
    if (n_out == 0)
        return TP_OK;
    tp_gather_plan p;
    tp_gather_plan_init(&p, x, attrs ? attrs->dim : 0, ids);
    for (int64_t j = 0; j < p.n_ids; j++) { /* every id checked before any is used */
        int64_t id = id_at(ids, tp_layout_offset(&p.ids, 0, j));
        if (tp_gather_index(&p, id) < 0)
            return tp_fail(err, TP_INVALID, "gather: id %lld (position %lld) is outside [-%lld, %lld)",
                           (long long)id, (long long)j, (long long)p.n, (long long)p.n);
    }
    size_t es = tp_dtype_size(x->dtype);
    for (int64_t i = 0; i < n_out; i++) {
        int64_t index = tp_gather_index(&p, id_at(ids, tp_layout_offset(&p.ids, 0, tp_gather_slot(&p, i))));
        memcpy(ops_at(out->data, out->dtype, i), ops_at(x->data, x->dtype, tp_gather_src(&p, i, index)), es);
    }
    return TP_OK;
}

tp_status cpu_expand(const tp_tensor *x, tp_tensor *out, tp_err *err)
{
    tp_tensor src;
    tp_status s = tp_expand_view(x, out, &src, err);
    if (s != TP_OK)
        return s;
    tp_tensor_copy(out, &src);
    return TP_OK;
}
