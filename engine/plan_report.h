/* plan_report.h — `tpserve plan`: what the compiler made of a graph, as a
 * table for people or one JSON object for tests and tools: the nodes after
 * passes, what each pass changed, each collective's lowering, partitions,
 * hoisted buffers, input copies and the memory plan of the --batch bucket;
 * then every bucket's arenas and the one pool the engine shares among them. */
#ifndef TP_PLAN_REPORT_H
#define TP_PLAN_REPORT_H

#include <stdio.h>

#include "graph.h"
#include "mem_kind.h"
#include "passes.h"

typedef struct {
    int64_t batch;
    int json;
    int dma;                         /* input copies are DMA (the backend's caps) or memcpy */
    const tp_pass_result *passes;    /* TP_PASS_COUNT entries, or NULL */
    const char *padding;             /* NULL: padded into buckets; else why not */
    /* Arenas per bucket (bytes per rank by tp_mem_kind, n_buckets of them,
     * ascending) and the shared pool every bucket's executable binds into
     * (the largest of each kind); n_buckets 0: not reported. */
    int n_buckets;
    const int64_t *bucket;
    const int64_t (*bucket_arena)[TP_MEM_KINDS];
} tp_report_opts;

tp_status tp_plan_report(tp_graph *g, const tp_report_opts *o, FILE *out, tp_err *err);

#endif
