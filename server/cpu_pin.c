#include "cpu_pin.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SCHEDSTAT "/proc/thread-self/schedstat"

int tp_pin_window_starved(const tp_pin_window *w)
{
    return w->wall > 0 && w->wait >= w->run && 4 * w->wait >= w->wall && 4 * w->other_idle >= w->wall;
}

/* ---- the policy ---------------------------------------------------------- */

static void pinned_since(tp_pin_policy *pp, int64_t now_ms)
{
    pp->pinned = 1;
    pp->strikes = 0;
    pp->pinned_ms = now_ms;
}

void tp_pin_policy_init(tp_pin_policy *pp, int64_t now_ms)
{
    memset(pp, 0, sizeof *pp);
    pp->hold_ms = TP_PIN_HOLD_MIN_MS;
    pinned_since(pp, now_ms);
}

tp_pin_change tp_pin_policy_window(tp_pin_policy *pp, int starved, int64_t now_ms)
{
    if (!pp->pinned)
        return TP_PIN_SAME;
    if (!starved) {
        pp->strikes = 0;
        return TP_PIN_SAME;
    }
    if (++pp->strikes < TP_PIN_STRIKES)
        return TP_PIN_SAME;
    /* Starved again soon after the last spell: the cause is still there,
     * so stay away longer; after a long calm, start over. */
    if (now_ms - pp->pinned_ms >= TP_PIN_HOLD_MAX_MS)
        pp->hold_ms = TP_PIN_HOLD_MIN_MS;
    pp->pinned = 0;
    pp->until_ms = now_ms + pp->hold_ms;
    pp->hold_ms = pp->hold_ms * 2 < TP_PIN_HOLD_MAX_MS ? pp->hold_ms * 2 : TP_PIN_HOLD_MAX_MS;
    return TP_PIN_UNPINNED;
}

tp_pin_change tp_pin_policy_poll(tp_pin_policy *pp, int64_t now_ms)
{
    if (pp->pinned || now_ms < pp->until_ms)
        return TP_PIN_SAME;
    pinned_since(pp, now_ms);
    return TP_PIN_PINNED;
}

/* ---- reading the system -------------------------------------------------- */

int tp_cpu_pin_parse_idle(const char *stat, const int *cpus, int n, uint64_t *idle)
{
    int missing = n;
    for (int i = 0; i < n; i++)
        idle[i] = UINT64_MAX;
    for (const char *line = stat; line && *line && missing > 0;) {
        int cpu;
        unsigned long long user, nice, sys, idl, iow;
        /* "cpu  ..." (all CPUs) has no number: %d would read its first field */
        if (strncmp(line, "cpu", 3) == 0 && line[3] >= '0' && line[3] <= '9' &&
            sscanf(line, "cpu%d %llu %llu %llu %llu %llu", &cpu, &user, &nice, &sys, &idl, &iow) == 6)
            for (int i = 0; i < n; i++)
                if (cpus[i] == cpu && idle[i] == UINT64_MAX) {
                    idle[i] = (uint64_t)(idl + iow);
                    missing--;
                }
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return missing ? -1 : 0;
}

/* Reads at most cap - 1 bytes of path into buf; its length, or -1 (errno). */
static ssize_t read_text(const char *path, char *buf, size_t cap)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    size_t len = 0;
    ssize_t got;
    while (len < cap - 1 && (got = read(fd, buf + len, cap - 1 - len)) != 0) {
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0) {
            int e = errno;
            close(fd);
            errno = e;
            return -1;
        }
        len += (size_t)got;
    }
    close(fd);
    buf[len] = '\0';
    return (ssize_t)len;
}

/* The calling thread's time on its CPU and waiting for it, ns. */
static int read_schedstat(int64_t *run, int64_t *wait, char *why, size_t why_len)
{
    char text[128];
    long long r, w;
    if (read_text(SCHEDSTAT, text, sizeof text) < 0) {
        snprintf(why, why_len, "%s: %s", SCHEDSTAT, strerror(errno));
        return -1;
    }
    if (sscanf(text, "%lld %lld", &r, &w) != 2) {
        snprintf(why, why_len, "%s: no run and wait times in \"%.40s\"", SCHEDSTAT, text);
        return -1;
    }
    *run = r;
    *wait = w;
    return 0;
}

int tp_cpu_pin_watchable(char *why, size_t why_len)
{
    int64_t run, wait;
    return read_schedstat(&run, &wait, why, why_len) == 0;
}

/* ---- the pin --------------------------------------------------------------- */

struct tp_cpu_pin {
    int cpu;
    cpu_set_t allowed;
    int n_other;        /* the other CPUs the thread may use */
    int *other;
    uint64_t *idle[2];  /* their idle ticks at the window's start, and now */
    char *stat;         /* /proc/stat's first lines, through the last CPU we read */
    size_t stat_cap;
    int64_t ns_per_tick;
    tp_pin_policy policy;
    int started, gave_up;
    int64_t window_ms, run0, wait0;
};

tp_cpu_pin *tp_cpu_pin_create(int cpu, const cpu_set_t *allowed)
{
    tp_cpu_pin *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->cpu = cpu;
    p->allowed = *allowed;
    int n = CPU_COUNT(allowed), top = cpu;
    p->other = malloc((size_t)(n + 1) * sizeof *p->other);
    p->idle[0] = malloc((size_t)(n + 1) * sizeof *p->idle[0]);
    p->idle[1] = malloc((size_t)(n + 1) * sizeof *p->idle[1]);
    for (int c = 0; p->other && c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, allowed) && c != cpu) {
            p->other[p->n_other++] = c;
            top = c;
        }
    /* a CPU's line is under 200 bytes; they come first, in order */
    p->stat_cap = (size_t)(top + 2) * 256;
    p->stat = malloc(p->stat_cap);
    long hz = sysconf(_SC_CLK_TCK);
    p->ns_per_tick = 1000000000 / (hz > 0 ? hz : 100);
    if (!p->other || !p->idle[0] || !p->idle[1] || !p->stat) {
        tp_cpu_pin_free(p);
        return NULL;
    }
    return p;
}

void tp_cpu_pin_free(tp_cpu_pin *p)
{
    if (!p)
        return;
    free(p->other);
    free(p->idle[0]);
    free(p->idle[1]);
    free(p->stat);
    free(p);
}

static int read_idle(tp_cpu_pin *p, uint64_t *idle, char *why, size_t why_len)
{
    if (read_text("/proc/stat", p->stat, p->stat_cap) < 0) {
        snprintf(why, why_len, "/proc/stat: %s", strerror(errno));
        return -1;
    }
    if (tp_cpu_pin_parse_idle(p->stat, p->other, p->n_other, idle) != 0) {
        snprintf(why, why_len, "/proc/stat: a line per CPU this process may use was not there");
        return -1;
    }
    return 0;
}

/* The CPUs the thread has while pinned (pinned) or unpinned. */
static cpu_set_t cpus_of(const tp_cpu_pin *p, int pinned)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(p->cpu, &one);
    return pinned ? one : p->allowed;
}

static int set_cpus(tp_cpu_pin *p, int pinned, char *why, size_t why_len)
{
    cpu_set_t want = cpus_of(p, pinned);
    int rc = pthread_setaffinity_np(pthread_self(), sizeof want, &want);
    if (rc != 0)
        snprintf(why, why_len, "%s CPU %d: %s", pinned ? "pinning to" : "unpinning from", p->cpu, strerror(rc));
    return rc == 0 ? 0 : -1;
}

static int start_window(tp_cpu_pin *p, int64_t now_ms, char *why, size_t why_len)
{
    p->window_ms = now_ms;
    if (read_schedstat(&p->run0, &p->wait0, why, why_len) != 0)
        return -1;
    return read_idle(p, p->idle[0], why, why_len);
}

/* The window since start_window, and the next one started; *idlest: the
 * other CPU that idled most. */
static int end_window(tp_cpu_pin *p, int64_t now_ms, tp_pin_window *w, int *idlest, char *why, size_t why_len)
{
    int64_t run, wait;
    if (read_schedstat(&run, &wait, why, why_len) != 0 || read_idle(p, p->idle[1], why, why_len) != 0)
        return -1;
    *w = (tp_pin_window){.wall = (now_ms - p->window_ms) * 1000000, .run = run - p->run0, .wait = wait - p->wait0};
    *idlest = -1;
    for (int i = 0; i < p->n_other; i++) {
        int64_t idle = (int64_t)(p->idle[1][i] - p->idle[0][i]) * p->ns_per_tick;
        if (idle > w->other_idle || *idlest < 0) {
            w->other_idle = idle;
            *idlest = p->other[i];
        }
    }
    uint64_t *t = p->idle[0];
    p->idle[0] = p->idle[1];
    p->idle[1] = t;
    p->window_ms = now_ms;
    p->run0 = run;
    p->wait0 = wait;
    return 0;
}

/* The thread still has the CPUs this pin last gave it (or, before its
 * first tick, those it was created for): someone who moved it since
 * (taskset -p on a running server) chose its CPUs, and a pin must not undo
 * that. Otherwise it is left as it is, for good. */
static int still_ours(tp_cpu_pin *p, int pinned, char *why, size_t why_len)
{
    cpu_set_t now, want = cpus_of(p, pinned);
    CPU_ZERO(&now);
    int rc = pthread_getaffinity_np(pthread_self(), sizeof now, &now);
    if (rc == 0 && CPU_EQUAL(&now, &want))
        return 1;
    p->gave_up = 1;
    if (rc != 0)
        snprintf(why, why_len, "its CPUs: %s; left as they are", strerror(rc));
    else
        snprintf(why, why_len, "its CPUs changed since %s (taskset?); left as they are%s",
                 !p->started ? "startup" : pinned ? "it was pinned" : "it was unpinned", pinned ? "" : ", not pinned");
    return 0;
}

/* Something failed: a thread nobody watches must not stay pinned. */
static tp_pin_change give_up(tp_cpu_pin *p, char *why, size_t why_len)
{
    char unpin[96] = "";
    p->gave_up = 1;
    set_cpus(p, 0, unpin, sizeof unpin);
    size_t at = strlen(why);
    snprintf(why + at, why_len - at, "; unpinned for good%s%s", unpin[0] ? ", but " : "", unpin);
    return TP_PIN_UNPINNED;
}

/* The unpinned thread pinned, and its first window begun: TP_PIN_PINNED;
 * TP_PIN_LEFT when someone else set its CPUs meanwhile; give_up's answer
 * when a call failed. */
static tp_pin_change pin(tp_cpu_pin *p, int64_t now_ms, char *why, size_t why_len)
{
    if (!still_ours(p, 0, why, why_len))
        return TP_PIN_LEFT;
    if (set_cpus(p, 1, why, why_len) != 0 || start_window(p, now_ms, why, why_len) != 0)
        return give_up(p, why, why_len);
    return TP_PIN_PINNED;
}

tp_pin_change tp_cpu_pin_tick(tp_cpu_pin *p, int64_t now_ms, char *why, size_t why_len)
{
    if (p->gave_up)
        return TP_PIN_SAME;
    if (!p->started) {
        tp_pin_policy_init(&p->policy, now_ms);
        tp_pin_change c = pin(p, now_ms, why, why_len);
        p->started = 1; /* after pin: until now a move dates from startup */
        return c == TP_PIN_PINNED ? TP_PIN_SAME : c;
    }
    if (!p->policy.pinned) {
        if (tp_pin_policy_poll(&p->policy, now_ms) != TP_PIN_PINNED)
            return TP_PIN_SAME;
        tp_pin_change c = pin(p, now_ms, why, why_len);
        if (c == TP_PIN_PINNED)
            snprintf(why, why_len, "pinned to CPU %d again: its time unpinned is over", p->cpu);
        return c;
    }
    if (now_ms - p->window_ms < TP_PIN_WINDOW_MS)
        return TP_PIN_SAME;
    if (!still_ours(p, 1, why, why_len))
        return TP_PIN_UNPINNED;
    tp_pin_window w;
    int idlest;
    if (end_window(p, now_ms, &w, &idlest, why, why_len) != 0)
        return give_up(p, why, why_len);
    if (tp_pin_policy_window(&p->policy, tp_pin_window_starved(&w), now_ms) != TP_PIN_UNPINNED)
        return TP_PIN_SAME;
    if (set_cpus(p, 0, why, why_len) != 0)
        return give_up(p, why, why_len);
    snprintf(why, why_len,
             "in %lld ms it waited %lld ms for CPU %d and ran %lld, while CPU %d idled %lld ms; "
             "unpinned for %lld ms",
             (long long)(w.wall / 1000000), (long long)(w.wait / 1000000), p->cpu, (long long)(w.run / 1000000),
             idlest, (long long)(w.other_idle / 1000000), (long long)(p->policy.until_ms - now_ms));
    return TP_PIN_UNPINNED;
}
