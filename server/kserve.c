/* kserve.c — the KServe codec's requests: an infer request body (JSON,
 * binary tail, shared memory) into tensors, and the shared memory and
 * repository requests (kserve.h; the files of the codec: kserve_internal.h). */
#include "kserve_internal.h"
#include "classify.h"
#include "json_kind.h"
#include "numtext.h"
#include "text.h"
#include "io_check.h"
#include "zalloc.h"

#include <stdio.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

static const char *shape_str(char *buf, int ndim, const int64_t *shape)
{
    return tp_shape_str(buf, 128, ndim, shape);
}

/* KServe v2 datatypes tpserve does not compute in: named so the client is
 * told "unsupported", not "unknown". */
static int known_unsupported(const char *dt)
{
    static const char *const names[] = {"BOOL",  "UINT8", "UINT16", "UINT32", "UINT64",
                                        "INT8",  "INT16", "FP64",   "BYTES"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(dt, names[i]) == 0)
            return 1;
    return 0;
}

static tp_status parse_datatype(const json_t *jdt, const char *input, tp_dtype *out, tp_err *err)
{
    if (!jdt)
        return tp_fail(err, TP_INVALID, "input '%s': missing 'datatype'", input);
    if (!json_is_string(jdt))
        return tp_fail(err, TP_INVALID, "input '%s': 'datatype' must be a string, got %s", input,
                       tp_json_kind(jdt));
    const char *dt = json_string_value(jdt);
    if (tp_dtype_from_name(dt, out) == 0)
        return TP_OK;
    return tp_fail(err, TP_INVALID,
                   "input '%s': %s datatype '%s' (supported: FP32, FP16, BF16, INT32, INT64)",
                   input, known_unsupported(dt) ? "unsupported" : "unknown", dt);
}

static tp_status parse_shape(const json_t *js, const char *input, tp_host_tensor *t, tp_err *err)
{
    if (!js)
        return tp_fail(err, TP_INVALID, "input '%s': missing 'shape'", input);
    if (!json_is_array(js))
        return tp_fail(err, TP_INVALID, "input '%s': 'shape' must be an array, got %s", input,
                       tp_json_kind(js));
    if (json_array_size(js) > TP_MAX_DIMS)
        return tp_fail(err, TP_INVALID, "input '%s': shape has %zu dims, at most %d supported",
                       input, json_array_size(js), TP_MAX_DIMS);
    t->ndim = (int)json_array_size(js);
    for (int i = 0; i < t->ndim; i++) {
        const json_t *d = json_array_get(js, (size_t)i);
        if (!json_is_integer(d) || json_integer_value(d) < 0)
            return tp_fail(err, TP_INVALID,
                           "input '%s': shape[%d] must be a non-negative integer, got %s", input,
                           i, tp_json_kind(d));
        t->shape[i] = (int64_t)json_integer_value(d);
    }
    return TP_OK;
}

/* ---- JSON "data" -------------------------------------------------------- */

/* What tp_json_tensor_read will allocate for t, taken from the budget
 * before it does. */
static tp_status take_json_tensor(tp_mem_hold *mem, const tp_host_tensor *t, size_t len, tp_err *err)
{
    if (!mem)
        return TP_OK;
    char what[160];
    snprintf(what, sizeof what, "input '%s'", t->name);
    return tp_mem_take_for(mem, (int64_t)tp_json_tensor_read_bytes(t, len), what, err);
}

/* inputs[pos].data: the span the scan found, or (for spellings the scan does
 * not follow, e.g. an escaped key) the array as jansson parsed it, dumped
 * back to text. */
static tp_status decode_json_data(const json_t *data, const data_text *dt, size_t pos,
                                  tp_host_tensor *t, tp_err *err)
{
    if (!json_is_array(data))
        return tp_fail(err, TP_INVALID, "input '%s': 'data' must be an array, got %s", t->name,
                       tp_json_kind(data));
    for (int k = 0; k < dt->n_spans; k++) {
        if (dt->spans[k].input < 0 || (size_t)dt->spans[k].input != pos)
            continue;
        size_t len = dt->spans[k].end - dt->spans[k].start;
        tp_status st = take_json_tensor(dt->mem, t, len, err);
        return st == TP_OK ? tp_json_tensor_read(dt->body + dt->spans[k].start, len, t, err) : st;
    }
    char *text = json_dumps(data, JSON_COMPACT);
    if (!text)
        return tp_fail(err, TP_NOMEM, "input '%s': out of memory", t->name);
    tp_status st = take_json_tensor(dt->mem, t, strlen(text), err);
    if (st == TP_OK)
        st = tp_json_tensor_read(text, strlen(text), t, err);
    free(text);
    return st;
}

/* ---- binary tensor data ------------------------------------------------- */

static tp_status decode_binary(const json_t *jsize, tp_host_tensor *t, bin_tail *tail, tp_err *err)
{
    char sh[128];
    if (!tail->present)
        return tp_fail(err, TP_INVALID, "input '%s' has parameters.binary_data_size but the "
                       "request has no Inference-Header-Content-Length header", t->name);
    if (!json_is_integer(jsize) || json_integer_value(jsize) < 0)
        return tp_fail(err, TP_INVALID, "input '%s': parameters.binary_data_size must be a "
                       "non-negative integer, got %s", t->name, tp_json_kind(jsize));
    size_t want = (size_t)numel_of(t->ndim, t->shape) * tp_dtype_size(t->dtype);
    json_int_t got = json_integer_value(jsize);
    if ((unsigned long long)got != want)
        return tp_fail(err, TP_INVALID, "input '%s': binary_data_size %" JSON_INTEGER_FORMAT
                       " does not match shape %s of %s (%zu bytes)", t->name, got,
                       shape_str(sh, t->ndim, t->shape), tp_dtype_name(t->dtype), want);
    if (want > tail->len - tail->off)
        return tp_fail(err, TP_INVALID, "input '%s': binary data needs %zu bytes at offset %zu "
                       "of the binary section, but only %zu remain (body %zu bytes, "
                       "Inference-Header-Content-Length %lld)", t->name, want, tail->off,
                       tail->len - tail->off, (size_t)tail->header_len + tail->len,
                       tail->header_len);
    /* A view, not a copy: the engine copies the bytes once, from here into
     * its staging. The caller keeps the body alive until the request is
     * freed (kserve.h). The view may be unaligned for its element type:
     * everything that reads request elements does so with memcpy. */
    t->data = (void *)(tail->p + tail->off);
    t->owner = TP_HOST_BORROWED;
    t->nbytes = want;
    tail->off += want;
    return TP_OK;
}

/* ---- system shared memory ----------------------------------------------- */

/* A non-negative integer parameter; *present says whether it was there. */
static tp_status get_u64_param(const json_t *params, const char *key, const char *where,
                               uint64_t *out, int *present, tp_err *err)
{
    const json_t *v = json_object_get(params, key);
    *present = v != NULL;
    if (!v)
        return TP_OK;
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return tp_fail(err, TP_INVALID, "%s: '%s' must be a non-negative integer, got %s",
                       where, key, tp_json_kind(v));
    *out = (uint64_t)json_integer_value(v);
    return TP_OK;
}

/* Region, offset and byte_size of an input or output that names a region:
 * the region acquired (release it), its name checked against the registry. */
static tp_status shm_params(const tp_kserve_model *m, const json_t *params, const char *where,
                            tp_shm_region **region, uint64_t *offset, uint64_t *size, tp_err *err)
{
    const json_t *jr = json_object_get(params, "shared_memory_region");
    int has_size, has_off;
    *offset = 0;
    if (!json_is_string(jr))
        return tp_fail(err, TP_INVALID, "%s: parameters.shared_memory_region must be a string, "
                       "got %s", where, tp_json_kind(jr));
    tp_status st = get_u64_param(params, "shared_memory_byte_size", where, size, &has_size, err);
    if (st == TP_OK)
        st = get_u64_param(params, "shared_memory_offset", where, offset, &has_off, err);
    if (st != TP_OK)
        return st;
    if (!has_size)
        return tp_fail(err, TP_INVALID, "%s: parameters.shared_memory_region needs "
                       "parameters.shared_memory_byte_size", where);
    if (!m->shm)
        return tp_fail(err, TP_INVALID, "%s: system shared memory is disabled on this server "
                       "(allow_client_shm 0)", where);
    *region = tp_shm_acquire(m->shm, json_string_value(jr), err);
    if (!*region)
        tp_err_prefix(err, "%s: ", where);
    return *region ? TP_OK : TP_INVALID;
}

/* The input's bytes read out of its region into a buffer of the request's
 * own: the client may reuse the region once the answer is back, a
 * concurrent unregister never pulls memory from under a batch, and a client
 * shrinking its object is a 400 here, not a fault in the engine
 * (shm_registry.h). */
static tp_status decode_shm(const tp_kserve_model *m, const json_t *params, tp_host_tensor *t,
                            tp_mem_hold *mem, tp_err *err)
{
    char where[160], sh[128];
    snprintf(where, sizeof where, "input '%s'", t->name);
    tp_shm_region *r = NULL;
    uint64_t off, size;
    tp_status st = shm_params(m, params, where, &r, &off, &size, err);
    if (st != TP_OK)
        return st;
    size_t want = (size_t)numel_of(t->ndim, t->shape) * tp_dtype_size(t->dtype);
    if (size != want)
        st = tp_fail(err, TP_INVALID, "input '%s': shared_memory_byte_size %llu does not match "
                     "shape %s of %s (%zu bytes)", t->name, (unsigned long long)size,
                     shape_str(sh, t->ndim, t->shape), tp_dtype_name(t->dtype), want);
    if (st == TP_OK && mem)
        st = tp_mem_take_for(mem, (int64_t)want, where, err);
    if (st == TP_OK && !(t->data = malloc(want ? want : 1)))
        st = tp_fail(err, TP_NOMEM, "input '%s': out of memory for %zu bytes", t->name, want);
    if (st == TP_OK && (st = tp_shm_read(r, off, t->data, size, err)) != TP_OK)
        tp_err_prefix(err, "input '%s': ", t->name);
    if (st == TP_OK)
        t->nbytes = want;
    tp_shm_release(r);
    return st;
}

/* ---- inputs ------------------------------------------------------------- */

static tp_status parse_input_name(const json_t *in, size_t pos, const char **name, tp_err *err)
{
    if (!json_is_object(in))
        return tp_fail(err, TP_INVALID, "inputs[%zu] must be an object, got %s", pos, tp_json_kind(in));
    const json_t *jn = json_object_get(in, "name");
    if (!json_is_string(jn))
        return tp_fail(err, TP_INVALID, "inputs[%zu]: 'name' must be a string, got %s", pos,
                       jn ? tp_json_kind(jn) : "nothing");
    *name = json_string_value(jn);
    return TP_OK;
}

/* Fills t from one request input already matched to model input d. */
static tp_status parse_input(const tp_kserve_model *m, const json_t *in, size_t pos,
                             const tp_io_desc *d, tp_host_tensor *t, const data_text *text,
                             bin_tail *tail, tp_err *err)
{
    tp_text_copy(t->name, sizeof t->name, d->name);
    tp_status st = parse_datatype(json_object_get(in, "datatype"), d->name, &t->dtype, err);
    if (st != TP_OK)
        return st;
    if ((st = tp_io_check_dtype(d, t->dtype, err)) != TP_OK ||
        (st = parse_shape(json_object_get(in, "shape"), d->name, t, err)) != TP_OK ||
        (st = tp_io_check_shape(d, t->ndim, t->shape, err)) != TP_OK)
        return st;
    const json_t *params = json_object_get(in, "parameters");
    if (params && !json_is_object(params))
        return tp_fail(err, TP_INVALID, "input '%s': 'parameters' must be an object, got %s",
                       d->name, tp_json_kind(params));
    const json_t *bsize = params ? json_object_get(params, "binary_data_size") : NULL;
    const json_t *shm = params ? json_object_get(params, "shared_memory_region") : NULL;
    const json_t *data = json_object_get(in, "data");
    if (!!bsize + !!shm + !!data > 1)
        return tp_fail(err, TP_INVALID, "input '%s' has more than one of 'data', "
                       "parameters.binary_data_size and parameters.shared_memory_region; send "
                       "one", d->name);
    if (bsize)
        return decode_binary(bsize, t, tail, err);
    if (shm)
        return decode_shm(m, params, t, text->mem, err);
    if (!data)
        return tp_fail(err, TP_INVALID, "input '%s' has no 'data', no "
                       "parameters.binary_data_size and no parameters.shared_memory_region",
                       d->name);
    return decode_json_data(data, text, pos, t, err);
}

static tp_status parse_inputs(const tp_kserve_model *m, const json_t *jin, const data_text *text,
                              bin_tail *tail, tp_host_tensor *ts, tp_err *err)
{
    char names[512];
    if (!jin)
        return tp_fail(err, TP_INVALID, "request has no 'inputs' (model '%s' expects %s)",
                       m->name, tp_io_names(names, sizeof names, m->inputs, m->n_inputs));
    if (!json_is_array(jin))
        return tp_fail(err, TP_INVALID, "'inputs' must be an array, got %s", tp_json_kind(jin));
    for (size_t i = 0; i < json_array_size(jin); i++) {
        const json_t *in = json_array_get(jin, i);
        const char *name = NULL;
        tp_status st = parse_input_name(in, i, &name, err);
        if (st != TP_OK)
            return st;
        int k = tp_io_find(m->inputs, m->n_inputs, name);
        if (k < 0)
            return tp_io_fail_unknown(err, m->name, m->inputs, m->n_inputs, name);
        if (ts[k].name[0])
            return tp_io_fail_repeated(err, name);
        if ((st = parse_input(m, in, i, &m->inputs[k], &ts[k], text, tail, err)) != TP_OK)
            return st;
    }
    for (int k = 0; k < m->n_inputs; k++)
        if (!ts[k].name[0])
            return tp_io_fail_missing(err, m->name, m->inputs, m->n_inputs, k);
    if (tail->off != tail->len)
        return tp_fail(err, TP_INVALID, "binary section has %zu bytes after the last input's "
                       "data (Inference-Header-Content-Length %lld, body %zu bytes): "
                       "binary_data_size values do not add up", tail->len - tail->off,
                       tail->header_len, (size_t)tail->header_len + tail->len);
    return TP_OK;
}

/* ---- outputs ------------------------------------------------------------ */

static tp_status get_bool_param(const json_t *params, const char *key, const char *where,
                                int *out, tp_err *err)
{
    const json_t *v = params ? json_object_get(params, key) : NULL;
    if (!v)
        return TP_OK;
    if (!json_is_boolean(v))
        return tp_fail(err, TP_INVALID, "%s: parameters.%s must be a boolean, got %s", where, key,
                       tp_json_kind(v));
    *out = json_is_true(v);
    return TP_OK;
}

/* Triton's classification extension: parameters.classification = N, the
 * classes to answer per batch entry (classify.h); *classes stays 0 without. */
static tp_status parse_classification(const json_t *params, const char *where, int64_t *classes, tp_err *err)
{
    const json_t *v = params ? json_object_get(params, "classification") : NULL;
    if (!v)
        return TP_OK;
    if (!json_is_integer(v))
        return tp_fail(err, TP_INVALID, "%s: parameters.classification must be an integer (how many classes "
                       "to answer), got %s", where, tp_json_kind(v));
    if (json_integer_value(v) < 1)
        return tp_fail(err, TP_INVALID, "%s: parameters.classification must be at least 1 (how many classes "
                       "to answer), got %lld", where, (long long)json_integer_value(v));
    *classes = (int64_t)json_integer_value(v);
    return TP_OK;
}

static tp_status parse_output(const tp_kserve_model *m, const json_t *o, size_t pos,
                              int binary_default, tp_kserve_output_sel *sel, tp_err *err)
{
    char names[512], where[200];
    if (!json_is_object(o))
        return tp_fail(err, TP_INVALID, "outputs[%zu] must be an object, got %s", pos, tp_json_kind(o));
    const json_t *jn = json_object_get(o, "name");
    if (!json_is_string(jn))
        return tp_fail(err, TP_INVALID, "outputs[%zu]: 'name' must be a string, got %s", pos,
                       jn ? tp_json_kind(jn) : "nothing");
    const char *name = json_string_value(jn);
    int k = tp_io_find(m->outputs, m->n_outputs, name);
    if (k < 0)
        return tp_fail(err, TP_INVALID, "unknown output '%s' (model '%s' outputs: %s)", name,
                       m->name, tp_io_names(names, sizeof names, m->outputs, m->n_outputs));
    tp_text_copy(sel->name, sizeof sel->name, m->outputs[k].name);
    snprintf(where, sizeof where, "output '%s'", sel->name);
    const json_t *params = json_object_get(o, "parameters");
    if (params && !json_is_object(params))
        return tp_fail(err, TP_INVALID, "%s: 'parameters' must be an object, got %s", where,
                       tp_json_kind(params));
    sel->binary = binary_default;
    tp_status st = get_bool_param(params, "binary_data", where, &sel->binary, err);
    if (st == TP_OK)
        st = parse_classification(params, where, &sel->classes, err);
    if (st != TP_OK || !params || !json_object_get(params, "shared_memory_region"))
        return st;
    if (sel->classes)
        return tp_fail(err, TP_INVALID, "%s: parameters.classification and shared_memory_region cannot be "
                       "combined (the classes are answered in the body)", where);
    sel->binary = 0; /* the bytes go to the region, not the body */
    return shm_params(m, params, where, &sel->shm, &sel->shm_offset, &sel->shm_size, err);
}

/* No "outputs" means every model output, encoded per binary_data_output. */
static tp_status parse_outputs(const tp_kserve_model *m, const json_t *jout, int binary_default,
                               tp_kserve_request *req, tp_err *err)
{
    if (jout && !json_is_array(jout))
        return tp_fail(err, TP_INVALID, "'outputs' must be an array, got %s", tp_json_kind(jout));
    size_t n = jout && json_array_size(jout) ? json_array_size(jout) : (size_t)m->n_outputs;
    if (!(req->outputs = tp_zalloc(n ? n : 1, sizeof *req->outputs)))
        return tp_fail(err, TP_NOMEM, "out of memory");
    req->n_outputs = (int)n;
    for (size_t i = 0; i < n; i++) {
        tp_kserve_output_sel *sel = &req->outputs[i];
        if (!jout || !json_array_size(jout)) {
            tp_text_copy(sel->name, sizeof sel->name, m->outputs[i].name);
            sel->binary = binary_default;
            continue;
        }
        tp_status st = parse_output(m, json_array_get(jout, i), i, binary_default, sel, err);
        if (st != TP_OK)
            return st;
        for (size_t j = 0; j < i; j++)
            if (strcmp(req->outputs[j].name, sel->name) == 0)
                return tp_fail(err, TP_INVALID, "output '%s' is requested more than once",
                               sel->name);
    }
    return TP_OK;
}

/* ---- request ------------------------------------------------------------ */

static tp_status split_body(const char *body, size_t len, long long header_len, bin_tail *tail,
                            size_t *json_len, tp_err *err)
{
    memset(tail, 0, sizeof *tail);
    *json_len = len;
    if (header_len < 0)
        return TP_OK;
    if ((unsigned long long)header_len > len)
        return tp_fail(err, TP_INVALID, "Inference-Header-Content-Length %lld exceeds the body "
                       "length %zu", header_len, len);
    tail->present = 1;
    tail->header_len = header_len;
    tail->p = (const unsigned char *)body + header_len;
    tail->len = len - (size_t)header_len;
    *json_len = (size_t)header_len;
    return TP_OK;
}

/* Triton's request-level "parameters": {"timeout": microseconds}. */
static tp_status parse_timeout(const json_t *params, int64_t *us, tp_err *err)
{
    const json_t *v = params ? json_object_get(params, "timeout") : NULL;
    *us = -1;
    if (v && (!json_is_integer(v) || json_integer_value(v) < 0))
        return tp_fail(err, TP_INVALID, "parameters.timeout must be a non-negative integer "
                       "(microseconds; 0: none)");
    if (v)
        *us = (int64_t)json_integer_value(v);
    return TP_OK;
}

static tp_status parse_root(const tp_kserve_model *m, const json_t *root, const data_text *text,
                            bin_tail *tail, tp_kserve_request *req, tp_err *err)
{
    if (!json_is_object(root))
        return tp_fail(err, TP_PARSE, "request body must be a JSON object, got %s", tp_json_kind(root));
    const json_t *id = json_object_get(root, "id");
    if (id && !json_is_string(id))
        return tp_fail(err, TP_INVALID, "'id' must be a string, got %s", tp_json_kind(id));
    if (id && !(req->id = strdup(json_string_value(id))))
        return tp_fail(err, TP_NOMEM, "out of memory");
    const json_t *params = json_object_get(root, "parameters");
    if (params && !json_is_object(params))
        return tp_fail(err, TP_INVALID, "'parameters' must be an object, got %s", tp_json_kind(params));
    int binary_default = 0;
    tp_status st = get_bool_param(params, "binary_data_output", "request", &binary_default, err);
    if (st != TP_OK || (st = parse_timeout(params, &req->timeout_us, err)) != TP_OK)
        return st;
    if (!(req->inputs = tp_zalloc((size_t)(m->n_inputs ? m->n_inputs : 1), sizeof *req->inputs)))
        return tp_fail(err, TP_NOMEM, "out of memory");
    req->n_inputs = m->n_inputs;
    if ((st = parse_inputs(m, json_object_get(root, "inputs"), text, tail, req->inputs, err)) !=
        TP_OK)
        return st;
    return parse_outputs(m, json_object_get(root, "outputs"), binary_default, req, err);
}

tp_status tp_kserve_parse_infer(const tp_kserve_model *m, const char *body, size_t len,
                                long long header_len, tp_mem_hold *mem, tp_kserve_request *req,
                                tp_err *err)
{
    memset(req, 0, sizeof *req);
    bin_tail tail;
    size_t json_len;
    tp_status st = split_body(body, len, header_len, &tail, &json_len, err);
    if (st != TP_OK)
        return st;
    data_text text = {body, NULL, 0, mem};
    tp_json_span *spans = NULL;
    doc_cache *cache = kserve_doc_cache(); /* this thread's; NULL without memory */
    json_t *root = kserve_cached_whole_doc(cache, body, json_len);
    int made = root ? kserve_request_from_template(cache, m, &tail, req) : 0;
    if (made) {
        json_decref(root);
        return made > 0 ? TP_OK : tp_fail(err, TP_NOMEM, "out of memory reading a %zu-byte request", len);
    }
    if (!root) {
        size_t values;
        if (tp_json_data_spans(body, json_len, (size_t)m->max_json_values, &spans, &text.n_spans, &values) != 0)
            return tp_fail(err, TP_NOMEM, "out of memory scanning a %zu-byte request", json_len);
        text.spans = spans;
        if (m->max_json_values && values > (size_t)m->max_json_values)
            st = tp_fail(err, TP_INVALID, "request has more than %d JSON values outside its tensors' data "
                         "(max_json_values)", m->max_json_values);
        else
            st = kserve_load_json(cache, body, json_len, header_len, &text, &root, err);
    }
    if (st == TP_OK && (st = parse_root(m, root, &text, &tail, req, err)) == TP_OK)
        kserve_keep_template(cache, root, m, &tail, req);
    json_decref(root);
    free(spans);
    if (st != TP_OK)
        tp_kserve_request_free(req);
    return st;
}

int64_t tp_kserve_answer_bytes(const tp_kserve_model *m, const tp_kserve_request *req)
{
    int64_t rows = 1; /* the batch dimension: the first input's dynamic first dim */
    for (int k = 0; k < req->n_inputs && k < m->n_inputs; k++)
        if (m->inputs[k].ndim > 0 && m->inputs[k].shape[0] < 0) {
            rows = req->inputs[k].shape[0];
            break;
        }
    /* the answer echoes the id, escaped: \u00XX is six bytes for one */
    int64_t total = req->id ? 6 * (int64_t)strlen(req->id) : 0;
    for (int k = 0; k < m->n_outputs; k++) { /* the engine hands back every output */
        const tp_io_desc *d = &m->outputs[k];
        int64_t numel = 1;
        for (int j = 0; j < d->ndim; j++)
            numel *= d->shape[j] < 0 ? rows : d->shape[j];
        int64_t bytes = numel * (int64_t)tp_dtype_size(d->dtype);
        total += bytes;
        for (int i = 0; i < req->n_outputs; i++)
            if (!req->outputs[i].shm && strcmp(req->outputs[i].name, d->name) == 0)
                total += req->outputs[i].binary ? bytes : numel * (TP_NUMTEXT_MAX + 1);
    }
    return total;
}

void tp_kserve_request_free(tp_kserve_request *req)
{
    if (!req)
        return;
    tp_host_tensors_free(req->inputs, req->n_inputs); /* borrowed views stay */
    for (int i = 0; i < req->n_outputs && req->outputs; i++)
        tp_shm_release(req->outputs[i].shm);
    free(req->outputs);
    free(req->id);
    memset(req, 0, sizeof *req);
}

/* ---- system shared memory registration ------------------------------------ */

tp_status tp_kserve_parse_shm_register(const char *body, size_t len, char *key, size_t key_size,
                                       uint64_t *offset, uint64_t *byte_size, tp_err *err)
{
    json_t *root;
    tp_status st = tp_json_load_object(body, len, "register request", &root, err);
    if (st != TP_OK)
        return st;
    const json_t *jk = json_object_get(root, "key");
    int has_size, has_off;
    *offset = 0;
    if (!json_is_string(jk) || json_string_length(jk) >= key_size)
        st = tp_fail(err, TP_INVALID, "register request: 'key' must be a string of at most %zu "
                     "bytes, got %s", key_size - 1, tp_json_kind(jk));
    if (st == TP_OK)
        st = get_u64_param(root, "byte_size", "register request", byte_size, &has_size, err);
    if (st == TP_OK)
        st = get_u64_param(root, "offset", "register request", offset, &has_off, err);
    if (st == TP_OK && !has_size)
        st = tp_fail(err, TP_INVALID, "register request has no 'byte_size'");
    if (st == TP_OK)
        snprintf(key, key_size, "%s", json_string_value(jk));
    json_decref(root);
    return st;
}

tp_status tp_kserve_parse_repository_index(const char *body, size_t len, int *ready_only, tp_err *err)
{
    *ready_only = 0;
    if (len == 0)
        return TP_OK;
    json_t *root;
    tp_status st = tp_json_load_object(body, len, "repository index request", &root, err);
    if (st != TP_OK)
        return st;
    const json_t *jr = json_object_get(root, "ready");
    if (jr && !json_is_boolean(jr))
        st = tp_fail(err, TP_INVALID, "repository index request: 'ready' must be true or false, got %s",
                     tp_json_kind(jr));
    else
        *ready_only = json_is_true(jr);
    json_decref(root);
    return st;
}
