/* ZeRO-1: the gradients are averaged as in the replicated strategy (ddp.c's
 * all-reduce, overlapping the last backward), but each rank keeps AdamW
 * moments only for its pieces of every unit and updates only those
 * pieces of the parameters; then every unit is all-gathered. The update
 * is elementwise, so a step is bit-identical to the replicated one. */
#include "mpi/dpsync_impl.h"

static status_t create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen)
{
    /* the all-reduce over the whole DP group; the shards over the shard
     * group (the DP group without --hybrid-shard) */
    CHECK(shard_create(s, c, 1, err, errlen));
    return ddp_sync_create(s, c, err, errlen);
}


static double comm_s(const dpsync_t *s) { return s->ddp.comm_wait_s + s->update_s; }

static void banner(const dpsync_t *s, FILE *out, const char *mode, const char *dtype)
{
    ddp_sync_banner(s, out, mode, dtype);
    shard_banner(s, out, "AdamW moments");
}

const dpsync_ops_t dpsync_zero1 = {
    .name = "zero1",
    .zero = 1,
    .shards = 1,
    .create = create,
    .step_begin = ddp_sync_step_begin,
    .backward_begin = ddp_sync_backward_begin,
    .grads_finish = ddp_sync_finish,
    .tensor_grads = ddp_sync_tensor_grads,
    .norm_piece = ddp_sync_norm_piece,
    .after_update = shard_gather_all,
    .params_from_host = dpsync_params_from_host_none,
    .params_to_host = dpsync_params_to_host_none,
    .state_to_host = shard_state_to_host,
    .state_from_host = shard_state_from_host,
    .watch_final = ddp_sync_watch_final,
    .comm_s = comm_s,
    .banner = banner,
};
