/* The communicator interface: collectives and point-to-point on one group
 * of ranks, blocking and nonblocking. mpi/comm_mpi.c implements it over an
 * MPI communicator with host buffers; the CUDA backend implements the same
 * table over NCCL. Element type is fp32 (the CPU backend's only type),
 * except the *_bf16 sums, which take bf16 bit patterns (uint16_t, as
 * dt_f32_to_bf16 makes them) for --grad-reduce-dtype bf16; counts are in
 * elements.
 *
 * Every member of a group enters every collective in the same order.
 * Functions return 0 or -1 with a one-line message in comm->err (the MPI
 * error string and the operation). */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "mpi/trace.h"
#include "mpi/watchdog.h"

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
    /* send holds size*n_each floats; recv gets this rank's n_each (sum);
     * send == recv is in place (MPI_IN_PLACE): the piece lands at the start */
    int (*reduce_scatter)(comm_t *c, const float *send, float *recv, size_t n_each);
    int (*ireduce_scatter)(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req);
    /* send n_each floats; recv holds size*n_each in rank order */
    int (*allgather)(comm_t *c, const float *send, float *recv, size_t n_each);
    int (*iallgather)(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req);
    /* bf16 sums, same semantics as allreduce (COMM_SUM, in place) and
     * reduce_scatter. Every pairwise addition of the reduction widens both
     * operands to fp32, adds, and rounds the sum back to bf16 (round to
     * nearest even), as NCCL's bf16 sum does: a sum of p values carries up
     * to p-1 bf16 roundings, in the library's order. Trace spans and the
     * watchdog name them like the fp32 calls ("allreduce_bf16"), with the
     * bytes actually sent (2 per element). */
    int (*allreduce_bf16)(comm_t *c, uint16_t *buf, size_t n);
    int (*iallreduce_bf16)(comm_t *c, uint16_t *buf, size_t n, comm_req_t *req);
    int (*reduce_scatter_bf16)(comm_t *c, const uint16_t *send, uint16_t *recv, size_t n_each);
    int (*ireduce_scatter_bf16)(comm_t *c, const uint16_t *send, uint16_t *recv, size_t n_each, comm_req_t *req);
    int (*broadcast)(comm_t *c, float *buf, size_t n, int root);
    int (*send)(comm_t *c, const float *buf, size_t n, int peer, int tag);
    int (*recv)(comm_t *c, float *buf, size_t n, int peer, int tag);
    /* Point to point. MPI matches by tag and progresses requests in any
     * order; NCCL has no tags and runs a rank's calls in posting order on
     * the group's stream, each waiting for its peer, so two ranks that
     * both post their receive first deadlock there. Portable callers post
     * in an order that pairs up (one side sends first). */
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
    /* Optional: the compute backend's ops->sync, set (backend_comm_open)
     * where the backend's ops may still be running when they return (CUDA,
     * or the CPU with DTRAIN_DEFER_OPS) and this communicator touches
     * their memory from the host (MPI). Every blocking call and every
     * posting of a nonblocking one calls it first, so what is sent is
     * complete and nothing pending still reads what a receive overwrites.
     * NULL: one branch per call. */
    void (*device_sync)(void);
    char name[16]; /* group label for spans: "world", "tp", "dp", "pp", "embed" */
    char err[512];
};

/* What the data-parallel gradient reductions (mpi/ddp.c, mpi/zero.c) send:
 * fp32, or bf16 (--grad-reduce-dtype): gradients stay fp32 in memory, are
 * rounded to bf16 into a staging buffer before each reduction, summed with
 * the *_bf16 calls, and widened back to fp32 before the 1/dp scaling. */
typedef enum { COMM_FP32 = 0, COMM_BF16 } comm_dtype_t;
/* The names of comm_dtype_t, indexed by it, NULL-terminated (--grad-reduce-dtype). */
extern const char *const comm_dtype_names[];

/* "fp32" / "bf16" -> dtype; -1 otherwise. */
int comm_dtype_parse(const char *s, comm_dtype_t *dtype);

/* A communicator over a duplicate of the MPI communicator `mpi_comm`
 * (an MPI_Comm passed as a pointer so this header needs no mpi.h).
 * Returns NULL on failure. */
comm_t *comm_mpi_create(const void *mpi_comm);

/* The MPI communicator under a communicator made by comm_mpi_create,
 * copied into *(MPI_Comm *)out. Returns 0, or -1 for any other kind. */
int comm_mpi_handle(const comm_t *c, void *out);

#endif
