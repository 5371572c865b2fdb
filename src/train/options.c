#include "src/train/options.h"

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
#include "src/cli/optable.h"
#include "src/cli/strparse.h"
#include "src/convert/hf_import.h"
#include "src/optim/optim.h"
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

static const char *const arch_choices[] = {"gpt2", "llama", NULL};
static const char *const moe_router_choices[] = {"softmax", "sigmoid", NULL};
const char *const plan_dtype_names[] = {[PLAN_DTYPE_AUTO] = "",
                                        [PLAN_DTYPE_FP32] = "fp32",
                                        [PLAN_DTYPE_BF16] = "bf16",
                                        [PLAN_DTYPE_MEGATRON] = "megatron",
                                        NULL};

const char *const options_fsdp_names[] = {[FSDP_UNSET] = "",
                                          [FSDP_NO_SHARD] = "no_shard",
                                          [FSDP_SHARD_GRAD_OP] = "shard_grad_op",
                                          [FSDP_FULL_SHARD] = "full_shard",
                                          NULL};

const char *const options_offload_names[] = {[OFFLOAD_NONE] = "none", [OFFLOAD_OPTIMIZER] = "optimizer", NULL};

/* --eval-mc FILE: appended to the list (repeatable; a value may hold
 * several, joined by ','). */
static int add_eval_mc(const char *value, void *dst, void *field, char *err, size_t errlen)
{
    (void)dst;
    char *list = field;
    const size_t have = strlen(list), add = strlen(value);
    if (add == 0) {
        snprintf(err, errlen, "--eval-mc: empty file name");
        return -1;
    }
    if (have + (have > 0) + add >= OPT_PATH_MAX) {
        snprintf(err, errlen, "--eval-mc: the files' names exceed %d characters in all", OPT_PATH_MAX - 1);
        return -1;
    }
    if (have)
        list[have] = ',';
    memcpy(list + have + (have > 0), value, add + 1);
    return 0;
}

/* --config FILE: read now (the command line's other options come after) */
static int load_config(const char *path, void *dst, void *field, char *err, size_t errlen);
static const char *const decay_shape_choices[] = {"", "linear", "cosine", "1-sqrt", NULL};

#define F(field) offsetof(run_options_t, field)
#define S(field) sizeof(((run_options_t *)0)->field)

/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"config", OPT_ARG, F(config), S(config), NULL, 0, 0, NULL,
     "read `key = value` options from FILE (the command line overrides it)", "FILE", load_config, 0},
    {"model", OPT_STR, F(model), S(model), "tiny", 0, 0, NULL, "model preset (see --help for the list)", NULL, NULL,
     F(model_set) + 1},
    {"arch", OPT_STR, F(arch), S(arch), "", 0, 0, arch_choices, "override the preset's architecture: gpt2|llama", NULL,
     NULL, 0},
    {"n-layer", OPT_INT, F(n_layer), 0, "0", 0, 1024, NULL, "override the number of blocks (0 = preset)", NULL, NULL,
     0},
    {"n-head", OPT_INT, F(n_head), 0, "0", 0, 4096, NULL, "override the number of attention heads (0 = preset)", NULL,
     NULL, 0},
    {"n-kv-head", OPT_INT, F(n_kv_head), 0, "0", 0, 4096, NULL, "override the number of KV heads (0 = preset)", NULL,
     NULL, 0},
    {"d-model", OPT_INT, F(d_model), 0, "0", 0, 1 << 20, NULL, "override the model width (0 = preset)", NULL, NULL, 0},
    {"d-ff", OPT_INT, F(d_ff), 0, "0", 0, 1 << 22, NULL, "override the MLP width (0 = preset)", NULL, NULL, 0},
    {"moe-experts", OPT_INT, F(moe_experts), 0, "0", 0, 4096, NULL,
     "mixture of experts: routed experts per MoE layer (0 = the preset's; a dense preset becomes a MoE one)", NULL,
     NULL, F(moe_given[0]) + 1},
    {"moe-top-k", OPT_INT, F(moe_top_k), 0, "0", 0, 4096, NULL, "experts each token is routed to (default 2)", NULL,
     NULL, F(moe_given[1]) + 1},
    {"moe-ffn", OPT_INT, F(moe_ffn), 0, "0", 0, 1 << 22, NULL, "each expert's MLP width (default --d-ff)", NULL, NULL,
     F(moe_given[2]) + 1},
    {"moe-every", OPT_INT, F(moe_every), 0, "1", 1, 1024, NULL,
     "every N-th layer from --moe-first-dense on is a MoE layer (default 1: all)", NULL, NULL, F(moe_given[3]) + 1},
    {"moe-first-dense", OPT_INT, F(moe_first_dense), 0, "0", 0, 1024, NULL,
     "the first N layers keep a dense MLP (DeepSeek's first_k_dense_replace)", NULL, NULL, F(moe_given[4]) + 1},
    {"moe-router", OPT_STR, F(moe_router), S(moe_router), "", 0, 0, moe_router_choices,
     "router scores: softmax (Mixtral, Qwen-MoE) | sigmoid (DeepSeek-V3); computed in fp32", NULL, NULL,
     F(moe_given[5]) + 1},
    {"moe-norm-topk", OPT_INT, F(moe_norm_topk), 0, "1", 0, 1, NULL,
     "1: renormalise the chosen experts' scores to sum 1 (Mixtral); 0: use them as they are (Qwen norm_topk_prob "
     "false)",
     NULL, NULL, F(moe_given[6]) + 1},
    {"moe-shared-ffn", OPT_INT, F(moe_shared_ffn), 0, "0", 0, 1 << 22, NULL,
     "width of a shared expert every token of a MoE layer goes through (0 = none)", NULL, NULL, F(moe_given[7]) + 1},
    {"moe-shared-gate", OPT_INT, F(moe_shared_gate), 0, "0", 0, 1, NULL,
     "1: scale the shared expert's output per token by sigmoid(x . w_gate), a learned [1, d_model] gate (Qwen2-MoE's "
     "shared_expert_gate)",
     NULL, NULL, F(moe_given[11]) + 1},
    {"moe-aux-coef", OPT_REAL, F(moe_aux_coef), 0, "0.01", 0, 1e6, NULL,
     "coefficient of the Switch load-balancing loss E * sum_e f_e P_e added per MoE layer", NULL, NULL,
     F(moe_given[8]) + 1},
    {"moe-z-coef", OPT_REAL, F(moe_z_coef), 0, "0", 0, 1e6, NULL,
     "coefficient of the router z-loss mean(logsumexp(logits)^2) added per MoE layer", NULL, NULL, F(moe_given[9]) + 1},
    {"moe-capacity-factor", OPT_REAL, F(moe_capacity), 0, "0", 0, 1e4, NULL,
     "cap each expert at ceil(X * seq-len * top-k / experts) tokens per sequence, dropping the lowest router scores "
     "(0 = dropless)",
     NULL, NULL, F(moe_given[10]) + 1},
    {"moe-bias-rate", OPT_REAL, F(moe_bias_rate), 0, "0", 0, 1, NULL,
     "after each step move each expert's bias by this toward balance, b_e += R sign(mean load - load_e), the bias "
     "selecting experts only (DeepSeek-V3's aux-loss-free balancing, 0.001 there; --moe-router sigmoid)",
     NULL, NULL, F(moe_given[12]) + 1},
    {"vocab-size", OPT_INT, F(vocab_size), 0, "0", 0, 1 << 24, NULL, "override the vocabulary size (0 = preset)", NULL,
     NULL, 0},
    {"max-seq-len", OPT_INT, F(max_seq_len), 0, "0", 0, 1 << 20, NULL,
     "override the learned positions of GPT-2 (0 = preset)", NULL, NULL, 0},
    {"tp", OPT_INT, F(tp), 0, "1", 1, 4096, NULL,
     "tensor-parallel size: heads, MLP width and vocabulary split over N ranks", NULL, NULL, 0},
    {"sequence-parallel", OPT_FLAG, F(sequence_parallel), 0, "0", 0, 1, NULL,
     "with --tp: shard norms and residuals along the sequence (all-gather / reduce-scatter)", NULL, NULL, 0},
    {"pp", OPT_INT, F(pp), 0, "1", 1, 4096, NULL, "pipeline-parallel size: contiguous layer ranges on N stages", NULL,
     NULL, 0},
    {"pp-layers", OPT_STR, F(pp_layers), S(pp_layers), "", 0, 0, NULL,
     "layers per pipeline stage, e.g. 10,10,12 (empty = balanced); with --pp-virtual V, per chunk (pp x V counts "
     "in model order)",
     NULL, NULL, 0},
    {"pp-schedule", OPT_ENUM, F(pp_schedule), 0, "1f1b", 0, 0, pipe_kind_names,
     "pipeline schedule over a step's microbatches: 1f1b | gpipe | interleaved (with --pp-virtual) | zb-h1 (zero "
     "bubble: backward split into input and weight gradients)",
     NULL, NULL, 0},
    {"pp-virtual", OPT_INT, F(pp_virtual), 0, "1", 1, PARAM_MAX_RUNS, NULL,
     "model chunks per pipeline stage for --pp-schedule interleaved: chunk c on stage c mod pp", NULL, NULL, 0},
    {"dp", OPT_INT, F(dp), 0, "0", 0, 1 << 20, NULL, "data-parallel size (0 = world size / (tp x pp))", NULL, NULL, 0},
    {"ep", OPT_INT, F(ep), 0, "1", 1, 1 << 20, NULL,
     "expert-parallel size: each MoE layer's experts split over N data-parallel ranks, tokens dispatched to them by "
     "all-to-all (N divides dp and the experts; expert gradients averaged, and under --zero their state sharded, over "
     "the dp/N ranks holding the same ones)",
     NULL, NULL, 0},
    {"cp", OPT_INT, F(cp), 0, "1", 1, 1 << 16, NULL,
     "context-parallel size: each sequence cut into 2N chunks over N ranks (rank r holding chunks r and 2N-1-r), "
     "attention by a ring passing K and V; the grid is TP x CP x DP x PP and gradients and ZeRO state go over DP x "
     "CP (--seq-len a multiple of 2N)",
     NULL, NULL, 0},
    {"etp", OPT_INT, F(etp), 0, "0", 0, 1 << 20, NULL,
     "expert tensor-parallel size: --tp (0, the default: each expert split over the TP ranks as the dense MLP is) or "
     "1 (whole experts: each TP rank routes 1/tp of the micro batch's tokens, and the --ep group is N consecutive "
     "ranks of the TP x DP plane, N dividing tp x dp)",
     NULL, NULL, 0},
    {"ddp-mode", OPT_ENUM, F(ddp_mode), 0, "bucketed", 0, 0, ddp_mode_names,
     "gradient all-reduce: naive (per tensor) | flat (one buffer) | bucketed (overlapped with backward)", NULL, NULL,
     0},
    {"zero", OPT_INT, F(zero), 0, "0", 0, 3, NULL,
     "ZeRO stage over the data-parallel group: 0 (replicated) | 1 (AdamW moments sharded) | 2 (gradients too) | 3 "
     "(block parameters too: FSDP)",
     NULL, NULL, 0},
    {"fsdp", OPT_ENUM, F(fsdp), 0, "", 0, 0, options_fsdp_names,
     "PyTorch FSDP names for --zero: no_shard (0) | shard_grad_op (2) | full_shard (3)", NULL, NULL, 0},
    {"hybrid-shard", OPT_INT, F(hybrid_shard), 0, "0", 0, 1 << 20, NULL,
     "shard the ZeRO state within groups of N consecutive data-parallel ranks (of dp x cp under --cp, N a multiple of "
     "cp) and replicate it across groups (HSDP; 0 = the whole data-parallel group)",
     NULL, NULL, 0},
    {"grad-reduce-dtype", OPT_ENUM, F(grad_reduce_dtype), 0, "fp32", 0, 0, comm_dtype_names,
     "what the data-parallel gradient reductions (all-reduce, ZeRO reduce-scatter, HSDP) send and sum in: fp32 | bf16 "
     "(gradients stay fp32 in memory, are rounded to bf16 for the reduction and scaled by 1/dp in fp32 after it; with "
     "dp 1 nothing is reduced, so bf16 changes nothing)",
     NULL, NULL, 0},
    {"tp-comm-dtype", OPT_ENUM, F(tp_comm_dtype), 0, "fp32", 0, 0, comm_dtype_names,
     "what the tensor-parallel activation collectives (the row-parallel sums, sequence parallelism's all-gathers and "
     "reduce-scatters, forward and backward) send and sum in: fp32 | bf16 (half the bytes, as Megatron's bf16 "
     "activations; rounded to bf16 before, widened after; needs --dtype bf16; with tp 1 nothing is sent)",
     NULL, NULL, 0},
    {"tp-comm-overlap", OPT_FLAG, F(tp_comm_overlap), 0, "0", 0, 1, NULL,
     "with --tp: in the backward of each column-parallel matmul (attention's qkv, the MLP's first), start the "
     "input gradient's tensor-parallel reduce-scatter (all-reduce without --sequence-parallel) before the weight "
     "gradient's GEMM and wait for it after, so the two overlap (Megatron's overlap of the dgrad reduction with the "
     "wgrad GEMM); the same sums",
     NULL, NULL, 0},
    {"bucket-mb", OPT_REAL, F(bucket_mb), 0, "25", 0.001, 1e6, NULL,
     "gradient bucket size in MiB for --ddp-mode bucketed", NULL, NULL, 0},
    {"offload", OPT_ENUM, F(offload), 0, "none", 0, 0, options_offload_names,
     "none | optimizer: each rank's AdamW moments and fp32 master weights (its ZeRO shard) in host memory, updated "
     "there by the vectorised host AdamW; bit-identical to none on the CPU. Under --dtype bf16 with fraction 1 and "
     "--zero 0-2 the fp32 weights themselves move to the host and the device keeps their bf16 copy",
     NULL, NULL, 0},
    {"offload-fraction", OPT_REAL, F(offload_fraction), 0, "1", 0, 1, NULL,
     "with --offload optimizer: the fraction of the optimizer state in host memory, the rest updated on the device "
     "(Megatron's hybrid optimizer)",
     NULL, NULL, 0},
    {"recompute", OPT_ENUM, F(recompute), 0, "none", 0, 0, model_recompute_names,
     "activation recomputation: none | selective (MLP activation redone in backward; attention keeps no T x T "
     "probabilities in any mode) | full (keep each block's input, redo the block); bit-identical results",
     NULL, NULL, 0},
    {"logits-chunk", OPT_STR, F(logits_chunk_arg), S(logits_chunk_arg), "auto", 0, 0, NULL,
     "the last stage's classifier: ROWS | auto (fused: the logits of ROWS tokens at a time, then at once their "
     "loss and, in training, their gradient and the head's, so no whole [tokens, vocab] logits buffer exists; auto: "
     "as many rows as fit the backward's scratch, at least 256) | whole (every microbatch in flight keeps its whole "
     "logits, as before the fused classifier; same losses, gradients within float rounding)",
     NULL, NULL, 0},
    {"check-replicas", OPT_INT, F(check_replicas), 0, "0", 0, INT_MAX, NULL,
     "check data-parallel replicas hold identical parameters every N steps (0 = only at start)", NULL, NULL, 0},
    {"comm-timeout", OPT_REAL, F(comm_timeout), 0, "600", 0, 1e9, NULL,
     "end the job, naming the operation and the ranks that stopped answering, when one communication call has blocked "
     "this long in seconds; also names the ranks of a lost node when the launcher ends the job (0 = wait forever, "
     "name none)",
     NULL, NULL, 0},
    {"steps", OPT_INT, F(steps), 0, "1000", 1, INT_MAX, NULL, "total optimizer steps of the run", NULL, NULL, 0},
    {"micro-batch", OPT_INT, F(micro_batch), 0, "16", 1, 1 << 20, NULL, "sequences per microbatch (per rank)", NULL,
     NULL, 0},
    {"global-batch", OPT_INT, F(global_batch), 0, "0", 0, 1 << 30, NULL,
     "sequences per optimizer step over all ranks; a multiple of micro batch x dp (0 = micro batch x dp)", NULL, NULL,
     0},
    {"seq-len", OPT_INT, F(seq_len), 0, "128", 1, 1 << 20, NULL, "tokens per sequence", NULL, NULL, 0},
    {"lr", OPT_REAL, F(lr), 0, "1e-3", 0, 10, NULL, "peak learning rate", NULL, NULL, 0},
    {"min-lr", OPT_REAL, F(min_lr), 0, "1e-4", 0, 10, NULL, "learning rate at the end of the cosine decay", NULL, NULL,
     0},
    {"warmup", OPT_INT, F(warmup), 0, "50", 0, INT_MAX, NULL, "linear warmup steps", NULL, NULL, 0},
    {"lr-schedule", OPT_STR, F(lr_schedule), S(lr_schedule), "cosine", 0, 0, lr_kind_names,
     "after the warmup: cosine (to --min-lr at the last step) | linear (likewise) | constant | wsd "
     "(warmup-stable-decay: --lr until the last --decay-steps, then a --decay-shape decay towards --min-lr, as "
     "Megatron-LM and llm.c)",
     NULL, NULL, 0},
    {"decay-steps", OPT_INT, F(decay_steps), 0, "0", 0, INT_MAX, NULL,
     "with --lr-schedule wsd: the last N steps decay (0 = the last 20 % of --steps, as llm.c)", NULL, NULL, 0},
    {"decay-shape", OPT_STR, F(decay_shape), S(decay_shape), "", 0, 0, decay_shape_choices,
     "with --lr-schedule wsd: linear | cosine | 1-sqrt (empty = 1-sqrt)", NULL, NULL, 0},
    {"weight-decay", OPT_REAL, F(weight_decay), 0, "0.1", 0, 10, NULL,
     "AdamW decoupled weight decay (2-D tensors only)", NULL, NULL, 0},
    {"grad-clip", OPT_REAL, F(grad_clip), 0, "1.0", 0, 1e30, NULL, "clip the global gradient norm to this (0 = off)",
     NULL, NULL, 0},
    {"spike-z", OPT_REAL, F(spike_z), 0, "6", 0, 1e9, NULL,
     "skip a step whose loss is more than Z standard deviations above the mean of the last --spike-window steps' "
     "losses (0 = no such test; a non-finite loss or gradient norm is always skipped)",
     NULL, NULL, 0},
    {"spike-window", OPT_INT, F(spike_window), 0, "50", 0, 1024 /* SPIKE_WINDOW_MAX */, NULL,
     "losses in the window of --spike-z; it judges once it holds 10 of them (or all N when N < 10) (0 = no z test)",
     NULL, NULL, 0},
    {"spike-max", OPT_INT, F(spike_max), 0, "5", 0, INT_MAX, NULL,
     "after N consecutive skipped steps go back to the last checkpoint (--ckpt-dir) and continue on the data after the "
     "skipped batches, or stop when there is none (0 = skip nothing, no z test: a non-finite loss or norm ends the "
     "run)",
     NULL, NULL, 0},
    {"spike-rollbacks", OPT_INT, F(spike_rollbacks), 0, "3", 0, INT_MAX, NULL,
     "stop instead of going back to the same checkpoint (no newer one written since) more than N times: the loss "
     "keeps spiking past the skipped data (0 = stop at the first --spike-max run of skips)",
     NULL, NULL, 0},
    {"beta1", OPT_REAL, F(beta1), 0, "0.9", 0, 0.999999, NULL, "AdamW beta1", NULL, NULL, 0},
    {"beta2", OPT_REAL, F(beta2), 0, "0.95", 0, 0.999999999, NULL, "AdamW beta2", NULL, NULL, 0},
    {"adam-eps", OPT_REAL, F(adam_eps), 0, "1e-8", 0, 1, NULL, "AdamW epsilon", NULL, NULL, 0},
    {"seed", OPT_LLONG, F(seed), 0, "1337", 0, 9.0e18, NULL, "seed of initialisation, data order and sampling", NULL,
     NULL, 0},
    {"data", OPT_STR, F(data), S(data), "data/gutenberg_train_*.bin", 0, 0, NULL,
     "training data: a glob of token shards, a Megatron prefix, or a blend \"W1 PATH1 W2 PATH2 ...\" (doc/data.md)",
     NULL, NULL, 0},
    {"val-data", OPT_STR, F(val_data), S(val_data), "data/gutenberg_val_*.bin", 0, 0, NULL,
     "validation data, as --data (a blend too)", NULL, NULL, 0},
    {"data-format", OPT_ENUM, F(data_format), 0, "llmc", 0, 0, tokens_format_names,
     "token file format: llmc (headered shards) | raw-u16 (nanoGPT .bin) | megatron (Megatron-LM/GPT-NeoX PREFIX.bin + "
     "PREFIX.idx); a path in --data may override it with a llmc:, raw-u16: or megatron: prefix",
     NULL, NULL, 0},
    {"val-every", OPT_INT, F(val_every), 0, "100", 0, INT_MAX, NULL,
     "validate every N steps and at the end (0 = never)", NULL, NULL, 0},
    {"val-batches", OPT_INT, F(val_batches), 0, "16", 1, INT_MAX, NULL,
     "microbatches of validation data per evaluation", NULL, NULL, 0},
    {"eval-mc", OPT_ARG, F(eval_mc), S(eval_mc), NULL, 0, 0, NULL,
     "score a multiple-choice eval file (llm.c's format: dtrain-prepare --eval-mc writes one) every --eval-every "
     "steps: each completion's mean and summed loss after its context, the lowest wins (acc_norm and acc); "
     "repeatable, or FILE,FILE",
     "FILE", add_eval_mc, 0},
    {"eval-every", OPT_INT, F(eval_every), 0, "100", 1, INT_MAX, NULL,
     "with --eval-mc: score the files every N steps and at the end", NULL, NULL, 0},
    {"eval-mc-dump", OPT_STR, F(eval_mc_dump), S(eval_mc_dump), "", 0, 0, NULL,
     "with --eval-mc: append every example's scores to FILE at each evaluation (JSON lines)", "FILE", NULL, 0},
    {"doc-mask", OPT_FLAG, F(doc_mask), 0, "0", 0, 1, NULL,
     "document masking: attention never crosses a document boundary and positions (learned or RoPE) restart at each "
     "document; the boundaries are a Megatron index's documents, or the doc_start / doc_end tokens the data's "
     "tokenizer sidecar names (other data without them is an error)",
     NULL, NULL, 0},
    {"metrics", OPT_STR, F(metrics), S(metrics), "", 0, 0, NULL,
     "write one JSON object per step to FILE (non-finite values as null; a write that fails mid-run warns once and "
     "the run goes on without it)",
     "FILE", NULL, 0},
    {"tensorboard", OPT_STR, F(tensorboard), S(tensorboard), "", 0, 0, NULL,
     "write TensorBoard event files into DIR (created with its parents if missing): per step the loss, validation "
     "loss, learning rate, gradient norm, tokens/s, MFU, memory peaks and exposed communication (a write that "
     "fails mid-run warns once; the run goes on without events)",
     "DIR", NULL, 0},
    {"ckpt-dir", OPT_STR, F(ckpt_dir), S(ckpt_dir), "", 0, 0, NULL,
     "write checkpoints (HDF5, any layout loads them) into DIR, created with its parents if missing", "DIR", NULL, 0},
    {"ckpt-every", OPT_INT, F(ckpt_every), 0, "0", 0, INT_MAX, NULL,
     "checkpoint every N steps (0 = only at the end); needs --ckpt-dir", NULL, NULL, 0},
    {"keep", OPT_INT, F(keep), 0, "0", 0, INT_MAX, NULL,
     "keep the newest N checkpoints in --ckpt-dir, removing older ones once a new one is complete (0 = all)", NULL,
     NULL, 0},
    {"ckpt-async", OPT_FLAG, F(ckpt_async), 0, "0", 0, 1, NULL,
     "asynchronous checkpoints: at the step boundary each rank only copies its state into host memory of its own "
     "(without --zero the copy overlaps the next step, which waits for it before its update), and a background thread "
     "writes the same file (same atomic protocol and checksums) while training goes on; the next "
     "checkpoint, a stop signal and the end of the run wait for it; needs --ckpt-dir",
     NULL, NULL, 0},
    {"stop-at-step", OPT_INT, F(stop_at_step), 0, "0", 0, INT_MAX, NULL,
     "end this job after step N (checkpointed with --ckpt-dir) and leave the rest of --steps to a resumed run (0 = run "
     "to --steps)",
     NULL, NULL, 0},
    {"resume", OPT_STR, F(resume), S(resume), "", 0, 0, NULL,
     "continue from a checkpoint: auto (the newest complete one in --ckpt-dir, or a fresh start) or FILE", "FILE", NULL,
     0},
    {"init-from", OPT_STR, F(init_from), S(init_from), "", 0, 0, NULL,
     "start from the weights of a Hugging Face model directory (config.json + model.safetensors or sharded with "
     "model.safetensors.index.json: GPT2LMHeadModel, LlamaForCausalLM (rope_scaling llama3 or linear), Llama-shaped "
     "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM; f32, f16 or bf16) or an llm.c GPT-2 model file "
     "(gpt2_124M.bin, fp32 or bf16): the model comes from the file (a disagreeing "
     "--model, --n-layer, ... is an error), every rank reads only its slices, training starts at step 0 with fresh "
     "AdamW state; a checkpoint that --resume finds wins over it",
     "PATH", NULL, 0},
    {"save-params", OPT_STR, F(save_params), S(save_params), "", 0, 0, NULL,
     "at the end, write the trained parameters as logical tensors to FILE (HDF5, any layout reads it)", "FILE", NULL,
     0},
    {"trace", OPT_STR, F(trace), S(trace), "", 0, 0, NULL,
     "write a Chrome/Perfetto trace of every rank (layer and communication spans) to FILE", "FILE", NULL, 0},
    {"straggler-every", OPT_INT, F(straggler_every), 0, "0", 0, INT_MAX, NULL,
     "every N steps name the rank and host with the most compute per step over those N steps (time blocked on peers "
     "left out) and its ratio to the median rank (0 = never)",
     NULL, NULL, 0},
    {"sample-tokens", OPT_INT, F(sample_tokens), 0, "256", 0, 1 << 20, NULL,
     "tokens to generate at the end (0 = no sample; not given, 0 under --cp, whose ranks hold parts of a sequence)",
     NULL, NULL, F(sample_given) + 1},
    {"prompt", OPT_STR, F(prompt), S(prompt), "ALICE.", 0, 0, NULL,
     "text the sample continues, encoded with --tokenizer after its document start token (without a tokenizer the "
     "sample starts from token 0)",
     NULL, NULL, 0},
    {"tokenizer", OPT_STR, F(tokenizer), S(tokenizer), "auto", 0, 0, NULL,
     "tokenizer of the sample and --prompt: auto (the one the data's sidecar PREFIX.tokenizer.json names, else byte "
     "for a 256-token vocabulary, else none) | none (the sample prints token ids) | byte | gpt2[:DIR] | "
     "tiktoken:FILE[:ENCODING] | spm:MODEL | hf:TOKENIZER_JSON",
     "SPEC", NULL, 0},
    {"temperature", OPT_REAL, F(temperature), 0, "0.8", 0, 100, NULL, "sampling temperature (0 = greedy)", NULL, NULL,
     0},
    {"top-k", OPT_INT, F(top_k), 0, "40", 0, 1 << 24, NULL, "sample from the k most likely tokens (0 = all)", NULL,
     NULL, 0},
    {"threads", OPT_INT, F(threads), 0, "0", 0, 4096, NULL,
     "OpenMP/OpenBLAS threads per rank (0 = OMP_NUM_THREADS, else the node's cores shared by its ranks)", NULL, NULL,
     0},
    {"peak-gflops", OPT_REAL, F(peak_gflops), 0, "0", 0, 1e12, NULL,
     "peak GFLOP/s for MFU (0 = measure with a short sgemm probe); with --plan --hw cpu, the profile's peak", NULL,
     NULL, 0},
    {"plan", OPT_FLAG, F(plan), 0, "0", 0, 1, NULL,
     "print the per-rank memory, FLOPs, communication and predicted step time of this configuration and exit without "
     "training (one process is enough)",
     NULL, NULL, 0},
    {"search", OPT_FLAG, F(search), 0, "0", 0, 1, NULL,
     "with --plan and --gpus: list the layouts (tp, pp, dp, zero, recompute, micro batch) that fit, best predicted "
     "tokens/s first",
     NULL, NULL, 0},
    {"gpus", OPT_INT, F(gpus), 0, "0", 0, 1 << 24, NULL,
     "with --plan: devices in all; dp = N / (tp x pp) (0 = --dp, or the world size)", NULL, NULL, 0},
    {"hw", OPT_STR, F(hw), S(hw), "", 0, 0, NULL,
     "with --plan: hardware profile h100-sxm | a100-80g | cpu, or a FILE of key = value lines (empty = h100-sxm)",
     "FILE", NULL, 0},
    {"plan-dtype", OPT_ENUM, F(plan_dtype), 0, "", 0, 0, plan_dtype_names,
     "with --plan: fp32 | bf16 (dtrain's own buffers under --dtype fp32 or bf16, exactly) | megatron (Megatron-LM's "
     "bf16 layout for comparison: bf16 weights, fp32 gradients, master weights and AdamW moments; Korthikanti "
     "activations) (empty = bf16 on GPU profiles, fp32 on cpu)",
     NULL, NULL, 0},
    {"gpu-mem", OPT_REAL, F(gpu_mem), 0, "0", 0, 1e9, NULL,
     "with --plan: device memory per rank in GiB (0 = the hardware profile's)", NULL, NULL, 0},
    {"plan-doc-len", OPT_INT, F(plan_doc_len), 0, "0", 0, 1 << 24, NULL,
     "with --plan --doc-mask: mean document length: each sequence cut into documents of N tokens and a last one of "
     "the rest; attention FLOPs and time count sum(L^2) / seq-len positions per token (0 = one document per sequence)",
     "N", NULL, 0},
    {"device", OPT_ENUM, F(device), 0, "auto", 0, 0, backend_device_names,
     "compute backend: cpu | cuda (one GPU per rank, chosen by local rank) | auto (cuda when built with it and a GPU "
     "is visible, else cpu)",
     NULL, NULL, 0},
    {"dtype", OPT_ENUM, F(dtype), 0, "auto", 0, 0, backend_dtype_names,
     "matmul precision: bf16 (operands rounded to bf16, fp32 sums; a bf16 weight copy and the matmul-only activations "
     "kept in bf16; master weights, gradients, AdamW state and other activations fp32) | fp32 | auto (bf16 on cuda, "
     "fp32 on cpu)",
     NULL, NULL, 0},
    {"comm", OPT_ENUM, F(comm), 0, "auto", 0, 0, backend_comm_names,
     "communication library of the tp, dp, pipeline, embedding, ZeRO, expert, context and world groups: nccl (GPU "
     "to GPU, needs --device cuda; the pipeline's messages as ncclSend/ncclRecv in one global order, paired in "
     "groups) | mpi | auto (nccl when every rank runs on cuda on a GPU of its own and there is more than one rank, "
     "else mpi)",
     NULL, NULL, 0},
    {"cuda-graphs", OPT_FLAG, F(cuda_graphs), 0, "0", 0, 1, NULL,
     "with --device cuda: capture the op sequences that repeat from step to step (a microbatch's forward, loss and "
     "backward between the host's waits and the communication) into CUDA graphs, each launched as one, so small "
     "models are bound by the GPU, not by kernel launches; a sequence is captured the second time it is seen and "
     "captured again when its shapes, pointers or the backend's workspace change",
     NULL, NULL, 0},
    {"selftest", OPT_FLAG, F(selftest), 0, "0", 0, 1, NULL,
     "compare every CUDA op with the CPU op on random inputs (stated error bounds), print the results and exit (0 = "
     "all agree)",
     NULL, NULL, 0},
};
/* clang-format on */
#define N_OPTS ((int)(sizeof opt_defs / sizeof opt_defs[0]))

static const opt_table_t opt_table = {.prog = "dtrain", .defs = opt_defs, .n = N_OPTS};

static int load_config(const char *path, void *dst, void *field, char *err, size_t errlen)
{
    run_options_t *o = dst;
    if (strlen(path) >= sizeof o->config) {
        snprintf(err, errlen, "--config: value longer than %zu characters", sizeof o->config - 1);
        return -1;
    }
    memcpy(field, path, strlen(path) + 1);
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
        const opt_def_t *d = opt_find(&opt_table, key, strlen(key));
        if (!d || strcmp(key, "config") == 0) {
            snprintf(err, errlen, "%sunknown option '%s' (dtrain --help lists them)", where, key);
            rc = -1;
            break;
        }
        rc = opt_set(d, o, value, where, err, errlen);
    }
    if (rc == 0 && ferror(f)) {
        snprintf(err, errlen, "--config %s: read error", path);
        rc = -1;
    }
    fclose(f);
    return rc;
}

static void print_help(FILE *out)
{
    fprintf(out, "usage: dtrain [--config FILE] [--option value ...]\n"
                 "Train a GPT-2 or Llama style transformer on token shards.\n\n"
                 "Options (default in brackets; config files use the same names without --):\n");
    opt_print_help(&opt_table, out, 24, 1);
    fprintf(out, "\nModel presets:\n");
    for (const model_preset_t *p = model_presets(); p->name; p++)
        fprintf(out, "  %-12s %s\n", p->name, p->about);
}

/* --lr-schedule and its decay, checked and resolved once into o->sched
 * (lr_schedule_make's checks; options_resolve copies it): at parsing, so
 * that --plan --search, which resolves only the layouts it tries, reports
 * a bad schedule too. The spike guard's options need no check beyond
 * their ranges (--spike-max 0 turns the whole guard off, the z test
 * included). */
static int check_schedule_spike(run_options_t *o, char *err, size_t errlen)
{
    return lr_schedule_make(&o->sched, o->lr_schedule, o->decay_shape, o->lr, o->min_lr, o->warmup, o->steps,
                            o->decay_steps, err, errlen);
}

/* --logits-chunk into o->logits_chunk (model_layout_t's). */
static int check_logits_chunk(run_options_t *o, char *err, size_t errlen)
{
    long rows;
    if (strcmp(o->logits_chunk_arg, "auto") == 0)
        o->logits_chunk = MODEL_LOGITS_AUTO;
    else if (strcmp(o->logits_chunk_arg, "whole") == 0)
        o->logits_chunk = MODEL_LOGITS_WHOLE;
    else if (parse_long(o->logits_chunk_arg, 1, INT_MAX, &rows) == 0)
        o->logits_chunk = (int)rows;
    else {
        snprintf(err, errlen, "--logits-chunk '%s': give auto, whole or a number of rows >= 1", o->logits_chunk_arg);
        return -1;
    }
    return 0;
}

/* --ckpt-async changes how --ckpt-dir's checkpoints are written: alone it would be ignored */
static int check_ckpt_async(const run_options_t *o, char *err, size_t errlen)
{
    if (o->ckpt_async && !o->ckpt_dir[0]) {
        snprintf(err, errlen,
                 "--ckpt-async writes the checkpoints of --ckpt-dir in the background: "
                 "give --ckpt-dir DIR");
        return -1;
    }
    return 0;
}

static int check_consistency(const run_options_t *o, char *err, size_t errlen)
{
    if (!model_preset_find(o->model)) {
        char names[256] = "";
        for (const model_preset_t *p = model_presets(); p->name; p++)
            snprintf(names + strlen(names), sizeof names - strlen(names), "%s%s", p == model_presets() ? "" : "|",
                     p->name);
        snprintf(err, errlen, "--model '%s': unknown preset, allowed %s", o->model, names);
        return -1;
    }
    if (o->global_batch != 0 && o->global_batch % o->micro_batch != 0) {
        snprintf(err, errlen, "--global-batch %d must be a multiple of --micro-batch %d", o->global_batch,
                 o->micro_batch);
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
    if (o->keep > 0 && !o->ckpt_dir[0]) {
        snprintf(err, errlen, "--keep %d keeps the newest checkpoints of --ckpt-dir: give --ckpt-dir DIR", o->keep);
        return -1;
    }
    if (o->stop_at_step > 0 && !o->ckpt_dir[0]) {
        /* the job would stop early and throw its steps away */
        snprintf(err, errlen,
                 "--stop-at-step %d ends this job early for a later one to continue from its checkpoint: give "
                 "--ckpt-dir DIR (or --steps %d for a shorter run)",
                 o->stop_at_step, o->stop_at_step);
        return -1;
    }
    if (check_ckpt_async(o, err, errlen) != 0)
        return -1;
    if (strcmp(o->resume, "auto") == 0 && !o->ckpt_dir[0]) {
        snprintf(err, errlen, "--resume auto looks in --ckpt-dir: give --ckpt-dir DIR (or --resume FILE)");
        return -1;
    }
    /* options that only the planner reads are refused elsewhere, never ignored */
    const char *plan_only = o->search                          ? "search"
                            : o->gpus                          ? "gpus"
                            : o->hw[0]                         ? "hw"
                            : o->plan_dtype != PLAN_DTYPE_AUTO ? "plan-dtype"
                            : o->gpu_mem > 0                   ? "gpu-mem"
                            : o->plan_doc_len                  ? "plan-doc-len"
                                                               : NULL;
    if (plan_only && !o->plan) {
        snprintf(err, errlen, "--%s is an option of the planner: add --plan (which trains nothing)", plan_only);
        return -1;
    }
    if (o->search && !o->gpus) {
        snprintf(err, errlen, "--search needs --gpus N: the number of devices the layouts share");
        return -1;
    }
    if (o->fsdp != FSDP_UNSET && o->zero != 0) {
        snprintf(err, errlen, "--fsdp %s and --zero %d both set the sharding stage: give one of them",
                 options_fsdp_names[o->fsdp], o->zero);
        return -1;
    }
    if (o->eval_mc_dump[0] && !o->eval_mc[0]) {
        snprintf(err, errlen, "--eval-mc-dump %s writes --eval-mc's scores: add --eval-mc FILE", o->eval_mc_dump);
        return -1;
    }
    if (o->val_every > 0 && !o->val_data[0]) {
        snprintf(err, errlen, "--val-every %d needs --val-data (or set --val-every 0)", o->val_every);
        return -1;
    }
    return 0;
}

options_status_t options_parse(run_options_t *o, int argc, char **argv, int print, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    if (opt_defaults(&opt_table, o, err, errlen) != 0)
        return OPTIONS_ERROR;
    /* --help/--version win wherever they are */
    if (opt_answer_help(argc, argv, print, print_help, "dtrain " PACKAGE_VERSION))
        return OPTIONS_EXIT_OK;
    /* --config first, so that the other command-line options override it */
    if (opt_parse_argv(&opt_table, argc, argv, o, "config", NULL, NULL, err, errlen) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, o, NULL, "config", NULL, err, errlen) != 0)
        return OPTIONS_ERROR;
#ifndef HAVE_CUDA
    if (o->device == BACKEND_CUDA || o->comm == BACKEND_COMM_NCCL || o->selftest) {
        snprintf(err, errlen, "%s: this dtrain is built without the CUDA backend: rebuild with ./configure --with-cuda",
                 o->selftest                    ? "--selftest"
                 : o->comm == BACKEND_COMM_NCCL ? "--comm nccl"
                                                : "--device cuda");
        return OPTIONS_ERROR;
    }
#endif
    if (o->comm == BACKEND_COMM_NCCL && o->device == BACKEND_CPU) {
        snprintf(err, errlen, "--comm nccl runs between GPUs: use it with --device cuda (or auto), or --comm mpi");
        return OPTIONS_ERROR;
    }
    if (check_schedule_spike(o, err, errlen) != 0 || check_logits_chunk(o, err, errlen) != 0 ||
        check_consistency(o, err, errlen) != 0)
        return OPTIONS_ERROR;
    if (o->cp > 1 && !o->sample_given) /* the default sample needs a whole sequence on one rank */
        o->sample_tokens = 0;
    return OPTIONS_OK;
}

int options_zero_stage(const run_options_t *o)
{
    static const int stage[] = {[FSDP_NO_SHARD] = 0, [FSDP_SHARD_GRAD_OP] = 2, [FSDP_FULL_SHARD] = 3};
    return o->fsdp == FSDP_UNSET ? o->zero : stage[o->fsdp];
}

enum {
    MOE_EXPERTS,
    MOE_TOP_K,
    MOE_FFN,
    MOE_EVERY,
    MOE_FIRST_DENSE,
    MOE_ROUTER,
    MOE_NORM_TOPK,
    MOE_SHARED,
    MOE_AUX,
    MOE_Z,
    MOE_CAPACITY,
    MOE_SHARED_GATE,
    MOE_BIAS_RATE
};

/* The --moe-* options of the mixture's shape over the preset's. A dense
 * preset given --moe-experts becomes a mixture with the options'
 * defaults (top-2 of experts as wide as its MLP, every layer, softmax
 * renormalised over the chosen, Mixtral's). */
static void moe_shape_options(const run_options_t *o, model_config_t *c)
{
    moe_config_t *e = &c->moe;
    const int *given = o->moe_given;
    if (given[MOE_EXPERTS] && o->moe_experts == 0) {
        memset(e, 0, sizeof *e);
        return;
    }
    if (given[MOE_EXPERTS] && e->experts == 0)
        *e = (moe_config_t){.top_k = 2, .ffn = c->d_ff, .every = 1, .norm_topk = 1};
    if (given[MOE_EXPERTS])
        e->experts = o->moe_experts;
    if (given[MOE_TOP_K])
        e->top_k = o->moe_top_k;
    if (given[MOE_FFN])
        e->ffn = o->moe_ffn;
    if (given[MOE_EVERY])
        e->every = o->moe_every;
    if (given[MOE_FIRST_DENSE])
        e->first_dense = o->moe_first_dense;
    if (given[MOE_ROUTER] && o->moe_router[0])
        e->router = (moe_router_t)model_moe_router_of(o->moe_router);
    if (given[MOE_NORM_TOPK])
        e->norm_topk = o->moe_norm_topk;
    if (given[MOE_SHARED])
        e->shared_ffn = o->moe_shared_ffn;
    if (given[MOE_SHARED_GATE])
        e->shared_gate = o->moe_shared_gate;
}

/* The run's side of the mixture: its loss coefficients and capacity (the
 * options' defaults where neither they nor the preset give one). */
static void moe_run_options(const run_options_t *o, model_config_t *c)
{
    moe_config_t *e = &c->moe;
    const int *given = o->moe_given;
    if (e->experts == 0) { /* a dense model: any of these is an error model_config_check reports */
        if (given[MOE_TOP_K] || given[MOE_FFN] || given[MOE_SHARED] || given[MOE_SHARED_GATE] || given[MOE_CAPACITY] ||
            given[MOE_BIAS_RATE]) {
            e->top_k = o->moe_top_k;
            e->ffn = o->moe_ffn;
            e->shared_ffn = o->moe_shared_ffn;
            e->shared_gate = o->moe_shared_gate;
            e->capacity = (float)o->moe_capacity;
            e->bias_rate = (float)o->moe_bias_rate;
        }
        return;
    }
    if (given[MOE_AUX] || (e->aux_coef == 0 && e->z_coef == 0))
        e->aux_coef = (float)o->moe_aux_coef;
    if (given[MOE_Z])
        e->z_coef = (float)o->moe_z_coef;
    if (given[MOE_CAPACITY])
        e->capacity = (float)o->moe_capacity;
    if (given[MOE_BIAS_RATE])
        e->bias_rate = (float)o->moe_bias_rate;
}

/* options_model_config under --init-from: the file's model, checked
 * against the explicitly given model options (--model, --arch, --n-layer,
 * ... : any that disagrees is an error), with Llama's max_seq raised to
 * --seq-len as for the presets. */
static int init_from_conflict(char *err, size_t errlen, const char *opt, long long given, long long file,
                              const char *path)
{
    snprintf(err, errlen,
             "--%s %lld conflicts with --init-from %s, whose model has %lld: drop the option "
             "(the model comes from the file)",
             opt, given, path, file);
    return -1;
}

static int init_from_model_config(const run_options_t *o, model_config_t *c, char *err, size_t errlen)
{
    init_from_kind_t kind;
    char dir[OPT_PATH_MAX];
    if (init_from_probe(o->init_from, &kind, dir, sizeof dir, c, err, errlen) != 0)
        return -1;
    const model_preset_t *p = model_preset_find(o->model);
    if (o->model_set && p &&
        (p->cfg.arch != c->arch || p->cfg.vocab_size != c->vocab_size || p->cfg.n_layer != c->n_layer ||
         p->cfg.n_head != c->n_head || p->cfg.n_kv_head != c->n_kv_head || p->cfg.d_model != c->d_model ||
         p->cfg.d_ff != c->d_ff)) {
        snprintf(err, errlen,
                 "--model %s conflicts with --init-from %s, which holds a %s model of %d layers, "
                 "d_model %d, vocabulary %d: drop --model (the model comes from the file)",
                 o->model, o->init_from, model_arch_name(c->arch), c->n_layer, c->d_model, c->vocab_size);
        return -1;
    }
    if (o->arch[0] && strcmp(o->arch, model_arch_name(c->arch)) != 0) {
        snprintf(err, errlen, "--arch %s conflicts with --init-from %s, which holds a %s model: drop --arch", o->arch,
                 o->init_from, model_arch_name(c->arch));
        return -1;
    }
    const struct {
        const char *opt;
        int given, file;
    } f[] = {
        {"n-layer", o->n_layer, c->n_layer},
        {"n-head", o->n_head, c->n_head},
        {"n-kv-head", o->n_kv_head, c->n_kv_head},
        {"d-model", o->d_model, c->d_model},
        {"d-ff", o->d_ff, c->d_ff},
        {"vocab-size", o->vocab_size, c->vocab_size},
        {"max-seq-len", o->max_seq_len, c->max_seq},
    };
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++)
        if (f[i].given && f[i].given != f[i].file)
            return init_from_conflict(err, errlen, f[i].opt, f[i].given, f[i].file, o->init_from);
    for (int i = MOE_EXPERTS; i <= MOE_SHARED_GATE; i++)
        if (o->moe_given[i] && i != MOE_AUX && i != MOE_Z && i != MOE_CAPACITY) {
            snprintf(err, errlen,
                     "the --moe-* options of the mixture's shape conflict with --init-from %s: drop them (the model "
                     "comes from the file)",
                     o->init_from);
            return -1;
        }
    if (c->arch == ARCH_LLAMA && o->seq_len > c->max_seq)
        c->max_seq = o->seq_len; /* RoPE has no table of positions to outgrow */
    moe_run_options(o, c);
    return model_config_check(c, err, errlen);
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
    moe_shape_options(o, c);
    moe_run_options(o, c);
    return model_config_check(c, err, errlen);
}

int options_check_grid(const model_config_t *c, int tp, int pp, char *err, size_t errlen)
{
    if (c->n_head % tp || c->n_kv_head % tp || c->d_ff % tp) {
        snprintf(err, errlen,
                 "--tp %d must divide the attention heads (%d), the KV heads (%d) and the FFN "
                 "width (%d); pick a --tp that divides all three",
                 tp, c->n_head, c->n_kv_head, c->d_ff);
        return -1;
    }
    if (pp > c->n_layer) {
        snprintf(err, errlen, "--pp %d exceeds the model's %d layers: every stage needs at least one", pp, c->n_layer);
        return -1;
    }
    return 0;
}

/* Microbatches per optimizer step for data-parallel size dp: the one
 * formula of the global batch (--global-batch, or micro batch x dp). */
static int accum_steps(const run_options_t *o, int dp)
{
    int gb = o->global_batch ? o->global_batch : o->micro_batch * dp;
    return gb / (o->micro_batch * dp);
}

/* The layout checks that need the model and the grid; one line in err,
 * the same on every rank. */
/* --pp-schedule interleaved and --pp-virtual: each needs the other, the
 * chunks need a layer each, and the step's microbatches come in groups of
 * pp (pipe_shape_check's rule). */
static int check_virtual(const run_options_t *o, const model_config_t *c, int pp, int dp, char *err, size_t errlen)
{
    const int V = o->pp_virtual;
    if (o->pp_schedule == PIPE_ZBH1 && pp < 2) {
        snprintf(err, errlen, "--pp-schedule zb-h1 needs --pp 2 or more (got --pp %d); drop it or add --pp", pp);
        return -1;
    }
    if (o->pp_schedule != PIPE_INTERLEAVED) {
        if (V > 1)
            snprintf(err, errlen, "--pp-virtual %d applies to --pp-schedule interleaved; add it, or drop --pp-virtual",
                     V);
        return V > 1 ? -1 : 0;
    }
    if (pp < 2 || V < 2) {
        snprintf(err, errlen,
                 "--pp-schedule interleaved needs --pp 2 or more and --pp-virtual 2 or more (got --pp %d "
                 "--pp-virtual %d); one chunk per stage is --pp-schedule 1f1b",
                 pp, V);
        return -1;
    }
    if (pp * V > c->n_layer) {
        snprintf(err, errlen,
                 "--pp %d x --pp-virtual %d = %d chunks exceeds the model's %d layers: every chunk needs at least one; "
                 "lower --pp-virtual",
                 pp, V, pp * V, c->n_layer);
        return -1;
    }
    const pipe_shape_t sh = {.kind = PIPE_INTERLEAVED, .stages = pp, .virt = V, .micro = accum_steps(o, dp)};
    char why[200];
    if (pipe_shape_check(&sh, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: set --global-batch to a multiple of %d x micro batch x dp", why, pp);
        return -1;
    }
    return 0;
}

/* --ep N: the experts and the data-parallel ranks split in N (with --etp
 * 1 the ranks of the TP x DP plane). ZeRO shards the expert state over
 * the expert-DP group (mpi/zero.h); hybrid sharding would need expert
 * shard and replica groups, which the grid does not make. */
static int gcd_int(int a, int b) { return b ? gcd_int(b, a % b) : a; }

/* The grid's DP axis, which the EP and hybrid-shard groups are cut from:
 * dp x cp ranks (dp: the ranks drawing distinct data). */
static int dp_axis(const run_options_t *o, int dp) { return dp * (o->cp > 1 ? o->cp : 1); }

static int check_ep(const run_options_t *o, const model_config_t *c, int tp, int dp, char *err, size_t errlen)
{
    const int cp = o->cp > 1 ? o->cp : 1, axis = dp_axis(o, dp);
    const int spans = o->etp == 1 && tp > 1, plane = spans ? tp * axis : axis;
    if (o->etp != 0 && o->etp != 1 && o->etp != tp)
        snprintf(err, errlen, "--etp %d must be 1 (whole experts) or --tp %d (experts split as the dense MLP)", o->etp,
                 tp);
    else if (spans && c->moe.experts == 0)
        snprintf(err, errlen,
                 "--etp 1 keeps a mixture's experts whole over the TP ranks, but the model has none: "
                 "drop --etp or use a MoE --model (tiny-moe)");
    else if (o->ep > 1 && c->moe.experts == 0)
        snprintf(err, errlen,
                 "--ep %d splits a mixture's experts over ranks, but the model has none: add "
                 "--moe-experts E or use a MoE --model (tiny-moe)",
                 o->ep);
    else if (o->ep > 1 && c->moe.experts % o->ep != 0)
        snprintf(err, errlen, "--ep %d must divide the model's %d experts", o->ep, c->moe.experts);
    else if (o->ep > 1 && !spans && axis % o->ep != 0)
        snprintf(err, errlen,
                 "--ep %d must divide the data-parallel size %d (world size / (tp x pp)%s): launch a "
                 "multiple of %d x tp x pp ranks, change --ep, or cut it across the TP ranks with --etp 1",
                 o->ep, axis, cp > 1 ? ", the CP ranks included" : "", o->ep);
    else if (o->ep > 1 && plane % o->ep != 0)
        snprintf(err, errlen,
                 "--ep %d with --etp 1 must divide tp x dp = %d (world size / pp): launch a multiple of "
                 "%d x pp ranks or change --ep",
                 o->ep, plane, o->ep);
    else if (spans && ((long)o->micro_batch * o->seq_len / cp) % tp != 0)
        snprintf(err, errlen,
                 "--etp 1: micro batch x seq len%s (%d x %d) must be a multiple of --tp %d (each TP rank "
                 "routes an equal share of the tokens)",
                 cp > 1 ? " / cp" : "", o->micro_batch, o->seq_len, tp);
    else if (spans && c->moe.capacity > 0 && o->micro_batch % tp != 0)
        snprintf(err, errlen,
                 "--etp 1 with --moe-capacity-factor: --micro-batch %d must be a multiple of --tp %d "
                 "(capacity is per sequence, and each TP rank routes whole sequences)",
                 o->micro_batch, tp);
    else if (spans && o->ep > 1 && o->hybrid_shard > 0 && o->hybrid_shard < axis && options_zero_stage(o) > 0 &&
             (o->hybrid_shard * tp) % o->ep != 0)
        snprintf(err, errlen,
                 "--hybrid-shard %d with --etp 1 --ep %d: a shard group's %d x tp %d ranks of the TP x DP plane "
                 "must hold whole EP groups: give --hybrid-shard a multiple of %d",
                 o->hybrid_shard, o->ep, o->hybrid_shard, tp, o->ep / gcd_int(o->ep, tp));
    else if (!spans && o->ep > 1 && o->hybrid_shard > 0 && o->hybrid_shard < axis && options_zero_stage(o) > 0 &&
             o->hybrid_shard % o->ep != 0)
        snprintf(err, errlen,
                 "--hybrid-shard %d with --ep %d: the shard group must be a multiple of the EP group, so "
                 "that it holds whole EP groups (the experts shard over the %s): give --hybrid-shard a multiple of %d",
                 o->hybrid_shard, o->ep, "expert-DP ranks inside it", o->ep);
    else
        return 0;
    return -1;
}

/* --cp N: the sequence cut into 2N chunks; what does not compose with it
 * yet is refused by name. */
static int check_cp(const run_options_t *o, const model_config_t *c, char *err, size_t errlen)
{
    const int N = o->cp;
    if (N <= 1)
        return 0;
    if (o->seq_len % (2 * N) != 0)
        snprintf(err, errlen,
                 "--cp %d: --seq-len %d must be a multiple of 2 x cp = %d (each rank holds two of the "
                 "2 x cp equal chunks)",
                 N, o->seq_len, 2 * N);
    else if (c->moe.experts > 0 && c->moe.capacity > 0)
        snprintf(err, errlen,
                 "--cp %d with --moe-capacity-factor is not implemented (the capacity ranks a whole sequence's "
                 "tokens, which the CP ranks hold between them): drop one of them",
                 N);
    else if (o->hybrid_shard > 0 && o->hybrid_shard % N != 0)
        snprintf(err, errlen,
                 "--cp %d with --hybrid-shard %d: a shard group must hold whole CP groups (it counts ranks of "
                 "dp x cp): give --hybrid-shard a multiple of %d",
                 N, o->hybrid_shard, N);
    else if (o->sample_tokens > 0 && o->sample_given)
        snprintf(err, errlen,
                 "--cp %d: --sample-tokens %d generates from a whole sequence on one rank: add "
                 "--sample-tokens 0",
                 N, o->sample_tokens);
    else
        return 0;
    return -1;
}

static int check_layout(const run_options_t *o, const model_config_t *c, int tp, int pp, int dp, char *err,
                        size_t errlen)
{
    if (o->global_batch != 0 && o->global_batch % (o->micro_batch * dp) != 0) {
        snprintf(err, errlen, "--global-batch %d must be a multiple of --micro-batch %d x dp %d = %d", o->global_batch,
                 o->micro_batch, dp, o->micro_batch * dp);
        return -1;
    }
    const int axis = dp_axis(o, dp);
    if (o->hybrid_shard > 0 && (axis % o->hybrid_shard != 0 || options_zero_stage(o) == 0)) {
        snprintf(err, errlen, "--hybrid-shard %d: %s", o->hybrid_shard,
                 options_zero_stage(o) == 0 ? "shards the ZeRO state: it needs --zero 1 or higher"
                                            : "must divide the data-parallel size");
        if (options_zero_stage(o) != 0)
            snprintf(err + strlen(err), errlen - strlen(err), " %d%s", axis, o->cp > 1 ? " (dp x cp)" : "");
        return -1;
    }
    if (options_check_grid(c, tp, pp, err, errlen) != 0 || check_virtual(o, c, pp, dp, err, errlen) != 0 ||
        check_ep(o, c, tp, dp, err, errlen) != 0 || check_cp(o, c, err, errlen) != 0)
        return -1;
    if (o->offload == OFFLOAD_NONE && o->offload_fraction != 1.0) {
        snprintf(err, errlen, "--offload-fraction %g applies to --offload optimizer; add it, or drop the fraction",
                 o->offload_fraction);
        return -1;
    }
    if (o->offload == OFFLOAD_OPTIMIZER && o->offload_fraction <= 0.0) {
        snprintf(err, errlen, "--offload-fraction 0 offloads nothing: give a fraction in (0, 1], or drop --offload");
        return -1;
    }
    if (o->tp_comm_overlap && tp == 1) {
        snprintf(err, errlen, "--tp-comm-overlap overlaps tensor-parallel collectives: it needs --tp above 1");
        return -1;
    }
    if (o->tp_comm_overlap && o->pp_schedule == PIPE_ZBH1) {
        snprintf(err, errlen,
                 "--tp-comm-overlap runs the input gradients' reductions beside the weight-gradient GEMMs, which "
                 "--pp-schedule zb-h1 moves to its own pass: drop one of them");
        return -1;
    }
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
    if (pp > 1 && accum_steps(o, dp) < pp) {
        snprintf(err, errlen,
                 "--pp %d needs at least %d microbatches per step, got %d (global batch %d / "
                 "(micro batch %d x dp %d)); raise --global-batch or lower --micro-batch",
                 pp, pp, accum_steps(o, dp), o->global_batch ? o->global_batch : o->micro_batch * dp, o->micro_batch,
                 dp);
        return -1;
    }
    return 0;
}

/* layers[c] = blocks of model chunk c (pp of them, or pp x V under the
 * interleaved schedule): --pp-layers, or balanced. Returns 0, or -1 with
 * one line in err. */
static int chunk_layers(const run_options_t *o, int n_layer, int pp, int *layers, char *err, size_t errlen)
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
        snprintf(err, errlen, "--pp-layers '%s': needs %d counts (one per %s) summing to the model's %d layers",
                 o->pp_layers, pp, o->pp_virtual > 1 ? "chunk, pp x --pp-virtual" : "stage", n_layer);
        return -1;
    }
    return 0;
}

int options_resolve_layout(const run_options_t *o, const model_config_t *c, int tp, int pp, int dp, run_config_t *rc,
                           char *err, size_t errlen)
{
    memset(rc, 0, offsetof(run_config_t, stage_layers));
    const int V = o->pp_virtual > 1 ? o->pp_virtual : 1;
    if (check_layout(o, c, tp, pp, dp, err, errlen) != 0 ||
        chunk_layers(o, c->n_layer, pp * V, rc->chunk_layers, err, errlen) != 0)
        return -1;
    for (int s = 0; s < pp; s++) {
        rc->stage_layers[s] = 0;
        for (int k = 0; k < V; k++)
            rc->stage_layers[s] += rc->chunk_layers[s + k * pp];
    }
    rc->pp_virtual = V;
    rc->opt = o;
    rc->model = *c;
    rc->tp = tp;
    rc->pp = pp;
    rc->dp = dp;
    rc->ep = o->ep > 1 ? o->ep : 1;
    rc->etp = o->etp == 1 ? 1 : tp;
    rc->cp = o->cp > 1 ? o->cp : 1;
    rc->sequence_parallel = o->sequence_parallel;
    rc->zero_stage = options_zero_stage(o);
    rc->hybrid_shard = o->hybrid_shard > 0 && o->hybrid_shard < dp * rc->cp && rc->zero_stage > 0 ? o->hybrid_shard : 0;
    rc->shard = rc->hybrid_shard ? rc->hybrid_shard : dp * rc->cp; /* --cp: ZeRO over dp x cp */
    rc->micro_batch = o->micro_batch;
    rc->seq_len = o->seq_len;
    rc->accum = accum_steps(o, dp);
    rc->global_batch = rc->accum * o->micro_batch * dp;
    rc->pp_kind = o->pp_schedule;
    rc->recompute = o->recompute;
    rc->logits_chunk = o->logits_chunk;
    rc->ddp_mode = o->ddp_mode;
    rc->grad_dtype = o->grad_reduce_dtype;
    rc->tp_dtype = o->tp_comm_dtype;
    rc->tp_overlap = o->tp_comm_overlap;
    rc->offload_fraction = o->offload == OFFLOAD_OPTIMIZER ? o->offload_fraction : 0.0;
    rc->device = o->device;
    rc->dtype = o->dtype;
    rc->comm = o->comm;
    rc->data_format = o->data_format;
    rc->sched = o->sched;
    return 0;
}

int options_resolve(const run_options_t *o, int tp, int pp, int dp, run_config_t *rc, char *err, size_t errlen)
{
    model_config_t c;
    if (options_model_config(o, &c, err, errlen) != 0)
        return -1;
    return options_resolve_layout(o, &c, tp, pp, dp, rc, err, errlen);
}

int run_config_stage_begin(const run_config_t *rc, int s)
{
    int l0 = 0;
    for (int k = 0; k < s; k++)
        l0 += rc->chunk_layers[k];
    return l0;
}

int run_config_ep_spans_tp(const run_config_t *rc) { return rc->etp == 1 && rc->tp > 1; }

int run_config_weights_on_host(const run_config_t *rc, int bf16)
{
    return bf16 && rc->offload_fraction >= 1.0 && rc->zero_stage <= 2;
}

void run_config_stage_runs(const run_config_t *rc, int s, int *n_runs, int *begin, int *end)
{
    *n_runs = rc->pp_virtual;
    for (int k = 0; k < rc->pp_virtual; k++) {
        begin[k] = run_config_stage_begin(rc, s + k * rc->pp);
        end[k] = begin[k] + rc->chunk_layers[s + k * rc->pp];
    }
}

pipe_shape_t run_config_pipe_shape(const run_config_t *rc)
{
    return (pipe_shape_t){.kind = rc->pp_kind, .stages = rc->pp, .virt = rc->pp_virtual, .micro = rc->accum};
}

void options_print(const run_options_t *o, void *file) { opt_print_values(&opt_table, o, file); }
