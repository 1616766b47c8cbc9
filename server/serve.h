/* serve.h — `tpserve serve`: load a graph and answer KServe v2 REST calls
 * until SIGTERM/SIGINT, then drain in-flight requests and exit. */
#ifndef TP_SERVE_H
#define TP_SERVE_H

#include <stdio.h>

/* argv[0] is "serve". Returns the process exit code: 0 after a clean drain,
 * 1 on a load/bind failure or a drain that hit its timeout, 2 on bad usage. */
int tp_serve_main(int argc, char **argv);

/* Documents the serve flags, config file keys and signals (for --help). */
void tp_serve_usage(FILE *out);

#endif
