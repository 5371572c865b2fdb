/* Token and position embeddings, on this rank's rows v0 .. v0 + Vl - 1 of
 * the token table (vocabulary-parallel): tokens outside them add nothing
 * here. k_embedding_fwd writes out = wte row (+ wpe row, of the token's
 * document position pos[n], or of n % T without pos), a thread per
 * element in a grid-stride loop (grid_for(N C, THREADS) blocks of THREADS
 * threads). The backward adds into dwte and dwpe (+=; ops_cuda.cu's
 * embedding_bwd zeroes them first unless accumulating): k_embedding_bwd_wpe
 * a thread per element of dwpe, grid-stride; dwte by the grouping below,
 * k_emb_keys grid-stride over the tokens, then cub's sort, run-length
 * encoding and scan (ops_cuda.cu's embedding_bwd_rows), then k_emb_rows one
 * block per distinct row (grid N, THREADS threads). With document
 * positions dwpe is grouped the same way, by position instead of token. */
#ifndef DTRAIN_CUDA_KERNELS_EMBEDDING_CUH
#define DTRAIN_CUDA_KERNELS_EMBEDDING_CUH

#include "cuda/kernels/common.cuh"

__global__ void k_embedding_fwd(float *out, const int32_t *tok, const int32_t *pos, const float *wte, const float *wpe,
                                int N, int T, int C, int v0, int Vl)
{
    size_t total = (size_t)N * C;
    GRID_STRIDE (i, total) {
        size_t n = i / (size_t)C, c = i % (size_t)C;
        int r = tok[n] - v0;
        int held = r >= 0 && r < Vl;
        float e = held ? wte[(size_t)r * C + c] : 0.0f;
        if (wpe) {
            float p = wpe[(pos ? (size_t)pos[n] : n % (size_t)T) * C + c];
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
    GRID_STRIDE (n, (size_t)N) {
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
    GRID_STRIDE (i, total) {
        size_t t = i / (size_t)C, c = i % (size_t)C;
        float a = dwpe[i];
        for (size_t n = t; n < (size_t)N; n += (size_t)T)
            a += dout[n * C + c];
        dwpe[i] = a;
    }
}

#endif
