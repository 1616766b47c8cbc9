/* tp_cuda_plan.h — the device-independent arithmetic of the cuda backend.
 *
 * Everything the cuda backend decides on the host (how a row-major matmul
 * becomes a column-major cuBLASLt call, which peer a fused kernel reads at
 * which step, where element i of a strided or block-packed tensor lives) is
 * here as inline functions with no CUDA include, so tests/unit/test_cuda_plan.c
 * checks it on the CPU. Functions a kernel also runs are TP_HD (host and
 * device under nvcc), so the index math the tests check is the math the GPU
 * runs.
 *
 * Conventions: strides and offsets are in elements; "row-major roles" means
 * the matmul as the graph states it, D[M,N] = A[M,K] . B[K,N]. */
#ifndef TP_CUDA_PLAN_H
#define TP_CUDA_PLAN_H

#include <stdint.h>
#include <string.h>

#include "dtype.h"
#include "tensor.h"

/* Largest world the peer-reading kernels (one-shot all_reduce, barriers,
 * fused pulls) take: their pointer tables are passed by value. NCCL paths
 * have no such limit. */
#define TP_CUDA_MAX_WORLD 8

/* ------------------------------------------------------------------------
 * Strided iteration over up to four operands (a coalesced layout): size-1
 * dims are dropped and adjacent dims merge when every operand's strides
 * allow. The cpu backend's ops_layout_init is this function. */

#define TP_LAYOUT_OPS 4 /* where: cond, x, y, out */

typedef struct {
    int nd, nops;
    int64_t shape[TP_MAX_DIMS];
    int64_t st[TP_LAYOUT_OPS][TP_MAX_DIMS];
} tp_layout;

static inline void tp_layout_init(tp_layout *l, int nd, const int64_t *shape, int nops,
                                  const int64_t *const *strides)
{
    tp_layout r; /* innermost first, reversed at the end */
    memset(&r, 0, sizeof r);
    r.nops = nops;
    for (int i = nd - 1; i >= 0; i--) {
        if (shape[i] == 1)
            continue;
        int merge = r.nd > 0;
        for (int k = 0; merge && k < nops; k++)
            merge = strides[k][i] == r.st[k][r.nd - 1] * r.shape[r.nd - 1];
        if (merge) {
            r.shape[r.nd - 1] *= shape[i];
            continue;
        }
        r.shape[r.nd] = shape[i];
        for (int k = 0; k < nops; k++)
            r.st[k][r.nd] = strides[k][i];
        r.nd++;
    }
    memset(l, 0, sizeof *l);
    l->nops = nops;
    if (r.nd == 0) { /* a scalar (or all size-1 dims): one element */
        l->nd = 1;
        l->shape[0] = 1;
        return;
    }
    l->nd = r.nd;
    for (int d = 0; d < r.nd; d++) {
        l->shape[d] = r.shape[r.nd - 1 - d];
        for (int k = 0; k < nops; k++)
            l->st[k][d] = r.st[k][r.nd - 1 - d];
    }
}

static inline int64_t tp_layout_numel(const tp_layout *l)
{
    int64_t n = 1;
    for (int d = 0; d < l->nd; d++)
        n *= l->shape[d];
    return n;
}

/* Offset of operand k's element number i (row-major order over shape). */
TP_HD int64_t tp_layout_offset(const tp_layout *l, int k, int64_t i)
{
    int64_t off = 0;
    for (int d = l->nd - 1; d >= 0; d--) {
        int64_t n = l->shape[d];
        off += (i % n) * l->st[k][d];
        i /= n;
    }
    return off;
}

/* NumPy broadcasting of t to the nd-dim shape: missing and size-1 dims get
 * stride 0. Returns -1 when t does not broadcast. */
static inline int tp_broadcast_strides(const tp_tensor *t, int nd, const int64_t *shape, int64_t *out)
{
    if (t->ndim > nd)
        return -1;
    for (int i = 0; i < nd; i++) {
        int j = i - (nd - t->ndim);
        if (j < 0)
            out[i] = 0;
        else if (t->shape[j] == shape[i])
            out[i] = t->shape[j] == 1 ? 0 : t->stride[j];
        else if (t->shape[j] == 1)
            out[i] = 0;
        else
            return -1;
    }
    return 0;
}

/* ------------------------------------------------------------------------
 * reduce_mean / reduce_sum over dim d of x: output element i (row-major over
 * the output) sums x[base(i) + k * sd] for k < n. */
typedef struct {
    tp_layout l;    /* operand 0: x with dim d taken as size 1 */
    int64_t n, sd;  /* size and stride of the reduced dim */
} tp_reduce_plan;

static inline void tp_reduce_plan_init(tp_reduce_plan *p, const tp_tensor *x, int d)
{
    int64_t shape[TP_MAX_DIMS];
    const int64_t *st[1] = {x->stride};
    memcpy(shape, x->shape, sizeof shape);
    shape[d] = 1;
    tp_layout_init(&p->l, x->ndim, shape, 1, st);
    p->n = x->shape[d];
    p->sd = x->stride[d];
}

TP_HD int64_t tp_reduce_base(const tp_reduce_plan *p, int64_t i) { return tp_layout_offset(&p->l, 0, i); }

/* ------------------------------------------------------------------------
 * gather(x, ids) along dim d: the output is x.shape[:d] + ids.shape +
 * x.shape[d+1:], row-major; its element i is x[o, id, r] where (o, j, r)
 * splits i by (n_ids, inner) and id is ids' element j (row-major). */
typedef struct {
    tp_layout rest;          /* operand 0: x without dim d, row-major */
    tp_layout ids;           /* operand 0: the ids, row-major */
    int64_t n_ids, inner;    /* ids' element count; product of x.shape[d+1:] */
    int64_t n, sd;           /* x.shape[d] (ids range), x.stride[d] */
} tp_gather_plan;

static inline void tp_gather_plan_init(tp_gather_plan *p, const tp_tensor *x, int d, const tp_tensor *ids)
{
    int64_t shape[TP_MAX_DIMS], stride[TP_MAX_DIMS];
    int nd = 0;
    p->inner = 1;
    for (int k = 0; k < x->ndim; k++) {
        if (k == d)
            continue;
        shape[nd] = x->shape[k];
        stride[nd++] = x->stride[k];
        if (k > d)
            p->inner *= x->shape[k];
    }
    const int64_t *xs[1] = {stride}, *is[1] = {ids->stride};
    tp_layout_init(&p->rest, nd, shape, 1, xs);
    tp_layout_init(&p->ids, ids->ndim, ids->shape, 1, is);
    p->n_ids = tp_tensor_numel(ids);
    p->n = x->shape[d];
    p->sd = x->stride[d];
}

/* Which id (row-major position in ids) output element i reads. */
TP_HD int64_t tp_gather_slot(const tp_gather_plan *p, int64_t i) { return (i / p->inner) % p->n_ids; }

/* An id as an index into dim d: negative ids count from the end (ONNX);
 * -1 when outside [-n, n). */
TP_HD int64_t tp_gather_index(const tp_gather_plan *p, int64_t id)
{
    if (id < 0)
        id += p->n;
    return id < 0 || id >= p->n ? -1 : id;
}

/* Offset in x of output element i, given its index along dim d. */
TP_HD int64_t tp_gather_src(const tp_gather_plan *p, int64_t i, int64_t index)
{
    int64_t r = i % p->inner, o = i / (p->inner * p->n_ids);
    return tp_layout_offset(&p->rest, 0, o * p->inner + r) + index * p->sd;
}

/* Bytes from the lowest to one past the highest element t can touch, and
 * the (non-positive) element offset of the lowest one from t->data. */
static inline int64_t tp_tensor_span(const tp_tensor *t, int64_t *lo_elems)
{
    int64_t lo = 0, hi = 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0) {
            *lo_elems = 0;
            return 0;
        }
        int64_t s = (t->shape[d] - 1) * t->stride[d];
        if (s < 0)
            lo += s;
        else
            hi += s;
    }
    *lo_elems = lo;
    return (hi - lo + 1) * (int64_t)tp_dtype_size(t->dtype);
}

/* ------------------------------------------------------------------------
 * Block packing: NCCL moves contiguous rank-major blocks, the graph wants
 * dim `dim` of a tensor split in d blocks. A contiguous tensor is viewed as
 * [outer, d*len, inner]; block j is rows [j*len, (j+1)*len) of the middle
 * dim. The packed layout stores block j contiguously at j*outer*len*inner.
 * all_gather unpacks (packed -> natural), reduce_scatter packs its input,
 * all_to_all packs by split_dim and unpacks by concat_dim. */

static inline void tp_block_dims(int nd, const int64_t *shape, int dim, int d, int64_t *outer,
                                 int64_t *len, int64_t *inner)
{
    *outer = 1;
    *inner = 1;
    for (int i = 0; i < dim; i++)
        *outer *= shape[i];
    for (int i = dim + 1; i < nd; i++)
        *inner *= shape[i];
    *len = shape[dim] / d;
}

/* Whether natural and packed orders coincide (nothing to pack). */
static inline int tp_block_is_identity(int64_t outer, int d) { return outer == 1 || d == 1; }

/* Packed index of natural element i. */
TP_HD int64_t tp_block_packed_index(int64_t i, int64_t outer, int64_t len, int64_t inner, int d)
{
    int64_t row = (int64_t)d * len * inner;
    int64_t o = i / row, rem = i % row;
    int64_t x = rem / inner, n = rem % inner;
    int64_t j = x / len, l = x % len;
    return (j * outer + o) * len * inner + l * inner + n;
}

/* Natural index of packed element p (the inverse). */
TP_HD int64_t tp_block_natural_index(int64_t p, int64_t outer, int64_t len, int64_t inner, int d)
{
    int64_t blk = outer * len * inner;
    int64_t j = p / blk, rem = p % blk;
    int64_t o = rem / (len * inner), rem2 = rem % (len * inner);
    int64_t l = rem2 / inner, n = rem2 % inner;
    return o * (int64_t)d * len * inner + (j * len + l) * inner + n;
}

/* ------------------------------------------------------------------------
 * Reductions: the scalar steps of the cpu collectives (collectives.c), so the
 * one-shot kernel and the fused reduce sum in the same order with the same
 * rounding: widen to f32, accumulate in rank order from rank 0's value, avg
 * divides the f32 sum, max propagates NaN; integers wrap in 64 bits and avg
 * truncates toward zero. `red` is tp_reduce (0 sum, 1 avg, 2 max). */

TP_HD float tp_reduce_step_f32(float acc, float x, int red)
{
    if (red == 2)
        return (x > acc || x != x) ? x : acc;
    return acc + x;
}

TP_HD float tp_reduce_finish_f32(float acc, int red, int d) { return red == 1 ? acc / (float)d : acc; }

TP_HD int64_t tp_reduce_step_i64(int64_t acc, int64_t x, int red)
{
    if (red == 2)
        return x > acc ? x : acc;
    return (int64_t)((uint64_t)acc + (uint64_t)x);
}

TP_HD int64_t tp_reduce_finish_i64(int64_t acc, int red, int d) { return red == 1 ? acc / d : acc; }

/* ------------------------------------------------------------------------
 * Fused schedules.
 *
 * fused_all_gather_matmul, gathering a row dim: step s computes the rows of
 * rank (rank + s) % d, so step 0 is the own shard (no wait on any peer) and
 * every peer comes exactly once. Gathering K (the contracted dim) sums the
 * partial products in rank order 0..d-1 instead, so every rank rounds the
 * same way and replicated results stay bit-identical (as the cpu does).
 *
 * Peer shards are pulled by copy engine into two staging slots: the c-th
 * pulled shard (c counts only peer steps) lands in slot c % 2 and may only
 * start once the GEMM that read pull c - 2 from that slot is done. */

TP_HD int tp_ag_src(int rank, int world, int step, int k_gather)
{
    return k_gather ? step : (rank + step) % world;
}

static inline int tp_ag_stage_slot(int pull) { return pull % 2; }
/* Pull whose GEMM must finish before pull `pull` may overwrite its slot, or -1. */
static inline int tp_ag_pull_waits_for(int pull) { return pull >= 2 ? pull - 2 : -1; }

/* fused_matmul_reduce_scatter: step s (0..d-1) computes the product chunk for
 * rank tp_rs_dst(s): peers first, the own chunk last (as the cpu does). At
 * step s < d-1 the chunk goes to its owner by NCCL send while this rank
 * receives the chunk rank tp_rs_src(s) computed for it at the same step:
 * tp_rs_dst(tp_rs_src(r, s), s) == r, so every send meets its receive. */
TP_HD int tp_rs_dst(int rank, int world, int step) { return (rank + 1 + step) % world; }
TP_HD int tp_rs_src(int rank, int world, int step) { return ((rank - 1 - step) % world + world) % world; }
/* Step at which the chunk from `src` (!= rank) arrives. */
TP_HD int tp_rs_step_of(int rank, int world, int src) { return ((rank - 1 - src) % world + world) % world; }

/* The block of the weight (2-D: [K, N], or [N, K] under transpose_b) one
 * fused step multiplies, the same on every backend. Gathering K (the
 * contracted dim — also what fuse_tp makes of gathered rank chunks cat on
 * K): rank src's rows of K, [src*kl, (src+1)*kl). Scattering the last dim
 * (also what it makes of the product's column chunks cat before a
 * reduce_scatter): rank dst's columns, [dst*nl, (dst+1)*nl). */
static inline tp_tensor tp_fused_w_k_rows(const tp_tensor *w, int transpose_b, int src, int64_t kl)
{
    return tp_tensor_narrow(w, transpose_b ? 1 : 0, src * kl, kl);
}

static inline tp_tensor tp_fused_w_n_cols(const tp_tensor *w, int transpose_b, int dst, int64_t nl)
{
    return tp_tensor_narrow(w, transpose_b ? 0 : 1, dst * nl, nl);
}

/* ------------------------------------------------------------------------
 * cuBLASLt from row-major matmuls.
 *
 * cuBLASLt is column-major: a row-major X[r, c] with leading dim L is, byte
 * for byte, the column-major X^T[c, r] with the same L. So
 *     D[M,N] = A[M,K] . B[K,N]   (row-major)
 * is computed as
 *     D^T[N,M] = B^T[N,K] . A^T[K,M]   (column-major),
 * i.e. cuBLASLt's first operand is the graph's B and its second the graph's
 * A, m = N, n = M, k = K. An operand stored row-major needs no transpose; one
 * stored column-major (unit stride along its rows) is passed transposed.
 * transpose_b is folded into B's strides by the caller. */

typedef struct {
    int64_t rows, cols, ld; /* the stored column-major matrix */
    int trans;              /* 1: cuBLASLt applies op = T */
} tp_lt_mat;

typedef struct {
    int64_t m, n, k;        /* column-major problem sizes */
    tp_lt_mat a, b, d;      /* a = graph B, b = graph A, d = graph D */
} tp_gemm_plan;

/* A rows x cols row-major-role matrix with strides (sr, sc) as cuBLASLt
 * reads it, as the stored column-major matrix of its transpose. Returns -1
 * when neither stride is unit (it must be packed first). */
static inline int tp_lt_operand(int64_t rows, int64_t cols, int64_t sr, int64_t sc, tp_lt_mat *m)
{
    if (cols == 1 || sc == 1) { /* row-major storage: column-major [cols, rows] */
        m->rows = cols;
        m->cols = rows;
        m->ld = rows == 1 ? cols : sr;
        m->trans = 0;
    } else if (rows == 1 || sr == 1) { /* column-major storage of X itself */
        m->rows = rows;
        m->cols = cols;
        m->ld = cols == 1 ? rows : sc;
        m->trans = 1;
    } else {
        return -1;
    }
    if (m->ld < m->rows)
        return -1; /* overlapping (e.g. broadcast) rows: pack */
    if (m->ld < 1)
        m->ld = 1;
    return 0;
}

/* Which operand, if any, must be packed contiguous (bit 0: A, bit 1: B,
 * bit 2: D cannot be written: its columns are not unit stride). 0: plan set. */
static inline int tp_gemm_plan_make(int64_t M, int64_t N, int64_t K, int64_t sam, int64_t sak,
                                    int64_t sbk, int64_t sbn, int64_t sdm, int64_t sdn, tp_gemm_plan *p)
{
    int bad = 0;
    memset(p, 0, sizeof *p);
    p->m = N;
    p->n = M;
    p->k = K;
    if (tp_lt_operand(K, N, sbk, sbn, &p->a) != 0) /* B^T[N,K] */
        bad |= 2;
    if (tp_lt_operand(M, K, sam, sak, &p->b) != 0) /* A^T[K,M] */
        bad |= 1;
    if (tp_lt_operand(M, N, sdm, sdn, &p->d) != 0 || p->d.trans)
        bad |= 4;
    return bad;
}

/* The alignment cuBLASLt may assume for an operand: the largest power of two
 * (at most 256, its default) dividing the address and every byte step the
 * kernel takes from it (leading dim, batch stride). */
static inline uint32_t tp_gemm_alignment(uintptr_t addr, int64_t ld_bytes, int64_t batch_bytes)
{
    uint64_t v = (uint64_t)addr | (uint64_t)ld_bytes | (uint64_t)batch_bytes | 256u;
    return (uint32_t)(v & (~v + 1)); /* lowest set bit */
}

/* ------------------------------------------------------------------------
 * A batched matmul over views: out[..., M, N] = a[..., M, K] . b[..., K, N]
 * (b[..., N, K] with transpose_b), batch dims broadcast NumPy-style to out's.
 * The batch dims are coalesced; the innermost coalesced one becomes
 * cuBLASLt's strided batch, the rest a host loop. When b does not move along
 * that batch dim and a and out step over it exactly like over M, it is
 * folded into M (one GEMM for [B, S, K] x [K, N]). */

/* cuBLASLt takes a strided batch's count as an int32_t
 * (CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT): a larger batch (2^48 elements are
 * allowed) goes in several calls of at most this many entries each. */
#define TP_MM_BATCH_MAX INT32_MAX

typedef struct {
    int64_t M, N, K;
    int64_t sam, sak, sbk, sbn, sdm, sdn;
    int64_t batch, bsa, bsb, bsd;   /* strided batch: count and per-operand strides */
    int64_t batch_max;              /* entries one call may take (TP_MM_BATCH_MAX; tests lower it) */
    tp_layout loop;                 /* outer batch dims: operand 0 a, 1 b, 2 out */
    int64_t n_loop;                 /* GEMM calls */
} tp_mm_problem;

/* Whether the strided batch can become more rows of one GEMM: b is shared
 * by every batch entry and a's and out's rows continue evenly across it
 * (a broadcast a, row stride 0, is better left to the strided batch). */
static inline int tp_mm_can_fold(const tp_mm_problem *p)
{
    if (p->batch <= 1 || p->bsb != 0 || p->bsa == 0 || p->bsd == 0)
        return 0;
    if (p->M == 1)
        return 1;
    return p->sam != 0 && p->bsa == p->M * p->sam && p->bsd == p->M * p->sdm;
}

/* 0, or -1 when the shapes do not give out. */
static inline int tp_mm_problem_make(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out,
                                     tp_mm_problem *p)
{
    int na = a->ndim, nbd = b->ndim, no = out->ndim, nb = no - 2;
    if (na < 2 || nbd < 2 || no < 2)
        return -1;
    memset(p, 0, sizeof *p);
    p->batch_max = TP_MM_BATCH_MAX;
    p->M = a->shape[na - 2];
    p->K = a->shape[na - 1];
    p->N = tb ? b->shape[nbd - 2] : b->shape[nbd - 1];
    int64_t kb = tb ? b->shape[nbd - 1] : b->shape[nbd - 2];
    if (kb != p->K || out->shape[no - 2] != p->M || out->shape[no - 1] != p->N)
        return -1;
    p->sam = a->stride[na - 2];
    p->sak = a->stride[na - 1];
    p->sbk = tb ? b->stride[nbd - 1] : b->stride[nbd - 2];
    p->sbn = tb ? b->stride[nbd - 2] : b->stride[nbd - 1];
    p->sdm = out->stride[no - 2];
    p->sdn = out->stride[no - 1];
    tp_tensor ab = *a, bb = *b;
    ab.ndim -= 2;
    bb.ndim -= 2;
    int64_t sa[TP_MAX_DIMS], sb[TP_MAX_DIMS];
    if (tp_broadcast_strides(&ab, nb, out->shape, sa) || tp_broadcast_strides(&bb, nb, out->shape, sb))
        return -1;
    const int64_t *st[3] = {sa, sb, out->stride};
    tp_layout l;
    tp_layout_init(&l, nb, out->shape, 3, st);
    /* the innermost coalesced batch dim (l has at least one dim) */
    int last = l.nd - 1;
    p->batch = l.shape[last];
    p->bsa = l.st[0][last];
    p->bsb = l.st[1][last];
    p->bsd = l.st[2][last];
    if (tp_mm_can_fold(p)) {
        if (p->M == 1) { /* a size-1 dim's stride is arbitrary: the batch's rules */
            p->sam = p->bsa;
            p->sdm = p->bsd;
        }
        p->M *= p->batch;
        p->batch = 1;
    }
    if (p->batch == 1)
        p->bsa = p->bsb = p->bsd = 0;
    /* the loop runs over the other coalesced batch dims */
    p->loop = l;
    p->loop.nd = last;
    if (p->loop.nd == 0) {
        p->loop.nd = 1;
        p->loop.shape[0] = 1;
        for (int k = 0; k < 3; k++)
            p->loop.st[k][0] = 0;
    }
    p->n_loop = tp_layout_numel(&p->loop);
    return 0;
}

/* Whether the strided batch must be issued one entry at a time: a
 * broadcast operand (batch stride 0) is never handed to cuBLASLt's strided
 * batch, whose support for it is not documented. */
static inline int tp_mm_unrolled(const tp_mm_problem *p)
{
    return p->batch > 1 && (p->bsa == 0 || p->bsb == 0 || p->bsd == 0);
}

/* GEMM calls of the problem: tp_mm_n_calls() of them, call c has batch
 * count tp_mm_call_batch(c) and starts at these element offsets of a, b
 * and out. Each outer loop index takes the strided batch in calls of
 * tp_mm_per_call() entries (1 when unrolled), the last one the rest. */
static inline int64_t tp_mm_per_call(const tp_mm_problem *p)
{
    return tp_mm_unrolled(p) ? 1 : p->batch_max;
}

static inline int64_t tp_mm_inner_calls(const tp_mm_problem *p)
{
    int64_t per = tp_mm_per_call(p);
    return (p->batch + per - 1) / per;
}

static inline int64_t tp_mm_n_calls(const tp_mm_problem *p) { return p->n_loop * tp_mm_inner_calls(p); }

static inline int64_t tp_mm_call_batch(const tp_mm_problem *p, int64_t c)
{
    int64_t per = tp_mm_per_call(p), rest = p->batch - c % tp_mm_inner_calls(p) * per;
    return rest < per ? rest : per;
}

static inline void tp_mm_call_offsets(const tp_mm_problem *p, int64_t c, int64_t *oa, int64_t *ob, int64_t *od)
{
    int64_t inner = tp_mm_inner_calls(p), i = c / inner, j = c % inner * tp_mm_per_call(p);
    *oa = tp_layout_offset(&p->loop, 0, i) + j * p->bsa;
    *ob = tp_layout_offset(&p->loop, 1, i) + j * p->bsb;
    *od = tp_layout_offset(&p->loop, 2, i) + j * p->bsd;
}

#endif
