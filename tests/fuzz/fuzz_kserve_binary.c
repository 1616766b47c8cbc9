/* libFuzzer harness: the binary tensor data extension. The first two bytes
 * choose the Inference-Header-Content-Length (including values past the
 * body and none at all); the rest is the body, a JSON header followed by
 * raw tensors. Exercises the split of the body and the binary_data_size
 * accounting on top of the JSON decoder. */
#include "fuzz_model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    /* 0xffff: no header length (pure JSON); else a length up to 64 KiB,
     * usually within the body, sometimes past it */
    unsigned v = (unsigned)data[0] | (unsigned)data[1] << 8;
    long long header_len = v == 0xffff ? -1 : (long long)v;
    fuzz_decode_encode((const char *)data + 2, size - 2, header_len);
    return 0;
}
