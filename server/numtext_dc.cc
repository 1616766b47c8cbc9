// numtext_dc.cc — the C++ side of numtext.h: float <-> decimal text through
// Google's double-conversion (Debian libdouble-conversion-dev). Only plain
// value-returning calls cross the extern "C" boundary; the library neither
// allocates nor throws, so nothing else does either.
#include <double-conversion/double-conversion.h>

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

extern "C" float tp_numtext_parse_f32(const char *s, size_t len)
{
    int used = 0;
    return kReader.StringToFloat(s, static_cast<int>(len), &used);
}

extern "C" double tp_numtext_parse_f64(const char *s, size_t len)
{
    int used = 0;
    return kReader.StringToDouble(s, static_cast<int>(len), &used);
}
