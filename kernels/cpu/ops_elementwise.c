/* ops_elementwise.c — add/sub/mul/div with NumPy broadcasting, the unary
 * functions of tp_math.h (gelu silu relu sqrt rsqrt exp neg tanh erf
 * sigmoid pow), where, and cast.
 *
 * Operands are coalesced into as few dims as their strides allow, then run
 * row by row along the innermost dim. FP32 rows are computed in place from the
 * operands' memory; FP16/BF16 rows go through small FP32 chunks (load, compute,
 * round on store); integers wrap like two's complement. */
#include <string.h>

#include "common/tp_checks.h"
#include "common/tp_math.h"
#include "ops_internal.h"

#define CHUNK 256

/* The operands' layout over out's shape, walked row by row along its
 * innermost dim (l->nd - 1): the number of rows, *n their length. */
static int64_t layout_rows(ops_layout *l, const tp_tensor *out, int nops, const int64_t *const *st, int64_t *n)
{
    ops_layout_init(l, out->ndim, out->shape, nops, st);
    *n = l->shape[l->nd - 1];
    return ops_layout_count(l, l->nd - 1);
}

/* o[i] = EXPR(x = a[i*sa], y = b[i*sb]), specialised for the common strides. */
#define BIN_LOOP(T, EXPR)                                                           \
    do {                                                                            \
        if (sa == 1 && sb == 1) {                                                   \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i], y = b[i];                                               \
                o[i] = EXPR;                                                        \
            }                                                                       \
        } else if (sa == 1 && sb == 0) {                                            \
            T y = b[0];                                                             \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i];                                                         \
                o[i] = EXPR;                                                        \
            }                                                                       \
        } else if (sa == 0 && sb == 1) {                                            \
            T x = a[0];                                                             \
            for (int64_t i = 0; i < n; i++) {                                       \
                T y = b[i];                                                         \
                o[i] = EXPR;                                                        \
            }                                                                       \
        } else {                                                                    \
            for (int64_t i = 0; i < n; i++) {                                       \
                T x = a[i * sa], y = b[i * sb];                                     \
                o[i] = EXPR;                                                        \
            }                                                                       \
        }                                                                           \
    } while (0)

/* Cloned per instruction set as the unary loops are: each element is one
 * IEEE operation, the same bits at any vector width. Built for the
 * baseline only, a 512-row Llama request spent 15 CPU-ms here. */
OPS_SIMD_CLONES static void bin_f32(tp_op op, const float *a, int64_t sa, const float *b, int64_t sb, float *o,
                                    int64_t n)
{
    switch (op) {
    case TP_OP_ADD: BIN_LOOP(float, x + y); break;
    case TP_OP_SUB: BIN_LOOP(float, x - y); break;
    case TP_OP_DIV: BIN_LOOP(float, x / y); break;
    default: BIN_LOOP(float, x * y); break;
    }
}

/* Unsigned arithmetic so overflow wraps instead of being undefined. */
static void bin_i32(tp_op op, const int32_t *a, int64_t sa, const int32_t *b, int64_t sb,
                    int32_t *o, int64_t n)
{
    switch (op) {
    case TP_OP_ADD: BIN_LOOP(int32_t, (int32_t)((uint32_t)x + (uint32_t)y)); break;
    case TP_OP_SUB: BIN_LOOP(int32_t, (int32_t)((uint32_t)x - (uint32_t)y)); break;
    default: BIN_LOOP(int32_t, (int32_t)((uint32_t)x * (uint32_t)y)); break;
    }
}

static void bin_i64(tp_op op, const int64_t *a, int64_t sa, const int64_t *b, int64_t sb,
                    int64_t *o, int64_t n)
{
    switch (op) {
    case TP_OP_ADD: BIN_LOOP(int64_t, (int64_t)((uint64_t)x + (uint64_t)y)); break;
    case TP_OP_SUB: BIN_LOOP(int64_t, (int64_t)((uint64_t)x - (uint64_t)y)); break;
    default: BIN_LOOP(int64_t, (int64_t)((uint64_t)x * (uint64_t)y)); break;
    }
}

/* FP16/BF16: widen CHUNK elements at a time, compute in FP32, round once. */
static void bin_half(tp_op op, tp_dtype dt, const char *a, int64_t sa, const char *b, int64_t sb,
                     char *o, int64_t n)
{
    float fa[CHUNK], fb[CHUNK], fo[CHUNK];
    size_t es = tp_dtype_size(dt);
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        ops_load_row(a + i0 * sa * (int64_t)es, dt, sa, sa ? m : 1, fa);
        ops_load_row(b + i0 * sb * (int64_t)es, dt, sb, sb ? m : 1, fb);
        bin_f32(op, fa, sa ? 1 : 0, fb, sb ? 1 : 0, fo, m);
        ops_store_row(o + i0 * (int64_t)es, dt, 1, m, fo);
    }
}

static void bin_row(tp_op op, tp_dtype dt, const char *a, int64_t sa, const char *b, int64_t sb,
                    char *o, int64_t n)
{
    switch (dt) {
    case TP_F32:
        bin_f32(op, (const float *)a, sa, (const float *)b, sb, (float *)o, n);
        break;
    case TP_I32:
        bin_i32(op, (const int32_t *)a, sa, (const int32_t *)b, sb, (int32_t *)o, n);
        break;
    case TP_I64:
        bin_i64(op, (const int64_t *)a, sa, (const int64_t *)b, sb, (int64_t *)o, n);
        break;
    default:
        bin_half(op, dt, a, sa, b, sb, o, n);
        break;
    }
}

typedef struct {
    tp_op op;
    tp_dtype dt;
    const tp_tensor *a, *b, *out;
    const ops_layout *l;
} bin_job;

static void bin_part(void *arg, const ops_pos *p, int64_t e0, int64_t e1)
{
    const bin_job *j = arg;
    int iter = j->l->nd - 1;
    int64_t sa = j->l->stride[0][iter], sb = j->l->stride[1][iter], so = j->l->stride[2][iter];
    bin_row(j->op, j->dt, ops_at(j->a->data, j->dt, p->off[0] + e0 * sa), sa,
            ops_at(j->b->data, j->dt, p->off[1] + e0 * sb), sb, ops_at(j->out->data, j->dt, p->off[2] + e0 * so),
            e1 - e0);
}

tp_status cpu_binary(tp_op op, const tp_tensor *a, const tp_tensor *b, tp_tensor *out, cpu_pool *pool,
                     tp_err *err)
{
    char s1[96], s2[96], s3[96];
    if (a->dtype != out->dtype || b->dtype != out->dtype)
        return tp_fail(err, TP_INVALID, "%s: input dtypes %s and %s (output %s) differ",
                       tp_op_name(op), tp_dtype_name(a->dtype), tp_dtype_name(b->dtype),
                       tp_dtype_name(out->dtype));
    if (op == TP_OP_DIV && !tp_dtype_is_float(out->dtype))
        return tp_fail(err, TP_INVALID, "div: needs floating-point inputs, got %s", tp_dtype_name(out->dtype));
    int64_t sa[TP_MAX_DIMS], sb[TP_MAX_DIMS];
    if (tp_broadcast_strides(a, out->ndim, out->shape, sa) ||
        tp_broadcast_strides(b, out->ndim, out->shape, sb))
        return tp_fail(err, TP_INVALID, "%s: shapes %s and %s do not broadcast to %s",
                       tp_op_name(op), tp_shape_str(s1, sizeof s1, a->ndim, a->shape),
                       tp_shape_str(s2, sizeof s2, b->ndim, b->shape),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[3] = {sa, sb, out->stride};
    ops_layout l;
    int64_t n;
    layout_rows(&l, out, 3, st, &n);
    bin_job j = {op, out->dtype, a, b, out, &l};
    return ops_run_rows(pool, &l, n, bin_part, &j, err);
}

/* y[i] = f(x[i*sx]); one loop per function, so each folds its switch,
 * and one for contiguous x: with sx unknown, GCC vectorized the loop by
 * loading x an element at a time into the vector (SiLU at 1 ns an
 * element, 13 CPU-ms of a 512-row Llama request). */
OPS_SIMD_CLONES static void unary_f32(tp_unary_fn f, float p, const float *x, int64_t sx, float *y, int64_t n)
{
    switch (f) {
/* y may be x (in place): OPS_IVDEP. */
#define UNARY_LOOP(name, expr)                                                      \
    case name:                                                                      \
        if (sx == 1)                                                                \
            OPS_IVDEP for (int64_t i = 0; i < n; i++)                               \
                y[i] = tp_unary(name, x[i], p);                                     \
        else                                                                        \
            OPS_IVDEP for (int64_t i = 0; i < n; i++)                               \
                y[i] = tp_unary(name, x[i * sx], p);                                \
        break;
        TP_UNARY_FN_LIST(UNARY_LOOP)
#undef UNARY_LOOP
    }
}

/* The erf GELU in blocks: a block whose every element is in erf's Taylor
 * range skips the piecewise polynomials, and one all below their first
 * piece's end skips picking each coefficient among three: most of an
 * element's work either way (AVX-512: 0.39 -> 0.15 ns an element all
 * Taylor). Activations near zero are common: every block of the example
 * MLP's is one or the other. Each element gets tp_gelu_erf's bits
 * whichever way its block went. */
#define GELU_BLOCK 16

OPS_SIMD_CLONES static void gelu_erf_f32(const float *x, float *y, int64_t n)
{
    int64_t i0 = 0;
    for (; i0 + GELU_BLOCK <= n; i0 += GELU_BLOCK) {
        const float *xb = x + i0;
        float *yb = y + i0;
        int taylor = 1, low = 1;
        for (int i = 0; i < GELU_BLOCK; i++) {
            taylor &= tp_gelu_erf_is_taylor(xb[i]);
            low &= tp_gelu_erf_is_low(xb[i]);
        }
        if (taylor) {
            OPS_IVDEP for (int i = 0; i < GELU_BLOCK; i++)
                yb[i] = tp_gelu_erf_taylor(xb[i]);
        } else if (low) {
            OPS_IVDEP for (int i = 0; i < GELU_BLOCK; i++)
                yb[i] = tp_gelu_erf_low(xb[i]);
        } else {
            OPS_IVDEP for (int i = 0; i < GELU_BLOCK; i++)
                yb[i] = tp_gelu_erf(xb[i]);
        }
    }
    OPS_IVDEP for (int64_t i = i0; i < n; i++)
        y[i] = tp_gelu_erf(x[i]);
}

static void unary_row(tp_unary_fn f, float p, tp_dtype dt, const char *x, int64_t sx, char *y, int64_t n)
{
    if (dt == TP_F32 && f == TP_UN_GELU && sx == 1) {
        gelu_erf_f32((const float *)x, (float *)y, n);
        return;
    }
    if (dt == TP_F32) {
        unary_f32(f, p, (const float *)x, sx, (float *)y, n);
        return;
    }
    float buf[CHUNK];
    size_t es = tp_dtype_size(dt);
    for (int64_t i0 = 0; i0 < n; i0 += CHUNK) {
        int64_t m = n - i0 < CHUNK ? n - i0 : CHUNK;
        ops_load_row(x + i0 * sx * (int64_t)es, dt, sx, m, buf);
        unary_f32(f, p, buf, 1, buf, m);
        ops_store_row(y + i0 * (int64_t)es, dt, 1, m, buf);
    }
}

/* One input, one output, elementwise (unary ops, cast): the job of
 * ops_run_rows, and where a part's row starts in each. */
typedef struct {
    tp_unary_fn f; /* unary ops */
    float param;
    const tp_tensor *x, *out;
    const ops_layout *l;
} map_job;

static void map_row(const map_job *j, const ops_pos *p, int64_t e0, char **x, int64_t *sx, char **o, int64_t *so)
{
    int iter = j->l->nd - 1;
    *sx = j->l->stride[0][iter], *so = j->l->stride[1][iter];
    *x = ops_at(j->x->data, j->x->dtype, p->off[0] + e0 * *sx);
    *o = ops_at(j->out->data, j->out->dtype, p->off[1] + e0 * *so);
}

static void unary_part(void *arg, const ops_pos *p, int64_t e0, int64_t e1)
{
    const map_job *j = arg;
    char *x, *o;
    int64_t sx, so;
    map_row(j, p, e0, &x, &sx, &o, &so);
    unary_row(j->f, j->param, j->x->dtype, x, sx, o, e1 - e0);
}

tp_status cpu_unary(tp_op op, const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, cpu_pool *pool,
                    tp_err *err)
{
    char s1[96], s2[96];
    if (x->dtype != out->dtype || !tp_dtype_is_float(x->dtype))
        return tp_fail(err, TP_INVALID, "%s: needs a float input of the output dtype, got %s -> %s",
                       tp_op_name(op), tp_dtype_name(x->dtype), tp_dtype_name(out->dtype));
    if (!tp_tensor_same_shape(x, out))
        return tp_fail(err, TP_INVALID, "%s: input shape %s does not match output %s",
                       tp_op_name(op), tp_shape_str(s1, sizeof s1, x->ndim, x->shape),
                       tp_shape_str(s2, sizeof s2, out->ndim, out->shape));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[2] = {x->stride, out->stride};
    ops_layout l;
    int64_t n;
    layout_rows(&l, out, 2, st, &n);
    map_job j = {.x = x, .out = out, .l = &l};
    if (tp_unary_fn_of(op, attrs, &j.f, &j.param) != 0)
        return tp_fail(err, TP_INTERNAL, "%s: not a unary op", tp_op_name(op));
    return ops_run_rows(pool, &l, n, unary_part, &j, err);
}

/* out = cond != 0 ? x : y, element by element (any dtype: a byte copy). */
tp_status cpu_where(const tp_tensor *ins, tp_tensor *out, tp_err *err)
{
    int64_t bs[3][TP_MAX_DIMS];
    tp_status s = tp_check_where(ins, out, bs, err);
    if (s != TP_OK)
        return s;
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[4] = {bs[0], bs[1], bs[2], out->stride};
    ops_layout l;
    int64_t n, rows = layout_rows(&l, out, 4, st, &n);
    int iter = l.nd - 1;
    tp_dtype ct = ins[0].dtype, dt = out->dtype;
    size_t es = tp_dtype_size(dt);
    ops_pos p;
    memset(&p, 0, sizeof p);
    for (int64_t r = 0; r < rows; r++, ops_pos_next(&l, &p, iter)) {
        for (int64_t i = 0; i < n; i++) {
            int64_t c = p.off[0] + i * l.stride[0][iter];
            int take_x = ct == TP_I32 ? ((const int32_t *)ins[0].data)[c] != 0 : ((const int64_t *)ins[0].data)[c] != 0;
            int k = take_x ? 1 : 2;
            memcpy(ops_at(out->data, dt, p.off[3] + i * l.stride[3][iter]),
                   ops_at(ins[k].data, dt, p.off[k] + i * l.stride[k][iter]), es);
        }
    }
    return TP_OK;
}

/* FP32 to or from FP16/BF16 with the FP32 side contiguous goes through
 * narrow_rows (dtype.h's bits, eight lanes at a time): a widened graph's
 * casts (pass widen_activations) include its logits. */
static void cast_part(void *arg, const ops_pos *p, int64_t e0, int64_t e1)
{
    const map_job *j = arg;
    char *x, *o;
    int64_t sx, so, n = e1 - e0;
    tp_dtype xt = j->x->dtype, ot = j->out->dtype;
    map_row(j, p, e0, &x, &sx, &o, &so);
    if (xt == TP_F32 && sx == 1 && tp_dtype_is_float(ot)) {
        ops_store_row(o, ot, so, n, (const float *)x);
    } else if (ot == TP_F32 && so == 1 && tp_dtype_is_float(xt)) {
        ops_load_row(x, xt, sx, n, (float *)o);
    } else {
        for (int64_t i = 0; i < n; i++)
            tp_cast_elem(o, ot, i * so, x, xt, i * sx);
    }
}

tp_status cpu_cast(const tp_tensor *x, tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    tp_status s = tp_check_cast(x, out, err);
    if (s != TP_OK)
        return s;
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    const int64_t *st[2] = {x->stride, out->stride};
    ops_layout l;
    int64_t n;
    layout_rows(&l, out, 2, st, &n);
    map_job j = {.x = x, .out = out, .l = &l};
    return ops_run_rows(pool, &l, n, cast_part, &j, err);
}
