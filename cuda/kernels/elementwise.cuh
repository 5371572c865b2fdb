/* Elementwise kernels: the bias rows and separate GELU of the matmuls,
 * SwiGLU, add, scale and the AdamW update. A thread per element in a
 * grid-stride loop (GRID_STRIDE), so any grid covers n: the wrappers
 * launch grid_for(n, THREADS) blocks of THREADS threads. Outputs are
 * written (=), not accumulated, and may be an input element for element
 * (the matmuls' k_gelu_bwd(din, pre, din, ...)); k_adamw updates p, m and
 * v in place. The arithmetic per element is base/ops_math.h's. */
#ifndef DTRAIN_CUDA_KERNELS_ELEMENTWISE_CUH
#define DTRAIN_CUDA_KERNELS_ELEMENTWISE_CUH

#include "cuda/kernels/common.cuh"

/* ---- elementwise kernels ------------------------------------------------------------ */

__global__ void k_fill_rows(float *out, const float *b, int N, int OC)
{
    size_t n = (size_t)N * OC;
    GRID_STRIDE (i, n)
        out[i] = b ? b[i % (size_t)OC] : 0.0f;
}

/* out (NULL: not wanted) and out16 (DT_STORE16) = gelu(x) */
__global__ void k_gelu_fwd(float *out, uint16_t *out16, const float *x, size_t n)
{
    GRID_STRIDE (i, n) {
        const float v = dt_gelu(x[i]);
        if (out)
            out[i] = v;
        DT_STORE16(out16, i, v);
    }
}

/* dx and dx16 (DT_STORE16) = dout gelu'(x); dx may be dout (in place) */
__global__ void k_gelu_bwd(float *dx, uint16_t *dx16, const float *x, const float *dout, size_t n)
{
    GRID_STRIDE (i, n) {
        const float v = dout[i] * dt_gelu_grad(x[i]);
        dx[i] = v;
        DT_STORE16(dx16, i, v);
    }
}

/* out[N,F] (NULL: not wanted) and out16 = silu(gate) up of gu[N,2F] */
__global__ void k_swiglu_fwd(float *out, uint16_t *out16, const float *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    GRID_STRIDE (i, n) {
        size_t r = i / (size_t)F, f = i % (size_t)F;
        const float *gr = gu + r * 2 * (size_t)F;
        const float v = dt_silu(gr[f]) * gr[F + f];
        if (out)
            out[i] = v;
        DT_STORE16(out16, i, v);
    }
}

/* dgu[N,2F] and dgu16 (DT_STORE16) */
__global__ void k_swiglu_bwd(float *dgu, uint16_t *dgu16, const float *gu, const float *dout, int N, int F)
{
    size_t n = (size_t)N * F;
    GRID_STRIDE (i, n) {
        size_t r = i / (size_t)F, f = i % (size_t)F;
        const float *gr = gu + r * 2 * (size_t)F;
        float *dr = dgu + r * 2 * (size_t)F;
        float dg, du;
        dt_swiglu_grad(gr[f], gr[F + f], dout[i], &dg, &du);
        dr[f] = dg;
        dr[F + f] = du;
        DT_STORE16(dgu16, r * 2 * (size_t)F + f, dg);
        DT_STORE16(dgu16, r * 2 * (size_t)F + F + f, du);
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE (i, n)
        out[i] = a[i] + b[i];
}

__global__ void k_scale(float *x, float s, size_t n)
{
    GRID_STRIDE (i, n)
        x[i] *= s;
}

__global__ void k_adamw(float *p, uint16_t *p16, const float *gr, float *m, float *v, size_t n, dt_adamw_coef_t k)
{
    GRID_STRIDE (i, n) {
        dt_adamw_update(&p[i], &m[i], &v[i], gr[i], &k);
        if (p16)
            p16[i] = dt_f32_to_bf16(p[i]);
    }
}

#endif
