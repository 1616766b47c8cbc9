/* double_core.c — the double's configuration, failure injection and rule
 * reports (see cuda_double.h). */
#include "cuda_double.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *const point_names[DBL_FAIL_POINTS] = {
    "alloc", "window", "comm_init", "capture", "replay", "nccl_async", "embed_id", "die",
};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static int fail_point = -1, fail_rank = -1, fail_nth = 1;
static atomic_int calls[DBL_FAIL_POINTS];
static atomic_int breaches;

int dbl_env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int dbl_process_rank(void) { return dbl_env_int("TP_RANK", 0); }

static void parse_fail(void)
{
    const char *v = getenv("TP_DOUBLE_FAIL");
    if (!v || !*v)
        return;
    char name[32] = "";
    int rank = 0, nth = 1;
    if (sscanf(v, "%31[a-z_]:%d:%d", name, &rank, &nth) < 2) {
        fprintf(stderr, "cuda double: ignoring TP_DOUBLE_FAIL=%s (expected point:rank[:nth])\n", v);
        return;
    }
    for (int p = 0; p < DBL_FAIL_POINTS; p++)
        if (strcmp(name, point_names[p]) == 0)
            fail_point = p;
    if (fail_point < 0)
        fprintf(stderr, "cuda double: unknown failure point '%s'\n", name);
    fail_rank = rank;
    fail_nth = nth > 0 ? nth : 1;
}

int dbl_inject(dbl_fail_point point)
{
    pthread_once(&once, parse_fail);
    if ((int)point != fail_point || dbl_process_rank() != fail_rank)
        return 0;
    return atomic_fetch_add(&calls[point], 1) + 1 == fail_nth;
}

void dbl_rule(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    atomic_fetch_add(&breaches, 1);
    char line[640];
    int n = snprintf(line, sizeof line, "cuda double: rule broken on rank %d (pid %d): %s\n", dbl_process_rank(),
                     (int)getpid(), msg);
    fputs(line, stderr);
    const char *log = getenv("TP_DOUBLE_LOG");
    int fd = log && *log ? open(log, O_WRONLY | O_APPEND | O_CREAT, 0600) : -1;
    if (fd >= 0) {
        if (write(fd, line, (size_t)n) != n)
            fputs("cuda double: could not append to TP_DOUBLE_LOG\n", stderr);
        close(fd);
    }
}

int dbl_rule_breaches(void) { return atomic_load(&breaches); }
