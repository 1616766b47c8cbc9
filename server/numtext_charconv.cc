// numtext_charconv.cc — the C++ side of numtext.h: float <-> decimal text
// through the C++17 standard library's <charconv>. libstdc++ implements
// std::to_chars with Ryu (shortest round-trip digits) and, since GCC 12,
// std::from_chars with fast_float (correctly rounded); both are maintained
// with the compiler, and on this machine they take 30 ns per FP32 written and
// 19 ns per 9-digit FP32 read, against 72 ns and 56 ns for Google's
// double-conversion, which this file wrapped before (float printing was a
// fifth of a JSON request's server CPU). The library gives digits; the
// spelling (where the decimal point goes, ".0" on integral values) is ours.
// Only plain value-returning calls cross the extern "C" boundary; nothing
// here allocates or throws.
#include <cfloat>
#include <charconv>
#include <cmath>
#include <stdint.h>
#include <string.h>
#include <system_error>

extern "C" {
#include "numtext.h"
}

namespace {

// A finite nonzero magnitude as d[0].d[1]...d[n-1] x 10^exp10 (no trailing
// zero digits).
struct decimal {
    char d[24];
    int n, exp10;
};

// std::to_chars' scientific text ("1.2345e-07", "5e+00") as a decimal.
void from_scientific(const char *s, const char *end, decimal *out)
{
    out->n = 0;
    for (; s < end && *s != 'e'; s++)
        if (*s != '.')
            out->d[out->n++] = *s;
    while (out->n > 1 && out->d[out->n - 1] == '0')
        out->n--;
    bool neg = s + 1 < end && s[1] == '-';
    int e = 0;
    for (s += 2; s < end; s++)
        e = e * 10 + (*s - '0');
    out->exp10 = neg ? -e : e;
}

// Decimal notation for 1e-6 <= |v| < 1e9, exponent notation beyond (the
// shorter spelling on each side): "0.000123", "123.5", "2.0" (integral
// values keep ".0" so that readers which type numbers by their spelling,
// like Python's json, still see floats), "1e-7", "3.4028235e38".
size_t spell(bool neg, const decimal &v, char *buf)
{
    char *p = buf;
    if (neg)
        *p++ = '-';
    if (v.exp10 < -6 || v.exp10 >= 9) {
        *p++ = v.d[0];
        if (v.n > 1) {
            *p++ = '.';
            memcpy(p, v.d + 1, static_cast<size_t>(v.n - 1));
            p += v.n - 1;
        }
        *p++ = 'e';
        return static_cast<size_t>(std::to_chars(p, buf + TP_NUMTEXT_MAX, v.exp10).ptr - buf);
    }
    if (v.exp10 < 0) {
        memcpy(p, "0.000000", static_cast<size_t>(1 - v.exp10));
        p += 1 - v.exp10;
        memcpy(p, v.d, static_cast<size_t>(v.n));
        return static_cast<size_t>(p + v.n - buf);
    }
    int whole = v.exp10 + 1; // digits before the point
    for (int i = 0; i < whole; i++)
        *p++ = i < v.n ? v.d[i] : '0';
    *p++ = '.';
    if (v.n <= whole)
        *p++ = '0';
    for (int i = whole; i < v.n; i++)
        *p++ = v.d[i];
    return static_cast<size_t>(p - buf);
}

// std::to_chars' scientific text of |v| spelled as above, signed. Zero
// needs no case of its own: "0e+00" is the digit 0, spelled "0.0".
size_t spell_scientific(bool neg, const char *sci, const char *end, char *buf)
{
    decimal d;
    from_scientific(sci, end, &d);
    return spell(neg, d, buf);
}

// Where the spelling is plain decimal and the float's units are at most 1
// (|v| < 2^24), std::to_chars' shortest fixed notation is that spelling but
// for ".0" on integral values, without the detour through scientific text
// (a fifth of the cost of a number). The spelling's bounds are on the
// shortest digits' exponent; for floats that is the same as on the value:
// 1e9f is itself a float, and 1e-6f (the float nearest 1e-6) is the one
// whose shortest digits are "1e-6". Above 2^24 fixed notation prints the
// exact integer ("123456792") where the shortest digits give
// "123456790.0". Checked against the scientific path for every FP32.
size_t spell_fixed(float v, char *buf)
{
    char *p = buf;
    if (std::signbit(v))
        *p++ = '-';
    float a = std::fabs(v);
    p = std::to_chars(p, buf + TP_NUMTEXT_MAX, a, std::chars_format::fixed).ptr;
    if (a == std::floor(a)) { // integral: fixed notation printed no point
        *p++ = '.';
        *p++ = '0';
    }
    return static_cast<size_t>(p - buf);
}

}  // namespace

extern "C" size_t tp_numtext_f32(float v, char *buf)
{
    float a = std::fabs(v);
    if (a == 0 || (a >= 1e-6f && a < 16777216.0f))
        return spell_fixed(v, buf);
    char sci[TP_NUMTEXT_MAX];
    auto r = std::to_chars(sci, sci + sizeof sci, a, std::chars_format::scientific);
    return spell_scientific(std::signbit(v), sci, r.ptr, buf);
}

// v rounded to `digits` significant ones, the FP16/BF16 writers' building
// block (numtext.c tries 1, 2, ... until one reads back).
extern "C" size_t tp_numtext_precision(double v, int digits, char *buf)
{
    digits = digits < 1 ? 1 : digits > 17 ? 17 : digits; // what decimal.d and sci hold
    char sci[TP_NUMTEXT_MAX];
    auto r = std::to_chars(sci, sci + sizeof sci, std::fabs(v), std::chars_format::scientific,
                           digits - 1);
    return spell_scientific(std::signbit(v), sci, r.ptr, buf);
}

namespace {

// Clinger's fast path for binary32: a decimal m * 10^e with m < 2^24 and
// |e| <= 10 has m and 10^|e| exact in a float (5^10 < 2^24), so one IEEE
// multiply or divide rounds the exact value once: the correctly rounded
// float, what the library would return. It covers what clients mostly send
// ("%.6g", "%.7g", short literals) at about half the library's cost;
// anything else (more digits, bigger exponents) takes the library's path.
// Requires float arithmetic in float precision (SSE, not x87).
static_assert(FLT_EVAL_METHOD == 0, "the fast path needs float operations in float precision");

const float kPow10[] = {1e0f, 1e1f, 1e2f, 1e3f, 1e4f, 1e5f, 1e6f, 1e7f, 1e8f, 1e9f, 1e10f};

bool parse_f32_fast(const char *s, size_t len, float *out)
{
    size_t i = 0;
    bool neg = len > 0 && s[0] == '-';
    uint32_t m = 0;
    int digits = 0, exp10 = 0, frac = 0;
    for (i = neg; i < len && (s[i] == '.' || (s[i] >= '0' && s[i] <= '9')); i++) {
        if (s[i] == '.') {
            frac = 1;
            continue;
        }
        if ((m || s[i] != '0') && ++digits > 7) // 9,999,999 < 2^24
            return false;
        m = m * 10 + static_cast<uint32_t>(s[i] - '0');
        exp10 -= frac;
    }
    if (i < len) { // the exponent: [eE][+-]?digits (the token is valid JSON)
        bool eneg = s[++i] == '-';
        i += s[i] == '-' || s[i] == '+';
        int e = 0;
        for (; i < len; i++)
            if ((e = e * 10 + (s[i] - '0')) > 99)
                return false;
        exp10 += eneg ? -e : e;
    }
    if (exp10 < -10 || exp10 > 10)
        return m == 0 ? (*out = neg ? -0.0f : 0.0f, true) : false;
    float f = static_cast<float>(m);
    f = exp10 < 0 ? f / kPow10[-exp10] : f * kPow10[exp10];
    *out = neg ? -f : f;
    return true;
}

// Whether a valid JSON number token is at least 1 in magnitude (its first
// nonzero digit at or left of the units place, exponent included). Only
// asked of tokens std::from_chars found out of range, which are either far
// below 1 (they round to zero, as strtod's do) or far above (infinity).
bool at_least_one(const char *s, size_t len)
{
    size_t i = s[0] == '-';
    long place = 0; // the first nonzero digit's power of ten, before the exponent
    bool seen = false, frac = false;
    for (; i < len && s[i] != 'e' && s[i] != 'E'; i++) {
        if (s[i] == '.') {
            frac = true;
        } else if (!seen && s[i] != '0') {
            seen = true;
            place = frac ? place - 1 : 0;
        } else if (!seen && frac) {
            place--;
        } else if (seen && !frac) {
            place++;
        }
    }
    if (!seen)
        return false;
    long e = 0;
    bool eneg = i + 1 < len && s[i + 1] == '-';
    for (i += 1 + (i + 1 < len && (s[i + 1] == '-' || s[i + 1] == '+')); i < len; i++)
        e = e < 100000 ? e * 10 + (s[i] - '0') : e; // saturated: far out of range either way
    return place + (eneg ? -e : e) >= 0;
}

template <typename T>
T parse_library(const char *s, size_t len)
{
    T v = 0;
    auto r = std::from_chars(s, s + len, v);
    if (r.ec == std::errc::result_out_of_range) {
        v = at_least_one(s, len) ? static_cast<T>(INFINITY) : 0;
        v = s[0] == '-' ? -v : v;
    }
    return v;
}

}  // namespace

extern "C" float tp_numtext_parse_f32(const char *s, size_t len)
{
    // A token over 12 characters has more than 7 significant digits but
    // for runs of zeros or a spelled-out exponent ("-1.234567e-05"): the
    // fast path would mostly walk 8 digits to give up (a third of the cost
    // of Python's 17-digit spellings), and the library is right either way.
    float f;
    if (len <= 12 && parse_f32_fast(s, len, &f))
        return f;
    return parse_library<float>(s, len);
}

extern "C" double tp_numtext_parse_f64(const char *s, size_t len)
{
    return parse_library<double>(s, len);
}
