/* request_checks.h — checks of a request's values, not only its shapes,
 * that must hold before it joins a batch. A value the kernels reject (an
 * embedding id outside the table) would otherwise fail the engine run of
 * every request batched with it, with an error naming a position in the
 * concatenated batch, that is, another client's data.
 *
 * The checks: every graph input that reaches an embedding's ids
 * (directly, or through views and copies that keep every element) holds
 * ids in [0, rows of the table parameter); one that reaches kv_attention's
 * slot holds 0 .. S (the cache's slots) and its pos 0 .. L - T (the cache
 * length less the row's tokens); a generation graph's input_ids are below
 * its generate.vocab_size. */
#ifndef TP_REQUEST_CHECKS_H
#define TP_REQUEST_CHECKS_H

#include "engine.h"
#include "graph.h"

/* ordered[i] is the request's tensor for graph input i (shapes and dtypes
 * already checked). TP_INVALID names the input, the element of this
 * request's own tensor, the id, the range and the embedding node. */
tp_status tp_check_request_values(const tp_graph *g, const tp_host_tensor *const *ordered, tp_err *err);

#endif
