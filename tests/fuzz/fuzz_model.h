/* fuzz_model.h — the model the KServe harnesses decode against, and one
 * decode + encode round (header-only: each harness is one translation unit
 * linked against libtpserve.a). */
#ifndef TP_FUZZ_MODEL_H
#define TP_FUZZ_MODEL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_error.h"
#include "kserve.h"

static const tp_io_desc fuzz_inputs[] = {
    {"x", TP_F32, 3, {-1, 2, 3}},
    {"ids", TP_I64, 2, {-1, 4}},
    {"h", TP_F16, 1, {2}},
    {"b", TP_BF16, 2, {-1, 1}},
    {"i", TP_I32, 1, {3}},
};
#define FUZZ_N_INPUTS ((int)(sizeof fuzz_inputs / sizeof *fuzz_inputs))

static const tp_kserve_model fuzz_model = {.name = "m", .version = "1", .inputs = fuzz_inputs, .n_inputs = FUZZ_N_INPUTS,
                                           .outputs = fuzz_inputs, .n_outputs = FUZZ_N_INPUTS};

/* Decodes body; when it is valid, encodes the decoded inputs back as the
 * outputs the request asked for (JSON or binary), as the server would. */
static inline void fuzz_decode_encode(const char *body, size_t len, long long header_len)
{
    tp_kserve_request req;
    tp_err err;
    memset(&req, 0, sizeof req);
    if (tp_kserve_parse_infer(&fuzz_model, body, len, header_len, &req, &err) != TP_OK) {
        fuzz_check_error_line(&err);
        return;
    }
    tp_kserve_buf out = {0};
    if (tp_kserve_build_infer(&fuzz_model, &req, req.inputs, req.n_inputs, &out, &err) == TP_OK)
        free(out.body);
    tp_kserve_request_free(&req);
}

#endif
