/* ZeRO sharding of the training state over a group of data-parallel ranks.
 * Knows nothing of models: the training loop gives the flat buffer's
 * units (ascending offsets; a transformer block is one unit, every other
 * tensor one unit) and the group to shard over.
 *
 * Each unit of L floats is cut into S = group size pieces of c = ceil(L/S)
 * floats; rank r owns [r*c, min((r+1)*c, L)) of every unit (possibly
 * empty). A rank's shard is its pieces of all units, concatenated:
 * shard_n = sum of the units' c floats. Cutting every unit, rather than the
 * whole buffer once, is what lets ZeRO-3 gather one block at a time with
 * the same ownership ZeRO-1 uses.
 *
 *   stage 1: AdamW moments exist for the shard only. After the gradient
 *            all-reduce each rank updates its pieces of the parameters,
 *            then every unit is all-gathered.
 *
 *   stage 2: gradients too. Backward writes each block's gradients into
 *            one of two lent windows; as soon as a block is done its window
 *            is reduce-scattered (nonblocking) and the rank adds its piece
 *            to its gradient shard. Every microbatch is reduced this way
 *            (DeepSpeed does the same), so a rank never holds a whole
 *            gradient, only the tensors outside the blocks, two blocks'
 *            windows and its shard.
 *
 *   stage 3: parameters too, for the block units. The rank keeps its
 *            pieces of every unit (param_shard, what AdamW updates); a
 *            block's full parameters exist only while it computes, in one
 *            of two windows that alternate by unit parity. Asking for
 *            block u's window starts the all-gather of the block that runs
 *            next (u+1 in forward, u-1 in backward) into the other window,
 *            so that gather overlaps block u's compute. A window still
 *            holding u (the last forward block is the first backward one)
 *            is used as it is. The tensors outside the blocks (embeddings,
 *            final norm, head) are gathered whole after each step, as in
 *            stages 1 and 2.
 *
 * Expert parallelism (--ep, as Megatron's distributed optimizer): a
 * routed expert's tensors differ across the EP group and are replicated
 * only over the expert-data-parallel group, so each unit has a second
 * part, its expert tail, cut over that group instead (zero_pieces); every
 * operation below works part by part, each over its own group, and
 * without experts every expert part is empty, which is the layout above.
 *
 * The update is elementwise, so a ZeRO-1 step is bit-identical to an
 * unsharded one on the same gradients; ZeRO-2 sums gradients in another
 * order (per microbatch, then over ranks), equal to fp32 rounding.
 *
 * Reduction dtype (--grad-reduce-dtype; ZeRO-1 reduces through mpi/ddp.c,
 * which has its own): with COMM_BF16, stages 2 and 3 round each window (or
 * padded non-block unit) to bf16 in a staging buffer before its
 * reduce-scatter, sum in bf16 (comm.h's COMM_BF16 sums), and widen the
 * received piece back to fp32 before adding it to the fp32 gradient shard;
 * the 1/dp scaling stays in fp32 (zero_grads_finish). With --hybrid-shard,
 * zero_grads_replicas sums the scaled shard across the replica group the
 * same way. A group of one rank reduces nothing, so it keeps fp32 and
 * bf16 changes nothing there. The staging buffers (MEM_COMM: a window, a
 * piece and a padded unit per window, and a shard for HSDP, 2 bytes per
 * element) are allocated by zero_create.
 *
 * Memory: every buffer below that holds tensor data (shards, windows,
 * staging) is the backend's (ops->alloc, counted through the creator's mem_tracker_t in the
 * category named), because the model's kernels read and write them: the
 * gradient windows are lent to the model as block gradients, the parameter
 * windows as block parameters, and AdamW runs on the shards. Every copy,
 * fill, cast, sum and scaling on them goes through the ops table, never a
 * host loop. Buffers the caller passes are backend memory too, except
 * where a function says "host" (checkpoint and initialisation copies),
 * which it reads or writes with ops->to_host / ops->from_host. */
#ifndef DTRAIN_ZERO_H
#define DTRAIN_ZERO_H

#include <stddef.h>
#include <stdint.h>

#include "base/mem.h"
#include "base/ops.h"
#include "mpi/comm.h"

/* ZeRO's units of a flat buffer of n floats holding n_tensors tensors
 * (tensor_start: ascending offsets; tensor_block[i]: the block holding
 * tensor i, or -1): each block's tensors one unit, every other tensor its
 * own unit. The trainer's strategy (dpsync_shard.c) and the planner both
 * cut with this. */
typedef struct zero_units {
    int n_units;
    int block0, n_blocks; /* the block units [block0, block0 + n_blocks); block0 -1: none */
    size_t window;        /* floats of the longest block unit */
} zero_units_t;

/* unit_start [n_tensors+1] receives the units' start offsets and n.
 * --ep: tensor_expert [n_tensors] marks the routed experts' tensors (NULL:
 * none), and expert_from [n_tensors] (NULL: not wanted) receives where
 * each unit's expert tensors begin (the unit's end where it has none).
 * A unit's expert tensors must be its tail, as a MoE block lists them:
 * returns -1 where one precedes a dense tensor of its unit, else 0. */
int zero_cut_units(zero_units_t *u, size_t n, int n_tensors, const size_t *tensor_start, const int *tensor_block,
                   const unsigned char *tensor_expert, size_t *unit_start, size_t *expert_from);

/* The parts: unit u is part 2u, its dense tensors [unit_start[u],
 * expert_from[u]), sharded over the group of S ranks, and part 2u+1, its
 * expert tail [expert_from[u], unit_start[u+1]), over the expert group
 * of Se ranks (--ep: the expert-data-parallel group); either may be
 * empty (expert_from NULL: every expert part is). A part of L floats over
 * S_g ranks is cut into pieces of c = ceil(L/S_g): chunk[p] and
 * shard_start[p] (2 n_units + 1 entries; either may be NULL). A shard is
 * the pieces of every part in part order. The sizes the buffers follow: */
typedef struct zero_shape {
    size_t shard_n;  /* floats in a shard: the sum of the c */
    size_t stage_n;  /* the largest S_g x c: the all-gather buffer */
    size_t window_n; /* the block units' longest padded window, S c(dense) + Se c(expert) */
    size_t window_c; /* ... and their longest pieces, c(dense) + c(expert) */
} zero_shape_t;

void zero_pieces(const zero_units_t *u, const size_t *unit_start, const size_t *expert_from, size_t S, size_t Se,
                 size_t *chunk, size_t *shard_start, zero_shape_t *shape);

/* The elements of every buffer zero_create allocates (0: not allocated),
 * floats unless marked bf16; zero_create allocates exactly these and the
 * planner (src/plan/plan.c) counts them, so a change here changes both. */
typedef struct zero_sizes {
    size_t stage;                    /* MEM_COMM: the all-gather buffer (at least 1) */
    size_t grad_shard, window, recv; /* stage 2: MEM_GRADS shard and two windows, MEM_COMM two pieces */
    size_t hstage, hwin, hrecv;      /* stage 2, bf16 over a group > 1: MEM_COMM, bf16 (two hwin, hrecv) */
    size_t hshard;                   /* stage 2, bf16 over a replica group > 1: MEM_COMM, bf16 */
    size_t param_shard, pwin;        /* stage 3: MEM_PARAMS shard and two windows */
    size_t window_n;                 /* stage 2: the shape's window_n, a window less its padding float */
} zero_sizes_t;

/* The buffers of a stage over a group of S ranks (the expert group is no
 * larger) for the shape zero_pieces gave, replica_size the replica
 * group's (0: none). */
void zero_sizes(zero_sizes_t *s, int stage, size_t S, const zero_shape_t *shape, comm_dtype_t dtype,
                int replica_size);

/* Their bytes added into bytes[category] (base/mem.h). */
void zero_buffer_bytes(const zero_sizes_t *s, double bytes[MEM_N_CATEGORIES]);

typedef struct zero {
    const ops_t *ops;  /* the backend owning the buffers */
    mem_tracker_t mem; /* counts the buffers zero_create allocates */
    int stage;
    comm_t *group;  /* the dense parts sharded over this group (size S, rank r) */
    comm_t *egroup; /* --ep: the expert parts over this one (the expert-DP group), else NULL */
    size_t n;       /* floats in the flat buffer */
    int n_units;
    size_t *unit_start;  /* [n_units+1] ascending, unit_start[n_units] = n */
    size_t *expert_from; /* [n_units] where unit u's expert part begins (its end: none) */
    size_t *chunk;       /* [2 n_units] part p's c = ceil(L/S_g) */
    size_t *shard_start; /* [2 n_units+1] where part p's piece starts in the shard */
    size_t shard_n;      /* floats in a shard (pieces padded to c) */
    float *stage_buf;    /* [max S_g c] all-gather landing buffer (MEM_COMM) */
    size_t stage_n;
    zero_sizes_t sizes; /* what zero_create allocated (zero_destroy frees the same) */
    double comm_s;      /* seconds in this step's gathers */
    /* stage 2 */
    float *grad_shard; /* [shard_n] the step's summed gradient pieces */
    float *window[2];  /* [window_n] block gradients: a unit's parts, each padded to S_g c (zero_window) */
    float *recv[2];    /* [window_c] a window's reduced pieces */
    size_t window_n;
    int window_unit[2]; /* unit whose reduce-scatter is in flight, or -1 */
    comm_req_t req[2][2];
    int req_busy[2][2]; /* window k's reduce-scatter of its part g is in flight */
    double wait_s;      /* seconds blocked on reduce-scatters this step */
    comm_t *replica;    /* HSDP: the ranks holding the same pieces in the other shard groups, or NULL */
    comm_dtype_t dtype; /* what the gradient reductions send */
    uint16_t *hwin[2];  /* bf16, group > 1: [window_n] a window rounded to bf16 */
    uint16_t *hrecv[2]; /* ... [window_c] its reduced pieces */
    uint16_t *hstage;   /* ... [stage_n] a non-block part, padded */
    uint16_t *hshard;   /* bf16, replica > 1: [shard_n] the shard, for the sum across replicas */
    /* stage 3 */
    float *param_shard; /* [shard_n] this rank's pieces of every unit */
    float *pwin[2];     /* [window_n] a block's gathered parameters, laid out as window */
    int pwin_unit[2];   /* unit a window holds or is gathering, or -1 */
    int pwin_busy[2][2]; /* its all-gather of part g is in flight */
    comm_req_t preq[2][2];
    double gather_s;   /* seconds blocked on parameter all-gathers this step */
    long long gathers; /* block all-gathers started (a cache hit starts none) */
    /* zero_grads_early: unit_final[u] 1 once its last reduce-scatter of
     * the step is issued, 2 once banked and scaled (done told); NULL: off */
    unsigned char *unit_final;
    float final_scale;
    void (*done)(void *ctx, size_t lo, size_t n);
    void *done_ctx;
} zero_t;

/* ops: the model's backend (the buffers' memory and the arithmetic on
 * them). mem: counts the buffers allocated here (NULL: not counted).
 * units, unit_start, expert_from: zero_cut_units's (expert_from NULL: no
 * expert parts); egroup: the expert parts' group (NULL without them).
 * Stage 2 reduces the block units through windows. replica: HSDP's
 * replica group (stage 2 and up; NULL without --hybrid-shard). dtype: the
 * gradient reductions' (see above). Returns a status, one line in err
 * (out of memory). Every fallible function here returns a status_t with
 * its message in the caller's err[errlen] (mpi/status.h); those returning
 * a pointer return NULL. */
status_t zero_create(zero_t *z, const ops_t *ops, const mem_tracker_t *mem, int stage, comm_t *group, comm_t *egroup,
                     size_t n, const zero_units_t *units, const size_t *unit_start, const size_t *expert_from,
                     comm_t *replica, comm_dtype_t dtype, char *err, size_t errlen);
void zero_destroy(zero_t *z);

/* This rank's piece of part p, in flat offsets: [*lo, *hi), at *skip in
 * its c floats of the shard (nonzero only where the part is padded in
 * front: a unit's dense part followed by an expert part, see
 * zero_window). */
void zero_piece(const zero_t *z, int p, size_t *lo, size_t *hi, size_t *skip);

/* A block unit's window (stage 2's gradient windows, stage 3's parameter
 * windows) holds its parts one after the other, each padded to S_g c so
 * that each part's reduce-scatter and all-gather works in place on its
 * own stretch. The unit's flat layout must be contiguous in it, so a
 * dense part followed by an expert part is padded in front instead of
 * behind: the model's pointer is the window plus *front; the expert part
 * (or a lone part) starts right after the dense one and is padded behind.
 * *at: where part 2u+g's padded stretch starts in the window. */
void zero_window(const zero_t *z, int u, size_t *front, size_t at[2]);

/* Every rank's pieces of buf ([n] floats of backend memory; this rank's
 * pieces are current) are gathered into every rank's buf. Collective over
 * the group. */
status_t zero_allgather(zero_t *z, float *buf, char *err, size_t errlen);
/* The same on a host buffer (a checkpoint's flat copy), staged through the
 * backend's all-gather buffer with to_host / from_host. */
status_t zero_allgather_host(zero_t *z, float *host, char *err, size_t errlen);

/* Copies between a flat host buffer [n] and a shard [shard_n] of backend
 * memory (z's ops): this rank's pieces. shard_from_host zeroes the shard's
 * padding; shard_to_host leaves the rest of host alone. */
void zero_shard_from_host(const zero_t *z, const float *host, float *shard);
void zero_shard_to_host(const zero_t *z, const float *shard, float *host);

/* Stage 2. The step starts: the gradient shard is cleared. */
void zero_grads_begin(zero_t *z);

/* The window for unit u's gradients (u a block unit; windows alternate by
 * u's parity), from the unit's start (zero_window's front). Waits for the reduce-scatter still using it, if any.
 * NULL on a communication failure. */
float *zero_grads_window(zero_t *z, int u, char *err, size_t errlen);

/* Unit u's gradients are complete in its window: starts their
 * reduce-scatter (nonblocking). */
status_t zero_grads_reduce_window(zero_t *z, int u, char *err, size_t errlen);

/* Drives the reduce-scatters in flight (MPI makes no progress on a
 * nonblocking collective unless it is tested) and banks finished ones.
 * Cheap; call it between kernels. */
status_t zero_grads_progress(zero_t *z, char *err, size_t errlen);

/* Unit u's gradients are complete in src ([len] floats of backend memory,
 * not a window; its flat layout): reduce-scatters each part now and adds
 * this rank's pieces. */
status_t zero_grads_reduce(zero_t *z, int u, const float *src, char *err, size_t errlen);

/* Completes every reduce-scatter in flight, then multiplies the shard by
 * scale (1/dp: the average; also for the expert parts, whose sum over
 * the expert group already covers every DP rank's tokens once); under
 * zero_grads_early, only the units not scaled already. */
status_t zero_grads_finish(zero_t *z, float scale, char *err, size_t errlen);

/* Each unit's pieces final as soon as they can be (--offload's gradient
 * copies, during the backward): once the unit is marked (zero_grads_last)
 * and its reduce-scatter is banked in the shard, its pieces
 * [shard_start[2u], shard_start[2u+2]) are multiplied by scale there (the
 * same product zero_grads_finish forms) and done(ctx, lo, n) is told that
 * stretch of the shard, after the ops that form it are issued. Not under
 * HSDP (the sum across the replicas comes last). Returns a status (out of
 * memory). */
status_t zero_grads_early(zero_t *z, float scale, void (*done)(void *ctx, size_t lo, size_t n), void *ctx,
                          char *err, size_t errlen);
/* Unit u's next reduce-scatter is its last of the step (under
 * zero_grads_early; a no-op otherwise). */
void zero_grads_last(zero_t *z, int u);

/* HSDP, after zero_grads_finish: each shard group reduced its own ranks'
 * gradients; the groups' pieces of the same elements are summed over the
 * replica group (in the reduction dtype). Nothing without a replica
 * group. */
status_t zero_grads_replicas(zero_t *z, char *err, size_t errlen);

/* Stage 3. Block unit u's parameters, gathered (flat layout of the unit
 * from the returned pointer); then starts gathering unit `next` (-1: none; must be a
 * block unit of the other parity) into the other window. NULL on a
 * communication failure. */
float *zero_params_window(zero_t *z, int u, int next, char *err, size_t errlen);

/* Drives parameter all-gathers in flight. */
status_t zero_params_progress(zero_t *z, char *err, size_t errlen);

/* The shards changed (an optimizer step, a load): completes gathers in
 * flight and forgets what the windows hold. */
status_t zero_params_invalidate(zero_t *z, char *err, size_t errlen);

/* Unit u gathered from the parameter shard into dst ([unit length] of
 * backend memory). Blocking. */
status_t zero_params_gather_unit(zero_t *z, int u, float *dst, char *err, size_t errlen);

/* The unit holding flat offset off, and the part. */
int zero_unit_of(const zero_t *z, size_t off);
int zero_part_of(const zero_t *z, size_t off);

/* "--zero N" for N in 0..3 and "--fsdp MODE" -> stage; -1 otherwise. */
int zero_fsdp_stage(const char *mode);

#endif
