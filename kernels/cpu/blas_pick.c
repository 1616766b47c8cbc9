/* blas_pick.c — see blas_pick.h. */
#include "blas_pick.h"

#include <pthread.h>
#include <stdlib.h>
#include <strings.h>

char *openblas_get_corename(void);
void openblas_set_num_threads(int num_threads);

int tp_blas_threads_per_rank(int world, int cores)
{
    return world > 0 && cores > world ? cores / world : 1;
}

/* The count OpenBLAS runs with (running; 0: OpenBLAS's own until the
 * first call sets one) and the calls running on it (users), apart from
 * the count set for large products (wanted). */
static pthread_mutex_t count_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t count_free = PTHREAD_COND_INITIALIZER;
static int wanted = 1, running, users;

void tp_blas_set_threads(int threads)
{
    pthread_mutex_lock(&count_mu);
    wanted = threads > 1 ? threads : 1;
    while (users)
        pthread_cond_wait(&count_free, &count_mu);
    openblas_set_num_threads(wanted); /* starts the threads now, not in a step */
    running = wanted;
    pthread_mutex_unlock(&count_mu);
}

int tp_blas_threads(void)
{
    pthread_mutex_lock(&count_mu);
    int n = wanted;
    pthread_mutex_unlock(&count_mu);
    return n;
}

int tp_blas_product_threads(int64_t M, int64_t N, int64_t K, int threads)
{
    if (threads <= 1 || M < TP_BLAS_THREADED_MIN_ROWS)
        return 1;
    /* N, K fit BLAS's int (ops_sgemm checks), so N * K fits int64; M * N * K
     * might not */
    return N * K >= (TP_BLAS_THREADED_MIN_MACS + M - 1) / M ? threads : 1;
}

static _Thread_local int one_thread;

int tp_blas_one_thread(int on)
{
    int was = one_thread;
    one_thread = on;
    return was;
}

int tp_blas_call_begin(int64_t M, int64_t N, int64_t K)
{
    pthread_mutex_lock(&count_mu);
    int n = one_thread ? 1 : tp_blas_product_threads(M, N, K, wanted);
    while (users && running != n)
        pthread_cond_wait(&count_free, &count_mu);
    if (running != n) {
        openblas_set_num_threads(n);
        running = n;
    }
    users++;
    pthread_mutex_unlock(&count_mu);
    return n;
}

void tp_blas_call_end(void)
{
    pthread_mutex_lock(&count_mu);
    if (--users == 0)
        pthread_cond_broadcast(&count_free);
    pthread_mutex_unlock(&count_mu);
}

unsigned tp_cpu_blas_features(void)
{
    __builtin_cpu_init();
    unsigned f = 0;
    if (__builtin_cpu_supports("avx"))
        f |= TP_CPU_AVX;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        f |= TP_CPU_AVX2_FMA;
    /* libgcc answers avx512f only when the OS saves the AVX-512 state */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512cd"))
        f |= TP_CPU_AVX512;
    if (__builtin_cpu_supports("avx512bf16"))
        f |= TP_CPU_AVX512_BF16;
    return f;
}

/* OpenBLAS 0.3.21's x86-64 core names (driver/others/dynamic.c) by the
 * newest instructions their kernels use: 1 SSE, 2 AVX, 3 AVX2, 4 AVX-512,
 * 5 AVX-512 with BF16. */
static const struct {
    const char *name;
    int level;
} cores[] = {
    {"Unknown", 1},     {"Katmai", 1},      {"Coppermine", 1}, {"Northwood", 1},    {"Prescott", 1},
    {"Banias", 1},      {"Atom", 1},        {"Core2", 1},      {"Penryn", 1},       {"Dunnington", 1},
    {"Nehalem", 1},     {"Athlon", 1},      {"Opteron", 1},    {"Opteron_SSE3", 1}, {"Barcelona", 1},
    {"Nano", 1},        {"Bobcat", 1},      {"Sandybridge", 2}, {"Bulldozer", 2},   {"Piledriver", 2},
    {"Steamroller", 2}, {"Haswell", 3},     {"Excavator", 3},  {"Zen", 3},          {"SkylakeX", 4},
    {"Cooperlake", 5},  {"SapphireRapids", 5},
};

static int level_of(const char *name)
{
    for (size_t i = 0; name && i < sizeof cores / sizeof cores[0]; i++)
        if (strcasecmp(name, cores[i].name) == 0)
            return cores[i].level;
    return 0;
}

const char *tp_blas_core_upgrade(const char *detected, unsigned features)
{
    int have = level_of(detected);
    if (!have)
        return NULL; /* a name this table does not know: a newer OpenBLAS, trust it */
    const char *best = (features & TP_CPU_AVX512) && (features & TP_CPU_AVX512_BF16) ? "Cooperlake"
                       : features & TP_CPU_AVX512                                    ? "SkylakeX"
                       : features & TP_CPU_AVX2_FMA                                  ? "Haswell"
                       : features & TP_CPU_AVX                                       ? "Sandybridge"
                                                                                     : NULL;
    return level_of(best) > have ? best : NULL;
}

int tp_blas_pick_for_exec(void)
{
    if (getenv("OPENBLAS_CORETYPE"))
        return 0;
    const char *detected = openblas_get_corename();
    const char *pick = tp_blas_core_upgrade(detected, tp_cpu_blas_features());
    if (!pick || setenv(TP_BLAS_DETECTED_ENV, detected, 1) != 0)
        return 0;
    if (setenv("OPENBLAS_CORETYPE", pick, 1) != 0) {
        unsetenv(TP_BLAS_DETECTED_ENV);
        return 0;
    }
    return 1;
}
