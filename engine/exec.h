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
 * been through passes; it is not changed or kept. */
tp_status tp_exec_create(const tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                         const tp_weights *w, const tp_exec_opts *o, tp_exec **out, tp_err *err);
void tp_exec_free(tp_exec *x);
int64_t tp_exec_batch(const tp_exec *x);
const tp_plan *tp_exec_plan(const tp_exec *x);
/* The executable's own lowered graph. */
const tp_graph *tp_exec_graph(const tp_exec *x);
/* Global (unsharded) output i as a contiguous descriptor with data NULL. */
tp_tensor tp_exec_output_desc(const tp_exec *x, int i);
/* Rank-local tensor of node i (where the plan put it), for tests. */
tp_tensor tp_exec_node_tensor(const tp_exec *x, int rank, int i);
/* inputs: global contiguous tensors in graph input order; outputs: global
 * contiguous tensors (from tp_exec_output_desc) in graph output order. */
tp_status tp_exec_run(tp_exec *x, const tp_tensor *inputs, tp_tensor *outputs, tp_exec_stats *stats,
                      tp_err *err);

#endif
