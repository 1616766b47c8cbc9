/* backend.c — picks a backend by name. "auto" takes cuda only when this
 * process can really drive world_size GPUs, and otherwise says why it fell
 * back to cpu (tp_backend.note, logged by the server). */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_backend.h"
#ifdef TP_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* One process is one GPU rank: RANK and TP_NCCL_ID come from the launcher
 * (torchrun-style) when world_size > 1. */
static tp_status cuda_create(int world, tp_backend **out, tp_err *err)
{
#ifdef TP_HAVE_CUDA
    const char *rank = getenv("RANK");
    return tp_cuda_backend_create(world, rank ? atoi(rank) : 0, getenv("TP_NCCL_ID"), out, err);
#else
    (void)world;
    (void)out;
    return tp_fail(err, TP_UNAVAILABLE, "backend 'cuda': not available in this build (built without nvcc); use --backend cpu");
#endif
}

static tp_status auto_create(int world, tp_backend **out, tp_err *err)
{
    char why[160] = "built without nvcc";
#ifdef TP_HAVE_CUDA
    int n = tp_cuda_probe(why, sizeof why);
    if (n >= world && (world == 1 || getenv("TP_NCCL_ID")))
        return cuda_create(world, out, err);
    if (n > 0 && n < world)
        snprintf(why, sizeof why, "%d CUDA device(s) for world_size %d", n, world);
    else if (n > 0)
        snprintf(why, sizeof why, "world_size %d needs one process per GPU (no TP_NCCL_ID rendezvous)", world);
#endif
    tp_status st = tp_cpu_backend_create(world, NULL, out, err);
    if (st == TP_OK)
        snprintf((*out)->note, sizeof (*out)->note, "backend auto chose cpu: %s", why);
    return st;
}

tp_status tp_backend_create(const char *name, int world, tp_backend **out, tp_err *err)
{
    if (!name || strcmp(name, "cpu") == 0)
        return tp_cpu_backend_create(world, NULL, out, err);
    if (strcmp(name, "auto") == 0)
        return auto_create(world, out, err);
    if (strcmp(name, "cuda") == 0)
        return cuda_create(world, out, err);
    return tp_fail(err, TP_INVALID, "unknown backend '%s' (expected cpu, cuda or auto)", name);
}
