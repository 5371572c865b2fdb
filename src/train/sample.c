#include "src/train/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "src/model/rng.h"

#define SAMPLE_STREAM 0x73616d706c65ull /* "sample" */

/* Value of the k-th largest logit (k >= 1), by a partial quickselect on a
 * copy; V is at most a few hundred thousand, called once per token. */
static float kth_largest(const float *x, int V, int k, float *tmp)
{
    memcpy(tmp, x, (size_t)V * sizeof *tmp);
    int lo = 0, hi = V - 1, want = k - 1;
    while (lo < hi) {
        float pivot = tmp[(lo + hi) / 2];
        int i = lo, j = hi;
        while (i <= j) {
            while (tmp[i] > pivot)
                i++;
            while (tmp[j] < pivot)
                j--;
            if (i <= j) {
                float t = tmp[i];
                tmp[i] = tmp[j];
                tmp[j] = t;
                i++;
                j--;
            }
        }
        if (want <= j)
            hi = j;
        else if (want >= i)
            lo = i;
        else
            break;
    }
    return tmp[want];
}

int sample_pick(float *logits, int V, double temperature, int top_k, double u)
{
    int best = 0;
    for (int i = 1; i < V; i++)
        if (logits[i] > logits[best])
            best = i;
    if (temperature <= 0.0)
        return best;
    float cut = -INFINITY;
    if (top_k > 0 && top_k < V) {
        float *tmp = malloc((size_t)V * sizeof *tmp);
        if (!tmp)
            return best;
        cut = kth_largest(logits, V, top_k, tmp);
        free(tmp);
    }
    double maxv = logits[best], sum = 0.0;
    for (int i = 0; i < V; i++) {
        double p = logits[i] >= cut ? exp((logits[i] - maxv) / temperature) : 0.0;
        logits[i] = (float)p;
        sum += p;
    }
    double r = u * sum, acc = 0.0;
    for (int i = 0; i < V; i++) {
        acc += logits[i];
        if (r < acc)
            return i;
    }
    return best;
}

int sample_next(float *logits, int V, double temperature, int top_k, uint64_t seed, int pos)
{
    return sample_pick(logits, V, temperature, top_k, rng_uniform(seed, SAMPLE_STREAM, (uint64_t)pos));
}

int sample_generate(sample_logits_fn logits_of, void *ctx, int V, int max_ctx, int quantum, const int32_t *prompt,
                    int n_prompt, int n_new, double temperature, int top_k, uint64_t seed, int32_t *out)
{
    float *logits = malloc((size_t)V * sizeof *logits);
    int32_t *window = malloc((size_t)max_ctx * sizeof *window);
    if (!logits || !window) {
        free(logits);
        free(window);
        return -1;
    }
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    int n = n_prompt;
    for (int i = 0; i < n_new; i++) {
        int ctx_len = n < max_ctx ? n : max_ctx;
        /* causal attention keeps the padding from changing the logits of
         * the real tokens */
        int padded = (ctx_len + quantum - 1) / quantum * quantum;
        memcpy(window, out + (n - ctx_len), (size_t)ctx_len * sizeof *window);
        for (int k = ctx_len; k < padded; k++)
            window[k] = 0;
        if (logits_of(ctx, window, padded, ctx_len - 1, logits) != 0) {
            n = -1;
            break;
        }
        out[n] = sample_next(logits, V, temperature, top_k, seed, n);
        n++;
    }
    free(logits);
    free(window);
    return n;
}
