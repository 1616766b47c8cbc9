/* cpu_backend.h — ranks are threads (or processes sharing one mapping),
 * symmetric memory is ordinary memory every rank can address, and capture
 * records a command list. */
#ifndef TP_CPU_BACKEND_H
#define TP_CPU_BACKEND_H

#include "backend.h"

/* Memory shared by ranks that live in different processes (the process
 * rank group). Every process maps the same memory, possibly at a different
 * address, so anything placed in it is named by its offset from base. */
typedef struct {
    char *base;                     /* this process's mapping */
    size_t comm_offset, comm_bytes; /* the collectives' state */
    size_t heap_offset, heap_bytes; /* rank r's memory: heap_offset + r * heap_bytes */
    int rank_lo, rank_hi;           /* the ranks this process runs: [lo, hi) */
    int owner;                      /* initializes the comm area; its create returns
                                       before any other process's create starts */
} tp_cpu_shared;

/* shared NULL: ranks are threads of this process and memory is malloc'd.
 *
 * shared set: this process runs ranks [rank_lo, rank_hi) (possibly none: a
 * handle that only calls abort/peer_lost/reset); alloc and alloc_symmetric
 * for rank r come from r's heap region, and failing calls name the rank
 * ("rank r: shared heap of N bytes cannot fit M more bytes ..."). A
 * non-owner fails with a clear message when the comm area was not
 * initialized by an owner of the same world size. reset is a no-op except
 * on the owner; peer_lost fails every wait of every process, for good.
 * Tensors given to collectives must be memory of this backend (peers read
 * them through their own mapping); others fail with an error on every rank. */
tp_status tp_cpu_backend_create(int world, const tp_cpu_shared *shared, tp_backend **out, tp_err *err);

/* The registry entry (engine/backend.c). */
extern const tp_backend_kind tp_cpu_backend_kind;

/* Re-run every replay eagerly and compare (setting verify_replay). */
void tp_cpu_backend_verify_replay(tp_backend *b, int on);

/* Bytes of scratch this process's ranks' pools keep (cpu_pool.h): all of
 * it reserved by the captures, so resident once the engine is loaded. */
size_t tp_cpu_backend_scratch_bytes(tp_backend *b);

/* Bytes the comm area needs for world ranks (it must also be 64-byte aligned
 * in every process's mapping). */
size_t tp_cpu_shared_comm_bytes(int world);

#endif
