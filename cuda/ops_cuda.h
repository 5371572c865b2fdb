/* The CUDA ops table (cuda/ops_cuda.cu): every entry of base/ops.h on the
 * GPU, asynchronous on one compute stream (base/ops.h, sync). Built only with
 * --with-cuda. */
#ifndef DTRAIN_OPS_CUDA_H
#define DTRAIN_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "base/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes device `dev` current and creates the backend: its context (the
 * compute stream, the cuBLASLt handle and its workspace, the cuBLAS
 * handle) and the table over it. bf16: the run's --dtype is bf16, so
 * attention_fwd/bwd take the tensor-core kernels where the head size has
 * them (bf16 q, k, v; cuda/ops_cuda_attention.cuh), else the fp32 ones.
 * Returns the table, or NULL with one line in err. ops_release
 * (base/ops.h) ends it. */
const ops_t *ops_cuda_create(int dev, int bf16, char *err, size_t errlen);
/* One line for the banner: the kernels attention runs at head size HS on
 * this table, and why (tensor cores, or fp32 for --dtype fp32 or a head
 * size without tensor-core kernels). Returns 1 on the tensor cores (q, k,
 * v and dout rounded to bf16), else 0. */
int ops_cuda_attention_path(const ops_t *ops, int HS, char *buf, size_t len);
/* The compute stream (a cudaStream_t) the ops of this CUDA table enqueue
 * on, for the NCCL communicators to order after. */
void *ops_cuda_stream(const ops_t *ops);
/* How many cuBLASLt plans (descriptors and algorithm of one GEMM shape)
 * were made, how many GEMMs reused a kept one, and how many plain GEMMs
 * cuBLASLt had no algorithm for and cublasGemmEx ran, since ops_cuda_create. */
void ops_cuda_gemm_plans(const ops_t *ops, long *made, long *reused, long *blas);
/* How many GEMMs of the GELU-fused ops (matmul_gelu_fwd*, matmul_dgelu_bwd*)
 * ran with cuBLASLt's GELU epilogue and how many as a plain GEMM and the
 * GELU kernel (no epilogue kernel for that shape), since ops_cuda_create. */
void ops_cuda_gelu_epilogues(const ops_t *ops, long *fused, long *separate);
/* 1 when every op waits for its kernels (DTRAIN_CUDA_SYNC_OPS=1, or a
 * device without concurrent managed access), for the banner. */
int ops_cuda_synchronous(const ops_t *ops);
/* For the self-test only: out[n] = the bits of CUDA's own
 * __float2bfloat16_rn(in[n]) (cuda_bf16.h), device pointers of ops;
 * returns when out is written. Lets cuda/selftest.c check cast_f32_to_bf16
 * against NVIDIA's conversion as well as against the CPU. */
void ops_cuda_f32_to_bf16_cuda(const ops_t *ops, uint16_t *out, const float *in, size_t n);

#ifdef __cplusplus
}
#endif

#endif
