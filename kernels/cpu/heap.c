/* heap.c — first-fit over a sorted array of blocks that tile the region.
 *
 * An array rather than headers inside the region: the region is shared with
 * peer processes that only read it, and a rank's buffers are few and large
 * (a plan's arenas, weights), so O(blocks) scans and memmoves are cheap. */
#include "cpu/heap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t off, size; /* from the aligned start; multiples of CPU_HEAP_ALIGN */
    int used;
} heap_block;

struct cpu_heap {
    char *start; /* aligned */
    size_t capacity, used;
    heap_block *b;
    int n, cap;
};

cpu_heap *cpu_heap_create(void *base, size_t bytes, tp_err *err)
{
    uintptr_t a = (uintptr_t)base, start = (a + CPU_HEAP_ALIGN - 1) & ~(uintptr_t)(CPU_HEAP_ALIGN - 1);
    size_t skip = (size_t)(start - a);
    size_t capacity = base && bytes > skip ? (bytes - skip) & ~(size_t)(CPU_HEAP_ALIGN - 1) : 0;
    if (capacity == 0) {
        tp_fail(err, TP_INVALID, "heap: region of %zu bytes at %p holds no %d-byte aligned block", bytes, base,
                CPU_HEAP_ALIGN);
        return NULL;
    }
    cpu_heap *h = calloc(1, sizeof *h);
    if (h)
        h->b = malloc(16 * sizeof *h->b);
    if (!h || !h->b) {
        free(h);
        tp_fail(err, TP_NOMEM, "heap: out of memory for its bookkeeping");
        return NULL;
    }
    h->start = (char *)start;
    h->capacity = capacity;
    h->cap = 16;
    h->n = 1;
    h->b[0] = (heap_block){0, capacity, 0};
    return h;
}

void cpu_heap_destroy(cpu_heap *h)
{
    if (!h)
        return;
    free(h->b);
    free(h);
}

size_t cpu_heap_capacity(const cpu_heap *h) { return h->capacity; }
size_t cpu_heap_used(const cpu_heap *h) { return h->used; }
int cpu_heap_blocks(const cpu_heap *h) { return h->n; }

size_t cpu_heap_largest_free(const cpu_heap *h)
{
    size_t best = 0;
    for (int i = 0; i < h->n; i++)
        if (!h->b[i].used && h->b[i].size > best)
            best = h->b[i].size;
    return best;
}

tp_status cpu_heap_alloc(cpu_heap *h, size_t bytes, void **out, tp_err *err)
{
    *out = NULL;
    /* round up without overflowing: anything above capacity cannot fit anyway */
    size_t need = bytes > h->capacity ? 0 : (bytes + CPU_HEAP_ALIGN - 1) & ~(size_t)(CPU_HEAP_ALIGN - 1);
    if (bytes == 0)
        need = CPU_HEAP_ALIGN; /* distinct pointers, so every block can be freed */
    int i = 0;
    if (need)
        while (i < h->n && (h->b[i].used || h->b[i].size < need))
            i++;
    if (!need || i == h->n)
        return tp_fail(err, TP_NOMEM, "heap of %zu bytes cannot fit %zu more bytes (%zu in use, largest free block %zu)",
                       h->capacity, bytes, h->used, cpu_heap_largest_free(h));
    if (h->b[i].size > need) { /* split: the tail stays free */
        if (h->n == h->cap) {
            int cap = 2 * h->cap;
            heap_block *nb = realloc(h->b, (size_t)cap * sizeof *nb);
            if (!nb)
                return tp_fail(err, TP_NOMEM, "heap: out of memory for its bookkeeping");
            h->b = nb;
            h->cap = cap;
        }
        memmove(&h->b[i + 2], &h->b[i + 1], (size_t)(h->n - i - 1) * sizeof *h->b);
        h->b[i + 1] = (heap_block){h->b[i].off + need, h->b[i].size - need, 0};
        h->b[i].size = need;
        h->n++;
    }
    h->b[i].used = 1;
    h->used += h->b[i].size;
    *out = h->start + h->b[i].off;
    return TP_OK;
}

/* Removes block i + 1, merging its bytes into block i. */
static void merge_next(cpu_heap *h, int i)
{
    h->b[i].size += h->b[i + 1].size;
    memmove(&h->b[i + 1], &h->b[i + 2], (size_t)(h->n - i - 2) * sizeof *h->b);
    h->n--;
}

tp_status cpu_heap_free(cpu_heap *h, void *p, tp_err *err)
{
    uintptr_t a = (uintptr_t)p, s = (uintptr_t)h->start;
    if (a < s || a - s >= h->capacity)
        return tp_fail(err, TP_INVALID, "heap: %p is not in the region [%p, +%zu)", p, (void *)h->start, h->capacity);
    size_t off = (size_t)(a - s);
    int lo = 0, hi = h->n - 1; /* blocks are sorted by offset */
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (h->b[mid].off <= off)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (h->b[lo].off != off || !h->b[lo].used)
        return tp_fail(err, TP_INVALID, "heap: %p is not a live block (double free or interior pointer)", p);
    h->b[lo].used = 0;
    h->used -= h->b[lo].size;
    if (lo + 1 < h->n && !h->b[lo + 1].used)
        merge_next(h, lo);
    if (lo > 0 && !h->b[lo - 1].used)
        merge_next(h, lo - 1);
    return TP_OK;
}
