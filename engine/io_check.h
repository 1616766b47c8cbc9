#ifndef TP_IO_CHECK_H
#define TP_IO_CHECK_H

/* The one check of a request's tensors against a model's inputs (names,
 * datatypes, shapes, byte counts) and its one set of messages. The engine
 * runs it on every tp_engine_infer / tp_engine_check_inputs; the KServe codec
 * runs the same functions while decoding (it must know a shape is sane before
 * it sizes a buffer), so a client sees the same words for the same fault
 * whichever layer caught it. */

#include <stddef.h>

#include "engine.h"

/* Index of the input named name in io[0..n), or -1. */
int tp_io_find(const tp_io_desc *io, int n, const char *name);
/* "'x', 'n'": every name of io[0..n) for messages (truncated to len). */
const char *tp_io_names(char *buf, size_t len, const tp_io_desc *io, int n);

/* The messages of the name faults. */
tp_status tp_io_fail_unknown(tp_err *err, const char *model, const tp_io_desc *io, int n, const char *name);
tp_status tp_io_fail_missing(tp_err *err, const char *model, const tp_io_desc *io, int n, int missing);
tp_status tp_io_fail_repeated(tp_err *err, const char *name);

tp_status tp_io_check_dtype(const tp_io_desc *d, tp_dtype got, tp_err *err);
/* The shape must equal d's except where d says -1 (the batch dim), which
 * must not be 0 (an empty request); a shape whose byte count could overflow
 * is refused. A dim the model itself fixes at 0 is allowed. */
tp_status tp_io_check_shape(const tp_io_desc *d, int ndim, const int64_t *shape, tp_err *err);
/* Datatype, shape, and t->nbytes equal to what the shape needs. */
tp_status tp_io_check_tensor(const tp_io_desc *d, const tp_host_tensor *t, tp_err *err);

#endif
