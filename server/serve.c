#include "serve.h"

#include <errno.h>
#include <malloc.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "batcher.h"
#include "classify.h"
#include "clock.h"
#include "config.h"
#include "engine.h"
#include "http.h"
#include "io_check.h"
#include "log.h"
#include "signals.h"
#include "worker.h"

void tp_serve_usage(FILE *out)
{
    fprintf(out,
            "usage: tpserve serve [GRAPH.json] [--config FILE] [--OPTION VALUE | --OPTION=VALUE]...\n"
            "\n"
            "Serves one graph over KServe v2 REST (model name = the graph's \"name\").\n"
            "Settings come from built-in defaults, then the --config JSON file, then flags.\n"
            "Each flag is also a config key (file spelling in the second column):\n"
            "\n");
    tp_config_usage(out);
    fprintf(out,
            "  --%-20s %-18s JSON object of the keys above; unknown keys are errors\n"
            "\n"
            "endpoints: GET /v2, /v2/health/live, /v2/health/ready, /v2/models/M[/versions/1],\n"
            "  /v2/models/M[/versions/1]/ready, /metrics (Prometheus); POST\n"
            "  /v2/models/M[/versions/1]/infer (JSON or binary tensor data with\n"
            "  Inference-Header-Content-Length; \"parameters\": {\"timeout\": us} per request).\n"
            "batching: concurrent requests are concatenated on the batch dim, up to\n"
            "  max_batch_size rows per engine run or max_queue_delay_us of waiting.\n"
            "signals: SIGTERM/SIGINT -> readiness 503, stop accepting, finish in-flight requests,\n"
            "  exit 0; after drain_timeout_ms (or another signal 1 s or more after the first)\n"
            "  queued requests get 503 and the exit code is 1 if a request was still running\n"
            "  in the engine. SIGHUP, SIGUSR1 and SIGUSR2 are logged and ignored.\n"
            "example: tpserve serve --config config/default.json --port 8080\n",
            "config", "(file)");
}

/* ---- arguments ---------------------------------------------------------- */

/* "--key=value" or "--key value"; advances *i past what it consumed. */
static tp_status take_flag(int argc, char **argv, int *i, char *key, size_t klen,
                           const char **value, tp_err *err)
{
    const char *a = argv[*i] + 2, *eq = strchr(a, '=');
    size_t n = eq ? (size_t)(eq - a) : strlen(a);
    if (n == 0 || n >= klen)
        return tp_fail(err, TP_INVALID, "bad option '%s'", argv[*i]);
    memcpy(key, a, n);
    key[n] = '\0';
    if (eq) {
        *value = eq + 1;
    } else if (*i + 1 < argc) {
        *value = argv[++*i];
    } else {
        return tp_fail(err, TP_INVALID, "option '--%s' needs a value", key);
    }
    return TP_OK;
}

/* Two passes: the config file is applied first wherever --config appears,
 * so flags always override it. */
static tp_status find_config(int argc, char **argv, const char **path, int *help, tp_err *err)
{
    *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            *help = 1;
            return TP_OK;
        }
        if (strncmp(argv[i], "--", 2) != 0)
            continue;
        char key[64];
        const char *v;
        tp_status st = take_flag(argc, argv, &i, key, sizeof key, &v, err);
        if (st != TP_OK)
            return st;
        if (strcmp(key, "config") == 0)
            *path = v;
    }
    return TP_OK;
}

static tp_status apply_flags(int argc, char **argv, tp_config *cfg, tp_err *err)
{
    int positional = 0;
    for (int i = 1; i < argc; i++) {
        tp_status st;
        if (strncmp(argv[i], "--", 2) != 0) {
            if (positional++)
                return tp_fail(err, TP_INVALID, "unexpected argument '%s'", argv[i]);
            st = tp_config_set(cfg, "graph", argv[i], err);
        } else {
            char key[64];
            const char *v;
            st = take_flag(argc, argv, &i, key, sizeof key, &v, err);
            if (st == TP_OK && strcmp(key, "config") != 0)
                st = tp_config_set(cfg, key, v, err);
        }
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

static tp_status load_config(int argc, char **argv, tp_config *cfg, int *help, tp_err *err)
{
    const char *path;
    tp_config_defaults(cfg);
    *help = 0;
    tp_status st = find_config(argc, argv, &path, help, err);
    if (st != TP_OK || *help)
        return st;
    if (path && (st = tp_config_load_file(cfg, path, err)) != TP_OK)
        return st;
    if ((st = apply_flags(argc, argv, cfg, err)) != TP_OK)
        return st;
    return tp_config_validate(cfg, err);
}

/* ---- lifecycle ---------------------------------------------------------- */

/* What the main thread sleeps on: the server's signals, blocked in every
 * thread (main() made sure of it before any thread existed, see signals.h;
 * threads started here inherit the mask) and read from a signalfd, and an
 * eventfd an engine writes when it becomes lost (tp_engine_opts.on_lost).
 * So an idle server's main thread sleeps until one of them comes; it used
 * to wake every 20 ms to ask the engines. */
typedef struct {
    int sig_fd, event_fd;
    /* a detached loader, or engines left running at exit, may still write
     * event_fd: it then stays open (the process is exiting) */
    int event_fd_held;
} main_wait;

static int open_main_wait(main_wait *w)
{
    sigset_t set;
    tp_signals_set(&set);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* a client closing early must not kill the server mid-write */
    signal(SIGPIPE, SIG_IGN);
    w->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    w->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (w->sig_fd >= 0 && w->event_fd >= 0)
        return 1;
    TP_LOG_E("cannot create the main thread's %s: %s", w->sig_fd < 0 ? "signalfd" : "eventfd", strerror(errno));
    return 0;
}

static void close_main_wait(main_wait *w)
{
    if (w->sig_fd >= 0)
        close(w->sig_fd);
    if (w->event_fd >= 0 && !w->event_fd_held)
        close(w->event_fd);
}

/* tp_engine_opts.on_lost: arg is the main thread's event_fd. */
static void wake_main(void *arg)
{
    uint64_t one = 1;
    (void)!write((int)(intptr_t)arg, &one, sizeof one);
}

/* The stop signal taken (SIGTERM, SIGINT) if one came within timeout_ms
 * (-1: no limit), else 0 for an event (wake_main), -1 when the time
 * passed; the other signals of the set are logged and waited through. */
static int wait_main(main_wait *w, int timeout_ms)
{
    for (;;) {
        struct pollfd pf[2] = {{w->sig_fd, POLLIN, 0}, {w->event_fd, POLLIN, 0}};
        int n = poll(pf, 2, timeout_ms);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) { /* cannot happen with valid fds; never spin on it */
            struct timespec ts = {0, 20 * 1000000L};
            nanosleep(&ts, NULL);
        }
        if (n <= 0)
            return -1;
        struct signalfd_siginfo si;
        if (pf[0].revents && read(w->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
            if (tp_signals_stop((int)si.ssi_signo))
                return (int)si.ssi_signo;
            TP_LOG_I("received %s: ignored, serving goes on (SIGTERM or SIGINT stops the server)",
                     strsignal((int)si.ssi_signo));
        }
        uint64_t v;
        if (pf[1].revents && read(w->event_fd, &v, sizeof v) == (ssize_t)sizeof v)
            return 0;
    }
}

/* A request sent on a keep-alive connection may sit unread in a socket
 * buffer while in_flight is 0; waiting for a short quiet spell lets it be
 * counted (and answered) before the daemon closes the connections. */
#define QUIET_MS 150

/* Signals within this long of the first are one burst (a supervisor
 * signalling a process group repeatedly), not a request to cut the drain. */
#define SIGNAL_BURST_MS 1000

/* Returns 1 when every accepted request was answered. adopted: connections
 * begin_drain took from the kernel's queue; the daemon may not count them
 * yet, and their requests may not have arrived, so "no connection left"
 * only ends the drain early when there were none (otherwise the quiet
 * period does). */
static int drain(tp_http *h, const tp_config *cfg, main_wait *w, unsigned adopted)
{
    double start = tp_now_ms(), deadline = start + cfg->drain_timeout_ms, quiet_since = -1;
    for (;;) {
        double t = tp_now_ms();
        if (tp_http_in_flight(h) > 0) {
            quiet_since = -1;
        } else {
            if (quiet_since < 0)
                quiet_since = t;
            if (t - quiet_since >= QUIET_MS || (adopted == 0 && tp_http_connections(h) == 0))
                return 1;
        }
        if (t >= deadline) {
            TP_LOG_W("drain timeout (%d ms) reached with %ld requests in flight",
                     cfg->drain_timeout_ms, tp_http_in_flight(h));
            return 0;
        }
        if (wait_main(w, 10) > 0 && tp_now_ms() - start >= SIGNAL_BURST_MS) {
            TP_LOG_W("second signal: ending the drain with %ld requests in flight",
                     tp_http_in_flight(h));
            return 0;
        }
    }
}

/* After a cut-short drain: queued requests get 503; those inside the engine
 * get up to a second more. Requests still uploading their body (a stalled
 * client) are not waited for: the daemon can stop under them. Returns 1 when
 * nothing is left in the engine, so stopping is safe. */
static int cancel_rest(tp_http *h)
{
    tp_http_cancel_queued(h);
    double until = tp_now_ms() + 1000;
    while (tp_http_in_engine(h) > 0 && tp_now_ms() < until) {
        struct timespec ts = {0, 10 * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (tp_http_in_engine(h) > 0)
        return 0;
    if (tp_http_in_flight(h) > 0)
        TP_LOG_W("dropping %ld requests whose body never finished arriving",
                 tp_http_in_flight(h));
    return 1;
}

static const char *url_host(const char *host, char *buf, size_t len)
{
    snprintf(buf, len, strchr(host, ':') ? "[%s]" : "%s", host); /* IPv6 literal */
    return buf;
}

/* Why an instance can run nothing more, or NULL while all can. */
static const char *any_lost(tp_engine *const *inst, int n)
{
    for (int k = 0; k < n; k++) {
        const char *lost = tp_engine_lost(inst[k]);
        if (lost)
            return lost;
    }
    return NULL;
}

/* Whether an instance's device may still run work that nothing may wait
 * for (tp_engine_must_exit): then only this process's end stops it. */
static int any_must_exit(tp_engine *const *inst, int n)
{
    for (int k = 0; k < n; k++)
        if (tp_engine_must_exit(inst[k]))
            return 1;
    return 0;
}

/* A lost engine whose device must not be waited on: readiness is already
 * 503; what is in flight is answered (at once: a lost engine refuses),
 * then the server exits with status 1 so that its orchestrator starts a
 * new process. Freeing the engines after it releases nothing on the
 * device. 1, or -1 when requests are still inside the engine. */
static int exit_after_loss(tp_http *h, const tp_config *cfg, main_wait *w, const char *lost)
{
    TP_LOG_E("%s: exiting so that a new process takes over (the device may still run work that never completes, "
             "which only the end of this process stops)", lost);
    return drain(h, cfg, w, tp_http_begin_drain(h)) || cancel_rest(h) ? 1 : -1;
}

static int serve_until_signal(tp_http *h, tp_engine *const *inst, const tp_config *cfg, main_wait *w)
{
    tp_err err;
    char hb[300];
    tp_engine *e = inst[0];
    if (tp_http_set_engines(h, inst, cfg->instances, &err) != TP_OK) {
        TP_LOG_E("%s", err.msg);
        return 1;
    }
    if (*tp_engine_backend_note(e))
        TP_LOG_I("%s", tp_engine_backend_note(e));
    tp_engine_stats es;
    tp_engine_get_stats(e, &es);
    char serial[64] = "";
    if (es.serial_step_max_us)
        snprintf(serial, sizeof serial, ", serial steps up to %d us", es.serial_step_max_us);
    TP_LOG_I("ready: graph=%s model=%s ranks=%d (%s%s) backend=%s listen=http://%s:%d threads=%d "
             "instances=%d max_body_bytes=%lld", cfg->graph, tp_engine_model_name(e), tp_engine_world_size(e),
             cfg->ranks, serial, tp_engine_backend_name(e), url_host(cfg->host, hb, sizeof hb), tp_http_port(h),
             tp_http_threads(h), cfg->instances, (long long)cfg->max_body_bytes);
    int sig;
    /* woken by an engine that became lost (a step failed for good, or a
     * rank's process ended): readiness turns 503 at once; and now and then
     * (tp_http_watch: a stuck step logged, queued requests' 504s while the
     * batcher thread is inside a step) */
    while ((sig = wait_main(w, tp_http_watch(h))) <= 0) {
        const char *lost = any_lost(inst, cfg->instances);
        if (lost && tp_http_set_broken(h, lost))
            TP_LOG_E("%s: the server is not ready and not live (503) from now on; restart it", lost);
        if (lost && any_must_exit(inst, cfg->instances))
            return exit_after_loss(h, cfg, w, lost);
    }
    TP_LOG_I("received %s: draining (readiness 503, no new connections, up to %d ms for %ld "
             "in-flight requests)", sig == SIGINT ? "SIGINT" : "SIGTERM", cfg->drain_timeout_ms,
             tp_http_in_flight(h));
    if (drain(h, cfg, w, tp_http_begin_drain(h))) {
        TP_LOG_I("drained: every accepted request was answered; exiting");
        return 0;
    }
    if (cancel_rest(h)) {
        TP_LOG_I("drain cut short: every complete request was answered; exiting");
        return 0;
    }
    return -1;
}

/* ---- the model's class labels ------------------------------------------ */

/* The labels setting read for the loaded graph (Triton's label_filename):
 * labels[k] for output k, NULL where none was given; the array NULL when
 * the setting is empty. HTTP serves them by reference (tp_http_set_labels),
 * so they are freed after tp_http_stop. */
typedef struct {
    const tp_config *cfg;
    tp_io_desc *outs; /* the graph's outputs (a copy: tp_io_find takes an array) */
    int n_outs;
    tp_labels **labels;
} model_labels;

/* One "OUTPUT=FILE" of the labels setting (len bytes at spec): the file
 * read into m->labels[the output]. */
static tp_status load_output_labels(model_labels *m, const char *spec, size_t len, tp_err *err)
{
    char item[sizeof m->cfg->labels], names[512];
    snprintf(item, sizeof item, "%.*s", (int)len, spec);
    char *eq = strchr(item, '=');
    if (!eq || eq == item || !eq[1])
        return tp_fail(err, TP_INVALID, "labels: '%s' is not OUTPUT=FILE", item);
    *eq = '\0';
    int k = tp_io_find(m->outs, m->n_outs, item);
    if (k < 0)
        return tp_fail(err, TP_INVALID, "labels: '%s' is not an output of the graph (outputs: %s)", item,
                       tp_io_names(names, sizeof names, m->outs, m->n_outs));
    if (m->labels[k])
        return tp_fail(err, TP_INVALID, "labels: output '%s' is given labels twice", item);
    tp_status st = tp_labels_load(eq + 1, &m->labels[k], err);
    if (st == TP_OK)
        TP_LOG_I("output '%s': %lld class labels from %s", item, (long long)tp_labels_count(m->labels[k]), eq + 1);
    return st;
}

/* The labels setting ("OUTPUT=FILE,..."), read once the outputs of e are
 * known. m is set whatever the result (free_labels). */
static tp_status load_labels(const tp_config *cfg, const tp_engine *e, model_labels *m, tp_err *err)
{
    *m = (model_labels){cfg, NULL, tp_engine_n_outputs(e), NULL};
    const char *spec = cfg->labels;
    if (!*spec)
        return TP_OK;
    m->outs = calloc((size_t)m->n_outs + 1, sizeof *m->outs);
    if (!m->outs || !(m->labels = calloc((size_t)m->n_outs, sizeof *m->labels)))
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < m->n_outs; i++)
        m->outs[i] = *tp_engine_output(e, i);
    for (;;) {
        size_t len = strcspn(spec, ",");
        tp_status st = load_output_labels(m, spec, len, err);
        if (st != TP_OK || !spec[len])
            return st;
        spec += len + 1;
    }
}

static void free_labels(model_labels *m)
{
    for (int i = 0; m->labels && i < m->n_outs; i++)
        tp_labels_free(m->labels[i]);
    free(m->labels);
    free(m->outs);
}

/* The graph loads on its own thread so SIGTERM is honoured while a large
 * graph is still loading (a rollout must not wait for weights to map). */
typedef struct {
    tp_config cfg; /* a copy: a detached loader may outlive the caller's frame */
    int event_fd;  /* the main thread's (main_wait), for the engines' on_lost */
    tp_engine *e[TP_BATCHER_MAX_INSTANCES]; /* cfg.instances of them (config.c caps it so) */
    tp_status st;
    tp_err err;
    _Atomic int done;
} load_job;

/* ranks=processes: this process is rank 0; the others are spawned workers
 * compiling the same options, or external ones joining at the rendezvous. */
static tp_rank_group_opts group_opts(const tp_config *c, char *const *worker_argv)
{
    return (tp_rank_group_opts){
        .mode = TP_GROUP_PROCESSES,
        .worker_argv = c->rendezvous[0] ? NULL : worker_argv,
        .rendezvous = c->rendezvous[0] ? c->rendezvous : NULL,
        .secret_file = c->rendezvous_secret_file[0] ? c->rendezvous_secret_file : NULL,
        .join_uid = c->rendezvous_uid,
        .staging_bytes = (size_t)c->staging_mb << 20,
        .heap_bytes = (size_t)c->rank_heap_mb << 20,
        .step_timeout_ms = c->step_timeout_ms,
    };
}

static void *load_main(void *arg)
{
    load_job *j = arg;
    const tp_config *c = &j->cfg;
    int64_t buckets[TP_MAX_BUCKETS];
    tp_engine_opts opts = {.backend = c->backend, .settings = &c->backend_settings, .buckets = buckets,
                           .serial_step_max_us = c->serial_step_max_us, .on_lost = wake_main,
                           .on_lost_arg = (void *)(intptr_t)j->event_fd, .state_slots = c->generate_slots};
    tp_worker_spec ws = {.graph = c->graph, .backend = c->backend, .buckets = c->buckets,
                         .slots = c->generate_slots};
    char **argv = strcmp(c->ranks, "processes") == 0 ? tp_worker_argv(&ws) : NULL;
    tp_rank_group_opts go = group_opts(c, argv);
    if (argv)
        opts.group = &go;
    j->st = c->buckets[0] ? tp_parse_buckets(c->buckets, buckets, &opts.n_buckets, &j->err) : TP_OK;
    if (j->st == TP_OK && strcmp(c->ranks, "processes") == 0 && !argv)
        j->st = tp_fail(&j->err, TP_NOMEM, "out of memory");
    for (int k = 0; j->st == TP_OK && k < c->instances; k++)
        if ((j->st = tp_engine_create(c->graph, &opts, &j->e[k], &j->err)) != TP_OK && k > 0)
            tp_err_prefix(&j->err, "instance %d: ", k);
    tp_worker_argv_free(argv);
    atomic_store(&j->done, 1);
    return NULL;
}

/* Returns 1 when the load finished (successfully or not), 0 when a signal
 * came first; then the loader is left running (it cannot be interrupted)
 * and the caller exits without serving. */
static int wait_load(load_job *j, pthread_t th, main_wait *w)
{
    while (!atomic_load(&j->done)) {
        int sig = wait_main(w, 20);
        if (sig > 0) {
            TP_LOG_I("received %s while loading: exiting without serving",
                     sig == SIGINT ? "SIGINT" : "SIGTERM");
            pthread_detach(th);
            return 0;
        }
    }
    pthread_join(th, NULL);
    return 1;
}

/* An engine that must exit (tp_engine_must_exit) is not freed: its device
 * may still run work that reads its host memory, which only the process's
 * exit may take away; it stays reachable here, not a leak. */
static tp_engine *left_to_exit[TP_BATCHER_MAX_INSTANCES];

static void free_instances(tp_engine **inst, int n)
{
    for (int k = 0; k < n; k++) {
        if (inst[k] && tp_engine_must_exit(inst[k]))
            left_to_exit[k] = inst[k];
        else
            tp_engine_free(inst[k]);
    }
}

static int load_and_serve(tp_http *h, const tp_config *cfg, main_wait *w)
{
    load_job *j = calloc(1, sizeof *j);
    pthread_t th;
    if (j) {
        j->cfg = *cfg;
        j->event_fd = w->event_fd;
    }
    if (!j || pthread_create(&th, NULL, load_main, j) != 0) {
        free(j);
        TP_LOG_E("cannot start the graph loader thread");
        tp_http_stop(h);
        return 1;
    }
    if (!wait_load(j, th, w)) {
        /* nothing was served: the drain only answers stragglers (503) */
        drain(h, cfg, w, tp_http_begin_drain(h));
        tp_http_stop(h);
        w->event_fd_held = 1;
        return 0; /* j stays with the detached loader, which may still write it */
    }
    tp_engine *inst[TP_BATCHER_MAX_INSTANCES];
    memcpy(inst, j->e, sizeof inst);
    int ok = j->st == TP_OK;
    if (!ok)
        TP_LOG_E("cannot load graph %s: %s", cfg->graph, j->err.msg);
    free(j);
    if (!ok) {
        tp_http_stop(h);
        free_instances(inst, cfg->instances);
        return 1;
    }
    /* the engines are in: their outputs' labels next, served from here on */
    model_labels labels;
    tp_err err;
    int rc = 1;
    if (load_labels(cfg, inst[0], &labels, &err) != TP_OK) {
        TP_LOG_E("%s", err.msg);
    } else {
        tp_http_set_labels(h, (const tp_labels *const *)labels.labels);
        rc = serve_until_signal(h, inst, cfg, w);
    }
    if (rc < 0) {
        /* Requests are still running inside the engine; stopping the daemon
         * or freeing the engine under them is undefined, and the process is
         * about to exit, which releases everything. */
        TP_LOG_E("exiting with %ld requests still inside the engine", tp_http_in_engine(h));
        w->event_fd_held = 1;
        return 1;
    }
    tp_http_stop(h);
    free_labels(&labels);
    free_instances(inst, cfg->instances);
    return rc;
}

/* Memory a request frees stays in the process for the next one. glibc
 * otherwise hands a thread arena's free top back to the kernel
 * (madvise(MADV_DONTNEED), past a threshold it moves as it sees large
 * blocks come and go) and serves blocks past another from mmap: the next
 * request touching that memory page-faults it back in, zeroed, and each
 * give-back shoots down the other CPUs' TLBs. Under wrk that was 3.3
 * faults a request for 8-row JSON answers (~22 KB of text) and 0.5 for
 * 64-row binary ones; with these settings 0.0000-0.03 (server/README.md at 27cb4dd,
 * "Requests without page faults"). Fixed, the thresholds bound what stays:
 * up to KEEP_FREED_BYTES free at the top of each arena, and blocks from
 * HEAP_BLOCK_MAX_BYTES up (a large request's tensors) still come from mmap
 * and go back when freed. */
#define KEEP_FREED_BYTES (16 << 20)
#define HEAP_BLOCK_MAX_BYTES (1 << 20)

static void keep_freed_memory(void)
{
    if (!mallopt(M_TRIM_THRESHOLD, KEEP_FREED_BYTES) || !mallopt(M_MMAP_THRESHOLD, HEAP_BLOCK_MAX_BYTES))
        TP_LOG_W("malloc settings refused; freed memory may go back to the kernel between requests");
}

int tp_serve_main(int argc, char **argv)
{
    tp_config cfg;
    tp_err err;
    int help;
    if (load_config(argc, argv, &cfg, &help, &err) != TP_OK) {
        fprintf(stderr, "tpserve serve: %s (see tpserve serve --help)\n", err.msg);
        return 2;
    }
    if (help) {
        tp_serve_usage(stdout);
        return 0;
    }
    tp_log_level lvl = TP_LOG_INFO;
    tp_log_level_from_name(cfg.log_level, &lvl);
    tp_log_set_level(lvl);
    keep_freed_memory();
    main_wait w = {-1, -1, 0};
    if (!open_main_wait(&w)) {
        close_main_wait(&w);
        return 1;
    }
    tp_http *h;
    char hb[300];
    if (tp_http_start(&cfg, &h, &err) != TP_OK) {
        TP_LOG_E("cannot start the HTTP server: %s", err.msg);
        close_main_wait(&w);
        return 1;
    }
    TP_LOG_I("listening on http://%s:%d, loading graph %s (backend %s)",
             url_host(cfg.host, hb, sizeof hb), tp_http_port(h), cfg.graph, cfg.backend);
    int rc = load_and_serve(h, &cfg, &w);
    close_main_wait(&w);
    return rc;
}
