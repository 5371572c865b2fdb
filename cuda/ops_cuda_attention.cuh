/* The CUDA backend's attention ops (base/ops.h attention_fwd, attention_bwd):
 * which kernel set runs, the bf16 copies the tensor-core kernels read, and
 * the launches.
 *
 * Two paths, chosen per call by att_path from the context's att_bf16 (set
 * once by ops_cuda_create: --dtype bf16, the default on CUDA) and the head
 * size:
 *  - ATT_PATH_MMA, under bf16 at head sizes 64 and 128 (att_mma_supported):
 *    FlashAttention-2 on the tensor cores (kernels/attention_mma.cuh,
 *    attention_mma_bwd.cuh): bf16 q, k, v and dout, fp32 accumulation, fp32
 *    lse, out and dqkv. The ops contract stays fp32 in and out (the CPU and
 *    deferred tables need no bf16 variant, and CPU results are untouched),
 *    so the bf16 copies are made here, in a buffer of the context:
 *      forward:  k_att_pack_qkv (qkv to bf16), then k_att_fwd_mma;
 *      backward: k_att_bwd_dot (D, FlashAttention-2's first backward pass,
 *                which writes the bf16 copies of qkv and dout on the way),
 *                then k_att_bwd_dkv_mma, k_att_bwd_dq_mma.
 *    k_att_pack_qkv is a separate pass, once a layer and step: it reads the
 *    fp32 qkv and writes half of that again (6 bytes per element; GPT-2
 *    124M at 16 x 1024 tokens: 226 MB a call, about 0.05 ms at H200
 *    bandwidth, some 0.6 ms per step over 12 layers). Removing it needs the
 *    producer of qkv (the QKV GEMM's epilogue, RoPE) to write the bf16 copy
 *    and the ops contract to carry it: issue 32's "bf16 step without extra
 *    passes", not done here. The backward's copies cost no pass of their
 *    own (its D pass reads qkv's rows beside out and dout).
 *  - ATT_PATH_FP32 otherwise (--dtype fp32, or another head size): the fp32
 *    CUDA-core kernels of kernels/attention.cuh, any head size, fp32 inputs
 *    read in place.
 * The banner says which runs and why (att_path_describe, through
 * ops_cuda_attention_path). Both paths write every element of out, lse and
 * dqkv (=, never +=) with sums in fixed orders and no atomics: bit-identical
 * run to run.
 *
 * Host code, included by cuda/ops_cuda.cu and by
 * test/emu/test_att_path_emu.cpp, which runs it on the CPU against the CPU
 * ops under emu_cuda.h's thread-block emulation. Launches are written
 * CU_LAUNCH(kernel, grid, block, smem, stream)(args) (ops_cuda_gemm.cuh
 * says why). The includer provides the kernel headers (attention.cuh,
 * attention_mma.cuh, attention_mma_bwd.cuh), cu_t with stream, att_bf16,
 * att and att_cap (ops_cuda_state.cuh), ck, finish, cuda_fatal and the
 * runtime's cudaMallocAsync and cudaFreeAsync. */
#ifndef DTRAIN_CUDA_OPS_CUDA_ATTENTION_CUH
#define DTRAIN_CUDA_OPS_CUDA_ATTENTION_CUH

#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, ...) kernel<<<__VA_ARGS__>>>
#endif

typedef enum { ATT_PATH_FP32 = 0, ATT_PATH_MMA } att_path_t;

static att_path_t att_path(int bf16, int HS) { return bf16 && att_mma_supported(HS) ? ATT_PATH_MMA : ATT_PATH_FP32; }

/* One line for the banner: the path attention takes at head size HS, and why. */
static void att_path_describe(int bf16, int HS, char *buf, size_t len)
{
    if (att_path(bf16, HS) == ATT_PATH_MMA)
        snprintf(buf, len,
                 "tensor cores (FlashAttention-2 with mma.sync, head size %d: bf16 q, k, v and dout, fp32 "
                 "accumulation, lse, out and dqkv; qkv copied to bf16 by a separate pass in the forward)",
                 HS);
    else if (!bf16)
        snprintf(buf, len, "fp32 CUDA cores (--dtype fp32; the tensor-core kernels take bf16)");
    else
        snprintf(buf, len, "fp32 CUDA cores (head size %d: the tensor-core kernels have head sizes 64 and 128)", HS);
}

/* 0 for an empty call (nothing to write), 1 to run; ends the job where the
 * grid cannot hold the shape (B or NH over 65535: grid y and z), rather
 * than leave out, lse or dqkv unwritten. */
static int att_dims_ok(const char *op, int B, int T, int NH, int NKV, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || HS <= 0)
        return 0;
    if (B > 65535 || NH > 65535)
        cuda_fatal(op, "batch rows or heads over the grid's 65535 limit: use a smaller --micro-batch");
    return 1;
}

/* ---- the fp32 path (kernels/attention.cuh) ---- */

static void att_fwd_fp32(cu_t *g, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos, int B,
                         int T, int NH, int NKV, int HS)
{
    const float scale = 1.0f / sqrtf((float)HS);
    const int nc = att_nc(HS);
    dim3 grid(att_grid_x("attention_fwd", (T + ATT_BR - 1) / ATT_BR, nc, HS), (unsigned)NH, (unsigned)B);
    if (nc == 1)
        CU_LAUNCH(k_att_fwd<1>, grid, ATT_THREADS, 0, g->stream)(out, out16, lse, qkv, pos, T, NH, NKV, HS, scale);
    else if (nc == 2)
        CU_LAUNCH(k_att_fwd<2>, grid, ATT_THREADS, 0, g->stream)(out, out16, lse, qkv, pos, T, NH, NKV, HS, scale);
    else
        CU_LAUNCH(k_att_fwd<ATT_GROUP>, grid, ATT_THREADS, 0, g->stream)
        (out, out16, lse, qkv, pos, T, NH, NKV, HS, scale);
}

template <int NC>
static void att_bwd_fp32_nc(cu_t *g, dim3 gq, dim3 gk, float *dqkv, uint16_t *dqkv16, const float *dout,
                            const float *qkv, const float *out, const float *lse, const int32_t *pos, int T, int NH,
                            int NKV, int HS, float scale)
{
    /* two kernels writing disjoint columns of dqkv (q, then k and v) */
    CU_LAUNCH(k_att_bwd_dq<NC>, gq, ATT_THREADS, 0, g->stream)
    (dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale);
    CU_LAUNCH(k_att_bwd_dkv<NC>, gk, ATT_THREADS, 0, g->stream)
    (dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale);
}

static void att_bwd_fp32(cu_t *g, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv, const float *out,
                         const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int HS)
{
    const float scale = 1.0f / sqrtf((float)HS);
    const int nc = att_nc(HS);
    dim3 gq(att_grid_x("attention_bwd", (T + ATT_BR - 1) / ATT_BR, nc, HS), (unsigned)NH, (unsigned)B);
    dim3 gk(att_grid_x("attention_bwd", (T + ATT_BC - 1) / ATT_BC, nc, HS), (unsigned)NKV, (unsigned)B);
    if (nc == 1)
        att_bwd_fp32_nc<1>(g, gq, gk, dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale);
    else if (nc == 2)
        att_bwd_fp32_nc<2>(g, gq, gk, dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale);
    else
        att_bwd_fp32_nc<ATT_GROUP>(g, gq, gk, dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale);
}

/* ---- the tensor-core path (kernels/attention_mma*.cuh) ---- */

/* The bf16 copies and D, in the context's buffer g->att (grown
 * stream-ordered, as col_part_room does; kept for the next call):
 *   qkv16 [B T][R] bf16, then (backward) dout16 [B T][NH HS] bf16 and
 *   D [B][NH][T] fp32, each at a 256-byte boundary. */
typedef struct att_bufs {
    uint16_t *qkv16, *dout16;
    float *D;
} att_bufs_t;

static size_t att_align(size_t bytes) { return (bytes + 255) & ~(size_t)255; }

static att_bufs_t att_room(cu_t *g, int bwd, int B, int T, int NH, int NKV, int HS, const char *what)
{
    const size_t N = (size_t)B * T, at_dout = att_align(N * (size_t)(NH + 2 * NKV) * HS * sizeof(uint16_t)),
                 at_D = at_dout + att_align(N * (size_t)NH * HS * sizeof(uint16_t)),
                 bytes = bwd ? at_D + (size_t)B * NH * T * sizeof(float) : at_dout;
    if (bytes > g->att_cap) {
        room_moved(g, what);
        if (g->att)
            ck(cudaFreeAsync(g->att, g->stream), what);
        g->att = NULL;
        g->att_cap = 0;
        ck(cudaMallocAsync(&g->att, bytes, g->stream), what);
        g->att_cap = bytes;
    }
    char *p = (char *)g->att;
    att_bufs_t b = {(uint16_t *)p, bwd ? (uint16_t *)(p + at_dout) : NULL, bwd ? (float *)(p + at_D) : NULL};
    return b;
}

static void att_pack_qkv(cu_t *g, uint16_t *qkv16, const float *qkv, int B, int T, int NH, int NKV, int HS)
{
    const size_t n = (size_t)B * T * (NH + 2 * NKV) * HS;
    CU_LAUNCH(k_att_pack_qkv, att_mma_pack_blocks(n), ATTM_THREADS, 0, g->stream)(qkv16, qkv, n);
}

static void att_fwd_mma(cu_t *g, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos, int B,
                        int T, int NH, int NKV, int HS)
{
    const att_bufs_t m = att_room(g, 0, B, T, NH, NKV, HS, "attention_fwd");
    att_pack_qkv(g, m.qkv16, qkv, B, T, NH, NKV, HS);
    const float scale = 1.0f / sqrtf((float)HS);
    const dim3 grid(att_mma_tiles(T), (unsigned)NH, (unsigned)B);
    if (HS == 64)
        CU_LAUNCH(k_att_fwd_mma<64>, grid, ATTM_THREADS, 0, g->stream)
        (out, out16, lse, m.qkv16, pos, T, NH, NKV, scale);
    else
        CU_LAUNCH(k_att_fwd_mma<128>, grid, ATTM_THREADS, 0, g->stream)
        (out, out16, lse, m.qkv16, pos, T, NH, NKV, scale);
}

template <int HS>
static void att_bwd_mma_hs(cu_t *g, const att_bufs_t &m, float *dqkv, uint16_t *dqkv16, const float *dout,
                           const float *qkv, const float *out, const float *lse, const int32_t *pos, int B, int T,
                           int NH, int NKV)
{
    const float scale = 1.0f / sqrtf((float)HS);
    CU_LAUNCH(k_att_bwd_dot<HS>, att_mma_dot_blocks((size_t)B * T * (NH + 2 * NKV)), ATTM_THREADS, 0, g->stream)
    (m.D, m.dout16, m.qkv16, out, dout, qkv, B, T, NH, NKV);
    /* after D; they write disjoint columns of dqkv (k and v, then q) */
    CU_LAUNCH(k_att_bwd_dkv_mma<HS>, dim3(att_mma_tiles(T), (unsigned)NKV, (unsigned)B), ATTM_THREADS, 0, g->stream)
    (dqkv, dqkv16, m.qkv16, m.dout16, lse, m.D, pos, T, NH, NKV, scale);
    CU_LAUNCH(k_att_bwd_dq_mma<HS>, dim3(att_mma_tiles(T), (unsigned)NH, (unsigned)B), ATTM_THREADS, 0, g->stream)
    (dqkv, dqkv16, m.qkv16, m.dout16, lse, m.D, pos, T, NH, NKV, scale);
}

static void att_bwd_mma(cu_t *g, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv, const float *out,
                        const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int HS)
{
    const att_bufs_t m = att_room(g, 1, B, T, NH, NKV, HS, "attention_bwd");
    if (HS == 64)
        att_bwd_mma_hs<64>(g, m, dqkv, dqkv16, dout, qkv, out, lse, pos, B, T, NH, NKV);
    else
        att_bwd_mma_hs<128>(g, m, dqkv, dqkv16, dout, qkv, out, lse, pos, B, T, NH, NKV);
}

/* ---- the ops ---- */

static void attention_fwd(void *ctx, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos,
                          int B, int T, int NH, int NKV, int HS)
{
    cu_t *g = (cu_t *)ctx;
    if (!att_dims_ok("attention_fwd", B, T, NH, NKV, HS))
        return;
    if (att_path(g->att_bf16, HS) == ATT_PATH_MMA)
        att_fwd_mma(g, out, out16, lse, qkv, pos, B, T, NH, NKV, HS);
    else
        att_fwd_fp32(g, out, out16, lse, qkv, pos, B, T, NH, NKV, HS);
    finish(g, "attention_fwd");
}

static void attention_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                          const float *out, const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int HS)
{
    cu_t *g = (cu_t *)ctx;
    if (!att_dims_ok("attention_bwd", B, T, NH, NKV, HS))
        return;
    if (att_path(g->att_bf16, HS) == ATT_PATH_MMA)
        att_bwd_mma(g, dqkv, dqkv16, dout, qkv, out, lse, pos, B, T, NH, NKV, HS);
    else
        att_bwd_fp32(g, dqkv, dqkv16, dout, qkv, out, lse, pos, B, T, NH, NKV, HS);
    finish(g, "attention_bwd");
}

#endif
