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
 * the caller's error buffer (status.h). While waiting, ncclCommGetAsyncError is polled: a failed peer
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
 * MPI progress. OpenMPI moves a large message only while some MPI call
 * runs on both sides. When the pipeline's transfers ran on MPI beside the
 * NCCL groups, a rank spinning here on a tensor-parallel NCCL wait would
 * have left its pipeline sends unmoved, and a peer stage waiting for one of
 * them could be the very rank this wait depends on: a cycle. pp has an
 * NCCL twin now (backend.c), but every poll still calls MPI_Iprobe (a
 * no-op that drives MPI's progress engine), so a group left on MPI never
 * depends on a rank that spins here.
 *
 * Types. comm_dtype_t maps to ncclFloat, ncclBfloat16, ncclInt32,
 * ncclInt64, ncclFloat64 and ncclUint8. bf16 sums pass the bit patterns as
 * ncclBfloat16 with ncclSum: NCCL adds each pair in fp32 and rounds back
 * to bf16, which is the reduction comm_mpi.c's user op reproduces on the
 * host (and, as there, bf16 takes no other op). Host buffers of every type
 * are staged alike (the staging buffer is sized in bytes).
 *
 * Point to point. ncclSend/ncclRecv have no tags: messages between two
 * ranks match in the order they are posted, so the tag argument is only
 * checked by the caller's own ordering (comm.h's `inorder`, set in this
 * table: the pipeline executor posts in its plan's order on both sides,
 * mpi/pipeline.c). group_begin/group_end are ncclGroupStart/End: the
 * stream is ordered after the compute stream once, at group_begin; the
 * isends and irecvs between them are enqueued by NCCL at ncclGroupEnd, so
 * their requests get their events only then (a request of an open group
 * fails test and wait); a failing ncclGroupEnd marks the group failed.
 * Inside a group a host buffer is refused: its staging would block.
 *
 * All-to-all (alltoallv, --ep's dispatch over the ep group): NCCL has no
 * alltoallv, so it is a ncclSend and a ncclRecv per peer with a non-zero
 * count inside one ncclGroupStart/End (NCCL runs the group's transfers
 * together, so no posting order can deadlock), blocking, with the same
 * ordering, staging, watchdog, timeout and failure handling as the
 * collectives above; the dispatch's row counts are host arrays and take
 * the staging path. */
#include "cuda/nccl_comm.h"

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/agree.h"
#include "mpi/bootstrap.h"
#include "mpi/clock.h"
#include "mpi/status.h"
#include "mpi/trace.h"
#include "mpi/watchdog.h"

typedef struct nccl_comm {
    comm_t pub; /* first: a comm_t * is a nccl_comm_t * */
    ncclComm_t nc;
    cudaStream_t stream; /* this group's own */
    cudaStream_t after;  /* the compute stream this group's operations follow (NULL: none) */
    cudaEvent_t ready;   /* recorded on `after` by each operation, waited on by `stream` */
    double timeout_s;
    void *stage; /* device staging for host buffers */
    size_t stage_bytes;
    int failed;   /* an operation failed or timed out: see the top */
    int grouped;  /* between group_begin and group_end */
    comm_req_t **gq; /* the open group's requests, their events recorded at group_end */
    int n_gq, cap_gq;
} nccl_comm_t;

typedef struct nccl_req {
    cudaEvent_t ev; /* NULL while its group is open */
    const char *what; /* trace and watchdog name: "iallreduce" */
    size_t n;
    double t0;      /* for the timeout (now_s) */
    double span_t0; /* for the trace span (trace_now) */
    long long bytes;
    int peer;
} nccl_req_t;

/* One operation on its way through run(): the call's arguments, then
 * what follows from them. send/recv counts by kind (n = the interface's
 * count): allreduce, broadcast: in place, n; reduce_scatter: size*n -> n;
 * allgather: n -> size*n; send: n out; recv: n in. */
typedef struct nccl_op {
    comm_kind_t k;
    comm_dtype_t dt;
    const void *send;
    void *recv;
    size_t n;
    comm_op_t op;
    int peer_or_root;
    comm_req_t *req;   /* NULL: blocking */
    const char *what;  /* comm_op_name: spans, the watchdog, messages */
    double span_t0;    /* trace_now() at entry, when traced */
    size_t es, sn, rn; /* element size, elements sent and received */
    long long bytes;   /* as comm_mpi.c counts them: the whole buffer of a collective */
    int peer;          /* the span's and watchdog's peer (send, recv, broadcast root), else -1 */
    int host;          /* a buffer is in host memory: staged through m->stage */
    const void *s;     /* what NCCL reads and writes: the buffers or the staging */
    void *r;
} nccl_op_t;

static nccl_comm_t *nm(comm_t *c) { return (nccl_comm_t *)c; }

static status_t cuda_fail(comm_t *c, char *err, size_t errlen, cudaError_t rc, const char *what, size_t n)
{
    status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s (n=%zu): CUDA: %s (%s)", what, c->name, n,
               cudaGetErrorString(rc), cudaGetErrorName(rc));
    return -1;
}

static status_t nccl_fail(comm_t *c, char *err, size_t errlen, ncclResult_t rc, const char *what, size_t n)
{
    const char *last = nm(c)->nc ? ncclGetLastError(nm(c)->nc) : NULL;
    status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s (n=%zu, %d ranks) failed: %s%s%s", what, c->name, n,
               c->size, ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
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

static status_t failed_before(comm_t *c, char *err, size_t errlen, const char *what)
{
    status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: the group failed earlier (see the first error)", what,
               c->name);
    return -1;
}

/* One poll of an operation's event: 1 done, 0 not yet, -1 failed (on an
 * asynchronous NCCL error or the timeout the group is marked failed). */
static int poll_event(comm_t *c, char *err, size_t errlen, cudaEvent_t ev, const char *what, size_t n, double t0)
{
    nccl_comm_t *m = nm(c);
    if (m->failed) /* its operations may never finish: the event says nothing of the data */
        return failed_before(c, err, errlen, what);
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess)
        return 1;
    if (q != cudaErrorNotReady)
        return cuda_fail(c, err, errlen, q, what, n);
    ncclResult_t ae = ncclSuccess;
    ncclResult_t rc = ncclCommGetAsyncError(m->nc, &ae);
    if (rc != ncclSuccess || (ae != ncclSuccess && ae != ncclInProgress)) {
        nccl_fail(c, err, errlen, rc != ncclSuccess ? rc : ae, what, n);
        m->failed = 1;
        return -1;
    }
    if (m->timeout_s > 0 && now_s() - t0 > m->timeout_s) {
        status_set(STATUS_FAIL, err, errlen,
                   "NCCL %s on group %s (n=%zu, %d ranks) did not finish in %.0f s: a peer is stuck or gone; "
                   "the run stops",
                   what, c->name, n, c->size, m->timeout_s);
        m->failed = 1;
        return -1;
    }
    return 0;
}

/* Polls until the event is done (0) or the operation failed (-1),
 * driving MPI's progress meanwhile (see the top). */
static status_t spin_event(comm_t *c, char *err, size_t errlen, cudaEvent_t ev, const char *what, size_t n, double t0)
{
    int st, flag;
    while ((st = poll_event(c, err, errlen, ev, what, n, t0)) == 0) {
        /* progress only: a failure here would be MPI's to report at its next real call */
        (void)MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
        sched_yield();
    }
    return st < 0 ? -1 : 0;
}

/* Blocks until the event; marked on the watchdog as `what` moving bytes. */
static status_t wait_event(comm_t *c, char *err, size_t errlen, cudaEvent_t ev, const char *what, size_t n, double t0,
                           long long bytes, int peer)
{
    watchdog_enter(c->watch, what, c->name, c->size, bytes, peer);
    int st = spin_event(c, err, errlen, ev, what, n, t0);
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
               &(trace_args_t){.bytes = bytes, .microbatch = -1, .layer = -1, .peer = peer});
}

/* NCCL's type and reduction for o: STATUS_OK, or STATUS_FAIL with the
 * message in err. */
static status_t nccl_types(comm_t *c, char *err, size_t errlen, const nccl_op_t *o, ncclDataType_t *dt,
                           ncclRedOp_t *rop)
{
    static const ncclDataType_t types[COMM_N_DTYPES] = {ncclFloat, ncclBfloat16, ncclInt32,
                                                        ncclInt64, ncclFloat64,  ncclUint8};
    if ((unsigned)o->dt >= COMM_N_DTYPES || (o->dt == COMM_BF16 && o->op != COMM_SUM) ||
        (o->op != COMM_SUM && o->op != COMM_MAX && o->op != COMM_MIN)) {
        status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s (n=%zu): %s", o->what, c->name, o->n,
                   o->dt == COMM_BF16 ? "bf16 reduces with the sum only" : "unknown element type or reduction op");
        return -1;
    }
    *dt = types[o->dt];
    *rop = o->op == COMM_MAX ? ncclMax : o->op == COMM_MIN ? ncclMin : ncclSum;
    return 0;
}

static ncclResult_t enqueue(nccl_comm_t *m, const nccl_op_t *o, void *r, ncclDataType_t dt, ncclRedOp_t rop)
{
    const void *s = o->s;
    const size_t n = o->n;
    const int peer = o->peer_or_root;
    switch (o->k) {
    case COMM_K_ALLREDUCE: return ncclAllReduce(s, r, n, dt, rop, m->nc, m->stream);
    case COMM_K_REDUCE_SCATTER: return ncclReduceScatter(s, r, n, dt, ncclSum, m->nc, m->stream);
    case COMM_K_ALLGATHER: return ncclAllGather(s, r, n, dt, m->nc, m->stream);
    case COMM_K_BCAST: return ncclBroadcast(s, r, n, dt, peer, m->nc, m->stream);
    case COMM_K_SEND: return ncclSend(s, n, dt, peer, m->nc, m->stream);
    default: return ncclRecv(r, n, dt, peer, m->nc, m->stream);
    }
}

/* The device staging buffer holds at least `need` bytes (see the top for
 * why it grows stream-ordered). */
static status_t stage_room(comm_t *c, char *err, size_t errlen, size_t need, const char *what, size_t n)
{
    nccl_comm_t *m = nm(c);
    if (need <= m->stage_bytes)
        return 0;
    cudaError_t ce;
    if (m->stage && (ce = cudaFreeAsync(m->stage, m->stream)) != cudaSuccess)
        return cuda_fail(c, err, errlen, ce, what, n);
    m->stage = NULL;
    m->stage_bytes = 0;
    if ((ce = cudaMallocAsync(&m->stage, need, m->stream)) != cudaSuccess) {
        m->stage = NULL;
        return cuda_fail(c, err, errlen, ce, what, n);
    }
    m->stage_bytes = need;
    return 0;
}

/* The derived fields of o (names, counts, bytes, host or device); refuses
 * a request still in flight and a group that failed earlier. */
static status_t op_prepare(comm_t *c, char *err, size_t errlen, nccl_op_t *o)
{
    o->what = comm_op_name(o->k, o->req != NULL, o->dt);
    o->span_t0 = c->trace ? trace_now() : 0.0;
    o->es = comm_dtype_size(o->dt);
    if (o->req && o->req->active) { /* as comm_mpi.c: never drop a request in flight */
        status_set(STATUS_FAIL, err, errlen,
                   "NCCL %s on group %s: the request is still in flight (test or wait for it first)", o->what, c->name);
        return -1;
    }
    if (o->req)
        memset(o->req, 0, sizeof *o->req);
    if (nm(c)->failed)
        return failed_before(c, err, errlen, o->what);
    const size_t n = o->n, all = (size_t)c->size * n;
    switch (o->k) {
    case COMM_K_ALLREDUCE:
    case COMM_K_BCAST: o->sn = o->rn = n; break;
    case COMM_K_REDUCE_SCATTER:
        o->sn = all;
        o->rn = n;
        break;
    case COMM_K_ALLGATHER:
        o->sn = n;
        o->rn = all;
        break;
    case COMM_K_SEND:
        o->sn = n;
        o->rn = 0;
        break;
    default:
        o->sn = 0;
        o->rn = n;
        break;
    }
    o->bytes = (long long)((o->k == COMM_K_REDUCE_SCATTER || o->k == COMM_K_ALLGATHER ? all : n) * o->es);
    o->peer = o->k == COMM_K_SEND || o->k == COMM_K_RECV || o->k == COMM_K_BCAST ? o->peer_or_root : -1;
    o->host = (o->sn && !is_device_ptr(o->send)) || (o->rn && !is_device_ptr(o->recv));
    o->s = o->send;
    o->r = o->recv;
    return 0;
}

/* A copy from pageable memory may wait inside the CUDA call for the
 * stream's earlier work (the compute event, this group's earlier
 * operations), where neither the timeout nor the peers' errors are looked
 * at: a staged operation first waits for that work by polling. */
static status_t stream_drain(comm_t *c, char *err, size_t errlen, const char *what, size_t n)
{
    cudaError_t ce;
    cudaEvent_t pre;
    if ((ce = cudaEventCreateWithFlags(&pre, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(c, err, errlen, ce, what, n);
    ce = cudaEventRecord(pre, nm(c)->stream);
    const int ready =
        ce == cudaSuccess ? spin_event(c, err, errlen, pre, what, n, now_s()) : cuda_fail(c, err, errlen, ce, what, n);
    (void)cudaEventDestroy(pre);
    return ready;
}

/* A host buffer's way in: its data copied into the staging buffer, which
 * o->s and o->r then point into (in place stays in place). */
static status_t stage_in(comm_t *c, char *err, size_t errlen, nccl_op_t *o)
{
    nccl_comm_t *m = nm(c);
    cudaError_t ce;
    if (stream_drain(c, err, errlen, o->what, o->n) != 0)
        return -1;
    const int inplace = (const void *)o->recv == o->send;
    if (stage_room(c, err, errlen, (inplace ? (o->sn > o->rn ? o->sn : o->rn) : o->sn + o->rn) * o->es, o->what,
                   o->n) != 0)
        return -1;
    o->s = m->stage;
    o->r = inplace ? m->stage : (char *)m->stage + o->sn * o->es;
    if (o->sn && (ce = cudaMemcpyAsync(m->stage, o->send, o->sn * o->es, cudaMemcpyDefault, m->stream)) != cudaSuccess)
        return cuda_fail(c, err, errlen, ce, o->what, o->n);
    return 0;
}

/* The NCCL call on the group's stream, after the compute stream's work,
 * and an event recorded after it into *ev. t0: when it was posted. */
static status_t post(comm_t *c, char *err, size_t errlen, nccl_op_t *o, cudaEvent_t *ev, double *t0)
{
    nccl_comm_t *m = nm(c);
    ncclDataType_t dt;
    ncclRedOp_t rop;
    cudaError_t ce;
    if (nccl_types(c, err, errlen, o, &dt, &rop) != 0)
        return -1;
    /* after every op issued so far (staging copies included: a device side
     * of a staged operation may be the compute stream's output), those the
     * graph table still holds first issued */
    if (m->after && c->device_flush)
        c->device_flush(c->device_ctx);
    if (m->after && ((ce = cudaEventRecord(m->ready, m->after)) != cudaSuccess ||
                     (ce = cudaStreamWaitEvent(m->stream, m->ready, 0)) != cudaSuccess))
        return cuda_fail(c, err, errlen, ce, o->what, o->n);
    if (o->host && stage_in(c, err, errlen, o) != 0)
        return -1;
    /* where NCCL writes: an in-place reduce_scatter's piece in NCCL's form */
    void *nr = o->k == COMM_K_REDUCE_SCATTER && o->r == o->s && c->rank > 0
                   ? (char *)o->r + (size_t)c->rank * o->n * o->es
                   : o->r;
    *t0 = now_s();
    ncclResult_t rc = enqueue(m, o, nr, dt, rop);
    if (rc != ncclSuccess)
        return nccl_fail(c, err, errlen, rc, o->what, o->n);
    if (nr != o->r && (ce = cudaMemcpyAsync(o->r, nr, o->n * o->es, cudaMemcpyDefault, m->stream)) != cudaSuccess)
        return cuda_fail(c, err, errlen, ce, o->what, o->n);
    if ((ce = cudaEventCreateWithFlags(ev, cudaEventDisableTiming)) != cudaSuccess)
        return cuda_fail(c, err, errlen, ce, o->what, o->n);
    if ((ce = cudaEventRecord(*ev, m->stream)) != cudaSuccess) {
        (void)cudaEventDestroy(*ev);
        return cuda_fail(c, err, errlen, ce, o->what, o->n);
    }
    return 0;
}

/* Blocking, a staged host buffer, or untrackable: waits for the posted
 * operation (its event) and copies a staged result back. */
static status_t finish_now(comm_t *c, char *err, size_t errlen, const nccl_op_t *o, cudaEvent_t ev, double t0)
{
    nccl_comm_t *m = nm(c);
    cudaError_t ce;
    int st = o->host ? spin_event(c, err, errlen, ev, o->what, o->n, t0)
                     : wait_event(c, err, errlen, ev, o->what, o->n, t0, o->bytes, o->peer);
    (void)cudaEventDestroy(ev);
    /* the collective is done: the copy back waits for nothing else */
    if (st == 0 && o->host && o->rn &&
        ((ce = cudaMemcpyAsync(o->recv, o->r, o->rn * o->es, cudaMemcpyDefault, m->stream)) != cudaSuccess ||
         (ce = cudaStreamSynchronize(m->stream)) != cudaSuccess))
        st = cuda_fail(c, err, errlen, ce, o->what, o->n);
    if (st == 0)
        span_record(c, o->what, o->span_t0, o->bytes, o->peer);
    return st;
}

/* Inside group_begin/group_end: an isend or irecv of device memory, its
 * NCCL call deferred by NCCL to ncclGroupEnd; its request gets its event
 * there (an event recorded now would precede the group's kernel). The
 * ordering after the compute stream was made by group_begin. */
static status_t run_grouped(comm_t *c, char *err, size_t errlen, nccl_op_t *o)
{
    nccl_comm_t *m = nm(c);
    ncclDataType_t dt;
    ncclRedOp_t rop;
    if ((o->k != COMM_K_SEND && o->k != COMM_K_RECV) || !o->req || o->host) {
        status_set(STATUS_FAIL, err, errlen,
                   "NCCL %s on group %s: inside a group only isend and irecv of device memory", o->what, c->name);
        return -1;
    }
    if (nccl_types(c, err, errlen, o, &dt, &rop) != 0)
        return -1;
    if (m->n_gq == m->cap_gq) {
        const int cap = m->cap_gq ? 2 * m->cap_gq : 8;
        comm_req_t **p = realloc(m->gq, (size_t)cap * sizeof *p);
        if (!p) {
            status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: out of memory", o->what, c->name);
            return -1;
        }
        m->gq = p;
        m->cap_gq = cap;
    }
    nccl_req_t *q = malloc(sizeof *q);
    if (!q) {
        status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: out of memory", o->what, c->name);
        return -1;
    }
    ncclResult_t rc = enqueue(m, o, o->r, dt, rop);
    if (rc != ncclSuccess) {
        free(q);
        return nccl_fail(c, err, errlen, rc, o->what, o->n);
    }
    *q = (nccl_req_t){.ev = NULL, .what = o->what, .n = o->n, .span_t0 = o->span_t0, .bytes = o->bytes, .peer = o->peer};
    *o->req = (comm_req_t){.comm = c, .impl = q, .active = 1};
    m->gq[m->n_gq++] = o->req;
    return 0;
}

/* Every operation (req == NULL: blocking). A staged one blocks from its
 * first copy to its last and is marked on the watchdog all that time. */
static status_t run(comm_t *c, char *err, size_t errlen, nccl_op_t o)
{
    if (op_prepare(c, err, errlen, &o) != 0)
        return -1;
    if (nm(c)->grouped)
        return run_grouped(c, err, errlen, &o);
    if (o.host)
        watchdog_enter(c->watch, o.what, c->name, c->size, o.bytes, o.peer);
    cudaEvent_t ev;
    double t0 = 0.0;
    int st = post(c, err, errlen, &o, &ev, &t0);
    nccl_req_t *q = st != 0 || !o.req || o.host ? NULL : malloc(sizeof *q);
    if (st == 0 && !q) {
        st = finish_now(c, err, errlen, &o, ev, t0);
    } else if (q) {
        *q = (nccl_req_t){
            .ev = ev, .what = o.what, .n = o.n, .t0 = t0, .span_t0 = o.span_t0, .bytes = o.bytes, .peer = o.peer};
        *o.req = (comm_req_t){.comm = c, .impl = q, .active = 1};
    }
    if (o.host)
        watchdog_leave(c->watch);
    return st;
}

static void release(comm_req_t *req)
{
    nccl_req_t *q = req->impl;
    if (q) {
        if (q->ev)
            (void)cudaEventDestroy(q->ev);
        free(q);
    }
    req->impl = NULL;
    req->active = 0;
}

/* A request of a group still open has no event yet. */
static status_t still_grouped(comm_req_t *req, char *err, size_t errlen)
{
    nccl_req_t *q = req->impl;
    status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: tested or waited for inside its open group", q->what,
               req->comm->name);
    return -1;
}

static status_t n_test(comm_req_t *req, int *done, char *err, size_t errlen)
{
    *done = 1;
    if (!req->active)
        return 0;
    nccl_req_t *q = req->impl;
    if (!q->ev && !nm(req->comm)->failed) {
        *done = 0;
        return still_grouped(req, err, errlen);
    }
    int st = poll_event(req->comm, err, errlen, q->ev, q->what, q->n, q->t0);
    if (st == 0) {
        *done = 0;
        return 0;
    }
    if (st > 0)
        span_record(req->comm, q->what, q->span_t0, q->bytes, q->peer);
    release(req);
    return st < 0 ? STATUS_FAIL : STATUS_OK;
}

static status_t n_wait(comm_req_t *req, char *err, size_t errlen)
{
    if (!req->active)
        return 0;
    nccl_req_t *q = req->impl;
    if (!q->ev && !nm(req->comm)->failed)
        return still_grouped(req, err, errlen);
    /* the host blocks here: what the graph table holds (the GEMMs meant
     * to run beside this operation) is issued first */
    if (req->comm->device_flush)
        req->comm->device_flush(req->comm->device_ctx);
    int st = wait_event(req->comm, err, errlen, q->ev, q->what, q->n, q->t0, q->bytes, q->peer);
    if (st == 0)
        span_record(req->comm, q->what, q->span_t0, q->bytes, q->peer);
    release(req);
    return st;
}

/* the interface's calls: one nccl_op_t each */
#define OP(...) ((nccl_op_t){__VA_ARGS__})

static status_t n_allreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, char *err, size_t errlen)
{
    return run(c, err, errlen, OP(.k = COMM_K_ALLREDUCE, .dt = dt, .send = buf, .recv = buf, .n = n, .op = op));
}
static status_t n_iallreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, comm_req_t *req, char *err,
                             size_t errlen)
{
    return run(c, err, errlen,
               OP(.k = COMM_K_ALLREDUCE, .dt = dt, .send = buf, .recv = buf, .n = n, .op = op, .req = req));
}
static status_t n_reduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                                 size_t errlen)
{
    return run(c, err, errlen, OP(.k = COMM_K_REDUCE_SCATTER, .dt = dt, .send = send, .recv = recv, .n = n_each));
}
static status_t n_ireduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt,
                                  comm_req_t *req, char *err, size_t errlen)
{
    return run(c, err, errlen,
               OP(.k = COMM_K_REDUCE_SCATTER, .dt = dt, .send = send, .recv = recv, .n = n_each, .req = req));
}
static status_t n_allgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                            size_t errlen)
{
    return run(c, err, errlen, OP(.k = COMM_K_ALLGATHER, .dt = dt, .send = send, .recv = recv, .n = n_each));
}
static status_t n_iallgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, comm_req_t *req,
                             char *err, size_t errlen)
{
    return run(c, err, errlen,
               OP(.k = COMM_K_ALLGATHER, .dt = dt, .send = send, .recv = recv, .n = n_each, .req = req));
}
static status_t n_broadcast(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int root, char *err, size_t errlen)
{
    return run(c, err, errlen, OP(.k = COMM_K_BCAST, .dt = dt, .send = buf, .recv = buf, .n = n, .peer_or_root = root));
}
/* tags: see the top */
static status_t n_send(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err,
                       size_t errlen)
{
    (void)tag;
    return run(c, err, errlen, OP(.k = COMM_K_SEND, .dt = dt, .send = buf, .n = n, .peer_or_root = peer));
}
static status_t n_recv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err, size_t errlen)
{
    (void)tag;
    return run(c, err, errlen, OP(.k = COMM_K_RECV, .dt = dt, .recv = buf, .n = n, .peer_or_root = peer));
}
static status_t n_isend(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                        char *err, size_t errlen)
{
    (void)tag;
    return run(c, err, errlen, OP(.k = COMM_K_SEND, .dt = dt, .send = buf, .n = n, .peer_or_root = peer, .req = req));
}
static status_t n_irecv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req, char *err,
                        size_t errlen)
{
    (void)tag;
    return run(c, err, errlen, OP(.k = COMM_K_RECV, .dt = dt, .recv = buf, .n = n, .peer_or_root = peer, .req = req));
}

/* comm.h's grouping: ncclGroupStart after ordering the group's stream
 * behind the compute stream's work so far (the transfers' buffers were
 * written there), ncclGroupEnd, then one event per request. */
static status_t n_group_begin(comm_t *c, char *err, size_t errlen)
{
    nccl_comm_t *m = nm(c);
    cudaError_t ce;
    if (m->grouped) {
        status_set(STATUS_FAIL, err, errlen, "NCCL group on group %s: a group is already open", c->name);
        return -1;
    }
    if (m->failed)
        return failed_before(c, err, errlen, "group");
    if (m->after && c->device_flush) /* the graph table's ops first (see post) */
        c->device_flush(c->device_ctx);
    if (m->after && ((ce = cudaEventRecord(m->ready, m->after)) != cudaSuccess ||
                     (ce = cudaStreamWaitEvent(m->stream, m->ready, 0)) != cudaSuccess))
        return cuda_fail(c, err, errlen, ce, "group", 0);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess)
        return nccl_fail(c, err, errlen, rc, "ncclGroupStart", 0);
    m->grouped = 1;
    m->n_gq = 0;
    return 0;
}

/* A failure here marks the group failed: the requests of the group may
 * never complete, and every poll of them then fails (see the top). */
static status_t n_group_end(comm_t *c, char *err, size_t errlen)
{
    nccl_comm_t *m = nm(c);
    if (!m->grouped) {
        status_set(STATUS_FAIL, err, errlen, "NCCL group on group %s: no group is open", c->name);
        return -1;
    }
    m->grouped = 0;
    ncclResult_t rc = ncclGroupEnd();
    int st = 0;
    if (rc != ncclSuccess) {
        st = nccl_fail(c, err, errlen, rc, "ncclGroupEnd", (size_t)m->n_gq);
        m->failed = 1;
    }
    const double t0 = now_s();
    for (int i = 0; i < m->n_gq; i++) {
        nccl_req_t *q = m->gq[i]->impl;
        cudaError_t ce = cudaSuccess;
        q->t0 = t0;
        if (st == 0 && (ce = cudaEventCreateWithFlags(&q->ev, cudaEventDisableTiming)) != cudaSuccess)
            q->ev = NULL;
        if (st == 0 && ce == cudaSuccess && (ce = cudaEventRecord(q->ev, m->stream)) != cudaSuccess) {
            (void)cudaEventDestroy(q->ev);
            q->ev = NULL;
        }
        if (st == 0 && ce != cudaSuccess) {
            st = cuda_fail(c, err, errlen, ce, q->what, q->n);
            m->failed = 1;
        }
    }
    m->n_gq = 0;
    return st;
}

/* NCCL has no barrier: a one-float allreduce on the staging path. */
static status_t n_barrier(comm_t *c, char *err, size_t errlen)
{
    float one = 1.0f;
    return run(c, err, errlen,
               OP(.k = COMM_K_ALLREDUCE, .dt = COMM_FP32, .send = &one, .recv = &one, .n = 1, .op = COMM_SUM));
}

/* ---- all-to-all with varying counts (--ep's dispatch) ------------------------ */

/* Counts and displacements as comm_mpi.c checks them (each fits an int:
 * the interface fails alike on both libraries, though NCCL takes size_t);
 * *sext, *rext: the elements the send and receive layouts span. */
static status_t a2a_layout(comm_t *c, char *err, size_t errlen, const char *what, const size_t *scount,
                           const size_t *sdispl, const size_t *rcount, const size_t *rdispl, size_t *total,
                           size_t *sext, size_t *rext)
{
    *total = *sext = *rext = 0;
    for (int q = 0; q < c->size; q++) {
        if (scount[q] > INT_MAX || sdispl[q] > INT_MAX || rcount[q] > INT_MAX || rdispl[q] > INT_MAX) {
            status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s (%d ranks): a count or displacement exceeds "
                       "INT_MAX", what, c->name, c->size);
            return -1;
        }
        *total += scount[q];
        if (scount[q] && sdispl[q] + scount[q] > *sext)
            *sext = sdispl[q] + scount[q];
        if (rcount[q] && rdispl[q] + rcount[q] > *rext)
            *rext = rdispl[q] + rcount[q];
    }
    return 0;
}

/* One ncclSend and one ncclRecv per peer with a non-zero count (a rank's
 * own piece included: NCCL pairs a send and a receive to self within a
 * group), all inside one ncclGroupStart/End on the group's stream. The
 * group is always ended once started, whatever failed inside it. */
static status_t a2a_post(comm_t *c, char *err, size_t errlen, const char *what, size_t total, const char *s,
                         const size_t *scount, const size_t *sdispl, char *r, const size_t *rcount,
                         const size_t *rdispl, ncclDataType_t dt, size_t es)
{
    nccl_comm_t *m = nm(c);
    ncclResult_t rc = ncclGroupStart();
    if (rc != ncclSuccess)
        return nccl_fail(c, err, errlen, rc, what, total);
    for (int q = 0; q < c->size && rc == ncclSuccess; q++) {
        if (scount[q])
            rc = ncclSend(s + sdispl[q] * es, scount[q], dt, q, m->nc, m->stream);
        if (rc == ncclSuccess && rcount[q])
            rc = ncclRecv(r + rdispl[q] * es, rcount[q], dt, q, m->nc, m->stream);
    }
    const ncclResult_t end = ncclGroupEnd();
    if (rc != ncclSuccess || end != ncclSuccess)
        return nccl_fail(c, err, errlen, rc != ncclSuccess ? rc : end, what, total);
    return 0;
}

/* The interface's alltoallv (comm.h): counts and displacements in
 * elements. Blocking: after the compute stream's work (the ordering event
 * of every operation), waited for on the watchdog as "alltoallv[_type]
 * <group>" like comm_mpi.c's, with the timeout and the peers' errors
 * polled. Host buffers (the dispatch's int32 row counts) are staged: the
 * send layout's span copied into the staging buffer, the received pieces
 * copied back one by one, so what lies between them in the host buffer
 * stays as MPI leaves it; the whole staged operation is on the watchdog. */
static status_t n_alltoallv(comm_t *c, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                            const size_t *rcount, const size_t *rdispl, comm_dtype_t dt, char *err, size_t errlen)
{
    static const ncclDataType_t types[COMM_N_DTYPES] = {ncclFloat, ncclBfloat16, ncclInt32,
                                                        ncclInt64, ncclFloat64,  ncclUint8};
    nccl_comm_t *m = nm(c);
    const char *what = comm_op_name(COMM_K_ALLTOALLV, 0, dt);
    const double span_t0 = c->trace ? trace_now() : 0.0;
    const size_t es = comm_dtype_size(dt);
    size_t total, sext, rext;
    if ((unsigned)dt >= COMM_N_DTYPES || es == 0) {
        status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: unknown element type", what, c->name);
        return -1;
    }
    if (m->failed)
        return failed_before(c, err, errlen, what);
    if (m->grouped) {
        status_set(STATUS_FAIL, err, errlen, "NCCL %s on group %s: inside a group (only isend and irecv)", what,
                   c->name);
        return -1;
    }
    CHECK(a2a_layout(c, err, errlen, what, scount, sdispl, rcount, rdispl, &total, &sext, &rext));
    const long long bytes = (long long)(total * es);
    const int host = (sext && !is_device_ptr(send)) || (rext && !is_device_ptr(recv));
    cudaError_t ce;
    cudaEvent_t ev = NULL;
    const char *s = send;
    char *r = recv;
    int st = 0;
    if (host)
        watchdog_enter(c->watch, what, c->name, c->size, bytes, -1);
    /* after every op issued so far (see post) */
    if (m->after && c->device_flush)
        c->device_flush(c->device_ctx);
    if (m->after && ((ce = cudaEventRecord(m->ready, m->after)) != cudaSuccess ||
                     (ce = cudaStreamWaitEvent(m->stream, m->ready, 0)) != cudaSuccess))
        st = cuda_fail(c, err, errlen, ce, what, total);
    if (st == 0 && host) {
        st = stream_drain(c, err, errlen, what, total);
        if (st == 0)
            st = stage_room(c, err, errlen, (sext + rext) * es, what, total);
        if (st == 0) {
            s = m->stage;
            r = (char *)m->stage + sext * es;
            if (sext && (ce = cudaMemcpyAsync(m->stage, send, sext * es, cudaMemcpyDefault, m->stream)) != cudaSuccess)
                st = cuda_fail(c, err, errlen, ce, what, total);
        }
    }
    const double t0 = now_s();
    if (st == 0)
        st = a2a_post(c, err, errlen, what, total, s, scount, sdispl, r, rcount, rdispl, types[dt], es);
    if (st == 0 && (ce = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming)) != cudaSuccess) {
        ev = NULL;
        st = cuda_fail(c, err, errlen, ce, what, total);
    }
    if (st == 0 && (ce = cudaEventRecord(ev, m->stream)) != cudaSuccess)
        st = cuda_fail(c, err, errlen, ce, what, total);
    if (st == 0)
        st = host ? spin_event(c, err, errlen, ev, what, total, t0)
                  : wait_event(c, err, errlen, ev, what, total, t0, bytes, -1);
    if (ev)
        (void)cudaEventDestroy(ev);
    /* the exchange is done: the copies back wait for nothing else */
    for (int q = 0; st == 0 && host && q < c->size; q++)
        if (rcount[q] && (ce = cudaMemcpyAsync((char *)recv + rdispl[q] * es, r + rdispl[q] * es, rcount[q] * es,
                                               cudaMemcpyDefault, m->stream)) != cudaSuccess)
            st = cuda_fail(c, err, errlen, ce, what, total);
    if (st == 0 && host && rext && (ce = cudaStreamSynchronize(m->stream)) != cudaSuccess)
        st = cuda_fail(c, err, errlen, ce, what, total);
    if (host)
        watchdog_leave(c->watch);
    if (st == 0)
        span_record(c, what, span_t0, bytes, -1);
    return st;
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
    free(m->gq);
    free(m);
}

static const comm_ops_t nccl_ops = {
    .name = "nccl",
    .inorder = 1,
    .group_begin = n_group_begin,
    .group_end = n_group_end,
    .allreduce = n_allreduce,
    .iallreduce = n_iallreduce,
    .reduce_scatter = n_reduce_scatter,
    .ireduce_scatter = n_ireduce_scatter,
    .allgather = n_allgather,
    .iallgather = n_iallgather,
    .broadcast = n_broadcast,
    .send = n_send,
    .recv = n_recv,
    .isend = n_isend,
    .irecv = n_irecv,
    .test = n_test,
    .wait = n_wait,
    .barrier = n_barrier,
    .alltoallv = n_alltoallv,
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
    if (strcmp(name, "world") == 0)
        return &ng->world;
    if (strcmp(name, "tp") == 0)
        return &ng->tp;
    if (strcmp(name, "dp") == 0)
        return &ng->dp;
    if (strcmp(name, "pp") == 0)
        return &ng->pp;
    if (strcmp(name, "embed") == 0)
        return &ng->embed;
    if (strcmp(name, "shard") == 0)
        return &ng->shard;
    if (strcmp(name, "ep") == 0)
        return &ng->ep;
    if (strcmp(name, "edp") == 0)
        return &ng->edp;
    if (strcmp(name, "eshard") == 0)
        return &ng->eshard;
    if (strcmp(name, "cp") == 0)
        return &ng->cp;
    if (strcmp(name, "replica") == 0)
        return &ng->replica;
    return NULL; /* a grid group without a twin here: nccl_grid_create refuses it */
}

int nccl_grid_create(const grid_t *g, nccl_grid_t *ng, void *after_stream, double timeout_s, char *err, size_t errlen)
{
    memset(ng, 0, sizeof *ng);
    unsigned char ids[BOOTSTRAP_MAX_GROUPS * sizeof(ncclUniqueId)];
    comm_t *list[BOOTSTRAP_MAX_GROUPS];
    const char *names[BOOTSTRAP_MAX_GROUPS];
    int n = bootstrap_grid_ids(g, sizeof(ncclUniqueId), make_nccl_id, NULL, ids, list, names, err, errlen);
    /* nobody may enter ncclCommInitRank while a peer will not (the others
     * learn the failing rank's message) */
    if (agree(g->world, n < 0 ? STATUS_FAIL : STATUS_OK, err, errlen) != STATUS_OK)
        return -1;
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
        snprintf(err, errlen, "NCCL setup: ncclCommInitRank%s%s: %s", first_name[0] ? " of group " : "", first_name,
                 ncclGetErrorString(bad));
        failed = 1;
    }
    for (int i = 0; i < n && !failed; i++) {
        comm_t **at = slot(ng, names[i]);
        if (!at) {
            snprintf(err, errlen, "internal error: NCCL setup: no twin slot for the grid's group %s", names[i]);
            failed = 1;
            break;
        }
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
        *at = &m->pub;
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
    if (agree(g->world, failed ? STATUS_FAIL : STATUS_OK, err, errlen) != STATUS_OK) {
        for (int i = 0; i < n; i++)
            if (nc[i])
                (void)ncclCommDestroy(nc[i]);
        nccl_grid_destroy(ng);
        return -1;
    }
    return 0;
}

void nccl_grid_abort(nccl_grid_t *ng)
{
    comm_t *all[] = {ng->cp, ng->eshard, ng->edp, ng->ep, ng->replica, ng->shard, ng->embed, ng->pp, ng->dp, ng->tp, ng->world};
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
    comm_t **all[] = {&ng->cp, &ng->eshard, &ng->edp, &ng->ep, &ng->replica, &ng->shard, &ng->embed, &ng->pp, &ng->dp, &ng->tp, &ng->world};
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
