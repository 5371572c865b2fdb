/* ZeRO-2: gradients sharded too. The model keeps gradients only for the
 * tensors outside the blocks (a compact buffer); each block's backward
 * writes into one of two lent windows, reduce-scattered (nonblocking) as
 * soon as the block is done, and the other units are reduce-scattered
 * from the compact buffer as the backward passes them. Every microbatch
 * is reduced so (accum 0, last 1 each time): the shard accumulates.
 * Under a split backward (keep_block_grads) the model keeps a whole
 * gradient buffer that accumulates over the step instead, and the units
 * are reduce-scattered from it during each chunk's last backward. The
 * zero2_* functions are ZeRO-3's gradient path too (dpsync_zero3.c). */
#include "mpi/dpsync_impl.h"

void zero2_reduce_ready(dpsync_t *s, size_t ready_from, int params)
{
    zero_t *z = &s->zero;
    char msg[COMM_ERR_MAX];
    if (!s->active || s->hook_st != STATUS_OK)
        return;
    /* MPI progresses nonblocking collectives only when they are tested */
    if (zero_grads_progress(z, msg, sizeof msg) != STATUS_OK ||
        (params && zero_params_progress(z, msg, sizeof msg) != STATUS_OK))
        dpsync_hold(s, "gradient reduce-scatter failed", msg);
    /* units finish from the top down: reduce every one now complete */
    while (s->hook_st == STATUS_OK && s->next >= 0 && z->unit_start[s->next] >= ready_from) {
        const int u = s->next--;
        status_t rc;
        if (s->final_bwd)
            zero_grads_last(z, u);
        if (s->accumulate) /* the model's whole buffer */
            rc = zero_grads_reduce(z, u, s->grads + z->unit_start[u], msg, sizeof msg);
        else if (shard_is_block(s, u))
            rc = zero_grads_reduce_window(z, u, msg, sizeof msg);
        else
            rc = zero_grads_reduce(z, u, shard_outside_at(s, s->grads, u), msg, sizeof msg);
        if (rc != STATUS_OK)
            dpsync_hold(s, "gradient reduce-scatter failed", msg);
    }
}

static void grads_ready_hook(void *ctx, size_t ready_from) { zero2_reduce_ready(ctx, ready_from, 0); }

/* The window block i's backward writes its gradients into. */
static float *block_grads_hook(void *ctx, int block)
{
    dpsync_t *s = ctx;
    char msg[COMM_ERR_MAX];
    float *w = zero_grads_window(&s->zero, s->unit0 + block, msg, sizeof msg);
    if (!w)
        dpsync_hold(s, "gradient reduce-scatter failed", msg);
    return w;
}

status_t zero2_create(dpsync_t *s, const dpsync_config_t *c, int stage, char *err, size_t errlen)
{
    CHECK(shard_create(s, c, stage, err, errlen));
    s->accumulate = c->keep_block_grads;
    s->hook.grads_ready = grads_ready_hook;
    s->hook.block_grads = s->accumulate ? NULL : block_grads_hook;
    /* each rank's sum of squares covers its pieces: summed over the group */
    s->norm_group = s->zero.group->size > 1 ? s->zero.group : NULL;
    return STATUS_OK;
}

static status_t create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen)
{
    return zero2_create(s, c, 2, err, errlen);
}

void zero2_step_begin(dpsync_t *s) { zero_grads_begin(&s->zero); }

void zero2_backward_begin(dpsync_t *s, int k, int n, size_t top, int *accum, int *last)
{
    /* lent windows: every backward is reduced; kept gradients: they add up
     * over the step and its last backward reduces them */
    *accum = s->accumulate ? k > 0 : 0;
    *last = s->accumulate ? k == n - 1 : 1;
    /* the units below top: an interleaved chunk's backward leaves the
     * chunks above it alone */
    int u = s->zero.n_units - 1;
    while (u >= 0 && s->zero.unit_start[u] >= top)
        u--;
    s->next = u;
    s->active = *last;
    s->final_bwd = k == n - 1;
}

status_t zero2_finish(dpsync_t *s, char *err, size_t errlen)
{
    zero_t *z = &s->zero;
    if (s->hook_st != STATUS_OK)
        return status_set(s->hook_st, err, errlen, "%s", s->hook_err);
    if (zero_grads_finish(z, 1.0f / (float)s->dp->size, err, errlen) != STATUS_OK)
        return dpsync_fail(err, errlen, "gradient reduce-scatter failed");
    /* HSDP: each shard group reduced its own ranks' gradients; the groups'
     * pieces of the same elements are summed across them */
    if (zero_grads_replicas(z, err, errlen) != STATUS_OK)
        return dpsync_fail(err, errlen, "gradient all-reduce across shard groups failed");
    if (s->final) /* what no unit told (HSDP: all of it, now summed across the replicas) */
        s->final(s->final_ctx, 0, z->shard_n);
    return STATUS_OK;
}

/* Each unit tells itself final once its last reduce-scatter of the step
 * is banked, scaled there to the average; under HSDP the sum across the
 * shard groups comes after the backward, so grads_finish tells it all. */
status_t zero2_watch_final(dpsync_t *s, char *err, size_t errlen)
{
    zero_t *z = &s->zero;
    if (z->replica && z->stage >= 2)
        return STATUS_OK;
    return zero_grads_early(z, 1.0f / (float)s->dp->size, s->final, s->final_ctx, err, errlen);
}

/* wte and its tied copy are one-tensor units of the same length, so this
 * rank's pieces of both cover the same elements */
float *zero2_tensor_grads(dpsync_t *s, size_t off, size_t numel, size_t *n)
{
    const zero_t *z = &s->zero;
    const int p = zero_part_of(z, off);
    (void)numel;
    *n = z->chunk[p];
    return z->grad_shard + z->shard_start[p];
}

/* This rank's piece of the tensor; the norm group's sum adds the others
 * (an expert tensor's pieces are spread over its expert-DP group, and the
 * EP ranks hold other experts: the DP group covers both once). */
int zero2_norm_piece(const dpsync_t *s, size_t off, size_t numel, const float **x, size_t *n)
{
    const zero_t *z = &s->zero;
    const int p = zero_part_of(z, off);
    size_t lo, hi, skip;
    zero_piece(z, p, &lo, &hi, &skip);
    const size_t a = off > lo ? off : lo, e = off + numel, b = e < hi ? e : hi;
    if (a >= b)
        return 0;
    *x = z->grad_shard + z->shard_start[p] + skip + (a - lo);
    *n = b - a;
    return 1;
}

double zero2_comm_s(const dpsync_t *s) { return s->zero.wait_s + s->zero.gather_s + s->update_s; }

void zero2_banner(const dpsync_t *s, FILE *out, const char *dtype, const char *what)
{
    if (s->dp->size > 1)
        fprintf(out,
                "data parallel: reduce-scatter of each block's gradients as its backward ends (every "
                "microbatch), the other tensors' after backward, over %d ranks, reduced in %s\n",
                s->zero.group->size, dtype);
    shard_banner(s, out, what);
}

static void banner(const dpsync_t *s, FILE *out, const char *mode, const char *dtype)
{
    (void)mode;
    zero2_banner(s, out, dtype, "AdamW moments and gradients");
}

const dpsync_ops_t dpsync_zero2 = {
    .name = "zero2",
    .zero = 2,
    .lends_block_grads = 1,
    .shards = 1,
    .create = create,
    .step_begin = zero2_step_begin,
    .backward_begin = zero2_backward_begin,
    .grads_finish = zero2_finish,
    .tensor_grads = zero2_tensor_grads,
    .norm_piece = zero2_norm_piece,
    .after_update = shard_gather_all,
    .params_from_host = dpsync_params_from_host_none,
    .params_to_host = dpsync_params_to_host_none,
    .state_to_host = shard_state_to_host,
    .state_from_host = shard_state_from_host,
    .watch_final = zero2_watch_final,
    .comm_s = zero2_comm_s,
    .banner = banner,
};
