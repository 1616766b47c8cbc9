/* test_cpu_ops.c — every cpu kernel against hand-computed values or a naive
 * reference computed here in double precision.
 *
 * Tolerances:
 * - FP32 elementwise / activations: 1e-6 absolute (hand values to 7 digits);
 * - FP32 softmax, norms: 1e-6 / 2e-6 absolute; matmul, attention: 1e-5
 *   absolute + 1e-5 relative against the double reference;
 * - FP16/BF16: elementwise ops are exact against the FP32 result rounded to
 *   the type (the kernels round once); matmul on exactly representable
 *   inputs is exact, on random inputs within 1 ulp of the rounded reference
 *   (2^-10 relative for FP16, 2^-7 for BF16); attention likewise within
 *   2 ulp (score order differs from the reference). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/cpu_ops.h"
#include "cpu/ops_internal.h"
#include "testutil.h"

static tp_err err;

static tp_tensor mk(void *data, tp_dtype dt, int nd, const int64_t *shape)
{
    return tp_tensor_make(data, dt, nd, shape);
}

/* A strided view over data. */
static tp_tensor view(void *data, tp_dtype dt, int nd, const int64_t *shape, const int64_t *stride)
{
    tp_tensor t = tp_tensor_make(data, dt, nd, shape);
    for (int i = 0; i < nd; i++)
        t.stride[i] = stride[i];
    return t;
}

static tp_attrs attrs0(void)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    a.eps = 1e-5f;
    return a;
}

static tp_status run(tp_op op, const tp_attrs *a, tp_tensor *ins, int n, tp_tensor *out)
{
    err.msg[0] = 0;
    return cpu_op_run(op, a, ins, n, out, 0, 1, &err);
}

#define RUN_OK(op, a, ins, n, out) \
    ck_assert_msg(run(op, a, ins, n, out) == TP_OK, "%s failed: %s", tp_op_name(op), err.msg)

static void expect_near(const float *got, const float *want, int64_t n, float atol, float rtol)
{
    for (int64_t i = 0; i < n; i++) {
        float tol = atol + rtol * fabsf(want[i]);
        ck_assert_msg(fabsf(got[i] - want[i]) <= tol, "element %lld: got %.8g want %.8g (tol %g)",
                      (long long)i, got[i], want[i], tol);
    }
}

static uint32_t rng = 12345u;
static float frand(void) /* uniform in [-1, 1) */
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

static void fill_rand(float *p, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = frand();
}

static uint16_t to_half(tp_dtype dt, float f) { return dt == TP_F16 ? tp_f32_to_f16(f) : tp_f32_to_bf16(f); }
static float from_half(tp_dtype dt, uint16_t h) { return dt == TP_F16 ? tp_f16_to_f32(h) : tp_bf16_to_f32(h); }
static float ulp_rel(tp_dtype dt) { return dt == TP_F16 ? 1.0f / 1024 : 1.0f / 128; }

/* ------------------------------------------------------------ binary ops */

START_TEST(test_add_broadcast_row)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[3] = {10, 20, 30}, o[6];
    tp_tensor ins[2] = {mk(a, TP_F32, 2, (int64_t[]){2, 3}), mk(b, TP_F32, 1, (int64_t[]){3})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_ADD, NULL, ins, 2, &out);
    expect_near(o, (float[]){11, 22, 33, 14, 25, 36}, 6, 0, 0);
    RUN_OK(TP_OP_SUB, NULL, ins, 2, &out);
    expect_near(o, (float[]){-9, -18, -27, -6, -15, -24}, 6, 0, 0);
    /* scalar-like [1] on the left */
    float s[1] = {2};
    tp_tensor ins2[2] = {mk(s, TP_F32, 1, (int64_t[]){1}), ins[0]};
    RUN_OK(TP_OP_SUB, NULL, ins2, 2, &out);
    expect_near(o, (float[]){1, 0, -1, -2, -3, -4}, 6, 0, 0);
}
END_TEST

START_TEST(test_mul_broadcast_3d)
{
    /* [2,1,3] * [4,1] -> [2,4,3] */
    float a[6] = {1, 2, 3, 4, 5, 6}, b[4] = {1, -1, 0.5f, 2}, o[24], want[24];
    tp_tensor ins[2] = {mk(a, TP_F32, 3, (int64_t[]){2, 1, 3}), mk(b, TP_F32, 2, (int64_t[]){4, 1})};
    tp_tensor out = mk(o, TP_F32, 3, (int64_t[]){2, 4, 3});
    RUN_OK(TP_OP_MUL, NULL, ins, 2, &out);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            for (int k = 0; k < 3; k++)
                want[(i * 4 + j) * 3 + k] = a[i * 3 + k] * b[j];
    expect_near(o, want, 24, 0, 0);
}
END_TEST

START_TEST(test_binary_strided)
{
    /* a: transposed view of base [3,2] -> [2,3]; b: slice cols 1..3 of [2,5] */
    float base_a[6] = {1, 2, 3, 4, 5, 6}; /* [[1,2],[3,4],[5,6]] -> aT = [[1,3,5],[2,4,6]] */
    float base_b[10] = {0, 10, 20, 30, 0, 0, 40, 50, 60, 0};
    float o[6];
    tp_tensor ins[2] = {view(base_a, TP_F32, 2, (int64_t[]){2, 3}, (int64_t[]){1, 2}),
                        view(base_b + 1, TP_F32, 2, (int64_t[]){2, 3}, (int64_t[]){5, 1})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_SUB, NULL, ins, 2, &out);
    expect_near(o, (float[]){-9, -17, -25, -38, -46, -54}, 6, 0, 0);
    /* explicit stride-0 broadcast: a row repeated twice */
    float row[3] = {1, 2, 3};
    ins[1] = view(row, TP_F32, 2, (int64_t[]){2, 3}, (int64_t[]){0, 1});
    RUN_OK(TP_OP_MUL, NULL, ins, 2, &out);
    expect_near(o, (float[]){1, 6, 15, 2, 8, 18}, 6, 0, 0);
    /* mismatched shapes are an error */
    float bad[2] = {0};
    ins[1] = mk(bad, TP_F32, 1, (int64_t[]){2});
    ck_assert_int_eq(run(TP_OP_ADD, NULL, ins, 2, &out), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "[2]"));
}
END_TEST

START_TEST(test_int_add)
{
    int32_t a[6] = {1, 2, 3, 4, 5, INT32_MAX}, b[3] = {10, -20, 1}, o[6];
    tp_tensor ins[2] = {mk(a, TP_I32, 2, (int64_t[]){2, 3}), mk(b, TP_I32, 1, (int64_t[]){3})};
    tp_tensor out = mk(o, TP_I32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_ADD, NULL, ins, 2, &out);
    int32_t want[6] = {11, -18, 4, 14, -15, INT32_MIN}; /* wraps */
    for (int i = 0; i < 6; i++)
        ck_assert_int_eq(o[i], want[i]);

    int64_t c[4] = {1, 2, 3, 5000000000LL}, d[4] = {7, 8, 9, 3}, p[4];
    tp_tensor ins64[2] = {mk(c, TP_I64, 2, (int64_t[]){2, 2}), mk(d, TP_I64, 2, (int64_t[]){2, 2})};
    tp_tensor out64 = mk(p, TP_I64, 2, (int64_t[]){2, 2});
    RUN_OK(TP_OP_ADD, NULL, ins64, 2, &out64);
    ck_assert(p[0] == 8 && p[1] == 10 && p[2] == 12 && p[3] == 5000000003LL);
    RUN_OK(TP_OP_MUL, NULL, ins64, 2, &out64);
    ck_assert(p[0] == 7 && p[1] == 16 && p[2] == 27 && p[3] == 15000000000LL);
    /* transposed int view */
    ins64[0] = view(c, TP_I64, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2});
    RUN_OK(TP_OP_SUB, NULL, ins64, 2, &out64);
    ck_assert(p[0] == -6 && p[1] == 3 - 8 && p[2] == 2 - 9 && p[3] == 5000000000LL - 3);
}
END_TEST

START_TEST(test_binary_half)
{
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    for (int t = 0; t < 2; t++) {
        tp_dtype dt = dts[t];
        float af[12], bf[4];
        uint16_t a[12], b[4], o[12];
        fill_rand(af, 12);
        fill_rand(bf, 4);
        for (int i = 0; i < 12; i++)
            a[i] = to_half(dt, af[i] * 3);
        for (int i = 0; i < 4; i++)
            b[i] = to_half(dt, bf[i]);
        /* [3,4] * [4], and [3,4] + [3,1] via a stride-0 view of b */
        tp_tensor ins[2] = {mk(a, dt, 2, (int64_t[]){3, 4}), mk(b, dt, 1, (int64_t[]){4})};
        tp_tensor out = mk(o, dt, 2, (int64_t[]){3, 4});
        RUN_OK(TP_OP_MUL, NULL, ins, 2, &out);
        for (int i = 0; i < 12; i++)
            ck_assert_uint_eq(o[i], to_half(dt, from_half(dt, a[i]) * from_half(dt, b[i % 4])));
        ins[1] = view(b, dt, 2, (int64_t[]){3, 4}, (int64_t[]){1, 0});
        RUN_OK(TP_OP_ADD, NULL, ins, 2, &out);
        for (int i = 0; i < 12; i++)
            ck_assert_uint_eq(o[i], to_half(dt, from_half(dt, a[i]) + from_half(dt, b[i / 4])));
    }
}
END_TEST

/* ------------------------------------------------------------ activations */

START_TEST(test_activations)
{
    float x[4] = {1, -1, 0, 2}, o[4];
    tp_tensor in = mk(x, TP_F32, 1, (int64_t[]){4}), out = mk(o, TP_F32, 1, (int64_t[]){4});
    tp_attrs a = attrs0();
    RUN_OK(TP_OP_GELU, &a, &in, 1, &out);
    expect_near(o, (float[]){0.8413447f, -0.1586553f, 0, 1.9544997f}, 4, 1e-6f, 0);
    a.gelu_tanh = 1;
    RUN_OK(TP_OP_GELU, &a, &in, 1, &out);
    expect_near(o, (float[]){0.8411920f, -0.1588080f, 0, 1.9545977f}, 4, 1e-6f, 0);
    RUN_OK(TP_OP_SILU, NULL, &in, 1, &out);
    expect_near(o, (float[]){0.7310586f, -0.2689414f, 0, 1.7615942f}, 4, 1e-6f, 0);
    RUN_OK(TP_OP_RELU, NULL, &in, 1, &out);
    expect_near(o, (float[]){1, 0, 0, 2}, 4, 0, 0);
    /* extreme inputs stay finite */
    float big[2] = {-200, 200};
    in = mk(big, TP_F32, 1, (int64_t[]){2});
    out.shape[0] = 2;
    RUN_OK(TP_OP_SILU, NULL, &in, 1, &out);
    ck_assert(o[0] == 0.0f && o[1] == 200.0f);
}
END_TEST

START_TEST(test_activations_strided_half)
{
    /* relu on a transposed view, FP32 */
    float base[6] = {-1, 2, 3, -4, 5, -6}, o[6];
    tp_tensor in = view(base, TP_F32, 2, (int64_t[]){2, 3}, (int64_t[]){1, 2});
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_RELU, NULL, &in, 1, &out);
    expect_near(o, (float[]){0, 3, 5, 2, 0, 0}, 6, 0, 0);
    /* gelu FP16/BF16 = FP32 gelu of the widened input, rounded once */
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    for (int t = 0; t < 2; t++) {
        tp_dtype dt = dts[t];
        uint16_t h[6], ho[6];
        for (int i = 0; i < 6; i++)
            h[i] = to_half(dt, base[i] * 0.7f);
        in = view(h, dt, 2, (int64_t[]){2, 3}, (int64_t[]){1, 2});
        out = mk(ho, dt, 2, (int64_t[]){2, 3});
        tp_attrs a = attrs0();
        RUN_OK(TP_OP_GELU, &a, &in, 1, &out);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 3; j++) {
                float x = from_half(dt, h[j * 2 + i]);
                float want = 0.5f * x * (1.0f + erff(x / sqrtf(2.0f)));
                ck_assert_uint_eq(ho[i * 3 + j], to_half(dt, want));
            }
    }
}
END_TEST

/* ------------------------------------------------------------ softmax / norms */

START_TEST(test_softmax_last)
{
    float x[6] = {1, 2, 3, 1000, 1001, 1002}, o[6];
    tp_tensor in = mk(x, TP_F32, 2, (int64_t[]){2, 3}), out = mk(o, TP_F32, 2, (int64_t[]){2, 3});
    tp_attrs a = attrs0();
    a.dim = 1;
    RUN_OK(TP_OP_SOFTMAX, &a, &in, 1, &out);
    float want[3] = {0.09003057f, 0.24472847f, 0.66524096f};
    expect_near(o, want, 3, 1e-6f, 0);
    expect_near(o + 3, want, 3, 1e-6f, 0); /* stable for large inputs */
    /* fully masked row gives zeros, not NaN */
    float m[3] = {-INFINITY, -INFINITY, -INFINITY};
    in = mk(m, TP_F32, 2, (int64_t[]){1, 3});
    out.shape[0] = 1;
    RUN_OK(TP_OP_SOFTMAX, &a, &in, 1, &out);
    expect_near(o, (float[]){0, 0, 0}, 3, 0, 0);
}
END_TEST

static void softmax_cols_ref(const float *x, int rows, int cols, float *want)
{
    for (int j = 0; j < cols; j++) {
        double mx = -INFINITY, s = 0;
        for (int i = 0; i < rows; i++)
            mx = fmax(mx, x[i * cols + j]);
        for (int i = 0; i < rows; i++)
            s += exp(x[i * cols + j] - mx);
        for (int i = 0; i < rows; i++)
            want[i * cols + j] = (float)(exp(x[i * cols + j] - mx) / s);
    }
}

START_TEST(test_softmax_dim0)
{
    float x[12] = {1, 2, 3, 4, 0, -1, 5, 2, 2, 2, -3, 0.5f}, o[12], want[12];
    tp_tensor in = mk(x, TP_F32, 2, (int64_t[]){3, 4}), out = mk(o, TP_F32, 2, (int64_t[]){3, 4});
    tp_attrs a = attrs0();
    a.dim = 0;
    RUN_OK(TP_OP_SOFTMAX, &a, &in, 1, &out);
    softmax_cols_ref(x, 3, 4, want);
    expect_near(o, want, 12, 1e-6f, 0);
    ck_assert(fabsf(o[0] - 0.24472847f) < 1e-6f); /* softmax([1,0,2])[0] */
    /* last dim of a transposed view == dim 0 of the base */
    float ot[12], wt[12];
    in = view(x, TP_F32, 2, (int64_t[]){4, 3}, (int64_t[]){1, 4});
    out = mk(ot, TP_F32, 2, (int64_t[]){4, 3});
    a.dim = 1;
    RUN_OK(TP_OP_SOFTMAX, &a, &in, 1, &out);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++)
            wt[i * 3 + j] = want[j * 4 + i];
    expect_near(ot, wt, 12, 1e-6f, 0);
    /* BF16, dim 0: exact vs the FP32 result rounded, given widened inputs */
    uint16_t h[12], ho[12];
    float hf[12], hw[12];
    for (int i = 0; i < 12; i++) {
        h[i] = tp_f32_to_bf16(x[i] * 0.3f);
        hf[i] = tp_bf16_to_f32(h[i]);
    }
    softmax_cols_ref(hf, 3, 4, hw);
    in = mk(h, TP_BF16, 2, (int64_t[]){3, 4});
    out = mk(ho, TP_BF16, 2, (int64_t[]){3, 4});
    a.dim = 0;
    RUN_OK(TP_OP_SOFTMAX, &a, &in, 1, &out);
    for (int i = 0; i < 12; i++)
        ck_assert_msg(fabsf(tp_bf16_to_f32(ho[i]) - hw[i]) <= hw[i] / 128, "bf16 softmax %d", i);
}
END_TEST

static void layer_norm_ref(const float *x, const float *w, const float *b, float *y, int n, double eps)
{
    double mean = 0, var = 0;
    for (int i = 0; i < n; i++)
        mean += x[i];
    mean /= n;
    for (int i = 0; i < n; i++)
        var += (x[i] - mean) * (x[i] - mean);
    var /= n;
    for (int i = 0; i < n; i++)
        y[i] = (float)((x[i] - mean) / sqrt(var + eps) * (w ? w[i] : 1) + (b ? b[i] : 0));
}

START_TEST(test_layer_norm)
{
    float x[8] = {1, 2, 3, 4, 2, 4, 6, 8}, w[4] = {1, 1, 2, 0.5f}, b[4] = {0, 1, 0, -1};
    float o[8], want[8];
    tp_tensor ins[3] = {mk(x, TP_F32, 2, (int64_t[]){2, 4}), mk(w, TP_F32, 1, (int64_t[]){4}),
                        mk(b, TP_F32, 1, (int64_t[]){4})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){2, 4});
    tp_attrs a = attrs0();
    RUN_OK(TP_OP_LAYER_NORM, &a, ins, 3, &out);
    /* row 0: mean 2.5, var 1.25 -> (x-2.5)/1.118038 */
    float r = 1.0f / sqrtf(1.25f + 1e-5f);
    expect_near(o, (float[]){-1.5f * r, -0.5f * r + 1, 0.5f * r * 2, 1.5f * r * 0.5f - 1}, 4, 2e-6f, 0);
    layer_norm_ref(x + 4, w, b, want + 4, 4, 1e-5);
    expect_near(o + 4, want + 4, 4, 2e-6f, 0);
    /* strided x (transposed view) and FP16 */
    float xt[8];
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 4; j++)
            xt[j * 2 + i] = x[i * 4 + j];
    ins[0] = view(xt, TP_F32, 2, (int64_t[]){2, 4}, (int64_t[]){1, 2});
    RUN_OK(TP_OP_LAYER_NORM, &a, ins, 3, &out);
    layer_norm_ref(x, w, b, want, 4, 1e-5);
    expect_near(o, want, 8, 2e-6f, 0);
    uint16_t xh[8], wh[4], bh[4], oh[8];
    for (int i = 0; i < 8; i++)
        xh[i] = tp_f32_to_f16(x[i]);
    for (int i = 0; i < 4; i++) {
        wh[i] = tp_f32_to_f16(w[i]);
        bh[i] = tp_f32_to_f16(b[i]);
    }
    tp_tensor hins[3] = {mk(xh, TP_F16, 2, (int64_t[]){2, 4}), mk(wh, TP_F16, 1, (int64_t[]){4}),
                         mk(bh, TP_F16, 1, (int64_t[]){4})};
    tp_tensor hout = mk(oh, TP_F16, 2, (int64_t[]){2, 4});
    RUN_OK(TP_OP_LAYER_NORM, &a, hins, 3, &hout);
    for (int i = 0; i < 8; i++) /* inputs are exact in FP16; within 1 ulp of rounded ref */
        ck_assert_msg(fabsf(tp_f16_to_f32(oh[i]) - want[i]) <= fabsf(want[i]) / 1024 + 1e-6f,
                      "f16 layer_norm %d", i);
}
END_TEST

START_TEST(test_rms_norm)
{
    float x[4] = {1, 2, 3, 4}, w[4] = {1, 2, 0.5f, 1}, o[4];
    tp_tensor ins[2] = {mk(x, TP_F32, 2, (int64_t[]){1, 4}), mk(w, TP_F32, 1, (int64_t[]){4})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){1, 4});
    tp_attrs a = attrs0();
    a.eps = 1e-6f;
    RUN_OK(TP_OP_RMS_NORM, &a, ins, 2, &out);
    float r = 1.0f / sqrtf(7.5f + 1e-6f); /* mean of squares 30/4 */
    expect_near(o, (float[]){r, 4 * r, 1.5f * r, 4 * r}, 4, 1e-6f, 0);
    ck_assert(fabsf(o[0] - 0.36514837f) < 1e-6f);
    /* BF16 */
    uint16_t xh[4], wh[4], oh[4];
    for (int i = 0; i < 4; i++) {
        xh[i] = tp_f32_to_bf16(x[i]);
        wh[i] = tp_f32_to_bf16(w[i]);
    }
    tp_tensor hins[2] = {mk(xh, TP_BF16, 2, (int64_t[]){1, 4}), mk(wh, TP_BF16, 1, (int64_t[]){4})};
    tp_tensor hout = mk(oh, TP_BF16, 2, (int64_t[]){1, 4});
    RUN_OK(TP_OP_RMS_NORM, &a, hins, 2, &hout);
    for (int i = 0; i < 4; i++)
        ck_assert_uint_eq(oh[i], tp_f32_to_bf16(o[i]));
}
END_TEST

/* ------------------------------------------------------------ matmul */

/* want[b][m][n] = sum_k A(b,m,k) B(b,k,n) with A, B given as dense
 * per-batch arrays (bs = batch stride, 0 to broadcast). */
static void mm_ref(const float *A, int64_t abs_, const float *B, int64_t bbs, float *C, int nb,
                   int M, int K, int N, int tb)
{
    for (int bi = 0; bi < nb; bi++)
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double s = 0;
                for (int k = 0; k < K; k++) {
                    float bv = tb ? B[bi * bbs + n * K + k] : B[bi * bbs + k * N + n];
                    s += (double)A[bi * abs_ + m * K + k] * bv;
                }
                C[(bi * M + m) * N + n] = (float)s;
            }
}

START_TEST(test_matmul_basic)
{
    float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {7, 8, 9, 10, 11, 12}, o[4];
    tp_tensor ins[2] = {mk(a, TP_F32, 2, (int64_t[]){2, 3}), mk(b, TP_F32, 2, (int64_t[]){3, 2})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){2, 2});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    expect_near(o, (float[]){58, 64, 139, 154}, 4, 0, 0);
    /* transpose_b: b given as [N, K] = [[7,9,11],[8,10,12]] */
    float bt[6] = {7, 9, 11, 8, 10, 12};
    tp_attrs at = attrs0();
    at.transpose_b = 1;
    ins[1] = mk(bt, TP_F32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_MATMUL, &at, ins, 2, &out);
    expect_near(o, (float[]){58, 64, 139, 154}, 4, 0, 0);
    /* K mismatch is an error */
    ins[1] = mk(b, TP_F32, 2, (int64_t[]){2, 3});
    ck_assert_int_eq(run(TP_OP_MATMUL, NULL, ins, 2, &out), TP_INVALID);
}
END_TEST

START_TEST(test_matmul_batch_broadcast)
{
    /* a [2,1,2,3] x b [3,3,4] -> [2,3,2,4] */
    enum { M = 2, K = 3, N = 4 };
    float a[2 * M * K], b[3 * K * N], o[2 * 3 * M * N], want[2 * 3 * M * N];
    fill_rand(a, 2 * M * K);
    fill_rand(b, 3 * K * N);
    tp_tensor ins[2] = {mk(a, TP_F32, 4, (int64_t[]){2, 1, M, K}), mk(b, TP_F32, 3, (int64_t[]){3, K, N})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){2, 3, M, N});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            mm_ref(a + i * M * K, 0, b + j * K * N, 0, want + (i * 3 + j) * M * N, 1, M, K, N, 0);
    expect_near(o, want, 2 * 3 * M * N, 1e-5f, 1e-5f);
    /* [2,2,3] x [3,4] (b shared: batch folds into M) with transpose_b */
    float bt[N * K], o2[2 * M * N], w2[2 * M * N];
    fill_rand(bt, N * K);
    tp_attrs at = attrs0();
    at.transpose_b = 1;
    ins[0] = mk(a, TP_F32, 3, (int64_t[]){2, M, K});
    ins[1] = mk(bt, TP_F32, 2, (int64_t[]){N, K});
    out = mk(o2, TP_F32, 3, (int64_t[]){2, M, N});
    RUN_OK(TP_OP_MATMUL, &at, ins, 2, &out);
    mm_ref(a, M * K, bt, 0, w2, 2, M, K, N, 1);
    expect_near(o2, w2, 2 * M * N, 1e-5f, 1e-5f);
    /* batched transpose_b: b [2, N, K] */
    float bb[2 * N * K];
    fill_rand(bb, 2 * N * K);
    ins[1] = mk(bb, TP_F32, 3, (int64_t[]){2, N, K});
    RUN_OK(TP_OP_MATMUL, &at, ins, 2, &out);
    mm_ref(a, M * K, bb, N * K, w2, 2, M, K, N, 1);
    expect_near(o2, w2, 2 * M * N, 1e-5f, 1e-5f);
    /* M = 1 rows with a per-batch b: [3,1,3] x [3,3,4] */
    float o3[3 * N], w3[3 * N];
    ins[0] = mk(a, TP_F32, 3, (int64_t[]){3, 1, K});
    ins[1] = mk(b, TP_F32, 3, (int64_t[]){3, K, N});
    out = mk(o3, TP_F32, 3, (int64_t[]){3, 1, N});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    mm_ref(a, K, b, K * N, w3, 3, 1, K, N, 0);
    expect_near(o3, w3, 3 * N, 1e-5f, 1e-5f);
}
END_TEST

START_TEST(test_matmul_strided)
{
    enum { M = 3, K = 4, N = 5 };
    float a[M * K], b[K * N], at[K * M], o[M * N], want[M * N];
    fill_rand(a, M * K);
    fill_rand(b, K * N);
    mm_ref(a, 0, b, 0, want, 1, M, K, N, 0);
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K; k++)
            at[k * M + m] = a[m * K + k];
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){M, N});
    /* a as the transposed view of a [K, M] buffer (column-major) */
    tp_tensor ins[2] = {view(at, TP_F32, 2, (int64_t[]){M, K}, (int64_t[]){1, M}),
                        mk(b, TP_F32, 2, (int64_t[]){K, N})};
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    expect_near(o, want, M * N, 1e-5f, 1e-5f);
    /* a with neither stride 1 (every other element of a padded buffer) */
    float pad[2 * M * K];
    for (int i = 0; i < M * K; i++) {
        pad[2 * i] = a[i];
        pad[2 * i + 1] = 1e9f;
    }
    ins[0] = view(pad, TP_F32, 2, (int64_t[]){M, K}, (int64_t[]){2 * K, 2});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    expect_near(o, want, M * N, 1e-5f, 1e-5f);
    /* a sliced from a wider matrix (lda > K), b a stride-0 broadcast row */
    float wide[M * (K + 2)], brow[N], w2[M * N], bfull[K * N];
    for (int m = 0; m < M; m++)
        for (int k = 0; k < K + 2; k++)
            wide[m * (K + 2) + k] = k < K ? a[m * K + k] : 7.0f;
    fill_rand(brow, N);
    for (int k = 0; k < K; k++)
        memcpy(bfull + k * N, brow, sizeof brow);
    mm_ref(a, 0, bfull, 0, w2, 1, M, K, N, 0);
    ins[0] = view(wide, TP_F32, 2, (int64_t[]){M, K}, (int64_t[]){K + 2, 1});
    ins[1] = view(brow, TP_F32, 2, (int64_t[]){K, N}, (int64_t[]){0, 1});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    expect_near(o, w2, M * N, 1e-5f, 1e-5f);
    /* batched a whose batch dim is not outermost in memory: [M,2,K] permuted to [2,M,K] */
    float ap[M * 2 * K], o4[2 * M * N], w4[2 * M * N], ab[2 * M * K];
    fill_rand(ap, M * 2 * K);
    for (int bi = 0; bi < 2; bi++)
        for (int m = 0; m < M; m++)
            for (int k = 0; k < K; k++)
                ab[(bi * M + m) * K + k] = ap[(m * 2 + bi) * K + k];
    mm_ref(ab, M * K, b, 0, w4, 2, M, K, N, 0);
    ins[0] = view(ap, TP_F32, 3, (int64_t[]){2, M, K}, (int64_t[]){K, 2 * K, 1});
    ins[1] = mk(b, TP_F32, 2, (int64_t[]){K, N});
    out = mk(o4, TP_F32, 3, (int64_t[]){2, M, N});
    RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
    expect_near(o4, w4, 2 * M * N, 1e-5f, 1e-5f);
}
END_TEST

/* One row against a b wider than the small-product kernel takes (a
 * generation step decoding one sequence: sgemv, not sgemm): b plain and
 * transposed, a contiguous and strided. */
START_TEST(test_matmul_one_row)
{
    enum { K = 64, N = 1100 };
    static float a[2 * K], b[K * N], bt[N * K], o[N], want[N];
    fill_rand(a, 2 * K);
    fill_rand(b, K * N);
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            bt[n * K + k] = b[k * N + n];
    float x[K];
    for (int k = 0; k < K; k++)
        x[k] = a[2 * k];
    mm_ref(x, 0, b, 0, want, 1, 1, K, N, 0);
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){1, N});
    tp_attrs tr = attrs0();
    tr.transpose_b = 1;
    for (int strided = 0; strided < 2; strided++)
        for (int t = 0; t < 2; t++) {
            tp_tensor ins[2] = {strided ? view(a, TP_F32, 2, (int64_t[]){1, K}, (int64_t[]){2 * K, 2})
                                        : mk(x, TP_F32, 2, (int64_t[]){1, K}),
                                t ? mk(bt, TP_F32, 2, (int64_t[]){N, K}) : mk(b, TP_F32, 2, (int64_t[]){K, N})};
            memset(o, 0, sizeof o);
            RUN_OK(TP_OP_MATMUL, t ? &tr : NULL, ins, 2, &out);
            expect_near(o, want, N, 1e-5f, 1e-5f);
        }
}
END_TEST

/* An FP32 output that is a column block of a wider tensor (how the fused
 * all-gather+matmul places each weight's product) is written in place,
 * rows ldc apart, and nothing outside the block is touched: with b shared
 * (batch folds into M: one sgemm) and per batch (an sgemm per row). Other
 * strided outputs are refused, not written wrong. Tolerance as for every
 * FP32 matmul here (1e-5 against the double reference). */
START_TEST(test_matmul_into_column_block)
{
    enum { B = 2, M = 3, K = 4, N = 5, W = 9, C0 = 2 };
    float a[B * M * K], b[B * K * N], o[B * M * W], want[B * M * N];
    fill_rand(a, B * M * K);
    fill_rand(b, B * K * N);
    tp_tensor ins[2] = {mk(a, TP_F32, 3, (int64_t[]){B, M, K}), mk(b, TP_F32, 2, (int64_t[]){K, N})};
    for (int per_batch = 0; per_batch < 2; per_batch++) {
        for (int i = 0; i < B * M * W; i++)
            o[i] = -777.0f;
        tp_tensor out = view(o + C0, TP_F32, 3, (int64_t[]){B, M, N}, (int64_t[]){M * W, W, 1});
        ck_assert(cpu_matmul_writes_in_place(&out));
        if (per_batch)
            ins[1] = mk(b, TP_F32, 3, (int64_t[]){B, K, N});
        tp_err e;
        ck_assert_int_eq(cpu_matmul(NULL, &ins[0], &ins[1], &out, NULL, &e), TP_OK);
        mm_ref(a, M * K, b, per_batch ? K * N : 0, want, B, M, K, N, 0);
        for (int r = 0; r < B * M; r++)
            for (int c = 0; c < W; c++) {
                float got = o[r * W + c];
                if (c < C0 || c >= C0 + N)
                    ck_assert_msg(got == -777.0f, "row %d col %d outside the block was written", r, c);
                else
                    ck_assert_msg(fabsf(got - want[r * N + c - C0]) <= 1e-5f + 1e-5f * fabsf(want[r * N + c - C0]),
                                  "row %d col %d: %g want %g", r, c, got, want[r * N + c - C0]);
            }
    }
    /* 2-D operands (every block of a fused matmul; cpu_matmul's direct
     * sgemm), b as [K, N] and with transpose_b as [N, K] */
    float bt[N * K], w2[M * N];
    for (int k = 0; k < K; k++)
        for (int n = 0; n < N; n++)
            bt[n * K + k] = b[k * N + n];
    mm_ref(a, 0, b, 0, w2, 1, M, K, N, 0);
    for (int tb = 0; tb < 2; tb++) {
        for (int i = 0; i < M * W; i++)
            o[i] = -777.0f;
        tp_attrs at = attrs0();
        at.transpose_b = tb;
        tp_tensor a2 = mk(a, TP_F32, 2, (int64_t[]){M, K});
        tp_tensor b2 = tb ? mk(bt, TP_F32, 2, (int64_t[]){N, K}) : mk(b, TP_F32, 2, (int64_t[]){K, N});
        tp_tensor out = view(o + C0, TP_F32, 2, (int64_t[]){M, N}, (int64_t[]){W, 1});
        tp_err e;
        ck_assert_int_eq(cpu_matmul(&at, &a2, &b2, &out, NULL, &e), TP_OK);
        for (int r = 0; r < M; r++)
            for (int c = 0; c < W; c++) {
                float got = o[r * W + c];
                if (c < C0 || c >= C0 + N)
                    ck_assert_msg(got == -777.0f, "2-D tb %d row %d col %d outside the block was written", tb, r, c);
                else
                    ck_assert_msg(fabsf(got - w2[r * N + c - C0]) <= 1e-5f + 1e-5f * fabsf(w2[r * N + c - C0]),
                                  "2-D tb %d row %d col %d: %g want %g", tb, r, c, got, w2[r * N + c - C0]);
            }
    }
    /* rows closer than a row's length overlap; FP16 blocks go through scratch */
    tp_tensor overlap = view(o, TP_F32, 2, (int64_t[]){M, N}, (int64_t[]){N - 1, 1});
    uint16_t h[M * W];
    tp_tensor half = view(h, TP_F16, 2, (int64_t[]){M, N}, (int64_t[]){W, 1});
    ck_assert(!cpu_matmul_writes_in_place(&overlap) && !cpu_matmul_writes_in_place(&half));
    tp_err e;
    ins[1] = mk(b, TP_F32, 2, (int64_t[]){K, N});
    ins[0] = mk(a, TP_F32, 2, (int64_t[]){M, K});
    ck_assert_int_eq(cpu_matmul(NULL, &ins[0], &ins[1], &overlap, NULL, &e), TP_INTERNAL);
}
END_TEST

/* A block of a middle dim ([B, S/2, K] inside [B, S, K]): how the fused
 * all-gather+matmul writes a peer's rows and matmul+reduce-scatter reads
 * the rows for a peer, when the gathered dim is not the batch. Rows are
 * not evenly spaced, so small blocks go through contiguous copies (one
 * sgemm per OPS_COPY_MAX_BYTES of them) and large ones take one sgemm per
 * batch row (ops_matmul.c's COPY_ROWS_MAX_MACS): both sides of that line,
 * copies over several slices of the batch, a and out strided alone and
 * together, nothing outside the out block touched. FP32 tolerance as for
 * every matmul here (1e-5 against the double reference). */
static void middle_block_case(int B, int S, int strided)
{
    enum { K = 32, N = 48 };
    int H = S / 2;
    float *a_full = malloc(sizeof(float) * (size_t)(B * S * K)), *o_full = malloc(sizeof(float) * (size_t)(B * S * N));
    float *a_blk = malloc(sizeof(float) * (size_t)(B * H * K)), *want = malloc(sizeof(float) * (size_t)(B * H * N));
    static float b[K * N];
    ck_assert(a_full && o_full && a_blk && want);
    fill_rand(a_full, B * S * K);
    fill_rand(b, K * N);
    tp_tensor w = mk(b, TP_F32, 2, (int64_t[]){K, N});
    for (int bi = 0; bi < B; bi++)
        for (int m = 0; m < H; m++)
            memcpy(a_blk + (bi * H + m) * K, a_full + (bi * S + H + m) * K, K * sizeof(float));
    mm_ref(a_blk, H * K, b, 0, want, B, H, K, N, 0);
    for (int i = 0; i < B * S * N; i++)
        o_full[i] = -777.0f;
    tp_tensor a = (strided & 1) ? view(a_full + H * K, TP_F32, 3, (int64_t[]){B, H, K}, (int64_t[]){S * K, K, 1})
                                : mk(a_blk, TP_F32, 3, (int64_t[]){B, H, K});
    tp_tensor out = (strided & 2) ? view(o_full + H * N, TP_F32, 3, (int64_t[]){B, H, N}, (int64_t[]){S * N, N, 1})
                                  : mk(o_full, TP_F32, 3, (int64_t[]){B, H, N});
    tp_err e;
    ck_assert_int_eq(cpu_matmul(NULL, &a, &w, &out, NULL, &e), TP_OK);
    for (int bi = 0; bi < B; bi++)
        for (int m = 0; m < S; m++)
            for (int n = 0; n < N; n++) {
                int in_blk = (strided & 2) ? m >= H : bi * S + m < B * H;
                int r = (strided & 2) ? bi * H + m - H : bi * S + m;
                float got = o_full[(bi * S + m) * N + n];
                if (!in_blk)
                    ck_assert_msg(got == -777.0f, "B %d S %d case %d: [%d,%d,%d] outside the block written", B, S,
                                  strided, bi, m, n);
                else
                    ck_assert_msg(fabsf(got - want[r * N + n]) <= 1e-5f + 1e-5f * fabsf(want[r * N + n]),
                                  "B %d S %d case %d: [%d,%d,%d] %g want %g", B, S, strided, bi, m, n, got,
                                  want[r * N + n]);
            }
    free(a_full);
    free(o_full);
    free(a_blk);
    free(want);
}

START_TEST(test_matmul_middle_dim_block)
{
    /* S/2 * K * N: 6144 multiply-adds a group at S 8 (copied), 98304 at S
     * 128 (one sgemm per batch row); B 700 at S 8 copies 1280 bytes a batch
     * row, in 4 slices of up to 204 rows */
    const int cases[3][2] = {{3, 8}, {3, 128}, {700, 8}};
    for (int c = 0; c < 3; c++)
        for (int strided = 1; strided < 4; strided++) /* bit 0: a strided, bit 1: out strided */
            middle_block_case(cases[c][0], cases[c][1], strided);
}
END_TEST

START_TEST(test_matmul_half)
{
    enum { M = 3, K = 8, N = 4 };
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    for (int t = 0; t < 2; t++) {
        tp_dtype dt = dts[t];
        float af[M * K], bf[K * N], want[M * N];
        uint16_t a[M * K], b[K * N], o[M * N];
        /* exact case: small multiples of 1/4, every f32 sum exact */
        for (int i = 0; i < M * K; i++)
            af[i] = (float)((i * 7) % 9 - 4) * 0.25f;
        for (int i = 0; i < K * N; i++)
            bf[i] = (float)((i * 5) % 7 - 3) * 0.5f;
        for (int i = 0; i < M * K; i++)
            a[i] = to_half(dt, af[i]);
        for (int i = 0; i < K * N; i++)
            b[i] = to_half(dt, bf[i]);
        mm_ref(af, 0, bf, 0, want, 1, M, K, N, 0);
        tp_tensor ins[2] = {mk(a, dt, 2, (int64_t[]){M, K}), mk(b, dt, 2, (int64_t[]){K, N})};
        tp_tensor out = mk(o, dt, 2, (int64_t[]){M, N});
        RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
        for (int i = 0; i < M * N; i++)
            ck_assert_uint_eq(o[i], to_half(dt, want[i]));
        /* random, b transposed (strided view): within 1 ulp of rounded ref */
        fill_rand(af, M * K);
        fill_rand(bf, K * N);
        for (int i = 0; i < M * K; i++) {
            a[i] = to_half(dt, af[i]);
            af[i] = from_half(dt, a[i]);
        }
        uint16_t bt[N * K];
        for (int k = 0; k < K; k++)
            for (int n = 0; n < N; n++) {
                bt[n * K + k] = to_half(dt, bf[k * N + n]);
                bf[k * N + n] = from_half(dt, bt[n * K + k]);
            }
        mm_ref(af, 0, bf, 0, want, 1, M, K, N, 0);
        ins[1] = view(bt, dt, 2, (int64_t[]){K, N}, (int64_t[]){1, K});
        RUN_OK(TP_OP_MATMUL, NULL, ins, 2, &out);
        for (int i = 0; i < M * N; i++) {
            float got = from_half(dt, o[i]);
            ck_assert_msg(fabsf(got - want[i]) <= fabsf(want[i]) * ulp_rel(dt) + 1e-4f,
                          "%s matmul %d: got %g want %g", tp_dtype_name(dt), i, got, want[i]);
        }
    }
}
END_TEST

/* ------------------------------------------------------------ attention */

/* Naive reference, double precision, dense [B,H,S,D] / [B,H,T,D]; keys
 * with mask[b*T + j] == 0 are left out (mask NULL: none). */
static void attn_ref_masked(const float *q, const float *k, const float *v, const int64_t *mask, float *o,
                            int B, int H, int S, int T, int D, int causal, double scale)
{
    double *p = malloc(sizeof(double) * (size_t)T);
    for (int bh = 0; bh < B * H; bh++)
        for (int i = 0; i < S; i++) {
            const float *qi = q + (bh * S + i) * D;
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < T; j++) {
                if ((causal && j > i + (T - S)) || (mask && !mask[bh / H * T + j])) {
                    p[j] = -INFINITY;
                    continue;
                }
                double s = 0;
                for (int d = 0; d < D; d++)
                    s += (double)qi[d] * k[(bh * T + j) * D + d];
                p[j] = s * scale;
                mx = fmax(mx, p[j]);
            }
            for (int j = 0; j < T; j++) {
                p[j] = p[j] == -INFINITY ? 0 : exp(p[j] - mx);
                sum += p[j];
            }
            for (int d = 0; d < D; d++) {
                double acc = 0;
                for (int j = 0; j < T; j++)
                    acc += p[j] * v[(bh * T + j) * D + d];
                o[(bh * S + i) * D + d] = sum > 0 ? (float)(acc / sum) : 0.0f;
            }
        }
    free(p);
}

static void attn_ref(const float *q, const float *k, const float *v, float *o, int B, int H,
                     int S, int T, int D, int causal, double scale)
{
    attn_ref_masked(q, k, v, NULL, o, B, H, S, T, D, causal, scale);
}

static void attn_case(int B, int H, int S, int T, int D, int causal, int has_scale)
{
    int nq = B * H * S * D, nk = B * H * T * D;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk);
    float *v = malloc(sizeof(float) * nk), *o = malloc(sizeof(float) * nq);
    float *want = malloc(sizeof(float) * nq);
    fill_rand(q, nq);
    fill_rand(k, nk);
    fill_rand(v, nk);
    tp_attrs a = attrs0();
    a.causal = causal;
    a.has_scale = has_scale;
    a.scale = 0.3f;
    tp_tensor ins[3] = {mk(q, TP_F32, 4, (int64_t[]){B, H, S, D}), mk(k, TP_F32, 4, (int64_t[]){B, H, T, D}),
                        mk(v, TP_F32, 4, (int64_t[]){B, H, T, D})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    attn_ref(q, k, v, want, B, H, S, T, D, causal, has_scale ? 0.3 : 1.0 / sqrt(D));
    expect_near(o, want, nq, 1e-5f, 1e-5f);
    free(q);
    free(k);
    free(v);
    free(o);
    free(want);
}

START_TEST(test_attention_f32)
{
    attn_case(2, 2, 3, 3, 4, 0, 0);
    attn_case(2, 2, 3, 3, 4, 1, 0);
    attn_case(1, 3, 2, 5, 8, 1, 0); /* S != T: KV cache, bottom-right mask */
    attn_case(1, 2, 4, 4, 4, 1, 1); /* explicit scale */
    attn_case(1, 1, 1, 7, 4, 1, 0); /* decode: one query sees every key */
    /* causal queries in blocks of 32, each over the keys its last query
     * sees: whole and partial blocks, a KV offset, and S > T, whose first
     * 50 queries see no key (two blocks of zero rows, one part-zero) */
    attn_case(1, 2, 100, 100, 16, 1, 0);
    attn_case(2, 1, 70, 90, 8, 1, 0);
    attn_case(1, 1, 90, 40, 8, 1, 0);
    attn_case(1, 2, 100, 100, 16, 0, 0);
}
END_TEST

START_TEST(test_attention_causal_hand)
{
    /* B=H=1, S=T=2, D=1: query 0 sees only key 0, so o[0] = v[0] */
    float q[2] = {1, 1}, k[2] = {0, 2}, v[2] = {3, 5}, o[2];
    tp_attrs a = attrs0();
    a.causal = 1;
    tp_tensor ins[3] = {mk(q, TP_F32, 4, (int64_t[]){1, 1, 2, 1}), mk(k, TP_F32, 4, (int64_t[]){1, 1, 2, 1}),
                        mk(v, TP_F32, 4, (int64_t[]){1, 1, 2, 1})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){1, 1, 2, 1});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    /* query 1: weights softmax([0, 2]) = [0.1192029, 0.8807971] */
    expect_near(o, (float[]){3, 3 * 0.11920292f + 5 * 0.88079708f}, 2, 1e-6f, 0);
    a.causal = 0;
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    expect_near(o, (float[]){4.7615942f, 4.7615942f}, 2, 1e-6f, 0);
    /* S > T causal: query 0 sees no key (i + T - S < 0) -> zero row */
    float q3[3] = {1, 1, 1}, o3[3];
    ins[0] = mk(q3, TP_F32, 4, (int64_t[]){1, 1, 3, 1});
    out = mk(o3, TP_F32, 4, (int64_t[]){1, 1, 3, 1});
    a.causal = 1;
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    expect_near(o3, (float[]){0, 3, 3 * 0.11920292f + 5 * 0.88079708f}, 3, 1e-6f, 0);
}
END_TEST

START_TEST(test_attention_strided_half)
{
    enum { B = 1, H = 2, S = 3, T = 4, D = 4 };
    float q[B * H * S * D], k[B * H * T * D], v[B * H * T * D], want[B * H * S * D];
    fill_rand(q, B * H * S * D);
    fill_rand(k, B * H * T * D);
    fill_rand(v, B * H * T * D);
    /* q stored as [B,S,H,D] and viewed as [B,H,S,D] (the usual head split) */
    float qs[B * S * H * D], o[B * H * S * D];
    for (int h = 0; h < H; h++)
        for (int s = 0; s < S; s++)
            memcpy(qs + (s * H + h) * D, q + (h * S + s) * D, sizeof(float) * D);
    attn_ref(q, k, v, want, B, H, S, T, D, 1, 1.0 / sqrt(D));
    tp_attrs a = attrs0();
    a.causal = 1;
    tp_tensor ins[3] = {view(qs, TP_F32, 4, (int64_t[]){B, H, S, D}, (int64_t[]){S * H * D, D, H * D, 1}),
                        mk(k, TP_F32, 4, (int64_t[]){B, H, T, D}), mk(v, TP_F32, 4, (int64_t[]){B, H, T, D})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    expect_near(o, want, B * H * S * D, 1e-5f, 1e-5f);
    /* FP16 / BF16: reference on the widened inputs, within 2 ulp */
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    for (int t = 0; t < 2; t++) {
        tp_dtype dt = dts[t];
        uint16_t qh[B * H * S * D], kh[B * H * T * D], vh[B * H * T * D], oh[B * H * S * D];
        float qf[B * H * S * D], kf[B * H * T * D], vf[B * H * T * D];
        for (int i = 0; i < B * H * S * D; i++)
            qf[i] = from_half(dt, qh[i] = to_half(dt, q[i]));
        for (int i = 0; i < B * H * T * D; i++) {
            kf[i] = from_half(dt, kh[i] = to_half(dt, k[i]));
            vf[i] = from_half(dt, vh[i] = to_half(dt, v[i]));
        }
        attn_ref(qf, kf, vf, want, B, H, S, T, D, 1, 1.0 / sqrt(D));
        tp_tensor hins[3] = {mk(qh, dt, 4, (int64_t[]){B, H, S, D}), mk(kh, dt, 4, (int64_t[]){B, H, T, D}),
                             mk(vh, dt, 4, (int64_t[]){B, H, T, D})};
        tp_tensor hout = mk(oh, dt, 4, (int64_t[]){B, H, S, D});
        RUN_OK(TP_OP_ATTENTION, &a, hins, 3, &hout);
        for (int i = 0; i < B * H * S * D; i++) {
            float got = from_half(dt, oh[i]);
            ck_assert_msg(fabsf(got - want[i]) <= 2 * fabsf(want[i]) * ulp_rel(dt) + 1e-4f,
                          "%s attention %d: got %g want %g", tp_dtype_name(dt), i, got, want[i]);
        }
    }
}
END_TEST

/* The key-padding mask (input 3) against the reference: trailing padding
 * of a different length per batch row, as a batch of padded requests has,
 * with and without causal, INT64 and INT32, S == T and S < T. */
static void attn_mask_case(int B, int H, int S, int T, int D, int causal, tp_dtype mdt, const int64_t *mask)
{
    int nq = B * H * S * D, nk = B * H * T * D;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk);
    float *v = malloc(sizeof(float) * nk), *o = malloc(sizeof(float) * nq);
    float *want = malloc(sizeof(float) * nq);
    int32_t *m32 = malloc(sizeof(int32_t) * B * T);
    for (int i = 0; i < B * T; i++)
        m32[i] = (int32_t)mask[i];
    fill_rand(q, nq);
    fill_rand(k, nk);
    fill_rand(v, nk);
    tp_attrs a = attrs0();
    a.causal = causal;
    tp_tensor ins[4] = {mk(q, TP_F32, 4, (int64_t[]){B, H, S, D}), mk(k, TP_F32, 4, (int64_t[]){B, H, T, D}),
                        mk(v, TP_F32, 4, (int64_t[]){B, H, T, D}),
                        mk(mdt == TP_I64 ? (void *)mask : (void *)m32, mdt, 2, (int64_t[]){B, T})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &out);
    attn_ref_masked(q, k, v, mask, want, B, H, S, T, D, causal, 1.0 / sqrt(D));
    expect_near(o, want, nq, 1e-5f, 1e-5f);
    free(q);
    free(k);
    free(v);
    free(o);
    free(want);
    free(m32);
}

START_TEST(test_attention_key_padding)
{
    /* rows with 5, 3 and 1 real tokens of 5 */
    const int64_t pad[3 * 5] = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 0, 0, 0, 0};
    /* nonzero means attend, whatever the value; a hole in the middle */
    const int64_t odd[2 * 5] = {7, 0, -1, 1, 0, 0, 0, 1, 1, 1};
    for (int c = 0; c < 2; c++) {
        attn_mask_case(3, 2, 5, 5, 4, c, TP_I64, pad);
        attn_mask_case(3, 2, 5, 5, 4, c, TP_I32, pad);
        attn_mask_case(2, 3, 2, 5, 8, c, TP_I64, odd); /* S < T: KV cache */
    }
    /* causal blocks of 32 queries with padding: 70 and 45 real tokens */
    int64_t long_pad[2 * 70];
    for (int i = 0; i < 2 * 70; i++)
        long_pad[i] = i < 70 || i - 70 < 45;
    attn_mask_case(2, 1, 70, 70, 8, 1, TP_I64, long_pad);
}
END_TEST

START_TEST(test_attention_mask_hand)
{
    /* B=H=1, S=T=2, D=1, key 1 padded: both queries see key 0 only, even
     * with key 1 scoring far higher */
    float q[2] = {1, 1}, k[2] = {0, 50}, v[2] = {3, 5}, o[2];
    int64_t mask[2] = {1, 0};
    tp_attrs a = attrs0();
    tp_tensor ins[4] = {mk(q, TP_F32, 4, (int64_t[]){1, 1, 2, 1}), mk(k, TP_F32, 4, (int64_t[]){1, 1, 2, 1}),
                        mk(v, TP_F32, 4, (int64_t[]){1, 1, 2, 1}), mk(mask, TP_I64, 2, (int64_t[]){1, 2})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){1, 1, 2, 1});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &out);
    /* 1e-6: the one weight left is e/e in FP32, which may round off 1 */
    expect_near(o, (float[]){3, 3}, 2, 1e-6f, 0);
    /* causal + mask leaving query 0 nothing: key 0 padded, key 1 is in its
     * future. A query that sees no key gives a zero row, never NaN. */
    mask[0] = 0, mask[1] = 1;
    a.causal = 1;
    RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &out);
    expect_near(o, (float[]){0, 5}, 2, 1e-6f, 0);
    /* every key padded: zeros for every query, causal or not */
    mask[1] = 0;
    for (a.causal = 0; a.causal < 2; a.causal++) {
        o[0] = o[1] = NAN;
        RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &out);
        expect_near(o, (float[]){0, 0}, 2, 0, 0);
    }
}
END_TEST

/* Bucket padding: a batch padded with an all-padding row (what a padded
 * request row looks like) gives its real rows bit for bit what the exact
 * batch gives: the mask keeps batch rows apart. */
START_TEST(test_attention_mask_bucket_rows)
{
    enum { B = 2, BP = 4, H = 2, S = 4, D = 4 };
    float q[BP * H * S * D], k[BP * H * S * D], v[BP * H * S * D], o[BP * H * S * D], ob[BP * H * S * D];
    fill_rand(q, BP * H * S * D);
    fill_rand(k, BP * H * S * D);
    fill_rand(v, BP * H * S * D);
    int64_t mask[BP * S] = {1, 1, 1, 0, 1, 1, 0, 0}; /* rows 2, 3: zeros, as padding gives */
    tp_attrs a = attrs0();
    a.causal = 1;
    tp_tensor ins[4] = {mk(q, TP_F32, 4, (int64_t[]){B, H, S, D}), mk(k, TP_F32, 4, (int64_t[]){B, H, S, D}),
                        mk(v, TP_F32, 4, (int64_t[]){B, H, S, D}), mk(mask, TP_I64, 2, (int64_t[]){B, S})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &out);
    ins[0].shape[0] = ins[1].shape[0] = ins[2].shape[0] = ins[3].shape[0] = BP;
    tp_tensor outb = mk(ob, TP_F32, 4, (int64_t[]){BP, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 4, &outb);
    ck_assert_msg(memcmp(o, ob, sizeof(float) * B * H * S * D) == 0, "padding rows changed the real rows");
    for (int i = B * H * S * D; i < BP * H * S * D; i++)
        ck_assert_msg(ob[i] == 0.0f, "padding row element %d: %g, want 0", i, ob[i]);
}
END_TEST

/* Grouped-query attention: k, v [B, Hkv, T, D] with Hkv dividing H, each
 * kv head serving H / Hkv consecutive query heads (tp_attn_kv_head, as
 * repeat_kv lays them out): the bits of the same op on k and v repeated
 * to H heads (each head's math is the same code over the same values),
 * and the double reference; a head count that does not divide is refused. */
static void gqa_case(int B, int H, int Hkv, int S, int T, int D, int causal)
{
    int nq = B * H * S * D, nk = B * Hkv * T * D, nr = B * H * T * D, g = H / Hkv;
    float *q = malloc(sizeof(float) * nq), *k = malloc(sizeof(float) * nk), *v = malloc(sizeof(float) * nk);
    float *kr = malloc(sizeof(float) * nr), *vr = malloc(sizeof(float) * nr);
    float *o = malloc(sizeof(float) * nq), *orep = malloc(sizeof(float) * nq), *want = malloc(sizeof(float) * nq);
    fill_rand(q, nq);
    fill_rand(k, nk);
    fill_rand(v, nk);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            size_t dst = (size_t)((b * H + h) * T * D), src = (size_t)((b * Hkv + h / g) * T * D);
            memcpy(kr + dst, k + src, sizeof(float) * (size_t)(T * D));
            memcpy(vr + dst, v + src, sizeof(float) * (size_t)(T * D));
        }
    tp_attrs a = attrs0();
    a.causal = causal;
    tp_tensor ins[3] = {mk(q, TP_F32, 4, (int64_t[]){B, H, S, D}), mk(k, TP_F32, 4, (int64_t[]){B, Hkv, T, D}),
                        mk(v, TP_F32, 4, (int64_t[]){B, Hkv, T, D})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    ins[1] = mk(kr, TP_F32, 4, (int64_t[]){B, H, T, D});
    ins[2] = mk(vr, TP_F32, 4, (int64_t[]){B, H, T, D});
    out = mk(orep, TP_F32, 4, (int64_t[]){B, H, S, D});
    RUN_OK(TP_OP_ATTENTION, &a, ins, 3, &out);
    ck_assert_msg(memcmp(o, orep, sizeof(float) * (size_t)nq) == 0,
                  "GQA H %d Hkv %d: other bits than with k and v repeated", H, Hkv);
    attn_ref(q, kr, vr, want, B, H, S, T, D, causal, 1.0 / sqrt(D));
    expect_near(o, want, nq, 1e-5f, 1e-5f);
    free(q), free(k), free(v), free(kr), free(vr), free(o), free(orep), free(want);
}

START_TEST(test_attention_gqa)
{
    gqa_case(2, 4, 2, 5, 5, 8, 0);
    gqa_case(2, 4, 2, 70, 70, 8, 1); /* causal blocks */
    gqa_case(1, 6, 1, 3, 9, 4, 1);   /* one kv head for all, S != T */
    gqa_case(1, 3, 3, 4, 4, 4, 1);   /* Hkv = H: plain attention */
    float x[4 * 2 * 2] = {0}, o[4 * 2 * 2];
    tp_tensor ins[3] = {mk(x, TP_F32, 4, (int64_t[]){1, 4, 2, 2}), mk(x, TP_F32, 4, (int64_t[]){1, 3, 2, 2}),
                        mk(x, TP_F32, 4, (int64_t[]){1, 3, 2, 2})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){1, 4, 2, 2});
    ck_assert_int_eq(run(TP_OP_ATTENTION, NULL, ins, 3, &out), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "[1, 3, 2, 2]") && strstr(err.msg, "divides"), "%s", err.msg);
    ins[2] = mk(x, TP_F32, 4, (int64_t[]){1, 4, 2, 2}); /* k and v with other head counts */
    ins[1] = mk(x, TP_F32, 4, (int64_t[]){1, 2, 2, 2});
    ck_assert_int_eq(run(TP_OP_ATTENTION, NULL, ins, 3, &out), TP_INVALID);
}
END_TEST

START_TEST(test_attention_mask_refused)
{
    float q[4] = {0}, o[4];
    float fmask[2] = {1, 1};
    int64_t mask[3] = {1, 1, 1};
    tp_tensor ins[4] = {mk(q, TP_F32, 4, (int64_t[]){1, 1, 2, 2}), mk(q, TP_F32, 4, (int64_t[]){1, 1, 2, 2}),
                        mk(q, TP_F32, 4, (int64_t[]){1, 1, 2, 2}), mk(fmask, TP_F32, 2, (int64_t[]){1, 2})};
    tp_tensor out = mk(o, TP_F32, 4, (int64_t[]){1, 1, 2, 2});
    ck_assert_int_eq(run(TP_OP_ATTENTION, NULL, ins, 4, &out), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "INT32 or INT64") != NULL, "%s", err.msg);
    ins[3] = mk(mask, TP_I64, 2, (int64_t[]){1, 3}); /* T is 2 */
    ck_assert_int_eq(run(TP_OP_ATTENTION, NULL, ins, 4, &out), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "[1, 3]") != NULL && strstr(err.msg, "[B, T]") != NULL, "%s", err.msg);
}
END_TEST

/* ------------------------------------------------------------ rope */

/* rope(x, cos, sin) against the decomposed graph Llama's exports hold
 * (mul, slice, neg, cat, mul, add), run by the same cpu kernels: the same
 * bits in FP32 (tp_rope rounds as they do). x is q as the importer sees
 * it, [B, H, S, D] over [B, S, H, D] storage (a permuted view); cos and
 * sin are a [S, D] table or a step's rows [B, 1, S, D]. Then FP16/BF16:
 * the FP32 result of the widened inputs, rounded once. */
static void rope_case(int B, int H, int S, int D, int batched_tables, int x_transposed)
{
    int n = B * H * S * D, hD = D / 2, nt = batched_tables ? B * S * D : S * D;
    float *x = malloc(sizeof(float) * n), *c = malloc(sizeof(float) * nt), *sn = malloc(sizeof(float) * nt);
    float *got = malloc(sizeof(float) * n), *a = malloc(sizeof(float) * n), *neg = malloc(sizeof(float) * n / 2);
    float *cat = malloc(sizeof(float) * n), *b = malloc(sizeof(float) * n), *want = malloc(sizeof(float) * n);
    fill_rand(x, n);
    fill_rand(c, nt);
    fill_rand(sn, nt);
    tp_tensor xv = mk(x, TP_F32, 4, (int64_t[]){B, H, S, D});
    xv.stride[1] = D, xv.stride[2] = (int64_t)H * D; /* [B, S, H, D] storage */
    if (x_transposed) /* [B, H, D, S] storage: x's last dim S apart */
        xv.stride[1] = (int64_t)S * D, xv.stride[2] = 1, xv.stride[3] = S;
    tp_tensor ct = batched_tables ? mk(c, TP_F32, 4, (int64_t[]){B, 1, S, D}) : mk(c, TP_F32, 2, (int64_t[]){S, D});
    tp_tensor st = batched_tables ? mk(sn, TP_F32, 4, (int64_t[]){B, 1, S, D}) : mk(sn, TP_F32, 2, (int64_t[]){S, D});
    int64_t full[4] = {B, H, S, D}, half[4] = {B, H, S, hD};
    tp_tensor ins[3] = {xv, ct, st}, out = mk(got, TP_F32, 4, full);
    RUN_OK(TP_OP_ROPE, NULL, ins, 3, &out);
    /* the decomposed graph */
    tp_tensor mi[2] = {xv, ct}, ma = mk(a, TP_F32, 4, full);
    RUN_OK(TP_OP_MUL, NULL, mi, 2, &ma);
    tp_tensor x2 = tp_tensor_narrow(&xv, 3, hD, hD), x1 = tp_tensor_narrow(&xv, 3, 0, hD), ng = mk(neg, TP_F32, 4, half);
    RUN_OK(TP_OP_NEG, NULL, &x2, 1, &ng);
    tp_attrs at = attrs0();
    at.dim = 3;
    tp_tensor ci[2] = {ng, x1}, co = mk(cat, TP_F32, 4, full);
    RUN_OK(TP_OP_CAT, &at, ci, 2, &co);
    tp_tensor bi[2] = {co, st}, bo = mk(b, TP_F32, 4, full), ai[2] = {ma, bo}, ao = mk(want, TP_F32, 4, full);
    RUN_OK(TP_OP_MUL, NULL, bi, 2, &bo);
    RUN_OK(TP_OP_ADD, NULL, ai, 2, &ao);
    ck_assert_msg(memcmp(got, want, sizeof(float) * (size_t)n) == 0, "rope [%d, %d, %d, %d]: other bits than the "
                  "decomposed graph", B, H, S, D);
    /* FP16 / BF16: x, cos, sin rounded to the type; the FP32 rope of those, rounded once */
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    for (int di = 0; di < 2; di++) {
        tp_dtype dt = dts[di];
        uint16_t *xh = malloc(2 * (size_t)n), *ch = malloc(2 * (size_t)nt), *sh = malloc(2 * (size_t)nt);
        uint16_t *oh = malloc(2 * (size_t)n);
        float *xw = malloc(sizeof(float) * n), *cw = malloc(sizeof(float) * nt), *sw = malloc(sizeof(float) * nt);
        for (int i = 0; i < n; i++)
            xw[i] = from_half(dt, xh[i] = to_half(dt, x[i]));
        for (int i = 0; i < nt; i++) {
            cw[i] = from_half(dt, ch[i] = to_half(dt, c[i]));
            sw[i] = from_half(dt, sh[i] = to_half(dt, sn[i]));
        }
        tp_tensor hin[3] = {xv, ct, st}, win[3] = {xv, ct, st}, ho = mk(oh, dt, 4, full), wo = mk(want, TP_F32, 4, full);
        hin[0].data = xh, hin[1].data = ch, hin[2].data = sh;
        win[0].data = xw, win[1].data = cw, win[2].data = sw;
        for (int k = 0; k < 3; k++)
            hin[k].dtype = dt;
        RUN_OK(TP_OP_ROPE, NULL, hin, 3, &ho);
        RUN_OK(TP_OP_ROPE, NULL, win, 3, &wo);
        for (int i = 0; i < n; i++)
            ck_assert_msg(oh[i] == to_half(dt, want[i]), "%s rope element %d: got %g, want %g rounded",
                          tp_dtype_name(dt), i, from_half(dt, oh[i]), want[i]);
        free(xh), free(ch), free(sh), free(oh), free(xw), free(cw), free(sw);
    }
    free(x), free(c), free(sn), free(got), free(a), free(neg), free(cat), free(b), free(want);
}

START_TEST(test_rope)
{
    rope_case(2, 3, 5, 8, 0, 0);
    rope_case(2, 3, 5, 8, 1, 0);
    rope_case(2, 3, 5, 8, 0, 1);    /* x's last dim strided */
    rope_case(1, 2, 7, 2, 0, 0);    /* one element a half */
    rope_case(1, 1, 3, 1024, 0, 1); /* halves past one narrow chunk */
    /* hand values: D 2, x (1, 2), cos (0.5, 0.25), sin (3, 4): (1*0.5 - 2*3, 2*0.25 + 1*4) */
    float x[2] = {1, 2}, c[2] = {0.5f, 0.25f}, sn[2] = {3, 4}, o[2];
    tp_tensor ins[3] = {mk(x, TP_F32, 1, (int64_t[]){2}), mk(c, TP_F32, 1, (int64_t[]){2}),
                        mk(sn, TP_F32, 1, (int64_t[]){2})};
    tp_tensor out = mk(o, TP_F32, 1, (int64_t[]){2});
    RUN_OK(TP_OP_ROPE, NULL, ins, 3, &out);
    expect_near(o, (float[]){-5.5f, 4.5f}, 2, 0, 0);
    /* refused: an odd last dim; a table that does not broadcast */
    float y[6] = {0}, oy[6];
    tp_tensor bad[3] = {mk(y, TP_F32, 2, (int64_t[]){2, 3}), mk(y, TP_F32, 1, (int64_t[]){3}),
                        mk(y, TP_F32, 1, (int64_t[]){3})};
    tp_tensor bo = mk(oy, TP_F32, 2, (int64_t[]){2, 3});
    ck_assert_int_eq(run(TP_OP_ROPE, NULL, bad, 3, &bo), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "last dim even"), "%s", err.msg);
    bad[0] = mk(y, TP_F32, 2, (int64_t[]){3, 2});
    bad[1] = mk(y, TP_F32, 1, (int64_t[]){3});
    bo = mk(oy, TP_F32, 2, (int64_t[]){3, 2});
    ck_assert_int_eq(run(TP_OP_ROPE, NULL, bad, 3, &bo), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "input 1") && strstr(err.msg, "does not broadcast"), "%s", err.msg);
}
END_TEST

/* ------------------------------------------------------------ embedding */

START_TEST(test_embedding)
{
    float table[5 * 3];
    for (int i = 0; i < 15; i++)
        table[i] = (float)i;
    int32_t ids[4] = {4, 0, 2, 2};
    float o[4 * 3];
    tp_tensor ins[2] = {mk(ids, TP_I32, 2, (int64_t[]){2, 2}), mk(table, TP_F32, 2, (int64_t[]){5, 3})};
    tp_tensor out = mk(o, TP_F32, 3, (int64_t[]){2, 2, 3});
    RUN_OK(TP_OP_EMBEDDING, NULL, ins, 2, &out);
    expect_near(o, (float[]){12, 13, 14, 0, 1, 2, 6, 7, 8, 6, 7, 8}, 12, 0, 0);
    /* INT64 ids, transposed view: order 4, 2, 0, 2 */
    int64_t ids64[4] = {4, 0, 2, 2};
    ins[0] = view(ids64, TP_I64, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2});
    RUN_OK(TP_OP_EMBEDDING, NULL, ins, 2, &out);
    expect_near(o, (float[]){12, 13, 14, 6, 7, 8, 0, 1, 2, 6, 7, 8}, 12, 0, 0);
    /* out of range without vocab_parallel: error naming id and V */
    ids[2] = 7;
    ins[0] = mk(ids, TP_I32, 2, (int64_t[]){2, 2});
    ck_assert_int_eq(run(TP_OP_EMBEDDING, NULL, ins, 2, &out), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "id 7") && strstr(err.msg, "V=5"), "message: %s", err.msg);
    ids[2] = -1;
    ck_assert_int_eq(run(TP_OP_EMBEDDING, NULL, ins, 2, &out), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "id -1"));
}
END_TEST

START_TEST(test_embedding_vocab_parallel)
{
    /* global vocab 6 over 2 ranks; rank 1 holds global rows 3..5 */
    float local[3 * 2] = {30, 31, 40, 41, 50, 51};
    int64_t ids[5] = {0, 3, 5, 2, 4};
    float o[5 * 2];
    tp_attrs a = attrs0();
    a.vocab_parallel = 1;
    tp_tensor ins[2] = {mk(ids, TP_I64, 1, (int64_t[]){5}), mk(local, TP_F32, 2, (int64_t[]){3, 2})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){5, 2});
    ck_assert_int_eq(cpu_op_run(TP_OP_EMBEDDING, &a, ins, 2, &out, 1, 2, &err), TP_OK);
    expect_near(o, (float[]){0, 0, 30, 31, 50, 51, 0, 0, 40, 41}, 10, 0, 0);
    /* rank 0 gives the complementary rows as zeros */
    ck_assert_int_eq(cpu_op_run(TP_OP_EMBEDDING, &a, ins, 2, &out, 0, 2, &err), TP_OK);
    expect_near(o, (float[]){30, 31, 0, 0, 0, 0, 50, 51, 0, 0}, 10, 0, 0);
    /* BF16 table, strided (column-major) */
    uint16_t th[6], oh[10];
    for (int r = 0; r < 3; r++)
        for (int c = 0; c < 2; c++)
            th[c * 3 + r] = tp_f32_to_bf16(local[r * 2 + c]);
    ins[1] = view(th, TP_BF16, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3});
    out = mk(oh, TP_BF16, 2, (int64_t[]){5, 2});
    ck_assert_int_eq(cpu_op_run(TP_OP_EMBEDDING, &a, ins, 2, &out, 1, 2, &err), TP_OK);
    float want[10] = {0, 0, 30, 31, 50, 51, 0, 0, 40, 41};
    for (int i = 0; i < 10; i++)
        ck_assert_uint_eq(oh[i], tp_f32_to_bf16(want[i]));
    /* an id outside the whole vocabulary is an error on every rank */
    ids[1] = 6;
    ck_assert_int_eq(cpu_op_run(TP_OP_EMBEDDING, &a, ins, 2, &out, 1, 2, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "id 6"));
}
END_TEST

/* ------------------------------------------------------------ copies */

START_TEST(test_cat)
{
    float a[3] = {1, 2, 3}, b[6] = {4, 5, 6, 7, 8, 9}, o[9];
    tp_attrs at = attrs0();
    at.dim = 0;
    tp_tensor ins[2] = {mk(a, TP_F32, 2, (int64_t[]){1, 3}), mk(b, TP_F32, 2, (int64_t[]){2, 3})};
    tp_tensor out = mk(o, TP_F32, 2, (int64_t[]){3, 3});
    RUN_OK(TP_OP_CAT, &at, ins, 2, &out);
    expect_near(o, (float[]){1, 2, 3, 4, 5, 6, 7, 8, 9}, 9, 0, 0);
    /* dim 1: [2,1] + transposed view [2,2] of [[4,5],[6,7]] -> [[1,4,6],[2,5,7]] */
    float c[2] = {1, 2}, d[4] = {4, 5, 6, 7}, o2[6];
    at.dim = 1;
    ins[0] = mk(c, TP_F32, 2, (int64_t[]){2, 1});
    ins[1] = view(d, TP_F32, 2, (int64_t[]){2, 2}, (int64_t[]){1, 2});
    out = mk(o2, TP_F32, 2, (int64_t[]){2, 3});
    RUN_OK(TP_OP_CAT, &at, ins, 2, &out);
    expect_near(o2, (float[]){1, 4, 6, 2, 5, 7}, 6, 0, 0);
    /* three INT32 inputs on dim 1 */
    int32_t x[2] = {1, 2}, y[4] = {3, 4, 5, 6}, z[2] = {7, 8}, oi[8];
    tp_tensor ins3[3] = {mk(x, TP_I32, 2, (int64_t[]){2, 1}), mk(y, TP_I32, 2, (int64_t[]){2, 2}),
                         mk(z, TP_I32, 2, (int64_t[]){2, 1})};
    out = mk(oi, TP_I32, 2, (int64_t[]){2, 4});
    RUN_OK(TP_OP_CAT, &at, ins3, 3, &out);
    int32_t wi[8] = {1, 3, 4, 7, 2, 5, 6, 8};
    for (int i = 0; i < 8; i++)
        ck_assert_int_eq(oi[i], wi[i]);
    /* sizes not adding up is an error */
    out = mk(o2, TP_F32, 2, (int64_t[]){2, 3});
    ins[1] = mk(d, TP_F32, 2, (int64_t[]){2, 1});
    ck_assert_int_eq(run(TP_OP_CAT, &at, ins, 2, &out), TP_INVALID);
}
END_TEST

START_TEST(test_contiguous_reshape)
{
    /* base [2,3,4] permuted (2,0,1) -> [4,2,3] */
    float base[24], o[24];
    for (int i = 0; i < 24; i++)
        base[i] = (float)i;
    tp_tensor in = view(base, TP_F32, 3, (int64_t[]){4, 2, 3}, (int64_t[]){1, 12, 4});
    tp_tensor out = mk(o, TP_F32, 3, (int64_t[]){4, 2, 3});
    RUN_OK(TP_OP_CONTIGUOUS, NULL, &in, 1, &out);
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                ck_assert(o[(i * 2 + j) * 3 + k] == base[j * 12 + k * 4 + i]);
    /* reshape of a transposed [3,2] view of [2,3] to [6] */
    float m[6] = {1, 2, 3, 4, 5, 6}, r[6];
    in = view(m, TP_F32, 2, (int64_t[]){3, 2}, (int64_t[]){1, 3});
    out = mk(r, TP_F32, 1, (int64_t[]){6});
    RUN_OK(TP_OP_RESHAPE, NULL, &in, 1, &out);
    expect_near(r, (float[]){1, 4, 2, 5, 3, 6}, 6, 0, 0);
    out = mk(r, TP_F32, 1, (int64_t[]){5});
    ck_assert_int_eq(run(TP_OP_RESHAPE, NULL, &in, 1, &out), TP_INVALID);
}
END_TEST

START_TEST(test_unknown_op)
{
    float x[2] = {1, 2}, o[2];
    tp_tensor in = mk(x, TP_F32, 1, (int64_t[]){2}), out = mk(o, TP_F32, 1, (int64_t[]){2});
    ck_assert_int_eq(run(TP_OP_ALL_REDUCE, NULL, &in, 1, &out), TP_INTERNAL);
    ck_assert_ptr_nonnull(strstr(err.msg, "all_reduce"));
    ck_assert_int_eq(run(TP_OP_VIEW, NULL, &in, 1, &out), TP_INTERNAL);
    ck_assert_int_eq(run((tp_op)999, NULL, &in, 1, &out), TP_INTERNAL);
}
END_TEST

/* tp_tensor_copy folds dims that both sides step over as one run (and
 * drops size-1 dims) before copying: every pattern here (slices along
 * each dim, permutations, size-1 dims with odd strides, a broadcast
 * source) against an element-by-element copy by index, with sentinels
 * showing nothing outside dst's elements is written. */
static int64_t offset_of(const int64_t *idx, const int64_t *stride, int nd)
{
    int64_t o = 0;
    for (int i = 0; i < nd; i++)
        o += idx[i] * stride[i];
    return o;
}

static void check_copy(int nd, const int64_t *shape, const int64_t *dst_stride, const int64_t *src_stride,
                       const char *what)
{
    enum { SPACE = 4096 };
    static float src_buf[SPACE], got[SPACE], want[SPACE];
    tu_fill(src_buf, SPACE, (unsigned)nd * 7 + (unsigned)shape[0]);
    for (int i = 0; i < SPACE; i++)
        got[i] = want[i] = -7.25f;
    tp_tensor dst = tp_tensor_make(got, TP_F32, nd, shape), src = tp_tensor_make(src_buf, TP_F32, nd, shape);
    memcpy(dst.stride, dst_stride, sizeof(int64_t) * (size_t)nd);
    memcpy(src.stride, src_stride, sizeof(int64_t) * (size_t)nd);
    tp_tensor_copy(&dst, &src);
    int64_t idx[TP_MAX_DIMS] = {0}, n = tp_tensor_numel(&dst);
    for (int64_t e = 0; e < n; e++) {
        want[offset_of(idx, dst_stride, nd)] = src_buf[offset_of(idx, src_stride, nd)];
        for (int k = nd - 1; k >= 0 && ++idx[k] == shape[k]; k--)
            idx[k] = 0;
    }
    ck_assert_msg(memcmp(got, want, sizeof got) == 0, "tp_tensor_copy %s: elements differ from the copy by index",
                  what);
}

START_TEST(test_tensor_copy_folds_runs)
{
    /* a [2, 4, 32] shard into a [2, 8, 32] gather (the fused all-gather) and back */
    check_copy(3, (int64_t[]){2, 4, 32}, (int64_t[]){256, 32, 1}, (int64_t[]){128, 32, 1}, "shard into gather");
    check_copy(3, (int64_t[]){2, 4, 32}, (int64_t[]){128, 32, 1}, (int64_t[]){256, 32, 1}, "gather into shard");
    /* slices along each dim of a [3, 5, 7] block */
    check_copy(3, (int64_t[]){3, 5, 7}, (int64_t[]){35, 7, 1}, (int64_t[]){80, 10, 1}, "inner slice");
    check_copy(3, (int64_t[]){3, 5, 7}, (int64_t[]){35, 7, 1}, (int64_t[]){70, 7, 1}, "middle slice");
    check_copy(3, (int64_t[]){2, 5, 7}, (int64_t[]){35, 7, 1}, (int64_t[]){35, 7, 1}, "contiguous");
    /* a permutation: no unit stride on one side */
    check_copy(3, (int64_t[]){4, 3, 5}, (int64_t[]){15, 5, 1}, (int64_t[]){1, 20, 4}, "transposed source");
    check_copy(2, (int64_t[]){6, 9}, (int64_t[]){1, 6}, (int64_t[]){9, 1}, "transposed destination");
    /* size-1 dims with strides that would break a run if they counted */
    check_copy(4, (int64_t[]){3, 1, 4, 8}, (int64_t[]){32, 999, 8, 1}, (int64_t[]){64, 5, 8, 1}, "size-1 dim");
    check_copy(3, (int64_t[]){1, 1, 1}, (int64_t[]){5, 6, 7}, (int64_t[]){9, 9, 9}, "one element");
    /* a broadcast source (stride 0) */
    check_copy(3, (int64_t[]){4, 3, 8}, (int64_t[]){24, 8, 1}, (int64_t[]){0, 8, 1}, "broadcast rows");
    check_copy(2, (int64_t[]){5, 6}, (int64_t[]){6, 1}, (int64_t[]){1, 0}, "broadcast columns");
}
END_TEST

static Suite *cpu_ops_suite(void)
{
    Suite *s = suite_create("cpu_ops");
    TCase *tc = tcase_create("ops");
    /* matmul_middle_dim_block takes 2-3 s under ASan on a 2.3 GHz Xeon:
     * too near Check's default of 4 on a loaded machine */
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_add_broadcast_row);
    tcase_add_test(tc, test_mul_broadcast_3d);
    tcase_add_test(tc, test_binary_strided);
    tcase_add_test(tc, test_int_add);
    tcase_add_test(tc, test_binary_half);
    tcase_add_test(tc, test_activations);
    tcase_add_test(tc, test_activations_strided_half);
    tcase_add_test(tc, test_softmax_last);
    tcase_add_test(tc, test_softmax_dim0);
    tcase_add_test(tc, test_layer_norm);
    tcase_add_test(tc, test_rms_norm);
    tcase_add_test(tc, test_matmul_basic);
    tcase_add_test(tc, test_matmul_batch_broadcast);
    tcase_add_test(tc, test_matmul_strided);
    tcase_add_test(tc, test_matmul_one_row);
    tcase_add_test(tc, test_matmul_into_column_block);
    tcase_add_test(tc, test_matmul_middle_dim_block);
    tcase_add_test(tc, test_matmul_half);
    tcase_add_test(tc, test_attention_f32);
    tcase_add_test(tc, test_attention_causal_hand);
    tcase_add_test(tc, test_attention_strided_half);
    tcase_add_test(tc, test_attention_key_padding);
    tcase_add_test(tc, test_attention_mask_hand);
    tcase_add_test(tc, test_attention_mask_bucket_rows);
    tcase_add_test(tc, test_attention_mask_refused);
    tcase_add_test(tc, test_attention_gqa);
    tcase_add_test(tc, test_rope);
    tcase_add_test(tc, test_embedding);
    tcase_add_test(tc, test_embedding_vocab_parallel);
    tcase_add_test(tc, test_cat);
    tcase_add_test(tc, test_contiguous_reshape);
    tcase_add_test(tc, test_tensor_copy_folds_runs);
    tcase_add_test(tc, test_unknown_op);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(cpu_ops_suite)
