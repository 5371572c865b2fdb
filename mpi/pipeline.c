/* The executor that runs one stage's schedule (1f1b, gpipe) over the pp
 * communicator; the schedules themselves are in pipeline_sched.c. See
 * pipeline.h for the contract.
 *
 * Messages. Activations go downstream with tag TAG_ACT, gradients upstream
 * with TAG_GRAD; every stage sends and receives each direction in
 * increasing microbatch order, so receives posted in that order match the
 * sends one to one (MPI's non-overtaking rule), however early they are
 * posted. Everything is nonblocking:
 *
 *   activation receive of microbatch m, into input(m % S)   (stage > 0)
 *     posted at the start for m < S, else right after the backward of
 *     m - S frees the slot; waited for just before forward(m).
 *   activation send of forward(m)'s output(m % S)           (stage < P-1)
 *     posted right after forward(m); waited for just before backward(m)
 *     (where it has always completed: the gradient of m came back, so the
 *     next stage received the activation) and before the slot's next
 *     forward (a no-op after that).
 *   gradient receive of backward(m)'s dL/d(output), into grad()  (stage < P-1)
 *     posted at the start for m = 0, else right after backward(m-1) and
 *     the copy of its dL/d(input) out of grad(); waited for just before
 *     backward(m). Forwards in between must not write grad().
 *   gradient send of backward(m)'s dL/d(input)               (stage > 0)
 *     grad() is copied into send buffer m % R of an executor-owned ring
 *     (R = min(S, 2) buffers of n floats) and sent from there; the copy
 *     first waits for that buffer's previous send (microbatch m - R).
 *
 * Deadlock freedom. A wait can block only on a neighbour: a receive until
 * the neighbour posts the matching send, a send until the neighbour posts
 * the matching receive (messages above MPI's eager limit). The stages form
 * a line, so a deadlock needs two neighbours U = s, D = s+1 each blocked
 * on the other. U blocks on D only in the wait for the gradient of some m
 * before backward(U, m) (its other waits on D, the activation sends, are
 * made after that gradient arrived and have completed by then); U has
 * then finished every action before backward(U, m), received every
 * gradient below m, and posted the gradient receive of m. D blocks on U:
 *  - in the activation receive before forward(D, k): D has not run
 *    backward(D, m) (U still waits for it), so forward(D, k) precedes
 *    backward(D, m) in D's order: k <= m + min(P-D-1, M) for 1f1b, where
 *    U's order has every forward k <= m + min(P-U-1, M) before
 *    backward(U, m), a larger bound; for gpipe U ran every forward before
 *    any backward. So U already sent k: contradiction.
 *  - in the send buffer wait of gradient j before sending gradient j + R:
 *    D has sent gradients 0 .. j+R-1, so the gradient U waits for is
 *    m = j + R > j; U finished backward(U, m-1) and so posted the receive
 *    of every gradient up to m, j among them: contradiction.
 *  - in the final waits for its gradient sends: D has then sent every
 *    gradient, so U is not blocked on D.
 * Hence neither order of waits can close a cycle, for any P, M >= 1 and
 * any R >= 1; progress inside a blocked wait completes matched transfers
 * (OpenMPI progresses every request of the process in any wait). The
 * executor also calls test() on its requests between actions, since
 * OpenMPI has no progress thread.
 *
 * Memory: the ring (R*n floats, none on stage 0) and 2*S + R + 1 request
 * handles, allocated per call and freed before return, so no state lives
 * between steps. */
#include "mpi/pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/trace.h"

#define TAG_ACT 0x501  /* activations, stage s -> s+1 */
#define TAG_GRAD 0x502 /* gradients, stage s+1 -> s */

/* ----------------------------------------------------------------- executor */

typedef struct pipe_exec {
    comm_t *pp;
    const pipe_stage_ops_t *ops;
    void *ctx;
    int P, s, M, S, R, first, last;
    comm_req_t *act_recv;  /* [S]: activation receive into input(slot) */
    comm_req_t *act_send;  /* [S]: activation send of output(slot) */
    comm_req_t *grad_send; /* [R]: gradient send of ring[r] */
    comm_req_t grad_recv;  /* the next backward's dL/d(output), into grad() */
    float *ring;           /* [R][n]: dL/d(input) copies being sent upstream */
    double wait_s;
    char *err; /* the caller's error buffer (pipe_run's err, errlen) */
    size_t errlen;
} pipe_exec_t;

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

/* Waits for req if it is in flight, counting the time blocked. */
static status_t wait_timed(pipe_exec_t *ex, comm_req_t *req)
{
    if (!req->active)
        return 0;
    if (ex->ops->mem)
        ex->ops->mem->sync(ex->ops->mem->ctx); /* running kernels are compute, not bubble */
    double t0 = trace_now();
    status_t rc = ex->pp->ops->wait(req, ex->err, ex->errlen);
    ex->wait_s += trace_now() - t0;
    return rc;
}

static status_t post_act_recv(pipe_exec_t *ex, int m)
{
    const int slot = m % ex->S;
    if (ex->pp->ops->irecv(ex->pp, ex->ops->input(ex->ctx, slot), ex->ops->n, COMM_FP32, ex->s - 1, TAG_ACT,
                           &ex->act_recv[slot], ex->err, ex->errlen) != STATUS_OK)
        return fail_at(ex, "activation receive", m);
    return 0;
}

static status_t post_grad_recv(pipe_exec_t *ex, int m)
{
    if (ex->pp->ops->irecv(ex->pp, ex->ops->grad(ex->ctx), ex->ops->n, COMM_FP32, ex->s + 1, TAG_GRAD, &ex->grad_recv,
                           ex->err, ex->errlen) != STATUS_OK)
        return fail_at(ex, "gradient receive", m);
    return 0;
}

/* One test() on every request in flight: OpenMPI advances transfers only
 * inside MPI calls, so between two callbacks the executor lets it. */
static status_t progress(pipe_exec_t *ex, int micro)
{
    comm_t *pp = ex->pp;
    int done;
    for (int i = 0; i < ex->S; i++)
        if ((ex->act_recv[i].active && pp->ops->test(&ex->act_recv[i], &done, ex->err, ex->errlen) != 0) ||
            (ex->act_send[i].active && pp->ops->test(&ex->act_send[i], &done, ex->err, ex->errlen) != 0))
            return fail_at(ex, "progress after", micro);
    for (int i = 0; i < ex->R; i++)
        if (ex->grad_send[i].active && pp->ops->test(&ex->grad_send[i], &done, ex->err, ex->errlen) != 0)
            return fail_at(ex, "progress after", micro);
    if (ex->grad_recv.active && pp->ops->test(&ex->grad_recv, &done, ex->err, ex->errlen) != 0)
        return fail_at(ex, "progress after", micro);
    return 0;
}

static status_t run_forward(pipe_exec_t *ex, const pipe_action_t *a)
{
    const pipe_stage_ops_t *ops = ex->ops;
    if (!ex->first && wait_timed(ex, &ex->act_recv[a->slot]) != 0)
        return fail_at(ex, "activation receive", a->micro);
    /* the slot's previous output must have left (completed already at that
     * microbatch's backward; kept as the rule the buffer depends on) */
    if (!ex->last && wait_timed(ex, &ex->act_send[a->slot]) != 0)
        return fail_at(ex, "activation send", a->micro);
    if (ops->forward(ex->ctx, a->micro, a->slot) != 0)
        return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d: forward of microbatch %d failed",
                          ex->s, ex->P, a->micro);
    if (!ex->last && ex->pp->ops->isend(ex->pp, ops->output(ex->ctx, a->slot), ops->n, COMM_FP32, ex->s + 1, TAG_ACT,
                                        &ex->act_send[a->slot], ex->err, ex->errlen) != 0)
        return fail_at(ex, "activation send", a->micro);
    return 0;
}

/* Backwards run in increasing microbatch order, so the next backward is
 * a->micro + 1 and the slot's next microbatch a->micro + S. */
static status_t run_backward(pipe_exec_t *ex, const pipe_action_t *a)
{
    const pipe_stage_ops_t *ops = ex->ops;
    const size_t n = ops->n;
    if (!ex->last) {
        if (wait_timed(ex, &ex->grad_recv) != 0)
            return fail_at(ex, "gradient receive", a->micro);
        /* done already: the next stage received it before sending this gradient */
        if (wait_timed(ex, &ex->act_send[a->slot]) != 0)
            return fail_at(ex, "activation send", a->micro);
    }
    if (ops->backward(ex->ctx, a->micro, a->slot) != 0)
        return status_set(STATUS_FAIL, ex->err, ex->errlen, "pipeline stage %d/%d: backward of microbatch %d failed",
                          ex->s, ex->P, a->micro);
    if (!ex->first) {
        const int r = a->micro % ex->R;
        float *buf = ex->ring + (size_t)r * n;
        if (wait_timed(ex, &ex->grad_send[r]) != 0)
            return fail_at(ex, "gradient send", a->micro - ex->R);
        if (n && ops->mem)
            ops->mem->to_host(ops->mem->ctx, buf, ops->grad(ex->ctx), n * sizeof *buf);
        else if (n)
            memcpy(buf, ops->grad(ex->ctx), n * sizeof *buf);
        if (ex->pp->ops->isend(ex->pp, buf, n, COMM_FP32, ex->s - 1, TAG_GRAD, &ex->grad_send[r], ex->err,
                               ex->errlen) != 0)
            return fail_at(ex, "gradient send", a->micro);
    }
    /* grad() is free again: receive the next backward's gradient into it */
    if (!ex->last && a->micro + 1 < ex->M && post_grad_recv(ex, a->micro + 1) != 0)
        return STATUS_FAIL;
    /* the slot is free: receive the activation of its next microbatch */
    if (!ex->first && a->micro + ex->S < ex->M)
        CHECK(post_act_recv(ex, a->micro + ex->S));
    return 0;
}

/* Requests still in flight after the schedule. On success only gradient
 * sends can be (waited for here); a receive left over would be a bug. On
 * failure nothing is waited for (a neighbour that failed too would never
 * match it): one test() each, and *left counts those still in flight. */
static status_t drain(pipe_exec_t *ex, int failed, int *left)
{
    /* act_recv[S], act_send[S], grad_send[R] are one block; then grad_recv */
    const int nblock = 2 * ex->S + ex->R;
    status_t rc = STATUS_OK;
    *left = 0;
    for (int i = 0; i <= nblock; i++) {
        comm_req_t *req = i < nblock ? &ex->act_recv[i] : &ex->grad_recv;
        const int is_recv = i < ex->S || i == nblock;
        if (!req->active)
            continue;
        if (!failed && !is_recv) {
            if (wait_timed(ex, req) != 0) {
                rc = fail_at(ex, "final send", -1);
                failed = 1;
            }
            continue;
        }
        if (!failed) {
            rc = status_set(STATUS_FAIL, ex->err, ex->errlen,
                            "pipeline stage %d/%d: a receive is still posted after the schedule", ex->s, ex->P);
            failed = 1;
        }
        int done = 0;
        /* the failure's message is already in err: this test's is not kept */
        if (ex->pp->ops->test(req, &done, NULL, 0) == STATUS_OK && !done)
            (*left)++;
    }
    return rc;
}

status_t pipe_run(comm_t *pp, pipe_kind_t k, int n_micro, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st,
                  char *err, size_t errlen)
{
    if (st)
        st->wait_s = 0.0;
    const int P = pp->size, s = pp->rank;
    const int S = pipe_slots(k, P, s, n_micro);
    if (S < 1 || (k != PIPE_1F1B && k != PIPE_GPIPE) || !ops || !ops->forward || !ops->backward ||
        (s > 0 && !ops->input) || (s < P - 1 && !ops->output) || !ops->grad) {
        return status_set(STATUS_FAIL, err, errlen,
                          "pipeline: bad arguments (kind %d, %d microbatches, stage %d of %d, callbacks %s)", (int)k,
                          n_micro, s, P, ops ? "incomplete" : "missing");
    }
    pipe_exec_t ex = {.pp = pp,
                      .ops = ops,
                      .ctx = ctx,
                      .P = P,
                      .s = s,
                      .M = n_micro,
                      .S = S,
                      .R = S < 2 ? S : 2,
                      .first = s == 0,
                      .last = s == P - 1,
                      .err = err,
                      .errlen = errlen};
    const size_t n = ops->n;
    pipe_action_t *act = malloc((size_t)2 * (size_t)n_micro * sizeof *act);
    /* one block of handles: act_recv[S], act_send[S], grad_send[R] */
    comm_req_t *reqs = calloc((size_t)(2 * S + ex.R), sizeof *reqs);
    ex.ring = ex.first ? NULL : malloc((size_t)ex.R * n * sizeof(float) + 1);
    if (!act || !reqs || (!ex.first && !ex.ring)) {
        free(act);
        free(reqs);
        free(ex.ring);
        return status_set(STATUS_FAIL, err, errlen, "pipeline stage %d/%d: out of memory for %d slots of %zu floats", s,
                          P, S, n);
    }
    ex.act_recv = reqs;
    ex.act_send = reqs + S;
    ex.grad_send = reqs + 2 * S;

    status_t rc = STATUS_OK;
    const int na = pipe_schedule(k, P, s, n_micro, act);
    /* receives that can be posted before any compute: every free slot's
     * activation, and the first backward's gradient */
    for (int m = 0; rc == 0 && !ex.first && m < S; m++)
        rc = post_act_recv(&ex, m);
    if (rc == 0 && !ex.last)
        rc = post_grad_recv(&ex, 0);
    for (int i = 0; rc == 0 && i < na; i++) {
        const pipe_action_t *a = &act[i];
        rc = a->op == PIPE_FWD ? run_forward(&ex, a) : run_backward(&ex, a);
        if (rc == 0 && i + 1 < na)
            rc = progress(&ex, a->micro);
    }
    int left = 0;
    if (drain(&ex, rc != 0, &left) != 0)
        rc = STATUS_FAIL;
    free(act);
    if (left == 0) {
        free(reqs);
        free(ex.ring);
    }
    /* else: after a failure, requests still in flight keep their handles
     * and the ring; the job ends (pipeline.h), so they are left to MPI
     * rather than freed under it */
    if (st)
        st->wait_s = ex.wait_s;
    return rc;
}
