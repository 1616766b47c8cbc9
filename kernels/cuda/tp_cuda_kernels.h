/* tp_cuda_kernels.h — host launchers of the CUDA elementwise and row kernels
 * (kernels/cuda/elementwise.cu), callable from C.
 *
 * Every launcher enqueues on `stream` (a cudaStream_t, NULL for the default
 * stream) and returns the cudaError_t of the launch as an int (0 = success;
 * cudaErrorInvalidValue for a bad dtype or size). Buffers are device
 * pointers to contiguous data of `dtype` (TP_F32, TP_F16 or TP_BF16); math is
 * FP32 via kernels/common/tp_math.h, rounded once on store, so results match
 * the cpu backend up to reduction order. y may equal x. */
#ifndef TP_CUDA_KERNELS_H
#define TP_CUDA_KERNELS_H

#include <stdint.h>

#include "common/tp_math.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y[i] = tp_unary(fn, x[i], p) for i < n (p: pow's exponent). */
int tp_cuda_unary(tp_unary_fn fn, const void *x, void *y, int64_t n, tp_dtype dtype, float p, void *stream);

/* Softmax over the middle dim of a contiguous [outer, n, inner] tensor
 * (softmax on dim d: outer = prod(shape[:d]), n = shape[d], inner =
 * prod(shape[d+1:])). A fully masked (-inf) row gives zeros. */
int tp_cuda_softmax(const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                    tp_dtype dtype, void *stream);

/* Over the last dim of contiguous [rows, n]; weight and bias are [n] of the
 * same dtype and may be NULL (1 and 0). */
int tp_cuda_layer_norm(const void *x, const void *weight, const void *bias, void *y, int64_t rows,
                       int64_t n, float eps, tp_dtype dtype, void *stream);
int tp_cuda_rms_norm(const void *x, const void *weight, void *y, int64_t rows, int64_t n,
                     float eps, tp_dtype dtype, void *stream);

#ifdef __cplusplus
}
#endif

#endif
