#include "http.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "clock.h"
#include "cpu_pin.h"
#include "http_ctx.h"
#include "http_guard.h"
#include "json_cap.h"
#include "log.h"
#include "text.h"
#include "thread_slot.h"

/* The server: the request path's context (s), and what only this file
 * touches: the listeners, one libmicrohttpd daemon per HTTP thread, the
 * acceptor feeding them, the pins, the model's descriptions. */
struct tp_http {
    tp_http_ctx s; /* first: what the request path and the handlers see (http_ctx.h) */
    /* One daemon per HTTP thread, none with a listening socket: the
     * acceptor hands each connection to the one holding the fewest
     * (acceptor.h says why not libmicrohttpd's thread pool). */
    int n_daemons;
    struct MHD_Daemon **d;
    tp_acceptor *acceptor;
    int listen_fd, port;
    tp_http_guard *guard;      /* connection limits, request deadline, strictness */
    struct MHD_Daemon *probe_d; /* health_port: probes only; NULL without one */
    int probe_fd, probe_port;
    tp_config cfg;
    tp_io_desc *ins, *outs; /* the model's (s.model) */
    const tp_labels *const *labels; /* per output, serve's (tp_http_set_labels; NULL: none given) */
    tp_cpu_pin **pins; /* pin_threads: each daemon's thread's pin, ticked by that thread only; NULL: unpinned */
};

/* The server a context is the first member of. */
static tp_http *server_of(tp_http_ctx *s) { return (tp_http *)s; }

/* ---- the HTTP thread of a connection ------------------------------------ */

/* This HTTP thread's daemon, as its index in h->d: found on its first
 * infer request (a thread serves one daemon all its life); -1 until then,
 * or for a daemon the acceptor does not feed. */
static _Thread_local int thread_daemon = -1;

/* thread_daemon, found from c (a connection this thread serves). */
static int find_thread_daemon(tp_http *h, struct MHD_Connection *c)
{
    if (thread_daemon < 0 && h->acceptor) {
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_DAEMON);
        for (int i = 0; ci && i < h->n_daemons; i++)
            if (h->d[i] == ci->daemon)
                thread_daemon = i;
    }
    return thread_daemon;
}

/* Whether r's thread serves other connections too, whose requests may be
 * waiting for it unread: then r is held even on an idle engine (where
 * holding is allowed), so what the thread reads meanwhile joins its batch
 * instead of each request running alone (tp_batch_req's more_may_follow).
 * One thread, or two sharing one core, under 32 binary connections ran
 * every request alone before: 101k requests/s at 9.8 us of CPU each, and
 * 113k at 8.8 us in batches of 4.9 with this. */
int thread_serves_others(tp_http_ctx *s, const req_ctx *r)
{
    tp_http *h = server_of(s);
    find_thread_daemon(h, r->conn);
    return thread_daemon >= 0 && tp_acceptor_live(h->acceptor, thread_daemon) > 1;
}

/* pin_threads: the thread of the daemon serving c takes its CPU
 * (its pin's) on its first request, and later lets it go while the
 * CPU starves it (cpu_pin.h); the acceptor routes connections as though
 * it stayed. */
void watch_pin(tp_http_ctx *s, struct MHD_Connection *c)
{
    tp_http *h = server_of(s);
    if (!h->pins || find_thread_daemon(h, c) < 0)
        return; /* unpinned, or the health port's thread */
    char why[256];
    switch (tp_cpu_pin_tick(h->pins[thread_daemon], tp_now_ms_coarse(), why, sizeof why)) {
    case TP_PIN_SAME:
        break;
    case TP_PIN_UNPINNED:
        TP_LOG_W("pin_threads: HTTP thread %d unpinned: %s", thread_daemon, why);
        tp_metrics_pin_change(h->s.metrics, 0);
        break;
    case TP_PIN_PINNED:
        TP_LOG_I("pin_threads: HTTP thread %d %s", thread_daemon, why);
        tp_metrics_pin_change(h->s.metrics, 1);
        break;
    case TP_PIN_LEFT:
        TP_LOG_W("pin_threads: HTTP thread %d: %s", thread_daemon, why);
        break;
    }
}

/* A step that may stall runs on the HTTP thread serving c only while that
 * thread serves c alone and is given no new connection
 * (tp_acceptor_claim_alone); end_alone after the step. */
int claim_alone(tp_http_ctx *s, struct MHD_Connection *c)
{
    tp_http *h = server_of(s);
    return find_thread_daemon(h, c) >= 0 && tp_acceptor_claim_alone(h->acceptor, thread_daemon);
}

void end_alone(tp_http_ctx *s) { tp_acceptor_end_alone(server_of(s)->acceptor, thread_daemon); }

/* ---- the body ----------------------------------------------------------- */

int parse_ll(const char *s, long long *out)
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
    if (cl && parse_ll(cl, &r->expect_len) == 0 && r->expect_len > h->cfg->max_body_bytes)
        return reply_error(h, r, 413, "request body of %lld bytes exceeds max_body_bytes %lld",
                           r->expect_len, (long long)h->cfg->max_body_bytes);
    if (r->expect_len > tp_mem_budget_limit(h->mem) && keeps_body(r))
        return reply_error(h, r, 413, "request body of %lld bytes exceeds the server's memory budget "
                           "(%lld MiB, max_memory_mb)", r->expect_len,
                           (long long)(tp_mem_budget_limit(h->mem) >> 20));
    r->state = REQ_RECEIVING;
    if (r->route && (r->route->flags & ROUTE_INFER))
        infer_prewake(h);
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
        log_request(r, 413, "chunked body still growing far past max_body_bytes: closing");
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
        return reply_error(h, r, 503, "out of memory receiving a %zu-byte body", r->len + n);
    return MHD_YES;
}

/* ---- the route table ---------------------------------------------------- */

/* Model routes: 503 while loading, 404 for another model or version. */
static enum MHD_Result check_model(tp_http_ctx *h, req_ctx *r, int *handled)
{
    *handled = 1;
    if (atomic_load(&h->broken))
        return reply_error(h, r, 503, "not ready: %s", h->broken_msg);
    if (!atomic_load(&h->loaded))
        return reply_error(h, r, 503, "not ready: the graph %s",
                           atomic_load(&h->state) == SRV_DRAINING ? "never loaded (shutting down)"
                                                                  : "is still loading");
    if (strcmp(r->args.model, h->model.name) != 0)
        return reply_error(h, r, 404, "unknown model '%s' (this server serves '%s')", r->args.model,
                           h->model.name);
    if (r->args.has_version && strcmp(r->args.version, h->model.version) != 0)
        return reply_error(h, r, 404, "model '%s' has no version '%s' (versions: %s)",
                           r->args.model, r->args.version, h->model.version);
    *handled = 0;
    return MHD_YES;
}

/* First match wins: /v2/models/stats before /v2/models/{model} (no other
 * two patterns match the same path); inference first, as nearly every
 * request is one. */
static const route_def ROUTES[] = {
    {"POST", "/v2/models/{model}/infer", ROUTE_MODEL | ROUTE_INFER, dispatch_infer},
    {"GET, HEAD", "/v2/health/live", ROUTE_PROBE, get_live},
    {"GET, HEAD", "/v2/health/ready", ROUTE_PROBE, get_ready},
    {"GET, HEAD", "/v2", 0, get_server},
    {"GET, HEAD", "/metrics", ROUTE_PROBE, get_metrics},
    {"GET, HEAD", "/v2/models/stats", 0, get_stats},
    {"GET, HEAD", "/v2/models/{model}", ROUTE_MODEL, get_model},
    {"GET, HEAD", "/v2/models/{model}/ready", ROUTE_MODEL, get_ready},
    {"GET, HEAD", "/v2/models/{model}/config", ROUTE_MODEL, get_model_config},
    {"GET, HEAD", "/v2/models/{model}/stats", ROUTE_MODEL, get_stats},
    {"GET, HEAD", "/v2/systemsharedmemory/status", 0, get_shm_status},
    {"GET, HEAD", "/v2/systemsharedmemory/region/{region}/status", 0, get_shm_status},
    {"POST", "/v2/systemsharedmemory/region/{region}/register", 0, post_shm_register},
    {"POST", "/v2/systemsharedmemory/region/{region}/unregister", 0, post_shm_unregister},
    {"POST", "/v2/systemsharedmemory/unregister", 0, post_shm_unregister},
    {"POST", "/v2/repository/index", 0, post_repository_index},
    {"POST", "/v2/repository/models/{model}/load", ROUTE_MODEL, post_repository_load},
    {"POST", "/v2/repository/models/{model}/unload", ROUTE_MODEL, post_repository_unload},
    {"GET, HEAD, POST", "/v2/logging", 0, logging_settings},
    {"GET, HEAD, POST", "/v2/trace/setting", 0, trace_settings},
    {"GET, HEAD, POST", "/v2/models/{model}/trace/setting", ROUTE_MODEL, trace_settings},
    {"GET, HEAD", "/v2/cudasharedmemory/status", 0, cuda_shm},
    {"GET, HEAD", "/v2/cudasharedmemory/region/{region}/status", 0, cuda_shm},
    {"POST", "/v2/cudasharedmemory/region/{region}/register", 0, cuda_shm},
    {"POST", "/v2/cudasharedmemory/region/{region}/unregister", 0, cuda_shm},
    {"POST", "/v2/cudasharedmemory/unregister", 0, cuda_shm},
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
    return reply_error(h, r, 404, "unknown path '%s' (routes: %s; every {model} route also "
                       "takes /versions/{v})", r->url, list);
}

static enum MHD_Result reply_bad_method(tp_http_ctx *h, req_ctx *r)
{
    tp_err e;
    snprintf(e.msg, sizeof e.msg, "method %s not allowed on %s (allowed: %s)", r->method, r->url,
             r->route->methods);
    log_request(r, 405, e.msg);
    struct MHD_Response *resp = error_response(e.msg);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, r->route->methods);
    return send_response(h, r, 405, resp);
}

/* ---- suspend and resume ------------------------------------------------- */

static void end_orphan(req_ctx *r);

/* On the submitting HTTP thread (the batch ran there, inside
 * tp_batcher_submit) or on the batcher thread: hands the result back
 * (handoff.h). */
void on_batch_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
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

/* The call after dispatch_infer's: answer, or suspend until the batcher
 * thread delivers. */
static enum MHD_Result suspend_until_delivered(req_ctx *r)
{
    if (!tp_handoff_begin_suspend(&r->handoff))
        return answer_infer(r->h, r); /* delivered in between */
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

/* r is released (release_request): only its body buffer is left, and
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
        return reply_budget(h, r, e.msg);
    if (st != TP_OK)
        return reply_error(h, r, too_large ? 413 : (unsigned)tp_status_http(st), "%s", e.msg);
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
    log_request(r, code, msg);
    struct MHD_Response *resp = error_response(msg);
    if (resp)
        MHD_add_response_header(resp, MHD_HTTP_HEADER_CONNECTION, "close");
    return send_response(h, r, code, resp);
}

static enum MHD_Result handle_request(tp_http_ctx *h, int probes_only, struct MHD_Connection *c, const char *url,
                                      const char *method, const char *version,
                                      const char *upload_data, size_t *upload_size, void **con_cls)
{
    req_ctx *r = *con_cls;
    if (!r) {
        watch_pin(h, c);
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
            return reply_budget(h, r, r->err.msg);
        if (r->state == REQ_TOO_LARGE)
            return reply_error(h, r, 413, "request body of %zu bytes (chunked) exceeds "
                               "max_body_bytes %lld", r->len, (long long)h->cfg->max_body_bytes);
        if (r->encoding != TP_BODY_IDENTITY && r->len && keeps_body(r))
            return inflate_body(h, r);
        return route_request(h, r);
    case REQ_HELD:
        /* libmicrohttpd's next pass: the first held request called runs them all */
        if (!tp_handoff_delivered(&r->handoff))
            run_held(h);
        return answer_infer(h, r);
    case REQ_SUBMITTED:
        return suspend_until_delivered(r);
    case REQ_SUSPENDED:
        /* resumed: the batcher thread delivered the result */
        return answer_infer(h, r);
    default:
        /* Already answered (e.g. 413 mid-upload): discard what still comes. */
        *upload_size = 0;
        return MHD_YES;
    }
}

enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                           const char *method, const char *version,
                           const char *upload_data, size_t *upload_size, void **con_cls)
{
    return handle_request(cls, 0, c, url, method, version, upload_data, upload_size, con_cls);
}

/* The health_port listener: the same handler restricted to the health
 * routes and /metrics, on its own socket and thread, so probes are answered while
 * the main port is saturated with connections. */
enum MHD_Result on_probe_request(void *cls, struct MHD_Connection *c, const char *url,
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
        end_trace(h, r, ok);
    release_request(r);
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

void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
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
        run_held(h); /* the batch holds r: it may not outlive it */
    }
    /* A connection broken between dispatch_infer and the call that would
     * suspend it (a reset read in that pass) leaves r to its batch. */
    if (r->state == REQ_SUBMITTED && !tp_handoff_orphan(&r->handoff)) {
        tp_log(TP_LOG_DEBUG, "%s %s: connection closed before its request ran: freed once "
               "its batch is done", r->method, r->url);
        return;
    }
    end_request(h, r, toe == MHD_REQUEST_TERMINATED_COMPLETED_OK,
                r->state == REQ_SUSPENDED || r->state == REQ_HELD || r->state == REQ_SUBMITTED);
    recycle_record(r);
}

/* How often tp_http_watch wants to run at most: a queued request's 504
 * is at most this late while the batcher thread is in a step, and an idle
 * server wakes this often (once a second, against 50 times once) */
#define WATCH_MS 1000

int tp_http_watch(tp_http *h)
{
    char msg[512];
    if (!engine_stuck(&h->s, msg, sizeof msg) && atomic_exchange(&h->s.stuck_now, 0))
        TP_LOG_I("the stuck engine step has ended: readiness 200 again");
    int tick = WATCH_MS, stuck_tick = h->cfg.stuck_step_ms / 10 < 10 ? 10 : h->cfg.stuck_step_ms / 10;
    if (h->cfg.stuck_step_ms > 0 && stuck_tick < tick) /* logged within a tenth of it */
        tick = stuck_tick;
    if (!atomic_load(&h->s.loaded))
        return tick;
    double now = tp_now_s(), next = tp_batcher_expire(h->s.batcher, now);
    if (next > 0 && (next - now) * 1e3 + 1 < tick)
        tick = (int)((next - now) * 1e3) + 1;
    return tick;
}

/* libmicrohttpd reports mostly client misbehaviour (malformed requests,
 * early disconnects): debug level. Server-side failures are logged by the
 * callers of its API. */
static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    tp_log(TP_LOG_DEBUG, "libmicrohttpd: %s", msg);
}

/* ---- lifecycle ---------------------------------------------------------- */

/* The socket is ours, not libmicrohttpd's, so bind errors name the address
 * and a port of 0 can be read back with getsockname. */
static tp_status open_listener(const char *host, int port, int *fd_out, int *port_out,
                               tp_err *err)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_PASSIVE | AI_NUMERICSERV}, *ai;
    char ps[16];
    snprintf(ps, sizeof ps, "%d", port);
    int rc = getaddrinfo(host, ps, &hints, &ai);
    if (rc != 0)
        return tp_fail(err, TP_INVALID, "host '%s': %s", host, gai_strerror(rc));
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd >= 0)
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* The longest accept queue the kernel allows (it caps the request at
     * net.core.somaxconn, 4096 by default since Linux 5.4; glibc's
     * SOMAXCONN was 128 before 2.35, hence a number). A burst of
     * connections (a load test opening thousands at once) faster than the
     * accept thread hands them out can overflow a short queue, and each SYN
     * dropped costs its client a retransmission 1 s, then 3 s, later: the
     * likely cause of a health probe answered after 4.6 s while 2,200
     * connections were being opened, in one sanitizer run, with 512. */
    if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 65535) != 0) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        freeaddrinfo(ai);
        return tp_fail(err, TP_IO, "cannot listen on %s:%d: %s", host, port, strerror(e));
    }
    freeaddrinfo(ai);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    getsockname(fd, (struct sockaddr *)&ss, &sl);
    *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                               : ((struct sockaddr_in *)&ss)->sin_port);
    *fd_out = fd;
    return TP_OK;
}

/* A main-port connection ended: the acceptor counts it out. */
static void on_main_closed(void *cls, struct MHD_Connection *c)
{
    tp_http *h = cls;
    tp_acceptor_released(h->acceptor, c);
}

/* fd < 0: one of the main port's daemons (no listening socket: the
 * acceptor hands it connections and enforces its share of
 * max_connections; the guard's watch and checks). Else the health_port
 * listener on fd (libmicrohttpd's own accept and limits). Each runs one
 * thread. */
static struct MHD_Daemon *start_daemon(tp_http *h, int fd, int port, tp_err *err)
{
    int probes = fd >= 0;
    unsigned flags = MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG | (probes ? 0 : MHD_USE_NO_LISTEN_SOCKET) |
                     (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES
                          ? MHD_USE_EPOLL_INTERNAL_THREAD
                          : MHD_USE_POLL_INTERNAL_THREAD);
    unsigned timeout_s = (unsigned)((h->cfg.request_timeout_ms + 999) / 1000);
    if (!probes)
        h->s.may_hold = (flags & MHD_USE_EPOLL) != 0;
    struct MHD_OptionItem opts[5 + TP_HTTP_GUARD_N_OPTIONS] = {
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)on_completed, &h->s},
        {MHD_OPTION_CONNECTION_TIMEOUT, (intptr_t)timeout_s, NULL},
        {MHD_OPTION_CONNECTION_MEMORY_LIMIT, (intptr_t)h->cfg.connection_memory_bytes, NULL},
        {probes ? MHD_OPTION_LISTEN_SOCKET : MHD_OPTION_CONNECTION_LIMIT,
         /* libmicrohttpd counts a connection out only when its loop cleans
          * up after the CLOSED notification that frees its place in the
          * acceptor's count; a limit at the share would refuse connections
          * added in between, so the daemon's limit is a backstop, twice
          * the total */
         probes ? fd : (intptr_t)(2 * (unsigned)tp_http_guard_max_connections(h->guard)), NULL},
    };
    int n = 4;
    n += tp_http_guard_options(h->guard, opts + n, probes ? NULL : on_main_closed, h);
    opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    /* the logger goes first so even option errors reach our log */
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, probes ? on_probe_request : on_request, &h->s,
                                            MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log, h, MHD_OPTION_ARRAY, opts,
                                            MHD_OPTION_END);
    if (!d)
        tp_fail(err, TP_INTERNAL, "libmicrohttpd failed to start on %s:%d", h->cfg.host, port);
    return d;
}

static tp_status start_probe_listener(tp_http *h, tp_err *err)
{
    tp_status st = open_listener(h->cfg.host, h->cfg.health_port, &h->probe_fd, &h->probe_port, err);
    if (st == TP_OK && !(h->probe_d = start_daemon(h, h->probe_fd, h->probe_port, err)))
        st = TP_INTERNAL;
    if (st == TP_OK)
        TP_LOG_I("probes listener on port %d (health_port): /v2/health/live, /v2/health/ready, /metrics",
                 h->probe_port);
    return st;
}

/* pin_threads: daemon i's thread goes to the i-th CPU this process may
 * use (round the list again past its end; h->pins, set before any daemon
 * runs a request), and the acceptor will send each connection to the
 * daemon on the CPU its packets arrive on (cpu_of_daemon[i], n_daemons
 * of them, for the caller to hand to the acceptor). Nothing is
 * pinned on one CPU, with fewer threads than CPUs, or where a thread's
 * waiting time cannot be read (a pin nobody watches could starve). */
static tp_status pin_threads_by_cpu(tp_http *h, int *cpu_of_daemon, tp_err *err)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0)
        return tp_fail(err, TP_INTERNAL, "pin_threads: the CPUs this process may use: %s", strerror(errno));
    int cpus[CPU_SETSIZE], n_cpus = 0;
    for (int c = 0; c < CPU_SETSIZE && c < TP_ACCEPTOR_MAX_CPUS; c++)
        if (CPU_ISSET(c, &set))
            cpus[n_cpus++] = c;
    char why[160];
    if (n_cpus < 2) {
        if (n_cpus)
            TP_LOG_I("pin_threads: HTTP threads left unpinned: this process may use one CPU");
        else
            TP_LOG_I("pin_threads: HTTP threads left unpinned: no CPU below %d", TP_ACCEPTOR_MAX_CPUS);
        return TP_OK;
    }
    /* Fewer threads than CPUs (a CPU quota, threads capped at 16): the
     * CPUs would be an arbitrary few, the same in every tpserve on the
     * machine, and most clients' CPUs would have no thread to route to. */
    if (h->n_daemons < n_cpus) {
        TP_LOG_I("pin_threads: HTTP threads left unpinned: %d for the %d CPUs this process may use (pinning "
                 "needs one for each: --threads %d, or fewer CPUs by taskset or a cpuset)",
                 h->n_daemons, n_cpus, n_cpus);
        return TP_OK;
    }
    if (!tp_cpu_pin_watchable(why, sizeof why)) {
        TP_LOG_W("pin_threads: HTTP threads left unpinned: cannot watch them for starvation: %s", why);
        return TP_OK;
    }
    if (!(h->pins = calloc((size_t)h->n_daemons, sizeof *h->pins)))
        return tp_fail(err, TP_NOMEM, "out of memory");
    char list[256] = "";
    for (int i = 0; i < h->n_daemons; i++) {
        cpu_of_daemon[i] = cpus[i % n_cpus];
        if (!(h->pins[i] = tp_cpu_pin_create(cpu_of_daemon[i], &set)))
            return tp_fail(err, TP_NOMEM, "out of memory");
        size_t at = strlen(list);
        snprintf(list + at, sizeof list - at, "%s%d", i ? "," : "", cpu_of_daemon[i]);
    }
    TP_LOG_I("pin_threads: HTTP threads on CPUs %s; each connection goes to the thread on the CPU its "
             "packets arrive on; a thread its CPU starves while another idles is unpinned for a while",
             list);
    return TP_OK;
}

/* The main port: its socket, a daemon per HTTP thread, each with an even
 * share of max_connections (so no more daemons than connections), and the
 * acceptor feeding them (routing by CPU when pin_threads pinned them). */
static tp_status start_main_listener(tp_http *h, tp_err *err)
{
    int total = tp_http_guard_max_connections(h->guard);
    int n = h->cfg.threads < total ? h->cfg.threads : total;
    unsigned *share = malloc((size_t)n * sizeof *share);
    int *cpu_of_daemon = malloc((size_t)n * sizeof *cpu_of_daemon);
    h->d = calloc((size_t)n, sizeof *h->d);
    if (!h->d || !share || !cpu_of_daemon) {
        free(share);
        free(cpu_of_daemon);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    h->n_daemons = n;
    tp_status st = h->cfg.pin_threads ? pin_threads_by_cpu(h, cpu_of_daemon, err) : TP_OK;
    if (st == TP_OK)
        st = open_listener(h->cfg.host, h->cfg.port, &h->listen_fd, &h->port, err);
    for (int i = 0; st == TP_OK && i < n; i++) {
        share[i] = (unsigned)(total / n + (i < total % n));
        if (!(h->d[i] = start_daemon(h, -1, h->port, err)))
            st = TP_INTERNAL;
    }
    if (st == TP_OK)
        st = tp_acceptor_start(h->listen_fd, h->d, n, share, h->cfg.max_connections_per_ip, &h->acceptor, err);
    free(share);
    if (st == TP_OK && h->pins)
        tp_acceptor_route_by_cpu(h->acceptor, cpu_of_daemon); /* copied */
    free(cpu_of_daemon);
    return st;
}

/* max_memory_mb, or by default the cgroup's limit (else the machine's
 * memory) less what the process holds now less what the budget does not
 * count: libmicrohttpd's connection pools, and per HTTP thread jansson's
 * allowance (json_cap.h) and the spare request records. Logged once the
 * model is loaded (log), when the default means something. */
static int64_t memory_budget(const tp_http *h, int log)
{
    const tp_config *c = &h->cfg;
    if (c->max_memory_mb)
        return (int64_t)c->max_memory_mb << 20;
    int64_t cgroup = tp_mem_cgroup_limit(NULL, NULL), resident = tp_mem_resident();
    int64_t reserve = ((int64_t)32 << 20) + (int64_t)c->max_connections * c->connection_memory_bytes +
                      (int64_t)c->threads * ((int64_t)c->max_json_values * TP_JSON_CAP_BYTES_PER_VALUE + (512 << 10));
    int64_t b = tp_mem_default_budget(cgroup, resident, reserve);
    if (log)
        TP_LOG_I("memory budget for requests: %lld MiB (%s %lld MiB, less %lld MiB resident with the model and "
                 "%lld MiB reserved; max_memory_mb sets it)", (long long)(b >> 20),
                 cgroup >= 0 ? "cgroup limit" : "no cgroup limit: machine memory",
                 (long long)((cgroup >= 0 ? cgroup : tp_mem_machine()) >> 20),
                 (long long)(resident >> 20), (long long)(reserve >> 20));
    return b;
}

tp_status tp_http_start(const tp_config *cfg, tp_http **out, tp_err *err)
{
    *out = NULL;
    tp_http *h = calloc(1, sizeof *h);
    if (!h)
        return tp_fail(err, TP_NOMEM, "out of memory");
    h->cfg = *cfg;
    h->s.cfg = &h->cfg;
    h->cfg.threads = tp_config_http_threads(cfg); /* 0 resolved once: it reads the cgroup's quota */
    tp_json_cap_set_values(cfg->max_json_values); /* before any request's JSON is parsed */
    snprintf(h->s.default_timeout_what, sizeof h->s.default_timeout_what, "request_timeout_ms %d",
             cfg->request_timeout_ms);
    h->listen_fd = h->probe_fd = -1;
    atomic_init(&h->s.state, SRV_LOADING);
    atomic_init(&h->s.loaded, 0);
    atomic_init(&h->s.in_flight, 0);
    atomic_init(&h->s.in_engine, 0);
    pthread_mutex_init(&h->s.mu, NULL);
    pthread_cond_init(&h->s.cv, NULL);
    h->s.metrics = tp_metrics_create();
    h->s.stats = tp_model_stats_create();
    h->s.shm = tp_shm_registry_create(cfg->max_shm_regions);
    h->s.mem = tp_mem_budget_create(memory_budget(h, 0));
    tp_status st = h->s.metrics && h->s.stats && h->s.shm && h->s.mem ? TP_OK
                                          : tp_fail(err, TP_NOMEM, "out of memory for the metrics");
    tp_trace_init ti = {cfg->trace_file, strcmp(cfg->trace_level, "TIMESTAMPS") == 0, cfg->trace_rate,
                        cfg->trace_count, cfg->trace_log_frequency, cfg->trace_max_pending};
    if (st == TP_OK)
        st = tp_trace_create(&ti, &h->s.trace, err);
    if (st == TP_OK)
        st = tp_http_guard_create(cfg, &h->guard, err);
    if (st == TP_OK)
        st = start_main_listener(h, err);
    if (st == TP_OK && cfg->health_port >= 0)
        st = start_probe_listener(h, err);
    if (st != TP_OK) {
        tp_http_stop(h);
        return st;
    }
    *out = h;
    return TP_OK;
}

int tp_http_port(const tp_http *h) { return h->port; }
int tp_http_threads(const tp_http *h) { return h->cfg.threads; }

static tp_status start_batcher(tp_http *h, tp_engine *const *inst, int n, tp_err *err)
{
    tp_engine *e = inst[0];
    tp_batcher_opts o = {h->cfg.max_batch_size, h->cfg.max_queue_delay_us, h->cfg.max_queue,
                         h->s.metrics, h->s.stats,
                         h->cfg.inline_run_max_us > 0 ? h->cfg.inline_run_max_us : -1,
                         0 /* engine_spin_us: the budget for this process's cores */};
    tp_status st = tp_batcher_create_instances(inst, n, &o, &h->s.batcher, err);
    if (st != TP_OK)
        return st;
    const char *why = NULL;
    if (tp_batcher_batching(h->s.batcher))
        TP_LOG_I("batching: up to %lld rows per engine run, max_queue_delay_us=%d, max_queue=%d",
                 (long long)tp_batcher_max_batch(h->s.batcher), h->cfg.max_queue_delay_us,
                 h->cfg.max_queue);
    else
        TP_LOG_I("batching off, requests run one at a time: %s",
                 !tp_engine_padded(e, &why) ? why
                 : "an input or output has no batch dimension first");
    return TP_OK;
}

tp_status tp_http_set_engines(tp_http *h, tp_engine *const *inst, int n, tp_err *err)
{
    tp_engine *e = inst[0];
    int ni = tp_engine_n_inputs(e), no = tp_engine_n_outputs(e);
    h->ins = calloc((size_t)ni + 1, sizeof *h->ins);
    h->outs = calloc((size_t)no + 1, sizeof *h->outs);
    if (!h->ins || !h->outs)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < ni; i++)
        h->ins[i] = *tp_engine_input(e, i);
    for (int i = 0; i < no; i++)
        h->outs[i] = *tp_engine_output(e, i);
    h->s.may_stall = tp_engine_steps_may_stall(e);
    tp_status st = start_batcher(h, inst, n, err);
    if (st != TP_OK)
        return st;
    h->s.model = (tp_kserve_model){tp_engine_model_name(e), "1", h->ins, ni, h->outs, no,
                                 tp_batcher_batching(h->s.batcher) ? tp_batcher_max_batch(h->s.batcher)
                                                                 : 0,
                                 h->cfg.max_queue_delay_us, h->cfg.max_queue, n,
                                 h->cfg.allow_client_shm ? h->s.shm : NULL,
                                 h->labels, h->cfg.max_json_values};
    /* Everything above is published by this store: HTTP threads read the
     * model only after seeing loaded. A drain that began during the load
     * keeps the server unready. */
    if (!h->cfg.max_memory_mb) /* the model is in: what is left of the limit is known */
        tp_mem_budget_set_limit(h->s.mem, memory_budget(h, 1));
    atomic_store(&h->s.loaded, 1);
    int loading = SRV_LOADING;
    atomic_compare_exchange_strong(&h->s.state, &loading, SRV_READY);
    return TP_OK;
}

void tp_http_set_labels(tp_http *h, const tp_labels *const *labels) { h->labels = labels; }

int tp_http_set_broken(tp_http *h, const char *why)
{
    if (atomic_load(&h->s.broken))
        return 0;
    snprintf(h->s.broken_msg, sizeof h->s.broken_msg, "%s", why);
    atomic_store(&h->s.broken, 1); /* publishes broken_msg */
    tp_engine_stats es; /* tpserve_rank_group_up 0 now, not after the next batch */
    tp_batcher_engine_stats(h->s.batcher, &es);
    tp_metrics_engine_stats(h->s.metrics, &es);
    return 1;
}

unsigned tp_http_begin_drain(tp_http *h)
{
    int was = atomic_exchange(&h->s.state, SRV_DRAINING);
    /* connections the kernel completed before this get an answer (a 503),
     * not a reset */
    return was == SRV_DRAINING ? 0 : tp_acceptor_drain(h->acceptor);
}

long tp_http_in_flight(tp_http *h) { return atomic_load(&h->s.in_flight); }
long tp_http_in_engine(tp_http *h) { return atomic_load(&h->s.in_engine); }

unsigned tp_http_connections(tp_http *h)
{
    unsigned n = 0;
    for (int i = 0; i < h->n_daemons && h->d[i]; i++) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(h->d[i], MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        n += info ? info->num_connections : 0;
    }
    return n;
}

#define DRAIN_CUT "server is shutting down: drain timeout reached before this request ran"

/* The batcher's queue; its answers come back through the batcher callback,
 * which resumes their connections. */
void tp_http_cancel_queued(tp_http *h)
{
    if (atomic_load(&h->s.loaded))
        tp_batcher_cancel(h->s.batcher, TP_UNAVAILABLE, DRAIN_CUT);
}

void tp_http_stop(tp_http *h)
{
    if (!h)
        return;
    pthread_mutex_lock(&h->s.mu);
    atomic_store(&h->s.stopping, 1);
    /* no HTTP thread may be inside the batcher, or hold requests, when it is freed */
    while (atomic_load(&h->s.submitting) > 0)
        pthread_cond_wait(&h->s.cv, &h->s.mu);
    pthread_mutex_unlock(&h->s.mu);
    tp_batcher_free(h->s.batcher);
    tp_acceptor_stop(h->acceptor); /* none is handed to a daemon while it stops */
    for (int i = 0; i < h->n_daemons; i++)
        if (h->d[i])
            MHD_stop_daemon(h->d[i]);
    tp_acceptor_free(h->acceptor); /* after the daemons: they report closes to it */
    free(h->d);
    for (int i = 0; h->pins && i < h->n_daemons; i++)
        tp_cpu_pin_free(h->pins[i]);
    free(h->pins);
    if (h->probe_d)
        MHD_stop_daemon(h->probe_d);
    tp_http_guard_free(h->guard);
    if (h->listen_fd >= 0)
        close(h->listen_fd);
    if (h->probe_fd >= 0)
        close(h->probe_fd);
    pthread_mutex_destroy(&h->s.mu);
    pthread_cond_destroy(&h->s.cv);
    free(h->ins);
    free(h->outs);
    tp_metrics_free(h->s.metrics);
    tp_model_stats_free(h->s.stats);
    tp_trace_free(h->s.trace); /* after the daemons: no request is traced any more */
    tp_shm_registry_free(h->s.shm);
    tp_mem_budget_free(h->s.mem);
    free(h);
}

