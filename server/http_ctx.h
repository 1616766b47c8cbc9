/* http_ctx.h — inside the HTTP front end (http.h): what its files share.
 *
 * The request path's transport is server/http_request.c (libmicrohttpd's
 * request callbacks, the body, suspend and resume, the route table), the
 * server's is server/http.c (listeners, daemons, thread pinning, start and
 * stop), and server/http_reply.c answers. The handlers, one file per
 * protocol area (http_infer.c, http_shm.c, http_repository.c,
 * http_logging.c, http_status.c), reach the server only through
 * tp_http_ctx and the request record, and answer through the reply helpers
 * below. A route is one row of ROUTES (http_request.c) pointing at its
 * handler. Nothing outside these files includes this header. */
#ifndef TP_HTTP_CTX_H
#define TP_HTTP_CTX_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "batcher.h"
#include "body_codec.h"
#include "config.h"
#include "gen_sched.h"
#include "handoff.h"
#include "kserve.h"
#include "mem_budget.h"
#include "metrics.h"
#include "model_stats.h"
#include "route.h"
#include "shm_registry.h"
#include "status.h"
#include "trace.h"

enum { SRV_LOADING, SRV_READY, SRV_DRAINING };

/* The server as the request path and the handlers see it: its state, the
 * published model and what serves requests. The first member of tp_http
 * (http.c), which keeps the listeners, daemons and pins to itself. */
typedef struct tp_http_ctx {
    const tp_config *cfg; /* tp_http's copy (threads resolved) */
    _Atomic int state; /* SRV_* */
    _Atomic int loaded; /* engine and model published; stays set while draining */
    _Atomic int broken; /* the engine cannot run any more (a rank's process died) */
    char broken_msg[600];
    char default_timeout_what[64]; /* req_ctx.timeout_what without parameters.timeout */
    _Atomic long in_flight;
    _Atomic long in_engine; /* submitted, not yet answered: their batch may be running */
    tp_kserve_model model;
    tp_metrics *metrics;
    tp_model_stats *stats;
    tp_trace *trace; /* Triton's trace extension */
    tp_shm_registry *shm; /* system shared memory regions (empty unless allow_client_shm) */
    tp_mem_budget *mem;   /* max_memory_mb: what requests hold at once (mem_budget.h) */
    tp_batcher *batcher; /* created with the engine */
    tp_gen *gen;         /* a generation graph's scheduler (http_generate.c); NULL for others */
    int64_t gen_max_seq_len;
    /* Requests inside tp_batcher_submit (which may run a batch there) or
     * held by an HTTP thread: stopping waits for them before the batcher is
     * freed. Atomics (sequentially consistent: a submitter that saw
     * stopping 0 is counted before tp_http_stop reads the count), so four
     * HTTP threads do not queue on a lock per request; mu and cv only for
     * the last one out to wake tp_http_stop. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic int submitting, stopping;
    /* libmicrohttpd calls a handler that returned without an answer again
     * on its next pass: so in epoll mode (it keeps such connections on its
     * ready list); held requests need that (REQ_HELD) */
    int may_hold;
    /* The engine's steps may stall (tp_engine_steps_may_stall): one runs
     * on an HTTP thread only while that thread serves no other connection
     * (tp_acceptor_claim_alone), so nothing but its own client ever waits
     * behind a stopped rank or a hung GPU */
    int may_stall;
    /* stuck_step_ms: the start (tp_now_ns) of the last stuck step logged,
     * so each is logged and counted once; whether one is stuck now (for
     * the log line when it ends) */
    _Atomic int64_t stuck_logged;
    _Atomic int stuck_now;
} tp_http_ctx;

typedef struct req_ctx req_ctx;

/* A handler: called once the request's whole body is in and its route,
 * method and model (ROUTE_MODEL) are checked; it answers (reply_*), or for
 * an inference may leave the answer for later (http_infer.c). */
typedef enum MHD_Result route_handler(tp_http_ctx *h, req_ctx *r);

/* One row of the route table (ROUTES, http_request.c). */
enum {
    ROUTE_MODEL = 1, /* answers for the served model: 503 until loaded, 404 for another name */
    ROUTE_INFER = 2, /* an inference: counted in the request metrics and statistics */
    ROUTE_PROBE = 4, /* also served on health_port (probes and scrapes only) */
};
typedef struct route_def {
    const char *methods; /* as the Allow header says them */
    const char *pattern; /* route.h */
    int flags;
    route_handler *handler;
} route_def;

/* Per-request life: RECEIVING (the body: kept for infer, counted and
 * dropped otherwise) -> routed and answered (REPLIED). An infer is decoded
 * and submitted on the HTTP thread that read it; when the batcher was idle
 * its batch runs right there and the answer goes out in the same call (no
 * suspend, no other thread). Under load it is HELD by that thread: the
 * handler returns without an answer, so libmicrohttpd calls it again on
 * its next pass over the ready connections, after reading what the
 * thread's other connections sent; the first held request called again
 * runs all of them as one batch (tp_batcher_run_held) and each is answered
 * as its turn comes in that pass. Otherwise (a slow model, a queue delay)
 * the connection is SUSPENDED until the batcher thread hands the batch
 * result back, and the HTTP thread that resumes it encodes the answer.
 * Who resumes, and who frees a request whose connection goes first:
 * handoff.h.
 *
 * It is suspended on libmicrohttpd's next call, not in the one that
 * completed the body (SUBMITTED in between): libmicrohttpd (0.9.75, and
 * 1.0.1's source alike) does not update a suspended connection's
 * event-loop state, so one suspended in the pass that read its body stays
 * marked "reading", is read on resume, and a client that had half-closed
 * after its request has its EOF taken for an abort
 * (MHD_REQUEST_TERMINATED_WITH_ERROR) and its answer dropped: 26 of 3,600
 * such clients under wrk load, 0 of 2,400 once suspended a pass later,
 * when the connection is marked as waiting for the application and
 * nothing is read.
 *
 * Answering only once the body is in lets libmicrohttpd keep the
 * connection alive; only a 413 is sent early. */
enum { REQ_RECEIVING = 1, REQ_TOO_LARGE, REQ_HELD, REQ_SUBMITTED, REQ_SUSPENDED, REQ_REPLIED, REQ_GENERATING };

struct req_ctx {
    tp_http_ctx *h;
    struct MHD_Connection *conn;
    int state;
    const route_def *route; /* NULL: no route has this path */
    tp_route_args args;     /* what the route's pattern captured */
    int for_model;          /* an infer that reached the served model (statistics) */
    char *body;
    size_t len, cap;
    long long expect_len; /* Content-Length, or -1 when chunked */
    long long header_len; /* Inference-Header-Content-Length, or -1 */
    const char *ihcl;     /* that header's text (NULL: absent), found by the header checks */
    tp_body_encoding encoding; /* Content-Encoding: inflated once the body is in */
    /* tp_now_ms(): headers in, body in, body decoded, answer encoded (0:
     * not yet; http_send_response times the request by it instead of reading
     * the clock again) */
    double t_start, t_body, t_decoded, t_encoded;
    int before_drain; /* headers arrived before SIGTERM: the request is served */
    /* the decoded request and its batch result */
    tp_kserve_request req;
    tp_status st;
    tp_host_tensor *outs;
    int n_outs;
    int64_t timeout_us;
    _Atomic int handoff; /* handoff.h */
    tp_request_times times; /* for the statistics extension */
    int64_t trace_id;       /* > 0: traced (trace.h); its request id copied, as req is released first */
    char *trace_rid;
    struct http_gen *gen; /* a /generate request's sequence (http_generate.c), until answered */
    tp_mem_hold mem;   /* what it holds of the memory budget, given back when it ends */
    int64_t body_held; /* of that, the body buffer's (0: a spare buffer, not counted) */
    /* From here on, written before they are read whatever the request, so
     * a reused record keeps the last request's (take_record: 1.4 KiB
     * fewer to clear a request): */
    char method[16];       /* new_request */
    char url[256];         /* new_request */
    char timeout_what[64]; /* set_timeout, before it is submitted */
    tp_err err;            /* http_on_batch_done, when the batch failed (only then read) */
};

#define REQ_CTX_CLEARED offsetof(req_ctx, method)

/* ---- replies (http_reply.c) --------------------------------------------- */

/* ctype and, for a binary answer, its Inference-Header-Content-Length */
struct MHD_Response *http_with_headers(struct MHD_Response *resp, const char *ctype, size_t header_len);
/* Takes ownership of body (malloc'ed, or a buf_pool.h buffer when
 * pooled). Returns NULL only without memory. */
struct MHD_Response *http_make_response(char *body, size_t len, int pooled, const char *ctype, size_t header_len);
struct MHD_Response *http_error_response(const char *msg);
void http_log_request(const req_ctx *r, unsigned code, const char *msg);
/* Queues resp (consumed) on the connection. */
enum MHD_Result http_send_response(tp_http_ctx *h, req_ctx *r, unsigned code, struct MHD_Response *resp);
/* doc: a JSON document (malloc'ed, taken; NULL: out of memory) */
enum MHD_Result http_reply_json(tp_http_ctx *h, req_ctx *r, unsigned code, char *doc);
enum MHD_Result http_reply_error(tp_http_ctx *h, req_ctx *r, unsigned code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* A refusal of the memory budget: 413 or 503 (r->mem.refused) */
enum MHD_Result http_reply_budget(tp_http_ctx *h, req_ctx *r, const char *msg);

/* ---- the handlers, by protocol area ------------------------------------- */

/* http_infer.c: inference */
route_handler http_dispatch_infer;
/* http_status.c: health, metadata, model config, statistics, metrics */
route_handler http_get_live, http_get_ready, http_get_server, http_get_model, http_get_model_config, http_get_stats, http_get_metrics;
/* http_shm.c: system (and the absent CUDA) shared memory */
route_handler http_get_shm_status, http_post_shm_register, http_post_shm_unregister, http_cuda_shm;
/* http_repository.c: the model repository extension */
route_handler http_post_repository_index, http_post_repository_load, http_post_repository_unload;
/* http_logging.c: the logging and trace extensions' settings */
route_handler http_logging_settings, http_trace_settings;
/* http_generate.c: the generate extension */
route_handler http_post_generate, http_post_generate_stream;

/* ---- between the files -------------------------------------------------- */

/* http_status.c */
int http_is_ready(tp_http_ctx *h);
/* stuck_step_ms: 1 and why in msg while an engine step has run that long */
int http_engine_stuck(tp_http_ctx *h, char *msg, size_t cap);

/* http_infer.c: the inference state machine's steps the transport calls */
void http_infer_prewake(tp_http_ctx *h);
void http_run_held(tp_http_ctx *h);
enum MHD_Result http_answer_infer(tp_http_ctx *h, req_ctx *r);
void http_release_request(req_ctx *r);
void http_end_trace(tp_http_ctx *h, req_ctx *r, int sent);

/* http_generate.c: the generation scheduler of a generation graph (none
 * for another), started with the engine; a /generate request's calls
 * after its handler's (REQ_GENERATING), and its end when its connection
 * goes first */
tp_status http_generate_start(tp_http_ctx *h, struct tp_engine *e, tp_err *err);
enum MHD_Result http_generate_continue(tp_http_ctx *h, req_ctx *r);
void http_generate_end(req_ctx *r);
/* A generation model's settings and counters added to a model config
 * (stats 0: as "generate") or statistics answer (1: "generate_stats" in
 * the model's entry); doc (malloc'ed) is taken, the result returned. */
char *http_generate_annotate(tp_http_ctx *h, char *doc, int stats);

/* http_request.c: libmicrohttpd's callbacks (cls: the tp_http_ctx), and
 * what the inference handler takes from the transport */
enum MHD_Result http_on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                           const char *version, const char *upload_data, size_t *upload_size, void **con_cls);
enum MHD_Result http_on_probe_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                 const char *version, const char *upload_data, size_t *upload_size,
                                 void **con_cls);
void http_on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe);
int http_parse_ll(const char *s, long long *out);
void http_on_batch_done(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs, const tp_err *err,
                   const tp_batch_info *info);

/* http.c: the HTTP thread serving a connection (pin_threads, the acceptor) */
void http_watch_pin(tp_http_ctx *h, struct MHD_Connection *c);
int http_thread_serves_others(tp_http_ctx *h, const req_ctx *r);
int http_claim_alone(tp_http_ctx *h, struct MHD_Connection *c);
void http_end_alone(tp_http_ctx *h);

#endif
