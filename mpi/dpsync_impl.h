/* What the strategies of mpi/dpsync_*.c share; not for their callers.
 *
 * ddp_*: the replicated all-reduce through mpi/ddp.c (the replicated
 * strategy and ZeRO-1): only a step's last backward communicates, the
 * others accumulate. shard_*: ZeRO's shards through mpi/zero.c (ZeRO-1, 2
 * and 3): units, the optimizer's pieces, the moments to and from the host.
 * zero2_*: the gradient reduce-scatters of ZeRO-2, which ZeRO-3 reuses. */
#ifndef DTRAIN_DPSYNC_IMPL_H
#define DTRAIN_DPSYNC_IMPL_H

#include "mpi/dpsync.h"

extern const dpsync_ops_t dpsync_replicated, dpsync_zero1, dpsync_zero2, dpsync_zero3;

/* STATUS_FAIL with err = "<what>: <the message err held>" (the
 * communicator's). */
status_t dpsync_fail(char *err, size_t errlen, const char *what);
/* The hook's failure (see struct dpsync): the first one is held, with
 * "<what>: <the communicator's message>"; later ones are dropped. msg: the
 * communicator's message. */
void dpsync_hold(dpsync_t *s, const char *what, const char *msg);
/* For strategies that hold no parameters beside the model's buffer. */
status_t dpsync_params_from_host_none(dpsync_t *s, const float *host, char *err, size_t errlen);
status_t dpsync_params_to_host_none(dpsync_t *s, float *host, char *err, size_t errlen);

/* ---- dpsync_replicated.c: the gradient all-reduce (ddp.c) ---- */
status_t ddp_sync_create(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen);
void ddp_sync_backward_begin(dpsync_t *s, int k, int n, size_t top, int *accum, int *last);
void ddp_sync_step_begin(dpsync_t *s);
status_t ddp_sync_finish(dpsync_t *s, char *err, size_t errlen);
float *ddp_sync_tensor_grads(dpsync_t *s, size_t off, size_t numel, size_t *n);
int ddp_sync_norm_piece(const dpsync_t *s, size_t off, size_t numel, const float **x, size_t *n);
void ddp_sync_banner(const dpsync_t *s, FILE *out, const char *mode, const char *dtype);
status_t ddp_sync_watch_final(dpsync_t *s, char *err, size_t errlen);

/* ---- dpsync_shard.c: ZeRO's shards (zero.c) ---- */
/* The units (each block's tensors together, every other tensor alone),
 * the shards of stage `stage` over the shard group (or the DP group), and
 * the optimizer's view of this rank's pieces. */
status_t shard_create(dpsync_t *s, const dpsync_config_t *c, int stage, char *err, size_t errlen);
int shard_is_block(const dpsync_t *s, int u);
/* Where non-block unit u lies in a compact buffer (the tensors outside
 * the blocks: the model's gradients from ZeRO-2, its parameters under
 * ZeRO-3). */
float *shard_outside_at(const dpsync_t *s, float *compact, int u);
status_t shard_state_to_host(dpsync_t *s, const float *state, float *host, char *err, size_t errlen);
void shard_state_from_host(dpsync_t *s, const float *host, float *state);
/* ZeRO-1/2's after_update: every unit gathered into the model's
 * parameters. */
status_t shard_gather_all(dpsync_t *s, char *err, size_t errlen);
/* "ZeRO-N: <what> sharded over ..." */
void shard_banner(const dpsync_t *s, FILE *out, const char *what);

/* ---- dpsync_zero2.c: the gradient windows, ZeRO-3's too ---- */
/* shard_create(stage) and the gradient hooks. */
status_t zero2_create(dpsync_t *s, const dpsync_config_t *c, int stage, char *err, size_t errlen);
/* The hook's work: reduce-scatters every unit complete above ready_from;
 * params: also drives ZeRO-3's parameter gathers. */
void zero2_reduce_ready(dpsync_t *s, size_t ready_from, int params);
void zero2_step_begin(dpsync_t *s);
void zero2_backward_begin(dpsync_t *s, int k, int n, size_t top, int *accum, int *last);
status_t zero2_finish(dpsync_t *s, char *err, size_t errlen);
float *zero2_tensor_grads(dpsync_t *s, size_t off, size_t numel, size_t *n);
int zero2_norm_piece(const dpsync_t *s, size_t off, size_t numel, const float **x, size_t *n);
double zero2_comm_s(const dpsync_t *s);
status_t zero2_watch_final(dpsync_t *s, char *err, size_t errlen);
/* The data-parallel line (dp > 1) and shard_banner's. */
void zero2_banner(const dpsync_t *s, FILE *out, const char *dtype, const char *what);

#endif
