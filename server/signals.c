#include "signals.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

static const int server_signals[] = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};

void tp_signals_set(sigset_t *set)
{
    sigemptyset(set);
    for (size_t i = 0; i < sizeof server_signals / sizeof *server_signals; i++)
        sigaddset(set, server_signals[i]);
}

int tp_signals_stop(int sig) { return sig == SIGTERM || sig == SIGINT; }

static int all_blocked(const sigset_t *want)
{
    sigset_t cur;
    if (pthread_sigmask(SIG_BLOCK, NULL, &cur) != 0)
        return 0;
    for (size_t i = 0; i < sizeof server_signals / sizeof *server_signals; i++)
        if (sigismember(want, server_signals[i]) && !sigismember(&cur, server_signals[i]))
            return 0;
    return 1;
}

tp_status tp_signals_block_everywhere(char **argv, int env_changed, tp_err *err)
{
    sigset_t set;
    tp_signals_set(&set);
    if (all_blocked(&set) && !env_changed)
        return TP_OK; /* inherited blocked (a re-exec, or a parent's choice) */
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    /* A signal arriving from here on stays pending across the exec. */
    execv("/proc/self/exe", argv);
    return tp_fail(err, TP_INTERNAL, "cannot re-execute /proc/self/exe to block signals in library threads "
                   "and apply the environment set for them: %s (a SIGTERM may kill the process instead of "
                   "draining it, and OpenBLAS keeps the kernels it detected)", strerror(errno));
}
