/* cuda_backend.h — the backend interface on one GPU per process.
 *
 * A process is one rank: tp_cuda_backend_create(world, rank, id) joins the
 * NCCL communicator of `world` ranks identified by rank 0's unique id and
 * binds this process to one GPU. Every iface call must name this rank (a
 * call for another rank fails: its process does that); the engine's rank
 * group for a cuda backend therefore runs only the local rank.
 *
 * Device choice: $LOCAL_RANK when set (torchrun-style launchers), else
 * rank % tp_cuda_device_count().
 *
 * Settings (tp_backend_settings, the server's cuda_* config keys):
 *   cuda_gemm_workspace_mb   cuBLASLt workspace (default 32)
 *   cuda_scratch_mb          initial per-op scratch (default 64); it grows
 *                            outside capture, never during one
 *   cuda_barrier_timeout_ms  how long a cross-rank kernel waits for a peer
 *                            before failing (default 30000)
 *   cuda_check_collectives   every eager collective first checks that all
 *                            ranks issue the same one (debugging) */
#ifndef TP_CUDA_BACKEND_H
#define TP_CUDA_BACKEND_H

#include <stddef.h>

#include "backend.h"

/* 128-byte ncclUniqueId as lowercase hex. */
#define TP_CUDA_NCCL_ID_HEX 256

/* The registry entry (kernels/cuda/cuda_kind.c, listed in engine/backend.c). */
extern const tp_backend_kind tp_cuda_backend_kind;

/* Number of usable CUDA devices; 0 when there is no driver or no device
 * (never fails, never aborts). */
int tp_cuda_device_count(void);

/* Like tp_cuda_device_count, and when it is 0 writes why into why (e.g.
 * "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is
 * detected"). */
int tp_cuda_probe(char *why, size_t len);

/* A new NCCL unique id (rank 0 makes it; the launcher hands it to every
 * rank) as TP_CUDA_NCCL_ID_HEX hex characters and a NUL. */
tp_status tp_cuda_nccl_id_new(char hex[TP_CUDA_NCCL_ID_HEX + 1], tp_err *err);

/* Joins rank `rank` of `world`. nccl_id_or_null is rank 0's id from
 * tp_cuda_nccl_id_new; NULL is accepted only for world == 1. Blocks until
 * every rank has joined (ncclCommInitRank), then warms NCCL up. */
tp_status tp_cuda_backend_create(int world, int rank, const char *nccl_id_or_null, tp_backend **out,
                                 tp_err *err);
/* The same with the cuda settings (workspace, scratch, barrier timeout,
 * collective checks); tp_cuda_backend_create uses the defaults. */
tp_status tp_cuda_backend_create_with(int world, int rank, const char *nccl_id_or_null, const tp_backend_settings *s,
                                      tp_backend **out, tp_err *err);

/* Page-locks the rank group's shared request staging (cudaHostRegister,
 * portable) so copy_in/copy_out DMA straight from and to it; unregistered
 * when b is destroyed. */
tp_status tp_cuda_backend_pin_host(tp_backend *b, void *p, size_t bytes, tp_err *err);

/* The rank this process runs (-1 if b is not a cuda backend). */
int tp_cuda_backend_rank(const tp_backend *b);

#endif
