/* metrics.h — the counters behind GET /metrics, rendered in the Prometheus
 * text exposition format 0.0.4.
 *
 * Hot-path updates are lock-free atomics (HTTP threads, workers and the
 * batcher all record); only the engine's statistics snapshot is copied under
 * a mutex. The engine's own counters are snapshotted by the batcher right
 * after each run, so a scrape never waits for the engine lock while a batch
 * is running. docs/operations.md documents every metric. */
#ifndef TP_METRICS_H
#define TP_METRICS_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "gen_sched.h"

#define TP_HIST_MAX 24

/* A Prometheus histogram: per-bucket counts (not cumulative; cumulated when
 * rendered), the sum of observed values, bucket upper bounds ascending. */
typedef struct {
    int n;
    double le[TP_HIST_MAX];
    _Atomic uint64_t count[TP_HIST_MAX + 1]; /* [n] is the +Inf bucket */
    _Atomic double sum;
} tp_histogram;

void tp_hist_init(tp_histogram *h, const double *le, int n);
void tp_hist_observe(tp_histogram *h, double v);

typedef struct tp_metrics tp_metrics;

tp_metrics *tp_metrics_create(void);
void tp_metrics_free(tp_metrics *m);

/* An inference request answered with an HTTP status (200: success), seconds
 * after its body was complete. */
void tp_metrics_request(tp_metrics *m, unsigned code, double seconds);
/* One batch the batcher sent to the engine, of rows rows. */
void tp_metrics_batch(tp_metrics *m, int64_t rows);
/* One request inferred successfully: its rows, its wait in the batcher
 * queue and the engine time of the batch it ran in. */
void tp_metrics_inferred(tp_metrics *m, int64_t rows, double queue_s, double compute_s);
/* A held batch found the engine busy and waited for it: by polling
 * (slept 0) or asleep (1). */
void tp_metrics_engine_wait(tp_metrics *m, int slept);
/* pin_threads let an HTTP thread go from its CPU (pinned 0), or pinned it
 * again (1). */
void tp_metrics_pin_change(tp_metrics *m, int pinned);
/* Gauges, set by the HTTP layer before rendering. */
void tp_metrics_set_gauges(tp_metrics *m, long inflight, long queued);
/* System shared memory regions registered (each holds an open fd). */
void tp_metrics_set_shm_regions(tp_metrics *m, long regions);
/* Traces taken and never written (tp_trace_dropped), set before rendering. */
void tp_metrics_set_trace_dropped(tp_metrics *m, uint64_t dropped);
/* An engine step ran past stuck_step_ms (counted once per step). */
void tp_metrics_stuck_step(tp_metrics *m);
/* The running engine step's age in seconds (0: none runs), set before
 * rendering. */
void tp_metrics_set_step_age(tp_metrics *m, double seconds);
/* The engine's counters since load (copied). */
void tp_metrics_engine_stats(tp_metrics *m, const tp_engine_stats *s);

/* The exposition text; malloc'ed (caller frees), NULL without memory. */
/* The memory budget (mem_budget.h): its limit, what requests hold, and
 * its refusals (503: full, 413: a request alone too large), copied before
 * rendering. */
void tp_metrics_set_memory(tp_metrics *m, int64_t limit, int64_t used, uint64_t full, uint64_t too_large);

/* A generation model's scheduler's counters (gen_sched.h), copied before
 * rendering; without a call, no tpserve_generate_* family is rendered. */
void tp_metrics_set_generation(tp_metrics *m, const tp_gen_stats *g);

char *tp_metrics_render(tp_metrics *m, size_t *len);

#endif
