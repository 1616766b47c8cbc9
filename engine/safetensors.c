#include "safetensors.h"
#include "json_kind.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The reference implementation's limit: a larger header is corruption (or an
 * attack), and rejecting it early avoids parsing hundreds of MB of JSON. */
#define ST_MAX_HEADER 100000000ull

/* The file is read with pread, never mapped: a weights file truncated or
 * rewritten while it loads then reads short (an error naming the file)
 * instead of raising SIGBUS inside a memcpy. */
struct st_file {
    char *path;
    int fd;
    uint64_t data_off; /* file offset of the data section */
    uint64_t data_len;
    int n;
    st_tensor_info *tensors;
    const st_tensor_info **by_name; /* sorted, for st_find */
};

/* Messages are clipped piecewise so a long path or name can never push the
 * reason out of the fixed-size tp_err buffer. */
__attribute__((format(printf, 5, 6))) static tp_status st_fail(tp_err *err, tp_status s,
                                                               const char *path,
                                                               const char *tensor,
                                                               const char *fmt, ...)
{
    char reason[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(reason, sizeof reason, fmt, ap);
    va_end(ap);
    if (tensor)
        return tp_fail(err, s, "%.300s: tensor '%.150s': %s", path, tensor, reason);
    return tp_fail(err, s, "%.300s: %s", path, reason);
}

/* Byte size of a tensor, or -1 if it does not fit in int64 (shapes and numel
 * are int64 everywhere else in the engine). A zero dim anywhere makes the
 * tensor empty even if the other dims alone would overflow. */
static int64_t checked_nbytes(int ndim, const int64_t *shape, size_t esize)
{
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0)
            return 0;
    uint64_t n = esize;
    for (int i = 0; i < ndim; i++) {
        uint64_t d = (uint64_t)shape[i];
        if (n > (uint64_t)INT64_MAX / d)
            return -1;
        n *= d;
    }
    return (int64_t)n;
}

static int cmp_by_name(const void *a, const void *b)
{
    const st_tensor_info *x = *(const st_tensor_info *const *)a;
    const st_tensor_info *y = *(const st_tensor_info *const *)b;
    return strcmp(x->name, y->name);
}

static tp_status parse_entry(const char *path, const char *name, json_t *e, uint64_t data_len,
                             st_tensor_info *t, tp_err *err)
{
    if (!json_is_object(e))
        return st_fail(err, TP_PARSE, path, name, "entry is %s, not an object", tp_json_kind(e));

    json_t *jd = json_object_get(e, "dtype");
    json_t *js = json_object_get(e, "shape");
    json_t *jo = json_object_get(e, "data_offsets");
    if (!jd)
        return st_fail(err, TP_PARSE, path, name, "missing \"dtype\"");
    if (!js)
        return st_fail(err, TP_PARSE, path, name, "missing \"shape\"");
    if (!jo)
        return st_fail(err, TP_PARSE, path, name, "missing \"data_offsets\"");

    if (!json_is_string(jd))
        return st_fail(err, TP_PARSE, path, name, "\"dtype\" is %s, not a string",
                       tp_json_kind(jd));
    if (tp_dtype_from_st_name(json_string_value(jd), &t->dtype) != 0)
        return st_fail(err, TP_PARSE, path, name,
                       "unknown dtype '%.40s' (supported: F32, F16, BF16, I32, I64)",
                       json_string_value(jd));

    if (!json_is_array(js))
        return st_fail(err, TP_PARSE, path, name, "\"shape\" is %s, not an array",
                       tp_json_kind(js));
    size_t nd = json_array_size(js);
    if (nd > TP_MAX_DIMS)
        return st_fail(err, TP_PARSE, path, name, "shape has %zu dims, more than the %d supported",
                       nd, TP_MAX_DIMS);
    t->ndim = (int)nd;
    for (size_t i = 0; i < nd; i++) {
        json_t *d = json_array_get(js, i);
        if (!json_is_integer(d))
            return st_fail(err, TP_PARSE, path, name, "shape[%zu] is %s, not an integer", i,
                           tp_json_kind(d));
        json_int_t v = json_integer_value(d);
        if (v < 0)
            return st_fail(err, TP_PARSE, path, name, "shape[%zu] is negative (%" PRId64 ")", i,
                           (int64_t)v);
        t->shape[i] = (int64_t)v;
    }

    if (!json_is_array(jo))
        return st_fail(err, TP_PARSE, path, name, "\"data_offsets\" is %s, not an array",
                       tp_json_kind(jo));
    if (json_array_size(jo) != 2)
        return st_fail(err, TP_PARSE, path, name, "\"data_offsets\" has %zu elements, not 2",
                       json_array_size(jo));
    json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
    if (!json_is_integer(jb) || !json_is_integer(je))
        return st_fail(err, TP_PARSE, path, name, "\"data_offsets\" holds %s, not integers",
                       tp_json_kind(json_is_integer(jb) ? je : jb));
    if (json_integer_value(jb) < 0 || json_integer_value(je) < 0)
        return st_fail(err, TP_PARSE, path, name, "data_offsets [%" PRId64 ", %" PRId64
                       "] are negative", (int64_t)json_integer_value(jb),
                       (int64_t)json_integer_value(je));
    t->begin = (uint64_t)json_integer_value(jb);
    t->end = (uint64_t)json_integer_value(je);
    if (t->begin > t->end)
        return st_fail(err, TP_PARSE, path, name,
                       "data_offsets [%" PRIu64 ", %" PRIu64 "] have begin > end", t->begin,
                       t->end);
    if (t->end > data_len)
        return st_fail(err, TP_PARSE, path, name,
                       "data_offsets [%" PRIu64 ", %" PRIu64 "] run past the end of the file "
                       "(data section is %" PRIu64 " bytes)", t->begin, t->end, data_len);

    char sbuf[256];
    int64_t nbytes = checked_nbytes(t->ndim, t->shape, tp_dtype_size(t->dtype));
    if (nbytes < 0)
        return st_fail(err, TP_PARSE, path, name, "shape %s of %s overflows: numel * %zu bytes "
                       "does not fit in 64 bits",
                       tp_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape),
                       tp_dtype_st_name(t->dtype), tp_dtype_size(t->dtype));
    if (t->end - t->begin != (uint64_t)nbytes)
        return st_fail(err, TP_PARSE, path, name,
                       "data_offsets [%" PRIu64 ", %" PRIu64 "] span %" PRIu64 " bytes but "
                       "shape %s of %s needs %" PRId64 " bytes", t->begin, t->end,
                       t->end - t->begin, tp_shape_str(sbuf, sizeof sbuf, t->ndim, t->shape),
                       tp_dtype_st_name(t->dtype), nbytes);
    return TP_OK;
}

static tp_status parse_header(st_file *f, const char *hdr, size_t len, tp_err *err)
{
    json_error_t jerr;
    /* Duplicate names would make st_find ambiguous, so they are malformed. */
    json_t *root = json_loadb(hdr, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return st_fail(err, TP_PARSE, f->path, NULL,
                       "header is not valid JSON: %s (line %d, column %d)", jerr.text, jerr.line,
                       jerr.column);
    tp_status s = TP_OK;
    if (!json_is_object(root)) {
        s = st_fail(err, TP_PARSE, f->path, NULL, "header is %s, not an object",
                    tp_json_kind(root));
        goto out;
    }

    size_t cap = json_object_size(root);
    f->tensors = calloc(cap ? cap : 1, sizeof *f->tensors);
    f->by_name = calloc(cap ? cap : 1, sizeof *f->by_name);
    if (!f->tensors || !f->by_name) {
        s = st_fail(err, TP_NOMEM, f->path, NULL, "out of memory for %zu tensor entries", cap);
        goto out;
    }

    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            /* Free-form producer notes; only its shape is checked so that a
             * garbled header is not silently accepted. */
            if (!json_is_object(val)) {
                s = st_fail(err, TP_PARSE, f->path, NULL, "\"__metadata__\" is %s, not an object",
                            tp_json_kind(val));
                goto out;
            }
            continue;
        }
        st_tensor_info *t = &f->tensors[f->n];
        s = parse_entry(f->path, key, val, f->data_len, t, err);
        if (s != TP_OK)
            goto out;
        if (!(t->name = strdup(key))) {
            s = st_fail(err, TP_NOMEM, f->path, key, "out of memory");
            goto out;
        }
        f->by_name[f->n] = t;
        f->n++;
    }
    qsort(f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
out:
    json_decref(root);
    return s;
}

/* Exactly len bytes at off, or an error: a short read means the file
 * shrank after it was opened (its size was checked then). */
static tp_status pread_full(const st_file *f, const char *tensor, void *dst, size_t len, uint64_t off,
                            tp_err *err)
{
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(f->fd, (char *)dst + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return st_fail(err, TP_IO, f->path, tensor, "read error at byte %" PRIu64 ": %s",
                           off + done, strerror(errno));
        if (r == 0)
            return st_fail(err, TP_IO, f->path, tensor, "file ends at byte %" PRIu64 " but %zu more bytes "
                           "were expected (truncated while loading?)", off + done, len - done);
        done += (size_t)r;
    }
    return TP_OK;
}

/* O_NONBLOCK so a FIFO or device never blocks open(); only regular files
 * pass the fstat check after it. */
static tp_status open_regular(st_file *f, uint64_t *size, tp_err *err)
{
    f->fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f->fd < 0)
        return st_fail(err, TP_IO, f->path, NULL, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(f->fd, &sb) != 0)
        return st_fail(err, TP_IO, f->path, NULL, "cannot stat: %s", strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return st_fail(err, TP_IO, f->path, NULL, "not a regular file");
    *size = (uint64_t)sb.st_size;
    return TP_OK;
}

tp_status st_open(const char *path, st_file **out, tp_err *err)
{
    *out = NULL;
    st_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return st_fail(err, TP_NOMEM, path, NULL, "out of memory");
    }
    f->fd = -1;
    uint64_t size = 0;
    unsigned char prefix[8];
    char *hdr = NULL;
    tp_status s = open_regular(f, &size, err);
    if (s != TP_OK)
        goto fail;
    if (size < 8) {
        s = st_fail(err, TP_PARSE, path, NULL,
                    "file is %" PRIu64 " bytes, shorter than the 8-byte header length", size);
        goto fail;
    }
    if ((s = pread_full(f, NULL, prefix, sizeof prefix, 0, err)) != TP_OK)
        goto fail;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = (hlen << 8) | prefix[i];
    if (hlen > ST_MAX_HEADER) {
        s = st_fail(err, TP_PARSE, path, NULL,
                    "header length %" PRIu64 " exceeds the %llu-byte limit (corrupt file?)", hlen,
                    ST_MAX_HEADER);
        goto fail;
    }
    if (hlen > size - 8) {
        s = st_fail(err, TP_PARSE, path, NULL,
                    "header length %" PRIu64 " runs past the end of the file (%" PRIu64
                    " bytes after the length prefix)", hlen, size - 8);
        goto fail;
    }
    f->data_off = 8 + hlen;
    f->data_len = size - 8 - hlen;
    if (!(hdr = malloc(hlen ? hlen : 1))) {
        s = st_fail(err, TP_NOMEM, path, NULL, "out of memory for a %" PRIu64 "-byte header", hlen);
        goto fail;
    }
    if ((s = pread_full(f, NULL, hdr, (size_t)hlen, 8, err)) == TP_OK)
        s = parse_header(f, hdr, (size_t)hlen, err);
    free(hdr);
    if (s != TP_OK)
        goto fail;
    *out = f;
    return TP_OK;
fail:
    st_close(f);
    return s;
}

void st_close(st_file *f)
{
    if (!f)
        return;
    if (f->fd >= 0)
        close(f->fd);
    for (int i = 0; i < f->n; i++)
        free(f->tensors[i].name);
    free(f->tensors);
    free(f->by_name);
    free(f->path);
    free(f);
}

const char *st_path(const st_file *f) { return f->path; }

int st_count(const st_file *f) { return f->n; }

const st_tensor_info *st_info(const st_file *f, int i)
{
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const st_tensor_info *st_find(const st_file *f, const char *name)
{
    if (!name)
        return NULL;
    st_tensor_info key = {.name = (char *)name};
    const st_tensor_info *kp = &key;
    const st_tensor_info **hit =
        bsearch(&kp, f->by_name, (size_t)f->n, sizeof *f->by_name, cmp_by_name);
    return hit ? *hit : NULL;
}

tp_status st_read_shard(const st_file *f, const st_tensor_info *t, int shard_dim, int rank,
                        int world, void *dst, tp_err *err)
{
    size_t esize = tp_dtype_size(t->dtype);
    int64_t nbytes = t->ndim >= 0 && t->ndim <= TP_MAX_DIMS
                         ? checked_nbytes(t->ndim, t->shape, esize)
                         : -1;
    /* Re-checked because the info may be a caller's copy, possibly edited:
     * this is the guard that keeps the copy inside the mapping. */
    if (esize == 0 || nbytes < 0 || t->begin > t->end || t->end > f->data_len ||
        t->end - t->begin != (uint64_t)nbytes)
        return st_fail(err, TP_INVALID, f->path, t->name,
                       "tensor info does not describe a tensor of this file");
    uint64_t src = f->data_off + t->begin;
    unsigned char *out = dst;

    if (shard_dim < 0) {
        if (nbytes > 0 && !dst)
            return st_fail(err, TP_INVALID, f->path, t->name, "destination is NULL");
        return nbytes > 0 ? pread_full(f, t->name, out, (size_t)nbytes, src, err) : TP_OK;
    }
    if (world < 1 || rank < 0 || rank >= world)
        return st_fail(err, TP_INVALID, f->path, t->name, "rank %d out of range for world %d",
                       rank, world);
    if (shard_dim >= t->ndim)
        return st_fail(err, TP_INVALID, f->path, t->name,
                       "shard dim %d out of range for a %d-d tensor", shard_dim, t->ndim);
    int64_t dim = t->shape[shard_dim];
    if (dim % world != 0)
        return st_fail(err, TP_INVALID, f->path, t->name,
                       "dim %d of size %" PRId64 " is not divisible by world size %d", shard_dim,
                       dim, world);

    /* View the tensor as [outer, dim, inner]: the shard is `outer` runs of
     * chunk*inner contiguous bytes, one per outer index. */
    uint64_t outer = 1, inner = esize;
    for (int i = 0; i < shard_dim; i++)
        outer *= (uint64_t)t->shape[i];
    for (int i = shard_dim + 1; i < t->ndim; i++)
        inner *= (uint64_t)t->shape[i];
    uint64_t chunk = (uint64_t)(dim / world);
    uint64_t run = chunk * inner, pitch = (uint64_t)dim * inner;
    if (outer == 0 || run == 0)
        return TP_OK;
    if (!dst)
        return st_fail(err, TP_INVALID, f->path, t->name, "destination is NULL");
    src += (uint64_t)rank * run;
    tp_status s = TP_OK;
    for (uint64_t o = 0; s == TP_OK && o < outer; o++)
        s = pread_full(f, t->name, out + o * run, (size_t)run, src + o * pitch, err);
    return s;
}

/* ---- writer ---- */

static tp_status build_header(const char *path, const st_write_item *items, int n,
                              json_t **out, tp_err *err)
{
    json_t *root = json_object();
    if (!root)
        return st_fail(err, TP_NOMEM, path, NULL, "out of memory");
    uint64_t off = 0;
    tp_status s = TP_OK;
    for (int i = 0; i < n; i++) {
        const st_write_item *it = &items[i];
        const char *name = it->name ? it->name : "(null)";
        if (!it->name || strcmp(it->name, "__metadata__") == 0) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: reserved or missing name", i);
            goto fail;
        }
        if (json_object_get(root, it->name)) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: duplicate name", i);
            goto fail;
        }
        if ((unsigned)it->dtype >= TP_DTYPE_COUNT) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: invalid dtype %d", i,
                        (int)it->dtype);
            goto fail;
        }
        if (it->ndim < 0 || it->ndim > TP_MAX_DIMS || (it->ndim > 0 && !it->shape)) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: invalid rank %d", i, it->ndim);
            goto fail;
        }
        for (int d = 0; d < it->ndim; d++)
            if (it->shape[d] < 0) {
                s = st_fail(err, TP_INVALID, path, name, "item %d: shape[%d] is negative (%" PRId64
                            ")", i, d, it->shape[d]);
                goto fail;
            }
        int64_t nb = checked_nbytes(it->ndim, it->shape, tp_dtype_size(it->dtype));
        if (nb < 0 || (uint64_t)nb > (uint64_t)INT64_MAX - off) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: size overflows 64 bits", i);
            goto fail;
        }
        if (nb > 0 && !it->data) {
            s = st_fail(err, TP_INVALID, path, name, "item %d: data is NULL", i);
            goto fail;
        }
        json_t *shape = json_array();
        for (int d = 0; shape && d < it->ndim; d++)
            if (json_array_append_new(shape, json_integer(it->shape[d])) != 0) {
                json_decref(shape);
                shape = NULL;
            }
        json_t *e = shape ? json_pack("{s:s, s:O, s:[I, I]}", "dtype",
                                      tp_dtype_st_name(it->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)off, (json_int_t)(off + nb))
                          : NULL;
        json_decref(shape);
        /* json_object_set_new fails for names that are not valid UTF-8. */
        if (!e || json_object_set_new(root, it->name, e) != 0) {
            s = st_fail(err, TP_INVALID, path, name,
                        "item %d: cannot encode header entry (name not UTF-8, or out of memory)",
                        i);
            goto fail;
        }
        off += (uint64_t)nb;
    }
    *out = root;
    return TP_OK;
fail:
    json_decref(root);
    return s;
}

static tp_status write_all(int fd, const char *path, const void *buf, size_t len, tp_err *err)
{
    const unsigned char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return st_fail(err, TP_IO, path, NULL, "write failed: %s", strerror(errno));
        p += w;
        len -= (size_t)w;
    }
    return TP_OK;
}

tp_status st_write(const char *path, const st_write_item *items, int n, tp_err *err)
{
    if (n < 0 || (n > 0 && !items))
        return st_fail(err, TP_INVALID, path, NULL, "invalid item list (n = %d)", n);
    json_t *root = NULL;
    tp_status s = build_header(path, items, n, &root, err);
    if (s != TP_OK)
        return s;
    char *json = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    if (!json)
        return st_fail(err, TP_NOMEM, path, NULL, "out of memory encoding the header");
    size_t jlen = strlen(json), hlen = (jlen + 7) & ~(size_t)7;
    char *hdr = malloc(8 + hlen);
    if (!hdr) {
        free(json);
        return st_fail(err, TP_NOMEM, path, NULL, "out of memory encoding the header");
    }
    for (int i = 0; i < 8; i++)
        hdr[i] = (char)(((uint64_t)hlen >> (8 * i)) & 0xff);
    memcpy(hdr + 8, json, jlen);
    memset(hdr + 8 + jlen, ' ', hlen - jlen);
    free(json);

    /* Written beside the target and renamed into place, so a reader (or a
     * crash) never sees a half-written weights file, and a failed write
     * leaves any previous file intact. O_EXCL plus a per-process counter keeps
     * concurrent writers from sharing a temp file. */
    static atomic_uint counter;
    char tmp[4096];
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%u", path, (long)getpid(),
                           atomic_fetch_add(&counter, 1));
        if (len < 0 || (size_t)len >= sizeof tmp) {
            free(hdr);
            return st_fail(err, TP_IO, path, NULL, "path too long");
        }
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    if (fd < 0) {
        s = st_fail(err, TP_IO, path, NULL, "cannot create: %s", strerror(errno));
        free(hdr);
        return s;
    }
    s = write_all(fd, path, hdr, 8 + hlen, err);
    free(hdr);
    for (int i = 0; s == TP_OK && i < n; i++) {
        int64_t nb = checked_nbytes(items[i].ndim, items[i].shape, tp_dtype_size(items[i].dtype));
        if (nb > 0)
            s = write_all(fd, path, items[i].data, (size_t)nb, err);
    }
    if (close(fd) != 0 && s == TP_OK)
        s = st_fail(err, TP_IO, path, NULL, "close failed: %s", strerror(errno));
    if (s == TP_OK && rename(tmp, path) != 0)
        s = st_fail(err, TP_IO, path, NULL, "cannot rename into place: %s", strerror(errno));
    if (s != TP_OK)
        unlink(tmp);
    return s;
}
