/* rank_group.h — the d ranks of a tensor-parallel group, and how one step
 * (load a rank's weights, capture, run a batch) reaches all of them.
 *
 * Two shapes behind one interface:
 *  - threads: every rank is a persistent thread of this process (the cpu
 *    backend's default; symmetric memory is ordinary memory);
 *  - processes: one process per rank, as NCCL wants one per GPU. Rank 0 (the
 *    leader, the HTTP front) either starts ranks 1..d-1 as workers running
 *    `worker_argv`, or accepts externally started ones (RANK, WORLD_SIZE and
 *    a rendezvous socket, torchrun-style). All processes map one shared
 *    memory: a control block carrying every step in lockstep, the host
 *    staging area for request inputs and outputs, and (cpu) each rank's heap.
 *
 * Every process runs the same deterministic sequence of steps (SPMD); the
 * leader decides what comes next and the workers follow its messages.
 * A run returns the same status in every process: the first failure in time
 * wins, named "rank r: ...". A worker that dies makes the group lost: the
 * step in flight fails with a message naming its rank, pid and exit, and
 * every later step fails at once — never a hang. */
#ifndef TP_RANK_GROUP_H
#define TP_RANK_GROUP_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tp_rank_group tp_rank_group;
typedef tp_status (*tp_rank_fn)(void *ctx, int rank, tp_err *err);

typedef enum {
    TP_GROUP_THREADS,   /* every rank a thread of this process */
    TP_GROUP_PROCESSES, /* this process is rank 0; ranks 1..d-1 are processes */
    TP_GROUP_WORKER,    /* this process is rank `rank` of a leader's group */
} tp_group_mode;

#define TP_GROUP_MAX_PROCESSES 64

typedef struct {
    tp_group_mode mode;
    int world;
    /* PROCESSES: argv the leader execs for each worker (NULL-terminated,
     * argv[0] a path); each gets TP_RANK, TP_WORLD_SIZE and TP_GROUP_FD in
     * its environment. NULL with rendezvous set: wait for external ranks. */
    char *const *worker_argv;
    /* PROCESSES without worker_argv: the unix socket path to listen on.
     * WORKER: the path to connect to (NULL: TP_GROUP_FD from the leader). */
    const char *rendezvous;
    /* The rendezvous's group secret, which a joining rank's hello carries
     * (spawned workers need none: they inherit the memory itself, never
     * reaching a socket). PROCESSES: the file to read it from (64 hex
     * digits; owned by this process's uid, no access for group or others),
     * or NULL: a new one from getrandom, written to "<rendezvous>.secret"
     * (created anew, mode 0600, removed once the rendezvous ends). WORKER:
     * the file to read (NULL: "<rendezvous>.secret"). */
    const char *secret_file;
    /* PROCESSES with rendezvous: a joiner's uid (the kernel's, SO_PEERCRED)
     * must be this process's effective uid or join_uid; -1: only the former.
     * Mind that 0, a zeroed opts', is root (who could read this process's
     * memory anyway). */
    int join_uid;
    int rank;                 /* WORKER: this process's rank, 1..world-1 */
    size_t staging_bytes;     /* PROCESSES: request staging (0: 256 MiB) */
    size_t heap_bytes;        /* PROCESSES: per-rank heap for cpu (0: 4 GiB) */
    int timeout_ms;           /* joining (0: 60000) */
    /* PROCESSES: a run step that takes longer than this loses the group
     * (a hung rank), like a dead one would; 0: no limit. Loading a rank's
     * weights is a step too, so make it generous. */
    int step_timeout_ms;
    /* A rank waiting for a peer spins this long before it sleeps, in ns
     * (0: TP_SPIN_NS, util/spin_wait.h), and never when the ranks (world)
     * outnumber `cores` (0: the cores this process may use). */
    int64_t spin_ns;
    int cores;
    /* PROCESSES, WORKER: called once when the group is found lost by its
     * peer watcher (a peer process ended, between steps or inside one), on
     * that thread, which then goes on waking waiters: it should only
     * signal (write an eventfd) and return. NULL: nobody is told. */
    void (*on_lost)(void *arg);
    void *on_lost_arg;
} tp_rank_group_opts;

/* Where the group's shared memory is, in this process's address space.
 * Offsets are the same in every process; base is not. */
typedef struct {
    char *base;
    size_t comm_offset, comm_bytes;       /* backend collectives' state */
    size_t staging_offset, staging_bytes; /* request inputs and outputs */
    size_t heap_offset, heap_bytes;       /* rank r's heap at heap_offset + r * heap_bytes */
} tp_rank_shared;

/* What a run does when a rank fails (wake peers blocked in a collective)
 * and when a rank's process is gone (fail even waits that must complete).
 * fault (optional) is asked by a process group's watchdog every tick of a
 * step in flight: an error this process's backend was told of
 * asynchronously, which the step's own waits would not return with (NCCL's
 * async error: a collective that will never complete), or NULL. When it
 * names one, the watchdog calls fail, as for a rank that failed. */
typedef struct {
    void (*fail)(void *ctx);
    void (*lost)(void *ctx);
    void *ctx;
    const char *(*fault)(void *ctx);
} tp_rank_hooks;

tp_status tp_rank_group_create(const tp_rank_group_opts *o, tp_rank_group **out, tp_err *err);
/* The leader tells its workers to quit and waits for them (killing any that
 * do not exit within a few seconds); a no-op elsewhere. Each process then
 * tears down its own backend before tp_rank_group_free unmaps the memory. */
void tp_rank_group_stop(tp_rank_group *g);
void tp_rank_group_free(tp_rank_group *g);
int tp_rank_group_world(const tp_rank_group *g);
/* The ranks this process runs: [*lo, *hi). */
void tp_rank_group_local(const tp_rank_group *g, int *lo, int *hi);
/* Whether this process decides the steps (threads, or rank 0). */
int tp_rank_group_leads(const tp_rank_group *g);
/* NULL for a thread group. */
const tp_rank_shared *tp_rank_group_shared(const tp_rank_group *g);
/* NULL while every rank is alive, else "rank group lost: why" (a string
 * that lives as long as the group and never changes once set). */
const char *tp_rank_group_lost(const tp_rank_group *g);
/* The same without looking: what a check already found (any thread). */
const char *tp_rank_group_lost_known(const tp_rank_group *g);
/* Which ranks have not finished the step in flight, for a probe asking
 * why a step takes so long (any thread; never waits, changes nothing):
 * up to cap of them in ranks[], ascending, and how many there are (0: no
 * step in flight). Only a process group's leader can tell (its control
 * block has each worker's done word); -1 elsewhere. */
int tp_rank_group_pending(const tp_rank_group *g, int *ranks, int cap);

/* Runs fn(ctx, r) on every local rank (the first on the calling thread,
 * the others on the group's threads; all on the calling thread in a serial
 * step, tp_rank_group_set_serial) and, in a process group, waits for
 * every other process's ranks to finish the same step. Returns the first
 * failing rank's status and message (prefixed "rank r: "). Not reentrant:
 * callers serialize. hooks may be NULL; they may be called on another
 * thread (a failing rank's, the watchdog's), never after run returns. */
tp_status tp_rank_group_run(tp_rank_group *g, tp_rank_fn fn, void *ctx, const tp_rank_hooks *hooks, tp_err *err);
/* The same for a batch step of `rows` rows: whether it runs serially is
 * decided among steps of its size (engine/serial_policy.h's classes);
 * tp_rank_group_run is a step of 0 rows (not a batch: loading, capture). */
tp_status tp_rank_group_run_rows(tp_rank_group *g, int64_t rows, tp_rank_fn fn, void *ctx,
                                 const tp_rank_hooks *hooks, tp_err *err);

/* Lets a thread group run a step's ranks in turn on the calling thread,
 * as fibers (util/fiber.h), instead of on its threads, whenever that has
 * been the faster of the two (engine/serial_policy.h: steps are timed, and
 * the other mode is probed now and then); a step that would take over
 * max_us serially never runs so. Only for a backend whose ranks' waits for
 * each other yield to fibers (the cpu backend's collectives); max_us 0
 * leaves it off (the default). Each step size class decides on its own
 * (tp_rank_group_run_rows). A no-op in a process group and for a
 * single rank. */
tp_status tp_rank_group_set_serial(tp_rank_group *g, int max_us, tp_err *err);
/* Steps run serially so far; the limit in effect (0: no serial steps). */
uint64_t tp_rank_group_serial_steps(const tp_rank_group *g);
int tp_rank_group_serial_max_us(const tp_rank_group *g);

/* Called by fn on rank's own thread before it returns a failure that left
 * every rank's work of this step complete (bad data found after the fact,
 * e.g. an embedding id a kernel reported at the end): the group then wakes
 * no peer for it (no hooks->fail, here or in the other processes), so a
 * backend that would have to tear its communicator down for an abort keeps
 * working. The step still fails on every rank with this message. */
void tp_rank_group_benign(tp_rank_group *g, int rank);

/* The leader's bytes to every process (a no-op in a thread group): the
 * leader passes len bytes in buf; a worker receives them into buf (cap
 * bytes) and *len. At most TP_GROUP_MESSAGE bytes. */
#define TP_GROUP_MESSAGE 4096
tp_status tp_rank_group_share(tp_rank_group *g, void *buf, size_t *len, size_t cap, tp_err *err);

/* Commands: the leader posts what the workers do next (the engine's batch
 * steps); a worker waits for the next one. next() returns TP_UNAVAILABLE
 * with "quit" when the leader shut the group down, or with why the leader
 * is gone. */
tp_status tp_rank_group_post(tp_rank_group *g, const void *cmd, size_t len, tp_err *err);
tp_status tp_rank_group_next(tp_rank_group *g, void *cmd, size_t cap, size_t *len, int *quit, tp_err *err);

/* A step is about to be run (a request arrived at an idle server): wakes
 * the sleeping rank threads now, so their wake-up (tens of microseconds on
 * a virtual machine) overlaps the caller's work before tp_rank_group_run
 * instead of the step's first collective (only when the size class of the
 * last step would run its next one on the threads). A hint: harmless when no step
 * follows (the ranks spin their budget and sleep again); a no-op where
 * ranks may not spin. In a process group the leader wakes the workers'
 * processes waiting for its next message. */
void tp_rank_group_prewake(tp_rank_group *g);

#endif
