/* bench_gemm — the GEMMs of BERT-base and GPT-2 (K, N of 768, 2304 and
 * 3072; M = 1..512 rows: a batch's tokens) by every kernel tpserve could
 * run them with, printed as a table (never asserts: noisy machines):
 *
 *   openblas 1t / Nt   cblas_sgemm, B row-major as the cpu backend calls it
 *                      (ops_matmul.c), on 1 thread and on every usable core
 *   sgemv              M = 1 only: cblas_sgemv on B, 1 thread
 *   small              tpserve's small-M kernel (small_gemm.h), 1 thread;
 *                      '*' where small_sgemm_takes gives it the product
 *   packed             tpserve's packed-weight kernel (packed_gemm.h), B
 *                      packed once before timing, 1 thread: what the cpu
 *                      backend runs for FP32 weights (with AVX2 and FMA)
 *   onednn 1t / Nt     oneDNN's matmul with its weights reordered once, at
 *                      load, into the layout it picks for this M (format
 *                      "any"): what "weights packed once" would cost per
 *                      step. Only when built with TP_BENCH_DNNL (make
 *                      bench-gemm does when libdnnl-dev is installed);
 *                      oneDNN is never linked into tpserve.
 *
 * Microseconds per call. The 1-thread columns are the calling thread's
 * CPU time (the median of 9 samples of enough calls for about 2 ms each),
 * which leaves out the time a shared machine's neighbours hold the core
 * (they still share the caches and memory bandwidth: run it quiet).
 * The N-thread columns can only be wall time: the smallest of the 9, the
 * sample least disturbed. The last columns check the packed kernel's and
 * oneDNN's results against OpenBLAS's (largest |difference| over largest
 * |value|). */
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "cpu/packed_gemm.h"
#include "cpu/small_gemm.h"
#include "engine.h"
#include "spin_wait.h"

#ifdef TP_BENCH_DNNL
#include <dnnl.h>
#include <omp.h>
#endif

#define SAMPLES 9
#define SAMPLE_NS 2000000.0 /* per sample */

typedef struct {
    int64_t M, K, N;
    const float *a, *b;
    float *c;
} gemm;

typedef void (*gemm_fn)(const gemm *g, void *ctx);

static void run_openblas(const gemm *g, void *ctx)
{
    (void)ctx;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (blasint)g->M, (blasint)g->N, (blasint)g->K, 1.0f, g->a,
                (blasint)g->K, g->b, (blasint)g->N, 0.0f, g->c, (blasint)g->N);
}

/* M = 1 as a matrix-vector product: OpenBLAS 0.3.21's sgemm packs all of
 * B on every call whatever M (forwarding to gemv came in 0.3.27). */
static void run_gemv(const gemm *g, void *ctx)
{
    (void)ctx;
    cblas_sgemv(CblasRowMajor, CblasTrans, (blasint)g->K, (blasint)g->N, 1.0f, g->b, (blasint)g->N, g->a, 1, 0.0f,
                g->c, 1);
}

static void run_small(const gemm *g, void *ctx)
{
    (void)ctx;
    small_sgemm(g->M, g->N, g->K, 1.0f, g->a, g->K, g->b, g->N, g->c, g->N);
}

typedef struct {
    const float *panels;
    float *scratch;
} packed_ctx;

static void run_packed(const gemm *g, void *ctx)
{
    const packed_ctx *p = ctx;
    pgemm_run(g->M, g->K, g->N, g->a, g->K, p->panels, g->c, g->N, 0, pgemm_panels(g->N), p->scratch);
}

/* Largest |c - ref| over largest |ref| of M x N values. */
static double rel_err(const float *c, const float *ref, int64_t n)
{
    double big = 0, diff = 0;
    for (int64_t i = 0; i < n; i++) {
        big = fmax(big, fabs(ref[i]));
        diff = fmax(diff, fabs(ref[i] - c[i]));
    }
    return big > 0 ? diff / big : diff;
}

static void print_err(double err)
{
    if (err < 0)
        printf(" %10s", "-");
    else
        printf(" %10.1e", err);
}

static int cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return a < b ? -1 : a > b;
}

static int64_t thread_cpu_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

/* Microseconds per call, as the header says: threads 1, this thread's CPU
 * time (median); more, wall time (minimum). Calls per sample come from one
 * timed warm-up call. */
static double time_us(gemm_fn fn, const gemm *g, void *ctx, int threads)
{
    int64_t (*clock)(void) = threads == 1 ? thread_cpu_ns : tp_now_ns;
    int64_t t0 = clock();
    fn(g, ctx);
    double one = (double)(clock() - t0);
    int reps = one > 0 ? (int)(SAMPLE_NS / one) : 1000;
    reps = reps < 1 ? 1 : reps > 100000 ? 100000 : reps;
    double s[SAMPLES];
    for (int k = 0; k < SAMPLES; k++) {
        t0 = clock();
        for (int r = 0; r < reps; r++)
            fn(g, ctx);
        s[k] = (double)(clock() - t0) / reps / 1e3;
    }
    qsort(s, SAMPLES, sizeof s[0], cmp_double);
    return s[threads == 1 ? SAMPLES / 2 : 0];
}

#ifdef TP_BENCH_DNNL
/* One matmul primitive for an M x K by K x N product, its weights in the
 * layout the primitive chose, reordered from row-major once. */
typedef struct {
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    dnnl_primitive_t mm;
    dnnl_memory_t src, wei, dst;
} packed_mm;

#define DNNL_OK(call)                                                                                                  \
    do {                                                                                                               \
        dnnl_status_t s_ = (call);                                                                                     \
        if (s_ != dnnl_success) {                                                                                      \
            fprintf(stderr, "bench_gemm: %s: oneDNN status %d\n", #call, (int)s_);                                    \
            return -1;                                                                                                 \
        }                                                                                                              \
    } while (0)

static int packed_mm_init(packed_mm *d, dnnl_engine_t eng, dnnl_stream_t stream, const gemm *g)
{
    dnnl_memory_desc_t a_md, b_md, b_any, c_md;
    dnnl_dims_t ad = {g->M, g->K}, bd = {g->K, g->N}, cd = {g->M, g->N};
    DNNL_OK(dnnl_memory_desc_init_by_tag(&a_md, 2, ad, dnnl_f32, dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&b_md, 2, bd, dnnl_f32, dnnl_ab));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&b_any, 2, bd, dnnl_f32, dnnl_format_tag_any));
    DNNL_OK(dnnl_memory_desc_init_by_tag(&c_md, 2, cd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t desc;
    DNNL_OK(dnnl_matmul_desc_init(&desc, &a_md, &b_any, NULL, &c_md));
    dnnl_primitive_desc_t pd, rpd;
    DNNL_OK(dnnl_primitive_desc_create(&pd, &desc, NULL, eng, NULL));
    const dnnl_memory_desc_t *packed = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    dnnl_memory_t plain;
    d->eng = eng;
    d->stream = stream;
    DNNL_OK(dnnl_memory_create(&d->src, &a_md, eng, (void *)g->a));
    DNNL_OK(dnnl_memory_create(&plain, &b_md, eng, (void *)g->b));
    DNNL_OK(dnnl_memory_create(&d->wei, packed, eng, DNNL_MEMORY_ALLOCATE));
    DNNL_OK(dnnl_memory_create(&d->dst, &c_md, eng, g->c));
    /* the load-time cost, paid once per weight and bucket */
    dnnl_primitive_t reorder;
    DNNL_OK(dnnl_reorder_primitive_desc_create(&rpd, &b_md, eng, packed, eng, NULL));
    DNNL_OK(dnnl_primitive_create(&reorder, rpd));
    dnnl_exec_arg_t rargs[] = {{DNNL_ARG_FROM, plain}, {DNNL_ARG_TO, d->wei}};
    DNNL_OK(dnnl_primitive_execute(reorder, stream, 2, rargs));
    DNNL_OK(dnnl_stream_wait(stream));
    DNNL_OK(dnnl_primitive_create(&d->mm, pd));
    dnnl_primitive_destroy(reorder);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_primitive_desc_destroy(pd);
    dnnl_memory_destroy(plain);
    return 0;
}

static void packed_mm_free(packed_mm *d)
{
    dnnl_primitive_destroy(d->mm);
    dnnl_memory_destroy(d->src);
    dnnl_memory_destroy(d->wei);
    dnnl_memory_destroy(d->dst);
}

static void run_dnnl(const gemm *g, void *ctx)
{
    (void)g;
    packed_mm *d = ctx;
    dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, d->src}, {DNNL_ARG_WEIGHTS, d->wei}, {DNNL_ARG_DST, d->dst}};
    dnnl_primitive_execute(d->mm, d->stream, 3, args);
    dnnl_stream_wait(d->stream);
}
#endif

/* us < 0: not measured. mark: '*' or ' ' after the number. */
static void print_cell(double us, char mark)
{
    if (us < 0)
        printf(" %10s", "-");
    else
        printf(" %9.1f%c", us, mark);
}

int main(int argc, char **argv)
{
    (void)argc;
    /* the OpenBLAS kernels tpserve runs on this CPU (blas_pick.h) */
    if (tp_engine_reexec_for_backends(argv) != 0)
        fprintf(stderr, "bench_gemm: re-executing for the OpenBLAS kernels failed; OpenBLAS's own run\n");
    static const int64_t rows[] = {1, 4, 16, 64, 128, 512};
    static const int64_t kn[][2] = {{768, 768}, {768, 2304}, {768, 3072}, {3072, 768}};
    int cores = tp_spin_cores(), small_ok = small_sgemm_supported();
    small_sgemm_init();
    float *a = malloc(sizeof(float) * 512 * 3072), *b = malloc(sizeof(float) * 3072 * 3072),
          *c = malloc(sizeof(float) * 512 * 3072), *ref = malloc(sizeof(float) * 512 * 3072);
    if (!a || !b || !c || !ref)
        return 1;
    /* values in [-0.1, 0.1], no pattern a kernel could exploit */
    for (int64_t i = 0; i < 3072 * 3072; i++) {
        if (i < 512 * 3072)
            a[i] = (float)(i * 7919 % 2001 - 1000) * 1e-4f;
        b[i] = (float)(i * 104729 % 1999 - 999) * 1e-4f;
    }
    printf("bench_gemm: OpenBLAS %s kernels, %d usable cores; us per call: 1t columns CPU time (median of %d), "
           "Nt wall time (fastest of %d)%s\n", openblas_get_corename(), cores, SAMPLES, SAMPLES,
           small_ok ? "" : "; small kernel: no AVX2/FMA here");
#ifdef TP_BENCH_DNNL
    const dnnl_version_t *v = dnnl_version();
    printf("oneDNN %d.%d.%d, weights reordered once into the layout its matmul picks\n", v->major, v->minor,
           v->patch);
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&stream, eng, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "bench_gemm: no oneDNN cpu engine\n");
        return 1;
    }
#else
    printf("oneDNN: not built in (install libdnnl-dev, then make bench-gemm)\n");
#endif
    int packed_ok = pgemm_supported();
    float *panels = packed_ok ? aligned_alloc(64, sizeof(float) * pgemm_packed_floats(3072, 3072)) : NULL;
    float *scratch = packed_ok ? malloc(sizeof(float) * pgemm_packed_a_floats(512, 3072)) : NULL; /* the most pgemm_run takes here */
    if (packed_ok && (!panels || !scratch)) {
        fprintf(stderr, "bench_gemm: out of memory\n");
        return 1;
    }
    printf("%5s %5s %5s %10s %10s %10s %10s %10s %10s %10s %10s %10s\n", "M", "K", "N", "openblas1t", "openblasNt",
           "sgemv1t", "small1t", "packed1t", "onednn1t", "onednnNt", "packed_err", "dnnl_err");
    for (size_t s = 0; s < sizeof kn / sizeof kn[0]; s++)
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            gemm g = {rows[r], kn[s][0], kn[s][1], a, b, c};
            double t[7] = {-1, -1, -1, -1, -1, -1, -1}, err = -1, packed_err = -1;
            openblas_set_num_threads(1);
            t[0] = time_us(run_openblas, &g, NULL, 1);
            memcpy(ref, c, sizeof(float) * (size_t)(g.M * g.N));
            openblas_set_num_threads(cores);
            t[1] = cores > 1 ? time_us(run_openblas, &g, NULL, cores) : -1;
            openblas_set_num_threads(1);
            if (g.M == 1)
                t[2] = time_us(run_gemv, &g, NULL, 1);
            if (small_ok)
                t[3] = time_us(run_small, &g, NULL, 1);
            if (packed_ok) {
                packed_ctx p = {panels, scratch};
                pgemm_pack(g.b, g.K, g.N, g.N, 1, panels);
                t[4] = time_us(run_packed, &g, &p, 1);
                packed_err = rel_err(c, ref, g.M * g.N);
            }
#ifdef TP_BENCH_DNNL
            packed_mm d;
            if (packed_mm_init(&d, eng, stream, &g) == 0) {
                omp_set_num_threads(1);
                t[5] = time_us(run_dnnl, &g, &d, 1);
                omp_set_num_threads(cores);
                t[6] = cores > 1 ? time_us(run_dnnl, &g, &d, cores) : -1;
                err = rel_err(c, ref, g.M * g.N);
                packed_mm_free(&d);
            }
#endif
            printf("%5lld %5lld %5lld", (long long)g.M, (long long)g.K, (long long)g.N);
            for (int k = 0; k < 7; k++)
                print_cell(t[k], k == 3 && small_sgemm_takes(g.M, g.N, g.K) ? '*' : ' ');
            print_err(packed_err);
            print_err(err);
            printf("\n");
        }
#ifdef TP_BENCH_DNNL
    dnnl_stream_destroy(stream);
    dnnl_engine_destroy(eng);
#endif
    free(a);
    free(b);
    free(c);
    free(ref);
    free(panels);
    free(scratch);
    return 0;
}
