/* The CUDA backend's ring attention ops (base/ops.h "Ring attention's building
 * blocks"; context parallelism, issue 34): the launches of kernels/ring.cuh.
 *
 * attention_block_fwd and attention_block_bwd run the fp32 CUDA-core kernels
 * whatever --dtype is (there is no tensor-core ring kernel yet); both take the
 * same column groups as the fp32 attention (att_nc, att_grid_x). The backward
 * launches dQ (into dqkv's q columns) and dK/dV (into dkv): disjoint outputs,
 * both accumulated. Every op returns after finish() (launch checked; the
 * stream ordering is the trainer's).
 *
 * Host code, included by cuda/ops_cuda.cu and by test/emu/test_ring_emu.cpp,
 * which runs it on the CPU against the CPU ops under emu_cuda.h. Launches are
 * written CU_LAUNCH(kernel, grid, block, smem, stream)(args) (ops_cuda_gemm.cuh
 * says why). The includer provides kernels/ring.cuh, cu_t with stream, finish
 * and cuda_fatal. */
#ifndef DTRAIN_CUDA_OPS_CUDA_RING_CUH
#define DTRAIN_CUDA_OPS_CUDA_RING_CUH

#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, ...) kernel<<<__VA_ARGS__>>>
#endif

/* 0 for an empty block (nothing to compute), 1 to run; ends the job where the
 * grid cannot hold the shape, or the shape breaks the contract, rather than
 * leave outputs unwritten. */
static int ring_dims_ok(const char *op, const att_block_t *k, int need_keys)
{
    if (k->B <= 0 || k->NH <= 0 || k->NKV <= 0 || k->HS <= 0 || k->nq <= 0 || (need_keys && k->nk <= 0))
        return 0;
    if (k->NH % k->NKV || k->q0 < 0 || k->q0 + k->nq > k->Tq || k->k0 < 0 || k->k0 + k->nk > k->Tk)
        cuda_fatal(op, "block rows outside the block, or query heads not a multiple of the KV heads");
    if (k->B > 65535 || k->NH > 65535)
        cuda_fatal(op, "batch rows or heads over the grid's 65535 limit: use a smaller --micro-batch");
    return 1;
}

static void attention_block_fwd(void *ctx, float *out, float *lse, const float *qkv, const float *kv,
                                const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, const att_block_t *blk)
{
    cu_t *g = (cu_t *)ctx;
    if (!ring_dims_ok("attention_block_fwd", blk, 0))
        return;
    const att_block_t k = *blk;
    const float scale = 1.0f / sqrtf((float)k.HS);
    const int nc = att_nc(k.HS);
    const dim3 grid(att_grid_x("attention_block_fwd", (k.nq + ATT_BR - 1) / ATT_BR, nc, k.HS), (unsigned)k.NH,
                    (unsigned)k.B);
    if (nc == 1)
        CU_LAUNCH(k_ring_fwd<1>, grid, ATT_THREADS, 0, g->stream)(out, lse, qkv, kv, qpos, kpos, qdoc, k, scale);
    else if (nc == 2)
        CU_LAUNCH(k_ring_fwd<2>, grid, ATT_THREADS, 0, g->stream)(out, lse, qkv, kv, qpos, kpos, qdoc, k, scale);
    else
        CU_LAUNCH(k_ring_fwd<ATT_GROUP>, grid, ATT_THREADS, 0, g->stream)(out, lse, qkv, kv, qpos, kpos, qdoc, k,
                                                                         scale);
    finish(g, "attention_block_fwd");
}

static void attention_merge(void *ctx, float *out, float *lse, const float *pout, const float *plse,
                            const att_block_t *blk)
{
    cu_t *g = (cu_t *)ctx;
    if (blk->B <= 0 || blk->NH <= 0 || blk->HS <= 0 || blk->nq <= 0)
        return;
    const size_t rows = (size_t)blk->B * blk->NH * blk->nq;
    CU_LAUNCH(k_ring_merge, grid_for(rows, THREADS), THREADS, 0, g->stream)(out, lse, pout, plse, blk->NH, blk->HS,
                                                                            blk->Tq, blk->q0, blk->nq, rows);
    finish(g, "attention_merge");
}

template <int NC>
static void ring_bwd_nc(cu_t *g, dim3 gq, dim3 gk, float *dqkv, float *dkv, const float *dout, const float *qkv,
                        const float *kv, const float *out, const float *lse, const int32_t *qpos, const int32_t *kpos,
                        const int32_t *qdoc, const att_block_t &k, float scale)
{
    CU_LAUNCH(k_ring_bwd_dq<NC>, gq, ATT_THREADS, 0, g->stream)(dqkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, k,
                                                                scale);
    CU_LAUNCH(k_ring_bwd_dkv<NC>, gk, ATT_THREADS, 0, g->stream)(dkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, k,
                                                                 scale);
}

static void attention_block_bwd(void *ctx, float *dqkv, float *dkv, const float *dout, const float *qkv,
                                const float *kv, const float *out, const float *lse, const int32_t *qpos,
                                const int32_t *kpos, const int32_t *qdoc, const att_block_t *blk)
{
    cu_t *g = (cu_t *)ctx;
    if (!ring_dims_ok("attention_block_bwd", blk, 1))
        return;
    const att_block_t k = *blk;
    const float scale = 1.0f / sqrtf((float)k.HS);
    const int nc = att_nc(k.HS);
    const dim3 gq(att_grid_x("attention_block_bwd", (k.nq + ATT_BR - 1) / ATT_BR, nc, k.HS), (unsigned)k.NH,
                  (unsigned)k.B);
    const dim3 gk(att_grid_x("attention_block_bwd", (k.nk + ATT_BC - 1) / ATT_BC, nc, k.HS), (unsigned)k.NKV,
                  (unsigned)k.B);
    if (nc == 1)
        ring_bwd_nc<1>(g, gq, gk, dqkv, dkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, k, scale);
    else if (nc == 2)
        ring_bwd_nc<2>(g, gq, gk, dqkv, dkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, k, scale);
    else
        ring_bwd_nc<ATT_GROUP>(g, gq, gk, dqkv, dkv, dout, qkv, kv, out, lse, qpos, kpos, qdoc, k, scale);
    finish(g, "attention_block_bwd");
}

static void attention_kv_pack(void *ctx, float *kv, const float *qkv, int N, int NH, int NKV, int HS)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || NKV <= 0 || HS <= 0)
        return;
    const int KR = 2 * NKV * HS, R = (NH + 2 * NKV) * HS;
    const size_t n = (size_t)N * KR;
    CU_LAUNCH(k_ring_kv_pack, grid_for(n, THREADS), THREADS, 0, g->stream)(kv, qkv, n, NH * HS, KR, R);
    finish(g, "attention_kv_pack");
}

static void attention_kv_unpack(void *ctx, float *dqkv, const float *dkv, int N, int NH, int NKV, int HS, int accum)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || NKV <= 0 || HS <= 0)
        return;
    const int KR = 2 * NKV * HS, R = (NH + 2 * NKV) * HS;
    const size_t n = (size_t)N * KR;
    CU_LAUNCH(k_ring_kv_unpack, grid_for(n, THREADS), THREADS, 0, g->stream)(dqkv, dkv, n, NH * HS, KR, R, accum);
    finish(g, "attention_kv_unpack");
}

#endif
