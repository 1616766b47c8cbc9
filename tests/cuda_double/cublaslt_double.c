/* cublaslt_double.c — the cuBLASLt calls of the cuda backend: handles and
 * descriptors are host objects (leaks show under ASan), a heuristic offers
 * one algorithm without workspace unless TP_DOUBLE_FAIL blas_algo says it
 * finds none (then, as cuBLASLt does, CUBLAS_STATUS_NOT_SUPPORTED and a
 * count of 0), and a matmul is a recorded launch like any kernel, counted
 * with the output columns it asks for (dbl_gemm_calls, dbl_gemm_cols). */
#include <cublasLt.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_double.h"

struct cublasLtContext {
    int unused;
};

cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    if (dbl_refuse_in_capture("cublasLtCreate"))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    *h = calloc(1, sizeof **h);
    return *h ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED;
}

cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    free(h);
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasLtGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    default: return "CUBLAS_STATUS_(cuda double)";
    }
}

const char *cublasLtGetStatusString(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? "success" : "failure"; }

#define OPAQUE(type, create, destroy)                           \
    cublasStatus_t destroy(type d)                              \
    {                                                           \
        free(d);                                                \
        return CUBLAS_STATUS_SUCCESS;                           \
    }                                                           \
    static cublasStatus_t create(type *d)                       \
    {                                                           \
        *d = calloc(1, sizeof **d);                             \
        return *d ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_ALLOC_FAILED; \
    }
OPAQUE(cublasLtMatmulDesc_t, new_desc, cublasLtMatmulDescDestroy)
OPAQUE(cublasLtMatrixLayout_t, new_layout, cublasLtMatrixLayoutDestroy)
OPAQUE(cublasLtMatmulPreference_t, new_pref, cublasLtMatmulPreferenceDestroy)

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t ct, cudaDataType_t st)
{
    (void)ct, (void)st;
    return new_desc(d);
}

/* What a layout's semi-opaque words hold here (cublasLtMatrixLayoutOpaque_t). */
enum { LAYOUT_COLS, LAYOUT_BATCH };

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType type, uint64_t rows,
                                          uint64_t cols, int64_t ld)
{
    (void)type, (void)rows, (void)ld;
    cublasStatus_t st = new_layout(l);
    if (st == CUBLAS_STATUS_SUCCESS) {
        (*l)->data[LAYOUT_COLS] = cols;
        (*l)->data[LAYOUT_BATCH] = 1;
    }
    return st;
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p) { return new_pref(p); }

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a,
                                              const void *buf, size_t n)
{
    (void)d, (void)a, (void)buf, (void)n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t l, cublasLtMatrixLayoutAttribute_t a,
                                                const void *buf, size_t n)
{
    if (a == CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT) {
        int32_t count;
        if (n != sizeof count)
            return CUBLAS_STATUS_INVALID_VALUE;
        memcpy(&count, buf, sizeof count);
        l->data[LAYOUT_BATCH] = (uint64_t)count;
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t a, const void *buf,
                                                    size_t n)
{
    (void)p, (void)a, (void)buf, (void)n;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t d, cublasLtMatrixLayout_t a,
                                              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c,
                                              cublasLtMatrixLayout_t dd, cublasLtMatmulPreference_t p, int want,
                                              cublasLtMatmulHeuristicResult_t out[], int *got)
{
    (void)h, (void)d, (void)a, (void)b, (void)c, (void)dd, (void)p;
    *got = 0;
    if (want < 1)
        return CUBLAS_STATUS_INVALID_VALUE;
    if (dbl_inject(DBL_FAIL_BLAS_ALGO))
        return CUBLAS_STATUS_NOT_SUPPORTED;
    out[0] = (cublasLtMatmulHeuristicResult_t){.workspaceSize = 0, .state = CUBLAS_STATUS_SUCCESS};
    *got = 1;
    return CUBLAS_STATUS_SUCCESS;
}

static atomic_long gemm_calls, gemm_cols;

long dbl_gemm_calls(void) { return atomic_load(&gemm_calls); }
long dbl_gemm_cols(void) { return atomic_load(&gemm_cols); }

/* Counted when called (recorded once in a capture, however often it is
 * replayed). */
cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t d, const void *alpha, const void *A,
                              cublasLtMatrixLayout_t ad, const void *B, cublasLtMatrixLayout_t bd, const void *beta,
                              const void *C, cublasLtMatrixLayout_t cd, void *D, cublasLtMatrixLayout_t dd,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t ws_bytes, cudaStream_t s)
{
    (void)h, (void)d, (void)alpha, (void)A, (void)ad, (void)B, (void)bd, (void)beta, (void)C, (void)cd, (void)D,
        (void)algo, (void)ws, (void)ws_bytes;
    atomic_fetch_add(&gemm_calls, 1);
    atomic_fetch_add(&gemm_cols, (long)(dd->data[LAYOUT_COLS] * dd->data[LAYOUT_BATCH]));
    return dbl_launch(s, "cublasLtMatmul") == 0 ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}
