/* Deciding together: every place where the ranks of a group must reach the
 * same verdict (a setup step that failed on one rank, a checkpoint's
 * status, the end of a run) passes its status and message to agree().
 *
 * Agreement runs over an MPI communicator (comm_mpi_create), also under
 * --comm nccl: a failed NCCL group refuses every later call, and the point
 * of agreeing is to tell the ranks whose groups still work that the run
 * failed. With comm->watch set (the trainer's world), a rank stuck in an
 * agreement because a peer never arrives is ended by the watchdog. */
#ifndef DTRAIN_AGREE_H
#define DTRAIN_AGREE_H

#include <mpi.h>
#include <stddef.h>

#include "mpi/comm.h"
#include "mpi/status.h"

/* Longest agreed message, terminator included: longer ones are cut. */
#define AGREE_MSG_MAX 1024

/* Collective over c. Every rank passes its status (a status_t, or the 0/-1
 * of an older function) and its message (msg may be NULL on a rank that
 * passes 0). Returns STATUS_OK on every rank when every status is 0;
 * otherwise, on every rank, the lowest failing rank's status (status_of:
 * -1 is STATUS_FAIL) with msg replaced by that rank's message ("error"
 * where it had none), and *rank (when not NULL) set to that rank (-1 when
 * all succeeded). When the agreement's own communication fails, returns
 * STATUS_FAIL with the communicator's message, on the ranks that see it. */
status_t agree_rank(comm_t *c, int status, char *msg, size_t len, int *rank);

/* agree_rank without the rank. */
status_t agree(comm_t *c, int status, char *msg, size_t len);

/* agree over a bare MPI communicator (no watchdog, no trace span), for
 * code that holds an MPI_Comm rather than a comm_t: the HDF5 store. */
status_t agree_mpi(MPI_Comm comm, int status, char *msg, size_t len);
/* agree_mpi with *first, as agree_rank's *rank: the lowest failing rank,
 * or -1 when all succeeded or the agreement itself failed. */
status_t agree_mpi_rank(MPI_Comm comm, int status, char *msg, size_t len, int *first);

#endif
