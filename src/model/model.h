/* GPT-2 and Llama decoder-only transformers: forward and backward built from
 * the ops table, over one flat parameter buffer described by the parameter
 * table, for one pipeline stage of one tensor-parallel rank.
 *
 * Shapes in comments: B batch rows, T sequence length, N = B*T tokens, C
 * d_model, HS head size. Tensor parallelism (TP ranks P) splits heads, the
 * MLP width and the vocabulary, so a rank computes with local widths:
 *   NH = n_head/P query heads, NKV = n_kv_head/P KV heads,
 *   QKV = (NH + 2*NKV)*HS, QD = NH*HS, F = d_ff/P, Vl = padded vocab/P.
 * The residual stream has NR rows per rank: N, or N/P with sequence
 * parallelism (rows [r*N/P, (r+1)*N/P) on TP rank r).
 *
 * Megatron's layout: q,k,v and the MLP's first matmul are column-parallel,
 * the attention output and the MLP's second matmul row-parallel; one
 * conjugate pair per sub-block: before the column-parallel matmul, identity
 * forward / all-reduce backward (with sequence parallelism: all-gather /
 * reduce-scatter), after the row-parallel one, all-reduce forward / identity
 * backward (reduce-scatter / all-gather). */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "base/ops.h"
#include "mpi/comm.h"
#include "mpi/cp_ring.h"
#include "mpi/dpsync.h"
#include "mpi/status.h"
#include "mpi/trace.h"
#include "src/model/model_config.h"
#include "src/model/params.h"

/* Pointers into a flat buffer (parameters or their gradients) for one block.
 * wqkv is wq with wk, wv following it; wfc is GPT-2's fc weight or Llama's
 * gate with up following it. NULL where the architecture has no such tensor. */
typedef struct block_tensors {
    float *ln1w, *ln1b, *wqkv, *bqkv, *wo, *bo;
    float *qnorm, *knorm;                           /* [HS] each: Llama with qk_norm (Qwen3) */
    float *ln2w, *ln2b, *wfc, *bfc, *wproj, *bproj; /* a MoE layer's: its shared expert's (NULL: none) */
    /* a MoE layer's router [E,C] and experts, stacked by expert (local
     * widths Fe = moe.ffn/P, FWe = Fe or 2Fe for SwiGLU): ewfc [E][FWe,C]
     * (Llama: each expert's gate rows, then its up rows), ebfc [E][Fe],
     * ewproj [E][C,Fe], ebproj [E][C]; NULL in dense layers */
    float *router, *ewfc, *ebfc, *ewproj, *ebproj;
    float *sgate; /* [1,C] the shared expert's gate (moe.shared_gate); NULL without one */
} block_tensors_t;

/* A MoE layer's routing and expert activations for one forward (NK =
 * N*K assignments; expert rows in dispatch order, moe_plan's, of which
 * the first M = offs[E] are used). Kept in the slot under every
 * --recompute mode. */
typedef struct moe_acts {
    float *logits, *scores;             /* [N,E] the router's, fp32 */
    float *lse;                         /* [N] */
    float *gate;                        /* [N,K] */
    int32_t *idx, *perm, *where, *offs; /* [N,K], [NK], [NK], [E+1] (ops moe_route_fwd, moe_plan) */
    float *he, *ae, *ye;                /* [NK,FWe] fc output, [NK,Fe] activation, [NK,C] expert output */
    float *auxw;                        /* [E] the load-balancing loss's gradient weights */
    int32_t *hoffs;                     /* host [E+1]: offs, the expert GEMMs' row ranges */
    float zw;                           /* the z-loss's gradient weight */
    /* --ep (lay.part.ep_size P > 1; NULL otherwise): the tokens this rank's
     * El = E/P experts received, expert by expert and within an expert by
     * source rank, [R,C] (R <= P*NK: he and ae then hold R rows too, ye
     * stays this rank's own NK), and hrcnt, host [P*El]: rows received
     * from EP rank s for local expert x at s*El + x */
    float *xr;
    int32_t *hrcnt;
    /* --moe-shared-gate (NULL otherwise): the gate's sigmoid per token [N],
     * and the shared expert's output before it [N,C] (this rank's part,
     * partial over TP) */
    float *sgate, *sy;
} moe_acts_t;

/* A MoE layer's routing over the microbatches since model_moe_stats_reset
 * (host; summed, divided by micro when read). */
typedef struct model_moe_stats {
    double aux, z;   /* the load-balancing loss E sum_e f_e P_e and the z-loss (before their coefficients) */
    double max_load; /* the busiest expert's assignments over the mean (1 = balanced) */
    double dropped;  /* assignments dropped by the capacity */
    double assigned; /* assignments made (N * K) */
    int micro;       /* forwards counted */
} model_moe_stats_t;

typedef struct model_tensors {
    float *wte;         /* [Vl,C] token embedding (GPT-2: tied with the output head); first stage */
    float *wpe;         /* [max_seq,C] GPT-2 only; first stage */
    block_tensors_t *h; /* [Ls] this stage's blocks */
    float *lnfw, *lnfb; /* last stage */
    float *head;        /* [Vl,C] output head (GPT-2: wte, or its tied copy); last stage */
} model_tensors_t;

/* What a slot keeps of each block for its backward (--recompute):
 *  NONE       every tensor of block_acts_t;
 *  SELECTIVE  all but fc_act: the backward re-runs the activation function
 *             (from fc) into shared workspace. (Attention keeps no T x T
 *             probabilities in any mode: its backward always recomputes
 *             them blockwise from qkv and lse, flash-attention style.)
 *  FULL       nothing but the block's input x[i]: the backward re-runs the
 *             block's forward (its TP collectives included) into a one-block
 *             workspace shared by all slots.
 * Every mode runs the same kernels on the same inputs, so losses, gradients
 * and parameters are bit-identical to NONE. */
typedef enum { MODEL_RECOMPUTE_NONE = 0, MODEL_RECOMPUTE_SELECTIVE, MODEL_RECOMPUTE_FULL } model_recompute_t;
/* The names of model_recompute_t, indexed by it, NULL-terminated (--recompute). */
extern const char *const model_recompute_names[];

/* Saved activations of one block, all in backend memory. In a slot the
 * tensors its --recompute mode drops are NULL. */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C] (all rows), [NR], [NR] (mean unused by RMSNorm) */
    float *qkv;                       /* [N,QKV] (Llama: after the q/k norms and RoPE) */
    float *qk_in, *qk_rstd;           /* [N,(NH+NKV)*HS], [N,NH+NKV]: q, k before their norms (qk_norm) */
    float *lse;                       /* [B,NH,T] attention's log-sum-exp per query row */
    float *atty;                      /* [N,QD] attention output before wo */
    float *res2;                      /* [NR,C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd; /* [N,C], [NR], [NR] */
    float *fc;                        /* [N,F] GPT-2 pre-GELU, [N,2F] Llama gate|up */
    float *fc_act;                    /* [N,F] after GELU / SwiGLU */
    /* --dtype bf16: ln1, ln2 and fc_act are only matmul inputs, so they
     * are kept as the bf16 copies the matmuls read ([N,C], [N,C], [N,F];
     * the fp32 pointers are then NULL), at half the bytes, written by the
     * norms and the activation function themselves (base/ops.h's bf16
     * outputs); atty16 [N,QD] is the attention's bf16 output beside its
     * fp32 one (the backward reads both). NULL in fp32; fc_act16 where
     * --recompute drops fc_act is the view's (block_view: in dbig2). */
    uint16_t *ln1_16, *ln2_16, *fc_act16, *atty16;
    /* a MoE model's routing and experts (every block of a slot has room
     * for them; dense layers leave them unused). In a MoE model ln2 is
     * kept in fp32 under --dtype bf16 too: the router and the experts
     * read it in fp32. */
    moe_acts_t moe;
} block_acts_t;

/* Everything one microbatch's forward leaves for its backward. A pipeline
 * stage keeps several in flight (1F1B: up to the number of stages). */
typedef struct model_slot {
    int b, t; /* shape of the forward held here */
    /* after a training forward: the head's gradient waits for the
     * backward, as dlogits in logits (whole) or dx in lnf (fused) */
    int has_dlogits;
    int head_accum; /* fused: whether that forward added to the head's weight gradient (else wrote it) */
    /* the chunk (run of blocks) whose forward the slot holds: local
     * blocks [first, first + n_blocks); Lc below is the longest run's length */
    int chunk, first, n_blocks;
    /* split_backward: [Lc][N, 2C + fc_width + qkv_width] each block's
     * matmul output gradients from B for W: mlp proj [N,C], fc [N,fcw],
     * attention proj [N,C], qkv [N,qkvw] */
    float *wdout;
    float *x;           /* [Lc+1][NR,C] residual stream: x[0] chunk input, x[j+1] block first+j's output */
    block_acts_t *acts; /* [Lc] */
    /* [N,C], [NR], [NR] (last stage); after a fused training forward lnf
     * holds dx = dL/d(lnf), this rank's partial sum over its vocabulary */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;             /* [N,Vl]; after a training forward it holds dlogits; NULL when fused */
    float *losses;             /* [N] */
    float *xmax, *xstats;      /* [N], [N,2]: cross-entropy max and {sumexp, target logit} */
    int32_t *tokens, *targets; /* [N] backend copies of the batch */
    int32_t *pos;              /* [N] document positions (lay.doc_mask), or with --cp the rows' positions; else NULL */
    int32_t *qdoc;             /* [N] --cp with doc_mask: each row's global document start (cp_ring's qdoc) */
    int has_pos;               /* the forward held here was given positions: its backward uses them too */
    float dloss;               /* the forward's dloss: the MoE losses' gradients scale with it */
} model_slot_t;

/* Where this rank sits: its TP group and its pipeline stage. */
typedef struct model_layout {
    param_layout_t part; /* tensors held: TP rank, layer range, embed/head */
    comm_t *tp;          /* the TP group; may be NULL when part.tp_size == 1 */
    comm_t *ep;          /* the EP group (part.ep_size > 1: the experts' all-to-all), else NULL */
    /* --cp: the CP group, over which every sequence is cut (cp_size > 1:
     * the ring attention of mpi/cp_ring.h), else NULL. The model's t is
     * then the local rows per sequence (T / cp), every forward needs the
     * rows' positions (pos: global, or document positions under doc_mask)
     * and attention runs over the whole sequence by the ring. */
    comm_t *cp;
    int cp_size, cp_rank; /* its size and this rank's place (0 and 1: none) */
    int sequence_parallel;
    int n_slots; /* microbatches in flight on this stage */
    /* Block gradients are not kept (ZeRO-2 and 3: the strategy's
     * lends_block_grads). m->grads holds only the tensors outside the
     * blocks (embeddings, then final norm and head), and each block's
     * gradients go to the buffer the hook's block_grads lends for that
     * block's backward ([layer_start[i+1] - layer_start[i]] floats, the
     * flat layout of the block's range). */
    int lent_block_grads;
    /* Block parameters are not kept either (ZeRO-3). m->params holds the
     * tensors outside the blocks in the same compact layout, and each
     * block's forward or backward first asks the hook's block_params for
     * the block's gathered parameters. */
    int lent_block_params;
    model_recompute_t recompute; /* what the slots keep of each block */
    /* --doc-mask: forwards may be given document positions (src/model/docmask.h),
     * kept per slot for the backward and for recomputation */
    int doc_mask;
    /* --dtype bf16: every matmul (the blocks' four and the head) rounds its
     * operands to bf16 and sums in fp32 (ops matmul_*_bf16); parameters,
     * gradients, optimizer state, activations and every other op stay fp32,
     * except the matmul-only activations (block_acts_t's *16) and the
     * weights' copy params16, which are kept as bf16. */
    int bf16;
    /* --tp-comm-dtype bf16 (needs bf16): the TP collectives of activations
     * and their gradients round them to bf16 into the a16/d16 workspaces,
     * send and sum in bf16 (COMM_BF16), and widen the result back */
    int tp_bf16;
    /* --tp-comm-overlap (tp > 1): the backward of a column-parallel matmul
     * (qkv, and a dense MLP's first) posts its input gradient's TP
     * reduce-scatter (all-reduce without sequence parallelism) after the
     * input-gradient GEMM, runs the weight-gradient GEMM, then waits; under
     * tp_bf16 the collective stages in its own bf16 buffer (tpo16), since
     * that GEMM reads a16/d16 */
    int tp_overlap;
    /* The backward comes in two halves (the zero-bubble pipelines' B and
     * W): model_backward_input computes every activation gradient and the
     * norms' and embeddings' weight gradients, keeping each matmul's output
     * gradient in the slot (slot_t.wdout); model_backward_weight then
     * computes the matmuls' weight and bias gradients from those and the
     * slot's kept inputs. Needs every input kept (recompute none) and the
     * block gradients held (no lent blocks). */
    int split_backward;
    /* The last stage's classifier (head GEMM, softmax cross-entropy and
     * their gradient): MODEL_LOGITS_WHOLE keeps each slot's whole logits
     * [N, Vl] (their gradient in their place after a training forward),
     * which model_token_logprobs's top tokens need (dtrain-serve);
     * otherwise the forward runs the fused classifier over chunks of
     * rows: logits of a chunk, their loss, and in a training forward their
     * gradient, dx = dlogits . head (kept in the slot for the backward)
     * and the head's weight gradient, before the next chunk overwrites
     * them, so that one chunk's logits exist at a time. > 0: rows per
     * chunk (at most N); MODEL_LOGITS_AUTO: model_logits_rows's choice. */
    int logits_chunk;
    /* --offload optimizer under bf16 with the whole state offloaded
     * (src/train/options.h run_config_weights_on_host): params lives in host
     * memory (the backend's host_alloc: pinned, and on CUDA mapped into
     * the device's address space), where it is the optimizer's master
     * copy; the device holds params16, which every matmul reads, and a
     * copy (weights_dev) of the tensors other ops read in fp32:
     * embeddings, norms, biases, the router. Needs bf16 and every block's
     * parameters held (no lent_block_params). */
    int params_host;
} model_layout_t;

#define MODEL_LOGITS_WHOLE 0
#define MODEL_LOGITS_AUTO (-1)
/* Auto's smallest chunk: its three GEMMs read the head (and its gradient)
 * once per chunk, so fewer rows would make them memory-bound. */
#define MODEL_LOGITS_MIN_ROWS 256

typedef struct model {
    model_config_t cfg;
    const ops_t *ops;
    model_layout_t lay;
    param_table_t table;
    float *params; /* [params_n]: [table.numel], or see lent_block_params */
    size_t params_n;
    float *grads; /* [grads_n]: [table.numel], or see lent_block_grads */
    size_t grads_n;
    model_tensors_t p, g;
    int n_local;            /* Ls: blocks on this stage */
    int v0, v_held, v_rows; /* vocab: first logical row held, rows held, rows in memory (Vl) */

    int B, T;            /* activation capacity; forward accepts any b <= B, t <= T */
    model_slot_t *slots; /* [n_slots] */
    /* backward and forward workspace, shared by all slots */
    float *dres;  /* [NR,C] dL/d(residual): holds dL/d(stage output) on entry to a
                      middle stage's backward, dL/d(stage input) on exit */
    float *dfull; /* [N,C] all rows of dres (sequence parallel) */
    float *dfull2; /* [N,C] --tp-comm-overlap under SP: the attention's gathered dres while dfull still feeds a GEMM */
    float *dln;   /* [N,C] */
    float *dlnr;  /* [NR,C] this rank's rows of dln after reduce-scatter */
    float *dbig, *dbig2;
    float *inv_freq; /* [HS/2] RoPE's inverse frequencies, scaling applied (Llama; model_rope_inv_freq) */
    /* the fused classifier (lay.logits_chunk not whole; last stage): rows
     * per chunk, and one chunk's logits [xrows, Vl], over dbig and dbig2
     * where they fit (both are free between a block's backward and the
     * next), else a buffer of their own; xrows 0: whole logits */
    int xrows;
    float *xlogits;
    /* fused: the head's weight gradient holds this step's forwards' part
     * (a later training forward adds to it), and the training forwards
     * whose backward has not run yet */
    int head_open, head_pending;
    float *tmp; /* [N,C] row-parallel partial sums before reduce-scatter */
    /* MoE layers (NK = N*K): the gathered tokens [NK,C], two gradient
     * buffers [NK, max(C, FWe)], dgate [N,K], dlogits [N,E], the routing
     * reductions [2E+2] (ops moe_stats) and their host copy */
    float *mx, *md1, *md2, *mdgate, *mdlogits, *mstats;
    /* --moe-shared-gate: the gated shared expert's output gradient [N,C]
     * and the gate logits' [N] (NULL otherwise) */
    float *msdy, *msdz;
    float *mstats_host;
    int32_t *moffs_host; /* [n_slots * Lc * (E+1)]: the slots' hoffs */
    /* --ep: the all-to-all's staging [P*NK, C] (backend), the row
     * permutation between source and expert order [2 P*NK] (backend: perm
     * then its inverse), and host scratch: the slots' hrcnt [n_slots * Lc
     * * E], the permutations [2 P*NK], the expert-order offsets [E+1],
     * the counts sent [E] and the all-to-all's counts and displacements
     * [4P] */
    float *mrecv;
    int32_t *mperm;
    int32_t *mrcnt_host, *mperm_host, *meoffs_host, *mscnt_host;
    size_t *ma2a_host;
    double
        ep_comm_s; /* seconds in the experts' all-to-alls (and, under --cp, their statistics' CP sum) since the caller zeroed it (the step's comm wait) */
    /* --cp: the ring attention (mpi/cp_ring.h) for the micro batch's
     * shape, and what it cost since the caller zeroed cp_stats (its
     * wait_*_s: the ring's exposed communication) */
    struct cp_ring *ring;
    size_t ring_bytes; /* its backend buffers (cp_ring_bytes) */
    cp_ring_stats_t cp_stats;
    model_moe_stats_t *moe_stats; /* [Ls] per local block (dense ones stay 0) */
    /* the sigmoid router's expert bias (DeepSeek's aux-loss-free
     * balancing; it selects experts and does not weigh them), backend
     * [Ls,E], zero until model_moe_bias_set; and each expert's assignments
     * in the training forwards since model_moe_stats_reset, host [Ls,E] */
    float *mbias;
    double *mload_host;
    float *lnr; /* [NR,C] a norm's output rows before all-gather */
    /* --recompute: where the dropped tensors of the block being computed
     * live (FULL: all of block_acts_t; SELECTIVE: none). fc_act is never
     * here: it goes to dbig2, free from the activation function's backward
     * until the attention's. NULL fields: kept in the slot instead. */
    block_acts_t racts;
    /* --dtype bf16: one GEMM's operands rounded to bf16 (workspace):
     * input [N*IC], output gradient [N*OC] at the widest, and a lent
     * (ZeRO-3) block weight [OC*IC] (NULL without lent block params) */
    uint16_t *a16, *w16, *d16;
    uint16_t *tpo16; /* --tp-comm-overlap under tp_bf16: [N*C] sent, [NR*C] received (model_layout_t's tp_overlap) */
    /* d16 while it holds the bf16 of dres (all N rows), written there by
     * the norm backward that last added into dres, for the next matmul
     * backward that takes dres as its output gradient; NULL otherwise
     * (consumed once: dres_all_rows) */
    const uint16_t *dres16;
    /* --dtype bf16: params rounded to bf16 ([params_n], MEM_PARAMS), the
     * weights every matmul reads. Stale after model_params_from_host or
     * model_params_written, and then recast whole at the next matmul. An
     * optimizer that updates every element of params keeps a current copy
     * current by writing it in the same pass (ops adamw's p16). */
    uint16_t *params16;
    int params16_stale;
    /* lay.params_host: the fp32 tensors ops other than the matmuls read
     * ([weights_dev_n] floats, MEM_PARAMS), copied from params after
     * every write of it by runs of tensors adjacent in both; p's pointers
     * to those tensors point here, the matmul weights' into params */
    float *weights_dev;
    size_t weights_dev_n;
    struct weights_run {
        size_t flat, dev, n; /* floats [flat, flat + n) of params at [dev, dev + n) of weights_dev */
    } *weights_runs;
    int n_weights_runs;
    size_t act_bytes, work_bytes;
    /* layer_start[i]: flat offset of local block i's first tensor; [Ls]: the
     * final norm's (the head and final norm lie above it, embeddings below [0]) */
    size_t *layer_start;
    /* The data-parallel strategy's hook (mpi/dpsync.h), set once: backward
     * reports progress through grads_ready (every gradient at flat offset
     * >= ready_from is final, so reductions may start while backward
     * continues); with lent_block_grads each block's backward asks
     * block_grads for its gradient buffer, and with lent_block_params each
     * block's forward and backward ask block_params for its parameters
     * ([layer_start[i+1] - layer_start[i]] floats, flat layout; `next` is
     * the block expected after it, -1 when none). NULL from a lender fails
     * the pass (the strategy's err says why). */
    dpsync_hook_t hook;
    double tp_comm_s; /* seconds in TP collectives since the caller zeroed it */
    trace_t *trace;   /* NULL, or where per-layer spans go (--trace) */
    int trace_micro;  /* microbatch index the spans are labelled with */
} model_t;

/* The model's GEMMs in its precision, for the layer files (moe.c):
 * fp32, or under --dtype bf16 with the operands rounded to bf16 and fp32
 * sums (the weight's copy from params16, or rounded into the w16
 * workspace for a weight outside the parameters; an input without its
 * kept copy in16/keep16 rounded into a16, the output gradient without
 * its producer's bf16 copy dout16 rounded into d16). Under bf16 in ==
 * NULL means keep16 already holds the input (its producer wrote it), and
 * dout16 != NULL that it holds dout's bf16: no cast runs for them.
 * Shapes as the ops table's matmul_fwd, matmul_bwd and matmul_dgelu_bwd;
 * din16 [N,IC] (NULL: not wanted) receives the bf16 of the dgelu's din. */
void model_mm_fwd(model_t *m, float *out, const float *in, uint16_t *keep16, const float *w, const float *b, int N,
                  int IC, int OC);
void model_mm_bwd(model_t *m, float *din, float *dw, float *db, const float *dout, const uint16_t *dout16,
                  const float *in, const uint16_t *in16, const float *w, int N, int IC, int OC, int accum_din,
                  int accum_dw);
void model_mm_dgelu_bwd(model_t *m, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                        const uint16_t *dout16, const float *in, const uint16_t *in16, const float *pre,
                        const float *w, int N, int IC, int OC, int accum_dw);

/* buf[n] (backend memory) summed over the TP group in place, timed with
 * the TP collectives (m->tp_comm_s); no-op at tp 1. For the model's own
 * files (moe.c: --etp 1's routing statistics). */
status_t model_tp_sum(model_t *m, float *buf, size_t n, char *err, size_t errlen);

/* The grouped GEMMs (ops gmm_fwd/gmm_bwd, base/ops.h) in the model's
 * precision, as model_mm_*: G groups of rows by the host offsets offs
 * (offs[0] = 0), weights w[G,OC,IC] and biases b[G,OC]; the backward
 * writes din (with pre: gelu'(pre) o, as model_mm_dgelu_bwd) and dw, db
 * (=|+= by accum_dw). */
void model_gmm_fwd(model_t *m, float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G,
                   int IC, int OC);
void model_gmm_bwd(model_t *m, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                   const float *w, const int32_t *offs, int G, int IC, int OC, int accum_dw);
/* The rows per chunk of the fused classifier for batch capacity N (B*T)
 * and lay.logits_chunk (not whole): the chunk given, at most N; auto:
 * as many rows as fit the backward's scratch dbig and dbig2 (scratch
 * floats), so that the logits need no memory of their own, but at least
 * MODEL_LOGITS_MIN_ROWS, and at most N. Vl: this rank's vocabulary rows. */
int model_logits_rows(int logits_chunk, size_t N, size_t Vl, size_t scratch);

/* Zeroes the MoE layers' routing statistics (model_moe_stats_t and the
 * expert loads). */
void model_moe_stats_reset(model_t *m);

/* Sets the MoE layers' expert bias (model_moe_has_bias) from bias[L,E],
 * every layer of the model (host; the rows of dense layers are ignored). */
void model_moe_bias_set(model_t *m, const float *bias);

/* The layout of a single process: the whole model, no TP, one slot. */
model_layout_t model_layout_single(const model_config_t *c);

/* Allocates parameters, gradients and activations for batches up to B x T.
 * Returns 0, or -1 with one line in err. */
int model_create(model_t *m, const model_config_t *cfg, const ops_t *ops, const model_layout_t *lay, int B, int T,
                 char *err, size_t errlen);
void model_destroy(model_t *m);

/* Bytes of the activation arena (MEM_ACTS) and the workspace arena
 * (MEM_WORKSPACE) model_create allocates for this layout and batch
 * capacity, computed by the same layout code without allocating: what the
 * planner (src/plan/plan.c) reports for --plan-dtype fp32 (lay->bf16 = 0). */
void model_arena_bytes(const model_config_t *cfg, const model_layout_t *lay, int B, int T, size_t *acts, size_t *work);

/* Bytes of the parameter buffers (MEM_PARAMS: the fp32 weights and, with
 * lay->bf16, their bf16 copy; under lay->params_host the bf16 copy and
 * weights_dev) and the gradient buffer (MEM_GRADS) model_create allocates
 * for this layout (under lent_block_params / lent_block_grads only the
 * tensors outside the blocks), computed by the same code without
 * allocating: what the planner reports. *host (may be NULL): the bytes of
 * params in host memory (lay->params_host), else 0. Returns 0, or -1
 * (err). */
int model_state_bytes(const model_config_t *cfg, const model_layout_t *lay, size_t *params, size_t *grads, size_t *host,
                      char *err, size_t errlen);

/* Fills parameters from the counter-based RNG (layout independent).
 * Returns -1 if the host staging buffer cannot be allocated. */
int model_init_params(model_t *m, uint64_t seed);
/* Copies between the parameter buffer and a host buffer in the flat
 * layout [table.numel]; with lent_block_params only the tensors outside the
 * blocks (the block range of host is neither read nor written). */
void model_params_from_host(model_t *m, const float *host);
void model_params_to_host(const model_t *m, float *host);
/* The parameter buffer itself, when it is host memory in that flat layout
 * (a host-readable ops table, no lent block params): a loader fills it in
 * place and then calls model_params_written, instead of filling fresh
 * memory of the model's size and copying it over. NULL otherwise. */
float *model_params_in_place(model_t *m);
/* The caller wrote params other than through the fused AdamW (a ZeRO
 * all-gather): params16 is recast before the next bf16 matmul (and under
 * lay.params_host the device's fp32 copies are refreshed now). */
void model_params_written(model_t *m);
/* The optimizer wrote params and kept params16 current (lay.params_host:
 * the host AdamW): the device's fp32 copies are refreshed. No-op without
 * params_host. */
void model_params_updated(model_t *m);

/* Forward of one microbatch of b x t tokens into activation slot `slot`.
 * tokens (host, [b*t]) are read by the first stage; other stages read their
 * input from model_stage_input(). pos (host, [b*t]): the tokens' document
 * positions (src/model/docmask.h), which every stage needs (attention masks,
 * RoPE and learned positions restart at each document); NULL: one document
 * per row, as without --doc-mask. Positions need lay.doc_mask. On the last stage with targets != NULL
 * *loss is the mean loss over the counted targets (>= 0; a non-finite
 * value is a value, not a failure), and with dloss > 0 the gradient of
 * dloss * mean loss w.r.t. the logits is left for model_backward.
 * Elsewhere *loss is 0 (and the output is in model_stage_output()).
 * Under the fused classifier (lay.logits_chunk) a training forward also
 * computes the head's weight gradient: it writes it when it is the first
 * since model_create or since a backward given last, and adds to it after
 * (a backward's accum = 0 or 1, as the backward will be given; a
 * mismatch, or a backward given last while a later training forward's
 * gradient waits, fails that backward as an internal error). A forward
 * without targets computes no logits (model_logits_row makes them).
 * Collective over the TP group; the first failed collective (or lent
 * block) ends the pass with its status and one line in err. With sequence
 * parallelism b*t must be a multiple of the TP size. */
status_t model_forward(model_t *m, int slot, const int32_t *tokens, const int32_t *pos, const int32_t *targets, int b,
                       int t, float dloss, float *loss, char *err, size_t errlen);
/* The same for one chunk of a stage that holds several runs of blocks
 * (lay.part.n_runs > 1: the interleaved pipeline's virtual stages): run
 * `chunk`'s blocks, with the embeddings when it is the first stage's chunk
 * 0 and the head when it is the last stage's last chunk. model_forward is
 * chunk 0 (the whole stage when it holds one run). */
status_t model_forward_chunk(model_t *m, int chunk, int slot, const int32_t *tokens, const int32_t *pos,
                             const int32_t *targets, int b, int t, float dloss, float *loss, char *err, size_t errlen);

/* The per-token losses [n = b*t] of the last forward in `slot` (the last
 * stage, with targets; a target < 0 leaves its place unspecified), copied
 * to the host. --eval-mc's per-completion scores. */
void model_token_losses(const model_t *m, int slot, float *out, int n);

/* Backward of the forward held in `slot`. Last stage: from its dlogits;
 * other stages: from dL/d(output) the caller put in model_stage_grad().
 * accum = 0 writes parameter gradients, 1 adds to them (later
 * microbatches). last = 1 on the step's final microbatch: gradients that
 * need a TP reduction (norm weights under sequence parallelism) get it
 * then. On exit model_stage_grad() holds dL/d(stage input) (not on the
 * first stage). Ends at the first failed collective (or lent block) with
 * its status and one line in err. */
status_t model_backward(model_t *m, int slot, int accum, int last, char *err, size_t errlen);
/* The backward of whichever chunk's forward the slot holds (model_backward
 * is this); accum and last then count that chunk's microbatches. The hook
 * sees grads_ready() from model_chunk_top(chunk) down to the chunk's first
 * block (and 0 after the embeddings of chunk 0). */
status_t model_backward_chunk(model_t *m, int slot, int accum, int last, char *err, size_t errlen);
/* The split backward (lay.split_backward): B, then W of the same slot.
 * accum and last as model_backward's, for the gradients each half writes;
 * the hook sees grads_ready() during W only (the gradients are final only
 * after it). */
status_t model_backward_input(model_t *m, int slot, int accum, int last, char *err, size_t errlen);
status_t model_backward_weight(model_t *m, int slot, int accum, char *err, size_t errlen);
/* The flat offset above chunk's gradients: the next chunk's first block,
 * or the table's end for the last chunk (whose head is below it). */
size_t model_chunk_top(const model_t *m, int chunk);

/* The stage's activation interface for the pipeline: [NR,C] floats each. */
float *model_stage_input(model_t *m, int slot);
float *model_stage_output(model_t *m, int slot);
float *model_stage_grad(model_t *m);
size_t model_stage_floats(const model_t *m, int b, int t);

/* Parameters of the whole model (all stages, unsplit); 0 if the table
 * cannot be built. */
size_t model_params_total(const model_config_t *c);

/* Copies logits row n of slot's last forward, all V columns, to host
 * memory (last stage). Under the fused classifier they are computed from
 * the final norm's output, with the GEMM of the chunk holding row n (the
 * same bits as the training forward's logits), which a training forward
 * has overwritten: not after one. Collective over the TP group (gathers the vocab
 * slices); on failure one line in err. */
status_t model_logits_row(model_t *m, int slot, int n, float *host_out, char *err, size_t errlen);

/* The most alternatives model_token_logprobs gives per position. */
#define MODEL_TOP_MAX 20

/* Log-probabilities from the last forward in `slot` (last stage; a forward
 * given targets and dloss 0, so its logits are kept), for its first n
 * positions: lp[i] = log p(targets[i]) (0 where targets[i] < 0; targets as
 * given to the forward) and, for k from 1 to MODEL_TOP_MAX, the k most
 * likely tokens, top_id[i*k + j] and top_lp[i*k + j], best first (the
 * lower id first on a tie). Each log p is logit - logsumexp in double from
 * the fp32 logits and the forward's row statistics, computed alike for the
 * target and the top entries, so a target that is the argmax has exactly
 * its top entry's value. k = 0: lp only. Collective over the TP group (the
 * vocabulary slices' candidates are gathered). */
status_t model_token_logprobs(model_t *m, int slot, int n, const int32_t *targets, int k, double *lp, int32_t *top_id,
                              double *top_lp, char *err, size_t errlen);

/* The k (1 to MODEL_TOP_MAX) largest of x[0..n) as val/id[0..k), best
 * first, the lower id first on a tie; x[c] is id v0 + c. Fewer than k
 * values leave id -1 (value -inf) at the end. */
void model_top_row(const float *x, int n, int v0, int k, float *val, int32_t *id);

#endif
