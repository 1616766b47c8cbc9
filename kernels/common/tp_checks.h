/* tp_checks.h — argument checks every backend's kernels repeat before
 * touching memory (shape inference already validated the graph; these keep
 * a kernel safe when called directly). Header-only, shared by cpu and cuda. */
#ifndef TP_CHECKS_H
#define TP_CHECKS_H

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

#endif
