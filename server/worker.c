#include "worker.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine.h"

#define MAX_ARGS 16

char **tp_worker_argv(const tp_worker_spec *s)
{
    const char *a[MAX_ARGS];
    int n = 0;
    a[n++] = "/proc/self/exe";
    a[n++] = "worker";
    a[n++] = s->graph;
    if (s->backend) {
        a[n++] = "--backend";
        a[n++] = s->backend;
    }
    if (s->buckets && *s->buckets) {
        a[n++] = "--buckets";
        a[n++] = s->buckets;
    }
    if (s->disable_passes && *s->disable_passes) {
        a[n++] = "--disable-pass";
        a[n++] = s->disable_passes;
    }
    char slots[24];
    if (s->slots > 0) {
        snprintf(slots, sizeof slots, "%d", s->slots);
        a[n++] = "--slots";
        a[n++] = slots;
    }
    if (s->no_passes)
        a[n++] = "--no-passes";
    if (s->eager)
        a[n++] = "--eager";
    char **argv = calloc((size_t)n + 1, sizeof *argv);
    for (int i = 0; argv && i < n; i++)
        if (!(argv[i] = strdup(a[i]))) {
            tp_worker_argv_free(argv);
            return NULL;
        }
    return argv;
}

/* 0 when text is a slot count in [1, 65536] (stored in *out) */
static int parse_slots(const char *text, int64_t *out)
{
    char *end;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < 1 || v > 65536)
        return -1;
    *out = v;
    return 0;
}

void tp_worker_argv_free(char **argv)
{
    for (int i = 0; argv && argv[i]; i++)
        free(argv[i]);
    free(argv);
}

void tp_worker_usage(FILE *out)
{
    fprintf(out,
            "  tpserve worker GRAPH.json [--rendezvous PATH [--rendezvous-secret-file F]]\n"
            "              [--backend B] [--buckets LIST] [--slots N] [--no-passes] [--disable-pass NAME] [--eager]\n"
            "      one rank of a process group (RANK/WORLD_SIZE, or TP_RANK/TP_WORLD_SIZE\n"
            "      from a leader); started by `serve --ranks processes`, or by hand with\n"
            "      --rendezvous to join a leader started with the same PATH, presenting the\n"
            "      group secret from F (or TP_RENDEZVOUS_SECRET_FILE; default PATH.secret)\n");
}

static int env_int(const char *a, const char *b, int dflt)
{
    const char *v = getenv(a);
    if (!v)
        v = getenv(b);
    return v ? atoi(v) : dflt;
}

static int fail(const char *msg, int rank)
{
    fprintf(stderr, "tpserve worker rank %d: %s\n", rank, msg);
    return 1;
}

/* A failed engine left to the process's exit (tp_worker_main): reachable
 * here, so not a leak. */
static tp_engine *worker_left_to_exit;

int tp_worker_main(int argc, char **argv)
{
    static const char usage[] = "usage: tpserve worker GRAPH.json [--rendezvous PATH [--rendezvous-secret-file F]] "
                                "[--backend B] [--buckets LIST] [--slots N] [--no-passes] [--disable-pass NAME] [--eager]";
    tp_rank_group_opts go = {.mode = TP_GROUP_WORKER};
    go.rank = env_int("TP_RANK", "RANK", -1);
    go.world = env_int("TP_WORLD_SIZE", "WORLD_SIZE", -1);
    tp_engine_opts opts = {.backend = "cpu", .group = &go};
    const char *graph = NULL, *buckets = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--no-passes") == 0)
            opts.no_passes = 1;
        else if (strcmp(argv[i], "--eager") == 0)
            opts.eager = 1;
        else if (strcmp(argv[i], "--disable-pass") == 0 && i + 1 < argc)
            opts.disable_passes = argv[++i];
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            opts.backend = argv[++i];
        else if (strcmp(argv[i], "--buckets") == 0 && i + 1 < argc)
            buckets = argv[++i];
        else if (strcmp(argv[i], "--slots") == 0 && i + 1 < argc) {
            if (parse_slots(argv[++i], &opts.state_slots) != 0)
                return fail("--slots needs an integer in [1, 65536]", go.rank);
        }
        else if (strcmp(argv[i], "--rendezvous") == 0 && i + 1 < argc)
            go.rendezvous = argv[++i];
        else if (strcmp(argv[i], "--rendezvous-secret-file") == 0 && i + 1 < argc)
            go.secret_file = argv[++i];
        else if (argv[i][0] != '-' && !graph)
            graph = argv[i];
        else
            return fail(usage, go.rank);
    }
    if (!graph)
        return fail(usage, go.rank);
    if (go.rank < 1 || go.world < 2)
        return fail("needs RANK (1..WORLD_SIZE-1) and WORLD_SIZE (>= 2) in the environment", go.rank);
    /* the path only: the secret itself never goes in argv or the
     * environment, which other processes may read in /proc */
    if (!go.secret_file)
        go.secret_file = getenv("TP_RENDEZVOUS_SECRET_FILE");
    /* A leader's blocked signals survive exec; this process obeys its own. */
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    tp_err err = {{0}};
    int64_t bk[TP_MAX_BUCKETS];
    opts.buckets = buckets ? bk : NULL;
    tp_engine *e = NULL;
    tp_status st = buckets ? tp_parse_buckets(buckets, bk, &opts.n_buckets, &err) : TP_OK;
    if (st == TP_OK)
        st = tp_engine_create(graph, &opts, &e, &err);
    if (st == TP_OK)
        st = tp_engine_follow(e, &err);
    /* a backend whose device may still run work that never completes: this
     * process exits so that a new one takes its place (the leader sees it
     * go), and the engine is not freed: that work may still read its host
     * memory (staging, the rank heaps), which only the exit may take away
     * (the cuda double's stream threads did read it after the free) */
    if (st != TP_OK && e && tp_engine_must_exit(e)) {
        fprintf(stderr, "tpserve worker rank %d: exiting for a restart: the device may still run work that never "
                        "completes\n", go.rank);
        worker_left_to_exit = e;
        e = NULL;
    }
    tp_engine_free(e);
    /* the leader ending the group early (its own load failed) is its to report */
    if (st == TP_OK || strncmp(err.msg, "quit:", 5) == 0)
        return 0;
    return fail(err.msg, go.rank);
}
