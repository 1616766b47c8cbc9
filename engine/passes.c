#include "passes.h"

#include <string.h>

static const struct {
    const char *name;
    tp_status (*fn)(tp_graph *, const tp_pass_opts *, int *, tp_err *);
} pass_table[TP_PASS_COUNT] = {
#define TP_PASS_ROW(e, name, fn) {name, fn},
    TP_PASS_MAP(TP_PASS_ROW)
#undef TP_PASS_ROW
};

void tp_pass_opts_default(tp_pass_opts *o)
{
    memset(o, 0, sizeof *o);
    o->lowering = tp_backend_default()->caps->lowering;
    o->f32_activations = tp_backend_default()->caps->f32_activations;
}

int tp_pass_disable(tp_pass_opts *o, const char *name)
{
    for (int i = 0; i < TP_PASS_COUNT; i++)
        if (strcmp(pass_table[i].name, name) == 0) {
            o->disabled[i] = 1;
            return 0;
        }
    return -1;
}

const char *tp_pass_name(tp_pass_id id) { return pass_table[id].name; }

tp_status tp_run_passes(tp_graph *g, const tp_pass_opts *o, tp_pass_result *results, tp_err *err)
{
    int64_t batch = g->batch;
    for (int i = 0; i < TP_PASS_COUNT; i++) {
        results[i] = (tp_pass_result){pass_table[i].name, 0, 0};
        if (o->disabled[i])
            continue;
        tp_status st = pass_table[i].fn(g, o, &results[i].changed, err);
        if (st == TP_OK)
            st = tp_graph_infer(g, batch, err);
        if (st != TP_OK) {
            tp_err_prefix(err, "pass %s: ", pass_table[i].name);
            return st;
        }
        results[i].ran = 1;
    }
    return TP_OK;
}

int tp_pass_is_strided(tp_graph *g, int i)
{
    int64_t b = g->batch;
    int s = !tp_node_contiguous(&g->nodes[i]);
    if (tp_graph_infer(g, 2 * b, NULL) == TP_OK)
        s |= !tp_node_contiguous(&g->nodes[i]);
    tp_graph_infer(g, b, NULL);
    return s;
}
