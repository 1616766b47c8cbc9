/* narrow_rows.h — contiguous rows of FP16/BF16 widened to FP32 and
 * rounded back, eight at a time where the CPU has AVX2 and F16C.
 *
 * Every FP16/BF16 op of the cpu backend widens its inputs and rounds its
 * result once through these rows; one element at a time through
 * dtype.h's conversions, the rounding alone was 26% of an FP16 GPT-2
 * request's samples and the widening 11%. The bits are dtype.h's in every
 * case: lanes holding a NaN (whose payloads F16C keeps and tp_f32_to_f16
 * does not) take the scalar conversion, and test_narrow_rows compares
 * every FP16 value and a sweep of FP32 bit patterns with it. */
#ifndef TP_CPU_NARROW_ROWS_H
#define TP_CPU_NARROW_ROWS_H

#include <stdint.h>

#include "dtype.h"

/* dst[i] = p[i] widened, i < n; dt is TP_F16 or TP_BF16. */
void narrow_rows_load(const uint16_t *p, tp_dtype dt, int64_t n, float *dst);

/* p[i] = src[i] rounded to nearest even, i < n; dt is TP_F16 or TP_BF16. */
void narrow_rows_store(uint16_t *p, tp_dtype dt, int64_t n, const float *src);

/* Whether the eight-lane conversions run on this CPU (for tests). */
int narrow_rows_vectorized(void);

#endif
