/* tensor.h — a strided view of memory, the one currency between the engine
 * and every kernel. Views (permute, slice, ...) are tensors with the same data
 * and other strides, never copies; kernels must honour strides on inputs and
 * write outputs contiguously unless told otherwise. */
#ifndef TP_TENSOR_H
#define TP_TENSOR_H

#include <stdint.h>

#include "dtype.h"

#define TP_MAX_DIMS 8

typedef struct tp_tensor {
    void *data; /* address of element [0, 0, ...] */
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    int64_t stride[TP_MAX_DIMS]; /* in elements, not bytes */
} tp_tensor;

int64_t tp_tensor_numel(const tp_tensor *t);
/* Fills row-major strides for t->shape. */
static inline void tp_tensor_set_contiguous(tp_tensor *t)
{
    int64_t s = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        t->stride[i] = s;
        s *= t->shape[i];
    }
}
int tp_tensor_is_contiguous(const tp_tensor *t);
/* Same ndim and sizes (strides and dtypes may differ). */
int tp_tensor_same_shape(const tp_tensor *a, const tp_tensor *b);
/* Builds a contiguous tensor descriptor over data. Inline, as is narrow:
 * a fused op's step builds a dozen views, and out of line each returned
 * its 144 bytes through memory (9% of the example step at batch 2). */
static inline tp_tensor tp_tensor_make(void *data, tp_dtype dt, int ndim, const int64_t *shape)
{
    tp_tensor t = {.data = data, .dtype = dt, .ndim = ndim};
    for (int i = 0; i < ndim; i++)
        t.shape[i] = shape[i];
    tp_tensor_set_contiguous(&t);
    return t;
}

/* t restricted to [start, start + len) along dim: same strides, no copy. */
static inline tp_tensor tp_tensor_narrow(const tp_tensor *t, int dim, int64_t start, int64_t len)
{
    tp_tensor v = *t;
    v.data = (char *)t->data + start * t->stride[dim] * (int64_t)tp_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}
/* Copies src into dst element by element; shapes must match, dtypes must
 * match; either side may be strided. */
void tp_tensor_copy(tp_tensor *dst, const tp_tensor *src);
/* Formats a shape as "[2, 3, 4]" into buf. */
const char *tp_shape_str(char *buf, int len, int ndim, const int64_t *shape);

#endif
