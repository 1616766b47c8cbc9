/* spin_wait.h — how a thread waits for a peer (a thread of this process, or
 * a process mapping the same memory) that usually answers within
 * microseconds: poll for a bounded time, then sleep on a futex.
 *
 * Sleeping costs a context switch on each side and tens of microseconds of
 * wake-up latency on a virtual machine; spinning costs the core. A spin is
 * worth it only when every party has a core of its own: a spinning waiter
 * on a shared core holds exactly the core the peer it waits for needs. */
#ifndef TP_SPIN_WAIT_H
#define TP_SPIN_WAIT_H

#include <stdatomic.h>
#include <stdint.h>

/* How long a waiter spins before it sleeps, when it may spin at all. The
 * cpu ranks of the example graph (2 ranks, 2 cores) wait for each other
 * < 1 us inside a step, and 15-35 us when the peer is waking up from a
 * futex (its first collective of a step, its first step after a pause):
 * 50 us covers both, and caps what a wait that sleeps anyway wastes. */
#define TP_SPIN_NS 50000

/* The cores this process may use: its CPU affinity mask, capped by a
 * cgroup v2 CPU quota (a container limited to 2 CPUs on a 64-core node). */
int tp_spin_cores(void);

/* The spin budget (ns) for a wait among `parties` busy threads or
 * processes on `cores` cores: TP_SPIN_NS, or 0 (sleep at once) when they
 * outnumber the cores. */
int64_t tp_spin_budget(int parties, int cores);

/* Polls done(arg) until it answers non-zero or budget_ns have passed (at
 * once when budget_ns <= 0); returns its last answer. */
int tp_spin_until(int (*done)(const void *arg), const void *arg, int64_t budget_ns);

/* What one wait site (one thread's wait for one kind of event) learned:
 * spin only while spinning pays. Having a core for every rank is not
 * enough: another process's load (or the peer being preempted) can keep
 * the peer off a core for milliseconds, and a spin that ends in a sleep
 * anyway is pure waste; and some sites never pay (a rank waiting for the
 * next request). A site tracks the share of its spins that ran out; while
 * that is over half, it sleeps at once for 1, 2, 4 ... 64 waits between
 * probing spins (1 again after a probe that paid, so it comes back within
 * some 70 waits once the peer is quick again). A site that runs out now and
 * then (a peer's slow wake-up once in a while) keeps spinning. Zero-initialized: spin. Used by one
 * thread at a time. */
typedef struct {
    uint16_t misses;  /* recent share of spins that ran out, of 1024 (moving average) */
    uint16_t backoff; /* waits skipped after the last probe */
    uint16_t skip;    /* waits left that sleep at once */
    uint16_t stretch; /* spins last budget_ns << stretch (tp_spin_site_ended) */
    uint16_t before[3]; /* misses, backoff and skip before the last spin ran out */
    int64_t ran_out;    /* tp_now_ns() when the last spin ran out; 0: it did not */
    int64_t spun;       /* how long that spin was */
} tp_spin_site;

/* A site's spins stretch to at most budget_ns << TP_SPIN_STRETCH_MAX. */
#define TP_SPIN_STRETCH_MAX 2

/* tp_spin_until under the site's history (budget_ns <= 0: no spin). */
int tp_spin_site_until(tp_spin_site *site, int (*done)(const void *arg), const void *arg, int64_t budget_ns);

/* The caller's wait is over, after tp_spin_site_until said no and it slept.
 * A wait that ended within one more spin of the spin running out met a
 * peer that was on its way: a spin too short, not a peer too slow. On a
 * VM whose idle vCPUs halt, a sleeping peer takes ~50 us to wake, and a
 * client's round trip at one connection grows past the spin whenever a
 * CPU has halted. Counted as misses, such waits turned off the spin of a
 * worker waiting for its next command, which let its CPU halt, which made
 * the next round trips longer still: a group of processes at one
 * connection served 1-10k requests/s instead of 28-38k, until chance
 * brought it back (measured in 2026-11; server/README.md at 27cb4dd,
 * "Spins that stretch to meet a waking peer"). So such a wait is not a miss, and the site's spins double (up
 * to TP_SPIN_STRETCH_MAX), to halve again after each spin that paid
 * within budget_ns itself. A wait that ended later stays a miss. Callers
 * choose: a site whose caller never calls this keeps the plain budget and
 * counts every spin that ran out; waits between steps call it, waits
 * inside a step do not (rank_procs.c, wait_for, says why). */
void tp_spin_site_ended(tp_spin_site *site);

/* The clock spins and sites read (NULL: the monotonic clock, tp_now_ns).
 * For tests: what a site decides depends on when things happen, and a
 * loaded machine preempts a spinning thread for longer than any budget a
 * test can afford; a test's own clock makes those decisions exact. */
void tp_spin_set_clock(int64_t (*now)(void));

/* futex(2) on a 32-bit word: sleeps while *w == expected (timeout_ms < 0:
 * no timeout); wakes every sleeper. shared: the word lies in memory other
 * processes map (the kernel keys the futex by page, not address). */
void tp_futex_wait(_Atomic uint32_t *w, uint32_t expected, int timeout_ms, int shared);
void tp_futex_wake(_Atomic uint32_t *w, int shared);

/* The same with a count of the sleepers, so that a waker makes the wake-up
 * syscall only when someone sleeps (most waits end in their spin). No
 * wake-up is lost: a sleeper counts itself, then sleeps only while the word
 * still holds `expected` (the kernel re-reads it); a waker changes the word
 * first, then reads the count (all seq_cst). So either the waker sees the
 * sleeper, or the sleeper sees the change. */
void tp_futex_sleep(_Atomic uint32_t *w, uint32_t expected, _Atomic uint32_t *sleepers, int timeout_ms, int shared);
void tp_futex_wake_sleepers(_Atomic uint32_t *w, _Atomic uint32_t *sleepers, int shared);

#endif
