#include "host_block.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>

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
};
_Static_assert(sizeof(struct tp_host_block) <= HEADER, "block header outgrew its room");

tp_host_block tp_host_borrowed = {.borrowed = 1};

tp_host_block *tp_host_block_create(size_t size, int refs)
{
    size_t rounded = (size + 63) & ~(size_t)63;
    if (rounded < size || rounded > SIZE_MAX - HEADER)
        return NULL;
    /* A small batch's outputs (one per engine run) take a pooled buffer:
     * an aligned allocation bypasses malloc's per-thread cache every time. */
    int pooled = HEADER + rounded <= TP_BUF_POOL_SIZE;
    tp_host_block *b = pooled ? tp_buf_pool_take() : aligned_alloc(HEADER, HEADER + rounded);
    if (!b)
        return NULL;
    /* A large block is a fresh mapping whose every 4 KiB page faults on
     * first write: copying GPT-2's 103 MB of logits at batch 4 into one
     * was 3.8% of a request's samples, 3.2% in those faults, all on one
     * thread while the others waited. */
    if (!pooled)
        tp_advise_huge_pages(b, HEADER + rounded);
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
        else
            free(b);
    }
}
