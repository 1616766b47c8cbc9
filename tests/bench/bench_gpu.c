/* bench_gpu — the cuda backend's performance questions, as tables (never
 * asserts: it measures, the tests check correctness).
 *
 *   1. fused vs unfused all_gather + matmul, next to the ideal
 *      max(comm alone, GEMM alone) and the share of communication hidden;
 *   2. one-shot (peer-reading kernel) vs NCCL all_reduce across sizes;
 *   3. replay of a captured graph vs eager launches of the same ops.
 *
 * One process per GPU, as the backend requires: the bench re-executes
 * itself as ranks 0..d-1 (d = the largest power of two <= min(GPUs, 8));
 * rank 0 prints. Times are wall-clock per iteration after a warm-up,
 * between two synchronizations of every rank. Without a device (or built
 * without TP_HAVE_CUDA) it prints one line and exits 0. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifdef TP_HAVE_CUDA
#include <spawn.h>

#include "clock.h"
#include "cuda/cuda_backend.h"

extern char **environ;

#define RANK_ENV "BENCH_GPU_RANK"

typedef struct {
    tp_backend *b;
    int rank, world;
    void *tiny;      /* for the rank barrier */
    tp_tensor tiny_t;
} bench;

static void die(bench *c, const char *what, const tp_err *err)
{
    fprintf(stderr, "bench-gpu rank %d: %s: %s\n", c->rank, what, err->msg);
    exit(2);
}

static void *alloc(bench *c, size_t bytes, int symmetric)
{
    void *p = NULL;
    tp_err err;
    tp_status st = symmetric ? c->b->iface->alloc_symmetric(c->b, c->rank, bytes, &p, &err)
                             : c->b->iface->alloc(c->b, c->rank, bytes, &p, &err);
    if (st != TP_OK)
        die(c, "alloc", &err);
    return p;
}

static void sync_rank(bench *c)
{
    tp_err err;
    if (c->b->iface->synchronize(c->b, c->rank, &err) != TP_OK)
        die(c, "synchronize", &err);
}

/* Every rank here, nothing queued. */
static void barrier(bench *c)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    a.algo = TP_ALGO_NCCL;
    tp_err err;
    if (c->b->iface->collective(c->b, c->rank, TP_OP_ALL_REDUCE, &a, &c->tiny_t, 1, &c->tiny_t, &err) != TP_OK)
        die(c, "barrier", &err);
    sync_rank(c);
}

typedef void (*step_fn)(bench *c, void *arg);

/* Microseconds per call of fn, after `warm` calls. */
static double time_it(bench *c, step_fn fn, void *arg, int warm, int iters)
{
    for (int i = 0; i < warm; i++)
        fn(c, arg);
    barrier(c);
    double t0 = tp_now_us();
    for (int i = 0; i < iters; i++)
        fn(c, arg);
    sync_rank(c);
    return (tp_now_us() - t0) / iters;
}

static void op(bench *c, tp_op o, const tp_attrs *a, tp_tensor *ins, int n, tp_tensor *out)
{
    tp_err err;
    tp_status st = tp_op_kind_of(o) == TP_KIND_COLLECTIVE || tp_op_kind_of(o) == TP_KIND_FUSED
                       ? c->b->iface->collective(c->b, c->rank, o, a, ins, n, out, &err)
                       : c->b->iface->run_op(c->b, c->rank, o, a, ins, n, out, &err);
    if (st != TP_OK)
        die(c, tp_op_name(o), &err);
}

/* ------------------------------------------------ 1. fused all_gather+mm */

typedef struct {
    tp_tensor x, w, gathered, out;
    tp_attrs ag, mm, fused;
} agmm;

static void run_ag(bench *c, void *p) { agmm *s = p; op(c, TP_OP_ALL_GATHER, &s->ag, &s->x, 1, &s->gathered); }
static void run_mm(bench *c, void *p)
{
    agmm *s = p;
    tp_tensor ins[2] = {s->gathered, s->w};
    op(c, TP_OP_MATMUL, &s->mm, ins, 2, &s->out);
}
static void run_unfused(bench *c, void *p)
{
    run_ag(c, p);
    run_mm(c, p);
}
static void run_fused(bench *c, void *p)
{
    agmm *s = p;
    tp_tensor ins[2] = {s->x, s->w};
    op(c, TP_OP_FUSED_AG_MM, &s->fused, ins, 2, &s->out);
}

static void bench_agmm(bench *c)
{
    const int64_t rows[] = {256, 1024, 4096}, K = 4096, N = 4096;
    if (c->rank == 0)
        printf("\nfused all_gather+matmul, BF16, world %d, K=%lld N=%lld (us per call)\n"
               "%8s %10s %10s %10s %10s %10s %10s %8s\n",
               c->world, (long long)K, (long long)N, "rows/rk", "gather", "gemm", "ideal", "unfused", "fused",
               "speedup", "hidden");
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        int64_t m = rows[i], xs[2] = {m, K}, gs[2] = {m * c->world, K}, ws[2] = {K, N}, os[2] = {m * c->world, N};
        agmm s;
        memset(&s, 0, sizeof s);
        s.x = tp_tensor_make(alloc(c, (size_t)(m * K) * 2, 1), TP_BF16, 2, xs);
        s.gathered = tp_tensor_make(alloc(c, (size_t)(m * c->world * K) * 2, 0), TP_BF16, 2, gs);
        s.w = tp_tensor_make(alloc(c, (size_t)(K * N) * 2, 0), TP_BF16, 2, ws);
        s.out = tp_tensor_make(alloc(c, (size_t)(m * c->world * N) * 2, 0), TP_BF16, 2, os);
        s.ag.algo = TP_ALGO_NCCL;
        s.fused.n_fused = 1;
        s.fused.algo = TP_ALGO_FUSED;
        double tg = time_it(c, run_ag, &s, 3, 20), tm = time_it(c, run_mm, &s, 3, 20);
        double tu = time_it(c, run_unfused, &s, 3, 20), tf = time_it(c, run_fused, &s, 3, 20);
        double ideal = tg > tm ? tg : tm, hidden = tu > ideal ? 100.0 * (tu - tf) / (tu - ideal) : 0.0;
        if (c->rank == 0)
            printf("%8lld %10.1f %10.1f %10.1f %10.1f %10.1f %9.2fx %7.0f%%\n", (long long)m, tg, tm, ideal, tu, tf,
                   tu / tf, hidden);
        void *ps[4] = {s.x.data, s.gathered.data, s.w.data, s.out.data};
        for (int k = 0; k < 4; k++)
            c->b->iface->free(c->b, c->rank, ps[k]);
    }
}

/* ---------------------------------------------------- 2. all_reduce */

typedef struct {
    tp_tensor in, out;
    tp_attrs a;
} ar;

static void run_ar(bench *c, void *p)
{
    ar *s = p;
    op(c, TP_OP_ALL_REDUCE, &s->a, &s->in, 1, &s->out);
}

static void bench_allreduce(bench *c)
{
    if (c->rank == 0)
        printf("\nall_reduce sum, BF16, world %d (us per call; bus GB/s = 2(d-1)/d * bytes / time)\n"
               "%10s %10s %10s %10s %10s\n",
               c->world, "bytes", "one_shot", "nccl", "GB/s 1s", "GB/s nccl");
    for (int64_t bytes = 4096; bytes <= (64 << 20); bytes *= 4) {
        int64_t n = bytes / 2;
        ar s;
        memset(&s, 0, sizeof s);
        s.in = tp_tensor_make(alloc(c, (size_t)bytes, 1), TP_BF16, 1, &n);
        s.out = tp_tensor_make(alloc(c, (size_t)bytes, 0), TP_BF16, 1, &n);
        s.a.algo = TP_ALGO_ONE_SHOT;
        double t1 = time_it(c, run_ar, &s, 5, 50);
        s.a.algo = TP_ALGO_NCCL;
        double tn = time_it(c, run_ar, &s, 5, 50);
        double f = c->world > 1 ? 2.0 * (c->world - 1) / c->world * (double)bytes / 1e3 : 0;
        if (c->rank == 0)
            printf("%10lld %10.1f %10.1f %10.1f %10.1f\n", (long long)bytes, t1, tn, f / t1, f / tn);
        c->b->iface->free(c->b, c->rank, s.in.data);
        c->b->iface->free(c->b, c->rank, s.out.data);
    }
}

/* ------------------------------------------------ 3. replay vs eager */

#define CHAIN 200

typedef struct {
    tp_tensor a, b;
    tp_capture *cap;
} chain;

static void run_chain(bench *c, void *p)
{
    chain *s = p;
    tp_attrs at;
    memset(&at, 0, sizeof at);
    for (int i = 0; i < CHAIN; i++) { /* ping-pong: b = gelu(a), a = a + b */
        tp_tensor ab[2] = {s->a, s->b};
        if (i % 2)
            op(c, TP_OP_ADD, &at, ab, 2, &s->a);
        else
            op(c, TP_OP_GELU, &at, &s->a, 1, &s->b);
    }
}

static void run_replay(bench *c, void *p)
{
    chain *s = p;
    tp_err err;
    if (c->b->iface->replay(c->b, c->rank, s->cap, &err) != TP_OK)
        die(c, "replay", &err);
}

static void bench_replay(bench *c)
{
    int64_t shape[2] = {64, 1024};
    chain s;
    memset(&s, 0, sizeof s);
    s.a = tp_tensor_make(alloc(c, 64 * 1024 * 4, 0), TP_F32, 2, shape);
    s.b = tp_tensor_make(alloc(c, 64 * 1024 * 4, 0), TP_F32, 2, shape);
    tp_err err;
    double te = time_it(c, run_chain, &s, 2, 20);
    if (c->b->iface->begin_capture(c->b, c->rank, &err) != TP_OK)
        die(c, "begin_capture", &err);
    run_chain(c, &s);
    if (c->b->iface->end_capture(c->b, c->rank, &s.cap, &err) != TP_OK)
        die(c, "end_capture", &err);
    double tr = time_it(c, run_replay, &s, 2, 20);
    if (c->rank == 0)
        printf("\nreplay vs eager, %d elementwise ops on [64, 1024] FP32 (us per chain)\n"
               "%10s %10s %10s %12s\n%10.1f %10.1f %9.2fx %12.2f\n",
               CHAIN, "eager", "replay", "speedup", "us/op replay", te, tr, te / tr, tr / CHAIN);
    c->b->iface->capture_free(c->b, s.cap);
    c->b->iface->free(c->b, c->rank, s.a.data);
    c->b->iface->free(c->b, c->rank, s.b.data);
}

static int rank_main(void)
{
    bench c;
    memset(&c, 0, sizeof c);
    c.rank = atoi(getenv(RANK_ENV));
    c.world = atoi(getenv("BENCH_GPU_WORLD"));
    tp_err err;
    if (tp_cuda_backend_create(c.world, c.rank, getenv("BENCH_GPU_ID"), &c.b, &err) != TP_OK)
        die(&c, "create", &err);
    int64_t one = 1;
    c.tiny = alloc(&c, 64, 0);
    c.tiny_t = tp_tensor_make(c.tiny, TP_F32, 1, &one);
    bench_agmm(&c);
    bench_allreduce(&c);
    bench_replay(&c);
    fflush(stdout);
    tp_backend_destroy(c.b);
    return 0;
}

/* The device count, probed in a child so this process never initialises
 * CUDA (it spawns the ranks). */
static int probe_devices(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(tp_cuda_device_count() > 100 ? 100 : tp_cuda_device_count());
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 0;
    return WEXITSTATUS(status);
}

static int spawn_ranks(int world)
{
    char id[TP_CUDA_NCCL_ID_HEX + 1], env[4][300];
    tp_err err;
    if (tp_cuda_nccl_id_new(id, &err) != TP_OK) {
        fprintf(stderr, "bench-gpu: %s\n", err.msg);
        return 1;
    }
    int n = 0, failed = 0;
    while (environ[n])
        n++;
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        snprintf(env[0], sizeof env[0], RANK_ENV "=%d", r);
        snprintf(env[1], sizeof env[1], "BENCH_GPU_WORLD=%d", world);
        snprintf(env[2], sizeof env[2], "BENCH_GPU_ID=%s", id);
        snprintf(env[3], sizeof env[3], "LOCAL_RANK=%d", r);
        char **envp = calloc((size_t)n + 5, sizeof *envp);
        for (int k = 0; k < 4; k++)
            envp[k] = env[k];
        memcpy(envp + 4, environ, (size_t)n * sizeof *envp);
        char *argv[] = {"bench_gpu", NULL};
        if (posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, envp) != 0)
            pids[r] = 0, failed = 1;
        free(envp);
    }
    for (int r = 0; r < world; r++) {
        int status;
        if (pids[r] > 0 && (waitpid(pids[r], &status, 0) != pids[r] || !WIFEXITED(status) || WEXITSTATUS(status)))
            failed = 1;
    }
    return failed;
}
#endif /* TP_HAVE_CUDA */

int main(void)
{
#ifdef TP_HAVE_CUDA
    if (getenv(RANK_ENV))
        return rank_main();
    int n = probe_devices();
    if (n > 0) {
        int world = 1;
        while (world * 2 <= n && world * 2 <= 8)
            world *= 2;
        printf("bench-gpu: %d device(s), %d rank(s), one process per GPU\n", n, world);
        fflush(stdout);
        return spawn_ranks(world) ? 1 : 0;
    }
#endif
    printf("bench-gpu: no CUDA device, nothing measured\n");
    return 0;
}
