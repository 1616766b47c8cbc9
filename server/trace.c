/* trace.c — see trace.h. */
#include "trace.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "json_kind.h"
#include "invariant.h"
#include "json_tensor.h"
#include "log.h"

enum { K_FILE, K_LEVEL, K_RATE, K_COUNT, K_FREQ, K_MODE, N_KEYS };
static const char *const KEYS[N_KEYS] = {"trace_file",  "trace_level",   "trace_rate",
                                         "trace_count", "log_frequency", "trace_mode"};

typedef struct {
    int timestamps; /* trace_level TIMESTAMPS, else OFF */
    int64_t rate, count, log_frequency;
} settings;

/* Triton's defaults (a global setting given null goes back to it) */
static const settings DEFAULTS = {.rate = 1000, .count = -1};

struct tp_trace {
    pthread_mutex_t mu;
    char *file; /* set at startup only; "": no tracing */
    settings global, own; /* own: the model's, for the keys in own_set */
    unsigned own_set;
    _Atomic int on;       /* the model's settings trace (sample's fast path) */
    _Atomic int64_t rate; /* the model's trace_rate */
    _Atomic uint64_t seen;
    int64_t next_id;
    /* Traces taken and not yet written, oldest first: a ring of at most
     * max_pending JSON objects, one allocation each, so that dropping the
     * oldest costs no copy of the rest. It grows to max_pending only as
     * traces come (head stays 0 until it is full: only a full ring drops). */
    struct pending {
        char *p;
        size_t len;
    } *ring;
    int64_t ring_cap, head, n_pending, max_pending, file_index;
    _Atomic uint64_t dropped; /* taken, never written (tp_trace_dropped) */
    int warned_full;          /* the drops past max_pending were logged */
};

/* The model's settings: its own (o) where set, else the global ones (g). */
static settings merged(const settings *g, const settings *o, unsigned own_set)
{
    settings e = *g;
    if (own_set & 1u << K_LEVEL)
        e.timestamps = o->timestamps;
    if (own_set & 1u << K_RATE)
        e.rate = o->rate;
    if (own_set & 1u << K_COUNT)
        e.count = o->count;
    if (own_set & 1u << K_FREQ)
        e.log_frequency = o->log_frequency;
    return e;
}

/* mu held (or the trace not yet shared) */
static settings effective(const tp_trace *t) { return merged(&t->global, &t->own, t->own_set); }

/* Publishes what sample reads without the lock. mu held. */
static void publish(tp_trace *t)
{
    settings e = effective(t);
    atomic_store(&t->rate, e.rate);
    atomic_store(&t->on, e.timestamps && e.count != 0 && t->file[0]);
}

tp_status tp_trace_create(const tp_trace_init *init, tp_trace **out, tp_err *err)
{
    *out = NULL;
    if (init->timestamps && !(init->file && init->file[0]))
        return tp_fail(err, TP_INVALID, "trace_level TIMESTAMPS needs a trace_file to write to");
    tp_trace *t = calloc(1, sizeof *t);
    if (!t || !(t->file = strdup(init->file ? init->file : ""))) {
        free(t);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    pthread_mutex_init(&t->mu, NULL);
    t->max_pending = init->max_pending > 0 ? init->max_pending : TP_TRACE_MAX_PENDING_DEFAULT;
    t->global = (settings){init->timestamps, init->rate, init->count, init->log_frequency};
    t->own = t->global;
    publish(t);
    *out = t;
    return TP_OK;
}

/* The i-th oldest pending trace. mu held. */
static struct pending *pending_at(tp_trace *t, int64_t i) { return &t->ring[(t->head + i) % t->ring_cap]; }

/* Frees the pending traces; lost (not written): counted as dropped. mu held. */
static void clear_pending(tp_trace *t, int lost)
{
    for (int64_t i = 0; i < t->n_pending; i++)
        free(pending_at(t, i)->p);
    if (lost)
        atomic_fetch_add(&t->dropped, (uint64_t)t->n_pending);
    t->head = 0;
    t->n_pending = 0;
}

/* The pending traces as a JSON array into path: written to a temporary
 * of its own beside it, then renamed over it, so a reader never sees half
 * a file. mkostemp creates the temporary (O_EXCL, 0600) under a name no
 * one can know: a fixed name (path.tmp) opened with fopen would follow a
 * symlink planted there and overwrite whatever it points to with the
 * server's rights. rename replaces path itself, never what a symlink at
 * path points to. 0, or -1 with errno. mu held. */
static int write_file(tp_trace *t, const char *path, char *tmp, size_t cap)
{
    snprintf(tmp, cap, "%s.tmp.XXXXXX", path);
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0)
        return -1;
    FILE *f = fdopen(fd, "w");
    int ok = f && fputc('[', f) != EOF;
    for (int64_t i = 0; ok && i < t->n_pending; i++) {
        const struct pending *e = pending_at(t, i);
        ok = (!i || fputs(",\n", f) != EOF) && fwrite(e->p, 1, e->len, f) == e->len;
    }
    ok = ok && fputs("]\n", f) != EOF;
    if (f ? fclose(f) != 0 : close(fd) != 0)
        ok = 0;
    if (ok && rename(tmp, path) == 0)
        return 0;
    int saved = errno;
    unlink(tmp);
    errno = saved;
    return -1;
}

/* Writes the pending traces where e says (a JSON array): trace_file, or
 * with log_frequency its next numbered file. mu held. */
static void write_pending(tp_trace *t, const settings *e)
{
    if (!t->n_pending)
        return;
    size_t cap = strlen(t->file) + 48; /* ".<int64>" and ".tmp.XXXXXX" */
    char *path = malloc(cap), *tmp = malloc(cap);
    if (!path || !tmp) {
        TP_LOG_W("trace: out of memory writing %" PRId64 " traces: dropped", t->n_pending);
    } else {
        if (e->log_frequency > 0)
            snprintf(path, cap, "%s.%" PRId64, t->file, t->file_index++);
        else
            snprintf(path, cap, "%s", t->file);
        if (write_file(t, path, tmp, cap) != 0)
            TP_LOG_W("trace: cannot write %" PRId64 " traces to %s: %s", t->n_pending, path, strerror(errno));
        else
            clear_pending(t, 0);
    }
    free(path);
    free(tmp);
    clear_pending(t, 1); /* whatever is left was not written */
}

void tp_trace_free(tp_trace *t)
{
    if (!t)
        return;
    settings e = effective(t);
    write_pending(t, &e);
    free(t->ring);
    pthread_mutex_destroy(&t->mu);
    free(t->file);
    free(t);
}

/* ---- settings ------------------------------------------------------------- */

static char *settings_doc(const tp_trace *t, const settings *e)
{
    char rate[24], count[24], freq[24];
    snprintf(rate, sizeof rate, "%" PRId64, e->rate);
    snprintf(count, sizeof count, "%" PRId64, e->count);
    snprintf(freq, sizeof freq, "%" PRId64, e->log_frequency);
    return tp_json_take_text(json_pack("{s:s, s:[s], s:s, s:s, s:s, s:s}", "trace_file", t->file, "trace_level",
                                       e->timestamps ? "TIMESTAMPS" : "OFF", "trace_rate", rate, "trace_count",
                                       count, "log_frequency", freq, "trace_mode", "triton"));
}

char *tp_trace_settings_json(tp_trace *t, int model)
{
    pthread_mutex_lock(&t->mu);
    settings e = model ? effective(t) : t->global;
    pthread_mutex_unlock(&t->mu);
    return settings_doc(t, &e);
}

/* A number setting: a string of an integer (Triton's spelling) or an
 * integer, at least min. */
static tp_status read_number(const char *key, const json_t *v, int64_t min, int64_t *out, tp_err *err)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    char *end = NULL;
    errno = 0;
    long long n = s ? strtoll(s, &end, 10) : json_is_integer(v) ? (long long)json_integer_value(v) : 0;
    int ok = s ? *s && end && !*end && errno == 0 : json_is_integer(v);
    if (!ok || n < min)
        return tp_fail(err, TP_INVALID, "%s must be an integer of at least %" PRId64 " (as a string), got %s%.40s%s",
                       key, min, s ? "'" : "", s ? s : tp_json_kind(v), s ? "'" : "");
    *out = n;
    return TP_OK;
}

/* trace_level: ["OFF"] or ["TIMESTAMPS"] (a lone string too). */
static tp_status read_level(const json_t *v, int *timestamps, tp_err *err)
{
    const json_t *one = json_is_array(v) && json_array_size(v) == 1 ? json_array_get(v, 0) : v;
    const char *s = json_is_string(one) ? json_string_value(one) : NULL;
    if (s && strcmp(s, "OFF") == 0)
        *timestamps = 0;
    else if (s && strcmp(s, "TIMESTAMPS") == 0)
        *timestamps = 1;
    else if (s && strcmp(s, "TENSORS") == 0)
        return tp_fail(err, TP_INVALID, "trace_level TENSORS is not offered: only TIMESTAMPS (the tensors are "
                       "what /infer answers)");
    else
        return tp_fail(err, TP_INVALID, "trace_level must be [\"OFF\"] or [\"TIMESTAMPS\"]");
    return TP_OK;
}

/* Sets key k of *s from v (never null here). trace_file may only be
 * named as it is (a client echoing the settings back): were it taken, any
 * client could have the server write any file it can (Triton's
 * CVE-2024-0087 was the same hole in its log_file). */
static tp_status read_setting(const tp_trace *t, int k, const json_t *v, settings *s, tp_err *err)
{
    switch (k) {
    case K_FILE:
        if (!json_is_string(v) || strcmp(json_string_value(v), t->file) != 0)
            return tp_fail(err, TP_INVALID, "trace_file cannot be changed here, so that no client chooses where "
                           "the server writes: it is set at startup (--trace-file)");
        return TP_OK;
    case K_LEVEL: return read_level(v, &s->timestamps, err);
    case K_RATE: return read_number(KEYS[k], v, 1, &s->rate, err);
    case K_COUNT: return read_number(KEYS[k], v, -1, &s->count, err);
    case K_FREQ: return read_number(KEYS[k], v, 0, &s->log_frequency, err);
    default:
        if (!json_is_string(v) || strcmp(json_string_value(v), "triton") != 0)
            return tp_fail(err, TP_INVALID, "trace_mode must be \"triton\" (the only format written)");
        return TP_OK;
    }
}

/* Key k of *s back to its default (a global setting given null). */
static void reset_setting(int k, settings *s)
{
    settings d = DEFAULTS;
    switch (k) {
    case K_LEVEL: s->timestamps = d.timestamps; break;
    case K_RATE: s->rate = d.rate; break;
    case K_COUNT: s->count = d.count; break;
    case K_FREQ: s->log_frequency = d.log_frequency; break;
    default: break;
    }
}

/* The body applied to a copy of the global (own_set NULL) or the model's
 * settings. */
static tp_status read_update(const tp_trace *t, const json_t *doc, settings *s, unsigned *own_set, tp_err *err)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)doc, key, v) {
        int k = 0;
        while (k < N_KEYS && strcmp(key, KEYS[k]) != 0)
            k++;
        if (k == N_KEYS)
            return tp_fail(err, TP_INVALID, "unknown trace setting '%.60s' (known: trace_file, trace_level, "
                           "trace_rate, trace_count, log_frequency, trace_mode)", key);
        if (json_is_null(v) && own_set) {
            *own_set &= ~(1u << k); /* back to the global setting */
        } else if (json_is_null(v)) {
            reset_setting(k, s);
        } else {
            tp_status st = read_setting(t, k, v, s, err);
            if (st != TP_OK)
                return st;
            if (own_set)
                *own_set |= 1u << k;
        }
    }
    return TP_OK;
}

tp_status tp_trace_update(tp_trace *t, int model, const char *body, size_t len, char **out, tp_err *err)
{
    *out = NULL;
    json_t *doc = NULL;
    tp_status st = len ? tp_json_load_object(body, len, "trace settings", &doc, err)
                       : tp_json_load_object("{}", 2, "trace settings", &doc, err);
    if (st != TP_OK)
        return st;
    pthread_mutex_lock(&t->mu);
    settings before = effective(t), global = t->global, own = t->own;
    /* a model update naming nothing gives all of the model's settings back
     * to the global ones, as Triton does */
    unsigned own_set = model && json_object_size(doc) == 0 ? 0 : t->own_set;
    st = read_update(t, doc, model ? &own : &global, model ? &own_set : NULL, err);
    json_decref(doc);
    settings after = merged(&global, &own, own_set);
    if (st == TP_OK && after.timestamps && !t->file[0])
        st = tp_fail(err, TP_INVALID, "trace_level TIMESTAMPS needs a trace_file, which is set at startup "
                     "(--trace-file)");
    if (st == TP_OK) {
        if (before.log_frequency != after.log_frequency)
            write_pending(t, &before); /* the traces taken so far go where they were headed */
        t->global = global;
        t->own = own;
        t->own_set = own_set;
        publish(t);
    }
    pthread_mutex_unlock(&t->mu);
    if (st == TP_OK && !(*out = settings_doc(t, model ? &after : &global)))
        st = tp_fail(err, TP_NOMEM, "out of memory");
    return st;
}

/* ---- traces --------------------------------------------------------------- */

int64_t tp_trace_sample(tp_trace *t)
{
    if (!atomic_load_explicit(&t->on, memory_order_relaxed))
        return 0;
    uint64_t n = atomic_fetch_add(&t->seen, 1) + 1;
    int64_t rate = atomic_load(&t->rate);
    if (rate > 1 && n % (uint64_t)rate)
        return 0;
    int64_t id = 0;
    pthread_mutex_lock(&t->mu);
    settings e = effective(t);
    if (e.timestamps && e.count != 0 && t->file[0]) {
        id = ++t->next_id;
        if (e.count > 0) { /* counts down where the count is set */
            settings *holder = t->own_set & 1u << K_COUNT ? &t->own : &t->global;
            holder->count--;
            publish(t);
        }
    }
    pthread_mutex_unlock(&t->mu);
    return id;
}

static void stamp(tp_jbuf *b, int *first, const char *name, int64_t ns)
{
    if (!ns)
        return;
    tp_jbuf_lit(b, *first ? "{\"name\":\"" : ",{\"name\":\"");
    tp_jbuf_lit(b, name);
    tp_jbuf_lit(b, "\",\"ns\":");
    tp_jbuf_i64(b, ns);
    tp_jbuf_raw(b, "}", 1);
    *first = 0;
}

size_t tp_trace_request_id_len(const char *id)
{
    size_t n = strnlen(id, TP_TRACE_REQUEST_ID_MAX + 1);
    if (n <= TP_TRACE_REQUEST_ID_MAX)
        return n;
    n = TP_TRACE_REQUEST_ID_MAX;
    /* id[n] continuing a character (10xxxxxx): that character starts
     * before n and would be cut; at most 3 bytes back in valid UTF-8 */
    for (int back = 0; back < 3 && n > 0 && ((unsigned char)id[n] & 0xc0) == 0x80; back++)
        n--;
    return n;
}

uint64_t tp_trace_dropped(tp_trace *t) { return atomic_load(&t->dropped); }

/* Room for one more pending trace, as e says: a full ring is written out
 * (log_frequency N: early, to the next file) or loses its oldest trace
 * (log_frequency 0: written at the end, nothing to write it to before).
 * 0: no memory for the ring. mu held. */
static int make_room(tp_trace *t, const settings *e)
{
    TP_ASSERT_HELD(&t->mu);
    if (t->n_pending == t->max_pending && e->log_frequency > 0)
        write_pending(t, e);
    if (t->n_pending == t->max_pending) {
        free(pending_at(t, 0)->p);
        t->head = (t->head + 1) % t->ring_cap;
        t->n_pending--;
        atomic_fetch_add(&t->dropped, 1);
        if (!t->warned_full) {
            t->warned_full = 1;
            TP_LOG_W("trace: %" PRId64 " traces held (trace_max_pending) with trace_log_frequency 0, which "
                     "writes them only at exit: the oldest are dropped from now on (tpserve_trace_dropped_total "
                     "counts them; a trace_log_frequency writes them as they come)", t->max_pending);
        }
    }
    if (t->n_pending < t->ring_cap)
        return 1;
    /* not full, so head is 0: the ring grows in place */
    int64_t cap = t->ring_cap ? t->ring_cap * 2 : 16;
    if (cap > t->max_pending)
        cap = t->max_pending;
    struct pending *ring = realloc(t->ring, (size_t)cap * sizeof *ring);
    if (!ring)
        return 0;
    t->ring = ring;
    t->ring_cap = cap;
    return 1;
}

void tp_trace_record(tp_trace *t, int64_t id, const char *model, const char *version, const char *request_id,
                     const tp_trace_stamps *s)
{
    /* the trace's text is made before taking the lock: other threads
     * record and sample meanwhile */
    tp_jbuf b = {0};
    tp_jbuf_lit(&b, "{\"id\":");
    tp_jbuf_i64(&b, id);
    tp_jbuf_lit(&b, ",\"model_name\":");
    tp_jbuf_str(&b, model);
    tp_jbuf_lit(&b, ",\"model_version\":");
    tp_jbuf_str(&b, version);
    if (request_id) {
        tp_jbuf_lit(&b, ",\"request_id\":");
        tp_jbuf_strn(&b, request_id, tp_trace_request_id_len(request_id));
    }
    tp_jbuf_lit(&b, ",\"timestamps\":[");
    int first = 1;
    stamp(&b, &first, "HTTP_RECV_START", s->recv_start);
    stamp(&b, &first, "HTTP_RECV_END", s->recv_end);
    stamp(&b, &first, "REQUEST_START", s->queued);
    stamp(&b, &first, "QUEUE_START", s->queued);
    stamp(&b, &first, "COMPUTE_START", s->compute_start);
    stamp(&b, &first, "COMPUTE_INPUT_END", s->compute_start);
    stamp(&b, &first, "COMPUTE_OUTPUT_START", s->compute_end);
    stamp(&b, &first, "COMPUTE_END", s->compute_end);
    stamp(&b, &first, "REQUEST_END", s->encoded);
    stamp(&b, &first, "HTTP_SEND_START", s->encoded);
    stamp(&b, &first, "HTTP_SEND_END", s->sent);
    tp_jbuf_lit(&b, "]}");
    pthread_mutex_lock(&t->mu);
    settings e = effective(t);
    if (b.oom || !make_room(t, &e)) {
        TP_LOG_W("trace: out of memory holding trace %" PRId64 ": dropped", id);
        atomic_fetch_add(&t->dropped, 1);
        free(b.p);
    } else {
        t->ring[(t->head + t->n_pending++) % t->ring_cap] = (struct pending){b.p, b.len};
        if (e.log_frequency > 0 && t->n_pending >= e.log_frequency)
            write_pending(t, &e);
    }
    pthread_mutex_unlock(&t->mu);
}
