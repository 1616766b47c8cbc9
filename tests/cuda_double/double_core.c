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
    "alloc", "window", "comm_init", "capture", "replay", "nccl_async", "embed_id", "die", "ipc_handle", "nccl_stall",
    "ipc_open", "blas_algo", "devcomm", "gather_id",
};

/* Up to this many injections at once (TP_DOUBLE_FAIL, comma-separated):
 * two failures in one step, say. */
#define MAX_FAILS 4

static pthread_once_t once = PTHREAD_ONCE_INIT;
static struct {
    int point, rank, nth;
} fails[MAX_FAILS];
static int n_fails;
static atomic_int calls[DBL_FAIL_POINTS];
static atomic_int breaches;

int dbl_env_int(const char *name, int dflt)
{
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

int dbl_process_rank(void) { return dbl_env_int("TP_RANK", 0); }

/* One "point:rank[:nth]" of TP_DOUBLE_FAIL. */
static void parse_one(const char *v)
{
    char name[32] = "";
    int rank = 0, nth = 1, point = -1;
    if (sscanf(v, "%31[a-z_]:%d:%d", name, &rank, &nth) < 2) {
        fprintf(stderr, "cuda double: ignoring TP_DOUBLE_FAIL entry '%s' (expected point:rank[:nth])\n", v);
        return;
    }
    for (int p = 0; p < DBL_FAIL_POINTS; p++)
        if (strcmp(name, point_names[p]) == 0)
            point = p;
    if (point < 0 || n_fails == MAX_FAILS) {
        fprintf(stderr, "cuda double: ignoring TP_DOUBLE_FAIL entry '%s' (%s)\n", v,
                point < 0 ? "unknown point" : "too many entries");
        return;
    }
    fails[n_fails].point = point;
    fails[n_fails].rank = rank;
    fails[n_fails].nth = nth > 0 ? nth : 1;
    n_fails++;
}

static void parse_fail(void)
{
    const char *v = getenv("TP_DOUBLE_FAIL");
    char buf[256];
    if (!v || !*v)
        return;
    if (strlen(v) >= sizeof buf) {
        fprintf(stderr, "cuda double: ignoring TP_DOUBLE_FAIL (over %zu characters)\n", sizeof buf - 1);
        return;
    }
    strcpy(buf, v);
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        parse_one(t);
}

int dbl_inject(dbl_fail_point point)
{
    pthread_once(&once, parse_fail);
    int me = dbl_process_rank(), hit = 0, counted = 0;
    for (int i = 0; i < n_fails; i++) {
        if (fails[i].point != (int)point || fails[i].rank != me)
            continue;
        if (!counted) /* one count per call, however many entries name the point */
            counted = atomic_fetch_add(&calls[point], 1) + 1;
        hit |= counted == fails[i].nth;
    }
    return hit;
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
