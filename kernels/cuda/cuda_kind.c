/* cuda_kind.c — the cuda backend's registry entry (engine/backend.c): what
 * it can do, known without a device, and how it is created: one rank per
 * process (one GPU each), joined into one NCCL communicator whose id the
 * leader sends to every worker before joining itself. */
#include <stdio.h>

#include "cuda_backend.h"
#include "cuda_internal.h"

static const tp_backend_caps cuda_caps = {
    /* one_shot (peer-mapped symmetric buffers) below the thresholds, as on
     * cpu; NCCL above them and for every other collective */
    .lowering = {.one_shot_max_bytes = TP_ONE_SHOT_MAX_BYTES_DEFAULT,
                 .large_all_reduce = TP_ALGO_NCCL,
                 .other_collectives = TP_ALGO_NCCL},
    .dma_input_copies = 1,
};

static int cuda_supports_op(tp_op op, tp_dtype dtype)
{
    (void)dtype; /* the kernels take every dtype shape inference lets through */
    tp_op_kind k = tp_op_kind_of(op);
    return k == TP_KIND_COLLECTIVE || k == TP_KIND_FUSED || cu_op_has_kernel(op);
}

static tp_status cuda_create_threads(int world, const tp_backend_settings *s, tp_backend **out, tp_err *err)
{
    if (world > 1)
        return tp_fail(err, TP_INVALID, "backend 'cuda' runs one process per GPU: world_size %d needs ranks=processes "
                       "(--ranks processes)", world);
    return tp_cuda_backend_create_with(1, 0, NULL, s, out, err);
}

static tp_status cuda_group_message(char *msg, size_t cap, tp_err *err)
{
    char id[TP_CUDA_NCCL_ID_HEX + 1];
    tp_status st = tp_cuda_nccl_id_new(id, err);
    if (st == TP_OK && (size_t)snprintf(msg, cap, "%s", id) >= cap)
        return tp_fail(err, TP_INTERNAL, "cuda backend: the NCCL id does not fit the group message");
    return st;
}

static tp_status cuda_group_join(const tp_backend_group *g, const char *msg, const tp_backend_settings *s,
                                 tp_backend **out, tp_err *err)
{
    tp_status st = tp_cuda_backend_create_with(g->world, g->rank_lo, msg, s, out, err);
    if (st == TP_OK && (st = tp_cuda_backend_pin_host(*out, g->base + g->staging_offset, g->staging_bytes, err)) != TP_OK) {
        tp_backend_destroy(*out);
        *out = NULL;
    }
    return st;
}

const tp_backend_kind tp_cuda_backend_kind = {
    .name = "cuda",
    .caps = &cuda_caps,
    .supports_op = cuda_supports_op,
    .probe = tp_cuda_probe,
    .one_rank_per_process = 1,
    .share_before_join = 1, /* ncclCommInitRank blocks until every rank joins */
    .create = cuda_create_threads,
    .group_message = cuda_group_message,
    .group_join = cuda_group_join,
};
