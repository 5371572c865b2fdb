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

/* What a model has beyond its shape line, for banners: "" or e.g.
 * " head_dim=128 qk_norm" or " rope_scaling=llama3(factor 32)". */
const char *model_config_extras(const model_config_t *c, char *buf, size_t len);

/* Checks shapes are consistent; on failure writes one line to err. */
int model_config_check(const model_config_t *c, char *err, size_t errlen);

#endif
