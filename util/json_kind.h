/* json_kind.h — "an object", "an array", ... for error messages that say
 * what a JSON value was instead of what was expected. Shared by every
 * reader of JSON (graphs, safetensors headers, config, KServe requests). */
#ifndef TP_JSON_KIND_H
#define TP_JSON_KIND_H

#include <jansson.h>

const char *tp_json_kind(const json_t *v);

#endif
