/* wake_cost — what one thread waking another costs on this machine, for
 * the header of `make bench-http`: the ratios there depend on it. A
 * batching server makes its client wait for answers and be woken about
 * once a batch; on a virtual machine a wake-up can be an interrupt through
 * the hypervisor (server/README.md at 27cb4dd, "An Intel draw of the VM").
 *
 * Two threads pass a token back and forth, each sleeping until it has it:
 * through a futex, and as one byte over loopback TCP (a blocking recv, as
 * a client waiting for an answer). A round trip is two wake-ups and two
 * sleeps. Each runs with the threads on two CPUs, then on one. Prints one
 * line: medians of 5 runs, µs per round trip. Never fails: it measures. */
#include <errno.h>
#include <linux/futex.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "clock.h"

#define TRIPS 20000
#define RUNS 5

typedef struct {
    int cpu;                 /* -1: anywhere */
    int fd;                  /* TCP: this side's socket; futex: unused */
    _Atomic uint32_t *turn;  /* futex: whose turn (0 or 1) */
    int me;
} side;

static void pin(int cpu)
{
    if (cpu < 0)
        return;
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void futex_wait(_Atomic uint32_t *w, uint32_t v)
{
    syscall(SYS_futex, w, FUTEX_WAIT_PRIVATE, v, NULL, NULL, 0);
}

static void futex_wake(_Atomic uint32_t *w) { syscall(SYS_futex, w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0); }

static void *futex_side(void *p)
{
    side *s = p;
    pin(s->cpu);
    for (int i = 0; i < TRIPS; i++) {
        uint32_t v;
        while ((v = atomic_load(s->turn)) != (uint32_t)s->me)
            futex_wait(s->turn, v);
        atomic_store(s->turn, (uint32_t)!s->me);
        futex_wake(s->turn);
    }
    return NULL;
}

static void *tcp_side(void *p)
{
    side *s = p;
    pin(s->cpu);
    char c = 0;
    for (int i = 0; i < TRIPS; i++) {
        if (s->me == 0 && send(s->fd, &c, 1, 0) != 1)
            return NULL;
        if (recv(s->fd, &c, 1, 0) != 1)
            return NULL;
        if (s->me == 1 && send(s->fd, &c, 1, 0) != 1)
            return NULL;
    }
    return NULL;
}

/* A connected loopback TCP pair, Nagle off; 0 on success (nothing left
 * open on failure). */
static int tcp_pair(int fd[2])
{
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    fd[0] = fd[1] = -1;
    int ok = l >= 0 && bind(l, (struct sockaddr *)&a, sizeof a) == 0 && listen(l, 1) == 0 &&
             getsockname(l, (struct sockaddr *)&a, &len) == 0 && (fd[0] = socket(AF_INET, SOCK_STREAM, 0)) >= 0 &&
             connect(fd[0], (struct sockaddr *)&a, sizeof a) == 0 && (fd[1] = accept(l, NULL, NULL)) >= 0;
    if (l >= 0)
        close(l);
    if (!ok) {
        if (fd[0] >= 0)
            close(fd[0]);
        return -1;
    }
    setsockopt(fd[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    setsockopt(fd[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return 0;
}

/* µs per round trip of one run; < 0 when it could not run. */
static double one_run(int tcp, int cpu0, int cpu1)
{
    _Atomic uint32_t turn = 0;
    int fd[2] = {-1, -1};
    if (tcp && tcp_pair(fd) != 0)
        return -1;
    side s[2] = {{cpu0, fd[0], &turn, 0}, {cpu1, fd[1], &turn, 1}};
    pthread_t t[2];
    double t0 = tp_now_us();
    int ok = pthread_create(&t[0], NULL, tcp ? tcp_side : futex_side, &s[0]) == 0;
    ok = ok && pthread_create(&t[1], NULL, tcp ? tcp_side : futex_side, &s[1]) == 0;
    if (ok) {
        pthread_join(t[0], NULL);
        pthread_join(t[1], NULL);
    }
    double us = (tp_now_us() - t0) / TRIPS;
    if (tcp) {
        close(fd[0]);
        close(fd[1]);
    }
    return ok ? us : -1;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median_run(int tcp, int cpu0, int cpu1)
{
    double r[RUNS];
    for (int i = 0; i < RUNS; i++)
        r[i] = one_run(tcp, cpu0, cpu1);
    qsort(r, RUNS, sizeof r[0], cmp);
    return r[RUNS / 2];
}

int main(void)
{
    cpu_set_t s;
    int cpus[2] = {-1, -1}, n = 0;
    if (sched_getaffinity(0, sizeof s, &s) == 0)
        for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
            if (CPU_ISSET(c, &s))
                cpus[n++] = c;
    if (n < 1) {
        printf("wake-up round trip: not measured (no CPU in this process's affinity mask)\n");
        return 0;
    }
    double f2 = n == 2 ? median_run(0, cpus[0], cpus[1]) : -1, f1 = median_run(0, cpus[0], cpus[0]);
    double t2 = n == 2 ? median_run(1, cpus[0], cpus[1]) : -1, t1 = median_run(1, cpus[0], cpus[0]);
    char a[32] = "-", b[32] = "-";
    if (f2 >= 0)
        snprintf(a, sizeof a, "%.1f", f2);
    if (t2 >= 0)
        snprintf(b, sizeof b, "%.1f", t2);
    printf("wake-up round trip (2 threads, 2 wake-ups, median of %d x %d): futex %s us on 2 CPUs, %.1f on one; "
           "loopback TCP byte %s us on 2 CPUs, %.1f on one\n",
           RUNS, TRIPS, a, f1, b, t1);
    return 0;
}
