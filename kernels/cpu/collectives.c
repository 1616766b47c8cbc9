/* collectives.c — collectives of the cpu backend (ranks are threads, or
 * processes mapping the same shared memory).
 *
 * Protocol of one collective, per rank:
 *   1. publish {in, out, op, attrs} in slot[rank], tensors by value with
 *      in's data as an offset from the shared base;
 *   2. entry barrier (abortable): after it every slot is visible;
 *   3. validate every rank's slot (every rank runs the same checks on the
 *      same data, so all ranks agree on the verdict), then compute this
 *      rank's out by reading peers' inputs in place (strided sub-views,
 *      translated into this process's mapping);
 *   4. exit barrier: nobody returns (and reuses or frees its input, or
 *      rewrites its slot) while a peer may still be reading it.
 *
 * The exit barrier ignores cpu_comm_abort on purpose: every rank that passed
 * the entry barrier reaches it (there is no failure path between the two
 * barriers), and leaving early would let a rank free an input that a peer is
 * still reading. Either every rank passes the entry barrier or none does,
 * because the generation only advances once all ranks have arrived.
 * cpu_comm_lost is the exception: a dead process never reaches the exit
 * barrier, so once a process is gone every wait fails, this one included.
 *
 * Synchronization is C11 atomics on the shared state plus futex wait/wake
 * on one sequence word, rather than PTHREAD_PROCESS_SHARED mutexes and
 * condition variables: nothing is ever locked, so a process that dies at any
 * point cannot leave a lock held or a condition variable's internal waiter
 * accounting half-updated (glibc's process-shared condvars are not robust
 * against a dead waiter even when the mutex is), and abort/lost only need
 * an atomic OR and a wake. Waiters sleep on `seq`, which every event that
 * can end a wait bumps (a generation completing, abort, lost), so a wake
 * cannot be lost between checking and sleeping. Thread mode uses the same
 * code with private futexes; shared mode uses plain (non-private) futexes,
 * which the kernel keys by the shared page, not the address.
 *
 * Before sleeping, a waiter spins for a bounded time (util/spin_wait.h)
 * when every rank can have a core: measured on the example graph (2 ranks,
 * 2 cores, c=1), two of every three barrier waits end within 1 us (the
 * peer is computing the same step), and most of the rest are the first
 * barrier of a step, where the peer is still waking up (15-35 us). A sleep
 * costs a context switch on each side and tens of microseconds; the old
 * spin of 200 pause instructions (2.4 us here; a pause takes 10 to 140
 * cycles depending on the CPU, so a count is no time bound) missed every
 * wake-up. The spin ends on any change of the state word, so an abort or a
 * lost peer is seen as fast as a completion.
 *
 * Ranks may also be fibers of one thread (rank_group.c's serial steps,
 * util/fiber.h): a waiter then yields to its peers instead of spinning or
 * sleeping (they run only while it yields), and sees a peer that returned
 * from the step without arriving, which would be a hang in threads, as the
 * error it is. The arithmetic is the same either way, and so are the bits.
 *
 * Arithmetic of the reductions (identical on every rank, so all_reduce
 * results are bit-identical across ranks):
 *   - float dtypes (F32, FP16, BF16): each element is widened to f32 and
 *     accumulated in f32 in rank order 0..d-1 (starting from rank 0's value,
 *     so -0.0 survives a one-rank sum), avg divides the f32 sum by d, and the
 *     result is rounded to the output dtype once. max propagates NaN.
 *   - INT32/INT64: accumulated in 64-bit two's complement (an INT64 sum that
 *     overflows wraps instead of being undefined; an INT32 result outside the
 *     int32 range wraps when stored). avg is the 64-bit sum divided by d with
 *     C integer division, i.e. truncated toward zero (-5 avg over 2 ranks is
 *     -2, not -3).
 *
 * out must not alias any rank's in (peers read in while out is written); the
 * one exception handled is broadcast writing in place on the src rank. */
#include "cpu/collectives.h"

#include <math.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/narrow_rows.h"
#include "fiber.h"
#include "spin_wait.h"

#define CPU_COMM_MAX_WORLD 4096
#define RED_CHUNK 256
#define COMM_MAGIC 0x6d6d6f635f757063ULL /* "cpu_comm" */
#define COMM_VERSION 1u
/* The barrier state is one 64-bit word, so that arriving, completing a
 * generation, abort and lost are each one atomic step on it (see
 * barrier_wait): bits 0-15 ranks arrived, 16 aborted, 17 lost, 32-63 the
 * generation (completed barriers, wrapping). */
#define ST_ARRIVED 0xffffULL
#define ST_ABORTED (1ULL << 16)
#define ST_LOST (1ULL << 17)
#define ST_GEN_ONE (1ULL << 32)
#define GEN_OF(s) ((uint32_t)((s) >> 32))

/* Processes share these words through different mappings: only lock-free
 * atomics are plain memory operations that work across address spaces. */
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_LONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "the cpu comm needs lock-free 32- and 64-bit atomics");

/* One rank's contribution, by value: the data pointers of in/out are not
 * meaningful to peers (other address spaces) and are left NULL; in_off is
 * in's data relative to the shared base. */
typedef struct {
    tp_tensor in, out;
    uint64_t in_off;
    int has_in, has_out;
    int in_outside; /* in is not inside the shared memory (shared mode) */
    tp_op op;
    int has_attrs;
    int dim, split_dim, concat_dim, src;
    tp_reduce reduce;
} cpu_slot;

/* The state every rank shares, followed by world slots. */
typedef struct {
    _Atomic uint64_t magic; /* stored last by the owner */
    uint32_t version, slot_bytes;
    int32_t world;
    alignas(64) _Atomic uint64_t state; /* ST_*: arrived, aborted, lost, generation */
    _Atomic uint32_t seq;               /* futex word: bumped by every wake-up event */
    _Atomic uint32_t sleepers;          /* waiters in (or entering) FUTEX_WAIT */
} comm_hdr;

#define SLOTS_AT (((sizeof(comm_hdr)) + 63) & ~(size_t)63)

/* This process's handle on the state. */
struct cpu_comm {
    int world;
    comm_hdr *h;
    cpu_slot *slot;
    uintptr_t base; /* this process's mapping; 0 for threads (offset == pointer) */
    size_t span;    /* shared mode: published tensors must lie in [base, base + span) */
    int shared; /* waiters and wakers may be in other processes */
    int can_reset;
    int64_t spin_ns; /* spin before a futex sleep (0: sleep at once) */
    /* Per rank of this handle, entry and exit barrier: what its spins
     * learned (each used only by the thread running that rank). */
    tp_spin_site *sites;
    void *own; /* thread mode: the malloc'd state */
};

static const char ABORT_MSG[] = "collective aborted: a peer rank failed";
static const char LOST_MSG[] = "collective failed: a peer rank's process is gone";

size_t cpu_comm_shared_bytes(int world)
{
    return SLOTS_AT + (size_t)(world > 0 ? world : 0) * sizeof(cpu_slot);
}

static void init_state(void *area, int world)
{
    comm_hdr *h = area;
    atomic_store(&h->magic, 0); /* attachers never see a half-built state as ready */
    memset((char *)area + sizeof h->magic, 0, cpu_comm_shared_bytes(world) - sizeof h->magic);
    h->version = COMM_VERSION;
    h->slot_bytes = (uint32_t)sizeof(cpu_slot);
    h->world = world;
    atomic_store(&h->magic, COMM_MAGIC);
}

static cpu_comm *new_handle(int world, void *area, tp_err *err)
{
    cpu_comm *c = calloc(1, sizeof *c);
    if (!c) {
        tp_fail(err, TP_NOMEM, "cpu_comm: out of memory");
        return NULL;
    }
    c->sites = calloc((size_t)world * 2, sizeof *c->sites);
    if (!c->sites) {
        free(c);
        tp_fail(err, TP_NOMEM, "cpu_comm: out of memory");
        return NULL;
    }
    c->world = world;
    c->h = area;
    c->slot = (cpu_slot *)((char *)area + SLOTS_AT);
    c->spin_ns = tp_spin_budget(world, tp_spin_cores());
    return c;
}

static tp_status check_world(int world, tp_err *err)
{
    if (world < 1 || world > CPU_COMM_MAX_WORLD)
        return tp_fail(err, TP_INVALID, "cpu_comm: world size %d out of range [1, %d]", world, CPU_COMM_MAX_WORLD);
    return TP_OK;
}

cpu_comm *cpu_comm_create(int world, tp_err *err)
{
    if (check_world(world, err) != TP_OK)
        return NULL;
    size_t bytes = (cpu_comm_shared_bytes(world) + 63) & ~(size_t)63;
    void *area = aligned_alloc(64, bytes);
    if (!area) {
        tp_fail(err, TP_NOMEM, "cpu_comm: out of memory for %d slots", world);
        return NULL;
    }
    init_state(area, world);
    cpu_comm *c = new_handle(world, area, err);
    if (!c) {
        free(area);
        return NULL;
    }
    c->can_reset = 1;
    c->own = area;
    return c;
}

cpu_comm *cpu_comm_attach(int world, const cpu_comm_shared *sh, tp_err *err)
{
    if (check_world(world, err) != TP_OK)
        return NULL;
    size_t need = cpu_comm_shared_bytes(world);
    if (!sh || !sh->base) {
        tp_fail(err, TP_INVALID, "cpu_comm: no shared memory to attach to");
        return NULL;
    }
    if (sh->bytes < need || sh->offset > sh->span || sh->span - sh->offset < need) {
        tp_fail(err, TP_INVALID, "cpu_comm: comm area of %zu bytes at offset %zu cannot hold world size %d (needs %zu)",
                sh->bytes, sh->offset, world, need);
        return NULL;
    }
    char *area = sh->base + sh->offset;
    if ((uintptr_t)area % 64 != 0) {
        tp_fail(err, TP_INVALID, "cpu_comm: comm area at offset %zu is not 64-byte aligned in this mapping", sh->offset);
        return NULL;
    }
    comm_hdr *h = (comm_hdr *)area;
    if (sh->owner) {
        init_state(area, world);
    } else {
        uint64_t magic = atomic_load(&h->magic);
        if (magic != COMM_MAGIC) {
            tp_fail(err, TP_INVALID,
                    "cpu_comm: the shared comm area at offset %zu is not initialized (magic %#llx): the owner "
                    "process must create its backend before any other process attaches",
                    sh->offset, (unsigned long long)magic);
            return NULL;
        }
        if (h->version != COMM_VERSION || h->slot_bytes != sizeof(cpu_slot)) {
            tp_fail(err, TP_INVALID,
                    "cpu_comm: the shared comm area was initialized by an incompatible build (version %u, slot "
                    "size %u; this build: version %u, slot size %zu)",
                    h->version, h->slot_bytes, COMM_VERSION, sizeof(cpu_slot));
            return NULL;
        }
        if (h->world != world) {
            tp_fail(err, TP_INVALID,
                    "cpu_comm: the shared comm area was initialized for world size %d, this process expects %d",
                    (int)h->world, world);
            return NULL;
        }
    }
    cpu_comm *c = new_handle(world, area, err);
    if (!c)
        return NULL;
    c->base = (uintptr_t)sh->base;
    c->span = sh->span;
    c->shared = 1; /* waiters and wakers are in different processes */
    c->can_reset = sh->owner;
    return c;
}

void cpu_comm_free(cpu_comm *c)
{
    if (!c)
        return;
    free(c->own);
    free(c->sites);
    free(c);
}

int cpu_comm_world(const cpu_comm *c) { return c ? c->world : 0; }
void cpu_comm_set_spin(cpu_comm *c, int64_t ns) { c->spin_ns = ns; }

/* Ends every current wait: waiters re-check the state after seq moves. The
 * syscall is skipped when nobody sleeps (peers that have not reached their
 * FUTEX_WAIT yet see seq move and do not sleep); see barrier_wait for why
 * that cannot lose a wake-up. */
static void wake_all(cpu_comm *c)
{
    atomic_fetch_add(&c->h->seq, 1);
    tp_futex_wake_sleepers(&c->h->seq, &c->h->sleepers, c->shared);
}

void cpu_comm_abort(cpu_comm *c)
{
    if (!c)
        return;
    atomic_fetch_or(&c->h->state, ST_ABORTED);
    wake_all(c);
}

void cpu_comm_lost(cpu_comm *c)
{
    if (!c)
        return;
    atomic_fetch_or(&c->h->state, ST_LOST);
    wake_all(c);
}

void cpu_comm_reset(cpu_comm *c)
{
    if (!c || !c->can_reset)
        return;
    /* ranks that left an aborted barrier are not waiting; ST_LOST stays */
    atomic_fetch_and(&c->h->state, ~(ST_ARRIVED | ST_ABORTED));
}

/* Why a wait in state s must end without its generation completing, if it must. */
static tp_status check_flags(uint64_t s, int abortable, tp_err *err)
{
    if (s & ST_LOST)
        return tp_fail(err, TP_BACKEND, "%s", LOST_MSG);
    if (abortable && (s & ST_ABORTED))
        return tp_fail(err, TP_BACKEND, "%s", ABORT_MSG);
    return TP_OK;
}

/* A spinning waiter's view: the state it arrived in has moved on
 * (completed, aborted or lost). */
typedef struct {
    const comm_hdr *h;
    uint32_t gen;
} arrival;

static int state_moved(const void *p)
{
    const arrival *a = p;
    uint64_t s = atomic_load_explicit(&a->h->state, memory_order_acquire);
    return GEN_OF(s) != a->gen || (s & (ST_ABORTED | ST_LOST));
}

/* Ranks that are fibers of one thread (a serial step, rank_group.c): the
 * peers this wait needs run only while it yields to them. A peer that has
 * returned from the step will never arrive (it would be a hang in threads):
 * the ranks disagree on the step's collectives. */
static tp_status yield_to_peers(tp_err *err)
{
    if (tp_fiber_ended() > 0)
        return tp_fail(err, TP_INTERNAL,
                       "a rank ended its step while a peer waits for it in a collective (the ranks "
                       "disagree on the step's collectives)");
    tp_fiber_yield();
    return TP_OK;
}

/* abortable=1: fails (without counting this rank) once aborted, and wakes
 * with an error if aborted before the generation completes.
 * abortable=0: waits for the generation regardless of the aborted flag.
 * Both fail once the comm is lost, unless the generation completed.
 *
 * Arriving is a CAS on the state word that re-checks the flags, and the
 * last arrival advances the generation in the same CAS; abort/lost set
 * their bit on that word. So for one generation either the completion or
 * the abort comes first in the word's history: if the abort, the last rank
 * cannot complete it (and the earlier ones leave); if the completion, every
 * waiter sees the new generation before (or with) the abort bit and passes.
 * Either every rank passes the entry barrier or none does — what the mutex
 * gave the thread-only version.
 *
 * No lost wake-up: a waiter reads seq, then the state, then sleeps only
 * while seq still holds what it read; every event bumps seq after changing
 * the state. The waker skips FUTEX_WAKE when nobody sleeps, which is safe
 * (tp_futex_sleep: a waiter counts itself in sleepers before the kernel
 * re-reads seq, and the waker bumps seq before reading sleepers). */
static tp_status barrier_wait(cpu_comm *c, int rank, int abortable, tp_err *err)
{
    comm_hdr *h = c->h;
    uint64_t s = atomic_load(&h->state), next;
    uint32_t g;
    int last;
    do {
        tp_status st = check_flags(s, abortable, err);
        if (st != TP_OK)
            return st;
        g = GEN_OF(s);
        last = (s & ST_ARRIVED) + 1 == (uint64_t)c->world;
        next = last ? (s & ~ST_ARRIVED) + ST_GEN_ONE : s + 1;
    } while (!atomic_compare_exchange_weak(&h->state, &s, next));
    if (last) {
        wake_all(c);
        return TP_OK;
    }
    int fiber = tp_fiber_running();
    tp_spin_site none = {0}, *site = rank >= 0 && rank < c->world ? &c->sites[2 * rank + !abortable] : &none;
    if (!fiber)
        tp_spin_site_until(site, state_moved, &(arrival){h, g}, c->spin_ns);
    for (;;) {
        uint32_t q = atomic_load(&h->seq);
        s = atomic_load(&h->state);
        if (GEN_OF(s) != g)
            return TP_OK; /* completed, even if an abort came after */
        tp_status st = check_flags(s, abortable, err);
        if (st != TP_OK)
            return st;
        if (!fiber)
            tp_futex_sleep(&h->seq, q, &h->sleepers, -1, c->shared);
        else if ((st = yield_to_peers(err)) != TP_OK)
            return st;
    }
}

tp_status cpu_comm_barrier(cpu_comm *c, int rank, tp_err *err)
{
    if (!c)
        return tp_fail(err, TP_INVALID, "cpu_comm_barrier: no communicator");
    if (rank < 0 || rank >= c->world)
        return tp_fail(err, TP_INVALID, "cpu_comm_barrier: rank %d out of range for world size %d",
                       rank, c->world);
    return barrier_wait(c, rank, 1, err);
}

/* ---------------------------------------------------------------- views */

/* Whether every byte t can touch lies in [base, base + span). */
static int inside_shared(const cpu_comm *c, const tp_tensor *t)
{
    int64_t lo = 0, hi = 0, es = (int64_t)tp_dtype_size(t->dtype);
    if (t->ndim < 0 || t->ndim > TP_MAX_DIMS)
        return 0;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] == 0)
            return 1; /* nothing is read */
        int64_t span = (t->shape[d] - 1) * t->stride[d];
        if (span < 0)
            lo += span;
        else
            hi += span;
    }
    uintptr_t p = (uintptr_t)t->data;
    uintptr_t first = p + (uintptr_t)(lo * es), last = p + (uintptr_t)(hi * es + es);
    return first >= c->base && first <= last && last - c->base <= c->span;
}

/* Fills the input half of a slot: by value, data as an offset. */
static void publish_in(const cpu_comm *c, cpu_slot *s, const tp_tensor *in)
{
    if (!in)
        return;
    s->has_in = 1;
    s->in = *in;
    s->in.data = NULL;
    s->in_off = (uint64_t)((uintptr_t)in->data - c->base); /* wraps harmlessly for threads */
    s->in_outside = c->span && !inside_shared(c, in);
}

/* Rank r's published input in this process's address space. */
static tp_tensor peer_in(const cpu_comm *c, int r)
{
    tp_tensor t = c->slot[r].in;
    t.data = (void *)(c->base + (uintptr_t)c->slot[r].in_off);
    return t;
}

/* ------------------------------------------------------------ validation */

static const char *shp(char *buf, const tp_tensor *t) { return tp_shape_str(buf, 96, t->ndim, t->shape); }

static tp_status check_dim(const char *name, const char *what, int dim, const tp_tensor *in, tp_err *err)
{
    char b[96];
    if (dim < 0 || dim >= in->ndim)
        return tp_fail(err, TP_INVALID, "%s: %s %d out of range for input of shape %s", name, what,
                       dim, shp(b, in));
    return TP_OK;
}

static tp_status check_divisible(const char *name, const char *what, int dim, const tp_tensor *in,
                                 int d, tp_err *err)
{
    char b[96];
    if (in->shape[dim] % d != 0)
        return tp_fail(err, TP_INVALID,
                       "%s: %s %d of input shape %s has size %lld, not divisible by world size %d",
                       name, what, dim, shp(b, in), (long long)in->shape[dim], d);
    return TP_OK;
}

/* Expected local output shape for op given the (common) input shape. */
static tp_status expected_out(const cpu_slot *s, const tp_tensor *in, int d, tp_tensor *exp,
                              tp_err *err)
{
    const char *name = tp_op_name(s->op);
    tp_status st;
    *exp = *in;
    switch (s->op) {
    case TP_OP_ALL_GATHER:
        if ((st = check_dim(name, "dim", s->dim, in, err)) != TP_OK)
            return st;
        exp->shape[s->dim] *= d;
        return TP_OK;
    case TP_OP_REDUCE_SCATTER:
        if ((st = check_dim(name, "dim", s->dim, in, err)) != TP_OK ||
            (st = check_divisible(name, "dim", s->dim, in, d, err)) != TP_OK)
            return st;
        if (s->reduce != TP_REDUCE_SUM && s->reduce != TP_REDUCE_AVG)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum or avg)", name,
                           (int)s->reduce);
        exp->shape[s->dim] /= d;
        return TP_OK;
    case TP_OP_ALL_REDUCE:
        if (s->reduce != TP_REDUCE_SUM && s->reduce != TP_REDUCE_AVG && s->reduce != TP_REDUCE_MAX)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum, avg or max)", name,
                           (int)s->reduce);
        return TP_OK;
    case TP_OP_ALL_TO_ALL:
        if ((st = check_dim(name, "split_dim", s->split_dim, in, err)) != TP_OK ||
            (st = check_dim(name, "concat_dim", s->concat_dim, in, err)) != TP_OK ||
            (st = check_divisible(name, "split_dim", s->split_dim, in, d, err)) != TP_OK)
            return st;
        exp->shape[s->split_dim] /= d;
        exp->shape[s->concat_dim] *= d;
        return TP_OK;
    case TP_OP_BROADCAST:
        return TP_OK;
    default:
        return tp_fail(err, TP_INVALID, "op '%s' is not a collective", name);
    }
}

/* Runs on every rank over all slots, so every rank reaches the same verdict
 * (the message names the offending rank). */
static tp_status validate(const cpu_comm *c, tp_err *err)
{
    int d = c->world;
    const cpu_slot *s0 = &c->slot[0];
    const char *name = tp_op_name(s0->op);
    char b1[96], b2[96], b3[96];
    for (int k = 0; k < d; k++) {
        const cpu_slot *s = &c->slot[k];
        if (!s->has_attrs)
            return tp_fail(err, TP_INVALID, "%s: rank %d passed no attrs", name, k);
        if (s->op != s0->op)
            return tp_fail(err, TP_INVALID, "collective mismatch: rank 0 runs %s, rank %d runs %s",
                           name, k, tp_op_name(s->op));
        if (s->dim != s0->dim || s->reduce != s0->reduce || s->split_dim != s0->split_dim ||
            s->concat_dim != s0->concat_dim || s->src != s0->src)
            return tp_fail(err, TP_INVALID, "%s: rank %d attrs differ from rank 0's", name, k);
    }
    if (s0->op == TP_OP_BROADCAST && (s0->src < 0 || s0->src >= d))
        return tp_fail(err, TP_INVALID, "broadcast: src %d out of range for world size %d", s0->src, d);
    /* reference input: src's for broadcast (others may pass none), else rank 0's */
    int ref = s0->op == TP_OP_BROADCAST ? s0->src : 0;
    if (!c->slot[ref].has_in)
        return tp_fail(err, TP_INVALID, "%s: rank %d passed no input", name, ref);
    const tp_tensor *rin = &c->slot[ref].in;
    if (rin->ndim < 0 || rin->ndim > TP_MAX_DIMS || (unsigned)rin->dtype >= TP_DTYPE_COUNT)
        return tp_fail(err, TP_INVALID, "%s: rank %d input has bad ndim %d or dtype %d", name, ref,
                       rin->ndim, (int)rin->dtype);
    for (int i = 0; i < rin->ndim; i++)
        if (rin->shape[i] < 0)
            return tp_fail(err, TP_INVALID, "%s: rank %d input has negative size in %s", name, ref,
                           shp(b1, rin));
    tp_tensor exp;
    tp_status st = expected_out(s0, rin, d, &exp, err);
    if (st != TP_OK)
        return st;
    for (int k = 0; k < d; k++) {
        const cpu_slot *s = &c->slot[k];
        if (s0->op != TP_OP_BROADCAST) {
            if (!s->has_in)
                return tp_fail(err, TP_INVALID, "%s: rank %d passed no input", name, k);
            if (s->in.dtype != rin->dtype)
                return tp_fail(err, TP_INVALID, "%s: rank %d input dtype %s differs from rank 0's %s",
                               name, k, tp_dtype_name(s->in.dtype), tp_dtype_name(rin->dtype));
            if (!tp_tensor_same_shape(&s->in, rin))
                return tp_fail(err, TP_INVALID, "%s: rank %d input shape %s differs from rank 0's %s",
                               name, k, shp(b1, &s->in), shp(b2, rin));
        }
        /* peers read it through the shared mapping, so it must be there */
        if ((s0->op != TP_OP_BROADCAST || k == ref) && s->in_outside)
            return tp_fail(err, TP_INVALID,
                           "%s: rank %d input is not in the rank group's shared memory (allocate it with the "
                           "backend)",
                           name, k);
        if (!s->has_out)
            return tp_fail(err, TP_INVALID, "%s: rank %d passed no output", name, k);
        if (s->out.dtype != rin->dtype)
            return tp_fail(err, TP_INVALID, "%s: rank %d output dtype %s differs from input dtype %s",
                           name, k, tp_dtype_name(s->out.dtype), tp_dtype_name(rin->dtype));
        if (!tp_tensor_same_shape(&s->out, &exp))
            return tp_fail(err, TP_INVALID,
                           "%s (dim %d, split_dim %d, concat_dim %d) over %d ranks: rank %d output "
                           "shape %s, expected %s for input shape %s",
                           name, s0->dim, s0->split_dim, s0->concat_dim, d, k, shp(b1, &s->out),
                           shp(b2, &exp), shp(b3, rin));
    }
    return TP_OK;
}

/* ----------------------------------------------------------- reductions */

static int64_t load_i64(const void *p, tp_dtype t, int64_t i)
{
    return t == TP_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

static void store_i64(void *p, tp_dtype t, int64_t i, int64_t v)
{
    if (t == TP_I32)
        ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; /* wraps */
    else
        ((int64_t *)p)[i] = v;
}

static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

static int all_contiguous(const tp_tensor *v, int d, const tp_tensor *out)
{
    if (!tp_tensor_is_contiguous(out))
        return 0;
    for (int r = 0; r < d; r++)
        if (!tp_tensor_is_contiguous(&v[r]))
            return 0;
    return 1;
}

/* Reduces one run of m elements: element i of rank r lives at
 * base[r] + i*step[r] of view r; the result goes to out at obase + i*ostep. */
static void reduce_run(const tp_tensor *v, const int64_t *base, const int64_t *step, int d,
                       tp_tensor *out, int64_t obase, int64_t ostep, int64_t m, tp_reduce red)
{
    tp_dtype dt = out->dtype;
    if (tp_dtype_is_float(dt)) {
        float acc[RED_CHUNK];
        for (int r = 0; r < d; r++) {
            const void *p = v[r].data;
            int64_t b = base[r], s = step[r];
            if (r == 0) {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = tp_load_f32(p, dt, b + i * s);
            } else if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++) {
                    float x = tp_load_f32(p, dt, b + i * s);
                    if (x > acc[i] || isnan(x))
                        acc[i] = x;
                }
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] += tp_load_f32(p, dt, b + i * s);
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= (float)d;
        for (int64_t i = 0; i < m; i++)
            tp_store_f32(out->data, dt, obase + i * ostep, acc[i]);
    } else {
        int64_t acc[RED_CHUNK];
        for (int r = 0; r < d; r++) {
            const void *p = v[r].data;
            int64_t b = base[r], s = step[r];
            if (r == 0) {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = load_i64(p, dt, b + i * s);
            } else if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++) {
                    int64_t x = load_i64(p, dt, b + i * s);
                    if (x > acc[i])
                        acc[i] = x;
                }
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = wrap_add(acc[i], load_i64(p, dt, b + i * s));
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= d; /* truncates toward zero */
        for (int64_t i = 0; i < m; i++)
            store_i64(out->data, dt, obase + i * ostep, acc[i]);
    }
}

/* Elements i0 .. i0 + m - 1 of a contiguous float tensor as FP32: the
 * tensor's own memory (FP32), or widened into buf (FP16/BF16). */
static const float *chunk_of(const tp_tensor *t, int64_t i0, int64_t m, float *buf)
{
    if (t->dtype == TP_F32)
        return (const float *)t->data + i0;
    narrow_rows_load((const uint16_t *)t->data + i0, t->dtype, m, buf);
    return buf;
}

/* Contiguous float tensors: reduce_run's arithmetic (widen, accumulate in
 * rank order, round once to the dtype) a chunk at a time, without its
 * per-element dtype dispatch. FP16/BF16 chunks are widened and rounded
 * eight elements at a time (narrow_rows.h, bit for bit dtype.h's
 * conversions): one at a time, an FP16 GPT-2's all_reduces were 13% of
 * its samples at ws 2. */
static void reduce_float_contig(const tp_tensor *v, int d, tp_tensor *out, int64_t n, tp_reduce red)
{
    for (int64_t i0 = 0; i0 < n; i0 += RED_CHUNK) {
        int64_t m = n - i0 < RED_CHUNK ? n - i0 : RED_CHUNK;
        float acc[RED_CHUNK], x[RED_CHUNK];
        const float *first = chunk_of(&v[0], i0, m, acc);
        if (first != acc)
            memcpy(acc, first, (size_t)m * sizeof(float));
        for (int r = 1; r < d; r++) {
            const float *p = chunk_of(&v[r], i0, m, x);
            if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++)
                    if (p[i] > acc[i] || isnan(p[i]))
                        acc[i] = p[i];
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] += p[i];
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= (float)d;
        if (out->dtype == TP_F32)
            memcpy((float *)out->data + i0, acc, (size_t)m * sizeof(float));
        else
            narrow_rows_store((uint16_t *)out->data + i0, out->dtype, m, acc);
    }
}

/* out = reduce over r of v[r]; every v[r] has out's shape and dtype. */
static tp_status reduce_views(const tp_tensor *v, int d, tp_tensor *out, tp_reduce red, tp_err *err)
{
    int64_t n = tp_tensor_numel(out);
    if (n == 0)
        return TP_OK;
    if (tp_dtype_is_float(out->dtype) && all_contiguous(v, d, out)) {
        reduce_float_contig(v, d, out, n, red);
        return TP_OK;
    }
    int64_t *base = malloc(2 * (size_t)d * sizeof *base);
    if (!base)
        return tp_fail(err, TP_NOMEM, "%s: out of memory", "reduction");
    int64_t *step = base + d;
    int nd = out->ndim;
    int flat = all_contiguous(v, d, out);
    int64_t inner = flat ? n : (nd ? out->shape[nd - 1] : 1);
    int64_t rows = n / inner;
    int64_t idx[TP_MAX_DIMS] = {0};
    for (int r = 0; r < d; r++)
        step[r] = flat ? 1 : (nd ? v[r].stride[nd - 1] : 0);
    int64_t ostep = flat ? 1 : (nd ? out->stride[nd - 1] : 0);
    for (int64_t row = 0; row < rows; row++) {
        int64_t ob = 0;
        for (int k = 0; k < nd - 1; k++)
            ob += idx[k] * out->stride[k];
        for (int64_t i0 = 0; i0 < inner; i0 += RED_CHUNK) {
            int64_t m = inner - i0 < RED_CHUNK ? inner - i0 : RED_CHUNK;
            for (int r = 0; r < d; r++) {
                int64_t b = i0 * step[r];
                for (int k = 0; k < nd - 1; k++)
                    b += idx[k] * v[r].stride[k];
                base[r] = b;
            }
            reduce_run(v, base, step, d, out, ob + i0 * ostep, ostep, m, red);
        }
        for (int k = nd - 2; k >= 0; k--) { /* next row */
            if (++idx[k] < out->shape[k])
                break;
            idx[k] = 0;
        }
    }
    free(base);
    return TP_OK;
}

/* -------------------------------------------------------------- compute */

static tp_status compute(cpu_comm *c, int rank, tp_tensor *out, tp_err *err)
{
    int d = c->world;
    const cpu_slot *s = &c->slot[rank];
    switch (s->op) {
    case TP_OP_ALL_GATHER: {
        int64_t len = c->slot[0].in.shape[s->dim];
        for (int r = 0; r < d; r++) {
            tp_tensor dst = tp_tensor_narrow(out, s->dim, r * len, len), src = peer_in(c, r);
            tp_tensor_copy(&dst, &src);
        }
        return TP_OK;
    }
    case TP_OP_ALL_TO_ALL: {
        int64_t chunk = c->slot[0].in.shape[s->split_dim] / d;
        int64_t clen = s->split_dim == s->concat_dim ? chunk : c->slot[0].in.shape[s->concat_dim];
        for (int j = 0; j < d; j++) {
            tp_tensor peer = peer_in(c, j);
            tp_tensor src = tp_tensor_narrow(&peer, s->split_dim, rank * chunk, chunk);
            tp_tensor dst = tp_tensor_narrow(out, s->concat_dim, j * clen, clen);
            tp_tensor_copy(&dst, &src);
        }
        return TP_OK;
    }
    case TP_OP_BROADCAST: {
        tp_tensor src = peer_in(c, s->src);
        if (src.data == out->data && !memcmp(src.stride, out->stride, sizeof out->stride))
            return TP_OK; /* in place on the src rank */
        tp_tensor_copy(out, &src);
        return TP_OK;
    }
    case TP_OP_ALL_REDUCE:
    case TP_OP_REDUCE_SCATTER: {
        tp_tensor *v = malloc((size_t)d * sizeof *v);
        if (!v)
            return tp_fail(err, TP_NOMEM, "%s: out of memory", tp_op_name(s->op));
        for (int r = 0; r < d; r++) {
            v[r] = peer_in(c, r);
            if (s->op == TP_OP_REDUCE_SCATTER) {
                int64_t chunk = v[r].shape[s->dim] / d;
                v[r] = tp_tensor_narrow(&v[r], s->dim, rank * chunk, chunk);
            }
        }
        tp_status st = reduce_views(v, d, out, s->reduce, err);
        free(v);
        return st;
    }
    default:
        return tp_fail(err, TP_INTERNAL, "op '%s' is not a collective", tp_op_name(s->op));
    }
}

tp_status cpu_collective_run(cpu_comm *c, int rank, tp_op op, const tp_attrs *attrs,
                             const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    if (!c)
        return tp_fail(err, TP_INVALID, "%s: no communicator", tp_op_name(op));
    if (rank < 0 || rank >= c->world)
        return tp_fail(err, TP_INVALID, "%s: rank %d out of range for world size %d",
                       tp_op_name(op), rank, c->world);
    cpu_slot *s = &c->slot[rank];
    memset(s, 0, sizeof *s);
    publish_in(c, s, in);
    if (out) {
        s->has_out = 1;
        s->out = *out;
        s->out.data = NULL; /* only its shape and dtype are checked */
    }
    s->op = op;
    if (attrs) {
        s->has_attrs = 1;
        s->dim = attrs->dim;
        s->reduce = attrs->reduce;
        s->split_dim = attrs->split_dim;
        s->concat_dim = attrs->concat_dim;
        s->src = attrs->src;
        /* attrs an op does not use must not make ranks disagree */
        if (op != TP_OP_ALL_GATHER && op != TP_OP_REDUCE_SCATTER)
            s->dim = 0;
        if (op != TP_OP_REDUCE_SCATTER && op != TP_OP_ALL_REDUCE)
            s->reduce = TP_REDUCE_SUM;
        if (op != TP_OP_ALL_TO_ALL)
            s->split_dim = s->concat_dim = 0;
        if (op != TP_OP_BROADCAST)
            s->src = 0;
    }
    tp_status st = barrier_wait(c, rank, 1, err);
    if (st != TP_OK)
        return st;
    st = validate(c, err);
    if (st == TP_OK)
        st = compute(c, rank, out, err);
    tp_err lost;
    tp_status st2 = barrier_wait(c, rank, 0, &lost); /* not abortable: see top */
    if (st == TP_OK && st2 != TP_OK) /* lost: peers may not have finished reading */
        return tp_fail(err, st2, "%s", lost.msg);
    return st;
}

/* ---- building blocks for fused kernels and the ring all_reduce ---- */

tp_status cpu_comm_exchange(cpu_comm *c, int rank, const tp_tensor *mine, tp_err *err)
{
    if (!c || rank < 0 || rank >= c->world)
        return tp_fail(err, TP_INVALID, "cpu_comm_exchange: rank %d out of range for world size %d", rank,
                       cpu_comm_world(c));
    cpu_slot *s = &c->slot[rank];
    memset(s, 0, sizeof *s);
    publish_in(c, s, mine);
    tp_status st = barrier_wait(c, rank, 1, err);
    if (st != TP_OK || !c->span)
        return st;
    /* Shared mode: every rank checks every slot, so all agree; on failure
     * nobody may rewrite its slot before all have looked, hence the barrier. */
    for (int k = 0; k < c->world && st == TP_OK; k++)
        if (!c->slot[k].has_in || c->slot[k].in_outside)
            st = tp_fail(err, TP_INVALID,
                         "cpu_comm_exchange: rank %d published a tensor that is not in the rank group's shared "
                         "memory (allocate it with the backend)",
                         k);
    if (st != TP_OK)
        barrier_wait(c, rank, 0, NULL);
    return st;
}

tp_tensor cpu_comm_peer(const cpu_comm *c, int r) { return peer_in(c, r); }

tp_status cpu_comm_release(cpu_comm *c, int rank, tp_err *err)
{
    return barrier_wait(c, rank, 0, err); /* not abortable: see top */
}

/* dst[i] = dst[i] (op) src[i] over one chunk, in the tensor's dtype;
 * FP16/BF16 RED_CHUNK elements at a time through narrow_rows.h (the same
 * bits as element by element). */
static void combine_chunk(void *dst, const void *src, tp_dtype t, int64_t begin, int64_t end, tp_reduce red)
{
    if (t == TP_F16 || t == TP_BF16) {
        for (int64_t i0 = begin; i0 < end; i0 += RED_CHUNK) {
            int64_t m = end - i0 < RED_CHUNK ? end - i0 : RED_CHUNK;
            float a[RED_CHUNK], b[RED_CHUNK];
            narrow_rows_load((const uint16_t *)dst + i0, t, m, a);
            narrow_rows_load((const uint16_t *)src + i0, t, m, b);
            for (int64_t i = 0; i < m; i++)
                a[i] = red == TP_REDUCE_MAX ? (a[i] >= b[i] || isnan(a[i]) ? a[i] : b[i]) : a[i] + b[i];
            narrow_rows_store((uint16_t *)dst + i0, t, m, a);
        }
        return;
    }
    for (int64_t i = begin; i < end; i++) {
        if (tp_dtype_is_float(t)) {
            float a = tp_load_f32(dst, t, i), b = tp_load_f32(src, t, i);
            tp_store_f32(dst, t, i, red == TP_REDUCE_MAX ? (a >= b || isnan(a) ? a : b) : a + b);
        } else {
            int64_t a = load_i64(dst, t, i), b = load_i64(src, t, i);
            store_i64(dst, t, i, red == TP_REDUCE_MAX ? (a > b ? a : b) : wrap_add(a, b));
        }
    }
}

static void finish_avg(void *p, tp_dtype t, int64_t begin, int64_t end, int d)
{
    for (int64_t i = begin; i < end; i++) {
        if (tp_dtype_is_float(t))
            tp_store_f32(p, t, i, tp_load_f32(p, t, i) / (float)d);
        else
            store_i64(p, t, i, load_i64(p, t, i) / d);
    }
}

/* Ring all_reduce in out (contiguous): d-1 reduce-scatter steps, each rank
 * adding its left neighbour's partial of one chunk, then d-1 all-gather
 * steps copying finished chunks around. At step s rank r writes chunk
 * (r-1-s) while its right neighbour reads chunk (r-s): never the same one,
 * and a barrier separates steps. Every rank ends with copies of the same
 * finished chunks, so results are identical across ranks (though summed in
 * another order than the one-shot path). */
tp_status cpu_ring_all_reduce(cpu_comm *c, int rank, const tp_attrs *attrs, const tp_tensor *in, tp_tensor *out,
                              tp_err *err)
{
    int d = c->world, left = (rank + d - 1) % d;
    tp_tensor_copy(out, in);
    tp_status st = cpu_comm_exchange(c, rank, out, err);
    if (st != TP_OK)
        return st;
    int64_t n = tp_tensor_numel(out);
    const void *lp = cpu_comm_peer(c, left).data;
    size_t es = tp_dtype_size(out->dtype);
    /* the step barriers are not abortable (see top); they fail only when lost */
    for (int s = 0; s < d - 1 && st == TP_OK; s++) {
        int k = ((rank - 1 - s) % d + d) % d;
        combine_chunk(out->data, lp, out->dtype, k * n / d, (k + 1) * n / d, attrs->reduce);
        st = barrier_wait(c, rank, 0, err);
    }
    int own = (rank + 1) % d;
    if (st == TP_OK && attrs->reduce == TP_REDUCE_AVG)
        finish_avg(out->data, out->dtype, own * n / d, (own + 1) * n / d, d);
    if (st == TP_OK)
        st = barrier_wait(c, rank, 0, err);
    for (int s = 0; s < d - 1 && st == TP_OK; s++) {
        int k = ((rank - s) % d + d) % d;
        int64_t b = k * n / d, e = (k + 1) * n / d;
        memcpy((char *)out->data + b * (int64_t)es, (const char *)lp + b * (int64_t)es, (size_t)(e - b) * es);
        st = barrier_wait(c, rank, 0, err);
    }
    return st;
}
