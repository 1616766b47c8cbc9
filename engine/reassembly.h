/* reassembly.h — the row permutation fuse_tp folds into a fused node when
 * slices and a cat only rearrange a collective's value (tp_attrs pieces).
 *
 * P is the value before (the gathered input, or the matmul product), R the
 * value after: piece j is P[piece_dim in [start_j, start_j + len_j)], laid
 * into R at offset off_j along cat_dim. A box is a per-dim [lo, hi) range;
 * these functions map boxes between P and R so a kernel can compute exactly
 * the rows it needs, where they belong, without materializing either. */
#ifndef TP_REASSEMBLY_H
#define TP_REASSEMBLY_H

#include <stdint.h>
#include <string.h>

#include "ops.h"
#include "status.h"

typedef struct {
    int64_t lo[TP_MAX_DIMS], hi[TP_MAX_DIMS];
} tp_box;

static inline tp_box tp_box_full(int nd, const int64_t *shape)
{
    tp_box b;
    memset(&b, 0, sizeof b);
    for (int i = 0; i < nd; i++)
        b.hi[i] = shape[i];
    return b;
}

/* a & b; returns 0 when empty. */
static inline int tp_box_intersect(int nd, const tp_box *a, const tp_box *b, tp_box *out)
{
    for (int i = 0; i < nd; i++) {
        out->lo[i] = a->lo[i] > b->lo[i] ? a->lo[i] : b->lo[i];
        out->hi[i] = a->hi[i] < b->hi[i] ? a->hi[i] : b->hi[i];
        if (out->lo[i] >= out->hi[i])
            return 0;
    }
    return 1;
}

/* R's shape from P's; -1 when the pieces do not cat (equal lengths are
 * needed when cat_dim differs from piece_dim). */
static inline int tp_reassembled_shape(const tp_attrs *a, int nd, const int64_t *p, int64_t *r)
{
    int g = a->piece_dim, c = a->cat_dim;
    memcpy(r, p, sizeof(int64_t) * (size_t)nd);
    if (c == g) {
        r[g] = 0;
        for (int j = 0; j < a->n_pieces; j++)
            r[g] += a->piece_len[j];
        return 0;
    }
    for (int j = 1; j < a->n_pieces; j++)
        if (a->piece_len[j] != a->piece_len[0])
            return -1;
    r[g] = a->piece_len[0];
    r[c] = p[c] * a->n_pieces;
    return 0;
}

/* Offset of piece j along cat_dim in R. */
static inline int64_t tp_piece_offset(const tp_attrs *a, int j, const int64_t *p)
{
    int64_t off = 0;
    for (int k = 0; k < j; k++)
        off += a->cat_dim == a->piece_dim ? a->piece_len[k] : p[a->cat_dim];
    return off;
}

/* Piece j's box in P coordinates. */
static inline tp_box tp_piece_box_p(const tp_attrs *a, int j, int nd, const int64_t *p)
{
    tp_box b = tp_box_full(nd, p);
    b.lo[a->piece_dim] = a->piece_start[j];
    b.hi[a->piece_dim] = a->piece_start[j] + a->piece_len[j];
    return b;
}

/* Maps a box inside piece j between P and R coordinates (to_r: P -> R). */
static inline tp_box tp_piece_map(const tp_attrs *a, int j, const int64_t *p, const tp_box *in, int nd, int to_r)
{
    tp_box b = *in;
    int g = a->piece_dim, c = a->cat_dim;
    int64_t off = tp_piece_offset(a, j, p), s = a->piece_start[j];
    int64_t dg = c == g ? off - s : -s, dc = c == g ? 0 : off;
    if (!to_r) {
        dg = -dg;
        dc = -dc;
    }
    b.lo[g] += dg;
    b.hi[g] += dg;
    if (c != g) {
        b.lo[c] += dc;
        b.hi[c] += dc;
    }
    (void)nd;
    return b;
}

/* Piece j's box in R coordinates. */
static inline tp_box tp_piece_box_r(const tp_attrs *a, int j, int nd, const int64_t *p)
{
    tp_box pb = tp_piece_box_p(a, j, nd, p);
    return tp_piece_map(a, j, p, &pb, nd, 1);
}

/* The part of t inside box (first nd dims), shifted by -origin along
 * shift_dim (-1: none): how a fused kernel names the rows it works on. */
static inline tp_tensor tp_box_view(const tp_tensor *t, const tp_box *b, int nd, int shift_dim, int64_t origin)
{
    tp_tensor v = *t;
    for (int d = 0; d < nd; d++)
        v = tp_tensor_narrow(&v, d, b->lo[d] - (d == shift_dim ? origin : 0), b->hi[d] - b->lo[d]);
    return v;
}

/* One piece of a fused node through a reassembly: the rows of the local
 * operand and where their product belongs. Each backend multiplies. */
typedef tp_status (*tp_piece_fn)(void *ctx, const tp_tensor *rows, tp_tensor *dest, tp_err *err);

/* ag_mm: rank src's rows of the gathered input (xs, its block along attr
 * dim of world blocks), piece by piece, with their permuted places in out. */
static inline tp_status tp_ag_mm_pieces(const tp_attrs *a, const tp_tensor *xs, int src, int world,
                                        const tp_tensor *out, tp_piece_fn fn, void *ctx, tp_err *err)
{
    int nd = xs->ndim, g = a->dim;
    int64_t p[TP_MAX_DIMS], r[TP_MAX_DIMS];
    memcpy(p, xs->shape, sizeof p);
    p[g] *= world;
    if (tp_reassembled_shape(a, nd, p, r) != 0)
        return tp_fail(err, TP_INVALID, "fused_all_gather_matmul: pieces of unequal length do not cat");
    r[nd - 1] = out->shape[out->ndim - 1];
    tp_tensor out_r = tp_tensor_make(out->data, out->dtype, nd, r);
    tp_box mine = tp_box_full(nd, p), part, rb;
    mine.lo[g] = src * xs->shape[g];
    mine.hi[g] = mine.lo[g] + xs->shape[g];
    for (int j = 0; j < a->n_pieces; j++) {
        tp_box pj = tp_piece_box_p(a, j, nd, p);
        if (!tp_box_intersect(nd, &mine, &pj, &part))
            continue;
        rb = tp_piece_map(a, j, p, &part, nd, 1);
        tp_tensor rows = tp_box_view(xs, &part, nd - 1, g, mine.lo[g]);
        tp_tensor dest = tp_box_view(&out_r, &rb, nd - 1, -1, 0);
        tp_status st = fn(ctx, &rows, &dest, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

/* mm_rs: the chunk of R for rank dst (slot, its block along attr dim),
 * piece by piece, from the rows of the local operand a that land there. */
static inline tp_status tp_mm_rs_pieces(const tp_attrs *at, const tp_tensor *a, int dst, const tp_tensor *slot,
                                        tp_piece_fn fn, void *ctx, tp_err *err)
{
    int nd = a->ndim, s = at->dim;
    int64_t p[TP_MAX_DIMS], r[TP_MAX_DIMS], len = slot->shape[s];
    memcpy(p, a->shape, sizeof p);
    p[nd - 1] = slot->shape[nd - 1];
    if (tp_reassembled_shape(at, nd, p, r) != 0)
        return tp_fail(err, TP_INVALID, "fused_matmul_reduce_scatter: pieces of unequal length do not cat");
    tp_box chunk = tp_box_full(nd, r), part;
    chunk.lo[s] = dst * len;
    chunk.hi[s] = chunk.lo[s] + len;
    for (int j = 0; j < at->n_pieces; j++) {
        tp_box rj = tp_piece_box_r(at, j, nd, p);
        if (!tp_box_intersect(nd, &chunk, &rj, &part))
            continue;
        tp_box pb = tp_piece_map(at, j, p, &part, nd, 0);
        tp_tensor rows = tp_box_view(a, &pb, nd - 1, -1, 0);
        tp_tensor dest = tp_box_view(slot, &part, nd - 1, s, chunk.lo[s]);
        tp_status st = fn(ctx, &rows, &dest, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

/* A fused all_gather_matmul's contiguous output seen in the gathered
 * input's coordinates: x's dims with the gather dim times world, the last
 * dim the output's width. */
static inline tp_tensor tp_gathered_view(const tp_tensor *x, int g, int world, const tp_tensor *out)
{
    int64_t shape[TP_MAX_DIMS];
    memcpy(shape, x->shape, sizeof shape);
    shape[g] *= world;
    shape[x->ndim - 1] = out->shape[out->ndim - 1];
    return tp_tensor_make(out->data, out->dtype, x->ndim, shape);
}

#endif
