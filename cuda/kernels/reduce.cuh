/* Block reductions, and the sum of squares of the gradient norm.
 *
 * warp_sum, warp_max, block_sum, block_sum_n, block_max: every thread of
 * the block (of the warp) calls them and gets the result; they synchronise
 * the block.
 * k_sumsq: grid (SUMSQ_BLOCKS, vectors), THREADS threads; each vector's
 * squares summed in double into its SUMSQ_BLOCKS partial sums, which the
 * host adds in order (ops_cuda.cu's sumsq). Fixed shapes and orders
 * throughout: the results do not depend on timing. */
#ifndef DTRAIN_CUDA_KERNELS_REDUCE_CUH
#define DTRAIN_CUDA_KERNELS_REDUCE_CUH

#include "cuda/kernels/common.cuh"

#define SUMSQ_BLOCKS 128 /* fixed partial count: same bits every run */

/* ---- block reductions ---------------------------------------------------------
 * Fixed shape (warp shuffles, then one warp over the warp sums), so the
 * result does not depend on timing. Every thread gets the result. blockDim.x
 * must be a multiple of 32 and at most 1024. */
template <typename T> __device__ T warp_sum(T v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

template <typename T> __device__ T warp_max(T v)
{
    for (int o = 16; o > 0; o >>= 1) {
        T w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

template <typename T> __device__ T block_sum(T v)
{
    __shared__ T sh[32];
    __shared__ T res;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        T s = lane < nw ? sh[lane] : (T)0;
        s = warp_sum(s);
        if (lane == 0)
            res = s;
    }
    __syncthreads();
    T r = res;
    __syncthreads(); /* sh and res may be reused by the next call */
    return r;
}

/* block_sum of each of v[0..V) at once, each by block_sum's tree (warp
 * shuffles, then warp 0 over the warp sums in order), so v[i] gets the
 * bits block_sum(v[i]) would: V sums for the synchronisations of one. */
template <typename T, int V> __device__ void block_sum_n(T (&v)[V])
{
    __shared__ T sh[V][32];
    __shared__ T res[V];
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    for (int i = 0; i < V; i++)
        v[i] = warp_sum(v[i]);
    if (lane == 0)
        for (int i = 0; i < V; i++)
            sh[i][wid] = v[i];
    __syncthreads();
    if (wid == 0)
        for (int i = 0; i < V; i++) {
            T s = lane < nw ? sh[i][lane] : (T)0;
            s = warp_sum(s);
            if (lane == 0)
                res[i] = s;
        }
    __syncthreads();
    for (int i = 0; i < V; i++)
        v[i] = res[i];
    __syncthreads(); /* sh and res may be reused by the next call */
}

__device__ float block_max(float v)
{
    __shared__ float sh[32];
    __shared__ float res;
    int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = warp_max(v);
    if (lane == 0)
        sh[wid] = v;
    __syncthreads();
    if (wid == 0) {
        float s = lane < nw ? sh[lane] : -INFINITY;
        s = warp_max(s);
        if (lane == 0)
            res = s;
    }
    __syncthreads();
    float r = res;
    __syncthreads();
    return r;
}

/* Vector blockIdx.y of xs/ns: each thread sums squares of a grid-stride
 * subset in double over the SUMSQ_BLOCKS blocks of x; the block sums go
 * to part[y][blockIdx.x]; the host adds each vector's fixed SUMSQ_BLOCKS
 * partials in order. A vector's sum is the same whatever else is summed
 * beside it. */
__global__ void k_sumsq(double *part, const float *const *xs, const size_t *ns)
{
    const float *x = xs[blockIdx.y];
    const size_t n = ns[blockIdx.y];
    double s = 0.0;
    GRID_STRIDE (i, n)
        s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[(size_t)blockIdx.y * SUMSQ_BLOCKS + blockIdx.x] = s;
}

#endif
