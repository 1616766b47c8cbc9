/* cpu_pin.h — pin_threads: an HTTP thread kept on one CPU, and let go
 * while that CPU starves it.
 *
 * Pinned where its clients' connections come from (the acceptor routes
 * them by CPU), a thread and its clients wake each other on one CPU: 1-2 us
 * a wake-up against ~45 across CPUs on the VMs measured, and 1.2-1.8x the
 * binary requests/s at 32 connections (server/README.md at 27cb4dd, "HTTP threads
 * pinned, connections by CPU"). But the scheduler can no longer move it.
 * When another task keeps its CPU busy while a CPU it could use idles (a
 * client that moved after it connected, a batch job beside the sidecar),
 * the pin cost 4-8x. So each pinned thread watches its own scheduling:
 * every TP_PIN_WINDOW_MS it reads how long it ran and how long it waited
 * to run (/proc/thread-self/schedstat) and how long the other CPUs idled
 * (/proc/stat). After TP_PIN_STRIKES starved windows in a row it unpins
 * itself for a while (1 s, doubled each time it is starved again soon
 * after, up to 64 s), then pins itself again and looks.
 *
 * A tp_cpu_pin belongs to one thread: create and free it anywhere, tick it
 * only from the thread it pins. */
#ifndef TP_CPU_PIN_H
#define TP_CPU_PIN_H

#include <sched.h> /* cpu_set_t: -D_GNU_SOURCE, as everywhere here */
#include <stddef.h>
#include <stdint.h>

#define TP_PIN_WINDOW_MS 250
#define TP_PIN_STRIKES 2
#define TP_PIN_HOLD_MIN_MS 1000
#define TP_PIN_HOLD_MAX_MS 64000

/* One window of a pinned thread's scheduling, in ns. */
typedef struct {
    int64_t wall;       /* the window */
    int64_t run, wait;  /* the thread on its CPU; runnable and waiting for it */
    int64_t other_idle; /* the idlest other CPU the thread may use: idle */
} tp_pin_window;

/* Starved: the thread waited for its CPU at least as long as it ran, and
 * for a quarter of the window, while another CPU it may use idled a
 * quarter of it. A thread sharing its CPU with the client it serves waits
 * too (0.6x its run time at one connection, measured), but then neither
 * waits as long as it runs; under full load no CPU idles. */
int tp_pin_window_starved(const tp_pin_window *w);

/* TP_PIN_LEFT: someone else set the thread's CPUs while this guard was
 * not holding them (before its first pin, or while it was unpinned); they
 * are left as they are, for good, and nothing changed. */
typedef enum { TP_PIN_SAME, TP_PIN_PINNED, TP_PIN_UNPINNED, TP_PIN_LEFT } tp_pin_change;

/* When to pin and unpin, from the windows' verdicts: kept apart from the
 * system calls so a test can drive it with its own clock. */
typedef struct {
    int pinned, strikes;
    int64_t hold_ms;     /* the next unpinned spell */
    int64_t until_ms;    /* unpinned: when to pin again */
    int64_t pinned_ms;   /* pinned: since when */
} tp_pin_policy;

/* Pinned since now_ms, the next hold the shortest. */
void tp_pin_policy_init(tp_pin_policy *pp, int64_t now_ms);
/* Pinned, a window ended at now_ms, starved or not: TP_PIN_UNPINNED on
 * the TP_PIN_STRIKES-th starved window in a row. A thread pinned a whole
 * TP_PIN_HOLD_MAX_MS since it last unpinned starts again from the
 * shortest hold. */
tp_pin_change tp_pin_policy_window(tp_pin_policy *pp, int starved, int64_t now_ms);
/* Unpinned: TP_PIN_PINNED once its hold is over. */
tp_pin_change tp_pin_policy_poll(tp_pin_policy *pp, int64_t now_ms);

/* The idle time of each CPU cpus[0..n) in clock ticks (USER_HZ), read
 * from /proc/stat's text: idle plus iowait. 0, or -1 when a CPU's line is
 * missing or malformed. */
int tp_cpu_pin_parse_idle(const char *stat, const int *cpus, int n, uint64_t *idle);

/* 1 when this system shows a thread's waiting time
 * (/proc/thread-self/schedstat); 0 with the reason in why. */
int tp_cpu_pin_watchable(char *why, size_t why_len);

typedef struct tp_cpu_pin tp_cpu_pin;

/* A pin of some thread to cpu; allowed: every CPU it may use (restored
 * when it unpins). NULL without memory. */
tp_cpu_pin *tp_cpu_pin_create(int cpu, const cpu_set_t *allowed);
void tp_cpu_pin_free(tp_cpu_pin *p);

/* From the pinned thread, often (on each request; a window not yet over
 * costs a comparison): the first call pins it, later ones judge each
 * window and pin or unpin it. Returns what changed, and why in why.
 * A failed system call unpins the thread for good (TP_PIN_UNPINNED with
 * the error): a thread nobody watches must not stay pinned. A thread
 * whose CPUs are not those the pin last gave it (or, at its first tick,
 * those it was created with) when a window ends or a change is due was
 * moved by someone else (taskset -p): it is left on them, for good
 * (TP_PIN_UNPINNED when it was pinned, else TP_PIN_LEFT). */
tp_pin_change tp_cpu_pin_tick(tp_cpu_pin *p, int64_t now_ms, char *why, size_t why_len);

#endif
