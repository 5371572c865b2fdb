/* Context parallelism (issue 34): the zigzag layout and the causal ring's
 * steps as pure functions (no MPI), as TransformerEngine's P2P context
 * parallelism and Megatron's load balancing define them
 * (../shared/notes/anchors-wave3.md section 3). test/test_ring_attn.c
 * checks them exhaustively against a brute-force causal mask and drives the
 * ring attention ops (base/ops.h attention_block_fwd/_merge/_block_bwd) with
 * them, emulating a CP group in one process.
 *
 * Layout. A sequence of T tokens is cut into 2cp chunks of c = T / (2cp)
 * tokens; rank r of the CP group holds chunks r and 2cp-1-r, in that order:
 * its 2c local rows are global positions r c .. r c + c - 1 (the first
 * half) then (2cp-1-r) c .. (2cp-1-r) c + c - 1 (the second half), so the
 * positions increase along the local rows. cp = 1 is the whole sequence.
 *
 * Ring. In cp steps K,V blocks travel rank -> rank + 1, so at step i rank r
 * holds the block of rank src = (r - i) mod cp. What the step computes
 * (q rows of the local block x key rows of the held block):
 *   i = 0, diagonal   all 2c local rows x all 2c local keys, causal by
 *                     global position
 *   src < r, lower    all 2c local rows x the block's first half (chunk
 *                     src, wholly before both local chunks), no mask
 *   src > r, upper    the second half of the local rows (chunk 2cp-1-r)
 *                     x all 2c keys (chunks src and 2cp-1-src, both before
 *                     it), no mask
 * so every off-diagonal step is 2c x c pairs, half a tile, on every rank:
 * the causal work is balanced. The pairs a step leaves out are all
 * k > q (future keys). Document masking is applied on top by the ops. */
#ifndef DTRAIN_CP_SCHED_H
#define DTRAIN_CP_SCHED_H

#include <stddef.h>
#include <stdint.h>

typedef enum { CP_STEP_DIAG = 0, CP_STEP_LOWER, CP_STEP_UPPER } cp_step_kind_t;

/* One ring step of one rank: local query rows [q0, q0 + nq) against rows
 * [k0, k0 + nk) of the held K,V block (both of 2c rows per sequence),
 * causal by global position when `causal`, else every pair. */
typedef struct cp_step {
    cp_step_kind_t kind;
    int src; /* the rank whose K,V block is held at this step */
    int q0, nq;
    int k0, nk;
    int causal;
} cp_step_t;

/* 0 when T tokens can be cut for cp ranks (cp >= 1, T a positive multiple
 * of 2cp), else -1 with one line in err (err may be NULL). */
int cp_shape_check(int cp, int T, char *err, size_t errlen);
/* The global chunk of rank's half (0: first, 1: second): rank or 2cp-1-rank. */
int cp_chunk_of(int cp, int rank, int half);
/* Global position (0..T-1) of local row i (0..2c-1) of rank, c = T/(2cp). */
int cp_global_pos(int cp, int T, int rank, int i);
/* pos[0 .. 2c-1] = cp_global_pos of rank's local rows. */
void cp_local_positions(int cp, int T, int rank, int32_t *pos);
/* Rank's step (0 .. cp-1) of the ring, c = T/(2cp) tokens a chunk; 0, or
 * -1 for arguments out of range (*out untouched). */
int cp_ring_step(int cp, int T, int rank, int step, cp_step_t *out);
/* "diagonal", "lower", "upper". */
const char *cp_step_kind_name(cp_step_kind_t k);

#endif
