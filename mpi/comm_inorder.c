/* NCCL's point-to-point semantics over MPI (see comm_inorder.h).
 *
 * State: the launches posted and not yet complete, in a FIFO; the head is
 * handed to MPI (its transfers posted) once it reaches the head, and is
 * complete when MPI_Testall says every transfer is. A request names its
 * operation (io_req_t), which the completion of its launch marks done.
 * After a failure (a call MPI refused, a message with the wrong tag or
 * length) the communicator is marked failed: every later call and every
 * test or wait of a request still in flight fails with that first message,
 * as nccl_comm.c does; the job then ends. */
#include "mpi/comm_inorder.h"

#include <limits.h>
#include <stdarg.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/trace.h"
#include "mpi/watchdog.h"

typedef struct io_req {
    int done;
    const char *what; /* "isend", "irecv_i32": spans, watchdog */
    long long bytes;
    int peer;
    double span_t0;
} io_req_t;

typedef struct io_op {
    int send;
    void *buf;
    int bytes;
    int peer, tag; /* tag: checked against the message a receive takes */
    io_req_t *r;
} io_op_t;

typedef struct io_launch {
    io_op_t *op;
    MPI_Request *mr;
    int n, cap, started;
    struct io_launch *next;
} io_launch_t;

typedef struct io_comm {
    comm_t pub;       /* first: a comm_t * is an io_comm_t * */
    comm_t *inner;    /* a duplicate (comm_mpi_create): collectives */
    MPI_Comm mc;      /* its MPI communicator: the transfers */
    io_launch_t *head, *tail, *open; /* queue; the group being built */
    int failed;
    char why[COMM_ERR_MAX]; /* the first failure */
} io_comm_t;

static io_comm_t *io(comm_t *c) { return (io_comm_t *)c; }

/* Marks the communicator failed with the message (the first one stays). */
static status_t io_fail(io_comm_t *m, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static status_t io_fail(io_comm_t *m, char *err, size_t errlen, const char *fmt, ...)
{
    if (!m->failed) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->why, sizeof m->why, fmt, ap);
        va_end(ap);
        m->failed = 1;
    }
    return status_set(STATUS_FAIL, err, errlen, "%s", m->why);
}

static status_t failed_before(io_comm_t *m, char *err, size_t errlen)
{
    return status_set(STATUS_FAIL, err, errlen, "in-order %s on group %s: failed earlier: %.400s", "communicator",
                      m->pub.name, m->why);
}

static void launch_free(io_launch_t *l)
{
    if (!l)
        return;
    free(l->op);
    free(l->mr);
    free(l);
}

static const char *mpi_msg(int rc, char *buf, int len)
{
    int n = 0;
    if (MPI_Error_string(rc, buf, &n) != MPI_SUCCESS)
        snprintf(buf, (size_t)len, "MPI error %d", rc);
    return buf;
}

/* Hands the head launch to MPI. */
static status_t launch_start(io_comm_t *m, io_launch_t *l, char *err, size_t errlen)
{
    if (m->pub.device_sync) /* what a send reads is complete, nothing pending reads what a receive writes */
        m->pub.device_sync(m->pub.device_ctx);
    for (int i = 0; i < l->n; i++) {
        const io_op_t *o = &l->op[i];
        int rc = o->send ? MPI_Issend(o->buf, o->bytes, MPI_BYTE, o->peer, o->tag, m->mc, &l->mr[i])
                         : MPI_Irecv(o->buf, o->bytes, MPI_BYTE, o->peer, MPI_ANY_TAG, m->mc, &l->mr[i]);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            return io_fail(m, err, errlen, "in-order %s on group %s, peer %d: %s", o->r->what, m->pub.name, o->peer,
                           mpi_msg(rc, s, sizeof s));
        }
    }
    l->started = 1;
    return STATUS_OK;
}

/* Advances the queue as far as MPI's transfers allow: completes the head
 * while it can, starting each next launch. */
static status_t advance(io_comm_t *m, char *err, size_t errlen)
{
    while (m->head && !m->failed) {
        io_launch_t *l = m->head;
        if (!l->started)
            CHECK(launch_start(m, l, err, errlen));
        int flag = 0;
        MPI_Status *st = malloc((size_t)(l->n ? l->n : 1) * sizeof *st);
        if (!st)
            return io_fail(m, err, errlen, "in-order communicator %s: out of memory", m->pub.name);
        int rc = MPI_Testall(l->n, l->mr, &flag, st);
        for (int i = 0; rc == MPI_SUCCESS && flag && i < l->n; i++) {
            const io_op_t *o = &l->op[i];
            int got = -1;
            if (o->send)
                continue;
            /* receives take any tag (matching by order, as NCCL's); the
             * sender's tag then says whether it was the expected message */
            if (MPI_Get_count(&st[i], MPI_BYTE, &got) != MPI_SUCCESS || got != o->bytes || st[i].MPI_TAG != o->tag) {
                const int tag = st[i].MPI_TAG;
                free(st);
                return io_fail(m, err, errlen,
                               "in-order %s on group %s: the next message from rank %d has tag %d and %d bytes, the "
                               "receive expects tag %d and %d bytes (NCCL matches by order only: it would deliver "
                               "the wrong message)",
                               o->r->what, m->pub.name, o->peer, tag, got, o->tag, o->bytes);
            }
        }
        free(st);
        if (rc != MPI_SUCCESS) {
            char s[MPI_MAX_ERROR_STRING];
            return io_fail(m, err, errlen, "in-order MPI_Testall on group %s: %s", m->pub.name, mpi_msg(rc, s, sizeof s));
        }
        if (!flag)
            return STATUS_OK;
        for (int i = 0; i < l->n; i++)
            l->op[i].r->done = 1;
        m->head = l->next;
        if (!m->head)
            m->tail = NULL;
        launch_free(l);
    }
    return m->failed ? failed_before(m, err, errlen) : STATUS_OK;
}

/* Waits for every launch posted so far (a collective follows them). */
static status_t drain(io_comm_t *m, const char *what, char *err, size_t errlen)
{
    if (m->failed)
        return failed_before(m, err, errlen);
    if (!m->head)
        return STATUS_OK;
    watchdog_enter(m->pub.watch, what, m->pub.name, m->pub.size, 0, -1);
    status_t rc;
    while ((rc = advance(m, err, errlen)) == STATUS_OK && m->head)
        sched_yield();
    watchdog_leave(m->pub.watch);
    return rc;
}

static void span(comm_t *c, const io_req_t *r)
{
    if (!c->trace)
        return;
    char name[TRACE_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s%s%s", r->what, c->name[0] ? " " : "", c->name);
    trace_span(c->trace, TRACE_COMM, name, r->span_t0, trace_now(),
               &(trace_args_t){.bytes = r->bytes, .microbatch = -1, .layer = -1, .peer = r->peer});
}

static void release(comm_req_t *req)
{
    free(req->impl);
    req->impl = NULL;
    req->active = 0;
}

/* Adds one transfer to the open group, or posts it as a launch of its own. */
static status_t post(comm_t *c, int send, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag,
                     comm_req_t *req, char *err, size_t errlen)
{
    io_comm_t *m = io(c);
    const char *what = comm_op_name(send ? COMM_K_SEND : COMM_K_RECV, 1, dt);
    const size_t es = comm_dtype_size(dt);
    if (req->active)
        return status_set(STATUS_FAIL, err, errlen,
                          "in-order %s on group %s: the request is still in flight (test or wait for it first)", what,
                          c->name);
    memset(req, 0, sizeof *req);
    if (m->failed)
        return failed_before(m, err, errlen);
    if (es == 0 || n > (size_t)INT_MAX / es || peer < 0 || peer >= c->size)
        return status_set(STATUS_FAIL, err, errlen, "in-order %s on group %s: %zu elements to or from rank %d of %d",
                          what, c->name, n, peer, c->size);
    io_launch_t *l = m->open ? m->open : calloc(1, sizeof *l);
    io_req_t *r = malloc(sizeof *r);
    int grown = l && r && l->n < l->cap;
    if (l && r && !grown) {
        const int cap = l->cap ? 2 * l->cap : 4;
        io_op_t *op = realloc(l->op, (size_t)cap * sizeof *op);
        if (op)
            l->op = op;
        MPI_Request *mr = op ? realloc(l->mr, (size_t)cap * sizeof *mr) : NULL;
        if (mr) {
            l->mr = mr;
            l->cap = cap;
            grown = 1;
        }
    }
    if (!grown) {
        free(r);
        if (l != m->open)
            launch_free(l);
        return io_fail(m, err, errlen, "in-order communicator %s: out of memory", c->name);
    }
    *r = (io_req_t){.what = what, .bytes = (long long)(n * es), .peer = peer,
                    .span_t0 = c->trace ? trace_now() : 0.0};
    l->op[l->n++] = (io_op_t){.send = send, .buf = (void *)buf, .bytes = (int)(n * es), .peer = peer, .tag = tag,
                              .r = r};
    *req = (comm_req_t){.comm = c, .impl = r, .active = 1};
    if (m->open)
        return STATUS_OK;
    if (m->tail)
        m->tail->next = l;
    else
        m->head = l;
    m->tail = l;
    return advance(m, err, errlen);
}

static status_t io_test(comm_req_t *req, int *done, char *err, size_t errlen)
{
    *done = 1;
    if (!req->active)
        return STATUS_OK;
    io_comm_t *m = io(req->comm);
    io_req_t *r = req->impl;
    if (m->open && !r->done) {
        *done = 0;
        return status_set(STATUS_FAIL, err, errlen, "in-order %s on group %s: tested inside its open group", r->what,
                          req->comm->name);
    }
    status_t rc = advance(m, err, errlen);
    if (rc != STATUS_OK) {
        release(req);
        return rc;
    }
    *done = r->done;
    if (r->done) {
        span(req->comm, r);
        release(req);
    }
    return STATUS_OK;
}

static status_t io_wait(comm_req_t *req, char *err, size_t errlen)
{
    if (!req->active)
        return STATUS_OK;
    comm_t *c = req->comm;
    io_comm_t *m = io(c);
    io_req_t *r = req->impl;
    if (m->open && !r->done)
        return status_set(STATUS_FAIL, err, errlen, "in-order %s on group %s: waited for inside its open group",
                          r->what, c->name);
    watchdog_enter(c->watch, r->what, c->name, c->size, r->bytes, r->peer);
    status_t rc;
    while ((rc = advance(m, err, errlen)) == STATUS_OK && !r->done)
        sched_yield();
    watchdog_leave(c->watch);
    if (rc == STATUS_OK)
        span(c, r);
    release(req);
    return rc;
}

static status_t io_isend(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                         char *err, size_t errlen)
{
    return post(c, 1, buf, n, dt, peer, tag, req, err, errlen);
}

static status_t io_irecv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, comm_req_t *req,
                         char *err, size_t errlen)
{
    return post(c, 0, buf, n, dt, peer, tag, req, err, errlen);
}

/* blocking: a launch of its own, waited for */
static status_t io_send(comm_t *c, const void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err,
                        size_t errlen)
{
    comm_req_t q = {0};
    if (io(c)->open)
        return status_set(STATUS_FAIL, err, errlen, "in-order send on group %s: inside a group", c->name);
    CHECK(post(c, 1, buf, n, dt, peer, tag, &q, err, errlen));
    return io_wait(&q, err, errlen);
}

static status_t io_recv(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int peer, int tag, char *err, size_t errlen)
{
    comm_req_t q = {0};
    if (io(c)->open)
        return status_set(STATUS_FAIL, err, errlen, "in-order recv on group %s: inside a group", c->name);
    CHECK(post(c, 0, buf, n, dt, peer, tag, &q, err, errlen));
    return io_wait(&q, err, errlen);
}

static status_t io_group_begin(comm_t *c, char *err, size_t errlen)
{
    io_comm_t *m = io(c);
    if (m->open)
        return status_set(STATUS_FAIL, err, errlen, "in-order group on group %s: a group is already open", c->name);
    if (m->failed)
        return failed_before(m, err, errlen);
    if (!(m->open = calloc(1, sizeof *m->open)))
        return io_fail(m, err, errlen, "in-order communicator %s: out of memory", c->name);
    return STATUS_OK;
}

static status_t io_group_end(comm_t *c, char *err, size_t errlen)
{
    io_comm_t *m = io(c);
    io_launch_t *l = m->open;
    if (!l)
        return status_set(STATUS_FAIL, err, errlen, "in-order group on group %s: no group is open", c->name);
    m->open = NULL;
    if (l->n == 0) {
        launch_free(l);
        return m->failed ? failed_before(m, err, errlen) : STATUS_OK;
    }
    if (m->tail)
        m->tail->next = l;
    else
        m->head = l;
    m->tail = l;
    return advance(m, err, errlen);
}

/* Collectives: after the launches before them, on the duplicate, which
 * carries this communicator's trace, watchdog and device_sync. */
static comm_t *after_launches(comm_t *c, const char *what, char *err, size_t errlen)
{
    io_comm_t *m = io(c);
    if (m->open) {
        status_set(STATUS_FAIL, err, errlen, "in-order %s on group %s: inside a group (only isend and irecv)", what,
                   c->name);
        return NULL;
    }
    if (drain(m, what, err, errlen) != STATUS_OK)
        return NULL;
    m->inner->trace = c->trace;
    m->inner->watch = c->watch;
    m->inner->device_sync = c->device_sync;
    m->inner->device_ctx = c->device_ctx;
    return m->inner;
}

/* A nonblocking collective completes before it returns: its request comes
 * back finished (active = 0). */
static status_t finished(status_t rc, comm_req_t *req)
{
    memset(req, 0, sizeof *req);
    return rc;
}

static status_t io_allreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, char *err, size_t errlen)
{
    comm_t *in = after_launches(c, comm_op_name(COMM_K_ALLREDUCE, 0, dt), err, errlen);
    return in ? in->ops->allreduce(in, buf, n, dt, op, err, errlen) : STATUS_FAIL;
}
static status_t io_iallreduce(comm_t *c, void *buf, size_t n, comm_dtype_t dt, comm_op_t op, comm_req_t *req,
                              char *err, size_t errlen)
{
    return finished(io_allreduce(c, buf, n, dt, op, err, errlen), req);
}
static status_t io_reduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                                  size_t errlen)
{
    comm_t *in = after_launches(c, comm_op_name(COMM_K_REDUCE_SCATTER, 0, dt), err, errlen);
    return in ? in->ops->reduce_scatter(in, send, recv, n_each, dt, err, errlen) : STATUS_FAIL;
}
static status_t io_ireduce_scatter(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt,
                                   comm_req_t *req, char *err, size_t errlen)
{
    return finished(io_reduce_scatter(c, send, recv, n_each, dt, err, errlen), req);
}
static status_t io_allgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt, char *err,
                             size_t errlen)
{
    comm_t *in = after_launches(c, comm_op_name(COMM_K_ALLGATHER, 0, dt), err, errlen);
    return in ? in->ops->allgather(in, send, recv, n_each, dt, err, errlen) : STATUS_FAIL;
}
static status_t io_iallgather(comm_t *c, const void *send, void *recv, size_t n_each, comm_dtype_t dt,
                              comm_req_t *req, char *err, size_t errlen)
{
    return finished(io_allgather(c, send, recv, n_each, dt, err, errlen), req);
}
static status_t io_broadcast(comm_t *c, void *buf, size_t n, comm_dtype_t dt, int root, char *err, size_t errlen)
{
    comm_t *in = after_launches(c, comm_op_name(COMM_K_BCAST, 0, dt), err, errlen);
    return in ? in->ops->broadcast(in, buf, n, dt, root, err, errlen) : STATUS_FAIL;
}
static status_t io_barrier(comm_t *c, char *err, size_t errlen)
{
    comm_t *in = after_launches(c, "barrier", err, errlen);
    return in ? in->ops->barrier(in, err, errlen) : STATUS_FAIL;
}
static status_t io_alltoallv(comm_t *c, const void *send, const size_t *scount, const size_t *sdispl, void *recv,
                             const size_t *rcount, const size_t *rdispl, comm_dtype_t dt, char *err, size_t errlen)
{
    comm_t *in = after_launches(c, comm_op_name(COMM_K_ALLTOALLV, 0, dt), err, errlen);
    return in ? in->ops->alltoallv(in, send, scount, sdispl, recv, rcount, rdispl, dt, err, errlen) : STATUS_FAIL;
}

/* Teardown: launches still queued (after a failure) are left to MPI. */
static void io_destroy(comm_t *c)
{
    io_comm_t *m = io(c);
    launch_free(m->open);
    if (!m->head)
        m->inner->ops->destroy(m->inner);
    free(m);
}

#define IO_OPS(flag)                                                                                                   \
    {                                                                                                                  \
        .name = "mpi-inorder", .inorder = flag, .allreduce = io_allreduce, .iallreduce = io_iallreduce,                \
        .reduce_scatter = io_reduce_scatter, .ireduce_scatter = io_ireduce_scatter, .allgather = io_allgather,         \
        .iallgather = io_iallgather, .broadcast = io_broadcast, .send = io_send, .recv = io_recv, .isend = io_isend,   \
        .irecv = io_irecv, .group_begin = io_group_begin, .group_end = io_group_end, .test = io_test,                  \
        .wait = io_wait, .barrier = io_barrier, .alltoallv = io_alltoallv, .destroy = io_destroy,                      \
    }
static const comm_ops_t flagged_ops = IO_OPS(1), unflagged_ops = IO_OPS(0);

comm_t *comm_inorder_create(comm_t *mpi, int flagged, char *err, size_t errlen)
{
    MPI_Comm h = MPI_COMM_NULL;
    if (!mpi || comm_mpi_handle(mpi, &h) != 0) {
        status_set(STATUS_FAIL, err, errlen, "in-order communicator: group %s is not an MPI communicator",
                   mpi ? mpi->name : "?");
        return NULL;
    }
    io_comm_t *m = calloc(1, sizeof *m);
    comm_t *inner = m ? comm_mpi_create(&h) : NULL;
    if (!inner || comm_mpi_handle(inner, &m->mc) != 0) {
        if (inner)
            inner->ops->destroy(inner);
        free(m);
        status_set(STATUS_FAIL, err, errlen, "in-order communicator over group %s: out of memory or MPI_Comm_dup failed",
                   mpi->name);
        return NULL;
    }
    m->inner = inner;
    m->pub.ops = flagged ? &flagged_ops : &unflagged_ops;
    m->pub.rank = inner->rank;
    m->pub.size = inner->size;
    m->pub.impl = m;
    m->pub.device_sync = mpi->device_sync;
    m->pub.device_ctx = mpi->device_ctx;
    snprintf(m->pub.name, sizeof m->pub.name, "%s", mpi->name);
    snprintf(inner->name, sizeof inner->name, "%s", mpi->name);
    return &m->pub;
}

int comm_inorder_env(char *err, size_t errlen)
{
    const char *v = getenv("DTRAIN_COMM_INORDER");
    if (!v || !*v)
        return 0;
    if (strcmp(v, "1") == 0)
        return 1;
    if (strcmp(v, "unflagged") == 0)
        return 2;
    status_set(STATUS_INPUT, err, errlen,
               "DTRAIN_COMM_INORDER=%s: 1 (NCCL's point-to-point semantics over MPI on the pipeline group) or "
               "unflagged (the same, not announced to the pipeline executor); unset for MPI's",
               v);
    return -1;
}
