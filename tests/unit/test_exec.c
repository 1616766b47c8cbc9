/* Capture and replay: fallbacks in the middle give identical results
 * captured and eager; buffers never move across 1000 replays with new
 * inputs; every example gives the same numbers with passes on and off; a
 * capture that points outside backend memory is refused. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check_main.h"
#include "exec.h"
#include "testutil.h"

static const char *FALLBACK_GRAPH =
    "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"fb\",\"world_size\":2,\"weights\":\"w.safetensors\","
    "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",4,8],\"placement\":\"shard(1)\"}],"
    "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[8,8],\"placement\":\"shard(1)\"}],"
    "\"nodes\":[{\"name\":\"g\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}},"
    "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"g\",\"w\"]},"
    "{\"name\":\"f\",\"op\":\"gelu\",\"inputs\":[\"h\"],\"fallback\":true},"
    "{\"name\":\"f2\",\"op\":\"softmax\",\"inputs\":[\"f\"],\"fallback\":true},"
    "{\"name\":\"r\",\"op\":\"all_reduce\",\"inputs\":[\"f2\"]},"
    "{\"name\":\"y\",\"op\":\"add\",\"inputs\":[\"r\",\"h\"]}],"
    "\"outputs\":[{\"name\":\"y\",\"placement\":\"shard(2)\"},{\"name\":\"f\",\"placement\":\"shard(2)\"}]}";

static float wdata[64];
static const int64_t w_shape[2] = {8, 8};

START_TEST(fallback_captured_equals_eager)
{
    char dir[64], path[128];
    tu_fill(wdata, 64, 5);
    st_write_item item = {"w", TP_F32, 2, w_shape, wdata};
    tu_write_graph(dir, path, FALLBACK_GRAPH, &item, 1);
    tp_engine *cap = tu_engine(path, 1, 0), *eager = tu_engine(path, 1, 1), *off = tu_engine(path, 0, 1);
    for (int b = 1; b <= 5; b++) {
        float x[5 * 32];
        tu_fill(x, 5 * 32, (unsigned)b);
        int64_t shape[3] = {b, 4, 8};
        tp_host_tensor in = tu_f32("x", x, 3, shape);
        int n1, n2, n3;
        tp_host_tensor *a = tu_infer(cap, &in, 1, &n1), *e = tu_infer(eager, &in, 1, &n2), *o = tu_infer(off, &in, 1, &n3);
        for (int i = 0; i < n1; i++)
            ck_assert_mem_eq(a[i].data, e[i].data, a[i].nbytes); /* bit-identical */
        ck_assert(tu_rel_diff(a, o, n1) <= TU_RTOL_REORDER); /* passes off: other kernels */
        tp_host_tensors_free(a, n1);
        tp_host_tensors_free(e, n2);
        tp_host_tensors_free(o, n3);
    }
    tp_engine_stats st;
    tp_engine_get_stats(cap, &st);
    ck_assert_int_eq(st.executions, 5);
    tp_engine_free(cap);
    tp_engine_free(eager);
    tp_engine_free(off);
    tu_rmdir(dir);
}
END_TEST

/* Drives tp_exec directly to see its buffers. */
typedef struct {
    tp_graph *g;
    tp_backend *b;
    tp_rank_group *rg;
    tp_weights *w;
} rig;

static rig make_rig(const char *path, int64_t batch)
{
    rig r = {0};
    tp_err err = {{0}};
    r.g = tu_load_passed(path, batch, NULL);
    ck_assert(tp_backend_create("cpu", 2, &r.b, &err) == TP_OK);
    ck_assert(tp_rank_group_create(&(tp_rank_group_opts){.world = 2}, &r.rg, &err) == TP_OK);
    ck_assert_msg(tp_weights_load(r.g, r.b, r.rg, &r.w, &err) == TP_OK, "%s", err.msg);
    return r;
}

/* The fallback graph, its weights filled from seed, in a new dir. */
static rig fallback_rig(unsigned seed, char *dir, char *path)
{
    tu_fill(wdata, 64, seed);
    st_write_item item = {"w", TP_F32, 2, w_shape, wdata};
    tu_write_graph(dir, path, FALLBACK_GRAPH, &item, 1);
    return make_rig(path, 2);
}

static void free_rig(rig *r)
{
    tp_weights_free(r->w);
    tp_rank_group_free(r->rg);
    tp_backend_destroy(r->b);
    tp_graph_free(r->g);
}

START_TEST(addresses_stable_over_1000_replays)
{
    char dir[64], path[128];
    rig r = fallback_rig(6, dir, path);
    tp_exec *cap, *eager;
    tp_exec_opts eo = {.eager = 1};
    tp_err err = {{0}};
    ck_assert_msg(tp_exec_create(r.g, 2, r.b, r.rg, r.w, NULL, &cap, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(tp_exec_create(r.g, 2, r.b, r.rg, r.w, &eo, &eager, &err) == TP_OK, "%s", err.msg);
    int n = r.g->n_nodes;
    void *before[2][64];
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++)
            before[k][i] = tp_exec_node_tensor(cap, k, i).data;
    const tp_plan *p = tp_exec_plan(cap);
    int hoisted = -1, symmetric = -1;
    for (int i = 0; i < n; i++) {
        if (p->buf[i].hoisted)
            hoisted = i;
        if (p->buf[i].kind == TP_MEM_SYMMETRIC)
            symmetric = i;
    }
    ck_assert_int_ge(hoisted, 0);
    ck_assert_int_ge(symmetric, 0);
    float x[2 * 32], y1[2 * 4 * 8], y2[2 * 4 * 8], f1[64], f2[64];
    int64_t xs[3] = {2, 4, 8};
    tp_tensor in = tp_tensor_make(x, TP_F32, 3, xs);
    tp_tensor o1[2] = {tp_exec_output_desc(cap, 0), tp_exec_output_desc(cap, 1)}, o2[2] = {o1[0], o1[1]};
    o1[0].data = y1;
    o1[1].data = f1;
    o2[0].data = y2;
    o2[1].data = f2;
    for (int it = 0; it < 1000; it++) {
        tu_fill(x, 64, (unsigned)it + 100);
        ck_assert_msg(tp_exec_run(cap, &in, o1, NULL, &err) == TP_OK, "%s", err.msg);
        ck_assert_msg(tp_exec_run(eager, &in, o2, NULL, &err) == TP_OK, "%s", err.msg);
        ck_assert_mem_eq(y1, y2, sizeof y1);
        ck_assert_mem_eq(f1, f2, sizeof f1);
    }
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < n; i++)
            ck_assert_ptr_eq(before[k][i], tp_exec_node_tensor(cap, k, i).data);
    tp_exec_free(cap);
    tp_exec_free(eager);
    free_rig(&r);
    tu_rmdir(dir);
}
END_TEST

static void run_batch(tp_exec *x, int64_t batch, unsigned seed, float *y, float *f)
{
    float xin[4 * 32];
    tu_fill(xin, (int)batch * 32, seed);
    int64_t xs[3] = {batch, 4, 8};
    tp_tensor in = tp_tensor_make(xin, TP_F32, 3, xs);
    tp_tensor o[2] = {tp_exec_output_desc(x, 0), tp_exec_output_desc(x, 1)};
    o[0].data = y;
    o[1].data = f;
    tp_err err = {{0}};
    ck_assert_msg(tp_exec_run(x, &in, o, NULL, &err) == TP_OK, "%s", err.msg);
}

/* Issue 49 (6): executables of several batches bound into one pool (the
 * engine's) use the same memory, in turns, and give bit for bit what each
 * gives in arenas of its own, whatever ran in between (the hoisted
 * fallback output and the symmetric buffers included). A plan larger than
 * the pool is refused naming the arena, until the pool grows. */
START_TEST(executables_sharing_a_pool_match_their_own_arenas)
{
    char dir[64], path[128];
    rig r = fallback_rig(7, dir, path);
    tp_err err = {{0}};
    tp_exec *own[2], *shared[2];
    const int64_t batch[2] = {2, 4};
    for (int i = 0; i < 2; i++) {
        ck_assert_msg(tp_exec_create(r.g, batch[i], r.b, r.rg, r.w, NULL, &own[i], &err) == TP_OK, "%s", err.msg);
        ck_assert_msg(tp_exec_prepare(r.g, batch[i], r.b, r.rg, r.w, NULL, &shared[i], &err) == TP_OK, "%s", err.msg);
    }
    tp_exec_pool *pool;
    ck_assert_msg(tp_exec_pool_create(r.b, r.rg, tp_exec_plan(shared[0])->arena_bytes, &pool, &err) == TP_OK, "%s",
                  err.msg);
    ck_assert(tp_exec_pool_fits(pool, tp_exec_plan(shared[0])));
    ck_assert(!tp_exec_pool_fits(pool, tp_exec_plan(shared[1])));
    ck_assert_int_eq(tp_exec_bind(shared[1], pool, &err), TP_INTERNAL);
    ck_assert_msg(strstr(err.msg, "batch 4 needs a") && strstr(err.msg, "the shared pool has"), "%s", err.msg);
    ck_assert_msg(tp_exec_pool_grow(pool, tp_exec_plan(shared[1])->arena_bytes, &err) == TP_OK, "%s", err.msg);
    int64_t bytes[TP_MEM_KINDS];
    tp_exec_pool_bytes(pool, bytes);
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        ck_assert_int_eq(bytes[k], tp_exec_plan(shared[1])->arena_bytes[k]); /* 2x batch 2's: exactly batch 4's */
    for (int i = 0; i < 2; i++)
        ck_assert_msg(tp_exec_bind(shared[i], pool, &err) == TP_OK, "%s", err.msg);
    /* the same memory: each arena's first buffer at the same address */
    const tp_graph *g0 = tp_exec_graph(shared[0]);
    int in0 = g0->input_ids[0];
    for (int k = 0; k < 2; k++)
        ck_assert_ptr_eq(tp_exec_node_tensor(shared[0], k, in0).data, tp_exec_node_tensor(shared[1], k, in0).data);
    for (int it = 0; it < 20; it++) {
        int i = (it * 7 / 3) % 2; /* both orders, repeats */
        float y1[4 * 32], y2[4 * 32], f1[4 * 32], f2[4 * 32];
        run_batch(own[i], batch[i], (unsigned)it + 1, y1, f1);
        run_batch(shared[i], batch[i], (unsigned)it + 1, y2, f2);
        ck_assert_mem_eq(y1, y2, (size_t)batch[i] * 32 * sizeof(float));
        ck_assert_mem_eq(f1, f2, (size_t)batch[i] * 32 * sizeof(float));
    }
    for (int i = 0; i < 2; i++) {
        tp_exec_free(shared[i]);
        tp_exec_free(own[i]);
    }
    tp_exec_pool_free(pool);
    free_rig(&r);
    tu_rmdir(dir);
}
END_TEST

START_TEST(capture_outside_backend_memory_is_refused)
{
    tp_backend *b;
    tp_err err = {{0}};
    ck_assert(tp_backend_create("cpu", 1, &b, &err) == TP_OK);
    float stack_in[4] = {1, 2, 3, 4}, *heap_out;
    ck_assert(b->iface->alloc(b, 0, sizeof stack_in, (void **)&heap_out, &err) == TP_OK);
    int64_t s[1] = {4};
    tp_tensor in = tp_tensor_make(stack_in, TP_F32, 1, s), out = tp_tensor_make(heap_out, TP_F32, 1, s);
    tp_attrs a = {0};
    ck_assert(b->iface->begin_capture(b, 0, &err) == TP_OK);
    void *p;
    ck_assert_int_ne(b->iface->alloc(b, 0, 16, &p, &err), TP_OK); /* no allocation during capture */
    ck_assert(strstr(err.msg, "during capture"));
    ck_assert(b->iface->run_op(b, 0, TP_OP_RELU, &a, &in, 1, &out, &err) == TP_OK);
    tp_capture *c = NULL;
    ck_assert_int_ne(b->iface->end_capture(b, 0, &c, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "not a live backend allocation"), "%s", err.msg);
    ck_assert_ptr_null(c);
    b->iface->free(b, 0, heap_out);
    tp_backend_destroy(b);
}
END_TEST

static void passes_on_off(const char *path, const char *inputs, const char *ref, double rtol)
{
    (void)ref;
    int n_in, n1, n2;
    tp_host_tensor *in = tu_load_tensors(inputs, &n_in);
    tp_engine *on = tu_engine(path, 1, 0), *off = tu_engine(path, 0, 0);
    tp_host_tensor *a = tu_infer(on, in, n_in, &n1), *b = tu_infer(off, in, n_in, &n2);
    ck_assert_msg(tu_rel_diff(a, b, n1) <= rtol, "%s: passes change results by %g", path, tu_rel_diff(a, b, n1));
    tp_host_tensors_free(a, n1);
    tp_host_tensors_free(b, n2);
    tp_host_tensors_free(in, n_in);
    tp_engine_free(on);
    tp_engine_free(off);
}

START_TEST(examples_same_with_passes_on_and_off)
{
    tu_foreach_example(passes_on_off);
}
END_TEST

Suite *exec_suite(void)
{
    Suite *s = suite_create("exec");
    TCase *tc = tcase_create("exec");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fallback_captured_equals_eager);
    tcase_add_test(tc, addresses_stable_over_1000_replays);
    tcase_add_test(tc, capture_outside_backend_memory_is_refused);
    tcase_add_test(tc, executables_sharing_a_pool_match_their_own_arenas);
    tcase_add_test(tc, examples_same_with_passes_on_and_off);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(exec_suite)
