/* heap.h — a first-fit allocator over a caller-given region of memory.
 *
 * The cpu backend of a process rank group carves each rank's memory out of
 * that rank's part of the shared mapping. The region only holds the data:
 * the bookkeeping (which blocks are used) lives in this process's private
 * memory, so peers that map the same region read the data and never see,
 * or race with, the allocator's state. Each region has exactly one owning
 * process that allocates in it.
 *
 * Every block is CPU_HEAP_ALIGN-aligned (in this process's mapping) and a
 * multiple of CPU_HEAP_ALIGN long. Freed blocks merge with free neighbours.
 * Not thread-safe: the caller serializes calls on one heap. */
#ifndef TP_CPU_HEAP_H
#define TP_CPU_HEAP_H

#include <stddef.h>

#include "status.h"

#define CPU_HEAP_ALIGN 64

typedef struct cpu_heap cpu_heap;

/* Manages [base, base + bytes). Fails when the region holds no aligned block. */
cpu_heap *cpu_heap_create(void *base, size_t bytes, tp_err *err);
/* Frees the bookkeeping only; the region is the caller's. */
void cpu_heap_destroy(cpu_heap *h);

/* A block of at least `bytes` (0 gives a distinct, freeable block of
 * CPU_HEAP_ALIGN bytes). TP_NOMEM with "heap of N bytes cannot fit M more
 * bytes (...)" when no free block is large enough. */
tp_status cpu_heap_alloc(cpu_heap *h, size_t bytes, void **out, tp_err *err);
/* p must be a live block of this heap (TP_INVALID otherwise; nothing changes). */
tp_status cpu_heap_free(cpu_heap *h, void *p, tp_err *err);

/* Usable bytes: the region after aligning its start, rounded down to the alignment. */
size_t cpu_heap_capacity(const cpu_heap *h);
/* Bytes in live blocks (rounded sizes). */
size_t cpu_heap_used(const cpu_heap *h);
size_t cpu_heap_largest_free(const cpu_heap *h);
/* Number of blocks, used and free (1 for an empty heap: free lists coalesce). */
int cpu_heap_blocks(const cpu_heap *h);

#endif
