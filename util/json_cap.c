#include "json_cap.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

static _Atomic int cap_values;
static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

/* This thread's capped stretch: left bytes of allowance while on. */
static _Thread_local struct {
    int on, refused;
    size_t left;
} stretch;

static void *capped_malloc(size_t n)
{
    if (stretch.on) {
        if (n > stretch.left) {
            stretch.refused = 1;
            return NULL;
        }
        stretch.left -= n;
    }
    return malloc(n);
}

/* A free inside a stretch gives nothing back: the allowance bounds what
 * the stretch allocated, which bounds its peak whatever it freed. */
static void install_hook(void) { json_set_alloc_funcs(capped_malloc, free); }

void tp_json_cap_set_values(int max_values)
{
    pthread_once(&hook_once, install_hook);
    atomic_store(&cap_values, max_values > 0 ? max_values : 0);
}

int tp_json_cap_values(void) { return atomic_load(&cap_values); }

size_t tp_json_cap_bytes(size_t text_len)
{
    size_t v = (size_t)atomic_load(&cap_values);
    return v * TP_JSON_CAP_BYTES_PER_VALUE + 6 * text_len;
}

void tp_json_cap_begin(size_t text_len)
{
    stretch.refused = 0;
    stretch.on = atomic_load(&cap_values) > 0;
    stretch.left = tp_json_cap_bytes(text_len);
}

int tp_json_cap_end(void)
{
    int refused = stretch.refused;
    stretch.on = 0;
    stretch.refused = 0;
    return refused;
}
