/* What the tensor-core attention kernels (issue 32) share: the forward
 * (attention_mma.cuh) and the backward (attention_mma_bwd.cuh) use one tile
 * geometry, one shared-memory layout (swizzled [row][HS] bf16 tiles filled
 * by cp.async, mma.cuh's smem_swizzle) and one set of warp-level GEMM
 * pieces over it, so that a layout fix lands in both.
 *
 * The GEMM pieces work on one warp's 16-row slab in m16n8k16 fragments
 * (mma.cuh's header gives the layouts): a C block of 16 rows x NC columns is
 * float c[NC / 8][4], n8 tile nt in c[nt]. Two shapes occur:
 *   C = A B^T: B is a tile stored [n][k] (row = output column, HS wide), as
 *     K is for Q K^T: plain ldmatrix x4 gives two n8 B fragments at once.
 *   C += P X: P is a C block of the first kind (16 x KR, KR = X's rows),
 *     rounded to bf16 and repacked in place as A fragments (the C fragments
 *     of n8 tiles 2 kk and 2 kk + 1 are the A fragment of k16 step kk), X a
 *     tile stored [k][n] (row = reduction index), as V is for P V:
 *     ldmatrix x4 .trans gives two n8 B fragments. */
#ifndef DTRAIN_CUDA_KERNELS_ATTENTION_MMA_COMMON_CUH
#define DTRAIN_CUDA_KERNELS_ATTENTION_MMA_COMMON_CUH

#include "base/bf16.h"
#include "cuda/kernels/mma.cuh"
#include "cuda/kernels/store16.cuh" /* DT_STORE16 */

#define ATTM_THREADS 128                /* 4 warps, 16 rows each */
#define ATTM_BQ 64                      /* query rows per forward / dQ block */
#define ATTM_BKV 64                     /* keys per tile */
#define ATTM_LOG2E 1.44269504088896341f /* scores go base 2: exp(x) = 2^(x log2 e) */

/* Head sizes the kernels are instantiated for. */
static inline bool att_mma_supported(int HS) { return HS == 64 || HS == 128; }

/* Query tiles: grid.x of k_att_fwd_mma and k_att_bwd_dq_mma; also the key
 * tiles, grid.x of k_att_bwd_dkv_mma (ATTM_BQ = ATTM_BKV). */
static inline unsigned att_mma_tiles(int T) { return (unsigned)((T + ATTM_BQ - 1) / ATTM_BQ); }

/* cp.async of rows row0 .. row0 + ROWS - 1 of a [T][HS] view (rows R apart,
 * src at row 0) into the swizzled tile s, zero-filled past T, as one commit
 * group. */
template <int HS, int ROWS = ATTM_BKV>
static __device__ void attm_load(uint16_t *s, const uint16_t *src, size_t R, int row0, int T)
{
    for (unsigned i = threadIdx.x; i < ROWS * HS / 8; i += ATTM_THREADS) {
        const unsigned r = i / (HS / 8), c = 8 * (i % (HS / 8));
        const bool in = row0 + (int)r < T;
        cp_async_16_zfill(&s[smem_swizzle(r, c, HS)], in ? src + (size_t)(row0 + (int)r) * R + c : src, in ? 16 : 0);
    }
    cp_async_commit();
}

static __device__ inline uint32_t attm_pack(float lo, float hi)
{
    return (uint32_t)dt_f32_to_bf16(lo) | (uint32_t)dt_f32_to_bf16(hi) << 16;
}

/* qkv16[i] = bf16(qkv[i]) for i < n (round to nearest even, base/bf16.h's
 * bits), a grid-stride loop over att_mma_pack_blocks(n) blocks of
 * ATTM_THREADS threads (about 128 elements a thread, coalesced: a warp
 * takes 32 consecutive elements at a time; some 2300 blocks for GPT-2
 * 124M's qkv at 16 x 1024 tokens): the ops table hands
 * attention fp32 qkv, and the tensor-core kernels read bf16, so
 * cuda/ops_cuda_attention.cuh runs this separate pass in front of the
 * forward (it says what that costs; the backward's copy rides in
 * k_att_bwd_dot). */
__global__ void __launch_bounds__(ATTM_THREADS) k_att_pack_qkv(uint16_t *qkv16, const float *qkv, size_t n)
{
    for (size_t i = (size_t)blockIdx.x * ATTM_THREADS + threadIdx.x; i < n; i += (size_t)gridDim.x * ATTM_THREADS)
        qkv16[i] = dt_f32_to_bf16(qkv[i]);
}

static inline unsigned att_mma_pack_blocks(size_t n)
{
    const size_t b = (n + 128 * ATTM_THREADS - 1) / (128 * ATTM_THREADS);
    return b > 65535 ? 65535u : b ? (unsigned)b : 1u;
}

static __device__ inline float attm_quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

static __device__ inline float attm_quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

/* a = the A fragment of rows row0 .. row0 + 15, columns 16 kk .. 16 kk + 15
 * of the swizzled tile s ([row][HS]): one ldmatrix x4. */
template <int HS>
static __device__ inline void attm_frag_a(uint32_t a[4], const uint16_t *s, unsigned row0, unsigned kk, unsigned lane)
{
    ldmatrix_x4(a, &s[smem_swizzle(row0 + lane % 16, 16 * kk + 8 * (lane / 16), HS)]);
}

/* c += a B^T over k16 step kk: B = rows 0 .. NC - 1 of sb ([n][HS]). */
template <int HS, int NC>
static __device__ inline void attm_abt_k16(float (*c)[4], const uint32_t a[4], const uint16_t *sb, unsigned kk,
                                           unsigned lane)
{
    for (unsigned np = 0; np < NC / 16; np++) { /* n8 tiles 2 np, 2 np + 1 from one x4 */
        uint32_t b[4];
        ldmatrix_x4(b, &sb[smem_swizzle(16 * np + lane % 8 + 8 * (lane / 16), 16 * kk + 8 * ((lane / 8) % 2), HS)]);
        mma_m16n8k16_bf16(c[2 * np], a, b, c[2 * np]);
        mma_m16n8k16_bf16(c[2 * np + 1], a, b + 2, c[2 * np + 1]);
    }
}

/* c[16 x NC] = A B^T, A the warp's 16 x HS rows already in fragments af[HS / 16]
 * (Q in the forward: loaded once, reused for every key tile). */
template <int HS, int NC>
static __device__ void attm_scores(float (*c)[4], const uint32_t (*af)[4], const uint16_t *sb, unsigned lane)
{
    for (unsigned nt = 0; nt < NC / 8; nt++)
        for (unsigned i = 0; i < 4; i++)
            c[nt][i] = 0.0f;
    for (unsigned kk = 0; kk < HS / 16; kk++)
        attm_abt_k16<HS, NC>(c, af[kk], sb, kk, lane);
}

/* The same with A = rows row0 .. row0 + 15 of the swizzled tile sa, its
 * fragments loaded per k16 step (registers for the accumulators instead). */
template <int HS, int NC>
static __device__ void attm_scores_smem(float (*c)[4], const uint16_t *sa, unsigned row0, const uint16_t *sb,
                                        unsigned lane)
{
    for (unsigned nt = 0; nt < NC / 8; nt++)
        for (unsigned i = 0; i < 4; i++)
            c[nt][i] = 0.0f;
    for (unsigned kk = 0; kk < HS / 16; kk++) {
        uint32_t a[4];
        attm_frag_a<HS>(a, sa, row0, kk, lane);
        attm_abt_k16<HS, NC>(c, a, sb, kk, lane);
    }
}

/* o[16 x HS] += P X: P = p[16 x KR] rounded to bf16 (A fragments), X = rows
 * 0 .. KR - 1 of sx ([k][HS]) by ldmatrix x4 .trans. */
template <int HS, int KR>
static __device__ void attm_pv(float (*o)[4], const float (*p)[4], const uint16_t *sx, unsigned lane)
{
    for (unsigned kk = 0; kk < KR / 16; kk++) {
        const uint32_t a[4] = {attm_pack(p[2 * kk][0], p[2 * kk][1]), attm_pack(p[2 * kk][2], p[2 * kk][3]),
                               attm_pack(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               attm_pack(p[2 * kk + 1][2], p[2 * kk + 1][3])};
        for (unsigned dp = 0; dp < HS / 16; dp++) { /* n8 tiles 2 dp, 2 dp + 1 from one x4 .trans */
            uint32_t b[4];
            ldmatrix_x4_trans(b, &sx[smem_swizzle(16 * kk + lane % 16, 16 * dp + 8 * (lane / 16), HS)]);
            mma_m16n8k16_bf16(o[2 * dp], a, b, o[2 * dp]);
            mma_m16n8k16_bf16(o[2 * dp + 1], a, b + 2, o[2 * dp + 1]);
        }
    }
}

#endif
