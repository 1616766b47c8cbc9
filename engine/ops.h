/* ops.h — the operator vocabulary of tpgraph v1: one descriptor per op
 * (engine/ops.c), the single place an op's facts live.
 *
 * Adding an op (CONTRIBUTING.md): append it to TP_OP_LIST, write its
 * descriptor `desc_NAME` in ops.c (the build fails without one) naming its
 * kernel family (TP_FAMILY_LIST: each backend maps a family to a kernel
 * once; a backend without one refuses the graph at load, naming op and
 * backend), and test it. Shape and batch-row rules are named by the
 * descriptor; a new rule is one case in the exhaustive switches of
 * shapes.c / plan_rows.c (-Wswitch-enum). */
#ifndef TP_OPS_H
#define TP_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "tensor.h"

/* One op per line: merges of added ops stay clean. */
#define TP_OP_LIST(X) \
    X(INPUT) \
    X(PARAM) \
    X(ADD) \
    X(SUB) \
    X(MUL) \
    X(GELU) \
    X(SILU) \
    X(RELU) \
    X(SOFTMAX) \
    X(LAYER_NORM) \
    X(RMS_NORM) \
    X(MATMUL) \
    X(ATTENTION) \
    X(EMBEDDING) \
    X(VIEW) \
    X(RESHAPE) \
    X(PERMUTE) \
    X(TRANSPOSE) \
    X(SLICE) \
    X(CAT) \
    X(CONTIGUOUS) \
    X(IDENTITY_COPY) \
    X(ALL_GATHER) \
    X(REDUCE_SCATTER) \
    X(ALL_REDUCE) \
    X(ALL_TO_ALL) \
    X(BROADCAST) \
    X(FUSED_AG_MM) \
    X(FUSED_MM_RS) \
    X(DIV) \
    X(SQRT) \
    X(RSQRT) \
    X(EXP) \
    X(NEG) \
    X(TANH) \
    X(ERF) \
    X(SIGMOID) \
    X(POW) \
    X(REDUCE_MEAN) \
    X(REDUCE_SUM) \
    X(WHERE) \
    X(GATHER) \
    X(EXPAND) \
    X(CAST) \
    X(STATE) \
    X(KV_ATTENTION) \
    X(ARGMAX) \
    X(ARGMAX_INDEX) \
    X(MATMUL_ROWS) \
    X(ROPE)

typedef enum {
#define TP_OP_ENUM(e) TP_OP_##e,
    TP_OP_LIST(TP_OP_ENUM)
#undef TP_OP_ENUM
    TP_OP_COUNT
} tp_op;

/* The most inputs any op takes (cat). Every buffer holding a node's inputs
 * is sized from it; ops.c checks no descriptor exceeds it. */
#define TP_OP_MAX_INPUTS 64

/* SOURCE (graph input / param), COMPUTE, VIEW (strided alias, no kernel),
 * COPY (may alias or copy), COLLECTIVE, FUSED (added by passes). */
typedef enum { TP_KIND_SOURCE, TP_KIND_COMPUTE, TP_KIND_VIEW, TP_KIND_COPY, TP_KIND_COLLECTIVE, TP_KIND_FUSED } tp_op_kind;

/* How shapes.c infers an op's local shape, strides and storage. UNSET (a
 * descriptor that forgot its rule) fails inference instead of guessing. */
typedef enum {
    TP_SHAPE_UNSET = 0,
    TP_SHAPE_SOURCE,        /* declared shape, placement applied */
    TP_SHAPE_BINARY,        /* NumPy broadcast of two same-dtype inputs */
    TP_SHAPE_UNARY,         /* same shape as a floating-point input */
    TP_SHAPE_UNARY_DIM,     /* same, along attr dim (softmax) */
    TP_SHAPE_NORM,          /* input + 1-d weights over its last dim */
    TP_SHAPE_MATMUL,
    TP_SHAPE_ATTENTION,
    TP_SHAPE_EMBEDDING,
    TP_SHAPE_VIEW,          /* attr shape; aliases when strides allow, else view fails / reshape copies */
    TP_SHAPE_PERMUTE,       /* permute / transpose: an alias with permuted strides */
    TP_SHAPE_SLICE,
    TP_SHAPE_CAT,
    TP_SHAPE_CONTIGUOUS,    /* aliases a contiguous input, else copies */
    TP_SHAPE_COPY,          /* always a fresh contiguous copy */
    TP_SHAPE_GATHER_DIM,    /* all_gather: dim grows world_size times */
    TP_SHAPE_SCATTER_DIM,   /* reduce_scatter: dim shrinks world_size times */
    TP_SHAPE_ALL_TO_ALL,
    TP_SHAPE_SAME,          /* all_reduce */
    TP_SHAPE_FROM_SRC,      /* broadcast: same shape, src must be a rank */
    TP_SHAPE_FUSED_AG_MM,
    TP_SHAPE_FUSED_MM_RS,
    TP_SHAPE_REDUCE,        /* attr dim reduced (kept as size 1 with keepdim) */
    TP_SHAPE_WHERE,         /* broadcast of a param cond (INT32/INT64) and two same-dtype inputs */
    TP_SHAPE_GATHER_IDS,    /* x[..., ids, ...]: dim of x replaced by the ids' dims */
    TP_SHAPE_EXPAND,        /* NumPy broadcast of the input and attr shape */
    TP_SHAPE_CAST,          /* same shape, dtype attr to */
    TP_SHAPE_KV_ATTENTION,  /* q's shape; k/v/caches/slot/pos checked against it */
    TP_SHAPE_ARGMAX,        /* last dim dropped, INT64 packed keys */
    TP_SHAPE_ARGMAX_INDEX,  /* same shape, INT64 keys -> INT64 ids */
    TP_SHAPE_MATMUL_ROWS,   /* matmul of x [B, ..., K] by a 2-d w, mask [B] INT32/INT64 */
    TP_SHAPE_ROPE,          /* x's shape (last dim even); cos, sin of its dtype broadcast to it */
} tp_shape_rule;

/* Which backend kernel runs an op; one family per line, X(ENUM, name).
 * Each backend maps every family to its kernel `k_name` once, with
 * TP_FAMILY_KERNELS below (cpu_ops.c, cuda_ops.c): a family added here
 * without its k_name in a backend does not compile there
 * (tests/static/op_table.sh); a backend that cannot run it yet says
 * `#define k_name NULL` and refuses the op at load. Inside a family the
 * kernel picks the work by op (add vs sub, gelu vs exp, layer_norm vs
 * rms_norm). */
#define TP_FAMILY_LIST(X) \
    X(BINARY, binary) \
    X(UNARY, unary) \
    X(SOFTMAX, softmax) \
    X(NORM, norm) \
    X(MATMUL, matmul) \
    X(ATTENTION, attention) \
    X(EMBEDDING, embedding) \
    X(CAT, cat) \
    X(COPY, copy) \
    X(REDUCE, reduce) \
    X(WHERE, where) \
    X(GATHER, gather) \
    X(EXPAND, expand) \
    X(CAST, cast) \
    X(KV_ATTENTION, kv_attention) \
    X(ARGMAX, argmax) \
    X(ROPE, rope)

/* A backend's table family -> kernel, built from the list:
 * `static const K table[TP_FAMILY_COUNT] = {TP_FAMILY_KERNELS};` with a
 * kernel k_name of type K in scope for every family (UNSET and NONE stay
 * NULL). */
#define TP_FAMILY_KERNEL_ROW(e, k) [TP_FAMILY_##e] = k_##k,
#define TP_FAMILY_KERNELS TP_FAMILY_LIST(TP_FAMILY_KERNEL_ROW)

/* UNSET: a descriptor that forgot its family (test_ops fails; no backend
 * has a kernel for it, so a graph using the op is refused at load). NONE:
 * no compute kernel — sources and views run nothing, collectives and fused
 * ops run through the backend's communication entry points. */
typedef enum {
    TP_FAMILY_UNSET = 0,
    TP_FAMILY_NONE,
#define TP_FAMILY_ENUM(e, k) TP_FAMILY_##e,
    TP_FAMILY_LIST(TP_FAMILY_ENUM)
#undef TP_FAMILY_ENUM
    TP_FAMILY_COUNT
} tp_kernel_family;

/* Whether an op mixes batch rows (plan_rows.c), given where the batch dim
 * of its inputs and output is. UNSET counts as mixing (always correct). */
typedef enum {
    TP_ROWS_UNSET = 0,
    TP_ROWS_INDEPENDENT,    /* row r of the output reads only row r */
    TP_ROWS_ALONG_DIM,      /* mixes along attr dim of its input (softmax) */
    TP_ROWS_LAST_DIM,       /* mixes along the input's last dim (norms) */
    TP_ROWS_MATMUL,
    TP_ROWS_ATTENTION,
    TP_ROWS_VIEW,
    TP_ROWS_DIM_ATTR,       /* splits/concatenates along attr dim of the output */
    TP_ROWS_ALL_TO_ALL,
    TP_ROWS_FUSED,
    TP_ROWS_KV_ATTENTION,   /* rows apart unless q/k/v/slot/pos are batched off dim 0 */
} tp_rows_rule;

/* Attribute value types; every attr is validated against its type. */
typedef enum {
    TP_ATTR_DIM,      /* int, -TP_MAX_DIMS <= d < TP_MAX_DIMS */
    TP_ATTR_INT,      /* int64 */
    TP_ATTR_RANK,     /* int, 0 <= r <= INT_MAX */
    TP_ATTR_SHAPE,    /* int64 list of at most TP_MAX_DIMS (count at .count) */
    TP_ATTR_DIMS,     /* int list of at most TP_MAX_DIMS (count at .count) */
    TP_ATTR_FLOAT,
    TP_ATTR_BOOL,     /* int 0/1 */
    TP_ATTR_CHOICE,   /* one of .choices (space-separated), stored as its index */
} tp_attr_type;

#define TP_ATTR_NO_FIELD ((size_t)-1)

typedef struct {
    const char *key;
    tp_attr_type type;
    size_t field;         /* offsetof(tp_attrs, ...) */
    int required;         /* no default: the graph must give it */
    double fallback;      /* default of a scalar attr when absent */
    size_t count;         /* list types: offsetof the element count; else TP_ATTR_NO_FIELD */
    size_t present;       /* offsetof an int set to 1 when given, or TP_ATTR_NO_FIELD */
    const char *choices;  /* TP_ATTR_CHOICE */
} tp_attr_spec;

/* Behaviour flags of an op. */
enum {
    TP_OPF_GRAPH = 1 << 0,       /* a graph file may use it (else the engine's own) */
    TP_OPF_ELEMENTWISE = 1 << 1, /* reads element e, writes element e: may run in place */
    TP_OPF_FLOAT_ONLY = 1 << 2,  /* inputs must be FP32/FP16/BF16 (a binary op's shape rule checks) */
};

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
    int dim;              /* softmax, slice, cat, all_gather, reduce_scatter, reduce_*, gather */
    int dim0, dim1;       /* transpose */
    int64_t start, length; /* slice */
    int n_shape;          /* view, reshape: target shape (one -1 allowed); expand */
    int64_t shape[TP_MAX_DIMS];
    int n_dims;           /* permute */
    int dims[TP_MAX_DIMS];
    float eps;            /* layer_norm (1e-5), rms_norm (1e-6) */
    float scale;          /* attention; has_scale=0 means 1/sqrt(D) */
    int has_scale;
    int causal;           /* attention */
    int transpose_b;      /* matmul */
    int vocab_parallel;   /* embedding, argmax */
    int64_t limit;        /* argmax: global indices >= limit are ignored (has_limit=0: none) */
    int has_limit;
    int gelu_tanh;        /* gelu approximate="tanh" */
    tp_reduce reduce;     /* reduce_scatter, all_reduce */
    int split_dim, concat_dim; /* all_to_all */
    int src;              /* broadcast */
    float exponent;       /* pow */
    int keepdim;          /* reduce_mean, reduce_sum */
    int cast_to;          /* cast: a tp_dtype (its choice index is the enum value) */
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

typedef struct tp_op_desc {
    const char *name; /* as written in graph JSON and reports */
    tp_op_kind kind;
    tp_kernel_family family; /* the backend kernel that runs it (TP_FAMILY_LIST) */
    unsigned flags;   /* TP_OPF_* */
    int min_inputs, max_inputs;
    int comm_input;   /* the input a collective or fused op communicates, or -1 */
    tp_shape_rule shape;
    tp_rows_rule rows;
    const tp_attr_spec *attrs; /* the attrs a graph may give; ends at key NULL */
} tp_op_desc;

/* The descriptor of op (op < TP_OP_COUNT). */
const tp_op_desc *tp_op_desc_of(tp_op op);
const char *tp_op_name(tp_op op);
tp_op_kind tp_op_kind_of(tp_op op);
/* The kernel family of op; TP_FAMILY_UNSET for op >= TP_OP_COUNT. */
tp_kernel_family tp_op_family(tp_op op);
int tp_op_min_inputs(tp_op op);
int tp_op_max_inputs(tp_op op);
/* A graph op by name (TP_OPF_GRAPH only); -1 if unknown. */
int tp_op_from_name(const char *s, tp_op *out);

#endif
