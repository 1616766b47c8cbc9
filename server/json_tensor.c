#include "json_tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buf_pool.h"
#include "grow.h"
#include "numtext.h"
#include "tensor.h"

/* ---- scanning ----------------------------------------------------------- */

typedef struct {
    const char *s;
    size_t len, i;
} cursor;

static int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether ch ends a number or literal: blank or structural. A table, since
 * this runs once per character of every data array (strchr per character
 * was a tenth of a JSON request's decoding). */
static int ends_token(char ch)
{
    static const unsigned char ends[256] = {
        [' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [','] = 1, [':'] = 1,
        ['['] = 1, [']'] = 1, ['{'] = 1, ['}'] = 1, ['"'] = 1,
    };
    return ends[(unsigned char)ch];
}

static void skip_blanks(cursor *c)
{
    while (c->i < c->len && is_blank(c->s[c->i]))
        c->i++;
}

static int at(const cursor *c, char ch)
{
    return c->i < c->len && c->s[c->i] == ch;
}

/* At an array's or object's opener: 0 when it closes at once (consumed),
 * 2 when an element follows. */
static int open_list(cursor *c, char closer)
{
    c->i++;
    skip_blanks(c);
    if (at(c, closer))
        return c->i++, 0;
    return 2;
}

/* After an element or member: 0 at the closer (consumed), 2 after a ','
 * (another follows), 1 at anything else (not JSON). */
static int after_item(cursor *c, char closer)
{
    skip_blanks(c);
    if (at(c, closer))
        return c->i++, 0;
    if (!at(c, ','))
        return 1;
    c->i++;
    skip_blanks(c);
    return 2;
}

/* At '"': past the closing quote, or -1. Escapes are stepped over, not
 * checked: jansson (or the tensor reader) judges the text. */
static int skip_string(cursor *c)
{
    for (c->i++; c->i < c->len; c->i++) {
        if (c->s[c->i] == '\\')
            c->i++;
        else if (c->s[c->i] == '"')
            return c->i++, 0;
    }
    c->i = c->len; /* a backslash as the last byte stepped past the end: spans end at len */
    return -1;
}

/* Skips one value of any kind, brackets matched; -1 at what cannot be JSON
 * (c->i then says where). Deeper nesting than a tensor can have is refused
 * rather than tracked. */
static int skip_value(cursor *c)
{
    char closers[2 * TP_MAX_DIMS + 8];
    int depth = 0;
    do {
        skip_blanks(c);
        if (c->i >= c->len)
            return -1;
        char ch = c->s[c->i];
        if (ch == '"') {
            if (skip_string(c) != 0)
                return -1;
        } else if (ch == '[' || ch == '{') {
            if (depth == (int)sizeof closers)
                return -1;
            closers[depth++] = ch == '[' ? ']' : '}';
            c->i++;
        } else if (ch == ']' || ch == '}') {
            if (!depth || closers[depth - 1] != ch)
                return -1;
            depth--;
            c->i++;
        } else if (ch == ',' || ch == ':') {
            if (!depth)
                return -1;
            c->i++;
        } else {
            size_t from = c->i;
            while (c->i < c->len && !ends_token(c->s[c->i]))
                c->i++;
            if (c->i == from)
                return -1;
        }
    } while (depth > 0);
    return 0;
}

typedef struct {
    tp_json_span *v;
    int n, cap;
    size_t values, max_values; /* values left to jansson; 0: no limit */
} span_list;

static int add_span(span_list *l, int input, size_t start, size_t end)
{
    if (TP_GROW(l->v, l->cap, l->n, 4) != 0)
        return -1;
    l->v[l->n++] = (tp_json_span){input, start, end};
    return 0;
}

/* ---- checking what is skipped ----------------------------------------- *
 *
 * A member no route reads is left out of what jansson sees, so it must be
 * judged here: a document jansson would refuse for its syntax is refused
 * whatever member the fault is in. These follow RFC 8259's grammar; they do
 * not check UTF-8 or a number's range (jansson's checks that no route
 * needs for a value it never reads). */

/* jansson's own limit (JSON_PARSER_MAX_DEPTH): a deeper document fails there anyway */
#define CHECKED_DEPTH_MAX 2048

/* At '"': past a well-formed string, or -1. */
static int check_string(cursor *c)
{
    for (c->i++; c->i < c->len; c->i++) {
        unsigned char ch = (unsigned char)c->s[c->i];
        if (ch == '"')
            return c->i++, 0;
        if (ch < 0x20)
            return -1;
        if (ch != '\\')
            continue;
        if (++c->i >= c->len || !strchr("\"\\/bfnrtu", c->s[c->i]) || !c->s[c->i])
            return -1;
        if (c->s[c->i] == 'u') {
            for (int k = 0; k < 4; k++)
                if (++c->i >= c->len || !strchr("0123456789abcdefABCDEF", c->s[c->i]) || !c->s[c->i])
                    return -1;
        }
    }
    return -1;
}

static size_t digits(cursor *c)
{
    size_t from = c->i;
    while (c->i < c->len && c->s[c->i] >= '0' && c->s[c->i] <= '9')
        c->i++;
    return c->i - from;
}

/* A number, true, false or null, ending at a blank, structural character
 * or the end; -1 otherwise. */
static int check_scalar(cursor *c)
{
    static const char *const literals[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(literals[k]);
        if (c->len - c->i >= n && memcmp(c->s + c->i, literals[k], n) == 0) {
            c->i += n;
            return c->i < c->len && !ends_token(c->s[c->i]) ? -1 : 0;
        }
    }
    if (at(c, '-'))
        c->i++;
    size_t lead = c->i;
    size_t n = digits(c);
    if (n == 0 || (n > 1 && c->s[lead] == '0'))
        return -1;
    if (at(c, '.') && (c->i++, digits(c) == 0))
        return -1;
    if (at(c, 'e') || at(c, 'E')) {
        c->i++;
        if (at(c, '+') || at(c, '-'))
            c->i++;
        if (digits(c) == 0)
            return -1;
    }
    return c->i < c->len && !ends_token(c->s[c->i]) ? -1 : 0;
}

/* At a member's key: past the key and its ':' (counted as one value), or -1. */
static int check_key(cursor *c, size_t *values)
{
    skip_blanks(c);
    if (!at(c, '"') || check_string(c) != 0)
        return -1;
    skip_blanks(c);
    if (!at(c, ':'))
        return -1;
    c->i++;
    if (values)
        ++*values;
    return 0;
}

/* One value, whole and well-formed, without recursion (a bit per open
 * container: 1 for an object); each value and member counted into
 * *values when it is not NULL. 0, or -1 at what is not JSON. */
static int skip_checked(cursor *c, size_t *values)
{
    unsigned char is_object[CHECKED_DEPTH_MAX / 8];
    int depth = 0;
    for (;;) {
        skip_blanks(c); /* a value is next */
        if (c->i >= c->len)
            return -1;
        char ch = c->s[c->i];
        if (values)
            ++*values;
        if (ch == '[' || ch == '{') {
            if (depth == CHECKED_DEPTH_MAX)
                return -1;
            is_object[depth / 8] = (unsigned char)((is_object[depth / 8] & ~(1u << depth % 8)) |
                                                   (unsigned)(ch == '{') << depth % 8);
            depth++;
            c->i++;
            skip_blanks(c);
            if (!at(c, ch == '{' ? '}' : ']')) {
                if (ch == '{' && check_key(c, values) != 0)
                    return -1;
                continue;
            }
            c->i++;
            depth--;
        } else if (ch == '"' ? check_string(c) != 0 : check_scalar(c) != 0) {
            return -1;
        }
        for (;;) { /* after a value: close what it ends, or find the next */
            if (depth == 0)
                return 0;
            int object = is_object[(depth - 1) / 8] >> (depth - 1) % 8 & 1;
            skip_blanks(c);
            if (at(c, object ? '}' : ']')) {
                c->i++;
                depth--;
                continue;
            }
            if (!at(c, ','))
                return -1;
            c->i++;
            if (object && check_key(c, values) != 0)
                return -1;
            break;
        }
    }
}

/* ---- the members a request is read for ---------------------------------- */

typedef enum { M_KEEP, M_SKIP, M_DATA, M_INPUTS, M_OUTPUTS } member_kind;

typedef struct {
    const char *key;
    member_kind kind;
} member_rule;

/* What each route reads of an infer request (kserve.c); anything else is
 * skipped. NULL ends a list. */
static const member_rule ROOT_RULES[] = {
    {"id", M_KEEP}, {"parameters", M_KEEP}, {"inputs", M_INPUTS}, {"outputs", M_OUTPUTS}, {NULL, M_SKIP}};
static const member_rule INPUT_RULES[] = {{"name", M_KEEP},       {"datatype", M_KEEP}, {"shape", M_KEEP},
                                          {"parameters", M_KEEP}, {"data", M_DATA},     {NULL, M_SKIP}};
static const member_rule OUTPUT_RULES[] = {{"name", M_KEEP}, {"parameters", M_KEEP}, {NULL, M_SKIP}};

/* At '"': reads a key and says what it is by rules, or -1 when it is not a
 * string. A key spelled with escapes is kept: jansson reads it as it means. */
static int key_kind(cursor *c, const member_rule *rules)
{
    size_t from = c->i + 1;
    if (!at(c, '"') || skip_string(c) != 0)
        return -1;
    size_t n = c->i - from - 1;
    if (memchr(c->s + from, '\\', n))
        return M_KEEP;
    for (const member_rule *r = rules; r->key; r++)
        if (strlen(r->key) == n && memcmp(c->s + from, r->key, n) == 0)
            return r->kind;
    return M_SKIP;
}

static int over_limit(const span_list *l) { return l->max_values && l->values > l->max_values; }

/* A value jansson reads: counted (and checked: a fault ends the scan, and
 * jansson reports it). */
static int keep_value(cursor *c, span_list *l) { return skip_checked(c, &l->values) ? 1 : 0; }

/* A member no route reads: left out, after its syntax is checked. A
 * container or string becomes an empty one; a number or literal is only
 * counted (it is one small node). */
static int skip_member(cursor *c, span_list *l)
{
    if (c->i >= c->len) /* the text ends after the key's ':' */
        return 1;
    size_t start = c->i;
    char ch = c->s[c->i];
    if (skip_checked(c, NULL) != 0)
        return 1;
    if (ch == '[' || ch == '{' || ch == '"')
        return add_span(l, -1, start, c->i);
    l->values++;
    return 0;
}

/* At '[': past the array when it is flat (no '[', '{', '}' or '"' before
 * its first ']'), found with memchr's vector loops rather than byte by
 * byte: for the usual data array, where skip_value would end too (all it
 * could fault in such a run is a '}', excluded). 0 when it does not apply. */
static int skip_flat_array(cursor *c)
{
    const char *from = c->s + c->i + 1, *close = memchr(from, ']', c->len - c->i - 1);
    if (!close)
        return 0;
    size_t n = (size_t)(close - from);
    if (memchr(from, '[', n) || memchr(from, '{', n) || memchr(from, '}', n) || memchr(from, '"', n))
        return 0;
    c->i = (size_t)(close - c->s) + 1;
    return 1;
}

static int take_data(cursor *c, span_list *l, int input)
{
    size_t start = c->i;
    int bad = skip_flat_array(c) ? 0 : skip_value(c);
    if (add_span(l, input, start, c->i) != 0)
        return -1;
    return bad ? 1 : 0;
}

static int walk_members(cursor *c, const member_rule *rules, span_list *l, int input);

/* inputs or outputs: [ {...}, ... ]; inputs' entries are numbered (their
 * data spans say which), outputs' are not (-1). */
static int take_list(cursor *c, span_list *l, const member_rule *rules, int numbered)
{
    l->values++;
    int more = open_list(c, ']');
    for (int k = 0; more == 2; k++) {
        int rc = at(c, '{') ? walk_members(c, rules, l, numbered ? k : -1) : keep_value(c, l);
        if (rc)
            return rc;
        more = after_item(c, ']');
    }
    return more;
}

static int member_value(cursor *c, member_kind kind, span_list *l, int input)
{
    int list = at(c, '[');
    switch (kind) {
    case M_DATA: return list && input >= 0 ? take_data(c, l, input) : keep_value(c, l);
    case M_INPUTS: return list ? take_list(c, l, INPUT_RULES, 1) : keep_value(c, l);
    case M_OUTPUTS: return list ? take_list(c, l, OUTPUT_RULES, 0) : keep_value(c, l);
    case M_SKIP: return skip_member(c, l);
    case M_KEEP: break;
    }
    return keep_value(c, l);
}

/* The object at c (at '{'), member by member as rules say. Returns 0 at
 * the closing '}', 1 when the text cannot be followed, 2 past the value
 * limit, -1 without memory. */
static int walk_members(cursor *c, const member_rule *rules, span_list *l, int input)
{
    l->values++;
    int more = open_list(c, '}');
    while (more == 2) {
        int kind = key_kind(c, rules);
        skip_blanks(c);
        if (kind < 0 || !at(c, ':'))
            return 1;
        c->i++;
        skip_blanks(c);
        l->values++;
        int rc = member_value(c, (member_kind)kind, l, input);
        if (rc)
            return rc;
        if (over_limit(l))
            return 2;
        more = after_item(c, '}');
    }
    return more;
}

int tp_json_data_spans(const char *body, size_t len, size_t max_values, tp_json_span **spans, int *n_spans,
                       size_t *values)
{
    cursor c = {body, len, 0};
    span_list l = {.max_values = max_values};
    skip_blanks(&c);
    int rc = at(&c, '{') ? walk_members(&c, ROOT_RULES, &l, -1) : 0;
    if (rc < 0) {
        free(l.v);
        l.v = NULL;
        l.n = 0;
    }
    *spans = l.v;
    *n_spans = l.n;
    *values = l.values;
    return rc < 0 ? -1 : 0;
}

/* ---- jansson outside the spans ------------------------------------------ */

typedef struct {
    const char *s;
    size_t len, off;
    const tp_json_span *spans;
    int n, k;
} feed;

/* What of span k jansson never sees: inside the brackets or quotes, or up
 * to where an open array was given up. */
static void skipped_range(const char *s, const tp_json_span *sp, size_t *from, size_t *to)
{
    char closer = s[sp->start] == '{' ? '}' : s[sp->start] == '"' ? '"' : ']';
    *from = sp->start + 1;
    *to = sp->end > *from && s[sp->end - 1] == closer ? sp->end - 1 : sp->end;
    if (*to < *from)
        *to = *from;
}

/* The body without the spans' insides, piecewise: jansson's lexer costs
 * about 5 ns a byte, and a data array is most of a JSON request's bytes. */
static size_t feed_outside(void *buf, size_t size, void *data)
{
    feed *f = data;
    char *out = buf;
    size_t w = 0;
    while (w < size && f->off < f->len) {
        size_t from = f->len, to = f->len;
        while (f->k < f->n) {
            skipped_range(f->s, &f->spans[f->k], &from, &to);
            if (to > f->off)
                break;
            f->k++;
            from = to = f->len;
        }
        if (f->off >= from) {
            f->off = to;
            continue;
        }
        size_t n = from - f->off < size - w ? from - f->off : size - w;
        memcpy(out + w, f->s + f->off, n);
        w += n;
        f->off += n;
    }
    return w;
}

size_t tp_json_outside_spans(const char *body, size_t len, const tp_json_span *spans, int n_spans,
                             char *out, size_t cap)
{
    feed f = {body, len, 0, spans, n_spans, 0};
    size_t n = feed_outside(out, cap, &f);
    return f.off < len ? n + 1 : n; /* more to come: it did not fit */
}

/* jansson counted the bytes it was fed; the caller wants the body's. A
 * position just past a span's '[' has not read into the span, one further
 * has read past all of it. */
static size_t position_in_body(const char *body, const tp_json_span *spans, int n_spans, size_t pos)
{
    size_t skipped = 0;
    for (int k = 0; k < n_spans; k++) {
        size_t from, to;
        skipped_range(body, &spans[k], &from, &to);
        if (pos + skipped <= from)
            break;
        skipped += to - from;
    }
    return pos + skipped;
}

/* The line and column of an error at jerr->position (the body's), counted
 * as jansson counts them: lines from 1, UTF-8 characters from 1. */
static void locate_error(const char *body, json_error_t *jerr)
{
    int line = 1, column = 0;
    for (int i = 0; i < jerr->position; i++) {
        if (body[i] == '\n')
            line++, column = 0;
        else if (((unsigned char)body[i] & 0xc0) != 0x80)
            column++;
    }
    jerr->line = line;
    jerr->column = column;
}

/* jerr as jansson filled it for the outside text, moved to the body. */
static void report_in_body(const char *body, const tp_json_span *spans, int n_spans,
                           const json_t *root, json_error_t *jerr)
{
    jerr->position = (int)position_in_body(body, spans, n_spans, (size_t)jerr->position);
    if (!root && jerr->line >= 0) /* -1: no place (out of memory, bad arguments) */
        locate_error(body, jerr);
}

json_t *tp_json_load_outside_spans(const char *body, size_t len, const tp_json_span *spans,
                                   int n_spans, size_t flags, json_error_t *jerr)
{
    if (n_spans == 0)
        return json_loadb(body, len, flags, jerr);
    feed f = {body, len, 0, spans, n_spans, 0};
    json_t *root = json_load_callback(feed_outside, &f, flags, jerr);
    report_in_body(body, spans, n_spans, root, jerr);
    return root;
}

json_t *tp_json_load_outside_text(const char *body, const tp_json_span *spans, int n_spans,
                                  const char *outside, size_t outside_len, size_t flags,
                                  json_error_t *jerr)
{
    json_t *root = json_loadb(outside, outside_len, flags, jerr);
    report_in_body(body, spans, n_spans, root, jerr);
    return root;
}

/* ---- reading tensor data ------------------------------------------------ */

typedef struct {
    cursor c;
    tp_host_tensor *t;
    int64_t count, cap; /* leaves read; leaves t->data has room for */
    size_t idx[TP_MAX_DIMS];
    tp_err *err;
} reader;

static const char *shape_of(char *buf, const tp_host_tensor *t)
{
    return tp_shape_str(buf, 128, t->ndim, t->shape);
}

/* "data[1][0]" for the element path idx[0..depth). */
static const char *path_of(char *buf, size_t len, const size_t *idx, int depth)
{
    size_t off = (size_t)snprintf(buf, len, "data");
    for (int i = 0; i < depth && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "[%zu]", idx[i]);
    return buf;
}

static tp_status malformed(reader *r)
{
    return tp_fail(r->err, TP_PARSE, "input '%s': malformed JSON in 'data' at byte %zu of the "
                   "array", r->t->name, r->c.i);
}

/* What the value at the cursor is, in tp_json_kind's words; NULL when it
 * cannot start a JSON value. */
static const char *kind_here(const cursor *c)
{
    static const struct {
        const char *word, *kind;
    } lits[] = {{"true", "a boolean"}, {"false", "a boolean"}, {"null", "null"}};
    if (c->i >= c->len)
        return NULL;
    const char *p = c->s + c->i;
    int is_int;
    switch (*p) {
    case '"': return "a string";
    case '[': return "an array";
    case '{': return "an object";
    default: break;
    }
    for (size_t k = 0; k < sizeof lits / sizeof lits[0]; k++) {
        size_t n = strlen(lits[k].word);
        if (c->len - c->i >= n && memcmp(p, lits[k].word, n) == 0)
            return lits[k].kind;
    }
    if (tp_numtext_scan(p, c->len - c->i, &is_int))
        return is_int ? "an integer" : "a real number";
    return NULL;
}

/* f, read from the token tok[0..n), at flat position r->count (then the
 * next). */
static tp_status store_float(reader *r, float f, const char *tok, size_t n)
{
    tp_dtype dt = r->t->dtype;
    int overflow = !isfinite(f);
    if (dt == TP_F16)
        overflow = overflow || (tp_f32_to_f16(f) & 0x7fffu) == 0x7c00u;
    else if (dt == TP_BF16)
        overflow = overflow || (tp_f32_to_bf16(f) & 0x7fffu) == 0x7f80u;
    if (overflow)
        return tp_fail(r->err, TP_INVALID, "input '%s': data element %" PRId64 " (%g) is out of "
                       "%s range", r->t->name, r->count, tp_numtext_parse_f64(tok, n),
                       tp_dtype_name(dt));
    if (r->count < r->cap)
        tp_store_f32(r->t->data, dt, r->count, f);
    r->count++;
    return TP_OK;
}

static tp_status store_int(reader *r, const char *tok, size_t n)
{
    int64_t v;
    const char *name = tp_dtype_name(r->t->dtype);
    if (tp_numtext_parse_i64(tok, n, &v) != 0 ||
        (r->t->dtype == TP_I32 && (v < INT32_MIN || v > INT32_MAX)))
        return tp_fail(r->err, TP_INVALID, "input '%s': data element %" PRId64 " (%.*s) is out "
                       "of %s range", r->t->name, r->count, (int)n, tok, name);
    if (r->count < r->cap) {
        if (r->t->dtype == TP_I64)
            ((int64_t *)r->t->data)[r->count] = v;
        else
            ((int32_t *)r->t->data)[r->count] = (int32_t)v;
    }
    r->count++;
    return TP_OK;
}

/* One scalar leaf, stored at flat position r->count. */
static tp_status read_scalar(reader *r)
{
    const char *p = r->c.s + r->c.i;
    int is_int, is_float = tp_dtype_is_float(r->t->dtype);
    size_t n = tp_numtext_scan(p, r->c.len - r->c.i, &is_int);
    if (!n || (!is_int && !is_float)) {
        const char *kind = kind_here(&r->c);
        if (!kind)
            return malformed(r);
        return tp_fail(r->err, TP_INVALID, "input '%s': data element %" PRId64 " is %s, "
                       "expected %s for %s", r->t->name, r->count, kind,
                       is_float ? "a number" : "an integer", tp_dtype_name(r->t->dtype));
    }
    r->c.i += n;
    return is_float ? store_float(r, tp_numtext_parse_f32(p, n), p, n) : store_int(r, p, n);
}

/* ---- FP32 arrays in two passes ----
 *
 * Left to right, each number's conversion waits for the end of the one
 * before it (where the next one starts): ~16 ns per number here, mostly
 * that chain. A flat FP32 array of numbers is instead cut at its ',' and
 * its closing ']' found 16 bytes at a time, and each element between them
 * converted on its own, so the conversions overlap. Anything that is not
 * exactly such an array (nesting, strings, a stray comma, an element out of
 * range) is declined, and the general reader then reads the array from its
 * start and names the problem. */

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* Bit j set when s[at + j] (j < 16, at + j < len) is ',' or ']'. */
static unsigned cuts16(const char *s, size_t at, size_t len)
{
#ifdef __SSE2__
    if (at + 16 <= len) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(s + at));
        __m128i hit = _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8(',')), _mm_cmpeq_epi8(v, _mm_set1_epi8(']')));
        return (unsigned)_mm_movemask_epi8(hit);
    }
#endif
    unsigned m = 0;
    for (size_t j = 0; j < 16 && at + j < len; j++)
        m |= (unsigned)(s[at + j] == ',' || s[at + j] == ']') << j;
    return m;
}

/* The element s[a..b) (blanks around it allowed) as a finite FP32: 1 and
 * *f; -1 when there is nothing but blanks; 0 when it is not one. */
static int element_f32(const char *s, size_t a, size_t b, size_t len, float *f)
{
    while (a < b && is_blank(s[a]))
        a++;
    while (b > a && is_blank(s[b - 1]))
        b--;
    int is_int;
    if (a == b)
        return -1;
    /* without scanning the token first: the readers check the grammar. The
     * short reader first, and past a sign and 16 bytes the wide one: on
     * their own tokens each measured a few percent faster than
     * tp_numtext_read_f32, which takes them too. */
    int ahead = len - a >= TP_NUMTEXT_READ_AHEAD;
    if (ahead && tp_numtext_short_f32(s + a, b - a, f))
        return 1;
    if (ahead && b - a <= 17 ? tp_numtext_read_f32(s + a, b - a, f) : tp_numtext_wide_f32(s + a, b - a, f))
        return 1;
    if (tp_numtext_scan(s + a, b - a, &is_int) != b - a)
        return 0;
    *f = tp_numtext_parse_f32(s + a, b - a);
    return isfinite(*f);
}

/* At a '[': the whole array read as FP32 elements from flat position
 * r->count on, the cursor left past its ']'. 0 (nothing moved) when it is
 * not a plain array of numbers. */
static int read_f32_array(reader *r)
{
    const char *s = r->c.s;
    size_t len = r->c.len, from = r->c.i + 1;
    float *data = r->t->data;
    int64_t count = r->count;
    for (size_t at = from; at < len; at += 16) {
        for (unsigned cuts = cuts16(s, at, len); cuts; cuts &= cuts - 1) {
            size_t cut = at + (size_t)__builtin_ctz(cuts);
            float f;
            int got = element_f32(s, from, cut, len, &f);
            /* only "[]" (blanks inside allowed) has a cut with no element */
            if (got == 0 || (got < 0 && !(s[cut] == ']' && count == r->count)))
                return 0;
            if (got > 0 && count < r->cap)
                data[count] = f;
            count += got > 0;
            if (s[cut] == ']') {
                r->c.i = cut + 1;
                r->count = count;
                return 1;
            }
            from = cut + 1;
        }
    }
    return 0;
}

/* After an element: 1 when more follow, 0 past the array's end, -1 (and
 * *st) when the text is not JSON. */
static int next_or_end(reader *r, tp_status *st)
{
    int more = after_item(&r->c, ']');
    if (more == 1)
        *st = malformed(r);
    return more == 2 ? 1 : more == 0 ? 0 : -1;
}

/* Opens an array at the cursor: 1 when it has elements, 0 when empty. */
static int open_array(reader *r)
{
    return open_list(&r->c, ']') == 2;
}

static tp_status read_flat(reader *r)
{
    tp_status st = TP_OK;
    char sh[128];
    if (r->t->dtype == TP_F32 && read_f32_array(r))
        return TP_OK;
    int more = open_array(r);
    for (size_t k = 0; more > 0; k++) {
        if (at(&r->c, '[') || at(&r->c, '{'))
            return tp_fail(r->err, TP_INVALID, "input '%s': data[%zu] is %s; data must be flat "
                           "or nested exactly like shape %s", r->t->name, k, kind_here(&r->c),
                           shape_of(sh, r->t));
        if ((st = read_scalar(r)) != TP_OK)
            return st;
        more = next_or_end(r, &st);
    }
    return st;
}

/* Counts the rest of an array that already has `have` elements (its
 * extent for a "has N elements" message). */
static tp_status count_rest(reader *r, size_t *have)
{
    tp_status st = TP_OK;
    int more = 1;
    while (more > 0) {
        if (skip_value(&r->c) != 0)
            return malformed(r);
        ++*have;
        more = next_or_end(r, &st);
    }
    return st;
}

/* The number of elements of the array at `start`, or -1 if the text cannot
 * be followed that far. */
static int64_t count_array(const reader *r, size_t start)
{
    reader probe = *r;
    size_t n = 0;
    probe.c.i = start;
    if (open_array(&probe) > 0 && count_rest(&probe, &n) != TP_OK)
        return -1;
    return (int64_t)n;
}

static tp_status count_mismatch(reader *r, int dim, int64_t have)
{
    char path[160], sh[128];
    return tp_fail(r->err, TP_INVALID, "input '%s': %s has %" PRId64 " elements, shape %s needs "
                   "%" PRId64 " at dim %d", r->t->name, path_of(path, sizeof path, r->idx, dim),
                   have, shape_of(sh, r->t), r->t->shape[dim], dim);
}

/* Level dim of nested data: an array of shape[dim] entries; the last level
 * holds scalars. Read in one pass; only when something inside is wrong is
 * the array counted, so that a wrong count at an outer level is what the
 * client hears about (it usually explains the inner error). */
static tp_status read_nested(reader *r, int dim)
{
    char path[160], sh[128];
    tp_status st = TP_OK;
    size_t start = r->c.i, k = 0;
    int64_t before = r->count;
    if (dim + 1 == r->t->ndim && r->t->dtype == TP_F32 && read_f32_array(r)) {
        if (r->count - before == r->t->shape[dim])
            return TP_OK;
        r->c.i = start; /* a wrong count: the general reader names it */
        r->count = before;
    }
    int more = open_array(r);
    while (more > 0 && st == TP_OK) {
        if ((int64_t)k == r->t->shape[dim]) {
            if ((st = count_rest(r, &k)) == TP_OK)
                st = count_mismatch(r, dim, (int64_t)k);
            return st;
        }
        r->idx[dim] = k++;
        int leaf = dim + 1 == r->t->ndim, is_array = at(&r->c, '[');
        const char *kind = kind_here(&r->c);
        if (!kind)
            st = malformed(r);
        else if (!leaf && !is_array)
            st = tp_fail(r->err, TP_INVALID, "input '%s': %s is %s, expected an array of "
                         "%" PRId64 " (shape %s)", r->t->name,
                         path_of(path, sizeof path, r->idx, dim + 1), kind,
                         r->t->shape[dim + 1], shape_of(sh, r->t));
        else if (leaf && (is_array || at(&r->c, '{')))
            st = tp_fail(r->err, TP_INVALID, "input '%s': %s is %s, but shape %s has only %d "
                         "dims", r->t->name, path_of(path, sizeof path, r->idx, dim + 1), kind,
                         shape_of(sh, r->t), r->t->ndim);
        else
            st = leaf ? read_scalar(r) : read_nested(r, dim + 1);
        if (st == TP_OK)
            more = next_or_end(r, &st);
    }
    if (st == TP_OK && (int64_t)k != r->t->shape[dim])
        return count_mismatch(r, dim, (int64_t)k);
    if (st == TP_INVALID) {
        int64_t n = count_array(r, start);
        if (n >= 0 && n != r->t->shape[dim])
            st = count_mismatch(r, dim, n);
    }
    return st;
}

static int64_t numel_of_tensor(const tp_host_tensor *t)
{
    int64_t numel = 1;
    for (int i = 0; i < t->ndim; i++)
        numel *= t->shape[i];
    return numel;
}

/* Every element takes at least two bytes of text ("1,"), so the text
 * bounds what can be stored: a shape that claims more than the body
 * carries fails on the count, after at most ~2 bytes per byte of body. */
static int64_t elements_room(const tp_host_tensor *t, size_t len)
{
    int64_t numel = numel_of_tensor(t);
    return numel < (int64_t)(len / 2 + 1) ? numel : (int64_t)(len / 2 + 1);
}

size_t tp_json_tensor_read_bytes(const tp_host_tensor *t, size_t len)
{
    return (size_t)elements_room(t, len) * tp_dtype_size(t->dtype);
}

tp_status tp_json_tensor_read(const char *s, size_t len, tp_host_tensor *t, tp_err *err)
{
    reader r = {.c = {s, len, 0}, .t = t, .err = err};
    int64_t numel = numel_of_tensor(t);
    skip_blanks(&r.c);
    if (!at(&r.c, '['))
        return malformed(&r);
    r.cap = elements_room(t, len);
    size_t esize = tp_dtype_size(t->dtype);
    if (!(t->data = malloc((size_t)r.cap * esize)))
        return tp_fail(err, TP_NOMEM, "input '%s': out of memory for %zu bytes", t->name,
                       (size_t)r.cap * esize);
    t->nbytes = (size_t)numel * esize;
    cursor peek = r.c;
    peek.i++;
    skip_blanks(&peek);
    int nested = t->ndim > 0 && at(&peek, '[');
    tp_status st = nested ? read_nested(&r, 0) : read_flat(&r);
    skip_blanks(&r.c);
    if (st == TP_OK && r.c.i != len)
        st = malformed(&r);
    if (st == TP_OK && !nested && r.count != numel) {
        char sh[128];
        st = tp_fail(err, TP_INVALID, "input '%s': data has %" PRId64 " elements, shape %s "
                     "needs %" PRId64, t->name, r.count, shape_of(sh, t), numel);
    }
    if (st != TP_OK) {
        free(t->data);
        t->data = NULL;
        t->nbytes = 0;
    }
    return st;
}

/* ---- writing ------------------------------------------------------------ */

void tp_jbuf_start_pooled(tp_jbuf *b)
{
    *b = (tp_jbuf){0};
    b->p = tp_buf_pool_take();
    b->cap = b->p ? TP_BUF_POOL_SIZE : 0;
    b->pooled = b->p != NULL;
}

void tp_jbuf_free_text(char *p, int pooled)
{
    if (pooled)
        tp_buf_pool_give(p);
    else
        free(p);
}

/* A pooled buffer is not realloc'ed: the pool's buffers keep their size. */
static char *resize(tp_jbuf *b, size_t cap)
{
    if (!b->pooled)
        return realloc(b->p, cap);
    char *p = malloc(cap);
    if (p) {
        memcpy(p, b->p, b->len);
        tp_buf_pool_give(b->p);
        b->pooled = 0;
    }
    return p;
}

char *tp_jbuf_grow_slow(tp_jbuf *b, size_t n)
{
    if (b->oom)
        return NULL;
    if (b->cap - b->len < n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->len < n)
            cap *= 2;
        char *p = resize(b, cap);
        if (!p) {
            b->oom = 1;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    char *at_end = b->p + b->len;
    b->len += n;
    return at_end;
}

void tp_jbuf_strn(tp_jbuf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    const char *end = s + n;
    tp_jbuf_raw(b, "\"", 1);
    for (const char *run = s;; s++) {
        unsigned char ch = s < end ? (unsigned char)*s : 0;
        if (s < end && ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        tp_jbuf_raw(b, run, (size_t)(s - run));
        run = s + 1;
        if (s == end)
            break;
        char esc[6] = {'\\', (char)ch, 0};
        size_t k = 2;
        if (ch < 0x20) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[ch >> 4];
            esc[5] = hex[ch & 15];
            k = 6;
        }
        tp_jbuf_raw(b, esc, k);
    }
    tp_jbuf_raw(b, "\"", 1);
}

void tp_jbuf_str(tp_jbuf *b, const char *s) { tp_jbuf_strn(b, s, strlen(s)); }

void tp_jbuf_i64(tp_jbuf *b, int64_t v)
{
    char *p = tp_jbuf_grow(b, TP_NUMTEXT_MAX);
    if (p)
        b->len -= TP_NUMTEXT_MAX - tp_numtext_i64(v, p);
}

/* Element i, whatever its type; copied with memcpy because t may be a
 * view into a request body, unaligned for its type (kserve.h). */
typedef union {
    float f32;
    uint16_t half;
    int32_t i32;
    int64_t i64;
} element;

static element load_element(const char *base, size_t es, int64_t i)
{
    element v = {0};
    /* a constant size per case: one load, not a memcpy call per element */
    switch (es) {
    case 2: memcpy(&v.half, base + (size_t)i * 2, 2); break;
    case 4: memcpy(&v.i32, base + (size_t)i * 4, 4); break;
    case 8: memcpy(&v.i64, base + (size_t)i * 8, 8); break;
    default: break;
    }
    return v;
}

/* One element's text at p (room for TP_NUMTEXT_MAX); 0 when it has none. */
static size_t element_text(const tp_host_tensor *t, element v, char *p)
{
    switch (t->dtype) {
    case TP_F32: return isfinite(v.f32) ? tp_numtext_f32(v.f32, p) : 0;
    case TP_F16: return (v.half & 0x7c00u) != 0x7c00u ? tp_numtext_f16(v.half, p) : 0;
    case TP_BF16: return (v.half & 0x7f80u) != 0x7f80u ? tp_numtext_bf16(v.half, p) : 0;
    case TP_I32: return tp_numtext_i64(v.i32, p);
    case TP_I64: return tp_numtext_i64(v.i64, p);
    case TP_DTYPE_COUNT: break;
    }
    return 0;
}

/* Elements [from, to) of t as text separated by ',' at p, which has room
 * for (to - from) * (TP_NUMTEXT_MAX + 1) bytes: its length. Stops before
 * an element JSON cannot carry (NaN, Inf); *done is where it stopped. */
static size_t elements_text(const tp_host_tensor *t, int64_t from, int64_t to, char *p, int64_t *done)
{
    if (t->dtype == TP_F32) { /* FP32 in blocks: numtext.c's list is faster than one at a time */
        size_t written;
        size_t len = tp_numtext_f32_list((const char *)t->data + (size_t)from * 4, (size_t)(to - from), p, &written);
        *done = from + (int64_t)written;
        return len;
    }
    size_t es = tp_dtype_size(t->dtype);
    char *start = p;
    for (int64_t i = from; i < to; i++) {
        size_t comma = i > from;
        p[0] = ',';
        size_t len = element_text(t, load_element(t->data, es, i), p + comma);
        if (!len) {
            *done = i;
            return (size_t)(p - start);
        }
        p += comma + len;
    }
    *done = to;
    return (size_t)(p - start);
}

tp_status tp_json_tensor_write(tp_jbuf *b, const tp_host_tensor *t, tp_err *err)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    tp_jbuf_raw(b, "[", 1);
    /* Room for a chunk of elements at once, and the cursor in a local:
     * grown per element, the buffer's length lived in memory that each
     * text's stores might alias, so every element reloaded it after the
     * last one's stores. Unused room is given back after each chunk. A
     * chunk takes what the buffer already holds room for (at least
     * MIN_CHUNK elements): room for the worst case of all 256 numbers of
     * a row (8.4 KB) outgrew the pooled 8 KB buffer that their real text
     * (2.8 KB) fits, and sent every JSON answer to a fresh 16 KB malloc. */
    enum { CHUNK = 4096, MIN_CHUNK = 64 };
    for (int64_t i = 0; i < n && !b->oom;) {
        size_t comma = i > 0, per = TP_NUMTEXT_MAX + 1, free_room = b->cap - b->len;
        int64_t fits = free_room > comma ? (int64_t)((free_room - comma) / per) : 0;
        int64_t take = fits < MIN_CHUNK ? MIN_CHUNK : fits > CHUNK ? CHUNK : fits;
        int64_t end = n - i < take ? n : i + take, done;
        size_t room = comma + (size_t)(end - i) * per;
        char *p = tp_jbuf_grow(b, room);
        if (!p)
            break;
        p[0] = ',';
        size_t len = comma + elements_text(t, i, end, p + comma, &done);
        b->len -= room - len;
        if (done < end) {
            element v = load_element(t->data, tp_dtype_size(t->dtype), done);
            float f = tp_load_f32(&v, t->dtype, 0);
            return tp_fail(err, TP_INTERNAL, "output '%s': element %" PRId64 " is %s, which "
                           "JSON cannot carry; request this output with "
                           "parameters.binary_data=true", t->name, done, isnan(f) ? "NaN" : "Inf");
        }
        i = end;
    }
    tp_jbuf_raw(b, "]", 1);
    if (b->oom)
        return tp_fail(err, TP_NOMEM, "output '%s': out of memory encoding JSON", t->name);
    return TP_OK;
}
