#include "log_settings.h"

#include <jansson.h>
#include <string.h>

#include "json_kind.h"
#include "log.h"

/* The kinds a client switches, each with the threshold that first shows
 * it: a kind is on exactly when the threshold is at or above its own. */
typedef struct {
    const char *key;
    tp_log_level shown_from;
} kind;

static const kind KINDS[] = {
    {"log_error", TP_LOG_ERROR},
    {"log_warning", TP_LOG_WARN},
    {"log_info", TP_LOG_INFO},
    {"log_verbose_level", TP_LOG_DEBUG},
};
#define N_KINDS (sizeof KINDS / sizeof KINDS[0])

#define LOG_FORMAT "ISO8601"

static char *settings_json(tp_log_level lvl)
{
    return tp_json_take_text(json_pack("{s:s, s:b, s:b, s:b, s:i, s:s}", "log_file", "", "log_info",
                                       lvl >= TP_LOG_INFO, "log_warning", lvl >= TP_LOG_WARN, "log_error", 1,
                                       "log_verbose_level", lvl >= TP_LOG_DEBUG ? 1 : 0, "log_format",
                                       LOG_FORMAT));
}

char *tp_log_settings_json(void) { return settings_json(tp_log_get_level()); }

/* One kind's value in the body: 1 on, 0 off, -1 when v is not its type. */
static int kind_value(const kind *k, const json_t *v)
{
    if (k->shown_from == TP_LOG_DEBUG) /* a level, not a switch */
        return json_is_integer(v) && json_integer_value(v) >= 0 ? json_integer_value(v) > 0 : -1;
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

/* log_file and log_format: the one value offered, or why not. */
static tp_status check_fixed(const char *key, const json_t *v, const char *only, const char *why, tp_err *err)
{
    if (!json_is_string(v))
        return tp_fail(err, TP_INVALID, "%s must be a string, not %s", key, tp_json_kind(v));
    if (strcmp(json_string_value(v), only) != 0)
        return tp_fail(err, TP_INVALID, "%s '%.100s' is not offered: %s", key, json_string_value(v), why);
    return TP_OK;
}

/* The body's switches: set[i] -1 (not named), 0 or 1. */
static tp_status read_body(const json_t *doc, int set[N_KINDS], tp_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)doc, key, v) {
        size_t i = 0;
        while (i < N_KINDS && strcmp(key, KINDS[i].key) != 0)
            i++;
        tp_status st = TP_OK;
        if (i < N_KINDS && (set[i] = kind_value(&KINDS[i], v)) < 0)
            st = tp_fail(err, TP_INVALID, "%s must be %s, not %s", key,
                         KINDS[i].shown_from == TP_LOG_DEBUG ? "a non-negative integer" : "true or false",
                         tp_json_kind(v));
        else if (i == 0 && set[0] == 0)
            st = tp_fail(err, TP_INVALID, "log_error false is not offered: tpserve always logs errors");
        else if (i < N_KINDS)
            continue;
        else if (strcmp(key, "log_file") == 0)
            st = check_fixed(key, v, "", "tpserve logs to stderr only (the container's log)", err);
        else if (strcmp(key, "log_format") == 0)
            st = check_fixed(key, v, LOG_FORMAT, "tpserve writes " LOG_FORMAT " (UTC) lines only", err);
        else
            st = tp_fail(err, TP_INVALID, "unknown log setting '%.100s' (log_file, log_info, log_warning, "
                         "log_error, log_verbose_level, log_format)", key);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

/* The threshold the switches ask for: the current one, lowered below
 * every kind named off, then raised to every kind named on. Kinds not
 * named follow it. */
static tp_log_level threshold_for(const int set[N_KINDS], tp_log_level cur)
{
    tp_log_level t = cur;
    for (size_t i = 1; i < N_KINDS; i++)
        if (set[i] == 0 && t >= KINDS[i].shown_from)
            t = KINDS[i - 1].shown_from;
    for (size_t i = 0; i < N_KINDS; i++)
        if (set[i] == 1 && t < KINDS[i].shown_from)
            t = KINDS[i].shown_from;
    return t;
}

/* A named switch the threshold cannot give (info on, warnings off). */
static tp_status check_reachable(const int set[N_KINDS], tp_log_level t, tp_err *err)
{
    for (size_t i = 0; i < N_KINDS; i++)
        if (set[i] >= 0 && set[i] != (t >= KINDS[i].shown_from))
            return tp_fail(err, TP_INVALID, "%s %s together with %s on: tpserve's log has one threshold "
                           "(error < warn < info < debug), so each kind of line comes with every more "
                           "severe kind", KINDS[i].key, set[i] ? "on" : "off",
                           KINDS[t].key);
    return TP_OK;
}

tp_status tp_log_settings_apply(const char *body, size_t len, char **out, tp_err *err)
{
    json_t *doc = NULL;
    int set[N_KINDS] = {-1, -1, -1, -1};
    tp_status st = len ? tp_json_load_object(body, len, "log settings", &doc, err) : TP_OK; /* empty: no change */
    if (st == TP_OK && doc)
        st = read_body(doc, set, err);
    json_decref(doc);
    tp_log_level t = threshold_for(set, tp_log_get_level());
    if (st == TP_OK)
        st = check_reachable(set, t, err);
    if (st != TP_OK)
        return st;
    if (!(*out = settings_json(t)))
        return tp_fail(err, TP_NOMEM, "log settings: out of memory");
    /* The change is logged at the more verbose of the two levels, so it
     * shows whichever way it goes (up from error as down to it). */
    tp_log_level old = tp_log_get_level();
    if (t > old)
        tp_log_set_level(t);
    if (t != old)
        tp_log(TP_LOG_WARN, "log level %s -> %s (POST /v2/logging)", tp_log_level_name(old),
               tp_log_level_name(t));
    tp_log_set_level(t);
    return TP_OK;
}
