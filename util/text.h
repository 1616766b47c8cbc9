/* text.h — a bounded string copy for the per-request path.
 *
 * snprintf(dst, size, "%s", src) parses its format every time, and on a
 * request's path (names copied into tensors, the URL into its context) it
 * showed in the server's profile; this is the same result without that. */
#ifndef TP_TEXT_H
#define TP_TEXT_H

#include <string.h>

/* src into dst[size] (size > 0), cut to fit, always NUL-terminated. */
static inline void tp_text_copy(char *dst, size_t size, const char *src)
{
    size_t n = strnlen(src, size - 1);
    memcpy(dst, src, n);
    dst[n] = '\0';
}

#endif
