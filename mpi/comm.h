/* The communicator interface: collectives and point-to-point on one group
 * of ranks, blocking and nonblocking. mpi/comm_mpi.c implements it over an
 * MPI communicator with host buffers; the CUDA backend implements the same
 * table over NCCL. Element type is fp32 throughout (the CPU backend's only
 * type); counts are in elements.
 *
 * Every member of a group enters every collective in the same order.
 * Functions return 0 or -1 with a one-line message in comm->err (the MPI
 * error string and the operation). */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>

#include "trace.h"
#include "watchdog.h"

typedef enum { COMM_SUM = 0, COMM_MAX } comm_op_t;

typedef struct comm comm_t;
/* A nonblocking operation in flight. */
typedef struct comm_req {
    comm_t *comm;
    void *impl; /* implementation's request (MPI_Request) */
    int active;
} comm_req_t;

typedef struct comm_ops {
    const char *name; /* "mpi", "nccl" */
    int (*allreduce)(comm_t *c, float *buf, size_t n, comm_op_t op);      /* in place */
    int (*iallreduce)(comm_t *c, float *buf, size_t n, comm_op_t op, comm_req_t *req);
    /* send holds size*n_each floats; recv gets this rank's n_each (sum) */
    int (*reduce_scatter)(comm_t *c, const float *send, float *recv, size_t n_each);
    int (*ireduce_scatter)(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req);
    /* send n_each floats; recv holds size*n_each in rank order */
    int (*allgather)(comm_t *c, const float *send, float *recv, size_t n_each);
    int (*iallgather)(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req);
    int (*broadcast)(comm_t *c, float *buf, size_t n, int root);
    int (*send)(comm_t *c, const float *buf, size_t n, int peer, int tag);
    int (*recv)(comm_t *c, float *buf, size_t n, int peer, int tag);
    int (*isend)(comm_t *c, const float *buf, size_t n, int peer, int tag, comm_req_t *req);
    int (*irecv)(comm_t *c, float *buf, size_t n, int peer, int tag, comm_req_t *req);
    /* *done = 1 when finished (the request is then released); drives progress */
    int (*test)(comm_req_t *req, int *done);
    int (*wait)(comm_req_t *req);
    int (*barrier)(comm_t *c);
    void (*destroy)(comm_t *c);
} comm_ops_t;

struct comm {
    const comm_ops_t *ops;
    int rank, size;
    void *impl; /* MPI: the MPI_Comm */
    /* Optional: when set, every call records a span on TRACE_COMM named
     * "<op> <name>" ("iallreduce dp") with its bytes (and peer for point to
     * point): blocking calls from entry to return, nonblocking ones from
     * the posting call to the test() that reports done or wait()'s return.
     * NULL (the default) costs one branch per call. */
    trace_t *trace;
    /* Optional: when set, every blocking call and every wait() is marked
     * on this watchdog (--comm-timeout), which ends the job if one of them
     * blocks longer than its timeout. NULL: one branch per call. */
    watchdog_t *watch;
    char name[16]; /* group label for spans: "world", "tp", "dp", "pp", "embed" */
    char err[512];
};

/* A communicator over a duplicate of the MPI communicator `mpi_comm`
 * (an MPI_Comm passed as a pointer so this header needs no mpi.h).
 * Returns NULL on failure. */
comm_t *comm_mpi_create(const void *mpi_comm);

/* The MPI communicator under a communicator made by comm_mpi_create,
 * copied into *(MPI_Comm *)out. Returns 0, or -1 for any other kind. */
int comm_mpi_handle(const comm_t *c, void *out);

#endif
