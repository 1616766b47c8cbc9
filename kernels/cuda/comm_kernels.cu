// comm_kernels.cu — kernels that read peers' symmetric memory: a cross-rank
// barrier, the one-shot all_reduce, and the query of an NCCL window's peer
// addresses.
//
// Barrier protocol (see tp_cuda_ops.h): block b of rank r arrives at epoch e
// on a slot by storing e (release, system scope) into flags[slot][b][r] of
// every rank, then waits (acquire) until its own flags[slot][b][p] >= e for
// every p. Epochs only grow, so a fast rank already at e+1 still releases a
// slow one waiting for e, and nobody passes e+1 before everyone reached it.
// Each block only ever meets the same block index of its peers, and every
// rank launches the same fixed grid, so block b's element range is the same
// everywhere: a rank's input is free again once every rank's block b left
// the departure barrier, for every b, i.e. once the kernel completed.
//
// A peer that never arrives (it died, or diverged) does not hang the GPU: the
// wait gives up after timeout_ns, reports TP_CUDA_ERR_BARRIER_TIMEOUT, and the
// backend turns that into an error at synchronize and fails from then on.
// Every wait also ends at once when the host sets the abort word (the
// backend died or revoked its communicator: ncclCommRevoke never reaches
// these kernels) or when this rank's error word already holds a barrier
// failure, so a dead peer costs one timeout per step at most, not one per
// barrier left in the graph. The protocol itself (flag layout, epochs,
// when a wait ends) is comm_protocol.h, shared with the test double, which
// runs it on host threads.
#include <cuda/atomic>
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <stdint.h>
#include <string.h>
#include <type_traits>

#include "common/tp_cuda_plan.h"
#include "cuda/comm_protocol.h"
#include "cuda/tp_cuda_ops.h"

namespace {

// Block `block` of every rank meets at epoch e on slot. Thread p < world
// signals peer p and waits for peer p. The fences make this block's earlier
// writes visible to peers before the signal, and peers' writes visible to
// this block after the wait. A wait that gives up leaves its report in the
// error word, which the host reads at synchronize.
__device__ void meet(const tp_cuda_sync &s, int slot, int block, unsigned long long e)
{
    __threadfence_system();
    __syncthreads();
    int p = threadIdx.x;
    if (p < s.world) {
        tp_sync_arrive(&s, slot, block, p, e);
        (void)tp_sync_wait(&s, slot, block, p, e);
    }
    __syncthreads();
    __threadfence_system();
}

__global__ void barrier_kernel(tp_cuda_sync s, int slot)
{
    __shared__ unsigned long long e;
    if (threadIdx.x == 0)
        e = *tp_sync_counter(&s, slot, 0) + 1;
    __syncthreads();
    meet(s, slot, 0, e);
    if (threadIdx.x == 0)
        *tp_sync_counter(&s, slot, 0) = e;
}

template <int DT>
__device__ void reduce_element(const tp_cuda_peers &in, void *out, int64_t i, int world, int red)
{
    if constexpr (DT == TP_I32 || DT == TP_I64) {
        using T = std::conditional_t<DT == TP_I32, int32_t, int64_t>;
        int64_t acc = ((const T *)in.p[0])[i];
        for (int r = 1; r < world; r++)
            acc = tp_reduce_step_i64(acc, ((const T *)in.p[r])[i], red);
        ((T *)out)[i] = (T)(uint64_t)tp_reduce_finish_i64(acc, red, world);
    } else {
        float acc = tp_load_f32(in.p[0], (tp_dtype)DT, i);
        for (int r = 1; r < world; r++)
            acc = tp_reduce_step_f32(acc, tp_load_f32(in.p[r], (tp_dtype)DT, i), red);
        tp_store_f32(out, (tp_dtype)DT, i, tp_reduce_finish_f32(acc, red, world));
    }
}

template <int DT>
__global__ void oneshot_kernel(tp_cuda_sync s, tp_cuda_peers in, void *out, int64_t n, int red)
{
    __shared__ unsigned long long e_in, e_out;
    int b = blockIdx.x;
    if (threadIdx.x == 0) {
        e_in = *tp_sync_counter(&s, TP_CUDA_SLOT_ONESHOT_IN, b) + 1;
        e_out = *tp_sync_counter(&s, TP_CUDA_SLOT_ONESHOT_OUT, b) + 1;
    }
    __syncthreads();
    meet(s, TP_CUDA_SLOT_ONESHOT_IN, b, e_in);
    for (int64_t i = (int64_t)b * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        reduce_element<DT>(in, out, i, s.world, red);
    meet(s, TP_CUDA_SLOT_ONESHOT_OUT, b, e_out);
    if (threadIdx.x == 0) {
        *tp_sync_counter(&s, TP_CUDA_SLOT_ONESHOT_IN, b) = e_in;
        *tp_sync_counter(&s, TP_CUDA_SLOT_ONESHOT_OUT, b) = e_out;
    }
}

__global__ void window_bases_kernel(ncclWindow_t win, int world, void **out)
{
    int p = threadIdx.x;
    if (p < world)
        out[p] = ncclGetPeerPointer(win, 0, p);
}

int check_sync(const tp_cuda_sync *s)
{
    return tp_sync_check(s) == 0 ? (int)cudaSuccess : (int)cudaErrorInvalidValue;
}

} // namespace

extern "C" int tp_cuda_barrier(const tp_cuda_sync *s, int slot, void *stream)
{
    int rc = check_sync(s);
    if (rc != (int)cudaSuccess || slot < 0 || slot >= TP_CUDA_SYNC_SLOTS)
        return rc != (int)cudaSuccess ? rc : (int)cudaErrorInvalidValue;
    barrier_kernel<<<1, 32, 0, static_cast<cudaStream_t>(stream)>>>(*s, slot);
    return (int)cudaGetLastError();
}

extern "C" int tp_cuda_oneshot_all_reduce(const tp_cuda_sync *s, const tp_cuda_peers *in, void *out, int64_t count,
                                          tp_dtype dtype, int red, void *stream)
{
    int rc = check_sync(s);
    if (rc != (int)cudaSuccess)
        return rc;
    if (!in || !out || count < 0 || red < 0 || red > 2)
        return (int)cudaErrorInvalidValue;
    for (int p = 0; p < s->world; p++)
        if (!in->p[p])
            return (int)cudaErrorInvalidValue;
    // Every rank launches even for count 0: the barriers' epochs must agree.
    cudaStream_t st = static_cast<cudaStream_t>(stream);
    switch (dtype) {
    case TP_F32: oneshot_kernel<TP_F32><<<TP_CUDA_SYNC_BLOCKS, 256, 0, st>>>(*s, *in, out, count, red); break;
    case TP_F16: oneshot_kernel<TP_F16><<<TP_CUDA_SYNC_BLOCKS, 256, 0, st>>>(*s, *in, out, count, red); break;
    case TP_BF16: oneshot_kernel<TP_BF16><<<TP_CUDA_SYNC_BLOCKS, 256, 0, st>>>(*s, *in, out, count, red); break;
    case TP_I32: oneshot_kernel<TP_I32><<<TP_CUDA_SYNC_BLOCKS, 256, 0, st>>>(*s, *in, out, count, red); break;
    case TP_I64: oneshot_kernel<TP_I64><<<TP_CUDA_SYNC_BLOCKS, 256, 0, st>>>(*s, *in, out, count, red); break;
    default: return (int)cudaErrorInvalidValue;
    }
    return (int)cudaGetLastError();
}

extern "C" int tp_cuda_window_peer_bases(void *win, int world, void **out_dev, void *stream)
{
    if (!win || !out_dev || world < 1 || world > 1024)
        return (int)cudaErrorInvalidValue;
    window_bases_kernel<<<1, ((world + 31) / 32) * 32, 0, static_cast<cudaStream_t>(stream)>>>(
        static_cast<ncclWindow_t>(win), world, out_dev);
    return (int)cudaGetLastError();
}

// Ranks that can load/store each other's symmetric windows (NCCL's LSA
// team): the peer-reading kernels need it to be the whole world.
extern "C" int tp_cuda_nccl_lsa_size(void *comm)
{
    return comm ? ncclTeamLsa(static_cast<ncclComm_t>(comm)).nRanks : 0;
}

// ncclDevCommCreate checks comm->symmetricSupport first (NCCL 2.28.9
// dev_runtime.cc) and refuses with ncclInvalidUsage without it: the one
// reliable test, since ncclCommWindowRegister then returns a local
// registration handle as the window and ncclTeamLsa counts a node's ranks.
// The probe's device communicator (no barriers, no resources) is released
// at once.
extern "C" int tp_cuda_nccl_symmetric_support(void *comm)
{
    ncclComm_t c = static_cast<ncclComm_t>(comm);
    ncclDevCommRequirements_t reqs;
    memset(&reqs, 0, sizeof reqs);
    ncclDevComm_t dev;
    ncclResult_t r = ncclDevCommCreate(c, &reqs, &dev);
    if (r == ncclInvalidUsage)
        return 0;
    if (r != ncclSuccess)
        return -static_cast<int>(r);
    r = ncclDevCommDestroy(c, &dev);
    return r == ncclSuccess ? 1 : -static_cast<int>(r);
}
