/* passes.h — the graph passes that run once at load time, in order, each
 * in its own file (pass_*.c) with its own test. `tpserve plan` reports what
 * each one changed; --no-passes / --disable-pass NAME switch them off so a
 * test can compare results with and without them. */
#ifndef TP_PASSES_H
#define TP_PASSES_H

#include <stdint.h>

#include "backend.h"
#include "graph.h"

/* X(enum, "name", function) in pipeline order. */
/* fuse_tp runs before insert_contiguous so that a view feeding a fused
 * node's communicated operand also gets its contiguous copy. */
#define TP_PASS_MAP(X)                                                  \
    X(SHARD_OUTPUTS, "shard_outputs", tp_pass_shard_outputs)             \
    X(WIDEN_ACTIVATIONS, "widen_activations", tp_pass_widen_activations) \
    X(FUSE_TP, "fuse_tp", tp_pass_fuse_tp)                               \
    X(INSERT_CONTIGUOUS, "insert_contiguous", tp_pass_insert_contiguous) \
    X(CHOOSE_COLLECTIVES, "choose_collectives", tp_pass_choose_collectives) \
    X(PLACE_SYMMETRIC, "place_symmetric", tp_pass_place_symmetric)

typedef enum {
#define TP_PASS_ENUM(e, name, fn) TP_PASS_##e,
    TP_PASS_MAP(TP_PASS_ENUM)
#undef TP_PASS_ENUM
    TP_PASS_COUNT
} tp_pass_id;

typedef struct {
    int disabled[TP_PASS_COUNT];
    tp_lowering lowering; /* the backend's (tp_backend_caps), read by choose_collectives */
    int f32_activations;  /* the backend's (tp_backend_caps), read by widen_activations */
} tp_pass_opts;

typedef struct {
    const char *name;
    int ran;     /* 0 when disabled */
    int changed; /* number of nodes added, fused or annotated */
} tp_pass_result;

/* Fills defaults: every pass on, the default backend's lowering. */
void tp_pass_opts_default(tp_pass_opts *o);
/* Disables a pass by name; -1 if unknown. */
int tp_pass_disable(tp_pass_opts *o, const char *name);
const char *tp_pass_name(tp_pass_id id);

/* Runs every enabled pass in order; results has TP_PASS_COUNT entries. The
 * graph is re-inferred at its current batch between passes. */
tp_status tp_run_passes(tp_graph *g, const tp_pass_opts *o, tp_pass_result *results, tp_err *err);

/* Each pass: edits g, sets *changed, and leaves g inferred. */
#define TP_PASS_DECL(e, name, fn) \
    tp_status fn(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err);
TP_PASS_MAP(TP_PASS_DECL)
#undef TP_PASS_DECL

/* Whether node i's tensor is non-contiguous at any batch size (contiguity
 * of views can hinge on a dim being 1, so two batches are checked). */
int tp_pass_is_strided(tp_graph *g, int i);

#endif
