/* thread_slot.h — one zeroed object per thread, created on first use and
 * freed (through the slot's destroy function) when the thread ends: what
 * the HTTP threads keep between requests (their spare request records,
 * their last parsed document).
 *
 * pthread keys need a once-only creation, and pthread_once's function
 * takes no argument, so every such cache used to carry its own
 * once-function, key and flag; a slot carries them instead. */
#ifndef TP_THREAD_SLOT_H
#define TP_THREAD_SLOT_H

#include <pthread.h>
#include <stddef.h>

typedef struct {
    void (*destroy)(void *obj); /* the object at thread exit; frees it */
    size_t size;
    pthread_key_t key;
    int state; /* 0: key not created yet, 1: created, -1: creation failed */
} tp_thread_slot;

#define TP_THREAD_SLOT(destroy_fn, obj_size) {(destroy_fn), (obj_size), 0, 0}

/* This thread's object (size bytes, zeroed when created); NULL when the
 * key or the object cannot be created. */
void *tp_thread_slot_get(tp_thread_slot *s);

#endif
