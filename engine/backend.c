/* backend.c — picks a backend by name. "auto" takes cuda only when this
 * process can really drive world_size GPUs, and otherwise says why it fell
 * back to cpu (tp_backend.note, logged by the server). */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_backend.h"
#include "rank_group.h"
#ifdef TP_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* Within one process cuda runs one rank: several ranks need one process per
 * GPU (a process rank group, tp_backend_create_for_group). */
static tp_status cuda_create(int world, tp_backend **out, tp_err *err)
{
#ifdef TP_HAVE_CUDA
    if (world > 1)
        return tp_fail(err, TP_INVALID, "backend 'cuda' runs one process per GPU: world_size %d needs ranks=processes "
                       "(--ranks processes)", world);
    return tp_cuda_backend_create(1, 0, NULL, out, err);
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
    if (n >= 1 && world == 1)
        return cuda_create(world, out, err);
    if (n > 0)
        snprintf(why, sizeof why, "world_size %d needs one process per GPU (ranks=processes)", world);
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

/* ---------------------------------------------------------- process groups
 *
 * The leader chooses (auto decides once, for everyone) and tells the
 * workers what it chose: "cpu", or "cuda <nccl id>" sent before its own
 * create because ncclCommInitRank blocks until every rank joins. The cpu
 * owner initializes the shared comm area before any worker attaches. */

static tp_cpu_shared cpu_layout(const tp_rank_group *rg)
{
    const tp_rank_shared *s = tp_rank_group_shared(rg);
    int lo, hi;
    tp_rank_group_local(rg, &lo, &hi);
    return (tp_cpu_shared){s->base, s->comm_offset, s->comm_bytes, s->heap_offset, s->heap_bytes, lo, hi, lo == 0};
}

#ifdef TP_HAVE_CUDA
static tp_status cuda_join(tp_rank_group *rg, const char *id, tp_backend **out, tp_err *err)
{
    return tp_cuda_backend_create_in_group(rg, id, out, err);
}
#endif

static tp_status lead_group(const char *name, tp_rank_group *rg, tp_backend **out, tp_err *err)
{
    char msg[TP_GROUP_MESSAGE] = "cpu";
    int world = tp_rank_group_world(rg);
    int use_cuda = name && strcmp(name, "cuda") == 0;
    char why[160] = "built without nvcc";
#ifdef TP_HAVE_CUDA
    if (name && strcmp(name, "auto") == 0) {
        int n = tp_cuda_probe(why, sizeof why);
        use_cuda = n >= world; /* one GPU per rank on this node */
        if (n > 0 && n < world)
            snprintf(why, sizeof why, "%d CUDA device(s) for world_size %d", n, world);
    }
    if (use_cuda) {
        char id[TP_CUDA_NCCL_ID_HEX + 1];
        tp_status st = tp_cuda_nccl_id_new(id, err);
        size_t len = (size_t)snprintf(msg, sizeof msg, "cuda %s", id) + 1;
        if (st == TP_OK)
            st = tp_rank_group_share(rg, msg, &len, sizeof msg, err);
        return st == TP_OK ? cuda_join(rg, id, out, err) : st;
    }
#else
    if (use_cuda)
        return cuda_create(world, out, err);
#endif
    if (name && strcmp(name, "cpu") && strcmp(name, "auto") && strcmp(name, "cuda"))
        return tp_fail(err, TP_INVALID, "unknown backend '%s' (expected cpu, cuda or auto)", name);
    tp_cpu_shared sh = cpu_layout(rg);
    tp_status st = tp_cpu_backend_create(world, &sh, out, err);
    size_t len = strlen(msg) + 1;
    if (st == TP_OK && (st = tp_rank_group_share(rg, msg, &len, sizeof msg, err)) != TP_OK) {
        tp_backend_destroy(*out);
        *out = NULL;
    }
    if (st == TP_OK && name && strcmp(name, "auto") == 0)
        snprintf((*out)->note, sizeof (*out)->note, "backend auto chose cpu: %s", why);
    return st;
}

static tp_status follow_group(tp_rank_group *rg, tp_backend **out, tp_err *err)
{
    char msg[TP_GROUP_MESSAGE];
    size_t len = 0;
    tp_status st = tp_rank_group_share(rg, msg, &len, sizeof msg - 1, err);
    if (st != TP_OK)
        return st;
    msg[len] = 0;
    if (strcmp(msg, "cpu") == 0) {
        tp_cpu_shared sh = cpu_layout(rg);
        return tp_cpu_backend_create(tp_rank_group_world(rg), &sh, out, err);
    }
#ifdef TP_HAVE_CUDA
    if (strncmp(msg, "cuda ", 5) == 0)
        return cuda_join(rg, msg + 5, out, err);
#endif
    return tp_fail(err, TP_UNAVAILABLE, "the leader chose backend '%.40s', which this worker cannot run", msg);
}

tp_status tp_backend_create_for_group(const char *name, tp_rank_group *rg, tp_backend **out, tp_err *err)
{
    if (!tp_rank_group_shared(rg))
        return tp_backend_create(name, tp_rank_group_world(rg), out, err);
    return tp_rank_group_leads(rg) ? lead_group(name, rg, out, err) : follow_group(rg, out, err);
}
