/* The communicator interface: collectives and point-to-point on one group
 * of ranks, blocking and nonblocking. mpi/comm_mpi.c implements it over an
 * MPI communicator with host buffers; the CUDA backend implements the same
 * table over NCCL. Every operation takes the element type (comm_dtype_t):
 * fp32 (the CPU backend's only compute type), bf16 bit patterns (uint16_t,
 * as dt_f32_to_bf16 makes them) for --grad-reduce-dtype bf16, and int32,
 * int64, fp64 and bytes for the trainer's agreements and statistics, so
 * that every reduction of a run goes through a comm_t (its trace spans and
 * watchdog). Counts are in elements.
 *
 * Every member of a group enters every collective in the same order.
 * Every operation returns a status_t (mpi/status.h) and, on failure, writes
 * one line (the operation, its count and group size, the MPI or NCCL error
 * string) into the caller's err[errlen]; a nonblocking operation's failure
 * found later is written into the buffer passed to test() or wait(). The
 * communicator holds no message. */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "mpi/status.h"
#include "mpi/trace.h"
#include "mpi/watchdog.h"

typedef enum { COMM_SUM = 0, COMM_MAX, COMM_MIN } comm_op_t;

/* Element types. bf16 reduces with COMM_SUM only: every pairwise addition
 * widens both operands to fp32, adds, and rounds the sum back to bf16
 * (round to nearest even), as NCCL's bf16 sum does, so a sum of p values
 * carries up to p-1 bf16 roundings, in the library's order. COMM_BYTE
 * (uint8_t) is for moving text and raw bytes; it reduces as unsigned. */
typedef enum { COMM_FP32 = 0, COMM_BF16, COMM_INT32, COMM_INT64, COMM_FP64, COMM_BYTE, COMM_N_DTYPES } comm_dtype_t;

/* Bytes per element of dt (0 for an unknown one). */
size_t comm_dtype_size(comm_dtype_t dt);

/* The kinds of operation, for names. */
typedef enum {
    COMM_K_ALLREDUCE,
    COMM_K_REDUCE_SCATTER,
    COMM_K_ALLGATHER,
    COMM_K_BCAST,
    COMM_K_SEND,
    COMM_K_RECV,
    COMM_K_ALLTOALLV,
    COMM_N_KINDS
} comm_kind_t;

/* The name trace spans and the watchdog give an operation: "allreduce",
 * "iallreduce" (nonblocking), with the type as a suffix except for fp32:
 * "allreduce_bf16", "ireduce_scatter_bf16", "allreduce_i32", "bcast_u8".
 * A static string. */
const char *comm_op_name(comm_kind_t k, int nonblocking, comm_dtype_t dt);

/* An error buffer that holds any message of this layer: what callers
 * declare for the err argument (char err[COMM_ERR_MAX]). Longer messages
 * are cut. */
#define COMM_ERR_MAX 512

typedef struct comm comm_t;
/* A nonblocking operation in flight. */
typedef struct comm_req {
    comm_t *comm;
    void *impl; /* implementation's request (MPI_Request) */
    int active;
} comm_req_t;

typedef struct comm_ops {
    const char *name; /* "mpi", "nccl", "mpi-inorder" (mpi/comm_inorder.h) */
    /* Point to point in posting order (NCCL's semantics; 0 for MPI's).
     * MPI matches by (source, tag) and progresses every posted request
     * independently, so a receive posted early never holds back a later
     * send. With this set, a rank's point-to-point launches on the
     * communicator run one after another in posting order, each complete
     * (every send and receive in it matched by its peer) before the next
     * begins; the k-th send from p to q matches q's k-th receive from p,
     * whatever the tags (there are none on NCCL); and its buffers must be
     * the compute backend's memory (NCCL reads device memory; a host
     * buffer would be staged and the call made blocking). A launch is one
     * isend or irecv, or every isend and irecv between group_begin and
     * group_end. Callers that pre-post receives (mpi/pipeline.c's MPI
     * path) take another path when it is set; see mpi/pipeline.c. */
    int inorder;
    /* in place; bf16 with COMM_SUM only */
    status_t (*allreduce)(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, char *err, size_t errlen);
    status_t (*iallreduce)(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, comm_req_t *req, char *err,
                           size_t errlen);
    /* sum: send holds size*n_each elements; recv gets this rank's n_each;
     * send == recv is in place (MPI_IN_PLACE): the piece lands at the start */
    status_t (*reduce_scatter)(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                               size_t errlen);
    status_t (*ireduce_scatter)(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt,
                                comm_req_t *req, char *err, size_t errlen);
    /* send n_each elements; recv holds size*n_each in rank order */
    status_t (*allgather)(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                          size_t errlen);
    status_t (*iallgather)(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, comm_req_t *req,
                           char *err, size_t errlen);
    status_t (*broadcast)(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int root, char *err, size_t errlen);
    status_t (*send)(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err,
                     size_t errlen);
    status_t (*recv)(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err, size_t errlen);
    /* Point to point. MPI matches by tag and progresses requests in any
     * order; NCCL has no tags and runs a rank's calls in posting order on
     * the group's stream, each waiting for its peer (`inorder` above), so
     * two ranks that both post their receive first deadlock there.
     * Portable callers post in an order that pairs up (one side sends
     * first), or pair the two in one group (group_begin). */
    status_t (*isend)(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                      char *err, size_t errlen);
    status_t (*irecv)(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req, char *err,
                      size_t errlen);
    /* Grouping (NCCL: ncclGroupStart/ncclGroupEnd). Between group_begin
     * and group_end only isend and irecv may be called on c; they form one
     * launch, in which the transfers run together: with `inorder` the
     * launch completes once every one of them is matched, so a rank may
     * pair its send to a peer with its receive from that peer (or any
     * other) in one group where two single launches, each waiting for the
     * peer's, could deadlock. Sends and receives to one peer within a
     * group still match in posting order. Their requests are tested and
     * waited for as usual, only after group_end (a request of an open
     * group fails test and wait), and complete together. group_end is
     * called once group_begin succeeded, whatever failed between. MPI:
     * both are no-ops (its requests progress independently anyway). */
    status_t (*group_begin)(comm_t *c, char *err, size_t errlen);
    status_t (*group_end)(comm_t *c, char *err, size_t errlen);
    /* *done = 1 when finished (the request is then released); drives progress */
    status_t (*test)(comm_req_t *req, int *done, char *err, size_t errlen);
    status_t (*wait)(comm_req_t *req, char *err, size_t errlen);
    status_t (*barrier)(comm_t *c, char *err, size_t errlen);
    /* All-to-all with varying counts (MPI_Alltoallv; --ep's token
     * dispatch): rank r sends scount[q] elements from send + sdispl[q] to
     * each rank q and receives rcount[q] elements from q at recv +
     * rdispl[q] (counts and displacements in elements, size entries each).
     * Every count and displacement must fit an int: larger ones fail with
     * one line, not chunked. Both tables have it (NCCL: grouped
     * ncclSend/ncclRecv); model_create still checks for NULL. */
    status_t (*alltoallv)(comm_t *c, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                          const size_t *rcount, const size_t *rdispl, comm_dtype_t dt, char *err, size_t errlen);
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
     * NULL: one branch per call. device_ctx is its argument (the
     * backend's context, base/ops.h). */
    void (*device_sync)(void *device_ctx);
    void *device_ctx;
    /* Optional: issues the ops the compute backend still holds on the
     * host (--cuda-graphs queues them into graph segments), without
     * waiting; set (backend_comm_open) on communicators that order
     * themselves after the compute stream by an event recorded there
     * (NCCL), which they call first so the event follows those ops.
     * Argument: device_ctx. NULL: one branch per call. */
    void (*device_flush)(void *device_ctx);
    char name[16]; /* group label for spans: "world", "tp", "dp", "pp", "embed", "ep", "edp", "cp" */
};

/* What the data-parallel gradient reductions (mpi/ddp.c, mpi/zero.c) send,
 * --grad-reduce-dtype: fp32, or bf16 (gradients stay fp32 in memory, are
 * rounded to bf16 into a staging buffer before each reduction, summed as
 * COMM_BF16, and widened back to fp32 before the 1/dp scaling).
 * "fp32" / "bf16" -> dtype; -1 otherwise (the other types are not
 * gradient reduction types). */
/* The names of the gradient-reduction dtypes, indexed by comm_dtype_t and
 * NULL-terminated after the two (COMM_FP32 = 0, COMM_BF16 = 1) that
 * --grad-reduce-dtype accepts. */
extern const char *const comm_dtype_names[];
int comm_dtype_parse(const char *s, comm_dtype_t *dtype);

/* A communicator over a duplicate of the MPI communicator `mpi_comm`
 * (an MPI_Comm passed as a pointer so this header needs no mpi.h).
 * Returns NULL on failure. */
comm_t *comm_mpi_create(const void *mpi_comm);

/* The MPI communicator under a communicator made by comm_mpi_create,
 * copied into *(MPI_Comm *)out. Returns 0, or -1 for any other kind. */
int comm_mpi_handle(const comm_t *c, void *out);

#endif
