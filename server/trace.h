/* trace.h — Triton's trace extension: per-request timestamps of sampled
 * inferences, written to a file, and the settings that drive it
 * (GET/POST /v2[/models/M]/trace/setting; tritonclient's
 * get_trace_settings / update_trace_settings).
 *
 * Settings, every value a string as Triton spells them:
 *   trace_level    ["OFF"] or ["TIMESTAMPS"] (Triton's TENSORS is refused:
 *                  tensors are what /infer answers already)
 *   trace_rate     every N-th inference is traced (N >= 1)
 *   trace_count    traces still to take, -1: no limit; counts down to 0,
 *                  which stops tracing
 *   log_frequency  0: the traces are written to trace_file when the
 *                  server stops (or the file changes); N: every N traces
 *                  go to trace_file.0, trace_file.1, ...
 *   trace_file     where; tracing needs one. Set at startup only
 *                  (--trace-file): an update may name it only as it is,
 *                  so that no client chooses where the server writes
 *   trace_mode     "triton" (the only format written)
 * The model's settings are the global ones except where a model update set
 * its own; a model update with a value null gives that setting back to the
 * global one (one naming nothing gives them all back), a global update
 * with null restores the default.
 *
 * The file is a JSON array with one object per trace: id, model_name,
 * model_version, request_id when the request had one, and timestamps
 * [{"name": ..., "ns": ...}] of the monotonic clock, in Triton's names:
 * HTTP_RECV_START (headers in), HTTP_RECV_END (body in), REQUEST_START and
 * QUEUE_START (decoded, submitted), COMPUTE_START and COMPUTE_INPUT_END
 * (its batch starts: staging is inside the engine run, as the statistics
 * say), COMPUTE_OUTPUT_START and COMPUTE_END (the run ends), REQUEST_END
 * and HTTP_SEND_START (answer encoded), HTTP_SEND_END (sent). A request
 * that failed before a point has no timestamps from there on; one refused
 * before it queued (a bad request) is not sampled at all.
 *
 * While tracing is off, sampling a request costs one atomic load. The
 * file is written on the thread whose trace completes a batch of
 * log_frequency (or at the end): tracing is for looking, not for load.
 *
 * What a client can make the server hold is bounded: at most max_pending
 * traces wait in memory (past it, with log_frequency N the ones held go to
 * the next numbered file early; with 0 the oldest is dropped, counted in
 * tp_trace_dropped and warned of once), and a request id is kept to its
 * first TP_TRACE_REQUEST_ID_MAX bytes. Each file is written to a new
 * temporary of its own (mkostemp: O_EXCL, mode 0600, never through a
 * symlink someone planted) in the target's directory and renamed over
 * the target. */
#ifndef TP_TRACE_H
#define TP_TRACE_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tp_trace tp_trace;

/* What one traced inference went through, tp_now_ns() values; 0: the
 * request never got there. */
typedef struct {
    int64_t recv_start, recv_end, queued, compute_start, compute_end, encoded, sent;
} tp_trace_stamps;

/* The startup settings (the config's trace_* keys). */
typedef struct {
    const char *file; /* NULL or "": no tracing */
    int timestamps;   /* trace_level TIMESTAMPS */
    int64_t rate, count, log_frequency;
    int64_t max_pending; /* traces held unwritten at most; <= 0: TP_TRACE_MAX_PENDING_DEFAULT */
} tp_trace_init;

/* trace_max_pending's default (config.c): 1024 traces of a few hundred
 * bytes each, ids at most TP_TRACE_REQUEST_ID_MAX, well under 1 MiB. */
#define TP_TRACE_MAX_PENDING_DEFAULT 1024
/* A request id is recorded up to this many bytes (cut back to a UTF-8
 * character's start): the id is the client's, of any size, and a trace is
 * held until written. Triton's clients send short ids (a counter, a UUID). */
#define TP_TRACE_REQUEST_ID_MAX 256

/* TP_INVALID: TIMESTAMPS without a file. */
tp_status tp_trace_create(const tp_trace_init *init, tp_trace **out, tp_err *err);
/* Writes the traces still held, then frees. NULL is ok. */
void tp_trace_free(tp_trace *t);

/* The settings as a JSON object (malloc'd; NULL: no memory): the global
 * ones, or (model) the served model's. */
char *tp_trace_settings_json(tp_trace *t, int model);
/* Applies a POST body (a JSON object of settings) to the global or the
 * model's settings: all of it, or nothing and why (TP_PARSE, TP_INVALID).
 * *out: the settings after it, as tp_trace_settings_json. */
tp_status tp_trace_update(tp_trace *t, int model, const char *body, size_t len, char **out, tp_err *err);

/* An inference of the model begins: its trace id (> 0) when it is one to
 * trace, else 0. */
int64_t tp_trace_sample(tp_trace *t);
/* The stamps of trace id (from tp_trace_sample), for the model named;
 * request_id may be NULL (recorded up to TP_TRACE_REQUEST_ID_MAX bytes).
 * Written to the file as log_frequency says. */
void tp_trace_record(tp_trace *t, int64_t id, const char *model, const char *version, const char *request_id,
                     const tp_trace_stamps *s);
/* The bytes of id a trace records: strlen(id) up to TP_TRACE_REQUEST_ID_MAX,
 * less the bytes of a UTF-8 character the limit would cut. A caller holding
 * an id until tp_trace_record copies this much. */
size_t tp_trace_request_id_len(const char *id);
/* Traces taken and never written (over max_pending with log_frequency 0,
 * out of memory, a file that could not be written): /metrics'
 * tpserve_trace_dropped_total. */
uint64_t tp_trace_dropped(tp_trace *t);

#endif
