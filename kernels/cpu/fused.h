/* fused.h — the fused communication + GEMM kernels of the cpu backend.
 *
 * fused_all_gather_matmul: ins = {x, w_1..w_n}. Computes its own shard's
 *   rows first, then the rows of rank (r+i)%d read straight from that peer's
 *   (symmetric) x; the gathered x is never materialized.
 * fused_matmul_reduce_scatter: ins = {a, w, workspace}. Computes the product
 *   chunk destined for each peer (peers first, its own last) into its
 *   symmetric workspace, then reduces its own chunk from every peer's
 *   workspace. */
#ifndef TP_CPU_FUSED_H
#define TP_CPU_FUSED_H

#include "collectives.h"

tp_status cpu_fused_run(cpu_comm *c, int rank, tp_op op, const tp_attrs *attrs, const tp_tensor *ins,
                        int n_ins, tp_tensor *out, tp_err *err);

#endif
