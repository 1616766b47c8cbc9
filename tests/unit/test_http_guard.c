/* test_http_guard.c — the guard's header checks (tp_http_guard_check_headers)
 * on what libmicrohttpd really parses: a daemon on loopback with the
 * guard's options, whose handler runs the checks as server/http.c does,
 * and raw requests sent to it (libmicrohttpd 1.0 refuses some itself, as
 * the guard's options ask it to). An
 * obs-fold line (a header line beginning with a space or tab, RFC 9112 5.2)
 * and whitespace in or before a header's name are answered 400 and the
 * connection closed, whichever header and wherever the fold; headers with
 * spaces and tabs around their values, or empty ones, pass. Waits are
 * bounded socket reads, never timed assertions. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "check_main.h"
#include "http_guard.h"

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *size, void **ctx)
{
    (void)cls, (void)url, (void)method, (void)data;
    static int seen;
    if (!*ctx) {
        *ctx = &seen;
        char msg[256];
        unsigned bad = tp_http_guard_check_headers(c, version, NULL, NULL, 0, msg, sizeof msg);
        if (bad) { /* as http.c's reply_refused: the answer, then the close */
            struct MHD_Response *r = MHD_create_response_from_buffer(strlen(msg), msg, MHD_RESPMEM_MUST_COPY);
            MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
            enum MHD_Result ret = MHD_queue_response(c, bad, r);
            MHD_destroy_response(r);
            return ret;
        }
        return MHD_YES;
    }
    if (*size) {
        *size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static struct MHD_Daemon *daemon_;
static tp_http_guard *guard;
static int port;

static void start(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(listen(fd, 16), 0);
    ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sa, &sl), 0);
    port = ntohs(sa.sin_port);
    tp_config cfg;
    tp_config_defaults(&cfg);
    tp_err err;
    ck_assert_int_eq(tp_http_guard_create(&cfg, &guard, &err), TP_OK);
    struct MHD_OptionItem opts[TP_HTTP_GUARD_N_OPTIONS + 1];
    int n = tp_http_guard_options(guard, opts, NULL, NULL);
    ck_assert_int_le(n, TP_HTTP_GUARD_N_OPTIONS);
    opts[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    daemon_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD, 0, NULL, NULL, on_request, NULL,
                               MHD_OPTION_LISTEN_SOCKET, fd, MHD_OPTION_ARRAY, opts, MHD_OPTION_END);
    ck_assert_ptr_nonnull(daemon_);
}

static void stop(void)
{
    MHD_stop_daemon(daemon_);
    tp_http_guard_free(guard);
}

/* Sends req on a new connection and reads to the server's close (10 s at
 * most: a connection left open reads as "<open>" at the end). */
static char *exchange(const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ck_assert_int_eq(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    size_t cap = 1 << 16, len = 0;
    char *out = calloc(1, cap + 8);
    for (;;) {
        ssize_t n = recv(fd, out + len, cap - len, 0);
        if (n == 0)
            break;
        if (n < 0) {
            strcpy(out + len, "<open>");
            break;
        }
        len += (size_t)n;
    }
    close(fd);
    return out;
}

/* The answer's status, and whether the connection was closed after it. */
static void expect(const char *req, const char *status, int closed)
{
    char *out = exchange(req);
    ck_assert_msg(strncmp(out, status, strlen(status)) == 0, "%s: answered '%.80s', wanted %s", req, out, status);
    int open = strstr(out, "<open>") != NULL;
    ck_assert_msg(open != closed, "%s: connection %s", req, open ? "left open" : "closed");
    free(out);
}

START_TEST(obs_fold_refused_and_closed)
{
    start();
    static const char *const folded[] = {
        /* Transfer-Encoding folded: libmicrohttpd 0.9 lost the header, and
         * the body was read by the Content-Length after it */
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n gzip\r\nContent-Length: 2\r\n\r\n{}",
        "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding:\r\n chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n",
        "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n\tb\r\n\r\n",      /* by a tab */
        "GET / HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n  c\r\n\r\n", /* twice */
        "GET / HTTP/1.1\r\nX-A: a\r\n\t\r\nHost: x\r\n\r\n",        /* a blank continuation, not last */
        "GET / HTTP/1.1\r\n x: y\r\nHost: x\r\n\r\n",               /* whitespace before the first header */
        "GET / HTTP/1.1\r\nHost : x\r\n\r\n",                       /* before the colon */
    };
    for (size_t i = 0; i < sizeof folded / sizeof *folded; i++)
        expect(folded[i], "HTTP/1.1 400 ", 1);
    /* spaces and tabs around values, empty values: all fine */
    expect("GET / HTTP/1.1\r\nHost:  \t x \t\r\nX-Empty:\r\nX-Blank:   \r\nX-Many: a  b\tc\r\n"
           "Connection: close\r\n\r\n", "HTTP/1.1 200 ", 1);
    stop();
}
END_TEST

static Suite *http_guard_suite(void)
{
    Suite *s = suite_create("http_guard");
    TCase *t = tcase_create("core");
    tcase_set_timeout(t, 60);
    tcase_add_test(t, obs_fold_refused_and_closed);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(http_guard_suite)
