/* backend.c — the backend registry: every backend is one tp_backend_kind,
 * listed below (the one place that knows which backends this build has).
 * "auto" takes the first that can really drive world_size ranks here and
 * otherwise says why it fell back to cpu (tp_backend.note, logged by the
 * server). */
#include "backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine.h"
#include "graph.h"
#include "rank_group.h"

/* The kinds (kernels/NAME/), in "auto" preference order; cpu, always
 * present, comes last. The engine sees a backend only through its kind:
 * it includes no kernels/ header (the build gives it no path to them). */
extern const tp_backend_kind tp_cpu_backend_kind;
#ifdef TP_HAVE_CUDA
extern const tp_backend_kind tp_cuda_backend_kind;
#endif
static const tp_backend_kind *const registry[] = {
#ifdef TP_HAVE_CUDA
    &tp_cuda_backend_kind,
#endif
    &tp_cpu_backend_kind,
};
#define N_KINDS ((int)(sizeof registry / sizeof registry[0]))

void tp_backend_settings_default(tp_backend_settings *s)
{
    *s = (tp_backend_settings){.cuda_gemm_workspace_mb = 32, .cuda_scratch_mb = 64,
                               .cuda_barrier_timeout_ms = 30000};
}

const tp_backend_kind *tp_backend_default(void) { return registry[N_KINDS - 1]; }

const tp_backend_kind *tp_backend_find(const char *name)
{
    for (int i = 0; name && i < N_KINDS; i++)
        if (strcmp(registry[i]->name, name) == 0)
            return registry[i];
    return NULL;
}

const char *tp_backend_names(void)
{
    static char names[128];
    if (!names[0])
        for (int i = 0, n = 0; i < N_KINDS && n < (int)sizeof names; i++)
            n += snprintf(names + n, sizeof names - (size_t)n, "%s%s", i ? ", " : "", registry[i]->name);
    return names;
}

int tp_engine_prepare_exec(void)
{
    int changed = 0;
    for (int i = 0; i < N_KINDS; i++)
        if (registry[i]->prepare_exec)
            changed |= registry[i]->prepare_exec();
    return changed;
}

int tp_engine_reexec_for_backends(char **argv)
{
    if (!tp_engine_prepare_exec())
        return 0;
    execv("/proc/self/exe", argv);
    return -1;
}

static tp_status unknown(const char *name, tp_err *err)
{
    return tp_fail(err, TP_INVALID, "unknown backend '%s' (expected %s or auto)", name, tp_backend_names());
}

/* The kind "auto" picks for world ranks (threads of this process, or one
 * process each), with why the better ones could not (into why) when it
 * falls back to the last (cpu). */
static const tp_backend_kind *auto_kind(int world, int processes, char *why, size_t len)
{
    snprintf(why, len, "this build has only %s", tp_backend_names());
    for (int i = 0; i < N_KINDS - 1; i++) {
        const tp_backend_kind *k = registry[i];
        int n = k->probe(why, len);
        /* as threads, a one-rank-per-process backend fits one rank only */
        int fits = processes || !k->one_rank_per_process || world == 1;
        if (fits && n >= world)
            return k;
        if (n > 0 && !fits)
            snprintf(why, len, "world_size %d needs one process per GPU (ranks=processes)", world);
        else if (n > 0)
            snprintf(why, len, "%d %s device(s) for world_size %d", n, k->name, world);
    }
    return registry[N_KINDS - 1];
}

/* Before what the backend noted itself at creation (its kernels). */
static void note_auto(tp_backend *b, const char *why)
{
    char own[120]; /* a backend's own note is a line's worth */
    size_t len = strnlen(b->note, sizeof own - 1);
    memcpy(own, b->note, len);
    own[len] = '\0';
    snprintf(b->note, sizeof b->note, "backend auto chose %s: %s%s%s", b->kind->name, why, *own ? "; " : "", own);
}

tp_status tp_backend_pick(const char *name, int world, const tp_backend_kind **out, tp_err *err)
{
    char why[160];
    *out = name && strcmp(name, "auto") == 0 ? auto_kind(world, 0, why, sizeof why) : tp_backend_find(name ? name : "cpu");
    return *out ? TP_OK : unknown(name, err);
}

tp_status tp_backend_create_with(const char *name, int world, const tp_backend_settings *s, tp_backend **out,
                                 tp_err *err)
{
    tp_backend_settings dflt;
    if (!s) {
        tp_backend_settings_default(&dflt);
        s = &dflt;
    }
    char why[160] = "";
    int automatic = name && strcmp(name, "auto") == 0;
    /* threads of one process: a backend with one device per process runs one rank */
    const tp_backend_kind *k = automatic ? auto_kind(world, 0, why, sizeof why) : tp_backend_find(name ? name : "cpu");
    if (!k)
        return unknown(name, err);
    tp_status st = k->create(world, s, out, err);
    if (st == TP_OK) {
        (*out)->kind = k;
        if (automatic && k == registry[N_KINDS - 1])
            note_auto(*out, why);
    }
    return st;
}

tp_status tp_backend_create(const char *name, int world, tp_backend **out, tp_err *err)
{
    return tp_backend_create_with(name, world, NULL, out, err);
}

/* ---------------------------------------------------------- process groups
 *
 * The leader chooses (auto decides once, for everyone) and tells the
 * workers its settings (the same binary: workers are this executable) and
 * "NAME MESSAGE", the kind's message (an NCCL id) made before its own join
 * when joining blocks until every rank joins. */

static tp_backend_group group_of(tp_rank_group *rg)
{
    const tp_rank_shared *s = tp_rank_group_shared(rg);
    tp_backend_group g = {.world = tp_rank_group_world(rg), .leads = tp_rank_group_leads(rg), .base = s->base,
                          .comm_offset = s->comm_offset, .comm_bytes = s->comm_bytes,
                          .heap_offset = s->heap_offset, .heap_bytes = s->heap_bytes,
                          .staging_offset = s->staging_offset, .staging_bytes = s->staging_bytes,
                          .group = rg};
    tp_rank_group_local(rg, &g.rank_lo, &g.rank_hi);
    return g;
}

static tp_status join(const tp_backend_kind *k, tp_rank_group *rg, const char *msg, const tp_backend_settings *s,
                      tp_backend **out, tp_err *err)
{
    tp_backend_group g = group_of(rg);
    tp_status st = k->group_join(&g, msg, s, out, err);
    if (st == TP_OK)
        (*out)->kind = k;
    return st;
}

static tp_status lead_group(const char *name, const tp_backend_settings *s, tp_rank_group *rg, tp_backend **out,
                            tp_err *err)
{
    char msg[TP_GROUP_MESSAGE], why[160] = "";
    int automatic = name && strcmp(name, "auto") == 0;
    const tp_backend_kind *k = automatic ? auto_kind(tp_rank_group_world(rg), 1, why, sizeof why)
                                         : tp_backend_find(name ? name : "cpu");
    if (!k)
        return unknown(name, err);
    memcpy(msg, s, sizeof *s);
    char *text = msg + sizeof *s;
    size_t cap = sizeof msg - sizeof *s, used = (size_t)snprintf(text, cap, "%s ", k->name);
    tp_status st = k->group_message(text + used, cap - used, err);
    size_t len = sizeof *s + strlen(text) + 1;
    /* first when the join blocks for every rank (cuda); else after, so
     * workers attach to what the leader's join set up (cpu's comm area) */
    if (st == TP_OK && k->share_before_join)
        st = tp_rank_group_share(rg, msg, &len, sizeof msg, err);
    if (st == TP_OK)
        st = join(k, rg, text + used, s, out, err);
    if (st == TP_OK && !k->share_before_join && (st = tp_rank_group_share(rg, msg, &len, sizeof msg, err)) != TP_OK) {
        tp_backend_destroy(*out);
        *out = NULL;
    }
    if (st == TP_OK && automatic && k == registry[N_KINDS - 1])
        note_auto(*out, why);
    return st;
}

static tp_status follow_group(tp_rank_group *rg, tp_backend **out, tp_err *err)
{
    char msg[TP_GROUP_MESSAGE];
    tp_backend_settings leader;
    size_t len = 0;
    tp_status st = tp_rank_group_share(rg, msg, &len, sizeof msg - 1, err);
    if (st != TP_OK)
        return st;
    if (len <= sizeof leader)
        return tp_fail(err, TP_INTERNAL, "the leader's backend message is %zu bytes, too short", len);
    msg[len] = 0;
    memcpy(&leader, msg, sizeof leader);
    const char *text = msg + sizeof leader;
    size_t name_len = strcspn(text, " ");
    for (int i = 0; i < N_KINDS; i++)
        if (strlen(registry[i]->name) == name_len && strncmp(text, registry[i]->name, name_len) == 0)
            return join(registry[i], rg, text + name_len + (text[name_len] == ' '), &leader, out, err);
    return tp_fail(err, TP_UNAVAILABLE, "the leader chose backend '%.*s', which this worker cannot run",
                   (int)(name_len > 40 ? 40 : name_len), text);
}

tp_status tp_backend_create_for_group(const char *name, const tp_backend_settings *s, tp_rank_group *rg,
                                      tp_backend **out, tp_err *err)
{
    tp_backend_settings dflt;
    if (!s) {
        tp_backend_settings_default(&dflt);
        s = &dflt;
    }
    if (!tp_rank_group_shared(rg))
        return tp_backend_create_with(name, tp_rank_group_world(rg), s, out, err);
    return tp_rank_group_leads(rg) ? lead_group(name, s, rg, out, err) : follow_group(rg, out, err);
}

tp_status tp_backend_check_graph(const tp_backend_kind *k, const tp_graph *g, tp_err *err)
{
    for (int i = 0; i < g->n_nodes; i++) {
        const tp_node *n = &g->nodes[i];
        tp_op_kind kind = tp_op_kind_of(n->op);
        if (kind == TP_KIND_SOURCE || kind == TP_KIND_VIEW)
            continue; /* nothing runs */
        if (!k->supports_op(n->op, n->dtype))
            return tp_fail(err, TP_UNAVAILABLE, "node '%s': backend '%s' has no kernel for op '%s' on %s", n->name,
                           k->name, tp_op_name(n->op), tp_dtype_name(n->dtype));
    }
    return TP_OK;
}
