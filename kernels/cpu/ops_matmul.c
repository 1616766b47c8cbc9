/* ops_matmul.c — matmul by a weight packed at load through tpserve's own
 * GEMM (packed_gemm.h, weight_packs.h); every other product through
 * OpenBLAS sgemm (small products through small_gemm.h's kernel, where it
 * wins), with batch broadcasting.
 *
 * Strided matrices go to BLAS as they are whenever one of their two strides
 * is 1 (row-major, or column-major passed as a transpose); anything else is
 * first copied into contiguous scratch. The batch dims and M are coalesced
 * together, so [B, S, K] x [K, N] with a contiguous is a single sgemm.
 * FP16/BF16 are widened to FP32, multiplied, and rounded once on store
 * (a weight packed at load was widened once, into its panels).
 * Products too small to gain from OpenBLAS's threads (attention's per-head
 * ones) run on one (blas_pick.h). matmul_rows runs cpu_matmul on each run
 * of wanted rows and zeros the rest. */
#include <cblas.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "blas_pick.h"
#include "common/tp_checks.h"
#include "common/tp_generate.h"
#include "ops_internal.h"
#include "packed_gemm.h"
#include "small_gemm.h"
#include "weight_packs.h"

/* Can BLAS read a rows x cols matrix with strides (sr, sc) directly? */
static int blas_layout(int64_t rows, int64_t cols, int64_t sr, int64_t sc, CBLAS_TRANSPOSE *t,
                       int64_t *ld)
{
    if ((cols == 1 || sc == 1) && (rows == 1 || sr >= cols)) {
        *t = CblasNoTrans;
        *ld = rows == 1 ? cols : sr;
    } else if ((rows == 1 || sr == 1) && (cols == 1 || sc >= rows)) {
        *t = CblasTrans;
        *ld = cols == 1 ? rows : sc;
    } else {
        return 0;
    }
    if (*ld < 1)
        *ld = 1;
    return *ld <= INT_MAX;
}

/* Copies a strided matrix into buf (row-major, ld = cols). */
static tp_status pack(const float **m, int64_t rows, int64_t cols, int64_t sr, int64_t sc,
                      ops_buf *buf, tp_err *err)
{
    tp_status s = ops_buf_reserve(buf, (size_t)(rows * cols), err);
    if (s != TP_OK)
        return s;
    for (int64_t i = 0; i < rows; i++)
        ops_load_row(*m + i * sr, TP_F32, sc, cols, buf->p + i * cols);
    *m = buf->p;
    return TP_OK;
}

/* c[1, N] = alpha * x . b, x K floats incx apart, b [K, N] (tb NoTrans) or
 * [N, K] (Trans) rows ldb apart. A product of one row is a
 * matrix-vector product: OpenBLAS's sgemm packs all of b for it, sgemv
 * streams b once, 3.5-4.5x faster for a GPT-2 layer's weights (K 768, N
 * 768-3072, one thread), which is every GEMM of a generation step that
 * decodes one sequence. */
static void one_row(int64_t N, int64_t K, float alpha, const float *x, int64_t incx, const float *b,
                    CBLAS_TRANSPOSE tb, int64_t ldb, float *c)
{
    if (tb == CblasNoTrans)
        cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)K, (blasint)N, alpha, b, (blasint)ldb, x, (blasint)incx,
                    0.0f, c, 1);
    else
        cblas_sgemv(CblasRowMajor, CblasNoTrans, (blasint)N, (blasint)K, alpha, b, (blasint)ldb, x, (blasint)incx,
                    0.0f, c, 1);
}

tp_status ops_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t sam,
                    int64_t sak, const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc,
                    ops_buf *sa, ops_buf *sb, tp_err *err)
{
    if (M == 0 || N == 0)
        return TP_OK;
    if (K == 0) {
        for (int64_t i = 0; i < M; i++)
            memset(c + i * ldc, 0, (size_t)N * sizeof(float));
        return TP_OK;
    }
    if (M > INT_MAX || N > INT_MAX || K > INT_MAX || ldc > INT_MAX)
        return tp_fail(err, TP_INVALID, "matmul: %lld x %lld x %lld exceeds BLAS int range",
                       (long long)M, (long long)K, (long long)N);
    CBLAS_TRANSPOSE ta, tb;
    int64_t lda, ldb;
    tp_status s;
    if (!blas_layout(M, K, sam, sak, &ta, &lda)) {
        if ((s = pack(&a, M, K, sam, sak, sa, err)) != TP_OK)
            return s;
        ta = CblasNoTrans;
        lda = K;
    }
    if (!blas_layout(K, N, sbk, sbn, &tb, &ldb)) {
        if ((s = pack(&b, K, N, sbk, sbn, sb, err)) != TP_OK)
            return s;
        tb = CblasNoTrans;
        ldb = N;
    }
    if (ta == CblasNoTrans && tb == CblasNoTrans && small_sgemm_takes(M, N, K)) {
        small_sgemm(M, N, K, alpha, a, lda, b, ldb, c, ldc);
        return TP_OK;
    }
    tp_blas_call_begin(M, N, K); /* small products on one thread (blas_pick.h) */
    if (M == 1) /* a decode step's row: see one_row */
        one_row(N, K, alpha, a, ta == CblasNoTrans ? 1 : lda, b, tb, ldb, c);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (blasint)M, (blasint)N, (blasint)K, alpha, a,
                    (blasint)lda, b, (blasint)ldb, 0.0f, c, (blasint)ldc);
    tp_blas_call_end();
    return TP_OK;
}

/* The matmul problem after validation. */
typedef struct {
    int64_t M, N, K;
    int64_t sak, sbk, sbn; /* column stride of a; b as a [K, N] matrix */
    ops_layout l;          /* [batch..., M] over a (0), b (1), out (2) */
} mm_plan;

static tp_status mm_plan_init(mm_plan *pl, const tp_tensor *a, const tp_tensor *b, int tb,
                              const tp_tensor *out, tp_err *err)
{
    char s1[96], s2[96], s3[96];
    int na = a->ndim, nbd = b->ndim, no = out->ndim, nb = no - 2;
    if (na < 2 || nbd < 2 || no < 2)
        goto bad;
    pl->M = a->shape[na - 2];
    pl->K = a->shape[na - 1];
    pl->N = tb ? b->shape[nbd - 2] : b->shape[nbd - 1];
    int64_t kb = tb ? b->shape[nbd - 1] : b->shape[nbd - 2];
    if (kb != pl->K || out->shape[no - 2] != pl->M || out->shape[no - 1] != pl->N)
        goto bad;
    pl->sak = a->stride[na - 1];
    pl->sbk = tb ? b->stride[nbd - 1] : b->stride[nbd - 2];
    pl->sbn = tb ? b->stride[nbd - 2] : b->stride[nbd - 1];
    tp_tensor ab = *a, bb = *b; /* batch dims only */
    ab.ndim -= 2;
    bb.ndim -= 2;
    int64_t sa[TP_MAX_DIMS], sb[TP_MAX_DIMS];
    if (tp_broadcast_strides(&ab, nb, out->shape, sa) || tp_broadcast_strides(&bb, nb, out->shape, sb))
        goto bad;
    sa[nb] = a->stride[na - 2];
    sb[nb] = 0;
    const int64_t *st[3] = {sa, sb, out->stride};
    ops_layout_init(&pl->l, nb + 1, out->shape, 3, st);
    return TP_OK;
bad:
    return tp_fail(err, TP_INVALID, "matmul%s: shapes %s and %s do not give %s",
                   tb ? " (transpose_b)" : "", tp_shape_str(s1, sizeof s1, a->ndim, a->shape),
                   tp_shape_str(s2, sizeof s2, b->ndim, b->shape),
                   tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
}

/* a, b FP32 (any strides); c FP32 with out's shape and the layout's strides
 * (its last dim contiguous). When b does not change along the innermost
 * coalesced dim, that dim becomes the M of one sgemm (c's rows that dim's
 * stride apart); otherwise every row is its own sgemm. */
static tp_status matmul_f32(const mm_plan *pl, const float *a, const float *b, float *c,
                            tp_err *err)
{
    const ops_layout *l = &pl->l;
    int last = l->nd - 1, fold = l->stride[1][last] == 0;
    int iter = fold ? last : l->nd;
    int64_t m = fold ? l->shape[last] : 1, sam = fold ? l->stride[0][last] : 0;
    int64_t ldc = fold && m > 1 ? l->stride[2][last] : pl->N;
    int64_t n = ops_layout_count(l, iter);
    ops_buf sa = {0}, sb = {0};
    ops_pos p;
    memset(&p, 0, sizeof p);
    tp_status s = TP_OK;
    for (int64_t r = 0; r < n && s == TP_OK; r++, ops_pos_next(l, &p, iter))
        s = ops_sgemm(m, pl->N, pl->K, 1.0f, a + p.off[0], sam, pl->sak, b + p.off[1], pl->sbk,
                      pl->sbn, c + p.off[2], ldc, &sa, &sb, err);
    ops_buf_free(&sa);
    ops_buf_free(&sb);
    return s;
}

/* FP16/BF16: widen both inputs, multiply in FP32, round once. */
static tp_status matmul_half(const tp_tensor *a, const tp_tensor *b, int tb, tp_tensor *out,
                             tp_err *err)
{
    tp_tensor af, bf;
    float *ao = NULL, *bo = NULL, *co = NULL;
    int64_t n = tp_tensor_numel(out);
    mm_plan pl;
    tp_status s = ops_as_f32(a, &af, &ao, "matmul", err);
    if (s == TP_OK)
        s = ops_as_f32(b, &bf, &bo, "matmul", err);
    if (s == TP_OK)
        s = ops_alloc_f32(&co, (size_t)n, "matmul", err);
    if (s == TP_OK)
        s = mm_plan_init(&pl, &af, &bf, tb, out, err);
    if (s == TP_OK)
        s = matmul_f32(&pl, af.data, bf.data, co, err);
    if (s == TP_OK)
        ops_store_row(out->data, out->dtype, 1, n, co);
    free(ao);
    free(bo);
    free(co);
    return s;
}

int cpu_matmul_writes_in_place(const tp_tensor *out)
{
    if (tp_tensor_is_contiguous(out))
        return 1;
    if (out->dtype != TP_F32 || out->ndim < 2 || out->stride[out->ndim - 1] != 1)
        return 0;
    /* every other dim at least a whole row apart, so rows never overlap */
    for (int i = 0; i < out->ndim - 1; i++)
        if (out->shape[i] > 1 && out->stride[i] < out->shape[out->ndim - 1])
            return 0;
    return 1;
}

/* t's dims before the last as one dim of *rows rows *stride apart, when
 * they are evenly spaced in memory; 0 when they are not. */
static int fold_rows(const tp_tensor *t, int64_t *rows, int64_t *stride)
{
    int last = t->ndim - 2;
    *rows = t->shape[last];
    *stride = t->stride[last];
    for (int i = last - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->stride[i] != t->stride[i + 1] * t->shape[i + 1])
            return 0;
        *rows *= t->shape[i];
    }
    return 1;
}

/* [..., M, K] x [K, N] (or [N, K] with transpose_b) -> [..., M, N]:
 * a product of rows, whatever a's and out's strides and dtype. */
static int row_shapes(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out)
{
    int nd = a->ndim;
    if (b->ndim != 2 || out->ndim != nd || nd < 2)
        return 0;
    int64_t kb = tb ? b->shape[1] : b->shape[0], n = tb ? b->shape[0] : b->shape[1];
    if (kb != a->shape[nd - 1] || out->shape[nd - 1] != n)
        return 0;
    for (int i = 0; i < nd - 1; i++)
        if (out->shape[i] != a->shape[i])
            return 0;
    return 1;
}

/* An FP32 product of rows (row_shapes). */
static int row_product(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out)
{
    return out->dtype == TP_F32 && row_shapes(a, b, tb, out);
}

/* A row product with a's and out's rows evenly spaced: every block of a
 * fused matmul, a step's most frequent op. The general plan comes to this
 * same single sgemm for them (the batch folded into M), after a broadcast
 * and a layout whose cost showed in a one-row request's profile; the shape
 * checks are the plan's, which reports any mismatch. */
static int one_sgemm(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out, int64_t *m,
                     int64_t *sam, int64_t *ldc)
{
    int64_t mo;
    if (!row_product(a, b, tb, out) || !fold_rows(a, m, sam) || !fold_rows(out, &mo, ldc))
        return 0;
    if (*m == 1)
        *ldc = b->shape[tb ? 0 : 1]; /* one row: BLAS wants ldc >= n whatever the stride says */
    return 1;
}

/* One sgemm's operands, and the column slices of it the pool's tasks take. */
typedef struct {
    int64_t M, N, K, sam, sak, sbk, sbn, ldc;
    const float *a, *b;
    float *c;
    int slices;
} sgemm_job;

/* Below this many rows a product runs on one OpenBLAS thread or in
 * small_gemm (blas_pick.h); from this many floats of b up, such a product
 * is worth splitting by columns over the rank's pool: it streams b from
 * memory (a decode step's weights), and one core's share of the memory
 * bandwidth is what bounds it. A column of c is the same chain of
 * operations whichever slice holds it in small_gemm (small_gemm.h); in
 * OpenBLAS's sgemv, within its own last-bit differences between sizes. */
#define SPLIT_COLUMNS_MIN_B ((int64_t)1 << 18)

/* Slice t's first column: multiples of 16 (a 64-byte line of c). */
static int64_t slice_start(const sgemm_job *j, int64_t t)
{
    return t == j->slices ? j->N : (j->N * t / j->slices) & ~(int64_t)15;
}

static tp_status sgemm_slice(void *arg, int64_t t, int slot, tp_err *err)
{
    (void)slot;
    const sgemm_job *j = arg;
    int64_t n0 = slice_start(j, t), n1 = slice_start(j, t + 1);
    if (n1 <= n0)
        return TP_OK;
    ops_buf sa = {0}, sb = {0};
    tp_status s = ops_sgemm(j->M, n1 - n0, j->K, 1.0f, j->a, j->sam, j->sak, j->b + n0 * j->sbn, j->sbk, j->sbn,
                            j->c + n0, j->ldc, &sa, &sb, err);
    ops_buf_free(&sa);
    ops_buf_free(&sb);
    return s;
}

static tp_status matmul_one_sgemm(const tp_tensor *a, const tp_tensor *b, int tb, tp_tensor *out,
                                  int64_t m, int64_t sam, int64_t ldc, cpu_pool *pool, tp_err *err)
{
    sgemm_job j = {.M = m, .N = out->shape[out->ndim - 1], .K = a->shape[a->ndim - 1], .sam = sam,
                   .sak = a->stride[a->ndim - 1], .sbk = b->stride[tb ? 1 : 0], .sbn = b->stride[tb ? 0 : 1],
                   .ldc = ldc, .a = a->data, .b = b->data, .c = out->data, .slices = 1};
    int threads = cpu_pool_threads(pool);
    if (threads > 1 && m < TP_BLAS_THREADED_MIN_ROWS && j.N * j.K >= SPLIT_COLUMNS_MIN_B && j.N >= 32 * threads)
        j.slices = threads;
    /* Unsplit, the call stays off the pool: a pool's tasks run on one
     * OpenBLAS thread (cpu_pool.h), and a 128-row product needs them all. */
    if (j.slices == 1)
        return sgemm_slice(&j, 0, 0, err);
    return cpu_pool_run(pool, j.slices, sgemm_slice, &j, err);
}

/* Above this many multiply-adds per group of evenly spaced rows, a row
 * product whose rows are not evenly spaced throughout runs one sgemm per
 * group (the general plan); at or below it, its rows are copied instead. A
 * fused matmul's block of a batch ([B, S/d, K] inside [B, S, K], a block
 * of a middle dim) is such a product: one sgemm per batch row, each with
 * OpenBLAS's fixed cost per call (a mutex for its buffers, packing), was 8
 * calls per row of the example graph and most of a step at batch 16. The
 * copies cost a load and a store per element of a or out, against 2N or 2K
 * flops each: small beside the calls they save at these sizes. */
#define COPY_ROWS_MAX_MACS (1 << 16)

static int rows_worth_copying(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out)
{
    int nd = out->ndim;
    if (!row_product(a, b, tb, out))
        return 0;
    int64_t group = out->shape[nd - 2] * out->shape[nd - 1] * a->shape[nd - 1];
    return group <= COPY_ROWS_MAX_MACS && tp_tensor_numel(out) > 0;
}

/* A row product as one sgemm over contiguous copies: a's rows gathered
 * first when they are not evenly spaced, out's scattered after when its
 * are not. */
static tp_status rows_copied_once(const tp_tensor *a, const tp_tensor *b, int tb, tp_tensor *out, tp_err *err)
{
    int64_t m, sam, ldc;
    float *ac = NULL, *oc = NULL;
    tp_tensor ad = *a, od = *out;
    tp_status s = TP_OK;
    if (!fold_rows(a, &m, &sam) &&
        (s = ops_alloc_f32(&ac, (size_t)tp_tensor_numel(a), "matmul", err)) == TP_OK) {
        ad = tp_tensor_make(ac, TP_F32, a->ndim, a->shape);
        tp_tensor_copy(&ad, a);
    }
    if (s == TP_OK && !fold_rows(out, &m, &ldc) &&
        (s = ops_alloc_f32(&oc, (size_t)tp_tensor_numel(out), "matmul", err)) == TP_OK)
        od = tp_tensor_make(oc, TP_F32, out->ndim, out->shape);
    if (s == TP_OK && !one_sgemm(&ad, b, tb, &od, &m, &sam, &ldc)) /* contiguous copies always fold */
        s = tp_fail(err, TP_INTERNAL, "matmul: the copied rows do not make one sgemm");
    if (s == TP_OK)
        s = matmul_one_sgemm(&ad, b, tb, &od, m, sam, ldc, NULL, err);
    if (s == TP_OK && oc)
        tp_tensor_copy(out, &od);
    free(ac);
    free(oc);
    return s;
}

/* rows_copied_once over slices of dim 0 (a batch dim: a row product whose
 * rows do not fold has at least 3) small enough that their copies stay
 * under OPS_COPY_MAX_BYTES. */
static tp_status matmul_rows_copied(const tp_tensor *a, const tp_tensor *b, int tb, tp_tensor *out, tp_err *err)
{
    int64_t n0 = out->shape[0];
    int64_t per = (tp_tensor_numel(a) + tp_tensor_numel(out)) / n0 * (int64_t)sizeof(float);
    int64_t step = per > 0 && per < OPS_COPY_MAX_BYTES ? OPS_COPY_MAX_BYTES / per : 1;
    tp_status s = TP_OK;
    for (int64_t i = 0; s == TP_OK && i < n0; i += step) {
        int64_t n = n0 - i < step ? n0 - i : step;
        tp_tensor as = tp_tensor_narrow(a, 0, i, n), os = tp_tensor_narrow(out, 0, i, n);
        s = rows_copied_once(&as, b, tb, &os, err);
    }
    return s;
}

/* A product by a weight packed at load (weight_packs.h): a's rows and c's
 * rows each folded into one matrix (copied when they do not fold), and
 * b's panels split between the pool's threads, one contiguous run of
 * panels each, once there are two panels a thread and the product is
 * worth waking them for (the threshold elementwise ops use, in
 * multiply-adds: a decode step's 1 x 768 x 768 is 9x it). */
#define PACKED_SPLIT_MIN_MACS ((int64_t)1 << 16)

/* An FP16/BF16 product is computed NARROW_CHUNK_PANELS panels and at
 * most NARROW_CHUNK_ROWS rows at a time into FP32 scratch (2 MB) and
 * rounded into out: a whole M x N FP32 result (25 MB for GPT-2's head at
 * 128 rows) was fresh memory on every call, whose page faults and
 * unmapping were 4.5% of an FP16 request's samples. */
#define NARROW_CHUNK_PANELS 64
#define NARROW_CHUNK_ROWS (4 * PGEMM_MC) /* 528: a chunk starts an MC block */

typedef struct {
    int64_t M, K, N, lda, ldc;
    const float *a, *panels;
    float *c;         /* FP32 c, ldc apart; NULL when narrow is set */
    uint16_t *narrow; /* else: a contiguous FP16/BF16 [M, N] */
    tp_dtype dt;
    int slices;
    cpu_pool *pool; /* its slots' scratch (cpu_pool_scratch), or NULL */
} packed_job;

/* n floats of scratch: the pool's buffer `which` of `slot`, kept between
 * calls (cpu_pool_scratch), or without a pool own's, freed by the caller. */
static tp_status scratch_of(cpu_pool *pool, int slot, int which, size_t n, ops_buf *own, float **p, tp_err *err)
{
    *p = cpu_pool_scratch(pool, slot, which, n);
    if (*p)
        return TP_OK;
    tp_status s = ops_buf_reserve(own, n, err);
    *p = own->p;
    return s;
}

/* Panels p0 .. p1 - 1 into the narrow out, a chunk at a time through cs:
 * a chunk's panels are a packed matrix of their own (panels lie K x NR
 * apart), and each element is the same chain of operations whatever the
 * rows or the column split (packed_gemm.h), so the bits are those of one
 * product. */
static void narrow_panels(const packed_job *j, int64_t p0, int64_t p1, float *cs)
{
    for (int64_t g0 = p0; g0 < p1; g0 += NARROW_CHUNK_PANELS) {
        int64_t g1 = p1 - g0 < NARROW_CHUNK_PANELS ? p1 : g0 + NARROW_CHUNK_PANELS;
        int64_t n0 = g0 * PGEMM_NR, n = (g1 * PGEMM_NR < j->N ? g1 * PGEMM_NR : j->N) - n0;
        int64_t ldc = (g1 - g0) * PGEMM_NR; /* at most the chunk packed_slice sized cs for */
        const float *panels = j->panels + g0 * j->K * PGEMM_NR;
        for (int64_t r0 = 0; r0 < j->M; r0 += NARROW_CHUNK_ROWS) {
            int64_t rows = j->M - r0 < NARROW_CHUNK_ROWS ? j->M - r0 : NARROW_CHUNK_ROWS;
            pgemm_run(rows, j->K, n, j->a + r0 * j->lda, j->lda, panels, cs, ldc, 0, g1 - g0);
            for (int64_t i = 0; i < rows; i++)
                ops_store_row(j->narrow + (r0 + i) * j->N + n0, j->dt, 1, n, cs + i * ldc);
        }
    }
}

/* Floats of a narrow out's chunk for M rows and a slice of `panels`
 * panels: no larger than the slice needs. */
static size_t narrow_chunk_floats(int64_t M, int64_t panels)
{
    int64_t rows = M < NARROW_CHUNK_ROWS ? M : NARROW_CHUNK_ROWS;
    return (size_t)(rows * (panels < NARROW_CHUNK_PANELS ? panels : NARROW_CHUNK_PANELS) * PGEMM_NR);
}

static tp_status packed_slice(void *arg, int64_t t, int slot, tp_err *err)
{
    const packed_job *j = arg;
    int64_t P = pgemm_panels(j->N), p0 = P * t / j->slices, p1 = P * (t + 1) / j->slices;
    if (p1 <= p0)
        return TP_OK;
    if (!j->narrow) {
        pgemm_run(j->M, j->K, j->N, j->a, j->lda, j->panels, j->c, j->ldc, p0, p1);
        return TP_OK;
    }
    /* without a pool (a fused kernel's blocks) the chunk is allocated on
     * every call */
    ops_buf own = {0};
    float *cs;
    tp_status s = scratch_of(j->pool, slot, 0, narrow_chunk_floats(j->M, p1 - p0), &own, &cs, err);
    if (s == TP_OK)
        narrow_panels(j, p0, p1, cs);
    ops_buf_free(&own);
    return s;
}

/* Whether a's rows are an FP32 [M, K] matrix as they lie (rows *lda
 * apart, unit column stride), which the kernel reads without a copy. */
static int rows_as_they_lie(const tp_tensor *a, int64_t K, int64_t *M, int64_t *lda)
{
    return a->dtype == TP_F32 && fold_rows(a, M, lda) && (K == 1 || a->stride[a->ndim - 1] == 1);
}

/* a as FP32 [M, K] rows with unit column stride into *rows, *lda: a
 * itself, or a copy (widened from FP16/BF16) in the pool's slot-0
 * scratch 1, or in buf without a pool. */
static tp_status packed_rows_of(const tp_tensor *a, int64_t K, cpu_pool *pool, ops_buf *buf, const float **rows,
                                int64_t *lda, int64_t *M, tp_err *err)
{
    if (rows_as_they_lie(a, K, M, lda)) {
        *rows = a->data;
        return TP_OK;
    }
    *M = tp_tensor_numel(a) / K;
    *lda = K;
    float *copy;
    tp_status s = scratch_of(pool, 0, 1, (size_t)(*M * K), buf, &copy, err);
    if (s == TP_OK)
        s = ops_gather_f32_on(pool, a, copy, err);
    *rows = copy;
    return s;
}

/* Slices of a product of M rows by N columns of panels on a pool of
 * `threads`: one per thread once there are two panels a thread and the
 * product is worth waking them for. */
static int packed_slices(int64_t M, int64_t K, int64_t N, int threads)
{
    return pgemm_panels(N) >= 2 * threads && M * K * N >= PACKED_SPLIT_MIN_MACS ? threads : 1;
}

static tp_status matmul_packed(const tp_tensor *a, const float *panels, int64_t K, int64_t N, tp_tensor *out,
                               cpu_pool *pool, tp_err *err)
{
    ops_buf ab = {0}, cb = {0};
    packed_job j = {.K = K, .N = N, .panels = panels, .dt = out->dtype, .pool = pool};
    int64_t mo;
    tp_status s = packed_rows_of(a, K, pool, &ab, &j.a, &j.lda, &j.M, err);
    int c_folds = out->dtype == TP_F32 && fold_rows(out, &mo, &j.ldc);
    if (out->dtype != TP_F32) { /* contiguous (cpu_matmul_writes_in_place) */
        j.narrow = out->data;
    } else if (c_folds) {
        j.c = out->data;
    } else if (s == TP_OK) {
        j.ldc = N;
        s = ops_buf_reserve(&cb, (size_t)(j.M * N), err);
        j.c = cb.p;
    }
    if (s == TP_OK && j.M > 0) {
        int threads = cpu_pool_threads(pool);
        j.slices = packed_slices(j.M, K, N, threads);
        s = j.slices == 1 ? packed_slice(&j, 0, 0, err) : cpu_pool_run(pool, j.slices, packed_slice, &j, err);
    }
    if (s == TP_OK && cb.p) {
        tp_tensor flat = tp_tensor_make(cb.p, TP_F32, out->ndim, out->shape);
        tp_tensor_copy(out, &flat);
    }
    ops_buf_free(&ab);
    ops_buf_free(&cb);
    return s;
}

/* b's panels, when b is a weight packed at load and this is a product
 * of rows by it (row_shapes; any float dtype); NULL otherwise. */
static const float *packed_weight(const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out)
{
    if (!row_shapes(a, b, tb, out))
        return NULL;
    int64_t K = tb ? b->shape[1] : b->shape[0], N = tb ? b->shape[0] : b->shape[1];
    return weight_packs_find(b->data, b->dtype, K, N, b->stride[tb ? 1 : 0], b->stride[tb ? 0 : 1]);
}

tp_status cpu_matmul_reserve(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *b, const tp_tensor *out,
                             cpu_pool *pool, tp_err *err)
{
    const float *panels = packed_weight(a, b, attrs ? attrs->transpose_b : 0, out);
    if (!panels || !pool)
        return TP_OK;
    int64_t K = a->shape[a->ndim - 1], N = out->shape[out->ndim - 1], M = K ? tp_tensor_numel(a) / K : 0, lda;
    int ok = 1;
    if (out->dtype != TP_F32)
        ok = cpu_pool_reserve(pool, 0, cpu_pool_threads(pool), narrow_chunk_floats(M, pgemm_panels(N))) == 0;
    if (ok && !rows_as_they_lie(a, K, &M, &lda))
        ok = cpu_pool_reserve(pool, 1, 1, (size_t)(tp_tensor_numel(a))) == 0;
    return ok ? TP_OK : tp_fail(err, TP_NOMEM, "matmul: cannot keep scratch for %lld x %lld x %lld",
                                (long long)(tp_tensor_numel(a) / (K ? K : 1)), (long long)K, (long long)N);
}

tp_status cpu_matmul(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *b,
                     tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    int tb = attrs ? attrs->transpose_b : 0;
    if (a->dtype != out->dtype || b->dtype != out->dtype || !tp_dtype_is_float(out->dtype))
        return tp_fail(err, TP_INVALID, "matmul: needs float inputs of the output dtype, got %s x %s -> %s",
                       tp_dtype_name(a->dtype), tp_dtype_name(b->dtype), tp_dtype_name(out->dtype));
    if (!cpu_matmul_writes_in_place(out))
        return tp_fail(err, TP_INTERNAL, "matmul: the output must be contiguous, or FP32 with contiguous rows");
    const float *panels = packed_weight(a, b, tb, out);
    if (panels)
        return matmul_packed(a, panels, a->shape[a->ndim - 1], out->shape[out->ndim - 1], out, pool, err);
    int64_t m, sam, ldc;
    if (one_sgemm(a, b, tb, out, &m, &sam, &ldc))
        return matmul_one_sgemm(a, b, tb, out, m, sam, ldc, pool, err);
    if (rows_worth_copying(a, b, tb, out))
        return matmul_rows_copied(a, b, tb, out, err);
    mm_plan pl;
    tp_status s = mm_plan_init(&pl, a, b, tb, out, err);
    if (s != TP_OK || tp_tensor_numel(out) == 0)
        return s;
    if (out->dtype != TP_F32)
        return matmul_half(a, b, tb, out, err);
    return matmul_f32(&pl, a->data, b->data, out->data, err);
}

/* matmul_rows: each run of consecutive wanted rows is one cpu_matmul on
 * that slice of dim 0 (so the same sgemm/sgemv/small_gemm dispatch as
 * matmul, one call per run); the other runs are zeroed without reading x,
 * so their inputs (NaN or garbage included) never reach the output. */
tp_status cpu_matmul_rows(const tp_attrs *attrs, const tp_tensor *x, const tp_tensor *w, const tp_tensor *mask,
                          tp_tensor *out, cpu_pool *pool, tp_err *err)
{
    tp_status s = tp_check_matmul_rows(x, w, mask, out, err);
    if (s != TP_OK)
        return s;
    if (!tp_tensor_is_contiguous(out))
        return tp_fail(err, TP_INTERNAL, "matmul_rows: the output must be contiguous");
    int64_t B = x->shape[0], row = B > 0 ? tp_tensor_numel(out) / B : 0;
    for (int64_t r = 0, end; s == TP_OK && r < B; r = end) {
        end = tp_gen_row_run_end(mask->data, mask->dtype, mask->stride[0], r, B);
        tp_tensor os = tp_tensor_narrow(out, 0, r, end - r);
        if (tp_gen_row_wanted(mask->data, mask->dtype, mask->stride[0], r)) {
            tp_tensor xs = tp_tensor_narrow(x, 0, r, end - r);
            s = cpu_matmul(attrs, &xs, w, &os, pool, err);
        } else {
            memset(os.data, 0, (size_t)((end - r) * row) * tp_dtype_size(out->dtype));
        }
    }
    return s;
}
