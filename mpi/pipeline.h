/* Pipeline parallelism: the order in which one stage runs the forwards and
 * backwards of a step's microbatches (the schedule), and the executor that
 * runs it while exchanging activations (downstream, stage s -> s+1) and
 * their gradients (upstream, s+1 -> s) with the neighbouring stages.
 * Model-agnostic: a stage is a set of callbacks over flat buffers of n
 * floats, so the tests drive it with a synthetic elementwise model.
 *
 * Schedules, for stage s of P stages and M microbatches (any M >= 1; the
 * training loop also requires M >= P, since fewer leaves stages idle):
 *   1f1b   Megatron's non-interleaved schedule. Warm-up: min(P-s-1, M)
 *          forwards; steady: one forward then one backward until every
 *          forward has run; cool-down: the remaining backwards. At most
 *          min(P-s, M) microbatches hold activations at once (the first
 *          stage holds the most).
 *   gpipe  all M forwards, then all M backwards in increasing microbatch
 *          order (forward order: the last stage can start the backward of
 *          microbatch 0 at once, and messages stay FIFO). All M hold
 *          activations at once.
 * Forwards and backwards each run in increasing microbatch order on every
 * stage, so the messages between two neighbours arrive in the order the
 * receiver consumes them (MPI does not overtake messages of one source,
 * tag and communicator).
 *
 * Activation slots: microbatch m uses slot m % pipe_slots() from its
 * forward to the end of its backward. A slot is reused only after the
 * backward of its previous microbatch. */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include <stddef.h>

#include "base/ops.h"
#include "mpi/comm.h"

typedef enum { PIPE_1F1B = 0, PIPE_GPIPE } pipe_kind_t;
/* The names of pipe_kind_t, indexed by it, NULL-terminated (--pp-schedule). */
extern const char *const pipe_kind_names[];
typedef enum { PIPE_FWD = 0, PIPE_BWD } pipe_op_t;

typedef struct pipe_action {
    pipe_op_t op;
    int micro; /* microbatch index, 0..M-1 */
    int slot;  /* activation slot: micro % pipe_slots() */
} pipe_action_t;

/* "1f1b" / "gpipe" -> *k, 0; -1 for anything else (*k untouched). */
int pipe_kind_parse(const char *s, pipe_kind_t *k);
/* "1f1b" / "gpipe" */
const char *pipe_kind_name(pipe_kind_t k);

/* Activation slots stage `stage` (0..n_stages-1) needs, the most
 * microbatches it holds at once: 1f1b min(n_micro, n_stages - stage),
 * gpipe n_micro. 0 for arguments out of range. */
int pipe_slots(pipe_kind_t k, int n_stages, int stage, int n_micro);

/* Fills out[0 .. 2*n_micro-1] with the stage's actions in order; returns
 * their number (2*n_micro), or -1 for arguments out of range. */
int pipe_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out);

/* One stage, as the executor sees it. The buffers belong to the caller. */
typedef struct pipe_stage_ops {
    /* Forward of microbatch `micro` into activation slot `slot`; on a
     * non-first stage its input is already in input(slot). Must not write
     * grad(): a gradient receive may be in flight into it. 0 or -1. */
    int (*forward)(void *ctx, int micro, int slot);
    /* Backward of that microbatch; on a non-last stage dL/d(output) is
     * already in grad(); on exit grad() holds dL/d(input), which the
     * executor copies out and sends upstream from a non-first stage; from
     * then until the next backward the executor owns grad() (the next
     * gradient is received into it). The send of output(slot) has
     * completed on entry, so backward may use output(slot) as scratch;
     * input(slot) and output(slot) are free once it returns. 0 or -1. */
    int (*backward)(void *ctx, int micro, int slot);
    float *(*input)(void *ctx, int slot);  /* [n]: where a received activation goes (non-first stages) */
    float *(*output)(void *ctx, int slot); /* [n]: a forward's output, sent downstream (non-last stages) */
    float *(*grad)(void *ctx);             /* [n]: the shared gradient buffer */
    size_t n;                              /* floats per message, both directions */
    /* The backend whose memory grad() is in: the executor copies each
     * gradient out into its host send buffers with mem->to_host. NULL:
     * grad() is host memory. */
    const ops_t *mem;
} pipe_stage_ops_t;

typedef struct pipe_stats {
    /* seconds blocked in wait() on pipeline messages (receives of
     * activations and gradients, completions of sends whose buffer is
     * needed again): the stage's pipeline bubble plus exposed transfer */
    double wait_s;
} pipe_stats_t;

/* Runs one step's schedule on this stage. pp: the pipeline group (rank =
 * stage, size = stages). Collective over pp: every stage calls it with the
 * same kind, n_micro and n. Sends and receives are nonblocking, posted as
 * early as their buffers allow, and all complete before a successful
 * return. Allocates min(slots, 2) * n floats of host send buffers per call
 * (none on stage 0) and frees them before returning. st may be NULL.
 *
 * Returns a status (mpi/status.h) with one line in err (a failing
 * callback's own message is the caller's; err then names the action:
 * "pipeline stage 1/2: forward of microbatch 3 failed"). After a
 * failure the caller ends the job (MPI_Abort or an agreed exit): requests
 * a neighbour may never match are not waited for (that could hang), so
 * the executor's send buffers still in flight are left to MPI, and
 * receives may still land in input()/grad(). */
status_t pipe_run(comm_t *pp, pipe_kind_t k, int n_micro, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st,
                  char *err, size_t errlen);

#endif
