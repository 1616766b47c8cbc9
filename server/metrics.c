#include "metrics.h"


#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* HTTP statuses 100..599 each get a failure counter: the label set is small
 * and fixed, so no allocation or lock on the request path. */
#define CODE_MIN 100
#define CODE_MAX 599

struct tp_metrics {
    _Atomic uint64_t success;
    _Atomic uint64_t failure[CODE_MAX - CODE_MIN + 1];
    _Atomic uint64_t inference_rows, batches;
    _Atomic uint64_t engine_waits[2]; /* [0] polled, [1] slept */
    _Atomic uint64_t pin_changes[2];  /* [0] unpinned, [1] pinned again */
    _Atomic long inflight, queued;
    _Atomic uint64_t stuck_steps; /* steps that ran past stuck_step_ms */
    _Atomic double step_age;      /* the running step's age, copied before rendering */
    _Atomic uint64_t trace_dropped; /* the trace's own count, copied before rendering */
    _Atomic long shm_regions;
    _Atomic int64_t mem_limit, mem_used; /* the memory budget's, copied before rendering */
    _Atomic uint64_t mem_refusals[2]; /* [0] 503 (full), [1] 413 (too large) */
    tp_gen_stats gen; /* a generation model's scheduler's, copied before rendering (under mu) */
    int have_gen;
    tp_histogram request_s, queue_s, compute_s, batch_rows;
    pthread_mutex_t mu; /* guards es, have_es */
    tp_engine_stats es;
    int have_es;
};

/* Latency buckets from 100 us (a small replay) to 30 s (request_timeout_ms). */
static const double seconds_le[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                    0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                    5,      10,      30};
static const double rows_le[] = {1, 2, 4, 8, 16, 32, 64, 128, 256};
#define LEN(a) ((int)(sizeof a / sizeof a[0]))

/* Failure codes always exported (at 0), so rate() works before the first
 * failure; others appear once they happen. */
static const unsigned preset_codes[] = {400, 404, 413, 500, 503, 504};

void tp_hist_init(tp_histogram *h, const double *le, int n)
{
    h->n = n < TP_HIST_MAX ? n : TP_HIST_MAX;
    for (int i = 0; i < h->n; i++)
        h->le[i] = le[i];
    for (int i = 0; i <= TP_HIST_MAX; i++)
        atomic_init(&h->count[i], 0);
    atomic_init(&h->sum, 0.0);
}

void tp_hist_observe(tp_histogram *h, double v)
{
    int i = 0;
    while (i < h->n && v > h->le[i])
        i++;
    atomic_fetch_add_explicit(&h->count[i], 1, memory_order_relaxed);
    double old = atomic_load_explicit(&h->sum, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(&h->sum, &old, old + v, memory_order_relaxed,
                                                  memory_order_relaxed))
        ;
}

tp_metrics *tp_metrics_create(void)
{
    tp_metrics *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    tp_hist_init(&m->request_s, seconds_le, LEN(seconds_le));
    tp_hist_init(&m->queue_s, seconds_le, LEN(seconds_le));
    tp_hist_init(&m->compute_s, seconds_le, LEN(seconds_le));
    tp_hist_init(&m->batch_rows, rows_le, LEN(rows_le));
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

void tp_metrics_free(tp_metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    free(m);
}

void tp_metrics_request(tp_metrics *m, unsigned code, double seconds)
{
    if (code == 200)
        atomic_fetch_add_explicit(&m->success, 1, memory_order_relaxed);
    else if (code >= CODE_MIN && code <= CODE_MAX)
        atomic_fetch_add_explicit(&m->failure[code - CODE_MIN], 1, memory_order_relaxed);
    tp_hist_observe(&m->request_s, seconds);
}

void tp_metrics_batch(tp_metrics *m, int64_t rows)
{
    atomic_fetch_add_explicit(&m->batches, 1, memory_order_relaxed);
    tp_hist_observe(&m->batch_rows, (double)rows);
}

void tp_metrics_engine_wait(tp_metrics *m, int slept)
{
    atomic_fetch_add_explicit(&m->engine_waits[slept != 0], 1, memory_order_relaxed);
}

void tp_metrics_pin_change(tp_metrics *m, int pinned)
{
    atomic_fetch_add_explicit(&m->pin_changes[pinned != 0], 1, memory_order_relaxed);
}

void tp_metrics_inferred(tp_metrics *m, int64_t rows, double queue_s, double compute_s)
{
    atomic_fetch_add_explicit(&m->inference_rows, (uint64_t)rows, memory_order_relaxed);
    tp_hist_observe(&m->queue_s, queue_s);
    tp_hist_observe(&m->compute_s, compute_s);
}

void tp_metrics_set_gauges(tp_metrics *m, long inflight, long queued)
{
    atomic_store(&m->inflight, inflight);
    atomic_store(&m->queued, queued);
}

void tp_metrics_set_memory(tp_metrics *m, int64_t limit, int64_t used, uint64_t full, uint64_t too_large)
{
    atomic_store(&m->mem_limit, limit);
    atomic_store(&m->mem_used, used);
    atomic_store(&m->mem_refusals[0], full);
    atomic_store(&m->mem_refusals[1], too_large);
}

void tp_metrics_set_generation(tp_metrics *m, const tp_gen_stats *g)
{
    pthread_mutex_lock(&m->mu);
    m->gen = *g;
    m->have_gen = 1;
    pthread_mutex_unlock(&m->mu);
}

void tp_metrics_set_shm_regions(tp_metrics *m, long regions)
{
    atomic_store(&m->shm_regions, regions);
}

void tp_metrics_set_trace_dropped(tp_metrics *m, uint64_t dropped) { atomic_store(&m->trace_dropped, dropped); }

void tp_metrics_stuck_step(tp_metrics *m) { atomic_fetch_add(&m->stuck_steps, 1); }

void tp_metrics_set_step_age(tp_metrics *m, double seconds) { atomic_store(&m->step_age, seconds); }

void tp_metrics_engine_stats(tp_metrics *m, const tp_engine_stats *s)
{
    pthread_mutex_lock(&m->mu);
    m->es = *s;
    m->have_es = 1;
    pthread_mutex_unlock(&m->mu);
}

/* ---- rendering ---------------------------------------------------------- */

typedef struct {
    char *p;
    size_t len, cap;
    int oom;
} sbuf;

static void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void sb_printf(sbuf *b, const char *fmt, ...)
{
    for (;;) {
        if (b->oom)
            return;
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->oom = 1;
            return;
        }
        if (b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap * 2 + (size_t)n;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
}

static void family(sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void counter(sbuf *b, const char *name, const char *help, uint64_t v)
{
    family(b, name, "counter", help);
    sb_printf(b, "%s %llu\n", name, (unsigned long long)v);
}

/* A counter of two series told apart by one label: label="value0" and
 * label="value1" (e.g. ended="spin" and ended="sleep"). */
static void counter_pair(sbuf *b, const char *name, const char *help, const char *label, const char *value0,
                         const char *value1, _Atomic uint64_t *v)
{
    family(b, name, "counter", help);
    sb_printf(b, "%s{%s=\"%s\"} %llu\n", name, label, value0, (unsigned long long)atomic_load(&v[0]));
    sb_printf(b, "%s{%s=\"%s\"} %llu\n", name, label, value1, (unsigned long long)atomic_load(&v[1]));
}

static void gauge(sbuf *b, const char *name, const char *help, long long v)
{
    family(b, name, "gauge", help);
    sb_printf(b, "%s %lld\n", name, v);
}

/* Buckets are cumulative and _count is the +Inf bucket, computed from one
 * read of each bucket so the two always agree even while observing. */
static void histogram(sbuf *b, const char *name, const char *help, tp_histogram *h)
{
    family(b, name, "histogram", help);
    uint64_t cum = 0;
    for (int i = 0; i <= h->n; i++) {
        cum += atomic_load_explicit(&h->count[i], memory_order_relaxed);
        if (i < h->n)
            sb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
        else
            sb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n", name, (unsigned long long)cum);
    }
    sb_printf(b, "%s_sum %.15g\n%s_count %llu\n", name, atomic_load(&h->sum), name,
              (unsigned long long)cum);
}

static int is_preset(unsigned code)
{
    for (int i = 0; i < LEN(preset_codes); i++)
        if (preset_codes[i] == code)
            return 1;
    return 0;
}

static void render_requests(sbuf *b, tp_metrics *m)
{
    counter(b, "tpserve_request_success_total", "Inference requests answered 200.",
            atomic_load(&m->success));
    family(b, "tpserve_request_failure_total", "counter",
           "Inference requests answered with an error, by HTTP status.");
    for (unsigned c = CODE_MIN; c <= CODE_MAX; c++) {
        uint64_t v = atomic_load(&m->failure[c - CODE_MIN]);
        if (v || is_preset(c))
            sb_printf(b, "tpserve_request_failure_total{code=\"%u\"} %llu\n", c,
                      (unsigned long long)v);
    }
    histogram(b, "tpserve_request_duration_seconds",
              "Inference request time from its headers to a ready answer.", &m->request_s);
    gauge(b, "tpserve_inflight_requests",
          "Inference requests accepted and not yet answered (queued, in the engine, encoding).",
          atomic_load(&m->inflight));
    gauge(b, "tpserve_queue_size", "Requests waiting in the batcher queue.",
          atomic_load(&m->queued));
    family(b, "tpserve_engine_step_age_seconds", "gauge",
           "How long the engine step running longest has run (0: none runs); past stuck_step_ms readiness is 503.");
    sb_printf(b, "tpserve_engine_step_age_seconds %.3f\n", atomic_load(&m->step_age));
    counter(b, "tpserve_stuck_steps_total", "Engine steps that ran past stuck_step_ms (each counted once).",
            atomic_load(&m->stuck_steps));
    counter(b, "tpserve_trace_dropped_total",
            "Traces taken and never written: past trace_max_pending with trace_log_frequency 0 (the oldest), "
            "or for want of memory or a writable trace_file.",
            atomic_load(&m->trace_dropped));
    gauge(b, "tpserve_memory_budget_bytes",
          "Memory requests may hold at once (max_memory_mb, or the cgroup limit less the model).",
          atomic_load(&m->mem_limit));
    gauge(b, "tpserve_memory_held_bytes",
          "Memory requests hold now: bodies, inflated bodies, decoded tensors, outputs and answers not yet sent.",
          atomic_load(&m->mem_used));
    counter_pair(b, "tpserve_memory_refusals_total",
                 "Requests refused by the memory budget: 503 when it was full, 413 when one alone passed it.",
                 "code", "503", "413", m->mem_refusals);
    gauge(b, "tpserve_shm_regions",
          "System shared memory regions registered (each holds one open fd; max_shm_regions caps them).",
          atomic_load(&m->shm_regions));
}

static void render_batching(sbuf *b, tp_metrics *m, const tp_engine_stats *es)
{
    counter(b, "tpserve_inference_count_total",
            "Batch rows inferred (a request of batch 4 counts 4).", atomic_load(&m->inference_rows));
    counter(b, "tpserve_execution_count_total",
            "Engine executions (bucket replays); inference_count / execution_count is the "
            "average batch.", es ? es->executions : 0);
    counter(b, "tpserve_serial_step_count_total",
            "Engine steps whose ranks ran in turn on one thread (serial_step_max_us; "
            "loading runs before serial steps are enabled).", es ? es->serial_steps : 0);
    counter(b, "tpserve_batch_count_total", "Batches the batcher sent to the engine.",
            atomic_load(&m->batches));
    histogram(b, "tpserve_batch_size", "Rows per batch sent to the engine.", &m->batch_rows);
    counter_pair(b, "tpserve_engine_wait_total",
                 "Batches held by an HTTP thread that found the engine running another thread's "
                 "batch, by how the wait ended: polling (spin) or asleep (sleep).",
                 "ended", "spin", "sleep", m->engine_waits);
    counter_pair(b, "tpserve_http_thread_pin_changes_total",
                 "pin_threads: HTTP threads unpinned because their CPU starved them while another "
                 "idled, or moved by someone else while pinned (to=\"unpinned\"), and pinned again "
                 "after their time away (to=\"pinned\").",
                 "to", "unpinned", "pinned", m->pin_changes);
    histogram(b, "tpserve_queue_duration_seconds",
              "Time a request waited in the batcher queue before its batch ran.", &m->queue_s);
    histogram(b, "tpserve_compute_duration_seconds",
              "Engine time of the batch each request ran in.", &m->compute_s);
}

static void render_engine(sbuf *b, const tp_engine_stats *es)
{
    family(b, "tpserve_bucket_replays_total", "counter",
           "Engine executions per batch bucket (exact: graphs run at the exact batch).");
    for (int i = 0; es && i < es->n_buckets; i++)
        sb_printf(b, "tpserve_bucket_replays_total{bucket=\"%lld\"} %llu\n",
                  (long long)es->bucket[i], (unsigned long long)es->bucket_runs[i]);
    if (es && es->exact_runs)
        sb_printf(b, "tpserve_bucket_replays_total{bucket=\"exact\"} %llu\n",
                  (unsigned long long)es->exact_runs);
    family(b, "tpserve_input_copy_bytes_total", "counter",
           "Bytes copied into the graph's input slots, by slot memory.");
    sb_printf(b, "tpserve_input_copy_bytes_total{slot=\"symmetric\"} %llu\n",
              (unsigned long long)(es ? es->symmetric_copy_bytes : 0));
    sb_printf(b, "tpserve_input_copy_bytes_total{slot=\"regular\"} %llu\n",
              (unsigned long long)(es ? es->regular_copy_bytes : 0));
    gauge(b, "tpserve_world_size", "Ranks of the served graph.", es ? es->world_size : 0);
    gauge(b, "tpserve_rank_processes", "1 when every rank is its own process (ranks=processes), 0 for threads.",
          es ? es->rank_processes : 0);
    gauge(b, "tpserve_rank_group_up", "1 while every rank can run; 0 once a rank's process or backend died (restart).",
          es ? es->rank_group_up : 0);
    family(b, "tpserve_arena_bytes", "gauge",
           "Device memory per rank of the arena pool every bucket's executable shares (the largest "
           "bucket's plan, grown for a larger exact batch), by arena.");
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        sb_printf(b, "tpserve_arena_bytes{kind=\"%s\"} %lld\n", tp_mem_kind_name((tp_mem_kind)k),
                  (long long)(es ? es->arena_bytes[k] : 0));
}

/* Only for a generation model (the generate extension). */
static void render_generation(sbuf *b, const tp_gen_stats *g)
{
    counter(b, "tpserve_generate_sequences_total", "Sequences accepted by generate and generate_stream.",
            g->sequences);
    counter(b, "tpserve_generate_prompt_tokens_total", "Prompt tokens prefilled.", g->prompt_tokens);
    counter(b, "tpserve_generate_output_tokens_total", "Tokens generated.", g->output_tokens);
    counter(b, "tpserve_generate_steps_total", "Engine steps of the generation scheduler.", g->steps);
    counter(b, "tpserve_generate_step_rows_total",
            "Token rows in those steps (prompt rows and one per running sequence).", g->rows);
    counter(b, "tpserve_generate_cancelled_total", "Sequences whose client went before they ended.",
            g->cancelled);
    counter(b, "tpserve_generate_failed_total", "Sequences ended by a failed step or a shutdown.", g->failed);
    gauge(b, "tpserve_generate_slots", "KV cache slots (generate_slots): sequences generated at once.", g->slots);
    gauge(b, "tpserve_generate_slots_in_use", "Slots held by running sequences.", g->slots_in_use);
    family(b, "tpserve_generate_time_per_output_token_seconds", "summary",
           "Time between a sequence's output tokens after its first, over ended sequences.");
    sb_printf(b, "tpserve_generate_time_per_output_token_seconds_sum %.9g\n", g->decode_s);
    sb_printf(b, "tpserve_generate_time_per_output_token_seconds_count %llu\n",
              (unsigned long long)g->decode_tokens);
}

char *tp_metrics_render(tp_metrics *m, size_t *len)
{
    tp_engine_stats es;
    tp_gen_stats gen;
    pthread_mutex_lock(&m->mu);
    int have = m->have_es, have_gen = m->have_gen;
    es = m->es;
    gen = m->gen;
    pthread_mutex_unlock(&m->mu);
    sbuf b = {malloc(8192), 0, 8192, 0};
    if (!b.p)
        return NULL;
    render_requests(&b, m);
    render_batching(&b, m, have ? &es : NULL);
    render_engine(&b, have ? &es : NULL);
    if (have_gen)
        render_generation(&b, &gen);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    if (len)
        *len = b.len;
    return b.p;
}
