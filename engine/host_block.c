#include "host_block.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "buf_pool.h"
#include "huge_pages.h"

/* The header sits in the first HEADER bytes of the block's one allocation,
 * the data after it: 64-byte aligned (the staging's alignment), so every
 * element type reads in place. */
#define HEADER 64

struct tp_host_block {
    _Atomic int refs;
    int borrowed; /* the TP_HOST_BORROWED sentinel: never counted, never freed */
    int pooled;   /* a buf_pool.h buffer */
    size_t bytes; /* of the allocation, header included (large blocks) */
};
_Static_assert(sizeof(struct tp_host_block) <= HEADER, "block header outgrew its room");

tp_host_block tp_host_borrowed = {.borrowed = 1};

/* Large blocks released last are kept for the next step's outputs, their
 * data pages marked MADV_FREE: the kernel may take them back (under
 * memory pressure, a cgroup's limit among it) instead of swapping or
 * killing, and otherwise a write reuses them as they are. A fresh block
 * faulted and zeroed every page on its first write, in the ranks' copy of
 * the outputs: 5.1% of the samples of a GPT-2 request at batch 1 (its
 * 26 MB of logits, on huge pages already). At most CACHED blocks and
 * CACHED_BYTES; a block is reused for a need of at least half its size. */
enum { CACHED = 4 };
#define CACHED_BYTES ((size_t)512 << 20)
/* Smaller blocks come from malloc's heap, which serve.c keeps from giving
 * pages back (keep_freed_memory): no faults to save, and a madvise call
 * per answer would cost a small request a syscall. */
#define CACHED_MIN_BYTES ((size_t)1 << 20)
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static tp_host_block *cache[CACHED];

/* The cached block that fits `bytes` best, taken out; NULL: none. */
static tp_host_block *cache_take(size_t bytes)
{
    pthread_mutex_lock(&cache_mu);
    int best = -1;
    for (int i = 0; i < CACHED; i++)
        if (cache[i] && cache[i]->bytes >= bytes && cache[i]->bytes / 2 <= bytes &&
            (best < 0 || cache[i]->bytes < cache[best]->bytes))
            best = i;
    tp_host_block *b = best >= 0 ? cache[best] : NULL;
    if (best >= 0)
        cache[best] = NULL;
    pthread_mutex_unlock(&cache_mu);
    return b;
}

/* Keeps b (released by everyone) for cache_take; 0 when there is no room
 * or the kernel refuses MADV_FREE (it would then stay counted as used). */
static int cache_keep(tp_host_block *b)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = ((uintptr_t)b + HEADER + page - 1) & ~(uintptr_t)(page - 1),
              hi = ((uintptr_t)b + b->bytes) & ~(uintptr_t)(page - 1);
    pthread_mutex_lock(&cache_mu);
    size_t held = b->bytes;
    int slot = -1;
    for (int i = 0; i < CACHED; i++) {
        if (cache[i])
            held += cache[i]->bytes;
        else if (slot < 0)
            slot = i;
    }
    /* the advice before the block is visible to cache_take: once there,
     * another thread may write it, and the advice would drop those writes */
    int ok = slot >= 0 && b->bytes >= CACHED_MIN_BYTES && held <= CACHED_BYTES &&
             madvise((void *)lo, hi - lo, MADV_FREE) == 0;
    if (ok)
        cache[slot] = b;
    pthread_mutex_unlock(&cache_mu);
    return ok;
}

tp_host_block *tp_host_block_create(size_t size, int refs)
{
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded < size || rounded > SIZE_MAX - HEADER)
        return NULL;
    /* A small batch's outputs (one per engine run) take a pooled buffer:
     * an aligned allocation bypasses malloc's per-thread cache every time. */
    int pooled = HEADER + rounded <= TP_BUF_POOL_SIZE;
    tp_host_block *cached = pooled ? NULL : cache_take(HEADER + rounded);
    tp_host_block *b = pooled ? tp_buf_pool_take() : cached ? cached : aligned_alloc(HEADER, HEADER + rounded);
    if (!b)
        return NULL;
    /* A large block is a fresh mapping whose every 4 KiB page faults on
     * first write: copying GPT-2's 103 MB of logits at batch 4 into one
     * was 3.8% of a request's samples, 3.2% in those faults, all on one
     * thread while the others waited. */
    if (!pooled && !cached) {
        tp_advise_huge_pages(b, HEADER + rounded);
        b->bytes = HEADER + rounded;
    }
    b->pooled = pooled;
    atomic_init(&b->refs, refs);
    b->borrowed = 0;
    return b;
}

void *tp_host_block_data(tp_host_block *b) { return (char *)b + HEADER; }

void tp_host_block_retain(tp_host_block *b)
{
    if (b && !b->borrowed)
        atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
}

void tp_host_block_release(tp_host_block *b)
{
    if (!b || b->borrowed)
        return;
    /* acq_rel: the last releaser sees every other holder's use of the bytes */
    if (atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1) {
        if (b->pooled)
            tp_buf_pool_give(b);
        else if (!cache_keep(b))
            free(b);
    }
}
