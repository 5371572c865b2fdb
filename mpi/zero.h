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
 * The update is elementwise, so a ZeRO-1 step is bit-identical to an
 * unsharded one on the same gradients. */
#ifndef DTRAIN_ZERO_H
#define DTRAIN_ZERO_H

#include <stddef.h>

#include "comm.h"

typedef struct zero {
    int stage;
    comm_t *group;       /* sharded over this group (size S, rank r) */
    size_t n;            /* floats in the flat buffer */
    int n_units;
    size_t *unit_start;  /* [n_units+1] ascending, unit_start[n_units] = n */
    size_t *chunk;       /* [n_units] c = ceil(L/S) */
    size_t *shard_start; /* [n_units+1] where unit u's piece starts in the shard */
    size_t shard_n;      /* floats in a shard (pieces padded to c) */
    float *stage_buf;    /* [S * max c] all-gather landing buffer (MEM_COMM) */
    size_t stage_n;
    double comm_s;       /* seconds in this step's gathers */
} zero_t;

/* unit_start: n_units+1 ascending offsets covering [0, n]. Returns 0 or -1
 * (out of memory). */
int zero_create(zero_t *z, int stage, comm_t *group, size_t n, const size_t *unit_start, int n_units);
void zero_destroy(zero_t *z);

/* This rank's piece of unit u, in flat offsets: [*lo, *hi). */
void zero_piece(const zero_t *z, int u, size_t *lo, size_t *hi);

/* Every rank's pieces of buf ([n] floats; this rank's pieces are current)
 * are gathered into every rank's buf. Collective over the group. Returns 0
 * or -1 with the message in group->err. */
int zero_allgather(zero_t *z, float *buf);

/* Copies between a flat buffer [n] and a shard [shard_n]: this rank's
 * pieces, padding left zero. */
void zero_flat_to_shard(const zero_t *z, const float *flat, float *shard);
void zero_shard_to_flat(const zero_t *z, const float *shard, float *flat);

/* "--zero N" for N in 0..3 and "--fsdp MODE" -> stage; -1 otherwise. */
int zero_fsdp_stage(const char *mode);

#endif
