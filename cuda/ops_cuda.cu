/* The CUDA ops table: every entry of base/ops.h on one GPU.
 *
 * Matmuls go through cuBLASLt with CUBLAS_COMPUTE_32F (fp32 operands: true
 * fp32, no TF32, so results stay within fp32 rounding of the CPU backend;
 * bf16 operands for --dtype bf16: bf16 A/B, fp32 C/D and bias), the
 * BIAS epilogue for the forward bias and the GELU_AUX_BIAS / DGELU
 * epilogues for GPT-2's MLP (GELU evaluated by cuBLASLt, not by the
 * shared formula: the one place results may differ from the CPU's by more
 * than summation order, within the GELU's rounding). Everything else is a
 * kernel, in cuda/kernels/ (one family a file, launched from here); the
 * per-element arithmetic comes from base/ops_math.h, the same functions the
 * CPU backend calls, so the CPU tests exercise these formulas.
 *
 * Design (doc/design.md, "CUDA backend"):
 *  - Memory is cudaMallocManaged, never more than the device has free
 *    (cu_alloc: no oversubscription). Ops are asynchronous: each enqueues its
 *    kernels on the compute stream and returns after checking the launch.
 *    The host waits in ops->sync, to_host, from_host, sumsq, alloc and
 *    free; MPI communicators call ops->sync before touching backend memory
 *    (comm->device_sync) and NCCL ones order their streams after the
 *    compute stream with an event (cuda/nccl_comm.c). The CPU tests check
 *    those waits with the deferred CPU table (src/backend/ops_defer.c).
 *    DTRAIN_CUDA_SYNC_OPS=1 makes every op wait for its kernels (to tell
 *    an asynchrony bug from a kernel bug), and a device without
 *    concurrentManagedAccess (the host may not touch managed memory while
 *    any kernel runs) gets that mode by itself.
 *  - Attention is FlashAttention-2 in two kernel sets: on the tensor cores
 *    (mma.sync, bf16 q/k/v, fp32 accumulation; kernels/attention_mma*.cuh)
 *    under --dtype bf16 at head sizes 64 and 128, else in plain fp32 on the
 *    CUDA cores (kernels/attention.cuh). Both keep only lse[B, NH, T] from
 *    the forward and recompute the probabilities tile by tile in the
 *    backward (dK/dV per key tile, dQ in another kernel, no atomics), so
 *    memory is O(T) per head and results are bit-identical run to run.
 *    ops_cuda_attention.cuh chooses and launches them. The tensor-core set
 *    is proven under emulation (test/emu), not yet run on a GPU.
 *  - Reductions over rows (bias and norm-weight gradients) sum fixed
 *    128-row chunks, then the chunks in order; the norms' backward sums
 *    its chunks inside its one pass for dx (kernels/norm.cuh, bits
 *    unchanged from a separate pass); the embedding gradient
 *    groups tokens by row (a stable sort) and adds each row's tokens in
 *    token order. Deterministic, no atomics, and the embedding gradients
 *    are the CPU backend's bits. Details in kernels/colsum.cuh and
 *    kernels/embedding.cuh.
 *
 * Errors: every CUDA and cuBLAS call is checked. The ops table has no error
 * returns, and a failed kernel leaves the context unusable, so a failure in
 * an op ends the job through cuda_fatal() with the op and the CUDA error
 * string. ops_cuda_create returns its errors in err.
 *
 * State: everything the ops keep (stream, handles, grown buffers, GEMM
 * plans) lives in the context cu_t (ops_cuda_state.cuh), every method's
 * ctx; the table is a designated-initializer constant copied into it. */
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "base/ops.h"
#include "base/ops_math.h"
#include "cuda/device.h"
#include "cuda/ops_cuda.h"

/* The kernels, one family a file (kernels/common.cuh says what they
 * follow), and the host code the emulation tests compile too: the state
 * and error checks, the GEMM path. */
#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/attention_mma_bwd.cuh"
#include "cuda/kernels/cast.cuh"
#include "cuda/kernels/colsum.cuh"
#include "cuda/kernels/common.cuh"
#include "cuda/kernels/crossentropy.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/embedding.cuh"
#include "cuda/kernels/moe.cuh"
#include "cuda/kernels/norm.cuh"
#include "cuda/kernels/reduce.cuh"
#include "cuda/kernels/rope.cuh"
#include "cuda/kernels/ring.cuh"
#include "cuda/ops_cuda_state.cuh"
#include "cuda/ops_cuda_attention.cuh"
#include "cuda/ops_cuda_ring.cuh"
#include "cuda/ops_cuda_gemm.cuh"
#include "cuda/ops_cuda_gmm.cuh"

/* ---- memory ------------------------------------------------------------------------ */

/* Managed memory can be oversubscribed: an allocation beyond what the GPU
 * has free succeeds, and its pages then migrate back and forth between
 * host and device on every touch (at worst the GPU hangs). A run that does
 * not fit must stop with an out-of-memory error instead, as on any GPU
 * framework, so an allocation has to fit in what the device has free, less
 * DEVICE_RESERVE for the memory cuBLASLt, NCCL and the CUDA context take
 * on their own later. Every allocation is touched at once (the zeroing
 * below), so what was given out is resident and counted by
 * cudaMemGetInfo. */
#define DEVICE_RESERVE ((size_t)256 << 20)

static void *cu_alloc(void *ctx, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (bytes > SIZE_MAX - 63)
        return NULL;
    size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    size_t free_b = 0, total_b = 0;
    ck(cudaMemGetInfo(&free_b, &total_b), "alloc: cudaMemGetInfo");
    if (sz > free_b || free_b - sz < DEVICE_RESERVE)
        return NULL; /* the caller reports out of memory */
    void *p = NULL;
    if (cudaMallocManaged(&p, sz, cudaMemAttachGlobal) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is reported as NULL, not sticky */
        return NULL;
    }
    ck(cudaMemsetAsync(p, 0, sz, g->stream), "alloc: cudaMemsetAsync");
    wait_all(g, "alloc"); /* the host (an MPI receive) may write it next */
    return p;
}

static void cu_free(void *ctx, void *p)
{
    cu_t *g = (cu_t *)ctx;
    if (p) {
        ck(cudaStreamSynchronize(g->stream), "free: cudaStreamSynchronize");
        ck(cudaFree(p), "free: cudaFree");
    }
}

static void cu_sync(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    wait_all(g, "sync");
}

static void cu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g->stream), "copy: cudaMemcpyAsync");
    finish(g, "copy");
}

/* Pinned host memory: to_host into it is one DMA, not staged by the
 * driver. NULL on failure (the caller reports out of memory). */
static void *cu_host_alloc(void *ctx, size_t bytes)
{
    (void)ctx; /* pinned memory belongs to the process, not to a stream */
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cu_host_free(void *ctx, void *p)
{
    (void)ctx;
    if (p)
        ck(cudaFreeHost(p), "host_free: cudaFreeHost");
}

/* Both directions wait: to_host for its result; from_host so the caller
 * may reuse its (pageable) source at once whatever the driver stages. */
static void cu_to_host(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, g->stream), "to_host: cudaMemcpyAsync");
    wait_all(g, "to_host");
}

/* The side stream (made at the first call) waits for what the compute
 * stream has so far. */
static void copy_stream_after(cu_t *g, const char *op)
{
    if (!g->copy_stream) {
        ck(cudaStreamCreateWithFlags(&g->copy_stream, cudaStreamNonBlocking), op);
        ck(cudaEventCreateWithFlags(&g->copy_after, cudaEventDisableTiming), op);
        ck(cudaEventCreateWithFlags(&g->copy_done, cudaEventDisableTiming), op);
    }
    ck(cudaEventRecord(g->copy_after, g->stream), op);
    ck(cudaStreamWaitEvent(g->copy_stream, g->copy_after, 0), op);
}

/* The side stream waits for what the compute stream has so far (the last
 * optimizer update, a bucket's reduction), then copies while the compute
 * stream runs on. */
static void cu_to_host_begin(void *ctx, void *host_dst, const void *src, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    copy_stream_after(g, "to_host_begin");
    ck(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, g->copy_stream), "to_host_begin: cudaMemcpyAsync");
}

/* The host waits for the side stream; the compute stream's later kernels
 * (enqueued after this returns) cannot overtake the copies. */
static void cu_to_host_end(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    if (g->copy_stream)
        ck(cudaStreamSynchronize(g->copy_stream), "to_host_end: cudaStreamSynchronize");
}

/* From pinned memory on the side stream, behind the compute stream's ops
 * so far; the host goes on at once. */
static void cu_from_host_begin(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    copy_stream_after(g, "from_host_begin");
    ck(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, g->copy_stream), "from_host_begin: cudaMemcpyAsync");
}

/* The compute stream's later kernels wait for the side stream's copies;
 * the host does not. */
static void cu_from_host_end(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    if (!g->copy_stream)
        return;
    ck(cudaEventRecord(g->copy_done, g->copy_stream), "from_host_end: cudaEventRecord");
    ck(cudaStreamWaitEvent(g->stream, g->copy_done, 0), "from_host_end: cudaStreamWaitEvent");
}

static void cu_from_host(void *ctx, void *dst, const void *host_src, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, g->stream), "from_host: cudaMemcpyAsync");
    wait_all(g, "from_host");
}

/* ---- graphs (--cuda-graphs; the graph table of src/backend/ops_defer.c) ------ */

/* Thread-local capture: MPI's and NCCL's threads go on, and a call of this
 * thread that a capture cannot hold (a wait, an allocation) fails there. */
static void cu_graph_begin(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    ck(cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal), "graph_begin: cudaStreamBeginCapture");
    g->capturing = 1;
}

/* The capture instantiated, or NULL when it or the instantiation failed
 * (the error is cleared: the graph table runs the ops plainly instead). */
static void *cu_graph_end(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    g->capturing = 0;
    cudaError_t rc = cudaStreamEndCapture(g->stream, &graph);
    if (rc != cudaSuccess || !graph) {
        (void)cudaGetLastError();
        return NULL;
    }
    rc = cudaGraphInstantiate(&exec, graph, 0);
    ck(cudaGraphDestroy(graph), "graph_end: cudaGraphDestroy");
    if (rc != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (void *)exec;
}

static void cu_graph_launch(void *ctx, void *graph)
{
    cu_t *g = (cu_t *)ctx;
    ck(cudaGraphLaunch((cudaGraphExec_t)graph, g->stream), "graph_launch: cudaGraphLaunch");
    finish(g, "graph_launch");
}

static void cu_graph_free(void *ctx, void *graph)
{
    (void)ctx;
    ck(cudaGraphExecDestroy((cudaGraphExec_t)graph), "graph_free: cudaGraphExecDestroy");
}

static unsigned long cu_graph_epoch(void *ctx) { return ((const cu_t *)ctx)->epoch; }

static void cu_zero(void *ctx, void *dst, size_t bytes)
{
    cu_t *g = (cu_t *)ctx;
    if (!bytes)
        return;
    ck(cudaMemsetAsync(dst, 0, bytes, g->stream), "zero: cudaMemsetAsync");
    finish(g, "zero");
}

/* ---- LayerNorm / RMSNorm: forward a block per row, backward a block per chunk of rows --- */

static void layernorm_fwd(void *ctx, float *out, uint16_t *out16, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int N, int C, float eps)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || C <= 0)
        return;
    k_layernorm_fwd<<<N, THREADS, 0, g->stream>>>(out, out16, mean, rstd, x, w, b, C, eps);
    finish(g, "layernorm_fwd");
}

/* One full pass over [N, C] (k_layernorm_bwd: dx, and the partial sums of
 * dw and db over each chunk of rows; a step's second read of its rows
 * hits the cache), then the fold of the partials, a pass over [chunks, C].
 * It was two full passes: a kernel per row for dx, then the partial sums
 * reading dout and x again. */
static void layernorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                          const float *x, const float *w, const float *mean, const float *rstd, int N, int C,
                          int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    if (C <= 0)
        return;
    const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
    float *pw = NULL, *pb = NULL;
    if ((dw || db) && nk > 0) {
        pw = col_part_room(g, 2 * (size_t)nk * C, "layernorm_bwd");
        pb = pw + (size_t)nk * C;
    }
    if (nk > 0 && (din || pw))
        k_layernorm_bwd<<<nk, THREADS, 0, g->stream>>>(din, din16, pw, pb, dout, x, w, mean, rstd, N, C, col_rows(N));
    if (dw)
        k_colsum_fold<<<cb, THREADS, 0, g->stream>>>(dw, pw, nk, C, accum_dw);
    if (db)
        k_colsum_fold<<<cb, THREADS, 0, g->stream>>>(db, pb, nk, C, accum_dw);
    finish(g, "layernorm_bwd");
}

static void rmsnorm_fwd(void *ctx, float *out, uint16_t *out16, float *rstd, const float *x, const float *w, int N,
                        int C, float eps)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || C <= 0)
        return;
    k_rmsnorm_fwd<<<N, THREADS, 0, g->stream>>>(out, out16, rstd, x, w, C, eps);
    finish(g, "rmsnorm_fwd");
}

/* As layernorm_bwd: one pass (k_rmsnorm_bwd), then the fold of dw's partials. */
static void rmsnorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    if (C <= 0)
        return;
    const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
    float *pw = dw && nk > 0 ? col_part_room(g, (size_t)nk * C, "rmsnorm_bwd") : NULL;
    if (nk > 0 && (din || pw))
        k_rmsnorm_bwd<<<nk, THREADS, 0, g->stream>>>(din, din16, pw, dout, x, w, rstd, N, C, col_rows(N));
    if (dw)
        k_colsum_fold<<<cb, THREADS, 0, g->stream>>>(dw, pw, nk, C, accum_dw);
    finish(g, "rmsnorm_bwd");
}

/* ---- q/k norms: one block per (row, q/k head) (kernels/norm.cuh) ---------------------- */

static void qknorm_fwd(void *ctx, float *qkv, float *xin, float *rstd, const float *wq, const float *wk, int N, int NH,
                       int NKV, int HS, float eps)
{
    cu_t *g = (cu_t *)ctx;
    const int nqk = NH + NKV;
    if (N <= 0 || HS <= 0)
        return;
    k_qknorm_fwd<<<N * nqk, THREADS, 0, g->stream>>>(qkv, xin, rstd, wq, wk, NH, nqk, (NH + 2 * NKV) * HS, HS, eps);
    finish(g, "qknorm_fwd");
}

/* dw from the incoming gradient first, then dx over it */
static void qknorm_bwd(void *ctx, float *dqkv, float *dwq, float *dwk, const float *xin, const float *wq,
                       const float *wk, const float *rstd, int N, int NH, int NKV, int HS, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    const int nqk = NH + NKV, R = (NH + 2 * NKV) * HS;
    if (HS <= 0)
        return;
    const int nk = col_chunks(N), cb = (HS + THREADS - 1) / THREADS;
    float *pw = NULL;
    if (nk > 0) {
        pw = col_part_room(g, 2 * (size_t)nk * HS, "qknorm_bwd");
        k_qknorm_dw_part<<<dim3((unsigned)cb, (unsigned)nk, 2), THREADS, 0, g->stream>>>(pw, dqkv, xin, rstd, N, NH,
                                                                                         nqk, R, HS, col_rows(N));
    }
    k_colsum_fold<<<cb, THREADS, 0, g->stream>>>(dwq, pw, nk, HS, accum_dw);
    k_colsum_fold<<<cb, THREADS, 0, g->stream>>>(dwk, pw ? pw + (size_t)nk * HS : NULL, nk, HS, accum_dw);
    if (N > 0)
        k_qknorm_bwd_dx<<<N * nqk, THREADS, 0, g->stream>>>(dqkv, xin, wq, wk, rstd, NH, nqk, R, HS);
    finish(g, "qknorm_bwd");
}

/* ---- RoPE: one thread per (row, q/k head, pair) --------------------------------------- */

static void rope_run(cu_t *g, const char *op, float *qkv, uint16_t *qkv16, const int32_t *pos, int B, int T, int NH,
                     int NKV, int HS, const float *inv_freq, float dir)
{
    size_t total = (size_t)B * T * (qkv16 ? NH + 2 * NKV : NH + NKV) * (HS / 2); /* k_rope's grid */
    if (total == 0)
        return;
    k_rope<<<grid_for(total, THREADS), THREADS, 0, g->stream>>>(qkv, qkv16, pos, B * T, T, NH, NKV, HS, inv_freq, dir);
    finish(g, op);
}

static void rope_fwd(void *ctx, float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS,
                     const float *inv_freq)
{
    cu_t *g = (cu_t *)ctx;
    rope_run(g, "rope_fwd", qkv, NULL, pos, B, T, NH, NKV, HS, inv_freq, 1.0f);
}

static void rope_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const int32_t *pos, int B, int T, int NH, int NKV,
                     int HS, const float *inv_freq)
{
    cu_t *g = (cu_t *)ctx;
    rope_run(g, "rope_bwd", dqkv, dqkv16, pos, B, T, NH, NKV, HS, inv_freq, -1.0f);
}

/* ---- attention: cuda/ops_cuda_attention.cuh (the fp32 and tensor-core paths) ---------------------- */

/* ---- activations, add, scale ----------------------------------------------------------- */

static void gelu_fwd(void *ctx, float *out, uint16_t *out16, const float *x, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_gelu_fwd<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(out, out16, x, n);
    finish(g, "gelu_fwd");
}

static void gelu_bwd(void *ctx, float *dx, const float *x, const float *dout, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_gelu_bwd<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(dx, (uint16_t *)NULL, x, dout, n);
    finish(g, "gelu_bwd");
}

static void swiglu_fwd(void *ctx, float *out, uint16_t *out16, const float *gu, int N, int F)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || F <= 0)
        return;
    k_swiglu_fwd<<<grid_for((size_t)N * F, THREADS), THREADS, 0, g->stream>>>(out, out16, gu, N, F);
    finish(g, "swiglu_fwd");
}

static void swiglu_bwd(void *ctx, float *dgu, uint16_t *dgu16, const float *gu, const float *dout, int N, int F)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || F <= 0)
        return;
    k_swiglu_bwd<<<grid_for((size_t)N * F, THREADS), THREADS, 0, g->stream>>>(dgu, dgu16, gu, dout, N, F);
    finish(g, "swiglu_bwd");
}

static void add(void *ctx, float *out, const float *a, const float *b, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_add<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(out, a, b, n);
    finish(g, "add");
}

static void scale(void *ctx, float *x, float s, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_scale<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(x, s, n);
    finish(g, "scale");
}

/* ---- embedding ---------------------------------------------------------------------------- */

static void embedding_fwd(void *ctx, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                          const float *wpe, int N, int T, int C, int v0, int Vl)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || C <= 0)
        return;
    k_embedding_fwd<<<grid_for((size_t)N * C, THREADS), THREADS, 0, g->stream>>>(out, tok, pos, wte, wpe, N, T, C, v0,
                                                                                 Vl);
    finish(g, "embedding_fwd");
}

/* The grouping's buffers for N tokens (stream-ordered growth, as
 * col_part_room): seven int arrays of N and cub's scratch. */
static void emb_room(cu_t *g, int N, size_t scratch)
{
    const char *what = "embedding_bwd";
    if ((size_t)N > g->emb_cap || scratch > g->emb_scratch_cap) {
        room_moved(g, what);
        const size_t n = (size_t)N > g->emb_cap ? (size_t)N : g->emb_cap;
        const size_t sb = scratch > g->emb_scratch_cap ? scratch : g->emb_scratch_cap;
        if (g->emb)
            ck(cudaFreeAsync(g->emb, g->stream), what);
        g->emb = NULL;
        g->emb_cap = g->emb_scratch_cap = 0;
        ck(cudaMallocAsync(&g->emb, (7 * n + 1) * sizeof(int) + sb, g->stream), what);
        g->emb_cap = n;
        g->emb_scratch_cap = sb;
    }
}

/* dwte[row of tok[n]] += dout[n] for the tokens held, grouped by row (see
 * kernels/embedding.cuh). */
static void embedding_bwd_rows(cu_t *g, float *dwte, const float *dout, const int32_t *tok, int N, int C, int v0,
                               int Vl)
{
    const char *what = "embedding_bwd";
    int end_bit = 1; /* keys go up to the sentinel Vl */
    while (end_bit < 31 && (Vl >> end_bit) != 0)
        end_bit++;
    size_t s_sort = 0, s_rle = 0, s_scan = 0;
    int *nul = NULL;
    ck(cub::DeviceRadixSort::SortPairs(NULL, s_sort, nul, nul, nul, nul, N, 0, end_bit, g->stream), what);
    ck(cub::DeviceRunLengthEncode::Encode(NULL, s_rle, nul, nul, nul, nul, N, g->stream), what);
    ck(cub::DeviceScan::ExclusiveSum(NULL, s_scan, nul, nul, N, g->stream), what);
    size_t scratch = s_sort > s_rle ? s_sort : s_rle;
    scratch = (scratch > s_scan ? scratch : s_scan) + 256; /* + room to align it */
    emb_room(g, N, scratch);
    const size_t n = g->emb_cap;
    int *key = (int *)g->emb, *val = key + n, *key_s = val + n, *val_s = key_s + n, *row = val_s + n;
    int *cnt = row + n, *off = cnt + n, *nruns = off + n;
    void *tmp = (void *)(((uintptr_t)(nruns + 1) + 255) & ~(uintptr_t)255);
    k_emb_keys<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(key, val, tok, N, v0, Vl);
    ck(cub::DeviceRadixSort::SortPairs(tmp, s_sort, key, key_s, val, val_s, N, 0, end_bit, g->stream), what);
    /* counts past the runs are never written: zero them for the scan */
    ck(cudaMemsetAsync(cnt, 0, (size_t)N * sizeof(int), g->stream), what);
    ck(cub::DeviceRunLengthEncode::Encode(tmp, s_rle, key_s, row, cnt, nruns, N, g->stream), what);
    ck(cub::DeviceScan::ExclusiveSum(tmp, s_scan, cnt, off, N, g->stream), what);
    k_emb_rows<<<(unsigned)N, THREADS, 0, g->stream>>>(dwte, dout, row, off, cnt, val_s, nruns, C, Vl);
}

static void embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                          const int32_t *pos, int N, int T, int C, int v0, int Vl, int accum)
{
    cu_t *g = (cu_t *)ctx;
    if (C <= 0)
        return;
    if (!accum) {
        if (Vl > 0)
            ck(cudaMemsetAsync(dwte, 0, (size_t)Vl * C * sizeof(float), g->stream), "embedding_bwd: cudaMemsetAsync");
        if (dwpe && T > 0)
            ck(cudaMemsetAsync(dwpe, 0, (size_t)T * C * sizeof(float), g->stream), "embedding_bwd: cudaMemsetAsync");
    }
    if (N > 0 && Vl > 0)
        embedding_bwd_rows(g, dwte, dout, tok, N, C, v0, Vl);
    /* document positions repeat within a row like tokens do: grouped the same way */
    if (N > 0 && dwpe && T > 0 && pos)
        embedding_bwd_rows(g, dwpe, dout, pos, N, C, 0, T);
    else if (N > 0 && dwpe && T > 0)
        k_embedding_bwd_wpe<<<grid_for((size_t)T * C, THREADS), THREADS, 0, g->stream>>>(dwpe, dout, N, T, C);
    finish(g, "embedding_bwd");
}

/* ---- vocabulary-parallel cross-entropy: one block per row --------------------------------- */

static void xent_max(void *ctx, float *rowmax, const float *logits, int N, int Vl, int ld)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0)
        return;
    k_xent_max<<<N, THREADS, 0, g->stream>>>(rowmax, logits, Vl, ld);
    finish(g, "xent_max");
}

static void xent_sumexp(void *ctx, float *stats, float *expbuf, const float *logits, const float *rowmax,
                        const int32_t *targets, int v0, int N, int Vl, int ld)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0)
        return;
    k_xent_sumexp<<<N, THREADS, 0, g->stream>>>(stats, expbuf, logits, rowmax, targets, v0, Vl, ld);
    finish(g, "xent_sumexp");
}

static void xent_finish(void *ctx, float *losses, float *dlogits, uint16_t *dlogits16, const float *rowmax,
                        const float *stats, const int32_t *targets, int v0, int N, int Vl, int ld, float dloss)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0)
        return;
    k_xent_finish<<<N, THREADS, 0, g->stream>>>(losses, dlogits, dlogits16, rowmax, stats, targets, v0, Vl, ld, dloss);
    finish(g, "xent_finish");
}

/* ---- mixture of experts (kernels/moe.cuh) ------------------------------------------------ */

/* The MoE ops' scratch: at least `bytes`, on the compute stream (grown
 * stream-ordered, as col_part_room; each op's use ends before the next
 * op's kernels start). */
static void *moe_room(cu_t *g, size_t bytes, const char *what)
{
    if (bytes > g->moe_cap) {
        room_moved(g, what);
        if (g->moe)
            ck(cudaFreeAsync(g->moe, g->stream), what);
        g->moe = NULL;
        g->moe_cap = 0;
        ck(cudaMallocAsync(&g->moe, bytes, g->stream), what);
        g->moe_cap = bytes;
    }
    return g->moe;
}

static void moe_route_fwd(void *ctx, float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                          const float *bias, int N, int T, int E, int K, int sigmoid, int norm_topk, int capacity)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || E <= 0)
        return;
    k_moe_route<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(scores, lse, idx, gate, logits, bias, N, E,
                                                                         K, sigmoid, norm_topk);
    const int B = T > 0 ? N / T : 0;
    if (capacity > 0 && B > 0 && K > 0) {
        if (B > 65535)
            cuda_fatal("moe_route_fwd", "more than 65535 sequences in a microbatch: use a smaller --micro-batch");
        const size_t n = (size_t)B * T * K;
        int32_t *in = (int32_t *)moe_room(g, n * sizeof(int32_t), "moe_route_fwd");
        ck(cudaMemcpyAsync(in, idx, n * sizeof(int32_t), cudaMemcpyDefault, g->stream), "moe_route_fwd");
        k_moe_drop<<<dim3(moe_tiles((size_t)T * K), (unsigned)B), MOE_TILE, 0, g->stream>>>(idx, in, scores, T, E, K,
                                                                                            capacity);
    }
    finish(g, "moe_route_fwd");
}

static void moe_plan(void *ctx, int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K)
{
    cu_t *g = (cu_t *)ctx;
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    const unsigned nc = moe_chunks(NK);
    if (E <= 0)
        return;
    /* the chunk counts, E + 1 ints a chunk */
    int *cnt = (int *)moe_room(g, (size_t)nc * ((size_t)E + 1) * sizeof(int), "moe_plan");
    if (nc > 0)
        k_moe_count<<<nc, THREADS, 0, g->stream>>>(cnt, idx, NK, E, 0);
    k_moe_offs<<<1, THREADS, 0, g->stream>>>(offs, cnt, (int)nc, E);
    if (nc > 0)
        k_moe_place<<<nc, THREADS, 0, g->stream>>>(perm, where, idx, cnt, NK, E);
    finish(g, "moe_plan");
}

static void moe_stats(void *ctx, float *stats, const int32_t *idx, const float *scores, const float *lse, int N, int E,
                      int K, int sigmoid)
{
    cu_t *g = (cu_t *)ctx;
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    const unsigned nc = moe_chunks(NK);
    if (E <= 0)
        return;
    /* the chunk counts, then (sigmoid) the tokens' score sums, 8-byte aligned */
    const size_t at = ((size_t)nc * ((size_t)E + 1) * sizeof(int) + 7) & ~(size_t)7;
    const size_t rs = sigmoid && N > 0 ? (size_t)N * sizeof(double) : 0;
    char *room = (char *)moe_room(g, at + rs, "moe_stats");
    int *cnt = (int *)room;
    double *rowsum = rs ? (double *)(room + at) : NULL;
    if (nc > 0)
        k_moe_count<<<nc, THREADS, 0, g->stream>>>(cnt, idx, NK, E, 1);
    if (rowsum)
        k_moe_rowsum<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(rowsum, scores, N, E);
    k_moe_psum<<<grid_for((size_t)E, THREADS), THREADS, 0, g->stream>>>(stats, scores, rowsum, N, E);
    k_moe_stats_fold<<<1, THREADS, 0, g->stream>>>(stats, cnt, (int)nc, lse, N, E);
    finish(g, "moe_stats");
}

static void moe_gather(void *ctx, float *xe, const float *x, const int32_t *perm, int M, int K, int C)
{
    cu_t *g = (cu_t *)ctx;
    if (M <= 0 || C <= 0)
        return;
    k_moe_gather<<<grid_for((size_t)M * C, THREADS), THREADS, 0, g->stream>>>(xe, x, perm, M, K, C);
    finish(g, "moe_gather");
}

static void moe_combine_fwd(void *ctx, float *out, const float *ye, const float *gate, const int32_t *where, int N,
                            int K, int C)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || C <= 0)
        return;
    k_moe_combine_fwd<<<grid_for((size_t)N * C, THREADS), THREADS, 0, g->stream>>>(out, ye, gate, where, N, K, C);
    finish(g, "moe_combine_fwd");
}

static void moe_combine_bwd(void *ctx, float *dye, float *dgate, const float *dout, const float *ye, const float *gate,
                            const int32_t *where, int N, int K, int C)
{
    cu_t *g = (cu_t *)ctx;
    const size_t NK = (size_t)N * (size_t)(K > 0 ? K : 0);
    if (NK == 0)
        return;
    if (C > 0)
        k_moe_combine_dye<<<grid_for(NK * C, THREADS), THREADS, 0, g->stream>>>(dye, dout, gate, where, (int)NK, K, C);
    k_moe_combine_dgate<<<grid_for(NK, THREADS), THREADS, 0, g->stream>>>(dgate, dout, ye, where, (int)NK, K, C);
    finish(g, "moe_combine_bwd");
}

static void moe_scatter_bwd(void *ctx, float *dx, const float *dxe, const int32_t *where, int N, int K, int C,
                            int accum)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || C <= 0)
        return;
    k_moe_scatter_bwd<<<grid_for((size_t)N * C, THREADS), THREADS, 0, g->stream>>>(dx, dxe, where, N, K, C, accum);
    finish(g, "moe_scatter_bwd");
}

static void moe_route_bwd(void *ctx, float *dlogits, const float *dgate, const float *logits, const float *scores,
                          const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                          int sigmoid, int norm_topk)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0 || E <= 0)
        return;
    k_moe_route_bwd<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(dlogits, dgate, logits, scores, lse, idx,
                                                                             auxw, zw, N, E, K, sigmoid, norm_topk);
    finish(g, "moe_route_bwd");
}

static void moe_shared_gate_fwd(void *ctx, float *out, float *s, const float *y, int N, int C)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0)
        return;
    k_moe_shared_gate_fwd<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(out, s, y, N, C);
    finish(g, "moe_shared_gate_fwd");
}

static void moe_shared_gate_bwd(void *ctx, float *dy, float *dz, const float *dout, const float *y, const float *s,
                                int N, int C)
{
    cu_t *g = (cu_t *)ctx;
    if (N <= 0)
        return;
    k_moe_shared_gate_bwd<<<grid_for((size_t)N, THREADS), THREADS, 0, g->stream>>>(dy, dz, dout, y, s, N, C);
    finish(g, "moe_shared_gate_bwd");
}

/* ---- optimizer and reductions ---------------------------------------------------------------- */

static void adamw(void *ctx, float *p, uint16_t *p16, const float *gr, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float grad_scale, int t)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    const dt_adamw_coef_t k = dt_adamw_coef(lr, beta1, beta2, eps, wd, grad_scale, t);
    k_adamw<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(p, p16, gr, m, v, n, k);
    finish(g, "adamw");
}

/* Grows sumsq's buffers to hold count vectors. cudaFree waits for the
 * device, so no pending kernel still uses the old ones. */
static void sumsq_room(cu_t *g, int count)
{
    if (count <= g->sum_cap)
        return;
    int cap = g->sum_cap ? g->sum_cap : 256;
    while (cap < count)
        cap = cap > INT_MAX / 2 ? count : 2 * cap;
    if (g->part)
        ck(cudaFree(g->part), "sumsq: cudaFree");
    if (g->xs)
        ck(cudaFree(g->xs), "sumsq: cudaFree");
    if (g->ns)
        ck(cudaFree(g->ns), "sumsq: cudaFree");
    free(g->hpart);
    g->part = NULL, g->xs = NULL, g->ns = NULL, g->sum_cap = 0;
    g->hpart = (double *)malloc((size_t)cap * SUMSQ_BLOCKS * sizeof(double));
    if (!g->hpart)
        cuda_fatal("sumsq", "out of host memory for the partial sums");
    ck(cudaMalloc((void **)&g->part, (size_t)cap * SUMSQ_BLOCKS * sizeof(double)), "sumsq: cudaMalloc");
    ck(cudaMalloc((void **)&g->xs, (size_t)cap * sizeof *g->xs), "sumsq: cudaMalloc");
    ck(cudaMalloc((void **)&g->ns, (size_t)cap * sizeof *g->ns), "sumsq: cudaMalloc");
    g->sum_cap = cap;
}

/* One launch for every vector (65535 per launch: gridDim.y's limit), one
 * copy of the partials back, one wait. */
static void sumsq(void *ctx, double *out, const float *const *x, const size_t *n, int count)
{
    cu_t *g = (cu_t *)ctx;
    if (count <= 0)
        return;
    sumsq_room(g, count);
    /* pageable sources: staged before the calls return, so x and n may change after */
    ck(cudaMemcpyAsync(g->xs, x, (size_t)count * sizeof *g->xs, cudaMemcpyHostToDevice, g->stream),
       "sumsq: cudaMemcpyAsync");
    ck(cudaMemcpyAsync(g->ns, n, (size_t)count * sizeof *g->ns, cudaMemcpyHostToDevice, g->stream),
       "sumsq: cudaMemcpyAsync");
    for (int first = 0; first < count; first += 65535) {
        const int c = count - first < 65535 ? count - first : 65535;
        k_sumsq<<<dim3(SUMSQ_BLOCKS, (unsigned)c), THREADS, 0, g->stream>>>(g->part + (size_t)first * SUMSQ_BLOCKS,
                                                                            g->xs + first, g->ns + first);
        ck(cudaGetLastError(), "sumsq");
    }
    ck(cudaMemcpyAsync(g->hpart, g->part, (size_t)count * SUMSQ_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost,
                       g->stream),
       "sumsq: cudaMemcpyAsync");
    wait_all(g, "sumsq");
    for (int v = 0; v < count; v++) {
        double tot = 0.0;
        for (int b = 0; b < SUMSQ_BLOCKS; b++)
            tot += g->hpart[(size_t)v * SUMSQ_BLOCKS + b];
        out[v] = tot;
    }
}

/* ---- bf16 casts ---------------------------------------------------------------------------------- */

static void cast_f32_to_bf16(void *ctx, uint16_t *out, const float *in, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_cast_f32_to_bf16<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(out, in, n);
    finish(g, "cast_f32_to_bf16");
}

static void cast_bf16_to_f32(void *ctx, float *out, const uint16_t *in, size_t n)
{
    cu_t *g = (cu_t *)ctx;
    if (!n)
        return;
    k_cast_bf16_to_f32<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(out, in, n);
    finish(g, "cast_bf16_to_f32");
}

extern "C" void ops_cuda_f32_to_bf16_cuda(const ops_t *ops, uint16_t *out, const float *in, size_t n)
{
    cu_t *g = (cu_t *)ops->ctx;
    if (!n)
        return;
    k_cast_f32_to_bf16_cuda<<<grid_for(n, THREADS), THREADS, 0, g->stream>>>(out, in, n);
    wait_all(g, "f32_to_bf16_cuda");
}

/* ---- the table ------------------------------------------------------------------------------------ */

/* Releases what ops_cuda_create made, whatever of it exists (teardown:
 * reports nothing), and the context with the table. */
static void cu_release(void *ctx)
{
    cu_t *g = (cu_t *)ctx;
    lt_cache_release(g);
    if (g->blas)
        (void)cublasDestroy(g->blas);
    if (g->lt)
        (void)cublasLtDestroy(g->lt);
    if (g->col_part)
        (void)cudaFreeAsync(g->col_part, g->stream);
    if (g->emb)
        (void)cudaFreeAsync(g->emb, g->stream);
    if (g->moe)
        (void)cudaFreeAsync(g->moe, g->stream);
    if (g->gmm_dev)
        (void)cudaFreeAsync(g->gmm_dev, g->stream);
    free(g->gmm_host);
    if (g->att)
        (void)cudaFreeAsync(g->att, g->stream);
    if (g->part)
        (void)cudaFree(g->part);
    if (g->xs)
        (void)cudaFree(g->xs);
    if (g->ns)
        (void)cudaFree(g->ns);
    free(g->hpart);
    if (g->ws)
        (void)cudaFree(g->ws);
    if (g->copy_stream) {
        (void)cudaStreamSynchronize(g->copy_stream);
        (void)cudaStreamDestroy(g->copy_stream);
        (void)cudaEventDestroy(g->copy_after);
        (void)cudaEventDestroy(g->copy_done);
    }
    if (g->stream)
        (void)cudaStreamDestroy(g->stream);
    (void)cudaGetLastError();
    free(g);
}

static const ops_t cuda_ops = {
    .name = "cuda",
    .host_readable = 0,
    .ctx = NULL, /* set per context by ops_cuda_create */
    .release = cu_release,
    .sync = cu_sync,
    .alloc = cu_alloc,
    .free = cu_free,
    .copy = cu_copy,
    .to_host = cu_to_host,
    .from_host = cu_from_host,
    .zero = cu_zero,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .to_host_begin = cu_to_host_begin,
    .to_host_end = cu_to_host_end,
    .from_host_begin = cu_from_host_begin,
    .from_host_end = cu_from_host_end,
    .graph_begin = cu_graph_begin,
    .graph_end = cu_graph_end,
    .graph_launch = cu_graph_launch,
    .graph_free = cu_graph_free,
    .graph_epoch = cu_graph_epoch,
    .matmul_fwd = matmul_fwd,
    .matmul_bwd = matmul_bwd,
    .matmul_fwd_bf16 = matmul_fwd_bf16,
    .matmul_bwd_bf16 = matmul_bwd_bf16,
    .matmul_gelu_fwd = matmul_gelu_fwd,
    .matmul_gelu_fwd_bf16 = matmul_gelu_fwd_bf16,
    .matmul_dgelu_bwd = matmul_dgelu_bwd,
    .matmul_dgelu_bwd_bf16 = matmul_dgelu_bwd_bf16,
    .gmm_fwd = gmm_fwd,
    .gmm_bwd = gmm_bwd,
    .gmm_fwd_bf16 = gmm_fwd_bf16,
    .gmm_bwd_bf16 = gmm_bwd_bf16,
    .layernorm_fwd = layernorm_fwd,
    .layernorm_bwd = layernorm_bwd,
    .rmsnorm_fwd = rmsnorm_fwd,
    .rmsnorm_bwd = rmsnorm_bwd,
    .rope_fwd = rope_fwd,
    .rope_bwd = rope_bwd,
    .qknorm_fwd = qknorm_fwd,
    .qknorm_bwd = qknorm_bwd,
    .attention_fwd = attention_fwd,
    .attention_bwd = attention_bwd,
    /* ring attention's blocks (issue 34): cuda/ops_cuda_ring.cuh, fp32 kernels */
    .attention_block_fwd = attention_block_fwd,
    .attention_merge = attention_merge,
    .attention_block_bwd = attention_block_bwd,
    .attention_kv_pack = attention_kv_pack,
    .attention_kv_unpack = attention_kv_unpack,
    .gelu_fwd = gelu_fwd,
    .gelu_bwd = gelu_bwd,
    .swiglu_fwd = swiglu_fwd,
    .swiglu_bwd = swiglu_bwd,
    .add = add,
    .embedding_fwd = embedding_fwd,
    .embedding_bwd = embedding_bwd,
    .xent_max = xent_max,
    .xent_sumexp = xent_sumexp,
    .xent_finish = xent_finish,
    .adamw = adamw,
    .sumsq = sumsq,
    .scale = scale,
    .moe_route_fwd = moe_route_fwd,
    .moe_plan = moe_plan,
    .moe_stats = moe_stats,
    .moe_gather = moe_gather,
    .moe_combine_fwd = moe_combine_fwd,
    .moe_combine_bwd = moe_combine_bwd,
    .moe_scatter_bwd = moe_scatter_bwd,
    .moe_route_bwd = moe_route_bwd,
    .moe_shared_gate_fwd = moe_shared_gate_fwd,
    .moe_shared_gate_bwd = moe_shared_gate_bwd,
    .cast_f32_to_bf16 = cast_f32_to_bf16,
    .cast_bf16_to_f32 = cast_bf16_to_f32,
};

/* The device, the compute stream, the cuBLASLt workspace and both handles
 * of g; 0, or -1 with one line in err. */
static int cu_open(cu_t *g, int dev, char *err, size_t errlen)
{
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&g->ws, WORKSPACE_BYTES);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "CUDA backend on device %d: %s (%s)", dev, cudaGetErrorString(rc), cudaGetErrorName(rc));
        return -1;
    }
    cublasStatus_t bs = cublasLtCreate(&g->lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "CUDA backend on device %d: cublasLtCreate: %s", dev, cublasGetStatusString(bs));
        g->lt = NULL;
        return -1;
    }
    bs = blas_init(g); /* the fallback's handle (ops_cuda_gemm.cuh) */
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "CUDA backend on device %d: cuBLAS handle: %s", dev, cublasGetStatusString(bs));
        return -1;
    }
    int concurrent = 0;
    rc = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "CUDA backend on device %d: cudaDeviceGetAttribute: %s (%s)", dev, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        return -1;
    }
    const char *s = getenv("DTRAIN_CUDA_SYNC_OPS");
    g->sync_ops = !concurrent || (s && strcmp(s, "1") == 0);
    g->dev = dev;
    return 0;
}

extern "C" const ops_t *ops_cuda_create(int dev, int bf16, char *err, size_t errlen)
{
    cu_t *g = (cu_t *)calloc(1, sizeof *g);
    if (!g) {
        snprintf(err, errlen, "CUDA backend on device %d: out of host memory", dev);
        return NULL;
    }
    g->ops = cuda_ops;
    g->ops.ctx = g;
    g->att_bf16 = bf16 != 0;
    if (cu_open(g, dev, err, errlen) != 0) {
        cu_release(g);
        return NULL;
    }
    return &g->ops;
}

extern "C" void *ops_cuda_stream(const ops_t *ops) { return (void *)((const cu_t *)ops->ctx)->stream; }

extern "C" void ops_cuda_gemm_plans(const ops_t *ops, long *made, long *reused, long *blas)
{
    const cu_t *g = (const cu_t *)ops->ctx;
    *made = g->plans.made;
    *reused = g->plans.reused;
    *blas = g->plans.blas;
}

extern "C" void ops_cuda_gelu_epilogues(const ops_t *ops, long *fused, long *separate)
{
    const cu_t *g = (const cu_t *)ops->ctx;
    *fused = g->plans.gelu_fused;
    *separate = g->plans.gelu_separate;
}


extern "C" int ops_cuda_synchronous(const ops_t *ops) { return ((const cu_t *)ops->ctx)->sync_ops; }

extern "C" int ops_cuda_attention_path(const ops_t *ops, int HS, char *buf, size_t len)
{
    const int bf16 = ((const cu_t *)ops->ctx)->att_bf16;
    att_path_describe(bf16, HS, buf, len);
    return att_path(bf16, HS) == ATT_PATH_MMA;
}
