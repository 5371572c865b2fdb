/* Run options: one table drives the command line, the config file
 * (`key = value` lines, # comments, same keys as the long options without
 * the dashes), --help and validation. The command line overrides the file. */
#ifndef DTRAIN_OPTIONS_H
#define DTRAIN_OPTIONS_H

#include <stddef.h>
#include <stdint.h>

#include "src/model_config.h"

#define OPT_PATH_MAX 1024

typedef struct run_options {
    char config[OPT_PATH_MAX];
    char model[64];
    /* model shape overrides; 0 = the preset's value */
    char arch[16];
    int n_layer, n_head, n_kv_head, d_model, d_ff, vocab_size, max_seq_len;
    /* parallel layout */
    int tp, pp, dp;
    int sequence_parallel;
    char pp_layers[256], pp_schedule[16];
    char ddp_mode[16];
    int zero;          /* ZeRO stage; see options_zero_stage */
    char fsdp[16];     /* "" or an FSDP sharding strategy name */
    int hybrid_shard;  /* shard group size (0 = the whole DP group) */
    double bucket_mb;
    char grad_reduce_dtype[8]; /* fp32 | bf16: what the data-parallel gradient reductions send */
    int check_replicas;
    double comm_timeout; /* seconds one communication call may block before the job is ended (0 = never) */
    char recompute[16]; /* activation recomputation: none | selective | full */
    /* schedule and batch */
    int steps, micro_batch, global_batch, seq_len;
    double lr, min_lr;
    int warmup;
    double weight_decay, grad_clip, beta1, beta2, adam_eps;
    long long seed;
    /* data */
    char data[OPT_PATH_MAX], val_data[OPT_PATH_MAX], data_format[16];
    int val_every, val_batches;
    int doc_mask;      /* --doc-mask: attention within documents (src/docmask.h) */
    /* output */
    char metrics[OPT_PATH_MAX];
    char trace[OPT_PATH_MAX];
    /* seeing a run: TensorBoard event files (io/tfevents.h), the slowest rank (src/straggler.h) */
    char tensorboard[OPT_PATH_MAX]; /* --tensorboard DIR: rank 0's event file, "" = none */
    int straggler_every;            /* name the slowest rank every N steps (0 = never) */
    char save_params[OPT_PATH_MAX];
    char ckpt_dir[OPT_PATH_MAX], resume[OPT_PATH_MAX];
    char init_from[OPT_PATH_MAX]; /* --init-from: a Hugging Face directory or an llm.c file (src/hf_import.h) */
    int model_set;                /* --model was given (command line or config file), not defaulted */
    int ckpt_every, keep, stop_at_step;
    int sample_tokens, top_k;
    double temperature;
    char prompt[512];
    char tokenizer[OPT_PATH_MAX]; /* the sample's: auto | none | a tokenizer spec (io/tokenizer.h) */
    int threads;
    double peak_gflops;
    /* --plan: print the memory, compute and communication plan and exit
     * (src/plan.h); the options below are the planner's alone */
    int plan, search;
    int gpus;                /* total devices (0 = --dp or the world size) */
    char hw[OPT_PATH_MAX];   /* profile name or key = value file ("" = h100-sxm) */
    char plan_dtype[16];     /* "" (bf16 on a GPU profile, fp32 on cpu) | fp32 | bf16 | megatron */
    double gpu_mem;          /* device memory in GiB (0 = the profile's) */
    /* backend */
    char device[8];    /* "auto" | "cpu" | "cuda" (see backend.h) */
    char dtype[8];     /* "auto" (bf16 on cuda, fp32 on cpu) | "fp32" | "bf16": GEMM precision */
    char comm[8];      /* "auto" | "mpi" | "nccl": the collectives' library (see backend.h) */
    int selftest;      /* --selftest: compare every CUDA op with the CPU op, exit */
} run_options_t;

typedef enum {
    OPTIONS_OK = 0,
    OPTIONS_EXIT_OK = 1,  /* --help / --version printed: exit 0 */
    OPTIONS_ERROR = 2     /* err holds one line: exit 2 */
} options_status_t;

/* Parses argv (and the --config file it names) into o. Never prints except
 * --help/--version text (to out, only when print is set: rank 0). */
options_status_t options_parse(run_options_t *o, int argc, char **argv, int print,
                               char *err, size_t errlen);

/* Resolves --model plus the shape overrides into a model config; under
 * --init-from, the file's model (an explicit option that disagrees with
 * it is an error). */
/* The ZeRO stage --zero or --fsdp asks for (0..3). */
int options_zero_stage(const run_options_t *o);
int options_model_config(const run_options_t *o, model_config_t *c, char *err, size_t errlen);

/* The layout checks that depend on the model alone (not on the run's
 * batch or options): --tp divides the heads, KV heads and FFN width, --pp
 * at most the layers. One line in err on failure. Part of
 * options_check_layout; dreshard checks a target layout with it. */
int options_check_grid(const model_config_t *c, int tp, int pp, char *err, size_t errlen);

/* Layout checks that need the model and the grid: one line in err on
 * failure, the same on every rank. */
int options_check_layout(const run_options_t *o, const model_config_t *c, int tp, int pp, int dp,
                         char *err, size_t errlen);

/* layers[s] = blocks of pipeline stage s (pp of them): --pp-layers, or
 * balanced. Returns 0, or -1 with one line in err. */
int options_stage_layers(const run_options_t *o, int n_layer, int pp, int *layers, char *err, size_t errlen);

/* Number of microbatches per optimizer step for data-parallel size dp. */
int options_accum_steps(const run_options_t *o, int dp);

/* Writes every option as `key = value` lines (the banner and metrics). */
void options_print(const run_options_t *o, void *file);

/* The small tools' long options (dtrain-bench-comm, dtrain-bench-gemm):
 * which of names[0..n-1] argv[*i] is, as "--iters 5" or "--iters=5", with
 * its value in *val (a following argument is consumed: *i advances).
 * Returns the index, or -1 with one line in err for an unknown option
 * (naming `prog --help`) or a missing value. */
int options_tool_arg(int argc, char **argv, int *i, const char *const *names, int n, const char *prog,
                     const char **val, char *err, size_t errlen);

#endif
