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
    char msg[COMM_ERR_MAX];
    if (s->active && s->hook_st == STATUS_OK && ddp_grads_ready(&s->ddp, ready_from, msg, sizeof msg) != STATUS_OK)
        dpsync_hold(s, "gradient all-reduce failed", msg);
}

status_t ddp_sync_create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen)
{
    s->hook.grads_ready = ddp_grads_ready_hook;
    s->norm_ep = c->edp ? c->ep : NULL; /* whole expert gradients, other experts on each EP rank */
    if (ddp_create(&s->ddp, c->ops, &c->mem, c->mode, c->dp, c->grads, c->n, c->tensor_start, c->n_tensors,
                   c->bucket_bytes, c->dtype, err, errlen) != STATUS_OK ||
        (c->edp && ddp_set_experts(&s->ddp, c->tensor_expert, c->edp, c->bucket_bytes, err, errlen) != STATUS_OK))
        return dpsync_fail(err, errlen, "cannot set up the data-parallel all-reduce");
    return STATUS_OK;
}

/* The buckets go out from the top of the buffer down as the last
 * backwards pass them; an interleaved stage has one last backward per
 * chunk, top chunk first, so the all-reduce begins once per step. */
void ddp_sync_backward_begin(dpsync_t *s, int k, int n, size_t top, int *accum, int *last)
{
    (void)top;
    *accum = k > 0;
    *last = k == n - 1;
    if (*last) {
        if (!s->reducing)
            ddp_begin(&s->ddp);
        s->reducing = 1;
        s->active = 1;
    }
}

void ddp_sync_step_begin(dpsync_t *s) { s->reducing = 0; }

status_t ddp_sync_finish(dpsync_t *s, char *err, size_t errlen)
{
    if (s->hook_st != STATUS_OK)
        return status_set(s->hook_st, err, errlen, "%s", s->hook_err);
    if (ddp_finish(&s->ddp, err, errlen) != STATUS_OK)
        return dpsync_fail(err, errlen, "gradient all-reduce failed");
    if (s->final) /* what no bucket told: the whole flat buffer, the view's gradients */
        s->final(s->final_ctx, 0, s->n);
    return STATUS_OK;
}

/* The buckets tell themselves final as their all-reduces complete. */
status_t ddp_sync_watch_final(dpsync_t *s, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    ddp_on_done(&s->ddp, s->final, s->final_ctx);
    return STATUS_OK;
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

static status_t create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen)
{
    s->pieces = calloc(1, sizeof *s->pieces);
    if (!s->pieces)
        return status_set(STATUS_FAIL, err, errlen, "out of memory");
    s->pieces[0] = (dpsync_piece_t){.lo = 0, .n = c->n};
    s->view = (dpsync_optim_view_t){
        .params = c->params, .grads = c->grads, .n = c->n, .pieces = s->pieces, .n_pieces = 1, .whole = 1};
    return ddp_sync_create(s, c, err, errlen);
}


static status_t after_update(dpsync_t *s, char *err, size_t errlen)
{
    (void)s; /* the update wrote every parameter in place */
    (void)err;
    (void)errlen;
    return STATUS_OK;
}

static status_t state_to_host(dpsync_t *s, const float *state, float *host, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    s->mem->to_host(s->mem->ctx, host, state, s->n * sizeof(float));
    return STATUS_OK;
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
    .step_begin = ddp_sync_step_begin,
    .backward_begin = ddp_sync_backward_begin,
    .grads_finish = ddp_sync_finish,
    .tensor_grads = ddp_sync_tensor_grads,
    .norm_piece = ddp_sync_norm_piece,
    .after_update = after_update,
    .params_from_host = dpsync_params_from_host_none,
    .params_to_host = dpsync_params_to_host_none,
    .state_to_host = state_to_host,
    .state_from_host = state_from_host,
    .watch_final = ddp_sync_watch_final,
    .comm_s = comm_s,
    .banner = ddp_sync_banner,
};
