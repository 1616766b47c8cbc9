#include "cli.h"

#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "safetensors.h"
#include "worker.h"

void tp_cli_usage(FILE *out)
{
    fprintf(out,
            "  tpserve run GRAPH.json --inputs IN.safetensors --output OUT.safetensors [--backend cpu]\n"
            "              [--no-passes] [--disable-pass NAME] [--eager] [--verify-replay]\n"
            "              [--ranks threads|processes] [--buckets LIST] [--staging-mb N]\n"
            "      run the graph once on global (unsharded) inputs, write global outputs\n"
            "      (--ranks processes: one process per rank, as on GPUs; --buckets and\n"
            "      --staging-mb as for serve: staging 0, the default, fits the largest bucket)\n"
            "  tpserve plan GRAPH.json [--json] [--batch B] [--backend cpu|cuda|auto] [--buckets LIST]\n"
            "              [--no-passes] [--disable-pass NAME]\n"
            "      compile as `run`/`serve` would (no device needed) and print the executable\n"
            "      a batch of B runs in (its bucket): nodes, collectives and their lowering,\n"
            "      partitions, hoisted buffers, input copies and memory (passes: fuse_tp\n"
            "      insert_contiguous choose_collectives place_symmetric)\n");
}

static int fail(const char *cmd, const char *msg)
{
    fprintf(stderr, "tpserve %s: %s\n", cmd, msg);
    return 1;
}

/* Global input tensors read from the inputs file, each into its own
 * malloc'd (so naturally aligned) buffer. */
static tp_status read_inputs(st_file *f, tp_host_tensor **out, int *n, tp_err *err)
{
    *n = st_count(f);
    *out = calloc((size_t)*n + 1, sizeof **out);
    if (!*out)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < *n; i++) {
        const st_tensor_info *t = st_info(f, i);
        tp_host_tensor *h = &(*out)[i];
        if (strlen(t->name) >= sizeof h->name)
            return tp_fail(err, TP_INVALID, "%s: tensor name '%s' is too long", st_path(f), t->name);
        strcpy(h->name, t->name);
        h->dtype = t->dtype;
        h->ndim = t->ndim;
        memcpy(h->shape, t->shape, sizeof h->shape);
        h->nbytes = (size_t)(t->end - t->begin);
        if (!(h->data = malloc(h->nbytes ? h->nbytes : 1)))
            return tp_fail(err, TP_NOMEM, "input '%s': out of memory", t->name);
        tp_status st = st_read_shard(f, t, -1, 0, 1, h->data, err);
        if (st != TP_OK)
            return st;
    }
    return TP_OK;
}

static tp_status write_outputs(const char *path, const tp_host_tensor *outs, int n, tp_err *err)
{
    st_write_item items[n + 1];
    for (int i = 0; i < n; i++)
        items[i] = (st_write_item){outs[i].name, outs[i].dtype, outs[i].ndim, outs[i].shape, outs[i].data};
    return st_write(path, items, n, err);
}

static tp_status run_once(const char *graph, const char *in_path, const char *out_path,
                          const tp_engine_opts *opts, tp_err *err)
{
    tp_engine *e = NULL;
    st_file *f = NULL;
    tp_host_tensor *in = NULL, *outs = NULL;
    int n_in = 0, n_out = 0;
    tp_status st = tp_engine_create(graph, opts, &e, err);
    if (st == TP_OK)
        st = st_open(in_path, &f, err);
    if (st == TP_OK)
        st = read_inputs(f, &in, &n_in, err);
    if (st == TP_OK)
        st = tp_engine_infer(e, in, n_in, &outs, &n_out, err);
    if (st == TP_OK)
        st = write_outputs(out_path, outs, n_out, err);
    tp_host_tensors_free(outs, n_out);
    for (int i = 0; in && i < n_in; i++)
        free(in[i].data);
    free(in);
    if (f)
        st_close(f);
    tp_engine_free(e);
    return st;
}

#define RUN_USAGE "usage: tpserve run GRAPH.json --inputs IN.safetensors --output OUT.safetensors [--backend cpu] " \
                  "[--no-passes] [--disable-pass NAME] [--eager] [--verify-replay] [--ranks threads|processes] " \
                  "[--buckets LIST] [--staging-mb N]"

/* --ranks processes: this process is rank 0, workers run the same options
 * (buckets: the text they were parsed from). staging_mb 0: the engine sizes
 * the staging for the largest bucket. */
static tp_status run_in_processes(const char *graph, const char *in, const char *out, tp_engine_opts *opts,
                                  const char *buckets, int staging_mb, tp_err *err)
{
    tp_worker_spec ws = {graph, opts->backend, buckets, opts->disable_passes, opts->no_passes, opts->eager,
                         (int)opts->state_slots};
    char **argv = tp_worker_argv(&ws);
    if (!argv)
        return tp_fail(err, TP_NOMEM, "out of memory");
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv,
                             .staging_bytes = (size_t)staging_mb << 20};
    opts->group = &go;
    tp_status st = run_once(graph, in, out, opts, err);
    tp_worker_argv_free(argv);
    return st;
}

int tp_cli_run(int argc, char **argv)
{
    const char *graph = NULL, *in = NULL, *out = NULL, *ranks = "threads", *bucket_text = NULL;
    int64_t buckets[TP_MAX_BUCKETS];
    int staging_mb = 0;
    tp_backend_settings settings;
    tp_backend_settings_default(&settings);
    tp_engine_opts opts = {.backend = "cpu", .settings = &settings};
    tp_err err = {{0}};
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--no-passes") == 0)
            opts.no_passes = 1;
        else if (strcmp(argv[i], "--eager") == 0)
            opts.eager = 1;
        else if (strcmp(argv[i], "--verify-replay") == 0)
            settings.verify_replay = 1;
        else if (strcmp(argv[i], "--disable-pass") == 0 && i + 1 < argc)
            opts.disable_passes = argv[++i];
        else if (strcmp(argv[i], "--inputs") == 0 && i + 1 < argc)
            in = argv[++i];
        else if (strcmp(argv[i], "--output") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            opts.backend = argv[++i];
        else if (strcmp(argv[i], "--ranks") == 0 && i + 1 < argc)
            ranks = argv[++i];
        else if (strcmp(argv[i], "--buckets") == 0 && i + 1 < argc) {
            bucket_text = argv[++i];
            opts.buckets = buckets;
            if (tp_parse_buckets(bucket_text, buckets, &opts.n_buckets, &err) != TP_OK)
                return fail("run", err.msg);
        } else if (strcmp(argv[i], "--staging-mb") == 0 && i + 1 < argc) {
            long v = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || v < 0 || v > (1L << 20))
                return fail("run", "--staging-mb needs an integer in [0, 1048576] (0: sized for the largest bucket)");
            staging_mb = (int)v;
        } else if (argv[i][0] != '-' && !graph)
            graph = argv[i];
        else
            return fail("run", RUN_USAGE);
    }
    if (!graph || !in || !out || (strcmp(ranks, "threads") && strcmp(ranks, "processes")))
        return fail("run", RUN_USAGE);
    tp_status st = strcmp(ranks, "processes") == 0
                       ? run_in_processes(graph, in, out, &opts, bucket_text, staging_mb, &err)
                       : run_once(graph, in, out, &opts, &err);
    if (st != TP_OK)
        return fail("run", err.msg);
    return 0;
}

#define PLAN_USAGE "usage: tpserve plan GRAPH.json [--json] [--batch B] [--backend cpu|cuda|auto] [--buckets LIST] " \
                   "[--no-passes] [--disable-pass NAME]..."

int tp_cli_plan(int argc, char **argv)
{
    const char *graph = NULL;
    int64_t batch = 1, buckets[TP_MAX_BUCKETS];
    int json = 0;
    char disabled[256] = "";
    size_t used = 0;
    tp_engine_opts opts = {.backend = "cpu"};
    tp_err err = {{0}};
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            batch = strtoll(argv[++i], &end, 10);
            if (*end || batch < 1)
                return fail("plan", "--batch needs a positive integer");
        } else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            opts.backend = argv[++i];
        else if (strcmp(argv[i], "--buckets") == 0 && i + 1 < argc) {
            opts.buckets = buckets;
            if (tp_parse_buckets(argv[++i], buckets, &opts.n_buckets, &err) != TP_OK)
                return fail("plan", err.msg);
        } else if (strcmp(argv[i], "--no-passes") == 0)
            opts.no_passes = 1;
        else if (strcmp(argv[i], "--disable-pass") == 0 && i + 1 < argc) {
            used += (size_t)snprintf(disabled + used, sizeof disabled - used, "%s%s", used ? "," : "", argv[++i]);
            if (used >= sizeof disabled)
                return fail("plan", "too many --disable-pass names");
            opts.disable_passes = disabled;
        } else if (argv[i][0] != '-' && !graph)
            graph = argv[i];
        else
            return fail("plan", PLAN_USAGE);
    }
    if (!graph)
        return fail("plan", PLAN_USAGE);
    return tp_engine_plan(graph, &opts, batch, json, stdout, &err) == TP_OK ? 0 : fail("plan", err.msg);
}
