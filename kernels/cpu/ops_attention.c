/* ops_attention.c — softmax(q k^T * scale [+ causal mask]) v, per (batch, head).
 *
 * Scores live in a per-call FP32 scratch [S, T]; both products go through
 * ops_sgemm, which reads q, k, v with their own strides. The causal mask is
 * aligned to the bottom right: query i sees keys j <= i + (T - S), so with a
 * KV cache (T > S) the last query sees every key. A query that sees no key
 * (only possible when S > T) gets a zero output row. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops_internal.h"

static tp_status attn_check(const tp_tensor *q, const tp_tensor *k, const tp_tensor *v,
                            const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96], s4[96];
    tp_dtype dt = out->dtype;
    if (q->dtype != dt || k->dtype != dt || v->dtype != dt || !tp_dtype_is_float(dt))
        return tp_fail(err, TP_INVALID, "attention: q, k, v must be float of the output dtype %s",
                       tp_dtype_name(dt));
    int ok = q->ndim == 4 && k->ndim == 4 && v->ndim == 4 && out->ndim == 4;
    for (int i = 0; ok && i < 2; i++)
        ok = k->shape[i] == q->shape[i] && v->shape[i] == q->shape[i] && out->shape[i] == q->shape[i];
    ok = ok && k->shape[3] == q->shape[3] && v->shape[2] == k->shape[2] &&
         out->shape[2] == q->shape[2] && out->shape[3] == v->shape[3];
    if (!ok)
        return tp_fail(err, TP_INVALID, "attention: q %s, k %s, v %s do not give output %s",
                       tp_shape_str(s1, sizeof s1, q->ndim, q->shape),
                       tp_shape_str(s2, sizeof s2, k->ndim, k->shape),
                       tp_shape_str(s3, sizeof s3, v->ndim, v->shape),
                       tp_shape_str(s4, sizeof s4, out->ndim, out->shape));
    return TP_OK;
}

/* Softmax over each score row, keeping the first `allowed` keys of row i. */
static void attn_softmax(float *scores, int64_t S, int64_t T, int causal)
{
    for (int64_t i = 0; i < S; i++) {
        float *row = scores + i * T;
        int64_t allowed = T;
        if (causal) {
            allowed = i + (T - S) + 1;
            allowed = allowed < 0 ? 0 : allowed > T ? T : allowed;
        }
        ops_softmax_row(row, row, allowed);
        memset(row + allowed, 0, (size_t)(T - allowed) * sizeof(float));
    }
}

typedef struct {
    tp_tensor q, k, v;   /* FP32 views */
    float *scores, *o;   /* [S, T]; [S, Dv] when out is not FP32 */
    ops_buf sa, sb;
    float scale;
    int causal;
} attn_ctx;

static tp_status attn_head(attn_ctx *c, int64_t b, int64_t h, tp_tensor *out, tp_err *err)
{
    const tp_tensor *q = &c->q, *k = &c->k, *v = &c->v;
    int64_t S = q->shape[2], D = q->shape[3], T = k->shape[2], Dv = v->shape[3];
    const float *qp = (const float *)q->data + b * q->stride[0] + h * q->stride[1];
    const float *kp = (const float *)k->data + b * k->stride[0] + h * k->stride[1];
    const float *vp = (const float *)v->data + b * v->stride[0] + h * v->stride[1];
    int64_t ooff = (b * out->shape[1] + h) * S * Dv;
    float *op = out->dtype == TP_F32 ? (float *)out->data + ooff : c->o;
    /* scores = q [S, D] . k^T [D, T]: k^T(d, t) is at t*ks2 + d*ks3 */
    tp_status s = ops_sgemm(S, T, D, c->scale, qp, q->stride[2], q->stride[3], kp, k->stride[3],
                            k->stride[2], c->scores, T, &c->sa, &c->sb, err);
    if (s != TP_OK)
        return s;
    attn_softmax(c->scores, S, T, c->causal);
    s = ops_sgemm(S, Dv, T, 1.0f, c->scores, T, 1, vp, v->stride[2], v->stride[3], op, Dv, &c->sa,
                  &c->sb, err);
    if (s == TP_OK && out->dtype != TP_F32)
        ops_store_row(ops_at(out->data, out->dtype, ooff), out->dtype, 1, S * Dv, op);
    return s;
}

tp_status cpu_attention(const tp_attrs *attrs, const tp_tensor *q, const tp_tensor *k,
                        const tp_tensor *v, tp_tensor *out, tp_err *err)
{
    tp_status s = attn_check(q, k, v, out, err);
    if (s != TP_OK || tp_tensor_numel(out) == 0)
        return s;
    attn_ctx c;
    memset(&c, 0, sizeof c);
    float *owned[3] = {NULL, NULL, NULL};
    int64_t S = q->shape[2], T = k->shape[2], Dv = v->shape[3];
    c.scale = attrs && attrs->has_scale ? attrs->scale : 1.0f / sqrtf((float)q->shape[3]);
    c.causal = attrs ? attrs->causal : 0;
    if ((s = ops_as_f32(q, &c.q, &owned[0], "attention", err)) == TP_OK &&
        (s = ops_as_f32(k, &c.k, &owned[1], "attention", err)) == TP_OK &&
        (s = ops_as_f32(v, &c.v, &owned[2], "attention", err)) == TP_OK &&
        (s = ops_alloc_f32(&c.scores, (size_t)(S * T), "attention", err)) == TP_OK &&
        (out->dtype == TP_F32 || (s = ops_alloc_f32(&c.o, (size_t)(S * Dv), "attention", err)) == TP_OK)) {
        for (int64_t b = 0; b < q->shape[0] && s == TP_OK; b++)
            for (int64_t h = 0; h < q->shape[1] && s == TP_OK; h++)
                s = attn_head(&c, b, h, out, err);
    }
    for (int i = 0; i < 3; i++)
        free(owned[i]);
    free(c.scores);
    free(c.o);
    ops_buf_free(&c.sa);
    ops_buf_free(&c.sb);
    return s;
}
