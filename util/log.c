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

void tp_logv(tp_log_level level, const char *fmt, va_list ap)
{
    if (!tp_log_enabled(level))
        return;
    char line[2048];
    int off = format_time(line, sizeof line);
    off += snprintf(line + off, sizeof line - (size_t)off, " %-5s ", tp_log_level_name(level));
    int n = vsnprintf(line + off, sizeof line - (size_t)off, fmt, ap);
    size_t len = (size_t)off + (n < 0 ? 0 : (size_t)n);
    if (len > sizeof line - 2)
        len = sizeof line - 2; /* truncated: keep the line whole */
    /* Newlines inside a message would split one event across lines. */
    for (size_t i = (size_t)off; i < len; i++)
        if (line[i] == '\n' || line[i] == '\r')
            line[i] = ' ';
    line[len++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w; /* nowhere left to report a failed log write */
}

void tp_log(tp_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tp_logv(level, fmt, ap);
    va_end(ap);
}
