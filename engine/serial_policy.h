/* serial_policy.h — whether a thread group's next step runs serially (every
 * rank a fiber of the calling thread, rank_group.c) or on the rank threads:
 * whichever has recently been faster, measured.
 *
 * Neither wins everywhere. Serial steps wake no thread and spin on no core,
 * but do every rank's work one after the other; rank threads work at once
 * but meet at every collective, and on a busy or virtual machine each
 * meeting can cost a wake-up. Measured on 2 cores: the example MLP runs a
 * step serially several times faster; imported BERT, GPT-2 and Llama
 * fixtures at batch 1 answer 1.4-2x sooner serially, at batch 8 1.4-1.8x
 * sooner on threads. So the policy keeps a moving average of each mode's
 * step time, runs the faster one, and now and then runs the other to
 * refresh its average (a probe: every PROBE_FIRST steps, doubling up to
 * PROBE_LAST while probes confirm the choice). A probe is two steps and
 * only the second is measured: the first after a long spell of the other
 * mode is cold (rank threads woken from a long sleep took 0.5-1 ms for a
 * GPT-2 step that takes 0.3 ms warm), and would keep the policy from ever
 * leaving the mode it is in.
 *
 * A serial step is never tried when it would take over max_ns (its own
 * average, or the threads' average times the ranks while it has none or
 * is stale): a long model never pays a serial probe.
 *
 * The answer depends on the step's size, so a group keeps one policy per
 * size class (tp_serial_policies: steps of 1 row, 2, 3-4, 5-8, ...). One
 * policy for every size compared a probe at one batch size with an
 * average over all of them: under a mixed load a threads probe of a
 * 1-row step beat the serial average of larger steps and sent every size
 * to the threads until their own times brought it back (on the example
 * graph at 32 connections, ~1% of the steps ran on threads where 0.2%
 * are probes), and a model that is faster serially at batch 1 and on
 * threads at batch 8 ran one mode at both.
 *
 * Pure bookkeeping, no clock and no threads: the caller times the steps.
 * Used by one thread at a time. */
#ifndef TP_SERIAL_POLICY_H
#define TP_SERIAL_POLICY_H

#include <stdint.h>

#define TP_SERIAL_PROBE_FIRST 16
#define TP_SERIAL_PROBE_LAST 1024
#define TP_SERIAL_PROBE_STEPS 2

typedef struct {
    int64_t max_ns;
    int ranks;
    int serial;            /* the mode steps run in between probes */
    int64_t avg_ns[2];     /* [0] rank threads, [1] serial; 0: not measured yet */
    uint32_t since_probe, probe_every;
    int probe_left;        /* steps of the probe in progress still to take (0: none) */
    int probe_mode;
} tp_serial_policy;

void tp_serial_policy_init(tp_serial_policy *p, int64_t max_ns, int ranks);
/* 1: run the next step serially, 0: on the rank threads. */
int tp_serial_policy_next(tp_serial_policy *p);
/* What next() will answer, without taking the step (so that a pre-wake
 * wakes the rank threads for a threads step, probes included). */
int tp_serial_policy_peek(const tp_serial_policy *p);
/* The step next() chose took ns (wall clock). */
void tp_serial_policy_took(tp_serial_policy *p, int serial, int64_t ns);

/* One policy per size class: class 0 holds steps of at most one row (and
 * steps that are not a batch: loading, capture), class c > 0 steps of
 * 2^(c-1)+1 .. 2^c rows, the last class everything larger. */
#define TP_SERIAL_CLASSES 8
typedef struct {
    tp_serial_policy by_class[TP_SERIAL_CLASSES];
} tp_serial_policies;

void tp_serial_policies_init(tp_serial_policies *ps, int64_t max_ns, int ranks);
/* The policy of a step of `rows` rows (0: not a batch step). */
tp_serial_policy *tp_serial_policies_for(tp_serial_policies *ps, int64_t rows);
int tp_serial_class(int64_t rows);

#endif
