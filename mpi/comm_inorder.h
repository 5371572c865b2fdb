/* NCCL's point-to-point semantics over MPI, for tests on the CPU
 * (DTRAIN_COMM_INORDER, doc/design.md "NCCL in training"): a communicator
 * whose isend, irecv, send and recv behave as comm.h's `inorder` describes
 * (NCCL on one group's stream), so that what would deadlock or mismatch
 * on NCCL deadlocks or fails here, where there is no GPU:
 *
 *   - a rank's launches (one point-to-point call, or every isend and irecv
 *     between group_begin and group_end) run one at a time in posting
 *     order; a launch is handed to MPI only once the one before it has
 *     completed, and completes when every transfer in it is matched:
 *     sends are MPI_Issend (synchronous: done only once the receiver's
 *     receive has matched it), so no send finishes ahead of its receive;
 *   - messages match by order only: a receive takes the next message from
 *     its peer whatever its tag (NCCL has none), and fails with one line
 *     when that message's tag or length is not the expected one (NCCL
 *     would silently deliver it into the wrong buffer);
 *   - collectives, barrier and alltoallv run after every launch posted
 *     before them has completed (on NCCL they follow them on the stream),
 *     on the MPI communicator underneath; the nonblocking ones complete
 *     before they return (their requests come back finished).
 *
 * Launches progress only inside this communicator's calls (test, wait and
 * every posting): a launch may thus start later than on a GPU, never
 * earlier, which can only delay, never avoid, a deadlock. Blocking is
 * marked on comm->watch like comm_mpi.c's, so --comm-timeout ends a
 * deadlocked run with the watchdog's line; spans go to comm->trace. Buffers
 * are read and written by the host (the CPU backend's memory). */
#ifndef DTRAIN_COMM_INORDER_H
#define DTRAIN_COMM_INORDER_H

#include <stddef.h>

#include "mpi/comm.h"

/* A communicator over a duplicate of mpi's MPI communicator (mpi made by
 * comm_mpi_create; collective over its group), with mpi's name, rank,
 * size and device_sync. flagged: its ops table sets `inorder` (callers
 * take their NCCL-safe path); 0: the same semantics, unannounced (what a
 * caller unaware of them meets on NCCL: the tests' deadlock). Returns NULL
 * with one line in err. Freed by its ops->destroy; mpi stays the caller's. */
comm_t *comm_inorder_create(comm_t *mpi, int flagged, char *err, size_t errlen);

/* DTRAIN_COMM_INORDER: unset or empty -> 0 (plain MPI); "1" -> 1 (the
 * emulation, flagged); "unflagged" -> 2 (the emulation, unannounced);
 * anything else -> -1 with one line in err. */
int comm_inorder_env(char *err, size_t errlen);

#endif
