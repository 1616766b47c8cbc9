#include "cli.h"

#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "graph.h"
#include "plan_report.h"
#include "safetensors.h"

void tp_cli_usage(FILE *out)
{
    fprintf(out,
            "  tpserve run GRAPH.json --inputs IN.safetensors --output OUT.safetensors [--backend cpu]\n"
            "      run the graph once on global (unsharded) inputs, write global outputs\n"
            "  tpserve plan GRAPH.json [--json] [--batch B]\n"
            "      load, validate and print the graph after shape inference\n");
}

static int fail(const char *cmd, const char *msg)
{
    fprintf(stderr, "tpserve %s: %s\n", cmd, msg);
    return 1;
}

/* Global input tensors straight from the mmap'd inputs file. */
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
        h->data = (void *)st_data(f, t);
    }
    return TP_OK;
}

/* The mapping may be unaligned for the element type: copy each input into
 * its own malloc'd buffer so kernels see naturally aligned data. */
static tp_status align_inputs(tp_host_tensor *in, int n, tp_err *err)
{
    for (int i = 0; i < n; i++) {
        void *p = malloc(in[i].nbytes ? in[i].nbytes : 1);
        if (!p)
            return tp_fail(err, TP_NOMEM, "input '%s': out of memory", in[i].name);
        memcpy(p, in[i].data, in[i].nbytes);
        in[i].data = p;
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
                          const char *backend, tp_err *err)
{
    tp_engine_opts opts = {backend};
    tp_engine *e = NULL;
    st_file *f = NULL;
    tp_host_tensor *in = NULL, *outs = NULL;
    int n_in = 0, n_out = 0;
    tp_status st = tp_engine_create(graph, &opts, &e, err);
    if (st == TP_OK)
        st = st_open(in_path, &f, err);
    if (st == TP_OK)
        st = read_inputs(f, &in, &n_in, err);
    if (st == TP_OK)
        st = align_inputs(in, n_in, err);
    if (st == TP_OK)
        st = tp_engine_infer(e, in, n_in, &outs, &n_out, err);
    if (st == TP_OK)
        st = write_outputs(out_path, outs, n_out, err);
    tp_host_tensors_free(outs, n_out);
    for (int i = 0; in && f && i < n_in; i++)
        if (in[i].data != st_data(f, st_info(f, i)))
            free(in[i].data);
    free(in);
    if (f)
        st_close(f);
    tp_engine_free(e);
    return st;
}

int tp_cli_run(int argc, char **argv)
{
    const char *graph = NULL, *in = NULL, *out = NULL, *backend = "cpu";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--inputs") == 0 && i + 1 < argc)
            in = argv[++i];
        else if (strcmp(argv[i], "--output") == 0 && i + 1 < argc)
            out = argv[++i];
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc)
            backend = argv[++i];
        else if (argv[i][0] != '-' && !graph)
            graph = argv[i];
        else
            return fail("run", "usage: tpserve run GRAPH.json --inputs IN.safetensors --output OUT.safetensors [--backend cpu]");
    }
    if (!graph || !in || !out)
        return fail("run", "usage: tpserve run GRAPH.json --inputs IN.safetensors --output OUT.safetensors [--backend cpu]");
    tp_err err = {{0}};
    if (run_once(graph, in, out, backend, &err) != TP_OK)
        return fail("run", err.msg);
    return 0;
}

int tp_cli_plan(int argc, char **argv)
{
    const char *graph = NULL;
    int json = 0;
    long long batch = 1;
    for (int i = 1; i < argc; i++) {
        char *end;
        if (strcmp(argv[i], "--json") == 0)
            json = 1;
        else if (strcmp(argv[i], "--batch") == 0 && i + 1 < argc) {
            batch = strtoll(argv[++i], &end, 10);
            if (*end || batch < 1)
                return fail("plan", "--batch needs a positive integer");
        } else if (argv[i][0] != '-' && !graph)
            graph = argv[i];
        else
            return fail("plan", "usage: tpserve plan GRAPH.json [--json] [--batch B]");
    }
    if (!graph)
        return fail("plan", "usage: tpserve plan GRAPH.json [--json] [--batch B]");
    tp_err err = {{0}};
    tp_graph *g;
    tp_status st = tp_graph_load(graph, &g, &err);
    if (st == TP_OK) {
        st = tp_plan_report(g, batch, json, stdout, &err);
        tp_graph_free(g);
    }
    return st == TP_OK ? 0 : fail("plan", err.msg);
}
