/* body_codec.h — request bodies sent compressed (Content-Encoding: gzip or
 * deflate), as tritonclient's request_compression_algorithm sends them and
 * Triton's HTTP frontend takes them. The body is inflated once it is all
 * in, before any route reads it, so every route (and the binary tensor
 * extension's Inference-Header-Content-Length, which counts the inflated
 * body, as in Triton) sees plain bytes. Inflating stops at the server's
 * body limit: a small body that would inflate past it is refused, not
 * inflated (a decompression bomb costs at most the limit). Answers are
 * sent uncompressed whatever Accept-Encoding asks: identity is always
 * acceptable in HTTP, and tritonclient reads it. */
#ifndef TP_BODY_CODEC_H
#define TP_BODY_CODEC_H

#include <stddef.h>

#include "mem_budget.h"
#include "status.h"

typedef enum {
    TP_BODY_IDENTITY,
    TP_BODY_GZIP,    /* RFC 1952 (also "x-gzip") */
    TP_BODY_DEFLATE, /* HTTP's deflate: the zlib format, RFC 1950 */
} tp_body_encoding;

/* A Content-Encoding header's value (NULL: absent) into *enc: 0, or -1 for
 * an encoding not offered (several stacked ones included) with a one-line
 * reason in msg. */
int tp_body_encoding_parse(const char *value, tp_body_encoding *enc, char *msg, size_t len);

/* in[0..len) decoded per enc into *out (malloc'd, len + 1 with a NUL after
 * the bytes, the caller's to free) and *out_len. Never more than max bytes:
 * past them, TP_INVALID with *too_large set (answer 413). Corrupt,
 * truncated or trailing data: TP_INVALID saying which. TP_NOMEM. The
 * output buffer's every growth is taken from mem before it is made (NULL:
 * not counted): a refusal is TP_UNAVAILABLE with mem->refused set. On
 * success mem keeps what the buffer took (its capacity, at most max + 1);
 * on failure it is given back. */
tp_status tp_body_decode(tp_body_encoding enc, const char *in, size_t len, size_t max, tp_mem_hold *mem,
                         char **out, size_t *out_len, int *too_large, tp_err *err);

#endif
