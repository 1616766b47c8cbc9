/* The inference handler (http_ctx.h): decode on the HTTP thread that read
 * the body, submit to the batcher, and answer when the result is in (here,
 * or once the transport resumes the connection: req_ctx's REQ_* say how). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "http_ctx.h"
#include "json_tensor.h"
#include "log.h"
#include "zalloc.h"

/* The requests this HTTP thread holds (REQ_HELD): a connection is served
 * by one thread of libmicrohttpd's pool all its life, so the thread that
 * held a request is the one libmicrohttpd calls again for it. */
static _Thread_local tp_batch_held *thread_held;

/* An inference's headers are in: the rank threads are woken now, so their
 * wake-up overlaps the body and its decoding (tp_batcher_prewake). A
 * thread that holds requests holds this one too: it never runs alone on an
 * idle engine, so there is nothing to wake (and under load this saves the
 * batcher's lock on every request). */
void http_infer_prewake(tp_http_ctx *h)
{
    if (atomic_load(&h->loaded) && !thread_held)
        tp_batcher_prewake(h->batcher);
}

/* Bad requests found by the engine rather than the codec stay 400: the
 * engine names a missing input TP_NOT_FOUND, which alone would read 404.
 * Out of memory is the server's momentary state, not the request's fault:
 * 503, so clients retry (elsewhere). */
static unsigned infer_http_code(tp_status st)
{
    if (st == TP_NOMEM)
        return 503;
    return st == TP_NOT_FOUND || st == TP_INVALID || st == TP_PARSE ? 400
                                                                     : (unsigned)tp_status_http(st);
}

/* The request's own timeout replaces request_timeout_ms; either counts
 * from when the body was complete. */
static void set_timeout(tp_http_ctx *h, req_ctx *r, int64_t param_us)
{
    if (param_us >= 0) {
        r->timeout_us = param_us;
        snprintf(r->timeout_what, sizeof r->timeout_what, "parameters.timeout %lld us",
                 (long long)param_us);
    } else { /* the same for every request: spelled once, at create */
        r->timeout_us = (int64_t)h->cfg->request_timeout_ms * 1000;
        memcpy(r->timeout_what, h->default_timeout_what, sizeof r->timeout_what);
    }
}

static void end_submitting(tp_http_ctx *h, int n)
{
    if (atomic_fetch_sub(&h->submitting, n) == n && atomic_load(&h->stopping)) {
        pthread_mutex_lock(&h->mu);
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
    }
}

/* Runs the requests this thread holds: each gets its result. */
void http_run_held(tp_http_ctx *h)
{
    tp_batch_held *held = thread_held;
    thread_held = NULL;
    int n = tp_batcher_run_held(h->batcher, held);
    TP_LOG_D("ran %d held requests together on their HTTP thread", n);
    end_submitting(h, n);
}

/* Submits r: its batch may run right here, or r is held by this thread
 * (*held). Counted in h->submitting until it ran (a held request: until
 * http_run_held), so stopping never frees the batcher under it. */
static tp_status submit(tp_http_ctx *h, req_ctx *r, int *held, tp_err *err)
{
    atomic_fetch_add(&h->submitting, 1);
    if (atomic_load(&h->stopping)) {
        end_submitting(h, 1);
        return tp_fail(err, TP_UNAVAILABLE, "server is shutting down");
    }
    /* A step that may stall runs here only while this thread serves r's
     * connection alone and is given no new one (acceptor.h): an HTTP
     * thread stuck in a step otherwise left its other clients' requests,
     * probes included, unanswered for as long as the step (a stopped rank:
     * step_timeout_ms). Otherwise the batcher thread runs it and the
     * connection is suspended meanwhile. Costs a relaxed load, and for a
     * thread with one connection a compare-exchange, a load and a store. */
    int alone = h->may_stall && http_claim_alone(h, r->conn);
    tp_batch_req br = {r->req.inputs, r->req.n_inputs, r->t_body / 1e3, r->timeout_us,
                       r->timeout_what, http_on_batch_done, r, .decoded = 1, .t_now = r->t_decoded / 1e3,
                       .more_may_follow = h->may_hold && http_thread_serves_others(h, r), .alone = alone};
    atomic_store(&r->handoff, TP_HANDOFF_NONE);
    atomic_fetch_add(&h->in_engine, 1);
    tp_status st = h->may_hold ? tp_batcher_submit_held(h->batcher, &br, &thread_held, held, err)
                               : tp_batcher_submit(h->batcher, &br, err);
    if (alone)
        http_end_alone(h);
    if (st != TP_OK)
        atomic_fetch_sub(&h->in_engine, 1);
    if (st != TP_OK || !*held)
        end_submitting(h, 1);
    return st;
}

/* What a binary answer sends straight from the engine's outputs: freed by
 * libmicrohttpd once the response is gone. */
typedef struct {
    char *header;
    int header_pooled;
    tp_host_tensor *outs;
    int n_outs;
} sent_answer;

static void free_sent_answer(void *cls)
{
    sent_answer *a = cls;
    tp_jbuf_free_text(a->header, a->header_pooled);
    tp_host_tensors_free(a->outs, a->n_outs);
    free(a);
}

/* Binary answers up to this size are built as one body (the codec copies
 * the outputs in). libmicrohttpd 0.9.75 sends an iovec response's HTTP
 * header in a send of its own, so a zero-copy answer costs a second syscall
 * and a second TCP segment, which wakes the client twice; copying 64 KiB
 * costs less than either (binary c=32: see server/README.md at 27cb4dd, "one send per
 * answer"). */
#define SINGLE_SEND_MAX (64 * 1024)

/* The header and the outputs' own bytes as one response, without copying
 * them into a body: takes ownership of buf->body and r->outs. */
static struct MHD_Response *binary_response(req_ctx *r, tp_kserve_buf *buf,
                                            const tp_kserve_piece *tail, int n_tail)
{
    sent_answer *a = malloc(sizeof *a);
    struct MHD_IoVec *iov = tp_zalloc((size_t)n_tail + 1, sizeof *iov); /* MHD copies it */
    struct MHD_Response *resp = NULL;
    if (!a) {
        tp_jbuf_free_text(buf->body, buf->pooled);
        tp_host_tensors_free(r->outs, r->n_outs);
    } else {
        *a = (sent_answer){buf->body, buf->pooled, r->outs, r->n_outs};
    }
    if (a && iov) {
        iov[0] = (struct MHD_IoVec){buf->body, buf->len};
        for (int i = 0; i < n_tail; i++)
            iov[i + 1] = (struct MHD_IoVec){tail[i].data, tail[i].len};
        resp = MHD_create_response_from_iovec(iov, (unsigned)n_tail + 1, free_sent_answer, a);
    }
    free(iov);
    if (!resp && a)
        free_sent_answer(a);
    r->outs = NULL;
    return http_with_headers(resp, "application/octet-stream", buf->header_len);
}

/* A body buffer up to this size is kept for the thread's next request
 * (take_record). */
#define SPARE_BODY_MAX ((size_t)64 << 10)

/* The decoded request and the body it was decoded from (binary tensors may
 * point into it). */
void http_release_request(req_ctx *r)
{
    tp_kserve_request_free(&r->req);
    if (r->cap > SPARE_BODY_MAX) { /* a small one stays for the thread's next request */
        free(r->body);
        r->body = NULL;
        r->cap = 0;
    }
}

static int64_t outs_bytes(const req_ctx *r)
{
    int64_t n = 0;
    for (int i = 0; i < r->n_outs; i++)
        n += (int64_t)r->outs[i].nbytes;
    return n;
}

/* The answer is made and the request's own bytes released: what it holds
 * until sent is now known (answer bytes, the outputs a binary answer sends
 * from, a spare body buffer), often far below what http_dispatch_infer took for
 * it (JSON numbers spelled short). The difference goes back when it is
 * worth an atomic add. */
#define SETTLE_MIN ((int64_t)64 << 10)
static void settle_answer(req_ctx *r, int64_t answer)
{
    int64_t keep = answer + (r->body ? r->body_held : 0);
    if (r->mem.held - keep > SETTLE_MIN)
        tp_mem_take(&r->mem, keep - r->mem.held);
}

/* The batch result as a KServe answer, sent: on the thread that ran the
 * batch, or on the one that resumed the connection. Binary outputs go out
 * from the engine's buffers (no copy into a body). */
enum MHD_Result http_answer_infer(tp_http_ctx *h, req_ctx *r)
{
    tp_err *err = &r->err; /* the batch's error, if any; ours from here (not copied: 1 KiB) */
    tp_status st = r->st;
    tp_kserve_buf buf = {0};
    /* the answer's pieces: on the stack for the usual few outputs */
    tp_kserve_piece tail_here[8];
    size_t n_pieces = (size_t)r->req.n_outputs + 1;
    tp_kserve_piece *tail = n_pieces <= sizeof tail_here / sizeof *tail_here
                                ? memset(tail_here, 0, sizeof tail_here)
                                : tp_zalloc(n_pieces, sizeof *tail);
    int n_tail = 0;
    if (st == TP_OK && !tail)
        st = tp_fail(err, TP_NOMEM, "out of memory encoding the answer");
    else if (st == TP_OK)
        st = tp_kserve_build_infer_parts(&h->model, &r->req, r->outs, r->n_outs, SINGLE_SEND_MAX,
                                         &buf, tail, &n_tail, err);
    else if (st != TP_TIMEOUT && st != TP_UNAVAILABLE)
        tp_err_prefix(err, "inference failed: ");
    r->t_encoded = tp_now_ms();
    /* compute_output: from the engine's end for its batch (t_decoded is
     * when it was queued) to this answer encoded, as Triton counts a
     * batch's responses (splitting the outputs, the answers before this
     * one, this one), and without a clock read of its own */
    if (st == TP_OK)
        r->times.output = (r->t_encoded - r->t_decoded) / 1e3 - r->times.queue - r->times.infer;
    http_release_request(r);
    if (st == TP_OK)
        settle_answer(r, (int64_t)buf.len + (n_tail ? outs_bytes(r) : 0));
    struct MHD_Response *resp = NULL;
    if (st == TP_OK && n_tail)
        resp = binary_response(r, &buf, tail, n_tail);
    else if (st == TP_OK)
        resp = http_make_response(buf.body, buf.len, buf.pooled,
                             buf.header_len ? "application/octet-stream" : "application/json",
                             buf.header_len);
    if (tail != tail_here)
        free(tail);
    tp_host_tensors_free(r->outs, r->n_outs);
    r->outs = NULL;
    atomic_fetch_sub(&h->in_engine, 1);
    if (st != TP_OK)
        return http_reply_error(h, r, infer_http_code(st), "%s", err->msg);
    http_log_request(r, 200, NULL);
    return http_send_response(h, r, 200, resp);
}

/* Triton's trace extension: is this inference one to trace? */
static void begin_trace(tp_http_ctx *h, req_ctx *r)
{
    r->trace_id = tp_trace_sample(h->trace);
    if (r->trace_id && r->req.id)
        /* as much as the trace records: the id is the client's, of any size
         * (NULL without memory: traced without it) */
        r->trace_rid = strndup(r->req.id, tp_trace_request_id_len(r->req.id));
}

static int64_t ms_to_ns(double ms) { return (int64_t)(ms * 1e6); }

/* A traced request's timestamps, written (trace.h names them); sent: its
 * answer went out whole. */
void http_end_trace(tp_http_ctx *h, req_ctx *r, int sent)
{
    int ran = r->times.infer > 0;
    double compute_start = r->t_decoded + r->times.queue * 1e3;
    tp_trace_stamps s = {
        .recv_start = ms_to_ns(r->t_start),
        .recv_end = ms_to_ns(r->t_body),
        .queued = ms_to_ns(r->t_decoded),
        .compute_start = ran ? ms_to_ns(compute_start) : 0,
        .compute_end = ran ? ms_to_ns(compute_start + r->times.infer * 1e3) : 0,
        .encoded = ms_to_ns(r->t_encoded),
        .sent = sent ? tp_now_ns() : 0,
    };
    tp_trace_record(h->trace, r->trace_id, h->model.name, h->model.version, r->trace_rid, &s);
    free(r->trace_rid);
    r->trace_rid = NULL;
    r->trace_id = 0;
}

/* Body complete, on the HTTP thread that read it: decode, submit, and
 * answer here when the batch ran here; otherwise suspend until the batcher
 * thread delivers. A bad request is answered without ever leaving this
 * thread. */
enum MHD_Result http_dispatch_infer(tp_http_ctx *h, req_ctx *r)
{
    if (!r->before_drain)
        return http_reply_error(h, r, 503, "server is shutting down");
    if (h->gen) /* its steps write the KV cache of the sequences the scheduler runs */
        return http_reply_error(h, r, 400, "model '%s' is a generation graph: POST /v2/models/%s/generate or "
                                "generate_stream", h->model.name, h->model.name);
    const char *ihcl = r->ihcl;
    r->header_len = -1;
    if (ihcl && http_parse_ll(ihcl, &r->header_len) != 0)
        return http_reply_error(h, r, 400, "Inference-Header-Content-Length '%s' is not a "
                           "non-negative integer", ihcl);
    tp_err err;
    r->t_body = tp_now_ms();
    tp_status st = tp_kserve_parse_infer(&h->model, r->body ? r->body : "", r->len, r->header_len,
                                         &r->mem, &r->req, &err);
    r->t_decoded = tp_now_ms();
    r->times.input = (r->t_decoded - r->t_body) / 1e3;
    int held = 0;
    if (st == TP_OK) /* held until the answer is sent: taken now, while the request can still be refused */
        st = tp_mem_take_for(&r->mem, tp_kserve_answer_bytes(&h->model, &r->req), "the answer", &err);
    if (st != TP_OK && r->mem.refused) {
        http_release_request(r);
        return http_reply_budget(h, r, err.msg);
    }
    if (st == TP_OK) {
        begin_trace(h, r);
        set_timeout(h, r, r->req.timeout_us);
        st = submit(h, r, &held, &err);
    }
    if (st != TP_OK) {
        http_release_request(r);
        return http_reply_error(h, r, infer_http_code(st), "%s", err.msg);
    }
    if (held) {
        r->state = REQ_HELD; /* answered when libmicrohttpd calls again */
        return MHD_YES;
    }
    if (tp_handoff_delivered(&r->handoff))
        return http_answer_infer(h, r); /* ran here, or quick: no suspend */
    r->state = REQ_SUBMITTED; /* suspended when libmicrohttpd calls again (see REQ_*) */
    return MHD_YES;
}
