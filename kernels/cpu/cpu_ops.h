/* cpu_ops.h — compute and copy kernels of the cpu backend, one rank each.
 *
 * Inputs may be strided views (any strides, including 0 for broadcast and
 * permuted orders); the output is a contiguous tensor whose shape the engine
 * has already inferred. Float ops compute in FP32 and round once on store, so
 * FP16/BF16 results match an FP32 reference rounded to the output type. */
#ifndef TP_CPU_OPS_H
#define TP_CPU_OPS_H

#include "cpu_pool.h"
#include "ops.h"
#include "status.h"
#include "tensor.h"

/* Runs op (kind COMPUTE or COPY: add sub mul div, the unary functions
 * gelu silu relu sqrt rsqrt exp neg tanh erf sigmoid pow, softmax
 * layer_norm rms_norm reduce_mean reduce_sum matmul matmul_rows attention embedding
 * gather where expand cast cat reshape contiguous).
 * rank/world are needed by embedding with vocab_parallel. Fails (without
 * crashing) on an id out of range or an op it does not implement. */
tp_status cpu_op_run(tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                     tp_tensor *out, int rank, int world, tp_err *err);
/* cpu_op_run on the rank's worker pool (cpu_pool.h; NULL: the caller's
 * thread alone, which is cpu_op_run): attention and kv_attention spread
 * their heads over it, with the same bits on any pool. */
tp_status cpu_op_run_on(cpu_pool *pool, tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                        tp_tensor *out, int rank, int world, tp_err *err);
/* Keeps in pool what cpu_op_run_on will take from it for this op and
 * these tensors (cpu_pool_reserve): a capture calls it for each command
 * it records, so replays find their scratch resident. */
tp_status cpu_op_reserve(cpu_pool *pool, tp_op op, const tp_attrs *attrs, const tp_tensor *ins, int n_ins,
                         const tp_tensor *out, tp_err *err);
/* dst = src (the same shape, any strides), split over pool's threads
 * along the first dim longer than 1 once it has at least split_bytes
 * (pool NULL: on the caller's thread). */
tp_status cpu_tensor_copy_on(cpu_pool *pool, tp_tensor *dst, const tp_tensor *src, int64_t split_bytes,
                             tp_err *err);
/* Whether cpu_op_run has a kernel for op. */
int cpu_op_has_kernel(tp_op op);

#endif
