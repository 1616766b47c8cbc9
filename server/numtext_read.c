/* numtext_read.c — numbers read from JSON text: the grammar, FP32 of up
 * to 19 significant digits in one double product (SWAR and SSE4.1 paths),
 * INT64 (numtext.h; writing them: numtext.c). */
#include "numtext.h"

#include <float.h>
#include <math.h>
#include <string.h>

#include "dtype.h"

static size_t digits(const char *s, size_t i, size_t len)
{
    size_t j = i;
    while (j < len && s[j] >= '0' && s[j] <= '9')
        j++;
    return j - i;
}

/* RFC 8259: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
size_t tp_numtext_scan(const char *s, size_t len, int *is_int)
{
    size_t i = 0, n;
    *is_int = 1;
    if (i < len && s[i] == '-')
        i++;
    if (!(n = digits(s, i, len)) || (s[i] == '0' && n > 1))
        return 0;
    i += n;
    if (i < len && s[i] == '.') {
        *is_int = 0;
        if (!(n = digits(s, ++i, len)))
            return 0;
        i += n;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        *is_int = 0;
        if (++i < len && (s[i] == '+' || s[i] == '-'))
            i++;
        if (!(n = digits(s, i, len)))
            return 0;
        i += n;
    }
    return i;
}

/* ---- reading short decimals --------------------------------------------- */

/* The readers below count every rounding of their double and float
 * operations (one per operation, to its own type): that needs each
 * evaluated in its own precision (SSE, not x87's extended registers). */
_Static_assert(FLT_EVAL_METHOD == 0, "the readers need float and double operations in their own precision");

/* ---- reading: up to 19 significant digits ------------------------------
 *
 * A token x = w * 10^q (w < 10^19, |q| <= 22) is read through one double
 * product d = w * 10^q: w rounded to double, 10^q exact for q >= 0 and
 * rounded for q < 0, the product rounded: three roundings, so d is within
 * 2^-51 of x (relative). x's nearest float is then d's, unless a midpoint
 * between two floats lies that close to d (about once in 2^24 inputs): the
 * library decides those, and everything else (more digits, far exponents,
 * overflow). Python clients send 17 digits (the repr of each FP32 value
 * as a double) and FP32 round-trippers 9: bench-codec's array decode went
 * from 36 to 25 ns a number for 17 digits, from 46 to 22 for 9 (the array
 * reader tries it before scanning the token: it checks the grammar). */
static const double POW10D[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                                1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};
static const uint64_t POW10_U64[] = {1ULL, 10ULL, 100ULL, 1000ULL, 10000ULL, 100000ULL, 1000000ULL,
                                     10000000ULL, 100000000ULL, 1000000000ULL, 10000000000ULL,
                                     100000000000ULL, 1000000000000ULL, 10000000000000ULL,
                                     100000000000000ULL, 1000000000000000ULL, 10000000000000000ULL,
                                     100000000000000000ULL, 1000000000000000000ULL};
static const double NEG_POW10D[] = {1e0,   1e-1,  1e-2,  1e-3,  1e-4,  1e-5,  1e-6,  1e-7,
                                    1e-8,  1e-9,  1e-10, 1e-11, 1e-12, 1e-13, 1e-14, 1e-15,
                                    1e-16, 1e-17, 1e-18, 1e-19, 1e-20, 1e-21, 1e-22};

/* The short reader's m * 10^-k (m < 2^24, k <= 7) is one multiply by
 * NEG_POW10D[k] (no float division, whose latency was a third of an
 * array's reading):
 * the product is within 2^-52 (relative) of m / 10^k, while m / 10^k is
 * either a float or at least 1 / (10^7 2^25) > 2^-48.3 away from any
 * midpoint between two floats (such a midpoint M / 2^j, M odd and 25 bits,
 * differs from m / 10^k by a nonzero integer over 10^k 2^j). So rounding
 * the product to float rounds m / 10^k correctly; test_numtext checks all
 * 7 * 2^24 cases against the division. */

/* The short readers' conversion: 1..7 digits before the point and none or
 * 1..7 after it, m < 2^24, one product (see NEG_POW10D); 0 otherwise. */
static inline int short_product(int neg, uint64_t m, unsigned whole, unsigned k, float *out)
{
    if (whole > 7 || k > 7 || m >= 1u << 24)
        return 0;
    float f = (float)((double)m * NEG_POW10D[k]);
    *out = neg ? -f : f;
    return 1;
}

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
/* Eight bytes from p, the first in the lowest byte, each XORed with '0', so
 * a digit's byte holds its value (0..9) and no other byte is below 10. */
static uint64_t load8_digits(const char *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v ^ 0x3030303030303030ULL;
}

/* How many of the eight bytes lead as digits (8: all of them). A byte
 * above 9 gets its top bit set, without carries between bytes: its low
 * seven bits plus 0x76 pass 0x7f only from 10 on and stay below 0x100. */
static int leading_digits(uint64_t x)
{
    uint64_t over9 = (((x & 0x7f7f7f7f7f7f7f7fULL) + 0x7676767676767676ULL) | x) & 0x8080808080808080ULL;
    return over9 ? __builtin_ctzll(over9) >> 3 : 8;
}

/* The value of the first k (1..8) digits of x: they are moved to the top
 * bytes, below them zeros (leading zeros of the number), and the eight
 * digits are combined in three multiplies: pairs, fours, eight (fast_float's
 * parse_eight_digits, Lemire 2021). */
static uint32_t digits_value(uint64_t x, int k)
{
    x <<= 8 * (8 - k);
    x = x * 10 + (x >> 8);
    return (uint32_t)(((x & 0x000000ff000000ffULL) * (100 + (1000000ULL << 32)) +
                       ((x >> 16 & 0x000000ff000000ffULL) * (1 + (10000ULL << 32)))) >> 32);
}

int tp_numtext_short_f32_swar(const char *s, size_t len, float *out)
{
    int neg = s[0] == '-';
    const char *p = s + neg;
    uint64_t whole = load8_digits(p);
    int k1 = leading_digits(whole), k2 = 0;
    /* no digit, a leading zero ("01"), or 8+ digits: not ours */
    if (k1 == 0 || k1 == 8 || (p[0] == '0' && k1 > 1))
        return 0;
    uint64_t m = digits_value(whole, k1);
    if ((size_t)(neg + k1) != len) {
        uint64_t frac = load8_digits(p + k1 + 1);
        k2 = leading_digits(frac);
        /* the rest must be '.' and 1..7 digits ("1." is no number) */
        if (p[k1] != '.' || k2 == 0 || k2 == 8 || (size_t)(neg + k1 + 1 + k2) != len)
            return 0;
        m = m * POW10_U64[k2] + digits_value(frac, k2); /* < 10^14 */
    }
    return short_product(neg, m, (unsigned)k1, (unsigned)k2, out);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
/* The 16 lanes of x (each a digit's value, 0..9; the first the most
 * significant) as one number, pairwise in four multiply-adds (simdjson's
 * and fast_float's 16-digit step). */
__attribute__((target("sse4.1"))) static inline uint64_t digits16_value(__m128i x)
{
    x = _mm_maddubs_epi16(x, _mm_setr_epi8(10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1, 10, 1));
    x = _mm_madd_epi16(x, _mm_setr_epi16(100, 1, 100, 1, 100, 1, 100, 1));
    x = _mm_packus_epi32(x, x);
    x = _mm_madd_epi16(x, _mm_setr_epi16(10000, 1, 10000, 1, 10000, 1, 10000, 1));
    return (uint64_t)(uint32_t)_mm_cvtsi128_si32(x) * 100000000u + (uint32_t)_mm_extract_epi32(x, 1);
}

/* The 16 bytes at p less '0' (a digit's lane holds its value), and in
 * *digit a bit for each lane that holds a digit. */
__attribute__((target("sse4.1"))) static inline __m128i load16_digits(const char *p, unsigned *digit)
{
    __m128i v = _mm_sub_epi8(_mm_loadu_si128((const __m128i *)(const void *)p), _mm_set1_epi8('0'));
    *digit = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(_mm_min_epu8(v, _mm_set1_epi8(9)), v));
    return v;
}

/* p[0..n) (1 <= n <= 16; 16 bytes readable at p) when it is digits with at
 * most one point between two of them and no leading zero ("01"): 1, with
 * *m all its digits' value (< 10^16), *whole the digits before the point
 * and *k those after it (0 without one). 0 for any other text. */
__attribute__((target("sse4.1"))) static inline int decimal16_sse41(const char *p, size_t n, uint64_t *m,
                                                                     unsigned *whole, unsigned *k)
{
    if (n - 1 >= 16)
        return 0;
    unsigned digit;
    __m128i v = load16_digits(p, &digit);
    unsigned mask = (1u << n) - 1;
    unsigned dot = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8('.' - '0'))) & mask;
    if (((digit | dot) & mask) != mask || (dot & (dot - 1))) /* not digits and at most one point */
        return 0;
    *whole = dot ? (unsigned)__builtin_ctz(dot) : (unsigned)n;
    *k = dot ? (unsigned)n - 1 - *whole : 0;
    if (*whole == 0 || (dot && *k == 0) || (p[0] == '0' && *whole > 1))
        return 0;
    __m128i iota = _mm_setr_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    /* lane i takes lane i + 1 from the point on (i itself without one) */
    __m128i squeeze = _mm_sub_epi8(iota, _mm_cmpgt_epi8(iota, _mm_set1_epi8((char)(*whole - 1))));
    /* then the whole + k digits to the top lanes; a negative index gives 0 */
    __m128i top = _mm_add_epi8(iota, _mm_set1_epi8((char)((int)(*whole + *k) - 16)));
    *m = digits16_value(_mm_shuffle_epi8(_mm_shuffle_epi8(v, squeeze), top));
    return 1;
}

/* The same token read with one 16-byte vector, which CPUs with SSE4.1 run
 * (decimal16_sse41): the digits and the point are classified lane by lane,
 * the point's lane squeezed out and the digits moved to the top lanes by
 * two byte shuffles (their index vectors computed, not looked up), and the
 * up to 14 digits combined in four multiply-adds. It takes exactly the
 * tokens the SWAR reader takes, and m and k are the same, so the same
 * product rounds the same way (test_numtext and fuzz_numtext compare the
 * two); it has half the instructions and no chain from the first word's
 * digit count to the second word's load: 6.4 -> 3.4 ns a "%.6g" number
 * alone. */
__attribute__((target("sse4.1"))) static int short_f32_sse41(const char *s, size_t len, float *out)
{
    int neg = s[0] == '-';
    uint64_t m;
    unsigned whole, k;
    return decimal16_sse41(s + neg, len - (size_t)neg, &m, &whole, &k) && short_product(neg, m, whole, k, out);
}
#define HAVE_SHORT_F32_SSE41 1
#endif
#else
int tp_numtext_short_f32_swar(const char *s, size_t len, float *out)
{
    (void)s, (void)len, (void)out;
    return 0;
}
#endif

int tp_numtext_short_f32(const char *s, size_t len, float *out)
{
#ifdef HAVE_SHORT_F32_SSE41
    if (__builtin_cpu_supports("sse4.1"))
        return short_f32_sse41(s, len, out);
#endif
    return tp_numtext_short_f32_swar(s, len, out);
}

/* Digits from s[*i] on into *w, kept under 10^19 (leading zeros cost
 * nothing): how many were read, or -1 past 19 significant digits. Eight
 * at a time while the token has eight bytes left (w = w * 10 + d digit by
 * digit is a chain of multiplies: 17 digits took longer than the library). */
static int read_digits(const char *s, size_t len, size_t *i, uint64_t *w)
{
    size_t from = *i;
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    while (len - *i >= 8) {
        uint64_t x = load8_digits(s + *i);
        int k = leading_digits(x);
        if (k == 0)
            return (int)(*i - from);
        if (*w >= POW10_U64[19 - k]) /* w * 10^k would pass 10^19 */
            return -1;
        *w = *w * POW10_U64[k] + digits_value(x, k);
        *i += (size_t)k;
        if (k < 8)
            return (int)(*i - from);
    }
#endif
    for (; *i < len && (unsigned char)(s[*i] - '0') < 10; ++*i) {
        if (*w >= POW10_U64[18])
            return -1;
        *w = *w * 10 + (uint64_t)(s[*i] - '0');
    }
    return (int)(*i - from);
}

/* w * 10^q (w < 10^19) as the nearest float, signed: 1, or 0 when the
 * library must decide (|q| > 22, near FLT_MAX, or too near a midpoint). */
__attribute__((always_inline)) static inline int f32_of_decimal(int neg, uint64_t w, int q, float *out)
{
    if (w == 0) {
        *out = neg ? -0.0f : 0.0f;
        return 1;
    }
    if (q < -22 || q > 22)
        return 0;
    double d = (double)w * (q < 0 ? NEG_POW10D[-q] : POW10D[q]);
    if (d >= 0x1p127) /* near FLT_MAX or past it: the library's */
        return 0;
    float f = (float)d;
    if ((double)f != d) {
        /* the float on d's other side of f, and the midpoint between them */
        uint32_t bits;
        memcpy(&bits, &f, 4);
        bits += d > (double)f ? 1 : (uint32_t)-1;
        float g;
        memcpy(&g, &bits, 4);
        double mid = ((double)f + (double)g) * 0.5; /* exact: both are floats */
        if (fabs(d - mid) <= d * 0x1p-50)
            return 0;
    }
    *out = neg ? -f : f;
    return 1;
}

#ifdef HAVE_SHORT_F32_SSE41
/* The wide reader's commonest tokens, Python's 17-digit reprs
 * ("-0.65515398979187012"): 17 to 32 bytes after the sign whose last 16
 * are digits and whose head (the rest, before them) is digits with the
 * point among them. The 16 digits are one vector, combined as in
 * short_f32_sse41; the head is a few bytes ("0.6") read one by one. w and
 * q are what the scalar reader makes of the same token, so the bits are
 * its bits (test_numtext and fuzz_numtext compare the two); it had taken
 * 22 ns a number on these, its loops' exits depending on each token's
 * length. 1 or 0 as tp_numtext_wide_f32; -1 for a token of another shape,
 * which the scalar reader takes. Reads only s[0..len). */
__attribute__((target("sse4.1"))) static int wide_f32_sse41(const char *s, size_t len, float *out)
{
    int neg = len > 0 && s[0] == '-';
    const char *p = s + neg;
    size_t n = len - (size_t)neg, head = n - 16, point = head;
    if (n - 17 > 15) /* also len 0 */
        return -1;
    unsigned digit;
    __m128i v = load16_digits(p + head, &digit);
    if (digit != 0xffff)
        return -1; /* the point or an exponent among the last 16 */
    uint64_t hi = 0;
    for (size_t i = 0; i < head; i++) {
        unsigned d = (unsigned char)(p[i] - '0');
        if (d < 10)
            hi = hi * 10 + d; /* at most 16 digits */
        else if (p[i] == '.' && point == head && i > 0)
            point = i;
        else
            return -1;
    }
    /* an integer, a leading zero ("01.5"), or over 19 digits: the scalar reader's */
    if (point == head || (p[0] == '0' && point > 1) || hi >= 1000)
        return -1;
    return f32_of_decimal(neg, hi * POW10_U64[16] + digits16_value(v), -(int)(n - 1 - point), out);
}

/* read_f32_sse41's tokens of more than 16 bytes after the sign, or of no
 * shape it knows (exponents): the wide reader, out of line, so that
 * read_f32_sse41 calls nothing. */
__attribute__((target("sse4.1"), noinline)) static int read_long_f32_sse41(const char *s, size_t len, float *out)
{
    return tp_numtext_wide_f32(s, len, out);
}

/* tp_numtext_read_f32 on CPUs with SSE4.1: a token of up to 16 bytes
 * after the sign is read once, by decimal16_sse41, and converted as the
 * short reader converts it when it is of the short reader's kind, else as
 * the scalar wide reader converts its w and q (FP32's 9-digit round-trip
 * spellings, "-0.65515399", which the short reader declines, had gone to
 * the wide reader's loops). Only tail calls leave it, so the short token's
 * path saves no register. */
__attribute__((target("sse4.1"))) static int read_f32_sse41(const char *s, size_t len, float *out)
{
    int neg = s[0] == '-'; /* readable even when len is 0 (read ahead) */
    uint64_t m;
    unsigned whole, k;
    if (!decimal16_sse41(s + neg, len - (size_t)neg, &m, &whole, &k))
        return read_long_f32_sse41(s, len, out);
    if (short_product(neg, m, whole, k, out))
        return 1;
    return f32_of_decimal(neg, m, -(int)k, out);
}
#endif

int tp_numtext_read_f32(const char *s, size_t len, float *out)
{
#ifdef HAVE_SHORT_F32_SSE41
    if (__builtin_cpu_supports("sse4.1"))
        return read_f32_sse41(s, len, out);
#endif
    return tp_numtext_short_f32_swar(s, len, out) || tp_numtext_wide_f32_scalar(s, len, out);
}

int tp_numtext_wide_f32(const char *s, size_t len, float *out)
{
#ifdef HAVE_SHORT_F32_SSE41
    if (len >= 17 && __builtin_cpu_supports("sse4.1")) { /* shorter: none of its shape */
        int took = wide_f32_sse41(s, len, out);
        if (took >= 0)
            return took;
    }
#endif
    return tp_numtext_wide_f32_scalar(s, len, out);
}

int tp_numtext_wide_f32_scalar(const char *s, size_t len, float *out)
{
    int neg = len > 0 && s[0] == '-', q = 0;
    size_t i = (size_t)neg;
    uint64_t w = 0;
    int n = read_digits(s, len, &i, &w);
    if (n <= 0 || (n > 1 && s[neg] == '0')) /* too many digits, none, or a leading zero */
        return 0;
    if (i < len && s[i] == '.') {
        i++;
        if ((n = read_digits(s, len, &i, &w)) <= 0)
            return 0;
        q = -n;
    }
    if (i < len && (s[i] == 'e' || s[i] == 'E')) {
        int eneg = ++i < len && s[i] == '-', e = 0;
        i += i < len && (s[i] == '-' || s[i] == '+');
        size_t from = i;
        for (; i < len && (unsigned char)(s[i] - '0') < 10; i++)
            if ((e = e * 10 + (s[i] - '0')) > 99)
                return 0;
        if (i == from)
            return 0;
        q += eneg ? -e : e;
    }
    if (i != len) /* not a JSON number, or more after it */
        return 0;
    return f32_of_decimal(neg, w, q, out);
}

int tp_numtext_parse_i64(const char *s, size_t len, int64_t *out)
{
    int neg = len && s[0] == '-';
    uint64_t u = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (size_t i = (size_t)neg; i < len; i++) {
        uint64_t d = (uint64_t)(s[i] - '0');
        if (u > (limit - d) / 10)
            return -1;
        u = u * 10 + d;
    }
    *out = neg ? (int64_t)(0 - u) : (int64_t)u;
    return 0;
}

int tp_numtext_digits(const char *s, size_t len)
{
    int first = -1, last = -1, pos = 0;
    for (size_t i = 0; i < len && s[i] != 'e'; i++) {
        if (s[i] < '0' || s[i] > '9')
            continue;
        if (s[i] != '0') {
            first = first < 0 ? pos : first;
            last = pos;
        }
        pos++;
    }
    return first < 0 ? 1 : last - first + 1;
}
