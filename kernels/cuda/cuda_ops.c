/* cuda_ops.c — the cuda backend's compute and copy ops: validation (the
 * cpu backend's messages) and the launch of the matching kernel on the
 * compute stream.
 *
 * The existing row kernels (tp_cuda_kernels.h) read contiguous input; a
 * strided input is first copied into the output (same shape, contiguous)
 * and the kernel runs in place there, so no scratch is needed. */
#include <math.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "common/tp_checks.h"
#include "common/tp_generate.h"

tp_status cu_copy_tensor(cu_ctx *x, tp_tensor *dst, const tp_tensor *src, cudaStream_t s, tp_err *err)
{
    char s1[96], s2[96];
    if (dst->dtype != src->dtype || !tp_tensor_same_shape(dst, src))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: copy of %s %s into %s %s", x->rank, tp_dtype_name(src->dtype),
                       tp_shape_str(s1, sizeof s1, src->ndim, src->shape), tp_dtype_name(dst->dtype),
                       tp_shape_str(s2, sizeof s2, dst->ndim, dst->shape));
    size_t bytes = cu_nbytes(src);
    if (bytes == 0 || (dst->data == src->data && !memcmp(dst->stride, src->stride, sizeof dst->stride)))
        return TP_OK;
    if (tp_tensor_is_contiguous(dst) && tp_tensor_is_contiguous(src)) {
        CU_TRY(x, err, cudaMemcpyAsync(dst->data, src->data, bytes, cudaMemcpyDeviceToDevice, s));
        return TP_OK;
    }
    const int64_t *st[2] = {dst->stride, src->stride};
    tp_layout l;
    tp_layout_init(&l, dst->ndim, dst->shape, 2, st);
    KERNEL_TRY(x, err, tp_cuda_copy_strided(dst->data, src->data, &l, (int)tp_dtype_size(src->dtype), s));
    return TP_OK;
}

tp_status cu_contiguous(cu_ctx *x, const tp_tensor *t, tp_tensor *out, cudaStream_t s, tp_err *err)
{
    tp_tensor src = *t; /* out may be t */
    if (tp_tensor_is_contiguous(&src)) {
        *out = src;
        return TP_OK;
    }
    void *p;
    TP_TRY(cu_scratch_take(x, cu_nbytes(&src), &p, err));
    tp_tensor c = tp_tensor_make(p, src.dtype, src.ndim, src.shape);
    TP_TRY(cu_copy_tensor(x, &c, &src, s, err));
    *out = c;
    return TP_OK;
}

/* x's values, contiguous, in out (a no-op when x already is out). */
static tp_status into_out(cu_ctx *x, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    tp_tensor dst = tp_tensor_make(out->data, out->dtype, in->ndim, in->shape);
    return cu_copy_tensor(x, &dst, in, x->compute, err);
}

static tp_status check_float_same(const char *what, const tp_tensor *in, const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if (in->dtype != out->dtype || !tp_dtype_is_float(in->dtype))
        return tp_fail(err, TP_INVALID, "%s: needs a float input of the output dtype, got %s -> %s", what,
                       tp_dtype_name(in->dtype), tp_dtype_name(out->dtype));
    if (!tp_tensor_same_shape(in, out))
        return tp_fail(err, TP_INVALID, "%s: input shape %s does not match output %s", what,
                       tp_shape_str(s1, sizeof s1, in->ndim, in->shape),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    return TP_OK;
}

/* ------------------------------------------------------------ elementwise */

static tp_status binary(cu_ctx *x, tp_op op, const tp_tensor *a, const tp_tensor *b, tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96];
    if (a->dtype != out->dtype || b->dtype != out->dtype)
        return tp_fail(err, TP_INVALID, "%s: input dtypes %s and %s (output %s) differ", tp_op_name(op),
                       tp_dtype_name(a->dtype), tp_dtype_name(b->dtype), tp_dtype_name(out->dtype));
    int64_t sa[TP_MAX_DIMS], sb[TP_MAX_DIMS];
    if (tp_broadcast_strides(a, out->ndim, out->shape, sa) || tp_broadcast_strides(b, out->ndim, out->shape, sb))
        return tp_fail(err, TP_INVALID, "%s: shapes %s and %s do not broadcast to %s", tp_op_name(op),
                       tp_shape_str(s1, sizeof s1, a->ndim, a->shape), tp_shape_str(s2, sizeof s2, b->ndim, b->shape),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[3] = {sa, sb, out->stride};
    tp_layout l;
    tp_layout_init(&l, out->ndim, out->shape, 3, st);
    if (op == TP_OP_DIV && !tp_dtype_is_float(out->dtype))
        return tp_fail(err, TP_INVALID, "div: needs floating-point inputs, got %s", tp_dtype_name(out->dtype));
    int code = op == TP_OP_ADD ? 0 : op == TP_OP_SUB ? 1 : op == TP_OP_MUL ? 2 : 3;
    KERNEL_TRY(x, err, tp_cuda_binary(code, a->data, b->data, out->data, &l, out->dtype, x->compute));
    return TP_OK;
}

static tp_status unary(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    TP_TRY(check_float_same(tp_op_name(op), in, out, err));
    int64_t n = tp_tensor_numel(out);
    if (n == 0)
        return TP_OK;
    const void *src = in->data;
    if (!tp_tensor_is_contiguous(in)) {
        TP_TRY(into_out(x, in, out, err));
        src = out->data;
    }
    tp_unary_fn fn;
    float p;
    if (tp_unary_fn_of(op, a, &fn, &p) != 0)
        return tp_fail(err, TP_INTERNAL, "%s: not a unary op", tp_op_name(op));
    KERNEL_TRY(x, err, tp_cuda_unary(fn, src, out->data, n, out->dtype, p, x->compute));
    return TP_OK;
}

/* --------------------------------------------------------------- rows */

static tp_status softmax(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    TP_TRY(check_float_same("softmax", in, out, err));
    int d = in->ndim == 0 ? 0 : a ? a->dim : in->ndim - 1;
    if (in->ndim > 0 && (d < 0 || d >= in->ndim))
        return tp_fail(err, TP_INVALID, "softmax: dim %d out of range for %d dims", d, in->ndim);
    if (tp_tensor_numel(in) == 0)
        return TP_OK;
    int64_t outer = 1, inner = 1, n = in->ndim ? in->shape[d] : 1;
    for (int i = 0; i < d; i++)
        outer *= in->shape[i];
    for (int i = d + 1; i < in->ndim; i++)
        inner *= in->shape[i];
    const void *src = in->data;
    if (!tp_tensor_is_contiguous(in)) {
        TP_TRY(into_out(x, in, out, err));
        src = out->data;
    }
    KERNEL_TRY(x, err, tp_cuda_softmax(src, out->data, outer, n, inner, out->dtype, x->compute));
    return TP_OK;
}

/* The row kernels take weight and bias as contiguous [n] of x's dtype. */
static tp_status norm_param(const char *what, const char *name, const tp_tensor *t, const tp_tensor *xin, int64_t n,
                            tp_err *err)
{
    char s1[96];
    if (t->dtype != xin->dtype || tp_tensor_numel(t) != n || !tp_tensor_is_contiguous(t))
        return tp_fail(err, TP_INVALID,
                       "%s: %s must be a contiguous %s tensor of %lld elements on the cuda backend, got %s %s", what,
                       name, tp_dtype_name(xin->dtype), (long long)n, tp_dtype_name(t->dtype),
                       tp_shape_str(s1, sizeof s1, t->ndim, t->shape));
    return TP_OK;
}

/* layer_norm and rms_norm, already of the kernel signature (cu_kernel, below). */
static tp_status k_norm(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                        tp_err *err)
{
    int is_ln = op == TP_OP_LAYER_NORM;
    const char *what = tp_op_name(op);
    const tp_tensor *in = &ins[0];
    TP_TRY(check_float_same(what, in, out, err));
    if (in->ndim == 0)
        return tp_fail(err, TP_INVALID, "%s: input must have at least one dim", what);
    int64_t n = in->shape[in->ndim - 1];
    const tp_tensor *w = n_ins > 1 ? &ins[1] : NULL, *b = is_ln && n_ins > 2 ? &ins[2] : NULL;
    if (w)
        TP_TRY(norm_param(what, "weight", w, in, n, err));
    if (b)
        TP_TRY(norm_param(what, "bias", b, in, n, err));
    int64_t total = tp_tensor_numel(in);
    if (total == 0)
        return TP_OK;
    const void *src = in->data;
    if (!tp_tensor_is_contiguous(in)) {
        TP_TRY(into_out(x, in, out, err));
        src = out->data;
    }
    float eps = a ? a->eps : (is_ln ? 1e-5f : 1e-6f);
    int64_t rows = total / n;
    KERNEL_TRY(x, err, is_ln ? tp_cuda_layer_norm(src, w ? w->data : NULL, b ? b->data : NULL, out->data, rows, n,
                                                  eps, out->dtype, x->compute)
                             : tp_cuda_rms_norm(src, w ? w->data : NULL, out->data, rows, n, eps, out->dtype,
                                                x->compute));
    return TP_OK;
}

/* ------------------------------------------------------------ attention */

static tp_status attention(cu_ctx *x, const tp_attrs *at, const tp_tensor *q, const tp_tensor *k,
                           const tp_tensor *v, const tp_tensor *mask, tp_tensor *out, tp_err *err)
{
    tp_status st = tp_check_attention(q, k, v, mask, out, err);
    if (st != TP_OK)
        return st;
    if (v->shape[3] > TP_CUDA_ATTN_MAX_DV)
        return tp_fail(err, TP_INVALID, "attention: value head dim %lld exceeds the cuda kernel's %d",
                       (long long)v->shape[3], TP_CUDA_ATTN_MAX_DV);
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: attention output must be contiguous", x->rank);
    tp_cuda_attn_args a = {
        .q = q->data, .k = k->data, .v = v->data, .out = out->data,
        .B = q->shape[0], .H = q->shape[1], .Hkv = k->shape[1], .S = q->shape[2], .T = k->shape[2],
        .D = q->shape[3], .Dv = v->shape[3],
        .scale = at && at->has_scale ? at->scale : 1.0f / sqrtf((float)q->shape[3]),
        .causal = at ? at->causal : 0,
        .mask = mask ? mask->data : NULL,
        .mask_dtype = mask ? mask->dtype : TP_I64,
        .ms = {mask ? mask->stride[0] : 0, mask ? mask->stride[1] : 0},
        .dtype = out->dtype,
    };
    memcpy(a.qs, q->stride, sizeof a.qs);
    memcpy(a.ks, k->stride, sizeof a.ks);
    memcpy(a.vs, v->stride, sizeof a.vs);
    KERNEL_TRY(x, err, tp_cuda_attention(&a, x->compute));
    return TP_OK;
}

/* ------------------------------------------------------------ embedding */

static tp_status embedding(cu_ctx *x, const tp_attrs *at, const tp_tensor *ids, const tp_tensor *table,
                           tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96];
    if (ids->dtype != TP_I32 && ids->dtype != TP_I64)
        return tp_fail(err, TP_INVALID, "embedding: ids must be INT32 or INT64, got %s", tp_dtype_name(ids->dtype));
    if (table->dtype != out->dtype)
        return tp_fail(err, TP_INVALID, "embedding: table dtype %s differs from output %s",
                       tp_dtype_name(table->dtype), tp_dtype_name(out->dtype));
    int ok = table->ndim == 2 && out->ndim == ids->ndim + 1 && out->shape[ids->ndim] == table->shape[1] &&
             tp_tensor_is_contiguous(out);
    for (int i = 0; ok && i < ids->ndim; i++)
        ok = out->shape[i] == ids->shape[i];
    if (!ok)
        return tp_fail(err, TP_INVALID, "embedding: ids %s and table %s do not give (contiguous) output %s",
                       tp_shape_str(s1, sizeof s1, ids->ndim, ids->shape),
                       tp_shape_str(s2, sizeof s2, table->ndim, table->shape),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    int vp = at ? at->vocab_parallel : 0;
    int64_t V = table->shape[0];
    const int64_t *st[1] = {ids->stride};
    tp_cuda_embedding_args a = {
        .ids = ids->data, .id_dtype = ids->dtype, .table = table->data,
        .ts0 = table->stride[0], .ts1 = table->stride[1], .V = V, .E = table->shape[1],
        .lo = vp ? (int64_t)x->rank * V : 0, .total = vp ? (int64_t)x->world * V : V,
        .out = out->data, .es = (int)tp_dtype_size(out->dtype), .err = x->errw,
    };
    tp_layout_init(&a.ids_l, ids->ndim, ids->shape, 1, st);
    KERNEL_TRY(x, err, tp_cuda_embedding(&a, x->compute));
    return TP_OK;
}

/* ----------------------------------------------------------- generation */

/* The shapes were checked at load (shapes.c); what the launcher needs
 * besides is checked here: contiguous caches (states) and output. Slots
 * and positions are only known on the device (TP_CUDA_ERR_KV_ROW). */
static tp_status kv_attention(cu_ctx *x, const tp_attrs *at, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    const tp_tensor *q = &ins[0], *k = &ins[1], *v = &ins[2], *kc = &ins[3], *vc = &ins[4];
    if (!tp_tensor_is_contiguous(kc) || !tp_tensor_is_contiguous(vc) || q->ndim != 4 || kc->ndim != 4)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: kv_attention needs 4-d q and contiguous caches", x->rank);
    if (q->shape[3] > TP_CUDA_ATTN_MAX_DV)
        return tp_fail(err, TP_INVALID, "kv_attention: head dim %lld exceeds the cuda kernel's %d",
                       (long long)q->shape[3], TP_CUDA_ATTN_MAX_DV);
    tp_cuda_kv_args a = {
        .q = q->data, .k = k->data, .v = v->data, .k_cache = kc->data, .v_cache = vc->data,
        .slot = ins[5].data, .pos = ins[6].data, .slot_dtype = ins[5].dtype, .pos_dtype = ins[6].dtype,
        .ss = ins[5].stride[0], .ps = ins[6].stride[0], .out = out->data,
        .B = q->shape[0], .H = q->shape[1], .Hkv = k->shape[1], .T = q->shape[2], .D = q->shape[3],
        .S = kc->shape[0], .L = kc->shape[2],
        .scale = at && at->has_scale ? at->scale : 1.0f / sqrtf((float)q->shape[3]),
        .dtype = out->dtype, .err = x->errw,
    };
    memcpy(a.qs, q->stride, sizeof a.qs);
    memcpy(a.ks, k->stride, sizeof a.ks);
    memcpy(a.vs, v->stride, sizeof a.vs);
    KERNEL_TRY(x, err, tp_cuda_kv_attention(&a, x->compute));
    return TP_OK;
}

/* argmax over the last dim into packed keys (vocab_parallel: this rank's
 * columns start at rank * n), or argmax_index (keys -> ids). */
static tp_status argmax(cu_ctx *x, tp_op op, const tp_attrs *at, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    int ok = out->dtype == TP_I64 && (op == TP_OP_ARGMAX ? tp_dtype_is_float(in->dtype) && in->ndim >= 1 &&
                                                               out->ndim == in->ndim - 1
                                                         : in->dtype == TP_I64 && out->ndim == in->ndim);
    if (!ok)
        return tp_fail(err, TP_INVALID, "%s: %s input of %d dims cannot give INT64 output of %d dims",
                       tp_op_name(op), tp_dtype_name(in->dtype), in->ndim, out->ndim);
    if (op == TP_OP_ARGMAX_INDEX) {
        const int64_t *st[2] = {in->stride, out->stride};
        tp_layout l;
        tp_layout_init(&l, in->ndim, in->shape, 2, st);
        KERNEL_TRY(x, err, tp_cuda_argmax_index(in->data, out->data, &l, x->compute));
        return TP_OK;
    }
    int64_t n = in->shape[in->ndim - 1];
    int vp = at && at->vocab_parallel;
    int64_t lo = vp ? (int64_t)x->rank * n : 0, total = vp ? (int64_t)x->world * n : n;
    if (total - 1 > (int64_t)TP_GEN_MAX_INDEX)
        return tp_fail(err, TP_INVALID, "argmax: %lld columns do not fit 32-bit indices", (long long)total);
    const int64_t *st[1] = {in->stride};
    tp_cuda_argmax_args a = {.x = in->data, .xs = in->stride[in->ndim - 1], .n = n, .lo = lo,
                             .limit = at && at->has_limit && at->limit < total ? at->limit : total,
                             .dtype = in->dtype, .out = out->data};
    tp_layout_init(&a.rows_l, in->ndim - 1, in->shape, 1, st);
    KERNEL_TRY(x, err, tp_cuda_argmax(&a, x->compute));
    return TP_OK;
}

/* matmul_rows. Inside a capture the mask's values are not known on the
 * host: the product of every row (one GEMM, as matmul), then the unwanted
 * rows zeroed on the device. Outside one (generation graphs mark the head
 * fallback, so it always runs eagerly) the mask is read back to the host,
 * after a wait for the compute stream, and each run of wanted rows is one
 * GEMM on that slice, each other run one memset: a step pays the head only
 * for the rows that want logits (tp_gen_row_run_end, as the cpu backend).
 * Either way unwanted rows are +0.0 and their inputs (NaN included) never
 * reach the output. */
static tp_status matmul_rows_all(cu_ctx *x, int tb, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    const tp_tensor *mask = &ins[2];
    int64_t rows = out->shape[0], n = tp_tensor_numel(out);
    TP_TRY(cu_matmul(x, &ins[0], &ins[1], tb, out, 0.0f, x->compute, err));
    KERNEL_TRY(x, err, tp_cuda_zero_rows(out->data, out->dtype, rows, rows > 0 ? n / rows : 0, mask->data,
                                         mask->dtype, mask->stride[0], x->compute));
    return TP_OK;
}

static tp_status matmul_rows_runs(cu_ctx *x, int tb, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    const tp_tensor *mask = &ins[2];
    int64_t B = out->shape[0], lo;
    size_t mes = tp_dtype_size(mask->dtype), oes = tp_dtype_size(out->dtype);
    int64_t span = tp_tensor_span(mask, &lo);
    char *host;
    TP_TRY(cu_pinned_take(x, (size_t)span, &host, err));
    CU_TRY(x, err, cudaMemcpyAsync(host, (const char *)mask->data + lo * (int64_t)mes, (size_t)span,
                                   cudaMemcpyDeviceToHost, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream (matmul_rows' mask)", err));
    const char *m = host - lo * (int64_t)mes;
    /* a strided x packed whole, as the captured path packs it: the scratch
     * this eager run grows is what a capture of the same op needs */
    tp_tensor xin;
    TP_TRY(cu_contiguous(x, &ins[0], &xin, x->compute, err));
    int64_t row = tp_tensor_numel(out) / B;
    for (int64_t r = 0, end; r < B; r = end) {
        end = tp_gen_row_run_end(m, mask->dtype, mask->stride[0], r, B);
        tp_tensor os = tp_tensor_narrow(out, 0, r, end - r);
        if (tp_gen_row_wanted(m, mask->dtype, mask->stride[0], r)) {
            tp_tensor xs = tp_tensor_narrow(&xin, 0, r, end - r);
            TP_TRY(cu_matmul(x, &xs, &ins[1], tb, &os, 0.0f, x->compute, err));
        } else {
            CU_TRY(x, err, cudaMemsetAsync(os.data, 0, (size_t)((end - r) * row) * oes, x->compute));
        }
    }
    return TP_OK;
}

static tp_status matmul_rows(cu_ctx *x, const tp_attrs *a, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    TP_TRY(tp_check_matmul_rows(&ins[0], &ins[1], &ins[2], out, err));
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: matmul_rows output must be contiguous", x->rank);
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    enum cudaStreamCaptureStatus cs;
    CU_TRY(x, err, cudaStreamIsCapturing(x->compute, &cs));
    int tb = a ? a->transpose_b : 0;
    return cs == cudaStreamCaptureStatusNone ? matmul_rows_runs(x, tb, ins, out, err)
                                             : matmul_rows_all(x, tb, ins, out, err);
}

/* ------------------------------------------ reduce, gather, where, expand, cast */

static tp_status reduce(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    TP_TRY(tp_check_reduce(op, a, in, out, err));
    tp_reduce_plan p;
    tp_reduce_plan_init(&p, in, a->dim);
    KERNEL_TRY(x, err, tp_cuda_reduce(in->data, out->data, &p, tp_tensor_numel(out), op == TP_OP_REDUCE_MEAN,
                                      out->dtype, x->compute));
    return TP_OK;
}

static tp_status gather(cu_ctx *x, const tp_attrs *a, const tp_tensor *in, const tp_tensor *ids, tp_tensor *out,
                        tp_err *err)
{
    TP_TRY(tp_check_gather(a, in, ids, out, err));
    int64_t n_out = tp_tensor_numel(out);
    if (n_out == 0)
        return TP_OK;
    tp_cuda_gather_args g = {.x = in->data, .ids = ids->data, .id_dtype = ids->dtype, .out = out->data,
                             .es = (int)tp_dtype_size(out->dtype), .err = x->errw};
    tp_gather_plan_init(&g.p, in, a ? a->dim : 0, ids);
    KERNEL_TRY(x, err, tp_cuda_gather(&g, n_out, x->compute));
    return TP_OK;
}

static tp_status where(cu_ctx *x, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    int64_t bs[3][TP_MAX_DIMS];
    TP_TRY(tp_check_where(ins, out, bs, err));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[4] = {bs[0], bs[1], bs[2], out->stride};
    tp_layout l;
    tp_layout_init(&l, out->ndim, out->shape, 4, st);
    KERNEL_TRY(x, err, tp_cuda_where(ins[0].data, ins[0].dtype, ins[1].data, ins[2].data, out->data, &l,
                                     (int)tp_dtype_size(out->dtype), x->compute));
    return TP_OK;
}

static tp_status rope(cu_ctx *x, const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    int64_t st[3][TP_MAX_DIMS], shape[TP_MAX_DIMS], rs[4][TP_MAX_DIMS];
    TP_TRY(tp_check_rope(ins, out, st, err));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    int nd = tp_rope_rows(out, (const int64_t(*)[TP_MAX_DIMS])st, shape, rs), last = out->ndim - 1;
    const int64_t *rows[4] = {rs[0], rs[1], rs[2], rs[3]};
    tp_cuda_rope_args a = {.x = ins[0].data, .cos = ins[1].data, .sin = ins[2].data, .out = out->data,
                           .D = out->shape[last], .xs = st[0][last], .cs = st[1][last], .ss = st[2][last],
                           .dtype = out->dtype};
    tp_layout_init(&a.rows, nd, shape, 4, rows);
    KERNEL_TRY(x, err, tp_cuda_rope(&a, x->compute));
    return TP_OK;
}

static tp_status expand(cu_ctx *x, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    tp_tensor src;
    TP_TRY(tp_expand_view(in, out, &src, err));
    return cu_copy_tensor(x, out, &src, x->compute, err);
}

static tp_status cast(cu_ctx *x, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    TP_TRY(tp_check_cast(in, out, err));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[2] = {in->stride, out->stride};
    tp_layout l;
    tp_layout_init(&l, out->ndim, out->shape, 2, st);
    KERNEL_TRY(x, err, tp_cuda_cast(in->data, in->dtype, out->data, out->dtype, &l, x->compute));
    return TP_OK;
}

/* ------------------------------------------------------------------ copies */

static tp_status cat(cu_ctx *x, const tp_attrs *at, const tp_tensor *ins, int n_ins, tp_tensor *out, tp_err *err)
{
    int d = at ? at->dim : 0;
    tp_status st = tp_check_cat(d, ins, n_ins, out, err);
    if (st != TP_OK)
        return st;
    int64_t off = 0;
    for (int i = 0; i < n_ins; i++) {
        tp_tensor view = tp_tensor_narrow(out, d, off, ins[i].shape[d]);
        TP_TRY(cu_copy_tensor(x, &view, &ins[i], x->compute, err));
        off += ins[i].shape[d];
    }
    return TP_OK;
}

/* reshape, contiguous, identity_copy: in's elements in row-major order. */
static tp_status copy_op(cu_ctx *x, tp_op op, const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96];
    if (in->dtype != out->dtype || tp_tensor_numel(in) != tp_tensor_numel(out))
        return tp_fail(err, TP_INVALID, "%s: %s %s cannot become %s %s", tp_op_name(op), tp_dtype_name(in->dtype),
                       tp_shape_str(s1, sizeof s1, in->ndim, in->shape), tp_dtype_name(out->dtype),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    if (in->data == out->data && tp_tensor_is_contiguous(in))
        return TP_OK; /* already in place */
    return into_out(x, in, out, err);
}

/* One signature for every kernel, so the table below maps family -> kernel. */
typedef tp_status (*cu_kernel)(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                               tp_tensor *out, tp_err *err);

static tp_status k_binary(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)a, (void)n_ins;
    return binary(x, op, &ins[0], &ins[1], out, err);
}
static tp_status k_unary(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                         tp_err *err)
{
    (void)n_ins;
    return unary(x, op, a, &ins[0], out, err);
}
static tp_status k_softmax(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                           tp_err *err)
{
    (void)op, (void)n_ins;
    return softmax(x, a, &ins[0], out, err);
}
static tp_status k_matmul(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)n_ins;
    if (op == TP_OP_MATMUL_ROWS)
        return matmul_rows(x, a, ins, out, err);
    return cu_matmul(x, &ins[0], &ins[1], a ? a->transpose_b : 0, out, 0.0f, x->compute, err);
}
static tp_status k_attention(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                             tp_tensor *out, tp_err *err)
{
    (void)op;
    return attention(x, a, &ins[0], &ins[1], &ins[2], n_ins > 3 ? &ins[3] : NULL, out, err);
}
static tp_status k_embedding(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                             tp_tensor *out, tp_err *err)
{
    (void)op, (void)n_ins;
    return embedding(x, a, &ins[0], &ins[1], out, err);
}
static tp_status k_cat(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                       tp_err *err)
{
    (void)op;
    return cat(x, a, ins, n_ins, out, err);
}
static tp_status k_copy(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                        tp_err *err)
{
    (void)a, (void)n_ins;
    return copy_op(x, op, &ins[0], out, err);
}

static tp_status k_reduce(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)n_ins;
    return reduce(x, op, a, &ins[0], out, err);
}
static tp_status k_gather(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)op, (void)n_ins;
    return gather(x, a, &ins[0], &ins[1], out, err);
}
static tp_status k_where(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                         tp_err *err)
{
    (void)op, (void)a, (void)n_ins;
    return where(x, ins, out, err);
}
static tp_status k_expand(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)op, (void)a, (void)n_ins;
    return expand(x, &ins[0], out, err);
}
static tp_status k_cast(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                        tp_err *err)
{
    (void)op, (void)a, (void)n_ins;
    return cast(x, &ins[0], out, err);
}

static tp_status k_kv_attention(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                                tp_tensor *out, tp_err *err)
{
    (void)op, (void)n_ins;
    return kv_attention(x, a, ins, out, err);
}
static tp_status k_argmax(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          tp_err *err)
{
    (void)n_ins;
    return argmax(x, op, a, &ins[0], out, err);
}

static tp_status k_rope(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                       tp_err *err)
{
    (void)op, (void)a, (void)n_ins;
    return rope(x, ins, out, err);
}

/* The cuda backend's kernel of each family (TP_FAMILY_LIST, ops.h): k_name
 * above. An op whose family has no kernel here (NONE, UNSET) is refused at
 * load ("backend 'cuda' has no kernel for op ..."). */
static const cu_kernel cu_kernels[TP_FAMILY_COUNT] = {TP_FAMILY_KERNELS};

static cu_kernel kernel_of(tp_op op) { return cu_kernels[tp_op_family(op)]; }

int cu_op_has_kernel(tp_op op) { return kernel_of(op) != NULL; }

tp_status cu_run_op(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                    tp_err *err)
{
    if (!cu_op_has_kernel(op))
        return tp_fail(err, TP_INTERNAL, "cuda backend: op '%s' has no cuda kernel", tp_op_name(op));
    if (n_ins < tp_op_min_inputs(op) || n_ins > tp_op_max_inputs(op))
        return tp_fail(err, TP_INTERNAL, "cuda backend: op %d called with %d inputs", (int)op, n_ins);
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cuda backend: %s output must be contiguous", tp_op_name(op));
    return kernel_of(op)(x, op, a, ins, n_ins, out, err);
}
