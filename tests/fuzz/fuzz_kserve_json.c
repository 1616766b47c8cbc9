/* libFuzzer harness: the KServe v2 request decoder on JSON bodies, then the
 * encoder on what it decoded. The model mixes every datatype, a batch dim,
 * a static shape and a scalar-like row, so shape, dtype and nesting checks
 * all run. Any input must end in TP_OK or a one-line error: never a crash,
 * a leak or undefined behaviour. */
#include "fuzz_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_decode_encode((const char *)data, size, -1);
    return 0;
}
