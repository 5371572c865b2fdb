/* Attention forward on the tensor cores (issue 32): FlashAttention-2 with bf16
 * q, k, v, fp32 accumulation and an fp32 log-sum-exp per query row, built on
 * cuda/kernels/mma.cuh and the tile helpers of attention_mma_common.cuh
 * (shared with the backward, attention_mma_bwd.cuh). Dispatched by
 * cuda/ops_cuda_attention.cuh (attention_fwd under --dtype bf16 at head
 * sizes 64 and 128, behind k_att_pack_qkv); test/emu/test_att_mma_emu.cpp
 * runs the kernel in the host emulation against the CPU ops'
 * attention_fwd, test_att_path_emu.cpp the dispatch.
 *
 * Launch: k_att_fwd_mma<HS> with HS = 64 or 128 (att_mma_supported), grid
 * (att_mma_tiles(T), NH, B), ATTM_THREADS threads, static shared memory
 * 3 x 64 x HS bf16 (24 KiB at HS 64, 48 KiB at 128). Every out element of
 * rows t < T and every lse element is written (=) by one block. Causal work
 * grows with the query tile, so block x takes query tile
 * att_mma_tiles(T) - 1 - x: the longest start first.
 *
 * Scheme. A block owns ATTM_BQ = 64 query rows of one head, a warp 16 of
 * them (one m16 tile). Q is loaded once (cp.async into a swizzled tile, then
 * ldmatrix into A fragments kept in registers, HS / 16 of them). For each key
 * tile of ATTM_BKV = 64 keys from the first one any row of the block sees up
 * to the causal limit (later tiles are skipped, not masked), K and V are
 * copied by cp.async in separate commit groups so that copies overlap math:
 * V j flies while the scores of tile j are computed, K j + 1 while P V of
 * tile j is. S = Q K^T (K tile [key][d] is B in [n][k] storage: ldmatrix
 * x4), the online softmax in the base-2 domain
 * (scores times scale log2 e; m the running max, l the running sum, O
 * rescaled by 2^(m_old - m_new)), then O += P V with P's accumulators
 * rounded to bf16 and repacked in place as A fragments (the C fragments of
 * two adjacent n8 tiles are the A fragment of their k16 step) and V by
 * ldmatrix x4 .trans ([key][d] is B in [k][n] storage). A lane holds rows g
 * and g + 8 of its warp's tile: row max and sum over a tile are its 16 values
 * plus two xor shuffles in the quad; l is summed per lane and reduced once
 * at the end. out = O / l, lse = (m + log2 l) ln 2 (natural log, the ops
 * contract).
 *
 * Masking: key j is seen by query t when lo_t <= j <= t (lo_t = t - pos[bT
 * + t] with documents, else 0). Only the diagonal tile (and, with documents,
 * every tile) is masked: earlier tiles hold keys below every row of the
 * block. Keys and queries at or past T are zero-filled (cp.async zfill);
 * keys past T lie past every valid row (masked on the diagonal), rows past T
 * are computed and not stored. A row all of whose keys so far are masked has
 * m = -inf; its exponentials are taken against 0 instead so that they are 0,
 * not NaN.
 *
 * Rounding: q, k, v are bf16 and the products exact in fp32; P is rounded
 * to bf16 for the P V product (relative error 2^-9 each) while l sums the
 * fp32 P, so out differs from an fp32 attention of the same bf16 inputs by
 * at most about 2^-9 max |v| (the test allows 2^-8). mma's summation order
 * on the device is unspecified, fp32 bounds apply.
 *
 * q, k, v are strided views of qkv rows of R = (NH + 2 NKV) HS bf16 (the
 * ops' layout, token n = b T + t); query head h reads KV head h / (NH / NKV). */
#ifndef DTRAIN_CUDA_KERNELS_ATTENTION_MMA_CUH
#define DTRAIN_CUDA_KERNELS_ATTENTION_MMA_CUH

#include "cuda/kernels/attention_mma_common.cuh"

/* The online softmax of one key tile for the lane's rows t[0], t[1] (g, g + 8):
 * s (scores) becomes P = 2^(s sl2 - m), m and the lane's part of l are
 * updated and o rescaled. mask: keys outside lo[rr] .. t[rr] get P = 0. */
template <int HS>
static __device__ void attm_softmax(float (*s)[4], float (*o)[4], float *m, float *l, const int *t, const int *lo,
                                    int k0, unsigned t4, float sl2, bool mask)
{
    for (unsigned rr = 0; rr < 2; rr++) {
        float mx = -INFINITY;
        for (unsigned nt = 0; nt < ATTM_BKV / 8; nt++)
            for (unsigned e = 0; e < 2; e++) {
                const int key = k0 + 8 * (int)nt + 2 * (int)t4 + (int)e;
                float x = s[nt][2 * rr + e] * sl2;
                if (mask && (key > t[rr] || key < lo[rr]))
                    x = -INFINITY;
                s[nt][2 * rr + e] = x;
                mx = fmaxf(mx, x);
            }
        const float m_new = fmaxf(m[rr], attm_quad_max(mx)), base = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m[rr] - base);
        float sum = 0.0f;
        for (unsigned nt = 0; nt < ATTM_BKV / 8; nt++)
            for (unsigned e = 0; e < 2; e++) {
                const float p = exp2f(s[nt][2 * rr + e] - base);
                s[nt][2 * rr + e] = p;
                sum += p;
            }
        m[rr] = m_new;
        l[rr] = alpha * l[rr] + sum;
        for (unsigned dt = 0; dt < HS / 8; dt++) {
            o[dt][2 * rr] *= alpha;
            o[dt][2 * rr + 1] *= alpha;
        }
    }
}

/* out[b T + t, h HS ..] = softmax(scale q_t K^T) V over the keys t sees;
 * lse[(b NH + h) T + t]. qkv: bf16 bits; pos: documents or NULL. */
template <int HS>
__global__ void __launch_bounds__(ATTM_THREADS)
    k_att_fwd_mma(float *out, uint16_t *out16, float *lse, const uint16_t *qkv, const int32_t *pos, int T, int NH,
                  int NKV, float scale)
{
    __shared__ __align__(16) uint16_t sq[ATTM_BQ * HS], sk[ATTM_BKV * HS], sv[ATTM_BKV * HS];
    const int qt = (int)(gridDim.x - 1 - blockIdx.x), h = (int)blockIdx.y, b = (int)blockIdx.z; /* longest first */
    const int q0 = qt * ATTM_BQ, kh = h / (NH / NKV);
    const size_t R = (size_t)(NH + 2 * NKV) * HS;
    const uint16_t *rows = qkv + (size_t)b * T * R, *q = rows + (size_t)h * HS, *k = rows + (size_t)(NH + kh) * HS,
                   *v = rows + (size_t)(NH + NKV + kh) * HS;
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
    const int t[2] = {q0 + 16 * (int)warp + (int)(lane / 4), q0 + 16 * (int)warp + (int)(lane / 4) + 8};
    const int lo[2] = {ps && t[0] < T ? t[0] - ps[t[0]] : 0, ps && t[1] < T ? t[1] - ps[t[1]] : 0};
    const float sl2 = scale * ATTM_LOG2E;

    /* copy groups in flight, oldest first, at each wait: {Q, K j0}; then per
     * tile {K j, V j} at the first wait, {V j} at the second */
    const int j0 = (ps ? q0 - ps[q0] : 0) / ATTM_BKV; /* document starts never decrease along a row */
    attm_load<HS>(sq, q, R, q0, T);
    attm_load<HS>(sk, k, R, j0 * ATTM_BKV, T);
    cp_async_wait<1>(); /* Q */
    __syncthreads();
    uint32_t qf[HS / 16][4];
    for (unsigned kk = 0; kk < HS / 16; kk++)
        attm_frag_a<HS>(qf[kk], sq, 16 * warp, kk, lane);

    float o[HS / 8][4] = {}, m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
    for (int j = j0; j <= qt; j++) {
        __syncthreads();                          /* the previous tile's V is read */
        attm_load<HS>(sv, v, R, j * ATTM_BKV, T); /* flies during the scores */
        cp_async_wait<1>();                       /* K j */
        __syncthreads();
        float s[ATTM_BKV / 8][4];
        attm_scores<HS, ATTM_BKV>(s, qf, sk, lane);
        attm_softmax<HS>(s, o, m, l, t, lo, j * ATTM_BKV, t4, sl2, j == qt || ps);
        cp_async_wait<0>(); /* V j */
        __syncthreads();    /* and every warp's scores have read K j */
        if (j < qt)
            attm_load<HS>(sk, k, R, (j + 1) * ATTM_BKV, T); /* flies during P V */
        attm_pv<HS, ATTM_BKV>(o, s, sv, lane);
    }

    const size_t OC = (size_t)NH * HS;
    for (unsigned rr = 0; rr < 2; rr++) {
        const float L = attm_quad_sum(l[rr]);
        if (t[rr] >= T)
            continue;
        const float inv = 1.0f / L;
        const size_t at = ((size_t)b * T + t[rr]) * OC + (size_t)h * HS; /* out16: the same place */
        float *orow = out + at;
        for (unsigned dt = 0; dt < HS / 8; dt++)
            for (unsigned e = 0; e < 2; e++) {
                const float v = o[dt][2 * rr + e] * inv;
                orow[8 * dt + 2 * t4 + e] = v;
                DT_STORE16(out16, at + 8 * dt + 2 * t4 + e, v);
            }
        if (t4 == 0)
            lse[((size_t)b * NH + h) * T + t[rr]] = (m[rr] + log2f(L)) * 0.69314718055994531f; /* ln 2 */
    }
}

#endif
