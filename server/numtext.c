#include "numtext.h"

#include <string.h>

#include "dtype.h"

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
