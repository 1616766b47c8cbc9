/* comm_protocol.h — the cross-rank barrier protocol of the cuda backend's
 * own kernels (epochs and flags on the symmetric control block), written
 * once for two executors:
 *  - the device: comm_kernels.cu's meet() runs it with one thread per peer
 *    (nvcc: __CUDACC__, system-scope cuda::atomic_ref, %globaltimer);
 *  - the host: the test double (tests/cuda_double/kernels_double.c) runs
 *    the same functions on host threads over the double's shared memory
 *    (C11 with GCC's __atomic builtins, CLOCK_MONOTONIC), so the epochs,
 *    a peer that never arrives and an abort in the middle of a wait are
 *    exercised in CI, not only on a GPU.
 *
 * The protocol (see tp_cuda_ops.h for the layout): block b of rank r
 * arrives at epoch e on a slot by storing e (release) into
 * flags[slot][b][r] of every rank, then waits (acquire) until its own
 * flags[slot][b][p] >= e for every p. Epochs only grow, so a fast rank
 * already at e+1 still releases a slow one waiting for e.
 *
 * A wait ends, besides the peer arriving:
 *  - at once when the host has set the abort word (tp_cuda_sync.abort,
 *    host-mapped memory the backend writes when it is marked dead or
 *    revokes its communicator): ncclCommRevoke reaches NCCL's kernels
 *    only, never ours, so without it a dead peer cost every barrier left
 *    in a graph its full timeout;
 *  - at once when this rank's error word already holds a barrier failure
 *    (a timeout or an abort seen by another block or an earlier kernel):
 *    the step has failed, and waiting again for the same dead peer would
 *    only add another timeout;
 *  - after timeout_ns, reporting TP_CUDA_ERR_BARRIER_TIMEOUT naming the
 *    peer, slot and epoch.
 * A data error in the word (a bad embedding id, benign) does not end
 * waits: every rank must still finish the step's barriers so that the
 * epochs stay equal and the backend stays usable (GPU_ASSUMPTIONS.md A3).
 *
 * The abort word and the error word are looked at every
 * TP_SYNC_POLL_EVERY spins only: on a GPU the abort word is a PCIe read
 * (~1 us), which would otherwise slow every spin of a wait that is about
 * to succeed. */
#ifndef TP_COMM_PROTOCOL_H
#define TP_COMM_PROTOCOL_H

#include <stddef.h>

#include "cuda/tp_cuda_ops.h"

#define TP_SYNC_POLL_EVERY 8

/* What a wait ended with. */
enum {
    TP_SYNC_MET = 0,       /* the peer arrived */
    TP_SYNC_TIMED_OUT = 1, /* reported TP_CUDA_ERR_BARRIER_TIMEOUT */
    TP_SYNC_GAVE_UP = 2    /* the abort word, or an earlier barrier failure */
};

#if defined(__CUDACC__)
#include <cuda/atomic>
#define TP_SYNC_FN __device__ __forceinline__

TP_SYNC_FN void tp_sync_store_release(unsigned long long *p, unsigned long long v)
{
    cuda::atomic_ref<unsigned long long, cuda::thread_scope_system>(*p).store(v, cuda::memory_order_release);
}
TP_SYNC_FN unsigned long long tp_sync_load_acquire(unsigned long long *p)
{
    return cuda::atomic_ref<unsigned long long, cuda::thread_scope_system>(*p).load(cuda::memory_order_acquire);
}
/* The abort word is host memory written by the CPU: system scope. */
TP_SYNC_FN int tp_sync_load_word(int *p)
{
    return cuda::atomic_ref<int, cuda::thread_scope_system>(*p).load(cuda::memory_order_relaxed);
}
TP_SYNC_FN int tp_sync_claim(int *code, int v) { return atomicCAS(code, 0, v) == 0; }
TP_SYNC_FN unsigned long long tp_sync_now_ns(void)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
TP_SYNC_FN void tp_sync_pause(void) { __nanosleep(200); }

#else /* host C: the test double */
#include <time.h>
#define TP_SYNC_FN static inline

TP_SYNC_FN void tp_sync_store_release(unsigned long long *p, unsigned long long v)
{
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
TP_SYNC_FN unsigned long long tp_sync_load_acquire(unsigned long long *p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }
TP_SYNC_FN int tp_sync_load_word(int *p) { return __atomic_load_n(p, __ATOMIC_RELAXED); }
TP_SYNC_FN int tp_sync_claim(int *code, int v)
{
    int zero = 0;
    return __atomic_compare_exchange_n(code, &zero, v, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}
TP_SYNC_FN unsigned long long tp_sync_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}
/* A host thread stands in for a GPU block: it yields the CPU between
 * looks (CI machines have few cores and several ranks spin at once). */
TP_SYNC_FN void tp_sync_pause(void)
{
    struct timespec ts = {0, 20000};
    nanosleep(&ts, NULL);
}
#endif

/* Host side of both launchers (comm_kernels.cu and the double's): the
 * description a kernel gets must name every rank's flags. 0 when usable. */
static inline int tp_sync_check(const tp_cuda_sync *s)
{
    if (!s || s->world < 1 || s->world > TP_CUDA_MAX_WORLD || s->rank < 0 || s->rank >= s->world || !s->flags ||
        !s->counters)
        return -1;
    for (int p = 0; p < s->world; p++)
        if (!s->peer_flags[p])
            return -1;
    return 0;
}

TP_SYNC_FN size_t tp_sync_flag_index(int slot, int block, int src)
{
    return ((size_t)slot * TP_CUDA_SYNC_BLOCKS + (size_t)block) * TP_CUDA_MAX_WORLD + (size_t)src;
}

/* This rank's epoch counter of (slot, block): advanced by the kernels
 * themselves, so a graph's replays keep counting. */
TP_SYNC_FN unsigned long long *tp_sync_counter(const tp_cuda_sync *s, int slot, int block)
{
    return &s->counters[slot * TP_CUDA_SYNC_BLOCKS + block];
}

/* The first error wins; the others are dropped (the first names the cause). */
TP_SYNC_FN void tp_sync_report(tp_cuda_error *e, int code, int a, long long b, long long c)
{
    if (e && tp_sync_claim(&e->code, code)) {
        e->a = a;
        e->b = b;
        e->c = c;
    }
}

/* Codes after which no barrier of this rank can succeed any more. */
TP_SYNC_FN int tp_sync_fatal(int code)
{
    return code == TP_CUDA_ERR_BARRIER_TIMEOUT || code == TP_CUDA_ERR_ABORTED;
}

/* Whether a wait must end now without its peer; reports an abort once. */
TP_SYNC_FN int tp_sync_must_stop(const tp_cuda_sync *s, int p, int slot, unsigned long long e)
{
    if (s->abort && tp_sync_load_word(s->abort)) {
        tp_sync_report(s->err, TP_CUDA_ERR_ABORTED, p, slot, (long long)e);
        return 1;
    }
    return s->err && tp_sync_fatal(tp_sync_load_word(&s->err->code));
}

/* Rank s->rank's block `block` arrives at epoch e on slot, in peer p's
 * flags (p may be this rank). Earlier writes of the block must be fenced
 * before (the device does it in meet()). */
TP_SYNC_FN void tp_sync_arrive(const tp_cuda_sync *s, int slot, int block, int p, unsigned long long e)
{
    tp_sync_store_release(&s->peer_flags[p][tp_sync_flag_index(slot, block, s->rank)], e);
}

/* Waits until peer p's block `block` arrived at epoch e on slot (see the
 * file comment for how else it ends). */
TP_SYNC_FN int tp_sync_wait(const tp_cuda_sync *s, int slot, int block, int p, unsigned long long e)
{
    unsigned long long *in = &s->flags[tp_sync_flag_index(slot, block, p)];
    unsigned long long t0 = tp_sync_now_ns();
    for (unsigned n = 1;; n++) {
        if (tp_sync_load_acquire(in) >= e)
            return TP_SYNC_MET;
        if (n % TP_SYNC_POLL_EVERY == 0 && tp_sync_must_stop(s, p, slot, e))
            return TP_SYNC_GAVE_UP;
        if (tp_sync_now_ns() - t0 > s->timeout_ns) {
            tp_sync_report(s->err, TP_CUDA_ERR_BARRIER_TIMEOUT, p, slot, (long long)e);
            return TP_SYNC_TIMED_OUT;
        }
        tp_sync_pause();
    }
}

#endif
