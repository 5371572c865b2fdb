/* ops_cuda.cu's GEMM path run on the host against the CPU ops table.
 *
 * The code under test is the CUDA backend's own, included as ops_cuda.cu
 * includes it (cuda/ops_cuda_gemm.cuh and what it includes): the cuBLASLt
 * plan cache, lt_gemm, gemm_fwd/gemm_bwd, the column-sum kernels, the
 * bias/GELU kernels and the matmul ops (fp32 and bf16, plain and
 * GELU-fused), and ops_cuda_create's cuBLAS handle setup (blas_init). It runs
 * against cublaslt_shim.h, a host emulation of cuBLASLt, cuBLAS and the
 * runtime with the documented semantics, and its results are compared with
 * src/backend/ops_cpu.c's (OpenBLAS). No GPU is needed: this checks how the CUDA
 * backend maps each op onto column-major GEMMs (transposes, leading
 * dimensions, beta, epilogues and their AUX_LD, the fallbacks when the
 * heuristic finds nothing, alignment-keyed plans), which the GPU tests
 * (test/gpu/) can only check where a GPU is.
 *
 * Every shape below runs under every heuristic policy (cublaslt_shim.h's
 * Policy: each forces one of the fallback paths), for fp32 and bf16
 * operands, with buffers aligned and misaligned by one element, for:
 *   matmul_fwd, matmul_gelu_fwd: bias and none;
 *   matmul_bwd: every subset of din/dw/db, each accumulate flag;
 *   matmul_dgelu_bwd: din with every subset of dw/db, accumulate dw or not;
 *   gmm_fwd, gmm_bwd (ops_cuda_gmm.cuh, against the CPU's grouped ops): 1
 *   to 8 groups with empty ones first, between and last, bias or not,
 *   din with and without dw/db, accumulating, with the GELU's pre, IC = 0
 *   and OC = 0; fp32 must reach cublasGemmGroupedBatchedEx, whose
 *   emulation refuses the bf16-in fp32-out types cuBLAS does not list.
 * Each output must match the CPU's to 1e-5 of its largest magnitude (the
 * emulation sums in double, the CPU in fp32), outputs not asked for must be
 * left as they were, a second call (plans reused) must give the same bits,
 * and the policy must have taken the path it forces. db with dw comes from
 * the dW GEMM's BGRADB epilogue where the policy offers it: under bf16 it
 * sums dout16 = bf16(dout), so it must be within 2^-8 sum |dout| of the
 * CPU's and, to 1e-5, the sum of the widened dout16 (cmp_db16).
 *
 * Output: one line per failed check, one per policy (what ran), a summary.
 * Exit 0 when all pass, 1 otherwise. `test_gemm_emu POLICY` runs one policy. */
#include "cublaslt_shim.h"
extern "C" {
#include "src/backend/ops_cpu.h"
}
#include "cuda/device.h"

#include "cuda/ops_cuda_gemm.cuh"
#include "cuda/ops_cuda_gmm.cuh"

#include <cmath>
#include <random>
#include <stdarg.h>
#include <string>

static std::mt19937 rng(12345);
static float urand(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

/* An array of n fp32 or bf16 elements; with off = 1 it starts one element
 * into its allocation (4- or 2-byte aligned: the misaligned case cuBLASLt
 * must be asked about) and the element before it is a guard that neither
 * side may write. */
static const float GUARD_F = -12345.678f;
static const uint16_t GUARD_H = 0xdead;
struct Buf {
    void *base = nullptr;
    size_t n = 0, es = 4;
    int off = 0;
    float *f() const { return (float *)((char *)base + off * es); }
    uint16_t *h() const { return (uint16_t *)((char *)base + off * es); }
    void alloc(size_t n_, size_t es_, int off_)
    {
        n = n_;
        es = es_;
        off = off_;
        size_t bytes = (n + off) * es;
        base = malloc(bytes ? bytes : es); /* malloc(0) may return NULL */
        if (off && es == 4)
            memcpy(base, &GUARD_F, 4);
        else if (off)
            memcpy(base, &GUARD_H, 2);
    }
    bool guard_ok() const
    {
        return !off || (es == 4 ? memcmp(base, &GUARD_F, 4) == 0 : memcmp(base, &GUARD_H, 2) == 0);
    }
    Buf() = default;
    Buf(const Buf &) = delete;
    Buf &operator=(const Buf &) = delete;
    ~Buf() { free(base); }
};

static void fill_f(Buf &b, size_t n, int off, float lo, float hi)
{
    b.alloc(n, 4, off);
    for (size_t i = 0; i < n; i++)
        b.f()[i] = urand(lo, hi);
}
static void fill_h(Buf &b, size_t n, int off)
{
    b.alloc(n, 2, off);
    for (size_t i = 0; i < n; i++)
        b.h()[i] = dt_f32_to_bf16(urand(-1, 1));
}
/* dout16 as the model has it: the bf16 rounding of the fp32 dout */
static void round_h(Buf &b, const Buf &f, size_t n, int off)
{
    b.alloc(n, 2, off);
    for (size_t i = 0; i < n; i++)
        b.h()[i] = dt_f32_to_bf16(f.f()[i]);
}
/* identical output arrays for each side: NaN where the op writes (so an
 * element left unwritten shows), random where it accumulates */
static void out_set(std::initializer_list<Buf *> bs, size_t n, int off, bool accum)
{
    for (Buf *b : bs)
        b->alloc(n, 4, off);
    for (size_t i = 0; i < n; i++) {
        float v = accum ? urand(-1, 1) : NAN;
        for (Buf *b : bs)
            b->f()[i] = v;
    }
}

static long n_cases, n_checks, n_fail;
static std::string cur_case;

static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL [%s] ", cur_case.c_str());
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
    n_fail++;
}

/* emu against cpu, element by element: within 1e-5 of the largest |cpu|,
 * or NaN on both sides where the output was not asked for */
static void cmp(const char *name, const Buf &cpu, const Buf &emu, bool requested)
{
    n_checks++;
    if (!cpu.guard_ok())
        fail("%s: the CPU op wrote before its array", name);
    if (!emu.guard_ok())
        fail("%s: the CUDA op wrote before its array", name);
    double mx = 0;
    for (size_t i = 0; i < cpu.n; i++)
        if (std::isfinite(cpu.f()[i]))
            mx = fmax(mx, fabs(cpu.f()[i]));
    double tol = 1e-5 * mx;
    long bad = 0;
    size_t first = 0;
    for (size_t i = 0; i < cpu.n; i++) {
        float c = cpu.f()[i], e = emu.f()[i];
        bool ok = std::isnan(c) ? std::isnan(e) && !requested : !std::isnan(e) && fabs((double)c - e) <= tol;
        if (!ok && !bad++)
            first = i;
    }
    if (bad)
        fail("%s: %ld of %zu elements differ, first [%zu]: cpu %.9g cuda %.9g (tol %.3g)", name, bad, cpu.n, first,
             cpu.f()[first], emu.f()[first], tol);
}
static void same_bits(const char *name, const Buf &a, const Buf &b)
{
    n_checks++;
    if (memcmp(a.f(), b.f(), a.n * 4) != 0)
        fail("%s: the second call (plans reused) differs in bits from the first", name);
}

/* An op's bf16 output (base/ops.h): got[i] the rounding dt_f32_to_bf16 of
 * the fp32 value f32[i] the op computed, bit for bit, for all n. */
static void same_bf16(const char *name, const std::vector<uint16_t> &got, const float *f32, size_t n)
{
    n_checks++;
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += got[i] != dt_f32_to_bf16(f32[i]);
    if (bad)
        fail("%s: %zu of %zu bf16 values are not the rounding of the fp32 ones", name, bad, n);
}

/* db[G, OC] under bf16 operands, against the CPU's (the row sums of the
 * fp32 dout over each group's rows offs[x] .. offs[x+1]): the BGRADB
 * epilogue sums the bf16 dout16 = bf16(dout) instead, so db may differ by
 * the bf16 rounding of dout, at most 2^-8 sum_n |dout[n, j]| (8
 * significant bits), beyond the 1e-5 of summation order. And the path's
 * own sum, to 1e-5: fused 1, the sums of the widened dout16 (the
 * epilogue's), 0 the CPU's (colsum of the fp32 dout), 2 either (the
 * grouped ops choose per group). acc0: db before the call (accumulating),
 * else NULL. */
static void cmp_db16(const Buf &cpu, const Buf &emu, const Buf &dout, const Buf &dout16, const float *acc0,
                     const int32_t *offs, int G, int OC, int fused)
{
    n_checks++;
    double mx = 0;
    for (size_t i = 0; i < cpu.n; i++)
        mx = fmax(mx, fabs(cpu.f()[i]));
    for (int x = 0; x < G; x++)
        for (int j = 0; j < OC; j++) {
            double abs_sum = 0, s16 = acc0 ? acc0[(size_t)x * OC + j] : 0.0;
            for (int r = offs[x]; r < offs[x + 1]; r++) {
                abs_sum += fabs(dout.f()[(size_t)r * OC + j]);
                s16 += dt_bf16_to_f32(dout16.h()[(size_t)r * OC + j]);
            }
            const size_t i = (size_t)x * OC + j;
            const double c = cpu.f()[i], e = emu.f()[i], tol = 1e-5 * mx;
            if (!(fabs(e - c) <= ldexp(abs_sum, -8) + tol)) {
                fail("db[%d, %d]: cuda %.9g, cpu %.9g: beyond the bf16 bound %.3g", x, j, e, c, ldexp(abs_sum, -8) + tol);
                return;
            }
            const bool is16 = fabs(e - s16) <= tol, is32 = fabs(e - c) <= tol;
            if (!(fused == 2 ? is16 || is32 : fused ? is16 : is32)) {
                fail("db[%d, %d]: cuda %.9g, not the %s sum (bf16 dout %.9g, fp32 dout %.9g)", x, j, e,
                     fused == 2 ? "epilogue's or colsum's" : fused ? "epilogue's" : "colsum's", s16, c);
                return;
            }
        }
}

/* run a CUDA op; a cuda_fatal in it is one failed check */
#define GUARDED(call)                                                                                                  \
    do {                                                                                                               \
        emu_fatal_armed = 1;                                                                                           \
        if (setjmp(emu_fatal_jmp) == 0)                                                                                \
            call;                                                                                                      \
        else                                                                                                           \
            fail("%s", emu_fatal_msg);                                                                                 \
        emu_fatal_armed = 0;                                                                                           \
    } while (0)

static const ops_t *cpu;
static cu_t emu_g; /* the CUDA backend's context, set up in main as ops_cuda_create does */

/* matmul_fwd[_bf16] or matmul_gelu_fwd[_bf16]:
 * out, pre (N, OC) = in (N, IC) w (OC, IC)^T + bias (OC) */
static void t_fwd(bool bf16, int N, int IC, int OC, bool bias, int off, bool gelu)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%s%s N=%d IC=%d OC=%d bias=%d off=%d", gelu ? "matmul_gelu_fwd" : "matmul_fwd",
             bf16 ? "_bf16" : "", N, IC, OC, bias, off);
    cur_case = nm;
    n_cases++;
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    Buf in, w, b, out_c, out_e, out_e2, pre_c, pre_e, pre_e2;
    if (bf16) {
        fill_h(in, nin, off);
        fill_h(w, nw, off);
    } else {
        fill_f(in, nin, off, -1, 1);
        fill_f(w, nw, off, -1, 1);
    }
    fill_f(b, OC, off, -1, 1);
    const float *bp = bias ? b.f() : NULL;
    out_set({&out_c, &out_e, &out_e2}, nout, off, false);
    out_set({&pre_c, &pre_e, &pre_e2}, nout, off, false);
    if (!gelu && !bf16) {
        cpu->matmul_fwd(cpu->ctx, out_c.f(), in.f(), w.f(), bp, N, IC, OC);
        GUARDED(matmul_fwd(&emu_g, out_e.f(), in.f(), w.f(), bp, N, IC, OC));
        GUARDED(matmul_fwd(&emu_g, out_e2.f(), in.f(), w.f(), bp, N, IC, OC));
    } else if (!gelu) {
        cpu->matmul_fwd_bf16(cpu->ctx, out_c.f(), in.h(), w.h(), bp, N, IC, OC);
        GUARDED(matmul_fwd_bf16(&emu_g, out_e.f(), in.h(), w.h(), bp, N, IC, OC));
        GUARDED(matmul_fwd_bf16(&emu_g, out_e2.f(), in.h(), w.h(), bp, N, IC, OC));
    } else if (!bf16) {
        cpu->matmul_gelu_fwd(cpu->ctx, out_c.f(), pre_c.f(), in.f(), w.f(), bp, N, IC, OC);
        GUARDED(matmul_gelu_fwd(&emu_g, out_e.f(), pre_e.f(), in.f(), w.f(), bp, N, IC, OC));
        GUARDED(matmul_gelu_fwd(&emu_g, out_e2.f(), pre_e2.f(), in.f(), w.f(), bp, N, IC, OC));
    } else {
        cpu->matmul_gelu_fwd_bf16(cpu->ctx, out_c.f(), NULL, pre_c.f(), in.h(), w.h(), bp, N, IC, OC);
        GUARDED(matmul_gelu_fwd_bf16(&emu_g, out_e.f(), NULL, pre_e.f(), in.h(), w.h(), bp, N, IC, OC));
        GUARDED(matmul_gelu_fwd_bf16(&emu_g, out_e2.f(), NULL, pre_e2.f(), in.h(), w.h(), bp, N, IC, OC));
        /* with the bf16 output (the separate GELU kernel writes it): both
         * copies, then the bf16 one alone */
        std::vector<float> o3(nout), p3(nout);
        std::vector<uint16_t> o16(nout, 0xffff), o16b(nout, 0xffff);
        GUARDED(matmul_gelu_fwd_bf16(&emu_g, o3.data(), o16.data(), p3.data(), in.h(), w.h(), bp, N, IC, OC));
        same_bf16("out16", o16, o3.data(), nout);
        GUARDED(matmul_gelu_fwd_bf16(&emu_g, NULL, o16b.data(), p3.data(), in.h(), w.h(), bp, N, IC, OC));
        same_bf16("out16 (out NULL)", o16b, o3.data(), nout);
    }
    cmp("out", out_c, out_e, true);
    same_bits("out", out_e, out_e2);
    if (gelu) {
        cmp("pre", pre_c, pre_e, true);
        same_bits("pre", pre_e, pre_e2);
    }
    if (!in.guard_ok() || !w.guard_ok() || !b.guard_ok())
        fail("an input's guard overwritten");
}

/* matmul_bwd[_bf16] or matmul_dgelu_bwd[_bf16], the outputs in mask (bit 0
 * din (N, IC), 1 dw (OC, IC), 2 db (OC)) from dout (N, OC), in, w and, for
 * dgelu, pre (N, IC). The bf16 ops take dout twice: dout16, its bf16
 * rounding, for the GEMMs (and db by the BGRADB epilogue), the fp32 dout
 * for db by colsum; a GEMM on the fp32 dout would miss by its rounding,
 * far over 1e-5. db under bf16: cmp_db16. */
static void t_bwd(bool bf16, int N, int IC, int OC, int mask, int acc_din, int acc_dw, int off, bool gelu)
{
    char nm[200];
    snprintf(nm, sizeof nm, "%s%s N=%d IC=%d OC=%d din=%d dw=%d db=%d acc_din=%d acc_dw=%d off=%d",
             gelu ? "matmul_dgelu_bwd" : "matmul_bwd", bf16 ? "_bf16" : "", N, IC, OC, mask & 1, (mask >> 1) & 1,
             (mask >> 2) & 1, acc_din, acc_dw, off);
    cur_case = nm;
    n_cases++;
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    Buf dout, dout16, in, w, pre, din_c, din_e, din_e2, dw_c, dw_e, dw_e2, db_c, db_e, db_e2;
    fill_f(dout, nout, off, -1, 1);
    if (bf16) {
        round_h(dout16, dout, nout, off);
        fill_h(in, nin, off);
        fill_h(w, nw, off);
    } else {
        fill_f(in, nin, off, -1, 1);
        fill_f(w, nw, off, -1, 1);
    }
    fill_f(pre, nin, off, -4, 4);
    out_set({&din_c, &din_e, &din_e2}, nin, off, acc_din);
    out_set({&dw_c, &dw_e, &dw_e2}, nw, off, acc_dw);
    out_set({&db_c, &db_e, &db_e2}, OC, off, acc_dw);
    const std::vector<float> db0(db_c.f(), db_c.f() + OC);
    /* which path wrote db on the first call: the epilogue or colsum */
    const long bgrad0 = emu_g.plans.bgrad_fused, sep0 = emu_g.plans.bgrad_separate;
    long bgrad1 = 0, sep1 = 0;
#define P(b, bit) ((mask & (bit)) ? (b).f() : NULL)
#define FIRST_PATH() (bgrad1 = emu_g.plans.bgrad_fused - bgrad0, sep1 = emu_g.plans.bgrad_separate - sep0)
    if (!gelu && !bf16) {
        cpu->matmul_bwd(cpu->ctx, P(din_c, 1), P(dw_c, 2), P(db_c, 4), dout.f(), in.f(), w.f(), N, IC, OC, acc_din,
                        acc_dw);
        GUARDED(matmul_bwd(&emu_g, P(din_e, 1), P(dw_e, 2), P(db_e, 4), dout.f(), in.f(), w.f(), N, IC, OC, acc_din,
                           acc_dw));
        FIRST_PATH();
        GUARDED(matmul_bwd(&emu_g, P(din_e2, 1), P(dw_e2, 2), P(db_e2, 4), dout.f(), in.f(), w.f(), N, IC, OC, acc_din,
                           acc_dw));
    } else if (!gelu) {
        cpu->matmul_bwd_bf16(cpu->ctx, P(din_c, 1), P(dw_c, 2), P(db_c, 4), dout16.h(), dout.f(), in.h(), w.h(), N, IC,
                             OC, acc_din, acc_dw);
        GUARDED(matmul_bwd_bf16(&emu_g, P(din_e, 1), P(dw_e, 2), P(db_e, 4), dout16.h(), dout.f(), in.h(), w.h(), N, IC,
                                OC, acc_din, acc_dw));
        FIRST_PATH();
        GUARDED(matmul_bwd_bf16(&emu_g, P(din_e2, 1), P(dw_e2, 2), P(db_e2, 4), dout16.h(), dout.f(), in.h(), w.h(), N,
                                IC, OC, acc_din, acc_dw));
    } else if (!bf16) {
        cpu->matmul_dgelu_bwd(cpu->ctx, P(din_c, 1), P(dw_c, 2), P(db_c, 4), dout.f(), in.f(), pre.f(), w.f(), N, IC,
                              OC, acc_dw);
        GUARDED(matmul_dgelu_bwd(&emu_g, P(din_e, 1), P(dw_e, 2), P(db_e, 4), dout.f(), in.f(), pre.f(), w.f(), N, IC,
                                 OC, acc_dw));
        FIRST_PATH();
        GUARDED(matmul_dgelu_bwd(&emu_g, P(din_e2, 1), P(dw_e2, 2), P(db_e2, 4), dout.f(), in.f(), pre.f(), w.f(), N,
                                 IC, OC, acc_dw));
    } else {
        cpu->matmul_dgelu_bwd_bf16(cpu->ctx, P(din_c, 1), NULL, P(dw_c, 2), P(db_c, 4), dout16.h(), dout.f(), in.h(),
                                   pre.f(), w.h(), N, IC, OC, acc_dw);
        GUARDED(matmul_dgelu_bwd_bf16(&emu_g, P(din_e, 1), NULL, P(dw_e, 2), P(db_e, 4), dout16.h(), dout.f(),
                                      in.h(), pre.f(), w.h(), N, IC, OC, acc_dw));
        FIRST_PATH();
        GUARDED(matmul_dgelu_bwd_bf16(&emu_g, P(din_e2, 1), NULL, P(dw_e2, 2), P(db_e2, 4), dout16.h(), dout.f(),
                                      in.h(), pre.f(), w.h(), N, IC, OC, acc_dw));
        /* din alone with its bf16 output (the separate GELU kernel writes both) */
        std::vector<float> d3(nin);
        std::vector<uint16_t> d16(nin, 0xffff);
        GUARDED(matmul_dgelu_bwd_bf16(&emu_g, d3.data(), d16.data(), NULL, NULL, dout16.h(), dout.f(), in.h(),
                                      pre.f(), w.h(), N, IC, OC, acc_dw));
        same_bf16("din16", d16, d3.data(), nin);
    }
#undef P
#undef FIRST_PATH
    /* outputs not asked for compare equal only if both sides left them */
    cmp("din", din_c, din_e, mask & 1);
    cmp("dw", dw_c, dw_e, mask & 2);
    if (bf16 && (mask & 4)) {
        const int32_t offs[2] = {0, N};
        cmp_db16(db_c, db_e, dout, dout16, acc_dw ? db0.data() : NULL, offs, 1, OC, bgrad1 > 0 ? 1 : 0);
    } else {
        cmp("db", db_c, db_e, mask & 4);
    }
    /* db by the dW GEMM's epilogue exactly when dw and db are both wanted
     * (N, IC, OC > 0) and cuBLASLt offered the epilogue, else by colsum */
    n_checks++;
    const bool both = (mask & 6) == 6 && N > 0 && IC > 0 && OC > 0;
    if (bgrad1 + sep1 != (both ? 1 : 0))
        fail("db: %ld epilogue and %ld separate dW GEMMs counted, expected %d", bgrad1, sep1, both ? 1 : 0);
    same_bits("din", din_e, din_e2);
    same_bits("dw", dw_e, dw_e2);
    same_bits("db", db_e, db_e2);
    if (!dout.guard_ok() || !in.guard_ok() || !w.guard_ok() || !pre.guard_ok() || (bf16 && !dout16.guard_ok()))
        fail("an input's guard overwritten");
}

/* The grouped GEMMs (ops_cuda_gmm.cuh's gmm_fwd, gmm_bwd and their bf16
 * forms) against the CPU's (src/backend/ops_cpu_gmm.c): G groups with the
 * row counts rows[0..G) (0 allowed), weights [G, OC, IC], biases [G, OC];
 * outputs as t_fwd/t_bwd check them (mask: 1 din, 2 dw, 4 db). */
static void t_gmm(bool bf16, const int *rows, int G, int IC, int OC, bool bias, int mask, int acc_din, int acc_dw,
                  bool pre_on, int off)
{
    int32_t offs[16] = {0};
    for (int x = 0; x < G; x++)
        offs[x + 1] = offs[x] + rows[x];
    const int R = offs[G];
    char nm[200];
    snprintf(nm, sizeof nm, "gmm%s G=%d R=%d IC=%d OC=%d bias=%d din=%d dw=%d db=%d acc_din=%d acc_dw=%d pre=%d off=%d",
             bf16 ? "_bf16" : "", G, R, IC, OC, bias, mask & 1, (mask >> 1) & 1, (mask >> 2) & 1, acc_din, acc_dw,
             pre_on, off);
    cur_case = nm;
    n_cases++;
    const size_t nin = (size_t)R * IC, nw = (size_t)G * OC * IC, nout = (size_t)R * OC, nb = (size_t)G * OC;
    Buf in, w, b, dout, dout16, pre, out_c, out_e, out_e2;
    Buf din_c, din_e, din_e2, dw_c, dw_e, dw_e2, db_c, db_e, db_e2;
    fill_f(dout, nout, off, -1, 1);
    if (bf16) {
        fill_h(in, nin, off);
        fill_h(w, nw, off);
        round_h(dout16, dout, nout, off);
    } else {
        fill_f(in, nin, off, -1, 1);
        fill_f(w, nw, off, -1, 1);
    }
    fill_f(b, nb, off, -1, 1);
    fill_f(pre, nin, off, -4, 4);
    const float *bp = bias ? b.f() : NULL, *pp = pre_on ? pre.f() : NULL;
    out_set({&out_c, &out_e, &out_e2}, nout, off, false);
    out_set({&din_c, &din_e, &din_e2}, nin, off, acc_din);
    out_set({&dw_c, &dw_e, &dw_e2}, nw, off, acc_dw);
    out_set({&db_c, &db_e, &db_e2}, nb, off, acc_dw);
    const std::vector<float> db0(db_c.f(), db_c.f() + nb);
#define P(x, bit) ((mask & (bit)) ? (x).f() : NULL)
    if (bf16) {
        cpu->gmm_fwd_bf16(cpu->ctx, out_c.f(), in.h(), w.h(), bp, offs, G, IC, OC);
        GUARDED(gmm_fwd_bf16(&emu_g, out_e.f(), in.h(), w.h(), bp, offs, G, IC, OC));
        GUARDED(gmm_fwd_bf16(&emu_g, out_e2.f(), in.h(), w.h(), bp, offs, G, IC, OC));
        cpu->gmm_bwd_bf16(cpu->ctx, P(din_c, 1), P(dw_c, 2), P(db_c, 4), dout16.h(), dout.f(), in.h(), pp, w.h(), offs,
                          G, IC, OC, acc_din, acc_dw);
        GUARDED(gmm_bwd_bf16(&emu_g, P(din_e, 1), P(dw_e, 2), P(db_e, 4), dout16.h(), dout.f(), in.h(), pp, w.h(), offs,
                             G, IC, OC, acc_din, acc_dw));
        GUARDED(gmm_bwd_bf16(&emu_g, P(din_e2, 1), P(dw_e2, 2), P(db_e2, 4), dout16.h(), dout.f(), in.h(), pp, w.h(),
                             offs, G, IC, OC, acc_din, acc_dw));
    } else {
        cpu->gmm_fwd(cpu->ctx, out_c.f(), in.f(), w.f(), bp, offs, G, IC, OC);
        GUARDED(gmm_fwd(&emu_g, out_e.f(), in.f(), w.f(), bp, offs, G, IC, OC));
        GUARDED(gmm_fwd(&emu_g, out_e2.f(), in.f(), w.f(), bp, offs, G, IC, OC));
        cpu->gmm_bwd(cpu->ctx, P(din_c, 1), P(dw_c, 2), P(db_c, 4), dout.f(), in.f(), pp, w.f(), offs, G, IC, OC,
                     acc_din, acc_dw);
        GUARDED(gmm_bwd(&emu_g, P(din_e, 1), P(dw_e, 2), P(db_e, 4), dout.f(), in.f(), pp, w.f(), offs, G, IC, OC,
                        acc_din, acc_dw));
        GUARDED(gmm_bwd(&emu_g, P(din_e2, 1), P(dw_e2, 2), P(db_e2, 4), dout.f(), in.f(), pp, w.f(), offs, G, IC, OC,
                        acc_din, acc_dw));
    }
#undef P
    cmp("out", out_c, out_e, true);
    cmp("din", din_c, din_e, mask & 1);
    cmp("dw", dw_c, dw_e, mask & 2);
    if (bf16 && (mask & 4))
        cmp_db16(db_c, db_e, dout, dout16, acc_dw ? db0.data() : NULL, offs, G, OC, 2);
    else
        cmp("db", db_c, db_e, mask & 4);
    same_bits("out", out_e, out_e2);
    same_bits("din", din_e, din_e2);
    same_bits("dw", dw_e, dw_e2);
    same_bits("db", db_e, db_e2);
    if (!in.guard_ok() || !w.guard_ok() || !b.guard_ok() || !dout.guard_ok() || !pre.guard_ok() ||
        (bf16 && !dout16.guard_ok()))
        fail("an input's guard overwritten");
}

/* the grouped cases' row counts: empty groups first, between and last */
static const int gmm_rows_[][8] = {{5}, {0, 9}, {3, 0, 17, 1}, {1, 0, 0, 130, 7, 0}, {0, 2, 33, 0, 4, 1, 0, 8}};

/* (N, IC, OC): ones, odd sizes (no multiple of 8 or 16: the alignment and
 * AUX_LD fallbacks), multiples of 8, N > 128 (the column sums' chunks),
 * and empty dimensions (each op's early returns, cuBLAS's refusal of k = 0) */
struct Shape {
    int N, IC, OC;
};
static const Shape shapes[] = {{1, 1, 1}, {7, 13, 5},  {37, 61, 29},  {64, 96, 160}, {33, 257, 129}, {300, 64, 96},
                               {0, 5, 3}, {5, 0, 3},   {5, 3, 0},     {16, 8, 8},    {8, 0, 8},      {0, 8, 8},
                               {4, 8, 0}, {3, 24, 40}, {130, 16, 17}, {257, 9, 24}};

/* which calls each policy must lead to: cuBLASLt without an epilogue, with
 * one, cublasGemmEx; db by the BGRADB epilogue, by colsum after a plain dW
 * GEMM */
static const struct {
    bool lt_plain, lt_epi, gemmex, bgrad_fused, bgrad_separate;
} paths[P_COUNT] = {
    /* all */ {true, true, false, true, false},
    /* none-status */ {false, false, true, false, true},
    /* none-zero */ {false, false, true, false, true},
    /* epi-status */ {true, false, false, false, true},
    /* epi-state */ {true, false, false, false, true},
    /* plain-zero */ {false, true, true, true, false},
    /* realistic: 16-byte aligned shapes on cuBLASLt, the rest on the fallbacks */ {true, true, true, true, true},
};

static long lt_epi_count(void)
{
    return emu_lt_matmul[CUBLASLT_EPILOGUE_BIAS] + emu_lt_matmul[CUBLASLT_EPILOGUE_GELU_AUX] +
           emu_lt_matmul[CUBLASLT_EPILOGUE_GELU_AUX_BIAS] + emu_lt_matmul[CUBLASLT_EPILOGUE_DGELU] +
           emu_lt_matmul[CUBLASLT_EPILOGUE_BGRADB];
}

int main(int argc, char **argv)
{
    int only = -1;
    if (argc > 1) {
        for (int p = 0; p < P_COUNT; p++)
            if (!strcmp(argv[1], policy_name[p]))
                only = p;
        if (only < 0) {
            fprintf(stderr, "usage: %s [all|none-status|none-zero|epi-status|epi-state|plain-zero|realistic]\n",
                    argv[0]);
            return 2;
        }
    }
    cpu = ops_cpu_create();
    if (!cpu)
        return 1;
    /* one thread: at these sizes OpenMP's threads would only spin waiting
     * for each other (90 % of the run time on 2 cores) */
    ops_cpu_threads(1);
    /* what ops_cuda_create sets up, on the emulated library */
    cu_t *g = &emu_g;
    g->stream = emu_stream;
    g->sync_ops = 1;
    if (cublasLtCreate(&g->lt) != CUBLAS_STATUS_SUCCESS)
        return 1;
    g->ws = malloc(WORKSPACE_BYTES);
    if (blas_init(g) != CUBLAS_STATUS_SUCCESS) {
        printf("FAIL: ops_cuda_create's cuBLAS handle setup\n");
        return 1;
    }
    for (int pol = 0; pol < P_COUNT; pol++) {
        if (only >= 0 && pol != only)
            continue;
        emu_policy = (Policy)pol;
        lt_cache_release(g); /* plans made under another policy */
        long fail0 = n_fail, lt_plain0 = emu_lt_matmul[CUBLASLT_EPILOGUE_DEFAULT], lt_epi0 = lt_epi_count(),
             gemmex0 = emu_gemmex, fused0 = g->plans.gelu_fused, separate0 = g->plans.gelu_separate,
             bgrad0 = g->plans.bgrad_fused, bsep0 = g->plans.bgrad_separate;
        cur_case = policy_name[pol];
        for (const Shape &s : shapes)
            for (int bf = 0; bf < 2; bf++)
                for (int off = 0; off < 2; off++) {
                    for (int gelu = 0; gelu < 2; gelu++)
                        for (int bias = 0; bias < 2; bias++)
                            t_fwd(bf, s.N, s.IC, s.OC, bias, off, gelu);
                    for (int mask = 0; mask < 8; mask++)
                        for (int ad = 0; ad < 2; ad++)
                            for (int aw = 0; aw < 2; aw++)
                                t_bwd(bf, s.N, s.IC, s.OC, mask, ad, aw, off, false);
                    /* din always: the CPU's GELU backward is computed into it */
                    for (int mask = 1; mask < 8; mask += 2)
                        for (int aw = 0; aw < 2; aw++)
                            t_bwd(bf, s.N, s.IC, s.OC, mask, 0, aw, off, true);
                }
        long lt_plain = emu_lt_matmul[CUBLASLT_EPILOGUE_DEFAULT] - lt_plain0, lt_epi = lt_epi_count() - lt_epi0,
             gemmex = emu_gemmex - gemmex0, bgrad = g->plans.bgrad_fused - bgrad0,
             bsep = g->plans.bgrad_separate - bsep0;
        /* the grouped GEMMs: fp32 on cublasGemmGroupedBatchedEx (calls
         * counted), bf16 on the dense path above (this policy's) */
        const long grouped0 = emu_grouped, problems0 = emu_grouped_problems;
        for (int gi = 0; gi < 5; gi++)
            for (int bf = 0; bf < 2; bf++)
                for (int off = 0; off < 2; off++) {
                    const int G = gi < 2 ? gi + 1 : 2 * gi, IC = gi % 2 ? 24 : 13, OC = gi % 2 ? 16 : 29;
                    for (int mask = 1; mask < 8; mask += 2)
                        t_gmm(bf, gmm_rows_[gi], G, IC, OC, (mask >> 2) & 1, mask, 0, 0, false, off);
                    t_gmm(bf, gmm_rows_[gi], G, IC, OC, true, 7, 1, 1, false, off);
                    t_gmm(bf, gmm_rows_[gi], G, IC, OC, false, 6, 0, 1, false, off);
                    t_gmm(bf, gmm_rows_[gi], G, IC, OC, true, 7, 0, 0, true, off);
                    t_gmm(bf, gmm_rows_[gi], G, IC, OC, false, 3, 0, 1, true, off);
                    t_gmm(bf, gmm_rows_[gi], G, 0, OC, true, 7, 0, 0, false, off); /* IC = 0 */
                    t_gmm(bf, gmm_rows_[gi], G, IC, 0, false, 7, 0, 0, true, off); /* OC = 0 */
                }
        cur_case = policy_name[pol];
        n_checks++;
        if (emu_grouped == grouped0)
            fail("the fp32 grouped GEMMs made no cublasGemmGroupedBatchedEx call");
        cur_case = policy_name[pol];
        n_checks++;
        if ((lt_plain > 0) != paths[pol].lt_plain || (lt_epi > 0) != paths[pol].lt_epi ||
            (gemmex > 0) != paths[pol].gemmex || (bgrad > 0) != paths[pol].bgrad_fused ||
            (bsep > 0) != paths[pol].bgrad_separate)
            fail("not the paths this policy forces: cuBLASLt plain %ld, with epilogue %ld, cublasGemmEx %ld; db by "
                 "BGRADB %ld, by colsum %ld",
                 lt_plain, lt_epi, gemmex, bgrad, bsep);
        printf("policy %-11s: %ld failed | cuBLASLt plain %ld, with epilogue %ld, cublasGemmEx %ld; GELU fused "
               "%ld, separate %ld; db by BGRADB %ld, by colsum %ld; grouped %ld calls of %ld problems\n",
               policy_name[pol], n_fail - fail0, lt_plain, lt_epi, gemmex, g->plans.gelu_fused - fused0,
               g->plans.gelu_separate - separate0, bgrad, bsep, emu_grouped - grouped0,
               emu_grouped_problems - problems0);
        fflush(stdout);
    }
    lt_cache_release(g);
    free(g->gmm_host); /* as ops_release */
    cudaFreeAsync(g->gmm_dev, g->stream);
    cublasDestroy(g->blas);
    free(g->ws);
    cublasLtDestroy(g->lt);
    cur_case = "end";
    if (emu_bad_stream)
        fail("%ld calls on a stream other than g->stream", emu_bad_stream);
    if (!emu_live.empty())
        fail("%zu cuBLAS/cuBLASLt objects not destroyed", emu_live.size());
    if (emu_gemmex_default_ws)
        fail("%ld cublasGemmEx calls on cuBLAS's default workspace", emu_gemmex_default_ws);
    printf("test_gemm_emu: %ld cases, %ld checks, %ld failed, %ld calls the library would reject, %ld kernel "
           "launches\n",
           n_cases, n_checks, n_fail, emu_shim_errors, emu_launches);
    return n_fail || emu_shim_errors ? 1 : 0;
}
