#include "log.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static _Atomic int log_level = TP_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void tp_log_set_level(tp_log_level level) { atomic_store(&log_level, (int)level); }
tp_log_level tp_log_get_level(void) { return (tp_log_level)atomic_load(&log_level); }
int tp_log_enabled(tp_log_level level) { return (int)level <= atomic_load(&log_level); }

int tp_log_level_from_name(const char *name, tp_log_level *out)
{
    for (int i = 0; i <= TP_LOG_DEBUG; i++) {
        if (name && strcmp(name, level_names[i]) == 0) {
            *out = (tp_log_level)i;
            return 0;
        }
    }
    return -1;
}

const char *tp_log_level_name(tp_log_level level)
{
    return level >= TP_LOG_ERROR && level <= TP_LOG_DEBUG ? level_names[level] : "?";
}

/* UTC with milliseconds: sortable and unambiguous across pods' time zones. */
static int format_time(char *buf, size_t len)
{
    struct timeval tv;
    struct tm tm;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    return (int)n + snprintf(buf + n, len - n, ".%03dZ", (int)(tv.tv_usec / 1000));
}

/* Copies msg[0..n) to out (room for cap bytes) with every control byte but
 * tab written \xHH: a message quotes what clients sent (the URL, ids), and
 * a raw ESC would drive the terminal or log viewer of whoever reads it
 * (colours, a cleared screen, a rewritten line), a CR or LF would forge a
 * line of its own. An escape is never cut in half. Returns the bytes
 * written. */
static size_t escape_controls(char *out, size_t cap, const char *msg, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)msg[i];
        if ((ch >= 0x20 && ch != 0x7f) || ch == '\t') {
            if (w + 1 > cap)
                break;
            out[w++] = (char)ch;
        } else {
            if (w + 4 > cap)
                break;
            out[w++] = '\\';
            out[w++] = 'x';
            out[w++] = hex[ch >> 4];
            out[w++] = hex[ch & 15];
        }
    }
    return w;
}

void tp_logv(tp_log_level level, const char *fmt, va_list ap)
{
    if (!tp_log_enabled(level))
        return;
    char msg[2048], line[2048];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    size_t len = n < 0 ? 0 : (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1; /* truncated */
    /* a message's own line end (libmicrohttpd ends its messages with one)
     * is the line's, not a byte to show */
    while (len && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        len--;
    size_t off = (size_t)format_time(line, sizeof line);
    off += (size_t)snprintf(line + off, sizeof line - off, " %-5s ", tp_log_level_name(level));
    off += escape_controls(line + off, sizeof line - 1 - off, msg, len); /* keep the line whole */
    line[off++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, off);
    (void)w; /* nowhere left to report a failed log write */
}

void tp_log(tp_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_logv(level, fmt, ap);
    va_end(ap);
}
