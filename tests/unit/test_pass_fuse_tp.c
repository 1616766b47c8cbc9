/* fuse_tp on hand-written graphs: what must fuse, what must be left alone,
 * and identical numbers with the pass on and off. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "testutil.h"

static float w1[8 * 6], w2[8 * 4], w3[8 * 6], wd[6 * 8], wt[6 * 8];
static const int64_t s86[2] = {8, 6}, s84[2] = {8, 4}, s68[2] = {6, 8};

typedef struct {
    int fused_ag, fused_rs, all_gathers, reduce_scatters, slices;
} counts;

/* Op counts of the graph at path after every pass. */
static void expect_counts(const char *path, counts want)
{
    tp_graph *g = tu_load_passed(path, 2, NULL);
    ck_assert_int_eq(tu_count_op(g, TP_OP_FUSED_AG_MM), want.fused_ag);
    ck_assert_int_eq(tu_count_op(g, TP_OP_FUSED_MM_RS), want.fused_rs);
    ck_assert_int_eq(tu_count_op(g, TP_OP_ALL_GATHER), want.all_gathers);
    ck_assert_int_eq(tu_count_op(g, TP_OP_REDUCE_SCATTER), want.reduce_scatters);
    ck_assert_int_eq(tu_count_op(g, TP_OP_SLICE), want.slices);
    tp_graph_free(g);
}

/* Engine `fused` gives the numbers the graph at path gives without passes
 * (ranks as threads); frees `fused`. */
static void expect_same_as_unfused_by(tp_engine *fused, const char *path, const tp_host_tensor *in, int n_in)
{
    tp_engine *off = tu_engine(path, 0, 0);
    int n1, n2;
    tp_host_tensor *a = tu_infer(fused, in, n_in, &n1), *b = tu_infer(off, in, n_in, &n2);
    ck_assert_int_eq(n1, n2);
    double diff = tu_rel_diff(a, b, n1);
    ck_assert_msg(diff <= TU_RTOL_REORDER, "%s: fused vs unfused differ by %g", path, diff);
    tp_host_tensors_free(a, n1);
    tp_host_tensors_free(b, n2);
    tp_engine_free(fused);
    tp_engine_free(off);
}

/* The graph at path with passes (ranks as threads) gives the numbers it
 * gives without them. */
static void expect_same_as_unfused(const char *path, const tp_host_tensor *in, int n_in)
{
    expect_same_as_unfused_by(tu_engine(path, 1, 0), path, in, n_in);
}

/* outputs (JSON objects, no nesting) with each one declared without a
 * placement given shard(1): an output the ranks hold alike then comes back
 * as every rank's copy side by side, so comparing it with the unfused
 * graph covers each rank's rows. Declared as they are, only rank 0's copy
 * comes back, and a fault in another rank's rows would go unseen. */
static void every_rank_copy(const char *outputs, char *out, size_t cap)
{
    size_t n = 0;
    for (const char *p = outputs; *p;) {
        const char *end = strchr(p, '}');
        ck_assert_ptr_nonnull(end);
        int has = memmem(p, (size_t)(end - p), "placement", 9) != NULL;
        n += (size_t)snprintf(out + n, cap - n, "%.*s%s}", (int)(end - p), p, has ? "" : ",\"placement\":\"shard(1)\"");
        ck_assert_uint_lt(n, cap);
        p = end + 1;
    }
}

/* Builds a world-2 graph around `nodes` with x [B, seq, 8], checks op
 * counts after passes and that every output matches the unfused graph at
 * batch 1 to max_batch, on every rank. */
static void check_case_seq(const char *nodes, const char *given_outputs, counts want, int64_t seq, int64_t max_batch)
{
    char json[4096], dir[64], path[128], outputs[1024];
    every_rank_copy(given_outputs, outputs, sizeof outputs);
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"f\",\"world_size\":2,\"weights\":\"w.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",%lld,8],\"placement\":\"shard(1)\"}],"
             "\"params\":[{\"name\":\"w1\",\"datatype\":\"FP32\",\"shape\":[8,6],\"placement\":\"replicate\"},"
             "{\"name\":\"w2\",\"datatype\":\"FP32\",\"shape\":[8,4],\"placement\":\"replicate\"},"
             "{\"name\":\"w3\",\"datatype\":\"FP32\",\"shape\":[8,6],\"placement\":\"replicate\"},"
             "{\"name\":\"wd\",\"datatype\":\"FP32\",\"shape\":[6,8],\"placement\":\"replicate\"},"
             "{\"name\":\"wt\",\"datatype\":\"FP32\",\"shape\":[6,8],\"placement\":\"replicate\"}],"
             "\"nodes\":[%s],\"outputs\":[%s]}", (long long)seq, nodes, outputs);
    st_write_item items[] = {{"w1", TP_F32, 2, s86, w1}, {"w2", TP_F32, 2, s84, w2}, {"w3", TP_F32, 2, s86, w3},
                             {"wd", TP_F32, 2, s68, wd}, {"wt", TP_F32, 2, s68, wt}};
    tu_write_graph(dir, path, json, items, 5);
    expect_counts(path, want);
    float *x = malloc((size_t)(max_batch * seq * 8) * sizeof *x);
    ck_assert_ptr_nonnull(x);
    for (int64_t batch = 1; batch <= max_batch; batch++) {
        tu_fill(x, batch * seq * 8, (unsigned)batch);
        int64_t shape[3] = {batch, seq, 8};
        tp_host_tensor in = tu_f32("x", x, 3, shape);
        expect_same_as_unfused(path, &in, 1);
    }
    free(x);
    tu_rmdir(dir);
}

static void check_case(const char *nodes, const char *outputs, counts want)
{
    check_case_seq(nodes, outputs, want, 4, 3);
}

#define AG "{\"name\":\"xg\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}}"

START_TEST(gather_matmul_fuses)
{
    check_case(AG ",{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]}", "{\"name\":\"h\"}",
               (counts){1, 0, 0, 0, 0});
}
END_TEST

START_TEST(qkv_share_one_gather)
{
    check_case(AG ",{\"name\":\"q\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]},"
                  "{\"name\":\"k\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w2\"]},"
                  "{\"name\":\"v\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w3\"]},"
                  "{\"name\":\"qv\",\"op\":\"add\",\"inputs\":[\"q\",\"v\"]}",
               "{\"name\":\"qv\"},{\"name\":\"k\"}", (counts){1, 0, 0, 0, 3});
}
END_TEST

START_TEST(gather_through_view)
{
    check_case(AG ",{\"name\":\"flat\",\"op\":\"view\",\"inputs\":[\"xg\"],\"attrs\":{\"shape\":[-1,8]}},"
                  "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"flat\",\"w1\"]},"
                  "{\"name\":\"hv\",\"op\":\"view\",\"inputs\":[\"h\"],\"attrs\":{\"shape\":[-1,4,6]}}",
               "{\"name\":\"hv\"}", (counts){1, 0, 0, 0, 0});
}
END_TEST

START_TEST(gather_kept_for_other_readers)
{
    check_case(AG ",{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]},"
                  "{\"name\":\"r\",\"op\":\"relu\",\"inputs\":[\"xg\"]}",
               "{\"name\":\"h\"},{\"name\":\"r\"}", (counts){1, 0, 1, 0, 0});
}
END_TEST

START_TEST(gather_on_k)
{
    /* x [B,2,8] gathered on K to [B,2,16]: sliced back to 8 it stays unfused */
    check_case("{\"name\":\"xg\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":2}},"
               "{\"name\":\"sl\",\"op\":\"slice\",\"inputs\":[\"xg\"],\"attrs\":{\"dim\":2,\"start\":0,\"length\":8}},"
               "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"sl\",\"w1\"]}",
               "{\"name\":\"h\"}", (counts){0, 0, 1, 0, 1});
    /* a matmul contracting the gathered K fuses into a sum over ranks; two
     * such matmuls give two fused nodes (one weight each) */
    check_case("{\"name\":\"xk\",\"op\":\"slice\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":2,\"start\":0,\"length\":3}},"
               "{\"name\":\"xkc\",\"op\":\"contiguous\",\"inputs\":[\"xk\"]},"
               "{\"name\":\"xg\",\"op\":\"all_gather\",\"inputs\":[\"xkc\"],\"attrs\":{\"dim\":2}},"
               "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"wd\"]},"
               "{\"name\":\"t\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"wt\"]}",
               "{\"name\":\"h\"},{\"name\":\"t\"}", (counts){2, 0, 0, 0, 1});
}
END_TEST

START_TEST(matmul_reduce_scatter_fuses)
{
    /* rows (dim 1), through a view, and on the last (N) dim */
    check_case(AG ",{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]},{\"name\":\"r\",\"op\":\"relu\",\"inputs\":[\"h\"]},"
                  "{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"r\",\"wd\"]},"
                  "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":1,\"op\":\"sum\"}}",
               "{\"name\":\"y\"}", (counts){1, 1, 0, 0, 0});
    check_case("{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w1\"]},"
               "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":2,\"op\":\"avg\"}}",
               "{\"name\":\"y\"}", (counts){0, 1, 0, 0, 0});
    check_case("{\"name\":\"flat\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,8]}},"
               "{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"flat\",\"wt\"],\"attrs\":{\"transpose_b\":true}},"
               "{\"name\":\"ov\",\"op\":\"view\",\"inputs\":[\"o\"],\"attrs\":{\"shape\":[-1,2,6]}},"
               "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"ov\"],\"attrs\":{\"dim\":1}}",
               "{\"name\":\"y\"}", (counts){0, 1, 0, 0, 0});
}
END_TEST

/* The cpu kernels multiply a gathered input at once, and a product for
 * every destination at once, only while that fits OPS_COPY_MAX_BYTES
 * (256 KiB) of scratch: x [B, 4096, 8] gathers 128 KiB a row, so batches
 * 1 and 2 take that path and batch 3 (run in the bucket of 4) goes shard
 * by shard and destination by destination, without the copy. Both give
 * the unfused numbers, on every rank's rows (y gathered from both). */
START_TEST(large_rows_shard_by_shard)
{
    check_case_seq(AG ",{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]},"
                      "{\"name\":\"r\",\"op\":\"relu\",\"inputs\":[\"h\"]},"
                      "{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"r\",\"wd\"]},"
                      "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":1,\"op\":\"sum\"}}",
                   "{\"name\":\"y\",\"placement\":\"shard(1)\"}", (counts){1, 1, 0, 0, 0}, 4096, 3);
}
END_TEST

START_TEST(matmul_with_other_reader_is_left_alone)
{
    check_case("{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w1\"]},"
               "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":2}},"
               "{\"name\":\"z\",\"op\":\"relu\",\"inputs\":[\"o\"]}",
               "{\"name\":\"y\"},{\"name\":\"z\"}", (counts){0, 0, 0, 1, 0});
    /* the matmul is itself a graph output: it must be materialized */
    check_case("{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w1\"]},"
               "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":2}}",
               "{\"name\":\"y\"},{\"name\":\"o\"}", (counts){0, 0, 0, 1, 0});
}
END_TEST

#define HALVES(src, d) \
    "{\"name\":\"s0\",\"op\":\"slice\",\"inputs\":[\"" src "\"],\"attrs\":{\"dim\":" d ",\"start\":0,\"length\":LEN}}," \
    "{\"name\":\"s1\",\"op\":\"slice\",\"inputs\":[\"" src "\"],\"attrs\":{\"dim\":" d ",\"start\":LEN,\"length\":LEN}},"

static void check_with_len(const char *tmpl, const char *len, const char *outputs, counts want)
{
    char nodes[2048];
    const char *p = tmpl;
    size_t o = 0;
    while (*p && o < sizeof nodes - 8) { /* LEN -> len */
        if (strncmp(p, "LEN", 3) == 0) {
            o += (size_t)snprintf(nodes + o, sizeof nodes - o, "%s", len);
            p += 3;
        } else {
            nodes[o++] = *p++;
        }
    }
    nodes[o] = 0;
    check_case(nodes, outputs, want);
}

START_TEST(gather_through_slice_cat_reassembly)
{
    /* gathered sequence halves stacked on the batch dim, then matmul */
    check_with_len(AG "," HALVES("xg", "1")
                   "{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[\"s0\",\"s1\"],\"attrs\":{\"dim\":0}},"
                   "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w1\"]}",
                   "2", "{\"name\":\"h\"}", (counts){1, 0, 0, 0, 0});
    /* the halves swapped on the gather dim itself */
    check_with_len(AG "," HALVES("xg", "1")
                   "{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[\"s1\",\"s0\"],\"attrs\":{\"dim\":1}},"
                   "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w1\"]}",
                   "2", "{\"name\":\"h\"}", (counts){1, 0, 0, 0, 0});
    /* slices that miss rows are a selection, not a permutation: left alone */
    check_with_len(AG "," HALVES("xg", "1")
                   "{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[\"s0\",\"s1\"],\"attrs\":{\"dim\":0}},"
                   "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w1\"]}",
                   "1", "{\"name\":\"h\"}", (counts){0, 0, 1, 0, 2});
}
END_TEST

START_TEST(matmul_slice_cat_reduce_scatter)
{
    check_with_len("{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w1\"]}," HALVES("o", "1")
                   "{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[\"s1\",\"s0\"],\"attrs\":{\"dim\":1}},"
                   "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"c\"],\"attrs\":{\"dim\":1}}",
                   "1", "{\"name\":\"y\"}", (counts){0, 1, 0, 0, 0});
    check_with_len("{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w1\"]}," HALVES("o", "1")
                   "{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[\"s0\",\"s1\"],\"attrs\":{\"dim\":0}},"
                   "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"c\"],\"attrs\":{\"dim\":0,\"op\":\"avg\"}}",
                   "1", "{\"name\":\"y\"}", (counts){0, 1, 0, 0, 0});
}
END_TEST

/* ------------------------------------------------------------------
 * The two repros of the PyTorch issue fuse_tp answers, as functional
 * collectives lower gather_dim / scatter_dim 1, at world d:
 *   AG: x local [64, K] -> all_gather(dim 0) -> narrow(0, 64j, 64), j < d
 *       -> cat(dim 1) [64, dK] -> matmul w [dK, N]   (= all_gather on K)
 *   RS: y = x @ w [M, 8d] -> narrow(1, 8j, 8), j < d -> cat(dim 0) [dM, 8]
 *       -> reduce_scatter(avg, dim 0)                 (= scatter of N)
 * and the variants that must be left alone. */

enum { AG_K = 8, AG_N = 6, AG_ROWS = 64, RS_M = 4, RS_K = 12, RS_COLS = 8 };

typedef struct {
    int world;
    int chunks;          /* slices in the cat (d for the fusing forms) */
    int64_t len;         /* rows (AG) or columns (RS) per slice */
    int swap;            /* the first two slices in the cat swapped */
    const char *extra;   /* more nodes (a second reader), or "" */
    const char *outputs; /* more outputs, or "" */
    int row_cat;         /* AG only: x [64d, 2, K], the chunks cat on dim 1 (rows), not K */
} chunk_form;

static float x_buf[4 * AG_ROWS * 2 * AG_K], w_buf[4 * AG_K * AG_N + RS_K * 4 * RS_COLS];

/* The form's node list: the source `src` sliced on slice_dim, cat on
 * cat_dim, then `tail` (the node reading the cat). */
static void chunk_nodes(char *buf, size_t cap, const chunk_form *f, const char *head, const char *src,
                        int slice_dim, int cat_dim, const char *tail)
{
    size_t o = (size_t)snprintf(buf, cap, "%s", head);
    for (int j = 0; j < f->chunks; j++)
        o += (size_t)snprintf(buf + o, cap - o,
                              ",{\"name\":\"s%d\",\"op\":\"slice\",\"inputs\":[\"%s\"],\"attrs\":{\"dim\":%d,"
                              "\"start\":%lld,\"length\":%lld}}",
                              j, src, slice_dim, (long long)(j * f->len), (long long)f->len);
    o += (size_t)snprintf(buf + o, cap - o, ",{\"name\":\"c\",\"op\":\"cat\",\"inputs\":[");
    for (int j = 0; j < f->chunks; j++) {
        int k = f->swap && j < 2 ? 1 - j : j;
        o += (size_t)snprintf(buf + o, cap - o, "%s\"s%d\"", j ? "," : "", k);
    }
    snprintf(buf + o, cap - o, "],\"attrs\":{\"dim\":%d}},%s%s%s", cat_dim, tail, *f->extra ? "," : "", f->extra);
}

/* Writes the AG (rs = 0) or RS (rs = 1) form into a temp dir. */
static void write_chunk_form(const chunk_form *f, int rs, char *dir, char *path)
{
    int d = f->world;
    char nodes[4096], json[8192];
    int64_t ws[2];
    char xshape[64];
    if (!rs) {
        snprintf(xshape, sizeof xshape, f->row_cat ? "%d,2,%d" : "%d,%d", AG_ROWS * d, AG_K);
        ws[0] = f->row_cat ? AG_K : (int64_t)f->chunks * AG_K, ws[1] = AG_N;
        chunk_nodes(nodes, sizeof nodes, f, "{\"name\":\"y\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":0}}",
                    "y", 0, 1, "{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w\"]}");
    } else {
        snprintf(xshape, sizeof xshape, "%d,%d", RS_M, RS_K);
        ws[0] = RS_K, ws[1] = (int64_t)RS_COLS * d;
        chunk_nodes(nodes, sizeof nodes, f, "{\"name\":\"y\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]}", "y", 1, 0,
                    "{\"name\":\"o\",\"op\":\"reduce_scatter\",\"inputs\":[\"c\"],\"attrs\":{\"dim\":0,\"op\":\"avg\"}}");
    }
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"chunks\",\"world_size\":%d,\"weights\":\"w.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[%s],\"placement\":\"shard(%d)\"}],"
             "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],\"placement\":\"%s\"}],"
             "\"nodes\":[%s],\"outputs\":[{\"name\":\"o\",\"placement\":\"%s\"}%s%s]}",
             d, xshape, rs, (long long)ws[0], (long long)ws[1],
             rs ? "shard(0)" : "replicate", nodes, rs ? "shard(1)" : "replicate", *f->outputs ? "," : "", f->outputs);
    st_write_item w = {"w", TP_F32, 2, ws, w_buf};
    tu_write_graph(dir, path, json, &w, 1);
}

/* The graph at path with passes and ranks in processes (`tpserve worker`,
 * $TPSERVE as `make unit` sets it) gives the numbers it gives without
 * passes with ranks as threads. */
static void expect_processes_same_as_unfused(const char *path, const tp_host_tensor *in)
{
    expect_same_as_unfused_by(tu_engine_processes(path), path, in, 1);
}

/* Every fused node is the direct form of the collective on the cat dim:
 * no pieces left to permute, `dim` the dim the cat was on. */
static void expect_direct_form(const char *path, int dim)
{
    tp_graph *g = tu_load_passed(path, 2, NULL);
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].op == TP_OP_FUSED_AG_MM || g->nodes[i].op == TP_OP_FUSED_MM_RS) {
            ck_assert_int_eq(g->nodes[i].attrs.n_pieces, 0);
            ck_assert_int_eq(g->nodes[i].attrs.dim, dim);
        }
    tp_graph_free(g);
}

/* Counts after passes, then numbers against the unfused graph (threads,
 * and processes when the form fuses). */
static void check_chunk_form(const chunk_form *f, int rs, counts want)
{
    char dir[64], path[128];
    write_chunk_form(f, rs, dir, path);
    expect_counts(path, want);
    /* AG: all_gather on the cat dim (K = 1, or rows = 1 of [64, 2d, K]);
     * RS: reduce_scatter on the slices' dim (1, the columns) */
    expect_direct_form(path, 1);
    int64_t ag_shape[3] = {(int64_t)AG_ROWS * f->world, f->row_cat ? 2 : AG_K, AG_K}, rs_shape[2] = {RS_M, RS_K};
    tp_host_tensor in = rs ? tu_f32("x", x_buf, 2, rs_shape) : tu_f32("x", x_buf, f->row_cat ? 3 : 2, ag_shape);
    expect_same_as_unfused(path, &in, 1);
    if (want.fused_ag + want.fused_rs > 0)
        expect_processes_same_as_unfused(path, &in);
    tu_rmdir(dir);
}

/* The fused forms at world d: one fused node, nothing of the reassembly.
 * Also the gathered chunks cat on a row dim (the plain fused gather along
 * it) and cat on K read by two matmuls (one rank-ordered sum each). */
static void check_fuses_at(int d)
{
    chunk_form ag = {d, d, AG_ROWS, 0, "", "", 0}, rs = {d, d, RS_COLS, 0, "", "", 0};
    check_chunk_form(&ag, 0, (counts){1, 0, 0, 0, 0});
    check_chunk_form(&rs, 1, (counts){0, 1, 0, 0, 0});
    chunk_form rows = {d, d, AG_ROWS, 0, "", "", 1};
    check_chunk_form(&rows, 0, (counts){1, 0, 0, 0, 0});
    chunk_form two = {d, d, AG_ROWS, 0, "{\"name\":\"o2\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w\"]}",
                      "{\"name\":\"o2\",\"placement\":\"replicate\"}", 0};
    check_chunk_form(&two, 0, (counts){2, 0, 0, 0, 0});
}

START_TEST(repro_chunks_cat_world_2)
{
    check_fuses_at(2);
}
END_TEST

START_TEST(chunks_cat_world_3)
{
    check_fuses_at(3);
}
END_TEST

START_TEST(chunks_cat_world_4)
{
    check_fuses_at(4);
}
END_TEST

/* Each refusal at world 2 and 3: the gather or reduce_scatter, all slices
 * and the cat stay; numbers still match. */
static void check_left_alone(int d, int chunks, int64_t ag_len, int64_t rs_len, int swap, const char *extra,
                             const char *outputs)
{
    chunk_form ag = {d, chunks, ag_len, swap, extra, outputs, 0}, rs = {d, chunks, rs_len, swap, extra, outputs, 0};
    check_chunk_form(&ag, 0, (counts){0, 0, 1, 0, chunks});
    check_chunk_form(&rs, 1, (counts){0, 0, 0, 1, chunks});
}

START_TEST(chunks_in_another_order_left_alone)
{
    for (int d = 2; d <= 3; d++)
        check_left_alone(d, d, AG_ROWS, RS_COLS, 1, "", "");
}
END_TEST

START_TEST(partial_coverage_left_alone)
{
    for (int d = 2; d <= 3; d++) /* d slices, each half a chunk: half the rows (columns) */
        check_left_alone(d, d, AG_ROWS / 2, RS_COLS / 2, 0, "", "");
}
END_TEST

START_TEST(chunk_count_other_than_world_left_alone)
{
    for (int d = 2; d <= 3; d++) /* 2d slices of half a chunk: all rows, in order */
        check_left_alone(d, 2 * d, AG_ROWS / 2, RS_COLS / 2, 0, "", "");
}
END_TEST

START_TEST(slice_or_cat_with_another_reader_left_alone)
{
    for (int d = 2; d <= 3; d++) {
        check_left_alone(d, d, AG_ROWS, RS_COLS, 0, "{\"name\":\"e\",\"op\":\"relu\",\"inputs\":[\"s1\"]}",
                         "{\"name\":\"e\"}");
        check_left_alone(d, d, AG_ROWS, RS_COLS, 0, "", "{\"name\":\"c\"}");
    }
    /* the gathered tensor read by something else too */
    chunk_form ag = {2, 2, AG_ROWS, 0, "{\"name\":\"e\",\"op\":\"relu\",\"inputs\":[\"y\"]}", "{\"name\":\"e\"}", 0};
    check_chunk_form(&ag, 0, (counts){0, 0, 1, 0, 2});
}
END_TEST

Suite *fuse_suite(void)
{
    tu_fill(w1, 48, 1);
    tu_fill(w2, 32, 2);
    tu_fill(w3, 48, 3);
    tu_fill(wd, 48, 4);
    tu_fill(wt, 48, 5);
    tu_fill(x_buf, (int64_t)(sizeof x_buf / sizeof x_buf[0]), 6);
    tu_fill(w_buf, (int64_t)(sizeof w_buf / sizeof w_buf[0]), 7);
    Suite *s = suite_create("pass_fuse_tp");
    TCase *tc = tcase_create("fuse");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gather_matmul_fuses);
    tcase_add_test(tc, qkv_share_one_gather);
    tcase_add_test(tc, gather_through_view);
    tcase_add_test(tc, gather_kept_for_other_readers);
    tcase_add_test(tc, gather_on_k);
    tcase_add_test(tc, matmul_reduce_scatter_fuses);
    tcase_add_test(tc, large_rows_shard_by_shard);
    tcase_add_test(tc, matmul_with_other_reader_is_left_alone);
    tcase_add_test(tc, gather_through_slice_cat_reassembly);
    tcase_add_test(tc, matmul_slice_cat_reduce_scatter);
    suite_add_tcase(s, tc);
    TCase *ck = tcase_create("chunks_cat");
    tcase_set_timeout(ck, 120);
    tcase_add_test(ck, repro_chunks_cat_world_2);
    tcase_add_test(ck, chunks_cat_world_3);
    tcase_add_test(ck, chunks_cat_world_4);
    tcase_add_test(ck, chunks_in_another_order_left_alone);
    tcase_add_test(ck, partial_coverage_left_alone);
    tcase_add_test(ck, chunk_count_other_than_world_left_alone);
    tcase_add_test(ck, slice_or_cat_with_another_reader_left_alone);
    suite_add_tcase(s, ck);
    return s;
}

TP_CHECK_MAIN(fuse_suite)
