/* libFuzzer harness: `tpserve serve`'s settings. The input is written to a
 * file and read as a --config file over the defaults, then checked as
 * serve checks it; its first line is also given to tp_config_set as
 * "key=value", the command line's form. Every refusal must be one
 * terminated line (it is printed as is), and a file taken must leave a
 * configuration whose every text field is terminated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "config.h"
#include "fuzz_error.h"
#include "fuzz_file.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "/tmp/tpserve_fuzz_config.%d", (int)getpid());
    return 0;
}

static void check_terminated(const tp_config *c)
{
    const char *texts[] = {c->host, c->graph, c->backend, c->buckets, c->log_level, c->ranks, c->rendezvous};
    const size_t sizes[] = {sizeof c->host, sizeof c->graph, sizeof c->backend, sizeof c->buckets,
                            sizeof c->log_level, sizeof c->ranks, sizeof c->rendezvous};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (!memchr(texts[i], '\0', sizes[i]))
            abort();
}

/* The first line as key=value, through the command line's setter. */
static void set_first_line(tp_config *c, const uint8_t *data, size_t size)
{
    char line[512];
    size_t n = 0;
    while (n < size && n < sizeof line - 1 && data[n] != '\n')
        n++;
    memcpy(line, data, n);
    line[n] = '\0';
    char *eq = strchr(line, '=');
    if (!eq)
        return;
    *eq = '\0';
    tp_err e;
    if (tp_config_set(c, line, eq + 1, &e) != TP_OK)
        fuzz_check_error_line(&e);
    check_terminated(c);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    tp_config c;
    tp_config_defaults(&c);
    set_first_line(&c, data, size);
    tp_config_defaults(&c);
    if (fuzz_write_file(path, data, size) != 0)
        return 0;
    tp_err e;
    if (tp_config_load_file(&c, path, &e) != TP_OK) {
        fuzz_check_error_line(&e);
        return 0;
    }
    check_terminated(&c);
    if (tp_config_validate(&c, &e) != TP_OK)
        fuzz_check_error_line(&e);
    return 0;
}
