/* The CUDA ops table: every entry of src/ops.h on one GPU, fp32.
 *
 * Matmuls go through cuBLASLt with CUBLAS_COMPUTE_32F (true fp32: no TF32,
 * so results stay within fp32 rounding of the CPU backend) and the BIAS
 * epilogue for the forward bias. Everything else is a kernel here; the
 * per-element arithmetic comes from src/ops_math.h, the same functions the
 * CPU backend calls, so the CPU tests exercise these formulas.
 *
 * First slice, by design (doc/design.md, "CUDA backend"):
 *  - fp32 only. bf16 (--dtype bf16) is a later slice; the two bf16 casts
 *    are here (same bits as the CPU's, from ops_math.h) and so are the
 *    bf16 GEMMs (bf16 A/B, fp32 C/D and bias, CUBLAS_COMPUTE_32F), but
 *    training does not call them yet.
 *  - Memory is cudaMallocManaged and every op synchronises its stream
 *    before returning. The orchestration code (train.c, model.c, the
 *    pipeline executor, the MPI communicators) may still touch backend
 *    memory from the host between ops, and with managed memory plus a
 *    synchronised stream that is always correct. Overlap (one compute and
 *    one communication stream ordered with events) comes with the NCCL
 *    communicators being wired into the training loop.
 *  - Attention is a simple, correct kernel set, not flash attention: the
 *    forward writes the [B, NH, T, T] probabilities (the ops contract keeps
 *    them for backward) with one block per (query row, head, batch); each
 *    thread computes whole HS-long dot products. O(T^2 HS) work and T^2
 *    memory per head, like the CPU backend.
 *  - Reductions over rows (bias, norm-weight and embedding gradients) use
 *    one thread per column summing rows in index order: deterministic, no
 *    atomics, and the embedding gradients are summed in the same order as
 *    the CPU backend.
 *
 * Errors: every CUDA and cuBLAS call is checked. The ops table has no error
 * returns, and a failed kernel leaves the context unusable, so a failure in
 * an op ends the job through cuda_fatal() with the op and the CUDA error
 * string. ops_cuda_init returns its errors in err. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "device.h"
#include "ops.h"
#include "ops_cuda.h"
#include "ops_math.h"

#define THREADS 256                      /* threads of row and elementwise kernels */
#define ATT_THREADS 128                  /* threads of the attention kernels */
#define SUMSQ_BLOCKS 128                 /* fixed partial count: same bits every run */
#define MAX_GRID 65535u                  /* cap of grid-stride elementwise grids */
#define WORKSPACE_BYTES (32u << 20)      /* cuBLASLt workspace */

static struct {
    int ready;
    int dev;
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *ws;
    double *part;      /* [SUMSQ_BLOCKS] device partial sums */
} g;

/* ---- error checks ------------------------------------------------------------ */

static void ck(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        char msg[256];
        snprintf(msg, sizeof msg, "%s (%s)", cudaGetErrorString(rc), cudaGetErrorName(rc));
        cuda_fatal(what, msg);
    }
}

static void ckb(cublasStatus_t rc, const char *what)
{
    if (rc != CUBLAS_STATUS_SUCCESS)
        cuda_fatal(what, cublasGetStatusString(rc));
}

/* After an op's launches: the launch status, then the stream (see the
 * header comment: every op is synchronous in this slice). */
static void finish(const char *op)
{
    ck(cudaGetLastError(), op);
    ck(cudaStreamSynchronize(g.stream), op);
}

static unsigned grid_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return b > MAX_GRID ? MAX_GRID : (unsigned)(b ? b : 1);
}

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

/* ---- memory ------------------------------------------------------------------------ */

static void *cu_alloc(size_t bytes)
{
    if (bytes > SIZE_MAX - 63)
        return NULL;
    size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64;
    void *p = NULL;
    if (cudaMallocManaged(&p, sz, cudaMemAttachGlobal) != cudaSuccess) {
        (void)cudaGetLastError(); /* out of memory is reported as NULL, not sticky */
        return NULL;
    }
    ck(cudaMemsetAsync(p, 0, sz, g.stream), "alloc: cudaMemsetAsync");
    finish("alloc");
    return p;
}

static void cu_free(void *p)
{
    if (p) {
        ck(cudaStreamSynchronize(g.stream), "free: cudaStreamSynchronize");
        ck(cudaFree(p), "free: cudaFree");
    }
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream), "copy: cudaMemcpyAsync");
    finish("copy");
}

static void cu_zero(void *dst, size_t bytes)
{
    if (!bytes)
        return;
    ck(cudaMemsetAsync(dst, 0, bytes, g.stream), "zero: cudaMemsetAsync");
    finish("zero");
}

/* ---- elementwise kernels ------------------------------------------------------------ */

#define GRID_STRIDE(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

__global__ void k_fill_rows(float *out, const float *b, int N, int OC)
{
    size_t n = (size_t)N * OC;
    GRID_STRIDE(i, n) out[i] = b ? b[i % (size_t)OC] : 0.0f;
}

__global__ void k_gelu_fwd(float *out, const float *x, size_t n)
{
    GRID_STRIDE(i, n) out[i] = dt_gelu(x[i]);
}

__global__ void k_gelu_bwd(float *dx, const float *x, const float *dout, size_t n)
{
    GRID_STRIDE(i, n) dx[i] = dout[i] * dt_gelu_grad(x[i]);
}

__global__ void k_swiglu_fwd(float *out, const float *gu, int N, int F)
{
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / (size_t)F, f = i % (size_t)F;
        const float *gr = gu + r * 2 * (size_t)F;
        out[i] = dt_silu(gr[f]) * gr[F + f];
    }
}

__global__ void k_swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int F)
{
    size_t n = (size_t)N * F;
    GRID_STRIDE(i, n) {
        size_t r = i / (size_t)F, f = i % (size_t)F;
        const float *gr = gu + r * 2 * (size_t)F;
        float *dr = dgu + r * 2 * (size_t)F;
        float dg, du;
        dt_swiglu_grad(gr[f], gr[F + f], dout[i], &dg, &du);
        dr[f] = dg;
        dr[F + f] = du;
    }
}

__global__ void k_add(float *out, const float *a, const float *b, size_t n)
{
    GRID_STRIDE(i, n) out[i] = a[i] + b[i];
}

__global__ void k_scale(float *x, float s, size_t n)
{
    GRID_STRIDE(i, n) x[i] *= s;
}

__global__ void k_adamw(float *p, const float *gr, float *m, float *v, size_t n, dt_adamw_coef_t k)
{
    GRID_STRIDE(i, n) dt_adamw_update(&p[i], &m[i], &v[i], gr[i], &k);
}

/* Each thread sums squares of a grid-stride subset in double; the block
 * sums go to part[blockIdx.x]; the host adds the fixed SUMSQ_BLOCKS
 * partials in order. */
__global__ void k_sumsq(double *part, const float *x, size_t n)
{
    double s = 0.0;
    GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[blockIdx.x] = s;
}

/* out[c] (=|+= by accum) sum over rows n (in order) of x[n, c]. */
__global__ void k_colsum(float *out, const float *x, int N, int C, int accum)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float a = 0.0f;
    for (int n = 0; n < N; n++)
        a += x[(size_t)n * C + c];
    out[c] = accum ? out[c] + a : a;
}

/* ---- matmul (cuBLASLt) --------------------------------------------------------------- */

/* Largest power of two (at most 256) dividing the address. */
static uint32_t align_of(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}

/* The alignment every column of a column-major matrix has: the largest
 * power of two (at most 256) dividing both its address and its leading
 * dimension in bytes (ld elements of esize bytes). cuBLASLt's alignment
 * requirements cover the pointer and the leading dimension alike, so an
 * fp32 matrix with an odd ld is only 4-byte aligned after its first
 * column and a bf16 one only 2-byte aligned. */
static uint32_t mat_align(const void *p, int ld, size_t esize)
{
    uint32_t al = align_of(p);
    size_t row = (size_t)ld * esize;
    while (al > 1 && (row & (al - 1)))
        al >>= 1;
    return al;
}

/* Column-major C[m, n] = alpha op(A) op(B) + beta C (+ bias[m] per column
 * when bias != NULL, with beta == 0). Row-major callers pass transposes.
 * A and B are of type ab: CUDA_R_32F (the fp32 GEMMs) or CUDA_R_16BF (the
 * bf16 GEMMs, uint16_t bit patterns). C (= D), alpha, beta and the bias
 * are fp32 and the compute type is CUBLAS_COMPUTE_32F either way: a bf16
 * product is exact in fp32, so the bf16 GEMM is the fp32 GEMM of the
 * widened operands up to summation order, like the CPU backend's.
 * Returns -1 when cuBLASLt has no algorithm for a bias GEMM (the caller
 * then writes the bias rows and adds a plain GEMM onto them); a plain
 * GEMM without an algorithm ends the job. */
static int lt_gemm(const char *what, cudaDataType_t ab, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                   int k, float alpha, const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc,
                   const float *bias)
{
    const size_t esize = ab == CUDA_R_16BF ? sizeof(uint16_t) : sizeof(float);
    cublasLtMatmulDesc_t op = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    ckb(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
    ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), what);
    ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), what);
    if (bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        /* The bias is fp32. That is cuBLASLt's default (the type of D),
         * stated anyway so that bf16 A/B never suggest a bf16 bias. */
        int32_t bias_type = CUDA_R_32F;
        ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), what);
        ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), what);
        ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
            what);
    }
    ckb(cublasLtMatrixLayoutCreate(&la, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, lda), what);
    ckb(cublasLtMatrixLayoutCreate(&lb, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, ldb), what);
    ckb(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, m, n, ldc), what);
    ckb(cublasLtMatmulPreferenceCreate(&pref), what);
    size_t ws = WORKSPACE_BYTES;
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), what);
    /* The heuristic assumes 256-byte aligned matrices unless told: the
     * model passes pointers into its arenas (a head's slice of qkv, a
     * layer's weight), so state each matrix's real alignment (address and
     * leading dimension, in bytes of its own element type). */
    uint32_t al_a = mat_align(A, lda, esize), al_b = mat_align(B, ldb, esize), al_c = mat_align(C, ldc, sizeof(float));
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c),
        what);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    memset(&res, 0, sizeof res);
    /* CUBLAS_STATUS_NOT_SUPPORTED is how the heuristic says it has no kernel
     * for this combination (types, epilogue, alignment): treated as zero
     * results, so a bias GEMM takes the caller's fallback instead of
     * ending the job. Any other error is fatal. */
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g.lt, op, la, lb, lc, lc, pref, 1, &res, &nres);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED)
        nres = 0;
    else
        ckb(hs, what);
    if (nres > 0 && res.state != CUBLAS_STATUS_SUCCESS)
        nres = 0;
    if (nres > 0)
        ckb(cublasLtMatmul(g.lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, g.ws, WORKSPACE_BYTES,
                           g.stream), what);
    ckb(cublasLtMatmulPreferenceDestroy(pref), what);
    ckb(cublasLtMatrixLayoutDestroy(lc), what);
    ckb(cublasLtMatrixLayoutDestroy(lb), what);
    ckb(cublasLtMatrixLayoutDestroy(la), what);
    ckb(cublasLtMatmulDescDestroy(op), what);
    if (nres == 0 && !bias)
        cuda_fatal(what, ab == CUDA_R_16BF ? "cuBLASLt found no algorithm for this bf16 GEMM (bf16 A/B, fp32 C/D)"
                                           : "cuBLASLt found no algorithm for this fp32 GEMM");
    return nres > 0 ? 0 : -1;
}

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b): column-major out^T = w^T^T in^T. */
static void matmul_fwd(float *out, const float *in, const float *w, const float *b, int N, int IC, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    /* the bias epilogue where cuBLASLt offers it; otherwise (or for IC 0)
     * bias rows first and a GEMM adding onto them, as the CPU backend does */
    if (IC <= 0 || lt_gemm("matmul_fwd: cublasLtMatmul", CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w,
                           IC, in, IC, 0.0f, out, OC, b) != 0) {
        k_fill_rows<<<grid_for((size_t)N * OC, THREADS), THREADS, 0, g.stream>>>(out, b, N, OC);
        if (IC > 0)
            lt_gemm("matmul_fwd: cublasLtMatmul", CUDA_R_32F, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in,
                    IC, 1.0f, out, OC, NULL);
    }
    finish("matmul_fwd");
}

static void matmul_bwd(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       int N, int IC, int OC, int accum_din, int accum_dw)
{
    if (OC <= 0)
        return;
    /* din^T[IC,N] = w^T[IC,OC] . dout^T[OC,N] (column-major views) */
    if (din && N > 0 && IC > 0)
        lt_gemm("matmul_bwd(din): cublasLtMatmul", CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, dout,
                OC, accum_din ? 1.0f : 0.0f, din, IC, NULL);
    /* dw^T[IC,OC] = in^T[IC,N] . dout[N,OC] */
    if (dw && IC > 0) {
        if (N > 0)
            lt_gemm("matmul_bwd(dw): cublasLtMatmul", CUDA_R_32F, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in, IC,
                    dout, OC, accum_dw ? 1.0f : 0.0f, dw, IC, NULL);
        else if (!accum_dw)
            ck(cudaMemsetAsync(dw, 0, (size_t)OC * IC * sizeof(float), g.stream), "matmul_bwd: cudaMemsetAsync");
    }
    if (db)
        k_colsum<<<(OC + THREADS - 1) / THREADS, THREADS, 0, g.stream>>>(db, dout, N, OC, accum_dw);
    finish("matmul_bwd");
}

/* ---- bf16 matmul (cuBLASLt, bf16 A/B, fp32 C/D) ---------------------------------------
 * The fp32 matmuls above with in, w and dout16 as bf16 bit patterns: the
 * same column-major views, edge cases, accumulate flags and bias handling;
 * every output, the bias and db stay fp32 (src/ops.h). */

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b), in and w bf16: column-major
 * out^T[OC,N] = (w^T[IC,OC])^T . in^T[IC,N]. */
static void matmul_fwd_bf16(float *out, const uint16_t *in, const uint16_t *w, const float *b, int N, int IC,
                            int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    /* the bias epilogue where cuBLASLt offers it for bf16 A/B; otherwise
     * (or for IC 0) bias rows first and a GEMM adding onto them */
    if (IC <= 0 || lt_gemm("matmul_fwd_bf16: cublasLtMatmul", CUDA_R_16BF, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f,
                           w, IC, in, IC, 0.0f, out, OC, b) != 0) {
        k_fill_rows<<<grid_for((size_t)N * OC, THREADS), THREADS, 0, g.stream>>>(out, b, N, OC);
        if (IC > 0)
            lt_gemm("matmul_fwd_bf16: cublasLtMatmul", CUDA_R_16BF, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC,
                    in, IC, 1.0f, out, OC, NULL);
    }
    finish("matmul_fwd_bf16");
}

/* din[N,IC] and dw[OC,IC] from the bf16 dout16[N,OC], in and w; db[OC]
 * from the fp32 dout (the bf16 copy feeds only the two GEMMs). */
static void matmul_bwd_bf16(float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                            const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    if (OC <= 0)
        return;
    /* din^T[IC,N] = w^T[IC,OC] . dout16^T[OC,N] (column-major views) */
    if (din && N > 0 && IC > 0)
        lt_gemm("matmul_bwd_bf16(din): cublasLtMatmul", CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC,
                dout16, OC, accum_din ? 1.0f : 0.0f, din, IC, NULL);
    /* dw^T[IC,OC] = in^T[IC,N] . dout16[N,OC] */
    if (dw && IC > 0) {
        if (N > 0)
            lt_gemm("matmul_bwd_bf16(dw): cublasLtMatmul", CUDA_R_16BF, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in,
                    IC, dout16, OC, accum_dw ? 1.0f : 0.0f, dw, IC, NULL);
        else if (!accum_dw)
            ck(cudaMemsetAsync(dw, 0, (size_t)OC * IC * sizeof(float), g.stream),
               "matmul_bwd_bf16: cudaMemsetAsync");
    }
    /* db: column sums of the fp32 dout, rows in order (the CPU's order) */
    if (db)
        k_colsum<<<(OC + THREADS - 1) / THREADS, THREADS, 0, g.stream>>>(db, dout, N, OC, accum_dw);
    finish("matmul_bwd_bf16");
}

/* ---- LayerNorm / RMSNorm: one block per row ------------------------------------------- */

__global__ void k_layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w,
                                const float *b, int C, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * C;
    float *o = out + (size_t)blockIdx.x * C;
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
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = dt_layernorm_out(xr[c], mu, r, w[c], b[c]);
    if (threadIdx.x == 0) {
        mean[blockIdx.x] = mu;
        rstd[blockIdx.x] = r;
    }
}

__global__ void k_layernorm_bwd_dx(float *din, const float *dout, const float *x, const float *w,
                                   const float *mean, const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
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
    }
}

/* dw[c] (=|+=) sum_n dout * xhat, db[c] (=|+=) sum_n dout: one thread per
 * column, rows in order. */
__global__ void k_layernorm_bwd_dw(float *dw, float *db, const float *dout, const float *x, const float *mean,
                                   const float *rstd, int N, int C, int accum)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float aw = 0.0f, ab = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * (x[i] - mean[n]) * rstd[n];
        ab += dout[i];
    }
    if (dw)
        dw[c] = accum ? dw[c] + aw : aw;
    if (db)
        db[c] = accum ? db[c] + ab : ab;
}

static void layernorm_fwd(float *out, float *mean, float *rstd, const float *x, const float *w, const float *b,
                          int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    k_layernorm_fwd<<<N, THREADS, 0, g.stream>>>(out, mean, rstd, x, w, b, C, eps);
    finish("layernorm_fwd");
}

static void layernorm_bwd(float *din, float *dw, float *db, const float *dout, const float *x, const float *w,
                          const float *mean, const float *rstd, int N, int C, int accum_dw)
{
    if (C <= 0)
        return;
    if (din && N > 0)
        k_layernorm_bwd_dx<<<N, THREADS, 0, g.stream>>>(din, dout, x, w, mean, rstd, C);
    if (dw || db)
        k_layernorm_bwd_dw<<<(C + THREADS - 1) / THREADS, THREADS, 0, g.stream>>>(dw, db, dout, x, mean, rstd, N,
                                                                                  C, accum_dw);
    finish("layernorm_bwd");
}

__global__ void k_rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int C, float eps)
{
    const float *xr = x + (size_t)blockIdx.x * C;
    float *o = out + (size_t)blockIdx.x * C;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        ss += xr[c] * xr[c];
    float r = dt_norm_rstd(block_sum(ss), C, eps);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        o[c] = xr[c] * r * w[c];
    if (threadIdx.x == 0)
        rstd[blockIdx.x] = r;
}

__global__ void k_rmsnorm_bwd_dx(float *din, const float *dout, const float *x, const float *w, const float *rstd,
                                 int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
    float r = rstd[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += w[c] * gr[c] * xr[c];
    float k = dt_rmsnorm_k(r, block_sum(s), C);
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        d[c] += dt_rmsnorm_dx(r, w[c], gr[c], xr[c], k);
}

__global__ void k_rmsnorm_bwd_dw(float *dw, const float *dout, const float *x, const float *rstd, int N, int C,
                                 int accum)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    float aw = 0.0f;
    for (int n = 0; n < N; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * x[i] * rstd[n];
    }
    dw[c] = accum ? dw[c] + aw : aw;
}

static void rmsnorm_fwd(float *out, float *rstd, const float *x, const float *w, int N, int C, float eps)
{
    if (N <= 0 || C <= 0)
        return;
    k_rmsnorm_fwd<<<N, THREADS, 0, g.stream>>>(out, rstd, x, w, C, eps);
    finish("rmsnorm_fwd");
}

static void rmsnorm_bwd(float *din, float *dw, const float *dout, const float *x, const float *w,
                        const float *rstd, int N, int C, int accum_dw)
{
    if (C <= 0)
        return;
    if (din && N > 0)
        k_rmsnorm_bwd_dx<<<N, THREADS, 0, g.stream>>>(din, dout, x, w, rstd, C);
    if (dw)
        k_rmsnorm_bwd_dw<<<(C + THREADS - 1) / THREADS, THREADS, 0, g.stream>>>(dw, dout, x, rstd, N, C, accum_dw);
    finish("rmsnorm_bwd");
}

/* ---- RoPE: one thread per (row, q/k head, pair) --------------------------------------- */

__global__ void k_rope(float *qkv, int N, int T, int NH, int NKV, int HS, float theta, float dir)
{
    const int R = (NH + 2 * NKV) * HS, nqk = NH + NKV, half = HS / 2;
    size_t total = (size_t)N * nqk * half;
    GRID_STRIDE(idx, total) {
        int i = (int)(idx % (size_t)half);
        size_t rest = idx / (size_t)half;
        int h = (int)(rest % (size_t)nqk);
        size_t n = rest / (size_t)nqk;
        float a = dt_rope_angle((int)(n % (size_t)T), i, HS, theta);
        float c = cosf(a), s = dir * sinf(a);
        float *p = qkv + n * R + (size_t)h * HS + 2 * i;
        dt_rope_rotate(p, p + 1, c, s);
    }
}

static void rope_run(const char *op, float *qkv, int B, int T, int NH, int NKV, int HS, float theta, float dir)
{
    size_t total = (size_t)B * T * (NH + NKV) * (HS / 2);
    if (total == 0)
        return;
    k_rope<<<grid_for(total, THREADS), THREADS, 0, g.stream>>>(qkv, B * T, T, NH, NKV, HS, theta, dir);
    finish(op);
}

static void rope_fwd(float *qkv, int B, int T, int NH, int NKV, int HS, float theta)
{
    rope_run("rope_fwd", qkv, B, T, NH, NKV, HS, theta, 1.0f);
}

static void rope_bwd(float *dqkv, int B, int T, int NH, int NKV, int HS, float theta)
{
    rope_run("rope_bwd", dqkv, B, T, NH, NKV, HS, theta, -1.0f);
}

/* ---- attention (simple kernels; see the header comment) --------------------------------
 * Grid (T, NH, B) for per-query-row kernels, (T, NKV, B) for per-key-row
 * ones. q, k, v are strided views of qkv rows of R floats. */

/* P[t, :] = causal softmax(scale q_t . k_j), zeros above the diagonal. */
__global__ void k_att_softmax(float *att, const float *qkv, int T, int NH, int NKV, int HS, float scale)
{
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, R = (NH + 2 * NKV) * HS, kh = h / (NH / NKV);
    const float *base = qkv + (size_t)b * T * R;
    const float *q = base + (size_t)t * R + h * HS;
    float *P = att + (((size_t)b * NH + h) * T + t) * T;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const float *k = base + (size_t)j * R + (NH + kh) * HS;
        float dot = 0.0f;
        for (int d = 0; d < HS; d++)
            dot += q[d] * k[d];
        float s = scale * dot;
        P[j] = s;
        mx = s > mx ? s : mx;
    }
    mx = block_max(mx);
    float sum = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        float e = dt_expf(P[j] - mx);
        P[j] = e;
        sum += e;
    }
    float inv = 1.0f / block_sum(sum);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        P[j] = j <= t ? P[j] * inv : 0.0f;
}

/* out[t, h, :] = sum_{j <= t} P[t, j] v_j */
__global__ void k_att_out(float *out, const float *att, const float *qkv, int T, int NH, int NKV, int HS)
{
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, R = (NH + 2 * NKV) * HS, kh = h / (NH / NKV);
    const float *base = qkv + (size_t)b * T * R;
    const float *P = att + (((size_t)b * NH + h) * T + t) * T;
    float *o = out + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
    for (int d = threadIdx.x; d < HS; d += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j <= t; j++)
            a += P[j] * base[(size_t)j * R + (NH + NKV + kh) * HS + d];
        o[d] = a;
    }
}

/* dS[t, :] = P o (dP - rowsum(dP o P)), dP[t, j] = dO_t . v_j; zeros above
 * the diagonal. */
__global__ void k_att_dscores(float *dS, const float *att, const float *dout, const float *qkv, int T, int NH,
                              int NKV, int HS)
{
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, R = (NH + 2 * NKV) * HS, kh = h / (NH / NKV);
    const float *base = qkv + (size_t)b * T * R;
    const size_t row = (((size_t)b * NH + h) * T + t) * T;
    const float *P = att + row;
    float *d = dS + row;
    const float *dO = dout + ((size_t)b * T + t) * NH * HS + (size_t)h * HS;
    float part = 0.0f;
    for (int j = threadIdx.x; j <= t; j += blockDim.x) {
        const float *v = base + (size_t)j * R + (NH + NKV + kh) * HS;
        float dp = 0.0f;
        for (int e = 0; e < HS; e++)
            dp += dO[e] * v[e];
        d[j] = dp;
        part += dp * P[j];
    }
    float dot = block_sum(part);
    for (int j = threadIdx.x; j < T; j += blockDim.x)
        d[j] = j <= t ? dt_softmax_grad(P[j], d[j], dot) : 0.0f;
}

/* dq[t, h, :] = scale sum_{j <= t} dS[t, j] k_j */
__global__ void k_att_dq(float *dqkv, const float *dS, const float *qkv, int T, int NH, int NKV, int HS,
                         float scale)
{
    const int t = blockIdx.x, h = blockIdx.y, b = blockIdx.z, R = (NH + 2 * NKV) * HS, kh = h / (NH / NKV);
    const float *base = qkv + (size_t)b * T * R;
    const float *d = dS + (((size_t)b * NH + h) * T + t) * T;
    float *dq = dqkv + ((size_t)b * T + t) * R + (size_t)h * HS;
    for (int e = threadIdx.x; e < HS; e += blockDim.x) {
        float a = 0.0f;
        for (int j = 0; j <= t; j++)
            a += d[j] * base[(size_t)j * R + (NH + kh) * HS + e];
        dq[e] = scale * a;
    }
}

/* For key row j of KV head kh, over the query heads of its group and the
 * query rows t >= j: dk_j = scale sum dS[t, j] q_t, dv_j = sum P[t, j] dO_t.
 * Written, not accumulated. */
__global__ void k_att_dkv(float *dqkv, const float *dS, const float *att, const float *dout, const float *qkv,
                          int T, int NH, int NKV, int HS, float scale)
{
    const int j = blockIdx.x, kh = blockIdx.y, b = blockIdx.z, R = (NH + 2 * NKV) * HS, grp = NH / NKV;
    const float *base = qkv + (size_t)b * T * R;
    float *dk = dqkv + ((size_t)b * T + j) * R + (size_t)(NH + kh) * HS;
    float *dv = dqkv + ((size_t)b * T + j) * R + (size_t)(NH + NKV + kh) * HS;
    for (int e = threadIdx.x; e < HS; e += blockDim.x) {
        float ak = 0.0f, av = 0.0f;
        for (int h = kh * grp; h < (kh + 1) * grp; h++) {
            const size_t head = ((size_t)b * NH + h) * T;
            for (int t = j; t < T; t++) {
                size_t at = (head + t) * T + j;
                ak += dS[at] * base[(size_t)t * R + (size_t)h * HS + e];
                av += att[at] * dout[((size_t)b * T + t) * NH * HS + (size_t)h * HS + e];
            }
        }
        dk[e] = scale * ak;
        dv[e] = av;
    }
}

static int att_dims_ok(int B, int T, int NH, int NKV, int HS)
{
    return B > 0 && T > 0 && NH > 0 && NKV > 0 && HS > 0 && B <= 65535 && NH <= 65535;
}

static void attention_fwd(float *out, float *att, const float *qkv, int B, int T, int NH, int NKV, int HS)
{
    if (!att_dims_ok(B, T, NH, NKV, HS))
        return;
    const float scale = 1.0f / sqrtf((float)HS);
    dim3 grid((unsigned)T, (unsigned)NH, (unsigned)B);
    k_att_softmax<<<grid, ATT_THREADS, 0, g.stream>>>(att, qkv, T, NH, NKV, HS, scale);
    k_att_out<<<grid, ATT_THREADS, 0, g.stream>>>(out, att, qkv, T, NH, NKV, HS);
    finish("attention_fwd");
}

static void attention_bwd(float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att,
                          int B, int T, int NH, int NKV, int HS)
{
    if (!att_dims_ok(B, T, NH, NKV, HS))
        return;
    const float scale = 1.0f / sqrtf((float)HS);
    dim3 gq((unsigned)T, (unsigned)NH, (unsigned)B), gk((unsigned)T, (unsigned)NKV, (unsigned)B);
    k_att_dscores<<<gq, ATT_THREADS, 0, g.stream>>>(scratch, att, dout, qkv, T, NH, NKV, HS);
    k_att_dq<<<gq, ATT_THREADS, 0, g.stream>>>(dqkv, scratch, qkv, T, NH, NKV, HS, scale);
    k_att_dkv<<<gk, ATT_THREADS, 0, g.stream>>>(dqkv, scratch, att, dout, qkv, T, NH, NKV, HS, scale);
    finish("attention_bwd");
}

/* ---- activations, add, scale ----------------------------------------------------------- */

static void gelu_fwd(float *out, const float *x, size_t n)
{
    if (!n)
        return;
    k_gelu_fwd<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(out, x, n);
    finish("gelu_fwd");
}

static void gelu_bwd(float *dx, const float *x, const float *dout, size_t n)
{
    if (!n)
        return;
    k_gelu_bwd<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(dx, x, dout, n);
    finish("gelu_bwd");
}

static void swiglu_fwd(float *out, const float *gu, int N, int F)
{
    if (N <= 0 || F <= 0)
        return;
    k_swiglu_fwd<<<grid_for((size_t)N * F, THREADS), THREADS, 0, g.stream>>>(out, gu, N, F);
    finish("swiglu_fwd");
}

static void swiglu_bwd(float *dgu, const float *gu, const float *dout, int N, int F)
{
    if (N <= 0 || F <= 0)
        return;
    k_swiglu_bwd<<<grid_for((size_t)N * F, THREADS), THREADS, 0, g.stream>>>(dgu, gu, dout, N, F);
    finish("swiglu_bwd");
}

static void add(float *out, const float *a, const float *b, size_t n)
{
    if (!n)
        return;
    k_add<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(out, a, b, n);
    finish("add");
}

static void scale(float *x, float s, size_t n)
{
    if (!n)
        return;
    k_scale<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(x, s, n);
    finish("scale");
}

/* ---- embedding ---------------------------------------------------------------------------- */

__global__ void k_embedding_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T,
                                int C, int v0, int Vl)
{
    size_t total = (size_t)N * C;
    GRID_STRIDE(i, total) {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        int r = tok[n] - v0;
        int held = r >= 0 && r < Vl;
        float e = held ? wte[(size_t)r * C + c] : 0.0f;
        if (wpe) {
            float p = wpe[(n % (size_t)T) * C + c];
            out[i] = held ? e + p : p;
        } else {
            out[i] = e;
        }
    }
}

/* dwte: one thread per column walks the tokens in order (the CPU order). */
__global__ void k_embedding_bwd_wte(float *dwte, const float *dout, const int32_t *tok, int N, int C, int v0,
                                    int Vl)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    for (int n = 0; n < N; n++) {
        int r = tok[n] - v0;
        if (r >= 0 && r < Vl)
            dwte[(size_t)r * C + c] += dout[(size_t)n * C + c];
    }
}

/* dwpe[t, c] += dout[n, c] for n = t, t + T, ... in order. */
__global__ void k_embedding_bwd_wpe(float *dwpe, const float *dout, int N, int T, int C)
{
    size_t total = (size_t)T * C;
    GRID_STRIDE(i, total) {
        size_t t = i / (size_t)C, c = i % (size_t)C;
        float a = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += (size_t)T)
            a += dout[n * C + c];
        dwpe[i] = a;
    }
}

static void embedding_fwd(float *out, const int32_t *tok, const float *wte, const float *wpe, int N, int T, int C,
                          int v0, int Vl)
{
    if (N <= 0 || C <= 0)
        return;
    k_embedding_fwd<<<grid_for((size_t)N * C, THREADS), THREADS, 0, g.stream>>>(out, tok, wte, wpe, N, T, C, v0,
                                                                                 Vl);
    finish("embedding_fwd");
}

static void embedding_bwd(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int N, int T, int C,
                          int v0, int Vl, int accum)
{
    if (C <= 0)
        return;
    if (!accum) {
        if (Vl > 0)
            ck(cudaMemsetAsync(dwte, 0, (size_t)Vl * C * sizeof(float), g.stream), "embedding_bwd: cudaMemsetAsync");
        if (dwpe && T > 0)
            ck(cudaMemsetAsync(dwpe, 0, (size_t)T * C * sizeof(float), g.stream), "embedding_bwd: cudaMemsetAsync");
    }
    if (N > 0 && Vl > 0)
        k_embedding_bwd_wte<<<(C + THREADS - 1) / THREADS, THREADS, 0, g.stream>>>(dwte, dout, tok, N, C, v0, Vl);
    if (N > 0 && dwpe && T > 0)
        k_embedding_bwd_wpe<<<grid_for((size_t)T * C, THREADS), THREADS, 0, g.stream>>>(dwpe, dout, N, T, C);
    finish("embedding_bwd");
}

/* ---- vocabulary-parallel cross-entropy: one block per row --------------------------------- */

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

__global__ void k_xent_finish(float *losses, float *dlogits, const float *rowmax, const float *stats,
                              const int32_t *targets, int v0, int Vl, int ld, float dloss)
{
    const size_t n = blockIdx.x;
    float *d = dlogits ? dlogits + n * ld : NULL;
    const double sum = stats[2 * n];
    if (targets[n] < 0) {
        if (threadIdx.x == 0)
            losses[n] = 0.0f;
        if (d)
            for (int i = threadIdx.x; i < ld; i += blockDim.x)
                d[i] = 0.0f;
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
}

static void xent_max(float *rowmax, const float *logits, int N, int Vl, int ld)
{
    if (N <= 0)
        return;
    k_xent_max<<<N, THREADS, 0, g.stream>>>(rowmax, logits, Vl, ld);
    finish("xent_max");
}

static void xent_sumexp(float *stats, float *expbuf, const float *logits, const float *rowmax,
                        const int32_t *targets, int v0, int N, int Vl, int ld)
{
    if (N <= 0)
        return;
    k_xent_sumexp<<<N, THREADS, 0, g.stream>>>(stats, expbuf, logits, rowmax, targets, v0, Vl, ld);
    finish("xent_sumexp");
}

static void xent_finish(float *losses, float *dlogits, const float *rowmax, const float *stats,
                        const int32_t *targets, int v0, int N, int Vl, int ld, float dloss)
{
    if (N <= 0)
        return;
    k_xent_finish<<<N, THREADS, 0, g.stream>>>(losses, dlogits, rowmax, stats, targets, v0, Vl, ld, dloss);
    finish("xent_finish");
}

/* ---- optimizer and reductions ---------------------------------------------------------------- */

static void adamw(float *p, const float *gr, float *m, float *v, size_t n, float lr, float beta1, float beta2,
                  float eps, float wd, float grad_scale, int t)
{
    if (!n)
        return;
    const dt_adamw_coef_t k = dt_adamw_coef(lr, beta1, beta2, eps, wd, grad_scale, t);
    k_adamw<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(p, gr, m, v, n, k);
    finish("adamw");
}

static double sumsq(const float *x, size_t n)
{
    if (!n)
        return 0.0;
    double part[SUMSQ_BLOCKS];
    k_sumsq<<<SUMSQ_BLOCKS, THREADS, 0, g.stream>>>(g.part, x, n);
    ck(cudaGetLastError(), "sumsq");
    ck(cudaMemcpyAsync(part, g.part, sizeof part, cudaMemcpyDeviceToHost, g.stream), "sumsq: cudaMemcpyAsync");
    finish("sumsq");
    double tot = 0.0;
    for (int b = 0; b < SUMSQ_BLOCKS; b++)
        tot += part[b];
    return tot;
}

/* ---- bf16 casts ---------------------------------------------------------------------------------- */

__global__ void k_cast_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    GRID_STRIDE(i, n) out[i] = dt_f32_to_bf16(in[i]);
}

__global__ void k_cast_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
    GRID_STRIDE(i, n) out[i] = dt_bf16_to_f32(in[i]);
}

/* CUDA's own conversion, for the self-test only (not in the table). */
__global__ void k_cast_f32_to_bf16_cuda(uint16_t *out, const float *in, size_t n)
{
    GRID_STRIDE(i, n) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

static void cast_f32_to_bf16(uint16_t *out, const float *in, size_t n)
{
    if (!n)
        return;
    k_cast_f32_to_bf16<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(out, in, n);
    finish("cast_f32_to_bf16");
}

static void cast_bf16_to_f32(float *out, const uint16_t *in, size_t n)
{
    if (!n)
        return;
    k_cast_bf16_to_f32<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(out, in, n);
    finish("cast_bf16_to_f32");
}

extern "C" void ops_cuda_f32_to_bf16_cuda(uint16_t *out, const float *in, size_t n)
{
    if (!n)
        return;
    k_cast_f32_to_bf16_cuda<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(out, in, n);
    finish("f32_to_bf16_cuda");
}

/* ---- the table ------------------------------------------------------------------------------------ */

static ops_t cuda_ops;

extern "C" int ops_cuda_init(int dev, char *err, size_t errlen)
{
    if (g.ready)
        return 0;
    cudaError_t rc = cudaSetDevice(dev);
    if (rc == cudaSuccess)
        rc = cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking);
    if (rc == cudaSuccess)
        rc = cudaMalloc(&g.ws, WORKSPACE_BYTES);
    if (rc == cudaSuccess)
        rc = cudaMalloc((void **)&g.part, SUMSQ_BLOCKS * sizeof(double));
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "CUDA backend on device %d: %s (%s)", dev, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
        ops_cuda_shutdown();
        return -1;
    }
    cublasStatus_t bs = cublasLtCreate(&g.lt);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "CUDA backend on device %d: cublasLtCreate: %s", dev, cublasGetStatusString(bs));
        g.lt = NULL;
        ops_cuda_shutdown();
        return -1;
    }
    g.dev = dev;
    memset(&cuda_ops, 0, sizeof cuda_ops);
    cuda_ops.name = "cuda";
    cuda_ops.alloc = cu_alloc;
    cuda_ops.free = cu_free;
    cuda_ops.copy = cu_copy;
    cuda_ops.to_host = cu_copy;
    cuda_ops.from_host = cu_copy;
    cuda_ops.zero = cu_zero;
    cuda_ops.matmul_fwd = matmul_fwd;
    cuda_ops.matmul_bwd = matmul_bwd;
    cuda_ops.matmul_fwd_bf16 = matmul_fwd_bf16;
    cuda_ops.matmul_bwd_bf16 = matmul_bwd_bf16;
    cuda_ops.layernorm_fwd = layernorm_fwd;
    cuda_ops.layernorm_bwd = layernorm_bwd;
    cuda_ops.rmsnorm_fwd = rmsnorm_fwd;
    cuda_ops.rmsnorm_bwd = rmsnorm_bwd;
    cuda_ops.rope_fwd = rope_fwd;
    cuda_ops.rope_bwd = rope_bwd;
    cuda_ops.attention_fwd = attention_fwd;
    cuda_ops.attention_bwd = attention_bwd;
    cuda_ops.gelu_fwd = gelu_fwd;
    cuda_ops.gelu_bwd = gelu_bwd;
    cuda_ops.swiglu_fwd = swiglu_fwd;
    cuda_ops.swiglu_bwd = swiglu_bwd;
    cuda_ops.add = add;
    cuda_ops.embedding_fwd = embedding_fwd;
    cuda_ops.embedding_bwd = embedding_bwd;
    cuda_ops.xent_max = xent_max;
    cuda_ops.xent_sumexp = xent_sumexp;
    cuda_ops.xent_finish = xent_finish;
    cuda_ops.adamw = adamw;
    cuda_ops.sumsq = sumsq;
    cuda_ops.scale = scale;
    cuda_ops.cast_f32_to_bf16 = cast_f32_to_bf16;
    cuda_ops.cast_bf16_to_f32 = cast_bf16_to_f32;
    g.ready = 1;
    return 0;
}

extern "C" void ops_cuda_shutdown(void)
{
    /* teardown: report nothing, release what exists */
    if (g.lt)
        (void)cublasLtDestroy(g.lt);
    if (g.part)
        (void)cudaFree(g.part);
    if (g.ws)
        (void)cudaFree(g.ws);
    if (g.stream)
        (void)cudaStreamDestroy(g.stream);
    (void)cudaGetLastError();
    memset(&g, 0, sizeof g);
}

extern "C" const ops_t *ops_cuda(void)
{
    return g.ready ? &cuda_ops : NULL;
}
