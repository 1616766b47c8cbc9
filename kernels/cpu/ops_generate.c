/* ops_generate.c — the generation ops on the cpu: kv_attention (write this
 * step's k/v rows into the slot caches, then attend causally over them) and
 * the greedy selection argmax / argmax_index. Slots, positions, GQA and the
 * key packing: kernels/common/tp_generate.h; the ops: docs/models.md,
 * "Generation graphs".
 *
 * kv_attention checks every row before it writes anything, so a bad slot
 * or position fails the node with the caches untouched. Then all rows'
 * writes happen before any row's reads: rows of one sequence in one step
 * (a prefill) see each other causally. Scores, softmax and the weighted
 * sum are FP32 whatever the dtype; the softmax is ops_softmax_row, the
 * attention kernel's. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/tp_generate.h"
#include "cpu_pool.h"
#include "ops_internal.h"

typedef struct {
    const tp_tensor *q, *k, *v, *kc, *vc, *slot, *pos;
    int64_t B, H, T, D, Hkv, S, L;
    float scale;
} kv_ctx;

/* Caches are states: contiguous, as the executor binds them. */
static tp_status kv_check(const kv_ctx *c, const tp_tensor *out, tp_err *err)
{
    if (!tp_tensor_is_contiguous(c->kc) || !tp_tensor_is_contiguous(c->vc))
        return tp_fail(err, TP_INTERNAL, "kv_attention: the caches must be contiguous states");
    if (c->q->ndim != 4 || c->k->ndim != 4 || c->kc->ndim != 4 || out->ndim != 4 || c->Hkv < 1 ||
        c->H % c->Hkv != 0 || c->kc->shape[1] != c->Hkv || c->kc->shape[3] != c->D || c->k->shape[0] != c->B ||
        c->k->shape[2] != c->T || c->k->shape[3] != c->D || c->slot->shape[0] != c->B || c->pos->shape[0] != c->B)
        return tp_fail(err, TP_INVALID, "kv_attention: q, k, v, caches, slot and pos do not fit together");
    for (int64_t b = 0; b < c->B; b++) {
        int64_t s = tp_gen_load_index(c->slot->data, c->slot->dtype, b * c->slot->stride[0]);
        int64_t p = tp_gen_load_index(c->pos->data, c->pos->dtype, b * c->pos->stride[0]);
        switch (tp_gen_row_check(s, p, c->S, c->T, c->L)) {
        case TP_GEN_ROW_ACTIVE:
        case TP_GEN_ROW_INACTIVE:
            break;
        case TP_GEN_ROW_BAD_SLOT:
            return tp_fail(err, TP_INVALID, "kv_attention: row %lld has slot %lld, outside 0..%lld (0: inactive)",
                           (long long)b, (long long)s, (long long)c->S);
        case TP_GEN_ROW_BAD_POS:
            return tp_fail(err, TP_INVALID, "kv_attention: row %lld has position %lld; with %lld tokens it must be "
                           "in 0..%lld (cache length %lld)", (long long)b, (long long)p, (long long)c->T,
                           (long long)(c->L - c->T), (long long)c->L);
        }
    }
    return TP_OK;
}

/* src[b, kvh, t, :] (any strides) into the cache row at sequence s,
 * position j. Same dtype: a copy of elements. */
static void write_row(const tp_tensor *src, void *cache, int64_t b, int64_t kvh, int64_t t, int64_t off, int64_t D)
{
    size_t es = tp_dtype_size(src->dtype);
    const char *from = ops_at(src->data, src->dtype, b * src->stride[0] + kvh * src->stride[1] + t * src->stride[2]);
    char *to = ops_at(cache, src->dtype, off);
    if (src->stride[3] == 1) {
        memcpy(to, from, (size_t)D * es);
        return;
    }
    for (int64_t d = 0; d < D; d++)
        memcpy(to + d * (int64_t)es, from + d * src->stride[3] * (int64_t)es, es);
}

static void kv_write(const kv_ctx *c)
{
    for (int64_t b = 0; b < c->B; b++) {
        int64_t s = tp_gen_load_index(c->slot->data, c->slot->dtype, b * c->slot->stride[0]);
        int64_t p = tp_gen_load_index(c->pos->data, c->pos->dtype, b * c->pos->stride[0]);
        if (s == 0)
            continue;
        for (int64_t kvh = 0; kvh < c->Hkv; kvh++)
            for (int64_t t = 0; t < c->T; t++) {
                int64_t off = tp_gen_cache_off(s - 1, kvh, p + t, c->Hkv, c->L, c->D);
                write_row(c->k, c->kc->data, b, kvh, t, off, c->D);
                write_row(c->v, c->vc->data, b, kvh, t, off, c->D);
            }
    }
}

/* out[b, h, t, :] for an active row: scores over keys 0 .. p+t. scratch
 * holds L scores, then q's row and the accumulator (D each). */
static void kv_attend(const kv_ctx *c, int64_t b, int64_t h, int64_t t, int64_t s, int64_t p, float *scratch,
                      tp_tensor *out)
{
    int64_t D = c->D, n = p + t + 1, kvh = tp_attn_kv_head(h, c->H, c->Hkv);
    float *sc = scratch, *qr = scratch + c->L, *acc = qr + D;
    tp_dtype dt = c->q->dtype;
    const tp_tensor *q = c->q;
    ops_load_row(ops_at(q->data, dt, b * q->stride[0] + h * q->stride[1] + t * q->stride[2]), dt, q->stride[3], D, qr);
    for (int64_t j = 0; j < n; j++) {
        int64_t off = tp_gen_cache_off(s - 1, kvh, j, c->Hkv, c->L, D);
        float dot = 0.0f;
        for (int64_t d = 0; d < D; d++)
            dot += qr[d] * tp_load_f32(c->kc->data, dt, off + d);
        sc[j] = dot * c->scale;
    }
    ops_softmax_row(sc, sc, n);
    memset(acc, 0, (size_t)D * sizeof(float));
    for (int64_t j = 0; j < n; j++) {
        int64_t off = tp_gen_cache_off(s - 1, kvh, j, c->Hkv, c->L, D);
        for (int64_t d = 0; d < D; d++)
            acc[d] += sc[j] * tp_load_f32(c->vc->data, dt, off + d);
    }
    int64_t o = ((b * c->H + h) * c->T + t) * D;
    for (int64_t d = 0; d < D; d++)
        tp_store_f32(out->data, dt, o + d, acc[d]);
}

/* A kv_read job: its tensors and each participant's scratch (L + 2 D
 * floats, kv_attend's). */
typedef struct {
    const kv_ctx *c;
    tp_tensor *out;
    float **scratch; /* [cpu_pool_threads], each taken at its first task */
} kv_job;

/* Task b * H + h: every token of row b's head h, or its zeros when row b
 * is inactive (0 bits are 0.0 in every float type). */
static tp_status kv_read_head(void *arg, int64_t task, int slot, tp_err *err)
{
    kv_job *j = arg;
    const kv_ctx *c = j->c;
    int64_t b = task / c->H, h = task % c->H;
    int64_t s = tp_gen_load_index(c->slot->data, c->slot->dtype, b * c->slot->stride[0]);
    int64_t p = tp_gen_load_index(c->pos->data, c->pos->dtype, b * c->pos->stride[0]);
    if (s == 0) {
        memset(ops_at(j->out->data, j->out->dtype, task * c->T * c->D), 0,
               (size_t)(c->T * c->D) * tp_dtype_size(j->out->dtype));
        return TP_OK;
    }
    if (!j->scratch[slot]) {
        tp_status st = ops_alloc_f32(&j->scratch[slot], (size_t)(c->L + 2 * c->D), "kv_attention scratch", err);
        if (st != TP_OK)
            return st;
    }
    for (int64_t t = 0; t < c->T; t++)
        kv_attend(c, b, h, t, s, p, j->scratch[slot], j->out);
    return TP_OK;
}

/* The (row, head) pairs on the rank's pool: each pair's math is the same
 * sequential code on any thread and pairs write disjoint parts of out, so
 * the bits never depend on the pool's size (test_cpu_pool). */
static tp_status kv_read(const kv_ctx *c, tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    int slots = cpu_pool_threads(pool);
    kv_job j = {c, out, calloc((size_t)slots, sizeof(float *))};
    if (!j.scratch)
        return tp_fail(err, TP_NOMEM, "kv_attention: out of memory for %d threads' scratch", slots);
    tp_status st = cpu_pool_run(pool, c->B * c->H, kv_read_head, &j, err);
    for (int i = 0; i < slots; i++)
        free(j.scratch[i]);
    free(j.scratch);
    return st;
}

tp_status cpu_kv_attention(const tp_attrs *attrs, const tp_tensor *ins, tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    kv_ctx c = {.q = &ins[0], .k = &ins[1], .v = &ins[2], .kc = &ins[3], .vc = &ins[4], .slot = &ins[5],
                .pos = &ins[6]};
    c.B = c.q->shape[0], c.H = c.q->shape[1], c.T = c.q->shape[2], c.D = c.q->shape[3];
    c.Hkv = c.k->shape[1], c.S = c.kc->shape[0], c.L = c.kc->shape[2];
    c.scale = attrs && attrs->has_scale ? attrs->scale : 1.0f / sqrtf((float)c.D);
    tp_status st = kv_check(&c, out, err);
    if (st != TP_OK)
        return st;
    kv_write(&c);
    return kv_read(&c, out, pool, err);
}

/* ------------------------------------------------------------- argmax */

/* The key of one row of n elements at stride s; global index = lo + j,
 * candidates only below limit. */
static int64_t argmax_row(const void *x, tp_dtype dt, int64_t base, int64_t s, int64_t n, int64_t lo, int64_t limit)
{
    int64_t best = TP_GEN_NO_KEY;
    for (int64_t j = 0; j < n && lo + j < limit; j++) {
        int64_t key = tp_gen_key(tp_load_f32(x, dt, base + j * s), (uint32_t)(lo + j));
        if (key > best)
            best = key;
    }
    return best;
}

static tp_status cpu_argmax(const tp_attrs *a, const tp_tensor *x, tp_tensor *out, int rank, int world, tp_err *err)
{
    int nd = x->ndim;
    int64_t n = x->shape[nd - 1], rows = tp_tensor_numel(out);
    int vp = a && a->vocab_parallel;
    int64_t lo = vp ? (int64_t)rank * n : 0, total = vp ? (int64_t)world * n : n;
    int64_t limit = a && a->has_limit && a->limit < total ? a->limit : total;
    if (out->dtype != TP_I64 || out->ndim != nd - 1)
        return tp_fail(err, TP_INVALID, "argmax: output must be INT64 of %d dims", nd - 1);
    if (total - 1 > (int64_t)TP_GEN_MAX_INDEX)
        return tp_fail(err, TP_INVALID, "argmax: %lld columns do not fit 32-bit indices", (long long)total);
    int64_t idx[TP_MAX_DIMS] = {0};
    int64_t *o = out->data;
    for (int64_t r = 0; r < rows; r++) {
        int64_t base = 0;
        for (int k = 0; k < nd - 1; k++)
            base += idx[k] * x->stride[k];
        o[r] = argmax_row(x->data, x->dtype, base, x->stride[nd - 1], n, lo, limit);
        for (int k = nd - 2; k >= 0 && ++idx[k] == x->shape[k]; k--)
            idx[k] = 0;
    }
    return TP_OK;
}

static tp_status cpu_argmax_index(const tp_tensor *key, tp_tensor *out, tp_err *err)
{
    if (key->dtype != TP_I64 || out->dtype != TP_I64 || tp_tensor_numel(key) != tp_tensor_numel(out))
        return tp_fail(err, TP_INVALID, "argmax_index: INT64 keys in, INT64 ids of the same shape out");
    tp_tensor dst = tp_tensor_make(out->data, out->dtype, key->ndim, key->shape);
    tp_tensor_copy(&dst, key); /* strided keys into place, then decoded in place */
    int64_t *o = out->data;
    for (int64_t i = 0, n = tp_tensor_numel(out); i < n; i++)
        o[i] = tp_gen_key_index(o[i]);
    return TP_OK;
}

tp_status cpu_argmax_family(tp_op op, const tp_attrs *a, const tp_tensor *x, tp_tensor *out, int rank, int world,
                            tp_err *err)
{
    return op == TP_OP_ARGMAX_INDEX ? cpu_argmax_index(x, out, err) : cpu_argmax(a, x, out, rank, world, err);
}
