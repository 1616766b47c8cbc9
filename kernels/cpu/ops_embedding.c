/* ops_embedding.c — row lookup in a [V, E] table by INT32/INT64 ids.
 *
 * With vocab_parallel, rank r's table holds global rows r*V .. (r+1)*V-1:
 * ids of another rank's range give zero rows (the graph follows with an
 * all_reduce). An id outside the whole vocabulary ([0, V), or [0, world*V)
 * with vocab_parallel) is an error on every rank alike. */
#include <string.h>

#include "ops_internal.h"

static int64_t load_id(const tp_tensor *ids, int64_t off)
{
    return ids->dtype == TP_I32 ? ((const int32_t *)ids->data)[off]
                                : ((const int64_t *)ids->data)[off];
}

static tp_status emb_check(const tp_tensor *ids, const tp_tensor *table, const tp_tensor *out,
                           tp_err *err)
{
    char s1[96], s2[96], s3[96];
    if (ids->dtype != TP_I32 && ids->dtype != TP_I64)
        return tp_fail(err, TP_INVALID, "embedding: ids must be INT32 or INT64, got %s",
                       tp_dtype_name(ids->dtype));
    if (table->dtype != out->dtype)
        return tp_fail(err, TP_INVALID, "embedding: table dtype %s differs from output %s",
                       tp_dtype_name(table->dtype), tp_dtype_name(out->dtype));
    int ok = table->ndim == 2 && out->ndim == ids->ndim + 1 &&
             out->shape[ids->ndim] == table->shape[1];
    for (int i = 0; ok && i < ids->ndim; i++)
        ok = out->shape[i] == ids->shape[i];
    if (!ok)
        return tp_fail(err, TP_INVALID, "embedding: ids %s and table %s do not give output %s",
                       tp_shape_str(s1, sizeof s1, ids->ndim, ids->shape),
                       tp_shape_str(s2, sizeof s2, table->ndim, table->shape),
                       tp_shape_str(s3, sizeof s3, out->ndim, out->shape));
    return TP_OK;
}

static void copy_row(char *dst, const tp_tensor *table, int64_t row)
{
    size_t es = tp_dtype_size(table->dtype);
    int64_t E = table->shape[1], s1 = table->stride[1];
    const char *src = ops_at(table->data, table->dtype, row * table->stride[0]);
    if (s1 == 1) {
        memcpy(dst, src, (size_t)E * es);
        return;
    }
    for (int64_t j = 0; j < E; j++)
        memcpy(dst + j * (int64_t)es, src + j * s1 * (int64_t)es, es);
}

tp_status cpu_embedding(const tp_attrs *attrs, const tp_tensor *ids, const tp_tensor *table,
                        tp_tensor *out, int rank, int world, tp_err *err)
{
    tp_status s = emb_check(ids, table, out, err);
    if (s != TP_OK)
        return s;
    int vp = attrs ? attrs->vocab_parallel : 0;
    if (vp && (world < 1 || rank < 0 || rank >= world))
        return tp_fail(err, TP_INVALID, "embedding: rank %d of world %d", rank, world);
    int64_t V = table->shape[0], E = table->shape[1];
    int64_t lo = vp ? (int64_t)rank * V : 0, total = vp ? (int64_t)world * V : V;
    size_t row_bytes = (size_t)E * tp_dtype_size(out->dtype);
    int64_t n = tp_tensor_numel(ids);
    if (n == 0)
        return TP_OK;
    const int64_t *st[1] = {ids->stride};
    ops_layout l;
    ops_layout_init(&l, ids->ndim, ids->shape, 1, st);
    ops_pos p;
    memset(&p, 0, sizeof p);
    char *dst = out->data;
    for (int64_t i = 0; i < n; i++, ops_pos_next(&l, &p, l.nd), dst += row_bytes) {
        int64_t id = load_id(ids, p.off[0]);
        if (id < 0 || id >= total) {
            if (!vp)
                return tp_fail(err, TP_INVALID, "embedding: id %lld (position %lld) is out of range [0, V=%lld)",
                               (long long)id, (long long)i, (long long)V);
            return tp_fail(err, TP_INVALID, "embedding: id %lld (position %lld) is out of range [0, %lld) "
                           "(vocab_parallel: %d ranks x V=%lld)",
                           (long long)id, (long long)i, (long long)total, world, (long long)V);
        }
        if (id < lo || id >= lo + V)
            memset(dst, 0, row_bytes); /* 0 bits are 0.0 in every float type */
        else
            copy_row(dst, table, id - lo);
    }
    return TP_OK;
}
