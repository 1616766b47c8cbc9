/* kserve_doc_cache.c — the KServe codec's per-thread memory of the last
 * request document and of the request made from it (kserve_internal.h). */
#include "kserve_internal.h"
#include "json_cap.h"
#include "json_kind.h"
#include "thread_slot.h"

#include <stdlib.h>
#include <string.h>

/* ---- the last document, per thread -------------------------------------- *
 *
 * A client sends the same JSON around its data again and again: the same
 * names, shapes and datatypes, with the data arrays left out (JSON
 * tensors, which jansson never sees) or in the binary tail. jansson took
 * about 2.3 us to parse a 130-byte binary header (a tenth of a binary
 * request's server CPU at 32 connections), so each HTTP thread keeps the
 * last document it parsed, by its exact text, and a request whose text is
 * the same byte for byte reuses it. parse_root only reads the document, and
 * only its thread ever touches it. A document that failed, or had bytes
 * after it, is never kept: the same text would fail the same way. */

#define DOC_CACHE_MAX 4096 /* bytes of text a thread keeps a document for */

/* The request parse_root made of the kept document, when every input of it
 * was binary: the same header text over a binary section of the same
 * length, against the same model, makes the same request but for where
 * each input's bytes are (offsets into the section). Checking that is a
 * memcmp and a few compares; parse_root's lookups, checks and allocations
 * were most of what a binary request's header still cost with the
 * document kept (3.3k instructions a request, 0.8k with this; callgrind,
 * 2026-11-27). Requests naming a shared memory region are never kept: the
 * registry changes between them. */
typedef struct {
    tp_kserve_request req;   /* inputs' data NULL: see off */
    size_t *off;             /* input k's bytes: at off[k] of the binary section */
    size_t tail_len;         /* the binary section's length it was parsed with */
    const tp_kserve_model *m; /* the model, and its signature as it was (sig) */
    char *sig;
    size_t sig_len;
} req_template;

struct doc_cache {
    size_t len;
    json_t *root;
    int whole; /* text was the whole JSON part of its body: it had no data arrays */
    req_template *tmpl; /* NULL: none for this document */
    char text[DOC_CACHE_MAX];
};

static void template_free(req_template *t)
{
    if (!t)
        return;
    tp_kserve_request_free(&t->req);
    free(t->off);
    free(t->sig);
    free(t);
}

static void doc_cache_free(void *p)
{
    doc_cache *c = p;
    json_decref(c->root);
    template_free(c->tmpl);
    free(c);
}

/* Each thread's cache, created on first use */
static tp_thread_slot doc_cache_slot = TP_THREAD_SLOT(doc_cache_free, sizeof(doc_cache));

doc_cache *kserve_doc_cache(void) { return tp_thread_slot_get(&doc_cache_slot); }

/* The document of text[0..len), when this thread parsed the same text last
 * (a new reference); NULL otherwise. */
static json_t *cached_doc(doc_cache *c, const char *text, size_t len)
{
    if (!c || !c->root || c->len != len || memcmp(c->text, text, len) != 0)
        return NULL;
    return json_incref(c->root);
}

static void keep_doc(doc_cache *c, const char *text, size_t len, int whole, json_t *root)
{
    if (!c || len > DOC_CACHE_MAX)
        return;
    json_decref(c->root);
    template_free(c->tmpl);
    c->tmpl = NULL;
    memcpy(c->text, text, len);
    c->len = len;
    c->whole = whole;
    c->root = json_incref(root);
}

/* The document of a body whose JSON part, body[0..len), is byte for byte
 * the whole text of c's last document: a binary request's header, sent
 * again. Such a text has no data arrays (it was kept so), so it needs no
 * scan for them either, which cost as much again as the rest of reading a
 * binary request's header. NULL otherwise. */
json_t *kserve_cached_whole_doc(doc_cache *c, const char *body, size_t len)
{
    return c && c->whole ? cached_doc(c, body, len) : NULL;
}

/* Parses one JSON document (or reuses cache's last one, above). Bytes
 * after it are reported apart from plain syntax errors: they usually mean a
 * binary tail sent without its Inference-Header-Content-Length header. */
tp_status kserve_load_json(doc_cache *cache, const char *body, size_t len, long long header_len,
                           const data_text *text, json_t **out, tp_err *err)
{
    char outside[DOC_CACHE_MAX];
    const char *doc = body;
    size_t doc_len = len;
    if (text->n_spans > 0) {
        doc = outside;
        doc_len = tp_json_outside_spans(body, len, text->spans, text->n_spans, outside, sizeof outside);
    }
    if ((*out = cached_doc(cache, doc, doc_len)))
        return TP_OK;
    json_error_t jerr;
    size_t flags = JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK;
    /* past the buffer doc_len only says "more": the body bounds the text */
    size_t text_len = doc_len <= sizeof outside ? doc_len : len;
    tp_json_cap_begin(text_len);
    /* the outside text, when it was built whole above, is what jansson reads */
    json_t *root = doc == outside && doc_len <= sizeof outside
                       ? tp_json_load_outside_text(body, text->spans, text->n_spans, outside,
                                                   doc_len, flags, &jerr)
                       : tp_json_load_outside_spans(body, len, text->spans, text->n_spans, flags,
                                                    &jerr);
    if (tp_json_cap_end() && !root)
        return tp_json_cap_refusal("request", text_len, err);
    if (!root && json_error_code(&jerr) == json_error_out_of_memory)
        return tp_fail(err, TP_NOMEM, "out of memory parsing a %zu-byte request", len);
    if (!root)
        return tp_fail(err, TP_PARSE, "malformed JSON in request body at line %d column %d: %s",
                       jerr.line, jerr.column, jerr.text);
    size_t end = (size_t)jerr.position;
    while (end < len && strchr(" \t\r\n", body[end]) && body[end])
        end++;
    if (end < len && header_len >= 0) {
        json_decref(root);
        return tp_fail(err, TP_INVALID, "Inference-Header-Content-Length %lld runs %zu bytes past the JSON header, "
                       "which ends at byte %zu: it must be the length of the JSON header alone",
                       header_len, len - end, (size_t)jerr.position);
    }
    if (end < len) {
        json_decref(root);
        return tp_fail(err, TP_PARSE, "request body has %zu bytes after the JSON document (at "
                       "byte %zu); a binary tensor tail needs the Inference-Header-Content-Length "
                       "header", len - end, (size_t)jerr.position);
    }
    keep_doc(cache, doc, doc_len, doc == body, root);
    *out = root;
    return TP_OK;
}

/* The model's inputs' and outputs' names, dtypes and shapes as bytes,
 * written to buf or compared with cmp (a caller may build another model
 * at the same address, so the template keeps what its model was). */
typedef struct {
    char *buf;       /* NULL: only counted (len) */
    const char *cmp; /* non-NULL: compared instead (cap bytes) */
    size_t len, cap;
    int differs;
} sig_sink;

static void sig_put(sig_sink *s, const void *v, size_t n)
{
    if (s->cmp)
        s->differs |= s->len + n > s->cap || memcmp(s->cmp + s->len, v, n) != 0;
    else if (s->buf)
        memcpy(s->buf + s->len, v, n);
    s->len += n;
}

/* dtype, ndim and shape are put as one run of bytes: no padding among them */
#define IO_DESC_RUN (offsetof(tp_io_desc, shape) + sizeof(((tp_io_desc *)0)->shape) - offsetof(tp_io_desc, dtype))
_Static_assert(IO_DESC_RUN == sizeof(tp_dtype) + sizeof(int) + sizeof(int64_t) * TP_MAX_DIMS,
               "tp_io_desc has padding between dtype and shape");

static void model_signature(const tp_kserve_model *m, sig_sink *s)
{
    sig_put(s, &m->n_inputs, sizeof m->n_inputs);
    sig_put(s, &m->n_outputs, sizeof m->n_outputs);
    for (int pass = 0; pass < 2 && !s->differs; pass++) {
        const tp_io_desc *io = pass ? m->outputs : m->inputs;
        for (int i = 0; i < (pass ? m->n_outputs : m->n_inputs); i++) {
            sig_put(s, io[i].name, strlen(io[i].name) + 1);
            sig_put(s, &io[i].dtype, IO_DESC_RUN);
        }
    }
}

/* Whether req, just parsed from c's document, can be kept as its
 * template: every input a view into the binary section, no output in a
 * shared memory region. */
static int templatable(const tp_kserve_request *req, const bin_tail *tail)
{
    if (!tail->present)
        return 0;
    for (int k = 0; k < req->n_inputs; k++) {
        const unsigned char *d = req->inputs[k].data;
        if (req->inputs[k].owner != TP_HOST_BORROWED || d < tail->p ||
            (size_t)(d - tail->p) + req->inputs[k].nbytes > tail->len)
            return 0;
    }
    for (int i = 0; i < req->n_outputs; i++)
        if (req->outputs[i].shm)
            return 0;
    return 1;
}

/* A copy of req's header (id, inputs' and outputs' descriptions); its
 * inputs' data NULL. TP_NOMEM or TP_OK. */
static tp_status copy_request(const tp_kserve_request *req, tp_kserve_request *to)
{
    *to = *req;
    to->id = NULL;
    to->outputs = NULL;
    to->inputs = malloc((size_t)(req->n_inputs ? req->n_inputs : 1) * sizeof *req->inputs);
    if (to->inputs)
        memcpy(to->inputs, req->inputs, (size_t)req->n_inputs * sizeof *req->inputs);
    to->outputs = malloc((size_t)(req->n_outputs ? req->n_outputs : 1) * sizeof *req->outputs);
    if (to->outputs)
        memcpy(to->outputs, req->outputs, (size_t)req->n_outputs * sizeof *req->outputs);
    if (req->id)
        to->id = strdup(req->id);
    if (!to->inputs || !to->outputs || (req->id && !to->id)) {
        free(to->inputs);
        to->inputs = NULL;
        to->n_inputs = 0;
        tp_kserve_request_free(to);
        return TP_NOMEM;
    }
    return TP_OK;
}

/* Keeps req as the template of c's document (root) when it can be one;
 * without memory it is simply not kept. */
void kserve_keep_template(doc_cache *c, const json_t *root, const tp_kserve_model *m,
                          const bin_tail *tail, const tp_kserve_request *req)
{
    if (!c || c->root != root || !c->whole || c->tmpl || !templatable(req, tail))
        return;
    sig_sink sig = {0};
    model_signature(m, &sig);
    req_template *t = calloc(1, sizeof *t);
    if (!t || !(t->off = malloc((size_t)(req->n_inputs ? req->n_inputs : 1) * sizeof *t->off)) ||
        !(t->sig = malloc(sig.len)) || copy_request(req, &t->req) != TP_OK) {
        template_free(t);
        return;
    }
    sig = (sig_sink){.buf = t->sig};
    model_signature(m, &sig);
    t->sig_len = sig.len;
    for (int k = 0; k < req->n_inputs; k++) {
        t->off[k] = (size_t)((const unsigned char *)req->inputs[k].data - tail->p);
        t->req.inputs[k].data = NULL;
    }
    t->tail_len = tail->len;
    t->m = m;
    c->tmpl = t;
}

/* req made from c's template (c's document is the request's header, byte
 * for byte) when it fits this body and model: 1, or -1 without memory; 0:
 * parse the document instead. */
int kserve_request_from_template(const doc_cache *c, const tp_kserve_model *m,
                                 const bin_tail *tail, tp_kserve_request *req)
{
    const req_template *t = c->tmpl;
    if (!t || !tail->present || tail->len != t->tail_len || t->m != m)
        return 0;
    sig_sink sig = {.cmp = t->sig, .cap = t->sig_len};
    model_signature(m, &sig);
    if (sig.differs || sig.len != t->sig_len)
        return 0;
    if (copy_request(&t->req, req) != TP_OK)
        return -1;
    for (int k = 0; k < req->n_inputs; k++)
        req->inputs[k].data = (void *)(tail->p + t->off[k]);
    return 1;
}
