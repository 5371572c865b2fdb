/* Pipeline parallelism: the order in which one stage runs the forwards and
 * backwards of a step's microbatches, and the executor that runs it while
 * exchanging activations (downstream) and their gradients (upstream) with
 * the neighbouring stages. Model-agnostic: a stage is a set of callbacks
 * over flat buffers of n floats.
 *
 * Schedules, for stage s of P and M microbatches:
 *   1f1b   warm-up: min(P-s-1, M) forwards; steady: one forward then one
 *          backward until every forward is done; cool-down: the remaining
 *          backwards. At most min(P-s, M) microbatches hold activations.
 *   gpipe  all M forwards, then all M backwards in microbatch order. All M
 *          hold activations at once.
 * Forwards and backwards each run in increasing microbatch order on every
 * stage, so the messages between two neighbours arrive in the order their
 * receiver wants them. */
#ifndef DTRAIN_PIPELINE_H
#define DTRAIN_PIPELINE_H

#include <stddef.h>

#include "comm.h"

typedef enum { PIPE_1F1B = 0, PIPE_GPIPE } pipe_kind_t;
typedef enum { PIPE_FWD = 0, PIPE_BWD } pipe_op_t;

typedef struct pipe_action {
    pipe_op_t op;
    int micro; /* microbatch index, 0..M-1 */
    int slot;  /* activation slot: micro % pipe_slots() */
} pipe_action_t;

/* "1f1b" / "gpipe" -> kind; -1 otherwise. */
int pipe_kind_parse(const char *s, pipe_kind_t *k);

/* Activation slots stage `stage` needs: the most microbatches in flight. */
int pipe_slots(pipe_kind_t k, int n_stages, int stage, int n_micro);

/* Fills out[2*n_micro] with the stage's actions in order; returns their
 * number. */
int pipe_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out);

/* One stage, as the executor sees it. */
typedef struct pipe_stage_ops {
    /* Forward of microbatch `micro` into activation slot `slot`; on a
     * non-first stage its input is already in input(slot). 0 or -1. */
    int (*forward)(void *ctx, int micro, int slot);
    /* Backward of that microbatch; on a non-last stage dL/d(output) is
     * already in grad(); on exit grad() holds dL/d(input) (sent upstream
     * from a non-first stage). 0 or -1. */
    int (*backward)(void *ctx, int micro, int slot);
    float *(*input)(void *ctx, int slot);  /* [n]: where a received activation goes */
    float *(*output)(void *ctx, int slot); /* [n]: a forward's output, sent downstream */
    float *(*grad)(void *ctx);             /* [n]: the shared gradient buffer */
    size_t n;                              /* floats per message */
} pipe_stage_ops_t;

typedef struct pipe_stats {
    double wait_s; /* blocked waiting for a neighbour: receives and send completions */
} pipe_stats_t;

/* Runs one step's schedule on this stage. pp: the pipeline group (rank =
 * stage, size = stages). Collective over pp. Every send is nonblocking and
 * completed before return. Returns 0, or -1: a callback's failure, or a
 * communication failure with one line in pp->err. */
int pipe_run(comm_t *pp, pipe_kind_t k, int n_micro, const pipe_stage_ops_t *ops, void *ctx, pipe_stats_t *st);

#endif
