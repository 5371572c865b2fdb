/* The CPU backend's mixture-of-experts ops (src/backend/ops_cpu_moe.c), as
 * the CPU table (src/backend/ops_cpu.c) lists them; each is the ops_t
 * member of the same name without "cpu_" (base/ops.h). */
#ifndef DTRAIN_OPS_CPU_MOE_H
#define DTRAIN_OPS_CPU_MOE_H

#include <stdint.h>

void cpu_moe_route_fwd(void *ctx, float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                       const float *bias, int N,
                       int T, int E, int K, int sigmoid, int norm_topk, int capacity);
void cpu_moe_plan(void *ctx, int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K);
void cpu_moe_stats(void *ctx, float *stats, const int32_t *idx, const float *scores, const float *lse, int N, int E,
                   int K, int sigmoid);
void cpu_moe_gather(void *ctx, float *xe, const float *x, const int32_t *perm, int M, int K, int C);
void cpu_moe_combine_fwd(void *ctx, float *out, const float *ye, const float *gate, const int32_t *where, int N, int K,
                         int C);
void cpu_moe_combine_bwd(void *ctx, float *dye, float *dgate, const float *dout, const float *ye, const float *gate,
                         const int32_t *where, int N, int K, int C);
void cpu_moe_scatter_bwd(void *ctx, float *dx, const float *dxe, const int32_t *where, int N, int K, int C, int accum);
void cpu_moe_route_bwd(void *ctx, float *dlogits, const float *dgate, const float *logits, const float *scores,
                       const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                       int sigmoid, int norm_topk);

#endif
