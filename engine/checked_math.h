/* checked_math.h — overflow-checked int64 arithmetic for every size that
 * comes from a graph file or a request (shapes, element counts, offsets).
 *
 * Signed overflow is undefined behaviour and, in a bounds check, a way past
 * it (slice start INT64_MAX + length wraps negative). So shape arithmetic on
 * untrusted numbers goes through these helpers, and every node's shape is
 * bounded by TP_MAX_ELEMENTS once inferred: below that bound, strides,
 * offsets, byte counts and the small factors the engine multiplies by
 * (world_size <= 1024, dtype size <= 8) cannot overflow int64. */
#ifndef TP_CHECKED_MATH_H
#define TP_CHECKED_MATH_H

#include <stdint.h>

/* 2^48 elements: far beyond any device, far below int64 / (1024 * 8). */
#define TP_MAX_ELEMENTS (INT64_C(1) << 48)

/* *out = a * b; returns 0, or -1 on overflow (then *out is unspecified). */
static inline int tp_mul_i64(int64_t a, int64_t b, int64_t *out)
{
    return __builtin_mul_overflow(a, b, out) ? -1 : 0;
}

/* *out = a + b; returns 0, or -1 on overflow. */
static inline int tp_add_i64(int64_t a, int64_t b, int64_t *out)
{
    return __builtin_add_overflow(a, b, out) ? -1 : 0;
}

/* 0 when every dim is >= 0 and the product of the dims, zero-size dims
 * counted as 1 (so strides, which skip nothing for them, stay bounded too),
 * is at most TP_MAX_ELEMENTS; else -1. */
static inline int tp_shape_bounded(int ndim, const int64_t *shape)
{
    int64_t extent = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0 || tp_mul_i64(extent, shape[i] ? shape[i] : 1, &extent) != 0 ||
            extent > TP_MAX_ELEMENTS)
            return -1;
    }
    return 0;
}

#endif
