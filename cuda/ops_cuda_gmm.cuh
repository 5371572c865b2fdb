/* The CUDA backend's grouped GEMMs (base/ops.h gmm_*): the experts of a
 * mixture-of-experts layer, G weights each over its own run of rows.
 *
 * fp32: each GEMM kind (the forward's out, the backward's din and dw) is
 * one cublasGemmGroupedBatchedEx call over the groups that have rows, each
 * a problem of its own shape (a cuBLAS "group" of size 1: the shapes
 * differ in the rows), fp32 A, B and C with CUBLAS_COMPUTE_32F, as the
 * dense fp32 GEMMs compute. That call has no epilogues, so a bias is
 * written into the output rows first and the GEMM adds onto it (beta 1),
 * and the backward's GELU is one elementwise pass over all the rows'
 * din after the grouped GEMM; db is each group's column sums (colsum).
 *
 * bf16: cuBLAS's table of cublasGemmGroupedBatchedEx's types pairs bf16
 * A and B only with a bf16 C (and fp16 with fp16, fp32 with fp32); the
 * ops table's outputs are fp32 (base/ops.h), so the bf16 forms run the
 * dense bf16 path's cuBLASLt GEMMs (gemm_fwd / gemm_bwd, with their BIAS
 * and DGELU epilogues) group by group.
 *
 * The grouped call's pointer arrays are device arrays (cuBLAS reads them
 * on the GPU): they are written into pageable host memory and copied with
 * cudaMemcpyAsync on the compute stream, which returns once it has taken
 * the pageable source (staged or copied), so the host array may be
 * rewritten by the next call at once; the device copy is reused only by
 * work ordered after the GEMM that reads it, on the same stream.
 *
 * Host code, included by cuda/ops_cuda.cu after ops_cuda_gemm.cuh, and
 * compiled by test/emu/test_gemm_emu.cpp against the emulated cuBLAS
 * (test/emu/cublaslt_shim.h), which runs it against the CPU's grouped
 * ops. */
#ifndef DTRAIN_CUDA_OPS_CUDA_GMM_CUH
#define DTRAIN_CUDA_OPS_CUDA_GMM_CUH

#include "cuda/ops_cuda_gemm.cuh"

/* One problem of a grouped call: column-major C[m,n] = op(A) op(B) (+ beta C). */
typedef struct gmm_prob {
    const void *a, *b;
    float *c;
    int m, n, k;
} gmm_prob_t;

/* The host arrays of a call of P problems (pageable, cu_t.gmm_host, grown):
 * the 3P device pointers first (copied to cu_t.gmm_dev), then the per-problem
 * ints and floats cuBLAS reads on the host. */
typedef struct gmm_arrays {
    const void **pa, **pb;
    float **pc;
    cublasOperation_t *ta, *tb;
    int *m, *n, *k, *lda, *ldb, *ldc, *size;
    float *alpha, *beta;
} gmm_arrays_t;

static gmm_arrays_t gmm_arrays(cu_t *g, int P, const char *what)
{
    const size_t ptrs = 3 * (size_t)P * sizeof(void *);
    const size_t bytes =
        ptrs + 2 * (size_t)P * sizeof(cublasOperation_t) + 7 * (size_t)P * sizeof(int) + 2 * (size_t)P * sizeof(float);
    if (bytes > g->gmm_host_cap) {
        free(g->gmm_host);
        g->gmm_host = malloc(bytes);
        g->gmm_host_cap = g->gmm_host ? bytes : 0;
        if (!g->gmm_host)
            cuda_fatal(what, "out of host memory for the grouped GEMM's arrays");
    }
    if (ptrs > g->gmm_dev_cap) {
        room_moved(g, what);
        if (g->gmm_dev)
            ck(cudaFreeAsync(g->gmm_dev, g->stream), what);
        g->gmm_dev = NULL;
        g->gmm_dev_cap = 0;
        ck(cudaMallocAsync(&g->gmm_dev, ptrs, g->stream), what);
        g->gmm_dev_cap = ptrs;
    }
    char *h = (char *)g->gmm_host;
    gmm_arrays_t a;
    a.pa = (const void **)h;
    a.pb = (const void **)(h + (size_t)P * sizeof(void *));
    a.pc = (float **)(h + 2 * (size_t)P * sizeof(void *));
    h += ptrs;
    a.ta = (cublasOperation_t *)h;
    a.tb = a.ta + P;
    int *ints = (int *)(a.tb + P);
    a.m = ints;
    a.n = ints + P;
    a.k = ints + 2 * P;
    a.lda = ints + 3 * P;
    a.ldb = ints + 4 * P;
    a.ldc = ints + 5 * P;
    a.size = ints + 6 * P;
    a.alpha = (float *)(ints + 7 * P);
    a.beta = a.alpha + P;
    return a;
}

/* The P problems of pr (none empty) as one cublasGemmGroupedBatchedEx:
 * transposes ta, tb and leading dimensions lda, ldb, ldc for all, alpha 1
 * and beta for all. */
static void gmm_grouped(cu_t *g, const char *what, cublasOperation_t ta, cublasOperation_t tb, int lda, int ldb,
                        int ldc, float beta, const gmm_prob_t *pr, int P)
{
    if (P <= 0)
        return;
    gmm_arrays_t a = gmm_arrays(g, P, what);
    for (int p = 0; p < P; p++) {
        a.pa[p] = pr[p].a;
        a.pb[p] = pr[p].b;
        a.pc[p] = pr[p].c;
        a.ta[p] = ta;
        a.tb[p] = tb;
        a.m[p] = pr[p].m;
        a.n[p] = pr[p].n;
        a.k[p] = pr[p].k;
        a.lda[p] = lda;
        a.ldb[p] = ldb;
        a.ldc[p] = ldc;
        a.size[p] = 1;
        a.alpha[p] = 1.0f;
        a.beta[p] = beta;
    }
    void **dev = (void **)g->gmm_dev;
    ck(cudaMemcpyAsync(dev, g->gmm_host, 3 * (size_t)P * sizeof(void *), cudaMemcpyHostToDevice, g->stream), what);
    ckb(cublasGemmGroupedBatchedEx(g->blas, a.ta, a.tb, a.m, a.n, a.k, a.alpha, (const void *const *)dev, CUDA_R_32F,
                                   a.lda, (const void *const *)(dev + P), CUDA_R_32F, a.ldb, a.beta,
                                   (void *const *)(dev + 2 * P), CUDA_R_32F, a.ldc, P, a.size, CUBLAS_COMPUTE_32F),
        what);
    g->plans.grouped++;
}

/* The groups' problems, at most G of them: one per group with rows
 * (rows[g] = offs[g+1] - offs[g] > 0), from a function of (g, r0, n). */
static int gmm_rows(const int32_t *offs, int g) { return offs[g + 1] - offs[g]; }

/* ---- fp32 ---- */

/* out rows of group g = in rows . w_g^T (+ b_g): column-major
 * out^T[OC,n] = (w_g^T[IC,OC])^T . in^T[IC,n] (gemm_fwd's mapping). */
static void gmm_fwd_f32(cu_t *g, float *out, const float *in, const float *w, const float *b, const int32_t *offs,
                        int G, int IC, int OC)
{
    const char *what = "gmm_fwd";
    if (OC <= 0 || G <= 0)
        return;
    gmm_prob_t *pr = (gmm_prob_t *)malloc((size_t)G * sizeof *pr);
    if (!pr)
        cuda_fatal(what, "out of host memory");
    int P = 0;
    for (int x = 0; x < G; x++) {
        const int r0 = offs[x], n = gmm_rows(offs, x);
        if (n <= 0)
            continue;
        if (b || IC <= 0) /* the bias the GEMM adds onto, or IC = 0's zeros */
            CU_LAUNCH(k_fill_rows, grid_for((size_t)n * OC, THREADS), THREADS, 0, g->stream)
        (out + (size_t)r0 * OC, b ? b + (size_t)x * OC : NULL, n, OC);
        pr[P++] = (gmm_prob_t){w + (size_t)x * OC * IC, in + (size_t)r0 * IC, out + (size_t)r0 * OC, OC, n, IC};
    }
    if (IC > 0)
        gmm_grouped(g, what, CUBLAS_OP_T, CUBLAS_OP_N, IC, IC, OC, b ? 1.0f : 0.0f, pr, P);
    free(pr);
}

static void gmm_bwd_f32(cu_t *g, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                        const float *w, const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw)
{
    const char *what = "gmm_bwd";
    if (G <= 0)
        return;
    const int R = offs[G];
    if (OC <= 0) { /* an empty sum, as gemm_bwd */
        if (din && !accum_din && R > 0 && IC > 0) {
            ck(cudaMemsetAsync(din, 0, (size_t)R * IC * sizeof(float), g->stream), what);
            if (pre)
                CU_LAUNCH(k_gelu_bwd, grid_for((size_t)R * IC, THREADS), THREADS, 0, g->stream)
            (din, (uint16_t *)NULL, pre, din, (size_t)R * IC);
        }
        return;
    }
    gmm_prob_t *pr = (gmm_prob_t *)malloc((size_t)G * sizeof *pr);
    if (!pr)
        cuda_fatal(what, "out of host memory");
    /* din^T[IC,n] = w_g^T[IC,OC] . dout^T[OC,n], then gelu'(pre) o it */
    if (din && IC > 0) {
        int P = 0;
        for (int x = 0; x < G; x++)
            if (gmm_rows(offs, x) > 0)
                pr[P++] = (gmm_prob_t){w + (size_t)x * OC * IC,    dout + (size_t)offs[x] * OC,
                                       din + (size_t)offs[x] * IC, IC,
                                       gmm_rows(offs, x),          OC};
        gmm_grouped(g, what, CUBLAS_OP_N, CUBLAS_OP_N, IC, OC, IC, accum_din ? 1.0f : 0.0f, pr, P);
        if (pre && R > 0)
            CU_LAUNCH(k_gelu_bwd, grid_for((size_t)R * IC, THREADS), THREADS, 0, g->stream)
        (din, (uint16_t *)NULL, pre, din, (size_t)R * IC);
    }
    /* dw_g^T[IC,OC] = in^T[IC,n] . dout[n,OC]; a group without rows: 0 */
    if (dw && IC > 0) {
        int P = 0;
        for (int x = 0; x < G; x++) {
            float *dwx = dw + (size_t)x * OC * IC;
            if (gmm_rows(offs, x) > 0)
                pr[P++] = (gmm_prob_t){in + (size_t)offs[x] * IC, dout + (size_t)offs[x] * OC, dwx, IC, OC,
                                       gmm_rows(offs, x)};
            else if (!accum_dw)
                ck(cudaMemsetAsync(dwx, 0, (size_t)OC * IC * sizeof(float), g->stream), what);
        }
        gmm_grouped(g, what, CUBLAS_OP_N, CUBLAS_OP_T, IC, OC, IC, accum_dw ? 1.0f : 0.0f, pr, P);
    }
    free(pr);
    for (int x = 0; db && x < G; x++)
        colsum(g, db + (size_t)x * OC, dout + (size_t)offs[x] * OC, gmm_rows(offs, x), OC, accum_dw, what);
}

/* ---- bf16: the dense path, group by group ---- */

static void gmm_fwd_b16(cu_t *g, float *out, const uint16_t *in, const uint16_t *w, const float *b, const int32_t *offs,
                        int G, int IC, int OC)
{
    for (int x = 0; x < G; x++)
        gemm_fwd(g, "gmm_fwd_bf16", CUDA_R_16BF, out + (size_t)offs[x] * OC, NULL, NULL, in + (size_t)offs[x] * IC,
                 w + (size_t)x * OC * IC, b ? b + (size_t)x * OC : NULL, gmm_rows(offs, x), IC, OC);
}

static void gmm_bwd_b16(cu_t *g, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                        const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                        int OC, int accum_din, int accum_dw)
{
    for (int x = 0; x < G; x++) {
        const size_t r0 = (size_t)offs[x];
        gemm_bwd(g, "gmm_bwd_bf16", CUDA_R_16BF, din ? din + r0 * IC : NULL, NULL, dw ? dw + (size_t)x * OC * IC : NULL,
                 db ? db + (size_t)x * OC : NULL, dout16 + r0 * OC, dout + r0 * OC, in + r0 * IC,
                 w + (size_t)x * OC * IC, pre ? pre + r0 * IC : NULL, gmm_rows(offs, x), IC, OC, accum_din, accum_dw);
    }
}

/* ---- the ops ---- */

static void gmm_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G,
                    int IC, int OC)
{
    cu_t *g = (cu_t *)ctx;
    gmm_fwd_f32(g, out, in, w, b, offs, G, IC, OC);
    finish(g, "gmm_fwd");
}

static void gmm_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                    const float *w, const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gmm_bwd_f32(g, din, dw, db, dout, in, pre, w, offs, G, IC, OC, accum_din, accum_dw);
    finish(g, "gmm_bwd");
}

static void gmm_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                         const int32_t *offs, int G, int IC, int OC)
{
    cu_t *g = (cu_t *)ctx;
    gmm_fwd_b16(g, out, in, w, b, offs, G, IC, OC);
    finish(g, "gmm_fwd_bf16");
}

static void gmm_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                         const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                         int OC, int accum_din, int accum_dw)
{
    cu_t *g = (cu_t *)ctx;
    gmm_bwd_b16(g, din, dw, db, dout16, dout, in, pre, w, offs, G, IC, OC, accum_din, accum_dw);
    finish(g, "gmm_bwd_bf16");
}

#endif
