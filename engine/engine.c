/* engine.c — the public engine: load and compile once (passes, a plan and a
 * capture per batch bucket), then validate requests and run them.
 *
 * A batch of B rows runs in the smallest bucket >= B, padded with zero rows
 * that are cut from the outputs; past the largest bucket it runs in several
 * bucket-sized pieces. That is only sound when no op mixes batch rows
 * (tp_plan_rows_independent); otherwise each exact batch size gets its own
 * executable, captured on first use and kept in a bounded cache.
 *
 * Memory: every executable of the engine binds into one arena pool
 * (tp_exec_pool: per rank one regular, one symmetric, one input-slot and
 * one output arena), sized at load for the largest of the buckets' plans
 * and grown, never shrunk, when an exact batch needs more. That is sound
 * because the engine's steps never overlap: a step runs with mu held
 * (run_request), a worker process runs the leader's steps one at a time
 * in one loop (tp_engine_follow), and executables are built either at load,
 * before the engine is returned, or inside a step (get_exact). So two
 * executables never use the pool at once, and each run rewrites all it
 * reads. Memory is the largest bucket's, not the sum over buckets, and an
 * evicted exact executable frees no symmetric memory (cuda: no NCCL
 * window is released per executable). */
#include "engine.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "exec.h"
#include "graph.h"
#include "io_check.h"
#include "passes.h"
#include "plan.h"
#include "plan_report.h"
#include "request_checks.h"
#include "rank_group.h"
#include "text.h"
#include "weights.h"
#include "zalloc.h"

#define EXEC_CACHE 8

/* One execution, as the leader posts it to worker processes: a bucket's
 * executable, or (bucket -1) the exact-batch one for batch. Inputs and
 * outputs sit in the request staging at offsets both sides derive from the
 * executable (stage_layout), so the command carries nothing else. */
typedef struct {
    int32_t bucket;
    int32_t unused;
    int64_t batch;
} step_cmd;

struct tp_engine {
    tp_graph *g;
    tp_backend *b;
    tp_rank_group *rg;
    tp_weights *w;
    tp_generate_info gen; /* valid when g->gen */
    tp_io_desc *in_desc, *out_desc;
    int64_t *out_rows; /* per output: dim-0 rows per batch row (0: static) */
    tp_exec_opts xopts;
    tp_pass_opts passes; /* kept: executables lower collectives per bucket */
    tp_pass_result pass_results[TP_PASS_COUNT];
    int padded; /* rows independent: pad into buckets */
    char why_exact[256];
    int n_buckets;
    int64_t bucket_size[TP_MAX_BUCKETS];
    tp_exec *buckets[TP_MAX_BUCKETS]; /* padded: one executable per bucket */
    tp_exec *cache[EXEC_CACHE]; /* exact-batch executables (padded == 0) */
    tp_exec_pool *pool;         /* the arenas every executable above binds into */
    unsigned long last_use[EXEC_CACHE], clock;
    tp_engine_stats stats;
    /* Request staging: inputs then outputs of the execution in flight. In a
     * process group it is the group's shared (pinned on cuda) area every
     * rank copies its shard from; otherwise ours, grown as needed. */
    char *stage;
    size_t stage_cap;
    int stage_shared;
    /* Why no request can run again, once seen: the group's "rank group
     * lost: ..." or dead_reason (a backend that died in a failed step). */
    const char *_Atomic lost;
    char dead_reason[sizeof ((tp_err *)0)->msg + 64];
    pthread_mutex_t mu;
    void (*on_lost)(void *arg); /* tp_engine_opts' */
    void *on_lost_arg;
};

/* Output dims that change with the batch are reported as -1: found by
 * inferring at two batch sizes rather than by tracking symbols. */
static tp_status build_io_descs(tp_engine *e, tp_err *err)
{
    tp_graph *g = e->g;
    e->in_desc = calloc((size_t)g->n_inputs + 1, sizeof *e->in_desc);
    e->out_desc = calloc((size_t)g->n_outputs + 1, sizeof *e->out_desc);
    e->out_rows = calloc((size_t)g->n_outputs + 1, sizeof *e->out_rows);
    if (!e->in_desc || !e->out_desc || !e->out_rows)
        return tp_fail(err, TP_NOMEM, "out of memory");
    for (int i = 0; i < g->n_inputs; i++) {
        const tp_node *n = &g->nodes[g->input_ids[i]];
        tp_io_desc *d = &e->in_desc[i];
        *d = (tp_io_desc){.name = n->name, .dtype = n->dtype, .ndim = n->g_ndim};
        memcpy(d->shape, n->gshape, sizeof d->shape);
        if (n->batched)
            d->shape[0] = -1;
    }
    int64_t b1 = g->batch, s1[TP_MAX_DIMS], s2[TP_MAX_DIMS];
    tp_status st = tp_graph_infer(g, 2 * b1, err);
    for (int i = 0; st == TP_OK && i < g->n_outputs; i++) {
        tp_io_desc *d = &e->out_desc[i];
        d->ndim = tp_graph_output_shape(g, i, s2);
        d->name = g->nodes[g->output_ids[i]].name;
        d->dtype = g->nodes[g->output_ids[i]].dtype;
        memcpy(d->shape, s2, sizeof d->shape);
    }
    if (st == TP_OK)
        st = tp_graph_infer(g, b1, err);
    for (int i = 0; st == TP_OK && i < g->n_outputs; i++) {
        int nd;
        nd = tp_graph_output_shape(g, i, s1);
        if (nd > 0 && s1[0] != e->out_desc[i].shape[0])
            e->out_rows[i] = s1[0] / b1;
        for (int k = 0; k < nd; k++)
            if (s1[k] != e->out_desc[i].shape[k])
                e->out_desc[i].shape[k] = -1;
            else
                e->out_desc[i].shape[k] = s1[k];
    }
    return st;
}

/* Buckets from the options, or 1,2,4,8,16 (times world_size when the batch
 * itself is sharded across ranks, so every bucket divides evenly); a
 * generation graph's rows are tokens, so its default goes on to 64: a step
 * carries one row per running sequence (16 slots by default) and prompt
 * rows besides, and a step past the largest bucket runs in pieces. */
static tp_status choose_buckets(tp_engine *e, const tp_engine_opts *o, tp_err *err)
{
    int64_t scale = tp_graph_batch_sharded(e->g) ? e->g->world_size : 1;
    if (!o || !o->buckets || o->n_buckets == 0) {
        e->n_buckets = e->g->gen ? 7 : 5;
        for (int i = 0; i < e->n_buckets; i++)
            e->bucket_size[i] = ((int64_t)1 << i) * scale;
        return TP_OK;
    }
    if (o->n_buckets > TP_MAX_BUCKETS)
        return tp_fail(err, TP_INVALID, "at most %d batch buckets, got %d", TP_MAX_BUCKETS, o->n_buckets);
    e->n_buckets = o->n_buckets;
    for (int i = 0; i < o->n_buckets; i++) {
        int64_t b = o->buckets[i];
        if (b < 1 || (i > 0 && b <= o->buckets[i - 1]))
            return tp_fail(err, TP_INVALID, "batch buckets must be positive and ascending (bucket %d is %lld)", i,
                           (long long)b);
        if (b % scale != 0)
            return tp_fail(err, TP_INVALID, "bucket %lld is not divisible by world_size %lld (an input is sharded on the batch dim)",
                           (long long)b, (long long)scale);
        e->bucket_size[i] = b;
    }
    return TP_OK;
}

tp_status tp_parse_buckets(const char *text, int64_t *out, int *n, tp_err *err)
{
    const char *p = text;
    *n = 0;
    while (*p) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || (*end && *end != ',') || *n == TP_MAX_BUCKETS)
            return tp_fail(err, TP_INVALID, "buckets '%s': expected up to %d comma-separated batch sizes",
                           text, TP_MAX_BUCKETS);
        out[(*n)++] = v;
        p = *end ? end + 1 : end;
    }
    return *n ? TP_OK : tp_fail(err, TP_INVALID, "buckets '%s': no batch sizes", text);
}

static tp_status run_passes(tp_engine *e, const tp_backend_kind *k, const tp_engine_opts *o, tp_err *err)
{
    tp_pass_opts *po_ = &e->passes, po;
    tp_pass_opts_default(po_);
    po_->lowering = k->caps->lowering;
    po_->f32_activations = k->caps->f32_activations;
    if (o && o->no_passes)
        for (int i = 0; i < TP_PASS_COUNT; i++)
            po_->disabled[i] = 1;
    if (o && o->disable_passes) {
        char list[256];
        snprintf(list, sizeof list, "%s", o->disable_passes);
        for (char *save, *tok = strtok_r(list, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
            if (tp_pass_disable(po_, tok) != 0)
                return tp_fail(err, TP_INVALID, "unknown pass '%s'", tok);
    }
    po = *po_;
    e->xopts.lowering = &e->passes;
    /* Passes run at the smallest bucket: its messages are the smallest, so
     * the one_shot set (and the symmetric placement it needs) is the widest;
     * each bucket's executable then lowers again at its own sizes, and a
     * larger bucket can only move a collective from one_shot to ring/nccl,
     * never into needing symmetric memory it was not given. */
    tp_status st = tp_graph_infer(e->g, e->bucket_size[0], err);
    return st == TP_OK ? tp_run_passes(e->g, &po, e->pass_results, err) : st;
}

/* What tp_engine_create and tp_engine_plan both do once the backend kind is
 * known: the passes, the check that the backend runs every op, and whether
 * batches may be padded into buckets. */
static tp_status compile_graph(tp_engine *e, const tp_backend_kind *k, const tp_engine_opts *o, tp_err *err)
{
    tp_status st = run_passes(e, k, o, err);
    if (st == TP_OK)
        st = tp_backend_check_graph(k, e->g, err);
    if (st == TP_OK)
        st = tp_plan_rows_independent(e->g, e->bucket_size[0], &e->padded, e->why_exact, sizeof e->why_exact, err);
    return st;
}

/* The pool, sized for the largest arena of each kind over the buckets'
 * plans (padded: the buckets' executables, prepared here and bound by
 * bind_buckets; exact: the plans at the bucket sizes, which exact batches
 * past the largest bucket grow). */
static tp_status create_pool(tp_engine *e, tp_err *err)
{
    int64_t bytes[TP_MEM_KINDS] = {0};
    tp_status st = TP_OK;
    for (int k = 0; st == TP_OK && k < e->n_buckets; k++) {
        int64_t b[TP_MEM_KINDS];
        if (e->padded) {
            st = tp_exec_prepare(e->g, e->bucket_size[k], e->b, e->rg, e->w, &e->xopts, &e->buckets[k], err);
            if (st == TP_OK)
                memcpy(b, tp_exec_plan(e->buckets[k])->arena_bytes, sizeof b);
        } else if (tp_exec_arena_bytes(e->g, e->bucket_size[k], e->xopts.lowering, b, err) != TP_OK) {
            continue; /* a batch this graph cannot run: the pool grows for what does run */
        }
        for (int m = 0; st == TP_OK && m < TP_MEM_KINDS; m++)
            bytes[m] = b[m] > bytes[m] ? b[m] : bytes[m];
    }
    if (st == TP_OK)
        st = tp_exec_pool_create(e->b, e->rg, bytes, &e->pool, err);
    if (st == TP_OK)
        tp_exec_pool_bytes(e->pool, e->stats.arena_bytes);
    return st;
}

static tp_status bind_buckets(tp_engine *e, tp_err *err)
{
    tp_status st = TP_OK;
    for (int k = 0; st == TP_OK && e->padded && k < e->n_buckets; k++)
        if ((st = tp_exec_bind(e->buckets[k], e->pool, err)) != TP_OK)
            tp_err_prefix(err, "bucket %lld: ", (long long)e->bucket_size[k]);
    return st;
}

static tp_status staging_need(tp_engine *e, int64_t batch, size_t *bytes, tp_err *err);
#define MIB_CEIL(bytes) (((bytes) + ((size_t)1 << 20) - 1) >> 20)

/* A process group's staging is shared memory of a fixed size, made before
 * any executable: sized here for the largest bucket (padded runs never
 * need more) when *bytes is 0, or refused at load when the size asked for
 * is smaller, naming the one that would do. Sparse memory: the size costs
 * address space, and memory only as large batches touch it. */
static tp_status size_staging(tp_engine *e, size_t *bytes, tp_err *err)
{
    int64_t largest = e->bucket_size[e->n_buckets - 1];
    size_t need;
    tp_status st = staging_need(e, largest, &need, err);
    if (st != TP_OK)
        return st;
    if (*bytes == 0)
        *bytes = need;
    else if (*bytes < need)
        return tp_fail(err, TP_INVALID, "request staging of %zu bytes is too small: the largest bucket (a batch of %lld) "
                       "needs %zu; --staging-mb %zu would do (or 0: sized for the largest bucket)",
                       *bytes, (long long)largest, need, MIB_CEIL(need));
    return TP_OK;
}

static tp_status create_group(tp_engine *e, const tp_engine_opts *o, tp_err *err)
{
    tp_rank_group_opts go = {.mode = TP_GROUP_THREADS};
    if (o && o->group)
        go = *o->group;
    if (!go.on_lost) {
        go.on_lost = e->on_lost;
        go.on_lost_arg = e->on_lost_arg;
    }
    if (go.mode == TP_GROUP_WORKER && go.world != e->g->world_size)
        return tp_fail(err, TP_INVALID, "worker: WORLD_SIZE %d, but graph '%s' has world_size %d", go.world,
                       e->g->name, e->g->world_size);
    go.world = e->g->world_size;
    tp_status st = go.mode == TP_GROUP_PROCESSES ? size_staging(e, &go.staging_bytes, err) : TP_OK;
    if (st == TP_OK)
        st = tp_rank_group_create(&go, &e->rg, err);
    const tp_rank_shared *sh = st == TP_OK ? tp_rank_group_shared(e->rg) : NULL;
    if (sh) {
        e->stage = sh->base + sh->staging_offset;
        e->stage_cap = sh->staging_bytes;
        e->stage_shared = 1;
    }
    return st;
}

/* Every process must compile the same thing, or the lockstep steps would
 * pair different work: workers compare their options with the leader's. */
typedef struct {
    const char *mine, *leader;
} agreement;

static tp_status check_agreement(void *ctx, int rank, tp_err *err)
{
    (void)rank; /* the group prefixes "rank r: " */
    agreement *a = ctx;
    if (strcmp(a->mine, a->leader) != 0)
        return tp_fail(err, TP_INVALID, "started with other options than rank 0: %s; rank 0 has %s", a->mine,
                       a->leader);
    return TP_OK;
}

static tp_status agree_options(tp_engine *e, const tp_engine_opts *o, tp_err *err)
{
    char mine[TP_GROUP_MESSAGE], leader[TP_GROUP_MESSAGE], bk[200] = "";
    for (int i = 0, n = 0; i < e->n_buckets && n < (int)sizeof bk; i++)
        n += snprintf(bk + n, sizeof bk - (size_t)n, "%s%lld", i ? "," : "", (long long)e->bucket_size[i]);
    snprintf(mine, sizeof mine, "graph '%s' (%d nodes, %d params), backend %s, buckets %s, passes %s%s%s%s",
             e->g->name, e->g->n_nodes, e->g->n_params, o && o->backend ? o->backend : "cpu", bk,
             o && o->no_passes ? "none" : "all", o && o->disable_passes ? " but " : "",
             o && o->disable_passes ? o->disable_passes : "", e->xopts.eager ? ", eager" : "");
    size_t used = strlen(mine);
    if (e->g->n_states > 0) /* the ranks' caches must hold the same slots */
        snprintf(mine + used, sizeof mine - used, ", %lld state slots", (long long)e->g->state_slots);
    memcpy(leader, mine, sizeof leader);
    size_t n = strlen(leader) + 1;
    tp_status st = tp_rank_group_share(e->rg, leader, &n, sizeof leader - 1, err);
    leader[n < sizeof leader ? n : sizeof leader - 1] = 0;
    agreement a = {mine, leader};
    return st == TP_OK ? tp_rank_group_run(e->rg, check_agreement, &a, NULL, err) : st;
}

static tp_status stage_layout(tp_engine *e, tp_exec *x, tp_tensor *in_t, tp_tensor *out_t, tp_err *err);
static void note_lost(tp_engine *e, const tp_err *step_err);

/* Staging for the largest bucket, now: no padded run needs more, so a shared
 * staging too small for it is a load error, not a failure of every big batch. */
static tp_status reserve_staging(tp_engine *e, tp_err *err)
{
    tp_tensor in_t[e->g->n_inputs + 1], out_t[e->g->n_outputs + 1];
    tp_status st = stage_layout(e, e->buckets[e->n_buckets - 1], in_t, out_t, err);
    if (st != TP_OK)
        tp_err_prefix(err, "the largest bucket: ");
    return st;
}

static tp_status compile(tp_engine *e, const tp_engine_opts *o, tp_err *err)
{
    tp_status st = choose_buckets(e, o, err);
    if (st == TP_OK)
        st = create_group(e, o, err);
    if (st == TP_OK)
        st = agree_options(e, o, err);
    if (st == TP_OK)
        st = tp_backend_create_for_group(o ? o->backend : NULL, o ? o->settings : NULL, e->rg, &e->b, err);
    if (st == TP_OK)
        st = compile_graph(e, e->b->kind, o, err);
    if (st == TP_OK)
        st = tp_weights_load(e->g, e->b, e->rg, &e->w, err);
    if (st == TP_OK)
        st = create_pool(e, err);
    if (st == TP_OK)
        st = bind_buckets(e, err);
    if (st == TP_OK && e->padded)
        st = reserve_staging(e, err);
    if (st == TP_OK)
        st = tp_graph_infer(e->g, e->bucket_size[0], err);
    if (st == TP_OK)
        st = build_io_descs(e, err);
    if (st == TP_OK && o && e->b->iface->ranks_may_share_thread)
        st = tp_rank_group_set_serial(e->rg, o->serial_step_max_us, err);
    e->stats.n_buckets = e->n_buckets;
    memcpy(e->stats.bucket, e->bucket_size, sizeof e->stats.bucket);
    return st;
}

static tp_status engine_new(const char *graph_path, const tp_engine_opts *opts, tp_engine **out, tp_err *err)
{
    *out = calloc(1, sizeof **out);
    if (!*out)
        return tp_fail(err, TP_NOMEM, "engine: out of memory");
    pthread_mutex_init(&(*out)->mu, NULL);
    (*out)->xopts.eager = opts && opts->eager;
    if (opts) {
        (*out)->on_lost = opts->on_lost;
        (*out)->on_lost_arg = opts->on_lost_arg;
    }
    if (opts && opts->state_slots < 0)
        return tp_fail(err, TP_INVALID, "state slots must be positive (0: the default %d), got %lld",
                       TP_DEFAULT_STATE_SLOTS, (long long)opts->state_slots);
    tp_status st = tp_graph_load(graph_path, &(*out)->g, err);
    if (st != TP_OK)
        return st;
    tp_graph *g = (*out)->g;
    if (opts && opts->state_slots > 0)
        g->state_slots = opts->state_slots; /* every later inference sizes the states with it */
    if (g->gen)
        (*out)->gen = (tp_generate_info){.input_ids = g->gen->input_ids, .positions = g->gen->positions,
                                         .slots = g->gen->slots, .next_token = g->gen->next_token,
                                         .logit_rows = g->gen->logit_rows, .max_seq_len = g->gen->max_seq_len, .vocab_size = g->gen->vocab_size,
                                         .slots_n = g->state_slots};
    return TP_OK;
}

const tp_generate_info *tp_engine_generate_info(const tp_engine *e) { return e->g->gen ? &e->gen : NULL; }

int64_t tp_engine_state_bytes(const tp_engine *e) { return e->w ? (int64_t)tp_weights_state_bytes(e->w) : 0; }

tp_status tp_engine_create(const char *graph_path, const tp_engine_opts *opts, tp_engine **out,
                           tp_err *err)
{
    tp_engine *e;
    *out = NULL;
    tp_status st = engine_new(graph_path, opts, &e, err);
    if (st == TP_OK)
        st = compile(e, opts, err);
    if (st != TP_OK) {
        tp_engine_free(e);
        return st;
    }
    *out = e;
    return TP_OK;
}

/* The index of the smallest bucket holding rows (past the largest: the
 * largest, which then runs in pieces). */
static int bucket_for(const tp_engine *e, int64_t rows)
{
    int k = 0;
    while (k < e->n_buckets - 1 && e->bucket_size[k] < rows)
        k++;
    return k;
}

tp_status tp_engine_plan(const char *graph_path, const tp_engine_opts *opts, int64_t batch, int json, FILE *out,
                         tp_err *err)
{
    tp_engine *e;
    tp_graph *lowered = NULL;
    tp_status st = engine_new(graph_path, opts, &e, err);
    const tp_backend_kind *k = NULL;
    if (st == TP_OK)
        st = tp_backend_pick(opts ? opts->backend : NULL, e->g->world_size, &k, err);
    if (st == TP_OK)
        st = choose_buckets(e, opts, err);
    if (st == TP_OK)
        st = compile_graph(e, k, opts, err);
    if (st == TP_OK)
        st = tp_exec_lower(e->g, e->padded ? e->bucket_size[bucket_for(e, batch)] : batch, e->xopts.lowering,
                           &lowered, err);
    int64_t arenas[TP_MAX_BUCKETS][TP_MEM_KINDS];
    for (int b = 0; st == TP_OK && b < e->n_buckets; b++)
        st = tp_exec_arena_bytes(e->g, e->bucket_size[b], e->xopts.lowering, arenas[b], err);
    if (st == TP_OK) {
        tp_report_opts ro = {.batch = lowered->batch, .json = json, .dma = k->caps->dma_input_copies,
                             .passes = e->pass_results, .padding = e->padded ? NULL : e->why_exact,
                             .n_buckets = e->n_buckets, .bucket = e->bucket_size, .bucket_arena = arenas};
        st = tp_plan_report(lowered, &ro, out, err);
    }
    tp_graph_free(lowered);
    tp_engine_free(e);
    return st;
}

void tp_engine_free(tp_engine *e)
{
    if (!e)
        return;
    /* workers quit first: each then tears down its own backend */
    if (e->rg)
        tp_rank_group_stop(e->rg);
    /* a group lost between steps never ran the lost hook: without it the
     * backend's teardown could wait in a collective for a peer that is gone */
    if (e->b && e->rg && tp_rank_group_lost(e->rg))
        e->b->iface->peer_lost(e->b);
    for (int i = 0; i < EXEC_CACHE; i++)
        tp_exec_free(e->cache[i]);
    for (int k = 0; k < e->n_buckets; k++)
        tp_exec_free(e->buckets[k]);
    tp_exec_pool_free(e->pool); /* after every executable bound into it */
    tp_weights_free(e->w);
    tp_backend_destroy(e->b); /* before the group: its comm lives in the group's memory */
    tp_rank_group_free(e->rg);
    if (!e->stage_shared)
        free(e->stage);
    tp_graph_free(e->g);
    free(e->in_desc);
    free(e->out_desc);
    free(e->out_rows);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

const char *tp_engine_model_name(const tp_engine *e) { return e->g->name; }
const char *tp_engine_backend_name(const tp_engine *e) { return e->b->iface->name; }
const char *tp_engine_backend_note(const tp_engine *e) { return e->b->note; }
struct tp_backend *tp_engine_backend(tp_engine *e) { return e->b; }
int tp_engine_world_size(const tp_engine *e) { return e->g->world_size; }
int tp_engine_n_inputs(const tp_engine *e) { return e->g->n_inputs; }
int tp_engine_n_outputs(const tp_engine *e) { return e->g->n_outputs; }
const tp_io_desc *tp_engine_input(const tp_engine *e, int i) { return &e->in_desc[i]; }
const tp_io_desc *tp_engine_output(const tp_engine *e, int i) { return &e->out_desc[i]; }

/* The batch every batched input agrees on (inputs in graph order, each
 * checked against its desc). */
static tp_status find_batch(const tp_engine *e, const tp_host_tensor *const *ordered, int64_t *batch, tp_err *err)
{
    *batch = 0;
    const char *batch_from = NULL;
    for (int i = 0; i < e->g->n_inputs; i++) {
        const tp_io_desc *d = &e->in_desc[i];
        if (d->ndim > 0 && d->shape[0] < 0) {
            if (*batch && ordered[i]->shape[0] != *batch)
                return tp_fail(err, TP_INVALID, "input '%s': batch %lld differs from batch %lld of input '%s'",
                               d->name, (long long)ordered[i]->shape[0], (long long)*batch, batch_from);
            *batch = ordered[i]->shape[0];
            batch_from = d->name;
        }
    }
    if (*batch == 0)
        *batch = 1; /* no batched input: the graph's shapes are all static */
    return TP_OK;
}

/* Orders the request's tensors as the graph's inputs and finds the batch. */
static tp_status match_inputs(tp_engine *e, const tp_host_tensor *in, int n, const tp_host_tensor **ordered,
                              int64_t *batch, tp_err *err)
{
    int ni = e->g->n_inputs;
    for (int i = 0; i < ni; i++)
        ordered[i] = NULL;
    for (int j = 0; j < n; j++) {
        int i = tp_io_find(e->in_desc, ni, in[j].name);
        if (i < 0)
            return tp_io_fail_unknown(err, e->g->name, e->in_desc, ni, in[j].name);
        if (ordered[i])
            return tp_io_fail_repeated(err, in[j].name);
        ordered[i] = &in[j];
    }
    for (int i = 0; i < ni; i++) {
        if (!ordered[i])
            return tp_io_fail_missing(err, e->g->name, e->in_desc, ni, i);
        tp_status st = tp_io_check_tensor(&e->in_desc[i], ordered[i], err);
        if (st != TP_OK)
            return st;
    }
    return find_batch(e, ordered, batch, err);
}

static void add_run_stats(tp_engine *e, const tp_exec_stats *xs, int bucket_index)
{
    e->stats.executions++;
    if (bucket_index >= 0)
        e->stats.bucket_runs[bucket_index]++;
    else
        e->stats.exact_runs++;
    e->stats.symmetric_copy_bytes += (uint64_t)xs->input_copy_bytes[TP_MEM_SYMMETRIC];
    e->stats.regular_copy_bytes += (uint64_t)xs->input_copy_bytes[TP_MEM_INPUT];
}

/* Exact-batch executable from the bounded cache (graphs that mix rows). */
static tp_status get_exact(tp_engine *e, int64_t batch, tp_exec **out, tp_err *err)
{
    int victim = 0;
    e->clock++;
    for (int i = 0; i < EXEC_CACHE; i++) {
        if (e->cache[i] && tp_exec_batch(e->cache[i]) == batch) {
            e->last_use[i] = e->clock;
            *out = e->cache[i];
            return TP_OK;
        }
        if (!e->cache[i] || (e->cache[victim] && e->last_use[i] < e->last_use[victim]))
            victim = i;
    }
    tp_exec *x;
    tp_status st = tp_exec_prepare(e->g, batch, e->b, e->rg, e->w, &e->xopts, &x, err);
    if (st == TP_OK && !tp_exec_pool_fits(e->pool, tp_exec_plan(x))) {
        /* the arenas move: every executable bound into them goes first
         * (their captures hold the old addresses) */
        for (int i = 0; i < EXEC_CACHE; i++) {
            tp_exec_free(e->cache[i]);
            e->cache[i] = NULL;
        }
        st = tp_exec_pool_grow(e->pool, tp_exec_plan(x)->arena_bytes, err);
        tp_exec_pool_bytes(e->pool, e->stats.arena_bytes);
    }
    if (st == TP_OK)
        st = tp_exec_bind(x, e->pool, err);
    if (st != TP_OK) {
        tp_exec_free(x);
        return st;
    }
    tp_exec_free(e->cache[victim]);
    e->cache[victim] = x;
    e->last_use[victim] = e->clock;
    *out = x;
    return TP_OK;
}

/* Caller-owned results: the exact executable's output shapes, or (padded)
 * the global shapes with dim 0 grown to batch times its rows per batch row.
 * Every output lives in one block (64-byte aligned offsets), each tensor
 * holding one reference: a batcher hands each request views of its rows,
 * and the block goes when the last of them is released. */
static tp_status alloc_results(tp_engine *e, const tp_exec *x, int64_t batch, tp_host_tensor *outs, tp_err *err)
{
    int no = e->g->n_outputs;
    size_t off[no + 1], total = 0;
    for (int i = 0; i < no; i++) {
        const tp_io_desc *d = &e->out_desc[i];
        tp_host_tensor *o = &outs[i];
        tp_text_copy(o->name, sizeof o->name, d->name);
        o->dtype = d->dtype;
        o->ndim = d->ndim;
        size_t n = tp_dtype_size(d->dtype);
        tp_tensor xd = x ? tp_exec_output_desc(x, i) : (tp_tensor){0};
        for (int k = 0; k < d->ndim; k++) {
            o->shape[k] = x ? xd.shape[k] : (k == 0 && e->out_rows[i] ? batch * e->out_rows[i] : d->shape[k]);
            n *= (size_t)o->shape[k];
        }
        o->nbytes = n;
        off[i] = total;
        total += (n + 63) & ~(size_t)63;
    }
    tp_host_block *b = no ? tp_host_block_create(total, no) : NULL;
    if (no && !b)
        return tp_fail(err, TP_NOMEM, "outputs: cannot allocate %zu bytes", total);
    for (int i = 0; i < no; i++) {
        outs[i].owner = b;
        outs[i].data = (char *)tp_host_block_data(b) + off[i];
    }
    return TP_OK;
}

/* memcpy from a request tensor, which may be empty with a NULL data
 * pointer (memcpy's arguments must be valid even for 0 bytes). */
static void copy_request_bytes(void *dst, const void *src, size_t n)
{
    if (n > 0)
        memcpy(dst, src, n);
}

/* The global input tensors of a batch, without data. */
static void input_descs(const tp_engine *e, int64_t batch, tp_tensor *in_t)
{
    for (int i = 0; i < e->g->n_inputs; i++) {
        const tp_node *n = &e->g->nodes[e->g->input_ids[i]];
        int64_t shape[TP_MAX_DIMS];
        memcpy(shape, n->gshape, sizeof shape);
        if (n->batched)
            shape[0] = batch;
        in_t[i] = tp_tensor_make(NULL, n->dtype, n->g_ndim, shape);
    }
}

/* The request staging's layout: each tensor 64-byte aligned after the one
 * before; off (n of them, or NULL) gets the offsets. Returns the bytes. */
static size_t stage_offsets(tp_tensor *const *all, int n, size_t *off)
{
    size_t end = 0;
    for (int k = 0; k < n; k++) {
        if (off)
            off[k] = end;
        end += ((size_t)tp_tensor_numel(all[k]) * tp_dtype_size(all[k]->dtype) + 63) & ~(size_t)63;
    }
    return end ? end : 64; /* every tensor empty: still a real staging, never NULL + 0 */
}

/* The staging a batch needs, from the graph's shapes alone (a process
 * group's staging is sized before any executable exists). Leaves the graph
 * inferred at batch. */
static tp_status staging_need(tp_engine *e, int64_t batch, size_t *bytes, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    tp_tensor t[ni + no + 1], *all[ni + no + 1];
    tp_status st = tp_graph_infer(e->g, batch, err);
    if (st != TP_OK)
        return st;
    input_descs(e, batch, t);
    for (int i = 0; i < no; i++) {
        int64_t shape[TP_MAX_DIMS];
        int nd = tp_graph_output_shape(e->g, i, shape);
        t[ni + i] = tp_tensor_make(NULL, e->g->nodes[e->g->output_ids[i]].dtype, nd, shape);
    }
    for (int k = 0; k < ni + no; k++)
        all[k] = &t[k];
    *bytes = stage_offsets(all, ni + no, NULL);
    return TP_OK;
}

/* Where an execution's inputs (then outputs) sit in the request staging:
 * the same offsets in every process, derived from the executable alone. */
static tp_status stage_layout(tp_engine *e, tp_exec *x, tp_tensor *in_t, tp_tensor *out_t, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    tp_tensor *all[ni + no + 1];
    input_descs(e, tp_exec_batch(x), in_t);
    for (int i = 0; i < ni; i++)
        all[i] = &in_t[i];
    for (int i = 0; i < no; i++) {
        out_t[i] = tp_exec_output_desc(x, i);
        all[ni + i] = &out_t[i];
    }
    size_t off[ni + no + 1], end = stage_offsets(all, ni + no, off);
    if (end > e->stage_cap) {
        if (e->stage_shared)
            return tp_fail(err, TP_INVALID, "a batch of %lld needs %zu bytes of request staging; the rank group has %zu "
                           "(--staging-mb %zu would do, or 0: sized for the largest bucket)",
                           (long long)tp_exec_batch(x), end, e->stage_cap, MIB_CEIL(end));
        char *grown = realloc(e->stage, end);
        if (!grown)
            return tp_fail(err, TP_NOMEM, "request staging: cannot allocate %zu bytes", end);
        e->stage = grown;
        e->stage_cap = end;
    }
    for (int k = 0; k < ni + no; k++)
        all[k]->data = e->stage + off[k];
    return TP_OK;
}

/* The executable of a step, with its staged inputs and outputs; the leader
 * first tells the workers (they run the same function on the same command). */
static tp_status prepare_step(tp_engine *e, const step_cmd *c, tp_exec **x, tp_tensor *in_t, tp_tensor *out_t,
                              tp_err *err)
{
    tp_status st = TP_OK;
    if (tp_rank_group_leads(e->rg))
        st = tp_rank_group_post(e->rg, c, sizeof *c, err);
    if (st == TP_OK && c->bucket >= 0)
        *x = e->buckets[c->bucket];
    else if (st == TP_OK)
        st = get_exact(e, c->batch, x, err);
    return st == TP_OK ? stage_layout(e, *x, in_t, out_t, err) : st;
}

/* Bytes per dim-0 row of a request tensor (0 when it has no rows). */
static size_t row_bytes(const tp_host_tensor *t)
{
    return t->ndim > 0 && t->shape[0] > 0 ? t->nbytes / (size_t)t->shape[0] : 0;
}

/* Rows [row, row + n) of the pieces' concatenation along dim 0 into dst:
 * each request's bytes go straight from where they are into the staging. */
static void stage_rows(char *dst, const tp_host_tensor *const *pieces, int n_parts, int64_t row, int64_t n)
{
    for (int p = 0; p < n_parts && n > 0; p++) {
        const tp_host_tensor *t = pieces[p];
        if (row >= t->shape[0]) {
            row -= t->shape[0];
            continue;
        }
        size_t rb = row_bytes(t);
        int64_t take = t->shape[0] - row < n ? t->shape[0] - row : n;
        copy_request_bytes(dst, (const char *)t->data + (size_t)row * rb, (size_t)take * rb);
        dst += (size_t)take * rb;
        n -= take;
        row = 0;
    }
}

/* The pieces of graph input i: one per request of the batch. */
static const tp_host_tensor *const *pieces_of(const tp_host_tensor *const *in, int i, int n_parts)
{
    return in + (size_t)i * (size_t)n_parts;
}

static int input_batched(const tp_engine *e, int i)
{
    return e->in_desc[i].ndim > 0 && e->in_desc[i].shape[0] < 0;
}

/* Rows [row, row+n) of every batched input into the staging, the rest of
 * the bucket zeroed (never another request's leftovers). */
static void stage_inputs(tp_engine *e, const tp_host_tensor *const *in, int n_parts, int64_t row, int64_t n,
                         tp_tensor *in_t)
{
    for (int i = 0; i < e->g->n_inputs; i++) {
        const tp_host_tensor *const *pieces = pieces_of(in, i, n_parts);
        if (input_batched(e, i)) {
            size_t rb = row_bytes(pieces[0]);
            stage_rows(in_t[i].data, pieces, n_parts, row, n);
            memset((char *)in_t[i].data + (size_t)n * rb, 0, (size_t)(in_t[i].shape[0] - n) * rb);
        } else {
            copy_request_bytes(in_t[i].data, pieces[0]->data, pieces[0]->nbytes);
        }
    }
}

/* Whether output i of a step fits its place in the results: a batched
 * output's rows (n * out_rows of them) are as long as the results' and
 * the step has at least that many; an output without batch rows is the
 * same size. */
static int fits_results(const tp_engine *e, int i, const tp_tensor *t, const tp_host_tensor *o, int64_t batch,
                        int64_t n)
{
    size_t bytes = (size_t)tp_tensor_numel(t) * tp_dtype_size(t->dtype);
    int64_t rows = e->out_rows[i];
    if (!rows)
        return bytes == o->nbytes;
    return t->ndim > 0 && t->shape[0] >= n * rows && t->shape[0] > 0 &&
           bytes / (size_t)t->shape[0] * (size_t)(batch * rows) == o->nbytes;
}

/* A step's ranks copy its outputs straight into the results, rows [row,
 * row + n) of a batch of `batch`, instead of into the staging: one copy
 * of each output fewer, and a 128-token GPT-2 request's logits are 25 MB.
 * A batched output gives the step's first n * out_rows rows, so a
 * bucket's padded rows are never copied (exec.c's copy_outputs cuts
 * them); an output without batch rows goes there from the first piece
 * only, later pieces leave theirs in the staging. Not with shared
 * staging: a rank process writes nowhere else. 0: every output stays in
 * the staging (unstage_outputs). */
static int results_in_place(const tp_engine *e, tp_tensor *out_t, const tp_host_tensor *outs, int64_t batch,
                            int64_t row, int64_t n)
{
    int no = e->g->n_outputs;
    if (e->stage_shared)
        return 0;
    for (int i = 0; i < no; i++)
        if (!fits_results(e, i, &out_t[i], &outs[i], batch, n))
            return 0;
    for (int i = 0; i < no; i++) {
        if (e->out_rows[i]) {
            size_t rb = outs[i].nbytes / (size_t)batch;
            out_t[i].data = (char *)outs[i].data + (size_t)row * rb;
            out_t[i].shape[0] = n * e->out_rows[i];
        } else if (row == 0) {
            out_t[i].data = outs[i].data;
        }
    }
    return 1;
}

static tp_status run_exact(tp_engine *e, const tp_host_tensor *const *in, int n_parts, int64_t batch,
                           tp_host_tensor *outs, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    tp_tensor in_t[ni + 1], out_t[no + 1];
    tp_exec *x;
    step_cmd c = {.bucket = -1, .batch = batch};
    tp_status st = prepare_step(e, &c, &x, in_t, out_t, err);
    if (st == TP_OK)
        st = alloc_results(e, x, batch, outs, err);
    if (st != TP_OK)
        return st;
    stage_inputs(e, in, n_parts, 0, batch, in_t); /* the exact batch: nothing to pad */
    int direct = results_in_place(e, out_t, outs, batch, 0, batch);
    tp_exec_stats xs = {0};
    st = tp_exec_run(x, in_t, out_t, &xs, err);
    add_run_stats(e, &xs, -1);
    for (int i = 0; st == TP_OK && !direct && i < no; i++)
        memcpy(outs[i].data, out_t[i].data, outs[i].nbytes);
    return st;
}

static void unstage_outputs(tp_engine *e, const tp_tensor *out_t, int64_t batch, int64_t row, int64_t n,
                            tp_host_tensor *outs)
{
    for (int i = 0; i < e->g->n_outputs; i++) {
        tp_host_tensor *o = &outs[i];
        if (e->out_rows[i]) {
            size_t rb = o->nbytes / (size_t)batch;
            memcpy((char *)o->data + (size_t)row * rb, out_t[i].data, (size_t)n * rb);
        } else if (row == 0) {
            memcpy(o->data, out_t[i].data, o->nbytes);
        }
    }
}

static tp_status run_padded(tp_engine *e, const tp_host_tensor *const *in, int n_parts, int64_t batch,
                            tp_host_tensor *outs, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    tp_tensor in_t[ni + 1], out_t[no + 1];
    tp_status st = alloc_results(e, NULL, batch, outs, err);
    int64_t max = e->bucket_size[e->n_buckets - 1];
    for (int64_t row = 0; st == TP_OK && row < batch; row += max) {
        int64_t n = batch - row < max ? batch - row : max;
        int k = bucket_for(e, n);
        tp_exec *x;
        step_cmd c = {.bucket = k, .batch = e->bucket_size[k]};
        st = prepare_step(e, &c, &x, in_t, out_t, err);
        if (st != TP_OK)
            break;
        stage_inputs(e, in, n_parts, row, n, in_t);
        int direct = results_in_place(e, out_t, outs, batch, row, n);
        tp_exec_stats xs = {0};
        st = tp_exec_run(x, in_t, out_t, &xs, err);
        add_run_stats(e, &xs, k);
        if (st == TP_OK && !direct)
            unstage_outputs(e, out_t, batch, row, n, outs);
    }
    return st;
}

/* Runs inputs already matched to the graph (graph order, batch found). */
static tp_status run_locked(tp_engine *e, const tp_host_tensor *const *pieces, int n_parts, int64_t batch,
                            tp_host_tensor *outs, tp_err *err)
{
    if (tp_graph_batch_sharded(e->g) && batch % e->g->world_size != 0 && !e->padded)
        return tp_fail(err, TP_INVALID, "batch %lld is not divisible by world_size %d (the batch is sharded across ranks)",
                       (long long)batch, e->g->world_size);
    tp_status st = e->padded ? run_padded(e, pieces, n_parts, batch, outs, err)
                             : run_exact(e, pieces, n_parts, batch, outs, err);
    if (st == TP_OK) {
        e->stats.requests++;
        e->stats.rows += (uint64_t)batch;
    }
    return st;
}

static tp_status run_request(tp_engine *e, const tp_host_tensor *const *pieces, int n_parts, int64_t batch,
                             tp_host_tensor **outputs, int *n_outputs, tp_err *err)
{
    *outputs = NULL;
    *n_outputs = 0;
    tp_host_tensor *outs = tp_zalloc((size_t)e->g->n_outputs + 1, sizeof *outs);
    if (!outs)
        return tp_fail(err, TP_NOMEM, "out of memory");
    pthread_mutex_lock(&e->mu);
    const char *lost = atomic_load(&e->lost);
    tp_status st = lost ? tp_fail(err, TP_UNAVAILABLE, "%s", lost) : run_locked(e, pieces, n_parts, batch, outs, err);
    if (st != TP_OK)
        note_lost(e, err);
    pthread_mutex_unlock(&e->mu);
    if (st != TP_OK) {
        tp_host_tensors_free(outs, e->g->n_outputs);
        return st;
    }
    *outputs = outs;
    *n_outputs = e->g->n_outputs;
    return TP_OK;
}

tp_status tp_engine_infer(tp_engine *e, const tp_host_tensor *inputs, int n_inputs,
                          tp_host_tensor **outputs, int *n_outputs, tp_err *err)
{
    *outputs = NULL;
    *n_outputs = 0;
    const tp_host_tensor *ordered[e->g->n_inputs + 1];
    int64_t batch = 0;
    tp_status st = match_inputs(e, inputs, n_inputs, ordered, &batch, err);
    return st == TP_OK ? run_request(e, ordered, 1, batch, outputs, n_outputs, err) : st;
}

tp_status tp_engine_infer_parts(tp_engine *e, const tp_host_tensor *const *pieces, int n_parts, int64_t batch,
                                tp_host_tensor **outputs, int *n_outputs, tp_err *err)
{
    *outputs = NULL;
    *n_outputs = 0;
    if (n_parts < 1)
        return tp_fail(err, TP_INVALID, "a batch of %d requests: nothing to run", n_parts);
    for (int i = 0; n_parts > 1 && i < e->g->n_inputs; i++)
        if (!input_batched(e, i))
            return tp_fail(err, TP_INVALID, "input '%s' has no batch dim: %d requests cannot share one run",
                           e->in_desc[i].name, n_parts);
    return run_request(e, pieces, n_parts, batch, outputs, n_outputs, err);
}

tp_status tp_engine_check_inputs(tp_engine *e, const tp_host_tensor *inputs, int n_inputs, int64_t *batch,
                                 tp_err *err)
{
    const tp_host_tensor *ordered[e->g->n_inputs + 1];
    *batch = 0;
    tp_status st = match_inputs(e, inputs, n_inputs, ordered, batch, err);
    return st == TP_OK ? tp_check_request_values(e->g, ordered, err) : st;
}

tp_status tp_engine_check_decoded(tp_engine *e, const tp_host_tensor *inputs, int64_t *batch, tp_err *err)
{
    const tp_host_tensor *ordered[e->g->n_inputs + 1];
    for (int i = 0; i < e->g->n_inputs; i++)
        ordered[i] = &inputs[i];
    tp_status st = find_batch(e, ordered, batch, err);
    return st == TP_OK ? tp_check_request_values(e->g, ordered, err) : st;
}

void tp_engine_prewake(tp_engine *e) { tp_rank_group_prewake(e->rg); }

int tp_engine_batchable(const tp_engine *e)
{
    if (!e->padded)
        return 0;
    for (int i = 0; i < e->g->n_inputs; i++)
        if (e->in_desc[i].ndim == 0 || e->in_desc[i].shape[0] >= 0)
            return 0;
    for (int i = 0; i < e->g->n_outputs; i++)
        if (!e->out_rows[i])
            return 0;
    return 1;
}

int64_t tp_engine_output_rows(const tp_engine *e, int i) { return e->out_rows[i]; }

void tp_engine_get_stats(tp_engine *e, tp_engine_stats *out)
{
    pthread_mutex_lock(&e->mu);
    *out = e->stats;
    pthread_mutex_unlock(&e->mu);
    out->world_size = e->g->world_size;
    out->rank_processes = tp_rank_group_shared(e->rg) != NULL;
    out->rank_group_up = !atomic_load(&e->lost);
    out->serial_steps = tp_rank_group_serial_steps(e->rg);
    out->serial_step_max_us = tp_rank_group_serial_max_us(e->rg);
}

int tp_engine_padded(const tp_engine *e, const char **why)
{
    if (why)
        *why = e->padded ? "" : e->why_exact;
    return e->padded;
}

void tp_host_tensors_free(tp_host_tensor *t, int n)
{
    if (!t)
        return;
    for (int i = 0; i < n; i++) {
        if (t[i].owner)
            tp_host_block_release(t[i].owner);
        else
            free(t[i].data);
    }
    free(t);
}

/* Called with mu held (one step's outcome at a time): publishes a
 * lost group or a dead backend for tp_engine_lost, which must not wait for
 * a running batch. After a non-benign failed step every process's backend
 * is aborted (the group's fail hook), so each one's own backend reports
 * dead; the step's error (step_err, NULL when none) names the rank that
 * failed first and why, which the local backend's own reason (here maybe
 * just "revoked") may not. */
static void note_lost(tp_engine *e, const tp_err *step_err)
{
    if (atomic_load(&e->lost))
        return;
    const char *lost = tp_rank_group_lost(e->rg), *dead = lost ? NULL : tp_backend_dead(e->b);
    if (dead) {
        snprintf(e->dead_reason, sizeof e->dead_reason, "backend '%s' failed for good: %s", e->b->iface->name,
                 step_err && step_err->msg[0] ? step_err->msg : dead);
        lost = e->dead_reason;
    }
    atomic_store(&e->lost, lost);
    if (lost && e->on_lost)
        e->on_lost(e->on_lost_arg);
}

const char *tp_engine_lost(tp_engine *e)
{
    /* a running batch holds mu and notes a loss itself: never wait for it,
     * but say what the group knows (its peer watcher may have found a
     * dead process the batch has not met yet) */
    if (!atomic_load(&e->lost)) {
        if (pthread_mutex_trylock(&e->mu) != 0)
            return e->rg ? tp_rank_group_lost_known(e->rg) : NULL;
        note_lost(e, NULL);
        pthread_mutex_unlock(&e->mu);
    }
    return atomic_load(&e->lost);
}

int tp_engine_must_exit(tp_engine *e) { return e && tp_backend_must_exit(e->b); }

int tp_engine_steps_may_stall(const tp_engine *e)
{
    return (e->rg && tp_rank_group_shared(e->rg) != NULL) || e->b->kind->caps->dma_input_copies;
}

int tp_engine_step_pending(tp_engine *e, int *ranks, int cap)
{
    return e->rg ? tp_rank_group_pending(e->rg, ranks, cap) : -1;
}

tp_status tp_engine_follow(tp_engine *e, tp_err *err)
{
    int ni = e->g->n_inputs, no = e->g->n_outputs;
    tp_tensor in_t[ni + 1], out_t[no + 1];
    for (;;) {
        step_cmd c;
        size_t len = 0;
        int quit;
        tp_status st = tp_rank_group_next(e->rg, &c, sizeof c, &len, &quit, err);
        if (quit)
            return TP_OK;
        if (st == TP_OK && (len != sizeof c || c.bucket >= e->n_buckets || (c.bucket < 0 && c.batch < 1) ||
                            (c.bucket >= 0 && !e->padded)))
            st = tp_fail(err, TP_INTERNAL, "malformed step from the leader (bucket %d, batch %lld)", c.bucket,
                         (long long)c.batch);
        if (st != TP_OK)
            return st;
        tp_exec *x;
        st = prepare_step(e, &c, &x, in_t, out_t, err);
        if (st == TP_OK)
            st = tp_exec_run(x, in_t, out_t, NULL, err);
        /* a failed batch is the leader's to answer; a lost group ends us, and
         * so does a backend that can never run again (the process exits:
         * its device may still run work nothing may wait for) */
        if (st != TP_OK && (tp_rank_group_lost(e->rg) || tp_backend_dead(e->b)))
            return st;
    }
}
