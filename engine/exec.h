/* exec.h — a graph bound to memory for one batch size and captured on every
 * rank: run() copies global inputs into the rank input slots, replays the
 * capture and assembles the global outputs. Nothing is allocated per run. */
#ifndef TP_EXEC_H
#define TP_EXEC_H

#include "backend.h"
#include "graph.h"
#include "rank_group.h"
#include "weights.h"

typedef struct tp_exec tp_exec;

/* Infers g for batch, allocates every buffer and captures each rank. */
tp_status tp_exec_create(tp_graph *g, int64_t batch, tp_backend *b, tp_rank_group *rg,
                         const tp_weights *w, tp_exec **out, tp_err *err);
void tp_exec_free(tp_exec *x);
int64_t tp_exec_batch(const tp_exec *x);
/* Global (unsharded) output i's shape and dtype as a contiguous descriptor
 * with data NULL; the caller points data at its own buffer. */
tp_tensor tp_exec_output_desc(const tp_exec *x, int i);
/* inputs: global contiguous tensors in graph input order; outputs: global
 * contiguous tensors (from tp_exec_output_desc) in graph output order. */
tp_status tp_exec_run(tp_exec *x, const tp_tensor *inputs, tp_tensor *outputs, tp_err *err);

#endif
