#include "tensor.h"

#include <stdio.h>
#include <string.h>

int64_t tp_tensor_numel(const tp_tensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

void tp_tensor_set_contiguous(tp_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}

int tp_tensor_is_contiguous(const tp_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        /* size-1 dims may carry any stride */
        if (t->shape[i] != 1 && t->stride[i] != s)
            return 0;
        s *= t->shape[i];
    }
    return 1;
}

int tp_tensor_same_shape(const tp_tensor *a, const tp_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

tp_tensor tp_tensor_make(void *data, tp_dtype dt, int ndim, const int64_t *shape)
{
    tp_tensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.dtype = dt;
    t.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    tp_tensor_set_contiguous(&t);
    return t;
}

tp_tensor tp_tensor_narrow(const tp_tensor *t, int dim, int64_t start, int64_t len)
{
    tp_tensor v = *t;
    v.data = (char *)t->data + start * t->stride[dim] * (int64_t)tp_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

/* Copies the innermost dim as one memcpy when both sides are unit-stride
 * there, which is the common case for slices and permutes of outer dims. */
static void copy_rec(char *d, const char *s, const tp_tensor *dst, const tp_tensor *src,
                     int dim, size_t es)
{
    int64_t n = dst->shape[dim];
    if (dim == dst->ndim - 1) {
        if (dst->stride[dim] == 1 && src->stride[dim] == 1) {
            memcpy(d, s, (size_t)n * es);
            return;
        }
        for (int64_t i = 0; i < n; i++)
            memcpy(d + i * dst->stride[dim] * (int64_t)es, s + i * src->stride[dim] * (int64_t)es, es);
        return;
    }
    for (int64_t i = 0; i < n; i++)
        copy_rec(d + i * dst->stride[dim] * (int64_t)es, s + i * src->stride[dim] * (int64_t)es,
                 dst, src, dim + 1, es);
}

void tp_tensor_copy(tp_tensor *dst, const tp_tensor *src)
{
    size_t es = tp_dtype_size(src->dtype);
    if (tp_tensor_numel(dst) == 0)
        return;
    if (dst->ndim == 0) {
        memcpy(dst->data, src->data, es);
        return;
    }
    if (tp_tensor_is_contiguous(dst) && tp_tensor_is_contiguous(src)) {
        memcpy(dst->data, src->data, (size_t)tp_tensor_numel(src) * es);
        return;
    }
    copy_rec(dst->data, src->data, dst, src, 0, es);
}

const char *tp_shape_str(char *buf, int len, int ndim, const int64_t *shape)
{
    int off = snprintf(buf, (size_t)len, "[");
    for (int i = 0; i < ndim && off < len; i++)
        off += snprintf(buf + off, (size_t)(len - off), "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (off < len)
        snprintf(buf + off, (size_t)(len - off), "]");
    return buf;
}
