/* acceptor.h — the main port's accept loop: spreads connections evenly over
 * the HTTP threads and enforces the connection limits.
 *
 * libmicrohttpd's thread pool shares one listening socket, and whichever
 * worker wakes first accepts up to ten connections in a row. A client
 * opening its connections together (wrk, a connection pool warming up)
 * often landed all of them on one of 2 threads: one core served while the
 * other idled (about 39k JSON requests/s against 50-55k with the
 * connections spread). SO_REUSEPORT sockets, one per thread, spread by a
 * hash: no more all-on-one runs, but 8 connections split 2/6 or 3/5 as
 * often as 4/4, which cost 10-20% at 8 connections (server/README.md at 27cb4dd,
 * "Spreading connections").
 *
 * Here one thread accepts, and hands each connection to the daemon (one
 * per HTTP thread, started with MHD_USE_NO_LISTEN_SOCKET) that holds the
 * fewest, with MHD_add_connection. It also counts what the limits need:
 * max_connections (each daemon's share of it) and max_connections_per_ip
 * over all the daemons. A connection over the per-address limit is closed
 * unanswered, as libmicrohttpd's own limit does; while every daemon holds
 * its share, nothing is accepted and new connections wait in the kernel's
 * backlog. */
#ifndef TP_ACCEPTOR_H
#define TP_ACCEPTOR_H

#include <microhttpd.h>

#include "status.h"

typedef struct tp_acceptor tp_acceptor;

/* Starts the thread accepting on listen_fd (listening; it stays the
 * caller's and is made non-blocking) for d[0..n), each holding at most
 * limit[i] connections; per_ip 0 sets no per-address limit. The daemons
 * must report every connection's end with tp_acceptor_released. */
tp_status tp_acceptor_start(int listen_fd, struct MHD_Daemon *const *d, int n, const unsigned *limit,
                            int per_ip, tp_acceptor **out, tp_err *err);

/* c, one of the daemons' connections, closed (its CLOSED notification):
 * its place, and its address's, are free again. */
void tp_acceptor_released(tp_acceptor *a, struct MHD_Connection *c);

/* Routes each new connection to the daemon whose thread runs on the CPU
 * its packets arrive on (SO_INCOMING_CPU: for a client on this machine,
 * the CPU it sent from), when that daemon has room: cpu_of_daemon[i] is
 * the CPU daemon d[i]'s thread is pinned to (-1: none). Everything else
 * goes by load, as before the call. A client and the thread serving it
 * then share a CPU, and each wakes the other there: on a VM whose idle
 * vCPUs halt, a wake-up across CPUs cost 45 us against 1-2 on the same
 * one (server/README.md at 27cb4dd, "HTTP threads pinned, connections by CPU"). */
#define TP_ACCEPTOR_MAX_CPUS 1024
void tp_acceptor_route_by_cpu(tp_acceptor *a, const int *cpu_of_daemon);

/* The connections daemon d[i] holds now, by the acceptor's count (a
 * relaxed read from any thread: a hint, e.g. whether the daemon's thread
 * serves more than one client). */
unsigned tp_acceptor_live(tp_acceptor *a, int i);

/* The calling thread, daemon i's, is about to run an engine step that may
 * stall (a stopped rank process, a hung GPU: tp_engine_steps_may_stall)
 * and must not leave anyone waiting behind it: returns 1 when daemon i
 * holds one connection (the caller's own) and another daemon could take
 * new ones; from then until tp_acceptor_end_alone(a, i), new connections
 * go to the other daemons. 0 (and nothing changes) otherwise: run the
 * step elsewhere. One daemon at a time may be claimed, so new connections
 * always have another daemon to go to. Lock-free: a compare-exchange and a
 * load (a store with tp_acceptor_end_alone), ~20-40 ns; the accept thread
 * checks its choice against it (a Dekker handshake on the connection
 * count, so neither can miss the other). */
int tp_acceptor_claim_alone(tp_acceptor *a, int i);
void tp_acceptor_end_alone(tp_acceptor *a, int i);

/* Stops accepting and joins the thread; again is a no-op. Call before
 * stopping the daemons, so none is handed a connection while it stops. */
void tp_acceptor_stop(tp_acceptor *a);

/* Stops accepting, then hands what the kernel's backlog still holds to
 * the daemons (connections completed before the call get an answer, not a
 * reset) and shuts the listening socket down, so new ones are refused.
 * Returns how many were handed over (0 when already drained). */
unsigned tp_acceptor_drain(tp_acceptor *a);

/* The first step of tp_acceptor_drain: listen_fd (listening) completes no
 * new handshake from now on (their SYNs are dropped, so a client's retry
 * finds the socket shut and is refused), while the connections already
 * completed stay in its backlog to be accepted. 0, or -1 with errno. */
int tp_acceptor_refuse_handshakes(int listen_fd);

/* Call once the daemons have stopped (they report their connections' ends
 * here until then). NULL is a no-op. */
void tp_acceptor_free(tp_acceptor *a);

#endif
