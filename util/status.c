#include "status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

const char *tp_status_name(tp_status s)
{
    switch (s) {
#define TP_STATUS_NAME(name, http, desc) case TP_##name: return #name;
        TP_STATUS_MAP(TP_STATUS_NAME)
#undef TP_STATUS_NAME
    }
    return "UNKNOWN";
}

int tp_status_http(tp_status s)
{
    switch (s) {
#define TP_STATUS_HTTP(name, http, desc) case TP_##name: return http;
        TP_STATUS_MAP(TP_STATUS_HTTP)
#undef TP_STATUS_HTTP
    }
    return 500;
}

tp_status tp_fail(tp_err *err, tp_status s, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return s;
}

void tp_err_prefix(tp_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char prefix[512], old[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    snprintf(err->msg, sizeof err->msg, "%.500s%.520s", prefix, old);
}
