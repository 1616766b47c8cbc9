/* collectives.h — collectives of the cpu backend. Each rank publishes its
 * input descriptor, all ranks meet at a barrier, each reads its peers'
 * buffers directly and writes its own output, and a second barrier keeps
 * inputs alive until every peer has read.
 *
 * Ranks are threads of one process (cpu_comm_create) or live in several
 * processes that map the same shared memory, each at its own address
 * (cpu_comm_attach). Both use one code path: the comm's state holds tensors
 * by value with their data as an offset from the shared base, and a reader
 * adds its own mapping's base (0 for threads, so the offset is the pointer).
 *
 * A failing rank calls cpu_comm_abort so its peers leave the barrier with an
 * error instead of hanging (the "capture error turned into a hang" lesson);
 * a dead process makes the group call cpu_comm_lost, which fails every wait. */
#ifndef TP_CPU_COLLECTIVES_H
#define TP_CPU_COLLECTIVES_H

#include <stddef.h>
#include <stdint.h>

#include "ops.h"
#include "status.h"
#include "tensor.h"

typedef struct cpu_comm cpu_comm;

/* Ranks are threads of this process; the state is private memory. */
cpu_comm *cpu_comm_create(int world, tp_err *err);

/* Ranks in several processes: the state lives in the comm area
 * [base + offset, base + offset + bytes) of a shared mapping (64-byte
 * aligned, at least cpu_comm_shared_bytes(world) long). The owner
 * initializes it and must attach before anyone else; the others check that
 * it was initialized for the same world size and build. Tensors passed to
 * the collectives must lie in [base, base + span): peers read them there. */
typedef struct {
    char *base;
    size_t span;
    size_t offset, bytes;
    int owner;
} cpu_comm_shared;

size_t cpu_comm_shared_bytes(int world);
cpu_comm *cpu_comm_attach(int world, const cpu_comm_shared *sh, tp_err *err);

/* Frees this handle; shared state is left as it is for the other processes. */
void cpu_comm_free(cpu_comm *c);
int cpu_comm_world(const cpu_comm *c);
/* How long a rank waiting at a barrier spins before it sleeps, in ns (0:
 * sleep at once). Default: tp_spin_budget(world, tp_spin_cores()), see
 * util/spin_wait.h; tests set it to make spinning observable. */
void cpu_comm_set_spin(cpu_comm *c, int64_t ns);
/* A rank failed: wakes every waiter (in every process); every later
 * barrier/collective fails until reset. Waits that must complete (the exit
 * of a collective, see collectives.c) still complete. */
void cpu_comm_abort(cpu_comm *c);
/* A rank's process is gone: wakes every waiter and fails every wait,
 * including those abort lets complete. Permanent: reset keeps it. */
void cpu_comm_lost(cpu_comm *c);
/* Clears the aborted state; only call when no rank of any process is
 * inside the comm. A no-op on a non-owner shared handle. */
void cpu_comm_reset(cpu_comm *c);
tp_status cpu_comm_barrier(cpu_comm *c, int rank, tp_err *err);

/* Building blocks for kernels that talk to peers themselves (the fused
 * ones): publish `mine` and wait until every rank has published; then
 * cpu_comm_peer(c, r) is rank r's tensor in this process's address space
 * until cpu_comm_release, which returns once every rank is done reading.
 * release fails only when the comm is lost (the peers' reads are then not
 * known to be finished, and the results are not to be trusted). */
tp_status cpu_comm_exchange(cpu_comm *c, int rank, const tp_tensor *mine, tp_err *err);
tp_tensor cpu_comm_peer(const cpu_comm *c, int r);
tp_status cpu_comm_release(cpu_comm *c, int rank, tp_err *err);

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
