/* The launch environment: who this process is in the job, how it was
 * started (singleton, srun, mpirun), the SLURM job around it, how the job
 * ends, and the stop request a signal leaves for the training loop. Every
 * rank exits with the same status; an error found on any rank is printed
 * once, by rank 0, naming the rank that found it. */
#ifndef DTRAIN_LAUNCH_H
#define DTRAIN_LAUNCH_H

#include <stddef.h>
#include <stdio.h>

#include "mpi/comm.h"
#include "mpi/status.h"

typedef enum {
    LAUNCH_SINGLETON, /* ./dtrain with no launcher: one rank */
    LAUNCH_SRUN,      /* srun --mpi=pmix: SLURM started every rank */
    LAUNCH_MPIRUN,    /* OpenMPI's mpirun/mpiexec, inside an allocation or not */
    LAUNCH_OTHER      /* another launcher (MPICH's hydra, ...) */
} launch_kind_t;

typedef struct launch_env {
    int world_rank, world_size; /* from MPI: under mpirun in an allocation SLURM_PROCID is 0 everywhere */
    int local_rank, local_size; /* among the ranks sharing this node (MPI_Comm_split_type) */
    int n_nodes;                /* nodes the job's ranks are on */
    char host[256];
    launch_kind_t kind;
    /* the launcher's own idea of the local rank, checked against MPI's:
     * the variable's name, or NULL when the launcher sets none */
    const char *local_var;
    int mismatch_rank; /* lowest rank where the two differ, or -1 */
    int mismatch_mpi, mismatch_var;
    /* the SLURM job; job_id is empty outside one */
    char job_id[32];
    int restart_count;  /* SLURM_RESTART_COUNT: times the job was requeued */
    int n_job_nodes;    /* SLURM_JOB_NUM_NODES */
    char nodelist[256]; /* SLURM_JOB_NODELIST (compressed, e.g. gpu[01-08]) */
    long long end_time; /* SLURM_JOB_END_TIME: Unix seconds the time limit ends, 0 unknown */
    /* a communicator over (a duplicate of) MPI_COMM_WORLD, for the
     * program's agreements (mpi/agree.h); launch_exit frees it */
    comm_t *world;
    /* MPI provided MPI_THREAD_MULTIPLE (asked for; FUNNELED is the least
     * the program needs without a second MPI thread) */
    int thread_multiple;
    /* rank 0 only (NULL elsewhere), for the banner's host layout: each
     * world rank's host (LAUNCH_HOST_MAX bytes each) and local rank */
    char *rank_host;
    int *rank_local;
} launch_env_t;

#define LAUNCH_HOST_MAX 64 /* the banner's host names are cut to 63 bytes */

/* MPI_Init_thread (MULTIPLE where provided), the rank/size queries, the launcher and SLURM
 * job around it. Collective. On failure prints a
 * line and exits 1 (nothing else can be agreed on without MPI). */
void launch_init(launch_env_t *env, int *argc, char ***argv);

/* Rank 0 writes the launch and SLURM lines of the banner, and on more
 * than one node the host layout: "hosts: node1 ranks 0,1 (local 0,1),
 * node2 ranks 2,3 (local 0,1)". */
void launch_describe(const launch_env_t *env, FILE *out);

/* Installs the SIGUSR1/SIGTERM handlers that only record the signal (for
 * programs that stop cleanly at a safe point) and ignores SIGPIPE (a write
 * to a dead peer's socket fails with EPIPE); the others keep the default
 * actions. Call after launch_init, so that MPI's handlers do not replace
 * them. 0, or -1 when sigaction fails. */
int launch_catch_stop_signals(void);

/* From now on the SIGTERM handler also writes one byte to fd (a
 * nonblocking pipe: lostpeer_term_fd), so that a thread waiting on it
 * wakes at once; -1 stops that. */
void launch_notify_term(int fd);

/* The signal that asked this rank to stop (SIGUSR1 or SIGTERM), or 0.
 * The handlers only record it: the caller agrees on it across ranks at a
 * point where stopping is safe (the training loop's step boundary). */
int launch_stop_signal(void);

/* Collective over the world, agree() on env->world. failed: 0, a
 * status_t, or any other nonzero value for STATUS_FAIL. Returns STATUS_OK
 * on every rank when every rank passed 0; otherwise, on every rank, the
 * lowest failing rank's status (so status_exit_code gives every rank the
 * same exit code), and rank 0 prints that rank's msg as
 * "<prog>: error: [rank R: ]msg". */
status_t launch_any_failed(const launch_env_t *env, const char *prog, int failed, const char *msg);

/* Frees env->world, MPI_Finalize, then exit(status) on every rank. */
void launch_exit(const launch_env_t *env, int status);

/* Checks an MPI return code: on failure prints the MPI error string with
 * what was being done and aborts the job (MPI errors are not recoverable). */
void launch_mpi_check(int rc, const char *what);

#endif
