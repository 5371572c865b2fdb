/* The tensor-core primitives of cuda/kernels/mma.cuh (mma.sync m16n8k16 bf16,
 * ldmatrix, cp.async, the shared-tile swizzle) checked on the CPU, element by
 * element, through their emulation twins, in warp kernels
 * (mma_test_kernels.cuh) run by the deterministic thread-block emulation of
 * emu_cuda.h.
 *
 *  (a) mma: random bf16 A[16][16], B[16][8], fp32 C[16][8] placed into
 *      fragments by the ISA's closed forms; D equals C + sum over k = 0..15
 *      of A B in fp32 in k order (the order the twin states; bf16 products
 *      are exact in fp32) bit for bit, also with D accumulated into C.
 *  (b) ldmatrix x1, x2, x4, plain and .trans, from rows at scattered
 *      addresses: every register of every lane equals the ISA's elements
 *      (row lane / 4, columns 2 (lane % 4) + 0, 1; .trans the transpose),
 *      registers beyond x1/x2 untouched, the poison rows that lanes past 8N
 *      point at never read.
 *  (c) ldmatrix feeding mma: A by an x4, B from [k][n] by an x4 .trans (a V
 *      tile) and from [n][k] by an x4 (a K tile): the 16x16 product, bit for
 *      bit against the k-ordered fp32 sum.
 *  (d) cp.async of 64 x 64 and 32 x 128 tiles (strided source rows, partial
 *      tiles zero-filled) into swizzled shared memory, two commit groups,
 *      wait_group 1 then 0: read back through the swizzle equals the source
 *      (zeros past the valid rows) bit for bit; and the swizzle itself is a
 *      bijection whose 8 rows at one logical chunk hit 8 different 16-byte
 *      bank groups (conflict-free ldmatrix).
 *  (e) a GEMM of 64 x 64 block tiles, 4 warps, double-buffered cp.async,
 *      on 64 x 128 x 192 and 50 x 70 x 128 (partial tiles): equal bit for
 *      bit to the k-ordered fp32 product (the emulated order is sequential
 *      across mma calls too), and within K 2^-24 sum_k |a b| of the double
 *      product, the bound any order of fp32 sums meets (what a run on the
 *      device would be held to).
 * Then the proof that these checks catch broken code: each of (i) A rows g
 * and g + 8 exchanged in the mma twin, (ii) ldmatrix rows taken from the
 * wrong lane, (iii) the GEMM without cp_async_wait, (iv) without the
 * __syncthreads after it and (v) without the __syncthreads before a stage is
 * refilled must make its checks fail (the deterministic schedule, warp 0
 * running ahead, and the cp.async twin's poisoned destinations make (iii) to
 * (v) fail every run, not by chance).
 *
 * Output: one line per failed check, one per mutation caught, a summary. Exit 0 when all pass. */
extern "C" {
#include "base/bf16.h"
}

#include "test/emu/emu_cuda.h"
#include "test/emu/mma_test_kernels.cuh"

#include <cmath>
#include <random>
#include <set>

static std::mt19937 rng(20261129);
static std::vector<uint16_t> rbf16(size_t n, float lo, float hi)
{
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<uint16_t> v(n);
    for (uint16_t &x : v)
        x = dt_f32_to_bf16(u(rng));
    return v;
}
static float bf(uint16_t h) { return dt_bf16_to_f32(h); }

static bool quiet; /* the mutation runs: count mismatches, report none */
static int checks, failed;

/* Elements of got that differ from want in their bits; the first reported. */
template <typename T> static int diff_bits(const char *what, const T *got, const T *want, size_t n)
{
    int bad = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&got[i], &want[i], sizeof(T)) != 0 && bad++ == 0 && !quiet)
            printf("FAIL %s: element %zu: %.9g, want %.9g\n", what, i, (double)got[i], (double)want[i]);
    return bad;
}

static void expect_pass(const char *what, int bad)
{
    checks++;
    if (bad) {
        printf("FAIL %s: %d elements wrong\n", what, bad);
        failed++;
    }
}

static void expect_caught(const char *mutation, int bad)
{
    checks++;
    if (bad) {
        printf("caught: %s (%d elements wrong)\n", mutation, bad);
    } else {
        printf("FAIL mutation not caught: %s\n", mutation);
        failed++;
    }
}

/* ---- (a) mma ---- */
static int test_mma(int trials)
{
    int bad = 0;
    for (int trial = 0; trial < trials; trial++) {
        std::vector<uint16_t> A = rbf16(256, -2, 2), B = rbf16(128, -2, 2);
        std::vector<float> C(128), D(128), want(128);
        std::uniform_real_distribution<float> u(-4, 4);
        for (float &c : C)
            c = u(rng);
        const int in_place = trial % 2;
        emu_launch(dim3(1), 32, [&] { k_mma_tile(D.data(), A.data(), B.data(), C.data(), in_place); });
        for (int r = 0; r < 16; r++)
            for (int n = 0; n < 8; n++) {
                float acc = C[r * 8 + n];
                for (int k = 0; k < 16; k++)
                    acc += bf(A[r * 16 + k]) * bf(B[k * 8 + n]);
                want[r * 8 + n] = acc;
            }
        bad += diff_bits(in_place ? "mma (in place)" : "mma", D.data(), want.data(), 128);
    }
    return bad;
}

/* ---- (b) ldmatrix ---- */
static int test_ldmatrix()
{
    int bad = 0;
    for (unsigned nmat = 1; nmat <= 4; nmat *= 2)
        for (int trans = 0; trans < 2; trans++) {
            std::vector<uint16_t> mats(256); /* [m][row][col], distinct values */
            for (size_t i = 0; i < mats.size(); i++)
                mats[i] = (uint16_t)(0x1000 + 7 * i);
            std::vector<uint32_t> out(128, 0xffffffffu), want(128, 0);
            emu_launch(dim3(1), 32, [&] { k_ldmatrix(out.data(), mats.data(), nmat, trans); });
            for (unsigned lane = 0; lane < 32; lane++)
                for (unsigned m = 0; m < nmat; m++) {
                    const unsigned q = lane / 4, e = 2 * (lane % 4);
                    const uint16_t *M = &mats[64 * m];
                    const uint32_t lo = trans ? M[e * 8 + q] : M[q * 8 + e],
                                   hi = trans ? M[(e + 1) * 8 + q] : M[q * 8 + e + 1];
                    want[lane * 4 + m] = lo | hi << 16;
                }
            char what[48];
            snprintf(what, sizeof what, "ldmatrix x%u%s ([lane][reg])", nmat, trans ? " .trans" : "");
            bad += diff_bits(what, out.data(), want.data(), out.size());
        }
    return bad;
}

/* ---- (c) ldmatrix feeding mma ---- */
static int test_ldmatrix_mma()
{
    int bad = 0;
    for (int bt = 0; bt < 2; bt++) {
        std::vector<uint16_t> A = rbf16(256, -2, 2), B = rbf16(256, -2, 2);
        std::vector<float> D(256), want(256);
        emu_launch(dim3(1), 32, [&] { k_ldmatrix_mma(D.data(), A.data(), B.data(), bt); });
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 16; n++) {
                float acc = 0.0f;
                for (int k = 0; k < 16; k++)
                    acc += bf(A[m * 16 + k]) * bf(bt ? B[n * 16 + k] : B[k * 16 + n]);
                want[m * 16 + n] = acc;
            }
        bad +=
            diff_bits(bt ? "ldmatrix x4 (A, K tile [n][k]) + mma" : "ldmatrix x4, x4 .trans (A, V tile [k][n]) + mma",
                      D.data(), want.data(), 256);
    }
    return bad;
}

/* ---- (d) cp.async into swizzled shared memory ---- */
template <unsigned LD> static int test_cp_async(unsigned rows, unsigned ld, unsigned nvalid)
{
    std::vector<uint16_t> src0 = rbf16((size_t)rows * ld, -8, 8), src1 = rbf16((size_t)rows * ld, -8, 8);
    std::vector<uint16_t> out0(rows * LD), out1(rows * LD), want0(rows * LD, 0), want1(rows * LD, 0);
    emu_launch(dim3(1), CPT_THREADS,
               [&] { k_cp_async_tile<LD>(out0.data(), out1.data(), src0.data(), src1.data(), rows, ld, nvalid); });
    for (unsigned r = 0; r < nvalid; r++)
        for (unsigned c = 0; c < LD; c++) {
            want0[r * LD + c] = src0[(size_t)r * ld + c];
            want1[r * LD + c] = src1[(size_t)r * ld + c];
        }
    return diff_bits("cp.async group 0 (wait_group 1)", out0.data(), want0.data(), out0.size()) +
           diff_bits("cp.async group 1 (wait_group 0)", out1.data(), want1.data(), out1.size());
}

/* smem_swizzle over [rows][ld]: a bijection, and the 8 rows of each 8-row
 * group at one logical chunk on 8 different 16-byte bank groups. */
static int test_swizzle(unsigned rows, unsigned ld)
{
    int bad = 0;
    std::vector<char> hit((size_t)rows * ld, 0);
    for (unsigned r = 0; r < rows; r++)
        for (unsigned c = 0; c < ld; c++) {
            const unsigned o = smem_swizzle(r, c, ld);
            bad += o >= rows * ld || hit[o]++ || o % 8 != c % 8; /* in range, once, whole chunks */
        }
    for (unsigned r0 = 0; r0 < rows; r0 += 8)
        for (unsigned c = 0; c < ld; c += 8) {
            std::set<unsigned> banks;
            for (unsigned r = r0; r < r0 + 8; r++)
                banks.insert(smem_swizzle(r, c, ld) * 2 / 16 % 8);
            bad += banks.size() != 8;
        }
    if (bad && !quiet)
        printf("FAIL smem_swizzle [%u][%u]: %d\n", rows, ld, bad);
    return bad;
}

/* ---- (e) GEMM: C[M][N] = A[M][K] B[N][K]^T ---- */
static int test_gemm(int M, int N, int K, int skip)
{
    std::vector<uint16_t> A = rbf16((size_t)M * K, -1, 1), B = rbf16((size_t)N * K, -1, 1);
    std::vector<float> C((size_t)M * N, NAN), want(C.size());
    const dim3 grid((N + GEMM_BN - 1) / GEMM_BN, (M + GEMM_BM - 1) / GEMM_BM);
    emu_launch(grid, CPT_THREADS, [&] { k_gemm_bf16(C.data(), A.data(), B.data(), M, N, K, skip); });
    int out_of_bound = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            float acc = 0.0f;
            double exact = 0.0, mag = 0.0;
            for (int k = 0; k < K; k++) {
                const float p = bf(A[(size_t)m * K + k]) * bf(B[(size_t)n * K + k]);
                acc += p;
                exact += p, mag += fabs(p);
            }
            want[(size_t)m * N + n] = acc;
            const double err = fabs((double)C[(size_t)m * N + n] - exact);
            if (!(err <= K * ldexp(1.0, -24) * mag) && out_of_bound++ == 0 && !quiet)
                printf("FAIL gemm %dx%dx%d [%d][%d]: %.9g, exact %.12g, bound %.3g\n", M, N, K, m, n,
                       C[(size_t)m * N + n], exact, K * ldexp(1.0, -24) * mag);
        }
    char what[64];
    snprintf(what, sizeof what, "gemm %dx%dx%d (k-ordered fp32)", M, N, K);
    return out_of_bound + diff_bits(what, C.data(), want.data(), C.size());
}

int main(void)
{
    expect_pass("(a) mma m16n8k16", test_mma(8));
    expect_pass("(b) ldmatrix", test_ldmatrix());
    expect_pass("(c) ldmatrix + mma", test_ldmatrix_mma());
    expect_pass("(d) swizzle 64x64", test_swizzle(64, 64));
    expect_pass("(d) swizzle 32x128", test_swizzle(32, 128));
    expect_pass("(d) cp.async 64x64, ld 72, 64 rows", test_cp_async<64>(64, 72, 64));
    expect_pass("(d) cp.async 32x128, ld 128, 29 rows", test_cp_async<128>(32, 128, 29));
    expect_pass("(e) gemm 64x128x192", test_gemm(64, 128, 192, 0));
    expect_pass("(e) gemm 50x70x128", test_gemm(50, 70, 128, 0));

    quiet = true;
    mma_emu_mutation = 1;
    expect_caught("(i) mma A rows g and g + 8 exchanged", test_mma(2));
    mma_emu_mutation = 2;
    expect_caught("(ii) ldmatrix row from the wrong lane", test_ldmatrix());
    expect_caught("(ii) ldmatrix row from the wrong lane, into mma", test_ldmatrix_mma());
    mma_emu_mutation = 0;
    expect_caught("(iii) gemm without cp_async_wait", test_gemm(64, 64, 128, 1));
    expect_caught("(iv) gemm without __syncthreads after the wait", test_gemm(64, 64, 128, 2));
    expect_caught("(v) gemm without __syncthreads before a stage is reused", test_gemm(64, 64, 192, 3));
    quiet = false;

    printf("%s: %d of %d checks failed\n", failed ? "FAIL" : "PASS", failed, checks);
    return failed ? 1 : 0;
}
