/* rank_procs.h — the process half of a rank group (see rank_group.h): the
 * shared memory, its control block, the workers' lifecycle and the lockstep
 * message protocol. Only rank_group.c uses it. */
#ifndef TP_RANK_PROCS_H
#define TP_RANK_PROCS_H

#include <stddef.h>
#include <stdint.h>

#include "rank_group.h"

typedef struct tp_rank_procs tp_rank_procs;

enum { TP_MSG_RUN = 1, TP_MSG_SHARE, TP_MSG_CMD, TP_MSG_QUIT };
enum { TP_POLL_ABORT = 1, TP_POLL_LOST = 2 };

/* Leader: creates the memory and starts (or accepts) ranks 1..d-1, returning
 * once all have joined. Worker: joins from TP_GROUP_FD or the rendezvous.
 * Its waits inside a step spin for spin_ns before they sleep. */
tp_status tp_rank_procs_create(const tp_rank_group_opts *o, int64_t spin_ns, tp_rank_procs **out, tp_err *err);
/* The rendezvous. Any local process that can reach the socket may
 * connect, so the leader admits a joiner in two checks, each refusing with
 * why, a terminated line ("error: ...") sent back to the joiner as it is,
 * and neither taking a rank's slot unless both pass.
 *
 * First who it is: tp_rank_uid_check of the joiner's uid, the kernel's
 * (SO_PEERCRED), before a byte is read from it: it must be own_uid (the
 * leader's) or join_uid (-1: none). Returns 1 to go on, or 0 with why.
 *
 * Then what it says, its hello: its first TP_RANK_HELLO_BYTES bytes,
 * carrying the group secret (TP_RANK_SECRET_CHARS hex digits, compared in
 * constant time) before anything else is looked at. tp_rank_hello_check
 * checks the n bytes it got against a group of `world` processes whose
 * secret is `secret`, where joined[r] is rank r's pid once it is in (0: it
 * has no number in this pid namespace) and -1 before: returns the rank to
 * admit, or 0 with why. The pid a hello names is never used (the leader
 * asks the kernel). */
enum { TP_RANK_SECRET_CHARS = 64, TP_RANK_HELLO_BYTES = 16 + TP_RANK_SECRET_CHARS };
int tp_rank_uid_check(uint32_t peer_uid, uint32_t own_uid, int join_uid, char *why, size_t cap);
int tp_rank_hello_check(const void *bytes, size_t n, int world, const int32_t *joined, const char *secret, char *why,
                        size_t cap);
/* Leader: tells the workers to quit and reaps them (killing stragglers). */
void tp_rank_procs_stop(tp_rank_procs *p);
void tp_rank_procs_free(tp_rank_procs *p);
int tp_rank_procs_rank(const tp_rank_procs *p);
const tp_rank_shared *tp_rank_procs_shared(const tp_rank_procs *p);
/* Leader: the ranks that have not finished the run step in flight (up to
 * cap of them in ranks[], ascending; rank 0 when only the leader itself is
 * left); returns how many (0: no step in flight), -1 in a worker. */
int tp_rank_procs_pending(tp_rank_procs *p, int *ranks, int cap);
/* NULL while every process is alive, else "rank group lost: why" (set once,
 * never changed after). Checks, so it can turn non-NULL. */
const char *tp_rank_procs_lost(tp_rank_procs *p);
/* The same without looking: only what a check (here or in another process)
 * already found. For the start of a step, which must not pay for waitpid
 * and kill: a step with a dead peer fails in its first wait anyway. */
const char *tp_rank_procs_lost_known(tp_rank_procs *p);

/* Leader: wakes the workers waiting for a message so they spin for the one
 * about to come (tp_rank_group_prewake); nothing where ranks may not spin. */
void tp_rank_procs_prewake(tp_rank_procs *p);
/* Leader only: one message to every worker (waits while a worker is more
 * than a few messages behind). */
tp_status tp_rank_procs_send(tp_rank_procs *p, int kind, const void *buf, size_t len, tp_err *err);
/* Worker only: the next message, which must be of `kind` (or QUIT: *quit). */
tp_status tp_rank_procs_recv(tp_rank_procs *p, int kind, void *buf, size_t cap, size_t *len, int *quit,
                             tp_err *err);

/* Inside a step. poll: TP_POLL_* flags (a rank somewhere failed this step
 * in a way that may leave peers blocked; a process is gone). fail_ticket: a
 * local rank failed — order it among every failure of the step and, when
 * wake_peers (not a benign failure), tell the other processes. */
int tp_rank_procs_poll(tp_rank_procs *p);
uint32_t tp_rank_procs_fail_ticket(tp_rank_procs *p, int wake_peers);
/* Ends the step: the leader merges every process's result (first ticket
 * wins) and publishes it; a worker reports its own and waits for that. */
tp_status tp_rank_procs_finish(tp_rank_procs *p, tp_status st, const tp_err *e, uint32_t ticket, tp_err *err);

#endif
