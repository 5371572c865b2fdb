#include "src/model/model_config.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "base/ops_math.h"

/* Shapes follow the published models; the small ones are sized to train in
 * minutes on two cores: tiny and tiny-llama with the byte tokenizer,
 * tiny-gpt2 with GPT-2's BPE (its 50257-row embedding, tied to the head,
 * is most of its parameters and of its compute). */
/* clang-format off: one preset a block, its shape on two lines */
static const model_preset_t presets[] = {
    {"tiny",
     "GPT-2 style, byte vocabulary, 4 layers, d_model 128 (trains in minutes on 2 cores)",
     {.arch = ARCH_GPT2,
      .vocab_size = 256,
      .n_layer = 4,
      .n_head = 4,
      .n_kv_head = 4,
      .d_model = 128,
      .d_ff = 512,
      .max_seq = 256,
      .norm_eps = 1e-5f,
      .rope_theta = 0}},
    {"tiny-llama",
     "Llama style (RMSNorm, SwiGLU, RoPE, GQA 4:2), byte vocabulary, 4 layers, d_model 128",
     {.arch = ARCH_LLAMA,
      .vocab_size = 256,
      .n_layer = 4,
      .n_head = 4,
      .n_kv_head = 2,
      .d_model = 128,
      .d_ff = 352,
      .max_seq = 256,
      .norm_eps = 1e-5f,
      .rope_theta = 10000.0f}},
    {"tiny-gpt2",
     "GPT-2 style, GPT-2 BPE vocabulary 50257, 4 layers, d_model 128 (learns in minutes on 2 cores)",
     {.arch = ARCH_GPT2,
      .vocab_size = 50257,
      .n_layer = 4,
      .n_head = 4,
      .n_kv_head = 4,
      .d_model = 128,
      .d_ff = 512,
      .max_seq = 256,
      .norm_eps = 1e-5f,
      .rope_theta = 0}},
    {"gpt2-124m",
     "GPT-2 small: 12 layers, d_model 768, 12 heads, vocab 50257",
     {.arch = ARCH_GPT2,
      .vocab_size = 50257,
      .n_layer = 12,
      .n_head = 12,
      .n_kv_head = 12,
      .d_model = 768,
      .d_ff = 3072,
      .max_seq = 1024,
      .norm_eps = 1e-5f,
      .rope_theta = 0}},
    {"gpt2-350m",
     "GPT-2 medium: 24 layers, d_model 1024, 16 heads, vocab 50257",
     {.arch = ARCH_GPT2,
      .vocab_size = 50257,
      .n_layer = 24,
      .n_head = 16,
      .n_kv_head = 16,
      .d_model = 1024,
      .d_ff = 4096,
      .max_seq = 1024,
      .norm_eps = 1e-5f,
      .rope_theta = 0}},
    {"llama-7b",
     "Llama 2 7B: 32 layers, d_model 4096, 32 heads, FFN 11008, vocab 32000",
     {.arch = ARCH_LLAMA,
      .vocab_size = 32000,
      .n_layer = 32,
      .n_head = 32,
      .n_kv_head = 32,
      .d_model = 4096,
      .d_ff = 11008,
      .max_seq = 4096,
      .norm_eps = 1e-5f,
      .rope_theta = 10000.0f}},
    {"llama-70b",
     "Llama 2 70B: 80 layers, d_model 8192, 64 heads, 8 KV heads, FFN 28672, vocab 32000",
     {.arch = ARCH_LLAMA,
      .vocab_size = 32000,
      .n_layer = 80,
      .n_head = 64,
      .n_kv_head = 8,
      .d_model = 8192,
      .d_ff = 28672,
      .max_seq = 4096,
      .norm_eps = 1e-5f,
      .rope_theta = 10000.0f}},
    /* The small real models of issue 39, shapes as their Hugging Face
     * config.json files give them; all three tie the output head to the
     * embedding. */
    {"llama3.2-1b",
     "Llama 3.2 1B: 16 layers, d_model 2048, 32 heads, 8 KV heads, FFN 8192, vocab 128256, llama3 RoPE scaling",
     {.arch = ARCH_LLAMA,
      .vocab_size = 128256,
      .n_layer = 16,
      .n_head = 32,
      .n_kv_head = 8,
      .d_model = 2048,
      .d_ff = 8192,
      .max_seq = 131072,
      .norm_eps = 1e-5f,
      .rope_theta = 500000.0f,
      .rope_scaling = ROPE_SCALING_LLAMA3,
      .rope_factor = 32.0f,
      .rope_low_freq_factor = 1.0f,
      .rope_high_freq_factor = 4.0f,
      .rope_original_max_seq = 8192,
      .tie_embed = 1}},
    {"qwen2.5-0.5b",
     "Qwen2.5 0.5B: 24 layers, d_model 896, 14 heads, 2 KV heads, FFN 4864, vocab 151936, q/k/v biases",
     {.arch = ARCH_LLAMA,
      .vocab_size = 151936,
      .n_layer = 24,
      .n_head = 14,
      .n_kv_head = 2,
      .d_model = 896,
      .d_ff = 4864,
      .max_seq = 32768,
      .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f,
      .attn_bias = 1,
      .tie_embed = 1}},
    {"qwen3-0.6b",
     "Qwen3 0.6B: 28 layers, d_model 1024, 16 heads of 128, 8 KV heads, FFN 3072, vocab 151936, q/k norms",
     {.arch = ARCH_LLAMA,
      .vocab_size = 151936,
      .n_layer = 28,
      .n_head = 16,
      .n_kv_head = 8,
      .d_model = 1024,
      .d_ff = 3072,
      .head_dim = 128,
      .max_seq = 40960,
      .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f,
      .qk_norm = 1,
      .tie_embed = 1}},
    /* The larger ones of issue 39 (config.json of meta-llama/Llama-3.1-8B,
     * Llama-3.1-70B and Qwen/Qwen3-8B): untied heads */
    {"llama3.1-8b",
     "Llama 3.1 8B: 32 layers, d_model 4096, 32 heads, 8 KV heads, FFN 14336, vocab 128256, llama3 RoPE scaling",
     {.arch = ARCH_LLAMA,
      .vocab_size = 128256,
      .n_layer = 32,
      .n_head = 32,
      .n_kv_head = 8,
      .d_model = 4096,
      .d_ff = 14336,
      .max_seq = 131072,
      .norm_eps = 1e-5f,
      .rope_theta = 500000.0f,
      .rope_scaling = ROPE_SCALING_LLAMA3,
      .rope_factor = 8.0f,
      .rope_low_freq_factor = 1.0f,
      .rope_high_freq_factor = 4.0f,
      .rope_original_max_seq = 8192}},
    {"llama3.1-70b",
     "Llama 3.1 70B: 80 layers, d_model 8192, 64 heads, 8 KV heads, FFN 28672, vocab 128256, llama3 RoPE scaling",
     {.arch = ARCH_LLAMA,
      .vocab_size = 128256,
      .n_layer = 80,
      .n_head = 64,
      .n_kv_head = 8,
      .d_model = 8192,
      .d_ff = 28672,
      .max_seq = 131072,
      .norm_eps = 1e-5f,
      .rope_theta = 500000.0f,
      .rope_scaling = ROPE_SCALING_LLAMA3,
      .rope_factor = 8.0f,
      .rope_low_freq_factor = 1.0f,
      .rope_high_freq_factor = 4.0f,
      .rope_original_max_seq = 8192}},
    {"qwen3-8b",
     "Qwen3 8B: 36 layers, d_model 4096, 32 heads of 128, 8 KV heads, FFN 12288, vocab 151936, q/k norms",
     {.arch = ARCH_LLAMA,
      .vocab_size = 151936,
      .n_layer = 36,
      .n_head = 32,
      .n_kv_head = 8,
      .d_model = 4096,
      .d_ff = 12288,
      .head_dim = 128,
      .max_seq = 40960,
      .norm_eps = 1e-6f,
      .rope_theta = 1000000.0f,
      .qk_norm = 1}},
    /* Mixtures of experts (issue 33). tiny-moe is tiny with each MLP
     * replaced by 8 experts of half its width, 2 per token: the same
     * active MLP parameters per token (2 x 256 = 512), four times the
     * stored ones. */
    {"tiny-moe",
     "tiny with 8 experts of width 256 per layer, top-2 softmax router (active parameters as tiny's)",
     {.arch = ARCH_GPT2,
      .vocab_size = 256,
      .n_layer = 4,
      .n_head = 4,
      .n_kv_head = 4,
      .d_model = 128,
      .d_ff = 512,
      .max_seq = 256,
      .norm_eps = 1e-5f,
      .rope_theta = 0,
      .moe = {.experts = 8, .top_k = 2, .ffn = 256, .every = 1, .norm_topk = 1, .aux_coef = 0.01f,
              .z_coef = 0.001f}}},
    /* DeepSeek's shape in small: the first layer dense, then fine-grained
     * experts (16 of width 64, 4 per token) beside a shared expert, sigmoid
     * scores renormalised over the chosen */
    {"tiny-deepseek-moe",
     "Llama style, 4 layers (first dense), 16 experts of width 64, top-4 sigmoid router, shared expert of width 128",
     {.arch = ARCH_LLAMA,
      .vocab_size = 256,
      .n_layer = 4,
      .n_head = 4,
      .n_kv_head = 2,
      .d_model = 128,
      .d_ff = 352,
      .max_seq = 256,
      .norm_eps = 1e-5f,
      .rope_theta = 10000.0f,
      .moe = {.experts = 16, .top_k = 4, .ffn = 64, .every = 1, .first_dense = 1, .router = MOE_ROUTER_SIGMOID,
              .norm_topk = 1, .shared_ffn = 128, .aux_coef = 0.001f, .bias_rate = 0.001f}}},
    /* mistralai/Mixtral-8x7B-v0.1's config.json shape; the aux coefficient
     * is transformers' MixtralConfig default */
    {"mixtral-8x7b",
     "Mixtral 8x7B: 32 layers, d_model 4096, 32 heads, 8 KV heads, 8 experts of FFN 14336, top-2, vocab 32000",
     {.arch = ARCH_LLAMA,
      .vocab_size = 32000,
      .n_layer = 32,
      .n_head = 32,
      .n_kv_head = 8,
      .d_model = 4096,
      .d_ff = 14336,
      .max_seq = 32768,
      .norm_eps = 1e-5f,
      .rope_theta = 1000000.0f,
      .moe = {.experts = 8, .top_k = 2, .ffn = 14336, .every = 1, .norm_topk = 1, .aux_coef = 0.001f}}},
    {NULL, NULL, {0}},
};
/* clang-format on */

const model_preset_t *model_presets(void) { return presets; }

const model_preset_t *model_preset_find(const char *name)
{
    for (const model_preset_t *p = presets; p->name; p++)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

const char *model_arch_name(model_arch_t a) { return a == ARCH_LLAMA ? "llama" : "gpt2"; }

int model_moe_layers(const model_config_t *c)
{
    int n = 0;
    for (int l = 0; l < c->n_layer; l++)
        n += model_layer_moe(c, l);
    return n;
}

static const char *const moe_router_names[] = {[MOE_ROUTER_SOFTMAX] = "softmax", [MOE_ROUTER_SIGMOID] = "sigmoid"};

const char *model_moe_router_name(moe_router_t r)
{
    return r == MOE_ROUTER_SIGMOID ? moe_router_names[1] : moe_router_names[0];
}

int model_moe_router_of(const char *name)
{
    for (int r = MOE_ROUTER_SOFTMAX; r <= MOE_ROUTER_SIGMOID; r++)
        if (strcmp(name, moe_router_names[r]) == 0)
            return r;
    return -1;
}

static const char *const rope_scaling_names[] = {
    [ROPE_SCALING_NONE] = "none", [ROPE_SCALING_LINEAR] = "linear", [ROPE_SCALING_LLAMA3] = "llama3"};

const char *model_rope_scaling_name(rope_scaling_t s)
{
    return s >= ROPE_SCALING_NONE && s <= ROPE_SCALING_LLAMA3 ? rope_scaling_names[s] : "?";
}

int model_rope_scaling_of(const char *name)
{
    for (int s = ROPE_SCALING_NONE; s <= ROPE_SCALING_LLAMA3; s++)
        if (strcmp(name, rope_scaling_names[s]) == 0)
            return s;
    return -1;
}

/* Llama 3.1's scaling of one inverse frequency f, step by step as HF's
 * _compute_llama3_parameters does it in float32: wavelengths 2 pi / f
 * above old / low_freq_factor are divided by factor, those below old /
 * high_freq_factor kept, and the band between blends the two by how
 * many turns the original context holds. */
static float llama3_inv_freq(const model_config_t *c, float f)
{
    const double old = (double)c->rope_original_max_seq;
    const double low_wavelen = old / (double)c->rope_low_freq_factor;
    const double high_wavelen = old / (double)c->rope_high_freq_factor;
    const float wavelen = (float)(2.0 * M_PI) / f;
    if ((double)wavelen > low_wavelen)
        return f / c->rope_factor;
    if ((double)wavelen < high_wavelen)
        return f;
    const float smooth =
        ((float)old / wavelen - c->rope_low_freq_factor) / (c->rope_high_freq_factor - c->rope_low_freq_factor);
    return (1.0f - smooth) * f / c->rope_factor + smooth * f;
}

void model_rope_inv_freq(const model_config_t *c, float *inv_freq)
{
    const int HS = model_head_size(c);
    for (int i = 0; i < HS / 2; i++) {
        const float f = dt_rope_inv_freq(i, HS, c->rope_theta);
        inv_freq[i] = c->rope_scaling == ROPE_SCALING_LINEAR   ? f / c->rope_factor
                      : c->rope_scaling == ROPE_SCALING_LLAMA3 ? llama3_inv_freq(c, f)
                                                               : f;
    }
}

const char *model_config_extras(const model_config_t *c, char *buf, size_t len)
{
    char scaling[64] = "";
    if (c->rope_scaling != ROPE_SCALING_NONE)
        snprintf(scaling, sizeof scaling, " rope_scaling=%s(factor %g)", model_rope_scaling_name(c->rope_scaling),
                 (double)c->rope_factor);
    char hd[32] = "";
    if (c->head_dim)
        snprintf(hd, sizeof hd, " head_dim=%d", c->head_dim);
    char moe[160] = "";
    const moe_config_t *e = &c->moe;
    if (e->experts)
        snprintf(moe, sizeof moe, " moe=%d/%d layers, %d experts x %d, top-%d %s%s%s%s%s", model_moe_layers(c),
                 c->n_layer, e->experts, e->ffn, e->top_k, model_moe_router_name(e->router),
                 e->norm_topk ? " renormalised" : "", e->bias_rate > 0 ? " bias-balanced" : "",
                 e->shared_ffn ? ", shared expert" : "", e->capacity > 0 ? ", capacity-bound" : "");
    snprintf(buf, len, "%s%s%s%s%s%s", hd, c->attn_bias ? " qkv_bias" : "", c->qk_norm ? " qk_norm" : "", scaling,
             c->tie_embed ? " tied_head" : "", moe);
    return buf;
}

/* The scaling's parameters are usable: positive factors, llama3's high
 * frequency factor above its low one (the blend divides by their
 * difference). */
static int rope_scaling_check(const model_config_t *c, char *err, size_t errlen)
{
    if (c->rope_scaling == ROPE_SCALING_NONE)
        return 0;
    if (c->arch != ARCH_LLAMA || c->rope_scaling > ROPE_SCALING_LLAMA3 || !(c->rope_factor > 0)) {
        snprintf(err, errlen, "rope scaling %s needs the Llama architecture and a positive factor (%g)",
                 model_rope_scaling_name(c->rope_scaling), (double)c->rope_factor);
        return -1;
    }
    if (c->rope_scaling == ROPE_SCALING_LLAMA3 &&
        (!(c->rope_low_freq_factor > 0) || !(c->rope_high_freq_factor > c->rope_low_freq_factor) ||
         c->rope_original_max_seq <= 0)) {
        snprintf(err, errlen,
                 "llama3 rope scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and a positive "
                 "original_max_position_embeddings (%d)",
                 (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor, c->rope_original_max_seq);
        return -1;
    }
    return 0;
}

/* The MoE fields make sense together (all 0 in a dense model). */
static int moe_check(const model_config_t *c, char *err, size_t errlen)
{
    const moe_config_t *e = &c->moe;
    if (e->experts == 0) {
        if (e->top_k || e->ffn || e->shared_ffn || e->capacity > 0 || e->bias_rate > 0) {
            snprintf(err, errlen, "--moe-top-k, --moe-ffn, --moe-shared-ffn, --moe-capacity-factor and --moe-bias-rate "
                                  "need --moe-experts (this model is dense)");
            return -1;
        }
        return 0;
    }
    if (e->experts < 2 || e->experts > 4096) {
        snprintf(err, errlen, "--moe-experts %d: a mixture needs 2 to 4096 experts", e->experts);
        return -1;
    }
    if (e->top_k < 1 || e->top_k > e->experts) {
        snprintf(err, errlen, "--moe-top-k %d must be between 1 and --moe-experts %d", e->top_k, e->experts);
        return -1;
    }
    if (e->ffn <= 0 || e->shared_ffn < 0 || e->every < 1 || e->first_dense < 0 || e->first_dense >= c->n_layer) {
        snprintf(err, errlen,
                 "--moe-ffn %d must be positive, --moe-shared-ffn %d not negative, --moe-every %d at least 1 and "
                 "--moe-first-dense %d below the %d layers",
                 e->ffn, e->shared_ffn, e->every, e->first_dense, c->n_layer);
        return -1;
    }
    if (!(e->aux_coef >= 0) || !(e->z_coef >= 0) || !(e->capacity >= 0) || e->capacity > 1e4f ||
        !(e->bias_rate >= 0)) {
        snprintf(err, errlen,
                 "--moe-aux-coef %g, --moe-z-coef %g, --moe-capacity-factor %g and --moe-bias-rate %g must be 0 or "
                 "positive",
                 (double)e->aux_coef, (double)e->z_coef, (double)e->capacity, (double)e->bias_rate);
        return -1;
    }
    if (e->bias_rate > 0 && e->router != MOE_ROUTER_SIGMOID) {
        snprintf(err, errlen,
                 "--moe-bias-rate %g needs --moe-router sigmoid: the expert bias is DeepSeek-V3's, added to sigmoid "
                 "scores to select experts (use --moe-aux-coef to balance a softmax router)",
                 (double)e->bias_rate);
        return -1;
    }
    return 0;
}

int model_config_check(const model_config_t *c, char *err, size_t errlen)
{
    if (c->n_head <= 0 || c->d_model <= 0 || (!c->head_dim && c->d_model % c->n_head != 0)) {
        snprintf(err, errlen, "--d-model %d must be a positive multiple of --n-head %d", c->d_model, c->n_head);
        return -1;
    }
    if (c->head_dim < 0 || (c->head_dim && c->arch != ARCH_LLAMA) || (int64_t)c->head_dim * c->n_head > (1 << 30)) {
        snprintf(err, errlen,
                 "head_dim %d: a head size of its own is for the Llama architecture, and below 2^30 / n_head",
                 c->head_dim);
        return -1;
    }
    if (c->n_kv_head <= 0 || c->n_head % c->n_kv_head != 0) {
        snprintf(err, errlen, "--n-kv-head %d must divide --n-head %d", c->n_kv_head, c->n_head);
        return -1;
    }
    if (c->arch == ARCH_GPT2 && c->n_kv_head != c->n_head) {
        snprintf(err, errlen, "--n-kv-head %d: GPT-2 uses multi-head attention, so it must equal --n-head %d",
                 c->n_kv_head, c->n_head);
        return -1;
    }
    if (c->arch == ARCH_LLAMA && model_head_size(c) % 2 != 0) {
        snprintf(err, errlen, "head size %d (d_model/n_head) must be even for rotary embeddings", model_head_size(c));
        return -1;
    }
    if (c->n_layer <= 0 || c->d_ff <= 0 || c->vocab_size <= 1 || c->max_seq <= 0) {
        snprintf(err, errlen, "--n-layer, --d-ff, --max-seq-len must be positive and --vocab-size above 1");
        return -1;
    }
    if (c->arch == ARCH_GPT2 && (c->attn_bias || c->qk_norm || c->tie_embed)) {
        snprintf(err, errlen,
                 "attention biases, q/k norms and a tie flag are options of the Llama architecture (GPT-2's head is "
                 "always tied)");
        return -1;
    }
    if (c->attn_bias && c->qk_norm) {
        snprintf(err, errlen,
                 "q/k/v biases with q/k norms: no Hugging Face model has both (Qwen2 has the biases, Qwen3 the norms)");
        return -1;
    }
    if (moe_check(c, err, errlen) != 0)
        return -1;
    return rope_scaling_check(c, err, errlen);
}
