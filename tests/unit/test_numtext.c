/* test_numtext.c — numbers as JSON text (numtext.h) and tensor data arrays
 * read and written as text (json_tensor.h).
 *
 * Round trips are compared bit for bit on purpose: "shortest text that reads
 * back to the same value" is an exact guarantee, not an approximation. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf_pool.h"
#include "check_main.h"
#include "dtype.h"
#include "json_tensor.h"
#include "numtext.h"

/* Under ASan a quarter of the random samples and three of the seven k of
 * the exhaustive short-reader check (1, 4, 7): what it looks for, each
 * token's reads, every sample and every k exercise alike, at several
 * times the time (68 s of make asan); the plain build runs them all. */
#ifdef __SANITIZE_ADDRESS__
#define SAMPLES(n) ((n) / 4)
#define K_STEP 3
#else
#define SAMPLES(n) (n)
#define K_STEP 1
#endif

static uint32_t f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static int sig_digits(const char *s)
{
    return tp_numtext_digits(s, strlen(s));
}

/* One float through the writer, then back through our reader and glibc's
 * strtof (a client's reader): same bits, at most 9 significant digits,
 * and a valid JSON number. */
static void check_f32(uint32_t bits)
{
    float f = bits_f32(bits);
    char buf[TP_NUMTEXT_MAX + 1];
    size_t n = tp_numtext_f32(f, buf);
    buf[n] = '\0';
    int is_int;
    ck_assert_msg(tp_numtext_scan(buf, n, &is_int) == n, "'%s' is not a JSON number", buf);
    ck_assert_msg(f32_bits(tp_numtext_parse_f32(buf, n)) == bits, "%08x -> '%s' reads back as "
                  "%a", bits, buf, (double)tp_numtext_parse_f32(buf, n));
    ck_assert_msg(f32_bits(strtof(buf, NULL)) == bits, "%08x -> '%s' (strtof)", bits, buf);
    ck_assert_msg(sig_digits(buf) <= 9, "'%s' has more than 9 significant digits", buf);
}

START_TEST(f32_round_trip)
{
    static const float edge[] = {0.0f, -0.0f, 1.0f, -2.0f, 0.1f, 1e-45f, 1.17549435e-38f,
                                 3.40282347e38f, 16777216.0f, 16777217.0f, 1e9f, 1e-6f, 9.999999e-7f};
    for (size_t i = 0; i < sizeof edge / sizeof edge[0]; i++)
        check_f32(f32_bits(edge[i]));
    /* every exponent, scattered mantissas (the exhaustive run is
     * `make test-numtext-exhaustive`) */
    uint32_t s = 12345;
    for (int i = 0; i < SAMPLES(400000); i++) {
        s = s * 1664525u + 1013904223u;
        if ((s & 0x7f800000u) != 0x7f800000u)
            check_f32(s);
    }
}
END_TEST

START_TEST(f32_spelling)
{
    char buf[TP_NUMTEXT_MAX + 1];
    const struct {
        float f;
        const char *want;
    } cases[] = {{1.5f, "1.5"}, {-2.0f, "-2.0"}, {0.1f, "0.1"}, {1e-7f, "1e-7"},
                 {123456.7f, "123456.7"}, {3.40282347e38f, "3.4028235e38"}, {0.0f, "0.0"},
                 {-0.0f, "-0.0"}, {100.0f, "100.0"}, {16777216.0f, "16777216.0"},
                 /* above 2^24 the shortest digits, not the exact integer 123456792 */
                 {123456792.0f, "123456790.0"}, {1e9f, "1e9"}, {1e-6f, "0.000001"},
                 {9.999999e-7f, "9.999999e-7"}, {-0.00123f, "-0.00123"}, {1e-45f, "1e-45"},
                 /* a subnormal whose one-digit neighbours both lie in its interval
                  * (21 x 2^-149: 3e-44, not 2.9e-44) */
                 {2.9427e-44f, "3e-44"},
                 /* a power of two: the gap below is half the gap above */
                 {1.17549435e-38f, "1.1754944e-38"}, {8388608.0f, "8388608.0"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        /* the writer may overwrite the buffer past its text, never past TP_NUMTEXT_MAX */
        memset(buf, 'x', sizeof buf);
        buf[tp_numtext_f32(cases[i].f, buf)] = '\0';
        ck_assert_str_eq(buf, cases[i].want);
        ck_assert_int_eq(buf[TP_NUMTEXT_MAX], 'x');
    }
}
END_TEST

/* The list writer against tp_numtext_f32 one value at a time: the same
 * text, ',' between, for counts around its 64-value blocks, from unaligned
 * data, with zeros of both signs, subnormals, every notation; it stops
 * before a NaN or Inf at that index, and writes no more than
 * count * (TP_NUMTEXT_MAX + 1) bytes. */
static void check_list(const uint32_t *bits, size_t count, size_t want_written)
{
    char *data = malloc(4 * count + 1), *out = malloc(count * (TP_NUMTEXT_MAX + 1) + 1);
    char *want = malloc(count * (TP_NUMTEXT_MAX + 1) + 1);
    memcpy(data + 1, bits, 4 * count); /* +1: unaligned */
    memset(out, 'x', count * (TP_NUMTEXT_MAX + 1) + 1);
    size_t written = 99999, w = 0;
    size_t len = tp_numtext_f32_list(data + 1, count, out, &written);
    for (size_t i = 0; i < want_written; i++) {
        if (i)
            want[w++] = ',';
        w += tp_numtext_f32(bits_f32(bits[i]), want + w);
    }
    ck_assert_uint_eq(written, want_written);
    ck_assert_uint_eq(len, w);
    ck_assert_msg(memcmp(out, want, w) == 0, "count %zu: '%.*s' against '%.*s'", count, (int)len, out,
                  (int)w, want);
    ck_assert_int_eq(out[count * (TP_NUMTEXT_MAX + 1)], 'x');
    free(data);
    free(out);
    free(want);
}

START_TEST(f32_list)
{
    enum { MAX = 300 };
    static const float edge[] = {0.0f, -0.0f, 1.5f, -2.0f, 1e-7f, 3.40282347e38f, 1e-45f, 123456.7f,
                                 100.0f, 1e9f, 1e-6f, -0.00123f, 16777216.0f, 123456792.0f};
    uint32_t bits[MAX];
    uint32_t s = 777;
    for (size_t i = 0; i < MAX; i++) {
        s = s * 1664525u + 1013904223u;
        bits[i] = i % 5 == 0 ? f32_bits(edge[(i / 5) % (sizeof edge / sizeof edge[0])])
                             : (s & 0x7f800000u) == 0x7f800000u ? s ^ 0x40000000u : s;
    }
    static const size_t counts[] = {0, 1, 2, 63, 64, 65, 128, 129, MAX};
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++)
        check_list(bits, counts[k], counts[k]);
    /* a NaN or Inf ends the text before it, in the first block or a later one */
    static const size_t at[] = {0, 5, 63, 64, 200};
    static const uint32_t bad[] = {0x7fc00000u, 0xff800000u, 0x7f800001u};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        uint32_t keep = bits[at[k]];
        bits[at[k]] = bad[k % 3];
        check_list(bits, MAX, at[k]);
        bits[at[k]] = keep;
    }
}
END_TEST

/* The list writer runs Schubfach eight at a time on AVX2 lanes where the
 * CPU has them (numtext.c, f32_shortest8), tp_numtext_f32 the scalar code:
 * the same text for a million patterns spread over every exponent, every
 * power of two (the narrower gap below), the integers below 2^24 around
 * each exponent, and the smallest subnormals. (make
 * test-numtext-exhaustive checks all 2^32.) */
START_TEST(f32_list_lanes_match_scalar)
{
    enum { CHUNK = 4096 };
    uint32_t bits[CHUNK];
    size_t n = 0;
    uint64_t u = 0;
    for (int pass = 0; pass < 4; pass++) {
        for (uint32_t i = 0;; i++) {
            uint32_t b;
            if (pass == 0) { /* a stride through all patterns, finite ones kept */
                if ((u += 4099) >> 32)
                    break;
                b = (uint32_t)u;
                if ((b & 0x7f800000u) == 0x7f800000u)
                    continue;
            } else if (pass == 1) { /* powers of two, both signs, and their neighbours */
                if (i >= 255 * 6)
                    break;
                static const uint32_t step[3] = {0, 1, 0xffffffffu}; /* the power, above, below */
                b = ((i / 6 << 23) + step[i % 3]) & 0x7fffffffu;
                b |= i % 6 >= 3 ? 0x80000000u : 0;
                if ((b & 0x7f800000u) == 0x7f800000u)
                    continue;
            } else if (pass == 2) { /* integers 1..2^24 */
                if (i >= 1u << 24)
                    break;
                if (i % 97 && i > 4096)
                    continue;
                b = f32_bits((float)(i + 1));
            } else { /* the smallest subnormals */
                if (i >= 4096)
                    break;
                b = i;
            }
            bits[n++] = b;
            if (n == CHUNK) {
                check_list(bits, n, n);
                n = 0;
            }
        }
    }
    check_list(bits, n, n);
}
END_TEST

/* Every finite FP16 and BF16 value: the text reads back (our reader and
 * strtod, as numpy does) to the same half, in at most 5 (FP16) or 4 (BF16)
 * digits, and no shorter precision would have. */
static void check_all_halves(size_t (*write)(uint16_t, char *), float (*widen)(uint16_t),
                             uint16_t (*narrow)(float), uint16_t exp_mask, int max_digits)
{
    char buf[TP_NUMTEXT_MAX + 1];
    for (uint32_t h = 0; h < 65536; h++) {
        if ((h & exp_mask) == exp_mask)
            continue;
        size_t n = write((uint16_t)h, buf);
        buf[n] = '\0';
        ck_assert_msg(narrow(tp_numtext_parse_f32(buf, n)) == h, "%04x -> '%s'", h, buf);
        ck_assert_msg(narrow((float)strtod(buf, NULL)) == h, "%04x -> '%s' (strtod)", h, buf);
        ck_assert_msg(sig_digits(buf) <= max_digits, "%04x -> '%s'", h, buf);
        if (sig_digits(buf) > 1) {
            char shorter[TP_NUMTEXT_MAX + 1];
            size_t m = tp_numtext_precision(widen((uint16_t)h), sig_digits(buf) - 1, shorter);
            ck_assert_msg(narrow(tp_numtext_parse_f32(shorter, m)) != h, "%04x: '%s' is not "
                          "the shortest", h, buf);
        }
    }
}

START_TEST(halves_exhaustive)
{
    check_all_halves(tp_numtext_f16, tp_f16_to_f32, tp_f32_to_f16, 0x7c00, 5);
    check_all_halves(tp_numtext_bf16, tp_bf16_to_f32, tp_f32_to_bf16, 0x7f80, 4);
}
END_TEST

/* A random decimal token at tok from the generator *s (advanced): an
 * optional '-', 1..max_digits digits, maybe a point among them, no leading
 * zero; its length (tok is not terminated). */
static int random_decimal(uint64_t *s, int max_digits, char *tok)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    int nd = 1 + (int)((*s >> 33) % (unsigned)max_digits), point = (int)((*s >> 40) % (unsigned)(nd + 1)), n = 0;
    if ((*s >> 52) & 1)
        tok[n++] = '-';
    uint64_t r = *s ^ (*s >> 17);
    for (int d = 0; d < nd; d++) {
        if (d == point && d > 0)
            tok[n++] = '.';
        r = r * 2862933555777941757ULL + 3037000493ULL;
        tok[n++] = (char)('0' + (d == 0 && nd > 1 && point != 1 ? 1 + (r >> 40) % 9 : (r >> 40) % 10));
    }
    return n;
}

/* The reader (its fast path for short decimals, and <charconv> behind it,
 * numtext_charconv.cc) against glibc's strtof, which is correctly rounded:
 * bit for bit, over random tokens of every shape the fast path takes and
 * some it must hand to the library (8+ digits, exponents past 10), signs
 * and zeros included, and tokens beyond FP32's range, which std::from_chars
 * refuses and strtof rounds to zero or infinity. */
START_TEST(f32_reader_matches_strtof)
{
    static const char *edge[] = {"0", "-0", "0.0", "-0.0", "0e5", "0.000000e-40", "16777215",
                                 "16777216", "16777217", "9999999", "9999999e10", "1e-10",
                                 "1e10", "1e11", "1e-11", "3.4028235e38", "1.4e-45",
                                 "0.1", "0.3", "-2.5e-3", "1E+2", "0.00000001", "1e-50",
                                 "-1e-50", "7e-46", "1e50", "-1e50", "3.4028236e38",
                                 "0.0000001e-39", "123456789012e30", "1e-400", "-1e400",
                                 "0.00000000000000000000000000000000000000000000001",
                                 "1e99999999999999999999", "-1e-99999999999999999999"};
    for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) {
        float want = strtof(edge[k], NULL), got = tp_numtext_parse_f32(edge[k], strlen(edge[k]));
        ck_assert_msg(f32_bits(got) == f32_bits(want), "%s: %a, strtof %a", edge[k], got, want);
    }
    uint64_t s = 12345;
    char tok[64];
    for (int k = 0; k < SAMPLES(400000); k++) {
        int n = random_decimal(&s, 9, tok);
        int e = (s >> 57) & 1 ? (int)((s >> 45) % 101) - 55 : (int)((s >> 45) % 27) - 13;
        if ((s >> 56) & 1)
            n += snprintf(tok + n, sizeof tok - (size_t)n, "e%d", e);
        tok[n] = 0;
        float want = strtof(tok, NULL), got = tp_numtext_parse_f32(tok, (size_t)n);
        ck_assert_msg(f32_bits(got) == f32_bits(want), "%s: %a, strtof %a", tok, got, want);
    }
}
END_TEST

/* tp_numtext_wide_f32 on tok: whether it took it (and *out); the scalar
 * reader (what CPUs without SSE4.1 run, and every token not of the vector
 * reader's shape) takes the same tokens with the same bits, and the
 * array's reader (on a padded copy) what it or the short reader takes. */
static int wide_take(const char *tok, float *out)
{
    float g = -1234.5f, h = -1234.5f;
    size_t len = strlen(tok);
    char padded[128];
    ck_assert(len + TP_NUMTEXT_READ_AHEAD < sizeof padded);
    memset(padded, ' ', sizeof padded);
    memcpy(padded, tok, len);
    int took = tp_numtext_wide_f32(tok, len, out);
    ck_assert_msg(tp_numtext_wide_f32_scalar(tok, len, &g) == took, "'%s': the two wide readers disagree", tok);
    ck_assert_msg(!took || f32_bits(*out) == f32_bits(g), "'%s': %a, scalar reader %a", tok, *out, g);
    /* the array's reader takes what the short or the wide reader takes */
    float sh = -1234.5f;
    int short_took = tp_numtext_short_f32_swar(padded, len, &sh);
    ck_assert_msg(tp_numtext_read_f32(padded, len, &h) == (short_took || took), "'%s': the array's reader disagrees",
                  tok);
    ck_assert_msg(!(short_took || took) || f32_bits(h) == f32_bits(short_took ? sh : g), "'%s': %a, the others %a",
                  tok, h, short_took ? sh : g);
    return took;
}

/* The wide readers on the number tok: 1 with strtof's bits, or 0 (declined). */
static int wide_read(const char *tok)
{
    float f = -1234.5f, want = strtof(tok, NULL);
    ck_assert_msg(f32_bits(tp_numtext_parse_f32(tok, strlen(tok))) == f32_bits(want), "'%s': %a, strtof %a", tok,
                  tp_numtext_parse_f32(tok, strlen(tok)), want);
    if (!wide_take(tok, &f))
        return 0;
    ck_assert_msg(f32_bits(f) == f32_bits(want), "'%s': %a, strtof %a", tok, f, want);
    return 1;
}

/* The reader of up to 19 digits through one double product: right on
 * what Python clients send (the 17-digit repr of each FP32 value as a
 * double), on values next to the midpoints between floats (where a double
 * rounding would go wrong), and it hands back what it cannot tell. */
START_TEST(f32_wide_reader)
{
    ck_assert(wide_read("0.30481421947479248"));
    ck_assert(wide_read("-0.10000000149011612"));
    ck_assert(wide_read("1.2345678901234567e-05"));
    ck_assert(wide_read("-0"));
    ck_assert(wide_read("1234567890123456789"));       /* 19 digits */
    ck_assert(wide_read("0.0000000000000000000001")); /* 1e-22 */
    ck_assert(wide_read("1e22"));
    ck_assert(!wide_read("12345678901234567890")); /* 20 digits: the library's */
    ck_assert(!wide_read("1e23") && !wide_read("1e-23"));
    ck_assert(!wide_read("16777217"));     /* exactly between 2^24 and 2^24 + 2 */
    ck_assert(!wide_read("3.4028235e38")); /* next to FLT_MAX */
    ck_assert(!wide_read("0e999"));
    /* the vector reader's shape (17-32 bytes, the last 16 digits) and its edges */
    ck_assert(wide_read("0.65515398979187012") && wide_read("-0.65515398979187012"));
    ck_assert(wide_read("0.0012345678901234567") && wide_read("-123.4567890123456789"));
    ck_assert(!wide_read("0.00000000000000000000000000001")); /* q -29: the library's */
    ck_assert(wide_read("999.9999999999999999") && !wide_read("1000.0000000000000001")); /* 19, 20 digits */
    ck_assert(wide_read("12345678901234567") && wide_read("1234567890123456.7")); /* no point, point in the 16 */
    ck_assert(wide_read("1.2345678901234567e-05"));
    /* the reader ahead's shape (up to 16 bytes after the sign) and its edges */
    ck_assert(wide_read("0.65515399") && wide_read("-0.65515399") && wide_read("5") && wide_read("-0.0"));
    ck_assert(wide_read("1234567890123456") && wide_read("-1234567890123456")); /* 16 digits, no point */
    ck_assert(wide_read("123456789.012345") && wide_read("0.00000000000001"));
    ck_assert(!wide_read("16777217.0") && wide_read("16777217.01"));
    /* text that is no JSON number is declined (scan and the library judge it) */
    static const char *not_numbers[] = {"01", "-01", "1.", ".5", "-", "", "1e", "1e+", "1.5x", "--1",
                                        "1 2", "+1", "0x10", "1.2.3", "1e5e5", "1.e5", "-.5",
                                        /* the vector reader's shape, but no JSON number */
                                        "00.1234567890123456", ".12345678901234567", "-.12345678901234567",
                                        "1..1234567890123456", "0.1.1234567890123456", "+0.1234567890123456",
                                        "--0.1234567890123456", "0x.1234567890123456", "1.23456789012345x7"};
    for (size_t k = 0; k < sizeof not_numbers / sizeof not_numbers[0]; k++) {
        float f;
        ck_assert_msg(!wide_take(not_numbers[k], &f), "'%s'", not_numbers[k]);
    }
    /* a midpoint spelled with one digit fewer or more lands on its sides */
    ck_assert(wide_read("16777217.00001") && wide_read("16777216.99999"));
    ck_assert(!wide_read("16777217.000000001")); /* within a double's error of it */
    uint64_t s = 977;
    char tok[64];
    int taken = 0;
    static const char *fmt[] = {"%.17g", "%.16g", "%.9g", "%.17e", "%.12g"};
    for (int k = 0; k < SAMPLES(300000); k++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        uint32_t b = (uint32_t)(s >> 32);
        float f;
        memcpy(&f, &b, 4);
        if (!isfinite(f))
            continue;
        double v = f;
        if (k % 3 == 1) { /* the midpoint above f, and a hair off it */
            uint32_t up = b + 1;
            float g;
            memcpy(&g, &up, 4);
            v = isfinite(g) ? ((double)f + (double)g) / 2 * (1 + (double)((int)(s % 5) - 2) * 0x1p-50) : v;
        }
        snprintf(tok, sizeof tok, fmt[k % 5], v);
        taken += wide_read(tok);
    }
    ck_assert_int_gt(taken, SAMPLES(100000)); /* most of it (the rest: exponents past 22) */
}
END_TEST

/* tp_numtext_short_f32 on the whole of tok (padded so it may read ahead):
 * 1 with strtof's and the general reader's bits, or 0 (declined); the SWAR
 * reader (what CPUs without SSE4.1 run) takes the same tokens with the
 * same bits. */
static int short_read(const char *tok)
{
    char buf[64];
    size_t len = strlen(tok);
    snprintf(buf, sizeof buf, "%s,                        ", tok);
    float f = -1234.5f, g = -1234.5f;
    int took = tp_numtext_short_f32(buf, len, &f);
    ck_assert_msg(tp_numtext_short_f32_swar(buf, len, &g) == took, "'%s': the two short readers disagree", tok);
    if (!took)
        return 0;
    ck_assert_msg(f32_bits(f) == f32_bits(g), "'%s': %a, SWAR reader %a", tok, f, g);
    ck_assert_msg(f32_bits(f) == f32_bits(strtof(tok, NULL)), "'%s': %a, strtof %a", tok, f, strtof(tok, NULL));
    ck_assert(f32_bits(f) == f32_bits(tp_numtext_parse_f32(tok, len)));
    return 1;
}

/* The one-step reader of short plain decimals: it takes what clients
 * mostly send and declines (for the general path) exponents, long
 * mantissas, values of 2^24 units or more and text that is no number; what
 * it takes agrees bit for bit with strtof, on random tokens too. */
START_TEST(f32_short_reader)
{
    static const char *taken[] = {"0", "-0", "0.0", "-0.0", "42", "-3.5", "-0.123456", "0.1234567",
                                  "9999999", "1677721.5", "0.0000001", "123.4567", "0.3", "-1"};
    static const char *declined[] = {"01", "-01.5", "1.", "-", "-.5", ".5", "1.5e3", "1.5E3", "1e5",
                                     "16777215", "12345678", "0.12345678", "1677721.6", "1234567.89",
                                     "+1", "NaN", "\"1\"", "true", "1234567.1234568", "1.2.3", "1,2",
                                     "1 ", " 1", "1-"};
    for (size_t k = 0; k < sizeof taken / sizeof taken[0]; k++)
        ck_assert_msg(short_read(taken[k]), "'%s' declined", taken[k]);
    for (size_t k = 0; k < sizeof declined / sizeof declined[0]; k++)
        ck_assert_msg(!short_read(declined[k]), "'%s' taken", declined[k]);
    uint64_t s = 777;
    char tok[32];
    int took = 0;
    for (int k = 0; k < SAMPLES(200000); k++) {
        tok[random_decimal(&s, 15, tok)] = 0;
        took += short_read(tok);
    }
    ck_assert_msg(took > SAMPLES(50000), "only %d of %d taken", took, SAMPLES(200000));
}
END_TEST

/* The short reader multiplies by 10^-k in double instead of dividing by
 * 10^k in float (numtext_read.c says why that rounds the same): every mantissa
 * below 2^24 at every k it uses, against the division (correctly rounded,
 * both operands being exact floats), through both short readers. */
START_TEST(f32_short_reader_every_mantissa)
{
    char tok[40];
    for (int k = 1; k <= 7; k += K_STEP) {
        float p10 = 1.0f;
        for (int i = 0; i < k; i++)
            p10 *= 10.0f;
        uint32_t bad = 0, first = 0;
        /* m as 8 digits with the point k from the right ("0000012.3456");
         * leading zeros are cut below, so the text is a JSON number with at
         * most 7 digits before the point. Counted up digit by digit:
         * snprintf for each of the 117M would take most of a minute. */
        memset(tok, ' ', sizeof tok);
        for (int i = 0, d = 0; i < 9; i++)
            tok[i] = i == 8 - k ? '.' : (d++, '0');
        for (uint32_t m = 0; m < 1u << 24; m++) {
            int lead = 0;
            while (lead < 7 - k && tok[lead] == '0')
                lead++;
            float f, g;
            float want = (float)m / p10;
            if (!tp_numtext_short_f32(tok + lead, (size_t)(9 - lead), &f) || f32_bits(f) != f32_bits(want) ||
                !tp_numtext_short_f32_swar(tok + lead, (size_t)(9 - lead), &g) || f32_bits(g) != f32_bits(want))
                bad += !bad ? (first = m, 1) : 1;
            for (int i = 8; i >= 0; i--) { /* m + 1 */
                if (tok[i] == '.')
                    continue;
                if (tok[i] != '9') {
                    tok[i]++;
                    break;
                }
                tok[i] = '0';
            }
        }
        ck_assert_msg(bad == 0, "k=%d: %u mantissas wrong, the first %u", k, bad, first);
    }
}
END_TEST

/* Doubles: the library alone, out-of-range tokens included, against strtod. */
START_TEST(f64_reader_matches_strtod)
{
    static const char *edge[] = {"0", "-0", "0.1", "1e-400", "-1e-400", "1e400", "-1e400",
                                 "2.2250738585072014e-308", "4.9e-324", "2e-324",
                                 "1.7976931348623157e308", "1.7976931348623159e308",
                                 "123456789012345678901234567890", "-3.14159265358979323846"};
    for (size_t k = 0; k < sizeof edge / sizeof edge[0]; k++) {
        double want = strtod(edge[k], NULL), got = tp_numtext_parse_f64(edge[k], strlen(edge[k]));
        ck_assert_msg(memcmp(&got, &want, sizeof got) == 0, "%s: %a, strtod %a", edge[k], got, want);
    }
}
END_TEST

START_TEST(integers)
{
    const int64_t v[] = {0, 1, -1, 9, 10, 123456789, INT64_MAX, INT64_MIN, INT32_MIN};
    char buf[TP_NUMTEXT_MAX + 1], want[32];
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        buf[tp_numtext_i64(v[i], buf)] = '\0';
        snprintf(want, sizeof want, "%" PRId64, v[i]);
        ck_assert_str_eq(buf, want);
        int64_t back;
        ck_assert_int_eq(tp_numtext_parse_i64(buf, strlen(buf), &back), 0);
        ck_assert(back == v[i]);
    }
    int64_t x;
    ck_assert_int_eq(tp_numtext_parse_i64("9223372036854775808", 19, &x), -1);
    ck_assert_int_eq(tp_numtext_parse_i64("-9223372036854775809", 20, &x), -1);
}
END_TEST

START_TEST(number_tokens)
{
    const struct {
        const char *s;
        size_t len;
        int is_int;
    } cases[] = {{"0", 1, 1}, {"-0", 2, 1}, {"12,", 2, 1}, {"1.5]", 3, 0}, {"-1e5", 4, 0},
                 {"2E+3 ", 4, 0}, {"01", 0, 1}, {"1.", 0, 0}, {".5", 0, 1}, {"-", 0, 1},
                 {"+1", 0, 1}, {"1e", 0, 0}, {"NaN", 0, 1}, {"Infinity", 0, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int is_int;
        size_t n = tp_numtext_scan(cases[i].s, strlen(cases[i].s), &is_int);
        ck_assert_msg(n == cases[i].len, "'%s': %zu", cases[i].s, n);
        if (n)
            ck_assert_int_eq(is_int, cases[i].is_int);
    }
}
END_TEST

/* ---- json_tensor -------------------------------------------------------- */

START_TEST(spans_and_parse_outside)
{
    const char *body = "{\"id\":\"a\",\"inputs\":[{\"name\":\"x\",\"data\":[[1,2],\n[3,4]]},"
                       "{\"data\":{\"a\":[1]}},{\"name\":\"y\",\"data\": [ ]}],\"data\":[9]}";
    tp_json_span *sp;
    int n;
    size_t nv;
    ck_assert_int_eq(tp_json_data_spans(body, strlen(body), 0, &sp, &n, &nv), 0);
    ck_assert_int_eq(n, 3);
    ck_assert_int_eq(sp[0].input, 0);
    ck_assert(strncmp(body + sp[0].start, "[[1,2],\n[3,4]]", sp[0].end - sp[0].start) == 0);
    ck_assert_int_eq(sp[1].input, 2);
    ck_assert_int_eq(sp[2].input, -1); /* the top-level "data": a member no route reads */
    json_error_t je;
    json_t *root = tp_json_load_outside_spans(body, strlen(body), sp, n, 0, &je);
    ck_assert_ptr_nonnull(root);
    json_t *d0 = json_object_get(json_array_get(json_object_get(root, "inputs"), 0), "data");
    ck_assert(json_is_array(d0) && json_array_size(d0) == 0);
    ck_assert_int_eq(json_array_size(json_object_get(root, "data")), 0); /* skipped, not built */
    json_decref(root);
    free(sp);
    /* an array the scan cannot close is left out up to there: jansson
     * reports the error where it is, without parsing the numbers */
    const char *bad = "{\"inputs\":[{\"data\":[1,2,3}]}";
    ck_assert_int_eq(tp_json_data_spans(bad, strlen(bad), 0, &sp, &n, &nv), 0);
    ck_assert_int_eq(n, 1);
    ck_assert_ptr_null(tp_json_load_outside_spans(bad, strlen(bad), sp, n, 0, &je));
    ck_assert_int_eq(je.column, 26);
    free(sp);
    /* flat arrays are found by their first ']' (memchr); a ']' in a string
     * or a nested array is not an end, and neither is one past a '}' */
    static const struct {
        const char *body, *span;
    } flat[] = {
        {"{\"inputs\":[{\"data\":[1, 2 ,3e-7],\"name\":\"x\"}]}", "[1, 2 ,3e-7]"},
        {"{\"inputs\":[{\"data\":[\"a]\",1],\"name\":\"x\"}]}", "[\"a]\",1]"},
        {"{\"inputs\":[{\"data\":[1,[2]],\"name\":\"x\"}]}", "[1,[2]]"},
        {"{\"inputs\":[{\"data\":[1,2},{\"data\":[3]}]}", "[1,2"},
    };
    for (size_t k = 0; k < sizeof flat / sizeof flat[0]; k++) {
        ck_assert_int_eq(tp_json_data_spans(flat[k].body, strlen(flat[k].body), 0, &sp, &n, &nv), 0);
        ck_assert_int_ge(n, 1);
        ck_assert_msg(sp[0].end - sp[0].start == strlen(flat[k].span) &&
                          !strncmp(flat[k].body + sp[0].start, flat[k].span, strlen(flat[k].span)),
                      "body %zu: span '%.*s', want '%s'", k, (int)(sp[0].end - sp[0].start),
                      flat[k].body + sp[0].start, flat[k].span);
        free(sp);
    }
}
END_TEST

/* jansson never sees the data arrays, yet what it reports must be where
 * it is in the body: line, column and position of an error after (or
 * between) data arrays, and with JSON_DISABLE_EOF_CHECK where a document
 * ends ahead of trailing bytes, all as jansson reports them on the whole
 * body. Arrays span lines and hold UTF-8 (in a string) so line and
 * character counts would drift if they were miscounted. */
START_TEST(outside_parse_reports_body_positions)
{
    static const char *bodies[] = {
        "{\"inputs\":[{\"data\":[1,2,\n3,4],\"name\":\"x\"}],\n  \"id\": x}",
        "{\"inputs\":[{\"data\":[1,\n2]},{\"data\":[\"\u00e9\u00e9\",\n5] }] ,, }",
        "{\"inputs\":[{\"data\":[[1],[2]]}, {\"name\":\"y\",\"data\":[7]} ] } trailing",
        "{\"inputs\":[{\"data\":[1,2,3]}],\"inputs\":[]}",
        "{\"inputs\":[{\"data\":[1,2,3]\n\n,\"data\":[4]}]}",
        "{\"inputs\":[{\"data\":[]}], \"x\": [1 2]}",
        "{\"inputs\":[{\"data\":[1.5,\n-2e3]}]}   ",
    };
    const size_t flags[] = {JSON_REJECT_DUPLICATES, JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK};
    for (size_t b = 0; b < sizeof bodies / sizeof bodies[0]; b++) {
        for (size_t f = 0; f < 2; f++) {
            const char *body = bodies[b];
            tp_json_span *sp;
            int n;
            size_t nv;
            ck_assert_int_eq(tp_json_data_spans(body, strlen(body), 0, &sp, &n, &nv), 0);
            ck_assert_msg(n > 0, "body %zu: no span", b);
            json_error_t whole, outside;
            json_t *a = json_loadb(body, strlen(body), flags[f], &whole);
            /* both ways in: jansson fed piecewise, and the outside text built first */
            char text[512];
            size_t tlen = tp_json_outside_spans(body, strlen(body), sp, n, text, sizeof text);
            ck_assert_uint_le(tlen, sizeof text);
            json_t *o[2] = {tp_json_load_outside_spans(body, strlen(body), sp, n, flags[f], &outside), NULL};
            json_error_t from_text;
            o[1] = tp_json_load_outside_text(body, sp, n, text, tlen, flags[f], &from_text);
            const json_error_t *got[2] = {&outside, &from_text};
            ck_assert(!o[0] || json_equal(o[0], o[1]));
            for (int w = 0; w < 2; w++) {
                ck_assert_msg(!a == !o[w], "body %zu flags %zu way %d: loaded %d vs %d", b, f, w, !!a, !!o[w]);
                ck_assert_msg(got[w]->position == whole.position,
                              "body %zu flags %zu way %d: position %d, whole body %d", b, f, w,
                              got[w]->position, whole.position);
                if (!a) {
                    ck_assert_msg(got[w]->line == whole.line && got[w]->column == whole.column,
                                  "body %zu flags %zu way %d: line %d column %d, whole body %d %d (%s)",
                                  b, f, w, got[w]->line, got[w]->column, whole.line, whole.column, whole.text);
                    ck_assert_str_eq(got[w]->text, whole.text);
                }
                json_decref(o[w]);
            }
            json_decref(a);
            free(sp);
        }
    }
}
END_TEST

static tp_status read_into(const char *text, tp_dtype dt, int ndim, const int64_t *shape,
                           tp_host_tensor *t, tp_err *e)
{
    *t = (tp_host_tensor){.name = "x", .dtype = dt, .ndim = ndim};
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    return tp_json_tensor_read(text, strlen(text), t, e);
}

START_TEST(read_values)
{
    tp_host_tensor t;
    tp_err e;
    const int64_t s23[] = {2, 3};
    ck_assert_int_eq(read_into(" [ [1, 2.5,-3e0], [4,5,6 ] ] ", TP_F32, 2, s23, &t, &e), TP_OK);
    const float *f = t.data;
    ck_assert(f[1] == 2.5f && f[2] == -3.0f && f[5] == 6.0f);
    ck_assert_uint_eq(t.nbytes, 24);
    free(t.data);
    ck_assert_int_eq(read_into("[1,2,3,4,5,-9223372036854775808]", TP_I64, 2, s23, &t, &e), TP_OK);
    ck_assert(((int64_t *)t.data)[5] == INT64_MIN);
    free(t.data);
    ck_assert_int_eq(read_into("[1,2,3,4,5,6.5]", TP_I32, 2, s23, &t, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "data element 5 is a real number, expected an integer"));
    ck_assert_int_eq(read_into("[1,2,3,4,5,9223372036854775808]", TP_I64, 2, s23, &t, &e),
                     TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "(9223372036854775808) is out of INT64 range"));
    ck_assert_int_eq(read_into("[1,2,,3]", TP_F32, 2, s23, &t, &e), TP_PARSE);
    ck_assert_ptr_nonnull(strstr(e.msg, "malformed JSON in 'data' at byte 5"));
    ck_assert_int_eq(read_into("[1,2,3,4,5,6] x", TP_F32, 2, s23, &t, &e), TP_PARSE);
    ck_assert_int_eq(read_into("[1,2,3,4,5,tru]", TP_F32, 2, s23, &t, &e), TP_PARSE);
    ck_assert_int_eq(read_into("[[1,2,3],[4,5,6],[7]]", TP_F32, 2, s23, &t, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "data has 3 elements, shape [2, 3] needs 2 at dim 0"));
    ck_assert_ptr_null(t.data);
}
END_TEST

/* A shape that claims far more elements than the text holds allocates for
 * the text, not for the shape, and fails on the count. */
/* Flat FP32 arrays are cut at their commas first and their elements read
 * each on its own (json_tensor_read.c): every spelling and spacing reads as
 * strtof reads it, at the start, middle and end of the text (where the
 * reader may not read ahead), and whatever is not a plain array of numbers
 * still gets the general reader's message. */
START_TEST(read_f32_two_passes)
{
    static const char *spellings[] = {"0", "-0.0", "0.5", "-0.123456", "1.5e-3", "0.123456789",
                                      "-3.4028235e38", "16777217", "1E2", "42", "0.0000001",
                                      "-1.17549435e-38", "1677721.6", "9999999"};
    static const char *gaps[] = {",", ", ", " ,", "\n,\t", " , "};
    enum { N = 300 };
    char text[N * 24];
    float want[N];
    for (int round = 0; round < 5; round++) {
        size_t len = 0;
        len += (size_t)snprintf(text + len, sizeof text - len, round & 1 ? "[" : " [ ");
        for (int i = 0; i < N; i++) {
            const char *sp = spellings[(size_t)(i * 7 + round) % (sizeof spellings / sizeof *spellings)];
            want[i] = strtof(sp, NULL);
            len += (size_t)snprintf(text + len, sizeof text - len, "%s%s", i ? gaps[(i + round) % 5] : "", sp);
        }
        len += (size_t)snprintf(text + len, sizeof text - len, round & 1 ? "]" : " ] ");
        tp_host_tensor t;
        tp_err e;
        const int64_t shape[] = {N};
        ck_assert_int_eq(read_into(text, TP_F32, 1, shape, &t, &e), TP_OK);
        for (int i = 0; i < N; i++)
            ck_assert_msg(f32_bits(((float *)t.data)[i]) == f32_bits(want[i]), "round %d element %d", round, i);
        free(t.data);
    }
    const struct {
        const char *text;
        tp_status st;
        const char *msg;
    } bad[] = {
        {"[1,2,3,4,5,6,]", TP_PARSE, "malformed JSON in 'data' at byte 13"},
        {"[,1,2,3,4,5,6]", TP_PARSE, "malformed JSON in 'data' at byte 1"},
        {"[1,2,3 4,5,6]", TP_PARSE, "malformed JSON in 'data' at byte 7"},
        {"[1,2,3,4,5,\"6\"]", TP_INVALID, "data element 5 is a string, expected a number"},
        {"[1,2,3,4,5,[6]]", TP_INVALID, "data[5] is an array"},
        {"[1,2,3,4,5,1e39]", TP_INVALID, "data element 5 (1e+39) is out of FP32 range"},
        {"[1,2,3,4,5,6", TP_PARSE, "malformed JSON"},
        {"[1,2,3,4,5,6,7]", TP_INVALID, "data has 7 elements, shape [6] needs 6"},
        {"[1,2,3,4,5]", TP_INVALID, "data has 5 elements, shape [6] needs 6"},
        {"[]", TP_INVALID, "data has 0 elements, shape [6] needs 6"},
        {"[1,2,3,4,5,-]", TP_PARSE, "malformed JSON"},
        {"[1,2,3,4,5,01]", TP_PARSE, "malformed JSON"},
    };
    const int64_t s6[] = {6};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        tp_host_tensor t;
        tp_err e;
        ck_assert_int_eq(read_into(bad[k].text, TP_F32, 1, s6, &t, &e), bad[k].st);
        ck_assert_msg(strstr(e.msg, bad[k].msg) != NULL, "%s: %s", bad[k].text, e.msg);
        ck_assert_ptr_null(t.data);
    }
    const int64_t s0[] = {0}, s23[] = {2, 3};
    tp_host_tensor t;
    tp_err e;
    ck_assert_int_eq(read_into(" [ \n ] ", TP_F32, 1, s0, &t, &e), TP_OK);
    free(t.data);
    /* nested: each row is such an array, its count checked against the shape */
    ck_assert_int_eq(read_into("[[1, -0.5, 2e-3], [0.25,5 ,6]]", TP_F32, 2, s23, &t, &e), TP_OK);
    const float *f = t.data;
    ck_assert(f[0] == 1.0f && f[1] == -0.5f && f[2] == strtof("2e-3", NULL) && f[3] == 0.25f && f[5] == 6.0f);
    free(t.data);
    ck_assert_int_eq(read_into("[[1,2,3],[4,5,6,7]]", TP_F32, 2, s23, &t, &e), TP_INVALID);
    ck_assert_msg(strstr(e.msg, "data[1] has 4 elements, shape [2, 3] needs 3 at dim 1") != NULL, "%s", e.msg);
    ck_assert_int_eq(read_into("[[1,2,3],[4,5]]", TP_F32, 2, s23, &t, &e), TP_INVALID);
    ck_assert_msg(strstr(e.msg, "data[1] has 2 elements, shape [2, 3] needs 3 at dim 1") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(read_bounded_by_text)
{
    tp_host_tensor t;
    tp_err e;
    const int64_t huge[] = {1000000000, 1000};
    ck_assert_int_eq(read_into("[1,2,3]", TP_I64, 2, huge, &t, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "data has 3 elements, shape [1000000000, 1000] needs "
                                        "1000000000000"));
}
END_TEST

START_TEST(write_values)
{
    float f[] = {1.5f, -2.0f, 0.1f, 1e-7f};
    tp_host_tensor t = {.name = "y", .dtype = TP_F32, .ndim = 1, .shape = {4}, .data = f,
                        .nbytes = sizeof f};
    tp_jbuf b = {0};
    tp_err e;
    ck_assert_int_eq(tp_json_tensor_write(&b, &t, &e), TP_OK);
    tp_jbuf_str(&b, "q\"\\\n\x01é");
    tp_jbuf_raw(&b, "", 1);
    ck_assert_str_eq(b.p, "[1.5,-2.0,0.1,1e-7]\"q\\\"\\\\\\u000a\\u0001é\"");
    f[2] = NAN;
    b.len = 0;
    ck_assert_int_eq(tp_json_tensor_write(&b, &t, &e), TP_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "output 'y': element 2 is NaN"));
    /* past the writer's 4096-element chunks, after some text: every value
     * reads back, nothing between the chunks */
    enum { BIG = 10001 };
    static float big[BIG], back[BIG];
    for (int i = 0; i < BIG; i++)
        big[i] = (float)(i % 97) * -0.37f + (float)i;
    tp_host_tensor tb = {.name = "z", .dtype = TP_F32, .ndim = 1, .shape = {BIG}, .data = big,
                         .nbytes = sizeof big};
    b.len = 0;
    tp_jbuf_lit(&b, "x=");
    ck_assert_int_eq(tp_json_tensor_write(&b, &tb, &e), TP_OK);
    tp_host_tensor rt = {.name = "z", .dtype = TP_F32, .ndim = 1, .shape = {BIG}};
    ck_assert_int_eq(tp_json_tensor_read(b.p + 2, b.len - 2, &rt, &e), TP_OK);
    memcpy(back, rt.data, sizeof back);
    ck_assert_mem_eq(back, big, sizeof big);
    free(rt.data);
    free(b.p);
}
END_TEST

/* An answer starts in a buffer of the thread's pool: written past the
 * pool's size it moves to its own buffer with every byte (and the pooled
 * one goes back to the pool); a small one stays pooled and its buffer is
 * the next answer's. */
START_TEST(write_pooled)
{
    float f[] = {1.5f, -2.0f};
    tp_host_tensor t = {.name = "y", .dtype = TP_F32, .ndim = 1, .shape = {2}, .data = f,
                        .nbytes = sizeof f};
    tp_err e;
    tp_jbuf b;
    tp_jbuf_start_pooled(&b);
    ck_assert(b.pooled);
    char *first = b.p;
    ck_assert_int_eq(tp_json_tensor_write(&b, &t, &e), TP_OK);
    tp_jbuf_raw(&b, "", 1);
    ck_assert_str_eq(b.p, "[1.5,-2.0]");
    int spares = tp_buf_pool_spares();
    tp_jbuf_free_text(b.p, b.pooled);
    ck_assert_int_eq(tp_buf_pool_spares(), spares + 1);
    tp_jbuf_start_pooled(&b);
    ck_assert_ptr_eq(b.p, first);
    /* A row of the example graph's answer, 256 numbers each as long as
     * FP32 text gets (9 digits, a sign and an exponent: 14 bytes), after
     * an answer's header: 3.9 KB of text stays in the pooled buffer (room
     * reserved for 32-byte numbers would have outgrown it). */
    enum { ROW = 256 };
    static float row[ROW];
    for (int i = 0; i < ROW; i++)
        row[i] = -1.2345679e-38f * (float)(i + 1);
    tp_host_tensor tr = {.name = "y", .dtype = TP_F32, .ndim = 1, .shape = {ROW}, .data = row,
                         .nbytes = sizeof row};
    for (int i = 0; i < 6; i++)
        tp_jbuf_lit(&b, "{\"model_name\":\"mlp_sp_tp2\",\"outputs\":");
    ck_assert_int_eq(tp_json_tensor_write(&b, &tr, &e), TP_OK);
    ck_assert(b.pooled);
    ck_assert_ptr_eq(b.p, first);
    ck_assert_uint_gt(b.len, ROW * 14);
    b.len = 0;
    enum { BIG = 3000 }; /* ~20 KB of text: past TP_BUF_POOL_SIZE */
    static float big[BIG], back[BIG];
    for (int i = 0; i < BIG; i++)
        big[i] = (float)i * -1.37f + 0.001f;
    tp_host_tensor tb = {.name = "z", .dtype = TP_F32, .ndim = 1, .shape = {BIG}, .data = big,
                         .nbytes = sizeof big};
    tp_jbuf_lit(&b, "x=");
    ck_assert_int_eq(tp_json_tensor_write(&b, &tb, &e), TP_OK);
    ck_assert(!b.pooled);
    ck_assert_uint_gt(b.len, TP_BUF_POOL_SIZE);
    ck_assert_int_eq(tp_buf_pool_spares(), spares + 1); /* the outgrown one is back */
    tp_host_tensor rt = {.name = "z", .dtype = TP_F32, .ndim = 1, .shape = {BIG}};
    ck_assert_int_eq(tp_json_tensor_read(b.p + 2, b.len - 2, &rt, &e), TP_OK);
    memcpy(back, rt.data, sizeof back);
    ck_assert_mem_eq(back, big, sizeof big);
    free(rt.data);
    tp_jbuf_free_text(b.p, b.pooled);
}
END_TEST

static Suite *numtext_suite(void)
{
    Suite *s = suite_create("numtext");
    TCase *n = tcase_create("numbers");
    tcase_set_timeout(n, 60);
    tcase_add_test(n, f32_round_trip);
    tcase_add_test(n, f32_spelling);
    tcase_add_test(n, f32_list);
    tcase_add_test(n, f32_list_lanes_match_scalar);
    tcase_add_test(n, f64_reader_matches_strtod);
    tcase_add_test(n, halves_exhaustive);
    tcase_add_test(n, f32_reader_matches_strtof);
    tcase_add_test(n, f32_wide_reader);
    tcase_add_test(n, f32_short_reader);
    tcase_add_test(n, f32_short_reader_every_mantissa);
    tcase_add_test(n, integers);
    tcase_add_test(n, number_tokens);
    suite_add_tcase(s, n);
    TCase *j = tcase_create("json_tensor");
    tcase_add_test(j, spans_and_parse_outside);
    tcase_add_test(j, outside_parse_reports_body_positions);
    tcase_add_test(j, read_values);
    tcase_add_test(j, read_f32_two_passes);
    tcase_add_test(j, read_bounded_by_text);
    tcase_add_test(j, write_values);
    tcase_add_test(j, write_pooled);
    suite_add_tcase(s, j);
    return s;
}

TP_CHECK_MAIN(numtext_suite)
