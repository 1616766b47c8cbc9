/* batcher.h — dynamic batching between the HTTP workers and the engine,
 * with Triton's semantics.
 *
 * Requests queue; one batcher thread takes the oldest ones whose rows fit in
 * max_batch and, once the batch is full or the oldest request has waited
 * max_queue_delay_us, runs the engine once on all their rows (each
 * request's bytes copied once, by the engine, straight into its staging:
 * tp_engine_infer_parts) and gives each request views of its own rows of
 * the outputs (one block, freed when the last request releases its views). Requests are validated on
 * submit, so a bad one is refused alone and never fails a batch. Graphs
 * that cannot be batched (tp_engine_batchable) run one request at a time.
 *
 * A request that waits past its deadline is answered TP_TIMEOUT and never
 * runs, also while every instance is busy (a stuck step; tp_batcher_expire
 * when the batcher thread runs it). The queue is bounded (TP_UNAVAILABLE beyond it). Freeing the
 * batcher runs what is still queued first. */
#ifndef TP_BATCHER_H
#define TP_BATCHER_H

#include <stdint.h>

#include "engine.h"
#include "metrics.h"
#include "model_stats.h"
#include "status.h"

typedef struct tp_batcher tp_batcher;

typedef struct {
    int64_t max_batch;          /* rows per engine run; 0: the engine's largest bucket */
    int64_t max_queue_delay_us; /* longest the oldest request waits for more rows */
    int max_queue;              /* queued requests before submit refuses; 0: 1024 */
    tp_metrics *metrics;        /* optional: batch sizes, queue and compute times, engine waits */
    tp_model_stats *stats;      /* optional: Triton statistics per engine execution */
    /* An idle batcher runs a request on the submitting thread only while
     * its recent engine steps averaged at most this long (a slow model
     * must not hold up the submitter's other work) and requests have not
     * been piling up behind its recent batches (under load, batches on the
     * batcher thread serve more); 0: no limit, < 0: never. */
    int64_t inline_max_us;
    /* How long a thread whose held batch finds every instance busy polls
     * for one before it sleeps (tp_batcher_run_held); 0: the spin budget
     * of two busy threads on this process's cores (spin_wait.h), < 0:
     * never. */
    int64_t engine_spin_us;
} tp_batcher_opts;

/* How a finished request ran. */
typedef struct {
    double queue_s;     /* from submit to the start of its batch */
    double compute_s;   /* engine time of its batch */
    int64_t batch_rows; /* rows in its batch */
    int batch_requests; /* requests in its batch */
} tp_batch_info;

/* Called exactly once per accepted request, from the batcher thread, the
 * thread calling tp_batcher_cancel or tp_batcher_expire (TP_TIMEOUT) or (a
 * held request) tp_batcher_run_held, or — when the batcher was idle, nothing
 * was queued, there is no queue delay and recent steps were short and
 * quiet (inline_max_us) — the submitting thread itself, before tp_batcher_submit
 * returns (it runs that request's batch). On TP_OK
 * outs holds the request's own outputs in graph order, owned by the callee
 * (tp_host_tensors_free; they may be views sharing a block with the other
 * requests of the batch, released in any order, on any thread);
 * otherwise outs is NULL and err says why: TP_TIMEOUT (waited past its
 * deadline; never ran), the status of a failed engine run, or the one given
 * to tp_batcher_cancel. info is NULL unless the request ran. */
typedef void (*tp_batch_done_fn)(void *ctx, tp_status st, tp_host_tensor *outs, int n_outs,
                                 const tp_err *err, const tp_batch_info *info);

typedef struct {
    const tp_host_tensor *inputs; /* borrowed (and their bytes) until done is called */
    int n_inputs;
    double t_arrival;         /* tp_now_s() when the deadline clock starts; 0: at submit */
    int64_t timeout_us;       /* deadline = t_arrival + timeout_us; 0: none */
    const char *timeout_what; /* names the limit in the 504 message, e.g. "request_timeout_ms 30" */
    tp_batch_done_fn done;
    void *ctx;
    /* 1: inputs come from tp_kserve_parse_infer with this engine's io descs
     * (graph order, already checked by io_check.h while decoding), so submit
     * checks only the rest (tp_engine_check_decoded); 0: any caller's
     * tensors, checked in full (tp_engine_check_inputs) */
    int decoded;
    /* tp_now_s() as the caller read it just before submitting, which
     * dates the submit (saves a clock read a request); 0: submit reads it */
    double t_now;
    /* 1: the submitter serves other clients whose requests may be waiting
     * for it unread (an HTTP thread with several connections), so
     * tp_batcher_submit_held holds the request even on an idle engine
     * (where holding is allowed at all): what the thread reads meanwhile
     * joins its batch instead of each running alone. */
    int more_may_follow;
    /* 1: the submitter serves no other client while this request runs
     * (tp_acceptor_claim_alone: its only connection is this request's, and
     * it is given no new one meanwhile). Without it a step that may stall
     * (tp_engine_steps_may_stall: a stopped rank process, a hung GPU) never
     * runs on the submitter: the connections it serves would wait as long
     * as the step, probes included. */
    int alone;
} tp_batch_req;

/* e is borrowed and must outlive the batcher. */
tp_status tp_batcher_create(tp_engine *e, const tp_batcher_opts *o, tp_batcher **out, tp_err *err);

/* Instances of one model (Triton's instance_group count): engines compiled
 * from the same graph with the same options, each running one batch at a
 * time, so as many batches run at once as there are instances (a thread
 * that finds every instance busy waits for one). inst[0] answers for the
 * graph's signature and checks. Borrowed; they must outlive the batcher. */
#define TP_BATCHER_MAX_INSTANCES 8
tp_status tp_batcher_create_instances(tp_engine *const *inst, int n_inst, const tp_batcher_opts *o,
                                      tp_batcher **out, tp_err *err);
int tp_batcher_instances(const tp_batcher *b);
/* Every instance's counters added up (what /metrics shows); waits for
 * each instance's running step, if any. */
void tp_batcher_engine_stats(tp_batcher *b, tp_engine_stats *out);

/* Validates r's inputs (tp_engine_check_inputs, or tp_engine_check_decoded
 * when r->decoded) and queues it. On failure
 * done is never called: TP_INVALID / TP_NOT_FOUND for a bad request,
 * TP_UNAVAILABLE when the queue is full or the batcher is stopping. */
tp_status tp_batcher_submit(tp_batcher *b, const tp_batch_req *r, tp_err *err);

/* Requests one thread holds to run together a moment later (opaque; NULL
 * when it holds none). */
typedef struct tp_batch_held tp_batch_held;

/* Like tp_batcher_submit, but under load (recent batches ended with
 * requests waiting, or r->more_may_follow; steps short enough to run on
 * the submitter, no queue delay, a batchable graph) the request is added
 * to *held instead of the
 * batcher's queue, and *was_held set: the submitter runs it with the others
 * it holds by calling tp_batcher_run_held on the same *held soon (an HTTP
 * thread: once it has read what its other connections sent meanwhile).
 * Otherwise as tp_batcher_submit (*was_held 0). held and was_held are both
 * given or both NULL. */
tp_status tp_batcher_submit_held(tp_batcher *b, const tp_batch_req *r, tp_batch_held **held,
                                 int *was_held, tp_err *err);

/* Runs every request of held on the calling thread, in batches of at most
 * max_batch rows, once no other batch is in the engine (it waits for one:
 * polling for a few tens of microseconds while that pays, then asleep),
 * and frees held: done has been called for each of them (TP_TIMEOUT for
 * those past their deadline) when it returns. Returns how many there were
 * (0 for NULL). Every held request must be run before tp_batcher_free. */
int tp_batcher_run_held(tp_batcher *b, tp_batch_held *held);

/* Blocking form of submit: the request's outputs, or why not. info may be
 * NULL. */
tp_status tp_batcher_infer(tp_batcher *b, const tp_host_tensor *inputs, int n_inputs,
                           int64_t timeout_us, tp_host_tensor **outs, int *n_outs,
                           tp_batch_info *info, tp_err *err);

/* A request is arriving (its headers are in): if it would run on its
 * submitter, wake the engine's ranks now so their wake-up overlaps the
 * body and the decoding (tp_engine_prewake). A hint; thread-safe. */
void tp_batcher_prewake(tp_batcher *b);

/* The engine step (one batch's run, on whichever thread) that has been
 * running longest: 1, with its start (tp_now_ns) in *t_start_ns and the
 * instance running it in *inst; 0 while no batch runs. Lock-free: a probe
 * asking never waits for the engine or the batcher. */
int tp_batcher_oldest_step(tp_batcher *b, int64_t *t_start_ns, tp_engine **inst);

/* Whether the engine looks stuck: the oldest running step has run
 * stuck_ms or more at now_ns (tp_now_ns; stuck_ms 0: never). Then 1, the
 * step's start in *t_start_ns (one value per step, so a caller can log
 * each stuck step once) and why in msg, e.g. "engine step running for
 * 61234 ms (stuck_step_ms 60000): rank 1 has not finished" (the ranks as
 * tp_engine_step_pending names them). Lock-free, like
 * tp_batcher_oldest_step. */
int tp_batcher_stuck(tp_batcher *b, int stuck_ms, int64_t now_ns, int64_t *t_start_ns, char *msg, size_t cap);

/* The batcher thread answers a queued request past its deadline
 * (TP_TIMEOUT) as it waits for the next batch; while it runs one itself,
 * which a stuck step can make last for minutes, nobody would: this answers
 * them now (call it now and then: the server's main thread does, at least
 * once a second). Returns the earliest deadline still queued while the
 * batcher thread is in a batch (tp_now_s), else 0: when to look again. Any
 * thread; the batcher's lock briefly, and the callbacks unlocked. */
double tp_batcher_expire(tp_batcher *b, double now);

int tp_batcher_queued(tp_batcher *b);
int64_t tp_batcher_max_batch(const tp_batcher *b);
/* 1 when requests share engine runs; 0 when they run one at a time. */
int tp_batcher_batching(const tp_batcher *b);

/* Answers every queued request with st and msg now (a drain that ran out of
 * time). Requests already in the engine finish normally. */
void tp_batcher_cancel(tp_batcher *b, tp_status st, const char *msg);

/* Stops taking requests, runs every queued one (no queue delay), joins the
 * thread and frees b. NULL is a no-op. */
void tp_batcher_free(tp_batcher *b);

#endif
