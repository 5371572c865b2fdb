/* Run options: one table drives the command line, the config file
 * (`key = value` lines, # comments, same keys as the long options without
 * the dashes), --help and validation. The command line overrides the file. */
#ifndef DTRAIN_OPTIONS_H
#define DTRAIN_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"
#include "mpi/comm.h"
#include "mpi/ddp.h"
#include "mpi/pipeline.h"
#include "src/backend/backend.h"
#include "src/model/model.h"
#include "src/model/model_config.h"
#include "src/optim/optim.h"

#define OPT_PATH_MAX 1024

/* --plan-dtype: the precision the planner assumes (auto: bf16 on GPU
 * profiles, fp32 on cpu; megatron: Megatron-LM's bf16 layout, for
 * comparison). The planner's option, declared here as --fsdp's is: the
 * planner (src/plan/) sits above the run options and reads them. */
typedef enum { PLAN_DTYPE_AUTO = 0, PLAN_DTYPE_FP32, PLAN_DTYPE_BF16, PLAN_DTYPE_MEGATRON } plan_dtype_t;
extern const char *const plan_dtype_names[]; /* indexed by plan_dtype_t, NULL-terminated; "" = auto */

/* --fsdp: PyTorch FSDP's names for ZeRO stages (options_fsdp_stage). */
typedef enum { FSDP_UNSET = 0, FSDP_NO_SHARD, FSDP_SHARD_GRAD_OP, FSDP_FULL_SHARD } options_fsdp_t;
extern const char *const options_fsdp_names[]; /* indexed by options_fsdp_t, NULL-terminated; "" = unset */

/* The parsed options, each as given (the enums by the name tables of
 * their owners' headers); options_resolve derives the run from them. */
/* --offload: what of the state lives in host memory (issue 36). */
typedef enum { OFFLOAD_NONE = 0, OFFLOAD_OPTIMIZER } options_offload_t;
extern const char *const options_offload_names[]; /* indexed by options_offload_t, NULL-terminated */

typedef struct run_options {
    char config[OPT_PATH_MAX];
    char model[64];
    /* model shape overrides; 0 = the preset's value */
    char arch[16];
    int n_layer, n_head, n_kv_head, d_model, d_ff, vocab_size, max_seq_len;
    /* --moe-*: the mixture of experts (moe_config_t), each overriding the
     * preset's where given (moe_given[MOE_OPT_*]) */
    int moe_experts, moe_top_k, moe_ffn, moe_every, moe_first_dense, moe_norm_topk, moe_shared_ffn, moe_shared_gate;
    char moe_router[16];
    double moe_aux_coef, moe_z_coef, moe_capacity, moe_bias_rate;
    int moe_given[13];
    /* parallel layout */
    int tp, pp, dp;
    int ep;  /* --ep: expert-parallel size, carved out of dp (1: none) */
    int etp; /* --etp: expert tensor-parallel size, 1 or tp (0: tp) */
    int cp;  /* --cp: context-parallel size (1: none) */
    int sequence_parallel;
    char pp_layers[256];
    pipe_kind_t pp_schedule;
    int pp_virtual; /* model chunks per stage (interleaved schedule) */
    ddp_mode_t ddp_mode;
    int zero; /* ZeRO stage; see options_zero_stage */
    options_fsdp_t fsdp;
    int hybrid_shard; /* shard group size (0 = the whole DP group) */
    double bucket_mb;
    options_offload_t offload;      /* --offload */
    double offload_fraction;        /* --offload-fraction: of the optimizer state, under --offload optimizer */
    comm_dtype_t grad_reduce_dtype; /* what the data-parallel gradient reductions send */
    comm_dtype_t tp_comm_dtype;     /* what the tensor-parallel activation collectives send */
    int tp_comm_overlap;            /* --tp-comm-overlap */
    int check_replicas;
    double comm_timeout;         /* seconds one communication call may block before the job is ended (0 = never) */
    model_recompute_t recompute; /* activation recomputation */
    /* --logits-chunk auto | whole | ROWS as given, and resolved at parsing
     * into model_layout_t's logits_chunk (MODEL_LOGITS_AUTO, _WHOLE, rows) */
    char logits_chunk_arg[16];
    int logits_chunk;
    /* schedule and batch */
    int steps, micro_batch, global_batch, seq_len;
    double lr, min_lr;
    int warmup;
    double weight_decay, grad_clip, beta1, beta2, adam_eps;
    long long seed;
    /* the LR schedule's kind and decay (src/optim/optim.h) and the loss-spike
     * guard (src/train/spike.h): see check_schedule_spike in options.c */
    char lr_schedule[16], decay_shape[16];
    int decay_steps;
    lr_schedule_t
        sched; /* checked and derived by options_parse from the three above and --lr, --min-lr, --warmup, --steps */
    double spike_z;
    int spike_window, spike_max, spike_rollbacks;
    /* data */
    char data[OPT_PATH_MAX], val_data[OPT_PATH_MAX];
    tokens_format_t data_format;
    int val_every, val_batches;
    /* --eval-mc FILE (repeatable): multiple-choice eval files, joined by ','
     * (the form the banner and a --config file show) */
    char eval_mc[OPT_PATH_MAX];
    int eval_every;                  /* --eval-every N: score them every N steps and at the end */
    char eval_mc_dump[OPT_PATH_MAX]; /* --eval-mc-dump FILE: rank 0 appends each example's scores (JSONL) */
    int doc_mask;                    /* --doc-mask: attention within documents (src/model/docmask.h) */
    /* output */
    char metrics[OPT_PATH_MAX];
    char trace[OPT_PATH_MAX];
    /* seeing a run: TensorBoard event files (io/tfevents.h), the slowest rank (src/train/straggler.h) */
    char tensorboard[OPT_PATH_MAX]; /* --tensorboard DIR: rank 0's event file, "" = none */
    int straggler_every;            /* name the slowest rank every N steps (0 = never) */
    char save_params[OPT_PATH_MAX];
    char ckpt_dir[OPT_PATH_MAX], resume[OPT_PATH_MAX];
    char init_from[OPT_PATH_MAX]; /* --init-from: a Hugging Face directory or an llm.c file (src/convert/hf_import.h) */
    int model_set;                /* --model was given (command line or config file), not defaulted */
    int ckpt_every, keep, stop_at_step;
    int ckpt_async; /* --ckpt-async: checkpoints written by a background thread (src/ckpt/ckpt_async.h) */
    int sample_tokens, top_k;
    int sample_given; /* --sample-tokens was given (else 0 under --cp) */
    double temperature;
    char prompt[512];
    char tokenizer[OPT_PATH_MAX]; /* the sample's: auto | none | a tokenizer spec (io/tokenizer.h) */
    int threads;
    double peak_gflops;
    /* --plan: print the memory, compute and communication plan and exit
     * (src/plan/plan.h); the options below are the planner's alone */
    int plan, search;
    int gpus;              /* total devices (0 = --dp or the world size) */
    char hw[OPT_PATH_MAX]; /* profile name or key = value file ("" = h100-sxm) */
    plan_dtype_t plan_dtype;
    double gpu_mem;   /* device memory in GiB (0 = the profile's) */
    int plan_doc_len; /* --doc-mask's mean document length in tokens (0 = one document per sequence) */
    /* backend */
    backend_device_t device;
    backend_dtype_t dtype; /* GEMM precision */
    backend_comm_t comm;   /* the collectives' library */
    int cuda_graphs;       /* --cuda-graphs: the CUDA table under the graph table (backend_use_graphs) */
    int selftest;          /* --selftest: compare every CUDA op with the CPU op, exit */
} run_options_t;

typedef enum {
    OPTIONS_OK = 0,
    OPTIONS_EXIT_OK = 1, /* --help / --version printed: exit 0 */
    OPTIONS_ERROR = 2    /* err holds one line: exit 2 */
} options_status_t;

/* Parses argv (and the --config file it names) into o. Never prints except
 * --help/--version text (to out, only when print is set: rank 0). */
options_status_t options_parse(run_options_t *o, int argc, char **argv, int print, char *err, size_t errlen);

/* The ZeRO stage --zero or --fsdp asks for (0..3). */
int options_zero_stage(const run_options_t *o);

/* Resolves --model plus the shape overrides into a model config; under
 * --init-from, the file's model (an explicit option that disagrees with
 * it is an error). */
int options_model_config(const run_options_t *o, model_config_t *c, char *err, size_t errlen);

/* The layout checks that depend on the model alone (not on the run's
 * batch or options): --tp divides the heads, KV heads and FFN width, --pp
 * at most the layers. One line in err on failure. Part of
 * options_resolve; dreshard checks a target layout with it. */
int options_check_grid(const model_config_t *c, int tp, int pp, char *err, size_t errlen);

/* The run as the components need it, resolved once from the options
 * before training's first collective and not changed after: the layout,
 * the batch, the per-stage layer split and every choice as its owner's
 * enum. Each component takes its part (trainer_setup all of it, the
 * planner one per layout it plans). */
#define RUN_MAX_STAGES 4096
typedef struct run_config {
    const run_options_t *opt; /* what is used as given: paths, schedule, sampling, output */
    model_config_t model;
    /* layout */
    int tp, pp, dp;
    int ep; /* the EP group's size (dividing dp and the experts); 1: none */
    /* the experts' TP size: tp (split as the dense MLP) or 1 (whole
     * experts, the EP group then carved out of the TP x DP plane and
     * each TP rank routing 1/tp of the tokens: run_config_ep_spans_tp) */
    int etp;
    /* context parallelism: each sequence over cp ranks (dp above is the
     * ranks drawing distinct data; the grid's DP axis holds dp x cp) */
    int cp;
    int sequence_parallel;
    int zero_stage;   /* --zero or --fsdp */
    int hybrid_shard; /* the ZeRO shard group's size when below dp (HSDP), else 0 */
    int shard;        /* the ZeRO state's shard group: hybrid_shard, or dp */
    /* batch: global_batch = accum x micro_batch x dp sequences per step */
    int micro_batch, seq_len, accum, global_batch;
    int stage_layers[RUN_MAX_STAGES]; /* [pp] blocks of pipeline stage s */
    /* [pp * pp_virtual] blocks of model chunk c, held by stage c % pp (the
     * interleaved schedule's virtual stages; pp_virtual 1: stage_layers) */
    int chunk_layers[RUN_MAX_STAGES];
    int pp_virtual;
    /* the components' choices */
    pipe_kind_t pp_kind;
    model_recompute_t recompute;
    int logits_chunk; /* the last stage's classifier (model_layout_t's) */
    ddp_mode_t ddp_mode;
    comm_dtype_t grad_dtype;
    comm_dtype_t tp_dtype; /* --tp-comm-dtype */
    /* --tp-comm-overlap: a column-parallel matmul's input-gradient
     * collective runs beside its weight-gradient GEMM (model_layout_t's) */
    int tp_overlap;
    /* --offload optimizer: the fraction of each rank's optimizer elements
     * (moments and fp32 master weights) kept in host memory; 0: none */
    double offload_fraction;
    backend_device_t device;
    backend_dtype_t dtype;
    backend_comm_t comm;
    tokens_format_t data_format;
    lr_schedule_t sched; /* --lr-schedule, --decay-steps, --decay-shape over --lr, --min-lr, --warmup, --steps */
} run_config_t;

/* The run of o on a tp x pp x dp grid. Returns 0, or -1 with one line in
 * err (the same on every rank: a model that does not fit the layout, a
 * batch that does not divide, a bad --pp-layers ...). */
int options_resolve(const run_options_t *o, int tp, int pp, int dp, run_config_t *rc, char *err, size_t errlen);

/* The same for a model already resolved (the planner's layouts). */
int options_resolve_layout(const run_options_t *o, const model_config_t *c, int tp, int pp, int dp, run_config_t *rc,
                           char *err, size_t errlen);

/* The first block of pipeline stage s (of its first chunk). */
int run_config_stage_begin(const run_config_t *rc, int s);
/* The runs of blocks stage s holds, one per chunk, as a layout's
 * (param_layout_t's n_runs, run_begin, run_end). */
/* --etp 1 at tp > 1: whole experts, the EP group spanning TP ranks. */
int run_config_ep_spans_tp(const run_config_t *rc);
/* --offload optimizer with the whole state offloaded (fraction 1), a run
 * computing in bf16, and every block's parameters held (ZeRO 0-2): the
 * fp32 weights live in host memory as the optimizer's master copy and the
 * device keeps their bf16 copy (model_layout_t params_host). */
int run_config_weights_on_host(const run_config_t *rc, int bf16);
void run_config_stage_runs(const run_config_t *rc, int s, int *n_runs, int *begin, int *end);
/* The schedule's shape for one step. */
pipe_shape_t run_config_pipe_shape(const run_config_t *rc);

/* Writes every option as `key = value` lines (the banner and metrics). */
void options_print(const run_options_t *o, void *file);

#endif
