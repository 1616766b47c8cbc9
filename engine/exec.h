/* exec.h — a graph bound to memory for one batch bucket and captured on
 * every rank. A run copies the global inputs into the persistent input slots
 * (symmetric where peers read them), then walks the partitions: replay for a
 * captured one, eager kernels for a fallback one (writing into their hoisted
 * buffers), and copies the outputs out. Nothing is allocated per run. */
#ifndef TP_EXEC_H
#define TP_EXEC_H

#include "backend.h"
#include "graph.h"
#include "passes.h"
#include "plan.h"
#include "rank_group.h"
#include "weights.h"

typedef struct tp_exec tp_exec;

typedef struct {
    int eager; /* run every partition eagerly (no capture): for comparison */
    /* When set, collectives are lowered again at this executable's batch
     * (choose_collectives per bucket): a small bucket may go one_shot where
     * the largest goes ring/nccl. */
    const tp_pass_opts *lowering;
} tp_exec_opts;

/* Per-run statistics a caller (metrics, tests) can read back. */
typedef struct {
    int64_t input_copy_bytes[TP_MEM_KINDS]; /* bytes copied into input slots, by slot kind */
    int replays, eager_nodes;
} tp_exec_stats;

/* A copy of g inferred at batch with its collectives lowered for it
 * (choose_collectives, unless lowering is NULL or disables it): exactly
 * the graph tp_exec_create runs, which `tpserve plan` reports. */
tp_status tp_exec_lower(const tp_graph *g, int64_t batch, const tp_pass_opts *lowering, tp_graph **out,
                        tp_err *err);

/* Lowers its own copy of g (tp_exec_lower), plans memory, allocates every
 * buffer and captures each captured partition on each rank. g must have
 * been through passes; it is not changed or kept. The executable owns its
 * arenas (tp_exec_prepare + tp_exec_bind with no pool). */
tp_status tp_exec_create(const tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                         const tp_weights *w, const tp_exec_opts *o, tp_exec **out, tp_err *err);
void tp_exec_free(tp_exec *x);

/* The arenas several executables share (one per engine): per rank, one
 * allocation per arena kind (plan.h), each at least as large as that
 * arena of every plan bound into it. Executables' offsets start at each
 * arena's base, so two bound executables overlap: only one may run at a
 * time (the engine's steps never overlap), and each run rewrites all it
 * reads (inputs copied in, intermediates recomputed), so nothing one run
 * leaves there reaches another. The pool never moves while an executable
 * is bound: their captures hold its addresses. Symmetric memory is
 * allocated once per arena (cuda: one ncclMemAlloc and one NCCL window),
 * so freeing an executable frees nothing the backend registered. */
typedef struct tp_exec_pool tp_exec_pool;

/* Allocates bytes[kind] per rank (every rank, in the rank group). */
tp_status tp_exec_pool_create(tp_backend *b, tp_rank_group *rg, const int64_t bytes[TP_MEM_KINDS],
                              tp_exec_pool **out, tp_err *err);
/* Only after every executable bound into it is freed. */
void tp_exec_pool_free(tp_exec_pool *p);
/* Per-kind bytes per rank. */
void tp_exec_pool_bytes(const tp_exec_pool *p, int64_t bytes[TP_MEM_KINDS]);
/* Whether every arena of plan fits the pool. */
int tp_exec_pool_fits(const tp_exec_pool *p, const tp_plan *plan);
/* Reallocates each arena smaller than need[kind] to at least need[kind]
 * (and at least twice its size, so a pool grown for ever larger batches
 * reallocates O(log) times); the others stay. Every executable bound into
 * the pool must be freed first. On failure the arenas that could not be
 * reallocated are empty (0 bytes), and a later grow tries again. */
tp_status tp_exec_pool_grow(tp_exec_pool *p, const int64_t need[TP_MEM_KINDS], tp_err *err);

/* tp_exec_create in two halves, for a caller that sizes a pool from the
 * plans first: prepare lowers and plans (no memory, nothing captured);
 * bind allocates the executable's own arenas (pool NULL) or binds into
 * pool (refused, naming the arena, when the plan does not fit), then
 * captures. A prepared executable that is never bound is just freed. */
tp_status tp_exec_prepare(const tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                          const tp_weights *w, const tp_exec_opts *o, tp_exec **out, tp_err *err);
tp_status tp_exec_bind(tp_exec *x, tp_exec_pool *pool, tp_err *err);
/* The arenas (bytes per rank by kind) the executable of g at batch would
 * plan: what `tpserve plan` reports per bucket, without a backend. */
tp_status tp_exec_arena_bytes(const tp_graph *g, int64_t batch, const tp_pass_opts *lowering,
                              int64_t bytes[TP_MEM_KINDS], tp_err *err);
int64_t tp_exec_batch(const tp_exec *x);
const tp_plan *tp_exec_plan(const tp_exec *x);
/* The executable's own lowered graph. */
const tp_graph *tp_exec_graph(const tp_exec *x);
/* Global (unsharded) output i as a contiguous descriptor with data NULL. */
tp_tensor tp_exec_output_desc(const tp_exec *x, int i);
/* Rank-local tensor of node i (where the plan put it), for tests. */
tp_tensor tp_exec_node_tensor(const tp_exec *x, int rank, int i);
/* inputs: global contiguous tensors in graph input order; outputs: global
 * contiguous tensors (from tp_exec_output_desc) in graph output order, or
 * with fewer rows along dim 0: each takes that many of the output's first
 * rows (a padded batch's own rows). */
tp_status tp_exec_run(tp_exec *x, const tp_tensor *inputs, tp_tensor *outputs, tp_exec_stats *stats,
                      tp_err *err);

#endif
