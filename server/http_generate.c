/* The generate extension (Triton's): POST /v2/models/M/generate answers
 * the whole continuation once it is done; /generate_stream sends each token
 * as a server-sent event as soon as its step ends. Both hand the prompt to
 * the model's generation scheduler (gen_sched.h), which owns the steps.
 *
 * /generate's connection is suspended until its sequence's next token (the
 * scheduler's notify resumes it), and so on until the sequence ends. A
 * stream's response reads the sequence as libmicrohttpd asks for bytes and
 * suspends the connection when nothing new is there; the next token
 * resumes it. Both suspend inside the
 * sequence's lock (tp_gen_seq_read's armed callback) and are resumed inside
 * it, so a resume never comes before its suspend. A stream's client that
 * goes is noticed at the next token's write: its sequence is released and
 * its slot is free at the next step. A /generate client that goes is
 * noticed at the next token by a peek at its socket. */
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "engine.h"
#include "gen_sched.h"
#include "http_ctx.h"
#include "log.h"

#define MAX_STOP_IDS 64
#define DEFAULT_MAX_TOKENS 16

/* What a generation request keeps: its sequence and, for a stream, the
 * bytes of the events not yet taken by libmicrohttpd. */
typedef struct http_gen {
    tp_gen_seq *seq;
    struct MHD_Connection *conn;
    int64_t sent;          /* tokens already in events (a stream) or read (/generate) */
    int64_t *ids;          /* /generate: the tokens read */
    char *out;             /* a stream's pending event bytes */
    size_t out_len, out_off, out_cap;
    int ended;             /* the final event is in out */
    char model[128];
} http_gen;

/* ---- the engine step the scheduler runs ---------------------------------- */

typedef struct {
    tp_engine *e;
    const tp_generate_info *gi;
} engine_step;

static tp_host_tensor int64_rows(const char *name, const int64_t *v, int64_t rows, int ndim)
{
    tp_host_tensor t = {.dtype = TP_I64, .ndim = ndim, .data = (void *)v,
                        .nbytes = (size_t)rows * sizeof(int64_t), .owner = TP_HOST_BORROWED};
    snprintf(t.name, sizeof t.name, "%s", name);
    t.shape[0] = rows;
    t.shape[1] = 1;
    return t;
}

static tp_status run_engine_step(void *arg, const int64_t *ids, const int64_t *pos, const int64_t *slot,
                                 const int64_t *want, int64_t rows, int64_t *next, tp_err *err)
{
    engine_step *es = arg;
    tp_host_tensor in[4] = {int64_rows(es->gi->input_ids, ids, rows, 2),
                            int64_rows(es->gi->positions, pos, rows, 1),
                            int64_rows(es->gi->slots, slot, rows, 1)};
    int n_in = 3;
    if (es->gi->logit_rows) /* the LM head runs only on the rows whose token is read */
        in[n_in++] = int64_rows(es->gi->logit_rows, want, rows, 1);
    tp_host_tensor *outs = NULL;
    int n_outs = 0;
    tp_status st = tp_engine_infer(es->e, in, n_in, &outs, &n_outs, err);
    int found = 0;
    for (int i = 0; st == TP_OK && i < n_outs; i++)
        if (strcmp(outs[i].name, es->gi->next_token) == 0 && outs[i].dtype == TP_I64 &&
            outs[i].nbytes == (size_t)rows * sizeof(int64_t)) {
            memcpy(next, outs[i].data, outs[i].nbytes);
            found = 1;
        }
    if (st == TP_OK && !found)
        st = tp_fail(err, TP_INTERNAL, "the step gave no INT64 output '%s' of %lld rows", es->gi->next_token,
                     (long long)rows);
    tp_host_tensors_free(outs, n_outs);
    return st;
}

static engine_step the_step; /* one generation model per server */

tp_status http_generate_start(tp_http_ctx *h, tp_engine *e, tp_err *err)
{
    const tp_generate_info *gi = tp_engine_generate_info(e);
    if (!gi)
        return TP_OK;
    h->gen_max_seq_len = gi->max_seq_len;
    tp_engine_stats es;
    tp_engine_get_stats(e, &es);
    the_step = (engine_step){e, gi};
    tp_gen_prefill prefill = strcmp(h->cfg->generate_prefill, "separate") == 0 ? TP_GEN_PREFILL_SEPARATE
                                                                             : TP_GEN_PREFILL_MIXED;
    tp_gen_opts o = {.max_rows = es.bucket[es.n_buckets - 1], .prefill = prefill, .slots = gi->slots_n,
                     .max_seq_len = gi->max_seq_len,
                     .vocab_size = gi->vocab_size, .step = run_engine_step, .step_arg = &the_step};
    tp_status st = tp_gen_create(&o, &h->gen, err);
    if (st == TP_OK)
        TP_LOG_I("generation: %lld sequence slots of %lld positions, up to %lld token rows a step, %s prefill, "
                 "LM head on %s", (long long)o.slots, (long long)o.max_seq_len, (long long)o.max_rows,
                 h->cfg->generate_prefill, gi->logit_rows ? "the rows that give a token" : "every row");
    return st;
}

/* The scheduler's settings and counters as JSON (model config, stats). */
static json_t *generate_json(tp_http_ctx *h)
{
    tp_gen_stats g;
    tp_gen_get_stats(h->gen, &g);
    double tpot = g.decode_tokens ? g.decode_s / (double)g.decode_tokens : 0;
    return json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}", "max_seq_len", (json_int_t)g.max_seq_len,
                     "slots", (json_int_t)g.slots, "slots_in_use", (json_int_t)g.slots_in_use, "sequences",
                     (json_int_t)g.sequences, "prompt_tokens", (json_int_t)g.prompt_tokens, "output_tokens",
                     (json_int_t)g.output_tokens, "steps", (json_int_t)g.steps, "step_rows", (json_int_t)g.rows,
                     "cancelled", (json_int_t)g.cancelled, "time_per_output_token_s", tpot);
}

char *http_generate_annotate(tp_http_ctx *h, char *doc, int stats)
{
    if (!h->gen || !doc)
        return doc;
    json_t *root = json_loads(doc, 0, NULL);
    json_t *at = root;
    if (stats) /* {"model_stats":[{...}]}: into the model's entry */
        at = json_array_get(json_object_get(root, "model_stats"), 0);
    json_t *g = generate_json(h);
    char *out = NULL;
    if (json_is_object(at) && g && json_object_set_new(at, stats ? "generate_stats" : "generate", g) == 0) {
        g = NULL;
        out = json_dumps(root, JSON_COMPACT);
    }
    json_decref(g);
    json_decref(root);
    if (!out)
        return doc; /* out of memory: the answer without it */
    free(doc);
    return out;
}

/* ---- the request ---------------------------------------------------------- */

static tp_status int_array(json_t *a, const char *key, int64_t *out, int64_t cap, int64_t *n, tp_err *err)
{
    if (!json_is_array(a))
        return tp_fail(err, TP_INVALID, "'%s' must be an array of integers", key);
    *n = (int64_t)json_array_size(a);
    if (*n > cap)
        return tp_fail(err, TP_INVALID, "'%s' has %lld entries, at most %lld are allowed", key, (long long)*n,
                       (long long)cap);
    for (int64_t i = 0; i < *n; i++) {
        json_t *v = json_array_get(a, (size_t)i);
        if (!json_is_integer(v))
            return tp_fail(err, TP_INVALID, "%s[%lld] is not an integer", key, (long long)i);
        out[i] = (int64_t)json_integer_value(v);
    }
    return TP_OK;
}

/* max_tokens and stop_ids, at the top level or (Triton's habit) in
 * "parameters"; anything else there is refused by name. */
static tp_status read_options(json_t *o, const char *where, tp_gen_request *rq, int64_t *stop, tp_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        if (strcmp(key, "max_tokens") == 0) {
            if (!json_is_integer(v))
                return tp_fail(err, TP_INVALID, "%smax_tokens must be an integer", where);
            rq->max_tokens = (int64_t)json_integer_value(v);
        } else if (strcmp(key, "stop_ids") == 0) {
            int64_t n;
            tp_status st = int_array(v, "stop_ids", stop, MAX_STOP_IDS, &n, err);
            if (st != TP_OK)
                return st;
            rq->stop_ids = stop;
            rq->n_stop = (int)n;
        } else if (!*where && (strcmp(key, "input_ids") == 0 || strcmp(key, "parameters") == 0 ||
                               strcmp(key, "id") == 0)) {
            continue;
        } else {
            return tp_fail(err, TP_INVALID, "unknown key '%s%s' (a generate request takes input_ids, max_tokens, "
                           "stop_ids, parameters and id)", where, key);
        }
    }
    return TP_OK;
}

/* The body into rq (prompt into prompt, of cap tokens at most). */
static tp_status parse_generate(const char *body, size_t len, int64_t *prompt, int64_t cap, int64_t *stop,
                                tp_gen_request *rq, tp_err *err)
{
    json_error_t je;
    json_t *root = json_loadb(body, len, 0, &je);
    if (!root)
        return tp_fail(err, TP_INVALID, "request body is not JSON: %s (line %d, column %d)", je.text, je.line,
                       je.column);
    tp_status st = TP_OK;
    *rq = (tp_gen_request){.prompt = prompt, .max_tokens = DEFAULT_MAX_TOKENS};
    json_t *ids = json_object_get(root, "input_ids"), *params = json_object_get(root, "parameters");
    if (!json_is_object(root))
        st = tp_fail(err, TP_INVALID, "request body must be a JSON object");
    else if (!ids)
        st = tp_fail(err, TP_INVALID, "missing 'input_ids' (the prompt's token ids)");
    else if ((st = int_array(ids, "input_ids", prompt, cap, &rq->n_prompt, err)) != TP_OK)
        ;
    else if ((st = read_options(root, "", rq, stop, err)) != TP_OK)
        ;
    else if (params && !json_is_object(params))
        st = tp_fail(err, TP_INVALID, "'parameters' must be an object");
    else if (params)
        st = read_options(params, "parameters.", rq, stop, err);
    json_decref(root);
    return st;
}

/* ---- answers -------------------------------------------------------------- */

static char *answer_json(const http_gen *g, const int64_t *ids, int64_t n, tp_gen_end end)
{
    json_t *a = json_array();
    for (int64_t i = 0; a && i < n; i++)
        json_array_append_new(a, json_integer((json_int_t)ids[i]));
    json_t *o = json_pack("{s:s, s:s, s:o, s:s}", "model_name", g->model, "model_version", "1", "output_ids", a,
                          "finish_reason", tp_gen_end_name(end));
    char *doc = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    return doc;
}

static void suspend_conn(void *arg)
{
    http_gen *g = arg;
    MHD_suspend_connection(g->conn);
}

static void resume_conn(void *arg)
{
    http_gen *g = arg;
    MHD_resume_connection(g->conn);
}

static void gen_free(http_gen *g)
{
    if (!g)
        return;
    tp_gen_seq_release(g->seq);
    free(g->out);
    free(g->ids);
    free(g);
}

/* Whether the client of c has gone: its socket reads end-of-file or an
 * error. libmicrohttpd does not poll a suspended connection, so without
 * this a /generate client that leaves would hold its slot until its
 * answer is written; a client that closes only its sending side counts as
 * gone too. */
static int peer_gone(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    ssize_t n = ci ? recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) : 1;
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* /generate, on each call after the handler's: the answer once the
 * sequence has ended, else suspended until its next token, when the
 * client is checked (one that has gone frees its slot at the next step). */
enum MHD_Result http_generate_continue(tp_http_ctx *h, req_ctx *r)
{
    http_gen *g = r->gen;
    tp_gen_end end;
    tp_status st;
    tp_err err;
    int64_t cap = tp_gen_seq_max_tokens(g->seq);
    if (!g->ids && !(g->ids = malloc((size_t)cap * sizeof *g->ids)))
        return http_reply_error(h, r, 500, "out of memory reading the generated tokens");
    for (;;) {
        int64_t n = tp_gen_seq_read(g->seq, g->sent, g->ids + g->sent, cap - g->sent, TP_GEN_WAKE_TOKEN,
                                    suspend_conn, g, &end, &st, &err);
        g->sent += n;
        if (end != TP_GEN_RUNNING)
            break;
        if (n == 0)
            return MHD_YES; /* suspended: the next token or the end resumes it */
        if (peer_gone(g->conn))
            tp_gen_seq_cancel(g->seq);
    }
    enum MHD_Result ret;
    if (end == TP_GEN_FAILED) {
        ret = http_reply_error(h, r, (unsigned)tp_status_http(st), "%s", err.msg);
    } else {
        char *doc = answer_json(g, g->ids, g->sent, end);
        ret = doc ? http_reply_json(h, r, 200, doc) : http_reply_error(h, r, 500, "out of memory");
    }
    r->gen = NULL;
    gen_free(g);
    return ret;
}

/* ---- the stream ----------------------------------------------------------- */

static int out_printf(http_gen *g, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int out_printf(http_gen *g, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        /* before the first event out is NULL, and NULL + 0 is undefined */
        int n = vsnprintf(g->out ? g->out + g->out_len : NULL, g->out_cap - g->out_len, fmt, ap);
        va_end(ap);
        if (n < 0)
            return -1;
        if ((size_t)n < g->out_cap - g->out_len) {
            g->out_len += (size_t)n;
            return 0;
        }
        size_t cap = (g->out_cap + (size_t)n + 1) * 2;
        char *p = realloc(g->out, cap);
        if (!p)
            return -1;
        g->out = p;
        g->out_cap = cap;
    }
}

/* The next events into g->out: the new tokens, one event each, or the
 * final event; 0 when nothing is new (then the connection is suspended). */
static int next_events(http_gen *g)
{
    int64_t ids[64];
    tp_gen_end end;
    tp_status st;
    tp_err err;
    g->out_len = g->out_off = 0;
    int64_t n = tp_gen_seq_read(g->seq, g->sent, ids, 64, TP_GEN_WAKE_TOKEN, suspend_conn, g, &end, &st, &err);
    for (int64_t i = 0; i < n; i++)
        if (out_printf(g, "data: {\"output_ids\":[%lld]}\n\n", (long long)ids[i]) != 0)
            return -1;
    g->sent += n;
    if (n > 0 || end == TP_GEN_RUNNING)
        return n > 0;
    g->ended = 1;
    if (end == TP_GEN_FAILED) {
        json_t *e = json_pack("{s:s}", "error", err.msg);
        char *doc = e ? json_dumps(e, JSON_COMPACT) : NULL;
        json_decref(e);
        int bad = !doc || out_printf(g, "event: error\ndata: %s\n\n", doc) != 0;
        free(doc);
        return bad ? -1 : 1;
    }
    return out_printf(g, "data: {\"model_name\":\"%s\",\"model_version\":\"1\",\"output_tokens\":%lld,"
                         "\"finish_reason\":\"%s\"}\n\n", g->model, (long long)g->sent, tp_gen_end_name(end)) != 0
               ? -1 : 1;
}

/* libmicrohttpd asks for the stream's next bytes. Returning 0 with the
 * connection suspended is how its manual says to wait for data. */
static ssize_t read_stream(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    http_gen *g = cls;
    if (g->out_off == g->out_len) {
        if (g->ended)
            return MHD_CONTENT_READER_END_OF_STREAM;
        int got = next_events(g);
        if (got < 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (got == 0)
            return 0; /* suspended in next_events */
    }
    size_t n = g->out_len - g->out_off < max ? g->out_len - g->out_off : max;
    memcpy(buf, g->out + g->out_off, n);
    g->out_off += n;
    return (ssize_t)n;
}

static void free_stream(void *cls) { gen_free(cls); }

static enum MHD_Result start_stream(tp_http_ctx *h, req_ctx *r, http_gen *g)
{
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, read_stream, g,
                                                                  free_stream);
    if (!resp) {
        gen_free(g);
        return http_reply_error(h, r, 500, "out of memory starting the stream");
    }
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    http_log_request(r, 200, NULL);
    return http_send_response(h, r, 200, resp);
}

/* ---- the handlers ---------------------------------------------------------- */

static enum MHD_Result generate(tp_http_ctx *h, req_ctx *r, int stream)
{
    if (!r->before_drain)
        return http_reply_error(h, r, 503, "server is shutting down");
    if (!h->gen)
        return http_reply_error(h, r, 400, "model '%s' is not a generation graph (import it with "
                                "import_onnx.py --generate): use /v2/models/%s/infer", h->model.name, h->model.name);
    tp_err err;
    int64_t cap = h->gen_max_seq_len + 1; /* one more: the scheduler says what is too long */
    int64_t *prompt = malloc((size_t)cap * sizeof *prompt), stop[MAX_STOP_IDS];
    if (!prompt)
        return http_reply_error(h, r, 500, "out of memory reading the prompt");
    tp_gen_request rq;
    tp_status st = parse_generate(r->body ? r->body : "", r->len, prompt, cap, stop, &rq, &err);
    http_gen *g = st == TP_OK ? calloc(1, sizeof *g) : NULL;
    if (st == TP_OK && !g)
        st = tp_fail(&err, TP_NOMEM, "out of memory");
    if (st == TP_OK) {
        g->conn = r->conn;
        snprintf(g->model, sizeof g->model, "%s", h->model.name);
        rq.notify = resume_conn;
        rq.notify_arg = g;
        st = tp_gen_submit(h->gen, &rq, &g->seq, &err);
    }
    free(prompt);
    if (st != TP_OK) {
        free(g);
        return http_reply_error(h, r, (unsigned)tp_status_http(st), "%s", err.msg);
    }
    if (stream)
        return start_stream(h, r, g);
    r->gen = g;
    r->state = REQ_GENERATING; /* suspended on libmicrohttpd's next call (see REQ_*) */
    return MHD_YES;
}

enum MHD_Result http_post_generate(tp_http_ctx *h, req_ctx *r) { return generate(h, r, 0); }
enum MHD_Result http_post_generate_stream(tp_http_ctx *h, req_ctx *r) { return generate(h, r, 1); }

/* The connection of a /generate request went before its answer. */
void http_generate_end(req_ctx *r)
{
    gen_free(r->gen);
    r->gen = NULL;
}
