/* fuzz_model.h — the model the KServe harnesses decode against, and one
 * decode + encode round (header-only: each harness is one translation unit
 * linked against libtpserve.a). */
#ifndef TP_FUZZ_MODEL_H
#define TP_FUZZ_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_error.h"
#include "json_cap.h"
#include "kserve.h"

static const tp_io_desc fuzz_inputs[] = {
    {"x", TP_F32, 3, {-1, 2, 3}},
    {"ids", TP_I64, 2, {-1, 4}},
    {"h", TP_F16, 1, {2}},
    {"b", TP_BF16, 2, {-1, 1}},
    {"i", TP_I32, 1, {3}},
};
#define FUZZ_N_INPUTS ((int)(sizeof fuzz_inputs / sizeof *fuzz_inputs))

/* The server's own bounds, smaller: the value count, jansson's allowance
 * and a memory budget a large decoded tensor can pass (issue 50). */
#define FUZZ_MAX_JSON_VALUES 4096
static const tp_kserve_model fuzz_model = {.name = "m", .version = "1", .inputs = fuzz_inputs, .n_inputs = FUZZ_N_INPUTS,
                                           .outputs = fuzz_inputs, .n_outputs = FUZZ_N_INPUTS,
                                           .max_json_values = FUZZ_MAX_JSON_VALUES};

/* Whether two decodes of one body gave the same request: the second
 * reused the thread's kept document or request (kserve_doc_cache.c), and must not
 * differ from a fresh parse in anything but where a JSON input's bytes
 * were put. */
static inline int fuzz_same_request(const tp_kserve_request *a, const tp_kserve_request *b)
{
    if ((!a->id != !b->id) || (a->id && strcmp(a->id, b->id) != 0) || a->timeout_us != b->timeout_us ||
        a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
        return 0;
    for (int k = 0; k < a->n_inputs; k++) {
        const tp_host_tensor *x = &a->inputs[k], *y = &b->inputs[k];
        if (strcmp(x->name, y->name) != 0 || x->dtype != y->dtype || x->ndim != y->ndim ||
            memcmp(x->shape, y->shape, sizeof x->shape) != 0 || x->nbytes != y->nbytes ||
            (x->owner == TP_HOST_BORROWED) != (y->owner == TP_HOST_BORROWED) ||
            (x->owner == TP_HOST_BORROWED && x->data != y->data) ||
            (x->nbytes && memcmp(x->data, y->data, x->nbytes) != 0))
            return 0;
    }
    return memcmp(a->outputs, b->outputs, (size_t)a->n_outputs * sizeof *a->outputs) == 0;
}

/* Decodes body twice (the second decode reuses what the first kept; both
 * must give the same request or the same error); when it is valid,
 * encodes the decoded inputs back as the outputs the request asked for
 * (JSON or binary), as the server would. */
static inline void fuzz_decode_encode(const char *body, size_t len, long long header_len)
{
    static tp_mem_budget *budget;
    if (!budget) {
        budget = tp_mem_budget_create((int64_t)1 << 20);
        tp_json_cap_set_values(FUZZ_MAX_JSON_VALUES);
    }
    tp_kserve_request req, again;
    tp_err err, err2;
    memset(&req, 0, sizeof req);
    tp_mem_hold mem = {budget, 0, TP_MEM_OK}, mem2 = {budget, 0, TP_MEM_OK};
    tp_status st = tp_kserve_parse_infer(&fuzz_model, body, len, header_len, &mem, &req, &err);
    tp_status st2 = tp_kserve_parse_infer(&fuzz_model, body, len, header_len, &mem2, &again, &err2);
    /* what a request holds is its own: a refusal says so, and nothing
     * outlives the request */
    if (st != st2 || (st != TP_OK && strcmp(err.msg, err2.msg) != 0) ||
        (st == TP_OK && !fuzz_same_request(&req, &again)) || (st == TP_UNAVAILABLE) != (mem.refused != TP_MEM_OK))
        abort();
    tp_mem_release(&mem);
    tp_mem_release(&mem2);
    if (tp_mem_budget_used(budget) != 0)
        abort();
    if (st2 == TP_OK)
        tp_kserve_request_free(&again);
    if (st != TP_OK) {
        fuzz_check_error_line(&err);
        return;
    }
    tp_kserve_buf out = {0};
    if (tp_kserve_build_infer(&fuzz_model, &req, req.inputs, req.n_inputs, &out, &err) == TP_OK)
        free(out.body);
    tp_kserve_request_free(&req);
}

#endif
