/* http_guard.h — connection policy for the HTTP server: what one client can
 * hold, and how long it may take, so that no client locks the others out.
 *
 * - max_connections (total; RLIMIT_NOFILE is raised so it can be reached,
 *   or it is lowered to what the limit allows) and max_connections_per_ip:
 *   values here, counted and enforced where the main port accepts
 *   (acceptor.h).
 * - request_deadline_ms: from a connection's accept (or its previous
 *   answer) to its request being complete. Unlike libmicrohttpd's idle
 *   timeout, a client trickling a byte at a time cannot extend it; past it
 *   the connection is shut down. Requests in the server's hands (queued,
 *   running) are never cut by it.
 * - clients that half-close: a connection whose client shut its sending
 *   side with its first request (FIN and request read together) is closed
 *   once what it sent is answered, instead of at request_timeout_ms
 *   (close_if_client_left in http_guard.c says why libmicrohttpd alone
 *   would not).
 * - protocol strictness: HTTP/1.1 without Host, two different
 *   Content-Length headers (request smuggling), a Transfer-Encoding other
 *   than chunked, obs-fold (a header line continued on the next, RFC 9112
 *   5.2) or whitespace in a header's name, and %00 in the path are
 *   refused.
 *
 * http.c owns the daemon; it adds tp_http_guard_options to its option list
 * and reports each request's progress with the two calls below. */
#ifndef TP_HTTP_GUARD_H
#define TP_HTTP_GUARD_H

#include <stddef.h>
#include <microhttpd.h>

#include "config.h"
#include "status.h"

typedef struct tp_http_guard tp_http_guard;

/* Starts the connection watcher (deadlines, half-closed clients); raises
 * RLIMIT_NOFILE for max_connections. */
tp_status tp_http_guard_create(const tp_config *cfg, tp_http_guard **out, tp_err *err);
/* Call after every daemon using its options has stopped. NULL is ok. */
void tp_http_guard_free(tp_http_guard *g);

/* Appends the guard's libmicrohttpd options (the connection notifier, the
 * URL unescaper, with libmicrohttpd 1.0 its stricter client discipline)
 * to opts; returns how many, at most TP_HTTP_GUARD_N_OPTIONS. on_closed
 * (non-NULL for the main port's daemons, the same for all of them) is
 * called with arg when one of the daemon's connections ends. */
#define TP_HTTP_GUARD_N_OPTIONS 3
int tp_http_guard_options(tp_http_guard *g, struct MHD_OptionItem *opts,
                          void (*on_closed)(void *arg, struct MHD_Connection *c), void *arg);
/* max_connections, lowered to what RLIMIT_NOFILE allows */
int tp_http_guard_max_connections(const tp_http_guard *g);

/* The request on c is complete (body in): the deadline no longer applies. */
void tp_http_guard_request_complete(struct MHD_Connection *c);
/* The answer on c was sent: a new deadline starts for the next request. */
void tp_http_guard_answered(struct MHD_Connection *c);

/* Header checks for a request whose headers just arrived: 0 when it may
 * proceed, else the HTTP status to answer (then close the connection) with
 * a one-line reason in msg. The same walk over the headers finds the first
 * value of each of the n_wanted headers wanted[] (any case; not ones the
 * checks read themselves: Content-Length, Transfer-Encoding, Host) for the
 * caller, in values[] (NULL: absent; valid while the request lasts),
 * sparing it more walks. */
unsigned tp_http_guard_check_headers(struct MHD_Connection *c, const char *version, const char *const *wanted,
                                     const char **values, int n_wanted, char *msg, size_t len);

#endif
