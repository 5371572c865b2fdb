/* The lost-peer report's rules (mpi/lostpeer.h), on one machine: mpiexec
 * -np 4 test_lostpeer MODE [RANKS]. Ranks 0,1 play host "hostA" and 2,3
 * "hostB" (every address 127.0.0.1), so the per-host steps run as across
 * nodes. A "lost" rank closes its report (it answers nothing, as a killed
 * or cut-off node) but stays in MPI, so the job itself ends cleanly; the
 * SIGTERM a launcher sends is raise(SIGTERM) through dtrain's own handler
 * (launch_catch_stop_signals). test_lostpeer.sh counts the lines:
 *
 *   lost R,R..   those ranks lost, the others get SIGTERM: one line naming
 *                exactly them, from the lowest rank left
 *   all          every rank gets SIGTERM (preemption, ^C): no line
 *   staggered    ranks 0,1 get SIGTERM, then are lost, then 2,3 get theirs
 *                (mpirun ends its own node's ranks 2 s before the
 *                others'): no line
 *   ending R     rank R claims the job's line (its watchdog's) and is
 *                lost; the others get SIGTERM: no line
 *   claim        rank 0 claims the job's line, then the others try: each
 *                is told to stay quiet ("claim: rank R: quiet")
 *   together     every rank claims the line at once (watchdogs that time
 *                out in the same second): rank 0 alone prints
 *   badport      rank 0 has a wrong port for rank 3: its start-up check
 *                fails, naming rank 3 ("check: ..." on stdout) */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <mpi.h>

#include "mpi/launch.h"
#include "mpi/lostpeer.h"

enum { HOSTLEN = 16 };

/* is rank r in the comma-separated list? */
static int listed(const char *list, int r)
{
    for (const char *p = list; p && *p;) {
        if (atoi(p) == r)
            return 1;
        p = strchr(p, ',');
        p = p ? p + 1 : NULL;
    }
    return 0;
}

static void pause_s(double s) { usleep((useconds_t)(s * 1e6)); }

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    const char *mode = argc > 1 ? argv[1] : "", *arg = argc > 2 ? argv[2] : "";
    const int me = env.world_rank, n = env.world_size;
    if (n != 4 || launch_catch_stop_signals() != 0) {
        fprintf(stderr, "test_lostpeer: needs 4 ranks and the signal handlers\n");
        launch_exit(&env, 2);
    }
    char who[64], err[256], hosts[4 * HOSTLEN], silent[256];
    snprintf(who, sizeof who, "rank %d", me);
    for (int r = 0; r < n; r++)
        snprintf(hosts + r * HOSTLEN, HOSTLEN, "%s", r < 2 ? "hostA" : "hostB");
    lostpeer_addr_t mine, all[4];
    lostpeer_t *lp = lostpeer_open(me, n, who, &mine, err, sizeof err);
    if (!lp) {
        fprintf(stderr, "test_lostpeer: rank %d: %s\n", me, err);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    launch_mpi_check(MPI_Allgather(&mine, sizeof mine, MPI_BYTE, all, sizeof mine, MPI_BYTE, MPI_COMM_WORLD),
                     "MPI_Allgather");
    for (int r = 0; r < n; r++) {
        memset(all[r].ip, 0, sizeof all[r].ip);
        /* "another host" that this machine can reach, twice: each question
         * is answered twice, as over a host's several interfaces */
        all[r].ip[0] = all[r].ip[1] = htonl(INADDR_LOOPBACK);
    }
    if (strcmp(mode, "badport") == 0 && me == 0)
        all[3].port = all[3].port == 9 ? 7 : 9; /* nobody answers there */
    int rc = lostpeer_start(lp, all, hosts, HOSTLEN, err, sizeof err);
    if (rc == 0)
        rc = lostpeer_check(lp, err, sizeof err);
    printf("check: rank %d: %s\n", me, rc == 0 ? "ok" : err);
    fflush(stdout);
    launch_notify_term(lostpeer_term_fd(lp));
    launch_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");

    int lost = 0, term = 0;
    if (strcmp(mode, "lost") == 0) {
        lost = listed(arg, me);
        term = !lost;
    } else if (strcmp(mode, "all") == 0) {
        term = 1;
    } else if (strcmp(mode, "ending") == 0) {
        lost = atoi(arg) == me;
        term = !lost;
        if (lost && lostpeer_claim_line(lp, silent, sizeof silent) != 0) {
            fprintf(stderr, "test_lostpeer: rank %d: the first claim was refused\n", me);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    } else if (strcmp(mode, "claim") == 0) {
        if (me == 0)
            printf("claim: rank 0: %s\n", lostpeer_claim_line(lp, silent, sizeof silent) ? "quiet" : "first");
        pause_s(0.2); /* the verdict's datagrams */
        launch_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
        if (me != 0)
            printf("claim: rank %d: %s\n", me, lostpeer_claim_line(lp, silent, sizeof silent) ? "quiet" : "first");
        fflush(stdout);
    } else if (strcmp(mode, "together") == 0) {
        printf("claim: rank %d: %s\n", me, lostpeer_claim_line(lp, silent, sizeof silent) ? "quiet" : "first");
        fflush(stdout);
    } else if (strcmp(mode, "staggered") == 0) {
        if (me < 2) { /* the first node's ranks: SIGTERM, then killed */
            raise(SIGTERM);
            pause_s(1.0);
            lost = 1;
        }
    }
    if (lost) {
        launch_notify_term(-1);
        lostpeer_close(lp);
        lp = NULL;
    }
    launch_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    if (term || (strcmp(mode, "staggered") == 0 && me >= 2))
        raise(SIGTERM);
    pause_s(1.5); /* the search, the judge's wait and the line */
    launch_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    launch_notify_term(-1);
    lostpeer_close(lp);
    launch_exit(&env, 0);
    return 0;
}
