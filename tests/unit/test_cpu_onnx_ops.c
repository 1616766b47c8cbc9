/* test_cpu_onnx_ops.c — the cpu kernels of the ops ONNX exports need after
 * folding (div, sqrt, rsqrt, exp, neg, tanh, erf, sigmoid, pow,
 * reduce_mean, reduce_sum, where, gather, expand, cast) against values
 * computed by hand or with NumPy (float64, rounded to float32; the literals
 * below).
 *
 * Tolerances (tu_rel_error, the project's metric):
 * - FP32 transcendental functions: LIBM_RTOL, a few ulp (libm's float
 *   functions are within 1-2 ulp of the rounded exact value);
 * - FP32 reductions of small integers, div/neg/where/gather/expand/cast:
 *   exact (the values and every partial sum are representable, or the op
 *   only moves bits), compared with tolerance 0;
 * - FP16/BF16: exact against the FP32 kernel's result rounded to the type,
 *   since the kernels widen exactly, compute in FP32 and round once. */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend.h"
#include "check_main.h"
#include "cpu/cpu_ops.h"
#include "testutil.h"

#define LIBM_RTOL 4e-7
#define EXACT 0.0

static tp_err err;

static tp_status run(tp_op op, const tp_attrs *a, tp_tensor *ins, int n, tp_tensor *out)
{
    err.msg[0] = 0;
    return cpu_op_run(op, a, ins, n, out, 0, 1, &err);
}

#define RUN_OK(op, a, ins, n, out) \
    ck_assert_msg(run(op, a, ins, n, out) == TP_OK, "%s failed: %s", tp_op_name(op), err.msg)

static tp_attrs attrs0(void)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    return a;
}

/* got vs want (n FP32 values) within rtol by tu_rel_error. */
static void expect_f32(const float *got, const float *want, int64_t n, double rtol)
{
    int64_t s[1] = {n};
    tp_host_tensor g = tu_f32("got", (float *)got, 1, s), w = tu_f32("want", (float *)want, 1, s);
    double e = tu_rel_error(&g, &w);
    for (int64_t i = 0; e > rtol && i < n; i++)
        fprintf(stderr, "  [%lld] got %.9g want %.9g\n", (long long)i, got[i], want[i]);
    ck_assert_msg(e <= rtol, "relative error %g > %g", e, rtol);
}

/* A unary op on 6 FP32 values. */
static void unary6(tp_op op, const tp_attrs *a, const float *x, const float *want, double rtol)
{
    float in[6], out[6];
    memcpy(in, x, sizeof in);
    int64_t s[1] = {6};
    tp_tensor t = tp_tensor_make(in, TP_F32, 1, s), o = tp_tensor_make(out, TP_F32, 1, s);
    RUN_OK(op, a, &t, 1, &o);
    expect_f32(out, want, 6, rtol);
}

static const float XS[6] = {-2.0f, -0.5f, 0.0f, 0.25f, 1.0f, 3.0f};
static const float POS[6] = {0.25f, 1.0f, 2.0f, 4.0f, 9.0f, 0.01f};

START_TEST(test_exp_tanh_erf_sigmoid)
{
    tp_attrs a = attrs0();
    const float e[6] = {0.1353352814912796f, 0.6065306663513184f, 1.0f, 1.2840254306793213f, 2.7182817459106445f,
                        20.08553695678711f};
    const float th[6] = {-0.9640275835990906f, -0.46211716532707214f, 0.0f, 0.24491865932941437f,
                         0.7615941762924194f, 0.9950547814369202f};
    const float er[6] = {-0.9953222870826721f, -0.5204998850822449f, 0.0f, 0.27632638812065125f,
                         0.8427007794380188f, 0.9999778866767883f};
    const float sg[6] = {0.11920291930437088f, 0.3775406777858734f, 0.5f, 0.562176525592804f, 0.7310585975646973f,
                         0.9525741338729858f};
    unary6(TP_OP_EXP, &a, XS, e, LIBM_RTOL);
    unary6(TP_OP_TANH, &a, XS, th, LIBM_RTOL);
    unary6(TP_OP_ERF, &a, XS, er, LIBM_RTOL);
    unary6(TP_OP_SIGMOID, &a, XS, sg, LIBM_RTOL);
}
END_TEST

START_TEST(test_neg_sqrt_rsqrt)
{
    tp_attrs a = attrs0();
    const float ng[6] = {2.0f, 0.5f, -0.0f, -0.25f, -1.0f, -3.0f};
    const float sq[6] = {0.5f, 1.0f, 1.4142135381698608f, 2.0f, 3.0f, 0.10000000149011612f};
    const float rs[6] = {2.0f, 1.0f, 0.7071067690849304f, 0.5f, 0.3333333432674408f, 10.0f};
    unary6(TP_OP_NEG, &a, XS, ng, EXACT);
    unary6(TP_OP_SQRT, &a, POS, sq, LIBM_RTOL);
    unary6(TP_OP_RSQRT, &a, POS, rs, LIBM_RTOL);
    /* outside the domain: NaN and inf, as NumPy gives */
    float in[2] = {-1.0f, 0.0f}, out[2];
    int64_t s[1] = {2};
    tp_tensor t = tp_tensor_make(in, TP_F32, 1, s), o = tp_tensor_make(out, TP_F32, 1, s);
    RUN_OK(TP_OP_SQRT, &a, &t, 1, &o);
    ck_assert(isnan(out[0]) && out[1] == 0.0f);
    RUN_OK(TP_OP_RSQRT, &a, &t, 1, &o);
    ck_assert(isnan(out[0]) && isinf(out[1]) && out[1] > 0);
}
END_TEST

START_TEST(test_pow_exponents)
{
    tp_attrs a = attrs0();
    float p2w[6];
    for (int i = 0; i < 6; i++)
        p2w[i] = POS[i] * POS[i]; /* x*x is correctly rounded: pow 2 equals it bit for bit */
    a.exponent = 2.0f;
    unary6(TP_OP_POW, &a, POS, p2w, EXACT);
    const float half[6] = {0.5f, 1.0f, 1.4142135381698608f, 2.0f, 3.0f, 0.10000000149011612f};
    a.exponent = 0.5f;
    unary6(TP_OP_POW, &a, POS, half, LIBM_RTOL);
    const float p15[6] = {0.125f, 1.0f, 2.8284270763397217f, 8.0f, 27.0f, 0.0009999999310821295f};
    a.exponent = 1.5f;
    unary6(TP_OP_POW, &a, POS, p15, LIBM_RTOL);
    const float inv[6] = {4.0f, 1.0f, 0.5f, 0.25f, 0.1111111119389534f, 100.0f};
    a.exponent = -1.0f;
    unary6(TP_OP_POW, &a, POS, inv, LIBM_RTOL);
    const float cube[6] = {-8.0f, -0.125f, 0.0f, 0.015625f, 1.0f, 27.0f};
    a.exponent = 3.0f;
    unary6(TP_OP_POW, &a, XS, cube, EXACT);
}
END_TEST

/* FP16/BF16 (strided input): the FP32 kernel's result on the widened
 * inputs, rounded once, bit for bit. */
START_TEST(test_unary_half_strided)
{
    const tp_op ops[] = {TP_OP_SQRT, TP_OP_RSQRT, TP_OP_EXP, TP_OP_NEG, TP_OP_TANH, TP_OP_ERF, TP_OP_SIGMOID,
                         TP_OP_POW};
    const tp_dtype dts[] = {TP_F16, TP_BF16};
    for (size_t d = 0; d < 2; d++) {
        tp_dtype dt = dts[d];
        for (size_t k = 0; k < sizeof ops / sizeof ops[0]; k++) {
            tp_attrs a = attrs0();
            a.exponent = 1.5f;
            int positive = ops[k] == TP_OP_SQRT || ops[k] == TP_OP_RSQRT || ops[k] == TP_OP_POW;
            uint16_t src[2 * 8], got[8];
            float wide[8], ref[8];
            for (int i = 0; i < 8; i++) {
                float v = positive ? 0.37f * (float)i + 0.05f : 0.37f * (float)i - 1.3f;
                src[2 * i] = dt == TP_F16 ? tp_f32_to_f16(v) : tp_f32_to_bf16(v);
                src[2 * i + 1] = 0xffff; /* skipped by the stride */
                wide[i] = dt == TP_F16 ? tp_f16_to_f32(src[2 * i]) : tp_bf16_to_f32(src[2 * i]);
            }
            int64_t s[1] = {8};
            tp_tensor x = tp_tensor_make(src, dt, 1, s), o = tp_tensor_make(got, dt, 1, s);
            x.stride[0] = 2;
            RUN_OK(ops[k], &a, &x, 1, &o);
            tp_tensor xf = tp_tensor_make(wide, TP_F32, 1, s), of = tp_tensor_make(ref, TP_F32, 1, s);
            RUN_OK(ops[k], &a, &xf, 1, &of);
            for (int i = 0; i < 8; i++) {
                uint16_t want = dt == TP_F16 ? tp_f32_to_f16(ref[i]) : tp_f32_to_bf16(ref[i]);
                ck_assert_msg(got[i] == want, "%s %s [%d]: 0x%04x want 0x%04x", tp_op_name(ops[k]),
                              tp_dtype_name(dt), i, got[i], want);
            }
        }
    }
}
END_TEST

START_TEST(test_div_broadcast)
{
    /* [2, 3] / [3] */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {2, -4, 0.5f}, out[6];
    const float want[6] = {0.5f, -0.5f, 6.0f, 2.0f, -1.25f, 12.0f};
    int64_t sa[2] = {2, 3}, sb[1] = {3};
    tp_tensor ins[2] = {tp_tensor_make(a, TP_F32, 2, sa), tp_tensor_make(b, TP_F32, 1, sb)};
    tp_tensor o = tp_tensor_make(out, TP_F32, 2, sa);
    RUN_OK(TP_OP_DIV, NULL, ins, 2, &o);
    expect_f32(out, want, 6, EXACT);
    /* by zero: inf and NaN as IEEE says */
    float z[1] = {0}, n2[2] = {1, 0}, r2[2];
    int64_t s1[1] = {1}, s2[1] = {2};
    tp_tensor zi[2] = {tp_tensor_make(n2, TP_F32, 1, s2), tp_tensor_make(z, TP_F32, 1, s1)};
    tp_tensor zo = tp_tensor_make(r2, TP_F32, 1, s2);
    RUN_OK(TP_OP_DIV, NULL, zi, 2, &zo);
    ck_assert(isinf(r2[0]) && isnan(r2[1]));
}
END_TEST

START_TEST(test_div_half_and_int_refused)
{
    const tp_dtype dts[] = {TP_F16, TP_BF16};
    for (int d = 0; d < 2; d++) {
        tp_dtype dt = dts[d];
        float fa[4] = {1, 3, -7, 10}, fb[1] = {3}, fo[4];
        uint16_t ha[4], hb[1], ho[4];
        for (int i = 0; i < 4; i++)
            ha[i] = dt == TP_F16 ? tp_f32_to_f16(fa[i]) : tp_f32_to_bf16(fa[i]);
        hb[0] = dt == TP_F16 ? tp_f32_to_f16(fb[0]) : tp_f32_to_bf16(fb[0]);
        int64_t s4[1] = {4}, s1[1] = {1};
        tp_tensor hi[2] = {tp_tensor_make(ha, dt, 1, s4), tp_tensor_make(hb, dt, 1, s1)};
        tp_tensor hout = tp_tensor_make(ho, dt, 1, s4);
        RUN_OK(TP_OP_DIV, NULL, hi, 2, &hout);
        tp_tensor fi[2] = {tp_tensor_make(fa, TP_F32, 1, s4), tp_tensor_make(fb, TP_F32, 1, s1)};
        tp_tensor fout = tp_tensor_make(fo, TP_F32, 1, s4);
        RUN_OK(TP_OP_DIV, NULL, fi, 2, &fout);
        for (int i = 0; i < 4; i++)
            ck_assert_uint_eq(ho[i], dt == TP_F16 ? tp_f32_to_f16(fo[i]) : tp_f32_to_bf16(fo[i]));
    }
    int32_t ia[2] = {4, 5}, ib[2] = {0, 1}, io[2];
    int64_t s[1] = {2};
    tp_tensor ii[2] = {tp_tensor_make(ia, TP_I32, 1, s), tp_tensor_make(ib, TP_I32, 1, s)};
    tp_tensor iout = tp_tensor_make(io, TP_I32, 1, s);
    ck_assert_int_eq(run(TP_OP_DIV, NULL, ii, 2, &iout), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "div: needs floating-point inputs, got INT32"), "%s", err.msg);
}
END_TEST

/* x = arange(24).reshape(2, 3, 4) (NumPy): sums and means by hand. */
START_TEST(test_reduce_sum_mean)
{
    float x[24], out[12];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    int64_t sx[3] = {2, 3, 4};
    tp_tensor t = tp_tensor_make(x, TP_F32, 3, sx);
    tp_attrs a = attrs0();
    /* sum over dim 1: [[12, 15, 18, 21], [48, 51, 54, 57]] */
    a.dim = 1;
    int64_t s24[2] = {2, 4};
    tp_tensor o = tp_tensor_make(out, TP_F32, 2, s24);
    RUN_OK(TP_OP_REDUCE_SUM, &a, &t, 1, &o);
    const float sum1[8] = {12, 15, 18, 21, 48, 51, 54, 57};
    expect_f32(out, sum1, 8, EXACT);
    /* mean over the last dim, keepdim: [[[1.5], [5.5], [9.5]], [[13.5], [17.5], [21.5]]] */
    a.dim = 2;
    a.keepdim = 1;
    int64_t s231[3] = {2, 3, 1};
    o = tp_tensor_make(out, TP_F32, 3, s231);
    RUN_OK(TP_OP_REDUCE_MEAN, &a, &t, 1, &o);
    const float mean2[6] = {1.5f, 5.5f, 9.5f, 13.5f, 17.5f, 21.5f};
    expect_f32(out, mean2, 6, EXACT);
    /* mean over dim 0: x[0] + 6 */
    a.dim = 0;
    a.keepdim = 0;
    int64_t s34[2] = {3, 4};
    o = tp_tensor_make(out, TP_F32, 2, s34);
    RUN_OK(TP_OP_REDUCE_MEAN, &a, &t, 1, &o);
    float mean0[12];
    for (int i = 0; i < 12; i++)
        mean0[i] = (float)i + 6.0f;
    expect_f32(out, mean0, 12, EXACT);
    /* the wrong output shape is refused */
    o = tp_tensor_make(out, TP_F32, 2, s24);
    ck_assert_int_eq(run(TP_OP_REDUCE_MEAN, &a, &t, 1, &o), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "reduce_mean: FP32 [2, 3, 4] over dim 0"), "%s", err.msg);
}
END_TEST

/* A transposed view (strides) in BF16: the FP32 result rounded once. */
START_TEST(test_reduce_strided_half)
{
    const tp_dtype dts[] = {TP_F16, TP_BF16};
    for (int d = 0; d < 2; d++) {
        tp_dtype dt = dts[d];
        uint16_t x[12], out[4];
        for (int i = 0; i < 12; i++)
            x[i] = dt == TP_F16 ? tp_f32_to_f16(0.5f * (float)i) : tp_f32_to_bf16(0.5f * (float)i);
        /* x is [3, 4]; the view is its transpose [4, 3]; sum over dim 1 = column sums of x */
        int64_t sv[2] = {4, 3}, st[2] = {1, 4}, so[1] = {4};
        tp_tensor v = tp_tensor_make(x, dt, 2, sv);
        v.stride[0] = st[0];
        v.stride[1] = st[1];
        tp_tensor o = tp_tensor_make(out, dt, 1, so);
        tp_attrs a = attrs0();
        a.dim = 1;
        RUN_OK(TP_OP_REDUCE_SUM, &a, &v, 1, &o);
        /* column j: 0.5 * (j + (j + 4) + (j + 8)) = 1.5 j + 6 */
        for (int j = 0; j < 4; j++) {
            float w = 1.5f * (float)j + 6.0f;
            ck_assert_uint_eq(out[j], dt == TP_F16 ? tp_f32_to_f16(w) : tp_f32_to_bf16(w));
        }
    }
}
END_TEST

START_TEST(test_where_broadcast)
{
    /* cond [3] (INT32), x [2, 3], y [1]: NumPy np.where([1, 0, 2], x, -1) */
    int32_t c[3] = {1, 0, 2};
    float x[6] = {1, 2, 3, 4, 5, 6}, y[1] = {-1}, out[6];
    int64_t sc[1] = {3}, sx[2] = {2, 3}, sy[1] = {1};
    tp_tensor ins[3] = {tp_tensor_make(c, TP_I32, 1, sc), tp_tensor_make(x, TP_F32, 2, sx),
                        tp_tensor_make(y, TP_F32, 1, sy)};
    tp_tensor o = tp_tensor_make(out, TP_F32, 2, sx);
    RUN_OK(TP_OP_WHERE, NULL, ins, 3, &o);
    const float want[6] = {1, -1, 3, 4, -1, 6};
    expect_f32(out, want, 6, EXACT);
    /* INT64 cond [2, 1], FP16 x [1, 2] and y [2, 2]: a causal-mask shape */
    int64_t c64[2] = {0, 1};
    uint16_t hx[2] = {tp_f32_to_f16(7), tp_f32_to_f16(8)}, hy[4], ho[4];
    for (int i = 0; i < 4; i++)
        hy[i] = tp_f32_to_f16((float)-i);
    int64_t s21[2] = {2, 1}, s12[2] = {1, 2}, s22[2] = {2, 2};
    tp_tensor in2[3] = {tp_tensor_make(c64, TP_I64, 2, s21), tp_tensor_make(hx, TP_F16, 2, s12),
                        tp_tensor_make(hy, TP_F16, 2, s22)};
    tp_tensor o2 = tp_tensor_make(ho, TP_F16, 2, s22);
    RUN_OK(TP_OP_WHERE, NULL, in2, 3, &o2);
    ck_assert_uint_eq(ho[0], hy[0]);
    ck_assert_uint_eq(ho[1], hy[1]);
    ck_assert_uint_eq(ho[2], hx[0]);
    ck_assert_uint_eq(ho[3], hx[1]);
    /* a float cond is refused */
    tp_tensor bad[3] = {ins[1], ins[1], ins[2]};
    ck_assert_int_eq(run(TP_OP_WHERE, NULL, bad, 3, &o), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "where: cond must be INT32 or INT64, got FP32"), "%s", err.msg);
}
END_TEST

START_TEST(test_gather_dims)
{
    /* x = arange(12).reshape(3, 4) */
    float x[12], out[12];
    for (int i = 0; i < 12; i++)
        x[i] = (float)i;
    int64_t sx[2] = {3, 4};
    tp_attrs a = attrs0();
    /* dim 0, INT64 ids [2, -3] (negative counts from the end): rows 2 and 0 */
    int64_t ids64[2] = {2, -3};
    int64_t si[1] = {2}, so[2] = {2, 4};
    tp_tensor ins[2] = {tp_tensor_make(x, TP_F32, 2, sx), tp_tensor_make(ids64, TP_I64, 1, si)};
    tp_tensor o = tp_tensor_make(out, TP_F32, 2, so);
    RUN_OK(TP_OP_GATHER, &a, ins, 2, &o);
    const float w0[8] = {8, 9, 10, 11, 0, 1, 2, 3};
    expect_f32(out, w0, 8, EXACT);
    /* dim 1, INT32 ids [[3, 0], [1, 1]] -> out [3, 2, 2]: x[:, ids] */
    int32_t ids32[4] = {3, 0, 1, 1};
    int64_t si2[2] = {2, 2}, so3[3] = {3, 2, 2};
    a.dim = 1;
    ins[1] = tp_tensor_make(ids32, TP_I32, 2, si2);
    o = tp_tensor_make(out, TP_F32, 3, so3);
    RUN_OK(TP_OP_GATHER, &a, ins, 2, &o);
    const float w1[12] = {3, 0, 1, 1, 7, 4, 5, 5, 11, 8, 9, 9};
    expect_f32(out, w1, 12, EXACT);
    /* a transposed x [4, 3] along dim 1: x.T[:, [2, 0]] */
    tp_tensor xt = tp_tensor_make(x, TP_F32, 2, (int64_t[]){4, 3});
    xt.stride[0] = 1;
    xt.stride[1] = 4;
    int32_t ids_t[2] = {2, 0};
    ins[0] = xt;
    ins[1] = tp_tensor_make(ids_t, TP_I32, 1, si);
    o = tp_tensor_make(out, TP_F32, 2, (int64_t[]){4, 2});
    RUN_OK(TP_OP_GATHER, &a, ins, 2, &o);
    const float wt[8] = {8, 0, 9, 1, 10, 2, 11, 3};
    expect_f32(out, wt, 8, EXACT);
    /* an id out of range: an error naming it and its position */
    ids_t[1] = 3;
    ck_assert_int_eq(run(TP_OP_GATHER, &a, ins, 2, &o), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "gather: id 3 (position 1) is outside [-3, 3)"), "%s", err.msg);
    ids_t[1] = -4;
    ck_assert_int_eq(run(TP_OP_GATHER, &a, ins, 2, &o), TP_INVALID);
}
END_TEST

START_TEST(test_expand)
{
    /* [3, 1] -> [2, 3, 4] */
    float x[3] = {1, 2, 3}, out[24];
    int64_t sx[2] = {3, 1}, so[3] = {2, 3, 4};
    tp_tensor t = tp_tensor_make(x, TP_F32, 2, sx), o = tp_tensor_make(out, TP_F32, 3, so);
    RUN_OK(TP_OP_EXPAND, NULL, &t, 1, &o);
    float want[24];
    for (int i = 0; i < 24; i++)
        want[i] = x[(i / 4) % 3];
    expect_f32(out, want, 24, EXACT);
    /* INT64 [2] -> [3, 2] */
    int64_t xi[2] = {5, -6}, oi[6];
    int64_t s2[1] = {2}, s32[2] = {3, 2};
    tp_tensor ti = tp_tensor_make(xi, TP_I64, 1, s2), toi = tp_tensor_make(oi, TP_I64, 2, s32);
    RUN_OK(TP_OP_EXPAND, NULL, &ti, 1, &toi);
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(oi[i], xi[i % 2]);
    /* [3, 1] does not broadcast to [2, 4] */
    int64_t s24[2] = {2, 4};
    o = tp_tensor_make(out, TP_F32, 2, s24);
    ck_assert_int_eq(run(TP_OP_EXPAND, NULL, &t, 1, &o), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "expand: FP32 [3, 1] does not broadcast to FP32 [2, 4]"), "%s", err.msg);
}
END_TEST

static void cast1(const void *in, tp_dtype from, void *out, tp_dtype to, int64_t n)
{
    tp_attrs a = attrs0();
    a.cast_to = (int)to;
    int64_t s[1] = {n};
    tp_tensor t = tp_tensor_make((void *)in, from, 1, s), o = tp_tensor_make(out, to, 1, s);
    RUN_OK(TP_OP_CAST, &a, &t, 1, &o);
}

/* NumPy's astype for the defined cases; saturation and NaN -> 0 where C
 * (and NumPy) leave the result undefined. */
START_TEST(test_cast_pairs)
{
    float f[7] = {2.7f, -2.7f, 0.5f, 3e9f, -3e9f, NAN, 1e30f};
    int32_t i32[7];
    cast1(f, TP_F32, i32, TP_I32, 7);
    const int32_t wi[7] = {2, -2, 0, INT32_MAX, INT32_MIN, 0, INT32_MAX};
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(i32[i], wi[i]);
    int64_t i64[7];
    cast1(f, TP_F32, i64, TP_I64, 7);
    const int64_t wl[7] = {2, -2, 0, 3000000000LL, -3000000000LL, 0, INT64_MAX};
    for (int i = 0; i < 7; i++)
        ck_assert_int_eq(i64[i], wl[i]);
    /* INT64 -> INT32 wraps (two's complement), -> FP32 rounds */
    int64_t big[3] = {4294967297LL, -1, 16777217};
    cast1(big, TP_I64, i32, TP_I32, 3);
    ck_assert_int_eq(i32[0], 1);
    ck_assert_int_eq(i32[1], -1);
    ck_assert_int_eq(i32[2], 16777217);
    float fo[3];
    cast1(big, TP_I64, fo, TP_F32, 3);
    ck_assert(fo[0] == 4294967296.0f && fo[1] == -1.0f && fo[2] == 16777216.0f);
    /* INT32 -> INT64 sign-extends */
    int32_t neg[2] = {-5, 7};
    cast1(neg, TP_I32, i64, TP_I64, 2);
    ck_assert(i64[0] == -5 && i64[1] == 7);
    /* FP32 -> FP16 / BF16 round to nearest even; FP16 -> BF16 through FP32 */
    float g[3] = {1.0f + 1.0f / 2048, 65520.0f, 1.0f / 3};
    uint16_t h[3], b[3];
    cast1(g, TP_F32, h, TP_F16, 3);
    ck_assert_uint_eq(h[0], 0x3c00); /* halfway: rounds to even 1.0 */
    ck_assert_uint_eq(h[1], 0x7c00); /* overflow: inf */
    ck_assert_uint_eq(h[2], 0x3555);
    cast1(h, TP_F16, b, TP_BF16, 3);
    ck_assert_uint_eq(b[0], 0x3f80);
    ck_assert_uint_eq(b[1], 0x7f80);
    ck_assert_uint_eq(b[2], tp_f32_to_bf16(tp_f16_to_f32(0x3555)));
    /* BF16 -> INT64 truncates: -2.5 -> -2 */
    uint16_t bn[1] = {tp_f32_to_bf16(-2.5f)};
    cast1(bn, TP_BF16, i64, TP_I64, 1);
    ck_assert_int_eq(i64[0], -2);
    /* INT32 -> FP16 */
    int32_t small[2] = {3, -2048};
    cast1(small, TP_I32, h, TP_F16, 2);
    ck_assert(tp_f16_to_f32(h[0]) == 3.0f && tp_f16_to_f32(h[1]) == -2048.0f);
}
END_TEST

START_TEST(test_cast_strided)
{
    /* a [2, 2] transposed view of INT32 into FP32 */
    int32_t x[4] = {1, 2, 3, 4};
    float out[4];
    tp_tensor t = tp_tensor_make(x, TP_I32, 2, (int64_t[]){2, 2});
    t.stride[0] = 1;
    t.stride[1] = 2;
    tp_tensor o = tp_tensor_make(out, TP_F32, 2, (int64_t[]){2, 2});
    tp_attrs a = attrs0();
    a.cast_to = TP_F32;
    RUN_OK(TP_OP_CAST, &a, &t, 1, &o);
    const float want[4] = {1, 3, 2, 4};
    expect_f32(out, want, 4, EXACT);
}
END_TEST

/* Both backends' kernel tables have every op of this file (cuda's is
 * compiled, not run, without a device). */
START_TEST(test_backends_support_the_ops)
{
    const tp_op ops[] = {TP_OP_DIV, TP_OP_SQRT, TP_OP_RSQRT, TP_OP_EXP, TP_OP_NEG, TP_OP_TANH, TP_OP_ERF,
                         TP_OP_SIGMOID, TP_OP_POW, TP_OP_REDUCE_MEAN, TP_OP_REDUCE_SUM, TP_OP_WHERE,
                         TP_OP_GATHER, TP_OP_EXPAND, TP_OP_CAST};
    const char *names[] = {"cpu", "cuda"};
    for (int b = 0; b < 2; b++) {
        const tp_backend_kind *k = tp_backend_find(names[b]);
#ifndef TP_HAVE_CUDA
        if (b == 1)
            continue;
#endif
        ck_assert_ptr_nonnull(k);
        for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
            ck_assert_msg(k->supports_op(ops[i], TP_F32), "%s lacks %s", names[b], tp_op_name(ops[i]));
    }
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cpu_onnx_ops");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, test_exp_tanh_erf_sigmoid);
    tcase_add_test(tc, test_neg_sqrt_rsqrt);
    tcase_add_test(tc, test_pow_exponents);
    tcase_add_test(tc, test_unary_half_strided);
    tcase_add_test(tc, test_div_broadcast);
    tcase_add_test(tc, test_div_half_and_int_refused);
    tcase_add_test(tc, test_reduce_sum_mean);
    tcase_add_test(tc, test_reduce_strided_half);
    tcase_add_test(tc, test_where_broadcast);
    tcase_add_test(tc, test_gather_dims);
    tcase_add_test(tc, test_expand);
    tcase_add_test(tc, test_cast_pairs);
    tcase_add_test(tc, test_cast_strided);
    tcase_add_test(tc, test_backends_support_the_ops);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(suite)
