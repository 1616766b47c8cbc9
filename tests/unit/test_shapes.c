/* Shape and stride inference: views are strided aliases with the right
 * strides and offsets; reshape/contiguous copy only when they must. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "graph.h"

static tp_graph *load_nodes(const char *nodes, const char *out)
{
    char path[] = "/tmp/tp_shapes_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"s\",\"world_size\":1,"
               "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",3,4]}],"
               "\"nodes\":[%s],\"outputs\":[{\"name\":\"%s\"}]}", nodes, out);
    fclose(f);
    tp_graph *g = NULL;
    tp_err err = {{0}};
    tp_status st = tp_graph_load(path, &g, &err);
    unlink(path);
    ck_assert_msg(st == TP_OK, "%s", err.msg);
    err.msg[0] = 0;
    ck_assert_msg(tp_graph_infer(g, 2, &err) == TP_OK, "%s", err.msg);
    return g;
}

static const tp_node *node(tp_graph *g, const char *name)
{
    int i = tp_graph_find(g, name);
    ck_assert_int_ge(i, 0);
    return &g->nodes[i];
}

static void expect(const tp_node *n, int ndim, const int64_t *shape, const int64_t *stride)
{
    ck_assert_int_eq(n->ndim, ndim);
    for (int i = 0; i < ndim; i++) {
        ck_assert_msg(n->shape[i] == shape[i], "%s shape[%d]=%lld want %lld", n->name, i, (long long)n->shape[i], (long long)shape[i]);
        ck_assert_msg(n->stride[i] == stride[i], "%s stride[%d]=%lld want %lld", n->name, i, (long long)n->stride[i], (long long)stride[i]);
    }
}

START_TEST(permute_is_a_view)
{
    tp_graph *g = load_nodes("{\"name\":\"p\",\"op\":\"permute\",\"inputs\":[\"x\"],\"attrs\":{\"dims\":[2,0,1]}}", "p");
    expect(node(g, "p"), 3, (int64_t[]){4, 2, 3}, (int64_t[]){1, 12, 4});
    ck_assert_int_eq(node(g, "p")->storage, tp_graph_find(g, "x"));
    tp_graph_free(g);
}
END_TEST

START_TEST(transpose_slice_offsets)
{
    tp_graph *g = load_nodes("{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":-1,\"dim1\":1}},"
                             "{\"name\":\"s\",\"op\":\"slice\",\"inputs\":[\"t\"],\"attrs\":{\"dim\":1,\"start\":1,\"length\":2}}", "s");
    expect(node(g, "t"), 3, (int64_t[]){2, 4, 3}, (int64_t[]){12, 1, 4});
    expect(node(g, "s"), 3, (int64_t[]){2, 2, 3}, (int64_t[]){12, 1, 4});
    ck_assert_int_eq(node(g, "s")->offset, 1);
    ck_assert_int_eq(node(g, "s")->storage, tp_graph_find(g, "x"));
    tp_graph_free(g);
}
END_TEST

START_TEST(view_of_strided_splits_a_run)
{
    /* [2,4,3] strides [12,1,4]: dim 1 (size 4, stride 1) splits into [2,2] */
    tp_graph *g = load_nodes("{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":1,\"dim1\":2}},"
                             "{\"name\":\"v\",\"op\":\"view\",\"inputs\":[\"t\"],\"attrs\":{\"shape\":[-1,2,2,3]}}", "v");
    expect(node(g, "v"), 4, (int64_t[]){2, 2, 2, 3}, (int64_t[]){12, 2, 1, 4});
    ck_assert_int_eq(node(g, "v")->storage, tp_graph_find(g, "x"));
    tp_graph_free(g);
}
END_TEST

START_TEST(reshape_copies_only_when_it_must)
{
    tp_graph *g = load_nodes("{\"name\":\"r1\",\"op\":\"reshape\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,4]}},"
                             "{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":1,\"dim1\":2}},"
                             "{\"name\":\"r2\",\"op\":\"reshape\",\"inputs\":[\"t\"],\"attrs\":{\"shape\":[-1,12]}},"
                             "{\"name\":\"c1\",\"op\":\"contiguous\",\"inputs\":[\"r1\"]},"
                             "{\"name\":\"c2\",\"op\":\"contiguous\",\"inputs\":[\"t\"]}", "r2");
    int x = tp_graph_find(g, "x");
    expect(node(g, "r1"), 2, (int64_t[]){6, 4}, (int64_t[]){4, 1});
    ck_assert_int_eq(node(g, "r1")->storage, x);               /* alias */
    expect(node(g, "r2"), 2, (int64_t[]){2, 12}, (int64_t[]){12, 1});
    ck_assert_int_eq(node(g, "r2")->storage, tp_graph_find(g, "r2")); /* copy */
    ck_assert_int_eq(node(g, "c1")->storage, x);
    ck_assert_int_eq(node(g, "c2")->storage, tp_graph_find(g, "c2"));
    expect(node(g, "c2"), 3, (int64_t[]){2, 4, 3}, (int64_t[]){12, 3, 1});
    tp_graph_free(g);
}
END_TEST

START_TEST(view_with_batch_changes)
{
    tp_graph *g = load_nodes("{\"name\":\"v\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,2,6]}}", "v");
    expect(node(g, "v"), 3, (int64_t[]){2, 2, 6}, (int64_t[]){12, 6, 1});
    tp_err err;
    ck_assert_int_eq(tp_graph_infer(g, 5, &err), TP_OK);
    expect(node(g, "v"), 3, (int64_t[]){5, 2, 6}, (int64_t[]){12, 6, 1});
    tp_graph_free(g);
}
END_TEST

START_TEST(collective_shapes)
{
    char path[] = "/tmp/tp_shapes_XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"s\",\"world_size\":4,"
               "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",8,12],\"placement\":\"shard(1)\"}],"
               "\"nodes\":[{\"name\":\"ag\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}},"
               "{\"name\":\"rs\",\"op\":\"reduce_scatter\",\"inputs\":[\"ag\"],\"attrs\":{\"dim\":-1}},"
               "{\"name\":\"a2a\",\"op\":\"all_to_all\",\"inputs\":[\"ag\"],\"attrs\":{\"split_dim\":2,\"concat_dim\":0}}],"
               "\"outputs\":[{\"name\":\"rs\"},{\"name\":\"a2a\"}]}");
    fclose(f);
    tp_graph *g;
    tp_err err;
    ck_assert_msg(tp_graph_load(path, &g, &err) == TP_OK, "%s", err.msg);
    unlink(path);
    ck_assert_int_eq(tp_graph_infer(g, 3, &err), TP_OK);
    expect(node(g, "x"), 3, (int64_t[]){3, 2, 12}, (int64_t[]){24, 12, 1});
    expect(node(g, "ag"), 3, (int64_t[]){3, 8, 12}, (int64_t[]){96, 12, 1});
    expect(node(g, "rs"), 3, (int64_t[]){3, 8, 3}, (int64_t[]){24, 3, 1});
    expect(node(g, "a2a"), 3, (int64_t[]){12, 8, 3}, (int64_t[]){24, 3, 1});
    tp_graph_free(g);
}
END_TEST

Suite *shapes_suite(void)
{
    Suite *s = suite_create("shapes");
    TCase *tc = tcase_create("views");
    tcase_add_test(tc, permute_is_a_view);
    tcase_add_test(tc, transpose_slice_offsets);
    tcase_add_test(tc, view_of_strided_splits_a_run);
    tcase_add_test(tc, reshape_copies_only_when_it_must);
    tcase_add_test(tc, view_with_batch_changes);
    tcase_add_test(tc, collective_shapes);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(shapes_suite)
