/* The ops table: every numeric kernel the model needs, behind one struct of
 * function pointers. src/backend/ops_cpu.c implements it with cblas_sgemm and OpenMP;
 * cuda/ops_cuda.cu (--with-cuda) with cuBLASLt and CUDA kernels. Model code never loops over
 * elements itself.
 *
 * Conventions
 *  - All tensors are fp32, row-major, in the backend's memory, except the
 *    bf16 side of the casts, the bf16 GEMMs' operands and the "16" outputs
 *    below (uint16_t bit patterns, see base/bf16.h).
 *  - bf16 outputs (--dtype bf16): the ops whose result feeds a bf16 GEMM
 *    (the norms, GELU, SwiGLU, attention and, backward, the gradients at
 *    a GEMM's output) take an extra `uint16_t *X16` beside their fp32
 *    result X, of X's shape. NULL: not wanted. Otherwise the op also
 *    writes X16[i] = dt_f32_to_bf16(X[i]) of the fp32 value it computed
 *    (after any accumulation), bit for bit what cast_f32_to_bf16 of X
 *    would give, in the same pass, so no cast runs in front of the GEMM.
 *    Where the op's doc says so, X may then be NULL (only the bf16 copy
 *    wanted). X16 must not overlap any other argument.
 *  - N = B*T rows (tokens). C = model width. Weights are stored [out, in]
 *    (as nn.Linear), so every matmul is a GEMM with no transposed copy.
 *  - "accum" flags: 0 = overwrite the output, 1 = add into it. Parameter
 *    gradients are written on the first microbatch and accumulated after,
 *    so nothing is zeroed before backward.
 *  - Attention inputs are a fused qkv row per token:
 *      qkv[N, (NH + 2*NKV) * HS] = [ q heads (NH*HS) | k heads (NKV*HS) | v heads (NKV*HS) ]
 *    Query head h uses KV head h / (NH / NKV) (grouped-query attention).
 *  - Ops are called from one host thread (a backend keeps workspace and
 *    streams between calls); they may use threads of their own inside.
 *  - Preconditions the ops do not check (the model and loader guarantee
 *    them): NH % NKV == 0; token ids < V; targets < V or < 0 (ignored).
 *  - Document positions (--doc-mask, src/model/docmask.h): pos[B*T] int32 in
 *    the backend's memory gives each token's position within its
 *    document, which starts at pos = 0 and counts up by one to the next
 *    document's start: pos[bT] = 0 and pos[bT+t] is 0 or pos[bT+t-1] + 1.
 *    Token t's document thus starts at t - pos[bT+t]. RoPE, the position
 *    embedding and attention's mask read it; NULL means one document per
 *    row (pos = n % T), and then the ops give exactly the bits they gave
 *    before documents existed.
 */
#ifndef DTRAIN_OPS_H
#define DTRAIN_OPS_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* One block of ring attention (context parallelism, issue 34): the query
 * rows [q0, q0 + nq) of a local block of Tq rows per sequence against the
 * key rows [k0, k0 + nk) of a K,V block of Tk rows per sequence (held
 * locally or received from another rank), for the B sequences of a batch.
 * mpi/cp_sched.h gives the rows of each ring step. */
typedef struct att_block {
    int B, NH, NKV, HS;
    int Tq, q0, nq; /* query rows per sequence; those computed */
    int Tk, k0, nk; /* key rows per sequence; those used */
    int causal;     /* 1: key global position <= query's; 0: every pair (the
                     * schedule guarantees keys precede queries) */
} att_block_t;

typedef struct ops {
    const char *name; /* "cpu", "cuda" */
    /* 1: alloc's memory is host memory, which the host may read in place
     * once sync has returned (the CPU tables); 0: only to_host reaches it
     * (CUDA). The checkpoint writer reads live state in place when 1. */
    int host_readable;
    /* The backend's state (its workspace, handles, streams, queue): every
     * method takes it first, called as ops->f(ops->ctx, ...). */
    void *ctx;
    /* Ends the backend: waits for what is pending and frees ctx and the
     * table with it (ops_release). */
    void (*release)(void *ctx);

    /* Ops may run asynchronously (CUDA enqueues them on a stream): sync
     * returns once every op issued so far has finished. Host code that
     * reads or writes backend memory other than through this table (an MPI
     * communicator on a device buffer) calls it first; to_host, sumsq and
     * free wait on their own, and from_host may reuse its source at once. */
    void (*sync)(void *ctx);

    /* Memory in the backend's address space. alloc returns 64-byte aligned
     * memory, zeroed, or NULL. to_host/from_host copy between host and
     * backend. */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*free)(void *ctx, void *p);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes);
    void (*to_host)(void *ctx, void *host_dst, const void *src, size_t bytes);
    void (*from_host)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*zero)(void *ctx, void *dst, size_t bytes);
    /* Host memory that to_host fills fastest (CUDA: pinned, so the copy
     * is one DMA), freed with host_free; 64-byte aligned, or NULL. NULL
     * members (the CPU): plain host memory serves. Checkpoint copies. */
    void *(*host_alloc)(void *ctx, size_t bytes);
    void (*host_free)(void *ctx, void *p);
    /* A copy into host_alloc's memory that runs after every op issued
     * before it and beside the ops issued after it (CUDA: on a side stream
     * waiting on an event of the compute stream), and the wait for every
     * such copy begun: once to_host_end returns, the host memory holds the
     * data, and ops issued after it may change the source. NULL members
     * (the CPU): none; to_host serves. --ckpt-async's overlapped copy. */
    void (*to_host_begin)(void *ctx, void *host_dst, const void *src, size_t bytes);
    void (*to_host_end)(void *ctx);
    /* The other way: a copy from host_alloc's memory that runs after
     * every op issued before it (CUDA: on the side stream, behind an event
     * of the compute stream) and before every op issued after
     * from_host_end, which makes the compute stream wait for the copies
     * begun, without the host waiting. The source stays unchanged until a
     * later to_host_end or sync returns. NULL members (the CPU): none;
     * from_host serves. --offload's weights up after the host AdamW. */
    void (*from_host_begin)(void *ctx, void *dst, const void *host_src, size_t bytes);
    void (*from_host_end)(void *ctx);
    /* Graphs (--cuda-graphs; ops_graph_create in src/backend/ops_cpu.h
     * drives them): graph_begin starts recording the compute stream, so
     * that the ops issued until graph_end are captured, not run; graph_end
     * returns the captured work made executable, or NULL when the capture
     * failed (nothing then ran, and nothing is left recording).
     * graph_launch runs one after the ops issued so far, graph_free ends
     * one. A graph holds the pointers its ops were given, the table's own
     * workspace among them: graph_epoch counts the moves of that
     * workspace (a buffer grown to a new address), and a graph captured
     * at another epoch may not be launched. NULL members (the CPU): no
     * graphs. */
    void (*graph_begin)(void *ctx);
    void *(*graph_end)(void *ctx);
    void (*graph_launch)(void *ctx, void *graph);
    void (*graph_free)(void *ctx, void *graph);
    unsigned long (*graph_epoch)(void *ctx);

    /* out[N,OC] = in[N,IC] . w[OC,IC]^T (+ b[OC] when b != NULL) */
    void (*matmul_fwd)(void *ctx, float *out, const float *in, const float *w, const float *b, int N, int IC, int OC);
    /* din[N,IC]  (=|+= by accum_din) dout[N,OC] . w[OC,IC]
     * dw[OC,IC]  (=|+= by accum_dw)  dout^T . in
     * db[OC]     (=|+= by accum_dw)  sum over rows of dout
     * Any of din, dw, db may be NULL (not wanted). With OC = 0 din is an
     * empty sum: zeros, or unchanged when accumulating. */
    void (*matmul_bwd)(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                       int N, int IC, int OC, int accum_din, int accum_dw);

    /* The same GEMMs with bf16 operands (--dtype bf16): in, w and dout16 are
     * bf16 bit patterns (uint16_t); products are exact in fp32 and summed in
     * fp32; out, din, dw, db and the bias b are fp32. db is the row sum of
     * dout: on the CPU of the fp32 dout; on CUDA, where cuBLASLt's BGRADB
     * epilogue forms it inside the dw GEMM, of the bf16 dout16 the GEMM
     * reads (within 2^-8 sum|dout| per element of the fp32 sum; the fp32
     * dout where no epilogue algorithm exists). Otherwise the backends
     * agree up to fp32 summation order: the CPU widens the bf16 operands
     * to fp32 (exact) and calls cblas_sgemm; CUDA runs cuBLASLt with bf16
     * A/B, fp32 C/D and CUBLAS_COMPUTE_32F. */
    void (*matmul_fwd_bf16)(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b, int N, int IC,
                            int OC);
    void (*matmul_bwd_bf16)(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                            const uint16_t *in, const uint16_t *w, int N, int IC, int OC, int accum_din, int accum_dw);

    /* GPT-2's MLP GEMMs fused with the GELU next to them, so that CUDA can
     * run each as one cuBLASLt GEMM with a GELU epilogue instead of a GEMM
     * and a pass over the [N, 4C] activations. The CPU backend composes
     * the ops above, so its results are those of the separate calls, bit
     * for bit. CUDA's epilogue evaluates the same tanh GELU with its own
     * tanh and rounding (the self-test holds it to 1e-3 of the largest
     * value; cuBLASLt documents no tighter bound), and falls back to the
     * separate kernels where cuBLASLt has no such kernel (OC or IC not a
     * multiple of 8, or the heuristic declines).
     *
     * matmul_gelu_fwd: pre[N,OC] = in[N,IC] . w[OC,IC]^T (+ b), the GELU
     * input backward keeps, and out[N,OC] = gelu(pre): matmul_fwd then
     * gelu_fwd. */
    void (*matmul_gelu_fwd)(void *ctx, float *out, float *pre, const float *in, const float *w, const float *b, int N,
                            int IC, int OC);
    /* ... and out16 (may be NULL) the bf16 of gelu(pre), the next GEMM's
     * input; out may be NULL when out16 is not. */
    void (*matmul_gelu_fwd_bf16)(void *ctx, float *out, uint16_t *out16, float *pre, const uint16_t *in,
                                 const uint16_t *w, const float *b, int N, int IC, int OC);
    /* The backward of a matmul whose input was gelu(pre): matmul_bwd with
     * din[N,IC] = gelu'(pre[N,IC]) o (dout . w), the gradient at the GELU's
     * input (written, never accumulated), then dw and db as matmul_bwd.
     * din must not overlap dout, in or pre; din, dw and db may each be
     * NULL (not wanted), as in matmul_bwd. */
    void (*matmul_dgelu_bwd)(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in,
                             const float *pre, const float *w, int N, int IC, int OC, int accum_dw);
    /* ... with din16[N,IC] (may be NULL; only with din) the bf16 of din,
     * the fc GEMM's output gradient next; it must not overlap dout16. */
    void (*matmul_dgelu_bwd_bf16)(void *ctx, float *din, uint16_t *din16, float *dw, float *db,
                                  const uint16_t *dout16, const float *dout, const uint16_t *in, const float *pre,
                                  const uint16_t *w, int N, int IC, int OC, int accum_dw);

    /* Grouped GEMMs (the mixture of experts' experts): G groups of rows
     * with a weight each, all in one call. Group g is the rows [offs[g],
     * offs[g+1]) of in, out, dout and din (m_g = offs[g+1] - offs[g] rows,
     * possibly 0), its weight w + g*OC*IC ([OC,IC]) and its bias b + g*OC.
     * offs is a HOST array of G+1 int32, offs[0] = 0, non-decreasing, read
     * during the call (the caller may change it at once: a backend that
     * defers the op copies it). Each group's result is the dense op's on
     * its rows:
     *
     * gmm_fwd: out[rows of g] = in[rows of g] . w_g^T (+ b_g when b != NULL):
     * matmul_fwd per group. */
    void (*gmm_fwd)(void *ctx, float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G,
                    int IC, int OC);
    /* gmm_bwd: per group, matmul_bwd's din (=|+= by accum_din), dw_g
     * [OC,IC] and db_g [OC] (=|+= by accum_dw; a group of 0 rows gives
     * zeros, or leaves them when accumulating), each of din, dw, db NULL
     * when not wanted. With pre != NULL (accum_din must be 0) din is
     * matmul_dgelu_bwd's: gelu'(pre) o (dout . w_g), the gradient at the
     * GELU before a GPT-2 expert's proj, pre [rows, IC] the GELU input. */
    void (*gmm_bwd)(void *ctx, float *din, float *dw, float *db, const float *dout, const float *in, const float *pre,
                    const float *w, const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw);
    /* The same with bf16 operands, as matmul_fwd_bf16 / matmul_bwd_bf16
     * (in, w and dout16 bf16; db the fp32 dout's row sums). */
    void (*gmm_fwd_bf16)(void *ctx, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                         const int32_t *offs, int G, int IC, int OC);
    void (*gmm_bwd_bf16)(void *ctx, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                         const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                         int OC, int accum_din, int accum_dw);

    /* LayerNorm over the last dim: out = (x - mean) * rstd * w + b.
     * mean[N], rstd[N] are saved for backward. out16[N,C]: the bf16 of
     * out (NULL: not wanted); out may be NULL when out16 is not. */
    void (*layernorm_fwd)(void *ctx, float *out, uint16_t *out16, float *mean, float *rstd, const float *x,
                          const float *w, const float *b, int N, int C, float eps);
    /* din[N,C] += d/dx (always accumulates: it adds into the residual
     * gradient); dw[C], db[C] (=|+= by accum_dw). din16[N,C] (NULL: not
     * wanted) the bf16 of din after the addition: the residual gradient
     * the next matmul backward takes as its output gradient. */
    void (*layernorm_bwd)(void *ctx, float *din, uint16_t *din16, float *dw, float *db, const float *dout,
                          const float *x, const float *w, const float *mean, const float *rstd, int N, int C,
                          int accum_dw);
    /* RMSNorm: out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps); out16
     * as layernorm_fwd's. */
    void (*rmsnorm_fwd)(void *ctx, float *out, uint16_t *out16, float *rstd, const float *x, const float *w, int N,
                        int C, float eps);
    /* din[N,C] += d/dx (always accumulates); dw[C] (=|+= by accum_dw);
     * din16 as layernorm_bwd's. */
    void (*rmsnorm_bwd)(void *ctx, float *din, uint16_t *din16, float *dw, const float *dout, const float *x,
                        const float *w, const float *rstd, int N, int C, int accum_dw);

    /* Rotary position embedding, in place on the q and k parts of qkv
     * (v untouched). Pairs are (2i, 2i+1) within a head (the interleaved
     * "GPT-J / Meta Llama" convention); position of row n is pos[n], or
     * n % T when pos is NULL (see "Document positions" below);
     * angle = position * inv_freq[i], inv_freq[HS/2] in the backend's
     * memory (the model's table, theta and any scaling applied:
     * model_rope_inv_freq). rope_bwd applies the inverse rotation to the
     * gradient, in place, and with dqkv16 != NULL writes its bf16
     * (dqkv16[N, (NH+2NKV)*HS], v columns included), the qkv GEMM's output
     * gradient. */
    void (*rope_fwd)(void *ctx, float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS,
                     const float *inv_freq);
    void (*rope_bwd)(void *ctx, float *dqkv, uint16_t *dqkv16, const int32_t *pos, int B, int T, int NH, int NKV,
                     int HS, const float *inv_freq);

    /* Per-head RMSNorm of q and k (Qwen3's q_norm and k_norm), in place on
     * the q and k heads of qkv[N, (NH+2NKV)*HS] (v untouched): each head's
     * HS values x become x * rstd * w with w = wq[HS] for the NH q heads
     * and wk[HS] for the NKV k heads (one weight shared by all heads),
     * rstd = 1/sqrt(mean(x^2) + eps), RMSNorm's formulas. The heads as
     * they came in are saved in xin[N, (NH+NKV)*HS] and their rstd in
     * rstd[N, NH+NKV], for backward. */
    void (*qknorm_fwd)(void *ctx, float *qkv, float *xin, float *rstd, const float *wq, const float *wk, int N, int NH,
                       int NKV, int HS, float eps);
    /* In place on the q and k heads of dqkv (v untouched): dL/d(norm
     * output) becomes dL/d(norm input) (written, not accumulated);
     * dwq[HS], dwk[HS] (=|+= by accum_dw) summed over rows and heads in a
     * fixed order. */
    void (*qknorm_bwd)(void *ctx, float *dqkv, float *dwq, float *dwk, const float *xin, const float *wq,
                       const float *wk, const float *rstd, int N, int NH, int NKV, int HS, int accum_dw);

    /* Causal self-attention, scale 1/sqrt(HS), flash-attention style: the
     * T x T probabilities are never stored. out[N, NH*HS]; lse[B,NH,T]
     * receives each query row's log-sum-exp of its scaled scores (natural
     * log; row t of head h of batch row b at lse[(b*NH + h)*T + t]), the
     * one thing backward keeps besides qkv. pos NULL: query t sees keys
     * 0..t of its row. pos[B*T] (document masking): query t sees keys
     * t - pos[bT+t] .. t, those of its own document; tiles with no such
     * pair are skipped, not computed and masked. out16[N, NH*HS] (NULL:
     * not wanted) the bf16 of out, the output projection's input; out is
     * always written (the backward reads it). */
    void (*attention_fwd)(void *ctx, float *out, uint16_t *out16, float *lse, const float *qkv, const int32_t *pos,
                          int B, int T, int NH, int NKV, int HS);
    /* dqkv[N,(NH+2NKV)*HS] is written (not accumulated). The probabilities
     * are recomputed blockwise from qkv and lse: P = exp(scale q.k - lse).
     * out is the forward's output, for D = rowsum(dout o out) (which equals
     * rowsum(dP o P)); pos as in the forward. dqkv16 (NULL: not wanted)
     * receives the bf16 of dqkv, the qkv GEMM's output gradient. */
    void (*attention_bwd)(void *ctx, float *dqkv, uint16_t *dqkv16, const float *dout, const float *qkv,
                          const float *out, const float *lse, const int32_t *pos, int B, int T, int NH, int NKV,
                          int HS);

    /* Ring attention's building blocks (context parallelism, issue 34;
     * see att_block_t): attention of some query rows against a K,V block
     * given apart from the queries, partial results merged by their
     * log-sum-exp, and the matching backward. Scale 1/sqrt(HS) as above;
     * softmax over the union of the blocks equals attention_fwd over the
     * whole sequence, within fp32 rounding (test/test_ring_attn.c).
     *
     * Shapes (a sequence's rows, then the next sequence's):
     *   qkv[B*Tq, (NH+2NKV)*HS]  the queries' fused rows; only the q heads are read
     *   kv[B*Tk, 2*NKV*HS]       [k heads (NKV*HS) | v heads (NKV*HS)] per row:
     *                            the KV heads only, the block that travels in
     *                            the ring; query head h uses KV head h/(NH/NKV)
     *   out[B*Tq, NH*HS], lse[B, NH, Tq] (row t of head h of sequence b at
     *                            lse[(b*NH + h)*Tq + t], natural log)
     *   qpos[Tq], kpos[Tk]       int32 global positions (0..T-1 within the
     *                            whole sequence) of the rows, the same for
     *                            every sequence; kpos increases along
     *                            [k0, k0+nk) (the zigzag layout's do)
     *   qdoc[B*Tq] or NULL       int32 global position where each query's
     *                            document starts (global t - pos[t] of the
     *                            docmask positions); NULL: one document.
     * The keys of query row t are those with qdoc[t] <= kpos <= qpos[t]
     * (no upper bound when !causal): a contiguous run of the block, found
     * from kpos; query tiles with no such key are skipped. All pointers are
     * in the backend's memory.
     *
     * attention_block_fwd: for the rows [q0, q0+nq) of every sequence and
     * head, out = softmax(scale q.k) v and lse = log-sum-exp of the scaled
     * scores, both over this block's keys only (written; other rows
     * untouched). A row with no valid key gets lse = -inf and out = 0. */
    void (*attention_block_fwd)(void *ctx, float *out, float *lse, const float *qkv, const float *kv,
                                const int32_t *qpos, const int32_t *kpos, const int32_t *qdoc,
                                const att_block_t *blk);
    /* Folds a partial result (pout, plse: attention_block_fwd's, laid out
     * as out and lse) into the running one (out, lse) for the rows [q0,
     * q0+nq) of every sequence and head (blk's B, NH, HS, Tq, q0, nq; the
     * rest unused): l = max + log1p(exp(min - max)) of the two lse,
     * out = exp(lse - l) out + exp(plse - l) pout, lse = l (dt_lse_merge,
     * base/ops_math.h). Two -inf stay -inf with out unchanged. Called in
     * a fixed order (the ring's steps), so the result is deterministic. */
    void (*attention_merge)(void *ctx, float *out, float *lse, const float *pout, const float *plse,
                            const att_block_t *blk);
    /* The backward of one block, given the FINAL out and lse of the query
     * rows (all blocks merged) and dout[B*Tq, NH*HS]: P = exp(scale q.k -
     * lse) on the block's valid keys, D = rowsum(dout o out),
     * dS = P o (dout.v - D), and for the rows [q0, q0+nq) and keys
     * [k0, k0+nk)
     *   dq  += scale dS k   into the q heads of dqkv[B*Tq, (NH+2NKV)*HS]
     *                       (its k and v columns untouched)
     *   dk  += scale dS^T q, dv += P^T dout   into dkv[B*Tk, 2*NKV*HS]
     *                       (kv's layout: the buffer that travels with K,V)
     * accumulated, never written, so the ring sums every block's share. */
    void (*attention_block_bwd)(void *ctx, float *dqkv, float *dkv, const float *dout, const float *qkv,
                                const float *kv, const float *out, const float *lse, const int32_t *qpos,
                                const int32_t *kpos, const int32_t *qdoc, const att_block_t *blk);
    /* The travelling block's layout from the fused rows and back, so the
     * ring (mpi/cp_ring.h) needs no host copies. N rows (B*Tq):
     *   kv[N, 2*NKV*HS] = the k and v columns of qkv[N, (NH+2NKV)*HS]
     *   dqkv[n, NH*HS ..] = dkv[n, ..] (accum 0) or += dkv[n, ..] (accum 1):
     *       a block's dk and dv into dqkv's k and v columns; its q columns
     *       untouched. */
    void (*attention_kv_pack)(void *ctx, float *kv, const float *qkv, int N, int NH, int NKV, int HS);
    void (*attention_kv_unpack)(void *ctx, float *dqkv, const float *dkv, int N, int NH, int NKV, int HS, int accum);

    /* GELU, tanh approximation (GPT-2). out/din are written; out16[n] the
     * bf16 of out (NULL: not wanted), out may be NULL when out16 is not. */
    void (*gelu_fwd)(void *ctx, float *out, uint16_t *out16, const float *x, size_t n);
    void (*gelu_bwd)(void *ctx, float *dx, const float *x, const float *dout, size_t n);
    /* SwiGLU: gu[N, 2F] = [gate (F) | up (F)] per row; out[N,F] = silu(gate) * up.
     * dgu[N,2F] is written. out16[N,F] / dgu16[N,2F]: the bf16 of out / dgu
     * (NULL: not wanted); out may be NULL when out16 is not. */
    void (*swiglu_fwd)(void *ctx, float *out, uint16_t *out16, const float *gu, int N, int F);
    void (*swiglu_bwd)(void *ctx, float *dgu, uint16_t *dgu16, const float *gu, const float *dout, int N, int F);

    /* out[n] = a[n] + b[n] (out may alias a or b) */
    void (*add)(void *ctx, float *out, const float *a, const float *b, size_t n);

    /* Vocabulary-parallel embedding: this rank holds rows [v0, v0+Vl) of the
     * token embedding in wte[Vl, C].
     * out[N,C] = wte[tok[n] - v0, :] for tokens held, else 0
     *            (+ wpe[p(n), :] when wpe != NULL)
     * where p(n) = pos[n], or n % T when pos is NULL. */
    void (*embedding_fwd)(void *ctx, float *out, const int32_t *tok, const int32_t *pos, const float *wte,
                          const float *wpe, int N, int T, int C, int v0, int Vl);
    /* dwte[tok[n] - v0, :] += dout[n, :] for tokens held; dwpe[p(n), :] +=
     * dout[n, :]. With accum = 0 all Vl rows of dwte and the first T rows of
     * dwpe are first set to zero (rows of dwpe beyond T are the caller's).
     * dwpe may be NULL. Deterministic: no atomics, no order dependence. */
    void (*embedding_bwd)(void *ctx, float *dwte, float *dwpe, const float *dout, const int32_t *tok,
                          const int32_t *pos, int N, int T, int C, int v0, int Vl, int accum);

    /* Softmax cross-entropy over a vocabulary split across a group: this
     * rank holds logical columns [v0, v0+Vl) as the first Vl columns of
     * logits[N, ld]; columns Vl..ld-1 are padding and never reach the loss
     * or the gradient (so a padded vocabulary cannot leak probability mass).
     * Three passes, with a group reduction after each of the first two:
     *   xent_max     rowmax[N]                               -> allreduce MAX
     *   xent_sumexp  stats[N,2] = {sum exp(x - rowmax),
     *                              target logit if held else 0} -> allreduce SUM
     *   xent_finish  losses[N] = -log softmax(x)[target]
     * Rows with target < 0 are ignored (loss 0, gradient 0). With expbuf !=
     * NULL (may alias logits) pass 2 keeps the exps there and pass 3 turns
     * them into dlogits = dloss * (softmax - onehot), padding columns 0;
     * pass dlogits == NULL to xent_finish for losses only. dlogits16
     * (NULL: not wanted; only with dlogits) receives the bf16 of dlogits
     * [N, ld], the head GEMM's output gradient, padding columns 0. */
    void (*xent_max)(void *ctx, float *rowmax, const float *logits, int N, int Vl, int ld);
    void (*xent_sumexp)(void *ctx, float *stats, float *expbuf, const float *logits, const float *rowmax,
                        const int32_t *targets, int v0, int N, int Vl, int ld);
    void (*xent_finish)(void *ctx, float *losses, float *dlogits, uint16_t *dlogits16, const float *rowmax,
                        const float *stats, const int32_t *targets, int v0, int N, int Vl, int ld, float dloss);

    /* AdamW on n contiguous parameters. g is multiplied by grad_scale first
     * (clipping and averaging). Bias-corrected with step t >= 1; decoupled
     * weight decay: p -= lr * wd * p. p is the fp32 master copy; when p16
     * is not NULL the same pass also writes p16[i] = dt_f32_to_bf16(p[i])
     * of the updated value (the bf16 weights of --dtype bf16), bit for bit
     * what cast_f32_to_bf16 of p would give. */
    void (*adamw)(void *ctx, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, float lr,
                  float beta1, float beta2, float eps, float wd, float grad_scale, int t);

    /* Sums of squares of count vectors: out[i] = sum over x[i][0..n[i]) of
     * squares, float over runs of 32 folded into double (relative error
     * ~1e-7), the same bits for any thread count and whether a vector is
     * asked for alone or among others. x and n are host arrays (of backend
     * pointers and lengths), out is host memory: one wait for all of them,
     * where the gradient norm's ~200 tensors would otherwise wait ~200
     * times a step. */
    void (*sumsq)(void *ctx, double *out, const float *const *x, const size_t *n, int count);
    /* x[i] *= s */
    void (*scale)(void *ctx, float *x, float s, size_t n);

    /* Mixture-of-experts routing (issue 33). N tokens, E experts, each
     * token to K of them; the router runs in fp32 whatever --dtype.
     * An assignment (n, j) is token n's j-th chosen expert: idx[n*K + j]
     * is that expert e in [0, E) when kept, -(e+1) when capacity dropped
     * it. Deterministic: no atomics, every sum in a fixed order, the same
     * bits for any thread count.
     *
     * moe_route_fwd: from logits[N,E] (= ln2 . router^T), per token
     *   lse[n]       = logsumexp(logits[n, :])  (the z-loss's)
     *   scores[n,e]  = softmax(logits[n])[e]    (sigmoid = 0)
     *                  1 / (1 + exp(-logits[n,e])) (sigmoid = 1)
     *   idx[n,0..K)  = the K highest of scores[n,e] + bias[e], highest
     *                  first, the lower expert first on a tie (bias: [E],
     *                  DeepSeek's expert bias, which selects and does not
     *                  weigh; NULL = none)
     *   gate[n,j]    = scores[n, idx[n,j]], divided by their sum over the
     *                  K when norm_topk.
     * capacity > 0 then caps each expert at `capacity` assignments per
     * sequence (rows [b*T, (b+1)*T) of the N = B*T tokens): of an
     * expert's assignments in a sequence, those with the lowest scores
     * are dropped (on a tie the later token, then the later j), so what
     * is dropped depends on the sequence alone, never on the batch or
     * layout. */
    void (*moe_route_fwd)(void *ctx, float *scores, float *lse, int32_t *idx, float *gate, const float *logits,
                          const float *bias, int N, int T, int E, int K, int sigmoid, int norm_topk, int capacity);
    /* The dispatch order: the M kept assignments sorted by expert, then
     * token, then j. perm[0..M) holds n*K + j of each in that order,
     * offs[E+1] each expert's first place in it (offs[E] = M), and
     * where[n*K + j] its place, or -1 when dropped. */
    void (*moe_plan)(void *ctx, int32_t *perm, int32_t *offs, int32_t *where, const int32_t *idx, int N, int E, int K);
    /* Reductions of one routing for the losses and the step line:
     * stats[e]       = assignments to expert e, dropped or kept (f_e's count)
     * stats[E + e]   = sum over tokens of p[n,e], p = the scores (softmax)
     *                  or the scores over their sum (sigmoid; DeepSeek's
     *                  normalised affinities)
     * stats[2E]      = sum over tokens of lse[n]^2
     * stats[2E + 1]  = dropped assignments. */
    void (*moe_stats)(void *ctx, float *stats, const int32_t *idx, const float *scores, const float *lse, int N, int E,
                      int K, int sigmoid);
    /* xe[i, :] = x[perm[i] / K, :] for i < M: each expert's tokens, in a row. */
    void (*moe_gather)(void *ctx, float *xe, const float *x, const int32_t *perm, int M, int K, int C);
    /* out[n, :] = sum over j = 0..K-1 of gate[n,j] * ye[where[n*K+j], :]
     * (dropped assignments skipped; written, in order of j). */
    void (*moe_combine_fwd)(void *ctx, float *out, const float *ye, const float *gate, const int32_t *where, int N,
                            int K, int C);
    /* The combine's backward: dye[where[n*K+j], :] = gate[n,j] * dout[n, :]
     * and dgate[n,j] = dout[n, :] . ye[where[n*K+j], :] (0 when dropped). */
    void (*moe_combine_bwd)(void *ctx, float *dye, float *dgate, const float *dout, const float *ye, const float *gate,
                            const int32_t *where, int N, int K, int C);
    /* The gather's backward: dx[n, :] (=|+= by accum) sum over j in order
     * of dxe[where[n*K+j], :]. */
    void (*moe_scatter_bwd)(void *ctx, float *dx, const float *dxe, const int32_t *where, int N, int K, int C,
                            int accum);
    /* dlogits[N,E] (written): the gradient at the router's logits of
     *   sum_{n,j} dgate[n,j] gate[n,j]                (through the combine)
     *   + sum_e auxw[e] * sum_n p[n,e]                 (the load-balancing loss,
     *       auxw[e] = its coefficient x E x f_e / N, f_e fixed)
     *   + zw * sum_n lse[n]^2                          (the z-loss, zw = its
     *       coefficient / N)
     * with p as moe_stats's, gate as moe_route_fwd's (renormalised over
     * all K chosen when norm_topk, dropped ones included). */
    void (*moe_route_bwd)(void *ctx, float *dlogits, const float *dgate, const float *logits, const float *scores,
                          const float *lse, const int32_t *idx, const float *auxw, float zw, int N, int E, int K,
                          int sigmoid, int norm_topk);
    /* The shared expert's gate (Qwen2-MoE's shared_expert_gate), per token:
     * s[N] holds the gate's logits x . w_gate on entry and their sigmoids
     * on return; out[n, :] = s[n] * y[n, :] (written; out may be y). */
    void (*moe_shared_gate_fwd)(void *ctx, float *out, float *s, const float *y, int N, int C);
    /* Its backward: dy[n, :] = s[n] * dout[n, :] (written) and dz[n] =
     * s[n] (1 - s[n]) (dout[n, :] . y[n, :]) (written), the gradient at the
     * logit (a partial sum where y is one TP rank's partial output). */
    void (*moe_shared_gate_bwd)(void *ctx, float *dy, float *dz, const float *dout, const float *y, const float *s,
                                int N, int C);

    /* bf16 casts, elementwise over n elements; bf16 is stored as its 16-bit
     * pattern (uint16_t, 2 bytes per element), fp32 as float (4 bytes).
     * f32 -> bf16 rounds to nearest even (overflow to +-Inf, NaN stays a
     * quiet NaN); bf16 -> f32 is exact. Same bits on every backend: both use
     * dt_f32_to_bf16 / dt_bf16_to_f32 from base/bf16.h. --dtype bf16 casts
     * the weights (params16, when no AdamW wrote them) and the GEMM
     * operands no producer wrote in bf16 (the "16" outputs above) with
     * cast_f32_to_bf16. out must not overlap in. */
    void (*cast_f32_to_bf16)(void *ctx, uint16_t *out, const float *in, size_t n);
    void (*cast_bf16_to_f32)(void *ctx, float *out, const uint16_t *in, size_t n);
} ops_t;

/* Ends a backend made by a backend's constructor (src/backend/ops_cpu.h,
 * cuda/ops_cuda.h); NULL is a no-op. */
static inline void ops_release(const ops_t *ops)
{
    if (ops && ops->release)
        ops->release(ops->ctx);
}

/* Host memory that ops->to_host fills fastest: the backend's host_alloc
 * where it has one (CUDA: pinned), else 64-byte aligned malloc; NULL for 0
 * bytes or out of memory. Freed with ops_host_free on the same ops. */
static inline void *ops_host_alloc(const ops_t *ops, size_t bytes)
{
    if (bytes == 0)
        return NULL;
    if (ops && ops->host_alloc)
        return ops->host_alloc(ops->ctx, bytes);
    void *p = NULL;
    return posix_memalign(&p, 64, bytes) == 0 ? p : NULL;
}

static inline void ops_host_free(const ops_t *ops, void *p)
{
    if (p && ops && ops->host_free)
        ops->host_free(ops->ctx, p);
    else
        free(p);
}

#endif
