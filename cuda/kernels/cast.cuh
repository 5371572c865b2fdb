/* bf16 casts, a thread per element in a grid-stride loop (grid_for(n,
 * THREADS) blocks of THREADS threads): base/ops_math.h's conversions (round
 * to nearest even, the CPU backend's bits), and CUDA's own
 * __float2bfloat16_rn for the self-test to compare with. Needs
 * cuda_bf16.h, which ops_cuda.cu includes; the emulation tests do not
 * include this file. */
#ifndef DTRAIN_CUDA_KERNELS_CAST_CUH
#define DTRAIN_CUDA_KERNELS_CAST_CUH

#include "cuda/kernels/common.cuh"

__global__ void k_cast_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    GRID_STRIDE (i, n)
        out[i] = dt_f32_to_bf16(in[i]);
}

__global__ void k_cast_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
    GRID_STRIDE (i, n)
        out[i] = dt_bf16_to_f32(in[i]);
}

/* CUDA's own conversion, for the self-test only (not in the table). */
__global__ void k_cast_f32_to_bf16_cuda(uint16_t *out, const float *in, size_t n)
{
    GRID_STRIDE (i, n)
        out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

#endif
