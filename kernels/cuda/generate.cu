// generate.cu — the cuda kernels of the generation ops: kv_attention (cache
// writes, then causal attention over the caches), argmax (packed keys),
// argmax_index and matmul_rows' zeroing of unwanted rows. The index and packing math is kernels/common/tp_generate.h
// and the softmax pieces tp_math.h, the functions the cpu kernels
// (kernels/cpu/ops_generate.c) run and test_generate checks on the CPU.
// Launchers check their arguments and return cudaGetLastError() after every
// launch; errors only the device sees (a bad slot or position) go to the
// backend's error word (tp_cuda_ops.h).
#include <cuda_runtime.h>

#include <stdint.h>
#include <type_traits>

#include "common/tp_cuda_plan.h"
#include "common/tp_generate.h"
#include "common/tp_math.h"
#include "cuda/tp_cuda_ops.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;
constexpr int kWarps = 4;
constexpr int kPerLane = TP_CUDA_ATTN_MAX_DV / 32;

int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b < kMaxBlocks ? b : kMaxBlocks);
}

cudaStream_t as_stream(void *s) { return static_cast<cudaStream_t>(s); }

// The first device-side error wins (tensor_ops.cu's rule for the same word).
__device__ void report(tp_cuda_error *e, int code, int a, long long b, long long c)
{
    if (e && atomicCAS(&e->code, 0, code) == 0) {
        e->a = a;
        e->b = b;
        e->c = c;
    }
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Row b's slot check (tp_gen_row_check); the one thread given `reporter`
// reports a bad row.
__device__ tp_gen_row row_state(const tp_cuda_kv_args &a, int64_t b, int64_t *seq, int64_t *pos, bool reporter)
{
    int64_t s = tp_gen_load_index(a.slot, a.slot_dtype, b * a.ss);
    *pos = tp_gen_load_index(a.pos, a.pos_dtype, b * a.ps);
    *seq = s - 1;
    tp_gen_row r = tp_gen_row_check(s, *pos, a.S, a.T, a.L);
    if (reporter && (r == TP_GEN_ROW_BAD_SLOT || r == TP_GEN_ROW_BAD_POS))
        report(a.err, TP_CUDA_ERR_KV_ROW, (int)b, s, *pos);
    return r;
}

// One thread per element of k (and v): into the caches at (slot-1, pos+t).
template <int DT>
__global__ void kv_write_kernel(tp_cuda_kv_args a)
{
    int64_t n = a.B * a.Hkv * a.T * a.D;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t d = i % a.D, t = (i / a.D) % a.T, kvh = (i / (a.D * a.T)) % a.Hkv, b = i / (a.D * a.T * a.Hkv);
        int64_t seq, pos;
        if (row_state(a, b, &seq, &pos, i % (a.D * a.T * a.Hkv) == 0) != TP_GEN_ROW_ACTIVE)
            continue;
        int64_t off = tp_gen_cache_off(seq, kvh, pos + t, a.Hkv, a.L, a.D) + d;
        int64_t ko = b * a.ks[0] + kvh * a.ks[1] + t * a.ks[2] + d * a.ks[3];
        int64_t vo = b * a.vs[0] + kvh * a.vs[1] + t * a.vs[2] + d * a.vs[3];
        if (DT == TP_F32) { // same dtype in and out: a copy of the bits
            ((uint32_t *)a.k_cache)[off] = ((const uint32_t *)a.k)[ko];
            ((uint32_t *)a.v_cache)[off] = ((const uint32_t *)a.v)[vo];
        } else {
            ((uint16_t *)a.k_cache)[off] = ((const uint16_t *)a.k)[ko];
            ((uint16_t *)a.v_cache)[off] = ((const uint16_t *)a.v)[vo];
        }
    }
}

// One warp per query row (b, h, t): online softmax over keys 0 .. pos+t of
// kv head h / (H / Hkv), f32 throughout, as the attention kernel does.
template <int DT>
__global__ void kv_attend_kernel(tp_cuda_kv_args a)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (row >= a.B * a.H * a.T)
        return; // whole warps leave together: shuffles stay converged
    int64_t t = row % a.T, h = (row / a.T) % a.H, b = row / (a.T * a.H);
    int64_t seq, pos;
    tp_gen_row state = row_state(a, b, &seq, &pos, false);
    float m = -INFINITY, l = 0.0f, acc[kPerLane];
    for (int j = 0; j < kPerLane; j++)
        acc[j] = 0.0f;
    if (state == TP_GEN_ROW_ACTIVE) { // the same for the whole warp
        int64_t kvh = tp_attn_kv_head(h, a.H, a.Hkv), qb = b * a.qs[0] + h * a.qs[1] + t * a.qs[2];
        for (int64_t key = 0; key <= pos + t; key++) {
            int64_t cb = tp_gen_cache_off(seq, kvh, key, a.Hkv, a.L, a.D);
            float dot = 0.0f;
            for (int64_t d = lane; d < a.D; d += 32)
                dot += tp_load_f32(a.q, (tp_dtype)DT, qb + d * a.qs[3]) * tp_load_f32(a.k_cache, (tp_dtype)DT, cb + d);
            float sc = warp_sum(dot) * a.scale;
            float m_new = fmaxf(m, sc);
            float corr = tp_softmax_exp(m, m_new), p = tp_softmax_exp(sc, m_new);
            l = l * corr + p;
            for (int j = 0; j < kPerLane; j++) {
                int64_t d = lane + 32 * j;
                float v = d < a.D ? tp_load_f32(a.v_cache, (tp_dtype)DT, cb + d) : 0.0f;
                acc[j] = acc[j] * corr + p * v;
            }
            m = m_new;
        }
    }
    float inv = tp_softmax_inv(l); // 0 for an inactive row: zeros out
    for (int j = 0; j < kPerLane; j++) {
        int64_t d = lane + 32 * j;
        if (d < a.D)
            tp_store_f32(a.out, (tp_dtype)DT, row * a.D + d, acc[j] * inv);
    }
}

// One block per row: each thread's best key over its columns, then a
// shared-memory max.
template <int DT>
__global__ void argmax_kernel(tp_cuda_argmax_args a, int64_t rows)
{
    __shared__ long long best[kThreads];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        int64_t base = tp_layout_offset(&a.rows_l, 0, r), mine = TP_GEN_NO_KEY;
        for (int64_t j = threadIdx.x; j < a.n && a.lo + j < a.limit; j += blockDim.x) {
            int64_t key = tp_gen_key(tp_load_f32(a.x, (tp_dtype)DT, base + j * a.xs), (uint32_t)(a.lo + j));
            mine = key > mine ? key : mine;
        }
        best[threadIdx.x] = mine;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if ((int)threadIdx.x < s && best[threadIdx.x + s] > best[threadIdx.x])
                best[threadIdx.x] = best[threadIdx.x + s];
            __syncthreads();
        }
        if (threadIdx.x == 0)
            a.out[r] = best[0];
        __syncthreads(); // best[] is reused by the next row
    }
}

__global__ void argmax_index_kernel(const int64_t *keys, int64_t *out, tp_layout l, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        out[tp_layout_offset(&l, 1, i)] = tp_gen_key_index(keys[tp_layout_offset(&l, 0, i)]);
}

// Every element of a row the mask does not want becomes +0.0 (all-zero
// bits in FP32, FP16 and BF16 alike, so one element size is all it needs).
template <typename E>
__global__ void zero_rows_kernel(E *out, int64_t row_elems, const void *mask, tp_dtype mdt, int64_t ms, int64_t n)
{
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        if (!tp_gen_row_wanted(mask, mdt, ms, i / row_elems))
            out[i] = E(0);
}

// Calls f with the float dtype as a compile-time constant; other dtypes are
// refused.
template <typename F>
int by_float(tp_dtype dt, F &&f)
{
    switch (dt) {
    case TP_F32: f(std::integral_constant<int, TP_F32>{}); break;
    case TP_F16: f(std::integral_constant<int, TP_F16>{}); break;
    case TP_BF16: f(std::integral_constant<int, TP_BF16>{}); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

} // namespace

extern "C" int tp_cuda_kv_attention(const tp_cuda_kv_args *a, void *stream)
{
    if (!a || !a->q || !a->k || !a->v || !a->k_cache || !a->v_cache || !a->slot || !a->pos || !a->out ||
        a->D < 1 || a->D > TP_CUDA_ATTN_MAX_DV || a->Hkv < 1 || a->H % a->Hkv != 0 || a->T < 1 || a->L < 1 ||
        (a->slot_dtype != TP_I32 && a->slot_dtype != TP_I64) || (a->pos_dtype != TP_I32 && a->pos_dtype != TP_I64))
        return (int)cudaErrorInvalidValue;
    int64_t rows = a->B * a->H * a->T, blocks = (rows + kWarps - 1) / kWarps;
    if (rows <= 0)
        return (int)cudaSuccess;
    if (blocks > INT32_MAX)
        return (int)cudaErrorInvalidValue;
    tp_cuda_kv_args ac = *a;
    int rc = by_float(a->dtype, [&](auto d) {
        kv_write_kernel<decltype(d)::value><<<blocks_for(a->B * a->Hkv * a->T * a->D), kThreads, 0,
                                              as_stream(stream)>>>(ac);
    });
    if (rc != (int)cudaSuccess)
        return rc;
    return by_float(a->dtype, [&](auto d) {
        kv_attend_kernel<decltype(d)::value><<<(unsigned)blocks, 32 * kWarps, 0, as_stream(stream)>>>(ac);
    });
}

extern "C" int tp_cuda_argmax(const tp_cuda_argmax_args *a, void *stream)
{
    if (!a || !a->x || !a->out || a->n < 1 || a->lo < 0 || a->rows_l.nops < 1)
        return (int)cudaErrorInvalidValue;
    int64_t rows = tp_layout_numel(&a->rows_l);
    if (rows <= 0)
        return (int)cudaSuccess;
    tp_cuda_argmax_args ac = *a;
    unsigned grid = (unsigned)(rows < kMaxBlocks ? rows : kMaxBlocks);
    return by_float(a->dtype, [&](auto d) {
        argmax_kernel<decltype(d)::value><<<grid, kThreads, 0, as_stream(stream)>>>(ac, rows);
    });
}

extern "C" int tp_cuda_zero_rows(void *out, tp_dtype dtype, int64_t rows, int64_t row_elems, const void *mask,
                                  tp_dtype mask_dtype, int64_t mask_stride, void *stream)
{
    if (!out || !mask || rows < 0 || row_elems < 0 || (mask_dtype != TP_I32 && mask_dtype != TP_I64) ||
        (dtype != TP_F32 && dtype != TP_F16 && dtype != TP_BF16))
        return (int)cudaErrorInvalidValue;
    int64_t n = rows * row_elems;
    if (n <= 0)
        return (int)cudaSuccess;
    if (dtype == TP_F32)
        zero_rows_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(static_cast<uint32_t *>(out), row_elems,
                                                                            mask, mask_dtype, mask_stride, n);
    else
        zero_rows_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(static_cast<uint16_t *>(out), row_elems,
                                                                            mask, mask_dtype, mask_stride, n);
    return (int)cudaGetLastError();
}

extern "C" int tp_cuda_argmax_index(const int64_t *keys, int64_t *out, const tp_layout *l, void *stream)
{
    if (!keys || !out || !l || l->nops < 2)
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(l);
    if (n <= 0)
        return (int)cudaSuccess;
    argmax_index_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(keys, out, *l, n);
    return (int)cudaGetLastError();
}
