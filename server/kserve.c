#include "kserve.h"
#include "classify.h"
#include "json_cap.h"
#include "json_kind.h"
#include "json_tensor.h"
#include "numtext.h"
#include "text.h"
#include "io_check.h"
#include "thread_slot.h"
#include "zalloc.h"

#include <float.h>
#include <stdio.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- small helpers ------------------------------------------------------ */

static const char *shape_str(char *buf, int ndim, const int64_t *shape)
{
    return tp_shape_str(buf, 128, ndim, shape);
}

static int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
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

/* Where the request's JSON data arrays are: read from the body text
 * (json_tensor.h), so jansson never holds a node per element. */
typedef struct {
    const char *body;
    const tp_json_span *spans;
    int n_spans;
    tp_mem_hold *mem; /* what decoded tensors take from the memory budget (NULL: not counted) */
} data_text;

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

/* The binary section of the body, consumed input by input. */
typedef struct {
    const unsigned char *p;
    size_t len, off;
    int present; /* the request had Inference-Header-Content-Length */
    long long header_len;
} bin_tail;

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

/* ---- the last document, per thread -------------------------------------- *
 *
 * A client sends the same JSON around its data again and again: the same
 * names, shapes and datatypes, with the data arrays left out (JSON
 * tensors, which jansson never sees) or in the binary tail. jansson took
 * about 2.3 us to parse a 130-byte binary header (a tenth of a binary
 * request's server CPU at 32 connections), so each HTTP thread keeps the
 * last document it parsed, by its exact text, and a request whose text is
 * the same byte for byte reuses it. parse_root only reads the document, and
 * only its thread ever touches it. A document that failed, or had bytes
 * after it, is never kept: the same text would fail the same way. */

#define DOC_CACHE_MAX 4096 /* bytes of text a thread keeps a document for */

/* The request parse_root made of the kept document, when every input of it
 * was binary: the same header text over a binary section of the same
 * length, against the same model, makes the same request but for where
 * each input's bytes are (offsets into the section). Checking that is a
 * memcmp and a few compares; parse_root's lookups, checks and allocations
 * were most of what a binary request's header still cost with the
 * document kept (3.3k instructions a request, 0.8k with this; callgrind,
 * 2026-11-27). Requests naming a shared memory region are never kept: the
 * registry changes between them. */
typedef struct {
    tp_kserve_request req;   /* inputs' data NULL: see off */
    size_t *off;             /* input k's bytes: at off[k] of the binary section */
    size_t tail_len;         /* the binary section's length it was parsed with */
    const tp_kserve_model *m; /* the model, and its signature as it was (sig) */
    char *sig;
    size_t sig_len;
} req_template;

typedef struct {
    size_t len;
    json_t *root;
    int whole; /* text was the whole JSON part of its body: it had no data arrays */
    req_template *tmpl; /* NULL: none for this document */
    char text[DOC_CACHE_MAX];
} doc_cache;

static void template_free(req_template *t)
{
    if (!t)
        return;
    tp_kserve_request_free(&t->req);
    free(t->off);
    free(t->sig);
    free(t);
}

static void doc_cache_free(void *p)
{
    doc_cache *c = p;
    json_decref(c->root);
    template_free(c->tmpl);
    free(c);
}

/* Each thread's cache, created on first use */
static tp_thread_slot doc_cache_slot = TP_THREAD_SLOT(doc_cache_free, sizeof(doc_cache));

/* The document of text[0..len), when this thread parsed the same text last
 * (a new reference); NULL otherwise. */
static json_t *cached_doc(doc_cache *c, const char *text, size_t len)
{
    if (!c || !c->root || c->len != len || memcmp(c->text, text, len) != 0)
        return NULL;
    return json_incref(c->root);
}

static void keep_doc(doc_cache *c, const char *text, size_t len, int whole, json_t *root)
{
    if (!c || len > DOC_CACHE_MAX)
        return;
    json_decref(c->root);
    template_free(c->tmpl);
    c->tmpl = NULL;
    memcpy(c->text, text, len);
    c->len = len;
    c->whole = whole;
    c->root = json_incref(root);
}

/* The document of a body whose JSON part, body[0..len), is byte for byte
 * the whole text of c's last document: a binary request's header, sent
 * again. Such a text has no data arrays (it was kept so), so it needs no
 * scan for them either, which cost as much again as the rest of reading a
 * binary request's header. NULL otherwise. */
static json_t *cached_whole_doc(doc_cache *c, const char *body, size_t len)
{
    return c && c->whole ? cached_doc(c, body, len) : NULL;
}

/* Parses one JSON document (or reuses cache's last one, above). Bytes
 * after it are reported apart from plain syntax errors: they usually mean a
 * binary tail sent without its Inference-Header-Content-Length header. */
static tp_status load_json(doc_cache *cache, const char *body, size_t len, long long header_len,
                           const data_text *text, json_t **out, tp_err *err)
{
    char outside[DOC_CACHE_MAX];
    const char *doc = body;
    size_t doc_len = len;
    if (text->n_spans > 0) {
        doc = outside;
        doc_len = tp_json_outside_spans(body, len, text->spans, text->n_spans, outside, sizeof outside);
    }
    if ((*out = cached_doc(cache, doc, doc_len)))
        return TP_OK;
    json_error_t jerr;
    size_t flags = JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK;
    /* past the buffer doc_len only says "more": the body bounds the text */
    size_t text_len = doc_len <= sizeof outside ? doc_len : len;
    tp_json_cap_begin(text_len);
    /* the outside text, when it was built whole above, is what jansson reads */
    json_t *root = doc == outside && doc_len <= sizeof outside
                       ? tp_json_load_outside_text(body, text->spans, text->n_spans, outside,
                                                   doc_len, flags, &jerr)
                       : tp_json_load_outside_spans(body, len, text->spans, text->n_spans, flags,
                                                    &jerr);
    if (tp_json_cap_end() && !root)
        return tp_json_cap_refusal("request", text_len, err);
    if (!root && json_error_code(&jerr) == json_error_out_of_memory)
        return tp_fail(err, TP_NOMEM, "out of memory parsing a %zu-byte request", len);
    if (!root)
        return tp_fail(err, TP_PARSE, "malformed JSON in request body at line %d column %d: %s",
                       jerr.line, jerr.column, jerr.text);
    size_t end = (size_t)jerr.position;
    while (end < len && strchr(" \t\r\n", body[end]) && body[end])
        end++;
    if (end < len && header_len >= 0) {
        json_decref(root);
        return tp_fail(err, TP_INVALID, "Inference-Header-Content-Length %lld runs %zu bytes past the JSON header, "
                       "which ends at byte %zu: it must be the length of the JSON header alone",
                       header_len, len - end, (size_t)jerr.position);
    }
    if (end < len) {
        json_decref(root);
        return tp_fail(err, TP_PARSE, "request body has %zu bytes after the JSON document (at "
                       "byte %zu); a binary tensor tail needs the Inference-Header-Content-Length "
                       "header", len - end, (size_t)jerr.position);
    }
    keep_doc(cache, doc, doc_len, doc == body, root);
    *out = root;
    return TP_OK;
}

/* The model's inputs' and outputs' names, dtypes and shapes as bytes,
 * written to buf or compared with cmp (a caller may build another model
 * at the same address, so the template keeps what its model was). */
typedef struct {
    char *buf;       /* NULL: only counted (len) */
    const char *cmp; /* non-NULL: compared instead (cap bytes) */
    size_t len, cap;
    int differs;
} sig_sink;

static void sig_put(sig_sink *s, const void *v, size_t n)
{
    if (s->cmp)
        s->differs |= s->len + n > s->cap || memcmp(s->cmp + s->len, v, n) != 0;
    else if (s->buf)
        memcpy(s->buf + s->len, v, n);
    s->len += n;
}

/* dtype, ndim and shape are put as one run of bytes: no padding among them */
#define IO_DESC_RUN (offsetof(tp_io_desc, shape) + sizeof(((tp_io_desc *)0)->shape) - offsetof(tp_io_desc, dtype))
_Static_assert(IO_DESC_RUN == sizeof(tp_dtype) + sizeof(int) + sizeof(int64_t) * TP_MAX_DIMS,
               "tp_io_desc has padding between dtype and shape");

static void model_signature(const tp_kserve_model *m, sig_sink *s)
{
    sig_put(s, &m->n_inputs, sizeof m->n_inputs);
    sig_put(s, &m->n_outputs, sizeof m->n_outputs);
    for (int pass = 0; pass < 2 && !s->differs; pass++) {
        const tp_io_desc *io = pass ? m->outputs : m->inputs;
        for (int i = 0; i < (pass ? m->n_outputs : m->n_inputs); i++) {
            sig_put(s, io[i].name, strlen(io[i].name) + 1);
            sig_put(s, &io[i].dtype, IO_DESC_RUN);
        }
    }
}

/* Whether req, just parsed from c's document, can be kept as its
 * template: every input a view into the binary section, no output in a
 * shared memory region. */
static int templatable(const tp_kserve_request *req, const bin_tail *tail)
{
    if (!tail->present)
        return 0;
    for (int k = 0; k < req->n_inputs; k++) {
        const unsigned char *d = req->inputs[k].data;
        if (req->inputs[k].owner != TP_HOST_BORROWED || d < tail->p ||
            (size_t)(d - tail->p) + req->inputs[k].nbytes > tail->len)
            return 0;
    }
    for (int i = 0; i < req->n_outputs; i++)
        if (req->outputs[i].shm)
            return 0;
    return 1;
}

/* A copy of req's header (id, inputs' and outputs' descriptions); its
 * inputs' data NULL. TP_NOMEM or TP_OK. */
static tp_status copy_request(const tp_kserve_request *req, tp_kserve_request *to)
{
    *to = *req;
    to->id = NULL;
    to->outputs = NULL;
    to->inputs = malloc((size_t)(req->n_inputs ? req->n_inputs : 1) * sizeof *req->inputs);
    if (to->inputs)
        memcpy(to->inputs, req->inputs, (size_t)req->n_inputs * sizeof *req->inputs);
    to->outputs = malloc((size_t)(req->n_outputs ? req->n_outputs : 1) * sizeof *req->outputs);
    if (to->outputs)
        memcpy(to->outputs, req->outputs, (size_t)req->n_outputs * sizeof *req->outputs);
    if (req->id)
        to->id = strdup(req->id);
    if (!to->inputs || !to->outputs || (req->id && !to->id)) {
        free(to->inputs);
        to->inputs = NULL;
        to->n_inputs = 0;
        tp_kserve_request_free(to);
        return TP_NOMEM;
    }
    return TP_OK;
}

/* Keeps req as the template of c's document (root) when it can be one;
 * without memory it is simply not kept. */
static void keep_template(doc_cache *c, const json_t *root, const tp_kserve_model *m,
                          const bin_tail *tail, const tp_kserve_request *req)
{
    if (!c || c->root != root || !c->whole || c->tmpl || !templatable(req, tail))
        return;
    sig_sink sig = {0};
    model_signature(m, &sig);
    req_template *t = calloc(1, sizeof *t);
    if (!t || !(t->off = malloc((size_t)(req->n_inputs ? req->n_inputs : 1) * sizeof *t->off)) ||
        !(t->sig = malloc(sig.len)) || copy_request(req, &t->req) != TP_OK) {
        template_free(t);
        return;
    }
    sig = (sig_sink){.buf = t->sig};
    model_signature(m, &sig);
    t->sig_len = sig.len;
    for (int k = 0; k < req->n_inputs; k++) {
        t->off[k] = (size_t)((const unsigned char *)req->inputs[k].data - tail->p);
        t->req.inputs[k].data = NULL;
    }
    t->tail_len = tail->len;
    t->m = m;
    c->tmpl = t;
}

/* req made from c's template (c's document is the request's header, byte
 * for byte) when it fits this body and model: 1, or -1 without memory; 0:
 * parse the document instead. */
static int request_from_template(const doc_cache *c, const tp_kserve_model *m,
                                 const bin_tail *tail, tp_kserve_request *req)
{
    const req_template *t = c->tmpl;
    if (!t || !tail->present || tail->len != t->tail_len || t->m != m)
        return 0;
    sig_sink sig = {.cmp = t->sig, .cap = t->sig_len};
    model_signature(m, &sig);
    if (sig.differs || sig.len != t->sig_len)
        return 0;
    if (copy_request(&t->req, req) != TP_OK)
        return -1;
    for (int k = 0; k < req->n_inputs; k++)
        req->inputs[k].data = (void *)(tail->p + t->off[k]);
    return 1;
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
    doc_cache *cache = tp_thread_slot_get(&doc_cache_slot); /* this thread's; NULL without memory */
    json_t *root = cached_whole_doc(cache, body, json_len);
    int made = root ? request_from_template(cache, m, &tail, req) : 0;
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
            st = load_json(cache, body, json_len, header_len, &text, &root, err);
    }
    if (st == TP_OK && (st = parse_root(m, root, &text, &tail, req, err)) == TP_OK)
        keep_template(cache, root, m, &tail, req);
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

/* ---- small documents ---------------------------------------------------- */

char *tp_kserve_server_metadata(const char *version)
{
    return tp_json_take_text(json_pack("{s:s, s:s, s:[s, s, s, s, s, s, s, s]}", "name", "tpserve", "version",
                                   version, "extensions", "binary_tensor_data", "classification",
                                   "model_configuration", "statistics", "system_shared_memory",
                                   "model_repository", "logging", "trace"));
}

char *tp_kserve_repository_index(const char *name, const char *version, const char *state, const char *reason)
{
    if (!name)
        return tp_json_take_text(json_array());
    json_t *m = json_pack("{s:s, s:s, s:s}", "name", name, "version", version, "state", state);
    if (m && reason && *reason)
        json_object_set_new(m, "reason", json_string(reason));
    return tp_json_take_text(m ? json_pack("[o]", m) : NULL);
}

static json_t *shape_json(int ndim, const int64_t *shape)
{
    json_t *a = json_array();
    for (int i = 0; a && i < ndim; i++)
        json_array_append_new(a, json_integer((json_int_t)shape[i]));
    return a;
}

static json_t *io_json(const tp_io_desc *io, int n)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++)
        json_array_append_new(a, json_pack("{s:s, s:s, s:o}", "name", io[i].name, "datatype",
                                           tp_dtype_name(io[i].dtype), "shape",
                                           shape_json(io[i].ndim, io[i].shape)));
    return a;
}

char *tp_kserve_model_metadata(const tp_kserve_model *m)
{
    return tp_json_take_text(json_pack("{s:s, s:[s], s:s, s:o, s:o}", "name", m->name, "versions",
                                   m->version ? m->version : "1", "platform", "tpserve", "inputs",
                                   io_json(m->inputs, m->n_inputs), "outputs",
                                   io_json(m->outputs, m->n_outputs)));
}

/* model_config.proto's dims leave out the batch dim when max_batch_size > 0. */
/* labels: the outputs' (NULL for inputs, or when none has any), named as
 * Triton names its label_filename. */
static json_t *config_io_json(const tp_io_desc *io, int n, int batched, int is_input,
                              const tp_labels *const *labels)
{
    json_t *a = json_array();
    for (int i = 0; a && i < n; i++) {
        int skip = batched && io[i].ndim > 0;
        char type[32];
        snprintf(type, sizeof type, "TYPE_%s", tp_dtype_name(io[i].dtype));
        json_t *o = json_pack("{s:s, s:s, s:o, s:b}", "name", io[i].name, "data_type", type,
                              "dims", shape_json(io[i].ndim - skip, io[i].shape + skip),
                              "is_shape_tensor", 0);
        if (o && is_input)
            json_object_update_new(o, json_pack("{s:s, s:b, s:b}", "format", "FORMAT_NONE",
                                                "allow_ragged_batch", 0, "optional", 0));
        if (o && labels && labels[i])
            json_object_set_new(o, "label_filename", json_string(tp_labels_path(labels[i])));
        json_array_append_new(a, o);
    }
    return a;
}

char *tp_kserve_model_config(const tp_kserve_model *m)
{
    int batched = m->max_batch_size > 0;
    json_t *doc = json_pack("{s:s, s:s, s:s, s:I, s:{s:{s:i}}, s:o, s:o, s:[{s:s, s:s, s:i}]}",
                            "name", m->name, "platform", "tpserve", "backend", "tpserve",
                            "max_batch_size", (json_int_t)m->max_batch_size, "version_policy",
                            "latest", "num_versions", 1, "input",
                            config_io_json(m->inputs, m->n_inputs, batched, 1, NULL), "output",
                            config_io_json(m->outputs, m->n_outputs, batched, 0, m->labels),
                            "instance_group", "name", m->name, "kind", "KIND_MODEL", "count",
                            m->instances > 0 ? m->instances : 1);
    if (doc && batched)
        json_object_set_new(doc, "dynamic_batching",
                            json_pack("{s:[], s:I, s:b, s:{s:I}}", "preferred_batch_size",
                                      "max_queue_delay_microseconds",
                                      (json_int_t)m->max_queue_delay_us, "preserve_ordering", 1,
                                      "default_queue_policy", "max_queue_size",
                                      (json_int_t)m->max_queue_size));
    return tp_json_take_text(doc);
}

/* Messages quote client text (paths, names) and may be cut mid-character by
 * tp_err's size; JSON strings must be UTF-8, so such bytes become '?'. */
char *tp_kserve_error_json(const char *msg)
{
    json_t *s = json_string(msg);
    if (!s) {
        char clean[sizeof(tp_err)];
        size_t n = 0;
        for (; msg[n] && n < sizeof clean - 1; n++)
            clean[n] = (unsigned char)msg[n] < 0x80 ? msg[n] : '?';
        clean[n] = '\0';
        s = json_string(clean);
    }
    return tp_json_take_text(json_pack("{s:o}", "error", s));
}

char *tp_kserve_bool_json(const char *key, int value)
{
    return tp_json_take_text(json_pack("{s:b}", key, value));
}
