/* numtext.c — numbers written as JSON text: FP32's shortest digits
 * (Schubfach, eight lanes at a time where AVX2 is), FP16, BF16, INT64
 * (numtext.h; reading them: numtext_read.c). */
#include "numtext.h"

#include <math.h>
#include <string.h>

#include "dtype.h"

/* ---- FP32 shortest digits: Schubfach ------------------------------------
 *
 * Raffaello Giulietti's Schubfach ("The Schubfach way to render doubles",
 * 2020; the algorithm behind Java 19's Float.toString), for binary32: the
 * value's rounding interval is scaled by a power of ten, from a table, so
 * that the shortest decimal in it has a few digits left of the point, and
 * at most two candidates (s, s+1, or one digit fewer: sp10, tp10) are tried.
 * It replaced std::to_chars (Ryu) and our re-spelling of its text: a JSON
 * answer's array now costs 22.1 ns per FP32 against 27.8 with the library
 * (`make bench-codec`, the same array loop around both).
 * Two departures from Java's version, both checked over all 2^32 patterns
 * against std::to_chars' shortest digits (`make test-numtext-exhaustive`):
 * no C_TINY rescaling of the smallest subnormals (Java wants at least two
 * digits; we want the fewest), and the one-digit-fewer candidates are tried
 * from s >= 10, nearer one first when both lie in the interval, which only
 * subnormals below 1e-43 reach. */

/* G1.u64[e - G1_MIN], e in [-32, 46] (what binary32 needs): the top 63
 * bits of floor(10^e * 2^(125 - floor(e log2 10))) + 1. Generated with
 * exact integers by scripts/gen_schubfach_table.py. The AVX2 lanes gather
 * its 32-bit halves (u32: x86 is little-endian, the low half first). */
static const union {
    uint64_t u64[79];
    uint32_t u32[158];
} G1 = {.u64 = {
    0x67d88f56a29cca5du, /* -32 */
    0x40e7599625a1fe7au, /* -31 */
    0x51212ffbaf0a7e18u, /* -30 */
    0x65697bfa9acd1d9fu, /* -29 */
    0x7ec3daf941806506u, /* -28 */
    0x4f3a68dbc8f03f24u, /* -27 */
    0x63090312bb2c4eedu, /* -26 */
    0x7bcb43d769f762a8u, /* -25 */
    0x4d5f0a66a23a9da9u, /* -24 */
    0x60b6cd004ac94513u, /* -23 */
    0x78e480405d7b9658u, /* -22 */
    0x4b8ed0283a6d3df7u, /* -21 */
    0x5e72843249088d75u, /* -20 */
    0x760f253edb4ab0d2u, /* -19 */
    0x49c97747490eae83u, /* -18 */
    0x5c3bd5191b525a24u, /* -17 */
    0x734aca5f6226f0adu, /* -16 */
    0x480ebe7b9d58566cu, /* -15 */
    0x5a126e1a84ae6c07u, /* -14 */
    0x709709a125da0709u, /* -13 */
    0x465e6604b7a84465u, /* -12 */
    0x57f5ff85e592557fu, /* -11 */
    0x6df37f675ef6eadfu, /* -10 */
    0x44b82fa09b5a52cbu, /* -9 */
    0x55e63b88c230e77eu, /* -8 */
    0x6b5fca6af2bd215eu, /* -7 */
    0x431bde82d7b634dau, /* -6 */
    0x53e2d6238da3c211u, /* -5 */
    0x68db8bac710cb295u, /* -4 */
    0x4189374bc6a7ef9du, /* -3 */
    0x51eb851eb851eb85u, /* -2 */
    0x6666666666666666u, /* -1 */
    0x4000000000000000u, /* 0 */
    0x5000000000000000u, /* 1 */
    0x6400000000000000u, /* 2 */
    0x7d00000000000000u, /* 3 */
    0x4e20000000000000u, /* 4 */
    0x61a8000000000000u, /* 5 */
    0x7a12000000000000u, /* 6 */
    0x4c4b400000000000u, /* 7 */
    0x5f5e100000000000u, /* 8 */
    0x7735940000000000u, /* 9 */
    0x4a817c8000000000u, /* 10 */
    0x5d21dba000000000u, /* 11 */
    0x746a528800000000u, /* 12 */
    0x48c2739500000000u, /* 13 */
    0x5af3107a40000000u, /* 14 */
    0x71afd498d0000000u, /* 15 */
    0x470de4df82000000u, /* 16 */
    0x58d15e1762800000u, /* 17 */
    0x6f05b59d3b200000u, /* 18 */
    0x4563918244f40000u, /* 19 */
    0x56bc75e2d6310000u, /* 20 */
    0x6c6b935b8bbd4000u, /* 21 */
    0x43c33c1937564800u, /* 22 */
    0x54b40b1f852bda00u, /* 23 */
    0x69e10de76676d080u, /* 24 */
    0x422ca8b0a00a4250u, /* 25 */
    0x52b7d2dcc80cd2e4u, /* 26 */
    0x6765c793fa10079du, /* 27 */
    0x409f9cbc7c4a04c2u, /* 28 */
    0x50c783eb9b5c85f2u, /* 29 */
    0x64f964e68233a76fu, /* 30 */
    0x7e37be2022c0914bu, /* 31 */
    0x4ee2d6d415b85aceu, /* 32 */
    0x629b8c891b267182u, /* 33 */
    0x7b426fab61f00de3u, /* 34 */
    0x4d0985cb1d3608aeu, /* 35 */
    0x604be73de4838ad9u, /* 36 */
    0x785ee10d5da46d90u, /* 37 */
    0x4b3b4ca85a86c47au, /* 38 */
    0x5e0a1fd271287598u, /* 39 */
    0x758ca7c70d7292feu, /* 40 */
    0x4977e8dc68679bdfu, /* 41 */
    0x5bd5e313828182d6u, /* 42 */
    0x72cb5bd86321e38cu, /* 43 */
    0x47bf19673df52e37u, /* 44 */
    0x59aedfc10d7279c5u, /* 45 */
    0x701a97b150cf1837u, /* 46 */
}};
#define G1_MIN (-32)

/* floor(q log10 2), floor(log10(3/4 2^q)), floor(e log2 10): exact for
 * |q|, |e| <= 200 (the paper's constants; scripts/gen_schubfach_table.py
 * checks that range), and binary32 needs |q| <= 151, |e| <= 46. */
static int flog10_pow2(int q) { return (int)(((int64_t)q * 661971961083LL) >> 41); }
static int flog10_three_quarters_pow2(int q) { return (int)(((int64_t)q * 661971961083LL - 274743187321LL) >> 41); }
static int flog2_pow10(int e) { return (int)(((int64_t)e * 913124641741LL) >> 38); }

/* The scaled value g * cp / 2^95, rounded to odd (sticky bit): enough to
 * compare it with a candidate's bound exactly. */
static uint32_t round_to_odd(uint64_t g, uint64_t cp)
{
    uint64_t hi = (uint64_t)(((unsigned __int128)g * cp) >> 64);
    return (uint32_t)((hi >> 31) | (((hi & 0xffffffffu) + 0xffffffffu) >> 32));
}

/* c * 2^q (c > 0) as *f * 10^*e with the fewest digits in f (trailing
 * zeros allowed), nearest to the value among those. */
static void schubfach(int q, uint32_t c, uint32_t *f, int *e)
{
    uint32_t odd = c & 1; /* an odd c's interval excludes its bounds */
    uint64_t cb = (uint64_t)c << 2, cbr = cb + 2, cbl;
    int k;
    if (c != 1u << 23 || q == -149) {
        cbl = cb - 2;
        k = flog10_pow2(q);
    } else { /* a power of two: the gap below is half the gap above */
        cbl = cb - 1;
        k = flog10_three_quarters_pow2(q);
    }
    int h = q + flog2_pow10(-k) + 33;
    uint64_t g = G1.u64[-k - G1_MIN] + 1;
    uint32_t vb = round_to_odd(g, cb << h), vbl = round_to_odd(g, cbl << h), vbr = round_to_odd(g, cbr << h);
    uint32_t s = vb >> 2;
    *e = k;
    if (s >= 10) {
        uint32_t sp10 = 10 * (s / 10), tp10 = sp10 + 10;
        int u_in = vbl + odd <= sp10 << 2, w_in = (tp10 << 2) + odd <= vbr;
        if (u_in || w_in) {
            int64_t cmp = (int64_t)vb - (int64_t)((uint64_t)(sp10 + tp10) << 1);
            *f = u_in && (!w_in || cmp < 0 || (cmp == 0 && (sp10 / 10 & 1) == 0)) ? sp10 : tp10;
            return;
        }
    }
    uint32_t t = s + 1;
    int u_in = vbl + odd <= s << 2, w_in = (t << 2) + odd <= vbr;
    if (u_in != w_in) {
        *f = u_in ? s : t;
        return;
    }
    int64_t cmp = (int64_t)vb - (int64_t)((uint64_t)(s + t) << 1);
    *f = cmp < 0 || (cmp == 0 && (s & 1) == 0) ? s : t;
}

/* A finite nonzero |v| as *f * 10^*e, f the shortest digits. */
static void f32_shortest(uint32_t bits, uint32_t *f, int *e)
{
    uint32_t be = bits >> 23 & 0xff, frac = bits & 0x7fffff;
    if (!be) {
        schubfach(-149, frac, f, e);
        return;
    }
    uint32_t c = frac | 1u << 23;
    int mq = 150 - (int)be; /* v = c * 2^-mq */
    if (mq > 0 && mq < 24 && (c >> mq) << mq == c) { /* an integer below 2^24: all its digits count */
        *f = c >> mq;
        *e = 0;
        return;
    }
    schubfach(-mq, c, f, e);
}

/* Eight at a time on AVX2 lanes: f32_shortest for bits[0..n - n % 8)
 * (finite; the sign ignored; 0 gives f = e = 0), the count done returned.
 * Every branch of the scalar code becomes a lane mask and a blend, and its
 * two 64-bit pieces become 32-bit ones:
 * - round_to_odd's g * cp / 2^64: binary32's shifts h are 33..36
 *   (scripts/gen_schubfach_table.py checks), so cp = x 2^32 with x < 2^31,
 *   and the high 64 bits are gh x + (gl x) / 2^32, which _mm256_mul_epu32
 *   forms on the even lanes and, shifted down, the odd ones;
 * - the tie-break's vb - 2 (s + t) < 0 (or == 0) is vb / 2 < s + t (or vb
 *   even and vb / 2 == s + t): no 64-bit compare.
 * The floor logs are Dragonbox's 32-bit forms, exact over the same range
 * (the script checks those too). `make test-numtext-exhaustive` spells all
 * 2^32 patterns through the list writer, so this path, and the scalar one
 * through tp_numtext_f32. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#define LANES8 __attribute__((target("avx2"))) static inline

LANES8 __m256i ule8(__m256i a, __m256i b) { return _mm256_cmpeq_epi32(_mm256_max_epu32(a, b), b); }

/* The high 32 bits of each lane's 64-bit product a b (unsigned), shifted
 * right by 32 + extra. */
LANES8 __m256i mulhi8(__m256i a, __m256i b, int extra)
{
    __m256i even = _mm256_srli_epi64(_mm256_mul_epu32(a, b), 32 + extra);
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), _mm256_srli_epi64(b, 32));
    odd = _mm256_slli_epi64(_mm256_srli_epi64(odd, 32 + extra), 32);
    return _mm256_blend_epi32(even, odd, 0xaa);
}

LANES8 __m256i round_to_odd8(__m256i gh, __m256i gl, __m256i x)
{
    const __m256i low = _mm256_set1_epi64x(0xffffffff);
    __m256i r[2];
    for (int half = 0; half < 2; half++) { /* even lanes, then the odd ones moved down */
        __m256i h = half ? _mm256_srli_epi64(gh, 32) : gh, l = half ? _mm256_srli_epi64(gl, 32) : gl;
        __m256i xx = half ? _mm256_srli_epi64(x, 32) : x;
        __m256i hi = _mm256_add_epi64(_mm256_mul_epu32(h, xx), _mm256_srli_epi64(_mm256_mul_epu32(l, xx), 32));
        r[half] = _mm256_or_si256(_mm256_srli_epi64(hi, 31),
                                  _mm256_srli_epi64(_mm256_add_epi64(_mm256_and_si256(hi, low), low), 32));
    }
    return _mm256_blend_epi32(r[0], _mm256_slli_epi64(r[1], 32), 0xaa);
}

/* The scalar code's cmp < 0 || (cmp == 0 && even), cmp = vb - 2 mid: the
 * value is nearer the lower candidate, or halfway and the lower one even
 * (even: its parity bit clear). */
LANES8 __m256i nearer_lower8(__m256i half, __m256i vb_even, __m256i mid, __m256i even)
{
    __m256i lt = _mm256_xor_si256(ule8(mid, half), _mm256_set1_epi32(-1));
    return _mm256_or_si256(lt, _mm256_and_si256(_mm256_and_si256(vb_even, _mm256_cmpeq_epi32(half, mid)), even));
}

__attribute__((target("avx2"))) static size_t f32_shortest8(const uint32_t *bits, size_t n, uint32_t *f, int *e)
{
    const __m256i zero = _mm256_setzero_si256(), one = _mm256_set1_epi32(1), ones = _mm256_set1_epi32(-1);
    const __m256i ten = _mm256_set1_epi32(10);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(const void *)(bits + i)),
                                     _mm256_set1_epi32(0x7fffffff));
        __m256i be = _mm256_srli_epi32(v, 23), sub = _mm256_cmpeq_epi32(be, zero);
        __m256i c = _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi32(0x7fffff)),
                                    _mm256_andnot_si256(sub, _mm256_set1_epi32(1 << 23)));
        __m256i odd = _mm256_and_si256(c, one);
        /* a subnormal's q is -149, as be 1's */
        __m256i q = _mm256_sub_epi32(_mm256_or_si256(be, _mm256_and_si256(sub, one)), _mm256_set1_epi32(150));
        __m256i pow2 = _mm256_andnot_si256(_mm256_cmpeq_epi32(q, _mm256_set1_epi32(-149)),
                                           _mm256_cmpeq_epi32(c, _mm256_set1_epi32(1 << 23)));
        __m256i k = _mm256_blendv_epi8(
            _mm256_srai_epi32(_mm256_mullo_epi32(q, _mm256_set1_epi32(315653)), 20),
            _mm256_srai_epi32(_mm256_sub_epi32(_mm256_mullo_epi32(q, _mm256_set1_epi32(631305)),
                                               _mm256_set1_epi32(261663)), 21),
            pow2);
        __m256i sh = _mm256_add_epi32(_mm256_add_epi32(q, one), /* h - 32 */
                                      _mm256_srai_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(zero, k),
                                                                           _mm256_set1_epi32(1741647)), 19));
        __m256i idx = _mm256_slli_epi32(_mm256_sub_epi32(_mm256_set1_epi32(-G1_MIN), k), 1); /* 2 (-k - G1_MIN) */
        __m256i gl = _mm256_add_epi32(_mm256_i32gather_epi32((const int *)G1.u32, idx, 4), one);
        __m256i gh = _mm256_i32gather_epi32((const int *)G1.u32 + 1, idx, 4);
        gh = _mm256_sub_epi32(gh, _mm256_cmpeq_epi32(gl, zero)); /* g = G1 + 1: the carry */
        __m256i cb = _mm256_slli_epi32(c, 2);
        __m256i vb = round_to_odd8(gh, gl, _mm256_sllv_epi32(cb, sh));
        __m256i vbl = round_to_odd8(gh, gl, _mm256_sllv_epi32(_mm256_sub_epi32(_mm256_sub_epi32(cb, _mm256_set1_epi32(2)), pow2), sh));
        __m256i vbr = round_to_odd8(gh, gl, _mm256_sllv_epi32(_mm256_add_epi32(cb, _mm256_set1_epi32(2)), sh));
        __m256i s = _mm256_srli_epi32(vb, 2), t = _mm256_add_epi32(s, one);
        __m256i q10 = mulhi8(s, _mm256_set1_epi32((int)0xcccccccdu), 3); /* s / 10 */
        __m256i sp10 = _mm256_mullo_epi32(q10, ten), tp10 = _mm256_add_epi32(sp10, ten);
        __m256i vbl_odd = _mm256_add_epi32(vbl, odd);
        __m256i u10 = ule8(vbl_odd, _mm256_slli_epi32(sp10, 2));
        __m256i w10 = ule8(_mm256_add_epi32(_mm256_slli_epi32(tp10, 2), odd), vbr);
        __m256i u = ule8(vbl_odd, _mm256_slli_epi32(s, 2));
        __m256i w = ule8(_mm256_add_epi32(_mm256_slli_epi32(t, 2), odd), vbr);
        __m256i half = _mm256_srli_epi32(vb, 1), vb_even = _mm256_cmpeq_epi32(_mm256_and_si256(vb, one), zero);
        /* u10 && (!w10 || nearer), and u != w ? u : nearer, as the scalar code */
        __m256i lower10 = _mm256_and_si256(
            u10, _mm256_or_si256(_mm256_xor_si256(w10, ones),
                                 nearer_lower8(half, vb_even, _mm256_add_epi32(sp10, tp10),
                                               _mm256_cmpeq_epi32(_mm256_and_si256(q10, one), zero))));
        __m256i lower = _mm256_blendv_epi8(nearer_lower8(half, vb_even, _mm256_add_epi32(s, t),
                                                         _mm256_cmpeq_epi32(_mm256_and_si256(s, one), zero)),
                                           u, _mm256_xor_si256(_mm256_cmpeq_epi32(u, w), ones));
        __m256i use10 = _mm256_and_si256(_mm256_xor_si256(ule8(s, _mm256_set1_epi32(9)), ones), _mm256_or_si256(u10, w10));
        __m256i fs = _mm256_blendv_epi8(_mm256_blendv_epi8(t, s, lower), _mm256_blendv_epi8(tp10, sp10, lower10), use10);
        /* an integer below 2^24 keeps all its digits: 0 < -q < 24 and c's
         * low -q bits clear */
        __m256i mq = _mm256_sub_epi32(zero, q);
        __m256i in_range = _mm256_and_si256(_mm256_cmpgt_epi32(mq, zero), _mm256_cmpgt_epi32(_mm256_set1_epi32(24), mq));
        __m256i cw = _mm256_srlv_epi32(c, mq);
        __m256i whole = _mm256_and_si256(_mm256_andnot_si256(sub, in_range),
                                         _mm256_cmpeq_epi32(_mm256_sllv_epi32(cw, mq), c));
        __m256i none = _mm256_cmpeq_epi32(v, zero);
        __m256i fv = _mm256_andnot_si256(none, _mm256_blendv_epi8(fs, cw, whole));
        __m256i ev = _mm256_andnot_si256(_mm256_or_si256(none, whole), k);
        _mm256_storeu_si256((__m256i *)(void *)(f + i), fv);
        _mm256_storeu_si256((__m256i *)(void *)(e + i), ev);
    }
    return i;
}

/* Whether this CPU runs f32_shortest8: a test of the CPU model libgcc
 * filled in at startup (no cache of our own, which threads would race on). */
static int have_lanes8(void) { return __builtin_cpu_supports("avx2") != 0; }
#else
static size_t f32_shortest8(const uint32_t *bits, size_t n, uint32_t *f, int *e)
{
    (void)bits, (void)n, (void)f, (void)e;
    return 0;
}
static int have_lanes8(void) { return 0; }
#endif

/* ---- spelling ----------------------------------------------------------- */

/* A block's worth of numbers through the stages (tp_numtext_f32_list), on
 * the stack. */
#define LIST_BLOCK 64

/* x < 10^4 as 4 ASCII digits, the first in the lowest byte: 2+2, then
 * 1+1 digit splits done on both halves of one register at once (no chain
 * of divisions, no digits stored byte by byte and read back wide, which
 * stalls store-to-load forwarding). Inlined, so that a loop over it runs
 * on vector lanes (spell_digits_block). */
static inline __attribute__((always_inline)) uint32_t ascii4(uint32_t x)
{
    uint32_t hundreds = (x * 5243) >> 19; /* x / 100 for x < 10^4 */
    uint32_t pairs = (x - hundreds * 100) << 16 | hundreds;
    uint32_t tens = (pairs * 103) >> 10 & 0x000f000fu; /* / 10 in each half */
    return ((pairs - tens * 10) << 8 | tens) + 0x30303030u;
}

static void store8(char *p, uint64_t v) { memcpy(p, &v, 8); }

/* Spelling goes in three stages, each a short loop over a block of numbers
 * in tp_numtext_f32_list: one number's stages chained together are a long
 * dependency chain (multiplies, a table load, more multiplies) that the
 * processor cannot overlap with the next number's, while a stage's loop
 * over many numbers is independent work it overlaps freely (the list ran
 * 16% faster than the same stages number by number), and the digit stages
 * run on vector lanes (spell_digits_block: 17.4 -> 13.6 ns a number with
 * AVX2; its AVX-512 clone took the example's whole answer from 9.1 to 7.7
 * ns a number).
 *
 * 1. f * 10^e (at most 9 significant digits; a 10-digit f ends in a 0) as
 *    exactly 9 digits, and the exponent of its first digit in *exp10 (e on
 *    entry): the digits counted by comparisons, f scaled to nine by
 *    selects, both sides of each computed (a branch or a table load would
 *    stop the vectorizer). f = 0 gives digits that are not used. */
static inline __attribute__((always_inline)) uint32_t nine_digits(uint32_t f, int *exp10)
{
    uint32_t x = f | (f == 0);
    uint32_t more = (uint32_t)(x >= 10) + (uint32_t)(x >= 100) + (uint32_t)(x >= 1000) +
                    (uint32_t)(x >= 10000) + (uint32_t)(x >= 100000) + (uint32_t)(x >= 1000000) +
                    (uint32_t)(x >= 10000000) + (uint32_t)(x >= 100000000) + (uint32_t)(x >= 1000000000);
    *exp10 += (int)more; /* digits - 1 */
    uint32_t tenth = x / 10, up;
    x = more == 9 ? tenth : x; /* 10 digits: only from Schubfach, ending in 0 */
    /* then to nine digits, each step taken while x is still short: by
     * 10^5 under 5 digits, by 10^2 under 7, and by 10 under 8 (twice) and
     * under 9 */
    up = x * 100000;
    x = x < 10000 ? up : x;
    up = x * 100;
    x = x < 1000000 ? up : x;
    up = x * 10;
    x = x < 10000000 ? up : x;
    up = x * 10;
    x = x < 10000000 ? up : x;
    up = x * 10;
    return x < 100000000 ? up : x;
}

/* 2. m's first digit (an ASCII byte), the other 8 (the first in the lowest
 *    byte) and how many of the 9 count (trailing zeros dropped; at least 1). */
typedef struct {
    uint64_t rest;
    char first;
    uint8_t sig;
} digits9;

/* m's digits given its first (top) and the other eight as ASCII (rest). */
static inline __attribute__((always_inline)) digits9 digits_of(uint32_t top, uint64_t rest)
{
    uint64_t nonzero = rest ^ 0x3030303030303030ULL; /* a '0' byte becomes 0 */
    int sig = nonzero ? 9 - (__builtin_clzll(nonzero) >> 3) : 1;
    return (digits9){rest, (char)('0' + top), (uint8_t)sig};
}

static digits9 spell_digits(uint32_t m)
{
    uint32_t top = m / 100000000, r = m - top * 100000000;
    return digits_of(top, ascii4(r / 10000) | (uint64_t)ascii4(r % 10000) << 32);
}

/* Stages 1 and 2 for a block: nine_digits and spell_digits of each f[i]
 * (e[i] updated), split into loops that run on vector lanes, four digits
 * a lane in stage 2. GCC's clones: clang (the fuzz build) would not export
 * their dispatcher. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#endif
static void spell_digits_block(const uint32_t *f, int *e, size_t n, digits9 *d)
{
    uint32_t m[LIST_BLOCK], top[LIST_BLOCK], four[2 * LIST_BLOCK]; /* first four digits, then the last four */
    for (size_t i = 0; i < n; i++)
        m[i] = nine_digits(f[i], &e[i]);
    for (size_t i = 0; i < n; i++) {
        top[i] = m[i] / 100000000;
        uint32_t r = m[i] - top[i] * 100000000;
        four[i] = r / 10000;
        four[LIST_BLOCK + i] = r % 10000;
    }
    for (size_t j = 0; j < n; j++) {
        four[j] = ascii4(four[j]);
        four[LIST_BLOCK + j] = ascii4(four[LIST_BLOCK + j]);
    }
    for (size_t i = 0; i < n; i++)
        d[i] = digits_of(top[i], four[i] | (uint64_t)four[LIST_BLOCK + i] << 32);
}

/* 3. The text by numtext.h's rules: decimal notation for exponents -6..8
 *    of the first digit ("0.000123", "123.5", "2.0"), "1e-7" and
 *    "3.4028235e38" beyond. buf has TP_NUMTEXT_MAX bytes: the 8-byte
 *    stores may write past the text, never past that. */
static size_t place(int neg, digits9 d, int exp10, char *buf)
{
    char *p = buf + neg;
    buf[0] = '-';
    if (exp10 < -6 || exp10 > 8) {
        p[0] = d.first;
        p[1] = '.';
        store8(p + 2, d.rest);
        p += d.sig > 1 ? d.sig + 1 : 1;
        *p++ = 'e';
        return (size_t)(p - buf) + tp_numtext_i64(exp10, p);
    }
    if (exp10 < 0) {
        memcpy(p, "0.000000", 8);
        p[1 - exp10] = d.first;
        store8(p + 2 - exp10, d.rest);
        return (size_t)(p - buf) + (size_t)(1 - exp10 + d.sig);
    }
    int whole = exp10 + 1; /* 1..9 digits before the point */
    p[0] = d.first;
    store8(p + 1, d.rest);
    p[whole] = '.';
    if (d.sig <= whole) {
        p[whole + 1] = '0';
        return (size_t)(p - buf) + (size_t)whole + 2;
    }
    store8(p + whole + 1, d.rest >> (8 * (whole - 1))); /* whole < sig <= 9: a shift below 64 */
    return (size_t)(p - buf) + (size_t)d.sig + 1;
}

static size_t spell(int neg, uint32_t f, int e, char *buf)
{
    int exp10 = e;
    uint32_t m = nine_digits(f, &exp10);
    return place(neg, spell_digits(m), exp10, buf);
}

static size_t spell_zero(int neg, char *buf)
{
    memcpy(buf, neg ? "-0.0" : "0.0", 3 + (size_t)neg);
    return 3 + (size_t)neg;
}

size_t tp_numtext_f32(float v, char *buf)
{
    uint32_t bits, f;
    int e;
    memcpy(&bits, &v, 4);
    int neg = (int)(bits >> 31);
    if (!(bits & 0x7fffffffu))
        return spell_zero(neg, buf);
    f32_shortest(bits & 0x7fffffffu, &f, &e);
    return spell(neg, f, e, buf);
}

/* bits[0..n) (all finite: the caller stops before a NaN or Inf) in
 * tp_numtext_f32's text, each followed by ','. */
static size_t spell_block(const uint32_t *bits, size_t n, char *out)
{
    uint32_t f[LIST_BLOCK];
    int e[LIST_BLOCK];
    digits9 d[LIST_BLOCK];
    for (size_t i = have_lanes8() ? f32_shortest8(bits, n, f, e) : 0; i < n; i++) {
        f[i] = 0;
        e[i] = 0;
        if (bits[i] & 0x7fffffffu)
            f32_shortest(bits[i] & 0x7fffffffu, &f[i], &e[i]);
    }
    spell_digits_block(f, e, n, d);
    char *p = out;
    for (size_t i = 0; i < n; i++) {
        int neg = (int)(bits[i] >> 31);
        p += bits[i] & 0x7fffffffu ? place(neg, d[i], e[i], p) : spell_zero(neg, p);
        *p++ = ',';
    }
    return (size_t)(p - out);
}

size_t tp_numtext_f32_list(const void *data, size_t count, char *out, size_t *written)
{
    const char *src = data;
    size_t len = 0, i = 0;
    while (i < count) {
        uint32_t bits[LIST_BLOCK];
        size_t n = count - i < LIST_BLOCK ? count - i : LIST_BLOCK, finite = 0;
        memcpy(bits, src + 4 * i, 4 * n);
        while (finite < n && (bits[finite] & 0x7f800000u) != 0x7f800000u)
            finite++;
        len += spell_block(bits, finite, out + len);
        i += finite;
        if (finite < n)
            break;
    }
    *written = i;
    return len - (len > 0); /* no ',' after the last */
}

size_t tp_numtext_precision(double v, int digits, char *buf)
{
    uint32_t f;
    int e;
    if (v == 0)
        return tp_numtext_f32((float)v, buf);
    tp_numtext_round(fabs(v), digits < 1 ? 1 : digits > 9 ? 9 : digits, &f, &e);
    return spell(signbit(v) != 0, f, e, buf);
}

/* FP16 and BF16 have no shortest-digits routine of their own: the fewest
 * significant digits (at most max_digits, enough for any value of the type)
 * whose decimal reads back, through the server's own reader, to h. */
static size_t shortest_half(uint16_t h, float (*widen)(uint16_t), uint16_t (*narrow)(float),
                            int max_digits, char *buf)
{
    double v = widen(h);
    for (int d = 1; d < max_digits; d++) {
        size_t n = tp_numtext_precision(v, d, buf);
        if (narrow(tp_numtext_parse_f32(buf, n)) == h)
            return n;
    }
    return tp_numtext_precision(v, max_digits, buf);
}

size_t tp_numtext_f16(uint16_t h, char *buf)
{
    return shortest_half(h, tp_f16_to_f32, tp_f32_to_f16, 5, buf);
}

size_t tp_numtext_bf16(uint16_t h, char *buf)
{
    return shortest_half(h, tp_bf16_to_f32, tp_f32_to_bf16, 4, buf);
}

size_t tp_numtext_i64(int64_t v, char *buf)
{
    char tmp[24];
    /* the magnitude as unsigned, so INT64_MIN needs no special case */
    uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + u % 10);
        u /= 10;
    } while (u);
    size_t len = 0;
    if (v < 0)
        buf[len++] = '-';
    while (n)
        buf[len++] = tmp[--n];
    return len;
}
