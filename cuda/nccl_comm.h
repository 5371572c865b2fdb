/* The communicator interface (mpi/comm.h) over NCCL (built only with
 * --with-cuda). One NCCL communicator per grid group, each bootstrapped
 * from that group's MPI communicator by mpi/bootstrap.c: group rank 0
 * calls ncclGetUniqueId, MPI_Bcast shares it, every member calls
 * ncclCommInitRank, all groups inside one ncclGroupStart/End. Each group
 * enqueues on its own CUDA stream (see nccl_comm.c for why). */
#ifndef DTRAIN_NCCL_COMM_H
#define DTRAIN_NCCL_COMM_H

#include <stddef.h>

#include "mpi/comm.h"
#include "mpi/grid.h"

typedef struct nccl_grid {
    /* the NCCL twin of each grid communicator (NULL where g has none) */
    comm_t *world, *tp, *dp, *pp, *embed, *shard, *replica, *ep, *edp, *eshard, *cp;
} nccl_grid_t;

/* Collective over MPI_COMM_WORLD; the CUDA device must already be selected
 * (backend_open). after_stream (a cudaStream_t, or NULL): every operation
 * first waits, on the device, for the work enqueued on that stream so far
 * (the compute stream of the CUDA ops). timeout_s > 0: a wait or test that sees an operation
 * unfinished after that many seconds aborts the communicator and fails
 * with a message naming the collective, its group and size (0 = wait
 * forever; ncclCommGetAsyncError is polled either way, so a failed peer
 * is an error, not a hang). Returns 0 on every rank, or -1 on every rank
 * with one line in err (the lowest failing rank's is not gathered: each
 * rank has its own). */
int nccl_grid_create(const grid_t *g, nccl_grid_t *ng, void *after_stream, double timeout_s, char *err, size_t errlen);
/* A run that failed: every group's communicator is aborted, all in one
 * ncclGroupStart/End (ncclCommAbort ends kernels still waiting on peers,
 * which a later cudaFree or ncclCommDestroy would otherwise wait for
 * without end; aborted one by one, each abort could wait for the others'
 * kernels). Every rank of the job calls it, having agreed that the run
 * failed; later calls on the groups fail, and nccl_grid_destroy then only
 * frees. nccl_grid_destroy calls it itself when a group has failed.
 * Local. */
void nccl_grid_abort(nccl_grid_t *ng);
void nccl_grid_destroy(nccl_grid_t *ng);

#endif
