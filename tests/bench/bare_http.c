/* bare_http.c — the baseline for make bench-http: libmicrohttpd alone, with
 * tpserve's daemon settings (epoll thread pool of --threads, connection
 * timeout), reading each POST body to the end and answering a fixed body.
 * Whatever tpserve achieves is measured against this, on the same machine,
 * with the same wrk script.
 *
 *   bare_http --port N [--threads 4] [--body FILE] [--header-len N]
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

typedef struct {
    int port, threads;
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

int main(int argc, char **argv)
{
    opts o;
    const char *body_file;
    if (parse_args(argc, argv, &o, &body_file) != 0) {
        fprintf(stderr, "usage: bare_http --port N [--threads 4] [--body FILE] [--header-len N]\n");
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
    struct MHD_Daemon *d = MHD_start_daemon(
        flags, (uint16_t)o.port, NULL, NULL, on_request, &o, MHD_OPTION_SOCK_ADDR, &sa,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)30,
        o.threads > 1 ? MHD_OPTION_THREAD_POOL_SIZE : MHD_OPTION_END, (unsigned)o.threads,
        MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "bare_http: cannot listen on port %d\n", o.port);
        return 1;
    }
    fprintf(stderr, "bare_http: listening on 127.0.0.1:%d, %d threads, "
                    "%zu-byte answer\n", o.port, o.threads, o.len);
    int sig;
    sigwait(&set, &sig);
    MHD_stop_daemon(d);
    if (o.body != def)
        free(o.body);
    return 0;
}
