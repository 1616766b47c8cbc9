/* http.h — the KServe v2 REST front end on libmicrohttpd, and /metrics.
 *
 * HTTP threads (an epoll thread pool) parse, route and answer. An inference
 * request is decoded on the thread that read it and submitted to the
 * dynamic batcher (batcher.h). When the batcher is idle and the engine's
 * recent steps were short (inline_run_max_us), the batch runs on that very
 * thread and the answer goes out in the same call: no thread hand-off at
 * all. Otherwise the connection is suspended (MHD_suspend_connection), the
 * batcher thread runs the batch and resumes it, and the resumed HTTP thread
 * encodes the answer. So a slow model never stalls health checks or other
 * clients' uploads for longer than one short step. */
#ifndef TP_HTTP_H
#define TP_HTTP_H

#include "classify.h"
#include "config.h"
#include "engine.h"
#include "status.h"

#ifndef TPSERVE_VERSION
#define TPSERVE_VERSION "0.1.0"
#endif

typedef struct tp_http tp_http;

/* Binds cfg->host:cfg->port and starts serving in the loading state:
 * live is 200, ready and every model route 503. cfg is copied. */
tp_status tp_http_start(const tp_config *cfg, tp_http **out, tp_err *err);

/* The port actually bound (differs from cfg->port when that was 0). */
int tp_http_port(const tp_http *h);
/* HTTP threads serving the main port (threads 0 resolved to the cores) */
int tp_http_threads(const tp_http *h);

/* The class labels of the model's outputs (labels[k] for output k, NULL
 * where none; labels NULL when none has any), loaded by serve with the
 * engines: borrowed like them. Before tp_http_set_engines, which publishes
 * the model with them. */
void tp_http_set_labels(tp_http *h, const tp_labels *const *labels);

/* Starts the batcher on the loaded engine's n instances (borrowed: they
 * must outlive tp_http_stop; tp_batcher_create_instances), publishes the
 * model and turns ready. */
tp_status tp_http_set_engines(tp_http *h, tp_engine *const *e, int n, tp_err *err);

/* Starts the drain: readiness and new inference requests get 503, every
 * response closes its connection, and the listening socket stops accepting
 * (connections already queued in the kernel backlog are still answered).
 * Returns how many such queued connections it handed to the daemon: those
 * are not in tp_http_connections until an HTTP thread has taken them up. */
unsigned tp_http_begin_drain(tp_http *h);

/* The engine can no longer run (a rank's process died): from now on
 * liveness, readiness and every model route answer 503 with why. Returns 1
 * the first time. Called by one thread (serve's main loop). */
int tp_http_set_broken(tp_http *h, const char *why);

/* The main thread's look at the engine, now and then: stuck_step_ms logs
 * (once) a step that has run that long, and that it ended (readiness and
 * /metrics look for themselves; this is for a server nobody probes), and
 * queued requests past their deadline are answered 504 while the batcher
 * thread, inside a step, cannot (tp_batcher_expire). Returns the ms until
 * it wants to be called again. */
int tp_http_watch(tp_http *h);

/* Requests received but not yet answered; of those, the ones submitted to
 * the batcher (queued, inside the engine, or being answered); and open
 * connections. */
long tp_http_in_flight(tp_http *h);
long tp_http_in_engine(tp_http *h);
unsigned tp_http_connections(tp_http *h);

/* Drain timeout: answers every request still in the batcher queue with 503
 * at once. Requests already inside the engine
 * cannot be interrupted. */
void tp_http_cancel_queued(tp_http *h);

/* Stops the daemon and frees h; requests still uploading their body are
 * dropped. Only valid once tp_http_in_engine is 0
 * (libmicrohttpd forbids stopping with suspended connections). NULL is a
 * no-op. */
void tp_http_stop(tp_http *h);

#endif
