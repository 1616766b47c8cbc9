// numtext_charconv.cc — the C++ side of numtext.h: decimal text to floats
// through the C++17 standard library's <charconv>. Since GCC 12 libstdc++
// implements std::from_chars with fast_float (correctly rounded, maintained
// with the compiler): 19 ns per 9-digit FP32 read here, against 56 ns for
// Google's double-conversion, which this file wrapped before. Writing FP32
// moved to numtext.c (Schubfach), which is faster than std::to_chars' Ryu;
// std::to_chars still rounds to a given precision for the FP16/BF16 writers.
// FP32 tokens of up to 19 digits are read first by numtext_read.c
// (tp_numtext_wide_f32), which hands back what it cannot tell. Only plain
// value-returning calls cross the extern "C" boundary; nothing here
// allocates or throws.
#include <charconv>
#include <cmath>
#include <stdint.h>
#include <system_error>

extern "C" {
#include "numtext.h"
}

// v > 0 rounded to `digits` (1..9) significant digits, as f * 10^e: the
// FP16/BF16 writers' building block (numtext.c tries 1, 2, ... digits until
// one reads back, then spells it as FP32's are).
extern "C" void tp_numtext_round(double v, int digits, uint32_t *f, int *e)
{
    char sci[TP_NUMTEXT_MAX];
    auto r = std::to_chars(sci, sci + sizeof sci, v, std::chars_format::scientific, digits - 1);
    uint32_t m = 0;
    int n = 0;
    const char *s = sci;
    for (; s < r.ptr && *s != 'e'; s++)
        if (*s != '.')
            m = m * 10 + static_cast<uint32_t>(*s - '0'), n++;
    bool neg = s + 1 < r.ptr && s[1] == '-';
    int x = 0;
    for (s += 2; s < r.ptr; s++)
        x = x * 10 + (*s - '0');
    *f = m;
    *e = (neg ? -x : x) - (n - 1);
}

namespace {

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
    float f;
    if (tp_numtext_wide_f32(s, len, &f)) // up to 19 digits: numtext_read.c, 3-4x faster
        return f;
    return parse_library<float>(s, len);
}

extern "C" double tp_numtext_parse_f64(const char *s, size_t len)
{
    return parse_library<double>(s, len);
}
