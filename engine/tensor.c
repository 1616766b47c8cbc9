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

/* A copy's dims, innermost first, with size-1 dims dropped and each dim
 * folded into the next inner one where both tensors step over the pair
 * as one run: a [B, 4, 32] slice of a [B, 8, 32] tensor copies as B runs
 * of 128 elements instead of 4B runs of 32 (the fused ops' gathers and
 * scatters of the example graph: 64 memcpy calls a step at batch 2). */
typedef struct {
    int nd;
    int64_t n[TP_MAX_DIMS], ds[TP_MAX_DIMS], ss[TP_MAX_DIMS];
} copy_dims;

static void fold_dims(const tp_tensor *dst, const tp_tensor *src, copy_dims *c)
{
    c->nd = 0;
    for (int i = dst->ndim - 1; i >= 0; i--) {
        int64_t n = dst->shape[i];
        if (n == 1)
            continue;
        int j = c->nd - 1;
        if (j >= 0 && dst->stride[i] == c->n[j] * c->ds[j] && src->stride[i] == c->n[j] * c->ss[j]) {
            c->n[j] *= n;
            continue;
        }
        c->n[c->nd] = n;
        c->ds[c->nd] = dst->stride[i];
        c->ss[c->nd] = src->stride[i];
        c->nd++;
    }
}

/* Dim k of c and everything inside it; dim 0 is one memcpy when both
 * sides are unit-stride there. */
static void copy_folded(char *d, const char *s, const copy_dims *c, int k, size_t es)
{
    int64_t n = c->n[k], dstep = c->ds[k] * (int64_t)es, sstep = c->ss[k] * (int64_t)es;
    if (k == 0 && c->ds[0] == 1 && c->ss[0] == 1) {
        memcpy(d, s, (size_t)n * es);
        return;
    }
    for (int64_t i = 0; i < n; i++, d += dstep, s += sstep) {
        if (k == 0)
            memcpy(d, s, es);
        else
            copy_folded(d, s, c, k - 1, es);
    }
}

void tp_tensor_copy(tp_tensor *dst, const tp_tensor *src)
{
    size_t es = tp_dtype_size(src->dtype);
    if (tp_tensor_numel(dst) == 0)
        return;
    copy_dims c;
    fold_dims(dst, src, &c);
    if (c.nd == 0) /* a single element */
        memcpy(dst->data, src->data, es);
    else
        copy_folded(dst->data, src->data, &c, c.nd - 1, es);
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
