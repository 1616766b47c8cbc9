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

/* OpenBLAS threads for each rank's GEMMs when `world` ranks share `cores`
 * usable CPUs (affinity and cgroup quota: tp_spin_cores): the cores shared
 * out, at least one. The ranks are the first parallelism; cores left over
 * go to the GEMMs (world size 1 on 2 cores: 2 threads; 2 ranks: 1 each). */
int tp_blas_threads_per_rank(int world, int cores);

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
