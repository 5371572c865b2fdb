/* Text generation from a trained model: temperature and top-k sampling. */
#ifndef DTRAIN_SAMPLE_H
#define DTRAIN_SAMPLE_H

#include <stdint.h>

#include "model.h"

/* Appends n_new tokens to prompt[0..n_prompt) in out (out[0..n_prompt) is the
 * prompt). The context is the last m->T tokens. temperature 0 = greedy;
 * top_k 0 = the whole vocabulary. Deterministic for a given seed. Returns
 * the number of tokens in out, or -1 on allocation failure. */
int sample_generate(model_t *m, const int32_t *prompt, int n_prompt, int n_new, double temperature,
                    int top_k, uint64_t seed, int32_t *out);

/* Pick a token from logits[V] (modified in place). u is uniform in [0,1). */
int sample_pick(float *logits, int V, double temperature, int top_k, double u);

#endif
