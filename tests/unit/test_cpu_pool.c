/* test_cpu_pool.c — the cpu backend's per-rank worker pool
 * (kernels/cpu/cpu_pool.h) and the kernels that run on it: every task
 * once, on the caller and the workers, failures returned with their
 * message, products on one OpenBLAS thread inside a task, attention /
 * kv_attention bit for bit the same on any pool (each head is the same
 * sequential code wherever it runs, so no tolerance), and matmul's column
 * split of a few rows by a large b. */
#include <cblas.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_main.h"
#include "common/tp_generate.h"
#include "cpu/blas_pick.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_pool.h"
#include "cpu/ops_internal.h"
#include "cpu/small_gemm.h"
#include "spin_wait.h"
#include "testutil.h"

/* Ten minutes: longer than any test runs (and than the case's timeout),
 * so a wait that should end in its spin never falls back on a wake-up
 * that would hide a lost one. */
#define SPIN_LONG ((int64_t)600 * 1000 * 1000 * 1000)

static cpu_pool *pool_spinning(int threads, int64_t spin_ns)
{
    cpu_pool *p = NULL;
    tp_err err;
    ck_assert_msg(cpu_pool_create(threads, spin_ns, &p, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(cpu_pool_threads(p), threads);
    return p;
}

static cpu_pool *pool_make(int threads) { return pool_spinning(threads, TP_SPIN_NS); }

START_TEST(create_and_free)
{
    tp_err err;
    cpu_pool *p = (cpu_pool *)&err;
    ck_assert_int_eq(cpu_pool_create(0, 0, &p, &err), TP_INVALID);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(err.msg, "0 threads") != NULL, "%s", err.msg);
    ck_assert_int_eq(cpu_pool_threads(NULL), 1);
    cpu_pool_free(NULL);
    for (int t = 1; t <= 4; t++)
        cpu_pool_free(pool_make(t));
}
END_TEST

/* ------------------------------------------------------------ jobs */

enum { MANY = 5000 };

typedef struct {
    atomic_int runs[MANY];
    atomic_int bad_slot;
    int threads;
} count_job;

static tp_status count_task(void *arg, int64_t task, int slot, tp_err *err)
{
    (void)err;
    count_job *j = arg;
    if (slot < 0 || slot >= j->threads)
        atomic_fetch_add(&j->bad_slot, 1);
    atomic_fetch_add(&j->runs[task], 1);
    return TP_OK;
}

/* Each slot's buffers are its own, kept between calls while large
 * enough (the point: no fresh pages per call), grown when asked for
 * more, 64-byte aligned; none without a pool or outside its slots. */
START_TEST(scratch_kept_per_slot)
{
    cpu_pool *p = pool_make(2);
    float *b[2][CPU_POOL_SCRATCHES];
    for (int s = 0; s < 2; s++)
        for (int w = 0; w < CPU_POOL_SCRATCHES; w++) {
            b[s][w] = cpu_pool_scratch(p, s, w, 1000);
            ck_assert_ptr_nonnull(b[s][w]);
            ck_assert_uint_eq((uintptr_t)b[s][w] % 64, 0);
            for (int i = 0; i < 1000; i++) /* writable to its end (ASan checks) */
                b[s][w][i] = (float)(s * 10 + w);
        }
    for (int s = 0; s < 2; s++)
        for (int w = 0; w < CPU_POOL_SCRATCHES; w++) {
            for (int o = 0; o < 2; o++)
                for (int v = 0; v < CPU_POOL_SCRATCHES; v++)
                    if (o != s || v != w)
                        ck_assert_ptr_ne(b[s][w], b[o][v]);
            ck_assert_ptr_eq(cpu_pool_scratch(p, s, w, 1000), b[s][w]);
            ck_assert_ptr_eq(cpu_pool_scratch(p, s, w, 10), b[s][w]);
        }
    float *grown = cpu_pool_scratch(p, 1, 0, 1 << 20);
    ck_assert_ptr_nonnull(grown);
    grown[(1 << 20) - 1] = 1.0f;
    ck_assert_ptr_eq(cpu_pool_scratch(p, 1, 0, 1000), grown);
    ck_assert_ptr_eq(cpu_pool_scratch(p, 0, 0, 1000), b[0][0]);
    ck_assert_ptr_null(cpu_pool_scratch(NULL, 0, 0, 16));
    ck_assert_ptr_null(cpu_pool_scratch(p, 2, 0, 16));
    ck_assert_ptr_null(cpu_pool_scratch(p, -1, 0, 16));
    ck_assert_ptr_null(cpu_pool_scratch(p, 0, CPU_POOL_SCRATCHES, 16));
    cpu_pool_free(p); /* frees them (LeakSanitizer under make asan) */
}
END_TEST

/* Every task exactly once, on slots of the pool, job after job (workers
 * must see each new job, never run one twice), with no pool, and with
 * waits that sleep at once, spin a while, or spin all along. */
START_TEST(every_task_once)
{
    static count_job j;
    cpu_pool *pools[] = {NULL, pool_make(1), pool_make(2), pool_make(3), pool_spinning(2, 0), pool_spinning(3, SPIN_LONG)};
    for (int k = 0; k < (int)(sizeof pools / sizeof pools[0]); k++) {
        j.threads = cpu_pool_threads(pools[k]);
        for (int64_t n = 0; n <= MANY; n = n ? n * 3 : 1) {
            for (int rep = 0; rep < 50; rep++) {
                memset(&j.runs, 0, sizeof j.runs);
                atomic_store(&j.bad_slot, 0);
                tp_err err;
                ck_assert_int_eq(cpu_pool_run(pools[k], n, count_task, &j, &err), TP_OK);
                int64_t wrong = -1; /* one assertion a job: each is a write to Check's pipe */
                for (int64_t i = 0; i < MANY && wrong < 0; i++)
                    if (atomic_load(&j.runs[i]) != (i < n))
                        wrong = i;
                ck_assert_msg(wrong < 0 && atomic_load(&j.bad_slot) == 0,
                              "%d threads, %lld tasks: task %lld ran %d times; %d on a slot out of range", j.threads,
                              (long long)n, (long long)wrong, wrong < 0 ? 0 : atomic_load(&j.runs[wrong]),
                              atomic_load(&j.bad_slot));
            }
        }
        cpu_pool_free(pools[k]);
    }
}
END_TEST

/* Two tasks that each wait until both are running: they can only finish
 * when a worker runs one while the caller runs the other. The wait is
 * bounded so a broken pool fails the test instead of hanging it. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int inside;
} meet_job;

static tp_status meet_task(void *arg, int64_t task, int slot, tp_err *err)
{
    (void)slot;
    meet_job *j = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 20;
    pthread_mutex_lock(&j->mu);
    j->inside++;
    pthread_cond_broadcast(&j->cv);
    int rc = 0;
    while (j->inside < 2 && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&j->cv, &j->mu, &until);
    int met = j->inside >= 2;
    pthread_mutex_unlock(&j->mu);
    return met ? TP_OK : tp_fail(err, TP_INTERNAL, "task %lld ran alone", (long long)task);
}

/* A worker joins job after job, whether it slept, spun, or is still
 * spinning from the last one. */
START_TEST(workers_take_tasks)
{
    int64_t spins[] = {0, TP_SPIN_NS, SPIN_LONG};
    for (int k = 0; k < 3; k++) {
        cpu_pool *p = pool_spinning(2, spins[k]);
        for (int rep = 0; rep < 20; rep++) {
            meet_job j = {PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0};
            tp_err err;
            ck_assert_msg(cpu_pool_run(p, 2, meet_task, &j, &err) == TP_OK, "%d: %s", k, err.msg);
        }
        cpu_pool_free(p);
    }
}
END_TEST

/* Workers spinning for the next job see the pool stop: freeing it must
 * not wait out their spin (SPIN_LONG, past the case's timeout). */
START_TEST(free_stops_spinning_workers)
{
    static count_job j;
    for (int rep = 0; rep < 20; rep++) {
        cpu_pool *p = pool_spinning(3, SPIN_LONG);
        j.threads = 3;
        tp_err err;
        ck_assert_int_eq(cpu_pool_run(p, 64, count_task, &j, &err), TP_OK);
        cpu_pool_free(p);
    }
}
END_TEST

enum { FAIL_AT = 37 };

static tp_status failing_task(void *arg, int64_t task, int slot, tp_err *err)
{
    (void)arg, (void)slot;
    if (task == FAIL_AT)
        return tp_fail(err, TP_INVALID, "task %lld refused", (long long)task);
    return TP_OK;
}

/* The failing task's status and message come back, from any pool, and
 * the pool runs the next job whole. */
START_TEST(errors_propagate)
{
    static count_job j;
    cpu_pool *pools[3] = {NULL, pool_make(1), pool_make(2)};
    for (int k = 0; k < 3; k++) {
        for (int rep = 0; rep < 50; rep++) {
            tp_err err = {{0}};
            ck_assert_int_eq(cpu_pool_run(pools[k], 1000, failing_task, NULL, &err), TP_INVALID);
            ck_assert_str_eq(err.msg, "task 37 refused");
        }
        memset(&j.runs, 0, sizeof j.runs);
        j.threads = cpu_pool_threads(pools[k]);
        tp_err err;
        ck_assert_int_eq(cpu_pool_run(pools[k], 100, count_task, &j, &err), TP_OK);
        int once = 0;
        for (int i = 0; i < 100; i++)
            once += atomic_load(&j.runs[i]) == 1;
        ck_assert_int_eq(once, 100);
        cpu_pool_free(pools[k]);
    }
}
END_TEST

/* Inside a task, tp_blas_one_thread is on (products on one OpenBLAS
 * thread); outside, the caller's setting is back. */
static tp_status pinned_task(void *arg, int64_t task, int slot, tp_err *err)
{
    (void)task, (void)slot, (void)err;
    int was = tp_blas_one_thread(1);
    if (!was)
        atomic_fetch_add((atomic_int *)arg, 1);
    return TP_OK;
}

START_TEST(tasks_run_products_on_one_thread)
{
    cpu_pool *pools[3] = {NULL, pool_make(1), pool_make(2)};
    for (int k = 0; k < 3; k++) {
        atomic_int unpinned = 0;
        tp_err err;
        ck_assert_int_eq(cpu_pool_run(pools[k], 200, pinned_task, &unpinned, &err), TP_OK);
        ck_assert_int_eq(atomic_load(&unpinned), 0);
        ck_assert_int_eq(tp_blas_one_thread(0), 0); /* the caller's own setting, restored */
        cpu_pool_free(pools[k]);
    }
}
END_TEST

/* ------------------------------------------- kernels on the pool */

/* out of op on ins through cpu_op_run_on(pool) */
static void run_on(cpu_pool *pool, tp_op op, const tp_attrs *a, tp_tensor *ins, int n, tp_tensor *out)
{
    tp_err err;
    ck_assert_msg(cpu_op_run_on(pool, op, a, ins, n, out, 0, 1, &err) == TP_OK, "%s on %d threads: %s",
                  tp_op_name(op), cpu_pool_threads(pool), err.msg);
}

/* n deterministic values of dtype dt (tu_fill's, rounded), malloc'd. */
static void *filled(tp_dtype dt, int64_t n, unsigned seed)
{
    float *f = malloc(sizeof(float) * (size_t)n);
    void *t = malloc(tp_dtype_size(dt) * (size_t)n);
    ck_assert(f && t);
    tu_fill(f, n, seed);
    for (int64_t i = 0; i < n; i++)
        tp_store_f32(t, dt, i, f[i]);
    free(f);
    return t;
}

/* Attention of q, k, v [B, H, S|T, D] of dtype dt with a causal flag and
 * a key mask: the same bytes on pools of 1 to 3 threads and without one.
 * With OpenBLAS's count at 2, one head of 512 x 512 x 64 is large enough
 * to be threaded outside a task. */
static void attention_case(int64_t B, int64_t H, int64_t S, int64_t T, int64_t D, tp_dtype dt)
{
    int64_t qs[4] = {B, H, S, D}, ks[4] = {B, H, T, D}, ms[2] = {B, T};
    int64_t nq = B * H * S * D, nk = B * H * T * D, es = (int64_t)tp_dtype_size(dt);
    void *q = filled(dt, nq, 1), *k = filled(dt, nk, 2), *v = filled(dt, nk, 3);
    int64_t *mask = malloc(sizeof(int64_t) * (size_t)(B * T));
    char *want = malloc((size_t)(nq * es)), *got = malloc((size_t)(nq * es));
    ck_assert(mask && want && got);
    for (int64_t i = 0; i < B * T; i++)
        mask[i] = (i * 7) % 5 != 0;
    tp_tensor ins[4] = {tp_tensor_make(q, dt, 4, qs), tp_tensor_make(k, dt, 4, ks), tp_tensor_make(v, dt, 4, ks),
                        tp_tensor_make(mask, TP_I64, 2, ms)};
    for (int causal = 0; causal <= 1; causal++) {
        tp_attrs a;
        memset(&a, 0, sizeof a);
        a.causal = causal;
        tp_tensor out = tp_tensor_make(want, dt, 4, qs);
        run_on(NULL, TP_OP_ATTENTION, &a, ins, 4, &out);
        for (int t = 1; t <= 3; t++) {
            cpu_pool *p = pool_make(t);
            memset(got, 0xa5, (size_t)(nq * es));
            out.data = got;
            run_on(p, TP_OP_ATTENTION, &a, ins, 4, &out);
            ck_assert_msg(memcmp(got, want, (size_t)(nq * es)) == 0,
                          "attention [%lld, %lld, %lld, %lld] %s causal %d: other bits on %d threads", (long long)B,
                          (long long)H, (long long)S, (long long)D, tp_dtype_name(dt), causal, t);
            cpu_pool_free(p);
        }
    }
    free(q), free(k), free(v), free(mask), free(want), free(got);
}

START_TEST(attention_same_bits_on_any_pool)
{
    tp_blas_set_threads(2);
    attention_case(2, 5, 37, 41, 16, TP_F32);
    attention_case(3, 3, 24, 24, 8, TP_F16);
    attention_case(1, 2, 512, 512, 64, TP_F32);
    tp_blas_set_threads(1);
}
END_TEST

/* kv_attention: two steps (a prefill of 3 tokens, then 1) over rows of
 * which one is inactive, GQA 4 heads over 2: the same output and caches,
 * byte for byte, on pools of 1 to 3 threads and without one. */
enum { KB = 3, KH = 4, KHKV = 2, KD = 8, KS = 2, KL = 16 };

typedef struct {
    float kc[KS * KHKV * KL * KD], vc[KS * KHKV * KL * KD], out[2][KB * KH * 3 * KD];
} kv_state;

static void kv_steps(cpu_pool *pool, kv_state *st)
{
    memset(st, 0, sizeof *st);
    int64_t slot[KB] = {2, 0, 1}, cs[4] = {KS, KHKV, KL, KD}, bs[1] = {KB};
    for (int step = 0; step < 2; step++) {
        int64_t T = step == 0 ? 3 : 1, pos[KB] = {step * 3, 5, step * 3};
        int64_t qs[4] = {KB, KH, T, KD}, ks[4] = {KB, KHKV, T, KD};
        float q[KB * KH * 3 * KD], k[KB * KHKV * 3 * KD], v[KB * KHKV * 3 * KD];
        tu_fill(q, KB * KH * T * KD, 10u + (unsigned)step);
        tu_fill(k, KB * KHKV * T * KD, 20u + (unsigned)step);
        tu_fill(v, KB * KHKV * T * KD, 30u + (unsigned)step);
        tp_tensor ins[7] = {tp_tensor_make(q, TP_F32, 4, qs),       tp_tensor_make(k, TP_F32, 4, ks),
                            tp_tensor_make(v, TP_F32, 4, ks),       tp_tensor_make(st->kc, TP_F32, 4, cs),
                            tp_tensor_make(st->vc, TP_F32, 4, cs),  tp_tensor_make(slot, TP_I64, 1, bs),
                            tp_tensor_make(pos, TP_I64, 1, bs)};
        tp_tensor out = tp_tensor_make(st->out[step], TP_F32, 4, qs);
        memset(st->out[step], 0xa5, sizeof st->out[step]);
        run_on(pool, TP_OP_KV_ATTENTION, NULL, ins, 7, &out);
    }
}

START_TEST(kv_attention_same_bits_on_any_pool)
{
    static kv_state want, got;
    kv_steps(NULL, &want);
    for (int t = 1; t <= 3; t++) {
        cpu_pool *p = pool_make(t);
        kv_steps(p, &got);
        ck_assert_msg(memcmp(&got, &want, sizeof want) == 0, "kv_attention: other bits on %d threads", t);
        cpu_pool_free(p);
    }
}
END_TEST

/* A product of a few rows by a b of 2^18 floats or more splits b's
 * columns over the pool (a decode step's GEMMs): the same values as
 * without a pool, for every slice count. Bit for bit where small_gemm
 * takes the whole product and its slices (each element one chain of FMAs
 * whatever its column: N = 1024, 2 to 8 rows); elsewhere a slice may go
 * to another kernel than the whole (small_gemm takes N <= 1024 only;
 * OpenBLAS's edge columns), so within MATMUL_SPLIT_RTOL: two summation
 * orders of K = 256 products of values under 1 differ by a few units of
 * K * 2^-24. Widths of 1040 leave slices of unequal length. */
#define MATMUL_SPLIT_RTOL 2e-5

START_TEST(matmul_columns_split_on_any_pool)
{
    const int64_t K = 256, Ns[] = {1024, 1040}, Ms[] = {1, 2, 5, 8, 15};
    float *b = filled(TP_F32, K * 1040, 7), *a = filled(TP_F32, 15 * K, 8);
    float *want = malloc(sizeof(float) * 15 * 1040), *got = malloc(sizeof(float) * 15 * 1040);
    ck_assert(want && got);
    for (size_t n = 0; n < 2; n++)
        for (size_t i = 0; i < sizeof Ms / sizeof *Ms; i++) {
            int64_t M = Ms[i], N = Ns[n], as[2] = {M, K}, bs[2] = {K, N}, os[2] = {M, N};
            tp_tensor ins[2] = {tp_tensor_make(a, TP_F32, 2, as), tp_tensor_make(b, TP_F32, 2, bs)};
            tp_tensor out = tp_tensor_make(want, TP_F32, 2, os);
            run_on(NULL, TP_OP_MATMUL, NULL, ins, 2, &out);
            int exact = N <= 1024 && small_sgemm_takes(M, N, K);
            for (int t = 1; t <= 3; t++) {
                cpu_pool *p = pool_make(t);
                memset(got, 0xa5, sizeof(float) * (size_t)(M * N));
                out.data = got;
                run_on(p, TP_OP_MATMUL, NULL, ins, 2, &out);
                for (int64_t e = 0; e < M * N; e++)
                    ck_assert_msg(exact ? memcmp(&got[e], &want[e], sizeof(float)) == 0
                                        : fabsf(got[e] - want[e]) <= MATMUL_SPLIT_RTOL * (fabsf(want[e]) + 1.0f),
                                  "%lld x %lld x %lld on %d threads: c[%lld] = %.9g, without a pool %.9g",
                                  (long long)M, (long long)K, (long long)N, t, (long long)e, got[e], want[e]);
                cpu_pool_free(p);
            }
        }
    free(a), free(b), free(want), free(got);
}
END_TEST

/* Elementwise ops split their rows, or the elements of a few long rows,
 * over the pool (ops_run_rows): every element is the same code wherever
 * it lands, so the output is byte-equal to the caller alone, on pools of
 * 1 to 3, for both splits (300 rows; one coalesced row of 2^17 + 7), a
 * broadcast operand, a transposed (strided) input and FP16. The sizes are
 * over the 2^16-element threshold, so the pool really runs them. */
static void elementwise_case(tp_op op, tp_dtype dt, int ndim, const int64_t *shape, const int64_t *bshape,
                             int transposed)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    void *x = filled(dt, n, 11), *y = filled(dt, n, 12);
    size_t bytes = tp_dtype_size(dt) * (size_t)n;
    char *want = malloc(bytes), *got = malloc(bytes);
    ck_assert(want && got);
    tp_tensor ins[2] = {tp_tensor_make(x, dt, ndim, shape), tp_tensor_make(y, dt, ndim, bshape ? bshape : shape)};
    if (transposed) { /* x's memory read as its transpose: strides (1, rows) */
        ins[0].stride[0] = 1;
        ins[0].stride[1] = shape[0];
    }
    tp_tensor out = tp_tensor_make(want, dt, ndim, shape);
    int n_ins = tp_op_max_inputs(op) >= 2 ? 2 : 1;
    run_on(NULL, op, NULL, ins, n_ins, &out);
    for (int t = 1; t <= 3; t++) {
        cpu_pool *p = pool_make(t);
        memset(got, 0xa5, bytes);
        out.data = got;
        run_on(p, op, NULL, ins, n_ins, &out);
        ck_assert_msg(memcmp(got, want, bytes) == 0, "%s: other bytes on %d threads", tp_op_name(op), t);
        cpu_pool_free(p);
    }
    free(x), free(y), free(want), free(got);
}

/* An FP16/BF16 tensor widened into contiguous FP32 rows, split over a
 * pool by rows (many of them) or within rows (two long ones), and read
 * through a transposed view: every element where ops_gather_f32 alone
 * puts it, with the value tp_load_f32 reads (widening is exact). */
START_TEST(gather_same_on_any_pool)
{
    const int64_t shapes[3][2] = {{300, 700}, {2, 40000}, {700, 300}};
    for (int c = 0; c < 3; c++) {
        tp_dtype dt = c == 1 ? TP_BF16 : TP_F16;
        int64_t n = shapes[c][0] * shapes[c][1];
        uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n);
        float *want = malloc(sizeof(float) * (size_t)n), *got = malloc(sizeof(float) * (size_t)n);
        ck_assert(x && want && got);
        for (int64_t i = 0; i < n; i++)
            tp_store_f32(x, dt, i, (float)((i * 7919) % 2003) / 1001.0f - 1.0f);
        tp_tensor t = tp_tensor_make(x, dt, 2, shapes[c]);
        if (c == 2) { /* a [700, 300] view of [300, 700] storage: (i, k) at k * 700 + i */
            t.stride[0] = 1;
            t.stride[1] = 700;
        }
        ops_gather_f32(&t, want);
        for (int64_t i = 0; i < t.shape[0]; i++)
            for (int64_t k = 0; k < t.shape[1]; k++)
                ck_assert_msg(want[i * t.shape[1] + k] == tp_load_f32(x, dt, i * t.stride[0] + k * t.stride[1]),
                              "case %d: element (%lld, %lld)", c, (long long)i, (long long)k);
        for (int threads = 1; threads <= 3; threads++) {
            cpu_pool *p = pool_make(threads);
            memset(got, 0xa5, sizeof(float) * (size_t)n);
            tp_err err;
            ck_assert_int_eq(ops_gather_f32_on(p, &t, got, &err), TP_OK);
            ck_assert_msg(memcmp(got, want, sizeof(float) * (size_t)n) == 0, "case %d, %d threads: other values", c,
                          threads);
            cpu_pool_free(p);
        }
        free(x), free(want), free(got);
    }
}
END_TEST

/* cat, reshape and contiguous split copies of OPS_COPY_SPLIT_MIN_BYTES
 * or more over the pool: RoPE's cat of two half-head views of permuted q
 * ([B, H, 128, 32] each, rows 32 floats apart in [B, 128, H, 64]) into
 * [B, H, 128, 64], split on dim 0 (B 4) or, past a dim of 1, on dim 1
 * (B 1), and that permuted q made contiguous: every byte as on the caller
 * alone, on 1-3 threads. */
static void copies_case(int64_t B, int64_t H)
{
    int64_t n = B * 128 * H * 64, qs[4] = {B, H, 128, 64};
    ck_assert(n / 2 * (int64_t)sizeof(float) >= OPS_COPY_SPLIT_MIN_BYTES); /* each half is split */
    float *x = malloc(sizeof(float) * (size_t)n), *want = malloc(sizeof(float) * (size_t)n);
    float *got = malloc(sizeof(float) * (size_t)n);
    ck_assert(x && want && got);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)i;
    tp_tensor q = tp_tensor_make(x, TP_F32, 4, qs); /* [B, H, 128, 64] over [B, 128, H, 64] storage */
    q.stride[1] = 64, q.stride[2] = H * 64;
    tp_tensor halves[2] = {tp_tensor_narrow(&q, 3, 32, 32), tp_tensor_narrow(&q, 3, 0, 32)};
    tp_attrs a;
    memset(&a, 0, sizeof a);
    a.dim = 3;
    for (int op = 0; op < 2; op++) {
        tp_tensor w = tp_tensor_make(want, TP_F32, 4, qs), g = tp_tensor_make(got, TP_F32, 4, qs);
        tp_err err;
        tp_op o = op ? TP_OP_CONTIGUOUS : TP_OP_CAT;
        ck_assert_int_eq(cpu_op_run(o, &a, op ? &q : halves, op ? 1 : 2, &w, 0, 1, &err), TP_OK);
        ck_assert(want[1] == (op ? x[1] : x[33])); /* cat puts the second half first */
        for (int threads = 1; threads <= 3; threads++) {
            cpu_pool *p = pool_make(threads);
            memset(got, 0xa5, sizeof(float) * (size_t)n);
            ck_assert_msg(cpu_op_run_on(p, o, &a, op ? &q : halves, op ? 1 : 2, &g, 0, 1, &err) == TP_OK, "%s",
                          err.msg);
            ck_assert_msg(memcmp(got, want, sizeof(float) * (size_t)n) == 0, "%s, B %lld, %d threads: other bytes",
                          tp_op_name(o), (long long)B, threads);
            cpu_pool_free(p);
        }
    }
    free(x), free(want), free(got);
}

START_TEST(copies_same_on_any_pool)
{
    copies_case(4, 12);
    copies_case(1, 24);
}
END_TEST

START_TEST(elementwise_same_bits_on_any_pool)
{
    int64_t rows[2] = {300, 1024}, one[1] = {(1 << 17) + 7};
    elementwise_case(TP_OP_ADD, TP_F32, 2, rows, NULL, 0);
    elementwise_case(TP_OP_MUL, TP_F32, 2, rows, (int64_t[]){1, 1024}, 0);
    elementwise_case(TP_OP_SUB, TP_F16, 1, one, NULL, 0);
    elementwise_case(TP_OP_TANH, TP_F32, 2, rows, NULL, 0);
    elementwise_case(TP_OP_GELU, TP_F32, 1, one, NULL, 0);
    elementwise_case(TP_OP_EXP, TP_BF16, 2, rows, NULL, 0);
    elementwise_case(TP_OP_NEG, TP_F32, 2, rows, NULL, 1);
}
END_TEST

/* A product too big to split (128 rows) keeps every OpenBLAS thread the
 * rank has, with a pool or without: 55ab6bd ran every matmul through
 * cpu_pool_run, whose tasks are pinned to one thread, which halved the
 * GEMM rate of a 128-token request at world size 1 on 2 cores. */
START_TEST(unsplit_matmul_keeps_the_rank_threads)
{
    const int64_t M = 128, K = 256, N = 512;
    float *a = filled(TP_F32, M * K, 3), *b = filled(TP_F32, K * N, 4), *c = malloc(sizeof(float) * M * N);
    ck_assert(c);
    int64_t as[2] = {M, K}, bs[2] = {K, N}, os[2] = {M, N};
    tp_tensor ins[2] = {tp_tensor_make(a, TP_F32, 2, as), tp_tensor_make(b, TP_F32, 2, bs)};
    tp_tensor out = tp_tensor_make(c, TP_F32, 2, os);
    ck_assert_int_eq(tp_blas_product_threads(M, N, K, 2), 2);
    tp_blas_set_threads(2);
    cpu_pool *pools[2] = {NULL, pool_make(2)};
    for (int k = 0; k < 2; k++) {
        tp_blas_call_begin(1, 1, 1); /* OpenBLAS keeps a call's count: leave it at 1 */
        tp_blas_call_end();
        ck_assert_int_eq(openblas_get_num_threads(), 1);
        run_on(pools[k], TP_OP_MATMUL, NULL, ins, 2, &out);
        ck_assert_msg(openblas_get_num_threads() == 2, "%s pool: OpenBLAS ran the product on %d threads",
                      k ? "with a" : "without a", openblas_get_num_threads());
        cpu_pool_free(pools[k]);
    }
    tp_blas_set_threads(1);
    free(a), free(b), free(c);
}
END_TEST

static Suite *cpu_pool_suite(void)
{
    Suite *s = suite_create("cpu_pool");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, create_and_free);
    tcase_add_test(tc, scratch_kept_per_slot);
    tcase_add_test(tc, every_task_once);
    tcase_add_test(tc, workers_take_tasks);
    tcase_add_test(tc, free_stops_spinning_workers);
    tcase_add_test(tc, errors_propagate);
    tcase_add_test(tc, tasks_run_products_on_one_thread);
    tcase_add_test(tc, attention_same_bits_on_any_pool);
    tcase_add_test(tc, kv_attention_same_bits_on_any_pool);
    tcase_add_test(tc, matmul_columns_split_on_any_pool);
    tcase_add_test(tc, unsplit_matmul_keeps_the_rank_threads);
    tcase_add_test(tc, elementwise_same_bits_on_any_pool);
    tcase_add_test(tc, gather_same_on_any_pool);
    tcase_add_test(tc, copies_same_on_any_pool);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(cpu_pool_suite)
