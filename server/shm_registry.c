#include "shm_registry.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h> /* shm_open */
#include <sys/stat.h>
#include <unistd.h>

#include "json_tensor.h"

#define NAME_MAX_LEN 127
#define KEY_MAX_LEN 255

struct tp_shm_region {
    struct tp_shm_region *next; /* registry list */
    _Atomic int refs;           /* the registry's one, plus one per holder */
    char name[NAME_MAX_LEN + 1];
    char key[KEY_MAX_LEN + 1];
    uint64_t offset, byte_size;
    int fd, writable; /* the object, open for the region's whole life */
};

struct tp_shm_registry {
    pthread_mutex_t mu;
    tp_shm_region *head;
    int max_regions;
    /* Registered regions plus registrations under way: a slot is taken
     * before the object is opened, so the server never holds more than
     * max_regions objects open for registered names. */
    int used;
};

tp_shm_registry *tp_shm_registry_create(int max_regions)
{
    tp_shm_registry *g = calloc(1, sizeof *g);
    if (g) {
        pthread_mutex_init(&g->mu, NULL);
        g->max_regions = max_regions;
    }
    return g;
}

int tp_shm_count(tp_shm_registry *g)
{
    pthread_mutex_lock(&g->mu);
    int n = 0;
    for (const tp_shm_region *r = g->head; r; r = r->next)
        n++;
    pthread_mutex_unlock(&g->mu);
    return n;
}

static void region_destroy(tp_shm_region *r)
{
    if (r->fd >= 0)
        close(r->fd);
    free(r);
}

void tp_shm_release(tp_shm_region *r)
{
    if (r && atomic_fetch_sub(&r->refs, 1) == 1)
        region_destroy(r);
}

void tp_shm_registry_free(tp_shm_registry *g)
{
    if (!g)
        return;
    tp_shm_unregister(g, NULL, NULL);
    pthread_mutex_destroy(&g->mu);
    free(g);
}

const char *tp_shm_name(const tp_shm_region *r) { return r->name; }

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 1 && n <= NAME_MAX_LEN &&
           strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-") == n;
}

static int key_ok(const char *s)
{
    size_t n = strlen(s);
    return n >= 2 && n <= KEY_MAX_LEN && s[0] == '/' && !strchr(s + 1, '/') &&
           strcmp(s, "/.") != 0 && strcmp(s, "/..") != 0;
}

/* What a key that is not a regular file names, from its st_mode. */
static const char *kind_of_mode(mode_t m)
{
    return S_ISFIFO(m) ? "a FIFO" : S_ISDIR(m) ? "a directory" : S_ISSOCK(m) ? "a socket"
         : S_ISCHR(m) ? "a character device" : S_ISBLK(m) ? "a block device"
         : "not a regular file";
}

/* What open's errno says the key names, when it says it is no shared
 * memory object at all; NULL for any other error. */
static const char *kind_of_errno(int e)
{
    return e == ELOOP ? "a symbolic link" /* O_NOFOLLOW on the last component */
         /* O_RDWR on a directory; glibc's shm_open turns that EISDIR into
          * EINVAL, which nothing else gives a key that passed key_ok */
         : e == EISDIR || e == EINVAL ? "a directory"
         : e == ENXIO ? "a socket or a device with nothing behind it"
         : e == ENODEV || e == EOPNOTSUPP ? "a device or special file"
         : NULL;
}

static tp_status fail_kind(const tp_shm_region *r, const char *kind, tp_err *err)
{
    return tp_fail(err, TP_INVALID, "shared memory region '%s': key '%s' is %s, not a shared "
                   "memory object", r->name, r->key, kind);
}

/* O_NONBLOCK: opening a FIFO read-only waits for a writer, and the client
 * decides whether one ever comes; with it the open returns at once and the
 * fstat below refuses the FIFO (a device is not waited on either). */
static int open_key(const char *key, int mode)
{
    return shm_open(key, mode | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC, 0);
}

/* Read-write if the object allows it, else read-only. */
static tp_status open_object(tp_shm_region *r, tp_err *err)
{
    r->writable = 1;
    r->fd = open_key(r->key, O_RDWR);
    if (r->fd < 0 && (errno == EACCES || errno == EROFS)) {
        r->writable = 0;
        r->fd = open_key(r->key, O_RDONLY);
    }
    if (r->fd >= 0)
        return TP_OK;
    int e = errno;
    const char *kind = kind_of_errno(e);
    if (kind)
        return fail_kind(r, kind, err);
    return tp_fail(err, e == ENOENT ? TP_NOT_FOUND : e == EACCES ? TP_INVALID : TP_IO,
                   "shared memory region '%s': cannot open key '%s': %s", r->name, r->key,
                   strerror(e));
}

/* Before anything else reads the fd: only a regular file (what shm_open
 * creates) may back a region. Then O_NONBLOCK goes again: it was for the
 * open only, and pread/pwrite on the object should behave as on any file. */
static tp_status check_regular(tp_shm_region *r, uint64_t *size, tp_err *err)
{
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return tp_fail(err, TP_IO, "shared memory region '%s': fstat of key '%s': %s", r->name,
                       r->key, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return fail_kind(r, kind_of_mode(st.st_mode), err);
    int fl = fcntl(r->fd, F_GETFL);
    if (fl < 0 || fcntl(r->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return tp_fail(err, TP_IO, "shared memory region '%s': fcntl of key '%s': %s", r->name,
                       r->key, strerror(errno));
    *size = (uint64_t)st.st_size;
    return TP_OK;
}

/* The object's size now (it is the client's: it may change at any time). */
static tp_status object_size(const tp_shm_region *r, uint64_t *size, tp_err *err)
{
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return tp_fail(err, TP_IO, "shared memory region '%s': fstat of key '%s': %s", r->name,
                       r->key, strerror(errno));
    *size = (uint64_t)st.st_size;
    return TP_OK;
}

static tp_status check_object(tp_shm_region *r, tp_err *err)
{
    uint64_t size = 0;
    tp_status st = check_regular(r, &size, err);
    if (st != TP_OK)
        return st;
    if (r->byte_size == 0)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': byte_size 0 (a region holds "
                       "at least one byte)", r->name);
    if (r->offset > size || r->byte_size > size - r->offset)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': offset %llu + byte_size %llu "
                       "does not fit in key '%s' of %llu bytes", r->name,
                       (unsigned long long)r->offset, (unsigned long long)r->byte_size, r->key,
                       (unsigned long long)size);
    return TP_OK;
}

static tp_shm_region *find_locked(tp_shm_registry *g, const char *name)
{
    for (tp_shm_region *r = g->head; r; r = r->next)
        if (strcmp(r->name, name) == 0)
            return r;
    return NULL;
}

static tp_status fail_taken(const char *name, tp_err *err)
{
    return tp_fail(err, TP_INVALID, "shared memory region '%s' is already registered (unregister "
                   "it first)", name);
}

/* One of the max_regions slots for name, taken before its object is opened:
 * a client registering regions without end (each holds an fd) would
 * otherwise run the server out of descriptors for everyone. A name already
 * registered is refused as it always was, whatever the count. */
static tp_status take_slot(tp_shm_registry *g, const char *name, const char *key, tp_err *err)
{
    tp_status st = TP_OK;
    pthread_mutex_lock(&g->mu);
    if (find_locked(g, name))
        st = fail_taken(name, err);
    else if (g->used >= g->max_regions)
        st = tp_fail(err, TP_INVALID, "shared memory region '%s' (key '%s'): the server's limit "
                     "of %d registered regions (max_shm_regions) is reached: unregister one "
                     "first", name, key, g->max_regions);
    else
        g->used++;
    pthread_mutex_unlock(&g->mu);
    return st;
}

static void give_slot(tp_shm_registry *g)
{
    pthread_mutex_lock(&g->mu);
    g->used--;
    pthread_mutex_unlock(&g->mu);
}

/* Links r in, in the slot taken for it; a registration of the same name
 * that raced past take_slot and finished first keeps the name. */
static tp_status insert_region(tp_shm_registry *g, tp_shm_region *r, tp_err *err)
{
    tp_status st = TP_OK;
    pthread_mutex_lock(&g->mu);
    if (find_locked(g, r->name)) {
        st = fail_taken(r->name, err);
        g->used--;
    } else {
        r->next = g->head;
        g->head = r;
    }
    pthread_mutex_unlock(&g->mu);
    return st;
}

static tp_shm_region *region_new(const char *name, const char *key, uint64_t offset,
                                 uint64_t byte_size)
{
    tp_shm_region *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    atomic_init(&r->refs, 1);
    r->fd = -1;
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->key, sizeof r->key, "%s", key);
    r->offset = offset;
    r->byte_size = byte_size;
    return r;
}

tp_status tp_shm_register(tp_shm_registry *g, const char *name, const char *key, uint64_t offset,
                          uint64_t byte_size, tp_err *err)
{
    if (!name_ok(name))
        return tp_fail(err, TP_INVALID, "shared memory region name must be 1..%d characters of "
                       "A-Z a-z 0-9 _ . -", NAME_MAX_LEN);
    if (!key_ok(key))
        return tp_fail(err, TP_INVALID, "shared memory region '%s': key '%s' is not a shm_open "
                       "name ('/' then up to %d characters, no other '/')", name, key,
                       KEY_MAX_LEN - 1);
    tp_status st = take_slot(g, name, key, err);
    if (st != TP_OK)
        return st;
    tp_shm_region *r = region_new(name, key, offset, byte_size);
    st = r ? open_object(r, err) : tp_fail(err, TP_NOMEM, "out of memory");
    if (st == TP_OK)
        st = check_object(r, err);
    if (st != TP_OK)
        give_slot(g);
    else
        st = insert_region(g, r, err); /* gives the slot back itself when refused */
    if (st != TP_OK && r)
        region_destroy(r);
    return st;
}

tp_status tp_shm_unregister(tp_shm_registry *g, const char *name, tp_err *err)
{
    tp_shm_region *gone = NULL;
    int n = 0;
    pthread_mutex_lock(&g->mu);
    for (tp_shm_region **p = &g->head; *p;) {
        tp_shm_region *r = *p;
        if (name && strcmp(r->name, name) != 0) {
            p = &r->next;
            continue;
        }
        *p = r->next;
        r->next = gone;
        gone = r;
        n++;
    }
    g->used -= n;
    pthread_mutex_unlock(&g->mu);
    if (name && !gone)
        return tp_fail(err, TP_NOT_FOUND, "no shared memory region '%s' is registered", name);
    while (gone) {
        tp_shm_region *next = gone->next;
        tp_shm_release(gone); /* the registry's reference; holders keep theirs */
        gone = next;
    }
    return TP_OK;
}

tp_shm_region *tp_shm_acquire(tp_shm_registry *g, const char *name, tp_err *err)
{
    pthread_mutex_lock(&g->mu);
    tp_shm_region *r = find_locked(g, name);
    if (r)
        atomic_fetch_add(&r->refs, 1);
    pthread_mutex_unlock(&g->mu);
    if (!r)
        tp_fail(err, TP_INVALID, "no shared memory region '%s' is registered", name);
    return r;
}

/* Bytes move with pread/pwrite on the object's fd, never through a mapping.
 * The object belongs to the client, who may ftruncate it at any moment: an
 * access to a mapped page past the new end raises SIGBUS, and no check
 * before the access can close that window. A SIGBUS handler that longjmps
 * out of the copy would have to know, per thread, which copy faulted, and
 * would leave whatever the faulting thread held (the engine lock, malloc's)
 * in an unknown state. pread instead stops at the object's end and tells:
 * a short read is the client's error, answered 400 like any other. It costs
 * one syscall per tensor and the same one copy a mapping would have cost
 * (the engine copies inputs into its staging either way). */
static tp_status check_span(const tp_shm_region *r, uint64_t offset, uint64_t size, tp_err *err)
{
    if (offset > r->byte_size || size > r->byte_size - offset)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': %llu bytes at offset %llu "
                       "exceed its byte_size %llu", r->name, (unsigned long long)size,
                       (unsigned long long)offset, (unsigned long long)r->byte_size);
    return TP_OK;
}

/* The object no longer holds [offset, offset + size) of the region. */
static tp_status fail_shrunk(const tp_shm_region *r, uint64_t offset, uint64_t size, int write,
                             tp_err *err)
{
    uint64_t now = 0;
    tp_status st = object_size(r, &now, err);
    if (st != TP_OK)
        return st;
    return tp_fail(err, TP_INVALID, "shared memory region '%s': cannot %s %llu bytes at offset "
                   "%llu: key '%s' ends before them (it holds %llu bytes now; the region needs "
                   "offset %llu + byte_size %llu): the object shrank after registration", r->name,
                   write ? "write" : "read", (unsigned long long)size,
                   (unsigned long long)offset, r->key, (unsigned long long)now,
                   (unsigned long long)r->offset, (unsigned long long)r->byte_size);
}

static tp_status fail_io(const tp_shm_region *r, uint64_t offset, uint64_t size, int write, int e,
                         tp_err *err)
{
    return tp_fail(err, TP_IO, "shared memory region '%s': %s %llu bytes at offset %llu of key "
                   "'%s': %s", r->name, write ? "pwrite of" : "pread of", (unsigned long long)size,
                   (unsigned long long)offset, r->key, strerror(e));
}

tp_status tp_shm_read(tp_shm_region *r, uint64_t offset, void *dst, uint64_t size, tp_err *err)
{
    tp_status st = check_span(r, offset, size, err);
    for (uint64_t done = 0; st == TP_OK && done < size;) {
        ssize_t n = pread(r->fd, (char *)dst + done, (size_t)(size - done),
                          (off_t)(r->offset + offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return fail_io(r, offset, size, 0, errno, err);
        if (n == 0) /* the end of the object, before the end of the span */
            return fail_shrunk(r, offset, size, 0, err);
        done += (uint64_t)n;
    }
    return st;
}

/* pwrite past the end would grow the object; the client asked for its
 * bytes, not for its object resized, so a shrunk object is refused first.
 * A truncation racing with the write between that check and the pwrite can
 * only have the object grown back up to the end of this span, which lies
 * inside what the client registered (and so once had): never a fault, never
 * beyond the registered region. */
tp_status tp_shm_write(tp_shm_region *r, uint64_t offset, const void *src, uint64_t size,
                       tp_err *err)
{
    tp_status st = check_span(r, offset, size, err);
    if (st != TP_OK)
        return st;
    if (!r->writable)
        return tp_fail(err, TP_INVALID, "shared memory region '%s' is read-only for the server "
                       "(key '%s'): it cannot receive outputs", r->name, r->key);
    uint64_t now = 0;
    if ((st = object_size(r, &now, err)) != TP_OK)
        return st;
    if (now < r->offset + offset + size)
        return fail_shrunk(r, offset, size, 1, err);
    for (uint64_t done = 0; done < size;) {
        ssize_t n = pwrite(r->fd, (const char *)src + done, (size_t)(size - done),
                           (off_t)(r->offset + offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return fail_io(r, offset, size, 1, n < 0 ? errno : EIO, err);
        done += (uint64_t)n;
    }
    return TP_OK;
}

static void write_region(tp_jbuf *b, const tp_shm_region *r, int comma)
{
    tp_jbuf_lit(b, comma ? ",{\"name\":" : "{\"name\":");
    tp_jbuf_str(b, r->name);
    tp_jbuf_lit(b, ",\"key\":");
    tp_jbuf_str(b, r->key);
    tp_jbuf_lit(b, ",\"offset\":");
    tp_jbuf_i64(b, (int64_t)r->offset);
    tp_jbuf_lit(b, ",\"byte_size\":");
    tp_jbuf_i64(b, (int64_t)r->byte_size);
    tp_jbuf_raw(b, "}", 1);
}

char *tp_shm_status_json(tp_shm_registry *g, const char *name, tp_status *st, tp_err *err)
{
    tp_jbuf b = {0};
    int n = 0;
    tp_jbuf_raw(&b, "[", 1);
    pthread_mutex_lock(&g->mu);
    for (const tp_shm_region *r = g->head; r; r = r->next)
        if (!name || strcmp(r->name, name) == 0)
            write_region(&b, r, n++ > 0);
    pthread_mutex_unlock(&g->mu);
    tp_jbuf_lit(&b, "]");
    tp_jbuf_raw(&b, "", 1);
    *st = TP_OK;
    if (name && n == 0)
        *st = tp_fail(err, TP_NOT_FOUND, "no shared memory region '%s' is registered", name);
    else if (b.oom)
        *st = tp_fail(err, TP_NOMEM, "out of memory");
    if (*st != TP_OK) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
