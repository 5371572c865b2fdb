/* The model of a Hugging Face config.json (dtrain --init-from): the
 * GPT2LMHeadModel and Llama-shaped (LlamaForCausalLM, MistralForCausalLM,
 * Qwen2ForCausalLM, Qwen3ForCausalLM, and the mixtures of experts
 * MixtralForCausalLM and Qwen2MoeForCausalLM) fields dtrain maps onto
 * model_config_t (llama3 and linear rope_scaling, Qwen2's q/k/v biases,
 * Qwen3's q/k norms and head_dim), and everything in the file that
 * dtrain's models cannot represent (other activations and rope scalings, o/MLP biases,
 * untied or tied heads against the architecture, sliding windows...).
 *
 * The parser takes bytes and neither prints nor exits, so fuzz/
 * fuzz_hf_config.c runs it under libFuzzer with no MPI and no file. */
#ifndef DTRAIN_HF_CONFIG_H
#define DTRAIN_HF_CONFIG_H

#include <stddef.h>

#include "src/model/model_config.h"

/* The model of the config.json text json[0..len) (need not end in a NUL),
 * named path in messages. Returns 0 with *c filled (and passing
 * model_config_check), or -1 with one line in err naming path and the
 * field. */
int hf_config_parse(const char *json, size_t len, const char *path, model_config_t *c, char *err, size_t errlen);

/* The same for the file DIR/config.json. */
int hf_config_read(const char *dir, model_config_t *c, char *err, size_t errlen);

#endif
