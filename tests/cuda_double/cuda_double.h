/* cuda_double.h — a test double of the CUDA runtime, NCCL and cuBLASLt
 * entry points the cuda backend calls (and of its kernel launchers), for a
 * test binary only: it is never linked into tpserve (test_cuda_host, and
 * test_cuda_device_dbl: the device suite tests/unit/test_cuda_device.c
 * built against it).
 *
 * What it is: host memory stands in for device memory; every stream is an
 * ordered queue run by its own thread, asynchronously to the host (see
 * "Streams" below); kernels are recorded and counted but their arithmetic
 * never runs (values are not checked: the cpu backend proves the math;
 * the barrier and one-shot kernels do run the cross-rank protocol of
 * kernels/cuda/comm_protocol.h on the stream's thread, kernels_double.c,
 * the embedding and gather report injected bad ids, zero_rows zeroes),
 * memory copies and NCCL collectives really move bytes (between processes
 * through one shared memory segment per communicator, and through CUDA IPC
 * mappings), and a
 * capture records every operation into a graph that cudaGraphLaunch
 * enqueues, as one piece of work, on the launch stream.
 *
 * Streams: an operation enqueued outside a capture runs on the stream's
 * thread, in stream order, only once something needs it (a
 * cudaStreamSynchronize / cudaDeviceSynchronize, or another stream's
 * cudaStreamWaitEvent reaching it) or TP_DOUBLE_STREAM_LAG_MS after it was
 * enqueued, whichever comes first: so a host read before a sync, or a
 * stream that uses another's result without cudaStreamWaitEvent, sees the
 * old bytes. cudaEventRecord marks a stream's position, cudaStreamWaitEvent
 * makes the waiting stream's later work wait until that position has run.
 * Copies from or to pageable host memory are host-synchronous as CUDA
 * documents them (pageable source: staged at the call; pageable
 * destination: the call waits for the stream, then copies). cudaFree,
 * cudaFreeHost and ncclMemFree wait for every stream (CUDA's cudaFree
 * synchronises the device); cudaMemcpy/cudaMemset and the legacy stream
 * wait for blocking streams only (the backend's are non-blocking). A failed
 * operation's error is sticky on its stream and returned by every later
 * synchronisation of it.
 *
 * What it enforces (each breach is a "rule" line on stderr and in
 * $TP_DOUBLE_LOG, and the call fails as CUDA/NCCL would):
 *  - nothing allocated, freed, copied synchronously or synchronised by the
 *    capturing thread during a (thread-local) capture; the capture is then
 *    invalidated;
 *  - every stream forked into a capture is joined back before it ends;
 *  - only an instantiated graph (a live cudaGraphExec_t) is launched;
 *  - ncclCommAbort / ncclCommDestroy while a graph or exec that captured
 *    NCCL work on the communicator is alive would wait forever in NCCL
 *    2.28 (init.cc commDestroySync, localPersistentRefs): reported instead
 *    of hanging;
 *  - ncclCommRevoke as NCCL 2.28.9 does it (init.cc commRevokeAsync): it
 *    sets the communicator's abort flag, which ends every NCCL wait in
 *    progress, blocks until the eager (uncaptured) NCCL work enqueued
 *    before it has finished, then clears the flag again; later calls are
 *    refused (ncclInvalidUsage, enqueue.cc), but NCCL work of a graph that
 *    starts after the revoke returned (a replay queued behind other work,
 *    or launched after it) runs normally and waits for its peers: against
 *    a dead peer, that is a hang. A wait nobody ends for TP_DOUBLE_HANG_MS
 *    (20000) is reported as a hang;
 *  - ncclCommAbort / ncclCommDestroy after a revoke do not wait for graphs
 *    (NCCL sets finalizeCalled): freeing a communicator while a graph that
 *    captured NCCL work on it is alive, or its destructor has not run yet,
 *    is reported (the destructor would touch freed memory); so is NCCL work
 *    that runs on a freed communicator;
 *  - graphs' user objects (NCCL's persistent references) are released by
 *    destructors that run later, on another thread
 *    (cudaUserObjectNoDestructorSync), TP_DOUBLE_DTOR_MS after the last
 *    graph or exec holding them is gone and its launches finished; a
 *    healthy ncclCommDestroy/Abort waits for them as NCCL's
 *    commDestroySync does;
 *  - waiting, from a stream being captured, on an event recorded outside
 *    the capture is refused (cudaErrorStreamCaptureIsolation, the capture
 *    invalidated) unless the wait passes cudaEventWaitExternal, which
 *    records an external wait node (CUDA programming guide, "Prohibited
 *    and unhandled operations");
 *  - cudaIpcGetMemHandle turns the allocation into shared memory and
 *    cudaIpcOpenMemHandle in another process maps it (real bytes, as
 *    peer access over NVLink); opening a handle in the process that made
 *    it is refused, as CUDA does;
 *  - two ranks of a communicator on one device are refused
 *    (ncclInvalidUsage on every rank), as NCCL does;
 *  - window registration is collective (same call, same order on every
 *    rank: any collective whose signature differs across ranks is refused);
 *  - the peer bases of a window are only read for a communicator with
 *    symmetric memory (NCCL 2.28 returns a local registration handle as
 *    the window otherwise);
 *  - host memory is unregistered only once the device is idle;
 *  - new device memory is filled with 0xa5, so reading it before writing
 *    (a warm-up on uninitialised ids) shows;
 *  - a failed runtime call's error stays pending until cudaGetLastError,
 *    and a kernel launch reports it as its own (a real launcher returns
 *    cudaGetLastError()): an error handled but not cleared shows.
 *
 * Configuration (environment, read once per process):
 *  TP_DOUBLE_DEVICES    devices per process (default 8)
 *  TP_DOUBLE_SYMMETRIC  0: communicators without NCCL symmetric memory
 *  TP_DOUBLE_FAIL       point:rank[:nth] — make the nth (default 1st) call
 *                       at `point` fail on process rank `rank` ($TP_RANK,
 *                       0 for the leader); points: alloc, window, comm_init,
 *                       capture, replay, nccl_async, embed_id, die
 *                       (_exit(9) at a graph launch), ipc_handle
 *                       (cudaIpcGetMemHandle), gather_id (the gather
 *                       kernel reports an id out of range), devcomm
 *                       (the symmetric-memory probe, ncclDevCommCreate,
 *                       fails with ncclSystemError), ipc_open
 *                       (cudaIpcOpenMemHandle: a node without peer
 *                       access), blas_algo (the cuBLASLt heuristic finds
 *                       no algorithm: CUBLAS_STATUS_NOT_SUPPORTED and a
 *                       count of 0), nccl_stall (the nth NCCL
 *                       exchange of the process never arrives: the
 *                       communicator takes an async error and the call
 *                       waits until revoked, as a kernel whose peer's
 *                       transport failed); up to 4 of them,
 *                       comma-separated (two failures in one step).
 *                       nccl_async counts the looks of the ranks' own
 *                       threads, not those of the rank group's watchdog
 *                       (its thread name), which come at timed ticks
 *  TP_DOUBLE_LOG        a file every process appends rule breaches to
 *  TP_DOUBLE_HANG_MS    how long an NCCL wait may last before it is a hang
 *  TP_DOUBLE_STREAM_LAG_MS  how long enqueued work waits for a sync before
 *                       it runs by itself (default 10; read per stream)
 *  TP_DOUBLE_DTOR_MS    how late a released user object's destructor runs
 *                       (default 5) */
#ifndef TP_CUDA_DOUBLE_H
#define TP_CUDA_DOUBLE_H

#include <stddef.h>

/* Test-facing: what this process saw. */
int dbl_rule_breaches(void);
long dbl_kernel_launches(void);
long dbl_graph_launches(void);
/* cublasLtMatmul calls of this process, and the columns of their (column-
 * major) outputs summed over batches: the backend's D is the graph's
 * output transposed, so these are the graph rows the GEMMs compute. */
long dbl_gemm_calls(void);
long dbl_gemm_cols(void);
/* Called by cudaGraphLaunch before it launches anything (NULL: nothing):
 * a test's way in between the backend's last check and the launch. */
extern void (*dbl_before_graph_launch)(void);
/* ncclMemAlloc allocations of this process not yet freed; NCCL windows
 * registered and not yet deregistered or ended with their communicator. */
int dbl_nccl_allocations(void);
int dbl_nccl_windows(void);

/* ---- shared by the double's own files ---- */

typedef enum {
    DBL_FAIL_ALLOC,
    DBL_FAIL_WINDOW,
    DBL_FAIL_COMM_INIT,
    DBL_FAIL_CAPTURE,
    DBL_FAIL_REPLAY,
    DBL_FAIL_NCCL_ASYNC,
    DBL_FAIL_EMBED_ID,
    DBL_FAIL_DIE,
    DBL_FAIL_IPC_HANDLE,
    DBL_FAIL_NCCL_STALL,
    DBL_FAIL_IPC_OPEN,
    DBL_FAIL_BLAS_ALGO,
    DBL_FAIL_DEVCOMM,
    DBL_FAIL_GATHER_ID,
    DBL_FAIL_POINTS
} dbl_fail_point;

/* Whether this call at `point` is the injected failure. */
int dbl_inject(dbl_fail_point point);
/* Reports a broken rule (printf-style). */
void dbl_rule(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int dbl_env_int(const char *name, int dflt);
int dbl_process_rank(void);

/* A recorded operation: run(args) executes it (now, or at each replay of a
 * graph that captured it); args is a private copy of args_bytes. comm is
 * the NCCL communicator it uses (NULL for a CUDA op): graphs holding one
 * keep a persistent reference on it, as NCCL's do. */
typedef struct ncclComm dbl_comm;
typedef int (*dbl_run_fn)(const void *args);
typedef struct {
    const char *name;
    dbl_run_fn run;
    void *args;
    size_t args_bytes;
    dbl_comm *comm;
} dbl_op;

/* Runs op on stream s now, or records it when s is being captured (then
 * the return is 0). Returns run's result otherwise. s may be NULL (the
 * legacy stream). */
struct CUstream_st;
int dbl_enqueue(struct CUstream_st *s, const char *name, dbl_run_fn run, const void *args, size_t args_bytes,
                dbl_comm *comm);
/* A kernel launch that does nothing but count when it runs. */
int dbl_launch(struct CUstream_st *s, const char *name);
/* Whether the calling thread is capturing (thread-local capture mode). */
int dbl_thread_capturing(void);
/* A call the capturing thread must not make: breaks the rule, invalidates
 * the capture; returns nonzero when the caller must fail. */
int dbl_refuse_in_capture(const char *call);
/* Persistent references on a comm: +1 when a captured graph's user object
 * for it is made, -1 when that user object's destructor runs. */
void dbl_comm_ref(dbl_comm *c, int delta);
/* Whether work enqueued on s now is recorded into a capture. */
int dbl_stream_capturing(struct CUstream_st *s);
/* Makes every stream of this process run its queued work now (no lag). */
void dbl_kick_all(void);
/* Waits for every stream of this process to finish its queued work. */
void dbl_drain_all(void);
/* Waits (up to TP_DOUBLE_HANG_MS) until every released user object's
 * destructor has run; 0 when they all ran. */
int dbl_destructors_wait(void);
/* Test-facing: user-object destructors released but not yet run. */
int dbl_destructors_pending(void);
/* Test-facing: NCCL exchanges of this process waiting right now. */
int dbl_nccl_waits(void);
/* Counts one kernel launch (run by a stream: eagerly or in a replay). */
void dbl_count_launch(void);
/* Shared memory that stands for device memory: ncclMemAlloc's segments
 * (peer 0: an injected alloc failure counts them) and the peers' mappings
 * of them (peer 1). 0 or a cudaError_t. */
int dbl_track_shared(void *p, size_t size, int peer);
int dbl_untrack_shared(void *p);

#endif
