/* shm_registry.h — Triton's system shared memory extension: regions of POSIX
 * shared memory objects (shm_open names) that clients register by name and
 * then use for inputs and outputs instead of sending tensor bytes over HTTP.
 *
 * Registration checks everything once: the region name (1..127 characters
 * of [A-Za-z0-9_.-]), the key (a shm_open name: "/" then 1..254 characters,
 * no other "/"), that the object is a regular shared memory object this
 * process may open read-write (or read-only: then outputs may not go there),
 * and that offset + byte_size lies inside it. The key is opened without
 * following a symbolic link and without waiting (a FIFO would block a
 * read-only open until the client chose to write), and anything but a
 * regular file (FIFO, directory, socket, device, symbolic link) is refused
 * before the server reads it. At most max_regions are registered at once:
 * each holds its object open (one fd). Every use checks its span
 * against the region. Bytes are copied with pread/pwrite, never through a
 * mapping, so nothing a client does to its object (shrinking it while a
 * request reads or writes it) can fault the server: a short object is a
 * TP_INVALID naming the region, the span and the object's current size.
 *
 * Requests hold references (tp_shm_acquire/release): unregistering a region
 * a request is using removes its name at once, and the mapping goes away
 * when the last request lets go. Thread-safe. */
#ifndef TP_SHM_REGISTRY_H
#define TP_SHM_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

#include "status.h"

typedef struct tp_shm_registry tp_shm_registry;
typedef struct tp_shm_region tp_shm_region;

/* max_regions (>= 1): registrations past it are refused until one is
 * unregistered. */
tp_shm_registry *tp_shm_registry_create(int max_regions);
/* Unregisters everything; regions still held are unmapped by their last
 * release. NULL is a no-op. */
void tp_shm_registry_free(tp_shm_registry *g);

/* TP_INVALID with the reason (bad name or key, already registered, max_regions
 * reached, not a regular file, out of bounds), TP_NOT_FOUND when the key
 * names no object, TP_IO otherwise. */
tp_status tp_shm_register(tp_shm_registry *g, const char *name, const char *key, uint64_t offset,
                          uint64_t byte_size, tp_err *err);
/* name NULL: every region. TP_NOT_FOUND for an unknown name. */
tp_status tp_shm_unregister(tp_shm_registry *g, const char *name, tp_err *err);
/* Regions registered now (each holds one open fd; one unregistered while a
 * request holds it keeps its fd until then, uncounted). */
int tp_shm_count(tp_shm_registry *g);

/* [{"name","key","offset","byte_size"}, ...] for one region (name) or all
 * (NULL); malloc'ed. NULL with err set: unknown name (TP_NOT_FOUND) or no
 * memory. */
char *tp_shm_status_json(tp_shm_registry *g, const char *name, tp_status *st, tp_err *err);

/* A reference to a registered region, or NULL (err: unknown name). */
tp_shm_region *tp_shm_acquire(tp_shm_registry *g, const char *name, tp_err *err);
void tp_shm_release(tp_shm_region *r);
const char *tp_shm_name(const tp_shm_region *r);

/* Copies the region's bytes [offset, offset + size) into dst. TP_INVALID
 * when the span is outside the region or the object has shrunk below it. */
tp_status tp_shm_read(tp_shm_region *r, uint64_t offset, void *dst, uint64_t size, tp_err *err);
/* Copies size bytes from src into the region at offset. TP_INVALID when the
 * span is outside the region, the region is read-only, or the object has
 * shrunk below the span (refused: the object is never grown by a write). */
tp_status tp_shm_write(tp_shm_region *r, uint64_t offset, const void *src, uint64_t size,
                       tp_err *err);

#endif
