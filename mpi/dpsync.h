/* Data-parallel synchronisation: how the replicas of one model stage keep
 * their training state in step, behind one table of methods (as
 * pipeline.h's pipe_stage_ops_t and IOR's aiori.h), one file per strategy:
 *
 *   dpsync_replicated.c  every rank holds everything; the gradients are
 *                        averaged by mpi/ddp.c (naive, flat or bucketed
 *                        all-reduce, overlapping the last backward)
 *   dpsync_zero1.c       ZeRO-1: ddp.c's all-reduce, AdamW moments sharded
 *                        (mpi/zero.c), the parameters gathered after the
 *                        update
 *   dpsync_zero2.c       ZeRO-2: gradients sharded too, each block's
 *                        reduce-scattered from a lent window as its
 *                        backward ends, every microbatch
 *   dpsync_zero3.c       ZeRO-3: block parameters sharded too, gathered
 *                        into lent windows just before they are used
 * Hybrid sharding (--hybrid-shard) composes with the ZeRO strategies: they
 * shard over the shard group and, from stage 2, sum the shards over the
 * replica group (zero.h). Knows nothing of models: the caller describes
 * the flat parameter buffer (tensor offsets, which tensors belong to which
 * block of the stage, which count in the gradient norm) and owns the
 * model's buffers; the strategy owns its communication and shards.
 *
 * A step, as the trainer drives it:
 *   step_begin; for each microbatch backward: backward_begin (it says
 *   whether the backward accumulates and is the last; the model calls the
 *   hook during it), dpsync_backward_end; grads_finish (the gradients are
 *   the DP average where the optimizer view says); tensor_grads (the tied
 *   embedding's sum across stages); dpsync_grad_sumsq and norm_group (the
 *   global norm); the optimizer updates its view; after_update.
 *
 * Memory: the model's buffers and every buffer of the strategies are the
 * backend's (ops.h), moved only through its table; "host" marks host
 * memory (checkpoint copies). Errors: a status_t with one line in the
 * caller's err[errlen] (mpi/status.h); the hook's failures are held (see
 * struct dpsync) and reported by dpsync_backward_end. */
#ifndef DTRAIN_DPSYNC_H
#define DTRAIN_DPSYNC_H

#include <stddef.h>
#include <stdio.h>

#include "base/mem.h"
#include "base/ops.h"
#include "mpi/comm.h"
#include "mpi/ddp.h"
#include "mpi/zero.h"

/* What the model calls during its forward and backward (model.h's one
 * hook). A function is NULL where the strategy lends nothing. */
typedef struct dpsync_hook {
    void *ctx;
    /* every gradient at flat offset >= ready_from is final for this
     * backward: a strategy starts reducing what became complete. Called
     * between kernels; a no-op outside a communicating backward. */
    void (*grads_ready)(void *ctx, size_t ready_from);
    /* lent block gradients: block i's gradient buffer, asked just before
     * its backward ([block length] floats, the block's flat layout). NULL:
     * a communication failed (dpsync_backward_end says which). */
    float *(*block_grads)(void *ctx, int block);
    /* lent block parameters: block i's parameters, asked before each of
     * its forwards and backwards; next is the block expected after it (-1:
     * none), which the strategy may start fetching. NULL: failure. */
    float *(*block_params)(void *ctx, int block, int next);
} dpsync_hook_t;

/* A stretch of the logical flat buffer this rank updates: [lo, lo+n), at
 * offset param in the view's params, grad in its grads and state in the
 * moments. */
typedef struct dpsync_piece {
    size_t lo, n;
    size_t param, grad, state;
} dpsync_piece_t;

/* What AdamW updates on this rank. */
typedef struct dpsync_optim_view {
    float *params;
    const float *grads;
    size_t n;                     /* floats in each moment buffer */
    const dpsync_piece_t *pieces; /* ascending, cut at unit boundaries only */
    int n_pieces;
    /* the update covers every parameter in the model's own buffer, so it
     * may keep the model's bf16 copy current in the same pass; else the
     * caller marks that copy stale after after_update */
    int whole;
} dpsync_optim_view_t;

typedef struct dpsync_config {
    const ops_t *ops;        /* the model's backend */
    mem_tracker_t mem;       /* counts the buffers the strategy allocates */
    comm_t *dp;              /* the data-parallel group */
    comm_t *shard, *replica; /* --hybrid-shard: shard and replica groups, else NULL */
    /* the model's buffers: [n] each, except under lent block gradients
     * (parameters) the tensors outside the blocks, compact (model.h) */
    float *params, *grads;
    size_t n; /* floats in the logical flat buffer */
    int n_tensors;
    const size_t *tensor_start;       /* [n_tensors+1] ascending offsets, last = n */
    const int *tensor_block;          /* [n_tensors] the stage's block holding it, or -1 */
    const unsigned char *tensor_norm; /* [n_tensors] 1: counts in the global norm on this rank */
    /* --ep: [n_tensors] 1 for a routed expert's tensor (different on each
     * rank of the EP group), averaged over edp (ddp_set_experts) and
     * counted in the norm's expert part; ep: the EP group. NULL, NULL and
     * NULL without --ep. ZeRO shards the expert tensors over edp. */
    const unsigned char *tensor_expert;
    comm_t *edp, *ep;
    /* --hybrid-shard with --ep: the expert shard group ZeRO shards the
     * experts over (their replicas are the dense part's); NULL: edp */
    comm_t *eshard;
    ddp_mode_t mode;                  /* replicated and ZeRO-1's all-reduce */
    size_t bucket_bytes;
    comm_dtype_t dtype; /* what gradient reductions send */
    /* ZeRO-2/3 under a split backward (zb-h1): the model keeps every block
     * gradient (none lent), they accumulate over the step's microbatches,
     * and each unit is reduce-scattered from the model's buffer during its
     * chunk's last backward (the last W), when it is final. The lent
     * windows cannot serve: B writes a block's norm gradients long before
     * its W writes the rest. */
    int keep_block_grads;
} dpsync_config_t;

typedef struct dpsync dpsync_t;

/* Told that view.grads[lo, lo+n) (the optimizer view's gradients) holds
 * its final value for this step's update (dpsync_on_final). */
typedef void (*dpsync_final_fn)(void *ctx, size_t lo, size_t n);

typedef struct dpsync_ops {
    const char *name;
    int zero;               /* the ZeRO stage (0-3), for records (a checkpoint's layout) */
    int lends_block_grads;  /* the model keeps no block gradients (model_layout_t) */
    int lends_block_params; /* ... nor block parameters */
    int shards;             /* the state is sharded: --hybrid-shard applies */
    /* a forward is collective over the DP group (it gathers parameters):
     * every rank runs as many, even where it has no data left */
    int collective_forward;
    /* The strategy's buffers, hook and optimizer view; s's common part is
     * set. */
    status_t (*create)(dpsync_t *s, const dpsync_config_t *c, char *err, size_t errlen);
    /* Before the step's first forward. */
    void (*step_begin)(dpsync_t *s);
    /* Before backward k of the step's n (k = 0..n-1) of the gradients
     * below flat offset top (n for a whole stage; an interleaved stage's
     * chunk: model_chunk_top, the chunks above finishing their backwards
     * first): whether it adds to the gradients (accum) and is the last of
     * those gradients (model_backward's flags); the hook communicates
     * during it where the strategy says. */
    void (*backward_begin)(dpsync_t *s, int k, int n, size_t top, int *accum, int *last);
    /* After the last backward: every reduction completed, the gradients
     * (in the optimizer view) are the average over the DP group. */
    status_t (*grads_finish)(dpsync_t *s, char *err, size_t errlen);
    /* After grads_finish: the gradients of tensor [off, off+numel) as this
     * rank holds them, [*n] floats (ZeRO-2/3: its piece of the tensor's
     * unit, padding included; callers use it for one-tensor units). */
    float *(*tensor_grads)(dpsync_t *s, size_t off, size_t numel, size_t *n);
    /* What this rank's sum of squares covers of tensor [off, off+numel):
     * 1 with the gradients in *x [*n], 0 when none of it. */
    int (*norm_piece)(const dpsync_t *s, size_t off, size_t numel, const float **x, size_t *n);
    /* After the optimizer updated its view: the parameters every rank
     * needs are gathered into the model's buffer. Collective. */
    status_t (*after_update)(dpsync_t *s, char *err, size_t errlen);
    /* The parameters the strategy holds beside the model's buffer, from
     * or to a full flat host copy [n] (the model's part is the model's).
     * to_host is collective over the shard group. */
    status_t (*params_from_host)(dpsync_t *s, const float *host, char *err, size_t errlen);
    status_t (*params_to_host)(dpsync_t *s, float *host, char *err, size_t errlen);
    /* A buffer indexed like the moments ([view.n]) to a full flat host
     * buffer [n] (collective: the writer gets every piece), and back
     * (each rank keeps its pieces). */
    status_t (*state_to_host)(dpsync_t *s, const float *state, float *host, char *err, size_t errlen);
    void (*state_from_host)(dpsync_t *s, const float *host, float *state);
    /* Wires s->final into the engine, which tells each bucket or unit
     * final as its reduction completes during the backward (see
     * dpsync_on_final). */
    status_t (*watch_final)(dpsync_t *s, char *err, size_t errlen);
    /* Seconds this step blocked in the strategy's communication. */
    double (*comm_s)(const dpsync_t *s);
    /* Rank 0's banner lines; mode and dtype: the options' names. */
    void (*banner)(const dpsync_t *s, FILE *out, const char *mode, const char *dtype);
} dpsync_ops_t;

/* One strategy's state. The engines it does not use stay zeroed. */
struct dpsync {
    const dpsync_ops_t *ops;
    const ops_t *mem; /* the backend owning the buffers */
    comm_t *dp;
    float *params, *grads; /* the model's (dpsync_config_t) */
    size_t n;
    dpsync_hook_t hook;        /* for the model (model.h) */
    dpsync_optim_view_t view;  /* for the optimizer */
    ddp_t ddp;                 /* replicated, ZeRO-1: the gradient all-reduce */
    zero_t zero;               /* ZeRO: the shards */
    int unit0, n_blocks;       /* ZeRO: the unit of the stage's first block, the blocks' units */
    size_t block_lo, block_hi; /* ZeRO: the blocks' flat range, absent from compact buffers */
    int next;                  /* ZeRO-2/3: the highest unit not yet reduced in this backward */
    dpsync_piece_t *pieces;    /* the view's pieces */
    int active;                /* the backward in progress communicates */
    int accumulate;            /* ZeRO-2/3: dpsync_config_t's keep_block_grads */
    int reducing;              /* replicated, ZeRO-1: this step's all-reduce has begun (ddp_begin) */
    /* The first failure of the hook's communication in this backward, and
     * its message. Held here, the one place in mpi/ that keeps a message:
     * the model calls the hook between its kernels, and the hook's
     * functions return nothing (grads_ready) or a buffer (block_grads,
     * block_params), so a failure cannot be returned through the model's
     * backward; dpsync_backward_end hands it to the caller. */
    status_t hook_st;
    char hook_err[COMM_ERR_MAX];
    double update_s; /* this step's after_update */
    /* the gradient norm's pieces, fixed for the run: [n_norm] */
    const float **norm_x;
    size_t *norm_n;
    double *norm_ss;
    unsigned char *norm_expert; /* [n_norm] the piece is an expert tensor's */
    int n_norm;
    comm_t *norm_group; /* where the parts are summed besides TP and PP, or NULL */
    /* --ep, where this rank's norm covers whole expert tensors (the
     * replicated strategy, ZeRO-1): the EP group, over which the expert
     * part is summed before the rest, since each EP rank holds other
     * experts and its expert-DP replicas the same ones. NULL where the
     * expert gradients are pieces over expert-DP (ZeRO-2/3): then every
     * DP rank holds other pieces and norm_group's sum counts each once. */
    comm_t *norm_ep;
    /* dpsync_on_final's listener, or NULL */
    dpsync_final_fn final;
    void *final_ctx;
    int final_bwd; /* ZeRO-2/3: the backward in progress is its units' last of the step */
};

/* The strategy for ZeRO stage 0..3 (0: replicated); NULL otherwise. */
const dpsync_ops_t *dpsync_pick(int zero_stage);

/* Builds strategy ops over c's buffers and groups. Returns a status with
 * one line in err (s is then destroyed, and may be destroyed again). */
status_t dpsync_create(dpsync_t *s, const dpsync_ops_t *ops, const dpsync_config_t *c, char *err, size_t errlen);
void dpsync_destroy(dpsync_t *s);

/* Before the first step (--offload's gradient copies): fn(ctx, lo, n) is
 * told that view.grads[lo, lo+n) is final for the step's update: during
 * the step's last backward, per bucket (the replicated strategy and
 * ZeRO-1 in bucketed mode) or per unit (ZeRO-2/3 without
 * --hybrid-shard) as soon as its reduction completes and is averaged,
 * after the backend ops that form it are issued; and at the end of
 * grads_finish the whole view once more, for what nothing told earlier
 * (naive and flat modes, HSDP's sum across replicas). So every gradient
 * is told at least once a step, none before it is final; the listener
 * acts once per element. Not during non-final microbatches of an
 * accumulation, whose gradients the next backward changes. Returns a
 * status with one line in err. */
status_t dpsync_on_final(dpsync_t *s, dpsync_final_fn fn, void *ctx, char *err, size_t errlen);

/* After each backward: the hook stops communicating. Returns the hook's
 * held failure (it stays held: the run is over), its message copied into
 * err. */
status_t dpsync_backward_end(dpsync_t *s, char *err, size_t errlen);

/* This rank's part of the squared global gradient norm: the sum, in
 * double and a fixed order, of the squares of its norm pieces (one sumsq
 * call). The caller sums the parts over TP, PP and then norm_group. The
 * expert tensors' pieces (--ep) are left out and summed into *expert
 * instead (NULL: counted in the result), which the caller sums over
 * norm_ep first. */
double dpsync_grad_sumsq(dpsync_t *s, double *expert);

#endif
