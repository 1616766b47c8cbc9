/* config.h — `tpserve serve` settings: built-in defaults, then a JSON file
 * (--config), then command-line flags, each layer overriding the one before.
 *
 * Every key has one name used both in the file ("max_body_bytes") and on the
 * command line (--max-body-bytes), so the two never drift apart. */
#ifndef TP_CONFIG_H
#define TP_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "backend_settings.h"
#include "status.h"

typedef struct {
    char host[256];          /* bind address; a sidecar talks to its pod */
    int port;                /* 0 lets the kernel pick a free port */
    char graph[4096];        /* graph JSON path, relative to the working dir */
    char backend[16];        /* cpu | cuda | auto */
    int threads;             /* HTTP thread pool size; 0: tp_config_http_threads picks */
    int pin_threads;         /* 1 (default): HTTP threads pinned one per CPU, connections routed by CPU */
    int64_t max_body_bytes;  /* larger request bodies get 413 */
    int request_timeout_ms;  /* idle connection / queue wait limit; 0 = none */
    int drain_timeout_ms;    /* SIGTERM: longest wait for in-flight requests */
    int max_queue;           /* queued inference requests before 503 */
    int max_batch_size;      /* rows per engine run; 0: the engine's largest bucket */
    int max_queue_delay_us;  /* longest the oldest queued request waits for a fuller batch */
    int inline_run_max_us;   /* idle steps up to this long run on the HTTP thread (0: never) */
    int serial_step_max_us;  /* ranks=threads: serial steps (when faster) up to this long (0: never) */
    int instances;           /* copies of the model, each running one batch at a time (cpu, threads) */
    char buckets[128];       /* batch buckets "1,2,4,8,16"; empty: the engine's default */
    char log_level[8];       /* error | warn | info | debug */
    char ranks[16];          /* threads | processes (one process per rank, as on GPUs) */
    char rendezvous[108];    /* processes: unix socket where external ranks join; empty: spawn them */
    char rendezvous_secret_file[4096]; /* 0600 file with the group secret external ranks present */
    int rendezvous_uid;      /* a uid besides the leader's a joining rank may run as; -1: none */
    int staging_mb;          /* processes: shared request staging; 0: the largest bucket's need */
    int rank_heap_mb;        /* processes, cpu backend: shared memory per rank */
    int generate_slots;      /* generation graphs: KV cache slots (sequences at once); 0: 16 */
    char generate_prefill[16]; /* mixed | separate: whether prompt rows share steps with decode rows */
    int step_timeout_ms;     /* processes: a step a rank does not finish by then is a hung rank */
    int connection_memory_bytes; /* per connection: headers and read buffer (431 beyond) */
    int max_connections;     /* open HTTP connections in total */
    int max_memory_mb;       /* request memory budget; 0: from the cgroup limit (tp_mem_budget) */
    int max_json_values;     /* JSON values outside tensor data a request may hold (400 beyond) */
    int stuck_step_ms;       /* a step running this long turns readiness 503 (0: never) */
    int max_connections_per_ip; /* per client address; 0: no limit */
    int request_deadline_ms; /* whole request (or idle gap) per connection; 0: none */
    int health_port;         /* probes-only listener; -1: none, 0: any free port */
    /* Triton protocol extensions */
    int allow_client_shm;    /* 1: clients may register system shared memory regions */
    int max_shm_regions;     /* registered regions at once (each holds an fd); 400 beyond */
    char labels[4096];       /* classification labels: "OUTPUT=FILE[,OUTPUT=FILE...]"; empty: none */
    /* Triton's trace extension at startup (the API changes all but the file) */
    char trace_file[4096];   /* where traces go; empty: no tracing */
    char trace_level[16];    /* OFF | TIMESTAMPS */
    int trace_rate;          /* every N-th inference */
    int64_t trace_count;     /* traces to take; -1: no limit */
    int trace_log_frequency; /* 0: written at exit; N: every N traces to trace_file.IDX */
    int trace_max_pending;   /* traces held before writing; the oldest go to the file first */
    tp_backend_settings backend_settings; /* verify_replay, cuda_* keys */
} tp_config;

void tp_config_defaults(tp_config *c);

/* Applies every key of a JSON object file. Unknown keys and wrong types are
 * errors naming the key and the file. Keys the file omits keep their value. */
tp_status tp_config_load_file(tp_config *c, const char *path, tp_err *err);

/* Sets one key from its text form (a command-line value). key uses either
 * spelling: "max_body_bytes" or "max-body-bytes". */
tp_status tp_config_set(tp_config *c, const char *key, const char *value, tp_err *err);

/* threads, or when 0 the cores this process may use, clamped to [2, 16] */
int tp_config_http_threads(const tp_config *c);
/* Checks ranges and enumerations once all layers are applied. */
tp_status tp_config_validate(const tp_config *c, tp_err *err);

/* Writes the key table (name, type, default, meaning) for --help. */
void tp_config_usage(FILE *f);

#endif
