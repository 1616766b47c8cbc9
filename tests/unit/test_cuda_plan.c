/* test_cuda_plan.c — the cuda backend's host-side arithmetic, on the CPU
 * (kernels/common/tp_cuda_plan.h): no device needed.
 *
 *  - cuBLASLt plans: every matmul shape and view the backend meets is run
 *    through an emulation of the column-major cuBLASLt call the plan
 *    describes (operands swapped, ld, transposes, strided batch, host loop)
 *    and compared with a plain row-major matmul over the original views;
 *  - strided layouts and block packing (the index math of the copy and
 *    pack kernels), including whole all_gather / reduce_scatter /
 *    all_to_all emulations on 2, 3 and 4 ranks against the cpu backend's
 *    definitions;
 *  - fused schedules: every peer exactly once, own shard first, slot
 *    reuse only after the GEMM that read it, send/recv pairs that meet, and
 *    a whole fused all_gather+matmul / matmul+reduce_scatter emulated with
 *    them — also the lowerings fuse_tp gives the slice/cat forms of
 *    functional collectives (gathered chunks cat on K: the rank-ordered
 *    sum; product column chunks cat before reduce_scatter: column blocks);
 *  - the reduction steps (rank order, NaN, wrap, truncating avg). */
#include <check.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "common/tp_cuda_plan.h"
#include "testutil.h"

/* ------------------------------------------------------------- helpers */

static uint32_t rng_state = 12345u;
static uint32_t rnd(void)
{
    rng_state = rng_state * 1664525u + 1013904223u;
    return rng_state >> 8;
}
static int64_t rnd_in(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd() % (uint32_t)(hi - lo + 1)); }
static float rnd_f(void) { return (float)(rnd() % 2001) / 1000.0f - 1.0f; }

static float *frand(int64_t n)
{
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    ck_assert_ptr_nonnull(p);
    for (int64_t i = 0; i < n; i++)
        p[i] = rnd_f();
    return p;
}

/* Offset of the element at multi-index idx. */
static int64_t off_of(const tp_tensor *t, const int64_t *idx)
{
    int64_t o = 0;
    for (int d = 0; d < t->ndim; d++)
        o += idx[d] * t->stride[d];
    return o;
}

/* Advances a row-major multi-index over shape; returns 0 after the last. */
static int next_idx(int64_t *idx, int nd, const int64_t *shape)
{
    for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < shape[d])
            return 1;
        idx[d] = 0;
    }
    return 0;
}

/* t restricted to [start, start+len) along dim. */
static tp_tensor narrow(const tp_tensor *t, int dim, int64_t start, int64_t len)
{
    tp_tensor v = *t;
    v.data = (char *)t->data + start * t->stride[dim] * (int64_t)tp_dtype_size(t->dtype);
    v.shape[dim] = len;
    return v;
}

/* ---------------------------------------------------- cuBLASLt emulation */

/* What cublasLtMatmul computes for one column-major call the plan
 * describes (checks the layouts are ones cuBLASLt would accept):
 * D[i + j*ldd] = sum_p op(A)(i, p) op(B)(p, j) + beta * D. */
static void lt_emulate(const tp_gemm_plan *g, const float *A, const float *B, float *D, int64_t batch, int64_t sa,
                       int64_t sb, int64_t sd, float beta)
{
    const tp_lt_mat *a = &g->a, *b = &g->b, *d = &g->d;
    ck_assert_int_eq(a->trans ? a->cols : a->rows, g->m);
    ck_assert_int_eq(a->trans ? a->rows : a->cols, g->k);
    ck_assert_int_eq(b->trans ? b->cols : b->rows, g->k);
    ck_assert_int_eq(b->trans ? b->rows : b->cols, g->n);
    ck_assert_int_eq(d->rows, g->m);
    ck_assert_int_eq(d->cols, g->n);
    ck_assert_int_eq(d->trans, 0);
    ck_assert(a->ld >= a->rows && b->ld >= b->rows && d->ld >= d->rows);
    for (int64_t q = 0; q < batch; q++)
        for (int64_t i = 0; i < g->m; i++)
            for (int64_t j = 0; j < g->n; j++) {
                double s = 0;
                for (int64_t p = 0; p < g->k; p++) {
                    float av = a->trans ? A[q * sa + p + i * a->ld] : A[q * sa + i + p * a->ld];
                    float bv = b->trans ? B[q * sb + j + p * b->ld] : B[q * sb + p + j * b->ld];
                    s += (double)av * bv;
                }
                float *o = &D[q * sd + i + j * d->ld];
                *o = (float)s + beta * *o;
            }
}

/* out = a . b over views with NumPy batch broadcasting, the definition. */
static void ref_matmul(const tp_tensor *a, const tp_tensor *b, int tb, tp_tensor *out)
{
    int no = out->ndim, na = a->ndim, nbd = b->ndim;
    int64_t K = a->shape[na - 1], idx[TP_MAX_DIMS] = {0};
    do {
        int64_t ia[TP_MAX_DIMS] = {0}, ib[TP_MAX_DIMS] = {0};
        for (int d = 0; d < na - 2; d++)
            ia[d] = a->shape[d] == 1 ? 0 : idx[no - na + d];
        for (int d = 0; d < nbd - 2; d++)
            ib[d] = b->shape[d] == 1 ? 0 : idx[no - nbd + d];
        double s = 0;
        for (int64_t k = 0; k < K; k++) {
            ia[na - 2] = idx[no - 2];
            ia[na - 1] = k;
            ib[nbd - 2] = tb ? idx[no - 1] : k;
            ib[nbd - 1] = tb ? k : idx[no - 1];
            s += (double)((float *)a->data)[off_of(a, ia)] * ((float *)b->data)[off_of(b, ib)];
        }
        ((float *)out->data)[off_of(out, idx)] = (float)s;
    } while (next_idx(idx, no, out->shape));
}

static tp_tensor contiguous_copy(const tp_tensor *t)
{
    tp_tensor c = tp_tensor_make(malloc((size_t)(tp_tensor_numel(t) + 1) * sizeof(float)), TP_F32, t->ndim, t->shape);
    tp_tensor_copy(&c, t);
    return c;
}

/* Runs a, b -> out (+ beta * out) the way cu_matmul does: problem, plan
 * (packing what the plan refuses), then every call of the problem through
 * the emulation.
 * Returns how many operands had to be packed. */
/* Entries one call may take, when a test lowers TP_MM_BATCH_MAX (0: not) to
 * reach the split of a batch over cuBLASLt's int32 count without 2^31
 * matrices. */
static int64_t test_batch_max;

static int lt_matmul(const tp_tensor *a0, const tp_tensor *b0, int tb, tp_tensor *out, float beta, int64_t *n_calls)
{
    tp_tensor a = *a0, b = *b0, ca = {0}, cb = {0};
    tp_mm_problem p;
    tp_gemm_plan g;
    ck_assert_int_eq(tp_mm_problem_make(&a, &b, tb, out, &p), 0);
    if (test_batch_max)
        p.batch_max = test_batch_max;
    int bad = tp_gemm_plan_make(p.M, p.N, p.K, p.sam, p.sak, p.sbk, p.sbn, p.sdm, p.sdn, &g), packed = 0;
    ck_assert_int_eq(bad & 4, 0);
    if (bad & 1) {
        a = ca = contiguous_copy(&a);
        packed++;
    }
    if (bad & 2) {
        b = cb = contiguous_copy(&b);
        packed++;
    }
    if (bad) {
        ck_assert_int_eq(tp_mm_problem_make(&a, &b, tb, out, &p), 0);
        if (test_batch_max)
            p.batch_max = test_batch_max;
        ck_assert_int_eq(tp_gemm_plan_make(p.M, p.N, p.K, p.sam, p.sak, p.sbk, p.sbn, p.sdm, p.sdn, &g), 0);
    }
    *n_calls = tp_mm_n_calls(&p);
    for (int64_t c = 0; c < tp_mm_n_calls(&p); c++) {
        int64_t oa, ob, od;
        tp_mm_call_offsets(&p, c, &oa, &ob, &od);
        int64_t nb = tp_mm_call_batch(&p, c);
        ck_assert(nb >= 1 && nb <= p.batch_max);
        /* cuBLASLt's A is the graph's B: operands and batch strides swap */
        lt_emulate(&g, (float *)b.data + ob, (float *)a.data + oa, (float *)out->data + od, nb, p.bsb, p.bsa, p.bsd,
                   beta);
    }
    free(ca.data);
    free(cb.data);
    return packed;
}

/* A view of `shape` into a fresh buffer: dims permuted by perm (the
 * buffer holds the permuted-contiguous layout) and each dim padded by
 * pad[d] extra elements of stride (a slice of a larger tensor). */
static tp_tensor make_view(int nd, const int64_t *shape, const int *perm, const int64_t *pad, float **buf)
{
    int64_t full[TP_MAX_DIMS], st[TP_MAX_DIMS], s = 1;
    for (int d = 0; d < nd; d++)
        full[d] = shape[d] + (pad ? pad[d] : 0);
    for (int k = nd - 1; k >= 0; k--) { /* perm[k] is the k-th dim in memory order */
        st[perm[k]] = s;
        s *= full[perm[k]];
    }
    *buf = frand(s);
    tp_tensor t;
    memset(&t, 0, sizeof t);
    t.data = *buf;
    t.dtype = TP_F32;
    t.ndim = nd;
    for (int d = 0; d < nd; d++) {
        t.shape[d] = shape[d];
        t.stride[d] = st[d];
    }
    return t;
}

static const int ID[TP_MAX_DIMS] = {0, 1, 2, 3, 4, 5, 6, 7};

/* out view of shape; returns the buffer (zeroed) through buf. */
static tp_tensor make_out(int nd, const int64_t *shape, int64_t pad_last, float **buf)
{
    int64_t pad[TP_MAX_DIMS] = {0};
    pad[nd - 1] = pad_last;
    tp_tensor t = make_view(nd, shape, ID, pad, buf);
    int64_t n = 1;
    for (int d = 0; d < nd; d++)
        n *= shape[d] + pad[d];
    memset(*buf, 0, (size_t)n * sizeof(float));
    return t;
}

static void check_same(const tp_tensor *x, const tp_tensor *y)
{
    int64_t idx[TP_MAX_DIMS] = {0};
    do {
        float u = ((float *)x->data)[off_of(x, idx)], v = ((float *)y->data)[off_of(y, idx)];
        ck_assert_msg(fabsf(u - v) <= 1e-4f * (1.0f + fabsf(v)), "%g vs %g", u, v);
    } while (next_idx(idx, x->ndim, x->shape));
}

/* Runs one case through the plan and the reference. */
static int64_t run_case(const tp_tensor *a, const tp_tensor *b, int tb, int nd_out, const int64_t *oshape,
                        int64_t pad_last, int *packed)
{
    float *o1, *o2;
    tp_tensor out1 = make_out(nd_out, oshape, pad_last, &o1), out2 = make_out(nd_out, oshape, pad_last, &o2);
    int64_t calls;
    int pk = lt_matmul(a, b, tb, &out1, 0.0f, &calls);
    if (packed)
        *packed = pk;
    ref_matmul(a, b, tb, &out2);
    check_same(&out1, &out2);
    free(o1);
    free(o2);
    return calls;
}

/* ------------------------------------------------------------ gemm tests */

START_TEST(gemm_row_major)
{
    float *ab, *bb;
    int64_t as[2] = {5, 7}, bs[2] = {7, 3}, os[2] = {5, 3};
    tp_tensor a = make_view(2, as, ID, NULL, &ab), b = make_view(2, bs, ID, NULL, &bb);
    tp_mm_problem p;
    tp_gemm_plan g;
    tp_tensor o = tp_tensor_make(NULL, TP_F32, 2, os);
    ck_assert_int_eq(tp_mm_problem_make(&a, &b, 0, &o, &p), 0);
    ck_assert_int_eq(tp_gemm_plan_make(p.M, p.N, p.K, p.sam, p.sak, p.sbk, p.sbn, p.sdm, p.sdn, &g), 0);
    /* D^T = B^T A^T: m = N, n = M, both operands as stored, ld = row lengths */
    ck_assert_int_eq(g.m, 3);
    ck_assert_int_eq(g.n, 5);
    ck_assert_int_eq(g.k, 7);
    ck_assert_int_eq(g.a.trans, 0);
    ck_assert_int_eq(g.b.trans, 0);
    ck_assert_int_eq(g.a.ld, 3);
    ck_assert_int_eq(g.b.ld, 7);
    ck_assert_int_eq(g.d.ld, 3);
    ck_assert_int_eq(run_case(&a, &b, 0, 2, os, 0, NULL), 1);
    free(ab);
    free(bb);
}
END_TEST

START_TEST(gemm_transposes)
{
    float *ab, *bb;
    int64_t as[2] = {6, 4}, bs[2] = {5, 4}, os[2] = {6, 5};
    int t2[2] = {1, 0};
    /* a stored column-major (a transposed view), b [N, K] with transpose_b */
    tp_tensor a = make_view(2, as, t2, NULL, &ab), b = make_view(2, bs, ID, NULL, &bb);
    tp_gemm_plan g;
    tp_mm_problem p;
    tp_tensor o = tp_tensor_make(NULL, TP_F32, 2, os);
    ck_assert_int_eq(tp_mm_problem_make(&a, &b, 1, &o, &p), 0);
    ck_assert_int_eq(tp_gemm_plan_make(p.M, p.N, p.K, p.sam, p.sak, p.sbk, p.sbn, p.sdm, p.sdn, &g), 0);
    ck_assert_int_eq(g.a.trans, 1); /* graph B stored [N, K]: column-major B[K, N] */
    ck_assert_int_eq(g.b.trans, 1); /* graph A column-major */
    run_case(&a, &b, 1, 2, os, 0, NULL);
    /* and a column-major b without transpose_b */
    float *cb;
    int64_t cs[2] = {4, 5};
    tp_tensor c = make_view(2, cs, t2, NULL, &cb);
    run_case(&a, &c, 0, 2, os, 0, NULL);
    free(ab);
    free(bb);
    free(cb);
}
END_TEST

/* Slices (ld > row length) on every operand, and an output column block as
 * the fused kernels write it (ldc = the fused width). */
START_TEST(gemm_leading_dims_and_column_block)
{
    float *ab, *bb;
    int64_t as[2] = {5, 6}, bs[2] = {6, 4}, os[2] = {5, 4};
    int64_t pa[2] = {2, 3}, pb[2] = {1, 5};
    tp_tensor a = make_view(2, as, ID, pa, &ab), b = make_view(2, bs, ID, pb, &bb);
    run_case(&a, &b, 0, 2, os, 7, NULL);
    free(ab);
    free(bb);
}
END_TEST

/* [B, S, K] x [K, N]: the batch folds into M, one call. */
START_TEST(gemm_batch_folds_into_m)
{
    float *ab, *bb;
    int64_t as[3] = {3, 4, 5}, bs[2] = {5, 6}, os[3] = {3, 4, 6};
    tp_tensor a = make_view(3, as, ID, NULL, &ab), b = make_view(2, bs, ID, NULL, &bb);
    tp_mm_problem p;
    tp_tensor o = tp_tensor_make(NULL, TP_F32, 3, os);
    ck_assert_int_eq(tp_mm_problem_make(&a, &b, 0, &o, &p), 0);
    ck_assert_int_eq(p.M, 12);
    ck_assert_int_eq(p.batch, 1);
    ck_assert_int_eq(run_case(&a, &b, 0, 3, os, 0, NULL), 1);
    /* a single row per batch entry (M = 1) folds too */
    int64_t as1[3] = {7, 1, 5}, os1[3] = {7, 1, 6};
    float *a1b;
    tp_tensor a1 = make_view(3, as1, ID, NULL, &a1b);
    ck_assert_int_eq(run_case(&a1, &b, 0, 3, os1, 0, NULL), 1);
    free(ab);
    free(bb);
    free(a1b);
}
END_TEST

/* Attention-like [B, H, S, D] x [B, H, D, T] from permuted views: the
 * batch dims do not coalesce, so one is strided-batched and one looped. */
START_TEST(gemm_batched_permuted)
{
    float *qb, *kb;
    int64_t qs[4] = {2, 3, 4, 5}, ks[4] = {2, 3, 5, 6}, os[4] = {2, 3, 4, 6};
    int q_perm[4] = {0, 2, 1, 3}; /* memory [B, S, H, D] */
    int k_perm[4] = {0, 3, 1, 2}; /* memory [B, T, H, D]: k^T view */
    tp_tensor q = make_view(4, qs, q_perm, NULL, &qb), k = make_view(4, ks, k_perm, NULL, &kb);
    int64_t calls = run_case(&q, &k, 0, 4, os, 0, NULL);
    ck_assert_int_eq(calls, 2); /* B looped, H strided-batched */
    free(qb);
    free(kb);
}
END_TEST

/* A broadcast b batch with an a that does not fold: unrolled calls. */
START_TEST(gemm_broadcast_batch)
{
    float *ab, *bb, *cb;
    int64_t as[3] = {3, 4, 5}, bs[3] = {1, 5, 2}, os[3] = {3, 4, 2};
    int64_t pa[3] = {0, 0, 2}; /* rows of a padded: no fold */
    tp_tensor a = make_view(3, as, ID, pa, &ab), b = make_view(3, bs, ID, NULL, &bb);
    ck_assert_int_eq(run_case(&a, &b, 0, 3, os, 0, NULL), 1); /* padded rows stay evenly spaced: folds */
    int perm[3] = {1, 0, 2}; /* a memory [S, B, K]: batch stride K, row stride B*K */
    tp_tensor c = make_view(3, as, perm, NULL, &cb);
    ck_assert_int_eq(run_case(&c, &b, 0, 3, os, 0, NULL), 3);
    free(ab);
    free(bb);
    free(cb);
}
END_TEST

/* A strided batch over the entries one call may take (cuBLASLt's int32
 * count, lowered here to 2) goes in several calls, the last with the rest:
 * every entry computed once, none past the end. */
START_TEST(gemm_batch_split_at_the_count_limit)
{
    float *ab, *bb, *pb;
    int64_t as[3] = {5, 4, 3}, bs[3] = {5, 3, 2}, os[3] = {5, 4, 2};
    tp_tensor a = make_view(3, as, ID, NULL, &ab), b = make_view(3, bs, ID, NULL, &bb);
    ck_assert_int_eq(run_case(&a, &b, 0, 3, os, 0, NULL), 1);
    test_batch_max = 2;
    ck_assert_int_eq(run_case(&a, &b, 0, 3, os, 0, NULL), 3); /* 2 + 2 + 1 */
    test_batch_max = 5;
    ck_assert_int_eq(run_case(&a, &b, 0, 3, os, 0, NULL), 1);
    /* with an outer loop too: [B, H, S, D] from a permuted view, H batched */
    int64_t qs[4] = {2, 3, 4, 5}, ks[4] = {2, 3, 5, 6}, qos[4] = {2, 3, 4, 6};
    int q_perm[4] = {0, 2, 1, 3}, k_perm[4] = {0, 3, 1, 2};
    float *kb;
    tp_tensor q = make_view(4, qs, q_perm, NULL, &pb), k = make_view(4, ks, k_perm, NULL, &kb);
    test_batch_max = 2;
    ck_assert_int_eq(run_case(&q, &k, 0, 4, qos, 0, NULL), 4); /* B 2 x H in calls of 2 + 1 */
    test_batch_max = 0;
    free(ab);
    free(bb);
    free(pb);
    free(kb);
}
END_TEST

START_TEST(gemm_packs_unusable_operands)
{
    float *ab, *bb;
    int64_t full[2] = {8, 10};
    tp_tensor big = make_view(2, full, ID, NULL, &ab);
    tp_tensor a = big; /* every other row and column: no unit stride */
    a.shape[0] = 4;
    a.shape[1] = 5;
    a.stride[0] = 20;
    a.stride[1] = 2;
    int64_t bs[2] = {5, 3}, os[2] = {4, 3};
    tp_tensor b = make_view(2, bs, ID, NULL, &bb);
    int packed = 0;
    run_case(&a, &b, 0, 2, os, 0, &packed);
    ck_assert_int_eq(packed, 1);
    /* a broadcast row stride (0) cannot be a leading dim either */
    tp_tensor r = b;
    int64_t rs[2] = {4, 5};
    tp_tensor bc = big;
    bc.shape[0] = rs[0];
    bc.shape[1] = rs[1];
    bc.stride[0] = 0;
    bc.stride[1] = 1;
    run_case(&bc, &r, 0, 2, os, 0, &packed);
    ck_assert_int_eq(packed, 1);
    free(ab);
    free(bb);
}
END_TEST

START_TEST(gemm_degenerate_sizes)
{
    int64_t dims[][3] = {{1, 1, 1}, {1, 5, 3}, {4, 1, 3}, {4, 5, 1}, {1, 1, 7}};
    for (size_t c = 0; c < sizeof dims / sizeof dims[0]; c++) {
        float *ab, *bb;
        int64_t as[2] = {dims[c][0], dims[c][2]}, bs[2] = {dims[c][2], dims[c][1]}, os[2] = {dims[c][0], dims[c][1]};
        tp_tensor a = make_view(2, as, ID, NULL, &ab), b = make_view(2, bs, ID, NULL, &bb);
        run_case(&a, &b, 0, 2, os, 0, NULL);
        run_case(&a, &b, 0, 2, os, 3, NULL);
        free(ab);
        free(bb);
    }
}
END_TEST

/* Random shapes, permutations, paddings and transpose_b. */
START_TEST(gemm_random_views)
{
    for (int it = 0; it < 300; it++) {
        int nb = (int)rnd_in(0, 2), tb = (int)rnd_in(0, 1);
        int64_t M = rnd_in(1, 6), N = rnd_in(1, 6), K = rnd_in(1, 6), batch[2];
        for (int d = 0; d < nb; d++)
            batch[d] = rnd_in(1, 3);
        int64_t as[4], bs[4], os[4], pa[4] = {0}, pb[4] = {0};
        int pra[4], prb[4];
        for (int d = 0; d < nb; d++) {
            as[d] = batch[d];
            bs[d] = rnd_in(0, 3) == 0 ? 1 : batch[d]; /* sometimes broadcast */
            os[d] = batch[d];
        }
        as[nb] = M;
        as[nb + 1] = K;
        bs[nb] = tb ? N : K;
        bs[nb + 1] = tb ? K : N;
        os[nb] = M;
        os[nb + 1] = N;
        for (int d = 0; d < nb + 2; d++) {
            pra[d] = prb[d] = d;
            pa[d] = rnd_in(0, 3) == 0 ? rnd_in(1, 2) : 0;
            pb[d] = rnd_in(0, 3) == 0 ? rnd_in(1, 2) : 0;
        }
        for (int s = 0; s < 3; s++) { /* random memory orders */
            int i = (int)rnd_in(0, nb + 1), j = (int)rnd_in(0, nb + 1), t = pra[i];
            pra[i] = pra[j];
            pra[j] = t;
            i = (int)rnd_in(0, nb + 1);
            j = (int)rnd_in(0, nb + 1);
            t = prb[i];
            prb[i] = prb[j];
            prb[j] = t;
        }
        float *ab, *bb;
        tp_tensor a = make_view(nb + 2, as, pra, pa, &ab), b = make_view(nb + 2, bs, prb, pb, &bb);
        run_case(&a, &b, tb, nb + 2, os, rnd_in(0, 2), NULL);
        free(ab);
        free(bb);
    }
}
END_TEST

START_TEST(gemm_alignment)
{
    ck_assert_uint_eq(tp_gemm_alignment(0x10000, 1024, 0), 256);
    ck_assert_uint_eq(tp_gemm_alignment(0x10040, 1024, 0), 64);
    ck_assert_uint_eq(tp_gemm_alignment(0x10000, 6, 0), 2);  /* ld of 3 halves */
    ck_assert_uint_eq(tp_gemm_alignment(0x10000, 64, 12), 4); /* batch stride */
    ck_assert_uint_eq(tp_gemm_alignment(0x10002, 64, 0), 2);
}
END_TEST

/* ---------------------------------------------------------- layouts, packs */

START_TEST(layout_offsets_match_strides)
{
    for (int it = 0; it < 200; it++) {
        int nd = (int)rnd_in(1, 5);
        int64_t shape[TP_MAX_DIMS], s1[TP_MAX_DIMS], s2[TP_MAX_DIMS];
        for (int d = 0; d < nd; d++) {
            shape[d] = rnd_in(1, 4);
            s1[d] = rnd_in(0, 3) == 0 ? 0 : rnd_in(1, 50);
        }
        tp_tensor c = tp_tensor_make(NULL, TP_F32, nd, shape);
        memcpy(s2, c.stride, sizeof s2);
        const int64_t *st[2] = {s1, s2};
        tp_layout l;
        tp_layout_init(&l, nd, shape, 2, st);
        ck_assert_int_eq(tp_layout_numel(&l), tp_tensor_numel(&c));
        int64_t idx[TP_MAX_DIMS] = {0}, i = 0;
        do {
            int64_t o1 = 0, o2 = 0;
            for (int d = 0; d < nd; d++) {
                o1 += idx[d] * s1[d];
                o2 += idx[d] * s2[d];
            }
            ck_assert_int_eq(tp_layout_offset(&l, 0, i), o1);
            ck_assert_int_eq(tp_layout_offset(&l, 1, i), o2);
            i++;
        } while (next_idx(idx, nd, shape));
    }
}
END_TEST

START_TEST(broadcast_rules)
{
    int64_t shape[3] = {2, 3, 4}, out[3];
    int64_t s1[1] = {4};
    tp_tensor v = tp_tensor_make(NULL, TP_F32, 1, s1);
    ck_assert_int_eq(tp_broadcast_strides(&v, 3, shape, out), 0);
    ck_assert(out[0] == 0 && out[1] == 0 && out[2] == 1);
    int64_t s2[3] = {2, 1, 4};
    tp_tensor w = tp_tensor_make(NULL, TP_F32, 3, s2);
    ck_assert_int_eq(tp_broadcast_strides(&w, 3, shape, out), 0);
    ck_assert(out[0] == 4 && out[1] == 0 && out[2] == 1);
    int64_t s3[1] = {3};
    tp_tensor bad = tp_tensor_make(NULL, TP_F32, 1, s3);
    ck_assert_int_eq(tp_broadcast_strides(&bad, 3, shape, out), -1);
}
END_TEST

START_TEST(span_of_views)
{
    int64_t shape[2] = {3, 4}, lo;
    tp_tensor t = tp_tensor_make((void *)0x1000, TP_F32, 2, shape);
    ck_assert_int_eq(tp_tensor_span(&t, &lo), 48);
    ck_assert_int_eq(lo, 0);
    t.stride[1] = -1; /* reversed columns: the span reaches back */
    ck_assert_int_eq(tp_tensor_span(&t, &lo), (2 * 4 + 3 + 1) * 4);
    ck_assert_int_eq(lo, -3);
    t.shape[0] = 0;
    ck_assert_int_eq(tp_tensor_span(&t, &lo), 0);
}
END_TEST

/* A random contiguous shape of nd dims whose `dim` divides by d. */
static void rand_shape(int nd, int dim, int d, int64_t *shape)
{
    for (int i = 0; i < nd; i++)
        shape[i] = rnd_in(1, 3);
    shape[dim] = d * rnd_in(1, 3);
}

START_TEST(block_pack_round_trips)
{
    for (int d = 2; d <= 4; d++)
        for (int it = 0; it < 40; it++) {
            int nd = (int)rnd_in(1, 4), dim = (int)rnd_in(0, nd - 1);
            int64_t shape[TP_MAX_DIMS], outer, len, inner;
            rand_shape(nd, dim, d, shape);
            tp_block_dims(nd, shape, dim, d, &outer, &len, &inner);
            int64_t n = outer * d * len * inner;
            char *seen = calloc((size_t)n, 1);
            for (int64_t i = 0; i < n; i++) {
                int64_t p = tp_block_packed_index(i, outer, len, inner, d);
                ck_assert(p >= 0 && p < n && !seen[p]);
                seen[p] = 1;
                ck_assert_int_eq(tp_block_natural_index(p, outer, len, inner, d), i);
                if (tp_block_is_identity(outer, d))
                    ck_assert_int_eq(p, i);
            }
            free(seen);
        }
}
END_TEST

/* The pack kernel's loop on the CPU: to_packed or back. */
static void pack(const float *src, float *dst, int64_t outer, int64_t len, int64_t inner, int d, int to_packed)
{
    for (int64_t i = 0; i < outer * d * len * inner; i++) {
        int64_t p = tp_block_packed_index(i, outer, len, inner, d);
        if (to_packed)
            dst[p] = src[i];
        else
            dst[i] = src[p];
    }
}

/* all_gather on dim: NCCL's rank-major gather, then unpack = the cpu
 * definition (rank r's input at [r*len, (r+1)*len) of dim). */
START_TEST(all_gather_via_pack)
{
    for (int d = 2; d <= 4; d++)
        for (int it = 0; it < 20; it++) {
            int nd = (int)rnd_in(1, 4), dim = (int)rnd_in(0, nd - 1);
            int64_t in_shape[TP_MAX_DIMS], out_shape[TP_MAX_DIMS], outer, len, inner;
            for (int i = 0; i < nd; i++)
                in_shape[i] = out_shape[i] = rnd_in(1, 3);
            out_shape[dim] *= d;
            tp_tensor in0 = tp_tensor_make(NULL, TP_F32, nd, in_shape);
            int64_t n = tp_tensor_numel(&in0);
            float *g = frand(n * d), *out = malloc((size_t)(n * d) * sizeof(float));
            tp_block_dims(nd, out_shape, dim, d, &outer, &len, &inner);
            pack(g, out, outer, len, inner, d, 0);
            tp_tensor o = tp_tensor_make(out, TP_F32, nd, out_shape);
            for (int r = 0; r < d; r++) {
                tp_tensor in = tp_tensor_make(g + r * n, TP_F32, nd, in_shape);
                tp_tensor part = narrow(&o, dim, r * in_shape[dim], in_shape[dim]);
                check_same(&part, &in);
            }
            free(g);
            free(out);
        }
}
END_TEST

/* reduce_scatter on dim: pack, then NCCL's block r goes to rank r = the
 * cpu definition (rank r reduces narrow(in, dim, r*len, len)). */
START_TEST(reduce_scatter_via_pack)
{
    for (int d = 2; d <= 4; d++)
        for (int it = 0; it < 20; it++) {
            int nd = (int)rnd_in(1, 4), dim = (int)rnd_in(0, nd - 1);
            int64_t shape[TP_MAX_DIMS], outer, len, inner;
            rand_shape(nd, dim, d, shape);
            tp_tensor t = tp_tensor_make(NULL, TP_F32, nd, shape);
            int64_t n = tp_tensor_numel(&t), blk = n / d;
            float *in = frand(n), *packed = malloc((size_t)n * sizeof(float));
            tp_block_dims(nd, shape, dim, d, &outer, &len, &inner);
            pack(in, packed, outer, len, inner, d, 1);
            t.data = in;
            for (int r = 0; r < d; r++) {
                tp_tensor want = narrow(&t, dim, r * len, len);
                tp_tensor got = tp_tensor_make(packed + r * blk, TP_F32, nd, want.shape);
                check_same(&got, &want);
            }
            free(in);
            free(packed);
        }
}
END_TEST

/* all_to_all: pack by split_dim, exchange block p with rank p, unpack by
 * concat_dim = collectives.c (out block j along concat_dim = rank j's
 * block `rank` along split_dim). */
START_TEST(all_to_all_via_pack)
{
    for (int d = 2; d <= 4; d++)
        for (int it = 0; it < 20; it++) {
            int nd = (int)rnd_in(1, 3), s = (int)rnd_in(0, nd - 1), c = (int)rnd_in(0, nd - 1);
            int64_t ishape[TP_MAX_DIMS], oshape[TP_MAX_DIMS], so, sl, si, co, cl, ci;
            rand_shape(nd, s, d, ishape);
            memcpy(oshape, ishape, sizeof oshape);
            oshape[s] /= d;
            oshape[c] *= d;
            tp_tensor t = tp_tensor_make(NULL, TP_F32, nd, ishape);
            int64_t n = tp_tensor_numel(&t), blk = n / d;
            float *in[4], *send[4], *recv[4], *out[4];
            tp_block_dims(nd, ishape, s, d, &so, &sl, &si);
            tp_block_dims(nd, oshape, c, d, &co, &cl, &ci);
            for (int r = 0; r < d; r++) {
                in[r] = frand(n);
                send[r] = malloc((size_t)n * sizeof(float));
                recv[r] = malloc((size_t)n * sizeof(float));
                out[r] = malloc((size_t)n * sizeof(float));
                pack(in[r], send[r], so, sl, si, d, 1);
            }
            for (int r = 0; r < d; r++) /* rank r receives block r of every p into slot p */
                for (int p = 0; p < d; p++)
                    memcpy(recv[r] + p * blk, send[p] + r * blk, (size_t)blk * sizeof(float));
            for (int r = 0; r < d; r++) {
                pack(recv[r], out[r], co, cl, ci, d, 0);
                tp_tensor o = tp_tensor_make(out[r], TP_F32, nd, oshape);
                int64_t chunk = ishape[s] / d, clen = s == c ? chunk : ishape[c];
                for (int j = 0; j < d; j++) {
                    tp_tensor src = tp_tensor_make(in[j], TP_F32, nd, ishape);
                    tp_tensor want = narrow(&src, s, r * chunk, chunk);
                    tp_tensor got = narrow(&o, c, j * clen, clen);
                    check_same(&got, &want);
                }
            }
            for (int r = 0; r < d; r++) {
                free(in[r]);
                free(send[r]);
                free(recv[r]);
                free(out[r]);
            }
        }
}
END_TEST

/* -------------------------------------------------------------- schedules */

START_TEST(ag_schedule_covers_every_rank_once)
{
    for (int d = 1; d <= 8; d++)
        for (int r = 0; r < d; r++)
            for (int kg = 0; kg < 2; kg++) {
                int seen[8] = {0};
                for (int s = 0; s < d; s++) {
                    int src = tp_ag_src(r, d, s, kg);
                    ck_assert(src >= 0 && src < d);
                    seen[src]++;
                }
                for (int p = 0; p < d; p++)
                    ck_assert_int_eq(seen[p], 1);
                if (!kg)
                    ck_assert_int_eq(tp_ag_src(r, d, 0, 0), r); /* own shard first */
                else
                    for (int s = 0; s < d; s++)
                        ck_assert_int_eq(tp_ag_src(r, d, s, 1), s); /* rank order */
            }
}
END_TEST

/* Two pulls in flight never share a slot, and a pull waits exactly for the
 * last GEMM that read its slot. */
START_TEST(ag_slots_are_reused_safely)
{
    for (int c = 0; c < 64; c++) {
        int k = tp_ag_stage_slot(c), w = tp_ag_pull_waits_for(c);
        ck_assert(k == 0 || k == 1);
        if (c > 0)
            ck_assert_int_ne(k, tp_ag_stage_slot(c - 1));
        int last = -1;
        for (int e = 0; e < c; e++)
            if (tp_ag_stage_slot(e) == k)
                last = e;
        ck_assert_int_eq(w, last);
    }
}
END_TEST

START_TEST(rs_schedule_pairs_meet)
{
    for (int d = 1; d <= 8; d++)
        for (int r = 0; r < d; r++) {
            int seen[8] = {0};
            for (int s = 0; s < d; s++) {
                int dst = tp_rs_dst(r, d, s), src = tp_rs_src(r, d, s);
                seen[dst]++;
                ck_assert_int_eq(tp_rs_dst(src, d, s), r); /* who sends to r at step s */
                ck_assert_int_eq(tp_rs_step_of(r, d, src), s);
                if (s < d - 1)
                    ck_assert_int_ne(dst, r);
            }
            ck_assert_int_eq(tp_rs_dst(r, d, d - 1), r); /* own chunk last */
            for (int p = 0; p < d; p++)
                ck_assert_int_eq(seen[p], 1);
        }
}
END_TEST

/* Row-major [m,k] x [k,n] into a row view with ldc. */
static void mm(const float *a, const float *b, float *c, int64_t m, int64_t k, int64_t n, int64_t ldc, int acc)
{
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++) {
            double s = acc ? c[i * ldc + j] : 0;
            for (int64_t p = 0; p < k; p++)
                s += (double)a[i * k + p] * b[p * n + j];
            c[i * ldc + j] = (float)s;
        }
}

/* Rank r's view of shard src at a fused gather step: its own x, or the
 * peer's copied (pulled) into the next of two slots of n floats. */
static const float *pull_shard(float *const *x, int r, int src, float slot[2][64], int *pulls, int64_t n)
{
    if (src == r)
        return x[r];
    int k = tp_ag_stage_slot((*pulls)++);
    memcpy(slot[k], x[src], sizeof(float) * (size_t)n);
    return slot[k];
}

/* Element i of rank r's reduced chunk as the reduce kernel indexes it: its
 * own chunk from its workspace, the others from the stage slot of the step
 * they arrived at, folded in rank order. */
static float reduce_received(const float *own, const float *stage, int r, int d, int64_t chunk, int64_t i, int red)
{
    float acc = 0;
    for (int src = 0; src < d; src++) {
        float v = src == r ? own[i] : stage[(int64_t)tp_rs_step_of(r, d, src) * chunk + i];
        acc = src == 0 ? v : tp_reduce_step_f32(acc, v, red);
    }
    return tp_reduce_finish_f32(acc, red, d);
}

/* The fused all_gather+matmul as the backend schedules it (rows gathered),
 * with the pulled shards cycling through two slots, vs gather-then-matmul. */
START_TEST(fused_ag_mm_emulated)
{
    for (int d = 2; d <= 4; d++) {
        int64_t len = 3, K = 4, N = 5;
        float *x[4], *w = frand(K * N), *full = malloc(sizeof(float) * (size_t)(d * len * K));
        for (int r = 0; r < d; r++) {
            x[r] = frand(len * K);
            memcpy(full + r * len * K, x[r], sizeof(float) * (size_t)(len * K));
        }
        float *want = malloc(sizeof(float) * (size_t)(d * len * N));
        mm(full, w, want, d * len, K, N, N, 0);
        for (int r = 0; r < d; r++) {
            float *out = calloc((size_t)(d * len * N), sizeof(float)), slot[2][64];
            int pulls = 0;
            for (int s = 0; s < d; s++) {
                int src = tp_ag_src(r, d, s, 0);
                const float *xs = pull_shard(x, r, src, slot, &pulls, len * K);
                mm(xs, w, out + src * len * N, len, K, N, N, 0);
            }
            for (int64_t i = 0; i < d * len * N; i++)
                ck_assert(fabsf(out[i] - want[i]) < 1e-5f);
            free(out);
        }
        for (int r = 0; r < d; r++)
            free(x[r]);
        free(w);
        free(full);
        free(want);
    }
}
END_TEST

/* The fused matmul+reduce_scatter: chunks computed in tp_rs_dst order,
 * step-s chunks exchanged into the receiver's stage slot s, reduced with
 * the reduce kernel's indexing, vs matmul-then-reduce_scatter. */
START_TEST(fused_mm_rs_emulated)
{
    for (int d = 2; d <= 4; d++) {
        int64_t len = 2, K = 3, N = 4, chunk = len * N;
        float *a[4], *w[4], *ws[4], *stage[4];
        for (int r = 0; r < d; r++) {
            a[r] = frand(d * len * K);
            w[r] = frand(K * N);
            ws[r] = calloc((size_t)(d * chunk), sizeof(float));
            stage[r] = calloc((size_t)((d - 1) * chunk), sizeof(float));
        }
        for (int s = 0; s < d; s++) /* every rank runs step s */
            for (int r = 0; r < d; r++) {
                int dst = tp_rs_dst(r, d, s);
                mm(a[r] + dst * len * K, w[r], ws[r] + dst * chunk, len, K, N, N, 0);
                if (s < d - 1) /* send to dst, which receives it as its step-s chunk */
                    memcpy(stage[dst] + s * chunk, ws[r] + dst * chunk, sizeof(float) * (size_t)chunk);
            }
        for (int r = 0; r < d; r++) {
            float want[64] = {0}, part[64];
            for (int q = 0; q < d; q++) {
                mm(a[q] + r * len * K, w[q], part, len, K, N, N, 0);
                for (int64_t i = 0; i < chunk; i++)
                    want[i] += part[i];
            }
            for (int64_t i = 0; i < chunk; i++)
                ck_assert(fabsf(reduce_received(ws[r] + r * chunk, stage[r], r, d, chunk, i, 0) - want[i]) < 1e-4f);
        }
        for (int r = 0; r < d; r++) {
            free(a[r]);
            free(w[r]);
            free(ws[r]);
            free(stage[r]);
        }
    }
}
END_TEST

/* A fused schedule against the unfused definition: the same products,
 * summed in another grouping (K split over ranks, GEMMs on column blocks). */
static void expect_close(const float *got, const float *want, int64_t n)
{
    int64_t shape[1] = {n};
    tp_host_tensor g = tu_f32("got", (float *)got, 1, shape), w = tu_f32("want", (float *)want, 1, shape);
    double e = tu_rel_error(&g, &w);
    ck_assert_msg(e <= TU_RTOL_REORDER, "error %g > %g", e, TU_RTOL_REORDER);
}

/* A [rows, cols] weight, stored [cols, rows] under transpose_b. */
static tp_tensor weight(int64_t k, int64_t n, int tb, float **buf)
{
    int64_t shape[2] = {tb ? n : k, tb ? k : n};
    *buf = frand(k * n);
    return tp_tensor_make(*buf, TP_F32, 2, shape);
}

/* fuse_tp's lowering of all_gather(x, 0) -> its d chunks cat on dim 1
 * (K) -> matmul: fused_all_gather_matmul gathering K. Each rank sums
 * x_src . w[src*kl, (src+1)*kl) over the steps (beta 1 after the first),
 * shards pulled through the two slots; vs the reassembled matmul, and
 * every rank bit-identical (the rank-ordered sum rounds the same way). */
START_TEST(fused_ag_mm_gathered_k_emulated)
{
    for (int d = 2; d <= 4; d++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t rows = 5, kl = 3, N = 4, xs_shape[2] = {rows, kl}, os[2] = {rows, N}, rs[2] = {rows, d * kl};
            float *x[4], *wb, *cat = malloc(sizeof(float) * (size_t)(rows * d * kl));
            float *want = malloc(sizeof(float) * (size_t)(rows * N)), *first = NULL;
            tp_tensor w = weight(d * kl, N, tb, &wb);
            for (int r = 0; r < d; r++) {
                x[r] = frand(rows * kl);
                for (int64_t i = 0; i < rows; i++) /* chunk r of the gather lands at columns r*kl */
                    memcpy(cat + i * d * kl + r * kl, x[r] + i * kl, sizeof(float) * (size_t)kl);
            }
            tp_tensor ct = tp_tensor_make(cat, TP_F32, 2, rs), wt = tp_tensor_make(want, TP_F32, 2, os);
            ref_matmul(&ct, &w, tb, &wt);
            for (int r = 0; r < d; r++) {
                float *out = calloc((size_t)(rows * N), sizeof(float)), slot[2][64];
                tp_tensor o = tp_tensor_make(out, TP_F32, 2, os);
                int pulls = 0;
                for (int s = 0; s < d; s++) {
                    int src = tp_ag_src(r, d, s, 1);
                    const float *xs = pull_shard(x, r, src, slot, &pulls, rows * kl);
                    tp_tensor xt = tp_tensor_make((void *)xs, TP_F32, 2, xs_shape);
                    tp_tensor wk = tp_fused_w_k_rows(&w, tb, src, kl);
                    int64_t calls;
                    lt_matmul(&xt, &wk, tb, &o, s ? 1.0f : 0.0f, &calls);
                }
                expect_close(out, want, rows * N);
                if (first) {
                    ck_assert_mem_eq(out, first, sizeof(float) * (size_t)(rows * N));
                    free(out);
                } else {
                    first = out;
                }
            }
            for (int r = 0; r < d; r++)
                free(x[r]);
            free(first);
            free(wb);
            free(cat);
            free(want);
        }
}
END_TEST

/* fuse_tp's lowering of y = a . w -> its d column chunks cat on dim 0 ->
 * reduce_scatter(avg, 0): fused_matmul_reduce_scatter on the last dim.
 * Step s computes a . w[:, dst*nl, (dst+1)*nl) for dst = tp_rs_dst, sends
 * it, and the owner reduces in rank order; vs the cat's chunk r summed
 * over ranks, divided by d. */
START_TEST(fused_mm_rs_column_chunks_emulated)
{
    for (int d = 2; d <= 4; d++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t M = 3, K = 5, nl = 2, chunk = M * nl, as[2] = {M, K}, cs[2] = {M, nl}, ys[2] = {M, d * nl};
            float *a[4], *w[4], *ws[4], *stage[4];
            tp_tensor wt[4];
            float *want = calloc((size_t)(d * chunk), sizeof(float)), *y = malloc(sizeof(float) * (size_t)(M * d * nl));
            for (int r = 0; r < d; r++) {
                a[r] = frand(M * K);
                wt[r] = weight(K, d * nl, tb, &w[r]);
                ws[r] = calloc((size_t)(d * chunk), sizeof(float));
                stage[r] = calloc((size_t)((d - 1) * chunk), sizeof(float));
                tp_tensor at = tp_tensor_make(a[r], TP_F32, 2, as), yt = tp_tensor_make(y, TP_F32, 2, ys);
                ref_matmul(&at, &wt[r], tb, &yt);
                for (int j = 0; j < d; j++) /* cat row block j = column chunk j, summed over ranks */
                    for (int64_t i = 0; i < M; i++)
                        for (int64_t c = 0; c < nl; c++)
                            want[j * chunk + i * nl + c] += y[i * d * nl + j * nl + c];
            }
            for (int64_t i = 0; i < d * chunk; i++)
                want[i] /= (float)d;
            for (int s = 0; s < d; s++) /* every rank runs step s */
                for (int r = 0; r < d; r++) {
                    int dst = tp_rs_dst(r, d, s);
                    tp_tensor at = tp_tensor_make(a[r], TP_F32, 2, as), slot = tp_tensor_make(ws[r] + dst * chunk, TP_F32, 2, cs);
                    tp_tensor cols = tp_fused_w_n_cols(&wt[r], tb, dst, nl);
                    int64_t calls;
                    lt_matmul(&at, &cols, tb, &slot, 0.0f, &calls);
                    if (s < d - 1)
                        memcpy(stage[dst] + s * chunk, ws[r] + dst * chunk, sizeof(float) * (size_t)chunk);
                }
            for (int r = 0; r < d; r++) {
                float got[64];
                for (int64_t i = 0; i < chunk; i++)
                    got[i] = reduce_received(ws[r] + r * chunk, stage[r], r, d, chunk, i, 1);
                expect_close(got, want + r * chunk, chunk);
            }
            for (int r = 0; r < d; r++) {
                free(a[r]);
                free(w[r]);
                free(ws[r]);
                free(stage[r]);
            }
            free(want);
            free(y);
        }
}
END_TEST

/* ------------------------------------------------------------ reductions */

START_TEST(reduce_steps_match_cpu_semantics)
{
    float v[3] = {1.5f, -2.0f, 4.0f};
    float acc = v[0];
    for (int r = 1; r < 3; r++)
        acc = tp_reduce_step_f32(acc, v[r], 0);
    ck_assert(acc == 3.5f);
    ck_assert(tp_reduce_finish_f32(acc, 1, 3) == 3.5f / 3.0f);
    ck_assert(tp_reduce_finish_f32(acc, 0, 3) == 3.5f);
    ck_assert(tp_reduce_step_f32(1.0f, 2.0f, 2) == 2.0f);
    ck_assert(isnan(tp_reduce_step_f32(1.0f, NAN, 2)));   /* max propagates NaN */
    ck_assert(isnan(tp_reduce_step_f32(NAN, 5.0f, 2)));
    ck_assert(tp_reduce_step_f32(-0.0f, 0.0f, 0) == 0.0f);
    ck_assert_int_eq(tp_reduce_step_i64(INT64_MAX, 1, 0), INT64_MIN); /* wraps */
    ck_assert_int_eq(tp_reduce_finish_i64(-5, 1, 2), -2);             /* toward zero */
    ck_assert_int_eq(tp_reduce_finish_i64(5, 1, 2), 2);
    ck_assert_int_eq(tp_reduce_step_i64(-3, -7, 2), -3);
}
END_TEST

static Suite *cuda_plan_suite(void)
{
    Suite *s = suite_create("cuda_plan");
    TCase *g = tcase_create("gemm");
    tcase_add_test(g, gemm_row_major);
    tcase_add_test(g, gemm_transposes);
    tcase_add_test(g, gemm_leading_dims_and_column_block);
    tcase_add_test(g, gemm_batch_folds_into_m);
    tcase_add_test(g, gemm_batched_permuted);
    tcase_add_test(g, gemm_broadcast_batch);
    tcase_add_test(g, gemm_batch_split_at_the_count_limit);
    tcase_add_test(g, gemm_packs_unusable_operands);
    tcase_add_test(g, gemm_degenerate_sizes);
    tcase_add_test(g, gemm_random_views);
    tcase_add_test(g, gemm_alignment);
    suite_add_tcase(s, g);
    TCase *l = tcase_create("layout");
    tcase_add_test(l, layout_offsets_match_strides);
    tcase_add_test(l, broadcast_rules);
    tcase_add_test(l, span_of_views);
    tcase_add_test(l, block_pack_round_trips);
    tcase_add_test(l, all_gather_via_pack);
    tcase_add_test(l, reduce_scatter_via_pack);
    tcase_add_test(l, all_to_all_via_pack);
    suite_add_tcase(s, l);
    TCase *f = tcase_create("schedules");
    tcase_add_test(f, ag_schedule_covers_every_rank_once);
    tcase_add_test(f, ag_slots_are_reused_safely);
    tcase_add_test(f, rs_schedule_pairs_meet);
    tcase_add_test(f, fused_ag_mm_emulated);
    tcase_add_test(f, fused_mm_rs_emulated);
    tcase_add_test(f, fused_ag_mm_gathered_k_emulated);
    tcase_add_test(f, fused_mm_rs_column_chunks_emulated);
    tcase_add_test(f, reduce_steps_match_cpu_semantics);
    suite_add_tcase(s, f);
    return s;
}

TP_CHECK_MAIN(cuda_plan_suite)
