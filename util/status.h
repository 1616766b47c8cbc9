/* status.h — one status enum for the whole engine, generated from one table
 * (libuv's UV_ERRNO_MAP habit) so names, HTTP mappings and strings never drift.
 *
 * Every fallible function returns tp_status and fills a caller-owned message
 * buffer (tp_err). Nothing below main() exits or aborts on bad input. */
#ifndef TP_STATUS_H
#define TP_STATUS_H

#include <stddef.h>

/* X(name, http_status, description) */
#define TP_STATUS_MAP(X)                                         \
    X(OK,        200, "ok")                                      \
    X(IO,        500, "file missing or unreadable")              \
    X(PARSE,     400, "malformed input")                         \
    X(INVALID,   400, "invalid graph or request")                \
    X(NOT_FOUND, 404, "not found")                               \
    X(NOMEM,     500, "out of memory")                           \
    X(BACKEND,   500, "backend failure")                         \
    X(UNAVAILABLE, 503, "not available")                         \
    X(TIMEOUT,   504, "timed out")                               \
    X(INTERNAL,  500, "internal error")

typedef enum {
#define TP_STATUS_ENUM(name, http, desc) TP_##name,
    TP_STATUS_MAP(TP_STATUS_ENUM)
#undef TP_STATUS_ENUM
} tp_status;

/* A caller-owned error message. Functions that fail write one line into it:
 * what failed, where (file, node, input), and why. */
typedef struct {
    char msg[1024];
} tp_err;

const char *tp_status_name(tp_status s);
int tp_status_http(tp_status s);

/* Formats into err (if non-NULL) and returns s, so callers can write
 * `return tp_fail(err, TP_INVALID, "node '%s': ...", name);` */
tp_status tp_fail(tp_err *err, tp_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes an existing message, e.g. with the file name. */
void tp_err_prefix(tp_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#endif
