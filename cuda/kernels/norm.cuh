/* LayerNorm and RMSNorm.
 *
 * Forward: one block per row (grid N, THREADS threads), the row's sums by
 * block_sum; it writes out and the per-row rstd (and LayerNorm's mean),
 * which the backward reads.
 *
 * Backward: one pass over [N, C]. k_*_bwd takes the column reductions'
 * chunks of rows (kernels/colsum.cuh: grid col_chunks(N), `rows` =
 * col_rows(N) rows a block, THREADS threads) and, NORM_STEP rows at a time,
 *  - sums each row as one block per row would (thread t over columns t,
 *    t + THREADS, ... in order, then block_sum's tree; block_sum_n does
 *    the step's rows at once), and adds dx into din (+=, as base/ops.h has
 *    it: the residual stream's gradient is already there), and din16;
 *  - adds the same rows' dout * xhat (and dout: LayerNorm's db) into its
 *    columns' partial sums pw[chunk, c] (pb), rows in order, the sums a
 *    thread per column over the chunk would make.
 * The second read of a step's rows (dx after the row sums) comes from the
 * cache. k_colsum_fold then writes or adds the chunks' sums (accum_dw), a
 * pass over [chunks, C]. Before this kernel the backward was a kernel per
 * row (dx) and a second full read of dout and x for the partial sums: the
 * bits of dx, of the partials and so of dw and db are those of that pair
 * (test/emu/test_kernels_emu.cpp keeps it and compares bit for bit).
 * din NULL: only the partial sums; pw NULL: only dx. The formulas per
 * element are base/ops_math.h's. */
#ifndef DTRAIN_CUDA_KERNELS_NORM_CUH
#define DTRAIN_CUDA_KERNELS_NORM_CUH

#include "cuda/kernels/colsum.cuh"
#include "cuda/kernels/reduce.cuh"

/* out (NULL: not wanted) and out16 (DT_STORE16) */
__global__ void k_layernorm_fwd(float *out, uint16_t *out16, float *mean, float *rstd, const float *x, const float *w,
                                const float *b, int C, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * C;
    float *o = out ? out + (size_t)blockIdx.x * C : NULL;
    uint16_t *o16 = out16 ? out16 + (size_t)blockIdx.x * C : NULL;
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += xr[c];
    float mu = block_sum(s) / (float)C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float d = xr[c] - mu;
        ss += d * d;
    }
    float r = dt_norm_rstd(block_sum(ss), C, eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = dt_layernorm_out(xr[c], mu, r, w[c], b[c]);
        if (o)
            o[c] = v;
        DT_STORE16(o16, c, v);
    }
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = r;
    }
}

/* Rows per step of the backward kernels: the step's loads are in flight
 * together and its row sums share one block reduction. */
#define NORM_STEP 8

/* Over rows [blockIdx.x * rows, min(N, (blockIdx.x + 1) * rows)):
 * din += dx (din16 its bf16) and, with pw, pw[blockIdx.x, c] = the sum
 * over those rows of dout * xhat, pb[blockIdx.x, c] of dout (see above). */
__global__ void k_layernorm_bwd(float *din, uint16_t *din16, float *pw, float *pb, const float *dout, const float *x,
                                const float *w, const float *mean, const float *rstd, int N, int C, int rows)
{
    const int n0 = blockIdx.x * rows, n1 = min(N, n0 + rows);
    for (int n = n0; n < n1; n += NORM_STEP) {
        const int nr = min(NORM_STEP, n1 - n);
        float mu[NORM_STEP], rs[NORM_STEP], sums[2 * NORM_STEP]; /* sums: sg of each row, then sgx */
#pragma unroll
        for (int r = 0; r < NORM_STEP; r++) {
            mu[r] = r < nr ? mean[n + r] : 0.0f;
            rs[r] = r < nr ? rstd[n + r] : 0.0f;
            sums[r] = sums[NORM_STEP + r] = 0.0f;
        }
        if (din) {
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                const float wc = w[c];
#pragma unroll
                for (int r = 0; r < NORM_STEP; r++) {
                    if (r >= nr) /* the chunk ends within the step */
                        break;
                    const size_t i = (size_t)(n + r) * C + c;
                    const float gw = dout[i] * wc;
                    sums[r] += gw;
                    sums[NORM_STEP + r] += gw * (x[i] - mu[r]) * rs[r];
                }
            }
            block_sum_n(sums);
#pragma unroll
            for (int r = 0; r < 2 * NORM_STEP; r++)
                sums[r] /= (float)C;
        }
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float wc = w[c];
            const size_t p = (size_t)blockIdx.x * C + c;
            float aw = 0.0f, ab = 0.0f;
            if (pw && n > n0) {
                aw = pw[p];
                ab = pb[p];
            }
#pragma unroll
            for (int r = 0; r < NORM_STEP; r++) {
                if (r >= nr) /* the chunk ends within the step */
                    break;
                const size_t i = (size_t)(n + r) * C + c;
                const float g = dout[i], xv = x[i];
                if (din) {
                    const float xhat = (xv - mu[r]) * rs[r];
                    const float v = din[i] + dt_layernorm_dx(g, wc, xhat, sums[r], sums[NORM_STEP + r], rs[r]);
                    din[i] = v;
                    DT_STORE16(din16, i, v);
                }
                aw += g * (xv - mu[r]) * rs[r];
                ab += g;
            }
            if (pw) {
                pw[p] = aw;
                pb[p] = ab;
            }
        }
    }
}

__global__ void k_rmsnorm_fwd(float *out, uint16_t *out16, float *rstd, const float *x, const float *w, int C,
                              float eps)
{
    const float *xr = x + (size_t)blockIdx.x * C;
    float *o = out ? out + (size_t)blockIdx.x * C : NULL;
    uint16_t *o16 = out16 ? out16 + (size_t)blockIdx.x * C : NULL;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += xr[c] * xr[c];
    float r = dt_norm_rstd(block_sum(ss), C, eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const float v = xr[c] * r * w[c];
        if (o)
            o[c] = v;
        DT_STORE16(o16, c, v);
    }
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
}

/* As k_layernorm_bwd: din += dx (din16) and, with pw,
 * pw[blockIdx.x, c] = sum over the block's rows of dout * x * rstd. */
__global__ void k_rmsnorm_bwd(float *din, uint16_t *din16, float *pw, const float *dout, const float *x, const float *w,
                              const float *rstd, int N, int C, int rows)
{
    const int n0 = blockIdx.x * rows, n1 = min(N, n0 + rows);
    for (int n = n0; n < n1; n += NORM_STEP) {
        const int nr = min(NORM_STEP, n1 - n);
        float rs[NORM_STEP], k[NORM_STEP];
#pragma unroll
        for (int r = 0; r < NORM_STEP; r++) {
            rs[r] = r < nr ? rstd[n + r] : 0.0f;
            k[r] = 0.0f;
        }
        if (din) {
            for (int c = threadIdx.x; c < C; c += blockDim.x) {
                const float wc = w[c];
#pragma unroll
                for (int r = 0; r < NORM_STEP; r++) {
                    if (r >= nr) /* the chunk ends within the step */
                        break;
                    const size_t i = (size_t)(n + r) * C + c;
                    k[r] += wc * dout[i] * x[i];
                }
            }
            block_sum_n(k);
#pragma unroll
            for (int r = 0; r < NORM_STEP; r++)
                k[r] = dt_rmsnorm_k(rs[r], k[r], C);
        }
        for (int c = threadIdx.x; c < C; c += blockDim.x) {
            const float wc = w[c];
            const size_t p = (size_t)blockIdx.x * C + c;
            float aw = pw && n > n0 ? pw[p] : 0.0f;
#pragma unroll
            for (int r = 0; r < NORM_STEP; r++) {
                if (r >= nr) /* the chunk ends within the step */
                    break;
                const size_t i = (size_t)(n + r) * C + c;
                const float g = dout[i], xv = x[i];
                if (din) {
                    const float v = din[i] + dt_rmsnorm_dx(rs[r], wc, g, xv, k[r]);
                    din[i] = v;
                    DT_STORE16(din16, i, v);
                }
                aw += g * xv * rs[r];
            }
            if (pw)
                pw[p] = aw;
        }
    }
}

/* Qwen3's per-head q/k norms (ops qknorm_fwd/_bwd): one block per (row n,
 * q or k head h), blockIdx.x = n * nqk + h, nqk = NH + NKV; the head's HS
 * values lie at qkv + n * R + h * HS, R = (NH + 2 NKV) * HS. */
__global__ void k_qknorm_fwd(float *qkv, float *xin, float *rstd, const float *wq, const float *wk, int NH, int nqk,
                             int R, int HS, float eps)
{
    const int n = blockIdx.x / nqk, h = blockIdx.x % nqk;
    float *x = qkv + (size_t)n * R + (size_t)h * HS, *xs = xin + (size_t)blockIdx.x * HS;
    const float *w = h < NH ? wq : wk;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < HS; c += blockDim.x)
        ss += x[c] * x[c];
    float r = dt_norm_rstd(block_sum(ss), HS, eps);
    for (int c = threadIdx.x; c < HS; c += blockDim.x) {
        xs[c] = x[c];
        x[c] = x[c] * r * w[c];
    }
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
}

/* dx over g in place: each thread reads and writes only its own columns,
 * and block_sum has every thread's reads done before any write. */
__global__ void k_qknorm_bwd_dx(float *dqkv, const float *xin, const float *wq, const float *wk, const float *rstd,
                                int NH, int nqk, int R, int HS)
{
    const int n = blockIdx.x / nqk, h = blockIdx.x % nqk;
    float *g = dqkv + (size_t)n * R + (size_t)h * HS;
    const float *x = xin + (size_t)blockIdx.x * HS, *w = h < NH ? wq : wk;
    const float r = rstd[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < HS; c += blockDim.x)
        s += w[c] * g[c] * x[c];
    float k = dt_rmsnorm_k(r, block_sum(s), HS);
    for (int c = threadIdx.x; c < HS; c += blockDim.x)
        g[c] = dt_rmsnorm_dx(r, w[c], g[c], x[c], k);
}

/* Partial sums of dwq (blockIdx.z = 0: heads [0, NH)) or dwk (1: heads
 * [NH, nqk)) over chunk blockIdx.y of `rows` rows, all its heads:
 * pw[z][k][c] for the column reductions (k_colsum_fold). */
__global__ void k_qknorm_dw_part(float *pw, const float *dqkv, const float *xin, const float *rstd, int N, int NH,
                                 int nqk, int R, int HS, int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= HS)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    const int h0 = blockIdx.z ? NH : 0, h1 = blockIdx.z ? nqk : NH;
    float a = 0.0f;
    for (int n = n0; n < n1; n++)
        for (int h = h0; h < h1; h++) {
            const size_t i = (size_t)n * nqk + h;
            a += dqkv[(size_t)n * R + (size_t)h * HS + c] * xin[i * HS + c] * rstd[i];
        }
    pw[((size_t)blockIdx.z * gridDim.y + blockIdx.y) * HS + c] = a;
}

#endif
