/* The executor that runs one stage's schedule (any kind of
 * pipeline_sched.c) over the pp communicator. See pipeline.h for the
 * contract.
 *
 * Messages. Activations travel with tag TAG_ACT, gradients with TAG_GRAD;
 * the peer of each is the stage holding the neighbouring chunk
 * (pipe_stage_of), so under the interleaved schedule stage P-1 sends to
 * stage 0 and with P = 2 both directions of both tags join the same two
 * ranks. Every link (peer, tag) carries its messages in the order the
 * receiver consumes them (the schedules guarantee it, pipe_simulate checks
 * it), so:
 *
 *   receives  the stage's incoming messages, listed once in the order its
 *             actions consume them (the activation of each forward of a
 *             chunk that is not the model's first, the gradient of each
 *             backward of a chunk that is not its last), are posted in
 *             that order into host buffers, at most WINDOW ahead; the
 *             action waits for the head, copies it into input(slot) or
 *             grad(), and the next receive is posted into the freed
 *             buffer. Posting order per link equals sending order, so each
 *             receive matches its message.
 *   sends     output(slot) after a forward, grad() after a backward, is
 *             copied into a buffer of its own and sent at once; the
 *             buffer returns to the pool when a test() finds the send
 *             complete. A send never waits.
 *   local     a boundary between two chunks of this stage (zbv's turn at
 *             the last stage) is a buffer handed from the producing action
 *             to the consuming one, indexed by microbatch.
 *
 * Deadlock freedom. The only blocking calls are the waits for the head
 * receive (posted, since the window holds the next messages in consumption
 * order) and, at the end, for the stage's own sends. A send is posted when
 * the action producing it ends, without waiting on anything, so the
 * messages flow exactly as in pipe_simulate's ideal machine, which finishes
 * for every schedule it accepts: some stage can always run its next
 * action. OpenMPI has no progress thread, but every wait progresses all of
 * the process's requests, and the executor test()s its requests between
 * actions, so a rendezvous send whose receiver waits completes.
 *
 * Memory: host buffers of n floats, from the backend's host_alloc (pinned
 * on CUDA) where it has one: WINDOW receives plus the sends in flight, kept
 * in a free list and freed before returning.
 *
 * In-order communicators (comm.h's `inorder`: NCCL, or the emulation of
 * mpi/comm_inorder.h). There a posted receive holds back every later
 * launch of the rank until its message arrives, sends complete only when
 * received, and messages match by order alone, so the window above
 * deadlocks: both stages of a P = 2 pipeline post their first receive and
 * then wait on it, each with the send the other needs queued behind it
 * (test/test_pp_inorder.sh shows it). On these the stage instead posts its
 * messages in one global order, pipe_stage_transfers(): the order in which
 * pipe_simulate's ideal machine (every action taking one unit; a whole
 * backward two) sends them, ties broken by the sender. Before action i it
 * posts, from where it stopped, every receive and every send of an action
 * before i, up to the first send of an action not yet run; the transfers
 * go in launches that each end at a receive (ncclGroupStart/End: the sends
 * ahead of a receive and that receive together, Megatron's
 * send_forward_recv_backward where the plan pairs them), receives into
 * buffers of their own, outputs copied into buffers of their own as each
 * action ends (the plan may post them later). The action waits for its own
 * input's launch. Messages live in the backend's memory (ops->alloc, moved
 * with ops->copy on the compute stream, which the communicator's stream
 * follows), where NCCL reads and writes them and no host touches them.
 *
 * Why that cannot deadlock, for every schedule pipe_simulate accepts (all
 * kinds, any P, V, M). Let < be the plan's order of messages, the same at
 * both ends of each (every stage runs the same simulation), and so on
 * each link (p, q) the same sequence at both ends: the k-th send matches
 * the k-th receive whatever their kinds, and every stage posts in <
 * order, so its launches are consecutive runs of its list. In the ideal
 * run an action's input is sent no later than it starts and its output
 * when it ends, one unit or more later: input(a) < output(a), and outputs
 * of one stage follow its action order. Claim: every message m completes.
 * Induction on <, all messages before m completing. The sender reaches the
 * posting of m: its host blocks only in waits for its actions' inputs up
 * to the action producing m, which are messages before m; its launches
 * before m's hold messages before m. The receiver posts m once every
 * message before m in its list is posted: receives need nothing, and each
 * of its sends before m is an output of an action whose inputs precede it,
 * hence precede m, hence completed; its host waits only for launches that
 * end at a receive it needs, and every such launch before m's holds only
 * messages before m. So both launches holding m start (their predecessors
 * on each stream hold messages before m, completed) and m completes. A
 * launch may hold messages after m (the sends ahead of its receive, none
 * after it); they do not delay m, only the launch's end, which the host
 * waits for only where it needs the launch's receive, and that receive is
 * the launch's last message. The MPI path is untouched by this, and the
 * ideal run's costs only choose an order, never whether it is safe: any
 * positive costs would do. */
#include "mpi/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/trace.h"

#define TAG_ACT 0x501  /* activations, chunk c -> c+1 */
#define TAG_GRAD 0x502 /* gradients, chunk c+1 -> c */
#define WINDOW 4       /* receives posted ahead of their action */

/* One message this stage consumes. */
typedef struct pipe_in {
    int grad; /* 0: an activation (before a forward), 1: a gradient (before a backward) */
    int peer; /* sending stage; this stage itself for a local boundary */
    int micro;
} pipe_in_t;

/* A host buffer and the request on it. */
typedef struct pipe_buf {
    float *data;
    comm_req_t req;
} pipe_buf_t;

typedef struct pipe_exec {
    comm_t *pp;
    const pipe_shape_t *sh;
    const pipe_stage_ops_t *ops;
    void *ctx;
    int P, s, C; /* stages, this stage, model chunks */
    pipe_in_t *in;
    int n_in, in_next; /* incoming messages; the next to consume */
    int in_posted;     /* messages [in_next, in_posted) have receives posted */
    pipe_buf_t **recv; /* [WINDOW] ring, message i in recv[i % WINDOW] */
    pipe_buf_t **send; /* sends in flight */
    int n_send, cap_send;
    pipe_buf_t **pool; /* free buffers */
    int n_pool, cap_pool;
    int n_bufs, peak_bufs;
    pipe_buf_t **local_act, **local_grad; /* [M]: zbv's turn, by microbatch */
    /* in-order communicators (see the top): the stage's messages in
     * posting order, the next to post, and by action index the posted
     * receive it consumes and the copied-out message it produced and that
     * is not posted yet */
    int inorder;
    pipe_xfer_t *x;
    int nx, x_next;
    pipe_buf_t **in_at, **out_at; /* [na] each */
    int na, cur; /* actions; the one running */
    double wait_s;
    char *err;
    size_t errlen;
} pipe_exec_t;

static const char *op_name(pipe_op_t op)
{
    return op == PIPE_FWD ? "forward" : op == PIPE_BWD ? "backward" : op == PIPE_BWD_INPUT ? "input backward"
                                                                                             : "weight backward";
}

/* Prefixes the comm layer's message, already in ex->err, with where it
 * happened. */
static status_t fail_at(pipe_exec_t *ex, const char *what, int micro)
{
    char msg[COMM_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", ex->err ? ex->err : "");
    if (micro >= 0)
        return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d, %s of microbatch %d: %.400s", ex->s,
                          ex->P, what, micro, msg);
    return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d, %s: %.400s", ex->s, ex->P, what, msg);
}

static status_t out_of_memory(pipe_exec_t *ex)
{
    return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d: out of memory for a message of %zu floats",
                      ex->s, ex->P, ex->ops->n);
}

/* ---- buffers ---------------------------------------------------------------------- */

static pipe_buf_t *buf_get(pipe_exec_t *ex)
{
    if (ex->n_pool > 0)
        return ex->pool[--ex->n_pool];
    if (ex->n_bufs >= ex->cap_pool) { /* the pool can hold every buffer ever made */
        const int cap = ex->cap_pool ? 2 * ex->cap_pool : 8;
        pipe_buf_t **p = realloc(ex->pool, (size_t)cap * sizeof *p);
        if (!p)
            return NULL;
        ex->pool = p;
        ex->cap_pool = cap;
    }
    pipe_buf_t *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    const size_t bytes = ex->ops->n * sizeof(float) + sizeof(float);
    if (!ex->inorder)
        b->data = ops_host_alloc(ex->ops->mem, bytes);
    else /* the backend's own memory, which NCCL reads and writes */
        b->data = ex->ops->mem ? ex->ops->mem->alloc(ex->ops->mem->ctx, bytes) : malloc(bytes);
    if (!b->data) {
        free(b);
        return NULL;
    }
    if (++ex->n_bufs > ex->peak_bufs)
        ex->peak_bufs = ex->n_bufs;
    return b;
}

static void buf_put(pipe_exec_t *ex, pipe_buf_t *b) { ex->pool[ex->n_pool++] = b; }

static void buf_free(pipe_exec_t *ex, pipe_buf_t *b)
{
    if (!b)
        return;
    if (!ex->inorder)
        ops_host_free(ex->ops->mem, b->data);
    else if (ex->ops->mem)
        ex->ops->mem->free(ex->ops->mem->ctx, b->data);
    else
        free(b->data);
    free(b);
}

/* device (or host) [n] -> message buffer, and back: to and from the host
 * (MPI), or within the backend's memory (in-order: a copy on the compute
 * stream, which the communicator's stream follows, see comm.h) */
static void copy_out(const pipe_exec_t *ex, float *buf, const float *src)
{
    const size_t bytes = ex->ops->n * sizeof(float);
    const ops_t *o = ex->ops->mem;
    if (o && ex->inorder)
        o->copy(o->ctx, buf, src, bytes);
    else if (o)
        o->to_host(o->ctx, buf, src, bytes);
    else
        memcpy(buf, src, bytes);
}

static void copy_in(const pipe_exec_t *ex, float *dst, const float *buf)
{
    const size_t bytes = ex->ops->n * sizeof(float);
    const ops_t *o = ex->ops->mem;
    if (o && ex->inorder)
        o->copy(o->ctx, dst, buf, bytes);
    else if (o)
        o->from_host(o->ctx, dst, buf, bytes);
    else
        memcpy(dst, buf, bytes);
}

/* ---- messages --------------------------------------------------------------------- */

/* The incoming messages of this stage's action list, in consumption order. */
static int list_incoming(pipe_exec_t *ex, const pipe_action_t *act, int na)
{
    ex->in = malloc((size_t)(na > 0 ? na : 1) * sizeof *ex->in);
    if (!ex->in)
        return -1;
    for (int i = 0; i < na; i++) {
        const pipe_action_t *a = &act[i];
        const int c = pipe_chunk_of(ex->sh, ex->s, a->chunk);
        if (a->op == PIPE_FWD && c > 0)
            ex->in[ex->n_in++] = (pipe_in_t){.grad = 0, .peer = pipe_stage_of(ex->sh, c - 1), .micro = a->micro};
        else if ((a->op == PIPE_BWD || a->op == PIPE_BWD_INPUT) && c < ex->C - 1)
            ex->in[ex->n_in++] = (pipe_in_t){.grad = 1, .peer = pipe_stage_of(ex->sh, c + 1), .micro = a->micro};
    }
    return 0;
}

/* Posts receives until WINDOW are outstanding (local messages take a
 * place in the ring but post nothing). */
static status_t post_receives(pipe_exec_t *ex)
{
    while (!ex->inorder && ex->in_posted < ex->n_in && ex->in_posted - ex->in_next < WINDOW) {
        const pipe_in_t *m = &ex->in[ex->in_posted];
        pipe_buf_t *b = NULL;
        if (m->peer != ex->s) {
            if (!(b = buf_get(ex)))
                return out_of_memory(ex);
            if (ex->pp->ops->irecv(ex->pp, b->data, ex->ops->n, COMM_FP32, m->peer, m->grad ? TAG_GRAD : TAG_ACT,
                                   &b->req, ex->err, ex->errlen) != STATUS_OK) {
                buf_put(ex, b);
                return fail_at(ex, m->grad ? "gradient receive" : "activation receive", m->micro);
            }
        }
        ex->recv[ex->in_posted % WINDOW] = b;
        ex->in_posted++;
    }
    return STATUS_OK;
}

/* Waits for the next incoming message and copies it to dst. */
static status_t take_incoming(pipe_exec_t *ex, float *dst)
{
    const pipe_in_t *m = &ex->in[ex->in_next];
    const char *what = m->grad ? "gradient receive" : "activation receive";
    pipe_buf_t *b;
    if (m->peer == ex->s) { /* handed over by this stage's own earlier action */
        pipe_buf_t **slot = m->grad ? &ex->local_grad[m->micro] : &ex->local_act[m->micro];
        b = *slot;
        *slot = NULL;
        if (!b)
            return status_set(STATUS_FAIL, ex->err, ex->errlen,
                              "pipeline stage %d/%d: internal error: local %s of microbatch %d missing", ex->s, ex->P,
                              m->grad ? "gradient" : "activation", m->micro);
    } else {
        b = ex->inorder ? ex->in_at[ex->cur] : ex->recv[ex->in_next % WINDOW];
        if (!b) /* pipe_stage_transfers lists every remote input before its action's output */
            return status_set(STATUS_FAIL, ex->err, ex->errlen,
                              "pipeline stage %d/%d: internal error: the %s of microbatch %d was not posted", ex->s,
                              ex->P, what, m->micro);
        if (ex->ops->mem)
            ex->ops->mem->sync(ex->ops->mem->ctx); /* running kernels are compute, not bubble */
        double t0 = trace_now();
        status_t rc = ex->pp->ops->wait(&b->req, ex->err, ex->errlen);
        ex->wait_s += trace_now() - t0;
        if (rc != STATUS_OK)
            return fail_at(ex, what, m->micro);
        if (ex->inorder)
            ex->in_at[ex->cur] = NULL;
    }
    if (!ex->inorder)
        ex->recv[ex->in_next % WINDOW] = NULL;
    ex->in_next++;
    if (ex->ops->n)
        copy_in(ex, dst, b->data);
    buf_put(ex, b);
    return post_receives(ex);
}

/* isend of b to peer; b joins the sends in flight. */
static status_t post_send(pipe_exec_t *ex, pipe_buf_t *b, int peer, int grad, int micro)
{
    const char *what = grad ? "gradient send" : "activation send";
    if (ex->n_send == ex->cap_send) {
        const int cap = ex->cap_send ? 2 * ex->cap_send : 8;
        pipe_buf_t **p = realloc(ex->send, (size_t)cap * sizeof *p);
        if (!p) {
            buf_put(ex, b);
            return out_of_memory(ex);
        }
        ex->send = p;
        ex->cap_send = cap;
    }
    if (ex->pp->ops->isend(ex->pp, b->data, ex->ops->n, COMM_FP32, peer, grad ? TAG_GRAD : TAG_ACT, &b->req, ex->err,
                           ex->errlen) != STATUS_OK) {
        buf_put(ex, b);
        return fail_at(ex, what, micro);
    }
    ex->send[ex->n_send++] = b;
    return STATUS_OK;
}

/* Copies src out and sends it to the stage holding chunk `to` (or hands it
 * to this stage's consumer). */
static status_t send_outgoing(pipe_exec_t *ex, const float *src, int to, int grad, int micro)
{
    pipe_buf_t *b = buf_get(ex);
    if (!b)
        return out_of_memory(ex);
    if (ex->ops->n)
        copy_out(ex, b->data, src);
    const int peer = pipe_stage_of(ex->sh, to);
    if (peer == ex->s) {
        pipe_buf_t **slot = grad ? &ex->local_grad[micro] : &ex->local_act[micro];
        buf_free(ex, *slot); /* NULL: each microbatch crosses the turn once each way */
        *slot = b;
        return STATUS_OK;
    }
    if (ex->inorder) { /* posted in its place in the plan, before the next action */
        ex->out_at[ex->cur] = b;
        return STATUS_OK;
    }
    return post_send(ex, b, peer, grad, micro);
}

/* In-order communicators: posts the plan's messages from x_next on, up to
 * the first send of an action that has not run (index >= upto), in
 * launches that each end at a receive (see the top); a receive goes into
 * a buffer of its own, found by its consuming action in in_at[]. */
static status_t post_ordered(pipe_exec_t *ex, int upto)
{
    comm_t *pp = ex->pp;
    status_t rc = STATUS_OK;
    while (rc == STATUS_OK && ex->x_next < ex->nx) {
        const pipe_xfer_t *x = &ex->x[ex->x_next];
        if (x->send && x->action >= upto)
            break;
        if (pp->ops->group_begin(pp, ex->err, ex->errlen) != STATUS_OK)
            return fail_at(ex, "group of transfers", x->micro);
        /* the sends ahead of the next receive, then that receive */
        for (; rc == STATUS_OK && ex->x_next < ex->nx; ex->x_next++) {
            x = &ex->x[ex->x_next];
            if (x->send && x->action >= upto)
                break;
            if (x->send) {
                pipe_buf_t *b = ex->out_at[x->action];
                ex->out_at[x->action] = NULL;
                rc = b ? post_send(ex, b, x->peer, x->grad, x->micro)
                       : status_set(STATUS_FAIL, ex->err, ex->errlen,
                                    "pipeline stage %d/%d: internal error: no message from action %d", ex->s, ex->P,
                                    x->action);
                continue;
            }
            pipe_buf_t *b = buf_get(ex);
            if (!b) {
                rc = out_of_memory(ex);
                break;
            }
            if (pp->ops->irecv(pp, b->data, ex->ops->n, COMM_FP32, x->peer, x->grad ? TAG_GRAD : TAG_ACT, &b->req,
                               ex->err, ex->errlen) != STATUS_OK) {
                buf_put(ex, b);
                rc = fail_at(ex, x->grad ? "gradient receive" : "activation receive", x->micro);
                break;
            }
            ex->in_at[x->action] = b;
            ex->x_next++;
            break; /* a receive ends the launch */
        }
        char gerr[COMM_ERR_MAX];
        if (pp->ops->group_end(pp, gerr, sizeof gerr) != STATUS_OK && rc == STATUS_OK) {
            snprintf(ex->err, ex->errlen, "%s", gerr);
            rc = fail_at(ex, "group of transfers", x->micro);
        }
    }
    return rc;
}

/* One test() on every request in flight (OpenMPI advances transfers only
 * inside MPI calls); completed sends give their buffers back. */
static status_t progress(pipe_exec_t *ex, int micro)
{
    comm_t *pp = ex->pp;
    int done, k = 0;
    for (int i = 0; i < ex->n_send; i++) {
        pipe_buf_t *b = ex->send[i];
        if (pp->ops->test(&b->req, &done, ex->err, ex->errlen) != STATUS_OK)
            return fail_at(ex, "progress after", micro);
        if (done)
            buf_put(ex, b);
        else
            ex->send[k++] = b;
    }
    ex->n_send = k;
    for (int i = ex->in_next; i < ex->in_posted; i++) {
        pipe_buf_t *b = ex->recv[i % WINDOW];
        if (b && b->req.active && pp->ops->test(&b->req, &done, ex->err, ex->errlen) != STATUS_OK)
            return fail_at(ex, "progress after", micro);
    }
    return STATUS_OK;
}

/* ---- actions ---------------------------------------------------------------------- */

static status_t run_action(pipe_exec_t *ex, const pipe_action_t *a)
{
    const pipe_stage_ops_t *ops = ex->ops;
    const int c = pipe_chunk_of(ex->sh, ex->s, a->chunk);
    int rc;
    switch (a->op) {
    case PIPE_FWD:
        if (c > 0)
            CHECK(take_incoming(ex, ops->input(ex->ctx, a->slot)));
        rc = ops->forward(ex->ctx, a->chunk, a->micro, a->slot);
        break;
    case PIPE_BWD:
    case PIPE_BWD_INPUT:
        if (c < ex->C - 1)
            CHECK(take_incoming(ex, ops->grad(ex->ctx)));
        rc = (a->op == PIPE_BWD ? ops->backward : ops->backward_input)(ex->ctx, a->chunk, a->micro, a->slot);
        break;
    default:
        rc = ops->backward_weight(ex->ctx, a->chunk, a->micro, a->slot);
        break;
    }
    if (rc != 0) {
        if (ex->sh->virt > 1)
            return status_set(STATUS_FAIL, ex->err, ex->errlen,
                              "pipeline stage %d/%d: %s of chunk %d microbatch %d failed", ex->s, ex->P,
                              op_name(a->op), c, a->micro);
        return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d: %s of microbatch %d failed", ex->s,
                          ex->P, op_name(a->op), a->micro);
    }
    if (a->op == PIPE_FWD && c < ex->C - 1)
        return send_outgoing(ex, ops->output(ex->ctx, a->slot), c + 1, 0, a->micro);
    if ((a->op == PIPE_BWD || a->op == PIPE_BWD_INPUT) && c > 0)
        return send_outgoing(ex, ops->grad(ex->ctx), c - 1, 1, a->micro);
    return STATUS_OK;
}

/* After the schedule: on success every send is waited for (a receive
 * still posted would be a bug). On failure nothing is waited for (a
 * neighbour that failed too would never match it): one test() each, and
 * *left counts the requests still in flight, whose buffers are then left
 * to MPI. */
static status_t drain(pipe_exec_t *ex, int failed, int *left)
{
    status_t rc = STATUS_OK;
    *left = 0;
    if (!failed && ex->inorder && ex->x_next < ex->nx) {
        rc = status_set(STATUS_FAIL, ex->err, ex->errlen,
                        "pipeline stage %d/%d: internal error: %d of %d planned transfers were never posted", ex->s,
                        ex->P, ex->nx - ex->x_next, ex->nx);
        failed = 1;
    }
    if (!failed && ex->in_posted > ex->in_next) {
        rc = status_set(STATUS_FAIL, ex->err, ex->errlen,
                        "pipeline stage %d/%d: a receive is still posted after the schedule", ex->s, ex->P);
        failed = 1;
    }
    for (int i = 0; i < ex->n_send; i++) {
        pipe_buf_t *b = ex->send[i];
        if (!failed) {
            double t0 = trace_now();
            if (ex->pp->ops->wait(&b->req, ex->err, ex->errlen) != STATUS_OK) {
                rc = fail_at(ex, "final send", -1);
                failed = 1;
            }
            ex->wait_s += trace_now() - t0;
        }
        int done = 0;
        if (!b->req.active || (ex->pp->ops->test(&b->req, &done, NULL, 0) == STATUS_OK && done))
            buf_put(ex, b);
        else
            (*left)++, ex->send[i] = NULL;
    }
    for (int i = ex->in_next; i < ex->in_posted; i++) {
        pipe_buf_t *b = ex->recv[i % WINDOW];
        int done = 0;
        if (!b)
            continue;
        if (ex->pp->ops->test(&b->req, &done, NULL, 0) == STATUS_OK && done)
            buf_put(ex, b);
        else
            (*left)++;
    }
    for (int i = 0; ex->inorder && i < ex->na; i++) { /* only after a failure */
        pipe_buf_t *b = ex->in_at[i];
        int done = 0;
        if (b && ex->pp->ops->test(&b->req, &done, NULL, 0) == STATUS_OK && done)
            buf_put(ex, b), ex->in_at[i] = NULL;
        else if (b)
            (*left)++;
        if (ex->out_at[i]) /* copied out, never posted */
            buf_put(ex, ex->out_at[i]), ex->out_at[i] = NULL;
    }
    return rc;
}

static void exec_free(pipe_exec_t *ex, int M)
{
    for (int i = 0; i < ex->n_pool; i++)
        buf_free(ex, ex->pool[i]);
    for (int m = 0; ex->local_act && m < M; m++) {
        buf_free(ex, ex->local_act[m]);
        buf_free(ex, ex->local_grad[m]);
    }
    free(ex->pool);
    free(ex->send);
    free(ex->recv);
    free(ex->in);
    free(ex->local_act);
    free(ex->local_grad);
    free(ex->x);
    free(ex->in_at);
    free(ex->out_at);
}

static int ops_complete(const pipe_shape_t *sh, const pipe_stage_ops_t *ops, int s)
{
    const int split = sh->kind == PIPE_ZBH1 || sh->kind == PIPE_ZBV;
    if (!ops || !ops->forward || !ops->grad || (split ? !ops->backward_input || !ops->backward_weight : !ops->backward))
        return 0;
    /* a stage's chunks other than the model's first read input(), other
     * than its last write output() */
    int needs_in = 0, needs_out = 0;
    for (int v = 0; v < sh->virt; v++) {
        const int c = pipe_chunk_of(sh, s, v);
        needs_in |= c > 0;
        needs_out |= c < sh->stages * sh->virt - 1;
    }
    return (!needs_in || ops->input) && (!needs_out || ops->output);
}

status_t pipe_run(comm_t *pp, const pipe_shape_t *sh, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st,
                  char *err, size_t errlen)
{
    if (st)
        *st = (pipe_stats_t){0};
    const int s = pp->rank;
    char why[256];
    if (!sh || sh->stages != pp->size || pipe_shape_check(sh, why, sizeof why) != 0 || !ops_complete(sh, ops, s))
        return status_set(STATUS_FAIL, err, errlen, "pipeline: bad arguments (%s, stage %d of %d, callbacks %s)",
                          sh && sh->stages == pp->size && pipe_shape_check(sh, NULL, 0) != 0 ? why : "shape", s,
                          pp->size, ops ? "incomplete" : "missing");
    const int na = pipe_stage_actions(sh), M = sh->micro;
    pipe_exec_t ex = {.pp = pp,
                      .sh = sh,
                      .ops = ops,
                      .ctx = ctx,
                      .P = sh->stages,
                      .s = s,
                      .C = sh->stages * sh->virt,
                      .inorder = pp->ops->inorder,
                      .na = na,
                      .err = err,
                      .errlen = errlen};
    pipe_action_t *act = malloc((size_t)na * sizeof *act);
    ex.recv = calloc(WINDOW, sizeof *ex.recv);
    ex.local_act = calloc((size_t)M, sizeof *ex.local_act);
    ex.local_grad = calloc((size_t)M, sizeof *ex.local_grad);
    if (ex.inorder) {
        ex.in_at = calloc((size_t)na, sizeof *ex.in_at);
        ex.out_at = calloc((size_t)na, sizeof *ex.out_at);
    }
    if (!act || !ex.recv || !ex.local_act || !ex.local_grad || (ex.inorder && (!ex.in_at || !ex.out_at)) ||
        pipe_stage_schedule(sh, s, act) != na || list_incoming(&ex, act, na) != 0) {
        free(act);
        exec_free(&ex, M);
        return status_set(STATUS_FAIL, err, errlen, "pipeline stage %d/%d: out of memory for the schedule of %d actions",
                          s, ex.P, na);
    }
    if (ex.inorder && (ex.nx = pipe_stage_transfers(sh, s, &ex.x, why, sizeof why)) < 0) {
        free(act);
        exec_free(&ex, M);
        return status_set(STATUS_FAIL, err, errlen, "pipeline stage %d/%d: %s", s, ex.P, why);
    }
    status_t rc = post_receives(&ex);
    for (int i = 0; rc == STATUS_OK && i < na; i++) {
        ex.cur = i;
        if (ex.inorder)
            rc = post_ordered(&ex, i);
        if (rc == STATUS_OK)
            rc = run_action(&ex, &act[i]);
        if (rc == STATUS_OK && i + 1 < na)
            rc = progress(&ex, act[i].micro);
    }
    if (rc == STATUS_OK && ex.inorder)
        rc = post_ordered(&ex, na); /* the last actions' sends */
    int left = 0;
    if (drain(&ex, rc != STATUS_OK, &left) != STATUS_OK)
        rc = STATUS_FAIL;
    free(act);
    if (st) {
        st->wait_s = ex.wait_s;
        st->peak_buffers = ex.peak_bufs;
    }
    if (left == 0)
        exec_free(&ex, M);
    /* else: after a failure, requests still in flight keep their buffers;
     * the job ends (pipeline.h), so they are left to MPI rather than freed
     * under it */
    return rc;
}
