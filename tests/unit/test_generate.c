/* test_generate.c — text generation in the engine (docs/models.md,
 * "Generation graphs"): the key packing and slot math of
 * kernels/common/tp_generate.h, the cpu kernels kv_attention / argmax /
 * argmax_index against naive references, matmul_rows against matmul, the
 * loader's errors for states and the generate block (logit_rows too), and
 * the example decoder (graphs/gen_examples.py, gen_decoder_tp{1,2,4})
 * driven step by step through tp_engine_infer at world sizes 1, 2, 4,
 * ranks as threads and as processes, giving exactly the NumPy reference's
 * greedy tokens on the rows logit_rows wants (and id 0, a zero row's
 * argmax, on the others).
 *
 * Tolerances: kv_attention FP32 within 1e-5 absolute of the double
 * reference (FP32 accumulation of a few products); FP16 within 2e-3 and
 * BF16 within 1.6e-2 absolute (inputs are exact in the type and |out| < 1,
 * so this is about 2 ulp of the output's rounding plus the FP32 error).
 * Tokens are compared exactly: the reference refuses near ties (margin
 * >= 1e-3 between its two best logits), far above FP32's error here.
 * matmul_rows' wanted rows are compared bit for bit with matmul on the
 * same run of rows (the same GEMM call), and (FP32) with matmul over every
 * row within MM_ROWS_TOL relative: a different M may take another BLAS path
 * (sgemv for one row, small_gemm, sgemm) that sums K = 64 products in
 * another order, a few FP32 ulps of a sum of |terms| <= 64. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "common/tp_generate.h"
#include "cpu/cpu_ops.h"
#include "engine.h"
#include "graph.h"
#include "testutil.h"

#define KV_FP32_TOL 1e-5
#define KV_FP16_TOL 2e-3
#define KV_BF16_TOL 1.6e-2
#define MM_ROWS_TOL 1e-5

/* ------------------------------------------------------- key packing */

START_TEST(keys_order_like_floats)
{
    const float v[] = {-INFINITY, -1e30f, -2.5f, -1.0f, -1e-30f, 0.0f, 1e-30f, 0.5f, 1.0f, 3e38f, INFINITY};
    int n = (int)(sizeof v / sizeof v[0]);
    for (int i = 0; i + 1 < n; i++) {
        ck_assert_uint_lt(tp_gen_ordered_bits(v[i]), tp_gen_ordered_bits(v[i + 1]));
        /* signed INT64 max (an all_reduce) must agree, at any index */
        ck_assert(tp_gen_key(v[i], 0) < tp_gen_key(v[i + 1], 4000000000u));
        ck_assert(tp_gen_key(v[i], 7) > TP_GEN_NO_KEY);
    }
    /* NaN is -inf; -0.0 is +0.0 */
    ck_assert_uint_eq(tp_gen_ordered_bits(NAN), tp_gen_ordered_bits(-INFINITY));
    ck_assert_uint_eq(tp_gen_ordered_bits(-0.0f), tp_gen_ordered_bits(0.0f));
    /* ties: the lower index has the larger key */
    ck_assert(tp_gen_key(1.5f, 3) > tp_gen_key(1.5f, 4));
    for (uint32_t id = 0; id < 70000; id += 997)
        ck_assert_int_eq(tp_gen_key_index(tp_gen_key(-3.25f, id)), id);
    ck_assert_int_eq(tp_gen_key_index(tp_gen_key(1.0f, TP_GEN_MAX_INDEX)), TP_GEN_MAX_INDEX);
}
END_TEST

START_TEST(row_checks_and_heads)
{
    ck_assert_int_eq(tp_gen_row_check(0, 99, 4, 1, 8), TP_GEN_ROW_INACTIVE);
    ck_assert_int_eq(tp_gen_row_check(1, 7, 4, 1, 8), TP_GEN_ROW_ACTIVE);
    ck_assert_int_eq(tp_gen_row_check(4, 0, 4, 1, 8), TP_GEN_ROW_ACTIVE);
    ck_assert_int_eq(tp_gen_row_check(5, 0, 4, 1, 8), TP_GEN_ROW_BAD_SLOT);
    ck_assert_int_eq(tp_gen_row_check(-1, 0, 4, 1, 8), TP_GEN_ROW_BAD_SLOT);
    ck_assert_int_eq(tp_gen_row_check(1, 8, 4, 1, 8), TP_GEN_ROW_BAD_POS);
    ck_assert_int_eq(tp_gen_row_check(1, 6, 4, 3, 8), TP_GEN_ROW_BAD_POS);
    ck_assert_int_eq(tp_gen_row_check(1, -1, 4, 1, 8), TP_GEN_ROW_BAD_POS);
    /* GQA: 8 query heads over 2 kv heads, 4 per group */
    int64_t want[8] = {0, 0, 0, 0, 1, 1, 1, 1};
    for (int h = 0; h < 8; h++)
        ck_assert_int_eq(tp_attn_kv_head(h, 8, 2), want[h]);
    ck_assert_int_eq(tp_attn_kv_head(3, 4, 4), 3);
}
END_TEST

/* ------------------------------------------------------- kv_attention */

enum { B_ = 4, H_ = 4, HKV_ = 2, T_ = 1, D_ = 3, S_ = 3, L_ = 6 };

typedef struct {
    tp_dtype dt;
    float q[B_ * H_ * T_ * D_], k[B_ * HKV_ * T_ * D_], v[B_ * HKV_ * T_ * D_];
    double kc[S_ * HKV_ * L_ * D_], vc[S_ * HKV_ * L_ * D_]; /* the reference's caches */
    uint16_t q16[B_ * H_ * D_], k16[B_ * HKV_ * D_], v16[B_ * HKV_ * D_];
    uint16_t kc16[S_ * HKV_ * L_ * D_], vc16[S_ * HKV_ * L_ * D_], out16[B_ * H_ * D_];
    float kcf[S_ * HKV_ * L_ * D_], vcf[S_ * HKV_ * L_ * D_], outf[B_ * H_ * D_];
    int64_t slot[B_], pos[B_];
} kv_case;

/* Values exactly representable in every float type: multiples of 1/64 in
 * (-1, 1). */
static float exact_value(unsigned *seed)
{
    *seed = *seed * 1103515245u + 12345u;
    return (float)((int)((*seed >> 16) % 127) - 63) / 64.0f;
}

static void kv_fill(kv_case *c, tp_dtype dt, unsigned seed)
{
    c->dt = dt;
    for (int i = 0; i < B_ * H_ * D_; i++)
        c->q[i] = exact_value(&seed);
    for (int i = 0; i < B_ * HKV_ * D_; i++) {
        c->k[i] = exact_value(&seed);
        c->v[i] = exact_value(&seed);
    }
}

static void *kv_buf(kv_case *c, float *f, uint16_t *h, int64_t n, int store)
{
    if (c->dt == TP_F32)
        return f;
    for (int64_t i = 0; store && i < n; i++)
        tp_store_f32(h, c->dt, i, f[i]);
    return h;
}

/* One step of the kernel on the case's rows; the caches persist in the
 * case between steps. */
static tp_status kv_run(kv_case *c, float *out, tp_err *err)
{
    int64_t qs[4] = {B_, H_, T_, D_}, ks[4] = {B_, HKV_, T_, D_}, cs[4] = {S_, HKV_, L_, D_}, bs[1] = {B_};
    void *kc = c->dt == TP_F32 ? (void *)c->kcf : c->kc16, *vc = c->dt == TP_F32 ? (void *)c->vcf : c->vc16;
    tp_tensor ins[7] = {
        tp_tensor_make(kv_buf(c, c->q, c->q16, B_ * H_ * D_, 1), c->dt, 4, qs),
        tp_tensor_make(kv_buf(c, c->k, c->k16, B_ * HKV_ * D_, 1), c->dt, 4, ks),
        tp_tensor_make(kv_buf(c, c->v, c->v16, B_ * HKV_ * D_, 1), c->dt, 4, ks),
        tp_tensor_make(kc, c->dt, 4, cs),
        tp_tensor_make(vc, c->dt, 4, cs),
        tp_tensor_make(c->slot, TP_I64, 1, bs),
        tp_tensor_make(c->pos, TP_I64, 1, bs),
    };
    tp_tensor o = tp_tensor_make(c->dt == TP_F32 ? (void *)out : c->out16, c->dt, 4, qs);
    tp_attrs a = {0};
    tp_status st = cpu_op_run(TP_OP_KV_ATTENTION, &a, ins, 7, &o, 0, 1, err);
    for (int i = 0; st == TP_OK && c->dt != TP_F32 && i < B_ * H_ * D_; i++)
        out[i] = tp_load_f32(c->out16, c->dt, i);
    return st;
}

/* The naive reference of one step, in double: all writes, then for each
 * active row and query head the softmax over keys 0..pos of its kv head
 * (h / (H / Hkv)). */
static void kv_reference(kv_case *c, double *out)
{
    for (int b = 0; b < B_; b++)
        if (c->slot[b])
            for (int kh = 0; kh < HKV_; kh++)
                for (int d = 0; d < D_; d++) {
                    int64_t off = (((c->slot[b] - 1) * HKV_ + kh) * L_ + c->pos[b]) * D_ + d;
                    c->kc[off] = c->k[(b * HKV_ + kh) * D_ + d];
                    c->vc[off] = c->v[(b * HKV_ + kh) * D_ + d];
                }
    memset(out, 0, sizeof(double) * B_ * H_ * D_);
    for (int b = 0; b < B_; b++) {
        if (!c->slot[b])
            continue;
        for (int h = 0; h < H_; h++) {
            int kh = h / (H_ / HKV_);
            double sc[L_], mx = -INFINITY, sum = 0;
            for (int j = 0; j <= c->pos[b]; j++) {
                double dot = 0;
                for (int d = 0; d < D_; d++)
                    dot += c->q[(b * H_ + h) * D_ + d] * c->kc[(((c->slot[b] - 1) * HKV_ + kh) * L_ + j) * D_ + d];
                sc[j] = dot / sqrt((double)D_);
                mx = sc[j] > mx ? sc[j] : mx;
            }
            for (int j = 0; j <= c->pos[b]; j++)
                sum += sc[j] = exp(sc[j] - mx);
            for (int j = 0; j <= c->pos[b]; j++)
                for (int d = 0; d < D_; d++)
                    out[(b * H_ + h) * D_ + d] +=
                        sc[j] / sum * c->vc[(((c->slot[b] - 1) * HKV_ + kh) * L_ + j) * D_ + d];
        }
    }
}

static void kv_step(kv_case *c, const int64_t *slot, const int64_t *pos, unsigned seed, double tol)
{
    memcpy(c->slot, slot, sizeof c->slot);
    memcpy(c->pos, pos, sizeof c->pos);
    kv_fill(c, c->dt, seed);
    float out[B_ * H_ * D_];
    double ref[B_ * H_ * D_];
    tp_err err = {{0}};
    ck_assert_msg(kv_run(c, out, &err) == TP_OK, "%s", err.msg);
    kv_reference(c, ref);
    for (int i = 0; i < B_ * H_ * D_; i++) {
        ck_assert_msg(fabs(out[i] - ref[i]) <= tol, "%s element %d: %g vs %g", tp_dtype_name(c->dt), i, out[i],
                      ref[i]);
        if (!c->slot[i / (H_ * D_)]) /* inactive rows: exact zeros */
            ck_assert(out[i] == 0.0f && !signbit(out[i]));
    }
}

/* Prefill rows of one sequence in one step see each other causally;
 * slot-0 rows write nothing and give zeros; GQA maps heads by group; the
 * caches carry a sequence across steps; a slot is reused. */
static void kv_scenario(tp_dtype dt, double tol)
{
    kv_case *c = calloc(1, sizeof *c);
    c->dt = dt;
    /* step 1: sequence in slot 2 prefills positions 0..2, a padding row */
    kv_step(c, (int64_t[]){2, 2, 0, 2}, (int64_t[]){0, 1, 5, 2}, 11, tol);
    /* the padding row wrote nothing: slot 1 (untouched) is still zeros */
    for (int i = 0; i < HKV_ * L_ * D_; i++)
        ck_assert(dt == TP_F32 ? c->kcf[i] == 0.0f : c->kc16[i] == 0);
    /* step 2: decode slot 2 at 3, slot 1 and slot 3 start, one padding row */
    kv_step(c, (int64_t[]){1, 2, 0, 3}, (int64_t[]){0, 3, 0, 0}, 12, tol);
    /* step 3: decodes up to the last position, slot 3 reused from 0 */
    kv_step(c, (int64_t[]){2, 1, 3, 3}, (int64_t[]){4, 1, 0, 1}, 13, tol);
    kv_step(c, (int64_t[]){2, 0, 0, 0}, (int64_t[]){L_ - 1, 0, 0, 0}, 14, tol);
    free(c);
}

START_TEST(kv_attention_fp32) { kv_scenario(TP_F32, KV_FP32_TOL); }
END_TEST
START_TEST(kv_attention_fp16) { kv_scenario(TP_F16, KV_FP16_TOL); }
END_TEST
START_TEST(kv_attention_bf16) { kv_scenario(TP_BF16, KV_BF16_TOL); }
END_TEST

/* A bad slot or position fails the node naming the row, and nothing was
 * written (the checks run before any write). */
START_TEST(kv_attention_refuses_bad_rows)
{
    kv_case *c = calloc(1, sizeof *c);
    c->dt = TP_F32;
    kv_fill(c, TP_F32, 5);
    float out[B_ * H_ * D_];
    const struct {
        int64_t slot[B_], pos[B_];
        const char *msg;
    } bad[] = {
        {{1, 2, S_ + 1, 0}, {0, 0, 0, 0}, "row 2 has slot 4, outside 0..3"},
        {{1, -1, 0, 0}, {0, 0, 0, 0}, "row 1 has slot -1"},
        {{1, 1, 0, 0}, {0, L_, 0, 0}, "row 1 has position 6"},
        {{1, 1, 0, 0}, {-2, 0, 0, 0}, "row 0 has position -2"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        memcpy(c->slot, bad[i].slot, sizeof c->slot);
        memcpy(c->pos, bad[i].pos, sizeof c->pos);
        tp_err err = {{0}};
        ck_assert_int_eq(kv_run(c, out, &err), TP_INVALID);
        ck_assert_msg(strstr(err.msg, bad[i].msg), "%s", err.msg);
        for (int k = 0; k < S_ * HKV_ * L_ * D_; k++)
            ck_assert(c->kcf[k] == 0.0f && c->vcf[k] == 0.0f);
    }
    free(c);
}
END_TEST

/* Rows of T tokens: one row of T = 2 at position p is the same as two
 * rows of one token at p and p + 1 of the same slot in one step (both
 * write before they read), bit for bit: each query runs the same FP32
 * operations in the same order. */
static void kv_rows(int64_t B, int64_t T, const float *q, const float *k, const float *v, float *kc, float *vc,
                    int64_t *slot, int64_t *pos, float *out)
{
    int64_t qs[4] = {B, H_, T, D_}, ks[4] = {B, HKV_, T, D_}, cs[4] = {S_, HKV_, L_, D_}, bs[1] = {B};
    tp_tensor ins[7] = {tp_tensor_make((void *)q, TP_F32, 4, qs), tp_tensor_make((void *)k, TP_F32, 4, ks),
                        tp_tensor_make((void *)v, TP_F32, 4, ks), tp_tensor_make(kc, TP_F32, 4, cs),
                        tp_tensor_make(vc, TP_F32, 4, cs),        tp_tensor_make(slot, TP_I64, 1, bs),
                        tp_tensor_make(pos, TP_I64, 1, bs)};
    tp_tensor o = tp_tensor_make(out, TP_F32, 4, qs);
    tp_attrs a = {.has_scale = 1, .scale = 0.7f};
    tp_err err = {{0}};
    ck_assert_msg(cpu_op_run(TP_OP_KV_ATTENTION, &a, ins, 7, &o, 0, 1, &err) == TP_OK, "%s", err.msg);
}

START_TEST(kv_attention_rows_of_t_tokens)
{
    enum { T2 = 2, NC = S_ * HKV_ * L_ * D_ };
    float q[H_ * T2 * D_], k[HKV_ * T2 * D_], v[HKV_ * T2 * D_], q0[H_ * D_], k0[HKV_ * D_], v0[HKV_ * D_];
    tu_fill(q, H_ * T2 * D_, 1), tu_fill(k, HKV_ * T2 * D_, 2), tu_fill(v, HKV_ * T2 * D_, 3);
    tu_fill(q0, H_ * D_, 4), tu_fill(k0, HKV_ * D_, 5), tu_fill(v0, HKV_ * D_, 6);
    static float kc[2][NC], vc[2][NC];
    float out0[H_ * D_], wide[H_ * T2 * D_], split[2 * H_ * D_];
    int64_t s1[1] = {2}, p0[1] = {0};
    for (int c = 0; c < 2; c++) /* position 0 of slot 2 first, the same in both */
        kv_rows(1, 1, q0, k0, v0, kc[c], vc[c], s1, p0, out0);
    int64_t s_w[1] = {2}, p_w[1] = {1};
    kv_rows(1, T2, q, k, v, kc[0], vc[0], s_w, p_w, wide);
    /* the same tokens as two rows: row t = token t, [B=2, H, 1, D] */
    float qs[2 * H_ * D_], ks[2 * HKV_ * D_], vs[2 * HKV_ * D_];
    for (int t = 0; t < T2; t++) {
        for (int h = 0; h < H_; h++)
            memcpy(&qs[(t * H_ + h) * D_], &q[(h * T2 + t) * D_], sizeof(float) * D_);
        for (int h = 0; h < HKV_; h++) {
            memcpy(&ks[(t * HKV_ + h) * D_], &k[(h * T2 + t) * D_], sizeof(float) * D_);
            memcpy(&vs[(t * HKV_ + h) * D_], &v[(h * T2 + t) * D_], sizeof(float) * D_);
        }
    }
    int64_t s_s[2] = {2, 2}, p_s[2] = {1, 2};
    kv_rows(2, 1, qs, ks, vs, kc[1], vc[1], s_s, p_s, split);
    ck_assert(memcmp(kc[0], kc[1], sizeof kc[0]) == 0 && memcmp(vc[0], vc[1], sizeof vc[0]) == 0);
    for (int t = 0; t < T2; t++)
        for (int h = 0; h < H_; h++)
            ck_assert(memcmp(&wide[(h * T2 + t) * D_], &split[(t * H_ + h) * D_], sizeof(float) * D_) == 0);
}
END_TEST

/* ------------------------------------------------------------- argmax */

static tp_status argmax_run(const float *x, int64_t rows, int64_t n, const tp_attrs *a, int rank, int world,
                            int64_t *keys, int64_t *ids, tp_err *err)
{
    int64_t xs[2] = {rows, n}, ks[1] = {rows};
    tp_tensor in = tp_tensor_make((void *)x, TP_F32, 2, xs), k = tp_tensor_make(keys, TP_I64, 1, ks);
    tp_status st = cpu_op_run(TP_OP_ARGMAX, a, &in, 1, &k, rank, world, err);
    tp_tensor id = tp_tensor_make(ids, TP_I64, 1, ks);
    return st == TP_OK ? cpu_op_run(TP_OP_ARGMAX_INDEX, NULL, &k, 1, &id, rank, world, err) : st;
}

START_TEST(argmax_ties_nan_limit)
{
    const float x[5][6] = {
        {1, 3, 3, 2, 3, 0},               /* ties: lowest id */
        {NAN, -5, NAN, -7, -5, NAN},      /* NaN never wins */
        {NAN, NAN, NAN, NAN, NAN, NAN},   /* all NaN: lowest id */
        {-0.0f, 0.0f, -1, -2, -0.0f, -3}, /* -0 ties +0 */
        {1, 2, 3, 4, 90, 99},             /* limit 4 keeps 90 and 99 out */
    };
    tp_attrs a = {.has_limit = 1, .limit = 4};
    int64_t keys[5], ids[5], want[5] = {1, 1, 0, 0, 3};
    tp_err err = {{0}};
    ck_assert_msg(argmax_run(&x[0][0], 5, 6, &a, 0, 1, keys, ids, &err) == TP_OK, "%s", err.msg);
    for (int r = 0; r < 5; r++)
        ck_assert_int_eq(ids[r], want[r]);
    a.has_limit = 0;
    ck_assert(argmax_run(&x[0][0], 5, 6, &a, 0, 1, keys, ids, &err) == TP_OK);
    ck_assert_int_eq(ids[4], 5);
}
END_TEST

/* vocab_parallel: each rank's keys carry global ids, and the signed max
 * over the ranks' keys (what all_reduce max computes) is the argmax of the
 * whole row, lowest id on ties across ranks, the limit on global ids. */
START_TEST(argmax_vocab_parallel)
{
    enum { W = 3, N = 4, V = W * N };
    const float row[3][V] = {
        {0, 1, 2, 3, 9, 5, 9, 1, 0, 0, 9, 9},      /* tie across ranks 1 and 2: id 4 */
        {0, 1, 2, 3, 4, 5, 6, 7, 8, 20, 30, 40},   /* limit 10: id 9 */
        {-1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 50, 60}, /* rank 2 only padding past id 9 */
    };
    int64_t want[3] = {4, 9, 0};
    tp_attrs a = {.vocab_parallel = 1, .has_limit = 1, .limit = 10};
    for (int r = 0; r < 3; r++) {
        int64_t best = INT64_MIN;
        for (int rank = 0; rank < W; rank++) {
            int64_t key, id;
            tp_err err = {{0}};
            ck_assert_msg(argmax_run(&row[r][rank * N], 1, N, &a, rank, W, &key, &id, &err) == TP_OK, "%s",
                          err.msg);
            if (rank * N >= a.limit)
                ck_assert(key == TP_GEN_NO_KEY);
            best = key > best ? key : best;
        }
        ck_assert_int_eq(tp_gen_key_index(best), want[r]);
    }
}
END_TEST

/* -------------------------------------------------------- matmul_rows */

enum { MR_B = 7, MR_K = 64, MR_N = 96 };

/* x [B, 1, K] of dtype dt (values as floats in xf), w [K, N] or [N, K]. */
static tp_status mr_matmul(tp_op op, tp_dtype dt, int tb, void *x, int64_t b, void *w, const tp_tensor *mask,
                           void *out, tp_err *err)
{
    int64_t xs[3] = {b, 1, MR_K}, ws[2] = {tb ? MR_N : MR_K, tb ? MR_K : MR_N}, os[3] = {b, 1, MR_N};
    tp_tensor ins[3] = {tp_tensor_make(x, dt, 3, xs), tp_tensor_make(w, dt, 2, ws)};
    if (mask)
        ins[2] = *mask;
    tp_tensor o = tp_tensor_make(out, dt, 3, os);
    tp_attrs a = {.transpose_b = tb};
    return cpu_op_run(op, &a, ins, mask ? 3 : 2, &o, 0, 1, err);
}

static void mr_store(tp_dtype dt, float *f, void *raw, int64_t n)
{
    for (int64_t i = 0; i < n; i++) {
        if (dt == TP_F32)
            ((float *)raw)[i] = f[i];
        else
            ((uint16_t *)raw)[i] = dt == TP_F16 ? tp_f32_to_f16(f[i]) : tp_f32_to_bf16(f[i]);
    }
}

/* Rows 0, 1, 3, 6 wanted (three runs of wanted rows, two of others),
 * the others' x all NaN: each wanted run equals matmul on those rows alone
 * bit for bit and matmul over clean rows within MM_ROWS_TOL; every other
 * row is exactly +0.0, untouched by its NaNs. INT64 and INT32 masks. */
static void mr_case(tp_dtype dt, int tb, tp_dtype mask_dt)
{
    static const int wanted[MR_B] = {1, 1, 0, 5, 0, 0, -1}; /* nonzero: wanted */
    size_t es = tp_dtype_size(dt);
    float xf[MR_B * MR_K], wf[MR_K * MR_N], full[MR_B * MR_N];
    tu_fill(xf, MR_B * MR_K, 11), tu_fill(wf, MR_K * MR_N, 12);
    char x[sizeof xf], xnan[sizeof xf], w[sizeof wf], out[sizeof full], part[sizeof full], fullraw[sizeof full];
    mr_store(dt, xf, x, MR_B * MR_K), mr_store(dt, wf, w, MR_K * MR_N);
    float xn[MR_B * MR_K];
    for (int r = 0; r < MR_B; r++)
        for (int k = 0; k < MR_K; k++)
            xn[r * MR_K + k] = wanted[r] ? xf[r * MR_K + k] : NAN;
    mr_store(dt, xn, xnan, MR_B * MR_K);
    int64_t m64[MR_B], ms[1] = {MR_B};
    int32_t m32[MR_B];
    for (int r = 0; r < MR_B; r++)
        m64[r] = wanted[r], m32[r] = wanted[r];
    tp_tensor mask = tp_tensor_make(mask_dt == TP_I64 ? (void *)m64 : (void *)m32, mask_dt, 1, ms);
    tp_err err = {{0}};
    ck_assert_msg(mr_matmul(TP_OP_MATMUL_ROWS, dt, tb, xnan, MR_B, w, &mask, out, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(mr_matmul(TP_OP_MATMUL, dt, tb, x, MR_B, w, NULL, fullraw, &err) == TP_OK, "%s", err.msg);
    for (int i = 0; i < MR_B * MR_N; i++)
        full[i] = tp_load_f32(fullraw, dt, i);
    static const int runs[][2] = {{0, 2}, {3, 4}, {6, 7}};
    for (int k = 0; k < 3; k++) {
        int lo = runs[k][0], n = runs[k][1] - lo;
        ck_assert_msg(mr_matmul(TP_OP_MATMUL, dt, tb, x + (size_t)lo * MR_K * es, n, w, NULL, part, &err) == TP_OK,
                      "%s", err.msg);
        ck_assert_msg(memcmp(part, out + (size_t)lo * MR_N * es, (size_t)n * MR_N * es) == 0,
                      "%s rows %d..%d differ from matmul on them alone", tp_dtype_name(dt), lo, lo + n - 1);
    }
    for (int r = 0; r < MR_B; r++)
        for (int c = 0; c < MR_N; c++) {
            float got = tp_load_f32(out, dt, r * MR_N + c), ref = full[r * MR_N + c];
            if (!wanted[r])
                ck_assert_msg(got == 0.0f && !signbit(got), "row %d col %d: %g, want +0", r, c, got);
            else if (dt == TP_F32)
                ck_assert_msg(fabsf(got - ref) <= MM_ROWS_TOL * fmaxf(1.0f, fabsf(ref)), "row %d col %d: %g vs %g",
                              r, c, got, ref);
        }
}

START_TEST(matmul_rows_fp32) { mr_case(TP_F32, 0, TP_I64), mr_case(TP_F32, 1, TP_I32); }
END_TEST
START_TEST(matmul_rows_fp16_bf16) { mr_case(TP_F16, 1, TP_I64), mr_case(TP_BF16, 0, TP_I32); }
END_TEST

/* No row wanted: zeros and no GEMM (x is NaN throughout); a mask that does
 * not fit x is refused, naming the op. */
START_TEST(matmul_rows_none_wanted_and_bad_mask)
{
    float x[MR_B * MR_K], w[MR_K * MR_N], out[MR_B * MR_N];
    for (int i = 0; i < MR_B * MR_K; i++)
        x[i] = NAN;
    tu_fill(w, MR_K * MR_N, 3);
    int64_t m[MR_B] = {0}, ms[1] = {MR_B}, short_ms[1] = {MR_B - 1};
    tp_tensor mask = tp_tensor_make(m, TP_I64, 1, ms);
    tp_err err = {{0}};
    memset(out, 0xff, sizeof out);
    ck_assert_msg(mr_matmul(TP_OP_MATMUL_ROWS, TP_F32, 0, x, MR_B, w, &mask, out, &err) == TP_OK, "%s", err.msg);
    for (int i = 0; i < MR_B * MR_N; i++)
        ck_assert(out[i] == 0.0f);
    mask = tp_tensor_make(m, TP_I64, 1, short_ms);
    ck_assert_int_eq(mr_matmul(TP_OP_MATMUL_ROWS, TP_F32, 0, x, MR_B, w, &mask, out, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "matmul_rows: a INT64 row mask [6] does not fit x [7, 1, 64]"), "%s", err.msg);
    mask = tp_tensor_make(w, TP_F32, 1, ms);
    ck_assert_int_eq(mr_matmul(TP_OP_MATMUL_ROWS, TP_F32, 0, x, MR_B, w, &mask, out, &err), TP_INVALID);
}
END_TEST

/* The loader's shape rule: the weight 2-d, the mask INT32/INT64 [B]. */
START_TEST(matmul_rows_shape_errors)
{
    static const char *fmt =
        "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"g\",\"world_size\":1,"
        "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",1,4]},"
        "{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":%s},"
        "{\"name\":\"m\",\"datatype\":\"%s\",\"shape\":%s}],"
        "\"nodes\":[{\"name\":\"y\",\"op\":\"matmul_rows\",\"inputs\":[\"x\",\"w\",\"m\"]}],"
        "\"outputs\":[{\"name\":\"y\"}]}";
    const struct {
        const char *w, *m_dt, *m, *want; /* want NULL: loads */
    } cases[] = {
        {"[4,3]", "INT64", "[\"B\"]", NULL},
        {"[4,3]", "INT32", "[\"B\"]", NULL},
        {"[1,4,3]", "INT64", "[\"B\"]", "node 'y' (matmul_rows): the weight 'w' must be 2-d, got [1, 4, 3]"},
        {"[5,3]", "INT64", "[\"B\"]", "node 'y' (matmul_rows): inner dims differ"},
        {"[4,3]", "FP32", "[\"B\"]", "node 'y' (matmul_rows): the row mask 'm' must be INT32 or INT64, got FP32"},
        {"[4,3]", "INT64", "[\"B\",1]", "node 'y' (matmul_rows): the row mask [1, 1] must be [1], one flag per row"},
        {"[4,3]", "INT64", "[3]", "node 'y' (matmul_rows): the row mask [3] must be [1], one flag per row"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[2048], dir[64], path[128];
        snprintf(json, sizeof json, fmt, cases[i].w, cases[i].m_dt, cases[i].m);
        tu_write_graph(dir, path, json, NULL, 0);
        tp_graph *g = NULL;
        tp_err err = {{0}};
        tp_status st = tp_graph_load(path, &g, &err);
        if (!cases[i].want)
            ck_assert_msg(st == TP_OK, "case %zu: %s", i, err.msg);
        else
            ck_assert_msg(st == TP_INVALID && strstr(err.msg, cases[i].want), "case %zu: got '%s', want '%s'", i,
                          err.msg, cases[i].want);
        tp_graph_free(g);
        tu_rmdir(dir);
    }
}
END_TEST

/* ------------------------------------------------------------- loader */

/* A small generation graph whose pieces the cases below break. */
static const char *gen_json_fmt =
    "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"g\",\"world_size\":1,"
    "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[\"B\",1]},"
    "{\"name\":\"pos\",\"datatype\":\"%s\",\"shape\":[\"B\"]},"
    "{\"name\":\"slot\",\"datatype\":\"INT64\",\"shape\":[\"B\"]},"
    "{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[\"B\",2,1,4]}%s],"
    "\"states\":[{\"name\":\"kc\",\"datatype\":\"FP32\",\"shape\":%s},"
    "{\"name\":\"vc\",\"datatype\":\"FP32\",\"shape\":[\"S\",1,8,4]}%s],"
    "\"nodes\":[{\"name\":\"k\",\"op\":\"slice\",\"inputs\":[\"q\"],\"attrs\":{\"dim\":1,\"start\":0,\"length\":1}},"
    "{\"name\":\"a\",\"op\":\"kv_attention\",\"inputs\":[\"q\",\"k\",\"k\",\"kc\",\"%s\",\"slot\",\"pos\"]},"
    "{\"name\":\"l\",\"op\":\"view\",\"inputs\":[\"a\"],\"attrs\":{\"shape\":[-1,1,8]}},"
    "{\"name\":\"key\",\"op\":\"argmax\",\"inputs\":[\"l\"],\"attrs\":{\"limit\":7}},"
    "{\"name\":\"tok\",\"op\":\"argmax_index\",\"inputs\":[\"key\"]},"
    "{\"name\":\"next\",\"op\":\"view\",\"inputs\":[\"tok\"],\"attrs\":{\"shape\":[-1]}}%s],"
    "\"outputs\":[{\"name\":\"next\"}],"
    "\"generate\":{\"input_ids\":\"%s\",\"positions\":\"pos\",\"slots\":\"slot\",\"next_token\":\"%s\","
    "\"max_seq_len\":%d,\"vocab_size\":7%s}}";

typedef struct {
    const char *pos_dtype, *kc_shape, *extra_state, *vcache, *extra_node;
    int max_seq_len;
    const char *extra_gen, *want; /* want NULL: loads */
    const char *ids, *next;       /* what generate names (NULL: "ids", "next") */
    const char *extra_input;      /* NULL: none */
    const char *logit_rows;       /* what a loaded graph's generate names (NULL: none) */
} gen_case;

static tp_status load_case(const gen_case *c, char *msg, size_t len)
{
    char json[4096], dir[64], path[128];
    snprintf(json, sizeof json, gen_json_fmt, c->pos_dtype, c->extra_input ? c->extra_input : "", c->kc_shape,
             c->extra_state, c->vcache, c->extra_node,
             c->ids ? c->ids : "ids", c->next ? c->next : "next", c->max_seq_len, c->extra_gen);
    tu_write_graph(dir, path, json, NULL, 0);
    tp_graph *g = NULL;
    tp_err err = {{0}};
    tp_status st = tp_graph_load(path, &g, &err);
    snprintf(msg, len, "%s", err.msg);
    if (st == TP_OK) {
        ck_assert_int_eq(g->n_states, 2);
        ck_assert_int_eq(g->nodes[g->state_ids[0]].shape[0], TP_DEFAULT_STATE_SLOTS);
        ck_assert_ptr_nonnull(g->gen);
        ck_assert_int_eq(g->gen->max_seq_len, 8);
        if (c->logit_rows)
            ck_assert_str_eq(g->gen->logit_rows, c->logit_rows);
        else
            ck_assert_ptr_null(g->gen->logit_rows);
    }
    tp_graph_free(g);
    tu_rmdir(dir);
    return st;
}

START_TEST(loader_generation_errors)
{
    const gen_case ok = {"INT64", "[\"S\",1,8,4]", "", "vc", "", 8, "", NULL, NULL, NULL, NULL, NULL};
    const gen_case cases[] = {
        ok,
        {"INT32", ok.kc_shape, "", "vc", "", 8, "", "generate: positions input 'pos' must be INT64", NULL, NULL, NULL, NULL},
        {"INT64", "[2,\"S\",8,4]", "", "vc", "", 8, "", "state 'kc': shape[1] must be a non-negative integer", NULL, NULL, NULL, NULL},
        {"INT64", "[\"B\",1,8,4]", "", "vc", "", 8, "", "state 'kc': shape[0] must be a non-negative integer or \"S\"", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, ",{\"name\":\"xc\",\"datatype\":\"FP32\",\"shape\":[\"S\",1,8,4]}", "vc", "", 8, "",
         "state 'xc': no kv_attention writes it", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", ",{\"name\":\"r\",\"op\":\"relu\",\"inputs\":[\"vc\"]}", 8, "",
         "state 'vc': node 'r' (relu) reads it as input 0", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "q", "", 8, "", "state 'vc': no kv_attention writes it", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 9, "", "generate: max_seq_len 9 differs from the cache length 8", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"temperature\":1", "generate: unknown key 'temperature'", NULL, NULL, NULL, NULL},
        {"INT64", "[\"S\",1,8,2]", "", "vc", "", 8, "", "caches must be [S, Hkv, L, D]", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, ",{\"name\":\"s2\",\"datatype\":\"FP32\",\"shape\":[\"S\",2],\"placement\":\"shard(0)\"}",
         "vc", "", 8, "", "state 's2': shard(0) would split the slot dim", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, "", "generate: 'input_ids' names 'nope', which is not a graph input",
         "nope", NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, "", "generate: 'input_ids' names 'tok', which is not a graph input",
         "tok", NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, "", "generate: 'next_token' names 'tok', which is not a graph output",
         NULL, "tok", NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, "", "generate: input_ids input 'q' must be INT64 [\"B\", 1]", "q",
         NULL, NULL, NULL},
        /* logit_rows: an INT64 or INT32 input [B], replicated */
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"slot\"", NULL, NULL, NULL, NULL, "slot"},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"lr\"", NULL, NULL, NULL,
         ",{\"name\":\"lr\",\"datatype\":\"INT32\",\"shape\":[\"B\"]}", "lr"},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"nope\"",
         "generate: 'logit_rows' names 'nope', which is not a graph input", NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"\"", "generate: 'logit_rows' must name a graph input",
         NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":1", "generate: 'logit_rows' must name a graph input",
         NULL, NULL, NULL, NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"ids\"",
         "generate: logit_rows input 'ids' must be INT64 or INT32 [\"B\"], replicated; it is INT64", NULL, NULL, NULL,
         NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"lr\"",
         "generate: logit_rows input 'lr' must be INT64 or INT32 [\"B\"], replicated; it is FP32", NULL, NULL,
         ",{\"name\":\"lr\",\"datatype\":\"FP32\",\"shape\":[\"B\"]}", NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"lr\"",
         "generate: logit_rows input 'lr' must be INT64 or INT32 [\"B\"], replicated; it is INT64 without the batch "
         "dim", NULL, NULL, ",{\"name\":\"lr\",\"datatype\":\"INT64\",\"shape\":[4]}", NULL},
        {"INT64", ok.kc_shape, "", "vc", "", 8, ",\"logit_rows\":\"lr\"",
         "generate: logit_rows input 'lr' must be INT64 or INT32 [\"B\"], replicated; it is INT64 and sharded", NULL,
         NULL, ",{\"name\":\"lr\",\"datatype\":\"INT64\",\"shape\":[\"B\"],\"placement\":\"shard(0)\"}",
         NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char msg[sizeof ((tp_err *)0)->msg];
        tp_status st = load_case(&cases[i], msg, sizeof msg);
        if (!cases[i].want) {
            ck_assert_msg(st == TP_OK, "case %zu: %s", i, msg);
            continue;
        }
        ck_assert_msg(st == TP_INVALID && strstr(msg, cases[i].want), "case %zu: got '%s', want '%s'", i, msg,
                      cases[i].want);
    }
}
END_TEST

/* ------------------------------------------------- the example decoder */

static void graph_path(char *buf, size_t len, int ws)
{
    snprintf(buf, len, "%s/gen_decoder_tp%d.json", getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs", ws);
}

static tp_engine *gen_engine(int ws, int processes, int64_t slots)
{
    char path[512];
    graph_path(path, sizeof path, ws);
    const char *exe = getenv("TPSERVE") ? getenv("TPSERVE") : "build/tpserve";
    char *argv[] = {(char *)exe, "worker", path, "--backend", "cpu", NULL};
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv};
    tp_engine_opts o = {.backend = "cpu", .group = processes ? &go : NULL, .state_slots = slots};
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s", err.msg);
    const tp_generate_info *gi = tp_engine_generate_info(e);
    ck_assert_ptr_nonnull(gi);
    ck_assert_int_eq(gi->slots_n, slots ? slots : TP_DEFAULT_STATE_SLOTS);
    ck_assert_int_eq(gi->max_seq_len, 16);
    ck_assert_int_eq(gi->vocab_size, 37);
    /* 2 layers x 2 caches of [S, max(2, ws)/ws kv heads, 16, 4] FP32 */
    int64_t kv_local = (ws > 2 ? ws : 2) / ws;
    ck_assert_int_eq(tp_engine_state_bytes(e), 4 * (slots ? slots : 16) * kv_local * 16 * 4 * 4);
    return e;
}

static void decoder_batched(int ws, int processes)
{
    json_t *j = tu_gen_steps();
    char what[64];
    snprintf(what, sizeof what, "tp%d %s", ws, processes ? "processes" : "threads");
    tp_engine *e = gen_engine(ws, processes, processes ? 0 : 4);
    ck_assert(tp_engine_padded(e, NULL)); /* token rows pad into buckets */
    tu_gen_schedule(e, json_object_get(j, "batched"), what, 1);
    tp_engine_free(e);
    json_decref(j);
}

START_TEST(decoder_tp1_threads) { decoder_batched(1, 0); }
END_TEST
START_TEST(decoder_tp2_threads) { decoder_batched(2, 0); }
END_TEST
START_TEST(decoder_tp4_threads) { decoder_batched(4, 0); }
END_TEST
START_TEST(decoder_tp2_processes) { decoder_batched(2, 1); }
END_TEST
START_TEST(decoder_tp4_processes) { decoder_batched(4, 1); }
END_TEST

/* Sequence a's tokens are the same alone (its own engine, slot 3) as
 * batched with b, c and d; both are the reference's. */
START_TEST(decoder_alone_equals_batched)
{
    json_t *j = tu_gen_steps();
    tp_engine *e = gen_engine(2, 0, 4);
    tu_gen_schedule(e, json_object_get(j, "alone_a"), "a alone", 1);
    /* the same engine then runs the batched schedule: slot 3 is reused by
     * nobody there, and its leftovers never reach another slot */
    tu_gen_schedule(e, json_object_get(j, "batched"), "batched after a alone", 1);
    tp_engine_free(e);
    json_decref(j);
}
END_TEST

/* Buckets 1, 2: a step of 8 rows runs in pieces of 2, in row order, so a
 * prompt's later rows read the cache its earlier pieces wrote. */
START_TEST(decoder_steps_past_the_largest_bucket)
{
    json_t *j = tu_gen_steps();
    char path[512];
    graph_path(path, sizeof path, 2);
    int64_t buckets[2] = {1, 2};
    tp_engine_opts o = {.backend = "cpu", .buckets = buckets, .n_buckets = 2, .state_slots = 4};
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s", err.msg);
    json_t *steps = json_object_get(j, "batched");
    tu_gen_schedule(e, steps, "tp2 in pieces of 2", 1);
    uint64_t pieces = 0;
    for (size_t i = 0; i < json_array_size(steps); i++)
        pieces += (json_array_size(json_object_get(json_array_get(steps, i), "input_ids")) + 1) / 2;
    tp_engine_stats st;
    tp_engine_get_stats(e, &st);
    ck_assert_uint_eq(st.executions, pieces);
    tp_engine_free(e);
    json_decref(j);
}
END_TEST

/* Request checks (tp_engine_check_inputs, what the batcher and server
 * run on every request) refuse what a kernel would, naming the input; a
 * slot or position that reaches the kernel anyway (tp_engine_infer runs
 * no value checks) fails the op, naming the row (captured replays do not
 * know node names; an eager run prefixes the node). */
START_TEST(decoder_refuses_bad_rows)
{
    tp_engine *e = gen_engine(1, 0, 4);
    const struct {
        int64_t id, pos, slot;
        const char *want, *kernel; /* kernel NULL: the kernels cannot tell (a padded vocab row) */
    } bad[] = {
        {37, 0, 1, "input 'input_ids': element 0 holds 37, outside 0..36", NULL},
        {-1, 0, 1, "input 'input_ids': element 0 holds -1", "embedding: id -1"},
        {1, 0, 5, "input 'cache_slot': element 0 holds 5, outside 0..4", "kv_attention: row 0 has slot 5"},
        {1, 16, 1, "input 'position_ids': element 0 holds 16, outside 0..15", "embedding: id 16"},
        {1, -3, 1, "input 'position_ids': element 0 holds -3", "embedding: id -3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int64_t s1[1] = {1}, s2[2] = {1, 1}, batch, wanted = 1;
        tp_host_tensor in[4] = {tu_tensor("input_ids", TP_I64, (void *)&bad[i].id, 2, s2),
                                tu_tensor("position_ids", TP_I64, (void *)&bad[i].pos, 1, s1),
                                tu_tensor("cache_slot", TP_I64, (void *)&bad[i].slot, 1, s1),
                                tu_tensor("logit_rows", TP_I64, &wanted, 1, s1)};
        tp_err err = {{0}};
        ck_assert_int_eq(tp_engine_check_inputs(e, in, 4, &batch, &err), TP_INVALID);
        ck_assert_msg(strstr(err.msg, bad[i].want), "got '%s', want '%s'", err.msg, bad[i].want);
        if (!bad[i].kernel)
            continue;
        tp_host_tensor *out;
        int n_out;
        ck_assert_int_ne(tp_engine_infer(e, in, 4, &out, &n_out, &err), TP_OK);
        ck_assert_msg(strstr(err.msg, bad[i].kernel), "got '%s', want '%s'", err.msg, bad[i].kernel);
    }
    tp_engine_free(e);
}
END_TEST

/* `tpserve plan` shows the states (text and JSON) and the head's
 * matmul_rows, alone in a fallback partition (run eagerly, so the cuda
 * backend multiplies only the wanted rows) between two captured ones, and
 * a graph without states has no "states" key. */
START_TEST(plan_reports_states)
{
    char path[512], *buf = NULL;
    size_t len = 0;
    graph_path(path, sizeof path, 2);
    tp_engine_opts o = {.backend = "cpu", .state_slots = 3};
    tp_err err = {{0}};
    FILE *f = open_memstream(&buf, &len);
    ck_assert_msg(tp_engine_plan(path, &o, 2, 0, f, &err) == TP_OK, "%s", err.msg);
    fclose(f);
    /* 4 caches of [3, 1, 16, 4] FP32 per rank */
    ck_assert_msg(strstr(buf, "states per rank: 3072 B in 4 tensors (3 slots)"), "%s", buf);
    ck_assert_msg(strstr(buf, "k_cache.0") && strstr(buf, " state "), "%s", buf);
    ck_assert_msg(strstr(buf, "logits_flat") && strstr(buf, "matmul_rows"), "%s", buf); /* the LM head */
    ck_assert_msg(strstr(buf, "0 captured ") && strstr(buf, "1 fallback  1 nodes (logits_flat .. logits_flat)") &&
                      strstr(buf, "2 captured "),
                  "%s", buf);
    free(buf);
    f = open_memstream(&buf, &len);
    ck_assert_msg(tp_engine_plan(path, &o, 2, 1, f, &err) == TP_OK, "%s", err.msg);
    fclose(f);
    json_t *j = json_loads(buf, 0, NULL);
    json_t *st = json_object_get(j, "states");
    ck_assert_int_eq(json_integer_value(json_object_get(st, "bytes")), 3072);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "slots")), 3);
    ck_assert_int_eq(json_array_size(json_object_get(st, "tensors")), 4);
    json_decref(j);
    free(buf);
}
END_TEST

static Suite *generate_suite(void)
{
    Suite *s = suite_create("generate");
    TCase *k = tcase_create("kernels");
    tcase_add_test(k, keys_order_like_floats);
    tcase_add_test(k, row_checks_and_heads);
    tcase_add_test(k, kv_attention_fp32);
    tcase_add_test(k, kv_attention_fp16);
    tcase_add_test(k, kv_attention_bf16);
    tcase_add_test(k, kv_attention_refuses_bad_rows);
    tcase_add_test(k, kv_attention_rows_of_t_tokens);
    tcase_add_test(k, argmax_ties_nan_limit);
    tcase_add_test(k, argmax_vocab_parallel);
    tcase_add_test(k, matmul_rows_fp32);
    tcase_add_test(k, matmul_rows_fp16_bf16);
    tcase_add_test(k, matmul_rows_none_wanted_and_bad_mask);
    tcase_add_test(k, matmul_rows_shape_errors);
    tcase_add_test(k, loader_generation_errors);
    suite_add_tcase(s, k);
    TCase *e = tcase_create("decoder");
    tcase_set_timeout(e, 120);
    tcase_add_test(e, decoder_tp1_threads);
    tcase_add_test(e, decoder_tp2_threads);
    tcase_add_test(e, decoder_tp4_threads);
    tcase_add_test(e, decoder_tp2_processes);
    tcase_add_test(e, decoder_tp4_processes);
    tcase_add_test(e, decoder_alone_equals_batched);
    tcase_add_test(e, decoder_steps_past_the_largest_bucket);
    tcase_add_test(e, decoder_refuses_bad_rows);
    tcase_add_test(e, plan_reports_states);
    suite_add_tcase(s, e);
    return s;
}

TP_CHECK_MAIN(generate_suite)
