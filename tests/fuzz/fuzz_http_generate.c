/* libFuzzer harness: generate request bodies, to a whole server in front
 * of a generation graph (fuzz_http.h, ranks as threads).
 *
 * fuzz_http's model is not a generation graph, so its /generate answers
 * 400 before reading the body. This one serves the example decoder
 * (gen_decoder_tp2: max_seq_len 16, so no sequence runs more than 16
 * steps whatever max_tokens says) with 2 slots, which 3 or 4 connections
 * at once exceed (the 503). An input is one to MAX_CONNS connections'
 * bytes (CONN_SEP between them, sent at once so their sequences share the
 * scheduler's steps), each one request: its first byte picks the route
 * (ROUTES, by the byte modulo their number: '0' to '5' in the seeds), the
 * rest is the body, sent whole with its Content-Length, then the liveness
 * probe that closes. A connection whose bytes begin with RESET_MARK sends
 * no probe and resets once the first answer byte came (FIRST_BYTE_MS at
 * most): a stream's client gone mid-stream, a /generate client gone before
 * its answer. After each input the harness waits until no sequence holds
 * a slot (settle): the next input finds both slots free, and no step is
 * still running when libFuzzer looks for leaks (a step's ranks run as
 * fibers, and LeakSanitizer does not scan the thread's own stack while one
 * runs: the step's output array, held there, would look leaked).
 * Findings: fuzz_http's, any 5xx answer but 503, and sequences still
 * running SETTLE_MS after the input (none runs more than 16 steps). */
#define FUZZ_HTTP_RANKS "threads"
#define FUZZ_HTTP_GRAPH "gen_decoder_tp2"
#define FUZZ_HTTP_SLOTS 2
#define FUZZ_HTTP_REFUSE_5XX 1
#define FUZZ_HTTP_FRAME frame_generate
#define FUZZ_HTTP_SETTLE settle
#include "fuzz_http.h"

#define MODEL "/v2/models/" FUZZ_HTTP_GRAPH
static const struct {
    const char *method, *path;
} ROUTES[] = {
    {"POST", MODEL "/generate"}, {"POST", MODEL "/generate_stream"},
    {"GET", MODEL "/config"},    {"GET", MODEL "/stats"},
    {"GET", "/metrics"},         {"POST", MODEL "/infer"}, /* refused on a generation graph */
};
#define N_ROUTES (sizeof ROUTES / sizeof *ROUTES)
#define HEAD_FMT "%s %s HTTP/1.1\r\nHost: fuzz\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n"
#define HEAD_MAX 256

static int frame_generate(const uint8_t *data, size_t n, client *cs, uint8_t **bytes)
{
    int k = split_input(data, n, cs);
    const size_t mark = sizeof RESET_MARK - 1;
    for (int i = 0; i < k; i++) {
        const uint8_t *p = cs[i].data;
        size_t len = cs[i].n;
        int reset = len >= mark && memcmp(p, RESET_MARK, mark) == 0;
        if (reset) {
            p += mark;
            len -= mark;
        }
        size_t route = len ? p[0] % N_ROUTES : 0;
        const uint8_t *body = len ? p + 1 : p;
        size_t body_len = len ? len - 1 : 0;
        if (strcmp(ROUTES[route].method, "GET") == 0)
            body_len = 0;
        if (!(bytes[i] = malloc(HEAD_MAX + body_len + sizeof CLOSER)))
            die("input", "out of memory");
        int head = snprintf((char *)bytes[i], HEAD_MAX, HEAD_FMT, ROUTES[route].method, ROUTES[route].path, body_len);
        if (head < 0 || head >= HEAD_MAX)
            die("request head", "longer than HEAD_MAX");
        size_t at = (size_t)head;
        memcpy(bytes[i] + at, body, body_len);
        at += body_len;
        if (!reset) {
            memcpy(bytes[i] + at, CLOSER, sizeof CLOSER - 1);
            at += sizeof CLOSER - 1;
        }
        cs[i] = (client){.data = bytes[i], .n = at, .pause_at = at, .reset = reset, .reset_late = reset};
    }
    return k;
}

#define STATS_PROBE "GET " MODEL "/stats HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\n\r\n"
#define IDLE "\"slots_in_use\":0,"
/* Far beyond 16 steps, even sanitized. */
#define SETTLE_MS 10000

/* Whether the model's statistics say no sequence holds a slot. */
static int idle(void)
{
    static const char probe[] = STATS_PROBE;
    char ans[16384];
    size_t got = 0;
    int fd = dial();
    if (send(fd, probe, sizeof probe - 1, MSG_NOSIGNAL) == (ssize_t)(sizeof probe - 1))
        while (got < sizeof ans - 1 && wait_fd(fd, POLLIN, ALIVE_WAIT_MS)) {
            ssize_t r = recv(fd, ans + got, sizeof ans - 1 - got, MSG_DONTWAIT);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
                break;
            got += r > 0 ? (size_t)r : 0;
        }
    hang_up(fd);
    ans[got] = 0;
    return strstr(ans, IDLE) != NULL;
}

static void settle(void)
{
    int64_t until = now_ms() + SETTLE_MS;
    while (!idle()) {
        if (now_ms() > until) {
            fprintf(stderr, "fuzz_http_generate: sequences still hold slots %d ms after the input\n", SETTLE_MS);
            abort();
        }
        usleep(1000);
    }
}
