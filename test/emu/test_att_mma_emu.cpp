/* The tensor-core attention forward (cuda/kernels/attention_mma.cuh) on the
 * CPU: its kernel, with mma.cuh's emulation twins, under the deterministic
 * thread-block emulation of emu_cuda.h, against src/backend/ops_cpu.c's
 * attention_fwd on the same inputs (qkv random in [-2, 2], rounded to bf16,
 * given to the kernel as bf16 and to the CPU as the fp32 values).
 *
 * Bounds: out within 2^-8 max |v| of the CPU's, every element (P is rounded
 * to bf16 for P V: 2^-9 relative each; the header derives the bound), and
 * lse within 2e-6 of the largest |lse| (fp32 arithmetic in another order,
 * exp2 against exp). Shapes: T = 1; T not a multiple of the 64-row tiles;
 * GQA 4:1 and 2:1; head sizes 64 and 128; several query tiles, whose
 * causally later key tiles are skipped; rows packed with documents (tiles
 * before a block's first document start skipped, the rest masked).
 *
 * Output: one line per failed check, a summary. Exit 0 when all pass. */
extern "C" {
#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"
}

#include "test/emu/emu_cuda.h"

#include <cmath>
#include <random>

#include "cuda/kernels/attention_mma.cuh"

static const ops_t *cpu;
static int checks, failed;
static std::mt19937 rng(321);

/* |got - want| <= tol for every element (NaN fails); reports the first. */
static void check(const char *what, const char *shape, const float *got, const float *want, size_t n, double tol)
{
    checks++;
    for (size_t i = 0; i < n; i++)
        if (!(fabs((double)got[i] - (double)want[i]) <= tol)) {
            printf("FAIL %s %s: element %zu: %.9g, cpu %.9g (bound %.3g)\n", what, shape, i, got[i], want[i], tol);
            failed++;
            return;
        }
}

/* Document positions for rows of T tokens: documents of the lengths len[0..],
 * cycling, restarting at each row (as test_kernels_emu builds them). */
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

static void test_att(int B, int T, int NH, int NKV, int HS, const std::vector<int> &docs = {})
{
    char shape[96];
    snprintf(shape, sizeof shape, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS, docs.empty() ? "" : " docs");
    const size_t N = (size_t)B * T, R = (size_t)(NH + 2 * NKV) * HS, OC = (size_t)NH * HS;
    std::vector<int32_t> posv = docs.empty() ? std::vector<int32_t>() : doc_positions(B, T, docs);
    const int32_t *pos = docs.empty() ? NULL : posv.data();
    std::uniform_real_distribution<float> u(-2, 2);
    std::vector<uint16_t> qkv_bf(N * R);
    std::vector<float> qkv(N * R);
    float vmax = 0.0f;
    for (size_t i = 0; i < qkv.size(); i++) {
        qkv_bf[i] = dt_f32_to_bf16(u(rng));
        qkv[i] = dt_bf16_to_f32(qkv_bf[i]);
        if (i % R >= (size_t)(NH + NKV) * HS)
            vmax = std::max(vmax, fabsf(qkv[i]));
    }
    std::vector<float> out(N * OC, NAN), lse((size_t)B * NH * T, NAN), rout(out.size()), rlse(lse.size());
    cpu->attention_fwd(cpu->ctx, rout.data(), NULL, rlse.data(), qkv.data(), pos, B, T, NH, NKV, HS);
    const float scale = 1.0f / sqrtf((float)HS);
    float *po = out.data(), *pl = lse.data();
    const uint16_t *pq = qkv_bf.data();
    const dim3 grid(att_mma_tiles(T), (unsigned)NH, (unsigned)B);
    if (HS == 64)
        emu_launch(grid, ATTM_THREADS, [=] { k_att_fwd_mma<64>(po, NULL, pl, pq, pos, T, NH, NKV, scale); });
    else
        emu_launch(grid, ATTM_THREADS, [=] { k_att_fwd_mma<128>(po, NULL, pl, pq, pos, T, NH, NKV, scale); });
    double lmax = 0.0;
    for (float x : rlse)
        lmax = std::max(lmax, fabs((double)x));
    check("attention_fwd_mma out", shape, out.data(), rout.data(), out.size(), ldexp((double)vmax, -8));
    check("attention_fwd_mma lse", shape, lse.data(), rlse.data(), lse.size(), 2e-6 * lmax);
}

int main(void)
{
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    ops_cpu_threads(1);
    checks++;
    if (att_mma_supported(96) || !att_mma_supported(64) || !att_mma_supported(128)) {
        printf("FAIL att_mma_supported: head sizes 64 and 128 only\n");
        failed++;
    }
    test_att(1, 1, 4, 1, 64);                   /* T = 1, GQA 4:1 */
    test_att(1, 1, 1, 1, 128);                  /* T = 1, HS 128 */
    test_att(1, 50, 8, 2, 64);                  /* GQA 4:1 in two groups, a partial tile */
    test_att(2, 20, 2, 1, 64);                  /* two batch rows, GQA 2:1 */
    test_att(1, 100, 1, 1, 128);                /* HS 128, two query tiles, a partial one */
    test_att(1, 130, 1, 1, 64, {1, 37, 5, 70}); /* documents across tile edges, single tokens */
    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    ops_release(cpu);
    return failed ? 1 : 0;
}
