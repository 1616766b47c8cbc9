/* weights.h — each rank's resident memory: its shard of every param, loaded
 * once from the unsharded safetensors file (only the bytes of that rank's
 * shard are read), and of every state (generation caches), zero-filled.
 * Both are allocated once, outside the arenas, so captures keep their
 * addresses for the engine's life. */
#ifndef TP_WEIGHTS_H
#define TP_WEIGHTS_H

#include "backend.h"
#include "graph.h"
#include "rank_group.h"

typedef struct tp_weights tp_weights;

/* g must have been inferred (param local shapes do not depend on batch). */
tp_status tp_weights_load(const tp_graph *g, tp_backend *b, tp_rank_group *rg, tp_weights **out,
                          tp_err *err);
void tp_weights_free(tp_weights *w);
/* Rank memory holding param number p (index into g->param_ids). */
void *tp_weights_get(const tp_weights *w, int rank, int p);
size_t tp_weights_bytes(const tp_weights *w); /* per rank */
/* Rank memory holding state number s (index into g->state_ids). */
void *tp_weights_state(const tp_weights *w, int rank, int s);
size_t tp_weights_state_bytes(const tp_weights *w); /* per rank */

#endif
