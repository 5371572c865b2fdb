#include "src/model/model_config.h"

#include <stdio.h>
#include <string.h>

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

int model_config_check(const model_config_t *c, char *err, size_t errlen)
{
    if (c->n_head <= 0 || c->d_model <= 0 || c->d_model % c->n_head != 0) {
        snprintf(err, errlen, "--d-model %d must be a positive multiple of --n-head %d", c->d_model, c->n_head);
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
    return 0;
}
