/* The logging and trace extensions' settings (http_ctx.h). */
#include <string.h>

#include "http_ctx.h"
#include "log_settings.h"

enum MHD_Result http_logging_settings(tp_http_ctx *h, req_ctx *r)
{
    if (strcmp(r->method, "POST") != 0)
        return http_reply_json(h, r, 200, tp_log_settings_json());
    tp_err e;
    char *doc = NULL;
    tp_status st = tp_log_settings_apply(r->body ? r->body : "", r->len, &doc, &e);
    if (st != TP_OK)
        return http_reply_error(h, r, st == TP_NOMEM ? 503 : 400, "%s", e.msg);
    return http_reply_json(h, r, 200, doc);
}

/* GET/POST /v2[/models/M]/trace/setting: the global or the model's */
enum MHD_Result http_trace_settings(tp_http_ctx *h, req_ctx *r)
{
    int model = r->route->flags & ROUTE_MODEL;
    if (strcmp(r->method, "POST") != 0)
        return http_reply_json(h, r, 200, tp_trace_settings_json(h->trace, model));
    tp_err e;
    char *doc = NULL;
    tp_status st = tp_trace_update(h->trace, model, r->body ? r->body : "", r->len, &doc, &e);
    if (st != TP_OK)
        return http_reply_error(h, r, st == TP_NOMEM ? 503 : 400, "%s", e.msg);
    return http_reply_json(h, r, 200, doc);
}
