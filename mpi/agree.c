/* Deciding together (agree.h): one all-reduce of the lowest failing rank,
 * then, only when some rank failed, one broadcast of its status and
 * message. */
#include "mpi/agree.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* What the lowest failing rank broadcasts: its status, then its message. */
typedef struct verdict {
    int32_t status;
    char msg[AGREE_MSG_MAX];
} verdict_t;

status_t agree_rank(comm_t *c, int status, char *msg, size_t len, int *rank)
{
    int32_t low = status != 0 ? (int32_t)c->rank : INT32_MAX;
    if (rank)
        *rank = -1;
    char cerr[COMM_ERR_MAX];
    if (c->ops->allreduce(c, &low, 1, COMM_INT32, COMM_MIN, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, msg, len, "agreeing on the ranks' status failed: %s", cerr);
    if (low == INT32_MAX)
        return STATUS_OK;
    verdict_t v = {.status = status_of(status), .msg = "error"};
    if (c->rank == low && msg && len > 0 && msg[0])
        snprintf(v.msg, sizeof v.msg, "%.*s", (int)(len < sizeof v.msg ? len : sizeof v.msg) - 1, msg);
    if (c->ops->broadcast(c, &v, sizeof v, COMM_BYTE, (int)low, cerr, sizeof cerr) != STATUS_OK)
        return status_set(STATUS_FAIL, msg, len, "agreeing on rank %d's error failed: %s", (int)low, cerr);
    v.msg[sizeof v.msg - 1] = '\0';
    if (rank)
        *rank = (int)low;
    return status_set(status_of(v.status), msg, len, "%s", v.msg);
}

status_t agree(comm_t *c, int status, char *msg, size_t len) { return agree_rank(c, status, msg, len, NULL); }

/* The same verdict over a bare MPI communicator, for the layers that hold
 * one rather than a comm_t (the HDF5 store opens files on an MPI_Comm):
 * one MPI_Allreduce of the lowest failing rank, one MPI_Bcast of its
 * verdict. No watchdog: a stuck peer is found by the caller's. */
status_t agree_mpi(MPI_Comm comm, int status, char *msg, size_t len)
{
    return agree_mpi_rank(comm, status, msg, len, NULL);
}

status_t agree_mpi_rank(MPI_Comm comm, int status, char *msg, size_t len, int *first)
{
    if (first)
        *first = -1;
    int rank = 0, rc;
    if ((rc = MPI_Comm_rank(comm, &rank)) != MPI_SUCCESS)
        return status_set(STATUS_FAIL, msg, len, "agreeing on the ranks' status: MPI_Comm_rank failed (MPI error %d)",
                          rc);
    int32_t mine = status != 0 ? (int32_t)rank : INT32_MAX, low;
    if ((rc = MPI_Allreduce(&mine, &low, 1, MPI_INT32_T, MPI_MIN, comm)) != MPI_SUCCESS)
        return status_set(STATUS_FAIL, msg, len, "agreeing on the ranks' status failed (MPI_Allreduce error %d)", rc);
    if (low == INT32_MAX)
        return STATUS_OK;
    if (first)
        *first = (int)low;
    verdict_t v = {.status = status_of(status), .msg = "error"};
    if (rank == low && msg && len > 0 && msg[0])
        snprintf(v.msg, sizeof v.msg, "%.*s", (int)(len < sizeof v.msg ? len : sizeof v.msg) - 1, msg);
    if ((rc = MPI_Bcast(&v, (int)sizeof v, MPI_BYTE, (int)low, comm)) != MPI_SUCCESS)
        return status_set(STATUS_FAIL, msg, len, "agreeing on rank %d's error failed (MPI_Bcast error %d)", (int)low,
                          rc);
    v.msg[sizeof v.msg - 1] = '\0';
    return status_set(status_of(v.status), msg, len, "%s", v.msg);
}
