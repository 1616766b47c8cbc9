/* test_cpu_shared.c — the cpu backend with its ranks in separate processes.
 *
 * Every process maps one memfd; each child maps it again at an address of
 * its own and unmaps the inherited mapping, so only offsets can cross
 * between processes (a raw pointer from another process faults or reads the
 * wrong bytes). The same sequence of collectives and fused ops runs with
 * ranks as threads (shared == NULL) and as processes, and the outputs must
 * be bit-identical. Then failures: a peer SIGKILLed while its peer waits in
 * a collective (entry barrier, exit barrier, or anywhere in a busy loop)
 * fails the waiter once peer_lost is called, never hangs; attaching to an
 * uninitialized or mismatched comm area, a full heap, a foreign rank or an
 * input outside the shared memory give clear errors. */
#include <check.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_main.h"
#include "cpu/collectives.h"
#include "cpu/cpu_backend.h"

#define MAXW 4
#define COMM_BYTES ((size_t)64 << 10)
#define HEAP_BYTES ((size_t)1 << 20)
#define RES_BYTES ((size_t)64 << 10)
#define RES_HDR ((size_t)4096)
#define ARENA ((size_t)128 << 10)
#define CHILD_ALARM 60
#define WAIT_MS 20000

/* ------------------------------------------------------ shared memory */

typedef struct {
    int fd;
    char *base; /* the parent's mapping */
    size_t total;
    int world;
} shm_t;

/* What one rank reports, in the shared memory after the heaps. */
typedef struct {
    _Atomic int stage;
    int status, status2;
    uint64_t used, base;
    char msg[1024], msg2[1024];
} rank_res;

static shm_t shm_new(int world)
{
    shm_t m = {.world = world};
    m.total = COMM_BYTES + (size_t)world * (HEAP_BYTES + RES_BYTES);
    m.fd = memfd_create("test_cpu_shared", 0);
    ck_assert_msg(m.fd >= 0, "memfd_create: %s", strerror(errno));
    ck_assert_int_eq(ftruncate(m.fd, (off_t)m.total), 0);
    m.base = mmap(NULL, m.total, PROT_READ | PROT_WRITE, MAP_SHARED, m.fd, 0);
    ck_assert(m.base != MAP_FAILED);
    return m;
}

static void shm_free(shm_t *m)
{
    munmap(m->base, m->total);
    close(m->fd);
}

static tp_cpu_shared layout(const shm_t *m, char *base, int lo, int hi, int owner)
{
    tp_cpu_shared s = {base, 0, COMM_BYTES, COMM_BYTES, HEAP_BYTES, lo, hi, owner};
    (void)m;
    return s;
}

static rank_res *res_of(const shm_t *m, char *base, int r)
{
    return (rank_res *)(base + COMM_BYTES + (size_t)m->world * HEAP_BYTES + (size_t)r * RES_BYTES);
}

/* A child's own mapping of the memfd, at an address that differs from the
 * parent's (still mapped while this one is made) and from the other
 * children's: identical forks place a new mapping identically, so each
 * reserves a per-salt gap after it (mmap fills top-down: the start moves). */
static char *remap(shm_t *m, int salt)
{
    size_t gap = (size_t)(salt + 1) << 16;
    char *res = mmap(NULL, m->total + gap, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (res == MAP_FAILED)
        _exit(90);
    char *p = mmap(res, m->total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m->fd, 0);
    if (p == MAP_FAILED)
        _exit(91);
    munmap(res + m->total, gap);
    munmap(m->base, m->total);
    m->base = NULL;
    return p;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Exit status of pid, or -1 after killing it when it outlives timeout_ms. */
static int wait_child(pid_t pid, int timeout_ms)
{
    int st = 0;
    for (int t = 0; t < timeout_ms; t += 5) {
        if (waitpid(pid, &st, WNOHANG) == pid)
            return st;
        sleep_ms(5);
    }
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

static int wait_stage(rank_res *r, int stage, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t += 2) {
        if (atomic_load(&r->stage) >= stage)
            return 1;
        sleep_ms(2);
    }
    return 0;
}

/* ----------------------------------------------------------- scenario */

/* One rank's run of every collective and fused op through the backend
 * iface; each output is appended to res. */
typedef struct {
    tp_backend *b;
    int rank, d;
    char *sym, *reg; /* peer-read inputs / weights and outputs */
    size_t sym_used, reg_used;
    char *res;
    size_t res_used, res_cap;
    tp_err *err;
} sc;

static tp_tensor carve(char *base, size_t *used, tp_dtype dt, int nd, const int64_t *shape)
{
    tp_tensor t = tp_tensor_make(base + *used, dt, nd, shape);
    size_t bytes = (size_t)tp_tensor_numel(&t) * tp_dtype_size(dt);
    *used += (bytes + 63) & ~(size_t)63;
    if (*used > ARENA)
        abort(); /* the scenario's shapes are fixed: a test bug */
    return t;
}

static tp_tensor t_sym(sc *s, tp_dtype dt, int nd, const int64_t *shape) { return carve(s->sym, &s->sym_used, dt, nd, shape); }
static tp_tensor t_reg(sc *s, tp_dtype dt, int nd, const int64_t *shape) { return carve(s->reg, &s->reg_used, dt, nd, shape); }

/* Values whose float sums depend on the order: mixed magnitudes and signs. */
static void fill(tp_tensor *t, int rank, int salt)
{
    int64_t n = tp_tensor_numel(t);
    for (int64_t i = 0; i < n; i++) {
        uint32_t h = (uint32_t)(rank * 7919 + salt * 104729) ^ (uint32_t)(i * 2654435761u);
        h ^= h >> 13;
        h *= 0x5bd1e995u;
        h ^= h >> 15;
        float x = ((float)(h % 2001u) - 1000.0f) * (h & 0x10000u ? 1e-3f : 0.37f);
        if (tp_dtype_is_float(t->dtype))
            tp_store_f32(t->data, t->dtype, i, x);
        else if (t->dtype == TP_I32)
            ((int32_t *)t->data)[i] = (int32_t)(h % 100000u) - 50000;
        else
            ((int64_t *)t->data)[i] = ((int64_t)h << 20) - (int64_t)rank;
    }
}

static tp_status run(sc *s, const char *what, tp_op op, const tp_attrs *a, tp_tensor *ins, int n_ins, tp_tensor *out)
{
    tp_status st = s->b->iface->collective(s->b, s->rank, op, a, ins, n_ins, out, s->err);
    if (st != TP_OK) {
        tp_err_prefix(s->err, "%s: ", what);
        return st;
    }
    size_t bytes = (size_t)tp_tensor_numel(out) * tp_dtype_size(out->dtype);
    if (s->res_used + bytes > s->res_cap)
        return tp_fail(s->err, TP_INTERNAL, "%s: result area full", what);
    memcpy(s->res + s->res_used, out->data, bytes);
    s->res_used += bytes;
    return TP_OK;
}

#define RUN(what, op, a, ins, n, out)                              \
    do {                                                           \
        tp_status st_ = run(s, what, op, a, ins, n, out);          \
        if (st_ != TP_OK)                                          \
            return st_;                                            \
    } while (0)

static tp_status ops_copy(sc *s)
{
    int d = s->d, r = s->rank;
    tp_attrs a;
    for (int dim = 0; dim < 2; dim++) {
        int64_t is[2] = {3, 5}, os[2] = {dim ? 3 : 3 * d, dim ? 5 * d : 5};
        tp_tensor in = t_sym(s, TP_F32, 2, is), out = t_reg(s, TP_F32, 2, os);
        fill(&in, r, 1 + dim);
        memset(&a, 0, sizeof a);
        a.dim = dim;
        RUN("all_gather", TP_OP_ALL_GATHER, &a, &in, 1, &out);
    }
    {
        int64_t is[2] = {12, 4}, os[2] = {12 / d, 4 * d};
        tp_tensor in = t_sym(s, TP_F32, 2, is), out = t_reg(s, TP_F32, 2, os);
        fill(&in, r, 3);
        memset(&a, 0, sizeof a);
        a.split_dim = 0;
        a.concat_dim = 1;
        RUN("all_to_all", TP_OP_ALL_TO_ALL, &a, &in, 1, &out);
    }
    {
        int64_t sh[2] = {2, 3};
        tp_tensor in = t_sym(s, TP_F32, 2, sh), out = t_reg(s, TP_F32, 2, sh);
        fill(&in, r, 4);
        memset(&a, 0, sizeof a);
        a.src = d - 1;
        RUN("broadcast", TP_OP_BROADCAST, &a, &in, 1, &out);
    }
    return TP_OK;
}

static tp_status ops_reduce(sc *s)
{
    int d = s->d, r = s->rank;
    tp_attrs a;
    {
        int64_t is[2] = {4, 12}, os[2] = {4, 12 / d};
        tp_tensor in = t_sym(s, TP_F32, 2, is), out = t_reg(s, TP_F32, 2, os);
        fill(&in, r, 5);
        memset(&a, 0, sizeof a);
        a.dim = 1;
        RUN("reduce_scatter sum", TP_OP_REDUCE_SCATTER, &a, &in, 1, &out);
    }
    {
        int64_t is[2] = {12, 4}, os[2] = {12 / d, 4};
        tp_tensor in = t_sym(s, TP_BF16, 2, is), out = t_reg(s, TP_BF16, 2, os);
        fill(&in, r, 6);
        memset(&a, 0, sizeof a);
        a.reduce = TP_REDUCE_AVG;
        RUN("reduce_scatter avg", TP_OP_REDUCE_SCATTER, &a, &in, 1, &out);
    }
    /* one_shot and ring, sum and avg, a float and a half dtype */
    const tp_algo algos[2] = {TP_ALGO_ONE_SHOT, TP_ALGO_RING};
    const tp_dtype dts[3] = {TP_F32, TP_F16, TP_I64};
    for (int k = 0; k < 2; k++)
        for (int t = 0; t < 3; t++)
            for (int red = TP_REDUCE_SUM; red <= TP_REDUCE_MAX; red++) {
                int64_t sh[1] = {37};
                tp_tensor in = t_sym(s, dts[t], 1, sh), out = t_sym(s, dts[t], 1, sh);
                fill(&in, r, 7 + 3 * t + red);
                memset(&a, 0, sizeof a);
                a.reduce = (tp_reduce)red;
                a.algo = algos[k];
                RUN(k ? "all_reduce ring" : "all_reduce one_shot", TP_OP_ALL_REDUCE, &a, &in, 1, &out);
            }
    return TP_OK;
}

static tp_status ops_fused(sc *s)
{
    int d = s->d, r = s->rank;
    int64_t len = 2, K = 4;
    tp_attrs a;
    {   /* gather rows, two weights side by side */
        int64_t xs[2] = {len, K}, w1s[2] = {K, 5}, w2s[2] = {K, 3}, os[2] = {d * len, 8};
        tp_tensor ins[3] = {t_sym(s, TP_F32, 2, xs), t_reg(s, TP_F32, 2, w1s), t_reg(s, TP_F32, 2, w2s)};
        tp_tensor out = t_reg(s, TP_F32, 2, os);
        fill(&ins[0], r, 20);
        fill(&ins[1], 0, 21); /* weights: the same on every rank */
        fill(&ins[2], 0, 22);
        memset(&a, 0, sizeof a);
        a.dim = 0;
        a.n_fused = 2;
        a.algo = TP_ALGO_FUSED;
        RUN("fused_all_gather_matmul rows", TP_OP_FUSED_AG_MM, &a, ins, 3, &out);
    }
    {   /* gather K: partial products summed in rank order */
        int64_t xs[2] = {3, 3}, ws[2] = {3 * d, 5}, os[2] = {3, 5};
        tp_tensor ins[2] = {t_sym(s, TP_F32, 2, xs), t_reg(s, TP_F32, 2, ws)};
        tp_tensor out = t_reg(s, TP_F32, 2, os);
        fill(&ins[0], r, 23);
        fill(&ins[1], 0, 24);
        memset(&a, 0, sizeof a);
        a.dim = 1;
        a.n_fused = 1;
        a.algo = TP_ALGO_FUSED;
        RUN("fused_all_gather_matmul K", TP_OP_FUSED_AG_MM, &a, ins, 2, &out);
    }
    for (int dim = 0; dim < 2; dim++) { /* mm_rs scattering rows, then columns */
        int64_t as[2] = {dim ? len : d * len, K}, ws[2] = {K, dim ? 5 * d : 5}, os[2] = {len, 5};
        int64_t wss[1] = {d * len * 5};
        tp_tensor ins[3] = {t_sym(s, TP_F32, 2, as), t_reg(s, TP_F32, 2, ws), t_sym(s, TP_F32, 1, wss)};
        tp_tensor out = t_reg(s, TP_F32, 2, os);
        fill(&ins[0], r, 25 + dim);
        fill(&ins[1], 0, 27 + dim);
        memset(&a, 0, sizeof a);
        a.dim = dim;
        a.algo = TP_ALGO_FUSED;
        RUN("fused_matmul_reduce_scatter", TP_OP_FUSED_MM_RS, &a, ins, 3, &out);
    }
    return TP_OK;
}

static tp_status scenario(sc *s)
{
    void *sym = NULL, *reg = NULL;
    tp_status st = s->b->iface->alloc_symmetric(s->b, s->rank, ARENA, &sym, s->err);
    if (st == TP_OK)
        st = s->b->iface->alloc(s->b, s->rank, ARENA, &reg, s->err);
    if (st == TP_OK) {
        s->sym = sym;
        s->reg = reg;
        st = ops_copy(s);
        if (st == TP_OK)
            st = ops_reduce(s);
        if (st == TP_OK)
            st = ops_fused(s);
    }
    if (sym)
        s->b->iface->free(s->b, s->rank, sym);
    if (reg)
        s->b->iface->free(s->b, s->rank, reg);
    return st;
}

typedef struct {
    sc s;
    tp_status st;
    tp_err err;
} rank_job;

static void *rank_thread(void *p)
{
    rank_job *j = p;
    j->s.err = &j->err;
    j->st = scenario(&j->s);
    if (j->st != TP_OK)
        j->s.b->iface->abort(j->s.b); /* as the rank group does: peers fail, not hang */
    return NULL;
}

/* Ranks [lo, hi) of b as threads; res[r - lo] receives rank r's outputs. */
static void run_ranks(tp_backend *b, int world, int lo, int hi, char **res, size_t cap, rank_job *jobs)
{
    pthread_t th[MAXW];
    for (int r = lo; r < hi; r++) {
        rank_job *j = &jobs[r - lo];
        memset(j, 0, sizeof *j);
        j->s.b = b;
        j->s.rank = r;
        j->s.d = world;
        j->s.res = res[r - lo];
        j->s.res_cap = cap;
        if (pthread_create(&th[r - lo], NULL, rank_thread, j) != 0)
            abort();
    }
    for (int r = lo; r < hi; r++)
        pthread_join(th[r - lo], NULL);
}

/* A child running ranks [lo, hi) on its own mapping; the owner signals on
 * ready_fd once its create returned. Never returns. */
static void child_scenario(shm_t *m, int lo, int hi, int owner, int ready_fd)
{
    alarm(CHILD_ALARM);
    char *base = remap(m, lo);
    tp_cpu_shared sh = layout(m, base, lo, hi, owner);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    tp_status st = tp_cpu_backend_create(m->world, &sh, &b, &err);
    for (int r = lo; r < hi; r++) {
        rank_res *rr = res_of(m, base, r);
        rr->base = (uint64_t)(uintptr_t)base;
        rr->status = st;
        snprintf(rr->msg, sizeof rr->msg, "create: %.900s", err.msg);
    }
    if (ready_fd >= 0) {
        if (write(ready_fd, "x", 1) != 1)
            _exit(92);
        close(ready_fd);
    }
    if (st != TP_OK)
        _exit(3);
    char *res[MAXW];
    rank_job jobs[MAXW];
    for (int r = lo; r < hi; r++)
        res[r - lo] = (char *)res_of(m, base, r) + RES_HDR;
    run_ranks(b, m->world, lo, hi, res, RES_BYTES - RES_HDR, jobs);
    int ok = 1;
    for (int r = lo; r < hi; r++) {
        rank_res *rr = res_of(m, base, r);
        rr->status = jobs[r - lo].st;
        rr->used = jobs[r - lo].s.res_used;
        memcpy(rr->msg, jobs[r - lo].err.msg, sizeof rr->msg);
        ok &= jobs[r - lo].st == TP_OK;
    }
    b->iface->destroy(b);
    _exit(ok ? 0 : 1);
}

/* world ranks, per_proc per process; child_owner: child 0 initializes the
 * comm (the others are forked only after its create returned), else the
 * parent does before forking. Outputs must equal the thread backend's. */
static void compare_with_threads(int world, int per_proc, int child_owner)
{
    /* reference: ranks as threads */
    tp_backend *tb = NULL;
    tp_err err = {{0}};
    ck_assert_msg(tp_cpu_backend_create(world, NULL, &tb, &err) == TP_OK, "%s", err.msg);
    char *tres[MAXW];
    rank_job tj[MAXW];
    for (int r = 0; r < world; r++)
        tres[r] = malloc(RES_BYTES);
    run_ranks(tb, world, 0, world, tres, RES_BYTES - RES_HDR, tj);
    for (int r = 0; r < world; r++)
        ck_assert_msg(tj[r].st == TP_OK, "threads, rank %d: %s", r, tj[r].err.msg);
    tb->iface->destroy(tb);

    shm_t m = shm_new(world);
    tp_backend *owner = NULL;
    if (!child_owner) {
        tp_cpu_shared sh = layout(&m, m.base, 0, 0, 1); /* owns the comm, runs no rank */
        ck_assert_msg(tp_cpu_backend_create(world, &sh, &owner, &err) == TP_OK, "%s", err.msg);
    }
    int nproc = world / per_proc;
    pid_t pid[MAXW];
    for (int p = 0; p < nproc; p++) {
        int fds[2] = {-1, -1};
        int gate = child_owner && p == 0;
        if (gate)
            ck_assert_int_eq(pipe(fds), 0);
        pid[p] = fork();
        ck_assert_int_ge(pid[p], 0);
        if (pid[p] == 0) {
            if (gate)
                close(fds[0]);
            child_scenario(&m, p * per_proc, (p + 1) * per_proc, gate, gate ? fds[1] : -1);
        }
        if (gate) { /* the owner's create returns before any other create starts */
            close(fds[1]);
            struct pollfd pf = {fds[0], POLLIN, 0};
            ck_assert_msg(poll(&pf, 1, WAIT_MS) == 1, "owner child never reported its create");
            char c;
            ck_assert_int_eq(read(fds[0], &c, 1), 1);
            close(fds[0]);
        }
    }
    int wst[MAXW];
    for (int p = 0; p < nproc; p++)
        wst[p] = wait_child(pid[p], WAIT_MS);
    for (int r = 0; r < world; r++) {
        rank_res *rr = res_of(&m, m.base, r);
        ck_assert_msg(rr->status == TP_OK, "processes, rank %d (status %d): %s", r, rr->status, rr->msg);
    }
    for (int p = 0; p < nproc; p++)
        ck_assert_msg(wst[p] >= 0 && WIFEXITED(wst[p]) && WEXITSTATUS(wst[p]) == 0,
                      "process %d (ranks [%d, %d)) %s (wait status %d)", p, p * per_proc, (p + 1) * per_proc,
                      wst[p] < 0 ? "hung and was killed" : "failed", wst[p]);
    /* every process had its own address: offsets, not pointers, crossed */
    for (int p = 0; p < nproc; p++) {
        uint64_t bp = res_of(&m, m.base, p * per_proc)->base;
        ck_assert(bp != 0 && bp != (uint64_t)(uintptr_t)m.base);
        for (int q = 0; q < p; q++)
            ck_assert_msg(bp != res_of(&m, m.base, q * per_proc)->base, "processes %d and %d share an address", p, q);
    }
    for (int r = 0; r < world; r++) {
        rank_res *rr = res_of(&m, m.base, r);
        const char *got = (const char *)rr + RES_HDR;
        ck_assert_uint_eq(rr->used, tj[r].s.res_used);
        ck_assert_uint_gt(rr->used, 0);
        size_t i = 0;
        while (i < rr->used && got[i] == tres[r][i])
            i++;
        ck_assert_msg(i == rr->used, "world %d rank %d: processes and threads differ at output byte %zu", world, r, i);
        free(tres[r]);
    }
    if (owner)
        owner->iface->destroy(owner);
    shm_free(&m);
}

START_TEST(processes_match_threads_w2) { compare_with_threads(2, 1, 0); }
END_TEST

START_TEST(processes_match_threads_w3_child_owner) { compare_with_threads(3, 1, 1); }
END_TEST

START_TEST(processes_match_threads_w4_two_ranks_each) { compare_with_threads(4, 2, 0); }
END_TEST

/* ------------------------------------------------------ a peer dies */

static int has(const char *msg, const char *what) { return strstr(msg, what) != NULL; }

/* Child rank 0: enters an all_reduce its peer never joins; reports how it
 * left and whether a second call fails at once. */
static void child_waits_in_collective(shm_t *m)
{
    alarm(CHILD_ALARM);
    char *base = remap(m, 0);
    tp_cpu_shared sh = layout(m, base, 0, 1, 0);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    rank_res *rr = res_of(m, base, 0);
    if (tp_cpu_backend_create(2, &sh, &b, &err) != TP_OK) {
        snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
        _exit(3);
    }
    void *p = NULL;
    if (b->iface->alloc(b, 0, 256, &p, &err) != TP_OK)
        _exit(4);
    int64_t sh1[1] = {16};
    tp_tensor in = tp_tensor_make(p, TP_F32, 1, sh1), out = tp_tensor_make((char *)p + 128, TP_F32, 1, sh1);
    tp_attrs a = {0};
    atomic_store(&rr->stage, 1);
    rr->status = b->iface->collective(b, 0, TP_OP_ALL_REDUCE, &a, &in, 1, &out, &err);
    snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
    atomic_store(&rr->stage, 2);
    rr->status2 = b->iface->collective(b, 0, TP_OP_ALL_REDUCE, &a, &in, 1, &out, &err);
    snprintf(rr->msg2, sizeof rr->msg2, "%s", err.msg);
    _exit(0);
}

/* Child rank 1: attaches, then idles until killed. */
static void child_idles(shm_t *m)
{
    alarm(CHILD_ALARM);
    char *base = remap(m, 1);
    tp_cpu_shared sh = layout(m, base, 1, 2, 0);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    if (tp_cpu_backend_create(2, &sh, &b, &err) != TP_OK)
        _exit(3);
    atomic_store(&res_of(m, base, 1)->stage, 1);
    for (;;)
        pause();
}

START_TEST(peer_killed_during_collective)
{
    shm_t m = shm_new(2);
    tp_backend *owner = NULL;
    tp_err err = {{0}};
    tp_cpu_shared sh = layout(&m, m.base, 0, 0, 1);
    ck_assert_msg(tp_cpu_backend_create(2, &sh, &owner, &err) == TP_OK, "%s", err.msg);
    pid_t a = fork();
    ck_assert_int_ge(a, 0);
    if (a == 0)
        child_waits_in_collective(&m);
    pid_t b = fork();
    ck_assert_int_ge(b, 0);
    if (b == 0)
        child_idles(&m);
    rank_res *ra = res_of(&m, m.base, 0), *rb = res_of(&m, m.base, 1);
    ck_assert_msg(wait_stage(ra, 1, WAIT_MS) && wait_stage(rb, 1, WAIT_MS), "children never started: %s", ra->msg);
    sleep_ms(100); /* rank 0 is asleep in its entry barrier */
    ck_assert_int_eq(atomic_load(&ra->stage), 1);
    kill(b, SIGKILL);
    int st = wait_child(b, WAIT_MS);
    ck_assert(st >= 0 && WIFSIGNALED(st));
    sleep_ms(50);
    ck_assert_int_eq(atomic_load(&ra->stage), 1); /* a dead peer alone does not wake it */
    owner->iface->peer_lost(owner);
    st = wait_child(a, WAIT_MS);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "waiting rank did not return (status %d)", st);
    ck_assert_int_eq(ra->status, TP_BACKEND);
    ck_assert_msg(has(ra->msg, "process is gone"), "%s", ra->msg);
    ck_assert_int_eq(ra->status2, TP_BACKEND); /* permanent */
    ck_assert_msg(has(ra->msg2, "process is gone"), "%s", ra->msg2);
    /* the owner's reset does not clear it: a new handle's collective fails at once */
    owner->iface->reset(owner);
    tp_backend *late = NULL;
    tp_cpu_shared ls = layout(&m, m.base, 0, 1, 0);
    ck_assert_msg(tp_cpu_backend_create(2, &ls, &late, &err) == TP_OK, "%s", err.msg);
    void *p = NULL;
    ck_assert(late->iface->alloc(late, 0, 64, &p, &err) == TP_OK);
    int64_t s1[1] = {4};
    tp_tensor in = tp_tensor_make(p, TP_F32, 1, s1), out = tp_tensor_make((char *)p + 32, TP_F32, 1, s1);
    tp_attrs at = {0};
    ck_assert_int_eq(late->iface->collective(late, 0, TP_OP_ALL_REDUCE, &at, &in, 1, &out, &err), TP_BACKEND);
    ck_assert_msg(has(err.msg, "process is gone"), "%s", err.msg);
    late->iface->free(late, 0, p);
    late->iface->destroy(late);
    owner->iface->destroy(owner);
    shm_free(&m);
}
END_TEST

/* Exit barrier: rank 1 passes the exchange and dies before releasing.
 * abort must not let rank 0 out (its peer might still be reading), lost must. */
static cpu_comm_shared comm_area(const shm_t *m, char *base, int owner)
{
    cpu_comm_shared s = {base, COMM_BYTES + (size_t)m->world * HEAP_BYTES, 0, COMM_BYTES, owner};
    return s;
}

static void child_exchange(shm_t *m, int rank)
{
    alarm(CHILD_ALARM);
    char *base = remap(m, rank);
    cpu_comm_shared cs = comm_area(m, base, 0);
    tp_err err = {{0}};
    rank_res *rr = res_of(m, base, rank);
    cpu_comm *c = cpu_comm_attach(2, &cs, &err);
    if (!c) {
        snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
        _exit(3);
    }
    int64_t s1[1] = {8};
    tp_tensor mine = tp_tensor_make(base + COMM_BYTES + (size_t)rank * HEAP_BYTES, TP_F32, 1, s1);
    ((float *)mine.data)[0] = (float)rank + 0.5f;
    rr->status = cpu_comm_exchange(c, rank, &mine, &err);
    if (rr->status != TP_OK) {
        snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
        _exit(4);
    }
    tp_tensor peer = cpu_comm_peer(c, 1 - rank); /* its data, through this mapping */
    if (((float *)peer.data)[0] != (float)(1 - rank) + 0.5f)
        _exit(5);
    if (rank == 1)
        raise(SIGKILL); /* gone between the exchange and the release */
    atomic_store(&rr->stage, 1);
    rr->status = cpu_comm_release(c, rank, &err);
    snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
    atomic_store(&rr->stage, 2);
    _exit(0);
}

START_TEST(peer_killed_before_release)
{
    shm_t m = shm_new(2);
    tp_err err = {{0}};
    cpu_comm_shared cs = comm_area(&m, m.base, 1);
    cpu_comm *owner = cpu_comm_attach(2, &cs, &err);
    ck_assert_msg(owner != NULL, "%s", err.msg);
    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        pid[r] = fork();
        ck_assert_int_ge(pid[r], 0);
        if (pid[r] == 0)
            child_exchange(&m, r);
    }
    int st = wait_child(pid[1], WAIT_MS);
    ck_assert_msg(st >= 0 && WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "rank 1 (status %d): %s", st,
                  res_of(&m, m.base, 1)->msg);
    rank_res *ra = res_of(&m, m.base, 0);
    ck_assert_msg(wait_stage(ra, 1, WAIT_MS), "rank 0 never reached the release: %s", ra->msg);
    cpu_comm_abort(owner);
    sleep_ms(200);
    ck_assert_msg(atomic_load(&ra->stage) == 1, "abort let rank 0 leave the exit barrier");
    cpu_comm_lost(owner);
    st = wait_child(pid[0], WAIT_MS);
    ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 0 (status %d)", st);
    ck_assert_int_eq(ra->status, TP_BACKEND);
    ck_assert_msg(has(ra->msg, "process is gone"), "%s", ra->msg);
    cpu_comm_reset(owner); /* clears the abort, not the loss */
    ck_assert_int_eq(cpu_comm_barrier(owner, 0, &err), TP_BACKEND);
    ck_assert_msg(has(err.msg, "process is gone"), "%s", err.msg);
    cpu_comm_free(owner);
    shm_free(&m);
}
END_TEST

/* Children hammer collectives and barriers; one is killed at an arbitrary
 * point (possibly mid-barrier): every survivor fails after peer_lost. */
static void child_busy(shm_t *m, int rank)
{
    alarm(CHILD_ALARM);
    char *base = remap(m, rank);
    tp_cpu_shared sh = layout(m, base, rank, rank + 1, 0);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    rank_res *rr = res_of(m, base, rank);
    if (tp_cpu_backend_create(m->world, &sh, &b, &err) != TP_OK)
        _exit(3);
    void *p = NULL;
    if (b->iface->alloc(b, rank, 4096, &p, &err) != TP_OK)
        _exit(4);
    int64_t s1[1] = {64}, g1[1] = {64 * (int64_t)m->world};
    tp_tensor in = tp_tensor_make(p, TP_F32, 1, s1), out = tp_tensor_make((char *)p + 512, TP_F32, 1, s1);
    tp_tensor gat = tp_tensor_make((char *)p + 1024, TP_F32, 1, g1);
    tp_attrs a = {0};
    atomic_store(&rr->stage, 1);
    for (long it = 0;; it++) {
        tp_status st;
        a.algo = it % 3 == 1 ? TP_ALGO_RING : TP_ALGO_ONE_SHOT;
        if (it % 3 == 2)
            st = b->iface->collective(b, rank, TP_OP_ALL_GATHER, &a, &in, 1, &gat, &err);
        else
            st = b->iface->collective(b, rank, TP_OP_ALL_REDUCE, &a, &in, 1, &out, &err);
        if (st != TP_OK) {
            rr->status = st;
            snprintf(rr->msg, sizeof rr->msg, "%s", err.msg);
            _exit(0);
        }
    }
}

START_TEST(peer_killed_anywhere)
{
    for (int round = 0; round < 3; round++) {
        int world = 3;
        shm_t m = shm_new(world);
        tp_backend *owner = NULL;
        tp_err err = {{0}};
        tp_cpu_shared sh = layout(&m, m.base, 0, 0, 1);
        ck_assert_msg(tp_cpu_backend_create(world, &sh, &owner, &err) == TP_OK, "%s", err.msg);
        pid_t pid[3];
        for (int r = 0; r < world; r++) {
            pid[r] = fork();
            ck_assert_int_ge(pid[r], 0);
            if (pid[r] == 0)
                child_busy(&m, r);
        }
        for (int r = 0; r < world; r++)
            ck_assert(wait_stage(res_of(&m, m.base, r), 1, WAIT_MS));
        sleep_ms(20 + 30 * round);
        int victim = round % world;
        kill(pid[victim], SIGKILL);
        ck_assert(wait_child(pid[victim], WAIT_MS) >= 0);
        owner->iface->peer_lost(owner);
        for (int r = 0; r < world; r++) {
            if (r == victim)
                continue;
            int st = wait_child(pid[r], WAIT_MS);
            rank_res *rr = res_of(&m, m.base, r);
            ck_assert_msg(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "round %d rank %d hung or crashed (%d)",
                          round, r, st);
            ck_assert_int_eq(rr->status, TP_BACKEND);
            ck_assert_msg(has(rr->msg, "process is gone"), "round %d rank %d: %s", round, r, rr->msg);
        }
        owner->iface->destroy(owner);
        shm_free(&m);
    }
}
END_TEST

/* ---------------------------------------------------- clear errors */

START_TEST(attach_errors)
{
    shm_t m = shm_new(3);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    tp_cpu_shared sh = layout(&m, m.base, 0, 1, 0);
    /* nobody initialized the comm area */
    ck_assert_int_eq(tp_cpu_backend_create(3, &sh, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "not initialized") && has(err.msg, "owner"), "%s", err.msg);
    ck_assert_ptr_null(b);
    /* initialized for 2 ranks, joined as one of 3 */
    tp_backend *owner = NULL;
    tp_cpu_shared os = layout(&m, m.base, 0, 0, 1);
    ck_assert_msg(tp_cpu_backend_create(2, &os, &owner, &err) == TP_OK, "%s", err.msg);
    ck_assert_int_eq(tp_cpu_backend_create(3, &sh, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "world size 2") && has(err.msg, "expects 3"), "%s", err.msg);
    /* layouts that cannot work */
    tp_cpu_shared bad = layout(&m, m.base, 0, 1, 0);
    bad.comm_bytes = 64;
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "cannot hold world size 2"), "%s", err.msg);
    bad = layout(&m, m.base, 0, 1, 0);
    bad.heap_offset = COMM_BYTES / 2;
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "overlaps"), "%s", err.msg);
    bad = layout(&m, m.base, 1, 3, 0);
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "[1, 3)") && has(err.msg, "world size 2"), "%s", err.msg);
    bad = layout(&m, m.base, 0, 1, 0);
    bad.comm_offset = 8;
    bad.heap_offset = 2 * COMM_BYTES;
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "64-byte aligned"), "%s", err.msg);
    bad = layout(&m, m.base, 0, 1, 0);
    bad.heap_bytes = 0;
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_msg(has(err.msg, "rank 0"), "%s", err.msg);
    bad.base = NULL;
    ck_assert_int_eq(tp_cpu_backend_create(2, &bad, &b, &err), TP_INVALID);
    ck_assert_uint_ge(COMM_BYTES, tp_cpu_shared_comm_bytes(4));
    owner->iface->destroy(owner);
    shm_free(&m);
}
END_TEST

START_TEST(heap_errors)
{
    shm_t m = shm_new(2);
    tp_backend *b = NULL;
    tp_err err = {{0}};
    tp_cpu_shared sh = layout(&m, m.base, 1, 2, 1);
    ck_assert_msg(tp_cpu_backend_create(2, &sh, &b, &err) == TP_OK, "%s", err.msg);
    void *p = NULL, *q = NULL;
    ck_assert_int_eq(b->iface->alloc(b, 1, HEAP_BYTES + 1, &p, &err), TP_NOMEM);
    ck_assert_msg(has(err.msg, "rank 1: shared heap of 1048576 bytes cannot fit 1048577 more bytes"), "%s", err.msg);
    ck_assert_int_eq(b->iface->alloc_symmetric(b, 0, 64, &p, &err), TP_INVALID); /* not this process's rank */
    ck_assert_msg(has(err.msg, "rank 0 is not run by this process"), "%s", err.msg);
    /* the region: rank 1's, 64-byte aligned, reused after free */
    ck_assert(b->iface->alloc_symmetric(b, 1, HEAP_BYTES - 64, &p, &err) == TP_OK);
    ck_assert_ptr_eq(p, m.base + COMM_BYTES + HEAP_BYTES);
    ck_assert(b->iface->alloc(b, 1, 64, &q, &err) == TP_OK);
    ck_assert_int_eq(b->iface->alloc(b, 1, 1, &q, &err), TP_NOMEM);
    b->iface->free(b, 1, p);
    ck_assert(b->iface->alloc(b, 1, 1000, &p, &err) == TP_OK);
    ck_assert_ptr_eq(p, m.base + COMM_BYTES + HEAP_BYTES);
    b->iface->free(b, 1, p);
    b->iface->free(b, 1, q);
    b->iface->destroy(b);
    shm_free(&m);
}
END_TEST

/* Two ranks as threads of one process, on the shared memory. */
typedef struct {
    tp_backend *b;
    int rank;
    tp_tensor in, out;
    tp_status st;
    tp_err err;
} tjob;

static void *tjob_main(void *p)
{
    tjob *j = p;
    tp_attrs a = {0};
    j->st = j->b->iface->collective(j->b, j->rank, TP_OP_ALL_REDUCE, &a, &j->in, 1, &j->out, &j->err);
    return NULL;
}

static void run2(tjob *j)
{
    pthread_t th[2];
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(pthread_create(&th[r], NULL, tjob_main, &j[r]), 0);
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
}

START_TEST(reset_owner_only_and_outside_inputs)
{
    shm_t m = shm_new(2);
    tp_err err = {{0}};
    tp_backend *owner = NULL, *b = NULL;
    tp_cpu_shared os = layout(&m, m.base, 0, 0, 1), sh = layout(&m, m.base, 0, 2, 0);
    ck_assert_msg(tp_cpu_backend_create(2, &os, &owner, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(tp_cpu_backend_create(2, &sh, &b, &err) == TP_OK, "%s", err.msg);
    tjob j[2];
    memset(j, 0, sizeof j);
    int64_t s1[1] = {8};
    for (int r = 0; r < 2; r++) {
        void *p = NULL;
        ck_assert(b->iface->alloc(b, r, 64, &p, &err) == TP_OK);
        j[r].b = b;
        j[r].rank = r;
        j[r].in = tp_tensor_make(p, TP_F32, 1, s1);
        ck_assert(b->iface->alloc(b, r, 64, &p, &err) == TP_OK);
        j[r].out = tp_tensor_make(p, TP_F32, 1, s1);
        for (int i = 0; i < 8; i++)
            ((float *)j[r].in.data)[i] = (float)(r * 10 + i);
    }
    run2(j);
    for (int r = 0; r < 2; r++) {
        ck_assert_msg(j[r].st == TP_OK, "%s", j[r].err.msg);
        ck_assert_float_eq(((float *)j[r].out.data)[3], 16.0f);
    }
    b->iface->abort(b);
    run2(j);
    for (int r = 0; r < 2; r++)
        ck_assert_int_eq(j[r].st, TP_BACKEND);
    b->iface->reset(b); /* not the owner: no-op */
    run2(j);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(j[r].st == TP_BACKEND && has(j[r].err.msg, "aborted"), "%s", j[r].err.msg);
    owner->iface->reset(owner);
    run2(j);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(j[r].st == TP_OK, "%s", j[r].err.msg);
    /* an input peers cannot read: every rank gets the same clear error */
    float priv[8] = {0};
    tp_tensor keep = j[1].in;
    j[1].in = tp_tensor_make(priv, TP_F32, 1, s1);
    run2(j);
    for (int r = 0; r < 2; r++)
        ck_assert_msg(j[r].st == TP_INVALID && has(j[r].err.msg, "rank 1 input is not in the rank group's shared memory"),
                      "rank %d: %s", r, j[r].err.msg);
    j[1].in = keep;
    run2(j); /* and the comm still works */
    for (int r = 0; r < 2; r++)
        ck_assert_msg(j[r].st == TP_OK, "%s", j[r].err.msg);
    for (int r = 0; r < 2; r++) {
        b->iface->free(b, r, j[r].in.data);
        b->iface->free(b, r, j[r].out.data);
    }
    b->iface->destroy(b);
    owner->iface->destroy(owner);
    shm_free(&m);
}
END_TEST

static Suite *shared_suite(void)
{
    Suite *s = suite_create("cpu_shared");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120); /* a hang fails instead of blocking the suite */
    tcase_add_test(tc, processes_match_threads_w2);
    tcase_add_test(tc, processes_match_threads_w3_child_owner);
    tcase_add_test(tc, processes_match_threads_w4_two_ranks_each);
    tcase_add_test(tc, peer_killed_during_collective);
    tcase_add_test(tc, peer_killed_before_release);
    tcase_add_test(tc, peer_killed_anywhere);
    tcase_add_test(tc, attach_errors);
    tcase_add_test(tc, heap_errors);
    tcase_add_test(tc, reset_owner_only_and_outside_inputs);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(shared_suite)
