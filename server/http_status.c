/* Health, server and model metadata, the model's config and statistics,
 * and /metrics (http_ctx.h). */
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "http.h"
#include "http_ctx.h"
#include "log.h"

/* stuck_step_ms: 1 and why in msg while an engine step has run that long
 * (tp_batcher_stuck); whoever sees a stuck step first logs it and counts
 * it, once per step. Any thread; never waits for the engine. */
int http_engine_stuck(tp_http_ctx *h, char *msg, size_t cap)
{
    int64_t t0 = 0;
    if (!h->cfg->stuck_step_ms || !atomic_load(&h->loaded) ||
        !tp_batcher_stuck(h->batcher, h->cfg->stuck_step_ms, tp_now_ns(), &t0, msg, cap))
        return 0;
    int64_t last = atomic_load(&h->stuck_logged);
    if (last != t0 && atomic_compare_exchange_strong(&h->stuck_logged, &last, t0)) {
        atomic_store(&h->stuck_now, 1);
        TP_LOG_W("%s: readiness 503 until it ends", msg);
        tp_metrics_stuck_step(h->metrics);
    }
    return 1;
}

/* Prometheus text format; served while loading and draining too. */
enum MHD_Result http_get_metrics(tp_http_ctx *h, req_ctx *r)
{
    int64_t t0 = 0;
    tp_engine *busy = NULL;
    char why[512];
    http_engine_stuck(h, why, sizeof why); /* counted as soon as it is one */
    tp_metrics_set_step_age(h->metrics, atomic_load(&h->loaded) && tp_batcher_oldest_step(h->batcher, &t0, &busy)
                                            ? (double)(tp_now_ns() - t0) / 1e9
                                            : 0);
    tp_metrics_set_gauges(h->metrics, atomic_load(&h->in_engine),
                          atomic_load(&h->loaded) ? tp_batcher_queued(h->batcher) : 0);
    tp_metrics_set_shm_regions(h->metrics, tp_shm_count(h->shm));
    if (h->gen && atomic_load(&h->loaded)) {
        tp_gen_stats gs;
        tp_gen_get_stats(h->gen, &gs);
        tp_metrics_set_generation(h->metrics, &gs);
    }
    tp_metrics_set_trace_dropped(h->metrics, tp_trace_dropped(h->trace));
    uint64_t full, too_large;
    tp_mem_budget_refusals(h->mem, &full, &too_large);
    tp_metrics_set_memory(h->metrics, tp_mem_budget_limit(h->mem), tp_mem_budget_used(h->mem), full, too_large);
    size_t len = 0;
    char *text = tp_metrics_render(h->metrics, &len);
    if (!text)
        return http_reply_error(h, r, 500, "out of memory rendering /metrics");
    http_log_request(r, 200, NULL);
    return http_send_response(h, r, 200,
                         http_make_response(text, len, 0, "text/plain; version=0.0.4; charset=utf-8", 0));
}

enum MHD_Result http_get_live(tp_http_ctx *h, req_ctx *r)
{
    int up = !atomic_load(&h->broken);
    return http_reply_json(h, r, up ? 200 : 503, tp_kserve_bool_json("live", up));
}

int http_is_ready(tp_http_ctx *h)
{
    return !atomic_load(&h->broken) && atomic_load(&h->state) == SRV_READY;
}

/* Server readiness; model readiness is the same (one model). A stuck
 * engine step (stuck_step_ms) makes it 503 saying why, until it ends. */
enum MHD_Result http_get_ready(tp_http_ctx *h, req_ctx *r)
{
    char why[512];
    if (http_is_ready(h) && http_engine_stuck(h, why, sizeof why))
        return http_reply_error(h, r, 503, "not ready: %s", why);
    return http_reply_json(h, r, http_is_ready(h) ? 200 : 503, tp_kserve_bool_json("ready", http_is_ready(h)));
}

enum MHD_Result http_get_server(tp_http_ctx *h, req_ctx *r)
{
    return http_reply_json(h, r, 200, tp_kserve_server_metadata(TPSERVE_VERSION));
}

enum MHD_Result http_get_model(tp_http_ctx *h, req_ctx *r)
{
    return http_reply_json(h, r, 200, tp_kserve_model_metadata(&h->model));
}

enum MHD_Result http_get_model_config(tp_http_ctx *h, req_ctx *r)
{
    return http_reply_json(h, r, 200, http_generate_annotate(h, tp_kserve_model_config(&h->model), 0));
}

/* Statistics of the one model, for /v2/models/M/stats and /v2/models/stats
 * alike (all models); an empty list while it is not loaded. */
enum MHD_Result http_get_stats(tp_http_ctx *h, req_ctx *r)
{
    if (!atomic_load(&h->loaded))
        return http_reply_json(h, r, 200, strdup("{\"model_stats\":[]}"));
    return http_reply_json(h, r, 200,
                           http_generate_annotate(h, tp_model_stats_json(h->stats, h->model.name, h->model.version), 1));
}
