/* nccl_double.c — the NCCL calls of the cuda backend, across processes.
 *
 * A communicator is one POSIX shared memory segment named in the unique
 * id, with two channels: the device one, for the collectives and p2p work
 * streams run (the kernels' connections), and the host one, for the calls
 * that are collective on the host (window registration, the
 * symmetric-memory probe: NCCL's bootstrap). Every exchange on a channel
 * is one round: each rank waits until every peer has finished the
 * previous one, writes its signature and its bytes into its slot, waits
 * for every peer's, checks that all signatures agree (the same call in the
 * same order) and computes its result. Payloads beyond SLOT bytes are not
 * exchanged (the rest of the output keeps this rank's input: values are
 * not what the double checks). A wait ends when every peer arrived, when
 * the communicator's abort flag is set (a revoke in progress), or after
 * TP_DOUBLE_HANG_MS as a reported hang.
 *
 * Revoke follows NCCL 2.28.9 (init.cc ncclCommRevoke, commRevokeAsync):
 * the abort flag is set, the call waits for the eager work enqueued before
 * it and for every NCCL wait in progress to end, then the flag is cleared
 * again. New calls are refused (enqueue.cc ncclEnqueueCheck), but work of
 * a captured graph that starts later runs with the flag clear, and waits
 * for its peers as any other. */
#include <fcntl.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <cuda_runtime_api.h>

#include "cuda/tp_cuda_ops.h"
#include "cuda_double.h"

#define MAX_RANKS 8
#define SLOT (1u << 20)
#define WIN_MAGIC 0x3171u

typedef struct {
    uint64_t seq;
    char what[24];
    uint64_t count;
    int dtype, op, root;
} coll_sig;

typedef struct {
    _Atomic uint64_t arrive[MAX_RANKS], depart[MAX_RANKS];
    coll_sig sig[MAX_RANKS];
    char data[MAX_RANKS][SLOT];
} chan_shared;

enum { CHAN_HOST, CHAN_DEVICE, CHANS };

typedef struct {
    atomic_int joined;
    atomic_int device[MAX_RANKS]; /* device + 1 */
    chan_shared chan[CHANS];
} comm_shared;

struct ncclWindow_vidmem {
    unsigned magic;
    int symmetric; /* 0: a local registration handle, as NCCL 2.28 returns without symmetric memory */
    void *local;
    size_t bytes;
    void *base[MAX_RANKS]; /* every rank's segment mapped here (symmetric) */
    size_t peer_bytes[MAX_RANKS];
    struct ncclWindow_vidmem *next;
};

struct ncclComm {
    comm_shared *sh;
    int rank, world, symmetric;
    _Atomic uint64_t seq[CHANS];
    atomic_int revoked, refs, ended; /* ended: destroyed or aborted, freed with the last reference */
    atomic_int abort_flag;           /* set by a revoke in progress: every NCCL wait ends */
    atomic_int running;              /* exchanges in progress (any thread) */
    atomic_int eager;                /* uncaptured work enqueued, not finished */
    atomic_int freed_reported;       /* freed under a graph: reported once */
    _Atomic ncclResult_t async;
    char last[256];
    struct ncclWindow_vidmem *windows; /* registered, not yet deregistered */
};

static void comm_free(ncclComm_t c);
static void unmap_peers(ncclComm_t c, struct ncclWindow_vidmem *w);

/* A graph's user object made (+1) or its destructor run (-1). A
 * destructor that runs after NCCL freed the communicator (a revoked one:
 * ncclCommAbort did not wait for it) touches freed memory on a GPU. */
void dbl_comm_ref(dbl_comm *c, int delta)
{
    if (delta < 0 && atomic_load(&c->ended) && atomic_load(&c->revoked) && !atomic_exchange(&c->freed_reported, 1))
        dbl_rule("a CUDA graph's user-object destructor for NCCL work on rank %d's communicator ran after "
                 "ncclCommAbort/Destroy freed it (after a revoke NCCL does not wait for graphs, init.cc "
                 "finalizeCalled; the destructor is cudaUserObjectNoDestructorSync, enqueue.cc "
                 "persistentDestructor): use after free",
                 c->rank);
    if (atomic_fetch_add(&c->refs, delta) + delta == 0 && atomic_load(&c->ended))
        comm_free(c);
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t now_ms(void) { return now_ns() / 1000000; }

/* ---------------------------------------------- shared segment names
 *
 * Every segment name is unlinked as soon as nobody needs to open it any
 * more, so a process that dies (TP_DOUBLE_FAIL=die) leaves nothing in
 * /dev/shm: a communicator's when every rank joined (or at exit of the
 * process that made the id), a memory segment once every peer has mapped
 * it (registered in a window: at this rank's next exchange, when every
 * peer has finished the registration), or when freed. */

#define SEG_NAME 64
typedef struct name_node {
    char name[SEG_NAME];
    struct name_node *next;
} name_node;
static name_node *to_unlink;
static pthread_mutex_t names_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t names_once = PTHREAD_ONCE_INIT;

static void unlink_all(void)
{
    pthread_mutex_lock(&names_mu);
    while (to_unlink) {
        name_node *n = to_unlink;
        to_unlink = n->next;
        shm_unlink(n->name);
        free(n);
    }
    pthread_mutex_unlock(&names_mu);
}

static void at_exit_unlink(void) { atexit(unlink_all); }

/* name is unlinked by the next unlink_all (or at exit). */
static void unlink_later(const char *name)
{
    pthread_once(&names_once, at_exit_unlink);
    name_node *n = calloc(1, sizeof *n);
    if (!n) {
        shm_unlink(name); /* early, but never leaked */
        return;
    }
    snprintf(n->name, sizeof n->name, "%s", name);
    pthread_mutex_lock(&names_mu);
    n->next = to_unlink;
    to_unlink = n;
    pthread_mutex_unlock(&names_mu);
}

static ncclResult_t refuse(ncclComm_t c, ncclResult_t r, const char *fmt, const char *what)
{
    if (c)
        snprintf(c->last, sizeof c->last, fmt, what);
    return r;
}

/* ------------------------------------------------------------- waits */

/* Until every rank's counter reaches seq; 1 when the abort flag is set, 2
 * on a hang. */
static int wait_all(ncclComm_t c, _Atomic uint64_t *counters, uint64_t seq, const char *what)
{
    int64_t limit = now_ms() + dbl_env_int("TP_DOUBLE_HANG_MS", 20000);
    for (;;) {
        int all = 1;
        for (int q = 0; q < c->world && all; q++)
            all = atomic_load(&counters[q]) >= seq;
        if (all)
            return 0;
        if (atomic_load(&c->abort_flag))
            return 1;
        if (now_ms() > limit) {
            dbl_rule("NCCL %s on rank %d waited %d ms for its peers and nobody revoked the communicator (a hang "
                     "on a GPU)",
                     what, c->rank, dbl_env_int("TP_DOUBLE_HANG_MS", 20000));
            return 2;
        }
        usleep(200);
    }
}

typedef void (*fill_fn)(ncclComm_t c, const void *ctx, char *slot);
typedef void (*consume_fn)(ncclComm_t c, chan_shared *ch, const void *ctx);

static int same_sig(const coll_sig *a, const coll_sig *b)
{
    return strcmp(a->what, b->what) == 0 && a->count == b->count && a->dtype == b->dtype && a->op == b->op &&
           a->root == b->root;
}

/* TP_DOUBLE_FAIL nccl_stall: this rank's part of the exchange never
 * arrives, and NCCL's host side sets the async error (what a proxy thread
 * whose connection broke does); like a kernel, the call returns only once
 * the communicator is revoked. Peers wait for it as for a real straggler. */
static ncclResult_t stall(ncclComm_t c, chan_shared *ch, const char *what)
{
    snprintf(c->last, sizeof c->last, "injected: %s stalled, its transport failed (TP_DOUBLE_FAIL)", what);
    atomic_store(&c->async, ncclSystemError);
    char stalled[64];
    snprintf(stalled, sizeof stalled, "%s (stalled, its async error set)", what);
    wait_all(c, ch->arrive, UINT64_MAX, stalled); /* no rank gets there: until revoked, or a hang */
    return ncclRemoteError;
}

/* Unlinks the queued segment names once every peer has finished this
 * rank's latest host exchange (a window registration: mapped what it had
 * to). Either channel's exchange asks. */
static void unlink_mapped(ncclComm_t c)
{
    uint64_t mine = atomic_load(&c->seq[CHAN_HOST]);
    for (int q = 0; q < c->world; q++)
        if (atomic_load(&c->sh->chan[CHAN_HOST].depart[q]) < mine)
            return;
    unlink_all();
}

static ncclResult_t exchange_on(ncclComm_t c, int chan, coll_sig sig, fill_fn fill, consume_fn consume,
                                const void *ctx)
{
    chan_shared *ch = &c->sh->chan[chan];
    if (atomic_load(&c->ended) && !atomic_exchange(&c->freed_reported, 1))
        dbl_rule("NCCL work (%s) ran on rank %d's communicator after ncclCommAbort/Destroy freed it", sig.what,
                 c->rank);
    if (atomic_load(&c->abort_flag))
        return refuse(c, ncclInvalidUsage, "%s: the communicator is being revoked", sig.what);
    if (dbl_inject(DBL_FAIL_NCCL_STALL))
        return stall(c, ch, sig.what);
    uint64_t seq = ++c->seq[chan];
    if (wait_all(c, ch->depart, seq - 1, sig.what) != 0)
        return refuse(c, ncclRemoteError, "%s: stopped waiting for the peers", sig.what);
    unlink_mapped(c);
    fill(c, ctx, ch->data[c->rank]);
    sig.seq = seq;
    ch->sig[c->rank] = sig;
    atomic_store(&ch->arrive[c->rank], seq);
    if (wait_all(c, ch->arrive, seq, sig.what) != 0)
        return refuse(c, ncclRemoteError, "%s: stopped waiting for the peers", sig.what);
    ncclResult_t r = ncclSuccess;
    for (int q = 0; q < c->world && r == ncclSuccess; q++)
        if (strcmp(sig.what, "p2p") != 0 && !same_sig(&ch->sig[q], &sig)) {
            dbl_rule("rank %d issued %s (count %llu) while rank %d issued %s (count %llu): collectives differ",
                     c->rank, sig.what, (unsigned long long)sig.count, q, ch->sig[q].what,
                     (unsigned long long)ch->sig[q].count);
            r = ncclInvalidUsage;
            atomic_store(&c->async, r);
        }
    if (r == ncclSuccess)
        consume(c, ch, ctx);
    atomic_store(&ch->depart[c->rank], seq);
    return r;
}

static atomic_int waits_now; /* every communicator's exchanges in progress */

int dbl_nccl_waits(void) { return atomic_load(&waits_now); }

/* One exchange, counted as in progress (a revoke waits for it to end). */
static ncclResult_t exchange(ncclComm_t c, int chan, coll_sig sig, fill_fn fill, consume_fn consume,
                             const void *ctx)
{
    atomic_fetch_add(&c->running, 1);
    atomic_fetch_add(&waits_now, 1);
    ncclResult_t r = exchange_on(c, chan, sig, fill, consume, ctx);
    atomic_fetch_sub(&waits_now, 1);
    atomic_fetch_sub(&c->running, 1);
    return r;
}

/* --------------------------------------------------------- collectives */

static size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
    }
}

typedef struct {
    ncclComm_t comm;
    const void *send;
    void *recv;
    size_t count; /* elements: of each rank's input (all_gather) or output (reduce_scatter) */
    ncclDataType_t type;
    ncclRedOp_t op;
    int root;
    char what[24];
} coll_args;

static size_t capped(size_t bytes) { return bytes < SLOT ? bytes : SLOT; }

static void fill_send(ncclComm_t c, const void *ctx, char *slot)
{
    const coll_args *a = ctx;
    size_t n = a->count * type_size(a->type);
    if (strcmp(a->what, "ncclReduceScatter") == 0)
        n *= (size_t)c->world;
    memcpy(slot, a->send, capped(n));
}

#define REDUCE(T)                                                                    \
    do {                                                                             \
        T *o = (T *)out;                                                             \
        for (size_t i = 0; i < n; i++) {                                             \
            T v = ((const T *)(ch->data[0] + off))[i];                               \
            for (int q = 1; q < c->world; q++) {                                     \
                T w = ((const T *)(ch->data[q] + off))[i];                           \
                v = op == ncclMax ? (w > v ? w : v) : op == ncclMin ? (w < v ? w : v) \
                    : op == ncclProd ? v * w : v + w;                                \
            }                                                                        \
            o[i] = v;                                                                \
        }                                                                            \
    } while (0)

/* out[i] = reduce over ranks of element i at byte offset off of every slot
 * (the types the backend reduces on the host side; others keep the input). */
static void reduce_into(ncclComm_t c, chan_shared *ch, void *out, size_t off, size_t n, ncclDataType_t t,
                        ncclRedOp_t op)
{
    switch (t) {
    case ncclInt64: REDUCE(int64_t); break;
    case ncclInt32: REDUCE(int32_t); break;
    case ncclFloat32: REDUCE(float); break;
    case ncclFloat64: REDUCE(double); break;
    default: memcpy(out, ch->data[c->rank] + off, n * type_size(t)); break;
    }
}

static void consume_coll(ncclComm_t c, chan_shared *ch, const void *ctx)
{
    const coll_args *a = ctx;
    size_t es = type_size(a->type), n = a->count * es, fit = capped(n) / es;
    if (strcmp(a->what, "ncclAllReduce") == 0) {
        if (a->recv != a->send)
            memmove(a->recv, a->send, n);
        reduce_into(c, ch, a->recv, 0, fit, a->type, a->op);
    } else if (strcmp(a->what, "ncclBroadcast") == 0) {
        memcpy(a->recv, ch->data[a->root], capped(n));
    } else if (strcmp(a->what, "ncclAllGather") == 0) {
        for (int q = 0; q < c->world; q++)
            memcpy((char *)a->recv + (size_t)q * n, ch->data[q], capped(n));
    } else { /* ncclReduceScatter: chunk `rank` of every rank's input */
        size_t off = (size_t)c->rank * n;
        if (off + n <= SLOT)
            reduce_into(c, ch, a->recv, off, a->count, a->type, a->op);
        else
            memmove(a->recv, (const char *)a->send + off, n);
    }
}

/* A kernel's failure is the communicator's async error (set where it
 * happens), never the stream's. */
static int run_coll(const void *p)
{
    const coll_args *a = p;
    coll_sig sig = {.count = a->count, .dtype = (int)a->type, .op = (int)a->op, .root = a->root};
    snprintf(sig.what, sizeof sig.what, "%s", a->what);
    exchange(a->comm, CHAN_DEVICE, sig, fill_send, consume_coll, a);
    return 0;
}

static int run_coll_eager(const void *p)
{
    run_coll(p);
    atomic_fetch_sub(&((const coll_args *)p)->comm->eager, 1);
    return 0;
}

/* Enqueues NCCL work on s (ncclEnqueueCheck refuses a revoked
 * communicator); eager work is counted until it has run (a revoke waits
 * for it), captured work is not (NCCL has no event for it). */
static ncclResult_t enqueue_nccl(ncclComm_t c, cudaStream_t s, const char *what, dbl_run_fn run, dbl_run_fn eager,
                                 const void *args, size_t bytes)
{
    if (atomic_load(&c->revoked))
        return refuse(c, ncclInvalidUsage, "%s: communicator was revoked", what);
    int captured = dbl_stream_capturing(s);
    if (!captured)
        atomic_fetch_add(&c->eager, 1);
    int r = dbl_enqueue(s, what, captured ? run : eager, args, bytes, c);
    if (r != 0 && !captured)
        atomic_fetch_sub(&c->eager, 1);
    return r == 0 ? ncclSuccess : ncclUnhandledCudaError;
}

static ncclResult_t enqueue_coll(coll_args a, cudaStream_t s)
{
    if (!a.comm)
        return ncclInvalidArgument;
    return enqueue_nccl(a.comm, s, a.what, run_coll, run_coll_eager, &a, sizeof a);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t s)
{
    return enqueue_coll((coll_args){comm, send, recv, count, t, op, 0, "ncclAllReduce"}, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                           cudaStream_t s)
{
    return enqueue_coll((coll_args){comm, send, recv, count, t, ncclSum, root, "ncclBroadcast"}, s);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t t, ncclComm_t comm,
                           cudaStream_t s)
{
    return enqueue_coll((coll_args){comm, send, recv, count, t, ncclSum, 0, "ncclAllGather"}, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t count, ncclDataType_t t, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t s)
{
    return enqueue_coll((coll_args){comm, send, recv, count, t, op, 0, "ncclReduceScatter"}, s);
}

/* ------------------------------------------------------ point to point */

#define MAX_P2P (2 * MAX_RANKS)
typedef struct {
    int send, peer;
    void *buf;
    size_t bytes;
} p2p_op;
typedef struct {
    ncclComm_t comm;
    int n;
    p2p_op ops[MAX_P2P];
} p2p_args;

static __thread int group_depth;
static __thread p2p_args pending;
static __thread cudaStream_t pending_stream;

static size_t section(void) { return SLOT / MAX_RANKS; }

static void fill_p2p(ncclComm_t c, const void *ctx, char *slot)
{
    (void)c;
    const p2p_args *a = ctx;
    for (int i = 0; i < a->n; i++)
        if (a->ops[i].send)
            memcpy(slot + (size_t)a->ops[i].peer * section(), a->ops[i].buf,
                   a->ops[i].bytes < section() ? a->ops[i].bytes : section());
}

static void consume_p2p(ncclComm_t c, chan_shared *ch, const void *ctx)
{
    const p2p_args *a = ctx;
    for (int i = 0; i < a->n; i++)
        if (!a->ops[i].send)
            memcpy(a->ops[i].buf, ch->data[a->ops[i].peer] + (size_t)c->rank * section(),
                   a->ops[i].bytes < section() ? a->ops[i].bytes : section());
}

static int run_p2p(const void *p)
{
    const p2p_args *a = p;
    coll_sig sig = {.count = 0};
    snprintf(sig.what, sizeof sig.what, "p2p");
    exchange(a->comm, CHAN_DEVICE, sig, fill_p2p, consume_p2p, a);
    return 0;
}

static int run_p2p_eager(const void *p)
{
    run_p2p(p);
    atomic_fetch_sub(&((const p2p_args *)p)->comm->eager, 1);
    return 0;
}

static ncclResult_t add_p2p(int send, void *buf, size_t count, ncclDataType_t t, int peer, ncclComm_t comm,
                            cudaStream_t s)
{
    if (!comm || peer < 0 || peer >= comm->world)
        return ncclInvalidArgument;
    if (group_depth == 0) {
        dbl_rule("ncclSend/ncclRecv outside ncclGroupStart/End (the backend always groups them)");
        return ncclInvalidUsage;
    }
    if (pending.n == MAX_P2P || (pending.comm && pending.comm != comm))
        return ncclInvalidUsage;
    pending.comm = comm;
    pending_stream = s;
    pending.ops[pending.n++] = (p2p_op){send, peer, buf, count * type_size(t)};
    return ncclSuccess;
}

ncclResult_t ncclSend(const void *send, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s)
{
    return add_p2p(1, (void *)send, count, t, peer, comm, s);
}

ncclResult_t ncclRecv(void *recv, size_t count, ncclDataType_t t, int peer, ncclComm_t comm, cudaStream_t s)
{
    return add_p2p(0, recv, count, t, peer, comm, s);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0)
        return ncclInvalidUsage;
    if (--group_depth > 0 || pending.n == 0)
        return ncclSuccess;
    p2p_args a = pending;
    memset(&pending, 0, sizeof pending);
    return enqueue_nccl(a.comm, pending_stream, "p2p", run_p2p, run_p2p_eager, &a, sizeof a);
}

/* ------------------------------------------------------- communicators */

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static atomic_int counter;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "/tpdbl-%d-%d-%lld", (int)getpid(), atomic_fetch_add(&counter, 1),
             (long long)now_ns());
    int fd = shm_open(id->internal, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return ncclSystemError;
    int ok = ftruncate(fd, sizeof(comm_shared)) == 0;
    close(fd);
    if (!ok) {
        shm_unlink(id->internal);
        return ncclSystemError;
    }
    unlink_later(id->internal); /* if no rank 0 joins to unlink it */
    return ncclSuccess;
}

static atomic_int live_windows; /* registered, not yet deregistered or ended with their comm */

int dbl_nccl_windows(void) { return atomic_load(&live_windows); }

static void comm_free(ncclComm_t c)
{
    while (c->windows) {
        struct ncclWindow_vidmem *w = c->windows;
        c->windows = w->next;
        unmap_peers(c, w);
        free(w);
        atomic_fetch_sub(&live_windows, 1);
    }
    if (c->sh)
        munmap(c->sh, sizeof *c->sh);
    free(c);
}

/* Joins like NCCL's bootstrap: blocks until every rank arrived (nothing can
 * interrupt it), then refuses two ranks on one device on every rank. */
ncclResult_t ncclCommInitRank(ncclComm_t *out, int nranks, ncclUniqueId id, int rank)
{
    if (dbl_refuse_in_capture("ncclCommInitRank"))
        return ncclInvalidUsage;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    ncclComm_t c = calloc(1, sizeof *c);
    if (!c)
        return ncclSystemError;
    c->rank = rank;
    c->world = nranks;
    c->symmetric = nranks > 1 && dbl_env_int("TP_DOUBLE_SYMMETRIC", 1) != 0;
    int fd = shm_open(id.internal, O_RDWR, 0600);
    void *m = fd >= 0 ? mmap(NULL, sizeof(comm_shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    if (fd >= 0)
        close(fd);
    if (m == MAP_FAILED) {
        free(c);
        return ncclSystemError;
    }
    c->sh = m;
    int dev = 0;
    cudaGetDevice(&dev);
    atomic_store(&c->sh->device[rank], dev + 1);
    atomic_fetch_add(&c->sh->joined, 1);
    int64_t limit = now_ms() + dbl_env_int("TP_DOUBLE_HANG_MS", 20000);
    while (atomic_load(&c->sh->joined) < nranks && now_ms() < limit)
        usleep(200);
    if (atomic_load(&c->sh->joined) < nranks) {
        dbl_rule("ncclCommInitRank on rank %d: a peer never joined (a hang on a GPU)", rank);
        comm_free(c);
        return ncclSystemError;
    }
    if (rank == 0)
        shm_unlink(id.internal);
    for (int q = 0; q < nranks; q++)
        if (q != rank && atomic_load(&c->sh->device[q]) == dev + 1) {
            fprintf(stderr, "cuda double: ncclCommInitRank: ranks %d and %d are both on device %d (refused)\n", rank,
                    q, dev);
            comm_free(c);
            return ncclInvalidUsage;
        }
    if (dbl_inject(DBL_FAIL_COMM_INIT)) {
        comm_free(c);
        return ncclSystemError;
    }
    *out = c;
    return ncclSuccess;
}

/* Until no eager work and no wait is in progress on c (kicking this
 * process's streams so queued work runs); 0 when it got there. */
static int quiesce(ncclComm_t c, const char *what)
{
    int64_t limit = now_ms() + dbl_env_int("TP_DOUBLE_HANG_MS", 20000);
    while (atomic_load(&c->eager) > 0 || atomic_load(&c->running) > 0) {
        dbl_kick_all();
        if (now_ms() > limit) {
            dbl_rule("%s on rank %d: NCCL work never finished (%d eager, %d waiting): a hang on a GPU", what,
                     c->rank, atomic_load(&c->eager), atomic_load(&c->running));
            return -1;
        }
        usleep(200);
    }
    return 0;
}

/* NCCL 2.28 (init.cc commReclaim / commDestroySync): a healthy
 * communicator waits for its eager work and until every graph holding NCCL
 * work on it is destroyed and its destructor ran (a graph still alive:
 * forever); a revoked one (finalizeCalled) waits for nothing and is freed,
 * whatever graph or pending destructor still points at it. */
static ncclResult_t comm_end(ncclComm_t c, const char *call)
{
    if (!c)
        return ncclSuccess;
    if (dbl_refuse_in_capture(call))
        return ncclInvalidUsage;
    if (atomic_load(&c->ended))
        return ncclInvalidArgument;
    int revoked = atomic_load(&c->revoked);
    if (!revoked) {
        quiesce(c, call);
        if (atomic_load(&c->refs) > 0)
            dbl_destructors_wait();
    }
    int refs = atomic_load(&c->refs);
    if (refs > 0 && !revoked)
        dbl_rule("%s on rank %d while %d CUDA graph(s) that captured NCCL work on it are alive: NCCL 2.28 waits "
                 "for them to be destroyed (init.cc, localPersistentRefs) and would hang here",
                 call, c->rank, refs);
    if (refs > 0 && revoked && !atomic_exchange(&c->freed_reported, 1))
        dbl_rule("%s on rank %d frees a revoked communicator while %d CUDA graph(s) that captured NCCL work on it "
                 "are alive or their user-object destructors have not run (NCCL does not wait after a revoke, "
                 "init.cc finalizeCalled; the destructors run later, cudaUserObjectNoDestructorSync): they would "
                 "touch freed memory",
                 call, c->rank, refs);
    atomic_store(&c->ended, 1);
    if (refs == 0) /* else the last destructor frees it (kept here, reported above) */
        comm_free(c);
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) { return comm_end(c, "ncclCommDestroy"); }
ncclResult_t ncclCommAbort(ncclComm_t c) { return comm_end(c, "ncclCommAbort"); }

/* NCCL 2.28.9: abort flags set, the eager work and the waits in progress
 * end (they see the flag), the flags cleared again; revoked for good
 * (later calls refused), destroy/abort no longer wait for graphs. */
ncclResult_t ncclCommRevoke(ncclComm_t c, int flags)
{
    if (!c)
        return ncclSuccess;
    if (flags != NCCL_REVOKE_DEFAULT || atomic_load(&c->ended) || atomic_exchange(&c->revoked, 1))
        return ncclInvalidArgument;
    atomic_store(&c->abort_flag, 1);
    quiesce(c, "ncclCommRevoke");
    atomic_store(&c->abort_flag, 0);
    return ncclSuccess;
}

/* Whether the calling thread is the rank group's watchdog (engine/
 * rank_group.c names it): its looks come at timed ticks, so counting them
 * would make the nth look of TP_DOUBLE_FAIL nccl_async depend on timing. */
static int watchdog_thread(void)
{
    char name[16] = "";
    return pthread_getname_np(pthread_self(), name, sizeof name) == 0 && strcmp(name, "rank watchdog") == 0;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *out)
{
    if (!c)
        return ncclInvalidArgument;
    if (!watchdog_thread() && dbl_inject(DBL_FAIL_NCCL_ASYNC)) {
        atomic_store(&c->async, ncclRemoteError);
        snprintf(c->last, sizeof c->last, "injected: a remote peer reported an error (TP_DOUBLE_FAIL)");
    }
    *out = atomic_load(&c->async);
    return ncclSuccess;
}

const char *ncclGetLastError(ncclComm_t c) { return c ? c->last : ""; }

const char *ncclGetErrorString(ncclResult_t r)
{
    static const char *const names[] = {"no error", "unhandled cuda error", "unhandled system error",
                                        "internal error", "invalid argument", "invalid usage", "remote error",
                                        "operation in progress"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "unknown result code";
}

/* ncclMemAlloc memory is one shared segment per allocation, so that a
 * window's peers can map it for real: copy-engine pulls from a peer's
 * buffer then move real bytes, as over NVLink. */
typedef struct segment {
    char name[SEG_NAME];
    void *p;
    size_t bytes;
    int queued; /* registered in a window: the name is unlinked once every peer mapped it */
    struct segment *next;
} segment;
static segment *segments;
static pthread_mutex_t seg_mu = PTHREAD_MUTEX_INITIALIZER;

static void *map_segment(const char *name, size_t bytes, int create)
{
    int fd = shm_open(name, O_RDWR | (create ? O_CREAT | O_EXCL : 0), 0600);
    if (fd < 0)
        return NULL;
    void *m = (!create || ftruncate(fd, (off_t)bytes) == 0)
                  ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    return m == MAP_FAILED ? NULL : m;
}

ncclResult_t ncclMemAlloc(void **p, size_t size)
{
    static atomic_int counter;
    segment *s = calloc(1, sizeof *s);
    if (!s)
        return ncclSystemError;
    s->bytes = size ? size : 1;
    snprintf(s->name, sizeof s->name, "/tpdbl-m-%d-%d-%lld", (int)getpid(), atomic_fetch_add(&counter, 1),
             (long long)now_ns());
    s->p = map_segment(s->name, s->bytes, 1);
    int e = s->p ? dbl_track_shared(s->p, s->bytes, 0) : cudaErrorMemoryAllocation;
    if (e != 0) {
        if (s->p) {
            munmap(s->p, s->bytes);
            shm_unlink(s->name);
        }
        free(s);
        return e == cudaErrorStreamCaptureUnsupported ? ncclInvalidUsage : ncclUnhandledCudaError;
    }
    memset(s->p, 0xa5, s->bytes);
    pthread_mutex_lock(&seg_mu);
    s->next = segments;
    segments = s;
    pthread_mutex_unlock(&seg_mu);
    *p = s->p;
    return ncclSuccess;
}

int dbl_nccl_allocations(void)
{
    int n = 0;
    pthread_mutex_lock(&seg_mu);
    for (segment *s = segments; s; s = s->next)
        n++;
    pthread_mutex_unlock(&seg_mu);
    return n;
}

static segment *find_segment(const void *p)
{
    pthread_mutex_lock(&seg_mu);
    segment *s = segments;
    while (s && s->p != p)
        s = s->next;
    pthread_mutex_unlock(&seg_mu);
    return s;
}

ncclResult_t ncclMemFree(void *p)
{
    if (dbl_refuse_in_capture("ncclMemFree"))
        return ncclInvalidUsage;
    pthread_mutex_lock(&seg_mu);
    segment **at = &segments;
    while (*at && (*at)->p != p)
        at = &(*at)->next;
    segment *s = *at;
    if (s)
        *at = s->next;
    pthread_mutex_unlock(&seg_mu);
    if (!s) {
        dbl_rule("ncclMemFree(%p): not an ncclMemAlloc allocation", p);
        return ncclInvalidArgument;
    }
    dbl_drain_all(); /* no stream work may still use it */
    dbl_untrack_shared(s->p);
    munmap(s->p, s->bytes);
    if (!s->queued) /* else its name goes (went) with unlink_all */
        shm_unlink(s->name);
    free(s);
    return ncclSuccess;
}

/* ------------------------------------------------------------ windows */

static void fill_ptr(ncclComm_t c, const void *ctx, char *slot)
{
    (void)c;
    memcpy(slot, ctx, sizeof(void *));
}

typedef struct {
    struct ncclWindow_vidmem *w;
    char name[SEG_NAME];
    size_t bytes;
} window_ctx;

static void fill_window(ncclComm_t c, const void *ctx, char *slot)
{
    (void)c;
    memcpy(slot, ctx, sizeof(window_ctx));
}

/* Maps every peer's segment here (symmetric communicators only: without
 * symmetric memory a window is just a local registration). */
static void consume_window(ncclComm_t c, chan_shared *ch, const void *ctx)
{
    const window_ctx *mine = ctx;
    struct ncclWindow_vidmem *w = mine->w;
    w->bytes = mine->bytes;
    for (int q = 0; q < c->world; q++) {
        if (q == c->rank || !w->symmetric) {
            w->base[q] = q == c->rank ? w->local : NULL;
            continue;
        }
        window_ctx peer;
        memcpy(&peer, ch->data[q], sizeof peer);
        w->base[q] = map_segment(peer.name, peer.bytes, 0);
        if (w->base[q] && dbl_track_shared(w->base[q], peer.bytes, 1) != 0) {
            munmap(w->base[q], peer.bytes);
            w->base[q] = NULL;
        }
        w->peer_bytes[q] = peer.bytes;
    }
}

static void unmap_peers(ncclComm_t c, struct ncclWindow_vidmem *w)
{
    for (int q = 0; q < c->world; q++)
        if (q != c->rank && w->base[q]) {
            dbl_untrack_shared(w->base[q]);
            munmap(w->base[q], w->peer_bytes[q]);
            w->base[q] = NULL;
        }
}

static void consume_nothing(ncclComm_t c, chan_shared *ch, const void *ctx)
{
    (void)c;
    (void)ch;
    (void)ctx;
}

ncclResult_t ncclCommWindowRegister(ncclComm_t c, void *buff, size_t size, ncclWindow_t *win, int flags)
{
    (void)flags;
    *win = NULL;
    if (!c || !buff || !size)
        return ncclInvalidArgument;
    if (dbl_refuse_in_capture("ncclCommWindowRegister"))
        return ncclInvalidUsage;
    if (dbl_inject(DBL_FAIL_WINDOW))
        return refuse(c, ncclSystemError, "%s: injected failure (TP_DOUBLE_FAIL)", "ncclCommWindowRegister");
    segment *seg = find_segment(buff);
    if (c->symmetric && (!seg || seg->bytes < size)) {
        dbl_rule("ncclCommWindowRegister(%p, %zu): a symmetric window needs ncclMemAlloc memory", buff, size);
        return ncclInvalidArgument;
    }
    struct ncclWindow_vidmem *w = calloc(1, sizeof *w);
    if (!w)
        return ncclSystemError;
    w->magic = WIN_MAGIC;
    w->symmetric = c->symmetric;
    w->local = buff;
    window_ctx ctx = {.w = w, .bytes = size};
    if (seg)
        snprintf(ctx.name, sizeof ctx.name, "%s", seg->name);
    coll_sig sig = {.count = size};
    snprintf(sig.what, sizeof sig.what, "window_register");
    ncclResult_t r = exchange(c, CHAN_HOST, sig, fill_window, consume_window, &ctx);
    if (r != ncclSuccess) {
        unmap_peers(c, w);
        free(w);
        return r;
    }
    if (seg && !seg->queued) {
        seg->queued = 1;
        unlink_later(seg->name);
    }
    w->next = c->windows;
    c->windows = w;
    atomic_fetch_add(&live_windows, 1);
    *win = w;
    return ncclSuccess;
}

ncclResult_t ncclCommWindowDeregister(ncclComm_t c, ncclWindow_t w)
{
    if (!c || !w || w->magic != WIN_MAGIC)
        return ncclInvalidArgument;
    if (dbl_refuse_in_capture("ncclCommWindowDeregister"))
        return ncclInvalidUsage;
    coll_sig sig = {.count = 0};
    snprintf(sig.what, sizeof sig.what, "window_deregister");
    void *none = NULL;
    ncclResult_t r = exchange(c, CHAN_HOST, sig, fill_ptr, consume_nothing, &none);
    for (struct ncclWindow_vidmem **p = &c->windows; *p; p = &(*p)->next)
        if (*p == w) {
            *p = w->next;
            unmap_peers(c, w);
            w->magic = 0;
            free(w);
            atomic_fetch_sub(&live_windows, 1);
            break;
        }
    return r;
}

/* ------------------------------------- launchers that read NCCL state */

int tp_cuda_nccl_lsa_size(void *comm) { return comm ? ((ncclComm_t)comm)->world : 0; }

int tp_cuda_nccl_symmetric_support(void *comm)
{
    ncclComm_t c = comm;
    coll_sig sig = {.count = 0};
    snprintf(sig.what, sizeof sig.what, "devcomm_create");
    void *none = NULL;
    ncclResult_t r = exchange(c, CHAN_HOST, sig, fill_ptr, consume_nothing, &none);
    if (r != ncclSuccess)
        return -(int)r;
    /* TP_DOUBLE_FAIL devcomm: ncclDevCommCreate fails with another error
     * than ncclInvalidUsage (across nodes NCCL activates GIN in it) */
    if (dbl_inject(DBL_FAIL_DEVCOMM)) {
        snprintf(c->last, sizeof c->last, "injected: ncclDevCommCreate failed (TP_DOUBLE_FAIL)");
        return -(int)ncclSystemError;
    }
    return c->symmetric;
}

typedef struct {
    struct ncclWindow_vidmem *w;
    int world;
    void **out;
} bases_args;

static int run_bases(const void *p)
{
    const bases_args *a = p;
    dbl_count_launch();
    if (!a->w->symmetric) {
        dbl_rule("tp_cuda_window_peer_bases on a window of a communicator without symmetric memory: NCCL 2.28 "
                 "returned a local registration handle, and the kernel would dereference a host structure");
        return cudaErrorIllegalAddress;
    }
    memcpy(a->out, a->w->base, sizeof(void *) * (size_t)a->world);
    return 0;
}

int tp_cuda_window_peer_bases(void *win, int world, void **out_dev, void *stream)
{
    struct ncclWindow_vidmem *w = win;
    if (!w || w->magic != WIN_MAGIC || world > MAX_RANKS)
        return cudaErrorInvalidValue;
    bases_args a = {w, world, out_dev};
    return dbl_enqueue(stream, "window_peer_bases", run_bases, &a, sizeof a, NULL);
}
