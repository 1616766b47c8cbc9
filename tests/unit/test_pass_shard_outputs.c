/* shard_outputs: an output slice(all_gather(x)) from 0 becomes x placed
 * shard(d) cut to the slice's length, the gather and slice gone, with the
 * same numbers as the graph without passes (only copies differ: exact),
 * with ranks as threads and as processes; anything else is left alone. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "safetensors.h"
#include "testutil.h"

#define K 6
#define N 10 /* the weight's columns: 5 a rank at world size 2 */

static float w_buf[K * N];

/* y = x . w with w column-parallel, gathered on the last dim and cut to
 * `length` columns, output as `placement`; `extra`: more outputs. */
static void write_graph(int length, int start, const char *extra, char *dir, char *path)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"cut\",\"world_size\":2,\"weights\":\"w.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",4,%d]}],"
             "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[%d,%d],\"placement\":\"shard(1)\"}],"
             "\"nodes\":[{\"name\":\"y.local\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]},"
             "{\"name\":\"y.all\",\"op\":\"all_gather\",\"inputs\":[\"y.local\"],\"attrs\":{\"dim\":2}},"
             "{\"name\":\"y\",\"op\":\"slice\",\"inputs\":[\"y.all\"],\"attrs\":{\"dim\":-1,\"start\":%d,\"length\":%d}}],"
             "\"outputs\":[{\"name\":\"y\"}%s]}",
             K, K, N, start, length, extra);
    tu_fill(w_buf, K * N, 3);
    int64_t ws[2] = {K, N};
    st_write_item w = {"w", TP_F32, 2, ws, w_buf};
    tu_write_graph(dir, path, json, &w, 1);
}

/* The engine's output for a batch of 3, with passes on or off, ranks as
 * threads or processes. */
static tp_host_tensor *infer(const char *path, int passes, int procs, int *n_out)
{
    float x[3 * 4 * K];
    tu_fill(x, 3 * 4 * K, 9);
    int64_t shape[3] = {3, 4, K};
    tp_host_tensor in = tu_f32("x", x, 3, shape);
    tp_engine *e = procs ? tu_engine_processes(path) : tu_engine(path, passes, 0);
    tp_host_tensor *out = tu_infer(e, &in, 1, n_out);
    tp_engine_free(e);
    return out;
}

/* Passes on (threads, processes) give the unpassed graph's bytes: the
 * output is copied, never computed differently. */
static void same_bytes_as_unpassed(const char *path, int64_t cols)
{
    int n0, n1, n2;
    tp_host_tensor *ref = infer(path, 0, 0, &n0), *on = infer(path, 1, 0, &n1), *procs = infer(path, 1, 1, &n2);
    ck_assert_int_eq(n1, n0);
    ck_assert_int_eq(n2, n0);
    ck_assert_int_eq(ref[0].shape[2], cols);
    for (int i = 0; i < n0; i++) {
        ck_assert_int_eq((int)on[i].nbytes, (int)ref[i].nbytes);
        ck_assert_msg(memcmp(on[i].data, ref[i].data, ref[i].nbytes) == 0, "output %d differs with passes", i);
        ck_assert_msg(memcmp(procs[i].data, ref[i].data, ref[i].nbytes) == 0, "output %d differs in processes", i);
    }
    tp_host_tensors_free(ref, n0);
    tp_host_tensors_free(on, n1);
    tp_host_tensors_free(procs, n2);
}

START_TEST(cut_gather_becomes_a_cut_shard)
{
    /* 7 of 10: rank 0 gives its 5 columns, rank 1 two of its 5; 3 of 10:
     * rank 1 gives none */
    const int lengths[] = {7, 3, N};
    for (size_t t = 0; t < sizeof lengths / sizeof *lengths; t++) {
        char dir[64], path[128], pl[64];
        write_graph(lengths[t], 0, "", dir, path);
        tp_graph *g = tu_load_passed(path, 2, NULL);
        ck_assert_int_eq(tu_count_op(g, TP_OP_ALL_GATHER), 0);
        ck_assert_int_eq(tu_count_op(g, TP_OP_SLICE), 0);
        int y = tp_graph_find(g, "y");
        ck_assert_int_ge(y, 0);
        ck_assert_int_eq(g->nodes[y].op, TP_OP_MATMUL);
        ck_assert_int_eq(g->output_ids[0], y);
        ck_assert_str_eq(tp_placement_str(g->output_place[0], pl, sizeof pl),
                         lengths[t] == N ? "shard(2) cut to 10" : lengths[t] == 7 ? "shard(2) cut to 7"
                                                                                 : "shard(2) cut to 3");
        int64_t shape[TP_MAX_DIMS];
        ck_assert_int_eq(tp_graph_output_shape(g, 0, shape), 3);
        ck_assert_int_eq(shape[2], lengths[t]);
        tp_graph_free(g);
        same_bytes_as_unpassed(path, lengths[t]);
        tu_rmdir(dir);
    }
}
END_TEST

/* The graph of write_graph(length, start, extra) keeps its gather and its
 * replicated output, with the same bytes. */
static void expect_left_alone(int length, int start, const char *extra)
{
    char dir[64], path[128];
    write_graph(length, start, extra, dir, path);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    ck_assert_int_eq(tu_count_op(g, TP_OP_ALL_GATHER), 1);
    ck_assert_int_eq(g->output_place[0].kind, TP_PLACE_REPLICATE);
    tp_graph_free(g);
    same_bytes_as_unpassed(path, length);
    tu_rmdir(dir);
}

/* A gather along dim 0 (it may be the batch) cut back is left as it is. */
static void expect_left_alone_rows(void)
{
    char dir[64], path[128], json[2048];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"rows\",\"world_size\":2,"
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[4,6],\"placement\":\"shard(0)\"}],"
             "\"nodes\":[{\"name\":\"y.all\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":0}},"
             "{\"name\":\"y\",\"op\":\"slice\",\"inputs\":[\"y.all\"],\"attrs\":{\"dim\":0,\"start\":0,\"length\":3}}],"
             "\"outputs\":[{\"name\":\"y\"}]}");
    tu_write_graph(dir, path, json, NULL, 0);
    tp_graph *g = tu_load_passed(path, 1, NULL);
    ck_assert_int_eq(tu_count_op(g, TP_OP_ALL_GATHER), 1);
    ck_assert_int_eq(g->output_place[0].kind, TP_PLACE_REPLICATE);
    tp_graph_free(g);
    tu_rmdir(dir);
}

START_TEST(other_outputs_left_alone)
{
    expect_left_alone(5, 2, "");                          /* the slice does not start at 0 */
    expect_left_alone(7, 0, ",{\"name\":\"y.all\"}"); /* the gather is an output too */
    /* the local product is an output already (shard(2), as written) */
    expect_left_alone(7, 0, ",{\"name\":\"y.local\",\"placement\":\"shard(2)\"}");
    expect_left_alone_rows();
}
END_TEST

static Suite *shard_outputs_suite(void)
{
    Suite *s = suite_create("pass_shard_outputs");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, cut_gather_becomes_a_cut_shard);
    tcase_add_test(t, other_outputs_left_alone);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(shard_outputs_suite)
