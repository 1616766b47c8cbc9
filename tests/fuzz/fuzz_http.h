/* fuzz_http.h — whatever bytes a client sends, to a whole server: the
 * harness, with its ranks' mode left to the file that includes it
 * (FUZZ_HTTP_RANKS: fuzz_http.c "threads", fuzz_http_processes.c
 * "processes"; header-only, as each harness is one translation unit).
 *
 * The other harnesses feed one parser each. This one starts the real
 * thing in process, once: tp_http on a loopback port in front of the
 * example graph (mlp_sp_tp2, cpu backend), with client shared memory
 * allowed, one region's object ready to register, and a trace file (in a
 * directory of its own) that inputs may turn tracing on for. Each input is the
 * bytes of one to MAX_CONNS client connections (CONN_SEP between them),
 * sent at once so their requests meet in the batcher: one request each,
 * several pipelined, or garbage. Each client half-closes once it has sent
 * everything and reads what the server answers; one whose bytes begin
 * with RESET_MARK resets the connection instead, as soon as it has sent
 * the rest (its request may be in a batch by then: server/handoff.h). A
 * client whose bytes hold ANSWER_MARK sends what comes before it, waits
 * for the first answer byte (FIRST_BYTE_MS at most), then sends the rest:
 * a kept-alive connection's later requests, the last one with the FIN
 * (server/http_guard.c's late peek).
 *
 * With ranks as processes the harness is rank 0, the server's process,
 * and starts rank 1 as a process of its own: its own binary run as
 * `worker` (LLVMFuzzerInitialize hands such a run to tp_worker_main before
 * libFuzzer sees its arguments), so the worker is instrumented too. Every
 * batch then crosses the group's shared memory and its messages, and the
 * leader's failure paths (a step refused, the group's watchdog) run under
 * the sanitizers.
 *
 * What counts as a finding, besides a sanitizer report in any server
 * thread (or in the worker, whose death loses the group): a liveness
 * probe on a new connection after the input not answered 200 (a request
 * that locked up every HTTP thread, or broke the engine), a rank group
 * lost, and an answer that does not begin with an HTTP status line.
 * Routes, headers, bodies, batching, binary and JSON tensors, shared
 * memory registration and statistics are all reached from here, with the
 * threads, suspension and resumption the server really uses. */
#ifndef TP_FUZZ_HTTP_H
#define TP_FUZZ_HTTP_H

#ifndef FUZZ_HTTP_RANKS
#error "define FUZZ_HTTP_RANKS (\"threads\" or \"processes\") before including fuzz_http.h"
#endif
/* What the including harness may change (fuzz_http_generate.c does):
 * the graph served (a name in TP_GRAPHS), its generation slots (0: the
 * server's default), how an input becomes the clients' bytes
 * (FUZZ_HTTP_FRAME, declared below; the raw split described above by
 * default), and whether an answer of 500 or more other than 503 is a
 * finding. */
#ifndef FUZZ_HTTP_GRAPH
#define FUZZ_HTTP_GRAPH "mlp_sp_tp2"
#endif
#ifndef FUZZ_HTTP_SLOTS
#define FUZZ_HTTP_SLOTS 0
#endif
#ifndef FUZZ_HTTP_REFUSE_5XX
#define FUZZ_HTTP_REFUSE_5XX 0
#endif

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "engine.h"
#include "http.h"
#include "log.h"
#include "worker.h"

/* The server's limits for a connection, short: a connection left waiting
 * for bytes that never come is closed in a second or two. */
#define REQUEST_TIMEOUT_MS 2000
/* ranks=processes: a step rank 1 has not finished by then loses the group
 * (a hung worker), which is a finding. */
#define STEP_TIMEOUT_MS 10000
/* The answer's end (run_clients). An inference here takes well under a
 * millisecond, even with the sanitizers; one that takes longer is only
 * read in part, which loses nothing the checks need. */
#define FIRST_BYTE_MS 50
#define QUIET_MS 3
/* Sent after each connection's bytes: when they were whole requests, the
 * server answers this one last and closes, which ends the wait at once
 * (a half-closed connection would be closed by the server's watcher only
 * once idle for 20 ms, http_guard.c, or not at all when its FIN came after
 * the first answer, and the client waits QUIET_MS). Bytes that leave a
 * request unfinished take it in as theirs, and the quiet wait ends the
 * connection as before. */
#define CLOSER LIVENESS_PROBE
/* check_alive's request, and each connection's last (CLOSER). */
#define LIVENESS_PROBE "GET /v2/health/live HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n"
/* Far beyond any answer's time: only a server that is stuck misses it. */
#define ALIVE_WAIT_MS 10000
/* An input is up to MAX_CONNS clients' bytes, CONN_SEP between them. */
#define MAX_CONNS 4
#define CONN_SEP "\n@@conn@@\n"
#define RESET_MARK "@@reset@@\n"
#define ANSWER_MARK "@@answer@@\n"
/* The object the seeds register as a region. Parallel jobs (and make
 * test's short run) share it, only read and write it, and each exiting one
 * unlinks it: every input first makes sure it is there (make_region). */
#define REGION_KEY "/tpfuzz_region"
#define REGION_BYTES 65536

static tp_http *server;
static tp_engine *engine;
static struct sockaddr_in addr;

static void die(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_http: %s: %s\n", what, why);
    exit(1); /* setup, not a finding: libFuzzer never starts */
}

static void unlink_region(void) { shm_unlink(REGION_KEY); }

/* The trace files' directory: traces are on the server's path, so inputs
 * may turn them on, and whatever they write stays in here (removed at
 * exit; no input can name another file). */
static char trace_dir[64];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_trace_dir(void) { nftw(trace_dir, remove_entry, 8, FTW_DEPTH | FTW_PHYS); }

static void make_region(void)
{
    int fd = shm_open(REGION_KEY, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, REGION_BYTES) != 0)
        die("shared memory region " REGION_KEY, strerror(errno));
    close(fd);
}

/* The engine, its ranks as FUZZ_HTTP_RANKS says. With processes, rank 1
 * runs this binary as `worker` (tp_worker_argv's /proc/self/exe). */
static void create_engine(const tp_config *c)
{
    tp_err err;
    tp_engine_opts o = {.backend = "cpu", .serial_step_max_us = c->serial_step_max_us};
    tp_worker_spec ws = {.graph = c->graph, .backend = "cpu"};
    char **worker_argv = NULL;
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .step_timeout_ms = STEP_TIMEOUT_MS};
    if (strcmp(FUZZ_HTTP_RANKS, "processes") == 0) {
        if (!(worker_argv = tp_worker_argv(&ws)))
            die("worker argv", "out of memory");
        go.worker_argv = worker_argv;
        o.group = &go;
    }
    if (tp_engine_create(c->graph, &o, &engine, &err) != TP_OK)
        die(c->graph, err.msg);
    tp_worker_argv_free(worker_argv);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    if (*argc > 1 && strcmp((*argv)[1], "worker") == 0)
        exit(tp_worker_main(*argc - 1, *argv + 1)); /* rank 1 of the harness's group */
    signal(SIGPIPE, SIG_IGN); /* the server may close while we still send */
    tp_log_set_level(TP_LOG_ERROR);
    const char *dir = getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs";
    tp_config c;
    tp_config_defaults(&c);
    snprintf(c.host, sizeof c.host, "127.0.0.1");
    c.port = 0;
    c.threads = 2;
    c.request_timeout_ms = REQUEST_TIMEOUT_MS;
    c.request_deadline_ms = REQUEST_TIMEOUT_MS;
    c.allow_client_shm = 1;
    /* a compressed body that inflates past this (corpus infer_gzip_bomb)
     * reaches the 413 in one step, not after 64 MiB of zeros an input */
    c.max_body_bytes = 1 << 20;
    snprintf(trace_dir, sizeof trace_dir, "/tmp/tpfuzz_trace_XXXXXX");
    if (!mkdtemp(trace_dir))
        die("trace directory", strerror(errno));
    atexit(remove_trace_dir);
    snprintf(c.trace_file, sizeof c.trace_file, "%s/trace.json", trace_dir);
    snprintf(c.graph, sizeof c.graph, "%s/" FUZZ_HTTP_GRAPH ".json", dir);
    c.generate_slots = FUZZ_HTTP_SLOTS;
    snprintf(c.ranks, sizeof c.ranks, "%s", FUZZ_HTTP_RANKS);
    tp_err err;
    if (tp_config_validate(&c, &err) != TP_OK)
        die("config", err.msg);
    create_engine(&c);
    if (tp_http_start(&c, &server, &err) != TP_OK)
        die("server", err.msg);
    if (tp_http_set_engines(server, &engine, 1, &err) != TP_OK)
        die("server", err.msg);
    atexit(unlink_region);
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)tp_http_port(server));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return 0;
}

static int64_t now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* A reset, not a FIN, ends our side: no TIME_WAIT left behind. Every input
 * opens up to MAX_CONNS + 1 connections, and a long run would exhaust the
 * ports. */
static void hang_up(int fd)
{
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* One client connection of an input: its bytes, what it sent, the first
 * bytes of what it got. */
typedef struct {
    int fd; /* -1 once reset */
    const uint8_t *data;
    size_t n, sent, got;
    size_t pause_at; /* ANSWER_MARK's place in data (n: none) */
    int reset, shut, done;
    int reset_late;      /* a reset waits for an answer byte first */
    int64_t until;       /* once shut: when it stops waiting for more */
    int64_t pause_until; /* at pause_at: when it sends the rest anyway */
    int64_t reset_at;    /* reset_late: when it resets anyway */
    char head[16];
} client;

/* The clients of one input, from its bytes (the raw split by default):
 * their number; each one's data in bytes[i] (malloc'd, freed after the
 * input), fd not yet set. */
#ifndef FUZZ_HTTP_FRAME
#define FUZZ_HTTP_FRAME frame_raw
#define FUZZ_HTTP_FRAME_RAW
#endif
static int FUZZ_HTTP_FRAME(const uint8_t *data, size_t n, client *cs, uint8_t **bytes);
/* FUZZ_HTTP_SETTLE, when defined: called after each input's checks, to
 * wait until what the input started has ended (fuzz_http_generate). */
#ifdef FUZZ_HTTP_SETTLE
static void FUZZ_HTTP_SETTLE(void);
#endif

/* Whether c has bytes it may send now: at ANSWER_MARK's place it waits
 * for an answer byte, or until its time is up. */
static int client_may_send(client *c, int64_t now)
{
    if (c->shut)
        return 0;
    if (c->sent < c->pause_at)
        return 1;
    if (c->sent == c->pause_at && c->got == 0) {
        if (c->pause_until == 0)
            c->pause_until = now + FIRST_BYTE_MS;
        if (now < c->pause_until)
            return 0;
    }
    c->pause_at = c->n;
    c->pause_until = 0;
    return 1;
}

/* One poll result for c: sends more, half-closes (or resets) once all is
 * sent, reads. */
static void client_step(client *c, short revents, int64_t now)
{
    if ((revents & POLLOUT) && client_may_send(c, now)) {
        size_t upto = c->sent < c->pause_at ? c->pause_at : c->n;
        ssize_t w = send(c->fd, c->data + c->sent, upto - c->sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0)
            c->sent += (size_t)w;
        else if (w < 0 && errno != EAGAIN && errno != EINTR)
            c->sent = c->n; /* the server closed: read what it said */
    }
    if (c->sent == c->n && c->reset) {
        if (c->reset_late && !c->reset_at)
            c->reset_at = now + FIRST_BYTE_MS;
        if (!c->reset_late || c->got > 0 || now >= c->reset_at) {
            hang_up(c->fd);
            c->fd = -1;
            c->done = 1;
            return;
        }
    }
    if (c->sent == c->n && !c->shut && !c->reset) {
        shutdown(c->fd, SHUT_WR);
        c->shut = 1;
        c->until = now + FIRST_BYTE_MS;
    }
    if (revents & (POLLIN | POLLHUP | POLLERR)) {
        char buf[4096];
        ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
            c->done = 1;
        if (r > 0) {
            if (c->got < sizeof c->head) {
                size_t room = sizeof c->head - c->got;
                memcpy(c->head + c->got, buf, room < (size_t)r ? room : (size_t)r);
            }
            c->got += (size_t)r;
            c->until = now + QUIET_MS;
        }
    }
    if (c->shut && now >= c->until)
        c->done = 1;
}

/* Every client sends and reads at once (a server answering pipelined
 * requests must never wait on a client that only writes, and requests on
 * several connections meet in the batcher), half-closes when it has sent
 * everything, and is done when the server closes, or when nothing more
 * has come for QUIET_MS after an answer byte (FIRST_BYTE_MS when none
 * came): the server's close comes late or not at all (CLOSER), so it
 * cannot be the only end. */
static void run_clients(client *cs, int k)
{
    for (;;) {
        struct pollfd p[MAX_CONNS];
        client *who[MAX_CONNS];
        int m = 0, wait = FIRST_BYTE_MS;
        int64_t now = now_ms();
        for (int i = 0; i < k; i++) {
            if (cs[i].done)
                continue;
            p[m] = (struct pollfd){cs[i].fd, (short)(POLLIN | (client_may_send(&cs[i], now) ? POLLOUT : 0)), 0};
            who[m++] = &cs[i];
            int64_t until = cs[i].shut ? cs[i].until : cs[i].reset_at ? cs[i].reset_at : cs[i].pause_until;
            if (until && until - now < wait)
                wait = until - now > 0 ? (int)(until - now) : 0;
        }
        if (m == 0)
            return;
        if (poll(p, (nfds_t)m, wait) < 0 && errno != EINTR)
            die("poll", strerror(errno));
        now = now_ms();
        for (int i = 0; i < m; i++)
            client_step(who[i], p[i].revents, now);
    }
}

/* poll on one descriptor for up to ms, resumed after a signal (libFuzzer's
 * timers send them): 1 ready, 0 not in time. */
static int wait_fd(int fd, short events, int ms)
{
    int64_t until = now_ms() + ms;
    for (;;) {
        struct pollfd p = {fd, events, 0};
        int64_t left = until - now_ms();
        int r = poll(&p, 1, left > 0 ? (int)left : 0);
        if (r > 0)
            return 1;
        if (r == 0 || errno != EINTR)
            return 0;
    }
}

/* Non-blocking from the start: a blocking connect interrupted by a signal
 * would go on connecting in the background and fail with EINTR. */
static int dial(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        die("socket", strerror(errno));
    int e = connect(fd, (struct sockaddr *)&addr, sizeof addr) == 0 ? 0 : errno;
    socklen_t len = sizeof e;
    if (e == EINPROGRESS || e == EINTR)
        e = wait_fd(fd, POLLOUT, ALIVE_WAIT_MS) && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) == 0
                ? e
                : ETIMEDOUT;
    if (e) {
        fprintf(stderr, "fuzz_http: cannot connect to the server: %s\n", strerror(e));
        abort(); /* it stopped listening, or its backlog never drains */
    }
    return fd;
}

/* After every input, a new client must still get its liveness answer, and
 * the rank group must be whole: a server whose threads are all stuck, that
 * gave up its engine, or whose worker died or hung, fails. */
static void check_alive(void)
{
    static const char probe[] = LIVENESS_PROBE;
    int fd = dial();
    char ans[16] = "";
    size_t got = 0;
    if (send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof probe - 1))
        while (got < 12 && wait_fd(fd, POLLIN, ALIVE_WAIT_MS)) {
            ssize_t r = recv(fd, ans + got, 12 - got, MSG_DONTWAIT);
            if (r <= 0 && !(r < 0 && errno == EAGAIN))
                break;
            got += r > 0 ? (size_t)r : 0;
        }
    hang_up(fd);
    const char *lost = tp_engine_lost(engine);
    if (lost) {
        fprintf(stderr, "fuzz_http: after this input the rank group is lost: %s\n", lost);
        abort();
    }
    if (got < 12 || memcmp(ans, "HTTP/1.1 200", 12) != 0) {
        fprintf(stderr, "fuzz_http: after this input the server did not answer a liveness probe "
                "with 200 within %d ms (got '%.*s')\n", ALIVE_WAIT_MS, (int)got, ans);
        abort();
    }
}

/* The input split at CONN_SEP into at most MAX_CONNS connections' bytes
 * (the last one takes the rest, separators and all). */
static int split_input(const uint8_t *data, size_t n, client *cs)
{
    int k = 0;
    const size_t sep = sizeof CONN_SEP - 1;
    for (;;) {
        const uint8_t *at = k + 1 < MAX_CONNS ? memmem(data, n, CONN_SEP, sep) : NULL;
        cs[k] = (client){.data = data, .n = at ? (size_t)(at - data) : n};
        k++;
        if (!at)
            return k;
        n -= (size_t)(at - data) + sep;
        data = at + sep;
    }
}

#ifdef FUZZ_HTTP_FRAME_RAW
/* The raw split: CONN_SEP between connections, RESET_MARK and
 * ANSWER_MARK taken out of each one's bytes and CLOSER after them. */
static int frame_raw(const uint8_t *data, size_t n, client *cs, uint8_t **bytes)
{
    int k = split_input(data, n, cs);
    const size_t mark = sizeof RESET_MARK - 1;
    for (int i = 0; i < k; i++) {
        if (cs[i].n >= mark && memcmp(cs[i].data, RESET_MARK, mark) == 0) {
            cs[i].reset = 1; /* no CLOSER: nobody reads the answer */
            cs[i].data += mark;
            cs[i].n -= mark;
        }
        if (!(bytes[i] = malloc(cs[i].n + sizeof CLOSER)))
            die("input", "out of memory");
        const uint8_t *pause = memmem(cs[i].data, cs[i].n, ANSWER_MARK, sizeof ANSWER_MARK - 1);
        cs[i].pause_at = pause ? (size_t)(pause - cs[i].data) : cs[i].n;
        memcpy(bytes[i], cs[i].data, cs[i].pause_at);
        if (pause) { /* the rest, without the mark */
            size_t after = cs[i].pause_at + sizeof ANSWER_MARK - 1;
            memcpy(bytes[i] + cs[i].pause_at, cs[i].data + after, cs[i].n - after);
            cs[i].n -= sizeof ANSWER_MARK - 1;
        }
        if (!cs[i].reset) {
            memcpy(bytes[i] + cs[i].n, CLOSER, sizeof CLOSER - 1);
            cs[i].n += sizeof CLOSER - 1;
        }
        if (!pause)
            cs[i].pause_at = cs[i].n;
        cs[i].data = bytes[i];
    }
    return k;
}
#endif

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    client cs[MAX_CONNS];
    uint8_t *bytes[MAX_CONNS];
    make_region();
    int k = FUZZ_HTTP_FRAME(data, n, cs, bytes);
    for (int i = 0; i < k; i++)
        cs[i].fd = dial();
    run_clients(cs, k);
    for (int i = 0; i < k; i++) {
        free(bytes[i]);
        if (cs[i].fd >= 0)
            hang_up(cs[i].fd);
        size_t got = cs[i].got;
        if (got > 0 && (got < 9 || memcmp(cs[i].head, "HTTP/1.", 7) != 0)) {
            fprintf(stderr, "fuzz_http: connection %d's answer does not begin with a status line: '%.*s'\n",
                    i, (int)(got < sizeof cs[i].head ? got : sizeof cs[i].head), cs[i].head);
            abort();
        }
        /* the status's first digit, and not 503 (busy or shutting down) */
        if (FUZZ_HTTP_REFUSE_5XX && got >= 12 && cs[i].head[9] == '5' && memcmp(cs[i].head + 9, "503", 3) != 0) {
            fprintf(stderr, "fuzz_http: connection %d's answer is a server error: '%.12s'\n", i, cs[i].head);
            abort();
        }
    }
    check_alive();
#ifdef FUZZ_HTTP_SETTLE
    FUZZ_HTTP_SETTLE();
#endif
    /* An input may have turned the log up (POST /v2/logging): a line per
     * request after it would only slow the next inputs down. */
    tp_log_set_level(TP_LOG_ERROR);
    return 0;
}

#endif
