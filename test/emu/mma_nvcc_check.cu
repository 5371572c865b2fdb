/* nvcc compiles the warp kernels that test_mma_emu runs in the host
 * emulation and the tensor-core attention forward and backward
 * (attention_mma.cuh, attention_mma_bwd.cuh) that test_att_mma_emu and
 * test_att_mma_bwd_emu run, and with them every primitive of
 * cuda/kernels/mma.cuh, for the configured architectures (NVCCFLAGS: sm_80
 * and sm_90 SASS, so ptxas assembles the inline PTX too), warnings as
 * errors. Built on CUDA builds by make check; compile-only (no GPU needed):
 * the object is never linked. */
#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/attention_mma_bwd.cuh"
#include "test/emu/mma_test_kernels.cuh"

template __global__ void k_cp_async_tile<64>(uint16_t *, uint16_t *, const uint16_t *, const uint16_t *, unsigned,
                                             unsigned, unsigned);
template __global__ void k_cp_async_tile<128>(uint16_t *, uint16_t *, const uint16_t *, const uint16_t *, unsigned,
                                              unsigned, unsigned);
template __global__ void k_att_fwd_mma<64>(float *, uint16_t *, float *, const uint16_t *, const int32_t *, int, int,
                                           int, float);
template __global__ void k_att_fwd_mma<128>(float *, uint16_t *, float *, const uint16_t *, const int32_t *, int, int,
                                            int, float);
template __global__ void k_att_bwd_dot<64>(float *, uint16_t *, uint16_t *, const float *, const float *, const float *,
                                           int, int, int, int);
template __global__ void k_att_bwd_dot<128>(float *, uint16_t *, uint16_t *, const float *, const float *,
                                            const float *, int, int, int, int);
template __global__ void k_att_bwd_dkv_mma<64>(float *, uint16_t *, const uint16_t *, const uint16_t *, const float *,
                                               const float *, const int32_t *, int, int, int, float);
template __global__ void k_att_bwd_dkv_mma<128>(float *, uint16_t *, const uint16_t *, const uint16_t *, const float *,
                                                const float *, const int32_t *, int, int, int, float);
template __global__ void k_att_bwd_dq_mma<64>(float *, uint16_t *, const uint16_t *, const uint16_t *, const float *,
                                              const float *, const int32_t *, int, int, int, float);
template __global__ void k_att_bwd_dq_mma<128>(float *, uint16_t *, const uint16_t *, const uint16_t *, const float *,
                                               const float *, const int32_t *, int, int, int, float);
