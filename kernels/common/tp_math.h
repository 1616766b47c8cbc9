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

/* ---- exp, tanh, erf ----
 *
 * Our own, not libm's: glibc's expf, tanhf (through expm1f) and erff are
 * calls the compiler cannot vectorize, and they were most of a transformer
 * block's time on the cpu backend (GPT-2's tanh GELU: 56% of the server's
 * CPU in __expm1f and __tanhf). These are straight-line float arithmetic
 * with selects instead of branches, so a loop over them vectorizes, and
 * both backends run this code (nvcc fuses multiply-adds by default, so a
 * GPU's last bit may differ: fewer roundings, but only the CPU's results
 * are checked here). Their polynomials are evaluated with fmaf, one
 * rounding per step: the CPU clones that run them (x86-64-v3 and v4,
 * ops_internal.h) have the instruction, and it halved the operations of a
 * Horner step (the erf GELU: 1.12 -> 0.87-0.95 ns an element with
 * AVX-512). Accuracy against the correctly rounded
 * value, checked by tests/unit/test_math.c on a dense sample and by `make
 * test-math-exhaustive` on every FP32: tp_expf <= 2 ulp, tp_tanhf and
 * tp_erff <= 3 ulp (libm's are within 1-2). NaN in, NaN out; infinities
 * and underflow as libm. */

/* Always inlined on the host: a loop that calls one out of line (GCC
 * judged tp_erff, then tp_gelu_erf around it, too big) does not
 * vectorize. For these and everything built on them. */
#ifdef __CUDACC__
#define TP_HD_FLAT TP_HD
#else
#define TP_HD_FLAT static inline __attribute__((always_inline))
#endif

/* A union, not memcpy: GCC vectorizes a loop through this only so. */
TP_HD_FLAT float tp_f32_bits(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    union {
        uint32_t u;
        float f;
    } v = {u};
    return v.f;
#endif
}

/* nvcc's device pass, clang, GCC. nvcc's host pass gets none: its front
 * end knows neither GCC's pragma (warning 1675, "unrecognized GCC pragma",
 * in every build's output) nor one of its own for host code, and no hot
 * loop runs that host copy: the cpu backend's copy is built by GCC or
 * clang from .c files. */
#if defined(__CUDA_ARCH__)
#define TP_UNROLL_ALL _Pragma("unroll")
#elif defined(__CUDACC__)
#define TP_UNROLL_ALL
#elif defined(__clang__)
#define TP_UNROLL_ALL _Pragma("clang loop unroll(full)")
#else
#define TP_UNROLL_ALL _Pragma("GCC unroll 16")
#endif

/* c[0] x^(n-1) + c[1] x^(n-2) + ... + c[n-1] by Horner's rule, one fmaf
 * (one rounding) a step, highest degree first; 1 <= n <= 16. The loop must
 * unroll completely (TP_UNROLL_ALL; n and c are constants where it is
 * called): GCC left as a loop does not vectorize a row loop over the
 * functions below, and the erf GELU went from 0.41 to 4.3 ns an element. */
TP_HD_FLAT float tp_horner(float x, const float *c, int n)
{
    float p = c[0];
    TP_UNROLL_ALL for (int i = 1; i < n; i++)
        p = fmaf(p, x, c[i]);
    return p;
}

/* e^x = 2^k e^r, k = round(x / ln 2), r = x - k ln 2 (ln 2 in two parts,
 * the first of 9 significant bits, so k times it is exact), |r| <= ln 2 / 2; e^r
 * by its Taylor polynomial to r^7 (truncation 5e-9 relative). 2^k is
 * applied as two factors so k down to -150 (subnormal results) and up to
 * 128 (overflow to inf) never leaves the exponent range. */
TP_HD_FLAT float tp_expf(float x)
{
    const float round_magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float xc = x < -104.0f ? -104.0f : x > 89.0f ? 89.0f : x == x ? x : 0.0f; /* no NaN to int */
    float k = (xc * 1.44269504088896341f + round_magic) - round_magic;
    float r = xc - k * 0.693359375f;
    r = r - k * -2.12194440e-4f;
    const float c[] = {1.98412698e-4f, 1.38888889e-3f, 8.33333333e-3f, 4.16666667e-2f,
                       1.66666667e-1f, 0.5f, 1.0f, 1.0f};
    float p = tp_horner(r, c, 8);
    int32_t ki = (int32_t)k, k1 = ki / 2, k2 = ki - k1;
    float y = p * tp_f32_bits((uint32_t)(k1 + 127) << 23) * tp_f32_bits((uint32_t)(k2 + 127) << 23);
    return x != x ? x : y;
}

/* Below 0.55 the odd Taylor series to x^21 (cancellation-free there; the
 * terms shrink by ~0.12 each), above it 1 - 2 / (e^2|x| + 1), which
 * reaches exactly 1 once e^2|x| dwarfs 2 (and at infinity). */
TP_HD_FLAT float tp_tanhf(float x)
{
    float a = fabsf(x), z = x * x;
    const float c[] = {9.69153796e-5f, -2.39129114e-4f, 5.90027440e-4f, -1.45583439e-3f,
                       3.59212803e-3f, -8.86323552e-3f, 2.18694885e-2f, -5.39682540e-2f,
                       1.33333333e-1f, -3.33333333e-1f};
    float t = tp_horner(z, c, 10);
    float small = fmaf(a * z, t, a);
    float large = 1.0f - 2.0f / (tp_expf(2.0f * a) + 1.0f);
    return copysignf(a < 0.55f ? small : large, x); /* odd, and -0 stays -0 */
}

/* The piece of [0.85, 3.93) a is in: v0 below 1.6, v1 below 2.5, else v2
 * (selects, not branches, so a loop over tp_erff stays vectorized). */
#define TP_ERF_PIECE0_END 1.6f

TP_HD_FLAT float tp_erf_piece(float a, float v0, float v1, float v2)
{
    return a < TP_ERF_PIECE0_END ? v0 : a < 2.5f ? v1 : v2;
}

/* Below TP_ERF_TAYLOR_END (0.85) the Taylor series 2/sqrt(pi) sum
 * (-1)^n x^(2n+1) / (n! (2n+1)) to n = 11 (the next term is under 1e-9).
 * From 0.85 to 3.93 one of three degree-8 polynomials in u = (|x| -
 * centre) * (1 / half-width), its coefficients picked per element
 * (scripts/gen_erf_coeffs.py: Chebyshev fits rounded to float, ~1 ulp
 * evaluated in float); from 3.93 on erf is 1 in float. It replaced 1 -
 * erfc with Numerical Recipes' erfcc (a division, a degree-9 polynomial
 * and an exp): a GELU element cost 1.8 ns with AVX-512, most of it that
 * branch. The two ranges are functions of their own so a kernel that
 * knows a block of x is all in the first can skip the second (the cpu
 * GELU): tp_erff is exactly the select of the two. */
#define TP_ERF_TAYLOR_END 0.85f

/* erf(x) for |x| < TP_ERF_TAYLOR_END; z = x * x. */
TP_HD_FLAT float tp_erf_taylor(float x, float z)
{
    const float c[] = {-1.22905553e-9f, 1.48071928e-8f, -1.63658447e-7f, 1.64621144e-6f,
                       -1.49256504e-5f, 1.20553330e-4f, -8.54832702e-4f, 5.22397762e-3f,
                       -2.68661706e-2f, 1.12837917e-1f, -3.76126389e-1f, 1.12837917f};
    return x * tp_horner(z, c, 12);
}

/* erf(x) for |x| >= TP_ERF_TAYLOR_END (and NaN); a = |x|, its piece
 * picked by at: a itself, or a constant under TP_ERF_PIECE0_END where a
 * kernel knows a block of a is all below it (the selects then fold to the
 * first piece's coefficients, with the same bits). */
TP_HD_FLAT float tp_erf_pieces_at(float x, float a, float at)
{
    float u = (a - tp_erf_piece(at, 1.22500002f, 2.04999995f, 3.21499991f)) *
              tp_erf_piece(at, 2.66666675f, 2.22222233f, 1.39860141f);
    float p = tp_erf_piece(at, -2.17759498e-06f, 2.4155338e-06f, -6.078963e-06f);
    p = fmaf(p, u, tp_erf_piece(at, 5.18827846e-06f, -1.05102972e-05f, 2.11005281e-05f));
    p = fmaf(p, u, tp_erf_piece(at, 5.70888478e-05f, -4.93475682e-06f, -4.12609807e-05f));
    p = fmaf(p, u, tp_erf_piece(at, -0.000373332936f, 0.000241164802f, 6.79987643e-05f));
    p = fmaf(p, u, tp_erf_piece(at, -1.23312111e-06f, -0.00127820217f, -9.05380075e-05f));
    p = fmaf(p, u, tp_erf_piece(at, 0.00885151792f, 0.00379637349f, 8.82264139e-05f));
    p = fmaf(p, u, tp_erf_piece(at, -0.0433451571f, -0.00700665871f, -6.01625616e-05f));
    p = fmaf(p, u, tp_erf_piece(at, 0.0943567902f, 0.0075953044f, 2.61328114e-05f));
    p = fmaf(p, u, tp_erf_piece(at, 0.916799724f, 0.99625808f, 0.999994576f));
    /* NaN fails the comparison and stays NaN through p */
    return copysignf(a >= 3.93f ? 1.0f : p, x);
}

/* erf(x), the pieces' coefficients picked by at (tp_erf_pieces_at) */
TP_HD_FLAT float tp_erf_at(float x, float at)
{
    float a = fabsf(x);
    float small = tp_erf_taylor(x, x * x);
    float large = tp_erf_pieces_at(x, a, at);
    return a < TP_ERF_TAYLOR_END ? small : large;
}

TP_HD_FLAT float tp_erff(float x)
{
    return tp_erf_at(x, fabsf(x));
}

/* ---- activations ---- */

/* x * Phi(x) given e = erf(x / sqrt(2)): the one spelling of it, so every
 * GELU below rounds the same way. */
TP_HD_FLAT float tp_gelu_from_erf(float x, float e)
{
    return 0.5f * x * (1.0f + e);
}

/* x * Phi(x), Phi the standard normal CDF. */
TP_HD_FLAT float tp_gelu_erf(float x)
{
    return tp_gelu_from_erf(x, tp_erff(x * TP_SQRT1_2));
}

/* Whether tp_gelu_erf(x) takes erf's Taylor range; where it does,
 * tp_gelu_erf_taylor(x) is its value, bit for bit, without the pieces. */
TP_HD_FLAT int tp_gelu_erf_is_taylor(float x)
{
    return fabsf(x * TP_SQRT1_2) < TP_ERF_TAYLOR_END;
}

TP_HD_FLAT float tp_gelu_erf_taylor(float x)
{
    float t = x * TP_SQRT1_2;
    return tp_gelu_from_erf(x, tp_erf_taylor(t, t * t));
}

/* Whether tp_gelu_erf(x) takes erf's Taylor range or its first piece;
 * where it does, tp_gelu_erf_low(x) is its value, bit for bit, without
 * picking among the pieces. */
TP_HD_FLAT int tp_gelu_erf_is_low(float x)
{
    return fabsf(x * TP_SQRT1_2) < TP_ERF_PIECE0_END;
}

TP_HD_FLAT float tp_gelu_erf_low(float x)
{
    return tp_gelu_from_erf(x, tp_erf_at(x * TP_SQRT1_2, 0.0f));
}

/* The tanh approximation (approximate="tanh"), 0.5 x (1 + tanh(u)), as
 * the equal x sigmoid(2u) = x / (1 + e^-2u): one exp and one division,
 * where tp_tanhf takes its polynomial and its exp for every element (GELU
 * was 2.6% of a GPT-2 step). Within a few ulp of 0.5 x (1 + tanh(u)) in
 * double, sigmoid having no cancellation; for very negative x, e^-2u
 * overflows to infinity and the quotient is -0 (at -inf NaN, as the
 * tanh form gives). */
TP_HD_FLAT float tp_gelu_tanh(float x)
{
    float u = TP_SQRT_2_OVER_PI * (x + TP_GELU_TANH_K * x * x * x);
    return x / (1.0f + tp_expf(-2.0f * u));
}

TP_HD_FLAT float tp_gelu(float x, int approx_tanh)
{
    return approx_tanh ? tp_gelu_tanh(x) : tp_gelu_erf(x);
}

/* x * sigmoid(x); expf overflow for very negative x gives -0, not NaN. */
TP_HD_FLAT float tp_silu(float x)
{
    return x / (1.0f + tp_expf(-x));
}

/* NaN propagates (x < 0 is false for NaN). */
TP_HD float tp_relu(float x)
{
    return x < 0.0f ? 0.0f : x;
}

TP_HD_FLAT float tp_sigmoid(float x)
{
    return 1.0f / (1.0f + tp_expf(-x));
}

/* x^p for a constant p: 2, 3, 1 and -1 as x*x, x*x*x, x and 1/x (what
 * onnxruntime computes for 2 and 3; x*x and 1/x are correctly rounded,
 * powf need not be), any other p by powf (so 0.5 keeps pow's signed zero
 * and infinities, which sqrtf does not). */
TP_HD float tp_pow_const(float x, float p)
{
    if (p == 2.0f)
        return x * x;
    if (p == -1.0f)
        return 1.0f / x;
    if (p == 1.0f)
        return x;
    if (p == 3.0f)
        return x * x * x;
    return powf(x, p);
}

/* The elementwise functions of one float, one name each, so both backends
 * pick the same arithmetic. P is the op's parameter (pow's exponent). */
#define TP_UNARY_FN_LIST(X)                     \
    X(TP_UN_GELU, tp_gelu_erf(x))               \
    X(TP_UN_GELU_TANH, tp_gelu_tanh(x))         \
    X(TP_UN_SILU, tp_silu(x))                   \
    X(TP_UN_RELU, tp_relu(x))                   \
    X(TP_UN_SQRT, sqrtf(x))                     \
    X(TP_UN_RSQRT, 1.0f / sqrtf(x))             \
    X(TP_UN_EXP, tp_expf(x))                    \
    X(TP_UN_NEG, -x)                            \
    X(TP_UN_TANH, tp_tanhf(x))                  \
    X(TP_UN_ERF, tp_erff(x))                    \
    X(TP_UN_SIGMOID, tp_sigmoid(x))             \
    X(TP_UN_POW, tp_pow_const(x, p))

typedef enum {
#define TP_UN_ENUM(name, expr) name,
    TP_UNARY_FN_LIST(TP_UN_ENUM)
#undef TP_UN_ENUM
} tp_unary_fn;

/* f(x). Called with a constant f (a template argument, a switch case) the
 * switch folds away. */
TP_HD_FLAT float tp_unary(tp_unary_fn f, float x, float p)
{
    (void)p;
    switch (f) {
#define TP_UN_CASE(name, expr) case name: return expr;
        TP_UNARY_FN_LIST(TP_UN_CASE)
#undef TP_UN_CASE
    }
    return x;
}

/* ---- cast ---- */

TP_HD int tp_is_int_dtype(tp_dtype t) { return t == TP_I32 || t == TP_I64; }

/* A float as an integer of [lo, hi]: truncated toward zero, saturated at
 * the ends, NaN as 0 (C leaves all three undefined). lo and hi are powers
 * of two (or their negation minus one), exact in float. */
TP_HD int64_t tp_float_to_int(float f, float lo, float hi_excl, int64_t lo_i, int64_t hi_i)
{
    if (f != f)
        return 0;
    if (f < lo)
        return lo_i;
    if (f >= hi_excl)
        return hi_i;
    return (int64_t)f;
}

/* dst[di] = src[si] converted: integers between themselves exactly (INT64
 * -> INT32 wraps, two's complement, as NumPy's astype); floats to integers
 * by tp_float_to_int; everything else through FP32, rounded to nearest
 * even once on store (an INT64 beyond 2^24 first rounds to FP32). */
TP_HD void tp_cast_elem(void *dst, tp_dtype dt, int64_t di, const void *src, tp_dtype st, int64_t si)
{
    if (tp_is_int_dtype(st)) {
        int64_t v = st == TP_I32 ? (int64_t)((const int32_t *)src)[si] : ((const int64_t *)src)[si];
        if (dt == TP_I32)
            ((int32_t *)dst)[di] = (int32_t)(uint32_t)(uint64_t)v;
        else if (dt == TP_I64)
            ((int64_t *)dst)[di] = v;
        else
            tp_store_f32(dst, dt, di, (float)v);
        return;
    }
    float f = tp_load_f32(src, st, si);
    if (dt == TP_I32)
        ((int32_t *)dst)[di] = (int32_t)tp_float_to_int(f, -2147483648.0f, 2147483648.0f, INT32_MIN, INT32_MAX);
    else if (dt == TP_I64)
        ((int64_t *)dst)[di] = tp_float_to_int(f, -9223372036854775808.0f, 9223372036854775808.0f, INT64_MIN,
                                               INT64_MAX);
    else
        tp_store_f32(dst, dt, di, f);
}

/* ---- rotary embedding ---- */

/* Element i of rope over a row of D = 2h (ops.c): x[i] cos[i] + r sin[i],
 * r = -x[i + h] for i < h (second_half 0) and x[i - h] past it; partner
 * is that other x. Two products and their sum, each rounded, as the
 * decomposed graph's mul, mul and add round them (neg is exact): the same
 * bits on the cpu, where C11 does not contract them into an FMA (nvcc may,
 * within the tests' tolerance). */
TP_HD_FLAT float tp_rope(float x, float partner, float c, float s, int second_half)
{
    float r = second_half ? partner : -partner;
    float a = x * c, b = r * s;
    return a + b;
}

/* ---- reductions ---- */

TP_HD float tp_reduce_finish(float sum, int64_t n, int mean)
{
    return mean ? sum / (float)n : sum;
}

/* ---- softmax pieces ---- */

/* exp(x - m) where m is the row maximum; a fully masked row (m = -inf)
 * contributes zeros instead of exp(-inf - -inf) = NaN. */
TP_HD_FLAT float tp_softmax_exp(float x, float m)
{
    float e = tp_expf(x - m); /* computed either way: a select, not a branch */
    return m == -INFINITY ? 0.0f : e;
}

/* 1/sum of the exponentials; 0 for an empty or fully masked row. */
TP_HD_FLAT float tp_softmax_inv(float sum)
{
    return sum == 0.0f ? 0.0f : 1.0f / sum;
}

/* ---- normalisation pieces ---- */

/* 1/sqrt(mean_sq + eps); rsqrtf is CUDA-only, so spelled out. */
TP_HD_FLAT float tp_rstd(float mean_sq, float eps)
{
    return 1.0f / sqrtf(mean_sq + eps);
}

TP_HD_FLAT float tp_layer_norm_apply(float x, float mean, float rstd, float w, float b)
{
    return (x - mean) * rstd * w + b;
}

TP_HD_FLAT float tp_rms_norm_apply(float x, float rstd, float w)
{
    return x * rstd * w;
}

/* ---- one contiguous row of floats (y may equal x) ---- */

/* The row functions work in TP_ROW_LANES interleaved lanes wherever they
 * reduce, so their loops vectorize. */
#define TP_ROW_LANES 8

/* A NaN never becomes the maximum (as with fmaxf): it reaches the row
 * through its own exponential instead. Compares, not fmaxf (a call), in
 * lanes. */
TP_HD_FLAT float tp_row_max(const float *x, int64_t n)
{
    float lane[TP_ROW_LANES], m = -INFINITY;
    for (int j = 0; j < TP_ROW_LANES; j++)
        lane[j] = -INFINITY;
    int64_t i = 0;
    for (; i + TP_ROW_LANES <= n; i += TP_ROW_LANES)
        for (int j = 0; j < TP_ROW_LANES; j++)
            lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
    for (; i < n; i++)
        m = x[i] > m ? x[i] : m;
    for (int j = 0; j < TP_ROW_LANES; j++)
        m = lane[j] > m ? lane[j] : m;
    return m;
}

/* Sums run in the lanes, added pairwise at the end: the lanes are
 * independent, so the loop vectorizes (one running sum cannot be reordered
 * without -ffast-math), and the error grows with n/8, not n. Written out
 * for TP_ROW_LANES = 8. */
TP_HD_FLAT float tp_lanes_total(const float *lane, float tail)
{
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7])) + tail;
}

TP_HD_FLAT float tp_row_sum(const float *x, int64_t n)
{
    float lane[TP_ROW_LANES] = {0}, tail = 0.0f;
    int64_t i = 0;
    for (; i + TP_ROW_LANES <= n; i += TP_ROW_LANES)
        for (int j = 0; j < TP_ROW_LANES; j++)
            lane[j] += x[i + j];
    for (; i < n; i++)
        tail += x[i];
    return tp_lanes_total(lane, tail);
}

/* Sum of (x[i] - c)^2: c = mean gives the variance numerator, c = 0 the
 * sum of squares. Lanes as tp_row_sum. */
TP_HD_FLAT float tp_row_sum_sqdev(const float *x, int64_t n, float c)
{
    float lane[TP_ROW_LANES] = {0}, tail = 0.0f;
    int64_t i = 0;
    for (; i + TP_ROW_LANES <= n; i += TP_ROW_LANES)
        for (int j = 0; j < TP_ROW_LANES; j++) {
            float d = x[i + j] - c;
            lane[j] += d * d;
        }
    for (; i < n; i++) {
        float d = x[i] - c;
        tail += d * d;
    }
    return tp_lanes_total(lane, tail);
}

/* Three passes (exponentials, their sum, the scaling) rather than one, so
 * the first and last vectorize; y may be x. */
TP_HD_FLAT void tp_softmax_row(const float *x, float *y, int64_t n)
{
    float m = tp_row_max(x, n);
    for (int64_t i = 0; i < n; i++)
        y[i] = tp_softmax_exp(x[i], m);
    float inv = tp_softmax_inv(tp_row_sum(y, n));
    for (int64_t i = 0; i < n; i++)
        y[i] *= inv;
}

/* w and b may be NULL (1 and 0). */
TP_HD_FLAT void tp_layer_norm_row(const float *x, const float *w, const float *b, float *y,
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
TP_HD_FLAT void tp_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps)
{
    if (n <= 0)
        return;
    float rstd = tp_rstd(tp_row_sum_sqdev(x, n, 0.0f) / (float)n, eps);
    for (int64_t i = 0; i < n; i++)
        y[i] = tp_rms_norm_apply(x[i], rstd, w ? w[i] : 1.0f);
}

#endif
