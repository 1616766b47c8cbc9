#include "shm_registry.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
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
    int fd, writable;
    void *map;       /* page-aligned mapping that covers the region */
    size_t map_len;
    char *base;      /* the region's first byte inside map */
};

struct tp_shm_registry {
    pthread_mutex_t mu;
    tp_shm_region *head;
};

tp_shm_registry *tp_shm_registry_create(void)
{
    tp_shm_registry *g = calloc(1, sizeof *g);
    if (g)
        pthread_mutex_init(&g->mu, NULL);
    return g;
}

static void region_destroy(tp_shm_region *r)
{
    if (r->map)
        munmap(r->map, r->map_len);
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

/* Read-write if the object allows it, else read-only. */
static tp_status open_object(tp_shm_region *r, tp_err *err)
{
    r->writable = 1;
    r->fd = shm_open(r->key, O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
    if (r->fd < 0 && (errno == EACCES || errno == EROFS)) {
        r->writable = 0;
        r->fd = shm_open(r->key, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0);
    }
    if (r->fd >= 0)
        return TP_OK;
    int e = errno;
    return tp_fail(err, e == ENOENT ? TP_NOT_FOUND : e == EACCES ? TP_INVALID : TP_IO,
                   "shared memory region '%s': cannot open key '%s': %s", r->name, r->key,
                   strerror(e));
}

static tp_status map_region(tp_shm_region *r, tp_err *err)
{
    struct stat st;
    if (fstat(r->fd, &st) != 0)
        return tp_fail(err, TP_IO, "shared memory region '%s': fstat: %s", r->name, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return tp_fail(err, TP_INVALID, "shared memory region '%s': key '%s' is not a shared "
                       "memory object", r->name, r->key);
    uint64_t size = (uint64_t)st.st_size;
    if (r->byte_size == 0 || r->offset > size || r->byte_size > size - r->offset)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': offset %llu + byte_size %llu "
                       "does not fit in key '%s' of %llu bytes", r->name,
                       (unsigned long long)r->offset, (unsigned long long)r->byte_size, r->key,
                       (unsigned long long)size);
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE), start = r->offset - r->offset % page;
    r->map_len = (size_t)(r->offset - start + r->byte_size);
    r->map = mmap(NULL, r->map_len, PROT_READ | (r->writable ? PROT_WRITE : 0), MAP_SHARED, r->fd,
                  (off_t)start);
    if (r->map == MAP_FAILED) {
        r->map = NULL;
        return tp_fail(err, TP_IO, "shared memory region '%s': mmap of %zu bytes: %s", r->name,
                       r->map_len, strerror(errno));
    }
    r->base = (char *)r->map + (r->offset - start);
    return TP_OK;
}

static tp_shm_region *find_locked(tp_shm_registry *g, const char *name)
{
    for (tp_shm_region *r = g->head; r; r = r->next)
        if (strcmp(r->name, name) == 0)
            return r;
    return NULL;
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
    tp_shm_region *r = calloc(1, sizeof *r);
    if (!r)
        return tp_fail(err, TP_NOMEM, "out of memory");
    atomic_init(&r->refs, 1);
    r->fd = -1;
    snprintf(r->name, sizeof r->name, "%s", name);
    snprintf(r->key, sizeof r->key, "%s", key);
    r->offset = offset;
    r->byte_size = byte_size;
    tp_status st = open_object(r, err);
    if (st == TP_OK)
        st = map_region(r, err);
    if (st == TP_OK) {
        pthread_mutex_lock(&g->mu);
        if (find_locked(g, name)) {
            st = tp_fail(err, TP_INVALID, "shared memory region '%s' is already registered "
                         "(unregister it first)", name);
        } else {
            r->next = g->head;
            g->head = r;
        }
        pthread_mutex_unlock(&g->mu);
    }
    if (st != TP_OK)
        region_destroy(r);
    return st;
}

tp_status tp_shm_unregister(tp_shm_registry *g, const char *name, tp_err *err)
{
    tp_shm_region *gone = NULL;
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
    }
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

tp_status tp_shm_span(tp_shm_region *r, uint64_t offset, uint64_t size, int write, void **ptr,
                      tp_err *err)
{
    if (offset > r->byte_size || size > r->byte_size - offset)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': %llu bytes at offset %llu "
                       "exceed its byte_size %llu", r->name, (unsigned long long)size,
                       (unsigned long long)offset, (unsigned long long)r->byte_size);
    if (write && !r->writable)
        return tp_fail(err, TP_INVALID, "shared memory region '%s' is read-only for the server "
                       "(key '%s'): it cannot receive outputs", r->name, r->key);
    struct stat st;
    if (fstat(r->fd, &st) != 0 || (uint64_t)st.st_size < r->offset + r->byte_size)
        return tp_fail(err, TP_INVALID, "shared memory region '%s': key '%s' shrank below the "
                       "registered offset + byte_size", r->name, r->key);
    *ptr = r->base + offset;
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
