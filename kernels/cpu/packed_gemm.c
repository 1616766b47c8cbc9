/* packed_gemm.c — see packed_gemm.h. */
#include "packed_gemm.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include <immintrin.h>

/* The kernel's functions are compiled for AVX2 and FMA whatever the
 * build's baseline; only pgemm_supported's CPUs call them. */
#define PGEMM_TARGET __attribute__((target("avx2,fma")))

/* The pair kernel's functions: AVX-512F (and AVX2 and FMA for the
 * functions they inline). */
#define PGEMM_TARGET512 __attribute__((target("avx512f,avx2,fma")))

int pgemm_supported(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

int pgemm_wide_supported(void)
{
    __builtin_cpu_init();
    return pgemm_supported() && __builtin_cpu_supports("avx512f");
}

/* -1: not decided yet (pgemm_wide decides on first use). */
static _Atomic int wide_on = -1;

int pgemm_wide(void)
{
    int on = atomic_load(&wide_on);
    if (on < 0) {
        const char *v = getenv(PGEMM_NARROW_ENV);
        on = pgemm_wide_supported() && !(v && *v && strcmp(v, "0") != 0);
        atomic_store(&wide_on, on);
    }
    return on;
}

int pgemm_set_wide(int on)
{
    int was = pgemm_wide();
    atomic_store(&wide_on, on && pgemm_wide_supported());
    return was;
}

int64_t pgemm_panels(int64_t N) { return (N + PGEMM_NR - 1) / PGEMM_NR; }

size_t pgemm_packed_floats(int64_t K, int64_t N) { return (size_t)(pgemm_panels(N) * PGEMM_NR * K); }

void pgemm_pack(const float *b, int64_t K, int64_t N, int64_t sbk, int64_t sbn, float *dst)
{
    for (int64_t j = 0; j < pgemm_panels(N); j++) {
        float *p = dst + j * K * PGEMM_NR;
        int64_t n0 = j * PGEMM_NR, nn = N - n0 < PGEMM_NR ? N - n0 : PGEMM_NR;
        if (nn < PGEMM_NR)
            memset(p, 0, sizeof(float) * (size_t)(K * PGEMM_NR));
        /* Along b's unit stride, so a load-time pack runs near memory
         * speed: a [K, N] weight's 16 columns are one copy per row; a
         * [N, K] weight is read row by row, K_BLOCK rows of the panel at a
         * time so the lines written stay in L1 across its 16 columns. */
        if (sbn == 1) {
            for (int64_t k = 0; k < K; k++)
                memcpy(p + k * PGEMM_NR, b + k * sbk + n0, sizeof(float) * (size_t)nn);
        } else if (sbk == 1) {
            enum { K_BLOCK = 64 };
            for (int64_t k0 = 0; k0 < K; k0 += K_BLOCK)
                for (int64_t x = 0; x < nn; x++) {
                    const float *src = b + (n0 + x) * sbn;
                    for (int64_t k = k0; k < K && k < k0 + K_BLOCK; k++)
                        p[k * PGEMM_NR + x] = src[k];
                }
        } else {
            for (int64_t k = 0; k < K; k++)
                for (int64_t x = 0; x < nn; x++)
                    p[k * PGEMM_NR + x] = b[k * sbk + (n0 + x) * sbn];
        }
    }
}

/* Rows of the tile that starts r rows before the end of its MC block: MR,
 * but the last 7-9 rows as two tiles (4 + 3, 4 + 4, 5 + 4). A tile of R
 * rows has 2R chains of multiply-adds in flight, and the two FMA units
 * (4 cycles each) need 8 to stay busy: 128 rows as 21 x 6 + 2 ran the last
 * two at half speed (kernel_2, 2.0% of a 128-token request's samples). */
static inline int64_t tile_rows(int64_t r)
{
    return r <= PGEMM_MR ? r : r <= PGEMM_MR + 3 ? (r + 1) / 2 : PGEMM_MR;
}

/* Tiles of an MC block of mc rows: the splits of tile_rows keep
 * ceil(mc / MR). */
static int64_t block_tiles(int64_t mc) { return (mc + PGEMM_MR - 1) / PGEMM_MR; }

/* What a tile prefetches of the next panels' kc-deep slices while it
 * runs: its share of their lines (a panel's slice has one line, 16
 * floats, per k), `lines` from p0 and as many from p1 (the same panel
 * twice when one comes next), one of each at k-steps 0, every, 2 every...
 * The weights stream from memory (a model's do not fit in L3) and the
 * hardware prefetcher starts on a new panel only after its first misses:
 * without this, 40 cold 768 x 3072 weights at 128 rows ran at 133-136
 * GFLOP/s on a Xeon core, against 166-170 for one hot weight; with it,
 * 154-160. Spread over the k loop: issued in one burst before each tile,
 * the same lines stalled on the line fill buffers (8% of a GPT-2
 * request's samples), and a tile alone in its block (a few rows) could
 * not cover a slice. In asm: GCC 12 takes a function whose only effect is
 * _mm_prefetch for one without side effects and deletes its calls
 * (tests/static/prefetch_kept.sh). */
typedef struct {
    const float *p0, *p1;
    int64_t lines, every;
} tile_prefetch;

/* A kernel's progress through its tile_prefetch, in registers: the
 * kernels take the plan by address and read its fields one by one. Passed
 * by value, it was four scalar stores in the caller and one 32-byte load
 * in the kernel, which store forwarding cannot serve: 3.5% of a GPT-2
 * request's samples stalled on that load. */
typedef struct {
    const float *p0, *p1;
    int64_t left, every, next;
} prefetch_run;

static inline __attribute__((always_inline)) prefetch_run prefetch_start(const tile_prefetch *pf)
{
    return (prefetch_run){pf->p0, pf->p1, pf->lines, pf->every, 0};
}

static inline __attribute__((always_inline)) void prefetch_step(prefetch_run *r, int64_t k)
{
    if (k == r->next && r->left > 0) {
        __asm__ volatile("prefetcht0 %0" : : "m"(*r->p0));
        __asm__ volatile("prefetcht0 %0" : : "m"(*r->p1));
        r->p0 += PGEMM_NR, r->p1 += PGEMM_NR, r->left--, r->next += r->every;
    }
}

/* Tile t of `tiles` over a KC block: its share of the slices at next0 and
 * next1 (kc lines each; next0 NULL: nothing comes next). */
static tile_prefetch tile_share(const float *next0, const float *next1, int64_t kc, int64_t t, int64_t tiles)
{
    int64_t per = (kc + tiles - 1) / tiles, l0 = t * per, n = kc - l0 < per ? kc - l0 : per;
    if (!next0 || n <= 0)
        return (tile_prefetch){next0, next0, 0, kc};
    return (tile_prefetch){next0 + l0 * PGEMM_NR, next1 + l0 * PGEMM_NR, n, kc / n};
}

/* c[R x 16] (rows ldc apart) = or += the product of R rows of a (lda
 * apart, kc columns from pa) and a kc-deep slice of a panel of b: R x 2 accumulators,
 * one fused multiply-add each per k. Instantiated with a constant R
 * (kernel_of): R = 6 is the main kernel, 1-5 the last rows of an MC
 * block (tile_rows), so no FMA is spent on rows that do not exist. Each
 * element's chain of operations is the same in every instance. The rows
 * of c are prefetched first: c is written once per KC block, a row of c
 * apart (12 KB for N 3072), which the hardware prefetcher does not
 * follow; without it the kernel ran at 45 GFLOP/s instead of 63 on one
 * EPYC core (128 x 768 x 3072). */
PGEMM_TARGET static inline __attribute__((always_inline)) void kernel_rows(int R, int64_t kc, const float *pa,
                                                                             int64_t lda, const float *pb, float *c,
                                                                             int64_t ldc, int first,
                                                                             const tile_prefetch *pf)
{
    __m256 lo[PGEMM_MR], hi[PGEMM_MR];
    prefetch_run run = prefetch_start(pf);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + PGEMM_NR - 1), _MM_HINT_T0);
        lo[r] = hi[r] = _mm256_setzero_ps();
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++, pa++, pb += PGEMM_NR) {
        prefetch_step(&run, k);
        __m256 b0 = _mm256_load_ps(pb), b1 = _mm256_load_ps(pb + 8);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m256 ar = _mm256_broadcast_ss(pa + r * lda);
            lo[r] = _mm256_fmadd_ps(ar, b0, lo[r]);
            hi[r] = _mm256_fmadd_ps(ar, b1, hi[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *cr = c + r * ldc;
        if (!first) {
            lo[r] = _mm256_add_ps(_mm256_loadu_ps(cr), lo[r]);
            hi[r] = _mm256_add_ps(_mm256_loadu_ps(cr + 8), hi[r]);
        }
        _mm256_storeu_ps(cr, lo[r]);
        _mm256_storeu_ps(cr + 8, hi[r]);
    }
}

#define KERNEL_R(R)                                                                                         \
    PGEMM_TARGET static void kernel_##R(int64_t kc, const float *pa, int64_t lda, const float *pb, float *c,   \
                                        int64_t ldc, int first, const tile_prefetch *pf)                    \
    {                                                                                                       \
        kernel_rows(R, kc, pa, lda, pb, c, ldc, first, pf);                                                 \
    }
KERNEL_R(1)
KERNEL_R(2)
KERNEL_R(3)
KERNEL_R(4)
KERNEL_R(5)
KERNEL_R(6)

typedef void (*kernel_fn)(int64_t kc, const float *pa, int64_t lda, const float *pb, float *c, int64_t ldc,
                          int first, const tile_prefetch *pf);

/* The kernel for mr rows (1 .. PGEMM_MR). */
static kernel_fn kernel_of(int64_t mr)
{
    static const kernel_fn k[PGEMM_MR + 1] = {NULL, kernel_1, kernel_2, kernel_3, kernel_4, kernel_5, kernel_6};
    return k[mr];
}

/* The same for two adjacent panels at once, 32 columns, in AVX-512
 * registers: c[R x 32] from pb0's and pb1's kc-deep slices (panels j and
 * j + 1, K * NR floats apart). 2R accumulators, one fused multiply-add
 * each per k, in k order, so every element is the chain kernel_rows
 * computes, bit for bit: only the vector width differs. On a core with
 * two 512-bit FMA units this is twice kernel_rows's work per cycle (an
 * Intel Xeon with AVX-512 ran onnxruntime's GPT-2 at 139 ms where the
 * AVX2 kernel took 237). pf: the next pair's lines (tile_prefetch). */
PGEMM_TARGET512 static inline __attribute__((always_inline)) void
kernel_rows_wide(int R, int64_t kc, const float *pa, int64_t lda, const float *pb0, const float *pb1, float *c,
                 int64_t ldc, int first, const tile_prefetch *pf)
{
    __m512 lo[PGEMM_MR], hi[PGEMM_MR];
    prefetch_run run = prefetch_start(pf);
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        _mm_prefetch((const char *)(c + r * ldc), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + PGEMM_NR), _MM_HINT_T0);
        _mm_prefetch((const char *)(c + r * ldc + 2 * PGEMM_NR - 1), _MM_HINT_T0);
        lo[r] = hi[r] = _mm512_setzero_ps();
    }
#pragma GCC unroll 4
    for (int64_t k = 0; k < kc; k++, pa++, pb0 += PGEMM_NR, pb1 += PGEMM_NR) {
        prefetch_step(&run, k);
        __m512 b0 = _mm512_loadu_ps(pb0), b1 = _mm512_loadu_ps(pb1);
#pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 ar = _mm512_set1_ps(pa[r * lda]);
            lo[r] = _mm512_fmadd_ps(ar, b0, lo[r]);
            hi[r] = _mm512_fmadd_ps(ar, b1, hi[r]);
        }
    }
#pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        float *cr = c + r * ldc;
        if (!first) {
            lo[r] = _mm512_add_ps(_mm512_loadu_ps(cr), lo[r]);
            hi[r] = _mm512_add_ps(_mm512_loadu_ps(cr + PGEMM_NR), hi[r]);
        }
        _mm512_storeu_ps(cr, lo[r]);
        _mm512_storeu_ps(cr + PGEMM_NR, hi[r]);
    }
}

#define KERNEL_WIDE_R(R)                                                                                         \
    PGEMM_TARGET512 static void kernel_wide_##R(int64_t kc, const float *pa, int64_t lda, const float *pb0,   \
                                                const float *pb1, float *c, int64_t ldc, int first,            \
                                                const tile_prefetch *pf)                                       \
    {                                                                                                          \
        kernel_rows_wide(R, kc, pa, lda, pb0, pb1, c, ldc, first, pf);                                         \
    }
KERNEL_WIDE_R(1)
KERNEL_WIDE_R(2)
KERNEL_WIDE_R(3)
KERNEL_WIDE_R(4)
KERNEL_WIDE_R(5)
KERNEL_WIDE_R(6)

typedef void (*kernel_wide_fn)(int64_t kc, const float *pa, int64_t lda, const float *pb0, const float *pb1,
                               float *c, int64_t ldc, int first, const tile_prefetch *pf);

static kernel_wide_fn kernel_wide_of(int64_t mr)
{
    static const kernel_wide_fn k[PGEMM_MR + 1] = {NULL,          kernel_wide_1, kernel_wide_2, kernel_wide_3,
                                                   kernel_wide_4, kernel_wide_5, kernel_wide_6};
    return k[mr];
}

/* A tile past c's last column: the kernel into a scratch tile, then the
 * part inside c, stored or added as the kernel would (the same single
 * rounding per element). */
PGEMM_TARGET static void edge_tile(int64_t kc, const float *pa, int64_t lda, const float *pb, float *c,
                                   int64_t ldc, int64_t mr, int64_t nr, int first)
{
    float t[PGEMM_MR * PGEMM_NR] __attribute__((aligned(32)));
    tile_prefetch none = tile_share(NULL, NULL, kc, 0, 1);
    kernel_of(mr)(kc, pa, lda, pb, t, PGEMM_NR, 1, &none);
    for (int64_t r = 0; r < mr; r++)
        for (int64_t x = 0; x < nr; x++)
            c[r * ldc + x] = first ? t[r * PGEMM_NR + x] : c[r * ldc + x] + t[r * PGEMM_NR + x];
}

/* Panels j and j + 1 (both whole) for the rows of one MC block, in the
 * wide kernel. Its tiles share the prefetch of the next pair's slices
 * (next0: panel j + 2 exists below j1; next1: j + 3), each a run of lines
 * spread over its k loop. */
PGEMM_TARGET512 static void run_pair(int64_t mc, int64_t K, int64_t kc, const float *pb, float *c, int64_t ldc,
                                     const float *a, int64_t lda, int next0, int next1, int first)
{
    int64_t tiles = block_tiles(mc), panel = K * PGEMM_NR;
    const float *next = next0 ? pb + 2 * panel : NULL;
    for (int64_t i = 0, t = 0, mr; i < mc; i += mr, t++) {
        mr = tile_rows(mc - i);
        tile_prefetch pf = tile_share(next, next1 ? next + panel : next, kc, t, tiles);
        kernel_wide_of(mr)(kc, a + i * lda, lda, pb, pb + panel, c + i * ldc, ldc, first, &pf);
    }
}

/* Rows of one MC block (a: its first row at the KC block's first column)
 * times panels j0 .. j1 - 1 at one KC block. Pairs of whole panels go to
 * the wide kernel where the CPU has it. */
PGEMM_TARGET static void run_block(int64_t mc, int64_t K, int64_t N, int64_t kc, int64_t k0, const float *packed,
                                   float *c, int64_t ldc, int64_t j0, int64_t j1, const float *a, int64_t lda)
{
    int wide = pgemm_wide();
    for (int64_t j = j0; j < j1; j++) {
        const float *pb = packed + (j * K + k0) * PGEMM_NR;
        int64_t n0 = j * PGEMM_NR, nr = N - n0 < PGEMM_NR ? N - n0 : PGEMM_NR;
        if (wide && j + 1 < j1 && N - n0 >= 2 * PGEMM_NR) {
            run_pair(mc, K, kc, pb, c + n0, ldc, a, lda, j + 2 < j1, j + 3 < j1, k0 == 0);
            j++;
            continue;
        }
        int64_t tiles = block_tiles(mc);
        const float *next = j + 1 < j1 ? pb + K * PGEMM_NR : NULL;
        for (int64_t i = 0, t = 0, mr; i < mc; i += mr, t++) {
            mr = tile_rows(mc - i);
            float *ct = c + i * ldc + n0;
            tile_prefetch pf = tile_share(next, next, kc, t, tiles);
            if (nr == PGEMM_NR)
                kernel_of(mr)(kc, a + i * lda, lda, pb, ct, ldc, k0 == 0, &pf);
            else
                edge_tile(kc, a + i * lda, lda, pb, ct, ldc, mr, nr, k0 == 0);
        }
    }
}

/* Groups as wide as c's block allows took 4-5% off GPT-2's weight
 * products at 128 rows. */
int64_t pgemm_group_panels(int64_t M)
{
    int64_t fit = PGEMM_C_BLOCK_BYTES / ((M > 0 ? M : 1) * PGEMM_NR * (int64_t)sizeof(float));
    return fit > PGEMM_NC_PANELS ? fit : PGEMM_NC_PANELS;
}

/* Loops, outermost first: groups of panels (pgemm_group_panels), KC blocks of
 * k, MC blocks of rows, the group's panels, MR-row tiles. A group's kc x
 * NC slice of b (1 MB) is reused from L3 by every MC block, and its M x
 * NC block of c (2 MB at 512 rows) stays in L3 across the KC blocks.
 * Without groups every MC block streamed all of b from memory and c went
 * to memory between KC blocks: GPT-2's weight products at 512 rows on two
 * threads ran 16% slower, its head (c 103 MB) 25-30%. An MC x KC block of
 * a stays in L2 while the group's panels run over it. */
PGEMM_TARGET void pgemm_run(int64_t M, int64_t K, int64_t N, const float *a, int64_t lda, const float *packed,
                            float *c, int64_t ldc, int64_t p0, int64_t p1)
{
    int64_t group = pgemm_group_panels(M);
    for (int64_t g0 = p0; g0 < p1; g0 += group) {
        int64_t g1 = p1 - g0 < group ? p1 : g0 + group;
        for (int64_t k0 = 0; k0 < K; k0 += PGEMM_KC) {
            int64_t kc = K - k0 < PGEMM_KC ? K - k0 : PGEMM_KC;
            for (int64_t m0 = 0; m0 < M; m0 += PGEMM_MC) {
                int64_t mc = M - m0 < PGEMM_MC ? M - m0 : PGEMM_MC;
                run_block(mc, K, N, kc, k0, packed, c + m0 * ldc, ldc, g0, g1, a + m0 * lda + k0, lda);
            }
        }
    }
}
