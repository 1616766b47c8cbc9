/* batcher_internal.h — what the batcher's two files share, and no other
 * file sees (theirs is batcher.h): batcher.c queues requests and runs the
 * batcher thread; batcher_run.c runs batches on engine instances and takes
 * submissions (run inline, held, or queued). */
#ifndef TP_BATCHER_INTERNAL_H
#define TP_BATCHER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "batcher.h"

typedef struct job {
    struct job *next;
    tp_batch_req r;
    char timeout_what[64]; /* r.timeout_what points here */
    int64_t rows;
    double t_arrival, t_submit, deadline; /* deadline 0: none */
    tp_host_tensor *mine; /* its rows of its batch's outputs (split_and_deliver) */
} job;

/* Requests one thread holds to run together (tp_batcher_run_held). */
struct tp_batch_held {
    job *head, *tail;
    int n;
};

struct tp_batcher {
    tp_engine *e; /* instance 0: the graph's signature, checks (every instance has the same) */
    /* Instances of the model (Triton's instance_group count): each runs
     * one batch at a time, on whichever thread claimed it. */
    tp_engine *inst[TP_BATCHER_MAX_INSTANCES];
    int n_inst;
    /* bit k: instance k runs a batch, on the batcher thread or a
     * submitter's (written under mu; read without it by a thread spinning
     * for an idle instance, tp_batcher_run_held) */
    _Atomic unsigned busy;
    int64_t engine_spin_ns; /* how long a held batch spins for a busy engine */
    tp_engine_stats snap[TP_BATCHER_MAX_INSTANCES]; /* each instance's after its last batch (mu) */
    tp_batcher_opts o;
    int batchable;
    double delay_s;
    pthread_mutex_t mu;
    pthread_cond_t cv; /* on CLOCK_MONOTONIC, like every time here */
    pthread_cond_t engine_cv; /* for threads waiting to run their held requests */
    job *head, *tail;
    int queued, stopping;
    int held;           /* requests held by submitters, not yet running */
    int engine_waiters; /* threads waiting on engine_cv */
    double recent_step_s; /* moving average of engine time per batch (under mu) */
    double recent_serial; /* moving average of "the batch ran as serial steps" (mu) */
    uint64_t serial_steps_seen[TP_BATCHER_MAX_INSTANCES]; /* each instance's serial step count
                                 * after its last batch (only the thread running it touches it) */
    double recent_backlog; /* moving average of "requests were waiting when a batch ended" (mu) */
    /* Steps may wait on other processes or a device (tp_engine_steps_may_stall):
     * they run on a submitter only when it serves no one else (r->alone). */
    int may_stall;
    int thread_in_batch; /* the batcher thread runs a batch: its queue's deadlines are tp_batcher_expire's (mu) */
    /* Instance k's running batch began at this tp_now_ns (0: none runs),
     * for tp_batcher_oldest_step: written by the thread running it, read
     * by probes, never under a lock. */
    _Atomic int64_t step_t0[TP_BATCHER_MAX_INSTANCES];
    pthread_t th;
};

/* How many instances run a batch. busy is atomic: a thread about to take
 * b->mu peeks at it (engine_idle, tp_batcher_run_held); what it decides
 * it decides again under b->mu (claim_engine). */
static inline int running(const tp_batcher *b) { return __builtin_popcount(b->busy); }

/* ---- the queue (batcher.c; b->mu held) ---------------------------------- */

int batcher_cut_expired(job **head, job **tail, double now, job **expired);
int batcher_batch_prefix(const tp_batcher *b, const job *head, int *full);
job *batcher_cut_prefix(job **head, int n);

/* ---- running a batch (batcher_run.c) ------------------------------------- */

void batcher_fail_all(job *list, tp_status st, const tp_err *err);
void batcher_answer_expired(job *list, double now);
void batcher_sum_stats(const tp_engine_stats *snap, int n, tp_engine_stats *sum);
void batcher_run_batch(tp_batcher *b, int k, job *batch);
/* Instances (b->mu held): take an idle one; give it back after its batch. */
int batcher_take_instance(tp_batcher *b);
void batcher_batch_ended(tp_batcher *b, int k);

#endif
