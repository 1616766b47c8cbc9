#include "http_guard.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>

#include "clock.h"
#include "log.h"

/* One per open connection, linked in the guard's list from libmicrohttpd's
 * STARTED notification to its CLOSED one. libmicrohttpd notifies CLOSED
 * before it closes the socket, and the watcher shuts sockets down only
 * under the same mutex, so it never touches a descriptor already reused. */
typedef struct conn_entry {
    struct conn_entry *prev, *next;
    int fd;
    _Atomic int64_t since_ms; /* accept, or the previous answer */
    _Atomic int waiting;      /* 1 while the client owes us (part of) a request */
    int cut;                  /* shut down once already */
    _Atomic unsigned answered; /* answers sent (its thread adds, the watcher reads) */
    unsigned peeked;          /* answered at the watcher's last peek (g->mu) */
    _Atomic int client_done;  /* the client half-closed: it sends nothing more */
    struct tp_http_guard *g;
} conn_entry;

struct tp_http_guard {
    int max_connections, deadline_ms;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    conn_entry head; /* sentinel of a circular list */
    /* the main port's daemons' connection ends, reported (tp_http_guard_options) */
    void (*on_closed)(void *arg, struct MHD_Connection *c);
    void *on_closed_arg;
    int stopping;
    int done_pending; /* connections with client_done the watcher has to look at */
    pthread_t watcher;
    int watching;
};

/* How long a connection whose client half-closed stays open after an
 * answer with no next request begun: its pipelined requests, already in
 * libmicrohttpd's buffer, each begin within microseconds of the previous
 * answer. */
#define CLIENT_DONE_GRACE_MS 20

/* How long after an answer the watcher peeks at a connection whose client
 * has sent nothing since (late_peek_found_eof), and how often it wakes
 * while connections are open: long enough that a client under load, which
 * sends its next request within microseconds, is never peeked, and the
 * walk of the list is ten a second; short enough that a client waiting
 * for the close is not kept. */
#define LATE_PEEK_MS 100

/* ---- the deadline watcher ------------------------------------------------ */

/* A client that half-closes with a later request on a kept-alive
 * connection, the FIN in the same edge as the request, is not seen by
 * libmicrohttpd (close_if_client_left) nor by the first answer's peek. The
 * watcher peeks, off the request path, at a connection idle LATE_PEEK_MS
 * after an answer it has not peeked since; libmicrohttpd's buffer holds
 * nothing unanswered by then. g->mu held, so the descriptor is still the
 * connection's (conn_entry). */
static int late_peek_found_eof(conn_entry *e, int64_t idle)
{
    unsigned answered = atomic_load(&e->answered);
    /* the first answer peeked itself (close_if_client_left) */
    if (idle < LATE_PEEK_MS || answered <= 1 || answered == e->peeked)
        return 0;
    e->peeked = answered;
    char b;
    if (recv(e->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
        return 0;
    atomic_store(&e->client_done, 1);
    return 1;
}

/* Shuts down the connections past request_deadline_ms, and those whose
 * client half-closed and that have answered everything it sent
 * (close_if_client_left, late_peek_found_eof); g->mu held. Returns how
 * many for the deadline; *done_left: client_done connections still open. */
static int cut_overdue(tp_http_guard *g, int64_t now, int *done_left)
{
    int n = 0;
    *done_left = 0;
    for (conn_entry *e = g->head.next; e != &g->head; e = e->next) {
        int done = atomic_load(&e->client_done);
        if (e->cut || !atomic_load(&e->waiting)) {
            *done_left += done && !e->cut; /* a request in progress: look again soon */
            continue;
        }
        int64_t idle = now - atomic_load(&e->since_ms);
        if (!done)
            done = late_peek_found_eof(e, idle);
        if ((g->deadline_ms > 0 && idle > g->deadline_ms) || (done && idle >= CLIENT_DONE_GRACE_MS)) {
            /* libmicrohttpd sees the socket fail and closes the connection
             * through its usual path (the fd stays its to close). */
            shutdown(e->fd, SHUT_RDWR);
            e->cut = 1;
            n += !done;
        } else {
            *done_left += done;
        }
    }
    return n;
}

static struct timespec in_ms(int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

static void *watch_main(void *arg)
{
    tp_http_guard *g = arg;
    /* a tenth of the deadline (at least 10 ms): cuts land within 10% of it;
     * without a deadline only close_if_client_left's wake-ups matter */
    int64_t tick = g->deadline_ms <= 0 ? 60000 : g->deadline_ms / 10 > 10 ? g->deadline_ms / 10 : 10;
    pthread_mutex_lock(&g->mu);
    while (!g->stopping) {
        int done_left;
        g->done_pending = 0;
        int n = cut_overdue(g, tp_now_ms_coarse(), &done_left);
        if (n)
            TP_LOG_D("request_deadline_ms %d passed: closed %d connections", g->deadline_ms, n);
        int open = g->head.next != &g->head;
        if (g->done_pending)
            continue;
        /* with no connection there is nothing to look at until one opens
         * (on_connection signals): an idle server does not wake */
        if (!open) {
            pthread_cond_wait(&g->cv, &g->mu);
            continue;
        }
        struct timespec ts = in_ms(done_left ? CLIENT_DONE_GRACE_MS / 2 : tick > LATE_PEEK_MS ? LATE_PEEK_MS : tick);
        pthread_cond_timedwait(&g->cv, &g->mu, &ts);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

/* ---- libmicrohttpd callbacks ------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                          enum MHD_ConnectionNotificationCode code)
{
    tp_http_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        conn_entry *e = calloc(1, sizeof *e);
        if (!e || !fi) {
            free(e); /* not watched: only the idle timeout applies */
            return;
        }
        e->fd = fi->connect_fd;
        e->g = g;
        atomic_init(&e->since_ms, tp_now_ms_coarse());
        atomic_init(&e->waiting, 1);
        pthread_mutex_lock(&g->mu);
        if (g->head.next == &g->head) /* the watcher may sleep a whole tick: wake it (LATE_PEEK_MS) */
            pthread_cond_signal(&g->cv);
        e->next = g->head.next;
        e->prev = &g->head;
        g->head.next->prev = e;
        g->head.next = e;
        pthread_mutex_unlock(&g->mu);
        *socket_context = e;
        return;
    }
    conn_entry *e = *socket_context;
    if (!e)
        return;
    pthread_mutex_lock(&g->mu);
    e->prev->next = e->next;
    e->next->prev = e->prev;
    pthread_mutex_unlock(&g->mu);
    free(e);
    *socket_context = NULL;
}

/* libmicrohttpd notifies CLOSED for every connection it notified STARTED,
 * including one it fails to set up after that */
static void on_main_connection(void *cls, struct MHD_Connection *c, void **socket_context,
                               enum MHD_ConnectionNotificationCode code)
{
    tp_http_guard *g = cls;
    on_connection(g, c, socket_context, code);
    if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        g->on_closed(g->on_closed_arg, c);
}

static conn_entry *entry_of(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return i ? i->socket_context : NULL;
}

void tp_http_guard_request_complete(struct MHD_Connection *c)
{
    conn_entry *e = entry_of(c);
    if (e)
        atomic_store(&e->waiting, 0);
}

/* A client that half-closes once it has sent its request (`nc -N`, HTTP
 * conformance probes, scripts that read to EOF) waits for our close.
 * When its FIN came with the request, libmicrohttpd 0.9.75 read both in
 * one edge of its edge-triggered epoll without seeing the end of the
 * stream, and no later edge comes: the kept-alive connection stayed open
 * until request_timeout_ms (30 s) and the client waited as long. After a
 * connection's first answer one peek tells. At the end of the stream the
 * connection is marked, and the watcher shuts it down once it has been
 * idle CLIENT_DONE_GRACE_MS after an answer: not at once, as requests the
 * client pipelined before its FIN may still be in libmicrohttpd's buffer,
 * unanswered. Only the first answer: a peek is a system call, and a
 * kept-alive client's later requests must not pay it (a FIN that arrives
 * on its own wakes libmicrohttpd, which then closes by itself; one with a
 * later request is the watcher's late peek). */
static void close_if_client_left(conn_entry *e)
{
    char b;
    if (atomic_fetch_add_explicit(&e->answered, 1, memory_order_relaxed) ||
        recv(e->fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) != 0)
        return;
    atomic_store(&e->client_done, 1);
    tp_http_guard *g = e->g;
    pthread_mutex_lock(&g->mu);
    g->done_pending = 1;
    pthread_cond_signal(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

void tp_http_guard_answered(struct MHD_Connection *c)
{
    conn_entry *e = entry_of(c);
    if (e) {
        atomic_store(&e->since_ms, tp_now_ms_coarse());
        atomic_store(&e->waiting, 1);
        close_if_client_left(e);
    }
}

static int hexval(int ch)
{
    return isdigit(ch) ? ch - '0' : isxdigit(ch) ? tolower(ch) - 'a' + 10 : -1;
}

/* RFC 3986 percent-decoding in place, except %00: a NUL would end the
 * path early ("/v2/models/M%00evil/ready" routed as model M), so it stays
 * the three characters it was and the path matches nothing. */
static size_t unescape_keep_nul(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    char *w = s;
    for (const char *p = s; *p; p++) {
        int hi = p[0] == '%' ? hexval((unsigned char)p[1]) : -1;
        int lo = hi >= 0 ? hexval((unsigned char)p[2]) : -1;
        if (lo >= 0 && (hi | lo) != 0) {
            *w++ = (char)(hi * 16 + lo);
            p += 2;
        } else {
            *w++ = *p;
        }
    }
    *w = '\0';
    return (size_t)(w - s);
}

/* libmicrohttpd 1.0's MHD_OPTION_CLIENT_DISCIPLINE_LVL: not in 0.9's
 * header, and 0.9 refuses to start a daemon given an option it does not
 * know, so it is named by number and given only to 1.0 */
#define MHD_CLIENT_DISCIPLINE_LVL 38

/* The libmicrohttpd loaded, not the one built against: Debian 13's 1.0.1
 * keeps 0.9.75's ABI and is loaded in its place. */
static int mhd_at_least_1_0(void)
{
    const char *v = MHD_get_version();
    return v && atoi(v) >= 1;
}

int tp_http_guard_options(tp_http_guard *g, struct MHD_OptionItem *opts,
                          void (*on_closed)(void *arg, struct MHD_Connection *c), void *arg)
{
    int n = 0;
    if (on_closed) {
        g->on_closed = on_closed;
        g->on_closed_arg = arg;
    }
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_NOTIFY_CONNECTION,
                                        (intptr_t)(on_closed ? on_main_connection : on_connection), g};
    opts[n++] = (struct MHD_OptionItem){MHD_OPTION_UNESCAPE_CALLBACK, (intptr_t)unescape_keep_nul, NULL};
    /* 1.0 unfolds obs-fold lines into spaces at its default discipline (0),
     * where the header walk cannot tell (folded_or_spaced); at 1, "more
     * strict, within the limits RFCs set for servers", it answers them 400
     * and closes the connection itself, as it does a bare LF line end,
     * whitespace in the URL or Content-Length with Transfer-Encoding */
    if (mhd_at_least_1_0())
        opts[n++] = (struct MHD_OptionItem){(enum MHD_OPTION)MHD_CLIENT_DISCIPLINE_LVL, 1, NULL};
    return n;
}

int tp_http_guard_max_connections(const tp_http_guard *g) { return g->max_connections; }

/* ---- header checks ----------------------------------------------------- */

typedef struct {
    int n_cl, cl_differ, has_te, has_host;
    const char *folded; /* the first header folded or with whitespace in its name */
    const char *cl, *te;
    const char *const *wanted; /* the caller's headers */
    const char **values;       /* their first values */
    int n_wanted;
} header_scan;

/* Was this header's line folded onto the next one (obs-fold: a line
 * beginning with a space or tab continues the previous header, RFC 9112
 * 5.2), or is there whitespace in or before its name? A server must
 * refuse either (or unfold it, which libmicrohttpd 0.9 gets wrong).
 *
 * libmicrohttpd (0.9 and 1.0) parses a header in place in the connection's
 * read buffer: its name, a NUL where the colon was, optional spaces and
 * tabs, its value. 0.9.75-0.9.77 take a continuation line by appending it
 * to the header's *name*, moved to a new block of the connection's pool
 * ("Transfer-Encoding: chunked\r\n gzip" becomes a header
 * "Transfer-Encodinggzip: chunked", and Transfer-Encoding is gone), so a
 * folded header is one whose value does not follow its name. The header
 * walk never sees the raw lines, and this is where the fold shows.
 * libmicrohttpd 1.0 refuses folds itself at the discipline
 * tp_http_guard_options gives it (at its default it unfolds them into
 * spaces, name and value staying adjacent: never a false alarm here). A
 * first header line beginning with whitespace (RFC 9112 2.2) comes as a
 * name beginning with it. */
static int folded_or_spaced(const char *key, const char *value)
{
    size_t n = strcspn(key, " \t");
    if (key[n] || !value)
        return key[n] != 0;
    const char *p = key + n + 1;
    /* bounded: no client needs a kilobyte of spaces before a value */
    if ((uintptr_t)value < (uintptr_t)p || (uintptr_t)value - (uintptr_t)p > 1024)
        return 1;
    for (; p < value; p++)
        if (*p != ' ' && *p != '\t')
            return 1;
    return 0;
}

static enum MHD_Result scan_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    (void)kind;
    header_scan *s = cls;
    if (!s->folded && folded_or_spaced(key, value))
        s->folded = key;
    if (strcasecmp(key, MHD_HTTP_HEADER_CONTENT_LENGTH) == 0) {
        if (s->n_cl++ && strcmp(s->cl, value ? value : "") != 0)
            s->cl_differ = 1;
        s->cl = value ? value : "";
    } else if (strcasecmp(key, MHD_HTTP_HEADER_TRANSFER_ENCODING) == 0) {
        s->has_te++;
        s->te = value ? value : "";
    } else if (strcasecmp(key, MHD_HTTP_HEADER_HOST) == 0) {
        s->has_host = 1;
    } else {
        for (int i = 0; i < s->n_wanted; i++)
            if (!s->values[i] && strcasecmp(key, s->wanted[i]) == 0)
                s->values[i] = value ? value : "";
    }
    return MHD_YES;
}

unsigned tp_http_guard_check_headers(struct MHD_Connection *c, const char *version, const char *const *wanted,
                                     const char **values, int n_wanted, char *msg, size_t len)
{
    header_scan s = {.wanted = wanted, .values = values, .n_wanted = n_wanted};
    for (int i = 0; i < n_wanted; i++)
        values[i] = NULL;
    MHD_get_connection_values(c, MHD_HEADER_KIND, scan_header, &s);
    if (s.folded) {
        /* the header it was meant to be is not among those read: answering
         * as if the rest were all there is would read the body wrongly */
        snprintf(msg, len, "a header line continued on a line beginning with a space or tab (obs-fold, RFC 9112 "
                 "5.2), or whitespace in a header's name ('%.60s' as read): refused", s.folded);
        return 400;
    }
    if (s.cl_differ) {
        snprintf(msg, len, "two different Content-Length headers: the body's end is ambiguous");
        return 400;
    }
    if (s.has_te && s.n_cl) {
        snprintf(msg, len, "both Transfer-Encoding and Content-Length: the body's end is ambiguous");
        return 400;
    }
    if (s.has_te && (s.has_te > 1 || strcasecmp(s.te, "chunked") != 0)) {
        snprintf(msg, len, "Transfer-Encoding '%.100s' is not supported (only chunked)", s.te);
        return 501;
    }
    if (strcmp(version, MHD_HTTP_VERSION_1_1) == 0 && !s.has_host) {
        snprintf(msg, len, "HTTP/1.1 request without a Host header");
        return 400;
    }
    return 0;
}

/* ---- lifecycle --------------------------------------------------------- */

/* Every connection is a descriptor; a limit above RLIMIT_NOFILE would make
 * accept() fail instead of queueing in the backlog. */
static void raise_fd_limit(tp_http_guard *g)
{
    struct rlimit rl;
    rlim_t want = (rlim_t)g->max_connections + 256; /* + weights, logs, the rank group */
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur >= want)
        return;
    rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur < want) {
        int fit = (int)rl.rlim_cur > 512 ? (int)rl.rlim_cur - 256 : 256;
        TP_LOG_W("max_connections %d needs %llu descriptors, RLIMIT_NOFILE allows %llu: using %d",
                 g->max_connections, (unsigned long long)want, (unsigned long long)rl.rlim_cur, fit);
        g->max_connections = fit;
    }
}

tp_status tp_http_guard_create(const tp_config *cfg, tp_http_guard **out, tp_err *err)
{
    *out = NULL;
    tp_http_guard *g = calloc(1, sizeof *g);
    if (!g)
        return tp_fail(err, TP_NOMEM, "out of memory");
    g->max_connections = cfg->max_connections;
    g->deadline_ms = cfg->request_deadline_ms;
    g->head.next = g->head.prev = &g->head;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    raise_fd_limit(g);
    if (pthread_create(&g->watcher, NULL, watch_main, g) != 0) {
        tp_http_guard_free(g);
        return tp_fail(err, TP_INTERNAL, "cannot start the connection watcher");
    }
    g->watching = 1;
    *out = g;
    return TP_OK;
}

void tp_http_guard_free(tp_http_guard *g)
{
    if (!g)
        return;
    if (g->watching) {
        pthread_mutex_lock(&g->mu);
        g->stopping = 1;
        pthread_cond_signal(&g->cv);
        pthread_mutex_unlock(&g->mu);
        pthread_join(g->watcher, NULL);
    }
    pthread_mutex_destroy(&g->mu);
    pthread_cond_destroy(&g->cv);
    free(g);
}
