/* test_narrow_rows.c — kernels/cpu/narrow_rows.h gives dtype.h's bits:
 * every FP16 and BF16 value widened, and FP32 bit patterns rounded to both
 * (every rounding tie and its neighbours over all exponents, the halves'
 * subnormal and overflow edges, NaNs and infinities, and a fixed-seed
 * random sweep), at lengths and offsets that leave a scalar tail and
 * unaligned rows. On a CPU without AVX2 and F16C the scalar code runs
 * and the comparison holds trivially; `make test-cpus` runs such CPUs. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/narrow_rows.h"
#include "dtype.h"

static const tp_dtype NARROW[2] = {TP_F16, TP_BF16};

static float from_bits(uint32_t b)
{
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    return b;
}

/* Widens n halves starting at p + off (off 0..7: unaligned starts and
 * every tail length) and compares the bits with dtype.h's conversion. */
static void check_load(const uint16_t *p, int64_t n, tp_dtype dt)
{
    float *got = malloc(sizeof(float) * (size_t)n);
    ck_assert_ptr_nonnull(got);
    for (int64_t off = 0; off < 8 && off < n; off++) {
        narrow_rows_load(p + off, dt, n - off, got);
        for (int64_t i = 0; i < n - off; i++) {
            uint32_t g = bits_of(got[i]), want = bits_of(tp_load_f32(p, dt, off + i));
            if (g != want) /* not ck_assert per element: each one is a mark point */
                ck_assert_msg(0, "%s 0x%04x: widened to 0x%08x, dtype.h 0x%08x", tp_dtype_name(dt), p[off + i], g,
                              want);
        }
    }
    free(got);
}

START_TEST(every_narrow_value_widens_as_dtype_h)
{
    uint16_t *all = malloc(sizeof(uint16_t) * 65536);
    ck_assert_ptr_nonnull(all);
    for (uint32_t h = 0; h < 65536; h++)
        all[h] = (uint16_t)h;
    for (int d = 0; d < 2; d++)
        check_load(all, 65536, NARROW[d]);
    printf("every_narrow_value_widens_as_dtype_h: 65536 values each, %s\n",
           narrow_rows_vectorized() ? "AVX2 + F16C" : "scalar");
    free(all);
}
END_TEST

/* The FP32 patterns: each exponent (and sign) with mantissas at and
 * around the rounding points of BF16 (bit 16) and of FP16 (bit 13, and
 * bits 14-23 where a half is subnormal), plus random patterns. */
static uint32_t *patterns(int64_t *n)
{
    static const uint32_t low[] = {0,      1,      0xfff,  0x1000, 0x1001, 0x1fff, 0x2000, 0x3000,
                                   0x7fff, 0x8000, 0x8001, 0xffff, 0x10000, 0x18000, 0x7fffff, 0x400000};
    const int64_t n_low = (int64_t)(sizeof low / sizeof low[0]), n_random = 1 << 20;
    int64_t cap = 2 * 256 * 64 * n_low + n_random, k = 0;
    uint32_t *p = malloc(sizeof(uint32_t) * (size_t)cap);
    ck_assert_ptr_nonnull(p);
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t e = 0; e < 256; e++)
            for (uint32_t hi = 0; hi < 64; hi++) /* the mantissa's top 6 bits, so ties meet odd and even */
                for (int64_t l = 0; l < n_low; l++)
                    p[k++] = sign << 31 | e << 23 | ((hi << 17 | low[l]) & 0x7fffffu);
    uint64_t s = 0x9e3779b97f4a7c15u;
    for (int64_t i = 0; i < n_random; i++) {
        s = s * 6364136223846793005u + 1442695040888963407u;
        p[k++] = (uint32_t)(s >> 32);
    }
    *n = k;
    return p;
}

START_TEST(fp32_patterns_round_as_dtype_h)
{
    int64_t n;
    uint32_t *bits = patterns(&n);
    float *src = malloc(sizeof(float) * (size_t)n);
    uint16_t *got = malloc(sizeof(uint16_t) * (size_t)n);
    ck_assert(src && got);
    for (int64_t i = 0; i < n; i++)
        src[i] = from_bits(bits[i]);
    for (int d = 0; d < 2; d++)
        for (int64_t off = 0; off < 8; off++) {
            narrow_rows_store(got, NARROW[d], n - off, src + off);
            for (int64_t i = 0; i < n - off; i++) {
                uint16_t want = NARROW[d] == TP_F16 ? tp_f32_to_f16(src[off + i]) : tp_f32_to_bf16(src[off + i]);
                if (got[i] != want)
                    ck_assert_msg(0, "%s of 0x%08x: 0x%04x, dtype.h 0x%04x", tp_dtype_name(NARROW[d]), bits[off + i],
                                  got[i], want);
            }
        }
    printf("fp32_patterns_round_as_dtype_h: %lld patterns\n", (long long)n);
    free(bits), free(src), free(got);
}
END_TEST

static Suite *narrow_rows_suite(void)
{
    Suite *s = suite_create("narrow_rows");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, every_narrow_value_widens_as_dtype_h);
    tcase_add_test(tc, fp32_patterns_round_as_dtype_h);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(narrow_rows_suite)
