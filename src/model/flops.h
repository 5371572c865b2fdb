/* Model FLOPs (for MFU) and the machine's measured peak. */
#ifndef DTRAIN_FLOPS_H
#define DTRAIN_FLOPS_H

#include <stddef.h>

#include "src/model/model_config.h"

/* The matmul parameters layer l applies to each token: attention, and
 * the dense MLP, or in a MoE layer the router, the top-k routed experts
 * and the shared expert (the active ones: a token meets k of the E). */
double flops_layer_params(const model_config_t *c, int l);

/* Training FLOPs per token: 6 x (active parameters in matmuls,
 * flops_layer_params over the layers, output head included) + 12 x L x
 * (NH*HS) x T for attention scores and values, forward and backward (the
 * llm.c / PaLM convention; padding is not counted).
 * Under --doc-mask T is the tokens' mean document length weighted by
 * length, sum of L^2 / sum of L over the documents (src/model/docmask.h): the
 * same convention applied to each document, so one document per row
 * gives T itself. */
double flops_per_token(const model_config_t *c, double T);

/* The sgemm peak of this process on its current threads (the OpenMP
 * threads a rank trains with): after an untimed warm-up of a quarter of
 * budget_s, calls of 512^3, 1024^3 and 1536^3 (in . w^T, as the forward
 * matmuls) share the rest; the fastest single call is the peak. A size one
 * call of which would overrun the budget at the best rate so far is
 * skipped; the probe ends within budget_s plus one call. */
#define FLOPS_PROBE_BUDGET_S 0.4
typedef struct {
    double gflops;         /* the peak: the best call */
    int best_n;            /* its size */
    int sizes[4], n_sizes; /* the sizes timed */
    int calls;             /* timed calls */
    int threads;
    double seconds; /* the whole probe, warm-up included */
} flops_probe_t;
int flops_probe(flops_probe_t *p, double budget_s);

/* flops_probe's peak with the default budget (0 on failure). */
double flops_measure_peak_gflops(void);

/* "sgemm probe: best of 512^3, 1024^3, 1536^3 (N calls, best at 1024^3) on
 * 2 threads after a warm-up, 0.40 s"; snprintf's return. */
int flops_probe_describe(const flops_probe_t *p, char *buf, size_t len);

#endif
