/* log.h — one line per event on stderr: "2024-05-01T12:00:00.123Z info  msg".
 *
 * A line is formatted into one buffer and written with a single write(2), so
 * lines from HTTP threads, workers and main never interleave mid-line. */
#ifndef TP_LOG_H
#define TP_LOG_H

#include <stdarg.h>

typedef enum { TP_LOG_ERROR = 0, TP_LOG_WARN, TP_LOG_INFO, TP_LOG_DEBUG } tp_log_level;

/* Events above the level are dropped. The default is TP_LOG_INFO. */
void tp_log_set_level(tp_log_level level);
tp_log_level tp_log_get_level(void);
int tp_log_enabled(tp_log_level level);
/* "error" "warn" "info" "debug". Returns 0 on success, -1 if unknown. */
int tp_log_level_from_name(const char *name, tp_log_level *out);
const char *tp_log_level_name(tp_log_level level);

void tp_log(tp_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void tp_logv(tp_log_level level, const char *fmt, va_list ap);

#define TP_LOG_E(...) tp_log(TP_LOG_ERROR, __VA_ARGS__)
#define TP_LOG_W(...) tp_log(TP_LOG_WARN, __VA_ARGS__)
#define TP_LOG_I(...) tp_log(TP_LOG_INFO, __VA_ARGS__)
#define TP_LOG_D(...) tp_log(TP_LOG_DEBUG, __VA_ARGS__)

#endif
