/* numtext.h — numbers to and from JSON text at library speed.
 *
 * Floats are written in the shortest form that reads back to the same value
 * of their own type (at most 9 significant digits for FP32, 5 for FP16, 4
 * for BF16) and read with correct rounding. FP32 is written here with
 * Schubfach (numtext.c), printf's %.17g having dominated the JSON path's
 * profile; reading, and rounding to a precision, is the C++ standard
 * library's <charconv> (numtext_charconv.cc). Integers are written and read
 * here, without printf or strtoll.
 *
 * Writers take a buffer of at least TP_NUMTEXT_MAX bytes and return the
 * text's length; they may overwrite any byte of the buffer after the text.
 * Floats must be finite (JSON has no NaN or Inf).
 * Integral floats keep a ".0" so that JSON readers which type numbers by
 * their spelling (Python's json) still see floats. */
#ifndef TP_NUMTEXT_H
#define TP_NUMTEXT_H

#include <stddef.h>
#include <stdint.h>

#define TP_NUMTEXT_MAX 32

size_t tp_numtext_f32(float v, char *buf);
/* count FP32 values at data (any alignment) spelled as tp_numtext_f32
 * spells them, separated by ',', into out, which has count *
 * (TP_NUMTEXT_MAX + 1) bytes: the text's length. Stops before the first
 * value that is not finite; *written says how many were written (count
 * when all were). Faster than a loop of tp_numtext_f32 (numtext.c says
 * why). */
size_t tp_numtext_f32_list(const void *data, size_t count, char *out, size_t *written);
size_t tp_numtext_f16(uint16_t h, char *buf);
size_t tp_numtext_bf16(uint16_t h, char *buf);
size_t tp_numtext_i64(int64_t v, char *buf);
/* v rounded to digits (1..9) significant digits, same spelling rules. */
size_t tp_numtext_precision(double v, int digits, char *buf);
/* The digits behind tp_numtext_precision (numtext_charconv.cc): v > 0 as
 * *f * 10^*e, f of `digits` digits. */
void tp_numtext_round(double v, int digits, uint32_t *f, int *e);

/* s[0..len) must be a JSON number (tp_numtext_scan says so). f32 rounds the
 * decimal once, straight to the nearest float (not via a double). */
float tp_numtext_parse_f32(const char *s, size_t len);
double tp_numtext_parse_f64(const char *s, size_t len);

/* s[0..len) when it is a plain decimal of at most 7 digits before and 7
 * after the point, with no exponent, that converts to FP32 in one rounding
 * (what clients mostly send: "-0.123456", "42", "3.5"): 1, and *out
 * correctly rounded, as tp_numtext_parse_f32 gives it. 0 for anything else,
 * which tp_numtext_scan and tp_numtext_parse_f32 then take (exponents, long
 * mantissas, text that is no number). It reads whole 8-byte words: s must
 * have TP_NUMTEXT_READ_AHEAD readable bytes, however short len is. */
#define TP_NUMTEXT_READ_AHEAD 17
int tp_numtext_short_f32(const char *s, size_t len, float *out);
/* The same reader on 8-byte words (SWAR), which CPUs without SSE4.1 run
 * (tp_numtext_short_f32 uses one 16-byte vector where it can): it takes
 * the same tokens with the same bits; tests compare the two. */
int tp_numtext_short_f32_swar(const char *s, size_t len, float *out);

/* s[0..len) when it is exactly a JSON number of at most 19 significant
 * digits whose value is w * 10^q with |q| <= 22: 1, and *out the nearest
 * FP32 (as tp_numtext_parse_f32 gives it), through one double product
 * checked against the midpoints between floats. 0 for anything else (text
 * that is no number, more digits, a value too near a midpoint to tell),
 * which tp_numtext_scan and the library then take. tp_numtext_parse_f32
 * tries it first. Reads nothing past s[len - 1]. */
int tp_numtext_wide_f32(const char *s, size_t len, float *out);
/* The same reader byte by byte and on 8-byte words, which CPUs without
 * SSE4.1 run (tp_numtext_wide_f32 reads a long token's last 16 digits as
 * one vector where it can): the same tokens, the same bits; tests compare
 * the two. */
int tp_numtext_wide_f32_scalar(const char *s, size_t len, float *out);
/* Every token tp_numtext_short_f32 or tp_numtext_wide_f32 takes, with
 * their bits, where s has TP_NUMTEXT_READ_AHEAD readable bytes (an array's
 * element): a token of up to 16 bytes after the sign is read once, as one
 * vector where the CPU has SSE4.1, whichever of the two would take it. */
int tp_numtext_read_f32(const char *s, size_t len, float *out);

/* The JSON number token at s (no leading blanks), at most len bytes: its
 * length, or 0 when s does not start with one. *is_int is 1 when it has no
 * fraction and no exponent. */
size_t tp_numtext_scan(const char *s, size_t len, int *is_int);

/* Significant digits of a decimal s[0..len) (first to last nonzero digit
 * before any exponent; 1 for zero): how tests hold the writers to their
 * digit budgets. */
int tp_numtext_digits(const char *s, size_t len);

/* An integer token (from tp_numtext_scan with is_int) as int64: 0, or -1 when
 * it does not fit. */
int tp_numtext_parse_i64(const char *s, size_t len, int64_t *out);

#endif
