/* tp_cuda_ops.h — host launchers of the cuda backend's data-movement,
 * tensor and cross-rank kernels (kernels/cuda/tensor_ops.cu and
 * kernels/cuda/comm_kernels.cu), callable from C.
 *
 * Same contract as tp_cuda_kernels.h: every launcher enqueues on `stream`
 * (a cudaStream_t) and returns the launch's cudaError_t as an int, 0 on
 * success, cudaErrorInvalidValue (1) for arguments it refuses. Index math
 * is kernels/common/tp_cuda_plan.h, checked on the CPU by test_cuda_plan.
 *
 * Errors a kernel can only see on the device (an embedding id out of range,
 * a peer that never reaches a barrier) are written once into a
 * tp_cuda_error word in device memory, which the backend reads back at
 * synchronize: the kernel finishes (zeros, or gives up waiting) instead of
 * faulting or hanging. */
#ifndef TP_CUDA_OPS_H
#define TP_CUDA_OPS_H

#include <stdint.h>

#include "common/tp_cuda_plan.h"
#include "dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- device-side error word ---- */

enum {
    TP_CUDA_ERR_NONE = 0,
    TP_CUDA_ERR_EMBED_ID = 1,      /* a = 0, b = the id, c = its position */
    TP_CUDA_ERR_BARRIER_TIMEOUT = 2, /* a = the peer waited for, b = slot, c = epoch */
    TP_CUDA_ERR_GATHER_ID = 3,       /* a = 0, b = the id, c = its position in ids */
    TP_CUDA_ERR_ABORTED = 4,         /* a barrier stopped on the abort word: a = peer, b = slot, c = epoch */
    TP_CUDA_ERR_KV_ROW = 5           /* kv_attention row a: slot b or position c out of range */
};

typedef struct {
    int code; /* first error wins (atomicCAS from 0) */
    int a;
    long long b, c;
} tp_cuda_error;

/* ---- cross-rank synchronisation on the symmetric control block ----
 *
 * Flags: [slot][block][src rank] 64-bit epochs in every rank's control
 * block; rank r arrives at barrier e by writing e into slot [..][..][r] of
 * every peer and waits until its own [..][..][p] >= e for every p. Epochs
 * come from per-rank counters in device memory that every barrier kernel
 * advances itself, so a captured graph replays with fresh epochs and every
 * rank, running the same sequence, agrees on them. */

#define TP_CUDA_SYNC_BLOCKS 32 /* the one-shot grid: fixed, identical on every rank */
#define TP_CUDA_SYNC_SLOTS 4

enum {
    TP_CUDA_SLOT_ONESHOT_IN = 0,  /* one-shot all_reduce: inputs ready */
    TP_CUDA_SLOT_ONESHOT_OUT = 1, /* one-shot all_reduce: peers done reading */
    TP_CUDA_SLOT_FUSED_IN = 2,    /* fused pulls: shards ready */
    TP_CUDA_SLOT_FUSED_OUT = 3    /* fused pulls: peers done pulling */
};

/* Bytes of one rank's control block: flags, then counters. */
#define TP_CUDA_CTRL_FLAGS (TP_CUDA_SYNC_SLOTS * TP_CUDA_SYNC_BLOCKS * TP_CUDA_MAX_WORLD)
#define TP_CUDA_CTRL_COUNTERS (TP_CUDA_SYNC_SLOTS * TP_CUDA_SYNC_BLOCKS)
#define TP_CUDA_CTRL_BYTES ((TP_CUDA_CTRL_FLAGS + TP_CUDA_CTRL_COUNTERS) * 8)

typedef struct {
    unsigned long long *peer_flags[TP_CUDA_MAX_WORLD]; /* every rank's flags, this process's mapping */
    unsigned long long *flags;                         /* this rank's flags */
    unsigned long long *counters;                      /* this rank's epochs [slot][block] */
    tp_cuda_error *err;
    /* Host-mapped word (cudaHostAllocMapped, this process's device
     * address) the backend sets, never clears, once it is dead or revoked:
     * every wait then ends (kernels/cuda/comm_protocol.h). NULL: none. */
    int *abort;
    unsigned long long timeout_ns; /* a barrier gives up (and reports) after this */
    int rank, world;
} tp_cuda_sync;

/* Every rank's pointer to one symmetric buffer (this process's mapping). */
typedef struct {
    const void *p[TP_CUDA_MAX_WORLD];
} tp_cuda_peers;

/* ---- tensor kernels (tensor_ops.cu) ---- */

/* dst = src over l (operand 0 dst, 1 src), es bytes per element (1, 2, 4, 8);
 * src NULL writes zeros. */
int tp_cuda_copy_strided(void *dst, const void *src, const tp_layout *l, int es, void *stream);

/* out = a (op) b, op 0 add, 1 sub, 2 mul, 3 div (floats only); l over
 * out's shape with operand 0 a, 1 b (broadcast strides), 2 out. Floats
 * compute in f32 and round once, integers wrap. */
int tp_cuda_binary(int op, const void *a, const void *b, void *out, const tp_layout *l, tp_dtype dtype,
                   void *stream);

typedef struct {
    const void *ids;
    tp_dtype id_dtype;     /* TP_I32 or TP_I64 */
    tp_layout ids_l;       /* operand 0: the ids, in row-major order */
    const void *table;
    int64_t ts0, ts1;      /* table strides */
    int64_t V, E;          /* local rows, row length */
    int64_t lo, total;     /* first global id held here; ids must be < total */
    void *out;             /* contiguous [n_ids, E] */
    int es;                /* element bytes of table/out */
    tp_cuda_error *err;
} tp_cuda_embedding_args;
/* Rows of ids in [lo, lo+V) are copied, other valid ids give zeros, an id
 * outside [0, total) gives zeros and TP_CUDA_ERR_EMBED_ID. */
int tp_cuda_embedding(const tp_cuda_embedding_args *a, void *stream);

#define TP_CUDA_ATTN_MAX_DV 256
typedef struct {
    const void *q, *k, *v;
    void *out;               /* contiguous [B, H, S, Dv] */
    int64_t B, H, S, T, D, Dv;
    int64_t Hkv;             /* k's and v's heads: H, or a divisor of it (GQA: tp_attn_kv_head) */
    int64_t qs[4], ks[4], vs[4];
    float scale;
    int causal;              /* bottom-right aligned: query i sees keys j <= i + T - S */
    const void *mask;        /* key-padding mask [B, T] or NULL: key t of row b iff mask[b, t] != 0 */
    tp_dtype mask_dtype;     /* TP_I32 or TP_I64 */
    int64_t ms[2];           /* mask strides */
    tp_dtype dtype;
} tp_cuda_attn_args;
/* One warp per query row, online softmax in f32 from tp_math.h's pieces;
 * which keys a query sees is tp_attn_mask.h's rule, and a query that sees
 * no key gets zeros. Dv <= TP_CUDA_ATTN_MAX_DV. */
int tp_cuda_attention(const tp_cuda_attn_args *a, void *stream);

/* ---- generation (kernels/cuda/generate.cu; the math: common/tp_generate.h) ---- */

typedef struct {
    const void *q, *k, *v;      /* [B, H, T, D], [B, Hkv, T, D] x2, any strides */
    int64_t qs[4], ks[4], vs[4];
    void *k_cache, *v_cache;    /* contiguous [S, Hkv, L, D] states */
    const void *slot, *pos;     /* [B] INT32/INT64 */
    tp_dtype slot_dtype, pos_dtype;
    int64_t ss, ps;             /* slot, pos strides */
    void *out;                  /* contiguous [B, H, T, D] */
    int64_t B, H, Hkv, T, D, S, L;
    float scale;
    tp_dtype dtype;             /* of q, k, v, caches, out: FP32, FP16 or BF16 */
    tp_cuda_error *err;
} tp_cuda_kv_args;
/* Two launches on one stream, so every row's writes precede every row's
 * reads: k/v rows into the caches at (slot - 1, pos + t), then one warp per
 * query row attends over keys 0 .. pos + t of kv head h / (H / Hkv), online
 * softmax in f32. Slot 0 rows write nothing and give zeros; a row whose
 * slot or position is out of range does the same and reports
 * TP_CUDA_ERR_KV_ROW. D <= TP_CUDA_ATTN_MAX_DV. */
int tp_cuda_kv_attention(const tp_cuda_kv_args *a, void *stream);

typedef struct {
    const void *x;              /* [rows, n] floats: row r at r's layout offset, columns at stride xs */
    tp_layout rows_l;           /* operand 0: x's leading dims (row-major order of the rows) */
    int64_t xs, n;
    int64_t lo, limit;          /* global index of column 0; columns at or past limit are ignored */
    tp_dtype dtype;
    int64_t *out;               /* contiguous [rows] packed keys */
} tp_cuda_argmax_args;
/* One block per row: the largest tp_gen_key over the row. */
int tp_cuda_argmax(const tp_cuda_argmax_args *a, void *stream);
/* ids = tp_gen_key_index(keys): l over out's shape, operand 0 the keys,
 * operand 1 out (contiguous). */
int tp_cuda_argmax_index(const int64_t *keys, int64_t *out, const tp_layout *l, void *stream);
/* matmul_rows' unwanted rows: rows [rows, row_elems] of the contiguous
 * float out whose mask element (INT32/INT64, mask_stride apart) is 0 are
 * set to +0.0 (tp_gen_row_wanted), after the product of every row. */
int tp_cuda_zero_rows(void *out, tp_dtype dtype, int64_t rows, int64_t row_elems, const void *mask,
                      tp_dtype mask_dtype, int64_t mask_stride, void *stream);

/* reduce_mean (mean = 1) / reduce_sum of x over p's dim into contiguous
 * out of n_out elements; float dtypes, FP32 sums in index order. */
int tp_cuda_reduce(const void *x, void *out, const tp_reduce_plan *p, int64_t n_out, int mean, tp_dtype dtype,
                   void *stream);

typedef struct {
    const void *x, *ids;
    tp_dtype id_dtype; /* TP_I32 or TP_I64 */
    void *out;         /* contiguous, n_out elements */
    int es;            /* element bytes of x and out */
    tp_gather_plan p;
    tp_cuda_error *err;
} tp_cuda_gather_args;
/* gather along p's dim; an id outside [-n, n) gives zeros and
 * TP_CUDA_ERR_GATHER_ID. */
int tp_cuda_gather(const tp_cuda_gather_args *a, int64_t n_out, void *stream);

/* out = cond != 0 ? x : y over l (operand 0 cond, 1 x, 2 y, 3 out, broadcast
 * strides), es bytes per element of x, y, out. */
int tp_cuda_where(const void *cond, tp_dtype cond_dtype, const void *x, const void *y, void *out,
                  const tp_layout *l, int es, void *stream);

typedef struct {
    const void *x, *cos, *sin;
    void *out;
    tp_layout rows;          /* out's dims but the last (tp_rope_rows): operands x, cos, sin, out */
    int64_t D;               /* the last dim, even */
    int64_t xs, cs, ss;      /* x's, cos's and sin's strides along it (out's is 1) */
    tp_dtype dtype;          /* FP32, FP16 or BF16 */
} tp_cuda_rope_args;
/* out = x cos + rotate_half(x) sin, one thread per element (tp_rope). */
int tp_cuda_rope(const tp_cuda_rope_args *a, void *stream);

/* out = x converted (tp_cast_elem) over l (operand 0 x, 1 out). */
int tp_cuda_cast(const void *x, tp_dtype x_dtype, void *out, tp_dtype out_dtype, const tp_layout *l,
                 void *stream);

/* Packs (to_packed = 1: natural src -> packed dst) or unpacks a contiguous
 * [outer, d*len, inner] tensor by blocks of the middle dim. */
int tp_cuda_block_pack(const void *src, void *dst, int64_t outer, int64_t len, int64_t inner, int d, int es,
                       int to_packed, void *stream);

/* out[i] = reduce over src = 0..d-1 (rank order) of chunk(src)[i], where
 * chunk(rank) = own and chunk(src) = stage + tp_rs_step_of(rank, d, src) *
 * count elements: the reduce of fused_matmul_reduce_scatter. */
int tp_cuda_reduce_chunks(const void *own, const void *stage, void *out, int64_t count, int rank, int d,
                          int red, tp_dtype dtype, void *stream);

/* p[i] = p[i] / d (integers: truncated toward zero), the avg NCCL leaves to us. */
int tp_cuda_finish_avg(void *p, int64_t count, int d, tp_dtype dtype, void *stream);

/* ---- cross-rank kernels (comm_kernels.cu) ---- */

/* One-block barrier of every rank on `slot` (TP_CUDA_SLOT_FUSED_*). */
int tp_cuda_barrier(const tp_cuda_sync *s, int slot, void *stream);

/* out = reduce over ranks (rank order) of each rank's `in` read in place
 * through peer mappings, between an arrival and a departure barrier
 * (TP_CUDA_SLOT_ONESHOT_*), TP_CUDA_SYNC_BLOCKS blocks. out must not
 * overlap this rank's in: peers may still be reading it while out is
 * written (in-place all_reduce goes to NCCL). */
int tp_cuda_oneshot_all_reduce(const tp_cuda_sync *s, const tp_cuda_peers *in, void *out, int64_t count,
                               tp_dtype dtype, int red, void *stream);

/* out_dev[p] = this process's address of peer p's byte 0 of an NCCL
 * symmetric window (win is an ncclWindow_t), for p < world. */
int tp_cuda_window_peer_bases(void *win, int world, void **out_dev, void *stream);

/* Size of the communicator's load/store-accessible team (ncclTeamLsa): the
 * peer-reading kernels need every rank in it. comm is an ncclComm_t. */
int tp_cuda_nccl_lsa_size(void *comm);

/* Whether the communicator has NCCL symmetric memory: 1 yes, 0 no
 * (ncclDevCommCreate refuses with ncclInvalidUsage: no all-pairs CUDA P2P,
 * NCCL_CUMEM_ENABLE=0, NCCL_WIN_ENABLE=0), or minus the ncclResult_t of
 * another failure. Without it ncclCommWindowRegister still succeeds, with
 * a local registration handle as the "window". Collective: every rank
 * calls it at the same point. comm is an ncclComm_t. */
int tp_cuda_nccl_symmetric_support(void *comm);

#ifdef __cplusplus
}
#endif

#endif
