/* The model repository extension (http_ctx.h): one model, for the life
 * of the process. */
#include <string.h>

#include "http_ctx.h"

/* The one model and its state; [] before its graph has been read (its
 * name comes from the graph). */
enum MHD_Result http_post_repository_index(tp_http_ctx *h, req_ctx *r)
{
    tp_err e;
    int ready_only;
    if (tp_kserve_parse_repository_index(r->body ? r->body : "", r->len, &ready_only, &e) != TP_OK)
        return http_reply_error(h, r, 400, "%s", e.msg);
    int broken = atomic_load(&h->broken), loaded = atomic_load(&h->loaded);
    const char *state = broken ? "UNAVAILABLE" : atomic_load(&h->state) == SRV_DRAINING ? "UNLOADING" : "READY";
    if (!loaded || (ready_only && !http_is_ready(h)))
        return http_reply_json(h, r, 200, tp_kserve_repository_index(NULL, NULL, NULL, NULL));
    return http_reply_json(h, r, 200, tp_kserve_repository_index(h->model.name, h->model.version, state,
                                                            broken ? h->broken_msg : ""));
}

/* Triton without explicit model control refuses both too: the model is
 * the graph serve started with, for the life of the process. */
static enum MHD_Result refuse_repository_change(tp_http_ctx *h, req_ctx *r, const char *done)
{
    return http_reply_error(h, r, 400, "model '%s' cannot be %s: tpserve serves the graph it was started "
                       "with for the life of the process (restart it to serve another graph or new "
                       "weights)", r->args.model, done);
}

enum MHD_Result http_post_repository_load(tp_http_ctx *h, req_ctx *r)
{
    return refuse_repository_change(h, r, "loaded");
}

enum MHD_Result http_post_repository_unload(tp_http_ctx *h, req_ctx *r)
{
    return refuse_repository_change(h, r, "unloaded");
}
