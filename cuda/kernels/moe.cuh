/* Mixture-of-experts routing, dispatch and combine (base/ops.h,
 * "Mixture-of-experts routing"): the CPU ops of src/backend/ops_cpu_moe.c
 * with their semantics and their arithmetic, operation for operation, so
 * that on the same inputs every output has the CPU's bits except where a
 * GPU function differs from glibc's (expf, logf: the router's scores, lse
 * and gates, and the z-loss term of the router's backward, within an ulp or
 * two). No atomics anywhere: every output element is written by one
 * thread, every sum runs in the CPU's order, so runs are bit-identical.
 *
 * Contraction. nvcc fuses a*b + c into one FMA (one rounding); the CPU
 * build (x86-64 baseline, no FMA) rounds the product and the sum
 * separately. moe_mul/moe_add (__fmul_rn/__fadd_rn, which nvcc never
 * fuses) keep the CPU's two roundings wherever a product meets a sum.
 *
 * Kernels and launches (ops_cuda.cu's moe_* wrappers; the emulation test
 * test/emu/test_moe_emu.cpp mirrors them):
 *  - k_moe_route: a thread per token (grid_for(N, THREADS) x THREADS,
 *    grid-stride): max, sum of exps, lse, scores, the top K and gates,
 *    each over E in the CPU's order. K selection passes over E; a pass
 *    skips the experts already chosen (a scan of the K chosen so far).
 *  - k_moe_drop (capacity): grid (moe_tiles(T K), B) x MOE_TILE: a thread
 *    per assignment of one sequence; its rank among its expert's
 *    assignments of the sequence (higher score first, then token, then j:
 *    the CPU's sort order) is counted over the sequence in shared-memory
 *    tiles, and the assignment is dropped when the rank reaches the
 *    capacity. It reads a copy of the routed idx (idx_in) and writes idx.
 *  - the counting sort of moe_plan and moe_stats' counts: assignments in
 *    chunks of MOE_CHUNK (moe_chunks(N K) blocks of THREADS threads).
 *    k_moe_count: per chunk, each expert's assignments (a thread per
 *    expert scans the chunk from shared memory) into cnt[chunk][E+1]:
 *    kept ones only (plan; slot E unused), or every one by expert with
 *    the dropped ones also in slot E (stats). k_moe_offs (one block):
 *    each expert's chunk counts turned into the place of that chunk's
 *    first assignment of the expert (in place), and offs[E+1]. k_moe_place:
 *    per chunk, a thread per expert walks the chunk in order and writes
 *    perm and where from its chunk's place; dropped ones get where = -1.
 *    So the order within an expert is the assignments' order (token, then
 *    j), as the CPU's single pass gives it.
 *  - moe_stats: k_moe_count (every assignment), k_moe_rowsum (sigmoid:
 *    each token's score sum in double, a thread per token), k_moe_psum (a
 *    thread per expert, its p summed over tokens in order, in double),
 *    k_moe_stats_fold (one block: the chunk counts summed, the dropped
 *    count, and thread 0 the sum of lse^2 in order, in double).
 *  - k_moe_gather, k_moe_combine_fwd, k_moe_combine_dye, k_moe_scatter_bwd:
 *    a thread per output element (grid-stride over rows x C); the combine
 *    and the scatter sum a token's K contributions in order of j.
 *    k_moe_combine_dgate: a thread per assignment, its dot product over C
 *    in order. k_moe_route_bwd: a thread per token, the CPU's loops over
 *    K and E; the dlogits row is its scratch.
 *
 * Counts are exact integers; moe_stats converts them to float once, which
 * equals the CPU's float increments while a count stays below 2^24
 * (16.7M assignments in a microbatch). */
#ifndef DTRAIN_CUDA_KERNELS_MOE_CUH
#define DTRAIN_CUDA_KERNELS_MOE_CUH

#include "cuda/kernels/common.cuh"

#define MOE_CHUNK 1024 /* assignments per counting block (shared int32s) */
#define MOE_TILE 256   /* threads of k_moe_drop, and its shared tile */

/* Blocks over n assignments: counting chunks, drop tiles. */
static unsigned moe_chunks(size_t n) { return (unsigned)((n + MOE_CHUNK - 1) / MOE_CHUNK); }
static unsigned moe_tiles(size_t n) { return (unsigned)((n + MOE_TILE - 1) / MOE_TILE); }

/* The expert of an assignment, kept (idx >= 0) or dropped (-(e+1)). */
static __device__ int moe_expert_of(int32_t i) { return i >= 0 ? i : -i - 1; }

/* Products and sums rounded one by one, never fused (see the top). */
static __device__ float moe_mul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}
static __device__ float moe_add(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}
static __device__ double moe_dmul(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dmul_rn(a, b);
#else
    return a * b;
#endif
}
static __device__ double moe_dadd(double a, double b)
{
#ifdef __CUDA_ARCH__
    return __dadd_rn(a, b);
#else
    return a + b;
#endif
}

/* ---- routing ------------------------------------------------------------------ */

/* Token n: lse[n], scores[n, E], idx[n, K] (highest score + bias[e]
 * first, the lower expert on a tie: strict > over increasing e; bias
 * NULL: none), gate[n, K] from the scores alone. */
__global__ void k_moe_route(float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                            const float *bias, int N, int E, int K, int sigmoid, int norm_topk)
{
    GRID_STRIDE (n, (size_t)N) {
        const float *l = logits + n * E;
        float *s = scores + n * E;
        int32_t *id = idx + n * K;
        float mx = l[0];
        for (int e = 1; e < E; e++)
            mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++)
            sum += expf(l[e] - mx);
        const float ls = mx + logf(sum);
        lse[n] = ls;
        for (int e = 0; e < E; e++)
            s[e] = sigmoid ? 1.0f / (1.0f + expf(-l[e])) : expf(l[e] - ls);
        float chosen = 0.0f;
        for (int j = 0; j < K; j++) {
            int best = -1;
            float best_v = 0.0f;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++)
                    taken |= id[i] == e;
                const float v = bias ? moe_add(s[e], bias[e]) : s[e];
                if (!taken && (best < 0 || v > best_v)) {
                    best = e;
                    best_v = v;
                }
            }
            id[j] = best;
            chosen += s[best];
        }
        for (int j = 0; j < K; j++)
            gate[n * K + j] = norm_topk ? s[id[j]] / chosen : s[id[j]];
    }
}

/* Capacity within sequence b = blockIdx.y (tokens [b T, (b+1) T)): the
 * sequence's assignment a = blockIdx.x * MOE_TILE + threadIdx.x (< T K)
 * is dropped when at least cap assignments of the sequence to its expert
 * precede it: a higher score, or the same score and an earlier token, or
 * the same token and an earlier j. idx_in: the routed idx (every one
 * kept); idx: where the drops are written. */
__global__ void __launch_bounds__(MOE_TILE)
    k_moe_drop(int32_t *idx, const int32_t *idx_in, const float *scores, int T, int E, int K, int cap)
{
    __shared__ int sh_e[MOE_TILE];
    __shared__ float sh_s[MOE_TILE];
    const size_t TK = (size_t)T * K, base = (size_t)blockIdx.y * TK, nb = (size_t)blockIdx.y * T;
    const size_t a = (size_t)blockIdx.x * MOE_TILE + threadIdx.x; /* within the sequence */
    const int mine = a < TK;
    const int e = mine ? moe_expert_of(idx_in[base + a]) : -1;
    const float s = mine ? scores[(nb + a / K) * E + e] : 0.0f;
    int rank = 0;
    for (size_t t0 = 0; t0 < TK; t0 += MOE_TILE) {
        const size_t b = t0 + threadIdx.x;
        if (b < TK) {
            sh_e[threadIdx.x] = moe_expert_of(idx_in[base + b]);
            sh_s[threadIdx.x] = scores[(nb + b / K) * E + sh_e[threadIdx.x]];
        }
        __syncthreads();
        const int m = TK - t0 < MOE_TILE ? (int)(TK - t0) : MOE_TILE;
        for (int i = 0; mine && i < m; i++)
            rank += sh_e[i] == e && (sh_s[i] > s || (sh_s[i] == s && t0 + (size_t)i < a));
        __syncthreads();
    }
    if (mine && rank >= cap)
        idx[base + a] = -(e + 1);
}

/* ---- the dispatch order (counting sort) and the routing's counts ---------------- */

/* Chunk c = blockIdx.x of the NK assignments: cnt[c * (E+1) + e] = its
 * assignments to expert e, kept ones only (all = 0) or every one, with the
 * dropped ones also counted in cnt[c * (E+1) + E] (all = 1). */
__global__ void k_moe_count(int *cnt, const int32_t *idx, size_t NK, int E, int all)
{
    __shared__ int32_t sh[MOE_CHUNK];
    const size_t a0 = (size_t)blockIdx.x * MOE_CHUNK;
    const int m = NK - a0 < MOE_CHUNK ? (int)(NK - a0) : MOE_CHUNK;
    for (int i = threadIdx.x; i < m; i += blockDim.x)
        sh[i] = idx[a0 + i];
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        int c = 0;
        if (e < E && all)
            for (int i = 0; i < m; i++)
                c += moe_expert_of(sh[i]) == e;
        else if (e < E)
            for (int i = 0; i < m; i++)
                c += sh[i] == e;
        else if (all)
            for (int i = 0; i < m; i++)
                c += sh[i] < 0;
        cnt[(size_t)blockIdx.x * (E + 1) + e] = c;
    }
}

/* One block, after k_moe_count (all = 0) over nc chunks: offs[e] = the
 * kept assignments to experts below e (offs[E] = M), and each chunk count
 * cnt[c][e] becomes the place of chunk c's first assignment to e. */
__global__ void k_moe_offs(int32_t *offs, int *cnt, int nc, int E)
{
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int run = 0;
        for (int c = 0; c < nc; c++) {
            const int k = cnt[(size_t)c * (E + 1) + e];
            cnt[(size_t)c * (E + 1) + e] = run;
            run += k;
        }
        offs[e + 1] = run; /* the expert's total, until the scan below */
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        offs[0] = 0;
        for (int e = 0; e < E; e++)
            offs[e + 1] += offs[e];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        for (int c = 0; c < nc; c++)
            cnt[(size_t)c * (E + 1) + e] += offs[e];
}

/* Chunk c = blockIdx.x: expert e's assignments of the chunk, in order,
 * take the places cnt[c][e], cnt[c][e] + 1, ... (k_moe_offs); dropped
 * ones get where = -1. */
__global__ void k_moe_place(int32_t *perm, int32_t *where, const int32_t *idx, const int *cnt, size_t NK, int E)
{
    __shared__ int32_t sh[MOE_CHUNK];
    const size_t a0 = (size_t)blockIdx.x * MOE_CHUNK;
    const int m = NK - a0 < MOE_CHUNK ? (int)(NK - a0) : MOE_CHUNK;
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
        sh[i] = idx[a0 + i];
        if (sh[i] < 0)
            where[a0 + i] = -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int p = cnt[(size_t)blockIdx.x * (E + 1) + e];
        for (int i = 0; i < m; i++)
            if (sh[i] == e) {
                perm[p] = (int32_t)(a0 + i);
                where[a0 + i] = p++;
            }
    }
}

/* Sigmoid scores: rowsum[n] = sum over e in order of scores[n, e], in double. */
__global__ void k_moe_rowsum(double *rowsum, const float *scores, int N, int E)
{
    GRID_STRIDE (n, (size_t)N) {
        double r = 0.0;
        for (int e = 0; e < E; e++)
            r += scores[n * E + e];
        rowsum[n] = r;
    }
}

/* stats[E + e] = sum over tokens in order of p[n, e] (the score, or the
 * score over its token's rowsum), in double, rounded once. A thread per
 * expert (grid_for(E, THREADS) x THREADS). */
__global__ void k_moe_psum(float *stats, const float *scores, const double *rowsum, int N, int E)
{
    GRID_STRIDE (e, (size_t)E) {
        double p = 0.0;
        for (int n = 0; n < N; n++)
            p += rowsum ? scores[(size_t)n * E + e] / rowsum[n] : scores[(size_t)n * E + e];
        stats[E + e] = (float)p;
    }
}

/* One block, after k_moe_count (all = 1) over nc chunks: stats[e] = the
 * assignments to e, stats[2E + 1] = the dropped ones, and (thread 0)
 * stats[2E] = sum over tokens in order of lse^2, in double. */
__global__ void k_moe_stats_fold(float *stats, const int *cnt, int nc, const float *lse, int N, int E)
{
    for (int e = threadIdx.x; e <= E; e += blockDim.x) {
        long long t = 0;
        for (int c = 0; c < nc; c++)
            t += cnt[(size_t)c * (E + 1) + e];
        stats[e < E ? e : 2 * E + 1] = (float)t;
    }
    if (threadIdx.x == 0) {
        double z = 0.0;
        for (int n = 0; n < N; n++)
            z = moe_dadd(z, moe_dmul((double)lse[n], (double)lse[n]));
        stats[2 * E] = (float)z;
    }
}

/* ---- gather and combine ----------------------------------------------------------- */

/* xe[i, :] = x[perm[i] / K, :], i < M */
__global__ void k_moe_gather(float *xe, const float *x, const int32_t *perm, int M, int K, int C)
{
    GRID_STRIDE (i, (size_t)M * C) {
        const size_t r = i / (size_t)C, c = i % (size_t)C;
        xe[i] = x[(size_t)(perm[r] / K) * C + c];
    }
}

/* out[n, c] = sum over j in order of gate[n, j] ye[where[n, j], c] (from 0,
 * dropped ones skipped) */
__global__ void k_moe_combine_fwd(float *out, const float *ye, const float *gate, const int32_t *where, int N, int K,
                                  int C)
{
    GRID_STRIDE (i, (size_t)N * C) {
        const size_t n = i / (size_t)C, c = i % (size_t)C;
        float o = 0.0f;
        for (int j = 0; j < K; j++) {
            const int32_t w = where[n * K + j];
            if (w >= 0)
                o = moe_add(o, moe_mul(gate[n * K + j], ye[(size_t)w * C + c]));
        }
        out[i] = o;
    }
}

/* dye[where[a], c] = gate[a] dout[a / K, c] for the kept assignments a
 * (a thread per (a, c)); rows no assignment owns are left alone. */
__global__ void k_moe_combine_dye(float *dye, const float *dout, const float *gate, const int32_t *where, int NK, int K,
                                  int C)
{
    GRID_STRIDE (i, (size_t)NK * C) {
        const size_t a = i / (size_t)C, c = i % (size_t)C;
        const int32_t w = where[a];
        if (w >= 0)
            dye[(size_t)w * C + c] = gate[a] * dout[(a / K) * C + c];
    }
}

/* dgate[a] = dout[a / K, :] . ye[where[a], :] summed over c in order, 0
 * when dropped. */
__global__ void k_moe_combine_dgate(float *dgate, const float *dout, const float *ye, const int32_t *where, int NK,
                                    int K, int C)
{
    GRID_STRIDE (a, (size_t)NK) {
        const int32_t w = where[a];
        float dot = 0.0f;
        if (w >= 0) {
            const float *d = dout + (a / K) * C, *y = ye + (size_t)w * C;
            for (int c = 0; c < C; c++)
                dot = moe_add(dot, moe_mul(d[c], y[c]));
        }
        dgate[a] = dot;
    }
}

/* dx[n, c] (= from 0 | += by accum) dxe[where[n, j], c] for j in order. */
__global__ void k_moe_scatter_bwd(float *dx, const float *dxe, const int32_t *where, int N, int K, int C, int accum)
{
    GRID_STRIDE (i, (size_t)N * C) {
        const size_t n = i / (size_t)C, c = i % (size_t)C;
        float o = accum ? dx[i] : 0.0f;
        for (int j = 0; j < K; j++) {
            const int32_t w = where[n * K + j];
            if (w >= 0)
                o += dxe[(size_t)w * C + c];
        }
        dx[i] = o;
    }
}

/* ---- the router's backward ------------------------------------------------------------ */

/* Token n: dlogits[n, :] (see base/ops.h moe_route_bwd), the CPU's
 * route_token_bwd loop for loop; auxw NULL: no load-balancing term. */
__global__ void k_moe_route_bwd(float *dlogits, const float *dgate, const float *logits, const float *scores,
                                const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                                int sigmoid, int norm_topk)
{
    GRID_STRIDE (n, (size_t)N) {
        float *d = dlogits + n * E;
        const float *s = scores + n * E, *l = logits + n * E, *dg = dgate + n * K;
        const int32_t *id = idx + n * K;
        const float ls = lse[n];
        for (int e = 0; e < E; e++)
            d[e] = 0.0f;
        /* through the gates: gate_j = s_j (/ S, the chosen scores' sum) */
        float S = 0.0f, gdot = 0.0f;
        for (int j = 0; j < K; j++)
            S += s[moe_expert_of(id[j])];
        for (int j = 0; j < K; j++)
            gdot = moe_add(gdot, moe_mul(dg[j], s[moe_expert_of(id[j])] / S));
        for (int j = 0; j < K; j++)
            d[moe_expert_of(id[j])] += norm_topk ? (dg[j] - gdot) / S : dg[j];
        /* the load-balancing loss through p */
        if (auxw && !sigmoid) {
            for (int e = 0; e < E; e++)
                d[e] += auxw[e];
        } else if (auxw) {
            float sum = 0.0f, pw = 0.0f;
            for (int e = 0; e < E; e++)
                sum += s[e];
            for (int e = 0; e < E; e++)
                pw = moe_add(pw, moe_mul(auxw[e], s[e] / sum));
            for (int e = 0; e < E; e++)
                d[e] += (auxw[e] - pw) / sum;
        }
        /* scores to logits */
        if (sigmoid) {
            for (int e = 0; e < E; e++)
                d[e] = moe_mul(d[e], moe_mul(s[e], 1.0f - s[e]));
        } else {
            float dot = 0.0f;
            for (int e = 0; e < E; e++)
                dot = moe_add(dot, moe_mul(d[e], s[e]));
            for (int e = 0; e < E; e++)
                d[e] = moe_mul(s[e], d[e] - dot);
        }
        /* the z-loss: d lse^2 / d logit_e = 2 lse softmax_e */
        if (zw != 0.0f)
            for (int e = 0; e < E; e++)
                d[e] = moe_add(d[e], moe_mul(moe_mul(moe_mul(zw, 2.0f), ls), expf(l[e] - ls)));
    }
}

/* ---- the shared expert's gate (Qwen2-MoE) ------------------------------------------------ */

/* Token n: s[n] = sigmoid(s[n]) and out[n, :] = s[n] y[n, :]. */
__global__ void k_moe_shared_gate_fwd(float *out, float *s, const float *y, int N, int C)
{
    GRID_STRIDE (n, (size_t)N) {
        const float g = 1.0f / (1.0f + expf(-s[n]));
        s[n] = g;
        for (int c = 0; c < C; c++)
            out[n * C + c] = moe_mul(g, y[n * C + c]);
    }
}

/* Token n: dy[n, :] = s[n] dout[n, :] and dz[n] = s (1 - s) (dout . y),
 * the dot product over c in order (the CPU's). */
__global__ void k_moe_shared_gate_bwd(float *dy, float *dz, const float *dout, const float *y, const float *s, int N,
                                      int C)
{
    GRID_STRIDE (n, (size_t)N) {
        const float *d = dout + n * C, *yn = y + n * C;
        float *o = dy + n * C, dot = 0.0f;
        for (int c = 0; c < C; c++) {
            dot = moe_add(dot, moe_mul(d[c], yn[c]));
            o[c] = moe_mul(s[n], d[c]);
        }
        dz[n] = moe_mul(moe_mul(s[n], 1.0f - s[n]), dot);
    }
}

#endif
