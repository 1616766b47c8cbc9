/* cpu_ops.c — the cpu backend's op dispatcher, plus the copy ops (cat,
 * reshape, contiguous). The compute kernels live in kernels/cpu/ops_*.c. */
#include <string.h>

#include "cpu_ops.h"
#include "ops_internal.h"
#include "common/tp_checks.h"

typedef struct {
    tp_tensor *dst;
    const tp_tensor *src;
    int dim;
    int64_t parts;
} copy_job;

/* Part t of the copy: a run of indices of dim, the first dim longer than
 * 1 (every dim before it is 1, so the runs cover the tensor). */
static tp_status copy_part(void *arg, int64_t t, int slot, tp_err *err)
{
    (void)slot;
    (void)err;
    const copy_job *j = arg;
    int64_t n = j->dst->shape[j->dim], i0 = n * t / j->parts, i1 = n * (t + 1) / j->parts;
    tp_tensor d = tp_tensor_narrow(j->dst, j->dim, i0, i1 - i0), s = tp_tensor_narrow(j->src, j->dim, i0, i1 - i0);
    tp_tensor_copy(&d, &s);
    return TP_OK;
}

tp_status cpu_tensor_copy_on(cpu_pool *pool, tp_tensor *dst, const tp_tensor *src, int64_t split_bytes, tp_err *err)
{
    copy_job j = {dst, src, 0, cpu_pool_threads(pool)};
    while (j.dim < dst->ndim && dst->shape[j.dim] == 1)
        j.dim++;
    if (j.parts < 2 || j.dim == dst->ndim || tp_tensor_numel(dst) * (int64_t)tp_dtype_size(dst->dtype) < split_bytes) {
        tp_tensor_copy(dst, src);
        return TP_OK;
    }
    if (j.parts > dst->shape[j.dim])
        j.parts = dst->shape[j.dim];
    return cpu_pool_run(pool, j.parts, copy_part, &j, err);
}

tp_status cpu_cat(const tp_attrs *attrs, const tp_tensor *ins, int n_ins, tp_tensor *out, cpu_pool *pool,
                  tp_err *err)
{
    int d = attrs ? attrs->dim : 0;
    tp_status st = tp_check_cat(d, ins, n_ins, out, err);
    if (st != TP_OK)
        return st;
    int64_t off = 0;
    for (int i = 0; i < n_ins; i++) {
        tp_tensor view = *out; /* out's strides, the input's shape */
        view.data = ops_at(out->data, out->dtype, off * out->stride[d]);
        memcpy(view.shape, ins[i].shape, sizeof view.shape);
        if ((st = cpu_tensor_copy_on(pool, &view, &ins[i], OPS_COPY_SPLIT_MIN_BYTES, err)) != TP_OK)
            return st;
        off += ins[i].shape[d];
    }
    return TP_OK;
}

/* reshape and contiguous: x's elements in row-major order into out. */
tp_status cpu_copy(tp_op op, const tp_tensor *x, tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    char s1[96], s2[96];
    if (x->dtype != out->dtype || tp_tensor_numel(x) != tp_tensor_numel(out))
        return tp_fail(err, TP_INVALID, "%s: %s %s cannot become %s %s", tp_op_name(op),
                       tp_dtype_name(x->dtype), tp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       tp_dtype_name(out->dtype),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    if (x->data == out->data && tp_tensor_is_contiguous(x))
        return TP_OK; /* already in place */
    tp_tensor dst = tp_tensor_make(out->data, out->dtype, x->ndim, x->shape);
    return cpu_tensor_copy_on(pool, &dst, x, OPS_COPY_SPLIT_MIN_BYTES, err);
}

/* One signature for every kernel, so the table below maps family -> kernel. */
typedef tp_status (*cpu_kernel)(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                                int rank, int world, cpu_pool *pool, tp_err *err);

#define UNUSED_CALL (void)op, (void)n_ins, (void)rank, (void)world, (void)pool
static tp_status k_binary(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL, (void)a;
    return cpu_binary(op, &ins[0], &ins[1], out, pool, err);
}
static tp_status k_unary(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                         int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    return cpu_unary(op, a, &ins[0], out, pool, err);
}
static tp_status k_softmax(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                           int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    return cpu_softmax(a, &ins[0], out, err);
}
static tp_status k_norm(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                        int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    return cpu_norm(op, a, ins, n_ins, out, err);
}
static tp_status k_matmul(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    if (op == TP_OP_MATMUL_ROWS)
        return cpu_matmul_rows(a, &ins[0], &ins[1], &ins[2], out, pool, err);
    return cpu_matmul(a, &ins[0], &ins[1], out, pool, err);
}
static tp_status k_attention(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                             int rank, int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)rank, (void)world;
    return cpu_attention(a, &ins[0], &ins[1], &ins[2], n_ins > 3 ? &ins[3] : NULL, out, pool, err);
}
static tp_status k_embedding(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                             int rank, int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)n_ins, (void)pool;
    return cpu_embedding(a, &ins[0], &ins[1], out, rank, world, err);
}
static tp_status k_cat(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                       int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)rank, (void)world;
    return cpu_cat(a, ins, n_ins, out, pool, err);
}
static tp_status k_copy(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                        int world, cpu_pool *pool, tp_err *err)
{
    (void)n_ins, (void)rank, (void)world, (void)a;
    return cpu_copy(op, &ins[0], out, pool, err);
}

static tp_status k_reduce(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                          int rank, int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    return cpu_reduce(op, a, &ins[0], out, err);
}
static tp_status k_where(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                         int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL, (void)a;
    return cpu_where(ins, out, err);
}
static tp_status k_gather(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                          int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL;
    return cpu_gather(a, &ins[0], &ins[1], out, err);
}
static tp_status k_expand(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                          int world, cpu_pool *pool, tp_err *err)
{
    UNUSED_CALL, (void)a;
    return cpu_expand(&ins[0], out, err);
}
static tp_status k_cast(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                        int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)n_ins, (void)rank, (void)world, (void)a;
    return cpu_cast(&ins[0], out, pool, err);
}

static tp_status k_kv_attention(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                                int rank, int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)n_ins, (void)rank, (void)world;
    return cpu_kv_attention(a, ins, out, pool, err);
}
static tp_status k_argmax(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                          int world, cpu_pool *pool, tp_err *err)
{
    (void)n_ins, (void)pool;
    return cpu_argmax_family(op, a, &ins[0], out, rank, world, err);
}

static tp_status k_rope(tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out, int rank,
                       int world, cpu_pool *pool, tp_err *err)
{
    (void)op, (void)a, (void)n_ins, (void)rank, (void)world;
    return cpu_rope(ins, out, pool, err);
}

/* The cpu backend's kernel of each family (TP_FAMILY_LIST, ops.h): k_name
 * above. An op whose family has no kernel here (NONE, UNSET) is refused at
 * load ("backend 'cpu' has no kernel for op ..."). */
static const cpu_kernel cpu_kernels[TP_FAMILY_COUNT] = {TP_FAMILY_KERNELS};

static cpu_kernel kernel_of(tp_op op) { return cpu_kernels[tp_op_family(op)]; }

int cpu_op_has_kernel(tp_op op) { return kernel_of(op) != NULL; }

tp_status cpu_op_run_on(cpu_pool *pool, tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                        tp_tensor *out, int rank, int world, tp_err *err)
{
    if (!cpu_op_has_kernel(op))
        return tp_fail(err, TP_INTERNAL, "cpu backend: op '%s' has no cpu kernel", tp_op_name(op));
    if (!out || (n_ins > 0 && !ins) || n_ins < tp_op_min_inputs(op) || n_ins > tp_op_max_inputs(op))
        return tp_fail(err, TP_INTERNAL, "cpu backend: %s called with %d inputs (wants %d..%d)",
                       tp_op_name(op), n_ins, tp_op_min_inputs(op), tp_op_max_inputs(op));
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "cpu backend: %s output must be contiguous", tp_op_name(op));
    return kernel_of(op)(op, attrs, ins, n_ins, out, rank, world, pool, err);
}

tp_status cpu_op_reserve(cpu_pool *pool, tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                         const tp_tensor *out, tp_err *err)
{
    if ((op != TP_OP_MATMUL && op != TP_OP_MATMUL_ROWS) || n_ins < 2 || !ins || !out)
        return TP_OK;
    return cpu_matmul_reserve(attrs, &ins[0], &ins[1], out, pool, err);
}

tp_status cpu_op_run(tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                     tp_tensor *out, int rank, int world, tp_err *err)
{
    return cpu_op_run_on(NULL, op, attrs, ins, n_ins, out, rank, world, err);
}
