/* ops.c — one descriptor per op. Each TP_OP_LIST entry NAME needs a
 * `desc_NAME` here: the table below is built from the list, so an op
 * without a descriptor does not compile (tests/static/op_table.sh proves
 * it). Each descriptor names its kernel family (`.family`, TP_FAMILY_LIST):
 * tests/unit/test_ops.c fails on one without, and no backend runs it.
 * Field meanings: tp_op_desc in ops.h. */
#include "ops.h"

#include <string.h>

#define FIELD(f) offsetof(tp_attrs, f)
#define NO TP_ATTR_NO_FIELD
/* Attribute specs: key, type, tp_attrs field, required, default. */
#define REQ(key, type, f) {key, type, FIELD(f), 1, 0, NO, NO, NULL}
#define OPT(key, type, f, def) {key, type, FIELD(f), 0, def, NO, NO, NULL}
#define LIST(key, type, f, n) {key, type, FIELD(f), 1, 0, FIELD(n), NO, NULL}
#define CHOICE(key, f, words) {key, TP_ATTR_CHOICE, FIELD(f), 0, 0, NO, NO, words}
#define END {NULL, 0, 0, 0, 0, NO, NO, NULL}

static const tp_attr_spec no_attrs[] = {END};

#define SOURCE_OP(nm) {.name = nm, .kind = TP_KIND_SOURCE, .comm_input = -1, .shape = TP_SHAPE_SOURCE, \
                       .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs, .family = TP_FAMILY_NONE}
static const tp_op_desc desc_INPUT = SOURCE_OP("input");
static const tp_op_desc desc_PARAM = SOURCE_OP("param");

/* ------------------------------------------------------------ compute */

#define BINARY_OP(nm) {.name = nm, .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE,   \
                       .min_inputs = 2, .max_inputs = 2, .comm_input = -1, .shape = TP_SHAPE_BINARY,      \
                       .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs, .family = TP_FAMILY_BINARY}
static const tp_op_desc desc_ADD = BINARY_OP("add");
static const tp_op_desc desc_SUB = BINARY_OP("sub");
static const tp_op_desc desc_MUL = BINARY_OP("mul");

static const tp_attr_spec gelu_attrs[] = {CHOICE("approximate", gelu_tanh, "none tanh"), END};
#define UNARY_OP(nm, at) {.name = nm, .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE,  \
                          .min_inputs = 1, .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_UNARY,      \
                          .rows = TP_ROWS_INDEPENDENT, .attrs = at, .family = TP_FAMILY_UNARY}
static const tp_op_desc desc_GELU = UNARY_OP("gelu", gelu_attrs);
static const tp_op_desc desc_SILU = UNARY_OP("silu", no_attrs);
static const tp_op_desc desc_RELU = UNARY_OP("relu", no_attrs);

static const tp_attr_spec softmax_attrs[] = {OPT("dim", TP_ATTR_DIM, dim, -1), END};
static const tp_op_desc desc_SOFTMAX = {.name = "softmax", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                        .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                        .shape = TP_SHAPE_UNARY_DIM, .rows = TP_ROWS_ALONG_DIM,
                                        .attrs = softmax_attrs, .family = TP_FAMILY_SOFTMAX};

static const tp_attr_spec layer_norm_attrs[] = {OPT("eps", TP_ATTR_FLOAT, eps, 1e-5), END};
static const tp_attr_spec rms_norm_attrs[] = {OPT("eps", TP_ATTR_FLOAT, eps, 1e-6), END};
#define NORM_OP(nm, n_in, at) {.name = nm, .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,                  \
                               .min_inputs = n_in, .max_inputs = n_in, .comm_input = -1,                   \
                               .shape = TP_SHAPE_NORM, .rows = TP_ROWS_LAST_DIM, .attrs = at,              \
                               .family = TP_FAMILY_NORM}
static const tp_op_desc desc_LAYER_NORM = NORM_OP("layer_norm", 3, layer_norm_attrs);
static const tp_op_desc desc_RMS_NORM = NORM_OP("rms_norm", 2, rms_norm_attrs);

static const tp_attr_spec matmul_attrs[] = {OPT("transpose_b", TP_ATTR_BOOL, transpose_b, 0), END};
static const tp_op_desc desc_MATMUL = {.name = "matmul", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                       .min_inputs = 2, .max_inputs = 2, .comm_input = -1,
                                       .shape = TP_SHAPE_MATMUL, .rows = TP_ROWS_MATMUL, .attrs = matmul_attrs,
                                       .family = TP_FAMILY_MATMUL};

static const tp_attr_spec attention_attrs[] = {
    OPT("causal", TP_ATTR_BOOL, causal, 0),
    /* absent: 1/sqrt(D), chosen by the kernel (has_scale stays 0) */
    {"scale", TP_ATTR_FLOAT, FIELD(scale), 0, 0, NO, FIELD(has_scale), NULL},
    END};
/* q, k, v and an optional key-padding mask [B, T] (INT32/INT64, nonzero =
 * attend; kernels/common/tp_attn_mask.h) */
static const tp_op_desc desc_ATTENTION = {.name = "attention", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                          .min_inputs = 3, .max_inputs = 4, .comm_input = -1,
                                          .shape = TP_SHAPE_ATTENTION, .rows = TP_ROWS_ATTENTION,
                                          .attrs = attention_attrs, .family = TP_FAMILY_ATTENTION};

static const tp_attr_spec embedding_attrs[] = {OPT("vocab_parallel", TP_ATTR_BOOL, vocab_parallel, 0), END};
static const tp_op_desc desc_EMBEDDING = {.name = "embedding", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                          .min_inputs = 2, .max_inputs = 2, .comm_input = -1,
                                          .shape = TP_SHAPE_EMBEDDING, .rows = TP_ROWS_INDEPENDENT,
                                          .attrs = embedding_attrs, .family = TP_FAMILY_EMBEDDING};

/* -------------------------------------------------------- views, copies */

static const tp_attr_spec shape_attrs[] = {LIST("shape", TP_ATTR_SHAPE, shape, n_shape), END};
static const tp_op_desc desc_VIEW = {.name = "view", .kind = TP_KIND_VIEW, .flags = TP_OPF_GRAPH,
                                     .min_inputs = 1, .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_VIEW,
                                     .rows = TP_ROWS_VIEW, .attrs = shape_attrs, .family = TP_FAMILY_NONE};
static const tp_op_desc desc_RESHAPE = {.name = "reshape", .kind = TP_KIND_COPY, .flags = TP_OPF_GRAPH,
                                        .min_inputs = 1, .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_VIEW,
                                        .rows = TP_ROWS_VIEW, .attrs = shape_attrs, .family = TP_FAMILY_COPY};

static const tp_attr_spec permute_attrs[] = {LIST("dims", TP_ATTR_DIMS, dims, n_dims), END};
static const tp_op_desc desc_PERMUTE = {.name = "permute", .kind = TP_KIND_VIEW, .flags = TP_OPF_GRAPH,
                                        .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                        .shape = TP_SHAPE_PERMUTE, .rows = TP_ROWS_INDEPENDENT,
                                        .attrs = permute_attrs, .family = TP_FAMILY_NONE};

static const tp_attr_spec transpose_attrs[] = {REQ("dim0", TP_ATTR_DIM, dim0), REQ("dim1", TP_ATTR_DIM, dim1), END};
static const tp_op_desc desc_TRANSPOSE = {.name = "transpose", .kind = TP_KIND_VIEW, .flags = TP_OPF_GRAPH,
                                          .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                          .shape = TP_SHAPE_PERMUTE, .rows = TP_ROWS_INDEPENDENT,
                                          .attrs = transpose_attrs, .family = TP_FAMILY_NONE};

static const tp_attr_spec slice_attrs[] = {REQ("dim", TP_ATTR_DIM, dim), REQ("start", TP_ATTR_INT, start),
                                           REQ("length", TP_ATTR_INT, length), END};
static const tp_op_desc desc_SLICE = {.name = "slice", .kind = TP_KIND_VIEW, .flags = TP_OPF_GRAPH,
                                      .min_inputs = 1, .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_SLICE,
                                      .rows = TP_ROWS_DIM_ATTR, .attrs = slice_attrs, .family = TP_FAMILY_NONE};

static const tp_attr_spec dim_attrs[] = {REQ("dim", TP_ATTR_DIM, dim), END};
static const tp_op_desc desc_CAT = {.name = "cat", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                    .min_inputs = 1, .max_inputs = TP_OP_MAX_INPUTS, .comm_input = -1,
                                    .shape = TP_SHAPE_CAT, .rows = TP_ROWS_DIM_ATTR, .attrs = dim_attrs,
                                    .family = TP_FAMILY_CAT};

static const tp_op_desc desc_CONTIGUOUS = {.name = "contiguous", .kind = TP_KIND_COPY, .flags = TP_OPF_GRAPH,
                                           .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                           .shape = TP_SHAPE_CONTIGUOUS, .rows = TP_ROWS_INDEPENDENT,
                                           .attrs = no_attrs, .family = TP_FAMILY_COPY};
/* place_symmetric's copy into a symmetric buffer; never in a graph file */
static const tp_op_desc desc_IDENTITY_COPY = {.name = "identity_copy", .kind = TP_KIND_COPY, .min_inputs = 1,
                                              .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_COPY,
                                              .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs,
                                              .family = TP_FAMILY_COPY};

/* --------------------------------------------------------- collectives */

static const tp_attr_spec reduce_scatter_attrs[] = {REQ("dim", TP_ATTR_DIM, dim),
                                                    CHOICE("op", reduce, "sum avg"), END};
static const tp_attr_spec all_reduce_attrs[] = {CHOICE("op", reduce, "sum avg max"), END};
static const tp_attr_spec all_to_all_attrs[] = {REQ("split_dim", TP_ATTR_DIM, split_dim),
                                                REQ("concat_dim", TP_ATTR_DIM, concat_dim), END};
static const tp_attr_spec broadcast_attrs[] = {OPT("src", TP_ATTR_RANK, src, 0), END};
#define COLLECTIVE_OP(nm, sh, rw, at) {.name = nm, .kind = TP_KIND_COLLECTIVE, .flags = TP_OPF_GRAPH,        \
                                       .min_inputs = 1, .max_inputs = 1, .comm_input = 0, .shape = sh,      \
                                       .rows = rw, .attrs = at, .family = TP_FAMILY_NONE}
static const tp_op_desc desc_ALL_GATHER = COLLECTIVE_OP("all_gather", TP_SHAPE_GATHER_DIM, TP_ROWS_DIM_ATTR, dim_attrs);
static const tp_op_desc desc_REDUCE_SCATTER =
    COLLECTIVE_OP("reduce_scatter", TP_SHAPE_SCATTER_DIM, TP_ROWS_DIM_ATTR, reduce_scatter_attrs);
static const tp_op_desc desc_ALL_REDUCE = COLLECTIVE_OP("all_reduce", TP_SHAPE_SAME, TP_ROWS_INDEPENDENT, all_reduce_attrs);
static const tp_op_desc desc_ALL_TO_ALL =
    COLLECTIVE_OP("all_to_all", TP_SHAPE_ALL_TO_ALL, TP_ROWS_ALL_TO_ALL, all_to_all_attrs);
static const tp_op_desc desc_BROADCAST = COLLECTIVE_OP("broadcast", TP_SHAPE_FROM_SRC, TP_ROWS_INDEPENDENT, broadcast_attrs);

/* Fused by fuse_tp, never in a graph file. ag_mm: input 0 gathered, then
 * up to 16 weights; mm_rs: the product's input and one weight (its
 * symmetric workspace is appended by the executor). */
static const tp_op_desc desc_FUSED_AG_MM = {.name = "fused_all_gather_matmul", .kind = TP_KIND_FUSED,
                                            .min_inputs = 2, .max_inputs = 17, .comm_input = 0,
                                            .shape = TP_SHAPE_FUSED_AG_MM, .rows = TP_ROWS_FUSED,
                                            .attrs = no_attrs, .family = TP_FAMILY_NONE};
static const tp_op_desc desc_FUSED_MM_RS = {.name = "fused_matmul_reduce_scatter", .kind = TP_KIND_FUSED,
                                            .min_inputs = 2, .max_inputs = 2, .comm_input = 0,
                                            .shape = TP_SHAPE_FUSED_MM_RS, .rows = TP_ROWS_FUSED,
                                            .attrs = no_attrs, .family = TP_FAMILY_NONE};

/* ------------------------------------------------- ops of ONNX exports */

/* div only on floats: integer division by zero has no defined result. */
static const tp_op_desc desc_DIV = {.name = "div", .kind = TP_KIND_COMPUTE,
                                    .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE | TP_OPF_FLOAT_ONLY,
                                    .min_inputs = 2, .max_inputs = 2, .comm_input = -1, .shape = TP_SHAPE_BINARY,
                                    .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs, .family = TP_FAMILY_BINARY};
static const tp_op_desc desc_SQRT = UNARY_OP("sqrt", no_attrs);
static const tp_op_desc desc_RSQRT = UNARY_OP("rsqrt", no_attrs);
static const tp_op_desc desc_EXP = UNARY_OP("exp", no_attrs);
static const tp_op_desc desc_NEG = UNARY_OP("neg", no_attrs);
static const tp_op_desc desc_TANH = UNARY_OP("tanh", no_attrs);
static const tp_op_desc desc_ERF = UNARY_OP("erf", no_attrs);
static const tp_op_desc desc_SIGMOID = UNARY_OP("sigmoid", no_attrs);
static const tp_attr_spec pow_attrs[] = {REQ("exponent", TP_ATTR_FLOAT, exponent), END};
static const tp_op_desc desc_POW = UNARY_OP("pow", pow_attrs);

/* Reducing over the batch dim mixes rows: ALONG_DIM says so. */
static const tp_attr_spec reduce_attrs[] = {REQ("dim", TP_ATTR_DIM, dim), OPT("keepdim", TP_ATTR_BOOL, keepdim, 0),
                                            END};
#define REDUCE_OP(nm) {.name = nm, .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH, .min_inputs = 1,           \
                       .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_REDUCE, .rows = TP_ROWS_ALONG_DIM, \
                       .attrs = reduce_attrs, .family = TP_FAMILY_REDUCE}
static const tp_op_desc desc_REDUCE_MEAN = REDUCE_OP("reduce_mean");
static const tp_op_desc desc_REDUCE_SUM = REDUCE_OP("reduce_sum");

/* where(cond, x, y): cond is a param (a constant mask, as exports fold
 * them), so it has no batch dim and the rows stay independent. */
static const tp_op_desc desc_WHERE = {.name = "where", .kind = TP_KIND_COMPUTE,
                                      .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE, .min_inputs = 3,
                                      .max_inputs = 3, .comm_input = -1, .shape = TP_SHAPE_WHERE,
                                      .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs, .family = TP_FAMILY_WHERE};

/* rope(x, cos, sin) = x cos + rotate_half(x) sin, rotate_half(x) = (-x[h:],
 * x[:h]) over the last dim D = 2h (Hugging Face's rotary embedding, what
 * Llama's exports spell as mul, slice, neg, cat, mul, add). cos and sin
 * broadcast to x: position tables [S, D] (params) or a step's rows [B, 1,
 * T, D], so a row reads only its own row. Not elementwise: element i
 * reads i + h or i - h too, so it never runs in place. */
static const tp_op_desc desc_ROPE = {.name = "rope", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                     .min_inputs = 3, .max_inputs = 3, .comm_input = -1, .shape = TP_SHAPE_ROPE,
                                     .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs, .family = TP_FAMILY_ROPE};

/* gather(x, ids) along dim: gathering along the batch dim mixes rows. */
static const tp_attr_spec gather_attrs[] = {OPT("dim", TP_ATTR_DIM, dim, 0), END};
static const tp_op_desc desc_GATHER = {.name = "gather", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                       .min_inputs = 2, .max_inputs = 2, .comm_input = -1,
                                       .shape = TP_SHAPE_GATHER_IDS, .rows = TP_ROWS_ALONG_DIM,
                                       .attrs = gather_attrs, .family = TP_FAMILY_GATHER};

/* A copy, not a zero-stride view: an in-place consumer must never write
 * one element through several aliases. */
static const tp_op_desc desc_EXPAND = {.name = "expand", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                       .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                       .shape = TP_SHAPE_EXPAND, .rows = TP_ROWS_INDEPENDENT,
                                       .attrs = shape_attrs, .family = TP_FAMILY_EXPAND};

/* The choice words are tp_dtype's names in enum order (ops.h's cast_to). */
_Static_assert(TP_F32 == 0 && TP_F16 == 1 && TP_BF16 == 2 && TP_I32 == 3 && TP_I64 == 4, "cast 'to' choices");
static const tp_attr_spec cast_attrs[] = {
    {"to", TP_ATTR_CHOICE, FIELD(cast_to), 1, 0, NO, NO, "FP32 FP16 BF16 INT32 INT64"}, END};
static const tp_op_desc desc_CAST = {.name = "cast", .kind = TP_KIND_COMPUTE,
                                     .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE, .min_inputs = 1,
                                     .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_CAST,
                                     .rows = TP_ROWS_INDEPENDENT, .attrs = cast_attrs, .family = TP_FAMILY_CAST};

/* ------------------------------------------------------- generation */

/* A state (the graph's top-level "states"): persistent per-rank memory,
 * allocated once with the params and written only by kv_attention. A
 * source, never a node of a graph file. */
static const tp_op_desc desc_STATE = SOURCE_OP("state");

/* q, k, v, k_cache, v_cache (states), slot, pos: k/v rows are written into
 * the caches at their slot and position, then q attends causally over the
 * cache (docs/models.md, "Generation graphs"). A row reads only itself and
 * the cache, so batches pad (slot 0 rows are inactive). */
static const tp_attr_spec kv_attention_attrs[] = {
    {"scale", TP_ATTR_FLOAT, FIELD(scale), 0, 0, NO, FIELD(has_scale), NULL}, END};
static const tp_op_desc desc_KV_ATTENTION = {.name = "kv_attention", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                             .min_inputs = 7, .max_inputs = 7, .comm_input = -1,
                                             .shape = TP_SHAPE_KV_ATTENTION, .rows = TP_ROWS_KV_ATTENTION,
                                             .attrs = kv_attention_attrs, .family = TP_FAMILY_KV_ATTENTION};

/* Greedy selection as packed INT64 keys (kernels/common/tp_generate.h), so
 * an all_reduce max over ranks picks the largest value, lowest id. */
static const tp_attr_spec argmax_attrs[] = {
    OPT("vocab_parallel", TP_ATTR_BOOL, vocab_parallel, 0),
    {"limit", TP_ATTR_INT, FIELD(limit), 0, 0, NO, FIELD(has_limit), NULL}, END};
static const tp_op_desc desc_ARGMAX = {.name = "argmax", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                       .min_inputs = 1, .max_inputs = 1, .comm_input = -1,
                                       .shape = TP_SHAPE_ARGMAX, .rows = TP_ROWS_LAST_DIM, .attrs = argmax_attrs,
                                       .family = TP_FAMILY_ARGMAX};
static const tp_op_desc desc_ARGMAX_INDEX = {.name = "argmax_index", .kind = TP_KIND_COMPUTE,
                                             .flags = TP_OPF_GRAPH | TP_OPF_ELEMENTWISE, .min_inputs = 1,
                                             .max_inputs = 1, .comm_input = -1, .shape = TP_SHAPE_ARGMAX_INDEX,
                                             .rows = TP_ROWS_INDEPENDENT, .attrs = no_attrs,
                                             .family = TP_FAMILY_ARGMAX};

/* matmul_rows(x [B, ..., K], w [K, N] (or [N, K], transpose_b), mask [B]):
 * matmul's product on the rows whose mask (INT32/INT64) is nonzero, zeros
 * on the others, which cost no GEMM work: a generation graph's LM head,
 * where only a sequence's last prompt row needs logits (docs/models.md).
 * Its own op, not a third input of matmul, so the TP fusion passes (which
 * match matmul) never see it. Row r reads only row r of x and of the mask:
 * matmul's rows rule (the mask is batched on dim 0 exactly as x). Same
 * family as matmul: a backend's matmul kernel runs both. */
static const tp_op_desc desc_MATMUL_ROWS = {.name = "matmul_rows", .kind = TP_KIND_COMPUTE, .flags = TP_OPF_GRAPH,
                                            .min_inputs = 3, .max_inputs = 3, .comm_input = -1,
                                            .shape = TP_SHAPE_MATMUL_ROWS, .rows = TP_ROWS_MATMUL,
                                            .attrs = matmul_attrs, .family = TP_FAMILY_MATMUL};

/* An op in TP_OP_LIST without its desc_NAME above fails right here. */
static const tp_op_desc *const op_table[] = {
#define TP_OP_ROW(e) [TP_OP_##e] = &desc_##e,
    TP_OP_LIST(TP_OP_ROW)
#undef TP_OP_ROW
};
_Static_assert(sizeof op_table / sizeof op_table[0] == TP_OP_COUNT, "one descriptor per op");

const tp_op_desc *tp_op_desc_of(tp_op op) { return op_table[op]; }
const char *tp_op_name(tp_op op) { return (unsigned)op < TP_OP_COUNT ? op_table[op]->name : "?"; }
tp_op_kind tp_op_kind_of(tp_op op) { return op_table[op]->kind; }
tp_kernel_family tp_op_family(tp_op op)
{
    return (unsigned)op < TP_OP_COUNT ? op_table[op]->family : TP_FAMILY_UNSET;
}
int tp_op_min_inputs(tp_op op) { return op_table[op]->min_inputs; }
int tp_op_max_inputs(tp_op op) { return op_table[op]->max_inputs; }

int tp_op_from_name(const char *s, tp_op *out)
{
    for (int i = 0; i < TP_OP_COUNT; i++) {
        if ((op_table[i]->flags & TP_OPF_GRAPH) && strcmp(s, op_table[i]->name) == 0) {
            *out = (tp_op)i;
            return 0;
        }
    }
    return -1;
}

const char *tp_algo_name(tp_algo a)
{
    switch (a) {
#define TP_ALGO_NAME(e, name) case TP_ALGO_##e: return name;
        TP_ALGO_MAP(TP_ALGO_NAME)
#undef TP_ALGO_NAME
    }
    return "?";
}
