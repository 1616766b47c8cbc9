/* plan_report.h — `tpserve plan`: what the compiler made of a graph, as
 * text for people or one JSON object for tests and tools. */
#ifndef TP_PLAN_REPORT_H
#define TP_PLAN_REPORT_H

#include <stdio.h>

#include "graph.h"

/* Infers g for batch and prints every node (op, inputs, local shape, dtype,
 * strides, contiguity, aliasing). json: one object with "nodes" and room for
 * later sections (passes, partitions, memory). */
tp_status tp_plan_report(tp_graph *g, int64_t batch, int json, FILE *out, tp_err *err);

#endif
