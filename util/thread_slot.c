#include "thread_slot.h"

#include <stdlib.h>

static pthread_mutex_t create_mu = PTHREAD_MUTEX_INITIALIZER;

/* The slot's key, created by the first caller (of any thread). */
static int slot_ready(tp_thread_slot *s)
{
    int st = __atomic_load_n(&s->state, __ATOMIC_ACQUIRE);
    if (st)
        return st > 0;
    pthread_mutex_lock(&create_mu);
    if (!s->state)
        __atomic_store_n(&s->state, pthread_key_create(&s->key, s->destroy) == 0 ? 1 : -1, __ATOMIC_RELEASE);
    pthread_mutex_unlock(&create_mu);
    return s->state > 0;
}

void *tp_thread_slot_get(tp_thread_slot *s)
{
    if (!slot_ready(s))
        return NULL;
    void *obj = pthread_getspecific(s->key);
    if (!obj && (obj = calloc(1, s->size)) && pthread_setspecific(s->key, obj) != 0) {
        free(obj);
        obj = NULL;
    }
    return obj;
}
