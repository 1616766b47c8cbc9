/* cpu_backend.c — the reference backend.
 *
 * Capture records each run_op/collective as a command with every tensor
 * (pointers, shapes, strides) and attrs copied in; replay walks that array
 * and calls the kernels directly — no graph, no lookups, no allocation
 * that outlives a kernel — which is exactly the pointer-stability
 * discipline a CUDA graph imposes. (Some kernels take temporaries for the
 * call and free them before returning: the fused kernels' gathered input
 * or reduce-scatter slots, FP16/BF16 operands converted for sgemm; like a
 * CUDA kernel's scratch, no recorded pointer ever refers to them.)
 *
 * Two shapes: ranks are threads of this process (memory is malloc'd), or
 * ranks live in several processes that map one shared memory (tp_cpu_shared):
 * this process then runs ranks [rank_lo, rank_hi), allocates each one's
 * memory from that rank's heap region of the mapping (so peers in other
 * processes can read it), and its collectives attach to the shared comm
 * area. Captures and the allocation registry stay per process: they hold
 * this process's pointers. */
#include "cpu_backend.h"

#include <cblas.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "blas_pick.h"
#include "collectives.h"
#include "cpu_ops.h"
#include "cpu_pool.h"
#include "fused.h"
#include "grow.h"
#include "heap.h"
#include "huge_pages.h"
#include "packed_gemm.h"
#include "small_gemm.h"
#include "spin_wait.h"
#include "weight_packs.h"

typedef struct {
    tp_op op;
    int collective;
    tp_attrs attrs;
    int n_ins;
    tp_tensor *ins;
    tp_tensor out;
} cpu_cmd;

struct tp_capture {
    int rank;
    int n, cap;
    cpu_cmd *cmds;
};

typedef struct {
    char *base;
    size_t bytes;
} cpu_alloc_rec;

/* Every live allocation, so a capture can prove it only references memory
 * that existed before it began (the CUDA graph rule) and a replay can prove
 * none of it was freed since. */
typedef struct {
    pthread_mutex_t mu;
    cpu_alloc_rec *rec;
    int n, cap;
} cpu_registry;

typedef struct {
    cpu_comm *comm;
    tp_capture **capturing; /* per rank: the record in progress, or NULL */
    cpu_registry reg;
    cpu_pool **pool;        /* [rank - rank_lo]: the threads that rank's attention runs on */
    int verify_replay;      /* setting verify_replay: check every replay */
    /* shared mode only (heap == NULL for threads) */
    int rank_lo, rank_hi;   /* the ranks this process runs */
    cpu_heap **heap;        /* [rank - rank_lo]: that rank's region of the mapping */
    pthread_mutex_t heap_mu;
} cpu_ctx;

static cpu_ctx *ctx_of(tp_backend *b) { return b->ctx; }

/* A local rank's pool; NULL (the caller's thread alone) for another. */
static cpu_pool *pool_of(const cpu_ctx *x, int rank)
{
    return x->pool && rank >= x->rank_lo && rank < x->rank_hi ? x->pool[rank - x->rank_lo] : NULL;
}

static void cpu_capture_free(tp_backend *b, tp_capture *c);

static int registry_add(cpu_registry *r, void *p, size_t bytes)
{
    pthread_mutex_lock(&r->mu);
    if (TP_GROW(r->rec, r->cap, r->n, 64) != 0) {
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    r->rec[r->n++] = (cpu_alloc_rec){p, bytes};
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void registry_remove(cpu_registry *r, void *p)
{
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n; i++)
        if (r->rec[i].base == p) {
            r->rec[i] = r->rec[--r->n];
            break;
        }
    pthread_mutex_unlock(&r->mu);
}

/* Whether every byte t can touch lies in one live allocation. */
static int registry_covers(cpu_registry *r, const tp_tensor *t)
{
    int64_t lo = 0, hi = 0, es = (int64_t)tp_dtype_size(t->dtype);
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return 1;
        int64_t span = (t->shape[d] - 1) * t->stride[d];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    char *first = (char *)t->data + lo * es, *last = (char *)t->data + hi * es + es;
    int ok = 0;
    pthread_mutex_lock(&r->mu);
    for (int i = 0; i < r->n && !ok; i++)
        ok = first >= r->rec[i].base && last <= r->rec[i].base + r->rec[i].bytes;
    pthread_mutex_unlock(&r->mu);
    return ok;
}

/* Shared mode: a rank this process does not run has no heap here. */
static tp_status check_local(const cpu_ctx *x, int rank, tp_err *err)
{
    if (x->heap && (rank < x->rank_lo || rank >= x->rank_hi))
        return tp_fail(err, TP_INVALID, "rank %d is not run by this process (it runs ranks [%d, %d))", rank,
                       x->rank_lo, x->rank_hi);
    return TP_OK;
}

/* From rank's region of the shared mapping; errors name the rank. */
static tp_status heap_alloc(cpu_ctx *x, int rank, size_t bytes, void **out, tp_err *err)
{
    tp_status st = check_local(x, rank, err);
    if (st != TP_OK)
        return st;
    pthread_mutex_lock(&x->heap_mu);
    st = cpu_heap_alloc(x->heap[rank - x->rank_lo], bytes, out, err);
    pthread_mutex_unlock(&x->heap_mu);
    if (st != TP_OK)
        tp_err_prefix(err, "rank %d: shared ", rank); /* "rank r: shared heap of N bytes cannot fit M more bytes" */
    return st;
}

static void heap_free(cpu_ctx *x, int rank, void *p)
{
    if (check_local(x, rank, NULL) != TP_OK)
        return;
    pthread_mutex_lock(&x->heap_mu);
    cpu_heap_free(x->heap[rank - x->rank_lo], p, NULL); /* not its block: nothing to do */
    pthread_mutex_unlock(&x->heap_mu);
}

static tp_status cpu_alloc(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err)
{
    cpu_ctx *x = ctx_of(b);
    *out = NULL;
    if (rank < 0 || rank >= b->world)
        return tp_fail(err, TP_INVALID, "alloc: rank %d out of range for world size %d", rank, b->world);
    if (x->capturing[rank])
        return tp_fail(err, TP_INTERNAL, "rank %d: allocation of %zu bytes during capture", rank, bytes);
    if (x->heap) {
        tp_status st = heap_alloc(x, rank, bytes, out, err);
        if (st != TP_OK)
            return st;
    } else {
        size_t rounded = (bytes + 63) & ~(size_t)63;
        *out = aligned_alloc(64, rounded ? rounded : 64);
        tp_advise_huge_pages(*out, rounded); /* before the weights or arenas first touch it */
    }
    if (!*out || registry_add(&x->reg, *out, bytes) != 0) {
        if (x->heap && *out)
            heap_free(x, rank, *out);
        else
            free(*out);
        *out = NULL;
        return tp_fail(err, TP_NOMEM, "rank %d: cannot allocate %zu bytes", rank, bytes);
    }
    return TP_OK;
}

static void cpu_free(tp_backend *b, int rank, void *p)
{
    cpu_ctx *x = ctx_of(b);
    if (!p)
        return;
    registry_remove(&x->reg, p);
    weight_packs_forget(p);
    if (x->heap)
        heap_free(x, rank, p);
    else
        free(p);
}

/* An FP32 2-d weight of a matmul gets panels for packed_gemm.h
 * (weight_packs.h); other dtypes keep OpenBLAS, which they reach widened
 * to FP32 per call. */
static tp_status cpu_prepare_matmul_weight(tp_backend *b, int rank, tp_tensor *w, int transpose_b, int sole,
                                           tp_err *err)
{
    (void)b, (void)rank;
    if (w->ndim != 2)
        return TP_OK;
    int tb = transpose_b != 0;
    return weight_packs_add(w->data, w->dtype, w->shape[tb], w->shape[!tb], w->stride[tb], w->stride[!tb], sole,
                            err);
}

/* Every tensor of every command lies in memory allocated through this
 * backend and still live. */
static tp_status verify_capture(tp_backend *b, const tp_capture *c, tp_err *err)
{
    for (int i = 0; i < c->n; i++) {
        const cpu_cmd *cmd = &c->cmds[i];
        for (int k = 0; k <= cmd->n_ins; k++) {
            const tp_tensor *t = k < cmd->n_ins ? &cmd->ins[k] : &cmd->out;
            if (!registry_covers(&ctx_of(b)->reg, t))
                return tp_fail(err, TP_INTERNAL,
                               "rank %d: captured command %d (%s) %s %d references memory that is not a live "
                               "backend allocation",
                               c->rank, i, tp_op_name(cmd->op), k < cmd->n_ins ? "input" : "output", k);
        }
    }
    return TP_OK;
}

/* Copies of at least this many bytes are split over the rank's pool. A
 * step's outputs go into a fresh result block, and its first touch of each
 * page faults and zeroes it: copying GPT-2's logits (103 MB at batch 4)
 * on one thread while the others waited was 5% of the step's time. */
#define COPY_SPLIT_MIN_BYTES ((int64_t)4 << 20)

static tp_status cpu_copy(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err)
{
    return cpu_tensor_copy_on(pool_of(ctx_of(b), rank), dst, src, COPY_SPLIT_MIN_BYTES, err);
}

static tp_status record(tp_capture *c, tp_op op, int collective, const tp_attrs *a,
                        const tp_tensor *ins, int n_ins, const tp_tensor *out, tp_err *err)
{
    if (TP_GROW(c->cmds, c->cap, c->n, 32) != 0)
        return tp_fail(err, TP_NOMEM, "capture: out of memory");
    cpu_cmd *cmd = &c->cmds[c->n];
    cmd->ins = malloc((size_t)n_ins * sizeof *cmd->ins);
    if (!cmd->ins)
        return tp_fail(err, TP_NOMEM, "capture: out of memory");
    memcpy(cmd->ins, ins, (size_t)n_ins * sizeof *ins);
    cmd->op = op;
    cmd->collective = collective;
    cmd->attrs = *a;
    cmd->n_ins = n_ins;
    cmd->out = *out;
    c->n++;
    return TP_OK;
}

static tp_status cpu_run_op(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                            int n_ins, tp_tensor *out, tp_err *err)
{
    tp_capture *c = ctx_of(b)->capturing[rank];
    if (c) {
        tp_status st = cpu_op_reserve(pool_of(ctx_of(b), rank), op, a, ins, n_ins, out, err);
        return st == TP_OK ? record(c, op, 0, a, ins, n_ins, out, err) : st;
    }
    return cpu_op_run_on(pool_of(ctx_of(b), rank), op, a, ins, n_ins, out, rank, b->world, err);
}

static tp_status run_collective(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                                int n_ins, tp_tensor *out, tp_err *err)
{
    cpu_comm *comm = ctx_of(b)->comm;
    tp_status st = check_local(ctx_of(b), rank, err);
    if (st != TP_OK)
        return st;
    if (tp_op_kind_of(op) == TP_KIND_FUSED)
        return cpu_fused_run(comm, rank, op, a, ins, n_ins, out, err);
    if (op == TP_OP_ALL_REDUCE && a->algo == TP_ALGO_RING)
        return cpu_ring_all_reduce(comm, rank, a, &ins[0], out, err);
    return cpu_collective_run(comm, rank, op, a, &ins[0], out, err);
}

static tp_status cpu_collective(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                                int n_ins, tp_tensor *out, tp_err *err)
{
    tp_capture *c = ctx_of(b)->capturing[rank];
    if (c)
        return record(c, op, 1, a, ins, n_ins, out, err);
    return run_collective(b, rank, op, a, ins, n_ins, out, err);
}

static tp_status cpu_begin_capture(tp_backend *b, int rank, tp_err *err)
{
    cpu_ctx *x = ctx_of(b);
    if (x->capturing[rank])
        return tp_fail(err, TP_INTERNAL, "rank %d: capture already in progress", rank);
    x->capturing[rank] = calloc(1, sizeof(tp_capture));
    if (!x->capturing[rank])
        return tp_fail(err, TP_NOMEM, "capture: out of memory");
    x->capturing[rank]->rank = rank;
    return TP_OK;
}

static tp_status cpu_end_capture(tp_backend *b, int rank, tp_capture **out, tp_err *err)
{
    cpu_ctx *x = ctx_of(b);
    if (!x->capturing[rank])
        return tp_fail(err, TP_INTERNAL, "rank %d: end_capture without begin_capture", rank);
    tp_capture *c = x->capturing[rank];
    x->capturing[rank] = NULL;
    tp_status st = verify_capture(b, c, err);
    if (st != TP_OK) {
        cpu_capture_free(b, c);
        return st;
    }
    *out = c;
    return TP_OK;
}

static tp_status cpu_replay(tp_backend *b, int rank, tp_capture *c, tp_err *err)
{
    if (ctx_of(b)->verify_replay) {
        tp_status st = verify_capture(b, c, err);
        if (st != TP_OK)
            return st;
    }
    for (int i = 0; i < c->n; i++) {
        cpu_cmd *cmd = &c->cmds[i];
        tp_status st = cmd->collective
                           ? run_collective(b, rank, cmd->op, &cmd->attrs, cmd->ins, cmd->n_ins, &cmd->out, err)
                           : cpu_op_run_on(pool_of(ctx_of(b), rank), cmd->op, &cmd->attrs, cmd->ins, cmd->n_ins,
                                           &cmd->out, rank, b->world, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

static void cpu_capture_free(tp_backend *b, tp_capture *c)
{
    (void)b;
    if (!c)
        return;
    for (int i = 0; i < c->n; i++)
        free(c->cmds[i].ins);
    free(c->cmds);
    free(c);
}

static tp_status cpu_synchronize(tp_backend *b, int rank, tp_err *err)
{
    (void)b;
    (void)rank;
    (void)err;
    return TP_OK; /* kernels run synchronously on the rank's thread */
}

static void cpu_abort(tp_backend *b) { cpu_comm_abort(ctx_of(b)->comm); }
/* Shared mode: only the owner's handle resets (cpu_comm_reset); the caller
 * runs it when no rank of any process is inside the comm. */
static void cpu_reset(tp_backend *b) { cpu_comm_reset(ctx_of(b)->comm); }
/* A process is gone: even the waits abort lets complete must fail. */
static void cpu_peer_lost(tp_backend *b) { cpu_comm_lost(ctx_of(b)->comm); }

static void cpu_destroy(tp_backend *b)
{
    cpu_ctx *x = ctx_of(b);
    for (int r = 0; r < b->world; r++)
        cpu_capture_free(b, x->capturing[r]);
    free(x->capturing);
    for (int r = x->rank_lo; x->pool && r < x->rank_hi; r++)
        cpu_pool_free(x->pool[r - x->rank_lo]);
    free(x->pool);
    cpu_comm_free(x->comm);
    if (x->heap) {
        for (int r = x->rank_lo; r < x->rank_hi; r++)
            cpu_heap_destroy(x->heap[r - x->rank_lo]);
        free(x->heap);
        pthread_mutex_destroy(&x->heap_mu);
    }
    free(x->reg.rec);
    pthread_mutex_destroy(&x->reg.mu);
    free(x);
    free(b);
}

static const tp_backend_iface cpu_iface = {
    .name = "cpu",
    .host_addressable = 1,
    .ranks_may_share_thread = 1,
    .alloc = cpu_alloc,
    .alloc_symmetric = cpu_alloc, /* every buffer is peer-addressable: one address space, or the shared heap */
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .run_op = cpu_run_op,
    .collective = cpu_collective,
    .prepare_matmul_weight = cpu_prepare_matmul_weight,
    .begin_capture = cpu_begin_capture,
    .end_capture = cpu_end_capture,
    .replay = cpu_replay,
    .capture_free = cpu_capture_free,
    .synchronize = cpu_synchronize,
    .abort = cpu_abort,
    .peer_lost = cpu_peer_lost,
    .reset = cpu_reset,
    .destroy = cpu_destroy,
};

size_t tp_cpu_shared_comm_bytes(int world) { return cpu_comm_shared_bytes(world); }

/* The comm area and the world's heap regions, as offsets; returns the end
 * of the furthest one (the part of the mapping tensors may live in). */
static tp_status check_layout(int world, const tp_cpu_shared *s, size_t *span, tp_err *err)
{
    if (!s->base)
        return tp_fail(err, TP_INVALID, "cpu backend: shared memory has no base address");
    if (s->rank_lo < 0 || s->rank_lo > s->rank_hi || s->rank_hi > world)
        return tp_fail(err, TP_INVALID, "cpu backend: local ranks [%d, %d) do not fit world size %d", s->rank_lo,
                       s->rank_hi, world);
    if (s->heap_bytes > (SIZE_MAX - s->heap_offset) / (size_t)world || s->comm_bytes > SIZE_MAX - s->comm_offset)
        return tp_fail(err, TP_INVALID, "cpu backend: shared memory layout overflows the address space");
    size_t heap_end = s->heap_offset + (size_t)world * s->heap_bytes, comm_end = s->comm_offset + s->comm_bytes;
    if (s->comm_offset < heap_end && s->heap_offset < comm_end)
        return tp_fail(err, TP_INVALID,
                       "cpu backend: comm area [%zu, %zu) overlaps the heaps [%zu, %zu) of the shared memory",
                       s->comm_offset, comm_end, s->heap_offset, heap_end);
    *span = heap_end > comm_end ? heap_end : comm_end;
    return TP_OK;
}

/* Shared mode: one heap per local rank, then the comm (the owner
 * initializes it, the others attach). */
static tp_status create_shared(cpu_ctx *x, int world, const tp_cpu_shared *s, tp_err *err)
{
    size_t span = 0;
    tp_status st = check_layout(world, s, &span, err);
    if (st != TP_OK)
        return st;
    int n = s->rank_hi - s->rank_lo;
    x->rank_lo = s->rank_lo;
    x->rank_hi = s->rank_hi;
    x->heap = calloc((size_t)(n ? n : 1), sizeof *x->heap);
    if (!x->heap)
        return tp_fail(err, TP_NOMEM, "cpu backend: out of memory");
    pthread_mutex_init(&x->heap_mu, NULL);
    for (int r = s->rank_lo; r < s->rank_hi; r++) {
        x->heap[r - s->rank_lo] = cpu_heap_create(s->base + s->heap_offset + (size_t)r * s->heap_bytes, s->heap_bytes, err);
        if (!x->heap[r - s->rank_lo]) {
            tp_err_prefix(err, "cpu backend: rank %d: ", r);
            return TP_INVALID;
        }
    }
    cpu_comm_shared cs = {s->base, span, s->comm_offset, s->comm_bytes, s->owner};
    x->comm = cpu_comm_attach(world, &cs, err);
    return x->comm ? TP_OK : TP_INVALID;
}

/* One pool per local rank, of as many threads as its GEMMs get: at world
 * size 1 on 2 cores attention's heads run on both cores, as the GEMMs
 * around it do (cpu_pool.h). */
/* threads per rank; every rank of the world, in this process or
 * another, keeps its pool's threads busy during a step. */
static tp_status create_pools(cpu_ctx *x, int world, int threads, int cores, tp_err *err)
{
    int64_t spin_ns = tp_spin_budget(world * threads, cores);
    int n = x->rank_hi - x->rank_lo;
    x->pool = calloc((size_t)(n ? n : 1), sizeof *x->pool);
    if (!x->pool)
        return tp_fail(err, TP_NOMEM, "cpu backend: out of memory");
    for (int i = 0; i < n; i++) {
        tp_status st = cpu_pool_create(threads, spin_ns, &x->pool[i], err);
        if (st != TP_OK) {
            tp_err_prefix(err, "cpu backend: rank %d: ", x->rank_lo + i);
            return st;
        }
    }
    return TP_OK;
}

/* The startup log names the OpenBLAS kernels the GEMMs run. An environment
 * can force another CPU's with OPENBLAS_CORETYPE, and the difference is
 * large: Haswell's AVX2 kernels where OpenBLAS would pick Cooperlake's
 * AVX-512 ones made this VM's example step 3.0 us instead of 2.3 and
 * imported GPT-2's at batch 8 0.40 ms instead of 0.29 (graphs/README.md).
 * tpserve serve forces them itself where OpenBLAS's table predates the CPU
 * (blas_pick.h), and says what OpenBLAS had detected. */
static void note_blas_kernels(tp_backend *b, int threads, int cores)
{
    const char *forced = getenv("OPENBLAS_CORETYPE"), *detected = getenv(TP_BLAS_DETECTED_ENV);
    int by_env = forced && *forced;
    char how[160];
    /* picked and applied: the re-exec that applies it could have failed */
    if (by_env && detected && strcasecmp(openblas_get_corename(), forced) == 0)
        snprintf(how, sizeof how, ", picked by tpserve for this CPU (OpenBLAS detected %.40s, older kernels)",
                 detected);
    else if (by_env && detected)
        snprintf(how, sizeof how, " (tpserve's pick of %.40s did not apply: no re-execution)", forced);
    else
        snprintf(how, sizeof how, "%s%.64s", by_env ? ", forced by OPENBLAS_CORETYPE=" : " (detected)",
                 by_env ? forced : "");
    small_sgemm_use use = small_sgemm_init();
    snprintf(b->note, sizeof b->note, "cpu backend: OpenBLAS kernels %s%s; GEMMs on %d thread%s per rank (%d usable "
             "core%s, %d rank%s)%s%s%s%s", openblas_get_corename(), how, threads, threads == 1 ? "" : "s", cores,
             cores == 1 ? "" : "s", b->world, b->world == 1 ? "" : "s", use ? "; " : "",
             use ? small_sgemm_use_name(use) : "",
             use ? (small_sgemm_avx512_supported() ? ": tpserve's AVX-512 kernel" : ": tpserve's AVX2 kernel") : "",
             use ? " (kernels/cpu/small_gemm.h)" : "");
    if (weight_packs_enabled()) {
        size_t len = strlen(b->note);
        snprintf(b->note + len, sizeof b->note - len,
                 "; FP32 weights packed at load for tpserve's %s GEMM, FP16/BF16 ones widened into FP32 panels "
                 "beside them (kernels/cpu/packed_gemm.h; TPSERVE_CPU_GEMM=openblas: OpenBLAS)",
                 pgemm_wide() ? "AVX-512" : pgemm_wide_supported() ? "AVX2 (" PGEMM_NARROW_ENV ")" : "AVX2");
    }
}

tp_status tp_cpu_backend_create(int world, const tp_cpu_shared *shared, tp_backend **out, tp_err *err)
{
    *out = NULL;
    if (world < 1)
        return tp_fail(err, TP_INVALID, "cpu backend: world size %d out of range", world);
    tp_status checked = weight_packs_check_setting(err);
    if (checked != TP_OK) {
        tp_err_prefix(err, "cpu backend: ");
        return checked;
    }
    tp_backend *b = calloc(1, sizeof *b);
    cpu_ctx *x = calloc(1, sizeof *x);
    if (x)
        x->capturing = calloc((size_t)world, sizeof *x->capturing);
    if (!b || !x || !x->capturing) {
        if (x)
            free(x->capturing);
        free(x);
        free(b);
        return tp_fail(err, TP_NOMEM, "cpu backend: out of memory");
    }
    pthread_mutex_init(&x->reg.mu, NULL);
    b->iface = &cpu_iface;
    b->ctx = x;
    b->world = world;
    tp_status st = TP_OK;
    if (shared) {
        st = create_shared(x, world, shared, err);
    } else {
        x->rank_hi = world; /* this process runs every rank */
        x->comm = cpu_comm_create(world, err);
        st = x->comm ? TP_OK : TP_NOMEM;
    }
    int cores = tp_spin_cores(), threads = tp_blas_threads_per_rank(world, cores);
    if (st == TP_OK)
        st = create_pools(x, world, threads, cores, err);
    if (st != TP_OK) {
        cpu_destroy(b);
        return st;
    }
    /* The ranks are the parallelism; cores they leave idle go to each
     * rank's GEMMs (tp_blas_threads_per_rank). The count is per process:
     * in a process group each sets its own. Ranks as threads share one
     * OpenBLAS, whose threaded GEMMs take turns on one lock (0.3.21,
     * level3_thread.c): above one thread, their large GEMMs run one after
     * another, each on its share of the cores. OPENBLAS_NUM_THREADS=1 in
     * serve's environment (main.c) keeps OpenBLAS from starting a pool
     * before this; the call below starts the threads it asks for.
     * Products too small to gain from them run on one
     * (tp_blas_product_threads). Each rank's pool (create_pools) has as
     * many threads for its attention. */
    tp_blas_set_threads(threads);
    note_blas_kernels(b, threads, cores);
    *out = b;
    return TP_OK;
}

void tp_cpu_backend_verify_replay(tp_backend *b, int on) { ctx_of(b)->verify_replay = on; }

size_t tp_cpu_backend_scratch_bytes(tp_backend *b)
{
    const cpu_ctx *x = ctx_of(b);
    size_t n = 0;
    for (int r = x->rank_lo; x->pool && r < x->rank_hi; r++)
        n += cpu_pool_scratch_bytes(x->pool[r - x->rank_lo]);
    return n;
}

/* ------------------------------------------------------- registry entry */

static const tp_backend_caps cpu_caps = {
    .lowering = {.one_shot_max_bytes = TP_ONE_SHOT_MAX_BYTES_DEFAULT,
                 .large_all_reduce = TP_ALGO_RING,
                 .other_collectives = TP_ALGO_ONE_SHOT},
    .dma_input_copies = 0,
    /* a CPU has no FP16 arithmetic to gain from: every narrow op widened
     * its inputs and rounded its result, 8-14% of an FP16 model's time */
    .f32_activations = 1,
};

static int cpu_supports_op(tp_op op, tp_dtype dtype)
{
    (void)dtype; /* every cpu kernel takes each dtype shape inference lets through */
    tp_op_kind k = tp_op_kind_of(op);
    return k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED || cpu_op_has_kernel(op);
}

static tp_status cpu_create_threads(int world, const tp_backend_settings *s, tp_backend **out, tp_err *err)
{
    tp_status st = tp_cpu_backend_create(world, NULL, out, err);
    if (st == TP_OK)
        tp_cpu_backend_verify_replay(*out, s->verify_replay);
    return st;
}

static tp_status cpu_group_message(char *msg, size_t cap, tp_err *err)
{
    (void)err;
    if (cap)
        msg[0] = 0; /* workers attach to the shared memory: nothing else to say */
    return TP_OK;
}

static tp_status cpu_group_join(const tp_backend_group *g, const char *msg, const tp_backend_settings *s,
                                tp_backend **out, tp_err *err)
{
    (void)msg;
    tp_cpu_shared sh = {g->base, g->comm_offset, g->comm_bytes, g->heap_offset, g->heap_bytes,
                        g->rank_lo, g->rank_hi, g->leads};
    tp_status st = tp_cpu_backend_create(g->world, &sh, out, err);
    if (st == TP_OK)
        tp_cpu_backend_verify_replay(*out, s->verify_replay);
    return st;
}

const tp_backend_kind tp_cpu_backend_kind = {
    .name = "cpu",
    .caps = &cpu_caps,
    .supports_op = cpu_supports_op,
    .probe = NULL, /* the registry's last entry: what "auto" falls back to, never probed */
    .one_rank_per_process = 0,
    .share_before_join = 0, /* the owner initializes the comm area before any worker attaches */
    .create = cpu_create_threads,
    .group_message = cpu_group_message,
    .group_join = cpu_group_join,
    .prepare_exec = tp_blas_pick_for_exec,
};
