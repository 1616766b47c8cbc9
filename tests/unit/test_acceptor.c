/* test_acceptor.c — the main port's accept loop (acceptor.h) with real
 * sockets and libmicrohttpd daemons on loopback: connections opened
 * together are spread evenly, the per-address limit closes the excess
 * unanswered, a full server leaves new connections in the backlog until
 * one closes, and a drain hands the backlog over and refuses what comes
 * after. Waits are bounded polls, never timed assertions. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "acceptor.h"
#include "check_main.h"
#include "testutil.h"

enum { MAX_D = 3 };

typedef struct {
    struct MHD_Daemon *d[MAX_D];
    int n, listen_fd, port;
    tp_acceptor *a;
} rig;

static rig *current; /* the notifier's way to the acceptor */
static int swallow_closes; /* closes not reported, as for connections libmicrohttpd drops unstarted */

static void on_notify(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode code)
{
    (void)cls, (void)ctx;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED && !swallow_closes)
        tp_acceptor_released(current->a, c);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *data, size_t *size, void **ctx)
{
    (void)cls, (void)url, (void)method, (void)version, (void)data;
    static int seen;
    if (!*ctx || *size) { /* answered before its end, a request costs its connection */
        *ctx = &seen;
        *size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r = MHD_create_response_from_buffer(2, (void *)"ok", MHD_RESPMEM_PERSISTENT);
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

/* A socket listening on a free loopback port, its address in *sa. */
static int listen_loopback(int backlog, struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    *sa = (struct sockaddr_in){.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(fd, (struct sockaddr *)sa, sizeof *sa), 0);
    ck_assert_int_eq(listen(fd, backlog), 0);
    socklen_t sl = sizeof *sa;
    getsockname(fd, (struct sockaddr *)sa, &sl);
    return fd;
}

static void rig_start(rig *r, int n, const unsigned *limit, int per_ip)
{
    memset(r, 0, sizeof *r);
    current = r;
    r->n = n;
    struct sockaddr_in sa;
    r->listen_fd = listen_loopback(64, &sa);
    r->port = ntohs(sa.sin_port);
    for (int i = 0; i < n; i++) {
        r->d[i] = MHD_start_daemon(MHD_USE_NO_LISTEN_SOCKET | MHD_USE_EPOLL_INTERNAL_THREAD | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0,
                                   NULL, NULL, on_request, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_notify,
                                   NULL, MHD_OPTION_END); /* the acceptor's limits, as in http.c */
        ck_assert_ptr_nonnull(r->d[i]);
    }
    tp_err err;
    ck_assert_int_eq(tp_acceptor_start(r->listen_fd, r->d, n, limit, per_ip, &r->a, &err), TP_OK);
}

static void rig_stop(rig *r)
{
    tp_acceptor_stop(r->a);
    for (int i = 0; i < r->n; i++)
        MHD_stop_daemon(r->d[i]);
    tp_acceptor_free(r->a);
    close(r->listen_fd);
}

/* A connection to the rig from src (127.0.0.x). */
static int dial(const rig *r, const char *src)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in from = {.sin_family = AF_INET}, to = {.sin_family = AF_INET, .sin_port = htons(r->port)};
    inet_pton(AF_INET, src, &from.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&from, sizeof from), 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
    return fd;
}

static unsigned held(const rig *r, int i)
{
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(r->d[i], MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
    return info ? info->num_connections : 0;
}

static unsigned held_total(const rig *r)
{
    unsigned n = 0;
    for (int i = 0; i < r->n; i++)
        n += held(r, i);
    return n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {0, ms * 1000000L};
    nanosleep(&ts, NULL);
}

/* Waits (up to 5 s) until the daemons hold want connections in all. */
static void wait_held(const rig *r, unsigned want)
{
    for (int i = 0; i < 500 && held_total(r) != want; i++)
        sleep_ms(10);
    ck_assert_uint_eq(held_total(r), want);
}

/* The answer to a GET on fd: "HTTP/1.1 200" when served, "" when the
 * server closed the connection without one, "(none)" after 2 s. */
static void ask(int fd, char *got, size_t len)
{
    static const char req[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    if (send(fd, req, sizeof req - 1, MSG_NOSIGNAL) < 0) {
        snprintf(got, len, "%s", "");
        return;
    }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 2000) != 1) {
        snprintf(got, len, "(none)");
        return;
    }
    ssize_t n = recv(fd, got, len - 1, 0);
    got[n > 12 ? 12 : n > 0 ? n : 0] = '\0';
}

/* ask, and the answer's start must be want */
static void expect(int fd, const char *want)
{
    char got[32];
    ask(fd, got, sizeof got);
    ck_assert_str_eq(got, want);
}

START_TEST(spreads_evenly)
{
    static const unsigned limit[] = {100, 100, 100};
    rig r;
    rig_start(&r, 3, limit, 0);
    int fd[9];
    for (int i = 0; i < 9; i++) /* opened together, as a load generator does */
        fd[i] = dial(&r, "127.0.0.1");
    wait_held(&r, 9);
    for (int i = 0; i < 3; i++) {
        ck_assert_uint_eq(held(&r, i), 3);
        ck_assert_uint_eq(tp_acceptor_live(r.a, i), 3); /* the count HTTP threads read (more_may_follow) */
    }
    expect(fd[4], "HTTP/1.1 200");
    /* closed ones leave room where they were: the next go there */
    close(fd[0]);
    close(fd[3]);
    close(fd[6]);
    wait_held(&r, 6);
    for (int i = 0; i < 3; i++)
        fd[i] = dial(&r, "127.0.0.1");
    wait_held(&r, 9);
    for (int i = 0; i < 3; i++)
        ck_assert_uint_eq(held(&r, i), 3);
    for (int i = 0; i < 9; i++)
        if (i != 0 && i != 3 && i != 6)
            close(fd[i]);
    rig_stop(&r);
}
END_TEST

/* A daemon whose thread runs a step that may stall while serving its one
 * connection alone (tp_acceptor_claim_alone) is given no new connection
 * until the claim ends: they go to the others, so none waits behind the
 * step. A claim needs that one connection, another daemon to take new
 * ones, and no other claim. */
START_TEST(claimed_daemon_gets_no_new_connections)
{
    static const unsigned limit[] = {100, 100};
    rig r;
    rig_start(&r, 2, limit, 0);
    int first = dial(&r, "127.0.0.1");
    wait_held(&r, 1);
    int i = tp_acceptor_live(r.a, 0) == 1 ? 0 : 1, other = 1 - i;
    ck_assert_int_eq(tp_acceptor_claim_alone(r.a, other), 0); /* it serves nobody: not its step */
    ck_assert_int_eq(tp_acceptor_claim_alone(r.a, i), 1);
    ck_assert_int_eq(tp_acceptor_claim_alone(r.a, i), 0); /* one claim at a time */
    int fd[4];
    for (int k = 0; k < 4; k++)
        fd[k] = dial(&r, "127.0.0.1");
    wait_held(&r, 5);
    ck_assert_uint_eq(tp_acceptor_live(r.a, i), 1);
    ck_assert_uint_eq(tp_acceptor_live(r.a, other), 4);
    expect(fd[0], "HTTP/1.1 200");
    tp_acceptor_end_alone(r.a, i);
    int more = dial(&r, "127.0.0.1"); /* the least loaded again */
    wait_held(&r, 6);
    ck_assert_uint_eq(tp_acceptor_live(r.a, i), 2);
    ck_assert_int_eq(tp_acceptor_claim_alone(r.a, i), 0); /* two connections now */
    close(more);
    for (int k = 0; k < 4; k++)
        close(fd[k]);
    close(first);
    rig_stop(&r);
    /* one daemon: new connections would have nowhere else to go */
    rig_start(&r, 1, limit, 0);
    first = dial(&r, "127.0.0.1");
    wait_held(&r, 1);
    ck_assert_int_eq(tp_acceptor_claim_alone(r.a, 0), 0);
    close(first);
    rig_stop(&r);
}
END_TEST

/* n connections dialled from a thread running on cpu, one at a time. */
static void dial_from_cpu(rig *r, int cpu, int n, int *fd, int *n_fd)
{
    cpu_set_t was, one;
    ck_assert_int_eq(pthread_getaffinity_np(pthread_self(), sizeof was, &was), 0);
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof one, &one), 0);
    for (int i = 0; i < n; i++) {
        fd[*n_fd] = dial(r, "127.0.0.1");
        wait_held(r, (unsigned)++*n_fd);
    }
    ck_assert_int_eq(pthread_setaffinity_np(pthread_self(), sizeof was, &was), 0);
}

/* With tp_acceptor_route_by_cpu a connection goes to the daemon whose
 * thread runs on the CPU it came from (a client on this machine: the CPU
 * it sent from), until that daemon holds 2 + half the average more than
 * the least loaded: then by load, so a client whose connections all come
 * from one CPU still has both threads serving it. */
START_TEST(routes_by_incoming_cpu)
{
    int cpu[2];
    if (tu_allowed_cpus(cpu, 2) < 2) {
        printf("routes_by_incoming_cpu: skipped: one CPU\n");
        return;
    }
    static const unsigned limit[] = {100, 100};
    rig r;
    rig_start(&r, 2, limit, 0);
    tp_acceptor_route_by_cpu(r.a, cpu);
    int fd[16], n = 0;
    dial_from_cpu(&r, cpu[1], 3, fd, &n);
    ck_assert_uint_eq(tp_acceptor_live(r.a, 1), 3);
    dial_from_cpu(&r, cpu[0], 3, fd, &n);
    ck_assert_uint_eq(tp_acceptor_live(r.a, 0), 3);
    dial_from_cpu(&r, cpu[0], 10, fd, &n);
    unsigned on0 = tp_acceptor_live(r.a, 0), on1 = tp_acceptor_live(r.a, 1);
    ck_assert_msg(on0 == 11 && on1 == 5, "10 more from CPU %d: %u and %u (11 and 5: the bound)", cpu[0], on0, on1);
    expect(fd[15], "HTTP/1.1 200");
    for (int i = 0; i < n; i++)
        close(fd[i]);
    wait_held(&r, 0);
    rig_stop(&r);
}
END_TEST

START_TEST(per_address_limit)
{
    static const unsigned limit[] = {100, 100};
    rig r;
    rig_start(&r, 2, limit, 2);
    int a1 = dial(&r, "127.0.0.1"), a2 = dial(&r, "127.0.0.1");
    wait_held(&r, 2);
    int a3 = dial(&r, "127.0.0.1"), b1 = dial(&r, "127.0.0.2");
    expect(a3, ""); /* closed, unanswered */
    expect(b1, "HTTP/1.1 200");
    /* a closed connection gives its address's place back */
    close(a1);
    wait_held(&r, 2);
    int a4 = dial(&r, "127.0.0.1");
    expect(a4, "HTTP/1.1 200");
    close(a2), close(a3), close(a4), close(b1);
    rig_stop(&r);
}
END_TEST

START_TEST(full_waits_in_backlog)
{
    static const unsigned limit[] = {2, 1};
    rig r;
    rig_start(&r, 2, limit, 0);
    int fd[5];
    for (int i = 0; i < 5; i++)
        fd[i] = dial(&r, "127.0.0.1");
    wait_held(&r, 3);
    ck_assert_uint_eq(held(&r, 0), 2);
    ck_assert_uint_eq(held(&r, 1), 1);
    char got[32];
    expect(fd[4], "(none)"); /* waits in the backlog, not refused */
    close(fd[0]);
    /* room again: the oldest waiting (fd[3]) gets in, then fd[4] after the next close */
    expect(fd[3], "HTTP/1.1 200");
    wait_held(&r, 3);
    close(fd[1]);
    struct pollfd p = {fd[4], POLLIN, 0};
    ck_assert_int_eq(poll(&p, 1, 5000), 1); /* its request, sent while it waited, is answered */
    ssize_t n = recv(fd[4], got, 12, 0);
    ck_assert_int_eq(n, 12);
    for (int i = 2; i < 5; i++)
        close(fd[i]);
    rig_stop(&r);
}
END_TEST

/* A connection whose end is never reported (libmicrohttpd drops one it
 * could not start without a CLOSED notice) must not hold its place
 * forever: while the daemons look full, the count is checked against
 * theirs. */
START_TEST(lost_close_is_reconciled)
{
    static const unsigned limit[] = {1};
    rig r;
    rig_start(&r, 1, limit, 0);
    int a = dial(&r, "127.0.0.1");
    wait_held(&r, 1);
    swallow_closes = 1;
    close(a);
    wait_held(&r, 0);
    swallow_closes = 0;
    int b = dial(&r, "127.0.0.1");
    expect(b, "HTTP/1.1 200");
    close(b);
    rig_stop(&r);
}
END_TEST

START_TEST(drain_hands_over_backlog)
{
    static const unsigned limit[] = {50, 50};
    rig r;
    rig_start(&r, 2, limit, 0);
    tp_acceptor_stop(r.a); /* so the next two stay in the backlog */
    int w1 = dial(&r, "127.0.0.1"), w2 = dial(&r, "127.0.0.1");
    ck_assert_uint_eq(tp_acceptor_drain(r.a), 2);
    ck_assert_uint_eq(tp_acceptor_drain(r.a), 0);
    wait_held(&r, 2);
    ck_assert_uint_eq(held(&r, 0), 1);
    expect(w2, "HTTP/1.1 200");
    /* the socket no longer listens */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(r.port)};
    inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
    ck_assert_int_ne(connect(fd, (struct sockaddr *)&to, sizeof to), 0);
    ck_assert_int_eq(errno, ECONNREFUSED);
    close(fd), close(w1), close(w2);
    rig_stop(&r);
}
END_TEST

/* A drain while every daemon is full ends (what waits in the backlog
 * cannot be handed over, and the wait for the backlog to empty must not
 * spin on it). */
START_TEST(drain_when_full_ends)
{
    static const unsigned limit[] = {1, 1};
    rig r;
    rig_start(&r, 2, limit, 0);
    int c1 = dial(&r, "127.0.0.1"), c2 = dial(&r, "127.0.0.1");
    wait_held(&r, 2);
    int waiting = dial(&r, "127.0.0.1"); /* completes in the backlog */
    ck_assert_uint_eq(tp_acceptor_drain(r.a), 0);
    close(waiting), close(c1), close(c2);
    rig_stop(&r);
}
END_TEST

/* A drain first stops new handshakes without shutting the socket (which
 * would reset what completed meanwhile): a connection completed before
 * stays in the backlog and is accepted; one dialed after gets no
 * handshake (its SYN is dropped) while the socket still listens. */
START_TEST(handshakes_refused_backlog_kept)
{
    struct sockaddr_in sa;
    int lfd = listen_loopback(8, &sa);
    int before = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_eq(connect(before, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(tp_acceptor_refuse_handshakes(lfd), 0);
    int after = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    ck_assert_int_ne(connect(after, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(errno, EINPROGRESS);
    struct pollfd p = {after, POLLOUT, 0};
    ck_assert_int_eq(poll(&p, 1, 300), 0); /* no SYN-ACK: still connecting */
    int got = accept(lfd, NULL, NULL);
    ck_assert_int_ge(got, 0); /* the one completed before */
    ck_assert_int_eq(send(before, "x", 1, MSG_NOSIGNAL), 1);
    char c;
    ck_assert_int_eq(recv(got, &c, 1, 0), 1); /* and it carries data */
    struct pollfd pl = {lfd, POLLIN, 0};
    ck_assert_int_eq(poll(&pl, 1, 100), 0); /* nothing else completed */
    close(got), close(after), close(before), close(lfd);
}
END_TEST

static Suite *acceptor_suite(void)
{
    Suite *s = suite_create("acceptor");
    TCase *tc = tcase_create("loopback");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, spreads_evenly);
    tcase_add_test(tc, claimed_daemon_gets_no_new_connections);
    tcase_add_test(tc, routes_by_incoming_cpu);
    tcase_add_test(tc, per_address_limit);
    tcase_add_test(tc, full_waits_in_backlog);
    tcase_add_test(tc, lost_close_is_reconciled);
    tcase_add_test(tc, drain_hands_over_backlog);
    tcase_add_test(tc, handshakes_refused_backlog_kept);
    tcase_add_test(tc, drain_when_full_ends);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(acceptor_suite)
