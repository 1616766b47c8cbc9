/* classify.c — see classify.h. */
#include "classify.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "json_tensor.h"

/* One batch entry's elements: where they start and their type. */
typedef struct {
    const char *p;
    tp_dtype dt;
} entry;

/* Elements may be unaligned (a binary input's bytes answered back by
 * the codec's own tests): read through memcpy. */
static int64_t i64_at(const entry *e, int64_t i)
{
    int64_t v;
    memcpy(&v, e->p + (size_t)i * sizeof v, sizeof v);
    return v;
}

/* Element i as a double: exact for every type but INT64, which ranks by
 * its own value (ranks_above) and is printed from it. */
static double value_at(const entry *e, int64_t i)
{
    float f;
    int32_t i32;
    uint16_t h;
    switch (e->dt) {
    case TP_F32: memcpy(&f, e->p + (size_t)i * sizeof f, sizeof f); return f;
    case TP_F16: memcpy(&h, e->p + (size_t)i * sizeof h, sizeof h); return tp_f16_to_f32(h);
    case TP_BF16: memcpy(&h, e->p + (size_t)i * sizeof h, sizeof h); return tp_bf16_to_f32(h);
    case TP_I32: memcpy(&i32, e->p + (size_t)i * sizeof i32, sizeof i32); return i32;
    case TP_I64:
    case TP_DTYPE_COUNT: break;
    }
    return (double)i64_at(e, i);
}

/* 1 when element i ranks above element j: a larger value, or an equal one
 * at a lower index; NaN below every number. */
static int ranks_above(const entry *e, int64_t i, int64_t j)
{
    if (e->dt == TP_I64) {
        int64_t a = i64_at(e, i), b = i64_at(e, j);
        return a > b || (a == b && i < j);
    }
    double a = value_at(e, i), b = value_at(e, j);
    int na = isnan(a) != 0, nb = isnan(b) != 0;
    if (na || nb)
        return na == nb ? i < j : nb;
    return a > b || (a == b && i < j);
}

/* heap[0..n) keeps the best classes seen so far with the worst at the
 * root, so each new element is compared with the root alone. */
static void sift_down(const entry *e, int64_t *heap, int64_t n, int64_t at)
{
    for (;;) {
        int64_t worst = at, l = 2 * at + 1, r = l + 1;
        if (l < n && ranks_above(e, heap[worst], heap[l]))
            worst = l;
        if (r < n && ranks_above(e, heap[worst], heap[r]))
            worst = r;
        if (worst == at)
            return;
        int64_t t = heap[at];
        heap[at] = heap[worst];
        heap[worst] = t;
        at = worst;
    }
}

/* The k best of the entry's n elements into best[0..k), best first. */
static void top_k(const entry *e, int64_t n, int64_t k, int64_t *best)
{
    for (int64_t i = 0; i < k; i++)
        best[i] = i;
    for (int64_t i = k / 2; i-- > 0;)
        sift_down(e, best, k, i);
    for (int64_t i = k; i < n; i++)
        if (ranks_above(e, i, best[0])) {
            best[0] = i;
            sift_down(e, best, k, 0);
        }
    /* heap sort: the worst goes to the end, one at a time */
    for (int64_t m = k; m > 1; m--) {
        int64_t t = best[0];
        best[0] = best[m - 1];
        best[m - 1] = t;
        sift_down(e, best, m - 1, 0);
    }
}

struct tp_labels {
    char *path;
    char *text;    /* the file, each line's end a NUL */
    char **line;   /* line[k]: class k's label */
    int64_t n;
};

/* Splits text (len bytes, NUL-terminated) into l->line at each newline;
 * 0 when out of memory. */
static int split_lines(tp_labels *l, char *text, size_t len)
{
    int64_t cap = 1;
    for (size_t i = 0; i < len; i++)
        cap += text[i] == '\n';
    if (!(l->line = malloc((size_t)cap * sizeof *l->line)))
        return 0;
    for (char *at = text, *end = text + len; at < end;) {
        char *nl = memchr(at, '\n', (size_t)(end - at));
        char *stop = nl ? nl : end;
        if (stop > at && stop[-1] == '\r')
            stop[-1] = '\0';
        *stop = '\0';
        l->line[l->n++] = at;
        at = stop + 1;
    }
    return 1;
}

/* A label's longest: a class string's length must fit its 4-byte prefix,
 * and no real label comes near. */
#define LABEL_MAX 65536

/* The first line that is not UTF-8 or is over LABEL_MAX bytes (0-based),
 * or -1. */
static int64_t first_bad_line(const tp_labels *l)
{
    for (int64_t k = 0; k < l->n; k++) {
        if (strlen(l->line[k]) > LABEL_MAX)
            return k;
        json_t *j = json_string(l->line[k]); /* NULL for invalid UTF-8 */
        if (!j)
            return k;
        json_decref(j);
    }
    return -1;
}

tp_status tp_labels_load(const char *path, tp_labels **out, tp_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return tp_fail(err, TP_IO, "labels file %s: cannot open: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int oom = 0;
    for (;;) {
        if (cap - len < 4097) {
            size_t grown = cap ? cap * 2 : 8192;
            char *p = realloc(text, grown);
            if (!p) {
                oom = 1;
                break;
            }
            text = p;
            cap = grown;
        }
        size_t got = fread(text + len, 1, cap - len - 1, f);
        len += got;
        if (got == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    tp_labels *l = oom || bad ? NULL : calloc(1, sizeof *l);
    if (!l || !(l->path = strdup(path))) {
        free(text);
        free(l);
        return bad ? tp_fail(err, TP_IO, "labels file %s: cannot read: %s", path, strerror(errno))
                   : tp_fail(err, TP_NOMEM, "labels file %s: out of memory", path);
    }
    text[len] = '\0';
    l->text = text;
    const char *nul = memchr(text, '\0', len);
    if (nul) {
        int64_t line = 1;
        for (const char *c = text; c < nul; c++)
            line += *c == '\n';
        tp_labels_free(l);
        return tp_fail(err, TP_INVALID, "labels file %s:%" PRId64 ": a NUL byte (not a text file)", path, line);
    }
    if (!split_lines(l, text, len)) {
        tp_labels_free(l);
        return tp_fail(err, TP_NOMEM, "labels file %s: out of memory", path);
    }
    int64_t k = first_bad_line(l);
    if (k >= 0) {
        tp_labels_free(l);
        return tp_fail(err, TP_INVALID, "labels file %s:%" PRId64 ": not UTF-8 text of at most %d bytes (the "
                       "labels go into JSON answers)", path, k + 1, LABEL_MAX);
    }
    *out = l;
    return TP_OK;
}

void tp_labels_free(tp_labels *l)
{
    if (!l)
        return;
    free(l->line);
    free(l->text);
    free(l->path);
    free(l);
}

int64_t tp_labels_count(const tp_labels *l) { return l ? l->n : 0; }
const char *tp_labels_path(const tp_labels *l) { return l->path; }

/* "<value>:<index>[:<label>]" as a BYTES element: its 4-byte little-endian
 * length, then the text. */
static void append_class(tp_jbuf *b, const entry *e, int64_t i, const tp_labels *labels)
{
    char s[128];
    int n = e->dt == TP_I64   ? snprintf(s, sizeof s, "%" PRId64 ":%" PRId64, i64_at(e, i), i)
            : e->dt == TP_I32 ? snprintf(s, sizeof s, "%.0f:%" PRId64, value_at(e, i), i)
                              : snprintf(s, sizeof s, "%f:%" PRId64, value_at(e, i), i);
    const char *label = i < tp_labels_count(labels) ? labels->line[i] : NULL;
    size_t ln = label ? strlen(label) + 1 : 0, total = (size_t)n + ln;
    unsigned char len[4] = {(unsigned char)total, (unsigned char)(total >> 8), (unsigned char)(total >> 16),
                            (unsigned char)(total >> 24)};
    tp_jbuf_raw(b, (const char *)len, sizeof len);
    tp_jbuf_raw(b, s, (size_t)n);
    if (label) {
        tp_jbuf_raw(b, ":", 1);
        tp_jbuf_raw(b, label, ln - 1);
    }
}

tp_status tp_classify(const tp_host_tensor *t, int batched, int64_t count, const tp_labels *labels,
                      tp_classes *out, tp_err *err)
{
    memset(out, 0, sizeof *out);
    int64_t entries = batched ? t->shape[0] : 1, per = 1;
    for (int d = batched ? 1 : 0; d < t->ndim; d++)
        per *= t->shape[d];
    if (per == 0 || entries == 0)
        return tp_fail(err, TP_INVALID, "output '%s': no elements to classify (shape has a 0)", t->name);
    int64_t k = count < per ? count : per;
    int64_t *best = malloc((size_t)k * sizeof *best);
    tp_jbuf b = {0};
    size_t stride = (size_t)per * tp_dtype_size(t->dtype);
    for (int64_t r = 0; best && r < entries && !b.oom; r++) {
        entry e = {(const char *)t->data + (size_t)r * stride, t->dtype};
        top_k(&e, per, k, best);
        for (int64_t i = 0; i < k; i++)
            append_class(&b, &e, best[i], labels);
    }
    free(best);
    if (!best || b.oom) {
        tp_jbuf_free_text(b.p, 0);
        return tp_fail(err, TP_NOMEM, "output '%s': out of memory for its %" PRId64 " classes", t->name,
                       entries * k);
    }
    *out = (tp_classes){.bytes = b.p, .len = b.len, .ndim = batched ? 2 : 1};
    out->shape[0] = batched ? entries : k;
    out->shape[1] = batched ? k : 0;
    return TP_OK;
}

void tp_classes_free(tp_classes *c)
{
    tp_jbuf_free_text(c->bytes, 0);
    memset(c, 0, sizeof *c);
}
