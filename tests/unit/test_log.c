/* test_log.c — util/log.c's lines: a message is one line whatever it
 * quotes. Control bytes from clients (ESC, CR, LF, DEL, NUL's neighbours)
 * are written \xHH, tab passes, a message's own line end is not shown,
 * and a truncated line never ends in half an escape. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "log.h"

/* What one tp_log call writes to stderr, without its timestamp and level
 * (the message after "info  "). malloc'ed. */
static char *logged(const char *fmt, const char *arg)
{
    char path[] = "/tmp/tp_log_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    unlink(path);
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    ck_assert_int_ge(saved, 0);
    ck_assert_int_ge(dup2(fd, STDERR_FILENO), 0);
    tp_log(TP_LOG_INFO, fmt, arg);
    ck_assert_int_ge(dup2(saved, STDERR_FILENO), 0);
    close(saved);
    off_t n = lseek(fd, 0, SEEK_END);
    ck_assert_int_gt(n, 0);
    char *all = calloc(1, (size_t)n + 1);
    ck_assert_int_eq(pread(fd, all, (size_t)n, 0), n);
    close(fd);
    /* one line: a single newline, at its end */
    ck_assert_ptr_eq(strchr(all, '\n'), all + n - 1);
    const char *msg = strstr(all, " info  ");
    ck_assert_ptr_nonnull(msg);
    char *out = strndup(msg + 7, (size_t)(all + n - 1 - (msg + 7)));
    free(all);
    return out;
}

START_TEST(control_bytes_escaped)
{
    char *got = logged("GET %s -> 404", "/v2/models/\x1b[2J\x1b]0;pwned\x07/ready\r\nfake line\x7f\x01");
    ck_assert_str_eq(got, "GET /v2/models/\\x1b[2J\\x1b]0;pwned\\x07/ready\\x0d\\x0afake line\\x7f\\x01 -> 404");
    free(got);
    /* tab and bytes from 0x20 up (UTF-8 included) pass as they are */
    got = logged("%s", "a\tb \xc3\xa9 ~");
    ck_assert_str_eq(got, "a\tb \xc3\xa9 ~");
    free(got);
    /* the message's own line end (libmicrohttpd's messages have one) */
    got = logged("libmicrohttpd: %s", "Error processing request.\n");
    ck_assert_str_eq(got, "libmicrohttpd: Error processing request.");
    free(got);
}
END_TEST

/* A message longer than a line is cut, never in the middle of an escape. */
START_TEST(long_line_cut_whole)
{
    char *esc = malloc(4001);
    memset(esc, 0x1b, 4000);
    esc[4000] = '\0';
    char *got = logged("%s", esc);
    size_t n = strlen(got);
    ck_assert_uint_gt(n, 1000);
    ck_assert_uint_lt(n, 2048);
    ck_assert_uint_eq(n % 4, 0);
    for (size_t i = 0; i < n; i += 4)
        ck_assert(memcmp(got + i, "\\x1b", 4) == 0);
    free(got);
    free(esc);
}
END_TEST

static Suite *log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *t = tcase_create("core");
    tcase_add_test(t, control_bytes_escaped);
    tcase_add_test(t, long_line_cut_whole);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(log_suite)
