/* kserve.h — the KServe v2 (Open Inference Protocol) codec, with no HTTP in
 * it: request bodies in, tp_host_tensor arrays out, and back.
 *
 * Supports JSON tensors (flat or nested "data"), the binary tensor data
 * extension: a JSON header of Inference-Header-Content-Length bytes followed
 * by the raw little-endian tensors of every input that carries
 * parameters.binary_data_size, in input order; and Triton's system shared
 * memory extension (parameters shared_memory_region, shared_memory_offset,
 * shared_memory_byte_size on inputs and outputs; shm_registry.h); and its
 * classification extension (parameters.classification on an output:
 * classify.h). Datatypes: FP32 FP16 BF16 INT32 INT64; FP16/BF16 as binary,
 * or as JSON numbers (converted); BYTES for classes answered.
 *
 * Every error message says what is wrong and where: which input or output,
 * expected vs got. */
#ifndef TP_KSERVE_H
#define TP_KSERVE_H

#include <stddef.h>

#include "classify.h"
#include "engine.h"
#include "mem_budget.h"
#include "shm_registry.h"

/* What the codec validates requests against: the served graph's signature.
 * Borrowed pointers; the codec never frees them. */
typedef struct {
    const char *name;
    const char *version; /* the one version served, e.g. "1" */
    const tp_io_desc *inputs;
    int n_inputs;
    const tp_io_desc *outputs;
    int n_outputs;
    /* batching, for Triton's model configuration document */
    int64_t max_batch_size;     /* 0: requests run one at a time (dims keep the batch dim) */
    int64_t max_queue_delay_us;
    int max_queue_size;
    int instances; /* instance_group count */
    /* system shared memory regions inputs and outputs may name; NULL: the
     * extension is off (allow_client_shm 0) and such requests are refused */
    tp_shm_registry *shm;
    /* class labels per output (n_outputs entries, NULL where none), for
     * the classification extension; NULL: no output has labels */
    const tp_labels *const *labels;
    /* JSON values (and members) a request may have outside its tensors'
     * data (json_tensor.h counts them before jansson builds any); 0: no limit */
    int max_json_values;
} tp_kserve_model;

/* One output to return, in response order. */
typedef struct {
    char name[128];
    int binary;          /* 1: raw bytes in the binary tail; 0: JSON "data" */
    tp_shm_region *shm;  /* non-NULL: written into this region instead (held until freed) */
    uint64_t shm_offset, shm_size;
    /* Triton's classification extension (parameters.classification): the
     * top `classes` of each batch entry as BYTES "value:index" strings
     * (classify.h) instead of the values; 0: the values */
    int64_t classes;
} tp_kserve_output_sel;

/* A parsed infer request, released by tp_kserve_request_free. Inputs sent
 * as binary tensors are views into the body given to tp_kserve_parse_infer
 * (owner TP_HOST_BORROWED, data possibly unaligned for its type), so their
 * bytes are copied once, by the engine into its staging: the caller keeps
 * that body alive and unchanged until it has freed the request (and every
 * batch the request joined has run). JSON and shared memory inputs are
 * decoded into buffers the request owns. */
typedef struct {
    char *id;                      /* NULL when the request had none */
    tp_host_tensor *inputs;        /* one per model input, in model order */
    int n_inputs;
    tp_kserve_output_sel *outputs; /* what to answer with, never empty */
    int n_outputs;
    int64_t timeout_us;            /* Triton's parameters.timeout; -1 when absent (0: none) */
} tp_kserve_request;

/* An encoded response body, owned by the caller: free it with
 * tp_jbuf_free_text(body, pooled). */
typedef struct {
    char *body;
    size_t len;
    size_t header_len; /* JSON header length when a binary tail follows, else 0 */
    int pooled;        /* body is a buf_pool.h buffer (tp_kserve_build_infer_parts) */
} tp_kserve_buf;

/* header_len: the Inference-Header-Content-Length value, or -1 when the
 * request had none (then the whole body is JSON). The tensors decoded into
 * buffers of the request's own (JSON and shared memory inputs) are taken
 * from mem before they are allocated (NULL: not counted); a refusal is
 * TP_UNAVAILABLE with mem->refused set. On success *req is filled,
 * its binary inputs borrowing from body (see tp_kserve_request); on failure
 * it is left empty and err says why (TP_PARSE or TP_INVALID). */
tp_status tp_kserve_parse_infer(const tp_kserve_model *m, const char *body, size_t len,
                                long long header_len, tp_mem_hold *mem, tp_kserve_request *req,
                                tp_err *err);

/* What req's answer will hold until it is sent, at most: its id as JSON
 * text, every output tensor the engine hands back for its rows, and each
 * requested output's
 * bytes (binary) or text (JSON: TP_NUMTEXT_MAX + 1 bytes an element, the
 * room the number writer is given; the answer, once made, is usually far
 * smaller, and the server gives the difference back then). */
int64_t tp_kserve_answer_bytes(const tp_kserve_model *m, const tp_kserve_request *req);
void tp_kserve_request_free(tp_kserve_request *req);

/* Encodes the outputs req asked for, taken by name from outs. */
tp_status tp_kserve_build_infer(const tp_kserve_model *m, const tp_kserve_request *req,
                                const tp_host_tensor *outs, int n_outs, tp_kserve_buf *out,
                                tp_err *err);

/* A piece of an answer's binary tail: one output's bytes, borrowed. */
typedef struct {
    const void *data;
    size_t len;
} tp_kserve_piece;

/* tp_kserve_build_infer without copying the binary outputs, for the
 * server's answers: out->body comes from this thread's buffer pool while
 * it fits (out->pooled), and holds
 * the JSON header only (out->len bytes; header_len is set as before), and
 * tail[0..*n_tail) point into outs, which must outlive the send. tail has
 * room for req->n_outputs pieces. An answer of at most whole_max bytes in
 * all comes back whole instead, as tp_kserve_build_infer builds it, with
 * *n_tail 0: for a small answer one body is cheaper than pieces. */
tp_status tp_kserve_build_infer_parts(const tp_kserve_model *m, const tp_kserve_request *req,
                                      const tp_host_tensor *outs, int n_outs, size_t whole_max,
                                      tp_kserve_buf *out, tp_kserve_piece *tail, int *n_tail,
                                      tp_err *err);

/* The body of POST /v2/systemsharedmemory/region/R/register:
 * {"key": string, "offset": number (optional, 0), "byte_size": number}. */
tp_status tp_kserve_parse_shm_register(const char *body, size_t len, char *key, size_t key_size,
                                       uint64_t *offset, uint64_t *byte_size, tp_err *err);

/* The body of POST /v2/repository/index: empty, or {"ready": bool}
 * (ready true: only models ready for inference). */
tp_status tp_kserve_parse_repository_index(const char *body, size_t len, int *ready_only, tp_err *err);

/* Small JSON documents; each returns a malloc'ed string or NULL (no memory). */
char *tp_kserve_server_metadata(const char *version);
char *tp_kserve_model_metadata(const tp_kserve_model *m);
/* Triton's model configuration extension (GET /v2/models/M/config): the
 * model_config.proto fields clients read (name, platform, max_batch_size,
 * input/output with data_type and dims, dynamic_batching). */
char *tp_kserve_model_config(const tp_kserve_model *m);
/* Triton's model repository index: [] when name is NULL, else the one
 * model with its state (READY, LOADING, UNAVAILABLE, UNLOADING) and,
 * when reason is not empty, why. */
char *tp_kserve_repository_index(const char *name, const char *version, const char *state, const char *reason);
char *tp_kserve_error_json(const char *msg);
/* {"<key>": true|false}, e.g. {"live": true}. */
char *tp_kserve_bool_json(const char *key, int value);

#endif
