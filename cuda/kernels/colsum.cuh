/* Column reductions: the sum over the N rows of an [N, C] matrix per
 * column, in chunks of rows (the scheme below). k_colsum_part writes each
 * chunk's sums, grid (ceil(C / THREADS), col_chunks(N)) of THREADS
 * threads, a thread per column (the norms' backward, kernels/norm.cuh,
 * writes the same sums a block per chunk, inside its pass for dx);
 * k_colsum_fold writes or adds (accum) the sum of the chunks, grid
 * ceil(C / THREADS). The partial-sum buffer and the launches are host code
 * (cuda/ops_cuda_state.cuh's col_part_room, cuda/ops_cuda_gemm.cuh's
 * colsum, ops_cuda.cu's norm wrappers). */
#ifndef DTRAIN_CUDA_KERNELS_COLSUM_CUH
#define DTRAIN_CUDA_KERNELS_COLSUM_CUH

#include "cuda/kernels/common.cuh"

/* ---- column reductions ------------------------------------------------------------
 * Sums over the N rows of an [N, C] matrix per column (bias gradients, the
 * norms' weight and bias gradients). A thread per column alone would give
 * C/256 blocks (3 for C = 768 on a 132-SM GPU), each thread reading N rows
 * one after another: latency-bound at ~1 ms per call for N = 16K. So the
 * rows are cut into chunks of col_rows(N): k_*_part writes each chunk's
 * sum per column (rows in order) into part[chunk, C], a block row per
 * chunk, and k_colsum_fold adds the chunks in order. The shape depends on
 * N only, so the bits are the same every run; they equal the CPU's (rows
 * summed in order) when N fits one chunk, and differ from it by summation
 * order beyond. */

#define COL_ROWS 128 /* rows per chunk of the column reductions */

/* Rows per chunk for N rows: COL_ROWS, or more where the chunks would
 * overflow gridDim.y. */
static int col_rows(int N)
{
    const int min_rows = (int)(((long long)N + 65534) / 65535);
    return min_rows > COL_ROWS ? min_rows : COL_ROWS;
}

static int col_chunks(int N) { return N > 0 ? (N + col_rows(N) - 1) / col_rows(N) : 0; }

/* part[k, c] = sum over rows n of chunk k (in order) of x[n, c] */
__global__ void k_colsum_part(float *part, const float *x, int N, int C, int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float a = 0.0f;
    for (int n = n0; n < n1; n++)
        a += x[(size_t)n * C + c];
    part[(size_t)blockIdx.y * C + c] = a;
}

/* out[c] (=|+= by accum) sum over chunks k (in order) of part[k, c] */
__global__ void k_colsum_fold(float *out, const float *part, int nk, int C, int accum)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float a = 0.0f;
    for (int k = 0; k < nk; k++)
        a += part[(size_t)k * C + c];
    out[c] = accum ? out[c] + a : a;
}

#endif
