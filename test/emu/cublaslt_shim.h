/* Host emulation of the part of the CUDA runtime, cuBLAS and cuBLASLt that
 * ops_cuda.cu's GEMM path calls, so that test_gemm_emu.cpp can run that code
 * (cuda/ops_cuda_gemm.cuh, included as it is) on a machine with no GPU. The
 * real headers (-isystem, the toolkit's include/) give the types, enum
 * values and prototypes; this file defines the functions, with the
 * semantics the cuBLAS/cuBLASLt documentation gives them:
 *  - column-major; op(A) m x k, op(B) k x n from the layouts and
 *    TRANSA/TRANSB; D = alpha op(A) op(B) + beta C (C not read when
 *    beta == 0), then the epilogue: BIAS adds bias[i] (length: rows of D) to
 *    every column; GELU_AUX(_BIAS) stores the GELU input (after the bias)
 *    to aux[i + j*AUX_LD] and writes gelu(x) to D; DGELU writes
 *    x * gelu'(aux[i + j*AUX_LD]); BGRADB leaves D plain and writes
 *    bias[j] = sum over p < k of op(B)[p, j] for j < n (cublasLt.h:
 *    "bias gradient based on the input matrix B. The bias size corresponds
 *    to the number of columns of the matrix D. The reduction happens over
 *    the GEMM's k dimension", stored through BIAS_POINTER, elements of the
 *    output's type), overwriting it: the epilogue has no accumulate.
 *  - CUDA_R_16BF operands are bf16 bit patterns (uint16_t), widened exactly.
 *  - sums in double, rounded to fp32 before alpha/beta and the epilogue, so
 *    a difference from the CPU ops is the CPU's own fp32 rounding.
 *  - GELU is dt_gelu/dt_gelu_grad (tanh form, base/ops_math.h).
 *  - whatever the real library rejects is rejected and counted
 *    (emu_shim_errors, one line each): attribute sizes that do not match
 *    (cublasLtMatmulDescSetAttribute: INVALID_VALUE), AUX_LD not a multiple
 *    of 8 or below the rows, layouts inconsistent with m, n, k, ld < rows,
 *    in-place C/D with different ld, empty GEMMs, handles not live, a bias
 *    type other than D's (fp32), BGRADB with op(B) = N (NVIDIA's
 *    nvmath-python plans BGRADB with TRANSB = T only; NOT_SUPPORTED here)
 *    or without a bias pointer. BGRADB with alpha != 1 is refused as not
 *    emulated: the documentation does not say whether alpha scales the
 *    bias gradient.
 *  - the algorithm a heuristic returns remembers the preference's
 *    alignments and the bias/aux alignments it was asked for, and
 *    cublasLtMatmul refuses pointers less aligned than that (a real kernel
 *    would read out of bounds or fault), and an algorithm made for another
 *    problem.
 *  - what the heuristic finds is chosen by emu_policy (see Policy): each
 *    policy forces one of ops_cuda.cu's fallback paths.
 * Kernels: CU_LAUNCH(kernel, grid, block, smem, stream)(args...), the
 * form ops_cuda_gemm.cuh writes its launches in, checks the
 * launch configuration as CUDA does (cudaErrorInvalidConfiguration) and
 * runs the kernel body for every (block, thread) in turn; the GEMM path's
 * kernels use neither shared memory nor __syncthreads, so one thread after
 * another is exact. */
#pragma once
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <set>
#include <vector>

#include "base/ops_math.h"

/* kernels become host functions (inline: the headers hold kernels this
 * test does not launch) */
#undef __global__
#define __global__ static inline

/* ---- kernel launch emulation ---- */
static uint3 blockIdx, threadIdx;
static dim3 blockDim, gridDim;
static inline int min(int a, int b) { return a < b ? a : b; } /* CUDA's device min() */

static cudaError_t emu_last_error = cudaSuccess;
/* g->stream (cu_t, ops_cuda_state.cuh): the only stream the code may use; any other is counted */
static cudaStream_t emu_stream = (cudaStream_t)0x5eed;
static long emu_launches, emu_bad_stream;

namespace emu
{
struct Launch {
    dim3 grid, block;
    bool ok;
    Launch(dim3 g, dim3 b, size_t smem, cudaStream_t s) : grid(g), block(b)
    {
        ok = g.x >= 1 && g.x <= 0x7fffffffu && g.y >= 1 && g.y <= 65535 && g.z >= 1 && g.z <= 65535 && b.x >= 1 &&
             b.y >= 1 && b.z >= 1 && (size_t)b.x * b.y * b.z <= 1024 && b.z <= 64 && smem <= 48 * 1024;
        if (s != emu_stream)
            emu_bad_stream++;
    }
    /* the launch of kernel: a callable taking the kernel's arguments */
    template <typename F> auto of(F kernel) const
    {
        return [l = *this, kernel](auto... args) mutable { l(kernel, args...); };
    }
    template <typename F, typename... A> void operator()(F kernel, A... args)
    {
        emu_launches++;
        if (!ok) {
            emu_last_error = cudaErrorInvalidConfiguration;
            printf("FAIL: invalid launch configuration grid(%u,%u,%u) block(%u,%u,%u)\n", grid.x, grid.y, grid.z,
                   block.x, block.y, block.z);
            return;
        }
        gridDim = grid;
        blockDim = block;
        for (unsigned bz = 0; bz < grid.z; bz++)
            for (unsigned by = 0; by < grid.y; by++)
                for (unsigned bx = 0; bx < grid.x; bx++)
                    for (unsigned tz = 0; tz < block.z; tz++)
                        for (unsigned ty = 0; ty < block.y; ty++)
                            for (unsigned tx = 0; tx < block.x; tx++) {
                                blockIdx = make_uint3(bx, by, bz);
                                threadIdx = make_uint3(tx, ty, tz);
                                kernel(args...);
                            }
    }
};
} // namespace emu
#define CU_LAUNCH(kernel, ...) emu::Launch(__VA_ARGS__).of(kernel)

/* ---- CUDA runtime ---- */
cudaError_t cudaGetLastError(void)
{
    cudaError_t e = emu_last_error;
    emu_last_error = cudaSuccess;
    return e;
}
const char *cudaGetErrorString(cudaError_t e) { return e == cudaSuccess ? "no error" : "emulated CUDA error"; }
const char *cudaGetErrorName(cudaError_t e) { return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated"; }
cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    if (s != emu_stream)
        emu_bad_stream++;
    return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s)
{
    if (s != emu_stream)
        emu_bad_stream++;
    if (n && !p)
        return cudaErrorInvalidValue;
    memset(p, v, n);
    return cudaSuccess;
}
/* device memory is host memory here; a pageable source is taken before
 * the call returns, as the runtime's staging does */
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind kind, cudaStream_t s)
{
    (void)kind;
    if (s != emu_stream)
        emu_bad_stream++;
    if (n && (!dst || !src))
        return cudaErrorInvalidValue;
    memcpy(dst, src, n);
    return cudaSuccess;
}
cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    if (s != emu_stream)
        emu_bad_stream++;
    *p = malloc(n ? n : 1);
    return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    if (s != emu_stream)
        emu_bad_stream++;
    free(p);
    return cudaSuccess;
}

/* ---- bookkeeping ---- */
static long emu_shim_errors; /* calls the real library would reject */
#define SHIM_ERR(...) (printf("FAIL: rejected by the emulated library: " __VA_ARGS__), putchar('\n'), emu_shim_errors++)
static std::set<void *> emu_live;
static void live_add(void *p) { emu_live.insert(p); }
static bool live_del(void *p)
{
    if (!emu_live.erase(p)) {
        SHIM_ERR("destroy of a handle not live: %p", p);
        return false;
    }
    return true;
}
static bool live_has(const void *p) { return emu_live.count((void *)p) != 0; }

/* the GEMM core: D[i + j*ldd] for i < m, j < n */
struct Operand {
    const void *p;
    cudaDataType_t t;
    int64_t ld;
    bool trans;
    /* element (r, c) of op(X) */
    double at(int64_t r, int64_t c) const
    {
        int64_t idx = trans ? c + r * ld : r + c * ld;
        if (t == CUDA_R_16BF)
            return dt_bf16_to_f32(((const uint16_t *)p)[idx]);
        return ((const float *)p)[idx];
    }
};
static bool ab_type_ok(cudaDataType_t t) { return t == CUDA_R_32F || t == CUDA_R_16BF; }

static void gemm_core(int64_t m, int64_t n, int64_t k, float alpha, Operand A, Operand B, float beta, const float *C,
                      int64_t ldc, float *D, int64_t ldd, int epi, const float *bias, float *aux_out,
                      const float *aux_in, int64_t ldaux)
{
    /* op(A) by rows and op(B) by columns, widened once: the p loop below
     * runs over contiguous doubles (the sums dominate the test's time) */
    std::vector<double> a((size_t)m * k), b((size_t)k * n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t p = 0; p < k; p++)
            a[(size_t)i * k + p] = A.at(i, p);
    for (int64_t j = 0; j < n; j++)
        for (int64_t p = 0; p < k; p++)
            b[(size_t)j * k + p] = B.at(p, j);
    /* all of D computed before any is written: C may be D (in place) */
    std::vector<float> res((size_t)m * n);
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++) {
            const double *ai = &a[(size_t)i * k], *bj = &b[(size_t)j * k];
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++)
                acc += ai[p] * bj[p];
            float v = alpha * (float)acc;
            if (beta != 0.0f)
                v += beta * C[i + j * ldc];
            if (epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS)
                v += bias[i];
            if (epi == CUBLASLT_EPILOGUE_GELU_AUX || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS) {
                aux_out[i + j * ldaux] = v;
                v = dt_gelu(v);
            } else if (epi == CUBLASLT_EPILOGUE_DGELU) {
                v = v * dt_gelu_grad(aux_in[i + j * ldaux]);
            }
            res[(size_t)i + (size_t)j * m] = v;
        }
    for (int64_t j = 0; j < n; j++)
        for (int64_t i = 0; i < m; i++)
            D[i + j * ldd] = res[(size_t)i + (size_t)j * m];
}

/* the largest power of two (<= 256) that divides the address */
static uint32_t emu_align(const void *p)
{
    uintptr_t a = (uintptr_t)p;
    uint32_t al = 256;
    while (al > 1 && (a & (al - 1)))
        al >>= 1;
    return al;
}
/* ... and every column's start (ld elements apart) */
static uint32_t emu_mat_align(const void *p, int64_t ld, size_t es)
{
    uint32_t al = emu_align(p);
    size_t row = (size_t)ld * es;
    while (al > 1 && (row & (al - 1)))
        al >>= 1;
    return al;
}
static size_t esize(cudaDataType_t t) { return t == CUDA_R_16BF ? 2 : 4; }

/* ---- cuBLASLt ---- */
struct cublasLtContext {
    int magic;
};
struct EmuDesc {
    int compute, scale;
    int32_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
    uint32_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    const float *bias = nullptr;
    void *aux = nullptr;
    int64_t auxld = 0;
    int32_t bias_type = -1;
};
struct EmuLayout {
    cudaDataType_t t;
    uint64_t rows, cols;
    int64_t ld;
};
struct EmuPref {
    uint64_t ws = 0;
    uint32_t al[4] = {256, 256, 256, 256};
};

/* What cublasLtMatmulAlgoGetHeuristic answers. Each policy but P_ALL
 * sends ops_cuda.cu down a fallback: cublasGemmEx for plain GEMMs, a plain
 * GEMM plus separate kernels (bias rows, GELU, column sums) for epilogues. */
enum Policy {
    P_ALL,         /* an algorithm for everything */
    P_NONE_STATUS, /* CUBLAS_STATUS_NOT_SUPPORTED for everything */
    P_NONE_ZERO,   /* success, zero results, for everything */
    P_EPI_STATUS,  /* NOT_SUPPORTED for any epilogue, plain GEMMs found */
    P_EPI_STATE,   /* one result whose state is NOT_SUPPORTED for any epilogue */
    P_PLAIN_ZERO,  /* zero results for plain GEMMs, epilogues found */
    P_REALISTIC,   /* zero results when any alignment (A, B, C, D, bias, aux) < 16 bytes */
    P_COUNT
};
static const char *policy_name[P_COUNT] = {"all",       "none-status", "none-zero", "epi-status",
                                           "epi-state", "plain-zero",  "realistic"};
static Policy emu_policy = P_ALL;
/* cuBLASLt matmuls by epilogue, cublasGemmEx calls, and those of them on
 * cuBLAS's default workspace (cublasSetStream resets the one set before it:
 * the default pool allocates, mid-run, behind the stream's back) */
static long emu_lt_matmul[CUBLASLT_EPILOGUE_BGRADB + 1], emu_gemmex, emu_gemmex_default_ws;

/* algo.data[0] of an algorithm the heuristic returned; [1..7] its problem */
#define ALGO_MAGIC 0x4c54454d55ull
cublasStatus_t cublasLtCreate(cublasLtHandle_t *h)
{
    *h = new cublasLtContext{1};
    live_add(*h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtDestroy(cublasLtHandle_t h)
{
    if (live_del(h))
        delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t *d, cublasComputeType_t compute, cudaDataType_t scale)
{
    EmuDesc *e = new EmuDesc;
    e->compute = compute;
    e->scale = scale;
    *d = (cublasLtMatmulDesc_t)e;
    live_add(e);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t d)
{
    if (live_del(d))
        delete (EmuDesc *)d;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t attr,
                                              const void *buf, size_t sz)
{
    EmuDesc *e = (EmuDesc *)d;
    if (!live_has(e) || !buf) {
        SHIM_ERR("DescSetAttribute: bad desc or buf");
        return CUBLAS_STATUS_INVALID_VALUE;
    }
#define SET(field, T)                                                                                                  \
    do {                                                                                                               \
        if (sz != sizeof(T)) {                                                                                         \
            SHIM_ERR("DescSetAttribute %d: size %zu, want %zu", (int)attr, sz, sizeof(T));                             \
            return CUBLAS_STATUS_INVALID_VALUE;                                                                        \
        }                                                                                                              \
        memcpy(&e->field, buf, sz);                                                                                    \
    } while (0)
    switch (attr) {
    case CUBLASLT_MATMUL_DESC_TRANSA: SET(ta, int32_t); break;
    case CUBLASLT_MATMUL_DESC_TRANSB: SET(tb, int32_t); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE: SET(epi, uint32_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_POINTER: SET(bias, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER: SET(aux, void *); break;
    case CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD: SET(auxld, int64_t); break;
    case CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE: SET(bias_type, int32_t); break;
    default: SHIM_ERR("DescSetAttribute: attribute %d not emulated", (int)attr); return CUBLAS_STATUS_INVALID_VALUE;
    }
#undef SET
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t *l, cudaDataType t, uint64_t rows, uint64_t cols,
                                          int64_t ld)
{
    EmuLayout *e = new EmuLayout{t, rows, cols, ld};
    *l = (cublasLtMatrixLayout_t)e;
    live_add(e);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t l)
{
    if (live_del(l))
        delete (EmuLayout *)l;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t *p)
{
    EmuPref *e = new EmuPref;
    *p = (cublasLtMatmulPreference_t)e;
    live_add(e);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t p)
{
    if (live_del(p))
        delete (EmuPref *)p;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t p,
                                                    cublasLtMatmulPreferenceAttributes_t attr, const void *buf,
                                                    size_t sz)
{
    EmuPref *e = (EmuPref *)p;
    if (!live_has(e) || !buf)
        return SHIM_ERR("PrefSetAttribute: bad pref"), CUBLAS_STATUS_INVALID_VALUE;
    size_t want = attr == CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES ? 8 : 4;
    if (sz != want)
        return SHIM_ERR("PrefSetAttribute %d: size %zu want %zu", (int)attr, sz, want), CUBLAS_STATUS_INVALID_VALUE;
    switch (attr) {
    case CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES: memcpy(&e->ws, buf, 8); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES: memcpy(&e->al[0], buf, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES: memcpy(&e->al[1], buf, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES: memcpy(&e->al[2], buf, 4); break;
    case CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES: memcpy(&e->al[3], buf, 4); break;
    default: return SHIM_ERR("PrefSetAttribute %d not emulated", (int)attr), CUBLAS_STATUS_INVALID_VALUE;
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* the epilogues with a bias vector: read (BIAS, GELU_AUX_BIAS) or written (BGRADB) */
static bool epi_bias(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_BIAS || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_BGRADB;
}
static bool epi_aux(uint32_t e)
{
    return e == CUBLASLT_EPILOGUE_GELU_AUX || e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU;
}

/* validation shared by the heuristic and the matmul; fills m, n, k */
static cublasStatus_t lt_check(const EmuDesc *d, const EmuLayout *a, const EmuLayout *b, const EmuLayout *c,
                               const EmuLayout *dd, int64_t *m, int64_t *n, int64_t *k, const char *who)
{
    if (!live_has(d) || !live_has(a) || !live_has(b) || !live_has(c) || !live_has(dd))
        return SHIM_ERR("%s: dead descriptor", who), CUBLAS_STATUS_INVALID_VALUE;
    if (d->compute != CUBLAS_COMPUTE_32F || d->scale != CUDA_R_32F)
        return SHIM_ERR("%s: compute %d scale %d", who, d->compute, d->scale), CUBLAS_STATUS_NOT_SUPPORTED;
    if (a->t != b->t || !ab_type_ok(a->t) || c->t != CUDA_R_32F || dd->t != CUDA_R_32F)
        return SHIM_ERR("%s: types", who), CUBLAS_STATUS_NOT_SUPPORTED;
    if ((d->ta != CUBLAS_OP_N && d->ta != CUBLAS_OP_T) || (d->tb != CUBLAS_OP_N && d->tb != CUBLAS_OP_T))
        return SHIM_ERR("%s: trans", who), CUBLAS_STATUS_INVALID_VALUE;
    *m = dd->rows;
    *n = dd->cols;
    int64_t am = d->ta == CUBLAS_OP_N ? a->rows : a->cols, ak = d->ta == CUBLAS_OP_N ? a->cols : a->rows;
    int64_t bk = d->tb == CUBLAS_OP_N ? b->rows : b->cols, bn = d->tb == CUBLAS_OP_N ? b->cols : b->rows;
    *k = ak;
    if (am != *m || bn != *n || ak != bk || c->rows != dd->rows || c->cols != dd->cols)
        return SHIM_ERR("%s: dims A %lldx%lld B %lldx%lld D %lldx%lld", who, (long long)a->rows, (long long)a->cols,
                        (long long)b->rows, (long long)b->cols, (long long)dd->rows, (long long)dd->cols),
               CUBLAS_STATUS_INVALID_VALUE;
    if (*m <= 0 || *n <= 0 || *k <= 0)
        return SHIM_ERR("%s: empty GEMM m %lld n %lld k %lld", who, (long long)*m, (long long)*n, (long long)*k),
               CUBLAS_STATUS_INVALID_VALUE;
    const EmuLayout *ls[4] = {a, b, c, dd};
    for (int i = 0; i < 4; i++)
        if (ls[i]->ld < (int64_t)ls[i]->rows)
            return SHIM_ERR("%s: ld %lld < rows %llu", who, (long long)ls[i]->ld, (unsigned long long)ls[i]->rows),
                   CUBLAS_STATUS_INVALID_VALUE;
    switch (d->epi) {
    case CUBLASLT_EPILOGUE_DEFAULT:
    case CUBLASLT_EPILOGUE_BIAS:
    case CUBLASLT_EPILOGUE_GELU_AUX:
    case CUBLASLT_EPILOGUE_GELU_AUX_BIAS:
    case CUBLASLT_EPILOGUE_DGELU: break;
    case CUBLASLT_EPILOGUE_BGRADB:
        if (d->tb != CUBLAS_OP_T)
            return SHIM_ERR("%s: BGRADB with op(B) = N", who), CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    default: return SHIM_ERR("%s: epilogue %u not emulated", who, d->epi), CUBLAS_STATUS_NOT_SUPPORTED;
    }
    if (epi_bias(d->epi) && d->bias_type != -1 && d->bias_type != CUDA_R_32F)
        return SHIM_ERR("%s: bias type %d", who, d->bias_type), CUBLAS_STATUS_NOT_SUPPORTED;
    if (epi_aux(d->epi) && (d->auxld % 8 != 0 || d->auxld < *m))
        return SHIM_ERR("%s: AUX_LD %lld (rows %lld)", who, (long long)d->auxld, (long long)*m),
               CUBLAS_STATUS_INVALID_VALUE;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t A,
                                              cublasLtMatrixLayout_t B, cublasLtMatrixLayout_t C,
                                              cublasLtMatrixLayout_t D, cublasLtMatmulPreference_t pref, int req,
                                              cublasLtMatmulHeuristicResult_t res[], int *nres)
{
    const EmuDesc *d = (const EmuDesc *)desc;
    const EmuPref *p = (const EmuPref *)pref;
    if (!live_has(h) || !live_has(p) || req <= 0)
        return SHIM_ERR("heuristic: handle/pref/req"), CUBLAS_STATUS_INVALID_VALUE;
    int64_t m, n, k;
    cublasStatus_t st =
        lt_check(d, (EmuLayout *)A, (EmuLayout *)B, (EmuLayout *)C, (EmuLayout *)D, &m, &n, &k, "heuristic");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    for (int i = 0; i < 4; i++)
        if (p->al[i] == 0 || (p->al[i] & (p->al[i] - 1)))
            return SHIM_ERR("heuristic: alignment pref %u", p->al[i]), CUBLAS_STATUS_INVALID_VALUE;
    uint32_t al_bias = epi_bias(d->epi) ? emu_align(d->bias) : 256;
    uint32_t al_aux = epi_aux(d->epi) ? emu_mat_align(d->aux, d->auxld, 4) : 256;
    const bool plain = d->epi == CUBLASLT_EPILOGUE_DEFAULT;
    int found = 1;
    cublasStatus_t state = CUBLAS_STATUS_SUCCESS;
    switch (emu_policy) {
    case P_ALL: break;
    case P_NONE_STATUS: return CUBLAS_STATUS_NOT_SUPPORTED;
    case P_NONE_ZERO: found = 0; break;
    case P_EPI_STATUS:
        if (!plain)
            return CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    case P_EPI_STATE:
        if (!plain)
            state = CUBLAS_STATUS_NOT_SUPPORTED;
        break;
    case P_PLAIN_ZERO:
        if (plain)
            found = 0;
        break;
    case P_REALISTIC: {
        uint32_t mn = al_bias < al_aux ? al_bias : al_aux;
        for (int i = 0; i < 4; i++)
            mn = p->al[i] < mn ? p->al[i] : mn;
        if (mn < 16)
            found = 0;
        break;
    }
    default: break;
    }
    *nres = found;
    if (found) {
        memset(&res[0], 0, sizeof res[0]);
        res[0].state = state;
        uint64_t *a = res[0].algo.data;
        a[0] = state == CUBLAS_STATUS_SUCCESS ? ALGO_MAGIC : 0; /* a failed result's algo is not valid */
        a[1] = (uint64_t)d->epi | ((uint64_t)d->ta << 16) | ((uint64_t)d->tb << 24);
        a[2] = (uint64_t)m;
        a[3] = (uint64_t)n;
        a[4] = (uint64_t)k;
        a[5] = (uint64_t)p->al[0] | ((uint64_t)p->al[1] << 32);
        a[6] = (uint64_t)p->al[2] | ((uint64_t)p->al[3] << 32);
        a[7] = (uint64_t)al_bias | ((uint64_t)al_aux << 32);
    }
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasLtMatmul(cublasLtHandle_t h, cublasLtMatmulDesc_t desc, const void *alpha, const void *Ap,
                              cublasLtMatrixLayout_t A, const void *Bp, cublasLtMatrixLayout_t B, const void *beta,
                              const void *Cp, cublasLtMatrixLayout_t C, void *Dp, cublasLtMatrixLayout_t D,
                              const cublasLtMatmulAlgo_t *algo, void *ws, size_t wsz, cudaStream_t s)
{
    const EmuDesc *d = (const EmuDesc *)desc;
    const EmuLayout *a = (const EmuLayout *)A, *b = (const EmuLayout *)B, *c = (const EmuLayout *)C,
                    *dd = (const EmuLayout *)D;
    if (!live_has(h))
        return SHIM_ERR("matmul: handle"), CUBLAS_STATUS_NOT_INITIALIZED;
    if (s != emu_stream)
        emu_bad_stream++;
    int64_t m, n, k;
    cublasStatus_t st = lt_check(d, a, b, c, dd, &m, &n, &k, "matmul");
    if (st != CUBLAS_STATUS_SUCCESS)
        return st;
    if (!algo || algo->data[0] != ALGO_MAGIC)
        return SHIM_ERR("matmul: algo not from the heuristic"), CUBLAS_STATUS_INVALID_VALUE;
    const uint64_t *al = algo->data;
    if (al[1] != ((uint64_t)d->epi | ((uint64_t)d->ta << 16) | ((uint64_t)d->tb << 24)) || al[2] != (uint64_t)m ||
        al[3] != (uint64_t)n || al[4] != (uint64_t)k)
        return SHIM_ERR("matmul: algo made for another problem"), CUBLAS_STATUS_INVALID_VALUE;
    if (Cp == Dp && c->ld != dd->ld)
        return SHIM_ERR("matmul: in place with different C/D ld"), CUBLAS_STATUS_INVALID_VALUE;
    uint32_t need[4] = {(uint32_t)(al[5] & 0xffffffffu), (uint32_t)(al[5] >> 32), (uint32_t)(al[6] & 0xffffffffu),
                        (uint32_t)(al[6] >> 32)};
    uint32_t have[4] = {emu_mat_align(Ap, a->ld, esize(a->t)), emu_mat_align(Bp, b->ld, esize(b->t)),
                        emu_mat_align(Cp, c->ld, 4), emu_mat_align(Dp, dd->ld, 4)};
    for (int i = 0; i < 4; i++)
        if (have[i] < need[i])
            return SHIM_ERR("matmul: matrix %c aligned %u, algo assumes %u", "ABCD"[i], have[i], need[i]),
                   CUBLAS_STATUS_INVALID_VALUE;
    if (epi_bias(d->epi)) {
        if (!d->bias)
            return SHIM_ERR("matmul: bias epilogue without bias"), CUBLAS_STATUS_INVALID_VALUE;
        if (emu_align(d->bias) < (uint32_t)(al[7] & 0xffffffffu))
            return SHIM_ERR("matmul: bias less aligned than at heuristic time"), CUBLAS_STATUS_INVALID_VALUE;
    }
    if (epi_aux(d->epi)) {
        if (!d->aux)
            return SHIM_ERR("matmul: aux epilogue without aux"), CUBLAS_STATUS_INVALID_VALUE;
        if (emu_mat_align(d->aux, d->auxld, 4) < (uint32_t)(al[7] >> 32))
            return SHIM_ERR("matmul: aux less aligned than at heuristic time"), CUBLAS_STATUS_INVALID_VALUE;
    }
    if (wsz && !ws)
        return SHIM_ERR("matmul: workspace"), CUBLAS_STATUS_INVALID_VALUE;
    float fa = *(const float *)alpha, fb = *(const float *)beta;
    if (d->epi == CUBLASLT_EPILOGUE_BGRADB && fa != 1.0f)
        return SHIM_ERR("matmul: BGRADB with alpha %g not emulated", fa), CUBLAS_STATUS_NOT_SUPPORTED;
    emu_lt_matmul[d->epi]++;
    if (d->epi == CUBLASLT_EPILOGUE_BGRADB) { /* in double, rounded once, as the GEMM's sums */
        const Operand Bo{Bp, b->t, b->ld, true};
        for (int64_t j = 0; j < n; j++) {
            double acc = 0.0;
            for (int64_t p = 0; p < k; p++)
                acc += Bo.at(p, j);
            ((float *)d->bias)[j] = (float)acc;
        }
    }
    gemm_core(m, n, k, fa, Operand{Ap, a->t, a->ld, d->ta == CUBLAS_OP_T},
              Operand{Bp, b->t, b->ld, d->tb == CUBLAS_OP_T}, fb, (const float *)Cp, c->ld, (float *)Dp, dd->ld,
              (int)d->epi, d->bias, d->epi == CUBLASLT_EPILOGUE_DGELU ? nullptr : (float *)d->aux,
              d->epi == CUBLASLT_EPILOGUE_DGELU ? (const float *)d->aux : nullptr, d->auxld);
    return CUBLAS_STATUS_SUCCESS;
}

/* ---- cuBLAS ---- */
struct cublasContext {
    cudaStream_t stream = nullptr;
    void *ws = nullptr;
    size_t wsz = 0;
};
cublasStatus_t cublasCreate_v2(cublasHandle_t *h)
{
    *h = new cublasContext;
    live_add(*h);
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasDestroy_v2(cublasHandle_t h)
{
    if (live_del(h))
        delete h;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetStream_v2(cublasHandle_t h, cudaStream_t s)
{
    if (!live_has(h))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    h->ws = nullptr; /* cuBLAS docs: cublasSetStream resets the workspace to the default pool */
    h->wsz = 0;
    return CUBLAS_STATUS_SUCCESS;
}
cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t h, void *ws, size_t n)
{
    if (!live_has(h))
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->ws = ws;
    h->wsz = n;
    return CUBLAS_STATUS_SUCCESS;
}
const char *cublasGetStatusString(cublasStatus_t s)
{
    static char buf[64];
    snprintf(buf, sizeof buf, "cublasStatus %d", (int)s);
    return buf;
}
cublasStatus_t cublasGemmEx(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                            const void *alpha, const void *A, cudaDataType Atype, int lda, const void *B,
                            cudaDataType Btype, int ldb, const void *beta, void *C, cudaDataType Ctype, int ldc,
                            cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!live_has(h))
        return SHIM_ERR("GemmEx: handle"), CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->stream != emu_stream)
        emu_bad_stream++;
    if (Atype != Btype || !ab_type_ok(Atype) || Ctype != CUDA_R_32F || compute != CUBLAS_COMPUTE_32F)
        return SHIM_ERR("GemmEx: types"), CUBLAS_STATUS_NOT_SUPPORTED;
    if ((ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) || (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || m < 0 || n < 0 || k < 0)
        return SHIM_ERR("GemmEx: args"), CUBLAS_STATUS_INVALID_VALUE;
    int ra = ta == CUBLAS_OP_N ? m : k, rb = tb == CUBLAS_OP_N ? k : n;
    if (lda < (ra > 1 ? ra : 1) || ldb < (rb > 1 ? rb : 1) || ldc < (m > 1 ? m : 1))
        return SHIM_ERR("GemmEx: ld %d %d %d for m %d n %d k %d", lda, ldb, ldc, m, n, k), CUBLAS_STATUS_INVALID_VALUE;
    emu_gemmex++;
    if (h->ws == nullptr)
        emu_gemmex_default_ws++;
    if (m == 0 || n == 0)
        return CUBLAS_STATUS_SUCCESS;
    gemm_core(m, n, k, *(const float *)alpha, Operand{A, Atype, lda, ta == CUBLAS_OP_T},
              Operand{B, Btype, ldb, tb == CUBLAS_OP_T}, *(const float *)beta, (const float *)C, ldc, (float *)C, ldc,
              CUBLASLT_EPILOGUE_DEFAULT, nullptr, nullptr, nullptr, 0);
    return CUBLAS_STATUS_SUCCESS;
}

/* cublasGemmGroupedBatchedEx, with the type combinations cuBLAS's
 * documentation lists for it (A = B = C of CUDA_R_16F, CUDA_R_16BF or
 * CUDA_R_32F with CUBLAS_COMPUTE_32F, or fp32 with _FAST_TF32): bf16
 * A/B with an fp32 C, which cublasGemmEx takes, is refused. Host arrays
 * of group_count shapes, alphas and betas; Aarray, Barray, Carray the
 * (device) arrays of sum(group_size) pointers, group after group. Empty
 * problems are refused too (the backend leaves them out). */
static long emu_grouped, emu_grouped_problems;
cublasStatus_t cublasGemmGroupedBatchedEx(cublasHandle_t h, const cublasOperation_t ta[], const cublasOperation_t tb[],
                                          const int m[], const int n[], const int k[], const void *alpha,
                                          const void *const A[], cudaDataType_t Atype, const int lda[],
                                          const void *const B[], cudaDataType_t Btype, const int ldb[],
                                          const void *beta, void *const C[], cudaDataType_t Ctype, const int ldc[],
                                          int group_count, const int group_size[], cublasComputeType_t compute)
{
    if (!live_has(h))
        return SHIM_ERR("GemmGroupedBatchedEx: handle"), CUBLAS_STATUS_NOT_INITIALIZED;
    if (h->stream != emu_stream)
        emu_bad_stream++;
    const bool types =
        Atype == Btype && Btype == Ctype &&
        ((compute == CUBLAS_COMPUTE_32F && (Atype == CUDA_R_16F || Atype == CUDA_R_16BF || Atype == CUDA_R_32F)) ||
         (compute == CUBLAS_COMPUTE_32F_FAST_TF32 && Atype == CUDA_R_32F));
    if (!types)
        return SHIM_ERR("GemmGroupedBatchedEx: types A %d B %d C %d compute %d", (int)Atype, (int)Btype, (int)Ctype,
                        (int)compute),
               CUBLAS_STATUS_NOT_SUPPORTED;
    if (Atype != CUDA_R_32F) /* the emulated GEMM core reads fp32 and bf16 only; C is fp32 */
        return SHIM_ERR("GemmGroupedBatchedEx: only fp32 is emulated"), CUBLAS_STATUS_NOT_SUPPORTED;
    if (group_count < 0)
        return SHIM_ERR("GemmGroupedBatchedEx: group_count %d", group_count), CUBLAS_STATUS_INVALID_VALUE;
    emu_grouped++;
    const float *al = (const float *)alpha, *be = (const float *)beta;
    for (int gi = 0, p = 0; gi < group_count; gi++) {
        const bool at = ta[gi] == CUBLAS_OP_T, bt = tb[gi] == CUBLAS_OP_T;
        if ((ta[gi] != CUBLAS_OP_N && !at) || (tb[gi] != CUBLAS_OP_N && !bt) || group_size[gi] < 0)
            return SHIM_ERR("GemmGroupedBatchedEx: group %d args", gi), CUBLAS_STATUS_INVALID_VALUE;
        if (m[gi] <= 0 || n[gi] <= 0 || k[gi] <= 0)
            return SHIM_ERR("GemmGroupedBatchedEx: group %d empty (m %d n %d k %d)", gi, m[gi], n[gi], k[gi]),
                   CUBLAS_STATUS_INVALID_VALUE;
        const int ra = at ? k[gi] : m[gi], rb = bt ? n[gi] : k[gi];
        if (lda[gi] < ra || ldb[gi] < rb || ldc[gi] < m[gi])
            return SHIM_ERR("GemmGroupedBatchedEx: group %d ld %d %d %d for m %d n %d k %d", gi, lda[gi], ldb[gi],
                            ldc[gi], m[gi], n[gi], k[gi]),
                   CUBLAS_STATUS_INVALID_VALUE;
        for (int j = 0; j < group_size[gi]; j++, p++) {
            emu_grouped_problems++;
            gemm_core(m[gi], n[gi], k[gi], al[gi], Operand{A[p], Atype, lda[gi], at}, Operand{B[p], Btype, ldb[gi], bt},
                      be[gi], (const float *)C[p], ldc[gi], (float *)C[p], ldc[gi], CUBLASLT_EPILOGUE_DEFAULT, nullptr,
                      nullptr, nullptr, 0);
        }
    }
    return CUBLAS_STATUS_SUCCESS;
}

/* cuda_fatal (cuda/device.h), called by ops_cuda.cu's error checks: back to
 * the test's GUARDED() (it counts a failure and goes on), abort elsewhere */
static jmp_buf emu_fatal_jmp;
static int emu_fatal_armed;
static char emu_fatal_msg[512];
extern "C" void cuda_fatal(const char *what, const char *msg)
{
    snprintf(emu_fatal_msg, sizeof emu_fatal_msg, "cuda_fatal: %s: %s", what, msg);
    if (emu_fatal_armed)
        longjmp(emu_fatal_jmp, 1);
    printf("FAIL: %s\n", emu_fatal_msg);
    abort();
}
