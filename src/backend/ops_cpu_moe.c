/* The CPU backend's mixture-of-experts ops (base/ops.h, "Mixture-of-experts
 * routing"): routing, the dispatch order, gathering each expert's tokens,
 * and the combine, with their backwards. The expert MLPs themselves are
 * the ordinary GEMM and activation ops on row ranges of the gathered
 * tokens.
 *
 * Determinism: every output element is written by one thread, every sum
 * runs in index order (over experts, over the K choices, over tokens), and
 * no op depends on the thread count. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/backend/ops_cpu_moe.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The expert of an assignment, kept (idx >= 0) or dropped (-(e+1)). */
static int expert_of(int32_t idx) { return idx >= 0 ? idx : -idx - 1; }

/* One token: lse, scores[E], the top K of score + bias (highest first,
 * the lower expert on a tie; bias NULL: none) and their gates, from the
 * scores alone. taken[E] is scratch. */
static void route_token(float *s, float *lse, int32_t *idx, float *gate, const float *l, const float *bias, int E,
                        int K, int sigmoid, int norm_topk, unsigned char *taken)
{
    float mx = l[0];
    for (int e = 1; e < E; e++)
        mx = l[e] > mx ? l[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++)
        sum += expf(l[e] - mx);
    *lse = mx + logf(sum);
    for (int e = 0; e < E; e++)
        s[e] = sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - *lse);
    memset(taken, 0, (size_t)E);
    float chosen = 0.0f;
    for (int j = 0; j < K; j++) {
        int best = -1;
        float best_v = 0.0f;
        for (int e = 0; e < E; e++) {
            const float v = bias ? s[e] + bias[e] : s[e];
            if (!taken[e] && (best < 0 || v > best_v)) {
                best = e;
                best_v = v;
            }
        }
        taken[best] = 1;
        idx[j] = best;
        chosen += s[best];
    }
    for (int j = 0; j < K; j++)
        gate[j] = norm_topk ? s[idx[j]] / chosen : s[idx[j]];
}

typedef struct assign {
    int e, n, j;
    float s;
} assign_t;

/* By expert, then score (highest first), then token, then j. */
static int assign_cmp(const void *pa, const void *pb)
{
    const assign_t *a = pa, *b = pb;
    if (a->e != b->e)
        return a->e < b->e ? -1 : 1;
    if (a->s != b->s)
        return a->s > b->s ? -1 : 1;
    if (a->n != b->n)
        return a->n < b->n ? -1 : 1;
    return a->j < b->j ? -1 : a->j > b->j;
}

/* Capacity dropping within one sequence of T tokens (rows n0..n0+T-1):
 * each expert keeps its `cap` best-scored assignments. buf[T*K] scratch. */
static void drop_sequence(int32_t *idx, const float *scores, int n0, int T, int E, int K, int cap, assign_t *buf)
{
    int m = 0;
    for (int t = 0; t < T; t++)
        for (int j = 0; j < K; j++) {
            const int n = n0 + t, e = idx[(size_t)n * K + j];
            buf[m++] = (assign_t){.e = e, .n = n, .j = j, .s = scores[(size_t)n * E + e]};
        }
    qsort(buf, (size_t)m, sizeof *buf, assign_cmp);
    for (int i = 0, rank = 0; i < m; i++) {
        rank = i > 0 && buf[i].e == buf[i - 1].e ? rank + 1 : 0;
        if (rank >= cap)
            idx[(size_t)buf[i].n * K + buf[i].j] = -(buf[i].e + 1);
    }
}

void cpu_moe_route_fwd(void *ctx, float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                       const float *bias, int N, int T, int E, int K, int sigmoid, int norm_topk, int capacity)
{
    (void)ctx;
#pragma omp parallel
    {
        unsigned char *taken = malloc((size_t)E);
#pragma omp for schedule(static)
        for (int n = 0; n < N; n++)
            if (taken)
                route_token(scores + (size_t)n * E, lse + n, idx + (size_t)n * K, gate + (size_t)n * K,
                            logits + (size_t)n * E, bias, E, K, sigmoid, norm_topk, taken);
        free(taken);
    }
    if (capacity <= 0 || T <= 0)
        return;
#pragma omp parallel
    {
        assign_t *buf = malloc((size_t)T * (size_t)K * sizeof *buf);
#pragma omp for schedule(static)
        for (int b = 0; b < N / T; b++)
            if (buf)
                drop_sequence(idx, scores, b * T, T, E, K, capacity, buf);
        free(buf);
    }
}

void cpu_moe_plan(void *ctx, int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K)
{
    (void)ctx;
    const size_t NK = (size_t)N * K;
    memset(offs, 0, ((size_t)E + 1) * sizeof *offs);
    for (size_t a = 0; a < NK; a++)
        if (idx[a] >= 0)
            offs[idx[a] + 1]++;
    for (int e = 0; e < E; e++)
        offs[e + 1] += offs[e];
    /* next free place of each expert: offs shifted, rebuilt as we go */
    int32_t *next = malloc((size_t)E * sizeof *next);
    if (!next)
        return;
    memcpy(next, offs, (size_t)E * sizeof *next);
    for (size_t a = 0; a < NK; a++) {
        if (idx[a] < 0) {
            where[a] = -1;
            continue;
        }
        const int32_t p = next[idx[a]]++;
        perm[p] = (int32_t)a;
        where[a] = p;
    }
    free(next);
}

void cpu_moe_stats(void *ctx, float *stats, const int32_t *idx, const float *scores, const float *lse, int N, int E,
                   int K, int sigmoid)
{
    (void)ctx;
    double *rowsum = sigmoid ? malloc((size_t)(N > 0 ? N : 1) * sizeof *rowsum) : NULL;
    if (sigmoid && !rowsum)
        return;
    for (int n = 0; sigmoid && n < N; n++) {
        double r = 0.0;
        for (int e = 0; e < E; e++)
            r += scores[(size_t)n * E + e];
        rowsum[n] = r;
    }
#pragma omp parallel for schedule(static)
    for (int e = 0; e < E; e++) {
        double p = 0.0;
        for (int n = 0; n < N; n++)
            p += sigmoid ? scores[(size_t)n * E + e] / rowsum[n] : scores[(size_t)n * E + e];
        stats[E + e] = (float)p;
    }
    free(rowsum);
    double z = 0.0;
    long dropped = 0;
    for (int e = 0; e < E; e++)
        stats[e] = 0.0f;
    for (size_t a = 0; a < (size_t)N * K; a++) {
        stats[expert_of(idx[a])] += 1.0f;
        dropped += idx[a] < 0;
    }
    for (int n = 0; n < N; n++)
        z += (double)lse[n] * (double)lse[n];
    stats[2 * E] = (float)z;
    stats[2 * E + 1] = (float)dropped;
}

void cpu_moe_gather(void *ctx, float *xe, const float *x, const int32_t *perm, int M, int K, int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        memcpy(xe + (size_t)i * C, x + (size_t)(perm[i] / K) * C, (size_t)C * sizeof(float));
}

void cpu_moe_combine_fwd(void *ctx, float *out, const float *ye, const float *gate, const int32_t *where, int N, int K,
                         int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        memset(o, 0, (size_t)C * sizeof *o);
        for (int j = 0; j < K; j++) {
            const int32_t w = where[(size_t)n * K + j];
            if (w < 0)
                continue;
            const float g = gate[(size_t)n * K + j], *y = ye + (size_t)w * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] += g * y[c];
        }
    }
}

void cpu_moe_combine_bwd(void *ctx, float *dye, float *dgate, const float *dout, const float *ye, const float *gate,
                         const int32_t *where, int N, int K, int C)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *d = dout + (size_t)n * C;
        for (int j = 0; j < K; j++) {
            const size_t a = (size_t)n * K + j;
            if (where[a] < 0) {
                dgate[a] = 0.0f;
                continue;
            }
            const float *y = ye + (size_t)where[a] * C;
            float *dy = dye + (size_t)where[a] * C;
            const float g = gate[a];
            float dot = 0.0f;
            for (int c = 0; c < C; c++) {
                dot += d[c] * y[c];
                dy[c] = g * d[c];
            }
            dgate[a] = dot;
        }
    }
}

void cpu_moe_scatter_bwd(void *ctx, float *dx, const float *dxe, const int32_t *where, int N, int K, int C, int accum)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        float *o = dx + (size_t)n * C;
        if (!accum)
            memset(o, 0, (size_t)C * sizeof *o);
        for (int j = 0; j < K; j++) {
            const int32_t w = where[(size_t)n * K + j];
            if (w < 0)
                continue;
            const float *g = dxe + (size_t)w * C;
#pragma omp simd
            for (int c = 0; c < C; c++)
                o[c] += g[c];
        }
    }
}

/* One token's dlogits d[E] (see base/ops.h moe_route_bwd). */
static void route_token_bwd(float *d, const float *dgate, const float *l, const float *s, float lse,
                            const int32_t *idx, const float *auxw, float zw, int E, int K, int sigmoid, int norm_topk)
{
    memset(d, 0, (size_t)E * sizeof *d);
    /* through the gates: gate_j = s_j (/ S, the chosen scores' sum) */
    float S = 0.0f, gdot = 0.0f;
    for (int j = 0; j < K; j++)
        S += s[expert_of(idx[j])];
    for (int j = 0; j < K; j++)
        gdot += dgate[j] * (s[expert_of(idx[j])] / S);
    for (int j = 0; j < K; j++)
        d[expert_of(idx[j])] += norm_topk ? (dgate[j] - gdot) / S : dgate[j];
    /* the load-balancing loss through p: the scores (softmax) or the
     * scores over their sum (sigmoid) */
    if (auxw && !sigmoid) {
        for (int e = 0; e < E; e++)
            d[e] += auxw[e];
    } else if (auxw) {
        float sum = 0.0f, pw = 0.0f;
        for (int e = 0; e < E; e++)
            sum += s[e];
        for (int e = 0; e < E; e++)
            pw += auxw[e] * (s[e] / sum);
        for (int e = 0; e < E; e++)
            d[e] += (auxw[e] - pw) / sum;
    }
    /* scores to logits */
    if (sigmoid) {
        for (int e = 0; e < E; e++)
            d[e] *= s[e] * (1.0f - s[e]);
    } else {
        float dot = 0.0f;
        for (int e = 0; e < E; e++)
            dot += d[e] * s[e];
        for (int e = 0; e < E; e++)
            d[e] = s[e] * (d[e] - dot);
    }
    /* the z-loss: d lse^2 / d logit_e = 2 lse softmax_e */
    if (zw != 0.0f)
        for (int e = 0; e < E; e++)
            d[e] += zw * 2.0f * lse * expf(l[e] - lse);
}

void cpu_moe_route_bwd(void *ctx, float *dlogits, const float *dgate, const float *logits, const float *scores,
                       const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                       int sigmoid, int norm_topk)
{
    (void)ctx;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++)
        route_token_bwd(dlogits + (size_t)n * E, dgate + (size_t)n * K, logits + (size_t)n * E,
                        scores + (size_t)n * E, lse[n], idx + (size_t)n * K, auxw, zw, E, K, sigmoid, norm_topk);
}
