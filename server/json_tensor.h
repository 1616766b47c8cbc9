/* json_tensor.h — KServe tensor "data" arrays as JSON text, without a
 * jansson node per element; jansson still parses the rest of each document.
 *
 * Reading: tp_json_data_spans finds where each request input's "data"
 * array lies in the body, so the document can be handed to jansson with
 * those arrays left empty (tp_json_load_outside_spans: errors still say
 * where they are in the body) and each array decoded straight into its tensor
 * once the input's datatype and shape are known (tp_json_tensor_read).
 * Memory is then the body plus the tensors, whatever the element count.
 *
 * Writing: tp_jbuf, a growable text buffer with JSON strings, integers and
 * tensor data arrays (numbers via numtext.h). */
#ifndef TP_JSON_TENSOR_H
#define TP_JSON_TENSOR_H

#include <jansson.h>
#include <stddef.h>
#include <string.h>

#include "engine.h"
#include "status.h"

/* Where inputs[input]'s "data" array sits in a body: [start, end), from its
 * '[' through its ']'. */
typedef struct {
    int input;
    size_t start, end;
} tp_json_span;

/* What of a request body jansson need not see: the data arrays of its
 * top-level "inputs" (in body order, input = the input's index), and every
 * member no route reads (input -1: an unknown member's container or string,
 * which reads as an empty one, after its syntax is checked here), so a body
 * of nested values in a member nobody reads costs no jansson nodes.
 * *values counts the values and members left to jansson; the scan stops
 * once it passes max_values (0: no limit), and the caller refuses the
 * request. A body the scan cannot follow (not JSON, keys spelled with
 * escapes) simply yields fewer spans: what it does not blank, jansson
 * parses and judges (within json_cap.h's allowance). An array the scan
 * entered but could not close ends where the scan gave up (the document is
 * malformed; blanking that much keeps jansson from building a node per
 * element before it says so). *spans is malloc'ed (free it), NULL when
 * there are none. Returns 0, or -1 without memory. */
int tp_json_data_spans(const char *body, size_t len, size_t max_values, tp_json_span **spans, int *n_spans,
                       size_t *values);

/* json_loadb on body without the inside of every span (each array reads as
 * empty), fed to jansson piecewise so the body is never copied. jerr's
 * position is the body's (with JSON_DISABLE_EOF_CHECK, where the document
 * ended), and so are its line and column when the load fails. */
json_t *tp_json_load_outside_spans(const char *body, size_t len, const tp_json_span *spans,
                                   int n_spans, size_t flags, json_error_t *jerr);

/* The text tp_json_load_outside_spans hands jansson (body without the
 * inside of every span) into out[0..cap): its length, which is more than
 * cap when it did not fit (out then holds its first cap bytes). */
size_t tp_json_outside_spans(const char *body, size_t len, const tp_json_span *spans, int n_spans,
                             char *out, size_t cap);

/* tp_json_load_outside_spans on that text when the caller already built
 * it (outside[0..outside_len), all of it): the same document and the same
 * body positions in jerr, without walking the body a second time. */
json_t *tp_json_load_outside_text(const char *body, const tp_json_span *spans, int n_spans,
                                  const char *outside, size_t outside_len, size_t flags,
                                  json_error_t *jerr);

/* Decodes the array text s[0..len) (a span, or a dumped jansson array) into
 * t->data (malloc'ed, t->nbytes set) for t's dtype and shape: flat, or
 * nested exactly like the shape. Errors name t->name and the element:
 * TP_INVALID, TP_PARSE (not JSON) or TP_NOMEM. */
tp_status tp_json_tensor_read(const char *s, size_t len, tp_host_tensor *t, tp_err *err);

/* The bytes tp_json_tensor_read allocates for t from text of len bytes,
 * before it does (a memory budget takes them first). */
size_t tp_json_tensor_read_bytes(const tp_host_tensor *t, size_t len);

/* A growable text buffer. Appends after an allocation failure are dropped
 * and remembered in oom; the caller checks once at the end. p is malloc'ed
 * unless pooled (see tp_jbuf_start_pooled): release it with
 * tp_jbuf_free_text. */
typedef struct {
    char *p;
    size_t len, cap;
    int oom;
    int pooled; /* p is a buf_pool.h buffer (TP_BUF_POOL_SIZE bytes) */
} tp_jbuf;

/* Starts an empty b in a buffer of this thread's pool (buf_pool.h): for
 * texts made per request (answers). Past the pool's size the text moves
 * to a malloc'ed buffer and pooled is cleared. */
void tp_jbuf_start_pooled(tp_jbuf *b);

/* Frees a tp_jbuf's text p, which was pooled or not. */
void tp_jbuf_free_text(char *p, int pooled);

/* tp_jbuf_grow when the buffer has to grow first (or has failed). */
char *tp_jbuf_grow_slow(tp_jbuf *b, size_t n);

/* Reserves n more bytes and returns where they start (NULL: no memory).
 * Inline, with tp_jbuf_raw and tp_jbuf_lit: an answer's header is some
 * sixty appends, mostly literals whose lengths then fold to constants. */
static inline char *tp_jbuf_grow(tp_jbuf *b, size_t n)
{
    if (b->cap - b->len < n || b->oom)
        return tp_jbuf_grow_slow(b, n);
    char *at_end = b->p + b->len;
    b->len += n;
    return at_end;
}

static inline void tp_jbuf_raw(tp_jbuf *b, const char *s, size_t n)
{
    char *p = tp_jbuf_grow(b, n);
    if (p)
        memcpy(p, s, n);
}

/* NUL-terminated, no escaping */
static inline void tp_jbuf_lit(tp_jbuf *b, const char *s)
{
    tp_jbuf_raw(b, s, strlen(s));
}

void tp_jbuf_str(tp_jbuf *b, const char *s); /* as a quoted, escaped JSON string */
void tp_jbuf_strn(tp_jbuf *b, const char *s, size_t n); /* the same, of n bytes (NULs escaped) */
void tp_jbuf_i64(tp_jbuf *b, int64_t v);

/* t's elements as a flat JSON array. NaN and Inf have no JSON spelling:
 * TP_INTERNAL naming the element (ask for the output as binary). */
tp_status tp_json_tensor_write(tp_jbuf *b, const tp_host_tensor *t, tp_err *err);

#endif
