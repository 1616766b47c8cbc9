/* kserve_docs.c — the KServe codec's small documents: server and model
 * metadata, Triton's model configuration, the repository index, errors
 * (kserve.h). */
#include "kserve_internal.h"
#include "json_kind.h"
#include "io_check.h"
#include "text.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
