/* cuda_runtime_double.c — the CUDA runtime calls of the cuda backend:
 * memory as host memory, streams that run work at once, events and
 * thread-local capture into graphs, graph instantiation and launch. */
#include <cuda_runtime_api.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_double.h"

#define STREAM_MAGIC 0x5747u
#define EVENT_MAGIC 0xe7e7u
#define GRAPH_MAGIC 0x6a6au
#define EXEC_MAGIC 0xe8ecu
#define MAX_FORKED 16
#define MAX_STREAMS 64
#define MAX_GRAPH_COMMS 4

struct CUstream_st {
    unsigned magic;
    struct CUgraph_st *cap; /* the capture this stream is part of */
    long ops;               /* operations recorded into cap */
    long joined;            /* of them, how many the origin has waited for */
    int busy;               /* ran work since its last synchronisation */
};

struct CUevent_st {
    unsigned magic;
    struct CUgraph_st *cap; /* recorded during this capture */
    struct CUstream_st *src;
    long src_ops;
};

struct CUgraph_st {
    unsigned magic;
    dbl_op *ops;
    int n, cap_ops;
    struct CUstream_st *origin;
    struct CUstream_st *forked[MAX_FORKED];
    int n_forked, invalidated;
    dbl_comm *comms[MAX_GRAPH_COMMS];
    int n_comms;
};

struct CUgraphExec_st {
    unsigned magic;
    dbl_op *ops;
    int n;
    dbl_comm *comms[MAX_GRAPH_COMMS];
    int n_comms;
};

static __thread struct CUgraph_st *tl_capture; /* this thread's capture (thread-local mode) */
static __thread int tl_device;
static __thread cudaError_t tl_last;
static atomic_long kernel_launches, graph_launches;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct CUstream_st *streams[MAX_STREAMS];

long dbl_kernel_launches(void) { return atomic_load(&kernel_launches); }
long dbl_graph_launches(void) { return atomic_load(&graph_launches); }

static cudaError_t fail(cudaError_t e)
{
    tl_last = e;
    return e;
}

/* ------------------------------------------------------------- memory */

typedef enum { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED, MEM_SHARED } mem_kind;
typedef struct {
    char *p;
    size_t bytes;
    mem_kind kind;
} mem_rec;
static mem_rec *mem;
static int n_mem, cap_mem;

static int mem_add(void *p, size_t bytes, mem_kind k)
{
    pthread_mutex_lock(&mu);
    if (n_mem == cap_mem) {
        int cap = cap_mem ? 2 * cap_mem : 64;
        mem_rec *m = realloc(mem, (size_t)cap * sizeof *m);
        if (!m) {
            pthread_mutex_unlock(&mu);
            return -1;
        }
        mem = m;
        cap_mem = cap;
    }
    mem[n_mem++] = (mem_rec){p, bytes, k};
    pthread_mutex_unlock(&mu);
    return 0;
}

/* Removes the record starting at p of kind k; -1 if there is none. */
static int mem_remove(const void *p, mem_kind k)
{
    int found = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_mem; i++)
        if (mem[i].p == p && mem[i].kind == k) {
            mem[i] = mem[--n_mem];
            found = 0;
            break;
        }
    if (n_mem == 0) {
        free(mem);
        mem = NULL;
        cap_mem = 0;
    }
    pthread_mutex_unlock(&mu);
    return found;
}

static int mem_kind_of(const void *p, mem_kind *k)
{
    const char *c = p;
    int found = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_mem && !found; i++)
        if (c >= mem[i].p && c < mem[i].p + (mem[i].bytes ? mem[i].bytes : 1)) {
            *k = mem[i].kind;
            found = 1;
        }
    pthread_mutex_unlock(&mu);
    return found;
}

int dbl_thread_capturing(void) { return tl_capture != NULL; }

int dbl_refuse_in_capture(const char *call)
{
    if (!tl_capture)
        return 0;
    dbl_rule("%s by the capturing thread during a thread-local capture (the capture is invalidated)", call);
    tl_capture->invalidated = 1;
    return 1;
}

/* Device memory: 0xa5 until written, so a read of uninitialised memory
 * (e.g. embedding ids in a warm-up) does not pass by luck as zeros. */
static cudaError_t device_alloc(void **p, size_t size, mem_kind k, const char *call)
{
    if (dbl_refuse_in_capture(call))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (k == MEM_DEVICE && dbl_inject(DBL_FAIL_ALLOC))
        return fail(cudaErrorMemoryAllocation);
    void *m = aligned_alloc(256, ((size ? size : 1) + 255) / 256 * 256);
    if (!m)
        return fail(cudaErrorMemoryAllocation);
    memset(m, 0xa5, size);
    if (mem_add(m, size, k) != 0) {
        free(m);
        return fail(cudaErrorMemoryAllocation);
    }
    *p = m;
    return cudaSuccess;
}

static cudaError_t device_free(void *p, mem_kind k, const char *call)
{
    if (!p)
        return cudaSuccess;
    if (dbl_refuse_in_capture(call))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (mem_remove(p, k) != 0) {
        dbl_rule("%s(%p): not a live allocation of that kind", call, p);
        return fail(cudaErrorInvalidValue);
    }
    free(p);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) { return device_alloc(devPtr, size, MEM_DEVICE, "cudaMalloc"); }
cudaError_t cudaFree(void *devPtr) { return device_free(devPtr, MEM_DEVICE, "cudaFree"); }

cudaError_t cudaHostAlloc(void **pHost, size_t size, unsigned int flags)
{
    (void)flags;
    return device_alloc(pHost, size, MEM_PINNED, "cudaHostAlloc");
}

cudaError_t cudaFreeHost(void *ptr) { return device_free(ptr, MEM_PINNED, "cudaFreeHost"); }

/* ncclMemAlloc's shared segments and their peers' mappings are device
 * memory too (nccl_double.c owns them). */
int dbl_track_shared(void *p, size_t size, int peer)
{
    if (dbl_refuse_in_capture(peer ? "a window's peer mapping" : "ncclMemAlloc"))
        return cudaErrorStreamCaptureUnsupported;
    if (!peer && dbl_inject(DBL_FAIL_ALLOC))
        return cudaErrorMemoryAllocation;
    return mem_add(p, size, MEM_SHARED) == 0 ? 0 : cudaErrorMemoryAllocation;
}

int dbl_untrack_shared(void *p) { return mem_remove(p, MEM_SHARED); }

static int any_stream_busy(void)
{
    int busy = 0;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++)
        busy |= streams[i] && streams[i]->busy;
    pthread_mutex_unlock(&mu);
    return busy;
}

cudaError_t cudaHostRegister(void *ptr, size_t size, unsigned int flags)
{
    (void)flags;
    if (dbl_refuse_in_capture("cudaHostRegister"))
        return fail(cudaErrorStreamCaptureUnsupported);
    return mem_add(ptr, size, MEM_REGISTERED) == 0 ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaHostUnregister(void *ptr)
{
    if (dbl_refuse_in_capture("cudaHostUnregister"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (any_stream_busy())
        dbl_rule("cudaHostUnregister(%p) while streams have unsynchronised work that may still DMA from it", ptr);
    if (mem_remove(ptr, MEM_REGISTERED) != 0)
        return fail(cudaErrorHostMemoryNotRegistered);
    return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *a, const void *ptr)
{
    mem_kind k;
    memset(a, 0, sizeof *a);
    a->device = tl_device;
    if (!mem_kind_of(ptr, &k)) {
        a->type = cudaMemoryTypeUnregistered;
        a->hostPointer = (void *)ptr;
        return cudaSuccess;
    }
    int dev = k == MEM_DEVICE || k == MEM_SHARED;
    a->type = dev ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    a->devicePointer = (void *)ptr;
    a->hostPointer = dev ? NULL : (void *)ptr;
    return cudaSuccess;
}

/* No process can map another's memory here: every peer open fails as on a
 * PCIe node without peer access (symmetric memory then comes from NCCL
 * windows or is not peer-mapped at all). */
cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (dbl_inject(DBL_FAIL_IPC_HANDLE))
        return fail(cudaErrorInvalidValue);
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &devPtr, sizeof devPtr);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    (void)handle;
    (void)flags;
    *devPtr = NULL;
    return fail(cudaErrorPeerAccessUnsupported);
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    (void)devPtr;
    return fail(cudaErrorInvalidValue); /* nothing is ever opened */
}

/* ------------------------------------------------------------ devices */

cudaError_t cudaGetDeviceCount(int *count)
{
    *count = dbl_env_int("TP_DOUBLE_DEVICES", 8);
    return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device)
{
    int n = dbl_env_int("TP_DOUBLE_DEVICES", 8);
    if (device < 0 || device >= n)
        return fail(cudaErrorInvalidDevice);
    tl_device = device;
    return cudaSuccess;
}

cudaError_t cudaGetDevice(int *device)
{
    *device = tl_device;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = tl_last;
    tl_last = cudaSuccess;
    return e;
}

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorPeerAccessUnsupported: return "cudaErrorPeerAccessUnsupported";
    case cudaErrorHostMemoryNotRegistered: return "cudaErrorHostMemoryNotRegistered";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "(cuda double)"; }

/* ------------------------------------------------------------ streams */

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    (void)flags;
    struct CUstream_st *n = calloc(1, sizeof *n);
    if (!n)
        return fail(cudaErrorMemoryAllocation);
    n->magic = STREAM_MAGIC;
    pthread_mutex_lock(&mu);
    int slot = -1;
    for (int i = 0; i < MAX_STREAMS && slot < 0; i++)
        if (!streams[i])
            slot = i;
    if (slot >= 0)
        streams[slot] = n;
    pthread_mutex_unlock(&mu);
    if (slot < 0) {
        free(n);
        return fail(cudaErrorMemoryAllocation);
    }
    *s = n;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    if (s->cap)
        dbl_rule("cudaStreamDestroy of a stream that is part of a capture");
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] == s)
            streams[i] = NULL;
    pthread_mutex_unlock(&mu);
    s->magic = 0;
    free(s);
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (s && s->cap) {
        dbl_rule("cudaStreamSynchronize of a stream being captured");
        s->cap->invalidated = 1;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (dbl_refuse_in_capture("cudaStreamSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (s)
        s->busy = 0;
    return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (dbl_refuse_in_capture("cudaDeviceSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    pthread_mutex_lock(&mu);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i])
            streams[i]->busy = 0;
    pthread_mutex_unlock(&mu);
    return cudaSuccess;
}

static int graph_add_comm(struct CUgraph_st *g, dbl_comm *c)
{
    for (int i = 0; i < g->n_comms; i++)
        if (g->comms[i] == c)
            return 0;
    if (g->n_comms == MAX_GRAPH_COMMS)
        return -1;
    g->comms[g->n_comms++] = c;
    return 0;
}

/* *dst = *src with its own copy of the arguments. */
static int copy_op(dbl_op *dst, const dbl_op *src)
{
    *dst = *src;
    dst->args = malloc(src->args_bytes ? src->args_bytes : 1);
    if (!dst->args)
        return -1;
    memcpy(dst->args, src->args, src->args_bytes);
    return 0;
}

static int record(struct CUgraph_st *g, const dbl_op *op)
{
    if (g->n == g->cap_ops) {
        int cap = g->cap_ops ? 2 * g->cap_ops : 32;
        dbl_op *n = realloc(g->ops, (size_t)cap * sizeof *n);
        if (!n)
            return -1;
        g->ops = n;
        g->cap_ops = cap;
    }
    dbl_op o;
    if (copy_op(&o, op) != 0)
        return -1;
    if (op->comm && graph_add_comm(g, op->comm) != 0) {
        free(o.args);
        return -1;
    }
    g->ops[g->n++] = o;
    return 0;
}

int dbl_enqueue(struct CUstream_st *s, const char *name, dbl_run_fn run, const void *args, size_t args_bytes,
                dbl_comm *comm)
{
    dbl_op op = {name, run, (void *)args, args_bytes, comm};
    if (s && s->cap) {
        if (record(s->cap, &op) != 0) {
            s->cap->invalidated = 1;
            return cudaErrorMemoryAllocation;
        }
        s->ops++;
        return 0;
    }
    if (s)
        s->busy = 1;
    return run(args);
}

void dbl_count_launch(void) { atomic_fetch_add(&kernel_launches, 1); }

static int run_launch(const void *name)
{
    (void)name;
    dbl_count_launch();
    return 0;
}

/* What a real launcher returns: cudaGetLastError() after the launch, which
 * also reports (and clears) an earlier call's failure that nobody cleared.
 * So an error the backend handled but left pending fails the next launch,
 * as on a GPU. */
int dbl_launch(struct CUstream_st *s, const char *name)
{
    int e = dbl_enqueue(s, name, run_launch, &name, sizeof name, NULL);
    cudaError_t pending = cudaGetLastError();
    return e ? e : (int)pending;
}

/* ------------------------------------------------------------- copies */

typedef struct {
    void *dst;
    const void *src;
    size_t n;
    int value; /* memset when src is NULL */
} copy_args;

static int run_copy(const void *a)
{
    const copy_args *c = a;
    if (c->src)
        memmove(c->dst, c->src, c->n);
    else
        memset(c->dst, c->value, c->n);
    return 0;
}

/* A captured copy from or to pageable host memory is not capturable. */
static int pageable(const void *p)
{
    mem_kind k;
    return !mem_kind_of(p, &k);
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    if (s && s->cap && (pageable(dst) || pageable(src))) {
        dbl_rule("cudaMemcpyAsync with pageable host memory during capture");
        s->cap->invalidated = 1;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    copy_args c = {dst, src, count, 0};
    return (cudaError_t)dbl_enqueue(s, "memcpy", run_copy, &c, sizeof c, NULL);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t s)
{
    copy_args c = {dst, NULL, count, value};
    return (cudaError_t)dbl_enqueue(s, "memset", run_copy, &c, sizeof c, NULL);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (dbl_refuse_in_capture("cudaMemcpy"))
        return fail(cudaErrorStreamCaptureUnsupported);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t count)
{
    if (dbl_refuse_in_capture("cudaMemset"))
        return fail(cudaErrorStreamCaptureUnsupported);
    memset(dst, value, count);
    return cudaSuccess;
}

/* ------------------------------------------------------------- events */

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned int flags)
{
    (void)flags;
    struct CUevent_st *n = calloc(1, sizeof *n);
    if (!n)
        return fail(cudaErrorMemoryAllocation);
    n->magic = EVENT_MAGIC;
    *ev = n;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t ev)
{
    if (!ev || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    ev->magic = 0;
    free(ev);
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s)
{
    if (!ev || ev->magic != EVENT_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    ev->cap = s ? s->cap : NULL;
    ev->src = s;
    ev->src_ops = s ? s->ops : 0;
    return cudaSuccess;
}

/* Waiting on an event of a capture pulls the stream into it (a fork); the
 * origin waiting on a forked stream's event joins what it had recorded. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    (void)flags;
    if (!ev || ev->magic != EVENT_MAGIC || (s && s->magic != STREAM_MAGIC))
        return fail(cudaErrorInvalidResourceHandle);
    if (!ev->cap || !s)
        return cudaSuccess;
    struct CUgraph_st *g = ev->cap;
    if (!s->cap) {
        if (g->n_forked == MAX_FORKED)
            return fail(cudaErrorMemoryAllocation);
        s->cap = g;
        s->ops = s->joined = 0;
        g->forked[g->n_forked++] = s;
        return cudaSuccess;
    }
    if (s->cap != g) {
        dbl_rule("cudaStreamWaitEvent merges two captures");
        return fail(cudaErrorStreamCaptureMerge);
    }
    if (ev->src && ev->src != s && ev->src_ops > ev->src->joined)
        ev->src->joined = ev->src_ops;
    return cudaSuccess;
}

/* ------------------------------------------------------------ capture */

cudaError_t cudaStreamBeginCapture(cudaStream_t s, enum cudaStreamCaptureMode mode)
{
    if (!s || s->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle); /* the legacy stream cannot be captured */
    if (mode != cudaStreamCaptureModeThreadLocal)
        dbl_rule("capture mode %d: the backend relies on thread-local capture", (int)mode);
    if (s->cap || tl_capture)
        return fail(cudaErrorIllegalState);
    struct CUgraph_st *g = calloc(1, sizeof *g);
    if (!g)
        return fail(cudaErrorMemoryAllocation);
    g->magic = GRAPH_MAGIC;
    g->origin = s;
    s->cap = g;
    s->ops = s->joined = 0;
    tl_capture = g;
    return cudaSuccess;
}

static void free_ops(dbl_op *ops, int n)
{
    for (int i = 0; i < n; i++)
        free(ops[i].args);
    free(ops);
}

static void graph_free(struct CUgraph_st *g)
{
    g->magic = 0;
    free_ops(g->ops, g->n);
    free(g);
}

static void refs(dbl_comm *const *comms, int n, int delta)
{
    for (int i = 0; i < n; i++)
        dbl_comm_ref(comms[i], delta);
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t *out)
{
    *out = NULL;
    if (!s || !s->cap)
        return fail(cudaErrorIllegalState);
    struct CUgraph_st *g = s->cap;
    if (g->origin != s) {
        dbl_rule("cudaStreamEndCapture on a forked stream, not the origin");
        return fail(cudaErrorStreamCaptureUnmatched);
    }
    int unjoined = 0;
    for (int i = 0; i < g->n_forked; i++) {
        struct CUstream_st *f = g->forked[i];
        if (f->ops > f->joined) {
            dbl_rule("a stream forked into the capture has %ld operation(s) not joined back before its end",
                     f->ops - f->joined);
            unjoined = 1;
        }
        f->cap = NULL;
    }
    s->cap = NULL;
    tl_capture = NULL;
    cudaError_t e = unjoined ? cudaErrorStreamCaptureUnjoined
                    : g->invalidated ? cudaErrorStreamCaptureInvalidated
                    : dbl_inject(DBL_FAIL_CAPTURE) ? cudaErrorStreamCaptureInvalidated
                                                    : cudaSuccess;
    if (e != cudaSuccess) {
        graph_free(g);
        return fail(e);
    }
    refs(g->comms, g->n_comms, 1);
    *out = g;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    if (!g || g->magic != GRAPH_MAGIC)
        return fail(cudaErrorInvalidValue);
    refs(g->comms, g->n_comms, -1);
    graph_free(g);
    return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *out, cudaGraph_t g, unsigned long long flags)
{
    (void)flags;
    if (!g || g->magic != GRAPH_MAGIC)
        return fail(cudaErrorInvalidValue);
    struct CUgraphExec_st *x = calloc(1, sizeof *x);
    dbl_op *ops = calloc((size_t)g->n + 1, sizeof *ops);
    if (!x || !ops) {
        free(x);
        free(ops);
        return fail(cudaErrorMemoryAllocation);
    }
    for (int i = 0; i < g->n; i++)
        if (copy_op(&ops[i], &g->ops[i]) != 0) {
            free_ops(ops, i);
            free(x);
            return fail(cudaErrorMemoryAllocation);
        }
    x->magic = EXEC_MAGIC;
    x->ops = ops;
    x->n = g->n;
    memcpy(x->comms, g->comms, sizeof x->comms);
    x->n_comms = g->n_comms;
    refs(x->comms, x->n_comms, 1);
    *out = x;
    return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    if (!x || x->magic != EXEC_MAGIC)
        return fail(cudaErrorInvalidValue);
    refs(x->comms, x->n_comms, -1);
    x->magic = 0;
    free_ops(x->ops, x->n);
    free(x);
    return cudaSuccess;
}

/* Runs the recorded operations in order; an NCCL one that fails leaves its
 * error with the communicator (the async error), as a kernel would. */
cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    if (!x || x->magic != EXEC_MAGIC) {
        dbl_rule("cudaGraphLaunch of %p, which is not an instantiated graph (cudaGraphExec_t)", (void *)x);
        return fail(cudaErrorInvalidValue);
    }
    if (dbl_refuse_in_capture("cudaGraphLaunch"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (dbl_inject(DBL_FAIL_DIE)) {
        fprintf(stderr, "cuda double: rank %d dies at a graph launch (TP_DOUBLE_FAIL)\n", dbl_process_rank());
        _exit(9);
    }
    if (dbl_inject(DBL_FAIL_REPLAY))
        return fail(cudaErrorLaunchFailure);
    atomic_fetch_add(&graph_launches, 1);
    if (s)
        s->busy = 1;
    for (int i = 0; i < x->n; i++)
        x->ops[i].run(x->ops[i].args);
    return cudaSuccess;
}
