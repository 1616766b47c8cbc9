/* kserve_internal.h — what the files of the KServe codec share, and no
 * other file sees (theirs is kserve.h): kserve.c reads requests,
 * kserve_doc_cache.c keeps each HTTP thread's last request document and
 * the request made of it, kserve_response.c writes answers, kserve_docs.c
 * the small documents (metadata, configuration, repository index). */
#ifndef TP_KSERVE_INTERNAL_H
#define TP_KSERVE_INTERNAL_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "json_tensor.h"
#include "kserve.h"

/* Where the request's JSON data arrays are: read from the body text
 * (json_tensor.h), so jansson never holds a node per element. */
typedef struct {
    const char *body;
    const tp_json_span *spans;
    int n_spans;
    tp_mem_hold *mem; /* what decoded tensors take from the memory budget (NULL: not counted) */
} data_text;

/* The binary section of the body, consumed input by input. */
typedef struct {
    const unsigned char *p;
    size_t len, off;
    int present; /* the request had Inference-Header-Content-Length */
    long long header_len;
} bin_tail;

static inline int64_t numel_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* ---- the last document, per thread (kserve_doc_cache.c) ---------------- */

typedef struct doc_cache doc_cache;

/* This thread's cache, created on first use; NULL without memory (every
 * function below then keeps and finds nothing). */
doc_cache *kserve_doc_cache(void);
/* The document of a body whose JSON part, body[0..len), is byte for byte
 * the whole text of c's last document; NULL otherwise. */
json_t *kserve_cached_whole_doc(doc_cache *c, const char *body, size_t len);
/* Parses one JSON document (or reuses c's last one); kept for the next. */
tp_status kserve_load_json(doc_cache *c, const char *body, size_t len, long long header_len,
                           const data_text *text, json_t **out, tp_err *err);
/* Keeps req, just parsed from c's document root, as its template when it
 * can be one. */
void kserve_keep_template(doc_cache *c, const json_t *root, const tp_kserve_model *m, const bin_tail *tail,
                          const tp_kserve_request *req);
/* req made from c's template: 1, -1 without memory, 0: parse instead. */
int kserve_request_from_template(const doc_cache *c, const tp_kserve_model *m, const bin_tail *tail,
                                 tp_kserve_request *req);

#endif
