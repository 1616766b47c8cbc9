/* test_classify.c — Triton's classification extension (server/classify.c):
 * the classes of each batch entry, best first, as BYTES strings; ties, NaN,
 * INT64 beyond a double's precision, FP16/BF16, unaligned data, and a
 * check of the heap against a full sort. Exact string comparisons: the
 * values are printed from the tensor's own elements with "%f", which any C
 * library prints the same for these values. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "classify.h"
#include "testutil.h"

/* The classes' strings joined by spaces, checked to fill the bytes exactly. */
static void joined(const tp_classes *c, char *out, size_t cap)
{
    size_t at = 0, w = 0;
    out[0] = '\0';
    while (at < c->len) {
        ck_assert_uint_ge(c->len - at, 4);
        const unsigned char *l = (const unsigned char *)c->bytes + at;
        size_t n = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
        ck_assert_uint_le(at + 4 + n, c->len);
        ck_assert_uint_lt(w + n + 2, cap);
        if (w)
            out[w++] = ' ';
        memcpy(out + w, c->bytes + at + 4, n);
        w += n;
        out[w] = '\0';
        at += 4 + n;
    }
}

static const tp_labels *labels; /* check_classes': set by the labels test */

static void check_classes(const tp_host_tensor *t, int batched, int64_t count, int ndim, int64_t s0,
                          int64_t s1, const char *want)
{
    tp_classes c;
    tp_err err;
    ck_assert_int_eq(tp_classify(t, batched, count, labels, &c, &err), TP_OK);
    ck_assert_int_eq(c.ndim, ndim);
    ck_assert_int_eq(c.shape[0], s0);
    if (ndim == 2)
        ck_assert_int_eq(c.shape[1], s1);
    char got[4096];
    joined(&c, got, sizeof got);
    ck_assert_str_eq(got, want);
    tp_classes_free(&c);
}

START_TEST(best_first_per_batch_entry_ties_by_index)
{
    float v[2][4] = {{0.1f, 0.9f, 0.5f, 0.9f}, {-1, -2, -3, -4}};
    tp_host_tensor t = tu_tensor("y", TP_F32, v, 2, (int64_t[]){2, 4});
    check_classes(&t, 1, 3, 2, 2, 3,
                  "0.900000:1 0.900000:3 0.500000:2 -1.000000:0 -2.000000:1 -3.000000:2");
    /* more classes asked for than an entry has: all of them */
    check_classes(&t, 1, 10, 2, 2, 4,
                  "0.900000:1 0.900000:3 0.500000:2 0.100000:0 -1.000000:0 -2.000000:1 -3.000000:2 "
                  "-4.000000:3");
}
END_TEST

START_TEST(unbatched_ranks_the_whole_tensor)
{
    int32_t v[2][3] = {{5, -7, 9}, {9, 0, 2}};
    tp_host_tensor t = tu_tensor("y", TP_I32, v, 2, (int64_t[]){2, 3});
    /* one flat list of 6: index 3 is [1][0] */
    check_classes(&t, 0, 4, 1, 4, 0, "9:2 9:3 5:0 2:5");
}
END_TEST

START_TEST(nan_ranks_below_every_number)
{
    float v[5] = {NAN, 1.0f, NAN, -INFINITY, 0.0f};
    tp_host_tensor t = tu_tensor("y", TP_F32, v, 2, (int64_t[]){1, 5});
    check_classes(&t, 1, 5, 2, 1, 5, "1.000000:1 0.000000:4 -inf:3 nan:0 nan:2");
}
END_TEST

START_TEST(int64_ranks_by_its_own_value)
{
    /* equal as doubles: ranked (and printed) from the integers themselves */
    int64_t b = INT64_C(1) << 62;
    int64_t v[4] = {b + 1, b, b + 2, INT64_MIN};
    tp_host_tensor t = tu_tensor("y", TP_I64, v, 2, (int64_t[]){1, 4});
    check_classes(&t, 1, 4, 2, 1, 4,
                  "4611686018427387906:2 4611686018427387905:0 4611686018427387904:1 "
                  "-9223372036854775808:3");
}
END_TEST

START_TEST(half_precision_ranks_by_value)
{
    uint16_t h[3] = {tp_f32_to_f16(-2.0f), tp_f32_to_f16(1.5f), tp_f32_to_f16(0.25f)};
    tp_host_tensor t = tu_tensor("y", TP_F16, h, 2, (int64_t[]){1, 3});
    check_classes(&t, 1, 2, 2, 1, 2, "1.500000:1 0.250000:2");
    uint16_t bf[3] = {tp_f32_to_bf16(3.0f), tp_f32_to_bf16(-1.0f), tp_f32_to_bf16(3.5f)};
    t = tu_tensor("y", TP_BF16, bf, 2, (int64_t[]){1, 3});
    check_classes(&t, 1, 3, 2, 1, 3, "3.500000:2 3.000000:0 -1.000000:1");
}
END_TEST

START_TEST(unaligned_elements)
{
    /* a binary input's bytes may start anywhere in the body */
    float v[3] = {0.5f, 2.0f, -1.0f};
    char *raw = malloc(1 + 2 * sizeof(int64_t)); /* room for both tensors below */
    memcpy(raw + 1, v, sizeof v);
    tp_host_tensor t = tu_tensor("y", TP_F32, raw + 1, 2, (int64_t[]){1, 3});
    check_classes(&t, 1, 2, 2, 1, 2, "2.000000:1 0.500000:0");
    int64_t w[2] = {-5, 7};
    memcpy(raw + 1, w, sizeof w);
    t = tu_tensor("y", TP_I64, raw + 1, 2, (int64_t[]){1, 2});
    check_classes(&t, 1, 1, 2, 1, 1, "7:1");
    free(raw);
}
END_TEST

static const float *sort_base;

/* the order classify.h promises: larger first, then the lower index */
static int by_rank(const void *a, const void *b)
{
    int i = *(const int *)a, j = *(const int *)b;
    float x = sort_base[i], y = sort_base[j];
    return x > y ? -1 : x < y ? 1 : (i > j) - (i < j);
}

START_TEST(heap_matches_a_full_sort)
{
    enum { N = 1000 };
    float *v = malloc(N * sizeof *v);
    int idx[N];
    unsigned s = 12345;
    for (int i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        v[i] = (float)((s >> 16) % 200) / 8.0f; /* many ties */
        idx[i] = i;
    }
    sort_base = v;
    qsort(idx, N, sizeof *idx, by_rank);
    tp_host_tensor t = tu_tensor("y", TP_F32, v, 2, (int64_t[]){1, N});
    static const int64_t ks[] = {1, 2, 7, 64, 999, 1000};
    for (size_t c = 0; c < sizeof ks / sizeof *ks; c++) {
        tp_classes got;
        tp_err err;
        ck_assert_int_eq(tp_classify(&t, 1, ks[c], NULL, &got, &err), TP_OK);
        size_t at = 0;
        for (int64_t k = 0; k < ks[c]; k++) {
            char want[64];
            int n = snprintf(want, sizeof want, "%f:%d", v[idx[k]], idx[k]);
            ck_assert_int_eq(((unsigned char *)got.bytes)[at], n);
            ck_assert_int_eq(memcmp(got.bytes + at + 4, want, (size_t)n), 0);
            at += 4 + (size_t)n;
        }
        ck_assert_uint_eq(at, got.len);
        tp_classes_free(&got);
    }
    free(v);
}
END_TEST

START_TEST(nothing_to_rank_is_an_error)
{
    float v[1];
    tp_host_tensor t = tu_tensor("y", TP_F32, v, 2, (int64_t[]){1, 0});
    tp_classes c;
    tp_err err;
    ck_assert_int_eq(tp_classify(&t, 1, 3, NULL, &c, &err), TP_INVALID);
    ck_assert_str_eq(err.msg, "output 'y': no elements to classify (shape has a 0)");
    ck_assert_ptr_null(c.bytes);
}
END_TEST

START_TEST(labels_name_the_classes)
{
    char path[64];
    /* a CR before a newline is dropped; the last line needs no newline */
    static const char text[] = "cat\ndog\r\n\nbird";
    tu_write_tmp(path, text, sizeof text - 1);
    tp_labels *l;
    tp_err err;
    ck_assert_int_eq(tp_labels_load(path, &l, &err), TP_OK);
    ck_assert_int_eq(tp_labels_count(l), 4);
    ck_assert_str_eq(tp_labels_path(l), path);
    float v[6] = {0.1f, 0.9f, 0.5f, 0.2f, 0.7f, 0.3f};
    tp_host_tensor t = tu_tensor("y", TP_F32, v, 2, (int64_t[]){1, 6});
    labels = l;
    /* class 2's label is the empty line; classes 4 and 5 are past the file */
    check_classes(&t, 1, 6, 2, 1, 6, "0.900000:1:dog 0.700000:4 0.500000:2: 0.300000:5 0.200000:3:bird 0.100000:0:cat");
    labels = NULL;
    tp_labels_free(l);
    unlink(path);
}
END_TEST

START_TEST(labels_files_refused)
{
    char path[64];
    tp_labels *l = (tp_labels *)&l;
    tp_err err;
    ck_assert_int_eq(tp_labels_load("/nonexistent/labels.txt", &l, &err), TP_IO);
    ck_assert_str_eq(err.msg, "labels file /nonexistent/labels.txt: cannot open: No such file or directory");
    ck_assert_ptr_null(l);
    static const char latin1[] = "ok\ncaf\xe9\n";
    tu_write_tmp(path, latin1, sizeof latin1 - 1);
    ck_assert_int_eq(tp_labels_load(path, &l, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, ":2: not UTF-8 text of at most 65536 bytes"));
    unlink(path);
    static const char nul[] = "a\nb\nc\0d\n";
    tu_write_tmp(path, nul, sizeof nul - 1);
    ck_assert_int_eq(tp_labels_load(path, &l, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, ":3: a NUL byte (not a text file)"));
    unlink(path);
    char *long_line = malloc(65538);
    memset(long_line, 'a', 65537);
    long_line[65537] = '\n';
    tu_write_tmp(path, long_line, 65538);
    free(long_line);
    ck_assert_int_eq(tp_labels_load(path, &l, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, ":1: not UTF-8 text of at most 65536 bytes"));
    ck_assert_ptr_null(l);
    unlink(path);
}
END_TEST

static Suite *classify_suite(void)
{
    Suite *s = suite_create("classify");
    TCase *t = tcase_create("core");
    tcase_add_test(t, best_first_per_batch_entry_ties_by_index);
    tcase_add_test(t, unbatched_ranks_the_whole_tensor);
    tcase_add_test(t, nan_ranks_below_every_number);
    tcase_add_test(t, int64_ranks_by_its_own_value);
    tcase_add_test(t, half_precision_ranks_by_value);
    tcase_add_test(t, unaligned_elements);
    tcase_add_test(t, heap_matches_a_full_sort);
    tcase_add_test(t, nothing_to_rank_is_an_error);
    tcase_add_test(t, labels_name_the_classes);
    tcase_add_test(t, labels_files_refused);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(classify_suite)
