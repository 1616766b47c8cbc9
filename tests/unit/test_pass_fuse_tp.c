/* fuse_tp on hand-written graphs: what must fuse, what must be left alone,
 * and identical numbers with the pass on and off. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "testutil.h"

static float w1[8 * 6], w2[8 * 4], w3[8 * 6], wd[6 * 8], wt[6 * 8];
static const int64_t s86[2] = {8, 6}, s84[2] = {8, 4}, s68[2] = {6, 8};

typedef struct {
    int fused_ag, fused_rs, all_gathers, reduce_scatters, slices;
} counts;

/* Builds a world-2 graph around `nodes`, checks op counts after passes and
 * that every output matches the unfused graph. */
static void check_case(const char *nodes, const char *outputs, counts want)
{
    char json[4096], dir[64], path[128];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"f\",\"world_size\":2,\"weights\":\"w.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",4,8],\"placement\":\"shard(1)\"}],"
             "\"params\":[{\"name\":\"w1\",\"datatype\":\"FP32\",\"shape\":[8,6],\"placement\":\"replicate\"},"
             "{\"name\":\"w2\",\"datatype\":\"FP32\",\"shape\":[8,4],\"placement\":\"replicate\"},"
             "{\"name\":\"w3\",\"datatype\":\"FP32\",\"shape\":[8,6],\"placement\":\"replicate\"},"
             "{\"name\":\"wd\",\"datatype\":\"FP32\",\"shape\":[6,8],\"placement\":\"replicate\"},"
             "{\"name\":\"wt\",\"datatype\":\"FP32\",\"shape\":[6,8],\"placement\":\"replicate\"}],"
             "\"nodes\":[%s],\"outputs\":[%s]}", nodes, outputs);
    st_write_item items[] = {{"w1", TP_F32, 2, s86, w1}, {"w2", TP_F32, 2, s84, w2}, {"w3", TP_F32, 2, s86, w3},
                             {"wd", TP_F32, 2, s68, wd}, {"wt", TP_F32, 2, s68, wt}};
    tu_write_graph(dir, path, json, items, 5);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    ck_assert_int_eq(tu_count_op(g, TP_OP_FUSED_AG_MM), want.fused_ag);
    ck_assert_int_eq(tu_count_op(g, TP_OP_FUSED_MM_RS), want.fused_rs);
    ck_assert_int_eq(tu_count_op(g, TP_OP_ALL_GATHER), want.all_gathers);
    ck_assert_int_eq(tu_count_op(g, TP_OP_REDUCE_SCATTER), want.reduce_scatters);
    ck_assert_int_eq(tu_count_op(g, TP_OP_SLICE), want.slices);
    tp_graph_free(g);
    for (int64_t batch = 1; batch <= 3; batch++) {
        float x[3 * 4 * 8];
        tu_fill(x, 3 * 4 * 8, (unsigned)batch);
        int64_t shape[3] = {batch, 4, 8};
        tp_host_tensor in = tu_f32("x", x, 3, shape);
        tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
        int n1, n2;
        tp_host_tensor *a = tu_infer(on, &in, 1, &n1), *b = tu_infer(off, &in, 1, &n2);
        ck_assert_int_eq(n1, n2);
        double diff = tu_rel_diff(a, b, n1);
        ck_assert_msg(diff <= TU_RTOL_REORDER, "fused vs unfused differ by %g", diff);
        tp_host_tensors_free(a, n1);
        tp_host_tensors_free(b, n2);
        tp_engine_free(on);
        tp_engine_free(off);
    }
    tu_rmdir(dir);
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

Suite *fuse_suite(void)
{
    tu_fill(w1, 48, 1);
    tu_fill(w2, 32, 2);
    tu_fill(w3, 48, 3);
    tu_fill(wd, 48, 4);
    tu_fill(wt, 48, 5);
    Suite *s = suite_create("pass_fuse_tp");
    TCase *tc = tcase_create("fuse");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, gather_matmul_fuses);
    tcase_add_test(tc, qkv_share_one_gather);
    tcase_add_test(tc, gather_through_view);
    tcase_add_test(tc, gather_kept_for_other_readers);
    tcase_add_test(tc, gather_on_k);
    tcase_add_test(tc, matmul_reduce_scatter_fuses);
    tcase_add_test(tc, matmul_with_other_reader_is_left_alone);
    tcase_add_test(tc, gather_through_slice_cat_reassembly);
    tcase_add_test(tc, matmul_slice_cat_reduce_scatter);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(fuse_suite)
