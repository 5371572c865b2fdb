/* Attention: tiled flash attention in fp32, the forward and the two
 * backward kernels, and the host functions that give their launch shapes.
 * Launches (ops_cuda.cu's attention_fwd and attention_bwd), with NC =
 * att_nc(HS) and ATT_THREADS threads: k_att_fwd<NC> and k_att_bwd_dq<NC>
 * on grid (att_grid_x(query tiles), NH, B), k_att_bwd_dkv<NC> on grid
 * (att_grid_x(key tiles), NKV, B). Every output element is written (=) by
 * one block; nothing is accumulated. The scheme, tiling, shared memory and
 * determinism are described below. */
#ifndef DTRAIN_CUDA_KERNELS_ATTENTION_CUH
#define DTRAIN_CUDA_KERNELS_ATTENTION_CUH

#include "cuda/kernels/common.cuh"

/* ---- attention: tiled flash attention in fp32 -------------------------------------------
 * A straightforward fp32 FlashAttention-2 kernel set on the CUDA cores (no tensor cores
 * yet; bf16 q/k/v with mma instructions is a later step). The T x T scores and
 * probabilities never exist in global memory: the forward keeps lse[B,NH,T] (the ops
 * contract) and the backward recomputes P tile by tile from it.
 *
 * Tiling. Query tiles of ATT_BR = 32 rows, key tiles of ATT_BC = 32 rows, and the head
 * dimension in chunks of ATT_DK = 64 columns. A block has ATT_THREADS = 128 threads: tile
 * row r = tid / 4 belongs to the 4 consecutive lanes of a quad (q = tid % 4), which hold
 * that row's 32 scores as columns q, q + 4, ..., q + 28 and its accumulated output columns
 * q, q + 4, ..., q + 60 of each 64-column chunk. Row reductions (max, sums, D) are two
 * xor shuffles inside the quad. Accumulators (O, dQ, dK and dV) live in registers, NC
 * chunks of them: NC = 1, 2 or 4 for HS up to 64, 128 or 256. Beyond 256 the grid splits
 * the head dimension into groups of 256 accumulated columns; every group's block still
 * computes the scores over all of HS (the softmax needs all of them), so any HS works and
 * only HS > 256 pays for recomputation.
 *
 * Shared memory, static and under the 48 KiB that needs no opt-in (rows padded to 65 and
 * 33 floats so that the rows a warp reads at once fall on different banks):
 *   forward   Q chunk, K-then-V chunk [32][65]; P [32][33]                 20,864 B
 *   dQ        Q, dO, K, V chunks [32][65]; dS [32][33]                     37,504 B
 *   dK/dV     K, V, Q, dO chunks [32][65]; P^T, dS^T [32][33]; lse, D [32]  41,984 B
 * With HS <= 64 there is one chunk, and the tiles a block keeps (Q in the forward, Q and
 * dO in dQ, K and V in dK/dV) are loaded once; otherwise chunks are loaded again where
 * they are used (from L2). Partial tiles (T not a multiple of 32, HS not of 64)
 * are zero-filled and masked scores give P = 0, so padding adds nothing.
 *
 * Forward, grid (query tiles x column groups, NH, B). Over key tiles 0 .. the causal
 * limit, for each query row t with scores s_j = scale q_t.k_j (keys j <= t):
 *   m' = max(m, max_j s_j),  a = e^(m - m'),  l = a l + sum_j e^(s_j - m'),
 *   O = a O + sum_j e^(s_j - m') v_j,  m = m'
 * from m = -inf, l = 0, O = 0; then out_t = O / l and lse_t = m + log(l).
 *
 * Backward, the FlashAttention-2 scheme: P_tj = e^(s_tj - lse_t) recomputed, dP_tj =
 * dO_t.v_j, D_t = rowsum(dO_t o out_t) (equal to rowsum(dP_t o P_t)), dS = P o (dP - D).
 *  - dK/dV, grid (key tiles x column groups, NKV, B): a block owns one key tile of one KV
 *    head and loops over the query heads of its GQA group and their query tiles at or
 *    after the key tile: dV_j += sum_t P_tj dO_t, dK_j += scale sum_t dS_tj q_t. D is
 *    computed per query tile on the fly (HS-long dot products from out and dout): the
 *    ops table gives no workspace and ops do not allocate.
 *  - dQ, grid (query tiles x column groups, NH, B): a block owns one query tile of one
 *    query head and loops over key tiles up to the causal limit: dQ_t += scale sum_j
 *    dS_tj k_j.
 *  Every element of dqkv (q, k and v columns of every row) is written by exactly one
 *  block, so nothing is accumulated into it and there are no atomics.
 *
 * Determinism: every sum runs in a fixed order (head-dimension columns in order, then
 * tiles in order, fixed shuffle pairs), with no atomics, so results are bit-identical
 * run to run. They differ from the CPU's by rounding: the online softmax rescales where
 * the CPU's two-pass softmax does not, and the sums run in other orders (see the
 * self-test bounds). Causal work is uneven across query tiles, so the forward and dQ
 * grids start with the last (longest) tiles; dK/dV's longest tiles come first anyway.
 *
 * Documents (pos != NULL, base/ops.h): query t sees keys lo_t = t - pos[bT + t] .. t, its
 * own document's. Document starts never decrease along a row, so a query tile's keys
 * start at its first row's lo: the forward and dQ begin at that key tile, and dK/dV
 * stops at the first query tile whose first row's document starts after the key tile's
 * last key. Tiles wholly outside every document are thus never loaded; inside the
 * tiles that remain, pairs across a boundary are masked like pairs after the diagonal.
 * pos NULL gives lo_t = 0, the plain causal case, with the same arithmetic.
 *
 * q, k, v are strided views of qkv rows of R = (NH + 2 NKV) HS floats, token n = b T + t;
 * query head h reads KV head h / (NH / NKV). */

#define ATT_THREADS 128     /* threads of the attention kernels: 4 per tile row */
#define ATT_BR 32           /* query rows per tile */
#define ATT_BC 32           /* key rows per tile */
#define ATT_DK 64           /* head-dimension columns per shared-memory chunk */
#define ATT_CW (ATT_DK / 4) /* accumulated columns per thread per chunk */
#define ATT_SW (ATT_BC / 4) /* scores per thread per tile (and query rows per thread in dK/dV) */
#define ATT_GROUP 4         /* most chunks of accumulated columns per block (256 columns) */

static_assert(ATT_THREADS == 4 * ATT_BR && ATT_THREADS == 4 * ATT_BC,
              "attention kernels: one quad of threads per tile row");
static_assert(ATT_BR == ATT_BC, "attention kernels: att_load and dK/dV assume square tiles");
static_assert(ATT_DK % 4 == 0, "attention kernels: a chunk's columns are split over a quad");

/* A [32][ATT_DK] chunk, rows padded by one float. */
typedef float att_chunk_t[ATT_DK + 1];

/* dst[r][c] = src[(row0 + r) ld + c] for the tile's 32 rows and ATT_DK columns; zero
 * where row0 + r >= T or c >= ncol (partial tiles). src points at the chunk's first
 * column in token row 0 of the batch row. Consecutive threads read consecutive
 * columns (coalesced). Every thread of the block calls it; the caller synchronises. */
static __device__ void att_load(att_chunk_t *dst, const float *src, size_t ld, int row0, int T, int ncol)
{
    for (int i = threadIdx.x; i < ATT_BR * ATT_DK; i += ATT_THREADS) {
        const int r = i / ATT_DK, c = i % ATT_DK;
        dst[r][c] = row0 + r < T && c < ncol ? src[(size_t)(row0 + r) * ld + c] : 0.0f;
    }
}

/* Sum / max over the 4 lanes of a quad (xor 1, then xor 2). Every lane gets the same
 * bits: float addition and fmaxf are commutative, and each lane adds the same pairs.
 * All 32 lanes of the warp must call them. */
static __device__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

static __device__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

/* First key query row t of a row sees: the start of its document (ps: the row's
 * positions, or NULL: 0). Rows past T (partial tiles) get 0. */
static __device__ int att_lo(const int32_t *ps, int t, int T) { return ps && t < T ? t - ps[t] : 0; }

/* D = rowsum(a o b) over n columns by a quad: lane q sums columns q, q + 4, ... in order,
 * then quad_sum. n = 0 (a row past T) gives 0. dQ and dK/dV both compute D with this, so
 * the two kernels use the same bits. All 32 lanes must call it. */
static __device__ float att_quad_dot(const float *a, const float *b, int n, int q)
{
    float s = 0.0f;
    for (int d = q; d < n; d += 4)
        s += a[d] * b[d];
    return quad_sum(s);
}

/* Forward: one block per (query tile, column group) x head x batch row. NC chunks of
 * accumulated columns; the block's group starts at column g0 = group * NC * ATT_DK.
 * Writes out[b T + t, h HS + columns of the group] and (group 0) lse[b, h, t]. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_fwd(float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos, int T, int NH, int NKV,
              int HS, float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR];  /* Q chunk of the query tile */
    __shared__ att_chunk_t sKV[ATT_BC]; /* K chunk of the key tile, then its V chunk */
    __shared__ float sP[ATT_BR][ATT_BC + 1];
    const int nqt = (T + ATT_BR - 1) / ATT_BR;
    const int qt = nqt - 1 - (int)(blockIdx.x % (unsigned)nqt); /* longest tiles first */
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int t0 = qt * ATT_BR, t = t0 + r; /* this quad's query row */
    const float *base = qkv + (size_t)b * T * R;
    const float *qs = base + (size_t)h * HS, *ks = base + (size_t)(NH + kh) * HS,
                *vs = base + (size_t)(NH + NKV + kh) * HS;
    /* the last key tile holding a key <= the tile's last row; the first holding its
     * first row's document start */
    const int last = min((T - 1) / ATT_BC, (t0 + ATT_BR - 1) / ATT_BC);
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    const int first = att_lo(ps, t0, T) / ATT_BC, lo = att_lo(ps, t, T);

    float m = -INFINITY, l = 0.0f, acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1)
        att_load(sQ, qs, R, t0, T, HS);

    for (int kt = first; kt <= last; kt++) {
        const int j0 = kt * ATT_BC;
        /* s[i] = q_t . k_(j0 + q + 4i), over the head dimension chunk by chunk */
        float s[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1)
                att_load(sQ, qs + d0, R, t0, T, dn);
            att_load(sKV, ks + d0, R, j0, T, dn);
            __syncthreads();
            for (int d = 0; d < dn; d++) {
                const float qv = sQ[r][d];
#pragma unroll
                for (int i = 0; i < ATT_SW; i++)
                    s[i] += qv * sKV[q + 4 * i][d];
            }
            __syncthreads(); /* sQ and sKV are free again */
        }
        /* online softmax update of row t (masked: key after t, past T or before
         * t's document) */
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            s[i] = j <= t && j < T && j >= lo ? scale * s[i] : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        const float mnew = fmaxf(m, quad_max(mx));
        /* mnew is finite once a tile held one of row t's keys; before that (a
         * later document's row, or a row past T) the guards keep -inf - -inf
         * (NaN) out */
        const float alpha = mnew == -INFINITY ? 1.0f : dt_expf(m - mnew);
        float ps = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const float p = s[i] == -INFINITY ? 0.0f : dt_expf(s[i] - mnew);
            sP[r][q + 4 * i] = p;
            ps += p;
        }
        l = l * alpha + quad_sum(ps);
        m = mnew;
        /* O = alpha O + P V, V chunk by chunk (the sync after the load also
         * publishes sP) */
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            att_load(sKV, vs + c0, R, j0, T, min(ATT_DK, HS - c0));
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ATT_CW; i++)
                acc[c][i] *= alpha;
            for (int j = 0; j < ATT_BC; j++) {
                const float p = sP[r][j];
#pragma unroll
                for (int i = 0; i < ATT_CW; i++)
                    acc[c][i] += p * sKV[j][q + 4 * i];
            }
            __syncthreads(); /* sKV and sP are free again */
        }
    }
    if (t < T) {
        const float inv = 1.0f / l;
        const size_t at = ((size_t)b * T + t) * OC + (size_t)h * HS; /* out16: the same place */
        float *o = out + at;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS) {
                    const float v = acc[c][i] * inv;
                    o[col] = v;
                    DT_STORE16(out16, at + col, v);
                }
            }
        if (g0 == 0 && q == 0)
            lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    }
}

/* dQ: one block per (query tile, column group) x head x batch row. Writes the q columns
 * of the group: dqkv[b T + t, h HS + columns]. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_bwd_dq(float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv, const float *out, const float *lse,
                 const int32_t *pos, int T, int NH, int NKV, int HS, float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ float sdS[ATT_BR][ATT_BC + 1];
    const int nqt = (T + ATT_BR - 1) / ATT_BR;
    const int qt = nqt - 1 - (int)(blockIdx.x % (unsigned)nqt); /* longest tiles first */
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int t0 = qt * ATT_BR, t = t0 + r;
    const float *base = qkv + (size_t)b * T * R;
    const float *qs = base + (size_t)h * HS, *ks = base + (size_t)(NH + kh) * HS,
                *vs = base + (size_t)(NH + NKV + kh) * HS;
    const float *dos = dout + (size_t)b * T * OC + (size_t)h * HS, *os = out + (size_t)b * T * OC + (size_t)h * HS;
    const int last = min((T - 1) / ATT_BC, (t0 + ATT_BR - 1) / ATT_BC);
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    const int first = att_lo(ps, t0, T) / ATT_BC, lo = att_lo(ps, t, T);
    /* row t's lse and D (rows past T: 0, never used) */
    const float L = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    const size_t orow = (size_t)(t < T ? t : 0) * OC;
    const float D = att_quad_dot(dos + orow, os + orow, t < T ? HS : 0, q);

    float acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sQ, qs, R, t0, T, HS);
        att_load(sdO, dos, OC, t0, T, HS);
    }

    for (int kt = first; kt <= last; kt++) {
        const int j0 = kt * ATT_BC;
        /* s[i] = q_t . k_j, dp[i] = dO_t . v_j for j = j0 + q + 4i */
        float s[ATT_SW], dp[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = dp[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1) {
                att_load(sQ, qs + d0, R, t0, T, dn);
                att_load(sdO, dos + d0, OC, t0, T, dn);
            }
            att_load(sK, ks + d0, R, j0, T, dn);
            att_load(sV, vs + d0, R, j0, T, dn);
            __syncthreads();
            for (int d = 0; d < dn; d++) {
                const float qv = sQ[r][d], gv = sdO[r][d];
#pragma unroll
                for (int i = 0; i < ATT_SW; i++) {
                    s[i] += qv * sK[q + 4 * i][d];
                    dp[i] += gv * sV[q + 4 * i][d];
                }
            }
            __syncthreads();
        }
        /* dS = P o (dP - D), P = e^(s - lse); 0 where masked */
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            const int ok = j <= t && j < T && j >= lo;
            const float p = ok ? dt_expf(scale * s[i] - L) : 0.0f;
            sdS[r][q + 4 * i] = ok ? dt_softmax_grad(p, dp[i], D) : 0.0f;
        }
        /* dQ += dS K, K chunk by chunk: with one chunk sK still holds it (the
         * sync after the reload, or this one, publishes sdS) */
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            if (nd > 1)
                att_load(sK, ks + c0, R, j0, T, min(ATT_DK, HS - c0));
            __syncthreads();
            for (int j = 0; j < ATT_BC; j++) {
                const float ds = sdS[r][j];
#pragma unroll
                for (int i = 0; i < ATT_CW; i++)
                    acc[c][i] += ds * sK[j][q + 4 * i];
            }
            __syncthreads();
        }
    }
    if (t < T) {
        const size_t at = ((size_t)b * T + t) * R + (size_t)h * HS; /* dqkv16: the same place */
        float *dq = dqkv + at;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS) {
                    const float v = scale * acc[c][i];
                    dq[col] = v;
                    DT_STORE16(dqkv16, at + col, v);
                }
            }
    }
}

/* dK, dV: one block per (key tile, column group) x KV head x batch row, over the query
 * heads h of the group and their query tiles from the one holding the tile's first key.
 * Here the quad of tile row r owns key row j = j0 + r, and its score lanes are the query
 * rows t0 + q + 4i. Writes the k and v columns of the group for the tile's keys. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_bwd_dkv(float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv, const float *out,
                  const float *lse, const int32_t *pos, int T, int NH, int NKV, int HS, float scale)
{
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ float sPt[ATT_BC][ATT_BR + 1];       /* P^T: [key row][query row] */
    __shared__ float sdSt[ATT_BC][ATT_BR + 1];      /* dS^T */
    __shared__ float sL[ATT_BR], sD[ATT_BR];        /* the query tile's lse and D */
    __shared__ int sLo[ATT_BR];                     /* and its rows' first keys (att_lo) */
    const int nkt = (T + ATT_BC - 1) / ATT_BC, nqt = (T + ATT_BR - 1) / ATT_BR;
    const int kt = (int)(blockIdx.x % (unsigned)nkt);
    const int g0 = (int)(blockIdx.x / (unsigned)nkt) * NC * ATT_DK;
    const int kh = blockIdx.y, b = blockIdx.z, grp = NH / NKV;
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int j0 = kt * ATT_BC, j = j0 + r; /* this quad's key row */
    const float *base = qkv + (size_t)b * T * R;
    const float *ks = base + (size_t)(NH + kh) * HS, *vs = base + (size_t)(NH + NKV + kh) * HS;
    const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
    /* the tile's last key: query tiles whose first row's document starts after it
     * (and all later ones) see none of the tile's keys */
    const int jlast = min(j0 + ATT_BC, T) - 1;

    float dk[NC][ATT_CW], dv[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            dk[c][i] = dv[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sK, ks, R, j0, T, HS);
        att_load(sV, vs, R, j0, T, HS);
    }

    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        const float *qs = base + (size_t)h * HS;
        const float *dos = dout + (size_t)b * T * OC + (size_t)h * HS, *os = out + (size_t)b * T * OC + (size_t)h * HS;
        const float *lrow = lse + ((size_t)b * NH + h) * T;
        for (int qt = j0 / ATT_BR; qt < nqt && att_lo(ps, qt * ATT_BR, T) <= jlast; qt++) {
            const int t0 = qt * ATT_BR;
            { /* lse, D and first key of query row t0 + r, by the same quad layout as dQ's */
                const int tr = t0 + r;
                const size_t orow = (size_t)(tr < T ? tr : 0) * OC;
                const float D = att_quad_dot(dos + orow, os + orow, tr < T ? HS : 0, q);
                if (q == 0) {
                    sD[r] = D;
                    sL[r] = tr < T ? lrow[tr] : 0.0f;
                    sLo[r] = att_lo(ps, tr, T);
                }
            }
            /* s[i] = k_j . q_t, dp[i] = v_j . dO_t for t = t0 + q + 4i: the same
             * products in the same order as in the forward and dQ */
            float s[ATT_SW], dp[ATT_SW];
#pragma unroll
            for (int i = 0; i < ATT_SW; i++)
                s[i] = dp[i] = 0.0f;
            for (int dc = 0; dc < nd; dc++) {
                const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
                if (nd > 1) {
                    att_load(sK, ks + d0, R, j0, T, dn);
                    att_load(sV, vs + d0, R, j0, T, dn);
                }
                att_load(sQ, qs + d0, R, t0, T, dn);
                att_load(sdO, dos + d0, OC, t0, T, dn);
                __syncthreads(); /* also publishes sL, sD */
                for (int d = 0; d < dn; d++) {
                    const float kv = sK[r][d], vv = sV[r][d];
#pragma unroll
                    for (int i = 0; i < ATT_SW; i++) {
                        s[i] += sQ[q + 4 * i][d] * kv;
                        dp[i] += sdO[q + 4 * i][d] * vv;
                    }
                }
                __syncthreads();
            }
            /* P^T and dS^T of key row j; 0 where masked (query before j, either
             * row past T, or j before the query's document) */
#pragma unroll
            for (int i = 0; i < ATT_SW; i++) {
                const int ti = q + 4 * i, tt = t0 + ti;
                const int ok = tt >= j && tt < T && j < T && j >= sLo[ti];
                const float p = ok ? dt_expf(scale * s[i] - sL[ti]) : 0.0f;
                sPt[r][ti] = p;
                sdSt[r][ti] = ok ? dt_softmax_grad(p, dp[i], sD[ti]) : 0.0f;
            }
            /* dV += P^T dO, dK += dS^T Q, chunk by chunk: with one chunk sQ and sdO
             * still hold it (the sync after the reload, or this one, publishes sPt
             * and sdSt) */
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int c0 = g0 + c * ATT_DK;
                if (c0 >= HS)
                    break;
                if (nd > 1) {
                    att_load(sQ, qs + c0, R, t0, T, min(ATT_DK, HS - c0));
                    att_load(sdO, dos + c0, OC, t0, T, min(ATT_DK, HS - c0));
                }
                __syncthreads();
                for (int ti = 0; ti < ATT_BR; ti++) {
                    const float p = sPt[r][ti], ds = sdSt[r][ti];
#pragma unroll
                    for (int i = 0; i < ATT_CW; i++) {
                        dv[c][i] += p * sdO[ti][q + 4 * i];
                        dk[c][i] += ds * sQ[ti][q + 4 * i];
                    }
                }
                __syncthreads(); /* sQ, sdO, sPt, sdSt, sL, sD, sLo are free again */
            }
        }
    }
    if (j < T) {
        const size_t at = ((size_t)b * T + j) * R; /* dqkv16: the same places */
        float *row = dqkv + at;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS) {
                    const size_t ck = (size_t)(NH + kh) * HS + col, cv = (size_t)(NH + NKV + kh) * HS + col;
                    const float vk = scale * dk[c][i];
                    row[ck] = vk;
                    row[cv] = dv[c][i];
                    DT_STORE16(dqkv16, at + ck, vk);
                    DT_STORE16(dqkv16, at + cv, dv[c][i]);
                }
            }
    }
}

/* Chunks of accumulated columns per block (the kernels' NC) for head size HS. */
static int att_nc(int HS) { return HS <= ATT_DK ? 1 : HS <= 2 * ATT_DK ? 2 : ATT_GROUP; }

/* Grid x of a kernel with `tiles` row tiles and nc chunks per block: tiles x column
 * groups. Ends the job if it does not fit the grid (T or HS beyond any real model). */
static unsigned att_grid_x(const char *op, int tiles, int nc, int HS)
{
    const long long groups = (HS + (long long)nc * ATT_DK - 1) / ((long long)nc * ATT_DK);
    const long long x = (long long)tiles * groups;
    if (x > 0x7fffffffLL)
        cuda_fatal(op, "too many tiles for one grid (T x head size too large)");
    return (unsigned)x;
}

#endif
