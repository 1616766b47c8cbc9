/* test_log_settings.c — Triton's logging extension over one log level:
 * what each body does from each level, and every refusal (what and why)
 * leaving the level as it was. */
#include <jansson.h>
#include <string.h>

#include "check_main.h"
#include "log.h"
#include "log_settings.h"
#include "testutil.h"

/* Applies body from level `from`; returns the status, leaves the level in
 * *after and the error (or "") in err. */
static tp_status apply_from(tp_log_level from, const char *body, tp_log_level *after, tp_err *err)
{
    tp_log_set_level(from);
    char *doc = NULL;
    err->msg[0] = '\0';
    tp_status st = tp_log_settings_apply(body, strlen(body), &doc, err);
    *after = tp_log_get_level();
    tu_expect_settings_answer(st, doc, tp_log_settings_json());
    return st;
}

START_TEST(settings_spell_the_level)
{
    static const struct {
        tp_log_level lvl;
        int warning, info, verbose;
    } cases[] = {
        {TP_LOG_ERROR, 0, 0, 0}, {TP_LOG_WARN, 1, 0, 0}, {TP_LOG_INFO, 1, 1, 0}, {TP_LOG_DEBUG, 1, 1, 1}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tp_log_set_level(cases[i].lvl);
        char *s = tp_log_settings_json();
        json_t *doc = json_loads(s, 0, NULL);
        ck_assert_ptr_nonnull(doc);
        ck_assert(json_is_true(json_object_get(doc, "log_error")));
        ck_assert_int_eq(json_is_true(json_object_get(doc, "log_warning")), cases[i].warning);
        ck_assert_int_eq(json_is_true(json_object_get(doc, "log_info")), cases[i].info);
        ck_assert_int_eq(json_integer_value(json_object_get(doc, "log_verbose_level")), cases[i].verbose);
        ck_assert_str_eq(json_string_value(json_object_get(doc, "log_file")), "");
        ck_assert_str_eq(json_string_value(json_object_get(doc, "log_format")), "ISO8601");
        json_decref(doc);
        free(s);
    }
    tp_log_set_level(TP_LOG_INFO);
}
END_TEST

/* A kind named off takes the threshold down below it, one named on up to
 * it (never down: log_error on keeps info); kinds not named follow. */
START_TEST(changes_move_the_threshold)
{
    static const struct {
        tp_log_level from;
        const char *body;
        tp_log_level to;
    } cases[] = {
        {TP_LOG_INFO, "{\"log_verbose_level\": 1}", TP_LOG_DEBUG},
        {TP_LOG_INFO, "{\"log_verbose_level\": 7}", TP_LOG_DEBUG},
        {TP_LOG_DEBUG, "{\"log_verbose_level\": 0}", TP_LOG_INFO},
        {TP_LOG_DEBUG, "{\"log_info\": false}", TP_LOG_WARN},
        {TP_LOG_DEBUG, "{\"log_warning\": false}", TP_LOG_ERROR},
        {TP_LOG_ERROR, "{\"log_info\": true}", TP_LOG_INFO},
        {TP_LOG_ERROR, "{\"log_warning\": true}", TP_LOG_WARN},
        {TP_LOG_WARN, "{\"log_info\": true, \"log_warning\": true, \"log_verbose_level\": 0}", TP_LOG_INFO},
        {TP_LOG_WARN, "{\"log_info\": false}", TP_LOG_WARN},            /* already off */
        {TP_LOG_INFO, "{\"log_verbose_level\": 0}", TP_LOG_INFO},       /* already 0 */
        {TP_LOG_DEBUG, "{\"log_info\": true}", TP_LOG_DEBUG},           /* verbose stays */
        {TP_LOG_DEBUG, "{}", TP_LOG_DEBUG},
        {TP_LOG_DEBUG, "", TP_LOG_DEBUG},                               /* empty body: no change */
        {TP_LOG_INFO, "{\"log_error\": true, \"log_file\": \"\", \"log_format\": \"ISO8601\"}", TP_LOG_INFO},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tp_log_level after;
        tp_err e;
        tp_status st = apply_from(cases[i].from, cases[i].body, &after, &e);
        ck_assert_msg(st == TP_OK, "%s: %s", cases[i].body, e.msg);
        ck_assert_msg(after == cases[i].to, "%s from %s: %s, expected %s", cases[i].body,
                      tp_log_level_name(cases[i].from), tp_log_level_name(after), tp_log_level_name(cases[i].to));
    }
    tp_log_set_level(TP_LOG_INFO);
}
END_TEST

/* Each refusal says what and why, and the level stays. */
START_TEST(refusals_change_nothing)
{
    static const struct {
        const char *body, *says;
    } cases[] = {
        {"{\"log_info\": true, \"log_warning\": false}", "log_warning off together with log_info on"},
        {"{\"log_verbose_level\": 1, \"log_info\": false}", "log_info off together with log_verbose_level on"},
        {"{\"log_error\": false}", "tpserve always logs errors"},
        {"{\"log_file\": \"/var/log/x\"}", "log_file '/var/log/x' is not offered: tpserve logs to stderr"},
        {"{\"log_format\": \"default\"}", "log_format 'default' is not offered"},
        {"{\"log_file\": 3}", "log_file must be a string, not an integer"},
        {"{\"log_info\": \"yes\"}", "log_info must be true or false, not a string"},
        {"{\"log_verbose_level\": -1}", "log_verbose_level must be a non-negative integer, not a negative integer"},
        {"{\"log_verbose_level\": true}", "log_verbose_level must be a non-negative integer, not a boolean"},
        {"{\"verbose\": 1}", "unknown log setting 'verbose'"},
        {"[]", "log settings must be a JSON object, got an array"},
        {"{\"log_info\": true", "malformed JSON in log settings at line 1"},
        {"{\"log_info\": true, \"log_info\": false}", "malformed JSON in log settings"}, /* duplicate key */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tp_log_level after;
        tp_err e;
        tp_status st = apply_from(TP_LOG_INFO, cases[i].body, &after, &e);
        ck_assert_msg(st == TP_INVALID || st == TP_PARSE, "%s was taken", cases[i].body);
        ck_assert_msg(strstr(e.msg, cases[i].says), "%s: '%s' does not say '%s'", cases[i].body, e.msg,
                      cases[i].says);
        ck_assert_int_eq(after, TP_LOG_INFO);
    }
}
END_TEST

static Suite *log_settings_suite(void)
{
    Suite *s = suite_create("log_settings");
    TCase *t = tcase_create("core");
    tcase_add_test(t, settings_spell_the_level);
    tcase_add_test(t, changes_move_the_threshold);
    tcase_add_test(t, refusals_change_nothing);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(log_settings_suite)
