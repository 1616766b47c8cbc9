/* The backend registry and capabilities: lookups by name, what each
 * backend offers (read without a device), and a backend lacking an op
 * refusing a graph that uses it, naming node, op and backend; the cpu
 * backend's large copies, split over its rank's threads, exact. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "check_main.h"
#include "cpu/cpu_backend.h"
#include "engine.h"
#include "graph.h"
#include "testutil.h"

static const char *graphs_dir(void)
{
    const char *d = getenv("TP_GRAPHS");
    return d ? d : "build/graphs";
}

/* A backend that has every kernel but gelu's. */
static int no_gelu(tp_op op, tp_dtype dtype)
{
    (void)dtype;
    return op != TP_OP_GELU;
}

START_TEST(backend_without_an_op_refuses_the_graph)
{
    tp_backend_kind fake = *tp_backend_default();
    fake.name = "fake";
    fake.supports_op = no_gelu;
    char path[512];
    snprintf(path, sizeof path, "%s/mlp_sp_tp2.json", graphs_dir());
    tp_graph *g;
    tp_err err = {{0}};
    ck_assert_msg(tp_graph_load(path, &g, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(tp_backend_check_graph(tp_backend_default(), g, &err), TP_OK);
    ck_assert_int_eq(tp_backend_check_graph(&fake, g, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "node 'a': backend 'fake' has no kernel for op 'gelu'"), "message: %s", err.msg);
    tp_graph_free(g);
}
END_TEST

START_TEST(registry_by_name)
{
    const tp_backend_kind *cpu = tp_backend_find("cpu");
    ck_assert_ptr_nonnull(cpu);
    ck_assert_ptr_eq(cpu, tp_backend_default());
    ck_assert_ptr_null(tp_backend_find("tpu"));
    ck_assert_ptr_nonnull(strstr(tp_backend_names(), "cpu"));
    tp_backend *b = NULL;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_backend_create("tpu", 1, &b, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "unknown backend 'tpu'"), "%s", err.msg);
    ck_assert_int_eq(tp_backend_create("cpu", 2, &b, &err), TP_OK);
    ck_assert_ptr_eq(b->kind, cpu);
    tp_backend_destroy(b);
}
END_TEST

/* What planning reads: known with no device present. */
START_TEST(capabilities_without_a_device)
{
    const tp_backend_caps *cpu = tp_backend_find("cpu")->caps;
    ck_assert_int_eq(cpu->dma_input_copies, 0);
    ck_assert_int_eq(cpu->f32_activations, 1);
    ck_assert_int_eq(cpu->lowering.large_all_reduce, TP_ALGO_RING);
    ck_assert_int_eq(cpu->lowering.other_collectives, TP_ALGO_ONE_SHOT);
    ck_assert_int_gt(cpu->lowering.one_shot_max_bytes[2], cpu->lowering.one_shot_max_bytes[8]);
#ifdef TP_HAVE_CUDA
    const tp_backend_kind *cuda = tp_backend_find("cuda");
    ck_assert_ptr_nonnull(cuda);
    ck_assert_int_eq(cuda->caps->dma_input_copies, 1);
    ck_assert_int_eq(cuda->caps->f32_activations, 0);
    ck_assert_int_eq(cuda->caps->lowering.large_all_reduce, TP_ALGO_NCCL);
    ck_assert_int_eq(cuda->caps->lowering.other_collectives, TP_ALGO_NCCL);
    ck_assert(cuda->supports_op(TP_OP_MATMUL, TP_F32));
#endif
}
END_TEST

/* The verify_replay setting reaches the cpu backend through the registry:
 * a replay whose recorded buffer was freed is refused, not run. */
START_TEST(verify_replay_setting_checks_replays)
{
    tp_backend_settings s;
    tp_backend_settings_default(&s);
    s.verify_replay = 1;
    tp_backend *b;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_backend_create_with("cpu", 1, &s, &b, &err), TP_OK);
    const tp_backend_iface *bi = b->iface;
    void *x, *y;
    ck_assert_int_eq(bi->alloc(b, 0, 64, &x, &err), TP_OK);
    ck_assert_int_eq(bi->alloc(b, 0, 64, &y, &err), TP_OK);
    int64_t shape[1] = {4};
    tp_tensor tx = tp_tensor_make(x, TP_F32, 1, shape), ty = tp_tensor_make(y, TP_F32, 1, shape);
    tp_capture *c;
    ck_assert_int_eq(bi->begin_capture(b, 0, &err), TP_OK);
    tp_attrs none = {0};
    ck_assert_int_eq(bi->run_op(b, 0, TP_OP_RELU, &none, &tx, 1, &ty, &err), TP_OK);
    ck_assert_int_eq(bi->end_capture(b, 0, &c, &err), TP_OK);
    ck_assert_int_eq(bi->replay(b, 0, c, &err), TP_OK);
    bi->free(b, 0, y);
    ck_assert_int_eq(bi->replay(b, 0, c, &err), TP_INTERNAL);
    ck_assert_msg(strstr(err.msg, "not a live backend allocation"), "%s", err.msg);
    bi->capture_free(b, c);
    bi->free(b, 0, x);
    tp_backend_destroy(b);
}
END_TEST

/* A cpu backend that fails every replay and op once `broken` is set, and
 * from then on reports itself dead, as the cuda backend does after a
 * sticky error: the engine must turn lost (readiness 503) naming the rank
 * and the failure, and refuse later requests at once. */
static int broken;
static const tp_backend_iface *cpu_iface;
static tp_backend_iface dying_iface;

static tp_status dying_replay(tp_backend *b, int rank, tp_capture *c, tp_err *err)
{
    if (broken)
        return tp_fail(err, TP_BACKEND, "dying rank %d: replay failed: injected", rank);
    return cpu_iface->replay(b, rank, c, err);
}

static tp_status dying_run_op(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins, int n_ins,
                              tp_tensor *out, tp_err *err)
{
    if (broken)
        return tp_fail(err, TP_BACKEND, "dying rank %d: op failed: injected", rank);
    return cpu_iface->run_op(b, rank, op, a, ins, n_ins, out, err);
}

static const char *dying_dead(tp_backend *b)
{
    (void)b;
    return broken ? "dying: revoked" : NULL;
}

/* tp_engine_opts.on_lost: counts the calls */
static int told_lost;
static void count_lost(void *arg)
{
    (void)arg;
    told_lost++;
}

/* The failed step makes the engine lost and tells on_lost itself, once:
 * a server learns of it without polling tp_engine_lost. */
START_TEST(dead_backend_makes_the_engine_lost)
{
    char path[512], in_path[512];
    snprintf(path, sizeof path, "%s/mlp_sp_tp2.json", graphs_dir());
    snprintf(in_path, sizeof in_path, "%s/mlp_sp_tp2.inputs.safetensors", graphs_dir());
    tp_engine *e;
    tp_err err = {{0}};
    tp_engine_opts opts = {.on_lost = count_lost};
    ck_assert_msg(tp_engine_create(path, &opts, &e, &err) == TP_OK, "%s", err.msg);
    tp_backend *b = tp_engine_backend(e);
    cpu_iface = b->iface;
    dying_iface = *cpu_iface;
    dying_iface.replay = dying_replay;
    dying_iface.run_op = dying_run_op;
    dying_iface.dead = dying_dead;
    b->iface = &dying_iface;
    int n_in, n_out;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *out;
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s", err.msg);
    tp_host_tensors_free(out, n_out);
    ck_assert_ptr_null(tp_engine_lost(e));

    broken = 1;
    ck_assert_int_eq(told_lost, 0);
    ck_assert_int_eq(tp_engine_infer(e, in, n_in, &out, &n_out, &err), TP_BACKEND);
    ck_assert_int_eq(told_lost, 1);
    const char *lost = tp_engine_lost(e);
    ck_assert_msg(lost && strstr(lost, "backend 'cpu' failed for good: rank ") && strstr(lost, "failed: injected"),
                  "lost: %s", lost ? lost : "(null)");
    ck_assert_int_eq(tp_engine_infer(e, in, n_in, &out, &n_out, &err), TP_UNAVAILABLE);
    ck_assert_str_eq(err.msg, lost);
    ck_assert_int_eq(told_lost, 1);

    broken = 0; /* the cpu teardown runs unhindered */
    tp_host_tensors_free(in, n_in);
    tp_engine_free(e);
}
END_TEST

/* copy_out of 4 MiB or more runs in parts on the rank's pool, cut along
 * the first dim longer than 1: every element lands where one copy puts
 * it, from contiguous and strided sources, for a leading dim of 1 (a
 * batch of one's logits) or not. */
START_TEST(cpu_large_copies_exact)
{
    tp_backend *b;
    tp_err err = {{0}};
    ck_assert_msg(tp_cpu_backend_create(1, NULL, &b, &err) == TP_OK, "%s", err.msg);
    const int64_t shapes[][3] = {{1, 64, 33001}, {3, 1000, 701}, {1, 1, 3000017}};
    for (int c = 0; c < 3; c++)
        for (int strided = 0; strided <= 1; strided++) {
            int64_t n = shapes[c][0] * shapes[c][1] * shapes[c][2];
            float *buf = malloc(sizeof(float) * (size_t)(2 * n)), *got = malloc(sizeof(float) * (size_t)n),
                  *want = malloc(sizeof(float) * (size_t)n);
            ck_assert(buf && got && want);
            for (int64_t i = 0; i < 2 * n; i++)
                buf[i] = (float)(i % 100003);
            int64_t big[3] = {shapes[c][0], shapes[c][1], 2 * shapes[c][2]};
            tp_tensor src = tp_tensor_make(buf, TP_F32, 3, shapes[c]);
            if (strided) { /* every other element of the last dim of a twice wider tensor */
                src = tp_tensor_make(buf, TP_F32, 3, big);
                src.shape[2] = shapes[c][2];
                src.stride[2] = 2;
            }
            tp_tensor dst = tp_tensor_make(got, TP_F32, 3, shapes[c]), ref = tp_tensor_make(want, TP_F32, 3, shapes[c]);
            memset(got, 0xa5, sizeof(float) * (size_t)n);
            tp_tensor_copy(&ref, &src);
            ck_assert_msg(b->iface->copy_out(b, 0, &dst, &src, &err) == TP_OK, "%s", err.msg);
            ck_assert_msg(memcmp(got, want, sizeof(float) * (size_t)n) == 0, "[%lld, %lld, %lld]%s: copy differs",
                          (long long)shapes[c][0], (long long)shapes[c][1], (long long)shapes[c][2],
                          strided ? " strided" : "");
            free(buf), free(got), free(want);
        }
    tp_backend_destroy(b);
}
END_TEST

static Suite *backend_suite(void)
{
    Suite *s = suite_create("backend");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, backend_without_an_op_refuses_the_graph);
    tcase_add_test(tc, registry_by_name);
    tcase_add_test(tc, capabilities_without_a_device);
    tcase_add_test(tc, verify_replay_setting_checks_replays);
    tcase_add_test(tc, dead_backend_makes_the_engine_lost);
    tcase_add_test(tc, cpu_large_copies_exact);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(backend_suite)
