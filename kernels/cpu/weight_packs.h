/* weight_packs.h — the weights this process packed for packed_gemm.h,
 * found by address when a matmul runs.
 *
 * The engine tells the backend, once a param is loaded, that it is read
 * only as the b of matmuls (backend.h, prepare_matmul_weight). Its
 * packed panels are kept here under the param's address, dtype and
 * [K, N] view (strides included): a matmul whose b is exactly that view
 * runs on the panels; any other view of the same memory runs OpenBLAS on
 * the param. When nothing else reads an FP32 param and its panels are as
 * large as it is (N a multiple of PGEMM_NR), they overwrite it in place,
 * so packing costs no memory; otherwise they live beside it.
 *
 * A sole param whose panels cannot replace it (FP16/BF16, N not a
 * multiple of PGEMM_NR, unaligned) has the whole pages inside it given
 * back to the kernel once packed: nothing reads it again.
 *
 * FP16/BF16 weights are widened into FP32 panels once, beside the param:
 * without them every product converted its whole weight to FP32 on every
 * call (an FP16 GPT-2 small at 4.7x onnxruntime's time, which also holds
 * its FP16 weights as FP32 after load). The product is what the unpacked
 * path computes: FP32 accumulation of the widened values, rounded once.
 *
 * Process-wide, because a rank's weights are at addresses of their own
 * (ranks as threads share the table; a rank process has its own):
 * entries are added while the engine loads, read by every matmul, and
 * removed when the backend frees the param's memory. */
#ifndef TP_WEIGHT_PACKS_H
#define TP_WEIGHT_PACKS_H

#include <stddef.h>
#include <stdint.h>

#include "dtype.h"
#include "status.h"

/* Whether weights are packed in this process: the CPU runs packed_gemm.h
 * and TPSERVE_CPU_GEMM is not "openblas" (read once). */
int weight_packs_enabled(void);

/* TPSERVE_CPU_GEMM's value checked: unset, empty, "packed" (the default)
 * or "openblas". Anything else fails, naming it: a misspelt "openblas"
 * would otherwise measure the packed GEMM while its user thinks not. */
tp_status weight_packs_check_setting(tp_err *err);

/* Packs w, a [K, N] view of dt elements (FP32, FP16 or BF16; element
 * (k, n) at w[k * sbk + n * sbn], strides >= 0), and keeps it under w.
 * in_place: nothing but matmuls of exactly this view reads w, so FP32
 * panels may replace it, and panels beside it leave it dead (its whole
 * pages are released and read as zeros). A second call for the same w is
 * refused. No-op when weight_packs_enabled is 0 or dt is not a float
 * type. */
tp_status weight_packs_add(void *w, tp_dtype dt, int64_t K, int64_t N, int64_t sbk, int64_t sbn, int in_place,
                           tp_err *err);

/* w's panels when a matmul by this [K, N] view of it, of dt elements, may
 * use them, else NULL. */
const float *weight_packs_find(const void *w, tp_dtype dt, int64_t K, int64_t N, int64_t sbk, int64_t sbn);

/* Forgets w (its memory is being freed) and frees panels kept beside it.
 * Memory never packed is a no-op. */
void weight_packs_forget(const void *w);

#endif
