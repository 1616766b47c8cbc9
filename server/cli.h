/* cli.h — the offline subcommands: `tpserve run` and `tpserve plan`.
 * Each returns a process exit code and prints a one-line reason on error. */
#ifndef TP_CLI_H
#define TP_CLI_H

#include <stdio.h>

int tp_cli_run(int argc, char **argv);
int tp_cli_plan(int argc, char **argv);
void tp_cli_usage(FILE *out);

#endif
