#include "body_codec.h"

#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zlib.h>

int tp_body_encoding_parse(const char *value, tp_body_encoding *enc, char *msg, size_t len)
{
    *enc = TP_BODY_IDENTITY;
    if (!value)
        return 0;
    size_t a = strspn(value, " \t"), b = strlen(value);
    while (b > a && (value[b - 1] == ' ' || value[b - 1] == '\t'))
        b--;
    const char *v = value + a;
    size_t n = b - a;
    if (n == 8 && strncasecmp(v, "identity", 8) == 0)
        return 0;
    if ((n == 4 && strncasecmp(v, "gzip", 4) == 0) || (n == 6 && strncasecmp(v, "x-gzip", 6) == 0)) {
        *enc = TP_BODY_GZIP;
        return 0;
    }
    if (n == 7 && strncasecmp(v, "deflate", 7) == 0) {
        *enc = TP_BODY_DEFLATE;
        return 0;
    }
    snprintf(msg, len, "Content-Encoding '%.100s' is not supported (gzip, deflate or identity, "
             "one of them)", value);
    return -1;
}

static size_t written(const z_stream *z, const char *buf)
{
    return buf ? (size_t)((const char *)z->next_out - buf) : 0;
}

/* Room for the next inflate call: doubles, from a guess of 4x the input,
 * up to max + 1 bytes (the one past max is how an oversized body shows),
 * each growth taken from mem first (TP_UNAVAILABLE when it refuses). */
static tp_status grow_output(z_stream *z, char **buf, size_t *cap, size_t max, tp_mem_hold *mem,
                             const char *name, tp_err *err)
{
    size_t used = written(z, *buf);
    size_t want = *cap ? *cap * 2 : 4 * (size_t)z->avail_in + 64;
    if (want > max + 1 || want < *cap)
        want = max + 1;
    char what[48];
    snprintf(what, sizeof what, "inflating a %s body", name);
    if (mem && tp_mem_take_for(mem, (int64_t)(want - *cap), what, err) != TP_OK)
        return TP_UNAVAILABLE;
    char *p = realloc(*buf, want + 1);
    if (!p) {
        if (mem)
            tp_mem_take(mem, -(int64_t)(want - *cap));
        return tp_fail(err, TP_NOMEM, "out of memory inflating a %s body", name);
    }
    *buf = p;
    *cap = want;
    z->next_out = (Bytef *)p + used;
    z->avail_out = (uInt)(want - used > UINT_MAX ? UINT_MAX : want - used);
    return TP_OK;
}

static tp_status refuse_too_large(int *too_large, const char *name, size_t max, tp_err *err)
{
    *too_large = 1;
    return tp_fail(err, TP_INVALID, "%s body inflates past max_body_bytes %zu", name, max);
}

static tp_status inflate_all(z_stream *z, size_t max, tp_mem_hold *mem, char **buf, size_t *cap,
                             int *too_large, const char *name, tp_err *err)
{
    for (;;) {
        if (z->avail_out == 0) {
            if (written(z, *buf) == max + 1)
                return refuse_too_large(too_large, name, max, err);
            tp_status st = grow_output(z, buf, cap, max, mem, name, err);
            if (st != TP_OK)
                return st;
        }
        int rc = inflate(z, Z_NO_FLUSH);
        if (rc == Z_STREAM_END)
            break;
        if (rc == Z_BUF_ERROR && z->avail_in == 0)
            return tp_fail(err, TP_INVALID, "%s body is truncated: it ends inside the compressed "
                           "data (%lu bytes in, %lu out)", name, z->total_in, z->total_out);
        if (rc != Z_OK && rc != Z_BUF_ERROR)
            return tp_fail(err, rc == Z_MEM_ERROR ? TP_NOMEM : TP_INVALID,
                           "%s body is not valid %s data at byte %lu: %s", name, name, z->total_in,
                           z->msg ? z->msg : zError(rc));
    }
    if (z->avail_in)
        return tp_fail(err, TP_INVALID, "%s body has %u bytes after the end of its compressed "
                       "data", name, z->avail_in);
    /* the stream can end on the byte past max, in the room kept to see it */
    return z->total_out > max ? refuse_too_large(too_large, name, max, err) : TP_OK;
}

tp_status tp_body_decode(tp_body_encoding enc, const char *in, size_t len, size_t max, tp_mem_hold *mem,
                         char **out, size_t *out_len, int *too_large, tp_err *err)
{
    *out = NULL;
    *out_len = 0;
    *too_large = 0;
    const char *name = enc == TP_BODY_GZIP ? "gzip" : "deflate";
    if (len > UINT_MAX)
        return tp_fail(err, TP_INVALID, "%s body of %zu bytes is larger than one inflate call "
                       "takes", name, len);
    z_stream z;
    memset(&z, 0, sizeof z);
    /* 15 bits of window; +16: the gzip wrapper instead of zlib's */
    if (inflateInit2(&z, enc == TP_BODY_GZIP ? 15 + 16 : 15) != Z_OK)
        return tp_fail(err, TP_NOMEM, "out of memory starting to inflate a %s body", name);
    z.next_in = (Bytef *)(uintptr_t)in;
    z.avail_in = (uInt)len;
    char *buf = NULL;
    size_t cap = 0;
    tp_status st = inflate_all(&z, max, mem, &buf, &cap, too_large, name, err);
    size_t n = z.total_out;
    inflateEnd(&z);
    if (st != TP_OK) {
        free(buf);
        if (mem)
            tp_mem_take(mem, -(int64_t)cap); /* what the buffer took, back */
        return st;
    }
    buf[n] = '\0';
    *out = buf;
    *out_len = n;
    return TP_OK;
}
