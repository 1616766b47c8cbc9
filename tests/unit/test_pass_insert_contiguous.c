/* insert_contiguous: a copy only before collectives that read a strided
 * view, shared between them, never before a contiguous input. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "testutil.h"

static tp_graph *passed(const char *nodes, const char *outputs, char *dir, char *path)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"c\",\"world_size\":2,"
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",4,6]}],"
             "\"nodes\":[%s],\"outputs\":[%s]}", nodes, outputs);
    tu_write_graph(dir, path, json, NULL, 0);
    return tu_load_passed(path, 2, NULL);
}

static void same_numbers(const char *path)
{
    float x[3 * 4 * 6];
    tu_fill(x, 72, 7);
    int64_t shape[3] = {3, 4, 6};
    tp_host_tensor in = tu_f32("x", x, 3, shape);
    tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
    int n1, n2;
    tp_host_tensor *a = tu_infer(on, &in, 1, &n1), *b = tu_infer(off, &in, 1, &n2);
    ck_assert(tu_rel_diff(a, b, n1) == 0.0); /* copies and collectives are exact */
    tp_host_tensors_free(a, n1);
    tp_host_tensors_free(b, n2);
    tp_engine_free(on);
    tp_engine_free(off);
}

START_TEST(strided_view_gets_one_shared_copy)
{
    char dir[64], path[128];
    tp_graph *g = passed("{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":1,\"dim1\":2}},"
                         "{\"name\":\"a\",\"op\":\"all_gather\",\"inputs\":[\"t\"],\"attrs\":{\"dim\":1}},"
                         "{\"name\":\"r\",\"op\":\"all_reduce\",\"inputs\":[\"t\"]}",
                         "{\"name\":\"a\"},{\"name\":\"r\"}", dir, path);
    ck_assert_int_eq(tu_count_op(g, TP_OP_CONTIGUOUS), 1);
    int c = tp_graph_find(g, "t.contiguous");
    ck_assert_int_ge(c, 0);
    ck_assert_int_eq(g->nodes[tp_graph_find(g, "a")].inputs[0], c);
    ck_assert_int_eq(g->nodes[tp_graph_find(g, "r")].inputs[0], c);
    ck_assert_int_eq(g->nodes[c].storage, c); /* a real copy */
    tp_graph_free(g);
    same_numbers(path);
    tu_rmdir(dir);
}
END_TEST

START_TEST(contiguous_inputs_are_left_alone)
{
    char dir[64], path[128];
    /* a slice on the outermost non-batch dim of [B,4,6] over all of dim 2 is
     * contiguous per batch row only when B = 1, so slice the batch-free
     * view instead: view [-1, 6] rows stay contiguous. */
    tp_graph *g = passed("{\"name\":\"v\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,6]}},"
                         "{\"name\":\"a\",\"op\":\"all_gather\",\"inputs\":[\"v\"],\"attrs\":{\"dim\":0}},"
                         "{\"name\":\"r\",\"op\":\"all_reduce\",\"inputs\":[\"x\"]}",
                         "{\"name\":\"a\"},{\"name\":\"r\"}", dir, path);
    ck_assert_int_eq(tu_count_op(g, TP_OP_CONTIGUOUS), 0);
    tp_graph_free(g);
    same_numbers(path);
    tu_rmdir(dir);
}
END_TEST

START_TEST(slice_that_is_strided_only_for_larger_batches)
{
    char dir[64], path[128];
    /* [B,4,6] sliced to [B,2,6] is contiguous at B=1 but not at B=2 */
    tp_graph *g = passed("{\"name\":\"s\",\"op\":\"slice\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1,\"start\":1,\"length\":2}},"
                         "{\"name\":\"r\",\"op\":\"all_reduce\",\"inputs\":[\"s\"],\"attrs\":{\"op\":\"max\"}}",
                         "{\"name\":\"r\"}", dir, path);
    ck_assert_int_eq(tu_count_op(g, TP_OP_CONTIGUOUS), 1);
    tp_graph_free(g);
    same_numbers(path);
    tu_rmdir(dir);
}
END_TEST

START_TEST(all_to_all_reads_views_directly)
{
    char dir[64], path[128];
    tp_graph *g = passed("{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":1,\"dim1\":2}},"
                         "{\"name\":\"a\",\"op\":\"all_to_all\",\"inputs\":[\"t\"],\"attrs\":{\"split_dim\":1,\"concat_dim\":2}}",
                         "{\"name\":\"a\"}", dir, path);
    ck_assert_int_eq(tu_count_op(g, TP_OP_CONTIGUOUS), 0);
    tp_graph_free(g);
    same_numbers(path);
    tu_rmdir(dir);
}
END_TEST

Suite *insert_contiguous_suite(void)
{
    Suite *s = suite_create("pass_insert_contiguous");
    TCase *tc = tcase_create("insert");
    tcase_add_test(tc, strided_view_gets_one_shared_copy);
    tcase_add_test(tc, contiguous_inputs_are_left_alone);
    tcase_add_test(tc, slice_that_is_strided_only_for_larger_batches);
    tcase_add_test(tc, all_to_all_reads_views_directly);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(insert_contiguous_suite)
