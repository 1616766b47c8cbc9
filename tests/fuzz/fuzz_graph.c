/* libFuzzer harness: a tpgraph file through the whole path the server takes
 * (loader -> passes -> plan -> capture -> one run at batch 1 and 2, padded
 * into buckets), on the cpu backend with ranks as threads; the input's
 * length also picks eager execution or no passes (one in three each).
 *
 * The input is the graph JSON. It sits next to w.safetensors, written once
 * at start-up with parameters of common shapes and every dtype (w, w2, b,
 * table, wi, wh), and, when TP_GRAPHS names a directory, symlinks to the
 * example graphs' weights, so mutated examples still find theirs. Graphs
 * are bounded before the engine sees them (world_size <= 4, 64 MiB of
 * tensors at batch 1): bigger ones are legitimate and merely slow, or fail
 * allocation, which libFuzzer would report as out of memory. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
#include "fuzz_file.h"
#include "graph.h"
#include "safetensors.h"

#define MAX_WORLD 4
#define MAX_BYTES (INT64_C(64) << 20)

static char dir[64], graph_path[96];

static void write_weights(void)
{
    static float w[32 * 32], b[32], table[64 * 32];
    static int32_t wi[16];
    static uint16_t wh[64];
    for (int i = 0; i < 32 * 32; i++)
        w[i] = (float)(i % 7) * 0.01f;
    int64_t s_w[2] = {32, 32}, s_b[1] = {32}, s_t[2] = {64, 32}, s_i[1] = {16}, s_h[2] = {8, 8};
    st_write_item items[] = {
        {"w", TP_F32, 2, s_w, w}, {"w2", TP_F32, 2, s_w, w}, {"b", TP_F32, 1, s_b, b},
        {"table", TP_F32, 2, s_t, table}, {"wi", TP_I32, 1, s_i, wi}, {"wh", TP_F16, 2, s_h, wh},
    };
    char p[128];
    tp_err err;
    snprintf(p, sizeof p, "%s/w.safetensors", dir);
    if (st_write(p, items, (int)(sizeof items / sizeof *items), &err) != TP_OK)
        fprintf(stderr, "fuzz_graph: %s\n", err.msg);
}

static void link_example_weights(const char *graphs)
{
    DIR *d = opendir(graphs);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        size_t n = strlen(e->d_name);
        char from[PATH_MAX], abs[PATH_MAX], to[PATH_MAX];
        if (n <= 12 || strcmp(e->d_name + n - 12, ".safetensors") != 0)
            continue;
        snprintf(from, sizeof from, "%s/%s", graphs, e->d_name);
        snprintf(to, sizeof to, "%s/%s", dir, e->d_name);
        if (realpath(from, abs) && symlink(abs, to) != 0)
            fprintf(stderr, "fuzz_graph: cannot link %s\n", to);
    }
    if (d)
        closedir(d);
}

/* libFuzzer ends with exit(): the directory goes with it. */
static void remove_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[PATH_MAX];
    while (d && (e = readdir(d)))
        if (e->d_name[0] != '.' && snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p)
            unlink(p);
    if (d)
        closedir(d);
    rmdir(dir);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(dir, sizeof dir, "/tmp/tpserve_fuzz_graph.%d", (int)getpid());
    mkdir(dir, 0700);
    atexit(remove_dir);
    snprintf(graph_path, sizeof graph_path, "%s/g.json", dir);
    write_weights();
    const char *graphs = getenv("TP_GRAPHS");
    if (graphs)
        link_example_weights(graphs);
    return 0;
}

/* The loader alone decides validity; the bound only keeps runs fast. */
static int small_enough(void)
{
    tp_graph *g;
    tp_err err;
    if (tp_graph_load(graph_path, &g, &err) != TP_OK)
        return 0;
    int64_t bytes = 0;
    int ok = g->world_size <= MAX_WORLD;
    for (int i = 0; ok && i < g->n_nodes; i++) {
        bytes += tp_node_bytes(&g->nodes[i]);
        ok = bytes <= MAX_BYTES;
    }
    tp_graph_free(g);
    return ok;
}

/* Zero-filled global inputs (ids 0 are in range of any table) of batch rows. */
static void run_batch(tp_engine *e, int64_t rows)
{
    int n = tp_engine_n_inputs(e);
    tp_host_tensor *in = calloc((size_t)n + 1, sizeof *in);
    for (int i = 0; in && i < n; i++) {
        const tp_io_desc *d = tp_engine_input(e, i);
        snprintf(in[i].name, sizeof in[i].name, "%s", d->name);
        in[i].dtype = d->dtype;
        in[i].ndim = d->ndim;
        size_t bytes = tp_dtype_size(d->dtype);
        for (int k = 0; k < d->ndim; k++) {
            in[i].shape[k] = d->shape[k] < 0 ? rows : d->shape[k];
            bytes *= (size_t)in[i].shape[k];
        }
        in[i].nbytes = bytes;
        in[i].data = calloc(1, bytes ? bytes : 1);
    }
    tp_host_tensor *outs = NULL;
    int n_outs = 0;
    tp_err err;
    if (in && tp_engine_infer(e, in, n, &outs, &n_outs, &err) == TP_OK)
        tp_host_tensors_free(outs, n_outs);
    if (in)
        tp_host_tensors_free(in, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fuzz_write_file(graph_path, data, size) != 0)
        return 0;
    if (!small_enough())
        return 0;
    /* the input's length picks the mode, so every mode sees every graph
     * shape the mutations reach: captured, eager, and without passes */
    static const int64_t buckets[] = {1, 2};
    tp_engine_opts opts = {.backend = "cpu", .buckets = buckets, .n_buckets = 2, .eager = size % 3 == 1,
                           .no_passes = size % 3 == 2};
    tp_engine *e;
    tp_err err;
    if (tp_engine_create(graph_path, &opts, &e, &err) == TP_OK) {
        run_batch(e, 1);
        run_batch(e, 2);
        tp_engine_free(e);
    }
    return 0;
}
