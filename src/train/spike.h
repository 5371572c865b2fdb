/* Loss spikes and non-finite steps (--spike-z, --spike-window, --spike-max).
 *
 * After a step's loss and gradient norm are known, every rank judges it:
 * non-finite loss or norm, or a loss more than z standard deviations above
 * the mean of the last `window` accepted losses (judged once the window
 * holds SPIKE_MIN_COUNT of them, or all of a smaller window). The ranks
 * decide together with one all-reduce (max) of their verdicts over the
 * world, so no rank skips alone. A skipped step changes nothing: its
 * gradients are discarded, AdamW's step counter stays, the window does not
 * take its loss. After `max` skips in a row the trainer goes back to its
 * last checkpoint and reads the batches after the skipped ones
 * (data_skip); max 0 turns the guard off: a non-finite step ends the run.
 *
 * Test-only injection (never for real runs; read once by spike_init from
 * the environment, named so that no one sets them by accident):
 *   DTRAIN_TEST_INJECT_NAN=B[,B...]        the gradients of data batch B
 *                                          (1-based: step B of a run that
 *                                          skipped nothing) turn inf/nan
 *                                          on data-parallel rank 0 (its
 *                                          backward's loss scale is inf)
 *   DTRAIN_TEST_INJECT_SPIKE=B:F[,B:F...]  batch B's loss on data-parallel
 *                                          rank 0 is multiplied by F (F may
 *                                          be nan or inf)
 * Keyed by the data position, not the step, a bad batch stays bad where a
 * rollback reads it again and is left behind where it skips it. */
#ifndef DTRAIN_SPIKE_H
#define DTRAIN_SPIKE_H

#include <stddef.h>
#include <stdint.h>

#include "mpi/comm.h"
#include "mpi/dpsync.h"
#include "src/model/params.h"

#define SPIKE_MIN_COUNT 10 /* accepted losses before the z test judges */
#define SPIKE_MAX_INJECT 16
#define SPIKE_WINDOW_MAX 1024 /* --spike-window's bound: the window travels in a checkpoint attribute */
/* spike_state_format's text: a header, then 17 characters a loss */
#define SPIKE_STATE_LEN (64 + 17 * SPIKE_WINDOW_MAX)

/* The world's verdict on a step, in the order the max reduction ranks them. */
typedef enum { SPIKE_UPDATE = 0, SPIKE_HIGH = 1, SPIKE_NONFINITE = 2 } spike_verdict_t;
/* indexed by spike_verdict_t: "update", "loss_spike", "nonfinite" (the
 * --metrics "skipped" reasons) */
extern const char *const spike_verdict_names[];

/* What the step does. */
typedef enum { SPIKE_GO = 0, SPIKE_SKIP, SPIKE_ROLLBACK } spike_action_t;

typedef struct spike {
    double z;                /* 0: no z test */
    int window, max;         /* window 0: no z test; max 0: the guard is off */
    double *loss;            /* [window] ring of accepted losses */
    int n, head;             /* losses held, next slot */
    spike_verdict_t verdict; /* the world's verdict on the last step judged */
    int in_row;              /* consecutive skipped steps */
    int first_skipped;       /* 1-based step of the first of them */
    long long data_skip;     /* batches passed over by rollbacks: step s reads batch s + data_skip */
    long long skipped;       /* steps skipped in this job */
    int rolled_back;         /* set by the trainer's rollback, for its step loop */
    int rollbacks;           /* rollbacks since the newest checkpoint was written (--spike-rollbacks) */
    int max_rollbacks;       /* --spike-rollbacks */
    /* test-only injection (see above): 1-based batches */
    long long nan_batch[SPIKE_MAX_INJECT], spike_batch[SPIKE_MAX_INJECT];
    double spike_factor[SPIKE_MAX_INJECT];
    int n_nan, n_spike;
} spike_t;

/* Returns 0, or -1 with one line in err (out of memory, a malformed
 * injection variable). */
int spike_init(spike_t *s, double z, int window, int max, char *err, size_t errlen);
void spike_free(spike_t *s);

/* Empties the window and the run of skips. */
void spike_reset(spike_t *s);

/* The state a checkpoint records so that a resumed run decides as an
 * uninterrupted one: "1 IN_ROW FIRST_SKIPPED N" and the window's N
 * accepted losses, oldest first, each the 16 hex digits of its IEEE-754
 * bits (exact). buf holds SPIKE_STATE_LEN. */
void spike_state_format(const spike_t *s, char *buf, size_t len);

/* Restores what spike_state_format wrote (the newest --spike-window
 * losses of it when this run's window is smaller). Returns 0, or -1 with
 * one line in err (a malformed text), s then emptied. */
int spike_state_parse(spike_t *s, const char *text, char *err, size_t errlen);

/* The step's context for spike_check: who this rank is and where its
 * gradients' norm pieces are (the location of a non-finite value). */
typedef struct spike_ctx {
    comm_t *world;
    int world_rank, tp_rank, pp_rank, dp_rank;
    const dpsync_t *sync; /* norm_ss of this step's trainer_grad_norm */
    const param_table_t *table;
} spike_ctx_t;

/* Collective over world. Judges step `step` (1-based) of `steps`, logs a
 * skip on rank 0 and returns the action in *act. With max 0 a non-finite
 * step is an error (the old "training diverged" line). Returns 0, or -1
 * with one line in err. */
int spike_check(spike_t *s, const spike_ctx_t *c, int step, int steps, double loss, double norm, spike_action_t *act,
                char *err, size_t errlen);

/* Test-only injection for 0-based batch `batch`, microbatch `micro` on
 * data-parallel rank dp_rank: the loss scale of the backward (inf when
 * injected) and the microbatch's loss (times the factor). */
float spike_test_dloss(const spike_t *s, int64_t batch, int micro, int dp_rank, float dloss);
float spike_test_loss(const spike_t *s, int64_t batch, int micro, int dp_rank, float loss);

#endif
