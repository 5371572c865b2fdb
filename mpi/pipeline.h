/* Pipeline parallelism: the order in which one stage runs the forwards and
 * backwards of a step's microbatches (the schedule), and the executor that
 * runs it while exchanging activations (downstream, stage s -> s+1) and
 * their gradients (upstream, s+1 -> s) with the neighbouring stages.
 * Model-agnostic: a stage is a set of callbacks over flat buffers of n
 * floats, so the tests drive it with a synthetic elementwise model.
 *
 * Schedules, for stage s of P stages and M microbatches (any M >= 1; the
 * training loop also requires M >= P, since fewer leaves stages idle).
 * pipe_run executes every kind (test/test_pipeline.c); test/test_pipe_sched.c
 * checks the schedules themselves through pipe_simulate:
 *   1f1b   Megatron's non-interleaved schedule. Warm-up: min(P-s-1, M)
 *          forwards; steady: one forward then one backward until every
 *          forward has run; cool-down: the remaining backwards. At most
 *          min(P-s, M) microbatches hold activations at once (the first
 *          stage holds the most).
 *   gpipe  all M forwards, then all M backwards in increasing microbatch
 *          order (forward order: the last stage can start the backward of
 *          microbatch 0 at once, and messages stay FIFO). All M hold
 *          activations at once.
 *   interleaved  Megatron's interleaved 1F1B over V >= 2 chunks per stage
 *          (virtual stages): the model is cut into C = P*V chunks and
 *          stage s holds chunks s, s+P, ..., s+(V-1)P, so chunk c's output
 *          goes to stage (c+1) % P (stage P-1 wraps around to stage 0).
 *          The stage's k-th forward (k = 0 .. V*M-1) is microbatch
 *          (k / (P*V))*P + k % P of local chunk (k % (P*V)) / P: groups of
 *          P microbatches per chunk, chunks ascending; the k-th backward is
 *          the same with local chunks descending. Warm-up:
 *          min(2(P-s-1) + (V-1)P, V*M) forwards, then one forward one
 *          backward, then the remaining backwards. Needs M % P == 0 (as
 *          Megatron does). At most min(warm-up + 1, V*M) chunk-microbatches
 *          hold activations at once, each a chunk's (1/V of a stage's).
 *   zb-h1  Zero Bubble's handcrafted H1 (Qi et al. 2024): the backward
 *          split into B (dL/d(input), on the critical path, sent upstream)
 *          and W (dL/d(weights), local). 1f1b's warm-up and forward/B
 *          alternation; each B after the first s of the stage is followed
 *          by the W of the oldest microbatch still waiting for it, the
 *          rest run at the end. Between F and B at most min(P-s, M)
 *          microbatches (1f1b's); between F and W at most min(P, M) on
 *          every stage (1f1b's first stage, the peak the paper keeps).
 *   zbv    Zero Bubble's ZB-V (section 6; PyTorch's ScheduleZBVZeroBubble
 *          order), V = 2, B and W split: stage s holds chunks s and
 *          2P-1-s, so the chunks run down the stages and back up, the last
 *          stage turns around locally and stage 0 computes the loss.
 *          Warm-up: 2(P-s)-1 forwards of chunk 0, s pairs F1 F0, P-s
 *          triples F1 B1 W1; steady F0 B0 W0 F1 B1 W1; cool-down s pairs
 *          B0 B1, P-s pairs B0 W0, then the Ws left. At most
 *          min(2P, 2M, M+s+1) chunk-microbatches (P stage-microbatches
 *          once M >= 2P-1: 1f1b's stage 0) between F and W.
 * Forwards and backwards of a chunk run in increasing microbatch order on
 * every stage (interleaved: in one common (chunk, microbatch) order), and
 * every link carries one chunk boundary's messages or, interleaved, the
 * boundaries in that common order, so the messages between two stages
 * arrive in the order the receiver consumes them (MPI does not overtake
 * messages of one source, tag and communicator).
 *
 * Activation slots: microbatch m uses a slot from its forward to the end
 * of its backward (full backward, or W when split). 1f1b, gpipe and zb-h1:
 * slot m % pipe_slots(); interleaved and zbv: the lowest slot free at the
 * forward.
 * A slot is reused only after its previous holder's backward. */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include <stddef.h>

#include "base/ops.h"
#include "mpi/comm.h"

typedef enum { PIPE_1F1B = 0, PIPE_GPIPE, PIPE_INTERLEAVED, PIPE_ZBH1, PIPE_ZBV } pipe_kind_t;
#define PIPE_N_KINDS 5
/* The names of the kinds pipe_run executes, indexed by pipe_kind_t,
 * NULL-terminated: --pp-schedule's values ("1f1b", "gpipe"). */
extern const char *const pipe_kind_names[];
/* PIPE_BWD is a whole backward (B and W in one action: the non-split
 * schedules); zb-h1 and zbv have PIPE_BWD_INPUT (B) and PIPE_BWD_WEIGHT (W). */
typedef enum { PIPE_FWD = 0, PIPE_BWD, PIPE_BWD_INPUT, PIPE_BWD_WEIGHT } pipe_op_t;

typedef struct pipe_action {
    pipe_op_t op;
    int micro; /* microbatch index, 0..M-1 */
    int slot;  /* activation slot, 0..pipe_stage_slots()-1 */
    int chunk; /* the stage's own chunk, 0..V-1 (0 unless interleaved or
                * zbv); its place in the model is pipe_chunk_of() */
} pipe_action_t;

/* A schedule's dimensions. */
typedef struct pipe_shape {
    pipe_kind_t kind;
    int stages; /* P */
    int virt;   /* V: chunks per stage; interleaved >= 2, zbv 2, the others 1 */
    int micro;  /* M */
} pipe_shape_t;

/* Any kind's name ("1f1b", "gpipe", "interleaved", "zb-h1", "zbv") -> *k, 0; -1
 * for anything else (*k untouched). */
int pipe_kind_parse(const char *s, pipe_kind_t *k);
/* The kind's name; "1f1b" for a value out of range. */
const char *pipe_kind_name(pipe_kind_t k);

/* 0 when the shape can be scheduled, else -1 with one line in err (err
 * may be NULL): "interleaved schedule: 6 microbatches is not a multiple
 * of the 4 pipeline stages (Megatron's microbatch groups)". */
int pipe_shape_check(const pipe_shape_t *sh, char *err, size_t errlen);
/* Actions in each stage's list: 3*V*M when the backward is split (zb-h1, zbv),
 * else 2*V*M; 0 for a shape pipe_shape_check rejects. */
int pipe_stage_actions(const pipe_shape_t *sh);
/* Where the stage's local chunk sits in the model: 0 .. P*V-1. */
int pipe_chunk_of(const pipe_shape_t *sh, int stage, int local);
/* The stage holding model chunk c (the inverse of pipe_chunk_of). */
int pipe_stage_of(const pipe_shape_t *sh, int c);
/* Activation slots the stage needs, the most chunk-microbatches it holds
 * at once (see the schedules above); 0 for arguments out of range. */
int pipe_stage_slots(const pipe_shape_t *sh, int stage);
/* Fills out[0 .. pipe_stage_actions()-1] with the stage's actions in
 * order; returns their number, or -1 for arguments out of range (or out of
 * memory: interleaved's and zbv's slot assignment allocates one int per slot). */
int pipe_stage_schedule(const pipe_shape_t *sh, int stage, pipe_action_t *out);

/* The one-chunk forms (V = 1), which the executor and the planner use:
 * pipe_stage_slots and pipe_stage_schedule of {k, n_stages, 1, n_micro}. */
int pipe_slots(pipe_kind_t k, int n_stages, int stage, int n_micro);
int pipe_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out);

/* Durations of one chunk's actions, in any unit: forward, B and W. A
 * whole backward (PIPE_BWD) takes b + w. */
typedef struct pipe_cost {
    double f, b, w;
} pipe_cost_t;

typedef struct pipe_sim {
    double makespan; /* the step: the last action's end */
    double bubble;   /* idle fraction: 1 - (busy time of all stages) / (P * makespan) */
    int *held_peak;  /* [P] or NULL: the most slots held at once (F to W or whole backward) */
    int *fb_peak;    /* [P] or NULL: the most chunk-microbatches between F and B (or whole backward) */
} pipe_sim_t;

/* Runs every stage's action list (acts[s][0 .. n_acts[s]-1], P = sh->stages)
 * on an ideal machine: each action starts when its stage is free and its
 * input is there, and takes its cost; messages take no time. Messages are
 * those pipe_run sends: after F of chunk c its output to the stage holding
 * c+1, after B (or the whole backward) of chunk c dL/d(input) to the stage
 * holding c-1; a chunk boundary inside one stage is no message. Each link
 * (sender, receiver, direction) is FIFO, as MPI's non-overtaking rule
 * makes it, so a receive takes the link's next message.
 *
 * Checks, each failing with one line in err and -1: every list has
 * pipe_stage_actions() actions of the kind's ops, each (chunk, microbatch)
 * has one F and one whole backward, or one B and one W, on its own stage;
 * F before B before W; a receive's next message on its link is the one it
 * needs ("message order"); every slot is in range, free at its F and
 * that microbatch's at B and W; and the run ends ("deadlock": no stage can
 * start its next action, each waits for a message not yet sent). On
 * success fills res; 0. Allocates O(P*V*M + P*P) and frees it. */
int pipe_simulate(const pipe_shape_t *sh, const pipe_action_t *const *acts, const int *n_acts, const pipe_cost_t *cost,
                  pipe_sim_t *res, char *err, size_t errlen);

/* One message of a stage's in-order plan (pipe_stage_transfers). */
typedef struct pipe_xfer {
    int send;    /* 1: this stage sends it, 0: receives it */
    int peer;    /* the other stage */
    int grad;    /* 1: a gradient (upstream), 0: an activation (downstream) */
    int micro;   /* its microbatch */
    int action;  /* index in this stage's action list of the action that
                  * produces it (send) or consumes it (receive) */
    int sender;  /* the sending stage */
    double time; /* when the ideal run sends it */
} pipe_xfer_t;

/* The messages stage `stage` sends and receives in one step of shape sh,
 * in the order a communicator with in-order point to point (comm.h's
 * `inorder`: NCCL) must see them posted: the order in which the ideal
 * machine of pipe_simulate (costs f = b = w = 1) sends them, ties between
 * stages broken by the sender. Every stage computes the same run, so the
 * two ends of each message place it alike, and the k-th message on each
 * link (sender, receiver) is the same at both ends whatever its kind.
 * pipeline.c explains why posting in this order cannot deadlock. A
 * boundary between two chunks of one stage is no message. *out: malloc'd,
 * the caller frees it. Returns the count, or -1 with one line in err. */
int pipe_stage_transfers(const pipe_shape_t *sh, int stage, pipe_xfer_t **out, char *err, size_t errlen);

/* One stage, as the executor sees it. The buffers belong to the caller.
 * chunk is the stage's own chunk (pipe_action_t's), 0 for the one-chunk
 * kinds; slot is the action's activation slot. */
typedef struct pipe_stage_ops {
    /* Forward of (chunk, micro) into activation slot `slot`; unless the
     * chunk is the model's first its input is already in input(slot). Must
     * not write grad(). On return output(slot) holds the chunk's output
     * (not read for the model's last chunk). 0 or -1. */
    int (*forward)(void *ctx, int chunk, int micro, int slot);
    /* Whole backward of (chunk, micro) (1f1b, gpipe, interleaved); unless
     * the chunk is the model's last, dL/d(output) is already in grad(); on
     * exit grad() holds dL/d(input) (not read for the model's first
     * chunk). input(slot) and output(slot) are free once it returns. */
    int (*backward)(void *ctx, int chunk, int micro, int slot);
    /* The split backward (zb-h1, zbv): B as backward, but the weight
     * gradients are left to W, which the same slot's data serves; the slot
     * is free once W returns. NULL where the stage cannot split: those
     * kinds are then refused. */
    int (*backward_input)(void *ctx, int chunk, int micro, int slot);
    int (*backward_weight)(void *ctx, int chunk, int micro, int slot);
    float *(*input)(void *ctx, int slot);  /* [n] */
    float *(*output)(void *ctx, int slot); /* [n] */
    float *(*grad)(void *ctx);             /* [n]: the shared gradient buffer */
    size_t n;                              /* floats per message, both directions */
    /* The backend whose memory input(), output() and grad() are in: the
     * executor moves messages through host buffers with its to_host and
     * from_host, or, on an in-order communicator (NCCL), through buffers
     * of the backend's own memory with its copy. NULL: they are host
     * memory. */
    const ops_t *mem;
} pipe_stage_ops_t;

typedef struct pipe_stats {
    /* seconds blocked in wait() on pipeline messages (receives of
     * activations and gradients): the stage's pipeline bubble plus exposed
     * transfer */
    double wait_s;
    /* host message buffers of n floats the executor held at most at once
     * (receives posted ahead, sends in flight) */
    int peak_buffers;
} pipe_stats_t;

/* Runs one step's schedule of shape sh on this stage. pp: the pipeline
 * group (rank = stage, size = sh->stages). Collective over pp: every stage
 * calls it with the same shape and n.
 *
 * Messages: after F of chunk c its output goes to the stage holding c+1,
 * after the (whole or B) backward of c dL/d(input) to the stage holding
 * c-1 (pipe_stage_of), through host buffers of n floats: the output is
 * copied out and sent at once (sends never wait for a buffer), and each
 * stage posts its receives in the order it consumes them, a few ahead, so
 * a wait blocks only on the message the next action needs, which every
 * link delivers in that order (pipeline.h's schedules; MPI's non-overtaking
 * rule). A chunk boundary inside the stage (zbv's turn) is a copy.
 * Deadlock-free whenever pipe_simulate accepts the schedule: a stage
 * blocks only on a message whose sender reaches it without waiting on the
 * blocked stage. All transfers complete before a successful return; the
 * buffers are allocated per call and freed (st->peak_buffers of them at
 * most). st may be NULL.
 *
 * Returns a status (mpi/status.h) with one line in err (a failing
 * callback's own message is the caller's; err then names the action:
 * "pipeline stage 1/2: forward of chunk 0 microbatch 3 failed"). After a
 * failure the caller ends the job (MPI_Abort or an agreed exit): requests
 * a neighbour may never match are not waited for (that could hang), and
 * their buffers are left to MPI. */
status_t pipe_run(comm_t *pp, const pipe_shape_t *sh, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st,
                  char *err, size_t errlen);

#endif
