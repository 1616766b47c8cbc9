/* rank_group.h — d persistent rank threads that run one function together.
 *
 * The cpu backend's ranks are these threads; the cuda backend will put a
 * process per GPU behind the same run() shape. When a rank fails, on_fail is
 * called once so the backend can wake peers blocked in a collective: a
 * failure becomes an error on every rank, never a hang. */
#ifndef TP_RANK_GROUP_H
#define TP_RANK_GROUP_H

#include "status.h"

typedef struct tp_rank_group tp_rank_group;
typedef tp_status (*tp_rank_fn)(void *ctx, int rank, tp_err *err);

tp_status tp_rank_group_create(int world, tp_rank_group **out, tp_err *err);
void tp_rank_group_free(tp_rank_group *g);
int tp_rank_group_world(const tp_rank_group *g);

/* Runs fn(ctx, r) on every rank r and waits for all. Returns the first
 * failing rank's status and message (prefixed "rank r: "). Not reentrant:
 * callers serialize. */
tp_status tp_rank_group_run(tp_rank_group *g, tp_rank_fn fn, void *ctx, void (*on_fail)(void *),
                            void *fail_ctx, tp_err *err);

#endif
