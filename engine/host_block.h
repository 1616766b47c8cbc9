/* host_block.h — reference-counted host memory that several tensors' bytes
 * point into: one engine run's outputs live in one block, and each request
 * of the batch gets views of its own rows; the block is freed when the last
 * view is released, whichever request finishes last, on whatever thread.
 *
 * A tensor says how its bytes are held with its owner field (engine.h):
 * NULL for its own malloc'ed buffer, a block it holds one reference on, or
 * TP_HOST_BORROWED for bytes someone else keeps alive (e.g. a request body
 * the tensor is a view into). tp_host_tensors_free does the right thing for
 * each. */
#ifndef TP_HOST_BLOCK_H
#define TP_HOST_BLOCK_H

#include <stddef.h>

typedef struct tp_host_block tp_host_block;

/* The owner of borrowed bytes: retaining and releasing it do nothing. */
extern tp_host_block tp_host_borrowed;
#define TP_HOST_BORROWED (&tp_host_borrowed)

/* size bytes (64-byte aligned) with refs references, one per holder to be;
 * NULL without memory. */
tp_host_block *tp_host_block_create(size_t size, int refs);
void *tp_host_block_data(tp_host_block *b);
/* Thread-safe. Releasing the last reference frees the block; NULL is a
 * no-op for both. */
void tp_host_block_retain(tp_host_block *b);
void tp_host_block_release(tp_host_block *b);

#endif
