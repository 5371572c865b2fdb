#include "src/plan/plan.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/mem.h"
#include "io/fsutil.h"
#include "mpi/ddp.h"
#include "mpi/pipeline.h"
#include "mpi/zero.h"
#include "src/model/flops.h"
#include "src/model/model.h"
#include "src/model/params.h"
#include "src/optim/optim.h"
#include "src/plan/hw.h"
#include "src/train/metrics.h"
#include "src/train/options.h"

/* Notation as in Korthikanti et al. 2022: s sequence length, b micro
 * batch, h d_model, a attention heads, t tensor-parallel size, p pipeline
 * stages, m microbatches per step, d data-parallel size, S the ZeRO shard
 * group's size (d, or --hybrid-shard). */

/* One layout to plan: the run as the trainer would resolve it. */
typedef struct plan_in {
    const model_config_t *c;
    const hw_profile_t *hw;
    run_config_t run;
    int bf16;     /* bf16 matmuls: dtrain's --dtype bf16, or Megatron's layout */
    int megatron; /* Megatron's bf16 layout (Korthikanti's activations) instead of dtrain's own buffers */
    int doc_mask; /* --doc-mask: the positions' buffer in the arena, attention within documents */
    int doc_len;  /* --plan-doc-len: documents of this many tokens (0: one per sequence) */
    double att_T; /* positions attended per token: sum(L^2) / T over a sequence's documents (T unmasked) */
    /* --cp: the sequence over cp ranks. run.dp is then the DP x CP group
     * the gradients and ZeRO go over (as the trainer's grid), dp_data the
     * ranks drawing distinct data, and a rank holds T / cp of each
     * sequence (local_tokens) */
    int cp, dp_data;
} plan_in_t;

/* The tokens of one microbatch on one rank: B T, or B T / cp. */
static double local_tokens(const plan_in_t *in) { return (double)in->run.micro_batch * in->run.seq_len / in->cp; }

/* One pipeline stage (every TP and DP rank of a stage holds the same). */
typedef struct stage_plan {
    int layers, slots;
    int slot_layers; /* blocks one activation slot holds: the stage's longest chunk */
    size_t n;        /* local parameters (floats of the flat buffer) */
    size_t shard_n;  /* this rank's ZeRO shard of them (pieces padded) */
    size_t logical;  /* logical parameters the stage owns (tied copy not counted) */
    double mem[MEM_N_CATEGORIES], total;
    double act_layer; /* activation bytes of one layer and one microbatch */
    double act_extra; /* activations outside the layers x microbatches product */
    double flops_mb;  /* FLOPs of one microbatch on one rank, recomputation included */
    double t_comp_mb, t_tp_mb;
    int tp_colls;                                     /* TP collectives per microbatch */
    double tp_bytes, pp_bytes, dp_bytes, embed_bytes; /* sent per step by one rank */
    double ep_bytes, t_ep_mb; /* --ep: the MoE layers' all-to-alls, per step and their time per microbatch */
    /* --cp: the ring's bytes per step, its whole transfer time and the part
     * the attention does not hide, per microbatch */
    double cp_bytes, t_cp_all_mb, t_cp_mb;
    int moe_layers;  /* MoE layers on the stage (all its chunks) */
    double p_layers; /* the stage's layers' active matmul parameters (flops_layer_params) */
    double t_dp, t_dp_exposed, t_embed, t_opt;
    /* --offload optimizer: elements in host memory (adamw_offload_count of
     * the optimizer's), their host bytes, and the update's two sides */
    size_t n_host;
    double host_bytes, t_opt_host, t_opt_dev;
    double host_weights; /* of host_bytes: the fp32 weights as the master copy (model_layout_t params_host) */
    double t_d2h, t_d2h_exposed; /* the gradients' copies down, and what the last backward leaves exposed */
} stage_plan_t;

typedef struct plan {
    plan_in_t in;
    stage_plan_t *st; /* [pp] */
    int worst;        /* stage with the largest total */
    size_t params_total;
    double mem_max[MEM_N_CATEGORIES + 1]; /* max over stages per category, and of the totals */
    double usable, margin;
    int fits;
    double flops_step, hw_flops_step;
    double t_mb, t_compute, t_tp, t_bubble, t_pp, t_pp_msg, t_dp, t_dp_total, t_embed, t_opt, t_step;
    double t_ep;           /* --ep: the slowest stage's all-to-alls (blocking, inside each microbatch) */
    double t_cp, t_cp_all; /* --cp: the slowest stage's exposed ring waits, and its transfers in all */
    double tokens_s, mfu, hfu, bubble_frac;
} plan_t;

static double div_up(double a, double b) { return ceil(a / b); }
static double round64(double bytes) { return ceil(bytes / 64.0) * 64.0; }

/* Achievable bandwidth for a group whose ranks span `span` consecutive
 * world ranks (rank = tp + TP*(dp + DP*pp)): inside a node or not. */
static double link_bw(const hw_profile_t *hw, long span)
{
    return span <= hw->gpus_per_node ? hw->intra_bw : hw->inter_bw;
}
static const char *link_name(const hw_profile_t *hw, long span)
{
    return span <= hw->gpus_per_node ? "intra-node" : "inter-node";
}

/* Korthikanti et al. 2022, Table 2: activation bytes of one transformer
 * layer and one microbatch at 16 bits, with tensor (and sequence)
 * parallelism over t ranks. */
static double korthikanti_layer(const plan_in_t *in, model_recompute_t rc)
{
    const double s = in->run.seq_len, b = in->run.micro_batch, h = in->c->d_model, a = in->c->n_head, t = in->run.tp;
    const double sbh = s * b * h, as_h = a * s / h;
    switch (rc) {
    case MODEL_RECOMPUTE_FULL: return in->run.sequence_parallel ? 2.0 * sbh / t : 2.0 * sbh;
    case MODEL_RECOMPUTE_SELECTIVE: return in->run.sequence_parallel ? 34.0 * sbh / t : sbh * (10.0 + 24.0 / t);
    case MODEL_RECOMPUTE_NONE:
    default:
        return in->run.sequence_parallel ? sbh / t * (34.0 + 5.0 * as_h) : sbh * (10.0 + 24.0 / t + 5.0 * as_h / t);
    }
}
/* The expert-DP group's size: the ranks holding the same experts (dp/ep,
 * or with --etp 1 tp x dp / ep). */
static int plan_edp(const run_config_t *r)
{
    return (run_config_ep_spans_tp(r) ? r->tp * r->dp : r->dp) / (r->ep > 1 ? r->ep : 1);
}

/* The ranks ZeRO shards the experts' state over: the expert-DP group, or
 * under --hybrid-shard H its H/ep ranks inside a shard group. */
static size_t plan_expert_shard(const run_config_t *r)
{
    const int spans = run_config_ep_spans_tp(r);
    if (r->hybrid_shard && (r->ep > 1 || spans))
        return (size_t)(r->hybrid_shard * (spans ? r->tp : 1) / (r->ep > 1 ? r->ep : 1));
    return (size_t)plan_edp(r);
}

/* The consecutive world ranks one EP group spans: tp x ep (an EP group
 * of DP ranks), or ep (--etp 1: ranks of the TP x DP plane). */
static long plan_ep_span(const run_config_t *r) { return run_config_ep_spans_tp(r) ? r->ep : (long)r->tp * r->ep; }

/* A stage's parameters cut into ZeRO's units by the trainer's own
 * functions (mpi/zero.h: zero_cut_units, zero_pieces) over S ranks, the
 * routed experts' parts over the dp/ep expert-DP ranks under --ep. */
typedef struct stage_units {
    size_t n;           /* local parameters */
    size_t outside;     /* parameters outside the blocks */
    size_t shard_n;     /* the rank's pieces of every unit */
    zero_shape_t shape; /* the shard, all-gather buffer and windows */
} stage_units_t;

/* The units of table t as the strategy cuts them (train.c's setup_sync
 * gives it the same offsets and block ids). Returns 0 or -1 (err). */
static int cut_table(const plan_in_t *in, const param_table_t *t, stage_units_t *u, char *err, size_t errlen)
{
    size_t *start = malloc(((size_t)t->n + 1) * sizeof *start), *unit = malloc(((size_t)t->n + 1) * sizeof *unit);
    int *block = malloc(((size_t)t->n + 1) * sizeof *block);
    if (!start || !unit || !block) {
        free(start), free(unit), free(block);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    size_t *expert_from = malloc(((size_t)t->n + 1) * sizeof *expert_from);
    unsigned char *expert = malloc((size_t)t->n + 1);
    if (!expert_from || !expert) {
        free(start), free(unit), free(block), free(expert_from), free(expert);
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (int i = 0; i < t->n; i++) {
        start[i] = t->p[i].offset;
        block[i] = t->p[i].layer >= 0 && t->p[i].layer < in->c->n_layer ? t->p[i].layer : -1;
        expert[i] = (unsigned char)t->p[i].expert;
    }
    zero_units_t zu;
    const int ep = in->run.ep > 1 || run_config_ep_spans_tp(&in->run);
    int rc = zero_cut_units(&zu, t->numel, t->n, start, block, ep ? expert : NULL, unit, expert_from);
    if (rc != 0)
        snprintf(err, errlen, "ZeRO with --ep: a block lists a dense tensor after its expert tensors");
    zero_pieces(&zu, unit, ep ? expert_from : NULL, (size_t)in->run.shard, ep ? plan_expert_shard(&in->run) : 1, NULL,
                NULL, &u->shape);
    u->n = t->numel;
    u->shard_n = u->shape.shard_n;
    u->outside = t->numel - (zu.block0 >= 0 ? unit[zu.block0 + zu.n_blocks] - unit[zu.block0] : 0);
    free(start), free(unit), free(block), free(expert_from), free(expert);
    return rc;
}

static int plan_units(const plan_in_t *in, const param_layout_t *part, stage_plan_t *sp, stage_units_t *u, char *err,
                      size_t errlen)
{
    param_table_t t;
    if (param_table_build(&t, in->c, part, err, errlen) != 0)
        return -1;
    const int rc = cut_table(in, &t, u, err, errlen);
    /* GPT-2's head on a later stage is a copy of the first stage's wte */
    for (int i = 0; i < t.n; i++)
        if (!t.p[i].tied_copy)
            sp->logical += (size_t)t.p[i].shape[0] * (size_t)t.p[i].shape[1];
    sp->n = t.numel;
    sp->shard_n = u->shard_n;
    param_table_free(&t);
    return rc;
}

/* Parameters, gradients, optimizer state and ZeRO's staging buffers of
 * the stage the model holds as lay; *host_weights: the bytes of its fp32
 * weights in host memory (lay->params_host), else 0. Returns 0 or -1
 * (err). */
static int plan_state_bytes(const plan_in_t *in, const model_layout_t *lay, const stage_units_t *u, double *mem,
                            double *host_weights, char *err, size_t errlen)
{
    *host_weights = 0.0;
    const int z = in->run.zero_stage;
    const size_t S = (size_t)in->run.shard;
    /* ZeRO's buffers as zero_create sizes them (the shard group S, the
     * replica group dp/S under --hybrid-shard) */
    zero_sizes_t zs = {0};
    if (z >= 1)
        zero_sizes(&zs, z, S, &u->shape, in->run.grad_dtype, in->run.dp / in->run.shard);
    const double n = (double)u->n, outside = (double)u->outside, shard_n = (double)u->shard_n;
    if (!in->megatron) {
        /* dtrain's buffers, byte for byte: the model's as model_create
         * allocates them (lay lends the blocks to ZeRO-2/3), then AdamW's
         * moments (optim.c), ZeRO's shards, windows and staging (zero.c) or
         * ddp.c's bf16 staging */
        size_t params = 0, grads = 0, host = 0;
        if (model_state_bytes(in->c, lay, &params, &grads, &host, err, errlen) != 0)
            return -1;
        *host_weights = (double)host;
        mem[MEM_PARAMS] = (double)params;
        mem[MEM_GRADS] = (double)grads;
        const size_t opt_n = z >= 1 ? u->shard_n : u->n, n_host = adamw_offload_count(opt_n, in->run.offload_fraction);
        mem[MEM_OPTIM] = n_host < opt_n ? (double)adamw_state_bytes(opt_n - n_host) : 0.0;
        if (z >= 1)
            zero_buffer_bytes(&zs, mem);
        if (z <= 1)
            mem[MEM_COMM] += (double)ddp_staging_bytes(u->n, in->run.dp, in->run.grad_dtype);
    } else {
        /* bf16 weights, fp32 gradients (Megatron's main_grad), fp32 master
         * weights and AdamW moments: 2 + 4 + 12 bytes per parameter; the
         * same units and pieces as dtrain's */
        const double window_n = (double)zs.window_n, opt_n = z >= 1 ? shard_n : n;
        mem[MEM_PARAMS] = z >= 3 ? 2.0 * (outside + shard_n + 2.0 * window_n) : 2.0 * n;
        mem[MEM_GRADS] = z >= 2 ? 4.0 * (outside + shard_n + 2.0 * window_n) : 4.0 * n;
        mem[MEM_OPTIM] = 12.0 * (opt_n - (double)adamw_offload_count((size_t)opt_n, in->run.offload_fraction));
        if (z >= 1)
            mem[MEM_COMM] = 2.0 * (double)u->shape.stage_n;
        if (z >= 2)
            mem[MEM_COMM] += 2.0 * 4.0 * (double)u->shape.window_c;
    }
    return 0;
}

/* dtrain's activation arena and workspace for lay, recomputation
 * included (model.c layout_acts); per layer: a 2-layer stage less a
 * 1-layer one, less the residual stream's extra row block. */
static void plan_arena(const plan_in_t *in, const model_layout_t *lay, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    size_t arena = 0, work = 0, a1 = 0, a2 = 0, w_ = 0;
    const int T = in->run.seq_len / in->cp; /* --cp: each rank's rows */
    model_arena_bytes(c, lay, in->run.micro_batch, T, &arena, &work);
    const double N = local_tokens(in);
    const double NR = in->run.sequence_parallel ? N / in->run.tp : N;
    model_layout_t one = *lay;
    one.part.has_embed = one.part.has_head = 0;
    one.n_slots = 1;
    one.part.n_runs = 1;
    one.part.run_begin[0] = 0;
    one.part.run_end[0] = 1;
    model_arena_bytes(c, &one, in->run.micro_batch, T, &a1, &w_);
    one.part.run_end[0] = 2;
    model_arena_bytes(c, &one, in->run.micro_batch, T, &a2, &w_);
    const double C = c->d_model;
    const double per_layer = (double)(a2 - a1) - (round64(4.0 * 3 * NR * C) - round64(4.0 * 2 * NR * C));
    const double lx = (double)sp->slot_layers * sp->slots;
    sp->act_layer = per_layer;
    sp->act_extra = (double)arena - lx * per_layer;
    sp->mem[MEM_ACTS] = (double)arena;
    sp->mem[MEM_WORKSPACE] = (double)work;
}

/* Megatron's activations (Korthikanti et al.) and dtrain's workspace at
 * 16 bits. */
static void plan_korthikanti(const plan_in_t *in, const model_layout_t *lay, int s, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    const model_recompute_t rc = in->run.recompute;
    size_t arena = 0, work = 0;
    model_arena_bytes(c, lay, in->run.micro_batch, in->run.seq_len, &arena, &work);
    const double N = (double)in->run.micro_batch * in->run.seq_len;
    const double NR = in->run.sequence_parallel ? N / in->run.tp : N;
    sp->act_layer = korthikanti_layer(in, rc);
    /* recomputation's working set: one layer of one microbatch
     * recomputed at a time (Korthikanti leave it out) */
    double extra = rc == MODEL_RECOMPUTE_FULL ? korthikanti_layer(in, MODEL_RECOMPUTE_NONE)
                   : rc == MODEL_RECOMPUTE_SELECTIVE
                       ? korthikanti_layer(in, MODEL_RECOMPUTE_NONE) - korthikanti_layer(in, MODEL_RECOMPUTE_SELECTIVE)
                       : 0.0;
    /* last stage: the final norm's input and fp32 logits (their
     * gradient overwrites them), per microbatch in flight */
    if (s == in->run.pp - 1) {
        const double Vl = (double)param_padded_vocab(c->vocab_size, in->run.tp) / in->run.tp;
        extra += sp->slots * (2.0 * NR * c->d_model + 4.0 * N * Vl);
    }
    sp->act_extra = extra;
    sp->mem[MEM_ACTS] = (double)sp->layers * sp->slots * sp->act_layer + extra;
    sp->mem[MEM_WORKSPACE] = 0.5 * (double)work; /* the backward's scratch at 16 bits */
}

/* Parameters, gradients, optimizer state, communication buffers and
 * activations of stage s: the layout the trainer gives the model
 * (stage_layout in train.c) with the same parameter table and arena
 * code. Returns 0 or -1 (err). */
static int plan_stage(const plan_in_t *in, int s, int layer_begin, stage_plan_t *sp, char *err, size_t errlen)
{
    const run_config_t *run = &in->run;
    memset(sp, 0, sizeof *sp);
    sp->layers = run->stage_layers[s];
    const pipe_shape_t shape = run_config_pipe_shape(run);
    sp->slots = pipe_stage_slots(&shape, s);
    param_layout_t part =
        param_layout_range(run->tp, 0, layer_begin, layer_begin + sp->layers, s == 0, s == run->pp - 1);
    run_config_stage_runs(run, s, &part.n_runs, part.run_begin, part.run_end); /* interleaved: its chunks */
    part.ep_size = run->ep; /* --ep: each rank's experts only (all EP ranks hold as many) */
    part.etp = run->etp;
    for (int k = 0; k < part.n_runs; k++) {
        if (part.run_end[k] - part.run_begin[k] > sp->slot_layers)
            sp->slot_layers = part.run_end[k] - part.run_begin[k];
        for (int l = part.run_begin[k]; l < part.run_end[k]; l++) {
            sp->p_layers += flops_layer_params(in->c, l);
            sp->moe_layers += model_layer_moe(in->c, l) != 0;
        }
    }
    const model_layout_t lay = {.part = part,
                                .tp = NULL,
                                .sequence_parallel = run->sequence_parallel,
                                .n_slots = sp->slots,
                                .bf16 = in->bf16 && !in->megatron,
                                .tp_bf16 = in->bf16 && !in->megatron && run->tp_dtype == COMM_BF16 && run->tp > 1,
                                .tp_overlap = run->tp_overlap && run->tp > 1,
                                .lent_block_grads = run->zero_stage >= 2 && run->pp_kind != PIPE_ZBH1,
                                .lent_block_params = run->zero_stage >= 3,
                                .recompute = run->recompute,
                                .logits_chunk = run->logits_chunk,
                                .doc_mask = in->doc_mask,
                                .cp_size = in->cp,
                                .split_backward = run->pp_kind == PIPE_ZBH1,
                                .params_host = !in->megatron && run_config_weights_on_host(run, in->bf16)};
    stage_units_t u;
    if (plan_units(in, &part, sp, &u, err, errlen) != 0 ||
        plan_state_bytes(in, &lay, &u, sp->mem, &sp->host_weights, err, errlen) != 0)
        return -1;
    sp->n_host = adamw_offload_count(run->zero_stage >= 1 ? u.shard_n : u.n, run->offload_fraction);
    /* train_setup's adamw_create and model_create: the state, and under
     * params_host the fp32 weights as its master */
    sp->host_bytes =
        (double)adamw_offload_bytes(sp->n_host, lay.bf16 && run->zero_stage == 0, lay.params_host) + sp->host_weights;
    if (!in->megatron)
        plan_arena(in, &lay, sp);
    else
        plan_korthikanti(in, &lay, s, sp);
    if (in->cp > 1) /* the ring's buffers (cp_ring_bytes), as the model counts them */
        sp->mem[MEM_COMM] += (double)cp_ring_bytes(&(cp_ring_shape_t){.B = in->run.micro_batch,
                                                                      .T = in->run.seq_len,
                                                                      .NH = in->c->n_head / in->run.tp,
                                                                      .NKV = in->c->n_kv_head / in->run.tp,
                                                                      .HS = model_head_size(in->c)},
                                                   in->cp);
    for (int k = 0; k < MEM_N_CATEGORIES; k++)
        sp->total += sp->mem[k];
    return 0;
}

/* The FLOP/s attention achieves: dtrain's tensor-core kernels under
 * --dtype bf16 at head sizes 64 and 128 at the profile's att_bf16 (an
 * achieved rate), else its fp32 kernels at the fp32 peak (CUDA cores)
 * times the efficiency; Megatron's flash attention at the bf16 peak times
 * the efficiency (its calibration). */
static double plan_att_rate(const plan_in_t *in)
{
    const hw_profile_t *hw = in->hw;
    const int HS = model_head_size(in->c), mma = in->bf16 && (HS == 64 || HS == 128);
    if (in->megatron)
        return hw->peak_bf16 * hw->efficiency;
    if (mma && hw->att_bf16 > 0)
        return hw->att_bf16;
    return (hw->peak_fp32 > 0 ? hw->peak_fp32 : hw->peak_bf16) * hw->efficiency;
}

/* FLOPs and compute time of one microbatch on stage s. */
static void stage_compute(const plan_in_t *in, int s, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    const double C = c->d_model, HS = model_head_size(c), QD = c->n_head * HS;
    const double V = c->vocab_size, t = in->run.tp;
    const double att = 4.0 * QD * in->att_T;
    const double tok = local_tokens(in); /* --cp: a rank's share; a token's attention is still over the sequence */
    const int last = s == in->run.pp - 1;
    /* flash-style attention recomputes Q K^T in every backward (half of
     * att); selective recompute adds only the activation function's
     * elementwise work, full the whole block forward */
    const int full = in->run.recompute == MODEL_RECOMPUTE_FULL;
    double mm_tok = 6.0 * sp->p_layers + (full ? 2.0 * sp->p_layers : 0.0);
    const double att_tok = sp->layers * (3.5 * att + (full ? att : 0.0));
    if (last)
        mm_tok += 6.0 * V * C;
    sp->flops_mb = tok * (mm_tok + att_tok) / t;
    /* matmuls at the precision's peak times the efficiency; attention at
     * att_rate (plan_att_rate) */
    const double peak_mm = in->bf16 ? hw->peak_bf16 : hw->peak_fp32;
    sp->t_comp_mb = tok / t * (mm_tok / (peak_mm * hw->efficiency) + att_tok / plan_att_rate(in));
}

/* --ep: each MoE layer's all-to-alls over the EP group per microbatch:
 * forward the expert row counts (int32) and the tokens out, the outputs
 * back; backward the output gradients out and the input gradients back
 * (fp32 rows of C, whatever --dtype). Balanced routing: (ep-1)/ep of a
 * rank's N k assignments go to other ranks (capacity dropping sends
 * fewer). The calls block between the layer's kernels, as TP's do. */
static void stage_ep(const plan_in_t *in, int s, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    const double ep = in->run.ep;
    if (ep <= 1 || c->moe.experts == 0)
        return;
    /* --etp 1: each TP rank routes its 1/tp of the tokens, and the EP
     * group is ep consecutive ranks of the TP x DP plane */
    const int whole = run_config_ep_spans_tp(&in->run);
    const double tok = (double)in->run.micro_batch * in->run.seq_len / (whole ? in->run.tp : 1);
    const double away = (ep - 1.0) / ep;
    const double layer = 4.0 * away * tok * c->moe.top_k * c->d_model * 4.0 + away * c->moe.experts * 4.0;
    sp->t_ep_mb = sp->moe_layers * (5.0 * in->hw->latency + layer / link_bw(in->hw, plan_ep_span(&in->run)));
    sp->ep_bytes = sp->moe_layers * layer * in->run.accum;
}

/* --tp-comm-overlap: per microbatch, the part of stage sp's TP time that
 * runs beside weight-gradient GEMMs. Each layer's qkv backward, and a
 * dense MLP's first matmul's, reduces its input gradient (one collective
 * of t_coll) while its weight-gradient GEMM (2 tokens x C x the matmul's
 * local width FLOPs, at the matmuls' rate) runs: hidden, the shorter of
 * the two (t_coll: one all-reduce, or one reduce-scatter or all-gather
 * under sequence parallelism); under sequence parallelism a dense layer's attention gather
 * also runs beside the MLP's second matmul's weight-gradient GEMM. None
 * under zb-h1, whose W pass holds the weight gradients. The GEMM is
 * taken at its full rate beside the collective (NCCL's kernels take a
 * few SMs: not modelled). */
static double tp_overlap_hidden(const plan_in_t *in, const stage_plan_t *sp, double t_coll)
{
    if (in->run.pp_kind == PIPE_ZBH1)
        return 0.0;
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    const double t = in->run.tp, tok = local_tokens(in), C = c->d_model, HS = model_head_size(c);
    const double rate = (in->bf16 ? hw->peak_bf16 : hw->peak_fp32) * hw->efficiency;
    const double qkv = (c->n_head + 2.0 * c->n_kv_head) * HS / t;
    const double fc = (c->arch == ARCH_LLAMA ? 2.0 : 1.0) * c->d_ff / t;
    const double t_qkv = 2.0 * tok * C * qkv / rate, t_fc = 2.0 * tok * C * fc / rate;
    const double t_proj = 2.0 * tok * C * c->d_ff / t / rate;
    const double dense = c->d_ff > 0 && !c->moe.shared_gate ? sp->layers - sp->moe_layers : 0.0;
    return sp->layers * fmin(t_coll, t_qkv) + dense * fmin(t_coll, t_fc) +
           (in->run.sequence_parallel ? dense * fmin(t_coll, t_proj) : 0.0);
}

/* Tensor and pipeline parallel bytes and time of stage s. */
static void stage_tp_pp(const plan_in_t *in, int s, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    const double C = c->d_model, t = in->run.tp;
    const double tok = local_tokens(in);
    const int last = s == in->run.pp - 1;
    /* tensor parallel: per layer two all-reduces forward and two backward
     * of the [s*b, h] activations (with sequence parallelism an all-gather
     * and a reduce-scatter each, the same bytes), two more forward under
     * full recomputation; the vocabulary-parallel embedding's forward
     * all-reduce, the head's backward one and cross-entropy's statistics */
    /* dtrain sends fp32 activations under --dtype bf16 too (the residual
     * stream is fp32) unless --tp-comm-dtype bf16 rounds what TP sends;
     * Megatron bf16. The pipeline's messages stay fp32. */
    const double abytes = in->megatron ? 2.0 : 4.0;
    const double tp_abytes = in->megatron || (in->bf16 && in->run.tp_dtype == COMM_BF16) ? 2.0 : 4.0;
    if (in->run.tp > 1) {
        const double ring = 2.0 * (t - 1.0) / t, act = tok * C * tp_abytes;
        int colls = sp->layers * (in->run.recompute == MODEL_RECOMPUTE_FULL ? 6 : 4);
        double bytes = colls * ring * act;
        if (s == 0) {
            colls++;
            bytes += ring * act;
        }
        if (last) {
            colls += 4;
            bytes += ring * act + 3.0 * ring * tok * 4.0;
        }
        sp->tp_colls = colls;
        sp->t_tp_mb = colls * hw->latency + bytes / link_bw(hw, in->run.tp);
        sp->tp_bytes = bytes * in->run.accum;
        /* one overlapped collective: an all-reduce, or under sequence
         * parallelism a reduce-scatter or all-gather (half its bytes) */
        const double one = (in->run.sequence_parallel ? ring / 2.0 : ring) * act;
        if (in->run.tp_overlap && !in->megatron)
            sp->t_tp_mb -= tp_overlap_hidden(in, sp, hw->latency + one / link_bw(hw, in->run.tp));
    }

    /* pipeline: each microbatch's [rows, h] activation to the next stage
     * and its gradient back; every TP rank sends its rows (all of them
     * without sequence parallelism) */
    const double msg = (in->run.sequence_parallel ? tok / t : tok) * C * abytes;
    /* each of the stage's V chunks sends its output on and its input
     * gradient back, except the model's last and first chunk */
    const int V = in->run.pp_virtual;
    sp->pp_bytes = in->run.accum * msg * (2 * V - (s == in->run.pp - 1) - (s == 0));
}

/* Data-parallel, tied-embedding and optimizer bytes and time of stage
 * s. */
static void stage_dp(const plan_in_t *in, int s, stage_plan_t *sp)
{
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    const double C = c->d_model;
    const int last = s == in->run.pp - 1;
    /* data parallel, dtrain's algorithms: ZeRO 0/1 all-reduce the
     * gradients in buckets during the step's last backward; 1 then
     * all-gathers the updated parameters; 2 reduce-scatters every
     * microbatch's gradients during its backward; 3 also all-gathers each
     * block's parameters before its forward and its backward, overlapped
     * with the previous block's compute. --hybrid-shard: shard inside
     * groups of S, all-reduce the shard across the d/S groups. */
    /* parameters gathered: dtrain's fp32 master weights (recast to bf16
     * after the gather), Megatron's bf16 weights */
    const double d = in->run.dp, S = in->run.shard, gbytes = 4.0, pbytes = in->megatron ? 2.0 : 4.0;
    const double n = (double)sp->n, t_bwd = sp->t_comp_mb * 2.0 / 3.0;
    const double bw_dp = link_bw(hw, (long)in->run.tp * in->run.dp);
    const double bw_sh = link_bw(hw, (long)in->run.tp * in->run.shard);
    double overlap_win = 0.0, exposed_only = 0.0, overlapped = 0.0;
    if (in->run.dp > 1) {
        if (in->run.zero_stage <= 1) {
            const double ar = 2.0 * (d - 1.0) / d * n * gbytes;
            sp->dp_bytes += ar;
            overlapped += ar / bw_dp + div_up(n * gbytes, 25.0 * 1048576.0) * hw->latency;
            overlap_win = t_bwd;
        } else {
            const double rs = in->run.accum * (S - 1.0) / S * n * gbytes;
            const double ag = in->run.zero_stage >= 3 ? in->run.accum * 2.0 * (S - 1.0) / S * n * pbytes : 0.0;
            sp->dp_bytes += rs + ag;
            overlapped += rs / bw_sh + ag / bw_sh + in->run.accum * (sp->layers + 2) * hw->latency;
            overlap_win = in->run.zero_stage >= 3 ? in->run.accum * sp->t_comp_mb : in->run.accum * t_bwd;
        }
        if (in->run.zero_stage >= 2 && S < d) {
            const double g = d / S, ar = 2.0 * (g - 1.0) / g * (double)sp->shard_n * gbytes;
            sp->dp_bytes += ar;
            exposed_only += ar / bw_dp;
        }
    }
    if (in->run.zero_stage >= 1 && in->run.zero_stage <= 2 && S > 1) {
        const double ag = (S - 1.0) / S * n * pbytes;
        sp->dp_bytes += ag;
        exposed_only += ag / bw_sh + (sp->layers + 3) * hw->latency;
    }
    sp->t_dp = overlapped + exposed_only;
    sp->t_dp_exposed = (overlapped > overlap_win ? overlapped - overlap_win : 0.0) + exposed_only;

    /* GPT-2's tied embedding: the first and last stage sum wte's gradient */
    if (model_head_tied(c) && in->run.pp > 1 && (s == 0 || last)) {
        const double Vl = (double)param_padded_vocab(c->vocab_size, in->run.tp) / in->run.tp;
        const double len = in->run.zero_stage >= 2 ? div_up(Vl * C, S) : Vl * C;
        sp->embed_bytes = len * gbytes;
        sp->t_embed = hw->latency + sp->embed_bytes / link_bw(hw, (long)in->run.tp * in->run.dp * in->run.pp);
    }

    /* AdamW streams its state once: fp32 p, m, v read and written and g
     * read (28 B per element); bf16 adds the bf16 weight written (30 B) */
    const double opt_n = in->run.zero_stage >= 1 ? (double)sp->shard_n : n;
    const double per = in->bf16 ? 30.0 : 28.0, n_dev = opt_n - (double)sp->n_host;
    sp->t_opt_dev = hw->mem_bw > 0 ? n_dev * per / hw->mem_bw : 0.0;
    sp->t_opt = sp->t_opt_dev;
    if (sp->n_host && hw->h2d_bw > 0 && hw->host_bw > 0) {
        /* --offload: the gradients down (4 B) on the copy stream, each
         * bucket (ZeRO 0/1: 25 MiB, --bucket-mb's default) or unit (ZeRO
         * 2/3: a block's, about 1/(layers + 2) of the stage) as its
         * reduction completes during the step's last backward, so what
         * that backward does not cover and the last stretch's copy (the
         * embedding's on the first stage) are exposed; then the host AdamW streaming the same bytes at the
         * rank's share of the node's host bandwidth and the weights up
         * (4 B, and the bf16 copy's 2); the backend's part updates
         * meanwhile. With the weights on the host (params_host) only the
         * bf16 copy goes up (ZeRO-0), or nothing, and ZeRO-1/2's gather
         * writes every local weight to the host (4 B) and the bf16 copy
         * is recast from there (4 B) */
        const int host_w = sp->host_weights > 0, z = in->run.zero_stage;
        const double h = (double)sp->n_host;
        const double up = host_w ? (z == 0 ? 2.0 : 0.0) : in->bf16 && z == 0 ? 6.0 : 4.0;
        const double gather_host = host_w && z >= 1 ? n * 8.0 / hw->h2d_bw : 0.0;
        const double host_bw = hw->host_bw / (hw->gpus_per_node > 0 ? hw->gpus_per_node : 1);
        /* the last stretch told holds the lowest offsets: the first
         * stage's embedding, else a bucket or a block's unit; the host's
         * elements are the first of the shard, so they hold it first */
        const double emb = s == 0 ? (double)param_padded_vocab(c->vocab_size, in->run.tp) / in->run.tp * C / n : 0.0;
        const double unit = in->run.zero_stage >= 2 ? 1.0 / (sp->layers + 2.0) : 25.0 * 1048576.0 / (4.0 * n);
        const double stretch = (emb > unit ? emb : unit) * opt_n;
        const double t_last = (stretch < h ? stretch : h) * 4.0 / hw->h2d_bw;
        sp->t_d2h = h * 4.0 / hw->h2d_bw;
        sp->t_d2h_exposed = t_last + (sp->t_d2h - t_last > t_bwd ? sp->t_d2h - t_last - t_bwd : 0.0);
        sp->t_opt_host = sp->t_d2h_exposed + h * up / hw->h2d_bw + h * per / host_bw + gather_host;
        sp->t_opt = sp->t_opt_host > sp->t_opt_dev ? sp->t_opt_host : sp->t_opt_dev;
    }
}

/* --cp: the ring attention's K,V blocks (fp32, B T/cp rows of the KV
 * heads' k and v) per layer and microbatch: forward cp-1 blocks sent,
 * backward cp-1 blocks and cp block gradients (full recomputation runs
 * the forward's ring again). Each step's transfer overlaps that step's
 * block of attention (1/cp of the layer's attention: forward 1 part of
 * att's 3.5, backward 2.5), so what is exposed is a step's transfer
 * beyond its block, plus the backward's last gradient. */
static void stage_cp(const plan_in_t *in, int s, stage_plan_t *sp)
{
    (void)s;
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    const double cp = in->cp;
    if (cp <= 1)
        return;
    const double tok = local_tokens(in), t = in->run.tp, HS = model_head_size(c);
    const double blk = tok * 2.0 * (c->n_kv_head / t) * HS * 4.0;
    const double xfer = hw->latency + blk / link_bw(hw, (long)in->run.tp * in->cp);
    const double att_layer = tok / t * 4.0 * c->n_head * HS * in->att_T / plan_att_rate(in);
    const double step_f = att_layer / cp, step_b = 2.5 * att_layer / cp;
    const int full = in->run.recompute == MODEL_RECOMPUTE_FULL;
    const double fwd = (cp - 1.0) * (xfer > step_f ? xfer - step_f : 0.0);
    const double bwd = (cp - 1.0) * (2.0 * xfer > step_b ? 2.0 * xfer - step_b : 0.0) + xfer;
    sp->t_cp_mb = sp->layers * ((full ? 2.0 : 1.0) * fwd + bwd);
    sp->t_cp_all_mb = sp->layers * (((full ? 2.0 : 1.0) * (cp - 1.0) + 2.0 * cp - 1.0) * xfer);
    sp->cp_bytes = in->run.accum * sp->layers * ((full ? 2.0 : 1.0) * (cp - 1.0) + 2.0 * cp - 1.0) * blk;
}

/* FLOPs, bytes sent and time of stage s (after plan_stage). */
static void plan_stage_time(const plan_in_t *in, int s, stage_plan_t *sp)
{
    stage_compute(in, s, sp);
    stage_tp_pp(in, s, sp);
    stage_ep(in, s, sp);
    stage_cp(in, s, sp);
    stage_dp(in, s, sp);
}

/* The whole plan of one layout. Returns 0 or -1 (err). */
static int plan_compute(const plan_in_t *in, plan_t *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    p->in = *in;
    p->st = calloc((size_t)in->run.pp, sizeof *p->st);
    if (!p->st) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    const hw_profile_t *hw = in->hw;
    const double peak = in->bf16 ? hw->peak_bf16 : hw->peak_fp32; /* MFU's, as Megatron reports it */
    int l0 = 0;
    double t_mb = 0.0, extra = 0.0;
    for (int s = 0; s < in->run.pp; l0 += in->run.stage_layers[s], s++) {
        stage_plan_t *sp = &p->st[s];
        if (plan_stage(in, s, l0, sp, err, errlen) != 0)
            return -1;
        plan_stage_time(in, s, sp);
        p->params_total += sp->logical;
        for (int k = 0; k < MEM_N_CATEGORIES; k++)
            p->mem_max[k] = sp->mem[k] > p->mem_max[k] ? sp->mem[k] : p->mem_max[k];
        p->mem_max[MEM_N_CATEGORIES] =
            sp->total > p->mem_max[MEM_N_CATEGORIES] ? sp->total : p->mem_max[MEM_N_CATEGORIES];
        if (sp->total > p->st[p->worst].total)
            p->worst = s;
        p->hw_flops_step += sp->flops_mb * in->run.accum * in->run.tp * in->run.dp;
        if (sp->t_comp_mb + sp->t_tp_mb + sp->t_ep_mb + sp->t_cp_mb > t_mb) {
            t_mb = sp->t_comp_mb + sp->t_tp_mb + sp->t_ep_mb + sp->t_cp_mb;
            p->t_compute = in->run.accum * sp->t_comp_mb;
            p->t_tp = in->run.accum * sp->t_tp_mb;
            p->t_ep = in->run.accum * sp->t_ep_mb;
            p->t_cp = in->run.accum * sp->t_cp_mb;
            p->t_cp_all = in->run.accum * sp->t_cp_all_mb;
        }
        const double e = sp->t_dp_exposed + sp->t_embed + sp->t_opt;
        if (e > extra) {
            extra = e;
            p->t_dp = sp->t_dp_exposed;
            p->t_dp_total = sp->t_dp;
            p->t_embed = sp->t_embed;
            p->t_opt = sp->t_opt;
        }
    }
    p->usable = hw->memory - hw->reserve;
    p->margin = p->usable - p->st[p->worst].total;
    p->fits = p->margin >= 0;
    const double tokens = (double)in->run.global_batch * in->run.seq_len;
    p->flops_step = flops_per_token(in->c, in->att_T) * tokens;
    p->t_mb = t_mb;
    /* interleaved: the fill and drain are P-1 chunk steps of 1/V of a
     * stage's microbatch each (Megatron's (p-1)/(v m) of the compute) */
    const double V = in->run.pp_virtual;
    p->bubble_frac = (in->run.pp - 1) / (V * in->run.accum + in->run.pp - 1);
    p->t_bubble = (in->run.pp - 1) * t_mb / V;
    if (in->run.pp_kind == PIPE_ZBH1) {
        /* the Ws fill all but (p-1)(f+b-w) of 1f1b's (p-1)(f+b+w): a third
         * when forward, B and W cost alike (pipeline_sched.c's table) */
        p->bubble_frac = (in->run.pp - 1) / (3.0 * in->run.accum + in->run.pp - 1);
        p->t_bubble = (in->run.pp - 1) * t_mb / 3.0;
    }
    /* pipeline messages overlap the steady state; the fill and the drain
     * wait for them: p-1 hops each way */
    const double tok = local_tokens(in);
    const double msg =
        (in->run.sequence_parallel ? tok / in->run.tp : tok) * in->c->d_model * (in->megatron ? 2.0 : 4.0);
    p->t_pp_msg = hw->latency + msg / link_bw(hw, (long)in->run.tp * in->run.dp * in->run.pp);
    p->t_pp = in->run.pp > 1 ? 2.0 * (in->run.pp - 1) * p->t_pp_msg : 0.0;
    p->t_step = in->run.accum * t_mb + p->t_bubble + p->t_pp + extra;
    p->tokens_s = tokens / p->t_step;
    const double world = (double)in->run.tp * in->run.pp * in->run.dp;
    p->mfu = p->flops_step / (p->t_step * world * peak);
    p->hfu = p->hw_flops_step / (p->t_step * world * peak);
    return 0;
}

static void plan_free(plan_t *p)
{
    free(p->st);
    p->st = NULL;
}

/* ---- inputs ------------------------------------------------------------------------------ */

/* --doc-mask's attention: each sequence of T tokens cut into documents of
 * N (--plan-doc-len; 0 = one document of T) and a last one of the T mod N
 * left, counted at its own length, as the trainer counts every document
 * (src/model/docmask.h). Sets the positions attended per token, sum(L^2) / T,
 * the T that flops_per_token takes. Returns 0 or -1. */
static int plan_doc_mask(const run_options_t *o, plan_in_t *in, char *err, size_t errlen)
{
    const int T = in->run.seq_len, N = o->plan_doc_len;
    in->doc_mask = o->doc_mask;
    in->doc_len = N;
    in->att_T = T;
    if (N > 0 && !o->doc_mask) {
        snprintf(err, errlen, "--plan-doc-len %d is the mean document length of --doc-mask: add --doc-mask", N);
        return -1;
    }
    if (N > T) {
        snprintf(err, errlen, "--plan-doc-len %d exceeds --seq-len %d: a document longer than its sequence", N, T);
        return -1;
    }
    if (N > 0) {
        const double k = T / N, r = T % N;
        in->att_T = (k * N * N + r * r) / T;
    }
    return 0;
}

/* Resolves the layout as training would (options_resolve_layout) and
 * fills in. Returns 0 or -1. */
static int plan_setup(const run_options_t *o, const model_config_t *c, const hw_profile_t *hw, int tp, int pp, int dp,
                      plan_in_t *in, char *err, size_t errlen)
{
    memset(in, 0, offsetof(plan_in_t, run));
    if (options_resolve_layout(o, c, tp, pp, dp, &in->run, err, errlen) != 0)
        return -1;
    in->cp = in->run.cp;
    in->dp_data = in->run.dp;
    in->run.dp *= in->cp;
    if (c->arch == ARCH_GPT2 && o->seq_len > c->max_seq) {
        snprintf(err, errlen, "--seq-len %d exceeds the model's %d learned positions (--max-seq-len)", o->seq_len,
                 c->max_seq);
        return -1;
    }
    if (plan_doc_mask(o, in, err, errlen) != 0)
        return -1;
    in->c = c;
    in->hw = hw;
    in->megatron = o->plan_dtype == PLAN_DTYPE_MEGATRON;
    in->bf16 = in->megatron || o->plan_dtype == PLAN_DTYPE_BF16 ||
               (o->plan_dtype == PLAN_DTYPE_AUTO && strcmp(hw->name, "cpu") != 0);
    if (o->tp_comm_dtype == COMM_BF16 && !in->bf16) {
        snprintf(err, errlen,
                 "--tp-comm-dtype bf16 needs bf16 training, and this plan is fp32 (--hw %s): add "
                 "--plan-dtype bf16, or drop --tp-comm-dtype",
                 hw->name);
        return -1;
    }
    if ((in->bf16 ? hw->peak_bf16 : hw->peak_fp32) <= 0) {
        snprintf(err, errlen, "--hw %s: the profile has no peak_%s for --plan-dtype %s", hw->name,
                 in->bf16 ? "bf16" : "fp32",
                 in->megatron ? "megatron"
                 : in->bf16   ? "bf16"
                              : "fp32");
        return -1;
    }
    return 0;
}

/* dp from --gpus, --dp or the world size. */
static int plan_dp(const run_options_t *o, int world_size, int *dp, char *err, size_t errlen)
{
    const int cp = o->cp > 1 ? o->cp : 1, mp = o->tp * o->pp * cp; /* --cp: dp is the ranks drawing distinct data */
    char cps[24] = "";
    if (cp > 1)
        snprintf(cps, sizeof cps, " x --cp %d", cp);
    if (o->gpus) {
        if (o->gpus % mp != 0) {
            snprintf(err, errlen, "--gpus %d is not a multiple of --tp %d x --pp %d%s = %d", o->gpus, o->tp, o->pp, cps,
                     mp);
            return -1;
        }
        if (o->dp && o->dp != o->gpus / mp) {
            snprintf(err, errlen, "--dp %d disagrees with --gpus %d / (--tp %d x --pp %d%s) = %d: give one of them",
                     o->dp, o->gpus, o->tp, o->pp, cps, o->gpus / mp);
            return -1;
        }
        *dp = o->gpus / mp;
    } else if (o->dp) {
        *dp = o->dp;
    } else if (world_size > 1) {
        if (world_size % mp != 0) {
            snprintf(err, errlen, "world size %d is not a multiple of --tp %d x --pp %d%s = %d: give --dp or --gpus",
                     world_size, o->tp, o->pp, cps, mp);
            return -1;
        }
        *dp = world_size / mp;
    } else {
        *dp = 1;
    }
    return 0;
}

/* ---- output ------------------------------------------------------------------------------ */

static const char *fmt_bytes(char *buf, size_t len, double bytes)
{
    metrics_format_bytes(buf, len, bytes);
    return buf;
}

/* 1.23 s / 45.6 ms / 789 us */
static const char *fmt_time(char *buf, size_t len, double s)
{
    if (s >= 1.0)
        snprintf(buf, len, "%.3f s", s);
    else if (s >= 1e-3)
        snprintf(buf, len, "%.2f ms", s * 1e3);
    else
        snprintf(buf, len, "%.1f us", s * 1e6);
    return buf;
}

static const char *fmt_flops(char *buf, size_t len, double f)
{
    const char *u[] = {"", "K", "M", "G", "T", "P", "E"};
    int k = 0;
    while (f >= 1000.0 && k < 6) {
        f /= 1000.0;
        k++;
    }
    snprintf(buf, len, "%.2f %sFLOP", f, u[k]);
    return buf;
}

/* "+1.23 GiB" / "-4.56 GiB" */
static const char *fmt_signed_bytes(char *buf, size_t len, double bytes)
{
    char tmp[24];
    metrics_format_bytes(tmp, sizeof tmp, fabs(bytes));
    snprintf(buf, len, "%s%s", bytes < 0 ? "-" : "", tmp);
    return buf;
}

static const char *act_formula(const plan_in_t *in)
{
    switch (in->run.recompute) {
    case MODEL_RECOMPUTE_FULL:
        return in->run.sequence_parallel ? "2sbh/t: each layer's input only" : "2sbh: each layer's input only";
    case MODEL_RECOMPUTE_SELECTIVE: return in->run.sequence_parallel ? "34sbh/t" : "sbh(10 + 24/t)";
    case MODEL_RECOMPUTE_NONE:
    default: return in->run.sequence_parallel ? "sbh/t(34 + 5as/h)" : "sbh(10 + 24/t + 5as/(ht))";
    }
}

/* The plan's --doc-mask line: the documents it assumes and what attention
 * then computes. */
/* One routed expert's parameters (its fc, proj and GPT-2's biases). */
static double moe_expert_params(const model_config_t *c)
{
    const double gpt = c->arch == ARCH_GPT2, C = c->d_model, Fe = c->moe.ffn;
    return (gpt ? 2.0 : 3.0) * C * Fe + (gpt ? Fe + C : 0.0);
}

/* The parameters a token meets: all but the E - k routed experts it is
 * not sent to in each MoE layer (flops_layer_params' active set). */
static double params_active(const plan_t *p)
{
    const model_config_t *c = p->in.c;
    return (double)p->params_total -
           (double)model_moe_layers(c) * (c->moe.experts - c->moe.top_k) * moe_expert_params(c);
}

/* A mixture's parameters: all, and those a token meets, and the routed
 * experts' on one rank of the worst stage (1/ep of them, each split over
 * tp). */
static void print_moe(const plan_t *p, FILE *out)
{
    const plan_in_t *in = &p->in;
    const model_config_t *c = in->c;
    const moe_config_t *e = &c->moe;
    if (!e->experts)
        return;
    const double expert = moe_expert_params(c), active = params_active(p);
    const int n_moe = model_moe_layers(c), ep = in->run.ep > 1 ? in->run.ep : 1;
    const int here = p->st[p->worst].moe_layers;
    const double on_rank = (double)here * (e->experts / ep) * expert / in->run.etp;
    char b1[32];
    fprintf(out,
            "moe: %d of %d layers, %d experts of width %d, top-%d: %zu parameters, %.0f active per token (%.1f%%); "
            "on a rank of stage %d: %d experts of each of its %d MoE layer%s, %.0f parameters (%s in fp32)\n",
            n_moe, c->n_layer, e->experts, e->ffn, e->top_k, p->params_total, active,
            100.0 * active / (double)p->params_total, p->worst, e->experts / ep, here, here == 1 ? "" : "s", on_rank,
            fmt_bytes(b1, sizeof b1, 4.0 * on_rank));
}

static void print_doc_mask(const plan_in_t *in, FILE *out)
{
    const int T = in->run.seq_len, N = in->doc_len;
    if (!in->doc_mask)
        return;
    if (N == 0) {
        fprintf(out, "document masking: one document per sequence assumed (give --plan-doc-len N for documents of "
                     "mean length N): attention as unmasked\n");
        return;
    }
    fprintf(out,
            "document masking: documents of mean length %d (--plan-doc-len): each sequence of %d tokens cut into %d "
            "of %d",
            N, T, T / N, N);
    if (T % N)
        fprintf(out, " and one of %d", T % N);
    fprintf(out, "; attention over sum(L^2) / T = %.4g positions per token instead of %d\n", in->att_T, T);
}

static void print_plan_header(const plan_t *p, const run_options_t *o, FILE *out)
{
    const plan_in_t *in = &p->in;
    const model_config_t *c = in->c;
    const hw_profile_t *hw = in->hw;
    char b1[32], b2[32];
    const double peak = in->bf16 ? hw->peak_bf16 : hw->peak_fp32;
    char extras[128];
    fprintf(out, "dtrain plan: model %s (%s): L=%d C=%d heads=%d kv_heads=%d ffn=%d vocab=%d%s | %zu parameters\n",
            o->model, model_arch_name(c->arch), c->n_layer, c->d_model, c->n_head, c->n_kv_head, c->d_ff, c->vocab_size,
            model_config_extras(c, extras, sizeof extras), p->params_total);
    if (in->cp > 1)
        fprintf(out, "layout: tp %d x cp %d x pp %d x dp %d = %d ranks (gradients and ZeRO over dp x cp = %d)",
                in->run.tp, in->cp, in->run.pp, in->dp_data, in->run.tp * in->run.pp * in->run.dp, in->run.dp);
    else
        fprintf(out, "layout: tp %d x pp %d x dp %d = %d ranks", in->run.tp, in->run.pp, in->run.dp,
                in->run.tp * in->run.pp * in->run.dp);
    if (in->run.ep > 1 || run_config_ep_spans_tp(&in->run))
        fprintf(out, " | ep %d x expert-dp %d%s", in->run.ep, plan_edp(&in->run),
                run_config_ep_spans_tp(&in->run) ? " (etp 1: whole experts, ep over tp x dp)" : "");
    fprintf(out, " | zero %d", in->run.zero_stage);
    if (in->run.zero_stage > 0)
        fprintf(out, " (sharded over %d rank%s%s)", in->run.shard, in->run.shard == 1 ? "" : "s",
                in->run.shard < in->run.dp ? ", replicated across the hybrid groups" : "");
    fprintf(out, " | recompute %s | sequence parallel %s | %s schedule\n", model_recompute_names[in->run.recompute],
            in->run.sequence_parallel ? "on" : "off", pipe_kind_name(in->run.pp_kind));
    fprintf(out, "batch: micro %d x seq %d, %d microbatch%s per step x dp %d = %d sequences, %lld tokens per step\n",
            in->run.micro_batch, in->run.seq_len, in->run.accum, in->run.accum == 1 ? "" : "es", in->dp_data,
            in->run.global_batch, (long long)in->run.global_batch * in->run.seq_len);
    print_moe(p, out);
    print_doc_mask(in, out);
    char sd[160];
    lr_schedule_describe(&in->run.sched, sd, sizeof sd);
    fprintf(out, "lr schedule: %s\n", sd);
    if (in->megatron)
        fprintf(out,
                "precision: megatron: Megatron-LM's bf16 layout, for comparison: bf16 weights, fp32 gradients, "
                "fp32 master weights and AdamW moments (2 + 4 + 12 B per parameter before sharding); activations by "
                "Korthikanti et al. 2022; bf16 activations and weights on the wire\n");
    else if (in->bf16)
        fprintf(out,
                "precision: bf16: dtrain's --dtype bf16 as built (fp32 master weights and their bf16 copy, "
                "fp32 gradients, 8 B of AdamW moments per parameter, the trainer's own activation arena with the "
                "matmul-only activations in bf16; bf16 matmuls, %s; tensor-parallel activations on the wire "
                "in %s)\n",
                plan_att_rate(in) == in->hw->att_bf16
                    ? "attention on the tensor cores at the profile's att_bf16 (the published FlashAttention-2 "
                      "class where no GPU measured dtrain's)"
                    : "fp32 attention (head size not 64 or 128, or no att_bf16 in the profile)",
                in->run.tp_dtype == COMM_BF16 ? "bf16 (--tp-comm-dtype bf16)" : "fp32");
    else
        fprintf(out, "precision: fp32: dtrain's CPU backend as built (4 B weights and gradients, 8 B of AdamW "
                     "moments per parameter, the trainer's own activation arena)\n");
    fprintf(out,
            "hardware: %s: %s per rank (%s reserved), %.1f TFLOP/s %s peak, %.0f%% achievable in the kernels, "
            "%d per node, %.0f GB/s intra-node, %.1f GB/s inter-node\n",
            hw->name, fmt_bytes(b1, sizeof b1, hw->memory), fmt_bytes(b2, sizeof b2, hw->reserve), peak * 1e-12,
            in->bf16 ? "bf16" : "fp32", 100.0 * hw->efficiency, hw->gpus_per_node, hw->intra_bw * 1e-9,
            hw->inter_bw * 1e-9);
}

/* --offload optimizer: the update's host side (copies and the host
 * AdamW at the rank's share of the node's bandwidth) beside the device's,
 * and whether a forward would hide it. The gradients' copies stream
 * during the last backward (what it leaves exposed counts); the host
 * AdamW and the weights' copies up follow it. */
static void print_offload_time(const plan_t *p, FILE *out)
{
    const hw_profile_t *hw = p->in.hw;
    const stage_plan_t *w = &p->st[p->worst];
    const int per_node = hw->gpus_per_node > 0 ? hw->gpus_per_node : 1;
    char b1[32], b2[32], b3[32];
    if (hw->host_bw <= 0 || hw->h2d_bw <= 0) {
        fprintf(out,
                "  optimizer        %12s  the device's part; the profile gives no host_bw or h2d_bw for the host's\n",
                fmt_time(b1, sizeof b1, w->t_opt_dev));
        return;
    }
    fprintf(out,
            "  optimizer        %12s  host: %s (copies at %.0f GB/s, host AdamW at %.1f GB/s: the node's %.0f GB/s "
            "over %d ranks), beside the device's %s\n",
            fmt_time(b1, sizeof b1, p->t_opt), fmt_time(b2, sizeof b2, w->t_opt_host), hw->h2d_bw * 1e-9,
            hw->host_bw / per_node * 1e-9, hw->host_bw * 1e-9, per_node, fmt_time(b3, sizeof b3, w->t_opt_dev));
    fprintf(out,
            "  offload copies   %12s  exposed of the gradients' %s down, streamed per %s during the last backward\n",
            fmt_time(b1, sizeof b1, w->t_d2h_exposed), fmt_time(b2, sizeof b2, w->t_d2h),
            p->in.run.zero_stage >= 2 ? "unit" : "bucket");
    const double fwd = p->t_compute / 3.0, after = w->t_opt_host - w->t_d2h_exposed; /* a forward is a third */
    fprintf(out, "  offload          the host update %s a step's forward (%s): %s\n",
            after <= fwd ? "fits in" : "exceeds", fmt_time(b1, sizeof b1, fwd),
            after <= fwd ? "host bandwidth would hide it once overlapped with the next forward; exposed now"
                         : "host bandwidth cannot hide it: lower --offload-fraction or shard over more ranks");
}

/* --offload optimizer: the host bytes of the worst rank and of a node
 * full of such ranks, against the profile's host memory. */
static void print_host_memory(const plan_t *p, FILE *out)
{
    const hw_profile_t *hw = p->in.hw;
    const stage_plan_t *w = &p->st[p->worst];
    const int per_node = hw->gpus_per_node > 0 ? hw->gpus_per_node : 1;
    char b1[32], b2[32], b3[32];
    /* per offloaded element: m, v, the gradient's staging, the master
     * weight unless the weights are (host_weights), the bf16 copy's staging */
    const double per = (w->host_bytes - w->host_weights) / (double)w->n_host;
    const double base = w->host_weights > 0 ? 12.0 : 16.0;
    char weights[96] = "";
    if (w->host_weights > 0)
        snprintf(weights, sizeof weights, "the %s fp32 weights, the master copy; ",
                 fmt_bytes(b3, sizeof b3, w->host_weights));
    fprintf(out,
            "host memory per rank: %s (%s%zu elements x %d B: %sm, v and the gradients' staging%s); a node of %d "
            "ranks: %s",
            fmt_bytes(b1, sizeof b1, w->host_bytes), weights, w->n_host, (int)(per + 0.5),
            w->host_weights > 0 ? "" : "fp32 master weights, ", per > base + 0.5 ? ", the bf16 copy's" : "", per_node,
            fmt_bytes(b2, sizeof b2, w->host_bytes * per_node));
    if (hw->host_memory > 0)
        fprintf(out, " of %s: %s\n", fmt_bytes(b3, sizeof b3, hw->host_memory),
                w->host_bytes * per_node <= hw->host_memory ? "FITS" : "DOES NOT FIT");
    else
        fprintf(out, " (the profile gives no host_memory)\n");
}

static void print_memory(const plan_t *p, FILE *out)
{
    const plan_in_t *in = &p->in;
    const hw_profile_t *hw = in->hw;
    const stage_plan_t *w = &p->st[p->worst];
    char b1[32], b2[32], b3[32];
    fprintf(out,
            "\nmemory per rank, worst rank: pipeline stage %d of %d (%d layer%s%s%s, %d microbatch%s in flight "
            "under %s)\n",
            p->worst, in->run.pp, w->layers, w->layers == 1 ? "" : "s", p->worst == 0 ? " + embedding" : "",
            p->worst == in->run.pp - 1 ? " + head" : "", w->slots, w->slots == 1 ? "" : "es",
            pipe_kind_name(in->run.pp_kind));
    const double opt_n = in->run.zero_stage >= 1 ? (double)w->shard_n : (double)w->n;
    for (int k = 0; k < MEM_N_CATEGORIES; k++) {
        fprintf(out, "  %-14s %11s  %14.0f B  ", mem_category_name((mem_category_t)k),
                fmt_bytes(b1, sizeof b1, w->mem[k]), w->mem[k]);
        switch (k) {
        case MEM_PARAMS:
            if (in->run.zero_stage >= 3)
                fprintf(out, "%s: a shard of %zu, the tensors outside the blocks%s, two gathered blocks",
                        in->megatron ? "bf16" : "fp32", w->shard_n,
                        in->bf16 && !in->megatron ? " (and their bf16 copy)" : "");
            else if (w->host_weights > 0)
                fprintf(out, "%zu local parameters x 2 B (bf16; their fp32 in host memory), and the fp32 of the "
                        "embeddings, norms and biases",
                        w->n);
            else
                fprintf(out, "%zu local parameters x %d B (%s)", w->n,
                        in->megatron ? 2
                        : in->bf16   ? 6
                                     : 4,
                        in->megatron ? "bf16"
                        : in->bf16   ? "fp32 and a bf16 copy"
                                     : "fp32");
            break;
        case MEM_GRADS:
            if (in->run.zero_stage >= 2)
                fprintf(out, "fp32: a shard of %zu, the tensors outside the blocks, two blocks' windows", w->shard_n);
            else
                fprintf(out, "fp32, one per local parameter");
            break;
        case MEM_OPTIM:
            fprintf(out, "%.0f elements x %d B (%s)%s", opt_n - (double)w->n_host, in->megatron ? 12 : 8,
                    in->megatron ? "fp32 master weights, m, v" : "fp32 m, v",
                    in->run.zero_stage >= 1 ? ", the ZeRO shard" : "");
            if (w->n_host)
                fprintf(out, "; %zu more in host memory (--offload)", w->n_host);
            break;
        case MEM_ACTS:
            fprintf(out, "%s per layer and microbatch x %d x %d%s", fmt_bytes(b2, sizeof b2, w->act_layer),
                    w->slot_layers, w->slots, in->run.pp_virtual > 1 ? " chunk slots" : "");
            if (w->act_extra > 0)
                fprintf(out, " + %s", fmt_bytes(b3, sizeof b3, w->act_extra));
            if (in->megatron)
                fprintf(out, " (Korthikanti et al.: %s%s)", act_formula(in),
                        in->run.recompute != MODEL_RECOMPUTE_NONE ? "; + one layer recomputed" : "");
            else
                fprintf(out, " (dtrain's arena)");
            break;
        case MEM_COMM:
            fprintf(out, "%s%s",
                    in->run.zero_stage > 0 ? "ZeRO gather / reduce-scatter staging"
                    : in->cp > 1           ? ""
                                           : "none outside the buffers above",
                    in->cp > 1 ? (in->run.zero_stage > 0 ? "; the ring's K,V blocks"
                                                         : "the ring's K,V blocks, their "
                                                           "gradients and partial outputs")
                               : "");
            break;
        case MEM_WORKSPACE:
            fprintf(out, "backward scratch shared by the microbatches%s",
                    in->megatron ? " (dtrain's, at 16 bits)" : "");
            break;
        }
        fprintf(out, "\n");
    }
    char b4[32];
    fprintf(out, "  %-14s %11s  %14.0f B  of %s usable (%s less %s reserve)\n", "total",
            fmt_bytes(b1, sizeof b1, w->total), w->total, fmt_bytes(b2, sizeof b2, p->usable),
            fmt_bytes(b3, sizeof b3, hw->memory), fmt_bytes(b4, sizeof b4, hw->reserve));
    fprintf(out, "%s: margin %s (%.1f%% of usable)\n", p->fits ? "FITS" : "DOES NOT FIT",
            fmt_signed_bytes(b1, sizeof b1, p->margin), 100.0 * p->margin / p->usable);
    if (w->n_host)
        print_host_memory(p, out);
    if (in->run.pp > 1) {
        fprintf(out, "other stages:");
        for (int s = 0; s < in->run.pp; s++)
            if (s != p->worst)
                fprintf(out, " %d: %s%s", s, fmt_bytes(b1, sizeof b1, p->st[s].total),
                        s + 1 < in->run.pp && !(s + 1 == p->worst && s + 2 == in->run.pp) ? "," : "\n");
    }
}

static void print_perf(const plan_t *p, FILE *out)
{
    const plan_in_t *in = &p->in;
    const hw_profile_t *hw = in->hw;
    const stage_plan_t *w = &p->st[p->worst];
    char b1[32], b2[32], b3[32];
    const double tokens = (double)in->run.global_batch * in->run.seq_len;
    fprintf(out,
            "\ncompute: %s per step (%s per token: 6 x active matmul parameters + 12 x L x h x %s, src/model/flops.c), "
            "%s with recomputation\n",
            fmt_flops(b1, sizeof b1, p->flops_step), fmt_flops(b2, sizeof b2, p->flops_step / tokens),
            in->doc_len ? "sum(L^2)/s" : "s", fmt_flops(b3, sizeof b3, p->hw_flops_step));
    fprintf(out, "bytes sent per step by one rank of stage %d:\n", p->worst);
    const long tp = in->run.tp, dp = in->run.dp, pp = in->run.pp;
    if (in->run.tp > 1)
        fprintf(out, "  tp  %11s  %d ranks, %s: %d all-reduce%s (or all-gather + reduce-scatter) per microbatch\n",
                fmt_bytes(b1, sizeof b1, w->tp_bytes), in->run.tp, link_name(hw, tp), w->tp_colls,
                in->run.sequence_parallel ? " pairs" : "s");
    if (in->run.pp > 1)
        fprintf(out, "  pp  %11s  %d stages, %s: activations forward, their gradients back, %d microbatches\n",
                fmt_bytes(b1, sizeof b1, w->pp_bytes), in->run.pp, link_name(hw, tp * dp * pp), in->run.accum);
    if (in->run.dp > 1 || (in->run.zero_stage >= 1 && in->run.shard > 1)) {
        static const char *const how[] = {
            "gradient all-reduce (bucketed, during the last backward)",
            "gradient all-reduce, then the updated parameters all-gathered",
            "gradients reduce-scattered every microbatch, parameters all-gathered after the update",
            "parameters all-gathered for forward and backward, gradients reduce-scattered, every microbatch"};
        fprintf(out, "  dp  %11s  %d ranks, %s: %s%s\n", fmt_bytes(b1, sizeof b1, w->dp_bytes), in->run.dp,
                link_name(hw, tp * dp), how[in->run.zero_stage],
                in->run.zero_stage >= 2 && in->run.shard < in->run.dp
                    ? "; the shard all-reduced across the hybrid groups"
                    : "");
    }
    if (w->cp_bytes > 0)
        fprintf(out,
                "  cp  %11s  %d ranks, %s: the ring's K,V blocks forward, blocks and their gradients backward, "
                "each layer and microbatch\n",
                fmt_bytes(b1, sizeof b1, w->cp_bytes), in->cp, link_name(hw, (long)in->run.tp * in->cp));
    if (w->ep_bytes > 0)
        fprintf(out,
                "  ep  %11s  %d ranks, %s: all-to-all of %d MoE layer%s' tokens, outputs and their gradients per "
                "microbatch (balanced routing); the experts' gradients go over the %d expert-DP ranks\n",
                fmt_bytes(b1, sizeof b1, w->ep_bytes), in->run.ep, link_name(hw, plan_ep_span(&in->run)), w->moe_layers,
                w->moe_layers == 1 ? "" : "s", plan_edp(&in->run));
    if (w->embed_bytes > 0)
        fprintf(out, "  embedding  %s  tied wte gradient summed over the first and last stage\n",
                fmt_bytes(b1, sizeof b1, w->embed_bytes));
    if (in->run.tp == 1 && in->run.pp == 1 && in->run.dp == 1)
        fprintf(out, "  none: one rank\n");

    fprintf(out, "\npredicted step on %s (%.0f%% of peak in the kernels; doc/design.md has the calibration):\n",
            hw->name, 100.0 * hw->efficiency);
    fprintf(out, "  compute          %12s  %d microbatch%s x %s on the slowest stage\n",
            fmt_time(b1, sizeof b1, p->t_compute), in->run.accum, in->run.accum == 1 ? "" : "es",
            fmt_time(b2, sizeof b2, p->t_compute / in->run.accum));
    fprintf(out, "  tp communication %12s  %s\n", fmt_time(b1, sizeof b1, p->t_tp),
            in->run.tp_overlap ? "collectives inside each microbatch, exposed (the input gradients' reductions "
                                 "beside the weight-gradient GEMMs: --tp-comm-overlap)"
                               : "blocking collectives inside each microbatch (exposed)");
    if (p->t_ep > 0)
        fprintf(out, "  ep communication %12s  the MoE layers' all-to-alls inside each microbatch (exposed)\n",
                fmt_time(b1, sizeof b1, p->t_ep));
    if (in->cp > 1)
        fprintf(out,
                "  cp communication %12s  the ring's exposed waits, of %s of K,V transfers (the rest overlapped "
                "with the attention)\n",
                fmt_time(b1, sizeof b1, p->t_cp), fmt_time(b2, sizeof b2, p->t_cp_all));
    if (in->run.pp_kind == PIPE_ZBH1)
        fprintf(
            out,
            "  pipeline bubble  %12s  (p-1)/(3m+p-1), zb-h1 with equal F, B and W = %.1f%% of the pipeline's time\n",
            fmt_time(b1, sizeof b1, p->t_bubble), 100.0 * p->bubble_frac);
    else if (in->run.pp_virtual > 1)
        fprintf(out, "  pipeline bubble  %12s  (p-1)/(v m+p-1), interleaved v%d = %.1f%% of the pipeline's time\n",
                fmt_time(b1, sizeof b1, p->t_bubble), in->run.pp_virtual, 100.0 * p->bubble_frac);
    else
        fprintf(out, "  pipeline bubble  %12s  (p-1)/(m+p-1) = %.1f%% of the pipeline's time\n",
                fmt_time(b1, sizeof b1, p->t_bubble), 100.0 * p->bubble_frac);
    fprintf(out, "  pp communication %12s  exposed: fill and drain, %d hops each way (steady state overlapped)\n",
            fmt_time(b1, sizeof b1, p->t_pp), in->run.pp - 1);
    fprintf(out, "  dp communication %12s  exposed, of %s in all (the rest overlapped with backward)\n",
            fmt_time(b1, sizeof b1, p->t_dp), fmt_time(b2, sizeof b2, p->t_dp_total));
    if (p->t_embed > 0)
        fprintf(out, "  tied embedding   %12s  exposed\n", fmt_time(b1, sizeof b1, p->t_embed));
    if (p->st[p->worst].n_host)
        print_offload_time(p, out);
    else
        fprintf(out, "  optimizer        %12s  AdamW streaming its state at %.0f GB/s\n",
                fmt_time(b1, sizeof b1, p->t_opt), hw->mem_bw * 1e-9);
    fprintf(out, "  step             %12s  | %.0f tokens/s | %.1f tokens/s per rank | MFU %.1f%% (HFU %.1f%%)\n",
            fmt_time(b1, sizeof b1, p->t_step), p->tokens_s,
            p->tokens_s / ((double)in->run.tp * in->run.pp * in->run.dp), 100.0 * p->mfu, 100.0 * p->hfu);
    fprintf(out, "  exposed communication %s, bubble %s\n",
            fmt_time(b1, sizeof b1, p->t_tp + p->t_ep + p->t_cp + p->t_pp + p->t_dp + p->t_embed),
            fmt_time(b2, sizeof b2, p->t_bubble));
}

/* --metrics FILE under --plan: the plan as one JSON object; "mem_peak" is
 * the per-category maximum over ranks, as training's --metrics reports it. */
static int write_json(const plan_t *p, const run_options_t *o, const char *path, char *err, size_t errlen)
{
    char failed[1024];
    if (fs_mkdir_parent(path, failed, sizeof failed) != 0) {
        snprintf(err, errlen, "--metrics %s: cannot create directory %s: %s", path, failed, strerror(errno));
        return -1;
    }
    FILE *f = fopen(path, "w");
    if (!f) {
        snprintf(err, errlen, "--metrics %s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    const plan_in_t *in = &p->in;
    const stage_plan_t *w = &p->st[p->worst];
    fprintf(f,
            "{\"plan\": 1, \"model\": \"%s\", \"params_total\": %zu, \"params_active\": %.0f, \"tp\": %d, "
            "\"pp\": %d, \"dp\": %d, \"cp\": %d, \"ep\": %d, \"etp\": %d, \"zero\": %d, \"shard\": %d, "
            "\"sequence_parallel\": %d, \"recompute\": \"%s\", \"dtype\": \"%s\", "
            "\"hw\": \"%s\", \"micro_batch\": %d, \"global_batch\": %d, \"seq_len\": %d, \"microbatches\": %d, "
            "\"worst_stage\": %d, \"in_flight\": %d, \"local_params\": %zu, \"mem_worst\": {",
            o->model, p->params_total, params_active(p), in->run.tp, in->run.pp, in->dp_data, in->cp,
            in->run.ep > 1 ? in->run.ep : 1, in->run.etp, in->run.zero_stage, in->run.shard, in->run.sequence_parallel,
            model_recompute_names[in->run.recompute],
            in->megatron ? "megatron"
            : in->bf16   ? "bf16"
                         : "fp32",
            in->hw->name, in->run.micro_batch, in->run.global_batch, in->run.seq_len, in->run.accum, p->worst, w->slots,
            w->n);
    for (int k = 0; k < MEM_N_CATEGORIES; k++)
        fprintf(f, "\"%s\": %.0f, ", mem_category_name((mem_category_t)k), w->mem[k]);
    fprintf(f, "\"total\": %.0f}, \"mem_peak\": {", w->total);
    for (int k = 0; k <= MEM_N_CATEGORIES; k++)
        fprintf(f, "\"%s\": %.0f%s", k < MEM_N_CATEGORIES ? mem_category_name((mem_category_t)k) : "total",
                p->mem_max[k], k < MEM_N_CATEGORIES ? ", " : "}");
    fprintf(f,
            ", \"device_bytes\": %.0f, \"usable_bytes\": %.0f, \"fits\": %d, \"margin_bytes\": %.0f, "
            "\"flops_per_step\": %.0f, \"hw_flops_per_step\": %.0f, \"bytes_sent\": {\"tp\": %.0f, \"pp\": %.0f, "
            "\"dp\": %.0f, \"embed\": %.0f, \"ep\": %.0f, \"cp\": %.0f}, \"cp_comm_s\": %.6g, \"step_s\": %.6g, "
            "\"compute_s\": %.6g, \"tp_comm_s\": %.6g, "
            "\"bubble_s\": %.6g, \"bubble_fraction\": %.6g, \"pp_comm_s\": %.6g, \"dp_comm_exposed_s\": %.6g, "
            "\"optimizer_s\": %.6g, \"tokens_per_s\": %.6g, \"mfu\": %.6g, \"hfu\": %.6g, \"doc_mask\": %d, "
            "\"doc_len\": %d, \"attn_positions\": %.17g, \"attn_flops_per_token\": %.0f, \"offload_fraction\": %g, "
            "\"host_offload_elements\": %zu, \"host_offload_bytes\": %.0f, \"optimizer_host_s\": %.6g, "
            "\"offload_d2h_s\": %.6g, \"offload_d2h_exposed_s\": %.6g}\n",
            in->hw->memory, p->usable, p->fits, p->margin, p->flops_step, p->hw_flops_step, w->tp_bytes, w->pp_bytes,
            w->dp_bytes, w->embed_bytes, w->ep_bytes, w->cp_bytes, p->t_cp, p->t_step, p->t_compute, p->t_tp,
            p->t_bubble, p->bubble_frac, p->t_pp, p->t_dp, p->t_opt, p->tokens_s, p->mfu, p->hfu, in->doc_mask,
            in->doc_len, in->att_T, flops_per_token(in->c, in->att_T) - flops_per_token(in->c, 0.0),
            in->run.offload_fraction, w->n_host, w->host_bytes, w->t_opt_host, w->t_d2h, w->t_d2h_exposed);
    if (fclose(f) != 0) {
        snprintf(err, errlen, "--metrics %s: write failed", path);
        return -1;
    }
    return 0;
}

/* ---- --search ------------------------------------------------------------------------ */

typedef struct candidate {
    int tp, pp, dp, cp, ep, zero, sp, mb;
    pipe_kind_t kind; /* 1f1b, interleaved or zb-h1 */
    int virt;         /* the interleaved schedule's chunks per stage; else 1 */
    model_recompute_t rc;
    double tokens_s, mfu, mem, margin, bubble;
} candidate_t;

static int by_throughput(const void *a, const void *b)
{
    const candidate_t *x = a, *y = b;
    if (x->tokens_s != y->tokens_s)
        return x->tokens_s < y->tokens_s ? 1 : -1;
    return x->mem > y->mem ? 1 : x->mem < y->mem ? -1 : 0;
}

#define SEARCH_SHOW 12

typedef struct search {
    candidate_t *cand;
    size_t n, cap, tried;
} search_t;

/* Plans layout t on tp x pp x dp; keeps it when it fits. */
static void search_try(search_t *sr, const run_options_t *t, const model_config_t *c, const hw_profile_t *hw)
{
    char e[512];
    plan_in_t in;
    plan_t p;
    if (t->global_batch % (t->micro_batch * t->dp) || plan_setup(t, c, hw, t->tp, t->pp, t->dp, &in, e, sizeof e) != 0)
        return;
    sr->tried++;
    if (plan_compute(&in, &p, e, sizeof e) == 0 && p.fits) {
        if (sr->n == sr->cap) {
            candidate_t *nc = realloc(sr->cand, 2 * sr->cap * sizeof *nc);
            if (!nc) {
                plan_free(&p);
                return;
            }
            sr->cand = nc;
            sr->cap *= 2;
        }
        sr->cand[sr->n++] = (candidate_t){.tp = t->tp,
                                          .pp = t->pp,
                                          .dp = t->dp,
                                          .cp = t->cp > 1 ? t->cp : 1,
                                          .ep = t->ep > 1 ? t->ep : 1,
                                          .zero = t->zero,
                                          .sp = t->sequence_parallel,
                                          .mb = t->micro_batch,
                                          .kind = t->pp_schedule,
                                          .virt = t->pp_virtual,
                                          .rc = t->recompute,
                                          .tokens_s = p.tokens_s,
                                          .mfu = p.mfu,
                                          .mem = p.st[p.worst].total,
                                          .margin = p.margin,
                                          .bubble = p.bubble_frac};
    }
    plan_free(&p);
}

static void search_schedule(search_t *sr, const run_options_t *o, run_options_t *t, const model_config_t *c,
                            const hw_profile_t *hw);

/* Every micro batch, sequence parallelism, ZeRO stage and recomputation
 * policy of one tp x pp x dp layout, and with pp > 1 each pipeline
 * schedule: 1f1b, interleaved with 2 and 4 chunks per stage (where the
 * layers and microbatches allow them) and zb-h1. */
static void search_layout(search_t *sr, const run_options_t *o, run_options_t *t, const model_config_t *c,
                          const hw_profile_t *hw)
{
    for (int v = 1; v <= (t->pp > 1 ? 4 : 1); v *= 2) {
        t->pp_schedule = v > 1 ? PIPE_INTERLEAVED : PIPE_1F1B;
        t->pp_virtual = v;
        search_schedule(sr, o, t, c, hw);
    }
    if (t->pp > 1) {
        t->pp_schedule = PIPE_ZBH1;
        t->pp_virtual = 1;
        search_schedule(sr, o, t, c, hw);
    }
}

static void search_schedule(search_t *sr, const run_options_t *o, run_options_t *t, const model_config_t *c,
                            const hw_profile_t *hw)
{
    for (int mb = 1; mb <= 16; mb *= 2)
        for (int sp = 0; sp <= (t->tp > 1); sp++)
            for (int z = 0; z <= 3; z++)
                for (int rc = MODEL_RECOMPUTE_NONE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
                    t->micro_batch = mb;
                    t->sequence_parallel = sp;
                    t->zero = z;
                    t->hybrid_shard = z > 0 && o->hybrid_shard > 0 &&
                                              (t->dp * (t->cp > 1 ? t->cp : 1)) % o->hybrid_shard == 0 &&
                                              o->hybrid_shard % (t->cp > 1 ? t->cp : 1) == 0
                                          ? o->hybrid_shard
                                          : 0;
                    t->recompute = (model_recompute_t)rc;
                    search_try(sr, t, c, hw);
                }
}

static void print_search(const search_t *sr, const run_options_t *o, const hw_profile_t *hw, FILE *out)
{
    char b1[32], b2[32];
    const candidate_t *cand = sr->cand;
    const size_t n = sr->n;
    fprintf(out, "search: %s on %d x %s, global batch %d x seq %d, %s: %zu layouts planned, %zu fit in %s usable\n",
            o->model, o->gpus, hw->name, o->global_batch, o->seq_len,
            o->plan_dtype != PLAN_DTYPE_AUTO ? plan_dtype_names[o->plan_dtype]
            : strcmp(hw->name, "cpu") == 0   ? "fp32"
                                             : "bf16",
            sr->tried, n, fmt_bytes(b1, sizeof b1, hw->memory - hw->reserve));
    if (n > 0)
        fprintf(out, "  %4s %4s %4s %4s %4s %-8s %4s %3s %-9s %5s %12s %7s %10s %10s %7s\n", "tp", "pp", "dp", "cp",
                "ep", "schedule", "zero", "sp", "recompute", "micro", "tokens/s", "MFU", "memory", "margin", "bubble");
    for (size_t i = 0; i < n && i < SEARCH_SHOW; i++) {
        char sched[16];
        if (cand[i].kind == PIPE_INTERLEAVED)
            snprintf(sched, sizeof sched, "inter-v%d", cand[i].virt);
        else
            snprintf(sched, sizeof sched, "%s", pipe_kind_name(cand[i].kind));
        fprintf(out, "  %4d %4d %4d %4d %4d %-8s %4d %3s %-9s %5d %12.0f %6.1f%% %10s %10s %6.1f%%\n", cand[i].tp,
                cand[i].pp, cand[i].dp, cand[i].cp, cand[i].ep, sched, cand[i].zero, cand[i].sp ? "on" : "off",
                model_recompute_names[cand[i].rc], cand[i].mb, cand[i].tokens_s, 100.0 * cand[i].mfu,
                fmt_bytes(b1, sizeof b1, cand[i].mem), fmt_bytes(b2, sizeof b2, cand[i].margin),
                100.0 * cand[i].bubble);
    }
    if (n > SEARCH_SHOW)
        fprintf(out, "  ... and %zu more that fit\n", n - SEARCH_SHOW);
    if (n == 0)
        fprintf(out, "no layout fits: more devices, a smaller micro batch or sequence, or more memory per device\n");
}

/* Every layout of --gpus devices: tp within a node and dividing the
 * heads, pp up to the layers, for a mixture of experts every ep dividing
 * both dp and the experts, zero 0-3, each recomputation policy,
 * sequence parallelism on and off, micro batches 1-16 that divide the
 * global batch; the ones that fit, best predicted tokens/s first. */
static int plan_search(const run_options_t *o, const model_config_t *c, const hw_profile_t *hw, int print, FILE *out,
                       char *err, size_t errlen)
{
    const int G = o->gpus;
    if (o->global_batch == 0) {
        snprintf(err, errlen, "--search needs --global-batch: the batch every layout must train");
        return -1;
    }
    search_t sr = {.cap = 4096};
    if (!(sr.cand = malloc(sr.cap * sizeof *sr.cand))) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    run_options_t t = *o;
    t.pp_layers[0] = '\0';
    t.fsdp = FSDP_UNSET;
    char e[512];
    for (int tp = 1; tp <= G && tp <= hw->gpus_per_node; tp++) {
        if (G % tp || options_check_grid(c, tp, 1, e, sizeof e) != 0)
            continue;
        for (int pp = 1; pp <= G / tp && pp <= c->n_layer; pp++) {
            if ((G / tp) % pp)
                continue;
            t.tp = tp;
            t.pp = pp;
            /* --cp: every cp that divides the rest and cuts the sequence
             * (dense models: a mixture refuses it), each with its dp */
            for (int cp = 1; cp <= G / (tp * pp); cp++) {
                if ((G / (tp * pp)) % cp || (cp > 1 && (c->moe.experts > 0 || o->seq_len % (2 * cp))))
                    continue;
                t.cp = cp;
                t.dp = G / (tp * pp * cp);
                const int plane = t.etp == 1 ? tp * t.dp : t.dp; /* --etp 1: EP groups over TP too */
                for (int ep = 1; ep <= plane; ep++) {
                    if (plane % ep || (ep > 1 && (cp > 1 || c->moe.experts == 0 || c->moe.experts % ep)))
                        continue;
                    t.ep = ep;
                    search_layout(&sr, o, &t, c, hw);
                }
            }
        }
    }
    qsort(sr.cand, sr.n, sizeof *sr.cand, by_throughput);
    if (print)
        print_search(&sr, o, hw, out);
    free(sr.cand);
    return 0;
}

/* ---- entry ------------------------------------------------------------------------------- */

int plan_run(const run_options_t *o, int world_size, int print, FILE *out, char *err, size_t errlen)
{
    model_config_t c;
    hw_profile_t hw;
    if (options_model_config(o, &c, err, errlen) != 0 ||
        hw_profile_load(&hw, o->hw, o->peak_gflops, o->gpu_mem, err, errlen) != 0)
        return -1;
    if (o->search)
        return plan_search(o, &c, &hw, print, out, err, errlen);
    int dp;
    if (plan_dp(o, world_size, &dp, err, errlen) != 0)
        return -1;
    static plan_in_t in; /* static: the run's stage split makes it 16 KiB */
    plan_t p;
    memset(&p, 0, sizeof p);
    int rc = plan_setup(o, &c, &hw, o->tp, o->pp, dp, &in, err, errlen);
    if (rc == 0)
        rc = plan_compute(&in, &p, err, errlen);
    if (rc == 0 && print) {
        print_plan_header(&p, o, out);
        print_memory(&p, out);
        print_perf(&p, out);
        fflush(out);
        if (o->metrics[0])
            rc = write_json(&p, o, o->metrics, err, errlen);
    }
    plan_free(&p);
    return rc;
}
