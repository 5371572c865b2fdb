/* The CUDA ops table: every entry of src/ops.h on one GPU.
 *
 * Matmuls go through cuBLASLt with CUBLAS_COMPUTE_32F (fp32 operands: true
 * fp32, no TF32, so results stay within fp32 rounding of the CPU backend;
 * bf16 operands for --dtype bf16: bf16 A/B, fp32 C/D and bias), the
 * BIAS epilogue for the forward bias and the GELU_AUX_BIAS / DGELU
 * epilogues for GPT-2's MLP (GELU evaluated by cuBLASLt, not by the
 * shared formula: the one place results may differ from the CPU's by more
 * than summation order, within the GELU's rounding). Everything else is a
 * kernel here; the per-element arithmetic comes from src/ops_math.h, the
 * same functions the CPU backend calls, so the CPU tests exercise these
 * formulas.
 *
 * Design (doc/design.md, "CUDA backend"):
 *  - Memory is cudaMallocManaged, never more than the device has free
 *    (cu_alloc: no oversubscription). Ops are asynchronous: each enqueues its
 *    kernels on the compute stream and returns after checking the launch.
 *    The host waits in ops->sync, to_host, from_host, sumsq, alloc and
 *    free; MPI communicators call ops->sync before touching backend memory
 *    (comm->device_sync) and NCCL ones order their streams after the
 *    compute stream with an event (cuda/nccl_comm.c). The CPU tests check
 *    those waits with the deferred CPU table (src/ops_defer.c).
 *    DTRAIN_CUDA_SYNC_OPS=1 makes every op wait for its kernels (to tell
 *    an asynchrony bug from a kernel bug), and a device without
 *    concurrentManagedAccess (the host may not touch managed memory while
 *    any kernel runs) gets that mode by itself.
 *  - Attention is a tiled flash-attention kernel set in plain fp32 (no
 *    tensor cores yet): the forward keeps only lse[B, NH, T], the backward
 *    recomputes the probabilities tile by tile (FlashAttention-2: dK/dV per
 *    key tile, dQ in a second kernel, no atomics), so memory is O(T) per
 *    head and results are bit-identical run to run. Details at the
 *    attention section. Not yet run on a GPU.
 *  - Reductions over rows (bias and norm-weight gradients) sum fixed
 *    128-row chunks, then the chunks in order; the embedding gradient
 *    groups tokens by row (a stable sort) and adds each row's tokens in
 *    token order. Deterministic, no atomics, and the embedding gradients
 *    are the CPU backend's bits. Details at the column reductions and at
 *    embedding_bwd.
 *
 * Errors: every CUDA and cuBLAS call is checked. The ops table has no error
 * returns, and a failed kernel leaves the context unusable, so a failure in
 * an op ends the job through cuda_fatal() with the op and the CUDA error
 * string. ops_cuda_init returns its errors in err. */
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

#include "device.h"
#include "ops.h"
#include "ops_cuda.h"
#include "ops_math.h"

#define THREADS 256                      /* threads of row and elementwise kernels */
#define ATT_THREADS 128                  /* threads of the attention kernels: 4 per tile row */
#define SUMSQ_BLOCKS 128                 /* fixed partial count: same bits every run */
#define MAX_GRID 65535u                  /* cap of grid-stride elementwise grids */
#define WORKSPACE_BYTES (32u << 20)      /* cuBLASLt workspace */

static struct {
    int ready;
    int dev;
    int sync_ops;      /* every op waits for its kernels (see the header comment) */
    int concurrent;    /* cudaDevAttrConcurrentManagedAccess: the host may touch managed memory while kernels run */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    cublasHandle_t blas; /* for the GEMMs cuBLASLt has no algorithm for (lt_gemm) */
    void *ws;
    /* sumsq: room for `sum_cap` vectors of partial sums (device and host)
     * and their pointers and lengths (device) */
    int sum_cap;
    double *part, *hpart;
    const float **xs;
    size_t *ns;
    float *col_part;   /* the column reductions' partial sums (col_part_room) */
    size_t col_cap;    /* floats */
    void *emb;         /* embedding_bwd's grouping buffers (emb_room) */
    size_t emb_cap, emb_scratch_cap; /* tokens, bytes */
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

/* After an op's launches: the launch status (and, in the synchronous
 * mode, the kernels' own). */
static void finish(const char *op)
{
    ck(cudaGetLastError(), op);
    if (g.sync_ops)
        ck(cudaStreamSynchronize(g.stream), op);
}

/* The host is about to see backend memory: everything enqueued is done. */
static void wait_all(const char *op)
{
    ck(cudaGetLastError(), op);
    ck(cudaStreamSynchronize(g.stream), op);
}

/* The column reductions' partial sums: at least n floats, on the compute
 * stream. Grown stream-ordered (cudaFreeAsync/cudaMallocAsync), as cudaFree
 * would wait for the whole device, NCCL kernels of other streams included. */
static float *col_part_room(size_t n, const char *what)
{
    if (n > g.col_cap) {
        if (g.col_part)
            ck(cudaFreeAsync(g.col_part, g.stream), what);
        g.col_part = NULL;
        g.col_cap = 0;
        ck(cudaMallocAsync((void **)&g.col_part, n * sizeof(float), g.stream), what);
        g.col_cap = n;
    }
    return g.col_part;
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

static void *cu_alloc(size_t bytes)
{
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
    ck(cudaMemsetAsync(p, 0, sz, g.stream), "alloc: cudaMemsetAsync");
    wait_all("alloc"); /* the host (an MPI receive) may write it next */
    return p;
}

static void cu_free(void *p)
{
    if (p) {
        ck(cudaStreamSynchronize(g.stream), "free: cudaStreamSynchronize");
        ck(cudaFree(p), "free: cudaFree");
    }
}

static void cu_sync(void)
{
    wait_all("sync");
}

static void cu_copy(void *dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, g.stream), "copy: cudaMemcpyAsync");
    finish("copy");
}

/* Both directions wait: to_host for its result; from_host so the caller
 * may reuse its (pageable) source at once whatever the driver stages. */
static void cu_to_host(void *host_dst, const void *src, size_t bytes)
{
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDefault, g.stream), "to_host: cudaMemcpyAsync");
    wait_all("to_host");
}

static void cu_from_host(void *dst, const void *host_src, size_t bytes)
{
    if (!bytes)
        return;
    ck(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyDefault, g.stream), "from_host: cudaMemcpyAsync");
    wait_all("from_host");
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

__global__ void k_adamw(float *p, uint16_t *p16, const float *gr, float *m, float *v, size_t n, dt_adamw_coef_t k)
{
    GRID_STRIDE(i, n) {
        dt_adamw_update(&p[i], &m[i], &v[i], gr[i], &k);
        if (p16)
            p16[i] = dt_f32_to_bf16(p[i]);
    }
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
    GRID_STRIDE(i, n) s += (double)x[i] * (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0)
        part[(size_t)blockIdx.y * SUMSQ_BLOCKS + blockIdx.x] = s;
}

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

static int col_chunks(int N)
{
    return N > 0 ? (N + col_rows(N) - 1) / col_rows(N) : 0;
}

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

/* ---- cuBLASLt plans ----------------------------------------------------------------------
 * A GEMM's descriptors and the heuristic's algorithm depend only on its
 * shape, types, transposes, epilogue and alignments, and a training step
 * repeats the same few dozen GEMMs every microbatch. Creating the
 * descriptors and querying the heuristic on every call cost tens of
 * microseconds of host time per GEMM (dtrain-bench-gemm's small shapes
 * showed it), which asynchronous ops turn into the host falling behind the
 * GPU. So each distinct GEMM is planned once and kept: LT_PLANS entries,
 * looked up by exact key, the oldest replaced when full. The heuristic
 * answers the same for the same key, so a kept plan runs the algorithm a
 * fresh query would pick: results are unchanged, bit for bit. */

#define LT_PLANS 64

typedef struct lt_key {
    int ab, ta, tb;        /* cudaDataType_t of A/B, cublasOperation_t of each */
    int m, n, k, lda, ldb, ldc;
    int epi;               /* cublasLtEpilogue_t (bias and aux pointers are set per call) */
    uint32_t al_a, al_b, al_c; /* alignments in bytes (mat_align) */
    uint32_t al_bias, al_aux;  /* of the bias vector and the GELU aux matrix; 0 without */
} lt_key_t;

typedef struct lt_plan {
    lt_key_t key;
    int used;
    int found;             /* the heuristic returned an algorithm */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, lc;
    cublasLtMatmulAlgo_t algo;
} lt_plan_t;

static struct {
    lt_plan_t plan[LT_PLANS];
    int next;              /* the slot replaced when every slot is used */
    long made, reused;     /* ops_cuda_gemm_plans */
    long blas;             /* plain GEMMs run by cublasGemmEx instead (ops_cuda_gemm_plans) */
    long gelu_fused, gelu_separate; /* ops_cuda_gelu_epilogues */
} lt_cache;

static void lt_plan_release(lt_plan_t *p)
{
    /* teardown of descriptors the library made: nothing to report */
    if (p->lc) (void)cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb) (void)cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la) (void)cublasLtMatrixLayoutDestroy(p->la);
    if (p->op) (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static void lt_cache_release(void)
{
    for (int i = 0; i < LT_PLANS; i++)
        if (lt_cache.plan[i].used)
            lt_plan_release(&lt_cache.plan[i]);
    memset(&lt_cache, 0, sizeof lt_cache);
}

static int epi_has_bias(int epi)
{
    return epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS;
}

static int epi_has_aux(int epi)
{
    return epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS ||
           epi == CUBLASLT_EPILOGUE_DGELU;
}

/* The per-call attributes: the bias vector and the GELU aux matrix (the
 * GELU input, written by GELU_AUX*, read by DGELU; fp32, the type of D,
 * cuBLASLt's default for it, and with D's leading dimension). The
 * heuristic reads the pointers too (for their alignment), so a plan is
 * made with its first call's pointers set. */
static void lt_set_pointers(const lt_plan_t *p, const float *bias, const float *aux, const char *what)
{
    if (epi_has_bias(p->key.epi))
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), what);
    if (epi_has_aux(p->key.epi))
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux),
            what);
}

/* Descriptors and the heuristic's algorithm for one key (see above), with
 * the pointers of the call that made it. */
static void lt_plan_make(lt_plan_t *p, const lt_key_t *key, const float *bias, const float *aux, const char *what)
{
    memset(p, 0, sizeof *p);
    p->key = *key;
    p->used = 1;
    const cublasOperation_t ta = (cublasOperation_t)key->ta, tb = (cublasOperation_t)key->tb;
    const cudaDataType_t ab = (cudaDataType_t)key->ab;
    const int m = key->m, n = key->n, k = key->k;
    ckb(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), what);
    ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), what);
    ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), what);
    if (key->epi != CUBLASLT_EPILOGUE_DEFAULT) {
        cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epi;
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi), what);
    }
    if (epi_has_bias(key->epi)) {
        /* The bias is fp32. That is cuBLASLt's default (the type of D),
         * stated anyway so that bf16 A/B never suggest a bf16 bias. */
        int32_t bias_type = CUDA_R_32F;
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
            what);
    }
    if (epi_has_aux(key->epi)) {
        int64_t ld_aux = key->ldc;
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux),
            what);
    }
    lt_set_pointers(p, bias, aux, what);
    ckb(cublasLtMatrixLayoutCreate(&p->la, ab, ta == CUBLAS_OP_N ? m : k, ta == CUBLAS_OP_N ? k : m, key->lda), what);
    ckb(cublasLtMatrixLayoutCreate(&p->lb, ab, tb == CUBLAS_OP_N ? k : n, tb == CUBLAS_OP_N ? n : k, key->ldb), what);
    ckb(cublasLtMatrixLayoutCreate(&p->lc, CUDA_R_32F, m, n, key->ldc), what);
    cublasLtMatmulPreference_t pref = NULL;
    ckb(cublasLtMatmulPreferenceCreate(&pref), what);
    size_t ws = WORKSPACE_BYTES;
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws), what);
    /* The heuristic assumes 256-byte aligned matrices unless told: the
     * model passes pointers into its arenas (a head's slice of qkv, a
     * layer's weight), so state each matrix's real alignment (address and
     * leading dimension, in bytes of its own element type). */
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &key->al_a,
                                             sizeof key->al_a), what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b,
                                             sizeof key->al_b), what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_c,
                                             sizeof key->al_c), what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_c,
                                             sizeof key->al_c), what);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    memset(&res, 0, sizeof res);
    /* CUBLAS_STATUS_NOT_SUPPORTED is how the heuristic says it has no kernel
     * for this combination (types, epilogue, alignment): treated as zero
     * results, so a GEMM with an epilogue takes the caller's fallback
     * instead of ending the job. Any other error is fatal. */
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g.lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
    if (hs == CUBLAS_STATUS_NOT_SUPPORTED)
        nres = 0;
    else
        ckb(hs, what);
    ckb(cublasLtMatmulPreferenceDestroy(pref), what);
    p->found = nres > 0 && res.state == CUBLAS_STATUS_SUCCESS;
    if (p->found)
        p->algo = res.algo;
}

/* The plan for key: the kept one, or a new one in a free (else the oldest)
 * slot, made with the given pointers. */
static const lt_plan_t *lt_plan(const lt_key_t *key, const float *bias, const float *aux, const char *what)
{
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan_t *p = &lt_cache.plan[i];
        if (p->used && memcmp(&p->key, key, sizeof *key) == 0) {
            lt_cache.reused++;
            return p;
        }
    }
    lt_plan_t *p = &lt_cache.plan[lt_cache.next];
    lt_cache.next = (lt_cache.next + 1) % LT_PLANS;
    if (p->used)
        lt_plan_release(p);
    lt_plan_make(p, key, bias, aux, what);
    lt_cache.made++;
    return p;
}

/* Column-major C[m, n] = alpha op(A) op(B) + beta C, then the epilogue:
 *   CUBLASLT_EPILOGUE_DEFAULT        nothing (bias and aux NULL)
 *   CUBLASLT_EPILOGUE_BIAS           + bias[m] per column (beta 0)
 *   CUBLASLT_EPILOGUE_GELU_AUX(_BIAS) aux = the sum (+ bias), C = gelu(aux)
 *   CUBLASLT_EPILOGUE_DGELU          C = the product o gelu'(aux) (beta 0)
 * with aux[m, n] fp32 and leading dimension ldc. Row-major callers pass
 * transposes. A and B are of type ab: CUDA_R_32F (the fp32 GEMMs) or
 * CUDA_R_16BF (the bf16 GEMMs, uint16_t bit patterns). C (= D), alpha,
 * beta and the bias are fp32 and the compute type is CUBLAS_COMPUTE_32F
 * either way: a bf16 product is exact in fp32, so the bf16 GEMM is the
 * fp32 GEMM of the widened operands up to summation order, like the CPU
 * backend's. Returns -1 when cuBLASLt has no algorithm for a GEMM with an
 * epilogue (the caller then runs the plain GEMM and its own kernels); a
 * plain GEMM without one runs through cublasGemmEx. */
static int lt_gemm(const char *what, cudaDataType_t ab, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                   int k, float alpha, const void *A, int lda, const void *B, int ldb, float beta, float *C, int ldc,
                   cublasLtEpilogue_t epi, const float *bias, const float *aux)
{
    const size_t esize = ab == CUDA_R_16BF ? sizeof(uint16_t) : sizeof(float);
    lt_key_t key;
    memset(&key, 0, sizeof key); /* padding too: keys compare with memcmp */
    key.ab = ab;
    key.ta = ta;
    key.tb = tb;
    key.m = m;
    key.n = n;
    key.k = k;
    key.lda = lda;
    key.ldb = ldb;
    key.ldc = ldc;
    key.epi = epi;
    key.al_a = mat_align(A, lda, esize);
    key.al_b = mat_align(B, ldb, esize);
    key.al_c = mat_align(C, ldc, sizeof(float));
    key.al_bias = epi_has_bias(epi) ? align_of(bias) : 0;
    key.al_aux = epi_has_aux(epi) ? mat_align(aux, ldc, sizeof(float)) : 0;
    const lt_plan_t *p = lt_plan(&key, bias, aux, what);
    if (p->found) {
        lt_set_pointers(p, bias, aux, what); /* cublasLtMatmul reads them when called */
        ckb(cublasLtMatmul(g.lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, g.ws,
                           WORKSPACE_BYTES, g.stream), what);
        return 0;
    }
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        return -1;
    /* No cuBLASLt kernel for a plain GEMM (odd leading dimensions of bf16
     * operands can leave the heuristic empty): the same GEMM through
     * cublasGemmEx, which takes any alignment, with the same types and
     * CUBLAS_COMPUTE_32F, on the compute stream with the same workspace. */
    ckb(cublasGemmEx(g.blas, ta, tb, m, n, k, &alpha, A, ab, lda, B, ab, ldb, &beta, C, CUDA_R_32F, ldc,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT), what);
    lt_cache.blas++;
    return 0;
}

/* out[C] (=|+= by accum) the column sums of x[N, C] (see the column
 * reductions above). */
static void colsum(float *out, const float *x, int N, int C, int accum, const char *what)
{
    if (C <= 0)
        return;
    const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
    float *part = NULL;
    if (nk > 0) {
        part = col_part_room((size_t)nk * C, what);
        k_colsum_part<<<dim3((unsigned)cb, (unsigned)nk), THREADS, 0, g.stream>>>(part, x, N, C, col_rows(N));
    }
    k_colsum_fold<<<cb, THREADS, 0, g.stream>>>(out, part, nk, C, accum);
}

/* ---- matmuls (cuBLASLt; fp32, or bf16 A/B with fp32 C/D) ------------------------------
 * One forward and one backward for both GEMM precisions: ab is the type of
 * in, w and the GEMM's copy of dout (fp32, or bf16 bit patterns); every
 * output, the bias and db are fp32 (src/ops.h). With pre != NULL they are
 * the GELU-fused ops: cuBLASLt's GELU_AUX(_BIAS) epilogue in the forward
 * and DGELU in the backward, where the aux matrix's leading dimension is a
 * multiple of 8 (cuBLASLt's rule) and the heuristic offers a kernel, else
 * the plain GEMM and the elementwise GELU kernel. */

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b): column-major
 * out^T[OC,N] = (w^T[IC,OC])^T . in^T[IC,N]. With pre: pre = that sum,
 * out = gelu(pre). */
static void gemm_fwd(const char *what, cudaDataType_t ab, float *out, float *pre, const void *in, const void *w,
                     const float *b, int N, int IC, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    if (pre) {
        if (IC > 0 && OC % 8 == 0 &&
            lt_gemm(what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 0.0f, out, OC,
                    b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, b, pre) == 0) {
            lt_cache.gelu_fused++;
            return;
        }
        lt_cache.gelu_separate++;
        gemm_fwd(what, ab, pre, NULL, in, w, b, N, IC, OC);
        k_gelu_fwd<<<grid_for((size_t)N * OC, THREADS), THREADS, 0, g.stream>>>(out, pre, (size_t)N * OC);
        return;
    }
    /* the bias epilogue where cuBLASLt offers it; otherwise (or for IC 0)
     * bias rows first and a GEMM adding onto them, as the CPU backend does */
    if (IC > 0 && lt_gemm(what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 0.0f, out, OC,
                          b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, b, NULL) == 0)
        return;
    k_fill_rows<<<grid_for((size_t)N * OC, THREADS), THREADS, 0, g.stream>>>(out, b, N, OC);
    if (IC > 0)
        lt_gemm(what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 1.0f, out, OC,
                CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
}

/* din[N,IC] (=|+= by accum_din) dout[N,OC] . w[OC,IC], dw[OC,IC] (=|+= by
 * accum_dw) dout^T . in[N,IC], from dout_g (dout in the GEMM type ab);
 * db[OC] the column sums of the fp32 dout (colsum). With pre (accum_din 0): din = gelu'(pre) o (dout . w). */
static void gemm_bwd(const char *what, cudaDataType_t ab, float *din, float *dw, float *db, const void *dout_g,
                     const float *dout, const void *in, const void *w, const float *pre, int N, int IC, int OC,
                     int accum_din, int accum_dw)
{
    if (OC <= 0) { /* an empty sum: din = 0, or unchanged when accumulating */
        if (din && !accum_din && N > 0 && IC > 0) {
            ck(cudaMemsetAsync(din, 0, (size_t)N * IC * sizeof(float), g.stream), what);
            if (pre) /* 0 * gelu'(pre), as the CPU's composition */
                k_gelu_bwd<<<grid_for((size_t)N * IC, THREADS), THREADS, 0, g.stream>>>(din, pre, din,
                                                                                          (size_t)N * IC);
        }
        return;
    }
    /* din^T[IC,N] = w^T[IC,OC] . dout^T[OC,N] (column-major views) */
    if (din && N > 0 && IC > 0) {
        if (pre && IC % 8 == 0 &&
            lt_gemm(what, ab, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, dout_g, OC, 0.0f, din, IC,
                    CUBLASLT_EPILOGUE_DGELU, NULL, pre) == 0) {
            lt_cache.gelu_fused++;
        } else {
            lt_gemm(what, ab, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, dout_g, OC, accum_din ? 1.0f : 0.0f,
                    din, IC, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
            if (pre) {
                lt_cache.gelu_separate++;
                k_gelu_bwd<<<grid_for((size_t)N * IC, THREADS), THREADS, 0, g.stream>>>(din, pre, din,
                                                                                          (size_t)N * IC);
            }
        }
    }
    /* dw^T[IC,OC] = in^T[IC,N] . dout[N,OC] */
    if (dw && IC > 0) {
        if (N > 0)
            lt_gemm(what, ab, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in, IC, dout_g, OC, accum_dw ? 1.0f : 0.0f,
                    dw, IC, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
        else if (!accum_dw)
            ck(cudaMemsetAsync(dw, 0, (size_t)OC * IC * sizeof(float), g.stream), what);
    }
    if (db)
        colsum(db, dout, N, OC, accum_dw, what);
}

static void matmul_fwd(float *out, const float *in, const float *w, const float *b, int N, int IC, int OC)
{
    gemm_fwd("matmul_fwd", CUDA_R_32F, out, NULL, in, w, b, N, IC, OC);
    finish("matmul_fwd");
}

static void matmul_bwd(float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       int N, int IC, int OC, int accum_din, int accum_dw)
{
    gemm_bwd("matmul_bwd", CUDA_R_32F, din, dw, db, dout, dout, in, w, NULL, N, IC, OC, accum_din, accum_dw);
    finish("matmul_bwd");
}

static void matmul_fwd_bf16(float *out, const uint16_t *in, const uint16_t *w, const float *b, int N, int IC,
                            int OC)
{
    gemm_fwd("matmul_fwd_bf16", CUDA_R_16BF, out, NULL, in, w, b, N, IC, OC);
    finish("matmul_fwd_bf16");
}

static void matmul_bwd_bf16(float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                            const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    gemm_bwd("matmul_bwd_bf16", CUDA_R_16BF, din, dw, db, dout16, dout, in, w, NULL, N, IC, OC, accum_din,
             accum_dw);
    finish("matmul_bwd_bf16");
}

static void matmul_gelu_fwd(float *out, float *pre, const float *in, const float *w, const float *b, int N, int IC,
                            int OC)
{
    gemm_fwd("matmul_gelu_fwd", CUDA_R_32F, out, pre, in, w, b, N, IC, OC);
    finish("matmul_gelu_fwd");
}

static void matmul_gelu_fwd_bf16(float *out, float *pre, const uint16_t *in, const uint16_t *w, const float *b,
                                 int N, int IC, int OC)
{
    gemm_fwd("matmul_gelu_fwd_bf16", CUDA_R_16BF, out, pre, in, w, b, N, IC, OC);
    finish("matmul_gelu_fwd_bf16");
}

static void matmul_dgelu_bwd(float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                             const float *w, int N, int IC, int OC, int accum_dw)
{
    gemm_bwd("matmul_dgelu_bwd", CUDA_R_32F, din, dw, db, dout, dout, in, w, pre, N, IC, OC, 0, accum_dw);
    finish("matmul_dgelu_bwd");
}

static void matmul_dgelu_bwd_bf16(float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                                  const uint16_t *in, const float *pre, const uint16_t *w, int N, int IC, int OC,
                                  int accum_dw)
{
    gemm_bwd("matmul_dgelu_bwd_bf16", CUDA_R_16BF, din, dw, db, dout16, dout, in, w, pre, N, IC, OC, 0, accum_dw);
    finish("matmul_dgelu_bwd_bf16");
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

/* The partial sums of dw[c] = sum_n dout * xhat and db[c] = sum_n dout
 * over chunk blockIdx.y of `rows` rows (see the column reductions):
 * pw[k, c] and pb[k, c]. */
__global__ void k_layernorm_bwd_dw_part(float *pw, float *pb, const float *dout, const float *x, const float *mean,
                                        const float *rstd, int N, int C, int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float aw = 0.0f, ab = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * (x[i] - mean[n]) * rstd[n];
        ab += dout[i];
    }
    pw[(size_t)blockIdx.y * C + c] = aw;
    pb[(size_t)blockIdx.y * C + c] = ab;
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
    if (dw || db) {
        const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
        float *pw = NULL, *pb = NULL;
        if (nk > 0) {
            pw = col_part_room(2 * (size_t)nk * C, "layernorm_bwd");
            pb = pw + (size_t)nk * C;
            k_layernorm_bwd_dw_part<<<dim3((unsigned)cb, (unsigned)nk), THREADS, 0, g.stream>>>(
                pw, pb, dout, x, mean, rstd, N, C, col_rows(N));
        }
        if (dw)
            k_colsum_fold<<<cb, THREADS, 0, g.stream>>>(dw, pw, nk, C, accum_dw);
        if (db)
            k_colsum_fold<<<cb, THREADS, 0, g.stream>>>(db, pb, nk, C, accum_dw);
    }
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

/* The partial sums of dw[c] = sum_n dout * x * rstd over chunk blockIdx.y
 * of `rows` rows (see the column reductions): pw[k, c]. */
__global__ void k_rmsnorm_bwd_dw_part(float *pw, const float *dout, const float *x, const float *rstd, int N, int C,
                                      int rows)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C)
        return;
    const int n0 = blockIdx.y * rows, n1 = min(N, n0 + rows);
    float aw = 0.0f;
    for (int n = n0; n < n1; n++) {
        size_t i = (size_t)n * C + c;
        aw += dout[i] * x[i] * rstd[n];
    }
    pw[(size_t)blockIdx.y * C + c] = aw;
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
    if (dw) {
        const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
        float *pw = NULL;
        if (nk > 0) {
            pw = col_part_room((size_t)nk * C, "rmsnorm_bwd");
            k_rmsnorm_bwd_dw_part<<<dim3((unsigned)cb, (unsigned)nk), THREADS, 0, g.stream>>>(pw, dout, x, rstd, N,
                                                                                              C, col_rows(N));
        }
        k_colsum_fold<<<cb, THREADS, 0, g.stream>>>(dw, pw, nk, C, accum_dw);
    }
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

/* ---- attention: tiled flash attention in fp32 -------------------------------------------
 * A straightforward fp32 FlashAttention-2 kernel set on the CUDA cores (no tensor cores
 * yet; bf16 q/k/v with mma instructions is a later step). The T x T scores and
 * probabilities never exist in global memory: the forward keeps lse[B,NH,T] (the ops
 * contract) and the backward recomputes P tile by tile from it.
 *
 * Tiling. Query tiles of ATT_BR = 32 rows, key tiles of ATT_BC = 32 rows, and the head
 * dimension in chunks of ATT_DK = 64 columns. A block has ATT_THREADS = 128 threads: tile
 * row r = tid / 4 belongs to the 4 consecutive lanes of a quad (q = tid % 4), which hold
 * that row's 32 scores as columns q, q + 4, ..., q + 28 and its accumulated output columns
 * q, q + 4, ..., q + 60 of each 64-column chunk. Row reductions (max, sums, D) are two
 * xor shuffles inside the quad. Accumulators (O, dQ, dK and dV) live in registers, NC
 * chunks of them: NC = 1, 2 or 4 for HS up to 64, 128 or 256. Beyond 256 the grid splits
 * the head dimension into groups of 256 accumulated columns; every group's block still
 * computes the scores over all of HS (the softmax needs all of them), so any HS works and
 * only HS > 256 pays for recomputation.
 *
 * Shared memory, static and under the 48 KiB that needs no opt-in (rows padded to 65 and
 * 33 floats so that the rows a warp reads at once fall on different banks):
 *   forward   Q chunk, K-then-V chunk [32][65]; P [32][33]                 20,864 B
 *   dQ        Q, dO, K, V chunks [32][65]; dS [32][33]                     37,504 B
 *   dK/dV     K, V, Q, dO chunks [32][65]; P^T, dS^T [32][33]; lse, D [32]  41,984 B
 * With HS <= 64 there is one chunk, and the tiles a block keeps (Q in the forward, Q and
 * dO in dQ, K and V in dK/dV) are loaded once; otherwise chunks are loaded again where
 * they are used (from L2). Partial tiles (T not a multiple of 32, HS not of 64)
 * are zero-filled and masked scores give P = 0, so padding adds nothing.
 *
 * Forward, grid (query tiles x column groups, NH, B). Over key tiles 0 .. the causal
 * limit, for each query row t with scores s_j = scale q_t.k_j (keys j <= t):
 *   m' = max(m, max_j s_j),  a = e^(m - m'),  l = a l + sum_j e^(s_j - m'),
 *   O = a O + sum_j e^(s_j - m') v_j,  m = m'
 * from m = -inf, l = 0, O = 0; then out_t = O / l and lse_t = m + log(l).
 *
 * Backward, the FlashAttention-2 scheme: P_tj = e^(s_tj - lse_t) recomputed, dP_tj =
 * dO_t.v_j, D_t = rowsum(dO_t o out_t) (equal to rowsum(dP_t o P_t)), dS = P o (dP - D).
 *  - dK/dV, grid (key tiles x column groups, NKV, B): a block owns one key tile of one KV
 *    head and loops over the query heads of its GQA group and their query tiles at or
 *    after the key tile: dV_j += sum_t P_tj dO_t, dK_j += scale sum_t dS_tj q_t. D is
 *    computed per query tile on the fly (HS-long dot products from out and dout): the
 *    ops table gives no workspace and ops do not allocate.
 *  - dQ, grid (query tiles x column groups, NH, B): a block owns one query tile of one
 *    query head and loops over key tiles up to the causal limit: dQ_t += scale sum_j
 *    dS_tj k_j.
 *  Every element of dqkv (q, k and v columns of every row) is written by exactly one
 *  block, so nothing is accumulated into it and there are no atomics.
 *
 * Determinism: every sum runs in a fixed order (head-dimension columns in order, then
 * tiles in order, fixed shuffle pairs), with no atomics, so results are bit-identical
 * run to run. They differ from the CPU's by rounding: the online softmax rescales where
 * the CPU's two-pass softmax does not, and the sums run in other orders (see the
 * self-test bounds). Causal work is uneven across query tiles, so the forward and dQ
 * grids start with the last (longest) tiles; dK/dV's longest tiles come first anyway.
 *
 * q, k, v are strided views of qkv rows of R = (NH + 2 NKV) HS floats, token n = b T + t;
 * query head h reads KV head h / (NH / NKV). */

#define ATT_BR 32 /* query rows per tile */
#define ATT_BC 32 /* key rows per tile */
#define ATT_DK 64 /* head-dimension columns per shared-memory chunk */
#define ATT_CW (ATT_DK / 4)  /* accumulated columns per thread per chunk */
#define ATT_SW (ATT_BC / 4)  /* scores per thread per tile (and query rows per thread in dK/dV) */
#define ATT_GROUP 4          /* most chunks of accumulated columns per block (256 columns) */

static_assert(ATT_THREADS == 4 * ATT_BR && ATT_THREADS == 4 * ATT_BC,
              "attention kernels: one quad of threads per tile row");
static_assert(ATT_BR == ATT_BC, "attention kernels: att_load and dK/dV assume square tiles");
static_assert(ATT_DK % 4 == 0, "attention kernels: a chunk's columns are split over a quad");

/* A [32][ATT_DK] chunk, rows padded by one float. */
typedef float att_chunk_t[ATT_DK + 1];

/* dst[r][c] = src[(row0 + r) ld + c] for the tile's 32 rows and ATT_DK columns; zero
 * where row0 + r >= T or c >= ncol (partial tiles). src points at the chunk's first
 * column in token row 0 of the batch row. Consecutive threads read consecutive
 * columns (coalesced). Every thread of the block calls it; the caller synchronises. */
static __device__ void att_load(att_chunk_t *dst, const float *src, size_t ld, int row0, int T, int ncol)
{
    for (int i = threadIdx.x; i < ATT_BR * ATT_DK; i += ATT_THREADS) {
        const int r = i / ATT_DK, c = i % ATT_DK;
        dst[r][c] = row0 + r < T && c < ncol ? src[(size_t)(row0 + r) * ld + c] : 0.0f;
    }
}

/* Sum / max over the 4 lanes of a quad (xor 1, then xor 2). Every lane gets the same
 * bits: float addition and fmaxf are commutative, and each lane adds the same pairs.
 * All 32 lanes of the warp must call them. */
static __device__ float quad_sum(float v)
{
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

static __device__ float quad_max(float v)
{
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    return v;
}

/* D = rowsum(a o b) over n columns by a quad: lane q sums columns q, q + 4, ... in order,
 * then quad_sum. n = 0 (a row past T) gives 0. dQ and dK/dV both compute D with this, so
 * the two kernels use the same bits. All 32 lanes must call it. */
static __device__ float att_quad_dot(const float *a, const float *b, int n, int q)
{
    float s = 0.0f;
    for (int d = q; d < n; d += 4)
        s += a[d] * b[d];
    return quad_sum(s);
}

/* Forward: one block per (query tile, column group) x head x batch row. NC chunks of
 * accumulated columns; the block's group starts at column g0 = group * NC * ATT_DK.
 * Writes out[b T + t, h HS + columns of the group] and (group 0) lse[b, h, t]. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_fwd(float *out, float *lse, const float *qkv, int T, int NH, int NKV, int HS, float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR];  /* Q chunk of the query tile */
    __shared__ att_chunk_t sKV[ATT_BC]; /* K chunk of the key tile, then its V chunk */
    __shared__ float sP[ATT_BR][ATT_BC + 1];
    const int nqt = (T + ATT_BR - 1) / ATT_BR;
    const int qt = nqt - 1 - (int)(blockIdx.x % (unsigned)nqt); /* longest tiles first */
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int t0 = qt * ATT_BR, t = t0 + r; /* this quad's query row */
    const float *base = qkv + (size_t)b * T * R;
    const float *qs = base + (size_t)h * HS, *ks = base + (size_t)(NH + kh) * HS,
                *vs = base + (size_t)(NH + NKV + kh) * HS;
    /* the last key tile holding a key <= the tile's last row */
    const int last = min((T - 1) / ATT_BC, (t0 + ATT_BR - 1) / ATT_BC);

    float m = -INFINITY, l = 0.0f, acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1)
        att_load(sQ, qs, R, t0, T, HS);

    for (int kt = 0; kt <= last; kt++) {
        const int j0 = kt * ATT_BC;
        /* s[i] = q_t . k_(j0 + q + 4i), over the head dimension chunk by chunk */
        float s[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1)
                att_load(sQ, qs + d0, R, t0, T, dn);
            att_load(sKV, ks + d0, R, j0, T, dn);
            __syncthreads();
            for (int d = 0; d < dn; d++) {
                const float qv = sQ[r][d];
#pragma unroll
                for (int i = 0; i < ATT_SW; i++)
                    s[i] += qv * sKV[q + 4 * i][d];
            }
            __syncthreads(); /* sQ and sKV are free again */
        }
        /* online softmax update of row t (masked: key after t or past T) */
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            s[i] = j <= t && j < T ? scale * s[i] : -INFINITY;
            mx = fmaxf(mx, s[i]);
        }
        const float mnew = fmaxf(m, quad_max(mx));
        /* mnew is finite for every row (each tile up to the limit has a key <= t);
         * the guards only keep -inf - -inf (NaN) out of a row without keys */
        const float alpha = mnew == -INFINITY ? 1.0f : dt_expf(m - mnew);
        float ps = 0.0f;
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const float p = s[i] == -INFINITY ? 0.0f : dt_expf(s[i] - mnew);
            sP[r][q + 4 * i] = p;
            ps += p;
        }
        l = l * alpha + quad_sum(ps);
        m = mnew;
        /* O = alpha O + P V, V chunk by chunk (the sync after the load also
         * publishes sP) */
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            att_load(sKV, vs + c0, R, j0, T, min(ATT_DK, HS - c0));
            __syncthreads();
#pragma unroll
            for (int i = 0; i < ATT_CW; i++)
                acc[c][i] *= alpha;
            for (int j = 0; j < ATT_BC; j++) {
                const float p = sP[r][j];
#pragma unroll
                for (int i = 0; i < ATT_CW; i++)
                    acc[c][i] += p * sKV[j][q + 4 * i];
            }
            __syncthreads(); /* sKV and sP are free again */
        }
    }
    if (t < T) {
        const float inv = 1.0f / l;
        float *o = out + ((size_t)b * T + t) * OC + (size_t)h * HS;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS)
                    o[col] = acc[c][i] * inv;
            }
        if (g0 == 0 && q == 0)
            lse[((size_t)b * NH + h) * T + t] = m + logf(l);
    }
}

/* dQ: one block per (query tile, column group) x head x batch row. Writes the q columns
 * of the group: dqkv[b T + t, h HS + columns]. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_bwd_dq(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int T,
                 int NH, int NKV, int HS, float scale)
{
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ float sdS[ATT_BR][ATT_BC + 1];
    const int nqt = (T + ATT_BR - 1) / ATT_BR;
    const int qt = nqt - 1 - (int)(blockIdx.x % (unsigned)nqt); /* longest tiles first */
    const int g0 = (int)(blockIdx.x / (unsigned)nqt) * NC * ATT_DK;
    const int h = blockIdx.y, b = blockIdx.z, kh = h / (NH / NKV);
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int t0 = qt * ATT_BR, t = t0 + r;
    const float *base = qkv + (size_t)b * T * R;
    const float *qs = base + (size_t)h * HS, *ks = base + (size_t)(NH + kh) * HS,
                *vs = base + (size_t)(NH + NKV + kh) * HS;
    const float *dos = dout + (size_t)b * T * OC + (size_t)h * HS, *os = out + (size_t)b * T * OC + (size_t)h * HS;
    const int last = min((T - 1) / ATT_BC, (t0 + ATT_BR - 1) / ATT_BC);
    /* row t's lse and D (rows past T: 0, never used) */
    const float L = t < T ? lse[((size_t)b * NH + h) * T + t] : 0.0f;
    const size_t orow = (size_t)(t < T ? t : 0) * OC;
    const float D = att_quad_dot(dos + orow, os + orow, t < T ? HS : 0, q);

    float acc[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            acc[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sQ, qs, R, t0, T, HS);
        att_load(sdO, dos, OC, t0, T, HS);
    }

    for (int kt = 0; kt <= last; kt++) {
        const int j0 = kt * ATT_BC;
        /* s[i] = q_t . k_j, dp[i] = dO_t . v_j for j = j0 + q + 4i */
        float s[ATT_SW], dp[ATT_SW];
#pragma unroll
        for (int i = 0; i < ATT_SW; i++)
            s[i] = dp[i] = 0.0f;
        for (int dc = 0; dc < nd; dc++) {
            const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
            if (nd > 1) {
                att_load(sQ, qs + d0, R, t0, T, dn);
                att_load(sdO, dos + d0, OC, t0, T, dn);
            }
            att_load(sK, ks + d0, R, j0, T, dn);
            att_load(sV, vs + d0, R, j0, T, dn);
            __syncthreads();
            for (int d = 0; d < dn; d++) {
                const float qv = sQ[r][d], gv = sdO[r][d];
#pragma unroll
                for (int i = 0; i < ATT_SW; i++) {
                    s[i] += qv * sK[q + 4 * i][d];
                    dp[i] += gv * sV[q + 4 * i][d];
                }
            }
            __syncthreads();
        }
        /* dS = P o (dP - D), P = e^(s - lse); 0 where masked */
#pragma unroll
        for (int i = 0; i < ATT_SW; i++) {
            const int j = j0 + q + 4 * i;
            const float p = j <= t && j < T ? dt_expf(scale * s[i] - L) : 0.0f;
            sdS[r][q + 4 * i] = j <= t && j < T ? dt_softmax_grad(p, dp[i], D) : 0.0f;
        }
        /* dQ += dS K, K chunk by chunk: with one chunk sK still holds it (the
         * sync after the reload, or this one, publishes sdS) */
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int c0 = g0 + c * ATT_DK;
            if (c0 >= HS)
                break;
            if (nd > 1)
                att_load(sK, ks + c0, R, j0, T, min(ATT_DK, HS - c0));
            __syncthreads();
            for (int j = 0; j < ATT_BC; j++) {
                const float ds = sdS[r][j];
#pragma unroll
                for (int i = 0; i < ATT_CW; i++)
                    acc[c][i] += ds * sK[j][q + 4 * i];
            }
            __syncthreads();
        }
    }
    if (t < T) {
        float *dq = dqkv + ((size_t)b * T + t) * R + (size_t)h * HS;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS)
                    dq[col] = scale * acc[c][i];
            }
    }
}

/* dK, dV: one block per (key tile, column group) x KV head x batch row, over the query
 * heads h of the group and their query tiles from the one holding the tile's first key.
 * Here the quad of tile row r owns key row j = j0 + r, and its score lanes are the query
 * rows t0 + q + 4i. Writes the k and v columns of the group for the tile's keys. */
template <int NC>
__global__ void __launch_bounds__(ATT_THREADS)
    k_att_bwd_dkv(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse, int T,
                  int NH, int NKV, int HS, float scale)
{
    __shared__ att_chunk_t sK[ATT_BC], sV[ATT_BC];  /* the key tile's chunks */
    __shared__ att_chunk_t sQ[ATT_BR], sdO[ATT_BR]; /* the query tile's chunks */
    __shared__ float sPt[ATT_BC][ATT_BR + 1];        /* P^T: [key row][query row] */
    __shared__ float sdSt[ATT_BC][ATT_BR + 1];       /* dS^T */
    __shared__ float sL[ATT_BR], sD[ATT_BR];         /* the query tile's lse and D */
    const int nkt = (T + ATT_BC - 1) / ATT_BC, nqt = (T + ATT_BR - 1) / ATT_BR;
    const int kt = (int)(blockIdx.x % (unsigned)nkt);
    const int g0 = (int)(blockIdx.x / (unsigned)nkt) * NC * ATT_DK;
    const int kh = blockIdx.y, b = blockIdx.z, grp = NH / NKV;
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, nd = (HS + ATT_DK - 1) / ATT_DK;
    const int r = threadIdx.x >> 2, q = threadIdx.x & 3;
    const int j0 = kt * ATT_BC, j = j0 + r; /* this quad's key row */
    const float *base = qkv + (size_t)b * T * R;
    const float *ks = base + (size_t)(NH + kh) * HS, *vs = base + (size_t)(NH + NKV + kh) * HS;

    float dk[NC][ATT_CW], dv[NC][ATT_CW];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int i = 0; i < ATT_CW; i++)
            dk[c][i] = dv[c][i] = 0.0f;
    if (nd == 1) {
        att_load(sK, ks, R, j0, T, HS);
        att_load(sV, vs, R, j0, T, HS);
    }

    for (int h = kh * grp; h < (kh + 1) * grp; h++) {
        const float *qs = base + (size_t)h * HS;
        const float *dos = dout + (size_t)b * T * OC + (size_t)h * HS,
                    *os = out + (size_t)b * T * OC + (size_t)h * HS;
        const float *lrow = lse + ((size_t)b * NH + h) * T;
        for (int qt = j0 / ATT_BR; qt < nqt; qt++) {
            const int t0 = qt * ATT_BR;
            { /* lse and D of query row t0 + r, by the same quad layout as dQ's */
                const int tr = t0 + r;
                const size_t orow = (size_t)(tr < T ? tr : 0) * OC;
                const float D = att_quad_dot(dos + orow, os + orow, tr < T ? HS : 0, q);
                if (q == 0) {
                    sD[r] = D;
                    sL[r] = tr < T ? lrow[tr] : 0.0f;
                }
            }
            /* s[i] = k_j . q_t, dp[i] = v_j . dO_t for t = t0 + q + 4i: the same
             * products in the same order as in the forward and dQ */
            float s[ATT_SW], dp[ATT_SW];
#pragma unroll
            for (int i = 0; i < ATT_SW; i++)
                s[i] = dp[i] = 0.0f;
            for (int dc = 0; dc < nd; dc++) {
                const int d0 = dc * ATT_DK, dn = min(ATT_DK, HS - d0);
                if (nd > 1) {
                    att_load(sK, ks + d0, R, j0, T, dn);
                    att_load(sV, vs + d0, R, j0, T, dn);
                }
                att_load(sQ, qs + d0, R, t0, T, dn);
                att_load(sdO, dos + d0, OC, t0, T, dn);
                __syncthreads(); /* also publishes sL, sD */
                for (int d = 0; d < dn; d++) {
                    const float kv = sK[r][d], vv = sV[r][d];
#pragma unroll
                    for (int i = 0; i < ATT_SW; i++) {
                        s[i] += sQ[q + 4 * i][d] * kv;
                        dp[i] += sdO[q + 4 * i][d] * vv;
                    }
                }
                __syncthreads();
            }
            /* P^T and dS^T of key row j; 0 where masked (query before j, or
             * either row past T) */
#pragma unroll
            for (int i = 0; i < ATT_SW; i++) {
                const int ti = q + 4 * i, tt = t0 + ti;
                const int ok = tt >= j && tt < T && j < T;
                const float p = ok ? dt_expf(scale * s[i] - sL[ti]) : 0.0f;
                sPt[r][ti] = p;
                sdSt[r][ti] = ok ? dt_softmax_grad(p, dp[i], sD[ti]) : 0.0f;
            }
            /* dV += P^T dO, dK += dS^T Q, chunk by chunk: with one chunk sQ and sdO
             * still hold it (the sync after the reload, or this one, publishes sPt
             * and sdSt) */
#pragma unroll
            for (int c = 0; c < NC; c++) {
                const int c0 = g0 + c * ATT_DK;
                if (c0 >= HS)
                    break;
                if (nd > 1) {
                    att_load(sQ, qs + c0, R, t0, T, min(ATT_DK, HS - c0));
                    att_load(sdO, dos + c0, OC, t0, T, min(ATT_DK, HS - c0));
                }
                __syncthreads();
                for (int ti = 0; ti < ATT_BR; ti++) {
                    const float p = sPt[r][ti], ds = sdSt[r][ti];
#pragma unroll
                    for (int i = 0; i < ATT_CW; i++) {
                        dv[c][i] += p * sdO[ti][q + 4 * i];
                        dk[c][i] += ds * sQ[ti][q + 4 * i];
                    }
                }
                __syncthreads(); /* sQ, sdO, sPt, sdSt, sL, sD are free again */
            }
        }
    }
    if (j < T) {
        float *row = dqkv + ((size_t)b * T + j) * R;
#pragma unroll
        for (int c = 0; c < NC; c++)
#pragma unroll
            for (int i = 0; i < ATT_CW; i++) {
                const int col = g0 + c * ATT_DK + q + 4 * i;
                if (col < HS) {
                    row[(size_t)(NH + kh) * HS + col] = scale * dk[c][i];
                    row[(size_t)(NH + NKV + kh) * HS + col] = dv[c][i];
                }
            }
    }
}

/* 0 for an empty call (nothing to write), 1 to run; ends the job where the
 * grid cannot hold the shape (B or NH over 65535: grid y and z), rather
 * than leave out, lse or dqkv unwritten. */
static int att_dims_ok(const char *op, int B, int T, int NH, int NKV, int HS)
{
    if (B <= 0 || T <= 0 || NH <= 0 || NKV <= 0 || HS <= 0)
        return 0;
    if (B > 65535 || NH > 65535)
        cuda_fatal(op, "batch rows or heads over the grid's 65535 limit: use a smaller --micro-batch");
    return 1;
}

/* Chunks of accumulated columns per block (the kernels' NC) for head size HS. */
static int att_nc(int HS)
{
    return HS <= ATT_DK ? 1 : HS <= 2 * ATT_DK ? 2 : ATT_GROUP;
}

/* Grid x of a kernel with `tiles` row tiles and nc chunks per block: tiles x column
 * groups. Ends the job if it does not fit the grid (T or HS beyond any real model). */
static unsigned att_grid_x(const char *op, int tiles, int nc, int HS)
{
    const long long groups = (HS + (long long)nc * ATT_DK - 1) / ((long long)nc * ATT_DK);
    const long long x = (long long)tiles * groups;
    if (x > 0x7fffffffLL)
        cuda_fatal(op, "too many tiles for one grid (T x head size too large)");
    return (unsigned)x;
}

static void attention_fwd(float *out, float *lse, const float *qkv, int B, int T, int NH, int NKV, int HS)
{
    if (!att_dims_ok("attention_fwd", B, T, NH, NKV, HS))
        return;
    const float scale = 1.0f / sqrtf((float)HS);
    const int nc = att_nc(HS);
    dim3 grid(att_grid_x("attention_fwd", (T + ATT_BR - 1) / ATT_BR, nc, HS), (unsigned)NH, (unsigned)B);
    if (nc == 1)
        k_att_fwd<1><<<grid, ATT_THREADS, 0, g.stream>>>(out, lse, qkv, T, NH, NKV, HS, scale);
    else if (nc == 2)
        k_att_fwd<2><<<grid, ATT_THREADS, 0, g.stream>>>(out, lse, qkv, T, NH, NKV, HS, scale);
    else
        k_att_fwd<ATT_GROUP><<<grid, ATT_THREADS, 0, g.stream>>>(out, lse, qkv, T, NH, NKV, HS, scale);
    finish("attention_fwd");
}

static void attention_bwd(float *dqkv, const float *dout, const float *qkv, const float *out, const float *lse,
                          int B, int T, int NH, int NKV, int HS)
{
    if (!att_dims_ok("attention_bwd", B, T, NH, NKV, HS))
        return;
    const float scale = 1.0f / sqrtf((float)HS);
    const int nc = att_nc(HS);
    dim3 gq(att_grid_x("attention_bwd", (T + ATT_BR - 1) / ATT_BR, nc, HS), (unsigned)NH, (unsigned)B);
    dim3 gk(att_grid_x("attention_bwd", (T + ATT_BC - 1) / ATT_BC, nc, HS), (unsigned)NKV, (unsigned)B);
    /* two kernels writing disjoint columns of dqkv (q, then k and v) */
    if (nc == 1) {
        k_att_bwd_dq<1><<<gq, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
        k_att_bwd_dkv<1><<<gk, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
    } else if (nc == 2) {
        k_att_bwd_dq<2><<<gq, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
        k_att_bwd_dkv<2><<<gk, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
    } else {
        k_att_bwd_dq<ATT_GROUP><<<gq, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS, scale);
        k_att_bwd_dkv<ATT_GROUP><<<gk, ATT_THREADS, 0, g.stream>>>(dqkv, dout, qkv, out, lse, T, NH, NKV, HS,
                                                                   scale);
    }
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

/* dwte. The CPU adds each token's dout row into its embedding row in token
 * order; a thread per column doing the same would run N dependent
 * read-modify-writes one after another on C/256 blocks (about 10 ms for N
 * = 16K tokens). So the tokens are grouped by row first: a stable radix
 * sort of (row, n) pairs (cub), keys out of this rank's range sorted last
 * as the sentinel Vl, keeps each row's tokens in increasing n; run-length
 * encoding gives each distinct row and its token count, an exclusive scan
 * their offsets; then one block per distinct row adds its tokens' rows in
 * n order onto the embedding row. Every element gets the CPU's additions
 * in the CPU's order: the same bits, with no atomics. */

/* key[n] = this rank's row of token n, or Vl when not held; val[n] = n */
__global__ void k_emb_keys(int *key, int *val, const int32_t *tok, int N, int v0, int Vl)
{
    GRID_STRIDE(n, (size_t)N) {
        const int r = tok[n] - v0;
        key[n] = r >= 0 && r < Vl ? r : Vl;
        val[n] = (int)n;
    }
}

/* Block b < *nruns: row[b] (unless the sentinel) += dout rows tok_n[off[b]
 * .. off[b] + cnt[b]) in that order. */
__global__ void k_emb_rows(float *dwte, const float *dout, const int *row, const int *off, const int *cnt,
                           const int *tok_n, const int *nruns, int C, int Vl)
{
    const int b = blockIdx.x;
    if (b >= *nruns || row[b] >= Vl)
        return;
    float *e = dwte + (size_t)row[b] * C;
    const int j0 = off[b], j1 = off[b] + cnt[b];
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float a = e[c];
        for (int j = j0; j < j1; j++)
            a += dout[(size_t)tok_n[j] * C + c];
        e[c] = a;
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

/* The grouping's buffers for N tokens (stream-ordered growth, as
 * col_part_room): seven int arrays of N and cub's scratch. */
static void emb_room(int N, size_t scratch)
{
    const char *what = "embedding_bwd";
    if ((size_t)N > g.emb_cap || scratch > g.emb_scratch_cap) {
        const size_t n = (size_t)N > g.emb_cap ? (size_t)N : g.emb_cap;
        const size_t sb = scratch > g.emb_scratch_cap ? scratch : g.emb_scratch_cap;
        if (g.emb)
            ck(cudaFreeAsync(g.emb, g.stream), what);
        g.emb = NULL;
        g.emb_cap = g.emb_scratch_cap = 0;
        ck(cudaMallocAsync(&g.emb, (7 * n + 1) * sizeof(int) + sb, g.stream), what);
        g.emb_cap = n;
        g.emb_scratch_cap = sb;
    }
}

/* dwte[row of tok[n]] += dout[n] for the tokens held, grouped by row (see
 * k_emb_keys). */
static void embedding_bwd_rows(float *dwte, const float *dout, const int32_t *tok, int N, int C, int v0, int Vl)
{
    const char *what = "embedding_bwd";
    int end_bit = 1; /* keys go up to the sentinel Vl */
    while (end_bit < 31 && (Vl >> end_bit) != 0)
        end_bit++;
    size_t s_sort = 0, s_rle = 0, s_scan = 0;
    int *nul = NULL;
    ck(cub::DeviceRadixSort::SortPairs(NULL, s_sort, nul, nul, nul, nul, N, 0, end_bit, g.stream), what);
    ck(cub::DeviceRunLengthEncode::Encode(NULL, s_rle, nul, nul, nul, nul, N, g.stream), what);
    ck(cub::DeviceScan::ExclusiveSum(NULL, s_scan, nul, nul, N, g.stream), what);
    size_t scratch = s_sort > s_rle ? s_sort : s_rle;
    scratch = (scratch > s_scan ? scratch : s_scan) + 256; /* + room to align it */
    emb_room(N, scratch);
    const size_t n = g.emb_cap;
    int *key = (int *)g.emb, *val = key + n, *key_s = val + n, *val_s = key_s + n, *row = val_s + n;
    int *cnt = row + n, *off = cnt + n, *nruns = off + n;
    void *tmp = (void *)(((uintptr_t)(nruns + 1) + 255) & ~(uintptr_t)255);
    k_emb_keys<<<grid_for((size_t)N, THREADS), THREADS, 0, g.stream>>>(key, val, tok, N, v0, Vl);
    ck(cub::DeviceRadixSort::SortPairs(tmp, s_sort, key, key_s, val, val_s, N, 0, end_bit, g.stream), what);
    /* counts past the runs are never written: zero them for the scan */
    ck(cudaMemsetAsync(cnt, 0, (size_t)N * sizeof(int), g.stream), what);
    ck(cub::DeviceRunLengthEncode::Encode(tmp, s_rle, key_s, row, cnt, nruns, N, g.stream), what);
    ck(cub::DeviceScan::ExclusiveSum(tmp, s_scan, cnt, off, N, g.stream), what);
    k_emb_rows<<<(unsigned)N, THREADS, 0, g.stream>>>(dwte, dout, row, off, cnt, val_s, nruns, C, Vl);
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
        embedding_bwd_rows(dwte, dout, tok, N, C, v0, Vl);
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

static void adamw(float *p, uint16_t *p16, const float *gr, float *m, float *v, size_t n, float lr, float beta1,
                  float beta2, float eps, float wd, float grad_scale, int t)
{
    if (!n)
        return;
    const dt_adamw_coef_t k = dt_adamw_coef(lr, beta1, beta2, eps, wd, grad_scale, t);
    k_adamw<<<grid_for(n, THREADS), THREADS, 0, g.stream>>>(p, p16, gr, m, v, n, k);
    finish("adamw");
}

/* Grows sumsq's buffers to hold count vectors. cudaFree waits for the
 * device, so no pending kernel still uses the old ones. */
static void sumsq_room(int count)
{
    if (count <= g.sum_cap)
        return;
    int cap = g.sum_cap ? g.sum_cap : 256;
    while (cap < count)
        cap = cap > INT_MAX / 2 ? count : 2 * cap;
    if (g.part)
        ck(cudaFree(g.part), "sumsq: cudaFree");
    if (g.xs)
        ck(cudaFree(g.xs), "sumsq: cudaFree");
    if (g.ns)
        ck(cudaFree(g.ns), "sumsq: cudaFree");
    free(g.hpart);
    g.part = NULL, g.xs = NULL, g.ns = NULL, g.sum_cap = 0;
    g.hpart = (double *)malloc((size_t)cap * SUMSQ_BLOCKS * sizeof(double));
    if (!g.hpart)
        cuda_fatal("sumsq", "out of host memory for the partial sums");
    ck(cudaMalloc((void **)&g.part, (size_t)cap * SUMSQ_BLOCKS * sizeof(double)), "sumsq: cudaMalloc");
    ck(cudaMalloc((void **)&g.xs, (size_t)cap * sizeof *g.xs), "sumsq: cudaMalloc");
    ck(cudaMalloc((void **)&g.ns, (size_t)cap * sizeof *g.ns), "sumsq: cudaMalloc");
    g.sum_cap = cap;
}

/* One launch for every vector (65535 per launch: gridDim.y's limit), one
 * copy of the partials back, one wait. */
static void sumsq(double *out, const float *const *x, const size_t *n, int count)
{
    if (count <= 0)
        return;
    sumsq_room(count);
    /* pageable sources: staged before the calls return, so x and n may change after */
    ck(cudaMemcpyAsync(g.xs, x, (size_t)count * sizeof *g.xs, cudaMemcpyHostToDevice, g.stream),
       "sumsq: cudaMemcpyAsync");
    ck(cudaMemcpyAsync(g.ns, n, (size_t)count * sizeof *g.ns, cudaMemcpyHostToDevice, g.stream),
       "sumsq: cudaMemcpyAsync");
    for (int first = 0; first < count; first += 65535) {
        const int c = count - first < 65535 ? count - first : 65535;
        k_sumsq<<<dim3(SUMSQ_BLOCKS, (unsigned)c), THREADS, 0, g.stream>>>(g.part + (size_t)first * SUMSQ_BLOCKS,
                                                                            g.xs + first, g.ns + first);
        ck(cudaGetLastError(), "sumsq");
    }
    ck(cudaMemcpyAsync(g.hpart, g.part, (size_t)count * SUMSQ_BLOCKS * sizeof(double), cudaMemcpyDeviceToHost,
                       g.stream), "sumsq: cudaMemcpyAsync");
    wait_all("sumsq");
    for (int v = 0; v < count; v++) {
        double tot = 0.0;
        for (int b = 0; b < SUMSQ_BLOCKS; b++)
            tot += g.hpart[(size_t)v * SUMSQ_BLOCKS + b];
        out[v] = tot;
    }
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
    wait_all("f32_to_bf16_cuda");
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
    /* the fallback's handle, made now rather than mid-run (its setup may
     * allocate, and cudaFree waits for the whole device, NCCL kernels
     * included); SetStream before SetWorkspace, which SetStream resets */
    bs = cublasCreate(&g.blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(g.blas, g.stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(g.blas, g.ws, WORKSPACE_BYTES);
    if (bs != CUBLAS_STATUS_SUCCESS) {
        snprintf(err, errlen, "CUDA backend on device %d: cuBLAS handle: %s", dev, cublasGetStatusString(bs));
        ops_cuda_shutdown();
        return -1;
    }
    int concurrent = 0;
    rc = cudaDeviceGetAttribute(&concurrent, cudaDevAttrConcurrentManagedAccess, dev);
    if (rc != cudaSuccess) {
        snprintf(err, errlen, "CUDA backend on device %d: cudaDeviceGetAttribute: %s (%s)", dev,
                 cudaGetErrorString(rc), cudaGetErrorName(rc));
        ops_cuda_shutdown();
        return -1;
    }
    const char *s = getenv("DTRAIN_CUDA_SYNC_OPS");
    g.sync_ops = !concurrent || (s && strcmp(s, "1") == 0);
    g.concurrent = concurrent;
    g.dev = dev;
    memset(&cuda_ops, 0, sizeof cuda_ops);
    cuda_ops.name = "cuda";
    cuda_ops.sync = cu_sync;
    cuda_ops.alloc = cu_alloc;
    cuda_ops.free = cu_free;
    cuda_ops.copy = cu_copy;
    cuda_ops.to_host = cu_to_host;
    cuda_ops.from_host = cu_from_host;
    cuda_ops.zero = cu_zero;
    cuda_ops.matmul_fwd = matmul_fwd;
    cuda_ops.matmul_bwd = matmul_bwd;
    cuda_ops.matmul_fwd_bf16 = matmul_fwd_bf16;
    cuda_ops.matmul_bwd_bf16 = matmul_bwd_bf16;
    cuda_ops.matmul_gelu_fwd = matmul_gelu_fwd;
    cuda_ops.matmul_gelu_fwd_bf16 = matmul_gelu_fwd_bf16;
    cuda_ops.matmul_dgelu_bwd = matmul_dgelu_bwd;
    cuda_ops.matmul_dgelu_bwd_bf16 = matmul_dgelu_bwd_bf16;
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
    lt_cache_release();
    if (g.blas)
        (void)cublasDestroy(g.blas);
    if (g.lt)
        (void)cublasLtDestroy(g.lt);
    if (g.col_part)
        (void)cudaFreeAsync(g.col_part, g.stream);
    if (g.emb)
        (void)cudaFreeAsync(g.emb, g.stream);
    if (g.part)
        (void)cudaFree(g.part);
    if (g.xs)
        (void)cudaFree(g.xs);
    if (g.ns)
        (void)cudaFree(g.ns);
    free(g.hpart);
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

extern "C" void *ops_cuda_stream(void)
{
    return g.ready ? (void *)g.stream : NULL;
}

extern "C" void ops_cuda_gemm_plans(long *made, long *reused, long *blas)
{
    *made = lt_cache.made;
    *reused = lt_cache.reused;
    *blas = lt_cache.blas;
}

extern "C" void ops_cuda_gelu_epilogues(long *fused, long *separate)
{
    *fused = lt_cache.gelu_fused;
    *separate = lt_cache.gelu_separate;
}

extern "C" int ops_cuda_concurrent_managed(void)
{
    return g.concurrent;
}

extern "C" int ops_cuda_synchronous(void)
{
    return g.ready && g.sync_ops;
}
