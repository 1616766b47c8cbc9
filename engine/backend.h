/* backend.h — what a device must provide to run a plan (ggml's
 * {iface, context} shape). One backend object serves all ranks of a group;
 * every call names its rank and is made from that rank's thread.
 *
 * Capture contract (the same for a CUDA graph and the cpu command list):
 *  1. between begin_capture and end_capture, run_op and collective are
 *     recorded, not executed; every pointer they receive is baked in;
 *  2. no allocation may happen during capture (alloc fails with a message);
 *  3. replay executes the record with those exact pointers, so buffers must
 *     outlive the capture and never move.
 * Symmetric contract: alloc_symmetric is called by every rank with the same
 * size, in the same order, and returns memory at the same offset of each
 * rank's symmetric arena, addressable by every peer. */
#ifndef TP_BACKEND_H
#define TP_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "backend_settings.h"
#include "dtype.h"
#include "ops.h"
#include "status.h"
#include "tensor.h"

typedef struct tp_backend tp_backend;
typedef struct tp_capture tp_capture;

typedef struct tp_backend_iface {
    const char *name;
    /* Rank memory is plain host memory (cpu): loaders may write it directly. */
    int host_addressable;
    /* Run each partition once eagerly before capturing it (NCCL makes its
     * connections on first use, which must not happen inside a capture). */
    int warm_up_before_capture;
    /* A rank waiting for its peers (collectives) yields to them when the
     * ranks run as fibers of one thread (util/fiber.h), so a thread group
     * may run a short step's ranks in turn (tp_rank_group_set_serial). */
    int ranks_may_share_thread;
    /* Regular device memory for one rank, 64-byte aligned. */
    tp_status (*alloc)(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err);
    /* Peer-addressable memory at identical offsets on every rank. */
    tp_status (*alloc_symmetric)(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err);
    void (*free)(tp_backend *b, int rank, void *p);
    /* Host -> rank memory; ordered before the rank's next kernel (async DMA on cuda). */
    tp_status (*copy_in)(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err);
    /* Rank memory -> host; complete when it returns. */
    tp_status (*copy_out)(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err);
    /* A compute or copy op (kind COMPUTE/COPY). */
    tp_status (*run_op)(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                        int n_ins, tp_tensor *out, tp_err *err);
    /* A collective or fused comm+compute node (kind COLLECTIVE/FUSED); every
     * rank calls it in the same order. ins[0] is the communicated operand
     * (every such op's descriptor has comm_input 0);
     * fused_matmul_reduce_scatter gets its symmetric workspace last. */
    tp_status (*collective)(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                            int n_ins, tp_tensor *out, tp_err *err);
    /* Optional (NULL: nothing to prepare). Once param w is loaded into
     * rank memory: w is read only as the b of matmuls ([K, N], or [N, K]
     * when transpose_b), never changes, and lives until freed. The
     * backend may keep a faster layout of it (cpu: panels packed for its
     * own GEMM). sole: every reader of w is such a matmul of exactly this
     * view, so the backend may overwrite w with that layout. */
    tp_status (*prepare_matmul_weight)(tp_backend *b, int rank, tp_tensor *w, int transpose_b, int sole,
                                       tp_err *err);
    tp_status (*begin_capture)(tp_backend *b, int rank, tp_err *err);
    tp_status (*end_capture)(tp_backend *b, int rank, tp_capture **out, tp_err *err);
    tp_status (*replay)(tp_backend *b, int rank, tp_capture *c, tp_err *err);
    void (*capture_free)(tp_backend *b, tp_capture *c);
    /* Waits until the rank's queued work is done. */
    tp_status (*synchronize)(tp_backend *b, int rank, tp_err *err);
    /* A rank failed: wake every peer blocked in a collective (they fail). */
    void (*abort)(tp_backend *b);
    /* A rank's process is gone: fail every wait, even those that normally
     * must complete (the peer will never arrive). Permanent. */
    void (*peer_lost)(tp_backend *b);
    /* Clears the aborted state once no rank is running. */
    void (*reset)(tp_backend *b);
    /* Optional (NULL: never). Why this process's backend can never run
     * again (cuda: a sticky CUDA error, an NCCL error, a revoked
     * communicator), else NULL; the string lives as long as the backend.
     * Thread-safe: the engine asks it after a failed step. */
    const char *(*dead)(tp_backend *b);
    /* Optional (NULL: the backend learns of every failure in its own
     * calls). Asked from the rank group's watchdog thread while a step is in
     * flight (tp_rank_hooks.fault): an error reported asynchronously that
     * the step's waits would not return with (cuda: ncclCommGetAsyncError
     * while the rank blocks on a collective that will never complete). It
     * leaves the backend dead with that error and returns it (the abort
     * that follows then wakes the waits); NULL when there is none. */
    const char *(*fault)(tp_backend *b);
    /* Optional (NULL: never). Nonzero once the device may still run work
     * that never completes (cuda: NCCL kernels of captured graphs after a
     * revoke): nothing waits on the device any more, destroy releases
     * nothing on it, and the process must exit (tp_engine_must_exit).
     * Thread-safe. */
    int (*must_exit)(tp_backend *b);
    void (*destroy)(tp_backend *b);
} tp_backend_iface;

struct tp_backend {
    const tp_backend_iface *iface;
    const struct tp_backend_kind *kind; /* the registry entry it was made from */
    void *ctx;
    int world;
    char note[448]; /* for the startup log: why "auto" chose it, what kernels it runs; or empty */
};

/* How collectives are lowered (choose_collectives): an all_reduce of at
 * most one_shot_max_bytes per rank goes one_shot (every rank reads every
 * peer's symmetric buffer); a larger one goes large_all_reduce; every other
 * collective goes other_collectives. Thresholds by world size 1..8 (8 also
 * for more). */
typedef struct {
    int64_t one_shot_max_bytes[9];
    tp_algo large_all_reduce;
    tp_algo other_collectives;
} tp_lowering;

/* One-shot thresholds after vLLM's custom all-reduce and TensorRT-LLM's
 * tables: one-shot pays d-1 full reads per rank, so its break-even falls as
 * d grows. A backend's caps start from these unless measured otherwise. */
#define TP_ONE_SHOT_MAX_BYTES_DEFAULT \
    {0, 1 << 20, 1 << 20, 512 << 10, 512 << 10, 256 << 10, 256 << 10, 256 << 10, 256 << 10}

/* What a backend can do, known without a device: planning (`tpserve plan
 * --backend NAME`) and the passes read these, never the backend's name. */
typedef struct {
    tp_lowering lowering; /* without symmetric memory: every threshold 0, no one_shot lowering */
    int dma_input_copies; /* copy_in is an async DMA into device memory, not a memcpy */
    int f32_activations;  /* FP16/BF16 graphs keep activations in FP32 (pass widen_activations) */
} tp_backend_caps;

/* The part of a process rank group a backend uses (engine/backend.c fills
 * it from the group, so backends never include the rank group). */
typedef struct {
    int world, rank_lo, rank_hi; /* this process runs ranks [rank_lo, rank_hi) */
    int leads;                   /* rank 0's process */
    char *base;                  /* the shared mapping, in this process */
    size_t comm_offset, comm_bytes, heap_offset, heap_bytes, staging_offset, staging_bytes;
    struct tp_rank_group *group; /* for kinds whose creation is itself steps of the group */
} tp_backend_group;

/* One backend in the registry (engine/backend.c lists them). */
typedef struct tp_backend_kind {
    const char *name;
    const tp_backend_caps *caps;
    /* Whether the backend can run op producing dtype (sources and views run
     * nothing). A graph using an op it cannot run is refused at load. */
    int (*supports_op)(tp_op op, tp_dtype dtype);
    /* How many devices this process could drive; when none, why. */
    int (*probe)(char *why, size_t len);
    int one_rank_per_process; /* several ranks need a process group (one process per device) */
    int share_before_join;    /* the group message goes out before the leader joins (its join blocks
                                 until every rank joins); else after (the leader's join sets up what
                                 workers attach to) */
    /* world ranks as threads of this process. */
    tp_status (*create)(int world, const tp_backend_settings *s, tp_backend **out, tp_err *err);
    /* Process groups: the leader writes what every process needs to join
     * (cuda: an NCCL id; cpu: nothing) before joining itself; every process
     * then joins with that message. */
    tp_status (*group_message)(char *msg, size_t cap, tp_err *err);
    tp_status (*group_join)(const tp_backend_group *g, const char *msg, const tp_backend_settings *s,
                            tp_backend **out, tp_err *err);
    /* Before the server re-executes itself at startup: sets what the
     * backend's libraries read from the environment as they load (cpu:
     * OPENBLAS_CORETYPE, kernels/cpu/blas_pick.h; tp_engine_prepare_exec
     * calls them). 1 when it changed the environment. NULL: nothing to set. */
    int (*prepare_exec)(void);
} tp_backend_kind;

/* The registered backend called name, or NULL; the default one (cpu). */
const tp_backend_kind *tp_backend_default(void);
const tp_backend_kind *tp_backend_find(const char *name);
/* The kind a backend name means for world ranks as threads ("auto"
 * probes for devices; NULL name: cpu); an error naming the registered
 * backends when unknown. */
tp_status tp_backend_pick(const char *name, int world, const tp_backend_kind **out, tp_err *err);
/* "cpu, cuda": the registered names, for messages. */
const char *tp_backend_names(void);

/* Creates a backend by name: a registered one, or "auto" (the first that
 * can drive world ranks here, else cpu, saying why in note). Fails with a
 * clear reason when it cannot. Settings NULL: defaults. */
tp_status tp_backend_create(const char *name, int world, tp_backend **out, tp_err *err);
tp_status tp_backend_create_with(const char *name, int world, const tp_backend_settings *s, tp_backend **out,
                                 tp_err *err);

/* The backend for a rank group's local ranks. In a process group the
 * leader's choice is shared with every worker (so "auto" decides once), and
 * its group message (an NCCL id) travels with it. */
struct tp_rank_group;
tp_status tp_backend_create_for_group(const char *name, const tp_backend_settings *s, struct tp_rank_group *rg,
                                      tp_backend **out, tp_err *err);

/* Whether b can run every node of g; else an error naming the first node,
 * its op and the backend. */
struct tp_graph;
tp_status tp_backend_check_graph(const tp_backend_kind *k, const struct tp_graph *g, tp_err *err);

/* NULL while b can still run; else why it never will (iface dead). */
static inline const char *tp_backend_dead(tp_backend *b)
{
    return b && b->iface->dead ? b->iface->dead(b) : NULL;
}

/* NULL, or the asynchronous error iface fault found (and failed b for). */
static inline const char *tp_backend_fault(tp_backend *b)
{
    return b && b->iface->fault ? b->iface->fault(b) : NULL;
}

/* Whether b's process must exit (iface must_exit). */
static inline int tp_backend_must_exit(tp_backend *b)
{
    return b && b->iface->must_exit ? b->iface->must_exit(b) : 0;
}

static inline void tp_backend_destroy(tp_backend *b)
{
    if (b)
        b->iface->destroy(b);
}

#endif
