/* libFuzzer harness: the JSON number reader and writer (numtext.h),
 * checked against the C library. The input is a token: when
 * tp_numtext_scan takes all of it as a JSON number, every FP32 reader
 * that accepts it (the short one, the wide one, the general one, which
 * must) gives strtof's bits, and a reader never accepts what the scan
 * refuses. Its first bytes, as FP32 values, are written one by one and as
 * a list: the same text, and each reads back to its bits. A mismatch
 * aborts (a finding). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "numtext.h"

#define MAX_TOKEN 96

static uint32_t bits_of(float f)
{
    uint32_t b;
    memcpy(&b, &f, 4);
    return b;
}

static void check(int ok, const char *what, const char *tok)
{
    if (!ok) {
        fprintf(stderr, "fuzz_numtext: %s for '%s'\n", what, tok);
        abort();
    }
}

static void read_token(const uint8_t *data, size_t size)
{
    char tok[MAX_TOKEN + 1], padded[MAX_TOKEN + TP_NUMTEXT_READ_AHEAD + 1];
    size_t len = size < MAX_TOKEN ? size : MAX_TOKEN;
    memcpy(tok, data, len);
    tok[len] = '\0';
    if (strlen(tok) != len) /* strtof stops at a NUL: compare only NUL-free tokens */
        return;
    memset(padded, ' ', sizeof padded);
    memcpy(padded, tok, len);
    int is_int;
    int number = len > 0 && tp_numtext_scan(tok, len, &is_int) == len;
    float want = strtof(tok, NULL), f;
    if (number)
        check(bits_of(tp_numtext_parse_f32(tok, len)) == bits_of(want), "parse_f32 differs from strtof", tok);
    float g;
    int wide = tp_numtext_wide_f32(tok, len, &f);
    check(wide == tp_numtext_wide_f32_scalar(tok, len, &g), "the two wide readers disagree on taking", tok);
    if (wide) {
        check(number, "wide reader took what the scan refuses", tok);
        check(bits_of(f) == bits_of(want), "wide reader differs from strtof", tok);
        check(bits_of(g) == bits_of(want), "scalar wide reader differs from strtof", tok);
    }
    float h, sh;
    int short_swar = len > 0 && tp_numtext_short_f32_swar(padded, len, &sh);
    int read = tp_numtext_read_f32(padded, len, &h);
    check(read == (short_swar || wide), "the array's reader disagrees with the short and wide ones on taking", tok);
    if (read)
        check(bits_of(h) == bits_of(want), "the array's reader differs from strtof", tok);
    int took = len > 0 && tp_numtext_short_f32(padded, len, &f);
    check(took == (len > 0 && tp_numtext_short_f32_swar(padded, len, &g)), "the two short readers disagree on taking",
          tok);
    if (took) {
        check(number, "short reader took what the scan refuses", tok);
        check(bits_of(f) == bits_of(want), "short reader differs from strtof", tok);
        check(bits_of(g) == bits_of(want), "SWAR short reader differs from strtof", tok);
    }
}

static void write_values(const uint8_t *data, size_t size)
{
    enum { MAX_VALUES = 16 };
    float v[MAX_VALUES];
    size_t n = size / 4 < MAX_VALUES ? size / 4 : MAX_VALUES;
    memcpy(v, data, n * 4);
    char list[MAX_VALUES * (TP_NUMTEXT_MAX + 1)], one[TP_NUMTEXT_MAX + 1];
    size_t written, len = tp_numtext_f32_list(v, n, list, &written), at = 0;
    for (size_t i = 0; i < written; i++) {
        size_t k = tp_numtext_f32(v[i], one);
        one[k] = '\0';
        check(at + k <= len && memcmp(list + at, one, k) == 0, "list and single writer differ", one);
        at += k + 1; /* the ',' */
        check(bits_of(tp_numtext_parse_f32(one, k)) == bits_of(v[i]), "written value reads back otherwise",
              one);
    }
    check(written == n || !isfinite(v[written]), "list writer stopped before a finite value", "");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    read_token(data, size);
    write_values(data, size);
    return 0;
}
