/* safetensors.h — read weights with pread (never a mapping: a file that
 * shrinks while it loads is an error naming it, not SIGBUS), and write the
 * same format for tests and tools.
 *
 * The reader validates the whole header at open time, so every later read
 * (st_read_shard) can trust the offsets; a FIFO, device or directory is
 * refused without blocking. Shards are cut on the fly: rank r of `world`
 * reads only its own bytes, so no rank ever materializes the full tensor.
 *
 * Format: u64 little-endian header length N, N bytes of JSON
 *   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]},
 *    "__metadata__": {"k": "v"}}          (optional, ignored)
 * then the data section; offsets are relative to its start (byte 8 + N). */
#ifndef TP_SAFETENSORS_H
#define TP_SAFETENSORS_H

#include <stdint.h>

#include "dtype.h"
#include "status.h"
#include "tensor.h"

typedef struct st_file st_file;

typedef struct {
    char *name;
    tp_dtype dtype;
    int ndim;
    int64_t shape[TP_MAX_DIMS];
    uint64_t begin, end; /* byte offsets relative to the data section */
} st_tensor_info;

/* On failure *out is NULL and err names the path (and the tensor, if one is
 * at fault). TP_IO for an unreadable file, TP_PARSE for malformed content. */
tp_status st_open(const char *path, st_file **out, tp_err *err);
/* Closes the file; every info obtained from f becomes invalid. NULL is ok. */
void st_close(st_file *f);

const char *st_path(const st_file *f);
int st_count(const st_file *f);
/* Header order, i.e. the order the entries appear in the file. NULL if i is
 * out of range. */
const st_tensor_info *st_info(const st_file *f, int i);
const st_tensor_info *st_find(const st_file *f, const char *name); /* NULL if absent */
/* Copies rank's shard of t into dst (contiguous, row-major). shard_dim < 0
 * means the whole tensor (replicate). Otherwise dim shard_dim is split into
 * `world` equal contiguous chunks and rank r gets chunk r; any dim works
 * (non-leading dims are gathered run by run, touching only this shard's
 * bytes). dst must hold numel/world elements (numel when replicated).
 * TP_INVALID if the dim is not divisible by world or the arguments are out
 * of range. */
tp_status st_read_shard(const st_file *f, const st_tensor_info *t, int shard_dim, int rank,
                        int world, void *dst, tp_err *err);

typedef struct {
    const char *name;
    tp_dtype dtype;
    int ndim;
    const int64_t *shape; /* may be NULL when ndim == 0 */
    const void *data;     /* contiguous, row-major; may be NULL when empty */
} st_write_item;

/* Writes a valid safetensors file (8-byte LE header length, JSON header
 * padded with spaces to a multiple of 8 so the data section stays 8-byte
 * aligned, data in item order). On failure no partial file is left behind. */
tp_status st_write(const char *path, const st_write_item *items, int n, tp_err *err);

#endif
