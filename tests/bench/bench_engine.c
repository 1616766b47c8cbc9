/* bench_engine — cpu-backend benchmarks that print tables (never asserts:
 * these machines are noisy; tests check correctness, this measures).
 *
 *   bench_engine replay   eager vs captured replay, per request and per
 *                         node, for a graph of hundreds of tiny nodes and
 *                         the example MLP; planned vs naive bytes
 *   bench_engine passes   the sequence-parallel MLP at several sizes with
 *                         and without fuse_tp; bytes fusion did not
 *                         materialize; the same for the slice/cat forms
 *                         of reduce_scatter / all_gather on another dim */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clock.h"
#include "cpu/cpu_ops.h"
#include "engine.h"
#include "graph.h"
#include "passes.h"
#include "plan.h"
#include "safetensors.h"

static void fill(float *p, int64_t n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 1;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = ((float)((s >> 8) & 0xffff) / 32768.0f - 1.0f) * 0.1f;
    }
}

static int write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(text, f);
    return fclose(f);
}

/* Median of `reps` timings of one request, in microseconds. */
static double time_request(tp_engine *e, tp_host_tensor *in, int n_in, int reps)
{
    double *t = malloc(sizeof(double) * (size_t)reps), med;
    for (int r = -3; r < reps; r++) { /* 3 warm-ups */
        tp_host_tensor *out;
        int n;
        tp_err err;
        double t0 = tp_now_us();
        if (tp_engine_infer(e, in, n_in, &out, &n, &err) != TP_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            exit(1);
        }
        if (r >= 0)
            t[r] = tp_now_us() - t0;
        tp_host_tensors_free(out, n);
    }
    for (int i = 1; i < reps; i++) /* insertion sort: reps is small */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    med = t[reps / 2];
    free(t);
    return med;
}

static tp_engine *engine_with(const char *path, const tp_engine_opts *o)
{
    tp_engine *e;
    tp_err err;
    if (tp_engine_create(path, o, &e, &err) != TP_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
    return e;
}

static tp_engine *engine(const char *path, int passes, int eager)
{
    return engine_with(path, &(tp_engine_opts){.backend = "cpu", .no_passes = !passes, .eager = eager});
}

static void plan_bytes(const char *path, int64_t batch, int passes, int64_t *planned, int64_t *naive, int *nodes)
{
    tp_graph *g;
    tp_err err;
    tp_plan *p;
    tp_pass_opts po;
    tp_pass_result res[TP_PASS_COUNT];
    tp_pass_opts_default(&po);
    for (int i = 0; !passes && i < TP_PASS_COUNT; i++)
        po.disabled[i] = 1;
    if (tp_graph_load(path, &g, &err) != TP_OK || tp_graph_infer(g, batch, &err) != TP_OK ||
        tp_run_passes(g, &po, res, &err) != TP_OK || tp_graph_infer(g, batch, &err) != TP_OK ||
        tp_plan_build(g, &p, &err) != TP_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
    *planned = p->peak_bytes;
    *naive = p->naive_bytes;
    *nodes = 0;
    for (int i = 0; i < g->n_nodes; i++)
        *nodes += tp_plan_node_runs(g, i);
    tp_plan_free(p);
    tp_graph_free(g);
}

/* x [B, 16] through `n` tiny elementwise nodes with an all_reduce every 50. */
static void write_tiny_graph(const char *dir, int n, char *path)
{
    size_t cap = (size_t)n * 160 + 1024;
    char *nodes = malloc(cap), *json = malloc(cap + 512);
    size_t off = 0;
    const char *ops[3] = {"relu", "silu", "gelu"};
    for (int i = 0; i < n; i++) {
        char prev[32];
        snprintf(prev, sizeof prev, i ? "n%d" : "x", i - 1);
        if (i % 50 == 49)
            off += (size_t)snprintf(nodes + off, cap - off, "%s{\"name\":\"n%d\",\"op\":\"all_reduce\",\"inputs\":[\"%s\"],\"attrs\":{\"op\":\"avg\"}}",
                                    i ? "," : "", i, prev);
        else if (i % 2)
            off += (size_t)snprintf(nodes + off, cap - off, "%s{\"name\":\"n%d\",\"op\":\"add\",\"inputs\":[\"%s\",\"x\"]}",
                                    i ? "," : "", i, prev);
        else
            off += (size_t)snprintf(nodes + off, cap - off, "%s{\"name\":\"n%d\",\"op\":\"%s\",\"inputs\":[\"%s\"]}",
                                    i ? "," : "", i, ops[i % 3], prev);
    }
    snprintf(json, cap + 512,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"tiny\",\"world_size\":2,"
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",16]}],"
             "\"nodes\":[%s],\"outputs\":[{\"name\":\"n%d\"}]}", nodes, n - 1);
    snprintf(path, 256, "%s/tiny.json", dir);
    write_text(path, json);
    free(nodes);
    free(json);
}

/* Two 2-D FP32 weights of deterministic values into dir/file. */
static void write_weights(const char *dir, const char *file, const char *n1, const int64_t *s1, const char *n2,
                          const int64_t *s2)
{
    char wpath[256];
    float *w1 = malloc(sizeof(float) * (size_t)(s1[0] * s1[1])), *w2 = malloc(sizeof(float) * (size_t)(s2[0] * s2[1]));
    fill(w1, s1[0] * s1[1], 1);
    fill(w2, s2[0] * s2[1], 2);
    st_write_item items[2] = {{n1, TP_F32, 2, s1, w1}, {n2, TP_F32, 2, s2, w2}};
    tp_err err;
    snprintf(wpath, sizeof wpath, "%s/%s", dir, file);
    if (st_write(wpath, items, 2, &err) != TP_OK) {
        fprintf(stderr, "bench: %s\n", err.msg);
        exit(1);
    }
    free(w1);
    free(w2);
}

/* The sequence-parallel MLP of graphs/gen_examples.py at hidden size h. */
static void write_mlp(const char *dir, int64_t s, int64_t h, char *path)
{
    char json[2048];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"mlp\",\"world_size\":2,\"weights\":\"mlp.safetensors\","
             "\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\",\"shape\":[\"B\",%lld,%lld],\"placement\":\"shard(1)\"}],"
             "\"params\":[{\"name\":\"w1\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],\"placement\":\"shard(1)\"},"
             "{\"name\":\"w2\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],\"placement\":\"shard(0)\"}],"
             "\"nodes\":[{\"name\":\"xg\",\"op\":\"all_gather\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":1}},"
             "{\"name\":\"h\",\"op\":\"matmul\",\"inputs\":[\"xg\",\"w1\"]},{\"name\":\"a\",\"op\":\"gelu\",\"inputs\":[\"h\"]},"
             "{\"name\":\"o\",\"op\":\"matmul\",\"inputs\":[\"a\",\"w2\"]},"
             "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"o\"],\"attrs\":{\"dim\":1,\"op\":\"sum\"}}],"
             "\"outputs\":[{\"name\":\"y\",\"placement\":\"shard(1)\"}]}",
             (long long)s, (long long)h, (long long)h, (long long)(4 * h), (long long)(4 * h), (long long)h);
    snprintf(path, 256, "%s/mlp.json", dir);
    write_text(path, json);
    int64_t s1[2] = {h, 4 * h}, s2[2] = {4 * h, h};
    write_weights(dir, "mlp.safetensors", "w1", s1, "w2", s2);
}

/* The two slice/cat forms of the slice_cat example (graphs/gen_examples.py)
 * at world 2, seq m:
 * z [B, m, k] @ w_in [k, 2c] -> its 2 column chunks cat on the rows ->
 * reduce_scatter(avg) -> all_gather on the rows -> its 2 row chunks cat on
 * the last dim -> @ w_out [2c, c]. */
static void write_slice_cat(const char *dir, int64_t m, int64_t k, int64_t c, char *path)
{
    char json[4096];
    snprintf(json, sizeof json,
             "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"slice_cat\",\"world_size\":2,\"weights\":\"sc.safetensors\","
             "\"inputs\":[{\"name\":\"z\",\"datatype\":\"FP32\",\"shape\":[\"B\",%lld,%lld],\"placement\":\"shard(2)\"}],"
             "\"params\":[{\"name\":\"w_in\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],\"placement\":\"shard(0)\"},"
             "{\"name\":\"w_out\",\"datatype\":\"FP32\",\"shape\":[%lld,%lld],\"placement\":\"replicate\"}],"
             "\"nodes\":[{\"name\":\"p\",\"op\":\"matmul\",\"inputs\":[\"z\",\"w_in\"]},"
             "{\"name\":\"p0\",\"op\":\"slice\",\"inputs\":[\"p\"],\"attrs\":{\"dim\":2,\"start\":0,\"length\":%lld}},"
             "{\"name\":\"p1\",\"op\":\"slice\",\"inputs\":[\"p\"],\"attrs\":{\"dim\":2,\"start\":%lld,\"length\":%lld}},"
             "{\"name\":\"pc\",\"op\":\"cat\",\"inputs\":[\"p0\",\"p1\"],\"attrs\":{\"dim\":1}},"
             "{\"name\":\"y\",\"op\":\"reduce_scatter\",\"inputs\":[\"pc\"],\"attrs\":{\"dim\":1,\"op\":\"avg\"}},"
             "{\"name\":\"g\",\"op\":\"all_gather\",\"inputs\":[\"y\"],\"attrs\":{\"dim\":1}},"
             "{\"name\":\"g0\",\"op\":\"slice\",\"inputs\":[\"g\"],\"attrs\":{\"dim\":1,\"start\":0,\"length\":%lld}},"
             "{\"name\":\"g1\",\"op\":\"slice\",\"inputs\":[\"g\"],\"attrs\":{\"dim\":1,\"start\":%lld,\"length\":%lld}},"
             "{\"name\":\"gc\",\"op\":\"cat\",\"inputs\":[\"g0\",\"g1\"],\"attrs\":{\"dim\":2}},"
             "{\"name\":\"out\",\"op\":\"matmul\",\"inputs\":[\"gc\",\"w_out\"]}],"
             "\"outputs\":[{\"name\":\"out\",\"placement\":\"replicate\"}]}",
             (long long)m, (long long)k, (long long)k, (long long)(2 * c), (long long)(2 * c), (long long)c,
             (long long)c, (long long)c, (long long)c, (long long)m, (long long)m, (long long)m);
    snprintf(path, 256, "%s/slice_cat.json", dir);
    write_text(path, json);
    int64_t s1[2] = {k, 2 * c}, s2[2] = {2 * c, c};
    write_weights(dir, "sc.safetensors", "w_in", s1, "w_out", s2);
}

/* The replay/ranks benchmark graphs at batch 4: tiny-400 (pass 0) or the
 * MLP with seq 64, hidden 256 (pass 1), and an input for it (data malloc'd). */
static tp_host_tensor bench_graph(const char *dir, int pass, char *path, unsigned seed)
{
    int64_t batch = 4, s = 64, h = 256;
    if (pass == 0)
        write_tiny_graph(dir, 400, path);
    else
        write_mlp(dir, s, h, path);
    int64_t n_x = pass == 0 ? batch * 16 : batch * s * h;
    float *x = malloc(sizeof(float) * (size_t)n_x);
    fill(x, n_x, seed);
    tp_host_tensor in = {.name = "x", .dtype = TP_F32, .ndim = pass == 0 ? 2 : 3, .data = x,
                         .nbytes = sizeof(float) * (size_t)n_x};
    int64_t shape[3] = {batch, pass == 0 ? 16 : s, h};
    memcpy(in.shape, shape, sizeof shape);
    return in;
}

static void bench_replay(const char *dir)
{
    char path[256];
    printf("| graph | batch | nodes run | eager us/req | replay us/req | eager us/node | replay us/node | planned B | naive B |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    for (int pass = 0; pass < 2; pass++) {
        int64_t batch = 4;
        tp_host_tensor in = bench_graph(dir, pass, path, 3);
        tp_engine *eager = engine(path, 1, 1), *cap = engine(path, 1, 0);
        int reps = pass == 0 ? 200 : 50, nodes;
        double te = time_request(eager, &in, 1, reps), tr = time_request(cap, &in, 1, reps);
        int64_t planned, naive;
        plan_bytes(path, batch, 1, &planned, &naive, &nodes);
        printf("| %s | %lld | %d | %.1f | %.1f | %.3f | %.3f | %lld | %lld |\n", pass == 0 ? "tiny-400" : "mlp_sp h=256",
               (long long)batch, nodes, te, tr, te / nodes, tr / nodes, (long long)planned, (long long)naive);
        tp_engine_free(eager);
        tp_engine_free(cap);
        free(in.data);
    }
}

/* Median request times of the graph at path without and with passes, its
 * one input `name` [batch, d1, d2] of deterministic values. */
static void time_unfused_fused(const char *path, const char *name, int64_t batch, int64_t d1, int64_t d2, double *tu,
                               double *tf)
{
    int64_t n = batch * d1 * d2;
    float *x = malloc(sizeof(float) * (size_t)n);
    fill(x, n, 4);
    tp_host_tensor in = {.dtype = TP_F32, .ndim = 3, .shape = {batch, d1, d2}, .data = x,
                         .nbytes = sizeof(float) * (size_t)n};
    snprintf(in.name, sizeof in.name, "%s", name);
    tp_engine *off = engine(path, 0, 0), *on = engine(path, 1, 0);
    *tu = time_request(off, &in, 1, 20);
    *tf = time_request(on, &in, 1, 20);
    tp_engine_free(off);
    tp_engine_free(on);
    free(x);
}

/* The slice/cat forms: unfused they materialize the product, both cats
 * and the gather; fused, only the reduce_scatter's workspace. Bytes are
 * the plan's intermediates without reuse (per rank), unfused - fused. */
static void bench_passes_slice_cat(const char *dir)
{
    printf("\n| slice/cat forms (rs on columns, ag on K) | seq | batch | unfused us/req | fused us/req | speedup | "
           "intermediate bytes not materialized (per rank) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    int64_t cols[2] = {128, 256};
    for (int i = 0; i < 2; i++) {
        char path[256];
        int64_t m = 128, k = 512, c = cols[i], batch = 2, planned, naive_off, naive_on;
        int nodes;
        write_slice_cat(dir, m, k, c, path);
        plan_bytes(path, batch, 0, &planned, &naive_off, &nodes);
        plan_bytes(path, batch, 1, &planned, &naive_on, &nodes);
        double tu, tf;
        time_unfused_fused(path, "z", batch, m, k, &tu, &tf);
        printf("| k=%lld, 2 chunks of %lld cols | %lld | %lld | %.0f | %.0f | %.2fx | %lld (%lld -> %lld) |\n",
               (long long)k, (long long)c, (long long)m, (long long)batch, tu, tf, tu / tf,
               (long long)(naive_off - naive_on), (long long)naive_off, (long long)naive_on);
    }
}

static void bench_passes(const char *dir)
{
    printf("| hidden | seq | batch | unfused us/req | fused us/req | speedup | gathered bytes not materialized (per rank) |\n");
    printf("|---|---|---|---|---|---|---|\n");
    int64_t sizes[3] = {128, 256, 512};
    for (int k = 0; k < 3; k++) {
        char path[256];
        int64_t h = sizes[k], s = 128, batch = 2;
        write_mlp(dir, s, h, path);
        double tu, tf;
        time_unfused_fused(path, "x", batch, s, h, &tu, &tf);
        printf("| %lld | %lld | %lld | %.0f | %.0f | %.2fx | %lld |\n", (long long)h, (long long)s, (long long)batch, tu,
               tf, tu / tf, (long long)(batch * s * h * 4));
    }
    bench_passes_slice_cat(dir);
}

/* The same graph with ranks as threads and as processes (the leader posts
 * each step through the shared control block; workers are `tpserve
 * worker`, found through $TPSERVE). */
static tp_engine *engine_in_processes(const char *path)
{
    const char *exe = getenv("TPSERVE");
    char *argv[] = {(char *)(exe ? exe : "build/tpserve"), "worker", (char *)path, "--backend", "cpu", NULL};
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv};
    return engine_with(path, &(tp_engine_opts){.backend = "cpu", .group = &go});
}

static void bench_ranks(const char *dir)
{
    printf("| graph | batch | threads us/req | processes us/req | processes - threads |\n");
    printf("|---|---|---|---|---|\n");
    for (int pass = 0; pass < 2; pass++) {
        char path[256];
        int64_t batch = 4;
        tp_host_tensor in = bench_graph(dir, pass, path, 5);
        tp_engine *th = engine(path, 1, 0), *pr = engine_in_processes(path);
        int reps = pass == 0 ? 200 : 50;
        double tt = time_request(th, &in, 1, reps), tp = time_request(pr, &in, 1, reps);
        printf("| %s | %lld | %.1f | %.1f | %+.1f |\n", pass == 0 ? "tiny-400" : "mlp_sp h=256", (long long)batch, tt,
               tp, tp - tt);
        tp_engine_free(th);
        tp_engine_free(pr);
        free(in.data);
    }
}

/* The elementwise functions of tp_math.h as the cpu backend runs them
 * (cpu_op_run: the clone this CPU picks), ns per FP32 element over a
 * 64 Ki row of values in [-5, 5) (both sides of every piece of erf and
 * tanh), best of 20 rounds. */
static void bench_activations(void)
{
    enum { N = 1 << 16 };
    static const struct {
        const char *name;
        tp_op op;
        int gelu_tanh;
    } fns[] = {{"gelu (erf)", TP_OP_GELU, 0}, {"gelu (tanh)", TP_OP_GELU, 1}, {"silu", TP_OP_SILU, 0},
               {"exp", TP_OP_EXP, 0}, {"tanh", TP_OP_TANH, 0}};
    float *x = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * N);
    if (!x || !y) {
        fprintf(stderr, "bench: out of memory\n");
        exit(1);
    }
    for (int i = 0; i < N; i++)
        x[i] = (float)(i % 1000) / 100.0f - 5.0f;
    int64_t shape[1] = {N};
    tp_tensor in = tp_tensor_make(x, TP_F32, 1, shape), out = tp_tensor_make(y, TP_F32, 1, shape);
    printf("| activation | ns/element |\n|---|---|\n");
    for (size_t f = 0; f < sizeof fns / sizeof fns[0]; f++) {
        tp_attrs a = {0};
        a.gelu_tanh = fns[f].gelu_tanh;
        double best = 1e30;
        for (int r = 0; r < 20; r++) {
            tp_err err;
            double t0 = tp_now_us();
            if (cpu_op_run(fns[f].op, &a, &in, 1, &out, 0, 1, &err) != TP_OK) {
                fprintf(stderr, "bench: %s: %s\n", fns[f].name, err.msg);
                exit(1);
            }
            double t = (tp_now_us() - t0) * 1000.0 / N;
            best = t < best ? t : best;
        }
        printf("| %s | %.2f |\n", fns[f].name, best);
    }
    printf("\n");
    free(x);
    free(y);
}

int main(int argc, char **argv)
{
    /* The OpenBLAS kernels tpserve serve runs, which OpenBLAS reads as it
     * loads (kernels/cpu/blas_pick.h): without them, a CPU newer than
     * OpenBLAS's table gets its oldest kernels here (the mlp_sp h=256 row
     * took 8.3 ms a request on an Intel Xeon OpenBLAS took for a Prescott,
     * 2.0 ms with the kernels tpserve picks). */
    if (tp_engine_reexec_for_backends(argv) != 0)
        fprintf(stderr, "bench_engine: re-executing for the OpenBLAS kernels failed; OpenBLAS's own run\n");
    char dir[] = "/tmp/tp_bench_XXXXXX";
    if (argc != 2 || !mkdtemp(dir)) {
        fprintf(stderr, "usage: bench_engine replay|passes|ranks\n");
        return 2;
    }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    const char *core = getenv("OPENBLAS_CORETYPE");
    printf("cpu backend, 2 ranks, %ld cores, median of repeated requests; OpenBLAS kernels: %s\n\n", cores,
           core ? core : "OpenBLAS's own choice");
    if (strcmp(argv[1], "replay") == 0) {
        bench_activations();
        bench_replay(dir);
    }
    else if (strcmp(argv[1], "passes") == 0)
        bench_passes(dir);
    else if (strcmp(argv[1], "ranks") == 0)
        bench_ranks(dir);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    return system(cmd) == 0 ? 0 : 1;
}
