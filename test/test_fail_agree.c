/* A rank fails while a peer is stuck elsewhere: mpiexec -np 2
 * test_fail_agree TIMEOUT_S. Rank 1 fails ("injected failure on rank 1")
 * and enters the world agreement (launch_any_failed); rank 0 is busy in
 * something else for 60 s, as the next pipeline stage is when it waits
 * for activations rank 1 will never send. Rank 1's watchdog must end the
 * job after TIMEOUT_S with its abort line carrying rank 1's own failure,
 * which no agreement could print (test_comm_timeout.sh checks the line). */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "mpi/launch.h"
#include "mpi/watchdog.h"

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    double timeout = argc > 1 ? atof(argv[1]) : 2.0;
    char err[256];
    watchdog_t *w = watchdog_start(timeout, env.world_rank == 1 ? "rank 1" : "rank 0", err, sizeof err);
    if (!w) {
        fprintf(stderr, "test_fail_agree: %s\n", err);
        return 1;
    }
    env.world->watch = w;
    if (env.world_rank == 0)
        sleep(60); /* stuck outside the agreement */
    int failed = launch_any_failed(&env, "test_fail_agree", env.world_rank == 1, "injected failure on rank 1");
    env.world->watch = NULL;
    watchdog_stop(w);
    /* reached only when the watchdog did not end the job */
    printf("test_fail_agree: the agreement returned %d without the watchdog\n", failed);
    launch_exit(&env, 3);
    return 3;
}
