/* The replicated strategy: every DP rank holds all parameters, gradients
 * and AdamW moments; the gradients are averaged by mpi/ddp.c's all-reduce
 * (naive, flat, or bucketed and overlapping the backward). Only the step's
 * last backward communicates: the earlier ones add their microbatch's
 * gradients in place. The ddp_sync_* functions are ZeRO-1's gradient path
 * too (dpsync_zero1.c). */
#include <stdlib.h>

#include "mpi/dpsync_impl.h"

static void ddp_grads_ready_hook(void *ctx, size_t ready_from)
{
    dpsync_t *s = ctx;
    if (s->active && !s->failed && ddp_grads_ready(&s->ddp, ready_from) != 0) {
        s->failed = 1;
        dpsync_fail(s, "gradient all-reduce failed", s->dp);
    }
}

int ddp_sync_create(dpsync_t *s, const dpsync_config_t *c)
{
    s->hook.grads_ready = ddp_grads_ready_hook;
    if (ddp_create(&s->ddp, c->ops, &c->mem, c->mode, c->dp, c->grads, c->n, c->tensor_start, c->n_tensors,
                   c->bucket_bytes, c->dtype) != 0)
        return dpsync_fail(s, "cannot set up the data-parallel all-reduce", c->dp);
    return 0;
}

void ddp_sync_backward_begin(dpsync_t *s, int k, int n, int *accum, int *last)
{
    *accum = k > 0;
    *last = k == n - 1;
    if (*last) {
        ddp_begin(&s->ddp);
        s->active = 1;
    }
}

int ddp_sync_finish(dpsync_t *s)
{
    if (s->failed || ddp_finish(&s->ddp) != 0)
        return dpsync_fail(s, "gradient all-reduce failed", s->dp);
    return 0;
}

float *ddp_sync_tensor_grads(dpsync_t *s, size_t off, size_t numel, size_t *n)
{
    *n = numel;
    return s->grads + off;
}

int ddp_sync_norm_piece(const dpsync_t *s, size_t off, size_t numel, const float **x, size_t *n)
{
    *x = s->grads + off;
    *n = numel;
    return 1;
}

void ddp_sync_banner(const dpsync_t *s, FILE *out, const char *mode, const char *dtype)
{
    if (s->dp->size > 1)
        fprintf(out, "data parallel: %s all-reduce of %zu gradients over %d ranks, %d bucket%s, reduced in %s\n", mode,
                s->n, s->dp->size, s->ddp.n_buckets, s->ddp.n_buckets == 1 ? "" : "s", dtype);
}

static int create(dpsync_t *s, const dpsync_config_t *c)
{
    s->pieces = calloc(1, sizeof *s->pieces);
    if (!s->pieces) {
        snprintf(s->err, sizeof s->err, "out of memory");
        return -1;
    }
    s->pieces[0] = (dpsync_piece_t){.lo = 0, .n = c->n};
    s->view = (dpsync_optim_view_t){
        .params = c->params, .grads = c->grads, .n = c->n, .pieces = s->pieces, .n_pieces = 1, .whole = 1};
    return ddp_sync_create(s, c);
}

static void step_begin(dpsync_t *s) { (void)s; }

static int after_update(dpsync_t *s)
{
    (void)s; /* the update wrote every parameter in place */
    return 0;
}

static int state_to_host(dpsync_t *s, const float *state, float *host)
{
    s->mem->to_host(s->mem->ctx, host, state, s->n * sizeof(float));
    return 0;
}

static void state_from_host(dpsync_t *s, const float *host, float *state)
{
    s->mem->from_host(s->mem->ctx, state, host, s->n * sizeof(float));
}

static double comm_s(const dpsync_t *s) { return s->ddp.comm_wait_s; }

const dpsync_ops_t dpsync_replicated = {
    .name = "replicated",
    .zero = 0,
    .create = create,
    .step_begin = step_begin,
    .backward_begin = ddp_sync_backward_begin,
    .grads_finish = ddp_sync_finish,
    .tensor_grads = ddp_sync_tensor_grads,
    .norm_piece = ddp_sync_norm_piece,
    .after_update = after_update,
    .params_from_host = dpsync_params_from_host_none,
    .params_to_host = dpsync_params_to_host_none,
    .state_to_host = state_to_host,
    .state_from_host = state_from_host,
    .comm_s = comm_s,
    .banner = ddp_sync_banner,
};
