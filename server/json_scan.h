/* json_scan.h — the cursor the JSON tensor code walks text with
 * (json_tensor.c finds the data arrays, json_tensor_read.c reads them):
 * blanks, tokens, lists, strings, values skipped. Private to those files;
 * inline, as it was when they were one file: it runs once per character of
 * every data array. */
#ifndef TP_JSON_SCAN_H
#define TP_JSON_SCAN_H

#include <stddef.h>

#include "tensor.h"

typedef struct {
    const char *s;
    size_t len, i;
} cursor;

static inline int is_blank(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether ch ends a number or literal: blank or structural. A table, since
 * this runs once per character of every data array (strchr per character
 * was a tenth of a JSON request's decoding). */
static inline int ends_token(char ch)
{
    static const unsigned char ends[256] = {
        [' '] = 1, ['\t'] = 1, ['\n'] = 1, ['\r'] = 1, [','] = 1, [':'] = 1,
        ['['] = 1, [']'] = 1, ['{'] = 1, ['}'] = 1, ['"'] = 1,
    };
    return ends[(unsigned char)ch];
}

static inline void skip_blanks(cursor *c)
{
    while (c->i < c->len && is_blank(c->s[c->i]))
        c->i++;
}

static inline int at(const cursor *c, char ch)
{
    return c->i < c->len && c->s[c->i] == ch;
}

/* At an array's or object's opener: 0 when it closes at once (consumed),
 * 2 when an element follows. */
static inline int open_list(cursor *c, char closer)
{
    c->i++;
    skip_blanks(c);
    if (at(c, closer))
        return c->i++, 0;
    return 2;
}

/* After an element or member: 0 at the closer (consumed), 2 after a ','
 * (another follows), 1 at anything else (not JSON). */
static inline int after_item(cursor *c, char closer)
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
static inline int skip_string(cursor *c)
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
static inline int skip_value(cursor *c)
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

#endif
