/* System shared memory regions, and the CUDA kind tpserve does not offer
 * (http_ctx.h). */
#include <stdlib.h>
#include <string.h>

#include "http_ctx.h"
#include "log.h"

static unsigned shm_http_code(tp_status st)
{
    return st == TP_NOMEM ? 503 : st == TP_IO ? 500 : 400;
}

/* /v2/systemsharedmemory[/region/R]/status */
enum MHD_Result http_get_shm_status(tp_http_ctx *h, req_ctx *r)
{
    tp_err e;
    tp_status st;
    char *doc = tp_shm_status_json(h->shm, r->args.region[0] ? r->args.region : NULL, &st, &e);
    if (!doc)
        return http_reply_error(h, r, shm_http_code(st), "%s", e.msg);
    return http_reply_json(h, r, 200, doc);
}

enum MHD_Result http_post_shm_register(tp_http_ctx *h, req_ctx *r)
{
    char key[256];
    uint64_t offset, size;
    tp_err e;
    if (!h->cfg->allow_client_shm)
        return http_reply_error(h, r, 400, "system shared memory is disabled on this server "
                           "(allow_client_shm 0)");
    tp_status st = tp_kserve_parse_shm_register(r->body ? r->body : "", r->len, key, sizeof key,
                                                &offset, &size, &e);
    if (st == TP_OK)
        st = tp_shm_register(h->shm, r->args.region, key, offset, size, &e);
    if (st != TP_OK)
        return http_reply_error(h, r, shm_http_code(st), "%s", e.msg);
    TP_LOG_I("system shared memory region '%s' registered: key %s, offset %llu, %llu bytes",
             r->args.region, key, (unsigned long long)offset, (unsigned long long)size);
    return http_reply_json(h, r, 200, strdup("{}"));
}

/* /v2/systemsharedmemory[/region/R]/unregister; requests still using a
 * region keep it mapped until they finish. */
enum MHD_Result http_post_shm_unregister(tp_http_ctx *h, req_ctx *r)
{
    tp_err e;
    tp_status st = tp_shm_unregister(h->shm, r->args.region[0] ? r->args.region : NULL, &e);
    if (st != TP_OK)
        return http_reply_error(h, r, shm_http_code(st), "%s", e.msg);
    return http_reply_json(h, r, 200, strdup("{}"));
}

/* CUDA shared memory is not offered (not listed in /v2's extensions), but
 * Triton's clients clean up both kinds (perf_analyzer unregisters all CUDA
 * regions on exit): there are never any, so status is empty, unregistering
 * all succeeds, and naming a region or registering one says why not. */
enum MHD_Result http_cuda_shm(tp_http_ctx *h, req_ctx *r)
{
    int all = !r->args.region[0], get = strcmp(r->method, "POST") != 0;
    if (get && all)
        return http_reply_json(h, r, 200, strdup("[]"));
    if (!get && all)
        return http_reply_json(h, r, 200, strdup("{}"));
    return http_reply_error(h, r, 400, "no CUDA shared memory region '%s': tpserve offers system "
                       "shared memory only", r->args.region);
}
