/* The CPU ops table: cblas_sgemm (OpenMP build of OpenBLAS) for every matmul,
 * OpenMP loops for everything else, per-element formulas from
 * base/ops_math.h. The context (cpu_ctx_t) holds what the ops keep between
 * calls: the bf16 GEMMs' widening panels.
 *
 * Threading. OpenBLAS and the loops here share libgomp's thread pool. A
 * cblas_sgemm called at top level uses all threads; one called inside an
 * `omp parallel` region runs on the calling thread only, which is what the
 * per-head attention GEMMs want.
 *
 * Determinism. Every reduction over rows (bias, norm-weight and embedding
 * gradients, sumsq) is split by columns or into fixed-size blocks that do not
 * depend on the thread count, and each partial is summed in index order, so
 * results are bit-identical for any OMP_NUM_THREADS. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/backend/ops_cpu.h"
#include "src/backend/ops_cpu_gmm.h"
#include "src/backend/ops_cpu_moe.h"
#include "src/backend/ops_cpu_ring.h"

#include "base/ops_math.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Column block of the column-parallel reductions: one 64-byte cache line, so
 * two threads never write the same line of the output for aligned rows. */
#define COL_BLOCK 16
/* Query rows per block in causal attention: only keys 0..(block end) are
 * multiplied, so big T costs about half the full T x T GEMMs. */
#define ATT_ROW_BLOCK 64
/* sumsq is summed in this many fixed blocks, then the block sums in order. */
#define SUMSQ_BLOCKS 64
/* cross-entropy sums exp in float over runs of this many columns, then in
 * double across runs. */
#define CE_RUN 256

#ifdef _OPENMP
/* Used by `omp parallel for if (...)` clauses only. */
static int max_threads(void) { return omp_get_max_threads(); }
#endif

static int imin(int a, int b) { return a < b ? a : b; }

/* o16[i] = bf16 of x[i], i < n: an op's bf16 output (base/ops.h), from the
 * fp32 values it has just written. */
static void rows16(uint16_t *o16, const float *x, size_t n)
{
#pragma omp simd
    for (size_t i = 0; i < n; i++)
        o16[i] = dt_f32_to_bf16(x[i]);
}

/* rows16 of n values, over the threads: the bf16 output of an op whose
 * fp32 result is written by BLAS calls (attention, the GEMMs' epilogues). */
static void cast_rows16(uint16_t *o16, const float *x, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        o16[i] = dt_f32_to_bf16(x[i]);
}

/* The backend's state, every method's ctx; the table is its first member,
 * so ops_release frees both. */
typedef struct cpu_ctx {
    ops_t ops;
    /* The bf16 GEMMs' two widening panels, kept across calls and grown
     * when a call needs more (at most BF16_PANEL floats each). Allocating
     * them per call made bf16 GEMMs of 512^3-1024^3 cost 2.6-4x fp32's:
     * glibc returned the blocks to the kernel on free, and every call
     * page-faulted them in again (bench/README.md). Ops are called from
     * one host thread (ops.h), so one pair serves every call. */
    struct {
        float *a, *b;
        size_t na, nb; /* floats */
    } panels;
    cpu_gmm_ws_t gmm; /* the bf16 grouped GEMMs' widening buffers */
} cpu_ctx_t;

/* max of x[0..n-1] (-inf for n = 0). Eight running maxima in registers keep
 * the loop free of a serial dependence; GCC's `omp simd reduction(max)`
 * keeps its accumulator in memory at -O2 and runs 3x slower. */
#define MAX_STEP(a, v) a = (v) > a ? (v) : a
static float row_max(const float *x, int n)
{
    float a0 = -INFINITY, a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        MAX_STEP(a0, x[i]);
        MAX_STEP(a1, x[i + 1]);
        MAX_STEP(a2, x[i + 2]);
        MAX_STEP(a3, x[i + 3]);
        MAX_STEP(a4, x[i + 4]);
        MAX_STEP(a5, x[i + 5]);
        MAX_STEP(a6, x[i + 6]);
        MAX_STEP(a7, x[i + 7]);
    }
    for (; i < n; i++)
        MAX_STEP(a0, x[i]);
    MAX_STEP(a0, a1);
    MAX_STEP(a2, a3);
    MAX_STEP(a4, a5);
    MAX_STEP(a6, a7);
    MAX_STEP(a0, a2);
    MAX_STEP(a4, a6);
    MAX_STEP(a0, a4);
    return a0;
}
#undef MAX_STEP

/* ---- memory ----------------------------------------------------------------- */

static void *cpu_alloc(void *ctx, size_t bytes)
{
    if (bytes > SIZE_MAX - 63)
        return NULL;
    size_t sz = bytes ? (bytes + 63) & ~(size_t)63 : 64; /* aligned_alloc wants a multiple */
    void *p = aligned_alloc(64, sz);
    if (p)
        memset(p, 0, sz);
    return p;
}

static void cpu_free(void *ctx, void *p) { free(p); }

/* every op has finished when it returns */
static void cpu_sync(void *ctx) {}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes)
{
    if (bytes)
        memmove(dst, src, bytes);
}

static void cpu_zero(void *ctx, void *dst, size_t bytes)
{
    if (bytes)
        memset(dst, 0, bytes);
}

/* ---- shared reductions ------------------------------------------------------- */

/* out[C] (=|+= by accum) sum over rows of x[N, C]. Column-parallel: each
 * column is summed over n in order by exactly one thread. */
static void colsum(float *out, const float *x, int N, int C, int accum)
{
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * COL_BLOCK, nc = imin(COL_BLOCK, C - c0);
        float acc[COL_BLOCK] = {0};
        for (int n = 0; n < N; n++) {
            const float *row = x + (size_t)n * C + c0;
#pragma omp simd
            for (int c = 0; c < nc; c++)
                acc[c] += row[c];
        }
        for (int c = 0; c < nc; c++)
            out[c0 + c] = accum ? out[c0 + c] + acc[c] : acc[c];
    }
}

/* ---- matmul ------------------------------------------------------------------- */

/* out[n, :] = b for every row n: the bias the GEMMs then add onto (beta = 1) */
static void bias_rows(float *out, const float *b, int N, int OC)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        memcpy(out + (size_t)n * OC, b, (size_t)OC * sizeof(float));
}

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b[OC]).
 * The bias is written first and the GEMM adds onto it (beta = 1): one write
 * sweep instead of a read-modify-write sweep after the GEMM (the two measure
 * the same within noise at GPT-2 shapes; this one is simpler). */
static void matmul_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, int N, int IC, int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    float beta = 0.0f;
    if (b) {
        bias_rows(out, b, N, OC);
        beta = 1.0f;
    }
    if (IC <= 0) {
        if (!b)
            memset(out, 0, (size_t)N * OC * sizeof(float));
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, IC, 1.0f, in, IC, w, IC, beta, out, OC);
}

/* din[N,IC] = dout[N,OC] . w[OC,IC];  dw[OC,IC] = dout^T . in[N,IC];
 * db[OC] = column sums of dout. beta = 0 overwrites (NaN-safe in OpenBLAS). */
static void matmul_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       int N, int IC, int OC, int accum_din, int accum_dw)
{
    if (OC <= 0) { /* an empty sum: din = 0, or unchanged when accumulating */
        if (din && !accum_din && N > 0 && IC > 0)
            memset(din, 0, (size_t)N * IC * sizeof(float));
        return;
    }
    if (din && N > 0 && IC > 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, OC, 1.0f, dout, OC, w, IC,
                    accum_din ? 1.0f : 0.0f, din, IC);
    if (dw && IC > 0) {
        if (N > 0)
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, N, 1.0f, dout, OC, in, IC,
                        accum_dw ? 1.0f : 0.0f, dw, IC);
        else if (!accum_dw)
            memset(dw, 0, (size_t)OC * IC * sizeof(float));
    }
    if (db)
        colsum(db, dout, N, OC, accum_dw);
}

/* ---- LayerNorm ---------------------------------------------------------------- */

/* out[N,C] = (x - mean) * rstd * w + b; mean[N], rstd[N] saved. */
static void layernorm_fwd(void *ctx, float *out, uint16_t *out16, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int N, int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out ? out + (size_t)n * C : NULL;
        uint16_t *o16 = out16 ? out16 + (size_t)n * C : NULL;
        float s = 0.0f;
#pragma omp simd reduction(+ : s)
        for (int c = 0; c < C; c++)
            s += xr[c];
        float mu = s / (float)C;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++) {
            float d = xr[c] - mu;
            ss += d * d;
        }
        float r = dt_norm_rstd(ss, C, eps);
        if (o) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = dt_layernorm_out(xr[c], mu, r, w[c], b[c]);
        }
        if (o16) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o16[c] = dt_f32_to_bf16(dt_layernorm_out(xr[c], mu, r, w[c], b[c]));
        }
        mean[n] = mu;
        rstd[n] = r;
    }
}

/* din[N,C] += (g - mean(g) - xhat * mean(g * xhat)) * rstd with g = dout * w;
 * dw[C] (=|+=) sum_n dout * xhat; db[C] (=|+=) sum_n dout.
 * Rows for din, then column blocks for dw/db (deterministic). */
static void layernorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                          const float *x, const float *w, const float *mean, const float *rstd, int N, int C,
                          int accum_dw)
{
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel
    {
        if (din) {
#pragma omp for schedule(static) nowait
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
                float *d = din + (size_t)n * C;
                float mu = mean[n], r = rstd[n];
                float sg = 0.0f, sgx = 0.0f;
#pragma omp simd reduction(+ : sg, sgx)
                for (int c = 0; c < C; c++) {
                    float gw = g[c] * w[c];
                    sg += gw;
                    sgx += gw * (xr[c] - mu) * r;
                }
                sg /= (float)C;
                sgx /= (float)C;
#pragma omp simd
                for (int c = 0; c < C; c++) {
                    float xhat = (xr[c] - mu) * r;
                    d[c] += dt_layernorm_dx(g[c], w[c], xhat, sg, sgx, r);
                }
                if (din16)
                    rows16(din16 + (size_t)n * C, d, (size_t)C);
            }
        }
        if (dw || db) {
#pragma omp for schedule(static)
            for (int blk = 0; blk < nblk; blk++) {
                int c0 = blk * COL_BLOCK, nc = imin(COL_BLOCK, C - c0);
                float aw[COL_BLOCK] = {0}, ab[COL_BLOCK] = {0};
                for (int n = 0; n < N; n++) {
                    const float *xr = x + (size_t)n * C + c0, *g = dout + (size_t)n * C + c0;
                    float mu = mean[n], r = rstd[n];
#pragma omp simd
                    for (int c = 0; c < nc; c++) {
                        aw[c] += g[c] * (xr[c] - mu) * r;
                        ab[c] += g[c];
                    }
                }
                for (int c = 0; c < nc; c++) {
                    if (dw)
                        dw[c0 + c] = accum_dw ? dw[c0 + c] + aw[c] : aw[c];
                    if (db)
                        db[c0 + c] = accum_dw ? db[c0 + c] + ab[c] : ab[c];
                }
            }
        }
    }
}

/* ---- RMSNorm ------------------------------------------------------------------- */

/* out[N,C] = x * rstd * w, rstd[N] = 1/sqrt(mean(x^2) + eps). */
static void rmsnorm_fwd(void *ctx, float *out, uint16_t *out16, float *rstd, const float *x, const float *w, int N,
                        int C, float eps)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *xr = x + (size_t)n * C;
        float *o = out ? out + (size_t)n * C : NULL;
        uint16_t *o16 = out16 ? out16 + (size_t)n * C : NULL;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int c = 0; c < C; c++)
            ss += xr[c] * xr[c];
        float r = dt_norm_rstd(ss, C, eps);
        if (o) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] = xr[c] * r * w[c];
        }
        if (o16) {
#pragma omp simd
            for (int c = 0; c < C; c++)
                o16[c] = dt_f32_to_bf16(xr[c] * r * w[c]);
        }
        rstd[n] = r;
    }
}

/* din[N,C] += r * w * g - x * r^3 / C * sum_c(w g x);  dw[C] (=|+=) sum_n g x r. */
static void rmsnorm_bwd(void *ctx, float *din, uint16_t *din16, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C, int accum_dw)
{
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel
    {
        if (din) {
#pragma omp for schedule(static) nowait
            for (int n = 0; n < N; n++) {
                const float *xr = x + (size_t)n * C, *g = dout + (size_t)n * C;
                float *d = din + (size_t)n * C;
                float r = rstd[n];
                float s = 0.0f;
#pragma omp simd reduction(+ : s)
                for (int c = 0; c < C; c++)
                    s += w[c] * g[c] * xr[c];
                float k = dt_rmsnorm_k(r, s, C);
#pragma omp simd
                for (int c = 0; c < C; c++)
                    d[c] += dt_rmsnorm_dx(r, w[c], g[c], xr[c], k);
                if (din16)
                    rows16(din16 + (size_t)n * C, d, (size_t)C);
            }
        }
        if (dw) {
#pragma omp for schedule(static)
            for (int blk = 0; blk < nblk; blk++) {
                int c0 = blk * COL_BLOCK, nc = imin(COL_BLOCK, C - c0);
                float aw[COL_BLOCK] = {0};
                for (int n = 0; n < N; n++) {
                    const float *xr = x + (size_t)n * C + c0, *g = dout + (size_t)n * C + c0;
                    float r = rstd[n];
#pragma omp simd
                    for (int c = 0; c < nc; c++)
                        aw[c] += g[c] * xr[c] * r;
                }
                for (int c = 0; c < nc; c++)
                    dw[c0 + c] = accum_dw ? dw[c0 + c] + aw[c] : aw[c];
            }
        }
    }
}

/* ---- RoPE ------------------------------------------------------------------------ */

/* Rotates pair i of every q and k head of each row of qkv[B*T, (NH+2NKV)*HS]
 * by +angle (dir = 1, forward) or -angle (dir = -1, gradient). The q and k
 * heads are contiguous at the start of the row, so they are one run of
 * NH+NKV heads. Without pos parallel over positions: one cos/sin per
 * (position, pair), shared by the B rows and all heads at that position;
 * with pos (document positions) parallel over rows, one cos/sin per (row,
 * pair): the same angles for the same positions, so the same bits. */
static void rope_apply(float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS, const float *inv_freq,
                       float dir)
{
    const int R = (NH + 2 * NKV) * HS, nqk = NH + NKV;
    if (pos) {
#pragma omp parallel for schedule(static)
        for (int n = 0; n < B * T; n++) {
            float *row = qkv + (size_t)n * R;
            for (int i = 0; i < HS / 2; i++) {
                float a = dt_rope_angle(pos[n], inv_freq[i]);
                float c = cosf(a), s = dir * sinf(a);
                for (int h = 0; h < nqk; h++) {
                    float *p = row + h * HS + 2 * i;
                    dt_rope_rotate(p, p + 1, c, s);
                }
            }
        }
        return;
    }
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < HS / 2; i++) {
            float a = dt_rope_angle(t, inv_freq[i]);
            float c = cosf(a), s = dir * sinf(a);
            for (int b = 0; b < B; b++) {
                float *row = qkv + ((size_t)b * T + t) * R;
                for (int h = 0; h < nqk; h++) {
                    float *p = row + h * HS + 2 * i;
                    dt_rope_rotate(p, p + 1, c, s);
                }
            }
        }
    }
}

static void rope_fwd(void *ctx, float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS,
                     const float *inv_freq)
{
    rope_apply(qkv, pos, B, T, NH, NKV, HS, inv_freq, 1.0f);
}

static void rope_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const int32_t *pos, int B, int T, int NH, int NKV,
                     int HS, const float *inv_freq)
{
    rope_apply(dqkv, pos, B, T, NH, NKV, HS, inv_freq, -1.0f);
    if (dqkv16)
        cast_rows16(dqkv16, dqkv, (size_t)B * T * (NH + 2 * NKV) * HS);
}

/* ---- q/k norms (Qwen3) ------------------------------------------------------------ */

/* Each q and k head of each row of qkv[N, (NH+2NKV)*HS]: saved to xin,
 * then normalised in place as rmsnorm_fwd does a row. */
static void qknorm_fwd(void *ctx, float *qkv, float *xin, float *rstd, const float *wq, const float *wk, int N, int NH,
                       int NKV, int HS, float eps)
{
    const int R = (NH + 2 * NKV) * HS, nqk = NH + NKV;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nqk; h++) {
            float *x = qkv + (size_t)n * R + (size_t)h * HS, *xs = xin + ((size_t)n * nqk + h) * HS;
            const float *w = h < NH ? wq : wk;
            float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
            for (int c = 0; c < HS; c++)
                ss += x[c] * x[c];
            float r = dt_norm_rstd(ss, HS, eps);
#pragma omp simd
            for (int c = 0; c < HS; c++) {
                xs[c] = x[c];
                x[c] = x[c] * r * w[c];
            }
            rstd[(size_t)n * nqk + h] = r;
        }
}

/* dw first (it reads dqkv before dx overwrites it): column c of dwq sums
 * g x r over rows then q heads, in that fixed order, likewise dwk; then
 * each head's dx as rmsnorm_bwd's, written over g. */
static void qknorm_bwd(void *ctx, float *dqkv, float *dwq, float *dwk, const float *xin, const float *wq,
                       const float *wk, const float *rstd, int N, int NH, int NKV, int HS, int accum_dw)
{
    const int R = (NH + 2 * NKV) * HS, nqk = NH + NKV;
#pragma omp parallel for schedule(static)
    for (int k = 0; k < 2 * HS; k++) {
        const int c = k % HS, h0 = k < HS ? 0 : NH, h1 = k < HS ? NH : nqk;
        float a = 0.0f;
        for (int n = 0; n < N; n++)
            for (int h = h0; h < h1; h++) {
                const size_t i = (size_t)n * nqk + h;
                a += dqkv[(size_t)n * R + (size_t)h * HS + c] * xin[i * HS + c] * rstd[i];
            }
        float *dw = k < HS ? dwq : dwk;
        dw[c] = accum_dw ? dw[c] + a : a;
    }
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nqk; h++) {
            float *g = dqkv + (size_t)n * R + (size_t)h * HS;
            const float *x = xin + ((size_t)n * nqk + h) * HS, *w = h < NH ? wq : wk;
            const float r = rstd[(size_t)n * nqk + h];
            float s = 0.0f;
#pragma omp simd reduction(+ : s)
            for (int c = 0; c < HS; c++)
                s += w[c] * g[c] * x[c];
            float kk = dt_rmsnorm_k(r, s, HS);
#pragma omp simd
            for (int c = 0; c < HS; c++)
                g[c] = dt_rmsnorm_dx(r, w[c], g[c], x[c], kk);
        }
}

/* ---- attention ---------------------------------------------------------------- */

/* Flash-attention style on the CPU: per (b, head), query rows in blocks of
 * ATT_ROW_BLOCK; a block's scores against keys 0..(its last row) go to a
 * per-task tile [ATT_ROW_BLOCK, T], are turned into probabilities there and
 * used at once, so nothing T x T outlives the block. What backward keeps is
 * lse (one float per query row); it recomputes P = exp(s - lse), which in
 * the forward is also how P is formed, so both passes use the same P bits.
 * Tiles are allocated per task (ATT_ROW_BLOCK x T floats, 256 KiB at T =
 * 1024); without memory for one the outputs become NaN, which the training
 * loop's non-finite loss check turns into an error.
 *
 * Documents (pos != NULL): a block's keys start at k0, the first key of
 * the document of its first row (document starts never decrease along a
 * row), instead of 0: the GEMMs skip every key before it, which is where
 * masking saves time (the keys of earlier documents). Row t's keys are
 * then columns t - pos[t] - k0 .. t - k0 of the tile; the others become
 * 0. Without pos, k0 = 0 and row t's keys are 0..t: the causal case. */

/* First key of query block r0's tile: 0, or the start of row r0's document. */
static int att_k0(const int32_t *pos, int r0) { return pos ? r0 - pos[r0] : 0; }

/* Tile columns lo..hi of query row t (keys k0 + lo .. k0 + hi). */
static void att_cols(const int32_t *pos, int t, int k0, int *lo, int *hi)
{
    *lo = pos ? t - pos[t] - k0 : 0;
    *hi = t - k0;
}

/* Rows r0..r1-1 of a tile (row t at P + (t - r0) * T) hold scaled scores
 * of keys k0..r1-1; row t's own keys are its columns lo..hi (att_cols):
 * P = exp(s - lse) with lse[t] = max + log(sum exp(s - max)) over them;
 * the row's other columns up to r1 - k0 become 0 (the block's GEMMs read
 * them). */
static void causal_probs_rows(float *P, float *lse, const int32_t *pos, int T, int r0, int r1, int k0)
{
    for (int t = r0; t < r1; t++) {
        float *row = P + (size_t)(t - r0) * T;
        int lo, hi;
        att_cols(pos, t, k0, &lo, &hi);
        for (int j = 0; j < lo; j++)
            row[j] = 0.0f;
        float mx = row_max(row + lo, hi + 1 - lo);
        float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
        for (int j = lo; j <= hi; j++)
            sum += dt_expf(row[j] - mx);
        float l = mx + logf(sum);
        lse[t] = l;
#pragma omp simd
        for (int j = lo; j <= hi; j++)
            row[j] = dt_expf(row[j] - l);
        for (int j = hi + 1; j < r1 - k0; j++)
            row[j] = 0.0f;
    }
}

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* out[B*T, NH*HS]; lse[B, NH, T]; qkv[B*T, (NH+2NKV)*HS]; pos[B*T] or NULL.
 * Per (b, h), per query block: S = Q K^T / sqrt(HS) over keys k0 up to the
 * block's last row, P = exp(S - lse), O = P V; Q, K, V are strided views of
 * qkv (row stride R). */
static void attention_fwd(void *ctx, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos,
                          int B, int T, int NH, int NKV, int HS)
{
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, grp = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
    int failed = 0;
#pragma omp parallel for schedule(static) if (B * NH >= max_threads()) reduction(| : failed)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, kh = h / grp;
        const float *base = qkv + (size_t)b * T * R;
        const float *q = base + h * HS, *k = base + (NH + kh) * HS, *v = base + (NH + NKV + kh) * HS;
        float *o = out + (size_t)b * T * OC + h * HS, *l = lse + (size_t)bh * T;
        const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
        float *P = malloc((size_t)imin(T, ATT_ROW_BLOCK) * T * sizeof(float));
        if (!P) {
            failed = 1;
            continue;
        }
        for (int r0 = 0; r0 < T; r0 += ATT_ROW_BLOCK) {
            int r1 = imin(T, r0 + ATT_ROW_BLOCK), M = r1 - r0, k0 = att_k0(ps, r0), nk = r1 - k0;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, HS, scale, q + (size_t)r0 * R, R,
                        k + (size_t)k0 * R, R, 0.0f, P, T);
            causal_probs_rows(P, l, ps, T, r0, r1, k0);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, HS, nk, 1.0f, P, T, v + (size_t)k0 * R, R, 0.0f,
                        o + (size_t)r0 * OC, OC);
        }
        free(P);
    }
    if (failed) {
        fill_nan(out, (size_t)B * T * OC);
        fill_nan(lse, (size_t)B * NH * T);
    }
    if (out16)
        cast_rows16(out16, out, (size_t)B * T * OC);
}

/* One query row t of the backward's tiles: p holds its scaled scores, d
 * its dP = dO V^T, over the tile's nk columns (keys k0..): P = exp(s -
 * lse_t) and dS = P o (dP - D) on its own keys (att_cols), 0 elsewhere. */
static void att_grad_row(float *p, float *d, const float *o, const float *dout, float lt, const int32_t *pos, int t,
                         int k0, int nk, int HS)
{
    int lo, hi;
    att_cols(pos, t, k0, &lo, &hi);
    cpu_att_grad_row(p, d, o, dout, lt, lo, hi, nk, HS);
}

/* dqkv[B*T, R] written. Parallel over (b, kv head): the query heads sharing
 * a KV head run on one task, so dK and dV are accumulated race-free. Per
 * query block, in two tiles [ATT_ROW_BLOCK, T]:
 *   P = exp(Q K^T scale - lse);  dP = dO V^T;  D = rowsum(dO o O);
 *   dS = P o (dP - D);  dQ = dS K scale;  dK += dS^T Q scale;  dV += P^T dO.
 * over the block's keys k0..r1-1, as in the forward. */
static void attention_bwd(void *ctx, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                          const float *out, const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int HS)
{
    const int R = (NH + 2 * NKV) * HS, OC = NH * HS, grp = NH / NKV;
    const float scale = 1.0f / sqrtf((float)HS);
    int failed = 0;
#pragma omp parallel for schedule(static) if (B * NKV >= max_threads()) reduction(| : failed)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV, kh = bk % NKV;
        const float *base = qkv + (size_t)b * T * R;
        const float *k = base + (NH + kh) * HS, *v = base + (NH + NKV + kh) * HS;
        float *dbase = dqkv + (size_t)b * T * R;
        float *dk = dbase + (NH + kh) * HS, *dv = dbase + (NH + NKV + kh) * HS;
        const int32_t *ps = pos ? pos + (size_t)b * T : NULL;
        const size_t tile = (size_t)imin(T, ATT_ROW_BLOCK) * T;
        float *P = malloc(2 * tile * sizeof(float)), *dS = P + tile;
        if (!P) {
            failed = 1;
            continue;
        }
        for (int t = 0; t < T; t++) {
            memset(dk + (size_t)t * R, 0, (size_t)HS * sizeof(float));
            memset(dv + (size_t)t * R, 0, (size_t)HS * sizeof(float));
        }
        for (int h = kh * grp; h < (kh + 1) * grp; h++) {
            const float *q = base + h * HS, *l = lse + ((size_t)b * NH + h) * T;
            const float *dO = dout + (size_t)b * T * OC + h * HS, *O = out + (size_t)b * T * OC + h * HS;
            float *dq = dbase + h * HS;
            for (int r0 = 0; r0 < T; r0 += ATT_ROW_BLOCK) {
                int r1 = imin(T, r0 + ATT_ROW_BLOCK), M = r1 - r0, k0 = att_k0(ps, r0), nk = r1 - k0;
                const float *kb = k + (size_t)k0 * R, *vb = v + (size_t)k0 * R;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, HS, scale, q + (size_t)r0 * R, R, kb, R,
                            0.0f, P, T);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, nk, HS, 1.0f, dO + (size_t)r0 * OC, OC, vb, R,
                            0.0f, dS, T);
                for (int t = r0; t < r1; t++)
                    att_grad_row(P + (size_t)(t - r0) * T, dS + (size_t)(t - r0) * T, O + (size_t)t * OC,
                                 dO + (size_t)t * OC, l[t], ps, t, k0, nk, HS);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, HS, nk, scale, dS, T, kb, R, 0.0f,
                            dq + (size_t)r0 * R, R);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, HS, M, scale, dS, T, q + (size_t)r0 * R, R,
                            1.0f, dk + (size_t)k0 * R, R);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, nk, HS, M, 1.0f, P, T, dO + (size_t)r0 * OC, OC,
                            1.0f, dv + (size_t)k0 * R, R);
            }
        }
        free(P);
    }
    if (failed)
        fill_nan(dqkv, (size_t)B * T * R);
    if (dqkv16)
        cast_rows16(dqkv16, dqkv, (size_t)B * T * R);
}

/* ---- activations ------------------------------------------------------------------ */

static void gelu_fwd(void *ctx, float *out, uint16_t *out16, const float *x, size_t n)
{
    if (out) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++)
            out[i] = dt_gelu(x[i]);
    }
    if (out16) {
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++)
            out16[i] = dt_f32_to_bf16(dt_gelu(x[i]));
    }
}

static void gelu_bwd(void *ctx, float *dx, const float *x, const float *dout, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        dx[i] = dout[i] * dt_gelu_grad(x[i]);
}

/* gu[N, 2F] = [gate | up]; out[N, F] = silu(gate) * up. */
static void swiglu_fwd(void *ctx, float *out, uint16_t *out16, const float *gu, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F;
        float *o = out ? out + (size_t)n * F : NULL;
        uint16_t *o16 = out16 ? out16 + (size_t)n * F : NULL;
        if (o) {
#pragma omp simd
            for (int f = 0; f < F; f++)
                o[f] = dt_silu(g[f]) * u[f];
        }
        if (o16) {
#pragma omp simd
            for (int f = 0; f < F; f++)
                o16[f] = dt_f32_to_bf16(dt_silu(g[f]) * u[f]);
        }
    }
}

static void swiglu_bwd(void *ctx, float *dgu, uint16_t *dgu16, const float *gu, const float *dout, int N, int F)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * F, *u = g + F, *d = dout + (size_t)n * F;
        float *dg = dgu + (size_t)n * 2 * F, *du = dg + F;
#pragma omp simd
        for (int f = 0; f < F; f++)
            dt_swiglu_grad(g[f], u[f], d[f], &dg[f], &du[f]);
        if (dgu16)
            rows16(dgu16 + (size_t)n * 2 * F, dg, 2 * (size_t)F);
    }
}

static void add(void *ctx, float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

/* ---- embedding --------------------------------------------------------------------- */

/* The position row of token n: its document position, or n % T. */
static int emb_pos(const int32_t *pos, int n, int T) { return pos ? pos[n] : n % T; }

/* out[N,C] = wte[tok[n] - v0] for tokens this rank holds ([v0, v0+Vl)), else
 * 0; + wpe[emb_pos(n)] when wpe != NULL. */
static void embedding_fwd(void *ctx, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                          const float *wpe, int N, int T, int C, int v0, int Vl)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        int r = tok[n] - v0;
        const float *p = wpe ? wpe + (size_t)emb_pos(pos, n, T) * C : NULL;
        if (r >= 0 && r < Vl) {
            const float *e = wte + (size_t)r * C;
            if (p)
                for (int c = 0; c < C; c++)
                    o[c] = e[c] + p[c];
            else
                memcpy(o, e, (size_t)C * sizeof(float));
        } else if (p) {
            memcpy(o, p, (size_t)C * sizeof(float));
        } else {
            memset(o, 0, (size_t)C * sizeof(float));
        }
    }
}

/* dwte[Vl,C], dwpe[T,C] (+)= scatter of dout[N,C]. Each thread owns column
 * blocks and walks the tokens in order, so repeated tokens are summed in a
 * fixed order without atomics. With accum = 0 all Vl (and T) rows are
 * cleared first. */
static void embedding_bwd(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                          const int32_t *pos, int N, int T, int C, int v0, int Vl, int accum)
{
    int nblk = (C + COL_BLOCK - 1) / COL_BLOCK;
#pragma omp parallel
    {
        if (!accum) {
#pragma omp for schedule(static) nowait
            for (int r = 0; r < Vl; r++)
                memset(dwte + (size_t)r * C, 0, (size_t)C * sizeof(float));
            if (dwpe) {
#pragma omp for schedule(static)
                for (int r = 0; r < T; r++)
                    memset(dwpe + (size_t)r * C, 0, (size_t)C * sizeof(float));
            }
#pragma omp barrier
        }
#pragma omp for schedule(static)
        for (int blk = 0; blk < nblk; blk++) {
            int c0 = blk * COL_BLOCK, nc = imin(COL_BLOCK, C - c0);
            for (int n = 0; n < N; n++) {
                const float *d = dout + (size_t)n * C + c0;
                int r = tok[n] - v0;
                if (r >= 0 && r < Vl) {
                    float *e = dwte + (size_t)r * C + c0;
                    for (int c = 0; c < nc; c++)
                        e[c] += d[c];
                }
                if (dwpe) {
                    float *p = dwpe + (size_t)emb_pos(pos, n, T) * C + c0;
                    for (int c = 0; c < nc; c++)
                        p[c] += d[c];
                }
            }
        }
    }
}

/* ---- cross-entropy ------------------------------------------------------------------ */

/* Vocabulary-parallel cross-entropy, pass 1: rowmax[n] over this rank's Vl
 * real columns of logits[N, ld]. */
static void xent_max(void *ctx, float *rowmax, const float *logits, int N, int Vl, int ld)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        rowmax[n] = row_max(logits + (size_t)n * ld, Vl);
}

/* Pass 2: stats[n] = {sum exp(x - rowmax) over this rank's columns, the
 * target's logit if this rank holds it else 0}. The sum is float over runs
 * of CE_RUN terms (each <= 1) folded in double: it vectorises and keeps
 * ~1e-7 accuracy. With expbuf (may alias logits) the exps are kept for
 * pass 3; the target logit is read before its slot is overwritten. */
static void xent_sumexp(void *ctx, float *stats, float *expbuf, const float *logits, const float *rowmax,
                        const int32_t *targets, int v0, int N, int Vl, int ld)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * ld;
        float *e = expbuf ? expbuf + (size_t)n * ld : NULL;
        int r = targets[n] - v0;
        stats[2 * n + 1] = targets[n] >= 0 && r >= 0 && r < Vl ? x[r] : 0.0f;
        const float mx = rowmax[n];
        double sum = 0.0;
        for (int i0 = 0; i0 < Vl; i0 += CE_RUN) {
            int i1 = imin(Vl, i0 + CE_RUN);
            float ps = 0.0f;
            if (e) {
#pragma omp simd reduction(+ : ps)
                for (int i = i0; i < i1; i++) {
                    float v = dt_expf(x[i] - mx);
                    e[i] = v;
                    ps += v;
                }
            } else {
#pragma omp simd reduction(+ : ps)
                for (int i = i0; i < i1; i++)
                    ps += dt_expf(x[i] - mx);
            }
            sum += ps;
        }
        stats[2 * n] = (float)sum;
    }
}

/* Pass 3, after the group sums: losses[n] = rowmax + log(sumexp) - x_target
 * (0 for ignored rows, target < 0). With dlogits (holding pass 2's exps):
 * dlogits = dloss * (softmax - onehot) over the Vl real columns; padding
 * columns and ignored rows become 0. */
static void xent_finish(void *ctx, float *losses, float *dlogits, uint16_t *dlogits16, const float *rowmax,
                        const float *stats, const int32_t *targets, int v0, int N, int Vl, int ld, float dloss)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *d = dlogits ? dlogits + (size_t)n * ld : NULL;
        const double sum = stats[2 * n];
        if (targets[n] < 0) {
            losses[n] = 0.0f;
            if (d)
                memset(d, 0, (size_t)ld * sizeof(float));
            if (d && dlogits16)
                memset(dlogits16 + (size_t)n * ld, 0, (size_t)ld * sizeof(uint16_t));
            continue;
        }
        losses[n] = dt_xent_loss(rowmax[n], sum, stats[2 * n + 1]);
        if (d) {
            float k = dt_xent_gscale(dloss, sum);
#pragma omp simd
            for (int i = 0; i < Vl; i++)
                d[i] *= k;
            int r = targets[n] - v0;
            if (r >= 0 && r < Vl)
                d[r] -= dloss;
            for (int i = Vl; i < ld; i++)
                d[i] = 0.0f;
            if (dlogits16)
                rows16(dlogits16 + (size_t)n * ld, d, (size_t)ld);
        }
    }
}

/* ---- optimizer and reductions --------------------------------------------------------- */

static void adamw(void *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float grad_scale, int t)
{
    const dt_adamw_coef_t k = dt_adamw_coef(lr, beta1, beta2, eps, wd, grad_scale, t);
    /* sqrtf can vectorise only when it need not set errno: with
     * -fno-math-errno this loop runs about 1.8x faster and is then bound by
     * memory traffic (28 bytes per parameter, 30 with p16). Two loops, so
     * neither carries a branch per element. */
    if (p16) {
#ifdef __NO_MATH_ERRNO__
#pragma omp parallel for simd schedule(static)
#else
#pragma omp parallel for schedule(static)
#endif
        for (size_t i = 0; i < n; i++) {
            dt_adamw_update(&p[i], &m[i], &v[i], g[i], &k);
            p16[i] = dt_f32_to_bf16(p[i]);
        }
        return;
    }
#ifdef __NO_MATH_ERRNO__
#pragma omp parallel for simd schedule(static)
#else
#pragma omp parallel for schedule(static)
#endif
    for (size_t i = 0; i < n; i++)
        dt_adamw_update(&p[i], &m[i], &v[i], g[i], &k);
}

/* Sum of squares in double over SUMSQ_BLOCKS fixed blocks, block sums added
 * in order: the same bits for any thread count. */
static double sumsq_one(const float *x, size_t n)
{
    double part[SUMSQ_BLOCKS];
    size_t bs = (n + SUMSQ_BLOCKS - 1) / SUMSQ_BLOCKS;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++) {
        size_t lo = (size_t)blk * bs, hi = lo + bs < n ? lo + bs : n;
        /* Eight float accumulators over runs of 256 elements (32 terms
         * each), folded into double after every run: twice as fast as
         * converting every element to double, no serial dependence, and
         * the float partials lose < 1e-7 relative. */
        double s = 0.0;
        size_t i = lo;
        for (; i + 256 <= hi; i += 256) {
            float f0 = 0, f1 = 0, f2 = 0, f3 = 0, f4 = 0, f5 = 0, f6 = 0, f7 = 0;
            for (size_t k = i; k < i + 256; k += 8) {
                f0 += x[k] * x[k];
                f1 += x[k + 1] * x[k + 1];
                f2 += x[k + 2] * x[k + 2];
                f3 += x[k + 3] * x[k + 3];
                f4 += x[k + 4] * x[k + 4];
                f5 += x[k + 5] * x[k + 5];
                f6 += x[k + 6] * x[k + 6];
                f7 += x[k + 7] * x[k + 7];
            }
            s += (((double)f0 + f1) + ((double)f2 + f3)) + (((double)f4 + f5) + ((double)f6 + f7));
        }
        for (; i < hi; i++)
            s += (double)x[i] * (double)x[i];
        part[blk] = s;
    }
    double tot = 0.0;
    for (int blk = 0; blk < SUMSQ_BLOCKS; blk++)
        tot += part[blk];
    return tot;
}

static void sumsq(void *ctx, double *out, const float *const *x, const size_t *n, int count)
{
    for (int i = 0; i < count; i++)
        out[i] = sumsq_one(x[i], n[i]);
}

static void scale(void *ctx, float *x, float s, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] *= s;
}

/* ---- bf16 GEMMs ------------------------------------------------------------------------ */

/* OpenBLAS as Debian ships it has no bf16 GEMM (cblas_sbgemm is declared but
 * not built), so the bf16 operands are widened to fp32, which is exact, in
 * panels of at most BF16_PANEL floats, and each panel pair goes to
 * cblas_sgemm: the same exact products and fp32 sums as a bf16 tensor-core
 * GEMM, in a different order. Widening costs 6 B per operand element against
 * 2*K flops per element; the CPU's bf16 path is for checking the GPU's, not
 * for speed. */
#define BF16_PANEL CPU_BF16_PANEL /* src/backend/ops_cpu_gmm.h: the grouped GEMMs split alike */

/* dst[r1-r0, c1-c0] = fp32 of src[r0:r1, c0:c1] (src row stride ld) */
static void widen_block(float *dst, const uint16_t *src, size_t ld, int r0, int r1, int c0, int c1)
{
    int nc = c1 - c0;
#pragma omp parallel for schedule(static)
    for (int r = r0; r < r1; r++) {
        const uint16_t *s = src + (size_t)r * ld + c0;
        float *d = dst + (size_t)(r - r0) * nc;
#pragma omp simd
        for (int c = 0; c < nc; c++)
            d[c] = dt_bf16_to_f32(s[c]);
    }
}

/* 0 with c's panels a and b holding at least na and nb floats, or -1
 * when memory is short (the caller then takes the naive loop). */
static int panels_reserve(cpu_ctx_t *c, size_t na, size_t nb)
{
    if (na > c->panels.na) {
        free(c->panels.a);
        c->panels.a = malloc(na * sizeof(float));
        c->panels.na = c->panels.a ? na : 0;
    }
    if (nb > c->panels.nb) {
        free(c->panels.b);
        c->panels.b = malloc(nb * sizeof(float));
        c->panels.nb = c->panels.b ? nb : 0;
    }
    return c->panels.na >= na && c->panels.nb >= nb ? 0 : -1;
}

/* Rows per panel of a matrix with `cols` columns. */
static int panel_rows(int cols, int rows) { return cpu_bf16_panel_rows(cols, rows); }

/* Without memory for the panels (BF16_PANEL floats each): one fp32 sum per
 * output element, slow but the same arithmetic. C[M,N] (=|+= by beta)
 * A[M,K] . B[K,N] with element (i,k) of A at a[i*as0 + k*as1], likewise b. */
static void gemm_bf16_naive(float *c, int ldc, const uint16_t *a, size_t as0, size_t as1, const uint16_t *b, size_t bs0,
                            size_t bs1, int M, int N, int K, int beta)
{
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += dt_bf16_to_f32(a[i * as0 + k * as1]) * dt_bf16_to_f32(b[k * bs0 + j * bs1]);
            c[(size_t)i * ldc + j] = beta ? c[(size_t)i * ldc + j] + acc : acc;
        }
}

/* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b): panels of out's rows (in) and
 * columns (w); in is widened once when it fits one panel. */
static void matmul_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b, int N, int IC,
                            int OC)
{
    if (N <= 0 || OC <= 0)
        return;
    if (b)
        bias_rows(out, b, N, OC);
    if (IC <= 0) {
        if (!b)
            memset(out, 0, (size_t)N * OC * sizeof(float));
        return;
    }
    const int nr = panel_rows(IC, N), orows = panel_rows(IC, OC);
    cpu_ctx_t *c = ctx;
    if (panels_reserve(c, (size_t)nr * IC, (size_t)orows * IC) != 0) {
        gemm_bf16_naive(out, OC, in, IC, 1, w, 1, IC, N, OC, IC, b != NULL);
        return;
    }
    float *pa = c->panels.a, *pb = c->panels.b;
    for (int n0 = 0; n0 < N; n0 += nr) {
        int n1 = imin(N, n0 + nr);
        widen_block(pa, in, IC, n0, n1, 0, IC);
        for (int o0 = 0; o0 < OC; o0 += orows) {
            int o1 = imin(OC, o0 + orows);
            widen_block(pb, w, IC, o0, o1, 0, IC);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n1 - n0, o1 - o0, IC, 1.0f, pa, IC, pb, IC,
                        b ? 1.0f : 0.0f, out + (size_t)n0 * OC + o0, OC);
        }
    }
}

/* din[N,IC] = dout[N,OC] . w[OC,IC]: panels over the summed OC, each a
 * column block of dout and a row block of w, added in order.
 * dw[OC,IC] = dout^T . in[N,IC]: panels over the summed N, each a row block
 * of dout and of in. db: column sums of the fp32 dout. */
static void matmul_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                            const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw)
{
    if (OC <= 0) { /* an empty sum, as matmul_bwd */
        if (din && !accum_din && N > 0 && IC > 0)
            memset(din, 0, (size_t)N * IC * sizeof(float));
        return;
    }
    /* panels: din sums over OC in kd columns of dout ([N,kd]) and rows of
     * w ([kd,IC]); dw sums over N in kw rows of dout ([kw,OC]) and in ([kw,IC]) */
    const int kd = imin(panel_rows(N, OC), panel_rows(IC, OC)), kw = imin(panel_rows(OC, N), panel_rows(IC, N));
    size_t na = 0, nb = 0;
    if (din && N > 0 && IC > 0) {
        na = (size_t)N * kd;
        nb = (size_t)kd * IC;
    }
    if (dw && IC > 0 && N > 0) {
        na = na > (size_t)kw * OC ? na : (size_t)kw * OC;
        nb = nb > (size_t)kw * IC ? nb : (size_t)kw * IC;
    }
    cpu_ctx_t *c = ctx;
    const int have_panels = panels_reserve(c, na, nb) == 0;
    float *pa = c->panels.a, *pb = c->panels.b;
    if (din && N > 0 && IC > 0) {
        if (!have_panels) {
            gemm_bf16_naive(din, IC, dout16, OC, 1, w, IC, 1, N, IC, OC, accum_din);
        } else {
            const int kb = kd;
            for (int k0 = 0; k0 < OC; k0 += kb) {
                int k1 = imin(OC, k0 + kb);
                widen_block(pa, dout16, OC, 0, N, k0, k1);
                widen_block(pb, w, IC, k0, k1, 0, IC);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, IC, k1 - k0, 1.0f, pa, k1 - k0, pb, IC,
                            (accum_din || k0 > 0) ? 1.0f : 0.0f, din, IC);
            }
        }
    }
    if (dw && IC > 0) {
        if (N <= 0) {
            if (!accum_dw)
                memset(dw, 0, (size_t)OC * IC * sizeof(float));
        } else if (!have_panels) {
            gemm_bf16_naive(dw, IC, dout16, 1, OC, in, IC, 1, OC, IC, N, accum_dw);
        } else {
            const int kb = kw;
            for (int k0 = 0; k0 < N; k0 += kb) {
                int k1 = imin(N, k0 + kb);
                widen_block(pa, dout16, OC, k0, k1, 0, OC);
                widen_block(pb, in, IC, k0, k1, 0, IC);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, OC, IC, k1 - k0, 1.0f, pa, OC, pb, IC,
                            (accum_dw || k0 > 0) ? 1.0f : 0.0f, dw, IC);
            }
        }
    }
    if (db)
        colsum(db, dout, N, OC, accum_dw);
}

/* ---- GEMMs with their GELU ---------------------------------------------------------------
 * The composition the ops table defines (base/ops.h): the separate calls,
 * so the CPU's fused ops are its unfused ones bit for bit. The GELU
 * backward runs in place on din (an elementwise map). */

static void matmul_gelu_fwd(void *ctx, float *out, float *pre, const float *in, const float *w, const float *b, int N,
                            int IC, int OC)
{
    matmul_fwd(ctx, pre, in, w, b, N, IC, OC);
    gelu_fwd(ctx, out, NULL, pre, (size_t)N * OC);
}

static void matmul_gelu_fwd_bf16(void *ctx, float *out, uint16_t *out16, float *pre, const uint16_t *in,
                                 const uint16_t *w, const float *b, int N, int IC, int OC)
{
    matmul_fwd_bf16(ctx, pre, in, w, b, N, IC, OC);
    gelu_fwd(ctx, out, out16, pre, (size_t)N * OC);
}

static void matmul_dgelu_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *pre, const float *w, int N, int IC, int OC, int accum_dw)
{
    matmul_bwd(ctx, din, dw, db, dout, in, w, N, IC, OC, 0, accum_dw);
    if (din)
        gelu_bwd(ctx, din, pre, din, (size_t)N * IC);
}

static void matmul_dgelu_bwd_bf16(void *ctx, float *din, uint16_t *din16, float *dw, float *db,
                                  const uint16_t *dout16, const float *dout, const uint16_t *in, const float *pre,
                                  const uint16_t *w, int N, int IC, int OC, int accum_dw)
{
    matmul_bwd_bf16(ctx, din, dw, db, dout16, dout, in, w, N, IC, OC, 0, accum_dw);
    if (din)
        gelu_bwd(ctx, din, pre, din, (size_t)N * IC);
    if (din && din16)
        cast_rows16(din16, din, (size_t)N * IC);
}

/* ---- grouped GEMMs (src/backend/ops_cpu_gmm.c) ------------------------------------------- */

static void gmm_fwd(void *ctx, float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G,
                    int IC, int OC)
{
    cpu_gmm_fwd(out, in, w, b, offs, G, IC, OC);
}

static void gmm_bwd(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                    const float *w, const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw)
{
    cpu_gmm_bwd(din, dw, db, dout, in, pre, w, offs, G, IC, OC, accum_din, accum_dw);
}

static void gmm_fwd_bf16(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                         const int32_t *offs, int G, int IC, int OC)
{
    cpu_gmm_fwd_bf16(&((cpu_ctx_t *)ctx)->gmm, out, in, w, b, offs, G, IC, OC);
}

static void gmm_bwd_bf16(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                         const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                         int OC, int accum_din, int accum_dw)
{
    cpu_gmm_bwd_bf16(&((cpu_ctx_t *)ctx)->gmm, din, dw, db, dout16, dout, in, pre, w, offs, G, IC, OC, accum_din,
                     accum_dw);
}

/* ---- bf16 casts ------------------------------------------------------------------------ */

static void cast_f32_to_bf16(void *ctx, uint16_t *out, const float *in, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = dt_f32_to_bf16(in[i]);
}

static void cast_bf16_to_f32(void *ctx, float *out, const uint16_t *in, size_t n)
{
#pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = dt_bf16_to_f32(in[i]);
}

/* ---- the table ------------------------------------------------------------------------- */

static void cpu_release(void *ctx)
{
    cpu_ctx_t *c = ctx;
    free(c->panels.a);
    free(c->panels.b);
    cpu_gmm_ws_free(&c->gmm);
    free(c);
}

static const ops_t cpu_ops = {
    .name = "cpu",
    .host_readable = 1,
    .release = cpu_release,
    .sync = cpu_sync,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .copy = cpu_copy,
    .to_host = cpu_copy,
    .from_host = cpu_copy,
    .zero = cpu_zero,
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
    .attention_block_fwd = cpu_attention_block_fwd,
    .attention_merge = cpu_attention_merge,
    .attention_block_bwd = cpu_attention_block_bwd,
    .attention_kv_pack = cpu_attention_kv_pack,
    .attention_kv_unpack = cpu_attention_kv_unpack,
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
    .cast_f32_to_bf16 = cast_f32_to_bf16,
    .cast_bf16_to_f32 = cast_bf16_to_f32,
    .moe_route_fwd = cpu_moe_route_fwd,
    .moe_plan = cpu_moe_plan,
    .moe_stats = cpu_moe_stats,
    .moe_gather = cpu_moe_gather,
    .moe_combine_fwd = cpu_moe_combine_fwd,
    .moe_combine_bwd = cpu_moe_combine_bwd,
    .moe_scatter_bwd = cpu_moe_scatter_bwd,
    .moe_route_bwd = cpu_moe_route_bwd,
    .moe_shared_gate_fwd = cpu_moe_shared_gate_fwd,
    .moe_shared_gate_bwd = cpu_moe_shared_gate_bwd,
};

const ops_t *ops_cpu_create(void)
{
    cpu_ctx_t *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->ops = cpu_ops;
    c->ops.ctx = c;
    return &c->ops;
}

/* One threading layer: OpenMP's pool, which the OpenMP build of OpenBLAS
 * shares. */
int ops_cpu_threads(int requested)
{
    int n = 1;
#ifdef _OPENMP
    if (requested > 0)
        omp_set_num_threads(requested);
    n = omp_get_max_threads();
#endif
#ifdef HAVE_OPENBLAS_SET_NUM_THREADS
    openblas_set_num_threads(n);
#endif
    (void)requested;
    return n;
}
