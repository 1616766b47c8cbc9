#include "acceptor.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

/* After accept() ran out of a resource (descriptors, memory), how long to
 * wait before trying again instead of spinning on a socket that stays
 * readable. */
#define RETRY_MS 10
/* Connections accepted per wake-up before the stop descriptor is looked
 * at again. */
#define ACCEPT_SERIES 64
/* While every daemon is full by our count, how often the count is checked
 * against the daemons' own (reconcile). */
#define RECONCILE_MS 200

/* A client address as the per-address count's key: the address's length
 * (4 or 16; 0 for anything else), then its bytes (an IPv4-mapped IPv6
 * address counts as the IPv4 one). */
typedef struct {
    unsigned char b[17];
} ip_key;

typedef struct ip_count {
    struct ip_count *next;
    ip_key ip;
    int n;
} ip_count;

#define IP_BUCKETS 256

struct tp_acceptor {
    int listen_fd, wake_fd, n, per_ip;
    struct MHD_Daemon **d;
    unsigned *limit;        /* per daemon */
    _Atomic unsigned *live; /* per daemon; changed under mu, read anywhere (tp_acceptor_live) */
    unsigned next;          /* where the search for the least loaded starts */
    pthread_mutex_t mu;
    ip_count *by_ip[IP_BUCKETS]; /* under mu */
    _Atomic int stop, waiting_for_room;
    /* The daemon whose thread runs a step that may stall while serving
     * no one else (tp_acceptor_claim_alone), -1: none. New connections
     * avoid it. */
    _Atomic int alone;
    pthread_t th;
    int running, drained;
    /* tp_acceptor_route_by_cpu: the daemon whose thread runs on CPU c
     * (-1: none), for c < n_cpu; n_cpu 0 routes by load alone (under mu) */
    int16_t daemon_of_cpu[TP_ACCEPTOR_MAX_CPUS];
    int n_cpu;
};

/* ---- counting ----------------------------------------------------------- */

static ip_key key_of(const struct sockaddr *sa)
{
    ip_key k = {{0}};
    if (sa && sa->sa_family == AF_INET) {
        k.b[0] = 4;
        memcpy(k.b + 1, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
    } else if (sa && sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
        int mapped = IN6_IS_ADDR_V4MAPPED(a);
        k.b[0] = mapped ? 4 : 16;
        memcpy(k.b + 1, a->s6_addr + (mapped ? 12 : 0), k.b[0]);
    }
    return k;
}

static ip_count **find_ip(tp_acceptor *a, const ip_key *k)
{
    unsigned h = 2166136261u; /* FNV-1a */
    for (int i = 0; i <= k->b[0]; i++)
        h = (h ^ k->b[i]) * 16777619u;
    ip_count **p = &a->by_ip[h % IP_BUCKETS];
    while (*p && memcmp(&(*p)->ip, k, sizeof *k) != 0)
        p = &(*p)->next;
    return p;
}

/* Under mu: one more connection from k, or 0 when k already has per_ip
 * (or there is no memory to count it). */
static int count_ip_in(tp_acceptor *a, const ip_key *k)
{
    if (a->per_ip <= 0)
        return 1;
    ip_count **p = find_ip(a, k);
    if (!*p && (*p = calloc(1, sizeof **p)))
        (*p)->ip = *k;
    if (!*p || (*p)->n >= a->per_ip)
        return 0;
    (*p)->n++;
    return 1;
}

static void count_ip_out(tp_acceptor *a, const ip_key *k)
{
    if (a->per_ip <= 0)
        return;
    ip_count **p = find_ip(a, k), *c = *p;
    if (c && --c->n == 0) {
        *p = c->next;
        free(c);
    }
}

/* Under mu: the daemon holding the fewest connections among those below
 * their limits, other than skip (-1: none), searched from a rotating start
 * so equals take turns; -1 when all are full. */
static int least_loaded(tp_acceptor *a, int skip)
{
    int best = -1;
    for (int k = 0; k < a->n; k++) {
        int i = (int)((a->next + (unsigned)k) % (unsigned)a->n);
        if (i != skip && a->live[i] < a->limit[i] && (best < 0 || a->live[i] < a->live[best]))
            best = i;
    }
    a->next++;
    return best;
}

static int all_full(tp_acceptor *a)
{
    pthread_mutex_lock(&a->mu);
    int full = 1;
    for (int i = 0; i < a->n && full; i++)
        full = a->live[i] >= a->limit[i];
    pthread_mutex_unlock(&a->mu);
    return full;
}

/* Under mu: the daemon whose thread runs on the CPU c's packets arrive on
 * (tp_acceptor_route_by_cpu), while it has room and holds at most
 * 2 + (average held) / 2 more than the least loaded; otherwise the least
 * loaded, or -1 when all are full. The bound matters: a client whose
 * threads all connected from one CPU (wrk's threads often start on the CPU
 * that spawned them, and spread only later) had every connection on that
 * CPU's thread, which served 54k requests/s while the other idled, against
 * 88-98k when they connected from both CPUs; bounded, such a client gets
 * about two to one (64-67k). A bound of one connection split clients that
 * connect from both CPUs in bursts as though they had not. */
static int daemon_for(tp_acceptor *a, int c, int skip)
{
    int cpu = -1, best = least_loaded(a, skip);
    socklen_t len = sizeof cpu;
    if (best >= 0 && a->n_cpu > 0 && getsockopt(c, SOL_SOCKET, SO_INCOMING_CPU, &cpu, &len) == 0 &&
        cpu >= 0 && cpu < a->n_cpu) {
        int i = a->daemon_of_cpu[cpu];
        unsigned total = 0;
        for (int k = 0; k < a->n; k++)
            total += a->live[k];
        unsigned slack = 2 + total / (2u * (unsigned)a->n);
        if (i >= 0 && i != skip && a->live[i] < a->limit[i] && a->live[i] <= a->live[best] + slack)
            return i;
    }
    return best;
}

/* Under mu: the daemon for c, counted in (-1: all full). Never the one
 * whose thread runs a step that may stall (tp_acceptor_claim_alone), whose
 * connections could wait for minutes: the count goes up first, then the
 * claim is looked at (both sequentially consistent), as the claimer sets
 * its claim, then looks at the count; so either it sees this connection
 * and gives the claim up, or this sees the claim and takes the connection
 * elsewhere. Only when no other daemon has room does the connection go to
 * the claimed one (it is answered once the step ends), as before claims. */
static int place(tp_acceptor *a, int c)
{
    int skip = atomic_load(&a->alone);
    for (int tries = 0; tries < 4; tries++) {
        int i = daemon_for(a, c, skip);
        if (i < 0)
            i = daemon_for(a, c, -1);
        if (i < 0)
            return -1;
        a->live[i]++;
        int now = atomic_load(&a->alone);
        if (now != i || tries == 3)
            return i;
        a->live[i]--; /* claimed meanwhile: try again without it */
        skip = now;
    }
    return -1; /* not reached */
}

/* Counts c (just accepted from sa) in and hands it to a daemon. A
 * connection over the per-address limit is closed unanswered; libmicrohttpd
 * closes one it refuses itself. */
static void admit(tp_acceptor *a, int c, const struct sockaddr *sa, socklen_t sl)
{
    ip_key k = key_of(sa);
    pthread_mutex_lock(&a->mu);
    int i = count_ip_in(a, &k) ? place(a, c) : -2;
    if (i == -1)
        count_ip_out(a, &k);
    pthread_mutex_unlock(&a->mu);
    if (i < 0) {
        close(c);
        return;
    }
    if (MHD_add_connection(a->d[i], c, sa, sl) != MHD_YES) {
        pthread_mutex_lock(&a->mu);
        a->live[i]--;
        count_ip_out(a, &k);
        pthread_mutex_unlock(&a->mu);
    }
}

void tp_acceptor_route_by_cpu(tp_acceptor *a, const int *cpu_of_daemon)
{
    pthread_mutex_lock(&a->mu);
    a->n_cpu = 0;
    for (int c = 0; c < TP_ACCEPTOR_MAX_CPUS; c++)
        a->daemon_of_cpu[c] = -1;
    for (int i = a->n - 1; i >= 0; i--) /* the first daemon on a CPU wins */
        if (cpu_of_daemon[i] >= 0 && cpu_of_daemon[i] < TP_ACCEPTOR_MAX_CPUS) {
            a->daemon_of_cpu[cpu_of_daemon[i]] = (int16_t)i;
            if (cpu_of_daemon[i] >= a->n_cpu)
                a->n_cpu = cpu_of_daemon[i] + 1;
        }
    pthread_mutex_unlock(&a->mu);
}

unsigned tp_acceptor_live(tp_acceptor *a, int i) { return atomic_load_explicit(&a->live[i], memory_order_relaxed); }

int tp_acceptor_claim_alone(tp_acceptor *a, int i)
{
    /* the relaxed look first: a thread serving several clients (the usual
     * case under load) pays no more than that */
    if (a->n < 2 || atomic_load_explicit(&a->live[i], memory_order_relaxed) != 1)
        return 0;
    int none = -1;
    if (!atomic_compare_exchange_strong(&a->alone, &none, i))
        return 0; /* another daemon's thread has the claim */
    if (atomic_load(&a->live[i]) == 1)
        return 1;
    atomic_store(&a->alone, -1); /* a connection came meanwhile */
    return 0;
}

void tp_acceptor_end_alone(tp_acceptor *a, int i)
{
    int mine = i;
    atomic_compare_exchange_strong(&a->alone, &mine, -1);
}

void tp_acceptor_released(tp_acceptor *a, struct MHD_Connection *c)
{
    /* Each answer taken before the next call: libmicrohttpd 1.0 answers
     * every call in the same place (the connection's one info union), so
     * the address asked for first read as the daemon asked for second, and
     * no close was ever counted out of its address. */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    ip_key k = key_of(ci ? ci->client_addr : NULL);
    const union MHD_ConnectionInfo *di = MHD_get_connection_info(c, MHD_CONNECTION_INFO_DAEMON);
    struct MHD_Daemon *d = di ? di->daemon : NULL;
    pthread_mutex_lock(&a->mu);
    count_ip_out(a, &k);
    for (int i = 0; i < a->n; i++)
        if (d == a->d[i] && a->live[i] > 0)
            a->live[i]--;
    pthread_mutex_unlock(&a->mu);
    /* the accept loop stopped watching the socket while all were full */
    uint64_t one = 1;
    if (atomic_exchange(&a->waiting_for_room, 0) && write(a->wake_fd, &one, sizeof one) != sizeof one)
        TP_LOG_W("waking the accept thread: %s", strerror(errno));
}

/* Our count of a daemon's connections rests on its CLOSED notifications,
 * and libmicrohttpd sends none for a connection it drops after
 * MHD_add_connection said yes but before it started it (its memory pool
 * could not be allocated, or its own limit was reached). Such a place
 * would stay taken forever, and enough of them would stop the server
 * accepting. So while all daemons look full (nothing is being added, and
 * what was added has long been started), a daemon that holds fewer
 * connections than we count gets our count lowered to its own. */
static void reconcile(tp_acceptor *a)
{
    for (int i = 0; i < a->n; i++) {
        const union MHD_DaemonInfo *info = MHD_get_daemon_info(a->d[i], MHD_DAEMON_INFO_CURRENT_CONNECTIONS);
        pthread_mutex_lock(&a->mu);
        unsigned held = info ? info->num_connections : a->live[i], lost = a->live[i] > held ? a->live[i] - held : 0;
        a->live[i] -= lost;
        pthread_mutex_unlock(&a->mu);
        if (lost)
            TP_LOG_W("HTTP thread %d: %u connections were dropped without a close notice; their places are free again",
                     i, lost);
    }
}

/* ---- the accept loop ------------------------------------------------------ */

/* Accepts up to ACCEPT_SERIES connections (fewer when the backlog empties
 * or every daemon fills). Returns how many, or -1 when accept() ran out of
 * a resource. */
static int accept_series(tp_acceptor *a, int series)
{
    int n = 0;
    for (; n < series && !all_full(a); n++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int c = accept4(a->listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                TP_LOG_W("accepting a connection: %s; retrying in %d ms", strerror(errno), RETRY_MS);
                return -1;
            }
            break; /* EAGAIN: the backlog is empty (or a connection reset before its accept) */
        }
        admit(a, c, (struct sockaddr *)&ss, sl);
    }
    return n;
}

static void *accept_main(void *arg)
{
    tp_acceptor *a = arg;
    int retry = 0;
    while (!atomic_load(&a->stop)) {
        /* full: wait for a release (or the stop) without watching the socket */
        atomic_store(&a->waiting_for_room, 1);
        int full = all_full(a);
        if (!full)
            atomic_store(&a->waiting_for_room, 0);
        struct pollfd p[2] = {{a->wake_fd, POLLIN, 0}, {a->listen_fd, POLLIN, 0}};
        int got = poll(p, full ? 1 : 2, retry ? RETRY_MS : full ? RECONCILE_MS : -1);
        if (got < 0 && errno != EINTR) {
            TP_LOG_E("accepting connections: poll: %s; the main port takes no new connections",
                     strerror(errno));
            break;
        }
        if (p[0].revents) {
            uint64_t v;
            if (read(a->wake_fd, &v, sizeof v) < 0 && errno != EAGAIN)
                TP_LOG_W("the accept thread's wake-up: %s", strerror(errno));
        }
        if (full && got == 0)
            reconcile(a);
        retry = !full && !atomic_load(&a->stop) && (got == 0 || p[1].revents) && accept_series(a, ACCEPT_SERIES) < 0;
    }
    return NULL;
}

/* ---- lifecycle ------------------------------------------------------------ */

tp_status tp_acceptor_start(int listen_fd, struct MHD_Daemon *const *d, int n, const unsigned *limit,
                            int per_ip, tp_acceptor **out, tp_err *err)
{
    *out = NULL;
    tp_acceptor *a = calloc(1, sizeof *a);
    if (!a)
        return tp_fail(err, TP_NOMEM, "out of memory");
    a->listen_fd = listen_fd;
    a->n = n;
    a->per_ip = per_ip;
    a->d = malloc((size_t)n * sizeof *a->d);
    a->limit = malloc((size_t)n * sizeof *a->limit);
    a->live = calloc((size_t)n, sizeof *a->live);
    a->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    atomic_init(&a->alone, -1);
    pthread_mutex_init(&a->mu, NULL);
    if (!a->d || !a->limit || !a->live) {
        tp_acceptor_free(a);
        return tp_fail(err, TP_NOMEM, "out of memory");
    }
    memcpy(a->d, d, (size_t)n * sizeof *d);
    memcpy(a->limit, limit, (size_t)n * sizeof *limit);
    int fl = fcntl(listen_fd, F_GETFL);
    /* accept() once the backlog is empty must fail, not wait */
    int e = a->wake_fd < 0 || fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0
                ? errno
                : pthread_create(&a->th, NULL, accept_main, a);
    if (e) {
        tp_acceptor_free(a);
        return tp_fail(err, TP_INTERNAL, "cannot start the accept thread: %s", strerror(e));
    }
    a->running = 1;
    *out = a;
    return TP_OK;
}

void tp_acceptor_stop(tp_acceptor *a)
{
    if (!a || !a->running)
        return;
    atomic_store(&a->stop, 1);
    uint64_t one = 1;
    if (write(a->wake_fd, &one, sizeof one) != sizeof one)
        TP_LOG_E("stopping the accept thread: %s", strerror(errno));
    pthread_join(a->th, NULL);
    a->running = 0;
}

/* After the drain stopped new handshakes: how long the backlog must stay
 * empty before the socket is shut (a handshake under way when the filter
 * went on completes within a round trip; on loopback, within the
 * client's connect()). */
#define DRAIN_QUIET_MS 10

/* The drain's first step (acceptor.h): the listening socket takes no new handshakes
 * (a socket filter drops their SYNs, so the client's retry meets the shut
 * socket and is refused) while connections the kernel has completed stay
 * in the backlog to be handed over. Shut at once, the socket reset every
 * connection that completed between the last accept and the shutdown:
 * its client had sent a request and saw the connection reset
 * (test_signals_poison's SIGTERM storm, once in a CI run under ASan). */
int tp_acceptor_refuse_handshakes(int fd)
{
    struct sock_filter drop_syn[] = {
        BPF_STMT(BPF_LD | BPF_B | BPF_ABS, 13),           /* the TCP header's flags byte */
        BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, 0x02, 0, 1), /* SYN set? */
        BPF_STMT(BPF_RET | BPF_K, 0),                     /* dropped */
        BPF_STMT(BPF_RET | BPF_K, 0xffffffffu),           /* kept whole */
    };
    struct sock_fprog prog = {sizeof drop_syn / sizeof drop_syn[0], drop_syn};
    return setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog);
}

unsigned tp_acceptor_drain(tp_acceptor *a)
{
    if (!a || a->drained)
        return 0;
    tp_acceptor_stop(a);
    a->drained = 1;
    int filtered = tp_acceptor_refuse_handshakes(a->listen_fd) == 0;
    if (!filtered)
        TP_LOG_W("draining: no socket filter (%s); a connection completing while the listening socket shuts "
                 "may be reset", strerror(errno));
    unsigned handed = 0;
    for (int round = 0;; round++) {
        int n = 0;
        for (int k; (k = accept_series(a, ACCEPT_SERIES)) > 0;)
            n += k;
        handed += (unsigned)n;
        /* a later round that took nothing (every daemon full, accept()
         * failing) ends the wait: with the backlog still readable, it would
         * only spin */
        if (!filtered || (round > 0 && n == 0))
            break;
        struct pollfd p = {a->listen_fd, POLLIN, 0};
        if (poll(&p, 1, DRAIN_QUIET_MS) <= 0)
            break;
    }
    /* shutdown() moves a Linux listening socket out of LISTEN: new
     * connections are refused, and the descriptor stays the caller's */
    shutdown(a->listen_fd, SHUT_RD);
    return handed;
}

void tp_acceptor_free(tp_acceptor *a)
{
    if (!a)
        return;
    tp_acceptor_stop(a);
    for (int i = 0; i < IP_BUCKETS; i++)
        for (ip_count *c = a->by_ip[i], *next; c; c = next) {
            next = c->next;
            free(c);
        }
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    pthread_mutex_destroy(&a->mu);
    free(a->d);
    free(a->limit);
    free(a->live);
    free(a);
}
