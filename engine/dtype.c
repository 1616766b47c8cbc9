#include "dtype.h"

static const struct {
    const char *kserve, *st;
    size_t size;
} dtype_table[TP_DTYPE_COUNT] = {
    [TP_F32] = {"FP32", "F32", 4},
    [TP_F16] = {"FP16", "F16", 2},
    [TP_BF16] = {"BF16", "BF16", 2},
    [TP_I32] = {"INT32", "I32", 4},
    [TP_I64] = {"INT64", "I64", 8},
};

size_t tp_dtype_size(tp_dtype t) { return t < TP_DTYPE_COUNT ? dtype_table[t].size : 0; }
const char *tp_dtype_name(tp_dtype t) { return t < TP_DTYPE_COUNT ? dtype_table[t].kserve : "?"; }
const char *tp_dtype_st_name(tp_dtype t) { return t < TP_DTYPE_COUNT ? dtype_table[t].st : "?"; }

static int dtype_lookup(const char *s, int use_st, tp_dtype *out)
{
    for (int i = 0; i < TP_DTYPE_COUNT; i++) {
        const char *n = use_st ? dtype_table[i].st : dtype_table[i].kserve;
        if (s && strcmp(s, n) == 0) {
            *out = (tp_dtype)i;
            return 0;
        }
    }
    return -1;
}

int tp_dtype_from_name(const char *s, tp_dtype *out) { return dtype_lookup(s, 0, out); }
int tp_dtype_from_st_name(const char *s, tp_dtype *out) { return dtype_lookup(s, 1, out); }
