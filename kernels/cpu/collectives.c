/* collectives.c — collectives of the cpu backend (ranks are threads).
 *
 * Protocol of one collective, per rank:
 *   1. publish {in, out, op, attrs} in slot[rank];
 *   2. entry barrier (abortable): after it every slot is visible;
 *   3. validate every rank's slot (every rank runs the same checks on the
 *      same data, so all ranks agree on the verdict), then compute this
 *      rank's out by reading peers' inputs in place (strided sub-views);
 *   4. exit barrier: nobody returns (and reuses or frees its input, or
 *      rewrites its slot) while a peer may still be reading it.
 *
 * The exit barrier ignores cpu_comm_abort on purpose: every rank that passed
 * the entry barrier reaches it (there is no failure path between the two
 * barriers), and leaving early would let a rank free an input that a peer is
 * still reading. Either every rank passes the entry barrier or none does,
 * because the generation only advances once all ranks have arrived.
 *
 * Arithmetic of the reductions (identical on every rank, so all_reduce
 * results are bit-identical across ranks):
 *   - float dtypes (F32, FP16, BF16): each element is widened to f32 and
 *     accumulated in f32 in rank order 0..d-1 (starting from rank 0's value,
 *     so -0.0 survives a one-rank sum), avg divides the f32 sum by d, and the
 *     result is rounded to the output dtype once. max propagates NaN.
 *   - INT32/INT64: accumulated in 64-bit two's complement (an INT64 sum that
 *     overflows wraps instead of being undefined; an INT32 result outside the
 *     int32 range wraps when stored). avg is the 64-bit sum divided by d with
 *     C integer division, i.e. truncated toward zero (-5 avg over 2 ranks is
 *     -2, not -3).
 *
 * out must not alias any rank's in (peers read in while out is written); the
 * one exception handled is broadcast writing in place on the src rank. */
#include "cpu/collectives.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define CPU_COMM_MAX_WORLD 4096
#define RED_CHUNK 256

typedef struct {
    const tp_tensor *in;
    const tp_tensor *out;
    tp_op op;
    int has_attrs;
    int dim, split_dim, concat_dim, src;
    tp_reduce reduce;
} cpu_slot;

struct cpu_comm {
    int world;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int arrived;
    uint64_t gen;
    int aborted;
    cpu_slot *slot;
};

static const char ABORT_MSG[] = "collective aborted: a peer rank failed";

cpu_comm *cpu_comm_create(int world, tp_err *err)
{
    if (world < 1 || world > CPU_COMM_MAX_WORLD) {
        tp_fail(err, TP_INVALID, "cpu_comm: world size %d out of range [1, %d]", world,
                CPU_COMM_MAX_WORLD);
        return NULL;
    }
    cpu_comm *c = calloc(1, sizeof *c);
    if (!c) {
        tp_fail(err, TP_NOMEM, "cpu_comm: out of memory");
        return NULL;
    }
    c->slot = calloc((size_t)world, sizeof *c->slot);
    if (!c->slot) {
        free(c);
        tp_fail(err, TP_NOMEM, "cpu_comm: out of memory for %d slots", world);
        return NULL;
    }
    if (pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->slot);
        free(c);
        tp_fail(err, TP_BACKEND, "cpu_comm: pthread_mutex_init failed");
        return NULL;
    }
    if (pthread_cond_init(&c->cv, NULL) != 0) {
        pthread_mutex_destroy(&c->mu);
        free(c->slot);
        free(c);
        tp_fail(err, TP_BACKEND, "cpu_comm: pthread_cond_init failed");
        return NULL;
    }
    c->world = world;
    return c;
}

void cpu_comm_free(cpu_comm *c)
{
    if (!c)
        return;
    pthread_cond_destroy(&c->cv);
    pthread_mutex_destroy(&c->mu);
    free(c->slot);
    free(c);
}

int cpu_comm_world(const cpu_comm *c) { return c ? c->world : 0; }

void cpu_comm_abort(cpu_comm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->aborted = 1;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void cpu_comm_reset(cpu_comm *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->aborted = 0;
    c->arrived = 0; /* ranks that left an aborted barrier are not waiting */
    pthread_mutex_unlock(&c->mu);
}

/* abortable=1: fails (without counting this rank) once aborted, and wakes
 * with an error if aborted before the generation completes.
 * abortable=0: waits for the generation regardless of the aborted flag. */
static tp_status barrier_wait(cpu_comm *c, int abortable, tp_err *err)
{
    pthread_mutex_lock(&c->mu);
    if (abortable && c->aborted) {
        pthread_mutex_unlock(&c->mu);
        return tp_fail(err, TP_BACKEND, "%s", ABORT_MSG);
    }
    uint64_t g = c->gen;
    if (++c->arrived == c->world) {
        c->arrived = 0;
        c->gen++;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        return TP_OK;
    }
    while (c->gen == g && !(abortable && c->aborted))
        pthread_cond_wait(&c->cv, &c->mu);
    int passed = c->gen != g; /* completed even if an abort came after */
    pthread_mutex_unlock(&c->mu);
    return passed ? TP_OK : tp_fail(err, TP_BACKEND, "%s", ABORT_MSG);
}

tp_status cpu_comm_barrier(cpu_comm *c, int rank, tp_err *err)
{
    if (!c)
        return tp_fail(err, TP_INVALID, "cpu_comm_barrier: no communicator");
    if (rank < 0 || rank >= c->world)
        return tp_fail(err, TP_INVALID, "cpu_comm_barrier: rank %d out of range for world size %d",
                       rank, c->world);
    return barrier_wait(c, 1, err);
}

/* ---------------------------------------------------------------- views */

/* ------------------------------------------------------------ validation */

static int same_shape(const tp_tensor *a, const tp_tensor *b)
{
    if (a->ndim != b->ndim)
        return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i])
            return 0;
    return 1;
}

static const char *shp(char *buf, const tp_tensor *t) { return tp_shape_str(buf, 96, t->ndim, t->shape); }

static tp_status check_dim(const char *name, const char *what, int dim, const tp_tensor *in, tp_err *err)
{
    char b[96];
    if (dim < 0 || dim >= in->ndim)
        return tp_fail(err, TP_INVALID, "%s: %s %d out of range for input of shape %s", name, what,
                       dim, shp(b, in));
    return TP_OK;
}

static tp_status check_divisible(const char *name, const char *what, int dim, const tp_tensor *in,
                                 int d, tp_err *err)
{
    char b[96];
    if (in->shape[dim] % d != 0)
        return tp_fail(err, TP_INVALID,
                       "%s: %s %d of input shape %s has size %lld, not divisible by world size %d",
                       name, what, dim, shp(b, in), (long long)in->shape[dim], d);
    return TP_OK;
}

/* Expected local output shape for op given the (common) input shape. */
static tp_status expected_out(const cpu_slot *s, const tp_tensor *in, int d, tp_tensor *exp,
                              tp_err *err)
{
    const char *name = tp_op_name(s->op);
    tp_status st;
    *exp = *in;
    switch (s->op) {
    case TP_OP_ALL_GATHER:
        if ((st = check_dim(name, "dim", s->dim, in, err)) != TP_OK)
            return st;
        exp->shape[s->dim] *= d;
        return TP_OK;
    case TP_OP_REDUCE_SCATTER:
        if ((st = check_dim(name, "dim", s->dim, in, err)) != TP_OK ||
            (st = check_divisible(name, "dim", s->dim, in, d, err)) != TP_OK)
            return st;
        if (s->reduce != TP_REDUCE_SUM && s->reduce != TP_REDUCE_AVG)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum or avg)", name,
                           (int)s->reduce);
        exp->shape[s->dim] /= d;
        return TP_OK;
    case TP_OP_ALL_REDUCE:
        if (s->reduce != TP_REDUCE_SUM && s->reduce != TP_REDUCE_AVG && s->reduce != TP_REDUCE_MAX)
            return tp_fail(err, TP_INVALID, "%s: reduce op %d unsupported (sum, avg or max)", name,
                           (int)s->reduce);
        return TP_OK;
    case TP_OP_ALL_TO_ALL:
        if ((st = check_dim(name, "split_dim", s->split_dim, in, err)) != TP_OK ||
            (st = check_dim(name, "concat_dim", s->concat_dim, in, err)) != TP_OK ||
            (st = check_divisible(name, "split_dim", s->split_dim, in, d, err)) != TP_OK)
            return st;
        exp->shape[s->split_dim] /= d;
        exp->shape[s->concat_dim] *= d;
        return TP_OK;
    case TP_OP_BROADCAST:
        return TP_OK;
    default:
        return tp_fail(err, TP_INVALID, "op '%s' is not a collective", name);
    }
}

/* Runs on every rank over all slots, so every rank reaches the same verdict
 * (the message names the offending rank). */
static tp_status validate(const cpu_comm *c, tp_err *err)
{
    int d = c->world;
    const cpu_slot *s0 = &c->slot[0];
    const char *name = tp_op_name(s0->op);
    char b1[96], b2[96], b3[96];
    for (int k = 0; k < d; k++) {
        const cpu_slot *s = &c->slot[k];
        if (!s->has_attrs)
            return tp_fail(err, TP_INVALID, "%s: rank %d passed no attrs", name, k);
        if (s->op != s0->op)
            return tp_fail(err, TP_INVALID, "collective mismatch: rank 0 runs %s, rank %d runs %s",
                           name, k, tp_op_name(s->op));
        if (s->dim != s0->dim || s->reduce != s0->reduce || s->split_dim != s0->split_dim ||
            s->concat_dim != s0->concat_dim || s->src != s0->src)
            return tp_fail(err, TP_INVALID, "%s: rank %d attrs differ from rank 0's", name, k);
    }
    if (s0->op == TP_OP_BROADCAST && (s0->src < 0 || s0->src >= d))
        return tp_fail(err, TP_INVALID, "broadcast: src %d out of range for world size %d", s0->src, d);
    /* reference input: src's for broadcast (others may pass none), else rank 0's */
    int ref = s0->op == TP_OP_BROADCAST ? s0->src : 0;
    const tp_tensor *rin = c->slot[ref].in;
    if (!rin)
        return tp_fail(err, TP_INVALID, "%s: rank %d passed no input", name, ref);
    if (rin->ndim < 0 || rin->ndim > TP_MAX_DIMS || (unsigned)rin->dtype >= TP_DTYPE_COUNT)
        return tp_fail(err, TP_INVALID, "%s: rank %d input has bad ndim %d or dtype %d", name, ref,
                       rin->ndim, (int)rin->dtype);
    for (int i = 0; i < rin->ndim; i++)
        if (rin->shape[i] < 0)
            return tp_fail(err, TP_INVALID, "%s: rank %d input has negative size in %s", name, ref,
                           shp(b1, rin));
    tp_tensor exp;
    tp_status st = expected_out(s0, rin, d, &exp, err);
    if (st != TP_OK)
        return st;
    for (int k = 0; k < d; k++) {
        const cpu_slot *s = &c->slot[k];
        if (s0->op != TP_OP_BROADCAST) {
            if (!s->in)
                return tp_fail(err, TP_INVALID, "%s: rank %d passed no input", name, k);
            if (s->in->dtype != rin->dtype)
                return tp_fail(err, TP_INVALID, "%s: rank %d input dtype %s differs from rank 0's %s",
                               name, k, tp_dtype_name(s->in->dtype), tp_dtype_name(rin->dtype));
            if (!same_shape(s->in, rin))
                return tp_fail(err, TP_INVALID, "%s: rank %d input shape %s differs from rank 0's %s",
                               name, k, shp(b1, s->in), shp(b2, rin));
        }
        if (!s->out)
            return tp_fail(err, TP_INVALID, "%s: rank %d passed no output", name, k);
        if (s->out->dtype != rin->dtype)
            return tp_fail(err, TP_INVALID, "%s: rank %d output dtype %s differs from input dtype %s",
                           name, k, tp_dtype_name(s->out->dtype), tp_dtype_name(rin->dtype));
        if (!same_shape(s->out, &exp))
            return tp_fail(err, TP_INVALID,
                           "%s (dim %d, split_dim %d, concat_dim %d) over %d ranks: rank %d output "
                           "shape %s, expected %s for input shape %s",
                           name, s0->dim, s0->split_dim, s0->concat_dim, d, k, shp(b1, s->out),
                           shp(b2, &exp), shp(b3, rin));
    }
    return TP_OK;
}

/* ----------------------------------------------------------- reductions */

static int64_t load_i64(const void *p, tp_dtype t, int64_t i)
{
    return t == TP_I32 ? (int64_t)((const int32_t *)p)[i] : ((const int64_t *)p)[i];
}

static void store_i64(void *p, tp_dtype t, int64_t i, int64_t v)
{
    if (t == TP_I32)
        ((int32_t *)p)[i] = (int32_t)(uint32_t)(uint64_t)v; /* wraps */
    else
        ((int64_t *)p)[i] = v;
}

static int64_t wrap_add(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }

static int all_contiguous(const tp_tensor *v, int d, const tp_tensor *out)
{
    if (!tp_tensor_is_contiguous(out))
        return 0;
    for (int r = 0; r < d; r++)
        if (!tp_tensor_is_contiguous(&v[r]))
            return 0;
    return 1;
}

/* Reduces one run of m elements: element i of rank r lives at
 * base[r] + i*step[r] of view r; the result goes to out at obase + i*ostep. */
static void reduce_run(const tp_tensor *v, const int64_t *base, const int64_t *step, int d,
                       tp_tensor *out, int64_t obase, int64_t ostep, int64_t m, tp_reduce red)
{
    tp_dtype dt = out->dtype;
    if (tp_dtype_is_float(dt)) {
        float acc[RED_CHUNK];
        for (int r = 0; r < d; r++) {
            const void *p = v[r].data;
            int64_t b = base[r], s = step[r];
            if (r == 0) {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = tp_load_f32(p, dt, b + i * s);
            } else if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++) {
                    float x = tp_load_f32(p, dt, b + i * s);
                    if (x > acc[i] || isnan(x))
                        acc[i] = x;
                }
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] += tp_load_f32(p, dt, b + i * s);
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= (float)d;
        for (int64_t i = 0; i < m; i++)
            tp_store_f32(out->data, dt, obase + i * ostep, acc[i]);
    } else {
        int64_t acc[RED_CHUNK];
        for (int r = 0; r < d; r++) {
            const void *p = v[r].data;
            int64_t b = base[r], s = step[r];
            if (r == 0) {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = load_i64(p, dt, b + i * s);
            } else if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++) {
                    int64_t x = load_i64(p, dt, b + i * s);
                    if (x > acc[i])
                        acc[i] = x;
                }
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] = wrap_add(acc[i], load_i64(p, dt, b + i * s));
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= d; /* truncates toward zero */
        for (int64_t i = 0; i < m; i++)
            store_i64(out->data, dt, obase + i * ostep, acc[i]);
    }
}

/* Contiguous F32: same arithmetic as reduce_run, without dtype dispatch. */
static void reduce_f32_contig(const tp_tensor *v, int d, float *o, int64_t n, tp_reduce red)
{
    for (int64_t i0 = 0; i0 < n; i0 += RED_CHUNK) {
        int64_t m = n - i0 < RED_CHUNK ? n - i0 : RED_CHUNK;
        float acc[RED_CHUNK];
        memcpy(acc, (const float *)v[0].data + i0, (size_t)m * sizeof(float));
        for (int r = 1; r < d; r++) {
            const float *p = (const float *)v[r].data + i0;
            if (red == TP_REDUCE_MAX) {
                for (int64_t i = 0; i < m; i++)
                    if (p[i] > acc[i] || isnan(p[i]))
                        acc[i] = p[i];
            } else {
                for (int64_t i = 0; i < m; i++)
                    acc[i] += p[i];
            }
        }
        if (red == TP_REDUCE_AVG)
            for (int64_t i = 0; i < m; i++)
                acc[i] /= (float)d;
        memcpy(o + i0, acc, (size_t)m * sizeof(float));
    }
}

/* out = reduce over r of v[r]; every v[r] has out's shape and dtype. */
static tp_status reduce_views(const tp_tensor *v, int d, tp_tensor *out, tp_reduce red, tp_err *err)
{
    int64_t n = tp_tensor_numel(out);
    if (n == 0)
        return TP_OK;
    if (all_contiguous(v, d, out)) {
        if (out->dtype == TP_F32) {
            reduce_f32_contig(v, d, out->data, n, red);
            return TP_OK;
        }
    }
    int64_t *base = malloc(2 * (size_t)d * sizeof *base);
    if (!base)
        return tp_fail(err, TP_NOMEM, "%s: out of memory", "reduction");
    int64_t *step = base + d;
    int nd = out->ndim;
    int flat = all_contiguous(v, d, out);
    int64_t inner = flat ? n : (nd ? out->shape[nd - 1] : 1);
    int64_t rows = n / inner;
    int64_t idx[TP_MAX_DIMS] = {0};
    for (int r = 0; r < d; r++)
        step[r] = flat ? 1 : (nd ? v[r].stride[nd - 1] : 0);
    int64_t ostep = flat ? 1 : (nd ? out->stride[nd - 1] : 0);
    for (int64_t row = 0; row < rows; row++) {
        int64_t ob = 0;
        for (int k = 0; k < nd - 1; k++)
            ob += idx[k] * out->stride[k];
        for (int64_t i0 = 0; i0 < inner; i0 += RED_CHUNK) {
            int64_t m = inner - i0 < RED_CHUNK ? inner - i0 : RED_CHUNK;
            for (int r = 0; r < d; r++) {
                int64_t b = i0 * step[r];
                for (int k = 0; k < nd - 1; k++)
                    b += idx[k] * v[r].stride[k];
                base[r] = b;
            }
            reduce_run(v, base, step, d, out, ob + i0 * ostep, ostep, m, red);
        }
        for (int k = nd - 2; k >= 0; k--) { /* next row */
            if (++idx[k] < out->shape[k])
                break;
            idx[k] = 0;
        }
    }
    free(base);
    return TP_OK;
}

/* -------------------------------------------------------------- compute */

static tp_status compute(cpu_comm *c, int rank, tp_tensor *out, tp_err *err)
{
    int d = c->world;
    const cpu_slot *s = &c->slot[rank];
    switch (s->op) {
    case TP_OP_ALL_GATHER: {
        int64_t len = c->slot[0].in->shape[s->dim];
        for (int r = 0; r < d; r++) {
            tp_tensor dst = tp_tensor_narrow(out, s->dim, r * len, len);
            tp_tensor_copy(&dst, c->slot[r].in);
        }
        return TP_OK;
    }
    case TP_OP_ALL_TO_ALL: {
        int64_t chunk = c->slot[0].in->shape[s->split_dim] / d;
        int64_t clen = s->split_dim == s->concat_dim ? chunk : c->slot[0].in->shape[s->concat_dim];
        for (int j = 0; j < d; j++) {
            tp_tensor src = tp_tensor_narrow(c->slot[j].in, s->split_dim, rank * chunk, chunk);
            tp_tensor dst = tp_tensor_narrow(out, s->concat_dim, j * clen, clen);
            tp_tensor_copy(&dst, &src);
        }
        return TP_OK;
    }
    case TP_OP_BROADCAST: {
        const tp_tensor *src = c->slot[s->src].in;
        if (src->data == out->data && !memcmp(src->stride, out->stride, sizeof out->stride))
            return TP_OK; /* in place on the src rank */
        tp_tensor_copy(out, src);
        return TP_OK;
    }
    case TP_OP_ALL_REDUCE:
    case TP_OP_REDUCE_SCATTER: {
        tp_tensor *v = malloc((size_t)d * sizeof *v);
        if (!v)
            return tp_fail(err, TP_NOMEM, "%s: out of memory", tp_op_name(s->op));
        for (int r = 0; r < d; r++) {
            if (s->op == TP_OP_ALL_REDUCE) {
                v[r] = *c->slot[r].in;
            } else {
                int64_t chunk = c->slot[r].in->shape[s->dim] / d;
                v[r] = tp_tensor_narrow(c->slot[r].in, s->dim, rank * chunk, chunk);
            }
        }
        tp_status st = reduce_views(v, d, out, s->reduce, err);
        free(v);
        return st;
    }
    default:
        return tp_fail(err, TP_INTERNAL, "op '%s' is not a collective", tp_op_name(s->op));
    }
}

tp_status cpu_collective_run(cpu_comm *c, int rank, tp_op op, const tp_attrs *attrs,
                             const tp_tensor *in, tp_tensor *out, tp_err *err)
{
    if (!c)
        return tp_fail(err, TP_INVALID, "%s: no communicator", tp_op_name(op));
    if (rank < 0 || rank >= c->world)
        return tp_fail(err, TP_INVALID, "%s: rank %d out of range for world size %d",
                       tp_op_name(op), rank, c->world);
    cpu_slot *s = &c->slot[rank];
    memset(s, 0, sizeof *s);
    s->in = in;
    s->out = out;
    s->op = op;
    if (attrs) {
        s->has_attrs = 1;
        s->dim = attrs->dim;
        s->reduce = attrs->reduce;
        s->split_dim = attrs->split_dim;
        s->concat_dim = attrs->concat_dim;
        s->src = attrs->src;
        /* attrs an op does not use must not make ranks disagree */
        if (op != TP_OP_ALL_GATHER && op != TP_OP_REDUCE_SCATTER)
            s->dim = 0;
        if (op != TP_OP_REDUCE_SCATTER && op != TP_OP_ALL_REDUCE)
            s->reduce = TP_REDUCE_SUM;
        if (op != TP_OP_ALL_TO_ALL)
            s->split_dim = s->concat_dim = 0;
        if (op != TP_OP_BROADCAST)
            s->src = 0;
    }
    tp_status st = barrier_wait(c, 1, err);
    if (st != TP_OK)
        return st;
    st = validate(c, err);
    if (st == TP_OK)
        st = compute(c, rank, out, err);
    tp_status st2 = barrier_wait(c, 0, NULL); /* not abortable: see top */
    (void)st2;
    return st;
}

/* ---- building blocks for fused kernels and the ring all_reduce ---- */

tp_status cpu_comm_exchange(cpu_comm *c, int rank, const tp_tensor *mine, tp_err *err)
{
    memset(&c->slot[rank], 0, sizeof c->slot[rank]);
    c->slot[rank].in = mine;
    return barrier_wait(c, 1, err);
}

const tp_tensor *cpu_comm_peer(const cpu_comm *c, int r) { return c->slot[r].in; }

void cpu_comm_release(cpu_comm *c, int rank)
{
    (void)rank;
    barrier_wait(c, 0, NULL); /* not abortable: see top */
}

/* dst[i] = dst[i] (op) src[i] over one chunk, in the tensor's dtype. */
static void combine_chunk(void *dst, const void *src, tp_dtype t, int64_t begin, int64_t end, tp_reduce red)
{
    for (int64_t i = begin; i < end; i++) {
        if (tp_dtype_is_float(t)) {
            float a = tp_load_f32(dst, t, i), b = tp_load_f32(src, t, i);
            tp_store_f32(dst, t, i, red == TP_REDUCE_MAX ? (a >= b || isnan(a) ? a : b) : a + b);
        } else {
            int64_t a = load_i64(dst, t, i), b = load_i64(src, t, i);
            store_i64(dst, t, i, red == TP_REDUCE_MAX ? (a > b ? a : b) : wrap_add(a, b));
        }
    }
}

static void finish_avg(void *p, tp_dtype t, int64_t begin, int64_t end, int d)
{
    for (int64_t i = begin; i < end; i++) {
        if (tp_dtype_is_float(t))
            tp_store_f32(p, t, i, tp_load_f32(p, t, i) / (float)d);
        else
            store_i64(p, t, i, load_i64(p, t, i) / d);
    }
}

/* Ring all_reduce in out (contiguous): d-1 reduce-scatter steps, each rank
 * adding its left neighbour's partial of one chunk, then d-1 all-gather
 * steps copying finished chunks around. At step s rank r writes chunk
 * (r-1-s) while its right neighbour reads chunk (r-s): never the same one,
 * and a barrier separates steps. Every rank ends with copies of the same
 * finished chunks, so results are identical across ranks (though summed in
 * another order than the one-shot path). */
tp_status cpu_ring_all_reduce(cpu_comm *c, int rank, const tp_attrs *attrs, const tp_tensor *in, tp_tensor *out,
                              tp_err *err)
{
    int d = c->world, left = (rank + d - 1) % d;
    tp_tensor_copy(out, in);
    tp_status st = cpu_comm_exchange(c, rank, out, err);
    if (st != TP_OK)
        return st;
    int64_t n = tp_tensor_numel(out);
    const void *lp = cpu_comm_peer(c, left)->data;
    size_t es = tp_dtype_size(out->dtype);
    for (int s = 0; s < d - 1; s++) {
        int k = ((rank - 1 - s) % d + d) % d;
        combine_chunk(out->data, lp, out->dtype, k * n / d, (k + 1) * n / d, attrs->reduce);
        barrier_wait(c, 0, NULL);
    }
    int own = (rank + 1) % d;
    if (attrs->reduce == TP_REDUCE_AVG)
        finish_avg(out->data, out->dtype, own * n / d, (own + 1) * n / d, d);
    barrier_wait(c, 0, NULL);
    for (int s = 0; s < d - 1; s++) {
        int k = ((rank - s) % d + d) % d;
        int64_t b = k * n / d, e = (k + 1) * n / d;
        memcpy((char *)out->data + b * (int64_t)es, (const char *)lp + b * (int64_t)es, (size_t)(e - b) * es);
        barrier_wait(c, 0, NULL);
    }
    return TP_OK;
}
