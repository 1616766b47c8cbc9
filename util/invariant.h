/* invariant.h — preconditions as assertions, SQLite's habit: what a
 * function relies on (a lock held, a slot free, sizes agreed) is checked
 * where it is relied on, not only said in a comment. Active in `make asan`
 * and `make DEBUG=1` builds; the default optimized build defines NDEBUG
 * (Makefile), which compiles them out: no cost, and an expression in an
 * assertion must have no effect the program needs. */
#ifndef TP_INVARIANT_H
#define TP_INVARIANT_H

#include <assert.h>
#include <errno.h>
#include <pthread.h>

/* mu is locked. A default (normal) mutex's trylock says EBUSY whoever holds
 * it, so this cannot tell the caller from another thread; but a caller
 * that forgot the lock finds it free, takes it, and the assertion fails. */
#define TP_ASSERT_HELD(mu) assert(pthread_mutex_trylock((pthread_mutex_t *)(mu)) == EBUSY)

#endif
