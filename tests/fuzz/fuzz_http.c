/* fuzz_http.c — whatever bytes a client sends, to a whole server.
 *
 * The other harnesses feed one parser each. This one starts the real
 * thing in process, once: tp_http on a loopback port in front of the
 * example graph (mlp_sp_tp2, cpu backend, ranks as threads), with client
 * shared memory allowed and one region's object ready to register. Each
 * input is one client connection: its bytes are sent as they are (one
 * request, several pipelined, or garbage), the client half-closes, and
 * everything the server answers is read until it closes its side.
 *
 * What counts as a finding, besides a sanitizer report in any server
 * thread: a liveness probe on a new connection after the input not
 * answered 200 (a request that locked up every HTTP thread, or broke the
 * engine), and an answer that does not begin with an HTTP status line. Routes,
 * headers, bodies, batching, binary and JSON tensors, shared memory
 * registration and statistics are all reached from here, with the
 * threads, suspension and resumption the server really uses. */
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
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "engine.h"
#include "http.h"
#include "log.h"

/* The server's limits for a connection, short: a connection left waiting
 * for bytes that never come is closed in a second or two. */
#define REQUEST_TIMEOUT_MS 2000
/* The answer's end (exchange). An inference here takes well under a
 * millisecond, even with the sanitizers; one that takes longer is only
 * read in part, which loses nothing the checks need. */
#define FIRST_BYTE_MS 50
#define QUIET_MS 3
/* Far beyond any answer's time: only a server that is stuck misses it. */
#define ALIVE_WAIT_MS 10000
/* The object the seeds register as a region. Parallel jobs share it (the
 * seeds name it) and only read and write it; the first to exit unlinks it,
 * which costs the others coverage, never a false finding. */
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

static void make_region(void)
{
    int fd = shm_open(REGION_KEY, O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, REGION_BYTES) != 0)
        die("shared memory region " REGION_KEY, strerror(errno));
    close(fd);
    atexit(unlink_region);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
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
    snprintf(c.graph, sizeof c.graph, "%s/mlp_sp_tp2.json", dir);
    tp_err err;
    if (tp_config_validate(&c, &err) != TP_OK)
        die("config", err.msg);
    tp_engine_opts o = {.backend = "cpu", .serial_step_max_us = c.serial_step_max_us};
    if (tp_engine_create(c.graph, &o, &engine, &err) != TP_OK)
        die(c.graph, err.msg);
    if (tp_http_start(&c, &server, &err) != TP_OK)
        die("server", err.msg);
    if (tp_http_set_engines(server, &engine, 1, &err) != TP_OK)
        die("server", err.msg);
    make_region();
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

/* Sends data and reads the answer at the same time (a server answering
 * pipelined requests must never wait on a client that only writes), then
 * half-closes and reads until the server closes, or until nothing more
 * has come for QUIET_MS after the first answer byte (FIRST_BYTE_MS when
 * none came): libmicrohttpd keeps a connection whose client half-closed
 * open until its timeout, as it does for any idle keep-alive client, so
 * its close cannot mark the end. Returns the bytes read (at most cap kept
 * in ans). */
static size_t exchange(int fd, const uint8_t *data, size_t n, char *ans, size_t cap)
{
    size_t sent = 0, got = 0;
    int shut = 0;
    int64_t until = now_ms() + FIRST_BYTE_MS;
    for (;;) {
        if (sent == n && !shut) {
            shutdown(fd, SHUT_WR);
            shut = 1;
        }
        struct pollfd p = {fd, POLLIN | (shut ? 0 : POLLOUT), 0};
        int64_t left = until - now_ms();
        if (shut && left <= 0)
            return got;
        if (poll(&p, 1, shut ? (int)left : FIRST_BYTE_MS) <= 0)
            continue;
        if (p.revents & POLLOUT) {
            ssize_t w = send(fd, data + sent, n - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
            if (w > 0)
                sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR)
                sent = n; /* the server closed: read what it said */
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            char buf[4096];
            ssize_t r = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                return got;
            if (r > 0) {
                size_t keep = got < cap ? (cap - got < (size_t)r ? cap - got : (size_t)r) : 0;
                memcpy(ans + got, buf, keep);
                got += (size_t)r;
                until = now_ms() + QUIET_MS;
            }
        }
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

/* A reset, not a FIN, ends our side: no TIME_WAIT left behind. Every input
 * opens two connections, and a long run would exhaust the ports. */
static void hang_up(int fd)
{
    struct linger lg = {1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    close(fd);
}

/* After every input, a new client must still get its liveness answer: a
 * server whose threads are all stuck, or that gave up its engine, fails. */
static void check_alive(void)
{
    static const char probe[] = "GET /v2/health/live HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n";
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
    if (got < 12 || memcmp(ans, "HTTP/1.1 200", 12) != 0) {
        fprintf(stderr, "fuzz_http: after this input the server did not answer a liveness probe "
                "with 200 within %d ms (got '%.*s')\n", ALIVE_WAIT_MS, (int)got, ans);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t n)
{
    int fd = dial();
    char ans[16];
    size_t got = exchange(fd, data, n, ans, sizeof ans);
    hang_up(fd);
    if (got > 0 && (got < 9 || memcmp(ans, "HTTP/1.", 7) != 0)) {
        fprintf(stderr, "fuzz_http: the answer does not begin with a status line: '%.*s'\n",
                (int)(got < sizeof ans ? got : sizeof ans), ans);
        abort();
    }
    check_alive();
    /* An input may have turned the log up (POST /v2/logging): a line per
     * request after it would only slow the next inputs down. */
    tp_log_set_level(TP_LOG_ERROR);
    return 0;
}
