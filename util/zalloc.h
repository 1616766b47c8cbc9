/* zalloc.h — calloc for the per-request path.
 *
 * glibc before 2.40 (Debian 12 has 2.36) serves calloc from the arena
 * every time, under the arena's lock: it never takes a chunk from the
 * thread's own cache (tcache) the way malloc does. A request allocated
 * eight or so small zeroed records (its decoded inputs and outputs, its
 * job, its batch's outputs, its answer's pieces), so those went through
 * _int_malloc and its lock while malloc of the same sizes would not have:
 * malloc and memset instead (kept apart: see tp_zalloc). */
#ifndef TP_ZALLOC_H
#define TP_ZALLOC_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* n zeroed objects of size bytes; NULL when out of memory or n * size
 * overflows, as calloc. */
static inline void *tp_zalloc(size_t n, size_t size)
{
    if (size && n > SIZE_MAX / size)
        return NULL;
    void *p = malloc(n * size);
    /* p opaque to the compiler: GCC folds malloc + memset back into calloc */
    __asm__("" : "+r"(p));
    if (p)
        memset(p, 0, n * size);
    return p;
}

#endif
