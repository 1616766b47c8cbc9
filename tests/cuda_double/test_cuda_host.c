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
#include <sched.h>
#include <stdatomic.h>
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
#include "cuda/cuda_backend.h"
#include "cuda/tp_cuda_ops.h"
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
        tu_check_shapes(path, out, n_out, ref, n_ref);
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

/* Issue 49 (4): a graph that mixes batch rows runs each exact batch in
 * its own executable, kept in a cache of 8: many batch sizes evict many
 * executables. Each used to allocate its own symmetric arena, and a freed
 * window is only released with the communicator: every eviction kept an
 * ncclMemAlloc allocation and an NCCL window for good. Executables now bind
 * into the engine's one pool, so the count stays where the first request
 * left it, plus one for growing the pool past the largest bucket. */
START_TEST(evicted_executables_leak_no_symmetric_memory)
{
    char dir[64], path[128];
    float w[8 * 8];
    tu_fill(w, 64, 3);
    int64_t ws[2] = {8, 8};
    st_write_item item = {"w", TP_F32, 2, ws, w};
    tu_write_graph(dir, path,
                   "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"mix\",\"world_size\":2,"
                   "\"weights\":\"w.safetensors\","
                   "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",8]}],"
                   "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[8,8]}],"
                   "\"nodes\":[{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"x\",\"w\"]},"
                   "{\"name\":\"y\",\"op\":\"all_reduce\",\"inputs\":[\"h\"],\"attrs\":{\"op\":\"sum\"}},"
                   "{\"name\":\"s\",\"op\":\"softmax\",\"inputs\":[\"y\"],\"attrs\":{\"dim\":0}}],"
                   "\"outputs\":[{\"name\":\"s\"}]}",
                   &item, 1);
    tp_engine *e;
    tp_err err;
    ck_assert_msg(cuda_engine(path, &e, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(!tp_engine_padded(e, NULL), "the graph must run exact batches");
    static float x[40 * 8];
    tu_fill(x, 40 * 8, 4);
    int allocs0 = -1, windows0 = -1;
    /* 12 sizes > the 8 cached: from the second round on every batch evicts;
     * 40 is past the largest bucket (16): the pool grows, once */
    static const int64_t batches[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 40};
    int n_batches = (int)(sizeof batches / sizeof batches[0]);
    for (int round = 0; round < 3; round++)
        for (int i = 0; i < n_batches; i++) {
            int64_t xs[2] = {batches[i], 8};
            tp_host_tensor in = tu_f32("x", x, 2, xs);
            int n;
            tp_host_tensor *out = tu_infer(e, &in, 1, &n);
            ck_assert_int_eq(out[0].shape[0], batches[i]);
            tp_host_tensors_free(out, n);
            if (allocs0 < 0) {
                allocs0 = dbl_nccl_allocations();
                windows0 = dbl_nccl_windows();
            }
        }
    int allocs = dbl_nccl_allocations(), windows = dbl_nccl_windows();
    tp_engine_stats es;
    tp_engine_get_stats(e, &es);
    printf("cuda double: %d exact executables (cache of 8) on 2 ranks: rank 0 holds %d ncclMemAlloc allocations and "
           "%d windows after the first, %d and %d after all; shared symmetric arena %lld B\n",
           3 * n_batches, allocs0, windows0, allocs, windows, (long long)es.arena_bytes[TP_MEM_SYMMETRIC]);
    ck_assert_msg(allocs <= allocs0 + 1 && windows <= windows0 + 1,
                  "evicted executables leaked symmetric memory: %d ncclMemAlloc allocations and %d windows after the "
                  "first request, %d and %d after %d executables",
                  allocs0, windows0, allocs, windows, 3 * n_batches);
    ck_assert_ptr_null(tp_engine_lost(e));
    tp_engine_free(e);
    ck_assert_int_eq(dbl_nccl_allocations(), 0);
    tu_rmdir(dir);
    assert_no_breach("evicted executables");
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
    {"nccl_async:1:33", "megatron_block_tp2", "NCCL async error (a run)", TP_BACKEND, 1, 0},
    {"die:1:1", "mlp_sp_tp2", "peer death mid-replay", TP_UNAVAILABLE, 1, 0},
    {"die:3:1", "megatron_block_tp4", "peer death mid-replay", TP_UNAVAILABLE, 1, 0},
    {"embed_id:1:1", "vocab_embed_i32_tp2", "bad id (benign)", TP_INVALID, 0, 1},
    /* A bad id makes the step benign only if nothing else failed: an NCCL
     * error in the same step (rank 1's 21st look, its first of the run) is
     * found by copy_out, since a benign step skips synchronize, and loses
     * the engine. */
    {"embed_id:1:1,nccl_async:1:21", "vocab_embed_i32_tp2", "bad id + NCCL async error", TP_BACKEND, 1, 0},
    /* A collective that never completes, NCCL's async error set: only the
     * watchdog's look at it (ncclCommGetAsyncError every tick) ends the
     * wait, within a tick, not at the double's hang limit or the step
     * timeout. The 10th exchange is the warm-up's reduce-scatter at
     * creation, the 22nd the run's (one symmetric pool per engine: no
     * exchanges for a symmetric arena per bucket). */
    {"nccl_stall:1:10", "mlp_sp_tp2", "NCCL stall at creation", TP_BACKEND, 0, 0},
    {"nccl_stall:1:22", "mlp_sp_tp2", "NCCL stall in a run", TP_BACKEND, 1, 0},
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

/* ------------------------------- the cross-rank protocol (issue 49, 3)
 *
 * The double's barrier and one-shot kernels run kernels/cuda/
 * comm_protocol.h on a host thread, as the device's meet() does. Here two
 * ranks' control blocks live in this process (peer_flags point at both),
 * and "rank 1" is a thread, or nobody. */

typedef struct {
    unsigned long long flags[2][TP_CUDA_CTRL_FLAGS];
    unsigned long long counters[2][TP_CUDA_CTRL_COUNTERS];
    tp_cuda_error err[2];
    int abort_word[2];
} two_blocks;

static tp_cuda_sync sync_of(two_blocks *m, int rank, unsigned long long timeout_ms)
{
    tp_cuda_sync s;
    memset(&s, 0, sizeof s);
    s.rank = rank;
    s.world = 2;
    s.flags = m->flags[rank];
    s.counters = m->counters[rank];
    s.peer_flags[0] = m->flags[0];
    s.peer_flags[1] = m->flags[1];
    s.err = &m->err[rank];
    s.abort = &m->abort_word[rank];
    s.timeout_ns = timeout_ms * 1000000ull;
    return s;
}

static tp_cuda_peers peers_of(void *a, void *b)
{
    tp_cuda_peers p;
    memset(&p, 0, sizeof p);
    p.p[0] = a;
    p.p[1] = b;
    return p;
}

/* A barrier, then a one-shot all_reduce (64 waits: 32 blocks, in and
 * out), on s; ms each took. */
static void run_both(const tp_cuda_sync *s, cudaStream_t st, double ms[2])
{
    static float in[64], out[64];
    tp_cuda_peers p = peers_of(in, in);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(tp_cuda_barrier(s, TP_CUDA_SLOT_FUSED_IN, st), 0);
    ck_assert_int_eq(cudaStreamSynchronize(st), cudaSuccess);
    ms[0] = ms_since(&t0);
    clock_gettime(CLOCK_MONOTONIC, &t0);
    ck_assert_int_eq(tp_cuda_oneshot_all_reduce(s, &p, out, 64, TP_F32, 0, st), 0);
    ck_assert_int_eq(cudaStreamSynchronize(st), cudaSuccess);
    ms[1] = ms_since(&t0);
}

typedef struct {
    two_blocks *m;
    int rank, rounds;
} rank_arg;

static void *protocol_rank(void *p)
{
    rank_arg *a = p;
    tp_cuda_sync s = sync_of(a->m, a->rank, 5000);
    cudaStream_t st;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    for (int i = 0; i < a->rounds; i++) {
        double ms[2];
        run_both(&s, st, ms);
    }
    cudaStreamDestroy(st);
    return NULL;
}

/* Two ranks that issue the same sequence meet every time, and their epochs
 * (the counters each kernel advances itself) stay equal. */
START_TEST(protocol_two_ranks_meet)
{
    static two_blocks m;
    memset(&m, 0, sizeof m);
    rank_arg a[2] = {{&m, 0, 3}, {&m, 1, 3}};
    pthread_t t[2];
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(pthread_create(&t[r], NULL, protocol_rank, &a[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(m.err[r].code, TP_CUDA_ERR_NONE);
    ck_assert_int_eq(m.counters[0][TP_CUDA_SLOT_FUSED_IN * TP_CUDA_SYNC_BLOCKS], 3);
    ck_assert_mem_eq(m.counters[0], m.counters[1], sizeof m.counters[0]);
    ck_assert_msg(ms_since(&t0) < 4000, "3 rounds took %.0f ms", ms_since(&t0));
}
END_TEST

/* A peer that never arrives costs one timeout, not one per wait left in
 * the step: meet() used to ignore an error word already set, so the
 * one-shot's 64 waits each waited their own timeout (here 64 x 150 ms;
 * on a GPU 64 x 30 s). The report names the peer. */
START_TEST(protocol_dead_peer_costs_one_timeout)
{
    static two_blocks m;
    memset(&m, 0, sizeof m);
    tp_cuda_sync s = sync_of(&m, 0, 150);
    cudaStream_t st;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    double ms[2];
    run_both(&s, st, ms);
    ck_assert_int_eq(m.err[0].code, TP_CUDA_ERR_BARRIER_TIMEOUT);
    ck_assert_int_eq(m.err[0].a, 1); /* the peer waited for */
    ck_assert_int_eq(m.err[0].b, TP_CUDA_SLOT_FUSED_IN);
    ck_assert_msg(ms[0] >= 140 && ms[0] < 2000, "the barrier gave up after %.0f ms (timeout 150)", ms[0]);
    ck_assert_msg(ms[1] < 500, "the one-shot after it took %.0f ms: each wait waited for the dead peer again", ms[1]);
    /* the epochs still advanced: a later agreement of the ranks is not off by one */
    ck_assert_int_eq(m.counters[0][TP_CUDA_SLOT_ONESHOT_OUT * TP_CUDA_SYNC_BLOCKS + 31], 1);
    cudaStreamDestroy(st);
    printf("protocol: a dead peer: barrier %.0f ms (timeout 150 ms), then the one-shot %.1f ms\n", ms[0], ms[1]);
}
END_TEST

static void *set_abort_later(void *p)
{
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    __atomic_store_n((int *)p, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* The host's abort word ends a wait at once (ncclCommRevoke never reaches
 * our kernels): 100 ms, not the 20 s timeout. */
START_TEST(protocol_abort_ends_a_wait)
{
    static two_blocks m;
    memset(&m, 0, sizeof m);
    tp_cuda_sync s = sync_of(&m, 0, 20000);
    cudaStream_t st;
    ck_assert_int_eq(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), cudaSuccess);
    pthread_t t;
    ck_assert_int_eq(pthread_create(&t, NULL, set_abort_later, &m.abort_word[0]), 0);
    double ms[2];
    run_both(&s, st, ms);
    pthread_join(t, NULL);
    ck_assert_int_eq(m.err[0].code, TP_CUDA_ERR_ABORTED);
    ck_assert_int_eq(m.err[0].a, 1);
    ck_assert_msg(ms[0] >= 90 && ms[0] < 2000, "the barrier ended %.0f ms after start (abort at 100 ms)", ms[0]);
    ck_assert_msg(ms[1] < 500, "the one-shot after the abort took %.0f ms", ms[1]);
    cudaStreamDestroy(st);
}
END_TEST

/* A bad id in the error word (benign) must not end waits: the step's
 * barriers still run to the end on every rank, so the epochs stay equal
 * and the next step meets. */
START_TEST(protocol_benign_error_does_not_end_waits)
{
    static two_blocks m;
    memset(&m, 0, sizeof m);
    m.err[0].code = TP_CUDA_ERR_EMBED_ID;
    rank_arg a[2] = {{&m, 0, 2}, {&m, 1, 2}};
    pthread_t t[2];
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(pthread_create(&t[r], NULL, protocol_rank, &a[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    ck_assert_int_eq(m.err[0].code, TP_CUDA_ERR_EMBED_ID);
    ck_assert_int_eq(m.err[1].code, TP_CUDA_ERR_NONE);
    ck_assert_mem_eq(m.counters[0], m.counters[1], sizeof m.counters[0]);
}
END_TEST

/* ------------------------------------- after an abort (issue 49, 1, 2, 5) */

typedef struct {
    tp_backend *b;
    void *in, *out;
    tp_capture *cap;
} captured;

/* A one-rank backend with a captured NCCL all_reduce, replayed once. */
static void capture_all_reduce(captured *c)
{
    tp_err err;
    ck_assert_msg(tp_backend_create("cuda", 1, &c->b, &err) == TP_OK, "%s", err.msg);
    tp_backend *b = c->b;
    ck_assert_msg(b->iface->alloc(b, 0, 256, &c->in, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->alloc(b, 0, 256, &c->out, &err) == TP_OK, "%s", err.msg);
    int64_t shape[1] = {64};
    tp_tensor in = tp_tensor_make(c->in, TP_F32, 1, shape), out = tp_tensor_make(c->out, TP_F32, 1, shape);
    tp_attrs a;
    memset(&a, 0, sizeof a);
    a.reduce = TP_REDUCE_SUM;
    ck_assert_msg(b->iface->begin_capture(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->collective(b, 0, TP_OP_ALL_REDUCE, &a, &in, 1, &out, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->end_capture(b, 0, &c->cap, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->replay(b, 0, c->cap, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(tp_backend_must_exit(b), 0);
}

/* abort is for good (cuda_backend.h, "After an abort"): every call fails
 * at once naming the rank and the abort, reset changes nothing, the
 * process must exit, and, with a replay in flight (so the communicator is
 * revoked), teardown neither waits on the device nor ends the
 * communicator. The old teardown destroyed the graph and then called
 * ncclCommAbort, which after a revoke frees the communicator without
 * waiting for NCCL's destructor of the captured work (init.cc,
 * finalizeCalled): the double reports that destructor touching freed
 * memory. */
START_TEST(abort_is_for_good_and_never_waits)
{
    captured c;
    capture_all_reduce(&c);
    tp_backend *b = c.b;
    tp_err err;
    ck_assert_msg(b->iface->replay(b, 0, c.cap, &err) == TP_OK, "%s", err.msg); /* in flight */
    long launches = dbl_graph_launches();
    b->iface->abort(b);
    ck_assert_int_eq(tp_backend_must_exit(b), 1);
    ck_assert_ptr_nonnull(tp_backend_dead(b));
    ck_assert_int_eq(b->iface->replay(b, 0, c.cap, &err), TP_BACKEND);
    ck_assert_int_eq(dbl_graph_launches(), launches); /* nothing launched after the revoke */
    for (int i = 0; i < 2; i++) {
        ck_assert_int_eq(b->iface->synchronize(b, 0, &err), TP_BACKEND);
        ck_assert_msg(strstr(err.msg, "cuda rank 0") && strstr(err.msg, "aborted"), "%s", err.msg);
        b->iface->reset(b); /* changes nothing */
    }
    ck_assert_int_eq(tp_backend_must_exit(b), 1);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    b->iface->capture_free(b, c.cap);
    b->iface->free(b, 0, c.in);
    b->iface->free(b, 0, c.out);
    tp_backend_destroy(b);
    double ms = ms_since(&t0);
    ck_assert_msg(ms < 500, "teardown after the abort took %.0f ms", ms);
    /* the double's destructors run TP_DOUBLE_DTOR_MS late: give them time
     * to show a freed communicator */
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    assert_no_breach("teardown after an abort");
}
END_TEST

/* An abort of an idle rank (its last synchronize completed: nothing in
 * flight) needs no revoke: the backend is dead for good all the same, but
 * its communicator is destroyed normally at teardown. This is the
 * engine's free after a process group's workers quit (peer_lost), which
 * used to revoke and then ncclCommAbort under the graphs' pending
 * destructors. */
START_TEST(abort_of_an_idle_rank_tears_down)
{
    captured c;
    capture_all_reduce(&c); /* replayed and synchronised */
    tp_backend *b = c.b;
    tp_err err;
    b->iface->peer_lost(b);
    ck_assert_int_eq(tp_backend_must_exit(b), 1);
    ck_assert_int_eq(b->iface->synchronize(b, 0, &err), TP_BACKEND);
    ck_assert_msg(strstr(err.msg, "cuda rank 0") && strstr(err.msg, "aborted"), "%s", err.msg);
    b->iface->capture_free(b, c.cap);
    b->iface->free(b, 0, c.in);
    b->iface->free(b, 0, c.out);
    tp_backend_destroy(b);
    struct timespec ts = {0, 100 * 1000000L};
    nanosleep(&ts, NULL);
    assert_no_breach("teardown after an idle abort");
}
END_TEST

typedef struct {
    captured *c;
    atomic_long after_abort; /* graph launches counted when abort returned */
    atomic_int go;
} race_arg;

static void *abort_soon(void *p)
{
    race_arg *r = p;
    while (!atomic_load(&r->go))
        sched_yield();
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
    r->c->b->iface->abort(r->c->b);
    atomic_store(&r->after_abort, dbl_graph_launches());
    return NULL;
}

/* Replays racing an abort from another thread (the group's watchdog): once
 * abort has returned (the communicator revoked), no replay launches its
 * graph. The dead check used to be only cu_enter's: a replay past it
 * launched after the revoke, whose NCCL kernels then run against the dead
 * peer with NCCL's abort flags already cleared (init.cc commRevokeAsync). */
START_TEST(no_launch_after_a_revoke)
{
    for (int round = 0; round < 20; round++) {
        captured c;
        capture_all_reduce(&c);
        race_arg r = {.c = &c};
        atomic_init(&r.after_abort, -1);
        atomic_init(&r.go, 0);
        pthread_t t;
        ck_assert_int_eq(pthread_create(&t, NULL, abort_soon, &r), 0);
        tp_err err;
        atomic_store(&r.go, 1);
        while (c.b->iface->replay(c.b, 0, c.cap, &err) == TP_OK)
            ;
        pthread_join(t, NULL);
        ck_assert_msg(strstr(err.msg, "rank 0"), "%s", err.msg);
        long at_abort = atomic_load(&r.after_abort), now = dbl_graph_launches();
        ck_assert_msg(now == at_abort, "round %d: %ld graph launch(es) after the revoke", round, now - at_abort);
        c.b->iface->capture_free(c.b, c.cap);
        tp_backend_destroy(c.b);
    }
    assert_no_breach("replays racing an abort");
}
END_TEST

/* The same race, made to happen every time: the abort comes between the
 * replay's last check and its cudaGraphLaunch (the double's hook runs
 * there, starts the abort on another thread, waits until it has marked
 * the backend dead and gives it 20 ms to revoke). The revoke must wait
 * for that launch (launch_fence), so no launch is counted after abort
 * returns. Before the fix the dead check was only cu_enter's and nothing
 * fenced the launch: the revoke finished first and the launch followed it
 * (1 graph launch after the revoke, every run). */
static race_arg *fenced;
static pthread_t fenced_thread;

static void *abort_now(void *p)
{
    race_arg *r = p;
    r->c->b->iface->abort(r->c->b);
    atomic_store(&r->after_abort, dbl_graph_launches());
    return NULL;
}

static void abort_at_the_launch(void)
{
    dbl_before_graph_launch = NULL; /* this launch only */
    ck_assert_int_eq(pthread_create(&fenced_thread, NULL, abort_now, fenced), 0);
    while (!tp_backend_must_exit(fenced->c->b))
        sched_yield();
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
}

START_TEST(an_abort_at_the_launch_waits_for_it)
{
    captured c;
    capture_all_reduce(&c);
    race_arg r = {.c = &c};
    atomic_init(&r.after_abort, -1);
    fenced = &r;
    dbl_before_graph_launch = abort_at_the_launch;
    tp_err err;
    tp_status st = c.b->iface->replay(c.b, 0, c.cap, &err);
    pthread_join(fenced_thread, NULL);
    long at_abort = atomic_load(&r.after_abort), now = dbl_graph_launches();
    ck_assert_msg(now == at_abort, "%ld graph launch(es) after the revoke (replay: %s)", now - at_abort,
                  st == TP_OK ? "ok" : err.msg);
    ck_assert_int_ne(c.b->iface->replay(c.b, 0, c.cap, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "rank 0"), "%s", err.msg);
    c.b->iface->capture_free(c.b, c.cap);
    tp_backend_destroy(c.b);
    assert_no_breach("an abort at the launch");
}
END_TEST

/* ---------------------------------------- more failures (issue 49, 7) */

/* Any failure of the symmetric-memory probe (ncclDevCommCreate: across
 * nodes it activates GIN) means "no symmetric memory", never a failed
 * backend: it used to fail creation for anything but ncclInvalidUsage.
 * The example then runs on the fallback (CUDA IPC in the double). */
START_TEST(a_failed_symmetric_probe_means_no_symmetric_memory)
{
    setenv("TP_DOUBLE_FAIL", "devcomm:1:1", 1);
    char path[512], in[512], ref[512];
    example_paths("mlp_sp_tp2", path, in, ref, sizeof path);
    run_example(path, in, ref, 0);
}
END_TEST

/* A bad gather id is found on the device after the step's work, like a bad
 * embedding id: TP_INVALID naming the rank, benign (the backend is not
 * aborted), and the next request runs. */
START_TEST(a_bad_gather_id_is_benign)
{
    char dir[64], path[128];
    float w[8 * 4];
    tu_fill(w, 32, 3);
    int64_t ws[2] = {8, 4};
    st_write_item item = {"w", TP_F32, 2, ws, w};
    tu_write_graph(dir, path,
                   "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"g\",\"world_size\":1,"
                   "\"weights\":\"w.safetensors\","
                   "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT32\",\"shape\":[\"B\",2]}],"
                   "\"params\":[{\"name\":\"w\",\"datatype\":\"FP32\",\"shape\":[8,4]}],"
                   "\"nodes\":[{\"name\":\"g\",\"op\":\"gather\",\"inputs\":[\"w\",\"ids\"],"
                   "\"attrs\":{\"dim\":0}}],"
                   "\"outputs\":[{\"name\":\"g\"}]}",
                   &item, 1);
    /* every bucket's warm-up runs a gather at creation: the 30th is a request's */
    setenv("TP_DOUBLE_FAIL", "gather_id:0:30", 1);
    tp_engine *e;
    tp_err err;
    ck_assert_msg(cuda_engine(path, &e, &err) == TP_OK, "%s", err.msg);
    int32_t ids[3 * 2] = {0, 1, 2, 3, 4, 5};
    int64_t is[2] = {3, 2};
    tp_host_tensor in = tu_tensor("ids", TP_I32, ids, 2, is), *out;
    int n = 0;
    tp_status st = TP_OK;
    for (int run = 0; run < 40 && st == TP_OK; run++) {
        st = tp_engine_infer(e, &in, 1, &out, &n, &err);
        if (st == TP_OK)
            tp_host_tensors_free(out, n);
    }
    ck_assert_msg(st == TP_INVALID && strstr(err.msg, "rank 0") && strstr(err.msg, "gather"), "%s: %s",
                  tp_status_name(st), err.msg);
    ck_assert_ptr_null(tp_engine_lost(e));
    unsetenv("TP_DOUBLE_FAIL");
    ck_assert_msg(tp_engine_infer(e, &in, 1, &out, &n, &err) == TP_OK, "after: %s", err.msg);
    tp_host_tensors_free(out, n);
    tp_engine_free(e);
    tu_rmdir(dir);
    assert_no_breach("a bad gather id");
}
END_TEST

/* Child processes of this one still running (zombies are gone). */
static int live_children(void)
{
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/task/%d/children", (int)getpid(), (int)getpid());
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    int live = 0;
    for (char *save = NULL, *t = strtok_r(buf, " \n", &save); t; t = strtok_r(NULL, " \n", &save)) {
        char st[64], line[512];
        snprintf(st, sizeof st, "/proc/%s/stat", t);
        FILE *g = fopen(st, "r");
        if (!g)
            continue;
        char state = 'Z';
        if (fgets(line, sizeof line, g)) {
            const char *rp = strrchr(line, ')');
            if (rp && rp[1] == ' ')
                state = rp[2];
        }
        fclose(g);
        live += state != 'Z';
    }
    return live;
}

/* After a failed step every process's backend is revoked, and its device
 * may still run captured NCCL work that never completes: the engine says
 * the process must exit (the server does, readiness 503 meanwhile), and
 * every worker leaves by itself instead of following a group whose
 * backends can never run again (its orchestrator restarts it; the
 * leader sees it go). */
START_TEST(a_dead_backend_ends_every_process)
{
    setenv("TP_DOUBLE_FAIL", "replay:1:1", 1);
    char path[512], in_path[512], ref_path[512];
    example_paths("megatron_block_tp2", path, in_path, ref_path, sizeof path);
    tp_engine *e;
    tp_err err;
    ck_assert_msg(cuda_engine(path, &e, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(tp_engine_must_exit(e), 0);
    ck_assert_int_gt(live_children(), 0);
    int n_in, n_out;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *out;
    ck_assert_int_eq(tp_engine_infer(e, in, n_in, &out, &n_out, &err), TP_BACKEND);
    ck_assert_ptr_nonnull(tp_engine_lost(e));
    ck_assert_int_eq(tp_engine_must_exit(e), 1);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (live_children() > 0 && ms_since(&t0) < 5000) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    ck_assert_msg(live_children() == 0, "a worker whose backend died still runs after %.0f ms", ms_since(&t0));
    printf("a dead backend: the worker exited %.0f ms after the failed step\n", ms_since(&t0));
    tp_host_tensors_free(in, n_in);
    tp_engine_free(e);
    assert_no_breach("a dead backend ends every process");
}
END_TEST

/* ------------------------------------------- the device probe (issue 49, 8) */

/* A GPU machine whose driver CUDA cannot use must fail the device suite,
 * not skip it: the probe says -1 and names the node and CUDA's error when
 * a GPU device node exists; 0 (skip) only without one. The double's
 * cudaGetDeviceCount fails when TP_DOUBLE_DEVICES=0; the node is a file in
 * a directory of the test's. */
START_TEST(probe_fails_when_a_device_node_exists)
{
    char dir[64], node[96], why[512];
    snprintf(dir, sizeof dir, "/tmp/tp_probe_%d", (int)getpid());
    ck_assert_int_eq(mkdir(dir, 0700), 0);
    ck_assert_int_eq(tp_cuda_probe_machine(dir, why, sizeof why), 8); /* the double's default devices */
    setenv("TP_DOUBLE_DEVICES", "0", 1);
    ck_assert_int_eq(tp_cuda_probe_machine(dir, why, sizeof why), 0); /* no node: skip */
    snprintf(node, sizeof node, "%s/nvidiactl", dir);                 /* not a GPU's node */
    FILE *f = fopen(node, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(tp_cuda_probe_machine(dir, why, sizeof why), 0);
    snprintf(node, sizeof node, "%s/nvidia0", dir);
    f = fopen(node, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(tp_cuda_probe_machine(dir, why, sizeof why), -1);
    ck_assert_msg(strstr(why, node) && strstr(why, "cudaErrorNoDevice"), "%s", why);
    ck_assert_int_eq(tp_cuda_probe(why, sizeof why), 0); /* `auto` still falls back to cpu */
    ck_assert_int_eq(cudaGetLastError(), cudaSuccess);  /* nothing left pending */
    unlink(node);
    snprintf(node, sizeof node, "%s/nvidiactl", dir);
    unlink(node);
    rmdir(dir);
    unsetenv("TP_DOUBLE_DEVICES");
}
END_TEST

/* ------------------------------------------- the registry entry and the device code */

/* tpserve knows what the cuda backend runs without loading its device code
 * (cuda_kind.c, for `tpserve plan --backend cuda`); the device code's own
 * table (cuda_ops.c) must agree op by op, or a graph planned as runnable
 * would fail on a GPU (and tpserve refuses such a library at load). */
START_TEST(capabilities_agree_with_device_code)
{
    const tp_backend_kind *k = tp_backend_find("cuda");
    ck_assert_ptr_eq(k, &tp_cuda_backend_kind);
    ck_assert_uint_eq(tp_cuda_device_entry.size, sizeof(tp_cuda_device_api));
    ck_assert_int_eq(tp_cuda_device_entry.op_count, TP_OP_COUNT);
    int compute = 0;
    for (int i = 0; i < TP_OP_COUNT; i++) {
        tp_op_kind kind = tp_op_kind_of((tp_op)i);
        if (kind != TP_KIND_COMPUTE && kind != TP_KIND_COPY)
            continue;
        compute++;
        ck_assert_msg(k->supports_op((tp_op)i, TP_F32) == tp_cuda_device_entry.has_kernel((tp_op)i),
                      "op '%s': cuda_kind.c says %d, cuda_ops.c %d", tp_op_name((tp_op)i),
                      k->supports_op((tp_op)i, TP_F32), tp_cuda_device_entry.has_kernel((tp_op)i));
    }
    ck_assert_int_gt(compute, 10);
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

/* matmul_rows' two paths (cuda_ops.c): eagerly (a fallback node) one
 * GEMM per run of wanted rows and the other runs zeroed; in a capture one
 * GEMM over every row, then zero_rows. The double's GEMM writes nothing
 * and its zero_rows zeroes, so both outputs, filled with 0x7f bytes
 * first, must keep that fill in wanted rows and be +0.0 in the others. */
START_TEST(matmul_rows_gemms_only_wanted_rows_eagerly)
{
    enum { B = 5, K = 4, N = 3 };
    const int64_t mask_v[B] = {1, 1, 0, 0, 1}; /* wanted runs [0, 2) and [4, 5) */
    tp_backend *b;
    tp_err err;
    ck_assert_msg(tp_backend_create("cuda", 1, &b, &err) == TP_OK, "%s", err.msg);
    void *p[5];
    for (int i = 0; i < 5; i++)
        ck_assert_msg(b->iface->alloc(b, 0, 256, &p[i], &err) == TP_OK, "%s", err.msg);
    int64_t sx[2] = {B, K}, sw[2] = {K, N}, sm[1] = {B}, so[2] = {B, N};
    tp_tensor ins[3] = {tp_tensor_make(p[0], TP_F32, 2, sx), tp_tensor_make(p[1], TP_F32, 2, sw),
                        tp_tensor_make(p[2], TP_I64, 1, sm)};
    tp_tensor host_mask = tp_tensor_make((void *)mask_v, TP_I64, 1, sm);
    ck_assert_msg(b->iface->copy_in(b, 0, &ins[2], &host_mask, &err) == TP_OK, "%s", err.msg);
    tp_tensor out[2] = {tp_tensor_make(p[3], TP_F32, 2, so), tp_tensor_make(p[4], TP_F32, 2, so)};
    float fill[B][N];
    memset(fill, 0x7f, sizeof fill);
    tp_tensor host_fill = tp_tensor_make(fill, TP_F32, 2, so);
    for (int i = 0; i < 2; i++)
        ck_assert_msg(b->iface->copy_in(b, 0, &out[i], &host_fill, &err) == TP_OK, "%s", err.msg);
    tp_attrs a;
    memset(&a, 0, sizeof a);

    long calls = dbl_gemm_calls(), cols = dbl_gemm_cols();
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_MATMUL_ROWS, &a, ins, 3, &out[0], &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(dbl_gemm_calls() - calls, 2);
    ck_assert_int_eq(dbl_gemm_cols() - cols, 3);

    calls = dbl_gemm_calls(), cols = dbl_gemm_cols();
    tp_capture *cap;
    ck_assert_msg(b->iface->begin_capture(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_MATMUL_ROWS, &a, ins, 3, &out[1], &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->end_capture(b, 0, &cap, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(dbl_gemm_calls() - calls, 1);
    ck_assert_int_eq(dbl_gemm_cols() - cols, B);
    ck_assert_msg(b->iface->replay(b, 0, cap, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "%s", err.msg);

    float host[2][B][N];
    for (int i = 0; i < 2; i++) {
        tp_tensor h = tp_tensor_make(host[i], TP_F32, 2, so);
        ck_assert_msg(b->iface->copy_out(b, 0, &h, &out[i], &err) == TP_OK, "%s", err.msg);
        for (int r = 0; r < B; r++) {
            uint32_t want = mask_v[r] ? 0x7f7f7f7fu : 0, got;
            for (int c = 0; c < N; c++) {
                memcpy(&got, &host[i][r][c], sizeof got);
                ck_assert_msg(got == want, "%s path: row %d col %d is %08x, want %08x", i ? "captured" : "eager", r,
                              c, got, want);
            }
        }
    }
    b->iface->capture_free(b, cap);
    for (int i = 0; i < 5; i++)
        b->iface->free(b, 0, p[i]);
    tp_backend_destroy(b);
    assert_no_breach("matmul_rows");
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
    tcase_add_test(rules, matmul_rows_gemms_only_wanted_rows_eagerly);
    TCase *ex = add_case(s, "examples", 300);
    tcase_add_test(ex, one_rank);
    tcase_add_test(ex, allocations_start_zeroed);
    tcase_add_test(ex, evicted_executables_leak_no_symmetric_memory);
    tcase_add_test(ex, examples_on_2_and_4_ranks);
    tcase_add_test(ex, examples_without_symmetric_memory);
    tcase_add_test(ex, a_failed_ipc_handle_falls_back_and_leaves_no_error);
    TCase *proto = add_case(s, "protocol", 60);
    tcase_add_test(proto, protocol_two_ranks_meet);
    tcase_add_test(proto, protocol_dead_peer_costs_one_timeout);
    tcase_add_test(proto, protocol_abort_ends_a_wait);
    tcase_add_test(proto, protocol_benign_error_does_not_end_waits);
    tcase_add_test(proto, probe_fails_when_a_device_node_exists);
    tcase_add_test(proto, capabilities_agree_with_device_code);
    tcase_add_test(ex, a_failed_symmetric_probe_means_no_symmetric_memory);
    tcase_add_test(ex, a_bad_gather_id_is_benign);
    TCase *ab = add_case(s, "after an abort", 120);
    tcase_add_test(ab, abort_is_for_good_and_never_waits);
    tcase_add_test(ab, abort_of_an_idle_rank_tears_down);
    tcase_add_test(ab, no_launch_after_a_revoke);
    tcase_add_test(ab, an_abort_at_the_launch_waits_for_it);
    tcase_add_test(ab, a_dead_backend_ends_every_process);
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
