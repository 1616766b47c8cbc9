/* The engine end to end: every example graph (written by the Python
 * generator, an independent tool) against its unsharded NumPy reference;
 * replay determinism; other batch sizes; request validation; and a failing
 * rank that must become an error, not a hang. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "engine.h"
#include "safetensors.h"
#include "testutil.h"

static const char *graphs_dir(void)
{
    const char *d = getenv("TP_GRAPHS");
    return d ? d : "build/graphs";
}


static void run_example(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    int n_in, n_ref, n_out, n_out2;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *ref = tu_load_tensors(ref_path, &n_ref);
    tp_host_tensor *out, *out2;
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: %s", path, err.msg);
    tu_check_outputs(path, out, n_out, ref, n_ref, rtol);
    /* replaying the same capture runs the same kernels on the same
     * addresses in the same order: bit-identical results */
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out2, &n_out2, &err) == TP_OK, "%s", err.msg);
    for (int i = 0; i < n_out; i++)
        ck_assert_mem_eq(out[i].data, out2[i].data, out[i].nbytes);
    tp_host_tensors_free(out, n_out);
    tp_host_tensors_free(out2, n_out2);
    tp_host_tensors_free(in, n_in);
    tp_host_tensors_free(ref, n_ref);
    tp_engine_free(e);
}

START_TEST(examples_match_reference)
{
    tu_foreach_example(run_example);
}
END_TEST

static int64_t kinds_total(const int64_t *a)
{
    int64_t t = 0;
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        t += a[k];
    return t;
}

/* `tpserve plan GRAPH --json --batch B` as a parsed object. */
static json_t *plan_json(const char *path, int64_t batch)
{
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_plan(path, NULL, batch, 1, f, &err) == TP_OK, "%s", err.msg);
    fclose(f);
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    ck_assert_msg(root, "plan JSON: %s", je.text);
    free(text);
    return root;
}

static int64_t json_i(json_t *o, const char *key)
{
    json_t *v = json_object_get(o, key);
    ck_assert_msg(json_is_integer(v), "no integer '%s'", key);
    return json_integer_value(v);
}

static int n_arenas_checked;

/* Issue 49 (6): every bucket's executable binds into one arena pool, so an
 * engine's arenas are the largest bucket's (at most 1.1x), not the sum over
 * buckets (~1.9x for 1..16). The engine's stats (the /metrics gauge) and
 * `tpserve plan` (per bucket and the shared pool) say the same. */
static void arenas_shared_by_buckets(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    (void)in_path;
    (void)ref_path;
    (void)rtol;
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    tp_engine_stats es;
    tp_engine_get_stats(e, &es);
    tp_engine_free(e);
    int64_t largest_batch = es.bucket[es.n_buckets - 1];
    json_t *root = plan_json(path, largest_batch), *mem = json_object_get(json_object_get(root, "memory"), "arena_bytes");
    int64_t largest = 0, pool[TP_MEM_KINDS] = {0};
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++)
        largest += json_i(mem, tp_mem_kind_name((tp_mem_kind)k));
    int64_t engine_total = kinds_total(es.arena_bytes);
    ck_assert_msg(engine_total >= largest && (double)engine_total <= 1.1 * (double)largest,
                  "%s: the engine's arenas take %lld B per rank, %.2fx the largest bucket's %lld B", path,
                  (long long)engine_total, (double)engine_total / (double)largest, (long long)largest);
    json_t *arenas = json_object_get(root, "arenas"), *buckets = json_object_get(arenas, "buckets");
    ck_assert_msg(json_array_size(buckets) == (size_t)es.n_buckets, "%s: no arenas per bucket in the plan", path);
    int64_t sum = 0;
    for (int b = 0; b < es.n_buckets; b++) {
        json_t *one = json_array_get(buckets, (size_t)b);
        ck_assert_int_eq(json_i(one, "batch"), es.bucket[b]);
        for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++) {
            int64_t v = json_i(one, tp_mem_kind_name((tp_mem_kind)k));
            pool[k] = v > pool[k] ? v : pool[k];
        }
        sum += json_i(one, "total");
    }
    ck_assert_int_eq(json_i(json_array_get(buckets, (size_t)es.n_buckets - 1), "total"), largest);
    json_t *shared = json_object_get(arenas, "shared_pool");
    for (int k = TP_MEM_REGULAR; k < TP_MEM_KINDS; k++) {
        ck_assert_int_eq(json_i(shared, tp_mem_kind_name((tp_mem_kind)k)), pool[k]);
        ck_assert_int_eq(es.arena_bytes[k], pool[k]); /* the engine allocated what the plan reports */
    }
    ck_assert_int_eq(json_i(shared, "total"), engine_total);
    ck_assert_int_eq(json_i(arenas, "sum_over_buckets"), sum);
    ck_assert(sum > engine_total); /* what one set of arenas per bucket took */
    json_decref(root);
    n_arenas_checked++;
}

START_TEST(buckets_share_one_arena_pool)
{
    n_arenas_checked = 0;
    tu_foreach_example(arenas_shared_by_buckets);
    ck_assert_int_ge(n_arenas_checked, 10);
}
END_TEST

static tp_engine *open_example(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", graphs_dir(), name);
    tp_engine *e;
    tp_err err;
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    return e;
}

/* Row b of a batch request, run alone, equals row b of the batch within
 * the tolerance of the arithmetic, never bit for bit: OpenBLAS picks its
 * GEMM kernel by CPU and by matrix size, so M=1 and M=3 may sum in another
 * order (issue 11: exact on one Intel machine, not on AMD EPYC). FP32
 * outputs: TU_RTOL_REORDER. FP16/BF16 outputs: every op rounds to the
 * narrow type, so a reordered FP32 sum can flip one rounding by an ulp that
 * later ops carry; the example's own tolerance for its dtype
 * (graphs/README.md) bounds that. With TP_REPORT_BATCH_DIFF set, prints the
 * measured difference per example (make test-cpus collects it). */
static int is_batched(const tp_engine *e, const char *name)
{
    for (int k = 0; k < tp_engine_n_inputs(e); k++)
        if (strcmp(tp_engine_input(e, k)->name, name) == 0)
            return tp_engine_input(e, k)->shape[0] == -1;
    return 0;
}

/* The batch of the request: rows of its batched inputs (1 if none). */
static int64_t batch_rows(const tp_engine *e, const tp_host_tensor *in, int n_in)
{
    for (int i = 0; i < n_in; i++)
        if (is_batched(e, in[i].name))
            return in[i].shape[0];
    return 1;
}

static void row_alone_matches_batch(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    (void)ref_path;
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    int n_in, n_out, n1;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *out, *out1;
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: %s", path, err.msg);
    int64_t rows = batch_rows(e, in, n_in);
    ck_assert_int_gt(n_in, 0);
    tp_host_tensor *one = calloc((size_t)n_in, sizeof *one);
    double worst = 0;
    for (int64_t b = 0; b < rows && rows > 1; b++) {
        for (int i = 0; i < n_in; i++)
            one[i] = is_batched(e, in[i].name) ? tu_batch_row(&in[i], b) : in[i];
        ck_assert_msg(tp_engine_infer(e, one, n_in, &out1, &n1, &err) == TP_OK, "%s: %s", path, err.msg);
        for (int i = 0; i < n_out; i++) {
            tp_host_tensor row = tu_batch_row(&out[i], b);
            double d = tu_rel_error(&out1[i], &row);
            double tol = out[i].dtype == TP_F32 ? TU_RTOL_REORDER : rtol;
            ck_assert_msg(d <= tol, "%s output '%s' row %lld alone vs in a batch of %lld: %g > %g", path,
                          out[i].name, (long long)b, (long long)rows, d, tol);
            worst = d > worst ? d : worst;
        }
        tp_host_tensors_free(out1, n1);
    }
    free(one);
    if (getenv("TP_REPORT_BATCH_DIFF"))
        printf("batch-diff %s %.3g\n", path, worst);
    tp_host_tensors_free(out, n_out);
    tp_host_tensors_free(in, n_in);
    tp_engine_free(e);
}

START_TEST(row_alone_matches_batch_every_example)
{
    tu_foreach_example(row_alone_matches_batch);
}
END_TEST

/* Serial steps (every rank a fiber of the calling thread) against rank
 * threads: bit for bit. Both engines compile the same plans (the same
 * offsets in 64-byte-aligned arenas), each rank runs the same kernels on
 * the same data whichever thread runs it, and the collectives reduce in
 * rank order either way. */
static void serial_matches_threads(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    tp_engine *e, *es;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    /* no step measured yet: the first one runs serially (serial_policy.h) */
    tp_engine_opts o = {.serial_step_max_us = 10 * 1000 * 1000};
    ck_assert_msg(tp_engine_create(path, &o, &es, &err) == TP_OK, "%s", err.msg);
    int n_in, n_ref, n_out, n_out_s;
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), *ref = tu_load_tensors(ref_path, &n_ref);
    tp_host_tensor *out, *out_s;
    tp_engine_stats before, after;
    tp_engine_get_stats(es, &before);
    ck_assert_msg(tp_engine_infer(e, in, n_in, &out, &n_out, &err) == TP_OK, "%s: %s", path, err.msg);
    ck_assert_msg(tp_engine_infer(es, in, n_in, &out_s, &n_out_s, &err) == TP_OK, "%s: %s", path, err.msg);
    tp_engine_get_stats(es, &after);
    if (tp_engine_world_size(es) > 1) /* one rank has no thread to spare */
        ck_assert_uint_gt(after.serial_steps, before.serial_steps);
    tu_check_outputs(path, out_s, n_out_s, ref, n_ref, rtol);
    ck_assert_int_eq(n_out, n_out_s);
    for (int i = 0; i < n_out; i++)
        ck_assert_msg(out[i].nbytes == out_s[i].nbytes && !memcmp(out[i].data, out_s[i].data, out[i].nbytes),
                      "%s output '%s': serial steps differ from rank threads", path, out[i].name);
    tp_engine_get_stats(e, &after);
    ck_assert_uint_eq(after.serial_steps, 0);
    tp_host_tensors_free(out, n_out);
    tp_host_tensors_free(out_s, n_out_s);
    tp_host_tensors_free(in, n_in);
    tp_host_tensors_free(ref, n_ref);
    tp_engine_free(e);
    tp_engine_free(es);
}

START_TEST(serial_steps_match_rank_threads_every_example)
{
    tu_foreach_example(serial_matches_threads);
}
END_TEST

/* ---- a batch given as per-request pieces --------------------------------- */

/* Requests' row counts: several of them, with different rows; B passes the
 * largest bucket (16), so a padded engine runs it in two steps, the second
 * starting inside the second request. */
static const int64_t parts_a[] = {1, 3, 2, 6}, parts_b[] = {5, 13, 2};
static int parts_padded_runs, parts_exact_runs;

/* Row r of the example's batched input t (its rows repeat). */
static const char *example_row(const tp_host_tensor *t, int64_t r)
{
    size_t rb = t->nbytes / (size_t)t->shape[0];
    return (const char *)t->data + (size_t)(r % t->shape[0]) * rb;
}

/* ex's batched inputs as `total` rows from row `first` on (example rows
 * repeating), into cat (the caller frees each data). */
static void repeat_rows(const tp_host_tensor *ex, int ni, int64_t total, int64_t first, tp_host_tensor *cat)
{
    for (int i = 0; i < ni; i++) {
        size_t rb = ex[i].nbytes / (size_t)ex[i].shape[0];
        cat[i] = ex[i];
        cat[i].shape[0] = total;
        cat[i].nbytes = (size_t)total * rb;
        cat[i].data = malloc(cat[i].nbytes);
        ck_assert(cat[i].data);
        for (int64_t r = 0; r < total; r++)
            memcpy((char *)cat[i].data + (size_t)r * rb, example_row(&ex[i], first + r), rb);
    }
}

/* Runs the requests of rows[] once as pieces (each its own malloc'ed
 * tensor) and once concatenated into one tensor per input (what the batcher
 * used to build): the outputs must be bit-identical, because the same
 * executable then runs on the same staged bytes and cannot tell the two
 * apart. Returns 0 when the engine cannot run this total (an exact graph
 * whose batch is sharded across ranks needs it divisible by world_size). */
static int parts_match_concatenation(tp_engine *e, const tp_host_tensor *ex, const int64_t *rows, int n)
{
    int ni = tp_engine_n_inputs(e);
    int64_t total = 0;
    for (int p = 0; p < n; p++)
        total += rows[p];
    tp_host_tensor cat[ni + 1], part[ni * n + 1];
    const tp_host_tensor *pieces[ni * n + 1];
    repeat_rows(ex, ni, total, 0, cat);
    for (int64_t p = 0, first = 0; p < n; first += rows[p], p++) {
        tp_host_tensor one[ni + 1];
        repeat_rows(ex, ni, rows[p], first, one);
        for (int i = 0; i < ni; i++) {
            part[i * n + p] = one[i];
            pieces[i * n + p] = &part[i * n + p];
        }
    }
    tp_host_tensor *want, *got;
    int n_want, n_got;
    tp_err err = {{0}};
    tp_status st = tp_engine_infer(e, cat, ni, &want, &n_want, &err);
    if (st == TP_OK) {
        ck_assert_msg(tp_engine_infer_parts(e, pieces, n, total, &got, &n_got, &err) == TP_OK, "%s", err.msg);
        ck_assert_int_eq(n_got, n_want);
        for (int o = 0; o < n_got; o++) {
            ck_assert_uint_eq(got[o].nbytes, want[o].nbytes);
            ck_assert_mem_eq(got[o].data, want[o].data, want[o].nbytes);
            ck_assert_ptr_eq(got[o].owner, got[0].owner); /* one block for the batch */
        }
        tp_host_tensors_free(got, n_got);
        tp_host_tensors_free(want, n_want);
    } else {
        ck_assert_msg(st == TP_INVALID && strstr(err.msg, "not divisible by world_size"), "%s", err.msg);
    }
    for (int i = 0; i < ni; i++)
        free(cat[i].data);
    for (int k = 0; k < ni * n; k++)
        free(part[k].data);
    return st == TP_OK;
}

/* The example's inputs in e's input order into ordered; whether every
 * one has a batch dim. */
static int inputs_in_order(const tp_engine *e, const tp_host_tensor *in, int n_in, tp_host_tensor *ordered)
{
    int all_batched = 1;
    for (int i = 0; i < tp_engine_n_inputs(e); i++) {
        all_batched &= is_batched(e, tp_engine_input(e, i)->name);
        for (int k = 0; k < n_in; k++)
            if (strcmp(in[k].name, tp_engine_input(e, i)->name) == 0)
                ordered[i] = in[k];
    }
    return all_batched;
}

static void parts_every_example(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    (void)ref_path;
    (void)rtol;
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    int n_in, ni = tp_engine_n_inputs(e);
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), ordered[ni + 1];
    int all_batched = inputs_in_order(e, in, n_in, ordered);
    if (!all_batched) { /* requests without a batch dim cannot share a run */
        const tp_host_tensor *pieces[2 * ni + 1];
        for (int i = 0; i < ni; i++)
            pieces[2 * i] = pieces[2 * i + 1] = &ordered[i];
        tp_host_tensor *out;
        int n_out;
        ck_assert_int_eq(tp_engine_infer_parts(e, pieces, 2, 2, &out, &n_out, &err), TP_INVALID);
        ck_assert_msg(strstr(err.msg, "has no batch dim"), "%s", err.msg);
    } else {
        int padded = tp_engine_padded(e, NULL);
        int ran = parts_match_concatenation(e, ordered, parts_a, 4);
        if (padded)
            ran += parts_match_concatenation(e, ordered, parts_b, 3);
        *(padded ? &parts_padded_runs : &parts_exact_runs) += ran;
    }
    tp_host_tensors_free(in, n_in);
    tp_engine_free(e);
}

/* Every example graph, and a graph whose softmax over the batch dim mixes
 * rows (it runs exact batches): a batch given as pieces (one per request,
 * with different row counts) gives bit for bit the outputs of the same rows
 * concatenated, in padded buckets, across two steps past the largest
 * bucket, and in exact runs. */
START_TEST(parts_equal_concatenation_every_example)
{
    parts_padded_runs = parts_exact_runs = 0;
    tu_foreach_example(parts_every_example);
    char dir[64], path[128], in_path[256];
    tu_write_graph(dir, path,
                   "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"mix\",\"world_size\":2,"
                   "\"weights\":\"w.safetensors\",\"inputs\":[{\"name\":\"x\",\"datatype\":\"FP32\","
                   "\"shape\":[\"B\",4],\"placement\":\"replicate\"}],\"params\":[],"
                   "\"nodes\":[{\"name\":\"s\",\"op\":\"softmax\",\"inputs\":[\"x\"],\"attrs\":{\"dim\":0}}],"
                   "\"outputs\":[{\"name\":\"s\",\"placement\":\"replicate\"}]}",
                   NULL, 0);
    float x[3 * 4];
    tu_fill(x, 12, 5);
    int64_t xs[2] = {3, 4};
    st_write_item item = {"x", TP_F32, 2, xs, x};
    tp_err err;
    snprintf(in_path, sizeof in_path, "%s/in.safetensors", dir);
    ck_assert_int_eq(st_write(in_path, &item, 1, &err), TP_OK);
    parts_every_example(path, in_path, NULL, 0);
    tu_rmdir(dir);
    ck_assert_int_gt(parts_padded_runs, 0);
    ck_assert_int_gt(parts_exact_runs, 0);
}
END_TEST

/* ---- padded steps write their rows straight into the results ------------- */

static int padded_rows_checked;

/* A batch that does not fill its bucket (3 rows in a bucket of 4) and one
 * past the largest bucket (two steps, the second padded) give each row
 * what that row alone gives, and the outputs without batch rows what a
 * batch of one gives: the ranks copy a padded step's own rows, and only
 * those, into the results at the step's first row (engine.c's
 * results_in_place, exec.c's copy_outputs). */
static void padded_rows_every_example(const char *path, const char *in_path, const char *ref_path, double rtol)
{
    (void)ref_path;
    tp_engine *e;
    tp_err err = {{0}};
    ck_assert_msg(tp_engine_create(path, NULL, &e, &err) == TP_OK, "%s", err.msg);
    int n_in, ni = tp_engine_n_inputs(e);
    tp_host_tensor *in = tu_load_tensors(in_path, &n_in), ordered[ni + 1];
    int all_batched = inputs_in_order(e, in, n_in, ordered);
    tp_engine_stats es;
    tp_engine_get_stats(e, &es);
    int64_t rows = batch_rows(e, ordered, ni), totals[2] = {3, es.bucket[es.n_buckets - 1] + 3};
    for (int t = 0; all_batched && tp_engine_padded(e, NULL) && t < 2; t++) {
        tp_host_tensor cat[ni + 1], one[ni + 1], *out, *out1;
        int n_out, n1;
        repeat_rows(ordered, ni, totals[t], 0, cat);
        tp_status st = tp_engine_infer(e, cat, ni, &out, &n_out, &err);
        if (st != TP_OK) { /* a batch sharded across ranks needs a multiple of world_size */
            ck_assert_msg(strstr(err.msg, "not divisible by world_size"), "%s: %s", path, err.msg);
        }
        for (int64_t b = 0; st == TP_OK && b < rows && b < totals[t]; b++) {
            repeat_rows(ordered, ni, 1, b, one);
            ck_assert_msg(tp_engine_infer(e, one, ni, &out1, &n1, &err) == TP_OK, "%s: %s", path, err.msg);
            for (int o = 0; o < n_out; o++)
                for (int64_t r = b; r < totals[t]; r += rows) { /* every row that repeats example row b */
                    tp_host_tensor got = out[o];
                    if (tp_engine_output_rows(e, o)) { /* batch item r: out_rows rows of dim 0 */
                        got.shape[0] = out[o].shape[0] / totals[t];
                        got.nbytes = out[o].nbytes / (size_t)totals[t];
                        got.data = (char *)out[o].data + (size_t)r * got.nbytes;
                    }
                    double d = tu_rel_error(&out1[o], &got), tol = out[o].dtype == TP_F32 ? TU_RTOL_REORDER : rtol;
                    ck_assert_msg(d <= tol, "%s output '%s' row %lld of %lld: %g from the row alone", path,
                                  out[o].name, (long long)r, (long long)totals[t], d);
                }
            tp_host_tensors_free(out1, n1);
            for (int i = 0; i < ni; i++)
                free(one[i].data);
        }
        if (st == TP_OK) {
            tp_host_tensors_free(out, n_out);
            padded_rows_checked++;
        }
        for (int i = 0; i < ni; i++)
            free(cat[i].data);
    }
    tp_host_tensors_free(in, n_in);
    tp_engine_free(e);
}

START_TEST(padded_rows_match_row_alone_every_example)
{
    padded_rows_checked = 0;
    tu_foreach_example(padded_rows_every_example);
    ck_assert_int_gt(padded_rows_checked, 0);
}
END_TEST

static void expect_infer_error(tp_engine *e, tp_host_tensor *in, int n, const char *a, const char *b)
{
    tp_host_tensor *out;
    int n_out;
    tp_err err = {{0}};
    tp_status st = tp_engine_infer(e, in, n, &out, &n_out, &err);
    ck_assert_int_eq(st, TP_INVALID);
    ck_assert_ptr_null(out);
    ck_assert_msg(strstr(err.msg, a) && (!b || strstr(err.msg, b)), "'%s'/'%s' not in: %s", a, b ? b : "", err.msg);
}

START_TEST(request_validation)
{
    tp_engine *e = open_example("mlp_sp_tp2");
    const tp_io_desc *d = tp_engine_input(e, 0);
    ck_assert_str_eq(d->name, "x");
    ck_assert_int_eq(d->shape[0], -1);
    ck_assert_int_eq(tp_engine_output(e, 0)->shape[0], -1);
    float buf[2 * 8 * 32] = {0};
    tp_host_tensor x = {.name = "x", .dtype = TP_F32, .ndim = 3, .shape = {2, 8, 32}, .data = buf, .nbytes = sizeof buf};
    tp_host_tensor bad = x;
    expect_infer_error(e, &x, 0, "missing input 'x' (model 'mlp_sp_tp2' inputs: 'x')", NULL);
    strcpy(bad.name, "z");
    expect_infer_error(e, &bad, 1, "unknown input 'z' (model 'mlp_sp_tp2' inputs: 'x')", NULL);
    bad = x;
    bad.dtype = TP_F16;
    expect_infer_error(e, &bad, 1, "input 'x': datatype FP16 does not match model datatype FP32", NULL);
    bad = x;
    bad.shape[2] = 16;
    bad.nbytes /= 2;
    expect_infer_error(e, &bad, 1, "input 'x': shape [2, 8, 16] does not match model shape [-1, 8, 32]", NULL);
    /* 2^62 rows of 8*32 FP32 need 2^72 bytes: the byte count wrapped to 0
     * and matched an empty buffer before the shape's size was checked */
    bad = x;
    bad.shape[0] = (int64_t)1 << 62;
    bad.data = NULL;
    bad.nbytes = 0;
    expect_infer_error(e, &bad, 1, "input 'x': shape [4611686018427387904, 8, 32] is too large", NULL);
    bad = x;
    bad.shape[0] = 0;
    bad.nbytes = 0;
    expect_infer_error(e, &bad, 1, "input 'x': shape [0, 8, 32] has no elements", NULL);
    bad = x;
    bad.nbytes -= 4;
    expect_infer_error(e, &bad, 1, "bytes of data", NULL);
    tp_host_tensor two[2] = {x, x};
    expect_infer_error(e, two, 2, "input 'x' appears more than once", NULL);
    tp_host_tensor *out;
    int n_out;
    tp_err err;
    ck_assert_int_eq(tp_engine_infer(e, &x, 1, &out, &n_out, &err), TP_OK);
    tp_host_tensors_free(out, n_out);
    tp_engine_free(e);
}
END_TEST

/* A kernel failing on one rank (id out of range) aborts its peers' pending
 * collective: the request fails with the reason and the next one works. */
START_TEST(failing_rank_is_an_error_not_a_hang)
{
    char dir[] = "/tmp/tp_engine_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256], wpath[256];
    snprintf(wpath, sizeof wpath, "%s/w.safetensors", dir);
    float table[4 * 2] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ts[2] = {4, 2};
    st_write_item item = {"t", TP_F32, 2, ts, table};
    tp_err err;
    ck_assert_int_eq(st_write(wpath, &item, 1, &err), TP_OK);
    snprintf(path, sizeof path, "%s/g.json", dir);
    FILE *f = fopen(path, "w");
    fprintf(f, "{\"format\":\"tpgraph\",\"version\":1,\"name\":\"emb\",\"world_size\":2,\"weights\":\"w.safetensors\","
               "\"inputs\":[{\"name\":\"ids\",\"datatype\":\"INT32\",\"shape\":[\"B\",2],\"placement\":\"shard(1)\"}],"
               "\"params\":[{\"name\":\"t\",\"datatype\":\"FP32\",\"shape\":[4,2]}],"
               "\"nodes\":[{\"name\":\"e\",\"op\":\"embedding\",\"inputs\":[\"ids\",\"t\"]},"
               "{\"name\":\"g\",\"op\":\"all_gather\",\"inputs\":[\"e\"],\"attrs\":{\"dim\":1}}],"
               "\"outputs\":[{\"name\":\"g\"}]}");
    fclose(f);
    /* ranks on their threads, then as fibers of one thread (serial steps) */
    tp_engine_opts serial = {.serial_step_max_us = 10 * 1000 * 1000};
    for (int k = 0; k < 2; k++) {
        tp_engine *e;
        ck_assert_msg(tp_engine_create(path, k ? &serial : NULL, &e, &err) == TP_OK, "%s", err.msg);
        int32_t ids[2] = {1, 9}; /* rank 1 gets id 9: out of range */
        tp_host_tensor in = {.name = "ids", .dtype = TP_I32, .ndim = 2, .shape = {1, 2}, .data = ids, .nbytes = sizeof ids};
        tp_host_tensor *out;
        int n;
        ck_assert_int_ne(tp_engine_infer(e, &in, 1, &out, &n, &err), TP_OK);
        ck_assert_msg(strstr(err.msg, "9"), "%s", err.msg);
        /* the check of a decoded request (the server's one check) still refuses
         * the id before any batch is built */
        int64_t batch = 0;
        ck_assert_int_eq(tp_engine_check_decoded(e, &in, &batch, &err), TP_INVALID);
        ck_assert_msg(strstr(err.msg, "9"), "%s", err.msg);
        ids[1] = 3;
        ck_assert_msg(tp_engine_check_decoded(e, &in, &batch, &err) == TP_OK, "%s", err.msg);
        ck_assert_int_eq(batch, 1);
        ck_assert_msg(tp_engine_infer(e, &in, 1, &out, &n, &err) == TP_OK, "%s", err.msg);
        float want[4] = {3, 4, 7, 8}; /* rows 1 and 3 of the table, gathered */
        ck_assert_int_eq(out[0].shape[1], 2);
        ck_assert_int_eq(out[0].shape[2], 2);
        ck_assert_mem_eq(out[0].data, want, sizeof want);
        tp_host_tensors_free(out, n);
        tp_engine_stats es;
        tp_engine_get_stats(e, &es);
        ck_assert(k ? es.serial_steps >= 2 : es.serial_steps == 0);
        tp_engine_free(e);
    }
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

Suite *engine_suite(void)
{
    Suite *s = suite_create("engine");
    TCase *tc = tcase_create("end_to_end");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, examples_match_reference);
    tcase_add_test(tc, buckets_share_one_arena_pool);
    tcase_add_test(tc, row_alone_matches_batch_every_example);
    tcase_add_test(tc, serial_steps_match_rank_threads_every_example);
    tcase_add_test(tc, parts_equal_concatenation_every_example);
    tcase_add_test(tc, padded_rows_match_row_alone_every_example);
    tcase_add_test(tc, request_validation);
    tcase_add_test(tc, failing_rank_is_an_error_not_a_hang);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(engine_suite)
