/* The launch environment: who this process is in the job, and how the job
 * ends. Every rank exits with the same status; an error found on any rank
 * is printed once, by rank 0, naming the rank that found it. */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include <stddef.h>

typedef struct launch_env {
    int world_rank, world_size;
    int local_rank, local_size; /* among the ranks sharing this node */
    char host[256];
} launch_env_t;

/* MPI_Init_thread (FUNNELED) and the rank/size queries. On failure prints a
 * line and exits 1 (nothing else can be agreed on without MPI). */
void launch_init(launch_env_t *env, int *argc, char ***argv);

/* Collective over the world: returns 1 if any rank passed failed != 0.
 * Then the lowest failing rank's msg is printed by rank 0 as
 * "<prog>: error: [rank R: ]msg". */
int launch_any_failed(const launch_env_t *env, const char *prog, int failed, const char *msg);

/* MPI_Finalize, then exit(status) on every rank. */
void launch_exit(const launch_env_t *env, int status);

/* Checks an MPI return code: on failure prints the MPI error string with
 * what was being done and aborts the job (MPI errors are not recoverable). */
void launch_mpi_check(int rc, const char *what);

#endif
