/* serial_policy.c — see serial_policy.h. */
#include "serial_policy.h"

void tp_serial_policy_init(tp_serial_policy *p, int64_t max_ns, int ranks)
{
    *p = (tp_serial_policy){.max_ns = max_ns, .ranks = ranks, .serial = 1, .probe_every = TP_SERIAL_PROBE_FIRST};
}

/* A serial step may run while some measure says it stays under max_ns:
 * its own average, or the threads' average times the ranks (an upper bound
 * of the work, the one that lets a serial step back in once the steps have
 * become short). With nothing measured yet it is tried. */
static int serial_allowed(const tp_serial_policy *p)
{
    const int64_t *a = p->avg_ns;
    if (!a[0] && !a[1])
        return 1;
    return (a[1] && a[1] <= p->max_ns) || (a[0] && a[0] * p->ranks <= p->max_ns);
}

/* The next step's mode; *starts: it begins a probe (the other mode). */
static int choose(const tp_serial_policy *p, int *starts)
{
    *starts = 0;
    if (p->probe_left)
        return p->probe_mode;
    int allowed = serial_allowed(p), mode = p->serial && allowed;
    if (p->since_probe + 1 >= p->probe_every && (mode || allowed)) {
        *starts = 1;
        return !mode;
    }
    return mode;
}

int tp_serial_policy_peek(const tp_serial_policy *p)
{
    int starts;
    return choose(p, &starts);
}

int tp_serial_policy_next(tp_serial_policy *p)
{
    int starts, mode = choose(p, &starts);
    if (starts) {
        p->probe_left = TP_SERIAL_PROBE_STEPS;
        p->probe_mode = mode;
        p->since_probe = 0;
    } else if (!p->probe_left && ++p->since_probe >= p->probe_every) {
        p->since_probe = 0; /* no probe could run (serial over the limit) */
    }
    return mode;
}

/* The mode to run between probes. The other one must be faster by an
 * eighth to take over, so that two modes that are about as fast do not
 * trade places on every probe; with one mode measured, the current one
 * stays. */
static int faster_mode(const tp_serial_policy *p)
{
    int64_t t = p->avg_ns[0], s = p->avg_ns[1];
    if (!serial_allowed(p))
        return 0;
    if (!t || !s)
        return p->serial;
    return p->serial ? s <= t + t / 8 : s + s / 8 < t;
}

void tp_serial_policy_took(tp_serial_policy *p, int serial, int64_t ns)
{
    ns = ns > 0 ? ns : 1; /* 0 means "not measured" */
    if (p->probe_left) {
        if (--p->probe_left > 0)
            return; /* the probe's first step warms its mode up: not measured */
        /* the probe replaces an average that is probe_every steps old */
        p->avg_ns[serial != 0] = ns;
        int want = faster_mode(p);
        if (want != p->serial)
            p->probe_every = TP_SERIAL_PROBE_FIRST;
        else if (p->probe_every < TP_SERIAL_PROBE_LAST)
            p->probe_every *= 2;
        p->serial = want;
        return;
    }
    int64_t *a = &p->avg_ns[serial != 0];
    *a = *a ? (7 * *a + ns) / 8 : ns; /* an eighth of the way per step */
    p->serial = faster_mode(p);
}

void tp_serial_policies_init(tp_serial_policies *ps, int64_t max_ns, int ranks)
{
    for (int c = 0; c < TP_SERIAL_CLASSES; c++)
        tp_serial_policy_init(&ps->by_class[c], max_ns, ranks);
}

int tp_serial_class(int64_t rows)
{
    int c = 0;
    while (c < TP_SERIAL_CLASSES - 1 && rows > ((int64_t)1 << c))
        c++;
    return c;
}

tp_serial_policy *tp_serial_policies_for(tp_serial_policies *ps, int64_t rows)
{
    return &ps->by_class[tp_serial_class(rows)];
}
