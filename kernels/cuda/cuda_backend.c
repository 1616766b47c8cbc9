/* cuda_backend.c — the backend interface on one GPU per process: memory,
 * input/output copies, capture into CUDA graphs, replay, failure state.
 *
 * The kernels are elsewhere: cuda_ops.c (compute and copy ops),
 * cuda_gemm.c (cuBLASLt), cuda_collectives.c (NCCL and the one-shot
 * all_reduce), cuda_fused.c (the fused comm+GEMM pipelines). The
 * invariants they all keep are listed in cuda_internal.h.
 *
 * Streams: `compute` runs every op and every graph; `copy` runs input DMA,
 * which compute waits for through an event; `side` carries the peer pulls
 * and sends of the fused ops, forked from and joined to compute inside the
 * op, so a capture of compute captures them too.
 *
 * States of the backend object:
 *   ready --begin_capture--> capturing --end_capture--> ready
 *   any --sticky CUDA error / barrier timeout / NCCL error--> dead
 *   any --abort (a peer or this rank failed mid-run)--> dead (comm revoked)
 * In `dead` every call fails with the first message; only a new backend
 * (a restarted process) leaves it: reset does not, and must_exit says so
 * (see cuda_backend.h, "After an abort"). A benign failure (bad data found by a
 * kernel after all work completed: TP_INVALID from copy_out/synchronize)
 * never reaches abort: the rank group wakes no peer for it
 * (tp_rank_group_benign), so the backend stays usable.
 *
 * Abort never frees or aborts the communicator (GPU_ASSUMPTIONS.md, A1):
 * NCCL 2.28's ncclCommAbort and ncclCommDestroy wait until every CUDA
 * graph that captured NCCL work on the communicator is destroyed
 * (init.cc commDestroySync, localPersistentRefs), and the engine keeps its
 * graphs until shutdown, so an abort mid-run would hang. ncclCommRevoke
 * stops in-flight NCCL work (peers blocked in a collective with us fail)
 * without that wait. A revoked communicator is never aborted or destroyed
 * in this process: the backend is abandoned whole and the process exits
 * (revoke_comm, abandon; A13). It also means abort, called from the
 * group's poller thread while the rank thread may be inside an NCCL call,
 * never frees what that call uses (A8). */
#include "cuda/cuda_backend.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/cuda_internal.h"
#include "grow.h"
#include "log.h"
#include "rank_group.h"

static const tp_backend_iface cuda_iface;

static cu_ctx *ctx_of(tp_backend *b) { return b->ctx; }

/* ------------------------------------------------------------------ errors */

/* Errors after which the CUDA context is unusable (the "sticky" ones). */
static int cuda_sticky(cudaError_t e)
{
    switch (e) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorECCUncorrectable:
    case cudaErrorLaunchTimeout:
    case cudaErrorAssert:
        return 1;
    default:
        return 0;
    }
}

/* The first failing thread (the rank's, or the poller's abort) claims the
 * message; the others keep it. */
static void mark_dead(cu_ctx *x, const char *msg)
{
    int alive = 0;
    if (!x || !atomic_compare_exchange_strong(&x->dead, &alive, 1))
        return;
    size_t n = strlen(msg); /* truncating on purpose: the first part names the call */
    if (n >= sizeof x->dead_msg)
        n = sizeof x->dead_msg - 1;
    /* first: our cross-rank kernels stop waiting for peers at once
     * (comm_protocol.h), whatever killed the backend */
    if (x->abort_host)
        __atomic_store_n(x->abort_host, 1, __ATOMIC_RELEASE);
    memcpy(x->dead_msg, msg, n);
    x->dead_msg[n] = 0;
    atomic_store(&x->dead, 2);
    /* a rank with nothing in flight (a group's workers quitting at shutdown
     * ends each rank this way) has lost no work: not an error to report */
    tp_log(atomic_load(&x->busy) ? TP_LOG_ERROR : TP_LOG_INFO,
           "cuda rank %d: backend failed, every further call fails: %s", x->rank, msg);
}

static const char *dead_reason(cu_ctx *x)
{
    return atomic_load(&x->dead) == 2 ? x->dead_msg : "another thread is failing it right now";
}

/* How long revoke_comm waits for a replay that is enqueueing (a launch
 * takes microseconds). A launch blocked on a full queue must not keep the
 * revoke from waking this rank's waits: past it, the launch counts as in
 * flight (the process exits, A13). */
#define LAUNCH_FENCE_MS 100

/* Waits until no replay is between its dead check and the end of its
 * cudaGraphLaunch (cuda_replay). Called after mark_dead: every later
 * replay sees the dead state and launches nothing. */
static void launch_fence(cu_ctx *x)
{
    if (!x->launch_mu_ok)
        return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    long ns = until.tv_nsec + LAUNCH_FENCE_MS * 1000000L;
    until.tv_sec += ns / 1000000000L;
    until.tv_nsec = ns % 1000000000L;
    int rc = pthread_mutex_timedlock(&x->launch_mu, &until);
    if (rc == 0)
        pthread_mutex_unlock(&x->launch_mu);
    else
        TP_LOG_W("cuda rank %d: a graph launch still enqueueing after %d ms; revoking anyway (%s)", x->rank,
                 LAUNCH_FENCE_MS, strerror(rc));
}

/* Stops this rank's work for good (see the file comment): first the dead
 * state (and the abort word, which ends our own kernels' waits), so no new
 * call or launch starts; then, once a launch already past its check is
 * enqueued, one ncclCommRevoke. Safe from any thread, any number of times,
 * before or after the comm exists: a comm that appears later is revoked by
 * create_comm, which sees dead.
 *
 * What the revoke cannot do (NCCL 2.28.9, init.cc commRevokeAsync): its job
 * sets NCCL's abort flags, waits for NCCL's own streams and eager work, then
 * clears the flags; it never waits for work captured in our graphs. An NCCL
 * kernel of a replay that starts after the job ended runs against the dead
 * peer and may never finish. Hence: no launch after this (launch_fence and
 * cuda_replay), no wait on the device after it (cu_wait, cuda_free,
 * cu_ctx_free), and the process exits (must_exit) so that its end, not a
 * wait, stops that work (GPU_ASSUMPTIONS.md A13). */
static void revoke_comm(cu_ctx *x, const char *why)
{
    mark_dead(x, why);
    /* A rank with no work in flight (its last synchronize completed, and
     * every call since sees dead: cu_enter sets busy before it checks)
     * has no wait to end, and revoking only its own communicator wakes no
     * peer (each process revokes its own): it keeps a communicator that
     * is destroyed normally at teardown — the engine's free after a
     * group's workers quit (peer_lost) must not leave it to the exit. */
    if (!atomic_load(&x->comm_ready) || !atomic_load(&x->busy) || atomic_exchange(&x->comm_revoked, 1))
        return;
    launch_fence(x);
    TP_LOG_W("cuda rank %d: revoking the NCCL communicator (work may be in flight): %s", x->rank, why);
    ncclResult_t r = ncclCommRevoke(x->comm, NCCL_REVOKE_DEFAULT);
    if (r != ncclSuccess)
        TP_LOG_W("cuda rank %d: ncclCommRevoke: %s", x->rank, ncclGetErrorString(r));
}

static const char *base_name(const char *file)
{
    const char *s = strrchr(file, '/');
    return s ? s + 1 : file;
}

/* Common tail of the cu_fail_* functions: the message, capture poisoning
 * and the dead state. */
static tp_status fail_with(cu_ctx *x, tp_err *err, const char *msg, int sticky)
{
    if (x && x->capturing)
        x->capture_failed = 1;
    if (sticky)
        mark_dead(x, msg);
    return tp_fail(err, TP_BACKEND, "%s", msg);
}

tp_status cu_fail_cuda(cu_ctx *x, tp_err *err, int code, const char *call, const char *file, int line)
{
    char msg[768];
    cudaError_t e = (cudaError_t)code;
    snprintf(msg, sizeof msg, "cuda rank %d: %s failed: %s (%s) [%s:%d]", x ? x->rank : -1, call,
             cudaGetErrorName(e), cudaGetErrorString(e), base_name(file), line);
    return fail_with(x, err, msg, cuda_sticky(e));
}

/* NCCL 2.28 keeps its last error per host thread: on another thread than
 * the failing call's it is only that thread's (often empty). */
static void nccl_message(const cu_ctx *x, ncclResult_t r, const char *call, const char *file, int line, char *msg,
                         size_t cap)
{
    const char *last = ncclGetLastError(x ? x->comm : NULL);
    snprintf(msg, cap, "cuda rank %d: %s failed: NCCL error %d (%s)%s%s [%s:%d]", x ? x->rank : -1, call, (int)r,
             ncclGetErrorString(r), last && *last ? ": " : "", last ? last : "", base_name(file), line);
}

tp_status cu_fail_nccl(cu_ctx *x, tp_err *err, ncclResult_t r, const char *call, const char *file, int line)
{
    char msg[768];
    nccl_message(x, r, call, file, line, msg, sizeof msg);
    /* argument errors leave the communicator sound; the others may not */
    int sticky = r != ncclInvalidArgument && r != ncclInvalidUsage && r != ncclInProgress;
    return fail_with(x, err, msg, sticky);
}

tp_status cu_fail_blas(cu_ctx *x, tp_err *err, cublasStatus_t s, const char *call, const char *file, int line)
{
    char msg[768];
    snprintf(msg, sizeof msg, "cuda rank %d: %s failed: %s (%s) [%s:%d]", x ? x->rank : -1, call,
             cublasLtGetStatusName(s), cublasLtGetStatusString(s), base_name(file), line);
    return fail_with(x, err, msg, s == CUBLAS_STATUS_EXECUTION_FAILED);
}

int cu_warn_cuda(const cu_ctx *x, cudaError_t e, const char *call)
{
    if (e == cudaSuccess)
        return 1;
    TP_LOG_W("cuda rank %d: %s failed: %s (%s)", x ? x->rank : -1, call, cudaGetErrorName(e), cudaGetErrorString(e));
    (void)cudaGetLastError(); /* handled: not left pending for the next launch to report */
    return 0;
}

int cu_warn_blas(const cu_ctx *x, cublasStatus_t s, const char *call)
{
    if (s == CUBLAS_STATUS_SUCCESS)
        return 1;
    TP_LOG_W("cuda rank %d: %s failed: %s (%s)", x ? x->rank : -1, call, cublasLtGetStatusName(s),
             cublasLtGetStatusString(s));
    return 0;
}

/* Every iface entry: right rank, not dead, this thread on our device (the
 * current device is per host thread, and rank threads are not the creator). */
static tp_status cu_enter(cu_ctx *x, int rank, const char *what, tp_err *err)
{
    if (rank != x->rank)
        return tp_fail(err, TP_INTERNAL,
                       "cuda backend: %s for rank %d, but this process runs rank %d of %d (one process per GPU: "
                       "the rank group must run only the local rank)",
                       what, rank, x->rank, x->world);
    atomic_store(&x->busy, 1); /* before the dead check: see revoke_comm */
    if (atomic_load(&x->dead))
        return tp_fail(err, TP_BACKEND,
                       "cuda rank %d: %s refused, the backend failed earlier: %s (for good: reset does not clear "
                       "it; this process must exit and be restarted)",
                       x->rank, what, dead_reason(x));
    int dev = -1;
    CU_TRY(x, err, cudaGetDevice(&dev));
    if (dev != x->device)
        CU_TRY(x, err, cudaSetDevice(x->device));
    return TP_OK;
}

static tp_status refuse_in_capture(cu_ctx *x, const char *what, tp_err *err)
{
    if (!x->capturing)
        return TP_OK;
    x->capture_failed = 1;
    return tp_fail(err, TP_INTERNAL,
                   "cuda rank %d: %s during capture (nothing may be allocated or copied in while a graph is "
                   "recorded; do it before begin_capture)",
                   x->rank, what);
}

/* ---------------------------------------------------------- environment */

static long env_long(const char *name, long dflt, long lo, long hi)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end;
    long n = strtol(v, &end, 10);
    if (*end || n < lo || n > hi) {
        TP_LOG_W("cuda backend: ignoring %s=%s (expected an integer in [%ld, %ld]), using %ld", name, v, lo, hi,
                 dflt);
        return dflt;
    }
    return n;
}

/* --------------------------------------------------------- allocations */

/* Room in the allocation table for one more, taken before the device
 * memory: memory once allocated must always be tracked (a symmetric one
 * may only be freed in teardown order, cu_ctx_free). */
static tp_status mem_reserve(cu_ctx *x, tp_err *err)
{
    if (TP_GROW(x->mem, x->cap_mem, x->n_mem, 32) != 0)
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of host memory for the allocation table", x->rank);
    return TP_OK;
}

/* After mem_reserve: cannot fail. */
static void mem_add(cu_ctx *x, const cu_alloc *a) { x->mem[x->n_mem++] = *a; }

cu_alloc *cu_find_alloc(cu_ctx *x, const void *p)
{
    const char *c = p;
    for (int i = 0; i < x->n_mem; i++) {
        cu_alloc *a = &x->mem[i];
        if (!a->released && c >= a->base && (c < a->base + a->bytes || c == a->base))
            return a;
    }
    return NULL;
}

static tp_status remember_ref(cu_ctx *x, char *base, tp_err *err)
{
    for (int i = 0; i < x->n_cap_refs; i++)
        if (x->cap_refs[i] == base)
            return TP_OK;
    if (TP_GROW(x->cap_refs, x->cap_cap_refs, x->n_cap_refs, 16) != 0) {
        x->capture_failed = 1;
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of host memory recording a capture", x->rank);
    }
    x->cap_refs[x->n_cap_refs++] = base;
    return TP_OK;
}

tp_status cu_check_tensor(cu_ctx *x, const tp_tensor *t, const char *what, tp_err *err)
{
    char sh[96];
    if (t->ndim < 0 || t->ndim > TP_MAX_DIMS || (unsigned)t->dtype >= TP_DTYPE_COUNT)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: %s has bad ndim %d or dtype %d", x->rank, what, t->ndim,
                       (int)t->dtype);
    int64_t lo;
    int64_t span = tp_tensor_span(t, &lo);
    if (span == 0)
        return TP_OK; /* nothing is touched */
    char *first = (char *)t->data + lo * (int64_t)tp_dtype_size(t->dtype);
    cu_alloc *a = cu_find_alloc(x, first);
    if (!a || first + span > a->base + (a->bytes ? a->bytes : 1)) {
        if (x->capturing)
            x->capture_failed = 1;
        return tp_fail(err, TP_INTERNAL,
                       "cuda rank %d: %s (%s %s at %p, %lld bytes) is not inside a live allocation of this "
                       "backend",
                       x->rank, what, tp_dtype_name(t->dtype), tp_shape_str(sh, sizeof sh, t->ndim, t->shape),
                       t->data, (long long)span);
    }
    return x->capturing ? remember_ref(x, a->base, err) : TP_OK;
}

tp_status cu_scratch_take(cu_ctx *x, size_t bytes, void **p, tp_err *err)
{
    size_t off = (x->scratch_used + 255) & ~(size_t)255;
    if (off + bytes <= x->scratch_bytes) {
        *p = x->scratch + off;
        x->scratch_used = off + bytes;
        return TP_OK;
    }
    if (x->capturing) {
        x->capture_failed = 1;
        return tp_fail(err, TP_INTERNAL,
                       "cuda rank %d: an op needs %zu more bytes of scratch during capture but %zu are reserved: run "
                       "the partition once eagerly before capturing it, or raise cuda_scratch_mb",
                       x->rank, off + bytes - x->scratch_bytes, x->scratch_bytes);
    }
    /* Retire, never free: earlier takes of this op and captured graphs may
     * still point into the old block. */
    char **nr = realloc(x->retired, (size_t)(x->n_retired + 1) * sizeof *nr);
    if (!nr)
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of host memory growing scratch", x->rank);
    x->retired = nr;
    size_t grow = 2 * x->scratch_bytes > bytes + 256 ? 2 * x->scratch_bytes : bytes + 256;
    char *n = NULL;
    CU_TRY(x, err, cudaMalloc((void **)&n, grow));
    if (x->scratch)
        x->retired[x->n_retired++] = x->scratch;
    TP_LOG_I("cuda rank %d: scratch grown to %zu bytes", x->rank, grow);
    x->scratch = n;
    x->scratch_bytes = grow;
    x->scratch_used = bytes;
    *p = n;
    return TP_OK;
}

/* ------------------------------------------------------------ waits */

/* Time since t0, in ms. */
static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

/* cudaStreamSynchronize cannot be interrupted, and after a revoke the work
 * it waits for may never end (A13): a rank thread inside it would keep the
 * step, the group and teardown waiting forever. So every wait polls, and
 * stops once the backend is dead. The first 2 ms only yield the CPU (most
 * waits of a step are shorter, and a blocking-sync's wake-up costs as
 * much); then 50 us sleeps, 1 ms ones after 100 ms. cudaErrorNotReady is
 * cleared as PyTorch's stream query does: it is not a failure and must not
 * be left for the next launch's cudaGetLastError. */
tp_status cu_wait(cu_ctx *x, cudaStream_t s, const char *what, tp_err *err)
{
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        cudaError_t e = cudaStreamQuery(s);
        if (e == cudaSuccess)
            return TP_OK;
        if (e != cudaErrorNotReady) {
            char call[96];
            snprintf(call, sizeof call, "cudaStreamQuery(%s)", what);
            return cu_fail_cuda(x, err, (int)e, call, __FILE__, __LINE__);
        }
        (void)cudaGetLastError();
        if (atomic_load(&x->dead))
            return tp_fail(err, TP_BACKEND,
                           "cuda rank %d: the %s was not waited for: the backend failed: %s (its device may still "
                           "run work that never ends)",
                           x->rank, what, dead_reason(x));
        double ms = ms_since(&t0);
        if (ms < 2) {
            sched_yield();
        } else {
            struct timespec nap = {0, ms < 100 ? 50000 : 1000000};
            nanosleep(&nap, NULL);
        }
    }
}

/* ------------------------------------------------------- agreement */

/* After a wait on NCCL work: whether it really completed. A revoked
 * communicator's kernels return early and ncclCommGetAsyncError then says
 * ncclInProgress (or, once quiescent, ncclSuccess): the results are
 * garbage, so the dead state decides, then the async error. */
tp_status cu_check_comm(cu_ctx *x, const char *what, tp_err *err)
{
    if (atomic_load(&x->dead))
        return tp_fail(err, TP_BACKEND, "cuda rank %d: %s did not complete: %s", x->rank, what, dead_reason(x));
    ncclResult_t async = ncclSuccess;
    NCCL_TRY(x, err, ncclCommGetAsyncError(x->comm, &async));
    if (async != ncclSuccess) {
        char call[160];
        tp_err e;
        snprintf(call, sizeof call, "ncclCommGetAsyncError(comm) after %s", what);
        tp_status st = cu_fail_nccl(x, &e, async, call, __FILE__, __LINE__);
        mark_dead(x, e.msg); /* even ncclInProgress: the work did not finish */
        return tp_fail(err, st, "%s", e.msg);
    }
    return TP_OK;
}

tp_status cu_agree_i64(cu_ctx *x, int64_t v, int64_t *mn, int64_t *mx, tp_err *err)
{
    TP_TRY(refuse_in_capture(x, "a cross-rank agreement", err));
    int64_t pair[2] = {v, -v}; /* max of both: the max, and minus the min */
    CU_TRY(x, err, cudaMemcpyAsync(x->xchg, pair, sizeof pair, cudaMemcpyHostToDevice, x->compute));
    NCCL_TRY(x, err, ncclAllReduce(x->xchg, x->xchg, 2, ncclInt64, ncclMax, x->comm, x->compute));
    CU_TRY(x, err, cudaMemcpyAsync(pair, x->xchg, sizeof pair, cudaMemcpyDeviceToHost, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    TP_TRY(cu_check_comm(x, "a cross-rank agreement", err));
    *mx = pair[0];
    *mn = -pair[1];
    return TP_OK;
}

static tp_status agree_all(cu_ctx *x, int ok, int *all, tp_err *err)
{
    int64_t mn = 0, mx = 0;
    TP_TRY(cu_agree_i64(x, ok ? 1 : 0, &mn, &mx, err));
    *all = mn == 1;
    return TP_OK;
}

/* ------------------------------------------------ symmetric allocations */

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

/* This process's address of every rank's window base. Only for a window
 * of a communicator with symmetric support: without it, NCCL 2.28 returns
 * a local registration handle as the window (dev_runtime.cc
 * ncclCommWindowRegister), and the kernel would read a host structure. */
static tp_status window_bases(cu_ctx *x, ncclWindow_t win, cu_alloc *a, tp_err *err)
{
    void *bases[TP_CUDA_MAX_WORLD];
    KERNEL_TRY(x, err, tp_cuda_window_peer_bases(win, x->world, x->xchg, x->compute));
    CU_TRY(x, err, cudaMemcpyAsync(bases, x->xchg, sizeof(void *) * (size_t)x->world, cudaMemcpyDeviceToHost,
                                   x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    for (int q = 0; q < x->world; q++)
        a->peer[q] = bases[q];
    return TP_OK;
}

/* NCCL symmetric window (called only when every rank has symmetric
 * support); a->peer_mapped stays 0 when any rank got no window. Every
 * branch releases or hands over what it took (A7): on agreement that some
 * rank got none, every rank deregisters (collective, same order
 * everywhere) and frees; on an error, the memory and window stay in *a
 * for cu_ctx_free, which releases them after the communicator is aborted
 * (a collective deregister could wait for a peer that took another path). */
static tp_status try_window(cu_ctx *x, size_t rounded, cu_alloc *a, tp_err *err)
{
    void *p = NULL;
    ncclWindow_t win = NULL;
    NCCL_TRY(x, err, ncclMemAlloc(&p, rounded));
    a->base = p;
    a->kind = CU_MEM_WINDOW;
    ncclResult_t r = ncclCommWindowRegister(x->comm, p, rounded, &win, NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess)
        return cu_fail_nccl(x, err, r, "ncclCommWindowRegister(comm, p, rounded, &win, NCCL_WIN_COLL_SYMMETRIC)",
                            __FILE__, __LINE__);
    a->win = win;
    int all = 0;
    TP_TRY(agree_all(x, win != NULL, &all, err));
    if (!all) {
        ncclResult_t d = win ? ncclCommWindowDeregister(x->comm, win) : ncclSuccess;
        ncclResult_t f = ncclMemFree(p);
        if (d != ncclSuccess || f != ncclSuccess)
            TP_LOG_W("cuda rank %d: releasing an unused window: %s", x->rank,
                     ncclGetErrorString(d != ncclSuccess ? d : f));
        memset(a, 0, sizeof *a);
        return TP_OK;
    }
    TP_TRY(window_bases(x, win, a, err));
    a->peer_mapped = 1;
    return TP_OK;
}

static void close_peers(cu_ctx *x, cu_alloc *a)
{
    for (int q = 0; q < x->world; q++)
        if (q != x->rank && a->peer[q]) {
            cu_warn_cuda(x, cudaIpcCloseMemHandle(a->peer[q]), "cudaIpcCloseMemHandle(a peer's mapping)");
            a->peer[q] = NULL;
        }
}

/* Exchanges CUDA IPC handles of p through NCCL and opens every peer's. */
static tp_status open_ipc_peers(cu_ctx *x, char *p, cu_alloc *a, int *ok, tp_err *err)
{
    cudaIpcMemHandle_t h, all[TP_CUDA_MAX_WORLD];
    int all_ok = 0;
    /* a failure is answered by the fallback, not left pending for the next
     * launch to report as its own */
    int got = cu_warn_cuda(x, cudaIpcGetMemHandle(&h, p), "cudaIpcGetMemHandle (symmetric memory falls back)");
    TP_TRY(agree_all(x, got, &all_ok, err));
    *ok = 0;
    if (!all_ok)
        return TP_OK;
    char *slot = (char *)x->xchg + (size_t)x->rank * sizeof h;
    CU_TRY(x, err, cudaMemcpyAsync(slot, &h, sizeof h, cudaMemcpyHostToDevice, x->compute));
    NCCL_TRY(x, err, ncclAllGather(slot, x->xchg, sizeof h, ncclUint8, x->comm, x->compute));
    CU_TRY(x, err, cudaMemcpyAsync(all, x->xchg, sizeof h * (size_t)x->world, cudaMemcpyDeviceToHost, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    int mine = 1;
    for (int q = 0; q < x->world && mine; q++)
        if (q != x->rank)
            mine = cu_warn_cuda(x, cudaIpcOpenMemHandle((void **)&a->peer[q], all[q], cudaIpcMemLazyEnablePeerAccess),
                                "cudaIpcOpenMemHandle (symmetric memory falls back)");
    TP_TRY(agree_all(x, mine, ok, err));
    if (!*ok)
        close_peers(x, a);
    return TP_OK;
}

/* Fallback when windows are unavailable: cudaMalloc + CUDA IPC. */
static tp_status try_ipc(cu_ctx *x, size_t rounded, cu_alloc *a, tp_err *err)
{
    char *p = NULL;
    CU_TRY(x, err, cudaMalloc((void **)&p, rounded));
    a->base = p; /* usable locally either way; released by the caller on error */
    int ok = 0;
    tp_status st = open_ipc_peers(x, p, a, &ok, err);
    a->kind = ok ? CU_MEM_IPC : CU_MEM_SYM_LOCAL;
    a->peer[x->rank] = ok ? p : NULL;
    a->peer_mapped = ok;
    return st;
}

/* The symmetric contract is checked, not assumed: every rank must ask for
 * the same size (in the same order, which the same check catches as soon
 * as two sizes differ). Peer mapping is all-or-nothing across ranks. */
static tp_status sym_alloc(cu_ctx *x, size_t bytes, cu_alloc *a, tp_err *err)
{
    int64_t mn = 0, mx = 0;
    TP_TRY(cu_agree_i64(x, (int64_t)bytes, &mn, &mx, err));
    if (mn != mx)
        return tp_fail(err, TP_INTERNAL,
                       "cuda rank %d: symmetric allocation of %zu bytes, but the ranks asked for %lld to %lld "
                       "bytes: every rank must allocate the same sizes in the same order",
                       x->rank, bytes, (long long)mn, (long long)mx);
    size_t rounded = round_up(bytes ? bytes : 1, NCCL_WIN_REQUIRED_ALIGNMENT);
    memset(a, 0, sizeof *a);
    if (x->world == 1) {
        CU_TRY(x, err, cudaMalloc((void **)&a->base, rounded));
        a->bytes = bytes;
        a->kind = CU_MEM_DEVICE;
        a->peer[0] = a->base;
        a->peer_mapped = 1;
        return TP_OK;
    }
    /* lsa counts the ranks of this node that NCCL can load/store: equal to
     * world means one node, not that windows work (A2): x->sym_support,
     * agreed at create, says whether NCCL has symmetric memory at all.
     * Without it (no all-pairs P2P, NCCL_CUMEM_ENABLE=0, NCCL_P2P_DISABLE,
     * NCCL_WIN_ENABLE=0) the CUDA IPC fallback gets its chance. */
    int eligible = 0;
    int lsa = tp_cuda_nccl_lsa_size(x->comm);
    TP_TRY(agree_all(x, x->world <= TP_CUDA_MAX_WORLD && lsa == x->world, &eligible, err));
    if (eligible && x->sym_support)
        TP_TRY(try_window(x, rounded, a, err));
    if (eligible && !a->peer_mapped)
        TP_TRY(try_ipc(x, rounded, a, err));
    if (!a->base) {
        CU_TRY(x, err, cudaMalloc((void **)&a->base, rounded));
        a->kind = CU_MEM_SYM_LOCAL;
    }
    a->bytes = bytes;
    if (!a->peer_mapped)
        TP_LOG_W("cuda rank %d: symmetric memory is not peer-mapped (NVLink/P2P team %d of %d ranks): one-shot "
                 "all_reduce and fused pulls fall back to NCCL",
                 x->rank, lsa, x->world);
    return TP_OK;
}

static void mem_release(cu_ctx *x, cu_alloc *a)
{
    cudaError_t e = cudaSuccess;
    ncclResult_t r = ncclSuccess;
    if (!a->base)
        return;
    switch (a->kind) {
    case CU_MEM_WINDOW:
        /* only after the communicator ended, which took the window's
         * registration with it (see cu_ctx_free) */
        r = ncclMemFree(a->base);
        break;
    default:
        close_peers(x, a); /* also the peers a failed IPC setup had opened */
        e = cudaFree(a->base);
        break;
    }
    if (e != cudaSuccess || r != ncclSuccess)
        TP_LOG_W("cuda rank %d: releasing %zu bytes at %p: %s", x->rank, a->bytes, (void *)a->base,
                 e != cudaSuccess ? cudaGetErrorName(e) : ncclGetErrorString(r));
    memset(a, 0, sizeof *a);
}

/* ------------------------------------------------------- iface: memory */

/* Arenas start as zeros (A4): the warm-up runs every partition eagerly
 * before capture on whatever the arenas hold, and an embedding reading
 * garbage ids would fail on some ranks and not others (a failure that
 * differs per rank at startup). Once per allocation, outside capture. */
static tp_status zero_alloc(cu_ctx *x, const cu_alloc *a, tp_err *err)
{
    CU_TRY(x, err, cudaMemsetAsync(a->base, 0, a->bytes ? a->bytes : 1, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    return TP_OK;
}

static tp_status cuda_alloc(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "alloc", err));
    TP_TRY(refuse_in_capture(x, "allocation", err));
    cu_alloc a;
    memset(&a, 0, sizeof a);
    a.bytes = bytes;
    a.kind = CU_MEM_DEVICE;
    TP_TRY(mem_reserve(x, err));
    CU_TRY(x, err, cudaMalloc((void **)&a.base, bytes ? bytes : 1)); /* 256-byte aligned */
    mem_add(x, &a);
    TP_TRY(zero_alloc(x, &a, err));
    *out = a.base;
    return TP_OK;
}

static tp_status cuda_alloc_symmetric(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "alloc_symmetric", err));
    TP_TRY(refuse_in_capture(x, "symmetric allocation", err));
    cu_alloc a;
    memset(&a, 0, sizeof a);
    TP_TRY(mem_reserve(x, err));
    tp_status st = sym_alloc(x, bytes, &a, err);
    /* Even a failed allocation's memory (and window) is tracked, to be
     * released by cu_ctx_free in teardown order: freed here it could race a
     * peer's collective. */
    if (a.base)
        mem_add(x, &a);
    if (st != TP_OK)
        return st;
    TP_TRY(zero_alloc(x, &a, err));
    *out = a.base;
    return TP_OK;
}

/* Waits for every stream; a failure kills the backend when sticky, and is
 * logged either way. A dead backend is not waited on (cu_wait). */
static int streams_idle(cu_ctx *x)
{
    cudaStream_t st[] = {x->compute, x->side, x->copy};
    const char *names[] = {"compute stream", "side stream", "copy stream"};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++) {
        tp_err tmp;
        if (cu_wait(x, st[i], names[i], &tmp) != TP_OK) {
            TP_LOG_E("%s", tmp.msg);
            return 0;
        }
    }
    return 1;
}

static void cuda_free(tp_backend *b, int rank, void *p)
{
    cu_ctx *x = ctx_of(b);
    if (!p)
        return;
    if (rank != x->rank || x->capturing) {
        TP_LOG_E("cuda rank %d: free(%p) for rank %d%s refused (leaked)", x->rank, p, rank,
                 x->capturing ? " during capture" : "");
        return;
    }
    /* After a revoke the device may still run work on this memory that
     * never ends (A13), and cudaFree waits for the device: it is left to
     * the process's exit, which must follow (must_exit). */
    if (atomic_load(&x->comm_revoked))
        return;
    cu_warn_cuda(x, cudaSetDevice(x->device), "cudaSetDevice (free)");
    for (int i = 0; i < x->n_mem; i++) {
        if (x->mem[i].base != p || x->mem[i].released)
            continue;
        if (x->mem[i].capture_refs > 0) {
            TP_LOG_E("cuda rank %d: free(%p) refused: %d live captured graph(s) use it (leaked; free the captures "
                     "first)",
                     x->rank, p, x->mem[i].capture_refs);
            return;
        }
        /* A window is released with the communicator (deregistering is
         * collective, and ranks free and tear down independently), so its
         * memory stays until then: the engine allocates symmetric memory
         * once per arena pool (engine/exec.h), freed only when the pool
         * grows (at least 2x each time) or at teardown, never per
         * executable (issue 49: each evicted executable kept a window). */
        if (x->mem[i].kind == CU_MEM_WINDOW) {
            x->mem[i].released = 1;
            return;
        }
        /* a graph or op still in flight may use it (capture_free does not wait) */
        if (!streams_idle(x)) {
            TP_LOG_E("cuda rank %d: free(%p): kept (leaked): work that may use it did not finish", x->rank, p);
            return;
        }
        mem_release(x, &x->mem[i]);
        x->mem[i] = x->mem[--x->n_mem];
        return;
    }
    TP_LOG_E("cuda rank %d: free(%p): not an allocation of this backend", x->rank, p);
}

/* ------------------------------------------------------- iface: copies */

tp_status cu_pinned_take(cu_ctx *x, size_t bytes, char **p, tp_err *err)
{
    size_t off = (x->pinned_used + 63) & ~(size_t)63;
    if (off + bytes > x->pinned_bytes) {
        TP_TRY(cu_wait(x, x->copy, "copy stream", err));
        TP_TRY(cu_wait(x, x->compute, "compute stream", err));
        off = 0;
        if (bytes > x->pinned_bytes) {
            size_t grow = bytes > 2 * x->pinned_bytes ? bytes : 2 * x->pinned_bytes;
            char *n = NULL, *old = x->pinned;
            CU_TRY(x, err, cudaHostAlloc((void **)&n, grow, cudaHostAllocPortable));
            x->pinned = n; /* held before the old block goes: nothing leaks or is freed twice */
            x->pinned_bytes = grow;
            if (old)
                cu_warn_cuda(x, cudaFreeHost(old), "cudaFreeHost(old pinned staging)");
        }
    }
    *p = x->pinned + off;
    x->pinned_used = off + bytes;
    return TP_OK;
}

static int host_is_pinned(const void *p)
{
    struct cudaPointerAttributes at;
    if (cudaPointerGetAttributes(&at, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return at.type == cudaMemoryTypeHost;
}

static tp_status check_copy(cu_ctx *x, const tp_tensor *dst, const tp_tensor *src, const char *what, tp_err *err)
{
    char s1[96], s2[96];
    int ok = dst->dtype == src->dtype && dst->ndim == src->ndim;
    for (int i = 0; ok && i < dst->ndim; i++)
        ok = dst->shape[i] == src->shape[i];
    if (!ok)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: %s of %s %s into %s %s", x->rank, what,
                       tp_dtype_name(src->dtype), tp_shape_str(s1, sizeof s1, src->ndim, src->shape),
                       tp_dtype_name(dst->dtype), tp_shape_str(s2, sizeof s2, dst->ndim, dst->shape));
    return TP_OK;
}

/* Host -> device on the copy stream, after compute's earlier work (which
 * may still read dst), with compute waiting for it. The host side is
 * packed into pinned staging unless it already is contiguous pinned memory
 * (then it must stay valid until synchronize). */
static tp_status cuda_copy_in(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "copy_in", err));
    TP_TRY(refuse_in_capture(x, "copy_in", err));
    TP_TRY(check_copy(x, dst, src, "copy_in", err));
    TP_TRY(cu_check_tensor(x, dst, "copy_in destination", err));
    if (!tp_tensor_is_contiguous(dst))
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: copy_in destination must be contiguous", x->rank);
    size_t bytes = cu_nbytes(src);
    if (bytes == 0)
        return TP_OK;
    const char *from = src->data;
    if (!tp_tensor_is_contiguous(src) || !host_is_pinned(src->data)) {
        char *stage;
        TP_TRY(cu_pinned_take(x, bytes, &stage, err));
        tp_tensor view = tp_tensor_make(stage, src->dtype, src->ndim, src->shape);
        tp_tensor_copy(&view, src);
        from = stage;
    }
    CU_TRY(x, err, cudaEventRecord(x->ev_fork, x->compute));
    CU_TRY(x, err, cudaStreamWaitEvent(x->copy, x->ev_fork, 0));
    CU_TRY(x, err, cudaMemcpyAsync(dst->data, from, bytes, cudaMemcpyHostToDevice, x->copy));
    CU_TRY(x, err, cudaEventRecord(x->ev_copy, x->copy));
    CU_TRY(x, err, cudaStreamWaitEvent(x->compute, x->ev_copy, 0));
    return TP_OK;
}

static tp_status check_device_errors(cu_ctx *x, tp_err *err);

/* Device -> host: the span src touches goes to pinned staging on compute
 * (after every op), then the host gathers src's strides into dst. */
static tp_status cuda_copy_out(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "copy_out", err));
    TP_TRY(refuse_in_capture(x, "copy_out", err));
    TP_TRY(check_copy(x, dst, src, "copy_out", err));
    TP_TRY(cu_check_tensor(x, src, "copy_out source", err));
    int64_t lo;
    int64_t span = tp_tensor_span(src, &lo);
    if (span == 0)
        return TP_OK;
    size_t es = tp_dtype_size(src->dtype);
    char *stage;
    TP_TRY(cu_pinned_take(x, (size_t)span, &stage, err));
    CU_TRY(x, err, cudaMemcpyAsync(stage, (char *)src->data + lo * (int64_t)es, (size_t)span,
                                   cudaMemcpyDeviceToHost, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    TP_TRY(cu_wait(x, x->copy, "copy stream", err));
    /* before the device's data errors: a step whose copy_out reports one
     * (TP_INVALID) is benign and skips synchronize, so an NCCL failure
     * under it would go unseen */
    TP_TRY(cu_check_comm(x, "this step's NCCL work", err));
    TP_TRY(check_device_errors(x, err));
    tp_tensor view = *src;
    view.data = stage - lo * (int64_t)es;
    tp_tensor_copy(dst, &view);
    x->pinned_used = 0; /* every DMA using staging is complete */
    return TP_OK;
}

/* ------------------------------------------------ iface: ops, collectives */

static tp_status check_all(cu_ctx *x, const tp_tensor *ins, int n_ins, const tp_tensor *out, tp_err *err)
{
    char what[32];
    for (int i = 0; i < n_ins; i++) {
        snprintf(what, sizeof what, "input %d", i);
        TP_TRY(cu_check_tensor(x, &ins[i], what, err));
    }
    return cu_check_tensor(x, out, "output", err);
}

static tp_status cuda_run_op(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                             tp_tensor *out, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, tp_op_name(op), err));
    x->scratch_used = 0; /* invariant 5 */
    tp_status st = check_all(x, ins, n_ins, out, err);
    if (st == TP_OK)
        st = cu_run_op(x, op, a, ins, n_ins, out, err);
    if (st != TP_OK && x->capturing)
        x->capture_failed = 1;
    return st;
}

static tp_status cuda_collective(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                                 int n_ins, tp_tensor *out, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, tp_op_name(op), err));
    x->scratch_used = 0;
    tp_status st = check_all(x, ins, n_ins, out, err);
    if (st == TP_OK && n_ins < 1)
        st = tp_fail(err, TP_INTERNAL, "cuda rank %d: %s without an input", x->rank, tp_op_name(op));
    if (st == TP_OK)
        st = tp_op_kind_of(op) == TP_KIND_FUSED ? cu_fused(x, op, a, ins, n_ins, out, err)
                                                 : cu_collective(x, op, a, &ins[0], out, err);
    if (st != TP_OK && x->capturing)
        x->capture_failed = 1;
    return st;
}

/* ------------------------------------------------------- iface: capture */

static tp_status cuda_begin_capture(tp_backend *b, int rank, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "begin_capture", err));
    if (x->capturing)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: capture already in progress", x->rank);
    /* thread-local: other threads' CUDA calls (HTTP, logging) stay legal */
    CU_TRY(x, err, cudaStreamBeginCapture(x->compute, cudaStreamCaptureModeThreadLocal));
    x->capturing = 1;
    x->capture_failed = 0;
    x->n_cap_refs = 0;
    return TP_OK;
}

static tp_status new_capture(cu_ctx *x, cudaGraphExec_t exec, tp_capture **out, tp_err *err)
{
    tp_capture *c = calloc(1, sizeof *c);
    char **refs = calloc((size_t)x->n_cap_refs + 1, sizeof *refs);
    if (!c || !refs) {
        free(c);
        free(refs);
        cu_warn_cuda(x, cudaGraphExecDestroy(exec), "cudaGraphExecDestroy");
        return tp_fail(err, TP_NOMEM, "cuda rank %d: out of host memory ending a capture", x->rank);
    }
    memcpy(refs, x->cap_refs, (size_t)x->n_cap_refs * sizeof *refs);
    c->exec = exec;
    c->refs = refs;
    c->n_refs = x->n_cap_refs;
    for (int i = 0; i < c->n_refs; i++)
        cu_find_alloc(x, refs[i])->capture_refs++;
    c->next = x->live;
    x->live = c;
    *out = c;
    return TP_OK;
}

static tp_status cuda_end_capture(tp_backend *b, int rank, tp_capture **out, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    if (rank != x->rank || !x->capturing)
        return tp_fail(err, TP_INTERNAL, "cuda rank %d: end_capture for rank %d without begin_capture", x->rank,
                       rank);
    cudaGraph_t graph = NULL;
    cudaError_t e = cudaStreamEndCapture(x->compute, &graph); /* always: leaves capture mode */
    x->capturing = 0;
    if (x->capture_failed || e != cudaSuccess) {
        if (graph)
            cu_warn_cuda(x, cudaGraphDestroy(graph), "cudaGraphDestroy(discarded capture)");
        if (e != cudaSuccess)
            return cu_fail_cuda(x, err, (int)e, "cudaStreamEndCapture(compute, &graph)", __FILE__, __LINE__);
        return tp_fail(err, TP_BACKEND, "cuda rank %d: capture discarded: an op failed while it was recorded",
                       x->rank);
    }
    cudaGraphExec_t exec = NULL;
    e = cudaGraphInstantiate(&exec, graph, 0); /* CUDA 13: three arguments */
    cu_warn_cuda(x, cudaGraphDestroy(graph), "cudaGraphDestroy"); /* the exec is independent of it */
    if (e != cudaSuccess)
        return cu_fail_cuda(x, err, (int)e, "cudaGraphInstantiate(&exec, graph, 0)", __FILE__, __LINE__);
    return new_capture(x, exec, out, err);
}

/* The dead check is repeated under launch_mu, right before the launch:
 * cu_enter's check alone left a window in which revoke_comm could run (on
 * the watchdog's thread) and the graph's NCCL kernels then start after the
 * revoke's job had cleared NCCL's abort flags, against a dead peer (A13). */
static tp_status cuda_replay(tp_backend *b, int rank, tp_capture *c, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "replay", err));
    TP_TRY(refuse_in_capture(x, "replay", err));
    pthread_mutex_lock(&x->launch_mu);
    if (atomic_load(&x->dead)) {
        pthread_mutex_unlock(&x->launch_mu);
        return tp_fail(err, TP_BACKEND, "cuda rank %d: replay refused, the backend failed: %s", x->rank,
                       dead_reason(x));
    }
    cudaError_t e = cudaGraphLaunch(c->exec, x->compute);
    pthread_mutex_unlock(&x->launch_mu);
    if (e != cudaSuccess)
        return cu_fail_cuda(x, err, (int)e, "cudaGraphLaunch(c->exec, x->compute)", __FILE__, __LINE__);
    return TP_OK;
}

static void capture_release(cu_ctx *x, tp_capture *c)
{
    cu_warn_cuda(x, cudaGraphExecDestroy(c->exec), "cudaGraphExecDestroy");
    for (int i = 0; i < c->n_refs; i++) {
        cu_alloc *a = cu_find_alloc(x, c->refs[i]);
        if (a && a->capture_refs > 0)
            a->capture_refs--;
    }
    free(c->refs);
    free(c);
}

static void cuda_capture_free(tp_backend *b, tp_capture *c)
{
    cu_ctx *x = ctx_of(b);
    if (!c)
        return;
    /* After a revoke the exec stays on x->live for cu_ctx_free to abandon:
     * destroying it lets NCCL's destructor of its work run (asynchronously,
     * cudaUserObjectNoDestructorSync) whenever that work ends (A13). */
    if (atomic_load(&x->comm_revoked))
        return;
    for (tp_capture **p = &x->live; *p; p = &(*p)->next)
        if (*p == c) {
            *p = c->next;
            capture_release(x, c);
            return;
        }
    TP_LOG_E("cuda rank %d: capture_free(%p): not a live capture of this backend", x->rank, (void *)c);
}

/* --------------------------------------------- iface: sync, abort, reset */

/* Reads back the device error word; a report is turned into this call's
 * error (and the word cleared). */
static tp_status check_device_errors(cu_ctx *x, tp_err *err)
{
    tp_cuda_error e;
    CU_TRY(x, err, cudaMemcpyAsync(&e, x->errw, sizeof e, cudaMemcpyDeviceToHost, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    if (e.code == TP_CUDA_ERR_NONE)
        return TP_OK;
    CU_TRY(x, err, cudaMemsetAsync(x->errw, 0, sizeof *x->errw, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    if (e.code == TP_CUDA_ERR_EMBED_ID || e.code == TP_CUDA_ERR_GATHER_ID) {
        /* TP_INVALID after the step's work completed: the engine marks
         * it benign for the whole group (tp_rank_group_benign), so no
         * process revokes its communicator for it (A3). */
        return tp_fail(err, TP_INVALID, "cuda rank %d: %s: id %lld (position %lld) is out of range", x->rank,
                       e.code == TP_CUDA_ERR_EMBED_ID ? "embedding" : "gather", e.b, e.c);
    }
    if (e.code == TP_CUDA_ERR_KV_ROW) /* as benign: the row wrote nothing */
        return tp_fail(err, TP_INVALID, "cuda rank %d: kv_attention: row %d has slot %lld / position %lld outside "
                       "the caches", x->rank, e.a, e.b, e.c);
    char msg[512];
    if (e.code == TP_CUDA_ERR_ABORTED)
        snprintf(msg, sizeof msg,
                 "cuda rank %d: a cross-rank kernel stopped waiting for rank %d (slot %lld, epoch %lld): the backend "
                 "was aborted",
                 x->rank, e.a, e.b, e.c);
    else
        snprintf(msg, sizeof msg,
                 "cuda rank %d: a cross-rank kernel gave up waiting for rank %d (slot %lld, epoch %lld) after %llu "
                 "ms: the peer died or the ranks issued different collectives",
                 x->rank, e.a, e.b, e.c, x->sync.timeout_ns / 1000000ull);
    mark_dead(x, msg);
    return tp_fail(err, TP_BACKEND, "%s", msg);
}

static tp_status cuda_synchronize(tp_backend *b, int rank, tp_err *err)
{
    cu_ctx *x = ctx_of(b);
    TP_TRY(cu_enter(x, rank, "synchronize", err));
    TP_TRY(refuse_in_capture(x, "synchronize", err));
    TP_TRY(cu_wait(x, x->copy, "copy stream", err));
    TP_TRY(cu_wait(x, x->side, "side stream", err));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    x->pinned_used = 0;
    TP_TRY(cu_check_comm(x, "this step's NCCL work", err));
    tp_status st = check_device_errors(x, err);
    if (st == TP_OK || st == TP_INVALID) /* every stream idle, NCCL's work complete */
        atomic_store(&x->busy, 0);
    return st;
}

/* A rank failed while others may be blocked in a collective: revoke the
 * communicator so they fail instead of hanging (never abort it here: see
 * the file comment). The group does not call this for a benign failure. */
static void cuda_abort(tp_backend *b) { revoke_comm(ctx_of(b), "aborted: a rank of the group failed"); }

/* A dead peer process never enters the next NCCL call: only a revoke
 * unblocks ours. */
static void cuda_peer_lost(tp_backend *b)
{
    revoke_comm(ctx_of(b), "aborted: a rank's process is gone");
}

/* The rank group's watchdog, every tick of a step in flight (A12): a
 * collective whose peer or transport failed may never complete, and the
 * rank thread then waits in it (or in cudaStreamSynchronize) until a
 * revoke; NCCL says so only through the communicator's async error, which
 * ncclCommGetAsyncError reads with an atomic load (init.cc), so any thread
 * may ask. ncclInProgress is not a fault: it is what a revoked
 * communicator, or a group call still being issued, reports. Only marks
 * the backend dead (the rank thread may be capturing: its capture state is
 * its own); the watchdog's abort then revokes. */
static const char *poll_fault(cu_ctx *x)
{
    if (!x || atomic_load(&x->dead) || !atomic_load(&x->comm_ready))
        return NULL;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(x->comm, &async) != ncclSuccess || async == ncclSuccess || async == ncclInProgress)
        return NULL;
    char msg[768];
    nccl_message(x, async, "a collective (ncclCommGetAsyncError, asked while the step waited)", __FILE__, __LINE__,
                 msg, sizeof msg);
    mark_dead(x, msg);
    return dead_reason(x);
}

static const char *cuda_fault(tp_backend *b) { return poll_fault(ctx_of(b)); }

/* Nothing to clear, on purpose (cuda_backend.h, "After an abort"): a
 * benign failure leaves the backend as it was, and after an abort the
 * communicator is revoked and the device may still run work that never
 * ends, so no call may use or wait on it again: only a new process
 * recovers (must_exit). */
static void cuda_reset(tp_backend *b) { (void)b; }

/* Dead is for good (only a new process recovers), and after a revoke the
 * device is never waited on again (cu_wait, cuda_free, cu_ctx_free): the
 * process must exit for it to be released (A13). */
static int cuda_must_exit(tp_backend *b) { return atomic_load(&ctx_of(b)->dead) != 0; }

/* Only a finished message (state 2) is published: the engine keeps the
 * pointer for the backend's lifetime, and state 1 is a few stores long. */
static const char *cuda_dead(tp_backend *b)
{
    cu_ctx *x = ctx_of(b);
    return atomic_load(&x->dead) == 2 ? x->dead_msg : NULL;
}

/* ------------------------------------------------------- iface: destroy */

static void destroy_captures(cu_ctx *x)
{
    if (x->capturing) {
        cudaGraph_t g = NULL;
        if (cu_warn_cuda(x, cudaStreamEndCapture(x->compute, &g), "cudaStreamEndCapture (teardown)") && g)
            cu_warn_cuda(x, cudaGraphDestroy(g), "cudaGraphDestroy (teardown)");
        x->capturing = 0;
    }
    while (x->live) {
        tp_capture *c = x->live;
        x->live = c->next;
        TP_LOG_W("cuda rank %d: destroying a capture still live at backend destroy", x->rank);
        capture_release(x, c);
    }
}

static void destroy_streams(cu_ctx *x)
{
    cudaEvent_t *ev[] = {&x->ev_copy, &x->ev_fork, &x->ev_join, &x->ev_pull[0], &x->ev_pull[1], &x->ev_gemm[0],
                         &x->ev_gemm[1]};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        if (*ev[i])
            cu_warn_cuda(x, cudaEventDestroy(*ev[i]), "cudaEventDestroy");
    cudaStream_t *st[] = {&x->compute, &x->copy, &x->side};
    for (size_t i = 0; i < sizeof st / sizeof st[0]; i++)
        if (*st[i])
            cu_warn_cuda(x, cudaStreamDestroy(*st[i]), "cudaStreamDestroy");
}

static void destroy_buffers(cu_ctx *x)
{
    for (int i = 0; i < x->n_retired; i++)
        cu_warn_cuda(x, cudaFree(x->retired[i]), "cudaFree(retired scratch)");
    free(x->retired);
    void *dev[] = {x->scratch, x->xchg, x->errw, x->lt_ws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        if (dev[i])
            cu_warn_cuda(x, cudaFree(dev[i]), "cudaFree (teardown)");
    if (x->pinned)
        cu_warn_cuda(x, cudaFreeHost(x->pinned), "cudaFreeHost(pinned staging)");
    if (x->abort_host)
        cu_warn_cuda(x, cudaFreeHost(x->abort_host), "cudaFreeHost(abort word)");
}

static void release_memory(cu_ctx *x)
{
    for (int i = 0; i < x->n_mem; i++)
        mem_release(x, &x->mem[i]);
    free(x->mem);
    x->mem = NULL;
    x->n_mem = 0;
    mem_release(x, &x->ctrl);
}

/* Backends torn down after they died: kept whole, reachable (so leak
 * checkers stay quiet), until the process exits. */
static pthread_mutex_t abandoned_mu = PTHREAD_MUTEX_INITIALIZER;
static cu_ctx *abandoned;

/* A revoked backend is not torn down: its device may still run work that
 * never ends (A13), and every device-side release waits for it or races
 * it —
 *  - cudaDeviceSynchronize, cudaFree, cudaFreeHost, ncclMemFree and
 *    cudaHostUnregister wait for (or pull memory from under) that work;
 *  - ncclCommAbort after ncclCommRevoke frees the communicator at once:
 *    the revoke set finalizeCalled, so commReclaim skips commDestroySync's
 *    wait for graph references (init.cc), while NCCL's destructor of each
 *    captured plan (persistentDestructor, a cudaUserObject made with
 *    cudaUserObjectNoDestructorSync, strongstream.cc) runs whenever CUDA
 *    lets go of the graph and enqueues into that freed communicator.
 * So everything stays as it is and the process exits (must_exit): the
 * driver then tears the context down, work included. */
static void abandon(cu_ctx *x)
{
    TP_LOG_W("cuda rank %d: the failed backend's device memory, graphs and NCCL communicator are left to the "
             "process's exit (its device may still run work that never ends; nothing waits for it)",
             x->rank);
    pthread_mutex_lock(&abandoned_mu);
    x->abandoned_next = abandoned;
    abandoned = x;
    pthread_mutex_unlock(&abandoned_mu);
}

/* Order matters:
 *  - a revoked backend is abandoned, not torn down (see abandon); a dead
 *    one that was idle when it died (never revoked) is torn down;
 *  - the device is idle before the host staging is unregistered (A9: a
 *    copy_in DMA may still read it) and before any memory is freed (graph
 *    execs go first: ending a capture must precede the wait, and an exec
 *    destroyed in flight completes);
 *  - graphs holding NCCL work are destroyed before the communicator is
 *    destroyed, which in NCCL 2.28 waits for them and for their
 *    destructors (A1);
 *  - no collective at teardown: every process tears down on its own (a
 *    worker after the leader's quit), so windows are not deregistered
 *    (collective) but end with the communicator, and their memory is
 *    freed after it;
 *  - the communicator goes before the streams it was used on. */
static void cu_ctx_free(cu_ctx *x)
{
    if (!x)
        return;
    if (atomic_load(&x->comm_revoked)) {
        abandon(x);
        return;
    }
    if (x->device >= 0)
        cu_warn_cuda(x, cudaSetDevice(x->device), "cudaSetDevice (teardown: what follows may free on another device)");
    /* first: a capture in progress cannot be waited for (the wait would
     * invalidate it); an exec destroyed in flight completes first (CUDA) */
    destroy_captures(x);
    if (x->compute)
        cu_warn_cuda(x, cudaDeviceSynchronize(), "cudaDeviceSynchronize (teardown)");
    if (x->registered) /* the process is tearing down; nothing else holds it */
        cu_warn_cuda(x, cudaHostUnregister(x->registered), "cudaHostUnregister (teardown)");
    /* Healthy (a revoked backend is dead and never gets here): every graph
     * is gone, and ncclCommDestroy waits for NCCL's destructors of their
     * plans (commDestroySync, localPersistentRefs) before freeing. */
    if (atomic_load(&x->comm_ready)) {
        ncclResult_t r = ncclCommDestroy(x->comm);
        if (r != ncclSuccess)
            TP_LOG_W("cuda rank %d: ncclCommDestroy: %s", x->rank, ncclGetErrorString(r));
    }
    release_memory(x);
    cu_gemm_free(x);
    if (x->lt)
        cu_warn_blas(x, cublasLtDestroy(x->lt), "cublasLtDestroy");
    destroy_buffers(x);
    destroy_streams(x);
    if (x->launch_mu_ok)
        pthread_mutex_destroy(&x->launch_mu);
    free(x->cap_refs);
    free(x->warm);
    free(x);
}

/* The rank group's shared request staging, page-locked (portable) so
 * copy_in/copy_out DMA straight from and to it; unregistered in
 * cu_ctx_free once the device is idle. */
static tp_status pin_host(cu_ctx *x, void *p, size_t bytes, tp_err *err)
{
    if (x->registered)
        return tp_fail(err, TP_INTERNAL, "rank %d: host staging is already registered", x->rank);
    CU_TRY(x, err, cudaSetDevice(x->device));
    CU_TRY(x, err, cudaHostRegister(p, bytes, cudaHostRegisterPortable));
    x->registered = p;
    return TP_OK;
}

static void cuda_destroy(tp_backend *b)
{
    if (!b)
        return;
    cu_ctx_free(ctx_of(b));
    free(b);
}

static const tp_backend_iface cuda_iface = {
    .name = "cuda",
    .host_addressable = 0,
    .warm_up_before_capture = 1,
    .alloc = cuda_alloc,
    .alloc_symmetric = cuda_alloc_symmetric,
    .free = cuda_free,
    .copy_in = cuda_copy_in,
    .copy_out = cuda_copy_out,
    .run_op = cuda_run_op,
    .collective = cuda_collective,
    .begin_capture = cuda_begin_capture,
    .end_capture = cuda_end_capture,
    .replay = cuda_replay,
    .capture_free = cuda_capture_free,
    .synchronize = cuda_synchronize,
    .abort = cuda_abort,
    .peer_lost = cuda_peer_lost,
    .reset = cuda_reset,
    .dead = cuda_dead,
    .fault = cuda_fault,
    .must_exit = cuda_must_exit,
    .destroy = cuda_destroy,
};

/* ------------------------------------------------------------- create */

int tp_cuda_probe_machine(const char *dev_dir, char *why, size_t len)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaSuccess && n > 0)
        return n;
    (void)cudaGetLastError(); /* do not leave the error pending for later calls */
    char node[300] = "";
    int has_node = dev_dir && tp_cuda_gpu_node(dev_dir, node, sizeof node);
    if (why && len) {
        if (has_node)
            snprintf(why, len,
                     "%s exists but CUDA cannot use it: cudaGetDeviceCount: %s: %s (a driver older than the CUDA "
                     "runtime this was built with, or no driver libraries in this container?)",
                     node, cudaGetErrorName(e), e != cudaSuccess ? cudaGetErrorString(e) : "no device");
        else
            snprintf(why, len, "cudaGetDeviceCount: %s: %s", cudaGetErrorName(e),
                     e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    }
    return has_node ? -1 : 0;
}

int tp_cuda_probe(char *why, size_t len)
{
    int n = tp_cuda_probe_machine("/dev", why, len);
    return n > 0 ? n : 0;
}

int tp_cuda_device_count(void) { return tp_cuda_probe(NULL, 0); }

tp_status tp_cuda_nccl_id_new(char hex[TP_CUDA_NCCL_ID_HEX + 1], tp_err *err)
{
    ncclUniqueId id;
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
        return cu_fail_nccl(NULL, err, r, "ncclGetUniqueId(&id)", __FILE__, __LINE__);
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id.internal[i]);
    return TP_OK;
}

static int parse_id(const char *hex, ncclUniqueId *id)
{
    if (strlen(hex) != TP_CUDA_NCCL_ID_HEX)
        return -1;
    for (int i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
        unsigned v;
        char two[3] = {hex[2 * i], hex[2 * i + 1], 0};
        char *end;
        v = (unsigned)strtoul(two, &end, 16);
        if (*end || !two[0] || !two[1])
            return -1;
        id->internal[i] = (char)v;
    }
    return 0;
}

static tp_status create_streams(cu_ctx *x, tp_err *err)
{
    CU_TRY(x, err, cudaStreamCreateWithFlags(&x->compute, cudaStreamNonBlocking));
    CU_TRY(x, err, cudaStreamCreateWithFlags(&x->copy, cudaStreamNonBlocking));
    CU_TRY(x, err, cudaStreamCreateWithFlags(&x->side, cudaStreamNonBlocking));
    cudaEvent_t *ev[] = {&x->ev_copy, &x->ev_fork, &x->ev_join, &x->ev_pull[0], &x->ev_pull[1], &x->ev_gemm[0],
                         &x->ev_gemm[1]};
    for (size_t i = 0; i < sizeof ev / sizeof ev[0]; i++)
        CU_TRY(x, err, cudaEventCreateWithFlags(ev[i], cudaEventDisableTiming));
    return TP_OK;
}

static tp_status create_buffers(cu_ctx *x, const tp_backend_settings *s, tp_err *err)
{
    x->lt_ws_bytes = (size_t)s->cuda_gemm_workspace_mb << 20;
    x->scratch_bytes = (size_t)s->cuda_scratch_mb << 20;
    x->sync.timeout_ns = (unsigned long long)s->cuda_barrier_timeout_ms * 1000000ull;
    x->check_collectives = s->cuda_check_collectives;
    if (x->lt_ws_bytes)
        CU_TRY(x, err, cudaMalloc(&x->lt_ws, x->lt_ws_bytes));
    if (x->scratch_bytes)
        CU_TRY(x, err, cudaMalloc((void **)&x->scratch, x->scratch_bytes));
    x->xchg_bytes = 1024; /* TP_CUDA_MAX_WORLD IPC handles or peer pointers */
    CU_TRY(x, err, cudaMalloc(&x->xchg, x->xchg_bytes));
    CU_TRY(x, err, cudaMalloc((void **)&x->errw, sizeof *x->errw));
    CU_TRY(x, err, cudaMemset(x->errw, 0, sizeof *x->errw));
    x->pinned_bytes = 1 << 20;
    CU_TRY(x, err, cudaHostAlloc((void **)&x->pinned, x->pinned_bytes, cudaHostAllocPortable));
    /* The abort word our cross-rank kernels poll (comm_protocol.h): mapped
     * host memory, so a store by the host reaches a kernel that is
     * spinning, which no revoke and no stream operation could. */
    int *word = NULL;
    CU_TRY(x, err, cudaHostAlloc((void **)&word, sizeof *word, cudaHostAllocMapped | cudaHostAllocPortable));
    *word = 0;
    x->abort_host = word;
    CU_TRY(x, err, cudaHostGetDevicePointer((void **)&x->abort_dev, word, 0));
    BLAS_TRY(x, err, cublasLtCreate(&x->lt));
    return cu_gemm_create(x, err);
}

static tp_status create_comm(cu_ctx *x, const char *hex, tp_err *err)
{
    ncclUniqueId id;
    if (hex) {
        if (parse_id(hex, &id) != 0)
            return tp_fail(err, TP_INVALID, "cuda rank %d: NCCL id must be %d hex characters", x->rank,
                           TP_CUDA_NCCL_ID_HEX);
    } else if (x->world == 1) {
        NCCL_TRY(x, err, ncclGetUniqueId(&id));
    } else {
        return tp_fail(err, TP_INVALID, "cuda rank %d: a world of %d ranks needs rank 0's NCCL id", x->rank,
                       x->world);
    }
    /* Blocks until every rank has joined, and no other thread can cut it
     * short (there is no communicator to revoke yet): the group runs it
     * only once every rank's local setup succeeded (create_in_group). */
    NCCL_TRY(x, err, ncclCommInitRank(&x->comm, x->world, id, x->rank));
    atomic_store(&x->comm_ready, 1);
    if (atomic_load(&x->dead)) { /* aborted while we were joining */
        revoke_comm(x, "aborted while joining"); /* the abort saw no comm: revoke it here */
        return tp_fail(err, TP_BACKEND, "cuda rank %d: NCCL communicator joined after the group failed: %s", x->rank,
                       dead_reason(x));
    }
    return TP_OK;
}

/* Whether NCCL has symmetric memory on every rank (A2): ncclDevCommCreate
 * refuses with ncclInvalidUsage without it. Asked once, agreed, so every
 * rank takes the same allocation path. Any other failure of the probe also
 * means "no symmetric memory" (logged), never a failed backend: across
 * nodes NCCL activates GIN inside ncclDevCommCreate (dev_runtime.cc,
 * ncclDevrInitOnce), which may fail where plain collectives work fine, and
 * the IPC fallback or NCCL's own algorithms serve then. A failure that
 * broke the communicator shows in the agreement right after (an NCCL
 * error naming the rank). */
static tp_status probe_symmetric(cu_ctx *x, tp_err *err)
{
    if (x->world == 1)
        return TP_OK;
    int s = tp_cuda_nccl_symmetric_support(x->comm);
    if (s < 0) {
        const char *last = ncclGetLastError(x->comm);
        TP_LOG_W("cuda rank %d: the symmetric-memory probe (ncclDevCommCreate/ncclDevCommDestroy) failed: NCCL "
                 "error %d (%s)%s%s; going on without NCCL symmetric memory",
                 x->rank, -s, ncclGetErrorString((ncclResult_t)-s), last && *last ? ": " : "", last ? last : "");
        (void)cudaGetLastError(); /* a CUDA failure inside it is answered here, not by the next launch */
    }
    return agree_all(x, s == 1, &x->sym_support, err);
}

/* The control block of the barriers: zeroed on every rank before any rank
 * may signal into it (the agreement is the fence), then described to the
 * kernels. Without peer mapping the cross-rank kernels are off. */
static tp_status create_ctrl(cu_ctx *x, tp_err *err)
{
    TP_TRY(probe_symmetric(x, err));
    TP_TRY(sym_alloc(x, TP_CUDA_CTRL_BYTES, &x->ctrl, err));
    CU_TRY(x, err, cudaMemsetAsync(x->ctrl.base, 0, TP_CUDA_CTRL_BYTES, x->compute));
    TP_TRY(cu_wait(x, x->compute, "compute stream", err));
    int64_t mn = 0, mx = 0;
    TP_TRY(cu_agree_i64(x, 0, &mn, &mx, err));
    x->sync.rank = x->rank;
    x->sync.world = x->world;
    x->sync.err = x->errw;
    x->sync.abort = x->abort_dev;
    x->sync.flags = (unsigned long long *)x->ctrl.base;
    x->sync.counters = x->sync.flags + TP_CUDA_CTRL_FLAGS;
    x->sync_ok = x->ctrl.peer_mapped && x->world <= TP_CUDA_MAX_WORLD;
    for (int p = 0; x->sync_ok && p < x->world; p++)
        x->sync.peer_flags[p] = (unsigned long long *)x->ctrl.peer[p];
    return TP_OK;
}

static tp_status pick_device(cu_ctx *x, tp_err *err)
{
    char why[256];
    int n = tp_cuda_probe(why, sizeof why);
    if (n == 0)
        return tp_fail(err, TP_UNAVAILABLE, "backend cuda: no CUDA device (%s)", why);
    long local = env_long("LOCAL_RANK", -1, 0, 1 << 20);
    x->device = local >= 0 ? (int)(local % n) : x->rank % n;
    CU_TRY(x, err, cudaSetDevice(x->device));
    return TP_OK;
}

/* Everything that can fail on this rank alone, before any rank enters
 * ncclCommInitRank (which cannot be interrupted, A7). */
static tp_status create_local(int world, int rank, const tp_backend_settings *s, cu_ctx **out, tp_err *err)
{
    cu_ctx *x = calloc(1, sizeof *x);
    if (!x)
        return tp_fail(err, TP_NOMEM, "backend cuda: out of memory");
    x->world = world;
    x->rank = rank;
    x->device = -1;
    atomic_init(&x->busy, 1); /* until the first synchronize: creation's NCCL work */
    x->launch_mu_ok = pthread_mutex_init(&x->launch_mu, NULL) == 0;
    if (!x->launch_mu_ok) {
        free(x);
        return tp_fail(err, TP_NOMEM, "backend cuda: cannot create a mutex");
    }
    tp_status st = pick_device(x, err);
    if (st == TP_OK)
        st = create_streams(x, err);
    if (st == TP_OK)
        st = create_buffers(x, s, err);
    if (st != TP_OK) {
        cu_ctx_free(x);
        return st;
    }
    *out = x;
    return TP_OK;
}

/* The collective part: the communicator, the control block, the warm-up. */
static tp_status create_join(cu_ctx *x, const char *nccl_id_or_null, tp_err *err)
{
    tp_status st = create_comm(x, nccl_id_or_null, err);
    if (st == TP_OK)
        st = create_ctrl(x, err);
    if (st == TP_OK)
        st = cu_warm_up(x, err);
    return st;
}

static tp_status wrap(cu_ctx *x, tp_backend **out, tp_err *err)
{
    tp_backend *b = calloc(1, sizeof *b);
    if (!b) {
        revoke_comm(x, "out of memory creating the backend");
        cu_ctx_free(x);
        return tp_fail(err, TP_NOMEM, "backend cuda: out of memory");
    }
    b->iface = &cuda_iface;
    b->ctx = x;
    b->world = x->world;
    *out = b;
    TP_LOG_I("cuda rank %d of %d on device %d: ready (peer-mapped symmetric memory: %s, NCCL windows: %s)", x->rank,
             x->world, x->device, x->sync_ok ? "yes" : "no", x->sym_support ? "yes" : "no");
    return TP_OK;
}

/* A failed creation is torn down as a failed group: revoked first, so no
 * collective (window deregistration) waits for a peer that gave up. */
static void discard(cu_ctx *x)
{
    revoke_comm(x, "backend creation failed");
    cu_ctx_free(x);
}

tp_status tp_cuda_backend_create(int world, int rank, const char *nccl_id_or_null, tp_backend **out, tp_err *err)
{
    tp_backend_settings s;
    tp_backend_settings_default(&s);
    return tp_cuda_backend_create_with(world, rank, nccl_id_or_null, &s, out, err);
}

tp_status tp_cuda_backend_create_with(int world, int rank, const char *nccl_id_or_null, const tp_backend_settings *s,
                                      tp_backend **out, tp_err *err)
{
    if (world < 1 || rank < 0 || rank >= world)
        return tp_fail(err, TP_INVALID, "backend cuda: rank %d of world %d", rank, world);
    cu_ctx *x = NULL;
    TP_TRY(create_local(world, rank, s, &x, err));
    tp_status st = create_join(x, nccl_id_or_null, err);
    if (st != TP_OK) {
        discard(x);
        return st;
    }
    return wrap(x, out, err);
}

/* ---------------------------------------------- create as group steps (A7)
 *
 * Two timed steps of the rank group: local setup, then the join. A rank
 * failing its local setup fails the first step on every rank, so nobody
 * enters ncclCommInitRank and waits for it forever; a rank failing in the
 * join makes the group revoke every rank's communicator (the hooks), so
 * peers blocked in the agreement all-reduce or a window registration fail
 * at once; a rank that hangs or dies is the group's step timeout / lost
 * process. Either way every rank gets the first failure, named by rank. */

typedef struct {
    tp_rank_group *rg;
    const char *id;
    const tp_backend_settings *s;
    int world;
    cu_ctx *_Atomic x; /* read by the hooks on the poller thread */
} group_create;

static tp_status local_step(void *ctx, int rank, tp_err *err)
{
    group_create *gc = ctx;
    cu_ctx *x = NULL;
    TP_TRY(create_local(gc->world, rank, gc->s, &x, err));
    atomic_store(&gc->x, x);
    /* the group's request staging, page-locked for direct DMA; here so a
     * failure is one rank's local failure like any other */
    const tp_rank_shared *sh = tp_rank_group_shared(gc->rg);
    return sh ? pin_host(x, sh->base + sh->staging_offset, sh->staging_bytes, err) : TP_OK;
}

static tp_status join_step(void *ctx, int rank, tp_err *err)
{
    (void)rank;
    group_create *gc = ctx;
    return create_join(atomic_load(&gc->x), gc->id, err);
}

static void creation_failed(void *ctx)
{
    cu_ctx *x = atomic_load(&((group_create *)ctx)->x);
    if (x)
        revoke_comm(x, "NCCL communicator revoked: a rank failed while the group was created");
}

/* The warm-up's collectives can stall as a run's can. */
static const char *creation_fault(void *ctx) { return poll_fault(atomic_load(&((group_create *)ctx)->x)); }

tp_status tp_cuda_backend_create_in_group(tp_rank_group *rg, const char *nccl_id, const tp_backend_settings *s,
                                          tp_backend **out, tp_err *err)
{
    group_create gc = {.rg = rg, .id = nccl_id, .s = s, .world = tp_rank_group_world(rg)};
    atomic_init(&gc.x, NULL);
    tp_rank_hooks hooks = {.fail = creation_failed, .lost = creation_failed, .ctx = &gc, .fault = creation_fault};
    tp_status st = tp_rank_group_run(rg, local_step, &gc, &hooks, err);
    if (st == TP_OK)
        st = tp_rank_group_run(rg, join_step, &gc, &hooks, err);
    cu_ctx *x = atomic_load(&gc.x);
    if (st != TP_OK) {
        if (x)
            discard(x);
        return st;
    }
    return wrap(x, out, err);
}

int tp_cuda_backend_rank(const tp_backend *b)
{
    return b && b->iface == &cuda_iface ? ((const cu_ctx *)b->ctx)->rank : -1;
}
