/* rank_procs.c — one process per rank.
 *
 * One memfd holds everything the processes share: the control block, the
 * backend's comm area, the request staging area and one heap per rank. It is
 * sparse, so the defaults (256 MiB staging, 4 GiB per rank) cost address
 * space, not memory; a memfd also avoids /dev/shm, which containers often
 * cap at 64 MiB. Spawned workers inherit it as fd 3; external ranks get it
 * over the rendezvous unix socket (SCM_RIGHTS), once the leader has checked
 * who they are (their uid, from the kernel) and that they know the group's
 * secret: that fd is every rank's memory, weights and requests included.
 *
 * Synchronization is C11 atomics plus futexes on shared words rather than
 * process-shared mutexes: a process that dies mid-step cannot leave a lock
 * held, and a wait inside a step has a timeout so the waiter can look for
 * the dead (and for a hung step).
 * A wait spins for the group's budget first (util/spin_wait.h): inside a
 * step the peer is usually microseconds away. Each wait site learns on its
 * own whether spinning pays (tp_spin_site): a run follows its command at
 * once, while the next command, at one request at a time, is a whole HTTP
 * round trip away.
 *
 * The liveness check (check_peers) runs on the step's caller, on the
 * group's watchdog thread (rank_group.c) and on the peer watcher below, so
 * it holds live_mu; the lost message is published through lost_set and
 * never changes after.
 *
 * Between steps nothing polls. Each process holds a pidfd of every process
 * it depends on (the leader: its workers; a worker: its leader), and a
 * watcher thread sleeps in poll on them: a peer that exits makes its pidfd
 * readable, the watcher loses the group at once and tells opts->on_lost,
 * and a worker waiting for its next command sleeps without a timeout. An
 * idle server used to wake 50 times a second in each process to call
 * kill(pid, 0), which also took a reused pid for the dead peer alive.
 * Where a pidfd cannot be had (a kernel before 5.3, another pid
 * namespace), the watcher looks every WAIT_SLICE_MS instead, as before.
 *
 * Messages go through a ring of RING slots: the leader never overwrites a
 * slot some worker has not read yet (each worker publishes how many it has
 * consumed), so a command and the run that follows it cannot race. */
#include "rank_procs.h"

#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "log.h"
#include "spin_wait.h"
#include "text.h"

#define CTL_MAGIC 0x74707267u /* "tprg" */
#define CTL_VERSION 3
#define RING 8
#define WAIT_SLICE_MS 20
/* A worker waiting for its leader's next command (the gap between two
 * steps) spins this many times the in-step budget. At one connection that
 * gap is a client's whole round trip, 30-100 us on this VM, often longer
 * than TP_SPIN_NS: the worker then slept between requests, and the leader
 * paid the futex wake-up (an IPI through the hypervisor, ~9 us) and spun
 * at the step's first collective until the worker was up, which made the
 * next round trip longer still; runs settled in one mode or the other
 * (binary at one connection: 42-45 us of CPU per request, or 57-68). With
 * 4x, interleaved 3 s runs (2026-11-25): binary 56.7 -> 43.4 us (medians
 * of 9) and 52.7 -> 47.0 (of 8), 20k -> 33k req/s; JSON 78.8 -> 73.2 us,
 * 10k -> 22k req/s; the worker's spin included. Sparse traffic makes these
 * spins miss, and the wait site then sleeps at once (tp_spin_site). */
#define CMD_SPIN_FACTOR 4
#define GROUP_FD 3
#define QUIT_GRACE_MS 5000
/* How long the leader waits for a joiner's hello, from its connection.
 * Joiners are admitted one at a time, so a silent one holds the others
 * back this long; only a process of an admitted uid gets that far (a
 * foreign one is refused before anything is read), and such a process
 * could signal the leader anyway. The join timeout bounds the total. */
#define HELLO_WAIT_MS 2000
/* "<rendezvous>.secret": the rendezvous path fits a sun_path */
#define SECRET_PATH_BYTES (sizeof(((struct sockaddr_un *)0)->sun_path) + sizeof ".secret")

extern char **environ;

typedef struct {
    _Atomic uint32_t seen;  /* messages consumed */
    _Atomic uint32_t done;  /* last run step finished */
    _Atomic uint32_t done_sleepers;
    _Atomic int32_t pid;
    int32_t status;
    uint32_t ticket;
    char msg[sizeof(tp_err)];
} ctl_rank;

typedef struct {
    uint32_t kind, len;
    unsigned char data[TP_GROUP_MESSAGE];
} ctl_msg;

typedef struct {
    uint32_t magic, version;
    int32_t world;
    uint64_t total, comm_offset, comm_bytes, staging_offset, staging_bytes, heap_offset, heap_bytes;
    _Atomic int32_t leader_pid;
    _Atomic uint32_t seq; /* futex: messages sent */
    _Atomic uint32_t seq_sleepers;
    _Atomic uint32_t pokes; /* pre-wakes: a worker woken by one spins for the message */
    ctl_msg ring[RING];
    _Atomic uint32_t result; /* futex: last run step with a merged result */
    _Atomic uint32_t result_sleepers;
    int32_t result_status;
    char result_msg[sizeof(tp_err)];
    _Atomic uint32_t abort_step; /* a rank failed in this run step */
    _Atomic uint32_t tickets;
    _Atomic uint32_t lost;
    char lost_msg[512];
    ctl_rank rank[TP_GROUP_MAX_PROCESSES];
} ctl_block;

struct tp_rank_procs {
    int rank, world, fd, spawned, stopped;
    char *base;
    size_t total;
    ctl_block *ctl;
    tp_rank_shared shared;
    pid_t child[TP_GROUP_MAX_PROCESSES]; /* leader: spawned workers not yet reaped */
    /* The leader: every worker's pid; a worker: [0], its leader's. Numbers
     * in this process's pid namespace (0: the peer has none here). */
    int32_t pid[TP_GROUP_MAX_PROCESSES];
    uint32_t seen; /* leader: messages sent; worker: consumed */
    int step_timeout_ms, join_timeout_ms;
    int64_t spin_ns;
    tp_spin_site recv_site[TP_MSG_QUIT + 1]; /* worker: per kind of message */
    tp_spin_site ring_site, finish_site;
    _Atomic int64_t step_deadline; /* leader: when the run in flight becomes a hang (0: none) */
    _Atomic uint32_t step;         /* the run step in flight */
    pthread_mutex_t live_mu;       /* check_peers */
    _Atomic int lost_set;          /* lost[] is written and final */
    char lost[512];
    /* The peer watcher: pidfds of the peers (-1: none), an eventfd that
     * wakes it (set_lost, and its stop), whether every peer has a pidfd
     * (then idle waits need no timeout), and whom it tells of a loss. */
    int peer_fd[TP_GROUP_MAX_PROCESSES];
    /* A rank that joined at the rendezvous, and a worker that joined its
     * leader there: the join connection, kept open. It ends (EOF) when the
     * peer does, whatever its pid namespace. -1: none. */
    int peer_sock[TP_GROUP_MAX_PROCESSES];
    int watch_fd, watched, has_watcher;
    _Atomic int watch_quit;
    pthread_t watcher;
    void (*on_lost)(void *arg);
    void *on_lost_arg;
    /* The leader at a rendezvous: the group secret, who may join (its own
     * effective uid, and join_uid unless -1), and the secret file it wrote
     * itself, removed when the rendezvous ends ("": none). */
    char secret[TP_RANK_SECRET_CHARS];
    uint32_t uid;
    int join_uid;
    char secret_written[SECRET_PATH_BYTES];
};

/* ------------------------------------------------------------ waiting */

/* ------------------------------------------------------------ liveness */

static void set_lost(tp_rank_procs *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_lost(tp_rank_procs *p, const char *fmt, ...)
{
    if (atomic_load(&p->lost_set))
        return;
    static const char prefix[] = "rank group lost: ";
    memcpy(p->lost, prefix, sizeof prefix);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->lost + sizeof prefix - 1, sizeof p->lost - (sizeof prefix - 1), fmt, ap);
    va_end(ap);
    atomic_store(&p->lost_set, 1);
    if (!atomic_load(&p->ctl->lost)) {
        snprintf(p->ctl->lost_msg, sizeof p->ctl->lost_msg, "%s", p->lost);
        atomic_store(&p->ctl->lost, 1);
    }
    /* wake everyone so they notice now, not at their next time slice */
    tp_futex_wake(&p->ctl->seq, 1);
    tp_futex_wake(&p->ctl->result, 1);
    if (p->watch_fd >= 0) {
        uint64_t one = 1;
        (void)!write(p->watch_fd, &one, sizeof one);
    }
}

static void describe_exit(tp_rank_procs *p, int r, int ws)
{
    if (WIFSIGNALED(ws))
        set_lost(p, "rank %d (pid %d) was killed by signal %d (%s)", r, (int)p->pid[r], WTERMSIG(ws),
                 strsignal(WTERMSIG(ws)));
    else
        set_lost(p, "rank %d (pid %d) exited with status %d", r, (int)p->pid[r], WEXITSTATUS(ws));
}

static int process_gone(pid_t pid) { return pid > 0 && kill(pid, 0) != 0 && errno == ESRCH; }

static int readable(int fd)
{
    struct pollfd pf = {fd, POLLIN, 0};
    return poll(&pf, 1, 0) == 1;
}

/* What says peer r has ended by turning readable: its pidfd (once it
 * exits), else its join connection (once it closes: nothing else is ever
 * sent on it); -1 when neither exists. */
static int liveness_fd(const tp_rank_procs *p, int r) { return p->peer_fd[r] >= 0 ? p->peer_fd[r] : p->peer_sock[r]; }

/* Whether peer r has ended: its liveness_fd is readable, or, without one,
 * kill finds no process r's pid. */
static int peer_ended(const tp_rank_procs *p, int r)
{
    int fd = liveness_fd(p, r);
    return fd >= 0 ? readable(fd) : process_gone(p->pid[r]);
}

/* A hung rank holding a GPU: killed to free it for the restart. Through
 * its pidfd when there is one (a pid can be reused once the process is
 * gone); never a pid this namespace has no number for. */
static void kill_peer(const tp_rank_procs *p, int r)
{
#ifdef SYS_pidfd_send_signal
    if (p->peer_fd[r] >= 0) {
        (void)syscall(SYS_pidfd_send_signal, p->peer_fd[r], SIGKILL, NULL, 0);
        return;
    }
#endif
    if (p->peer_fd[r] < 0 && p->pid[r] > 0)
        kill(p->pid[r], SIGKILL);
}

/* The leader looks at its workers; a worker at the leader. live_mu held. */
static void check_peers(tp_rank_procs *p)
{
    if (atomic_load(&p->lost_set))
        return;
    if (atomic_load(&p->ctl->lost)) {
        snprintf(p->lost, sizeof p->lost, "%s", p->ctl->lost_msg);
        atomic_store(&p->lost_set, 1);
        return;
    }
    if (p->rank != 0) {
        if (peer_ended(p, 0) || (p->spawned && getppid() != p->pid[0]))
            set_lost(p, "the leader (rank 0, pid %d) is gone", (int)atomic_load(&p->ctl->leader_pid));
        return;
    }
    int64_t deadline = atomic_load(&p->step_deadline);
    if (deadline && tp_now_ms_int() > deadline) {
        for (int r = 1; r < p->world && !atomic_load(&p->lost_set); r++)
            if ((int32_t)(atomic_load(&p->ctl->rank[r].done) - atomic_load(&p->step)) < 0) {
                set_lost(p, "rank %d (pid %d) did not finish a step within %d ms (step_timeout_ms)", r,
                         (int)p->pid[r], p->step_timeout_ms);
                kill_peer(p, r);
            }
        if (!atomic_load(&p->lost_set)) /* the workers are done: rank 0 itself is stuck */
            set_lost(p, "rank 0 did not finish a step within %d ms (step_timeout_ms)", p->step_timeout_ms);
        return;
    }
    for (int r = 1; r < p->world && !atomic_load(&p->lost_set); r++) {
        int ws;
        if (p->child[r] > 0 && waitpid(p->child[r], &ws, WNOHANG) == p->child[r]) {
            p->child[r] = 0;
            describe_exit(p, r, ws);
        } else if (p->child[r] <= 0 && peer_ended(p, r)) {
            if (p->pid[r] > 0)
                set_lost(p, "rank %d (pid %d) is gone", r, (int)p->pid[r]);
            else
                set_lost(p, "rank %d is gone (its rendezvous connection closed)", r);
        }
    }
}

const char *tp_rank_procs_lost_known(tp_rank_procs *p)
{
    if (!atomic_load(&p->lost_set) && atomic_load(&p->ctl->lost))
        return tp_rank_procs_lost(p); /* another process found it: copy its message */
    return atomic_load(&p->lost_set) ? p->lost : NULL;
}

const char *tp_rank_procs_lost(tp_rank_procs *p)
{
    if (!atomic_load(&p->lost_set)) {
        pthread_mutex_lock(&p->live_mu);
        check_peers(p);
        pthread_mutex_unlock(&p->live_mu);
    }
    return atomic_load(&p->lost_set) ? p->lost : NULL;
}

static tp_status lost_error(tp_rank_procs *p, tp_err *err) { return tp_fail(err, TP_UNAVAILABLE, "%s", p->lost); }

typedef struct {
    const tp_rank_procs *p;
    _Atomic uint32_t *w, *sleepers; /* sleepers: NULL when nobody wakes w */
    uint32_t target;
    _Atomic uint32_t *pokes; /* non-NULL: a sleep ended by a pre-wake spins again */
} reach;

static int reached(const void *a)
{
    const reach *r = a;
    return (int32_t)(atomic_load(r->w) - r->target) >= 0 || atomic_load(&r->p->ctl->lost);
}

/* Waits until *r->w >= r->target, or the group is lost: spins (per the
 * site), then sleeps in slices of slice_ms, looking for the dead between
 * them; -1, no timeout, only on a word set_lost wakes while the peer
 * watcher looks for the dead.
 *
 * stretch: the site may stretch its spins to meet a peer that comes just
 * after they run out (tp_spin_site_ended). Only the worker's wait for the
 * next command does. There it holds one connection's good mode: the
 * worker that keeps spinning between commands keeps its CPU from halting
 * and the client on the HTTP thread's CPU (one-connection rounds with a
 * p50 over 60 us: 5 of 24 -> 0 of 24). Inside a step it does harm: a
 * worker whose leader sleeps (its sites skip their spins under sparse
 * traffic) spun ~200 us a request for the leader's wake-up, on the core
 * the client needed (a request every 0.5 ms: p50 463 -> 540-740 us, the
 * worker's CPU 90 -> 250 us a request). server/README.md at 27cb4dd, "Spins that
 * stretch to meet a waking peer". */
static tp_status wait_for(tp_rank_procs *p, reach r, tp_spin_site *site, int64_t spin_ns, int slice_ms, int stretch,
                          tp_err *err)
{
    tp_spin_site_until(site, reached, &r, spin_ns);
    for (;;) {
        uint32_t v = atomic_load(r.w);
        if ((int32_t)(v - r.target) >= 0) {
            if (stretch)
                tp_spin_site_ended(site);
            return TP_OK;
        }
        if (tp_rank_procs_lost(p))
            return lost_error(p, err);
        uint32_t poked = r.pokes ? atomic_load(r.pokes) : 0;
        if (r.sleepers)
            tp_futex_sleep(r.w, v, r.sleepers, slice_ms, 1);
        else
            tp_futex_wait(r.w, v, slice_ms, 1);
        if (r.pokes && atomic_load(r.pokes) != poked)
            tp_spin_until(reached, &r, p->spin_ns);
    }
}

/* ------------------------------------------------------------ peer watcher */

static int open_pidfd(pid_t pid)
{
#ifdef SYS_pidfd_open
    return pid > 0 ? (int)syscall(SYS_pidfd_open, pid, 0) : -1;
#else
    (void)pid;
    return -1;
#endif
}

/* Sleeps until a peer's pidfd is readable, or watch_fd is written
 * (set_lost, the stop), or timeout_ms passes. */
static void watch_wait(tp_rank_procs *p, struct pollfd *pf, int n, int timeout_ms)
{
    if (poll(pf, n, timeout_ms) > 0 && pf[0].revents) {
        uint64_t v;
        (void)!read(p->watch_fd, &v, sizeof v);
    }
}

/* check_peers, and a peer whose pidfd or connection poll found readable is
 * gone whatever else it says (a child someone else reaped). */
static void look_at_peers(tp_rank_procs *p, const struct pollfd *pf, const int *rank, int n)
{
    pthread_mutex_lock(&p->live_mu);
    check_peers(p);
    for (int i = 1; i < n && !atomic_load(&p->lost_set); i++)
        if (pf[i].revents)
            set_lost(p, "rank %d's process ended", rank[i]);
    pthread_mutex_unlock(&p->live_mu);
}

static void *watch_peers(void *arg)
{
    tp_rank_procs *p = arg;
    pthread_setname_np(pthread_self(), "rank peers");
    struct pollfd pf[TP_GROUP_MAX_PROCESSES + 1];
    int rank[TP_GROUP_MAX_PROCESSES + 1], n = 1; /* pf[i], i >= 1: rank[i]'s pidfd or join connection */
    pf[0] = (struct pollfd){p->watch_fd, POLLIN, 0};
    for (int r = 0; r < p->world; r++) {
        int fd = liveness_fd(p, r);
        if (fd >= 0) {
            rank[n] = r;
            pf[n++] = (struct pollfd){fd, POLLIN, 0};
        }
    }
    while (!atomic_load(&p->watch_quit) && !atomic_load(&p->lost_set)) {
        watch_wait(p, pf, n, p->watched ? -1 : WAIT_SLICE_MS);
        if (!atomic_load(&p->watch_quit))
            look_at_peers(p, pf, rank, n);
    }
    if (atomic_load(&p->watch_quit))
        return NULL;
    if (p->on_lost)
        p->on_lost(p->on_lost_arg);
    /* A waiter that looked just before the loss may sleep on a word that
     * did not change (set_lost's wake came first), without a timeout:
     * wake the waits on those words until the group is torn down. */
    while (!atomic_load(&p->watch_quit)) {
        tp_futex_wake(&p->ctl->seq, 1);
        tp_futex_wake(&p->ctl->result, 1);
        watch_wait(p, pf, 1, WAIT_SLICE_MS);
    }
    return NULL;
}

/* The peers' pidfds (the leader's workers, a worker's leader) and the
 * watcher on them and on the join connections. A peer already gone, or
 * without a pid here, has no pidfd: its connection, or check_peers, finds
 * it. */
static tp_status start_watcher(tp_rank_procs *p, tp_err *err)
{
    int all = 1;
    for (int r = 0; r < p->world; r++) {
        if (r == p->rank || (p->rank != 0 && r != 0))
            continue;
        p->peer_fd[r] = open_pidfd(p->pid[r]);
        all &= liveness_fd(p, r) >= 0;
    }
    p->watched = all;
    p->watch_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (p->watch_fd < 0)
        return tp_fail(err, TP_IO, "rank group: eventfd: %s", strerror(errno));
    if (pthread_create(&p->watcher, NULL, watch_peers, p) != 0)
        return tp_fail(err, TP_INTERNAL, "rank group: cannot start the peer watcher thread");
    p->has_watcher = 1;
    return TP_OK;
}

static void stop_watcher(tp_rank_procs *p)
{
    if (!p->has_watcher)
        return;
    atomic_store(&p->watch_quit, 1);
    uint64_t one = 1;
    (void)!write(p->watch_fd, &one, sizeof one);
    pthread_join(p->watcher, NULL);
    p->has_watcher = 0;
}

/* ------------------------------------------------------------ memory */

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

static tp_status map_group(tp_rank_procs *p, size_t total, tp_err *err)
{
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, p->fd, 0);
    if (m == MAP_FAILED)
        return tp_fail(err, TP_NOMEM, "rank group: cannot map %zu bytes of shared memory: %s", total, strerror(errno));
    p->base = m;
    p->total = total;
    p->ctl = m;
    return TP_OK;
}

static void fill_shared(tp_rank_procs *p)
{
    ctl_block *c = p->ctl;
    p->shared = (tp_rank_shared){p->base,        c->comm_offset, c->comm_bytes, c->staging_offset,
                                 c->staging_bytes, c->heap_offset, c->heap_bytes};
}

static tp_status create_memory(tp_rank_procs *p, const tp_rank_group_opts *o, tp_err *err)
{
    size_t page = 1 << 16;
    size_t staging = round_up(o->staging_bytes ? o->staging_bytes : (size_t)256 << 20, page);
    size_t heap = round_up(o->heap_bytes ? o->heap_bytes : (size_t)4 << 30, page);
    size_t ctl = round_up(sizeof(ctl_block), page), comm = (size_t)1 << 20;
    size_t total = ctl + comm + staging + heap * (size_t)o->world;
    p->fd = memfd_create("tpserve-rank-group", MFD_CLOEXEC);
    if (p->fd < 0)
        return tp_fail(err, TP_IO, "rank group: memfd_create: %s", strerror(errno));
    if (ftruncate(p->fd, (off_t)total) != 0)
        return tp_fail(err, TP_NOMEM, "rank group: cannot size shared memory to %zu bytes: %s", total, strerror(errno));
    tp_status st = map_group(p, total, err);
    if (st != TP_OK)
        return st;
    ctl_block *c = p->ctl;
    c->magic = CTL_MAGIC;
    c->version = CTL_VERSION;
    c->world = o->world;
    c->total = total;
    c->comm_offset = ctl;
    c->comm_bytes = comm;
    c->staging_offset = ctl + comm;
    c->staging_bytes = staging;
    c->heap_offset = ctl + comm + staging;
    c->heap_bytes = heap;
    atomic_store(&c->leader_pid, getpid());
    atomic_store(&c->rank[0].pid, getpid());
    fill_shared(p);
    return TP_OK;
}

/* ------------------------------------------------------------ spawning */

/* environ minus any TP_RANK / TP_WORLD_SIZE / TP_GROUP_FD / LOCAL_RANK it
 * already has, plus this worker's (their strings live in own): free only
 * the array. LOCAL_RANK is the worker's own: the workers a leader spawns
 * are all on its node, and a LOCAL_RANK inherited from a launcher
 * (torchrun, Slurm, Kubernetes) would give every one the same GPU, which
 * NCCL refuses (the cuda backend picks its device by LOCAL_RANK). */
#define WORKER_VARS 4
static char **worker_env(int rank, int world, char own[WORKER_VARS][32])
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + WORKER_VARS + 1, sizeof *env);
    if (!env)
        return NULL;
    snprintf(own[0], 32, "TP_RANK=%d", rank);
    snprintf(own[1], 32, "TP_WORLD_SIZE=%d", world);
    snprintf(own[2], 32, "TP_GROUP_FD=%d", GROUP_FD);
    snprintf(own[3], 32, "LOCAL_RANK=%d", rank);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        int ours = 0;
        for (int v = 0; v < WORKER_VARS && !ours; v++)
            ours = strncmp(environ[i], own[v], (size_t)(strchr(own[v], '=') - own[v] + 1)) == 0;
        if (!ours)
            env[k++] = environ[i];
    }
    for (int v = 0; v < WORKER_VARS; v++)
        env[k++] = own[v];
    return env;
}

/* Between fork and exec only async-signal-safe calls: the server has
 * threads, and a lock held by one of them would stay held in the child. */
static tp_status spawn_worker(tp_rank_procs *p, int r, char *const *argv, tp_err *err)
{
    char own[WORKER_VARS][32];
    char **env = worker_env(r, p->world, own);
    if (!env)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    sigset_t none;
    sigemptyset(&none);
    pid_t pid = fork();
    if (pid == 0) {
        /* its own process group: a terminal's ^C goes to the leader, which
         * drains and then tells the workers to quit */
        setpgid(0, 0);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (p->fd == GROUP_FD)
            fcntl(GROUP_FD, F_SETFD, 0);
        else if (dup2(p->fd, GROUP_FD) != GROUP_FD)
            _exit(126);
        close_range(GROUP_FD + 1, ~0U, 0);
        execve(argv[0], argv, env);
        _exit(127);
    }
    free(env);
    if (pid < 0)
        return tp_fail(err, TP_INTERNAL, "rank group: cannot start rank %d: fork: %s", r, strerror(errno));
    p->child[r] = pid;
    p->pid[r] = pid;
    return TP_OK;
}

/* ------------------------------------------------------------ rendezvous */

typedef struct {
    uint32_t magic;
    int32_t rank, world, pid;
    char secret[TP_RANK_SECRET_CHARS]; /* hex digits, no terminator */
} hello;
_Static_assert(sizeof(hello) == TP_RANK_HELLO_BYTES, "the hello is part of the rendezvous protocol");

/* ------------------------------------------------------------ the group secret
 *
 * 32 random bytes as 64 hex digits: text, so an operator can make one
 * (`openssl rand -hex 32`) and hand the same file to leader and ranks. It
 * never travels in argv (anyone may read /proc/PID/cmdline) nor in the
 * environment (the user's other processes may read it, and children
 * inherit it): only in files of mode 0600 and in the hello. */

static tp_status secret_path(const char *rendezvous, char *buf, size_t cap, tp_err *err)
{
    if ((size_t)snprintf(buf, cap, "%s.secret", rendezvous) >= cap)
        return tp_fail(err, TP_INVALID, "rendezvous path '%s' is longer than %zu bytes", rendezvous,
                       cap - sizeof ".secret");
    return TP_OK;
}

static tp_status make_secret(char out[TP_RANK_SECRET_CHARS], tp_err *err)
{
    unsigned char raw[TP_RANK_SECRET_CHARS / 2];
    for (size_t got = 0; got < sizeof raw;) {
        ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
        if (n < 0 && errno != EINTR)
            return tp_fail(err, TP_IO, "rendezvous: cannot make the group secret: getrandom: %s", strerror(errno));
        got += n > 0 ? (size_t)n : 0;
    }
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < sizeof raw; i++) {
        out[2 * i] = digits[raw[i] >> 4];
        out[2 * i + 1] = digits[raw[i] & 15];
    }
    return TP_OK;
}

/* The secret in a file of this process's uid that nobody else may read or
 * write (one others could write would let them choose it): 64 hex digits,
 * then at most whitespace. The checks are on the file opened (fstat), so a
 * symlink to it (a Kubernetes secret volume's) is fine. */
static tp_status read_secret(const char *path, char out[TP_RANK_SECRET_CHARS], tp_err *err)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return tp_fail(err, TP_IO, "rendezvous secret file '%s': cannot open: %s", path, strerror(errno));
    struct stat sb;
    char buf[TP_RANK_SECRET_CHARS + 16];
    ssize_t n = 0;
    tp_status st = TP_OK;
    if (fstat(fd, &sb) != 0)
        st = tp_fail(err, TP_IO, "rendezvous secret file '%s': %s", path, strerror(errno));
    else if (!S_ISREG(sb.st_mode))
        st = tp_fail(err, TP_INVALID, "rendezvous secret file '%s' is not a regular file", path);
    else if (sb.st_uid != geteuid())
        st = tp_fail(err, TP_INVALID, "rendezvous secret file '%s' is owned by uid %u, not by this process's (%u)",
                     path, (unsigned)sb.st_uid, (unsigned)geteuid());
    else if (sb.st_mode & 077)
        st = tp_fail(err, TP_INVALID, "rendezvous secret file '%s' is open to group or others (mode %04o): "
                     "chmod 600 it", path, (unsigned)(sb.st_mode & 07777));
    else if ((n = read(fd, buf, sizeof buf)) < 0)
        st = tp_fail(err, TP_IO, "rendezvous secret file '%s': cannot read: %s", path, strerror(errno));
    close(fd);
    if (st != TP_OK)
        return st;
    int ok = n >= TP_RANK_SECRET_CHARS && n < (ssize_t)sizeof buf;
    for (ssize_t i = 0; ok && i < n; i++)
        ok = i < TP_RANK_SECRET_CHARS ? isxdigit((unsigned char)buf[i]) != 0 : isspace((unsigned char)buf[i]) != 0;
    if (!ok)
        return tp_fail(err, TP_INVALID, "rendezvous secret file '%s' does not hold a secret of %d hex digits "
                       "(make one with `openssl rand -hex 32`)", path, TP_RANK_SECRET_CHARS);
    memcpy(out, buf, TP_RANK_SECRET_CHARS);
    return TP_OK;
}

/* A new file at path, mode 0600, holding the secret. A stale one (a leader
 * killed mid-rendezvous leaves it) is removed first; O_EXCL then makes sure
 * the file written is ours: a file or symlink someone else left there
 * where we cannot remove it (a sticky /tmp) fails the create. */
static tp_status write_secret(const char *path, const char secret[TP_RANK_SECRET_CHARS], tp_err *err)
{
    if (unlink(path) != 0 && errno != ENOENT)
        return tp_fail(err, TP_IO, "rendezvous secret file '%s' exists and cannot be removed: %s", path,
                       strerror(errno));
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return tp_fail(err, TP_IO, "rendezvous secret file '%s': cannot create: %s", path, strerror(errno));
    char line[TP_RANK_SECRET_CHARS + 1];
    memcpy(line, secret, TP_RANK_SECRET_CHARS);
    line[TP_RANK_SECRET_CHARS] = '\n';
    int ok = write(fd, line, sizeof line) == (ssize_t)sizeof line;
    int saved = errno;
    if (close(fd) != 0 || !ok) {
        unlink(path);
        return tp_fail(err, TP_IO, "rendezvous secret file '%s': cannot write: %s", path,
                       strerror(ok ? errno : saved));
    }
    return TP_OK;
}

/* The leader's secret: read from secret_file, or made and written to
 * "<rendezvous>.secret" (logged: the ranks' operator needs to know where). */
static tp_status leader_secret(tp_rank_procs *p, const tp_rank_group_opts *o, tp_err *err)
{
    if (o->secret_file)
        return read_secret(o->secret_file, p->secret, err);
    char path[SECRET_PATH_BYTES];
    tp_status st = secret_path(o->rendezvous, path, sizeof path, err);
    if (st == TP_OK)
        st = make_secret(p->secret, err);
    if (st == TP_OK)
        st = write_secret(path, p->secret, err);
    if (st != TP_OK)
        return st;
    snprintf(p->secret_written, sizeof p->secret_written, "%s", path);
    TP_LOG_I("rendezvous '%s': group secret written to '%s' (mode 0600, removed once the ranks joined): "
             "a rank joining must be able to read it", o->rendezvous, path);
    return TP_OK;
}

static tp_status unix_addr(const char *path, struct sockaddr_un *a, tp_err *err)
{
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a->sun_path)
        return tp_fail(err, TP_INVALID, "rendezvous path '%s' is longer than %zu bytes", path, sizeof a->sun_path - 1);
    strcpy(a->sun_path, path);
    return TP_OK;
}

static tp_status listen_unix(const char *path, int *out, tp_err *err)
{
    struct sockaddr_un a;
    if (unix_addr(path, &a, err) != TP_OK)
        return TP_INVALID;
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    unlink(path); /* a stale socket from an earlier run */
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) != 0 || listen(s, TP_GROUP_MAX_PROCESSES) != 0) {
        tp_status st = tp_fail(err, TP_IO, "rendezvous '%s': cannot listen: %s", path, strerror(errno));
        if (s >= 0)
            close(s);
        return st;
    }
    *out = s;
    return TP_OK;
}

static void reply(int s, const char *text, int fd)
{
    char buf[256] = ""; /* all of it is sent: no stack bytes after the text */
    snprintf(buf, sizeof buf, "%s", text);
    struct iovec iov = {buf, sizeof buf};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        m.msg_control = u.b;
        m.msg_controllen = sizeof u.b;
        struct cmsghdr *c = CMSG_FIRSTHDR(&m);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof fd);
    }
    (void)!sendmsg(s, &m, MSG_NOSIGNAL);
}

/* Who is at the other end of unix socket s, as the kernel says (as of its
 * connect), whatever it says about itself: its pid as our pid namespace
 * numbers it (0: it has no number here) and its effective uid. 0 when the
 * kernel gives none. */
static int peer_cred(int s, struct ucred *cr)
{
    socklen_t len = sizeof *cr;
    return getsockopt(s, SOL_SOCKET, SO_PEERCRED, cr, &len) == 0 && len == sizeof *cr;
}

static pid_t peer_pid(int s)
{
    struct ucred cr;
    return peer_cred(s, &cr) ? cr.pid : 0;
}

int tp_rank_uid_check(uint32_t peer_uid, uint32_t own_uid, int join_uid, char *why, size_t cap)
{
    if (peer_uid == own_uid || (join_uid >= 0 && peer_uid == (uint32_t)join_uid))
        return 1;
    if (join_uid >= 0)
        snprintf(why, cap, "error: uid %u may not join: only the leader's (%u) and rendezvous_uid %d may",
                 (unsigned)peer_uid, (unsigned)own_uid, join_uid);
    else
        snprintf(why, cap, "error: uid %u may not join: only the leader's (%u) may (see rendezvous_uid)",
                 (unsigned)peer_uid, (unsigned)own_uid);
    return 0;
}

/* Whether a and b, n bytes each, are the same, in a time that does not
 * depend on where they differ (nothing learns the secret byte by byte). */
static int same_secret(const char *a, const char *b, size_t n)
{
    unsigned char d = 0;
    for (size_t i = 0; i < n; i++)
        d |= (unsigned char)(a[i] ^ b[i]);
    return d == 0;
}

int tp_rank_hello_check(const void *bytes, size_t n, int world, const int32_t *joined, const char *secret, char *why,
                        size_t cap)
{
    hello h;
    uint32_t magic = 0;
    if (n >= sizeof magic)
        memcpy(&magic, bytes, sizeof magic);
    if (magic != CTL_MAGIC || n > sizeof h || n < offsetof(hello, secret)) {
        snprintf(why, cap, "error: not a tpserve rank");
        return 0;
    }
    /* before anything else: nobody without it learns the group's state */
    if (n < sizeof h) {
        snprintf(why, cap, "error: the hello has no whole group secret (%zu of its %d hex digits; "
                 "a worker older than its leader?)", n - offsetof(hello, secret), TP_RANK_SECRET_CHARS);
        return 0;
    }
    memcpy(&h, bytes, sizeof h);
    if (!same_secret(h.secret, secret, TP_RANK_SECRET_CHARS))
        snprintf(why, cap, "error: wrong group secret");
    else if (h.world != world)
        snprintf(why, cap, "error: WORLD_SIZE %d, but the graph has world_size %d", (int)h.world, world);
    else if (h.rank < 1 || h.rank >= world)
        snprintf(why, cap, "error: RANK %d out of range 1..%d (rank 0 is the leader)", (int)h.rank, world - 1);
    else if (joined[h.rank] >= 0)
        snprintf(why, cap, "error: rank %d already joined (pid %d)", (int)h.rank, (int)joined[h.rank]);
    else
        return h.rank;
    return 0;
}

/* Up to sizeof *h bytes of a joiner's hello, waiting at most HELLO_WAIT_MS
 * in all: a joiner that sends part of one and then nothing must not hold
 * the rendezvous (a blocking recv with MSG_WAITALL waited for it forever). */
static size_t read_hello(int s, hello *h)
{
    size_t got = 0;
    int64_t deadline = tp_now_ms_int() + HELLO_WAIT_MS;
    while (got < sizeof *h) {
        int64_t left = deadline - tp_now_ms_int();
        struct pollfd pf = {s, POLLIN, 0};
        int r = left > 0 ? poll(&pf, 1, (int)left) : 0;
        if (r < 0 && errno == EINTR)
            continue;
        ssize_t n = r == 1 ? recv(s, (char *)h + got, sizeof *h - got, MSG_DONTWAIT) : -1;
        if (n < 0 && r == 1 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    return got;
}

/* One joiner: who it is (the kernel's uid), then what it says (its hello,
 * with the group secret); only then does it take a rank's slot, receive
 * the memory and keep the connection (peer_sock). A refusal is logged with
 * the kernel's pid and uid and answered with why. Its pid is the kernel's,
 * not its hello's: it is what a hung rank's SIGKILL goes to, and h.pid (the
 * joiner's getpid()) may be a lie, or a number in another namespace. */
static int admit(tp_rank_procs *p, const char *path, int s)
{
    struct ucred cr;
    char why[200];
    int rank = 0;
    if (!peer_cred(s, &cr)) {
        cr = (struct ucred){0, (uid_t)-1, (gid_t)-1};
        snprintf(why, sizeof why, "error: the kernel gives no credentials for this connection");
    } else if (tp_rank_uid_check(cr.uid, p->uid, p->join_uid, why, sizeof why)) {
        hello h;
        size_t n = read_hello(s, &h);
        int32_t joined[TP_GROUP_MAX_PROCESSES];
        for (int r = 0; r < p->world; r++)
            joined[r] = p->peer_sock[r] >= 0 ? p->pid[r] : -1;
        rank = tp_rank_hello_check(&h, n, p->world, joined, p->secret, why, sizeof why);
    }
    if (!rank) {
        TP_LOG_W("rendezvous '%s': refused a joiner (pid %d, uid %d): %s", path, (int)cr.pid, (int)cr.uid,
                 why + (strncmp(why, "error: ", 7) == 0 ? 7 : 0));
        reply(s, why, -1);
        return 0;
    }
    p->pid[rank] = cr.pid;
    p->peer_sock[rank] = s;
    reply(s, "ok", p->fd);
    return 1;
}

static tp_status accept_ranks(tp_rank_procs *p, const char *path, tp_err *err)
{
    int timeout_ms = p->join_timeout_ms;
    int ls = -1;
    tp_status st = listen_unix(path, &ls, err);
    int joined = 0;
    int64_t deadline = tp_now_ms_int() + timeout_ms;
    while (st == TP_OK && joined < p->world - 1) {
        struct pollfd pf = {ls, POLLIN, 0};
        int64_t left = deadline - tp_now_ms_int();
        if (left <= 0 || poll(&pf, 1, (int)(left < 500 ? left : 500)) < 0) {
            if (left > 0 && errno == EINTR)
                continue;
            st = tp_fail(err, TP_TIMEOUT, "rendezvous '%s': %d of %d ranks joined within %d ms", path, joined + 1,
                         p->world, timeout_ms);
            break;
        }
        if (!(pf.revents & POLLIN))
            continue;
        int s = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
        if (s >= 0 && admit(p, path, s))
            joined++;
        else if (s >= 0)
            close(s);
    }
    if (ls >= 0) {
        close(ls);
        unlink(path);
    }
    /* nobody needs it once the socket is gone */
    if (p->secret_written[0])
        unlink(p->secret_written);
    p->secret_written[0] = 0;
    explicit_bzero(p->secret, sizeof p->secret);
    return st;
}

static tp_status join_rendezvous(tp_rank_procs *p, const char *path, const tp_rank_group_opts *o, tp_err *err)
{
    struct sockaddr_un a;
    if (unix_addr(path, &a, err) != TP_OK)
        return TP_INVALID;
    int timeout = p->join_timeout_ms, *fd = &p->fd;
    int64_t deadline = tp_now_ms_int() + timeout;
    for (;;) {
        int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (s >= 0 && connect(s, (struct sockaddr *)&a, sizeof a) == 0) {
            /* Read now, not before: a leader writes its secret file before
             * it listens, so a rank started first finds it once it connects. */
            hello h = {CTL_MAGIC, o->rank, o->world, getpid(), {0}};
            char own_path[SECRET_PATH_BYTES];
            const char *spath = o->secret_file;
            tp_status st = spath ? TP_OK : secret_path(path, own_path, sizeof own_path, err);
            if (st == TP_OK && !spath)
                spath = own_path;
            if (st == TP_OK)
                st = read_secret(spath, h.secret, err);
            if (st != TP_OK) {
                close(s);
                tp_err_prefix(err, "rendezvous '%s': rank %d: ", path, o->rank);
                return st;
            }
            char buf[256] = "";
            union {
                char b[CMSG_SPACE(sizeof(int))];
                struct cmsghdr align;
            } u;
            struct iovec iov = {buf, sizeof buf};
            struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof u.b};
            int sent = send(s, &h, sizeof h, MSG_NOSIGNAL) == (ssize_t)sizeof h;
            explicit_bzero(h.secret, sizeof h.secret);
            ssize_t n = sent ? recvmsg(s, &m, MSG_WAITALL) : -1;
            struct cmsghdr *c = n > 0 ? CMSG_FIRSTHDR(&m) : NULL;
            buf[sizeof buf - 1] = 0;
            if (n <= 0 || strcmp(buf, "ok") != 0 || !c || c->cmsg_type != SCM_RIGHTS) {
                close(s);
                return tp_fail(err, TP_UNAVAILABLE, "rendezvous '%s': the leader refused rank %d: %s", path, o->rank,
                               n > 0 ? buf : "no answer");
            }
            memcpy(fd, CMSG_DATA(c), sizeof *fd);
            /* kept: it closes when the leader ends, in any pid namespace */
            p->peer_sock[0] = s;
            p->pid[0] = peer_pid(s);
            return TP_OK;
        }
        if (s >= 0)
            close(s);
        if (tp_now_ms_int() > deadline)
            return tp_fail(err, TP_TIMEOUT, "rendezvous '%s': no leader within %d ms: %s", path, timeout, strerror(errno));
        usleep(50 * 1000); /* the leader may start after us */
    }
}

/* ------------------------------------------------------------ create */

static tp_status wait_joined(tp_rank_procs *p, tp_err *err)
{
    int timeout_ms = p->join_timeout_ms;
    int64_t deadline = tp_now_ms_int() + timeout_ms;
    for (int r = 1; r < p->world; r++)
        while (atomic_load(&p->ctl->rank[r].pid) == 0) {
            if (tp_rank_procs_lost(p))
                return tp_fail(err, TP_UNAVAILABLE, "%s before joining", p->lost);
            if (tp_now_ms_int() > deadline)
                return tp_fail(err, TP_TIMEOUT, "rank group: rank %d did not join within %d ms", r, timeout_ms);
            usleep(2000);
        }
    return TP_OK;
}

static tp_status create_leader(tp_rank_procs *p, const tp_rank_group_opts *o, tp_err *err)
{
    tp_status st = create_memory(p, o, err);
    /* A leader that spawns its workers is local rank 0 of them (see
     * worker_env), whatever LOCAL_RANK a launcher gave it. Set before any
     * rank thread exists, so no getenv races it. */
    if (st == TP_OK && o->worker_argv && setenv("LOCAL_RANK", "0", 1) != 0)
        st = tp_fail(err, TP_NOMEM, "rank group: cannot set LOCAL_RANK for the leader");
    if (st == TP_OK && o->worker_argv)
        for (int r = 1; st == TP_OK && r < p->world; r++)
            st = spawn_worker(p, r, o->worker_argv, err);
    else if (st == TP_OK && o->rendezvous) {
        p->uid = (uint32_t)geteuid();
        p->join_uid = o->join_uid;
        st = leader_secret(p, o, err);
        if (st == TP_OK)
            st = accept_ranks(p, o->rendezvous, err);
    }
    else if (st == TP_OK)
        st = tp_fail(err, TP_INVALID, "rank group: processes need worker argv or a rendezvous path");
    return st == TP_OK ? wait_joined(p, err) : st;
}

static tp_status create_worker(tp_rank_procs *p, const tp_rank_group_opts *o, tp_err *err)
{
    tp_status st = TP_OK;
    if (o->rendezvous) {
        st = join_rendezvous(p, o->rendezvous, o, err);
    } else {
        const char *v = getenv("TP_GROUP_FD");
        p->fd = v ? atoi(v) : -1;
        p->spawned = 1;
        if (p->fd < 0)
            return tp_fail(err, TP_INVALID, "worker rank %d: no TP_GROUP_FD from a leader and no rendezvous", o->rank);
        fcntl(p->fd, F_SETFD, FD_CLOEXEC);
    }
    struct stat sb;
    if (st == TP_OK && fstat(p->fd, &sb) != 0)
        st = tp_fail(err, TP_IO, "worker rank %d: group memory fd %d: %s", o->rank, p->fd, strerror(errno));
    if (st == TP_OK && (size_t)sb.st_size < sizeof(ctl_block))
        st = tp_fail(err, TP_INVALID, "worker rank %d: fd %d is not a tpserve rank group", o->rank, p->fd);
    if (st == TP_OK)
        st = map_group(p, (size_t)sb.st_size, err);
    if (st != TP_OK)
        return st;
    ctl_block *c = p->ctl;
    if (c->magic != CTL_MAGIC || c->version != CTL_VERSION || c->total != (uint64_t)sb.st_size)
        return tp_fail(err, TP_INVALID, "worker rank %d: fd %d is not a tpserve rank group (version %u)", o->rank,
                       p->fd, CTL_VERSION);
    if (c->world != o->world)
        return tp_fail(err, TP_INVALID, "worker rank %d: WORLD_SIZE %d, but the leader's group has %d ranks", o->rank,
                       o->world, c->world);
    fill_shared(p);
    if (p->spawned) /* forked by the leader: one pid namespace */
        p->pid[0] = atomic_load(&c->leader_pid);
    atomic_store(&c->rank[o->rank].pid, getpid());
    return TP_OK;
}

tp_status tp_rank_procs_create(const tp_rank_group_opts *o, int64_t spin_ns, tp_rank_procs **out, tp_err *err)
{
    int leader = o->mode == TP_GROUP_PROCESSES;
    if (o->world < 1 || o->world > TP_GROUP_MAX_PROCESSES)
        return tp_fail(err, TP_INVALID, "rank group: world size %d out of range [1, %d] for processes", o->world,
                       TP_GROUP_MAX_PROCESSES);
    if (!leader && (o->rank < 1 || o->rank >= o->world))
        return tp_fail(err, TP_INVALID, "worker rank %d out of range 1..%d (rank 0 is the leader)", o->rank,
                       o->world - 1);
    tp_rank_procs *p = calloc(1, sizeof *p);
    if (!p)
        return tp_fail(err, TP_NOMEM, "rank group: out of memory");
    pthread_mutex_init(&p->live_mu, NULL);
    p->spin_ns = spin_ns;
    p->rank = leader ? 0 : o->rank;
    p->world = o->world;
    p->step_timeout_ms = o->step_timeout_ms;
    p->join_timeout_ms = o->timeout_ms ? o->timeout_ms : 60000;
    p->fd = -1;
    p->watch_fd = -1;
    for (int r = 0; r < TP_GROUP_MAX_PROCESSES; r++)
        p->peer_fd[r] = p->peer_sock[r] = -1;
    p->on_lost = o->on_lost;
    p->on_lost_arg = o->on_lost_arg;
    tp_status st = leader ? create_leader(p, o, err) : create_worker(p, o, err);
    if (st == TP_OK)
        st = start_watcher(p, err);
    if (st != TP_OK) {
        tp_rank_procs_free(p);
        return st;
    }
    *out = p;
    return TP_OK;
}

/* After QUIT, workers get a grace period; in a lost group there is nothing
 * to finish, and a hung worker would never exit on its own. */
static void reap_workers(tp_rank_procs *p)
{
    int64_t deadline = atomic_load(&p->lost_set) ? 0 : tp_now_ms_int() + QUIT_GRACE_MS;
    for (int r = 1; r < p->world; r++) {
        while (p->child[r] > 0 && waitpid(p->child[r], NULL, WNOHANG) == 0 && tp_now_ms_int() < deadline)
            usleep(5000);
        if (p->child[r] > 0 && waitpid(p->child[r], NULL, WNOHANG) == 0) {
            kill(p->child[r], SIGKILL);
            waitpid(p->child[r], NULL, 0);
        }
        p->child[r] = 0;
    }
}

void tp_rank_procs_stop(tp_rank_procs *p)
{
    if (p->rank != 0 || !p->ctl || p->stopped)
        return;
    stop_watcher(p); /* workers quitting are not a loss */
    tp_err e;
    if (!tp_rank_procs_lost(p))
        tp_rank_procs_send(p, TP_MSG_QUIT, NULL, 0, &e);
    reap_workers(p);
    p->stopped = 1;
}

void tp_rank_procs_free(tp_rank_procs *p)
{
    if (!p)
        return;
    tp_rank_procs_stop(p);
    stop_watcher(p);
    if (p->base)
        munmap(p->base, p->total);
    if (p->fd >= 0)
        close(p->fd);
    if (p->watch_fd >= 0)
        close(p->watch_fd);
    for (int r = 0; r < TP_GROUP_MAX_PROCESSES; r++) {
        if (p->peer_fd[r] >= 0)
            close(p->peer_fd[r]);
        if (p->peer_sock[r] >= 0)
            close(p->peer_sock[r]);
    }
    pthread_mutex_destroy(&p->live_mu);
    free(p);
}

int tp_rank_procs_rank(const tp_rank_procs *p) { return p->rank; }

/* Read-only, from any thread of the leader (a readiness probe): nothing
 * here waits or changes the step. A run step is in flight from its RUN
 * message until the leader publishes its merged result; a worker has
 * finished it once its done word reaches the step (one it never received,
 * say while SIGSTOPped, counts as not finished). */
int tp_rank_procs_pending(tp_rank_procs *p, int *ranks, int cap)
{
    if (p->rank != 0)
        return -1;
    uint32_t step = atomic_load(&p->step);
    if ((int32_t)(atomic_load(&p->ctl->result) - step) >= 0)
        return 0; /* no run step in flight */
    int n = 0;
    for (int r = 1; r < p->world; r++)
        if ((int32_t)(atomic_load(&p->ctl->rank[r].done) - step) < 0) {
            if (n < cap)
                ranks[n] = r;
            n++;
        }
    if (n == 0 && cap > 0) /* every worker is done: rank 0 (this process) is not */
        ranks[n++] = 0;
    return n;
}
const tp_rank_shared *tp_rank_procs_shared(const tp_rank_procs *p) { return &p->shared; }

/* ------------------------------------------------------------ messages */

static const char *kind_name(uint32_t k)
{
    static const char *names[] = {"?", "run", "share", "command", "quit"};
    return k <= TP_MSG_QUIT ? names[k] : "?";
}

tp_status tp_rank_procs_send(tp_rank_procs *p, int kind, const void *buf, size_t len, tp_err *err)
{
    if (len > TP_GROUP_MESSAGE)
        return tp_fail(err, TP_INTERNAL, "rank group: message of %zu bytes (at most %d)", len, TP_GROUP_MESSAGE);
    /* the slot we reuse must have been read by every worker */
    for (int r = 1; p->seen >= RING && r < p->world; r++) {
        /* nobody wakes it: a worker this far behind is rare */
        tp_status st = wait_for(p, (reach){p, &p->ctl->rank[r].seen, NULL, p->seen - RING + 1, NULL}, &p->ring_site,
                                p->spin_ns, WAIT_SLICE_MS, 0, err);
        if (st != TP_OK)
            return st;
    }
    ctl_msg *m = &p->ctl->ring[p->seen % RING];
    m->kind = (uint32_t)kind;
    m->len = (uint32_t)len;
    if (len)
        memcpy(m->data, buf, len);
    if (kind == TP_MSG_RUN) {
        atomic_store(&p->step, p->seen + 1);
        atomic_store(&p->step_deadline, p->step_timeout_ms > 0 ? tp_now_ms_int() + p->step_timeout_ms : 0);
    }
    atomic_store(&p->ctl->seq, ++p->seen);
    tp_futex_wake_sleepers(&p->ctl->seq, &p->ctl->seq_sleepers, 1);
    return TP_OK;
}

void tp_rank_procs_prewake(tp_rank_procs *p)
{
    if (p->rank != 0 || p->spin_ns <= 0)
        return;
    atomic_fetch_add(&p->ctl->pokes, 1);
    tp_futex_wake_sleepers(&p->ctl->seq, &p->ctl->seq_sleepers, 1);
}

tp_status tp_rank_procs_recv(tp_rank_procs *p, int kind, void *buf, size_t cap, size_t *len, int *quit, tp_err *err)
{
    *quit = 0;
    int64_t spin = kind == TP_MSG_CMD ? p->spin_ns * CMD_SPIN_FACTOR : p->spin_ns;
    /* the next command may be hours away: sleep until it or a loss comes */
    tp_status st = wait_for(p, (reach){p, &p->ctl->seq, &p->ctl->seq_sleepers, p->seen + 1, &p->ctl->pokes},
                            &p->recv_site[kind], spin, p->watched ? -1 : WAIT_SLICE_MS, kind == TP_MSG_CMD, err);
    if (st != TP_OK)
        return st;
    const ctl_msg *m = &p->ctl->ring[p->seen % RING];
    uint32_t k = m->kind, n = m->len;
    if (k == (uint32_t)kind && n <= cap && n)
        memcpy(buf, m->data, n);
    atomic_store(&p->ctl->rank[p->rank].seen, ++p->seen);
    if (k == TP_MSG_RUN)
        atomic_store(&p->step, p->seen);
    if (len)
        *len = n;
    if (k == TP_MSG_QUIT) {
        *quit = 1;
        return tp_fail(err, TP_UNAVAILABLE, "quit: the leader shut the rank group down");
    }
    if (k != (uint32_t)kind || n > cap)
        return tp_fail(err, TP_INTERNAL, "rank %d: expected a %s message, the leader sent a %s of %u bytes (the processes diverged)",
                       p->rank, kind_name((uint32_t)kind), kind_name(k), n);
    return TP_OK;
}

/* ------------------------------------------------------------ steps */

int tp_rank_procs_poll(tp_rank_procs *p)
{
    int f = atomic_load(&p->ctl->abort_step) == atomic_load(&p->step) ? TP_POLL_ABORT : 0;
    return tp_rank_procs_lost(p) ? f | TP_POLL_LOST : f;
}

uint32_t tp_rank_procs_fail_ticket(tp_rank_procs *p, int wake_peers)
{
    if (wake_peers)
        atomic_store(&p->ctl->abort_step, atomic_load(&p->step));
    return atomic_fetch_add(&p->ctl->tickets, 1) + 1;
}

static void record(ctl_rank *slot, tp_status st, const tp_err *e, uint32_t ticket)
{
    slot->status = st;
    slot->ticket = st == TP_OK ? 0 : ticket;
    tp_text_copy(slot->msg, sizeof slot->msg, st == TP_OK ? "" : e->msg);
}

tp_status tp_rank_procs_finish(tp_rank_procs *p, tp_status st, const tp_err *e, uint32_t ticket, tp_err *err)
{
    ctl_block *c = p->ctl;
    uint32_t step = atomic_load(&p->step);
    record(&c->rank[p->rank], st, e, ticket);
    if (p->rank != 0) {
        atomic_store(&c->rank[p->rank].done, step);
        tp_futex_wake_sleepers(&c->rank[p->rank].done, &c->rank[p->rank].done_sleepers, 1);
        tp_status w = wait_for(p, (reach){p, &c->result, &c->result_sleepers, step, NULL}, &p->finish_site,
                               p->spin_ns, WAIT_SLICE_MS, 0, err);
        if (w != TP_OK)
            return w;
        if (c->result_status != TP_OK)
            snprintf(err->msg, sizeof err->msg, "%s", c->result_msg);
        return (tp_status)c->result_status;
    }
    int first = st == TP_OK ? -1 : 0;
    for (int r = 1; r < p->world; r++) {
        tp_status w = wait_for(p, (reach){p, &c->rank[r].done, &c->rank[r].done_sleepers, step, NULL},
                               &p->finish_site, p->spin_ns, WAIT_SLICE_MS, 0, err);
        if (w != TP_OK) {
            atomic_store(&c->result, step); /* release whoever still waits */
            tp_futex_wake(&c->result, 1);
            return w;
        }
        if (c->rank[r].status != TP_OK && (first < 0 || c->rank[r].ticket < c->rank[first].ticket))
            first = r;
    }
    atomic_store(&p->step_deadline, 0);
    c->result_status = first < 0 ? TP_OK : c->rank[first].status;
    tp_text_copy(c->result_msg, sizeof c->result_msg, first < 0 ? "" : c->rank[first].msg);
    atomic_store(&c->result, step);
    tp_futex_wake_sleepers(&c->result, &c->result_sleepers, 1);
    if (first >= 0)
        snprintf(err->msg, sizeof err->msg, "%s", c->result_msg);
    return (tp_status)c->result_status;
}
