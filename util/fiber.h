/* fiber.h — a few functions run in turn on one thread: each runs until it
 * yields or returns, then the next one that has not returned takes over
 * (round robin), until all have returned.
 *
 * Why: the ranks of a tensor-parallel step that compute a few microseconds
 * between collectives spend more on waking each other's threads (a futex
 * wake, a context switch, tens of microseconds on a virtual machine) than
 * on their math. Run as fibers of the thread that starts the step, a rank
 * waiting for its peers at a barrier yields to them instead: a switch costs
 * a few hundred nanoseconds and wakes nobody.
 *
 * Cooperative: a fiber that never yields holds the thread until it returns,
 * and a fiber must not yield while it holds a lock another one needs. */
#ifndef TP_FIBER_H
#define TP_FIBER_H

#include <stddef.h>

#include "status.h"

typedef struct tp_fibers tp_fibers;
typedef void (*tp_fiber_fn)(void *ctx, int i);

/* n fibers, each with a stack of stack_bytes (0: 8 MiB, a thread's default;
 * reserved, not committed: a stack costs the pages it touches) under a
 * guard page. */
tp_status tp_fibers_create(int n, size_t stack_bytes, tp_fibers **out, tp_err *err);
void tp_fibers_free(tp_fibers *f);

/* Runs fn(ctx, i) for i = 0..n-1 as the fibers of f, starting with 0, and
 * returns once every one has returned. Not reentrant: one run of f at a
 * time, and none from inside a fiber. */
void tp_fibers_run(tp_fibers *f, tp_fiber_fn fn, void *ctx);

/* Inside a run: hands the thread to the next fiber that has not returned
 * and comes back on this one's next turn (at once when it is the only one
 * left). Outside a run: returns at once. */
void tp_fiber_yield(void);

/* Whether the caller runs as a fiber (inside tp_fibers_run on this thread). */
int tp_fiber_running(void);

/* Inside a run: how many of its fibers have returned (a waiter whose peer
 * has returned knows that peer will never arrive). 0 outside a run. */
int tp_fiber_ended(void);

#endif
