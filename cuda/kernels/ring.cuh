/* Ring attention's blocks (context parallelism, issue 34; base/ops.h "Ring
 * attention's building blocks", att_block_t): the travelling K,V block packed
 * from the fused rows and its gradient unpacked back, the log-sum-exp merge of
 * partial results, and one block of attention forward and backward in fp32.
 *
 * Launches (cuda/ops_cuda_ring.cuh), THREADS threads for the elementwise ones:
 *   k_ring_kv_pack, k_ring_kv_unpack   grid_for(N * 2 NKV HS), one element a thread
 *   k_ring_merge                       grid_for(B NH nq), one (b, h, t) row a thread
 * and ATT_THREADS threads for the tiled ones:
 *   k_ring_fwd<NC>, k_ring_bwd_dq<NC>  grid (att_grid_x(query tiles of nq), NH, B)
 *   k_ring_bwd_dkv<NC>                 grid (att_grid_x(key tiles of nk), NKV, B)
 *
 * The tiled kernels are kernels/attention.cuh's fp32 flash kernels (its tiling,
 * quad layout, shared memory, chunking of the head dimension and column groups;
 * read its comment first) with three differences:
 *  - K and V come from the kv block [B Tk][2 NKV HS] (row stride 2 NKV HS), Q from
 *    the q heads of qkv [B Tq][(NH + 2 NKV) HS];
 *  - query tiles cover the rows [q0, q0 + nq) and key tiles start at a key run's
 *    first key, not at multiples of 32, and never pass k0 + nk;
 *  - each query row's keys are the run [lo, hi] that the CPU's ring_keys finds
 *    (src/backend/ops_cpu_ring.c) by binary search of the global key positions
 *    kpos: qdoc[t] <= kpos <= qpos[t] (no upper bound when !causal). A query
 *    tile's keys are the union of its rows' runs, found in shared memory; a
 *    tile without any is skipped (forward: out = 0, lse = -inf).
 * The backward accumulates (+=) into dq's q columns and into dkv, never writes
 * them: the ring sums every block's share. Each output element is still owned by
 * one block (dQ: a query tile of one head; dK/dV: a key tile of one KV head,
 * over the heads of its GQA group in order), sums run in fixed orders and there
 * are no atomics, so results are bit-identical run to run. They differ from the
 * CPU's by fp32 rounding (online softmax, other summation orders).
 *
 * The merge is the CPU's operation for operation (dt_lse_merge and dt_expf of
 * base/ops_math.h, then wa o + wp po per element): bit-identical where the
 * compiler contracts neither side into an FMA (the host emulation; nvcc's
 * default --fmad=true may round the last step once, within an ulp). */
#ifndef DTRAIN_CUDA_KERNELS_RING_CUH
#define DTRAIN_CUDA_KERNELS_RING_CUH

#include "base/ops.h"
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/common.cuh"

#define RING_NO_DOC (-2147483647 - 1) /* INT_MIN: a query without document start */

/* kv[n, j] = qkv[n, NH HS + j] for j < 2 NKV HS: the k and v columns of a row. */
__global__ void k_ring_kv_pack(float *kv, const float *qkv, size_t n, int OC, int KR, int R)
{
    GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)KR, j = i % (size_t)KR;
        kv[i] = qkv[row * R + OC + j];
    }
}

/* dqkv[n, NH HS + j] = (accum: += ) dkv[n, j]; the q columns untouched. */
__global__ void k_ring_kv_unpack(float *dqkv, const float *dkv, size_t n, int OC, int KR, int R, int accum)
{
    GRID_STRIDE(i, n)
    {
        const size_t row = i / (size_t)KR, j = i % (size_t)KR;
        float *d = dqkv + row * R + OC + j;
        *d = accum ? *d + dkv[i] : dkv[i];
    }
}

/* One row (b, h, t), t in [q0, q0 + nq), per thread: the CPU's cpu_attention_merge.
 * lse is read and written by the same thread, so the row's elements all see the old
 * value. */
__global__ void k_ring_merge(float *out, float *lse, const float *pout, const float *plse, int NH, int HS, int Tq,
                             int q0, int nq, size_t rows)
{
    const int OC = NH * HS;
    GRID_STRIDE(i, rows)
    {
        const int b = (int)(i / ((size_t)NH * nq)), h = (int)(i / nq % NH), t = q0 + (int)(i % nq);
        const size_t li = ((size_t)b * NH + h) * Tq + t;
        const float a = lse[li], p = plse[li], m = dt_lse_merge(a, p);
        if (m == -INFINITY)
            continue; /* neither has a key yet */
        const float wa = dt_expf(a - m), wp = dt_expf(p - m);
        float *o = out + ((size_t)b * Tq + t) * OC + (size_t)h * HS;
        const float *po = pout + ((size_t)b * Tq + t) * OC + (size_t)h * HS;
        for (int e = 0; e < HS; e++)
            o[e] = wa * o[e] + wp * po[e];
        lse[li] = m;
    }
}

/* Keys [*lo, *hi] (block indices in [k0, k0 + nk)) of a query at global position qp
 * whose document starts at qd: the CPU's ring_keys, the same binary searches.
 * *lo > *hi: none. */
static __device__ void ring_keys_dev(const int32_t *kpos, int k0, int nk, int qp, int qd, int causal, int *lo,
                                     int *hi)
{
    int a = k0, b = k0 + nk;
    while (a < b) { /* first key at or after qd */
        const int m = a + (b - a) / 2;
        if (kpos[m] < qd)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    if (!causal) {
        *hi = k0 + nk - 1;
        return;
    }
    b = k0 + nk;
    while (a < b) { /* first key after qp */
        const int m = a + (b - a) / 2;
        if (kpos[m] <= qp)
            a = m + 1;
        else
            b = m;
    }
    *hi = a - 1;
}

/* The key run of query row t of sequence b (rows outside [q0, q0 + nq): none). */
static __device__ void ring_row_keys(const att_block_t &k, const int32_t *qpos, const int32_t *kpos,
                                     const int32_t *qdoc, int b, int t, int *lo, int *hi)
{
    *lo = 1;
    *hi = 0;
    if (t < k.q0 || t >= k.q0 + k.nq)
        return;
    const int qd = qdoc ? qdoc[(size_t)b * k.Tq + t] : RING_NO_DOC;
    ring_keys_dev(kpos, k.k0, k.nk, qpos[t], qd, k.causal, lo, hi);
}

/* The union [*klo, *khi] of the runs of the ATT_BR rows in sLo, sHi (written and
 * published by the caller); *klo > *khi when no row has a key. Every thread gets
 * the same answer. */
static __device__ void ring_tile_union(const int *sLo, const int *sHi, int *klo, int *khi)
{
    int a = 0x7fffffff, z = RING_NO_DOC;
    for (int i = 0; i < ATT_BR; i++)
        if (sLo[i] <= sHi[i]) {
            a = min(a, sLo[i]);
            z = max(z, sHi[i]);
        }
    *klo = a;
    *khi = z;
}

/* Forward: one block per (query tile, column group) x head x sequence. Writes out and
 * (group 0) lse for the tile's rows in [q0, q0 + nq). */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_ring_fwd(float *out, float *lse, const float *qkv, const float *kv, const int32_t *qpos, const int32_t *kpos,
               const int32_t *qdoc, att_block_t k, float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR];  /* Q chunk of the query tile */
    __shared__ att_chunk_t sKV[ATT_BC]; /* K chunk of the key tile, then its V chunk */
    __shared__ float sP[ATT_BR][ATT_BC + 1];
    __shared__ int sLo[ATT_BR], sHi[ATT_BR];
    const int NH = k.NH, NKV = k.NKV, HS = k.HS;
    const int nqt = (k.nq + ATT_BR - 1) / ATT_BR;
    const int qt = (int)(blockIdx.x % (unsigned)nqt);
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int qend = k.q0 + k.nq, kend = k.k0 + k.nk;
    const int t0 = k.q0 + qt * ATT_BR, t = t0 + r; /* this quad's query row */
    const float *qs = qkv + (size_t)b * k.Tq * R + (size_t)h * HS;
    const float *ks = kv + (size_t)b * k.Tk * KR + (size_t)kh * HS, *vs = kv + (size_t)b * k.Tk * KR + (size_t)(NKV + kh) * HS;
    int lo, hi, klo, khi;
    ring_row_keys(k, qpos, kpos, qdoc, b, t, &lo, &hi);
    if (q == 0) {
        sLo[r] = lo;
        sHi[r] = hi;
    }
    __syncthreads();
    ring_tile_union(sLo, sHi, &klo, &khi);

    float m = -INFINITY, l = 0.0f, acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1)
        att_load(sQ, qs, R, t0, qend, HS);

    for (int j0 = klo; j0 <= khi; j0 += ATT_BC) {
        float s[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1)
                att_load(sQ, qs + d0, R, t0, qend, dn);
            att_load(sKV, ks + d0, KR, j0, kend, dn);
            __syncthreads();
            for (int d = 0; d < dn; d++) {
                const float qv = sQ[r][d];
#pragma unroll
                for (int i = 0; i < ATT_SW; i++)
                    s[i] += qv * sKV[q + 4 * i][d];
            }
            __syncthreads(); /* sQ and sKV are free again */
        }
        /* online softmax update of row t over its keys [lo, hi] */
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            s[i] = j >= lo && j <= hi ? scale * s[i] : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        const float mnew = fmaxf(m, quad_max(mx));
        const float alpha = mnew == -INFINITY ? 1.0f : dt_expf(m - mnew);
        float psum = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const float p = s[i] == -INFINITY ? 0.0f : dt_expf(s[i] - mnew);
            sP[r][q + 4 * i] = p;
            psum += p;
        }
        l = l * alpha + quad_sum(psum);
        m = mnew;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            att_load(sKV, vs + c0, KR, j0, kend, min(ATT_DK, HS - c0));
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
    if (t < qend) {
        /* a row without a key in this block: out = 0, lse = -inf (the contract) */
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        float *o = out + ((size_t)b * k.Tq + t) * OC + (size_t)h * HS;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS)
                    o[col] = l > 0.0f ? acc[c][i] * inv : 0.0f;
            }
        if (g0 == 0 && q == 0)
            lse[((size_t)b * NH + h) * k.Tq + t] = l > 0.0f ? m + logf(l) : -INFINITY;
    }
}

/* dQ: one block per (query tile, column group) x head x sequence. Adds to the q
 * columns of the group of dqkv for the tile's rows (a tile without keys: untouched). */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_ring_bwd_dq(float *dqkv, const float *dout, const float *qkv, const float *kv, const float *out,
                  const float *lse, const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, att_block_t k,
                  float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ float sdS[ATT_BR][ATT_BC + 1];
    __shared__ int sLo[ATT_BR], sHi[ATT_BR];
    const int NH = k.NH, NKV = k.NKV, HS = k.HS;
    const int nqt = (k.nq + ATT_BR - 1) / ATT_BR;
    const int qt = (int)(blockIdx.x % (unsigned)nqt);
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int qend = k.q0 + k.nq, kend = k.k0 + k.nk;
    const int t0 = k.q0 + qt * ATT_BR, t = t0 + r;
    const float *qs = qkv + (size_t)b * k.Tq * R + (size_t)h * HS;
    const float *ks = kv + (size_t)b * k.Tk * KR + (size_t)kh * HS, *vs = kv + (size_t)b * k.Tk * KR + (size_t)(NKV + kh) * HS;
    const float *dos = dout + (size_t)b * k.Tq * OC + (size_t)h * HS, *os = out + (size_t)b * k.Tq * OC + (size_t)h * HS;
    int lo, hi, klo, khi;
    ring_row_keys(k, qpos, kpos, qdoc, b, t, &lo, &hi);
    if (q == 0) {
        sLo[r] = lo;
        sHi[r] = hi;
    }
    __syncthreads();
    ring_tile_union(sLo, sHi, &klo, &khi);
    if (klo > khi)
        return; /* the whole block: no row of the tile sees a key */
    const float L = t < qend ? lse[((size_t)b * NH + h) * k.Tq + t] : 0.0f;
    const size_t orow = (size_t)(t < qend ? t : 0) * OC;
    const float D = att_quad_dot(dos + orow, os + orow, t < qend ? HS : 0, q);

    float acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sQ, qs, R, t0, qend, HS);
        att_load(sdO, dos, OC, t0, qend, HS);
    }

    for (int j0 = klo; j0 <= khi; j0 += ATT_BC) {
        float s[ATT_SW], dp[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = dp[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1) {
                att_load(sQ, qs + d0, R, t0, qend, dn);
                att_load(sdO, dos + d0, OC, t0, qend, dn);
            }
            att_load(sK, ks + d0, KR, j0, kend, dn);
            att_load(sV, vs + d0, KR, j0, kend, dn);
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
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            const int ok = j >= lo && j <= hi;
            const float p = ok ? dt_expf(scale * s[i] - L) : 0.0f;
            sdS[r][q + 4 * i] = ok ? dt_softmax_grad(p, dp[i], D) : 0.0f;
        }
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            if (nd > 1)
                att_load(sK, ks + c0, KR, j0, kend, min(ATT_DK, HS - c0));
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
    if (t < qend) {
        float *dq = dqkv + ((size_t)b * k.Tq + t) * R + (size_t)h * HS;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS)
                    dq[col] += scale * acc[c][i];
            }
    }
}

/* dK, dV: one block per (key tile, column group) x KV head x sequence, over the query
 * heads of the group in order and the query tiles of [q0, q0 + nq) whose rows' runs
 * meet the key tile. The quad of tile row r owns key row j = j0 + r; its score lanes
 * are the query rows t0 + q + 4i. Adds to the group's columns of dkv's k and v. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_ring_bwd_dkv(float *dkv, const float *dout, const float *qkv, const float *kv, const float *out,
                   const float *lse, const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, att_block_t k,
                   float scale)
{
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ float sPt[ATT_BC][ATT_BR + 1];       /* P^T: [key row][query row] */
    __shared__ float sdSt[ATT_BC][ATT_BR + 1];      /* dS^T */
    __shared__ float sL[ATT_BR], sD[ATT_BR];        /* the query tile's lse and D */
    __shared__ int sLo[ATT_BR], sHi[ATT_BR];        /* and its rows' key runs */
    const int NH = k.NH, NKV = k.NKV, HS = k.HS, grp = NH / NKV;
    const int nkt = (k.nk + ATT_BC - 1) / ATT_BC, nqt = (k.nq + ATT_BR - 1) / ATT_BR;
    const int kt = (int)(blockIdx.x % (unsigned)nkt);
    const int g0 = (int)(blockIdx.x / (unsigned)nkt) * NC * ATT_DK;
    const int kh = blockIdx.y, b = blockIdx.z;
    const int R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int qend = k.q0 + k.nq, kend = k.k0 + k.nk;
    const int j0 = k.k0 + kt * ATT_BC, j = j0 + r, jlast = min(j0 + ATT_BC, kend) - 1;
    const float *ks = kv + (size_t)b * k.Tk * KR + (size_t)kh * HS, *vs = kv + (size_t)b * k.Tk * KR + (size_t)(NKV + kh) * HS;

    float dk[NC][ATT_CW], dv[NC][ATT_CW];
    int touched = 0; /* some query tile met the key tile: dkv is added to */
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            dk[c][i] = dv[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sK, ks, KR, j0, kend, HS);
        att_load(sV, vs, KR, j0, kend, HS);
    }

    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        const float *qs = qkv + (size_t)b * k.Tq * R + (size_t)h * HS;
        const float *dos = dout + (size_t)b * k.Tq * OC + (size_t)h * HS,
                    *os = out + (size_t)b * k.Tq * OC + (size_t)h * HS;
        const float *lrow = lse + ((size_t)b * NH + h) * k.Tq;
        for (int qt = 0; qt < nqt; qt++) {
            const int t0 = k.q0 + qt * ATT_BR;
            { /* lse, D and key run of query row t0 + r */
                const int tr = t0 + r;
                int lo, hi;
                ring_row_keys(k, qpos, kpos, qdoc, b, tr, &lo, &hi);
                const size_t orow = (size_t)(tr < qend ? tr : 0) * OC;
                const float D = att_quad_dot(dos + orow, os + orow, tr < qend ? HS : 0, q);
                if (q == 0) {
                    sD[r] = D;
                    sL[r] = tr < qend ? lrow[tr] : 0.0f;
                    sLo[r] = lo;
                    sHi[r] = hi;
                }
            }
            __syncthreads(); /* publishes sL, sD, sLo, sHi */
            int meets = 0; /* does any row's run meet [j0, jlast]? (the same for every thread) */
            for (int i = 0; i < ATT_BR; i++)
                meets |= max(sLo[i], j0) <= min(sHi[i], jlast);
            if (!meets) {
                __syncthreads(); /* every thread has read sLo, sHi */
                continue;
            }
            touched = 1;
            float s[ATT_SW], dp[ATT_SW];
#pragma unroll
            for (int i = 0; i < ATT_SW; i++)
                s[i] = dp[i] = 0.0f;
            for (int dc = 0; dc < nd; dc++) {
                const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
                if (nd > 1) {
                    att_load(sK, ks + d0, KR, j0, kend, dn);
                    att_load(sV, vs + d0, KR, j0, kend, dn);
                }
                att_load(sQ, qs + d0, R, t0, qend, dn);
                att_load(sdO, dos + d0, OC, t0, qend, dn);
                __syncthreads();
                for (int d = 0; d < dn; d++) {
                    const float kvv = sK[r][d], vv = sV[r][d];
#pragma unroll
                    for (int i = 0; i < ATT_SW; i++) {
                        s[i] += sQ[q + 4 * i][d] * kvv;
                        dp[i] += sdO[q + 4 * i][d] * vv;
                    }
                }
                __syncthreads();
            }
            /* P^T and dS^T of key row j; 0 outside query row's run (which also
             * covers rows and keys past the block's ends) */
#pragma unroll
            for (int i = 0; i < ATT_SW; i++) {
                const int ti = q + 4 * i;
                const int ok = j >= sLo[ti] && j <= sHi[ti];
                const float p = ok ? dt_expf(scale * s[i] - sL[ti]) : 0.0f;
                sPt[r][ti] = p;
                sdSt[r][ti] = ok ? dt_softmax_grad(p, dp[i], sD[ti]) : 0.0f;
            }
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int c0 = g0 + c * ATT_DK;
                if (c0 >= HS)
                    break;
                if (nd > 1) {
                    att_load(sQ, qs + c0, R, t0, qend, min(ATT_DK, HS - c0));
                    att_load(sdO, dos + c0, OC, t0, qend, min(ATT_DK, HS - c0));
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
                __syncthreads(); /* sQ, sdO, sPt, sdSt, sL, sD, sLo, sHi are free again */
            }
        }
    }
    if (touched && j < kend) { /* a key tile no query sees: untouched, as on the CPU */
        float *row = dkv + ((size_t)b * k.Tk + j) * KR;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS) {
                    row[(size_t)kh * HS + col] += scale * dk[c][i];
                    row[(size_t)(NKV + kh) * HS + col] += dv[c][i];
                }
            }
    }
}

#endif
