/* choose_collectives: one_shot below the per-world-size threshold, ring
 * (cpu) or nccl (cuda) above it; and the ring lowering gives the same
 * numbers as one-shot. */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "check_main.h"
#include "exec.h"
#include "testutil.h"

static void write_graph(char *dir, char *path, int world, int64_t h)
{
    char json[1024];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"r\",\"world_size\":%d,"
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",%lld]}],"
             "\"nodes\":[{\"name\":\"s\",\"op\":\"all_reduce\",\"inputs\":[\"x\"]},"
             "{\"name\":\"m\",\"op\":\"all_reduce\",\"inputs\":[\"s\"],\"attrs\":{\"op\":\"max\"}},"
             "{\"name\":\"a\",\"op\":\"all_reduce\",\"inputs\":[\"x\"],\"attrs\":{\"op\":\"avg\"}},"
             "{\"name\":\"g\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}}],"
             "\"outputs\":[{\"name\":\"m\"},{\"name\":\"a\"},{\"name\":\"s\"}]}", world, (long long)h);
    tu_write_graph(dir, path, json, NULL, 0);
}

static tp_algo algo_of(const tp_graph *g, const char *name) { return g->nodes[tp_graph_find(g, name)].attrs.algo; }

START_TEST(threshold_per_world_size)
{
    char dir[64], path[128];
    tp_pass_opts po;
    tp_pass_opts_default(&po);
    ck_assert_int_gt(po.lowering.one_shot_max_bytes[2], po.lowering.one_shot_max_bytes[8]);
    ck_assert_int_eq(po.lowering.one_shot_max_bytes[8], 256 * 1024);
    write_graph(dir, path, 2, 256); /* 1 KiB per row */
    tp_graph *g = tu_load_passed(path, 1, &po);
    ck_assert_int_eq(algo_of(g, "s"), TP_ALGO_ONE_SHOT);
    ck_assert_int_eq(algo_of(g, "g"), TP_ALGO_ONE_SHOT);
    tp_graph_free(g);
    po.lowering.one_shot_max_bytes[2] = 512; /* now 1 KiB is large */
    g = tu_load_passed(path, 1, &po);
    ck_assert_int_eq(algo_of(g, "s"), TP_ALGO_RING);
    ck_assert_int_eq(algo_of(g, "g"), TP_ALGO_ONE_SHOT); /* only all_reduce has a ring lowering */
    tp_graph_free(g);
    po.lowering.large_all_reduce = po.lowering.other_collectives = TP_ALGO_NCCL; /* as cuda offers */
    g = tu_load_passed(path, 1, &po);
    ck_assert_int_eq(algo_of(g, "s"), TP_ALGO_NCCL);
    ck_assert_int_eq(algo_of(g, "g"), TP_ALGO_NCCL);
    tp_graph_free(g);
    tu_rmdir(dir);
}
END_TEST

/* 3 ranks x 300 floats per row x 16 rows: the default 2-rank threshold is
 * 1 MiB, the 3-rank one 512 KiB; a [16, 40000] FP32 all_reduce (2.5 MB)
 * runs as a ring, sum/avg/max, against the same graph without passes. */
START_TEST(ring_matches_one_shot)
{
    char dir[64], path[128];
    write_graph(dir, path, 3, 40000);
    tp_graph *g = tu_load_passed(path, 16, NULL);
    ck_assert_int_eq(algo_of(g, "s"), TP_ALGO_RING);
    tp_graph_free(g);
    static float x[16 * 40000];
    tu_fill(x, 16 * 40000, 3);
    int64_t shape[2] = {16, 40000};
    tp_host_tensor in = tu_f32("x", x, 2, shape);
    tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
    int n1, n2;
    tp_host_tensor *a = tu_infer(on, &in, 1, &n1), *b = tu_infer(off, &in, 1, &n2);
    ck_assert_msg(tu_rel_diff(a, b, n1) <= TU_RTOL_REORDER, "ring vs one-shot: %g", tu_rel_diff(a, b, n1));
    /* each rank holds the full x (replicate): the sum is 3x */
    for (int i = 0; i < 16 * 40000; i += 997) {
        float got = ((float *)a[2].data)[i], want = 3.0f * x[i];
        ck_assert_msg(fabsf(got - want) <= 1e-6f * fabsf(want) + 1e-7f, "s[%d] = %g, want %g", i, got, want);
    }
    tp_host_tensors_free(a, n1);
    tp_host_tensors_free(b, n2);
    tp_engine_free(on);
    tp_engine_free(off);
    tu_rmdir(dir);
}
END_TEST

/* Each bucket lowers at its own size: [1, 40000] FP32 (160 KB) is one_shot
 * at 2 ranks, [16, 40000] (2.5 MB) is ring; both give the one-shot numbers. */
START_TEST(lowering_per_bucket)
{
    char dir[64], path[128];
    write_graph(dir, path, 2, 40000);
    tp_graph *g = tu_load_passed(path, 1, NULL);
    tp_backend *b;
    tp_rank_group *rg;
    tp_weights *w;
    tp_err err = {{0}};
    ck_assert(tp_backend_create("cpu", 2, &b, &err) == TP_OK);
    ck_assert(tp_rank_group_create(&(tp_rank_group_opts){.world = 2}, &rg, &err) == TP_OK);
    ck_assert(tp_weights_load(g, b, rg, &w, &err) == TP_OK);
    tp_pass_opts po;
    tp_pass_opts_default(&po);
    tp_exec_opts xo = {.lowering = &po};
    tp_exec *small, *large;
    ck_assert_msg(tp_exec_create(g, 1, b, rg, w, &xo, &small, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(algo_of(tp_exec_graph(small), "s"), TP_ALGO_ONE_SHOT);
    ck_assert_msg(tp_exec_create(g, 16, b, rg, w, &xo, &large, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(algo_of(tp_exec_graph(large), "s"), TP_ALGO_RING);
    /* each executable owns its lowered nodes: the large one changed nothing
     * the small one (or the compiled graph) reads */
    ck_assert_int_eq(algo_of(tp_exec_graph(small), "s"), TP_ALGO_ONE_SHOT);
    ck_assert_int_eq(algo_of(g, "s"), TP_ALGO_ONE_SHOT);
    tp_exec_free(small);
    tp_exec_free(large);
    tp_weights_free(w);
    tp_rank_group_free(rg);
    tp_backend_destroy(b);
    tp_graph_free(g);
    static float x[16 * 40000];
    tu_fill(x, 16 * 40000, 8);
    tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
    for (int64_t rows = 1; rows <= 16; rows += 15) {
        int64_t shape[2] = {rows, 40000};
        tp_host_tensor in = tu_f32("x", x, 2, shape);
        int n1, n2;
        tp_host_tensor *a = tu_infer(on, &in, 1, &n1), *c = tu_infer(off, &in, 1, &n2);
        ck_assert(tu_rel_diff(a, c, n1) <= TU_RTOL_REORDER);
        tp_host_tensors_free(a, n1);
        tp_host_tensors_free(c, n2);
    }
    tp_engine_free(on);
    tp_engine_free(off);
    tu_rmdir(dir);
}
END_TEST

Suite *choose_suite(void)
{
    Suite *s = suite_create("pass_choose_collectives");
    TCase *tc = tcase_create("choose");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, threshold_per_world_size);
    tcase_add_test(tc, ring_matches_one_shot);
    tcase_add_test(tc, lowering_per_bucket);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(choose_suite)
