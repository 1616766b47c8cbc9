// numtext_oracle.cc — the reference numtext_exhaustive holds tpserve's own
// FP32 writer (Schubfach, server/numtext.c) to: the C++ standard library's
// shortest round-trip digits (libstdc++'s std::to_chars, Ryu), which are
// also the nearest to the value among the shortest.
#include <charconv>
#include <stdint.h>

extern "C" int numtext_oracle_f32(float v, char *digits, int *exp10);

// |v| finite nonzero: its digits without trailing zeros (how many is the
// return value) and the power of ten of the first.
extern "C" int numtext_oracle_f32(float v, char *digits, int *exp10)
{
    char sci[48];
    auto r = std::to_chars(sci, sci + sizeof sci, v < 0 ? -v : v, std::chars_format::scientific);
    int n = 0;
    const char *s = sci;
    for (; s < r.ptr && *s != 'e'; s++)
        if (*s != '.')
            digits[n++] = *s;
    while (n > 1 && digits[n - 1] == '0')
        n--;
    bool neg = s + 1 < r.ptr && s[1] == '-';
    int e = 0;
    for (s += 2; s < r.ptr; s++)
        e = e * 10 + (*s - '0');
    *exp10 = neg ? -e : e;
    return n;
}
