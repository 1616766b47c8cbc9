/* ops.h — the operator vocabulary of tpgraph v1, as one table.
 *
 * X(enum, "json name", kind, min_inputs, max_inputs)
 * kind: SOURCE (graph input / param), COMPUTE, VIEW (strided alias, no
 * kernel), COPY (may alias or copy), COLLECTIVE, FUSED (added by passes). */
#ifndef TP_OPS_H
#define TP_OPS_H

#include <stdint.h>

#include "tensor.h"

#define TP_OP_MAP(X)                                          \
    X(INPUT, "input", SOURCE, 0, 0)                           \
    X(PARAM, "param", SOURCE, 0, 0)                           \
    X(ADD, "add", COMPUTE, 2, 2)                              \
    X(SUB, "sub", COMPUTE, 2, 2)                              \
    X(MUL, "mul", COMPUTE, 2, 2)                              \
    X(GELU, "gelu", COMPUTE, 1, 1)                            \
    X(SILU, "silu", COMPUTE, 1, 1)                            \
    X(RELU, "relu", COMPUTE, 1, 1)                            \
    X(SOFTMAX, "softmax", COMPUTE, 1, 1)                      \
    X(LAYER_NORM, "layer_norm", COMPUTE, 3, 3)                \
    X(RMS_NORM, "rms_norm", COMPUTE, 2, 2)                    \
    X(MATMUL, "matmul", COMPUTE, 2, 2)                        \
    X(ATTENTION, "attention", COMPUTE, 3, 3)                  \
    X(EMBEDDING, "embedding", COMPUTE, 2, 2)                  \
    X(VIEW, "view", VIEW, 1, 1)                               \
    X(RESHAPE, "reshape", COPY, 1, 1)                         \
    X(PERMUTE, "permute", VIEW, 1, 1)                         \
    X(TRANSPOSE, "transpose", VIEW, 1, 1)                     \
    X(SLICE, "slice", VIEW, 1, 1)                             \
    X(CAT, "cat", COMPUTE, 1, 64)                             \
    X(CONTIGUOUS, "contiguous", COPY, 1, 1)                   \
    X(IDENTITY_COPY, "identity_copy", COPY, 1, 1)             \
    X(ALL_GATHER, "all_gather", COLLECTIVE, 1, 1)             \
    X(REDUCE_SCATTER, "reduce_scatter", COLLECTIVE, 1, 1)     \
    X(ALL_REDUCE, "all_reduce", COLLECTIVE, 1, 1)             \
    X(ALL_TO_ALL, "all_to_all", COLLECTIVE, 1, 1)             \
    X(BROADCAST, "broadcast", COLLECTIVE, 1, 1)                 \
    X(FUSED_AG_MM, "fused_all_gather_matmul", FUSED, 2, 17)     \
    X(FUSED_MM_RS, "fused_matmul_reduce_scatter", FUSED, 2, 2)

typedef enum {
#define TP_OP_ENUM(e, name, kind, mn, mx) TP_OP_##e,
    TP_OP_MAP(TP_OP_ENUM)
#undef TP_OP_ENUM
    TP_OP_COUNT
} tp_op;

typedef enum { TP_KIND_SOURCE, TP_KIND_COMPUTE, TP_KIND_VIEW, TP_KIND_COPY, TP_KIND_COLLECTIVE, TP_KIND_FUSED } tp_op_kind;

typedef enum { TP_REDUCE_SUM = 0, TP_REDUCE_AVG, TP_REDUCE_MAX } tp_reduce;

/* How a collective is lowered (choose_collectives). DEFAULT lets the
 * backend pick; FUSED marks the communication inside a fused node. */
#define TP_ALGO_MAP(X) X(DEFAULT, "default") X(ONE_SHOT, "one_shot") X(RING, "ring") X(NCCL, "nccl") X(FUSED, "fused")
typedef enum {
#define TP_ALGO_ENUM(e, name) TP_ALGO_##e,
    TP_ALGO_MAP(TP_ALGO_ENUM)
#undef TP_ALGO_ENUM
} tp_algo;
const char *tp_algo_name(tp_algo a);

/* Every attr of every op, already validated and with defaults applied.
 * Dims are normalised (non-negative) by shape inference. */
typedef struct tp_attrs {
    int dim;              /* softmax, slice, cat, all_gather, reduce_scatter */
    int dim0, dim1;       /* transpose */
    int64_t start, length; /* slice */
    int n_shape;          /* view, reshape: target shape (one -1 allowed) */
    int64_t shape[TP_MAX_DIMS];
    int n_dims;           /* permute */
    int dims[TP_MAX_DIMS];
    float eps;            /* layer_norm (1e-5), rms_norm (1e-6) */
    float scale;          /* attention; has_scale=0 means 1/sqrt(D) */
    int has_scale;
    int causal;           /* attention */
    int transpose_b;      /* matmul */
    int vocab_parallel;   /* embedding */
    int gelu_tanh;        /* gelu approximate="tanh" */
    tp_reduce reduce;     /* reduce_scatter, all_reduce */
    int split_dim, concat_dim; /* all_to_all */
    int src;              /* broadcast */
    tp_algo algo;         /* collectives: lowering chosen by choose_collectives */
    /* fused_all_gather_matmul: `dim` is the gather dim of input 0 and
     * inputs 1..n_fused are weights; the products x_gathered @ w_i are
     * concatenated along the last dim (consumers slice them back out). */
    int n_fused;
    /* fuse_tp through a reassembly: the fused value is, instead of the
     * gathered input (ag_mm) or the product (mm_rs) P itself,
     * R = cat_{j}(slice(P, piece_dim, piece_start[j], piece_len[j])) along
     * cat_dim — a pure permutation of P's rows. 0 pieces: R = P. */
    int n_pieces, piece_dim, cat_dim;
    int64_t piece_start[TP_MAX_DIMS], piece_len[TP_MAX_DIMS];
} tp_attrs;

const char *tp_op_name(tp_op op);
tp_op_kind tp_op_kind_of(tp_op op);
int tp_op_min_inputs(tp_op op);
int tp_op_max_inputs(tp_op op);
/* Returns -1 if unknown (sources are not accepted from JSON). */
int tp_op_from_name(const char *s, tp_op *out);

#endif
