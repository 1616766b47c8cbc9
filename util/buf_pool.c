#include "buf_pool.h"

#include <stdlib.h>

#include "thread_slot.h"

/* As many as a thread has answers in flight at 32 connections, with their
 * batches' output blocks; 256 KiB. */
#define SPARES_MAX 32

typedef struct {
    int n;
    void *buf[SPARES_MAX];
} spares;

static void free_spares(void *p)
{
    spares *s = p;
    while (s->n > 0)
        free(s->buf[--s->n]);
    free(s);
}

static tp_thread_slot slot = TP_THREAD_SLOT(free_spares, sizeof(spares));

void *tp_buf_pool_take(void)
{
    spares *s = tp_thread_slot_get(&slot);
    return s && s->n > 0 ? s->buf[--s->n] : aligned_alloc(TP_BUF_POOL_ALIGN, TP_BUF_POOL_SIZE);
}

void tp_buf_pool_give(void *p)
{
    if (!p)
        return;
    spares *s = tp_thread_slot_get(&slot);
    if (s && s->n < SPARES_MAX)
        s->buf[s->n++] = p;
    else
        free(p);
}

int tp_buf_pool_spares(void)
{
    spares *s = tp_thread_slot_get(&slot);
    return s ? s->n : 0;
}
