/* route.h — request paths matched against route patterns, so the server's
 * routes are one table of (methods, pattern, handler) rows (http_request.c).
 *
 * A pattern is a path of literal segments and captures: {model} {region}.
 * A {model} segment may be followed in the path by "versions/{version}"
 * (every KServe model route takes it). Empty segments are ignored, so a
 * trailing or doubled slash matches the same. */
#ifndef TP_ROUTE_H
#define TP_ROUTE_H

#define TP_ROUTE_NAME_MAX 256

typedef struct {
    char model[TP_ROUTE_NAME_MAX];
    char version[TP_ROUTE_NAME_MAX];
    int has_version;
    char region[TP_ROUTE_NAME_MAX];
} tp_route_args;

/* 1 when path matches pattern (args filled), 0 otherwise (args undefined). */
int tp_route_match(const char *pattern, const char *path, tp_route_args *args);

/* 1 when method is one of allow ("GET, HEAD": the Allow header's form). */
int tp_route_method_allowed(const char *allow, const char *method);

#endif
