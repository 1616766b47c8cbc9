/* cuda_collectives.c — collectives of the cuda backend: NCCL on the
 * compute stream for every algo but one_shot, which is the peer-reading
 * kernel of comm_kernels.cu.
 *
 * NCCL moves contiguous rank-major blocks. A collective along a dim that is
 * not the leading one goes through a block pack/unpack kernel and a scratch
 * buffer (tp_block_* in tp_cuda_plan.h); along the leading dim (or with
 * only size-1 dims before it) the natural and block orders coincide and
 * NCCL reads and writes the tensors directly.
 *
 * Reductions: float sum/max use NCCL's own (ncclSum, ncclMax), float avg
 * ncclAvg; integer avg is an ncclSum followed by a truncating division
 * (tp_cuda_finish_avg), the cpu backend's semantics. NCCL sums in its own
 * order, so float results match the cpu backend up to rounding; the
 * one-shot kernel sums in rank order exactly like the cpu does. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "grow.h"
#include "log.h"

int cu_nccl_type(tp_dtype t, ncclDataType_t *out)
{
    switch (t) {
    case TP_F32: *out = ncclFloat32; return 0;
    case TP_F16: *out = ncclFloat16; return 0;
    case TP_BF16: *out = ncclBfloat16; return 0;
    case TP_I32: *out = ncclInt32; return 0;
    case TP_I64: *out = ncclInt64; return 0;
    default: return -1;
    }
}

/* ------------------------------------------------------------ signatures */

static uint64_t fnv(uint64_t h, int64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (uint64_t)(v >> (8 * i)) & 0xffu;
        h *= 1099511628211ull;
    }
    return h;
}

/* What every rank must agree on for one collective call. */
static uint64_t signature(tp_op op, const tp_attrs *a, const tp_tensor *in, const tp_tensor *out)
{
    uint64_t h = 1469598103934665603ull;
    int64_t v[] = {op, a->algo, in->dtype, tp_tensor_numel(in), tp_tensor_numel(out), a->dim, a->reduce,
                   a->split_dim, a->concat_dim, a->src};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        h = fnv(h, v[i]);
    return h;
}

void cu_note_signature(cu_ctx *x, const char *what, uint64_t sig, int64_t count)
{
    for (int i = 0; i < x->n_warm; i++)
        if (x->warm[i] == sig)
            return;
    if (x->capturing)
        TP_LOG_W("cuda rank %d: %s of %lld elements is captured without having run eagerly first; NCCL may set up "
                 "its connections inside the capture (exec should run each partition once before capturing it)",
                 x->rank, what, (long long)count);
    if (TP_GROW(x->warm, x->cap_warm, x->n_warm, 32) == 0) /* else only a diagnostic is lost */
        x->warm[x->n_warm++] = sig;
}

/* cuda_check_collectives: every rank must be issuing the same call
 * (a mismatch would otherwise hang in NCCL or mix unrelated buffers). */
static tp_status check_same(cu_ctx *x, const char *what, uint64_t sig, tp_err *err)
{
    if (!x->check_collectives || x->capturing)
        return TP_OK;
    int64_t mn = 0, mx = 0;
    TP_TRY(cu_agree_i64(x, (int64_t)(sig >> 1), &mn, &mx, err));
    if (mn != mx)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: collective mismatch: ranks issue different calls at this %s",
                       x->rank, what);
    return TP_OK;
}

/* ------------------------------------------------------------ validation */

static tp_status bad_dim(const char *name, const char *what, int dim, const tp_tensor *in, int d, tp_err *err)
{
    char b[96];
    if (dim < 0 || dim >= in->ndim)
        return tp_fail(err, TP_INVALID, "%s: %s %d out of range for input of shape %s", name, what, dim,
                       tp_shape_str(b, sizeof b, in->ndim, in->shape));
    if (d > 0 && in->shape[dim] % d != 0)
        return tp_fail(err, TP_INVALID, "%s: %s %d of input shape %s has size %lld, not divisible by world size %d",
                       name, what, dim, tp_shape_str(b, sizeof b, in->ndim, in->shape), (long long)in->shape[dim], d);
    return TP_OK;
}

/* out's expected shape (the cpu backend's rules) into exp. */
static tp_status expected_out(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, tp_tensor *exp,
                              tp_err *err)
{
    const char *name = tp_op_name(op);
    int d = x->world;
    *exp = *in;
    switch (op) {
    case TP_OP_ALL_GATHER:
        TP_TRY(bad_dim(name, "dim", a->dim, in, 0, err));
        exp->shape[a->dim] *= d;
        return TP_OK;
    case TP_OP_REDUCE_SCATTER:
        TP_TRY(bad_dim(name, "dim", a->dim, in, d, err));
        if (a->reduce != TP_REDUCE_SUM && a->reduce != TP_REDUCE_AVG)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum or avg)", name, (int)a->reduce);
        exp->shape[a->dim] /= d;
        return TP_OK;
    case TP_OP_ALL_REDUCE:
        if (a->reduce != TP_REDUCE_SUM && a->reduce != TP_REDUCE_AVG && a->reduce != TP_REDUCE_MAX)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum, avg or max)", name, (int)a->reduce);
        return TP_OK;
    case TP_OP_ALL_TO_ALL:
        TP_TRY(bad_dim(name, "split_dim", a->split_dim, in, d, err));
        TP_TRY(bad_dim(name, "concat_dim", a->concat_dim, in, 0, err));
        exp->shape[a->split_dim] /= d;
        exp->shape[a->concat_dim] *= d;
        return TP_OK;
    case TP_OP_BROADCAST:
        if (a->src < 0 || a->src >= d)
            return tp_fail(err, TP_INVALID, "broadcast: src %d out of range for world size %d", a->src, d);
        return TP_OK;
    default:
        return tp_fail(err, TP_INTERNAL, "cuda backend: op '%s' is not a collective", name);
    }
}

static tp_status validate(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, const tp_tensor *out,
                          ncclDataType_t *type, tp_err *err)
{
    char b1[96], b2[96];
    tp_tensor exp;
    TP_TRY(expected_out(x, op, a, in, &exp, err));
    if (out->dtype != in->dtype || cu_nccl_type(in->dtype, type) != 0)
        return tp_fail(err, TP_INVALID, "%s: output dtype %s differs from input dtype %s", tp_op_name(op),
                       tp_dtype_name(out->dtype), tp_dtype_name(in->dtype));
    int ok = out->ndim == exp.ndim;
    for (int i = 0; ok && i < exp.ndim; i++)
        ok = out->shape[i] == exp.shape[i];
    if (!ok)
        return tp_fail(err, TP_INVALID, "%s over %d ranks: output shape %s, expected %s", tp_op_name(op), x->world,
                       tp_shape_str(b1, sizeof b1, out->ndim, out->shape),
                       tp_shape_str(b2, sizeof b2, exp.ndim, exp.shape));
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: %s output must be contiguous", x->rank, tp_op_name(op));
    return TP_OK;
}

/* ------------------------------------------------------------ collectives */

static int es_of(const tp_tensor *t) { return (int)tp_dtype_size(t->dtype); }

static tp_status all_gather(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, ncclDataType_t t,
                            tp_err *err)
{
    tp_tensor src;
    TP_TRY(cu_contiguous(x, in, &src, x->compute, err));
    int64_t outer, len, inner;
    tp_block_dims(out->ndim, out->shape, a->dim, x->world, &outer, &len, &inner);
    size_t count = (size_t)tp_tensor_numel(&src);
    if (tp_block_is_identity(outer, x->world)) {
        NCCL_TRY(x, err, ncclAllGather(src.data, out->data, count, t, x->comm, x->compute));
        return TP_OK;
    }
    void *g;
    TP_TRY(cu_scratch_take(x, cu_nbytes(out), &g, err));
    NCCL_TRY(x, err, ncclAllGather(src.data, g, count, t, x->comm, x->compute));
    KERNEL_TRY(x, err, tp_cuda_block_pack(g, out->data, outer, len, inner, x->world, es_of(out), 0, x->compute));
    return TP_OK;
}

/* NCCL's reduction for ours; integer avg is a sum finished by us. */
static ncclRedOp_t nccl_op(tp_reduce r, tp_dtype dt, int *finish_avg)
{
    *finish_avg = r == TP_REDUCE_AVG && !tp_dtype_is_float(dt);
    if (r == TP_REDUCE_MAX)
        return ncclMax;
    return r == TP_REDUCE_AVG && tp_dtype_is_float(dt) ? ncclAvg : ncclSum;
}

static tp_status reduce_scatter(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, ncclDataType_t t,
                                tp_err *err)
{
    tp_tensor src;
    TP_TRY(cu_contiguous(x, in, &src, x->compute, err));
    int64_t outer, len, inner;
    tp_block_dims(src.ndim, src.shape, a->dim, x->world, &outer, &len, &inner);
    const void *send = src.data;
    if (!tp_block_is_identity(outer, x->world)) {
        void *packed;
        TP_TRY(cu_scratch_take(x, cu_nbytes(&src), &packed, err));
        KERNEL_TRY(x, err, tp_cuda_block_pack(src.data, packed, outer, len, inner, x->world, es_of(&src), 1,
                                              x->compute));
        send = packed;
    }
    int finish;
    ncclRedOp_t op = nccl_op(a->reduce, out->dtype, &finish);
    size_t count = (size_t)tp_tensor_numel(out);
    NCCL_TRY(x, err, ncclReduceScatter(send, out->data, count, t, op, x->comm, x->compute));
    if (finish)
        KERNEL_TRY(x, err, tp_cuda_finish_avg(out->data, (int64_t)count, x->world, out->dtype, x->compute));
    return TP_OK;
}

/* Whether the one-shot kernel may run: peer-mapped control block, in
 * inside one peer-mapped symmetric allocation, out not overlapping in. */
static const cu_alloc *oneshot_alloc(cu_ctx *x, const tp_tensor *in, const tp_tensor *out)
{
    if (!x->sync_ok || !tp_tensor_is_contiguous(in))
        return NULL;
    const cu_alloc *al = cu_find_alloc(x, in->data);
    if (!al || !al->peer_mapped)
        return NULL;
    const char *i0 = in->data, *i1 = i0 + cu_nbytes(in), *o0 = out->data, *o1 = o0 + cu_nbytes(out);
    return o1 <= i0 || o0 >= i1 ? al : NULL;
}

static tp_status one_shot(cu_ctx *x, const tp_attrs *a, const cu_alloc *al, const tp_tensor *in, tp_tensor *out,
                          tp_err *err)
{
    tp_cuda_peers peers;
    memset(&peers, 0, sizeof peers);
    size_t off = (size_t)((const char *)in->data - al->base); /* identical on every rank: the symmetric contract */
    for (int p = 0; p < x->world; p++)
        peers.p[p] = al->peer[p] + off;
    KERNEL_TRY(x, err, tp_cuda_oneshot_all_reduce(&x->sync, &peers, out->data, tp_tensor_numel(out), out->dtype,
                                                  (int)a->reduce, x->compute));
    return TP_OK;
}

static tp_status all_reduce(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, ncclDataType_t t,
                            tp_err *err)
{
    if (a->algo == TP_ALGO_ONE_SHOT) {
        const cu_alloc *al = oneshot_alloc(x, in, out);
        if (al)
            return one_shot(x, a, al, in, out, err);
        if (!x->oneshot_fallback_logged++)
            TP_LOG_W("cuda rank %d: one_shot all_reduce runs on NCCL (input not in peer-mapped symmetric memory, "
                     "in place, or peers not mapped)",
                     x->rank);
    }
    tp_tensor src;
    TP_TRY(cu_contiguous(x, in, &src, x->compute, err));
    int finish;
    ncclRedOp_t op = nccl_op(a->reduce, out->dtype, &finish);
    size_t count = (size_t)tp_tensor_numel(out);
    NCCL_TRY(x, err, ncclAllReduce(src.data, out->data, count, t, op, x->comm, x->compute));
    if (finish)
        KERNEL_TRY(x, err, tp_cuda_finish_avg(out->data, (int64_t)count, x->world, out->dtype, x->compute));
    return TP_OK;
}

static tp_status broadcast(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, ncclDataType_t t,
                           tp_err *err)
{
    const void *send = out->data; /* ignored off the root */
    if (x->rank == a->src) {
        tp_tensor src;
        TP_TRY(cu_contiguous(x, in, &src, x->compute, err));
        send = src.data;
    }
    size_t count = (size_t)tp_tensor_numel(out);
    NCCL_TRY(x, err, ncclBroadcast(send, out->data, count, t, a->src, x->comm, x->compute));
    return TP_OK;
}

/* One grouped send and receive per peer; a failure inside the group still
 * closes it (an open group would swallow every later NCCL call). */
static tp_status exchange_blocks(cu_ctx *x, const char *send, char *recv, size_t blk, int es, ncclDataType_t t,
                                 tp_err *err)
{
    NCCL_TRY(x, err, ncclGroupStart());
    ncclResult_t r = ncclSuccess;
    for (int p = 0; p < x->world && r == ncclSuccess; p++) {
        r = ncclSend(send + (size_t)p * blk * (size_t)es, blk, t, p, x->comm, x->compute);
        if (r == ncclSuccess)
            r = ncclRecv(recv + (size_t)p * blk * (size_t)es, blk, t, p, x->comm, x->compute);
    }
    ncclResult_t r2 = ncclGroupEnd();
    if (r != ncclSuccess)
        return cu_fail_nccl(x, err, r, "ncclSend/ncclRecv (all_to_all)", __FILE__, __LINE__);
    if (r2 != ncclSuccess)
        return cu_fail_nccl(x, err, r2, "ncclGroupEnd() (all_to_all)", __FILE__, __LINE__);
    return TP_OK;
}

static tp_status all_to_all(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, ncclDataType_t t,
                            tp_err *err)
{
    tp_tensor src;
    TP_TRY(cu_contiguous(x, in, &src, x->compute, err));
    int d = x->world, es = es_of(out);
    int64_t so, sl, si, co, cl, ci;
    tp_block_dims(src.ndim, src.shape, a->split_dim, d, &so, &sl, &si);
    tp_block_dims(out->ndim, out->shape, a->concat_dim, d, &co, &cl, &ci);
    char *send = src.data, *recv = out->data;
    if (!tp_block_is_identity(so, d)) {
        TP_TRY(cu_scratch_take(x, cu_nbytes(&src), (void **)&send, err));
        KERNEL_TRY(x, err, tp_cuda_block_pack(src.data, send, so, sl, si, d, es, 1, x->compute));
    }
    if (!tp_block_is_identity(co, d))
        TP_TRY(cu_scratch_take(x, cu_nbytes(out), (void **)&recv, err));
    TP_TRY(exchange_blocks(x, send, recv, (size_t)(tp_tensor_numel(&src) / d), es, t, err));
    if (recv != out->data)
        KERNEL_TRY(x, err, tp_cuda_block_pack(recv, out->data, co, cl, ci, d, es, 0, x->compute));
    return TP_OK;
}

tp_status cu_collective(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    ncclDataType_t t;
    TP_TRY(validate(x, op, a, in, out, &t, err));
    uint64_t sig = signature(op, a, in, out);
    TP_TRY(check_same(x, tp_op_name(op), sig, err));
    cu_note_signature(x, tp_op_name(op), sig, tp_tensor_numel(out));
    switch (op) {
    case TP_OP_ALL_GATHER: return all_gather(x, a, in, out, t, err);
    case TP_OP_REDUCE_SCATTER: return reduce_scatter(x, a, in, out, t, err);
    case TP_OP_ALL_REDUCE: return all_reduce(x, a, in, out, t, err);
    case TP_OP_BROADCAST: return broadcast(x, a, in, out, t, err);
    case TP_OP_ALL_TO_ALL: return all_to_all(x, a, in, out, t, err);
    default: return tp_fail(err, TP_INTERNAL, "cuda backend: op '%s' is not a collective", tp_op_name(op));
    }
}

/* --------------------------------------------------------------- warm-up */

static tp_status warm_ops(cu_ctx *x, char *buf, tp_err *err)
{
    size_t n = 4, d = (size_t)x->world; /* buf: 2 * d * n floats */
    char *big = buf + d * n * sizeof(float);
    NCCL_TRY(x, err, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, x->comm, x->compute));
    NCCL_TRY(x, err, ncclAllGather(buf, big, n, ncclFloat32, x->comm, x->compute));
    NCCL_TRY(x, err, ncclReduceScatter(big, buf, n, ncclFloat32, ncclSum, x->comm, x->compute));
    NCCL_TRY(x, err, ncclBroadcast(buf, buf, n, ncclFloat32, 0, x->comm, x->compute));
    /* NCCL's guide: capturing send/recv with no earlier send/recv can fail */
    return exchange_blocks(x, big, buf, n, (int)sizeof(float), ncclFloat32, err);
}

/* Runs each collective kind once on tiny buffers, and one round of the
 * cross-rank barrier when peers are mapped (it proves the flags work, or
 * times out here instead of inside a request). */
tp_status cu_warm_up(cu_ctx *x, tp_err *err)
{
    char *buf = NULL;
    size_t bytes = 2 * (size_t)x->world * 4 * sizeof(float);
    CU_TRY(x, err, cudaMalloc((void **)&buf, bytes));
    tp_status st = TP_OK;
    cudaError_t e = cudaMemsetAsync(buf, 0, bytes, x->compute);
    if (e != cudaSuccess)
        st = cu_fail_cuda(x, err, (int)e, "cudaMemsetAsync(warm-up buffer)", __FILE__, __LINE__);
    if (st == TP_OK)
        st = warm_ops(x, buf, err);
    if (st == TP_OK && x->sync_ok) {
        int k = tp_cuda_barrier(&x->sync, TP_CUDA_SLOT_FUSED_IN, x->compute);
        if (k != 0)
            st = cu_fail_cuda(x, err, k, "tp_cuda_barrier(warm-up)", __FILE__, __LINE__);
    }
    tp_err werr;
    tp_status ws = cu_wait(x, x->compute, "compute stream (warm-up)", &werr);
    if (st == TP_OK && ws != TP_OK)
        st = tp_fail(err, ws, "%s", werr.msg);
    /* cudaFree waits for the device: not once the backend died (its work
     * may never end, A13); the buffer is left to the process's exit */
    if (ws == TP_OK)
        cu_warn_cuda(x, cudaFree(buf), "cudaFree(warm-up buffer)");
    if (st == TP_OK) /* the collectives ran: did NCCL complete them? */
        st = cu_check_comm(x, "the warm-up's collectives", err);
    if (st == TP_OK) {
        tp_cuda_error w;
        e = cudaMemcpy(&w, x->errw, sizeof w, cudaMemcpyDeviceToHost);
        if (e != cudaSuccess)
            return cu_fail_cuda(x, err, (int)e, "cudaMemcpy(error word)", __FILE__, __LINE__);
        if (w.code != TP_CUDA_ERR_NONE)
            return tp_fail(err, TP_BACKEND, "cuda rank %d: the warm-up barrier %s rank %d", x->rank,
                           w.code == TP_CUDA_ERR_ABORTED ? "was aborted waiting for" : "timed out waiting for", w.a);
    }
    return st;
}
