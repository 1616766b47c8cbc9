#include "config.h"
#include "batcher.h"
#include "json_kind.h"
#include "spin_wait.h"

#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

typedef enum { KEY_STR, KEY_INT, KEY_I64 } key_kind;

/* One row per key: the file, the flags, validation and --help all read this
 * table, so adding a key is one line here plus a struct field. */
typedef struct {
    const char *name;
    key_kind kind;
    size_t off;     /* offsetof the field in tp_config */
    size_t size;    /* buffer size for KEY_STR */
    int64_t min, max;
    const char *choices; /* "a|b|c" for enumerated strings, else NULL */
    const char *help;
} key_desc;

#define STR_KEY(f, ch, h) {#f, KEY_STR, offsetof(tp_config, f), sizeof(((tp_config *)0)->f), 0, 0, ch, h}
#define INT_KEY(f, lo, hi, h) {#f, KEY_INT, offsetof(tp_config, f), 0, lo, hi, NULL, h}
#define I64_KEY(f, lo, hi, h) {#f, KEY_I64, offsetof(tp_config, f), 0, lo, hi, NULL, h}
#define BACKEND_KEY(f, lo, hi, h) \
    {#f, KEY_INT, offsetof(tp_config, backend_settings) + offsetof(tp_backend_settings, f), 0, lo, hi, NULL, h}

static const key_desc keys[] = {
    STR_KEY(graph, NULL, "graph JSON file to serve (relative to the working directory)"),
    STR_KEY(host, NULL, "address to bind (127.0.0.1: only the pod; 0.0.0.0: all interfaces)"),
    INT_KEY(port, 0, 65535, "TCP port (0: any free port, logged at startup)"),
    STR_KEY(backend, "cpu|cuda|auto", "engine backend"),
    INT_KEY(threads, 0, 256, "HTTP threads (they decode, encode, and run short idle steps themselves); 0: one per "
                             "core this process may use (affinity, cgroup CPU quota), 2 to 16"),
    INT_KEY(pin_threads, 0, 1,
            "1 (two CPUs or more, a thread for each): HTTP thread i runs only on the i-th CPU this process may use, and each new connection "
            "goes to the thread on the CPU its packets arrive on (SO_INCOMING_CPU), so a client on this "
            "machine and the thread serving it wake each other on one CPU; a thread its CPU starves "
            "while another idles is unpinned for 1-64 s. 0: the scheduler places the threads"),
    I64_KEY(max_body_bytes, 1, INT64_C(1) << 40, "largest request body; bigger gets 413"),
    INT_KEY(request_timeout_ms, 0, 86400000,
            "idle-connection timeout, and longest queue wait before 504 (0: none)"),
    INT_KEY(drain_timeout_ms, 0, 86400000, "SIGTERM/SIGINT: longest wait for in-flight requests"),
    INT_KEY(max_queue, 1, 1000000,
            "inference requests queued for the engine before 503"),
    INT_KEY(max_batch_size, 0, 1 << 20,
            "dynamic batching: rows per engine run (0: the engine's largest bucket)"),
    INT_KEY(max_queue_delay_us, 0, 10000000,
            "dynamic batching: longest the oldest request waits for a fuller batch"),
    INT_KEY(inline_run_max_us, 0, 10000000,
            "an idle engine runs a request on the HTTP thread that read it while its recent "
            "steps took at most this long (0: always hand off to the batcher thread)"),
    INT_KEY(serial_step_max_us, 0, 10000000,
            "ranks=threads, cpu backend: a step's ranks run in turn on one thread (no thread wake-ups) "
            "when that has been faster than their own threads (measured); a step that would take "
            "longer than this serially never does (0: every rank always on its own thread)"),
    INT_KEY(instances, 1, TP_BATCHER_MAX_INSTANCES,
            "copies of the model, each running one batch at a time, so that many batches run at once "
            "(Triton's instance_group count; weights and arenas are loaded once per copy); above 1 "
            "needs the cpu backend with ranks=threads"),
    STR_KEY(buckets, NULL, "batch buckets captured at load, ascending (\"1,2,4,8,16\" when empty; up to 64 for a generation graph)"),
    STR_KEY(log_level, "error|warn|info|debug", "stderr verbosity"),
    STR_KEY(ranks, "threads|processes", "ranks as threads of this process, or one process per rank (GPUs)"),
    STR_KEY(rendezvous, NULL, "ranks=processes: unix socket path where externally started ranks join "
                              "(`tpserve worker --rendezvous`); empty: start them here"),
    STR_KEY(rendezvous_secret_file, NULL, "ranks=processes with rendezvous: a file (mode 0600, owner only) holding "
                                          "the group secret a joining rank must present; empty: the leader writes a "
                                          "new one to RENDEZVOUS.secret"),
    INT_KEY(rendezvous_uid, -1, INT32_MAX, "ranks=processes: a uid, besides the leader's own, a joining rank may "
                                           "run as (SO_PEERCRED); -1: the leader's only"),
    INT_KEY(staging_mb, 0, 1 << 20, "ranks=processes: shared host staging for one batch's inputs and outputs, in "
                                    "MiB; 0: what the largest bucket needs (a smaller value is refused at load)"),
    INT_KEY(generate_slots, 0, 1 << 16, "generation graphs: sequences generated at once (each holds a KV cache "
                                        "slot of max_seq_len positions on every rank); 0: 16"),
    STR_KEY(generate_prefill, "mixed|separate", "generation graphs: mixed: prompt rows fill what the running "
                                                "sequences' decode rows leave of a step (chunked prefill); "
                                                "separate: prompts get steps of their own, alternating with "
                                                "decode steps"),
    INT_KEY(rank_heap_mb, 16, 1 << 24, "ranks=processes, cpu backend: shared memory per rank (sparse)"),
    INT_KEY(step_timeout_ms, 0, 86400000, "ranks=processes: a step (loading weights included) a rank has not "
                                          "finished by then loses the group like a dead rank (0: never)"),
    /* availability under abuse (issue 16): server/http_guard.c */
    INT_KEY(connection_memory_bytes, 4096, 1 << 24,
            "memory per connection for a request's headers and read buffer (libmicrohttpd's pool, zeroed "
            "after every request: smaller is faster); headers that do not fit get 431"),
    INT_KEY(max_connections, 16, 1 << 20, "open HTTP connections in total; beyond it new ones wait in the "
                                          "kernel's backlog (RLIMIT_NOFILE is raised to fit)"),
    INT_KEY(max_memory_mb, 0, 1 << 24, "memory the server may hold for requests at once (bodies as received "
                                       "and inflated, decoded tensors, queued rows, answers not yet sent): a "
                                       "request that would pass it gets 503 and Retry-After, one that alone "
                                       "never fits 413; 0: the cgroup's memory limit less the model, at least 64"),
    INT_KEY(max_json_values, 16, 1 << 24, "JSON values a request may hold outside its tensors' data arrays "
                                          "(parameters, names, shapes); more gets 400"),
    INT_KEY(stuck_step_ms, 0, 86400000, "an engine step running this long turns readiness 503 until it ends "
                                        "(logged with the rank); 0: never"),
    INT_KEY(max_connections_per_ip, 0, 1 << 20, "open HTTP connections per client address (0: no limit; in a "
                                                "sidecar every client is the pod's 127.0.0.1)"),
    INT_KEY(request_deadline_ms, 0, 86400000, "longest a client may take to send one whole request (headers "
                                              "and body), or to idle between requests; trickling bytes "
                                              "does not extend it (0: none)"),
    INT_KEY(health_port, -1, 65535, "a second listener that answers only /v2/health/* and /metrics, "
                                    "for probes a flood of the main port cannot starve (0: any free "
                                    "port, logged; -1: none)"),
    /* Triton protocol extensions */
    INT_KEY(allow_client_shm, 0, 1, "1: clients may register system shared memory regions (POSIX "
                                    "shm objects this process can open) for inputs and outputs"),
    INT_KEY(max_shm_regions, 1, 1 << 20, "system shared memory regions registered at once (each holds an "
                                         "open file); more get 400"),
    STR_KEY(labels, NULL, "class labels for the classification extension (Triton's label_filename): "
                          "OUTPUT=FILE[,OUTPUT=FILE...]; line k of FILE names class k of OUTPUT"),
    STR_KEY(trace_file, NULL, "Triton's trace extension: the file traces go to (set here only: the API cannot "
                              "choose where the server writes); empty: no tracing"),
    STR_KEY(trace_level, "OFF|TIMESTAMPS", "trace extension: what to trace at startup (POST /v2/trace/setting "
                                          "changes it)"),
    INT_KEY(trace_rate, 1, 1 << 30, "trace extension: trace every N-th inference"),
    I64_KEY(trace_count, -1, INT64_MAX, "trace extension: traces to take, then stop (-1: no limit)"),
    INT_KEY(trace_log_frequency, 0, 1 << 30, "trace extension: 0: traces written to trace_file at exit; N: "
                                              "every N traces to trace_file.0, .1, ..."),
    INT_KEY(trace_max_pending, 1, 1 << 20, "trace extension: traces held in memory; past it the oldest are "
                                           "written (or dropped, counted, with no trace_log_frequency)"),
    BACKEND_KEY(verify_replay, 0, 1, "cpu backend: before every replay, check each recorded pointer still lies in a "
                                     "live allocation (debugging; 1: on)"),
    BACKEND_KEY(cuda_gemm_workspace_mb, 0, 4096, "cuda backend: cuBLASLt workspace per rank"),
    BACKEND_KEY(cuda_scratch_mb, 0, 65536, "cuda backend: kernel scratch per rank"),
    BACKEND_KEY(cuda_barrier_timeout_ms, 1, 86400000,
                "cuda backend: a peer missing a device barrier this long fails the run"),
    BACKEND_KEY(cuda_check_collectives, 0, 1, "cuda backend: compare every eager collective's signature across "
                                              "ranks before running it (debugging; 1: on)"),
};
#define N_KEYS ((int)(sizeof keys / sizeof keys[0]))

void tp_config_defaults(tp_config *c)
{
    memset(c, 0, sizeof *c);
    snprintf(c->host, sizeof c->host, "127.0.0.1");
    c->port = 8000;
    snprintf(c->backend, sizeof c->backend, "cpu");
    c->threads = 0;
    c->pin_threads = 1; /* measured: server/README.md at 27cb4dd, "HTTP threads pinned, connections by CPU" */
    c->max_body_bytes = INT64_C(64) << 20;
    c->request_timeout_ms = 30000;
    c->drain_timeout_ms = 10000;
    c->max_queue = 1024;
    c->max_batch_size = 0;
    c->max_queue_delay_us = 0; /* Triton's default: batch what is queued, never wait */
    /* a step this short holds up the thread's other connections less than
     * the two thread hand-offs it saves cost them */
    c->inline_run_max_us = 2000;
    /* serial steps run when measured faster (engine/serial_policy.h); the
     * limit keeps long models from ever paying a serial probe */
    c->serial_step_max_us = 2000;
    c->instances = 1;
    snprintf(c->log_level, sizeof c->log_level, "info");
    snprintf(c->ranks, sizeof c->ranks, "threads");
    c->staging_mb = 0; /* sized for the graph's largest bucket (engine.c) */
    c->rank_heap_mb = 4096;
    c->generate_slots = 0; /* the engine's default */
    snprintf(c->generate_prefill, sizeof c->generate_prefill, "mixed");
    c->step_timeout_ms = 600000;
    /* libmicrohttpd zeroes the whole pool after each request: its default
     * 32 KiB cost ~2 us a request at 32 connections (server/README.md at 27cb4dd) */
    c->connection_memory_bytes = 8192;
    c->max_connections = 4096;
    c->max_connections_per_ip = 0;
    c->request_deadline_ms = 30000;
    snprintf(c->trace_level, sizeof c->trace_level, "OFF");
    c->trace_rate = 1000; /* Triton's defaults */
    c->trace_count = -1;
    c->health_port = -1;
    c->max_memory_mb = 0;
    /* a KServe request has tens of values outside its data; 16384 bounds a
     * parse's jansson nodes at 4 MiB (json_cap.h) */
    c->max_json_values = 16384;
    /* far above a bucket's warm-up (seconds at most on the cpu backend),
     * far below step_timeout_ms: a probe sees a stuck rank within a minute */
    c->stuck_step_ms = 60000;
    c->max_shm_regions = 256;
    c->trace_max_pending = 1024;
    c->rendezvous_uid = -1;
    tp_backend_settings_default(&c->backend_settings);
}

/* Accepts "max-body-bytes" as well as "max_body_bytes". */
static const key_desc *find_key(const char *name)
{
    char norm[64];
    size_t n = strlen(name);
    if (n >= sizeof norm)
        return NULL;
    for (size_t i = 0; i <= n; i++)
        norm[i] = name[i] == '-' ? '_' : name[i];
    for (int i = 0; i < N_KEYS; i++)
        if (strcmp(keys[i].name, norm) == 0)
            return &keys[i];
    return NULL;
}

static int choice_ok(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        const char *bar = strchr(p, '|');
        size_t len = bar ? (size_t)(bar - p) : strlen(p);
        if (len == n && strncmp(p, v, n) == 0)
            return 1;
        p += len + (bar ? 1 : 0);
    }
    return 0;
}

/* where: "file 'x.json'" or "--flag", so errors say which layer was wrong. */
static tp_status set_str(tp_config *c, const key_desc *k, const char *v, const char *where,
                         tp_err *err)
{
    if (strlen(v) >= k->size)
        return tp_fail(err, TP_INVALID, "%s: '%s' is too long (at most %zu bytes)", where, k->name,
                       k->size - 1);
    if (k->choices && !choice_ok(k->choices, v))
        return tp_fail(err, TP_INVALID, "%s: '%s' must be one of %s, got '%s'", where, k->name,
                       k->choices, v);
    memcpy((char *)c + k->off, v, strlen(v) + 1);
    return TP_OK;
}

static tp_status set_int(tp_config *c, const key_desc *k, int64_t v, const char *where, tp_err *err)
{
    if (v < k->min || v > k->max)
        return tp_fail(err, TP_INVALID, "%s: '%s' must be in [%" PRId64 ", %" PRId64 "], got %" PRId64,
                       where, k->name, k->min, k->max, v);
    if (k->kind == KEY_INT)
        *(int *)((char *)c + k->off) = (int)v;
    else
        *(int64_t *)((char *)c + k->off) = v;
    return TP_OK;
}

static tp_status set_json(tp_config *c, const key_desc *k, const json_t *v, const char *where,
                          tp_err *err)
{
    if (k->kind == KEY_STR) {
        if (!json_is_string(v))
            return tp_fail(err, TP_INVALID, "%s: '%s' must be a string, got %s", where, k->name,
                           tp_json_kind(v));
        return set_str(c, k, json_string_value(v), where, err);
    }
    if (!json_is_integer(v))
        return tp_fail(err, TP_INVALID, "%s: '%s' must be an integer, got %s", where, k->name,
                       tp_json_kind(v));
    return set_int(c, k, (int64_t)json_integer_value(v), where, err);
}

static const char *key_list(char *buf, size_t len)
{
    size_t off = 0;
    buf[0] = '\0';
    for (int i = 0; i < N_KEYS && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%s", i ? ", " : "", keys[i].name);
    return buf;
}

tp_status tp_config_load_file(tp_config *c, const char *path, tp_err *err)
{
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    char where[600];
    snprintf(where, sizeof where, "config file '%s'", path);
    if (!root) {
        if (jerr.line <= 0) /* jansson reports unreadable files without a position */
            return tp_fail(err, TP_IO, "%s: %s", where, jerr.text);
        return tp_fail(err, TP_PARSE, "%s: line %d column %d: %s", where, jerr.line, jerr.column,
                       jerr.text);
    }
    tp_status st = TP_OK;
    if (!json_is_object(root)) {
        st = tp_fail(err, TP_INVALID, "%s: top level must be a JSON object, got %s", where,
                     tp_json_kind(root));
        json_decref(root);
        return st;
    }
    const char *name;
    json_t *v;
    json_object_foreach(root, name, v) {
        const key_desc *k = strchr(name, '-') ? NULL : find_key(name);
        if (!k) {
            char known[512];
            st = tp_fail(err, TP_INVALID, "%s: unknown key '%s' (known keys: %s)", where, name,
                         key_list(known, sizeof known));
            break;
        }
        if ((st = set_json(c, k, v, where, err)) != TP_OK)
            break;
    }
    json_decref(root);
    return st;
}

static tp_status parse_int(const char *text, const char *where, int64_t *out, tp_err *err)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (*text == '\0' || *end != '\0' || errno == ERANGE)
        return tp_fail(err, TP_INVALID, "%s: '%s' is not an integer", where, text);
    *out = (int64_t)v;
    return TP_OK;
}

tp_status tp_config_set(tp_config *c, const char *key, const char *value, tp_err *err)
{
    const key_desc *k = find_key(key);
    char where[96];
    snprintf(where, sizeof where, "--%s", key);
    for (char *p = where; *p; p++)
        if (*p == '_')
            *p = '-';
    if (!k)
        return tp_fail(err, TP_INVALID, "unknown option '%s'", where);
    if (k->kind == KEY_STR)
        return set_str(c, k, value, where, err);
    int64_t v = 0;
    tp_status st = parse_int(value, where, &v, err);
    return st != TP_OK ? st : set_int(c, k, v, where, err);
}

/* More HTTP threads than cores only adds context switches: on 2 cores,
 * binary requests at 8 connections ran 69k/s with 2 threads against
 * 52-62k with 4 (and bare libmicrohttpd 117-121k against 92-106k). Two at
 * least, so one thread reads while another runs a step; 16 at most, as
 * every request meets the one engine anyway. */
int tp_config_http_threads(const tp_config *c)
{
    if (c->threads > 0)
        return c->threads;
    int cores = tp_spin_cores();
    return cores < 2 ? 2 : cores > 16 ? 16 : cores;
}

tp_status tp_config_validate(const tp_config *c, tp_err *err)
{
    if (c->graph[0] == '\0')
        return tp_fail(err, TP_INVALID, "no graph given: pass --graph FILE or set \"graph\" in "
                       "the --config file");
    if (c->host[0] == '\0')
        return tp_fail(err, TP_INVALID, "'host' is empty");
    if (c->rendezvous[0] && strcmp(c->ranks, "processes") != 0)
        return tp_fail(err, TP_INVALID, "'rendezvous' needs 'ranks' processes (got '%s')", c->ranks);
    /* Several instances of a process group would each need their own
     * workers (GPUs); several of a GPU graph their own communicators on the
     * same devices: neither is built, so neither is claimed. */
    if (c->instances > 1 && (strcmp(c->ranks, "threads") != 0 || strcmp(c->backend, "cpu") != 0))
        return tp_fail(err, TP_INVALID, "'instances' %d needs backend cpu and ranks threads (got backend '%s', "
                       "ranks '%s')", c->instances, c->backend, c->ranks);
    /* A step stuck that long should turn readiness 503 (the pod leaves the
     * service) before step_timeout_ms gives the rank group up for lost */
    if (c->stuck_step_ms > 0 && c->step_timeout_ms > 0 && c->stuck_step_ms >= c->step_timeout_ms)
        return tp_fail(err, TP_INVALID, "'stuck_step_ms' %d must be below 'step_timeout_ms' %d (a stuck step turns "
                       "readiness 503 before the step timeout loses the rank group), or 0", c->stuck_step_ms,
                       c->step_timeout_ms);
    tp_config copy = *c;
    tp_status st = TP_OK;
    /* Re-applying each value through the setters checks ranges and choices
     * with the same messages as the file and the flags. */
    for (int i = 0; i < N_KEYS && st == TP_OK; i++) {
        const key_desc *k = &keys[i];
        const char *p = (const char *)c + k->off;
        if (k->kind == KEY_STR)
            st = set_str(&copy, k, p, "config", err);
        else
            st = set_int(&copy, k, k->kind == KEY_INT ? *(const int *)p : *(const int64_t *)p,
                         "config", err);
    }
    return st;
}

void tp_config_usage(FILE *f)
{
    tp_config d;
    tp_config_defaults(&d);
    for (int i = 0; i < N_KEYS; i++) {
        const key_desc *k = &keys[i];
        const char *p = (const char *)&d + k->off;
        char flag[64], def[64];
        snprintf(flag, sizeof flag, "%s", k->name);
        for (char *q = flag; *q; q++)
            if (*q == '_')
                *q = '-';
        if (k->kind == KEY_STR)
            snprintf(def, sizeof def, "%s", *p ? p : "(none)");
        else
            snprintf(def, sizeof def, "%" PRId64,
                     k->kind == KEY_INT ? (int64_t) * (const int *)p : *(const int64_t *)p);
        fprintf(f, "  --%-20s %-18s %s%s%s (default %s)\n", flag, k->name, k->help,
                k->choices ? ": " : "", k->choices ? k->choices : "", def);
    }
}
