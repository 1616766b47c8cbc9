#include "route.h"

#include <string.h>

/* The next non-empty segment at *p: its start and length; 0 at the end. */
static size_t next_segment(const char **p, const char **seg)
{
    while (**p == '/')
        (*p)++;
    *seg = *p;
    size_t n = strcspn(*p, "/");
    *p += n;
    return n;
}

static int capture(char *dst, const char *seg, size_t n)
{
    if (n == 0 || n >= TP_ROUTE_NAME_MAX)
        return 0;
    memcpy(dst, seg, n);
    dst[n] = '\0';
    return 1;
}

static int literal(const char *seg, size_t n, const char *word)
{
    return strlen(word) == n && memcmp(seg, word, n) == 0;
}

int tp_route_match(const char *pattern, const char *path, tp_route_args *args)
{
    const char *pp = pattern, *up = path, *ps, *us;
    args->has_version = 0;
    for (;;) {
        size_t pn = next_segment(&pp, &ps), un = next_segment(&up, &us);
        if (pn == 0 || un == 0)
            return pn == 0 && un == 0;
        if (literal(ps, pn, "{region}")) {
            if (!capture(args->region, us, un))
                return 0;
        } else if (literal(ps, pn, "{model}")) {
            if (!capture(args->model, us, un))
                return 0;
            const char *save = up, *vs;
            size_t vn = next_segment(&up, &vs);
            if (literal(vs, vn, "versions")) {
                vn = next_segment(&up, &vs);
                if (!capture(args->version, vs, vn))
                    return 0;
                args->has_version = 1;
            } else {
                up = save;
            }
        } else if (pn != un || memcmp(ps, us, pn) != 0) {
            return 0;
        }
    }
}

int tp_route_method_allowed(const char *allow, const char *method)
{
    size_t n = strlen(method);
    for (const char *p = allow; *p;) {
        size_t len = strcspn(p, ", ");
        if (len == n && memcmp(p, method, n) == 0)
            return 1;
        p += len;
        p += strspn(p, ", ");
    }
    return 0;
}
