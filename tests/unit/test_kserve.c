/* test_kserve.c — the KServe v2 codec without HTTP: every datatype, flat and
 * nested data, the binary tensor extension both ways, and every error
 * message (what and where). */
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "check_main.h"
#include "testutil.h"
#include "json_cap.h"
#include "json_kind.h"
#include "json_tensor.h"
#include "kserve.h"

/* model "m": x FP32 [-1, 3], n INT64 [-1, 2] -> y FP32 [-1, 3], k INT32 [-1] */
static const tp_io_desc m_in[] = {
    {"x", TP_F32, 2, {-1, 3}},
    {"n", TP_I64, 2, {-1, 2}},
};
static const tp_io_desc m_out[] = {
    {"y", TP_F32, 2, {-1, 3}},
    {"k", TP_I32, 1, {-1}},
};
static const tp_kserve_model M = {"m", "1", m_in, 2, m_out, 2, 0, 0, 0, 1, NULL, NULL, 0};

/* A one-input model of a given datatype: "t" [2, 2] -> "u" [2, 2]. */
static tp_io_desc one_in[1], one_out[1];
static tp_kserve_model one_model(tp_dtype dt)
{
    one_in[0] = (tp_io_desc){"t", dt, 2, {2, 2}};
    one_out[0] = (tp_io_desc){"u", dt, 2, {2, 2}};
    return (tp_kserve_model){"one", "1", one_in, 1, one_out, 1, 0, 0, 0, 1, NULL, NULL, 0};
}

#define N_OK "{\"name\":\"n\",\"shape\":[2,2],\"datatype\":\"INT64\",\"data\":[1,2,3,4]}"

static tp_status parse(const tp_kserve_model *m, const char *json, tp_kserve_request *r, tp_err *e)
{
    return tp_kserve_parse_infer(m, json, strlen(json), -1, NULL, r, e);
}

/* Expects a failure whose message contains want. */
static void expect_error(const tp_kserve_model *m, const char *json, tp_status st, const char *want)
{
    tp_kserve_request r;
    tp_err e = {{0}};
    tp_status got = parse(m, json, &r, &e);
    ck_assert_msg(got == st, "status %s for %s (msg: %s)", tp_status_name(got), json, e.msg);
    ck_assert_msg(strstr(e.msg, want), "message '%s' lacks '%s'", e.msg, want);
    ck_assert_ptr_null(r.inputs);
}

static void expect_bin_error(const tp_kserve_model *m, const char *hdr, const void *tail,
                             size_t tail_len, long long hlen, const char *want)
{
    size_t n = strlen(hdr);
    char *body = malloc(n + tail_len + 1);
    memcpy(body, hdr, n);
    if (tail_len)
        memcpy(body + n, tail, tail_len);
    tp_kserve_request r;
    tp_err e = {{0}};
    tp_status st = tp_kserve_parse_infer(m, body, n + tail_len, hlen < -1 ? (long long)n : hlen, NULL,
                                         &r, &e);
    free(body);
    ck_assert_msg(st == TP_INVALID, "status %s (msg: %s)", tp_status_name(st), e.msg);
    ck_assert_msg(strstr(e.msg, want), "message '%s' lacks '%s'", e.msg, want);
}

/* ---- parsing ------------------------------------------------------------ */

START_TEST(flat_fp32_and_int64)
{
    tp_kserve_request r;
    tp_err e;
    const char *j = "{\"id\":\"r1\",\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3],"
                    "\"datatype\":\"FP32\",\"data\":[1,2.5,-3,4,5,6e-3]}]}";
    ck_assert_int_eq(parse(&M, j, &r, &e), TP_OK);
    ck_assert_str_eq(r.id, "r1");
    ck_assert_int_eq(r.n_inputs, 2);
    /* inputs come back in model order whatever the request order */
    ck_assert_str_eq(r.inputs[0].name, "x");
    ck_assert_int_eq(r.inputs[0].dtype, TP_F32);
    ck_assert_int_eq(r.inputs[0].ndim, 2);
    ck_assert_int_eq(r.inputs[0].shape[0], 2);
    ck_assert_uint_eq(r.inputs[0].nbytes, 24);
    const float *x = r.inputs[0].data;
    ck_assert(x[1] == 2.5f && x[2] == -3.0f && x[5] == 6e-3f);
    const int64_t *n = r.inputs[1].data;
    ck_assert(n[0] == 1 && n[3] == 4);
    /* no "outputs": every model output, as JSON */
    ck_assert_int_eq(r.n_outputs, 2);
    ck_assert_str_eq(r.outputs[0].name, "y");
    ck_assert_int_eq(r.outputs[0].binary, 0);
    tp_kserve_request_free(&r);
}
END_TEST

START_TEST(nested_equals_flat)
{
    tp_kserve_request a, b;
    tp_err e;
    ck_assert_int_eq(parse(&M, "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3],"
                               "\"datatype\":\"FP32\",\"data\":[[1,2,3],[4,5,6]]}]}", &a, &e),
                     TP_OK);
    ck_assert_int_eq(parse(&M, "{\"inputs\":[{\"name\":\"n\",\"shape\":[2,2],\"datatype\":"
                               "\"INT64\",\"data\":[[1,2],[3,4]]},{\"name\":\"x\",\"shape\":[2,3],"
                               "\"datatype\":\"FP32\",\"data\":[1,2,3,4,5,6]}]}", &b, &e),
                     TP_OK);
    ck_assert_mem_eq(a.inputs[0].data, b.inputs[0].data, 24);
    ck_assert_mem_eq(a.inputs[1].data, b.inputs[1].data, 32);
    ck_assert_ptr_null(a.id);
    tp_kserve_request_free(&b);
    /* keys spelled with escapes, pretty-printed: the data-array scan does not
     * follow them, jansson does, and the same values come out */
    ck_assert_int_eq(parse(&M, "{ \"in\\u0070uts\" : [\n " N_OK " ,\n {\"name\":\"x\",\"shape\":"
                               "[2,3],\"datatype\":\"FP32\",\"d\\u0061ta\": [ [1, 2,3] ,\n"
                               "[ 4,5,6 ] ] } ] }", &b, &e),
                     TP_OK);
    ck_assert_mem_eq(a.inputs[0].data, b.inputs[0].data, 24);
    ck_assert_mem_eq(a.inputs[1].data, b.inputs[1].data, 32);
    tp_kserve_request_free(&a);
    tp_kserve_request_free(&b);
}
END_TEST

START_TEST(json_numbers_each_dtype)
{
    const char *fmt = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"%s\","
                      "\"data\":[1,-2,%s,65504]}]}";
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        tp_kserve_model m = one_model((tp_dtype)d);
        char j[256];
        snprintf(j, sizeof j, fmt, tp_dtype_name((tp_dtype)d),
                 tp_dtype_is_float((tp_dtype)d) ? "0.5" : "3");
        tp_kserve_request r;
        tp_err e;
        ck_assert_msg(parse(&m, j, &r, &e) == TP_OK, "%s: %s", j, e.msg);
        ck_assert_uint_eq(r.inputs[0].nbytes, 4 * tp_dtype_size((tp_dtype)d));
        ck_assert(tp_load_f32(r.inputs[0].data, (tp_dtype)d, 1) == -2.0f);
        ck_assert(tp_load_f32(r.inputs[0].data, (tp_dtype)d, 2) ==
                  (tp_dtype_is_float((tp_dtype)d) ? 0.5f : 3.0f));
        /* 65504 is exact in FP16, rounds to 65536 in BF16 */
        float big = tp_load_f32(r.inputs[0].data, (tp_dtype)d, 3);
        ck_assert(d == TP_BF16 ? big == 65536.0f : big == 65504.0f);
        tp_kserve_request_free(&r);
    }
}
END_TEST

START_TEST(int64_full_range)
{
    tp_kserve_model m = one_model(TP_I64);
    tp_kserve_request r;
    tp_err e;
    ck_assert_int_eq(parse(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":"
                               "\"INT64\",\"data\":[9223372036854775807,-9223372036854775808,"
                               "1099511627776,0]}]}", &r, &e),
                     TP_OK);
    const int64_t *v = r.inputs[0].data;
    ck_assert(v[0] == INT64_MAX && v[1] == INT64_MIN && v[2] == (INT64_C(1) << 40));
    tp_kserve_request_free(&r);
}
END_TEST

START_TEST(binary_fp16_and_mixed)
{
    tp_kserve_model m = one_model(TP_F16);
    uint16_t h[4] = {tp_f32_to_f16(1.0f), tp_f32_to_f16(-0.5f), tp_f32_to_f16(2.0f), 0};
    const char *hdr = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP16\","
                      "\"parameters\":{\"binary_data_size\":8}}],\"outputs\":[{\"name\":\"u\","
                      "\"parameters\":{\"binary_data\":true}}]}";
    size_t n = strlen(hdr);
    char body[512];
    memcpy(body, hdr, n);
    memcpy(body + n, h, 8);
    tp_kserve_request r;
    tp_err e;
    ck_assert_int_eq(tp_kserve_parse_infer(&m, body, n + 8, (long long)n, NULL, &r, &e), TP_OK);
    ck_assert_mem_eq(r.inputs[0].data, h, 8);
    ck_assert_int_eq(r.outputs[0].binary, 1);
    tp_kserve_request_free(&r);

    /* one input binary, the other JSON; the tail holds only the binary one */
    int64_t nv[4] = {7, 8, 9, 10};
    const char *hdr2 = "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\","
                       "\"data\":[1,2,3]},{\"name\":\"n\",\"shape\":[2,2],\"datatype\":\"INT64\","
                       "\"parameters\":{\"binary_data_size\":32}}],"
                       "\"parameters\":{\"binary_data_output\":true}}";
    n = strlen(hdr2);
    memcpy(body, hdr2, n);
    memcpy(body + n, nv, 32);
    ck_assert_int_eq(tp_kserve_parse_infer(&M, body, n + 32, (long long)n, NULL, &r, &e), TP_OK);
    ck_assert_mem_eq(r.inputs[1].data, nv, 32);
    ck_assert_int_eq(r.outputs[0].binary, 1);
    ck_assert_int_eq(r.outputs[1].binary, 1);
    tp_kserve_request_free(&r);
}
END_TEST

/* A thread reuses the document it parsed last when the next request's
 * text around the data is the same byte for byte (kserve_doc_cache.c): the data must
 * still be each request's own, and a different or broken text must still
 * be parsed, and judged, afresh. */
static void check_x(const char *j, float x0, float x5)
{
    tp_kserve_request r;
    tp_err e;
    ck_assert_int_eq(parse(&M, j, &r, &e), TP_OK);
    const float *x = r.inputs[0].data;
    ck_assert_msg(x[0] == x0 && x[5] == x5, "%s: x[0] %g x[5] %g", j, x[0], x[5]);
    tp_kserve_request_free(&r);
}

/* body: the caller's, as binary inputs are views into it */
static tp_status parse_binary(const tp_kserve_model *m, char *body, const char *hdr, const float *t,
                              size_t t_len, tp_kserve_request *r, tp_err *e)
{
    size_t n = strlen(hdr);
    memcpy(body, hdr, n);
    memcpy(body + n, t, t_len);
    return tp_kserve_parse_infer(m, body, n + t_len, (long long)n, NULL, r, e);
}

START_TEST(repeated_documents)
{
#define X_WITH(data) "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":" data "}]}"
    check_x(X_WITH("[1,2,3,4,5,6]"), 1, 6);
    check_x(X_WITH("[-0.25,2,3,4,5,1e3]"), -0.25f, 1000); /* same text around, other data */
    check_x(X_WITH("[[7,2,3],[4,5,8]]"), 7, 8);
    expect_error(&M, X_WITH("[1,2,3,4,5]"), TP_INVALID, "x"); /* the kept document, short data */
    expect_error(&M, "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3]}]}", TP_INVALID, "datatype");
    expect_error(&M, "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3]}]}", TP_INVALID, "datatype");
    expect_error(&M, "{\"inputs\":[}", TP_PARSE, "malformed JSON");
    expect_error(&M, "{\"inputs\":[}", TP_PARSE, "malformed JSON");
    check_x(X_WITH("[1,2,3,4,5,6]"), 1, 6);
#undef X_WITH

    tp_kserve_model m = one_model(TP_F32);
    const char *hdr = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                      "\"parameters\":{\"binary_data_size\":16}}],\"parameters\":{\"binary_data_output\":true}}";
    const float a[4] = {1, 2, 3, 4}, b[4] = {-1, 0.5f, 9, 10};
    tp_kserve_request r;
    tp_err e;
    char body[512];
    ck_assert_int_eq(parse_binary(&m, body, hdr, a, 16, &r, &e), TP_OK);
    ck_assert_mem_eq(r.inputs[0].data, a, 16);
    tp_kserve_request_free(&r);
    ck_assert_int_eq(parse_binary(&m, body, hdr, b, 16, &r, &e), TP_OK);
    ck_assert_mem_eq(r.inputs[0].data, b, 16);
    ck_assert_int_eq(r.outputs[0].binary, 1);
    tp_kserve_request_free(&r);
    /* the same header with a short tail: still refused */
    ck_assert_int_eq(parse_binary(&m, body, hdr, b, 12, &r, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "binary"));
    /* a header seen whole is reused without scanning for data arrays; the
     * same text as a plain JSON body (no tail) is judged as such */
    ck_assert_int_eq(parse_binary(&m, body, hdr, a, 16, &r, &e), TP_OK);
    tp_kserve_request_free(&r);
    ck_assert_int_eq(tp_kserve_parse_infer(&m, hdr, strlen(hdr), -1, NULL, &r, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "binary"));
    /* and with bytes after it but no header length: those bytes are named */
    size_t n = strlen(hdr);
    memcpy(body, hdr, n);
    memcpy(body + n, a, 16);
    ck_assert_int_eq(tp_kserve_parse_infer(&m, body, n + 16, -1, NULL, &r, &e), TP_PARSE);
    ck_assert_ptr_nonnull(strstr(e.msg, "after the JSON document"));
    /* a JSON body with data between two binary ones: each gets its own */
    check_x("{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[2,3],\"datatype\":\"FP32\",\"data\":[3,2,3,4,5,9]}]}", 3, 9);
    ck_assert_int_eq(parse_binary(&m, body, hdr, b, 16, &r, &e), TP_OK);
    ck_assert_mem_eq(r.inputs[0].data, b, 16);
    tp_kserve_request_free(&r);
}
END_TEST

/* A thread also keeps the request it made of an all-binary header, and a
 * request with the same header over a binary section of the same length
 * is a copy of it (kserve_doc_cache.c): each copy's inputs must point into its own
 * body, own its id, and be judged against the model it is parsed for, even
 * one built at the same address with another signature. */
START_TEST(repeated_binary_headers)
{
    const char *hdr = "{\"id\":\"r1\",\"inputs\":[{\"name\":\"n\",\"shape\":[1,2],\"datatype\":\"INT64\","
                      "\"parameters\":{\"binary_data_size\":16}},{\"name\":\"x\",\"shape\":[1,3],"
                      "\"datatype\":\"FP32\",\"parameters\":{\"binary_data_size\":12}}],"
                      "\"outputs\":[{\"name\":\"k\",\"parameters\":{\"binary_data\":true}},{\"name\":\"y\"}],"
                      "\"parameters\":{\"timeout\":5000}}";
    size_t n = strlen(hdr);
    char *bodies[3];
    tp_kserve_request r[3];
    tp_err e;
    for (int i = 0; i < 3; i++) {
        const int64_t nv[2] = {10 + i, 20 + i};
        const float xv[3] = {0.5f + (float)i, -1, 2};
        bodies[i] = malloc(n + 28);
        memcpy(bodies[i], hdr, n);
        memcpy(bodies[i] + n, nv, 16);
        memcpy(bodies[i] + n + 16, xv, 12);
        ck_assert_int_eq(tp_kserve_parse_infer(&M, bodies[i], n + 28, (long long)n, NULL, &r[i], &e), TP_OK);
    }
    tp_kserve_request_free(&r[0]); /* copies share nothing with it */
    free(bodies[0]);
    for (int i = 1; i < 3; i++) {
        ck_assert_str_eq(r[i].id, "r1");
        ck_assert_int_eq(r[i].timeout_us, 5000);
        ck_assert_ptr_eq(r[i].inputs[0].data, bodies[i] + n + 16); /* x, model order */
        ck_assert_ptr_eq(r[i].inputs[1].data, bodies[i] + n);      /* n */
        int64_t nv[2];
        float xv[3];
        memcpy(nv, r[i].inputs[1].data, 16);
        memcpy(xv, r[i].inputs[0].data, 12);
        ck_assert(nv[0] == 10 + i && nv[1] == 20 + i && xv[0] == 0.5f + (float)i && xv[2] == 2);
        ck_assert_int_eq(r[i].inputs[0].ndim, 2);
        ck_assert_int_eq(r[i].inputs[0].shape[1], 3);
        ck_assert_int_eq(r[i].n_outputs, 2);
        ck_assert_str_eq(r[i].outputs[0].name, "k");
        ck_assert_int_eq(r[i].outputs[0].binary, 1);
        ck_assert_str_eq(r[i].outputs[1].name, "y");
        ck_assert_int_eq(r[i].outputs[1].binary, 0);
    }
    ck_assert_ptr_ne(r[1].id, r[2].id);
    for (int i = 1; i < 3; i++) {
        tp_kserve_request_free(&r[i]);
        free(bodies[i]);
    }

    /* the same header over a section 4 bytes longer: parsed, and refused */
    char *body = malloc(n + 32);
    memcpy(body, hdr, n);
    memset(body + n, 0, 32);
    ck_assert_int_eq(tp_kserve_parse_infer(&M, body, n + 32, (long long)n, NULL, &r[0], &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "after the last input"));
    free(body);

    /* one model, then another at the same address: each judges the header */
    const char *h1 = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":16}}]}";
    char b1[256];
    const float t4[4] = {1, 2, 3, 4};
    tp_kserve_model m = one_model(TP_F32);
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(parse_binary(&m, b1, h1, t4, 16, &r[0], &e), TP_OK);
        ck_assert_mem_eq(r[0].inputs[0].data, t4, 16);
        tp_kserve_request_free(&r[0]);
    }
    m = one_model(TP_I32);
    ck_assert_int_eq(parse_binary(&m, b1, h1, t4, 16, &r[0], &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "datatype"));
    one_in[0] = (tp_io_desc){"t", TP_F32, 2, {4, 1}};
    m = (tp_kserve_model){"one", "1", one_in, 1, one_out, 1, 0, 0, 0, 1, NULL, NULL, 0};
    ck_assert_int_eq(parse_binary(&m, b1, h1, t4, 16, &r[0], &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "shape"));
    m = one_model(TP_F32);
    ck_assert_int_eq(parse_binary(&m, b1, h1, t4, 16, &r[0], &e), TP_OK);
    tp_kserve_request_free(&r[0]);
}
END_TEST

START_TEST(binary_all_dtypes)
{
    for (int d = 0; d < TP_DTYPE_COUNT; d++) {
        tp_kserve_model m = one_model((tp_dtype)d);
        size_t es = tp_dtype_size((tp_dtype)d);
        char hdr[256], body[512];
        unsigned char raw[32];
        for (size_t i = 0; i < sizeof raw; i++)
            raw[i] = (unsigned char)(i * 7 + (size_t)d);
        int n = snprintf(hdr, sizeof hdr, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],"
                         "\"datatype\":\"%s\",\"parameters\":{\"binary_data_size\":%zu}}]}",
                         tp_dtype_name((tp_dtype)d), 4 * es);
        memcpy(body, hdr, (size_t)n);
        memcpy(body + n, raw, 4 * es);
        tp_kserve_request r;
        tp_err e;
        ck_assert_int_eq(tp_kserve_parse_infer(&m, body, (size_t)n + 4 * es, n, NULL, &r, &e), TP_OK);
        ck_assert_mem_eq(r.inputs[0].data, raw, 4 * es);
        tp_kserve_request_free(&r);
    }
}
END_TEST

START_TEST(outputs_selection)
{
    tp_kserve_request r;
    tp_err e;
    ck_assert_int_eq(parse(&M, "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[1,3],"
                               "\"datatype\":\"FP32\",\"data\":[1,2,3]}],"
                               "\"parameters\":{\"binary_data_output\":true},"
                               "\"outputs\":[{\"name\":\"k\",\"parameters\":{\"binary_data\":false}}]}",
                           &r, &e),
                     TP_OK);
    ck_assert_int_eq(r.n_outputs, 1);
    ck_assert_str_eq(r.outputs[0].name, "k");
    ck_assert_int_eq(r.outputs[0].binary, 0);
    tp_kserve_request_free(&r);
}
END_TEST

/* ---- responses ---------------------------------------------------------- */

static void make_outputs(tp_host_tensor out[2], float *y, int32_t *k)
{
    memset(out, 0, 2 * sizeof *out);
    snprintf(out[0].name, sizeof out[0].name, "k");
    out[0].dtype = TP_I32;
    out[0].ndim = 1;
    out[0].shape[0] = 2;
    out[0].data = k;
    out[0].nbytes = 8;
    snprintf(out[1].name, sizeof out[1].name, "y");
    out[1].dtype = TP_F32;
    out[1].ndim = 2;
    out[1].shape[0] = 2;
    out[1].shape[1] = 3;
    out[1].data = y;
    out[1].nbytes = 24;
}

START_TEST(response_json)
{
    float y[6] = {0.1f, -2, 3.25f, 1e-7f, 5, 6};
    int32_t k[2] = {-7, 2147483647};
    tp_host_tensor outs[2];
    make_outputs(outs, y, k);
    tp_kserve_output_sel sel[2] = {{.name = "y"}, {.name = "k"}};
    tp_kserve_request req = {.id = "abc", .outputs = sel, .n_outputs = 2};
    tp_kserve_buf b;
    tp_err e;
    ck_assert_int_eq(tp_kserve_build_infer(&M, &req, outs, 2, &b, &e), TP_OK);
    ck_assert_uint_eq(b.header_len, 0);
    json_error_t je;
    json_t *doc = json_loadb(b.body, b.len, 0, &je);
    ck_assert_ptr_nonnull(doc);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "id")), "abc");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "model_name")), "m");
    json_t *o = json_object_get(doc, "outputs");
    ck_assert_uint_eq(json_array_size(o), 2);
    json_t *o0 = json_array_get(o, 0);
    ck_assert_str_eq(json_string_value(json_object_get(o0, "name")), "y");
    ck_assert_str_eq(json_string_value(json_object_get(o0, "datatype")), "FP32");
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(o0, "shape"), 1)), 3);
    json_t *d = json_object_get(o0, "data");
    for (int i = 0; i < 6; i++) /* float32 values survive the text round trip exactly */
        ck_assert((float)json_number_value(json_array_get(d, (size_t)i)) == y[i]);
    json_t *d1 = json_object_get(json_array_get(o, 1), "data");
    ck_assert_int_eq(json_integer_value(json_array_get(d1, 1)), 2147483647);
    json_decref(doc);
    free(b.body);
}
END_TEST

START_TEST(response_binary_round_trip)
{
    float y[6] = {1, 2, 3, 4, 5, NAN}; /* NaN is fine as binary */
    int32_t k[2] = {3, 4};
    tp_host_tensor outs[2];
    make_outputs(outs, y, k);
    tp_kserve_output_sel sel[2] = {{.name = "y", .binary = 1}, {.name = "k"}};
    tp_kserve_request req = {.outputs = sel, .n_outputs = 2};
    tp_kserve_buf b;
    tp_err e;
    ck_assert_int_eq(tp_kserve_build_infer(&M, &req, outs, 2, &b, &e), TP_OK);
    ck_assert_uint_gt(b.header_len, 0);
    ck_assert_uint_eq(b.len, b.header_len + 24);
    ck_assert_mem_eq(b.body + b.header_len, y, 24);
    json_error_t je;
    json_t *doc = json_loadb(b.body, b.header_len, 0, &je);
    ck_assert_ptr_nonnull(doc);
    ck_assert_ptr_null(json_object_get(doc, "id"));
    json_t *o0 = json_array_get(json_object_get(doc, "outputs"), 0);
    ck_assert_ptr_null(json_object_get(o0, "data"));
    ck_assert_int_eq(
        json_integer_value(json_object_get(json_object_get(o0, "parameters"), "binary_data_size")),
        24);
    json_decref(doc);

    /* the response body parses back through the request codec's binary path */
    tp_io_desc yin = {"y", TP_F32, 2, {-1, 3}};
    tp_kserve_model ym = {"ym", "1", &yin, 1, &yin, 1, 0, 0, 0, 1, NULL, NULL, 0};
    char hdr[256];
    int n = snprintf(hdr, sizeof hdr, "{\"inputs\":[{\"name\":\"y\",\"shape\":[2,3],\"datatype\":"
                     "\"FP32\",\"parameters\":{\"binary_data_size\":24}}]}");
    char *req_body = malloc((size_t)n + 24);
    memcpy(req_body, hdr, (size_t)n);
    memcpy(req_body + n, b.body + b.header_len, 24);
    tp_kserve_request r2;
    ck_assert_int_eq(tp_kserve_parse_infer(&ym, req_body, (size_t)n + 24, n, NULL, &r2, &e), TP_OK);
    ck_assert_mem_eq(r2.inputs[0].data, y, 24);
    tp_kserve_request_free(&r2);
    free(req_body);

    /* in parts: the same header, and the tail is y itself, not a copy */
    tp_kserve_buf p;
    tp_kserve_piece tail[2];
    int n_tail = -1;
    ck_assert_int_eq(tp_kserve_build_infer_parts(&M, &req, outs, 2, b.len - 1, &p, tail, &n_tail, &e),
                     TP_OK);
    ck_assert_int_eq(n_tail, 1);
    ck_assert_ptr_eq(tail[0].data, (const void *)y);
    ck_assert_uint_eq(tail[0].len, 24);
    ck_assert_uint_eq(p.len, b.header_len);
    ck_assert_uint_eq(p.header_len, b.header_len);
    ck_assert_mem_eq(p.body, b.body, b.header_len);
    free(p.body);

    /* an answer of at most whole_max bytes comes back whole, as build_infer's */
    n_tail = -1;
    ck_assert_int_eq(tp_kserve_build_infer_parts(&M, &req, outs, 2, b.len, &p, tail, &n_tail, &e), TP_OK);
    ck_assert_int_eq(n_tail, 0);
    ck_assert_uint_eq(p.len, b.len);
    ck_assert_uint_eq(p.header_len, b.header_len);
    ck_assert_mem_eq(p.body, b.body, b.len);
    free(p.body);
    free(b.body);
}
END_TEST

/* Triton's classification extension: the top classes of each batch entry
 * as BYTES strings, as JSON and as binary data (classify.h ranks them;
 * test_classify covers the ranking). */
START_TEST(response_classification)
{
    float y[6] = {0.1f, -2, 3.25f, 1e-7f, 5, 6};
    int32_t k[2] = {-7, 2147483647};
    tp_host_tensor outs[2];
    make_outputs(outs, y, k);
    tp_kserve_model batched = M;
    batched.max_batch_size = 8;
    tp_kserve_request r;
    tp_err e;
    ck_assert_int_eq(parse(&batched, "{\"inputs\":[" N_OK ",{\"name\":\"x\",\"shape\":[1,3],\"datatype\":"
                                     "\"FP32\",\"data\":[1,2,3]}],\"outputs\":[{\"name\":\"y\",\"parameters\":"
                                     "{\"classification\":2}},{\"name\":\"k\",\"parameters\":{\"classification\":5}}]}",
                           &r, &e),
                     TP_OK);
    ck_assert_int_eq(r.outputs[0].classes, 2);
    ck_assert_int_eq(r.outputs[1].classes, 5);
    tp_kserve_buf b;
    ck_assert_int_eq(tp_kserve_build_infer(&batched, &r, outs, 2, &b, &e), TP_OK);
    /* k has one element an entry: one class each, whatever was asked */
    ck_assert_str_eq(b.body, "{\"model_name\":\"m\",\"model_version\":\"1\",\"outputs\":["
                             "{\"name\":\"y\",\"datatype\":\"BYTES\",\"shape\":[2,2],\"data\":"
                             "[\"3.250000:2\",\"0.100000:0\",\"6.000000:2\",\"5.000000:1\"]},"
                             "{\"name\":\"k\",\"datatype\":\"BYTES\",\"shape\":[2,1],\"data\":"
                             "[\"-7:0\",\"2147483647:0\"]}]}");
    free(b.body);

    /* binary: the classes' BYTES elements, then k's raw bytes; never listed
     * as pieces (the classes live only as long as the call) */
    r.outputs[0].binary = 1;
    r.outputs[1].binary = 1;
    r.outputs[1].classes = 0;
    static const char classes[] = "\012\0\0\0" "3.250000:2" "\012\0\0\0" "0.100000:0"
                                  "\012\0\0\0" "6.000000:2" "\012\0\0\0" "5.000000:1";
    tp_kserve_piece tail[2];
    int n_tail = -1;
    ck_assert_int_eq(tp_kserve_build_infer_parts(&batched, &r, outs, 2, 0, &b, tail, &n_tail, &e), TP_OK);
    ck_assert_int_eq(n_tail, 0);
    ck_assert_uint_eq(b.len, b.header_len + sizeof classes - 1 + sizeof k);
    ck_assert_mem_eq(b.body + b.header_len, classes, sizeof classes - 1);
    ck_assert_mem_eq(b.body + b.header_len + sizeof classes - 1, k, sizeof k);
    json_t *doc = json_loadb(b.body, b.header_len, 0, NULL);
    json_t *o0 = json_array_get(json_object_get(doc, "outputs"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(o0, "datatype")), "BYTES");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(o0, "parameters"), "binary_data_size")),
                     (json_int_t)sizeof classes - 1);
    json_decref(doc);
    tp_jbuf_free_text(b.body, b.pooled);

    /* a graph that cannot batch ranks each output whole: shape [count] */
    r.outputs[0].binary = 0;
    r.n_outputs = 1;
    ck_assert_int_eq(tp_kserve_build_infer(&M, &r, outs, 2, &b, &e), TP_OK);
    ck_assert_ptr_nonnull(strstr(b.body, "\"shape\":[2],\"data\":[\"6.000000:5\",\"5.000000:4\"]"));
    free(b.body);
    r.n_outputs = 2;

    /* labels (Triton's label_filename): escaped in JSON, raw in BYTES, and
     * named in the model configuration */
    char path[64];
    static const char text[] = "zero\n\"one\" \\ 1\ncaf\xc3\xa9\n";
    tu_write_tmp(path, text, sizeof text - 1);
    tp_labels *yl;
    ck_assert_int_eq(tp_labels_load(path, &yl, &e), TP_OK);
    const tp_labels *per_output[2] = {yl, NULL};
    batched.labels = per_output;
    r.outputs[0].classes = 3;
    r.outputs[1].classes = 0;
    r.outputs[1].binary = 0;
    ck_assert_int_eq(tp_kserve_build_infer(&batched, &r, outs, 2, &b, &e), TP_OK);
    ck_assert_ptr_nonnull(strstr(b.body, "\"data\":[\"3.250000:2:caf\xc3\xa9\",\"0.100000:0:zero\",\"-2.000000:1:\\\"one\\\" \\\\ 1\","));
    doc = json_loadb(b.body, b.len, 0, NULL); /* and it is JSON */
    ck_assert_ptr_nonnull(doc);
    ck_assert_str_eq(json_string_value(json_array_get(json_object_get(json_array_get(json_object_get(doc, "outputs"), 0), "data"), 2)),
                     "-2.000000:1:\"one\" \\ 1");
    json_decref(doc);
    free(b.body);
    r.outputs[0].binary = 1;
    ck_assert_int_eq(tp_kserve_build_infer(&batched, &r, outs, 2, &b, &e), TP_OK);
    static const char raw[] = "\025\0\0\0" "-2.000000:1:\"one\" \\ 1";
    ck_assert_ptr_nonnull(memmem(b.body + b.header_len, b.len - b.header_len, raw, sizeof raw - 1));
    free(b.body);
    char *cfg = tp_kserve_model_config(&batched);
    doc = json_loads(cfg, 0, NULL);
    free(cfg);
    json_t *outs_cfg = json_object_get(doc, "output");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(outs_cfg, 0), "label_filename")), path);
    ck_assert_ptr_null(json_object_get(json_array_get(outs_cfg, 1), "label_filename"));
    json_decref(doc);
    tp_labels_free(yl);
    unlink(path);
    tp_kserve_request_free(&r);
}
END_TEST

START_TEST(response_half_types_as_json)
{
    uint16_t h[4] = {tp_f32_to_f16(1.5f), tp_f32_to_f16(-2), 0, tp_f32_to_f16(0.25f)};
    tp_host_tensor t = {.name = "u", .dtype = TP_F16, .ndim = 2, .shape = {2, 2},
                        .data = h, .nbytes = 8};
    tp_kserve_model m = one_model(TP_F16);
    tp_kserve_output_sel sel = {.name = "u"};
    tp_kserve_request req = {.outputs = &sel, .n_outputs = 1};
    tp_kserve_buf b;
    tp_err e;
    ck_assert_int_eq(tp_kserve_build_infer(&m, &req, &t, 1, &b, &e), TP_OK);
    ck_assert_ptr_nonnull(strstr(b.body, "\"data\":[1.5,-2.0,0.0,0.25]"));
    ck_assert_ptr_nonnull(strstr(b.body, "\"datatype\":\"FP16\""));
    free(b.body);
}
END_TEST

START_TEST(response_errors)
{
    float y[6] = {1, 2, INFINITY, 4, 5, 6};
    int32_t k[2] = {0, 0};
    tp_host_tensor outs[2];
    make_outputs(outs, y, k);
    tp_kserve_output_sel sel[1] = {{.name = "y"}};
    tp_kserve_request req = {.outputs = sel, .n_outputs = 1};
    tp_kserve_buf b;
    tp_err e;
    ck_assert_int_eq(tp_kserve_build_infer(&M, &req, outs, 2, &b, &e), TP_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "output 'y': element 2 is Inf"));
    ck_assert_ptr_nonnull(strstr(e.msg, "binary_data"));
    ck_assert_int_eq(tp_kserve_build_infer(&M, &req, outs, 1, &b, &e), TP_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "engine returned no output 'y'"));
    outs[1].nbytes = 20;
    ck_assert_int_eq(tp_kserve_build_infer(&M, &req, outs, 2, &b, &e), TP_INTERNAL);
    ck_assert_ptr_nonnull(strstr(e.msg, "engine returned 20 bytes for 24 expected"));
}
END_TEST

/* ---- request errors ----------------------------------------------------- */

#define X_IN(shape, dt, data) \
    "{\"name\":\"x\",\"shape\":" shape ",\"datatype\":\"" dt "\",\"data\":" data "}"
#define REQ(...) "{\"inputs\":[" N_OK "," __VA_ARGS__ "]}"

START_TEST(errors_document)
{
    expect_error(&M, "{\"inputs\":[", TP_PARSE, "malformed JSON in request body at line 1");
    expect_error(&M, "", TP_PARSE, "malformed JSON");
    expect_error(&M, "[1,2]", TP_PARSE, "request body must be a JSON object, got an array");
    expect_error(&M, "{\"inputs\":[],\"inputs\":[]}", TP_PARSE, "duplicate");
    expect_error(&M, "{\"inputs\":[]} \n\x01\x02\x03", TP_PARSE,
                 "request body has 3 bytes after the JSON document (at byte 13); a binary tensor "
                 "tail needs the Inference-Header-Content-Length header");
    expect_error(&M, "{}", TP_INVALID, "request has no 'inputs' (model 'm' expects 'x', 'n')");
    /* found by fuzz_kserve_json: the parser quotes the bad escape with its
     * newline; the message stays one line (no forged log lines) */
    expect_error(&M, "{\"inputs\":[{\"dat-\\\n\x01\"", TP_PARSE, "invalid escape near '\"dat-\\?'");
    expect_error(&M, "{\"inputs\":{}}", TP_INVALID, "'inputs' must be an array, got an object");
    /* fuzz_kserve_json found it: a backslash as the last byte of a string
     * in "data" made the data scan end one byte past the body, and the
     * blanked copy read it (ASan). The body is copied to its exact size so
     * no terminating NUL hides the overread. */
    static const char bs_at_end[] = "{\"inputs\":[{\"name\":\"x\",\"data\":[\"\\";
    char *exact = malloc(sizeof bs_at_end - 1);
    memcpy(exact, bs_at_end, sizeof bs_at_end - 1);
    tp_kserve_request r;
    tp_err e = {{0}};
    ck_assert_int_eq(tp_kserve_parse_infer(&M, exact, sizeof bs_at_end - 1, -1, NULL, &r, &e), TP_PARSE);
    free(exact);
    expect_error(&M, "{\"id\":5,\"inputs\":[]}", TP_INVALID, "'id' must be a string, got an integer");
    expect_error(&M, "{\"parameters\":[],\"inputs\":[]}", TP_INVALID, "'parameters' must be an object");
    expect_error(&M, "{\"parameters\":{\"binary_data_output\":1},\"inputs\":[]}", TP_INVALID,
                 "request: parameters.binary_data_output must be a boolean, got an integer");
}
END_TEST

START_TEST(errors_inputs)
{
    expect_error(&M, "{\"inputs\":[3]}", TP_INVALID, "inputs[0] must be an object, got an integer");
    expect_error(&M, "{\"inputs\":[{\"shape\":[1]}]}", TP_INVALID,
                 "inputs[0]: 'name' must be a string, got nothing");
    expect_error(&M, REQ("{\"name\":\"q\",\"shape\":[1],\"datatype\":\"FP32\",\"data\":[1]}"),
                 TP_INVALID, "unknown input 'q' (model 'm' inputs: 'x', 'n')");
    expect_error(&M, "{\"inputs\":[" N_OK "]}", TP_INVALID,
                 "missing input 'x' (model 'm' inputs: 'x', 'n')");
    expect_error(&M, "{\"inputs\":[" N_OK "," N_OK "]}", TP_INVALID,
                 "input 'n' appears more than once");
    expect_error(&M, REQ("{\"name\":\"x\",\"shape\":[1,3],\"data\":[1,2,3]}"), TP_INVALID,
                 "input 'x': missing 'datatype'");
    expect_error(&M, REQ("{\"name\":\"x\",\"datatype\":\"FP32\",\"data\":[1,2,3]}"), TP_INVALID,
                 "input 'x': missing 'shape'");
    expect_error(&M, REQ("{\"name\":\"x\",\"shape\":[1,3],\"datatype\":\"FP32\"}"), TP_INVALID,
                 "input 'x' has no 'data', no parameters.binary_data_size and no "
                 "parameters.shared_memory_region");
}
END_TEST

START_TEST(errors_datatype_and_shape)
{
    expect_error(&M, REQ(X_IN("[1,3]", "BOOL", "[true,false,true]")), TP_INVALID,
                 "input 'x': unsupported datatype 'BOOL' (supported: FP32, FP16, BF16, INT32, INT64)");
    expect_error(&M, REQ(X_IN("[1,3]", "UINT8", "[1,2,3]")), TP_INVALID,
                 "unsupported datatype 'UINT8'");
    expect_error(&M, REQ(X_IN("[1,3]", "FLOAT", "[1,2,3]")), TP_INVALID,
                 "input 'x': unknown datatype 'FLOAT'");
    expect_error(&M, REQ("{\"name\":\"x\",\"shape\":[1,3],\"datatype\":7,\"data\":[1]}"),
                 TP_INVALID, "input 'x': 'datatype' must be a string, got an integer");
    expect_error(&M, REQ(X_IN("[1,3]", "INT32", "[1,2,3]")), TP_INVALID,
                 "input 'x': datatype INT32 does not match model datatype FP32");
    expect_error(&M, REQ(X_IN("[2,4]", "FP32", "[1,2,3,4,5,6,7,8]")), TP_INVALID,
                 "input 'x': shape [2, 4] does not match model shape [-1, 3]");
    expect_error(&M, REQ(X_IN("[6]", "FP32", "[1,2,3,4,5,6]")), TP_INVALID,
                 "input 'x': shape [6] does not match model shape [-1, 3]");
    expect_error(&M, REQ(X_IN("[0,3]", "FP32", "[]")), TP_INVALID,
                 "input 'x': shape [0, 3] has no elements");
    expect_error(&M, REQ(X_IN("[-1,3]", "FP32", "[1,2,3]")), TP_INVALID,
                 "input 'x': shape[0] must be a non-negative integer, got a negative integer");
    expect_error(&M, REQ(X_IN("[1.5,3]", "FP32", "[1,2,3]")), TP_INVALID,
                 "input 'x': shape[0] must be a non-negative integer, got a real number");
    expect_error(&M, REQ(X_IN("[1,1,1,1,1,1,1,1,1]", "FP32", "[1]")), TP_INVALID,
                 "input 'x': shape has 9 dims, at most 8 supported");
    expect_error(&M, REQ(X_IN("[4611686018427387904,3]", "FP32", "[1]")), TP_INVALID,
                 "input 'x': shape [4611686018427387904, 3] is too large");
}
END_TEST

START_TEST(errors_data)
{
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[1,2,3,4,5]")), TP_INVALID,
                 "input 'x': data has 5 elements, shape [2, 3] needs 6");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "{}")), TP_INVALID,
                 "input 'x': 'data' must be an array, got an object");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[[1,2,3],[4,5]]")), TP_INVALID,
                 "input 'x': data[1] has 2 elements, shape [2, 3] needs 3 at dim 1");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[[1,2,3],[4,5,6],[7,8,9]]")), TP_INVALID,
                 "input 'x': data has 3 elements, shape [2, 3] needs 2 at dim 0");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[[1,2,3],7]")), TP_INVALID,
                 "input 'x': data[1] is an integer, expected an array of 3 (shape [2, 3])");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[[1,2,3],[4,5,[6]]]")), TP_INVALID,
                 "input 'x': data[1][2] is an array, but shape [2, 3] has only 2 dims");
    expect_error(&M, REQ(X_IN("[2,3]", "FP32", "[1,2,[3],4,5,6]")), TP_INVALID,
                 "input 'x': data[2] is an array; data must be flat or nested exactly like shape [2, 3]");
    expect_error(&M, REQ(X_IN("[1,3]", "FP32", "[1,\"2\",3]")), TP_INVALID,
                 "input 'x': data element 1 is a string, expected a number for FP32");
    expect_error(&M, REQ(X_IN("[1,3]", "FP32", "[1,null,3]")), TP_INVALID,
                 "input 'x': data element 1 is null, expected a number for FP32");
    expect_error(&M, REQ(X_IN("[1,3]", "FP32", "[1,2,1e39]")), TP_INVALID,
                 "input 'x': data element 2 (1e+39) is out of FP32 range");
    expect_error(&M, "{\"inputs\":[" X_IN("[1,3]", "FP32", "[1,2,3]") ",{\"name\":\"n\","
                 "\"shape\":[1,2],\"datatype\":\"INT64\",\"data\":[1,2.5]}]}", TP_INVALID,
                 "input 'n': data element 1 is a real number, expected an integer for INT64");
    tp_kserve_model m16 = one_model(TP_F16);
    expect_error(&m16, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP16\","
                 "\"data\":[1,2,3,70000]}]}", TP_INVALID,
                 "input 't': data element 3 (70000) is out of FP16 range");
    tp_kserve_model m32 = one_model(TP_I32);
    expect_error(&m32, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"INT32\","
                 "\"data\":[1,2,3,2147483648]}]}", TP_INVALID,
                 "input 't': data element 3 (2147483648) is out of INT32 range");
    expect_error(&m32, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"INT32\","
                 "\"data\":[1,true,3,4]}]}", TP_INVALID,
                 "input 't': data element 1 is a boolean, expected an integer for INT32");
}
END_TEST

START_TEST(errors_binary)
{
    const char *hdr = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                      "\"parameters\":{\"binary_data_size\":16}}]}";
    const char *hdr_bad = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                          "\"parameters\":{\"binary_data_size\":10}}]}";
    float v[6] = {0};
    tp_kserve_model m = one_model(TP_F32);
    expect_bin_error(&m, hdr_bad, v, 10, -2,
                     "input 't': binary_data_size 10 does not match shape [2, 2] of FP32 (16 bytes)");
    expect_bin_error(&m, hdr, v, 12, -2,
                     "input 't': binary data needs 16 bytes at offset 0 of the binary section, "
                     "but only 12 remain");
    expect_bin_error(&m, hdr, v, 24, -2, "binary section has 8 bytes after the last input's data");
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                     "\"parameters\":{\"binary_data_size\":-16}}]}", v, 16, -2,
                     "input 't': parameters.binary_data_size must be a non-negative integer, "
                     "got a negative integer");
    expect_bin_error(&m, hdr, v, 0, -1, "input 't' has parameters.binary_data_size but the "
                                         "request has no Inference-Header-Content-Length header");
    expect_bin_error(&m, hdr, v, 16, 100000, "Inference-Header-Content-Length 100000 exceeds the "
                                             "body length");
    /* the header length set to the whole body's: the tail is not JSON, and
     * the message says so instead of asking for the header it has */
    expect_bin_error(&m, hdr, v, 16, (long long)strlen(hdr) + 16,
                     "runs 16 bytes past the JSON header, which ends at byte");
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                         "\"data\":[1,2,3,4],\"parameters\":{\"binary_data_size\":16}}]}",
                     v, 16, -2, "input 't' has more than one of 'data', "
                                "parameters.binary_data_size and parameters.shared_memory_region");
    /* system shared memory named while the extension is off (allow_client_shm 0) */
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                         "\"parameters\":{\"shared_memory_region\":\"r\","
                         "\"shared_memory_byte_size\":16}}]}",
                     v, 0, -1, "input 't': system shared memory is disabled on this server");
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                         "\"parameters\":{\"shared_memory_region\":\"r\"}}]}",
                     v, 0, -1, "needs parameters.shared_memory_byte_size");
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                         "\"parameters\":{\"binary_data_size\":\"16\"}}]}",
                     v, 16, -2, "input 't': parameters.binary_data_size must be a non-negative "
                                "integer, got a string");
    expect_bin_error(&m, "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                         "\"parameters\":7}]}",
                     v, 0, -2, "input 't': 'parameters' must be an object, got an integer");
}
END_TEST

/* ---- system shared memory ---------------------------------------------- */

static void set_object_size(const char *key, off_t size)
{
    int fd = shm_open(key, O_RDWR | O_CREAT, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(ftruncate(fd, size), 0);
    close(fd);
}

/* A client shrinks its object under a registered region while requests use
 * it: the input is refused and so is the output, each message naming the
 * region, the span and the object's size now; the region stays registered,
 * and once the object is whole again the same request round-trips. */
START_TEST(shm_shrunk_under_requests)
{
    char key[64];
    snprintf(key, sizeof key, "/tp_test_kserve_%d", (int)getpid());
    set_object_size(key, 64);
    tp_shm_registry *g = tp_shm_registry_create(4);
    tp_err e = {{0}};
    ck_assert_int_eq(tp_shm_register(g, "io", key, 0, 64, &e), TP_OK);
    tp_kserve_model m = one_model(TP_F32);
    m.shm = g;
    const char *j = "{\"inputs\":[{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\","
                    "\"parameters\":{\"shared_memory_region\":\"io\",\"shared_memory_offset\":8,"
                    "\"shared_memory_byte_size\":16}}],\"outputs\":[{\"name\":\"u\","
                    "\"parameters\":{\"shared_memory_region\":\"io\",\"shared_memory_offset\":32,"
                    "\"shared_memory_byte_size\":16}}]}";
    tp_kserve_request r;
    set_object_size(key, 20);
    ck_assert_int_eq(parse(&m, j, &r, &e), TP_INVALID);
    ck_assert_msg(strstr(e.msg, "input 't': shared memory region 'io': cannot read 16 bytes at "
                                "offset 8: key") && strstr(e.msg, "holds 20 bytes now"), "%s", e.msg);
    set_object_size(key, 64);
    ck_assert_int_eq(parse(&m, j, &r, &e), TP_OK);
    float u[4] = {1, 2, 3, 4};
    tp_host_tensor out = {.name = "u", .dtype = TP_F32, .ndim = 2, .shape = {2, 2}, .data = u,
                          .nbytes = sizeof u};
    tp_kserve_buf b;
    set_object_size(key, 40); /* the output's span [32, 48) now ends past the object */
    ck_assert_int_eq(tp_kserve_build_infer(&m, &r, &out, 1, &b, &e), TP_INVALID);
    ck_assert_msg(strstr(e.msg, "output 'u': shared memory region 'io': cannot write 16 bytes at "
                                "offset 32") && strstr(e.msg, "holds 40 bytes now"), "%s", e.msg);
    set_object_size(key, 64);
    ck_assert_int_eq(tp_kserve_build_infer(&m, &r, &out, 1, &b, &e), TP_OK);
    free(b.body);
    tp_kserve_request_free(&r);
    tp_status st;
    char *doc = tp_shm_status_json(g, "io", &st, &e); /* still registered */
    ck_assert_ptr_nonnull(doc);
    free(doc);
    tp_shm_region *reg = tp_shm_acquire(g, "io", &e);
    float back[4];
    ck_assert_int_eq(tp_shm_read(reg, 32, back, sizeof back, &e), TP_OK);
    ck_assert_mem_eq(back, u, sizeof u); /* memcpy'd bytes: bit-equal by construction */
    tp_shm_release(reg);
    tp_shm_registry_free(g);
    shm_unlink(key);
}
END_TEST

START_TEST(errors_outputs)
{
    const char *in = "{\"inputs\":[" N_OK "," X_IN("[1,3]", "FP32", "[1,2,3]") "],";
    char j[1024];
    snprintf(j, sizeof j, "%s\"outputs\":[{\"name\":\"zz\"}]}", in);
    expect_error(&M, j, TP_INVALID, "unknown output 'zz' (model 'm' outputs: 'y', 'k')");
    snprintf(j, sizeof j, "%s\"outputs\":[{\"name\":\"y\"},{\"name\":\"y\"}]}", in);
    expect_error(&M, j, TP_INVALID, "output 'y' is requested more than once");
    snprintf(j, sizeof j, "%s\"outputs\":[{\"name\":\"y\",\"parameters\":{\"binary_data\":\"yes\"}}]}", in);
    expect_error(&M, j, TP_INVALID, "output 'y': parameters.binary_data must be a boolean, got a string");
    static const struct {
        const char *param, *why;
    } bad_classes[] = {
        {"0", "must be at least 1 (how many classes to answer), got 0"},
        {"-2", "must be at least 1 (how many classes to answer), got -2"},
        {"\"3\"", "must be an integer (how many classes to answer), got a string"},
        {"1.5", "must be an integer (how many classes to answer), got a real number"},
        {"3,\"shared_memory_region\":\"io\",\"shared_memory_byte_size\":64",
         "and shared_memory_region cannot be combined (the classes are answered in the body)"},
    };
    for (size_t i = 0; i < sizeof bad_classes / sizeof *bad_classes; i++) {
        snprintf(j, sizeof j, "%s\"outputs\":[{\"name\":\"y\",\"parameters\":{\"classification\":%s}}]}", in,
                 bad_classes[i].param);
        char want[200];
        snprintf(want, sizeof want, "output 'y': parameters.classification %s", bad_classes[i].why);
        expect_error(&M, j, TP_INVALID, want);
    }
    snprintf(j, sizeof j, "%s\"outputs\":[\"y\"]}", in);
    expect_error(&M, j, TP_INVALID, "outputs[0] must be an object, got a string");
    snprintf(j, sizeof j, "%s\"outputs\":{}}", in);
    expect_error(&M, j, TP_INVALID, "'outputs' must be an array, got an object");
}
END_TEST

/* ---- metadata and small documents -------------------------------------- */

START_TEST(metadata_docs)
{
    char *s = tp_kserve_model_metadata(&M);
    ck_assert_str_eq(s, "{\"name\":\"m\",\"versions\":[\"1\"],\"platform\":\"tpserve\","
                        "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[-1,3]},"
                        "{\"name\":\"n\",\"datatype\":\"INT64\",\"shape\":[-1,2]}],"
                        "\"outputs\":[{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[-1,3]},"
                        "{\"name\":\"k\",\"datatype\":\"INT32\",\"shape\":[-1]}]}");
    free(s);
    s = tp_kserve_server_metadata("1.2.3");
    ck_assert_str_eq(s, "{\"name\":\"tpserve\",\"version\":\"1.2.3\","
                        "\"extensions\":[\"binary_tensor_data\",\"classification\",\"model_configuration\","
                        "\"statistics\",\"system_shared_memory\",\"model_repository\",\"logging\",\"trace\"]}");
    free(s);
    /* Triton's model configuration: dims without the batch dim when batching */
    tp_kserve_model batched = M;
    batched.max_batch_size = 8;
    batched.max_queue_delay_us = 100;
    batched.max_queue_size = 64;
    json_t *cfg = json_loads(s = tp_kserve_model_config(&batched), 0, NULL);
    free(s);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "max_batch_size")), 8);
    json_t *in0 = json_array_get(json_object_get(cfg, "input"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(in0, "data_type")), "TYPE_FP32");
    ck_assert_int_eq(json_array_size(json_object_get(in0, "dims")), 1);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(in0, "dims"), 0)), 3);
    json_t *db = json_object_get(cfg, "dynamic_batching");
    ck_assert_int_eq(json_integer_value(json_object_get(db, "max_queue_delay_microseconds")), 100);
    json_decref(cfg);
    cfg = json_loads(s = tp_kserve_model_config(&M), 0, NULL); /* M: no batching */
    free(s);
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "max_batch_size")), 0);
    ck_assert_ptr_null(json_object_get(cfg, "dynamic_batching"));
    in0 = json_array_get(json_object_get(cfg, "output"), 1);
    ck_assert_int_eq(json_integer_value(json_array_get(json_object_get(in0, "dims"), 0)), -1);
    json_decref(cfg);
    s = tp_kserve_bool_json("ready", 0);
    ck_assert_str_eq(s, "{\"ready\":false}");
    free(s);
    s = tp_kserve_error_json("bad \"x\"\n");
    ck_assert_str_eq(s, "{\"error\":\"bad \\\"x\\\"\\n\"}");
    free(s);
    s = tp_kserve_error_json("path '/\xff\xfe'"); /* invalid UTF-8 from a client URL */
    ck_assert_str_eq(s, "{\"error\":\"path '/?" "?'\"}");
    free(s);
}
END_TEST

/* Triton's model repository index: its body and its document. */
START_TEST(repository_index)
{
    int ready = -1;
    tp_err e;
    ck_assert_int_eq(tp_kserve_parse_repository_index("", 0, &ready, &e), TP_OK);
    ck_assert_int_eq(ready, 0);
    ck_assert_int_eq(tp_kserve_parse_repository_index("{\"ready\":true}", 14, &ready, &e), TP_OK);
    ck_assert_int_eq(ready, 1);
    ck_assert_int_eq(tp_kserve_parse_repository_index("{}", 2, &ready, &e), TP_OK);
    ck_assert_int_eq(ready, 0);
    static const struct {
        const char *body, *says;
    } bad[] = {
        {"{\"ready\":1}", "'ready' must be true or false, got an integer"},
        {"[]", "must be a JSON object, got an array"},
        {"{\"ready\":", "malformed JSON in repository index request at line 1"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ck_assert_int_ne(tp_kserve_parse_repository_index(bad[i].body, strlen(bad[i].body), &ready, &e), TP_OK);
        ck_assert_msg(strstr(e.msg, bad[i].says), "%s: %s", bad[i].body, e.msg);
    }
    char *s = tp_kserve_repository_index("m", "1", "READY", "");
    ck_assert_str_eq(s, "[{\"name\":\"m\",\"version\":\"1\",\"state\":\"READY\"}]");
    free(s);
    s = tp_kserve_repository_index("m", "1", "UNAVAILABLE", "rank 1 died");
    ck_assert_str_eq(s, "[{\"name\":\"m\",\"version\":\"1\",\"state\":\"UNAVAILABLE\",\"reason\":\"rank 1 died\"}]");
    free(s);
    s = tp_kserve_repository_index(NULL, NULL, NULL, NULL);
    ck_assert_str_eq(s, "[]");
    free(s);
}
END_TEST

/* ---- decoding without amplification (issue 50) ---------------------------- */

/* text made of prefix, n copies of unit joined by ',', and suffix */
static char *repeated(const char *prefix, const char *unit, size_t n, const char *suffix)
{
    size_t u = strlen(unit), p = strlen(prefix), q = strlen(suffix);
    char *s = malloc(p + n * (u + 1) + q + 1), *w = s;
    memcpy(w, prefix, p);
    w += p;
    for (size_t k = 0; k < n; k++) {
        if (k)
            *w++ = ',';
        memcpy(w, unit, u);
        w += u;
    }
    memcpy(w, suffix, q + 1);
    return s;
}

/* expect_error for bodies too long to print */
static void expect_long_error(const tp_kserve_model *m, const char *body, tp_status st, const char *want)
{
    tp_kserve_request r;
    tp_err e = {{0}};
    tp_status got = parse(m, body, &r, &e);
    ck_assert_msg(got == st, "status %s for a %zu-byte body (msg: %s)", tp_status_name(got), strlen(body), e.msg);
    ck_assert_msg(strstr(e.msg, want), "message '%s' lacks '%s'", e.msg, want);
}

#define T_OK "{\"name\":\"t\",\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}"

/* A member no route reads is skipped, not built: 200k empty objects in it
 * (~50 MB of jansson nodes if built) decode under an allowance of 16
 * values, and the request is served. Wherever the member is: top level,
 * in an input, in an output. */
START_TEST(unknown_members_are_not_built)
{
    tp_json_cap_set_values(16);
    tp_kserve_model m = one_model(TP_F32);
    m.max_json_values = 64;
    static const char *const at[][2] = {
        {"{\"junk\":[", "],\"inputs\":[" T_OK "]}"},
        {"{\"inputs\":[{\"name\":\"t\",\"junk\":[", "],\"shape\":[2,2],\"datatype\":\"FP32\",\"data\":[1,2,3,4]}]}"},
        {"{\"inputs\":[" T_OK "],\"outputs\":[{\"name\":\"u\",\"junk\":{\"a\":[", "]}}]}"},
    };
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        char *body = repeated(at[k][0], "{}", 200000, at[k][1]);
        tp_kserve_request r;
        tp_err e = {{0}};
        tp_status st = parse(&m, body, &r, &e);
        ck_assert_msg(st == TP_OK, "body %zu: %s", k, e.msg);
        ck_assert_int_eq(r.inputs[0].nbytes, 16);
        tp_kserve_request_free(&r);
        free(body);
    }
    /* a skipped string and a skipped number */
    tp_kserve_request r;
    tp_err e = {{0}};
    ck_assert_int_eq(parse(&m, "{\"junk\":\"x\\\"y\",\"n\":-1.5e3,\"inputs\":[" T_OK "]}", &r, &e), TP_OK);
    tp_kserve_request_free(&r);
    tp_json_cap_set_values(0);
}
END_TEST

/* What jansson would build is counted first: past max_json_values the
 * request is refused before any node exists, naming the limit. */
START_TEST(too_many_values_refused_before_building)
{
    tp_kserve_model m = one_model(TP_F32);
    m.max_json_values = 1000;
    char *body = repeated("{\"parameters\":{\"p\":[", "1", 2000, "]},\"inputs\":[" T_OK "]}");
    expect_long_error(&m, body, TP_INVALID, "more than 1000 JSON values outside its tensors' data (max_json_values)");
    free(body);
    body = repeated("{\"inputs\":[" T_OK "],\"outputs\":[", "{\"name\":\"u\"}", 600, "]}");
    expect_long_error(&m, body, TP_INVALID, "max_json_values");
    free(body);
    /* under the limit it is served */
    body = repeated("{\"parameters\":{\"p\":[", "1", 500, "]},\"inputs\":[" T_OK "]}");
    tp_kserve_request r;
    tp_err e = {{0}};
    ck_assert_msg(parse(&m, body, &r, &e) == TP_OK, "%s", e.msg);
    tp_kserve_request_free(&r);
    free(body);
}
END_TEST

/* A skipped member is still JSON: a fault in it is reported as jansson
 * reports one anywhere else, at its place in the body. */
START_TEST(skipped_members_are_checked)
{
    tp_kserve_model m = one_model(TP_F32);
    static const char *const bad[] = {
        "{\"junk\":[1 2],\"inputs\":[" T_OK "]}",
        "{\"junk\":{\"a\" 1},\"inputs\":[" T_OK "]}",
        "{\"junk\":{\"a\":1,},\"inputs\":[" T_OK "]}",
        "{\"junk\":[01],\"inputs\":[" T_OK "]}",
        "{\"junk\":[tru],\"inputs\":[" T_OK "]}",
        "{\"junk\":\"a\\qb\",\"inputs\":[" T_OK "]}",
        "{\"junk\":[1.],\"inputs\":[" T_OK "]}",
        "{\"junk\":[}],\"inputs\":[" T_OK "]}",
        "{\"junk\":[\"\x01\"],\"inputs\":[" T_OK "]}",
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        json_error_t je;
        ck_assert_ptr_null(json_loadb(bad[k], strlen(bad[k]), 0, &je));
        tp_kserve_request r;
        tp_err e = {{0}};
        ck_assert_msg(parse(&m, bad[k], &r, &e) == TP_PARSE, "body %zu accepted", k);
        char want[64];
        snprintf(want, sizeof want, "line %d column %d", je.line, je.column);
        ck_assert_msg(strstr(e.msg, want), "body %zu: '%s' lacks '%s'", k, e.msg, want);
    }
    /* deep but within jansson's depth: skipped */
    char deep[2 * 1000 + 256];
    int n = snprintf(deep, sizeof deep, "{\"junk\":");
    for (int i = 0; i < 1000; i++)
        deep[n++] = '[';
    for (int i = 0; i < 1000; i++)
        deep[n++] = ']';
    snprintf(deep + n, sizeof deep - (size_t)n, ",\"inputs\":[" T_OK "]}");
    tp_kserve_request r;
    tp_err e = {{0}};
    ck_assert_msg(parse(&m, deep, &r, &e) == TP_OK, "%s", e.msg);
    tp_kserve_request_free(&r);
}
END_TEST

/* A body that ends right after a member's ':' (an unknown key, a known
 * one, inside an input): a parse error, and the scan reads nothing past
 * the body (fuzz_kserve_binary found skip_member reading one byte past it;
 * the bodies are exact-size copies so ASan sees such a read). */
START_TEST(body_ending_after_a_colon)
{
    tp_kserve_model m = one_model(TP_F32);
    static const char *const cut[] = {
        "{\"junk\":",
        "{\"junk\": ",
        "{\"id\":",
        "{\"inputs\": [{\"name\": \"x\", \"shap\xff" "e\":",
        "{\"inputs\": [{\"name\": \"x\", \"data\":",
        "{\"inputs\": [" T_OK "], \"outputs\": [{\"junk\":",
    };
    for (size_t k = 0; k < sizeof cut / sizeof cut[0]; k++) {
        size_t n = strlen(cut[k]);
        char *body = malloc(n);
        memcpy(body, cut[k], n);
        tp_kserve_request r;
        tp_err e = {{0}};
        ck_assert_int_eq(tp_kserve_parse_infer(&m, body, n, -1, NULL, &r, &e), TP_PARSE);
        free(body);
    }
}
END_TEST

/* An answer's estimate covers its outputs (tensor and text, or bytes for
 * a binary one) and the id it echoes, escaped, whatever the id's length. */
START_TEST(answer_bytes_cover_outputs_and_id)
{
    tp_kserve_model m = one_model(TP_F32);
    tp_kserve_request r;
    tp_err e = {{0}};
    ck_assert_int_eq(parse(&m, "{\"inputs\":[" T_OK "]}", &r, &e), TP_OK);
    int64_t plain = tp_kserve_answer_bytes(&m, &r);
    ck_assert_int_ge(plain, 16 + 4 * 17); /* the tensor, and 4 elements as text */
    tp_kserve_request_free(&r);
    char *body = repeated("{\"id\":\"", "abcdefgh", 100000, "\",\"inputs\":[" T_OK "]}");
    ck_assert_int_eq(parse(&m, body, &r, &e), TP_OK);
    ck_assert_int_ge(tp_kserve_answer_bytes(&m, &r), plain + 6 * (int64_t)strlen(r.id));
    tp_kserve_request_free(&r);
    free(body);
}
END_TEST

/* jansson's allowance (json_cap.h) is the net under the scan's count:
 * with no count (max_json_values 0 in the model) 200k empty objects in
 * parameters are refused for the allowance, naming max_json_values,
 * instead of built; and every other route's body is read within it. */
START_TEST(jansson_allowance_holds_where_the_scan_stops)
{
    tp_json_cap_set_values(1000);
    tp_kserve_model m = one_model(TP_F32);
    char *body = repeated("{\"parameters\":{\"p\":[", "{}", 200000, "]},\"inputs\":[" T_OK "]}");
    expect_long_error(&m, body, TP_INVALID, "max_json_values 1000");
    free(body);
    /* a long string is one value: jansson's doubling token buffer and its
     * copy fit the allowance (it counts six times the text) */
    body = repeated("{\"id\":\"", "abcdefgh", 1 << 20, "\",\"inputs\":[" T_OK "]}");
    tp_kserve_request r;
    tp_err e1 = {{0}};
    ck_assert_msg(parse(&m, body, &r, &e1) == TP_OK, "%s", e1.msg);
    ck_assert_uint_eq(strlen(r.id), ((size_t)9 << 20) - 1); /* 1 Mi units joined by commas */
    tp_kserve_request_free(&r);
    free(body);
    int n;
    /* the other routes' bodies too */
    body = repeated("{\"junk\":[", "{}", 200000, "]}");
    json_t *doc;
    tp_err e = {{0}};
    ck_assert_int_eq(tp_kserve_parse_repository_index(body, strlen(body), &n, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "max_json_values 1000"));
    ck_assert_int_eq(tp_json_load_object("{\"a\":[{},{}]}", 13, "small", &doc, &e), TP_OK);
    json_decref(doc);
    free(body);
    tp_json_cap_set_values(0);
}
END_TEST

static Suite *kserve_suite(void)
{
    Suite *s = suite_create("kserve");
    TCase *p = tcase_create("parse");
    tcase_add_test(p, flat_fp32_and_int64);
    tcase_add_test(p, nested_equals_flat);
    tcase_add_test(p, json_numbers_each_dtype);
    tcase_add_test(p, int64_full_range);
    tcase_add_test(p, binary_fp16_and_mixed);
    tcase_add_test(p, repeated_documents);
    tcase_add_test(p, repeated_binary_headers);
    tcase_add_test(p, binary_all_dtypes);
    tcase_add_test(p, outputs_selection);
    suite_add_tcase(s, p);
    TCase *b = tcase_create("build");
    tcase_add_test(b, response_json);
    tcase_add_test(b, response_binary_round_trip);
    tcase_add_test(b, response_classification);
    tcase_add_test(b, response_half_types_as_json);
    tcase_add_test(b, response_errors);
    tcase_add_test(b, metadata_docs);
    tcase_add_test(b, repository_index);
    suite_add_tcase(s, b);
    TCase *e = tcase_create("errors");
    tcase_add_test(e, errors_document);
    tcase_add_test(e, errors_inputs);
    tcase_add_test(e, errors_datatype_and_shape);
    tcase_add_test(e, errors_data);
    tcase_add_test(e, errors_binary);
    tcase_add_test(e, errors_outputs);
    tcase_add_test(e, shm_shrunk_under_requests);
    tcase_add_test(e, unknown_members_are_not_built);
    tcase_add_test(e, too_many_values_refused_before_building);
    tcase_add_test(e, skipped_members_are_checked);
    tcase_add_test(e, jansson_allowance_holds_where_the_scan_stops);
    tcase_add_test(e, answer_bytes_cover_outputs_and_id);
    tcase_add_test(e, body_ending_after_a_colon);
    suite_add_tcase(s, e);
    return s;
}

TP_CHECK_MAIN(kserve_suite)
