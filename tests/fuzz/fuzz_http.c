/* libFuzzer harness: whatever bytes clients send, to a whole server whose
 * ranks are threads of its process (fuzz_http.h). */
#define FUZZ_HTTP_RANKS "threads"
#include "fuzz_http.h"
