#include "fused.h"

#include <stdlib.h>
#include <string.h>

#include "buf_pool.h"
#include "common/tp_cuda_plan.h"
#include "cpu_ops.h"
#include "ops_internal.h"
#include "reassembly.h"

/* A fused op's scratch of bytes: up to TP_BUF_POOL_SIZE one of this
 * thread's pooled buffers, else malloc's. The example's gathers and
 * scatters at batch 2-8 are 2-8 KiB, past malloc's per-thread cache:
 * four a step took its slow path (_int_malloc, consolidation), 0.5 a
 * request at 32 binary connections. Each take has its give before the op
 * returns, on the same thread (a serial step's ranks are fibers of one
 * thread: each take is its own buffer, in any order). */
static void *scratch_take(size_t bytes)
{
    return bytes <= TP_BUF_POOL_SIZE ? tp_buf_pool_take() : malloc(bytes ? bytes : 1);
}

static void scratch_give(void *p, size_t bytes)
{
    if (bytes <= TP_BUF_POOL_SIZE)
        tp_buf_pool_give(p);
    else
        free(p);
}

/* dst = a @ b for any dst view. An FP32 column block of the fused output
 * is written in place (BLAS's ldc); other strided destinations (FP16/BF16
 * blocks) go through a scratch buffer (scratch_take) and a copy. */
static tp_status matmul_into(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *b, tp_tensor *dst,
                             int rank, int world, tp_err *err)
{
    tp_attrs mm = {0};
    mm.transpose_b = attrs->transpose_b;
    tp_tensor ab[2] = {*a, *b};
    if (cpu_matmul_writes_in_place(dst)) /* contiguous, or FP32 rows ldc apart */
        return cpu_matmul(&mm, a, b, dst, NULL, err);
    size_t bytes = (size_t)tp_tensor_numel(dst) * tp_dtype_size(dst->dtype);
    void *scratch = scratch_take(bytes);
    if (!scratch)
        return tp_fail(err, TP_NOMEM, "fused matmul: cannot allocate %zu bytes", bytes);
    tp_tensor tmp = tp_tensor_make(scratch, dst->dtype, dst->ndim, dst->shape);
    tp_status st = cpu_op_run(TP_OP_MATMUL, &mm, ab, 2, &tmp, rank, world, err);
    if (st == TP_OK)
        tp_tensor_copy(dst, &tmp);
    scratch_give(scratch, bytes);
    return st;
}

/* Every weight's product of rows x_rows into its column block of dest rows. */
static tp_status matmul_blocks(const tp_attrs *attrs, const tp_tensor *x_rows, const tp_tensor *ins, int n_ins,
                               tp_tensor *dest_rows, int rank, int world, tp_err *err)
{
    int64_t col = 0;
    tp_status st = TP_OK;
    for (int j = 1; st == TP_OK && j < n_ins; j++) {
        int64_t nj = ins[j].shape[attrs->transpose_b ? 0 : 1];
        tp_tensor block = tp_tensor_narrow(dest_rows, dest_rows->ndim - 1, col, nj);
        st = matmul_into(attrs, x_rows, &ins[j], &block, rank, world, err);
        col += nj;
    }
    return st;
}

/* What a piece of a reassembled fused node multiplies (tp_piece_fn). */
typedef struct {
    const tp_attrs *attrs;
    const tp_tensor *ins; /* ag_mm: the weights are ins[1..n_ins) */
    int n_ins, rank, world;
} piece_ctx;

static tp_status ag_mm_piece(void *ctx, const tp_tensor *rows, tp_tensor *dest, tp_err *err)
{
    const piece_ctx *c = ctx;
    return matmul_blocks(c->attrs, rows, c->ins, c->n_ins, dest, c->rank, c->world, err);
}

static tp_status mm_rs_piece(void *ctx, const tp_tensor *rows, tp_tensor *dest, tp_err *err)
{
    const piece_ctx *c = ctx;
    return matmul_into(c->attrs, rows, &c->ins[1], dest, c->rank, c->world, err);
}

/* dst += src elementwise (both contiguous, same shape). */
static void accumulate(tp_tensor *dst, const tp_tensor *src)
{
    int64_t n = tp_tensor_numel(dst);
    if (dst->dtype == TP_F32) {
        float *o = dst->data;
        const float *a = src->data;
        for (int64_t i = 0; i < n; i++)
            o[i] += a[i];
        return;
    }
    for (int64_t i = 0; i < n; i++)
        tp_store_f32(dst->data, dst->dtype, i, tp_load_f32(dst->data, dst->dtype, i) + tp_load_f32(src->data, src->dtype, i));
}

/* Every rank reaches the release whatever its status; a failed release
 * (the comm is lost) turns a success into that error. */
static tp_status release(cpu_comm *c, int rank, tp_status st, tp_err *err)
{
    tp_err lost;
    tp_status rel = cpu_comm_release(c, rank, &lost);
    if (st == TP_OK && rel != TP_OK)
        return tp_fail(err, rel, "%s", lost.msg);
    return st;
}

/* ag_mm gathering K (the contracted dim): out = sum over ranks of x_r times
 * the rows of w that meet x_r (fuse_tp gives such a node one weight).
 * Summed in rank order 0..d-1 on every rank (tp_ag_src, the schedule the
 * cuda backend runs too) so replicated results stay bit-identical across
 * ranks (the overlap order (r+i)%d would make each rank round differently). */
static tp_status ag_mm_k(cpu_comm *c, const tp_attrs *attrs, const tp_tensor *ins, tp_tensor *out, int rank,
                         tp_err *err)
{
    int d = cpu_comm_world(c);
    int64_t kl = ins[0].shape[ins[0].ndim - 1];
    size_t bytes = (size_t)tp_tensor_numel(out) * tp_dtype_size(out->dtype);
    void *scratch = scratch_take(bytes);
    if (!scratch)
        return tp_fail(err, TP_NOMEM, "fused matmul: cannot allocate %zu bytes", bytes);
    tp_tensor part = tp_tensor_make(scratch, out->dtype, out->ndim, out->shape);
    tp_status st = TP_OK;
    for (int step = 0; st == TP_OK && step < d; step++) {
        int src = tp_ag_src(rank, d, step, 1);
        tp_tensor w_rows = tp_fused_w_k_rows(&ins[1], attrs->transpose_b, src, kl);
        tp_tensor xs = cpu_comm_peer(c, src); /* in this process's mapping */
        st = matmul_into(attrs, &xs, &w_rows, step ? &part : out, rank, d, err);
        if (st == TP_OK && step)
            accumulate(out, &part);
    }
    scratch_give(scratch, bytes);
    return st;
}

/* ag_mm gathering a dim other than K: every peer's shard is readable here
 * once exchanged, so the shards are copied into one gathered input and
 * each weight multiplies all of it at once. The GPU's schedule (a product
 * per shard, overlapping the next shard's transfer) has nothing to overlap
 * on this backend, and one OpenBLAS call per shard cost more than the copy
 * (each call has a fixed cost: a mutex for its buffers, packing; with
 * mm_rs_rows the example's step makes 4 calls at any batch, where it made
 * 8 at batch 1). Every output row is the product of its own input row
 * either way. Only for inputs of at most OPS_COPY_MAX_BYTES gathered:
 * larger ones are multiplied shard by shard, never materialized whole. */
static tp_status ag_mm_gathered(cpu_comm *c, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                                tp_tensor *out, int rank, tp_err *err)
{
    int d = cpu_comm_world(c), g = attrs->dim;
    int64_t len = ins[0].shape[g], shape[TP_MAX_DIMS];
    memcpy(shape, ins[0].shape, sizeof shape);
    shape[g] *= d;
    size_t bytes = (size_t)tp_tensor_numel(&ins[0]) * (size_t)d * tp_dtype_size(ins[0].dtype);
    void *scratch = scratch_take(bytes);
    if (!scratch)
        return tp_fail(err, TP_NOMEM, "fused matmul: cannot allocate %zu bytes", bytes);
    tp_tensor x = tp_tensor_make(scratch, ins[0].dtype, ins[0].ndim, shape);
    for (int src = 0; src < d; src++) {
        tp_tensor part = tp_tensor_narrow(&x, g, src * len, len), xs = cpu_comm_peer(c, src);
        tp_tensor_copy(&part, &xs);
    }
    tp_tensor og = tp_gathered_view(&ins[0], g, d, out);
    tp_status st = matmul_blocks(attrs, &x, ins, n_ins, &og, rank, d, err);
    scratch_give(scratch, bytes);
    return st;
}

static tp_status ag_mm(cpu_comm *c, int rank, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                       tp_tensor *out, tp_err *err)
{
    int d = cpu_comm_world(c), g = attrs->dim;
    tp_status st = cpu_comm_exchange(c, rank, &ins[0], err);
    if (st != TP_OK)
        return st;
    if (g == ins[0].ndim - 1) {
        st = n_ins == 2 ? ag_mm_k(c, attrs, ins, out, rank, err)
                        : tp_fail(err, TP_INTERNAL, "fused matmul gathering K takes one weight, got %d", n_ins - 1);
        return release(c, rank, st, err);
    }
    size_t gathered = (size_t)tp_tensor_numel(&ins[0]) * (size_t)d * tp_dtype_size(ins[0].dtype);
    if (attrs->n_pieces == 0 && gathered <= OPS_COPY_MAX_BYTES)
        return release(c, rank, ag_mm_gathered(c, attrs, ins, n_ins, out, rank, err), err);
    tp_tensor og = tp_gathered_view(&ins[0], g, d, out);
    int64_t len = ins[0].shape[g];
    for (int step = 0; st == TP_OK && step < d; step++) {
        int src = tp_ag_src(rank, d, step, 0); /* own shard first: no waiting on a peer */
        tp_tensor xs = cpu_comm_peer(c, src); /* in this process's mapping */
        if (attrs->n_pieces > 0) {
            piece_ctx pc = {attrs, ins, n_ins, rank, d};
            st = tp_ag_mm_pieces(attrs, &xs, src, d, out, ag_mm_piece, &pc, err);
            continue;
        }
        tp_tensor rows = tp_tensor_narrow(&og, g, src * len, len);
        st = matmul_blocks(attrs, &xs, ins, n_ins, &rows, rank, d, err);
    }
    return release(c, rank, st, err);
}

/* o = p0 + p1 (one pass for the first two peers, not a copy and an add),
 * then += each further peer: the same order of additions as one peer at a
 * time. Clones for AVX2 and AVX-512; element by element, so o may be one
 * of its operands. */
OPS_SIMD_CLONES static void sum_peers_f32(float *o, const float *p0, const float *p1, int64_t n)
{
    for (int64_t e = 0; e < n; e++)
        o[e] = p0[e] + p1[e];
}

OPS_SIMD_CLONES static void add_peer_f32(float *o, const float *p, int64_t n)
{
    for (int64_t e = 0; e < n; e++)
        o[e] += p[e];
}

/* out = reduction over ranks of each peer's workspace slot `rank`. */
static tp_status reduce_slots(cpu_comm *c, int rank, tp_reduce red, tp_tensor *out, tp_err *err)
{
    int d = cpu_comm_world(c);
    int64_t n = tp_tensor_numel(out);
    if (out->dtype == TP_F32) { /* the common case, without per-element dispatch */
        float *o = out->data;
        const float *p0 = (const float *)cpu_comm_peer(c, 0).data + rank * n;
        if (d == 1)
            memmove(o, p0, (size_t)n * sizeof *o);
        else
            sum_peers_f32(o, p0, (const float *)cpu_comm_peer(c, 1).data + rank * n, n);
        for (int r = 2; r < d; r++)
            add_peer_f32(o, (const float *)cpu_comm_peer(c, r).data + rank * n, n);
        if (red == TP_REDUCE_AVG)
            for (int64_t e = 0; e < n; e++)
                o[e] /= (float)d;
        return TP_OK;
    }
    const void **peer = malloc((size_t)d * sizeof *peer); /* translated once, not per element */
    if (!peer)
        return tp_fail(err, TP_NOMEM, "fused_matmul_reduce_scatter: out of memory");
    for (int r = 0; r < d; r++)
        peer[r] = cpu_comm_peer(c, r).data;
    for (int64_t e = 0; e < n; e++) {
        float acc = 0.0f;
        for (int r = 0; r < d; r++)
            acc += tp_load_f32(peer[r], out->dtype, rank * n + e);
        tp_store_f32(out->data, out->dtype, e, red == TP_REDUCE_AVG ? acc / (float)d : acc);
    }
    free(peer);
    return TP_OK;
}

/* Whether mm_rs's workspace slots, the product packed by destination
 * along dim s (tp_cuda_plan.h's block packing), are the product itself in
 * its natural order: out is one destination's block. */
static int slots_are_product(const tp_tensor *out, int s, int d)
{
    int64_t outer, len, inner;
    tp_block_dims(out->ndim, out->shape, s, 1, &outer, &len, &inner);
    return tp_block_is_identity(outer, d);
}

/* matmul+reduce-scatter scattering a dim other than N: the whole product
 * a @ w at once, then each destination's rows into its workspace slot,
 * instead of one product per destination (one OpenBLAS call each, with its
 * fixed cost; ag_mm_gathered says why that matters). When the slots are
 * the product in its natural order (slots_are_product: every dim before
 * the scattered one is 1), it is written straight into the workspace. */
static tp_status mm_rs_rows(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *w, const tp_tensor *ws,
                            const tp_tensor *out, int rank, int d, tp_err *err)
{
    int s = attrs->dim, nd = out->ndim;
    int64_t len = out->shape[s], chunk = tp_tensor_numel(out), shape[TP_MAX_DIMS];
    memcpy(shape, out->shape, sizeof shape);
    shape[s] *= d;
    size_t es = tp_dtype_size(out->dtype), bytes = (size_t)chunk * (size_t)d * es;
    void *scratch = NULL;
    if (!slots_are_product(out, s, d) && !(scratch = scratch_take(bytes)))
        return tp_fail(err, TP_NOMEM, "fused matmul: cannot allocate %zu bytes", bytes);
    tp_tensor prod = tp_tensor_make(scratch ? scratch : ws->data, out->dtype, nd, shape);
    tp_status st = matmul_into(attrs, a, w, &prod, rank, d, err);
    for (int dst = 0; st == TP_OK && scratch && dst < d; dst++) {
        tp_tensor slot = tp_tensor_make((char *)ws->data + (size_t)(dst * chunk) * es, out->dtype, nd, out->shape);
        tp_tensor rows = tp_tensor_narrow(&prod, s, dst * len, len);
        tp_tensor_copy(&slot, &rows);
    }
    scratch_give(scratch, bytes);
    return st;
}

/* Whether mm_rs multiplies by mm_rs_rows: scattering a dim other than N,
 * when the product goes straight into the workspace or fits in
 * OPS_COPY_MAX_BYTES of scratch (larger ones are multiplied destination by
 * destination, never materialized twice). */
static int mm_rs_by_rows(const tp_attrs *attrs, const tp_tensor *out, int d)
{
    int s = attrs->dim;
    if (attrs->n_pieces > 0 || s >= out->ndim - 1)
        return 0;
    return slots_are_product(out, s, d) ||
           (size_t)tp_tensor_numel(out) * (size_t)d * tp_dtype_size(out->dtype) <= OPS_COPY_MAX_BYTES;
}

static tp_status mm_rs(cpu_comm *c, int rank, const tp_attrs *attrs, const tp_tensor *ins, tp_tensor *out,
                       tp_err *err)
{
    int d = cpu_comm_world(c), s = attrs->dim, nd = out->ndim;
    const tp_tensor *w = &ins[1], *ws = &ins[2];
    int64_t K = ins[0].shape[ins[0].ndim - 1], len = out->shape[s];
    int64_t ashape[TP_MAX_DIMS]; /* a in the product's coordinates */
    memcpy(ashape, out->shape, sizeof ashape);
    ashape[s] *= d;
    ashape[nd - 1] = K;
    tp_tensor a = ins[0];
    if (attrs->n_shape > 0)
        a = tp_tensor_make(ins[0].data, ins[0].dtype, nd, ashape);
    int64_t chunk = tp_tensor_numel(out);
    int by_rows = mm_rs_by_rows(attrs, out, d);
    tp_status st = by_rows ? mm_rs_rows(attrs, &a, w, ws, out, rank, d, err) : TP_OK;
    for (int step = 0; !by_rows && st == TP_OK && step < d; step++) {
        int dst = tp_rs_dst(rank, d, step); /* peers' chunks first, own chunk last */
        tp_tensor slot = tp_tensor_make((char *)ws->data + dst * chunk * (int64_t)tp_dtype_size(out->dtype),
                                        out->dtype, nd, out->shape);
        if (attrs->n_pieces > 0) {
            piece_ctx pc = {attrs, ins, 2, rank, d};
            st = tp_mm_rs_pieces(attrs, &a, dst, &slot, mm_rs_piece, &pc, err);
        } else if (s < nd - 1) {
            tp_tensor rows = tp_tensor_narrow(&a, s, dst * len, len);
            st = matmul_into(attrs, &rows, w, &slot, rank, d, err);
        } else {
            tp_tensor cols = tp_fused_w_n_cols(w, attrs->transpose_b, dst, len);
            st = matmul_into(attrs, &a, &cols, &slot, rank, d, err);
        }
    }
    /* every rank reaches the exchange, so a local failure cannot strand peers */
    tp_status ex = cpu_comm_exchange(c, rank, ws, st == TP_OK ? err : NULL);
    if (ex != TP_OK)
        return st != TP_OK ? st : ex;
    if (st == TP_OK)
        st = reduce_slots(c, rank, attrs->reduce, out, err);
    return release(c, rank, st, err);
}

tp_status cpu_fused_run(cpu_comm *c, int rank, tp_op op, const tp_attrs *attrs, const tp_tensor *ins,
                        int n_ins, tp_tensor *out, tp_err *err)
{
    if (op == TP_OP_FUSED_AG_MM && n_ins >= 2)
        return ag_mm(c, rank, attrs, ins, n_ins, out, err);
    if (op == TP_OP_FUSED_MM_RS && n_ins == 3)
        return mm_rs(c, rank, attrs, ins, out, err);
    return tp_fail(err, TP_INTERNAL, "cpu backend: '%s' with %d inputs is not a fused op it runs",
                   tp_op_name(op), n_ins);
}
