/* cuda_entry.c — the device code's one entry point, the symbol the cuda
 * backend's registry entry (cuda_kind.c, in tpserve) looks up once it has
 * loaded libtpserve-cuda.so. The test binaries link the device code in
 * instead, and cuda_kind.c then finds this without loading anything. */
#include "cuda_backend.h"
#include "cuda_internal.h"

const tp_cuda_device_api tp_cuda_device_entry = {
    .size = sizeof(tp_cuda_device_api),
    .op_count = TP_OP_COUNT,
    .probe = tp_cuda_probe,
    .has_kernel = cu_op_has_kernel,
    .create = tp_cuda_backend_create_with,
    .nccl_id_new = tp_cuda_nccl_id_new,
    .create_in_group = tp_cuda_backend_create_in_group,
};
