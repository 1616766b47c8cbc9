#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "safetensors.h"

/* Each test gets its own scratch directory; files are tracked so teardown can
 * remove exactly what was created. */
static char tmpdir[256];
static char *made[64];
static int n_made;

static void setup(void)
{
    snprintf(tmpdir, sizeof tmpdir, "/tmp/tp_st_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    n_made = 0;
}

static void teardown(void)
{
    for (int i = 0; i < n_made; i++) {
        unlink(made[i]);
        free(made[i]);
    }
    n_made = 0;
    rmdir(tmpdir);
}

static const char *tmp_path(const char *name)
{
    ck_assert_int_lt(n_made, 64);
    char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", tmpdir, name);
    made[n_made] = strdup(buf);
    return made[n_made++];
}

static void write_bytes(const char *path, const void *buf, size_t len)
{
    FILE *fp = fopen(path, "wb");
    ck_assert_ptr_nonnull(fp);
    if (len)
        ck_assert_uint_eq(fwrite(buf, 1, len, fp), len);
    ck_assert_int_eq(fclose(fp), 0);
}

/* A hand-made file: LE length of `header` (unpadded), the header, then
 * data_len zero bytes. */
static const char *raw_file(const char *name, const char *header, size_t data_len)
{
    const char *path = tmp_path(name);
    size_t hl = strlen(header);
    unsigned char *buf = calloc(1, 8 + hl + data_len + 1);
    for (int i = 0; i < 8; i++)
        buf[i] = (unsigned char)(((uint64_t)hl >> (8 * i)) & 0xff);
    memcpy(buf + 8, header, hl);
    write_bytes(path, buf, 8 + hl + data_len);
    free(buf);
    return path;
}

/* Opens path, expects status s, and checks the message starts with the path
 * and contains each of the (up to three) phrases. */
static void expect_open_fail(const char *path, tp_status s, const char *p1, const char *p2,
                             const char *p3)
{
    st_file *f = (st_file *)1;
    tp_err err = {{0}};
    tp_status got = st_open(path, &f, &err);
    ck_assert_msg(got == s, "%s: got %s, want %s (%s)", path, tp_status_name(got),
                  tp_status_name(s), err.msg);
    ck_assert_ptr_null(f);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "no path prefix: %s", err.msg);
    const char *ps[3] = {p1, p2, p3};
    for (int i = 0; i < 3; i++)
        if (ps[i])
            ck_assert_msg(strstr(err.msg, ps[i]), "'%s' not in: %s", ps[i], err.msg);
}

static st_file *open_ok(const char *path)
{
    st_file *f = NULL;
    tp_err err = {{0}};
    tp_status s = st_open(path, &f, &err);
    ck_assert_msg(s == TP_OK, "st_open(%s): %s", path, err.msg);
    ck_assert_ptr_nonnull(f);
    return f;
}

/* The raw bytes of tensor name, as st_read_shard reads them whole. */
static void check_bytes(const st_file *f, const char *name, const void *want, size_t n)
{
    unsigned char got[256];
    tp_err err = {{0}};
    ck_assert_uint_le(n, sizeof got);
    ck_assert_msg(st_read_shard(f, st_find(f, name), -1, 0, 1, got, &err) == TP_OK, "%s", err.msg);
    ck_assert_mem_eq(got, want, n);
}

static void check_info(const st_tensor_info *t, const char *name, tp_dtype dt, int ndim,
                       const int64_t *shape, uint64_t begin, uint64_t end)
{
    ck_assert_ptr_nonnull(t);
    ck_assert_str_eq(t->name, name);
    ck_assert_int_eq(t->dtype, dt);
    ck_assert_int_eq(t->ndim, ndim);
    for (int i = 0; i < ndim; i++)
        ck_assert_int_eq(t->shape[i], shape[i]);
    ck_assert_uint_eq(t->begin, begin);
    ck_assert_uint_eq(t->end, end);
}

/* ---- round trips ---- */

START_TEST(test_roundtrip_all_dtypes)
{
    const char *path = tmp_path("all.safetensors");
    float f32[6] = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, 65504.0f};
    int64_t s_f32[2] = {2, 3};
    uint16_t f16[4] = {tp_f32_to_f16(1.0f), tp_f32_to_f16(-0.5f), tp_f32_to_f16(2048.0f),
                       tp_f32_to_f16(0.099975586f)};
    int64_t s_f16[1] = {4};
    uint16_t bf16[3] = {tp_f32_to_bf16(3.0f), tp_f32_to_bf16(-1e30f), tp_f32_to_bf16(0.15625f)};
    int64_t s_bf16[3] = {1, 3, 1};
    int32_t i32[2] = {INT32_MIN, 7};
    int64_t s_i32[2] = {2, 1};
    int64_t i64[2] = {-((int64_t)1 << 40), INT64_MAX};
    int64_t s_i64[1] = {2};
    float scalar = 3.5f;
    st_write_item items[] = {
        {"w.f32", TP_F32, 2, s_f32, f32},     {"w.f16", TP_F16, 1, s_f16, f16},
        {"w.bf16", TP_BF16, 3, s_bf16, bf16}, {"w.i32", TP_I32, 2, s_i32, i32},
        {"w.i64", TP_I64, 1, s_i64, i64},     {"scale", TP_F32, 0, NULL, &scalar},
    };
    tp_err err = {{0}};
    ck_assert_msg(st_write(path, items, 6, &err) == TP_OK, "%s", err.msg);

    /* The on-disk layout, checked byte by byte: padded header, then data. */
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    unsigned char raw[1024];
    size_t got = fread(raw, 1, sizeof raw, fp);
    fclose(fp);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | raw[i];
    ck_assert_uint_eq(hlen % 8, 0);
    size_t data_bytes = 24 + 8 + 6 + 8 + 16 + 4;
    ck_assert_uint_eq(got, 8 + hlen + data_bytes);
    ck_assert_int_eq(raw[8], '{');
    ck_assert(raw[8 + hlen - 1] == '}' || raw[8 + hlen - 1] == ' ');
    ck_assert_mem_eq(raw + 8 + hlen, f32, sizeof f32);
    ck_assert_mem_eq(raw + 8 + hlen + data_bytes - 4, &scalar, 4);

    st_file *f = open_ok(path);
    ck_assert_str_eq(st_path(f), path);
    ck_assert_int_eq(st_count(f), 6);
    check_info(st_info(f, 0), "w.f32", TP_F32, 2, s_f32, 0, 24);
    check_info(st_info(f, 1), "w.f16", TP_F16, 1, s_f16, 24, 32);
    check_info(st_info(f, 2), "w.bf16", TP_BF16, 3, s_bf16, 32, 38);
    check_info(st_info(f, 3), "w.i32", TP_I32, 2, s_i32, 38, 46);
    check_info(st_info(f, 4), "w.i64", TP_I64, 1, s_i64, 46, 62);
    check_info(st_info(f, 5), "scale", TP_F32, 0, NULL, 62, 66);
    ck_assert_ptr_null(st_info(f, 6));
    ck_assert_ptr_null(st_info(f, -1));

    ck_assert_ptr_eq(st_find(f, "w.i32"), st_info(f, 3));
    ck_assert_ptr_eq(st_find(f, "scale"), st_info(f, 5));
    ck_assert_ptr_null(st_find(f, "w.f64"));
    ck_assert_ptr_null(st_find(f, ""));

    check_bytes(f, "w.f32", f32, sizeof f32);
    check_bytes(f, "w.f16", f16, sizeof f16);
    check_bytes(f, "w.bf16", bf16, sizeof bf16);
    check_bytes(f, "w.i32", i32, sizeof i32);
    check_bytes(f, "w.i64", i64, sizeof i64);

    /* Values, decoded, not just bytes. */
    float out32[6];
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w.f32"), -1, 0, 1, out32, &err), TP_OK);
    ck_assert_float_eq(out32[1], -2.5f);
    ck_assert_float_eq(out32[5], 65504.0f);
    uint16_t h[4];
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w.f16"), -1, 0, 1, h, &err), TP_OK);
    ck_assert_float_eq(tp_f16_to_f32(h[1]), -0.5f);
    ck_assert_float_eq(tp_f16_to_f32(h[2]), 2048.0f);
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w.bf16"), -1, 0, 1, h, &err), TP_OK);
    ck_assert_float_eq(tp_bf16_to_f32(h[0]), 3.0f);
    ck_assert_float_eq(tp_bf16_to_f32(h[2]), 0.15625f);
    int32_t o32[2];
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w.i32"), -1, 0, 1, o32, &err), TP_OK);
    ck_assert_int_eq(o32[0], INT32_MIN);
    ck_assert_int_eq(o32[1], 7);
    int64_t o64[2];
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w.i64"), -1, 0, 1, o64, &err), TP_OK);
    ck_assert_int_eq(o64[0], -((int64_t)1 << 40));
    ck_assert_int_eq(o64[1], INT64_MAX);
    float sc = 0;
    ck_assert_int_eq(st_read_shard(f, st_find(f, "scale"), -1, 0, 1, &sc, &err), TP_OK);
    ck_assert_float_eq(sc, 3.5f);
    st_close(f);
}
END_TEST

START_TEST(test_empty_file_and_empty_tensor)
{
    const char *path = tmp_path("empty.safetensors");
    tp_err err = {{0}};
    ck_assert_msg(st_write(path, NULL, 0, &err) == TP_OK, "%s", err.msg);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(sb.st_size, 16); /* length + "{}" padded to 8 */
    st_file *f = open_ok(path);
    ck_assert_int_eq(st_count(f), 0);
    ck_assert_ptr_null(st_info(f, 0));
    ck_assert_ptr_null(st_find(f, "x"));
    st_close(f);

    /* A zero-element tensor: the data section is zero bytes long. */
    const char *p2 = tmp_path("zero.safetensors");
    int64_t shape[2] = {0, 3};
    st_write_item it = {"z", TP_F32, 2, shape, NULL};
    ck_assert_msg(st_write(p2, &it, 1, &err) == TP_OK, "%s", err.msg);
    f = open_ok(p2);
    ck_assert_int_eq(st_count(f), 1);
    check_info(st_info(f, 0), "z", TP_F32, 2, shape, 0, 0);
    ck_assert_int_eq(st_read_shard(f, st_info(f, 0), 1, 1, 3, NULL, &err), TP_OK);
    ck_assert_int_eq(st_read_shard(f, st_info(f, 0), -1, 0, 1, NULL, &err), TP_OK);
    st_close(f);

    /* Hand-made: unpadded "{}" header and nothing after it. */
    f = open_ok(raw_file("bare.safetensors", "{}", 0));
    ck_assert_int_eq(st_count(f), 0);
    st_close(f);
    st_close(NULL);
}
END_TEST

START_TEST(test_metadata_skipped)
{
    const char *path = raw_file(
        "meta.safetensors",
        "{\"__metadata__\":{\"format\":\"pt\",\"note\":\"x\"},"
        "\"b\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[8,16]},"
        "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
        16);
    st_file *f = open_ok(path);
    ck_assert_int_eq(st_count(f), 2);
    int64_t s2[1] = {2};
    /* Header order, not data or name order. */
    check_info(st_info(f, 0), "b", TP_I32, 1, s2, 8, 16);
    check_info(st_info(f, 1), "a", TP_F32, 1, s2, 0, 8);
    ck_assert_ptr_null(st_find(f, "__metadata__"));
    ck_assert_ptr_eq(st_find(f, "a"), st_info(f, 1));
    st_close(f);

    expect_open_fail(raw_file("meta_bad.safetensors", "{\"__metadata__\":[1]}", 0), TP_PARSE,
                     "__metadata__", "not an object", NULL);
}
END_TEST

/* ---- shards ---- */

/* x[i][j][k] = 16i + 4j + k, shape [4, 4, 4]. */
static st_file *cube_file(void)
{
    const char *path = tmp_path("cube.safetensors");
    float x[64];
    for (int i = 0; i < 64; i++)
        x[i] = (float)i;
    int64_t shape[3] = {4, 4, 4};
    st_write_item it = {"cube", TP_F32, 3, shape, x};
    tp_err err = {{0}};
    ck_assert_msg(st_write(path, &it, 1, &err) == TP_OK, "%s", err.msg);
    return open_ok(path);
}

/* Reads a shard into a buffer with a canary tail, so a copy that writes
 * beyond the shard's size is caught. */
static void check_shard(st_file *f, int dim, int rank, int world, const float *want, int n)
{
    float buf[80];
    for (int i = 0; i < 80; i++)
        buf[i] = -1.0f;
    tp_err err = {{0}};
    tp_status s = st_read_shard(f, st_find(f, "cube"), dim, rank, world, buf, &err);
    ck_assert_msg(s == TP_OK, "%s", err.msg);
    for (int i = 0; i < n; i++)
        ck_assert_msg(buf[i] == want[i], "dim %d rank %d/%d: [%d] = %g, want %g", dim, rank,
                      world, i, (double)buf[i], (double)want[i]);
    for (int i = n; i < 80; i++)
        ck_assert_float_eq(buf[i], -1.0f);
}

START_TEST(test_shard_dim0)
{
    st_file *f = cube_file();
    float w[32];
    for (int i = 0; i < 32; i++)
        w[i] = (float)i;
    check_shard(f, 0, 0, 2, w, 32);
    for (int i = 0; i < 32; i++)
        w[i] = (float)(32 + i);
    check_shard(f, 0, 1, 2, w, 32);
    for (int i = 0; i < 16; i++)
        w[i] = (float)(32 + i);
    check_shard(f, 0, 2, 4, w, 16); /* i = 2 */
    st_close(f);
}
END_TEST

START_TEST(test_shard_dim1)
{
    st_file *f = cube_file();
    /* world 2, rank 0: j in {0,1} for every i. */
    const float w2r0[32] = {0,  1,  2,  3,  4,  5,  6,  7,  16, 17, 18, 19, 20, 21, 22, 23,
                            32, 33, 34, 35, 36, 37, 38, 39, 48, 49, 50, 51, 52, 53, 54, 55};
    const float w2r1[32] = {8,  9,  10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31,
                            40, 41, 42, 43, 44, 45, 46, 47, 56, 57, 58, 59, 60, 61, 62, 63};
    /* world 4, rank 3: j = 3. */
    const float w4r3[16] = {12, 13, 14, 15, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63};
    const float w4r0[16] = {0, 1, 2, 3, 16, 17, 18, 19, 32, 33, 34, 35, 48, 49, 50, 51};
    check_shard(f, 1, 0, 2, w2r0, 32);
    check_shard(f, 1, 1, 2, w2r1, 32);
    check_shard(f, 1, 3, 4, w4r3, 16);
    check_shard(f, 1, 0, 4, w4r0, 16);
    st_close(f);
}
END_TEST

START_TEST(test_shard_dim2)
{
    st_file *f = cube_file();
    /* world 2, rank 1: k in {2,3} for every (i, j). */
    const float w2r1[32] = {2,  3,  6,  7,  10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31,
                            34, 35, 38, 39, 42, 43, 46, 47, 50, 51, 54, 55, 58, 59, 62, 63};
    /* world 4, rank 1: k = 1. */
    const float w4r1[16] = {1, 5, 9, 13, 17, 21, 25, 29, 33, 37, 41, 45, 49, 53, 57, 61};
    const float w4r2[16] = {2, 6, 10, 14, 18, 22, 26, 30, 34, 38, 42, 46, 50, 54, 58, 62};
    check_shard(f, 2, 1, 2, w2r1, 32);
    check_shard(f, 2, 1, 4, w4r1, 16);
    check_shard(f, 2, 2, 4, w4r2, 16);

    /* Replication and world 1 give back the whole tensor. */
    float all[64];
    for (int i = 0; i < 64; i++)
        all[i] = (float)i;
    check_shard(f, -1, 0, 4, all, 64);
    check_shard(f, 2, 0, 1, all, 64);
    st_close(f);
}
END_TEST

/* Every dim, rank and world on a non-cubic I64 tensor, against the global
 * index formula; the shards of one dim must also cover the tensor exactly. */
START_TEST(test_shard_all_i64)
{
    const char *path = tmp_path("i64.safetensors");
    enum { A = 4, B = 8, C = 12 };
    int64_t x[A * B * C];
    for (int i = 0; i < A * B * C; i++)
        x[i] = (int64_t)i * 1000003 - 7;
    int64_t shape[3] = {A, B, C};
    st_write_item it = {"t", TP_I64, 3, shape, x};
    tp_err err = {{0}};
    ck_assert_msg(st_write(path, &it, 1, &err) == TP_OK, "%s", err.msg);
    st_file *f = open_ok(path);
    int worlds[2] = {2, 4};
    for (int d = 0; d < 3; d++)
        for (int wi = 0; wi < 2; wi++) {
            int world = worlds[wi];
            int64_t sh[3] = {A, B, C};
            sh[d] /= world;
            for (int r = 0; r < world; r++) {
                int64_t buf[A * B * C];
                ck_assert_int_eq(st_read_shard(f, st_info(f, 0), d, r, world, buf, &err), TP_OK);
                for (int i = 0; i < sh[0]; i++)
                    for (int j = 0; j < sh[1]; j++)
                        for (int k = 0; k < sh[2]; k++) {
                            int g[3] = {i, j, k};
                            g[d] += (int)(r * sh[d]);
                            int64_t want = x[(g[0] * B + g[1]) * C + g[2]];
                            ck_assert_int_eq(buf[(i * sh[1] + j) * sh[2] + k], want);
                        }
            }
        }
    st_close(f);
}
END_TEST

START_TEST(test_shard_errors)
{
    const char *path = tmp_path("odd.safetensors");
    float x[4 * 6 * 4] = {0};
    int64_t shape[3] = {4, 6, 4};
    st_write_item it = {"odd", TP_F32, 3, shape, x};
    tp_err err = {{0}};
    ck_assert_int_eq(st_write(path, &it, 1, &err), TP_OK);
    st_file *f = open_ok(path);
    const st_tensor_info *t = st_info(f, 0);
    float buf[96];

    ck_assert_int_eq(st_read_shard(f, t, 1, 0, 4, buf, &err), TP_INVALID);
    ck_assert_msg(strncmp(err.msg, path, strlen(path)) == 0, "%s", err.msg);
    ck_assert_ptr_nonnull(strstr(err.msg, "'odd'"));
    ck_assert_ptr_nonnull(strstr(err.msg, "not divisible"));
    ck_assert_ptr_nonnull(strstr(err.msg, "size 6"));
    ck_assert_int_eq(st_read_shard(f, t, 1, 0, 3, buf, &err), TP_OK); /* 6 % 3 == 0 */

    ck_assert_int_eq(st_read_shard(f, t, 3, 0, 2, buf, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "shard dim 3 out of range"));
    ck_assert_int_eq(st_read_shard(f, t, 0, 2, 2, buf, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "rank 2 out of range"));
    ck_assert_int_eq(st_read_shard(f, t, 0, 0, 0, buf, &err), TP_INVALID);
    ck_assert_int_eq(st_read_shard(f, t, 0, -1, 2, buf, &err), TP_INVALID);

    /* A forged info must not steer the copy outside the mapping. */
    st_tensor_info forged = *t;
    forged.end += 4096;
    forged.shape[0] += 1024;
    ck_assert_int_eq(st_read_shard(f, &forged, -1, 0, 1, buf, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "does not describe"));
    st_close(f);
}
END_TEST

/* ---- corrupt files, one validation at a time ---- */

#define ENTRY(body) "{\"w1\":" body "}"

START_TEST(test_err_missing_file)
{
    const char *path = tmp_path("nope.safetensors");
    expect_open_fail(path, TP_IO, "No such file or directory", NULL, NULL);
    expect_open_fail(tmpdir, TP_IO, "not a regular file", NULL, NULL);
}
END_TEST

/* A FIFO would block open() forever (no writer): refused at once. */
START_TEST(test_err_fifo)
{
    const char *path = tmp_path("fifo.safetensors");
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    expect_open_fail(path, TP_IO, "not a regular file", NULL, NULL);
}
END_TEST

/* Truncated after open (a weights file replaced while loading): the read
 * that runs past the new end is an error naming the file, never SIGBUS. */
START_TEST(test_err_truncated_while_open)
{
    const char *path = tmp_path("shrink.safetensors");
    float x[64] = {0};
    int64_t shape[2] = {8, 8};
    st_write_item it = {"w", TP_F32, 2, shape, x};
    tp_err err = {{0}};
    ck_assert_msg(st_write(path, &it, 1, &err) == TP_OK, "%s", err.msg);
    st_file *f = open_ok(path);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_int_eq(truncate(path, sb.st_size - 100), 0);
    float out[64];
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w"), -1, 0, 1, out, &err), TP_IO);
    ck_assert_msg(strstr(err.msg, path) && strstr(err.msg, "truncated while loading"), "%s", err.msg);
    ck_assert_int_eq(st_read_shard(f, st_find(f, "w"), 0, 1, 2, out, &err), TP_IO);
    ck_assert_msg(strstr(err.msg, "tensor 'w'"), "%s", err.msg);
    st_close(f);
}
END_TEST

START_TEST(test_err_short_file)
{
    const char *path = tmp_path("short.safetensors");
    write_bytes(path, "\x02\0\0\0\0", 5);
    expect_open_fail(path, TP_PARSE, "5 bytes", "shorter than", NULL);
    const char *p0 = tmp_path("zero_len.safetensors");
    write_bytes(p0, "", 0);
    expect_open_fail(p0, TP_PARSE, "0 bytes", "shorter than", NULL);
}
END_TEST

START_TEST(test_err_header_length)
{
    const char *path = tmp_path("hlen.safetensors");
    unsigned char buf[20] = {0xe8, 0x03, 0, 0, 0, 0, 0, 0, '{', '}'}; /* 1000 */
    write_bytes(path, buf, sizeof buf);
    expect_open_fail(path, TP_PARSE, "header length 1000", "past the end of the file",
                     "12 bytes");

    const char *p2 = tmp_path("absurd.safetensors");
    unsigned char b2[16] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, '{', '}'};
    write_bytes(p2, b2, sizeof b2);
    expect_open_fail(p2, TP_PARSE, "header length 18446744073709551615", "exceeds", NULL);
}
END_TEST

START_TEST(test_err_bad_json)
{
    expect_open_fail(raw_file("json.safetensors", "{\"w1\": {\"dtype\": \n  \"F32\",,}}", 0),
                     TP_PARSE, "not valid JSON", "line 2", "column");
    expect_open_fail(raw_file("json0.safetensors", "", 0), TP_PARSE, "not valid JSON", NULL,
                     NULL);
    expect_open_fail(raw_file("arr.safetensors", "[1, 2]", 0), TP_PARSE, "not an object",
                     "array", NULL);
    expect_open_fail(raw_file("dup.safetensors",
                              "{\"w1\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]},"
                              "\"w1\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4]}}",
                              4),
                     TP_PARSE, "duplicate", "w1", NULL);
    expect_open_fail(raw_file("entry.safetensors", ENTRY("5"), 0), TP_PARSE, "'w1'",
                     "not an object", NULL);
}
END_TEST

START_TEST(test_err_missing_fields)
{
    expect_open_fail(raw_file("nodt.safetensors", ENTRY("{\"shape\":[1],\"data_offsets\":[0,4]}"),
                              4),
                     TP_PARSE, "'w1'", "missing \"dtype\"", NULL);
    expect_open_fail(raw_file("nosh.safetensors", ENTRY("{\"dtype\":\"F32\",\"data_offsets\":[0,4]}"),
                              4),
                     TP_PARSE, "'w1'", "missing \"shape\"", NULL);
    expect_open_fail(raw_file("nooff.safetensors", ENTRY("{\"dtype\":\"F32\",\"shape\":[1]}"), 4),
                     TP_PARSE, "'w1'", "missing \"data_offsets\"", NULL);
}
END_TEST

START_TEST(test_err_wrong_types)
{
    expect_open_fail(
        raw_file("t1.safetensors", ENTRY("{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}"), 4),
        TP_PARSE, "'w1'", "\"dtype\" is an integer, not a string", NULL);
    expect_open_fail(raw_file("t2.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":\"1\",\"data_offsets\":[0,4]}"),
                              4),
                     TP_PARSE, "'w1'", "\"shape\" is a string, not an array", NULL);
    expect_open_fail(raw_file("t3.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[1.0],\"data_offsets\":[0,4]}"),
                              4),
                     TP_PARSE, "'w1'", "shape[0] is a real number, not an integer", NULL);
    expect_open_fail(
        raw_file("t4.safetensors", ENTRY("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":4}"),
                 4),
        TP_PARSE, "'w1'", "\"data_offsets\" is an integer, not an array", NULL);
    expect_open_fail(raw_file("t5.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}"),
                              8),
                     TP_PARSE, "'w1'", "has 3 elements, not 2", NULL);
    expect_open_fail(raw_file("t6.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,\"4\"]}"),
                              4),
                     TP_PARSE, "'w1'", "holds a string, not integers", NULL);
    expect_open_fail(raw_file("t7.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}"),
                              4),
                     TP_PARSE, "'w1'", "negative", NULL);
}
END_TEST

START_TEST(test_err_unknown_dtype)
{
    expect_open_fail(
        raw_file("dt.safetensors",
                 ENTRY("{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}"), 4),
        TP_PARSE, "'w1'", "unknown dtype 'F8_E4M3'", NULL);
}
END_TEST

START_TEST(test_err_dims)
{
    expect_open_fail(raw_file("neg.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,4]}"),
                              4),
                     TP_PARSE, "'w1'", "shape[1] is negative (-3)", NULL);
    expect_open_fail(
        raw_file("rank.safetensors",
                 ENTRY("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}"),
                 4),
        TP_PARSE, "'w1'", "9 dims", "more than the 8 supported");
    /* Exactly TP_MAX_DIMS is fine. */
    st_file *f = open_ok(raw_file(
        "rank8.safetensors",
        ENTRY("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}"), 8));
    ck_assert_int_eq(st_info(f, 0)->ndim, 8);
    st_close(f);
}
END_TEST

START_TEST(test_err_offsets)
{
    expect_open_fail(raw_file("order.safetensors",
                              ENTRY("{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,4]}"),
                              8),
                     TP_PARSE, "'w1'", "[8, 4]", "begin > end");
    const char *p =
        raw_file("past.safetensors",
                 ENTRY("{\"dtype\":\"F32\",\"shape\":[1024],\"data_offsets\":[0,4096]}"), 1024);
    expect_open_fail(p, TP_PARSE, "tensor 'w1': data_offsets [0, 4096] run past the end of the "
                                  "file (data section is 1024 bytes)",
                     NULL, NULL);
}
END_TEST

START_TEST(test_err_size_mismatch)
{
    expect_open_fail(raw_file("size.safetensors",
                              ENTRY("{\"dtype\":\"BF16\",\"shape\":[3,5],\"data_offsets\":[0,32]}"),
                              32),
                     TP_PARSE, "'w1'", "span 32 bytes", "needs 30 bytes");
    expect_open_fail(
        raw_file("ovf.safetensors",
                 ENTRY("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],"
                       "\"data_offsets\":[0,0]}"),
                 0),
        TP_PARSE, "'w1'", "overflows", NULL);
    /* A zero dim makes the product 0 even when the rest would overflow. */
    st_file *f = open_ok(raw_file("zerodim.safetensors",
                                  ENTRY("{\"dtype\":\"F32\",\"shape\":[4611686018427387904,"
                                        "4611686018427387904,0],\"data_offsets\":[0,0]}"),
                                  0));
    st_close(f);
}
END_TEST

START_TEST(test_write_errors)
{
    int64_t shape[1] = {2};
    float x[2] = {1, 2};
    tp_err err = {{0}};
    st_write_item dup[2] = {{"a", TP_F32, 1, shape, x}, {"a", TP_F32, 1, shape, x}};
    const char *p = tmp_path("dup_w.safetensors");
    ck_assert_int_eq(st_write(p, dup, 2, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "duplicate"));
    ck_assert_int_ne(access(p, F_OK), 0); /* nothing left behind */

    int64_t neg[1] = {-1};
    st_write_item bad = {"n", TP_F32, 1, neg, x};
    ck_assert_int_eq(st_write(p, &bad, 1, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "negative"));

    st_write_item bdt = {"d", (tp_dtype)42, 1, shape, x};
    ck_assert_int_eq(st_write(p, &bdt, 1, &err), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "invalid dtype"));

    st_write_item nodata = {"d", TP_F32, 1, shape, NULL};
    ck_assert_int_eq(st_write(p, &nodata, 1, &err), TP_INVALID);

    char nodir[600];
    snprintf(nodir, sizeof nodir, "%s/no/such/dir/x.safetensors", tmpdir);
    ck_assert_int_eq(st_write(nodir, dup, 1, &err), TP_IO);
    ck_assert_msg(strncmp(err.msg, nodir, strlen(nodir)) == 0, "%s", err.msg);
    ck_assert_ptr_nonnull(strstr(err.msg, "No such file or directory"));

    /* Overwriting an existing file replaces it whole. */
    float y[3] = {7, 8, 9};
    int64_t s3[1] = {3};
    st_write_item a = {"a", TP_F32, 1, shape, x}, b = {"b", TP_F32, 1, s3, y};
    ck_assert_int_eq(st_write(p, &a, 1, &err), TP_OK);
    ck_assert_int_eq(st_write(p, &b, 1, &err), TP_OK);
    st_file *f = open_ok(p);
    ck_assert_int_eq(st_count(f), 1);
    ck_assert_ptr_null(st_find(f, "a"));
    check_bytes(f, "b", y, sizeof y);
    st_close(f);
}
END_TEST

static Suite *safetensors_suite(void)
{
    Suite *s = suite_create("safetensors");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_roundtrip_all_dtypes);
    tcase_add_test(tc, test_empty_file_and_empty_tensor);
    tcase_add_test(tc, test_metadata_skipped);
    tcase_add_test(tc, test_shard_dim0);
    tcase_add_test(tc, test_shard_dim1);
    tcase_add_test(tc, test_shard_dim2);
    tcase_add_test(tc, test_shard_all_i64);
    tcase_add_test(tc, test_shard_errors);
    tcase_add_test(tc, test_err_missing_file);
    tcase_add_test(tc, test_err_short_file);
    tcase_add_test(tc, test_err_fifo);
    tcase_add_test(tc, test_err_truncated_while_open);
    tcase_add_test(tc, test_err_header_length);
    tcase_add_test(tc, test_err_bad_json);
    tcase_add_test(tc, test_err_missing_fields);
    tcase_add_test(tc, test_err_wrong_types);
    tcase_add_test(tc, test_err_unknown_dtype);
    tcase_add_test(tc, test_err_dims);
    tcase_add_test(tc, test_err_offsets);
    tcase_add_test(tc, test_err_size_mismatch);
    tcase_add_test(tc, test_write_errors);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(safetensors_suite)
