/* cuda_internal.h — the cuda backend's shared state and helpers, for its
 * own files only (cuda_backend.c, cuda_gemm.c, cuda_ops.c,
 * cuda_collectives.c, cuda_fused.c). The public API is cuda_backend.h.
 *
 * Invariants (each checked where it can break, see cuda_backend.c):
 *  1. every call runs on this process's rank and device (cu_enter);
 *  2. nothing is allocated while capturing: alloc, alloc_symmetric, scratch
 *     growth and copy_in refuse; the GEMM cache only allocates host memory;
 *  3. every tensor a kernel receives lies in one live allocation of this
 *     backend (cu_check_tensor), and an allocation a live capture
 *     references is never freed (capture_refs);
 *  4. after an error that leaves the device or the communicator in an
 *     unknown state, every call fails fast with the first message (dead);
 *  5. all work of one op is joined back into the compute stream before the
 *     op returns, so scratch is free again at the next op. */
#ifndef TP_CUDA_INTERNAL_H
#define TP_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "backend.h"
#include "common/tp_cuda_plan.h"
#include "cuda/tp_cuda_kernels.h"
#include "cuda/tp_cuda_ops.h"

typedef enum {
    CU_MEM_DEVICE,      /* cudaMalloc, this rank only */
    CU_MEM_WINDOW,      /* ncclMemAlloc + NCCL symmetric window */
    CU_MEM_IPC,         /* cudaMalloc + CUDA IPC handles opened by every peer */
    CU_MEM_SYM_LOCAL    /* symmetric by size and order, but not peer-mapped */
} cu_mem_kind;

typedef struct {
    char *base;
    size_t bytes;
    cu_mem_kind kind;
    ncclWindow_t win;
    char *peer[TP_CUDA_MAX_WORLD]; /* each rank's base in this process (peer_mapped) */
    int peer_mapped;
    int capture_refs; /* live captures baked onto this memory */
    /* A window the engine freed: kept, invisible, until cu_ctx_free has
     * ended the communicator (deregistering is collective, and ranks free
     * and tear down independently). */
    int released;
} cu_alloc;

typedef struct cu_gemm_cache cu_gemm_cache;

typedef struct cu_ctx {
    int world, rank, device;
    ncclComm_t comm;
    /* Set once ncclCommInitRank has returned: before that the abort hook
     * (another thread) must not read comm. */
    atomic_int comm_ready;
    /* NCCL's symmetric memory is really available (ncclDevCommCreate
     * accepted) on every rank: only then are windows peer-addressable. */
    int sym_support;
    cudaStream_t compute, copy, side;
    cudaEvent_t ev_copy, ev_fork, ev_join, ev_pull[2], ev_gemm[2];
    cublasLtHandle_t lt;
    void *lt_ws;
    size_t lt_ws_bytes;
    cu_gemm_cache *gemm;
    /* live allocations */
    cu_alloc *mem;
    int n_mem, cap_mem;
    /* per-op device scratch: bump pointer reset at each op (invariant 5) */
    char *scratch;
    size_t scratch_bytes, scratch_used;
    char **retired; /* outgrown scratch blocks a capture may still use */
    int n_retired;
    /* pinned host staging for copy_in / copy_out / matmul_rows' mask (cu_pinned_take) */
    char *pinned;
    size_t pinned_bytes, pinned_used;
    /* the rank group's shared request staging, registered (portable) */
    void *registered;
    /* small device buffers for agreement exchanges and peer-base queries */
    void *xchg;
    size_t xchg_bytes;
    tp_cuda_error *errw;
    /* cross-rank kernels */
    cu_alloc ctrl;
    tp_cuda_sync sync;
    int sync_ok; /* every rank peer-mapped: one-shot and fused pulls allowed */
    /* capture */
    int capturing, capture_failed;
    char **cap_refs;
    int n_cap_refs, cap_cap_refs;
    tp_capture *live; /* live captures, destroyed before the communicator */
    /* failure state. dead: 0 alive, 1 a thread is writing dead_msg, 2
     * dead_msg is final. The rank thread and the group's poller (abort) may
     * both fail the backend at once: the first claims it. */
    atomic_int dead;
    char dead_msg[512];
    /* ncclCommRevoke was called (once, by whichever thread aborted first).
     * From then on nothing waits on the device and the communicator is
     * never aborted or destroyed in this process (cu_ctx_free abandons
     * both; GPU_ASSUMPTIONS.md A13). */
    atomic_int comm_revoked;
    /* Work may be in flight: set by every iface call (cu_enter) before its
     * dead check, cleared when synchronize found everything complete. An
     * abort of an idle rank needs no revoke (revoke_comm). */
    atomic_int busy;
    /* The abort word of the cross-rank kernels (tp_cuda_sync.abort):
     * pinned, mapped host memory; mark_dead sets it, nothing clears it. */
    int *abort_host, *abort_dev;
    /* Held by a replay from its dead check through cudaGraphLaunch, and
     * taken by revoke_comm between marking the backend dead and revoking:
     * a launch either sees the dead state or is enqueued before the revoke
     * (A13: NCCL 2.28.9's revoke does not stop graph work started after
     * its job ends). */
    pthread_mutex_t launch_mu;
    int launch_mu_ok;
    struct cu_ctx *abandoned_next; /* cu_ctx_free after a revoke: kept, reachable, until exit */
    /* collective signatures run eagerly (warm-up) */
    uint64_t *warm;
    int n_warm, cap_warm;
    int check_collectives; /* setting cuda_check_collectives: cross-rank signature check */
    int oneshot_fallback_logged, fused_fallback_logged;
} cu_ctx;

struct tp_capture {
    cudaGraphExec_t exec;
    char **refs;
    int n_refs;
    tp_capture *next;
};

/* ---- errors ---- */

tp_status cu_fail_cuda(cu_ctx *x, tp_err *err, int code, const char *call, const char *file, int line);
tp_status cu_fail_nccl(cu_ctx *x, tp_err *err, ncclResult_t r, const char *call, const char *file, int line);
tp_status cu_fail_blas(cu_ctx *x, tp_err *err, cublasStatus_t s, const char *call, const char *file, int line);
/* A call whose failure changes nothing for the caller (teardown, a free, a
 * fallback already decided): logged, naming the call, and a CUDA error
 * cleared so the next launch does not report it as its own. 1 on success. */
int cu_warn_cuda(const cu_ctx *x, cudaError_t e, const char *call);
int cu_warn_blas(const cu_ctx *x, cublasStatus_t s, const char *call);

/* Each returns tp_fail(...) from the enclosing function, naming the call,
 * the code's name and string, the rank and the source line. */
#define CU_TRY(x, err, call)                                                     \
    do {                                                                         \
        cudaError_t e_ = (call);                                                 \
        if (e_ != cudaSuccess)                                                   \
            return cu_fail_cuda((x), (err), (int)e_, #call, __FILE__, __LINE__); \
    } while (0)
#define NCCL_TRY(x, err, call)                                              \
    do {                                                                    \
        ncclResult_t r_ = (call);                                           \
        if (r_ != ncclSuccess)                                              \
            return cu_fail_nccl((x), (err), r_, #call, __FILE__, __LINE__); \
    } while (0)
#define BLAS_TRY(x, err, call)                                              \
    do {                                                                    \
        cublasStatus_t s_ = (call);                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                    \
            return cu_fail_blas((x), (err), s_, #call, __FILE__, __LINE__); \
    } while (0)
/* Our own launchers return a cudaError_t as int. */
#define KERNEL_TRY(x, err, call)                                          \
    do {                                                                  \
        int k_ = (call);                                                  \
        if (k_ != 0)                                                      \
            return cu_fail_cuda((x), (err), k_, #call, __FILE__, __LINE__); \
    } while (0)
#define TP_TRY(call)                \
    do {                            \
        tp_status t_ = (call);      \
        if (t_ != TP_OK)            \
            return t_;              \
    } while (0)

/* ---- cuda_backend.c ---- */

/* Device memory for this op only (invariant 5); grows outside capture. */
tp_status cu_scratch_take(cu_ctx *x, size_t bytes, void **p, tp_err *err);
/* Invariant 3 for one tensor (what names it in the message); while
 * capturing, remembers its allocation. */
tp_status cu_check_tensor(cu_ctx *x, const tp_tensor *t, const char *what, tp_err *err);
/* Pinned host staging of `bytes` (copy_in, copy_out, matmul_rows' mask),
 * free again at the next copy_out or synchronize; when full, waits for the
 * DMA using it and starts over, growing only when idle. Never while
 * capturing. */
tp_status cu_pinned_take(cu_ctx *x, size_t bytes, char **p, tp_err *err);
/* The live allocation containing p, or NULL. */
cu_alloc *cu_find_alloc(cu_ctx *x, const void *p);
/* Waits until stream s has run its work, polling (cudaStreamQuery) so
 * that the wait ends as soon as the backend is dead: a revoked
 * communicator's captured NCCL kernels may never finish (A13), and a
 * thread blocked in cudaStreamSynchronize could never return. what names
 * the wait in the error. Never call it while capturing. */
tp_status cu_wait(cu_ctx *x, cudaStream_t s, const char *what, tp_err *err);
/* After a wait on NCCL work: TP_OK, or the backend is dead or NCCL reports
 * an async error (the backend is then marked dead). */
tp_status cu_check_comm(cu_ctx *x, const char *what, tp_err *err);
/* min and max of v over every rank (eager only: NCCL all_reduce + sync). */
tp_status cu_agree_i64(cu_ctx *x, int64_t v, int64_t *mn, int64_t *mx, tp_err *err);

/* ---- cuda_ops.c ---- */

/* Whether cu_run_op has a kernel for op. */
int cu_op_has_kernel(tp_op op);
tp_status cu_run_op(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                    tp_err *err);
/* dst = src elementwise, any strides on either side, same shape and dtype. */
tp_status cu_copy_tensor(cu_ctx *x, tp_tensor *dst, const tp_tensor *src, cudaStream_t s, tp_err *err);
/* t as a contiguous tensor: t itself, or a scratch copy. */
tp_status cu_contiguous(cu_ctx *x, const tp_tensor *t, tp_tensor *out, cudaStream_t s, tp_err *err);

/* ---- cuda_gemm.c ---- */

tp_status cu_gemm_create(cu_ctx *x, tp_err *err);
void cu_gemm_free(cu_ctx *x);
/* out = a . b (+ beta * out), out any view whose last dim is unit-stride. */
tp_status cu_matmul(cu_ctx *x, const tp_tensor *a, const tp_tensor *b, int transpose_b, tp_tensor *out, float beta,
                    cudaStream_t s, tp_err *err);

/* ---- cuda_collectives.c ---- */

tp_status cu_collective(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *in, tp_tensor *out, tp_err *err);
int cu_nccl_type(tp_dtype t, ncclDataType_t *out);
/* Tiny collectives of every kind and a send/recv with every peer, so NCCL
 * has its connections before the first capture. */
tp_status cu_warm_up(cu_ctx *x, tp_err *err);
/* Notes a collective signature run eagerly, or warns once when one is
 * captured that never ran eagerly (its connections may be made in capture). */
void cu_note_signature(cu_ctx *x, const char *what, uint64_t sig, int64_t count);

/* ---- cuda_fused.c ---- */

tp_status cu_fused(cu_ctx *x, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins, tp_tensor *out,
                   tp_err *err);

/* ---- small shared helpers ---- */

static inline size_t cu_nbytes(const tp_tensor *t)
{
    return (size_t)tp_tensor_numel(t) * tp_dtype_size(t->dtype);
}

#endif
