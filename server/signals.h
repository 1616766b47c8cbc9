/* signals.h — the signals `tpserve serve` takes: blocked in every thread of
 * the process from the first instruction on, taken synchronously by the
 * main thread from a signalfd (so no work ever happens in a handler).
 *
 * SIGTERM, SIGINT: drain and exit (docs/operations.md, "Signals and shutdown").
 * SIGHUP, SIGUSR1, SIGUSR2: logged and otherwise ignored; serving goes on.
 *   (A closed terminal or a stray `kill -HUP` must not reset requests;
 *   tpserve has no configuration or log file to reopen.) */
#ifndef TP_SIGNALS_H
#define TP_SIGNALS_H

#include <signal.h>

#include "status.h"

/* The set above. */
void tp_signals_set(sigset_t *set);

/* 1 for SIGTERM and SIGINT (stop), 0 for the signals that are only logged. */
int tp_signals_stop(int sig);

/* Makes sure every thread of this process has the set blocked, including
 * threads a shared library started before main(): OpenBLAS starts its
 * thread pool from its own constructor, which runs before any code of this
 * executable, so blocking in main() (or in a constructor) is too late for
 * that thread, and a SIGTERM delivered to it kills the process. When the
 * calling thread does not have the set blocked yet, this blocks it and
 * re-executes /proc/self/exe with argv: the signal mask survives execve, so
 * every thread of the new image, library threads included, starts with the
 * set blocked. env_changed: re-execute even when the set is already
 * blocked (the caller set environment a library reads as it loads).
 * Returns TP_OK once the set is blocked in the process; on a failed exec,
 * the set is blocked in this thread only and err says why. */
tp_status tp_signals_block_everywhere(char **argv, int env_changed, tp_err *err);

#endif
