/* engine.h — the engine as the CLI and the HTTP server see it: load a graph
 * once, then run global (unsharded) tensors through every rank.
 *
 * Thread-safe: tp_engine_infer may be called from many threads; calls are
 * serialized inside (the batcher, a later layer, forms the batches). */
#ifndef TP_ENGINE_H
#define TP_ENGINE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backend_settings.h"
#include "dtype.h"
#include "host_block.h"
#include "mem_kind.h"
#include "rank_group.h"
#include "status.h"
#include "tensor.h"

typedef struct tp_engine tp_engine;

#define TP_MAX_BUCKETS 16

typedef struct {
    const char *backend;        /* "cpu" (default when NULL), "cuda", "auto" */
    const tp_backend_settings *settings; /* NULL: defaults; a worker takes its leader's */
    const int64_t *buckets;     /* batch buckets, ascending; NULL: 1,2,4,8,16 */
    int n_buckets;
    int no_passes;              /* skip every graph pass */
    const char *disable_passes; /* comma-separated pass names to skip */
    int eager;                  /* run without capture (for comparison) */
    /* Where the ranks run: NULL or mode THREADS for threads of this
     * process; PROCESSES makes this process rank 0 of a process group (its
     * world is taken from the graph); WORKER joins one as rank `rank`, and
     * is then driven by tp_engine_follow. */
    const tp_rank_group_opts *group;
    /* A thread group runs a step's ranks in turn on one thread when that
     * has been faster, for steps up to this long (tp_rank_group_set_serial),
     * where the backend allows it; 0: never. */
    int serial_step_max_us;
    /* Called when the engine has just become lost (tp_engine_lost turns
     * non-NULL, or is about to: a rank's process was found gone between
     * steps), on whichever thread found it: it should only signal (write
     * an eventfd) and return. So a server need not poll tp_engine_lost to
     * turn unready. NULL: nobody is told. */
    void (*on_lost)(void *arg);
    void *on_lost_arg;
    /* Generation graphs: the value of "S", the sequence slots of every
     * state (docs/models.md, "Generation graphs"); 0: 16. */
    int64_t state_slots;
} tp_engine_opts;

/* What a generation server drives (the graph's "generate" block): the
 * names of its inputs input_ids [B, 1], positions [B], slots [B] (INT64,
 * slots 1-based, 0 = an inactive row) and output next_token [B]; the
 * cache length (positions 0 .. max_seq_len-1), the true vocabulary and the
 * slots the states were allocated with (slot values 1 .. slots_n).
 * logit_rows: NULL, or the name of an input [B] (INT64 or INT32) whose
 * nonzero rows want their next_token; the others' next_token is
 * unspecified (the LM head skips them: matmul_rows). */
typedef struct {
    const char *input_ids, *positions, *slots, *next_token;
    const char *logit_rows;
    int64_t max_seq_len, vocab_size, slots_n;
} tp_generate_info;

/* Counters since load, for /metrics and tests. */
typedef struct {
    uint64_t requests, rows, executions; /* executions: graph runs (replays of a bucket) */
    int n_buckets;
    int64_t bucket[TP_MAX_BUCKETS];
    uint64_t bucket_runs[TP_MAX_BUCKETS];
    uint64_t exact_runs;                 /* runs at an exact batch (no padding) */
    uint64_t symmetric_copy_bytes, regular_copy_bytes; /* into input slots */
    int64_t arena_bytes[TP_MEM_KINDS];   /* per rank, by tp_mem_kind: the one arena pool every bucket's
                                            executable shares (the largest plan's, grown for larger
                                            exact batches), not a sum over buckets */
    int world_size, rank_processes;      /* rank_processes: one process per rank */
    int rank_group_up;                   /* 0 once lost (tp_engine_lost) */
    uint64_t serial_steps;               /* rank-group steps run on one thread (serial_step_max_us) */
    int serial_step_max_us;              /* the limit in effect; 0: no serial steps here */
} tp_engine_stats;

/* A global, contiguous, row-major host tensor. Request inputs are owned by
 * the caller; outputs returned by tp_engine_infer are owned by the caller
 * and released with tp_host_tensors_free. */
typedef struct {
    char name[128];
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    void *data;
    size_t nbytes;
    /* How data is held (host_block.h): NULL, the tensor's own malloc'ed
     * buffer; a block the tensor holds one reference on (data points into
     * it: the engine's outputs); TP_HOST_BORROWED, bytes someone else keeps
     * alive. */
    tp_host_block *owner;
} tp_host_tensor;

/* Graph input/output metadata with global shapes; -1 marks the batch dim. */
typedef struct {
    const char *name;
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
} tp_io_desc;

/* "1,2,4,8" -> up to TP_MAX_BUCKETS sizes (order and range are checked by
 * tp_engine_create). */
tp_status tp_parse_buckets(const char *text, int64_t *out, int *n, tp_err *err);

tp_status tp_engine_create(const char *graph_path, const tp_engine_opts *opts, tp_engine **out,
                           tp_err *err);
void tp_engine_free(tp_engine *e);

/* `tpserve plan`: compiles graph_path exactly as tp_engine_create does for
 * opts (the same passes at the same bucket, the chosen backend's lowering
 * and capabilities) but needs no device and loads no weights, then reports
 * the executable a batch of `batch` rows runs in (its bucket) to out, as a
 * table or (json) one JSON object. */
tp_status tp_engine_plan(const char *graph_path, const tp_engine_opts *opts, int64_t batch, int json, FILE *out,
                         tp_err *err);

/* NULL: not a generation graph. Owned by the engine. */
const tp_generate_info *tp_engine_generate_info(const tp_engine *e);
/* Bytes per rank of the states (generation caches), allocated once at
 * create beside the weights; 0 without states. */
int64_t tp_engine_state_bytes(const tp_engine *e);

const char *tp_engine_model_name(const tp_engine *e);
const char *tp_engine_backend_name(const tp_engine *e);
/* Why the backend was chosen (--backend auto), or "". */
const char *tp_engine_backend_note(const tp_engine *e);
/* This process's backend, owned by the engine (tests give it a failing
 * interface through it). */
struct tp_backend *tp_engine_backend(tp_engine *e);
int tp_engine_world_size(const tp_engine *e);
int tp_engine_n_inputs(const tp_engine *e);
int tp_engine_n_outputs(const tp_engine *e);
const tp_io_desc *tp_engine_input(const tp_engine *e, int i);
const tp_io_desc *tp_engine_output(const tp_engine *e, int i);

/* Runs one request. inputs: every graph input exactly once, any order, by
 * name. On success *outputs is a new array of every graph output (in graph
 * order). Bad inputs give TP_INVALID / TP_NOT_FOUND with a message naming the
 * input and expected vs got; engine failures give TP_BACKEND / TP_INTERNAL. */
tp_status tp_engine_infer(tp_engine *e, const tp_host_tensor *inputs, int n_inputs,
                          tp_host_tensor **outputs, int *n_outputs, tp_err *err);
/* Releases each tensor's bytes as its owner says (free, drop a block
 * reference, or nothing for borrowed bytes), then the array. */
void tp_host_tensors_free(tp_host_tensor *t, int n);

/* Validates a request exactly as tp_engine_infer would (names, datatypes,
 * shapes, sizes, batch agreement, and the values a kernel would refuse:
 * request_checks.h) without running it; *batch receives its
 * batch size (1 when no input has a batch dim). For a batcher that must
 * refuse one bad request without failing the batch it would have joined. */
tp_status tp_engine_check_inputs(tp_engine *e, const tp_host_tensor *inputs, int n_inputs, int64_t *batch,
                                 tp_err *err);
/* tp_engine_check_inputs for inputs a decoder already checked against this
 * engine's io descs with io_check.h (the KServe codec): one tensor per graph
 * input, in graph order, names, datatypes, shapes and byte counts matching.
 * Checks what a decoder cannot: batch agreement and the values a kernel
 * would refuse (request_checks.h). */
tp_status tp_engine_check_decoded(tp_engine *e, const tp_host_tensor *inputs, int64_t *batch, tp_err *err);
/* tp_engine_infer without its check, for a caller that ran
 * tp_engine_check_inputs (or check_decoded) on each request already (the
 * batcher: a request is checked once, at submit), for a batch of n_parts
 * such requests, without concatenating them first: pieces[i * n_parts + p]
 * is request p's tensor for graph input i, in graph order (borrowed, read
 * during the call only); batch: the rows of all pieces together, as the
 * checks found them. Anything else is undefined: other callers use
 * tp_engine_infer, which refuses bad input. The run sees, for each input,
 * the pieces' rows one after the other along dim 0. Each request's bytes
 * are copied once, straight into the request staging. n_parts > 1 needs
 * every input batched (tp_engine_batchable). The
 * outputs, as from every infer entry point, share one block (host_block.h),
 * one reference per output tensor: a caller may hand out views of rows
 * that retain it. */
tp_status tp_engine_infer_parts(tp_engine *e, const tp_host_tensor *const *pieces, int n_parts, int64_t batch,
                                tp_host_tensor **outputs, int *n_outputs, tp_err *err);
/* A request is on its way to an idle engine: wake the ranks now, so their
 * wake-up overlaps the caller's decoding (tp_rank_group_prewake). A hint,
 * thread-safe, harmless when no run follows. */
void tp_engine_prewake(tp_engine *e);

/* Before a process re-executes itself at startup: every backend sets what
 * its libraries read from the environment as they load (cpu: the OpenBLAS
 * kernels, kernels/cpu/blas_pick.h). 1 when the environment changed: the
 * process must re-execute itself for it to apply. Defined with the backend
 * registry (backend.c). */
int tp_engine_prepare_exec(void);
/* tp_engine_prepare_exec, then, when it changed the environment, this
 * process re-executed (/proc/self/exe with argv). Returns only when there
 * was nothing to apply (0) or the exec failed (-1: the process goes on with
 * what its libraries detected). A process that inherited the settings (one
 * re-executed, or a rank process serve started) has nothing to apply. */
int tp_engine_reexec_for_backends(char **argv);
/* Whether requests can be concatenated along dim 0 into one run: every
 * input and output has the batch as dim 0 and no op mixes rows. */
int tp_engine_batchable(const tp_engine *e);
/* Rows of output i per batch row (dim 0 = batch * this), 0 if static. */
int64_t tp_engine_output_rows(const tp_engine *e, int i);

void tp_engine_get_stats(tp_engine *e, tp_engine_stats *out);

/* NULL while every rank can run; else why not: a rank's process died, or
 * a step failed in a way that left the backend dead for good (a sticky CUDA
 * error, an NCCL error), naming the rank and the failure. Once lost, every
 * request fails at once with TP_UNAVAILABLE and this message. Safe
 * to call from any thread at any time; never waits for a running batch
 * (during one it reports what the group already knows). */
const char *tp_engine_lost(tp_engine *e);

/* Whether this process must exit rather than go on lost: its backend's
 * device may still run work that never completes (cuda after a revoke:
 * captured NCCL kernels), so nothing may wait on it and only the process's
 * end stops it; freeing the engine then releases nothing on the device.
 * A server reports the failure, answers what it can (503), and exits so
 * that its orchestrator starts a new one. Safe from any thread. */
int tp_engine_must_exit(tp_engine *e);

/* Whether a step may wait on something outside this process's own
 * threads: other processes (ranks as processes) or a device (a backend
 * whose input copies are DMA into device memory). Such a step can stall
 * for as long as a stopped worker or a hung GPU does, so a server must not
 * run one on a thread other clients are waiting for. */
int tp_engine_steps_may_stall(const tp_engine *e);
/* The ranks that have not finished the step in flight, up to cap of them
 * in ranks[] (tp_rank_group_pending): how many (0: no step in flight), or
 * -1 when the engine cannot tell (ranks as threads). Any thread, any time;
 * never waits for the running step. */
int tp_engine_step_pending(tp_engine *e, int *ranks, int cap);

/* A worker process's whole life after tp_engine_create: runs every step the
 * leader posts until it shuts the group down (TP_OK) or goes away (an
 * error saying how). */
tp_status tp_engine_follow(tp_engine *e, tp_err *err);
/* Whether batches are padded into buckets; if not, why (a node mixing rows). */
int tp_engine_padded(const tp_engine *e, const char **why);

#endif
