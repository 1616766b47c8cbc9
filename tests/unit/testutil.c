#include "testutil.h"

#include <check.h>
#include <jansson.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rank_group.h"

void tu_write_graph(char *dir, char *path, const char *json, const st_write_item *items, int n)
{
    strcpy(dir, "/tmp/tp_test_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char w[128];
    snprintf(w, sizeof w, "%s/w.safetensors", dir);
    tp_err err;
    ck_assert_msg(st_write(w, items, n, &err) == TP_OK, "%s", err.msg);
    snprintf(path, 128, "%s/g.json", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(json, f);
    fclose(f);
}

void tu_rmdir(const char *dir)
{
    char cmd[160];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    ck_assert_int_eq(system(cmd), 0);
}

void tu_fill(float *p, int64_t n, unsigned seed)
{
    uint32_t s = seed * 2654435761u + 12345u;
    for (int64_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        p[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
}

tp_engine *tu_engine(const char *path, int passes, int eager)
{
    tp_engine_opts o = {.backend = "cpu", .no_passes = !passes, .eager = eager};
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s", err.msg);
    return e;
}

tp_engine *tu_engine_processes(const char *path)
{
    const char *exe = getenv("TPSERVE") ? getenv("TPSERVE") : "build/tpserve";
    char *argv[] = {(char *)exe, "worker", (char *)path, "--backend", "cpu", NULL};
    tp_rank_group_opts go = {.mode = TP_GROUP_PROCESSES, .worker_argv = argv};
    tp_engine_opts o = {.backend = "cpu", .group = &go};
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, &o, &e, &err) == TP_OK, "%s", err.msg);
    return e;
}

tp_host_tensor *tu_infer(tp_engine *e, const tp_host_tensor *in, int n_in, int *n_out)
{
    tp_host_tensor *out;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, n_out, &err) == TP_OK, "%s", err.msg);
    return out;
}

double tu_rel_error(const tp_host_tensor *out, const tp_host_tensor *ref)
{
    ck_assert_int_eq(out->dtype, ref->dtype);
    ck_assert_int_eq(out->ndim, ref->ndim);
    ck_assert_mem_eq(out->shape, ref->shape, sizeof(int64_t) * (size_t)ref->ndim);
    int64_t n = (int64_t)(ref->nbytes / tp_dtype_size(ref->dtype));
    double maxdiff = 0, maxref = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double a = tp_load_f32(out->data, out->dtype, i), b = tp_load_f32(ref->data, ref->dtype, i);
        if (isnan(a) || fabs(a - b) > maxdiff)
            maxdiff = isnan(a) ? INFINITY : fabs(a - b);
        if (fabs(b) > maxref)
            maxref = fabs(b);
    }
    return maxdiff / maxref;
}

double tu_rel_diff(const tp_host_tensor *a, const tp_host_tensor *b, int n)
{
    double worst = 0;
    for (int t = 0; t < n; t++) {
        ck_assert_str_eq(a[t].name, b[t].name); /* passes never rename outputs */
        ck_assert_int_eq(a[t].nbytes, b[t].nbytes);
        double e = tu_rel_error(&a[t], &b[t]);
        worst = e > worst ? e : worst;
    }
    return worst;
}

/* out's match in ref, by name; a failed check when there is none. */
static const tp_host_tensor *ref_named(const char *path, const tp_host_tensor *out, const tp_host_tensor *ref,
                                       int n_ref)
{
    const tp_host_tensor *r = NULL;
    for (int k = 0; k < n_ref && !r; k++)
        r = strcmp(ref[k].name, out->name) == 0 ? &ref[k] : NULL;
    ck_assert_msg(r, "%s: output '%s' missing from the reference", path, out->name);
    return r;
}

void tu_check_outputs(const char *path, const tp_host_tensor *out, int n_out, const tp_host_tensor *ref, int n_ref,
                      double rtol)
{
    ck_assert_int_eq(n_out, n_ref);
    for (int i = 0; i < n_out; i++) {
        double e = tu_rel_error(&out[i], ref_named(path, &out[i], ref, n_ref));
        ck_assert_msg(e <= rtol, "%s output '%s': error %.3g > rtol %.3g", path, out[i].name, e, rtol);
    }
}

void tu_check_shapes(const char *path, const tp_host_tensor *out, int n_out, const tp_host_tensor *ref, int n_ref)
{
    ck_assert_int_eq(n_out, n_ref);
    for (int i = 0; i < n_out; i++) {
        const tp_host_tensor *r = ref_named(path, &out[i], ref, n_ref);
        ck_assert_int_eq(out[i].dtype, r->dtype);
        ck_assert_int_eq(out[i].ndim, r->ndim);
        for (int d = 0; d < r->ndim; d++)
            ck_assert_int_eq(out[i].shape[d], r->shape[d]);
    }
}

tp_graph *tu_load_passed(const char *path, int64_t batch, const tp_pass_opts *po)
{
    tp_graph *g;
    tp_err err = {{0}};
    ck_assert_msg(tp_graph_load(path, &g, &err) == TP_OK, "%s", err.msg);
    ck_assert_msg(tp_graph_infer(g, batch, &err) == TP_OK, "%s", err.msg);
    tp_pass_opts def;
    tp_pass_opts_default(&def);
    tp_pass_result res[TP_PASS_COUNT];
    ck_assert_msg(tp_run_passes(g, po ? po : &def, res, &err) == TP_OK, "%s", err.msg);
    return g;
}

int tu_count_op(const tp_graph *g, tp_op op)
{
    int n = 0;
    for (int i = 0; i < g->n_nodes; i++)
        n += g->nodes[i].op == op;
    return n;
}

tp_host_tensor tu_tensor(const char *name, tp_dtype dtype, void *data, int ndim, const int64_t *shape)
{
    tp_host_tensor t = {.dtype = dtype, .ndim = ndim, .data = data};
    snprintf(t.name, sizeof t.name, "%s", name);
    size_t n = tp_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        t.shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t.nbytes = n;
    return t;
}

tp_host_tensor tu_f32(const char *name, float *data, int ndim, const int64_t *shape)
{
    return tu_tensor(name, TP_F32, data, ndim, shape);
}

void tu_write_tmp(char *path, const void *bytes, size_t n)
{
    snprintf(path, 64, "/tmp/tp_test_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

void tu_expect_settings_answer(tp_status st, char *doc, char *now)
{
    if (st == TP_OK)
        ck_assert_str_eq(doc, now);
    else
        ck_assert_ptr_null(doc);
    free(doc);
    free(now);
}

tp_host_tensor tu_batch_row(const tp_host_tensor *t, int64_t b)
{
    ck_assert_int_gt(t->ndim, 0);
    ck_assert_int_lt(b, t->shape[0]);
    tp_host_tensor row = *t;
    row.shape[0] = 1;
    row.nbytes = t->nbytes / (size_t)t->shape[0];
    row.data = (char *)t->data + (size_t)b * row.nbytes;
    return row;
}

void tu_foreach_example(tu_example_fn fn)
{
    const char *dir = getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs";
    char mpath[512], paths[3][512];
    snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
    json_error_t je;
    json_t *m = json_load_file(mpath, 0, &je);
    ck_assert_msg(m != NULL, "%s: %s (run make graphs)", mpath, je.text);
    json_t *graphs = json_object_get(m, "graphs");
    ck_assert_int_ge(json_array_size(graphs), 8);
    static const char *keys[3] = {"json", "inputs", "ref"};
    size_t i;
    json_t *entry;
    json_array_foreach(graphs, i, entry)
    {
        for (int k = 0; k < 3; k++)
            snprintf(paths[k], sizeof paths[k], "%s/%s", dir, json_string_value(json_object_get(entry, keys[k])));
        fn(paths[0], paths[1], paths[2], json_number_value(json_object_get(entry, "rtol")));
    }
    json_decref(m);
}

tp_host_tensor *tu_load_tensors(const char *path, int *n)
{
    st_file *f;
    tp_err err;
    ck_assert_msg(st_open(path, &f, &err) == TP_OK, "%s", err.msg);
    *n = st_count(f);
    tp_host_tensor *t = calloc((size_t)*n + 1, sizeof *t);
    for (int i = 0; i < *n; i++) {
        const st_tensor_info *info = st_info(f, i);
        snprintf(t[i].name, sizeof t[i].name, "%s", info->name);
        t[i].dtype = info->dtype;
        t[i].ndim = info->ndim;
        memcpy(t[i].shape, info->shape, sizeof t[i].shape);
        t[i].nbytes = (size_t)(info->end - info->begin);
        t[i].data = malloc(t[i].nbytes + 1);
        ck_assert_msg(st_read_shard(f, info, -1, 0, 1, t[i].data, &err) == TP_OK, "%s", err.msg);
    }
    st_close(f);
    return t;
}

char tu_thread_state(int tid)
{
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", tid); /* a thread of any process */
    FILE *f = fopen(path, "r");
    if (!f)
        return '?';
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    const char *close = strrchr(buf, ')'); /* the name may hold spaces and parens */
    return close && close[1] == ' ' ? close[2] : '?';
}

int tu_thread_reaches(int tid, char state, int timeout_ms)
{
    for (int t = 0; t < timeout_ms; t++) {
        if (tu_thread_state(tid) == state)
            return 1;
        usleep(1000);
    }
    return tu_thread_state(tid) == state;
}

int tu_thread_stays(int tid, char state, int ms)
{
    for (int t = 0; t < ms; t++) {
        if (tu_thread_state(tid) != state)
            return 0;
        usleep(1000);
    }
    return 1;
}

int tu_allowed_cpus(int *cpu, int max)
{
    cpu_set_t set;
    ck_assert_int_eq(sched_getaffinity(0, sizeof set, &set), 0);
    int n = 0;
    for (int c = 0; c < CPU_SETSIZE && n < max; c++)
        if (CPU_ISSET(c, &set))
            cpu[n++] = c;
    return n;
}

/* ---- the generation example (gen_decoder, graphs/gen_examples.py) ---- */

json_t *tu_gen_steps(void)
{
    char path[512];
    snprintf(path, sizeof path, "%s/gen_decoder.steps.json", getenv("TP_GRAPHS") ? getenv("TP_GRAPHS") : "build/graphs");
    json_error_t je;
    json_t *j = json_load_file(path, 0, &je);
    ck_assert_msg(j, "%s: %s (make graphs)", path, je.text);
    return j;
}

static void gen_ints_of(json_t *a, int64_t *out)
{
    for (size_t i = 0; i < json_array_size(a); i++)
        out[i] = json_integer_value(json_array_get(a, i));
}

/* Runs one step (rows of the schedule) and returns next_token in got;
 * the step's logit_rows in wanted (all 1 when the graph has none). */
static void gen_run_step(tp_engine *e, json_t *step, int64_t *got, int64_t *wanted, int64_t *n_rows)
{
    const tp_generate_info *gi = tp_engine_generate_info(e);
    int64_t n = (int64_t)json_array_size(json_object_get(step, "input_ids"));
    int64_t ids[64], pos[64], slot[64], s1[1] = {n}, s2[2] = {n, 1};
    ck_assert_int_le(n, 64);
    gen_ints_of(json_object_get(step, "input_ids"), ids);
    gen_ints_of(json_object_get(step, "positions"), pos);
    gen_ints_of(json_object_get(step, "slots"), slot);
    for (int64_t r = 0; r < n; r++)
        wanted[r] = 1;
    if (gi->logit_rows)
        gen_ints_of(json_object_get(step, "logit_rows"), wanted);
    tp_host_tensor in[4] = {tu_tensor(gi->input_ids, TP_I64, ids, 2, s2), tu_tensor(gi->positions, TP_I64, pos, 1, s1),
                            tu_tensor(gi->slots, TP_I64, slot, 1, s1),
                            tu_tensor(gi->logit_rows ? gi->logit_rows : "", TP_I64, wanted, 1, s1)};
    int n_out;
    tp_host_tensor *out = tu_infer(e, in, gi->logit_rows ? 4 : 3, &n_out);
    ck_assert_int_eq(n_out, 1);
    ck_assert_str_eq(out[0].name, gi->next_token);
    ck_assert_int_eq(out[0].shape[0], n);
    memcpy(got, out[0].data, sizeof(int64_t) * (size_t)n);
    *n_rows = n;
    tp_host_tensors_free(out, n_out);
}

void tu_gen_schedule(tp_engine *e, json_t *steps, const char *what, int check_tokens)
{
    for (size_t s = 0; s < json_array_size(steps); s++) {
        json_t *step = json_array_get(steps, s);
        int64_t got[64], want[64], wanted[64], n;
        gen_run_step(e, step, got, wanted, &n);
        if (!check_tokens)
            continue;
        gen_ints_of(json_object_get(step, "next_token"), want);
        /* a row logit_rows does not want skips the head: gen_decoder's
         * argmax of its zero logits is id 0 (the lowest of a tie) */
        for (int64_t r = 0; r < n; r++)
            ck_assert_msg(got[r] == (wanted[r] ? want[r] : 0), "%s step %zu row %lld%s: token %lld, reference %lld",
                          what, s, (long long)r, wanted[r] ? "" : " (not wanted)", (long long)got[r],
                          (long long)(wanted[r] ? want[r] : 0));
    }
}

