/* The training run: model, optimizer, data and the step loop. */
#ifndef DTRAIN_TRAIN_H
#define DTRAIN_TRAIN_H

#include <stdio.h>

#include "io/tokenizer.h"
#include "mpi/dpsync.h"
#include "mpi/grid.h"
#include "mpi/launch.h"
#include "mpi/lostpeer.h"
#include "mpi/pipeline.h"
#include "src/backend/backend.h"
#include "src/backend/ops_cpu.h"
#include "src/data/data.h"
#include "src/model/model.h"
#include "src/optim/optim.h"
#include "src/train/eval_mc.h"
#include "src/train/metrics.h"
#include "src/train/options.h"
#include "src/train/spike.h"

typedef struct trainer {
    const run_config_t *run;  /* the resolved run (options_resolve) */
    const run_options_t *opt; /* run->opt: what is used as given */
    const launch_env_t *env;
    grid_t *grid; /* the step loop's groups: &net once setup has opened them */
    grid_t net;   /* the caller's grid, with NCCL twins under --comm nccl (backend_comm_open) */
    /* the caller's MPI world (its grid's; MPI also under --comm nccl): where
     * the ranks agree (mpi/agree.h) and the world statistics are reduced */
    comm_t *world;
    backend_t backend; /* --device: the ops table (rank 0's choice is in the banner) */
    ops_graph_counts_t graph0; /* --cuda-graphs: the graph table's counts after the first step */
    model_config_t cfg;
    model_t model;
    adamw_t optim;
    dpsync_t sync; /* the data-parallel strategy (--zero, --hybrid-shard, --ddp-mode) */
    lr_schedule_t sched;
    spike_t spike; /* --spike-*: skipped steps, rollbacks and the data position after them */
    data_loader_t train, val;
    int has_val;
    mc_eval_t mc;                      /* --eval-mc's files (mc.n 0: none) */
    int accum;                         /* microbatches per optimizer step */
    int start_step;                    /* steps already done (a resumed checkpoint's) */
    int steps_done;                    /* optimizer steps completed so far */
    int stopped_by;                    /* the signal (SIGUSR1, SIGTERM) that stopped the run early, else 0 */
    int last_ckpt_step;                /* the step of the last checkpoint this run wrote, else -1 */
    char last_ckpt[OPT_PATH_MAX + 64]; /* and its path */
    pipe_kind_t pp_kind;
    int tied; /* table index of the tied wte (GPT-2, pp > 1, first/last stage), else -1 */
    /* --offload with tied: where its gradients lie in the optimizer view's
     * [tied_lo, tied_hi): final only after their sum over the stages, so
     * their copy waits for it (trainer_grads_final) */
    size_t tied_lo, tied_hi;
    /* the step in progress, for the pipeline's forward/backward callbacks */
    int cur_step;
    int bwd_done[PARAM_MAX_RUNS];       /* this step's (whole or weight) backwards so far, per chunk of the stage */
    int bwd_input_done[PARAM_MAX_RUNS]; /* ... and input backwards (zb-h1's B) */
    double loss_sum;
    /* MoE layers: the step's routing statistics per model layer
     * ([n_layer][MOE_STAT_N], summed over the world), reported by step_stats */
    double *moe_layer;
    /* the MoE layers' expert bias [n_layer][E] (model_moe_has_bias: every
     * layer's, alike on every rank; dense layers' rows stay 0), moved
     * after each step by --moe-bias-rate, saved in checkpoints; then
     * [n_layer][E] more, the copy an asynchronous checkpoint writes */
    float *moe_bias;
    double embed_comm_s; /* this step's tied-embedding all-reduce */
    int threads;
    double flops_token; /* model FLOPs per token */
    double peak_gflops; /* per rank; raised to a step's rate when a step beats it */
    char peak_how[256]; /* how the peak was found, for the banner */
    int peak_rebased;   /* a step beat the peak (said once) */
    FILE *metrics;
    trace_t *trace;     /* --trace: this rank's spans */
    watchdog_t *watch;  /* --comm-timeout: marks every blocking call of the grid's groups */
    lostpeer_t *lost;   /* with the watchdog: names the ranks gone when the launcher ends the job */
    int32_t *tok, *tgt; /* host batch [B*T] */
    /* --cp: this rank's rows of the batch, [B*T/cp] each: its two chunks
     * of every sequence (mpi/cp_sched.h), with their positions (global, or
     * the documents' under --doc-mask); NULL without --cp */
    int32_t *ltok, *ltgt, *lpos;
    /* --doc-mask: the batch's document positions [B*T] (src/model/docmask.h), the
     * boundary tokens they come from (-1: none), and this step's sum of
     * squared document lengths over its tokens, for the MFU */
    int32_t *pos, doc_start, doc_end;
    double doc_sq, doc_tok;
    /* the sample's tokenizer (--tokenizer; NULL: ids are printed), where
     * it came from (for the banner), and the sample's first tokens: the
     * tokenizer's document start, then the encoded --prompt */
    tokenizer_t *tokenizer;
    char tokenizer_from[OPT_PATH_MAX + 128];
    /* the data's tokenizer (its spec and vocabulary sha256, from --tokenizer
     * or the data's sidecar; "" when unknown), recorded in checkpoints and
     * --save-params files so that dreshard --to-hf can add its files */
    char data_tokenizer[TOK_PATH_MAX], data_tokenizer_sha256[65];
    tok_ids_t prompt_ids;
    /* host copies of parameters and AdamW moments for checkpoint I/O,
     * [table.numel] each: made at the first save or load and kept, since
     * fresh memory costs more to fault in than the file costs to write */
    float *host_p, *host_m, *host_v;
    /* --ckpt-async: the background writer and its host copies, else NULL */
    struct ckpt_async *ckpt_async;
    /* seconds the checkpoints since the last step record held training up
     * (its ckpt_stall_ms) */
    double ckpt_stall_s;
    /* seeing a run: --tensorboard (rank 0's writer, else NULL), the recent
     * step times for the step line's time left, --straggler-every */
    tfevents_t *tb;
    step_eta_t eta;
    straggler_t strag;
} trainer_t;

/* --threads 0: OMP_NUM_THREADS when set, else this node's cores shared by
 * the ranks on it (at most the cores this rank may run on); requested > 0
 * as given. Local (dtrain-serve takes the same default). */
int trainer_default_threads(int requested, const launch_env_t *env);

/* Everything the run needs, on the grid run was resolved for; on failure
 * err holds one line. Local to this rank: the caller agrees on failure
 * across ranks. */
int trainer_setup(trainer_t *tr, const run_config_t *run, const launch_env_t *env, grid_t *grid, char *err,
                  size_t errlen);
/* Collective (prints the grid); rank 0 writes. */
void trainer_banner(const trainer_t *tr, FILE *out);
/* Collective over the DP group: 0 when all replicas hold identical
 * parameters, else -1 with the first differing tensor in err. */
int trainer_check_replicas(trainer_t *tr, int step, char *err, size_t errlen);
/* *norm: the global gradient norm, every logical parameter counted once
 * (non-finite when a gradient is: a value the spike guard judges).
 * Collective over TP, PP and the norm group; STATUS_FAIL with the
 * communicator's message in err when a reduction failed. */
int trainer_grad_norm(trainer_t *tr, double *norm, char *err, size_t errlen);
/* The step loop, validation and the final sample. A SIGUSR1 or SIGTERM
 * (launch_stop_signal on any rank) ends the loop at the next step boundary
 * with a checkpoint (with --ckpt-dir) and returns 0 with stopped_by set:
 * the run is to be continued by a later job with --resume auto. */
int trainer_run(trainer_t *tr, char *err, size_t errlen);
/* *loss: the mean loss over --val-batches microbatches of the validation
 * set (split over the data-parallel ranks; non-finite is a value). Collective
 * over the world; -1 with err on every rank when a forward or a collective
 * failed on any. */
int trainer_val_loss(trainer_t *tr, double *loss, char *err, size_t errlen);
void trainer_teardown(trainer_t *tr);

#endif
