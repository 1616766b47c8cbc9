/* json_kind.h — "an object", "an array", ... for error messages that say
 * what a JSON value was instead of what was expected, a small request
 * body read as one object with such messages, and a document made text. Shared by every reader of
 * JSON (graphs, safetensors headers, config, KServe requests). */
#ifndef TP_JSON_KIND_H
#define TP_JSON_KIND_H

#include <jansson.h>

#include "status.h"

const char *tp_json_kind(const json_t *v);

/* body as a JSON object (a key twice is refused) into *out, the caller's
 * to json_decref. Otherwise TP_PARSE "malformed JSON in WHAT at line L
 * column C: ..." or TP_INVALID "WHAT must be a JSON object, got an array";
 * decoded within json_cap.h's allowance (TP_INVALID past it). */
tp_status tp_json_load_object(const char *body, size_t len, const char *what, json_t **out, tp_err *err);

/* The refusal of a document that hit json_cap.h's allowance: TP_INVALID
 * naming what, its length and max_json_values. */
tp_status tp_json_cap_refusal(const char *what, size_t len, tp_err *err);

/* doc as compact text (malloc'd), doc released; NULL when doc is NULL (a
 * json_pack that ran out of memory) or the text cannot be made. */
char *tp_json_take_text(json_t *doc);

#endif
