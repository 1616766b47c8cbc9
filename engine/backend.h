/* backend.h — what a device must provide to run a plan (ggml's
 * {iface, context} shape). One backend object serves all ranks of a group;
 * every call names its rank and is made from that rank's thread.
 *
 * Capture contract (the same for a CUDA graph and the cpu command list):
 *  1. between begin_capture and end_capture, run_op and collective are
 *     recorded, not executed; every pointer they receive is baked in;
 *  2. no allocation may happen during capture (alloc fails with a message);
 *  3. replay executes the record with those exact pointers, so buffers must
 *     outlive the capture and never move.
 * Symmetric contract: alloc_symmetric is called by every rank with the same
 * size, in the same order, and returns memory at the same offset of each
 * rank's symmetric arena, addressable by every peer. */
#ifndef TP_BACKEND_H
#define TP_BACKEND_H

#include <stddef.h>

#include "ops.h"
#include "status.h"
#include "tensor.h"

typedef struct tp_backend tp_backend;
typedef struct tp_capture tp_capture;

typedef struct tp_backend_iface {
    const char *name;
    /* Rank memory is plain host memory (cpu): loaders may write it directly. */
    int host_addressable;
    /* Run each partition once eagerly before capturing it (NCCL makes its
     * connections on first use, which must not happen inside a capture). */
    int warm_up_before_capture;
    /* Regular device memory for one rank, 64-byte aligned. */
    tp_status (*alloc)(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err);
    /* Peer-addressable memory at identical offsets on every rank. */
    tp_status (*alloc_symmetric)(tp_backend *b, int rank, size_t bytes, void **out, tp_err *err);
    void (*free)(tp_backend *b, int rank, void *p);
    /* Host -> rank memory; ordered before the rank's next kernel (async DMA on cuda). */
    tp_status (*copy_in)(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err);
    /* Rank memory -> host; complete when it returns. */
    tp_status (*copy_out)(tp_backend *b, int rank, tp_tensor *dst, const tp_tensor *src, tp_err *err);
    /* A compute or copy op (kind COMPUTE/COPY). */
    tp_status (*run_op)(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                        int n_ins, tp_tensor *out, tp_err *err);
    /* A collective or fused comm+compute node (kind COLLECTIVE/FUSED); every
     * rank calls it in the same order. ins[0] is the communicated operand;
     * fused_matmul_reduce_scatter gets its symmetric workspace last. */
    tp_status (*collective)(tp_backend *b, int rank, tp_op op, const tp_attrs *a, const tp_tensor *ins,
                            int n_ins, tp_tensor *out, tp_err *err);
    tp_status (*begin_capture)(tp_backend *b, int rank, tp_err *err);
    tp_status (*end_capture)(tp_backend *b, int rank, tp_capture **out, tp_err *err);
    tp_status (*replay)(tp_backend *b, int rank, tp_capture *c, tp_err *err);
    void (*capture_free)(tp_backend *b, tp_capture *c);
    /* Waits until the rank's queued work is done. */
    tp_status (*synchronize)(tp_backend *b, int rank, tp_err *err);
    /* A rank failed: wake every peer blocked in a collective (they fail). */
    void (*abort)(tp_backend *b);
    /* A rank's process is gone: fail every wait, even those that normally
     * must complete (the peer will never arrive). Permanent. */
    void (*peer_lost)(tp_backend *b);
    /* Clears the aborted state once no rank is running. */
    void (*reset)(tp_backend *b);
    void (*destroy)(tp_backend *b);
} tp_backend_iface;

struct tp_backend {
    const tp_backend_iface *iface;
    void *ctx;
    int world;
    char note[200]; /* why this backend was chosen ("auto"), or empty */
};

/* Creates a backend by name: "cpu", "cuda", "auto" (cuda when a device
 * exists, else cpu). Fails with a clear reason when it cannot. */
tp_status tp_backend_create(const char *name, int world, tp_backend **out, tp_err *err);

/* The backend for a rank group's local ranks. In a process group the
 * leader's choice is shared with every worker (so "auto" decides once), the
 * cpu backend uses the group's shared memory, and cuda joins one NCCL
 * communicator whose id travels through the group. */
struct tp_rank_group;
tp_status tp_backend_create_for_group(const char *name, struct tp_rank_group *rg, tp_backend **out, tp_err *err);

static inline void tp_backend_destroy(tp_backend *b)
{
    if (b)
        b->iface->destroy(b);
}

#endif
