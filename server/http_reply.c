/* The HTTP front end's answers (http_ctx.h): JSON, errors, refusals of
 * the memory budget, each logged and counted as the server does. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf_pool.h"
#include "clock.h"
#include "http_ctx.h"
#include "json_tensor.h"
#include "log.h"
#include "numtext.h"

struct MHD_Response *http_with_headers(struct MHD_Response *resp, const char *ctype,
                                  size_t header_len)
{
    if (!resp)
        return NULL;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (header_len) {
        char v[TP_NUMTEXT_MAX + 1];
        v[tp_numtext_i64((int64_t)header_len, v)] = '\0';
        MHD_add_response_header(resp, "Inference-Header-Content-Length", v);
    }
    return resp;
}

/* Takes ownership of body (malloc'ed, or a buf_pool.h buffer when
 * pooled). Returns NULL only without memory. */
struct MHD_Response *http_make_response(char *body, size_t len, int pooled, const char *ctype,
                                   size_t header_len)
{
    struct MHD_Response *resp =
        pooled ? MHD_create_response_from_buffer_with_free_callback(len, body, tp_buf_pool_give)
               : MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (!resp)
        tp_jbuf_free_text(body, pooled);
    return http_with_headers(resp, ctype, header_len);
}

struct MHD_Response *http_json_response(char *doc)
{
    return doc ? http_make_response(doc, strlen(doc), 0, "application/json", 0) : NULL;
}

void http_log_request(const req_ctx *r, unsigned code, const char *msg)
{
    /* Client errors and 503s (loading, draining, overload) are the normal
     * life of a server; only its own failures are worth a warning. */
    tp_log_level lvl = code >= 500 && code != 503 ? TP_LOG_WARN : TP_LOG_DEBUG;
    if (!tp_log_enabled(lvl))
        return;
    double ms = tp_now_ms() - r->t_start;
    if (msg)
        tp_log(lvl, "%s %s -> %u (%.1f ms): %s", r->method, r->url, code, ms, msg);
    else
        tp_log(lvl, "%s %s -> %u (%.1f ms)", r->method, r->url, code, ms);
}

/* Triton's statistics: an answered inference of the served model. */
static void record_stats(tp_http_ctx *h, req_ctx *r, unsigned code, double total)
{
    if (code != 200) {
        tp_model_stats_fail(h->stats, total);
        return;
    }
    r->times.total = total;
    tp_model_stats_success(h->stats, &r->times);
}

/* Queues resp (consumed) on the connection. While draining every answer
 * closes its connection so keep-alive clients move to another replica. */
enum MHD_Result http_send_response(tp_http_ctx *h, req_ctx *r, unsigned code,
                              struct MHD_Response *resp)
{
    r->state = REQ_REPLIED;
    if (r->route && (r->route->flags & ROUTE_INFER)) {
        double total = ((r->t_encoded > 0 ? r->t_encoded : tp_now_ms()) - r->t_start) / 1e3;
        tp_metrics_request(h->metrics, code, total);
        if (r->for_model)
            record_stats(h, r, code, total);
    }
    if (!resp)
        return MHD_NO; /* out of memory: dropping the connection is all that is left */
    if (atomic_load(&h->state) == SRV_DRAINING)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ok = MHD_queue_response(r->conn, code, resp);
    MHD_destroy_response(resp);
    return ok;
}

enum MHD_Result http_reply_json(tp_http_ctx *h, req_ctx *r, unsigned code, char *doc)
{
    http_log_request(r, code, NULL);
    return http_send_response(h, r, code, http_json_response(doc));
}

struct MHD_Response *http_error_response(const char *msg)
{
    char *doc = tp_kserve_error_json(msg);
    return http_json_response(doc ? doc : strdup("{\"error\":\"internal error\"}"));
}

enum MHD_Result http_reply_error(tp_http_ctx *h, req_ctx *r, unsigned code, const char *fmt, ...)
{
    tp_err e;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e.msg, sizeof e.msg, fmt, ap);
    va_end(ap);
    http_log_request(r, code, e.msg);
    return http_send_response(h, r, code, http_error_response(e.msg));
}

/* A refusal of the memory budget (mem_budget.h): 413 when the request
 * alone would pass the whole budget, else 503 with Retry-After, as any
 * momentary overload is answered. */
enum MHD_Result http_reply_budget(tp_http_ctx *h, req_ctx *r, const char *msg)
{
    unsigned code = r->mem.refused == TP_MEM_TOO_LARGE ? 413 : 503;
    http_log_request(r, code, msg);
    struct MHD_Response *resp = http_error_response(msg);
    if (resp && code == 503)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    return http_send_response(h, r, code, resp);
}
