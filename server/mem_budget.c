#include "mem_budget.h"
#include "sysfile.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct tp_mem_budget {
    _Atomic int64_t limit;
    _Atomic int64_t used;
    _Atomic uint64_t full, too_large;
};

tp_mem_budget *tp_mem_budget_create(int64_t limit)
{
    tp_mem_budget *b = calloc(1, sizeof *b);
    if (b)
        b->limit = limit > 0 ? limit : 1;
    return b;
}

void tp_mem_budget_free(tp_mem_budget *b) { free(b); }

tp_mem_verdict tp_mem_take(tp_mem_hold *h, int64_t n)
{
    tp_mem_budget *b = h->b;
    if (!b || n == 0)
        return TP_MEM_OK;
    if (n < 0) {
        atomic_fetch_add_explicit(&b->used, n, memory_order_relaxed);
        h->held += n;
        return TP_MEM_OK;
    }
    int64_t limit = atomic_load_explicit(&b->limit, memory_order_relaxed);
    if (h->held + n > limit) {
        atomic_fetch_add_explicit(&b->too_large, 1, memory_order_relaxed);
        return h->refused = TP_MEM_TOO_LARGE;
    }
    /* one add, undone when it passed: cheaper than a compare-exchange loop
     * under contention, and a refusal is rare */
    if (atomic_fetch_add_explicit(&b->used, n, memory_order_relaxed) + n > limit) {
        atomic_fetch_sub_explicit(&b->used, n, memory_order_relaxed);
        atomic_fetch_add_explicit(&b->full, 1, memory_order_relaxed);
        return h->refused = TP_MEM_FULL;
    }
    h->held += n;
    return TP_MEM_OK;
}

tp_status tp_mem_take_for(tp_mem_hold *h, int64_t n, const char *what, tp_err *err)
{
    tp_mem_verdict v = tp_mem_take(h, n);
    if (v == TP_MEM_OK)
        return TP_OK;
    long long mib = (long long)(tp_mem_budget_limit(h->b) >> 20);
    if (v == TP_MEM_TOO_LARGE)
        return tp_fail(err, TP_UNAVAILABLE, "%s: the request would hold %lld bytes, more than the server's "
                       "whole memory budget (%lld MiB, max_memory_mb)", what, (long long)(h->held + n), mib);
    return tp_fail(err, TP_UNAVAILABLE, "%s: %lld more bytes do not fit in the server's memory budget now "
                   "(%lld of %lld MiB held by requests in flight): retry later", what, (long long)n,
                   (long long)(tp_mem_budget_used(h->b) >> 20), mib);
}

void tp_mem_release(tp_mem_hold *h)
{
    if (h->b && h->held)
        atomic_fetch_sub_explicit(&h->b->used, h->held, memory_order_relaxed);
    h->held = 0;
}

int64_t tp_mem_budget_limit(const tp_mem_budget *b)
{
    return atomic_load_explicit(&((tp_mem_budget *)b)->limit, memory_order_relaxed);
}

void tp_mem_budget_set_limit(tp_mem_budget *b, int64_t limit)
{
    atomic_store_explicit(&b->limit, limit > 0 ? limit : 1, memory_order_relaxed);
}

int64_t tp_mem_budget_used(const tp_mem_budget *b)
{
    return atomic_load_explicit(&((tp_mem_budget *)b)->used, memory_order_relaxed);
}

void tp_mem_budget_refusals(const tp_mem_budget *b, uint64_t *full, uint64_t *too_large)
{
    tp_mem_budget *m = (tp_mem_budget *)b;
    *full = atomic_load_explicit(&m->full, memory_order_relaxed);
    *too_large = atomic_load_explicit(&m->too_large, memory_order_relaxed);
}

/* ---- the default --------------------------------------------------------- */

/* A limit file's value: "max" (v2) or a number; v1's "no limit" is a
 * number near INT64_MAX. -1 for none. */
static int64_t read_limit(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    char buf[64] = "";
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok || strncmp(buf, "max", 3) == 0)
        return -1;
    char *end;
    unsigned long long v = strtoull(buf, &end, 10);
    if (end == buf || v >= (1ULL << 62))
        return -1;
    return (int64_t)v;
}

static int64_t smaller(int64_t a, int64_t b) { return a < 0 ? b : b < 0 ? a : a < b ? a : b; }

/* The smallest limit in file `name` of dir and each parent up to base. */
static int64_t limit_on_path(const char *base, const char *rel, const char *name)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s%s", base, rel);
    int64_t best = -1;
    for (;;) {
        char file[4200];
        snprintf(file, sizeof file, "%s/%s", dir, name);
        best = smaller(best, read_limit(file));
        char *slash = strrchr(dir, '/');
        if (!slash || (size_t)(slash - dir) < strlen(base))
            break;
        *slash = '\0';
    }
    return best;
}

int64_t tp_mem_cgroup_limit(const char *self_cgroup, const char *cgroup_root)
{
    const char *root = cgroup_root ? cgroup_root : "/sys/fs/cgroup";
    FILE *f = fopen(self_cgroup ? self_cgroup : "/proc/self/cgroup", "r");
    if (!f)
        return -1;
    int64_t best = -1;
    char line[4096];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        /* "0::/path" (v2) or "N:memory:/path" (v1, maybe with other controllers) */
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        const char *ctrls = c1 + 1, *rel = c2 + 1;
        char base[4200];
        if (*ctrls == '\0') {
            /* v2: the unified hierarchy at the root, or under unified/ beside v1 */
            snprintf(base, sizeof base, "%s", root);
            best = smaller(best, limit_on_path(base, strcmp(rel, "/") ? rel : "", "memory.max"));
            snprintf(base, sizeof base, "%s/unified", root);
            best = smaller(best, limit_on_path(base, strcmp(rel, "/") ? rel : "", "memory.max"));
        } else if (strstr(ctrls, "memory")) {
            snprintf(base, sizeof base, "%s/memory", root);
            best = smaller(best, limit_on_path(base, strcmp(rel, "/") ? rel : "", "memory.limit_in_bytes"));
        }
    }
    fclose(f);
    return best;
}

int64_t tp_mem_resident(void)
{
    long long v[2]; /* size, resident (pages) */
    return tp_sysfile_ints("/proc/self/statm", v, 2) == 2 ? (int64_t)v[1] * sysconf(_SC_PAGESIZE) : 0;
}

int64_t tp_mem_machine(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (int64_t)pages * page : 0;
}

int64_t tp_mem_default_budget(int64_t limit, int64_t resident, int64_t reserve)
{
    if (limit < 0)
        limit = tp_mem_machine();
    /* a quarter left for what no budget sees: the allocator's own overhead
     * and free lists, socket buffers and page cache the cgroup also counts */
    int64_t b = (limit - resident - reserve) / 4 * 3;
    return b > TP_MEM_BUDGET_FLOOR ? b : TP_MEM_BUDGET_FLOOR;
}
