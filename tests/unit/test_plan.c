/* The execution plan: liveness-based arenas (the 8-layer chain needs one
 * symmetric and one regular buffer), no two live buffers overlap, planned
 * peak below the naive sum on every example, partitions and hoisting. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "plan.h"
#include "testutil.h"

START_TEST(arena_reuses_dead_blocks)
{
    tp_mem_item it[3] = {{100, 0, 1, 0, -1}, {100, 1, 2, 0, -1}, {100, 2, 3, 0, -1}};
    int64_t bytes;
    int blocks;
    ck_assert_int_eq(tp_plan_arena(it, 3, &bytes, &blocks, NULL), TP_OK);
    ck_assert_int_eq(it[0].offset, it[2].offset); /* A is dead when C is born */
    ck_assert_int_ne(it[0].offset, it[1].offset); /* B is born while A is read */
    ck_assert_int_eq(bytes, 256);
    ck_assert_int_eq(blocks, 2);
    /* a freed big block is split for a smaller item, then merges back */
    tp_mem_item it2[3] = {{256, 0, 0, 0, -1}, {64, 1, 2, 0, -1}, {256, 3, 3, 0, -1}};
    ck_assert_int_eq(tp_plan_arena(it2, 3, &bytes, &blocks, NULL), TP_OK);
    ck_assert_int_eq(bytes, 256);
    ck_assert_int_eq(it2[1].offset, 0);
    ck_assert_int_eq(it2[2].offset, 0);
}
END_TEST

static tp_plan *plan_of(tp_graph *g, int64_t batch)
{
    tp_plan *p;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_graph_infer(g, batch, &err), TP_OK);
    ck_assert_msg(tp_plan_build(g, &p, &err) == TP_OK, "%s", err.msg);
    return p;
}

START_TEST(eight_layer_chain_is_one_plus_one)
{
    char nodes[4096] = "", json[6000], dir[64], path[128];
    static float w[64 * 64];
    tu_fill(w, 64 * 64, 1);
    const char *prev = "x";
    char names[8][8];
    for (int l = 0; l < 8; l++) {
        snprintf(names[l], sizeof names[l], "ar%d", l);
        size_t off = strlen(nodes);
        snprintf(nodes + off, sizeof nodes - off,
                 "%s{\"name\":\"mm%d\",\"op\":\"matmul\",\"inputs\":[\"%s\",\"w\"]},"
                 "{\"name\":\"ar%d\",\"op\":\"all_reduce\",\"inputs\":[\"mm%d\"]}",
                 l ? "," : "", l, prev, l, l);
        prev = names[l];
    }
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"chain\",\"world_size\":2,\"weights\":\"w.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",64]}],"
             "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[64,64]}],"
             "\"nodes\":[%s],\"outputs\":[{\"name\":\"ar7\"}]}", nodes);
    const int64_t shape[2] = {64, 64};
    st_write_item item = {"w", TP_F32, 2, shape, w};
    tu_write_graph(dir, path, json, &item, 1);
    tp_graph *g = tu_load_passed(path, 4, NULL);
    tp_plan *p = plan_of(g, 4);
    ck_assert_int_eq(p->n_buffers[TP_MEM_SYMMETRIC], 1);
    ck_assert_int_eq(p->n_buffers[TP_MEM_REGULAR], 1);
    ck_assert_int_eq(p->peak_bytes, 2 * 4 * 64 * 4);
    ck_assert_int_eq(p->naive_bytes, 15 * 4 * 64 * 4); /* 8 matmuls + 7 reduced, the 8th is the output */
    ck_assert(p->symmetric_offsets_equal);
    ck_assert_int_eq(p->buf[tp_graph_find(g, "ar7")].kind, TP_MEM_OUTPUT);
    tp_plan_free(p);
    tp_graph_free(g);
    tu_rmdir(dir);
}
END_TEST

/* No two buffers of one arena that are live at the same time overlap. */
static void check_no_overlap(const tp_graph *g, const tp_plan *p)
{
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = i + 1; j < g->n_nodes; j++) {
            const tp_buf *a = &p->buf[i], *b = &p->buf[j];
            if (a->kind == TP_MEM_NONE || a->kind != b->kind)
                continue;
            /* an in-place op shares its dying input's block by design */
            int live_together = a->first <= b->last && b->first <= a->last && b->inplace_of != i;
            int overlap = a->offset < b->offset + b->bytes && b->offset < a->offset + a->bytes;
            ck_assert_msg(!(live_together && overlap), "%s and %s overlap while both live", g->nodes[i].name,
                          g->nodes[j].name);
        }
}

static void plan_example(const char *path, const char *inputs, const char *ref, double rtol)
{
    (void)inputs, (void)ref, (void)rtol;
    tp_graph *g = tu_load_passed(path, 4, NULL);
    tp_plan *p = plan_of(g, 4);
    ck_assert_msg(p->peak_bytes < p->naive_bytes, "%s: planned %lld >= naive %lld", path, (long long)p->peak_bytes,
                  (long long)p->naive_bytes);
    ck_assert(p->symmetric_offsets_equal);
    check_no_overlap(g, p);
    tp_plan_free(p);
    tp_graph_free(g);
}

START_TEST(examples_plan_below_naive_without_overlap)
{
    tu_foreach_example(plan_example);
}
END_TEST

START_TEST(fallback_partitions_and_hoisting)
{
    char dir[64], path[128];
    tu_write_graph(dir, path,
                   "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"fb\",\"world_size\":2,"
                   "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",8]}],"
                   "\"nodes\":[{\"name\":\"a\",\"op\":\"relu\",\"inputs\":[\"x\"]},"
                   "{\"name\":\"f1\",\"op\":\"gelu\",\"inputs\":[\"a\"],\"fallback\":true},"
                   "{\"name\":\"f2\",\"op\":\"silu\",\"inputs\":[\"f1\"],\"fallback\":true},"
                   "{\"name\":\"b\",\"op\":\"add\",\"inputs\":[\"f2\",\"a\"]},"
                   "{\"name\":\"c\",\"op\":\"all_reduce\",\"inputs\":[\"b\"]}],"
                   "\"outputs\":[{\"name\":\"c\"}]}",
                   NULL, 0);
    tp_graph *g = tu_load_passed(path, 2, NULL);
    tp_plan *p = plan_of(g, 2);
    ck_assert_int_eq(p->n_parts, 3);
    ck_assert_int_eq(p->parts[0].kind, TP_PART_CAPTURED);
    ck_assert_int_eq(p->parts[1].kind, TP_PART_FALLBACK);
    ck_assert_int_eq(p->parts[1].n_nodes, 2);
    ck_assert_int_eq(p->parts[2].kind, TP_PART_CAPTURED);
    ck_assert(p->buf[tp_graph_find(g, "f2")].hoisted);  /* read by partition 2 */
    ck_assert(!p->buf[tp_graph_find(g, "f1")].hoisted); /* read only inside the fallback */
    ck_assert(!p->buf[tp_graph_find(g, "a")].hoisted);
    tp_plan_free(p);
    tp_graph_free(g);
    tu_rmdir(dir);
}
END_TEST

Suite *plan_suite(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, arena_reuses_dead_blocks);
    tcase_add_test(tc, eight_layer_chain_is_one_plus_one);
    tcase_add_test(tc, examples_plan_below_naive_without_overlap);
    tcase_add_test(tc, fallback_partitions_and_hoisting);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(plan_suite)
