/* test_body_codec.c — compressed request bodies: which Content-Encoding
 * values are taken, gzip and deflate inflated to the bytes that were
 * compressed (the test compresses them with zlib itself), the body limit
 * held exactly (a body that inflates to max bytes passes, one byte more is
 * too large, and a bomb stops there), and corrupt, truncated, trailing and
 * misdeclared data refused with a reason. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "body_codec.h"
#include "check_main.h"

/* src compressed in zlib's format, or gzip's with gzip set; malloc'd */
static unsigned char *compress_as(int gzip, const void *src, size_t n, size_t *out_n)
{
    z_stream z;
    memset(&z, 0, sizeof z);
    ck_assert_int_eq(deflateInit2(&z, 6, Z_DEFLATED, gzip ? 15 + 16 : 15, 8, Z_DEFAULT_STRATEGY), Z_OK);
    size_t cap = deflateBound(&z, (uLong)n) + 32;
    unsigned char *out = malloc(cap);
    ck_assert_ptr_nonnull(out);
    z.next_in = (Bytef *)(uintptr_t)src;
    z.avail_in = (uInt)n;
    z.next_out = out;
    z.avail_out = (uInt)cap;
    ck_assert_int_eq(deflate(&z, Z_FINISH), Z_STREAM_END);
    *out_n = z.total_out;
    deflateEnd(&z);
    return out;
}

START_TEST(encodings_taken_and_refused)
{
    tp_body_encoding e;
    char msg[256];
    ck_assert_int_eq(tp_body_encoding_parse(NULL, &e, msg, sizeof msg), 0);
    ck_assert_int_eq(e, TP_BODY_IDENTITY);
    ck_assert_int_eq(tp_body_encoding_parse(" Identity ", &e, msg, sizeof msg), 0);
    ck_assert_int_eq(e, TP_BODY_IDENTITY);
    ck_assert_int_eq(tp_body_encoding_parse("GZIP", &e, msg, sizeof msg), 0);
    ck_assert_int_eq(e, TP_BODY_GZIP);
    ck_assert_int_eq(tp_body_encoding_parse("x-gzip", &e, msg, sizeof msg), 0);
    ck_assert_int_eq(e, TP_BODY_GZIP);
    ck_assert_int_eq(tp_body_encoding_parse("deflate\t", &e, msg, sizeof msg), 0);
    ck_assert_int_eq(e, TP_BODY_DEFLATE);
    const char *refused[] = {"br", "gzip, deflate", "gzip2", "", "compress", "deflat"};
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        msg[0] = '\0';
        ck_assert_msg(tp_body_encoding_parse(refused[i], &e, msg, sizeof msg) == -1, "'%s' taken", refused[i]);
        ck_assert_msg(strstr(msg, "is not supported (gzip, deflate or identity"), "%s: %s", refused[i], msg);
    }
}
END_TEST

START_TEST(gzip_and_deflate_inflate_to_what_was_compressed)
{
    /* a body of every size class: empty, one byte, one past inflate's first
     * guess of room (4x the compressed size), and large */
    size_t sizes[] = {0, 1, 5000, 1 << 20};
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
        size_t n = sizes[k];
        unsigned char *src = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
            src[i] = (unsigned char)((i * 2654435761u) >> 13); /* compresses, not trivially */
        for (int gzip = 0; gzip <= 1; gzip++) {
            size_t cn;
            unsigned char *c = compress_as(gzip, src, n, &cn);
            char *out;
            size_t out_n;
            int big;
            tp_err err = {{0}};
            tp_status st = tp_body_decode(gzip ? TP_BODY_GZIP : TP_BODY_DEFLATE, (const char *)c, cn, n, NULL,
                                          &out, &out_n, &big, &err);
            ck_assert_msg(st == TP_OK, "%zu bytes, gzip %d: %s", n, gzip, err.msg);
            ck_assert_uint_eq(out_n, n);
            ck_assert_int_eq(out[n], '\0');
            ck_assert(memcmp(out, src, n) == 0);
            free(out);
            free(c);
        }
        free(src);
    }
}
END_TEST

START_TEST(limit_is_exact_and_bombs_stop_there)
{
    size_t n = 100000;
    char *zeros = calloc(1, n);
    size_t cn;
    unsigned char *c = compress_as(1, zeros, n, &cn);
    char *out = (char *)1;
    size_t out_n;
    int big;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_body_decode(TP_BODY_GZIP, (const char *)c, cn, n, NULL, &out, &out_n, &big, &err), TP_OK);
    ck_assert(!big);
    free(out);
    out = (char *)1;
    ck_assert_int_eq(tp_body_decode(TP_BODY_GZIP, (const char *)c, cn, n - 1, NULL, &out, &out_n, &big, &err),
                     TP_INVALID);
    ck_assert(big);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(err.msg, "gzip body inflates past max_body_bytes 99999"));
    free(c);
    free(zeros);
    /* 256 MiB of zeros from ~250 KiB, against a 1 MiB limit */
    size_t bomb_n = (size_t)256 << 20;
    char *bomb_src = calloc(1, bomb_n);
    c = compress_as(0, bomb_src, bomb_n, &cn);
    free(bomb_src);
    ck_assert_int_eq(tp_body_decode(TP_BODY_DEFLATE, (const char *)c, cn, 1 << 20, NULL, &out, &out_n, &big, &err),
                     TP_INVALID);
    ck_assert(big);
    free(c);
}
END_TEST

/* Inflating draws on the memory budget as the buffer grows: a body that
 * would inflate past what is left is refused (503's verdict) before the
 * growth that passes it, past the whole budget 413's, and what it took is
 * given back; one that fits keeps its buffer's capacity taken. */
START_TEST(inflating_draws_on_the_memory_budget)
{
    size_t n = (size_t)8 << 20;
    char *zeros = calloc(1, n);
    size_t cn;
    unsigned char *c = compress_as(1, zeros, n, &cn);
    free(zeros);
    tp_mem_budget *b = tp_mem_budget_create((int64_t)4 << 20);
    tp_mem_hold other = {b, 0, TP_MEM_OK}, h = {b, 0, TP_MEM_OK};
    char *out = (char *)1;
    size_t out_n;
    int big;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_body_decode(TP_BODY_GZIP, (const char *)c, cn, (size_t)64 << 20, &h, &out, &out_n, &big, &err),
                     TP_UNAVAILABLE);
    ck_assert_int_eq(h.refused, TP_MEM_TOO_LARGE);
    ck_assert_ptr_null(out);
    ck_assert_int_eq(h.held, 0);
    ck_assert_int_eq(tp_mem_budget_used(b), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "inflating a gzip body"));
    /* with room for it alone, but another request holding most */
    tp_mem_budget_set_limit(b, (int64_t)16 << 20);
    ck_assert_int_eq(tp_mem_take(&other, (int64_t)12 << 20), TP_MEM_OK);
    h.refused = TP_MEM_OK;
    ck_assert_int_eq(tp_body_decode(TP_BODY_GZIP, (const char *)c, cn, (size_t)64 << 20, &h, &out, &out_n, &big, &err),
                     TP_UNAVAILABLE);
    ck_assert_int_eq(h.refused, TP_MEM_FULL);
    ck_assert_int_eq(tp_mem_budget_used(b), (int64_t)12 << 20);
    tp_mem_release(&other);
    h.refused = TP_MEM_OK;
    ck_assert_int_eq(tp_body_decode(TP_BODY_GZIP, (const char *)c, cn, (size_t)64 << 20, &h, &out, &out_n, &big, &err),
                     TP_OK);
    ck_assert_uint_eq(out_n, n);
    ck_assert_int_ge(h.held, (int64_t)n);
    ck_assert_int_le(h.held, (int64_t)2 * n);
    tp_mem_release(&h);
    free(out);
    free(c);
    tp_mem_budget_free(b);
}
END_TEST

static void expect_refused(tp_body_encoding enc, const void *data, size_t n, const char *want)
{
    char *out = (char *)1;
    size_t out_n;
    int big = 1;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_body_decode(enc, data, n, 1 << 20, NULL, &out, &out_n, &big, &err), TP_INVALID);
    ck_assert(!big);
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(err.msg, want), "message '%s' lacks '%s'", err.msg, want);
}

START_TEST(corrupt_truncated_trailing_and_misdeclared_refused)
{
    const char text[] = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}]}";
    size_t gn, dn;
    unsigned char *g = compress_as(1, text, sizeof text - 1, &gn);
    unsigned char *d = compress_as(0, text, sizeof text - 1, &dn);
    expect_refused(TP_BODY_GZIP, text, sizeof text - 1, "gzip body is not valid gzip data at byte");
    expect_refused(TP_BODY_GZIP, d, dn, "gzip body is not valid gzip data"); /* zlib's, declared gzip */
    expect_refused(TP_BODY_DEFLATE, g, gn, "deflate body is not valid deflate data");
    expect_refused(TP_BODY_GZIP, g, gn - 4, "gzip body is truncated: it ends inside the compressed data");
    expect_refused(TP_BODY_DEFLATE, d, dn / 2, "deflate body is truncated");
    unsigned char *longer = malloc(gn + 3);
    memcpy(longer, g, gn);
    memcpy(longer + gn, "xyz", 3);
    expect_refused(TP_BODY_GZIP, longer, gn + 3, "gzip body has 3 bytes after the end of its compressed data");
    g[gn - 1] ^= 0x40; /* the stored length: the check the trailer exists for */
    expect_refused(TP_BODY_GZIP, g, gn, "gzip body is not valid gzip data");
    free(longer);
    free(g);
    free(d);
}
END_TEST

static Suite *body_codec_suite(void)
{
    Suite *s = suite_create("body_codec");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, encodings_taken_and_refused);
    tcase_add_test(t, gzip_and_deflate_inflate_to_what_was_compressed);
    tcase_add_test(t, limit_is_exact_and_bombs_stop_there);
    tcase_add_test(t, corrupt_truncated_trailing_and_misdeclared_refused);
    tcase_add_test(t, inflating_draws_on_the_memory_budget);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(body_codec_suite)
