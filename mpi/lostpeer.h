/* Naming the ranks that stopped answering when the launcher ends the job.
 *
 * A node that dies or is cut off is noticed first by mpirun: its
 * connection to the node's daemon closes (or TCP keepalive gives up), and
 * it ends the job at once. Each surviving rank gets SIGCONT, SIGTERM one
 * second later and SIGKILL one second after that (Open MPI's
 * odls_base_sigkill_timeout, 1 s), long before the watchdog's
 * --comm-timeout; mpirun's own line names the node's daemon, not the ranks.
 * So at SIGTERM every rank asks its peers, over UDP, whether they are still
 * there, and the lowest rank that is prints one line:
 *
 *   dtrain: ranks 2,3 on node2 stopped answering: no reply to rank 0 (tp 0
 *   pp 0 dp 0, host node1) within 0.3 s of SIGTERM (it was waiting 2.1 s in
 *   irecv on group pp, peer pp rank 1 = rank 2 on node2); the job is being
 *   ended
 *
 * A SIGTERM with every rank answering (scancel, preemption, ^C on mpirun,
 * which end every rank the same way) prints nothing: the line needs a rank
 * that does not answer, not a guess from how long a call has waited.
 *
 * Who prints: the lowest world rank that answers. A rank asks the ranks
 * below it (r-1 first, 64 at a time, downwards) and stays silent as soon
 * as one answers; the rank that hears none asks every rank and prints the
 * ones that did not answer, grouped by host. One line in the job's output,
 * whichever ranks are lost (the lost ranks' own lines, where they still
 * run, go to a daemon that is gone).
 *
 * A rank whose watchdog ends the job (--comm-timeout) claims the job's
 * line first (lostpeer_claim_line): every rank is told, the report then
 * stays silent at the SIGTERM that follows, and the watchdogs of the other
 * ranks that waited (ranks frozen and woken by mpirun's SIGCONT among
 * them) end their ranks without a line of their own. The claim also asks
 * every rank, so that the watchdog's line names those that no longer
 * answer (a frozen node's, a lost node's under srun) and not only the
 * operation it waited in.
 *
 * Each rank has a thread and two UDP sockets bound to every interface: one
 * answers questions, one asks them (so that the startup check on the main
 * thread and the thread's answers never read each other's datagrams). A
 * question goes to every IPv4 address the peer has (at most
 * LOSTPEER_ADDRS; 127.0.0.1 on its own host), names the job (a random
 * token of rank 0's) and the rank asked, and is asked again every 50 ms
 * until the deadline. At start every rank checks the paths it will use
 * (rank 0 asks everyone, every other rank asks the rank below it); where a
 * firewall or an address the peers cannot reach makes that fail, the
 * trainer turns the report off on every rank and says so once.
 *
 * Cost: nothing while training (the thread sleeps in poll); at a SIGTERM a
 * few datagrams per rank, and one per rank from the rank that prints. */
#ifndef DTRAIN_LOSTPEER_H
#define DTRAIN_LOSTPEER_H

#include <stddef.h>
#include <stdint.h>

typedef struct lostpeer lostpeer_t;

#define LOSTPEER_ADDRS 8    /* IPv4 addresses a rank offers; more are left out */
#define LOSTPEER_WAIT_S 0.5 /* how long the judging rank waits for every answer */

/* Where a rank answers, as exchanged at start (fixed size and byte order,
 * for an all-gather of bytes): its IPv4 addresses (0: unused), its
 * answering port, and its random token (rank 0's names the job). */
typedef struct lostpeer_addr {
    uint32_t ip[LOSTPEER_ADDRS]; /* network byte order */
    uint32_t port;               /* host byte order */
    uint32_t token[2];
} lostpeer_addr_t;

/* Opens the sockets of world rank `rank` of `size`, whose line names it as
 * `who` ("rank 0 (tp 0 pp 0 dp 0, host node1)"), and fills *mine with its
 * addresses. No thread yet. NULL with err set on failure. */
lostpeer_t *lostpeer_open(int rank, int size, const char *who, lostpeer_addr_t *mine, char *err, size_t errlen);

/* Every rank's addresses (size entries, by world rank) and host (size
 * names of hostlen bytes, cut to hostlen - 1), copied; starts the
 * answering thread. 0, or -1 with err set. */
int lostpeer_start(lostpeer_t *lp, const lostpeer_addr_t *all, const char *hosts, int hostlen, char *err,
                   size_t errlen);

/* The start-up check, on the calling thread, every rank after
 * lostpeer_start: rank 0 asks every rank, the others the rank below them,
 * waiting up to 3 s. 0, or -1 with err naming the first rank that did not
 * answer. Until it has passed, a SIGTERM asks nothing. */
int lostpeer_check(lostpeer_t *lp, char *err, size_t errlen);

/* A function that describes what the main thread is blocked in ("waiting
 * 2.1 s in irecv on group pp, ..."), or writes "" (never blocks), for the
 * line; optional. Call before lostpeer_start. */
void lostpeer_set_context(lostpeer_t *lp, void (*describe)(void *ctx, char *buf, size_t len), void *ctx);

/* The descriptor to write one byte to at SIGTERM (from the signal handler:
 * write(2) is async-signal-safe), or -1 for a NULL lp. */
int lostpeer_term_fd(const lostpeer_t *lp);

/* This rank is about to end the job with a line of its own (the
 * watchdog's): 1 when another rank printed the job's line already, or a
 * lower rank claimed it within 0.2 s of this one (this one should then
 * print nothing), else 0; every rank is told, so that
 * none prints another (the report, or its own watchdog's), and `silent`
 * gets the ranks that do not answer within LOSTPEER_WAIT_S ("ranks 2,3 on
 * node2"; "" when all do, or when the thread did not get to it within 2
 * s). Reads what came in while the process was stopped first: ranks that
 * were frozen and woken by the launcher's SIGCONT see the line of the rank
 * that ended the job. Any thread but the report's own. NULL gives 0. */
int lostpeer_claim_line(lostpeer_t *lp, char *silent, size_t len);

/* Stops and joins the thread, closes the sockets, frees lp. NULL is fine. */
void lostpeer_close(lostpeer_t *lp);

#endif
