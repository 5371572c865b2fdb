/* Context parallelism (issue 34): ring attention over a CP group. The
 * schedule is mpi/cp_sched.h's (pure functions); this is its executor: the
 * K,V blocks travel around the ring rank -> rank + 1 with non-blocking
 * point-to-point on a comm_t (mpi/comm.h), each step's block computed by
 * the ops of base/ops.h ("Ring attention's building blocks") while the
 * next block travels.
 *
 * Layout (cp_sched.h): the sequence of T tokens is cut into 2cp chunks and
 * this rank (the comm's rank r of size cp) holds chunks r and 2cp-1-r, L =
 * T/cp local rows per sequence. The caller's tensors are this rank's rows:
 *   qkv[B*L, (NH+2NKV)*HS]   the fused rows (q | k | v heads)
 *   out[B*L, NH*HS], lse[B, NH, L]
 *   qdoc[B*L] or NULL        each local query's global document start
 *                            (global t - docmask pos[t], computed from the
 *                            whole sequence; NULL: one document)
 * all in the backend's memory.
 *
 * Forward. kv[0] = the local k,v columns (attention_kv_pack). Step i =
 * 0 .. cp-1 holds the block of rank (r - i) mod cp in kv[i % 2]: unless it
 * is the last step, the send of kv[i % 2] to r+1 and the receive of the
 * next block from r-1 into kv[(i+1) % 2] are posted first; then the
 * step's attention_block_fwd (cp_ring_step's rows and mask) into out and
 * lse (step 0) or a partial merged in with attention_merge (later steps),
 * in step order; then both requests are waited for: the receive's block is
 * the next step's, and the sent buffer is the next receive's target.
 *
 * Backward. Q and dQ stay; the K,V blocks travel again as forward (kv
 * ahead of the compute), their gradient one step behind: step i's
 * attention_block_bwd adds dq into dqkv's q columns and the block's dk, dv
 * into dacc[i % 2] (zeroed); then the sum of the earlier ranks' shares of
 * that block, sent by r-1 at its step i-1, is waited for and added
 * (ops->add), and dacc[i % 2] is sent on to r+1, which holds the same block
 * at step i+1. It arrives there during r+1's compute of that step, so both
 * transfers overlap the attention. After the last step every rank has sent
 * the full gradient of the block of rank r+1 to its owner; it receives its
 * own from r-1 and writes it into dqkv's k and v columns
 * (attention_kv_unpack). A block's gradient is thus summed over the ranks
 * in a fixed order (its owner, then the next ones around the ring), and
 * partial outputs merged in step order: the results do not depend on
 * timing, and reruns give the same bits.
 *
 * Messages: tag CP_TAG_KV for K,V blocks, CP_TAG_DKV for gradients, each
 * B*L*2*NKV*HS floats; MPI's non-overtaking rule keeps each link in order.
 * Even ranks post the send before the receive, odd ranks the receive
 * first, so that a transport running each rank's calls in order (NCCL)
 * pairs them up around the ring for any cp. Waits are the comm's: traced
 * as point-to-point spans when comm->trace is set, watched by comm->watch
 * (--comm-timeout: a stopped neighbour ends the job with one line naming
 * the group, "cp" by the caller's choice of comm->name).
 *
 * Memory: the comm moves the backend's buffers themselves (no host
 * copies), so the comm must reach the backend's memory: MPI with a host
 * readable backend (the CPU tables), NCCL with CUDA. Where ops run
 * asynchronously, the comm's device_sync must be the backend's sync
 * (backend_comm_open sets it), so a send posts finished data and a receive
 * never overwrites a block a pending op still reads. Buffers: 2 kv, 2
 * dacc, one incoming gradient, a partial out and lse, and the positions of
 * every rank's rows ([cp][L] int32), allocated once by cp_ring_create. */
#ifndef DTRAIN_CP_RING_H
#define DTRAIN_CP_RING_H

#include <stddef.h>
#include <stdint.h>

#include "base/ops.h"
#include "mpi/comm.h"
#include "mpi/status.h"

#define CP_TAG_KV 0x601  /* K,V blocks, rank r -> r+1 */
#define CP_TAG_DKV 0x602 /* their gradients, rank r -> r+1 */

/* One attention's dimensions under CP: T the whole sequence's tokens, cp
 * the comm's size. */
typedef struct cp_ring_shape {
    int B, T, NH, NKV, HS;
} cp_ring_shape_t;

/* What the ring cost this rank, added to by every call (zero it once):
 * the trainer's exposed communication. */
typedef struct cp_ring_stats {
    /* seconds blocked in wait() on ring messages after the step's compute
     * returned (the backend synchronised first, so running ops count as
     * compute): the communication the attention did not hide */
    double wait_fwd_s, wait_bwd_s;
    /* seconds from the first posting to the last wait of each call: the
     * ring's whole time, compute included */
    double ring_fwd_s, ring_bwd_s;
    long long bytes_sent; /* payload this rank sent */
    long messages;        /* sends posted */
} cp_ring_stats_t;

typedef struct cp_ring cp_ring_t;

/* A ring for one attention shape over comm (rank r of cp = comm->size),
 * computing with ops. STATUS_INPUT with one line for a shape that cannot
 * be cut (cp_shape_check) or that the ops cannot run (a table without the
 * ring ops, NH not a multiple of NKV), STATUS_FAIL for out of memory.
 * Collective in effect: every rank of the comm creates its ring with the
 * same shape. */
status_t cp_ring_create(comm_t *comm, const ops_t *ops, const cp_ring_shape_t *sh, cp_ring_t **out, char *err,
                        size_t errlen);
void cp_ring_destroy(cp_ring_t *r);
/* The backend bytes cp_ring_create allocates for sh over cp ranks (the
 * planner's and the memory accounting's). */
size_t cp_ring_bytes(const cp_ring_shape_t *sh, int cp);

/* Local rows per sequence (T/cp) and the global position of each:
 * pos[0 .. L-1] (host memory), for the caller's qdoc and its reference. */
int cp_ring_rows(const cp_ring_t *r);
const int32_t *cp_ring_positions(const cp_ring_t *r);

/* out, lse written for every local row: attention over the whole
 * sequence's keys (causal by global position, document masked with qdoc).
 * Collective over the comm. A comm failure returns its status with one
 * line ("cp ring rank 1/4, step 2 (lower): wait for the K,V block from
 * rank 0: ..."); the job is then lost (a neighbour may wait forever): the
 * caller ends it, as after pipe_run's failures. st may be NULL. */
status_t cp_ring_forward(cp_ring_t *r, float *out, float *lse, const float *qkv, const int32_t *qdoc,
                         cp_ring_stats_t *st, char *err, size_t errlen);

/* dqkv[B*L, (NH+2NKV)*HS] written (q columns: this rank's queries' dq; k
 * and v columns: the full gradient of this rank's K,V, summed over every
 * rank's queries), from dout[B*L, NH*HS] and the forward's final out and
 * lse. Collective; errors as cp_ring_forward. */
status_t cp_ring_backward(cp_ring_t *r, float *dqkv, const float *dout, const float *qkv, const float *out,
                          const float *lse, const int32_t *qdoc, cp_ring_stats_t *st, char *err, size_t errlen);

#endif
