/* packed_gemm.h — tpserve's FP32 GEMM by a weight packed once at load.
 *
 * OpenBLAS packs b into its kernel's layout on every call, and its
 * threads meet in spin-and-yield loops at every block: at world size 1,
 * a 128-token GPT-2 request spent 13% of its samples packing weights and
 * 13% yielding (perf, 2-core EPYC), though a weight never changes. Here
 * b is packed once into panels of PGEMM_NR columns (K rows of NR floats
 * each, the last panel zero-padded), and c = a . b runs a 6 x 16
 * AVX2/FMA micro-kernel over BLIS's blocking: a KC-deep slice of one
 * panel (16 KB) stays in L1 while up to MC rows of a stream from L2. a
 * is read where it lies, each tile broadcasting from its rows lda apart:
 * packing it first (as BLIS does) was 2% of a 512-row Llama request's
 * CPU time and a pool job of its own per product, and a 512 x 768 x 640
 * product ran 2-5% faster on a Xeon core without it (11% at N 384). Where the CPU has AVX-512F, a 6 x 32 kernel takes two
 * adjacent panels at once (pgemm_wide). Callers split the panels between
 * threads themselves.
 *
 * Every element of c is the same chain of operations whatever M, the
 * rows beside it and the panels a call covers: KC-long chains of fused
 * multiply-adds in k order, each added to c in k order. A row's result
 * therefore never depends on its batch or on the thread split. */
#ifndef TP_PACKED_GEMM_H
#define TP_PACKED_GEMM_H

#include <stddef.h>
#include <stdint.h>

#define PGEMM_NR 16
#define PGEMM_MR 6
#define PGEMM_KC 256
#define PGEMM_MC 132 /* 22 tiles of a: 132 KB of L2 at KC */
#define PGEMM_NC_PANELS 64 /* at least 1024 columns a group: b's kc x NC slice is 1 MB */
#define PGEMM_C_BLOCK_BYTES ((int64_t)2 << 20) /* a group's block of c: wider groups for fewer rows */

/* Whether this CPU runs the kernel (AVX2 and FMA). */
int pgemm_supported(void);

/* Whether it also runs the wide kernel: two panels at once in AVX-512
 * registers, the same chain of operations for every element, so the same
 * bits as the AVX2 kernel. */
int pgemm_wide_supported(void);

/* TPSERVE_CPU_GEMM_AVX2=1 keeps the AVX2 kernel where AVX-512 runs: to
 * compare the two, and to run on a machine what a CPU without AVX-512
 * would. Read once, on first use. */
#define PGEMM_NARROW_ENV "TPSERVE_CPU_GEMM_AVX2"

/* Whether products run the wide kernel now: pgemm_wide_supported and not
 * turned off by PGEMM_NARROW_ENV. */
int pgemm_wide(void);

/* Turns the wide kernel on (where supported) or off; returns whether it
 * was on. For tests: set it while no product runs. */
int pgemm_set_wide(int on);

/* Panels of b's N columns; floats of its packed form. */
int64_t pgemm_panels(int64_t N);
size_t pgemm_packed_floats(int64_t K, int64_t N);

/* Packs b, a K x N matrix with element (k, n) at b[k * sbk + n * sbn]
 * (a [N, K] weight read as transposed: sbk 1, sbn K), into dst
 * (pgemm_packed_floats; must not overlap b; 32-byte aligned: the kernel
 * loads the panels with aligned AVX loads). */
void pgemm_pack(const float *b, int64_t K, int64_t N, int64_t sbk, int64_t sbn, float *dst);

/* Panels pgemm_run takes at a time for M rows: at least PGEMM_NC_PANELS,
 * and as many as keep the group's M x NC block of c within
 * PGEMM_C_BLOCK_BYTES. */
int64_t pgemm_group_panels(int64_t M);

/* c[M, columns of panels p0 .. p1 - 1] = a[M, K] . b, with a's rows lda
 * apart (unit column stride), c's ldc apart, b packed by pgemm_pack. c's
 * columns past N in the last panel are never written. Only on a CPU
 * pgemm_supported. */
void pgemm_run(int64_t M, int64_t K, int64_t N, const float *a, int64_t lda, const float *packed, float *c,
               int64_t ldc, int64_t p0, int64_t p1);

#endif
