#include "pipeline.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Message tags: activations go downstream, gradients upstream, so the two
 * directions between a pair of stages never match each other's receives. */
#define TAG_ACT 0x501
#define TAG_GRAD 0x502

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int pipe_kind_parse(const char *s, pipe_kind_t *k)
{
    if (strcmp(s, "1f1b") == 0)
        *k = PIPE_1F1B;
    else if (strcmp(s, "gpipe") == 0)
        *k = PIPE_GPIPE;
    else
        return -1;
    return 0;
}

int pipe_slots(pipe_kind_t k, int n_stages, int stage, int n_micro)
{
    if (k == PIPE_GPIPE)
        return n_micro;
    int s = n_stages - stage;
    return s < n_micro ? s : n_micro;
}

int pipe_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out)
{
    const int slots = pipe_slots(k, n_stages, stage, n_micro);
    int n = 0, fwd = 0, bwd = 0;
#define FWD() (out[n++] = (pipe_action_t){PIPE_FWD, fwd, fwd % slots}, fwd++)
#define BWD() (out[n++] = (pipe_action_t){PIPE_BWD, bwd, bwd % slots}, bwd++)
    if (k == PIPE_GPIPE) {
        while (fwd < n_micro)
            FWD();
        while (bwd < n_micro)
            BWD();
        return n;
    }
    int warm = n_stages - stage - 1;
    if (warm > n_micro)
        warm = n_micro;
    while (fwd < warm)
        FWD();
    while (fwd < n_micro) {
        FWD();
        BWD();
    }
    while (bwd < n_micro)
        BWD();
#undef FWD
#undef BWD
    return n;
}

/* Waits for req if it is in flight, adding the time to *wait_s. */
static int wait_timed(comm_req_t *req, double *wait_s)
{
    if (!req->active)
        return 0;
    double t0 = now_s();
    int rc = req->comm->ops->wait(req);
    *wait_s += now_s() - t0;
    return rc;
}

int pipe_run(comm_t *pp, pipe_kind_t k, int n_micro, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st)
{
    const int P = pp->size, s = pp->rank, first = s == 0, last = s == P - 1;
    const int slots = pipe_slots(k, P, s, n_micro);
    const size_t n = ops->n;
    pipe_action_t *act = malloc((size_t)2 * (size_t)n_micro * sizeof *act);
    /* act_sent[i]: the isend of slot i's output, which the slot's next
     * forward must not overwrite before it completes; grad_sent[i] and
     * gbuf[i]: a ring of upstream gradient sends, since the next backward
     * overwrites grad() */
    comm_req_t *act_sent = calloc((size_t)slots, sizeof *act_sent);
    comm_req_t *grad_sent = calloc((size_t)slots, sizeof *grad_sent);
    float *gbuf = first ? NULL : malloc((size_t)slots * n * sizeof *gbuf + 1);
    comm_req_t recv = {0};
    double wait_s = 0.0;
    int rc = 0, nb = 0;
    if (!act || !act_sent || !grad_sent || (!first && !gbuf)) {
        snprintf(pp->err, sizeof pp->err, "pipeline: out of memory for %d slots of %zu floats", slots, n);
        rc = -1;
    }
    const int na = rc ? 0 : pipe_schedule(k, P, s, n_micro, act);
    for (int i = 0; rc == 0 && i < na; i++) {
        const pipe_action_t *a = &act[i];
        if (a->op == PIPE_FWD) {
            if (!first) {
                rc = pp->ops->irecv(pp, ops->input(ctx, a->slot), n, s - 1, TAG_ACT, &recv);
                rc = rc ? rc : wait_timed(&recv, &wait_s);
            }
            if (rc == 0 && !last)
                rc = wait_timed(&act_sent[a->slot], &wait_s);
            if (rc == 0)
                rc = ops->forward(ctx, a->micro, a->slot);
            if (rc == 0 && !last)
                rc = pp->ops->isend(pp, ops->output(ctx, a->slot), n, s + 1, TAG_ACT, &act_sent[a->slot]);
        } else {
            if (!last) {
                rc = pp->ops->irecv(pp, ops->grad(ctx), n, s + 1, TAG_GRAD, &recv);
                rc = rc ? rc : wait_timed(&recv, &wait_s);
            }
            if (rc == 0)
                rc = ops->backward(ctx, a->micro, a->slot);
            if (rc == 0 && !first) {
                const int r = nb % slots;
                float *b = gbuf + (size_t)r * n;
                rc = wait_timed(&grad_sent[r], &wait_s);
                if (rc == 0) {
                    memcpy(b, ops->grad(ctx), n * sizeof *b);
                    rc = pp->ops->isend(pp, b, n, s - 1, TAG_GRAD, &grad_sent[r]);
                }
            }
            nb++;
        }
    }
    /* every send completes before the buffers go (also after a failure:
     * the peers' receives were posted in the same order) */
    for (int i = 0; i < slots && act_sent && grad_sent; i++) {
        int w = wait_timed(&act_sent[i], &wait_s);
        w |= wait_timed(&grad_sent[i], &wait_s);
        if (rc == 0)
            rc = w;
    }
    if (recv.active && wait_timed(&recv, &wait_s) != 0 && rc == 0)
        rc = -1;
    free(act);
    free(act_sent);
    free(grad_sent);
    free(gbuf);
    if (st)
        st->wait_s = wait_s;
    return rc ? -1 : 0;
}
