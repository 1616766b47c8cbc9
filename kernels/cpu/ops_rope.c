/* ops_rope.c — rope(x, cos, sin) = x cos + rotate_half(x) sin over the
 * last dim (engine/ops.c), row by row.
 *
 * Why an op: Llama's exports spell it mul, slice, slice, neg, cat, mul,
 * add on q and on k, each a pass over the tensor with rows of 32-64
 * floats: 8.7 ms of a 512-row Llama request for 168 ops. Here a row of x
 * is read once, with its cos and sin rows, and each element is
 * tp_rope's (kernels/common/tp_math.h): the decomposed graph's bits in
 * FP32. FP16/BF16 widen x, cos and sin, and round once. */
#include <string.h>

#include "common/tp_checks.h"
#include "common/tp_math.h"
#include "ops_internal.h"

#define ROPE_CHUNK 256

typedef struct {
    tp_dtype dt;
    const tp_tensor *x, *cos, *sin, *out;
    const ops_layout *l; /* out's dims but the last: operands x, cos, sin, out */
    int64_t h;           /* half the last dim */
    int64_t xs, cs, ss;  /* x's, cos's and sin's strides along it */
} rope_job;

/* One FP32 row: its halves' partners are h apart. A loop of its own for
 * unit strides, which vectorizes (with the strides unknown, GCC builds
 * vectors from single loads: unary_f32 in ops_elementwise.c). */
OPS_SIMD_CLONES static void rope_f32(const float *x, int64_t xs, const float *c, int64_t cs, const float *s,
                                     int64_t ss, float *o, int64_t h)
{
    if (xs == 1 && cs == 1 && ss == 1) {
        for (int64_t i = 0; i < h; i++)
            o[i] = tp_rope(x[i], x[i + h], c[i], s[i], 0);
        for (int64_t i = 0; i < h; i++)
            o[h + i] = tp_rope(x[h + i], x[i], c[h + i], s[h + i], 1);
        return;
    }
    for (int64_t i = 0; i < h; i++)
        o[i] = tp_rope(x[i * xs], x[(i + h) * xs], c[i * cs], s[i * ss], 0);
    for (int64_t i = 0; i < h; i++)
        o[h + i] = tp_rope(x[(h + i) * xs], x[i * xs], c[(h + i) * cs], s[(h + i) * ss], 1);
}

/* One FP16/BF16 row, ROPE_CHUNK positions of each half at a time: x, cos
 * and sin widened, the halves computed in FP32 and rounded on store. */
static void rope_narrow(tp_dtype dt, const char *x, int64_t xs, const char *c, int64_t cs, const char *s, int64_t ss,
                        char *o, int64_t h)
{
    float x0[ROPE_CHUNK], x1[ROPE_CHUNK], c0[ROPE_CHUNK], c1[ROPE_CHUNK], s0[ROPE_CHUNK], s1[ROPE_CHUNK];
    float o0[ROPE_CHUNK], o1[ROPE_CHUNK];
    int64_t es = (int64_t)tp_dtype_size(dt);
    for (int64_t i0 = 0; i0 < h; i0 += ROPE_CHUNK) {
        int64_t m = h - i0 < ROPE_CHUNK ? h - i0 : ROPE_CHUNK;
        ops_load_row(x + i0 * xs * es, dt, xs, m, x0);
        ops_load_row(x + (h + i0) * xs * es, dt, xs, m, x1);
        ops_load_row(c + i0 * cs * es, dt, cs, m, c0);
        ops_load_row(c + (h + i0) * cs * es, dt, cs, m, c1);
        ops_load_row(s + i0 * ss * es, dt, ss, m, s0);
        ops_load_row(s + (h + i0) * ss * es, dt, ss, m, s1);
        for (int64_t i = 0; i < m; i++) {
            o0[i] = tp_rope(x0[i], x1[i], c0[i], s0[i], 0);
            o1[i] = tp_rope(x1[i], x0[i], c1[i], s1[i], 1);
        }
        ops_store_row(o + i0 * es, dt, 1, m, o0);
        ops_store_row(o + (h + i0) * es, dt, 1, m, o1);
    }
}

/* Rows e0 .. e1 - 1 of the layout's innermost dim at p. */
static void rope_part(void *arg, const ops_pos *p, int64_t e0, int64_t e1)
{
    const rope_job *j = arg;
    int iter = j->l->nd - 1;
    for (int64_t e = e0; e < e1; e++) {
        int64_t off[4];
        for (int k = 0; k < 4; k++)
            off[k] = p->off[k] + e * j->l->stride[k][iter];
        const char *x = ops_at(j->x->data, j->dt, off[0]), *c = ops_at(j->cos->data, j->dt, off[1]);
        const char *s = ops_at(j->sin->data, j->dt, off[2]);
        char *o = ops_at(j->out->data, j->dt, off[3]);
        if (j->dt == TP_F32)
            rope_f32((const float *)x, j->xs, (const float *)c, j->cs, (const float *)s, j->ss, (float *)o, j->h);
        else
            rope_narrow(j->dt, x, j->xs, c, j->cs, s, j->ss, o, j->h);
    }
}

tp_status cpu_rope(const tp_tensor *ins, tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    int64_t st[3][TP_MAX_DIMS];
    tp_status s = tp_check_rope(ins, out, st, err);
    if (s != TP_OK || tp_tensor_numel(out) == 0)
        return s;
    int64_t shape[TP_MAX_DIMS], rs[4][TP_MAX_DIMS];
    int nd = tp_rope_rows(out, (const int64_t(*)[TP_MAX_DIMS])st, shape, rs), last = out->ndim - 1;
    const int64_t *sts[4] = {rs[0], rs[1], rs[2], rs[3]};
    ops_layout l;
    ops_layout_init(&l, nd, shape, 4, sts);
    rope_job j = {.dt = out->dtype, .x = &ins[0], .cos = &ins[1], .sin = &ins[2], .out = out, .l = &l,
                  .h = out->shape[last] / 2, .xs = st[0][last], .cs = st[1][last], .ss = st[2][last]};
    return ops_run_rows_of(pool, &l, l.shape[l.nd - 1], out->shape[last], rope_part, &j, err);
}
