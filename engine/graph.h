/* graph.h — the tpgraph IR: one flat, topologically ordered node list in
 * which graph inputs and params are source nodes, so every value has exactly
 * one producer and one index.
 *
 * Invariants (established by tp_graph_load, kept by every pass):
 *  1. nodes[i].inputs[k] < i (topological order);
 *  2. names are unique;
 *  3. after tp_graph_infer(B), every node has a local shape, strides and a
 *     storage owner: storage == i for nodes that own memory, otherwise the
 *     index of the node whose memory this view aliases (offset in elements). */
#ifndef TP_GRAPH_H
#define TP_GRAPH_H

#include <stdint.h>

#include "ops.h"
#include "status.h"
#include "tensor.h"

typedef enum { TP_PLACE_REPLICATE = 0, TP_PLACE_SHARD } tp_place_kind;

typedef struct {
    tp_place_kind kind;
    int dim;        /* shard(k): k, normalised non-negative */
    int64_t length; /* shard: the global size of dim when its last chunks are cut
                       short (an output of pass shard_outputs); 0: d chunks whole */
} tp_placement;

typedef struct tp_node {
    char *name;
    tp_op op;
    int n_inputs;
    int *inputs; /* node indices */
    tp_attrs attrs;
    int fallback; /* "fallback": true — must run eagerly, outside capture */
    int symmetric; /* place_symmetric: this storage lives in symmetric memory */

    /* Sources (inputs, params): declared global shape and placement. */
    int g_ndim;
    int64_t gshape[TP_MAX_DIMS];
    int batched; /* gshape[0] is the batch dim "B" (its value is ignored) */
    int slotted; /* states: gshape[0] is the slot dim "S" (the graph's state_slots) */
    tp_placement placement;
    char *tensor_key; /* params: key in the safetensors file */
    tp_dtype stored;  /* params: the file's dtype when widen_activations loads an FP16/BF16 one as FP32
                         (dtype TP_F32); otherwise dtype */

    /* Inferred by tp_graph_infer for the current batch. */
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    int64_t stride[TP_MAX_DIMS];
    int storage;    /* node owning the memory (self when it owns) */
    int64_t offset; /* element offset into the owner's memory */
} tp_node;

/* The optional "generate" block: which inputs and output a generation
 * server drives (docs/models.md, "Generation graphs"). */
typedef struct {
    char *input_ids, *positions, *slots, *next_token;
    char *logit_rows; /* optional: NULL, every row's next_token is computed */
    int64_t max_seq_len, vocab_size;
} tp_graph_generate;

/* Slots of a state's "S" dim when nobody chooses (tp_engine_opts.state_slots). */
#define TP_DEFAULT_STATE_SLOTS 16

typedef struct tp_graph {
    char *path;    /* the JSON file, as given */
    char *name;
    char *weights; /* resolved path of the safetensors file, or NULL */
    int world_size;
    int n_nodes;
    tp_node *nodes;
    int n_inputs, n_params, n_outputs;
    int *input_ids, *param_ids, *output_ids;
    tp_placement *output_place;
    int n_states, *state_ids; /* the top-level "states", source nodes of op state */
    int64_t state_slots;      /* the value of "S" in state shapes */
    tp_graph_generate *gen;   /* NULL: not a generation graph */
    int64_t batch; /* the batch the shapes were last inferred for */
} tp_graph;

/* Loads and validates a graph: JSON structure, names, ops, attrs, datatypes,
 * placements, params against the safetensors header, and shapes (inferred
 * for a small batch). Every error names the file, the node and the reason. */
tp_status tp_graph_load(const char *path, tp_graph **out, tp_err *err);
void tp_graph_free(tp_graph *g);
/* A deep copy of g (nodes, attrs, names, lists): an executable lowers and
 * keeps its own, so no later edit of g reaches a captured bucket. */
tp_status tp_graph_clone(const tp_graph *g, tp_graph **out, tp_err *err);

/* Index of the node called name, or -1. */
int tp_graph_find(const tp_graph *g, const char *name);

/* Infers local shapes, strides and storage aliasing for batch B. Views never
 * copy; reshape/contiguous alias their input when the strides allow. */
tp_status tp_graph_infer(tp_graph *g, int64_t batch, tp_err *err);

/* Local shape of a source node on one rank for batch B (placement applied).
 * Fails when a sharded dim is not divisible by the world size. */
tp_status tp_source_local_shape(const tp_graph *g, const tp_node *n, int64_t batch,
                                int64_t *shape, tp_err *err);

/* Bytes and contiguity of a node's local tensor as last inferred. */
int64_t tp_node_bytes(const tp_node *n);
int tp_node_contiguous(const tp_node *n);

/* Global shape of graph output i as last inferred (its placement undone);
 * returns its ndim. */
int tp_graph_output_shape(const tp_graph *g, int i, int64_t *shape);

/* Whether a batched input is sharded on its batch dim, so every batch the
 * graph runs must divide by world_size. */
int tp_graph_batch_sharded(const tp_graph *g);

/* Whether node i owns memory after inference (not a view, not a source). */
static inline int tp_node_owns(const tp_graph *g, int i)
{
    return g->nodes[i].storage == i;
}

/* The input a collective or fused node communicates (its descriptor's
 * comm_input): the value peers exchange, which passes make contiguous or
 * place in symmetric memory. */
static inline int *tp_comm_slot(tp_node *n) { return &n->inputs[tp_op_desc_of(n->op)->comm_input]; }
static inline int tp_comm_input(const tp_node *n) { return n->inputs[tp_op_desc_of(n->op)->comm_input]; }

/* Graph editing for passes (graph_edit.c). Indices shift so invariant 1
 * holds after every call; tp_graph_infer must run again before shapes are
 * read. */
/* Inserts a copy of n at pos (n's inputs must be < pos); the node takes
 * ownership of n->name and n->inputs. */
tp_status tp_graph_insert(tp_graph *g, int pos, tp_node *n, tp_err *err);
/* Inserts `NAME.suffix = op(NAME)` right after node `value` (a one-input
 * copy such as contiguous or identity_copy); *out is its index. */
tp_status tp_graph_insert_copy(tp_graph *g, int value, tp_op op, const char *suffix, int *out, tp_err *err);
/* Removes node pos, which must have no users. */
void tp_graph_remove(tp_graph *g, int pos);
/* Makes every node from index `start` on (and every graph output) that
 * reads `from` read `to` instead. */
void tp_graph_replace_uses(tp_graph *g, int from, int to, int start);
/* Number of node inputs plus graph outputs that read node i. */
int tp_graph_n_users(const tp_graph *g, int i);
/* A name not yet used in g, derived from base ("base", "base_1", ...);
 * malloc'd. */
char *tp_graph_fresh_name(const tp_graph *g, const char *base);
/* Index of the only node reading i, or -1 when there are 0 or >1 users or
 * i is a graph output. */
int tp_graph_sole_user(const tp_graph *g, int i);

/* "shard(1)" / "replicate" into buf. */
const char *tp_placement_str(tp_placement p, char *buf, int len);

#endif
