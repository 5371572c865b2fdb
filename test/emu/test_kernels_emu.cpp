/* ops_cuda.cu's row, reduction, attention, embedding and cross-entropy
 * kernels run on the host against the CPU ops table.
 *
 * The kernels are the CUDA backend's own: this file includes their headers
 * (cuda/kernels/), as cuda/ops_cuda.cu does, after defining the CUDA
 * dialect they are written in. They run under a thread-block
 * emulation: every CUDA thread of a block is a std::thread, __syncthreads
 * a barrier over the block, __shfl_xor_sync an exchange through a per-warp
 * buffer between two per-warp barriers; blocks run one after another
 * (__shared__ is static). Kernels that never synchronise run their threads
 * one after another on the calling thread (a __syncthreads there aborts).
 * The launches mirror the host wrappers' grids (attention_fwd/bwd, the
 * norms' chunked column reductions, embedding_bwd with std::stable_sort,
 * run-length encoding and a scan in place of cub, sumsq's partial fold);
 * a launch configuration CUDA would refuse aborts.
 *
 * Results are compared with src/backend/ops_cpu.c's: attention, norms and the
 * cross-entropy to 1e-5 of the largest magnitude (summation order
 * differs), the embedding bit for bit, sumsq to 1e-6 relative. The shapes
 * cover partial tiles, GQA, head sizes over 64 and not a multiple of 4,
 * padding columns (ld > Vl), tokens and targets outside this rank's range,
 * and N > COL_ROWS rows (chunked column reductions). The bf16 outputs
 * (base/ops.h: the norms, GELU, SwiGLU, RoPE's gradient, attention,
 * cross-entropy's dlogits) must be, bit for bit, the rounding of the fp32
 * values the kernel wrote beside them (check16), and the same when the
 * fp32 output is not asked for.
 *
 * Output: one line per failed check, a summary. Exit 0 when all pass. */
extern "C" {
#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"
}

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits.h>
#include <math.h>
#include <mutex>
#include <random>
#include <stdint.h>
#include <thread>
#include <vector>

/* ---- the CUDA dialect on the host ---- */
#define __global__
#define __device__
#define __host__
#define __launch_bounds__(x)
#define __shared__ static

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
static thread_local dim3 threadIdx, blockIdx;
static dim3 gridDim, blockDim;
using std::max;
using std::min;

struct Barrier {
    std::mutex m;
    std::condition_variable cv;
    unsigned n, count = 0, gen = 0;
    explicit Barrier(unsigned n_) : n(n_) {}
    void wait()
    {
        std::unique_lock<std::mutex> l(m);
        unsigned g0 = gen;
        if (++count == n) {
            count = 0;
            gen++;
            cv.notify_all();
        } else {
            cv.wait(l, [&] { return gen != g0; });
        }
    }
};
static Barrier *block_bar;
static Barrier *warp_bar[32];
alignas(8) static unsigned char shfl_buf[1024][8];

static void __syncthreads()
{
    if (!block_bar) {
        fprintf(stderr, "test_kernels_emu: __syncthreads in a kernel launched without barriers\n");
        abort();
    }
    block_bar->wait();
}

template <typename T> static T __shfl_xor_sync(unsigned, T v, int o)
{
    static_assert(sizeof(T) <= 8, "shuffle of a type over 8 bytes");
    const unsigned t = threadIdx.x;
    if (!warp_bar[t >> 5]) {
        fprintf(stderr, "test_kernels_emu: __shfl_xor_sync in a kernel launched without barriers\n");
        abort();
    }
    memcpy(shfl_buf[t], &v, sizeof v);
    warp_bar[t >> 5]->wait();
    T r;
    memcpy(&r, shfl_buf[t ^ (unsigned)o], sizeof r);
    warp_bar[t >> 5]->wait();
    return r;
}

static void cuda_fatal(const char *what, const char *msg)
{
    fprintf(stderr, "test_kernels_emu: %s: %s\n", what, msg);
    exit(2);
}

#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/colsum.cuh"
#include "cuda/kernels/crossentropy.cuh"
#include "cuda/kernels/elementwise.cuh"
#include "cuda/kernels/embedding.cuh"
#include "cuda/kernels/norm.cuh"
#include "cuda/kernels/reduce.cuh"
#include "cuda/kernels/rope.cuh"

/* f() run by every thread of every block of grid; with sync, each block's
 * threads run concurrently (std::thread) with barriers for __syncthreads
 * and the warp shuffles. */
template <class F> static void launch(dim3 grid, unsigned threads, bool sync, F f)
{
    /* the launch configurations CUDA accepts (else cudaErrorInvalidConfiguration) */
    if (threads == 0 || threads > 1024 || grid.x == 0 || grid.x > 0x7fffffffu || grid.y == 0 || grid.y > 65535 ||
        grid.z == 0 || grid.z > 65535) {
        fprintf(stderr, "test_kernels_emu: invalid launch configuration grid(%u,%u,%u) block %u\n", grid.x, grid.y,
                grid.z, threads);
        abort();
    }
    gridDim = grid;
    blockDim = dim3(threads);
    for (unsigned z = 0; z < grid.z; z++)
        for (unsigned y = 0; y < grid.y; y++)
            for (unsigned x = 0; x < grid.x && !sync; x++) {
                {
                    for (unsigned t = 0; t < threads; t++) {
                        threadIdx = dim3(t);
                        blockIdx = dim3(x, y, z);
                        f();
                    }
                }
            }
    if (!sync)
        return;
    /* one std::thread per CUDA thread for the whole launch, running the
     * blocks in turn (a barrier between blocks: __shared__ is reused) */
    Barrier b(threads);
    std::vector<Barrier *> wb;
    for (unsigned w = 0; w < (threads + 31) / 32; w++)
        wb.push_back(warp_bar[w] = new Barrier(threads - 32 * w < 32 ? threads - 32 * w : 32));
    block_bar = &b;
    std::vector<std::thread> th;
    for (unsigned t = 0; t < threads; t++)
        th.emplace_back([=, &b] {
            threadIdx = dim3(t);
            for (unsigned z = 0; z < grid.z; z++)
                for (unsigned y = 0; y < grid.y; y++)
                    for (unsigned x = 0; x < grid.x; x++) {
                        blockIdx = dim3(x, y, z);
                        f();
                        b.wait();
                    }
        });
    for (auto &t : th)
        t.join();
    block_bar = nullptr;
    for (unsigned w = 0; w < wb.size(); w++) {
        delete wb[w];
        warp_bar[w] = nullptr;
    }
}

/* ---- checks ---- */
static const ops_t *cpu;
static int checks, failed;

/* emu against cpu: |emu - cpu| <= tol * max |cpu| (tol < 0: same bits) */
static void check(const char *what, const char *shape, const float *emu, const float *ref, size_t n, double tol)
{
    checks++;
    double big = 0.0;
    for (size_t i = 0; i < n; i++)
        big = std::max(big, (double)fabsf(ref[i]));
    for (size_t i = 0; i < n; i++) {
        bool ok =
            tol < 0 ? memcmp(&emu[i], &ref[i], sizeof(float)) == 0 : fabs((double)emu[i] - (double)ref[i]) <= tol * big;
        if (!ok) {
            printf("FAIL %s %s: element %zu: %.9g, cpu %.9g (largest %.6g)\n", what, shape, i, emu[i], ref[i], big);
            failed++;
            return;
        }
    }
}

/* A kernel's bf16 output: got[i] == dt_f32_to_bf16(f32[i]) for all n (got
 * starts as 0xffff, so an element left unwritten fails too). */
static void check16(const char *what, const char *shape, const std::vector<uint16_t> &got, const float *f32)
{
    checks++;
    for (size_t i = 0; i < got.size(); i++)
        if (got[i] != dt_f32_to_bf16(f32[i])) {
            printf("FAIL %s bf16 %s: element %zu: 0x%04x, the rounding of %.9g is 0x%04x\n", what, shape, i, got[i],
                   f32[i], dt_f32_to_bf16(f32[i]));
            failed++;
            return;
        }
}

static std::mt19937 rng(12345);
static float urand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }
static std::vector<float> rvec(size_t n, float lo, float hi)
{
    std::vector<float> v(n);
    for (auto &x : v)
        x = urand(lo, hi);
    return v;
}

static const double TOL = 1e-5;

/* ---- attention: the launches of attention_fwd/attention_bwd ---- */
template <int NC>
static void att_run(float *out, uint16_t *out16, float *lse, float *dqkv, uint16_t *dqkv16, const float *dout,
                    const float *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS)
{
    const float scale = 1.0f / sqrtf((float)HS);
    dim3 gq(att_grid_x("attention", (T + ATT_BR - 1) / ATT_BR, NC, HS), (unsigned)NH, (unsigned)B);
    dim3 gk(att_grid_x("attention", (T + ATT_BC - 1) / ATT_BC, NC, HS), (unsigned)NKV, (unsigned)B);
    launch(gq, ATT_THREADS, true, [=] { k_att_fwd<NC>(out, out16, lse, qkv, pos, T, NH, NKV, HS, scale); });
    launch(gq, ATT_THREADS, true,
           [=] { k_att_bwd_dq<NC>(dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale); });
    launch(gk, ATT_THREADS, true,
           [=] { k_att_bwd_dkv<NC>(dqkv, dqkv16, dout, qkv, out, lse, pos, T, NH, NKV, HS, scale); });
}

/* Document positions (base/ops.h) for rows of T tokens: documents of the
 * lengths len[0..], cycling, restarting at each row. */
static std::vector<int32_t> doc_positions(int B, int T, std::vector<int> len)
{
    std::vector<int32_t> pos((size_t)B * T);
    for (int b = 0; b < B; b++)
        for (int t = 0, d = 0, p = 0; t < T; t++, p++) {
            if (p == len[d % len.size()] && t > 0)
                d++, p = 0;
            pos[(size_t)b * T + t] = p;
        }
    return pos;
}

/* docs: rows packed with documents of the lengths given (none: plain causal);
 * RoPE by document position on the way in, as the model runs it */
static void test_attention(int B, int T, int NH, int NKV, int HS, std::vector<int> docs = {})
{
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS, docs.empty() ? "" : " docs");
    const size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HS, OC = (size_t)NH * HS;
    std::vector<int32_t> posv = docs.empty() ? std::vector<int32_t>() : doc_positions(B, T, docs);
    const int32_t *pos = docs.empty() ? NULL : posv.data();
    std::vector<float> qkv = rvec(N * R, -2.0f, 2.0f), dout = rvec(N * OC, -1.0f, 1.0f);
    if (pos) {
        std::vector<float> rq = qkv, freq((size_t)HS / 2);
        /* theta 10000, the upper half of the pairs slowed 8x like a scaled table */
        for (int i = 0; i < HS / 2; i++)
            freq[(size_t)i] = dt_rope_inv_freq(i, HS, 10000.0f) / (2 * i >= HS / 2 ? 8.0f : 1.0f);
        float *pq = qkv.data();
        const float *pf = freq.data();
        cpu->rope_fwd(cpu->ctx, rq.data(), pos, B, T, NH, NKV, HS, pf);
        launch(dim3(grid_for(N * (size_t)(NH + NKV) * (size_t)(HS / 2), THREADS)), THREADS, false,
               [=] { k_rope(pq, NULL, pos, (int)N, T, NH, NKV, HS, pf, 1.0f); });
        check("rope_fwd", shape, qkv.data(), rq.data(), qkv.size(), TOL);
        /* rope_bwd with its bf16 output: the grid over the v heads too */
        std::vector<float> g = rvec(N * R, -1.0f, 1.0f), rg = g;
        std::vector<uint16_t> g16(N * R, 0xffff);
        float *pg = g.data();
        uint16_t *pg16 = g16.data();
        cpu->rope_bwd(cpu->ctx, rg.data(), NULL, pos, B, T, NH, NKV, HS, pf);
        launch(dim3(grid_for(N * (size_t)(NH + 2 * NKV) * (size_t)(HS / 2), THREADS)), THREADS, false,
               [=] { k_rope(pg, pg16, pos, (int)N, T, NH, NKV, HS, pf, -1.0f); });
        check("rope_bwd", shape, g.data(), rg.data(), g.size(), TOL);
        check16("rope_bwd", shape, g16, g.data());
        qkv = rq;
    }
    std::vector<float> out(N * OC), lse((size_t)B * NH * T), dqkv(N * R, 0.0f);
    std::vector<float> rout(N * OC), rlse(lse.size()), rdqkv(N * R, 0.0f);
    cpu->attention_fwd(cpu->ctx, rout.data(), NULL, rlse.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    cpu->attention_bwd(cpu->ctx, rdqkv.data(), NULL, dout.data(), qkv.data(), rout.data(), rlse.data(), pos, B, T, NH,
                       NKV, HS);
    /* the backward from the CPU's forward, so only the backward is compared there */
    const int nc = att_nc(HS);
    std::vector<uint16_t> out16(out.size(), 0xffff), dqkv16(dqkv.size(), 0xffff);
    uint16_t *o16 = out16.data(), *d16 = dqkv16.data();
    if (nc == 1)
        att_run<1>(out.data(), o16, lse.data(), dqkv.data(), d16, dout.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    else if (nc == 2)
        att_run<2>(out.data(), o16, lse.data(), dqkv.data(), d16, dout.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    else
        att_run<ATT_GROUP>(out.data(), o16, lse.data(), dqkv.data(), d16, dout.data(), qkv.data(), pos, B, T, NH, NKV,
                           HS);
    check("attention_fwd out", shape, out.data(), rout.data(), out.size(), TOL);
    check("attention_fwd lse", shape, lse.data(), rlse.data(), lse.size(), TOL);
    check("attention_bwd dqkv", shape, dqkv.data(), rdqkv.data(), dqkv.size(), TOL);
    check16("attention_fwd out", shape, out16, out.data());
    check16("attention_bwd dqkv", shape, dqkv16, dqkv.data());
}

/* ---- layernorm, rmsnorm: the launches of the wrappers ---- */

/* The norms' backward before it was one pass (kernels/norm.cuh): a block
 * per row for dx, then the chunks' partial sums of dw (and db), a thread
 * per column. Kept here, as they were, as the reference the fused kernels
 * must match bit for bit. */
__global__ void k_old_layernorm_bwd_dx(float *din, uint16_t *din16, const float *dout, const float *x, const float *w,
                                       const float *mean, const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
    uint16_t *d16 = din16 ? din16 + off : NULL;
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
        DT_STORE16(d16, c, d[c]);
    }
}
__global__ void k_old_layernorm_bwd_dw_part(float *pw, float *pb, const float *dout, const float *x, const float *mean,
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
__global__ void k_old_rmsnorm_bwd_dx(float *din, uint16_t *din16, const float *dout, const float *x, const float *w,
                                     const float *rstd, int C)
{
    size_t off = (size_t)blockIdx.x * C;
    const float *xr = x + off, *gr = dout + off;
    float *d = din + off;
    uint16_t *d16 = din16 ? din16 + off : NULL;
    float r = rstd[blockIdx.x];
    float s = 0.0f;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        s += w[c] * gr[c] * xr[c];
    float k = dt_rmsnorm_k(r, block_sum(s), C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        d[c] += dt_rmsnorm_dx(r, w[c], gr[c], xr[c], k);
        DT_STORE16(d16, c, d[c]);
    }
}
__global__ void k_old_rmsnorm_bwd_dw_part(float *pw, const float *dout, const float *x, const float *rstd, int N, int C,
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

/* One norm backward, as ops_cuda.cu's wrappers launch it (new: the fused
 * kernel; old: the reference pair above), then the fold into dw (db).
 * din, pd16, dw, db NULL: not wanted. part: room for the partials. */
struct NormBwd {
    bool rms;
    const float *dout, *x, *w, *mean, *rstd;
    int N, C, accum;
};
static void norm_bwd_run(const NormBwd &a, bool old, float *din, uint16_t *d16, float *dw, float *db, float *part)
{
    const int N = a.N, C = a.C, nk = col_chunks(N), cb = (C + THREADS - 1) / THREADS, rows = col_rows(N);
    const float *g = a.dout, *x = a.x, *w = a.w, *m = a.mean, *r = a.rstd;
    float *pw = (dw || db) && nk > 0 ? part : NULL, *pb = pw ? pw + (size_t)nk * C : NULL;
    if (old) {
        if (din && N > 0 && a.rms)
            launch(dim3(N), THREADS, true, [=] { k_old_rmsnorm_bwd_dx(din, d16, g, x, w, r, C); });
        else if (din && N > 0)
            launch(dim3(N), THREADS, true, [=] { k_old_layernorm_bwd_dx(din, d16, g, x, w, m, r, C); });
        if (pw && a.rms)
            launch(dim3(cb, nk), THREADS, false, [=] { k_old_rmsnorm_bwd_dw_part(pw, g, x, r, N, C, rows); });
        else if (pw)
            launch(dim3(cb, nk), THREADS, false, [=] { k_old_layernorm_bwd_dw_part(pw, pb, g, x, m, r, N, C, rows); });
    } else if (nk > 0 && (din || pw)) {
        if (a.rms)
            launch(dim3(nk), THREADS, true, [=] { k_rmsnorm_bwd(din, d16, pw, g, x, w, r, N, C, rows); });
        else
            launch(dim3(nk), THREADS, true, [=] { k_layernorm_bwd(din, d16, pw, pb, g, x, w, m, r, N, C, rows); });
    }
    const int acc = a.accum;
    if (dw)
        launch(dim3(cb), THREADS, false, [=] { k_colsum_fold(dw, pw, nk, C, acc); });
    if (db)
        launch(dim3(cb), THREADS, false, [=] { k_colsum_fold(db, pb, nk, C, acc); });
}

/* The fused backward against the reference pair, bit for bit: din, din16,
 * every chunk's partial sums, dw and db; with din alone, and the partials
 * alone (din NULL). */
static void norm_bwd_bits(const char *what, const char *shape, const NormBwd &a, const std::vector<float> &din0,
                          const std::vector<float> &dw0)
{
    const size_t n = (size_t)a.N * a.C, np = 2 * (size_t)col_chunks(a.N) * a.C + 1;
    char nm[96];
    /* all outputs, din16 too */
    std::vector<float> din[2] = {din0, din0}, dw[2] = {dw0, dw0}, db[2] = {dw0, dw0}, part[2];
    std::vector<uint16_t> d16[2];
    for (int o = 0; o < 2; o++) {
        part[o].assign(np, -7.0f);
        d16[o].assign(n, 0xffff);
        norm_bwd_run(a, o, din[o].data(), d16[o].data(), dw[o].data(), a.rms ? NULL : db[o].data(), part[o].data());
    }
    snprintf(nm, sizeof nm, "%s fused = old: din", what);
    check(nm, shape, din[0].data(), din[1].data(), n, -1);
    checks++;
    if (d16[0] != d16[1]) {
        printf("FAIL %s fused = old: din16 %s\n", what, shape);
        failed++;
    }
    snprintf(nm, sizeof nm, "%s fused = old: partial sums", what);
    check(nm, shape, part[0].data(), part[1].data(), np, -1);
    snprintf(nm, sizeof nm, "%s fused = old: dw", what);
    check(nm, shape, dw[0].data(), dw[1].data(), a.C, -1);
    if (!a.rms) {
        snprintf(nm, sizeof nm, "%s fused = old: db", what);
        check(nm, shape, db[0].data(), db[1].data(), a.C, -1);
    }
    /* din alone (no partials: the part buffer must stay as it was), then the partials alone */
    std::vector<float> din1 = din0, p1(np, -7.0f), dw1 = dw0, db1 = dw0;
    norm_bwd_run(a, false, din1.data(), NULL, NULL, NULL, p1.data());
    snprintf(nm, sizeof nm, "%s fused, din alone", what);
    check(nm, shape, din1.data(), din[1].data(), n, -1);
    checks++;
    for (float v : p1)
        if (v != -7.0f) {
            printf("FAIL %s fused, din alone, wrote partial sums %s\n", what, shape);
            failed++;
            break;
        }
    norm_bwd_run(a, false, NULL, NULL, dw1.data(), a.rms ? NULL : db1.data(), p1.data());
    snprintf(nm, sizeof nm, "%s fused, dw alone", what);
    check(nm, shape, dw1.data(), dw[1].data(), a.C, -1);
    if (!a.rms) {
        snprintf(nm, sizeof nm, "%s fused, db alone", what);
        check(nm, shape, db1.data(), db[1].data(), a.C, -1);
    }
}

/* bits: also the fused backward against the reference pair, bit for bit
 * (slow under the emulation: the reference's dx runs a block per row) */
static void test_norms(int N, int C, bool bits = true)
{
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d C=%d", N, C);
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C;
    std::vector<float> x = rvec(n, -2.0f, 2.0f), w = rvec(C, 0.5f, 1.5f), b = rvec(C, -0.5f, 0.5f);
    std::vector<float> dout = rvec(n, -1.0f, 1.0f), din0 = rvec(n, -0.5f, 0.5f), dw0 = rvec(C, -1, 1),
                       db0 = rvec(C, -1, 1);
    const int nk = col_chunks(N);
    const float *px = x.data(), *pw = w.data(), *pb = b.data(), *pg = dout.data();
    std::vector<float> part(2 * (size_t)nk * C + 1);
    for (int accum = 0; accum < 2; accum++) {
        /* layernorm */
        std::vector<float> out(n), mean(N), rstd(N), rout(n), rmean(N), rrstd(N);
        cpu->layernorm_fwd(cpu->ctx, rout.data(), NULL, rmean.data(), rrstd.data(), px, pw, pb, N, C, eps);
        float *po = out.data(), *pm = mean.data(), *pr = rstd.data();
        /* accum 1: with the bf16 output, then the bf16 output alone */
        std::vector<uint16_t> o16(n, 0xffff), o16b(n, 0xffff);
        uint16_t *p16 = accum ? o16.data() : NULL, *p16b = o16b.data();
        launch(dim3(N), THREADS, true, [=] { k_layernorm_fwd(po, p16, pm, pr, px, pw, pb, C, eps); });
        if (!accum) {
            check("layernorm_fwd out", shape, out.data(), rout.data(), n, TOL);
            check("layernorm_fwd mean", shape, mean.data(), rmean.data(), N, TOL);
            check("layernorm_fwd rstd", shape, rstd.data(), rrstd.data(), N, TOL);
        } else {
            launch(dim3(N), THREADS, true, [=] { k_layernorm_fwd(NULL, p16b, pm, pr, px, pw, pb, C, eps); });
            check16("layernorm_fwd out", shape, o16, out.data());
            check16("layernorm_fwd out (out NULL)", shape, o16b, out.data());
        }
        std::vector<float> din = din0, dw = dw0, db = db0, rdin = din0, rdw = dw0, rdb = db0;
        cpu->layernorm_bwd(cpu->ctx, rdin.data(), NULL, rdw.data(), rdb.data(), pg, px, pw, rmean.data(), rrstd.data(),
                           N, C, accum);
        std::vector<uint16_t> din16(n, 0xffff);
        const NormBwd ln = {false, pg, px, pw, rmean.data(), rrstd.data(), N, C, accum};
        norm_bwd_run(ln, false, din.data(), accum ? din16.data() : NULL, dw.data(), db.data(), part.data());
        if (accum)
            check16("layernorm_bwd din", shape, din16, din.data());
        const char *a = accum ? " (accum)" : "";
        char what[64];
        snprintf(what, sizeof what, "layernorm_bwd din%s", a);
        check(what, shape, din.data(), rdin.data(), n, TOL);
        snprintf(what, sizeof what, "layernorm_bwd dw%s", a);
        check(what, shape, dw.data(), rdw.data(), C, TOL);
        snprintf(what, sizeof what, "layernorm_bwd db%s", a);
        check(what, shape, db.data(), rdb.data(), C, TOL);
        if (bits && accum) /* with din16; the fold (accum_dw) is the same kernel either way */
            norm_bwd_bits("layernorm_bwd (accum)", shape, ln, din0, dw0);

        /* rmsnorm */
        cpu->rmsnorm_fwd(cpu->ctx, rout.data(), NULL, rrstd.data(), px, pw, N, C, eps);
        std::fill(o16.begin(), o16.end(), 0xffff);
        std::fill(o16b.begin(), o16b.end(), 0xffff);
        launch(dim3(N), THREADS, true, [=] { k_rmsnorm_fwd(po, p16, pr, px, pw, C, eps); });
        if (!accum) {
            check("rmsnorm_fwd out", shape, out.data(), rout.data(), n, TOL);
            check("rmsnorm_fwd rstd", shape, rstd.data(), rrstd.data(), N, TOL);
        } else {
            launch(dim3(N), THREADS, true, [=] { k_rmsnorm_fwd(NULL, p16b, pr, px, pw, C, eps); });
            check16("rmsnorm_fwd out", shape, o16, out.data());
            check16("rmsnorm_fwd out (out NULL)", shape, o16b, out.data());
        }
        din = din0, dw = dw0, rdin = din0, rdw = dw0;
        cpu->rmsnorm_bwd(cpu->ctx, rdin.data(), NULL, rdw.data(), pg, px, pw, rrstd.data(), N, C, accum);
        std::fill(din16.begin(), din16.end(), 0xffff);
        const NormBwd rms = {true, pg, px, pw, NULL, rrstd.data(), N, C, accum};
        norm_bwd_run(rms, false, din.data(), accum ? din16.data() : NULL, dw.data(), NULL, part.data());
        if (accum)
            check16("rmsnorm_bwd din", shape, din16, din.data());
        snprintf(what, sizeof what, "rmsnorm_bwd din%s", a);
        check(what, shape, din.data(), rdin.data(), n, TOL);
        snprintf(what, sizeof what, "rmsnorm_bwd dw%s", a);
        check(what, shape, dw.data(), rdw.data(), C, TOL);
        if (bits && accum)
            norm_bwd_bits("rmsnorm_bwd (accum)", shape, rms, din0, dw0);
    }
}

/* ---- q/k norms (Qwen3): the launches of the wrappers ---- */
static void test_qknorm(int N, int NH, int NKV, int HS)
{
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d NH=%d NKV=%d HS=%d", N, NH, NKV, HS);
    const float eps = 1e-6f;
    const int nqk = NH + NKV, R = (NH + 2 * NKV) * HS;
    const size_t n = (size_t)N * R, ns = (size_t)N * nqk * HS;
    std::vector<float> x = rvec(n, -2.0f, 2.0f), wq = rvec(HS, 0.5f, 1.5f), wk = rvec(HS, 0.5f, 1.5f);
    std::vector<float> dout = rvec(n, -1.0f, 1.0f), dw0 = rvec(HS, -1, 1);
    const int nk = col_chunks(N), cb = (HS + THREADS - 1) / THREADS, rows = col_rows(N);
    const float *pwq = wq.data(), *pwk = wk.data();
    std::vector<float> y = x, ry = x, xin(ns), rxin(ns), rstd((size_t)N * nqk), rrstd((size_t)N * nqk);
    cpu->qknorm_fwd(cpu->ctx, ry.data(), rxin.data(), rrstd.data(), pwq, pwk, N, NH, NKV, HS, eps);
    float *py = y.data(), *pxin = xin.data(), *pr = rstd.data();
    launch(dim3(N * nqk), THREADS, true, [=] { k_qknorm_fwd(py, pxin, pr, pwq, pwk, NH, nqk, R, HS, eps); });
    check("qknorm_fwd qkv", shape, y.data(), ry.data(), n, TOL);
    check("qknorm_fwd xin", shape, xin.data(), rxin.data(), ns, TOL);
    check("qknorm_fwd rstd", shape, rstd.data(), rrstd.data(), (size_t)N * nqk, TOL);
    for (int accum = 0; accum < 2; accum++) {
        std::vector<float> g = dout, rg = dout, dwq = dw0, dwk = dw0, rdwq = dw0, rdwk = dw0;
        cpu->qknorm_bwd(cpu->ctx, rg.data(), rdwq.data(), rdwk.data(), rxin.data(), pwq, pwk, rrstd.data(), N, NH, NKV,
                        HS, accum);
        std::vector<float> part(2 * (size_t)nk * HS + 1);
        float *pp = part.data(), *pg = g.data(), *pdq = dwq.data(), *pdk = dwk.data();
        const float *cx = rxin.data(), *cr = rrstd.data();
        launch(dim3(cb, nk, 2), THREADS, false, [=] { k_qknorm_dw_part(pp, pg, cx, cr, N, NH, nqk, R, HS, rows); });
        launch(dim3(cb), THREADS, false, [=] { k_colsum_fold(pdq, pp, nk, HS, accum); });
        launch(dim3(cb), THREADS, false, [=] { k_colsum_fold(pdk, pp + (size_t)nk * HS, nk, HS, accum); });
        launch(dim3(N * nqk), THREADS, true, [=] { k_qknorm_bwd_dx(pg, cx, pwq, pwk, cr, NH, nqk, R, HS); });
        const char *a = accum ? " (accum)" : "";
        char what[64];
        snprintf(what, sizeof what, "qknorm_bwd dqkv%s", a);
        check(what, shape, g.data(), rg.data(), n, TOL);
        snprintf(what, sizeof what, "qknorm_bwd dwq%s", a);
        check(what, shape, dwq.data(), rdwq.data(), HS, TOL);
        snprintf(what, sizeof what, "qknorm_bwd dwk%s", a);
        check(what, shape, dwk.data(), rdwk.data(), HS, TOL);
    }
}

/* ---- GELU and SwiGLU (elementwise.cuh): the CPU ops, and the bf16 outputs ---- */
static void test_act(int N, int F)
{
    char shape[64];
    snprintf(shape, sizeof shape, "N=%d F=%d", N, F);
    const size_t n = (size_t)N * F, n2 = 2 * n;
    const unsigned gb = grid_for(n, THREADS);
    std::vector<float> x = rvec(n2, -4.0f, 4.0f), dout = rvec(n2, -1.0f, 1.0f);
    std::vector<float> y(n2), ry(n2), dx(n2), rdx(n2);
    std::vector<uint16_t> y16(n, 0xffff), y16b(n, 0xffff), dx16(n2, 0xffff);
    float *px = x.data(), *pd = dout.data(), *py = y.data(), *pdx = dx.data();
    uint16_t *py16 = y16.data(), *py16b = y16b.data(), *pdx16 = dx16.data();
    /* GELU over n values: out and out16, then out16 alone; its gradient with dx16 */
    cpu->gelu_fwd(cpu->ctx, ry.data(), NULL, px, n);
    launch(dim3(gb), THREADS, false, [=] { k_gelu_fwd(py, py16, px, n); });
    launch(dim3(gb), THREADS, false, [=] { k_gelu_fwd(NULL, py16b, px, n); });
    check("gelu_fwd", shape, y.data(), ry.data(), n, TOL);
    check16("gelu_fwd out", shape, y16, y.data());
    check16("gelu_fwd out (out NULL)", shape, y16b, y.data());
    std::vector<uint16_t> g16(n, 0xffff);
    uint16_t *pg16 = g16.data();
    cpu->gelu_bwd(cpu->ctx, rdx.data(), px, pd, n);
    launch(dim3(gb), THREADS, false, [=] { k_gelu_bwd(pdx, pg16, px, pd, n); });
    check("gelu_bwd", shape, dx.data(), rdx.data(), n, TOL);
    check16("gelu_bwd dx", shape, g16, dx.data());
    /* SwiGLU: x as gu[N, 2F] */
    std::fill(y16.begin(), y16.end(), 0xffff);
    std::fill(y16b.begin(), y16b.end(), 0xffff);
    cpu->swiglu_fwd(cpu->ctx, ry.data(), NULL, px, N, F);
    launch(dim3(gb), THREADS, false, [=] { k_swiglu_fwd(py, py16, px, N, F); });
    launch(dim3(gb), THREADS, false, [=] { k_swiglu_fwd(NULL, py16b, px, N, F); });
    check("swiglu_fwd", shape, y.data(), ry.data(), n, TOL);
    check16("swiglu_fwd out", shape, y16, y.data());
    check16("swiglu_fwd out (out NULL)", shape, y16b, y.data());
    cpu->swiglu_bwd(cpu->ctx, rdx.data(), NULL, px, pd, N, F);
    launch(dim3(gb), THREADS, false, [=] { k_swiglu_bwd(pdx, pdx16, px, pd, N, F); });
    check("swiglu_bwd", shape, dx.data(), rdx.data(), n2, TOL);
    check16("swiglu_bwd dgu", shape, dx16, dx.data());
}

/* ---- cross-entropy: xent_max, xent_sumexp, xent_finish ---- */
static void test_xent(int N, int Vl, int ld, int v0, bool alias)
{
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d Vl=%d ld=%d v0=%d%s", N, Vl, ld, v0, alias ? " expbuf=logits" : "");
    std::vector<float> logits = rvec((size_t)N * ld, -4.0f, 4.0f);
    std::vector<int32_t> tgt(N);
    for (int n = 0; n < N; n++) /* some ignored (-1), some on other ranks */
        tgt[n] = n % 5 == 4 ? -1 : (int32_t)(rng() % (unsigned)(v0 + Vl + 3));
    const float dloss = 1.0f / N;
    std::vector<float> mx(N), st(2 * (size_t)N), loss(N), rmx(N), rst(2 * (size_t)N), rloss(N);
    std::vector<float> e = alias ? logits : std::vector<float>((size_t)N * ld, 7.0f), re = e;
    cpu->xent_max(cpu->ctx, rmx.data(), logits.data(), N, Vl, ld);
    cpu->xent_sumexp(cpu->ctx, rst.data(), re.data(), alias ? re.data() : logits.data(), rmx.data(), tgt.data(), v0, N,
                     Vl, ld);
    cpu->xent_finish(cpu->ctx, rloss.data(), re.data(), NULL, rmx.data(), rst.data(), tgt.data(), v0, N, Vl, ld, dloss);
    float *pm = mx.data(), *ps = st.data(), *pl = loss.data(), *pe = e.data();
    const float *px = alias ? e.data() : logits.data();
    const int32_t *pt = tgt.data();
    launch(dim3(N), THREADS, true, [=] { k_xent_max(pm, px, Vl, ld); });
    check("xent_max", shape, mx.data(), rmx.data(), N, TOL);
    launch(dim3(N), THREADS, true, [=] { k_xent_sumexp(ps, pe, px, pm, pt, v0, Vl, ld); });
    check("xent_sumexp stats", shape, st.data(), rst.data(), st.size(), TOL);
    std::vector<uint16_t> e16(e.size(), 0xffff);
    uint16_t *pe16 = e16.data();
    launch(dim3(N), THREADS, true, [=] { k_xent_finish(pl, pe, pe16, pm, ps, pt, v0, Vl, ld, dloss); });
    check("xent_finish losses", shape, loss.data(), rloss.data(), N, TOL);
    check("xent_finish dlogits", shape, e.data(), re.data(), e.size(), TOL);
    check16("xent_finish dlogits", shape, e16, e.data());
    /* losses only */
    std::fill(loss.begin(), loss.end(), 9.0f);
    cpu->xent_finish(cpu->ctx, rloss.data(), NULL, NULL, rmx.data(), rst.data(), pt, v0, N, Vl, ld, dloss);
    launch(dim3(N), THREADS, true, [=] { k_xent_finish(pl, NULL, NULL, pm, ps, pt, v0, Vl, ld, dloss); });
    check("xent_finish losses (no dlogits)", shape, loss.data(), rloss.data(), N, TOL);
}

/* ---- embedding: embedding_fwd, embedding_bwd (cub emulated) ---- */
/* embedding_bwd_rows with cub's sort, run-length encoding and scan on the
 * host: dw[key row of n] += dout[n] grouped by row (tokens, or document
 * positions with v0 = 0, Vl = T) */
static void emb_rows_host(float *dw, const float *pg, const int32_t *pt, int N, int C, int v0, int Vl)
{
    std::vector<int> key(N), val(N), idx(N), key_s(N), val_s(N), row(N), cnt(N, 0), off(N);
    int *pk = key.data(), *pv = val.data();
    launch(dim3(grid_for((size_t)N, THREADS)), THREADS, false, [=] { k_emb_keys(pk, pv, pt, N, v0, Vl); });
    for (int i = 0; i < N; i++)
        idx[i] = i;
    std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return key[a] < key[b]; });
    for (int i = 0; i < N; i++)
        key_s[i] = key[idx[i]], val_s[i] = val[idx[i]];
    int nruns = 0;
    for (int i = 0; i < N; i++) {
        if (i == 0 || key_s[i] != key_s[i - 1])
            row[nruns++] = key_s[i];
        cnt[nruns - 1]++;
    }
    for (int i = 0, s = 0; i < N; i++)
        off[i] = s, s += cnt[i];
    const int *pr = row.data(), *pof = off.data(), *pc = cnt.data(), *pvs = val_s.data(), *pn = &nruns;
    launch(dim3(N), THREADS, false, [=] { k_emb_rows(dw, pg, pr, pof, pc, pvs, pn, C, Vl); });
}

/* docs: wpe rows by document position (documents of 3, 1, 11, ... tokens) */
static void test_embedding(int B, int T, int C, int v0, int Vl, bool wpe_on, bool docs = false)
{
    char shape[96];
    snprintf(shape, sizeof shape, "N=%d T=%d C=%d v0=%d Vl=%d%s%s", B * T, T, C, v0, Vl, wpe_on ? "" : " no wpe",
             docs ? " docs" : "");
    const int N = B * T;
    std::vector<int32_t> tok(N), posv = doc_positions(B, T, {3, 1, 11});
    const int32_t *pos = docs ? posv.data() : NULL;
    for (auto &t : tok)
        t = (int32_t)(rng() % (unsigned)(v0 + Vl + 7));
    std::vector<float> wte = rvec((size_t)Vl * C, -1, 1), wpe = rvec((size_t)T * C, -1, 1);
    std::vector<float> out((size_t)N * C), rout(out.size());
    const float *pwpe = wpe_on ? wpe.data() : NULL, *pwte = wte.data();
    const int32_t *pt = tok.data();
    cpu->embedding_fwd(cpu->ctx, rout.data(), pt, pos, pwte, pwpe, N, T, C, v0, Vl);
    float *po = out.data();
    launch(dim3(grid_for((size_t)N * C, THREADS)), THREADS, false,
           [=] { k_embedding_fwd(po, pt, pos, pwte, pwpe, N, T, C, v0, Vl); });
    check("embedding_fwd", shape, out.data(), rout.data(), out.size(), -1);

    std::vector<float> dout = rvec((size_t)N * C, -1, 1);
    const float *pg = dout.data();
    for (int accum = 0; accum < 2; accum++) {
        std::vector<float> dwte = rvec((size_t)Vl * C, -1, 1), dwpe = rvec((size_t)T * C, -1, 1);
        std::vector<float> rdwte = dwte, rdwpe = dwpe;
        cpu->embedding_bwd(cpu->ctx, rdwte.data(), wpe_on ? rdwpe.data() : NULL, pg, pt, pos, N, T, C, v0, Vl, accum);
        if (!accum) {
            std::fill(dwte.begin(), dwte.end(), 0.0f);
            std::fill(dwpe.begin(), dwpe.end(), 0.0f);
        }
        float *pdp = dwpe.data();
        emb_rows_host(dwte.data(), pg, pt, N, C, v0, Vl);
        /* ops_cuda.cu's embedding_bwd: positions grouped like tokens */
        if (wpe_on && pos)
            emb_rows_host(pdp, pg, pos, N, C, 0, T);
        else if (wpe_on)
            launch(dim3(grid_for((size_t)T * C, THREADS)), THREADS, false,
                   [=] { k_embedding_bwd_wpe(pdp, pg, N, T, C); });
        check(accum ? "embedding_bwd dwte (accum)" : "embedding_bwd dwte", shape, dwte.data(), rdwte.data(),
              dwte.size(), -1);
        if (wpe_on)
            check(accum ? "embedding_bwd dwpe (accum)" : "embedding_bwd dwpe", shape, dwpe.data(), rdwpe.data(),
                  dwpe.size(), -1);
    }
}

/* ---- sumsq: k_sumsq and the wrapper's fold of the partials ---- */
static void test_sumsq()
{
    const size_t ns[] = {1000, 3, 70000};
    const int count = 3;
    std::vector<std::vector<float>> v;
    std::vector<const float *> xs;
    for (size_t n : ns) {
        v.push_back(rvec(n, -3, 3));
        xs.push_back(v.back().data());
    }
    double ref[count], got[count];
    cpu->sumsq(cpu->ctx, ref, xs.data(), ns, count);
    std::vector<double> part((size_t)count * SUMSQ_BLOCKS);
    double *pp = part.data();
    const float *const *px = xs.data();
    const size_t *pn = ns;
    launch(dim3(SUMSQ_BLOCKS, count), THREADS, true, [=] { k_sumsq(pp, px, pn); });
    for (int i = 0; i < count; i++) {
        got[i] = 0.0;
        for (int b = 0; b < SUMSQ_BLOCKS; b++)
            got[i] += part[(size_t)i * SUMSQ_BLOCKS + b];
        checks++;
        if (!(fabs(got[i] - ref[i]) <= 1e-6 * fabs(ref[i]))) {
            printf("FAIL sumsq n=%zu: %.17g, cpu %.17g\n", ns[i], got[i], ref[i]);
            failed++;
        }
    }
}

int main(void)
{
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    ops_cpu_threads(1);
    /* partial tiles and GQA (HS <= 64); HS > 64 not a multiple of 4 (two
     * chunks); HS > 128 (ATT_GROUP chunks, a partial one); tiny HS */
    test_attention(2, 37, 4, 2, 16);
    test_attention(1, 33, 3, 1, 70);
    test_attention(1, 20, 2, 1, 130);
    test_attention(1, 65, 2, 2, 6);
    /* documents: within a tile, across tile edges, whole tiles skipped,
     * single tokens; GQA, two chunks, partial tiles */
    test_attention(2, 100, 4, 2, 16, {1, 37, 5, 70});
    test_attention(1, 97, 2, 1, 70, {40, 1, 30});
    test_attention(1, 70, 2, 2, 6, {3});
    /* norms: C over THREADS (two column blocks), one row, two row chunks
     * the second ending mid-step (130 = 128 + 2, 137 = 128 + 8 + 1) with C
     * not a multiple of THREADS, a llama-70b-wide C (8192) over three
     * steps, the last partial */
    test_norms(5, 300);
    test_norms(1, 300);
    test_norms(130, 24, false); /* against the CPU only: 137 is the bits' two-chunk case */
    test_norms(137, 777);
    test_norms(20, 8192);
    test_qknorm(5, 4, 2, 16);  /* GQA heads */
    test_qknorm(130, 2, 1, 6); /* two row chunks */
    test_qknorm(3, 1, 1, 300); /* HS over THREADS */
    test_act(3, 700); /* grids of several blocks, F not a multiple of THREADS */
    test_xent(6, 300, 304, 0, false);
    test_xent(5, 37, 40, 20, true);
    test_embedding(3, 50, 20, 0, 40, true);       /* N > 128 */
    test_embedding(2, 7, 257, 10, 9, false);      /* another rank's slice, C over THREADS */
    test_embedding(3, 50, 20, 0, 40, true, true); /* wpe by document position */
    test_sumsq();
    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    ops_release(cpu);
    return failed ? 1 : 0;
}
