/* test_math.c — tp_math.h's own exp, tanh and erf: within their stated ulp
 * of the correctly rounded value (libm in double, rounded once, is the
 * reference) on a dense sample of FP32 patterns and at every edge; the
 * special values as libm gives them; and the cpu kernels' vectorized loops
 * (an AVX-512 or AVX2 clone where the CPU has one) give the very bits of
 * the scalar functions (the CUDA kernels run the element ones). `make
 * test-math-exhaustive` checks every FP32 pattern. */
#include <check.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "common/tp_checks.h"
#include "common/tp_math.h"
#include "cpu/cpu_ops.h"
#include "ops.h"

/* The bounds tp_math.h states (its exhaustive maxima: 1.22, 1.52 and 2.76
 * ulp, rounded up to whole ulps). */
#define EXP_MAX_ULP 2.0
#define TANH_MAX_ULP 3.0
#define ERF_MAX_ULP 3.0

/* Every SAMPLE_STEP-th pattern: about 1.05 million, in well under a
 * second; a prime step so the sample walks every mantissa bit. TP_MATH_STEP
 * overrides it (`make test-math-exhaustive`: 1, every pattern). */
#define SAMPLE_STEP 4093u

static uint64_t sample_step(void)
{
    const char *e = getenv("TP_MATH_STEP");
    long v = e ? strtol(e, NULL, 10) : 0;
    return v > 0 ? (uint64_t)v : SAMPLE_STEP;
}

/* |y - r| in units of the last place of r rounded to FP32 (subnormals:
 * 2^-149). A result libm would round to infinity must be that infinity. */
static double ulp_error(float y, double r)
{
    if (isnan(r))
        return isnan(y) ? 0.0 : INFINITY;
    if (fabs(r) > FLT_MAX || isinf(y))
        return y == (float)r ? 0.0 : INFINITY;
    double a = fabs(r), ulp = ldexp(1.0, -149);
    if (a >= FLT_MIN) {
        int e;
        frexp(a, &e);
        ulp = ldexp(1.0, e - 24);
    }
    return fabs((double)y - r) / ulp;
}

typedef struct {
    const char *name;
    float (*f)(float);
    double (*ref)(double);
    double max_ulp;
} math_fn;

static float fexp(float x) { return tp_expf(x); }
static float ftanh(float x) { return tp_tanhf(x); }
static float ferf(float x) { return tp_erff(x); }

static const math_fn FNS[] = {
    {"exp", fexp, exp, EXP_MAX_ULP},
    {"tanh", ftanh, tanh, TANH_MAX_ULP},
    {"erf", ferf, erf, ERF_MAX_ULP},
};

/* The worst error seen so far (Check's assertions mark a point through a
 * pipe per call: far too slow for 2^32 of them, so the loops only track). */
typedef struct {
    double ulp;
    float x, y;
} worst;

static void track(const math_fn *m, float x, worst *w)
{
    float y = m->f(x);
    double e = ulp_error(y, m->ref((double)x));
    if (!(e <= w->ulp)) { /* NaN errors never come from ulp_error */
        w->ulp = e;
        w->x = x;
        w->y = y;
    }
}

static void assert_within(const math_fn *m, const worst *w)
{
    ck_assert_msg(w->ulp <= m->max_ulp, "%s(%a) = %a, libm %a: %.2f ulp (bound %.0f)", m->name,
                  (double)w->x, (double)w->y, m->ref((double)w->x), w->ulp, m->max_ulp);
}

START_TEST(within_bound_on_a_dense_sample)
{
    const math_fn *m = &FNS[_i];
    uint64_t step = sample_step();
    worst w = {0, 0, 0};
    for (uint64_t u = 0; u <= 0xffffffffu; u += step)
        track(m, tp_f32_bits((uint32_t)u), &w);
    assert_within(m, &w);
}
END_TEST

/* Where the formulas switch (tanh 0.55, erf 0.85, exp's clamps), where
 * results overflow or go subnormal, and the smallest inputs. */
START_TEST(within_bound_at_the_edges)
{
    const math_fn *m = &FNS[_i];
    static const float centres[] = {0.0f, 0.55f, 0.85f, 1.0f, 88.7228394f, -87.3365479f,
                                    -103.972084f, -104.0f, 89.0f, 9.0f, 3.92f, 0.5f};
    worst w = {0, 0, 0};
    for (size_t c = 0; c < sizeof centres / sizeof centres[0]; c++) {
        float x = centres[c];
        for (int k = 0; k < 64; k++) {
            track(m, x, &w);
            track(m, -x, &w);
            x = nextafterf(x, INFINITY);
        }
    }
    for (uint32_t u = 1; u < 4096; u++) /* subnormal and tiny inputs */
        track(m, tp_f32_bits(u), &w);
    track(m, FLT_MIN, &w);
    track(m, FLT_MAX, &w);
    track(m, -FLT_MAX, &w);
    assert_within(m, &w);
}
END_TEST

START_TEST(special_values_as_libm)
{
    ck_assert(isnan(tp_expf(NAN)) && isnan(tp_tanhf(NAN)) && isnan(tp_erff(NAN)));
    ck_assert(isnan(tp_expf(-NAN)) && isnan(tp_tanhf(-NAN)) && isnan(tp_erff(-NAN)));
    ck_assert(tp_expf(INFINITY) == INFINITY && tp_expf(-INFINITY) == 0.0f);
    ck_assert(tp_expf(0.0f) == 1.0f && tp_expf(-0.0f) == 1.0f);
    ck_assert(tp_expf(89.0f) == INFINITY && tp_expf(-104.0f) == 0.0f);
    ck_assert(tp_tanhf(INFINITY) == 1.0f && tp_tanhf(-INFINITY) == -1.0f);
    ck_assert(tp_erff(INFINITY) == 1.0f && tp_erff(-INFINITY) == -1.0f);
    /* signed zeros stay signed */
    ck_assert(tp_tanhf(-0.0f) == 0.0f && signbit(tp_tanhf(-0.0f)));
    ck_assert(tp_erff(-0.0f) == 0.0f && signbit(tp_erff(-0.0f)));
    ck_assert(!signbit(tp_tanhf(0.0f)) && !signbit(tp_erff(0.0f)));
    /* saturation is exact */
    ck_assert(tp_tanhf(10.0f) == 1.0f && tp_erff(4.0f) == 1.0f && tp_erff(-4.0f) == -1.0f);
}
END_TEST

/* GELU's tanh form, computed as x / (1 + e^-2u), against the same in
 * double (0.5 (1 + tanh(u)) cancels for negative u, in double too) on a
 * dense sample of [-12, 12] (past it the result is x or -0), wherever the
 * result is over 1e-30 in magnitude: within 4 ulp for u >= 0 and 4 + 8|u|
 * below. The four roundings of u (x^3, times k, plus x, times c) move
 * e^-2u by up to ~8|u| ulp, and for negative u the result is e^-2u's
 * reciprocal (x = -5: ~70 ulp of a 1e-6 result); no FP32 evaluation of u
 * avoids that. From x = -10 e^-2u overflows and the result is -0 where
 * 1e-38 was due. */
START_TEST(gelu_tanh_within_bound)
{
    double worst = 0;
    float at = 0;
    for (int i = -1200000; i <= 1200000; i++) {
        float x = (float)i * 1e-5f;
        double xd = x, u = 0.7978845608028654 * (xd + 0.044715 * xd * xd * xd);
        double want = xd / (1.0 + exp(-2.0 * u));
        if (fabs(want) < 1e-30)
            continue;
        double e = ulp_error(tp_gelu_tanh(x), want) / (4.0 + 8.0 * (u < 0 ? -u : 0.0));
        if (e > worst)
            worst = e, at = x;
    }
    ck_assert_msg(worst <= 1.0, "gelu tanh(%a): %.2f of the bound", (double)at, worst);
    ck_assert(tp_gelu_tanh(20.0f) == 20.0f && tp_gelu_tanh(INFINITY) == INFINITY);
    ck_assert(tp_gelu_tanh(-20.0f) == 0.0f && tp_gelu_tanh(0.0f) == 0.0f && isnan(tp_gelu_tanh(NAN)));
}
END_TEST

/* The cpu kernel over a row (a vector loop with a scalar tail; whichever
 * clone this CPU picks) against tp_unary one element at a time: bit-equal,
 * since no clone contracts to FMA and all do the same IEEE operations per
 * lane. Rows of odd length exercise the tails. */
START_TEST(kernel_loops_give_the_scalar_bits)
{
    static const tp_op ops[] = {TP_OP_EXP, TP_OP_TANH, TP_OP_ERF, TP_OP_GELU, TP_OP_SILU, TP_OP_SIGMOID};
    enum { N = 1031 };
    static float x[N], y[N];
    uint32_t s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * (i % 3 == 0 ? 200.0f : 8.0f);
    }
    x[0] = NAN;
    x[1] = INFINITY;
    x[2] = -INFINITY;
    x[3] = -0.0f;
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        for (int tanh_gelu = 0; tanh_gelu <= (ops[o] == TP_OP_GELU); tanh_gelu++) {
            tp_attrs a;
            memset(&a, 0, sizeof a);
            a.gelu_tanh = tanh_gelu;
            int64_t shape[1] = {N};
            tp_tensor in = tp_tensor_make(x, TP_F32, 1, shape), out = tp_tensor_make(y, TP_F32, 1, shape);
            tp_err err;
            ck_assert_int_eq(cpu_op_run(ops[o], &a, &in, 1, &out, 0, 1, &err), TP_OK);
            tp_unary_fn fn;
            float p;
            ck_assert_int_eq(tp_unary_fn_of(ops[o], &a, &fn, &p), 0);
            for (int i = 0; i < N; i++) {
                float want = tp_unary(fn, x[i], p);
                ck_assert_msg(memcmp(&want, &y[i], 4) == 0, "%s%s(%a): kernel %a, scalar %a",
                              tp_op_name(ops[o]), tanh_gelu ? " (tanh)" : "", (double)x[i],
                              (double)y[i], (double)want);
            }
        }
    }
}
END_TEST

/* The cpu GELU runs blocks whose every element is in erf's Taylor range
 * without the piecewise polynomials, and blocks all below the first
 * piece's end without picking among pieces: rows of such activations, with
 * one element past the range (or at either edge, or NaN/inf) at each place
 * of a block, of every length to 3 blocks and a tail, out of place and in
 * place, give tp_gelu_erf's bits. A block check that missed an element
 * would run it through the Taylor series (2 ulp off at x = 2 already, far
 * off past 3) or the first piece's polynomial (off past 2.3). */
START_TEST(gelu_blocks_give_the_scalar_bits)
{
    enum { N = 53 };
    /* x where |x| / sqrt(2) is each range's end, and just either side */
    float taylor_end = TP_ERF_TAYLOR_END / TP_SQRT1_2, piece0_end = TP_ERF_PIECE0_END / TP_SQRT1_2;
    const float odd[] = {2.0f, -1.5f, nextafterf(taylor_end, 0.0f), nextafterf(taylor_end, 10.0f), -taylor_end,
                         nextafterf(piece0_end, 0.0f), nextafterf(piece0_end, 10.0f), -piece0_end, 2.5f,
                         -3.0f, NAN, INFINITY, -INFINITY, 40.0f};
    enum { N_ODD = sizeof odd / sizeof odd[0] };
    static float x[N], y[N], want[N];
    tp_attrs a;
    memset(&a, 0, sizeof a);
    tp_err err;
    /* rows all in the Taylor range (|x| <= 1.1), then all below the first piece's end (<= 2.2) */
    for (int scale = 1; scale <= 2; scale++)
        for (int k = 0; k <= N_ODD; k++)
            for (int at = 0; at < N; at += (k == N_ODD ? N : 7))
                for (int n = 1; n <= N; n += 13)
                    for (int in_place = 0; in_place <= 1; in_place++) {
                        for (int i = 0; i < N; i++)
                            x[i] = (float)((i * 37) % 23 - 11) * 0.1f * (float)scale;
                        if (k < N_ODD)
                            x[at] = odd[k];
                        for (int i = 0; i < n; i++)
                            want[i] = tp_gelu_erf(x[i]);
                        int64_t shape[1] = {n};
                        float *out = in_place ? x : y;
                        tp_tensor tin = tp_tensor_make(x, TP_F32, 1, shape), tout = tp_tensor_make(out, TP_F32, 1, shape);
                        ck_assert_int_eq(cpu_op_run(TP_OP_GELU, &a, &tin, 1, &tout, 0, 1, &err), TP_OK);
                        for (int i = 0; i < n; i++)
                            ck_assert_msg(memcmp(&want[i], &out[i], 4) == 0,
                                          "gelu row of %d (scale %d, odd value %d at %d, %s), element %d: "
                                          "kernel %a, scalar %a", n, scale, k, at, in_place ? "in place" : "out of place",
                                          i, (double)out[i], (double)want[i]);
                    }
}
END_TEST

/* Softmax and the norms over rows of odd length (vector body and tail),
 * through the kernels (both clones) and through tp_math.h's row functions
 * compiled here: the same bits, as the lanes fix every sum's order. */
START_TEST(row_kernels_give_the_scalar_bits)
{
    enum { R = 3, N = 1031 };
    static float x[R * N], w[N], b[N], y[R * N], want[N];
    uint32_t s = 777;
    for (int i = 0; i < R * N; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = ((float)(s >> 8) / 16777216.0f - 0.5f) * 30.0f;
    }
    for (int i = 0; i < N; i++) {
        w[i] = 0.5f + (float)i / N;
        b[i] = (float)(i % 7) - 3.0f;
    }
    int64_t shape[2] = {R, N}, wshape[1] = {N};
    tp_tensor ins[3] = {tp_tensor_make(x, TP_F32, 2, shape), tp_tensor_make(w, TP_F32, 1, wshape),
                        tp_tensor_make(b, TP_F32, 1, wshape)};
    tp_tensor out = tp_tensor_make(y, TP_F32, 2, shape);
    static const tp_op ops[] = {TP_OP_SOFTMAX, TP_OP_LAYER_NORM, TP_OP_RMS_NORM};
    for (size_t o = 0; o < sizeof ops / sizeof ops[0]; o++) {
        tp_attrs a;
        memset(&a, 0, sizeof a);
        a.dim = 1;
        a.eps = 1e-5f;
        tp_err err;
        int n_ins = ops[o] == TP_OP_SOFTMAX ? 1 : ops[o] == TP_OP_RMS_NORM ? 2 : 3;
        ck_assert_int_eq(cpu_op_run(ops[o], &a, ins, n_ins, &out, 0, 1, &err), TP_OK);
        for (int r = 0; r < R; r++) {
            const float *xr = x + r * N;
            if (ops[o] == TP_OP_SOFTMAX)
                tp_softmax_row(xr, want, N);
            else if (ops[o] == TP_OP_LAYER_NORM)
                tp_layer_norm_row(xr, w, b, want, N, a.eps);
            else
                tp_rms_norm_row(xr, w, want, N, a.eps);
            ck_assert_msg(memcmp(want, y + r * N, sizeof want) == 0, "%s row %d: kernel differs from scalar",
                          tp_op_name(ops[o]), r);
        }
    }
}
END_TEST

static Suite *math_suite(void)
{
    Suite *s = suite_create("math");
    TCase *tc = tcase_create("exp_tanh_erf");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, within_bound_on_a_dense_sample, 0, 3);
    tcase_add_loop_test(tc, within_bound_at_the_edges, 0, 3);
    tcase_add_test(tc, special_values_as_libm);
    tcase_add_test(tc, gelu_tanh_within_bound);
    tcase_add_test(tc, kernel_loops_give_the_scalar_bits);
    tcase_add_test(tc, gelu_blocks_give_the_scalar_bits);
    tcase_add_test(tc, row_kernels_give_the_scalar_bits);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(math_suite)
