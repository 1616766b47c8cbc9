/* cuda_runtime_double.c — the CUDA runtime calls of the cuda backend:
 * memory as host memory, streams as ordered queues each run by its own
 * thread, events that order them, thread-local capture into graphs, graph
 * instantiation and launch, user objects whose destructors run later on
 * another thread, and CUDA IPC between processes (cuda_double.h). */
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "cuda_double.h"

#define STREAM_MAGIC 0x5747u
#define EVENT_MAGIC 0xe7e7u
#define GRAPH_MAGIC 0x6a6au
#define EXEC_MAGIC 0xe8ecu
#define MAX_FORKED 16
#define MAX_STREAMS 64
#define MAX_GRAPH_COMMS 4

/* One operation queued on a stream, at position pos (1-based). */
typedef struct qop {
    dbl_op op;
    long pos;
    int64_t due_ms; /* runs by itself from then on, kicked or not */
    struct qop *next;
} qop;

struct CUstream_st {
    unsigned magic;
    unsigned flags;
    /* capture state: the capturing thread's */
    struct CUgraph_st *cap; /* the capture this stream is part of */
    long ops;               /* operations recorded into cap */
    long joined;            /* of them, how many the origin has waited for */
    atomic_int busy;        /* ran work since its last synchronisation */
    /* the queue, run in order by the stream's thread */
    pthread_mutex_t qmu;
    pthread_cond_t qcv; /* new work, a kick, progress or stop */
    qop *head, *tail;
    long enqueued, done, kicked;
    int err; /* the first failure of its work: sticky */
    int stop, lag_ms;
    pthread_t thread;
    atomic_int holds; /* each_stream callers using it: destroy waits for none */
};

struct CUevent_st {
    unsigned magic;
    struct CUgraph_st *cap; /* recorded during this capture */
    struct CUstream_st *src;
    long src_ops; /* in a capture: operations of src recorded before it */
    long pos;     /* outside: src's position when recorded */
    int recorded;
};

/* A user object (cudaUserObjectCreate): NCCL hangs one on every graph that
 * captured its work, owned by the graph and every exec made from it, with
 * a destructor that drops the communicator's persistent reference. */
typedef struct uobj {
    dbl_comm *comm;
    atomic_int refs;
    int64_t due_ms;
    struct uobj *next;
} uobj;

struct CUgraph_st {
    unsigned magic;
    dbl_op *ops;
    int n, cap_ops;
    struct CUstream_st *origin;
    struct CUstream_st *forked[MAX_FORKED];
    int n_forked, invalidated;
    dbl_comm *comms[MAX_GRAPH_COMMS];
    int n_comms;
    uobj *uo[MAX_GRAPH_COMMS];
};

struct CUgraphExec_st {
    unsigned magic;
    dbl_op *ops;
    int n;
    uobj *uo[MAX_GRAPH_COMMS];
    int n_uo;
    int inflight, destroyed; /* under mu: launches not finished; destroy deferred until 0 */
};

static __thread struct CUgraph_st *tl_capture; /* this thread's capture (thread-local mode) */
static __thread int tl_device;
static __thread cudaError_t tl_last;
static atomic_long kernel_launches, graph_launches;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  /* memory records */
static pthread_mutex_t smu = PTHREAD_MUTEX_INITIALIZER; /* the stream list */
static pthread_mutex_t xmu = PTHREAD_MUTEX_INITIALIZER; /* execs' launches in flight */
static struct CUstream_st *streams[MAX_STREAMS];

long dbl_kernel_launches(void) { return atomic_load(&kernel_launches); }
long dbl_graph_launches(void) { return atomic_load(&graph_launches); }
void (*dbl_before_graph_launch)(void);

static cudaError_t fail(cudaError_t e)
{
    tl_last = e;
    return e;
}

/* ------------------------------------------------------------- memory */

typedef enum { MEM_DEVICE, MEM_PINNED, MEM_REGISTERED, MEM_SHARED, MEM_IPC_PEER } mem_kind;
typedef struct {
    char *p;
    size_t bytes;
    mem_kind kind;
    size_t map_bytes; /* MEM_DEVICE, MEM_IPC_PEER: the mapping's length */
    int ipc_fd;       /* MEM_DEVICE made shareable by cudaIpcGetMemHandle: its memfd, else -1 */
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
    mem[n_mem++] = (mem_rec){p, bytes, k, 0, -1};
    pthread_mutex_unlock(&mu);
    return 0;
}

/* Removes the record starting at p of kind k (*out: what it was); -1 if
 * there is none. */
static int mem_remove(const void *p, mem_kind k, mem_rec *out)
{
    int found = -1;
    pthread_mutex_lock(&mu);
    for (int i = 0; i < n_mem; i++)
        if (mem[i].p == p && mem[i].kind == k) {
            if (out)
                *out = mem[i];
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

static size_t page_round(size_t n)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return ((n ? n : 1) + pg - 1) / pg * pg;
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
 * (e.g. embedding ids in a warm-up) does not pass by luck as zeros. Device
 * allocations are whole pages of their own (cudaIpcGetMemHandle may turn
 * them into shared memory in place). */
static cudaError_t device_alloc(void **p, size_t size, mem_kind k, const char *call)
{
    if (dbl_refuse_in_capture(call))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (k == MEM_DEVICE && dbl_inject(DBL_FAIL_ALLOC))
        return fail(cudaErrorMemoryAllocation);
    size_t map = page_round(size);
    void *m = k == MEM_DEVICE ? mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
                              : aligned_alloc(256, ((size ? size : 1) + 255) / 256 * 256);
    if (k == MEM_DEVICE && m == MAP_FAILED)
        m = NULL;
    if (!m)
        return fail(cudaErrorMemoryAllocation);
    memset(m, 0xa5, size);
    if (mem_add(m, size, k) != 0) {
        if (k == MEM_DEVICE)
            munmap(m, map);
        else
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
    dbl_drain_all(); /* as CUDA's cudaFree, which synchronises the device */
    mem_rec r;
    if (mem_remove(p, k, &r) != 0) {
        dbl_rule("%s(%p): not a live allocation of that kind", call, p);
        return fail(cudaErrorInvalidValue);
    }
    if (k == MEM_DEVICE) {
        munmap(p, page_round(r.bytes));
        if (r.ipc_fd >= 0)
            close(r.ipc_fd);
    } else {
        free(p);
    }
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

int dbl_untrack_shared(void *p) { return mem_remove(p, MEM_SHARED, NULL); }

static int each_stream(int (*fn)(struct CUstream_st *), int blocking_only);

static int stream_busy(struct CUstream_st *s) { return atomic_load(&s->busy); }

static int any_stream_busy(void) { return each_stream(stream_busy, 0); }

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
    if (mem_remove(ptr, MEM_REGISTERED, NULL) != 0)
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
    int dev = k == MEM_DEVICE || k == MEM_SHARED || k == MEM_IPC_PEER;
    a->type = dev ? cudaMemoryTypeDevice : cudaMemoryTypeHost;
    a->devicePointer = (void *)ptr;
    a->hostPointer = dev ? NULL : (void *)ptr;
    return cudaSuccess;
}

/* CUDA IPC across the rank processes: the handle names the allocation's
 * memfd in its process, and an open maps it (real bytes, as peer access
 * over NVLink). TP_DOUBLE_FAIL ipc_open makes the open fail as on a node
 * without peer access. */
#define IPC_MAGIC 0x1bc0d0u
typedef struct {
    unsigned magic;
    int pid, fd;
    size_t map_bytes;
} ipc_handle;

cudaError_t cudaIpcGetMemHandle(cudaIpcMemHandle_t *handle, void *devPtr)
{
    if (dbl_inject(DBL_FAIL_IPC_HANDLE))
        return fail(cudaErrorInvalidValue);
    ipc_handle h = {IPC_MAGIC, (int)getpid(), -1, 0};
    cudaError_t e = cudaSuccess;
    pthread_mutex_lock(&mu);
    mem_rec *r = NULL;
    for (int i = 0; i < n_mem && !r; i++)
        if (mem[i].p == devPtr && mem[i].kind == MEM_DEVICE)
            r = &mem[i];
    if (!r) {
        e = cudaErrorInvalidValue; /* not the base of a cudaMalloc allocation */
    } else if (r->ipc_fd < 0) {  /* made shareable in place: same address, same bytes */
        size_t map = page_round(r->bytes);
        int fd = memfd_create("tpdbl-ipc", MFD_CLOEXEC);
        void *tmp = fd >= 0 && ftruncate(fd, (off_t)map) == 0
                        ? mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                        : MAP_FAILED;
        if (tmp == MAP_FAILED) {
            e = cudaErrorMemoryAllocation;
        } else {
            memcpy(tmp, r->p, map);
            munmap(tmp, map);
            if (mmap(r->p, map, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED)
                e = cudaErrorMemoryAllocation;
        }
        if (e == cudaSuccess)
            r->ipc_fd = fd;
        else if (fd >= 0)
            close(fd);
    }
    if (e == cudaSuccess) {
        h.fd = r->ipc_fd;
        h.map_bytes = page_round(r->bytes);
    }
    pthread_mutex_unlock(&mu);
    if (e != cudaSuccess)
        return fail(e);
    memset(handle, 0, sizeof *handle);
    memcpy(handle->reserved, &h, sizeof h);
    return cudaSuccess;
}

cudaError_t cudaIpcOpenMemHandle(void **devPtr, cudaIpcMemHandle_t handle, unsigned int flags)
{
    (void)flags;
    *devPtr = NULL;
    ipc_handle h;
    memcpy(&h, handle.reserved, sizeof h);
    if (h.magic != IPC_MAGIC)
        return fail(cudaErrorInvalidValue);
    if (h.pid == (int)getpid())
        return fail(cudaErrorInvalidValue); /* CUDA refuses a handle of this very process */
    if (dbl_inject(DBL_FAIL_IPC_OPEN))
        return fail(cudaErrorPeerAccessUnsupported);
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", h.pid, h.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    void *m = fd >= 0 ? mmap(NULL, h.map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    if (m == MAP_FAILED)
        return fail(cudaErrorInvalidResourceHandle);
    if (mem_add(m, h.map_bytes, MEM_IPC_PEER) != 0) {
        munmap(m, h.map_bytes);
        return fail(cudaErrorMemoryAllocation);
    }
    *devPtr = m;
    return cudaSuccess;
}

cudaError_t cudaIpcCloseMemHandle(void *devPtr)
{
    dbl_drain_all(); /* unmapping waits for work that may read it */
    mem_rec r;
    if (mem_remove(devPtr, MEM_IPC_PEER, &r) != 0) {
        dbl_rule("cudaIpcCloseMemHandle(%p): not a mapping cudaIpcOpenMemHandle returned", devPtr);
        return fail(cudaErrorInvalidValue);
    }
    munmap(devPtr, r.bytes);
    return cudaSuccess;
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
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    default: return "cudaErrorUnknown";
    }
}

const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "(cuda double)"; }

/* ------------------------------------------------------------ streams */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static struct timespec deadline_of(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000};
    return ts;
}

static void free_ops(dbl_op *ops, int n)
{
    for (int i = 0; i < n; i++)
        free(ops[i].args);
    free(ops);
}

/* The stream's thread: runs the queue in order, each operation once it is
 * kicked (someone waits for it) or due (the lag passed). */
static void *stream_main(void *p)
{
    struct CUstream_st *s = p;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (!s->head)
            break;
        qop *q = s->head;
        while (s->kicked < q->pos && !s->stop && now_ms() < q->due_ms) {
            struct timespec ts = deadline_of(q->due_ms);
            pthread_cond_timedwait(&s->qcv, &s->qmu, &ts);
        }
        pthread_mutex_unlock(&s->qmu);
        int r = q->op.run(q->op.args);
        pthread_mutex_lock(&s->qmu);
        if (r != 0 && s->err == 0)
            s->err = r;
        s->head = q->next;
        if (!s->head)
            s->tail = NULL;
        s->done = q->pos;
        pthread_cond_broadcast(&s->qcv);
        free(q->op.args);
        free(q);
    }
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

/* Until s has run its work up to pos; its sticky error. */
static int wait_done(struct CUstream_st *s, long pos)
{
    pthread_mutex_lock(&s->qmu);
    if (pos > s->kicked) {
        s->kicked = pos;
        pthread_cond_broadcast(&s->qcv);
    }
    while (s->done < pos)
        pthread_cond_wait(&s->qcv, &s->qmu);
    int e = s->err;
    pthread_mutex_unlock(&s->qmu);
    return e;
}

/* Until s has run everything enqueued so far. */
static int drain(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->qmu);
    long pos = s->enqueued;
    pthread_mutex_unlock(&s->qmu);
    return wait_done(s, pos);
}

/* fn on every stream of this process (blocking ones only, or all): the
 * first nonzero result. Each is held while used, never under a lock (fn
 * may wait for a stream's thread). */
static int each_stream(int (*fn)(struct CUstream_st *), int blocking_only)
{
    struct CUstream_st *list[MAX_STREAMS];
    int n = 0, e = 0;
    pthread_mutex_lock(&smu);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] && (!blocking_only || !(streams[i]->flags & cudaStreamNonBlocking))) {
            atomic_fetch_add(&streams[i]->holds, 1);
            list[n++] = streams[i];
        }
    pthread_mutex_unlock(&smu);
    for (int i = 0; i < n; i++) {
        int r = fn(list[i]);
        if (r && !e)
            e = r;
        atomic_fetch_sub(&list[i]->holds, 1);
    }
    return e;
}

static int kick_all_fn(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->qmu);
    s->kicked = s->enqueued;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return 0;
}

void dbl_kick_all(void) { each_stream(kick_all_fn, 0); }
void dbl_drain_all(void) { each_stream(drain, 0); }

static int clear_busy(struct CUstream_st *s)
{
    atomic_store(&s->busy, 0);
    return 0;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags)
{
    struct CUstream_st *n = calloc(1, sizeof *n);
    if (!n)
        return fail(cudaErrorMemoryAllocation);
    n->magic = STREAM_MAGIC;
    n->flags = flags;
    n->lag_ms = dbl_env_int("TP_DOUBLE_STREAM_LAG_MS", 10);
    pthread_mutex_init(&n->qmu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&n->qcv, &ca);
    pthread_condattr_destroy(&ca);
    if (pthread_create(&n->thread, NULL, stream_main, n) != 0) {
        free(n);
        return fail(cudaErrorMemoryAllocation);
    }
    pthread_mutex_lock(&smu);
    int slot = -1;
    for (int i = 0; i < MAX_STREAMS && slot < 0; i++)
        if (!streams[i])
            slot = i;
    if (slot >= 0)
        streams[slot] = n;
    pthread_mutex_unlock(&smu);
    if (slot < 0) {
        pthread_mutex_lock(&n->qmu);
        n->stop = 1;
        pthread_cond_broadcast(&n->qcv);
        pthread_mutex_unlock(&n->qmu);
        pthread_join(n->thread, NULL);
        free(n);
        return fail(cudaErrorMemoryAllocation);
    }
    *s = n;
    return cudaSuccess;
}

/* CUDA returns at once and finishes the stream's work first; here the
 * stream's thread finishes it before it goes. */
cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s || s->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    if (s->cap)
        dbl_rule("cudaStreamDestroy of a stream that is part of a capture");
    pthread_mutex_lock(&smu);
    for (int i = 0; i < MAX_STREAMS; i++)
        if (streams[i] == s)
            streams[i] = NULL;
    pthread_mutex_unlock(&smu);
    while (atomic_load(&s->holds) > 0)
        usleep(100);
    pthread_mutex_lock(&s->qmu);
    s->stop = 1;
    s->kicked = s->enqueued;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    pthread_join(s->thread, NULL);
    pthread_mutex_destroy(&s->qmu);
    pthread_cond_destroy(&s->qcv);
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
    if (!s) /* the legacy stream: every blocking stream */
        return (cudaError_t)each_stream(drain, 1);
    int e = drain(s);
    atomic_store(&s->busy, 0);
    return e ? fail((cudaError_t)e) : cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void)
{
    if (dbl_refuse_in_capture("cudaDeviceSynchronize"))
        return fail(cudaErrorStreamCaptureUnsupported);
    int e = each_stream(drain, 0);
    each_stream(clear_busy, 0);
    return e ? fail((cudaError_t)e) : cudaSuccess;
}

/* The backend's polled waits (cu_wait) ask this instead of blocking: a
 * query counts as someone waiting (it kicks the stream, whose work would
 * otherwise only start after its lag) but never blocks. cudaErrorNotReady
 * is left pending like any failure, as a real runtime may record it: a
 * caller that does not clear it has its next launch fail. */
static int query_one(struct CUstream_st *s)
{
    pthread_mutex_lock(&s->qmu);
    if (s->kicked < s->enqueued) {
        s->kicked = s->enqueued;
        pthread_cond_broadcast(&s->qcv);
    }
    int e = s->done < s->enqueued ? (int)cudaErrorNotReady : s->err;
    pthread_mutex_unlock(&s->qmu);
    if (e == 0)
        atomic_store(&s->busy, 0);
    return e;
}

cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (s && s->cap) {
        dbl_rule("cudaStreamQuery of a stream being captured");
        s->cap->invalidated = 1;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (dbl_refuse_in_capture("cudaStreamQuery"))
        return fail(cudaErrorStreamCaptureUnsupported);
    int e = s ? query_one(s) : each_stream(query_one, 1);
    return e ? fail((cudaError_t)e) : cudaSuccess;
}

/* Mapped pinned memory (cudaHostAllocMapped): the device's address of it,
 * which here is the host's. */
cudaError_t cudaHostGetDevicePointer(void **pDevice, void *pHost, unsigned int flags)
{
    mem_kind k;
    if (flags != 0 || !pDevice || !mem_kind_of(pHost, &k) || k != MEM_PINNED)
        return fail(cudaErrorInvalidValue);
    *pDevice = pHost;
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

int dbl_stream_capturing(struct CUstream_st *s) { return s && s->cap; }

/* Queues op on s (its own copy of the arguments); the position it got. */
static int queue(struct CUstream_st *s, const dbl_op *op, long *pos)
{
    qop *q = calloc(1, sizeof *q);
    if (!q || copy_op(&q->op, op) != 0) {
        free(q);
        return cudaErrorMemoryAllocation;
    }
    pthread_mutex_lock(&s->qmu);
    q->pos = ++s->enqueued;
    q->due_ms = now_ms() + s->lag_ms;
    if (s->tail)
        s->tail->next = q;
    else
        s->head = q;
    s->tail = q;
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    atomic_store(&s->busy, 1);
    if (pos)
        *pos = q->pos;
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
    if (!s) { /* the legacy stream: after every blocking stream, in the caller */
        each_stream(drain, 1);
        return run(args);
    }
    return queue(s, &op, NULL);
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
    int value;     /* memset when src is NULL */
    void *staged;  /* a pageable source's bytes, taken at the call (freed after) */
} copy_args;

static int run_copy(const void *a)
{
    const copy_args *c = a;
    if (c->src)
        memmove(c->dst, c->src, c->n);
    else
        memset(c->dst, c->value, c->n);
    free(c->staged);
    return 0;
}

/* Host memory CUDA does not know (neither pinned nor registered). */
static int pageable(const void *p)
{
    mem_kind k;
    return !mem_kind_of(p, &k);
}

/* Pageable memory makes a copy host-synchronous, as CUDA documents it: a
 * pageable source is staged before the call returns (the host may reuse
 * it at once), a pageable destination is written before it returns (after
 * the stream's earlier work). During a capture it is refused. */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    int pg_src = pageable(src), pg_dst = pageable(dst);
    if (s && s->cap && (pg_dst || pg_src)) {
        dbl_rule("cudaMemcpyAsync with pageable host memory during capture");
        s->cap->invalidated = 1;
        return fail(cudaErrorStreamCaptureUnsupported);
    }
    if (s && !s->cap && pg_dst) {
        int e = drain(s);
        if (e)
            return fail((cudaError_t)e);
        memmove(dst, src, count);
        return cudaSuccess;
    }
    copy_args c = {dst, src, count, 0, NULL};
    if (s && !s->cap && pg_src) {
        c.staged = malloc(count ? count : 1);
        if (!c.staged)
            return fail(cudaErrorMemoryAllocation);
        memcpy(c.staged, src, count);
        c.src = c.staged;
    }
    int e = dbl_enqueue(s, "memcpy", run_copy, &c, sizeof c, NULL);
    if (e) {
        free(c.staged);
        return fail((cudaError_t)e);
    }
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t count, cudaStream_t s)
{
    copy_args c = {dst, NULL, count, value, NULL};
    return (cudaError_t)dbl_enqueue(s, "memset", run_copy, &c, sizeof c, NULL);
}

/* The legacy stream: after the blocking streams' work, not the
 * non-blocking ones' (the backend's streams are non-blocking). */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind)
{
    (void)kind;
    if (dbl_refuse_in_capture("cudaMemcpy"))
        return fail(cudaErrorStreamCaptureUnsupported);
    each_stream(drain, 1);
    memmove(dst, src, count);
    return cudaSuccess;
}

cudaError_t cudaMemset(void *dst, int value, size_t count)
{
    if (dbl_refuse_in_capture("cudaMemset"))
        return fail(cudaErrorStreamCaptureUnsupported);
    each_stream(drain, 1);
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
    ev->pos = 0;
    if (s && !s->cap) {
        pthread_mutex_lock(&s->qmu);
        ev->pos = s->enqueued;
        pthread_mutex_unlock(&s->qmu);
    }
    ev->recorded = 1;
    return cudaSuccess;
}

typedef struct {
    struct CUstream_st *src;
    long pos;
    struct CUevent_st *external; /* an external wait node: the event as it stands when the node runs */
} wait_args;

static int run_wait(const void *p)
{
    const wait_args *w = p;
    struct CUstream_st *src = w->src;
    long pos = w->pos;
    if (w->external) {
        src = w->external->cap ? NULL : w->external->src;
        pos = w->external->pos;
    }
    if (src)
        wait_done(src, pos);
    return 0;
}

/* Waiting on an event of a capture pulls the stream into it (a fork); the
 * origin waiting on a forked stream's event joins what it had recorded.
 * Outside a capture the wait is an operation of the stream: its later work
 * runs once the event's stream has run up to the event. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t ev, unsigned int flags)
{
    if (!ev || ev->magic != EVENT_MAGIC || (s && s->magic != STREAM_MAGIC))
        return fail(cudaErrorInvalidResourceHandle);
    if (s && s->cap && !ev->cap) { /* an event from outside this capture */
        if (!ev->recorded || !ev->src)
            return cudaSuccess;
        if (!(flags & cudaEventWaitExternal)) {
            dbl_rule("cudaStreamWaitEvent from a capturing stream on an event recorded outside the capture, "
                     "without cudaEventWaitExternal: CUDA refuses it (cudaErrorStreamCaptureIsolation) and "
                     "invalidates the capture");
            s->cap->invalidated = 1;
            return fail(cudaErrorStreamCaptureIsolation);
        }
        wait_args w = {NULL, 0, ev};
        return (cudaError_t)dbl_enqueue(s, "external event wait", run_wait, &w, sizeof w, NULL);
    }
    if (!ev->cap) {
        if (!s || !ev->recorded || !ev->src || ev->src == s)
            return cudaSuccess; /* same stream: already ordered */
        wait_args w = {ev->src, ev->pos, NULL};
        return (cudaError_t)dbl_enqueue(s, "event wait", run_wait, &w, sizeof w, NULL);
    }
    if (!s)
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

/* ------------------------------------------------------- user objects */

/* Released user objects whose destructors have not run yet, run by one
 * thread, each TP_DOUBLE_DTOR_MS after its release. */
static pthread_mutex_t dmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t dcv = PTHREAD_COND_INITIALIZER;
static uobj *dtor_head, *dtor_tail;
static int dtor_running;
static pthread_once_t dtor_once = PTHREAD_ONCE_INIT;

static void *dtor_main(void *p)
{
    (void)p;
    pthread_mutex_lock(&dmu);
    for (;;) {
        while (!dtor_head)
            pthread_cond_wait(&dcv, &dmu);
        uobj *u = dtor_head;
        int64_t now = now_ms();
        if (now < u->due_ms) {
            pthread_mutex_unlock(&dmu);
            usleep((useconds_t)(u->due_ms - now) * 1000);
            pthread_mutex_lock(&dmu);
            continue;
        }
        dtor_head = u->next;
        if (!dtor_head)
            dtor_tail = NULL;
        dtor_running = 1;
        pthread_mutex_unlock(&dmu);
        dbl_comm_ref(u->comm, -1); /* NCCL's persistentDestructor */
        free(u);
        pthread_mutex_lock(&dmu);
        dtor_running = 0;
        pthread_cond_broadcast(&dcv);
    }
    return NULL;
}

static void dtor_start(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, dtor_main, NULL) == 0)
        pthread_detach(t);
}

static void uobj_release(uobj *u)
{
    if (atomic_fetch_sub(&u->refs, 1) != 1)
        return;
    pthread_once(&dtor_once, dtor_start);
    pthread_mutex_lock(&dmu);
    u->due_ms = now_ms() + dbl_env_int("TP_DOUBLE_DTOR_MS", 5);
    u->next = NULL;
    if (dtor_tail)
        dtor_tail->next = u;
    else
        dtor_head = u;
    dtor_tail = u;
    pthread_cond_broadcast(&dcv);
    pthread_mutex_unlock(&dmu);
}

int dbl_destructors_pending(void)
{
    int n = 0;
    pthread_mutex_lock(&dmu);
    for (uobj *u = dtor_head; u; u = u->next)
        n++;
    n += dtor_running;
    pthread_mutex_unlock(&dmu);
    return n;
}

int dbl_destructors_wait(void)
{
    int64_t limit = now_ms() + dbl_env_int("TP_DOUBLE_HANG_MS", 20000);
    while (dbl_destructors_pending() > 0) {
        if (now_ms() > limit)
            return -1;
        usleep(500);
    }
    return 0;
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

cudaError_t cudaStreamIsCapturing(cudaStream_t s, enum cudaStreamCaptureStatus *status)
{
    if (s && s->magic != STREAM_MAGIC)
        return fail(cudaErrorInvalidResourceHandle);
    *status = !s || !s->cap         ? cudaStreamCaptureStatusNone
              : s->cap->invalidated ? cudaStreamCaptureStatusInvalidated
                                    : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

static void graph_free(struct CUgraph_st *g)
{
    for (int i = 0; i < g->n_comms; i++)
        if (g->uo[i])
            uobj_release(g->uo[i]);
    g->magic = 0;
    free_ops(g->ops, g->n);
    free(g);
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
    for (int i = 0; i < g->n_comms; i++) { /* NCCL's user object per communicator it captured on */
        uobj *u = calloc(1, sizeof *u);
        if (!u) {
            graph_free(g);
            return fail(cudaErrorMemoryAllocation);
        }
        u->comm = g->comms[i];
        atomic_init(&u->refs, 1);
        dbl_comm_ref(u->comm, 1);
        g->uo[i] = u;
    }
    *out = g;
    return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t g)
{
    if (!g || g->magic != GRAPH_MAGIC)
        return fail(cudaErrorInvalidValue);
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
    for (int i = 0; i < g->n_comms; i++) { /* an exec retains its graph's user objects */
        x->uo[i] = g->uo[i];
        atomic_fetch_add(&x->uo[i]->refs, 1);
    }
    x->n_uo = g->n_comms;
    *out = x;
    return cudaSuccess;
}

static void exec_free(struct CUgraphExec_st *x)
{
    for (int i = 0; i < x->n_uo; i++)
        uobj_release(x->uo[i]);
    x->magic = 0;
    free_ops(x->ops, x->n);
    free(x);
}

/* CUDA defers the destruction of an exec still running until it is done. */
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x)
{
    if (!x || x->magic != EXEC_MAGIC)
        return fail(cudaErrorInvalidValue);
    pthread_mutex_lock(&xmu);
    x->magic = 0;
    x->destroyed = 1;
    int now = x->inflight == 0;
    pthread_mutex_unlock(&xmu);
    if (now)
        exec_free(x);
    return cudaSuccess;
}

/* A launch on its stream: the recorded operations in order; an NCCL one
 * that fails leaves its error with the communicator (the async error), as
 * a kernel would. */
static int run_graph(const void *p)
{
    struct CUgraphExec_st *x = *(struct CUgraphExec_st *const *)p;
    int e = 0;
    for (int i = 0; i < x->n; i++) {
        int r = x->ops[i].run(x->ops[i].args);
        if (r && !e)
            e = r;
    }
    pthread_mutex_lock(&xmu);
    int last = --x->inflight == 0 && x->destroyed;
    pthread_mutex_unlock(&xmu);
    if (last)
        exec_free(x);
    return e;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t s)
{
    if (!x || x->magic != EXEC_MAGIC) {
        dbl_rule("cudaGraphLaunch of %p, which is not an instantiated graph (cudaGraphExec_t)", (void *)x);
        return fail(cudaErrorInvalidValue);
    }
    if (dbl_refuse_in_capture("cudaGraphLaunch"))
        return fail(cudaErrorStreamCaptureUnsupported);
    if (dbl_before_graph_launch)
        dbl_before_graph_launch();
    if (dbl_inject(DBL_FAIL_DIE)) {
        fprintf(stderr, "cuda double: rank %d dies at a graph launch (TP_DOUBLE_FAIL)\n", dbl_process_rank());
        _exit(9);
    }
    if (dbl_inject(DBL_FAIL_REPLAY))
        return fail(cudaErrorLaunchFailure);
    atomic_fetch_add(&graph_launches, 1);
    pthread_mutex_lock(&xmu);
    x->inflight++;
    pthread_mutex_unlock(&xmu);
    int e = dbl_enqueue(s, "graph", run_graph, &x, sizeof x, NULL);
    if (e) {
        pthread_mutex_lock(&xmu);
        x->inflight--;
        pthread_mutex_unlock(&xmu);
        return fail((cudaError_t)e);
    }
    return cudaSuccess;
}
