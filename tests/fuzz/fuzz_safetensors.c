/* libFuzzer harness: the safetensors reader. The input is written to a file
 * (the reader takes a path and uses pread), opened, and every tensor it
 * accepts is read whole and as every shard of 1..4 ranks along each dim;
 * reads must stay inside the file and inside the destination buffer, whose
 * size is what the reader's own header validation promised. */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "fuzz_file.h"
#include "safetensors.h"

static char path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    snprintf(path, sizeof path, "/tmp/tpserve_fuzz_st.%d", (int)getpid());
    return 0;
}

/* Reads t whole and sharded; buffers sized from the validated info. */
static void read_all_ways(st_file *f, const st_tensor_info *t)
{
    size_t bytes = (size_t)(t->end - t->begin);
    if (bytes > (64u << 20))
        return; /* a valid header may describe a large tensor; the file is not */
    char *buf = malloc(bytes ? bytes : 1);
    tp_err err;
    if (!buf)
        return;
    st_read_shard(f, t, -1, 0, 1, buf, &err);
    for (int dim = 0; dim < t->ndim; dim++)
        for (int world = 1; world <= 4; world++)
            for (int rank = 0; rank < world; rank++)
                st_read_shard(f, t, dim, rank, world, buf, &err);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fuzz_write_file(path, data, size) != 0)
        return 0;
    st_file *f;
    tp_err err;
    if (st_open(path, &f, &err) == TP_OK) {
        for (int i = 0; i < st_count(f); i++) {
            const st_tensor_info *t = st_info(f, i);
            if (st_find(f, t->name) != t)
                abort(); /* names are unique and found */
            read_all_ways(f, t);
        }
        st_close(f);
    }
    unlink(path);
    return 0;
}
