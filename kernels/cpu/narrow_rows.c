/* narrow_rows.c — see narrow_rows.h. */
#include "narrow_rows.h"

#include <pthread.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#define NARROW_TARGET __attribute__((target("avx2,f16c")))
#endif

static void load_scalar(const uint16_t *p, tp_dtype dt, int64_t n, float *dst)
{
    for (int64_t i = 0; i < n; i++)
        dst[i] = dt == TP_F16 ? tp_f16_to_f32(p[i]) : tp_bf16_to_f32(p[i]);
}

static void store_scalar(uint16_t *p, tp_dtype dt, int64_t n, const float *src)
{
    for (int64_t i = 0; i < n; i++)
        p[i] = dt == TP_F16 ? tp_f32_to_f16(src[i]) : tp_f32_to_bf16(src[i]);
}

#if defined(__x86_64__)
/* A BF16 is the top half of an FP32: exact, NaNs included. */
NARROW_TARGET static void load_bf16_avx2(const uint16_t *p, int64_t n, float *dst)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + i)));
        _mm256_storeu_si256((__m256i *)(dst + i), _mm256_slli_epi32(w, 16));
    }
    load_scalar(p + i, TP_BF16, n - i, dst + i);
}

/* Halves are exact in FP32; a NaN half (exponent 31, mantissa not 0:
 * above 0x7c00 without its sign) goes through tp_f16_to_f32, which keeps
 * a signalling NaN signalling where vcvtph2ps would quiet it. */
NARROW_TARGET static void load_f16_f16c(const uint16_t *p, int64_t n, float *dst)
{
    const __m128i abs_mask = _mm_set1_epi16(0x7fff), inf = _mm_set1_epi16(0x7c00);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm_loadu_si128((const __m128i *)(p + i));
        if (_mm_movemask_epi8(_mm_cmpgt_epi16(_mm_and_si128(h, abs_mask), inf)))
            load_scalar(p + i, TP_F16, 8, dst + i);
        else
            _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    load_scalar(p + i, TP_F16, n - i, dst + i);
}

/* The lanes of x that are NaN, as a byte mask (0 when none). */
NARROW_TARGET static int nan_lanes(__m256i x)
{
    __m256i a = _mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff));
    return _mm256_movemask_epi8(_mm256_cmpgt_epi32(a, _mm256_set1_epi32(0x7f800000)));
}

/* vcvtps2ph rounds to nearest even with overflow to infinity and
 * subnormal halves, as tp_f32_to_f16 does; NaNs go to the scalar code. */
NARROW_TARGET static void store_f16_f16c(uint16_t *p, int64_t n, const float *src)
{
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 v = _mm256_loadu_ps(src + i);
        if (nan_lanes(_mm256_castps_si256(v)))
            store_scalar(p + i, TP_F16, 8, src + i);
        else
            _mm_storeu_si128((__m128i *)(p + i), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    store_scalar(p + i, TP_F16, n - i, src + i);
}

/* tp_f32_to_bf16's rounding: add 0x7fff plus the kept part's lowest bit,
 * keep the top 16 bits (which fit packus's unsigned 16-bit range). */
NARROW_TARGET static void store_bf16_avx2(uint16_t *p, int64_t n, const float *src)
{
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_loadu_si256((const __m256i *)(src + i));
        if (nan_lanes(x)) {
            store_scalar(p + i, TP_BF16, 8, src + i);
            continue;
        }
        __m256i odd = _mm256_and_si256(_mm256_srli_epi32(x, 16), one);
        __m256i r = _mm256_srli_epi32(_mm256_add_epi32(x, _mm256_add_epi32(bias, odd)), 16);
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(p + i), _mm256_castsi256_si128(packed));
    }
    store_scalar(p + i, TP_BF16, n - i, src + i);
}
#endif

static pthread_once_t probe_once = PTHREAD_ONCE_INIT;
static int vectorized;

static void probe(void)
{
#if defined(__x86_64__)
    /* F16C from CPUID leaf 1 (clang's __builtin_cpu_supports does not
     * know it); "avx2" also means the OS saves the ymm registers. */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    vectorized = __builtin_cpu_supports("avx2") && __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
#endif
}

int narrow_rows_vectorized(void)
{
    pthread_once(&probe_once, probe);
    return vectorized;
}

void narrow_rows_load(const uint16_t *p, tp_dtype dt, int64_t n, float *dst)
{
#if defined(__x86_64__)
    if (narrow_rows_vectorized()) {
        if (dt == TP_F16)
            load_f16_f16c(p, n, dst);
        else
            load_bf16_avx2(p, n, dst);
        return;
    }
#endif
    load_scalar(p, dt, n, dst);
}

void narrow_rows_store(uint16_t *p, tp_dtype dt, int64_t n, const float *src)
{
#if defined(__x86_64__)
    if (narrow_rows_vectorized()) {
        if (dt == TP_F16)
            store_f16_f16c(p, n, src);
        else
            store_bf16_avx2(p, n, src);
        return;
    }
#endif
    store_scalar(p, dt, n, src);
}
