/* ZeRO-3: block parameters sharded too. The rank keeps its pieces of every
 * unit (the parameter shard, which AdamW updates); the model keeps only
 * the tensors outside the blocks, whole, gathered from the pieces after
 * each update, and asks for each block's parameters before it runs: the
 * strategy lends one of two windows and starts gathering the block that
 * runs next into the other (zero.h). Gradients go as in ZeRO-2. Every
 * forward gathers over the shard group, so it is collective. */
#include "mpi/clock.h"
#include "mpi/dpsync_impl.h"

/* Block i's gathered parameters; starts gathering block `next`. */
static float *block_params_hook(void *ctx, int block, int next)
{
    dpsync_t *s = ctx;
    char msg[COMM_ERR_MAX];
    float *w = zero_params_window(&s->zero, s->unit0 + block, next >= 0 ? s->unit0 + next : -1, msg, sizeof msg);
    if (!w)
        dpsync_hold(s, "ZeRO parameter all-gather failed", msg);
    return w;
}

/* ZeRO-2's, driving the parameter gathers in flight too */
static void grads_ready_hook(void *ctx, size_t ready_from) { zero2_reduce_ready(ctx, ready_from, 1); }

static status_t create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen)
{
    CHECK(zero2_create(s, c, 3, err, errlen));
    s->hook.grads_ready = grads_ready_hook;
    s->hook.block_params = block_params_hook;
    return STATUS_OK;
}

/* The blocks stay as pieces until a window gathers them; the tensors
 * outside the blocks are gathered whole into the model's compact buffer. */
static status_t after_update(dpsync_t *s, char *err, size_t errlen)
{
    zero_t *z = &s->zero;
    const double t0 = now_s();
    status_t rc = zero_params_invalidate(z, err, errlen);
    for (int u = 0; u < z->n_units && rc == STATUS_OK; u++)
        if (!shard_is_block(s, u))
            rc = zero_params_gather_unit(z, u, shard_outside_at(s, s->params, u), err, errlen);
    s->update_s = now_s() - t0;
    return rc == STATUS_OK ? STATUS_OK : dpsync_fail(err, errlen, "ZeRO parameter all-gather failed");
}

/* The blocks' parameters are this rank's pieces of the host copy. */
static status_t params_from_host(dpsync_t *s, const float *host, char *err, size_t errlen)
{
    zero_shard_from_host(&s->zero, host, s->zero.param_shard);
    return zero_params_invalidate(&s->zero, err, errlen);
}

/* ... and are gathered from the pieces into it: collective over the shard
 * group. */
static status_t params_to_host(dpsync_t *s, float *host, char *err, size_t errlen)
{
    zero_shard_to_host(&s->zero, s->zero.param_shard, host);
    return zero_allgather_host(&s->zero, host, err, errlen);
}

static void banner(const dpsync_t *s, FILE *out, const char *mode, const char *dtype)
{
    (void)mode;
    zero2_banner(s, out, dtype, "AdamW moments, gradients and block parameters");
}

const dpsync_ops_t dpsync_zero3 = {
    .name = "zero3",
    .zero = 3,
    .lends_block_grads = 1,
    .lends_block_params = 1,
    .shards = 1,
    .collective_forward = 1,
    .create = create,
    .step_begin = zero2_step_begin,
    .backward_begin = zero2_backward_begin,
    .grads_finish = zero2_finish,
    .tensor_grads = zero2_tensor_grads,
    .norm_piece = zero2_norm_piece,
    .after_update = after_update,
    .params_from_host = params_from_host,
    .params_to_host = params_to_host,
    .state_to_host = shard_state_to_host,
    .state_from_host = shard_state_from_host,
    .watch_final = zero2_watch_final,
    .comm_s = zero2_comm_s,
    .banner = banner,
};
