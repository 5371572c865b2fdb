/* The CUDA backend's ring attention ops (cuda/ops_cuda_ring.cuh, kernels in
 * cuda/kernels/ring.cuh) on the CPU: the header's own host code, its kernels
 * under emu_cuda.h's deterministic thread-block emulation, against the CPU ops
 * (src/backend/ops_cpu_ring.c) on the same inputs.
 *
 *  - attention_kv_pack, attention_kv_unpack (written and accumulated) and
 *    attention_merge: bit for bit (the same per-element operations; here both
 *    sides are g++ on the host, dt_expf's polynomial and glibc's log1pf).
 *    The merge's inputs include rows where one side, the other or both are
 *    -inf (no key yet).
 *  - attention_block_fwd: out within 1e-5 of max |out|, lse within 1e-6 of
 *    max |lse| where finite, and -inf exactly where the CPU has -inf (rows with
 *    no key in the block, whose out must then be exactly 0).
 *  - attention_block_bwd: dq (the q columns of dqkv) and dkv within 1e-5 of
 *    the largest magnitude of what was added to them, starting from the same
 *    random non-zero values on both sides (accumulated, never written); the k
 *    and v columns of dqkv bit-identical to their start (untouched).
 *  - whole rings (cp 2 and 4, documents crossing ranks): every rank's
 *    blocks, merges, backward and unpack through the emulated ops in the
 *    zigzag schedule, against the CPU's attention_fwd and attention_bwd over
 *    the whole sequence: out, lse and dqkv within 1e-5 (an independent
 *    reference: the ring's composition, not just op for op).
 * Every output of the forward starts as NaN on both sides, so an element
 * either fails to write shows. One case runs twice: bit-identical results.
 *
 * Shapes are zigzag blocks as mpi/cp_sched.c hands them out: a sequence of
 * T tokens cut in 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r
 * (qpos, kpos: those chunks' global positions). Cases: T = 2 per rank (cp 2,
 * T 4: the query at position 0 sees none of rank 1's keys, lse = -inf, out = 0);
 * GQA 4:1 and 2:1 and MHA; B = 2; query rows over several 32-row tiles and key
 * runs starting off the tile grid; sub-ranges (q0, nq) x (k0, nk) with
 * causal 0 and 1; documents (qdoc) that cross the chunk edges, differing per
 * sequence; head sizes 16, 72 (two 64-column chunks) and 260 (two column
 * groups).
 *
 * A mutation check: test_ring_mutants (ring_mutants.sh) builds this test
 * against broken copies of ring.cuh and ops_cuda_ring.cuh (among them the
 * causal test on local key indices instead of the global kpos), and each must
 * fail it (run with --stop: it ends at the first failed check).
 *
 * Output: one line per failed check, per case's worst errors, a summary. Exit
 * 0 when all pass. */
extern "C" {
#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"
}

#include "test/emu/emu_cuda.h"

#include <cmath>
#include <random>
#include <string>

/* ---- the runtime and backend state the header uses ---- */
typedef struct emu_stream *cudaStream_t;
static cudaStream_t const emu_stream = (cudaStream_t)0x5eed; /* g->stream: the only stream allowed */
static long emu_bad_stream;

static void cuda_fatal(const char *what, const char *msg)
{
    printf("FAIL cuda_fatal: %s: %s\n", what, msg);
    exit(1);
}

struct cu_t {
    cudaStream_t stream;
};
static void finish(cu_t *, const char *) {}

/* CU_LAUNCH: the launch shape checked as CUDA would, then every block under
 * emu_cuda.h's schedule. */
struct EmuLaunch {
    dim3 grid;
    unsigned threads;
    EmuLaunch(const char *name, dim3 g, dim3 b, size_t smem, cudaStream_t s) : grid(g), threads(b.x)
    {
        emu_bad_stream += s != emu_stream;
        if (g.x == 0 || g.y == 0 || g.z == 0 || g.y > 65535 || g.z > 65535 || b.y != 1 || b.z != 1 || smem != 0) {
            printf("FAIL launch of %s: grid (%u, %u, %u), block (%u, %u, %u), %zu bytes dynamic shared memory\n", name,
                   g.x, g.y, g.z, b.x, b.y, b.z, smem);
            exit(1);
        }
    }
    template <class K> auto of(K kernel) const
    {
        const dim3 gr = grid;
        const unsigned th = threads;
        return [gr, th, kernel](auto... args) { emu_launch(gr, th, [=] { kernel(args...); }); };
    }
};
#define CU_LAUNCH(kernel, ...) EmuLaunch(#kernel, __VA_ARGS__).of(kernel)

#include "cuda/kernels/ring.cuh"
#include "cuda/ops_cuda_ring.cuh"

static const ops_t *cpu;
static int checks, failed;
static std::mt19937 rng(3434);
static cu_t emu_g = {emu_stream};

static std::vector<float> randv(size_t n, float a)
{
    std::uniform_real_distribution<float> u(-a, a);
    std::vector<float> v(n);
    for (float &x : v)
        x = u(rng);
    return v;
}

static bool stop_early; /* --stop (the mutation check): end at the first failed check */
static void check(bool ok, const std::string &what)
{
    checks++;
    if (!ok) {
        failed++;
        printf("FAIL %s\n", what.c_str());
        if (stop_early)
            exit(1);
    }
}

static bool same_bits(const std::vector<float> &a, const std::vector<float> &b)
{
    return a.size() == b.size() && memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/* max |got - ref| over [rows, R] columns [c0, c1) within rel max |ref - base|
 * (base: the values accumulated into, or NULL); worst = that error relative. */
static bool close_to(const std::vector<float> &got, const std::vector<float> &ref, const std::vector<float> *base,
                     size_t R, size_t c0, size_t c1, double rel, double *worst)
{
    const size_t rows = ref.size() / R;
    double mx = 0.0, err = 0.0;
    for (size_t n = 0; n < rows; n++)
        for (size_t c = c0; c < c1; c++)
            mx = std::max(mx, fabs((double)ref[n * R + c] - (base ? (double)(*base)[n * R + c] : 0.0)));
    bool ok = true;
    for (size_t n = 0; n < rows; n++)
        for (size_t c = c0; c < c1; c++) {
            const double e = fabs((double)got[n * R + c] - (double)ref[n * R + c]);
            if (!(e <= rel * mx))
                ok = false;
            err = std::max(err, std::isnan(e) ? INFINITY : e);
        }
    *worst = mx > 0.0 ? err / mx : err;
    return ok;
}

/* ---- pack, unpack, merge: bit for bit ---- */

static void test_pack(int N, int NH, int NKV, int HS)
{
    const size_t R = (size_t)(NH + 2 * NKV) * HS, KR = (size_t)2 * NKV * HS;
    std::vector<float> qkv = randv(N * R, 2.0f), kv(N * KR, NAN), kvr(N * KR, NAN);
    attention_kv_pack(&emu_g, kv.data(), qkv.data(), N, NH, NKV, HS);
    cpu->attention_kv_pack(cpu->ctx, kvr.data(), qkv.data(), N, NH, NKV, HS);
    std::string shape = " N " + std::to_string(N) + " NH " + std::to_string(NH) + " NKV " + std::to_string(NKV) +
                        " HS " + std::to_string(HS);
    check(same_bits(kv, kvr), "attention_kv_pack" + shape);
    for (int accum = 0; accum < 2; accum++) {
        std::vector<float> dkv = randv(N * KR, 1.0f), d = randv(N * R, 1.0f), dr = d;
        attention_kv_unpack(&emu_g, d.data(), dkv.data(), N, NH, NKV, HS, accum);
        cpu->attention_kv_unpack(cpu->ctx, dr.data(), dkv.data(), N, NH, NKV, HS, accum);
        check(same_bits(d, dr), "attention_kv_unpack accum " + std::to_string(accum) + shape);
    }
}

static void test_merge(int B, int NH, int HS, int Tq, int q0, int nq)
{
    const size_t OC = (size_t)NH * HS;
    std::vector<float> out = randv(B * Tq * OC, 1.0f), pout = randv(B * Tq * OC, 1.0f);
    std::vector<float> lse = randv((size_t)B * NH * Tq, 6.0f), plse = randv((size_t)B * NH * Tq, 6.0f);
    /* -inf on one side, the other, both; and far apart (exp underflows) */
    for (size_t i = 0; i < lse.size(); i++) {
        if (i % 5 == 1)
            lse[i] = -INFINITY;
        if (i % 7 == 2)
            plse[i] = -INFINITY;
        if (i % 11 == 3)
            plse[i] = lse[i] + 120.0f;
    }
    std::vector<float> out_r = out, lse_r = lse;
    att_block_t k = {B, NH, NH, HS, Tq, q0, nq, 0, 0, 0, 1};
    attention_merge(&emu_g, out.data(), lse.data(), pout.data(), plse.data(), &k);
    cpu->attention_merge(cpu->ctx, out_r.data(), lse_r.data(), pout.data(), plse.data(), &k);
    std::string shape = " B " + std::to_string(B) + " NH " + std::to_string(NH) + " HS " + std::to_string(HS) +
                        " rows " + std::to_string(q0) + "+" + std::to_string(nq) + "/" + std::to_string(Tq);
    check(same_bits(out, out_r), "attention_merge out" + shape);
    check(same_bits(lse, lse_r), "attention_merge lse" + shape);
}

/* ---- one block, forward and backward ---- */

/* Global positions of rank r's zigzag chunks (2 cp chunks of T / (2 cp)). */
static std::vector<int32_t> zigzag(int T, int cp, int r)
{
    const int c = T / (2 * cp);
    std::vector<int32_t> p;
    for (int t = 0; t < c; t++)
        p.push_back(r * c + t);
    for (int t = 0; t < c; t++)
        p.push_back((2 * cp - 1 - r) * c + t);
    return p;
}

/* qdoc[B Tq]: where the document of each query starts, documents of the
 * lengths len (cycling, sequence b starting b entries in) over the whole
 * sequence of T tokens. */
static std::vector<int32_t> docs(int B, int T, const std::vector<int32_t> &qpos, const std::vector<int> &len)
{
    std::vector<int32_t> q;
    for (int b = 0; b < B; b++) {
        std::vector<int32_t> start(T);
        for (int t = 0, d = b, s = 0; t < T; t++) {
            if (t - s == len[d % len.size()])
                s = t, d++;
            start[t] = s;
        }
        for (int32_t p : qpos)
            q.push_back(start[p]);
    }
    return q;
}

struct block_case {
    int B, NH, NKV, HS, T, cp, qr, kr; /* queries of rank qr against keys of rank kr */
    int q0, nq, k0, nk, causal;
    std::vector<int> doclen; /* empty: one document */
};

static void test_block(const block_case &c, bool twice = false)
{
    const std::vector<int32_t> qpos = zigzag(c.T, c.cp, c.qr), kpos = zigzag(c.T, c.cp, c.kr);
    const int Tq = (int)qpos.size(), Tk = (int)kpos.size();
    const std::vector<int32_t> qdoc = c.doclen.empty() ? std::vector<int32_t>() : docs(c.B, c.T, qpos, c.doclen);
    const int32_t *qd = qdoc.empty() ? NULL : qdoc.data();
    const att_block_t k = {c.B, c.NH, c.NKV, c.HS, Tq, c.q0, c.nq, Tk, c.k0, c.nk, c.causal};
    const size_t R = (size_t)(c.NH + 2 * c.NKV) * c.HS, KR = (size_t)2 * c.NKV * c.HS, OC = (size_t)c.NH * c.HS;
    char shape[200];
    snprintf(shape, sizeof shape, "B %d NH %d NKV %d HS %d T %d cp %d q rank %d rows %d+%d, k rank %d rows %d+%d%s%s",
             c.B, c.NH, c.NKV, c.HS, c.T, c.cp, c.qr, c.q0, c.nq, c.kr, c.k0, c.nk, c.causal ? " causal" : "",
             qd ? " docs" : "");
    std::vector<float> qkv = randv(c.B * Tq * R, 2.0f), kvsrc = randv(c.B * Tk * R, 2.0f), kv(c.B * Tk * KR);
    cpu->attention_kv_pack(cpu->ctx, kv.data(), kvsrc.data(), c.B * Tk, c.NH, c.NKV, c.HS);

    /* forward: outputs poisoned on both sides */
    std::vector<float> out(c.B * Tq * OC, NAN), lse((size_t)c.B * c.NH * Tq, NAN), out_r = out, lse_r = lse;
    attention_block_fwd(&emu_g, out.data(), lse.data(), qkv.data(), kv.data(), qpos.data(), kpos.data(), qd, &k);
    cpu->attention_block_fwd(cpu->ctx, out_r.data(), lse_r.data(), qkv.data(), kv.data(), qpos.data(), kpos.data(), qd,
                             &k);
    double wo, wl = 0.0, lmx = 0.0;
    bool ok_inf = true, ok_l = true;
    int noKey = 0;
    for (size_t i = 0; i < lse.size(); i++) {
        const bool inside = (int)(i % Tq) >= c.q0 && (int)(i % Tq) < c.q0 + c.nq;
        if (!inside) { /* untouched on both sides */
            ok_inf = ok_inf && std::isnan(lse[i]) && std::isnan(lse_r[i]);
            continue;
        }
        if (std::isinf(lse_r[i]) && lse_r[i] < 0) {
            noKey++;
            ok_inf = ok_inf && std::isinf(lse[i]) && lse[i] < 0;
            const size_t b = i / ((size_t)c.NH * Tq), h = i / Tq % c.NH, t = i % Tq;
            for (int e = 0; e < c.HS; e++)
                ok_inf = ok_inf && out[(b * Tq + t) * OC + h * c.HS + e] == 0.0f;
        } else
            lmx = std::max(lmx, fabs((double)lse_r[i]));
    }
    for (size_t i = 0; i < lse.size(); i++)
        if (std::isfinite(lse_r[i])) {
            const double e = fabs((double)lse[i] - lse_r[i]);
            wl = std::max(wl, std::isnan(e) ? INFINITY : e);
        }
    ok_l = wl <= 1e-6 * std::max(lmx, 1.0);
    /* rows outside [q0, q0 + nq) stay NaN on both sides: compare only the others */
    std::vector<float> o1, o2;
    for (int b = 0; b < c.B; b++)
        for (int t = c.q0; t < c.q0 + c.nq; t++)
            for (size_t e = 0; e < OC; e++) {
                o1.push_back(out[((size_t)b * Tq + t) * OC + e]);
                o2.push_back(out_r[((size_t)b * Tq + t) * OC + e]);
            }
    check(close_to(o1, o2, NULL, OC, 0, OC, 1e-5, &wo), std::string("attention_block_fwd out ") + shape);
    check(ok_l, std::string("attention_block_fwd lse ") + shape);
    check(ok_inf, std::string("attention_block_fwd rows without keys (lse -inf, out 0) ") + shape);

    /* backward from the CPU's forward (a block's own out and lse stand for the
     * final ones: the arithmetic is the same), accumulated into random values */
    std::vector<float> dout = randv(c.B * Tq * OC, 1.0f), dq0 = randv(c.B * Tq * R, 1.0f),
                       dkv0 = randv(c.B * Tk * KR, 1.0f);
    for (size_t i = 0; i < out_r.size(); i++) /* rows outside the block: any finite value */
        if (std::isnan(out_r[i]))
            out_r[i] = 0.5f;
    for (size_t i = 0; i < lse_r.size(); i++)
        if (std::isnan(lse_r[i]))
            lse_r[i] = 1.0f;
    std::vector<float> dq = dq0, dkv = dkv0, dq_r = dq0, dkv_r = dkv0;
    attention_block_bwd(&emu_g, dq.data(), dkv.data(), dout.data(), qkv.data(), kv.data(), out_r.data(), lse_r.data(),
                        qpos.data(), kpos.data(), qd, &k);
    cpu->attention_block_bwd(cpu->ctx, dq_r.data(), dkv_r.data(), dout.data(), qkv.data(), kv.data(), out_r.data(),
                             lse_r.data(), qpos.data(), kpos.data(), qd, &k);
    double wq, wk;
    check(close_to(dq, dq_r, &dq0, R, 0, OC, 1e-5, &wq), std::string("attention_block_bwd dq ") + shape);
    check(close_to(dkv, dkv_r, &dkv0, KR, 0, KR, 1e-5, &wk), std::string("attention_block_bwd dkv ") + shape);
    bool kv_cols = true;
    for (size_t n = 0; n < (size_t)c.B * Tq; n++)
        kv_cols = kv_cols && !memcmp(&dq[n * R + OC], &dq0[n * R + OC], (R - OC) * sizeof(float));
    check(kv_cols, std::string("attention_block_bwd: dqkv's k and v columns untouched ") + shape);
    printf("  %s: %d rows without keys; worst out %.2e, lse %.2e, dq %.2e, dkv %.2e\n", shape, noKey, wo,
           wl / std::max(lmx, 1.0), wq, wk);

    if (twice) { /* a rerun: bit-identical */
        std::vector<float> out2(out.size(), NAN), lse2(lse.size(), NAN), dq2 = dq0, dkv2 = dkv0;
        attention_block_fwd(&emu_g, out2.data(), lse2.data(), qkv.data(), kv.data(), qpos.data(), kpos.data(), qd, &k);
        attention_block_bwd(&emu_g, dq2.data(), dkv2.data(), dout.data(), qkv.data(), kv.data(), out_r.data(),
                            lse_r.data(), qpos.data(), kpos.data(), qd, &k);
        check(!memcmp(out2.data(), out.data(), out.size() * 4) && !memcmp(lse2.data(), lse.data(), lse.size() * 4) &&
                  same_bits(dq2, dq) && same_bits(dkv2, dkv),
              std::string("rerun bit-identical ") + shape);
    }
}

/* ---- a whole ring, emulated ops against attention over the whole sequence ---- */

/* A CP group of cp ranks in one process, every op the emulated CUDA one: the
 * zigzag schedule (written here from mpi/cp_sched.h's description: step i
 * holds rank (r - i) mod cp's block; diagonal causal, lower steps all rows x
 * the block's first half, upper steps the second half of the rows x the
 * whole block, both unmasked), the forward's partial results merged in step
 * order, the backward's dq into each rank's dqkv and dk, dv into the block
 * owner's dkv, unpacked at the end. The reference is the CPU's attention_fwd
 * and attention_bwd over the whole sequence (positions as documents when
 * given), each rank's rows compared: out, lse and dqkv within 1e-5. */
static void test_ring(int B, int T, int cp, int NH, int NKV, int HS, const std::vector<int> &doclen)
{
    const int L = T / cp, c = T / (2 * cp);
    const size_t R = (size_t)(NH + 2 * NKV) * HS, KR = (size_t)2 * NKV * HS, OC = (size_t)NH * HS;
    char shape[120];
    snprintf(shape, sizeof shape, "ring B %d T %d cp %d NH %d NKV %d HS %d%s", B, T, cp, NH, NKV, HS,
             doclen.empty() ? "" : " docs");
    /* the whole sequence and its reference */
    std::vector<float> qkv = randv((size_t)B * T * R, 2.0f), dout = randv((size_t)B * T * OC, 1.0f);
    std::vector<int32_t> pos; /* docmask positions: t - document start */
    if (!doclen.empty()) {
        std::vector<int32_t> all((size_t)T);
        for (int t = 0; t < T; t++)
            all[t] = t;
        const std::vector<int32_t> start = docs(B, T, all, doclen);
        for (size_t i = 0; i < start.size(); i++)
            pos.push_back((int32_t)(i % T) - start[i]);
    }
    const int32_t *ppos = pos.empty() ? NULL : pos.data();
    std::vector<float> rout((size_t)B * T * OC), rlse((size_t)B * NH * T), rdq((size_t)B * T * R);
    cpu->attention_fwd(cpu->ctx, rout.data(), NULL, rlse.data(), qkv.data(), ppos, B, T, NH, NKV, HS);
    cpu->attention_bwd(cpu->ctx, rdq.data(), NULL, dout.data(), qkv.data(), rout.data(), rlse.data(), ppos, B, T, NH,
                       NKV, HS);

    /* each rank's rows */
    std::vector<std::vector<int32_t>> lpos(cp), qdoc(cp);
    std::vector<std::vector<float>> lqkv(cp), ldout(cp), kv(cp), out(cp), lse(cp), dq(cp), dkv(cp);
    for (int r = 0; r < cp; r++) {
        lpos[r] = zigzag(T, cp, r);
        if (!doclen.empty())
            qdoc[r] = docs(B, T, lpos[r], doclen);
        lqkv[r].resize((size_t)B * L * R);
        ldout[r].resize((size_t)B * L * OC);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < L; t++) {
                const size_t g = (size_t)b * T + lpos[r][t], l = (size_t)b * L + t;
                memcpy(&lqkv[r][l * R], &qkv[g * R], R * sizeof(float));
                memcpy(&ldout[r][l * OC], &dout[g * OC], OC * sizeof(float));
            }
        kv[r].assign((size_t)B * L * KR, NAN);
        attention_kv_pack(&emu_g, kv[r].data(), lqkv[r].data(), B * L, NH, NKV, HS);
        out[r].assign((size_t)B * L * OC, NAN);
        lse[r].assign((size_t)B * NH * L, NAN);
        dq[r].assign((size_t)B * L * R, 0.0f);
        dkv[r].assign((size_t)B * L * KR, 0.0f);
    }
    auto step = [&](int r, int i, int *src) {
        *src = ((r - i) % cp + cp) % cp;
        att_block_t k = {B, NH, NKV, HS, L, 0, L, L, 0, L, 0};
        if (i == 0)
            k.causal = 1;
        else if (*src < r)
            k.nk = c;
        else
            k.q0 = c, k.nq = c;
        return k;
    };
    std::vector<float> pout((size_t)B * L * OC), plse((size_t)B * NH * L);
    for (int r = 0; r < cp; r++)
        for (int i = 0; i < cp; i++) {
            int src;
            const att_block_t k = step(r, i, &src);
            const int32_t *qd = qdoc[r].empty() ? NULL : qdoc[r].data();
            attention_block_fwd(&emu_g, i ? pout.data() : out[r].data(), i ? plse.data() : lse[r].data(),
                                lqkv[r].data(), kv[src].data(), lpos[r].data(), lpos[src].data(), qd, &k);
            if (i)
                attention_merge(&emu_g, out[r].data(), lse[r].data(), pout.data(), plse.data(), &k);
        }
    for (int r = 0; r < cp; r++)
        for (int i = 0; i < cp; i++) {
            int src;
            const att_block_t k = step(r, i, &src);
            const int32_t *qd = qdoc[r].empty() ? NULL : qdoc[r].data();
            attention_block_bwd(&emu_g, dq[r].data(), dkv[src].data(), ldout[r].data(), lqkv[r].data(), kv[src].data(),
                                out[r].data(), lse[r].data(), lpos[r].data(), lpos[src].data(), qd, &k);
        }
    /* gather every rank's rows into whole-sequence order and compare */
    std::vector<float> gout(rout.size()), glse(rlse.size()), gdq(rdq.size());
    for (int r = 0; r < cp; r++) {
        attention_kv_unpack(&emu_g, dq[r].data(), dkv[r].data(), B * L, NH, NKV, HS, 0);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < L; t++) {
                const size_t g = (size_t)b * T + lpos[r][t], l = (size_t)b * L + t;
                memcpy(&gout[g * OC], &out[r][l * OC], OC * sizeof(float));
                memcpy(&gdq[g * R], &dq[r][l * R], R * sizeof(float));
                for (int h = 0; h < NH; h++)
                    glse[((size_t)b * NH + h) * T + lpos[r][t]] = lse[r][((size_t)b * NH + h) * L + t];
            }
    }
    double wo, wl, wd;
    check(close_to(gout, rout, NULL, OC, 0, OC, 1e-5, &wo), std::string("out of the ") + shape);
    check(close_to(glse, rlse, NULL, 1, 0, 1, 1e-5, &wl), std::string("lse of the ") + shape);
    check(close_to(gdq, rdq, NULL, R, 0, R, 1e-5, &wd), std::string("dqkv of the ") + shape);
    printf("  %s against the whole sequence: worst out %.2e, lse %.2e, dqkv %.2e\n", shape, wo, wl, wd);
}

int main(int argc, char **argv)
{
    stop_early = argc > 1 && !strcmp(argv[1], "--stop");
    cpu = ops_cpu_create();
    if (!cpu) {
        printf("FAIL: no CPU ops\n");
        return 1;
    }
    ops_cpu_threads(1);

    test_pack(1, 4, 1, 3);
    test_pack(300, 4, 2, 16); /* over one 256-thread block */
    test_pack(7, 2, 2, 5);
    test_merge(1, 1, 1, 1, 0, 1);
    test_merge(2, 3, 17, 10, 3, 5);
    test_merge(3, 4, 64, 40, 0, 40);

    /* T = 2 per rank (cp 2, T 4), GQA 4:1: rank 0's query at 0 sees none of rank
     * 1's keys (1, 2); rank 1's diagonal */
    test_block({2, 4, 1, 16, 4, 2, 0, 1, 0, 2, 0, 2, 1, {}});
    test_block({2, 4, 1, 16, 4, 2, 1, 1, 0, 2, 0, 2, 1, {}}, true);
    /* cp 2, T 80: 40 rows a rank (two query tiles), documents crossing the chunk
     * edges (20, 40, 60), other per sequence */
    test_block({2, 4, 1, 16, 80, 2, 0, 0, 0, 40, 0, 40, 1, {7, 30, 13, 50}});
    test_block({2, 4, 2, 16, 80, 2, 0, 1, 0, 40, 0, 40, 1, {7, 30, 13, 50}});
    test_block({2, 4, 2, 16, 80, 2, 1, 0, 0, 40, 0, 40, 1, {25, 9, 41}});
    /* the schedule's half blocks: non-causal (keys before queries) */
    test_block({2, 4, 1, 16, 80, 2, 1, 0, 0, 40, 0, 20, 0, {}});
    test_block({1, 4, 4, 16, 80, 2, 0, 1, 20, 20, 0, 40, 0, {11, 33}});
    test_block({1, 2, 1, 16, 80, 2, 0, 1, 5, 30, 3, 33, 1, {}});
    /* cp 4, T 160: 40 rows, rank 3 against rank 1 with documents */
    test_block({1, 4, 1, 16, 160, 4, 3, 1, 0, 40, 0, 40, 1, {17, 45, 3, 70}});
    /* head sizes: two 64-column chunks; two column groups (HS > 256) */
    test_block({1, 2, 1, 72, 40, 2, 1, 1, 0, 20, 0, 20, 1, {6, 11}});
    test_block({1, 2, 2, 260, 12, 2, 0, 1, 0, 6, 0, 6, 1, {}});

    /* whole rings: cp 2 and 4, GQA 2:1 and MHA, documents crossing ranks */
    test_ring(1, 16, 2, 2, 1, 16, {});
    test_ring(2, 64, 2, 4, 2, 16, {5, 23, 9});
    test_ring(1, 96, 4, 2, 2, 16, {13, 40, 7});

    check(emu_bad_stream == 0, "every launch on the context's stream");
    ops_release(cpu);
    printf("%d checks, %d failed\n", checks, failed);
    return failed ? 1 : 0;
}
