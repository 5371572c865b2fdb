/* The communicator interface over NCCL (see nccl_comm.h).
 *
 * Buffers. NCCL needs memory the GPU can address: device or managed
 * memory (the CUDA ops table allocates managed memory) is passed straight
 * to NCCL. A host buffer (a scalar on the stack, a host array: train.c
 * reduces loss sums and norms that way) is staged through a device buffer
 * of the communicator; such an operation runs to completion even when
 * called as nonblocking, and its request is returned finished. The copy
 * back to the host is made only once polling has seen the collective
 * finish (a copy into pageable memory blocks the host until the stream
 * reaches it, where neither the timeout nor ncclCommGetAsyncError would
 * be looked at), and the whole staged operation, copies included, is
 * marked on the watchdog. The device staging buffer grows stream-ordered
 * (cudaFreeAsync/cudaMallocAsync): cudaFree would wait for the whole
 * device, NCCL kernels of other groups still waiting on peers included.
 *
 * In place. The interface's in-place reduce_scatter (send == recv: MPI's
 * MPI_IN_PLACE, the rank's piece lands at the buffer's start) is not
 * NCCL's (recv = send + rank * n); overlapping buffers in any other
 * arrangement are undefined in NCCL. So it runs in NCCL's form and the
 * piece is then copied to the start on the group's stream (the two ranges
 * are disjoint for rank >= 1; rank 0's is already NCCL's form).
 *
 * Streams. Each group has its own communication stream, as PyTorch's
 * ProcessGroupNCCL has one per communicator: a nonblocking operation in
 * flight on one group (a DDP bucket's all-reduce on dp) must not hold back
 * a blocking one on another (a tensor-parallel all-reduce), or the groups
 * would gain an ordering MPI does not impose, and ranks of different
 * pipeline replicas could wait on each other in a cycle. A nonblocking
 * operation records an event after its NCCL call, and test()/wait() query
 * that event. Ordering against computation: the CUDA ops are asynchronous
 * on one compute stream (cuda/ops_cuda.cu), so every operation first makes
 * its group's stream wait on an event recorded on the compute stream: it
 * sees what every op issued before it wrote, and no op issued before it
 * still reads what it overwrites. Ops issued after it are the caller's to
 * hold back until test() or wait() reports it done (as on MPI).
 *
 * Trace and watchdog. Like comm_mpi.c: with comm->trace set, every call
 * records a span ("iallreduce dp", bytes as comm_mpi.c counts them) from
 * its posting to the test() that sees it done or wait()'s return; with
 * comm->watch set, every blocking wait is marked on the watchdog, which
 * ends the job when one lasts longer than --comm-timeout. The timeout
 * given at creation acts first where both are set to the same value
 * (it is checked on every poll): the group is marked failed and the call
 * fails with a message naming it.
 *
 * Failure. Every CUDA and NCCL call is checked and turned into one line in
 * comm->err. While waiting, ncclCommGetAsyncError is polled: a failed peer
 * or network error fails the call instead of hanging; so does the timeout
 * given at creation. The group is then marked failed: every later call,
 * and every poll of a request still in flight on it, fails with that
 * message and never reports a request done. The communicator is not
 * aborted there: ncclCommAbort may wait for the device, and so for NCCL
 * kernels of other groups still waiting on peers, and since NCCL 2.16 for
 * the other ranks of the node to abort too, so one rank aborting alone
 * could hang before it ever reports. The error goes up the stack instead,
 * the ranks agree that the run failed, and nccl_grid_abort then aborts
 * every group of every rank, all in one ncclGroupStart/End (NCCL's grouped
 * abort): tearing down (cudaFree, ncclCommDestroy) with NCCL kernels still
 * waiting on peers that have left would hang.
 *
 * MPI progress. The pipeline's transfers stay on MPI (backend.h), and
 * OpenMPI moves a large message only while some MPI call runs on both
 * sides. A rank spinning here on a tensor-parallel NCCL wait would leave
 * its pipeline sends unmoved, and a peer stage waiting for one of them
 * could be the very rank this wait depends on: a cycle. So every poll also
 * calls MPI_Iprobe (a no-op that drives MPI's progress engine).
 *
 * bf16. The *_bf16 sums pass the bf16 bit patterns as ncclBfloat16 with
 * ncclSum: NCCL adds each pair in fp32 and rounds back to bf16, which is
 * the reduction comm_mpi.c's user op reproduces on the host. Host buffers
 * are staged like fp32 ones (the staging buffer is sized in bytes).
 *
 * Point to point. ncclSend/ncclRecv have no tags: messages between two
 * ranks match in the order they are posted, so the tag argument is only
 * checked by the caller's own ordering (the pipeline executor posts in a
 * fixed schedule order on both sides). */
#include "cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/bootstrap.h"
#include "mpi/clock.h"
#include "mpi/trace.h"
#include "mpi/watchdog.h"

typedef struct nccl_comm {
    comm_t pub; /* first: a comm_t * is a nccl_comm_t * */
    ncclComm_t nc;
    cudaStream_t stream; /* this group's own */
    cudaStream_t after;  /* the compute stream this group's operations follow (NULL: none) */
    cudaEvent_t ready;   /* recorded on `after` by each operation, waited on by `stream` */
    double timeout_s;
    void *stage;         /* device staging for host buffers */
    size_t stage_bytes;
    int failed;          /* an operation failed or timed out: see the top */
} nccl_comm_t;

typedef struct nccl_req {
    cudaEvent_t ev;
    const char *what; /* trace and watchdog name: "iallreduce" */
    size_t n;
    double t0;        /* for the timeout (now_s) */
    double span_t0;   /* for the trace span (trace_now) */
    long long bytes;
    int peer;
} nccl_req_t;

typedef enum { K_ALLREDUCE, K_REDUCE_SCATTER, K_ALLGATHER, K_BCAST, K_SEND, K_RECV } kind_t;
/* operation names as comm_mpi.c gives them to spans and the watchdog */
static const char *const block_name[] = {"allreduce", "reduce_scatter", "allgather", "bcast", "send", "recv"};
static const char *const nonblock_name[] = {"iallreduce", "ireduce_scatter", "iallgather", "ibcast", "isend", "irecv"};

/* An operation's element type: fp32, or bf16 bits (the *_bf16 sums). */
typedef enum { T_F32, T_BF16 } elem_t;

static nccl_comm_t *nm(comm_t *c)
{
    return (nccl_comm_t *)c;
}

static void set_err(comm_t *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static int cuda_fail(comm_t *c, cudaError_t rc, const char *what, size_t n)
{
    set_err(c, "NCCL %s on group %s (n=%zu): CUDA: %s (%s)", what, c->name, n, cudaGetErrorString(rc),
            cudaGetErrorName(rc));
    return -1;
}

static int nccl_fail(comm_t *c, ncclResult_t rc, const char *what, size_t n)
{
    const char *last = nm(c)->nc ? ncclGetLastError(nm(c)->nc) : NULL;
    set_err(c, "NCCL %s on group %s (n=%zu, %d ranks) failed: %s%s%s", what, c->name, n, c->size,
            ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
    return -1;
}

static int is_device_ptr(const void *p)
{
    struct cudaPointerAttributes a;
    if (!p || cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

static int failed_before(comm_t *c, const char *what)
{
    set_err(c, "NCCL %s on group %s: the group failed earlier (see the first error)", what, c->name);
    return -1;
}

/* One poll of an operation's event: 1 done, 0 not yet, -1 failed (on an
 * asynchronous NCCL error or the timeout the group is marked failed). */
static int poll_event(comm_t *c, cudaEvent_t ev, const char *what, size_t n, double t0)
{
    nccl_comm_t *m = nm(c);
    if (m->failed) /* its operations may never finish: the event says nothing of the data */
        return failed_before(c, what);
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess)
        return 1;
    if (q != cudaErrorNotReady)
        return cuda_fail(c, q, what, n);
    ncclResult_t ae = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(m->nc, &ae);
    if (rc != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress)) {
        nccl_fail(c, rc != ncclSuccess ? rc : ae, what, n);
        m->failed = 1;
        return -1;
    }
    if (m->timeout_s > 0 && now_s() - t0 > m->timeout_s) {
        set_err(c, "NCCL %s on group %s (n=%zu, %d ranks) did not finish in %.0f s: a peer is stuck or gone; "
                "the run stops", what, c->name, n, c->size, m->timeout_s);
        m->failed = 1;
        return -1;
    }
    return 0;
}

/* Polls until the event is done (0) or the operation failed (-1),
 * driving MPI's progress meanwhile (see the top). */
static int spin_event(comm_t *c, cudaEvent_t ev, const char *what, size_t n, double t0)
{
    int st, flag;
    while ((st = poll_event(c, ev, what, n, t0)) == 0) {
        /* progress only: a failure here would be MPI's to report at its next real call */
        (void)MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        sched_yield();
    }
    return st < 0 ? -1 : 0;
}

/* Blocks until the event; marked on the watchdog as `what` moving bytes. */
static int wait_event(comm_t *c, cudaEvent_t ev, const char *what, size_t n, double t0, long long bytes, int peer)
{
    watchdog_enter(c->watch, what, c->name, c->size, bytes, peer);
    int st = spin_event(c, ev, what, n, t0);
    watchdog_leave(c->watch);
    return st;
}

static void span_record(comm_t *c, const char *what, double t0, long long bytes, int peer)
{
    if (!c->trace)
        return;
    char name[TRACE_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s%s%s", what, c->name[0] ? " " : "", c->name);
    trace_span(c->trace, TRACE_COMM, name, t0, trace_now(),
               &(trace_args_t){ .bytes = bytes, .microbatch = -1, .layer = -1, .peer = peer });
}

static ncclResult_t enqueue(nccl_comm_t *m, kind_t k, const void *s, void *r, size_t n, ncclDataType_t dt,
                            comm_op_t op, int peer)
{
    ncclRedOp_t rop = op == COMM_MAX ? ncclMax : ncclSum;
    switch (k) {
    case K_ALLREDUCE: return ncclAllReduce(s, r, n, dt, rop, m->nc, m->stream);
    case K_REDUCE_SCATTER: return ncclReduceScatter(s, r, n, dt, ncclSum, m->nc, m->stream);
    case K_ALLGATHER: return ncclAllGather(s, r, n, dt, m->nc, m->stream);
    case K_BCAST: return ncclBroadcast(s, r, n, dt, peer, m->nc, m->stream);
    case K_SEND: return ncclSend(s, n, dt, peer, m->nc, m->stream);
    default: return ncclRecv(r, n, dt, peer, m->nc, m->stream);
    }
}

/* The device staging buffer holds at least `need` bytes (see the top for
 * why it grows stream-ordered). */
static int stage_room(comm_t *c, size_t need, const char *what, size_t n)
{
    nccl_comm_t *m = nm(c);
    if (need <= m->stage_bytes)
        return 0;
    cudaError_t ce;
    if (m->stage && (ce = cudaFreeAsync(m->stage, m->stream)) != cudaSuccess)
        return cuda_fail(c, ce, what, n);
    m->stage = NULL;
    m->stage_bytes = 0;
    if ((ce = cudaMallocAsync(&m->stage, need, m->stream)) != cudaSuccess) {
        m->stage = NULL;
        return cuda_fail(c, ce, what, n);
    }
    m->stage_bytes = need;
    return 0;
}

/* Every operation. send/recv counts by kind (n = the interface's count):
 * allreduce, broadcast: in place, n; reduce_scatter: size*n -> n;
 * allgather: n -> size*n; send: n out; recv: n in. req == NULL: blocking.
 * et: the elements' type (fp32 for all but the *_bf16 sums). */
static int run(comm_t *c, kind_t k, elem_t et, const void *send, void *recv, size_t n, comm_op_t op, int peer_or_root,
               comm_req_t *req)
{
    nccl_comm_t *m = nm(c);
    /* the bf16 element type exists for the two sums only */
    const char *what = et == T_F32 ? (req ? nonblock_name : block_name)[k]
                       : k == K_ALLREDUCE ? (req ? "iallreduce_bf16" : "allreduce_bf16")
                       : (req ? "ireduce_scatter_bf16" : "reduce_scatter_bf16");
    const double span_t0 = c->trace ? trace_now() : 0.0;
    const ncclDataType_t dt = et == T_BF16 ? ncclBfloat16 : ncclFloat;
    const size_t es = et == T_BF16 ? sizeof(uint16_t) : sizeof(float);
    if (req && req->active) { /* as comm_mpi.c: never drop a request in flight */
        set_err(c, "NCCL %s on group %s: the request is still in flight (test or wait for it first)", what, c->name);
        return -1;
    }
    if (req)
        memset(req, 0, sizeof *req);
    if (m->failed)
        return failed_before(c, what);
    size_t sn = 0, rn = 0;
    switch (k) {
    case K_ALLREDUCE: case K_BCAST: sn = rn = n; break;
    case K_REDUCE_SCATTER: sn = (size_t)c->size * n; rn = n; break;
    case K_ALLGATHER: sn = n; rn = (size_t)c->size * n; break;
    case K_SEND: sn = n; break;
    default: rn = n; break;
    }
    /* bytes as comm_mpi.c counts them: the whole buffer of a collective */
    const long long bytes = (long long)((k == K_REDUCE_SCATTER ? sn : k == K_ALLGATHER ? rn : n) * es);
    const int peer = k == K_SEND || k == K_RECV || k == K_BCAST ? peer_or_root : -1;
    const int host = (sn && !is_device_ptr(send)) || (rn && !is_device_ptr(recv));
    const void *s = send;
    void *r = recv;
    cudaError_t ce;
    int st = -1;
    /* a staged operation blocks from its first copy to its last */
    if (host)
        watchdog_enter(c->watch, what, c->name, c->size, bytes, peer);
    /* after every op issued so far (staging copies included: a device side
     * of a staged operation may be the compute stream's output) */
    if (m->after && ((ce = cudaEventRecord(m->ready, m->after)) != cudaSuccess ||
                     (ce = cudaStreamWaitEvent(m->stream, m->ready, 0)) != cudaSuccess)) {
        cuda_fail(c, ce, what, n);
        goto out;
    }
    if (host) {
        /* A copy from pageable memory may wait inside the CUDA call for the
         * stream's earlier work (the compute event above, this group's
         * earlier operations), where neither the timeout nor the peers'
         * errors are looked at: wait for that work by polling first. */
        cudaEvent_t pre;
        if ((ce = cudaEventCreateWithFlags(&pre, cudaEventDisableTiming)) != cudaSuccess) {
            cuda_fail(c, ce, what, n);
            goto out;
        }
        ce = cudaEventRecord(pre, m->stream);
        const int ready = ce == cudaSuccess ? spin_event(c, pre, what, n, now_s()) : cuda_fail(c, ce, what, n);
        (void)cudaEventDestroy(pre);
        if (ready != 0)
            goto out;
        /* stage both sides through device memory; in-place stays in place */
        const int inplace = (const void *)recv == send;
        if (stage_room(c, (inplace ? (sn > rn ? sn : rn) : sn + rn) * es, what, n) != 0)
            goto out;
        s = m->stage;
        r = inplace ? m->stage : (char *)m->stage + sn * es;
        if (sn && (ce = cudaMemcpyAsync(m->stage, send, sn * es, cudaMemcpyDefault, m->stream)) != cudaSuccess) {
            cuda_fail(c, ce, what, n);
            goto out;
        }
    }
    /* where NCCL writes: an in-place reduce_scatter's piece in NCCL's form */
    void *nr = k == K_REDUCE_SCATTER && r == s && c->rank > 0 ? (char *)r + (size_t)c->rank * n * es : r;
    double t0 = now_s();
    ncclResult_t rc = enqueue(m, k, s, nr, n, dt, op, peer_or_root);
    if (rc != ncclSuccess) {
        nccl_fail(c, rc, what, n);
        goto out;
    }
    if (nr != r && (ce = cudaMemcpyAsync(r, nr, n * es, cudaMemcpyDefault, m->stream)) != cudaSuccess) {
        cuda_fail(c, ce, what, n);
        goto out;
    }
    cudaEvent_t ev;
    if ((ce = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
        cuda_fail(c, ce, what, n);
        goto out;
    }
    if ((ce = cudaEventRecord(ev, m->stream)) != cudaSuccess) {
        (void)cudaEventDestroy(ev);
        cuda_fail(c, ce, what, n);
        goto out;
    }
    nccl_req_t *q = !req || host ? NULL : malloc(sizeof *q);
    if (!q) { /* blocking, a staged host buffer, or untrackable: finish now */
        st = host ? spin_event(c, ev, what, n, t0) : wait_event(c, ev, what, n, t0, bytes, peer);
        (void)cudaEventDestroy(ev);
        /* the collective is done: the copy back waits for nothing else */
        if (st == 0 && host && rn &&
            ((ce = cudaMemcpyAsync(recv, r, rn * es, cudaMemcpyDefault, m->stream)) != cudaSuccess ||
             (ce = cudaStreamSynchronize(m->stream)) != cudaSuccess))
            st = cuda_fail(c, ce, what, n);
        if (st == 0)
            span_record(c, what, span_t0, bytes, peer);
        goto out;
    }
    q->ev = ev;
    q->what = what;
    q->n = n;
    q->t0 = t0;
    q->span_t0 = span_t0;
    q->bytes = bytes;
    q->peer = peer;
    req->comm = c;
    req->impl = q;
    req->active = 1;
    st = 0;
out:
    if (host)
        watchdog_leave(c->watch);
    return st;
}

static void release(comm_req_t *req)
{
    nccl_req_t *q = req->impl;
    if (q) {
        (void)cudaEventDestroy(q->ev);
        free(q);
    }
    req->impl = NULL;
    req->active = 0;
}

static int n_test(comm_req_t *req, int *done)
{
    *done = 1;
    if (!req->active)
        return 0;
    nccl_req_t *q = req->impl;
    int st = poll_event(req->comm, q->ev, q->what, q->n, q->t0);
    if (st == 0) {
        *done = 0;
        return 0;
    }
    if (st > 0)
        span_record(req->comm, q->what, q->span_t0, q->bytes, q->peer);
    release(req);
    return st < 0 ? -1 : 0;
}

static int n_wait(comm_req_t *req)
{
    if (!req->active)
        return 0;
    nccl_req_t *q = req->impl;
    int st = wait_event(req->comm, q->ev, q->what, q->n, q->t0, q->bytes, q->peer);
    if (st == 0)
        span_record(req->comm, q->what, q->span_t0, q->bytes, q->peer);
    release(req);
    return st;
}

static int n_allreduce(comm_t *c, float *buf, size_t n, comm_op_t op)
{
    return run(c, K_ALLREDUCE, T_F32, buf, buf, n, op, 0, NULL);
}
static int n_iallreduce(comm_t *c, float *buf, size_t n, comm_op_t op, comm_req_t *req)
{
    return run(c, K_ALLREDUCE, T_F32, buf, buf, n, op, 0, req);
}
static int n_reduce_scatter(comm_t *c, const float *send, float *recv, size_t n_each)
{
    return run(c, K_REDUCE_SCATTER, T_F32, send, recv, n_each, COMM_SUM, 0, NULL);
}
static int n_ireduce_scatter(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req)
{
    return run(c, K_REDUCE_SCATTER, T_F32, send, recv, n_each, COMM_SUM, 0, req);
}
static int n_allreduce_bf16(comm_t *c, uint16_t *buf, size_t n)
{
    return run(c, K_ALLREDUCE, T_BF16, buf, buf, n, COMM_SUM, 0, NULL);
}
static int n_iallreduce_bf16(comm_t *c, uint16_t *buf, size_t n, comm_req_t *req)
{
    return run(c, K_ALLREDUCE, T_BF16, buf, buf, n, COMM_SUM, 0, req);
}
static int n_reduce_scatter_bf16(comm_t *c, const uint16_t *send, uint16_t *recv, size_t n_each)
{
    return run(c, K_REDUCE_SCATTER, T_BF16, send, recv, n_each, COMM_SUM, 0, NULL);
}
static int n_ireduce_scatter_bf16(comm_t *c, const uint16_t *send, uint16_t *recv, size_t n_each, comm_req_t *req)
{
    return run(c, K_REDUCE_SCATTER, T_BF16, send, recv, n_each, COMM_SUM, 0, req);
}
static int n_allgather(comm_t *c, const float *send, float *recv, size_t n_each)
{
    return run(c, K_ALLGATHER, T_F32, send, recv, n_each, COMM_SUM, 0, NULL);
}
static int n_iallgather(comm_t *c, const float *send, float *recv, size_t n_each, comm_req_t *req)
{
    return run(c, K_ALLGATHER, T_F32, send, recv, n_each, COMM_SUM, 0, req);
}
static int n_broadcast(comm_t *c, float *buf, size_t n, int root)
{
    return run(c, K_BCAST, T_F32, buf, buf, n, COMM_SUM, root, NULL);
}
static int n_send(comm_t *c, const float *buf, size_t n, int peer, int tag)
{
    (void)tag;
    return run(c, K_SEND, T_F32, buf, NULL, n, COMM_SUM, peer, NULL);
}
static int n_recv(comm_t *c, float *buf, size_t n, int peer, int tag)
{
    (void)tag;
    return run(c, K_RECV, T_F32, NULL, buf, n, COMM_SUM, peer, NULL);
}
static int n_isend(comm_t *c, const float *buf, size_t n, int peer, int tag, comm_req_t *req)
{
    (void)tag;
    return run(c, K_SEND, T_F32, buf, NULL, n, COMM_SUM, peer, req);
}
static int n_irecv(comm_t *c, float *buf, size_t n, int peer, int tag, comm_req_t *req)
{
    (void)tag;
    return run(c, K_RECV, T_F32, NULL, buf, n, COMM_SUM, peer, req);
}

/* NCCL has no barrier: a one-float allreduce on the staging path. */
static int n_barrier(comm_t *c)
{
    float one = 1.0f;
    return run(c, K_ALLREDUCE, T_F32, &one, &one, 1, COMM_SUM, 0, NULL);
}

static void n_destroy(comm_t *c)
{
    nccl_comm_t *m = nm(c);
    if (m->nc)
        (void)ncclCommDestroy(m->nc); /* teardown: nothing to report to */
    if (m->stage)
        (void)cudaFreeAsync(m->stage, m->stream);
    if (m->ready)
        (void)cudaEventDestroy(m->ready);
    if (m->stream)
        (void)cudaStreamDestroy(m->stream);
    free(m);
}

static const comm_ops_t nccl_ops = {
    .name = "nccl",
    .allreduce = n_allreduce,
    .iallreduce = n_iallreduce,
    .reduce_scatter = n_reduce_scatter,
    .ireduce_scatter = n_ireduce_scatter,
    .allgather = n_allgather,
    .iallgather = n_iallgather,
    .allreduce_bf16 = n_allreduce_bf16,
    .iallreduce_bf16 = n_iallreduce_bf16,
    .reduce_scatter_bf16 = n_reduce_scatter_bf16,
    .ireduce_scatter_bf16 = n_ireduce_scatter_bf16,
    .broadcast = n_broadcast,
    .send = n_send,
    .recv = n_recv,
    .isend = n_isend,
    .irecv = n_irecv,
    .test = n_test,
    .wait = n_wait,
    .barrier = n_barrier,
    .destroy = n_destroy,
};

/* ---- creation ------------------------------------------------------------- */

static int make_nccl_id(void *id, size_t len, void *ctx, char *err, size_t errlen)
{
    (void)ctx;
    ncclUniqueId u;
    ncclResult_t rc = ncclGetUniqueId(&u);
    if (rc != ncclSuccess || len != sizeof u) {
        snprintf(err, errlen, "ncclGetUniqueId: %s", rc != ncclSuccess ? ncclGetErrorString(rc) : "id size");
        return -1;
    }
    memcpy(id, &u, sizeof u);
    return 0;
}

static comm_t **slot(nccl_grid_t *ng, const char *name)
{
    if (strcmp(name, "world") == 0) return &ng->world;
    if (strcmp(name, "tp") == 0) return &ng->tp;
    if (strcmp(name, "dp") == 0) return &ng->dp;
    if (strcmp(name, "pp") == 0) return &ng->pp;
    if (strcmp(name, "embed") == 0) return &ng->embed;
    if (strcmp(name, "shard") == 0) return &ng->shard;
    return &ng->replica;
}

/* 1 on every rank if any rank passed failed != 0 (MPI failure counts). */
static int any_failed(int failed)
{
    int any = 1;
    if (MPI_Allreduce(&failed, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return 1;
    return any;
}

int nccl_grid_create(const grid_t *g, nccl_grid_t *ng, void *after_stream, double timeout_s, char *err,
                     size_t errlen)
{
    memset(ng, 0, sizeof *ng);
    unsigned char ids[BOOTSTRAP_MAX_GROUPS * sizeof(ncclUniqueId)];
    comm_t *list[BOOTSTRAP_MAX_GROUPS];
    const char *names[BOOTSTRAP_MAX_GROUPS];
    int n = bootstrap_grid_ids(g, sizeof(ncclUniqueId), make_nccl_id, NULL, ids, list, names, err, errlen);
    /* nobody may enter ncclCommInitRank while a peer will not */
    if (any_failed(n < 0)) {
        if (n >= 0)
            snprintf(err, errlen, "NCCL bootstrap failed on another rank");
        return -1;
    }
    int failed = 0;
    ncclComm_t nc[BOOTSTRAP_MAX_GROUPS];
    memset(nc, 0, sizeof nc);
    ncclResult_t rc = ncclGroupStart(), first = ncclSuccess;
    const char *first_name = "";
    for (int i = 0; i < n && rc == ncclSuccess; i++) {
        ncclUniqueId u;
        memcpy(&u, ids + (size_t)i * sizeof u, sizeof u);
        ncclResult_t r = ncclCommInitRank(&nc[i], list[i]->size, u, list[i]->rank);
        if (r != ncclSuccess && first == ncclSuccess) {
            first = r;
            first_name = names[i];
        }
    }
    ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess || first != ncclSuccess || end != ncclSuccess) {
        ncclResult_t bad = rc != ncclSuccess ? rc : first != ncclSuccess ? first : end;
        snprintf(err, errlen, "NCCL setup: ncclCommInitRank%s%s: %s", first_name[0] ? " of group " : "",
                 first_name, ncclGetErrorString(bad));
        failed = 1;
    }
    for (int i = 0; i < n && !failed; i++) {
        nccl_comm_t *m = calloc(1, sizeof *m);
        if (!m) {
            snprintf(err, errlen, "NCCL setup: out of memory");
            failed = 1;
            break;
        }
        m->pub.ops = &nccl_ops;
        m->pub.rank = list[i]->rank;
        m->pub.size = list[i]->size;
        m->pub.impl = m;
        snprintf(m->pub.name, sizeof m->pub.name, "%s", names[i]);
        m->nc = nc[i];
        nc[i] = NULL;
        m->timeout_s = timeout_s;
        *slot(ng, names[i]) = &m->pub;
        cudaError_t ce = cudaStreamCreateWithFlags(&m->stream, cudaStreamNonBlocking);
        if (ce != cudaSuccess) {
            m->stream = NULL;
            snprintf(err, errlen, "NCCL setup: cudaStreamCreate for group %s: %s (%s)", names[i],
                     cudaGetErrorString(ce), cudaGetErrorName(ce));
            failed = 1;
        } else if (after_stream) {
            m->after = (cudaStream_t)after_stream;
            ce = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
            if (ce != cudaSuccess) {
                m->ready = NULL;
                m->after = NULL;
                snprintf(err, errlen, "NCCL setup: cudaEventCreate for group %s: %s (%s)", names[i],
                         cudaGetErrorString(ce), cudaGetErrorName(ce));
                failed = 1;
            }
        }
    }
    if (any_failed(failed)) {
        for (int i = 0; i < n; i++)
            if (nc[i])
                (void)ncclCommDestroy(nc[i]);
        if (!failed)
            snprintf(err, errlen, "NCCL setup failed on another rank");
        nccl_grid_destroy(ng);
        return -1;
    }
    return 0;
}

void nccl_grid_abort(nccl_grid_t *ng)
{
    comm_t *all[] = {ng->replica, ng->shard, ng->embed, ng->pp, ng->dp, ng->tp, ng->world};
    const size_t k = sizeof all / sizeof all[0];
    /* the run is already failing: the statuses of the abort add nothing */
    (void)ncclGroupStart();
    for (size_t i = 0; i < k; i++)
        if (all[i] && nm(all[i])->nc)
            (void)ncclCommAbort(nm(all[i])->nc);
    (void)ncclGroupEnd();
    for (size_t i = 0; i < k; i++)
        if (all[i]) {
            nm(all[i])->nc = NULL; /* freed by the abort */
            nm(all[i])->failed = 1;
        }
}

void nccl_grid_destroy(nccl_grid_t *ng)
{
    comm_t **all[] = {&ng->replica, &ng->shard, &ng->embed, &ng->pp, &ng->dp, &ng->tp, &ng->world};
    /* a group that failed cannot be destroyed (its peers may never finish):
     * abort them all together first */
    int failed = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        failed |= *all[i] && nm(*all[i])->failed && nm(*all[i])->nc;
    if (failed)
        nccl_grid_abort(ng);
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            (*all[i])->ops->destroy(*all[i]);
        *all[i] = NULL;
    }
}
