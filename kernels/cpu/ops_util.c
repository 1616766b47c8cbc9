/* ops_util.c — strided iteration, dtype conversion of rows, scratch buffers. */
#include <stdlib.h>
#include <string.h>

#include "common/tp_math.h"
#include "narrow_rows.h"
#include "ops_internal.h"

/* The coalescing is tp_layout_init's (kernels/common): the cuda kernels
 * iterate exactly the same way. ops_layout only names its strides. */
void ops_layout_init(ops_layout *l, int nd, const int64_t *shape, int nops,
                     const int64_t *const *strides)
{
    tp_layout t;
    tp_layout_init(&t, nd, shape, nops, strides);
    l->nd = t.nd;
    l->nops = t.nops;
    memcpy(l->shape, t.shape, sizeof l->shape);
    memcpy(l->stride, t.st, sizeof l->stride);
}

int64_t ops_layout_count(const ops_layout *l, int iter)
{
    int64_t n = 1;
    for (int d = 0; d < iter; d++)
        n *= l->shape[d];
    return n;
}

void ops_pos_next(const ops_layout *l, ops_pos *p, int iter)
{
    for (int d = iter - 1; d >= 0; d--) {
        p->idx[d]++;
        for (int k = 0; k < l->nops; k++)
            p->off[k] += l->stride[k][d];
        if (p->idx[d] < l->shape[d])
            return;
        for (int k = 0; k < l->nops; k++)
            p->off[k] -= l->stride[k][d] * l->shape[d];
        p->idx[d] = 0;
    }
}

/* Below this many elements an elementwise op stays on the caller: waking
 * the pool's workers costs tens of microseconds, as long as the op. */
#define OPS_SPLIT_MIN_ELEMENTS ((int64_t)1 << 16)

typedef struct {
    const ops_layout *l;
    int64_t n, rows;
    int tasks, by_rows;
    ops_row_fn fn;
    void *arg;
} rows_job;

/* The position of row r (odometer order over the first iter dims). */
static void pos_at(const ops_layout *l, int iter, int64_t r, ops_pos *p)
{
    memset(p, 0, sizeof *p);
    for (int d = iter - 1; d >= 0; d--) {
        p->idx[d] = r % l->shape[d];
        r /= l->shape[d];
        for (int k = 0; k < l->nops; k++)
            p->off[k] += p->idx[d] * l->stride[k][d];
    }
}

static tp_status rows_task(void *arg, int64_t t, int slot, tp_err *err)
{
    (void)slot, (void)err;
    const rows_job *j = arg;
    int iter = j->l->nd - 1;
    int64_t r0 = 0, r1 = j->rows, e0 = 0, e1 = j->n;
    if (j->by_rows) {
        r0 = j->rows * t / j->tasks;
        r1 = j->rows * (t + 1) / j->tasks;
    } else { /* slices of 16 elements: a 64-byte line of FP32 never split */
        e0 = t == 0 ? 0 : (j->n * t / j->tasks) & ~(int64_t)15;
        e1 = t == j->tasks - 1 ? j->n : (j->n * (t + 1) / j->tasks) & ~(int64_t)15;
    }
    if (r0 >= r1 || e0 >= e1)
        return TP_OK;
    ops_pos p;
    pos_at(j->l, iter, r0, &p);
    for (int64_t r = r0; r < r1; r++, ops_pos_next(j->l, &p, iter))
        j->fn(j->arg, &p, e0, e1);
    return TP_OK;
}

tp_status ops_run_rows_of(cpu_pool *pool, const ops_layout *l, int64_t n, int64_t unit, ops_row_fn fn, void *arg,
                          tp_err *err)
{
    rows_job j = {.l = l, .n = n, .rows = ops_layout_count(l, l->nd - 1), .tasks = 1, .fn = fn, .arg = arg};
    int threads = cpu_pool_threads(pool);
    if (threads > 1 && j.rows * n * unit >= OPS_SPLIT_MIN_ELEMENTS) {
        j.tasks = threads;
        j.by_rows = j.rows >= 2 * threads;
    }
    if (j.tasks == 1)
        return rows_task(&j, 0, 0, err);
    return cpu_pool_run(pool, j.tasks, rows_task, &j, err);
}

tp_status ops_run_rows(cpu_pool *pool, const ops_layout *l, int64_t n, ops_row_fn fn, void *arg, tp_err *err)
{
    return ops_run_rows_of(pool, l, n, 1, fn, arg, err);
}

void ops_load_row(const void *base, tp_dtype dt, int64_t s, int64_t n, float *dst)
{
    switch (dt) {
    case TP_F32: {
        const float *p = base;
        if (s == 1) {
            memcpy(dst, p, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++)
                dst[i] = p[i * s];
        }
        break;
    }
    case TP_F16:
    case TP_BF16:
        if (s == 1) {
            narrow_rows_load(base, dt, n, dst);
            break;
        }
        for (int64_t i = 0; i < n; i++)
            dst[i] = tp_load_f32(base, dt, i * s);
        break;
    case TP_I32:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const int32_t *)base)[i * s];
        break;
    case TP_I64:
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)((const int64_t *)base)[i * s];
        break;
    default:
        break;
    }
}

void ops_store_row(void *base, tp_dtype dt, int64_t s, int64_t n, const float *src)
{
    switch (dt) {
    case TP_F32: {
        float *p = base;
        if (s == 1) {
            memcpy(p, src, (size_t)n * sizeof(float));
        } else {
            for (int64_t i = 0; i < n; i++)
                p[i * s] = src[i];
        }
        break;
    }
    case TP_F16:
    case TP_BF16:
        if (s == 1) {
            narrow_rows_store(base, dt, n, src);
            break;
        }
        for (int64_t i = 0; i < n; i++)
            tp_store_f32(base, dt, i * s, src[i]);
        break;
    default: /* integer outputs never come from float math */
        break;
    }
}

/* A cast to FP32 into dst's contiguous layout: the same rows, widened by
 * the same ops_load_row where they are floats. */
tp_status ops_gather_f32_on(cpu_pool *pool, const tp_tensor *t, float *dst, tp_err *err)
{
    tp_tensor d = tp_tensor_make(dst, TP_F32, t->ndim, t->shape);
    return cpu_cast(t, &d, pool, err);
}

void ops_gather_f32(const tp_tensor *t, float *dst)
{
    tp_err err;
    (void)ops_gather_f32_on(NULL, t, dst, &err); /* the caller alone: rows never fail */
}

tp_status ops_alloc_f32(float **p, size_t n, const char *what, tp_err *err)
{
    *p = malloc((n ? n : 1) * sizeof(float));
    if (!*p)
        return tp_fail(err, TP_NOMEM, "%s: cannot allocate %zu floats of scratch", what, n);
    return TP_OK;
}

tp_status ops_buf_reserve(ops_buf *b, size_t n, tp_err *err)
{
    if (n <= b->cap)
        return TP_OK;
    float *p = realloc(b->p, n * sizeof(float));
    if (!p)
        return tp_fail(err, TP_NOMEM, "cannot allocate %zu floats of scratch", n);
    b->p = p;
    b->cap = n;
    return TP_OK;
}

void ops_buf_free(ops_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->cap = 0;
}

tp_status ops_as_f32(const tp_tensor *t, tp_tensor *f, float **owned, const char *what,
                     tp_err *err)
{
    *owned = NULL;
    if (t->dtype == TP_F32) {
        *f = *t;
        return TP_OK;
    }
    if (!tp_dtype_is_float(t->dtype))
        return tp_fail(err, TP_INVALID, "%s: expected a float tensor, got %s", what,
                       tp_dtype_name(t->dtype));
    tp_status s = ops_alloc_f32(owned, (size_t)tp_tensor_numel(t), what, err);
    if (s != TP_OK)
        return s;
    ops_gather_f32(t, *owned);
    *f = tp_tensor_make(*owned, TP_F32, t->ndim, t->shape);
    return TP_OK;
}

OPS_SIMD_CLONES void ops_softmax_row(const float *x, float *y, int64_t n)
{
    tp_softmax_row(x, y, n);
}

OPS_SIMD_CLONES void ops_layer_norm_row(const float *x, const float *w, const float *b, float *y, int64_t n,
                                       float eps)
{
    tp_layer_norm_row(x, w, b, y, n, eps);
}

OPS_SIMD_CLONES void ops_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps)
{
    tp_rms_norm_row(x, w, y, n, eps);
}
