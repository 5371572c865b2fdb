/* The CPU backend's ring attention ops (src/backend/ops_cpu_ring.c), as the
 * CPU table (src/backend/ops_cpu.c) lists them; each is the ops_t member of
 * the same name without "cpu_" (base/ops.h, "Ring attention's building
 * blocks"). */
#ifndef DTRAIN_OPS_CPU_RING_H
#define DTRAIN_OPS_CPU_RING_H

#include "base/ops.h"

void cpu_attention_block_fwd(void *ctx, float *out, float *lse, const float *qkv, const float *kv,
                             const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, const att_block_t *blk);
void cpu_attention_merge(void *ctx, float *out, float *lse, const float *pout, const float *plse,
                         const att_block_t *blk);
void cpu_attention_block_bwd(void *ctx, float *dqkv, float *dkv, const float *dout, const float *qkv, const float *kv,
                             const float *out, const float *lse, const int32_t *qpos, const int32_t *kpos,
                             const int32_t *qdoc, const att_block_t *blk);
void cpu_attention_kv_pack(void *ctx, float *kv, const float *qkv, int N, int NH, int NKV, int HS);
/* One query row of an attention backward tile (ops_cpu.c's and the block
 * backward's): p holds its scaled scores and d its dP = dO V^T over the
 * tile's n columns; on return p = exp(s - lt) and d = P o (dP - D) on the
 * row's keys [lo, hi], 0 elsewhere (all 0 when lo > hi); D = rowsum(dO o
 * O) of its HS values. */
void cpu_att_grad_row(float *p, float *d, const float *o, const float *dout, float lt, int lo, int hi, int n, int HS);
void cpu_attention_kv_unpack(void *ctx, float *dqkv, const float *dkv, int N, int NH, int NKV, int HS, int accum);

#endif
