#include "io_check.h"

#include <stdio.h>
#include <string.h>

int tp_io_find(const tp_io_desc *io, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(io[i].name, name) == 0)
            return i;
    return -1;
}

const char *tp_io_names(char *buf, size_t len, const tp_io_desc *io, int n)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s'%s'", i ? ", " : "", io[i].name);
    return buf;
}

tp_status tp_io_fail_unknown(tp_err *err, const char *model, const tp_io_desc *io, int n, const char *name)
{
    char names[512];
    return tp_fail(err, TP_INVALID, "unknown input '%s' (model '%s' inputs: %s)", name, model,
                   tp_io_names(names, sizeof names, io, n));
}

tp_status tp_io_fail_missing(tp_err *err, const char *model, const tp_io_desc *io, int n, int missing)
{
    char names[512];
    return tp_fail(err, TP_INVALID, "missing input '%s' (model '%s' inputs: %s)", io[missing].name, model,
                   tp_io_names(names, sizeof names, io, n));
}

tp_status tp_io_fail_repeated(tp_err *err, const char *name)
{
    return tp_fail(err, TP_INVALID, "input '%s' appears more than once", name);
}

tp_status tp_io_check_dtype(const tp_io_desc *d, tp_dtype got, tp_err *err)
{
    if (got == d->dtype)
        return TP_OK;
    return tp_fail(err, TP_INVALID, "input '%s': datatype %s does not match model datatype %s", d->name,
                   tp_dtype_name(got), tp_dtype_name(d->dtype));
}

tp_status tp_io_check_shape(const tp_io_desc *d, int ndim, const int64_t *shape, tp_err *err)
{
    char got[160], want[160];
    int ok = d->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++)
        ok = d->shape[i] < 0 ? shape[i] >= 0 : d->shape[i] == shape[i];
    if (!ok)
        return tp_fail(err, TP_INVALID, "input '%s': shape %s does not match model shape %s", d->name,
                       tp_shape_str(got, sizeof got, ndim, shape), tp_shape_str(want, sizeof want, d->ndim, d->shape));
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        /* a dim the model fixes at 0 is the graph's own business (it runs);
         * an empty batch is not a request */
        if (shape[i] == 0 && d->shape[i] < 0)
            return tp_fail(err, TP_INVALID, "input '%s': shape %s has no elements", d->name,
                           tp_shape_str(got, sizeof got, ndim, shape));
        /* 8: the widest dtype, so every byte count fits */
        if (shape[i] > 0 && n > (INT64_MAX / 8) / shape[i])
            return tp_fail(err, TP_INVALID, "input '%s': shape %s is too large", d->name,
                           tp_shape_str(got, sizeof got, ndim, shape));
        n *= shape[i];
    }
    return TP_OK;
}

tp_status tp_io_check_tensor(const tp_io_desc *d, const tp_host_tensor *t, tp_err *err)
{
    tp_status st = tp_io_check_dtype(d, t->dtype, err);
    if (st == TP_OK)
        st = tp_io_check_shape(d, t->ndim, t->shape, err);
    if (st != TP_OK)
        return st;
    size_t need = tp_dtype_size(t->dtype);
    for (int k = 0; k < t->ndim; k++)
        need *= (size_t)t->shape[k];
    if (t->nbytes == need)
        return TP_OK;
    char got[160];
    return tp_fail(err, TP_INVALID, "input '%s': %zu bytes of data for shape %s %s (needs %zu)", d->name, t->nbytes,
                   tp_shape_str(got, sizeof got, t->ndim, t->shape), tp_dtype_name(t->dtype), need);
}
