/* json_tensor_write.c — the growing answer buffer (tp_jbuf) and a
 * tensor's values written into it as a JSON array (json_tensor.h). */
#include "json_tensor.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "buf_pool.h"
#include "numtext.h"
#include "tensor.h"

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
