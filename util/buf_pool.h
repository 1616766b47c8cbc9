/* buf_pool.h — byte buffers of one size that each thread keeps for reuse:
 * the bodies of inference answers and the blocks of small batches' outputs
 * (host_block.h).
 *
 * An answer body (1-4 KB for the example graph) is past malloc's
 * per-thread cache, and one allocated per request, grown by realloc as it
 * was written, took malloc's slow path (_int_malloc, unsorted-bin sorting,
 * fastbin consolidation) on every answer. A buffer given back (by
 * libmicrohttpd's free callback once the answer is sent, on the
 * connection's thread) goes to the giving thread's spares, bounded in
 * number; the spares are freed when the thread ends. */
#ifndef TP_BUF_POOL_H
#define TP_BUF_POOL_H

#include <stddef.h>

/* Every pooled buffer's size: room for a JSON answer of 256 FP32 numbers
 * twice over (a bigger answer moves to a malloc'ed buffer as it grows), or
 * the outputs of a batch of several rows of the example graph. */
#define TP_BUF_POOL_SIZE ((size_t)8 << 10)
#define TP_BUF_POOL_ALIGN 64

/* A buffer of TP_BUF_POOL_SIZE bytes, 64-byte aligned (contents
 * undefined): one of this thread's spares, else a new one. NULL without
 * memory. */
void *tp_buf_pool_take(void);

/* p (from tp_buf_pool_take, on any thread; NULL is ignored) joins this
 * thread's spares, or is freed when they are full. Its signature is
 * libmicrohttpd's free callback's. */
void tp_buf_pool_give(void *p);

/* How many spares this thread keeps now (for tests). */
int tp_buf_pool_spares(void);

#endif
