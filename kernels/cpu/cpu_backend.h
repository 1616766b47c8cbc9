/* cpu_backend.h — ranks are threads, symmetric memory is ordinary memory
 * every thread can address, and capture records a command list. */
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

/* shared NULL: ranks are threads of this process and memory is malloc'd. */
tp_status tp_cpu_backend_create(int world, const tp_cpu_shared *shared, tp_backend **out, tp_err *err);

#endif
