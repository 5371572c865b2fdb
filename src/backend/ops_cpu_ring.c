/* The CPU backend's ring attention ops (base/ops.h, "Ring attention's
 * building blocks"; context parallelism, issue 34): one block of
 * attention, queries against a K,V block held apart from them, the
 * log-sum-exp merge of partial results, and the block's backward.
 *
 * The tiling is ops_cpu.c's attention's: per (sequence, head), query rows
 * in blocks of RING_ROW_BLOCK; a block's scores against the run of keys
 * any of its rows may see go to a per-task tile [RING_ROW_BLOCK, nk], are
 * turned into probabilities there and used at once. A row's keys are a
 * contiguous run of the block (kpos increases; see base/ops.h), found by
 * binary search: qdoc <= kpos (its document) and kpos <= qpos when causal.
 * A query block whose rows see no key is skipped. Without memory for a tile
 * the outputs become NaN, as in ops_cpu.c's attention.
 *
 * Determinism: every output element is written by one task, every sum runs
 * in a fixed order, the backward's dK and dV per KV head on one task (the
 * query heads sharing it run in order), so results do not depend on the
 * thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/backend/ops_cpu_ring.h"

#include "base/ops_math.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* Query rows per tile: ops_cpu.c's ATT_ROW_BLOCK, so that a block covering
 * the whole sequence tiles exactly as attention_fwd does. */
#define RING_ROW_BLOCK 64

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

#ifdef _OPENMP
static int max_threads(void) { return omp_get_max_threads(); }
#endif

static void fill_nan(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

/* Keys [*lo, *hi] of the block (indices into kpos, within [k0, k0 + nk))
 * that a query at global position qp, whose document starts at qd, sees:
 * qd <= kpos[k], and kpos[k] <= qp when causal. *lo > *hi: none. */
static void ring_keys(const int32_t *kpos, int k0, int nk, int qp, int qd, int causal, int *lo, int *hi)
{
    int a = k0, b = k0 + nk;
    while (a < b) { /* first key at or after qd */
        int m = a + (b - a) / 2;
        if (kpos[m] < qd)
            a = m + 1;
        else
            b = m;
    }
    *lo = a;
    if (!causal) {
        *hi = k0 + nk - 1;
        return;
    }
    b = k0 + nk;
    while (a < b) { /* first key after qp */
        int m = a + (b - a) / 2;
        if (kpos[m] <= qp)
            a = m + 1;
        else
            b = m;
    }
    *hi = a - 1;
}

/* The key runs of query rows r0..r1-1 of sequence b (lo[], hi[] per row,
 * relative to nothing: block indices) and their union [*klo, *khi];
 * returns 0 when no row sees any key. */
static int ring_tile_keys(const att_block_t *k, const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, int b,
                          int r0, int r1, int *lo, int *hi, int *klo, int *khi)
{
    *klo = INT_MAX;
    *khi = INT_MIN;
    for (int t = r0; t < r1; t++) {
        int qd = qdoc ? qdoc[(size_t)b * k->Tq + t] : INT_MIN;
        ring_keys(kpos, k->k0, k->nk, qpos[t], qd, k->causal, &lo[t - r0], &hi[t - r0]);
        if (lo[t - r0] <= hi[t - r0]) {
            *klo = imin(*klo, lo[t - r0]);
            *khi = imax(*khi, hi[t - r0]);
        }
    }
    return *klo <= *khi;
}

/* One tile row: row[lo..hi] holds scaled scores, which become exp(s - l),
 * l their log-sum-exp (returned); the row's other columns 0..n-1 become 0.
 * lo > hi (no key): the row is 0 and l = -inf. */
static float ring_probs_row(float *row, int lo, int hi, int n)
{
    if (lo > hi) {
        memset(row, 0, (size_t)n * sizeof(float));
        return -INFINITY;
    }
    for (int j = 0; j < lo; j++)
        row[j] = 0.0f;
    float mx = row[lo];
    for (int j = lo + 1; j <= hi; j++)
        mx = row[j] > mx ? row[j] : mx;
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = lo; j <= hi; j++)
        sum += dt_expf(row[j] - mx);
    float l = mx + logf(sum);
#pragma omp simd
    for (int j = lo; j <= hi; j++)
        row[j] = dt_expf(row[j] - l);
    for (int j = hi + 1; j < n; j++)
        row[j] = 0.0f;
    return l;
}

/* out[B*Tq, NH*HS], lse[B, NH, Tq] rows q0..q0+nq-1 written. Per (b, h),
 * per query tile: S = Q K^T scale over the tile's key run, P = exp(S - lse),
 * O = P V. Q is a strided view of qkv (row stride R), K and V of kv (row
 * stride KR). */
void cpu_attention_block_fwd(void *ctx, float *out, float *lse, const float *qkv, const float *kv,
                             const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc, const att_block_t *k)
{
    const int B = k->B, NH = k->NH, NKV = k->NKV, HS = k->HS, Tq = k->Tq, Tk = k->Tk;
    const int R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS, grp = NH / NKV;
    const int qend = k->q0 + k->nq;
    const float scale = 1.0f / sqrtf((float)HS);
    if (k->nq <= 0)
        return;
    int failed = 0;
#pragma omp parallel for schedule(static) if (B * NH >= max_threads()) reduction(| : failed)
    for (int bh = 0; bh < B * NH; bh++) {
        int b = bh / NH, h = bh % NH, kh = h / grp;
        const float *q = qkv + (size_t)b * Tq * R + h * HS;
        const float *kb = kv + (size_t)b * Tk * KR + kh * HS, *vb = kv + (size_t)b * Tk * KR + (NKV + kh) * HS;
        float *o = out + (size_t)b * Tq * OC + h * HS, *l = lse + (size_t)bh * Tq;
        const int ld = imax(k->nk, 1);
        float *P = malloc((size_t)imin(k->nq, RING_ROW_BLOCK) * ld * sizeof(float));
        if (!P) {
            failed = 1;
            continue;
        }
        int lo[RING_ROW_BLOCK], hi[RING_ROW_BLOCK];
        for (int r0 = k->q0; r0 < qend; r0 += RING_ROW_BLOCK) {
            int r1 = imin(qend, r0 + RING_ROW_BLOCK), M = r1 - r0, klo, khi;
            if (!ring_tile_keys(k, qpos, kpos, qdoc, b, r0, r1, lo, hi, &klo, &khi)) {
                for (int t = r0; t < r1; t++) { /* a tile with no valid pair: skipped */
                    l[t] = -INFINITY;
                    memset(o + (size_t)t * OC, 0, (size_t)HS * sizeof(float));
                }
                continue;
            }
            int n = khi + 1 - klo;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, HS, scale, q + (size_t)r0 * R, R,
                        kb + (size_t)klo * KR, KR, 0.0f, P, ld);
            for (int t = r0; t < r1; t++)
                l[t] = ring_probs_row(P + (size_t)(t - r0) * ld, lo[t - r0] - klo, hi[t - r0] - klo, n);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, HS, n, 1.0f, P, ld, vb + (size_t)klo * KR, KR,
                        0.0f, o + (size_t)r0 * OC, OC);
        }
        free(P);
    }
    if (failed) {
        fill_nan(out, (size_t)B * Tq * OC);
        fill_nan(lse, (size_t)B * NH * Tq);
    }
}

/* Rows q0..q0+nq-1 of (out, lse) merged with (pout, plse), per element
 * by dt_lse_merge's weights. */
void cpu_attention_merge(void *ctx, float *out, float *lse, const float *pout, const float *plse,
                         const att_block_t *k)
{
    const int NH = k->NH, HS = k->HS, Tq = k->Tq, nq = k->nq, OC = NH * HS;
    const long rows = (long)k->B * NH * nq;
#pragma omp parallel for schedule(static)
    for (long i = 0; i < rows; i++) {
        int b = (int)(i / ((long)NH * nq)), h = (int)(i / nq % NH), t = k->q0 + (int)(i % nq);
        size_t li = ((size_t)b * NH + h) * Tq + t;
        float a = lse[li], p = plse[li], m = dt_lse_merge(a, p);
        if (m == -INFINITY)
            continue; /* neither has a key yet */
        float wa = dt_expf(a - m), wp = dt_expf(p - m);
        float *o = out + ((size_t)b * Tq + t) * OC + h * HS;
        const float *po = pout + ((size_t)b * Tq + t) * OC + h * HS;
#pragma omp simd
        for (int e = 0; e < HS; e++)
            o[e] = wa * o[e] + wp * po[e];
        lse[li] = m;
    }
}

/* One query row of the backward's tiles: p holds its scaled scores, d its
 * dP = dO V^T, over the tile's n columns: P = exp(s - lt) and dS = P o
 * (dP - D) on its keys [lo, hi], 0 elsewhere; D = rowsum(dO o O). */
void cpu_att_grad_row(float *p, float *d, const float *o, const float *dout, float lt, int lo, int hi, int n, int HS)
{
    if (lo > hi) {
        memset(p, 0, (size_t)n * sizeof(float));
        memset(d, 0, (size_t)n * sizeof(float));
        return;
    }
    float D = 0.0f;
#pragma omp simd reduction(+ : D)
    for (int e = 0; e < HS; e++)
        D += dout[e] * o[e];
    for (int j = 0; j < lo; j++)
        p[j] = d[j] = 0.0f;
#pragma omp simd
    for (int j = lo; j <= hi; j++) {
        p[j] = dt_expf(p[j] - lt);
        d[j] = dt_softmax_grad(p[j], d[j], D);
    }
    for (int j = hi + 1; j < n; j++)
        p[j] = d[j] = 0.0f;
}

/* dq (q heads of dqkv, rows q0..) and dkv (rows k0..) accumulated.
 * Parallel over (b, kv head): the query heads sharing a KV head run on one
 * task, so dK and dV are accumulated race-free. Per query tile, over its
 * key run, in two tiles [RING_ROW_BLOCK, nk]:
 *   P = exp(Q K^T scale - lse);  dP = dO V^T;  dS = P o (dP - D);
 *   dQ += dS K scale;  dK += dS^T Q scale;  dV += P^T dO. */
void cpu_attention_block_bwd(void *ctx, float *dqkv, float *dkv, const float *dout, const float *qkv, const float *kv,
                             const float *out, const float *lse, const int32_t *qpos, const int32_t *kpos,
                             const int32_t *qdoc, const att_block_t *k)
{
    const int B = k->B, NH = k->NH, NKV = k->NKV, HS = k->HS, Tq = k->Tq, Tk = k->Tk;
    const int R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS, grp = NH / NKV;
    const int qend = k->q0 + k->nq;
    const float scale = 1.0f / sqrtf((float)HS);
    if (k->nq <= 0 || k->nk <= 0)
        return;
    int failed = 0;
#pragma omp parallel for schedule(static) if (B * NKV >= max_threads()) reduction(| : failed)
    for (int bk = 0; bk < B * NKV; bk++) {
        int b = bk / NKV, kh = bk % NKV;
        const float *kb = kv + (size_t)b * Tk * KR + kh * HS, *vb = kv + (size_t)b * Tk * KR + (NKV + kh) * HS;
        float *dk = dkv + (size_t)b * Tk * KR + kh * HS, *dv = dkv + (size_t)b * Tk * KR + (NKV + kh) * HS;
        const int ld = k->nk;
        const size_t tile = (size_t)imin(k->nq, RING_ROW_BLOCK) * ld;
        float *P = malloc(2 * tile * sizeof(float)), *dS = P + tile;
        if (!P) {
            failed = 1;
            continue;
        }
        int lo[RING_ROW_BLOCK], hi[RING_ROW_BLOCK];
        for (int h = kh * grp; h < (kh + 1) * grp; h++) {
            const float *q = qkv + (size_t)b * Tq * R + h * HS, *l = lse + ((size_t)b * NH + h) * Tq;
            const float *dO = dout + (size_t)b * Tq * OC + h * HS, *O = out + (size_t)b * Tq * OC + h * HS;
            float *dq = dqkv + (size_t)b * Tq * R + h * HS;
            for (int r0 = k->q0; r0 < qend; r0 += RING_ROW_BLOCK) {
                int r1 = imin(qend, r0 + RING_ROW_BLOCK), M = r1 - r0, klo, khi;
                if (!ring_tile_keys(k, qpos, kpos, qdoc, b, r0, r1, lo, hi, &klo, &khi))
                    continue;
                int n = khi + 1 - klo;
                const float *kt = kb + (size_t)klo * KR, *vt = vb + (size_t)klo * KR, *qt = q + (size_t)r0 * R;
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, HS, scale, qt, R, kt, KR, 0.0f, P, ld);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, n, HS, 1.0f, dO + (size_t)r0 * OC, OC, vt, KR,
                            0.0f, dS, ld);
                for (int t = r0; t < r1; t++)
                    cpu_att_grad_row(P + (size_t)(t - r0) * ld, dS + (size_t)(t - r0) * ld, O + (size_t)t * OC,
                                  dO + (size_t)t * OC, l[t], lo[t - r0] - klo, hi[t - r0] - klo, n, HS);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, HS, n, scale, dS, ld, kt, KR, 1.0f,
                            dq + (size_t)r0 * R, R);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, M, scale, dS, ld, qt, R, 1.0f,
                            dk + (size_t)klo * KR, KR);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, HS, M, 1.0f, P, ld, dO + (size_t)r0 * OC, OC,
                            1.0f, dv + (size_t)klo * KR, KR);
            }
        }
        free(P);
    }
    if (failed) {
        fill_nan(dqkv, (size_t)B * Tq * R);
        fill_nan(dkv, (size_t)B * Tk * KR);
    }
}

/* kv[N, KR] = the k and v columns of qkv[N, R]: one row's KR floats are
 * contiguous in both (qkv's k heads then v heads). */
void cpu_attention_kv_pack(void *ctx, float *kv, const float *qkv, int N, int NH, int NKV, int HS)
{
    const size_t R = (size_t)(NH + 2 * NKV) * HS, KR = (size_t)2 * NKV * HS, OC = (size_t)NH * HS;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++)
        memcpy(kv + (size_t)n * KR, qkv + (size_t)n * R + OC, KR * sizeof(float));
}

/* dqkv[n, OC .. R) = (or +=) dkv[n, 0 .. KR). */
void cpu_attention_kv_unpack(void *ctx, float *dqkv, const float *dkv, int N, int NH, int NKV, int HS, int accum)
{
    const size_t R = (size_t)(NH + 2 * NKV) * HS, KR = (size_t)2 * NKV * HS, OC = (size_t)NH * HS;
#pragma omp parallel for schedule(static)
    for (long n = 0; n < N; n++) {
        float *d = dqkv + (size_t)n * R + OC;
        const float *s = dkv + (size_t)n * KR;
        if (!accum) {
            memcpy(d, s, KR * sizeof(float));
            continue;
        }
#pragma omp simd
        for (size_t j = 0; j < KR; j++)
            d[j] += s[j];
    }
}
