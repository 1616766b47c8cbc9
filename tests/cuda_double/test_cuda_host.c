/* test_cuda_host.c — the cuda backend's host code against the CUDA/NCCL/
 * cuBLASLt double (cuda_double.h), without a GPU.
 *
 * This binary is also its own worker: a process group's leader (the test)
 * starts ranks 1..d-1 as `/proc/self/exe worker GRAPH --backend cuda`, so
 * every rank is a separate process with its own "device", as on a node.
 *
 * What it shows: the example graphs load, capture and replay through the
 * backend on 1, 2 and 4 ranks without breaking a rule the double enforces;
 * every injected failure (alloc, window, comm init, capture, replay, NCCL
 * async error, peer death, a bad embedding id) returns an error naming the
 * rank within the step timeout, tears down without a hang (and without a
 * leak under ASan), and a dead peer leaves the engine lost (readiness
 * 503). Values are not checked: kernels do not run here (test_cuda_plan
 * and the cpu backend check the math). */
#include <check.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "cuda_double.h"
#include "backend.h"
#include "engine.h"
#include "testutil.h"
#include "worker.h"

#define STEP_TIMEOUT_MS 15000

static char rule_log[64];

/* The environment every rank inherits: a rule log of this test, and a
 * launcher's LOCAL_RANK (every spawned worker must get its
 * own, or NCCL refuses two ranks on one device). */
static void setup(void)
{
    snprintf(rule_log, sizeof rule_log, "/tmp/tp_double_rules_%d.log", (int)getpid());
    unlink(rule_log);
    setenv("TP_DOUBLE_LOG", rule_log, 1);
    setenv("TP_DOUBLE_HANG_MS", "10000", 1);
    setenv("LOCAL_RANK", "1", 1);
    unsetenv("TP_DOUBLE_FAIL");
    unsetenv("TP_DOUBLE_SYMMETRIC");
}

static void teardown(void) { unlink(rule_log); }

/* Rule breaches of every process of the test (the log is shared). */
static void assert_no_breach(const char *what)
{
    struct stat st;
    int logged = stat(rule_log, &st) == 0 ? (int)st.st_size : 0;
    ck_assert_msg(dbl_rule_breaches() == 0 && logged == 0, "%s: the double saw rules broken (see stderr)", what);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

static int graph_world(const char *path)
{
    tp_graph *g;
    tp_err err;
    ck_assert_msg(tp_graph_load(path, &g, &err) == TP_OK, "%s", err.msg);
    int w = g->world_size;
    tp_graph_free(g);
    return w;
}

/* A cuda engine: a thread group for one rank, else this process as rank 0
 * and this binary as the workers. */
static tp_status cuda_engine(const char *path, tp_engine **e, tp_err *err)
{
    tp_worker_spec spec = {.graph = path, .backend = "cuda"};
    char **argv = tp_worker_argv(&spec);
    ck_assert_ptr_nonnull(argv);
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv, .step_timeout_ms = STEP_TIMEOUT_MS,
                             .staging_bytes = 8 << 20, .heap_bytes = 1 << 20};
    /* small buffers: the workers take the leader's settings */
    tp_backend_settings bs;
    tp_backend_settings_default(&bs);
    bs.cuda_scratch_mb = 1;
    bs.cuda_gemm_workspace_mb = 1;
    tp_engine_opts o = {.backend = "cuda", .group = graph_world(path) > 1 ? &go : NULL, .settings = &bs};
    tp_status st = tp_engine_create(path, &o, e, err);
    tp_worker_argv_free(argv);
    return st;
}

/* Same names, dtypes and shapes as the reference (values are not the
 * double's business). */
static void check_shapes(const char *path, const tp_host_tensor *out, int n_out, const tp_host_tensor *ref, int n_ref)
{
    ck_assert_int_eq(n_out, n_ref);
    for (int i = 0; i < n_out; i++) {
        const tp_host_tensor *r = NULL;
        for (int j = 0; j < n_ref && !r; j++)
            r = strcmp(ref[j].name, out[i].name) == 0 ? &ref[j] : NULL;
        ck_assert_msg(r, "%s: output %s has no reference", path, out[i].name);
        ck_assert_int_eq(out[i].dtype, r->dtype);
        ck_assert_int_eq(out[i].ndim, r->ndim);
        for (int d = 0; d < r->ndim; d++)
            ck_assert_int_eq(out[i].shape[d], r->shape[d]);
    }
}

/* ----------------------------------------------------------- examples */

static int examples_run;

static void run_example(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    (void)rtol;
    tp_engine *e;
    tp_err err;
    ck_assert_msg(cuda_engine(path, &e, &err) == TP_OK, "%s: %s", path, err.msg);
    int n_in, n_ref, n_out;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *ref = tu_load_tensors(ref_path, &n_ref), *out;
    for (int run = 0; run < 2; run++) { /* the second replays the same graphs */
        ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: %s", path, err.msg);
        check_shapes(path, out, n_out, ref, n_ref);
        tp_host_tensors_free(out, n_out);
    }
    ck_assert_ptr_null(tp_engine_lost(e));
    tp_host_tensors_free(in, n_in);
    tp_host_tensors_free(ref, n_ref);
    tp_engine_free(e);
    assert_no_breach(path);
    examples_run++;
}

START_TEST(examples_on_2_and_4_ranks)
{
    tu_foreach_example(run_example);
    ck_assert_int_ge(examples_run, 10);
    ck_assert_int_gt(dbl_graph_launches(), 0);
    ck_assert_int_gt(dbl_kernel_launches(), 0);
    printf("cuda double: %d examples on 2 and 4 ranks: %ld graph launches, %ld kernel launches on rank 0, no rule "
           "broken\n",
           examples_run, dbl_graph_launches(), dbl_kernel_launches());
}
END_TEST

/* Without NCCL symmetric memory NCCL 2.28 still hands out a (local) window:
 * the backend must not read peer bases from it, and must run anyway. */
START_TEST(examples_without_symmetric_memory)
{
    setenv("TP_DOUBLE_SYMMETRIC", "0", 1);
    char path[512], in[512], ref[512];
    const char *dir = getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs";
    snprintf(path, sizeof path, "%s/megatron_block_tp4.json", dir);
    snprintf(in, sizeof in, "%s/megatron_block_tp4.inputs.safetensors", dir);
    snprintf(ref, sizeof ref, "%s/megatron_block_tp4.ref.safetensors", dir);
    run_example(path, in, ref, 0);
}
END_TEST

START_TEST(one_rank)
{
    char dir[64], path[128];
    float w[8 * 8];
    tu_fill(w, 64, 3);
    int64_t ws[2] = {8, 8};
    st_write_item item = {"w", TP_F32, 2, ws, w};
    tu_write_graph(dir, path,
                   "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"one\",\"world_size\":1,"
                   "\"weights\":\"w.safetensors\","
                   "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",8]}],"
                   "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[8,8]}],"
                   "\"nodes\":[{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]},"
                   "{\"name\":\"a\",\"op\":\"gelu\",\"inputs\":[\"h\"]},"
                   "{\"name\":\"y\",\"op\":\"all_reduce\",\"inputs\":[\"a\"],\"attrs\":{\"op\":\"sum\"}}],"
                   "\"outputs\":[{\"name\":\"y\"}]}",
                   &item, 1);
    tp_engine *e;
    tp_err err;
    ck_assert_msg(cuda_engine(path, &e, &err) == TP_OK, "%s", err.msg);
    float x[3 * 8];
    tu_fill(x, 24, 4);
    int64_t xs[2] = {3, 8};
    tp_host_tensor in = tu_f32("x", x, 2, xs);
    for (int run = 0; run < 3; run++) {
        int n;
        tp_host_tensor *out = tu_infer(e, &in, 1, &n);
        ck_assert_int_eq(n, 1);
        ck_assert_int_eq(out[0].shape[0], 3);
        tp_host_tensors_free(out, n);
    }
    tp_engine_free(e);
    tu_rmdir(dir);
    assert_no_breach("one rank");
}
END_TEST

/* A4: a warm-up before capture runs on whatever the arenas hold, so they
 * must hold zeros (the double fills new memory with 0xa5). */
START_TEST(allocations_start_zeroed)
{
    tp_backend *b;
    tp_err err;
    ck_assert_msg(tp_backend_create("cuda", 1, &b, &err) == TP_OK, "%s", err.msg);
    void *p[2];
    ck_assert_msg(b->iface->alloc(b, 0, 256, &p[0], &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->alloc_symmetric(b, 0, 256, &p[1], &err) == TP_OK, "%s", err.msg);
    int64_t shape[1] = {64};
    for (int i = 0; i < 2; i++) {
        int32_t host[64], zeros[64] = {0};
        memset(host, 0x5a, sizeof host);
        tp_tensor dev = tp_tensor_make(p[i], TP_I32, 1, shape), out = tp_tensor_make(host, TP_I32, 1, shape);
        ck_assert_msg(b->iface->copy_out(b, 0, &out, &dev, &err) == TP_OK, "%s", err.msg);
        ck_assert_mem_eq(host, zeros, sizeof zeros); /* bit-exact: memset to 0 */
        b->iface->free(b, 0, p[i]);
    }
    tp_backend_destroy(b);
    assert_no_breach("allocations start zeroed");
}
END_TEST

/* ----------------------------------------------------------- failures */

typedef struct {
    const char *fail;  /* TP_DOUBLE_FAIL */
    const char *graph; /* example name */
    const char *where; /* the phase it hits, for the table */
    tp_status want;    /* the status of the first failing call */
    int lost;          /* the engine is lost (a process is gone, or a step left the
                        * backend dead for good): readiness 503 */
    int recovers;      /* a later request succeeds (a benign failure) */
} injection;

static const injection injections[] = {
    {"alloc:1:1", "mlp_sp_tp2", "backend create, local step", TP_BACKEND, 0, 0},
    {"alloc:3:12", "megatron_block_tp4", "allocation at load", TP_BACKEND, 0, 0},
    {"window:1:1", "mlp_sp_tp2", "control block window (create)", TP_BACKEND, 0, 0},
    {"comm_init:2:1", "mlp_sp_tp4", "ncclCommInitRank", TP_BACKEND, 0, 0},
    {"capture:1:1", "mlp_sp_tp2", "end of capture", TP_BACKEND, 0, 0},
    {"replay:1:1", "megatron_block_tp2", "graph launch", TP_BACKEND, 1, 0},
    {"nccl_async:1:12", "mlp_sp_tp2", "NCCL async error (setup)", TP_BACKEND, 0, 0},
    {"nccl_async:1:40", "megatron_block_tp2", "NCCL async error (a run)", TP_BACKEND, 1, 0},
    {"die:1:1", "mlp_sp_tp2", "peer death mid-replay", TP_UNAVAILABLE, 1, 0},
    {"die:3:1", "megatron_block_tp4", "peer death mid-replay", TP_UNAVAILABLE, 1, 0},
    {"embed_id:1:1", "vocab_embed_i32_tp2", "bad id (benign)", TP_INVALID, 0, 1},
    /* A bad id makes the step benign only if nothing else failed: an NCCL
     * error in the same step (rank 1's 28th look, its first of the run) is
     * found by copy_out, since a benign step skips synchronize, and loses
     * the engine. */
    {"embed_id:1:1,nccl_async:1:28", "vocab_embed_i32_tp2", "bad id + NCCL async error", TP_BACKEND, 1, 0},
    /* A collective that never completes, NCCL's async error set: only the
     * watchdog's look at it (ncclCommGetAsyncError every tick) ends the
     * wait, within a tick, not at the double's hang limit or the step
     * timeout. The 10th exchange is the warm-up's reduce-scatter at
     * creation, the 38th the run's. */
    {"nccl_stall:1:10", "mlp_sp_tp2", "NCCL stall at creation", TP_BACKEND, 0, 0},
    {"nccl_stall:1:38", "mlp_sp_tp2", "NCCL stall in a run", TP_BACKEND, 1, 0},
};

static void example_paths(const char *name, char *path, char *in, char *ref, size_t cap)
{
    const char *dir = getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs";
    snprintf(path, cap, "%s/%s.json", dir, name);
    snprintf(in, cap, "%s/%s.inputs.safetensors", dir, name);
    snprintf(ref, cap, "%s/%s.ref.safetensors", dir, name);
}

/* A failed cudaIpcGetMemHandle on one rank sends every rank to the
 * fallback; the failure is handled there, so it must not stay pending for
 * the next kernel launch to report as its own (the double's launches
 * return the pending error, as cudaGetLastError after a real launch). The
 * second handle: the first is the control block's, taken on the creating
 * thread, and CUDA's last error is per host thread; the second is a
 * buffer's, taken on the thread that then runs the steps. */
START_TEST(a_failed_ipc_handle_falls_back_and_leaves_no_error)
{
    setenv("TP_DOUBLE_SYMMETRIC", "0", 1); /* the CUDA IPC path */
    setenv("TP_DOUBLE_FAIL", "ipc_handle:1:2", 1);
    char path[512], in[512], ref[512];
    example_paths("mlp_sp_tp2", path, in, ref, sizeof path);
    run_example(path, in, ref, 0);
}
END_TEST

/* A lost engine names the failing rank, and every later request fails at
 * once (no step runs) with TP_UNAVAILABLE and that same reason. */
static void assert_lost_for_good(tp_engine *e, const char *fail, const char *want_rank, const tp_host_tensor *in,
                                 int n_in)
{
    const char *lost = tp_engine_lost(e);
    ck_assert_msg(strstr(lost, want_rank), "%s: the lost reason does not name %s: %s", fail, want_rank, lost);
    unsetenv("TP_DOUBLE_FAIL"); /* only the engine's state can fail it now */
    tp_host_tensor *out;
    int n_out;
    tp_err err;
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tp_status st = tp_engine_infer(e, in, n_in, &out, &n_out, &err);
    double took = ms_since(&t0);
    ck_assert_msg(st == TP_UNAVAILABLE, "%s: later request: %s: %s", fail, tp_status_name(st), err.msg);
    ck_assert_msg(strcmp(err.msg, lost) == 0, "%s: later request says '%s', not '%s'", fail, err.msg, lost);
    ck_assert_msg(took < 1000, "%s: %.0f ms to refuse a later request", fail, took);
}

START_TEST(injected_failure)
{
    const injection *j = &injections[_i];
    setenv("TP_DOUBLE_FAIL", j->fail, 1);
    int rank = atoi(strchr(j->fail, ':') + 1);
    char path[512], in_path[512], ref_path[512], want_rank[32];
    example_paths(j->graph, path, in_path, ref_path, sizeof path);
    snprintf(want_rank, sizeof want_rank, "rank %d", rank);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    tp_engine *e = NULL;
    tp_err err;
    tp_status st = cuda_engine(path, &e, &err);
    tp_host_tensor *in = NULL, *out;
    int n_in = 0, n_out;
    if (st == TP_OK) {
        in = tu_load_tensors(in_path, &n_in);
        clock_gettime(CLOCK_MONOTONIC, &t0); /* time to error counts from the failing request */
        st = tp_engine_infer(e, in, n_in, &out, &n_out, &err);
    }
    double took = ms_since(&t0);
    ck_assert_msg(st != TP_OK, "%s: no error", j->fail);
    ck_assert_msg(st == j->want, "%s: status %s, want %s: %s", j->fail, tp_status_name(st), tp_status_name(j->want),
                  err.msg);
    ck_assert_msg(strstr(err.msg, want_rank), "%s: the error does not name %s: %s", j->fail, want_rank, err.msg);
    ck_assert_msg(took < STEP_TIMEOUT_MS, "%s: %.0f ms to the error", j->fail, took);
    const char *lost = e ? tp_engine_lost(e) : NULL;
    ck_assert_msg(!lost == !j->lost, "%s: engine lost '%s', want %s", j->fail, lost ? lost : "(no)",
                  j->lost ? "lost" : "not lost");
    if (lost)
        assert_lost_for_good(e, j->fail, want_rank, in, n_in);
    if (e && j->recovers) { /* no rank was revoked for it: the next request runs */
        unsetenv("TP_DOUBLE_FAIL");
        ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: after: %s", j->fail, err.msg);
        tp_host_tensors_free(out, n_out);
    }
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    tp_engine_free(e);
    double teardown_ms = ms_since(&t1);
    tp_host_tensors_free(in, n_in);
    printf("| %-16s | %-30s | %-11s | %-4s | %7.0f ms | %6.0f ms | %.90s\n", j->fail, j->where,
           tp_status_name(st), lost ? "503" : "-", took, teardown_ms, err.msg);
    fflush(stdout);
    assert_no_breach(j->fail);
}
END_TEST

/* ------------------------------------------- the double enforces rules */

/* Each rule the backend relies on, broken on purpose: the double must see
 * it, or a clean run above would prove nothing. */
START_TEST(double_refuses_allocation_in_capture)
{
    cudaStream_t s;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    void *p = NULL;
    ck_assert_int_eq(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    cudaGraph_t g;
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    ck_assert_int_eq(dbl_rule_breaches(), 2);
    cudaStreamDestroy(s);
}
END_TEST

START_TEST(double_refuses_unjoined_fork)
{
    cudaStream_t a, b;
    cudaEvent_t ev;
    char *buf;
    ck_assert_int_eq(cudaMalloc((void **)&buf, 64), cudaSuccess);
    cudaStreamCreateWithFlags(&a, 0);
    cudaStreamCreateWithFlags(&b, 0);
    cudaEventCreateWithFlags(&ev, 0);
    ck_assert_int_eq(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaEventRecord(ev, a);
    cudaStreamWaitEvent(b, ev, 0); /* fork */
    cudaMemsetAsync(buf, 0, 64, b);
    cudaGraph_t g;
    ck_assert_int_eq(cudaStreamEndCapture(a, &g), cudaErrorStreamCaptureUnjoined);
    ck_assert_int_eq(dbl_rule_breaches(), 1);
    /* joined, it captures, instantiates and replays */
    ck_assert_int_eq(cudaStreamBeginCapture(a, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaEventRecord(ev, a);
    cudaStreamWaitEvent(b, ev, 0);
    cudaMemsetAsync(buf, 7, 64, b);
    cudaEventRecord(ev, b);
    cudaStreamWaitEvent(a, ev, 0);
    ck_assert_int_eq(cudaStreamEndCapture(a, &g), cudaSuccess);
    ck_assert_int_eq(buf[0], (char)0xa5); /* recorded, not run */
    cudaGraphExec_t x;
    ck_assert_int_eq(cudaGraphLaunch((cudaGraphExec_t)(void *)g, a), cudaErrorInvalidValue); /* not instantiated */
    ck_assert_int_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    cudaGraphDestroy(g);
    ck_assert_int_eq(cudaGraphLaunch(x, a), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(a), cudaSuccess); /* the launch runs on the stream, later */
    ck_assert_int_eq(buf[0], 7);
    ck_assert_int_eq(dbl_rule_breaches(), 2);
    cudaGraphExecDestroy(x);
    cudaEventDestroy(ev);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFree(buf);
}
END_TEST

/* NCCL 2.28: abort while a graph holds NCCL work would hang; revoke
 * instead wakes a wait that no peer will ever end. */
START_TEST(double_models_abort_and_revoke)
{
    ncclUniqueId id;
    ncclComm_t c;
    ck_assert_int_eq(ncclGetUniqueId(&id), ncclSuccess);
    ck_assert_int_eq(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, 0);
    float *buf;
    cudaMalloc((void **)&buf, 16);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    ck_assert_int_eq(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s), ncclSuccess);
    cudaGraph_t g;
    cudaGraphExec_t x;
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    cudaGraphInstantiate(&x, g, 0);
    cudaGraphDestroy(g);
    ck_assert_int_eq(cudaGraphLaunch(x, s), cudaSuccess);
    ck_assert_int_eq(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT), ncclSuccess);
    ck_assert_int_eq(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s), ncclInvalidUsage);
    ck_assert_int_eq(ncclCommAbort(c), ncclSuccess); /* the exec still holds NCCL work */
    ck_assert_int_eq(dbl_rule_breaches(), 1);
    cudaGraphExecDestroy(x);
    cudaStreamDestroy(s);
    cudaFree(buf);
}
END_TEST

typedef struct {
    ncclUniqueId id;
    int rank, device;
    ncclResult_t r;
} join_arg;

static void *join(void *p)
{
    join_arg *a = p;
    ncclComm_t c = NULL;
    cudaSetDevice(a->device);
    a->r = ncclCommInitRank(&c, 2, a->id, a->rank);
    if (a->r == ncclSuccess)
        ncclCommDestroy(c);
    return NULL;
}

START_TEST(double_refuses_duplicate_device)
{
    for (int dup = 0; dup < 2; dup++) {
        join_arg a[2];
        ck_assert_int_eq(ncclGetUniqueId(&a[0].id), ncclSuccess);
        a[1].id = a[0].id;
        pthread_t t[2];
        for (int r = 0; r < 2; r++) {
            a[r].rank = r;
            a[r].device = dup ? 0 : r;
            pthread_create(&t[r], NULL, join, &a[r]);
        }
        for (int r = 0; r < 2; r++) {
            pthread_join(t[r], NULL);
            ck_assert_int_eq(a[r].r, dup ? ncclInvalidUsage : ncclSuccess);
        }
    }
    ck_assert_int_eq(dbl_rule_breaches(), 0);
}
END_TEST

/* ------------------------------------ issue 49: a more faithful double */

/* Streams are queues run later, by their own threads: a host read before
 * the sync sees the old bytes, and a stream that uses another's result
 * without cudaStreamWaitEvent runs before it. (A lag of a minute: nothing
 * runs unless something waits for it.) */
START_TEST(double_streams_run_asynchronously)
{
    setenv("TP_DOUBLE_STREAM_LAG_MS", "60000", 1);
    cudaStream_t a, b;
    cudaEvent_t ev;
    char *dev, *host;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    ck_assert_int_eq(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&dev, 64), cudaSuccess);
    ck_assert_int_eq(cudaHostAlloc((void **)&host, 64, cudaHostAllocPortable), cudaSuccess);
    memset(host, 1, 64);
    ck_assert_int_eq(cudaMemsetAsync(dev, 7, 64, a), cudaSuccess);
    ck_assert_int_eq(cudaMemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, a), cudaSuccess);
    ck_assert_int_eq(host[0], 1); /* read before the sync */
    ck_assert_int_eq(cudaStreamQuery(a), cudaErrorNotReady);
    ck_assert_int_eq(cudaGetLastError(), cudaErrorNotReady); /* left pending, as CUDA does */
    ck_assert_int_eq(cudaStreamSynchronize(a), cudaSuccess);
    ck_assert_int_eq(host[0], 7);
    /* b reads what a writes, without waiting for it: the old bytes */
    ck_assert_int_eq(cudaMemsetAsync(dev, 9, 64, a), cudaSuccess);
    ck_assert_int_eq(cudaMemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, b), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(b), cudaSuccess);
    ck_assert_int_eq(host[0], 7);
    /* with the event: a's work up to the record first */
    ck_assert_int_eq(cudaMemsetAsync(dev, 3, 64, a), cudaSuccess);
    ck_assert_int_eq(cudaEventRecord(ev, a), cudaSuccess);
    ck_assert_int_eq(cudaMemsetAsync(dev, 4, 64, a), cudaSuccess); /* after the record: not waited for */
    ck_assert_int_eq(cudaStreamWaitEvent(b, ev, 0), cudaSuccess);
    ck_assert_int_eq(cudaMemcpyAsync(host, dev, 64, cudaMemcpyDeviceToHost, b), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(b), cudaSuccess);
    ck_assert_int_eq(host[0], 3);
    ck_assert_int_eq(cudaDeviceSynchronize(), cudaSuccess);
    ck_assert_int_eq(dev[0], 4);
    ck_assert_int_eq(dbl_rule_breaches(), 0);
    cudaFreeHost(host);
    cudaFree(dev);
    cudaEventDestroy(ev);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
}
END_TEST

/* CUDA: a capturing stream may not wait on an event recorded outside the
 * capture unless it asks for an external wait node. */
START_TEST(double_refuses_outside_event_in_capture)
{
    cudaStream_t a, b;
    cudaEvent_t ev;
    char *dev;
    cudaGraph_t g;
    ck_assert_int_eq(cudaMalloc((void **)&dev, 64), cudaSuccess);
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    ck_assert_int_eq(cudaMemsetAsync(dev, 5, 64, a), cudaSuccess);
    ck_assert_int_eq(cudaEventRecord(ev, a), cudaSuccess); /* outside any capture */
    ck_assert_int_eq(cudaStreamBeginCapture(b, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ck_assert_int_eq(cudaStreamWaitEvent(b, ev, 0), cudaErrorStreamCaptureIsolation);
    ck_assert_int_eq(cudaStreamEndCapture(b, &g), cudaErrorStreamCaptureInvalidated);
    ck_assert_int_eq(dbl_rule_breaches(), 1);
    (void)cudaGetLastError();
    ck_assert_int_eq(cudaStreamBeginCapture(b, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ck_assert_int_eq(cudaStreamWaitEvent(b, ev, cudaEventWaitExternal), cudaSuccess);
    ck_assert_int_eq(cudaMemsetAsync(dev, 6, 64, b), cudaSuccess);
    ck_assert_int_eq(cudaStreamEndCapture(b, &g), cudaSuccess);
    cudaGraphExec_t x;
    ck_assert_int_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    ck_assert_int_eq(cudaGraphLaunch(x, b), cudaSuccess);
    ck_assert_int_eq(cudaStreamSynchronize(b), cudaSuccess);
    ck_assert_int_eq(dev[0], 6);
    ck_assert_int_eq(dbl_rule_breaches(), 1);
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaEventDestroy(ev);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
    cudaFree(dev);
}
END_TEST

typedef struct {
    ncclUniqueId id;
    ncclComm_t comm;
    volatile int done;
} quiet_rank;

/* Rank 1 of a two-rank communicator that joins and then never issues
 * anything: a dead peer, as far as rank 0's kernels can tell. */
static void *join_quiet(void *p)
{
    quiet_rank *q = p;
    cudaSetDevice(1);
    ck_assert_int_eq(ncclCommInitRank(&q->comm, 2, q->id, 1), ncclSuccess);
    while (!q->done)
        usleep(1000);
    return NULL;
}

/* NCCL 2.28.9's revoke (init.cc commRevokeAsync) ends the waits in flight,
 * then clears its abort flags: NCCL work of a graph that starts after it
 * runs normally and, against a dead peer, waits for good (here: until the
 * hang limit, a broken rule). Eager calls are refused from then on. */
START_TEST(double_revoke_clears_its_flags_and_leaves_later_replays)
{
    quiet_rank q = {.done = 0};
    ck_assert_int_eq(ncclGetUniqueId(&q.id), ncclSuccess);
    pthread_t t;
    pthread_create(&t, NULL, join_quiet, &q);
    ncclComm_t c;
    cudaSetDevice(0);
    ck_assert_int_eq(ncclCommInitRank(&c, 2, q.id, 0), ncclSuccess);
    cudaStream_t s;
    cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    float *buf;
    cudaMalloc((void **)&buf, 16);
    cudaGraph_t g;
    cudaGraphExec_t x;
    ck_assert_int_eq(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    ck_assert_int_eq(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s), ncclSuccess);
    ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
    ck_assert_int_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
    ck_assert_int_eq(cudaGraphLaunch(x, s), cudaSuccess);
    ck_assert_int_eq(cudaStreamQuery(s), cudaErrorNotReady); /* waits for rank 1 */
    (void)cudaGetLastError();
    while (dbl_nccl_waits() == 0) /* the replay's all_reduce is waiting for rank 1 */
        usleep(100);
    ck_assert_int_eq(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT), ncclSuccess); /* ends that wait */
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
    ck_assert_int_eq(dbl_rule_breaches(), 0);
    ck_assert_int_eq(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s), ncclInvalidUsage);
    ck_assert_int_eq(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT), ncclInvalidArgument);
    setenv("TP_DOUBLE_HANG_MS", "300", 1); /* the wait below never ends: a short hang limit */
    ck_assert_int_eq(cudaGraphLaunch(x, s), cudaSuccess); /* after the revoke: flags clear */
    ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
    ck_assert_int_eq(dbl_rule_breaches(), 1); /* it waited for the dead peer until the hang limit */
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    ck_assert_int_eq(dbl_destructors_wait(), 0);
    ck_assert_int_eq(ncclCommAbort(c), ncclSuccess); /* nothing holds it any more: no rule */
    ck_assert_int_eq(dbl_rule_breaches(), 1);
    q.done = 1;
    pthread_join(t, NULL);
    ck_assert_int_eq(ncclCommDestroy(q.comm), ncclSuccess);
    cudaStreamDestroy(s);
    cudaFree(buf);
}
END_TEST

/* NCCL's graph destructor is a user object made with
 * cudaUserObjectNoDestructorSync: it runs later, on another thread, not in
 * cudaGraphExecDestroy. A healthy destroy waits for it (commDestroySync);
 * an abort after a revoke does not, and frees what it would touch. */
START_TEST(double_user_object_destructors_run_later)
{
    setenv("TP_DOUBLE_DTOR_MS", "500", 1); /* still pending when checked, even on a loaded machine */
    for (int revoke = 0; revoke < 2; revoke++) {
        ncclUniqueId id;
        ncclComm_t c;
        ck_assert_int_eq(ncclGetUniqueId(&id), ncclSuccess);
        ck_assert_int_eq(ncclCommInitRank(&c, 1, id, 0), ncclSuccess);
        cudaStream_t s;
        cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
        float *buf;
        cudaMalloc((void **)&buf, 16);
        cudaGraph_t g;
        cudaGraphExec_t x;
        cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
        ck_assert_int_eq(ncclAllReduce(buf, buf, 4, ncclFloat32, ncclSum, c, s), ncclSuccess);
        ck_assert_int_eq(cudaStreamEndCapture(s, &g), cudaSuccess);
        ck_assert_int_eq(cudaGraphInstantiate(&x, g, 0), cudaSuccess);
        ck_assert_int_eq(cudaGraphLaunch(x, s), cudaSuccess);
        ck_assert_int_eq(cudaStreamSynchronize(s), cudaSuccess);
        if (revoke)
            ck_assert_int_eq(ncclCommRevoke(c, NCCL_REVOKE_DEFAULT), ncclSuccess);
        cudaGraphDestroy(g);
        cudaGraphExecDestroy(x);
        ck_assert_int_eq(dbl_destructors_pending(), 1); /* not run by the destroy */
        ck_assert_int_eq(revoke ? ncclCommAbort(c) : ncclCommDestroy(c), ncclSuccess);
        ck_assert_int_eq(dbl_rule_breaches(), revoke); /* healthy: waited for it; revoked: freed under it */
        ck_assert_int_eq(dbl_destructors_wait(), 0);
        ck_assert_int_eq(dbl_rule_breaches(), revoke);
        cudaStreamDestroy(s);
        cudaFree(buf);
    }
}
END_TEST

/* CUDA IPC between two processes maps real bytes both ways; a handle of
 * this very process, or TP_DOUBLE_FAIL ipc_open, is refused. */
START_TEST(double_ipc_maps_across_processes)
{
    setenv("TP_DOUBLE_FAIL", "ipc_open:1:1", 1); /* read once: before the first call */
    char *dev, host[64];
    ck_assert_int_eq(cudaMalloc((void **)&dev, 4096), cudaSuccess);
    memset(host, 0x11, sizeof host);
    ck_assert_int_eq(cudaMemcpy(dev, host, sizeof host, cudaMemcpyHostToDevice), cudaSuccess);
    cudaIpcMemHandle_t h;
    ck_assert_int_eq(cudaIpcGetMemHandle(&h, dev), cudaSuccess);
    ck_assert_int_eq(dev[0], 0x11); /* made shareable in place */
    void *mine = NULL;
    ck_assert_int_ne(cudaIpcOpenMemHandle(&mine, h, cudaIpcMemLazyEnablePeerAccess), cudaSuccess);
    (void)cudaGetLastError();
    for (int inject = 0; inject < 2; inject++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (inject)
                setenv("TP_RANK", "1", 1);
            char *peer = NULL, got[64];
            cudaError_t e = cudaIpcOpenMemHandle((void **)&peer, h, cudaIpcMemLazyEnablePeerAccess);
            if (inject)
                _exit(e == cudaErrorPeerAccessUnsupported && !peer ? 0 : 1);
            if (e != cudaSuccess || cudaMemcpy(got, peer, sizeof got, cudaMemcpyDeviceToHost) != cudaSuccess ||
                got[0] != 0x11 || got[63] != 0x11)
                _exit(2);
            peer[1] = 0x22; /* as a peer's kernel would store */
            _exit(cudaIpcCloseMemHandle(peer) == cudaSuccess ? 0 : 3);
        }
        int status = -1;
        ck_assert_int_eq(waitpid(pid, &status, 0), pid);
        ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child %d: status %d", inject, status);
    }
    ck_assert_int_eq(dev[1], 0x22);
    ck_assert_int_eq(cudaFree(dev), cudaSuccess);
    ck_assert_int_eq(dbl_rule_breaches(), 0);
}
END_TEST

/* cuBLASLt finding no algorithm (TP_DOUBLE_FAIL blas_algo) is a clean
 * failure of the op that names the rank, not a crash or a launch. */
START_TEST(no_gemm_algorithm_fails_cleanly)
{
    setenv("TP_DOUBLE_FAIL", "blas_algo:0:1", 1);
    tp_backend *b;
    tp_err err;
    ck_assert_msg(tp_backend_create("cuda", 1, &b, &err) == TP_OK, "%s", err.msg);
    void *p[3];
    for (int i = 0; i < 3; i++)
        ck_assert_msg(b->iface->alloc(b, 0, 256, &p[i], &err) == TP_OK, "%s", err.msg);
    int64_t s[2] = {4, 4};
    tp_tensor in[2] = {tp_tensor_make(p[0], TP_F32, 2, s), tp_tensor_make(p[1], TP_F32, 2, s)};
    tp_tensor out = tp_tensor_make(p[2], TP_F32, 2, s);
    tp_attrs a;
    memset(&a, 0, sizeof a);
    long launches = dbl_kernel_launches();
    tp_status st = b->iface->run_op(b, 0, TP_OP_MATMUL, &a, in, 2, &out, &err);
    ck_assert_int_eq(st, TP_BACKEND);
    ck_assert_msg(strstr(err.msg, "cuda rank 0") && (strstr(err.msg, "cuBLASLt") || strstr(err.msg, "cublasLt")),
                  "%s", err.msg);
    ck_assert_int_eq(dbl_kernel_launches(), launches);
    for (int i = 0; i < 3; i++)
        b->iface->free(b, 0, p[i]);
    tp_backend_destroy(b);
    assert_no_breach("no gemm algorithm");
}
END_TEST

static TCase *add_case(Suite *s, const char *name, int timeout_s)
{
    TCase *tc = tcase_create(name);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, timeout_s);
    suite_add_tcase(s, tc);
    return tc;
}

static Suite *cuda_host_suite(void)
{
    Suite *s = suite_create("cuda_host (double)");
    TCase *rules = add_case(s, "double rules", 30);
    tcase_add_test(rules, double_refuses_allocation_in_capture);
    tcase_add_test(rules, double_refuses_unjoined_fork);
    tcase_add_test(rules, double_models_abort_and_revoke);
    tcase_add_test(rules, double_refuses_duplicate_device);
    tcase_add_test(rules, double_streams_run_asynchronously);
    tcase_add_test(rules, double_refuses_outside_event_in_capture);
    tcase_add_test(rules, double_revoke_clears_its_flags_and_leaves_later_replays);
    tcase_add_test(rules, double_user_object_destructors_run_later);
    tcase_add_test(rules, double_ipc_maps_across_processes);
    tcase_add_test(rules, no_gemm_algorithm_fails_cleanly);
    TCase *ex = add_case(s, "examples", 300);
    tcase_add_test(ex, one_rank);
    tcase_add_test(ex, allocations_start_zeroed);
    tcase_add_test(ex, examples_on_2_and_4_ranks);
    tcase_add_test(ex, examples_without_symmetric_memory);
    tcase_add_test(ex, a_failed_ipc_handle_falls_back_and_leaves_no_error);
    tcase_add_loop_test(add_case(s, "failures", 120), injected_failure, 0,
                        (int)(sizeof injections / sizeof injections[0]));
    return s;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "worker") == 0)
        return tp_worker_main(argc - 1, argv + 1);
    printf("| injected         | where                          | status      | lost | to error   | teardown  | "
           "message\n");
    return tp_check_run(cuda_host_suite());
}
