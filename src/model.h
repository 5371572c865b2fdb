/* GPT-2 and Llama decoder-only transformers: forward and backward built from
 * the ops table, over one flat parameter buffer described by the parameter
 * table. Shapes in comments: B batch rows, T sequence length, N = B*T,
 * C d_model, NH/NKV query/KV heads, HS head size, F MLP width, V vocabulary,
 * QKV = (NH + 2*NKV)*HS. */
#ifndef DTRAIN_MODEL_H
#define DTRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "model_config.h"
#include "ops.h"
#include "params.h"

/* Pointers into a flat buffer (parameters or their gradients) for one block.
 * wqkv is wq with wk, wv following it; wfc is GPT-2's fc weight or Llama's
 * gate with up following it. NULL where the architecture has no such tensor. */
typedef struct block_tensors {
    float *ln1w, *ln1b, *wqkv, *bqkv, *wo, *bo;
    float *ln2w, *ln2b, *wfc, *bfc, *wproj, *bproj;
} block_tensors_t;

typedef struct model_tensors {
    float *wte;  /* [V,C] token embedding (GPT-2: tied with the output head) */
    float *wpe;  /* [max_seq,C] GPT-2 only */
    block_tensors_t *h; /* [L] */
    float *lnfw, *lnfb;
    float *head; /* [V,C] output head: == wte for GPT-2 */
} model_tensors_t;

/* Saved activations of one block, all in backend memory. */
typedef struct block_acts {
    float *ln1, *ln1_mean, *ln1_rstd; /* [N,C], [N], [N] (mean unused by RMSNorm) */
    float *qkv;                       /* [N,QKV] (Llama: after RoPE) */
    float *att;                       /* [B,NH,T,T] softmax probabilities */
    float *atty;                      /* [N,NH*HS] attention output before wo */
    float *res2;                      /* [N,C] residual after attention */
    float *ln2, *ln2_mean, *ln2_rstd;
    float *fc;                        /* [N,F] GPT-2 pre-GELU, [N,2F] Llama gate|up */
    float *fc_act;                    /* [N,F] after GELU / SwiGLU */
} block_acts_t;

typedef struct model {
    model_config_t cfg;
    const ops_t *ops;
    param_table_t table;
    float *params; /* [table.numel] */
    float *grads;  /* [table.numel] */
    model_tensors_t p, g;

    int B, T; /* activation capacity; forward accepts any b <= B, t <= T */
    int cur_B, cur_T; /* shape of the last forward */
    block_acts_t *acts; /* [L] */
    float *x;           /* [L+1][N,C] residual stream: x[0] embeddings, x[l+1] block l output */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;      /* [N,V]; after a training forward it holds dlogits */
    float *losses;      /* [N] */
    int32_t *tokens, *targets; /* [N] backend copies of the batch */
    /* backward workspace */
    float *dres, *dln, *dbig, *dbig2, *datt;
    size_t act_bytes, work_bytes;
    int has_dlogits;
    /* layer_start[l]: flat offset of block l's first tensor; [L]: the final
     * norm's (the head and final norm lie above it, embeddings below [0]) */
    size_t *layer_start;
    /* When set, model_backward reports progress: every gradient at flat
     * offset >= ready_from is final. Data parallelism starts reducing
     * gradient buckets from here while backward continues. */
    void (*grads_ready)(void *ctx, size_t ready_from);
    void *grads_ready_ctx;
} model_t;

/* Allocates parameters, gradients and activations for batches up to B x T.
 * Returns 0, or -1 with one line in err. */
int model_create(model_t *m, const model_config_t *cfg, const ops_t *ops, int B, int T,
                 char *err, size_t errlen);
void model_destroy(model_t *m);

/* Fills parameters from the counter-based RNG (layout independent).
 * Returns -1 if the host staging buffer cannot be allocated. */
int model_init_params(model_t *m, uint64_t seed);

/* Forward of tokens[b*t] (host memory). Returns the mean loss over the b*t
 * targets (host memory), or 0 when targets is NULL (logits only, e.g. for
 * sampling). With dloss > 0 the gradient of dloss * mean loss with respect to
 * the logits is left in place for model_backward. */
float model_forward(model_t *m, const int32_t *tokens, const int32_t *targets, int b, int t,
                    float dloss);

/* Backward of the last forward (which must have had dloss > 0). accum = 0
 * writes parameter gradients, 1 adds to them (later microbatches). */
void model_backward(model_t *m, int accum);

/* Copies row n of the last forward's logits ([V] floats) to host memory. */
void model_logits_row(const model_t *m, int n, float *host_out);

#endif
