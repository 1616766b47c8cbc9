/* cuda_gemm.c — matmuls through cuBLASLt.
 *
 * The row-major -> column-major mapping is tp_gemm_plan_make and the batch
 * handling tp_mm_problem_make (kernels/common/tp_cuda_plan.h, checked by
 * test_cuda_plan against a CPU emulation of the cuBLASLt call). FP32, FP16
 * and BF16 storage, FP32 compute and scale (CUBLAS_COMPUTE_32F: no TF32, so
 * FP32 results track the cpu backend).
 *
 * Every distinct call (dtype, sizes, transposes, leading dims, batch,
 * pointer alignments) gets its descriptors and heuristic algorithm once and
 * keeps them: the heuristic runs on first use (during the eager warm-up
 * pass when exec runs one), never per call, and only host memory is
 * allocated for it. The workspace is the one preallocated at create, so all
 * GEMMs are on one stream at a time (compute). */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_internal.h"
#include "grow.h"

typedef struct {
    int dtype, ta, tb;
    int64_t m, n, k, lda, ldb, ldd;
    int64_t batch, sa, sb, sd;
    uint32_t al_a, al_b, al_d;
} gemm_key;

typedef struct {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} gemm_entry;

struct cu_gemm_cache {
    gemm_entry *e;
    int n, cap;
};

tp_status cu_gemm_create(cu_ctx *x, tp_err *err)
{
    x->gemm = calloc(1, sizeof *x->gemm);
    if (!x->gemm)
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of memory for the GEMM cache", x->rank);
    return TP_OK;
}

static void entry_free(const cu_ctx *x, gemm_entry *g)
{
    cublasLtMatrixLayout_t l[] = {g->la, g->lb, g->ld};
    for (size_t i = 0; i < sizeof l / sizeof l[0]; i++)
        if (l[i])
            cu_warn_blas(x, cublasLtMatrixLayoutDestroy(l[i]), "cublasLtMatrixLayoutDestroy");
    if (g->desc)
        cu_warn_blas(x, cublasLtMatmulDescDestroy(g->desc), "cublasLtMatmulDescDestroy");
}

void cu_gemm_free(cu_ctx *x)
{
    if (!x->gemm)
        return;
    for (int i = 0; i < x->gemm->n; i++)
        entry_free(x, &x->gemm->e[i]);
    free(x->gemm->e);
    free(x->gemm);
    x->gemm = NULL;
}

static cudaDataType_t lt_type(tp_dtype t)
{
    return t == TP_F16 ? CUDA_R_16F : t == TP_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* One column-major layout, strided-batched when batch > 1. */
static tp_status make_layout(cu_ctx *x, cublasLtMatrixLayout_t *l, tp_dtype dt, const tp_lt_mat *m, int64_t batch,
                             int64_t stride, tp_err *err)
{
    BLAS_TRY(x, err, cublasLtMatrixLayoutCreate(l, lt_type(dt), (uint64_t)m->rows, (uint64_t)m->cols, m->ld));
    if (batch > 1) {
        if (batch > TP_MM_BATCH_MAX) /* tp_mm_call_batch never asks for more */
            return tp_fail(err, TP_INTERNAL, "cuda rank %d: a GEMM call's batch of %lld is over cuBLASLt's int32 count",
                           x->rank, (long long)batch);
        int32_t count = (int32_t)batch;
        BLAS_TRY(x, err, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                          sizeof count));
        BLAS_TRY(x, err, cublasLtMatrixLayoutSetAttribute(*l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                          sizeof stride));
    }
    return TP_OK;
}

static tp_status make_desc(cu_ctx *x, gemm_entry *g, tp_err *err)
{
    BLAS_TRY(x, err, cublasLtMatmulDescCreate(&g->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = g->key.ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb = g->key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    BLAS_TRY(x, err, cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    BLAS_TRY(x, err, cublasLtMatmulDescSetAttribute(g->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    return TP_OK;
}

/* The heuristic's best algorithm for these layouts, alignments and the
 * preallocated workspace. */
static tp_status pick_algo(cu_ctx *x, gemm_entry *g, tp_err *err)
{
    cublasLtMatmulPreference_t pref;
    BLAS_TRY(x, err, cublasLtMatmulPreferenceCreate(&pref));
    uint64_t ws = x->lt_ws_bytes;
    cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                                            sizeof ws);
    const uint32_t al[4] = {g->key.al_a, g->key.al_b, g->key.al_d, g->key.al_d};
    static const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        const char *call;
    } align[4] = {
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_A_BYTES)"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_B_BYTES)"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_C_BYTES)"},
        {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, "cublasLtMatmulPreferenceSetAttribute(MIN_ALIGNMENT_D_BYTES)"}};
    const char *call = "cublasLtMatmulPreferenceSetAttribute(MAX_WORKSPACE_BYTES)";
    for (int i = 0; i < 4 && s == CUBLAS_STATUS_SUCCESS; i++) {
        call = align[i].call;
        s = cublasLtMatmulPreferenceSetAttribute(pref, align[i].attr, &al[i], sizeof al[i]);
    }
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    if (s == CUBLAS_STATUS_SUCCESS) {
        call = "cublasLtMatmulAlgoGetHeuristic";
        s = cublasLtMatmulAlgoGetHeuristic(x->lt, g->desc, g->la, g->lb, g->ld, g->ld, pref, 1, &res, &found);
    }
    cu_warn_blas(x, cublasLtMatmulPreferenceDestroy(pref), "cublasLtMatmulPreferenceDestroy");
    if (s != CUBLAS_STATUS_SUCCESS)
        return cu_fail_blas(x, err, s, call, __FILE__, __LINE__);
    if (found < 1)
        return tp_fail(err, TP_BACKEND,
                       "cuda rank %d: cuBLASLt has no algorithm for m=%lld n=%lld k=%lld (%s, ld %lld/%lld/%lld, "
                       "batch %lld, alignments %u/%u/%u, workspace %zu)",
                       x->rank, (long long)g->key.m, (long long)g->key.n, (long long)g->key.k,
                       tp_dtype_name((tp_dtype)g->key.dtype), (long long)g->key.lda, (long long)g->key.ldb,
                       (long long)g->key.ldd, (long long)g->key.batch, g->key.al_a, g->key.al_b, g->key.al_d,
                       x->lt_ws_bytes);
    g->algo = res.algo;
    return TP_OK;
}

static tp_status entry_init(cu_ctx *x, gemm_entry *g, const tp_gemm_plan *p, tp_err *err)
{
    tp_dtype dt = (tp_dtype)g->key.dtype;
    TP_TRY(make_desc(x, g, err));
    TP_TRY(make_layout(x, &g->la, dt, &p->a, g->key.batch, g->key.sa, err));
    TP_TRY(make_layout(x, &g->lb, dt, &p->b, g->key.batch, g->key.sb, err));
    TP_TRY(make_layout(x, &g->ld, dt, &p->d, g->key.batch, g->key.sd, err));
    return pick_algo(x, g, err);
}

static tp_status lookup(cu_ctx *x, const gemm_key *k, const tp_gemm_plan *p, gemm_entry **out, tp_err *err)
{
    cu_gemm_cache *c = x->gemm;
    for (int i = 0; i < c->n; i++)
        if (memcmp(&c->e[i].key, k, sizeof *k) == 0) {
            *out = &c->e[i];
            return TP_OK;
        }
    if (TP_GROW(c->e, c->cap, c->n, 32) != 0)
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of memory for the GEMM cache", x->rank);
    gemm_entry *g = &c->e[c->n];
    memset(g, 0, sizeof *g);
    g->key = *k;
    tp_status st = entry_init(x, g, p, err);
    if (st != TP_OK) {
        entry_free(x, g);
        return st;
    }
    c->n++;
    *out = g;
    return TP_OK;
}

/* ---------------------------------------------------------------- calls */

typedef struct {
    const char *a, *b; /* graph A and B at this call */
    char *d;
    int64_t batch, bsa, bsb, bsd;
} gemm_call;

static tp_status run_one(cu_ctx *x, tp_dtype dt, const tp_gemm_plan *p, const gemm_call *c, float beta,
                         cudaStream_t s, tp_err *err)
{
    int64_t es = (int64_t)tp_dtype_size(dt);
    gemm_key k;
    memset(&k, 0, sizeof k); /* padding takes part in memcmp */
    k.dtype = (int)dt;
    k.ta = p->a.trans;
    k.tb = p->b.trans;
    k.m = p->m;
    k.n = p->n;
    k.k = p->k;
    k.lda = p->a.ld;
    k.ldb = p->b.ld;
    k.ldd = p->d.ld;
    k.batch = c->batch;
    k.sa = c->batch > 1 ? c->bsb : 0; /* cuBLASLt's A is the graph's B */
    k.sb = c->batch > 1 ? c->bsa : 0;
    k.sd = c->batch > 1 ? c->bsd : 0;
    k.al_a = tp_gemm_alignment((uintptr_t)c->b, p->a.ld * es, k.sa * es);
    k.al_b = tp_gemm_alignment((uintptr_t)c->a, p->b.ld * es, k.sb * es);
    k.al_d = tp_gemm_alignment((uintptr_t)c->d, p->d.ld * es, k.sd * es);
    gemm_entry *g = NULL;
    TP_TRY(lookup(x, &k, p, &g, err));
    const float alpha = 1.0f;
    BLAS_TRY(x, err, cublasLtMatmul(x->lt, g->desc, &alpha, c->b, g->la, c->a, g->lb, &beta, c->d, g->ld, c->d, g->ld,
                                    &g->algo, x->lt_ws, x->lt_ws_bytes, s));
    return TP_OK;
}

static tp_status zero_view(cu_ctx *x, tp_tensor *out, cudaStream_t s, tp_err *err)
{
    const int64_t *st[2] = {out->stride, out->stride};
    tp_layout l;
    tp_layout_init(&l, out->ndim, out->shape, 2, st);
    KERNEL_TRY(x, err, tp_cuda_copy_strided(out->data, NULL, &l, (int)tp_dtype_size(out->dtype), s));
    return TP_OK;
}

static tp_status mm_check(cu_ctx *x, const tp_tensor *a, const tp_tensor *b, int tb, const tp_tensor *out,
                          tp_mm_problem *p, tp_err *err)
{
    char s1[96], s2[96], s3[96];
    if (a->dtype != out->dtype || b->dtype != out->dtype || !tp_dtype_is_float(out->dtype))
        return tp_fail(err, TP_INVALID, "matmul: needs float inputs of the output dtype, got %s x %s -> %s",
                       tp_dtype_name(a->dtype), tp_dtype_name(b->dtype), tp_dtype_name(out->dtype));
    if (tp_mm_problem_make(a, b, tb, out, p) != 0)
        return tp_fail(err, TP_INVALID, "matmul%s: shapes %s and %s do not give %s", tb ? " (transpose_b)" : "",
                       tp_shape_str(s1, sizeof s1, a->ndim, a->shape), tp_shape_str(s2, sizeof s2, b->ndim, b->shape),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    (void)x;
    return TP_OK;
}

/* The problem and plan for a, b, out, packing a or b contiguous into
 * scratch when cuBLASLt cannot read them as they are. */
static tp_status prepare(cu_ctx *x, tp_tensor *a, tp_tensor *b, int tb, const tp_tensor *out, tp_mm_problem *p,
                         tp_gemm_plan *g, cudaStream_t s, tp_err *err)
{
    TP_TRY(mm_check(x, a, b, tb, out, p, err));
    int bad = tp_gemm_plan_make(p->M, p->N, p->K, p->sam, p->sak, p->sbk, p->sbn, p->sdm, p->sdn, g);
    if (bad & 4)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: matmul output view must be unit-stride in its last dim",
                       x->rank);
    if (!bad)
        return TP_OK;
    if (bad & 1)
        TP_TRY(cu_contiguous(x, a, a, s, err));
    if (bad & 2)
        TP_TRY(cu_contiguous(x, b, b, s, err));
    TP_TRY(mm_check(x, a, b, tb, out, p, err));
    if (tp_gemm_plan_make(p->M, p->N, p->K, p->sam, p->sak, p->sbk, p->sbn, p->sdm, p->sdn, g) != 0)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: matmul operands still unusable after packing", x->rank);
    return TP_OK;
}

tp_status cu_matmul(cu_ctx *x, const tp_tensor *a_in, const tp_tensor *b_in, int transpose_b, tp_tensor *out,
                    float beta, cudaStream_t s, tp_err *err)
{
    tp_tensor a = *a_in, b = *b_in;
    tp_mm_problem p;
    tp_gemm_plan g;
    TP_TRY(mm_check(x, &a, &b, transpose_b, out, &p, err));
    if (tp_tensor_numel(out) == 0)
        return TP_OK;
    if (p.K == 0)
        return beta == 0.0f ? zero_view(x, out, s, err) : TP_OK;
    TP_TRY(prepare(x, &a, &b, transpose_b, out, &p, &g, s, err));
    int64_t es = (int64_t)tp_dtype_size(out->dtype);
    for (int64_t i = 0; i < tp_mm_n_calls(&p); i++) {
        int64_t oa, ob, od;
        tp_mm_call_offsets(&p, i, &oa, &ob, &od);
        gemm_call c = {
            .a = (const char *)a.data + oa * es,
            .b = (const char *)b.data + ob * es,
            .d = (char *)out->data + od * es,
            .batch = tp_mm_call_batch(&p, i),
            .bsa = p.bsa,
            .bsb = p.bsb,
            .bsd = p.bsd,
        };
        TP_TRY(run_one(x, out->dtype, &g, &c, beta, s, err));
    }
    return TP_OK;
}
