/* Attention backward on the tensor cores (issue 32): FlashAttention-2's
 * backward for the forward of attention_mma.cuh, bf16 inputs, fp32
 * accumulation, no atomics. Dispatched by cuda/ops_cuda_attention.cuh
 * (attention_bwd under --dtype bf16 at head sizes 64 and 128);
 * test/emu/test_att_mma_bwd_emu.cpp runs the kernels in the host emulation
 * against the CPU ops' attention_bwd, test_att_path_emu.cpp the dispatch.
 *
 * Inputs: qkv [B T][R] fp32, R = (NH + 2 NKV) HS, as the ops table holds
 * it; out and dout [B T][NH HS] fp32, the forward's output and its
 * gradient; lse [B][NH][T] fp32 from the forward (natural log). Kernel 1
 * reads the fp32 ones and writes the bf16 copies of qkv and dout that
 * kernels 2 and 3 read. Output: dqkv [B T][R] fp32 in qkv's layout, every element of rows
 * t < T written (=) by exactly one block, as the ops' attention_bwd writes
 * it. fp32 because what it feeds (the QKV projection's backward, the
 * optimizer) takes fp32 gradients today; bf16 comes with the bf16 data path.
 *
 * Three launches, in order (HS = 64 or 128, att_mma_supported; all
 * ATTM_THREADS threads):
 *   1. k_att_bwd_dot<HS>: D[(b NH + h) T + t] = bf16(dout) . out over the
 *      head's HS (fp32), the rowsum(dP o P) of softmax's backward, and on
 *      the way the bf16 copies dout16 and qkv16 that kernels 2 and 3 read;
 *      grid att_mma_dot_blocks(B T (NH + 2 NKV)), a warp per (token, head)
 *      row of qkv, about 8 rows a warp.
 *   2. k_att_bwd_dkv_mma<HS>: dK and dV; grid (att_mma_tiles(T), NKV, B),
 *      static shared memory 2 x 64 x HS + 2 x 2048 bf16 and 16 attmb_bq(HS)
 *      bytes (24.5 KiB at HS 64, 40.25 KiB at 128).
 *   3. k_att_bwd_dq_mma<HS>: dQ; grid (att_mma_tiles(T), NH, B), static
 *      shared memory 2 x 64 x HS bf16 (16 or 32 KiB).
 * 2 and 3 only read D and write disjoint columns: they may run concurrently.
 * Every sum runs in an order fixed by the shapes alone (no atomics, no
 * order that depends on scheduling), so results are bit-identical run to run.
 *
 * dK, dV (kernel 2). A block owns a key tile of ATTM_BKV = 64 keys of one
 * KV head, a warp 16 of those keys; their accumulators dK and dV (16 x HS
 * each, fp32 C fragments) stay in registers for the whole block. It walks
 * steps of BQ = attmb_bq(HS) query rows, over every query head of the KV
 * head's group in turn (GQA: the owner accumulates every head's share, so
 * no two blocks write one dK row and nothing is atomic) and, per head, over
 * the rows that can see the tile: from the tile's first key (earlier rows
 * see none of it, causally) to the last step whose first row's document
 * starts within the tile (document starts never decrease along a row, so
 * later steps see none of it: skipped, not masked). Per step, keys as rows
 * (the transposed problem, so every product is one of
 * attention_mma_common.cuh's two shapes):
 *   S^T = K Q^T;  P^T = 2^(S^T scale log2 e - lse log2 e) (the forward's P);
 *   dP^T = V dO^T;  dS^T = P^T o (dP^T - D);
 *   dV += P^T dO;  dK += dS^T Q;  dK *= scale at the end.
 * K and V stay in shared memory (A fragments loaded per k16 step, leaving
 * the registers to the accumulators); Q and dO arrive per step by cp.async
 * in separate commit groups so that copies overlap math: the next dO flies
 * during dK += dS^T Q, the next Q during the next dP^T. BQ is 32 at HS 64
 * and 16 at HS 128: K, V, Q and dO tiles and the step's per-row values
 * (lse, D, document bounds) then fit the 48 KiB of static shared memory.
 *
 * dQ (kernel 3). A block owns ATTM_BQ = 64 query rows of one head, a warp 16
 * (the forward's geometry and key-tile range: causal tiles past the
 * diagonal and tiles before the block's first document skipped). Q and dO
 * are loaded once into A fragments; per key tile
 *   dP = dO V^T;  S = Q K^T;  dS = P o (dP - D);  dQ += dS K;
 * and dQ *= scale at the end. V j + 1 flies during S and dQ += dS K of
 * tile j, K j + 1 during dP of tile j + 1.
 *
 * Masking as in the forward: key j is seen by query t when lo_t <= j <= t
 * (lo_t = t - pos[b T + t] with documents, else 0); P = 0 elsewhere, so dS
 * = 0 too. Rows and keys at or past T are zero-filled; in kernel 2 query
 * rows past T are masked (their P would not be 0), in kernel 3 they are
 * computed and not stored.
 *
 * Rounding: the products of bf16 are exact in fp32. P and dS are rounded to
 * bf16 as the A operands of dV += P^T dO, dK += dS^T Q and dQ += dS K
 * (relative error 2^-9 each): gradients differ from an fp32 backward of
 * the same bf16 inputs by about 2^-9 of the sums of magnitudes behind them
 * (test_att_mma_bwd_emu states its bound). D is formed from the fp32 out
 * the ops table keeps (FA2 stores out in bf16 and forms D from that) and
 * the bf16 dout that dP uses. mma's summation order on the
 * device is unspecified: fp32 bounds apply there, and bit-identity holds
 * between runs on one device. */
#ifndef DTRAIN_CUDA_KERNELS_ATTENTION_MMA_BWD_CUH
#define DTRAIN_CUDA_KERNELS_ATTENTION_MMA_BWD_CUH

#include "cuda/kernels/attention_mma_common.cuh"

/* Query rows per step of k_att_bwd_dkv_mma: 2048 / HS (32 at HS 64, 16 at
 * 128), so that a Q or dO step tile is 4 KiB. */
static __host__ __device__ constexpr int attmb_bq(int HS) { return 2048 / HS; }

/* Blocks of k_att_bwd_dot for rows = B T (NH + 2 NKV) (token, head of
 * qkv) rows: a warp takes about 8 rows (grid-stride), a few thousand
 * blocks for a GPT-2 step, and an eighth of the blocks the emulation
 * starts threads for. */
static inline unsigned att_mma_dot_blocks(size_t rows)
{
    const size_t per = 8 * (ATTM_THREADS / 32), b = (rows + per - 1) / per;
    return b > 65535 ? 65535u : b ? (unsigned)b : 1u;
}

/* One pass over the fp32 tensors the ops table gives, a warp per (token n,
 * head c) row of qkv (rows grid-strided over the warps, lanes strided over
 * the head's HS values):
 *   qkv16 = bf16(qkv), every head (q, k and v): the copy kernels 2 and 3
 *     read, made here rather than by a pass of its own;
 *   for a query head c < NH also dout16 = bf16(dout) and
 *     D[(b NH + c) T + t] = sum over d of bf16(dout[n, c HS + d]) out[n, c HS + d],
 *     n = b T + t, the rowsum(dP o P) of softmax's backward, summed by a
 *     butterfly (fixed order: lane 0's sum, the one stored, is the same
 *     every run).
 * D takes the same rounded dout as dP = dO V^T in kernels 2 and 3, so that
 * D = rowsum(dP o P) holds for the values the kernels use; out stays fp32
 * (the forward's, not rounded). */
template <int HS>
__global__ void __launch_bounds__(ATTM_THREADS)
    k_att_bwd_dot(float *D, uint16_t *dout16, uint16_t *qkv16, const float *out, const float *dout, const float *qkv,
                  int B, int T, int NH, int NKV)
{
    const unsigned lane = threadIdx.x % 32, warps = ATTM_THREADS / 32;
    const size_t H = (size_t)NH + 2 * (size_t)NKV, rows = (size_t)B * T * H;
    /* row (n H + c) is warp-uniform: the whole warp loops and shuffles together */
    for (size_t row = (size_t)blockIdx.x * warps + threadIdx.x / 32; row < rows; row += (size_t)gridDim.x * warps) {
        const float *x = qkv + row * HS; /* qkv's rows are H heads of HS */
        uint16_t *x16 = qkv16 + row * HS;
        for (unsigned e = lane; e < HS; e += 32)
            x16[e] = dt_f32_to_bf16(x[e]);
        const size_t n = row / H, c = row % H;
        if (c >= (size_t)NH)
            continue;
        const size_t orow = n * (size_t)NH + c; /* out and dout: NH heads a token */
        const float *o = out + orow * HS, *g = dout + orow * HS;
        uint16_t *g16 = dout16 + orow * HS;
        float acc = 0.0f;
        for (unsigned e = lane; e < HS; e += 32) {
            const uint16_t gb = dt_f32_to_bf16(g[e]);
            g16[e] = gb;
            acc += dt_bf16_to_f32(gb) * o[e];
        }
        for (int off = 16; off > 0; off /= 2)
            acc += __shfl_xor_sync(0xffffffffu, acc, off);
        if (lane == 0) {
            const size_t b = n / (size_t)T, t = n % (size_t)T;
            D[(b * (size_t)NH + c) * (size_t)T + t] = acc;
        }
    }
}

/* ---- kernel 2: dK, dV ---- */

/* The per-row values of a step's BQ query rows t0 .. (shared memory). */
template <int BQ> struct attmb_rows {
    float lse2[BQ]; /* lse log2 e */
    float D[BQ];
    int lo[BQ], hi[BQ]; /* keys lo .. hi seen; hi = -1 past T */
};

/* r = the per-row values of query rows t0 .. t0 + BQ - 1 of head h (plain
 * stores: read after the next __syncthreads). */
template <int BQ>
static __device__ void attmb_load_rows(attmb_rows<BQ> *r, const float *lse, const float *D, const int32_t *ps, int b,
                                       int h, int t0, int T, int NH)
{
    if (threadIdx.x >= (unsigned)BQ)
        return;
    const int c = (int)threadIdx.x, t = t0 + c;
    const size_t at = ((size_t)b * NH + h) * T + t;
    const bool in = t < T;
    r->lse2[c] = in ? lse[at] * ATTM_LOG2E : 0.0f;
    r->D[c] = in ? D[at] : 0.0f;
    r->lo[c] = in && ps ? t - ps[t] : 0;
    r->hi[c] = in ? t : -1;
}

/* p = S^T (16 keys x BQ rows) becomes P^T, dp = dP^T becomes dS^T. The
 * lane's keys are key[0], key[1] (fragment rows g, g + 8), its columns
 * 8 nt + 2 t4 + e. mask: keys outside the column's lo .. hi get P = 0. */
template <int BQ>
static __device__ void attmb_grads_t(float (*p)[4], float (*dp)[4], const attmb_rows<BQ> *r, const int *key,
                                     unsigned t4, float sl2, bool mask)
{
    for (unsigned nt = 0; nt < BQ / 8; nt++)
        for (unsigned i = 0; i < 4; i++) {
            const unsigned c = 8 * nt + 2 * t4 + (i & 1);
            const int j = key[i >> 1];
            const float pv = mask && (j < r->lo[c] || j > r->hi[c]) ? 0.0f : exp2f(p[nt][i] * sl2 - r->lse2[c]);
            p[nt][i] = pv;
            dp[nt][i] = pv * (dp[nt][i] - r->D[c]);
        }
}

/* First query row of the step after the last one that sees key tile k0
 * (steps of BQ rows from k0): see the header. */
template <int BQ> static __device__ int attmb_rows_end(const int32_t *ps, int k0, int T)
{
    int t = k0;
    while (t < T && (!ps || t - ps[t] < k0 + ATTM_BKV))
        t += BQ;
    return t < T ? t : T;
}

/* dqkv's dK, dV columns of KV head blockIdx.y, keys of tile blockIdx.x, batch
 * row blockIdx.z. qkv, dout: bf16 bits; lse, D: [B][NH][T]; pos: documents
 * or NULL. */
template <int HS>
__global__ void __launch_bounds__(ATTM_THREADS)
    k_att_bwd_dkv_mma(float *dqkv, uint16_t *dqkv16, const uint16_t *qkv, const uint16_t *dout, const float *lse,
                      const float *D, const int32_t *pos, int T, int NH, int NKV, float scale)
{
    constexpr int BQ = attmb_bq(HS);
    __shared__ __align__(16) uint16_t sk[ATTM_BKV * HS], sv[ATTM_BKV * HS], sq[BQ * HS], sdo[BQ * HS];
    __shared__ attmb_rows<BQ> rows;
    const int k0 = (int)blockIdx.x * ATTM_BKV, kh = (int)blockIdx.y, b = (int)blockIdx.z, grp = NH / NKV;
    const size_t R = (size_t)(NH + 2 * NKV) * HS;
    const uint16_t *base = qkv + (size_t)b * T * R;
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
    const int key[2] = {k0 + 16 * (int)warp + (int)(lane / 4), k0 + 16 * (int)warp + (int)(lane / 4) + 8};
    const float sl2 = scale * ATTM_LOG2E;
    const int t_end = attmb_rows_end<BQ>(ps, k0, T), per_head = (t_end - k0 + BQ - 1) / BQ;
    const int steps = per_head * grp; /* step s: head kh grp + s / per_head, rows k0 + BQ (s % per_head) .. */

    /* copy groups in flight, oldest first: {K}, {V}, {dO 0}, {Q 0}; then per
     * step {dO s}, {Q s} at the first wait and {Q s} at the second */
    const size_t OC = (size_t)NH * HS;
    const uint16_t *dob = dout + (size_t)b * T * OC;
    attm_load<HS>(sk, base + (size_t)(NH + kh) * HS, R, k0, T);
    attm_load<HS>(sv, base + (size_t)(NH + NKV + kh) * HS, R, k0, T);
    attm_load<HS, BQ>(sdo, dob + (size_t)kh * grp * HS, OC, k0, T);
    attm_load<HS, BQ>(sq, base + (size_t)kh * grp * HS, R, k0, T);
    attmb_load_rows<BQ>(&rows, lse, D, ps, b, kh * grp, k0, T, NH);

    float dk[HS / 8][4] = {}, dv[HS / 8][4] = {};
    for (int s = 0; s < steps; s++) {
        const int t0 = k0 + BQ * (s % per_head);
        /* the next step's head and first row */
        const int sn = s + 1, hn = kh * grp + sn / per_head, tn = k0 + BQ * (sn % per_head);
        cp_async_wait<1>(); /* dO s (and K, V) */
        __syncthreads();
        float p[BQ / 8][4], dp[BQ / 8][4];
        attm_scores_smem<HS, BQ>(dp, sv, 16 * warp, sdo, lane); /* dP^T = V dO^T */
        cp_async_wait<0>();                                     /* Q s */
        __syncthreads();                                        /* and the rows' values */
        attm_scores_smem<HS, BQ>(p, sk, 16 * warp, sq, lane);   /* S^T = K Q^T */
        attmb_grads_t<BQ>(p, dp, &rows, key, t4, sl2, t0 < k0 + ATTM_BKV || ps || t0 + BQ > T);
        attm_pv<HS, BQ>(dv, p, sdo, lane); /* dV += P^T dO */
        if (sn < steps) {
            __syncthreads();                                          /* every warp has read dO s */
            attm_load<HS, BQ>(sdo, dob + (size_t)hn * HS, OC, tn, T); /* flies during dK */
        }
        attm_pv<HS, BQ>(dk, dp, sq, lane); /* dK += dS^T Q */
        if (sn < steps) {
            __syncthreads();                                         /* every warp has read Q s and the rows' values */
            attm_load<HS, BQ>(sq, base + (size_t)hn * HS, R, tn, T); /* flies during the next dP^T */
            attmb_load_rows<BQ>(&rows, lse, D, ps, b, hn, tn, T, NH);
        }
    }

    const size_t kb = (size_t)b * T * R + (size_t)(NH + kh) * HS, vb = kb + (size_t)NKV * HS; /* and in dqkv16 */
    for (unsigned rr = 0; rr < 2; rr++) {
        if (key[rr] >= T)
            continue;
        const size_t kr = kb + (size_t)key[rr] * R, vr = vb + (size_t)key[rr] * R;
        for (unsigned dt = 0; dt < HS / 8; dt++)
            for (unsigned e = 0; e < 2; e++) {
                const unsigned c = 8 * dt + 2 * t4 + e;
                const float vk = dk[dt][2 * rr + e] * scale, vv = dv[dt][2 * rr + e];
                dqkv[kr + c] = vk;
                dqkv[vr + c] = vv;
                DT_STORE16(dqkv16, kr + c, vk);
                DT_STORE16(dqkv16, vr + c, vv);
            }
    }
}

/* ---- kernel 3: dQ ---- */

/* s = S (16 rows x 64 keys of tile k0) becomes dS, dp = dP is read: for
 * the lane's rows t[rr] (fragment rows g, g + 8), P = 2^(s sl2 - lse2[rr]),
 * 0 for keys outside lo[rr] .. t[rr] when mask, dS = P (dP - D[rr]). */
static __device__ void attmb_grads(float (*s)[4], const float (*dp)[4], const int *t, const int *lo, const float *lse2,
                                   const float *Dr, int k0, unsigned t4, float sl2, bool mask)
{
    for (unsigned nt = 0; nt < ATTM_BKV / 8; nt++)
        for (unsigned i = 0; i < 4; i++) {
            const unsigned rr = i >> 1;
            const int j = k0 + 8 * (int)nt + 2 * (int)t4 + (int)(i & 1);
            const float p = mask && (j > t[rr] || j < lo[rr]) ? 0.0f : exp2f(s[nt][i] * sl2 - lse2[rr]);
            s[nt][i] = p * (dp[nt][i] - Dr[rr]);
        }
}

/* dqkv's dQ columns of head blockIdx.y, query tile att_mma_tiles(T) - 1 -
 * blockIdx.x (the longest first, as the forward), batch row blockIdx.z. */
template <int HS>
__global__ void __launch_bounds__(ATTM_THREADS)
    k_att_bwd_dq_mma(float *dqkv, uint16_t *dqkv16, const uint16_t *qkv, const uint16_t *dout, const float *lse,
                     const float *D, const int32_t *pos, int T, int NH, int NKV, float scale)
{
    __shared__ __align__(16) uint16_t sk[ATTM_BKV * HS], sv[ATTM_BKV * HS];
    const int qt = (int)(gridDim.x - 1 - blockIdx.x), h = (int)blockIdx.y, b = (int)blockIdx.z;
    const int q0 = qt * ATTM_BQ, kh = h / (NH / NKV);
    const size_t R = (size_t)(NH + 2 * NKV) * HS, OC = (size_t)NH * HS;
    const uint16_t *base = qkv + (size_t)b * T * R, *k = base + (size_t)(NH + kh) * HS,
                   *v = base + (size_t)(NH + NKV + kh) * HS;
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32, t4 = lane % 4;
    const int t[2] = {q0 + 16 * (int)warp + (int)(lane / 4), q0 + 16 * (int)warp + (int)(lane / 4) + 8};
    int lo[2];
    float lse2[2], Dr[2];
    for (unsigned rr = 0; rr < 2; rr++) {
        const bool in = t[rr] < T;
        const size_t at = ((size_t)b * NH + h) * T + t[rr];
        lo[rr] = ps && in ? t[rr] - ps[t[rr]] : 0;
        lse2[rr] = in ? lse[at] * ATTM_LOG2E : 0.0f;
        Dr[rr] = in ? D[at] : 0.0f;
    }
    const float sl2 = scale * ATTM_LOG2E;

    /* Q and dO staged through sk and sv into A fragments, kept for every tile */
    attm_load<HS>(sk, base + (size_t)h * HS, R, q0, T);
    attm_load<HS>(sv, dout + (size_t)b * T * OC + (size_t)h * HS, OC, q0, T);
    cp_async_wait<0>();
    __syncthreads();
    uint32_t qf[HS / 16][4], df[HS / 16][4];
    for (unsigned kk = 0; kk < HS / 16; kk++) {
        attm_frag_a<HS>(qf[kk], sk, 16 * warp, kk, lane);
        attm_frag_a<HS>(df[kk], sv, 16 * warp, kk, lane);
    }
    __syncthreads(); /* every warp has its fragments: the tiles may be refilled */

    /* copy groups in flight, oldest first, at each tile's first wait: {V j},
     * {K j}; at the second: {K j} and, before the last tile, {V j + 1} */
    const int j0 = (ps ? q0 - ps[q0] : 0) / ATTM_BKV; /* document starts never decrease along a row */
    attm_load<HS>(sv, v, R, j0 * ATTM_BKV, T);
    attm_load<HS>(sk, k, R, j0 * ATTM_BKV, T);
    float dq[HS / 8][4] = {};
    for (int j = j0; j <= qt; j++) {
        cp_async_wait<1>(); /* V j */
        __syncthreads();
        float s[ATTM_BKV / 8][4], dp[ATTM_BKV / 8][4];
        attm_scores<HS, ATTM_BKV>(dp, df, sv, lane); /* dP = dO V^T */
        if (j < qt) {
            __syncthreads();                                /* every warp has read V j */
            attm_load<HS>(sv, v, R, (j + 1) * ATTM_BKV, T); /* flies during S and dQ */
            cp_async_wait<1>();                             /* K j */
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        attm_scores<HS, ATTM_BKV>(s, qf, sk, lane); /* S = Q K^T */
        attmb_grads(s, dp, t, lo, lse2, Dr, j * ATTM_BKV, t4, sl2, j == qt || ps);
        attm_pv<HS, ATTM_BKV>(dq, s, sk, lane); /* dQ += dS K */
        if (j < qt) {
            __syncthreads();                                /* every warp has read K j */
            attm_load<HS>(sk, k, R, (j + 1) * ATTM_BKV, T); /* flies during the next dP */
        }
    }

    for (unsigned rr = 0; rr < 2; rr++) {
        if (t[rr] >= T)
            continue;
        const size_t at = ((size_t)b * T + t[rr]) * R + (size_t)h * HS; /* dqkv16: the same place */
        for (unsigned dt = 0; dt < HS / 8; dt++)
            for (unsigned e = 0; e < 2; e++) {
                const float v = dq[dt][2 * rr + e] * scale;
                dqkv[at + 8 * dt + 2 * t4 + e] = v;
                DT_STORE16(dqkv16, at + 8 * dt + 2 * t4 + e, v);
            }
    }
}

#endif
