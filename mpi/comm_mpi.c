/* The communicator interface (comm.h) over an MPI communicator, host
 * buffers, every comm_dtype_t (bf16 as bit patterns).
 *
 * comm_mpi_create duplicates the caller's MPI_Comm, so the collectives of
 * this communicator never match traffic on the original, and sets
 * MPI_ERRORS_RETURN on the duplicate: every call's return code is checked
 * and turned into one line in the caller's error buffer (status.h):
 * "MPI_Allreduce(n=..., comm size ...) failed: <MPI_Error_string>".
 *
 * Counts are size_t; MPI's are int. A count above the per-call limit
 * (2^28 elements = 2 GiB of fp64, so that no count of 4-byte units inside
 * MPI passes INT_MAX either) is split into chunks of at most that many elements, each its own
 * MPI call; a nonblocking operation then holds one MPI_Request per chunk
 * and test/wait complete them together:
 *   allreduce, broadcast, send/recv: consecutive ranges of the buffer
 *     (point-to-point chunks keep their order: MPI does not overtake
 *     messages with the same source, tag and communicator);
 *   allgather: chunk [off, off+len) of every rank's block in one
 *     MPI_Allgather, received through a contiguous type resized to the
 *     block stride;
 *   reduce_scatter: one MPI_Reduce per (chunk, destination rank), because
 *     predefined reduction ops take only predefined datatypes. In place
 *     (send == recv) the nonblocking form runs blocking and returns a
 *     finished request: the reductions must run in order there.
 * DTRAIN_COMM_MAX_COUNT=k (read at creation, the same on every rank) sets a
 * smaller limit so that the tests exercise every chunked path.
 *
 * In place: allreduce always is (MPI_IN_PLACE); reduce_scatter with
 * send == recv and allgather with send == recv + rank*n_each use
 * MPI_IN_PLACE too.
 *
 * Types: fp32 MPI_FLOAT, int32 MPI_INT32_T, int64 MPI_INT64_T, fp64
 * MPI_DOUBLE, bytes MPI_UINT8_T. MPI has no bf16 type: bf16 sums send
 * MPI_UINT16_T with a commutative user-defined MPI_Op (made once per
 * communicator by MPI_Op_create, freed by destroy) that widens each pair to
 * fp32, adds, and rounds back with dt_f32_to_bf16: what NCCL's bf16 sum
 * does per step. Every type takes the same paths (chunking, in place,
 * nonblocking requests); the chunked reduce-scatter's MPI_Reduce per
 * destination takes the user op as it takes MPI_SUM. Error messages add the
 * type after the count (", bf16") except for fp32.
 *
 * Tracing (comm->trace set): each call records one span on TRACE_COMM
 * named "<op> <group>" (op without the MPI_ prefix, lower case, as in
 * "allreduce dp", "isend pp"), args bytes and, for point to point, peer
 * (rank in the group; a broadcast's root). Bytes are the whole buffer, as
 * nccl-tests counts them: n*es for allreduce, broadcast and point to point,
 * size*n_each*es for reduce_scatter and allgather (es: the element size). Blocking calls span entry
 * to return; nonblocking ones span the posting call's entry to the test()
 * that finds them done or wait()'s return, so the span covers everything
 * the caller could overlap. Failed calls record nothing (the job ends).
 * Other types than fp32 add theirs to the name (comm_op_name:
 * "allreduce_bf16", "ireduce_scatter_bf16", "allreduce_i32").
 *
 * OpenMPI has no asynchronous progress thread: a nonblocking operation
 * advances only inside MPI calls, so callers must call test() between
 * kernels (ddp.c does). */
#include "mpi/comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/bf16.h"
#include "mpi/status.h"

#define MAX_COUNT_DEFAULT ((size_t)1 << 28)

typedef struct mpi_comm {
    comm_t pub; /* first: a comm_t * is a mpi_comm_t * */
    MPI_Comm comm;
    size_t max_count; /* largest element count of one MPI call */
    MPI_Op bf16_sum;  /* the bf16 sums' reduction (MPI_UINT16_T) */
} mpi_comm_t;

/* The element type of an operation and, for reductions, its op: a
 * predefined one, or bf16 bits with the communicator's bf16_sum. extra:
 * added to error messages (NULL for fp32). */
typedef struct red {
    MPI_Datatype type;
    MPI_Op op;
    size_t size; /* bytes per element */
    const char *extra;
} red_t;

/* A nonblocking operation: one request per chunk. */
typedef struct mpi_req {
    const char *what; /* MPI call that started it, for messages */
    size_t n;
    /* for the trace span (set when comm->trace is): */
    const char *op; /* "iallreduce" */
    double t0;      /* trace_now() at the posting call's entry */
    long long bytes;
    int peer;
    int nreq;
    MPI_Request r[];
} mpi_req_t;

static MPI_Comm mcomm(const comm_t *c) { return ((const mpi_comm_t *)c)->comm; }

static size_t maxc(const comm_t *c) { return ((const mpi_comm_t *)c)->max_count; }

static size_t n_chunks(size_t n, size_t max) { return n / max + (n % max != 0); }

static int chunk_len(size_t n, size_t off, size_t max) { return (int)(n - off < max ? n - off : max); }

static status_t fail(const comm_t *c, char *err, size_t errlen, int rc, const char *what, size_t n, const char *extra)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error code %d", rc);
    return status_set(STATUS_FAIL, err, errlen, "%s(n=%zu%s, comm size %d) failed: %s", what, n, extra ? extra : "",
                      c->size, msg);
}

static status_t fail_msg(const comm_t *c, char *err, size_t errlen, const char *what, size_t n, const char *msg)
{
    return status_set(STATUS_FAIL, err, errlen, "%s(n=%zu, comm size %d) failed: %s", what, n, c->size, msg);
}

/* The user-defined MPI_Op of bf16 sums: inout[i] = bf16(in[i] + inout[i]),
 * the addition in fp32, the result rounded to nearest even. fp32 addition
 * is commutative, so the op is. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type)
{
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++)
        b[i] = dt_f32_to_bf16(dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i]));
}

static int to_mpi_op(comm_op_t op, MPI_Op *out)
{
    switch (op) {
    case COMM_SUM: *out = MPI_SUM; return 0;
    case COMM_MAX: *out = MPI_MAX; return 0;
    case COMM_MIN: *out = MPI_MIN; return 0;
    }
    return -1;
}

/* The MPI view of dt and op: STATUS_OK, or STATUS_FAIL with the message in
 * err (an unknown type or op, or bf16 with another op than the sum). */
static status_t red_of(comm_t *c, char *err, size_t errlen, comm_dtype_t dt, comm_op_t op, const char *what, size_t n,
                       red_t *t)
{
    static const char *const extra[COMM_N_DTYPES] = {NULL, ", bf16", ", int32", ", int64", ", fp64", ", bytes"};
    if ((unsigned)dt >= COMM_N_DTYPES)
        return fail_msg(c, err, errlen, what, n, "unknown element type");
    const MPI_Datatype type[COMM_N_DTYPES] = {MPI_FLOAT,   MPI_UINT16_T, MPI_INT32_T,
                                              MPI_INT64_T, MPI_DOUBLE,   MPI_UINT8_T};
    *t = (red_t){.type = type[dt], .op = MPI_OP_NULL, .size = comm_dtype_size(dt), .extra = extra[dt]};
    if (dt == COMM_BF16) {
        if (op != COMM_SUM)
            return fail_msg(c, err, errlen, what, n, "bf16 reduces with the sum only");
        t->op = ((const mpi_comm_t *)c)->bf16_sum;
        return 0;
    }
    return to_mpi_op(op, &t->op) == 0 ? 0 : fail_msg(c, err, errlen, what, n, "unknown reduction op");
}

/* ------------------------------------------------------------------ trace */

static double span_t0(const comm_t *c) { return c->trace ? trace_now() : 0.0; }

/* Records [t0, now] for a call that returned rc; returns rc. */
static status_t span_end(comm_t *c, status_t rc, const char *op, double t0, long long bytes, int peer)
{
    if (!c->trace || rc != 0)
        return rc;
    char name[TRACE_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s%s%s", op, c->name[0] ? " " : "", c->name);
    trace_span(c->trace, TRACE_COMM, name, t0, trace_now(),
               &(trace_args_t){.bytes = bytes, .microbatch = -1, .layer = -1, .peer = peer});
    return rc;
}

static long long nbytes(size_t n, comm_dtype_t dt) { return (long long)(n * comm_dtype_size(dt)); }

/* A blocking call starts: the watchdog's mark and the span's start. */
static double block_begin(comm_t *c, const char *op, long long bytes, int peer)
{
    if (c->device_sync)
        c->device_sync(c->device_ctx);
    watchdog_enter(c->watch, op, c->name, c->size, bytes, peer);
    return span_t0(c);
}

/* ... and returned rc. */
static status_t block_end(comm_t *c, status_t rc, const char *op, double t0, long long bytes, int peer)
{
    watchdog_leave(c->watch);
    return span_end(c, rc, op, t0, bytes, peer);
}

/* Allocates the MPI requests of a nonblocking operation into req; op,
 * bytes and peer (-1: none) name its trace span. */
static mpi_req_t *req_start(comm_t *c, char *err, size_t errlen, comm_req_t *req, const char *what, size_t n,
                            size_t nreq, const char *op, long long bytes, int peer)
{
    if (c->device_sync)
        c->device_sync(c->device_ctx);
    double t0 = span_t0(c);
    if (req->active) {
        fail_msg(c, err, errlen, what, n, "the request is still in flight (test or wait for it first)");
        return NULL;
    }
    if (nreq > INT_MAX) {
        fail_msg(c, err, errlen, what, n, "too many chunks");
        return NULL;
    }
    mpi_req_t *r = malloc(sizeof *r + nreq * sizeof(MPI_Request));
    if (!r) {
        fail_msg(c, err, errlen, what, n, "out of memory for the requests");
        return NULL;
    }
    r->what = what;
    r->n = n;
    r->op = op;
    r->t0 = t0;
    r->bytes = bytes;
    r->peer = peer;
    r->nreq = 0;
    for (size_t i = 0; i < nreq; i++)
        r->r[i] = MPI_REQUEST_NULL;
    req->comm = c;
    req->impl = r;
    req->active = 1;
    return r;
}

/* A posting call failed after some chunks were started: those cannot be
 * cancelled (collectives) and are left to MPI; the handle is released. */
static status_t req_abandon(comm_req_t *req)
{
    free(req->impl);
    req->impl = NULL;
    req->active = 0;
    return STATUS_FAIL;
}

/* ------------------------------------------------------------ collectives */

static status_t allreduce_run(comm_t *c, char *err, size_t errlen, void *buf, size_t n, red_t t)
{
    const size_t max = maxc(c);
    for (size_t off = 0; off < n; off += max) {
        int rc =
            MPI_Allreduce(MPI_IN_PLACE, (char *)buf + off * t.size, chunk_len(n, off, max), t.type, t.op, mcomm(c));
        if (rc != MPI_SUCCESS)
            return fail(c, err, errlen, rc, "MPI_Allreduce", n, t.extra);
    }
    return 0;
}

/* op, bytes: the trace span's name and size */
static status_t iallreduce_post(comm_t *c, char *err, size_t errlen, void *buf, size_t n, red_t t, const char *op,
                                long long bytes, comm_req_t *req)
{
    const size_t max = maxc(c);
    mpi_req_t *r = req_start(c, err, errlen, req, "MPI_Iallreduce", n, n_chunks(n, max), op, bytes, -1);
    if (!r)
        return STATUS_FAIL;
    for (size_t off = 0; off < n; off += max) {
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)buf + off * t.size, chunk_len(n, off, max), t.type, t.op,
                                mcomm(c), &r->r[r->nreq]);
        if (rc != MPI_SUCCESS) {
            fail(c, err, errlen, rc, "MPI_Iallreduce", n, t.extra);
            return req_abandon(req);
        }
        r->nreq++;
    }
    return 0;
}

static status_t mpi_iallreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, comm_req_t *req,
                               char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, op, "MPI_Iallreduce", n, &t));
    return iallreduce_post(c, err, errlen, buf, n, t, comm_op_name(COMM_K_ALLREDUCE, 1, dt), nbytes(n, dt), req);
}

/* Chunked reduce-scatter: recv[off..] of rank d = sum over ranks of
 * send[d*n_each + off ..], one MPI_Reduce (or Ireduce) rooted at d per
 * chunk. In place the blocks are reduced in rank order per chunk, so block
 * 0's chunk (where the result lands) is read before it is overwritten. */
static status_t reduce_scatter_chunked(comm_t *c, char *err, size_t errlen, const void *send, void *recv, size_t n_each,
                                       red_t t, mpi_req_t *r)
{
    const size_t max = maxc(c);
    const int inplace = send == recv;
    char extra[64];
    snprintf(extra, sizeof extra, " per rank%s, chunked reduce-scatter", t.extra ? t.extra : "");
    for (size_t off = 0; off < n_each; off += max) {
        int len = chunk_len(n_each, off, max);
        void *dst = (char *)recv + off * t.size;
        for (int d = 0; d < c->size; d++) {
            const void *sbuf = (const char *)(inplace ? recv : send) + ((size_t)d * n_each + off) * t.size;
            if (inplace && d == c->rank && d == 0)
                sbuf = MPI_IN_PLACE; /* input and result are both recv[off..] */
            int rc = r ? MPI_Ireduce(sbuf, dst, len, t.type, t.op, d, mcomm(c), &r->r[r->nreq])
                       : MPI_Reduce(sbuf, dst, len, t.type, t.op, d, mcomm(c));
            if (rc != MPI_SUCCESS)
                return fail(c, err, errlen, rc, r ? "MPI_Ireduce" : "MPI_Reduce", n_each, extra);
            if (r)
                r->nreq++;
        }
    }
    return 0;
}

static status_t reduce_scatter_run(comm_t *c, char *err, size_t errlen, const void *send, void *recv, size_t n_each,
                                   red_t t)
{
    if (n_each > maxc(c))
        return reduce_scatter_chunked(c, err, errlen, send, recv, n_each, t, NULL);
    int rc = MPI_Reduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, (int)n_each, t.type, t.op, mcomm(c));
    if (rc != MPI_SUCCESS) {
        char extra[32];
        snprintf(extra, sizeof extra, " per rank%s", t.extra ? t.extra : "");
        return fail(c, err, errlen, rc, "MPI_Reduce_scatter_block", n_each, extra);
    }
    return 0;
}

/* op: the trace span's name; bytes: the whole send buffer's */
static status_t ireduce_scatter_post(comm_t *c, char *err, size_t errlen, const void *send, void *recv, size_t n_each,
                                     red_t t, const char *op, comm_req_t *req)
{
    const long long bytes = (long long)(n_each * (size_t)c->size * t.size);
    if (n_each > maxc(c) && send == recv) {
        /* ordered in-place reductions: run them now, hand back a finished request */
        if (req->active)
            return fail_msg(c, err, errlen, "MPI_Ireduce", n_each,
                            "the request is still in flight (test or wait for it first)");
        req->comm = c;
        req->impl = NULL;
        req->active = 0;
        double t0 = block_begin(c, op, bytes, -1);
        return block_end(c, reduce_scatter_chunked(c, err, errlen, send, recv, n_each, t, NULL), op, t0, bytes, -1);
    }
    size_t nreq = n_each > maxc(c) ? n_chunks(n_each, maxc(c)) * (size_t)c->size : 1;
    mpi_req_t *r = req_start(c, err, errlen, req, n_each > maxc(c) ? "MPI_Ireduce" : "MPI_Ireduce_scatter_block",
                             n_each, nreq, op, bytes, -1);
    if (!r)
        return STATUS_FAIL;
    if (n_each > maxc(c))
        return reduce_scatter_chunked(c, err, errlen, send, recv, n_each, t, r) == STATUS_OK ? STATUS_OK
                                                                                             : req_abandon(req);
    int rc = MPI_Ireduce_scatter_block(send == recv ? MPI_IN_PLACE : send, recv, (int)n_each, t.type, t.op, mcomm(c),
                                       &r->r[0]);
    if (rc != MPI_SUCCESS) {
        char extra[32];
        snprintf(extra, sizeof extra, " per rank%s", t.extra ? t.extra : "");
        fail(c, err, errlen, rc, "MPI_Ireduce_scatter_block", n_each, extra);
        return req_abandon(req);
    }
    r->nreq = 1;
    return 0;
}

static status_t mpi_ireduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt,
                                    comm_req_t *req, char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Ireduce_scatter_block", n_each, &t));
    return ireduce_scatter_post(c, err, errlen, send, recv, n_each, t, comm_op_name(COMM_K_REDUCE_SCATTER, 1, dt), req);
}

/* The block type of one chunk of a chunked allgather: len elements whose
 * extent is the block stride (n_each elements), in *strided. */
static status_t strided_type(comm_t *c, char *err, size_t errlen, red_t t, int len, size_t n_each,
                             MPI_Datatype *strided)
{
    MPI_Datatype block = MPI_DATATYPE_NULL;
    *strided = MPI_DATATYPE_NULL;
    int rc = MPI_Type_contiguous(len, t.type, &block);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_create_resized(block, 0, (MPI_Aint)(n_each * t.size), strided);
    if (rc == MPI_SUCCESS)
        rc = MPI_Type_commit(strided);
    if (block != MPI_DATATYPE_NULL)
        MPI_Type_free(&block);
    if (rc == MPI_SUCCESS)
        return 0;
    if (*strided != MPI_DATATYPE_NULL)
        MPI_Type_free(strided);
    return fail(c, err, errlen, rc, "MPI_Type_create_resized", n_each, " per rank, chunked allgather");
}

/* One allgather per chunk: this rank's [off, off+len) into every block's
 * [off, off+len), through a type of len elements whose extent is the block
 * stride. In place the contribution is already at recv + rank*n_each + off. */
static status_t allgather_chunks(comm_t *c, char *err, size_t errlen, const void *send, void *recv, size_t n_each,
                                 red_t t, mpi_req_t *r)
{
    const size_t max = maxc(c);
    const int inplace = send == (const char *)recv + (size_t)c->rank * n_each * t.size;
    const char *what = r ? "MPI_Iallgather" : "MPI_Allgather";
    for (size_t off = 0; off < n_each; off += max) {
        int len = chunk_len(n_each, off, max);
        MPI_Datatype strided = MPI_DATATYPE_NULL;
        const int rtype_own = n_each > max;
        if (rtype_own && strided_type(c, err, errlen, t, len, n_each, &strided) != 0)
            return STATUS_FAIL;
        const void *sbuf = inplace ? MPI_IN_PLACE : (const void *)((const char *)send + off * t.size);
        void *rbuf = (char *)recv + off * t.size;
        int rcount = rtype_own ? 1 : len;
        MPI_Datatype rtype = rtype_own ? strided : t.type;
        int rc = r ? MPI_Iallgather(sbuf, len, t.type, rbuf, rcount, rtype, mcomm(c), &r->r[r->nreq])
                   : MPI_Allgather(sbuf, len, t.type, rbuf, rcount, rtype, mcomm(c));
        /* a datatype freed while an operation uses it stays valid for it */
        if (rtype_own)
            MPI_Type_free(&strided);
        if (rc != MPI_SUCCESS) {
            char extra[32];
            snprintf(extra, sizeof extra, " per rank%s", t.extra ? t.extra : "");
            return fail(c, err, errlen, rc, what, n_each, extra);
        }
        if (r)
            r->nreq++;
    }
    return 0;
}

static status_t mpi_iallgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, comm_req_t *req,
                               char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Iallgather", n_each, &t));
    mpi_req_t *r = req_start(c, err, errlen, req, "MPI_Iallgather", n_each, n_chunks(n_each, maxc(c)),
                             comm_op_name(COMM_K_ALLGATHER, 1, dt), nbytes(n_each * (size_t)c->size, dt), -1);
    if (!r)
        return STATUS_FAIL;
    return allgather_chunks(c, err, errlen, send, recv, n_each, t, r) == STATUS_OK ? STATUS_OK : req_abandon(req);
}

static status_t broadcast_run(comm_t *c, char *err, size_t errlen, void *buf, size_t n, red_t t, int root)
{
    const size_t max = maxc(c);
    for (size_t off = 0; off < n; off += max) {
        int rc = MPI_Bcast((char *)buf + off * t.size, chunk_len(n, off, max), t.type, root, mcomm(c));
        if (rc != MPI_SUCCESS) {
            char extra[48];
            snprintf(extra, sizeof extra, "%s, root %d", t.extra ? t.extra : "", root);
            return fail(c, err, errlen, rc, "MPI_Bcast", n, extra);
        }
    }
    return 0;
}

/* --------------------------------------------------------- point to point */

static status_t p2p_fail(comm_t *c, char *err, size_t errlen, int rc, const char *what, size_t n, red_t t, int peer,
                         int tag)
{
    char extra[64];
    snprintf(extra, sizeof extra, "%s, peer %d, tag %d", t.extra ? t.extra : "", peer, tag);
    return fail(c, err, errlen, rc, what, n, extra);
}

static status_t send_run(comm_t *c, char *err, size_t errlen, const void *buf, size_t n, red_t t, int peer, int tag)
{
    const size_t max = maxc(c);
    size_t off = 0;
    do { /* n = 0 still sends one empty message, which recv matches */
        int rc =
            MPI_Send((const char *)buf + off * t.size, n ? chunk_len(n, off, max) : 0, t.type, peer, tag, mcomm(c));
        if (rc != MPI_SUCCESS)
            return p2p_fail(c, err, errlen, rc, "MPI_Send", n, t, peer, tag);
        off += max;
    } while (off < n);
    return 0;
}

static status_t recv_run(comm_t *c, char *err, size_t errlen, void *buf, size_t n, red_t t, int peer, int tag)
{
    const size_t max = maxc(c);
    size_t off = 0;
    do {
        MPI_Status st;
        int want = n ? chunk_len(n, off, max) : 0, got = 0;
        int rc = MPI_Recv((char *)buf + off * t.size, want, t.type, peer, tag, mcomm(c), &st);
        if (rc == MPI_SUCCESS)
            rc = MPI_Get_count(&st, t.type, &got);
        if (rc != MPI_SUCCESS)
            return p2p_fail(c, err, errlen, rc, "MPI_Recv", n, t, peer, tag);
        if (got != want) {
            char msg[96];
            snprintf(msg, sizeof msg, "peer %d sent %d %s where %d were expected", peer, got,
                     t.extra ? "elements" : "floats", want);
            return fail_msg(c, err, errlen, "MPI_Recv", n, msg);
        }
        off += max;
    } while (off < n);
    return 0;
}

/* isend (send != NULL) or irecv: one request per chunk */
static status_t p2p_post(comm_t *c, char *err, size_t errlen, const void *send, void *recv, size_t n, comm_dtype_t dt,
                         int peer, int tag, comm_req_t *req)
{
    const char *what = send ? "MPI_Isend" : "MPI_Irecv";
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, what, n, &t));
    const size_t max = maxc(c);
    mpi_req_t *r = req_start(c, err, errlen, req, what, n, n ? n_chunks(n, max) : 1,
                             comm_op_name(send ? COMM_K_SEND : COMM_K_RECV, 1, dt), nbytes(n, dt), peer);
    if (!r)
        return STATUS_FAIL;
    size_t off = 0;
    do {
        const int len = n ? chunk_len(n, off, max) : 0;
        int rc = send ? MPI_Isend((const char *)send + off * t.size, len, t.type, peer, tag, mcomm(c), &r->r[r->nreq])
                      : MPI_Irecv((char *)recv + off * t.size, len, t.type, peer, tag, mcomm(c), &r->r[r->nreq]);
        if (rc != MPI_SUCCESS) {
            p2p_fail(c, err, errlen, rc, what, n, t, peer, tag);
            return req_abandon(req);
        }
        r->nreq++;
        off += max;
    } while (off < n);
    return 0;
}

static status_t mpi_isend(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                          char *err, size_t errlen)
{
    return p2p_post(c, err, errlen, buf, NULL, n, dt, peer, tag, req);
}

static status_t mpi_irecv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                          char *err, size_t errlen)
{
    return p2p_post(c, err, errlen, NULL, buf, n, dt, peer, tag, req);
}

/* ------------------------------------------------------------- completion */

/* The span of a finished nonblocking operation, ending now. */
static void req_span(comm_req_t *req)
{
    const mpi_req_t *r = req->impl;
    span_end(req->comm, 0, r->op, r->t0, r->bytes, r->peer);
}

static void req_release(comm_req_t *req)
{
    free(req->impl);
    req->impl = NULL;
    req->active = 0;
}

static status_t mpi_test(comm_req_t *req, int *done, char *err, size_t errlen)
{
    *done = 1;
    if (!req->active)
        return 0;
    mpi_req_t *r = req->impl;
    int flag = 1;
    int rc = r->nreq ? MPI_Testall(r->nreq, r->r, &flag, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    if (rc != MPI_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "MPI_Testall(%s)", r->what);
        fail(req->comm, err, errlen, rc, what, r->n, NULL);
        req_release(req);
        return STATUS_FAIL;
    }
    *done = flag;
    if (flag) {
        req_span(req);
        req_release(req);
    }
    return 0;
}

static status_t mpi_wait(comm_req_t *req, char *err, size_t errlen)
{
    if (!req->active)
        return 0;
    mpi_req_t *r = req->impl;
    watchdog_enter(req->comm->watch, r->op, req->comm->name, req->comm->size, r->bytes, r->peer);
    int rc = r->nreq ? MPI_Waitall(r->nreq, r->r, MPI_STATUSES_IGNORE) : MPI_SUCCESS;
    watchdog_leave(req->comm->watch);
    if (rc != MPI_SUCCESS) {
        char what[64];
        snprintf(what, sizeof what, "MPI_Waitall(%s)", r->what);
        fail(req->comm, err, errlen, rc, what, r->n, NULL);
        req_release(req);
        return STATUS_FAIL;
    }
    req_span(req);
    req_release(req);
    return 0;
}

static status_t barrier_run(comm_t *c, char *err, size_t errlen)
{
    int rc = MPI_Barrier(mcomm(c));
    return rc == MPI_SUCCESS ? 0 : fail(c, err, errlen, rc, "MPI_Barrier", 0, NULL);
}

static void mpi_destroy(comm_t *c)
{
    if (!c)
        return;
    mpi_comm_t *m = (mpi_comm_t *)c;
    int finalized = 1;
    if (MPI_Finalized(&finalized) == MPI_SUCCESS && !finalized) {
        if (m->bf16_sum != MPI_OP_NULL)
            MPI_Op_free(&m->bf16_sum);
        if (m->comm != MPI_COMM_NULL)
            MPI_Comm_free(&m->comm);
    }
    free(m);
}

/* Blocking calls: the operation, timed when traced, watched when
 * comm->watch is set. A wrong type or op fails before the watchdog's mark. */

static status_t mpi_allreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, op, "MPI_Allreduce", n, &t));
    const char *name = comm_op_name(COMM_K_ALLREDUCE, 0, dt);
    double t0 = block_begin(c, name, nbytes(n, dt), -1);
    return block_end(c, allreduce_run(c, err, errlen, buf, n, t), name, t0, nbytes(n, dt), -1);
}

static status_t mpi_reduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                                   size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Reduce_scatter_block", n_each, &t));
    const char *name = comm_op_name(COMM_K_REDUCE_SCATTER, 0, dt);
    const long long bytes = nbytes(n_each * (size_t)c->size, dt);
    double t0 = block_begin(c, name, bytes, -1);
    return block_end(c, reduce_scatter_run(c, err, errlen, send, recv, n_each, t), name, t0, bytes, -1);
}

static status_t mpi_allgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                              size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Allgather", n_each, &t));
    const char *name = comm_op_name(COMM_K_ALLGATHER, 0, dt);
    const long long bytes = nbytes(n_each * (size_t)c->size, dt);
    double t0 = block_begin(c, name, bytes, -1);
    return block_end(c, allgather_chunks(c, err, errlen, send, recv, n_each, t, NULL), name, t0, bytes, -1);
}

static status_t mpi_broadcast(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int root, char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Bcast", n, &t));
    const char *name = comm_op_name(COMM_K_BCAST, 0, dt);
    double t0 = block_begin(c, name, nbytes(n, dt), root);
    return block_end(c, broadcast_run(c, err, errlen, buf, n, t, root), name, t0, nbytes(n, dt), root);
}

/* blocking point to point: send != NULL sends, else receives into recv */
static status_t p2p_block(comm_t *c, const void *send, void *recv, size_t n, comm_dtype_t dt, int peer, int tag,
                          char *err, size_t errlen)
{
    red_t t = {0};
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, send ? "MPI_Send" : "MPI_Recv", n, &t));
    const char *name = comm_op_name(send ? COMM_K_SEND : COMM_K_RECV, 0, dt);
    double t0 = block_begin(c, name, nbytes(n, dt), peer);
    status_t rc =
        send ? send_run(c, err, errlen, send, n, t, peer, tag) : recv_run(c, err, errlen, recv, n, t, peer, tag);
    return block_end(c, rc, name, t0, nbytes(n, dt), peer);
}

static status_t mpi_send(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err,
                         size_t errlen)
{
    return p2p_block(c, buf, NULL, n, dt, peer, tag, err, errlen);
}

static status_t mpi_recv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err, size_t errlen)
{
    return p2p_block(c, NULL, buf, n, dt, peer, tag, err, errlen);
}

static status_t mpi_barrier(comm_t *c, char *err, size_t errlen)
{
    double t0 = block_begin(c, "barrier", 0, -1);
    return block_end(c, barrier_run(c, err, errlen), "barrier", t0, 0, -1);
}

/* MPI_Alltoallv: its int counts and displacements from the caller's
 * size_t ones; one over INT_MAX fails the call (no chunking: --ep's
 * dispatch moves rows of a microbatch, far below it). Bytes for the span
 * and watchdog: everything this rank sends. */
static status_t mpi_alltoallv(comm_t *c, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                              const size_t *rcount, const size_t *rdispl, comm_dtype_t dt, char *err, size_t errlen)
{
    red_t t = {0};
    size_t total = 0;
    for (int q = 0; q < c->size; q++)
        total += scount[q];
    CHECK(red_of(c, err, errlen, dt, COMM_SUM, "MPI_Alltoallv", total, &t));
    int *v = malloc(4 * (size_t)c->size * sizeof *v);
    if (!v)
        return fail_msg(c, err, errlen, "MPI_Alltoallv", total, "out of memory for the counts");
    const int n = c->size;
    for (int q = 0; q < n; q++) {
        const size_t x[4] = {scount[q], sdispl[q], rcount[q], rdispl[q]};
        for (int k = 0; k < 4; k++) {
            if (x[k] > INT_MAX) {
                free(v);
                return fail_msg(c, err, errlen, "MPI_Alltoallv", total, "a count or displacement exceeds INT_MAX");
            }
            v[k * n + q] = (int)x[k];
        }
    }
    const char *name = comm_op_name(COMM_K_ALLTOALLV, 0, dt);
    const long long bytes = nbytes(total, dt);
    double t0 = block_begin(c, name, bytes, -1);
    int rc = MPI_Alltoallv(send, v, v + n, t.type, recv, v + 2 * n, v + 3 * n, t.type, mcomm(c));
    free(v);
    status_t st = rc == MPI_SUCCESS ? STATUS_OK : fail(c, err, errlen, rc, "MPI_Alltoallv", total, t.extra);
    return block_end(c, st, name, t0, bytes, -1);
}

/* MPI's requests progress independently: a group adds nothing (comm.h). */
static status_t mpi_group_mark(comm_t *c, char *err, size_t errlen)
{
    (void)c;
    (void)err;
    (void)errlen;
    return STATUS_OK;
}

static const comm_ops_t mpi_ops = {
    .name = "mpi",
    .inorder = 0,
    .group_begin = mpi_group_mark,
    .group_end = mpi_group_mark,
    .allreduce = mpi_allreduce,
    .iallreduce = mpi_iallreduce,
    .reduce_scatter = mpi_reduce_scatter,
    .ireduce_scatter = mpi_ireduce_scatter,
    .allgather = mpi_allgather,
    .iallgather = mpi_iallgather,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .isend = mpi_isend,
    .irecv = mpi_irecv,
    .test = mpi_test,
    .wait = mpi_wait,
    .barrier = mpi_barrier,
    .alltoallv = mpi_alltoallv,
    .destroy = mpi_destroy,
};

comm_t *comm_mpi_create(const void *mpi_comm)
{
    if (!mpi_comm || *(const MPI_Comm *)mpi_comm == MPI_COMM_NULL)
        return NULL;
    mpi_comm_t *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->comm = MPI_COMM_NULL;
    m->bf16_sum = MPI_OP_NULL;
    if (MPI_Comm_dup(*(const MPI_Comm *)mpi_comm, &m->comm) != MPI_SUCCESS ||
        MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN) != MPI_SUCCESS ||
        MPI_Comm_rank(m->comm, &m->pub.rank) != MPI_SUCCESS || MPI_Comm_size(m->comm, &m->pub.size) != MPI_SUCCESS ||
        MPI_Op_create(bf16_sum, 1, &m->bf16_sum) != MPI_SUCCESS) {
        if (m->bf16_sum != MPI_OP_NULL)
            MPI_Op_free(&m->bf16_sum);
        if (m->comm != MPI_COMM_NULL)
            MPI_Comm_free(&m->comm);
        free(m);
        return NULL;
    }
    m->max_count = MAX_COUNT_DEFAULT;
    const char *s = getenv("DTRAIN_COMM_MAX_COUNT");
    if (s && *s) {
        char *end = NULL;
        unsigned long long v = strtoull(s, &end, 10);
        if (end && *end == '\0' && v >= 1 && v <= MAX_COUNT_DEFAULT)
            m->max_count = (size_t)v;
    }
    m->pub.ops = &mpi_ops;
    m->pub.impl = &m->comm;
    return &m->pub;
}

int comm_mpi_handle(const comm_t *c, void *out)
{
    if (!c || c->ops != &mpi_ops || !out)
        return -1;
    *(MPI_Comm *)out = mcomm(c);
    return 0;
}
