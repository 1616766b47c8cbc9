#include "backend.h"

#include <string.h>

#include "cpu/cpu_backend.h"

tp_status tp_backend_create(const char *name, int world, tp_backend **out, tp_err *err)
{
    if (!name || strcmp(name, "cpu") == 0 || strcmp(name, "auto") == 0)
        return tp_cpu_backend_create(world, out, err);
    if (strcmp(name, "cuda") == 0)
        return tp_fail(err, TP_UNAVAILABLE,
                       "backend 'cuda': not available in this build (no CUDA device support linked); use --backend cpu");
    return tp_fail(err, TP_INVALID, "unknown backend '%s' (expected cpu, cuda or auto)", name);
}
