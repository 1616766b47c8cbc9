/* bare_http.c — the baseline for make bench-http: libmicrohttpd alone, with
 * tpserve's daemon settings (--threads epoll daemons fed by tpserve's
 * accept thread, server/acceptor.h; connection timeout), reading each POST
 * body to the end and answering a fixed body. Whatever tpserve achieves is
 * measured against this, on the same machine, with the same wrk script.
 * --accept pool runs libmicrohttpd's own thread pool instead, which often
 * leaves every connection opened together on one thread (acceptor.h): a
 * baseline that sometimes runs on one core would flatter tpserve.
 *
 * --body: the answer (default {"ok":true}); capture a real tpserve answer so
 * both servers send the same bytes. --header-len: also send
 * Inference-Header-Content-Length (a binary-extension answer). --graph: also
 * run that graph's engine (cpu backend, ranks as threads, the serial steps
 * tpserve takes by default) on one fixed row per request, one request at a
 * time, before answering: the HTTP stack plus one engine step a request
 * and nothing else (no codec, no request checks, no batching, which under
 * load lets a server pass it). Runs until SIGTERM/SIGINT.
 *
 *   bare_http --port N [--threads 4] [--body FILE] [--header-len N] [--accept spread|pool] [--graph G.json] */
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
#include "engine.h"

/* --graph: the engine and its one fixed request (a row of each input).
 * The engine runs one step at a time itself (tp_engine_infer). */
typedef struct {
    tp_engine *e;
    tp_host_tensor in[8];
    int n_in;
} model;

typedef struct {
    int port, threads, pool;
    long header_len;
    char *body;
    size_t len;
    const char *ctype;
    const char *graph;
    model *m;
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
        else if (strcmp(argv[i], "--graph") == 0)
            o->graph = argv[i + 1];
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

static void free_model(model *m)
{
    if (!m)
        return;
    for (int i = 0; i < m->n_in; i++)
        free(m->in[i].data);
    tp_engine_free(m->e);
    free(m);
}

/* The engine of path and one batch-1 request for it: every input's -1
 * dims as 1, its bytes a fixed ramp in [-0.5, 0.5) (FP32 inputs; others
 * zeros). NULL, with the reason on stderr, when it cannot. */
static model *load_model(const char *path)
{
    model *m = calloc(1, sizeof *m);
    tp_err err;
    tp_engine_opts eo = {.backend = "cpu", .serial_step_max_us = 2000};
    if (!m || tp_engine_create(path, &eo, &m->e, &err) != TP_OK) {
        fprintf(stderr, "bare_http: --graph %s: %s\n", path, m ? err.msg : "out of memory");
        free(m);
        return NULL;
    }
    int n_in = tp_engine_n_inputs(m->e);
    if (n_in > (int)(sizeof m->in / sizeof m->in[0])) {
        fprintf(stderr, "bare_http: --graph %s: %d inputs, at most 8 here\n", path, n_in);
        free_model(m);
        return NULL;
    }
    for (int i = 0; i < n_in; i++, m->n_in++) {
        const tp_io_desc *d = tp_engine_input(m->e, i);
        tp_host_tensor *t = &m->in[i];
        snprintf(t->name, sizeof t->name, "%s", d->name);
        t->dtype = d->dtype;
        t->ndim = d->ndim;
        size_t n = 1;
        for (int k = 0; k < d->ndim; k++)
            n *= (size_t)(t->shape[k] = d->shape[k] < 0 ? 1 : d->shape[k]);
        t->nbytes = n * tp_dtype_size(d->dtype);
        if (!(t->data = calloc(1, t->nbytes ? t->nbytes : 1))) {
            fprintf(stderr, "bare_http: --graph %s: out of memory for input '%s'\n", path, d->name);
            free_model(m);
            return NULL;
        }
        for (size_t k = 0; d->dtype == TP_F32 && k < n; k++)
            ((float *)t->data)[k] = (float)(k % 97) / 97.0f - 0.5f;
    }
    return m;
}

static int run_model(model *m)
{
    tp_host_tensor *outs;
    int n_outs;
    tp_err err;
    if (tp_engine_infer(m->e, m->in, m->n_in, &outs, &n_outs, &err) != TP_OK) {
        fprintf(stderr, "bare_http: engine: %s\n", err.msg);
        return -1;
    }
    tp_host_tensors_free(outs, n_outs);
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
    if (o->m && run_model(o->m) != 0)
        return MHD_NO;
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
                        "[--accept spread|pool] [--graph G.json]\n");
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
    if (o.graph && !(o.m = load_model(o.graph)))
        return 1;
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
                    "%zu-byte answer%s%s\n", o.port, o.threads, o.pool ? "libmicrohttpd's pool" : "spread", o.len,
            o.graph ? ", engine of " : "", o.graph ? o.graph : "");
    int sig;
    sigwait(&set, &sig);
    if (o.pool)
        MHD_stop_daemon(d);
    else
        stop_spread(&sp);
    if (o.body != def)
        free(o.body);
    free_model(o.m);
    return 0;
}
