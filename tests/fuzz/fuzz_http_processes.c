/* libFuzzer harness: whatever bytes clients send, to a whole server whose
 * rank 1 is a process of its own (fuzz_http.h): every batch crosses the
 * rank group's shared memory and messages. */
#define FUZZ_HTTP_RANKS "processes"
#include "fuzz_http.h"
