#include "launch.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void launch_mpi_check(int rc, const char *what)
{
    if (rc == MPI_SUCCESS)
        return;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    fprintf(stderr, "dtrain: MPI error in %s: %s\n", what, msg);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

void launch_init(launch_env_t *env, int *argc, char ***argv)
{
    memset(env, 0, sizeof *env);
    /* OpenMPI's default in-place MPI_Iallreduce is a binomial tree whose
     * post blocks for a whole round (about 2x a blocking allreduce at 64 MB,
     * ../shared/notes/platform.md); the ring is as fast as the blocking
     * call. An MCA parameter has no API, so set it before MPI_Init unless the
     * user chose one. */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "1", 0);
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dtrain: MPI_Init_thread failed: check the MPI installation and launcher\n");
        exit(1);
    }
    /* errors come back as codes, checked at each call */
    launch_mpi_check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    launch_mpi_check(MPI_Comm_rank(MPI_COMM_WORLD, &env->world_rank), "MPI_Comm_rank");
    launch_mpi_check(MPI_Comm_size(MPI_COMM_WORLD, &env->world_size), "MPI_Comm_size");
    MPI_Comm node;
    launch_mpi_check(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, env->world_rank,
                                         MPI_INFO_NULL, &node), "MPI_Comm_split_type");
    launch_mpi_check(MPI_Comm_rank(node, &env->local_rank), "MPI_Comm_rank(node)");
    launch_mpi_check(MPI_Comm_size(node, &env->local_size), "MPI_Comm_size(node)");
    launch_mpi_check(MPI_Comm_free(&node), "MPI_Comm_free");
    int len = 0;
    char name[MPI_MAX_PROCESSOR_NAME] = "";
    launch_mpi_check(MPI_Get_processor_name(name, &len), "MPI_Get_processor_name");
    snprintf(env->host, sizeof env->host, "%s", name);
}

int launch_any_failed(const launch_env_t *env, const char *prog, int failed, const char *msg)
{
    int mine = failed ? env->world_rank : INT_MAX, first = INT_MAX;
    launch_mpi_check(MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce(error)");
    if (first == INT_MAX)
        return 0;
    char buf[1024] = "";
    if (env->world_rank == first)
        snprintf(buf, sizeof buf, "%s", msg ? msg : "unknown error");
    if (first != 0)
        launch_mpi_check(MPI_Bcast(buf, sizeof buf, MPI_CHAR, first, MPI_COMM_WORLD), "MPI_Bcast(error)");
    if (env->world_rank == 0) {
        if (env->world_size > 1 && first != 0)
            fprintf(stderr, "%s: error: rank %d: %s\n", prog, first, buf);
        else
            fprintf(stderr, "%s: error: %s\n", prog, buf);
        fflush(stderr);
    }
    return 1;
}

void launch_exit(const launch_env_t *env, int status)
{
    fflush(stdout);
    fflush(stderr);
    MPI_Finalize();
    exit(status);
}
