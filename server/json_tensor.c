/* json_tensor.c — finding a request's JSON data arrays (spans) without
 * building them, and handing jansson the text outside them (json_tensor.h;
 * reading the arrays: json_tensor_read.c; writing: json_tensor_write.c). */
#include "json_tensor.h"

#include <stdlib.h>
#include <string.h>

#include "grow.h"
#include "json_scan.h"

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
