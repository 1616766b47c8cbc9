/* worker.h — rank processes: `tpserve worker`, which a leader starts for
 * ranks 1..d-1 (or an operator starts torchrun-style with RANK, WORLD_SIZE
 * and --rendezvous), and the command line a leader gives it. */
#ifndef TP_WORKER_H
#define TP_WORKER_H

#include <stdio.h>

/* What a worker must be told to compile exactly what its leader does. */
typedef struct {
    const char *graph, *backend, *buckets, *disable_passes;
    int no_passes, eager;
    int slots; /* generation graphs: state slots (engine opts state_slots); 0: the default */
} tp_worker_spec;

/* "/proc/self/exe worker GRAPH ..." as a NULL-terminated argv; NULL when out
 * of memory. Free with tp_worker_argv_free. */
char **tp_worker_argv(const tp_worker_spec *s);
void tp_worker_argv_free(char **argv);

int tp_worker_main(int argc, char **argv);
void tp_worker_usage(FILE *out);

#endif
