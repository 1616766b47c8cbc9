/* cuda_backend.h — the backend interface on one GPU per process.
 *
 * A process is one rank: tp_cuda_backend_create(world, rank, id) joins the
 * NCCL communicator of `world` ranks identified by rank 0's unique id and
 * binds this process to one GPU. Every iface call must name this rank (a
 * call for another rank fails: its process does that); the engine's rank
 * group for a cuda backend therefore runs only the local rank.
 *
 * Device choice: $LOCAL_RANK when set (torchrun-style launchers, and every
 * worker a process group spawns gets its own), else rank %
 * tp_cuda_device_count().
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

/* The registry entry (kernels/cuda/cuda_kind.c, listed in engine/backend.c):
 * part of every cuda build's tpserve, with what the backend can do known
 * without a device. Everything below it is the device code, built into
 * libtpserve-cuda.so and loaded by the entry only when a cuda backend is
 * made (or `auto` finds a GPU device node). */
extern const tp_backend_kind tp_cuda_backend_kind;

/* The library's name, looked for next to the executable, then in
 * TP_CUDA_LIBDIR (the install libdir, /usr/local/lib/tpserve by default). */
#define TP_CUDA_LIBRARY "libtpserve-cuda.so"

/* What the device code gives the registry entry: the one symbol cuda_kind.c
 * looks up in the library (tp_cuda_device_entry, kernels/cuda/cuda_entry.c).
 * size and op_count are those the library was built with: a library from
 * another tree is refused rather than called. */
struct tp_rank_group;
typedef struct {
    size_t size;
    int op_count;
    int (*probe)(char *why, size_t len);
    int (*has_kernel)(tp_op op);
    tp_status (*create)(int world, int rank, const char *nccl_id_or_null, const tp_backend_settings *s,
                        tp_backend **out, tp_err *err);
    tp_status (*nccl_id_new)(char *hex, tp_err *err);
    tp_status (*create_in_group)(struct tp_rank_group *rg, const char *nccl_id, const tp_backend_settings *s,
                                 tp_backend **out, tp_err *err);
} tp_cuda_device_api;

extern const tp_cuda_device_api tp_cuda_device_entry;

/* The first NVIDIA GPU device node under dir ("nvidia0", "nvidia1", ...;
 * not nvidiactl, nvidia-uvm or nvidia-modeset) into name; 0 when there is
 * none. The kernel driver makes one per GPU whatever the user-space
 * driver's version, and a container gets them when given a GPU: so `auto`
 * loads the device code only when one exists (cuda_kind.c). */
int tp_cuda_gpu_node(const char *dir, char *name, size_t len);

/* Number of usable CUDA devices; 0 when there is no driver or no device
 * (never fails, never aborts). */
int tp_cuda_device_count(void);

/* Like tp_cuda_device_count, and when it is 0 writes why into why (e.g.
 * "cudaGetDeviceCount: cudaErrorNoDevice: no CUDA-capable device is
 * detected"). */
int tp_cuda_probe(char *why, size_t len);

/* The device test suite's probe (tests/unit/test_cuda_device.c), which
 * must tell "this machine has no GPU" (skip) from "this machine has a GPU
 * that CUDA cannot use" (fail: a driver older than the CUDA runtime, a
 * container without the driver libraries). Returns the usable devices
 * (> 0); 0 when CUDA sees none and dev_dir (normally "/dev") holds no
 * NVIDIA GPU node (nvidia0, nvidia1, ...): only then may the suite say
 * "skipped"; -1 when such a node exists but CUDA fails to initialise or
 * counts 0: why then names the node and CUDA's error, and the suite must
 * FAIL with it. dev_dir NULL: no node is looked for (0 or n). Tests point
 * dev_dir at a directory of their own. */
int tp_cuda_probe_machine(const char *dev_dir, char *why, size_t len);

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

/* The same for this process's rank of a process group, as two timed steps
 * of the group (local setup, then the NCCL join), so that one rank failing
 * or hanging fails every rank with its message instead of leaving them
 * blocked in ncclCommInitRank or the first collective. Also page-locks the
 * group's request staging for direct DMA (unregistered at destroy). */
struct tp_rank_group;
tp_status tp_cuda_backend_create_in_group(struct tp_rank_group *rg, const char *nccl_id,
                                          const tp_backend_settings *s, tp_backend **out, tp_err *err);

/* After an abort (for the device tests: tests/unit/test_cuda_device.c).
 *
 * abort and peer_lost are permanent: they mark the backend dead, set the
 * abort word our cross-rank kernels poll, and, when this rank may have
 * work in flight (any call since its last successful synchronize), revoke
 * the NCCL communicator. NCCL 2.28.9's revoke does not stop captured NCCL
 * work that starts after its job ends, so the device may then still run
 * kernels that never complete. From then on:
 *  - every call (synchronize included) fails at once with TP_BACKEND and
 *    the first failure's message, naming the rank ("cuda rank R:
 *    synchronize refused, the backend failed earlier: aborted: ...");
 *  - reset does nothing: it never makes synchronize succeed again;
 *  - no call waits on the device: waits poll and stop (cu_wait); once
 *    revoked, free and capture_free release nothing and destroy abandons
 *    the device state to the process's exit (no ncclCommAbort:
 *    GPU_ASSUMPTIONS.md A13); an abort of an idle rank (no revoke) is
 *    torn down normally;
 *  - iface must_exit (tp_engine_must_exit) is 1: the server reports,
 *    turns readiness 503 and exits; a worker exits.
 * A test of a benign device error (a bad embedding or gather id) must
 * therefore not call abort: synchronize (or copy_out) returns TP_INVALID
 * naming the id, clears the error word, and the next synchronize
 * succeeds; the rank group never aborts for it (tp_rank_group_benign). A
 * test of abort checks: synchronize fails naming the abort, reset changes
 * nothing, dead() and must_exit are set, destroy returns at once. */

/* The rank this process runs (-1 if b is not a cuda backend). */
int tp_cuda_backend_rank(const tp_backend *b);

#endif
