// elementwise.cu — CUDA unary functions (tp_math.h's TP_UNARY_FN_LIST:
// activations, sqrt, exp, pow, ...) and row kernels (softmax, layer_norm,
// rms_norm) for FP32/FP16/BF16 storage.
//
// The per-element math is kernels/common/tp_math.h and the storage
// conversions are engine/dtype.h, the very functions the cpu backend runs, so
// both backends agree up to the order of the row reductions. A row kernel
// gives each row one block: the threads reduce strided slices of the row, the
// block combines them (warp shuffles, then one warp over the warp results),
// and every thread applies the shared scalar functions to its slice.
#include <cuda_runtime.h>

#include <stdint.h>
#include <type_traits>

#include "common/tp_math.h"
#include "cuda/tp_cuda_kernels.h"

namespace {

constexpr int kThreads = 256;        // a multiple of 32
constexpr int64_t kMaxBlocks = 65535; // grid-stride loops cover the rest

template <int DT>
__device__ __forceinline__ float ld(const void *p, int64_t i)
{
    return tp_load_f32(p, (tp_dtype)DT, i);
}

template <int DT>
__device__ __forceinline__ void st(void *p, int64_t i, float v)
{
    tp_store_f32(p, (tp_dtype)DT, i, v);
}

// ---- unary functions ----

// FN is a compile-time tp_unary_fn, so tp_unary's switch folds away.
template <int DT, int FN>
__global__ void unary_kernel(const void *x, void *y, int64_t n, float p)
{
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        st<DT>(y, i, tp_unary((tp_unary_fn)FN, ld<DT>(x, i), p));
}

// ---- block reductions ----

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Every thread of the block gets the block's max (MAX) or sum of v.
// sh holds 33 floats; the trailing barrier lets the caller reuse it.
template <bool MAX>
__device__ float block_reduce(float v, float *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = MAX ? warp_max(v) : warp_sum(v);
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float t = lane < nwarps ? sh[lane] : (MAX ? -INFINITY : 0.0f);
        t = MAX ? warp_max(t) : warp_sum(t);
        if (lane == 0)
            sh[32] = t;
    }
    __syncthreads();
    float r = sh[32];
    __syncthreads();
    return r;
}

// ---- row kernels ----

// Row r of [outer, n, inner] starts at (r / inner) * n * inner + r % inner
// and steps by inner.
template <int DT>
__global__ void softmax_kernel(const void *x, void *y, int64_t rows, int64_t n, int64_t inner)
{
    __shared__ float sh[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = (r / inner) * n * inner + r % inner;
        float m = -INFINITY;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            m = fmaxf(m, ld<DT>(x, base + i * inner));
        m = block_reduce<true>(m, sh);
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += tp_softmax_exp(ld<DT>(x, base + i * inner), m);
        float inv = tp_softmax_inv(block_reduce<false>(s, sh));
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            int64_t j = base + i * inner;
            st<DT>(y, j, tp_softmax_exp(ld<DT>(x, j), m) * inv);
        }
    }
}

// Mean of (x - c)^2 over one row, c = mean for layer_norm, 0 for rms_norm.
template <int DT>
__device__ float row_mean_sqdev(const void *x, int64_t base, int64_t n, float c, float *sh)
{
    float s = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float d = ld<DT>(x, base + i) - c;
        s += d * d;
    }
    return block_reduce<false>(s, sh) / (float)n;
}

template <int DT>
__global__ void layer_norm_kernel(const void *x, const void *w, const void *b, void *y,
                                  int64_t rows, int64_t n, float eps)
{
    __shared__ float sh[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * n;
        float s = 0.0f;
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
            s += ld<DT>(x, base + i);
        float mean = block_reduce<false>(s, sh) / (float)n;
        float rstd = tp_rstd(row_mean_sqdev<DT>(x, base, n, mean, sh), eps);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float wi = w ? ld<DT>(w, i) : 1.0f, bi = b ? ld<DT>(b, i) : 0.0f;
            st<DT>(y, base + i, tp_layer_norm_apply(ld<DT>(x, base + i), mean, rstd, wi, bi));
        }
    }
}

template <int DT>
__global__ void rms_norm_kernel(const void *x, const void *w, void *y, int64_t rows, int64_t n,
                                float eps)
{
    __shared__ float sh[33];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = r * n;
        float rstd = tp_rstd(row_mean_sqdev<DT>(x, base, n, 0.0f, sh), eps);
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            float wi = w ? ld<DT>(w, i) : 1.0f;
            st<DT>(y, base + i, tp_rms_norm_apply(ld<DT>(x, base + i), rstd, wi));
        }
    }
}

// ---- host side ----

int blocks_for(int64_t work)
{
    return (int)(work < kMaxBlocks ? work : kMaxBlocks);
}

// Calls f(std::integral_constant<int, DT>) for a float storage dtype and
// returns the launch status; a non-float dtype is cudaErrorInvalidValue.
template <typename F>
int dispatch(tp_dtype dt, F &&f)
{
    switch (dt) {
    case TP_F32: f(std::integral_constant<int, TP_F32>{}); break;
    case TP_F16: f(std::integral_constant<int, TP_F16>{}); break;
    case TP_BF16: f(std::integral_constant<int, TP_BF16>{}); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

// What a row kernel's sizes and buffers allow: cudaErrorInvalidValue for a
// negative size or a missing buffer with work to do, cudaSuccess when there
// is nothing to do, kLaunch to launch.
constexpr int kLaunch = -1;
int row_launch_check(const void *x, const void *y, int64_t rows, int64_t n)
{
    if (rows < 0 || n < 0)
        return (int)cudaErrorInvalidValue;
    if (rows == 0 || n == 0)
        return (int)cudaSuccess;
    return x && y ? kLaunch : (int)cudaErrorInvalidValue;
}

template <int FN>
int launch_unary(const void *x, void *y, int64_t n, tp_dtype dt, float p, void *stream)
{
    int check = row_launch_check(x, y, 1, n);
    if (check != kLaunch)
        return check;
    int grid = blocks_for((n + kThreads - 1) / kThreads);
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    return dispatch(dt, [&](auto d) {
        unary_kernel<decltype(d)::value, FN><<<grid, kThreads, 0, s>>>(x, y, n, p);
    });
}

} // namespace

extern "C" int tp_cuda_unary(tp_unary_fn fn, const void *x, void *y, int64_t n, tp_dtype dtype, float p,
                             void *stream)
{
    switch (fn) {
#define UNARY_LAUNCH(name, expr) case name: return launch_unary<name>(x, y, n, dtype, p, stream);
        TP_UNARY_FN_LIST(UNARY_LAUNCH)
#undef UNARY_LAUNCH
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int tp_cuda_softmax(const void *x, void *y, int64_t outer, int64_t n, int64_t inner,
                               tp_dtype dtype, void *stream)
{
    if (outer < 0 || inner < 0)
        return (int)cudaErrorInvalidValue;
    int64_t rows = outer * inner;
    int check = row_launch_check(x, y, rows, n);
    if (check != kLaunch)
        return check;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int grid = blocks_for(rows);
    return dispatch(dtype, [&](auto d) {
        softmax_kernel<decltype(d)::value><<<grid, kThreads, 0, s>>>(x, y, rows, n, inner);
    });
}

extern "C" int tp_cuda_layer_norm(const void *x, const void *weight, const void *bias, void *y,
                                  int64_t rows, int64_t n, float eps, tp_dtype dtype,
                                  void *stream)
{
    int check = row_launch_check(x, y, rows, n);
    if (check != kLaunch)
        return check;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int grid = blocks_for(rows);
    return dispatch(dtype, [&](auto d) {
        layer_norm_kernel<decltype(d)::value><<<grid, kThreads, 0, s>>>(x, weight, bias, y, rows,
                                                                          n, eps);
    });
}

extern "C" int tp_cuda_rms_norm(const void *x, const void *weight, void *y, int64_t rows,
                                int64_t n, float eps, tp_dtype dtype, void *stream)
{
    int check = row_launch_check(x, y, rows, n);
    if (check != kLaunch)
        return check;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int grid = blocks_for(rows);
    return dispatch(dtype, [&](auto d) {
        rms_norm_kernel<decltype(d)::value><<<grid, kThreads, 0, s>>>(x, weight, y, rows, n, eps);
    });
}
