// tensor_ops.cu — the cuda backend's copy, broadcast-binary, embedding,
// attention, block-pack and chunk-reduce kernels, and the index ops of ONNX
// exports (reduce over one dim, gather, where, cast).
//
// Every index computation is a tp_cuda_plan.h function (tp_layout_offset,
// tp_block_packed_index, tp_rs_step_of, the tp_reduce_* steps) that
// test_cuda_plan checks on the CPU; the storage conversions are dtype.h and
// the softmax pieces tp_math.h, the same functions the cpu backend runs.
// Kernels use grid-stride loops, so any size runs on a bounded grid.
#include <cuda_runtime.h>

#include <stdint.h>
#include <type_traits>

#include "common/tp_attn_mask.h"
#include "common/tp_cuda_plan.h"
#include "common/tp_math.h"
#include "cuda/tp_cuda_ops.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

int blocks_for(int64_t n)
{
    int64_t b = (n + kThreads - 1) / kThreads;
    return (int)(b < 1 ? 1 : b < kMaxBlocks ? b : kMaxBlocks);
}

__device__ __forceinline__ int64_t first_index() { return (int64_t)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ int64_t grid_step() { return (int64_t)gridDim.x * blockDim.x; }

// Records the first device-side error; later ones are dropped.
__device__ void report(tp_cuda_error *e, int code, int a, long long b, long long c)
{
    if (e && atomicCAS(&e->code, 0, code) == 0) {
        e->a = a;
        e->b = b;
        e->c = c;
    }
}

// ---- strided copy ----

template <typename T>
__global__ void copy_kernel(T *dst, const T *src, tp_layout l, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        dst[tp_layout_offset(&l, 0, i)] = src ? src[tp_layout_offset(&l, 1, i)] : T(0);
}

// Calls f(T{}) with the unsigned type of es bytes; other sizes are refused.
template <typename F>
int by_size(int es, F &&f)
{
    switch (es) {
    case 1: f(uint8_t{}); break;
    case 2: f(uint16_t{}); break;
    case 4: f(uint32_t{}); break;
    case 8: f(uint64_t{}); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

// ---- broadcast binary ----

template <int DT>
__device__ __forceinline__ void binary_at(int op, const void *a, int64_t ia, const void *b, int64_t ib, void *o,
                                          int64_t io)
{
    if constexpr (DT == TP_I32 || DT == TP_I64) {
        using T = std::conditional_t<DT == TP_I32, int32_t, int64_t>;
        using U = std::make_unsigned_t<T>;
        U x = (U)((const T *)a)[ia], y = (U)((const T *)b)[ib];
        ((T *)o)[io] = (T)(op == 0 ? x + y : op == 1 ? x - y : x * y); // wraps
    } else {
        float x = tp_load_f32(a, (tp_dtype)DT, ia), y = tp_load_f32(b, (tp_dtype)DT, ib);
        tp_store_f32(o, (tp_dtype)DT, io, op == 0 ? x + y : op == 1 ? x - y : op == 2 ? x * y : x / y);
    }
}

template <int DT>
__global__ void binary_kernel(int op, const void *a, const void *b, void *o, tp_layout l, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        binary_at<DT>(op, a, tp_layout_offset(&l, 0, i), b, tp_layout_offset(&l, 1, i), o,
                      tp_layout_offset(&l, 2, i));
}

template <typename F>
int by_dtype(tp_dtype dt, F &&f)
{
    switch (dt) {
    case TP_F32: f(std::integral_constant<int, TP_F32>{}); break;
    case TP_F16: f(std::integral_constant<int, TP_F16>{}); break;
    case TP_BF16: f(std::integral_constant<int, TP_BF16>{}); break;
    case TP_I32: f(std::integral_constant<int, TP_I32>{}); break;
    case TP_I64: f(std::integral_constant<int, TP_I64>{}); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

// ---- embedding ----

template <typename T>
__global__ void embedding_kernel(tp_cuda_embedding_args a, int64_t n_ids)
{
    const T *table = (const T *)a.table;
    T *out = (T *)a.out;
    for (int64_t i = first_index(); i < n_ids * a.E; i += grid_step()) {
        int64_t row = i / a.E, j = i % a.E, off = tp_layout_offset(&a.ids_l, 0, row);
        int64_t id = a.id_dtype == TP_I32 ? (int64_t)((const int32_t *)a.ids)[off] : ((const int64_t *)a.ids)[off];
        if (id < 0 || id >= a.total) {
            if (j == 0)
                report(a.err, TP_CUDA_ERR_EMBED_ID, 0, id, row);
            out[i] = T(0);
        } else if (id < a.lo || id >= a.lo + a.V) {
            out[i] = T(0); // another rank's rows (vocab_parallel): 0 bits are 0.0
        } else {
            out[i] = table[(id - a.lo) * a.ts0 + j * a.ts1];
        }
    }
}

// ---- attention ----

constexpr int kAttnWarps = 4;
constexpr int kAttnPerLane = TP_CUDA_ATTN_MAX_DV / 32;

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <int DT>
__device__ float attn_score(const tp_cuda_attn_args &a, int64_t qb, int64_t kb, int lane)
{
    float dot = 0.0f;
    for (int64_t d = lane; d < a.D; d += 32)
        dot += tp_load_f32(a.q, (tp_dtype)DT, qb + d * a.qs[3]) * tp_load_f32(a.k, (tp_dtype)DT, kb + d * a.ks[3]);
    return warp_sum(dot) * a.scale;
}

template <int DT>
__global__ void attention_kernel(tp_cuda_attn_args a)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * kAttnWarps + (threadIdx.x >> 5);
    if (row >= a.B * a.H * a.S)
        return; // whole warps leave together: shuffles stay converged
    int64_t s = row % a.S, h = (row / a.S) % a.H, b = row / (a.S * a.H);
    int64_t qb = b * a.qs[0] + h * a.qs[1] + s * a.qs[2];
    int64_t kvh = tp_attn_kv_head(h, a.H, a.Hkv);
    int64_t kb = b * a.ks[0] + kvh * a.ks[1], vb = b * a.vs[0] + kvh * a.vs[1];
    int64_t allowed = tp_attn_causal_keys(s, a.S, a.T, a.causal);
    float m = -INFINITY, l = 0.0f, acc[kAttnPerLane];
    for (int j = 0; j < kAttnPerLane; j++)
        acc[j] = 0.0f;
    for (int64_t t = 0; t < allowed; t++) {
        // every lane of the warp reads the same flag: the skip keeps it converged
        if (a.mask && !tp_attn_key_on(a.mask, a.mask_dtype, b * a.ms[0] + t * a.ms[1]))
            continue;
        float sc = attn_score<DT>(a, qb, kb + t * a.ks[2], lane);
        float m_new = fmaxf(m, sc);
        float corr = tp_softmax_exp(m, m_new), p = tp_softmax_exp(sc, m_new);
        l = l * corr + p;
        for (int j = 0; j < kAttnPerLane; j++) {
            int64_t d = lane + 32 * j;
            float v = d < a.Dv ? tp_load_f32(a.v, (tp_dtype)DT, vb + t * a.vs[2] + d * a.vs[3]) : 0.0f;
            acc[j] = acc[j] * corr + p * v;
        }
        m = m_new;
    }
    float inv = tp_softmax_inv(l);
    for (int j = 0; j < kAttnPerLane; j++) {
        int64_t d = lane + 32 * j;
        if (d < a.Dv)
            tp_store_f32(a.out, (tp_dtype)DT, row * a.Dv + d, acc[j] * inv);
    }
}

// ---- block pack ----

template <typename T>
__global__ void pack_kernel(const T *src, T *dst, int64_t outer, int64_t len, int64_t inner, int d, int to_packed)
{
    int64_t n = outer * (int64_t)d * len * inner;
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t p = tp_block_packed_index(i, outer, len, inner, d);
        if (to_packed)
            dst[p] = src[i];
        else
            dst[i] = src[p];
    }
}

// ---- reductions ----

template <int DT>
__global__ void reduce_chunks_kernel(const void *own, const void *stage, void *out, int64_t count, int rank, int d,
                                     int red)
{
    for (int64_t i = first_index(); i < count; i += grid_step()) {
        auto at = [&](int src) {
            return src == rank ? i : (int64_t)tp_rs_step_of(rank, d, src) * count + i;
        };
        auto buf = [&](int src) { return src == rank ? own : stage; };
        if constexpr (DT == TP_I32 || DT == TP_I64) {
            using T = std::conditional_t<DT == TP_I32, int32_t, int64_t>;
            int64_t acc = ((const T *)buf(0))[at(0)];
            for (int r = 1; r < d; r++)
                acc = tp_reduce_step_i64(acc, ((const T *)buf(r))[at(r)], red);
            ((T *)out)[i] = (T)(uint64_t)tp_reduce_finish_i64(acc, red, d);
        } else {
            float acc = tp_load_f32(buf(0), (tp_dtype)DT, at(0));
            for (int r = 1; r < d; r++)
                acc = tp_reduce_step_f32(acc, tp_load_f32(buf(r), (tp_dtype)DT, at(r)), red);
            tp_store_f32(out, (tp_dtype)DT, i, tp_reduce_finish_f32(acc, red, d));
        }
    }
}

template <int DT>
__global__ void finish_avg_kernel(void *p, int64_t count, int d)
{
    for (int64_t i = first_index(); i < count; i += grid_step()) {
        if constexpr (DT == TP_I32 || DT == TP_I64) {
            using T = std::conditional_t<DT == TP_I32, int32_t, int64_t>;
            ((T *)p)[i] = (T)tp_reduce_finish_i64(((T *)p)[i], 1, d);
        } else {
            tp_store_f32(p, (tp_dtype)DT, i, tp_reduce_finish_f32(tp_load_f32(p, (tp_dtype)DT, i), 1, d));
        }
    }
}

cudaStream_t as_stream(void *s) { return static_cast<cudaStream_t>(s); }

// ---- reduce over one dim, gather, where, cast ----

template <int DT>
__global__ void reduce_kernel(const void *x, void *out, tp_reduce_plan p, int64_t n_out, int mean)
{
    for (int64_t i = first_index(); i < n_out; i += grid_step()) {
        int64_t base = tp_reduce_base(&p, i);
        float sum = 0.0f; // index order, as the cpu backend sums
        for (int64_t k = 0; k < p.n; k++)
            sum += tp_load_f32(x, (tp_dtype)DT, base + k * p.sd);
        tp_store_f32(out, (tp_dtype)DT, i, tp_reduce_finish(sum, p.n, mean));
    }
}

template <typename T>
__global__ void gather_kernel(tp_cuda_gather_args a, int64_t n_out)
{
    const T *x = (const T *)a.x;
    T *out = (T *)a.out;
    for (int64_t i = first_index(); i < n_out; i += grid_step()) {
        int64_t j = tp_gather_slot(&a.p, i), off = tp_layout_offset(&a.p.ids, 0, j);
        int64_t id = a.id_dtype == TP_I32 ? (int64_t)((const int32_t *)a.ids)[off] : ((const int64_t *)a.ids)[off];
        int64_t index = tp_gather_index(&a.p, id);
        if (index < 0) {
            report(a.err, TP_CUDA_ERR_GATHER_ID, 0, id, j);
            out[i] = T(0);
        } else {
            out[i] = x[tp_gather_src(&a.p, i, index)];
        }
    }
}

// l: operand 0 cond, 1 x, 2 y, 3 out.
template <typename T>
__global__ void where_kernel(const void *cond, tp_dtype ct, const T *x, const T *y, T *out, tp_layout l, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t c = tp_layout_offset(&l, 0, i);
        bool take_x = ct == TP_I32 ? ((const int32_t *)cond)[c] != 0 : ((const int64_t *)cond)[c] != 0;
        out[tp_layout_offset(&l, 3, i)] = take_x ? x[tp_layout_offset(&l, 1, i)] : y[tp_layout_offset(&l, 2, i)];
    }
}

// l: operand 0 x, 1 out.
__global__ void cast_kernel(const void *x, tp_dtype xt, void *out, tp_dtype ot, tp_layout l, int64_t n)
{
    for (int64_t i = first_index(); i < n; i += grid_step())
        tp_cast_elem(out, ot, tp_layout_offset(&l, 1, i), x, xt, tp_layout_offset(&l, 0, i));
}

} // namespace

extern "C" int tp_cuda_copy_strided(void *dst, const void *src, const tp_layout *l, int es, void *stream)
{
    if (!dst || !l || l->nops < 2)
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(l);
    if (n <= 0)
        return (int)cudaSuccess;
    tp_layout lc = *l;
    return by_size(es, [&](auto t) {
        using T = decltype(t);
        copy_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>((T *)dst, (const T *)src, lc, n);
    });
}

extern "C" int tp_cuda_binary(int op, const void *a, const void *b, void *out, const tp_layout *l, tp_dtype dtype,
                              void *stream)
{
    if (op < 0 || op > 3 || !a || !b || !out || !l || l->nops < 3)
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(l);
    if (n <= 0)
        return (int)cudaSuccess;
    tp_layout lc = *l;
    return by_dtype(dtype, [&](auto d) {
        binary_kernel<decltype(d)::value><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(op, a, b, out, lc, n);
    });
}

extern "C" int tp_cuda_embedding(const tp_cuda_embedding_args *a, void *stream)
{
    if (!a || !a->ids || !a->table || !a->out || a->E < 0 || (a->id_dtype != TP_I32 && a->id_dtype != TP_I64))
        return (int)cudaErrorInvalidValue;
    int64_t n_ids = tp_layout_numel(&a->ids_l);
    if (n_ids * a->E <= 0)
        return (int)cudaSuccess;
    tp_cuda_embedding_args ac = *a;
    return by_size(a->es, [&](auto t) {
        embedding_kernel<decltype(t)><<<blocks_for(n_ids * a->E), kThreads, 0, as_stream(stream)>>>(ac, n_ids);
    });
}

extern "C" int tp_cuda_attention(const tp_cuda_attn_args *a, void *stream)
{
    if (!a || !a->q || !a->k || !a->v || !a->out || a->Dv > TP_CUDA_ATTN_MAX_DV || a->Dv < 0 || a->D < 0 ||
        (a->mask && a->mask_dtype != TP_I32 && a->mask_dtype != TP_I64))
        return (int)cudaErrorInvalidValue;
    int64_t rows = a->B * a->H * a->S;
    if (rows <= 0 || a->Dv == 0)
        return (int)cudaSuccess;
    int64_t blocks = (rows + kAttnWarps - 1) / kAttnWarps;
    if (blocks > INT32_MAX)
        return (int)cudaErrorInvalidValue;
    tp_cuda_attn_args ac = *a;
    if (a->dtype == TP_I32 || a->dtype == TP_I64)
        return (int)cudaErrorInvalidValue;
    return by_dtype(a->dtype, [&](auto d) {
        if constexpr (decltype(d)::value != TP_I32 && decltype(d)::value != TP_I64)
            attention_kernel<decltype(d)::value><<<(unsigned)blocks, 32 * kAttnWarps, 0, as_stream(stream)>>>(ac);
    });
}

// ---- rope ----

template <int DT>
__global__ void rope_kernel(tp_cuda_rope_args a, int64_t n)
{
    int64_t h = a.D / 2;
    for (int64_t i = first_index(); i < n; i += grid_step()) {
        int64_t row = i / a.D, j = i % a.D, second = j >= h, pj = second ? j - h : j + h;
        int64_t xb = tp_layout_offset(&a.rows, 0, row), cb = tp_layout_offset(&a.rows, 1, row);
        int64_t sb = tp_layout_offset(&a.rows, 2, row), ob = tp_layout_offset(&a.rows, 3, row);
        float x = tp_load_f32(a.x, (tp_dtype)DT, xb + j * a.xs), p = tp_load_f32(a.x, (tp_dtype)DT, xb + pj * a.xs);
        float c = tp_load_f32(a.cos, (tp_dtype)DT, cb + j * a.cs), s = tp_load_f32(a.sin, (tp_dtype)DT, sb + j * a.ss);
        tp_store_f32(a.out, (tp_dtype)DT, ob + j, tp_rope(x, p, c, s, (int)second));
    }
}

extern "C" int tp_cuda_rope(const tp_cuda_rope_args *a, void *stream)
{
    if (!a || !a->x || !a->cos || !a->sin || !a->out || a->rows.nops < 4 || a->D < 2 || a->D % 2 ||
        (a->dtype != TP_F32 && a->dtype != TP_F16 && a->dtype != TP_BF16))
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(&a->rows) * a->D;
    if (n <= 0)
        return (int)cudaSuccess;
    tp_cuda_rope_args ac = *a;
    return by_dtype(a->dtype, [&](auto d) {
        if constexpr (decltype(d)::value != TP_I32 && decltype(d)::value != TP_I64)
            rope_kernel<decltype(d)::value><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(ac, n);
    });
}

extern "C" int tp_cuda_block_pack(const void *src, void *dst, int64_t outer, int64_t len, int64_t inner, int d,
                                  int es, int to_packed, void *stream)
{
    if (!src || !dst || outer < 0 || len < 0 || inner < 0 || d < 1)
        return (int)cudaErrorInvalidValue;
    int64_t n = outer * (int64_t)d * len * inner;
    if (n == 0)
        return (int)cudaSuccess;
    return by_size(es, [&](auto t) {
        using T = decltype(t);
        pack_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>((const T *)src, (T *)dst, outer, len,
                                                                          inner, d, to_packed);
    });
}

extern "C" int tp_cuda_reduce_chunks(const void *own, const void *stage, void *out, int64_t count, int rank, int d,
                                     int red, tp_dtype dtype, void *stream)
{
    if (!own || !out || (d > 1 && !stage) || d < 1 || rank < 0 || rank >= d || red < 0 || red > 2 || count < 0)
        return (int)cudaErrorInvalidValue;
    if (count == 0)
        return (int)cudaSuccess;
    return by_dtype(dtype, [&](auto dt) {
        reduce_chunks_kernel<decltype(dt)::value><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(
            own, stage, out, count, rank, d, red);
    });
}

extern "C" int tp_cuda_finish_avg(void *p, int64_t count, int d, tp_dtype dtype, void *stream)
{
    if (!p || count < 0 || d < 1)
        return (int)cudaErrorInvalidValue;
    if (count == 0)
        return (int)cudaSuccess;
    return by_dtype(dtype, [&](auto dt) {
        finish_avg_kernel<decltype(dt)::value><<<blocks_for(count), kThreads, 0, as_stream(stream)>>>(p, count, d);
    });
}

extern "C" int tp_cuda_reduce(const void *x, void *out, const tp_reduce_plan *p, int64_t n_out, int mean,
                              tp_dtype dtype, void *stream)
{
    if (!p || n_out < 0 || (n_out > 0 && (!x || !out)) || !tp_dtype_is_float(dtype))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0)
        return (int)cudaSuccess;
    tp_reduce_plan pc = *p;
    return by_dtype(dtype, [&](auto d) {
        reduce_kernel<decltype(d)::value><<<blocks_for(n_out), kThreads, 0, as_stream(stream)>>>(x, out, pc, n_out,
                                                                                                  mean);
    });
}

extern "C" int tp_cuda_gather(const tp_cuda_gather_args *a, int64_t n_out, void *stream)
{
    if (!a || n_out < 0 || (a->id_dtype != TP_I32 && a->id_dtype != TP_I64))
        return (int)cudaErrorInvalidValue;
    if (n_out == 0)
        return (int)cudaSuccess;
    if (!a->x || !a->ids || !a->out)
        return (int)cudaErrorInvalidValue;
    tp_cuda_gather_args ac = *a;
    return by_size(a->es, [&](auto t) {
        gather_kernel<decltype(t)><<<blocks_for(n_out), kThreads, 0, as_stream(stream)>>>(ac, n_out);
    });
}

extern "C" int tp_cuda_where(const void *cond, tp_dtype cond_dtype, const void *x, const void *y, void *out,
                             const tp_layout *l, int es, void *stream)
{
    if (!l || l->nops < 4 || (cond_dtype != TP_I32 && cond_dtype != TP_I64))
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(l);
    if (n <= 0)
        return (int)cudaSuccess;
    if (!cond || !x || !y || !out)
        return (int)cudaErrorInvalidValue;
    tp_layout lc = *l;
    return by_size(es, [&](auto t) {
        using T = decltype(t);
        where_kernel<T><<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(cond, cond_dtype, (const T *)x,
                                                                           (const T *)y, (T *)out, lc, n);
    });
}

extern "C" int tp_cuda_cast(const void *x, tp_dtype x_dtype, void *out, tp_dtype out_dtype, const tp_layout *l,
                            void *stream)
{
    if (!l || l->nops < 2 || (unsigned)x_dtype >= TP_DTYPE_COUNT || (unsigned)out_dtype >= TP_DTYPE_COUNT)
        return (int)cudaErrorInvalidValue;
    int64_t n = tp_layout_numel(l);
    if (n <= 0)
        return (int)cudaSuccess;
    if (!x || !out)
        return (int)cudaErrorInvalidValue;
    cast_kernel<<<blocks_for(n), kThreads, 0, as_stream(stream)>>>(x, x_dtype, out, out_dtype, *l, n);
    return (int)cudaGetLastError();
}
