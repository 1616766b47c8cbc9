/* weight_packs.c — see weight_packs.h. A sorted array under a
 * read-write lock: a few hundred entries at most, searched on every
 * matmul, changed only while an engine loads or frees its weights. */
#include "weight_packs.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "huge_pages.h"
#include "narrow_rows.h"
#include "packed_gemm.h"

typedef struct {
    const void *w;
    tp_dtype dt;
    int64_t K, N, sbk, sbn;
    float *panels; /* == w when packed in place */
} pack_entry;

static pthread_rwlock_t lock = PTHREAD_RWLOCK_INITIALIZER;
static pack_entry *entries; /* sorted by w */
static int n_entries, cap_entries;

static pthread_once_t enabled_once = PTHREAD_ONCE_INIT;
static int enabled;

static void read_enabled(void)
{
    const char *v = getenv("TPSERVE_CPU_GEMM");
    enabled = pgemm_supported() && !(v && strcmp(v, "openblas") == 0);
}

tp_status weight_packs_check_setting(tp_err *err)
{
    const char *v = getenv("TPSERVE_CPU_GEMM");
    if (!v || !*v || strcmp(v, "packed") == 0 || strcmp(v, "openblas") == 0)
        return TP_OK;
    return tp_fail(err, TP_INVALID, "TPSERVE_CPU_GEMM=%.40s: not a GEMM of the cpu backend (packed, the default, or "
                   "openblas)", v);
}

int weight_packs_enabled(void)
{
    pthread_once(&enabled_once, read_enabled);
    return enabled;
}

/* The index of the first entry at or after w. */
static int lower_bound(const void *w)
{
    int lo = 0, hi = n_entries;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if ((const void *)entries[mid].w < w)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static tp_status insert(const pack_entry *e, tp_err *err)
{
    pthread_rwlock_wrlock(&lock);
    int at = lower_bound(e->w);
    tp_status st = TP_OK;
    if (at < n_entries && entries[at].w == e->w) {
        st = tp_fail(err, TP_INTERNAL, "weight packs: the weight at %p is already packed", (const void *)e->w);
    } else if (n_entries == cap_entries) {
        int cap = cap_entries ? 2 * cap_entries : 64;
        pack_entry *grown = realloc(entries, sizeof *grown * (size_t)cap);
        if (!grown)
            st = tp_fail(err, TP_NOMEM, "weight packs: out of memory for %d entries", cap);
        else
            entries = grown, cap_entries = cap;
    }
    if (st == TP_OK) {
        memmove(&entries[at + 1], &entries[at], sizeof *entries * (size_t)(n_entries - at));
        entries[at] = *e;
        n_entries++;
    }
    pthread_rwlock_unlock(&lock);
    return st;
}

/* The elements a [K, N] view with strides >= 0 spans, from its first. */
static int64_t view_span(int64_t K, int64_t N, int64_t sbk, int64_t sbn) { return (K - 1) * sbk + (N - 1) * sbn + 1; }

/* Packs an FP16/BF16 view through an FP32 copy of the elements it spans,
 * in w's own order: pgemm_pack then reads it along its unit stride, as
 * for an FP32 weight. The copy lives only while packing. */
static tp_status pack_narrow(const void *w, tp_dtype dt, int64_t K, int64_t N, int64_t sbk, int64_t sbn,
                             float *panels, tp_err *err)
{
    int64_t span = view_span(K, N, sbk, sbn);
    float *wide = malloc(sizeof(float) * (size_t)span);
    if (!wide)
        return tp_fail(err, TP_NOMEM, "weight packs: cannot allocate %zu bytes to widen a %lld x %lld %s weight",
                       sizeof(float) * (size_t)span, (long long)K, (long long)N, tp_dtype_name(dt));
    narrow_rows_load(w, dt, span, wide);
    pgemm_pack(wide, K, N, sbk, sbn, panels);
    free(wide);
    return TP_OK;
}

tp_status weight_packs_add(void *w, tp_dtype dt, int64_t K, int64_t N, int64_t sbk, int64_t sbn, int in_place,
                           tp_err *err)
{
    if (!weight_packs_enabled() || !tp_dtype_is_float(dt) || K < 1 || N < 1 || sbk < 0 || sbn < 0)
        return TP_OK;
    size_t floats = pgemm_packed_floats(K, N);
    float *panels = aligned_alloc(64, (floats * sizeof(float) + 63) & ~(size_t)63);
    tp_advise_huge_pages(panels, floats * sizeof(float));
    if (!panels)
        return tp_fail(err, TP_NOMEM, "weight packs: cannot allocate %zu bytes of panels for a %lld x %lld weight",
                       floats * sizeof(float), (long long)K, (long long)N);
    if (dt == TP_F32) {
        pgemm_pack(w, K, N, sbk, sbn, panels);
    } else {
        tp_status st = pack_narrow(w, dt, K, N, sbk, sbn, panels, err);
        if (st != TP_OK) {
            free(panels);
            return st;
        }
    }
    pack_entry e = {.w = w, .dt = dt, .K = K, .N = N, .sbk = sbk, .sbn = sbn, .panels = panels};
    /* In place only where the panels fit exactly (FP32) and w's memory is
     * aligned for the kernel's loads (the allocators give 64 bytes). */
    if (in_place && dt == TP_F32 && floats == (size_t)(K * N) && ((uintptr_t)w & 31) == 0) {
        memcpy(w, panels, floats * sizeof(float));
        free(panels);
        e.panels = w;
    }
    tp_status st = insert(&e, err);
    if (st != TP_OK && e.panels != w)
        free(e.panels);
    else if (in_place && e.panels != w) /* packed beside: w is dead (an FP16 GPT-2: 170 MB) */
        tp_release_pages(w, (size_t)view_span(K, N, sbk, sbn) * tp_dtype_size(dt));
    return st;
}

const float *weight_packs_find(const void *w, tp_dtype dt, int64_t K, int64_t N, int64_t sbk, int64_t sbn)
{
    const float *found = NULL;
    pthread_rwlock_rdlock(&lock);
    int at = n_entries ? lower_bound(w) : 0;
    if (at < n_entries) {
        const pack_entry *e = &entries[at];
        if (e->w == w && e->dt == dt && e->K == K && e->N == N && e->sbk == sbk && e->sbn == sbn)
            found = e->panels;
    }
    pthread_rwlock_unlock(&lock);
    return found;
}

void weight_packs_forget(const void *w)
{
    pthread_rwlock_wrlock(&lock);
    int at = n_entries ? lower_bound(w) : 0;
    if (at < n_entries && (const void *)entries[at].w == w) {
        if ((const void *)entries[at].panels != entries[at].w)
            free(entries[at].panels);
        memmove(&entries[at], &entries[at + 1], sizeof *entries * (size_t)(n_entries - at - 1));
        n_entries--;
    }
    if (n_entries == 0) { /* the last engine is gone: nothing left for LeakSanitizer */
        free(entries);
        entries = NULL;
        cap_entries = 0;
    }
    pthread_rwlock_unlock(&lock);
}
