/* Text generation from a trained model: temperature and top-k sampling. */
#ifndef DTRAIN_SAMPLE_H
#define DTRAIN_SAMPLE_H

#include <stdint.h>

/* Logits [V] of row `row` of the forward of window[t] (host memory, on
 * every rank that calls it). Returns 0 or -1. */
typedef int (*sample_logits_fn)(void *ctx, const int32_t *window, int t, int row, float *logits);

/* Appends n_new tokens to prompt[0..n_prompt) in out (out[0..n_prompt) is the
 * prompt). The context is the last max_ctx tokens, padded with token 0 to a
 * multiple of quantum (sequence parallelism splits the window's rows).
 * temperature 0 = greedy; top_k 0 = the whole vocabulary. Deterministic
 * for a given seed, so every rank that runs it picks the same tokens.
 * Returns the number of tokens in out, or -1 on failure. */
int sample_generate(sample_logits_fn logits_of, void *ctx, int V, int max_ctx, int quantum, const int32_t *prompt,
                    int n_prompt, int n_new, double temperature, int top_k, uint64_t seed, int32_t *out);

/* Pick a token from logits[V] (modified in place). u is uniform in [0,1). */
int sample_pick(float *logits, int V, double temperature, int top_k, double u);

/* The token at position pos of a sequence (0-based, prompt included),
 * picked from that position's logits[V] (modified in place) with the
 * uniform number sample_generate draws there for seed: a sequence sampled
 * one token at a time elsewhere (dtrain-serve) picks the tokens
 * sample_generate would from the same logits. */
int sample_next(float *logits, int V, double temperature, int top_k, uint64_t seed, int pos);

#endif
