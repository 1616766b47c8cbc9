/* collectives.h — collectives of the cpu backend. Ranks are threads in one
 * address space: each rank publishes its input descriptor, all ranks meet at
 * a barrier, each reads its peers' buffers directly and writes its own
 * output, and a second barrier keeps inputs alive until every peer has read.
 *
 * A failing rank calls cpu_comm_abort so its peers leave the barrier with an
 * error instead of hanging (the "capture error turned into a hang" lesson). */
#ifndef TP_CPU_COLLECTIVES_H
#define TP_CPU_COLLECTIVES_H

#include "ops.h"
#include "status.h"
#include "tensor.h"

typedef struct cpu_comm cpu_comm;

cpu_comm *cpu_comm_create(int world, tp_err *err);
void cpu_comm_free(cpu_comm *c);
int cpu_comm_world(const cpu_comm *c);
/* Wakes every waiter; every later barrier/collective fails until reset. */
void cpu_comm_abort(cpu_comm *c);
/* Clears the aborted state; only call when no rank is inside the comm. */
void cpu_comm_reset(cpu_comm *c);
tp_status cpu_comm_barrier(cpu_comm *c, int rank, tp_err *err);

/* Building blocks for kernels that talk to peers themselves (the fused
 * ones): publish `mine` and wait until every rank has published; then
 * cpu_comm_peer(c, r) is rank r's tensor until cpu_comm_release, which
 * returns once every rank is done reading. */
tp_status cpu_comm_exchange(cpu_comm *c, int rank, const tp_tensor *mine, tp_err *err);
const tp_tensor *cpu_comm_peer(const cpu_comm *c, int r);
void cpu_comm_release(cpu_comm *c, int rank);

/* all_reduce lowered as a ring (choose_collectives picks it above the
 * one-shot threshold); out must be contiguous. */
tp_status cpu_ring_all_reduce(cpu_comm *c, int rank, const tp_attrs *attrs, const tp_tensor *in, tp_tensor *out,
                              tp_err *err);

/* Runs op (all_gather, reduce_scatter, all_reduce, all_to_all, broadcast)
 * for this rank. Every rank calls it with the same op and attrs. in may be a
 * strided view; out is contiguous with the inferred local output shape. */
tp_status cpu_collective_run(cpu_comm *c, int rank, tp_op op, const tp_attrs *attrs,
                             const tp_tensor *in, tp_tensor *out, tp_err *err);

#endif
