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
static tp_http *http_server_of(tp_http_ctx *s) { return (tp_http *)s; }

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
int http_thread_serves_others(tp_http_ctx *s, const req_ctx *r)
{
    tp_http *h = http_server_of(s);
    find_thread_daemon(h, r->conn);
    return thread_daemon >= 0 && tp_acceptor_live(h->acceptor, thread_daemon) > 1;
}

/* pin_threads: the thread of the daemon serving c takes its CPU
 * (its pin's) on its first request, and later lets it go while the
 * CPU starves it (cpu_pin.h); the acceptor routes connections as though
 * it stayed. */
void http_watch_pin(tp_http_ctx *s, struct MHD_Connection *c)
{
    tp_http *h = http_server_of(s);
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
 * (tp_acceptor_claim_alone); http_end_alone after the step. */
int http_claim_alone(tp_http_ctx *s, struct MHD_Connection *c)
{
    tp_http *h = http_server_of(s);
    return find_thread_daemon(h, c) >= 0 && tp_acceptor_claim_alone(h->acceptor, thread_daemon);
}

void http_end_alone(tp_http_ctx *s) { tp_acceptor_end_alone(http_server_of(s)->acceptor, thread_daemon); }

/* How often tp_http_watch wants to run at most: a queued request's 504
 * is at most this late while the batcher thread is in a step, and an idle
 * server wakes this often (once a second, against 50 times once) */
#define WATCH_MS 1000

int tp_http_watch(tp_http *h)
{
    char msg[512];
    if (!http_engine_stuck(&h->s, msg, sizeof msg) && atomic_exchange(&h->s.stuck_now, 0))
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
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)http_on_completed, &h->s},
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
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, probes ? http_on_probe_request : http_on_request, &h->s,
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
    if (st == TP_OK)
        st = http_generate_start(&h->s, e, err);
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
    if (atomic_load(&h->s.loaded)) {
        tp_batcher_cancel(h->s.batcher, TP_UNAVAILABLE, DRAIN_CUT);
        tp_gen_stop(h->s.gen, "server is shutting down: drain timeout reached while generating");
    }
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
    /* every sequence ends and its suspended connection is resumed before the daemons stop */
    tp_gen_stop(h->s.gen, "the server is stopping");
    tp_acceptor_stop(h->acceptor); /* none is handed to a daemon while it stops */
    for (int i = 0; i < h->n_daemons; i++)
        if (h->d[i])
            MHD_stop_daemon(h->d[i]);
    tp_acceptor_free(h->acceptor); /* after the daemons: they report closes to it */
    tp_gen_free(h->s.gen);         /* after the daemons: their requests released their sequences */
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

