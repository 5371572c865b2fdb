/* LayerNorm and RMSNorm.
 *
 * Forward and input gradient: one block per row (grid N, THREADS threads),
 * the row's sums by block_sum. The forward writes out and the per-row
 * rstd (and LayerNorm's mean), which the backward reads; k_*_bwd_dx adds
 * into din (+=, as base/ops.h has it: the residual stream's gradient is
 * already there). The weight (and LayerNorm bias) gradients are column
 * reductions (kernels/colsum.cuh): k_*_bwd_dw_part writes each chunk's
 * partial sums, grid (ceil(C / THREADS), col_chunks(N)), a thread per
 * column; k_colsum_fold then writes or adds them (accum_dw). The formulas
 * per element are base/ops_math.h's. */
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

/* din += dx, and din16 (DT_STORE16) the sum */
__global__ void k_layernorm_bwd_dx(float *din, uint16_t *din16, const float *dout, const float *x, const float *w,
                                   const float *mean, const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
    uint16_t *d16 = din16 ? din16 + off : NULL;
    float mu = mean[blockIdx.x], r = rstd[blockIdx.x];
    float sg = 0.0f, sgx = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float gw = gr[c] * w[c];
        sg += gw;
        sgx += gw * (xr[c] - mu) * r;
    }
    sg = block_sum(sg) / (float)C;
    sgx = block_sum(sgx) / (float)C;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xhat = (xr[c] - mu) * r;
        d[c] += dt_layernorm_dx(gr[c], w[c], xhat, sg, sgx, r);
        DT_STORE16(d16, c, d[c]);
    }
}

/* The partial sums of dw[c] = sum_n dout * xhat and db[c] = sum_n dout
 * over chunk blockIdx.y of `rows` rows (see the column reductions):
 * pw[k, c] and pb[k, c]. */
__global__ void k_layernorm_bwd_dw_part(float *pw, float *pb, const float *dout, const float *x, const float *mean,
                                        const float *rstd, int N, int C, int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float aw = 0.0f, ab = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * (x[i] - mean[n]) * rstd[n];
        ab += dout[i];
    }
    pw[(size_t)blockIdx.y * C + c] = aw;
    pb[(size_t)blockIdx.y * C + c] = ab;
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

__global__ void k_rmsnorm_bwd_dx(float *din, uint16_t *din16, const float *dout, const float *x, const float *w,
                                 const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
    uint16_t *d16 = din16 ? din16 + off : NULL;
    float r = rstd[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += w[c] * gr[c] * xr[c];
    float k = dt_rmsnorm_k(r, block_sum(s), C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        d[c] += dt_rmsnorm_dx(r, w[c], gr[c], xr[c], k);
        DT_STORE16(d16, c, d[c]);
    }
}

/* The partial sums of dw[c] = sum_n dout * x * rstd over chunk blockIdx.y
 * of `rows` rows (see the column reductions): pw[k, c]. */
__global__ void k_rmsnorm_bwd_dw_part(float *pw, const float *dout, const float *x, const float *rstd, int N, int C,
                                      int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float aw = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * x[i] * rstd[n];
    }
    pw[(size_t)blockIdx.y * C + c] = aw;
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
