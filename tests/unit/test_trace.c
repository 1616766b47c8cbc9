/* test_trace.c — Triton's trace extension (server/trace.c): the settings
 * (defaults, updates, the model's own over the global ones, every
 * refusal, the file never changed by an update), sampling by rate and
 * count, and the files written (numbered by log_frequency, at the end,
 * when log_frequency changes); what a client can make it hold (traces
 * past max_pending, long request ids) and a symlink planted where the
 * temporary file used to be. */
#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "testutil.h"
#include "trace.h"

/* make_dir's directory, and the trace file in it */
static char dir[64], file[96];

static void make_dir(void)
{
    strcpy(dir, "/tmp/tp_trace_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(file, sizeof file, "%s/t.json", dir);
}

/* A trace writing to path (NULL: none), settings as at startup, holding
 * max_pending traces at most (0: the default). */
static tp_trace *create_max(const char *path, int timestamps, int64_t rate, int64_t log_frequency,
                            int64_t max_pending)
{
    tp_trace_init init = {path, timestamps, rate, -1, log_frequency, max_pending};
    tp_trace *t;
    tp_err err;
    ck_assert_int_eq(tp_trace_create(&init, &t, &err), TP_OK);
    return t;
}

static tp_trace *create(const char *path, int timestamps, int64_t rate, int64_t log_frequency)
{
    return create_max(path, timestamps, rate, log_frequency, 0);
}

/* POSTs body; returns the status, the answer checked against GET's. */
static tp_status update(tp_trace *t, int model, const char *body, tp_err *err)
{
    char *doc = NULL;
    tp_status st = tp_trace_update(t, model, body, strlen(body), &doc, err);
    tu_expect_settings_answer(st, doc, tp_trace_settings_json(t, model));
    return st;
}

/* Setting key of the global or the model's settings, as text ("[\"OFF\"]"
 * for the level). */
static void expect_setting(tp_trace *t, int model, const char *key, const char *want)
{
    char *s = tp_trace_settings_json(t, model);
    json_t *doc = json_loads(s, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    json_t *v = json_object_get(doc, key);
    char *got = json_is_string(v) ? strdup(json_string_value(v)) : json_dumps(v, JSON_COMPACT);
    ck_assert_msg(strcmp(got, want) == 0, "%s %s: '%s', wanted '%s'", model ? "model" : "global", key, got, want);
    free(got);
    json_decref(doc);
    free(s);
}

START_TEST(defaults_and_refusals)
{
    tp_trace *t;
    tp_err err;
    tp_trace_init no_file = {NULL, 1, 1000, -1, 0, 0};
    ck_assert_int_eq(tp_trace_create(&no_file, &t, &err), TP_INVALID);
    ck_assert_str_eq(err.msg, "trace_level TIMESTAMPS needs a trace_file to write to");
    t = create(NULL, 0, 1000, 0);
    char *s = tp_trace_settings_json(t, 0);
    ck_assert_str_eq(s, "{\"trace_file\":\"\",\"trace_level\":[\"OFF\"],\"trace_rate\":\"1000\",\"trace_count\":\"-1\","
                        "\"log_frequency\":\"0\",\"trace_mode\":\"triton\"}");
    free(s);
    ck_assert_int_eq(tp_trace_sample(t), 0);
    static const struct {
        const char *body, *why;
    } bad[] = {
        {"{\"trace_level\":[\"TIMESTAMPS\"]}", "trace_level TIMESTAMPS needs a trace_file, which is set at startup"},
        {"{\"trace_file\":\"/etc/cron.d/x\"}", "trace_file cannot be changed here, so that no client chooses where"},
        {"{\"trace_level\":[\"TENSORS\"]}", "trace_level TENSORS is not offered"},
        {"{\"trace_level\":[\"OFF\",\"TIMESTAMPS\"]}", "trace_level must be [\"OFF\"] or [\"TIMESTAMPS\"]"},
        {"{\"trace_rate\":\"0\"}", "trace_rate must be an integer of at least 1 (as a string), got '0'"},
        {"{\"trace_rate\":\"12x\"}", "trace_rate must be an integer of at least 1 (as a string), got '12x'"},
        {"{\"trace_count\":\"-2\"}", "trace_count must be an integer of at least -1"},
        {"{\"log_frequency\":true}", "log_frequency must be an integer of at least 0 (as a string), got a boolean"},
        {"{\"trace_mode\":\"opentelemetry\"}", "trace_mode must be \"triton\""},
        {"{\"trace_file\":7}", "trace_file cannot be changed here"},
        {"{\"trace_rat\":\"1\"}", "unknown trace setting 'trace_rat'"},
        {"[1]", "trace settings must be a JSON object, got an array"},
        {"{\"trace_rate\":", "malformed JSON in trace settings"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tp_status st = update(t, i % 2, bad[i].body, &err);
        ck_assert_msg(st == TP_INVALID || st == TP_PARSE, "%s: %d", bad[i].body, st);
        ck_assert_msg(strstr(err.msg, bad[i].why), "%s: '%s'", bad[i].body, err.msg);
    }
    /* a refused update with good settings in it changes nothing */
    ck_assert_int_eq(update(t, 0, "{\"trace_rate\":\"5\",\"trace_count\":\"-9\"}", &err), TP_INVALID);
    expect_setting(t, 0, "trace_rate", "1000");
    /* the settings echoed back, file included, are taken */
    s = tp_trace_settings_json(t, 0);
    ck_assert_int_eq(update(t, 1, s, &err), TP_OK);
    free(s);
    tp_trace_free(t);
}
END_TEST

START_TEST(model_settings_over_global)
{
    tp_trace *t = create(NULL, 0, 1000, 0);
    tp_err err;
    ck_assert_int_eq(update(t, 0, "{\"trace_rate\":\"10\",\"log_frequency\":\"3\"}", &err), TP_OK);
    expect_setting(t, 1, "trace_rate", "10"); /* the model follows the global settings */
    ck_assert_int_eq(update(t, 1, "{\"trace_rate\":\"2\"}", &err), TP_OK);
    expect_setting(t, 1, "trace_rate", "2");
    expect_setting(t, 0, "trace_rate", "10");
    ck_assert_int_eq(update(t, 0, "{\"trace_rate\":\"20\",\"log_frequency\":\"4\"}", &err), TP_OK);
    expect_setting(t, 1, "trace_rate", "2");     /* its own */
    expect_setting(t, 1, "log_frequency", "4"); /* the global one */
    ck_assert_int_eq(update(t, 1, "{\"trace_rate\":null}", &err), TP_OK);
    expect_setting(t, 1, "trace_rate", "20");
    ck_assert_int_eq(update(t, 1, "{\"log_frequency\":\"7\",\"trace_count\":\"3\"}", &err), TP_OK);
    ck_assert_int_eq(update(t, 1, "", &err), TP_OK); /* naming nothing: all back to global */
    expect_setting(t, 1, "log_frequency", "4");
    expect_setting(t, 1, "trace_count", "-1");
    ck_assert_int_eq(update(t, 0, "{\"trace_rate\":null}", &err), TP_OK); /* global null: the default */
    expect_setting(t, 0, "trace_rate", "1000");
    expect_setting(t, 0, "trace_level", "[\"OFF\"]");
    tp_trace_free(t);
}
END_TEST

START_TEST(rate_and_count)
{
    make_dir();
    tp_trace *t = create(file, 0, 1000, 0);
    tp_err err;
    ck_assert_int_eq(update(t, 0, "{\"trace_level\":[\"TIMESTAMPS\"],\"trace_rate\":\"3\"}", &err), TP_OK);
    int64_t got[9];
    for (int i = 0; i < 9; i++)
        got[i] = tp_trace_sample(t);
    /* every third, numbered from 1 */
    int64_t want[9] = {0, 0, 1, 0, 0, 2, 0, 0, 3};
    ck_assert_mem_eq(got, want, sizeof want);
    /* the model's own count runs down to 0, which stops tracing */
    ck_assert_int_eq(update(t, 1, "{\"trace_rate\":\"1\",\"trace_count\":\"2\"}", &err), TP_OK);
    ck_assert_int_eq(tp_trace_sample(t), 4);
    ck_assert_int_eq(tp_trace_sample(t), 5);
    ck_assert_int_eq(tp_trace_sample(t), 0);
    expect_setting(t, 1, "trace_count", "0");
    expect_setting(t, 0, "trace_count", "-1");
    tp_trace_free(t); /* nothing recorded: no file */
    ck_assert_int_ne(access(file, F_OK), 0);
    tu_rmdir(dir);
}
END_TEST

/* The file's traces: their ids, in order, each checked for its stamps. */
static int read_ids(const char *path, int64_t *ids, int cap)
{
    json_error_t je;
    json_t *doc = json_load_file(path, 0, &je);
    ck_assert_msg(doc != NULL, "%s: %s", path, je.text);
    ck_assert(json_is_array(doc));
    int n = (int)json_array_size(doc);
    ck_assert_int_le(n, cap);
    for (int i = 0; i < n; i++) {
        json_t *o = json_array_get(doc, (size_t)i);
        ids[i] = json_integer_value(json_object_get(o, "id"));
        ck_assert_str_eq(json_string_value(json_object_get(o, "model_name")), "m");
        ck_assert_str_eq(json_string_value(json_object_get(o, "model_version")), "1");
        json_t *ts = json_object_get(o, "timestamps");
        /* a stamp never taken (0) is left out: request 2 failed before its batch ran */
        ck_assert_int_eq(json_array_size(ts), ids[i] == 2 ? 7 : 11);
        ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ts, 0), "name")), "HTTP_RECV_START");
        for (size_t k = 1; k < json_array_size(ts); k++)
            ck_assert_int_le(json_integer_value(json_object_get(json_array_get(ts, k - 1), "ns")),
                             json_integer_value(json_object_get(json_array_get(ts, k), "ns")));
    }
    json_decref(doc);
    return n;
}

START_TEST(files_by_log_frequency)
{
    make_dir();
    char path[160];
    tp_trace *t = create(file, 1, 1, 2);
    tp_err err;
    tp_trace_stamps full = {100, 200, 300, 400, 500, 600, 700}, failed = {100, 200, 300, 0, 0, 600, 700};
    for (int i = 0; i < 5; i++) {
        int64_t id = tp_trace_sample(t);
        tp_trace_record(t, id, "m", "1", i == 0 ? "req \"one\"" : NULL, id == 2 ? &failed : &full);
    }
    int64_t ids[8];
    snprintf(path, sizeof path, "%s.0", file);
    ck_assert_int_eq(read_ids(path, ids, 8), 2);
    ck_assert(ids[0] == 1 && ids[1] == 2);
    snprintf(path, sizeof path, "%s.1", file);
    ck_assert_int_eq(read_ids(path, ids, 8), 2);
    /* a new log_frequency: the fifth trace goes where it was headed first */
    ck_assert_int_eq(update(t, 0, "{\"log_frequency\":\"0\"}", &err), TP_OK);
    snprintf(path, sizeof path, "%s.2", file);
    ck_assert_int_eq(read_ids(path, ids, 8), 1);
    ck_assert_int_eq(ids[0], 5);
    for (int i = 0; i < 3; i++)
        tp_trace_record(t, tp_trace_sample(t), "m", "1", NULL, &full);
    ck_assert_int_ne(access(file, F_OK), 0); /* log_frequency 0: written at the end */
    tp_trace_free(t);
    ck_assert_int_eq(read_ids(file, ids, 8), 3);
    ck_assert(ids[0] == 6 && ids[2] == 8);
    tu_rmdir(dir);
}
END_TEST

START_TEST(request_id_escaped)
{
    make_dir();
    tp_trace *t = create(file, 1, 1, 0);
    tp_trace_stamps s = {1, 2, 3, 4, 5, 6, 7};
    tp_trace_record(t, tp_trace_sample(t), "m", "1", "a \"quoted\"\n id", &s);
    tp_trace_free(t);
    json_t *doc = json_load_file(file, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(doc, 0), "request_id")), "a \"quoted\"\n id");
    json_decref(doc);
    tu_rmdir(dir);
}
END_TEST

/* n traces, sampled and recorded, stamped as read_ids wants them */
static void record_n(tp_trace *t, int n)
{
    tp_trace_stamps full = {100, 200, 300, 400, 500, 600, 700}, failed = {100, 200, 300, 0, 0, 600, 700};
    for (int i = 0; i < n; i++) {
        int64_t id = tp_trace_sample(t);
        tp_trace_record(t, id, "m", "1", NULL, id == 2 ? &failed : &full);
    }
}

/* A symlink planted where the file used to be written aside (path.tmp,
 * and the numbered file's path.0.tmp) to a file the server may write: the
 * old fopen(tmp, "w") followed it and overwrote the victim with the
 * traces. The victim stays as it was, the links stay links, and the
 * traces still reach their files. */
START_TEST(planted_symlink_left_alone)
{
    make_dir();
    char victim[160], link0[160], link[160], path[160];
    snprintf(victim, sizeof victim, "%s/victim", dir);
    FILE *f = fopen(victim, "w");
    ck_assert_ptr_nonnull(f);
    fputs("precious\n", f);
    fclose(f);
    snprintf(link0, sizeof link0, "%s.0.tmp", file);
    snprintf(link, sizeof link, "%s.tmp", file);
    ck_assert_int_eq(symlink(victim, link0), 0);
    ck_assert_int_eq(symlink(victim, link), 0);
    tp_trace *t = create(file, 1, 1, 1); /* log_frequency 1: file.0 */
    record_n(t, 1);
    tp_err err;
    ck_assert_int_eq(update(t, 0, "{\"log_frequency\":\"0\"}", &err), TP_OK); /* then file, at the end */
    record_n(t, 1);
    tp_trace_free(t);
    int64_t ids[4];
    snprintf(path, sizeof path, "%s.0", file);
    ck_assert_int_eq(read_ids(path, ids, 4), 1);
    ck_assert_int_eq(read_ids(file, ids, 4), 1);
    ck_assert_int_eq(ids[0], 2);
    char got[64] = {0};
    f = fopen(victim, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(got, 1, sizeof got - 1, f);
    fclose(f);
    ck_assert_uint_eq(n, 9);
    ck_assert_str_eq(got, "precious\n");
    struct stat st;
    ck_assert_int_eq(lstat(link0, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    ck_assert_int_eq(lstat(link, &st), 0);
    ck_assert(S_ISLNK(st.st_mode));
    /* only the server's user reads the traces (request ids) */
    ck_assert_int_eq(stat(file, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0600);
    /* no temporary left behind: the dir holds victim, the two links, file, file.0 */
    int entries = 0;
    DIR *d = opendir(dir);
    for (struct dirent *de; (de = readdir(d));)
        entries += de->d_name[0] != '.';
    closedir(d);
    ck_assert_int_eq(entries, 5);
    tu_rmdir(dir);
}
END_TEST

/* log_frequency 0 writes at exit only: past max_pending the oldest traces
 * are dropped, and counted; the newest max_pending reach the file. */
START_TEST(max_pending_drops_oldest_at_exit)
{
    make_dir();
    tp_trace *t = create_max(file, 1, 1, 0, 4);
    record_n(t, 11);
    ck_assert_uint_eq(tp_trace_dropped(t), 7);
    ck_assert_int_ne(access(file, F_OK), 0); /* still nothing written */
    tp_trace_free(t);
    int64_t ids[8];
    ck_assert_int_eq(read_ids(file, ids, 8), 4);
    int64_t want[4] = {8, 9, 10, 11};
    ck_assert_mem_eq(ids, want, sizeof want);
    tu_rmdir(dir);
}
END_TEST

/* log_frequency 10 over max_pending 3: every 3 traces go to the next
 * file early, none dropped. */
START_TEST(max_pending_writes_early_with_log_frequency)
{
    make_dir();
    char path[160];
    tp_trace *t = create_max(file, 1, 1, 10, 3);
    record_n(t, 7);
    int64_t ids[8];
    snprintf(path, sizeof path, "%s.0", file);
    ck_assert_int_eq(read_ids(path, ids, 8), 3);
    ck_assert(ids[0] == 1 && ids[2] == 3);
    snprintf(path, sizeof path, "%s.1", file);
    ck_assert_int_eq(read_ids(path, ids, 8), 3);
    ck_assert(ids[0] == 4 && ids[2] == 6);
    snprintf(path, sizeof path, "%s.2", file);
    ck_assert_int_ne(access(path, F_OK), 0); /* the 7th is held */
    tp_trace_free(t);
    ck_assert_int_eq(read_ids(path, ids, 8), 1);
    ck_assert_int_eq(ids[0], 7);
    tu_rmdir(dir);
}
END_TEST

/* The stored request_id of a trace recorded with id. */
static char *recorded_id(const char *id)
{
    make_dir();
    tp_trace *t = create(file, 1, 1, 0);
    tp_trace_stamps s = {1, 2, 3, 4, 5, 6, 7};
    tp_trace_record(t, tp_trace_sample(t), "m", "1", id, &s);
    tp_trace_free(t);
    json_t *doc = json_load_file(file, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    char *got = strdup(json_string_value(json_object_get(json_array_get(doc, 0), "request_id")));
    json_decref(doc);
    tu_rmdir(dir);
    return got;
}

/* A 512 KiB request id is kept to its first TP_TRACE_REQUEST_ID_MAX
 * bytes, cut before a UTF-8 character the limit would split. */
START_TEST(long_request_id_truncated)
{
    size_t big = 512 * 1024;
    char *id = malloc(big + 1);
    memset(id, 'a', big);
    id[big] = '\0';
    char *got = recorded_id(id);
    ck_assert_uint_eq(strlen(got), TP_TRACE_REQUEST_ID_MAX);
    ck_assert(memcmp(got, id, TP_TRACE_REQUEST_ID_MAX) == 0);
    free(got);
    ck_assert_uint_eq(tp_trace_request_id_len(id), TP_TRACE_REQUEST_ID_MAX);
    /* "é" (c3 a9) across the limit: cut before it, not inside */
    id[TP_TRACE_REQUEST_ID_MAX - 1] = (char)0xc3;
    id[TP_TRACE_REQUEST_ID_MAX] = (char)0xa9;
    got = recorded_id(id);
    ck_assert_uint_eq(strlen(got), TP_TRACE_REQUEST_ID_MAX - 1);
    free(got);
    /* one of TP_TRACE_REQUEST_ID_MAX bytes, ending in "é", is whole */
    memset(id, 'a', TP_TRACE_REQUEST_ID_MAX);
    id[TP_TRACE_REQUEST_ID_MAX - 2] = (char)0xc3;
    id[TP_TRACE_REQUEST_ID_MAX - 1] = (char)0xa9;
    id[TP_TRACE_REQUEST_ID_MAX] = '\0';
    got = recorded_id(id);
    ck_assert_str_eq(got, id);
    free(got);
    free(id);
}
END_TEST

static Suite *trace_suite(void)
{
    Suite *s = suite_create("trace");
    TCase *t = tcase_create("core");
    tcase_add_test(t, defaults_and_refusals);
    tcase_add_test(t, model_settings_over_global);
    tcase_add_test(t, rate_and_count);
    tcase_add_test(t, files_by_log_frequency);
    tcase_add_test(t, request_id_escaped);
    tcase_add_test(t, planted_symlink_left_alone);
    tcase_add_test(t, max_pending_drops_oldest_at_exit);
    tcase_add_test(t, max_pending_writes_early_with_log_frequency);
    tcase_add_test(t, long_request_id_truncated);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(trace_suite)
