/* plan.h — the execution plan of a graph at one batch bucket: partitions
 * (captured vs fallback), hoisted fallback outputs, input copies, and the
 * memory plan (liveness-based offsets in per-rank arenas).
 *
 * Arenas, per rank (the same layout on every rank):
 *   REGULAR    intermediates, reused by liveness;
 *   SYMMETRIC  peer-read values: symmetric input slots (whole run) and
 *              intermediates (reused by liveness), plus fused workspaces;
 *              identical offsets on every rank — the symmetric contract;
 *   INPUT      regular input slots (persistent, filled before replay);
 *   OUTPUT     graph outputs (pinned until copied out).
 * Params live in their own memory (weights.h); views own nothing. */
#ifndef TP_PLAN_H
#define TP_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "graph.h"
#include "mem_kind.h"

typedef enum { TP_PART_CAPTURED = 0, TP_PART_FALLBACK } tp_part_kind;

typedef struct {
    tp_mem_kind kind;
    int64_t offset, bytes;
    int first, last;  /* liveness in node indices (inclusive) */
    int hoisted;      /* a fallback output read by a later captured partition */
    int inplace_of;   /* node whose buffer this elementwise op overwrites, or -1 */
    int64_t ws_offset, ws_bytes; /* symmetric workspace of fused_matmul_reduce_scatter */
} tp_buf;

typedef struct {
    int id;
    tp_part_kind kind;
    int n_nodes;
    int *nodes; /* indices of the nodes that run (views excluded) */
} tp_partition;

typedef struct tp_plan {
    int n_nodes;
    tp_buf *buf;   /* per node; kind NONE for views and params */
    int *part_of;  /* per node: partition id, -1 when nothing runs */
    int n_parts;
    tp_partition *parts;
    int64_t arena_bytes[TP_MEM_KINDS];
    int n_buffers[TP_MEM_KINDS];      /* distinct blocks after reuse */
    int64_t naive_bytes;              /* intermediates without reuse */
    int64_t peak_bytes;               /* planned regular + symmetric intermediates */
    int symmetric_offsets_equal;      /* checked by planning each rank */
} tp_plan;

/* g must be inferred at the bucket's batch. */
tp_status tp_plan_build(const tp_graph *g, tp_plan **out, tp_err *err);
void tp_plan_free(tp_plan *p);

/* plan_partition.c: fills parts, part_of and buf[].hoisted. */
tp_status tp_plan_partition(const tp_graph *g, tp_plan *p, tp_err *err);

/* plan_memory.c: one arena by liveness. Items are allocated at `first` in
 * order and released after `last`, best fit among freed blocks (which
 * merge), else at the end. Offsets are 64-byte aligned. */
typedef struct {
    int64_t bytes;
    int first, last;
    int64_t offset; /* out */
    int inplace_of; /* >= 0: reuse that item's block, which dies at our `first`
                       (an elementwise op overwriting its input); -1: none */
} tp_mem_item;
tp_status tp_plan_arena(tp_mem_item *items, int n, int64_t *arena_bytes, int *n_blocks, tp_err *err);

/* plan_rows.c: whether batch rows never mix, so a batch can be padded to a
 * bucket and outputs cut back to B rows. When not, *why says which node. */
tp_status tp_plan_rows_independent(tp_graph *g, int64_t b1, int *independent, char *why, size_t why_len,
                                   tp_err *err);

/* Whether a node runs a kernel (owns its output and is not a source). */
int tp_plan_node_runs(const tp_graph *g, int i);

#endif
