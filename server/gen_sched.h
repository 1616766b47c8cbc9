/* gen_sched.h — continuous batching for text generation: sequences join and
 * leave the running decode batch at step boundaries.
 *
 * A generation graph (docs/models.md, "Generation graphs") computes one
 * token row per batch row: row r feeds token ids[r] at position pos[r] of
 * the sequence in cache slot slot[r] (1-based) and returns the greedy next
 * token after it. So one step can carry any mix of rows: the next token of
 * every running sequence (decode) and the prompt tokens of sequences that
 * just arrived (prefill; a prompt longer than a step's rows is prefilled
 * over several steps, oldest prompt first). One scheduler thread builds
 * each step from the sequences in their slots, runs it, and hands every
 * sequence the token of its last row. Whether prompts share steps with the
 * running decodes or get steps of their own is tp_gen_prefill; either way
 * a running sequence waits at most one step's worth of prompt rows for
 * its next token.
 *
 * No HTTP in here: the caller is told through a notify callback (on the
 * scheduler thread) and reads a sequence's tokens when it likes. */
#ifndef TP_GEN_SCHED_H
#define TP_GEN_SCHED_H

#include <stdint.h>

#include "status.h"

typedef struct tp_gen tp_gen;
typedef struct tp_gen_seq tp_gen_seq;

/* One engine call: rows (<= max_rows) token rows in, the next token of each
 * row out. want[r] is 1 for the rows whose next token is read (a decode
 * row, a prompt's last row), and they come first; next[r] of the others
 * is ignored (a graph with logit rows does not compute it). slot[r] == 0
 * never occurs (padding is the engine's business). */
typedef tp_status tp_gen_step_fn(void *arg, const int64_t *ids, const int64_t *pos, const int64_t *slot,
                                 const int64_t *want, int64_t rows, int64_t *next, tp_err *err);

/* How prompt rows share steps with decode rows. */
typedef enum {
    TP_GEN_PREFILL_MIXED = 0, /* chunked prefill: prompt rows fill what decode rows leave of a step */
    TP_GEN_PREFILL_SEPARATE,  /* prefill steps and decode steps, alternating while both have work */
} tp_gen_prefill;

typedef struct {
    int64_t max_rows;    /* rows an engine call takes (the engine's largest bucket); a step
                            with more runs in pieces */
    tp_gen_prefill prefill;
    int64_t slots;       /* sequences at once (the cache's slots) */
    int64_t max_seq_len; /* cache positions per slot: prompt + output tokens fed back */
    int64_t vocab_size;  /* prompt ids must be below it */
    tp_gen_step_fn *step;
    void *step_arg;
} tp_gen_opts;

tp_status tp_gen_create(const tp_gen_opts *o, tp_gen **out, tp_err *err);
/* Stops the thread after its step; sequences still running end
 * TP_GEN_FAILED (TP_UNAVAILABLE, why) and are notified; submits are
 * refused from now on. Returns when no step runs any more. */
void tp_gen_stop(tp_gen *g, const char *why);
/* tp_gen_stop("the server is stopping") when not stopped yet, then frees. */
void tp_gen_free(tp_gen *g);

/* How a sequence ended; TP_GEN_RUNNING until then. */
typedef enum {
    TP_GEN_RUNNING = 0,
    TP_GEN_STOP,       /* produced one of its stop ids (kept as its last token) */
    TP_GEN_LENGTH,     /* produced max_tokens */
    TP_GEN_CACHE_FULL, /* its slot's max_seq_len positions are used up */
    TP_GEN_CANCELLED,  /* tp_gen_seq_cancel */
    TP_GEN_FAILED,     /* a step failed: tp_gen_seq_read's err says why */
} tp_gen_end;

const char *tp_gen_end_name(tp_gen_end e); /* "stop", "length", ... */

/* Called on the scheduler thread, with the sequence's lock held (so it
 * must not call back into it), once after the reader armed it
 * (tp_gen_seq_read returned nothing new) and a token or the end came. */
typedef void tp_gen_notify(void *arg);

typedef struct {
    const int64_t *prompt;
    int64_t n_prompt;
    int64_t max_tokens; /* >= 1; more than the slot can hold is cut to it (TP_GEN_CACHE_FULL) */
    const int64_t *stop_ids;
    int n_stop;
    tp_gen_notify *notify; /* may be NULL: the caller polls */
    void *notify_arg;
} tp_gen_request;

/* Checks rq (TP_INVALID naming what is wrong: an empty prompt, one longer
 * than max_seq_len, an id out of range, max_tokens < 1) and takes a free
 * slot (TP_UNAVAILABLE when every slot is busy). The sequence is the
 * caller's until tp_gen_seq_release. */
tp_status tp_gen_submit(tp_gen *g, const tp_gen_request *rq, tp_gen_seq **out, tp_err *err);

/* Copies the tokens from index `from` on (at most cap) to ids and returns
 * how many; *end says whether more will come, and when it is
 * TP_GEN_FAILED, *st (may be NULL) and err (may be NULL) why.
 * When nothing new is there and the sequence runs on, arms its notify: on
 * the next token (wake_on == TP_GEN_WAKE_TOKEN) or only at its end
 * (TP_GEN_WAKE_END), called with the lock this read holds. `armed`, when
 * not NULL, is called right after arming under that lock (the caller
 * suspends its connection there, so the notify cannot come before it). */
typedef enum { TP_GEN_WAKE_TOKEN = 1, TP_GEN_WAKE_END = 2 } tp_gen_wake;
int64_t tp_gen_seq_read(tp_gen_seq *q, int64_t from, int64_t *ids, int64_t cap, tp_gen_wake wake_on,
                        void (*armed)(void *), void *armed_arg, tp_gen_end *end, tp_status *st, tp_err *err);
/* The most tokens q can produce: max_tokens, or what its slot has room for. */
int64_t tp_gen_seq_max_tokens(const tp_gen_seq *q);
/* The client is gone: its slot is freed at the next step boundary. */
void tp_gen_seq_cancel(tp_gen_seq *q);
/* The caller is done with q; no notify runs after this returns. */
void tp_gen_seq_release(tp_gen_seq *q);

typedef struct {
    uint64_t sequences, prompt_tokens, output_tokens, steps, rows;
    uint64_t failed, cancelled;
    int64_t slots, slots_in_use, max_seq_len;
    double step_s;    /* engine time of all steps */
    double decode_s;  /* per sequence, first to last output token, summed */
    uint64_t decode_tokens; /* the output tokens after each sequence's first */
} tp_gen_stats;
void tp_gen_get_stats(tp_gen *g, tp_gen_stats *out);

#endif
