/* cuda_fused.c — fused_all_gather_matmul and fused_matmul_reduce_scatter as
 * chunked pipelines: communication on the side stream overlaps the GEMMs
 * on the compute stream, ordered by events, with the side stream forked
 * from and joined back into compute inside the op (so capture records it
 * and the next op sees everything finished).
 *
 * fused_all_gather_matmul (ins = {x, w_1..w_n}): step s computes the rows
 * of rank tp_ag_src(r, d, s) — own shard first — from that rank's x, pulled
 * by copy engine (cudaMemcpyAsync from the peer's symmetric x) into one of
 * two staging slots while the previous step's GEMM runs. A barrier kernel
 * before the pulls makes sure every rank's x is written; one after makes
 * sure nobody overwrites its x while a peer still pulls. Without peer
 * mappings x is gathered by ncclAllGather first and the GEMMs read it
 * (correct, not overlapped).
 *
 * fused_matmul_reduce_scatter (ins = {a, w, workspace}): step s computes
 * the product chunk for rank tp_rs_dst(r, d, s) — peers first, own last —
 * into the workspace; after each peer chunk's GEMM the side stream sends it
 * to its owner and receives the chunk tp_rs_src(r, d, s) computed for this
 * rank (NCCL send/recv, matched step for step on every rank), while the
 * next GEMM runs. The own chunk and the received ones are then reduced in
 * rank order, as the cpu backend does.
 *
 * Reassembly (tp_attrs pieces), the contracted-dim gather and the
 * n_shape re-view follow kernels/cpu/fused.c line for line; only where a
 * shard comes from and which stream runs what differ. */
#include <string.h>

#include "cuda/cuda_internal.h"
#include "log.h"
#include "reassembly.h"

/* ------------------------------------------------------- shared with cpu */

/* Every weight's product of rows x_rows into its column block of dest. */
static tp_status matmul_blocks(cu_ctx *x, const tp_attrs *at, const tp_tensor *x_rows, const tp_tensor *ins,
                               int n_ins, tp_tensor *dest, tp_err *err)
{
    int64_t col = 0;
    for (int j = 1; j < n_ins; j++) {
        int64_t nj = ins[j].shape[at->transpose_b ? 0 : 1];
        tp_tensor block = tp_tensor_narrow(dest, dest->ndim - 1, col, nj);
        TP_TRY(cu_matmul(x, x_rows, &ins[j], at->transpose_b, &block, 0.0f, x->compute, err));
        col += nj;
    }
    return TP_OK;
}

/* What a piece of a reassembled fused node multiplies (tp_piece_fn). */
typedef struct {
    cu_ctx *x;
    const tp_attrs *at;
    const tp_tensor *ins; /* ag_mm: the weights are ins[1..n_ins); mm_rs: the weight is w */
    const tp_tensor *w;
    int n_ins;
} piece_ctx;

static tp_status ag_mm_piece(void *ctx, const tp_tensor *rows, tp_tensor *dest, tp_err *err)
{
    const piece_ctx *c = ctx;
    return matmul_blocks(c->x, c->at, rows, c->ins, c->n_ins, dest, err);
}

static tp_status mm_rs_piece(void *ctx, const tp_tensor *rows, tp_tensor *dest, tp_err *err)
{
    const piece_ctx *c = ctx;
    return cu_matmul(c->x, rows, c->w, c->at->transpose_b, dest, 0.0f, c->x->compute, err);
}

/* ---------------------------------------------------------- streams */

static tp_status fork_side(cu_ctx *x, tp_err *err)
{
    CU_TRY(x, err, cudaEventRecord(x->ev_fork, x->compute));
    CU_TRY(x, err, cudaStreamWaitEvent(x->side, x->ev_fork, 0));
    return TP_OK;
}

static tp_status join_side(cu_ctx *x, tp_err *err)
{
    CU_TRY(x, err, cudaEventRecord(x->ev_join, x->side));
    CU_TRY(x, err, cudaStreamWaitEvent(x->compute, x->ev_join, 0));
    return TP_OK;
}

/* A joined-in fork must always be rejoined, even after a failure, or the
 * capture (and compute) is left with a dangling stream. */
static tp_status rejoin(cu_ctx *x, tp_status st, tp_err *err)
{
    tp_err ignore;
    tp_status j = join_side(x, st == TP_OK ? err : &ignore);
    return st != TP_OK ? st : j;
}

static uint64_t fused_sig(tp_op op, const tp_tensor *in, const tp_tensor *out)
{
    uint64_t h = 1469598103934665603ull;
    int64_t v[] = {op, in->dtype, tp_tensor_numel(in), tp_tensor_numel(out)};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        h ^= (uint64_t)v[i];
        h *= 1099511628211ull;
    }
    return h;
}

/* ---------------------------------------------------- all_gather + matmul */

typedef struct {
    const tp_tensor *mine;  /* this rank's shard (ins[0]) */
    const cu_alloc *al;     /* its symmetric allocation (peer mode) */
    char *stage[2];         /* peer mode: pull slots */
    char *gathered;         /* NCCL mode: every shard, rank-major */
    size_t bytes;           /* one shard */
    int pulls;
} ag_src;

/* Shard `src` as a local tensor: own, gathered, or pulled into a slot (the
 * pull ordered after the GEMM that last read that slot). *slot gets the
 * slot used, -1 if none. */
static tp_status shard_of(cu_ctx *x, ag_src *s, int src, tp_tensor *out, int *slot, tp_err *err)
{
    *out = *s->mine;
    *slot = -1;
    if (src == x->rank)
        return TP_OK;
    if (s->gathered) {
        out->data = s->gathered + (size_t)src * s->bytes;
        return TP_OK;
    }
    int c = s->pulls++, k = tp_ag_stage_slot(c);
    if (tp_ag_pull_waits_for(c) >= 0)
        CU_TRY(x, err, cudaStreamWaitEvent(x->side, x->ev_gemm[k], 0));
    const char *from = s->al->peer[src] + ((const char *)s->mine->data - s->al->base);
    CU_TRY(x, err, cudaMemcpyAsync(s->stage[k], from, s->bytes, cudaMemcpyDefault, x->side));
    CU_TRY(x, err, cudaEventRecord(x->ev_pull[k], x->side));
    CU_TRY(x, err, cudaStreamWaitEvent(x->compute, x->ev_pull[k], 0));
    out->data = s->stage[k];
    *slot = k;
    return TP_OK;
}

/* The GEMMs of one step: rows of rank src, or its K-slice of the sum. */
static tp_status ag_step(cu_ctx *x, const tp_attrs *at, const tp_tensor *xs, int src, int step, const tp_tensor *ins,
                         int n_ins, tp_tensor *out, tp_err *err)
{
    int g = at->dim;
    if (g == xs->ndim - 1) { /* K gathered: out = sum over src, rank order */
        int64_t kl = xs->shape[g];
        tp_tensor w_rows = tp_fused_w_k_rows(&ins[1], at->transpose_b, src, kl);
        return cu_matmul(x, xs, &w_rows, at->transpose_b, out, step == 0 ? 0.0f : 1.0f, x->compute, err);
    }
    if (at->n_pieces > 0) {
        piece_ctx pc = {x, at, ins, NULL, n_ins};
        return tp_ag_mm_pieces(at, xs, src, x->world, out, ag_mm_piece, &pc, err);
    }
    tp_tensor og = tp_gathered_view(xs, g, x->world, out);
    int64_t len = xs->shape[g];
    tp_tensor rows = tp_tensor_narrow(&og, g, src * len, len);
    return matmul_blocks(x, at, xs, ins, n_ins, &rows, err);
}

static tp_status ag_steps(cu_ctx *x, const tp_attrs *at, ag_src *s, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    int k_gather = at->dim == ins[0].ndim - 1;
    for (int step = 0; step < x->world; step++) {
        int src = tp_ag_src(x->rank, x->world, step, k_gather), slot;
        tp_tensor xs;
        TP_TRY(shard_of(x, s, src, &xs, &slot, err));
        TP_TRY(ag_step(x, at, &xs, src, step, ins, n_ins, out, err));
        if (slot >= 0)
            CU_TRY(x, err, cudaEventRecord(x->ev_gemm[slot], x->compute));
    }
    return TP_OK;
}

/* Where the shards come from: peer pulls (two slots) or one NCCL gather. */
static tp_status ag_sources(cu_ctx *x, const tp_tensor *xs, ag_src *s, tp_err *err)
{
    memset(s, 0, sizeof *s);
    s->mine = xs;
    s->bytes = cu_nbytes(xs);
    const cu_alloc *al = cu_find_alloc(x, xs->data);
    if (x->sync_ok && al && al->peer_mapped) {
        s->al = al;
        if (x->world > 1) {
            TP_TRY(cu_scratch_take(x, s->bytes, (void **)&s->stage[0], err));
            TP_TRY(cu_scratch_take(x, s->bytes, (void **)&s->stage[1], err));
        }
        KERNEL_TRY(x, err, tp_cuda_barrier(&x->sync, TP_CUDA_SLOT_FUSED_IN, x->compute));
        return TP_OK;
    }
    if (!x->fused_fallback_logged++)
        TP_LOG_W("cuda rank %d: fused_all_gather_matmul gathers with NCCL first (input not in peer-mapped "
                 "symmetric memory): correct, not overlapped",
                 x->rank);
    ncclDataType_t t;
    if (cu_nccl_type(xs->dtype, &t) != 0)
        return tp_fail(err, TP_INVALID, "fused_all_gather_matmul: dtype %s", tp_dtype_name(xs->dtype));
    TP_TRY(cu_scratch_take(x, s->bytes * (size_t)x->world, (void **)&s->gathered, err));
    NCCL_TRY(x, err, ncclAllGather(xs->data, s->gathered, (size_t)tp_tensor_numel(xs), t, x->comm, x->compute));
    return TP_OK;
}

static tp_status ag_mm(cu_ctx *x, const tp_attrs *at, const tp_tensor *ins, int n_ins, tp_tensor *out, tp_err *err)
{
    const tp_tensor *xs = &ins[0];
    if (!tp_tensor_is_contiguous(xs) || at->dim < 0 || at->dim >= xs->ndim)
        return tp_fail(err, TP_INVALID, "fused_all_gather_matmul: input must be contiguous with dim %d in range",
                       at->dim);
    if (at->dim == xs->ndim - 1 && n_ins != 2)
        return tp_fail(err, TP_INTERNAL, "fused matmul gathering K takes one weight, got %d", n_ins - 1);
    cu_note_signature(x, "fused_all_gather_matmul", fused_sig(TP_OP_FUSED_AG_MM, xs, out), tp_tensor_numel(out));
    ag_src s;
    TP_TRY(ag_sources(x, xs, &s, err));
    tp_status st = fork_side(x, err);
    if (st == TP_OK)
        st = rejoin(x, ag_steps(x, at, &s, ins, n_ins, out, err), err);
    /* Peers may reuse their x only after every pull. Once the entry barrier
     * is queued (s.al) the exit one follows whatever failed: skipped, it
     * would leave this rank's epoch on the slot one behind its peers' for
     * good, and them waiting in it until the barrier timeout. */
    if (s.al) {
        int k = tp_cuda_barrier(&x->sync, TP_CUDA_SLOT_FUSED_OUT, x->compute);
        if (k != 0 && st == TP_OK)
            return cu_fail_cuda(x, err, k, "tp_cuda_barrier(&x->sync, TP_CUDA_SLOT_FUSED_OUT, x->compute)", __FILE__,
                                __LINE__);
        if (k != 0)
            cu_warn_cuda(x, (cudaError_t)k, "tp_cuda_barrier(FUSED_OUT) after a failed step");
    }
    return st;
}

/* ------------------------------------------------ matmul + reduce_scatter */

typedef struct {
    tp_tensor a;           /* in product coordinates */
    const tp_tensor *w, *ws;
    char *stage;           /* d-1 received chunks, in step order */
    int64_t chunk;         /* elements of one chunk (= out) */
    ncclDataType_t t;
} rs_plan;

/* Product chunk for rank dst into its workspace slot. */
static tp_status rs_gemm(cu_ctx *x, const tp_attrs *at, const rs_plan *p, int dst, const tp_tensor *out,
                         tp_tensor *slot, tp_err *err)
{
    int s = at->dim, nd = out->ndim;
    int64_t len = out->shape[s];
    *slot = tp_tensor_make((char *)p->ws->data + dst * p->chunk * (int64_t)tp_dtype_size(out->dtype), out->dtype, nd,
                           out->shape);
    if (at->n_pieces > 0) {
        piece_ctx pc = {x, at, NULL, p->w, 0};
        return tp_mm_rs_pieces(at, &p->a, dst, slot, mm_rs_piece, &pc, err);
    }
    if (s < nd - 1) {
        tp_tensor rows = tp_tensor_narrow(&p->a, s, dst * len, len);
        return cu_matmul(x, &rows, p->w, at->transpose_b, slot, 0.0f, x->compute, err);
    }
    tp_tensor cols = tp_fused_w_n_cols(p->w, at->transpose_b, dst, len);
    return cu_matmul(x, &p->a, &cols, at->transpose_b, slot, 0.0f, x->compute, err);
}

/* After step's GEMM: send the chunk to its owner, receive ours from
 * tp_rs_src, on the side stream. */
static tp_status rs_exchange(cu_ctx *x, const rs_plan *p, int step, const tp_tensor *slot, tp_err *err)
{
    CU_TRY(x, err, cudaEventRecord(x->ev_gemm[0], x->compute));
    CU_TRY(x, err, cudaStreamWaitEvent(x->side, x->ev_gemm[0], 0));
    size_t es = tp_dtype_size(slot->dtype), n = (size_t)p->chunk;
    int dst = tp_rs_dst(x->rank, x->world, step), src = tp_rs_src(x->rank, x->world, step);
    NCCL_TRY(x, err, ncclGroupStart());
    ncclResult_t r = ncclSend(slot->data, n, p->t, dst, x->comm, x->side);
    if (r == ncclSuccess)
        r = ncclRecv(p->stage + (size_t)step * n * es, n, p->t, src, x->comm, x->side);
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess)
        return cu_fail_nccl(x, err, r, "ncclSend/ncclRecv (fused_matmul_reduce_scatter)", __FILE__, __LINE__);
    if (r2 != ncclSuccess)
        return cu_fail_nccl(x, err, r2, "ncclGroupEnd() (fused_matmul_reduce_scatter)", __FILE__, __LINE__);
    return TP_OK;
}

static tp_status rs_steps(cu_ctx *x, const tp_attrs *at, const rs_plan *p, const tp_tensor *out, tp_err *err)
{
    for (int step = 0; step < x->world; step++) {
        tp_tensor slot;
        TP_TRY(rs_gemm(x, at, p, tp_rs_dst(x->rank, x->world, step), out, &slot, err));
        if (step < x->world - 1)
            TP_TRY(rs_exchange(x, p, step, &slot, err));
    }
    return TP_OK;
}

static tp_status rs_prepare(cu_ctx *x, const tp_attrs *at, const tp_tensor *ins, const tp_tensor *out, rs_plan *p,
                            tp_err *err)
{
    int d = x->world, s = at->dim, nd = out->ndim;
    memset(p, 0, sizeof *p);
    p->w = &ins[1];
    p->ws = &ins[2];
    p->chunk = tp_tensor_numel(out);
    if (s < 0 || s >= nd || cu_nccl_type(out->dtype, &p->t) != 0)
        return tp_fail(err, TP_INVALID, "fused_matmul_reduce_scatter: dim %d, dtype %s", s, tp_dtype_name(out->dtype));
    if (p->ws->dtype != out->dtype || !tp_tensor_is_contiguous(p->ws) || tp_tensor_numel(p->ws) < d * p->chunk)
        return tp_fail(err, TP_INTERNAL, "fused_matmul_reduce_scatter: workspace holds %lld elements, needs %lld",
                       (long long)tp_tensor_numel(p->ws), (long long)(d * p->chunk));
    p->a = ins[0];
    if (at->n_shape > 0) { /* a re-viewed in the product's coordinates */
        int64_t ashape[TP_MAX_DIMS];
        memcpy(ashape, out->shape, sizeof ashape);
        ashape[s] *= d;
        ashape[nd - 1] = ins[0].shape[ins[0].ndim - 1];
        if (!tp_tensor_is_contiguous(&ins[0]))
            return tp_fail(err, TP_INTERNAL, "fused_matmul_reduce_scatter: re-viewed input must be contiguous");
        p->a = tp_tensor_make(ins[0].data, ins[0].dtype, nd, ashape);
    }
    if (d > 1)
        TP_TRY(cu_scratch_take(x, (size_t)(d - 1) * cu_nbytes(out), (void **)&p->stage, err));
    return TP_OK;
}

static tp_status mm_rs(cu_ctx *x, const tp_attrs *at, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    rs_plan p;
    TP_TRY(rs_prepare(x, at, ins, out, &p, err));
    cu_note_signature(x, "fused_matmul_reduce_scatter", fused_sig(TP_OP_FUSED_MM_RS, &ins[0], out), p.chunk);
    TP_TRY(fork_side(x, err));
    TP_TRY(rejoin(x, rs_steps(x, at, &p, out, err), err));
    const char *own = (const char *)p.ws->data + x->rank * p.chunk * (int64_t)tp_dtype_size(out->dtype);
    KERNEL_TRY(x, err, tp_cuda_reduce_chunks(own, p.stage, out->data, p.chunk, x->rank, x->world, (int)at->reduce,
                                             out->dtype, x->compute));
    return TP_OK;
}

tp_status cu_fused(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                   tp_err *err)
{
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: %s output must be contiguous", x->rank, tp_op_name(op));
    for (int i = 0; i < n_ins; i++)
        if (ins[i].dtype != out->dtype)
            return tp_fail(err, TP_INVALID, "%s: input %d is %s, output %s", tp_op_name(op), i,
                           tp_dtype_name(ins[i].dtype), tp_dtype_name(out->dtype));
    if (op == TP_OP_FUSED_AG_MM && n_ins >= 2)
        return ag_mm(x, a, ins, n_ins, out, err);
    if (op == TP_OP_FUSED_MM_RS && n_ins == 3)
        return mm_rs(x, a, ins, out, err);
    return tp_fail(err, TP_INTERNAL, "cuda backend: '%s' with %d inputs is not a fused op it runs", tp_op_name(op),
                   n_ins);
}
