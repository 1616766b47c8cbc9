/* tpserve — serve tensor-parallel graphs over KServe v2 REST. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "engine.h"
#include "serve.h"
#include "signals.h"
#include "worker.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: tpserve COMMAND ...\n\ncommands:\n");
    tp_cli_usage(out);
    tp_worker_usage(out);
    fprintf(out, "  tpserve serve [options]\n      serve the graph over HTTP (KServe v2)\n\n");
    tp_serve_usage(out);
}

int main(int argc, char **argv)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 ||
        strcmp(argv[1], "help") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    /* The environment the backends' libraries read as they load (the
     * OpenBLAS kernels: kernels/cpu/blas_pick.h); serve applies it with its
     * own re-exec (signals.h). */
    if (strcmp(argv[1], "run") == 0) {
        tp_engine_reexec_for_backends(argv);
        return tp_cli_run(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "plan") == 0)
        return tp_cli_plan(argc - 1, argv + 1);
    if (strcmp(argv[1], "worker") == 0) {
        tp_engine_reexec_for_backends(argv); /* one started by hand, not by serve */
        return tp_worker_main(argc - 1, argv + 1);
    }
    if (strcmp(argv[1], "serve") == 0) {
        tp_err err;
        /* The cpu backend asks OpenBLAS for the threads its GEMMs use
         * (usable cores / ranks, cpu_backend.c); OpenBLAS reads this in its
         * constructor, before main, so only the re-exec below (and the rank
         * processes, which inherit it) can spare the idle pool it would
         * start first, whose threads spin on sched_yield at times. */
        setenv("OPENBLAS_NUM_THREADS", "1", 0);
        /* and the kernels: OpenBLAS's table may predate this CPU
         * (kernels/cpu/blas_pick.h) */
        int env_changed = tp_engine_prepare_exec();
        if (tp_signals_block_everywhere(argv, env_changed, &err) != TP_OK)
            fprintf(stderr, "tpserve serve: warning: %s\n", err.msg);
        return tp_serve_main(argc - 1, argv + 1);
    }
    fprintf(stderr, "tpserve: unknown command '%s' (try tpserve --help)\n", argv[1]);
    return 2;
}
