/* replica_check: identical buffers pass; one flipped bit on one rank is
 * found, and every rank names the same (lowest) differing tensor. */
#include <mpi.h>
#include <stdio.h>
#include <string.h>

#include "mpi/comm.h"
#include "mpi/launch.h"
#include "mpi/replica.h"

#define NT 10

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    MPI_Comm world = MPI_COMM_WORLD;
    comm_t *c = comm_mpi_create(&world);
    size_t start[NT + 1];
    float buf[1000];
    for (int t = 0; t <= NT; t++)
        start[t] = (size_t)t * 100;
    for (int i = 0; i < 1000; i++)
        buf[i] = 0.001f * (float)i;
    int fails = 0, bad = -2;
    char err[COMM_ERR_MAX] = "";
    int rc = c ? replica_check(c, buf, start, NT, &bad, err, sizeof err) : -1;
    if (rc != 0 || bad != -1) {
        printf("FAIL rank %d: identical replicas: rc %d bad %d %s\n", env.world_rank, rc, bad, err);
        fails++;
    }
    if (env.world_size > 1) {
        if (env.world_rank == env.world_size - 1) {
            unsigned u;
            memcpy(&u, &buf[653], sizeof u);
            u ^= 1u; /* one ulp: the smallest possible divergence */
            memcpy(&buf[653], &u, sizeof u);
            memcpy(&u, &buf[905], sizeof u);
            u ^= 1u;
            memcpy(&buf[905], &u, sizeof u);
        }
        rc = replica_check(c, buf, start, NT, &bad, err, sizeof err);
        if (rc != STATUS_OK || bad != 6) {
            printf("FAIL rank %d: diverged replicas: rc %d first bad tensor %d (want 0, 6) %s\n", env.world_rank, rc,
                   bad, err);
            fails++;
        }
    }
    int all = 0;
    MPI_Allreduce(&fails, &all, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (env.world_rank == 0)
        printf("%s: replica check at np %d (%d failure(s))\n", all ? "FAIL" : "ok", env.world_size, all);
    if (c)
        c->ops->destroy(c);
    launch_exit(&env, all ? 1 : 0);
    return 0;
}
