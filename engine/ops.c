#include "ops.h"

#include <string.h>

static const struct {
    const char *name;
    tp_op_kind kind;
    int min_in, max_in;
} op_table[TP_OP_COUNT] = {
#define TP_OP_ROW(e, name, kind, mn, mx) [TP_OP_##e] = {name, TP_KIND_##kind, mn, mx},
    TP_OP_MAP(TP_OP_ROW)
#undef TP_OP_ROW
};

const char *tp_op_name(tp_op op) { return op < TP_OP_COUNT ? op_table[op].name : "?"; }
tp_op_kind tp_op_kind_of(tp_op op) { return op_table[op].kind; }
int tp_op_min_inputs(tp_op op) { return op_table[op].min_in; }
int tp_op_max_inputs(tp_op op) { return op_table[op].max_in; }

int tp_op_from_name(const char *s, tp_op *out)
{
    for (int i = 0; i < TP_OP_COUNT; i++) {
        /* sources and fused ops are the engine's own, never read from JSON */
        if (op_table[i].kind != TP_KIND_SOURCE && op_table[i].kind != TP_KIND_FUSED &&
            i != TP_OP_IDENTITY_COPY && strcmp(s, op_table[i].name) == 0) {
            *out = (tp_op)i;
            return 0;
        }
    }
    return -1;
}

const char *tp_algo_name(tp_algo a)
{
    switch (a) {
#define TP_ALGO_NAME(e, name) case TP_ALGO_##e: return name;
        TP_ALGO_MAP(TP_ALGO_NAME)
#undef TP_ALGO_NAME
    }
    return "?";
}
