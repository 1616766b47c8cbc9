/* grow.h — room for one more element in an array that doubles as it fills
 * (the tables of allocations, captures, signatures and spans).
 *
 *     if (TP_GROW(x->mem, x->cap_mem, x->n_mem, 32) != 0)
 *         return tp_fail(err, TP_NOMEM, "...");
 *     x->mem[x->n_mem++] = a;
 *
 * The array is malloc'ed (or NULL with a capacity of 0); its capacity is an
 * int, starts at `first` and doubles. Without memory (or past INT_MAX
 * elements) the array and its capacity stay as they were. */
#ifndef TP_GROW_H
#define TP_GROW_H

#include <limits.h>
#include <stddef.h>
#include <stdlib.h>

/* arr reallocated to the next capacity after *cap, *cap updated; NULL
 * (nothing changed) without memory. */
static inline void *tp_grow_block(void *arr, int *cap, size_t elem, int first)
{
    int next = *cap ? (*cap <= INT_MAX / 2 ? 2 * *cap : 0) : first;
    void *p = next ? realloc(arr, (size_t)next * elem) : NULL;
    if (p)
        *cap = next;
    return p;
}

/* 0 when arr has room for element n (grown if needed), -1 without memory.
 * arr and cap are lvalues, evaluated more than once. */
#define TP_GROW(arr, cap, n, first)                                                  \
    __extension__({                                                                  \
        int grow_ok_ = (n) < (cap);                                                  \
        if (!grow_ok_) {                                                             \
            void *grow_p_ = tp_grow_block((arr), &(cap), sizeof *(arr), (first));  \
            if (grow_p_) {                                                           \
                (arr) = grow_p_;                                                     \
                grow_ok_ = 1;                                                        \
            }                                                                        \
        }                                                                            \
        grow_ok_ ? 0 : -1;                                                           \
    })

#endif
