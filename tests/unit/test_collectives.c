/* test_collectives.c — cpu collectives with d = 2, 3, 4 ranks as threads,
 * and as fibers of one thread (ranks in separate processes:
 * test_cpu_shared.c). */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "clock.h"
#include "cpu/collectives.h"
#include "fiber.h"
#include "spin_wait.h"
#include "testutil.h"

#define MAXD 4

/* ------------------------------------------------------------ helpers */

typedef struct {
    cpu_comm *c;
    int rank;
    tp_op op;
    tp_attrs attrs;
    const tp_tensor *in;
    tp_tensor *out;
    tp_status st;
    tp_err err;
} job_t;

static void *job_main(void *p)
{
    job_t *j = p;
    j->st = cpu_collective_run(j->c, j->rank, j->op, &j->attrs, j->in, j->out, &j->err);
    return NULL;
}

/* The "fibers" test case runs every rank as a fiber of the test's thread
 * (rank_group.c's serial steps) instead of a thread of its own: the
 * collectives must then yield at their barriers, and give the same bits. */
static int as_fibers;
static void fibers_on(void) { as_fibers = 1; }

typedef struct {
    void *(*fn)(void *);
    char *jobs;
    size_t job_size;
} fiber_jobs;

static void fiber_job(void *p, int r)
{
    fiber_jobs *f = p;
    f->fn(f->jobs + (size_t)r * f->job_size);
}

static void spawn_fibers(int d, void *(*fn)(void *), void *jobs, size_t job_size)
{
    tp_fibers *f;
    tp_err err;
    ck_assert_msg(tp_fibers_create(d, 0, &f, &err) == TP_OK, "%s", err.msg);
    fiber_jobs fj = {fn, jobs, job_size};
    tp_fibers_run(f, fiber_job, &fj);
    tp_fibers_free(f);
}

static void spawn(int d, void *(*fn)(void *), void *jobs, size_t job_size)
{
    if (as_fibers) {
        spawn_fibers(d, fn, jobs, job_size);
        return;
    }
    pthread_t th[MAXD];
    for (int r = 0; r < d; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, fn, (char *)jobs + (size_t)r * job_size), 0);
    for (int r = 0; r < d; r++)
        pthread_join(th[r], NULL);
}

/* Runs op on d ranks with in[r] / out[r]; statuses land in jobs. */
static void run_op(cpu_comm *c, int d, tp_op op, const tp_attrs *a, tp_tensor *in, tp_tensor *out,
                   job_t *jobs)
{
    for (int r = 0; r < d; r++) {
        memset(&jobs[r], 0, sizeof jobs[r]);
        jobs[r].c = c;
        jobs[r].rank = r;
        jobs[r].op = op;
        jobs[r].attrs = *a;
        jobs[r].in = in ? &in[r] : NULL;
        jobs[r].out = &out[r];
    }
    spawn(d, job_main, jobs, sizeof *jobs);
}

static void run_ok(cpu_comm *c, int d, tp_op op, const tp_attrs *a, tp_tensor *in, tp_tensor *out)
{
    job_t jobs[MAXD];
    run_op(c, d, op, a, in, out, jobs);
    for (int r = 0; r < d; r++)
        ck_assert_msg(jobs[r].st == TP_OK, "%s d=%d rank %d: %s: %s", tp_op_name(op), d, r,
                      tp_status_name(jobs[r].st), jobs[r].err.msg);
}

static cpu_comm *comm(int d)
{
    tp_err err;
    cpu_comm *c = cpu_comm_create(d, &err);
    ck_assert_msg(c != NULL, "%s", err.msg);
    ck_assert_int_eq(cpu_comm_world(c), d);
    return c;
}

/* A tensor of logical shape `shape`; reversed=1 lays it out with the dims
 * reversed in memory (a transposed, non-contiguous view). */
static tp_tensor mk(tp_dtype dt, int nd, const int64_t *shape, int reversed)
{
    tp_tensor t = tp_tensor_make(NULL, dt, nd, shape);
    int64_t n = tp_tensor_numel(&t);
    t.data = calloc((size_t)(n ? n : 1), tp_dtype_size(dt));
    ck_assert_ptr_nonnull(t.data);
    if (reversed) {
        int64_t s = 1;
        for (int i = 0; i < nd; i++) {
            t.stride[i] = s;
            s *= shape[i];
        }
    }
    return t;
}

static void unravel(int64_t l, int nd, const int64_t *shape, int64_t *idx)
{
    for (int i = nd - 1; i >= 0; i--) {
        idx[i] = l % shape[i];
        l /= shape[i];
    }
}

static int64_t ravel(int nd, const int64_t *shape, const int64_t *idx)
{
    int64_t l = 0;
    for (int i = 0; i < nd; i++)
        l = l * shape[i] + idx[i];
    return l;
}

static int64_t off(const tp_tensor *t, const int64_t *idx)
{
    int64_t o = 0;
    for (int i = 0; i < t->ndim; i++)
        o += idx[i] * t->stride[i];
    return o;
}

/* Value of element with logical linear index l on rank r. */
static double val(int r, int64_t l) { return r * 1000.0 + (double)l; }

static void fill(tp_tensor *t, int r)
{
    int64_t n = tp_tensor_numel(t), idx[TP_MAX_DIMS];
    for (int64_t l = 0; l < n; l++) {
        unravel(l, t->ndim, t->shape, idx);
        if (tp_dtype_is_float(t->dtype))
            tp_store_f32(t->data, t->dtype, off(t, idx), (float)val(r, l));
        else if (t->dtype == TP_I32)
            ((int32_t *)t->data)[off(t, idx)] = (int32_t)val(r, l);
        else
            ((int64_t *)t->data)[off(t, idx)] = (int64_t)val(r, l);
    }
}

static double get(const tp_tensor *t, const int64_t *idx)
{
    if (t->dtype == TP_I64)
        return (double)((int64_t *)t->data)[off(t, idx)];
    return tp_load_f32(t->data, t->dtype, off(t, idx));
}

static void free_all(tp_tensor *t, int d)
{
    for (int r = 0; r < d; r++)
        free(t[r].data);
}

/* -------------------------------------------------- copy collectives */

/* in[r] of shape ishape (optionally reversed layout), out[r] of oshape. */
static void setup(int d, tp_dtype dt, int nd, const int64_t *ishape, int reversed,
                  const int64_t *oshape, tp_tensor *in, tp_tensor *out)
{
    for (int r = 0; r < d; r++) {
        in[r] = mk(dt, nd, ishape, reversed);
        fill(&in[r], r);
        out[r] = mk(dt, nd, oshape, 0);
        memset(out[r].data, 0xcd, (size_t)tp_tensor_numel(&out[r]) * tp_dtype_size(dt));
    }
}

static void check_all_gather(int d, int nd, const int64_t *ishape, int dim, int reversed)
{
    int64_t oshape[TP_MAX_DIMS];
    memcpy(oshape, ishape, sizeof(int64_t) * (size_t)nd);
    oshape[dim] *= d;
    tp_tensor in[MAXD], out[MAXD];
    setup(d, TP_F32, nd, ishape, reversed, oshape, in, out);
    cpu_comm *c = comm(d);
    tp_attrs a = {0};
    a.dim = dim;
    run_ok(c, d, TP_OP_ALL_GATHER, &a, in, out);
    for (int q = 0; q < d; q++) {
        int64_t n = tp_tensor_numel(&out[q]), o[TP_MAX_DIMS];
        for (int64_t l = 0; l < n; l++) {
            unravel(l, nd, oshape, o);
            int r = (int)(o[dim] / ishape[dim]);
            o[dim] -= r * ishape[dim];
            double want = val(r, ravel(nd, ishape, o));
            ck_assert_msg(((float *)out[q].data)[l] == want, "all_gather d=%d dim=%d rank %d elt %lld: %g != %g",
                          d, dim, q, (long long)l, ((float *)out[q].data)[l], want);
        }
    }
    cpu_comm_free(c);
    free_all(in, d);
    free_all(out, d);
}

static void check_all_to_all(int d, int nd, const int64_t *ishape, int sd, int cd, int reversed)
{
    int64_t oshape[TP_MAX_DIMS], cshape[TP_MAX_DIMS];
    memcpy(cshape, ishape, sizeof(int64_t) * (size_t)nd);
    cshape[sd] /= d;
    memcpy(oshape, cshape, sizeof(int64_t) * (size_t)nd);
    oshape[cd] *= d;
    tp_tensor in[MAXD], out[MAXD];
    setup(d, TP_F32, nd, ishape, reversed, oshape, in, out);
    cpu_comm *c = comm(d);
    tp_attrs a = {0};
    a.split_dim = sd;
    a.concat_dim = cd;
    run_ok(c, d, TP_OP_ALL_TO_ALL, &a, in, out);
    for (int q = 0; q < d; q++) {
        int64_t n = tp_tensor_numel(&out[q]), o[TP_MAX_DIMS];
        for (int64_t l = 0; l < n; l++) {
            unravel(l, nd, oshape, o);
            int j = (int)(o[cd] / cshape[cd]); /* sender */
            o[cd] -= j * cshape[cd];
            o[sd] += q * cshape[sd];        /* chunk q of the sender */
            double want = val(j, ravel(nd, ishape, o));
            ck_assert_msg(((float *)out[q].data)[l] == want,
                          "all_to_all d=%d split=%d concat=%d rank %d elt %lld: %g != %g", d, sd, cd, q,
                          (long long)l, ((float *)out[q].data)[l], want);
        }
    }
    cpu_comm_free(c);
    free_all(in, d);
    free_all(out, d);
}

START_TEST(test_all_gather_literal)
{
    /* d=2, dim 1: [[0,1,2],[3,4,5]] and [[1000..]] side by side */
    int64_t s[2] = {2, 3}, os[2] = {2, 6};
    tp_tensor in[2], out[2];
    setup(2, TP_F32, 2, s, 0, os, in, out);
    cpu_comm *c = comm(2);
    tp_attrs a = {0};
    a.dim = 1;
    run_ok(c, 2, TP_OP_ALL_GATHER, &a, in, out);
    const float want[12] = {0, 1, 2, 1000, 1001, 1002, 3, 4, 5, 1003, 1004, 1005};
    for (int r = 0; r < 2; r++)
        ck_assert_mem_eq(out[r].data, want, sizeof want);
    cpu_comm_free(c);
    free_all(in, 2);
    free_all(out, 2);
}
END_TEST

START_TEST(test_all_gather)
{
    int64_t s[2] = {3, 5};
    for (int d = 2; d <= 4; d++)
        for (int dim = 0; dim < 2; dim++)
            check_all_gather(d, 2, s, dim, 0);
}
END_TEST

START_TEST(test_all_to_all_literal)
{
    /* d=2, split 0 concat 1: rank r gets row r of every rank side by side */
    int64_t s[2] = {2, 2}, os[2] = {1, 4};
    tp_tensor in[2], out[2];
    setup(2, TP_F32, 2, s, 0, os, in, out);
    cpu_comm *c = comm(2);
    tp_attrs a = {0};
    a.split_dim = 0;
    a.concat_dim = 1;
    run_ok(c, 2, TP_OP_ALL_TO_ALL, &a, in, out);
    const float w0[4] = {0, 1, 1000, 1001}, w1[4] = {2, 3, 1002, 1003};
    ck_assert_mem_eq(out[0].data, w0, sizeof w0);
    ck_assert_mem_eq(out[1].data, w1, sizeof w1);
    cpu_comm_free(c);
    free_all(in, 2);
    free_all(out, 2);
}
END_TEST

START_TEST(test_all_to_all)
{
    for (int d = 2; d <= 4; d++) {
        int64_t s2[2] = {12, 12}, s3[3] = {2, 3, 12};
        check_all_to_all(d, 2, s2, 0, 0, 0);
        check_all_to_all(d, 2, s2, 1, 0, 0);
        check_all_to_all(d, 2, s2, 0, 1, 0);
        check_all_to_all(d, 2, s2, 1, 1, 0);
        check_all_to_all(d, 3, s3, 2, 1, 0);
        check_all_to_all(d, 3, s3, 2, 0, 0);
        check_all_to_all(d, 3, s3, 2, 2, 0);
    }
}
END_TEST

START_TEST(test_noncontiguous_copies)
{
    /* inputs laid out transposed in memory (strides [1, rows]) */
    for (int d = 2; d <= 4; d++) {
        int64_t s2[2] = {12, 5}, s3[3] = {2, 3, 12};
        check_all_gather(d, 2, s2, 0, 1);
        check_all_gather(d, 2, s2, 1, 1);
        check_all_to_all(d, 2, s2, 0, 1, 1);
        check_all_to_all(d, 2, s2, 0, 0, 1);
        check_all_to_all(d, 3, s3, 2, 1, 1);
    }
}
END_TEST

START_TEST(test_broadcast)
{
    for (int d = 2; d <= 4; d++) {
        int64_t s[2] = {3, 4};
        tp_tensor in[MAXD], out[MAXD];
        setup(d, TP_F32, 2, s, 0, s, in, out);
        cpu_comm *c = comm(d);
        tp_attrs a = {0};
        a.src = 1;
        run_ok(c, d, TP_OP_BROADCAST, &a, in, out);
        for (int r = 0; r < d; r++)
            ck_assert_mem_eq(out[r].data, in[1].data, 12 * sizeof(float));
        ck_assert_float_eq(((float *)out[0].data)[5], 1005.0f);
        /* non-src ranks may pass no input; src may broadcast in place */
        job_t jobs[MAXD];
        for (int r = 0; r < d; r++)
            memset(out[r].data, 0, 12 * sizeof(float));
        free(out[1].data);
        out[1] = in[1]; /* in place on the src rank */
        run_op(c, d, TP_OP_BROADCAST, &a, NULL, out, jobs);
        for (int r = 0; r < d; r++) {
            ck_assert_msg(jobs[r].st == TP_INVALID, "rank %d: %s", r, jobs[r].err.msg);
            ck_assert_ptr_nonnull(strstr(jobs[r].err.msg, "broadcast"));
        }
        for (int r = 0; r < d; r++) {
            jobs[r].in = r == 1 ? &in[1] : NULL;
            jobs[r].st = TP_INTERNAL;
        }
        spawn(d, job_main, jobs, sizeof *jobs);
        for (int r = 0; r < d; r++) {
            ck_assert_msg(jobs[r].st == TP_OK, "rank %d: %s", r, jobs[r].err.msg);
            ck_assert_mem_eq(jobs[r].out->data, in[1].data, 12 * sizeof(float));
        }
        out[1] = mk(TP_F32, 2, s, 0); /* in[1] is freed below */
        cpu_comm_free(c);
        free_all(in, d);
        free_all(out, d);
    }
}
END_TEST

/* ----------------------------------------------------------- reductions */

START_TEST(test_reduce_scatter_literal)
{
    int64_t s[2] = {2, 2};
    const float a0[4] = {1, 2, 3, 4}, a1[4] = {10, 20, 30, 40};
    for (int dim = 0; dim < 2; dim++)
        for (int red = TP_REDUCE_SUM; red <= TP_REDUCE_AVG; red++) {
            int64_t os[2] = {dim == 0 ? 1 : 2, dim == 0 ? 2 : 1};
            tp_tensor in[2], out[2];
            setup(2, TP_F32, 2, s, 0, os, in, out);
            memcpy(in[0].data, a0, sizeof a0);
            memcpy(in[1].data, a1, sizeof a1);
            cpu_comm *c = comm(2);
            tp_attrs a = {0};
            a.dim = dim;
            a.reduce = (tp_reduce)red;
            run_ok(c, 2, TP_OP_REDUCE_SCATTER, &a, in, out);
            /* dim 0: rank 0 row 0, rank 1 row 1; dim 1: columns */
            float w[2][2] = {{11, 22}, {33, 44}};
            if (dim == 1) {
                w[0][1] = 33;
                w[1][0] = 22;
            }
            for (int r = 0; r < 2; r++)
                for (int i = 0; i < 2; i++) {
                    float want = red == TP_REDUCE_AVG ? w[r][i] / 2 : w[r][i];
                    ck_assert_float_eq(((float *)out[r].data)[i], want);
                }
            cpu_comm_free(c);
            free_all(in, 2);
            free_all(out, 2);
        }
}
END_TEST

static void check_reduce_scatter(int d, int dim, tp_reduce red, tp_dtype dt, int reversed)
{
    int64_t s[2] = {12, 24}, os[2] = {12, 24};
    os[dim] /= d;
    tp_tensor in[MAXD], out[MAXD];
    setup(d, dt, 2, s, reversed, os, in, out);
    cpu_comm *c = comm(d);
    tp_attrs a = {0};
    a.dim = dim;
    a.reduce = red;
    run_ok(c, d, TP_OP_REDUCE_SCATTER, &a, in, out);
    for (int q = 0; q < d; q++) {
        int64_t n = tp_tensor_numel(&out[q]), o[2];
        for (int64_t l = 0; l < n; l++) {
            unravel(l, 2, os, o);
            o[dim] += q * os[dim];
            int64_t li = ravel(2, s, o);
            /* sum_r (1000 r + li) = 1000 d(d-1)/2 + d li: exact */
            double want = 1000.0 * d * (d - 1) / 2 + (double)d * (double)li;
            if (red == TP_REDUCE_AVG)
                want = dt == TP_I64 || dt == TP_I32 ? (double)((int64_t)want / d) : want / d;
            unravel(l, 2, os, o);
            ck_assert_msg(get(&out[q], o) == want, "reduce_scatter d=%d dim=%d red=%d rank %d elt %lld: %g != %g",
                          d, dim, (int)red, q, (long long)l, get(&out[q], o), want);
        }
    }
    cpu_comm_free(c);
    free_all(in, d);
    free_all(out, d);
}

START_TEST(test_reduce_scatter)
{
    for (int d = 2; d <= 4; d++)
        for (int dim = 0; dim < 2; dim++) {
            check_reduce_scatter(d, dim, TP_REDUCE_SUM, TP_F32, 0);
            check_reduce_scatter(d, dim, TP_REDUCE_AVG, TP_F32, 0);
            check_reduce_scatter(d, dim, TP_REDUCE_SUM, TP_I64, 0);
            check_reduce_scatter(d, dim, TP_REDUCE_AVG, TP_I64, 0);
            check_reduce_scatter(d, dim, TP_REDUCE_SUM, TP_F32, 1);
            check_reduce_scatter(d, dim, TP_REDUCE_AVG, TP_F32, 1);
        }
}
END_TEST

#define NEL 64

/* f32 reference of an all_reduce over vals[r][i] (rank order, round once). */
static float ref_reduce(int d, const float *v, tp_reduce red)
{
    float acc = v[0];
    for (int r = 1; r < d; r++) {
        if (red == TP_REDUCE_MAX)
            acc = v[r] > acc ? v[r] : acc;
        else
            acc += v[r];
    }
    return red == TP_REDUCE_AVG ? acc / (float)d : acc;
}

/* Rank-dependent float inputs: element 0 is the rounding probe (1.0 on rank
 * 0, one ulp/2 of 1.0 on the others), the rest awkward mixed magnitudes. */
static float fval(tp_dtype dt, int r, int i)
{
    if (i == 0) {
        float half_ulp = dt == TP_F16 ? 0x1p-11f : dt == TP_BF16 ? 0x1p-8f : 0x1p-24f;
        return r == 0 ? 1.0f : half_ulp;
    }
    float x = (float)((r * 37 + i * 11) % 23) - 11.0f;
    return x * (i % 3 == 0 ? 1e3f : i % 3 == 1 ? 0.1f : 1e-3f) + (float)r * 0.3f;
}

static void check_all_reduce_float(int d, tp_dtype dt, tp_reduce red)
{
    int64_t s[1] = {NEL};
    tp_tensor in[MAXD], out[MAXD];
    setup(d, dt, 1, s, 0, s, in, out);
    float widened[NEL][MAXD];
    for (int r = 0; r < d; r++)
        for (int i = 0; i < NEL; i++) {
            tp_store_f32(in[r].data, dt, i, fval(dt, r, i));
            widened[i][r] = tp_load_f32(in[r].data, dt, i);
        }
    cpu_comm *c = comm(d);
    tp_attrs a = {0};
    a.reduce = red;
    run_ok(c, d, TP_OP_ALL_REDUCE, &a, in, out);
    size_t bytes = NEL * tp_dtype_size(dt);
    for (int r = 1; r < d; r++)
        ck_assert_msg(memcmp(out[0].data, out[r].data, bytes) == 0, "%s: rank %d differs from rank 0",
                      tp_dtype_name(dt), r);
    for (int i = 0; i < NEL; i++) {
        /* store the f32 reference into the dtype: rounds once */
        union { int64_t i; float f; uint16_t h; } w;
        tp_store_f32(&w, dt, 0, ref_reduce(d, widened[i], red));
        float want = tp_load_f32(&w, dt, 0), got = tp_load_f32(out[0].data, dt, i);
        ck_assert_msg(memcmp(&got, &want, 4) == 0, "all_reduce %s d=%d red=%d elt %d: %a != %a",
                      tp_dtype_name(dt), d, (int)red, i, got, want);
    }
    /* Element 0 by hand: 1 + (d-1)/2 ulp. Summed in f32 and rounded once to
     * nearest-even: d=2 ties down to 1, d=3 is exactly 1+ulp, d=4 ties up to
     * 1+2ulp. (Accumulating in FP16/BF16 would give 1 every time.) */
    if (red == TP_REDUCE_SUM && dt != TP_F32) {
        float ulp = dt == TP_F16 ? 0x1p-10f : 0x1p-7f;
        float want = d == 2 ? 1.0f : d == 3 ? 1.0f + ulp : 1.0f + 2 * ulp;
        ck_assert_float_eq(tp_load_f32(out[0].data, dt, 0), want);
    }
    if (red == TP_REDUCE_MAX)
        ck_assert_float_eq(tp_load_f32(out[0].data, dt, 0), 1.0f);
    cpu_comm_free(c);
    free_all(in, d);
    free_all(out, d);
}

START_TEST(test_all_reduce_float)
{
    tp_dtype dts[3] = {TP_F32, TP_F16, TP_BF16};
    for (int d = 2; d <= 4; d++)
        for (int k = 0; k < 3; k++)
            for (int red = TP_REDUCE_SUM; red <= TP_REDUCE_MAX; red++)
                check_all_reduce_float(d, dts[k], (tp_reduce)red);
}
END_TEST

START_TEST(test_all_reduce_half_literal)
{
    /* d=2 avg of FP16 1.0 and 2^-10: (1 + 2^-10) / 2 = 0.5 + 2^-11, one
     * FP16 ulp above 0.5: 0x3801 (a naive f16 (a/2 + b/2) would also work,
     * but 0x3800 would mean the small term was lost). */
    tp_tensor in[2], out[2];
    int64_t s[1] = {2};
    setup(2, TP_F16, 1, s, 0, s, in, out);
    uint16_t *a = in[0].data, *b = in[1].data;
    a[0] = tp_f32_to_f16(1.0f);
    b[0] = tp_f32_to_f16(0x1p-10f);
    a[1] = tp_f32_to_f16(-3.0f); /* max with a negative and an inf */
    b[1] = 0xfc00u;              /* -inf */
    cpu_comm *c = comm(2);
    tp_attrs at = {0};
    at.reduce = TP_REDUCE_AVG;
    run_ok(c, 2, TP_OP_ALL_REDUCE, &at, in, out);
    for (int r = 0; r < 2; r++) {
        ck_assert_uint_eq(((uint16_t *)out[r].data)[0], 0x3801u);
        ck_assert(isinf(tp_f16_to_f32(((uint16_t *)out[r].data)[1])));
    }
    at.reduce = TP_REDUCE_MAX;
    run_ok(c, 2, TP_OP_ALL_REDUCE, &at, in, out);
    for (int r = 0; r < 2; r++) {
        ck_assert_float_eq(tp_f16_to_f32(((uint16_t *)out[r].data)[0]), 1.0f);
        ck_assert_float_eq(tp_f16_to_f32(((uint16_t *)out[r].data)[1]), -3.0f);
    }
    cpu_comm_free(c);
    free_all(in, 2);
    free_all(out, 2);
}
END_TEST

START_TEST(test_all_reduce_int)
{
    for (int d = 2; d <= 4; d++) {
        int64_t s[1] = {4};
        tp_tensor i32[MAXD], o32[MAXD], i64[MAXD], o64[MAXD];
        setup(d, TP_I32, 1, s, 0, s, i32, o32);
        setup(d, TP_I64, 1, s, 0, s, i64, o64);
        for (int r = 0; r < d; r++) {
            int32_t *p = i32[r].data;
            int64_t *q = i64[r].data;
            p[0] = q[0] = r == 0 ? -5 : 0;       /* avg truncates toward zero */
            p[1] = q[1] = r == 0 ? 5 : 0;
            p[2] = (1 << 30) + r;                /* int32 sum would overflow */
            q[2] = ((int64_t)1 << 60) + r;       /* beyond f32/f64 precision */
            p[3] = q[3] = (r * 7) % 5 - 2;       /* max */
        }
        cpu_comm *c = comm(d);
        tp_attrs a = {0};
        int64_t tri = (int64_t)d * (d - 1) / 2;
        a.reduce = TP_REDUCE_SUM;
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i64, o64);
        a.reduce = TP_REDUCE_AVG;
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i32, o32);
        for (int r = 0; r < d; r++) {
            int64_t *q = o64[r].data;
            ck_assert_int_eq(q[0], -5);
            ck_assert_int_eq(q[1], 5);
            ck_assert_int_eq(q[2], ((int64_t)d << 60) + tri);
            int32_t *p = o32[r].data;
            ck_assert_int_eq(p[0], d == 2 ? -2 : -1);
            ck_assert_int_eq(p[1], d == 2 ? 2 : 1);
            ck_assert_int_eq(p[2], (1 << 30) + tri / d);
        }
        a.reduce = TP_REDUCE_AVG;
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i64, o64);
        a.reduce = TP_REDUCE_SUM;
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i32, o32);
        for (int r = 0; r < d; r++) {
            int64_t *q = o64[r].data;
            ck_assert_int_eq(q[0], d == 2 ? -2 : -1);
            ck_assert_int_eq(q[2], ((int64_t)1 << 60) + tri / d);
            int32_t *p = o32[r].data;
            ck_assert_int_eq(p[0], -5);
            ck_assert_int_eq(p[1], 5);
        }
        a.reduce = TP_REDUCE_MAX;
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i32, o32);
        run_ok(c, d, TP_OP_ALL_REDUCE, &a, i64, o64);
        int64_t mx = -100;
        for (int r = 0; r < d; r++)
            mx = (r * 7) % 5 - 2 > mx ? (r * 7) % 5 - 2 : mx;
        for (int r = 0; r < d; r++) {
            ck_assert_int_eq(((int32_t *)o32[r].data)[3], mx);
            ck_assert_int_eq(((int64_t *)o64[r].data)[3], mx);
            ck_assert_int_eq(((int64_t *)o64[r].data)[2], ((int64_t)1 << 60) + d - 1);
            ck_assert_int_eq(((int32_t *)o32[r].data)[0], 0);
        }
        cpu_comm_free(c);
        free_all(i32, d);
        free_all(o32, d);
        free_all(i64, d);
        free_all(o64, d);
    }
}
END_TEST

static void *ring_main(void *p)
{
    job_t *j = p;
    j->st = cpu_ring_all_reduce(j->c, j->rank, &j->attrs, j->in, j->out, &j->err);
    return NULL;
}

/* The ring all_reduce in FP16/BF16 (collectives.c combines its chunks
 * eight elements at a time): against a simulation of its steps element by
 * element in dtype.h's conversions (each step widens both partials, adds
 * or takes the max, rounds once), bit for bit, on every rank; 1000
 * elements, so chunks of n/d end in a scalar tail. */
START_TEST(test_ring_all_reduce_narrow)
{
    enum { N = 1000 };
    tp_dtype dts[2] = {TP_F16, TP_BF16};
    tp_reduce reds[3] = {TP_REDUCE_SUM, TP_REDUCE_AVG, TP_REDUCE_MAX};
    for (int d = 2; d <= 4; d++)
        for (int k = 0; k < 2; k++)
            for (int q = 0; q < 3; q++) {
                tp_dtype dt = dts[k];
                int64_t sh[1] = {N};
                tp_tensor in[MAXD], out[MAXD];
                setup(d, dt, 1, sh, 0, sh, in, out);
                static uint16_t sim[MAXD][N];
                for (int r = 0; r < d; r++)
                    for (int i = 0; i < N; i++) {
                        tp_store_f32(in[r].data, dt, i, fval(dt, r, i));
                        sim[r][i] = ((uint16_t *)in[r].data)[i];
                    }
                cpu_comm *c = comm(d);
                tp_attrs a = {0};
                a.reduce = reds[q];
                job_t jobs[MAXD];
                for (int r = 0; r < d; r++)
                    jobs[r] = (job_t){.c = c, .rank = r, .op = TP_OP_ALL_REDUCE, .attrs = a, .in = &in[r],
                                      .out = &out[r]};
                spawn(d, ring_main, jobs, sizeof jobs[0]);
                for (int r = 0; r < d; r++)
                    ck_assert_msg(jobs[r].st == TP_OK, "ring rank %d: %s", r, jobs[r].err.msg);
                /* step s: rank r folds its left neighbour's chunk (r-1-s) into its own */
                for (int st = 0; st < d - 1; st++) {
                    uint16_t prev[MAXD][N];
                    memcpy(prev, sim, sizeof prev);
                    for (int r = 0; r < d; r++) {
                        int left = (r + d - 1) % d, ch = ((r - 1 - st) % d + d) % d;
                        for (int i = ch * N / d; i < (ch + 1) * N / d; i++) {
                            float x = tp_load_f32(prev[r], dt, i), y = tp_load_f32(prev[left], dt, i);
                            float v = reds[q] == TP_REDUCE_MAX ? (x >= y || isnan(x) ? x : y) : x + y;
                            tp_store_f32(sim[r], dt, i, v);
                        }
                    }
                }
                for (int ch = 0; ch < d; ch++) {
                    int owner = (ch + d - 1) % d; /* rank r finishes chunk (r + 1) % d */
                    for (int i = ch * N / d; i < (ch + 1) * N / d; i++) {
                        uint16_t want = sim[owner][i];
                        if (reds[q] == TP_REDUCE_AVG) {
                            float sum = dt == TP_F16 ? tp_f16_to_f32(want) : tp_bf16_to_f32(want);
                            want = dt == TP_F16 ? tp_f32_to_f16(sum / (float)d) : tp_f32_to_bf16(sum / (float)d);
                        }
                        for (int r = 0; r < d; r++)
                            if (((uint16_t *)out[r].data)[i] != want)
                                ck_assert_msg(0, "ring %s d=%d red=%d rank %d elt %d: 0x%04x, simulated 0x%04x",
                                              tp_dtype_name(dt), d, (int)reds[q], r, i,
                                              ((uint16_t *)out[r].data)[i], want);
                    }
                }
                cpu_comm_free(c);
                free_all(in, d);
                free_all(out, d);
            }
}
END_TEST

START_TEST(test_all_reduce_noncontiguous)
{
    /* transposed views (strides [1, 5]) of a [7, 5] buffer, every dtype */
    tp_dtype dts[5] = {TP_F32, TP_F16, TP_BF16, TP_I32, TP_I64};
    for (int d = 2; d <= 4; d++)
        for (int k = 0; k < 5; k++) {
            int64_t s[2] = {5, 7};
            tp_tensor in[MAXD], out[MAXD];
            setup(d, dts[k], 2, s, 1, s, in, out);
            ck_assert(!tp_tensor_is_contiguous(&in[0]));
            cpu_comm *c = comm(d);
            tp_attrs a = {0};
            a.reduce = TP_REDUCE_SUM;
            run_ok(c, d, TP_OP_ALL_REDUCE, &a, in, out);
            for (int r = 0; r < d; r++) {
                ck_assert_mem_eq(out[r].data, out[0].data, 35 * tp_dtype_size(dts[k]));
                int64_t o[2];
                for (int64_t l = 0; l < 35; l++) {
                    unravel(l, 2, s, o);
                    float sum = 0; /* of the stored (already rounded) inputs */
                    for (int q = 0; q < d; q++)
                        sum += (float)get(&in[q], o);
                    union { int64_t i; float f; uint16_t h; } w;
                    tp_store_f32(&w, dts[k], 0, sum); /* FP16/BF16 round 1000s */
                    double want = tp_load_f32(&w, dts[k], 0);
                    if (dts[k] == TP_I32 || dts[k] == TP_I64)
                        want = sum;
                    ck_assert_msg(get(&out[r], o) == want, "%s d=%d elt %lld: %g != %g",
                                  tp_dtype_name(dts[k]), d, (long long)l, get(&out[r], o), want);
                }
            }
            cpu_comm_free(c);
            free_all(in, d);
            free_all(out, d);
        }
}
END_TEST

START_TEST(test_bit_identical)
{
    /* values whose f32 sum depends on the order: every rank must agree */
    for (int d = 2; d <= 4; d++) {
        int64_t s[1] = {1000};
        tp_tensor in[MAXD], out[MAXD];
        setup(d, TP_F32, 1, s, 0, s, in, out);
        unsigned seed = 12345u;
        for (int r = 0; r < d; r++)
            for (int i = 0; i < 1000; i++) {
                seed = seed * 1103515245u + 12345u;
                float m = (float)((seed >> 8) & 0xffff) / 65536.0f - 0.5f;
                ((float *)in[r].data)[i] = ldexpf(m, (int)((seed >> 24) % 40) - 20);
            }
        cpu_comm *c = comm(d);
        tp_attrs a = {0};
        for (int red = TP_REDUCE_SUM; red <= TP_REDUCE_AVG; red++) {
            a.reduce = (tp_reduce)red;
            run_ok(c, d, TP_OP_ALL_REDUCE, &a, in, out);
            for (int r = 1; r < d; r++)
                ck_assert_mem_eq(out[r].data, out[0].data, 1000 * sizeof(float));
            for (int i = 0; i < 1000; i++) {
                float v[MAXD];
                for (int r = 0; r < d; r++)
                    v[r] = ((float *)in[r].data)[i];
                float want = ref_reduce(d, v, (tp_reduce)red), got = ((float *)out[0].data)[i];
                ck_assert_mem_eq(&got, &want, 4);
            }
        }
        cpu_comm_free(c);
        free_all(in, d);
        free_all(out, d);
    }
}
END_TEST

/* --------------------------------------------------------- validation */

START_TEST(test_invalid)
{
    for (int d = 2; d <= 4; d++) {
        cpu_comm *c = comm(d);
        job_t jobs[MAXD];
        tp_attrs a = {0};
        /* reduce_scatter of a dim not divisible by d (5) */
        int64_t s[2] = {5, 4}, os[2] = {1, 4};
        tp_tensor in[MAXD], out[MAXD];
        setup(d, TP_F32, 2, s, 0, os, in, out);
        a.dim = 0;
        run_op(c, d, TP_OP_REDUCE_SCATTER, &a, in, out, jobs);
        for (int r = 0; r < d; r++) {
            ck_assert_int_eq(jobs[r].st, TP_INVALID);
            ck_assert_msg(strstr(jobs[r].err.msg, "reduce_scatter") && strstr(jobs[r].err.msg, "dim 0") &&
                              strstr(jobs[r].err.msg, "5"),
                          "%s", jobs[r].err.msg);
        }
        /* all_gather with a wrong output shape on the last rank only: every
         * rank reports it (same verdict everywhere, nobody hangs) */
        free_all(out, d);
        for (int r = 0; r < d; r++) {
            int64_t g[2] = {5 * d + (r == d - 1), 4};
            out[r] = mk(TP_F32, 2, g, 0);
        }
        run_op(c, d, TP_OP_ALL_GATHER, &a, in, out, jobs);
        for (int r = 0; r < d; r++) {
            ck_assert_int_eq(jobs[r].st, TP_INVALID);
            ck_assert_msg(strstr(jobs[r].err.msg, "all_gather") && strstr(jobs[r].err.msg, "expected"),
                          "%s", jobs[r].err.msg);
        }
        /* dim out of range, ranks disagreeing on attrs */
        a.dim = 2;
        run_op(c, d, TP_OP_ALL_GATHER, &a, in, out, jobs);
        for (int r = 0; r < d; r++)
            ck_assert_msg(jobs[r].st == TP_INVALID && strstr(jobs[r].err.msg, "dim 2"), "%s",
                          jobs[r].err.msg);
        for (int r = 0; r < d; r++) {
            jobs[r].attrs.dim = r == 1;
            jobs[r].st = TP_OK;
        }
        spawn(d, job_main, jobs, sizeof *jobs);
        for (int r = 0; r < d; r++)
            ck_assert_msg(jobs[r].st == TP_INVALID && strstr(jobs[r].err.msg, "attrs differ"), "%s",
                          jobs[r].err.msg);
        /* the comm is still usable afterwards */
        free_all(out, d);
        for (int r = 0; r < d; r++) {
            int64_t g[2] = {5 * d, 4};
            out[r] = mk(TP_F32, 2, g, 0);
        }
        a.dim = 0;
        run_ok(c, d, TP_OP_ALL_GATHER, &a, in, out);
        ck_assert_float_eq(((float *)out[d - 1].data)[5 * 4], 1000.0f);
        /* bad rank, bad world */
        tp_err err;
        ck_assert_int_eq(cpu_collective_run(c, d, TP_OP_ALL_GATHER, &a, &in[0], &out[0], &err), TP_INVALID);
        ck_assert_ptr_null(cpu_comm_create(0, &err));
        cpu_comm_free(c);
        free_all(in, d);
        free_all(out, d);
    }
}
END_TEST

/* ------------------------------------------------------ abort and reuse */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

typedef struct {
    job_t j;
    int aborter;
    int use_barrier;
    tp_status again;
} abort_job;

static void *abort_main(void *p)
{
    abort_job *a = p;
    if (a->aborter) {
        sleep_ms(50); /* let the peers block first */
        cpu_comm_abort(a->j.c);
        a->j.st = TP_BACKEND;
    } else if (a->use_barrier) {
        a->j.st = cpu_comm_barrier(a->j.c, a->j.rank, &a->j.err);
    } else {
        a->j.st = cpu_collective_run(a->j.c, a->j.rank, a->j.op, &a->j.attrs, a->j.in, a->j.out, &a->j.err);
    }
    /* every later collective fails until reset, without blocking */
    tp_err e;
    a->again = cpu_collective_run(a->j.c, a->j.rank, a->j.op, &a->j.attrs, a->j.in, a->j.out, &e);
    return NULL;
}

START_TEST(test_abort)
{
    for (int d = 2; d <= 4; d++)
        for (int use_barrier = 0; use_barrier < 2; use_barrier++) {
            int64_t s[1] = {8};
            tp_tensor in[MAXD], out[MAXD];
            setup(d, TP_F32, 1, s, 0, s, in, out);
            cpu_comm *c = comm(d);
            abort_job jobs[MAXD];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < d; r++) {
                jobs[r].j.c = c;
                jobs[r].j.rank = r;
                jobs[r].j.op = TP_OP_ALL_REDUCE;
                jobs[r].j.in = &in[r];
                jobs[r].j.out = &out[r];
                jobs[r].aborter = r == d - 1;
                jobs[r].use_barrier = use_barrier;
            }
            spawn(d, abort_main, jobs, sizeof *jobs);
            for (int r = 0; r < d; r++) {
                ck_assert_int_eq(jobs[r].j.st, TP_BACKEND);
                if (r != d - 1)
                    ck_assert_str_eq(jobs[r].j.err.msg, "collective aborted: a peer rank failed");
                ck_assert_int_eq(jobs[r].again, TP_BACKEND);
            }
            /* after reset the same comm works again */
            cpu_comm_reset(c);
            tp_attrs a = {0};
            run_ok(c, d, TP_OP_ALL_REDUCE, &a, in, out);
            for (int r = 0; r < d; r++)
                ck_assert_float_eq(((float *)out[r].data)[3], (float)(3 * d + 1000 * d * (d - 1) / 2));
            cpu_comm_free(c);
            free_all(in, d);
            free_all(out, d);
        }
}
END_TEST

/* cpu_comm_lost: every wait fails, the exit barrier too (a dead peer never
 * arrives there), and reset does not clear it. Rank d-1 is the "dead" one:
 * it publishes in the exchange and never releases. */
typedef struct {
    cpu_comm *c;
    int rank;
    tp_tensor mine;
    atomic_int stage;
    tp_status ex, rel;
    tp_err err;
    float peer0; /* peer 0's first element, read through cpu_comm_peer */
} lost_job;

static void *lost_main(void *p)
{
    lost_job *j = p;
    j->ex = cpu_comm_exchange(j->c, j->rank, &j->mine, &j->err);
    if (j->ex != TP_OK)
        return NULL;
    tp_tensor peer = cpu_comm_peer(j->c, 0);
    j->peer0 = ((float *)peer.data)[0];
    int d = cpu_comm_world(j->c);
    if (j->rank == d - 1)
        return NULL; /* "dies" before the release */
    atomic_store(&j->stage, 1);
    j->rel = cpu_comm_release(j->c, j->rank, &j->err);
    atomic_store(&j->stage, 2);
    return NULL;
}

START_TEST(test_lost)
{
    for (int d = 2; d <= 4; d++) {
        cpu_comm *c = comm(d);
        lost_job jobs[MAXD];
        float data[MAXD][4];
        int64_t s[1] = {4};
        memset(jobs, 0, sizeof jobs);
        pthread_t th[MAXD];
        for (int r = 0; r < d; r++) {
            data[r][0] = (float)r + 0.5f;
            jobs[r].c = c;
            jobs[r].rank = r;
            jobs[r].mine = tp_tensor_make(data[r], TP_F32, 1, s);
            ck_assert_int_eq(pthread_create(&th[r], NULL, lost_main, &jobs[r]), 0);
        }
        pthread_join(th[d - 1], NULL);
        for (int r = 0; r < d - 1; r++) /* everyone is in (or entering) the release */
            while (atomic_load(&jobs[r].stage) < 1)
                sleep_ms(1);
        cpu_comm_abort(c);
        sleep_ms(50);
        for (int r = 0; r < d - 1; r++) /* abort does not end the exit barrier */
            ck_assert_int_eq(atomic_load(&jobs[r].stage), 1);
        cpu_comm_lost(c);
        for (int r = 0; r < d - 1; r++) {
            pthread_join(th[r], NULL);
            ck_assert_int_eq(jobs[r].ex, TP_OK);
            ck_assert_float_eq(jobs[r].peer0, 0.5f);
            ck_assert_int_eq(jobs[r].rel, TP_BACKEND);
            ck_assert_str_eq(jobs[r].err.msg, "collective failed: a peer rank's process is gone");
        }
        /* permanent: reset clears the abort only; nothing blocks */
        cpu_comm_reset(c);
        tp_err err;
        for (int r = 0; r < d; r++) {
            ck_assert_int_eq(cpu_comm_barrier(c, r, &err), TP_BACKEND);
            ck_assert_ptr_nonnull(strstr(err.msg, "process is gone"));
            tp_attrs a = {0};
            ck_assert_int_eq(cpu_collective_run(c, r, TP_OP_ALL_REDUCE, &a, &jobs[r].mine, &jobs[r].mine, &err),
                             TP_BACKEND);
        }
        cpu_comm_free(c);
    }
}
END_TEST

/* An abort racing with ranks arriving at a collective: either every rank
 * passes the entry barrier or none does (a rank passing alone would wait
 * in the exit barrier for peers that already left: a hang). */
typedef struct {
    job_t j;
    atomic_int *go;
    int spin; /* aborter: iterations before aborting */
} race_job;

static void *race_main(void *p)
{
    race_job *r = p;
    while (!atomic_load(r->go))
        ;
    if (r->j.rank < 0) {
        for (volatile int i = 0; i < r->spin; i++)
            ;
        cpu_comm_abort(r->j.c);
        return NULL;
    }
    r->j.st = cpu_collective_run(r->j.c, r->j.rank, r->j.op, &r->j.attrs, r->j.in, r->j.out, &r->j.err);
    return NULL;
}

START_TEST(test_abort_race)
{
    for (int d = 2; d <= 4; d++) {
        int64_t s[1] = {8};
        tp_tensor in[MAXD], out[MAXD];
        setup(d, TP_F32, 1, s, 0, s, in, out);
        cpu_comm *c = comm(d);
        int mixed = 0, passed = 0, failed = 0;
        unsigned seed = 99;
        /* at least 300 rounds, and more (a loaded machine may schedule the
         * aborter late every time) until the abort has landed at least once */
        for (int round = 0; round < 300 || (failed == 0 && round < 20000); round++) {
            race_job jobs[MAXD + 1];
            atomic_int go = 0;
            pthread_t th[MAXD + 1];
            memset(jobs, 0, sizeof jobs);
            seed = seed * 1103515245u + 12345u;
            for (int r = 0; r <= d; r++) {
                jobs[r].j.c = c;
                jobs[r].j.rank = r < d ? r : -1;
                jobs[r].j.op = TP_OP_ALL_REDUCE;
                jobs[r].j.in = &in[r < d ? r : 0];
                jobs[r].j.out = &out[r < d ? r : 0];
                jobs[r].go = &go;
                jobs[r].spin = round % 3 ? (int)((seed >> 8) % 20000) : 0;
                ck_assert_int_eq(pthread_create(&th[r], NULL, race_main, &jobs[r]), 0);
            }
            atomic_store(&go, 1);
            for (int r = 0; r <= d; r++)
                pthread_join(th[r], NULL);
            int ok = 0;
            for (int r = 0; r < d; r++)
                ok += jobs[r].j.st == TP_OK;
            mixed += ok != 0 && ok != d;
            passed += ok == d;
            failed += ok == 0;
            cpu_comm_reset(c);
        }
        ck_assert_msg(mixed == 0, "d=%d: %d rounds where some ranks passed and some failed", d, mixed);
        ck_assert_int_gt(failed, 0); /* the abort did land sometimes */
        (void)passed;
        cpu_comm_free(c);
        free_all(in, d);
        free_all(out, d);
    }
}
END_TEST

#define ITERS 1000

typedef struct {
    cpu_comm *c;
    int rank, d;
    int bad;
    tp_err err;
} stress_job;

static atomic_int arrivals;

/* Any failure aborts the comm at once, so the peers leave their barrier
 * with TP_BACKEND instead of waiting for this rank. */
static void *stress_fail(stress_job *s)
{
    s->bad = 1;
    cpu_comm_abort(s->c);
    return NULL;
}

static void *stress_main(void *p)
{
    stress_job *s = p;
    int d = s->d, r = s->rank;
    float in[8], out[8], gat[8 * MAXD];
    int64_t sh[1] = {8}, gs[1] = {8 * (int64_t)d};
    tp_tensor ti = tp_tensor_make(in, TP_F32, 1, sh), to = tp_tensor_make(out, TP_F32, 1, sh);
    tp_tensor tg = tp_tensor_make(gat, TP_F32, 1, gs);
    tp_attrs a = {0};
    for (int it = 0; it < ITERS; it++) {
        /* rewrite the input right after the previous collective returned:
         * a peer still reading it would see the wrong iteration */
        for (int i = 0; i < 8; i++)
            in[i] = (float)(it * 8 + i) + (float)r * 0.25f;
        if (cpu_collective_run(s->c, r, TP_OP_ALL_REDUCE, &a, &ti, &to, &s->err) != TP_OK)
            return stress_fail(s);
        for (int i = 0; i < 8; i++) {
            float want = 0;
            for (int q = 0; q < d; q++) {
                float x = (float)(it * 8 + i) + (float)q * 0.25f;
                want = q ? want + x : x;
            }
            if (out[i] != want) {
                snprintf(s->err.msg, sizeof s->err.msg, "iter %d rank %d elt %d: %g != %g", it, r, i,
                         out[i], want);
                return stress_fail(s);
            }
        }
        if (it % 2) {
            a.dim = 0;
            if (cpu_collective_run(s->c, r, TP_OP_ALL_GATHER, &a, &ti, &tg, &s->err) != TP_OK)
                return stress_fail(s);
            for (int q = 0; q < d; q++)
                if (gat[q * 8 + 7] != (float)(it * 8 + 7) + (float)q * 0.25f) {
                    snprintf(s->err.msg, sizeof s->err.msg, "gather iter %d rank %d from %d", it, r, q);
                    return stress_fail(s);
                }
        }
        /* plain barrier: every rank has counted this iteration before any
         * rank leaves it, and nobody can count the next one before this
         * rank joins the next all_reduce */
        atomic_fetch_add(&arrivals, 1);
        if (cpu_comm_barrier(s->c, r, &s->err) != TP_OK)
            return stress_fail(s);
        int n = atomic_load(&arrivals);
        if (n != (it + 1) * d) {
            snprintf(s->err.msg, sizeof s->err.msg, "barrier iter %d: %d arrivals", it, n);
            return stress_fail(s);
        }
    }
    return NULL;
}

START_TEST(test_reuse_many)
{
    for (int d = 2; d <= 4; d++) {
        cpu_comm *c = comm(d);
        stress_job jobs[MAXD];
        memset(jobs, 0, sizeof jobs);
        atomic_store(&arrivals, 0);
        for (int r = 0; r < d; r++) {
            jobs[r].c = c;
            jobs[r].rank = r;
            jobs[r].d = d;
        }
        spawn(d, stress_main, jobs, sizeof *jobs);
        for (int r = 0; r < d; r++) /* report the root cause first */
            ck_assert_msg(!jobs[r].bad || strstr(jobs[r].err.msg, "aborted"), "d=%d rank %d: %s", d, r,
                          jobs[r].err.msg);
        for (int r = 0; r < d; r++)
            ck_assert_msg(!jobs[r].bad, "d=%d rank %d: %s", d, r, jobs[r].err.msg);
        ck_assert_int_eq(atomic_load(&arrivals), ITERS * d);
        cpu_comm_free(c);
    }
}
END_TEST

/* A rank waiting in a barrier spins for the comm's budget (the thread
 * stays runnable), or sleeps at once with none; either way the peer's
 * arrival, an abort or a lost process ends the wait, a spin at once rather
 * than when its budget runs out. */
typedef struct {
    cpu_comm *c;
    int abortable; /* the entry barrier of an exchange, else a release */
    _Atomic int tid;
    tp_status st;
    tp_err err;
} waiter;

static void *wait_main(void *p)
{
    waiter *w = p;
    atomic_store(&w->tid, gettid());
    w->st = w->abortable ? cpu_comm_barrier(w->c, 0, &w->err) : cpu_comm_release(w->c, 0, &w->err);
    return NULL;
}

/* end: 0 rank 1 arrives, 1 abort, 2 lost. */
static void wait_then(int64_t spin_ns, char state, int abortable, int end)
{
    cpu_comm *c = comm(2);
    cpu_comm_set_spin(c, spin_ns);
    waiter w = {.c = c, .abortable = abortable};
    pthread_t th;
    ck_assert_int_eq(pthread_create(&th, NULL, wait_main, &w), 0);
    while (!atomic_load(&w.tid))
        sleep_ms(1);
    if (state == 'S')
        ck_assert_msg(tu_thread_reaches(atomic_load(&w.tid), 'S', 5000), "the waiter spins");
    else
        ck_assert_msg(tu_thread_stays(atomic_load(&w.tid), 'R', 100), "the waiter does not spin");
    int64_t t0 = tp_now_ns();
    tp_err err;
    if (end == 0)
        ck_assert_int_eq(abortable ? cpu_comm_barrier(c, 1, &err) : cpu_comm_release(c, 1, &err), TP_OK);
    else if (end == 1)
        cpu_comm_abort(c);
    else
        cpu_comm_lost(c);
    if (end == 1 && !abortable) { /* a release outlives an abort: the peer still ends it */
        sleep_ms(20);
        ck_assert_int_eq(cpu_comm_release(c, 1, &err), TP_OK);
    }
    pthread_join(th, NULL);
    ck_assert_int_lt(tp_now_ns() - t0, 5000000000LL); /* the spin budget is 60 s */
    if (end == 0 || (end == 1 && !abortable))
        ck_assert_msg(w.st == TP_OK, "%s", w.err.msg);
    else
        ck_assert_str_eq(w.err.msg, end == 1 ? "collective aborted: a peer rank failed"
                                             : "collective failed: a peer rank's process is gone");
    cpu_comm_free(c);
}

START_TEST(test_spin_then_sleep)
{
    int64_t long_spin = 60 * 1000000000LL;
    for (int abortable = 0; abortable < 2; abortable++)
        for (int end = 0; end < 3; end++) {
            wait_then(long_spin, 'R', abortable, end);
            wait_then(0, 'S', abortable, end);
        }
}
END_TEST

/* A rank that returns while its peer waits at a barrier: in threads a
 * hang; as fibers the waiter sees that the peer will never arrive. */
static void *barrier_main(void *p)
{
    job_t *j = p;
    if (j->rank == 0)
        j->st = cpu_comm_barrier(j->c, 0, &j->err);
    return NULL;
}

START_TEST(test_fiber_ranks_disagree)
{
    cpu_comm *c = comm(2);
    job_t jobs[2] = {{.c = c, .rank = 0}, {.c = c, .rank = 1}};
    spawn(2, barrier_main, jobs, sizeof *jobs);
    ck_assert_int_eq(jobs[0].st, TP_INTERNAL);
    ck_assert_msg(strstr(jobs[0].err.msg, "disagree on the step's collectives"), "%s", jobs[0].err.msg);
    cpu_comm_free(c);
}
END_TEST

static Suite *collectives_suite(void)
{
    Suite *s = suite_create("collectives");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60); /* a hang fails instead of blocking the suite */
    tcase_add_test(tc, test_all_gather_literal);
    tcase_add_test(tc, test_all_gather);
    tcase_add_test(tc, test_all_to_all_literal);
    tcase_add_test(tc, test_all_to_all);
    tcase_add_test(tc, test_noncontiguous_copies);
    tcase_add_test(tc, test_broadcast);
    tcase_add_test(tc, test_reduce_scatter_literal);
    tcase_add_test(tc, test_reduce_scatter);
    tcase_add_test(tc, test_all_reduce_float);
    tcase_add_test(tc, test_all_reduce_half_literal);
    tcase_add_test(tc, test_ring_all_reduce_narrow);
    tcase_add_test(tc, test_all_reduce_int);
    tcase_add_test(tc, test_all_reduce_noncontiguous);
    tcase_add_test(tc, test_bit_identical);
    tcase_add_test(tc, test_invalid);
    tcase_add_test(tc, test_abort);
    tcase_add_test(tc, test_lost);
    tcase_add_test(tc, test_abort_race);
    tcase_add_test(tc, test_reuse_many);
    tcase_add_test(tc, test_spin_then_sleep);
    suite_add_tcase(s, tc);
    /* the same results with the ranks as fibers of one thread */
    TCase *fc = tcase_create("fibers");
    tcase_set_timeout(fc, 60);
    tcase_add_checked_fixture(fc, fibers_on, NULL);
    tcase_add_test(fc, test_all_gather_literal);
    tcase_add_test(fc, test_all_gather);
    tcase_add_test(fc, test_all_to_all);
    tcase_add_test(fc, test_broadcast);
    tcase_add_test(fc, test_reduce_scatter);
    tcase_add_test(fc, test_all_reduce_float);
    tcase_add_test(fc, test_all_reduce_int);
    tcase_add_test(fc, test_all_reduce_noncontiguous);
    tcase_add_test(fc, test_bit_identical);
    tcase_add_test(fc, test_invalid);
    tcase_add_test(fc, test_fiber_ranks_disagree);
    suite_add_tcase(s, fc);
    return s;
}

TP_CHECK_MAIN(collectives_suite)
