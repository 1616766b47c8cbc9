#include "json_kind.h"

#include "json_cap.h"

const char *tp_json_kind(const json_t *v)
{
    if (!v)
        return "missing";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    /* the sign too: most integers refused are refused for it, and "must
     * be a non-negative integer, got an integer" says nothing */
    case JSON_INTEGER: return json_integer_value(v) < 0 ? "a negative integer" : "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

tp_status tp_json_load_object(const char *body, size_t len, const char *what, json_t **out, tp_err *err)
{
    json_error_t je;
    tp_json_cap_begin(len);
    json_t *doc = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    int capped = tp_json_cap_end();
    *out = NULL;
    if (!doc && capped)
        return tp_json_cap_refusal(what, len, err);
    if (!doc)
        return tp_fail(err, TP_PARSE, "malformed JSON in %s at line %d column %d: %s", what, je.line,
                       je.column, je.text);
    if (!json_is_object(doc)) {
        tp_status st = tp_fail(err, TP_INVALID, "%s must be a JSON object, got %s", what, tp_json_kind(doc));
        json_decref(doc);
        return st;
    }
    *out = doc;
    return TP_OK;
}

char *tp_json_take_text(json_t *doc)
{
    char *s = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return s;
}

tp_status tp_json_cap_refusal(const char *what, size_t len, tp_err *err)
{
    return tp_fail(err, TP_INVALID, "%s: its %zu bytes of JSON would take more than %zu bytes to decode "
                   "(max_json_values %d)", what, len, tp_json_cap_bytes(len), tp_json_cap_values());
}
