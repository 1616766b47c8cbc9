/* cpu_pool.h — a rank's worker threads for the kernels whose work splits
 * into independent tasks outside the BLAS (attention's heads).
 *
 * The cpu backend gives each rank a pool of as many threads as its GEMMs
 * get (tp_blas_threads_per_rank: the caller plus threads - 1 workers), so
 * at world size 1 on 2 cores attention's heads run on both cores as the
 * GEMMs around it do. A worker waiting for the next job, and the caller
 * waiting for the workers still in its job, spin for a bounded time
 * before they sleep (cpu_pool.c says why), and stop spinning where spins
 * keep running out (tp_spin_site).
 *
 * A job's tasks run on the caller and the workers in any order and on
 * any of them. Each participant has a slot (0 for the caller, 1 ..
 * threads - 1 the workers) whose scratch is its own for the job. Products
 * a task computes run on one OpenBLAS thread whatever their size
 * (tp_blas_one_thread): the pool already spreads the job over the rank's
 * cores, and a product's bits depend on OpenBLAS's thread count, so the
 * results of a job whose tasks are deterministic never depend on the
 * pool's size. */
#ifndef TP_CPU_POOL_H
#define TP_CPU_POOL_H

#include <stdint.h>

#include "status.h"

typedef struct cpu_pool cpu_pool;

/* Task `task` (0 .. n_tasks - 1) of a job, on participant `slot`. */
typedef tp_status (*cpu_pool_fn)(void *arg, int64_t task, int slot, tp_err *err);

/* A pool of `threads` participants (>= 1; 1: the caller alone, no worker
 * started) into *out. Its waits spin up to spin_ns before they sleep:
 * tp_spin_budget of every busy thread on the cores, 0 where they
 * outnumber them. */
tp_status cpu_pool_create(int threads, int64_t spin_ns, cpu_pool **out, tp_err *err);
/* Stops and joins the workers. NULL is a no-op. */
void cpu_pool_free(cpu_pool *p);

/* Participants of a job (1 for NULL). */
int cpu_pool_threads(const cpu_pool *p);

/* Runs fn(arg, task, slot) for every task and returns when all have
 * finished. p NULL: every task on the caller (slot 0). On a failing task
 * the tasks not yet started are skipped and the first failure's status
 * and message are returned. One job at a time per pool (a second caller
 * waits); a task must not run a job on its own pool. */
tp_status cpu_pool_run(cpu_pool *p, int64_t n_tasks, cpu_pool_fn fn, void *arg, tp_err *err);

/* Scratch buffers a pool keeps between jobs, per slot: CPU_POOL_SCRATCHES
 * of them, each at least `floats` floats (grown as asked; contents not
 * kept), 64-byte aligned, freed with the pool. Per-call buffers of
 * megabytes were fresh pages on every call (glibc hands them back to the
 * kernel): an FP16 GPT-2 request at batch 4 faulted 92,000 times, 67,000
 * more than its FP32 twin. They hold no more than the per-call buffers
 * they replace did at their peak, but keep it. Only the participant
 * running as `slot` may use
 * its buffers, until its task returns (slot 0: the thread that runs the
 * pool's jobs, also between them), except that slot 0's may be read by
 * every participant of a job the slot-0 thread runs (an FP16 matmul's
 * widened a). NULL when p is NULL or out of memory: the caller allocates
 * its own. */
#define CPU_POOL_SCRATCHES 2
float *cpu_pool_scratch(cpu_pool *p, int slot, int which, size_t floats);

/* Grows buffer `which` of slots 0 .. slots - 1 to at least `floats` floats and
 * touches what it grew, so that the memory is resident now: a capture
 * reserves what its replays will ask for (cpu_op_reserve), and the server's
 * memory budget, set once the model is loaded, counts it. Only while no
 * job runs. 0, or -1 when out of memory (p NULL: 0, nothing kept). */
int cpu_pool_reserve(cpu_pool *p, int which, int slots, size_t floats);

/* Bytes of scratch the pool keeps. */
size_t cpu_pool_scratch_bytes(const cpu_pool *p);

#endif
