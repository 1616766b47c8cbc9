/* test_cuda_device.c — the cuda backend on a real GPU.
 *
 * Without TP_HAVE_CUDA, or when no device is usable, the suite is one test
 * that prints exactly "skipped: no CUDA device" and passes (CI has no GPU).
 *
 * With devices (none of this has run yet; it is the test the first GPU
 * machine runs, in the spirit of ggml's test-backend-ops):
 *  - ops_match_cpu: every compute/copy op, strided and broadcast inputs,
 *    FP32 and half types, on a one-rank cuda backend vs the cpu kernels;
 *  - capture_replays_new_inputs: a captured graph replays on fresh inputs;
 *  - bad_embedding_id_fails_cleanly: a device-side error comes back as a
 *    message at synchronize and leaves the backend usable;
 *  - collectives_across_processes: 2..4 processes (one per GPU, re-executing
 *    this binary as ranks) run every collective, the one-shot all_reduce and
 *    both fused ops against host-computed references;
 *  - examples_through_engine: every example graph through tp_engine with
 *    backend "cuda" vs its reference outputs, one process per GPU
 *    (ranks=processes, workers are $TPSERVE) for every world that fits.
 *
 * Built twice: against CUDA (test_cuda_device, above) and, with
 * TP_CUDA_DOUBLE, against the CUDA/NCCL/cuBLASLt test double of
 * tests/cuda_double (test_cuda_device_dbl, `make cuda-double`, part of
 * `make test`), so a device test that cannot pass on a GPU fails there
 * first. Every test and every example graph runs against the double; the
 * double records kernels without running them, so what only a GPU can
 * judge is skipped by name, with a "GPU-only:" line on stdout: kernel
 * results (the cpu backend and test_cuda_plan check the math) and a
 * kernel's own id checks. What the double moves for real is compared:
 * copies, NCCL all_reduce and broadcast, and every status and message.
 *
 * CUDA must not be initialised in a process that later forks (Check forks
 * per test): the device count is probed once, in a throwaway child, before
 * this process makes any CUDA call, and reused by every test (a child
 * forked after the first engine initialised CUDA would count 0 devices and
 * every later example would pass as "skipped"); ranks are spawned with
 * exec, never forked. An example that needs more GPUs than there are says
 * so on stdout. The probe logic itself is tested on every machine. */
#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_main.h"
#include "testutil.h"

#ifdef TP_CUDA_DOUBLE
#include <sys/stat.h>

#include "cuda_double.h"
#include "worker.h"
/* Kernels are recorded, not run: their results are the GPU's to judge. */
enum { KERNELS_RUN = 0 };
#else
enum { KERNELS_RUN = 1 };
#endif


#ifdef TP_HAVE_CUDA
#include <math.h>
#include <signal.h>
#include <spawn.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "cuda/cuda_backend.h"

extern char **environ;
#endif

/* What fn returns in a fresh child process, clamped to [0, 100]; 0 when
 * the child cannot run or dies. */
static int count_in_child(int (*fn)(void))
{
    pid_t pid = fork();
    if (pid == 0) {
        int n = fn();
        _exit(n < 0 ? 0 : n > 100 ? 100 : n);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status))
        return 0;
    return WEXITSTATUS(status);
}

/* fn's count, asked once (*cache < 0 until then). */
static int count_once(int (*fn)(void), int *cache)
{
    if (*cache < 0)
        *cache = count_in_child(fn);
    return *cache;
}

static int no_devices(void) { return 0; }

/* Devices usable by this machine, probed before the first CUDA call of
 * this process (cuda_device_suite asks first). */
static int probe_devices(void)
{
    static int devices = -1;
#ifdef TP_HAVE_CUDA
    return count_once(tp_cuda_device_count, &devices);
#else
    return count_once(no_devices, &devices);
#endif
}

#ifdef TP_HAVE_CUDA
/* Where device nodes are looked for: TP_TEST_DEV_DIR lets the wiring be
 * tried on a machine without a GPU (a directory holding a file nvidia0). */
static const char *dev_dir(void) { return getenv("TP_TEST_DEV_DIR") ? getenv("TP_TEST_DEV_DIR") : "/dev"; }
static int gpu_unusable_now(void) { return tp_cuda_probe_machine(dev_dir(), NULL, 0) < 0; }

/* Issue 49 (8): no usable device, but a GPU device node (/dev/nvidia0...):
 * a driver CUDA cannot use. The suite then fails instead of skipping.
 * (Without TP_HAVE_CUDA there is no cuda backend to have failed.) */
static int gpu_unusable(void)
{
    static int unusable = -1;
    return count_once(gpu_unusable_now, &unusable);
}
#endif

/* ---------------------------------------------------- the probe logic */

static int fake_calls;
static int fake_three(void)
{
    fake_calls++; /* in the child: this process's count stays 0 */
    return 3;
}
static int fake_many(void) { return 1000; }
static int fake_crash(void)
{
    raise(SIGKILL);
    return 1;
}

START_TEST(probe_asks_once_in_a_child)
{
    int cache = -1;
    ck_assert_int_eq(count_once(fake_three, &cache), 3);
    ck_assert_int_eq(count_once(fake_three, &cache), 3);
    ck_assert_int_eq(count_once(fake_many, &cache), 3); /* cached: never asked again */
    ck_assert_int_eq(fake_calls, 0);                    /* asked in a child, not here */
    cache = -1;
    ck_assert_int_eq(count_once(fake_many, &cache), 100);
    cache = -1;
    ck_assert_int_eq(count_once(fake_crash, &cache), 0);
    cache = -1;
    ck_assert_int_eq(count_once(no_devices, &cache), 0);
}
END_TEST

START_TEST(no_device_skips)
{
    printf("skipped: no CUDA device\n");
    fflush(stdout);
}
END_TEST

#ifdef TP_HAVE_CUDA
START_TEST(unusable_gpu_fails)
{
    char why[512] = "";
    tp_cuda_probe_machine(dev_dir(), why, sizeof why);
    ck_abort_msg("a GPU is here but CUDA cannot use it: %s", why);
}
END_TEST
#endif

#ifdef TP_HAVE_CUDA

/* What this build cannot judge, said once per test by name. */
static void gpu_only(const char *what)
{
    printf("GPU-only: %s (not judged by the double: kernels are recorded, not run)\n", what);
    fflush(stdout);
}

/* ------------------------------------------------------------ operands */

typedef struct {
    void *host_base, *dev_base;
    size_t bytes;
    tp_tensor host, dev; /* the same view over each base */
} operand;

static uint32_t seed = 7;
static float rnd_f(void)
{
    seed = seed * 1664525u + 1013904223u;
    return (float)((seed >> 9) % 2001) / 1000.0f - 1.0f;
}

static void *dev_alloc(tp_backend *b, size_t bytes)
{
    void *p = NULL;
    tp_err err;
    ck_assert_msg(b->iface->alloc(b, 0, bytes, &p, &err) == TP_OK, "%s", err.msg);
    return p;
}

/* A view of base shape `shape` (optionally transposed in its last two
 * dims, or sliced to [start, start+len) of `dim`), random data, uploaded. */
static operand make_operand(tp_backend *b, tp_dtype dt, int nd, const int64_t *shape, int transpose, int dim,
                            int64_t start, int64_t len)
{
    operand o;
    memset(&o, 0, sizeof o);
    tp_tensor base = tp_tensor_make(NULL, dt, nd, shape);
    int64_t n = tp_tensor_numel(&base);
    o.bytes = (size_t)n * tp_dtype_size(dt);
    o.host_base = malloc(o.bytes + 8);
    for (int64_t i = 0; i < n; i++)
        tp_store_f32(o.host_base, dt, i, rnd_f());
    base.data = o.host_base;
    o.host = base;
    if (transpose) {
        int64_t t = o.host.shape[nd - 1];
        o.host.shape[nd - 1] = o.host.shape[nd - 2];
        o.host.shape[nd - 2] = t;
        t = o.host.stride[nd - 1];
        o.host.stride[nd - 1] = o.host.stride[nd - 2];
        o.host.stride[nd - 2] = t;
    }
    if (dim >= 0) {
        o.host.data = (char *)o.host.data + start * o.host.stride[dim] * (int64_t)tp_dtype_size(dt);
        o.host.shape[dim] = len;
    }
    o.dev_base = dev_alloc(b, o.bytes);
    tp_tensor hflat = tp_tensor_make(o.host_base, dt, 1, &n), dflat = tp_tensor_make(o.dev_base, dt, 1, &n);
    tp_err err;
    ck_assert_msg(b->iface->copy_in(b, 0, &dflat, &hflat, &err) == TP_OK, "%s", err.msg);
    o.dev = o.host;
    o.dev.data = (char *)o.dev_base + ((char *)o.host.data - (char *)o.host_base);
    return o;
}

/* attention's key-padding mask [B, T], INT64: row r has its first len[r]
 * keys (the rest padding), uploaded. */
static operand mask_operand(tp_backend *b, int64_t B, int64_t T, const int64_t *len)
{
    int64_t shape[2] = {B, T}, n = B * T;
    operand o = make_operand(b, TP_I64, 2, shape, 0, -1, 0, 0);
    for (int64_t i = 0; i < n; i++)
        ((int64_t *)o.host_base)[i] = i % T < len[i / T];
    tp_tensor hflat = tp_tensor_make(o.host_base, TP_I64, 1, &n), dflat = tp_tensor_make(o.dev_base, TP_I64, 1, &n);
    tp_err err;
    ck_assert_msg(b->iface->copy_in(b, 0, &dflat, &hflat, &err) == TP_OK, "%s", err.msg);
    return o;
}

static void free_operand(tp_backend *b, operand *o)
{
    b->iface->free(b, 0, o->dev_base);
    free(o->host_base);
}

static tp_backend *one_rank(void)
{
    tp_backend *b = NULL;
    tp_err err;
    ck_assert_msg(tp_cuda_backend_create(1, 0, NULL, &b, &err) == TP_OK, "%s", err.msg);
    return b;
}

/* Device output of op vs cpu_op_run on the host views; the op run
 * eagerly, or captured and replayed (captured: 1). */
static void compare_op_run(tp_backend *b, tp_op op, const tp_attrs *a, operand *ins, int n, tp_dtype dt, int nd,
                           const int64_t *oshape, double tol, int captured)
{
    tp_tensor hin[8], din[8];
    for (int i = 0; i < n; i++) {
        hin[i] = ins[i].host;
        din[i] = ins[i].dev;
    }
    tp_tensor want = tp_tensor_make(NULL, dt, nd, oshape), got = want, dout = want;
    size_t bytes = (size_t)tp_tensor_numel(&want) * tp_dtype_size(dt);
    want.data = malloc(bytes + 8);
    got.data = malloc(bytes + 8);
    dout.data = dev_alloc(b, bytes + 8);
    tp_err err;
    ck_assert_msg(cpu_op_run(op, a, hin, n, &want, 0, 1, &err) == TP_OK, "cpu %s: %s", tp_op_name(op), err.msg);
    tp_capture *c = NULL;
    if (captured)
        ck_assert_msg(b->iface->begin_capture(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->run_op(b, 0, op, a, din, n, &dout, &err) == TP_OK, "cuda %s: %s", tp_op_name(op), err.msg);
    if (captured) {
        ck_assert_msg(b->iface->end_capture(b, 0, &c, &err) == TP_OK, "%s", err.msg);
        ck_assert_msg(b->iface->replay(b, 0, c, &err) == TP_OK, "%s", err.msg);
    }
    ck_assert_msg(b->iface->copy_out(b, 0, &got, &dout, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "%s", err.msg);
    if (c)
        b->iface->capture_free(b, c);
    if (!KERNELS_RUN) {
        b->iface->free(b, 0, dout.data);
        free(want.data);
        free(got.data);
        return;
    }
    double scale = 1e-6, diff = 0;
    for (int64_t i = 0; i < tp_tensor_numel(&want); i++) {
        double w = tp_load_f32(want.data, dt, i), g = tp_load_f32(got.data, dt, i);
        scale = fmax(scale, fabs(w));
        diff = fmax(diff, fabs(w - g));
    }
    ck_assert_msg(diff / scale <= tol, "%s (%s): relative error %.3g > %.3g", tp_op_name(op), tp_dtype_name(dt),
                  diff / scale, tol);
    b->iface->free(b, 0, dout.data);
    free(want.data);
    free(got.data);
}

static void compare_op(tp_backend *b, tp_op op, const tp_attrs *a, operand *ins, int n, tp_dtype dt, int nd,
                       const int64_t *oshape, double tol)
{
    compare_op_run(b, op, a, ins, n, dt, nd, oshape, tol, 0);
}

static double tol_of(tp_dtype dt) { return dt == TP_F32 ? 1e-4 : 2e-2; }

static void elementwise_cases(tp_backend *b, tp_dtype dt)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t s3[3] = {2, 3, 4}, s1[1] = {4}, s2[2] = {3, 5}, s28[2] = {4, 8};
    operand add[2] = {make_operand(b, dt, 3, s3, 0, -1, 0, 0), make_operand(b, dt, 1, s1, 0, -1, 0, 0)};
    compare_op(b, TP_OP_ADD, &a, add, 2, dt, 3, s3, tol_of(dt));
    int64_t t2[2] = {5, 3};
    operand mul[2] = {make_operand(b, dt, 2, s2, 1, -1, 0, 0), make_operand(b, dt, 2, t2, 0, -1, 0, 0)};
    compare_op(b, TP_OP_MUL, &a, mul, 2, dt, 2, t2, tol_of(dt));
    operand g = make_operand(b, dt, 2, s28, 0, 1, 2, 5); /* strided slice */
    int64_t gs[2] = {4, 5};
    a.gelu_tanh = 1;
    compare_op(b, TP_OP_GELU, &a, &g, 1, dt, 2, gs, tol_of(dt));
    a.gelu_tanh = 0;
    compare_op(b, TP_OP_SILU, &a, &g, 1, dt, 2, gs, tol_of(dt));
    for (int i = 0; i < 2; i++) {
        free_operand(b, &add[i]);
        free_operand(b, &mul[i]);
    }
    free_operand(b, &g);
}

static void row_cases(tp_backend *b, tp_dtype dt)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t s3[3] = {2, 5, 3}, x[2] = {3, 16}, w[1] = {16};
    operand sm = make_operand(b, dt, 3, s3, 0, -1, 0, 0);
    a.dim = 1;
    compare_op(b, TP_OP_SOFTMAX, &a, &sm, 1, dt, 3, s3, tol_of(dt));
    operand ln[3] = {make_operand(b, dt, 2, x, 0, -1, 0, 0), make_operand(b, dt, 1, w, 0, -1, 0, 0),
                     make_operand(b, dt, 1, w, 0, -1, 0, 0)};
    a.eps = 1e-5f;
    compare_op(b, TP_OP_LAYER_NORM, &a, ln, 3, dt, 2, x, tol_of(dt));
    a.eps = 1e-6f;
    compare_op(b, TP_OP_RMS_NORM, &a, ln, 2, dt, 2, x, tol_of(dt));
    free_operand(b, &sm);
    for (int i = 0; i < 3; i++)
        free_operand(b, &ln[i]);
}

static void matmul_cases(tp_backend *b, tp_dtype dt)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t as[3] = {2, 3, 8}, bs[2] = {8, 5}, os[3] = {2, 3, 5};
    operand mm[2] = {make_operand(b, dt, 3, as, 0, -1, 0, 0), make_operand(b, dt, 2, bs, 0, -1, 0, 0)};
    compare_op(b, TP_OP_MATMUL, &a, mm, 2, dt, 3, os, tol_of(dt));
    int64_t xs[2] = {4, 8}, ws[2] = {6, 8}, o2[2] = {4, 6};
    operand tb[2] = {make_operand(b, dt, 2, xs, 0, -1, 0, 0), make_operand(b, dt, 2, ws, 0, -1, 0, 0)};
    a.transpose_b = 1;
    compare_op(b, TP_OP_MATMUL, &a, tb, 2, dt, 2, o2, tol_of(dt));
    int64_t q[4] = {1, 2, 4, 8}, o4[4] = {1, 2, 4, 8};
    operand at[3] = {make_operand(b, dt, 4, q, 0, -1, 0, 0), make_operand(b, dt, 4, q, 0, -1, 0, 0),
                     make_operand(b, dt, 4, q, 0, -1, 0, 0)};
    memset(&a, 0, sizeof a);
    a.causal = 1;
    compare_op(b, TP_OP_ATTENTION, &a, at, 3, dt, 4, o4, tol_of(dt));
    /* with a key-padding mask, with and without causal: a full row, one
     * whose queries see key 0 only, one all padding (zeros) */
    int64_t qm[4] = {3, 2, 4, 8}, len[3] = {4, 1, 0};
    operand atm[4] = {make_operand(b, dt, 4, qm, 0, -1, 0, 0), make_operand(b, dt, 4, qm, 0, -1, 0, 0),
                      make_operand(b, dt, 4, qm, 0, -1, 0, 0), mask_operand(b, 3, 4, len)};
    for (a.causal = 0; a.causal < 2; a.causal++)
        compare_op(b, TP_OP_ATTENTION, &a, atm, 4, dt, 4, qm, tol_of(dt));
    for (int i = 0; i < 4; i++)
        free_operand(b, &atm[i]);
    /* GQA: 4 query heads over 2 kv heads (tp_attn_kv_head), causal */
    int64_t qg[4] = {2, 4, 4, 8}, kg[4] = {2, 2, 4, 8};
    operand gqa[3] = {make_operand(b, dt, 4, qg, 0, -1, 0, 0), make_operand(b, dt, 4, kg, 0, -1, 0, 0),
                      make_operand(b, dt, 4, kg, 0, -1, 0, 0)};
    a.causal = 1;
    compare_op(b, TP_OP_ATTENTION, &a, gqa, 3, dt, 4, qg, tol_of(dt));
    for (int i = 0; i < 3; i++)
        free_operand(b, &gqa[i]);
    /* rope: x [2, 3, 4, 8] (its last two dims transposed: strided rows), a [4, 8] cos and sin table */
    int64_t rx[4] = {2, 3, 8, 4}, rt[2] = {4, 8}, ro[4] = {2, 3, 4, 8};
    operand rp[3] = {make_operand(b, dt, 4, rx, 1, -1, 0, 0), make_operand(b, dt, 2, rt, 0, -1, 0, 0),
                     make_operand(b, dt, 2, rt, 0, -1, 0, 0)};
    compare_op(b, TP_OP_ROPE, NULL, rp, 3, dt, 4, ro, tol_of(dt));
    for (int i = 0; i < 3; i++)
        free_operand(b, &rp[i]);
    /* matmul_rows, a strided x, rows 0 and 3 unwanted: eagerly one GEMM
     * per wanted run (rows 1-2, row 4), captured one over every row */
    int64_t xt[2] = {8, 5}, hw[2] = {8, 6}, rows = 5, ho[2] = {5, 6};
    const int64_t wanted[5] = {0, 1, 1, 0, 1};
    operand mr[3] = {make_operand(b, dt, 2, xt, 1, -1, 0, 0), make_operand(b, dt, 2, hw, 0, -1, 0, 0),
                     mask_operand(b, 5, 1, wanted)}; /* [5, 1], read as [5] */
    mr[2].host = tp_tensor_make(mr[2].host_base, TP_I64, 1, &rows);
    mr[2].dev = tp_tensor_make(mr[2].dev_base, TP_I64, 1, &rows);
    memset(&a, 0, sizeof a);
    for (int captured = 0; captured < 2; captured++)
        compare_op_run(b, TP_OP_MATMUL_ROWS, &a, mr, 3, dt, 2, ho, tol_of(dt), captured);
    for (int i = 0; i < 3; i++)
        free_operand(b, &mr[i]);
    for (int i = 0; i < 2; i++) {
        free_operand(b, &mm[i]);
        free_operand(b, &tb[i]);
    }
    for (int i = 0; i < 3; i++)
        free_operand(b, &at[i]);
}

static void copy_cases(tp_backend *b, tp_dtype dt)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t s1[2] = {2, 3}, s2[2] = {2, 2}, o[2] = {2, 5}, p[2] = {3, 4}, pt[2] = {4, 3};
    operand c[2] = {make_operand(b, dt, 2, s1, 0, -1, 0, 0), make_operand(b, dt, 2, s2, 0, -1, 0, 0)};
    a.dim = 1;
    compare_op(b, TP_OP_CAT, &a, c, 2, dt, 2, o, 0);
    operand t = make_operand(b, dt, 2, p, 1, -1, 0, 0);
    compare_op(b, TP_OP_CONTIGUOUS, &a, &t, 1, dt, 2, pt, 0);
    /* embedding: INT32 ids into a [10, 4] table */
    int64_t ids_shape[2] = {2, 3}, table[2] = {10, 4}, eo[3] = {2, 3, 4};
    operand emb[2] = {make_operand(b, TP_I32, 2, ids_shape, 0, -1, 0, 0), make_operand(b, dt, 2, table, 0, -1, 0, 0)};
    int32_t ids[6] = {0, 9, 3, 3, 7, 1};
    memcpy(emb[0].host_base, ids, sizeof ids);
    int64_t n = 6;
    tp_tensor h = tp_tensor_make(ids, TP_I32, 1, &n), d = tp_tensor_make(emb[0].dev_base, TP_I32, 1, &n);
    tp_err err;
    ck_assert_msg(b->iface->copy_in(b, 0, &d, &h, &err) == TP_OK, "%s", err.msg);
    compare_op(b, TP_OP_EMBEDDING, &a, emb, 2, dt, 3, eo, 0);
    for (int i = 0; i < 2; i++) {
        free_operand(b, &c[i]);
        free_operand(b, &emb[i]);
    }
    free_operand(b, &t);
}

/* Overwrites an integer operand's first n elements (host and device). */
static void set_ints(tp_backend *b, operand *o, const void *vals, int64_t n)
{
    memcpy(o->host_base, vals, (size_t)n * tp_dtype_size(o->host.dtype));
    tp_tensor h = tp_tensor_make(o->host_base, o->host.dtype, 1, &n), d = tp_tensor_make(o->dev_base, o->host.dtype, 1, &n);
    tp_err err;
    ck_assert_msg(b->iface->copy_in(b, 0, &d, &h, &err) == TP_OK, "%s", err.msg);
}

/* The ops of ONNX exports (tests/unit/test_cpu_onnx_ops.c has their
 * values): the same shared math on both backends. */
static void onnx_op_cases(tp_backend *b, tp_dtype dt)
{
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t s3[3] = {2, 3, 4}, s1[1] = {4}, s28[2] = {4, 8}, gs[2] = {4, 5};
    operand dv[2] = {make_operand(b, dt, 3, s3, 0, -1, 0, 0), make_operand(b, dt, 1, s1, 0, -1, 0, 0)};
    compare_op(b, TP_OP_DIV, &a, dv, 2, dt, 3, s3, tol_of(dt));
    operand u = make_operand(b, dt, 2, s28, 0, 1, 2, 5); /* strided slice */
    const tp_op unary[] = {TP_OP_EXP, TP_OP_NEG, TP_OP_TANH, TP_OP_ERF, TP_OP_SIGMOID, TP_OP_POW};
    a.exponent = 3.0f;
    for (size_t i = 0; i < sizeof unary / sizeof unary[0]; i++)
        compare_op(b, unary[i], &a, &u, 1, dt, 2, gs, tol_of(dt));
    operand e = make_operand(b, dt, 2, s28, 0, -1, 0, 0);
    compare_op(b, TP_OP_EXP, &a, &e, 1, dt, 2, s28, tol_of(dt));
    tp_tensor pos = e.dev; /* exp > 0: a domain for sqrt, rsqrt, pow 1.5 */
    operand ep = e;
    ep.dev = tp_tensor_make(dev_alloc(b, e.bytes), dt, 2, s28);
    ep.host = tp_tensor_make(malloc(e.bytes), dt, 2, s28);
    tp_err err;
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_EXP, &a, &pos, 1, &ep.dev, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->copy_out(b, 0, &ep.host, &ep.dev, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "%s", err.msg);
    compare_op(b, TP_OP_SQRT, &a, &ep, 1, dt, 2, s28, tol_of(dt));
    compare_op(b, TP_OP_RSQRT, &a, &ep, 1, dt, 2, s28, tol_of(dt));
    a.exponent = 1.5f;
    compare_op(b, TP_OP_POW, &a, &ep, 1, dt, 2, s28, tol_of(dt));
    /* reduce over dim 1 of a transposed [2, 4, 3] view, and over the last dim */
    operand r = make_operand(b, dt, 3, s3, 1, -1, 0, 0);
    int64_t r0[2] = {2, 3}, r2[3] = {2, 4, 1};
    a.dim = 1;
    compare_op(b, TP_OP_REDUCE_SUM, &a, &r, 1, dt, 2, r0, tol_of(dt));
    a.dim = 2;
    a.keepdim = 1;
    compare_op(b, TP_OP_REDUCE_MEAN, &a, &r, 1, dt, 3, r2, tol_of(dt));
    /* where: an INT64 cond [3, 1], x [3, 4], y [4] */
    int64_t c31[2] = {3, 1}, x34[2] = {3, 4};
    operand w[3] = {make_operand(b, TP_I64, 2, c31, 0, -1, 0, 0), make_operand(b, dt, 2, x34, 0, -1, 0, 0),
                    make_operand(b, dt, 1, s1, 0, -1, 0, 0)};
    const int64_t cond[3] = {1, 0, 5};
    set_ints(b, &w[0], cond, 3);
    compare_op(b, TP_OP_WHERE, &a, w, 3, dt, 2, x34, 0);
    /* gather along dim 1 of [2, 3, 4] with INT32 ids [2, 2] (one negative) */
    int64_t ids_shape[2] = {2, 2}, go[4] = {2, 2, 2, 4};
    operand g[2] = {make_operand(b, dt, 3, s3, 0, -1, 0, 0), make_operand(b, TP_I32, 2, ids_shape, 0, -1, 0, 0)};
    const int32_t ids[4] = {2, 0, -1, 1};
    set_ints(b, &g[1], ids, 4);
    a.dim = 1;
    compare_op(b, TP_OP_GATHER, &a, g, 2, dt, 4, go, 0);
    /* expand [3, 1] -> [2, 3, 4] */
    int64_t x31[2] = {3, 1};
    operand ex = make_operand(b, dt, 2, x31, 0, -1, 0, 0);
    compare_op(b, TP_OP_EXPAND, &a, &ex, 1, dt, 3, s3, 0);
    /* cast FP32 -> dt and dt -> FP32 (exact: a rounding or a widening) */
    operand cf = make_operand(b, TP_F32, 3, s3, 0, -1, 0, 0), cd = make_operand(b, dt, 3, s3, 0, -1, 0, 0);
    a.cast_to = (int)dt;
    compare_op(b, TP_OP_CAST, &a, &cf, 1, dt, 3, s3, 0);
    a.cast_to = TP_F32;
    compare_op(b, TP_OP_CAST, &a, &cd, 1, TP_F32, 3, s3, 0);
    free_operand(b, &dv[0]);
    free_operand(b, &dv[1]);
    free_operand(b, &u);
    free_operand(b, &e);
    b->iface->free(b, 0, ep.dev.data);
    free(ep.host.data);
    free_operand(b, &r);
    for (int i = 0; i < 3; i++)
        free_operand(b, &w[i]);
    free_operand(b, &g[0]);
    free_operand(b, &g[1]);
    free_operand(b, &ex);
    free_operand(b, &cf);
    free_operand(b, &cd);
}

START_TEST(ops_match_cpu)
{
    if (!KERNELS_RUN)
        gpu_only("ops_match_cpu: every op's values against the cpu kernels (statuses and copies still checked)");
    tp_backend *b = one_rank();
    tp_dtype dts[3] = {TP_F32, TP_F16, TP_BF16};
    for (int i = 0; i < 3; i++) {
        elementwise_cases(b, dts[i]);
        row_cases(b, dts[i]);
        matmul_cases(b, dts[i]);
        copy_cases(b, dts[i]);
        onnx_op_cases(b, dts[i]);
    }
    tp_backend_destroy(b);
}
END_TEST

/* After an abort (the group's, when a rank failed) the communicator is
 * revoked and the device may still run work that never ends: the backend
 * refuses every further call with a clear error, reset does not revive it
 * (only a new process does, in a server), and a new backend works. */
static void expect_dead_after_abort(tp_backend *b)
{
    tp_err err;
    b->iface->abort(b);
    b->iface->reset(b);
    ck_assert_int_ne(b->iface->synchronize(b, 0, &err), TP_OK);
    ck_assert_msg(strstr(err.msg, "cuda rank 0") && strstr(err.msg, "refused"), "%s", err.msg);
    tp_backend_destroy(b);
    tp_backend *n = one_rank();
    int64_t s[1] = {16};
    operand o = make_operand(n, TP_F32, 1, s, 0, -1, 0, 0);
    float got[16];
    tp_tensor g = tp_tensor_make(got, TP_F32, 1, s);
    ck_assert_msg(n->iface->copy_out(n, 0, &g, &o.dev, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(n->iface->synchronize(n, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_mem_eq(got, o.host_base, sizeof got); /* a copy: the double moves these bytes too */
    free_operand(n, &o);
    tp_backend_destroy(n);
}

/* A gather id outside [-n, n): zeros and an error at synchronize naming
 * it; bad data is benign (the backend runs on), until an abort. */
START_TEST(bad_gather_id_fails_cleanly)
{
#ifdef TP_CUDA_DOUBLE
    setenv("TP_DOUBLE_FAIL", "gather_id:0:1", 1); /* the double's gather does not read ids: it reports one */
    gpu_only("bad_gather_id_fails_cleanly: that the kernel finds id -5 at position 1 (the error is injected)");
#endif
    tp_backend *b = one_rank();
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t ids_shape[1] = {2}, xs[2] = {4, 3}, go[2] = {2, 3};
    operand g[2] = {make_operand(b, TP_F32, 2, xs, 0, -1, 0, 0), make_operand(b, TP_I64, 1, ids_shape, 0, -1, 0, 0)};
    const int64_t ids[2] = {1, -5};
    set_ints(b, &g[1], ids, 2);
    tp_tensor din[2] = {g[0].dev, g[1].dev}, dout = tp_tensor_make(dev_alloc(b, 64), TP_F32, 2, go);
    tp_err err;
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_GATHER, &a, din, 2, &dout, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(b->iface->synchronize(b, 0, &err), TP_INVALID);
    const char *want = KERNELS_RUN ? "gather: id -5 (position 1)" : "gather: id ";
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "benign: %s", err.msg);
    free(g[0].host_base);
    free(g[1].host_base);
    expect_dead_after_abort(b);
}
END_TEST

START_TEST(capture_replays_new_inputs)
{
    if (!KERNELS_RUN)
        gpu_only("capture_replays_new_inputs: the replayed add's values");
    tp_backend *b = one_rank();
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t s[2] = {64, 32};
    operand x[2] = {make_operand(b, TP_F32, 2, s, 0, -1, 0, 0), make_operand(b, TP_F32, 2, s, 0, -1, 0, 0)};
    tp_tensor din[2] = {x[0].dev, x[1].dev}, dout = tp_tensor_make(dev_alloc(b, 64 * 32 * 4), TP_F32, 2, s);
    tp_capture *c = NULL;
    tp_err err;
    ck_assert_msg(b->iface->begin_capture(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_ADD, &a, din, 2, &dout, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(b->iface->end_capture(b, 0, &c, &err) == TP_OK, "%s", err.msg);
    void *p = NULL; /* nothing may be allocated while capturing: checked separately */
    for (int round = 0; round < 3; round++) {
        float *h0 = x[0].host_base;
        for (int i = 0; i < 64 * 32; i++)
            h0[i] = (float)(round * 1000 + i);
        ck_assert_msg(b->iface->copy_in(b, 0, &x[0].dev, &x[0].host, &err) == TP_OK, "%s", err.msg);
        ck_assert_msg(b->iface->replay(b, 0, c, &err) == TP_OK, "%s", err.msg);
        float *got = malloc(64 * 32 * 4);
        tp_tensor g = tp_tensor_make(got, TP_F32, 2, s);
        ck_assert_msg(b->iface->copy_out(b, 0, &g, &dout, &err) == TP_OK, "%s", err.msg);
        for (int i = 0; KERNELS_RUN && i < 64 * 32; i++)
            ck_assert(got[i] == h0[i] + ((float *)x[1].host_base)[i]);
        free(got);
    }
    b->iface->capture_free(b, c);
    tp_capture *c2 = NULL;
    ck_assert_msg(b->iface->begin_capture(b, 0, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_ne(b->iface->alloc(b, 0, 64, &p, &err), TP_OK);
    ck_assert_int_ne(b->iface->end_capture(b, 0, &c2, &err), TP_OK); /* poisoned by the refused alloc */
    ck_assert_ptr_null(c2);
    free(x[0].host_base);
    free(x[1].host_base);
    tp_backend_destroy(b);
}
END_TEST

START_TEST(bad_embedding_id_fails_cleanly)
{
#ifdef TP_CUDA_DOUBLE
    setenv("TP_DOUBLE_FAIL", "embed_id:0:1", 1); /* the double's embedding does not read ids: it reports one */
    gpu_only("bad_embedding_id_fails_cleanly: that the kernel finds id 99 (the error is injected)");
#endif
    tp_backend *b = one_rank();
    tp_attrs a;
    memset(&a, 0, sizeof a);
    int64_t ids_shape[1] = {2}, table[2] = {4, 3}, eo[2] = {2, 3};
    operand emb[2] = {make_operand(b, TP_I32, 1, ids_shape, 0, -1, 0, 0),
                      make_operand(b, TP_F32, 2, table, 0, -1, 0, 0)};
    int32_t ids[2] = {1, 99};
    tp_tensor h = tp_tensor_make(ids, TP_I32, 1, ids_shape);
    tp_err err;
    ck_assert_msg(b->iface->copy_in(b, 0, &emb[0].dev, &h, &err) == TP_OK, "%s", err.msg);
    tp_tensor din[2] = {emb[0].dev, emb[1].dev}, dout = tp_tensor_make(dev_alloc(b, 64), TP_F32, 2, eo);
    ck_assert_msg(b->iface->run_op(b, 0, TP_OP_EMBEDDING, &a, din, 2, &dout, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(b->iface->synchronize(b, 0, &err), TP_INVALID);
    const char *want = KERNELS_RUN ? "id 99" : "embedding: id ";
    ck_assert_msg(strstr(err.msg, want) != NULL, "%s", err.msg);
    /* benign: the group does not abort for bad data alone, the backend runs on */
    ck_assert_msg(b->iface->synchronize(b, 0, &err) == TP_OK, "benign: %s", err.msg);
    free(emb[0].host_base);
    free(emb[1].host_base);
    expect_dead_after_abort(b);
}
END_TEST

/* ------------------------------------------------- multi-process ranks */

#define RANK_ENV "TP_CUDA_DEVICE_TEST_RANK"

/* Deterministic data of rank r, so every rank can compute every reference. */
static float val(int r, int64_t i) { return (float)(r + 1) * 0.5f + 0.01f * (float)i; }

typedef struct {
    tp_backend *b;
    int rank, world, failures;
} rank_ctx;

static void *ralloc(rank_ctx *c, size_t bytes, int symmetric)
{
    void *p = NULL;
    tp_err err;
    tp_status st = symmetric ? c->b->iface->alloc_symmetric(c->b, c->rank, bytes, &p, &err)
                             : c->b->iface->alloc(c->b, c->rank, bytes, &p, &err);
    if (st != TP_OK) {
        fprintf(stderr, "rank %d: alloc: %s\n", c->rank, err.msg);
        exit(2);
    }
    return p;
}

static void put(rank_ctx *c, tp_tensor *dev, const float *host)
{
    tp_tensor h = *dev;
    h.data = (void *)host;
    tp_err err;
    if (c->b->iface->copy_in(c->b, c->rank, dev, &h, &err) != TP_OK) {
        fprintf(stderr, "rank %d: copy_in: %s\n", c->rank, err.msg);
        exit(2);
    }
}

/* Runs a collective and compares out with want (contiguous floats). */
/* The collectives whose bytes the double moves itself (NCCL, no kernel
 * of ours): the rest is judged on a GPU only. */
static int double_judges(tp_op op, const tp_attrs *a)
{
    return (op == TP_OP_ALL_REDUCE && a->algo == TP_ALGO_NCCL) || op == TP_OP_BROADCAST ||
           ((op == TP_OP_ALL_GATHER || op == TP_OP_REDUCE_SCATTER) && a->dim == 0);
}

static void expect(rank_ctx *c, const char *what, tp_op op, const tp_attrs *a, tp_tensor *ins, int n, tp_tensor *out,
                   const float *want, float tol)
{
    int judged = KERNELS_RUN || double_judges(op, a);
    if (!judged && c->rank == 0)
        printf("GPU-only: collectives_across_processes: %s's values on %d ranks (kernels are recorded, not run, "
               "by the double)\n",
               what, c->world);
    tp_err err;
    int64_t m = tp_tensor_numel(out);
    float *got = malloc((size_t)m * sizeof(float) + 8);
    tp_tensor g = *out;
    g.data = got;
    if (c->b->iface->collective(c->b, c->rank, op, a, ins, n, out, &err) != TP_OK ||
        c->b->iface->copy_out(c->b, c->rank, &g, out, &err) != TP_OK ||
        c->b->iface->synchronize(c->b, c->rank, &err) != TP_OK) {
        fprintf(stderr, "rank %d: %s: %s\n", c->rank, what, err.msg);
        exit(2);
    }
    for (int64_t i = 0; judged && i < m; i++)
        if (fabsf(got[i] - want[i]) > tol * (1.0f + fabsf(want[i]))) {
            fprintf(stderr, "rank %d: %s: element %lld is %g, want %g\n", c->rank, what, (long long)i, got[i],
                    want[i]);
            c->failures++;
            break;
        }
    free(got);
}

/* all_gather on dim 1 of [2, 3], reduce_scatter on dim 1 of [2, 3d],
 * all_reduce (nccl and one_shot), broadcast from the last rank, and
 * all_to_all split 0 / concat 1. */
static void rank_collectives(rank_ctx *c)
{
    int d = c->world, r = c->rank;
    int64_t n = 6 * d;
    float *mine = malloc((size_t)n * sizeof(float)), *want = malloc((size_t)n * d * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        mine[i] = val(r, i);
    tp_attrs a;
    memset(&a, 0, sizeof a);
    char *sym = ralloc(c, (size_t)n * 4 * 2, 1), *reg = ralloc(c, (size_t)n * d * 4, 0);
    int64_t is[2] = {2, 3}, os[2] = {2, 3 * (int64_t)d};
    tp_tensor in = tp_tensor_make(sym, TP_F32, 2, is), out = tp_tensor_make(reg, TP_F32, 2, os);
    put(c, &in, mine);
    a.dim = 1;
    for (int64_t i = 0; i < 2; i++)
        for (int q = 0; q < d; q++)
            for (int64_t j = 0; j < 3; j++)
                want[i * 3 * d + q * 3 + j] = val(q, i * 3 + j);
    expect(c, "all_gather", TP_OP_ALL_GATHER, &a, &in, 1, &out, want, 0);
    /* reduce_scatter: [2, 3d] -> [2, 3], sum */
    tp_tensor rin = tp_tensor_make(sym, TP_F32, 2, os), rout = tp_tensor_make(reg, TP_F32, 2, is);
    put(c, &rin, mine);
    for (int64_t i = 0; i < 2; i++)
        for (int64_t j = 0; j < 3; j++) {
            float s = 0;
            for (int q = 0; q < d; q++)
                s += val(q, i * 3 * d + r * 3 + j);
            want[i * 3 + j] = s;
        }
    expect(c, "reduce_scatter", TP_OP_REDUCE_SCATTER, &a, &rin, 1, &rout, want, 1e-5f);
    /* the same on dim 0: rank blocks are contiguous, no packing */
    a.dim = 0;
    int64_t g0[2] = {2 * (int64_t)d, 3};
    tp_tensor gin = tp_tensor_make(sym, TP_F32, 2, is), gout = tp_tensor_make(reg, TP_F32, 2, g0);
    put(c, &gin, mine);
    for (int q = 0; q < d; q++)
        for (int64_t i = 0; i < 6; i++)
            want[q * 6 + i] = val(q, i);
    expect(c, "all_gather (dim 0)", TP_OP_ALL_GATHER, &a, &gin, 1, &gout, want, 0);
    tp_tensor sin = tp_tensor_make(sym, TP_F32, 2, g0), sout = tp_tensor_make(reg, TP_F32, 2, is);
    put(c, &sin, mine);
    for (int64_t i = 0; i < 6; i++) {
        float sum = 0;
        for (int q = 0; q < d; q++)
            sum += val(q, r * 6 + i);
        want[i] = sum;
    }
    expect(c, "reduce_scatter (dim 0)", TP_OP_REDUCE_SCATTER, &a, &sin, 1, &sout, want, 1e-5f);
    a.dim = 1;
    /* all_reduce over [2, 3d], both lowerings */
    for (int64_t i = 0; i < n; i++) {
        float s = 0;
        for (int q = 0; q < d; q++)
            s += val(q, i);
        want[i] = s;
    }
    tp_tensor arout = tp_tensor_make(reg, TP_F32, 2, os);
    a.algo = TP_ALGO_NCCL;
    expect(c, "all_reduce (nccl)", TP_OP_ALL_REDUCE, &a, &rin, 1, &arout, want, 1e-5f);
    a.algo = TP_ALGO_ONE_SHOT;
    expect(c, "all_reduce (one_shot)", TP_OP_ALL_REDUCE, &a, &rin, 1, &arout, want, 1e-5f);
    a.algo = TP_ALGO_DEFAULT;
    a.src = d - 1;
    for (int64_t i = 0; i < n; i++)
        want[i] = val(d - 1, i);
    expect(c, "broadcast", TP_OP_BROADCAST, &a, &rin, 1, &arout, want, 0);
    /* all_to_all: in [2d, 3] split on 0, concat on 1 -> [2, 3d] */
    int64_t ts[2] = {2 * (int64_t)d, 3};
    tp_tensor tin = tp_tensor_make(sym, TP_F32, 2, ts), tout = tp_tensor_make(reg, TP_F32, 2, os);
    put(c, &tin, mine);
    a.split_dim = 0;
    a.concat_dim = 1;
    for (int64_t i = 0; i < 2; i++)
        for (int q = 0; q < d; q++)
            for (int64_t j = 0; j < 3; j++)
                want[i * 3 * d + q * 3 + j] = val(q, (r * 2 + i) * 3 + j);
    expect(c, "all_to_all", TP_OP_ALL_TO_ALL, &a, &tin, 1, &tout, want, 0);
    free(mine);
    free(want);
}

/* fused_all_gather_matmul (rows) and fused_matmul_reduce_scatter (rows)
 * against gather-then-matmul and matmul-then-reduce, K = 4, N = 5. */
static void rank_fused(rank_ctx *c)
{
    int d = c->world, r = c->rank;
    int64_t len = 2, K = 4, N = 5;
    float w[20], x[4][8], *want = calloc((size_t)(d * len * N), sizeof(float));
    for (int i = 0; i < 20; i++)
        w[i] = 0.1f * (float)(i % 7) - 0.3f;
    for (int q = 0; q < d; q++)
        for (int i = 0; i < len * K; i++)
            x[q][i] = val(q, i);
    char *sym = ralloc(c, 4096, 1), *reg = ralloc(c, 4096, 0);
    int64_t xs[2] = {len, K}, wsh[2] = {K, N}, os[2] = {d * len, N};
    tp_tensor ins[3] = {tp_tensor_make(sym, TP_F32, 2, xs), tp_tensor_make(reg + 2048, TP_F32, 2, wsh)};
    tp_tensor out = tp_tensor_make(reg, TP_F32, 2, os);
    put(c, &ins[0], x[r]);
    put(c, &ins[1], w);
    for (int q = 0; q < d; q++)
        for (int64_t i = 0; i < len; i++)
            for (int64_t j = 0; j < N; j++)
                for (int64_t k = 0; k < K; k++)
                    want[(q * len + i) * N + j] += x[q][i * K + k] * w[k * N + j];
    tp_attrs a;
    memset(&a, 0, sizeof a);
    a.dim = 0;
    a.n_fused = 1;
    a.algo = TP_ALGO_FUSED;
    expect(c, "fused_all_gather_matmul", TP_OP_FUSED_AG_MM, &a, ins, 2, &out, want, 1e-4f);
    /* mm_rs: a = [d*len, K] (rank data), out [len, N], workspace d*len*N */
    int64_t as[2] = {d * len, K}, ro[2] = {len, N}, wss[1] = {d * len * N};
    float *am = malloc(sizeof(float) * (size_t)(d * len * K));
    for (int64_t i = 0; i < d * len * K; i++)
        am[i] = val(r, i);
    tp_tensor rs[3] = {tp_tensor_make(sym + 1024, TP_F32, 2, as), ins[1], tp_tensor_make(sym + 2048, TP_F32, 1, wss)};
    tp_tensor rout = tp_tensor_make(reg, TP_F32, 2, ro);
    put(c, &rs[0], am);
    memset(want, 0, sizeof(float) * (size_t)(len * N));
    for (int q = 0; q < d; q++)
        for (int64_t i = 0; i < len; i++)
            for (int64_t j = 0; j < N; j++)
                for (int64_t k = 0; k < K; k++)
                    want[i * N + j] += val(q, (r * len + i) * K + k) * w[k * N + j];
    expect(c, "fused_matmul_reduce_scatter", TP_OP_FUSED_MM_RS, &a, rs, 3, &rout, want, 1e-4f);
    free(am);
    free(want);
}

/* Entry point of a spawned rank: exits with 0 when every check passed. */
static void rank_main(void)
{
    rank_ctx c = {.rank = atoi(getenv(RANK_ENV)), .world = atoi(getenv("TP_CUDA_DEVICE_TEST_WORLD"))};
    tp_err err;
    if (tp_cuda_backend_create(c.world, c.rank, getenv("TP_CUDA_DEVICE_TEST_ID"), &c.b, &err) != TP_OK) {
        fprintf(stderr, "rank %d: %s\n", c.rank, err.msg);
        exit(2);
    }
    rank_collectives(&c);
    rank_fused(&c);
    tp_backend_destroy(c.b);
    exit(c.failures ? 1 : 0);
}

/* Spawns `world` copies of this binary as ranks; fails on any non-zero
 * exit or after 120 s (a hang is a failure, not a stuck CI job). */
static void run_ranks(int world)
{
    char id[TP_CUDA_NCCL_ID_HEX + 1], env[4][300];
    tp_err err;
    ck_assert_msg(tp_cuda_nccl_id_new(id, &err) == TP_OK, "%s", err.msg);
    pid_t pids[8];
    for (int r = 0; r < world; r++) {
        snprintf(env[0], sizeof env[0], RANK_ENV "=%d", r);
        snprintf(env[1], sizeof env[1], "TP_CUDA_DEVICE_TEST_WORLD=%d", world);
        snprintf(env[2], sizeof env[2], "TP_CUDA_DEVICE_TEST_ID=%s", id);
        snprintf(env[3], sizeof env[3], "LOCAL_RANK=%d", r);
        int n = 0;
        while (environ[n])
            n++;
        char **envp = calloc((size_t)n + 5, sizeof *envp);
        for (int k = 0; k < 4; k++) /* first: getenv takes the first match */
            envp[k] = env[k];
        memcpy(envp + 4, environ, (size_t)n * sizeof *envp);
        char *argv[] = {"test_cuda_device", NULL};
        ck_assert_int_eq(posix_spawn(&pids[r], "/proc/self/exe", NULL, NULL, argv, envp), 0);
        free(envp);
    }
    time_t t0 = time(NULL);
    int done = 0, failed = 0, status;
    while (done < world && time(NULL) - t0 < 120) {
        for (int r = 0; r < world; r++)
            if (pids[r] > 0 && waitpid(pids[r], &status, WNOHANG) == pids[r]) {
                failed |= !WIFEXITED(status) || WEXITSTATUS(status) != 0;
                pids[r] = 0;
                done++;
            }
        usleep(100000);
    }
    for (int r = 0; r < world; r++)
        if (pids[r] > 0) {
            kill(pids[r], SIGKILL);
            waitpid(pids[r], &status, 0);
            failed = 1;
        }
    ck_assert_msg(!failed, "a rank failed or hung (see stderr)");
}

START_TEST(collectives_across_processes)
{
    int n = probe_devices();
    for (int world = 2; world <= 4 && world <= n; world *= 2)
        run_ranks(world);
}
END_TEST

/* ------------------------------------------------------------- examples */

/* World > 1: one process per GPU, this process rank 0 and `tpserve
 * worker` (from $TPSERVE, as `make unit` sets it) the others. */
static void run_example_cuda(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    tp_graph *g;
    tp_err err = {{0}};
    ck_assert_msg(tp_graph_load(path, &g, &err) == TP_OK, "%s", err.msg);
    int world = g->world_size;
    tp_graph_free(g);
    if (world > probe_devices()) {
        printf("skipped: %s needs %d GPUs, this machine has %d\n", path, world, probe_devices());
        return;
    }
#ifdef TP_CUDA_DOUBLE
    const char *exe = "/proc/self/exe"; /* this binary is its own worker, linked with the double */
#else
    const char *exe = getenv("TPSERVE") ? getenv("TPSERVE") : "build/tpserve";
#endif
    char *argv[] = {(char *)exe, "worker", (char *)path, "--backend", "cuda", NULL};
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv};
    tp_engine_opts o = {.backend = "cuda", .group = world > 1 ? &go : NULL};
    tp_engine *e;
    ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s: %s", path, err.msg);
    int n_in, n_ref, n_out;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *ref = tu_load_tensors(ref_path, &n_ref), *out;
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: %s", path, err.msg);
    ck_assert_ptr_null(tp_engine_lost(e));
    if (KERNELS_RUN)
        tu_check_outputs(path, out, n_out, ref, n_ref, rtol);
    else
        tu_check_shapes(path, out, n_out, ref, n_ref);
    tp_host_tensors_free(out, n_out);
    tp_host_tensors_free(in, n_in);
    tp_host_tensors_free(ref, n_ref);
    tp_engine_free(e);
}

START_TEST(examples_through_engine)
{
    if (!KERNELS_RUN)
        gpu_only("examples_through_engine: outputs against the references (names, dtypes and shapes are checked)");
    tu_foreach_example(run_example_cuda);
}
END_TEST

/* The generation example (docs/models.md, "Generation graphs") driven
 * step by step on the cuda backend: kv_attention's cache writes and reads,
 * argmax keys through the INT64 all_reduce max, one process per GPU, and
 * the NumPy reference's greedy tokens exactly. */
START_TEST(generation_decoder_through_engine)
{
    if (!KERNELS_RUN)
        gpu_only("generation_decoder_through_engine: the greedy tokens (every step's status and shape is checked)");
    json_t *steps = tu_gen_steps();
    for (int world = 1; world <= 4; world *= 2) {
        char path[512];
        snprintf(path, sizeof path, "%s/gen_decoder_tp%d.json", getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs",
                 world);
        if (world > probe_devices()) {
            printf("skipped: %s needs %d GPUs, this machine has %d\n", path, world, probe_devices());
            continue;
        }
#ifdef TP_CUDA_DOUBLE
        const char *exe = "/proc/self/exe";
#else
        const char *exe = getenv("TPSERVE") ? getenv("TPSERVE") : "build/tpserve";
#endif
        char *argv[] = {(char *)exe, "worker", path, "--backend", "cuda", NULL};
        tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv};
        tp_engine_opts o = {.backend = "cuda", .group = world > 1 ? &go : NULL};
        tp_engine *e;
        tp_err err = {{0}};
        ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s: %s", path, err.msg);
        tu_gen_schedule(e, json_object_get(steps, "batched"), path, KERNELS_RUN);
        ck_assert_ptr_null(tp_engine_lost(e));
        tp_engine_free(e);
    }
    json_decref(steps);
}
END_TEST

#endif /* TP_HAVE_CUDA */

#ifdef TP_CUDA_DOUBLE
/* Every process of a test (ranks and workers inherit it) appends the
 * double's rule breaches to one log: a test passes only with none. */
static char rule_log[64];
static void double_setup(void)
{
    snprintf(rule_log, sizeof rule_log, "/tmp/tp_double_device_rules_%d.log", (int)getpid());
    unlink(rule_log);
    setenv("TP_DOUBLE_LOG", rule_log, 1);
}

static void double_teardown(void)
{
    struct stat st;
    int logged = stat(rule_log, &st) == 0 ? (int)st.st_size : 0;
    unlink(rule_log);
    ck_assert_msg(dbl_rule_breaches() == 0 && logged == 0, "the double saw rules broken (see stderr)");
}
#endif

static Suite *cuda_device_suite(void)
{
#ifdef TP_HAVE_CUDA
    if (getenv(RANK_ENV))
        rank_main(); /* a spawned rank: never returns */
#endif
    Suite *s = suite_create("cuda_device");
    TCase *probe = tcase_create("probe");
    tcase_add_test(probe, probe_asks_once_in_a_child);
    suite_add_tcase(s, probe);
    TCase *tc = tcase_create("device");
    if (probe_devices() == 0) {
#ifdef TP_HAVE_CUDA
        if (gpu_unusable())
            tcase_add_test(tc, unusable_gpu_fails);
        else
#endif
            tcase_add_test(tc, no_device_skips);
        suite_add_tcase(s, tc);
        return s;
    }
#ifdef TP_HAVE_CUDA
    tcase_set_timeout(tc, 600);
#ifdef TP_CUDA_DOUBLE
    tcase_add_checked_fixture(tc, double_setup, double_teardown);
#endif
    tcase_add_test(tc, ops_match_cpu);
    tcase_add_test(tc, capture_replays_new_inputs);
    tcase_add_test(tc, bad_embedding_id_fails_cleanly);
    tcase_add_test(tc, bad_gather_id_fails_cleanly);
    tcase_add_test(tc, collectives_across_processes);
    tcase_add_test(tc, examples_through_engine);
    tcase_add_test(tc, generation_decoder_through_engine);
#endif
    suite_add_tcase(s, tc);
    return s;
}

#ifdef TP_CUDA_DOUBLE
int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "worker") == 0) /* a rank of examples_through_engine */
        return tp_worker_main(argc - 1, argv + 1);
    return tp_check_run(cuda_device_suite());
}
#else
TP_CHECK_MAIN(cuda_device_suite)
#endif
