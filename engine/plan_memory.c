/* plan_memory.c — liveness-based memory planning (ggml-alloc's idea: a
 * value's buffer returns to a free list after its last reader has run, and
 * later values take the best-fitting free block).
 *
 * Invariants:
 *  1. a node's output never shares memory with anything live while it runs
 *     (allocation at time t happens before the frees of time t);
 *  2. pinned values (graph inputs and outputs) are never reused;
 *  3. the symmetric arena is planned from data every rank holds identically,
 *     so its offsets are equal on all ranks; tp_plan_build checks it. */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define ALIGN 64

typedef struct {
    int64_t off, size;
} block;

typedef struct {
    block *b;
    int n;
    int64_t end;
} free_list;

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) & ~(int64_t)(ALIGN - 1); }

static int64_t take(free_list *f, int64_t size)
{
    int best = -1;
    for (int i = 0; i < f->n; i++)
        if (f->b[i].size >= size && (best < 0 || f->b[i].size < f->b[best].size))
            best = i;
    if (best < 0) {
        int64_t off = f->end;
        f->end += size;
        return off;
    }
    int64_t off = f->b[best].off;
    f->b[best].off += size;
    f->b[best].size -= size;
    if (f->b[best].size == 0)
        memmove(&f->b[best], &f->b[best + 1], (size_t)(--f->n - best) * sizeof(block));
    return off;
}

/* Returns a block, merging with its neighbours; the list stays sorted. */
static void give(free_list *f, int64_t off, int64_t size)
{
    int i = 0;
    while (i < f->n && f->b[i].off < off)
        i++;
    memmove(&f->b[i + 1], &f->b[i], (size_t)(f->n - i) * sizeof(block));
    f->b[i] = (block){off, size};
    f->n++;
    if (i + 1 < f->n && f->b[i].off + f->b[i].size == f->b[i + 1].off) {
        f->b[i].size += f->b[i + 1].size;
        memmove(&f->b[i + 1], &f->b[i + 2], (size_t)(f->n - i - 2) * sizeof(block));
        f->n--;
    }
    if (i > 0 && f->b[i - 1].off + f->b[i - 1].size == f->b[i].off) {
        f->b[i - 1].size += f->b[i].size;
        memmove(&f->b[i], &f->b[i + 1], (size_t)(f->n - i - 1) * sizeof(block));
        f->n--;
    }
}

/* (time, item) pairs, so sorting needs no global context. */
typedef struct {
    int time, item;
} event;

static int by_time(const void *a, const void *b)
{
    const event *x = a, *y = b;
    return x->time != y->time ? x->time - y->time : x->item - y->item;
}

static int count_distinct(const tp_mem_item *items, int n)
{
    int distinct = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = items[j].offset == items[i].offset;
        distinct += !seen;
    }
    return distinct;
}

tp_status tp_plan_arena(tp_mem_item *items, int n, int64_t *arena_bytes, int *n_blocks, tp_err *err)
{
    event *alloc = malloc((size_t)(n + 1) * sizeof(event)), *rel = malloc((size_t)(n + 1) * sizeof(event));
    free_list f = {malloc((size_t)(n + 1) * sizeof(block)), 0, 0};
    if (!alloc || !rel || !f.b) {
        free(alloc);
        free(rel);
        free(f.b);
        return tp_fail(err, TP_NOMEM, "plan_memory: out of memory");
    }
    for (int i = 0; i < n; i++) {
        alloc[i] = (event){items[i].first, i};
        rel[i] = (event){items[i].last, i};
    }
    qsort(alloc, (size_t)n, sizeof(event), by_time);
    qsort(rel, (size_t)n, sizeof(event), by_time);
    /* an item whose block passed to an in-place successor is never released */
    char *handed = calloc((size_t)n + 1, 1);
    int ai = 0, ri = 0;
    while (handed && (ai < n || ri < n)) {
        /* a release at time t comes after every allocation at time t */
        if (ai < n && (ri >= n || alloc[ai].time <= rel[ri].time)) {
            tp_mem_item *it = &items[alloc[ai++].item];
            if (it->inplace_of >= 0 && !handed[it->inplace_of]) {
                it->offset = items[it->inplace_of].offset;
                handed[it->inplace_of] = 1;
            } else {
                it->offset = take(&f, align_up(it->bytes ? it->bytes : 1));
            }
        } else {
            int k = rel[ri++].item;
            if (!handed[k])
                give(&f, items[k].offset, align_up(items[k].bytes ? items[k].bytes : 1));
        }
    }
    free(handed);
    *arena_bytes = f.end;
    *n_blocks = count_distinct(items, n);
    free(alloc);
    free(rel);
    free(f.b);
    return TP_OK;
}
