/* spin_wait.c — bounded spinning and futexes (see spin_wait.h). */
#include "spin_wait.h"
#include "sysfile.h"

#include <limits.h>
#include <linux/futex.h>
#include <sched.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"

/* Time is read every CLOCK_EVERY polls: a vDSO clock read costs about two
 * pause instructions, so this bounds the spin by time at a few percent. */
#define CLOCK_EVERY 16
/* A spin that runs out costs the whole budget; skipping up to 64 waits
 * between probes caps that at under 1 us per wait at a site that never
 * pays. The moving average weighs the last spin 1/8: some six misses in a
 * row start the skipping. */
#define SPIN_SKIP_MAX 64
#define MISS_ONE 1024
#define MISS_WEIGHT 8

/* One polling pause: the CPU's spin-loop hint (x86 pause, Arm yield). */
static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* cgroup v2's "QUOTA PERIOD" (or "max PERIOD": no quota) as whole cores,
 * rounded up; 0 when there is no quota or no file. */
static int quota_cores(void)
{
    long long v[2]; /* "max PERIOD" reads no integer */
    if (tp_sysfile_ints("/sys/fs/cgroup/cpu.max", v, 2) != 2 || v[0] <= 0 || v[1] <= 0)
        return 0;
    return (int)((v[0] + v[1] - 1) / v[1]);
}

int tp_spin_cores(void)
{
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : (int)sysconf(_SC_NPROCESSORS_ONLN);
    int quota = quota_cores();
    if (quota > 0 && quota < cores)
        cores = quota;
    return cores > 0 ? cores : 1;
}

static int64_t monotonic_ns(void) { return tp_now_ns(); }
static int64_t (*spin_now)(void) = monotonic_ns;

void tp_spin_set_clock(int64_t (*now)(void)) { spin_now = now ? now : monotonic_ns; }

int64_t tp_spin_budget(int parties, int cores) { return parties <= cores ? TP_SPIN_NS : 0; }

int tp_spin_until(int (*done)(const void *arg), const void *arg, int64_t budget_ns)
{
    int64_t end = 0;
    for (unsigned i = 0;; i++) {
        int d = done(arg);
        if (d || budget_ns <= 0)
            return d;
        if (i % CLOCK_EVERY == 0) {
            int64_t now = spin_now();
            if (!end)
                end = now + budget_ns;
            else if (now >= end)
                return 0;
        }
        cpu_relax();
    }
}

int tp_spin_site_until(tp_spin_site *site, int (*done)(const void *arg), const void *arg, int64_t budget_ns)
{
    if (done(arg))
        return 1;
    if (budget_ns <= 0)
        return 0;
    if (site->skip > 0) {
        site->skip--;
        return 0;
    }
    /* the clock only where the stretch needs it: most sites (in-step
     * waits) never stretch, and most of their spins pay */
    int64_t budget = budget_ns << site->stretch, t0 = site->stretch ? spin_now() : 0;
    int ok = tp_spin_until(done, arg, budget);
    if (ok && site->stretch > 0 && spin_now() - t0 <= budget_ns)
        site->stretch--;
    if (!ok) { /* tp_spin_site_ended may take this miss back */
        site->before[0] = site->misses;
        site->before[1] = site->backoff;
        site->before[2] = site->skip;
        site->ran_out = spin_now();
        site->spun = budget;
    }
    int m = site->misses;
    site->misses = (uint16_t)(m + ((ok ? 0 : MISS_ONE) - m) / MISS_WEIGHT);
    if (site->misses <= MISS_ONE / 2)
        site->backoff = 0;
    else if (ok) /* a probe paid: probe again soon */
        site->backoff = 1;
    else if ((site->backoff = site->backoff ? site->backoff * 2 : 1) > SPIN_SKIP_MAX)
        site->backoff = SPIN_SKIP_MAX;
    site->skip = site->backoff;
    return ok;
}

void tp_spin_site_ended(tp_spin_site *site)
{
    if (!site->ran_out)
        return;
    int64_t late = spin_now() - site->ran_out;
    site->ran_out = 0;
    if (late > site->spun)
        return;
    site->misses = site->before[0];
    site->backoff = site->before[1];
    site->skip = site->before[2];
    if (site->stretch < TP_SPIN_STRETCH_MAX)
        site->stretch++;
}

void tp_futex_wait(_Atomic uint32_t *w, uint32_t expected, int timeout_ms, int shared)
{
    struct timespec ts = {timeout_ms / 1000, (long)(timeout_ms % 1000) * 1000000L};
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAIT | (shared ? 0 : FUTEX_PRIVATE_FLAG), expected,
            timeout_ms < 0 ? NULL : &ts, NULL, 0);
}

void tp_futex_wake(_Atomic uint32_t *w, int shared)
{
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE | (shared ? 0 : FUTEX_PRIVATE_FLAG), INT_MAX, NULL, NULL, 0);
}

void tp_futex_sleep(_Atomic uint32_t *w, uint32_t expected, _Atomic uint32_t *sleepers, int timeout_ms, int shared)
{
    atomic_fetch_add(sleepers, 1);
    tp_futex_wait(w, expected, timeout_ms, shared);
    atomic_fetch_sub(sleepers, 1);
}

void tp_futex_wake_sleepers(_Atomic uint32_t *w, _Atomic uint32_t *sleepers, int shared)
{
    if (atomic_load(sleepers) > 0)
        tp_futex_wake(w, shared);
}
