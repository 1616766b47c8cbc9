/* test_config.c — serve settings: defaults, the JSON file, flag overrides,
 * and the errors for unknown keys, wrong types and out-of-range values. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "testutil.h"
#include "config.h"
#include "log.h"
#include "spin_wait.h"

static tp_status load_text(tp_config *c, const char *text, tp_err *e, char *path)
{
    tu_write_tmp(path, text, strlen(text));
    tp_status st = tp_config_load_file(c, path, e);
    unlink(path);
    return st;
}

START_TEST(defaults)
{
    tp_config c;
    tp_config_defaults(&c);
    ck_assert_str_eq(c.host, "127.0.0.1");
    ck_assert_int_eq(c.port, 8000);
    ck_assert_str_eq(c.backend, "cpu");
    ck_assert_int_eq(c.threads, 0); /* one per usable core */
    ck_assert(c.max_body_bytes == 64 * 1024 * 1024);
    ck_assert_int_eq(c.request_timeout_ms, 30000);
    ck_assert_int_eq(c.drain_timeout_ms, 10000);
    ck_assert_str_eq(c.log_level, "info");
    ck_assert_str_eq(c.graph, "");
    ck_assert_int_eq(c.staging_mb, 0); /* ranks=processes: sized for the largest bucket */
    tp_err e;
    /* defaults alone lack a graph, and say how to give one */
    ck_assert_int_eq(tp_config_validate(&c, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "no graph given: pass --graph FILE"));
}
END_TEST

START_TEST(file_then_flags)
{
    tp_config c;
    tp_config_defaults(&c);
    tp_err e;
    char path[64];
    ck_assert_int_eq(load_text(&c, "{\"port\": 9001, \"graph\": \"g.json\", \"threads\": 2,"
                                   " \"max_body_bytes\": 1099511627776, \"log_level\": \"debug\"}",
                               &e, path),
                     TP_OK);
    ck_assert_int_eq(c.port, 9001);
    ck_assert_str_eq(c.graph, "g.json");
    ck_assert_int_eq(c.threads, 2);
    ck_assert(c.max_body_bytes == (int64_t)1 << 40);
    ck_assert_str_eq(c.log_level, "debug");
    ck_assert_str_eq(c.host, "127.0.0.1"); /* untouched keys keep their value */
    /* flags override the file, in either spelling */
    ck_assert_int_eq(tp_config_set(&c, "port", "9002", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "max-body-bytes", "1024", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "drain_timeout_ms", "0", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "backend", "auto", &e), TP_OK);
    ck_assert_int_eq(c.port, 9002);
    ck_assert(c.max_body_bytes == 1024);
    ck_assert_int_eq(c.drain_timeout_ms, 0);
    ck_assert_str_eq(c.backend, "auto");
    ck_assert_int_eq(tp_config_validate(&c, &e), TP_OK);
}
END_TEST

/* The backends' settings are typed keys like any other (no environment). */
START_TEST(backend_settings_keys)
{
    tp_config c;
    tp_config_defaults(&c);
    tp_err e;
    ck_assert_int_eq(c.backend_settings.cuda_scratch_mb, 64);
    ck_assert_int_eq(tp_config_set(&c, "verify-replay", "1", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "cuda_scratch_mb", "128", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "cuda-barrier-timeout-ms", "5000", &e), TP_OK);
    ck_assert_int_eq(c.backend_settings.verify_replay, 1);
    ck_assert_int_eq(c.backend_settings.cuda_scratch_mb, 128);
    ck_assert_int_eq(c.backend_settings.cuda_barrier_timeout_ms, 5000);
    ck_assert_int_eq(tp_config_set(&c, "cuda_check_collectives", "2", &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "cuda_check_collectives"));
    ck_assert_int_eq(tp_config_set(&c, "cuda_barrier_timeout_ms", "0", &e), TP_INVALID);
}
END_TEST

START_TEST(default_json_matches_defaults)
{
    /* config/default.json is what `make run` serves; it must load cleanly
     * and agree with the built-in defaults except for naming the graph. */
    tp_config a, b;
    tp_config_defaults(&a);
    tp_config_defaults(&b);
    tp_err e;
    const char *path = "config/default.json";
    if (access(path, R_OK) != 0)
        path = "../../config/default.json";
    ck_assert_msg(tp_config_load_file(&a, path, &e) == TP_OK, "%s", e.msg);
    ck_assert_str_eq(a.graph, "build/graphs/mlp_sp_tp2.json");
    snprintf(b.graph, sizeof b.graph, "%s", a.graph);
    ck_assert_mem_eq(&a, &b, sizeof a);
}
END_TEST

START_TEST(file_errors)
{
    tp_config c;
    tp_config_defaults(&c);
    tp_err e;
    char path[64];
    ck_assert_int_eq(load_text(&c, "{\"port\": 1, \"colour\": \"red\"}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "unknown key 'colour'"));
    ck_assert_ptr_nonnull(strstr(e.msg, path)); /* names the file */
    ck_assert_ptr_nonnull(strstr(e.msg, "known keys: graph, host, port"));
    ck_assert_int_eq(load_text(&c, "{\"max-body-bytes\": 1}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "unknown key 'max-body-bytes'"));
    ck_assert_int_eq(load_text(&c, "{\"port\": \"8000\"}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'port' must be an integer, got a string"));
    ck_assert_int_eq(load_text(&c, "{\"threads\": 2.5}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'threads' must be an integer, got a real number"));
    ck_assert_int_eq(load_text(&c, "{\"host\": 1}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'host' must be a string, got an integer"));
    ck_assert_int_eq(load_text(&c, "{\"port\": 70000}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'port' must be in [0, 65535], got 70000"));
    ck_assert_int_eq(load_text(&c, "{\"backend\": \"tpu\"}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'backend' must be one of cpu|cuda|auto, got 'tpu'"));
    ck_assert_int_eq(load_text(&c, "{\"log_level\": \"loud\"}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'log_level' must be one of error|warn|info|debug"));
    ck_assert_int_eq(load_text(&c, "{\"ranks\": \"gpus\"}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'ranks' must be one of threads|processes, got 'gpus'"));
    ck_assert_int_eq(load_text(&c, "{\"staging_mb\": -1}", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'staging_mb' must be in [0,"));
    ck_assert_int_eq(load_text(&c, "{\"staging_mb\": 0}", &e, path), TP_OK); /* sized from the graph */
    ck_assert_int_eq(c.staging_mb, 0);
    {
        tp_config r;
        tp_config_defaults(&r);
        snprintf(r.graph, sizeof r.graph, "g.json");
        ck_assert_int_eq(tp_config_set(&r, "rendezvous", "/tmp/x.sock", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_INVALID); /* ranks is still threads */
        ck_assert_ptr_nonnull(strstr(e.msg, "'rendezvous' needs 'ranks' processes (got 'threads')"));
        ck_assert_int_eq(tp_config_set(&r, "ranks", "processes", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_OK);
    }
    {   /* model instances: 1 to 8, above 1 only cpu with ranks as threads */
        tp_config r;
        tp_config_defaults(&r);
        snprintf(r.graph, sizeof r.graph, "g.json");
        ck_assert_int_eq(r.instances, 1);
        ck_assert_int_eq(tp_config_set(&r, "instances", "9", &e), TP_INVALID);
        ck_assert_ptr_nonnull(strstr(e.msg, "'instances' must be in [1, 8], got 9"));
        ck_assert_int_eq(tp_config_set(&r, "instances", "2", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_OK);
        ck_assert_int_eq(tp_config_set(&r, "ranks", "processes", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_INVALID);
        ck_assert_ptr_nonnull(strstr(e.msg, "'instances' 2 needs backend cpu and ranks threads (got backend 'cpu', "
                                            "ranks 'processes')"));
        ck_assert_int_eq(tp_config_set(&r, "ranks", "threads", &e), TP_OK);
        ck_assert_int_eq(tp_config_set(&r, "backend", "cuda", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_INVALID);
        ck_assert_ptr_nonnull(strstr(e.msg, "got backend 'cuda', ranks 'threads'"));
    }
    {   /* a stuck step turns readiness 503 before the step timeout loses the group */
        tp_config r;
        tp_config_defaults(&r);
        snprintf(r.graph, sizeof r.graph, "g.json");
        ck_assert_int_eq(tp_config_set(&r, "step_timeout_ms", "3000", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_INVALID); /* stuck_step_ms is still 60000 */
        ck_assert_ptr_nonnull(strstr(e.msg, "'stuck_step_ms' 60000 must be below 'step_timeout_ms' 3000"));
        ck_assert_int_eq(tp_config_set(&r, "stuck_step_ms", "3000", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_INVALID);
        ck_assert_int_eq(tp_config_set(&r, "stuck_step_ms", "2999", &e), TP_OK);
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_OK);
        ck_assert_int_eq(tp_config_set(&r, "stuck_step_ms", "0", &e), TP_OK); /* never */
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_OK);
        ck_assert_int_eq(tp_config_set(&r, "stuck_step_ms", "5000", &e), TP_OK);
        ck_assert_int_eq(tp_config_set(&r, "step_timeout_ms", "0", &e), TP_OK); /* no timeout */
        ck_assert_int_eq(tp_config_validate(&r, &e), TP_OK);
    }
    ck_assert_int_eq(load_text(&c, "[1]", &e, path), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "top level must be a JSON object, got an array"));
    ck_assert_int_eq(load_text(&c, "{\"port\": 1,}", &e, path), TP_PARSE);
    ck_assert_ptr_nonnull(strstr(e.msg, "line 1 column"));
    ck_assert_int_eq(load_text(&c, "{\"port\": 1, \"port\": 2}", &e, path), TP_PARSE);
    ck_assert_ptr_nonnull(strstr(e.msg, "duplicate"));
    ck_assert_int_eq(tp_config_load_file(&c, "/nonexistent/tp.json", &e), TP_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "config file '/nonexistent/tp.json'"));
    /* failures leave earlier good values; nothing half-applied is relied on */
    ck_assert_int_eq(c.port, 1);
}
END_TEST

START_TEST(flag_errors)
{
    tp_config c;
    tp_config_defaults(&c);
    tp_err e;
    ck_assert_int_eq(tp_config_set(&c, "port", "80x", &e), TP_INVALID);
    ck_assert_str_eq(e.msg, "--port: '80x' is not an integer");
    ck_assert_int_eq(tp_config_set(&c, "port", "", &e), TP_INVALID);
    ck_assert_int_eq(tp_config_set(&c, "threads", "-1", &e), TP_INVALID);
    ck_assert_str_eq(e.msg, "--threads: 'threads' must be in [0, 256], got -1");
    ck_assert_int_eq(tp_config_set(&c, "max_body_bytes", "99999999999999999999", &e), TP_INVALID);
    ck_assert_str_eq(e.msg, "--max-body-bytes: '99999999999999999999' is not an integer");
    ck_assert_int_eq(tp_config_set(&c, "colour", "red", &e), TP_INVALID);
    ck_assert_str_eq(e.msg, "unknown option '--colour'");
    ck_assert_int_eq(tp_config_set(&c, "log-level", "trace", &e), TP_INVALID);
    ck_assert_int_eq(c.port, 8000);
    char long_host[300];
    memset(long_host, 'h', sizeof long_host - 1);
    long_host[sizeof long_host - 1] = '\0';
    ck_assert_int_eq(tp_config_set(&c, "host", long_host, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "--host: 'host' is too long (at most 255 bytes)"));
}
END_TEST

/* The availability keys (server/http_guard.h): sidecar defaults, flags,
 * ranges. */
START_TEST(availability_keys)
{
    tp_config c;
    tp_config_defaults(&c);
    ck_assert_int_eq(c.max_connections, 4096);
    ck_assert_int_eq(c.max_connections_per_ip, 0);
    ck_assert_int_eq(c.request_deadline_ms, 30000);
    ck_assert_int_eq(c.health_port, -1);
    tp_err e;
    ck_assert_int_eq(tp_config_set(&c, "health-port", "0", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "max-connections-per-ip", "8", &e), TP_OK);
    ck_assert_int_eq(tp_config_set(&c, "request_deadline_ms", "0", &e), TP_OK);
    ck_assert_int_eq(c.health_port, 0);
    ck_assert_int_eq(c.max_connections_per_ip, 8);
    ck_assert_int_eq(c.request_deadline_ms, 0);
    ck_assert_int_eq(tp_config_set(&c, "health_port", "-2", &e), TP_INVALID);
    ck_assert_str_eq(e.msg, "--health-port: 'health_port' must be in [-1, 65535], got -2");
    ck_assert_int_eq(tp_config_set(&c, "max_connections", "15", &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'max_connections' must be in [16, "));
    ck_assert_int_eq(c.connection_memory_bytes, 8192);
    ck_assert_int_eq(tp_config_set(&c, "connection-memory-bytes", "4096", &e), TP_OK);
    ck_assert_int_eq(c.connection_memory_bytes, 4096);
    ck_assert_int_eq(tp_config_set(&c, "connection_memory_bytes", "4095", &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'connection_memory_bytes' must be in [4096, "));
}
END_TEST

START_TEST(validate_and_usage)
{
    tp_config c;
    tp_config_defaults(&c);
    snprintf(c.graph, sizeof c.graph, "g.json");
    tp_err e;
    ck_assert_int_eq(tp_config_validate(&c, &e), TP_OK);
    c.threads = 257; /* set directly, bypassing the setters */
    ck_assert_int_eq(tp_config_validate(&c, &e), TP_INVALID);
    ck_assert_ptr_nonnull(strstr(e.msg, "'threads' must be in [0, 256], got 257"));
    char buf[4096] = {0};
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    tp_config_usage(f);
    fclose(f);
    ck_assert_ptr_nonnull(strstr(buf, "--max-body-bytes"));
    ck_assert_ptr_nonnull(strstr(buf, "max_body_bytes"));
    ck_assert_ptr_nonnull(strstr(buf, "(default 67108864)"));
    ck_assert_ptr_nonnull(strstr(buf, "cpu|cuda|auto"));
}
END_TEST

START_TEST(http_threads_auto)
{
    tp_config c;
    tp_config_defaults(&c);
    int cores = tp_spin_cores(), want = cores < 2 ? 2 : cores > 16 ? 16 : cores;
    ck_assert_int_eq(tp_config_http_threads(&c), want); /* 0: one per usable core, 2 to 16 */
    c.threads = 3;
    ck_assert_int_eq(tp_config_http_threads(&c), 3); /* a number is taken as given */
    c.threads = 64;
    ck_assert_int_eq(tp_config_http_threads(&c), 64);
}
END_TEST

START_TEST(log_levels)
{
    tp_log_level l;
    ck_assert_int_eq(tp_log_level_from_name("debug", &l), 0);
    ck_assert_int_eq(l, TP_LOG_DEBUG);
    ck_assert_int_eq(tp_log_level_from_name("verbose", &l), -1);
    tp_log_set_level(TP_LOG_WARN);
    ck_assert(tp_log_enabled(TP_LOG_ERROR) && tp_log_enabled(TP_LOG_WARN));
    ck_assert(!tp_log_enabled(TP_LOG_INFO));
    tp_log_set_level(TP_LOG_INFO);
    ck_assert_str_eq(tp_log_level_name(TP_LOG_WARN), "warn");
}
END_TEST

static Suite *config_suite(void)
{
    Suite *s = suite_create("config");
    TCase *t = tcase_create("config");
    tcase_add_test(t, defaults);
    tcase_add_test(t, file_then_flags);
    tcase_add_test(t, default_json_matches_defaults);
    tcase_add_test(t, availability_keys);
    tcase_add_test(t, backend_settings_keys);
    tcase_add_test(t, file_errors);
    tcase_add_test(t, flag_errors);
    tcase_add_test(t, validate_and_usage);
    tcase_add_test(t, log_levels);
    tcase_add_test(t, http_threads_auto);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(config_suite)
