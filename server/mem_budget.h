/* mem_budget.h — one bound on the memory the server holds for requests.
 *
 * Every request's bytes count against one budget while they are held:
 * its body as received (as the buffer grows), its inflated body, its
 * decoded tensors, its outputs and its answer until the answer is sent.
 * A request that would take the total past the budget is refused before
 * the allocation: 503 with Retry-After (the budget is momentarily full),
 * or 413 when the request alone needs more than the whole budget (it
 * never fits). Without it, the only bounds were per request (max_body_bytes)
 * and per connection count, whose product (4096 x 64 MiB) is far past any
 * container's limit: 32 stalled uploads held 1.5 GB, 32 requests asking
 * for large answers from slow readers 1.1 GB.
 *
 * The total is one atomic counter: a request takes and gives back a few
 * times in its life, never per byte. What is not counted is bounded
 * otherwise: each HTTP thread's spare request records (512 KiB), jansson's
 * nodes while a document is parsed (json_cap.h), the engine's arenas and
 * staging (the model's own, measured before the default is derived). */
#ifndef TP_MEM_BUDGET_H
#define TP_MEM_BUDGET_H

#include <stdint.h>

#include "status.h"

typedef struct tp_mem_budget tp_mem_budget;

typedef enum {
    TP_MEM_OK,
    TP_MEM_FULL,      /* not now: 503 with Retry-After */
    TP_MEM_TOO_LARGE, /* never: the request alone passes the budget: 413 */
} tp_mem_verdict;

/* limit in bytes (> 0). NULL without memory. */
tp_mem_budget *tp_mem_budget_create(int64_t limit);
void tp_mem_budget_free(tp_mem_budget *b);

/* What one request holds of a budget. Zeroed: holds nothing; b NULL: no
 * budget (every take succeeds, nothing is counted). */
typedef struct {
    tp_mem_budget *b;
    int64_t held;
    tp_mem_verdict refused; /* the last refusal (TP_MEM_OK: none): the answer's code */
} tp_mem_hold;

/* n more bytes for h's request (n <= 0 gives back -n). On a refusal
 * nothing is taken, the refusal is counted and noted in h->refused. */
tp_mem_verdict tp_mem_take(tp_mem_hold *h, int64_t n);

/* tp_mem_take, failing as a status: TP_OK, or TP_UNAVAILABLE with a
 * message naming what needed the n bytes and the budget (the HTTP code
 * comes from h->refused: 503 or 413). */
tp_status tp_mem_take_for(tp_mem_hold *h, int64_t n, const char *what, tp_err *err);

/* Gives back everything h holds. */
void tp_mem_release(tp_mem_hold *h);

int64_t tp_mem_budget_limit(const tp_mem_budget *b);
/* A new limit (the default is known only once the model is loaded); what
 * requests hold stays theirs. */
void tp_mem_budget_set_limit(tp_mem_budget *b, int64_t limit);
int64_t tp_mem_budget_used(const tp_mem_budget *b);
/* refusals so far: 503s (full) and 413s (too large) */
void tp_mem_budget_refusals(const tp_mem_budget *b, uint64_t *full, uint64_t *too_large);

/* ---- the default --------------------------------------------------------- */

/* The memory limit of this process's cgroup, v2 (memory.max, at the root
 * or under unified/) or v1 (memory/.../memory.limit_in_bytes), the
 * smallest on the way up to the hierarchy's root: what the kernel's OOM
 * killer enforces. self_cgroup and cgroup_root NULL read
 * /proc/self/cgroup and /sys/fs/cgroup (tests pass their own). -1 when
 * none is set or none can be read. */
int64_t tp_mem_cgroup_limit(const char *self_cgroup, const char *cgroup_root);

/* This process's resident memory now (bytes; 0 when unknown). */
int64_t tp_mem_resident(void);

/* The machine's physical memory (bytes; 0 when unknown). */
int64_t tp_mem_machine(void);

/* The budget max_memory_mb 0 means: three quarters of limit (the cgroup's,
 * or the machine's memory without one) less what the process holds now
 * (the model) less reserve (what the budget does not count), and at least
 * TP_MEM_BUDGET_FLOOR. */
#define TP_MEM_BUDGET_FLOOR ((int64_t)64 << 20)
int64_t tp_mem_default_budget(int64_t limit, int64_t resident, int64_t reserve);

#endif
