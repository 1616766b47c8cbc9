/* classify.h — Triton's classification extension: an output answered as
 * the top classes of each batch entry, "<value>:<index>" strings, instead
 * of its values (a request output with parameters.classification = N;
 * tritonclient's InferRequestedOutput(name, class_count=N)).
 *
 * As Triton does it: each batch entry (the whole tensor for a graph that
 * is not batched) is ranked as one flat list of classes, index k being the
 * entry's k-th element in row-major order; the answer is a BYTES tensor of
 * shape [batch, min(N, classes)] (or [min(N, classes)]), best first, and
 * <value> is printed as C's "%f" (Triton's std::to_string) for FP32, FP16
 * and BF16 and in decimal for INT32 and INT64. Two rules Triton leaves to
 * std::sort, which keeps neither: equal values rank by index (lower
 * first), and NaN ranks below every number, so an answer never depends on
 * the sort. Triton refuses FP16 and BF16 outputs; tpserve ranks them by
 * their value.
 *
 * Labels (Triton's label_filename): with a labels file for the output,
 * line k names class k and the string is "<value>:<index>:<label>";
 * classes past the file's last line have none. */
#ifndef TP_CLASSIFY_H
#define TP_CLASSIFY_H

#include <stddef.h>
#include <stdint.h>

#include "engine.h"

/* The classes of one output: the strings laid out as the binary tensor
 * data extension carries BYTES elements (each a 4-byte little-endian
 * length, then its bytes), shape [batch, k] or [k]. */
typedef struct {
    char *bytes; /* malloc'ed; tp_classes_free */
    size_t len;
    int ndim;
    int64_t shape[2];
} tp_classes;

/* One output's class labels, read once at startup. */
typedef struct tp_labels tp_labels;

/* Reads path: one label a line, the last line's newline optional, a CR
 * before a newline dropped, empty lines kept (a class without a name).
 * TP_IO when it cannot be read; TP_INVALID for a line that is not UTF-8
 * ("path:N: ..."), as the labels go into JSON answers. */
tp_status tp_labels_load(const char *path, tp_labels **out, tp_err *err);
void tp_labels_free(tp_labels *l);
int64_t tp_labels_count(const tp_labels *l);
const char *tp_labels_path(const tp_labels *l);

/* The top `count` (>= 1) classes of each batch entry of t; batched: t's
 * dim 0 is the batch; labels may be NULL. TP_NOMEM, or TP_INVALID for a
 * tensor without elements to rank. */
tp_status tp_classify(const tp_host_tensor *t, int batched, int64_t count, const tp_labels *labels,
                      tp_classes *out, tp_err *err);
void tp_classes_free(tp_classes *c);

#endif
