/* backend_settings.h — the backends' typed settings, as the server config
 * (server/config.c keys) and the CLI set them and tp_engine_opts carries
 * them. In a process group the leader's settings reach every worker with
 * its backend choice, so a worker never needs its own copy. */
#ifndef TP_BACKEND_SETTINGS_H
#define TP_BACKEND_SETTINGS_H

typedef struct {
    int verify_replay;           /* cpu: check every replay's recorded pointers against live buffers */
    int cuda_gemm_workspace_mb;  /* cuda: cuBLASLt workspace */
    int cuda_scratch_mb;         /* cuda: scratch for kernels that need temporaries */
    int cuda_barrier_timeout_ms; /* cuda: a peer missing a device barrier this long fails the run */
    int cuda_check_collectives;  /* cuda: check every collective's signature across ranks */
} tp_backend_settings;

/* The defaults (docs/configuration.md lists them). */
void tp_backend_settings_default(tp_backend_settings *s);

#endif
