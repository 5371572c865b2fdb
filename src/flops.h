/* Model FLOPs (for MFU) and the machine's measured peak. */
#ifndef DTRAIN_FLOPS_H
#define DTRAIN_FLOPS_H

#include "model_config.h"

/* Training FLOPs per token: 6 x (parameters in matmuls, output head
 * included) + 12 x L x (NH*HS) x T for attention scores and values, forward
 * and backward (the llm.c / PaLM convention; padding is not counted). */
double flops_per_token(const model_config_t *c, int T);

/* sgemm GFLOP/s of this process on its current threads: the best of a few
 * 1024^3 multiplies (about 50 ms). */
double flops_measure_peak_gflops(void);

#endif
