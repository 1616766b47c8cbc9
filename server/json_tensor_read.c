/* json_tensor_read.c — a JSON data array (flat or nested) into a
 * tensor's bytes, checked against its shape and dtype (json_tensor.h). */
#include "json_tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "json_scan.h"
#include "numtext.h"
#include "tensor.h"

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
