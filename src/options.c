#include "src/options.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/hf_import.h"
#include "src/strparse.h"
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

/* OPT_FLAG: an int 0/1; on the command line bare `--name` means 1 */
typedef enum { OPT_INT, OPT_LLONG, OPT_REAL, OPT_STR, OPT_FLAG } opt_kind_t;

typedef struct opt_def {
    const char *name; /* long option without "--"; also the config-file key */
    opt_kind_t kind;
    size_t offset;
    size_t size;      /* OPT_STR: buffer size */
    const char *def;  /* default, parsed like user input */
    double min, max;  /* numeric range (inclusive) */
    const char *const *choices; /* OPT_STR: allowed values, NULL = any */
    const char *help;
} opt_def_t;

static const char *const arch_choices[] = {"gpt2", "llama", NULL};
static const char *const format_choices[] = {"llmc", "raw-u16", NULL};
static const char *const ddp_choices[] = {"naive", "flat", "bucketed", NULL};
static const char *const grad_reduce_dtype_choices[] = {"fp32", "bf16", NULL};
static const char *const fsdp_choices[] = {"", "no_shard", "shard_grad_op", "full_shard", NULL};
static const char *const pp_schedule_choices[] = {"1f1b", "gpipe", NULL};
static const char *const recompute_choices[] = {"none", "selective", "full", NULL};
static const char *const plan_dtype_choices[] = {"", "fp32", "bf16", "megatron", NULL};
static const char *const device_choices[] = {"auto", "cpu", "cuda", NULL};
static const char *const dtype_choices[] = {"auto", "fp32", "bf16", NULL};
static const char *const comm_choices[] = {"auto", "mpi", "nccl", NULL};

#define F(field) offsetof(run_options_t, field)
#define S(field) sizeof(((run_options_t *)0)->field)

static const opt_def_t opt_defs[] = {
    {"config", OPT_STR, F(config), S(config), "", 0, 0, NULL, "read `key = value` options from FILE (the command line overrides it)"},
    {"model", OPT_STR, F(model), S(model), "tiny", 0, 0, NULL, "model preset (see --help for the list)"},
    {"arch", OPT_STR, F(arch), S(arch), "", 0, 0, arch_choices, "override the preset's architecture: gpt2|llama"},
    {"n-layer", OPT_INT, F(n_layer), 0, "0", 0, 1024, NULL, "override the number of blocks (0 = preset)"},
    {"n-head", OPT_INT, F(n_head), 0, "0", 0, 4096, NULL, "override the number of attention heads (0 = preset)"},
    {"n-kv-head", OPT_INT, F(n_kv_head), 0, "0", 0, 4096, NULL, "override the number of KV heads (0 = preset)"},
    {"d-model", OPT_INT, F(d_model), 0, "0", 0, 1 << 20, NULL, "override the model width (0 = preset)"},
    {"d-ff", OPT_INT, F(d_ff), 0, "0", 0, 1 << 22, NULL, "override the MLP width (0 = preset)"},
    {"vocab-size", OPT_INT, F(vocab_size), 0, "0", 0, 1 << 24, NULL, "override the vocabulary size (0 = preset)"},
    {"max-seq-len", OPT_INT, F(max_seq_len), 0, "0", 0, 1 << 20, NULL, "override the learned positions of GPT-2 (0 = preset)"},
    {"tp", OPT_INT, F(tp), 0, "1", 1, 4096, NULL, "tensor-parallel size: heads, MLP width and vocabulary split over N ranks"},
    {"sequence-parallel", OPT_FLAG, F(sequence_parallel), 0, "0", 0, 1, NULL, "with --tp: shard norms and residuals along the sequence (all-gather / reduce-scatter)"},
    {"pp", OPT_INT, F(pp), 0, "1", 1, 4096, NULL, "pipeline-parallel size: contiguous layer ranges on N stages"},
    {"pp-layers", OPT_STR, F(pp_layers), S(pp_layers), "", 0, 0, NULL, "layers per pipeline stage, e.g. 10,10,12 (empty = balanced)"},
    {"pp-schedule", OPT_STR, F(pp_schedule), S(pp_schedule), "1f1b", 0, 0, pp_schedule_choices, "pipeline schedule over a step's microbatches: 1f1b | gpipe"},
    {"dp", OPT_INT, F(dp), 0, "0", 0, 1 << 20, NULL, "data-parallel size (0 = world size / (tp x pp))"},
    {"ddp-mode", OPT_STR, F(ddp_mode), S(ddp_mode), "bucketed", 0, 0, ddp_choices, "gradient all-reduce: naive (per tensor) | flat (one buffer) | bucketed (overlapped with backward)"},
    {"zero", OPT_INT, F(zero), 0, "0", 0, 3, NULL, "ZeRO stage over the data-parallel group: 0 (replicated) | 1 (AdamW moments sharded) | 2 (gradients too) | 3 (block parameters too: FSDP)"},
    {"fsdp", OPT_STR, F(fsdp), S(fsdp), "", 0, 0, fsdp_choices, "PyTorch FSDP names for --zero: no_shard (0) | shard_grad_op (2) | full_shard (3)"},
    {"hybrid-shard", OPT_INT, F(hybrid_shard), 0, "0", 0, 1 << 20, NULL, "shard the ZeRO state within groups of N consecutive data-parallel ranks and replicate it across groups (HSDP; 0 = the whole data-parallel group)"},
    {"grad-reduce-dtype", OPT_STR, F(grad_reduce_dtype), S(grad_reduce_dtype), "fp32", 0, 0, grad_reduce_dtype_choices, "what the data-parallel gradient reductions (all-reduce, ZeRO reduce-scatter, HSDP) send and sum in: fp32 | bf16 (gradients stay fp32 in memory, are rounded to bf16 for the reduction and scaled by 1/dp in fp32 after it; with dp 1 nothing is reduced, so bf16 changes nothing)"},
    {"bucket-mb", OPT_REAL, F(bucket_mb), 0, "25", 0.001, 1e6, NULL, "gradient bucket size in MiB for --ddp-mode bucketed"},
    {"recompute", OPT_STR, F(recompute), S(recompute), "none", 0, 0, recompute_choices, "activation recomputation: none | selective (MLP activation redone in backward; attention keeps no T x T probabilities in any mode) | full (keep each block's input, redo the block); bit-identical results"},
    {"check-replicas", OPT_INT, F(check_replicas), 0, "0", 0, INT_MAX, NULL, "check data-parallel replicas hold identical parameters every N steps (0 = only at start)"},
    {"comm-timeout", OPT_REAL, F(comm_timeout), 0, "600", 0, 1e9, NULL, "end the job, naming the operation, when one communication call has blocked this long in seconds: a peer rank is stuck or dead (0 = wait forever)"},
    {"steps", OPT_INT, F(steps), 0, "1000", 1, INT_MAX, NULL, "total optimizer steps of the run"},
    {"micro-batch", OPT_INT, F(micro_batch), 0, "16", 1, 1 << 20, NULL, "sequences per microbatch (per rank)"},
    {"global-batch", OPT_INT, F(global_batch), 0, "0", 0, 1 << 30, NULL, "sequences per optimizer step over all ranks; a multiple of micro batch x dp (0 = micro batch x dp)"},
    {"seq-len", OPT_INT, F(seq_len), 0, "128", 1, 1 << 20, NULL, "tokens per sequence"},
    {"lr", OPT_REAL, F(lr), 0, "1e-3", 0, 10, NULL, "peak learning rate"},
    {"min-lr", OPT_REAL, F(min_lr), 0, "1e-4", 0, 10, NULL, "learning rate at the end of the cosine decay"},
    {"warmup", OPT_INT, F(warmup), 0, "50", 0, INT_MAX, NULL, "linear warmup steps"},
    {"weight-decay", OPT_REAL, F(weight_decay), 0, "0.1", 0, 10, NULL, "AdamW decoupled weight decay (2-D tensors only)"},
    {"grad-clip", OPT_REAL, F(grad_clip), 0, "1.0", 0, 1e30, NULL, "clip the global gradient norm to this (0 = off)"},
    {"beta1", OPT_REAL, F(beta1), 0, "0.9", 0, 0.999999, NULL, "AdamW beta1"},
    {"beta2", OPT_REAL, F(beta2), 0, "0.95", 0, 0.999999999, NULL, "AdamW beta2"},
    {"adam-eps", OPT_REAL, F(adam_eps), 0, "1e-8", 0, 1, NULL, "AdamW epsilon"},
    {"seed", OPT_LLONG, F(seed), 0, "1337", 0, 9.0e18, NULL, "seed of initialisation, data order and sampling"},
    {"data", OPT_STR, F(data), S(data), "data/gutenberg_train_*.bin", 0, 0, NULL, "training token shards (glob)"},
    {"val-data", OPT_STR, F(val_data), S(val_data), "data/gutenberg_val_*.bin", 0, 0, NULL, "validation token shards (glob)"},
    {"data-format", OPT_STR, F(data_format), S(data_format), "llmc", 0, 0, format_choices, "token file format: llmc (headered shards) | raw-u16 (nanoGPT .bin)"},
    {"val-every", OPT_INT, F(val_every), 0, "100", 0, INT_MAX, NULL, "validate every N steps and at the end (0 = never)"},
    {"val-batches", OPT_INT, F(val_batches), 0, "16", 1, INT_MAX, NULL, "microbatches of validation data per evaluation"},
    {"doc-mask", OPT_FLAG, F(doc_mask), 0, "0", 0, 1, NULL, "document masking: attention never crosses a document boundary and positions (learned or RoPE) restart at each document; the boundaries are the doc_start / doc_end tokens the data's tokenizer sidecar names (data without them is an error)"},
    {"metrics", OPT_STR, F(metrics), S(metrics), "", 0, 0, NULL, "write one JSON object per step to FILE"},
    {"ckpt-dir", OPT_STR, F(ckpt_dir), S(ckpt_dir), "", 0, 0, NULL, "write checkpoints (HDF5, any layout loads them) into DIR, created with its parents if missing"},
    {"ckpt-every", OPT_INT, F(ckpt_every), 0, "0", 0, INT_MAX, NULL, "checkpoint every N steps (0 = only at the end); needs --ckpt-dir"},
    {"keep", OPT_INT, F(keep), 0, "0", 0, INT_MAX, NULL, "keep the newest N checkpoints in --ckpt-dir, removing older ones once a new one is complete (0 = all)"},
    {"stop-at-step", OPT_INT, F(stop_at_step), 0, "0", 0, INT_MAX, NULL, "end this job after step N (checkpointed with --ckpt-dir) and leave the rest of --steps to a resumed run (0 = run to --steps)"},
    {"resume", OPT_STR, F(resume), S(resume), "", 0, 0, NULL, "continue from a checkpoint: auto (the newest complete one in --ckpt-dir, or a fresh start) or FILE"},
    {"init-from", OPT_STR, F(init_from), S(init_from), "", 0, 0, NULL, "start from the weights of a Hugging Face model directory (config.json + model.safetensors or sharded with model.safetensors.index.json: GPT2LMHeadModel, LlamaForCausalLM, Llama-shaped MistralForCausalLM; f32, f16 or bf16) or an llm.c GPT-2 model file (gpt2_124M.bin, fp32 or bf16): the model comes from the file (a disagreeing --model, --n-layer, ... is an error), every rank reads only its slices, training starts at step 0 with fresh AdamW state; a checkpoint that --resume finds wins over it"},
    {"save-params", OPT_STR, F(save_params), S(save_params), "", 0, 0, NULL, "at the end, write the trained parameters as logical tensors to FILE (HDF5, any layout reads it)"},
    {"trace", OPT_STR, F(trace), S(trace), "", 0, 0, NULL, "write a Chrome/Perfetto trace of every rank (layer and communication spans) to FILE"},
    {"tensorboard", OPT_STR, F(tensorboard), S(tensorboard), "", 0, 0, NULL, "write TensorBoard event files into DIR (created with its parents if missing): per step the loss, validation loss, learning rate, gradient norm, tokens/s, MFU, memory peaks and exposed communication"},
    {"straggler-every", OPT_INT, F(straggler_every), 0, "0", 0, INT_MAX, NULL, "every N steps name the rank and host with the most compute per step over those N steps (time blocked on peers left out) and its ratio to the median rank (0 = never)"},
    {"sample-tokens", OPT_INT, F(sample_tokens), 0, "256", 0, 1 << 20, NULL, "tokens to generate at the end (0 = no sample)"},
    {"prompt", OPT_STR, F(prompt), S(prompt), "ALICE.", 0, 0, NULL, "text the sample continues, encoded with --tokenizer after its document start token (without a tokenizer the sample starts from token 0)"},
    {"tokenizer", OPT_STR, F(tokenizer), S(tokenizer), "auto", 0, 0, NULL, "tokenizer of the sample and --prompt: auto (the one the data's sidecar PREFIX.tokenizer.json names, else byte for a 256-token vocabulary, else none) | none (the sample prints token ids) | byte | gpt2[:DIR] | tiktoken:FILE[:ENCODING] | spm:MODEL"},
    {"temperature", OPT_REAL, F(temperature), 0, "0.8", 0, 100, NULL, "sampling temperature (0 = greedy)"},
    {"top-k", OPT_INT, F(top_k), 0, "40", 0, 1 << 24, NULL, "sample from the k most likely tokens (0 = all)"},
    {"threads", OPT_INT, F(threads), 0, "0", 0, 4096, NULL, "OpenMP/OpenBLAS threads per rank (0 = OMP_NUM_THREADS or all cores)"},
    {"peak-gflops", OPT_REAL, F(peak_gflops), 0, "0", 0, 1e12, NULL, "peak GFLOP/s for MFU (0 = measure with a short sgemm probe); with --plan --hw cpu, the profile's peak"},
    {"plan", OPT_FLAG, F(plan), 0, "0", 0, 1, NULL, "print the per-rank memory, FLOPs, communication and predicted step time of this configuration and exit without training (one process is enough)"},
    {"search", OPT_FLAG, F(search), 0, "0", 0, 1, NULL, "with --plan and --gpus: list the layouts (tp, pp, dp, zero, recompute, micro batch) that fit, best predicted tokens/s first"},
    {"gpus", OPT_INT, F(gpus), 0, "0", 0, 1 << 24, NULL, "with --plan: devices in all; dp = N / (tp x pp) (0 = --dp, or the world size)"},
    {"hw", OPT_STR, F(hw), S(hw), "", 0, 0, NULL, "with --plan: hardware profile h100-sxm | a100-80g | cpu, or a FILE of key = value lines (empty = h100-sxm)"},
    {"plan-dtype", OPT_STR, F(plan_dtype), S(plan_dtype), "", 0, 0, plan_dtype_choices, "with --plan: fp32 | bf16 (dtrain's own buffers under --dtype fp32 or bf16, exactly) | megatron (Megatron-LM's bf16 layout for comparison: bf16 weights, fp32 gradients, master weights and AdamW moments; Korthikanti activations) (empty = bf16 on GPU profiles, fp32 on cpu)"},
    {"gpu-mem", OPT_REAL, F(gpu_mem), 0, "0", 0, 1e9, NULL, "with --plan: device memory per rank in GiB (0 = the hardware profile's)"},
    {"device", OPT_STR, F(device), S(device), "auto", 0, 0, device_choices, "compute backend: cpu | cuda (one GPU per rank, chosen by local rank) | auto (cuda when built with it and a GPU is visible, else cpu)"},
    {"dtype", OPT_STR, F(dtype), S(dtype), "auto", 0, 0, dtype_choices, "matmul precision: bf16 (operands rounded to bf16, fp32 sums; a bf16 weight copy and the matmul-only activations kept in bf16; master weights, gradients, AdamW state and other activations fp32) | fp32 | auto (bf16 on cuda, fp32 on cpu)"},
    {"comm", OPT_STR, F(comm), S(comm), "auto", 0, 0, comm_choices, "communication library of the tp, dp, embedding, ZeRO and world collectives: nccl (GPU to GPU, needs --device cuda) | mpi | auto (nccl when every rank runs on cuda on a GPU of its own and there is more than one rank, else mpi); the pipeline's point-to-point messages always use MPI"},
    {"selftest", OPT_FLAG, F(selftest), 0, "0", 0, 1, NULL, "compare every CUDA op with the CPU op on random inputs (stated error bounds), print the results and exit (0 = all agree)"},
};
#define N_OPTS ((int)(sizeof opt_defs / sizeof opt_defs[0]))

static const opt_def_t *opt_find(const char *name, size_t len)
{
    for (int i = 0; i < N_OPTS; i++)
        if (strlen(opt_defs[i].name) == len && strncmp(opt_defs[i].name, name, len) == 0)
            return &opt_defs[i];
    return NULL;
}

/* Parses value into its field; where says where it came from. */
static int opt_set(run_options_t *o, const opt_def_t *d, const char *value, const char *where,
                   char *err, size_t errlen)
{
    char *field = (char *)o + d->offset;
    char *end = NULL;
    errno = 0;
    switch (d->kind) {
    case OPT_FLAG:
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0) {
            snprintf(err, errlen, "%s--%s '%s': a flag takes 0 or 1", where, d->name, value);
            return -1;
        }
        *(int *)field = value[0] == '1';
        return 0;
    case OPT_INT:
    case OPT_LLONG: {
        long long v = strtoll(value, &end, 10);
        if (errno || end == value || *end != '\0') {
            snprintf(err, errlen, "%s--%s '%s': not an integer", where, d->name, value);
            return -1;
        }
        if ((double)v < d->min || (double)v > d->max) {
            snprintf(err, errlen, "%s--%s %lld: out of range, allowed %.0f..%.0f", where, d->name, v,
                     d->min, d->max);
            return -1;
        }
        if (d->kind == OPT_INT)
            *(int *)field = (int)v;
        else
            *(long long *)field = v;
        return 0;
    }
    case OPT_REAL: {
        double v = strtod(value, &end);
        if (errno || end == value || *end != '\0' || !isfinite(v)) {
            snprintf(err, errlen, "%s--%s '%s': not a number", where, d->name, value);
            return -1;
        }
        if (v < d->min || v > d->max) {
            snprintf(err, errlen, "%s--%s %g: out of range, allowed %g..%g", where, d->name, v, d->min,
                     d->max);
            return -1;
        }
        *(double *)field = v;
        return 0;
    }
    case OPT_STR:
    default:
        if (d->choices && *value) {
            int ok = 0;
            for (const char *const *c = d->choices; *c; c++)
                ok |= strcmp(*c, value) == 0;
            if (!ok) {
                char allowed[128] = "";
                for (const char *const *c = d->choices; *c; c++)
                    if (**c) /* "" (unset) is allowed but not worth listing */
                        snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
                                 allowed[0] ? "|" : "", *c);
                snprintf(err, errlen, "%s--%s '%s': allowed values are %s", where, d->name, value, allowed);
                return -1;
            }
        }
        if (strlen(value) >= d->size) {
            snprintf(err, errlen, "%s--%s: value longer than %zu characters", where, d->name, d->size - 1);
            return -1;
        }
        memcpy(field, value, strlen(value) + 1);
        if (d->offset == F(model) && strcmp(where, "default ") != 0)
            o->model_set = 1;
        return 0;
    }
}

static int load_config_file(run_options_t *o, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        snprintf(err, errlen, "--config %s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    char line[2048], where[OPT_PATH_MAX + 32];
    int lineno = 0, rc = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *hash = strchr(line, '#');
        if (hash)
            *hash = '\0';
        char *s = trim(line);
        if (!*s)
            continue;
        snprintf(where, sizeof where, "%s:%d: ", path, lineno);
        char *eq = strchr(s, '=');
        if (!eq) {
            snprintf(err, errlen, "%sexpected `key = value`, got '%s'", where, s);
            rc = -1;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *value = trim(eq + 1);
        const opt_def_t *d = opt_find(key, strlen(key));
        if (!d || strcmp(key, "config") == 0) {
            snprintf(err, errlen, "%sunknown option '%s' (dtrain --help lists them)", where, key);
            rc = -1;
            break;
        }
        rc = opt_set(o, d, value, where, err, errlen);
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "--config %s: read error", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

/* What --help shows after an option's name. */
static const char *metavar(const opt_def_t *d)
{
    static const char *const files[] = {"config", "metrics", "trace", "save-params", "resume", "hw", NULL};
    switch (d->kind) {
    case OPT_FLAG:
        return "";
    case OPT_REAL:
        return "X";
    case OPT_INT:
    case OPT_LLONG:
        return "N";
    case OPT_STR:
    default:
        for (const char *const *f = files; *f; f++)
            if (strcmp(d->name, *f) == 0)
                return "FILE";
        if (strcmp(d->name, "init-from") == 0)
            return "PATH";
        return strcmp(d->name, "ckpt-dir") == 0 || strcmp(d->name, "tensorboard") == 0 ? "DIR" : strcmp(d->name, "tokenizer") == 0 ? "SPEC" : "STR";
    }
}

static void print_help(FILE *out)
{
    fprintf(out,
            "usage: dtrain [--config FILE] [--option value ...]\n"
            "Train a GPT-2 or Llama style transformer on token shards.\n\n"
            "Options (default in brackets; config files use the same names without --):\n");
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def_t *d = &opt_defs[i];
        char lhs[64];
        snprintf(lhs, sizeof lhs, "--%s%s%s", d->name, d->kind == OPT_FLAG ? "" : " ", metavar(d));
        fprintf(out, "  %-24s %s [%s]\n", lhs, d->help, d->def);
    }
    fprintf(out, "  %-24s %s\n  %-24s %s\n", "--help", "print this help and exit", "--version",
            "print the version and exit");
    fprintf(out, "\nModel presets:\n");
    for (const model_preset_t *p = model_presets(); p->name; p++)
        fprintf(out, "  %-12s %s\n", p->name, p->about);
}

static int check_consistency(const run_options_t *o, char *err, size_t errlen)
{
    if (!model_preset_find(o->model)) {
        char names[256] = "";
        for (const model_preset_t *p = model_presets(); p->name; p++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s",
                     p == model_presets() ? "" : "|", p->name);
        snprintf(err, errlen, "--model '%s': unknown preset, allowed %s", o->model, names);
        return -1;
    }
    if (o->global_batch != 0 && o->global_batch % o->micro_batch != 0) {
        snprintf(err, errlen, "--global-batch %d must be a multiple of --micro-batch %d",
                 o->global_batch, o->micro_batch);
        return -1;
    }
    if (o->min_lr > o->lr) {
        snprintf(err, errlen, "--min-lr %g must not exceed --lr %g", o->min_lr, o->lr);
        return -1;
    }
    if (!o->data[0]) {
        snprintf(err, errlen, "--data: a token shard path or glob is required");
        return -1;
    }
    if (o->ckpt_every > 0 && !o->ckpt_dir[0]) {
        snprintf(err, errlen, "--ckpt-every %d needs --ckpt-dir DIR", o->ckpt_every);
        return -1;
    }
    if (strcmp(o->resume, "auto") == 0 && !o->ckpt_dir[0]) {
        snprintf(err, errlen, "--resume auto looks in --ckpt-dir: give --ckpt-dir DIR (or --resume FILE)");
        return -1;
    }
    /* options that only the planner reads are refused elsewhere, never ignored */
    const char *plan_only = o->search ? "search" : o->gpus ? "gpus" : o->hw[0] ? "hw"
                          : o->plan_dtype[0] ? "plan-dtype" : o->gpu_mem > 0 ? "gpu-mem" : NULL;
    if (plan_only && !o->plan) {
        snprintf(err, errlen, "--%s is an option of the planner: add --plan (which trains nothing)", plan_only);
        return -1;
    }
    if (o->search && !o->gpus) {
        snprintf(err, errlen, "--search needs --gpus N: the number of devices the layouts share");
        return -1;
    }
    if (o->fsdp[0] && o->zero != 0) {
        snprintf(err, errlen, "--fsdp %s and --zero %d both set the sharding stage: give one of them", o->fsdp,
                 o->zero);
        return -1;
    }
    if (o->val_every > 0 && !o->val_data[0]) {
        snprintf(err, errlen, "--val-every %d needs --val-data (or set --val-every 0)", o->val_every);
        return -1;
    }
    return 0;
}

options_status_t options_parse(run_options_t *o, int argc, char **argv, int print, char *err,
                               size_t errlen)
{
    memset(o, 0, sizeof *o);
    for (int i = 0; i < N_OPTS; i++)
        if (opt_set(o, &opt_defs[i], opt_defs[i].def, "default ", err, errlen) != 0)
            return OPTIONS_ERROR;

    /* --help/--version win wherever they are; --config is applied before
     * the other command-line options so that those override it. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            if (print)
                print_help(stdout);
            return OPTIONS_EXIT_OK;
        }
        if (strcmp(argv[i], "--version") == 0) {
            if (print)
                printf("dtrain %s\n", PACKAGE_VERSION);
            return OPTIONS_EXIT_OK;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 1; i < argc; i++) {
            const char *a = argv[i];
            if (strncmp(a, "--", 2) != 0) {
                snprintf(err, errlen, "unexpected argument '%s': options are --name value (dtrain --help)", a);
                return OPTIONS_ERROR;
            }
            const char *name = a + 2, *eq = strchr(name, '=');
            size_t len = eq ? (size_t)(eq - name) : strlen(name);
            const opt_def_t *d = opt_find(name, len);
            if (!d) {
                snprintf(err, errlen, "unknown option '%.*s' (dtrain --help lists them)", (int)len + 2, a);
                return OPTIONS_ERROR;
            }
            const char *value = eq ? eq + 1 : NULL;
            if (!value && d->kind == OPT_FLAG)
                value = "1";
            if (!value) {
                if (i + 1 >= argc) {
                    snprintf(err, errlen, "--%s needs a value", d->name);
                    return OPTIONS_ERROR;
                }
                value = argv[++i];
            }
            int is_config = strcmp(d->name, "config") == 0;
            if (pass == 0 && is_config) {
                if (opt_set(o, d, value, "", err, errlen) != 0 ||
                    load_config_file(o, value, err, errlen) != 0)
                    return OPTIONS_ERROR;
            } else if (pass == 1 && !is_config) {
                if (opt_set(o, d, value, "", err, errlen) != 0)
                    return OPTIONS_ERROR;
            }
        }
    }
#ifndef HAVE_CUDA
    if (strcmp(o->device, "cuda") == 0 || strcmp(o->comm, "nccl") == 0 || o->selftest) {
        snprintf(err, errlen, "%s: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda",
                 o->selftest ? "--selftest" : strcmp(o->comm, "nccl") == 0 ? "--comm nccl" : "--device cuda");
        return OPTIONS_ERROR;
    }
#endif
    if (strcmp(o->comm, "nccl") == 0 && strcmp(o->device, "cpu") == 0) {
        snprintf(err, errlen, "--comm nccl runs between GPUs: use it with --device cuda (or auto), or --comm mpi");
        return OPTIONS_ERROR;
    }
    if (check_consistency(o, err, errlen) != 0)
        return OPTIONS_ERROR;
    return OPTIONS_OK;
}

int options_tool_arg(int argc, char **argv, int *i, const char *const *names, int n, const char *prog,
                     const char **val, char *err, size_t errlen)
{
    const char *a = argv[*i];
    for (int k = 0; k < n; k++) {
        size_t len = strlen(names[k]);
        if (strncmp(a, names[k], len) != 0 || (a[len] != '\0' && a[len] != '='))
            continue;
        if (a[len] == '=') {
            *val = a + len + 1;
            return k;
        }
        if (*i + 1 >= argc) {
            snprintf(err, errlen, "%s needs a value", names[k]);
            return -1;
        }
        *val = argv[++*i];
        return k;
    }
    snprintf(err, errlen, "unknown option '%s' (%s --help lists them)", a, prog);
    return -1;
}

int options_zero_stage(const run_options_t *o)
{
    if (strcmp(o->fsdp, "full_shard") == 0)
        return 3;
    if (strcmp(o->fsdp, "shard_grad_op") == 0)
        return 2;
    return o->fsdp[0] ? 0 : o->zero;
}

int options_model_config(const run_options_t *o, model_config_t *c, char *err, size_t errlen)
{
    if (o->init_from[0])
        return init_from_model_config(o, c, err, errlen);
    const model_preset_t *p = model_preset_find(o->model);
    if (!p) {
        snprintf(err, errlen, "--model '%s': unknown preset", o->model);
        return -1;
    }
    *c = p->cfg;
    if (o->arch[0]) {
        c->arch = strcmp(o->arch, "llama") == 0 ? ARCH_LLAMA : ARCH_GPT2;
        if (c->arch == ARCH_LLAMA && c->rope_theta == 0)
            c->rope_theta = 10000.0f;
    }
    if (o->n_layer)
        c->n_layer = o->n_layer;
    if (o->n_head) {
        c->n_head = o->n_head;
        if (c->arch == ARCH_GPT2 || !o->n_kv_head)
            c->n_kv_head = o->n_head;
    }
    if (o->n_kv_head)
        c->n_kv_head = o->n_kv_head;
    if (o->d_model)
        c->d_model = o->d_model;
    if (o->d_ff)
        c->d_ff = o->d_ff;
    if (o->vocab_size)
        c->vocab_size = o->vocab_size;
    if (o->max_seq_len)
        c->max_seq = o->max_seq_len;
    if (c->arch == ARCH_LLAMA && o->seq_len > c->max_seq)
        c->max_seq = o->seq_len; /* RoPE has no table of positions to outgrow */
    return model_config_check(c, err, errlen);
}

int options_check_grid(const model_config_t *c, int tp, int pp, char *err, size_t errlen)
{
    if (c->n_head % tp || c->n_kv_head % tp || c->d_ff % tp) {
        snprintf(err, errlen, "--tp %d must divide the attention heads (%d), the KV heads (%d) and the FFN "
                 "width (%d); pick a --tp that divides all three", tp, c->n_head, c->n_kv_head, c->d_ff);
        return -1;
    }
    if (pp > c->n_layer) {
        snprintf(err, errlen, "--pp %d exceeds the model's %d layers: every stage needs at least one", pp,
                 c->n_layer);
        return -1;
    }
    return 0;
}

int options_check_layout(const run_options_t *o, const model_config_t *c, int tp, int pp, int dp,
                         char *err, size_t errlen)
{
    if (o->global_batch != 0 && o->global_batch % (o->micro_batch * dp) != 0) {
        snprintf(err, errlen, "--global-batch %d must be a multiple of --micro-batch %d x dp %d = %d",
                 o->global_batch, o->micro_batch, dp, o->micro_batch * dp);
        return -1;
    }
    if (o->hybrid_shard > 0 && (dp % o->hybrid_shard != 0 || options_zero_stage(o) == 0)) {
        snprintf(err, errlen, "--hybrid-shard %d: %s", o->hybrid_shard,
                 options_zero_stage(o) == 0 ? "shards the ZeRO state: it needs --zero 1 or higher"
                                            : "must divide the data-parallel size");
        if (options_zero_stage(o) != 0)
            snprintf(err + strlen(err), errlen - strlen(err), " %d", dp);
        return -1;
    }
    if (options_check_grid(c, tp, pp, err, errlen) != 0)
        return -1;
    if (o->sequence_parallel && tp == 1) {
        snprintf(err, errlen, "--sequence-parallel shards over the tensor-parallel group: it needs --tp above 1");
        return -1;
    }
    /* the sequence is what sequence parallelism splits; sampling windows are
     * padded up to a multiple of tp, so the whole sequence must be one */
    if (o->sequence_parallel && o->seq_len % tp) {
        snprintf(err, errlen, "--sequence-parallel: --seq-len %d must be a multiple of --tp %d", o->seq_len, tp);
        return -1;
    }
    if (pp > 1 && options_accum_steps(o, dp) < pp) {
        snprintf(err, errlen, "--pp %d needs at least %d microbatches per step, got %d (global batch %d / "
                 "(micro batch %d x dp %d)); raise --global-batch or lower --micro-batch",
                 pp, pp, options_accum_steps(o, dp), o->global_batch ? o->global_batch : o->micro_batch * dp,
                 o->micro_batch, dp);
        return -1;
    }
    int layers[4096];
    if (options_stage_layers(o, c->n_layer, pp, layers, err, errlen) != 0)
        return -1;
    return 0;
}

int options_stage_layers(const run_options_t *o, int n_layer, int pp, int *layers, char *err, size_t errlen)
{
    if (!o->pp_layers[0]) {
        /* balanced; the remainder goes to the first stages, since the last
         * one also holds the final norm, the head and the loss */
        for (int s = 0; s < pp; s++)
            layers[s] = n_layer / pp + (s < n_layer % pp);
        return 0;
    }
    int n = 0, sum = 0;
    const char *p = o->pp_layers;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > n_layer || (*end && *end != ',')) {
            snprintf(err, errlen, "--pp-layers '%s': expected a comma-separated list of positive layer counts",
                     o->pp_layers);
            return -1;
        }
        if (n == pp) {
            n++;
            break;
        }
        layers[n++] = (int)v;
        sum += (int)v;
        p = *end ? end + 1 : end;
    }
    if (n != pp || sum != n_layer) {
        snprintf(err, errlen, "--pp-layers '%s': needs %d counts (one per stage) summing to the model's %d layers",
                 o->pp_layers, pp, n_layer);
        return -1;
    }
    return 0;
}

int options_accum_steps(const run_options_t *o, int dp)
{
    int gb = o->global_batch ? o->global_batch : o->micro_batch * dp;
    return gb / (o->micro_batch * dp);
}

void options_print(const run_options_t *o, void *file)
{
    FILE *f = file;
    for (int i = 0; i < N_OPTS; i++) {
        const opt_def_t *d = &opt_defs[i];
        const char *field = (const char *)o + d->offset;
        fprintf(f, "  %-14s = ", d->name);
        switch (d->kind) {
        case OPT_INT:
        case OPT_FLAG:
            fprintf(f, "%d\n", *(const int *)field);
            break;
        case OPT_LLONG:
            fprintf(f, "%lld\n", *(const long long *)field);
            break;
        case OPT_REAL:
            fprintf(f, "%g\n", *(const double *)field);
            break;
        case OPT_STR:
            fprintf(f, "%s\n", field);
            break;
        }
    }
}
