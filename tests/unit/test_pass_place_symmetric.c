/* place_symmetric: computed values go to the symmetric arena, graph inputs
 * get a symmetric slot, params and fallback outputs an identity copy shared
 * by their readers; numbers unchanged. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "testutil.h"

static float w[6 * 6];
static const int64_t s66[2] = {6, 6};

START_TEST(three_cases)
{
    char dir[64], path[128];
    const char *json =
        "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"p\",\"world_size\":2,\"weights\":\"w.safetensors\","
        "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",6]},"
        "{\"name\":\"y\",\"datatype\":\"FP32\",\"shape\":[\"B\",6]}],"
        "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[6,6]}],"
        "\"nodes\":[{\"name\":\"ax\",\"op\":\"all_reduce\",\"inputs\":[\"x\"]},"
        "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"y\",\"w\"]},"
        "{\"name\":\"ah\",\"op\":\"all_reduce\",\"inputs\":[\"h\"]},"
        "{\"name\":\"f\",\"op\":\"relu\",\"inputs\":[\"h\"],\"fallback\":true},"
        "{\"name\":\"af\",\"op\":\"all_reduce\",\"inputs\":[\"f\"]},"
        "{\"name\":\"af2\",\"op\":\"all_reduce\",\"inputs\":[\"f\"],\"attrs\":{\"op\":\"max\"}},"
        "{\"name\":\"aw\",\"op\":\"broadcast\",\"inputs\":[\"w\"],\"attrs\":{\"src\":1}},"
        "{\"name\":\"o\",\"op\":\"add\",\"inputs\":[\"ax\",\"ah\"]},"
        "{\"name\":\"o2\",\"op\":\"add\",\"inputs\":[\"af\",\"af2\"]}],"
        "\"outputs\":[{\"name\":\"o\"},{\"name\":\"o2\"},{\"name\":\"aw\"}]}";
    st_write_item item = {"w", TP_F32, 2, s66, w};
    tu_fill(w, 36, 9);
    tu_write_graph(dir, path, json, &item, 1);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    ck_assert(g->nodes[tp_graph_find(g, "x")].symmetric);  /* input: symmetric slot */
    ck_assert(!g->nodes[tp_graph_find(g, "y")].symmetric); /* not read by peers */
    ck_assert(g->nodes[tp_graph_find(g, "h")].symmetric);  /* computed: zero copy */
    ck_assert_int_eq(tu_count_op(g, TP_OP_IDENTITY_COPY), 2); /* f (shared) and w */
    int fc = tp_graph_find(g, "f.symmetric"), wc = tp_graph_find(g, "w.symmetric");
    ck_assert_int_ge(fc, 0);
    ck_assert_int_ge(wc, 0);
    ck_assert_int_eq(g->nodes[tp_graph_find(g, "af")].inputs[0], fc);
    ck_assert_int_eq(g->nodes[tp_graph_find(g, "af2")].inputs[0], fc);
    ck_assert_int_eq(g->nodes[tp_graph_find(g, "aw")].inputs[0], wc);
    ck_assert(!g->nodes[tp_graph_find(g, "f")].symmetric);
    tp_graph_free(g);

    float x[2 * 6], y[2 * 6];
    tu_fill(x, 12, 1);
    tu_fill(y, 12, 2);
    int64_t shape[2] = {2, 6};
    tp_host_tensor in[2] = {tu_f32("x", x, 2, shape), tu_f32("y", y, 2, shape)};
    tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
    int n1, n2;
    tp_host_tensor *a = tu_infer(on, in, 2, &n1), *b = tu_infer(off, in, 2, &n2);
    ck_assert(tu_rel_diff(a, b, n1) <= TU_RTOL_REORDER);
    tp_engine_stats st;
    tp_engine_get_stats(on, &st);
    ck_assert_int_eq(st.symmetric_copy_bytes, sizeof x * 2); /* x, into both ranks' slots */
    ck_assert_int_eq(st.regular_copy_bytes, sizeof y * 2);
    tp_host_tensors_free(a, n1);
    tp_host_tensors_free(b, n2);
    tp_engine_free(on);
    tp_engine_free(off);
    tu_rmdir(dir);
}
END_TEST

Suite *place_suite(void)
{
    Suite *s = suite_create("pass_place_symmetric");
    TCase *tc = tcase_create("place");
    tcase_add_test(tc, three_cases);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(place_suite)
