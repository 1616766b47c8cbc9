/* The request path's transport (http_ctx.h): libmicrohttpd's callbacks,
 * the request records, the body, the route table and the dispatch to a
 * handler, suspend and resume, and the end of a request. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "http_ctx.h"
#include "http_guard.h"
#include "log.h"
#include "text.h"
#include "thread_slot.h"

/* ---- the body ----------------------------------------------------------- */

int http_parse_ll(const char *s, long long *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < 0)
        return -1;
    *out = v;
    return 0;
}

/* Only a POST route (infer and the settings and registrations) keeps its
 * body; other routes count it against the limit and drop it. */
static int keeps_body(const req_ctx *r)
{
    return r->route && strcmp(r->method, "POST") == 0 && tp_route_method_allowed(r->route->methods, "POST");
}

/* The 413 is decided from Content-Length before a byte of the body is read
 * (and, with Expect: 100-continue, before the client sends it). */
static enum MHD_Result begin_body(tp_http_ctx *h, req_ctx *r)
{
    const char *cl = MHD_lookup_connection_value(r->conn, MHD_HEADER_KIND,
                                                 MHD_HTTP_HEADER_CONTENT_LENGTH);
    r->expect_len = -1;
    if (cl && http_parse_ll(cl, &r->expect_len) == 0 && r->expect_len > h->cfg->max_body_bytes)
        return http_reply_error(h, r, 413, "request body of %lld bytes exceeds max_body_bytes %lld",
                           r->expect_len, (long long)h->cfg->max_body_bytes);
    if (r->expect_len > tp_mem_budget_limit(h->mem) && keeps_body(r))
        return http_reply_error(h, r, 413, "request body of %lld bytes exceeds the server's memory budget "
                           "(%lld MiB, max_memory_mb)", r->expect_len,
                           (long long)(tp_mem_budget_limit(h->mem) >> 20));
    r->state = REQ_RECEIVING;
    if (r->route && (r->route->flags & ROUTE_INFER))
        http_infer_prewake(h);
    return MHD_YES;
}

/* Grows the buffer geometrically rather than trusting Content-Length for one
 * big allocation: a client announcing 64 MiB and sending nothing costs 64 KiB.
 * Each growth is taken from the memory budget first: -2 when it refuses
 * (r->mem.refused says how, r->err why), -1 without memory. */
static int append_body(req_ctx *r, const char *data, size_t n)
{
    if (r->len + n > r->cap) {
        size_t cap = r->cap ? r->cap : 65536;
        while (cap < r->len + n)
            cap *= 2;
        if (r->expect_len >= 0 && cap > (size_t)r->expect_len && (size_t)r->expect_len >= r->len + n)
            cap = (size_t)r->expect_len;
        if (tp_mem_take_for(&r->mem, (int64_t)cap - r->body_held, "request body", &r->err) != TP_OK)
            return -2;
        r->body_held = (int64_t)cap;
        char *p = realloc(r->body, cap + 1);
        if (!p)
            return -1;
        r->body = p;
        r->cap = cap;
    }
    memcpy(r->body + r->len, data, n);
    r->len += n;
    return 0;
}

/* A chunked body (no Content-Length) that grows past the limit: libmicrohttpd
 * 0.9 cannot answer in the middle of an upload, so the rest is read and
 * dropped and the 413 goes out when the upload ends. A client that keeps
 * sending DISCARD_MAX bytes past the limit is cut off without an answer. */
#define DISCARD_MAX ((long long)16 << 20)
static enum MHD_Result discard_body(tp_http_ctx *h, req_ctx *r, size_t n)
{
    if (r->state != REQ_TOO_LARGE) {
        r->state = REQ_TOO_LARGE;
        free(r->body);
        r->body = NULL;
        r->cap = 0;
        tp_mem_take(&r->mem, -r->body_held);
        r->body_held = 0;
    }
    r->len += n;
    long long over = (long long)r->len - (long long)h->cfg->max_body_bytes;
    if (over > DISCARD_MAX && over > (long long)h->cfg->max_body_bytes) {
        http_log_request(r, 413, "chunked body still growing far past max_body_bytes: closing");
        return MHD_NO;
    }
    return MHD_YES;
}

static enum MHD_Result receive_body(tp_http_ctx *h, req_ctx *r, const char *data, size_t *size)
{
    size_t n = *size;
    *size = 0;
    if (r->state == REQ_TOO_LARGE || (long long)(r->len + n) > (long long)h->cfg->max_body_bytes)
        return discard_body(h, r, n);
    if (!keeps_body(r)) {
        r->len += n;
        return MHD_YES;
    }
    int rc = append_body(r, data, n);
    if (rc == -2) /* the memory budget refused it: dropped, answered when the upload ends */
        return discard_body(h, r, n);
    if (rc != 0)
        return http_reply_error(h, r, 503, "out of memory receiving a %zu-byte body", r->len + n);
    return MHD_YES;
}

/* ---- the route table ---------------------------------------------------- */

/* Model routes: 503 while loading, 404 for another model or version. */
static enum MHD_Result check_model(tp_http_ctx *h, req_ctx *r, int *handled)
{
    *handled = 1;
    if (atomic_load(&h->broken))
        return http_reply_error(h, r, 503, "not ready: %s", h->broken_msg);
    if (!atomic_load(&h->loaded))
        return http_reply_error(h, r, 503, "not ready: the graph %s",
                           atomic_load(&h->state) == SRV_DRAINING ? "never loaded (shutting down)"
                                                                  : "is still loading");
    if (strcmp(r->args.model, h->model.name) != 0)
        return http_reply_error(h, r, 404, "unknown model '%s' (this server serves '%s')", r->args.model,
                           h->model.name);
    if (r->args.has_version && strcmp(r->args.version, h->model.version) != 0)
        return http_reply_error(h, r, 404, "model '%s' has no version '%s' (versions: %s)",
                           r->args.model, r->args.version, h->model.version);
    *handled = 0;
    return MHD_YES;
}

/* First match wins: /v2/models/stats before /v2/models/{model} (no other
 * two patterns match the same path); inference first, as nearly every
 * request is one. */
static const route_def ROUTES[] = {
    {"POST", "/v2/models/{model}/infer", ROUTE_MODEL | ROUTE_INFER, http_dispatch_infer},
    {"POST", "/v2/models/{model}/generate", ROUTE_MODEL | ROUTE_INFER, http_post_generate},
    {"POST", "/v2/models/{model}/generate_stream", ROUTE_MODEL | ROUTE_INFER, http_post_generate_stream},
    {"GET, HEAD", "/v2/health/live", ROUTE_PROBE, http_get_live},
    {"GET, HEAD", "/v2/health/ready", ROUTE_PROBE, http_get_ready},
    {"GET, HEAD", "/v2", 0, http_get_server},
    {"GET, HEAD", "/metrics", ROUTE_PROBE, http_get_metrics},
    {"GET, HEAD", "/v2/models/stats", 0, http_get_stats},
    {"GET, HEAD", "/v2/models/{model}", ROUTE_MODEL, http_get_model},
    {"GET, HEAD", "/v2/models/{model}/ready", ROUTE_MODEL, http_get_ready},
    {"GET, HEAD", "/v2/models/{model}/config", ROUTE_MODEL, http_get_model_config},
    {"GET, HEAD", "/v2/models/{model}/stats", ROUTE_MODEL, http_get_stats},
    {"GET, HEAD", "/v2/systemsharedmemory/status", 0, http_get_shm_status},
    {"GET, HEAD", "/v2/systemsharedmemory/region/{region}/status", 0, http_get_shm_status},
    {"POST", "/v2/systemsharedmemory/region/{region}/register", 0, http_post_shm_register},
    {"POST", "/v2/systemsharedmemory/region/{region}/unregister", 0, http_post_shm_unregister},
    {"POST", "/v2/systemsharedmemory/unregister", 0, http_post_shm_unregister},
    {"POST", "/v2/repository/index", 0, http_post_repository_index},
    {"POST", "/v2/repository/models/{model}/load", ROUTE_MODEL, http_post_repository_load},
    {"POST", "/v2/repository/models/{model}/unload", ROUTE_MODEL, http_post_repository_unload},
    {"GET, HEAD, POST", "/v2/logging", 0, http_logging_settings},
    {"GET, HEAD, POST", "/v2/trace/setting", 0, http_trace_settings},
    {"GET, HEAD, POST", "/v2/models/{model}/trace/setting", ROUTE_MODEL, http_trace_settings},
    {"GET, HEAD", "/v2/cudasharedmemory/status", 0, http_cuda_shm},
    {"GET, HEAD", "/v2/cudasharedmemory/region/{region}/status", 0, http_cuda_shm},
    {"POST", "/v2/cudasharedmemory/region/{region}/register", 0, http_cuda_shm},
    {"POST", "/v2/cudasharedmemory/region/{region}/unregister", 0, http_cuda_shm},
    {"POST", "/v2/cudasharedmemory/unregister", 0, http_cuda_shm},
};
#define N_ROUTES (sizeof ROUTES / sizeof ROUTES[0])

static const route_def *find_route(const char *url, tp_route_args *args)
{
    for (size_t i = 0; i < N_ROUTES; i++)
        if (tp_route_match(ROUTES[i].pattern, url, args))
            return &ROUTES[i];
    return NULL;
}

static enum MHD_Result reply_unknown_path(tp_http_ctx *h, req_ctx *r)
{
    char list[1024];
    size_t off = 0;
    for (size_t i = 0; i < N_ROUTES && off < sizeof list; i++)
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "",
                                ROUTES[i].pattern);
    return http_reply_error(h, r, 404, "unknown path '%s' (routes: %s; every {model} route also "
                       "takes /versions/{v})", r->url, list);
}

static enum MHD_Result reply_bad_method(tp_http_ctx *h, req_ctx *r)
{
    tp_err e;
    snprintf(e.msg, sizeof e.msg, "method %s not allowed on %s (allowed: %s)", r->method, r->url,
             r->route->methods);
    http_log_request(r, 405, e.msg);
    struct MHD_Response *resp = http_error_response(e.msg);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->route->methods);
    return http_send_response(h, r, 405, resp);
}

/* ---- suspend and resume ------------------------------------------------- */

static void end_orphan(req_ctx *r);

/* On the submitting HTTP thread (the batch ran there, inside
 * tp_batcher_submit) or on the batcher thread: hands the result back
 * (handoff.h). */
void http_on_batch_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
                   const tp_err *err, const tp_batch_info *info)
{
    req_ctx *r = ctx;
    if (info) {
        r->times.queue = info->queue_s;
        r->times.infer = info->compute_s;
    }
    r->st = st;
    r->outs = outs;
    r->n_outs = n_outs;
    if (st != TP_OK)
        r->err = *err;
    switch (tp_handoff_deliver(&r->handoff)) {
    case TP_DELIVERED_RESUME:
        MHD_resume_connection(r->conn);
        break;
    case TP_DELIVERED_FREE:
        end_orphan(r);
        break;
    case TP_DELIVERED_DONE:
        break;
    }
}

/* The call after http_dispatch_infer's: answer, or suspend until the batcher
 * thread delivers. */
static enum MHD_Result suspend_until_delivered(req_ctx *r)
{
    if (!tp_handoff_begin_suspend(&r->handoff))
        return http_answer_infer(r->h, r); /* delivered in between */
    r->state = REQ_SUSPENDED;
    MHD_suspend_connection(r->conn);
    if (!tp_handoff_end_suspend(&r->handoff))
        MHD_resume_connection(r->conn); /* delivered during the suspend: the resume is ours */
    return MHD_YES;
}

/* ---- the access handler and the end of a request ------------------------ */

/* Each thread keeps the last few request records it finished for its next
 * ones, with their body buffers while those are small. A req_ctx is 2.4
 * KB and a binary body often over 1 KB, both past malloc's per-thread
 * cache: allocating them anew for every request took malloc's slow path
 * (_int_malloc, consolidation, unlinking), about 3% of the server's CPU at
 * 32 binary connections. One spare was not enough: a thread reads the
 * requests of all its connections that are ready before their batch ends,
 * and 0.42 records a request still came from calloc at 32 binary
 * connections. The bodies kept are bounded in bytes as well as in number.
 * A thread's spares are freed when the thread ends. */
#define SPARE_RECORDS 32
#define SPARE_BODY_BYTES ((size_t)512 << 10)

typedef struct {
    int n;
    size_t body_bytes; /* capacity of the bodies the spares keep */
    req_ctx *r[SPARE_RECORDS];
} spares;

static void free_record(req_ctx *r)
{
    free(r->body);
    free(r);
}

static void free_spares(void *p)
{
    spares *s = p;
    while (s->n > 0)
        free_record(s->r[--s->n]);
    free(s);
}

static tp_thread_slot spare_slot = TP_THREAD_SLOT(free_spares, sizeof(spares));

static req_ctx *take_record(void)
{
    spares *s = tp_thread_slot_get(&spare_slot);
    if (!s || s->n == 0)
        return calloc(1, sizeof(req_ctx));
    req_ctx *r = s->r[--s->n];
    s->body_bytes -= r->cap;
    char *body = r->body;
    size_t cap = r->cap;
    memset(r, 0, REQ_CTX_CLEARED);
    r->body = body;
    r->cap = cap;
    return r;
}

/* r is released (http_release_request): only its body buffer is left, and
 * that only when it is at most SPARE_BODY_MAX */
static void recycle_record(req_ctx *r)
{
    spares *s = tp_thread_slot_get(&spare_slot);
    if (!s || s->n == SPARE_RECORDS) {
        free_record(r);
        return;
    }
    if (s->body_bytes + r->cap > SPARE_BODY_BYTES) {
        free(r->body);
        r->body = NULL;
        r->cap = 0;
    }
    s->body_bytes += r->cap;
    s->r[s->n++] = r;
}

static req_ctx *new_request(tp_http_ctx *h, struct MHD_Connection *c, const char *url,
                            const char *method)
{
    req_ctx *r = take_record();
    if (!r)
        return NULL;
    r->h = h;
    r->conn = c;
    r->mem.b = h->mem;
    r->t_start = tp_now_ms();
    tp_text_copy(r->method, sizeof r->method, method);
    tp_text_copy(r->url, sizeof r->url, url);
    r->route = find_route(url, &r->args);
    r->before_drain = atomic_load(&h->state) != SRV_DRAINING;
    atomic_fetch_add(&h->in_flight, 1);
    return r;
}

/* Called once the whole body is in. */
static enum MHD_Result route_request(tp_http_ctx *h, req_ctx *r)
{
    if (!r->route)
        return reply_unknown_path(h, r);
    if (!tp_route_method_allowed(r->route->methods, r->method))
        return reply_bad_method(h, r);
    if (r->route->flags & ROUTE_MODEL) {
        int handled;
        enum MHD_Result ok = check_model(h, r, &handled);
        if (handled)
            return ok;
        r->for_model = 1;
    }
    return r->route->handler(h, r);
}

/* A compressed body (body_codec.h), all in: replaced by its inflated bytes,
 * then routed as if it had come so. Only a kept body (keeps_body) is
 * inflated: the other routes never read theirs, and an empty one stays
 * empty. */
static enum MHD_Result inflate_body(tp_http_ctx *h, req_ctx *r)
{
    char *plain;
    size_t n;
    int too_large;
    tp_err e;
    int64_t held = r->mem.held;
    tp_status st = tp_body_decode(r->encoding, r->body, r->len, (size_t)h->cfg->max_body_bytes, &r->mem, &plain,
                                  &n, &too_large, &e);
    if (st != TP_OK && r->mem.refused)
        return http_reply_budget(h, r, e.msg);
    if (st != TP_OK)
        return http_reply_error(h, r, too_large ? 413 : (unsigned)tp_status_http(st), "%s", e.msg);
    free(r->body);
    tp_mem_take(&r->mem, -r->body_held); /* the compressed bytes, gone */
    r->body_held = r->mem.held - held + r->body_held;
    r->body = plain;
    r->len = r->cap = n;
    r->encoding = TP_BODY_IDENTITY;
    return route_request(h, r);
}

/* Refused by the guard: answered, then the connection is closed, so
 * nothing after these headers is ever parsed as another request. */
static enum MHD_Result reply_refused(tp_http_ctx *h, req_ctx *r, unsigned code, const char *msg)
{
    http_log_request(r, code, msg);
    struct MHD_Response *resp = http_error_response(msg);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return http_send_response(h, r, code, resp);
}

static enum MHD_Result handle_request(tp_http_ctx *h, int probes_only, struct MHD_Connection *c, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_size, void **con_cls)
{
    req_ctx *r = *con_cls;
    if (!r) {
        http_watch_pin(h, c);
        if (!(r = new_request(h, c, url, method)))
            return MHD_NO;
        *con_cls = r;
        if (probes_only && r->route && !(r->route->flags & ROUTE_PROBE))
            r->route = NULL; /* 404 */
        tp_err e;
        static const char *const noted[] = {"Inference-Header-Content-Length", "Content-Encoding"};
        const char *values[sizeof noted / sizeof *noted];
        unsigned bad = tp_http_guard_check_headers(c, version, noted, values, (int)(sizeof noted / sizeof *noted),
                                                   e.msg, sizeof e.msg);
        r->ihcl = values[0];
        if (!bad && tp_body_encoding_parse(values[1], &r->encoding, e.msg, sizeof e.msg) != 0)
            bad = 415;
        return bad ? reply_refused(h, r, bad, e.msg) : begin_body(h, r);
    }
    switch (r->state) {
    case REQ_RECEIVING:
    case REQ_TOO_LARGE:
        if (*upload_size)
            return receive_body(h, r, upload_data, upload_size);
        tp_http_guard_request_complete(c);
        if (r->state == REQ_TOO_LARGE && r->mem.refused)
            return http_reply_budget(h, r, r->err.msg);
        if (r->state == REQ_TOO_LARGE)
            return http_reply_error(h, r, 413, "request body of %zu bytes (chunked) exceeds "
                               "max_body_bytes %lld", r->len, (long long)h->cfg->max_body_bytes);
        if (r->encoding != TP_BODY_IDENTITY && r->len && keeps_body(r))
            return inflate_body(h, r);
        return route_request(h, r);
    case REQ_HELD:
        /* libmicrohttpd's next pass: the first held request called runs them all */
        if (!tp_handoff_delivered(&r->handoff))
            http_run_held(h);
        return http_answer_infer(h, r);
    case REQ_SUBMITTED:
        return suspend_until_delivered(r);
    case REQ_SUSPENDED:
        /* resumed: the batcher thread delivered the result */
        return http_answer_infer(h, r);
    case REQ_GENERATING:
        return http_generate_continue(h, r);
    default:
        /* Already answered (e.g. 413 mid-upload): discard what still comes. */
        *upload_size = 0;
        return MHD_YES;
    }
}

enum MHD_Result http_on_request(void *cls, struct MHD_Connection *c, const char *url,
                           const char *method, const char *version,
                           const char *upload_data, size_t *upload_size, void **con_cls)
{
    return handle_request(cls, 0, c, url, method, version, upload_data, upload_size, con_cls);
}

/* The health_port listener: the same handler restricted to the health
 * routes and /metrics, on its own socket and thread, so probes are answered while
 * the main port is saturated with connections. */
enum MHD_Result http_on_probe_request(void *cls, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *version,
                                 const char *upload_data, size_t *upload_size, void **con_cls)
{
    return handle_request(cls, 1, c, url, method, version, upload_data, upload_size, con_cls);
}

/* What a request gives back once its connection is done with it. in_engine:
 * it was submitted, and its result (if any) never went out. */
static void end_request(tp_http_ctx *h, req_ctx *r, int ok, int in_engine)
{
    if (in_engine) {
        tp_host_tensors_free(r->outs, r->n_outs);
        atomic_fetch_sub(&h->in_engine, 1);
    }
    if (r->trace_id)
        http_end_trace(h, r, ok);
    http_release_request(r);
    tp_mem_release(&r->mem);
    atomic_fetch_sub(&h->in_flight, 1);
}

/* On the thread that delivered the result of a request whose connection
 * closed before it came (handoff.h). */
static void end_orphan(req_ctx *r)
{
    end_request(r->h, r, 0, 1);
    free_record(r); /* not this thread's spares: the batcher thread keeps none */
}

void http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                  enum MHD_RequestTerminationCode toe)
{
    tp_http_ctx *h = cls;
    req_ctx *r = *con_cls;
    tp_http_guard_answered(c);
    if (!r)
        return;
    *con_cls = NULL;
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK)
        tp_log(TP_LOG_DEBUG, "%s %s: connection ended before the answer was sent (code %d)",
               r->method, r->url, (int)toe);
    if (r->state == REQ_HELD && !tp_handoff_delivered(&r->handoff)) {
        tp_log(TP_LOG_DEBUG, "%s %s: connection closed while its request was held: running "
               "the held requests first", r->method, r->url);
        http_run_held(h); /* the batch holds r: it may not outlive it */
    }
    /* A connection broken between http_dispatch_infer and the call that would
     * suspend it (a reset read in that pass) leaves r to its batch. */
    if (r->gen)
        http_generate_end(r); /* its sequence is cancelled: the slot is free at the next step */
    if (r->state == REQ_SUBMITTED && !tp_handoff_orphan(&r->handoff)) {
        tp_log(TP_LOG_DEBUG, "%s %s: connection closed before its request ran: freed once "
               "its batch is done", r->method, r->url);
        return;
    }
    end_request(h, r, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK,
                r->state == REQ_SUSPENDED || r->state == REQ_HELD || r->state == REQ_SUBMITTED);
    recycle_record(r);
}
