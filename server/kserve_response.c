/* kserve_response.c — the KServe codec's answers: the engine's outputs
 * into an infer response body, JSON or with a binary tail (kserve.h). */
#include "kserve_internal.h"
#include "classify.h"
#include "io_check.h"
#include "numtext.h"
#include "text.h"
#include "zalloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- response ----------------------------------------------------------- */

/* Written as text rather than built as a jansson document: the data arrays
 * are most of the answer, and a node per element cost more than the model. */

static const tp_host_tensor *find_tensor(const tp_host_tensor *ts, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        if (strcmp(ts[i].name, name) == 0)
            return &ts[i];
    return NULL;
}

static void write_shape(tp_jbuf *b, int ndim, const int64_t *shape)
{
    tp_jbuf_raw(b, "[", 1);
    for (int i = 0; i < ndim; i++) {
        if (i)
            tp_jbuf_raw(b, ",", 1);
        tp_jbuf_i64(b, shape[i]);
    }
    tp_jbuf_raw(b, "]", 1);
}

/* The output's bytes go into the client's region. The answer names the
 * output with no data and no parameters, as Triton does: Triton's C++ client
 * (perf_analyzer) reads any output "parameters" as binary_data_size. */
static tp_status write_shm_output(tp_jbuf *b, const tp_host_tensor *t,
                                  const tp_kserve_output_sel *sel, tp_err *err)
{
    if (t->nbytes > sel->shm_size)
        return tp_fail(err, TP_INVALID, "output '%s' has %zu bytes, more than its "
                       "shared_memory_byte_size %llu", t->name, t->nbytes,
                       (unsigned long long)sel->shm_size);
    tp_status st = tp_shm_write(sel->shm, sel->shm_offset, t->data, t->nbytes, err);
    if (st != TP_OK) {
        tp_err_prefix(err, "output '%s': ", t->name);
        return st;
    }
    tp_jbuf_raw(b, "}", 1);
    return TP_OK;
}

/* A BYTES tensor's elements (each a 4-byte little-endian length, then its
 * bytes) as a JSON array of strings: classes, whose labels are UTF-8
 * (tp_labels_load checks) but may need escaping. */
static void write_bytes_json(tp_jbuf *b, const tp_classes *c)
{
    tp_jbuf_raw(b, "[", 1);
    for (size_t at = 0; at + 4 <= c->len;) {
        const unsigned char *l = (const unsigned char *)c->bytes + at;
        size_t n = (size_t)l[0] | (size_t)l[1] << 8 | (size_t)l[2] << 16 | (size_t)l[3] << 24;
        if (at)
            tp_jbuf_raw(b, ",", 1);
        tp_jbuf_strn(b, c->bytes + at + 4, n);
        at += 4 + n;
    }
    tp_jbuf_raw(b, "]", 1);
}

/* An output answered as its classes (cls): a BYTES tensor. */
static void write_classes(tp_jbuf *b, const tp_classes *cls, const tp_kserve_output_sel *sel)
{
    tp_jbuf_lit(b, ",\"datatype\":\"BYTES\",\"shape\":");
    write_shape(b, cls->ndim, cls->shape);
    if (sel->binary) {
        tp_jbuf_lit(b, ",\"parameters\":{\"binary_data_size\":");
        tp_jbuf_i64(b, (int64_t)cls->len);
        tp_jbuf_lit(b, "}}");
        return;
    }
    tp_jbuf_lit(b, ",\"data\":");
    write_bytes_json(b, cls);
    tp_jbuf_raw(b, "}", 1);
}

/* cls: the output's classes when the request asked for them, else NULL. */
static tp_status write_output(tp_jbuf *b, const tp_host_tensor *t, const tp_kserve_output_sel *sel,
                              const tp_classes *cls, tp_err *err)
{
    tp_jbuf_lit(b, "{\"name\":");
    tp_jbuf_str(b, t->name);
    if (cls) {
        write_classes(b, cls, sel);
        return TP_OK;
    }
    tp_jbuf_lit(b, ",\"datatype\":\"");
    tp_jbuf_lit(b, tp_dtype_name(t->dtype));
    tp_jbuf_lit(b, "\",\"shape\":");
    write_shape(b, t->ndim, t->shape);
    if (sel->shm)
        return write_shm_output(b, t, sel, err);
    if (sel->binary) {
        tp_jbuf_lit(b, ",\"parameters\":{\"binary_data_size\":");
        tp_jbuf_i64(b, (int64_t)t->nbytes);
        tp_jbuf_lit(b, "}}");
        return TP_OK;
    }
    tp_jbuf_lit(b, ",\"data\":");
    tp_status st = tp_json_tensor_write(b, t, err);
    tp_jbuf_raw(b, "}", 1);
    return st;
}

/* Output i's tensor, checked against its shape, and its classes computed
 * into cls[i] when asked for. */
static tp_status find_output(const tp_kserve_model *m, const tp_kserve_request *req, int i,
                             const tp_host_tensor *outs, int n_outs, tp_classes *cls,
                             const tp_host_tensor **out, tp_err *err)
{
    const tp_kserve_output_sel *sel = &req->outputs[i];
    const tp_host_tensor *t = find_tensor(outs, n_outs, sel->name);
    if (!t)
        return tp_fail(err, TP_INTERNAL, "engine returned no output '%s'", sel->name);
    size_t want = (size_t)numel_of(t->ndim, t->shape) * tp_dtype_size(t->dtype);
    if (t->nbytes != want || (want && !t->data))
        return tp_fail(err, TP_INTERNAL, "output '%s': engine returned %zu bytes for %zu expected",
                       t->name, t->nbytes, want);
    *out = t;
    if (!sel->classes)
        return TP_OK;
    int k = tp_io_find(m->outputs, m->n_outputs, sel->name);
    const tp_labels *labels = m->labels && k >= 0 ? m->labels[k] : NULL;
    return tp_classify(t, m->max_batch_size > 0, sel->classes, labels, &cls[i], err);
}

/* The JSON header, then for binary outputs their bytes in order: appended
 * to b, or (tail non-NULL and the answer over whole_max bytes) listed in
 * tail as pieces of outs. cls has a slot per requested output for the
 * classes of those that asked for them; their bytes are always copied
 * (they live only as long as this call), so an answer with binary classes
 * is never listed. */
static tp_status write_response(const tp_kserve_model *m, const tp_kserve_request *req,
                                const tp_host_tensor *outs, int n_outs, tp_jbuf *b,
                                size_t *header_len, tp_kserve_piece *tail, int *n_tail,
                                size_t whole_max, tp_classes *cls, tp_err *err)
{
    tp_jbuf_lit(b, "{\"model_name\":");
    tp_jbuf_str(b, m->name);
    tp_jbuf_lit(b, ",\"model_version\":");
    tp_jbuf_str(b, m->version ? m->version : "1");
    if (req->id) {
        tp_jbuf_lit(b, ",\"id\":");
        tp_jbuf_str(b, req->id);
    }
    tp_jbuf_lit(b, ",\"outputs\":[");
    size_t tail_len = 0;
    int binary_classes = 0;
    for (int i = 0; i < req->n_outputs; i++) {
        const tp_kserve_output_sel *sel = &req->outputs[i];
        const tp_host_tensor *t = NULL;
        tp_status st = find_output(m, req, i, outs, n_outs, cls, &t, err);
        if (st != TP_OK)
            return st;
        if (i)
            tp_jbuf_raw(b, ",", 1);
        if ((st = write_output(b, t, sel, sel->classes ? &cls[i] : NULL, err)) != TP_OK)
            return st;
        tail_len += sel->binary ? (sel->classes ? cls[i].len : t->nbytes) : 0;
        binary_classes |= sel->binary && sel->classes;
    }
    tp_jbuf_lit(b, "]}");
    *header_len = tail_len ? b->len : 0;
    int listed = tail && b->len + tail_len > whole_max && !binary_classes;
    for (int i = 0; i < req->n_outputs && tail_len; i++) {
        const tp_kserve_output_sel *sel = &req->outputs[i];
        const tp_host_tensor *t = find_tensor(outs, n_outs, sel->name);
        const void *data = sel->classes ? cls[i].bytes : t->data;
        size_t len = sel->classes ? cls[i].len : t->nbytes;
        if (!sel->binary || !len)
            continue;
        if (listed)
            tail[(*n_tail)++] = (tp_kserve_piece){data, len};
        else
            tp_jbuf_raw(b, data, len);
    }
    tp_jbuf_raw(b, "", 1); /* a NUL past the end lets pure-JSON bodies be logged as strings */
    b->len -= !b->oom;
    if (b->oom)
        return tp_fail(err, TP_NOMEM, "out of memory for a %zu-byte response", b->len + tail_len);
    return TP_OK;
}

static tp_status build(const tp_kserve_model *m, const tp_kserve_request *req,
                       const tp_host_tensor *outs, int n_outs, tp_kserve_buf *out,
                       tp_kserve_piece *tail, int *n_tail, size_t whole_max, tp_err *err)
{
    memset(out, 0, sizeof *out);
    tp_jbuf b = {0};
    if (tail)
        tp_jbuf_start_pooled(&b);
    size_t header_len = 0;
    int classified = 0;
    for (int i = 0; i < req->n_outputs; i++)
        classified |= req->outputs[i].classes > 0;
    tp_classes *cls = classified ? tp_zalloc((size_t)req->n_outputs, sizeof *cls) : NULL;
    tp_status st = classified && !cls ? tp_fail(err, TP_NOMEM, "out of memory")
                                      : write_response(m, req, outs, n_outs, &b, &header_len, tail, n_tail,
                                                       whole_max, cls, err);
    for (int i = 0; cls && i < req->n_outputs; i++)
        tp_classes_free(&cls[i]);
    free(cls);
    if (st != TP_OK) {
        tp_jbuf_free_text(b.p, b.pooled);
        return st;
    }
    out->body = b.p;
    out->len = b.len;
    out->header_len = header_len;
    out->pooled = b.pooled;
    return TP_OK;
}

tp_status tp_kserve_build_infer(const tp_kserve_model *m, const tp_kserve_request *req,
                                const tp_host_tensor *outs, int n_outs, tp_kserve_buf *out,
                                tp_err *err)
{
    return build(m, req, outs, n_outs, out, NULL, NULL, 0, err);
}

tp_status tp_kserve_build_infer_parts(const tp_kserve_model *m, const tp_kserve_request *req,
                                      const tp_host_tensor *outs, int n_outs, size_t whole_max,
                                      tp_kserve_buf *out, tp_kserve_piece *tail, int *n_tail,
                                      tp_err *err)
{
    *n_tail = 0;
    return build(m, req, outs, n_outs, out, tail, n_tail, whole_max, err);
}
