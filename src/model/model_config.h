/* Model shapes: the named presets (tiny, gpt2-124m, llama-70b, ...) and
 * the derived quantities every other part of the program uses. */
#ifndef DTRAIN_MODEL_CONFIG_H
#define DTRAIN_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum { ARCH_GPT2 = 0, ARCH_LLAMA = 1 } model_arch_t;

/* How RoPE's inverse frequencies are stretched for contexts longer than
 * training's (Hugging Face's rope_scaling; Llama only):
 *  NONE    inv_freq[i] = theta^(-2i/HS)
 *  LINEAR  inv_freq[i] / factor (positions divided by factor)
 *  LLAMA3  Llama 3.1's: low frequencies (wavelength above
 *          original_max_seq / low_freq_factor) divided by factor, high
 *          ones (below original_max_seq / high_freq_factor) kept, and the
 *          band between interpolated (HF's _compute_llama3_parameters). */
typedef enum { ROPE_SCALING_NONE = 0, ROPE_SCALING_LINEAR = 1, ROPE_SCALING_LLAMA3 = 2 } rope_scaling_t;

/* Mixture-of-experts feed-forward layers (issue 33). The router's
 * scores over the E experts: SOFTMAX (Mixtral, Qwen-MoE) or SIGMOID
 * (DeepSeek-V3's scores, each expert's on its own). */
typedef enum { MOE_ROUTER_SOFTMAX = 0, MOE_ROUTER_SIGMOID = 1 } moe_router_t;

/* experts == 0: a dense model (every other field 0). Otherwise layer l is
 * a MoE layer when l >= first_dense and (l - first_dense) % every == 0;
 * its feed-forward is the sum, for each token, of its top_k experts'
 * outputs (each expert the architecture's MLP of width ffn), weighted by
 * the router's scores of them (renormalised over the k when norm_topk),
 * plus a shared expert of width shared_ffn (0: none) every token goes
 * through. The training-side coefficients: aux_coef (Switch's load
 * balancing loss E * sum_e f_e P_e) and z_coef (ST-MoE's mean
 * logsumexp(logits)^2) scale the terms added to the optimised loss;
 * capacity > 0 caps each expert at ceil(capacity * T * top_k / E)
 * assignments per sequence (dropping the lowest scores), 0 is dropless. */
typedef struct moe_config {
    int experts;     /* E */
    int top_k;       /* K */
    int ffn;         /* F_e: each routed expert's MLP width */
    int every;       /* MoE layer period (1: every layer from first_dense on) */
    int first_dense; /* layers [0, first_dense) stay dense (DeepSeek's first_k_dense_replace) */
    moe_router_t router;
    int norm_topk;  /* renormalise the chosen scores to sum 1 (Mixtral; Qwen's norm_topk_prob) */
    int shared_ffn; /* width of the shared expert in MoE layers (0 = none) */
    float aux_coef, z_coef;
    float capacity; /* capacity factor; 0 = dropless */
    /* the sigmoid router's expert bias moves by this after each step,
     * toward balance (DeepSeek-V3's aux-loss-free gamma); 0 = it stays */
    float bias_rate;
} moe_config_t;

typedef struct model_config {
    model_arch_t arch;
    int vocab_size; /* V */
    int n_layer;    /* L */
    int n_head;     /* NH */
    int n_kv_head;  /* NKV (== NH for GPT-2) */
    int d_model;    /* C */
    int d_ff;       /* F: MLP hidden width */
    int head_dim;   /* HS when it is not d_model / n_head (Qwen3: 128 at d_model 1024, 16 heads); else 0 */
    int max_seq;    /* longest sequence (GPT-2: rows of wpe) */
    float norm_eps;
    float rope_theta; /* Llama only */
    /* Llama only: RoPE scaling (rope_scaling_t) and its parameters:
     * factor (LINEAR, LLAMA3), the low and high frequency factors and the
     * original context length (LLAMA3); 0 where unused */
    rope_scaling_t rope_scaling;
    float rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_max_seq;
    int attn_bias; /* Llama only: q, k, v projections have biases (Qwen2; o has none) */
    int qk_norm;   /* Llama only: per-head RMSNorm of q and k over the head size, before RoPE (Qwen3) */
    int tie_embed; /* Llama only: the output head is tok_emb (tie_word_embeddings; GPT-2's always is) */
    moe_config_t moe;
} model_config_t;

typedef struct model_preset {
    const char *name;
    const char *about;
    model_config_t cfg;
} model_preset_t;

/* NULL-terminated by name == NULL. */
const model_preset_t *model_presets(void);
/* The preset called name, or NULL. */
const model_preset_t *model_preset_find(const char *name);
const char *model_arch_name(model_arch_t a);

/* HS: head_dim, or d_model / n_head. q and the attention output are
 * n_head * HS wide, which need not equal d_model. */
static inline int model_head_size(const model_config_t *c)
{
    return c->head_dim ? c->head_dim : c->d_model / c->n_head;
}

/* The name of a rope_scaling_t as Hugging Face's rope_type spells it
 * ("none" for ROPE_SCALING_NONE), and back (-1: unknown). */
const char *model_rope_scaling_name(rope_scaling_t s);
int model_rope_scaling_of(const char *name);

/* inv_freq[HS/2]: RoPE's inverse frequency of each pair of a head, theta
 * and the scaling applied, in float as Hugging Face computes them. Both
 * backends rotate pair i of position p by p * inv_freq[i] (ops rope_fwd). */
void model_rope_inv_freq(const model_config_t *c, float *inv_freq);

/* The token embedding's tensor name, and whether the output head is that
 * tensor (GPT-2 always, Llama with tie_embed) rather than lm_head.w. */
static inline const char *model_embed_name(const model_config_t *c) { return c->arch == ARCH_GPT2 ? "wte" : "tok_emb"; }
static inline int model_head_tied(const model_config_t *c) { return c->arch == ARCH_GPT2 || c->tie_embed; }

/* Whether the MoE layers have an expert bias: the sigmoid router's
 * (DeepSeek-V3's e_score_correction_bias), zero until --moe-bias-rate
 * moves it. */
static inline int model_moe_has_bias(const model_config_t *c)
{
    return c->moe.experts > 0 && c->moe.router == MOE_ROUTER_SIGMOID;
}

/* Layer l's feed-forward is a mixture of experts. */
static inline int model_layer_moe(const model_config_t *c, int l)
{
    const moe_config_t *e = &c->moe;
    return e->experts > 0 && l >= e->first_dense && (l - e->first_dense) % e->every == 0;
}

/* MoE layers among the model's n_layer. */
int model_moe_layers(const model_config_t *c);

/* Layer l's dense MLP width: d_ff in a dense layer, the shared expert's
 * width (0: none) in a MoE layer. */
static inline int model_layer_ffn(const model_config_t *c, int l)
{
    return model_layer_moe(c, l) ? c->moe.shared_ffn : c->d_ff;
}

const char *model_moe_router_name(moe_router_t r);
/* -1: unknown */
int model_moe_router_of(const char *name);

/* What a model has beyond its shape line, for banners: "" or e.g.
 * " head_dim=128 qk_norm" or " rope_scaling=llama3(factor 32)". */
const char *model_config_extras(const model_config_t *c, char *buf, size_t len);

/* Checks shapes are consistent; on failure writes one line to err. */
int model_config_check(const model_config_t *c, char *err, size_t errlen);

#endif
