/* The CUDA ops table (cuda/ops_cuda.cu): every entry of src/ops.h on the
 * GPU, asynchronous on one compute stream (ops.h, sync). Built only with
 * --with-cuda. */
#ifndef DTRAIN_OPS_CUDA_H
#define DTRAIN_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "src/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes device `dev` current and creates the compute stream, the cuBLASLt
 * handle and its workspace. Returns 0, or -1 with one line in err. Call
 * once per process before ops_cuda(). */
int ops_cuda_init(int dev, char *err, size_t errlen);
/* Releases what ops_cuda_init made (safe to call when it was not). */
void ops_cuda_shutdown(void);
/* The table; NULL before ops_cuda_init succeeded. */
const ops_t *ops_cuda(void);
/* The compute stream (a cudaStream_t) the ops enqueue on, for the NCCL
 * communicators to order after; NULL before ops_cuda_init. */
void *ops_cuda_stream(void);
/* How many cuBLASLt plans (descriptors and algorithm of one GEMM shape)
 * were made, how many GEMMs reused a kept one, and how many plain GEMMs
 * cuBLASLt had no algorithm for and cublasGemmEx ran, since ops_cuda_init. */
void ops_cuda_gemm_plans(long *made, long *reused, long *blas);
/* How many GEMMs of the GELU-fused ops (matmul_gelu_fwd*, matmul_dgelu_bwd*)
 * ran with cuBLASLt's GELU epilogue and how many as a plain GEMM and the
 * GELU kernel (no epilogue kernel for that shape), since ops_cuda_init. */
void ops_cuda_gelu_epilogues(long *fused, long *separate);
/* 1 when every op waits for its kernels (DTRAIN_CUDA_SYNC_OPS=1, or a
 * device without concurrent managed access), for the banner. */
int ops_cuda_synchronous(void);
/* 1 when the host may touch managed memory while kernels run
 * (cudaDevAttrConcurrentManagedAccess). Without it the synchronous mode
 * covers the compute stream only, not NCCL kernels on other streams. */
int ops_cuda_concurrent_managed(void);
/* For the self-test only: out[n] = the bits of CUDA's own
 * __float2bfloat16_rn(in[n]) (cuda_bf16.h), device pointers; returns
 * when out is written. Lets cuda/selftest.c check cast_f32_to_bf16 against
 * NVIDIA's conversion as well as against the CPU. */
void ops_cuda_f32_to_bf16_cuda(uint16_t *out, const float *in, size_t n);

#ifdef __cplusplus
}
#endif

#endif
