/* The CUDA backend's matmuls: the ops table's matmul entries on cuBLASLt
 * (planned once per distinct GEMM, the BIAS, GELU_AUX_BIAS, DGELU and
 * BGRADB epilogues), cublasGemmEx where cuBLASLt has no algorithm, and the
 * bias-row, separate GELU and column-sum (bias gradient) kernels where no
 * epilogue serves.
 *
 * Host code, included by cuda/ops_cuda.cu after ops_cuda_state.cuh and the
 * kernel families it launches, and compiled by test/emu/test_gemm_emu.cpp
 * against an emulated cuBLASLt, cuBLAS and runtime
 * (test/emu/cublaslt_shim.h). Hence the launches are written
 * CU_LAUNCH(kernel, grid, block, smem, stream)(args): g++ cannot parse
 * <<<...>>>, and the emulation defines CU_LAUNCH to run the kernel on the
 * host. */
#ifndef DTRAIN_CUDA_OPS_CUDA_GEMM_CUH
#define DTRAIN_CUDA_OPS_CUDA_GEMM_CUH

#include "cuda/kernels/colsum.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/ops_cuda_state.cuh"

#ifndef CU_LAUNCH
#define CU_LAUNCH(kernel, ...) kernel<<<__VA_ARGS__>>>
#endif

#define WORKSPACE_BYTES (32u << 20) /* cuBLASLt workspace */

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

/* LT_PLANS, lt_key_t, lt_plan_t and the cache (cu_t.plans): ops_cuda_state.cuh. */

static void lt_plan_release(lt_plan_t *p)
{
    /* teardown of descriptors the library made: nothing to report */
    if (p->lc)
        (void)cublasLtMatrixLayoutDestroy(p->lc);
    if (p->lb)
        (void)cublasLtMatrixLayoutDestroy(p->lb);
    if (p->la)
        (void)cublasLtMatrixLayoutDestroy(p->la);
    if (p->op)
        (void)cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof *p);
}

static void lt_cache_release(cu_t *g)
{
    for (int i = 0; i < LT_PLANS; i++)
        if (g->plans.plan[i].used)
            lt_plan_release(&g->plans.plan[i]);
    memset(&g->plans, 0, sizeof g->plans);
}

/* The epilogues with a bias vector (CUBLASLT_MATMUL_DESC_BIAS_POINTER):
 * read by BIAS and GELU_AUX_BIAS, written by BGRADB (the bias gradient). */
static int epi_has_bias(int epi)
{
    return epi == CUBLASLT_EPILOGUE_BIAS || epi == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || epi == CUBLASLT_EPILOGUE_BGRADB;
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
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof aux), what);
}

/* Descriptors and the heuristic's algorithm for one key (see above), with
 * the pointers of the call that made it. */
static void lt_plan_make(cu_t *g, lt_plan_t *p, const lt_key_t *key, const float *bias, const float *aux,
                         const char *what)
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
        /* The bias (and BGRADB's bias gradient) is fp32. That is
         * cuBLASLt's default (the type of D), stated anyway so that bf16
         * A/B never suggest a bf16 bias. */
        int32_t bias_type = CUDA_R_32F;
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
            what);
    }
    if (epi_has_aux(key->epi)) {
        int64_t ld_aux = key->ldc;
        ckb(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld_aux, sizeof ld_aux), what);
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
                                             sizeof key->al_a),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &key->al_b,
                                             sizeof key->al_b),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &key->al_c,
                                             sizeof key->al_c),
        what);
    ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &key->al_c,
                                             sizeof key->al_c),
        what);
    cublasLtMatmulHeuristicResult_t res;
    int nres = 0;
    memset(&res, 0, sizeof res);
    /* CUBLAS_STATUS_NOT_SUPPORTED is how the heuristic says it has no kernel
     * for this combination (types, epilogue, alignment): treated as zero
     * results, so a GEMM with an epilogue takes the caller's fallback
     * instead of ending the job. Any other error is fatal. */
    cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(g->lt, p->op, p->la, p->lb, p->lc, p->lc, pref, 1, &res, &nres);
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
static const lt_plan_t *lt_plan(cu_t *g, const lt_key_t *key, const float *bias, const float *aux, const char *what)
{
    for (int i = 0; i < LT_PLANS; i++) {
        lt_plan_t *p = &g->plans.plan[i];
        if (p->used && memcmp(&p->key, key, sizeof *key) == 0) {
            g->plans.reused++;
            return p;
        }
    }
    lt_plan_t *p = &g->plans.plan[g->plans.next];
    g->plans.next = (g->plans.next + 1) % LT_PLANS;
    if (p->used)
        lt_plan_release(p);
    lt_plan_make(g, p, key, bias, aux, what);
    g->plans.made++;
    return p;
}

/* Column-major C[m, n] = alpha op(A) op(B) + beta C, then the epilogue:
 *   CUBLASLT_EPILOGUE_DEFAULT        nothing (bias and aux NULL)
 *   CUBLASLT_EPILOGUE_BIAS           + bias[m] per column (beta 0)
 *   CUBLASLT_EPILOGUE_GELU_AUX(_BIAS) aux = the sum (+ bias), C = gelu(aux)
 *   CUBLASLT_EPILOGUE_DGELU          C = the product o gelu'(aux) (beta 0)
 *   CUBLASLT_EPILOGUE_BGRADB         C as DEFAULT; bias[j] = sum over p of
 *                                    op(B)[p, j], j < n, written (not
 *                                    added); op(B) = B^T (see gemm_bwd)
 * with aux[m, n] fp32 and leading dimension ldc. Row-major callers pass
 * transposes. A and B are of type ab: CUDA_R_32F (the fp32 GEMMs) or
 * CUDA_R_16BF (the bf16 GEMMs, uint16_t bit patterns). C (= D), alpha,
 * beta and the bias are fp32 and the compute type is CUBLAS_COMPUTE_32F
 * either way: a bf16 product is exact in fp32, so the bf16 GEMM is the
 * fp32 GEMM of the widened operands up to summation order, like the CPU
 * backend's. Returns -1 when cuBLASLt has no algorithm for a GEMM with an
 * epilogue (the caller then runs the plain GEMM and its own kernels); a
 * plain GEMM without one runs through cublasGemmEx. */
static int lt_gemm(cu_t *g, const char *what, cudaDataType_t ab, cublasOperation_t ta, cublasOperation_t tb, int m,
                   int n, int k, float alpha, const void *A, int lda, const void *B, int ldb, float beta, float *C,
                   int ldc, cublasLtEpilogue_t epi, const float *bias, const float *aux)
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
    const lt_plan_t *p = lt_plan(g, &key, bias, aux, what);
    if (p->found) {
        lt_set_pointers(p, bias, aux, what); /* cublasLtMatmul reads them when called */
        ckb(cublasLtMatmul(g->lt, p->op, &alpha, A, p->la, B, p->lb, &beta, C, p->lc, C, p->lc, &p->algo, g->ws,
                           WORKSPACE_BYTES, g->stream),
            what);
        return 0;
    }
    if (epi != CUBLASLT_EPILOGUE_DEFAULT)
        return -1;
    /* No cuBLASLt kernel for a plain GEMM (odd leading dimensions of bf16
     * operands can leave the heuristic empty): the same GEMM through
     * cublasGemmEx, which takes any alignment, with the same types and
     * CUBLAS_COMPUTE_32F, on the compute stream with the same workspace. */
    ckb(cublasGemmEx(g->blas, ta, tb, m, n, k, &alpha, A, ab, lda, B, ab, ldb, &beta, C, CUDA_R_32F, ldc,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        what);
    g->plans.blas++;
    return 0;
}

/* out[C] (=|+= by accum) the column sums of x[N, C] (see the column
 * reductions above). */
static void colsum(cu_t *g, float *out, const float *x, int N, int C, int accum, const char *what)
{
    if (C <= 0)
        return;
    const int nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS;
    float *part = NULL;
    if (nk > 0) {
        part = col_part_room(g, (size_t)nk * C, what);
        CU_LAUNCH(k_colsum_part, dim3((unsigned)cb, (unsigned)nk), THREADS, 0, g->stream)(part, x, N, C, col_rows(N));
    }
    CU_LAUNCH(k_colsum_fold, cb, THREADS, 0, g->stream)(out, part, nk, C, accum);
}

/* ---- matmuls (cuBLASLt; fp32, or bf16 A/B with fp32 C/D) ------------------------------
 * One forward and one backward for both GEMM precisions: ab is the type of
 * in, w and the GEMM's copy of dout (fp32, or bf16 bit patterns); every
 * output, the bias and db are fp32 (base/ops.h). With pre != NULL they are
 * the GELU-fused ops: cuBLASLt's GELU_AUX(_BIAS) epilogue in the forward
 * and DGELU in the backward, where the aux matrix's leading dimension is a
 * multiple of 8 (cuBLASLt's rule) and the heuristic offers a kernel, else
 * the plain GEMM and the elementwise GELU kernel. A bf16 output of the
 * GELU (out16, din16: base/ops.h) is written by that elementwise kernel,
 * after the plain GEMM: the epilogues' D is fp32 here, and the kernel
 * writes both copies in one pass (no cast after the GEMM). */

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b): column-major
 * out^T[OC,N] = (w^T[IC,OC])^T . in^T[IC,N]. With pre: pre = that sum,
 * out = gelu(pre) (NULL: not wanted) and out16 its bf16 (NULL: not
 * wanted). */
static void gemm_fwd(cu_t *g, const char *what, cudaDataType_t ab, float *out, uint16_t *out16, float *pre,
                     const void *in, const void *w, const float *b, int N, int IC, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    if (pre) {
        if (!out16 && IC > 0 && OC % 8 == 0 &&
            lt_gemm(g, what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 0.0f, out, OC,
                    b ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX, b, pre) == 0) {
            g->plans.gelu_fused++;
            return;
        }
        g->plans.gelu_separate++;
        gemm_fwd(g, what, ab, pre, NULL, NULL, in, w, b, N, IC, OC);
        CU_LAUNCH(k_gelu_fwd, grid_for((size_t)N * OC, THREADS), THREADS, 0, g->stream)
        (out, out16, pre, (size_t)N * OC);
        return;
    }
    /* the bias epilogue where cuBLASLt offers it; otherwise (or for IC 0)
     * bias rows first and a GEMM adding onto them, as the CPU backend does */
    if (IC > 0 && lt_gemm(g, what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 0.0f, out, OC,
                          b ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, b, NULL) == 0)
        return;
    CU_LAUNCH(k_fill_rows, grid_for((size_t)N * OC, THREADS), THREADS, 0, g->stream)(out, b, N, OC);
    if (IC > 0)
        lt_gemm(g, what, ab, CUBLAS_OP_T, CUBLAS_OP_N, OC, N, IC, 1.0f, w, IC, in, IC, 1.0f, out, OC,
                CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
}

/* dw^T[IC,OC] = in^T[IC,N] . dout[N,OC] (=|+= by accum_dw), N > 0, and
 * with db (NULL: not wanted) its bias gradient db[OC] = the column sums of
 * dout_g by the BGRADB epilogue (=|+= by accum_dw). Returns 1 when the
 * epilogue wrote db, 0 when db is still to do (the plain GEMM ran:
 * cuBLASLt offered no algorithm for the epilogue, or db is NULL).
 *
 * BGRADB, as cuBLASLt documents it (the CUDA 13 toolkit's cublasLt.h: the
 * comments of cublasLtEpilogue_t's BGRADB and of
 * CUBLASLT_MATMUL_DESC_BIAS_POINTER / _BIAS_DATA_TYPE): "bias gradient
 * based on the input matrix B. The bias size corresponds to the number of
 * columns of the matrix D. The reduction happens over the GEMM's k
 * dimension", stored through BIAS_POINTER (a void * for the gradient: an
 * output), its elements of the output's type (fp32 D, so BIAS_DATA_TYPE
 * fp32, as lt_plan_make sets for every bias). Here B = dout_g with
 * op(B) = T, k = N rows and D's columns the OC outputs: the reduction is
 * exactly db. NVIDIA's nvmath-python plans BGRADB with TRANSB = T always
 * (its matmul planner transposes B for this epilogue), the form used
 * here, and refuses K = 1 for it before cuBLASLt 12.3.4 (CUDA 13 here is
 * later). The epilogue writes
 * the bias gradient (it has no accumulate, unlike the GEMM's beta), so
 * with accum_dw it goes to scratch (the column sums' partial buffer, one
 * chunk) and k_colsum_fold adds it into db: the same operation as
 * colsum's fold. Under bf16 the epilogue sums the bf16 dout (B), where
 * colsum sums the fp32 one: db then differs by the bf16 rounding of dout,
 * |delta db[j]| <= 2^-8 sum_n |dout[n, j]| beyond summation order
 * (doc/design.md; test_gemm_emu holds it to that). */
static int dw_gemm(cu_t *g, const char *what, cudaDataType_t ab, float *dw, float *db, const void *dout_g,
                   const void *in, int N, int IC, int OC, int accum_dw)
{
    const float beta = accum_dw ? 1.0f : 0.0f;
    if (db) {
        float *bg = accum_dw ? col_part_room(g, (size_t)OC, what) : db;
        if (lt_gemm(g, what, ab, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in, IC, dout_g, OC, beta, dw, IC,
                    CUBLASLT_EPILOGUE_BGRADB, bg, NULL) == 0) {
            if (accum_dw)
                CU_LAUNCH(k_colsum_fold, (OC + THREADS - 1) / THREADS, THREADS, 0, g->stream)(db, bg, 1, OC, 1);
            g->plans.bgrad_fused++;
            return 1;
        }
        g->plans.bgrad_separate++;
    }
    lt_gemm(g, what, ab, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, N, 1.0f, in, IC, dout_g, OC, beta, dw, IC,
            CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
    return 0;
}

/* din[N,IC] (=|+= by accum_din) dout[N,OC] . w[OC,IC], dw[OC,IC] (=|+= by
 * accum_dw) dout^T . in[N,IC], from dout_g (dout in the GEMM type ab);
 * db[OC] (=|+= by accum_dw) the column sums of dout: by the dW GEMM's
 * BGRADB epilogue where dw is wanted too and cuBLASLt offers it (it sums
 * dout_g, so under bf16 the bf16 dout; dw_gemm), else by colsum of the
 * fp32 dout. With pre (accum_din 0): din = gelu'(pre) o (dout . w), and
 * din16 (NULL: not wanted) its bf16. */
static void gemm_bwd(cu_t *g, const char *what, cudaDataType_t ab, float *din, uint16_t *din16, float *dw, float *db,
                     const void *dout_g, const float *dout, const void *in, const void *w, const float *pre, int N,
                     int IC, int OC, int accum_din, int accum_dw)
{
    if (OC <= 0) { /* an empty sum: din = 0, or unchanged when accumulating */
        if (din && !accum_din && N > 0 && IC > 0) {
            ck(cudaMemsetAsync(din, 0, (size_t)N * IC * sizeof(float), g->stream), what);
            if (pre) /* 0 * gelu'(pre), as the CPU's composition */
                CU_LAUNCH(k_gelu_bwd, grid_for((size_t)N * IC, THREADS), THREADS, 0, g->stream)
                (din, din16, pre, din, (size_t)N * IC);
        }
        return;
    }
    /* din^T[IC,N] = w^T[IC,OC] . dout^T[OC,N] (column-major views) */
    if (din && N > 0 && IC > 0) {
        if (pre && !din16 && IC % 8 == 0 &&
            lt_gemm(g, what, ab, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, dout_g, OC, 0.0f, din, IC,
                    CUBLASLT_EPILOGUE_DGELU, NULL, pre) == 0) {
            g->plans.gelu_fused++;
        } else {
            lt_gemm(g, what, ab, CUBLAS_OP_N, CUBLAS_OP_N, IC, N, OC, 1.0f, w, IC, dout_g, OC, accum_din ? 1.0f : 0.0f,
                    din, IC, CUBLASLT_EPILOGUE_DEFAULT, NULL, NULL);
            if (pre) {
                g->plans.gelu_separate++;
                CU_LAUNCH(k_gelu_bwd, grid_for((size_t)N * IC, THREADS), THREADS, 0, g->stream)
                (din, din16, pre, din, (size_t)N * IC);
            }
        }
    }
    if (dw && IC > 0) {
        if (N > 0 && dw_gemm(g, what, ab, dw, db, dout_g, in, N, IC, OC, accum_dw))
            db = NULL; /* the epilogue wrote it */
        else if (N <= 0 && !accum_dw)
            ck(cudaMemsetAsync(dw, 0, (size_t)OC * IC * sizeof(float), g->stream), what);
    }
    if (db)
        colsum(g, db, dout, N, OC, accum_dw, what);
}

static void matmul_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, int N, int IC, int OC)
{
    cu_t *g = (cu_t *)ctx;
    gemm_fwd(g, "matmul_fwd", CUDA_R_32F, out, NULL, NULL, in, w, b, N, IC, OC);
    finish(g, "matmul_fwd");
}

static void matmul_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       int N, int IC, int OC, int accum_din, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gemm_bwd(g, "matmul_bwd", CUDA_R_32F, din, NULL, dw, db, dout, dout, in, w, NULL, N, IC, OC, accum_din, accum_dw);
    finish(g, "matmul_bwd");
}

static void matmul_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b, int N, int IC,
                            int OC)
{
    cu_t *g = (cu_t *)ctx;
    gemm_fwd(g, "matmul_fwd_bf16", CUDA_R_16BF, out, NULL, NULL, in, w, b, N, IC, OC);
    finish(g, "matmul_fwd_bf16");
}

static void matmul_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                            const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gemm_bwd(g, "matmul_bwd_bf16", CUDA_R_16BF, din, NULL, dw, db, dout16, dout, in, w, NULL, N, IC, OC, accum_din,
             accum_dw);
    finish(g, "matmul_bwd_bf16");
}

static void matmul_gelu_fwd(void *ctx, float *out, float *pre, const float *in, const float *w, const float *b, int N,
                            int IC, int OC)
{
    cu_t *g = (cu_t *)ctx;
    gemm_fwd(g, "matmul_gelu_fwd", CUDA_R_32F, out, NULL, pre, in, w, b, N, IC, OC);
    finish(g, "matmul_gelu_fwd");
}

static void matmul_gelu_fwd_bf16(void *ctx, float *out, uint16_t *out16, float *pre, const uint16_t *in,
                                 const uint16_t *w, const float *b, int N, int IC, int OC)
{
    cu_t *g = (cu_t *)ctx;
    gemm_fwd(g, "matmul_gelu_fwd_bf16", CUDA_R_16BF, out, out16, pre, in, w, b, N, IC, OC);
    finish(g, "matmul_gelu_fwd_bf16");
}

static void matmul_dgelu_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *pre, const float *w, int N, int IC, int OC, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gemm_bwd(g, "matmul_dgelu_bwd", CUDA_R_32F, din, NULL, dw, db, dout, dout, in, w, pre, N, IC, OC, 0, accum_dw);
    finish(g, "matmul_dgelu_bwd");
}

static void matmul_dgelu_bwd_bf16(void *ctx, float *din, uint16_t *din16, float *dw, float *db,
                                  const uint16_t *dout16, const float *dout, const uint16_t *in, const float *pre,
                                  const uint16_t *w, int N, int IC, int OC, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gemm_bwd(g, "matmul_dgelu_bwd_bf16", CUDA_R_16BF, din, din16, dw, db, dout16, dout, in, w, pre, N, IC, OC, 0,
             accum_dw);
    finish(g, "matmul_dgelu_bwd_bf16");
}

/* cublasGemmEx's handle (lt_gemm's fallback), made by ops_cuda_create. */
static cublasStatus_t blas_init(cu_t *g)
{
    cublasStatus_t bs;
    /* the fallback's handle, made now rather than mid-run (its setup may
     * allocate, and cudaFree waits for the whole device, NCCL kernels
     * included); SetStream before SetWorkspace, which SetStream resets */
    bs = cublasCreate(&g->blas);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetStream(g->blas, g->stream);
    if (bs == CUBLAS_STATUS_SUCCESS)
        bs = cublasSetWorkspace(g->blas, g->ws, WORKSPACE_BYTES);
    return bs;
}

#endif
