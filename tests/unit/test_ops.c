/* The op table: every descriptor complete (its kernel family included) and
 * within the table's limits, every kernel family run by the cpu backend,
 * and inputs up to TP_OP_MAX_INPUTS run end to end (a 24-input cat once
 * overflowed a fixed 20-slot buffer in the executor) while one more is
 * refused by the loader, by name. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/cpu_ops.h"
#include "engine.h"
#include "ops.h"
#include "testutil.h"

START_TEST(every_descriptor_is_complete)
{
    for (int i = 0; i < TP_OP_COUNT; i++) {
        const tp_op_desc *d = tp_op_desc_of((tp_op)i);
        ck_assert_msg(d && d->name && *d->name, "op %d has no name", i);
        ck_assert_msg(d->shape != TP_SHAPE_UNSET, "op '%s' has no shape rule", d->name);
        ck_assert_msg(d->rows != TP_ROWS_UNSET, "op '%s' has no batch-rows rule", d->name);
        ck_assert_msg(d->attrs, "op '%s' has no attr list", d->name);
        /* a compute or copy op runs its family's kernel; the others none */
        int runs_kernel = d->kind == TP_KIND_COMPUTE || d->kind == TP_KIND_COPY;
        ck_assert_msg(d->family != TP_FAMILY_UNSET && d->family < TP_FAMILY_COUNT,
                      "op '%s' has no kernel family (.family in engine/ops.c)", d->name);
        ck_assert_msg(runs_kernel ? d->family != TP_FAMILY_NONE : d->family == TP_FAMILY_NONE,
                      "op '%s': family %d does not fit its kind", d->name, (int)d->family);
        ck_assert_int_eq(tp_op_family((tp_op)i), d->family);
        ck_assert_msg(d->min_inputs >= 0 && d->min_inputs <= d->max_inputs && d->max_inputs <= TP_OP_MAX_INPUTS,
                      "op '%s': inputs %d..%d outside 0..TP_OP_MAX_INPUTS", d->name, d->min_inputs, d->max_inputs);
        int communicates = d->kind == TP_KIND_COLLECTIVE || d->kind == TP_KIND_FUSED;
        /* backends take the communicated operand as ins[0] (backend.h) */
        ck_assert_msg(communicates ? d->comm_input == 0 : d->comm_input == -1,
                      "op '%s': comm_input %d does not fit its kind", d->name, d->comm_input);
        tp_op back;
        if (d->flags & TP_OPF_GRAPH)
            ck_assert_msg(tp_op_from_name(d->name, &back) == 0 && back == (tp_op)i, "op '%s' not found by name",
                          d->name);
        else
            ck_assert_msg(tp_op_from_name(d->name, &back) != 0, "engine op '%s' readable from a graph", d->name);
        for (const tp_attr_spec *a = d->attrs; a->key; a++)
            ck_assert_msg(a->field + sizeof(int) <= sizeof(tp_attrs), "op '%s' attr '%s' outside tp_attrs", d->name,
                          a->key);
    }
}
END_TEST

/* The cpu backend has a kernel for exactly the ops of a kernel family: none
 * for NONE (or a forgotten UNSET, so a graph using such an op is refused at
 * load), none past the table. */
START_TEST(cpu_runs_every_kernel_family)
{
    for (int i = 0; i < TP_OP_COUNT; i++) {
        tp_kernel_family f = tp_op_family((tp_op)i);
        int want = f != TP_FAMILY_NONE && f != TP_FAMILY_UNSET;
        ck_assert_msg(cpu_op_has_kernel((tp_op)i) == want, "op '%s': cpu kernel %d, want %d",
                      tp_op_name((tp_op)i), cpu_op_has_kernel((tp_op)i), want);
    }
    ck_assert_int_eq(tp_op_family(TP_OP_COUNT), TP_FAMILY_UNSET);
    ck_assert(!cpu_op_has_kernel(TP_OP_COUNT));
}
END_TEST

/* y = cat([x] * n, dim 1) for x [B, 2]: n copies side by side. */
static void write_cat_graph(char *dir, char *path, int n)
{
    size_t cap = 512 + (size_t)n * 8;
    char *json = malloc(cap);
    ck_assert_ptr_nonnull(json);
    int off = snprintf(json, cap,
                       "{\"format\": \"tpgraph\", \"version\": 1, \"name\": \"cat%d\", \"world_size\": 1,"
                       " \"inputs\": [{\"name\": \"x\", \"datatype\": \"FP32\", \"shape\": [\"B\", 2]}],"
                       " \"nodes\": [{\"name\": \"y\", \"op\": \"cat\", \"attrs\": {\"dim\": 1}, \"inputs\": [",
                       n);
    for (int i = 0; i < n; i++)
        off += snprintf(json + off, cap - (size_t)off, "%s\"x\"", i ? ", " : "");
    snprintf(json + off, cap - (size_t)off, "]}], \"outputs\": [{\"name\": \"y\"}]}");
    tu_write_graph(dir, path, json, NULL, 0);
    free(json);
}

static void check_cat_runs(int n)
{
    char dir[64], path[128];
    write_cat_graph(dir, path, n);
    tp_engine *e = tu_engine(path, 1, 0);
    float x[3 * 2];
    tu_fill(x, 6, 7);
    int64_t shape[2] = {3, 2};
    tp_host_tensor in = tu_f32("x", x, 2, shape);
    int n_out;
    tp_host_tensor *out = tu_infer(e, &in, 1, &n_out);
    ck_assert_int_eq(out[0].shape[1], 2 * n);
    const float *y = out[0].data;
    /* a copy, not arithmetic: every element is bit-identical to its source */
    for (int r = 0; r < 3; r++)
        for (int k = 0; k < n; k++)
            ck_assert_mem_eq(&y[r * 2 * n + 2 * k], &x[r * 2], 2 * sizeof(float));
    tp_host_tensors_free(out, n_out);
    tp_engine_free(e);
    tu_rmdir(dir);
}

START_TEST(cat_of_24_inputs_runs) { check_cat_runs(24); }
END_TEST

START_TEST(cat_of_max_inputs_runs) { check_cat_runs(TP_OP_MAX_INPUTS); }
END_TEST

START_TEST(cat_past_max_inputs_is_refused_by_name)
{
    char dir[64], path[128];
    write_cat_graph(dir, path, TP_OP_MAX_INPUTS + 1);
    tp_graph *g = NULL;
    tp_err err = {{0}};
    ck_assert_int_eq(tp_graph_load(path, &g, &err), TP_INVALID);
    ck_assert_ptr_null(g);
    char want[96];
    snprintf(want, sizeof want, "node 'y': op 'cat' takes 1..%d inputs, got %d", TP_OP_MAX_INPUTS,
             TP_OP_MAX_INPUTS + 1);
    ck_assert_msg(strstr(err.msg, want), "message: %s", err.msg);
    tu_rmdir(dir);
}
END_TEST

static Suite *ops_suite(void)
{
    Suite *s = suite_create("ops");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, every_descriptor_is_complete);
    tcase_add_test(tc, cpu_runs_every_kernel_family);
    tcase_add_test(tc, cat_of_24_inputs_runs);
    tcase_add_test(tc, cat_of_max_inputs_runs);
    tcase_add_test(tc, cat_past_max_inputs_is_refused_by_name);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(ops_suite)
