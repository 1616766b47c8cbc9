/* widen_activations: an FP16 graph on the cpu backend computes what its
 * FP32 twin computes (the same ops on the same values, FP16's params and
 * inputs being exact in FP32), rounded once at its outputs: bit for bit,
 * with ranks as threads and as processes. Without the pass every node
 * rounds, and the bits differ. Narrow-only nodes (an embedding of a table
 * nothing else reads) stay narrow, kv_attention keeps its caches' dtype,
 * outputs keep their names and dtypes, and a backend without
 * f32_activations leaves the graph alone. */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "safetensors.h"
#include "testutil.h"

#define K 8
#define N 12 /* 6 a rank */
#define V 8
#define P 4
#define B 3

static float table[V * K], pos_table[P * K], w1[K * N], b1[N], w2[N * K];
static uint16_t table_h[V * K], pos_h[P * K], w1_h[K * N], b1_h[N], w2_h[N * K];

/* The MLP of a small decoder at world size 2: embeddings of a tied table
 * and of a position table, a column-parallel matmul + bias + GELU, a cast
 * (as exports round around norms), a row-parallel matmul reduced, and a
 * head by the tied table. dt: the float datatype of everything. */
static const char *graph_fmt =
    "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"mlp\",\"world_size\":2,\"weights\":\"w.safetensors\","
    "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[\"B\",4]},"
    "{\"name\":\"x\",\"datatype\":\"%1$s\",\"shape\":[\"B\",4,%2$d]}],"
    "\"params\":[{\"name\":\"table\",\"datatype\":\"%1$s\",\"shape\":[%3$d,%2$d]},"
    "{\"name\":\"pos\",\"datatype\":\"%1$s\",\"shape\":[%4$d,%2$d]},"
    "{\"name\":\"w1\",\"datatype\":\"%1$s\",\"shape\":[%2$d,%5$d],\"placement\":\"shard(1)\"},"
    "{\"name\":\"b1\",\"datatype\":\"%1$s\",\"shape\":[%5$d],\"placement\":\"shard(0)\"},"
    "{\"name\":\"w2\",\"datatype\":\"%1$s\",\"shape\":[%5$d,%2$d],\"placement\":\"shard(0)\"}],"
    "\"nodes\":[{\"name\":\"e\",\"op\":\"embedding\",\"inputs\":[\"ids\",\"table\"]},"
    "{\"name\":\"pe\",\"op\":\"embedding\",\"inputs\":[\"ids\",\"pos\"]},"
    "{\"name\":\"h0\",\"op\":\"add\",\"inputs\":[\"x\",\"e\"]},"
    "{\"name\":\"h\",\"op\":\"add\",\"inputs\":[\"h0\",\"pe\"]},"
    "{\"name\":\"m\",\"op\":\"matmul\",\"inputs\":[\"h\",\"w1\"]},"
    "{\"name\":\"a\",\"op\":\"add\",\"inputs\":[\"m\",\"b1\"]},"
    "{\"name\":\"g\",\"op\":\"gelu\",\"inputs\":[\"a\"],\"attrs\":{\"approximate\":\"tanh\"}},"
    "{\"name\":\"c\",\"op\":\"cast\",\"inputs\":[\"g\"],\"attrs\":{\"to\":\"%1$s\"}},"
    "{\"name\":\"p\",\"op\":\"matmul\",\"inputs\":[\"c\",\"w2\"]},"
    "{\"name\":\"y\",\"op\":\"all_reduce\",\"inputs\":[\"p\"],\"attrs\":{\"op\":\"sum\"}},"
    "{\"name\":\"logits\",\"op\":\"matmul\",\"inputs\":[\"y\",\"table\"],\"attrs\":{\"transpose_b\":true}}],"
    "\"outputs\":[{\"name\":\"logits\"},{\"name\":\"y\"},{\"name\":\"pe\"}]}";

/* Rounds p to FP16 values in place, keeping the halves in h. */
static void to_half(float *p, uint16_t *h, int n)
{
    for (int i = 0; i < n; i++) {
        h[i] = tp_f32_to_f16(p[i]);
        p[i] = tp_f16_to_f32(h[i]);
    }
}

static void fill_weights(void)
{
    tu_fill(table, V * K, 1);
    tu_fill(pos_table, P * K, 2);
    tu_fill(w1, K * N, 3);
    tu_fill(b1, N, 4);
    tu_fill(w2, N * K, 5);
    to_half(table, table_h, V * K);
    to_half(pos_table, pos_h, P * K);
    to_half(w1, w1_h, K * N);
    to_half(b1, b1_h, N);
    to_half(w2, w2_h, N * K);
}

/* The graph in dt (FP16: the halves; FP32: the same values widened). */
static void write(const char *dt, char *dir, char *path)
{
    char json[8192];
    snprintf(json, sizeof json, graph_fmt, dt, K, V, P, N);
    int half = strcmp(dt, "FP16") == 0;
    tp_dtype t = half ? TP_F16 : TP_F32;
    int64_t st[2] = {V, K}, sp[2] = {P, K}, s1[2] = {K, N}, sb[1] = {N}, s2[2] = {N, K};
    st_write_item items[] = {{"table", t, 2, st, half ? (void *)table_h : table},
                             {"pos", t, 2, sp, half ? (void *)pos_h : pos_table},
                             {"w1", t, 2, s1, half ? (void *)w1_h : w1},
                             {"b1", t, 1, sb, half ? (void *)b1_h : b1},
                             {"w2", t, 2, s2, half ? (void *)w2_h : w2}};
    tu_write_graph(dir, path, json, items, 5);
}

static int64_t ids[B * 4];
static float x[B * 4 * K];
static uint16_t x_h[B * 4 * K];

static tp_host_tensor *run(tp_engine *e, int half, int *n_out)
{
    int64_t si[2] = {B, 4}, sx[3] = {B, 4, K};
    tp_host_tensor in[2] = {tu_tensor("ids", TP_I64, ids, 2, si),
                            tu_tensor("x", half ? TP_F16 : TP_F32, half ? (void *)x_h : x, 3, sx)};
    tp_host_tensor *out = tu_infer(e, in, 2, n_out);
    tp_engine_free(e);
    return out;
}

/* Output i of the FP32 twin rounded to FP16 against the FP16 graph's:
 * the number of elements whose bits differ. */
static int64_t differing_halves(const tp_host_tensor *half, const tp_host_tensor *wide)
{
    ck_assert_int_eq(half->dtype, TP_F16);
    ck_assert_int_eq(wide->dtype, TP_F32);
    ck_assert_uint_eq(half->nbytes * 2, wide->nbytes);
    const uint16_t *h = half->data;
    const float *w = wide->data;
    int64_t n = (int64_t)(half->nbytes / 2), bad = 0;
    for (int64_t i = 0; i < n; i++)
        bad += h[i] != tp_f32_to_f16(w[i]);
    return bad;
}

START_TEST(fp16_graph_computes_its_fp32_twin)
{
    fill_weights();
    for (int i = 0; i < B * 4; i++)
        ids[i] = (i * 5 + 1) % P; /* < P: rows of both tables */
    tu_fill(x, B * 4 * K, 9);
    to_half(x, x_h, B * 4 * K);
    char d16[64], p16[128], d32[64], p32[128];
    write("FP16", d16, p16);
    write("FP32", d32, p32);
    int n16, n32, nproc, nraw;
    tp_host_tensor *o16 = run(tu_engine(p16, 1, 0), 1, &n16);
    tp_host_tensor *o32 = run(tu_engine(p32, 1, 0), 0, &n32);
    tp_host_tensor *oproc = run(tu_engine_processes(p16), 1, &nproc);
    tp_host_tensor *raw = run(tu_engine(p16, 0, 0), 1, &nraw); /* every node rounds */
    ck_assert_int_eq(n16, 3);
    ck_assert_int_eq(n32, 3);
    int64_t raw_bad = 0;
    for (int i = 0; i < n16; i++) {
        ck_assert_str_eq(o16[i].name, o32[i].name);
        /* the same FP32 kernels on the same values, one rounding at the end */
        ck_assert_msg(differing_halves(&o16[i], &o32[i]) == 0, "output '%s' is not its FP32 twin's, rounded",
                      o16[i].name);
        ck_assert_msg(memcmp(o16[i].data, oproc[i].data, o16[i].nbytes) == 0, "output '%s' differs in processes",
                      o16[i].name);
        raw_bad += differing_halves(&raw[i], &o32[i]);
    }
    ck_assert_msg(raw_bad > 0, "rounding every node gave the twin's bits: the check above proves nothing");
    tp_host_tensors_free(o16, n16);
    tp_host_tensors_free(o32, n32);
    tp_host_tensors_free(oproc, nproc);
    tp_host_tensors_free(raw, nraw);
    tu_rmdir(d16);
    tu_rmdir(d32);
}
END_TEST

static const tp_node *named(const tp_graph *g, const char *name)
{
    int i = tp_graph_find(g, name);
    ck_assert_msg(i >= 0, "no node '%s'", name);
    return &g->nodes[i];
}

START_TEST(narrow_edges_and_names)
{
    fill_weights();
    char dir[64], path[128];
    write("FP16", dir, path);
    tp_graph *g = tu_load_passed(path, B, NULL);
    /* read by widened nodes: loaded as FP32 from their FP16 bytes */
    const char *wide[] = {"table", "w1", "b1", "w2"};
    for (int i = 0; i < 4; i++) {
        ck_assert_int_eq(named(g, wide[i])->dtype, TP_F32);
        ck_assert_int_eq(named(g, wide[i])->stored, TP_F16);
    }
    /* read by an embedding alone: stays FP16, and so does its embedding */
    ck_assert_int_eq(named(g, "pos")->dtype, TP_F16);
    ck_assert_int_eq(named(g, "pos")->stored, TP_F16);
    ck_assert_int_eq(named(g, "e")->dtype, TP_F32); /* the tied table's */
    ck_assert_int_eq(named(g, "h")->dtype, TP_F32);
    ck_assert_int_eq(named(g, "c")->attrs.cast_to, TP_F32);
    /* x and pe read through one FP32 cast each */
    const tp_node *h0 = named(g, "h0"), *h = named(g, "h");
    ck_assert_int_eq(g->nodes[h0->inputs[0]].op, TP_OP_CAST);
    ck_assert_str_eq(g->nodes[g->nodes[h0->inputs[0]].inputs[0]].name, "x");
    ck_assert_int_eq(g->nodes[h->inputs[1]].op, TP_OP_CAST);
    /* outputs keep their names and FP16; pe was FP16 already */
    for (int o = 0; o < g->n_outputs; o++)
        ck_assert_int_eq(g->nodes[g->output_ids[o]].dtype, TP_F16);
    ck_assert_str_eq(g->nodes[g->output_ids[0]].name, "logits");
    ck_assert_int_eq(g->nodes[g->output_ids[0]].op, TP_OP_CAST);
    ck_assert_str_eq(g->nodes[g->output_ids[2]].name, "pe");
    ck_assert_int_eq(g->nodes[g->output_ids[2]].op, TP_OP_EMBEDDING);
    tp_graph_free(g);

    /* a backend without f32_activations: nothing changes */
    tp_pass_opts po;
    tp_pass_opts_default(&po);
    po.f32_activations = 0;
    g = tu_load_passed(path, B, &po);
    ck_assert_int_eq(named(g, "w1")->dtype, TP_F16);
    ck_assert_int_eq(named(g, "h")->dtype, TP_F16);
    ck_assert_int_eq(tu_count_op(g, TP_OP_CAST), 1);
    tp_graph_free(g);
    tu_rmdir(dir);
}
END_TEST

/* q + q stays FP16 (narrow sources); the relu of it is widened, and
 * reaches kv_attention cast back to the caches' FP16; what reads the
 * attention reads it through a cast to FP32. */
START_TEST(kv_attention_keeps_its_caches_dtype)
{
    const char *json =
        "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"gen\",\"world_size\":1,"
        "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT64\",\"shape\":[\"B\",1]},"
        "{\"name\":\"pos\",\"datatype\":\"INT64\",\"shape\":[\"B\"]},"
        "{\"name\":\"slot\",\"datatype\":\"INT64\",\"shape\":[\"B\"]},"
        "{\"name\":\"q\",\"datatype\":\"FP16\",\"shape\":[\"B\",2,1,4]}],"
        "\"states\":[{\"name\":\"kc\",\"datatype\":\"FP16\",\"shape\":[\"S\",1,8,4]},"
        "{\"name\":\"vc\",\"datatype\":\"FP16\",\"shape\":[\"S\",1,8,4]}],"
        "\"nodes\":[{\"name\":\"qq\",\"op\":\"add\",\"inputs\":[\"q\",\"q\"]},"
        "{\"name\":\"qr\",\"op\":\"relu\",\"inputs\":[\"qq\"]},"
        "{\"name\":\"k\",\"op\":\"slice\",\"inputs\":[\"qr\"],\"attrs\":{\"dim\":1,\"start\":0,\"length\":1}},"
        "{\"name\":\"a\",\"op\":\"kv_attention\",\"inputs\":[\"qr\",\"k\",\"k\",\"kc\",\"vc\",\"slot\",\"pos\"]},"
        "{\"name\":\"s\",\"op\":\"relu\",\"inputs\":[\"a\"]},"
        "{\"name\":\"l\",\"op\":\"view\",\"inputs\":[\"s\"],\"attrs\":{\"shape\":[-1,1,8]}},"
        "{\"name\":\"key\",\"op\":\"argmax\",\"inputs\":[\"l\"],\"attrs\":{\"limit\":7}},"
        "{\"name\":\"tok\",\"op\":\"argmax_index\",\"inputs\":[\"key\"]},"
        "{\"name\":\"next\",\"op\":\"view\",\"inputs\":[\"tok\"],\"attrs\":{\"shape\":[-1]}}],"
        "\"outputs\":[{\"name\":\"next\"}],"
        "\"generate\":{\"input_ids\":\"ids\",\"positions\":\"pos\",\"slots\":\"slot\",\"next_token\":\"next\","
        "\"max_seq_len\":8,\"vocab_size\":7}}";
    char dir[64], path[128];
    tu_write_graph(dir, path, json, NULL, 0);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    const tp_node *a = named(g, "a"), *s = named(g, "s");
    ck_assert_int_eq(a->dtype, TP_F16);
    for (int k = 0; k < 3; k++) {
        const tp_node *in = &g->nodes[a->inputs[k]];
        ck_assert_int_eq(in->op, TP_OP_CAST);
        ck_assert_int_eq(in->dtype, TP_F16);
    }
    ck_assert_int_eq(named(g, "qq")->dtype, TP_F16);
    ck_assert_int_eq(named(g, "qr")->dtype, TP_F32);
    ck_assert_int_eq(s->dtype, TP_F32);
    ck_assert_int_eq(g->nodes[s->inputs[0]].op, TP_OP_CAST);
    ck_assert_int_eq(named(g, "next")->dtype, TP_I64);
    tp_graph_free(g);
    tu_rmdir(dir);
}
END_TEST

static Suite *widen_suite(void)
{
    Suite *s = suite_create("pass_widen_activations");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, fp16_graph_computes_its_fp32_twin);
    tcase_add_test(t, narrow_edges_and_names);
    tcase_add_test(t, kv_attention_keeps_its_caches_dtype);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(widen_suite)
