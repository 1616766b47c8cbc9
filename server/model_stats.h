/* model_stats.h — Triton's statistics extension for the served model:
 * GET /v2/models[/M[/versions/V]]/stats.
 *
 * Per request (as Triton counts them): success and fail (count, and time
 * from the request's arrival to its answer), queue (waiting for its batch),
 * compute_input (decoding the request into tensors), compute_infer (the
 * engine run of its batch) and compute_output (from that run's end to its
 * answer encoded: the batch's outputs split, and the batch's answers
 * encoded up to its own, as Triton's backends count a batch's responses). Per
 * engine execution, by batch size (rows): compute_input (0: the engine run
 * stages the requests' rows itself, counted in compute_infer),
 * compute_infer and compute_output (splitting the outputs back). inference_count counts rows, execution_count engine runs.
 *
 * Updates take a mutex (a few additions per request); readers copy. */
#ifndef TP_MODEL_STATS_H
#define TP_MODEL_STATS_H

#include <stdint.h>

typedef struct tp_model_stats tp_model_stats;

tp_model_stats *tp_model_stats_create(void);
void tp_model_stats_free(tp_model_stats *s);

/* Durations in seconds. */
typedef struct {
    double total, queue, input, infer, output;
} tp_request_times;

void tp_model_stats_success(tp_model_stats *s, const tp_request_times *t);
void tp_model_stats_fail(tp_model_stats *s, double total);
void tp_model_stats_execution(tp_model_stats *s, int64_t rows, double input, double infer,
                              double output);

/* {"model_stats":[{...}]} for this model, or NULL without memory. */
char *tp_model_stats_json(tp_model_stats *s, const char *name, const char *version);

#endif
