/* test_metrics.c — the /metrics registry: every line is valid Prometheus
 * text format 0.0.4 (HELP and TYPE before a family's samples, sample names
 * of the declared family), histogram buckets are cumulative with le
 * inclusive and _count equal to +Inf, counters and labels move as recorded,
 * engine statistics appear once published, and concurrent observations are
 * not lost. */
#include <check.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "metrics.h"

/* The value of the sample line starting with prefix (name plus labels, then
 * a space), or NAN when absent. */
static double sample(const char *text, const char *prefix)
{
    size_t n = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (strncmp(p, prefix, n) == 0 && p[n] == ' ')
            return strtod(p + n + 1, NULL);
    return NAN;
}

static int valid_name(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                 (i > 0 && c >= '0' && c <= '9');
        if (!ok)
            return 0;
    }
    return n > 0;
}

/* A sample of family fam (of type type) may be fam, or fam_bucket/_sum/_count
 * for histograms. */
static int sample_of(const char *name, size_t n, const char *fam, const char *type)
{
    size_t f = strlen(fam);
    if (n == f && strncmp(name, fam, f) == 0)
        return strcmp(type, "histogram") != 0;
    if (strcmp(type, "histogram") != 0 || n <= f || strncmp(name, fam, f) != 0)
        return 0;
    const char *suf = name + f;
    size_t sn = n - f;
    return (sn == 7 && !strncmp(suf, "_bucket", 7)) || (sn == 4 && !strncmp(suf, "_sum", 4)) ||
           (sn == 6 && !strncmp(suf, "_count", 6));
}

/* Checks one sample line: name{k="v",...} value. */
static void check_sample(const char *line, const char *fam, const char *type)
{
    size_t n = strcspn(line, "{ ");
    ck_assert_msg(valid_name(line, n), "bad metric name in '%s'", line);
    ck_assert_msg(sample_of(line, n, fam, type), "'%s' is not a sample of %s %s", line, type, fam);
    const char *p = line + n;
    if (*p == '{') {
        const char *end = strchr(p, '}');
        ck_assert_msg(end && strstr(p, "=\"") && end[-1] == '"', "bad labels in '%s'", line);
        p = end + 1;
    }
    ck_assert_msg(*p == ' ', "no value in '%s'", line);
    char *e;
    strtod(p + 1, &e);
    ck_assert_msg(e != p + 1 && *e == '\0', "bad value in '%s'", line);
}

/* Walks the text: every family has HELP then TYPE, every sample belongs to
 * the last TYPE, no family is declared twice. Returns the family count. */
static int check_format(const char *text)
{
    char fam[128] = "", type[32] = "", seen[4096] = " ";
    int families = 0;
    ck_assert_msg(text[strlen(text) - 1] == '\n', "text must end with a newline");
    char *copy = strdup(text), *save, *line;
    for (line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[128], rest[32];
        if (sscanf(line, "# HELP %127s", name) == 1) {
            ck_assert_msg(strlen(line) > strlen(name) + 8, "HELP without text: %s", line);
            snprintf(fam, sizeof fam, "%s", name);
            type[0] = '\0';
            char key[140];
            snprintf(key, sizeof key, " %s ", name);
            ck_assert_msg(!strstr(seen, key), "family %s declared twice", name);
            strncat(seen, key + 1, sizeof seen - strlen(seen) - 1);
            families++;
        } else if (sscanf(line, "# TYPE %127s %31s", name, rest) == 2) {
            ck_assert_str_eq(name, fam);
            ck_assert_msg(!strcmp(rest, "counter") || !strcmp(rest, "gauge") ||
                          !strcmp(rest, "histogram"), "type %s", rest);
            ck_assert_msg(strcmp(rest, "counter") || strstr(name, "_total"),
                          "counter %s lacks _total", name);
            snprintf(type, sizeof type, "%s", rest);
        } else {
            ck_assert_msg(line[0] != '#', "stray comment: %s", line);
            ck_assert_msg(type[0], "sample before its TYPE: %s", line);
            check_sample(line, fam, type);
        }
    }
    free(copy);
    return families;
}

/* Buckets of one histogram in order: non-decreasing, ending at +Inf equal
 * to _count. */
static void check_cumulative(const char *text, const char *hist)
{
    char prefix[160];
    snprintf(prefix, sizeof prefix, "%s_bucket{le=\"", hist);
    double prev = 0, last = -1;
    int n = 0;
    for (const char *p = strstr(text, prefix); p; p = strstr(p + 1, prefix)) {
        const char *v = strchr(p, ' ') + 1;
        double x = strtod(v, NULL);
        ck_assert_msg(x >= prev, "%s: bucket %.*s drops below %g", hist, (int)(v - p), p, prev);
        prev = last = x;
        n++;
        if (strncmp(p + strlen(prefix), "+Inf\"", 5) == 0)
            break;
    }
    ck_assert_int_gt(n, 1);
    snprintf(prefix, sizeof prefix, "%s_count", hist);
    ck_assert_double_eq(last, sample(text, prefix));
}

START_TEST(fresh_registry_renders_every_family)
{
    tp_metrics *m = tp_metrics_create();
    size_t len;
    char *text = tp_metrics_render(m, &len);
    ck_assert_uint_eq(len, strlen(text));
    ck_assert_int_ge(check_format(text), 14);
    static const char *want[] = {
        "tpserve_request_success_total 0", "tpserve_request_failure_total{code=\"400\"} 0",
        "tpserve_request_failure_total{code=\"503\"} 0", "tpserve_request_failure_total{code=\"504\"} 0",
        "tpserve_inference_count_total 0", "tpserve_execution_count_total 0",
        "tpserve_inflight_requests 0", "tpserve_queue_size 0",
        "tpserve_queue_duration_seconds_count 0", "tpserve_compute_duration_seconds_count 0",
        "tpserve_input_copy_bytes_total{slot=\"symmetric\"} 0",
        "tpserve_input_copy_bytes_total{slot=\"regular\"} 0", "tpserve_arena_bytes{kind=\"output\"} 0",
        "# TYPE tpserve_queue_duration_seconds histogram", "# TYPE tpserve_inflight_requests gauge",
        "# TYPE tpserve_bucket_replays_total counter"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(text, want[i]), "missing '%s' in:\n%s", want[i], text);
    ck_assert_ptr_null(strstr(text, "tpserve_bucket_replays_total{")); /* no engine yet */
    free(text);
    tp_metrics_free(m);
}
END_TEST

START_TEST(histogram_buckets_are_cumulative)
{
    tp_metrics *m = tp_metrics_create();
    /* 0.0001 is a bound: le is inclusive, so it lands in le="0.0001" */
    double q[] = {0.00005, 0.0001, 0.0003, 0.0003, 0.7, 100};
    for (int i = 0; i < 6; i++)
        tp_metrics_inferred(m, 2, q[i], 0.002);
    char *text = tp_metrics_render(m, NULL);
    check_format(text);
    const char *h = "tpserve_queue_duration_seconds_bucket";
    struct {
        const char *le;
        double n;
    } want[] = {{"0.0001", 2}, {"0.00025", 2}, {"0.0005", 4}, {"0.5", 4}, {"1", 5}, {"30", 5}, {"+Inf", 6}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        char p[128];
        snprintf(p, sizeof p, "%s{le=\"%s\"}", h, want[i].le);
        ck_assert_msg(sample(text, p) == want[i].n, "%s: %g, want %g", p, sample(text, p), want[i].n);
    }
    ck_assert_double_eq(sample(text, "tpserve_queue_duration_seconds_count"), 6);
    ck_assert_double_eq_tol(sample(text, "tpserve_queue_duration_seconds_sum"), 100.70075, 1e-6);
    ck_assert_double_eq(sample(text, "tpserve_compute_duration_seconds_bucket{le=\"0.001\"}"), 0);
    ck_assert_double_eq(sample(text, "tpserve_compute_duration_seconds_bucket{le=\"0.0025\"}"), 6);
    ck_assert_double_eq(sample(text, "tpserve_inference_count_total"), 12);
    static const char *hists[] = {"tpserve_queue_duration_seconds", "tpserve_compute_duration_seconds",
                                  "tpserve_request_duration_seconds", "tpserve_batch_size"};
    for (int i = 0; i < 4; i++)
        check_cumulative(text, hists[i]);
    free(text);
    tp_metrics_free(m);
}
END_TEST

START_TEST(requests_by_code_and_gauges)
{
    tp_metrics *m = tp_metrics_create();
    for (int i = 0; i < 3; i++)
        tp_metrics_request(m, 200, 0.001);
    tp_metrics_request(m, 400, 0.001);
    tp_metrics_request(m, 400, 0.001);
    tp_metrics_request(m, 418, 0.001); /* not preset: appears once it happens */
    tp_metrics_batch(m, 3);
    tp_metrics_batch(m, 16);
    tp_metrics_set_gauges(m, 7, 5);
    tp_metrics_engine_wait(m, 0);
    tp_metrics_engine_wait(m, 0);
    tp_metrics_engine_wait(m, 1);
    char *text = tp_metrics_render(m, NULL);
    check_format(text);
    ck_assert_double_eq(sample(text, "tpserve_request_success_total"), 3);
    ck_assert_double_eq(sample(text, "tpserve_request_failure_total{code=\"400\"}"), 2);
    ck_assert_double_eq(sample(text, "tpserve_request_failure_total{code=\"418\"}"), 1);
    ck_assert_double_eq(sample(text, "tpserve_request_failure_total{code=\"404\"}"), 0);
    ck_assert(isnan(sample(text, "tpserve_request_failure_total{code=\"401\"}")));
    ck_assert_double_eq(sample(text, "tpserve_request_duration_seconds_count"), 6);
    ck_assert_double_eq(sample(text, "tpserve_batch_count_total"), 2);
    ck_assert_double_eq(sample(text, "tpserve_batch_size_bucket{le=\"2\"}"), 0);
    ck_assert_double_eq(sample(text, "tpserve_batch_size_bucket{le=\"4\"}"), 1);
    ck_assert_double_eq(sample(text, "tpserve_batch_size_bucket{le=\"16\"}"), 2);
    ck_assert_double_eq(sample(text, "tpserve_batch_size_sum"), 19);
    ck_assert_double_eq(sample(text, "tpserve_engine_wait_total{ended=\"spin\"}"), 2);
    ck_assert_double_eq(sample(text, "tpserve_engine_wait_total{ended=\"sleep\"}"), 1);
    ck_assert_double_eq(sample(text, "tpserve_inflight_requests"), 7);
    ck_assert_double_eq(sample(text, "tpserve_queue_size"), 5);
    free(text);
    tp_metrics_free(m);
}
END_TEST

START_TEST(engine_stats_once_published)
{
    tp_metrics *m = tp_metrics_create();
    tp_engine_stats s = {.requests = 4, .rows = 9, .executions = 5, .n_buckets = 3,
                         .bucket = {1, 2, 4}, .bucket_runs = {1, 0, 3}, .exact_runs = 1,
                         .symmetric_copy_bytes = 4096, .regular_copy_bytes = 512,
                         .arena_bytes = {0, 100, 200, 300, 400}, .world_size = 4, .rank_processes = 1,
                         .rank_group_up = 1};
    tp_metrics_engine_stats(m, &s);
    char *text = tp_metrics_render(m, NULL);
    check_format(text);
    ck_assert_double_eq(sample(text, "tpserve_execution_count_total"), 5);
    ck_assert_double_eq(sample(text, "tpserve_bucket_replays_total{bucket=\"1\"}"), 1);
    ck_assert_double_eq(sample(text, "tpserve_bucket_replays_total{bucket=\"2\"}"), 0);
    ck_assert_double_eq(sample(text, "tpserve_bucket_replays_total{bucket=\"4\"}"), 3);
    ck_assert_double_eq(sample(text, "tpserve_bucket_replays_total{bucket=\"exact\"}"), 1);
    ck_assert_double_eq(sample(text, "tpserve_input_copy_bytes_total{slot=\"symmetric\"}"), 4096);
    ck_assert_double_eq(sample(text, "tpserve_input_copy_bytes_total{slot=\"regular\"}"), 512);
    ck_assert_double_eq(sample(text, "tpserve_arena_bytes{kind=\"regular\"}"), 100);
    ck_assert_double_eq(sample(text, "tpserve_arena_bytes{kind=\"symmetric\"}"), 200);
    ck_assert_double_eq(sample(text, "tpserve_arena_bytes{kind=\"input\"}"), 300);
    ck_assert_double_eq(sample(text, "tpserve_arena_bytes{kind=\"output\"}"), 400);
    ck_assert_double_eq(sample(text, "tpserve_world_size"), 4);
    ck_assert_double_eq(sample(text, "tpserve_rank_processes"), 1);
    ck_assert_double_eq(sample(text, "tpserve_rank_group_up"), 1);
    free(text);
    tp_metrics_free(m);
}
END_TEST

static void *observe_many(void *arg)
{
    tp_metrics *m = arg;
    for (int i = 0; i < 20000; i++)
        tp_metrics_inferred(m, 1, 0.5, 0.25); /* exact in binary: sums compare exactly */
    return NULL;
}

/* Lock-free updates from several threads lose nothing. */
START_TEST(concurrent_observations_are_not_lost)
{
    enum { T = 4 };
    tp_metrics *m = tp_metrics_create();
    pthread_t th[T];
    for (int i = 0; i < T; i++)
        pthread_create(&th[i], NULL, observe_many, m);
    for (int i = 0; i < T; i++)
        pthread_join(th[i], NULL);
    char *text = tp_metrics_render(m, NULL);
    ck_assert_double_eq(sample(text, "tpserve_inference_count_total"), T * 20000);
    ck_assert_double_eq(sample(text, "tpserve_queue_duration_seconds_count"), T * 20000);
    ck_assert_double_eq(sample(text, "tpserve_queue_duration_seconds_sum"), T * 20000 * 0.5);
    ck_assert_double_eq(sample(text, "tpserve_compute_duration_seconds_sum"), T * 20000 * 0.25);
    free(text);
    tp_metrics_free(m);
}
END_TEST

Suite *metrics_suite(void)
{
    Suite *s = suite_create("metrics");
    TCase *tc = tcase_create("metrics");
    tcase_add_test(tc, fresh_registry_renders_every_family);
    tcase_add_test(tc, histogram_buckets_are_cumulative);
    tcase_add_test(tc, requests_by_code_and_gauges);
    tcase_add_test(tc, engine_stats_once_published);
    tcase_add_test(tc, concurrent_observations_are_not_lost);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(metrics_suite)
