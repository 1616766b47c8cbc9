/* ops_internal.h — helpers shared by the cpu kernels (kernels/cpu/ops_*.c).
 * Not part of the backend API; cpu_ops.h is. */
#ifndef TP_CPU_OPS_INTERNAL_H
#define TP_CPU_OPS_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "common/tp_cuda_plan.h"
#include "cpu_ops.h"
#include "cpu_pool.h"

#define OPS_MAX_OPERANDS TP_LAYOUT_OPS

/* OPS_SIMD_CLONES: x86-64-v4 (AVX-512) and x86-64-v3 (AVX2 and FMA)
 * clones beside the baseline one, picked at load time by the CPU (GCC's
 * target_clones; any x86-64 runs one of them). All give the same bits:
 * nothing is contracted to FMA behind the code's back (-std=c11 keeps
 * contraction off), the fused multiply-adds tp_math.h asks for (fmaf) are
 * one rounding in every clone (an instruction in v3 and v4, glibc's fmaf
 * in the baseline one, which only CPUs without FMA run), and vectorizing
 * keeps each lane's order of operations (tp_math.h's sums run in fixed
 * lanes). For the loops where the kernels spend their time outside the
 * BLAS.
 *
 * OPS_IVDEP: before a loop whose iteration i writes only element i: no
 * dependence between iterations, even in place (y == x), so GCC need not
 * version the loop on aliasing.
 *
 * Both are GCC's: clang (the fuzz build) would not export the clones'
 * dispatcher, and has no such pragma (and warns). */
#if defined(__GNUC__) && !defined(__clang__)
#define OPS_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define OPS_IVDEP _Pragma("GCC ivdep")
#else
#define OPS_SIMD_CLONES
#define OPS_IVDEP
#endif

/* tp_math.h's row functions, compiled in both clones. */
void ops_softmax_row(const float *x, float *y, int64_t n);
void ops_layer_norm_row(const float *x, const float *w, const float *b, float *y, int64_t n, float eps);
void ops_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);

/* Element address of offset off (in elements) from base. */
static inline char *ops_at(const void *base, tp_dtype dt, int64_t off)
{
    return (char *)base + off * (int64_t)tp_dtype_size(dt);
}

/* An iteration space shared by up to OPS_MAX_OPERANDS strided operands,
 * after coalescing (tp_layout_init's rules: size-1 dims dropped, adjacent
 * dims merged wherever every operand allows it). Always at least one dim. */
typedef struct {
    int nd, nops;
    int64_t shape[TP_MAX_DIMS];
    int64_t stride[OPS_MAX_OPERANDS][TP_MAX_DIMS];
} ops_layout;

/* A position in the first `iter` dims of a layout, with every operand's
 * element offset. Zero-initialise to start at the origin. */
typedef struct {
    int64_t idx[TP_MAX_DIMS];
    int64_t off[OPS_MAX_OPERANDS];
} ops_pos;

/* strides[k] points at nd strides of operand k. */
void ops_layout_init(ops_layout *l, int nd, const int64_t *shape, int nops,
                     const int64_t *const *strides);
/* Product of the first `iter` dims. */
int64_t ops_layout_count(const ops_layout *l, int iter);
/* Advances p over the first `iter` dims (odometer order). */
void ops_pos_next(const ops_layout *l, ops_pos *p, int iter);

/* Broadcast strides: tp_broadcast_strides (kernels/common/tp_cuda_plan.h),
 * the same function the cuda kernels use. */

/* Elements [e0, e1) of the row at p (every operand's offset) of an
 * elementwise kernel's layout. */
typedef void (*ops_row_fn)(void *arg, const ops_pos *p, int64_t e0, int64_t e1);

/* Runs fn over every row of the first l->nd - 1 dims of l (n elements
 * each), split over the pool's threads when the op is large enough to
 * gain: by rows when there are enough of them, else by elements within
 * each row. Each element is computed by the same code wherever it
 * lands, so the split never changes a bit. NULL pool: the caller alone. */
tp_status ops_run_rows(cpu_pool *pool, const ops_layout *l, int64_t n, ops_row_fn fn, void *arg, tp_err *err);
/* ops_run_rows whose elements are `unit` values each (rope: a row of x's
 * last dim), which the split threshold counts. */
tp_status ops_run_rows_of(cpu_pool *pool, const ops_layout *l, int64_t n, int64_t unit, ops_row_fn fn, void *arg,
                          tp_err *err);

/* n elements at stride s of dtype dt, widened to f32 / rounded from f32. */
void ops_load_row(const void *base, tp_dtype dt, int64_t s, int64_t n, float *dst);
void ops_store_row(void *base, tp_dtype dt, int64_t s, int64_t n, const float *src);
/* Whole tensor (any strides, any dtype) into a contiguous f32 buffer. */
void ops_gather_f32(const tp_tensor *t, float *dst);
/* The same, its rows split over the pool's threads when large enough
 * (ops_run_rows): an FP16 matmul's a widened on the rank's thread alone
 * was 1.5% of an FP16 Llama request's samples while its workers waited. */
tp_status ops_gather_f32_on(cpu_pool *pool, const tp_tensor *t, float *dst, tp_err *err);

/* Bytes of scratch a kernel may copy operands into only to save BLAS calls
 * (ops_matmul.c, fused.c). Past it the products are large enough that a
 * call's fixed cost no longer shows, and copying the whole of a big
 * activation each step would double what the memory plan keeps small (the
 * fused kernels exist not to materialize a gathered input). */
#define OPS_COPY_MAX_BYTES (256 * 1024)

/* cat, reshape and contiguous split a copy of at least this many bytes
 * over the rank's pool (cpu_tensor_copy_on), as elementwise ops split
 * from 2^16 elements: RoPE's cat of a 512-row Llama's q ([4, 12, 128, 64],
 * runs of 32 floats) took 225 us on one thread while the other waited. */
#define OPS_COPY_SPLIT_MIN_BYTES ((int64_t)256 * 1024)

/* A growable float scratch buffer. */
typedef struct {
    float *p;
    size_t cap;
} ops_buf;
tp_status ops_buf_reserve(ops_buf *b, size_t n, tp_err *err);
void ops_buf_free(ops_buf *b);

/* Allocates n floats or fails with TP_NOMEM naming what. */
tp_status ops_alloc_f32(float **p, size_t n, const char *what, tp_err *err);

/* t as an FP32 tensor: t itself (strides kept) when it is FP32, else a
 * contiguous FP32 copy in *owned (free it). */
tp_status ops_as_f32(const tp_tensor *t, tp_tensor *f, float **owned, const char *what,
                     tp_err *err);

/* c[M,N] (row-major, rows ldc >= N elements apart) = alpha * a[M,K] . b[K,N],
 * with a and b given by element strides. Layouts BLAS cannot take are first
 * copied into the scratch buffers. K = 0 gives zeros. */
tp_status ops_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *a, int64_t sam,
                    int64_t sak, const float *b, int64_t sbk, int64_t sbn, float *c, int64_t ldc,
                    ops_buf *sa, ops_buf *sb, tp_err *err);

/* One function per op family. */
tp_status cpu_binary(tp_op op, const tp_tensor *a, const tp_tensor *b, tp_tensor *out, cpu_pool *pool,
                     tp_err *err);
tp_status cpu_unary(tp_op op, const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, cpu_pool *pool,
                    tp_err *err);
tp_status cpu_softmax(const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, tp_err *err);
tp_status cpu_norm(tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                   tp_tensor *out, tp_err *err);
/* out may be an FP32 view whose last dim is contiguous and whose rows are
 * further apart (a column block of a wider tensor): BLAS writes it in place
 * (cpu_matmul_writes_in_place). Other outputs must be contiguous. A
 * product of a few rows by a large b (a decode step's) splits b's columns
 * over pool (NULL: the caller alone). */
tp_status cpu_matmul(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *b,
                     tp_tensor *out, cpu_pool *pool, tp_err *err);
int cpu_matmul_writes_in_place(const tp_tensor *out);
/* Keeps in pool the scratch cpu_matmul will ask of it for a by b into
 * out, or for any fewer of a's rows (cpu_matmul_rows runs row subsets). */
tp_status cpu_matmul_reserve(const tp_attrs *attrs, const tp_tensor *a, const tp_tensor *b, const tp_tensor *out,
                             cpu_pool *pool, tp_err *err);
/* matmul of x's rows (dim 0) whose mask [B] (INT32/INT64) is nonzero by a
 * 2-d w; the other rows of the contiguous out are zeros (matmul_rows). */
tp_status cpu_matmul_rows(const tp_attrs *attrs, const tp_tensor *x, const tp_tensor *w, const tp_tensor *mask,
                          tp_tensor *out, cpu_pool *pool, tp_err *err);
/* mask: the optional key-padding mask [B, T] (INT32/INT64, nonzero =
 * attend), or NULL; kernels/common/tp_attn_mask.h. The heads run on pool
 * (NULL: the caller alone). */
tp_status cpu_attention(const tp_attrs *attrs, const tp_tensor *q, const tp_tensor *k,
                        const tp_tensor *v, const tp_tensor *mask, tp_tensor *out, cpu_pool *pool,
                        tp_err *err);
tp_status cpu_embedding(const tp_attrs *attrs, const tp_tensor *ids, const tp_tensor *table,
                        tp_tensor *out, int rank, int world, tp_err *err);
tp_status cpu_cat(const tp_attrs *attrs, const tp_tensor *ins, int n_ins, tp_tensor *out, cpu_pool *pool,
                  tp_err *err);
tp_status cpu_copy(tp_op op, const tp_tensor *x, tp_tensor *out, cpu_pool *pool, tp_err *err);
tp_status cpu_where(const tp_tensor *ins, tp_tensor *out, tp_err *err);
/* ins: x, cos, sin (ops_rope.c); rows split over pool (NULL: the caller). */
tp_status cpu_rope(const tp_tensor *ins, tp_tensor *out, cpu_pool *pool, tp_err *err);
tp_status cpu_cast(const tp_tensor *x, tp_tensor *out, cpu_pool *pool, tp_err *err);
tp_status cpu_reduce(tp_op op, const tp_attrs *attrs, const tp_tensor *x, tp_tensor *out, tp_err *err);
tp_status cpu_gather(const tp_attrs *attrs, const tp_tensor *x, const tp_tensor *ids, tp_tensor *out,
                     tp_err *err);
tp_status cpu_expand(const tp_tensor *x, tp_tensor *out, tp_err *err);
/* ins: q, k, v, k_cache, v_cache, slot, pos (ops_generate.c); the heads
 * run on pool (NULL: the caller alone) */
tp_status cpu_kv_attention(const tp_attrs *attrs, const tp_tensor *ins, tp_tensor *out, cpu_pool *pool,
                           tp_err *err);
/* argmax (x: floats -> INT64 keys) and argmax_index (keys -> ids), by op */
tp_status cpu_argmax_family(tp_op op, const tp_attrs *a, const tp_tensor *x, tp_tensor *out, int rank, int world,
                            tp_err *err);

#endif
