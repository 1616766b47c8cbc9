// numtext_dc.cc — the C++ side of numtext.h: float <-> decimal text through
// Google's double-conversion (Debian libdouble-conversion-dev). Only plain
// value-returning calls cross the extern "C" boundary; the library neither
// allocates nor throws, so nothing else does either.
#include <double-conversion/double-conversion.h>

#include <cfloat>
#include <stdint.h>
#include <string.h>

extern "C" {
#include "numtext.h"
}

using double_conversion::DoubleToStringConverter;
using double_conversion::StringBuilder;
using double_conversion::StringToDoubleConverter;

namespace {

// Decimal notation for 1e-6 <= |v| < 1e9, exponent beyond (both are the
// shorter spelling there); "2.0" rather than "2" so integral floats stay floats.
const DoubleToStringConverter kWriter(DoubleToStringConverter::EMIT_TRAILING_DECIMAL_POINT |
                                          DoubleToStringConverter::EMIT_TRAILING_ZERO_AFTER_POINT |
                                          DoubleToStringConverter::NO_TRAILING_ZERO,
                                      nullptr, nullptr, 'e', -6, 9, 6, 0);

// Precision mode pads integers with zeros up to 1e9 (as the shortest mode
// switches to exponents) and drops trailing fraction zeros; the ".0" of an
// integral value is added by hand (in this mode the library's flag for it
// would switch to exponent notation instead).
const DoubleToStringConverter kPrecisionWriter(DoubleToStringConverter::NO_TRAILING_ZERO, nullptr,
                                               nullptr, 'e', -6, 9, 6, 8);

// The callers pass only validated JSON number tokens, so no leniency is
// needed; NaN marks "not a number" and never happens.
const StringToDoubleConverter kReader(StringToDoubleConverter::NO_FLAGS, 0.0, __builtin_nan(""),
                                      nullptr, nullptr);

size_t finish(StringBuilder &sb)
{
    size_t n = static_cast<size_t>(sb.position());
    sb.Finalize();
    return n;
}

}  // namespace

extern "C" size_t tp_numtext_f32(float v, char *buf)
{
    StringBuilder sb(buf, TP_NUMTEXT_MAX);
    kWriter.ToShortestSingle(v, &sb);
    return finish(sb);
}

// The digits of v rounded to `digits` significant ones, the FP16/BF16
// writers' building block (numtext.c tries 1, 2, ... until one reads back).
extern "C" size_t tp_numtext_precision(double v, int digits, char *buf)
{
    StringBuilder sb(buf, TP_NUMTEXT_MAX);
    kPrecisionWriter.ToPrecision(v, digits, &sb);
    size_t n = finish(sb);
    if (!memchr(buf, '.', n) && !memchr(buf, 'e', n)) {
        memcpy(buf + n, ".0", 3);
        n += 2;
    }
    return n;
}

namespace {

// Clinger's fast path for binary32: a decimal m * 10^e with m < 2^24 and
// |e| <= 10 has m and 10^|e| exact in a float (5^10 < 2^24), so one IEEE
// multiply or divide rounds the exact value once: the correctly rounded
// float, what the library would return. It covers what clients mostly send
// ("%.6g", "%.7g", short literals); anything else (more digits, bigger
// exponents) takes the library's path. Requires float arithmetic in float
// precision (SSE, not x87).
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

}  // namespace

extern "C" float tp_numtext_parse_f32(const char *s, size_t len)
{
    float f;
    if (parse_f32_fast(s, len, &f))
        return f;
    int used = 0;
    return kReader.StringToFloat(s, static_cast<int>(len), &used);
}

extern "C" double tp_numtext_parse_f64(const char *s, size_t len)
{
    int used = 0;
    return kReader.StringToDouble(s, static_cast<int>(len), &used);
}
