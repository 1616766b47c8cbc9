/* log_settings.h — Triton's logging extension (GET and POST /v2/logging)
 * over util/log.h's one level.
 *
 * Triton switches info, warning and error lines on and off one by one and
 * adds verbose levels; tpserve's log has a single threshold (error < warn
 * < info < debug). The settings a client sees are that threshold spelled
 * Triton's way (log_error always true, log_warning and log_info as the
 * threshold allows, log_verbose_level 1 for debug), and a change is taken
 * when it names a threshold; one that would need lines of a kind switched
 * off below a kind kept on (info without warnings) is refused with why.
 * The log goes to stderr (a container's log) in ISO 8601 UTC: log_file ""
 * and log_format "ISO8601" are the only values accepted. */
#ifndef TP_LOG_SETTINGS_H
#define TP_LOG_SETTINGS_H

#include <stddef.h>

#include "status.h"

/* The current settings as a JSON object (malloc'd; NULL: out of memory). */
char *tp_log_settings_json(void);

/* Applies a POST body: a JSON object of any of the settings. On success
 * the new level is in effect and *out holds the settings after it
 * (malloc'd). Anything else (not an object, an unknown key, a wrong type,
 * a combination no threshold gives) changes nothing: TP_PARSE (not JSON)
 * or TP_INVALID, and why. An empty body changes nothing either. */
tp_status tp_log_settings_apply(const char *body, size_t len, char **out, tp_err *err);

#endif
