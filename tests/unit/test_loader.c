/* Loader errors one by one: each malformed graph must be refused with a
 * message naming the file, the culprit and the reason. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "plan.h"
#include "graph.h"
#include "safetensors.h"

static char dir[64];

static void write_file(const char *name, const char *text)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void setup(void)
{
    strcpy(dir, "/tmp/tp_loader_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    float w[4 * 6] = {0};
    int32_t ids[4] = {0};
    int64_t ws[2] = {4, 6}, is[1] = {4};
    st_write_item items[] = {{"w", TP_F32, 2, ws, w}, {"ids", TP_I32, 1, is, ids}};
    char p[256];
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    tp_err err;
    ck_assert_int_eq(st_write(p, items, 2, &err), TP_OK);
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}

/* A valid graph with placeholders: %s for params, nodes and outputs. */
static const char *HEAD = "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"t\",\"world_size\":2,"
                          "\"weights\":\"w.safetensors\","
                          "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",3,4],\"placement\":\"replicate\"}],";

static tp_status load_text(const char *body, tp_graph **g, tp_err *err)
{
    char text[4096];
    snprintf(text, sizeof text, "%s%s}", HEAD, body);
    write_file("g.json", text);
    char p[256];
    snprintf(p, sizeof p, "%s/g.json", dir);
    return tp_graph_load(p, g, err);
}

static void expect_error(const char *body, const char *part1, const char *part2)
{
    tp_graph *g = NULL;
    tp_err err = {{0}};
    tp_status st = load_text(body, &g, &err);
    ck_assert_msg(st != TP_OK, "graph unexpectedly loaded: %s", body);
    ck_assert_ptr_null(g);
    ck_assert_msg(strstr(err.msg, "g.json") != NULL, "no file name in: %s", err.msg);
    ck_assert_msg(strstr(err.msg, part1) != NULL, "'%s' not in: %s", part1, err.msg);
    if (part2)
        ck_assert_msg(strstr(err.msg, part2) != NULL, "'%s' not in: %s", part2, err.msg);
}

#define PARAM_W "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[4,6],\"placement\":\"shard(1)\"}],"
#define OUT(n) "\"outputs\":[{\"name\":\"" n "\",\"placement\":\"shard(2)\"}]"

START_TEST(valid_graph_loads)
{
    tp_graph *g = NULL;
    tp_err err = {{0}};
    tp_status st = load_text(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]}]," OUT("h"), &g, &err);
    ck_assert_msg(st == TP_OK, "%s", err.msg);
    ck_assert_int_eq(g->n_nodes, 3);
    int h = tp_graph_find(g, "h");
    ck_assert_int_eq(g->nodes[h].shape[2], 3); /* 6 / 2 ranks */
    ck_assert_int_eq(g->nodes[h].ndim, 3);
    tp_graph_free(g);
}
END_TEST

START_TEST(missing_file)
{
    tp_graph *g;
    tp_err err;
    ck_assert_int_eq(tp_graph_load("/nonexistent/x.json", &g, &err), TP_IO);
    ck_assert(strstr(err.msg, "/nonexistent/x.json") && strstr(err.msg, "No such file"));
}
END_TEST

START_TEST(bad_json_line_column)
{
    write_file("g.json", "{\"format\": \"tpgraph\",\n  \"version\": 1,,\n}");
    char p[256];
    snprintf(p, sizeof p, "%s/g.json", dir);
    tp_graph *g;
    tp_err err;
    ck_assert_int_eq(tp_graph_load(p, &g, &err), TP_PARSE);
    ck_assert_msg(strstr(err.msg, "line 2") && strstr(err.msg, "column"), "%s", err.msg);
}
END_TEST

START_TEST(unknown_format_version)
{
    write_file("g.json", "{\"format\":\"onnx\",\"version\":1}");
    char p[256];
    snprintf(p, sizeof p, "%s/g.json", dir);
    tp_graph *g;
    tp_err err;
    ck_assert_int_ne(tp_graph_load(p, &g, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "unknown format 'onnx'"), "%s", err.msg);
    write_file("g.json", "{\"format\":\"tpgraph\",\"version\":2}");
    ck_assert_int_ne(tp_graph_load(p, &g, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "version"), "%s", err.msg);
}
END_TEST

START_TEST(unknown_op_attr_datatype)
{
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"conv2d\",\"inputs\":[\"x\"]}]," OUT("h"), "node 'h'", "unknown op 'conv2d'");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"],\"attrs\":{\"transpose_c\":true}}]," OUT("h"),
                 "node 'h'", "unknown attr 'transpose_c'");
    expect_error("\"params\":[{\"name\":\"w\",\"datatype\":\"FP8\",\"shape\":[4,6]}],\"nodes\":[]," OUT("x"), "param 'w'", "unknown datatype 'FP8'");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"all_reduce\",\"inputs\":[\"x\"],\"attrs\":{\"op\":\"min\"}}]," OUT("h"),
                 "node 'h'", "attr 'op'");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"all_gather\",\"inputs\":[\"x\"]}]," OUT("h"), "node 'h'", "needs attr 'dim'");
}
END_TEST

START_TEST(names_twice_or_undefined)
{
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"w\",\"op\":\"relu\",\"inputs\":[\"x\"]}]," OUT("w"), "node 'w'", "used twice");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"relu\",\"inputs\":[\"g\"]},{\"name\":\"g\",\"op\":\"relu\",\"inputs\":[\"x\"]}]," OUT("h"),
                 "node 'h'", "'g' is not defined before");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"relu\",\"inputs\":[\"h\"]}]," OUT("h"), "node 'h'", "not defined before");
    expect_error(PARAM_W "\"nodes\":[]," OUT("nope"), "outputs[0]", "'nope'");
}
END_TEST

START_TEST(shape_mismatch_names_both_shapes)
{
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"],\"attrs\":{\"transpose_b\":true}}]," OUT("h"),
                 "node 'h'", "a [1, 3, 4] vs b [4, 3]");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"h\",\"op\":\"add\",\"inputs\":[\"x\",\"w\"]}]," OUT("h"), "[4, 3]", "do not broadcast");
    expect_error(PARAM_W "\"nodes\":[{\"name\":\"t\",\"op\":\"transpose\",\"inputs\":[\"x\"],\"attrs\":{\"dim0\":1,\"dim1\":2}},"
                 "{\"name\":\"v\",\"op\":\"view\",\"inputs\":[\"t\"],\"attrs\":{\"shape\":[-1,12]}}]," OUT("v"),
                 "node 'v'", "strides");
}
END_TEST

#define PARAM_IDS "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[4,6]}," \
                  "{\"name\":\"ids\",\"datatype\":\"INT32\",\"shape\":[4]}],"
#define NODE1(op, ins, attrs) "\"nodes\":[{\"name\":\"h\",\"op\":\"" op "\",\"inputs\":[" ins "],\"attrs\":{" attrs "}}],"

/* The ops of ONNX exports: attrs refused by name, inputs by what is wrong. */
START_TEST(onnx_ops_refused)
{
    expect_error(PARAM_IDS NODE1("pow", "\"x\"", "") OUT("h"), "node 'h'", "needs attr 'exponent'");
    expect_error(PARAM_IDS NODE1("cast", "\"x\"", "\"to\":\"FP8\"") OUT("h"), "node 'h'", "attr 'to'");
    expect_error(PARAM_IDS NODE1("cast", "\"x\"", "") OUT("h"), "node 'h'", "needs attr 'to'");
    expect_error(PARAM_IDS NODE1("reduce_sum", "\"x\"", "") OUT("h"), "node 'h'", "needs attr 'dim'");
    expect_error(PARAM_IDS NODE1("reduce_mean", "\"x\"", "\"dim\":3") OUT("h"), "node 'h'", "dim 3 is out of range");
    expect_error(PARAM_IDS NODE1("where", "\"x\",\"x\",\"x\"", "") OUT("h"), "node 'h'",
                 "cond 'x' must be an INT32 or INT64 param (a constant mask), got input");
    expect_error(PARAM_IDS NODE1("where", "\"w\",\"x\",\"x\"", "") OUT("h"), "node 'h'", "got FP32");
    expect_error(PARAM_IDS NODE1("where", "\"ids\",\"x\",\"w\"", "") OUT("h"), "node 'h'", "do not broadcast");
    expect_error(PARAM_IDS NODE1("gather", "\"x\",\"x\"", "\"dim\":1") OUT("h"), "node 'h'",
                 "ids must be INT32 or INT64, got FP32");
    expect_error(PARAM_IDS NODE1("expand", "\"x\"", "\"shape\":[2,5]") OUT("h"), "node 'h'",
                 "input [1, 3, 4] does not broadcast to [2, 5]");
    expect_error(PARAM_IDS NODE1("div", "\"ids\",\"ids\"", "") OUT("h"), "node 'h'",
                 "needs floating-point inputs, got INT32");
    expect_error(PARAM_IDS NODE1("sqrt", "\"ids\"", "") OUT("h"), "node 'h'", "needs a floating-point input");
}
END_TEST

/* ... and their shapes when the graph is right. */
START_TEST(onnx_ops_shapes)
{
    const char *cases[][3] = {
        {"reduce_mean", "\"x\"", "\"dim\":-1,\"keepdim\":true"},
        {"reduce_sum", "\"x\"", "\"dim\":1"},
        {"gather", "\"x\",\"ids\"", "\"dim\":2"},
        {"where", "\"ids\",\"x\",\"x\"", ""},
        {"expand", "\"x\"", "\"shape\":[2,1,3,1]"},
        {"cast", "\"x\"", "\"to\":\"BF16\""},
    };
    const char *want[] = {"[1, 3, 1]", "[1, 4]", "[1, 3, 4]", "[1, 3, 4]", "[2, 1, 3, 4]", "[1, 3, 4]"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024], got[64];
        snprintf(body, sizeof body,
                 PARAM_IDS "\"nodes\":[{\"name\":\"h\",\"op\":\"%s\",\"inputs\":[%s],\"attrs\":{%s}}],"
                           "\"outputs\":[{\"name\":\"h\",\"placement\":\"replicate\"}]",
                 cases[i][0], cases[i][1], cases[i][2]);
        tp_graph *g = NULL;
        tp_err err = {{0}};
        ck_assert_msg(load_text(body, &g, &err) == TP_OK, "%s: %s", cases[i][0], err.msg);
        const tp_node *h = &g->nodes[tp_graph_find(g, "h")];
        tp_shape_str(got, sizeof got, h->ndim, h->shape);
        ck_assert_msg(strcmp(got, want[i]) == 0, "%s: %s, want %s", cases[i][0], got, want[i]);
        ck_assert_int_eq(h->dtype, i == 5 ? TP_BF16 : TP_F32);
        tp_graph_free(g);
    }
}
END_TEST

/* The descriptors' batch-rows rules: reducing or gathering along the batch
 * dim mixes rows (no padded batches), along another dim it does not. */
START_TEST(onnx_ops_batch_rows)
{
#define ROWS_NODE(nm, op, ins, attrs) "{\"name\":\"" nm "\",\"op\":\"" op "\",\"inputs\":[" ins "],\"attrs\":{" attrs "}}"
    const char *nodes[] = {
        ROWS_NODE("h", "reduce_sum", "\"x\"", "\"dim\":0,\"keepdim\":true"),
        ROWS_NODE("h", "reduce_mean", "\"x\"", "\"dim\":1,\"keepdim\":true"),
        ROWS_NODE("h", "gather", "\"x\",\"ids\"", "\"dim\":0"),
        ROWS_NODE("h", "gather", "\"x\",\"ids\"", "\"dim\":2"),
        ROWS_NODE("h", "where", "\"ids\",\"x\",\"x\"", ""),
        ROWS_NODE("r", "reduce_mean", "\"x\"", "\"dim\":1,\"keepdim\":true") ","
        ROWS_NODE("h", "expand", "\"r\"", "\"shape\":[1,3,1]"),
    };
#undef ROWS_NODE
    const int mixes[] = {1, 0, 1, 0, 0, 0};
    for (size_t i = 0; i < sizeof nodes / sizeof nodes[0]; i++) {
        char body[1024], why[256] = "";
        snprintf(body, sizeof body,
                 PARAM_IDS "\"nodes\":[%s],\"outputs\":[{\"name\":\"h\",\"placement\":\"replicate\"}]",
                 nodes[i]);
        tp_graph *g = NULL;
        tp_err err = {{0}};
        ck_assert_msg(load_text(body, &g, &err) == TP_OK, "case %zu: %s", i, err.msg);
        int independent = -1;
        ck_assert_int_eq(tp_plan_rows_independent(g, 2, &independent, why, sizeof why, &err), TP_OK);
        ck_assert_msg(independent == !mixes[i], "case %zu: independent %d (%s)", i, independent, why);
        if (i == 2)
            ck_assert_msg(strstr(why, "node 'h' (gather) mixes batch rows"), "%s", why);
        tp_graph_free(g);
    }
}
END_TEST

/* attention's key-padding mask (input 3): refused naming the node when its
 * dtype or shape is wrong. q = k = v = x viewed as [B, 1, 3, 4], so the
 * mask must be [B, 3]. */
#define QKV "{\"name\":\"q\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,1,3,4]}},"
#define ATTN(mask) "{\"name\":\"h\",\"op\":\"attention\",\"inputs\":[\"q\",\"q\",\"q\",\"" mask "\"]}"
START_TEST(attention_mask_refused)
{
    expect_error(PARAM_IDS "\"nodes\":[" QKV
                 "{\"name\":\"s\",\"op\":\"slice\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":2,\"start\":0,\"length\":1}},"
                 "{\"name\":\"m\",\"op\":\"view\",\"inputs\":[\"s\"],\"attrs\":{\"shape\":[-1,3]}}," ATTN("m") "],"
                 OUT("h"), "node 'h' (attention)", "key-padding mask 'm' must be INT32 or INT64, got FP32");
    expect_error(PARAM_IDS "\"nodes\":[" QKV ATTN("ids") "]," OUT("h"), "node 'h' (attention)",
                 "key-padding mask [4] must be [B, T] = [1, 3] of k [1, 1, 3, 4]");
}
END_TEST

/* Grouped-query attention: k and v may have fewer heads than q when
 * their count divides q's (x [B, 3, 4] viewed as q [B, 4, 3, 1] and k = v
 * [B, 2, 6, 1]: output [B, 4, 3, 1]; B is 1 at load); 3 kv heads for 4 are refused
 * naming both shapes. */
START_TEST(attention_gqa_heads)
{
    tp_graph *g = NULL;
    tp_err err = {{0}};
    ck_assert_msg(load_text(PARAM_IDS "\"nodes\":["
                            "{\"name\":\"q\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,4,3,1]}},"
                            "{\"name\":\"k\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,2,6,1]}},"
                            "{\"name\":\"h\",\"op\":\"attention\",\"inputs\":[\"q\",\"k\",\"k\"]}],"
                            "\"outputs\":[{\"name\":\"h\",\"placement\":\"replicate\"}]",
                            &g, &err) == TP_OK,
                  "%s", err.msg);
    const tp_node *h = &g->nodes[g->n_nodes - 1];
    ck_assert_int_eq(h->ndim, 4);
    ck_assert_int_eq(h->shape[1], 4);
    ck_assert_int_eq(h->shape[2], 3);
    tp_graph_free(g);
    expect_error(PARAM_IDS "\"nodes\":["
                 "{\"name\":\"q\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,4,3,1]}},"
                 "{\"name\":\"k\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,3,4,1]}},"
                 "{\"name\":\"h\",\"op\":\"attention\",\"inputs\":[\"q\",\"k\",\"k\"]}]," OUT("h"),
                 "node 'h' (attention)", "k [1, 3, 4, 1] does not fit q [1, 4, 3, 1] (same B and D; q's heads, or a "
                 "number of heads that divides them)");
}
END_TEST

/* rope(x, cos, sin): x [B, 3, 4] with [3, 4] tables loads with x's shape;
 * an odd last dim, a table that does not broadcast and one of another
 * dtype are refused naming the node. */
/* [3, 4] and [3, 5] tables sliced from w [4, 6] */
#define ROPE_PARAMS PARAM_IDS "\"nodes\":[" \
    "{\"name\":\"c0\",\"op\":\"slice\",\"inputs\":[\"w\"],\"attrs\":{\"dim\":0,\"start\":0,\"length\":3}}," \
    "{\"name\":\"c\",\"op\":\"slice\",\"inputs\":[\"c0\"],\"attrs\":{\"dim\":1,\"start\":0,\"length\":4}}," \
    "{\"name\":\"c5\",\"op\":\"slice\",\"inputs\":[\"c0\"],\"attrs\":{\"dim\":1,\"start\":0,\"length\":5}},"
#define ROPE(x, c, s) "{\"name\":\"h\",\"op\":\"rope\",\"inputs\":[\"" x "\",\"" c "\",\"" s "\"]}"
START_TEST(rope_shapes)
{
    tp_graph *g = NULL;
    tp_err err = {{0}};
    ck_assert_msg(load_text(ROPE_PARAMS ROPE("x", "c", "c") "]," OUT("h"), &g, &err) == TP_OK, "%s",
                  err.msg);
    const tp_node *h = &g->nodes[g->n_nodes - 1];
    ck_assert_int_eq(h->ndim, 3);
    ck_assert_int_eq(h->shape[2], 4);
    tp_graph_free(g);
    expect_error(ROPE_PARAMS "{\"name\":\"v\",\"op\":\"view\",\"inputs\":[\"x\"],\"attrs\":{\"shape\":[-1,4,3]}},"
                 ROPE("v", "c", "c") "]," OUT("h"), "node 'h' (rope)",
                 "x must be floating point with an even last dim of at least 2, got FP32 [1, 4, 3]");
    expect_error(ROPE_PARAMS ROPE("x", "c5", "c") "]," OUT("h"), "node 'h' (rope)",
                 "cos [3, 5] does not broadcast to x [1, 3, 4]");
    expect_error(ROPE_PARAMS ROPE("x", "c", "ids") "]," OUT("h"), "node 'h' (rope)",
                 "sin 'ids' is not of x's dtype FP32");
}
END_TEST
#undef ROPE_PARAMS
#undef ROPE

/* A mask given as a graph input [B, T] loads, and keeps batch rows apart:
 * padded batches stay allowed. */
START_TEST(attention_mask_input_rows)
{
    char text[2048], p[256], why[256] = "";
    snprintf(text, sizeof text,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"t\",\"world_size\":2,"
             "\"weights\":\"w.safetensors\",\"inputs\":["
             "{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",3,4],\"placement\":\"replicate\"},"
             "{\"name\":\"mask\",\"datatype\":\"INT64\",\"shape\":[\"B\",3],\"placement\":\"replicate\"}],"
             "\"nodes\":[" QKV ATTN("mask") "],\"outputs\":[{\"name\":\"h\",\"placement\":\"replicate\"}]}");
    write_file("g.json", text);
    snprintf(p, sizeof p, "%s/g.json", dir);
    tp_graph *g = NULL;
    tp_err err = {{0}};
    ck_assert_msg(tp_graph_load(p, &g, &err) == TP_OK, "%s", err.msg);
    int independent = -1;
    ck_assert_int_eq(tp_plan_rows_independent(g, 2, &independent, why, sizeof why, &err), TP_OK);
    ck_assert_msg(independent == 1, "the mask made attention mix rows: %s", why);
    tp_graph_free(g);
}
END_TEST
#undef QKV
#undef ATTN

START_TEST(non_divisible_shard_and_split)
{
    expect_error("\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[4,6],\"placement\":\"shard(1)\"}],"
                 "\"nodes\":[{\"name\":\"h\",\"op\":\"reduce_scatter\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}}]," OUT("h"),
                 "node 'h'", "split dim 1 of size 3 is not divisible by world_size 2");
    expect_error("\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[4,6],\"placement\":\"shard(1)\"},"
                 "{\"name\":\"w2\",\"tensor\":\"w\",\"datatype\":\"FP32\",\"shape\":[4,6],\"placement\":\"shard(0)\"}],"
                 "\"nodes\":[{\"name\":\"h\",\"op\":\"all_to_all\",\"inputs\":[\"x\"],\"attrs\":{\"split_dim\":-2,\"concat_dim\":0}}]," OUT("h"),
                 "node 'h'", "not divisible");
    /* 3 is not divisible by 2: input shard on a static dim */
    tp_graph *g;
    tp_err err;
    write_file("g.json", "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"t\",\"world_size\":2,"
                         "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",3],\"placement\":\"shard(1)\"}],"
                         "\"nodes\":[],\"outputs\":[{\"name\":\"x\"}]}");
    char p[256];
    snprintf(p, sizeof p, "%s/g.json", dir);
    ck_assert_int_ne(tp_graph_load(p, &g, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "input 'x'") && strstr(err.msg, "not divisible"), "%s", err.msg);
}
END_TEST

START_TEST(param_vs_safetensors)
{
    expect_error("\"params\":[{\"name\":\"q\",\"datatype\":\"FP32\",\"shape\":[4,6]}],\"nodes\":[]," OUT("x"),
                 "param 'q'", "missing from");
    expect_error("\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[6,4]}],\"nodes\":[]," OUT("x"),
                 "param 'w'", "declared shape [6, 4] but");
    expect_error("\"params\":[{\"name\":\"w\",\"datatype\":\"FP16\",\"shape\":[4,6]}],\"nodes\":[]," OUT("x"),
                 "param 'w'", "declared FP16");
}
END_TEST

START_TEST(malformed_safetensors_header)
{
    write_file("w.safetensors", "\x10\0\0\0\0\0\0\0{\"w\": {\"dtype\":");
    expect_error(PARAM_W "\"nodes\":[]," OUT("x"), "w.safetensors", NULL);
    /* offsets past the end of the file */
    const char hdr[] = "{\"w\":{\"dtype\":\"F32\",\"shape\":[4,6],\"data_offsets\":[0,96]}}";
    char buf[256];
    uint64_t n = sizeof hdr - 1;
    memcpy(buf, &n, 8);
    memcpy(buf + 8, hdr, n);
    char p[256];
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    FILE *f = fopen(p, "wb");
    fwrite(buf, 1, 8 + n + 10, f);
    fclose(f);
    expect_error(PARAM_W "\"nodes\":[]," OUT("x"), "w.safetensors", "past the end");
}
END_TEST

Suite *loader_suite(void)
{
    Suite *s = suite_create("loader");
    TCase *tc = tcase_create("errors");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, valid_graph_loads);
    tcase_add_test(tc, missing_file);
    tcase_add_test(tc, bad_json_line_column);
    tcase_add_test(tc, unknown_format_version);
    tcase_add_test(tc, unknown_op_attr_datatype);
    tcase_add_test(tc, names_twice_or_undefined);
    tcase_add_test(tc, shape_mismatch_names_both_shapes);
    tcase_add_test(tc, non_divisible_shard_and_split);
    tcase_add_test(tc, onnx_ops_refused);
    tcase_add_test(tc, onnx_ops_shapes);
    tcase_add_test(tc, onnx_ops_batch_rows);
    tcase_add_test(tc, attention_mask_refused);
    tcase_add_test(tc, attention_mask_input_rows);
    tcase_add_test(tc, attention_gqa_heads);
    tcase_add_test(tc, rope_shapes);
    tcase_add_test(tc, param_vs_safetensors);
    tcase_add_test(tc, malformed_safetensors_header);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(loader_suite)
