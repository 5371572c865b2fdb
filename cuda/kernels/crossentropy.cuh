/* Vocabulary-parallel cross-entropy: the three passes of base/ops.h's
 * xent_max, xent_sumexp and xent_finish, one block per row (grid N,
 * THREADS threads). This rank holds columns v0 .. v0 + Vl - 1 of each row
 * of logits (row stride ld, columns Vl .. ld - 1 padding); the caller
 * reduces rowmax (max) and stats (sum) over the ranks between the passes.
 * Row reductions by block_max and block_sum (the sum of exps in double);
 * the formulas are base/ops_math.h's. expbuf may alias logits; passed to
 * k_xent_finish as dlogits, it becomes the gradient in place. */
#ifndef DTRAIN_CUDA_KERNELS_CROSSENTROPY_CUH
#define DTRAIN_CUDA_KERNELS_CROSSENTROPY_CUH

#include "cuda/kernels/reduce.cuh"

__global__ void k_xent_max(float *rowmax, const float *logits, int Vl, int ld)
{
    const float *x = logits + (size_t)blockIdx.x * ld;
    float m = -INFINITY;
    for (int i = threadIdx.x; i < Vl; i += blockDim.x)
        m = x[i] > m ? x[i] : m;
    m = block_max(m);
    if (threadIdx.x == 0)
        rowmax[blockIdx.x] = m;
}

__global__ void k_xent_sumexp(float *stats, float *expbuf, const float *logits, const float *rowmax,
                              const int32_t *targets, int v0, int Vl, int ld)
{
    const size_t n = blockIdx.x;
    const float *x = logits + n * ld;
    float *e = expbuf ? expbuf + n * ld : NULL;
    /* the target logit is read before any thread overwrites it (expbuf may
     * alias logits) */
    if (threadIdx.x == 0) {
        int r = targets[n] - v0;
        stats[2 * n + 1] = targets[n] >= 0 && r >= 0 && r < Vl ? x[r] : 0.0f;
    }
    __syncthreads();
    const float mx = rowmax[n];
    double s = 0.0;
    for (int i = threadIdx.x; i < Vl; i += blockDim.x) {
        float v = dt_expf(x[i] - mx);
        if (e)
            e[i] = v;
        s += v;
    }
    s = block_sum(s);
    if (threadIdx.x == 0)
        stats[2 * n] = (float)s;
}

/* dlogits16 (DT_STORE16; only with dlogits): the finished row's bf16, in
 * a last pass over it once thread 0's target correction is in */
__global__ void k_xent_finish(float *losses, float *dlogits, uint16_t *dlogits16, const float *rowmax,
                              const float *stats, const int32_t *targets, int v0, int Vl, int ld, float dloss)
{
    uint16_t *d16 = dlogits && dlogits16 ? dlogits16 + blockIdx.x * (size_t)ld : NULL;
    const size_t n = blockIdx.x;
    float *d = dlogits ? dlogits + n * ld : NULL;
    const double sum = stats[2 * n];
    if (targets[n] < 0) {
        if (threadIdx.x == 0)
            losses[n] = 0.0f;
        if (d)
            for (int i = threadIdx.x; i < ld; i += blockDim.x) {
                d[i] = 0.0f;
                DT_STORE16(d16, i, 0.0f);
            }
        return;
    }
    if (threadIdx.x == 0)
        losses[n] = dt_xent_loss(rowmax[n], sum, stats[2 * n + 1]);
    if (!d)
        return;
    float k = dt_xent_gscale(dloss, sum);
    for (int i = threadIdx.x; i < ld; i += blockDim.x)
        d[i] = i < Vl ? d[i] * k : 0.0f;
    __syncthreads();
    int r = targets[n] - v0;
    if (threadIdx.x == 0 && r >= 0 && r < Vl)
        d[r] -= dloss;
    if (!d16)
        return;
    __syncthreads(); /* d[r] final */
    for (int i = threadIdx.x; i < ld; i += blockDim.x)
        DT_STORE16(d16, i, d[i]);
}

#endif
