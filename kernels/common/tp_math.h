/* tp_math.h — scalar math shared by the CPU kernels and the CUDA kernels.
 *
 * Everything here is TP_HD (static inline in C, __host__ __device__ under
 * nvcc) and uses only <math.h> float functions, so both backends run the same
 * arithmetic. The row functions (softmax, layer_norm, rms_norm over one
 * contiguous row of floats) are built from the scalar pieces above them; the
 * CUDA row kernels reduce in parallel and then call the same pieces.
 *
 * Conventions:
 * - a softmax row whose every element is -inf (fully masked) gives zeros,
 *   not NaN; a NaN anywhere in a row makes the whole row NaN;
 * - norms use two passes (mean, then mean of squared deviations), FP32. */
#ifndef TP_MATH_H
#define TP_MATH_H

#include <math.h>
#include <stdint.h>

#include "dtype.h"

#define TP_SQRT1_2 0.70710678118654752440f
#define TP_SQRT_2_OVER_PI 0.79788456080286535588f
#define TP_GELU_TANH_K 0.044715f

/* ---- activations ---- */

/* x * Phi(x), Phi the standard normal CDF. */
TP_HD float tp_gelu_erf(float x)
{
    return 0.5f * x * (1.0f + erff(x * TP_SQRT1_2));
}

/* The tanh approximation (approximate="tanh"). */
TP_HD float tp_gelu_tanh(float x)
{
    float u = TP_SQRT_2_OVER_PI * (x + TP_GELU_TANH_K * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
}

TP_HD float tp_gelu(float x, int approx_tanh)
{
    return approx_tanh ? tp_gelu_tanh(x) : tp_gelu_erf(x);
}

/* x * sigmoid(x); expf overflow for very negative x gives -0, not NaN. */
TP_HD float tp_silu(float x)
{
    return x / (1.0f + expf(-x));
}

/* NaN propagates (x < 0 is false for NaN). */
TP_HD float tp_relu(float x)
{
    return x < 0.0f ? 0.0f : x;
}

/* ---- softmax pieces ---- */

/* exp(x - m) where m is the row maximum; a fully masked row (m = -inf)
 * contributes zeros instead of exp(-inf - -inf) = NaN. */
TP_HD float tp_softmax_exp(float x, float m)
{
    return m == -INFINITY ? 0.0f : expf(x - m);
}

/* 1/sum of the exponentials; 0 for an empty or fully masked row. */
TP_HD float tp_softmax_inv(float sum)
{
    return sum == 0.0f ? 0.0f : 1.0f / sum;
}

/* ---- normalisation pieces ---- */

/* 1/sqrt(mean_sq + eps); rsqrtf is CUDA-only, so spelled out. */
TP_HD float tp_rstd(float mean_sq, float eps)
{
    return 1.0f / sqrtf(mean_sq + eps);
}

TP_HD float tp_layer_norm_apply(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

TP_HD float tp_rms_norm_apply(float x, float rstd, float w)
{
    return x * rstd * w;
}

/* ---- one contiguous row of floats (y may equal x) ---- */

TP_HD float tp_row_max(const float *x, int64_t n)
{
    float m = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        m = fmaxf(m, x[i]);
    return m;
}

TP_HD float tp_row_sum(const float *x, int64_t n)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++)
        s += x[i];
    return s;
}

/* Sum of (x[i] - c)^2: c = mean gives the variance numerator, c = 0 the
 * sum of squares. */
TP_HD float tp_row_sum_sqdev(const float *x, int64_t n, float c)
{
    float s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float d = x[i] - c;
        s += d * d;
    }
    return s;
}

TP_HD void tp_softmax_row(const float *x, float *y, int64_t n)
{
    float m = tp_row_max(x, n), s = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float e = tp_softmax_exp(x[i], m);
        y[i] = e;
        s += e;
    }
    float inv = tp_softmax_inv(s);
    for (int64_t i = 0; i < n; i++)
        y[i] *= inv;
}

/* w and b may be NULL (1 and 0). */
TP_HD void tp_layer_norm_row(const float *x, const float *w, const float *b, float *y,
                             int64_t n, float eps)
{
    if (n <= 0)
        return;
    float mean = tp_row_sum(x, n) / (float)n;
    float rstd = tp_rstd(tp_row_sum_sqdev(x, n, mean) / (float)n, eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = tp_layer_norm_apply(x[i], mean, rstd, w ? w[i] : 1.0f, b ? b[i] : 0.0f);
}

/* w may be NULL (1). */
TP_HD void tp_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps)
{
    if (n <= 0)
        return;
    float rstd = tp_rstd(tp_row_sum_sqdev(x, n, 0.0f) / (float)n, eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = tp_rms_norm_apply(x[i], rstd, w ? w[i] : 1.0f);
}

#endif
