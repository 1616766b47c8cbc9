/* cpu_backend.c — the reference backend.
 *
 * Capture records each run_op/collective as a command with every tensor
 * (pointers, shapes, strides) and attrs copied in; replay walks that array
 * and calls the kernels directly — no graph, no lookups, no allocation —
 * which is exactly the pointer-stability discipline a CUDA graph imposes. */
#include "cpu_backend.h"

#include <cblas.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "collectives.h"
#include "cpu_ops.h"
#include "fused.h"

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
    int verify_replay;      /* TP_VERIFY_REPLAY=1: check every replay */
} cpu_ctx;

static cpu_ctx *ctx_of(tp_backend *b) { return b->ctx; }

static void cpu_capture_free(tp_backend *b, tp_capture *c);

static int registry_add(cpu_registry *r, void *p, size_t bytes)
{
    pthread_mutex_lock(&r->mu);
    if (r->n == r->cap) {
        int cap = r->cap ? 2 * r->cap : 64;
        cpu_alloc_rec *nr = realloc(r->rec, (size_t)cap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&r->mu);
            return -1;
        }
        r->rec = nr;
        r->cap = cap;
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

static tp_status cpu_alloc(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err)
{
    if (ctx_of(b)->capturing[rank])
        return tp_fail(err, TP_INTERNAL, "rank %d: allocation of %zu bytes during capture", rank, bytes);
    size_t rounded = (bytes + 63) & ~(size_t)63;
    *out = aligned_alloc(64, rounded ? rounded : 64);
    if (!*out || registry_add(&ctx_of(b)->reg, *out, bytes) != 0) {
        free(*out);
        return tp_fail(err, TP_NOMEM, "rank %d: cannot allocate %zu bytes", rank, bytes);
    }
    return TP_OK;
}

static void cpu_free(tp_backend *b, int rank, void *p)
{
    (void)rank;
    registry_remove(&ctx_of(b)->reg, p);
    free(p);
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

static tp_status cpu_copy(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err)
{
    (void)b;
    (void)rank;
    (void)err;
    tp_tensor_copy(dst, src);
    return TP_OK;
}

static tp_status record(tp_capture *c, tp_op op, int collective, const tp_attrs *a,
                        const tp_tensor *ins, int n_ins, const tp_tensor *out, tp_err *err)
{
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 32;
        cpu_cmd *nc = realloc(c->cmds, (size_t)cap * sizeof *nc);
        if (!nc)
            return tp_fail(err, TP_NOMEM, "capture: out of memory");
        c->cmds = nc;
        c->cap = cap;
    }
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
    if (c)
        return record(c, op, 0, a, ins, n_ins, out, err);
    return cpu_op_run(op, a, ins, n_ins, out, rank, b->world, err);
}

static tp_status run_collective(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                                int n_ins, tp_tensor *out, tp_err *err)
{
    cpu_comm *comm = ctx_of(b)->comm;
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
                           : cpu_op_run(cmd->op, &cmd->attrs, cmd->ins, cmd->n_ins, &cmd->out, rank, b->world, err);
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
static void cpu_reset(tp_backend *b) { cpu_comm_reset(ctx_of(b)->comm); }
static void cpu_peer_lost(tp_backend *b) { cpu_comm_abort(ctx_of(b)->comm); }

static void cpu_destroy(tp_backend *b)
{
    cpu_ctx *x = ctx_of(b);
    for (int r = 0; r < b->world; r++)
        cpu_capture_free(b, x->capturing[r]);
    free(x->capturing);
    cpu_comm_free(x->comm);
    free(x->reg.rec);
    pthread_mutex_destroy(&x->reg.mu);
    free(x);
    free(b);
}

static const tp_backend_iface cpu_iface = {
    .name = "cpu",
    .host_addressable = 1,
    .alloc = cpu_alloc,
    .alloc_symmetric = cpu_alloc, /* one address space: every buffer is peer-addressable */
    .free = cpu_free,
    .copy_in = cpu_copy,
    .copy_out = cpu_copy,
    .run_op = cpu_run_op,
    .collective = cpu_collective,
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

tp_status tp_cpu_backend_create(int world, const tp_cpu_shared *shared, tp_backend **out, tp_err *err)
{
    if (shared)
        return tp_fail(err, TP_UNAVAILABLE, "cpu backend: ranks in separate processes are not supported yet");
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
    x->comm = cpu_comm_create(world, err);
    if (!x->comm) {
        free(x->capturing);
        free(x);
        free(b);
        return TP_NOMEM;
    }
    /* One BLAS thread per rank: the ranks are the parallelism. */
    openblas_set_num_threads(1);
    pthread_mutex_init(&x->reg.mu, NULL);
    const char *v = getenv("TP_VERIFY_REPLAY");
    x->verify_replay = v && *v == '1';
    b->iface = &cpu_iface;
    b->ctx = x;
    b->world = world;
    *out = b;
    return TP_OK;
}
