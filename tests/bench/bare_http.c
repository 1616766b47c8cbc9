/* bare_http.c — the baseline for make bench-http: libmicrohttpd alone, with
 * tpserve's daemon settings (--threads epoll daemons fed by tpserve's
 * accept thread, server/acceptor.h; connection timeout), reading each POST
 * body to the end and answering a fixed body. Whatever tpserve achieves is
 * measured against this, on the same machine, with the same wrk script.
 * --accept pool runs libmicrohttpd's own thread pool instead, which often
 * leaves every connection opened together on one thread (acceptor.h): a
 * baseline that sometimes runs on one core would flatter tpserve.
 *
 *   bare_http --port N [--threads 4] [--body FILE] [--header-len N] [--accept spread|pool]
 *
 * --body: the answer (default {"ok":true}); capture a real tpserve answer so
 * both servers send the same bytes. --header-len: also send
 * Inference-Header-Content-Length (a binary-extension answer). Runs until
 * SIGTERM/SIGINT. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "acceptor.h"

typedef struct {
    int port, threads, pool;
    long header_len;
    char *body;
    size_t len;
    const char *ctype;
} opts;

static int parse_args(int argc, char **argv, opts *o, const char **body_file)
{
    *o = (opts){.port = 0, .threads = 4, .header_len = -1};
    *body_file = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0)
            o->port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--threads") == 0)
            o->threads = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--body") == 0)
            *body_file = argv[i + 1];
        else if (strcmp(argv[i], "--header-len") == 0)
            o->header_len = atol(argv[i + 1]);
        else if (strcmp(argv[i], "--accept") == 0 && (!strcmp(argv[i + 1], "pool") || !strcmp(argv[i + 1], "spread")))
            o->pool = strcmp(argv[i + 1], "pool") == 0;
        else
            return -1;
    }
    return argc % 2 == 1 && o->port > 0 && o->threads > 0 ? 0 : -1;
}

static int read_file(const char *path, char **out, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc(n > 0 ? (size_t)n : 1);
    if (!p || n < 0 || fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        fclose(f);
        return -1;
    }
    fclose(f);
    *out = p;
    *len = (size_t)n;
    return 0;
}

/* Like tpserve: the body is read to the end (and dropped), then answered. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    (void)url;
    (void)method;
    (void)version;
    (void)upload_data;
    const opts *o = cls;
    if (!*con_cls) {
        *con_cls = (void *)1;
        return MHD_YES;
    }
    if (*upload_size) {
        *upload_size = 0;
        return MHD_YES;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(o->len, o->body, MHD_RESPMEM_PERSISTENT);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, o->ctype);
    if (o->header_len >= 0) {
        char v[32];
        snprintf(v, sizeof v, "%ld", o->header_len);
        MHD_add_response_header(r, "Inference-Header-Content-Length", v);
    }
    enum MHD_Result ok = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ok;
}

/* --accept spread: tpserve's layout (server/http.c), one daemon per thread
 * without a listening socket, fed by the accept thread. */
enum { MAX_CONNECTIONS = 4096, MAX_THREADS = 64 };

typedef struct {
    int fd, n;
    struct MHD_Daemon *d[MAX_THREADS];
    tp_acceptor *a;
} spread;

static void on_notify(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode code)
{
    (void)ctx;
    const spread *sp = cls;
    if (code == MHD_CONNECTION_NOTIFY_CLOSED)
        tp_acceptor_released(sp->a, c);
}

static int start_spread(spread *sp, opts *o, unsigned flags, struct sockaddr_in *sa)
{
    sp->n = o->threads < MAX_THREADS ? o->threads : MAX_THREADS;
    sp->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(sp->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(sp->fd, (struct sockaddr *)sa, sizeof *sa) != 0 || listen(sp->fd, 512) != 0)
        return -1;
    unsigned share[MAX_THREADS];
    for (int i = 0; i < sp->n; i++) {
        share[i] = MAX_CONNECTIONS / (unsigned)sp->n;
        sp->d[i] = MHD_start_daemon(flags | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC, 0, NULL, NULL, on_request, o,
                                    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30, MHD_OPTION_NOTIFY_CONNECTION,
                                    on_notify, sp, MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNECTIONS,
                                    MHD_OPTION_END);
        if (!sp->d[i])
            return -1;
    }
    tp_err err;
    return tp_acceptor_start(sp->fd, sp->d, sp->n, share, 0, &sp->a, &err) == TP_OK ? 0 : -1;
}

static void stop_spread(spread *sp)
{
    tp_acceptor_stop(sp->a);
    for (int i = 0; i < sp->n; i++)
        if (sp->d[i])
            MHD_stop_daemon(sp->d[i]);
    tp_acceptor_free(sp->a);
    close(sp->fd);
}

int main(int argc, char **argv)
{
    opts o;
    const char *body_file;
    if (parse_args(argc, argv, &o, &body_file) != 0) {
        fprintf(stderr, "usage: bare_http --port N [--threads 4] [--body FILE] [--header-len N] "
                        "[--accept spread|pool]\n");
        return 2;
    }
    static char def[] = "{\"ok\":true}";
    o.body = def;
    o.len = strlen(def);
    if (body_file && read_file(body_file, &o.body, &o.len) != 0) {
        fprintf(stderr, "bare_http: cannot read --body file '%s'\n", body_file);
        return 1;
    }
    o.ctype = o.header_len >= 0 ? "application/octet-stream" : "application/json";
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL); /* the pool threads inherit the mask */
    signal(SIGPIPE, SIG_IGN);
    unsigned flags = MHD_USE_ERROR_LOG | (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES
                                              ? MHD_USE_EPOLL_INTERNAL_THREAD
                                              : MHD_USE_POLL_INTERNAL_THREAD);
    /* loopback, like tpserve's default host */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)o.port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct MHD_Daemon *d = NULL;
    spread sp = {.fd = -1};
    if (o.pool)
        d = MHD_start_daemon(flags, (uint16_t)o.port, NULL, NULL, on_request, &o, MHD_OPTION_SOCK_ADDR, &sa,
                             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
                             o.threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (unsigned)o.threads,
                             MHD_OPTION_END);
    if (o.pool ? !d : start_spread(&sp, &o, flags, &sa) != 0) {
        fprintf(stderr, "bare_http: cannot listen on port %d\n", o.port);
        return 1;
    }
    fprintf(stderr, "bare_http: listening on 127.0.0.1:%d, %d threads (%s), "
                    "%zu-byte answer\n", o.port, o.threads, o.pool ? "libmicrohttpd's pool" : "spread", o.len);
    int sig;
    sigwait(&set, &sig);
    if (o.pool)
        MHD_stop_daemon(d);
    else
        stop_spread(&sp);
    if (o.body != def)
        free(o.body);
    return 0;
}
