/* handoff.h — how a submitted request's result reaches the HTTP thread
 * that answers it, and who frees the request when its connection goes
 * first.
 *
 * The result is delivered by whichever thread ran its batch: the HTTP
 * thread itself (inside the submit, or running the requests it held) or
 * the batcher thread. The HTTP thread finds it delivered, or suspends the
 * connection until the deliverer resumes it. And the connection may close
 * before the result comes (a reset read between two of libmicrohttpd's
 * passes, server/http_infer.c: REQ_SUBMITTED) while the batch still holds the
 * request.
 *
 * One atomic word per request, moved by exchanges and compare-exchanges
 * only, so that of two threads acting at once exactly one sees the other's
 * move and does the follow-up, and nobody waits for anybody:
 *   - the deliverer resumes a connection whose suspend is complete, and
 *     frees a request whose connection is gone;
 *   - an HTTP thread whose result came during its suspend call resumes the
 *     connection itself;
 *   - a closing connection frees its request when the result is in, and
 *     otherwise leaves it to the deliverer.
 * The batcher thread used to spin out a suspend in progress: a whole time
 * slice when the HTTP thread was preempted inside it (3-6% of the server's
 * CPU at 32 connections on 2 cores). A closing connection used to wait for
 * the result, holding up its thread's other connections for as long as
 * the queue delay. */
#ifndef TP_HANDOFF_H
#define TP_HANDOFF_H

#include <stdatomic.h>

enum {
    TP_HANDOFF_NONE, /* submitted (set before the submit) */
    TP_HANDOFF_SUSPENDING,
    TP_HANDOFF_SUSPENDED,
    TP_HANDOFF_DELIVERED,
    TP_HANDOFF_ORPHANED /* the connection is gone, the result not in */
};

/* What the deliverer does once the result is in. */
typedef enum { TP_DELIVERED_DONE, TP_DELIVERED_RESUME, TP_DELIVERED_FREE } tp_delivered_then;

/* Before suspending: 1 to go on with the suspend, 0 when the result is in
 * already (answer at once, no suspend). */
static inline int tp_handoff_begin_suspend(_Atomic int *w)
{
    int none = TP_HANDOFF_NONE;
    return atomic_compare_exchange_strong(w, &none, TP_HANDOFF_SUSPENDING);
}

/* After the suspend call: 1 when the deliverer will resume the
 * connection, 0 when the result came during the call (resume it yourself). */
static inline int tp_handoff_end_suspend(_Atomic int *w)
{
    int suspending = TP_HANDOFF_SUSPENDING;
    return atomic_compare_exchange_strong(w, &suspending, TP_HANDOFF_SUSPENDED);
}

/* The result is in (stored before this call). */
static inline tp_delivered_then tp_handoff_deliver(_Atomic int *w)
{
    switch (atomic_exchange(w, TP_HANDOFF_DELIVERED)) {
    case TP_HANDOFF_SUSPENDED:
        return TP_DELIVERED_RESUME;
    case TP_HANDOFF_ORPHANED:
        return TP_DELIVERED_FREE;
    default:
        return TP_DELIVERED_DONE;
    }
}

static inline int tp_handoff_delivered(_Atomic int *w) { return atomic_load(w) == TP_HANDOFF_DELIVERED; }

/* The connection is gone before any suspend: 1 when the result is in (the
 * caller frees the request), 0 when the deliverer will. */
static inline int tp_handoff_orphan(_Atomic int *w)
{
    return atomic_exchange(w, TP_HANDOFF_ORPHANED) == TP_HANDOFF_DELIVERED;
}

#endif
