/* ops_attention.c — softmax(q k^T * scale [+ causal and key-padding
 * masks]) v, per (batch, head); with GQA each query head reads its kv
 * head (tp_attn_kv_head) where it lies, no repeated copy of k and v.
 *
 * The (batch, head) pairs are the tasks of one job on the rank's pool
 * (cpu_pool.h), each with its participant's FP32 scratch (scores [S, T]);
 * both products go through ops_sgemm, which reads q, k, v with their own
 * strides. A pair's math is the same sequential code on whichever thread
 * runs it, its products on one OpenBLAS thread, and pairs write disjoint
 * parts of out: the result is bit-equal whatever the pool's size
 * (test_cpu_pool: attention_same_bits_on_any_pool). Which keys a query
 * sees (causal, bottom right; the optional key-padding mask [B, T]) and
 * the zero row of a query that sees none: kernels/common/tp_attn_mask.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tp_attn_mask.h"
#include "common/tp_checks.h"
#include "cpu_pool.h"
#include "ops_internal.h"

/* One participant's scratch, taken at its first task. */
typedef struct {
    ops_buf scores, o; /* [S, T]; [S, Dv] when out is not FP32 */
    ops_buf sa, sb;
} attn_scratch;

typedef struct {
    tp_tensor q, k, v;     /* FP32 views */
    const tp_tensor *mask; /* [B, T] or NULL */
    tp_tensor *out;
    attn_scratch *slot;    /* [cpu_pool_threads] */
    float scale;
    int causal;
} attn_ctx;

/* Softmax over score rows i0 .. i1 - 1 of batch row b, over the keys each
 * query may see: a prefix (causal) whose padded keys score -inf, which
 * softmax turns into exact zeros (and a row with no key left into a zero
 * row); the keys past the prefix, up to `width`, are zeros. */
static void attn_softmax(const attn_ctx *c, int64_t b, float *scores, int64_t i0, int64_t i1, int64_t S, int64_t T,
                         int64_t width)
{
    const tp_tensor *m = c->mask;
    for (int64_t i = i0; i < i1; i++) {
        float *row = scores + i * T;
        int64_t allowed = tp_attn_causal_keys(i, S, T, c->causal);
        for (int64_t t = 0; m && t < allowed; t++)
            if (!tp_attn_key_on(m->data, m->dtype, b * m->stride[0] + t * m->stride[1]))
                row[t] = -INFINITY;
        ops_softmax_row(row, row, allowed);
        memset(row + allowed, 0, (size_t)(width - allowed) * sizeof(float));
    }
}

/* Causal queries are taken ATTN_QUERY_BLOCK at a time, each block's
 * products over only the keys its last query sees: a 128-token head
 * computes 5/8 of its scores and of p . v instead of all of them (the rest
 * are masked zeros), and attention was 8% of a 512-row Llama step. */
#define ATTN_QUERY_BLOCK 32

/* Task b * H + h of the pool's job. */
static tp_status attn_head(void *arg, int64_t task, int slot, tp_err *err)
{
    attn_ctx *c = arg;
    attn_scratch *w = &c->slot[slot];
    const tp_tensor *q = &c->q, *k = &c->k, *v = &c->v;
    tp_tensor *out = c->out;
    int64_t b = task / q->shape[1], h = task % q->shape[1], kvh = tp_attn_kv_head(h, q->shape[1], k->shape[1]);
    int64_t S = q->shape[2], D = q->shape[3], T = k->shape[2], Dv = v->shape[3];
    const float *qp = (const float *)q->data + b * q->stride[0] + h * q->stride[1];
    const float *kp = (const float *)k->data + b * k->stride[0] + kvh * k->stride[1];
    const float *vp = (const float *)v->data + b * v->stride[0] + kvh * v->stride[1];
    int64_t ooff = (b * out->shape[1] + h) * S * Dv;
    tp_status s = ops_buf_reserve(&w->scores, (size_t)(S * T), err);
    if (s == TP_OK && out->dtype != TP_F32)
        s = ops_buf_reserve(&w->o, (size_t)(S * Dv), err);
    if (s != TP_OK) {
        tp_err_prefix(err, "attention: ");
        return s;
    }
    float *op = out->dtype == TP_F32 ? (float *)out->data + ooff : w->o.p;
    int64_t block = c->causal ? ATTN_QUERY_BLOCK : S;
    for (int64_t i0 = 0; s == TP_OK && i0 < S; i0 += block) {
        int64_t i1 = S - i0 < block ? S : i0 + block, rows = i1 - i0;
        int64_t keys = tp_attn_causal_keys(i1 - 1, S, T, c->causal);
        float *sc = w->scores.p + i0 * T;
        if (keys == 0) { /* no query of the block sees a key: zero rows */
            memset(op + i0 * Dv, 0, (size_t)(rows * Dv) * sizeof(float));
            continue;
        }
        /* scores = q [rows, D] . k^T [D, keys]: k^T(d, t) is at t*ks2 + d*ks3 */
        s = ops_sgemm(rows, keys, D, c->scale, qp + i0 * q->stride[2], q->stride[2], q->stride[3], kp, k->stride[3],
                      k->stride[2], sc, T, &w->sa, &w->sb, err);
        if (s != TP_OK)
            break;
        attn_softmax(c, b, w->scores.p, i0, i1, S, T, keys);
        s = ops_sgemm(rows, Dv, keys, 1.0f, sc, T, 1, vp, v->stride[2], v->stride[3], op + i0 * Dv, Dv, &w->sa,
                      &w->sb, err);
    }
    if (s == TP_OK && out->dtype != TP_F32)
        ops_store_row(ops_at(out->data, out->dtype, ooff), out->dtype, 1, S * Dv, op);
    return s;
}

static void scratch_free(attn_scratch *slot, int n)
{
    for (int i = 0; slot && i < n; i++) {
        ops_buf_free(&slot[i].scores);
        ops_buf_free(&slot[i].o);
        ops_buf_free(&slot[i].sa);
        ops_buf_free(&slot[i].sb);
    }
    free(slot);
}

tp_status cpu_attention(const tp_attrs *attrs, const tp_tensor *q, const tp_tensor *k,
                        const tp_tensor *v, const tp_tensor *mask, tp_tensor *out, cpu_pool *pool,
                        tp_err *err)
{
    tp_status s = tp_check_attention(q, k, v, mask, out, err);
    if (s != TP_OK || tp_tensor_numel(out) == 0)
        return s;
    attn_ctx c;
    memset(&c, 0, sizeof c);
    float *owned[3] = {NULL, NULL, NULL};
    int64_t tasks = q->shape[0] * q->shape[1];
    int slots = cpu_pool_threads(pool);
    c.scale = attrs && attrs->has_scale ? attrs->scale : 1.0f / sqrtf((float)q->shape[3]);
    c.causal = attrs ? attrs->causal : 0;
    c.mask = mask;
    c.out = out;
    if ((s = ops_as_f32(q, &c.q, &owned[0], "attention", err)) == TP_OK &&
        (s = ops_as_f32(k, &c.k, &owned[1], "attention", err)) == TP_OK &&
        (s = ops_as_f32(v, &c.v, &owned[2], "attention", err)) == TP_OK) {
        c.slot = calloc((size_t)slots, sizeof *c.slot);
        s = c.slot ? cpu_pool_run(pool, tasks, attn_head, &c, err)
                   : tp_fail(err, TP_NOMEM, "attention: out of memory for %d threads' scratch", slots);
    }
    for (int i = 0; i < 3; i++)
        free(owned[i]);
    scratch_free(c.slot, slots);
    return s;
}
