/* The tensor-core attention backward (cuda/kernels/attention_mma_bwd.cuh) on
 * the CPU: its three kernels, with mma.cuh's emulation twins, under the
 * deterministic thread-block emulation of emu_cuda.h, against
 * src/backend/ops_cpu.c's attention_bwd. qkv random in [-2, 2] and dout in
 * [-1, 1], rounded to bf16, with out and lse from the tensor-core forward
 * (k_att_fwd_mma; out rounded to bf16): k_att_bwd_dot and the CPU get the
 * values as fp32 (so both form D from the same out), and k_att_bwd_dot
 * writes the bf16 bits of qkv and dout that kernels 2 and 3 read (the
 * dispatch, test_att_path_emu.cpp, gives values that are not bf16).
 *
 * Bound: every element of dQ, dK and dV within 2^-7 of the largest |element|
 * of that gradient (per shape and tensor), plus for dQ and dK an absolute
 * 2^-20 HS scale max |dout| max |v| max |q, k|; NaN fails (dqkv starts NaN,
 * so an element no block writes fails too). Where it comes from: each
 * product summed into a gradient has one factor rounded to bf16 (P for dV,
 * dS for dK and dQ: 2^-9 relative), and the sums, over at most T terms of
 * random sign, grow their rounding errors like their own size, not like
 * their worst case: 4 x 2^-9 of max |grad| leaves room for that. The
 * absolute part is the fp32 rounding of dP - D (dot products of HS terms
 * up to max |dout| max |v|, 2^-24 relative each, scaled into dQ and dK),
 * which decides when the true dQ and dK vanish: at T = 1 (one key: P = 1,
 * dS = dP - D = 0 exactly) both sides hold only rounding noise. The worst
 * ratios are printed per shape: about 2^-10 to 2^-8.8 of max |grad| (0.5 at
 * T = 1, HS 128: noise of 1.7e-7 against noise of 3.3e-7, the absolute part
 * 4e-5); the mutations below are off by orders of magnitude more.
 *
 * Also: the backward run twice gives bit-identical dqkv (fixed summation
 * order, no atomics). And the checks catch a broken kernel: with the
 * backward run mutated (the forward clean) - an mma A fragment's rows g and
 * g + 8 swapped, an ldmatrix row taken from the wrong lane (mma.cuh's
 * mma_emu_mutation 1 and 2), each __syncthreads of the kernels dropped in
 * turn (emu_cuda.h's emu_drop_syncthreads), each cp_async_wait dropped in
 * turn (mma.cuh's cp_async_emu_drop_wait), every one in each role it plays
 * (mutations() counts them) - the comparison must fail; each catch is
 * printed with its count of wrong elements. These hooks live in the
 * emulation only: the kernels have no test switches.
 *
 * Shapes: T = 1; T not a multiple of the 64-row tiles (and of the 32- and
 * 16-row steps); B = 2; GQA 1:1, 4:1 and 8:1; head sizes 64 and 128;
 * documents with boundaries inside tiles and whole tiles skipped.
 *
 * Output: one line per failed check, per shape's worst errors, per mutation
 * caught; a summary. Exit 0 when all pass. */
extern "C" {
#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"
}

#include "test/emu/emu_cuda.h"

#include <cmath>
#include <random>

#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/attention_mma_bwd.cuh"

static const ops_t *cpu;
static int checks, failed;
static std::mt19937 rng(322);

/* Document positions for rows of T tokens: documents of the lengths len[0..],
 * cycling, restarting at each row (as test_att_mma_emu builds them). */
static std::vector<int32_t> doc_positions(int B, int T, const std::vector<int> &len)
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

/* One attention problem, inputs and the CPU's answer. */
struct problem {
    int B, T, NH, NKV, HS;
    std::vector<int32_t> posv;
    const int32_t *pos;
    std::vector<uint16_t> qkv_bf, dout_bf, out_bf; /* out_bf: the tensor-core forward's */
    std::vector<float> out_f, dout_f, qkv_f;       /* out_bf, dout_bf, qkv_bf widened: what kernel 1 reads */
    std::vector<uint16_t> dout16, qkv16;           /* kernel 1's bf16 copies, which kernels 2 and 3 read */
    std::vector<float> lse, ref;                   /* lse: the tensor-core forward's; ref: the CPU's dqkv */
    std::vector<float> D;                          /* the backward's D, kept for the mutation runs */
    double floor_qk;                               /* the bound's absolute part for dQ and dK */
    char shape[96];
};

static void setup(problem &p, int B, int T, int NH, int NKV, int HS, const std::vector<int> &docs)
{
    p.B = B, p.T = T, p.NH = NH, p.NKV = NKV, p.HS = HS;
    snprintf(p.shape, sizeof p.shape, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS, docs.empty() ? "" : " docs");
    p.posv = docs.empty() ? std::vector<int32_t>() : doc_positions(B, T, docs);
    p.pos = docs.empty() ? NULL : p.posv.data();
    const size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HS, OC = (size_t)NH * HS;
    std::uniform_real_distribution<float> u(-2, 2), ud(-1, 1);
    p.qkv_bf.resize(N * R);
    p.dout_bf.resize(N * OC);
    std::vector<float> qkv(N * R), dout(N * OC);
    for (size_t i = 0; i < qkv.size(); i++)
        qkv[i] = dt_bf16_to_f32(p.qkv_bf[i] = dt_f32_to_bf16(u(rng)));
    for (size_t i = 0; i < dout.size(); i++)
        dout[i] = dt_bf16_to_f32(p.dout_bf[i] = dt_f32_to_bf16(ud(rng)));
    double mq = 0.0, mk = 0.0, mv = 0.0, mdo = 0.0;
    for (size_t i = 0; i < qkv.size(); i++) {
        const size_t c = i % R;
        double &m = c < OC ? mq : c < (size_t)(NH + NKV) * HS ? mk : mv;
        m = std::max(m, fabs((double)qkv[i]));
    }
    for (float x : dout)
        mdo = std::max(mdo, fabs((double)x));
    p.floor_qk = ldexp(HS * mdo * mv * std::max(mq, mk) / sqrt((double)HS), -20);

    std::vector<float> out(N * OC, NAN);
    p.lse.assign((size_t)B * NH * T, NAN);
    float *po = out.data(), *pl = p.lse.data();
    const uint16_t *pq = p.qkv_bf.data();
    const int32_t *pos = p.pos;
    const float scale = 1.0f / sqrtf((float)HS);
    const dim3 grid(att_mma_tiles(T), (unsigned)NH, (unsigned)B);
    if (HS == 64)
        emu_launch(grid, ATTM_THREADS, [=] { k_att_fwd_mma<64>(po, NULL, pl, pq, pos, T, NH, NKV, scale); });
    else
        emu_launch(grid, ATTM_THREADS, [=] { k_att_fwd_mma<128>(po, NULL, pl, pq, pos, T, NH, NKV, scale); });
    p.out_bf.resize(out.size());
    for (size_t i = 0; i < out.size(); i++)
        out[i] = dt_bf16_to_f32(p.out_bf[i] = dt_f32_to_bf16(out[i]));
    p.out_f = out;
    p.dout_f = dout;
    p.dout16 = p.dout_bf; /* kernel 1 writes them again, the same bits */
    p.qkv16 = p.qkv_bf;
    p.qkv_f = qkv;

    p.ref.assign(N * R, NAN);
    cpu->attention_bwd(cpu->ctx, p.ref.data(), NULL, dout.data(), qkv.data(), out.data(), p.lse.data(), p.pos, B, T, NH,
                       NKV, HS);
}

/* The launches of the backward. */
enum { L_DOT = 1, L_DKV = 2, L_DQ = 4, L_ALL = 7 };

/* The launches `run` of the backward (D in p.D, gradients into dqkv, which
 * the caller sized); the mutation hooks mma_emu_mutation,
 * emu_drop_syncthreads and cp_async_emu_drop_wait (mut[0..2]) are live
 * only during those of `mutated`. */
template <int HS> static void backward(problem &p, std::vector<float> &dqkv, int run, int mutated, const int mut[3])
{
    const int B = p.B, T = p.T, NH = p.NH, NKV = p.NKV;
    float *pd = p.D.data(), *pg = dqkv.data();
    const uint16_t *pq = p.qkv16.data(), *pdo = p.dout16.data();
    uint16_t *pdw = p.dout16.data(), *pqw = p.qkv16.data();
    const float *pof = p.out_f.data(), *pdof = p.dout_f.data(), *pqf = p.qkv_f.data();
    const float *pl = p.lse.data();
    const int32_t *pos = p.pos;
    const float scale = 1.0f / sqrtf((float)HS);
    auto hooks = [&](int launch) {
        const bool on = (mutated & launch) != 0;
        mma_emu_mutation = on ? mut[0] : 0;
        emu_drop_syncthreads = on ? (unsigned)mut[1] : 0;
        cp_async_emu_drop_wait = on ? (unsigned)mut[2] : 0;
    };
    if (run & L_DOT) {
        hooks(L_DOT);
        emu_launch(dim3(att_mma_dot_blocks((size_t)B * T * (NH + 2 * NKV))), ATTM_THREADS,
                   [=] { k_att_bwd_dot<HS>(pd, pdw, pqw, pof, pdof, pqf, B, T, NH, NKV); });
    }
    if (run & L_DKV) {
        hooks(L_DKV);
        emu_launch(dim3(att_mma_tiles(T), (unsigned)NKV, (unsigned)B), ATTM_THREADS,
                   [=] { k_att_bwd_dkv_mma<HS>(pg, NULL, pq, pdo, pl, pd, pos, T, NH, NKV, scale); });
    }
    if (run & L_DQ) {
        hooks(L_DQ);
        emu_launch(dim3(att_mma_tiles(T), (unsigned)NH, (unsigned)B), ATTM_THREADS,
                   [=] { k_att_bwd_dq_mma<HS>(pg, NULL, pq, pdo, pl, pd, pos, T, NH, NKV, scale); });
    }
    hooks(0);
}

/* The whole backward, unmutated, from NaN (an element no block writes fails). */
static void run_backward(problem &p, std::vector<float> &dqkv)
{
    static const int none[3] = {0, 0, 0};
    p.D.assign((size_t)p.B * p.NH * p.T, NAN);
    dqkv.assign(p.ref.size(), NAN);
    if (p.HS == 64)
        backward<64>(p, dqkv, L_ALL, 0, none);
    else
        backward<128>(p, dqkv, L_ALL, 0, none);
}

/* Elements of dqkv out of bound against the CPU, per gradient (dQ, dK, dV:
 * column ranges of the rows), each bound 2^-7 of that gradient's max |ref|;
 * worst[3] receives each gradient's max |err| / max |ref|. */
static size_t count_bad(const problem &p, const std::vector<float> &got, double worst[3])
{
    const size_t R = (size_t)(p.NH + 2 * p.NKV) * p.HS, N = (size_t)p.B * p.T;
    const size_t c0[4] = {0, (size_t)p.NH * p.HS, (size_t)(p.NH + p.NKV) * p.HS, R};
    size_t bad = 0;
    for (int gi = 0; gi < 3; gi++) {
        double mx = 0.0, err = 0.0;
        for (size_t n = 0; n < N; n++)
            for (size_t c = c0[gi]; c < c0[gi + 1]; c++)
                mx = std::max(mx, fabs((double)p.ref[n * R + c]));
        const double tol = ldexp(mx, -7) + (gi < 2 ? p.floor_qk : 0.0);
        for (size_t n = 0; n < N; n++)
            for (size_t c = c0[gi]; c < c0[gi + 1]; c++) {
                const double e = fabs((double)got[n * R + c] - (double)p.ref[n * R + c]);
                if (!(e <= tol)) {
                    bad++;
                    err = INFINITY;
                } else {
                    err = std::max(err, e);
                }
            }
        worst[gi] = mx > 0.0 ? err / mx : err;
    }
    return bad;
}

static void test_bwd(int B, int T, int NH, int NKV, int HS, const std::vector<int> &docs = {}, bool twice = false)
{
    problem p;
    setup(p, B, T, NH, NKV, HS, docs);
    std::vector<float> g1, g2;
    run_backward(p, g1);
    double worst[3];
    checks++;
    const size_t bad = count_bad(p, g1, worst);
    if (bad) {
        printf("FAIL attention_bwd_mma %s: %zu elements out of bound\n", p.shape, bad);
        failed++;
    }
    printf("%s: max |err| / max |grad|: dQ %.3g, dK %.3g, dV %.3g\n", p.shape, worst[0], worst[1], worst[2]);
    if (!twice)
        return;
    run_backward(p, g2);
    checks++;
    if (memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)) != 0) {
        printf("FAIL attention_bwd_mma %s: second run not bit-identical\n", p.shape);
        failed++;
    }
}

/* The launch `which` of p's backward rerun mutated by mut (the others' results
 * and D from the clean run `clean`, its own columns reset to NaN) must fail. */
static void expect_caught(problem &p, const std::vector<float> &clean, const char *what, int which, const int mut[3])
{
    std::vector<float> g(clean);
    const size_t R = (size_t)(p.NH + 2 * p.NKV) * p.HS, c0 = which == L_DQ ? 0 : (size_t)p.NH * p.HS,
                 c1 = which == L_DQ ? (size_t)p.NH * p.HS : R;
    for (size_t n = 0; n < (size_t)p.B * p.T; n++)
        for (size_t c = c0; c < c1; c++)
            g[n * R + c] = NAN;
    if (p.HS == 64)
        backward<64>(p, g, which, which, mut);
    else
        backward<128>(p, g, which, which, mut);
    double worst[3];
    const size_t bad = count_bad(p, g, worst);
    checks++;
    if (bad) {
        printf("caught: %s (%zu elements wrong)\n", what, bad);
    } else {
        printf("FAIL mutation not caught: %s\n", what);
        failed++;
    }
}

/* Each mutation of the two mma kernels (B = 1, one head, HS 64), each on the
 * smallest shape that runs every barrier and wait of its code in every role:
 *   k_att_bwd_dkv_mma at T = 64: one key tile, steps of rows 0 and 32. Per
 *     step a wait and a barrier for dO, a wait and a barrier for Q and,
 *     before the next step's refills, a barrier before each: barriers 1 .. 4
 *     and waits 1, 2 in step 0 (whose first wait also lands K and V),
 *     barriers 5, 6 and waits 3, 4 in step 1; further steps repeat step 1.
 *   k_att_bwd_dq_mma at T = 100: query tile 1 (rows 64..99, spanning three
 *     warps: the emulation runs warp 0 ahead, so a race shows in the lagging
 *     warps' rows) over key tiles 0 and 1. The staging wait and its barrier,
 *     the barrier after the fragments, per key tile a wait and a barrier for
 *     V and for K and, on tile 0 (before the refills), a barrier before
 *     each: 8 barriers, 5 waits.
 * Barriers and waits are dropped one at a time by their count along a
 * block's run (every block drops its n-th; the counts above are the longest
 * block's, which the emulation runs first). */
static void mutations(void)
{
    const struct {
        const char *name;
        int which, T, barriers, waits;
    } launches[2] = {{"dkv", L_DKV, 64, 6, 4}, {"dq", L_DQ, 100, 8, 5}};
    char what[96];
    for (const auto &l : launches) {
        problem p;
        setup(p, 1, l.T, 1, 1, 64, {});
        std::vector<float> clean;
        run_backward(p, clean);
        for (int m = 1; m <= 2; m++) {
            const int mut[3] = {m, 0, 0};
            snprintf(what, sizeof what, "%s: %s", l.name,
                     m == 1 ? "mma A rows g, g + 8 swapped" : "ldmatrix row from the wrong lane");
            expect_caught(p, clean, what, l.which, mut);
        }
        for (int n = 1; n <= l.barriers; n++) {
            const int mut[3] = {0, n, 0};
            snprintf(what, sizeof what, "%s: __syncthreads %d of a block dropped", l.name, n);
            expect_caught(p, clean, what, l.which, mut);
        }
        for (int n = 1; n <= l.waits; n++) {
            const int mut[3] = {0, 0, n};
            snprintf(what, sizeof what, "%s: cp_async_wait %d of a block dropped", l.name, n);
            expect_caught(p, clean, what, l.which, mut);
        }
    }
}

int main(void)
{
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    ops_cpu_threads(1);
    test_bwd(1, 1, 4, 1, 64);   /* T = 1, GQA 4:1 */
    test_bwd(1, 1, 1, 1, 128);  /* T = 1, HS 128 */
    test_bwd(2, 20, 2, 2, 64);  /* two batch rows, 1:1 */
    test_bwd(1, 20, 8, 1, 64);  /* GQA 8:1, a partial tile */
    test_bwd(1, 70, 2, 1, 128); /* HS 128, GQA 2:1, two tiles, a partial one */
    /* documents starting at 0, 1, 38, 43, 113, 114: boundaries inside tiles,
     * single tokens; key tile 0 skips the rows from 128 on (their documents
     * start at 114), query tile 2 (rows 128..) skips key tile 0; twice:
     * bit-identical */
    test_bwd(1, 150, 1, 1, 64, {1, 37, 5, 70}, true);
    mutations();
    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    ops_release(cpu);
    return failed ? 1 : 0;
}
