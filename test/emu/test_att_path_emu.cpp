/* The CUDA backend's attention ops as the ops table runs them
 * (cuda/ops_cuda_attention.cuh: the path chosen, the bf16 copies, the
 * scratch buffer, the launches), on the CPU: the header's own host code,
 * with its kernels under emu_cuda.h's deterministic thread-block
 * emulation (mma.cuh's twins for the tensor-core instructions), against
 * src/backend/ops_cpu.c's attention_fwd and attention_bwd.
 *
 * The ops get fp32 qkv and dout, random and not bf16 values (qkv in
 * [-2, 2], dout in [-1, 1]), as the model hands them over:
 *  - tensor-core path (--dtype bf16, HS 64 and 128): the reference is the
 *    CPU's fp32 attention of the inputs rounded to bf16 (round to nearest
 *    even, base/bf16.h), so the pack's rounding, offsets and coverage are
 *    checked with the kernels. Bounds as test_att_mma_emu.cpp and
 *    test_att_mma_bwd_emu.cpp derive them: out within 2^-8 max |v|, lse
 *    within 2e-6 max |lse|; the backward (from the op's own out and lse on
 *    both sides) dQ, dK and dV each within 2^-7 of its max |ref|, plus for
 *    dQ and dK 2^-20 HS scale max |dout| max |v| max |q, k| (the fp32
 *    rounding of dP - D: all there is at T = 1).
 *  - fp32 path (--dtype fp32, or bf16 at another head size): the CPU's
 *    attention of the same fp32 inputs, within 1e-5 of the largest
 *    magnitude (test_kernels_emu's bound for these kernels).
 * The ops' bf16 outputs (out16, dqkv16: base/ops.h) must be, bit for bit,
 * the rounding of the fp32 outputs the ops wrote beside them, on both
 * paths. Every output starts as NaN (the bf16 ones as 0xffff) and the
 * scratch buffer as NaN bits (an element nobody writes fails). The launches are logged by name: each
 * case must run the kernels of its path and no others. One case runs
 * twice: bit-identical outputs, and the scratch reused, not grown.
 *
 * Shapes: T = 1; T not a multiple of the 64-row tiles; documents with
 * boundaries inside a tile and a key tile skipped; GQA 2:1, 4:1 and 8:1;
 * B = 2; HS 64 and 128; and the fp32 kernels at HS 96 under bf16 and at
 * HS 64 under fp32. Small, as the emulation starts a thread per CUDA
 * thread (36 s on two cores shared with other builds, load 8).
 *
 * A mutation check: test_att_path_mutants (att_path_mutants.sh) builds
 * this test against broken copies of the dispatch and its pack kernels,
 * and each must fail it (run with --stop: it ends at the first failing
 * case).
 *
 * Output: one line per failed check, per case's worst errors, a summary.
 * Exit 0 when all pass. */
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
typedef int cudaError_t;
static const cudaError_t cudaSuccess = 0;
static cudaStream_t const emu_stream = (cudaStream_t)0x5eed; /* g->stream: the only stream allowed */
static long emu_bad_stream, emu_mallocs;

static void cuda_fatal(const char *what, const char *msg)
{
    printf("FAIL cuda_fatal: %s: %s\n", what, msg);
    exit(1);
}

/* memory as NaN bits (0xffff...): an element the ops never write stays NaN */
static cudaError_t cudaMallocAsync(void **p, size_t n, cudaStream_t s)
{
    emu_bad_stream += s != emu_stream;
    emu_mallocs++;
    *p = malloc(n ? n : 1);
    if (*p)
        memset(*p, 0xff, n);
    return *p ? cudaSuccess : 2;
}

static cudaError_t cudaFreeAsync(void *p, cudaStream_t s)
{
    emu_bad_stream += s != emu_stream;
    free(p);
    return cudaSuccess;
}

/* the fields of cuda/ops_cuda_state.cuh's cu_t that the header reads */
struct cu_t {
    cudaStream_t stream;
    int att_bf16;
    void *att;
    size_t att_cap;
    unsigned long epoch; /* graph_epoch */
};
/* cuda/ops_cuda_state.cuh's: a grown buffer moves the graphs' epoch */
static void room_moved(cu_t *g, const char *) { g->epoch++; }

static void ck(cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess)
        cuda_fatal(what, "emulated CUDA error");
}
static void finish(cu_t *, const char *) {}

/* CU_LAUNCH: the kernel's name logged, the launch shape checked as CUDA
 * would, then every block under emu_cuda.h's schedule. */
static std::vector<std::string> emu_log;
struct EmuLaunch {
    dim3 grid;
    unsigned threads;
    EmuLaunch(const char *name, dim3 g, dim3 b, size_t smem, cudaStream_t s) : grid(g), threads(b.x)
    {
        emu_log.push_back(name);
        emu_bad_stream += s != emu_stream;
        if (g.y > 65535 || g.z > 65535 || b.y != 1 || b.z != 1 || smem != 0) {
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

#include "cuda/kernels/attention.cuh"
#include "cuda/kernels/attention_mma.cuh"
#include "cuda/kernels/attention_mma_bwd.cuh"
#include "cuda/ops_cuda_attention.cuh"

static const ops_t *cpu;
static int checks, failed;
static std::mt19937 rng(323);

/* Document positions for rows of T tokens: documents of the lengths len[0..],
 * cycling, restarting at each row (as the other emulation tests build them). */
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

static float bf16_round(float x) { return dt_bf16_to_f32(dt_f32_to_bf16(x)); }

/* An op's bf16 output (base/ops.h): got[i] the rounding of the fp32 value
 * f32[i] it wrote beside it, bit for bit (got starts as 0xffff, so an
 * element left unwritten fails too). */
static void check16(const char *op, const char *shape, const std::vector<uint16_t> &got, const std::vector<float> &f32)
{
    checks++;
    size_t bad = 0;
    for (size_t i = 0; i < got.size(); i++)
        bad += got[i] != dt_f32_to_bf16(f32[i]);
    if (bad) {
        printf("FAIL %s bf16 output %s: %zu of %zu elements not the rounding of the fp32 output\n", op, shape, bad,
               got.size());
        failed++;
    }
}

/* Elements of got[rows, R] in columns [c0, c1) out of |got - ref| <= rel
 * max |ref| + abs there (NaN fails); worst = max |err| / max |ref|. */
static size_t count_bad(const float *got, const float *ref, size_t rows, size_t R, size_t c0, size_t c1, double rel,
                        double abs_, double *worst)
{
    double mx = 0.0, err = 0.0;
    for (size_t n = 0; n < rows; n++)
        for (size_t c = c0; c < c1; c++)
            mx = std::max(mx, fabs((double)ref[n * R + c]));
    size_t bad = 0;
    for (size_t n = 0; n < rows; n++)
        for (size_t c = c0; c < c1; c++) {
            const double e = fabs((double)got[n * R + c] - (double)ref[n * R + c]);
            if (!(e <= rel * mx + abs_))
                bad++, err = INFINITY;
            else
                err = std::max(err, e);
        }
    *worst = mx > 0.0 ? err / mx : err;
    return bad;
}

/* The launches since `from` must be exactly `want`, in order. */
static void check_log(const char *shape, const char *op, size_t from, const std::vector<std::string> &want)
{
    checks++;
    std::vector<std::string> got(emu_log.begin() + (long)from, emu_log.end());
    if (got != want) {
        std::string g, w;
        for (auto &x : got)
            g += " " + x;
        for (auto &x : want)
            w += " " + x;
        printf("FAIL %s %s: launched%s; expected%s\n", op, shape, g.c_str(), w.c_str());
        failed++;
    }
}

static cu_t emu_g = {emu_stream, 0, NULL, 0, 0};

/* --stop (the mutation check): end at the first case that fails. */
static bool stop_early;
static void case_done(void)
{
    if (stop_early && failed) {
        printf("FAIL: stopped at the first failing case (--stop)\n");
        exit(1);
    }
}

/* One case through attention_fwd and attention_bwd of the header. */
static void test_path(int B, int T, int NH, int NKV, int HS, int bf16, const std::vector<int> &docs = {},
                      bool twice = false)
{
    char shape[112];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d HS=%d %s%s", B, T, NH, NKV, HS, bf16 ? "bf16" : "fp32",
             docs.empty() ? "" : " docs");
    const bool mma = bf16 && (HS == 64 || HS == 128);
    const size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HS, OC = (size_t)NH * HS, NL = (size_t)B * NH * T;
    std::vector<int32_t> posv = docs.empty() ? std::vector<int32_t>() : doc_positions(B, T, docs);
    const int32_t *pos = docs.empty() ? NULL : posv.data();
    std::uniform_real_distribution<float> u(-2, 2), ud(-1, 1);
    std::vector<float> qkv(N * R), dout(N * OC), qkv_r(N * R), dout_r(N * OC);
    for (size_t i = 0; i < qkv.size(); i++)
        qkv_r[i] = mma ? bf16_round(qkv[i] = u(rng)) : (qkv[i] = u(rng));
    for (size_t i = 0; i < dout.size(); i++)
        dout_r[i] = mma ? bf16_round(dout[i] = ud(rng)) : (dout[i] = ud(rng));
    double mq = 0.0, mv = 0.0, mdo = 0.0;
    for (size_t i = 0; i < qkv_r.size(); i++) {
        double &m = i % R < (size_t)(NH + NKV) * HS ? mq : mv;
        m = std::max(m, fabs((double)qkv_r[i]));
    }
    for (float x : dout_r)
        mdo = std::max(mdo, fabs((double)x));

    /* forward */
    emu_g.att_bf16 = bf16;
    std::vector<float> out(N * OC, NAN), lse(NL, NAN), rout(out.size()), rlse(lse.size());
    size_t from = emu_log.size();
    std::vector<uint16_t> out16(out.size(), 0xffff);
    attention_fwd(&emu_g, out.data(), out16.data(), lse.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    check16("attention_fwd", shape, out16, out);
    const std::string hs = std::to_string(HS), nc = std::to_string(att_nc(HS));
    check_log(shape, "attention_fwd", from,
              mma ? std::vector<std::string>{"k_att_pack_qkv", "k_att_fwd_mma<" + hs + ">"}
                  : std::vector<std::string>{"k_att_fwd<" + nc + ">"});
    cpu->attention_fwd(cpu->ctx, rout.data(), NULL, rlse.data(), qkv_r.data(), pos, B, T, NH, NKV, HS);
    double lmax = 0.0, w_out, w_lse;
    for (float x : rlse)
        lmax = std::max(lmax, fabs((double)x));
    checks += 2;
    const size_t bad_out = mma ? count_bad(out.data(), rout.data(), N, OC, 0, OC, 0.0, ldexp(mv, -8), &w_out)
                               : count_bad(out.data(), rout.data(), N, OC, 0, OC, 1e-5, 0.0, &w_out);
    if (bad_out) {
        printf("FAIL attention_fwd out %s: %zu elements out of bound\n", shape, bad_out);
        failed++;
    }
    const size_t bad_lse = count_bad(lse.data(), rlse.data(), 1, NL, 0, NL, 0.0, (mma ? 2e-6 : 1e-5) * lmax, &w_lse);
    if (bad_lse) {
        printf("FAIL attention_fwd lse %s: %zu elements out of bound\n", shape, bad_lse);
        failed++;
    }

    /* backward, from the op's own out and lse on both sides */
    std::vector<float> dqkv(N * R, NAN), ref(N * R, NAN);
    from = emu_log.size();
    std::vector<uint16_t> dqkv16(dqkv.size(), 0xffff);
    attention_bwd(&emu_g, dqkv.data(), dqkv16.data(), dout.data(), qkv.data(), out.data(), lse.data(), pos, B, T, NH,
                  NKV, HS);
    check16("attention_bwd", shape, dqkv16, dqkv);
    check_log(shape, "attention_bwd", from,
              mma ? std::vector<std::string>{"k_att_bwd_dot<HS>", "k_att_bwd_dkv_mma<HS>", "k_att_bwd_dq_mma<HS>"}
                  : std::vector<std::string>{"k_att_bwd_dq<NC>", "k_att_bwd_dkv<NC>"});
    cpu->attention_bwd(cpu->ctx, ref.data(), NULL, dout_r.data(), qkv_r.data(), out.data(), lse.data(), pos, B, T, NH,
                       NKV, HS);
    const double floor_qk = mma ? ldexp(HS * mdo * mv * mq / sqrt((double)HS), -20) : 0.0;
    const size_t c0[4] = {0, OC, (size_t)(NH + NKV) * HS, R};
    double worst[3];
    for (int gi = 0; gi < 3; gi++) {
        checks++;
        double big = 0.0;
        if (!mma) /* 1e-5 of the largest magnitude of the whole dqkv */
            for (float x : ref)
                big = std::max(big, fabs((double)x));
        const size_t bad =
            mma ? count_bad(dqkv.data(), ref.data(), N, R, c0[gi], c0[gi + 1], ldexp(1.0, -7), gi < 2 ? floor_qk : 0.0,
                            &worst[gi])
                : count_bad(dqkv.data(), ref.data(), N, R, c0[gi], c0[gi + 1], 0.0, 1e-5 * big, &worst[gi]);
        if (bad) {
            printf("FAIL attention_bwd %s %s: %zu elements out of bound\n",
                   gi == 0   ? "dq"
                   : gi == 1 ? "dk"
                             : "dv",
                   shape, bad);
            failed++;
        }
    }
    printf("%s: max |err| / max |ref|: out %.3g, lse %.3g, dQ %.3g, dK %.3g, dV %.3g\n", shape, w_out, w_lse, worst[0],
           worst[1], worst[2]);

    case_done();
    if (!twice)
        return;
    const long mallocs = emu_mallocs;
    std::vector<float> out2(out.size(), NAN), lse2(lse.size(), NAN), dqkv2(dqkv.size(), NAN);
    /* without the bf16 outputs: the fp32 ones the same bits */
    attention_fwd(&emu_g, out2.data(), NULL, lse2.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    attention_bwd(&emu_g, dqkv2.data(), NULL, dout.data(), qkv.data(), out.data(), lse.data(), pos, B, T, NH, NKV, HS);
    checks++;
    if (memcmp(out.data(), out2.data(), out.size() * sizeof(float)) ||
        memcmp(lse.data(), lse2.data(), lse.size() * sizeof(float)) ||
        memcmp(dqkv.data(), dqkv2.data(), dqkv.size() * sizeof(float)))
        printf("FAIL %s: second run not bit-identical\n", shape), failed++;
    checks++;
    if (emu_mallocs != mallocs)
        printf("FAIL %s: the second run grew the scratch buffer again\n", shape), failed++;
    case_done();
}

int main(int argc, char **argv)
{
    stop_early = argc > 1 && strcmp(argv[1], "--stop") == 0;
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    ops_cpu_threads(1);
    (void)grid_for; /* common.cuh's, for the elementwise kernels this test does not launch */
    /* the path and the banner's reason */
    char line[320];
    checks++;
    if (att_path(1, 64) != ATT_PATH_MMA || att_path(1, 128) != ATT_PATH_MMA || att_path(1, 96) != ATT_PATH_FP32 ||
        att_path(0, 64) != ATT_PATH_FP32) {
        printf("FAIL att_path: tensor cores under bf16 at head sizes 64 and 128 only\n");
        failed++;
    }
    att_path_describe(1, 128, line, sizeof line);
    printf("bf16, HS 128: %s\n", line);
    att_path_describe(1, 96, line, sizeof line);
    printf("bf16, HS 96: %s\n", line);
    att_path_describe(0, 64, line, sizeof line);
    printf("fp32, HS 64: %s\n", line);

    test_path(1, 1, 4, 1, 64, 1);                   /* T = 1, GQA 4:1 */
    test_path(2, 1, 1, 1, 128, 1);                  /* T = 1, HS 128, B = 2 */
    test_path(1, 20, 8, 1, 64, 1, {}, true);        /* GQA 8:1, a partial tile; twice */
    test_path(1, 70, 4, 1, 128, 1);                 /* HS 128, GQA 4:1, two tiles */
    test_path(1, 130, 2, 1, 64, 1, {1, 37, 5, 70}); /* documents inside tiles, a key tile skipped */
    test_path(1, 37, 2, 1, 96, 1);                  /* bf16, another head size: fp32 kernels */
    test_path(1, 37, 4, 2, 64, 0, {5, 20});         /* --dtype fp32: fp32 kernels */
    checks++;
    if (emu_bad_stream) {
        printf("FAIL: %ld calls on a stream other than the context's\n", emu_bad_stream);
        failed++;
    }
    free(emu_g.att);
    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    ops_release(cpu);
    return failed ? 1 : 0;
}
