/* blas_pick.h — the OpenBLAS kernel set this CPU should run, when OpenBLAS
 * itself picked an older one.
 *
 * OpenBLAS chooses its kernels at load time from a table of CPU models.
 * A table older than the CPU falls back to the oldest x86-64 kernels:
 * Debian 12's OpenBLAS 0.3.21 runs Prescott's SSE3 kernels on an Intel
 * Emerald Rapids (family 6, model 207), 26 GFLOP/s for a 512 x 512 sgemm
 * on one core where its Cooperlake (AVX-512) kernels reach 146. The
 * choice can only be changed by OPENBLAS_CORETYPE in the environment of a
 * process before it loads OpenBLAS, so `tpserve serve` sets it and
 * re-executes itself (server/main.c; the rank processes inherit it). A
 * user's own OPENBLAS_CORETYPE always wins. */
#ifndef TP_BLAS_PICK_H
#define TP_BLAS_PICK_H

#include <stdint.h>

/* OpenBLAS threads for each rank's GEMMs when `world` ranks share `cores`
 * usable CPUs (affinity and cgroup quota: tp_spin_cores): the cores shared
 * out, at least one. The ranks are the first parallelism; cores left over
 * go to the GEMMs (world size 1 on 2 cores: 2 threads; 2 ranks: 1 each). */
int tp_blas_threads_per_rank(int world, int cores);

/* Makes `threads` (>= 1) this process's OpenBLAS thread count for the
 * products that gain from threads (tp_blas_product_threads), and starts
 * them. The cpu backend calls it at creation; the last call wins (one
 * OpenBLAS per process). */
void tp_blas_set_threads(int threads);
/* The count tp_blas_set_threads set (1 before any call). */
int tp_blas_threads(void);

/* Products smaller than these run on one OpenBLAS thread whatever the
 * count. OpenBLAS 0.3.21 threads every product over 2^18 multiply-adds,
 * and its threads meet through spin-and-yield loops at every block: below
 * these sizes the second thread costs more than it does. Measured on the
 * 2-core AMD EPYC VM (Zen kernels), 2 threads' time over 1's: attention's
 * per-head products (128 x 64 x 128, 128 x 128 x 64: 2^20) 1.05-1.2x
 * back to back and up to 4x between other work, 512 x 64 x 128 (2^22)
 * 1.04-1.15x, 4-12 rows of 768 x 3072 1.15-1.7x; against 0.54-0.72x at
 * 2^23 and beyond with 16 rows or more (16 x 768 x 768, 128 x 256 x 256,
 * 1024 x 64 x 128, every weight product of a 128-token request). */
#define TP_BLAS_THREADED_MIN_MACS ((int64_t)1 << 23)
#define TP_BLAS_THREADED_MIN_ROWS 16

/* The OpenBLAS threads an M x K by K x N product (M rows of c) runs on
 * when the process's count is `threads`: all of them, or 1 for a product
 * under the sizes above. */
int tp_blas_product_threads(int64_t M, int64_t N, int64_t K, int threads);

/* Around one OpenBLAS level-3 call of that product: begin makes OpenBLAS
 * run it on tp_blas_product_threads's count (1 under tp_blas_one_thread)
 * and returns it; end lets the count change again. OpenBLAS has one count
 * per process, read when a call starts, and its results depend on it (it
 * splits the product between its threads: 1 and 2 threads differ in the
 * last bits), so calls that want different counts never overlap: a call
 * waits while others run on another count. Calls on one count overlap
 * freely (ranks' one-thread products at once; OpenBLAS itself serializes
 * its threaded ones). */
int tp_blas_call_begin(int64_t M, int64_t N, int64_t K);
void tp_blas_call_end(void);

/* Per thread: while `on`, the calling thread's products run on one
 * OpenBLAS thread whatever their size (tp_blas_call_begin answers 1). A
 * cpu pool's tasks run so (cpu_pool.h): the pool already spreads its job
 * over the rank's cores. Returns the previous setting, to restore. */
int tp_blas_one_thread(int on);

/* The CPU features the choice looks at. */
enum {
    TP_CPU_AVX = 1u << 0,
    TP_CPU_AVX2_FMA = 1u << 1,
    TP_CPU_AVX512 = 1u << 2, /* F, BW, VL, DQ, CD, and saved by the OS */
    TP_CPU_AVX512_BF16 = 1u << 3,
};

/* This CPU's (TP_CPU_* bits). */
unsigned tp_cpu_blas_features(void);

/* The OPENBLAS_CORETYPE to force on a CPU with these features when
 * OpenBLAS detected `detected` (openblas_get_corename): the newest kernel
 * set of OpenBLAS 0.3.21 the features run, when it is newer than the
 * detected one; NULL otherwise, and for a name it does not know. */
const char *tp_blas_core_upgrade(const char *detected, unsigned features);

/* The environment variable that tells the cpu backend's startup note
 * which kernels OpenBLAS had detected when tpserve forced others. */
#define TP_BLAS_DETECTED_ENV "TPSERVE_OPENBLAS_DETECTED"

/* For a process about to re-execute itself: sets OPENBLAS_CORETYPE (and
 * TP_BLAS_DETECTED_ENV) when OpenBLAS runs older kernels than this CPU
 * can and the environment forces none. 1 when it set them. */
int tp_blas_pick_for_exec(void);

#endif
