/* bf16 <-> fp32 conversions (base/ops_math.h) and the CPU ops table's casts:
 *  - dt_f32_to_bf16 on all 2^32 fp32 bit patterns against an independent
 *    reference: the two bf16 neighbours of |x| by truncation, the nearer
 *    one chosen by comparing distances in double, ties to the even pattern;
 *    NaN in -> quiet NaN of the same sign out;
 *  - every bf16 pattern decodes exactly (against a table built from the
 *    fields with ldexp) and survives dt_bf16_to_f32 -> dt_f32_to_bf16;
 *  - named vectors: ties, overflow, subnormals, signed zero, NaNs;
 *  - the CPU table's cast_f32_to_bf16 / cast_bf16_to_f32 equal the scalar
 *    helpers on buffers of several lengths;
 *  - the CPU table's bf16 GEMMs against a double-precision reference on the same
 *    bf16 values, for shapes from 1x1x1 to ones the CPU splits into several
 *    panels: every element within 8 K 2^-24 sum_k |a_k b_k| (fp32 sums of
 *    exact products, any order), with and without bias, overwrite and
 *    accumulate, and NULL outputs.
 * The CUDA kernels use the same helpers; cuda/selftest.c compares them with
 * these CPU casts bit for bit. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"

static int failures;

static void check(int ok, const char *what)
{
    printf("%s: %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok)
        failures++;
}

/* Magnitude of bf16 pattern m (sign bit clear) from its fields, m in
 * [0, 0x7f80]: subnormal f * 2^-133, normal (1 + f/128) 2^(e-127). 0x7f80
 * decodes as 2^128, the value the next step past the largest finite bf16
 * would have with an unbounded exponent: rounding to it is overflow, and
 * IEEE RNE overflows exactly when the nearer neighbour is that value. */
#define TAB_N 0x7f81
static void build_table(double *tab)
{
    for (uint32_t m = 0; m < TAB_N; m++) {
        int e = (int)(m >> 7), f = (int)(m & 0x7f);
        tab[m] = e == 0 ? ldexp((double)f, -133) : ldexp(1.0 + (double)f / 128.0, e - 127);
    }
}

static int bf16_is_nan(uint16_t h) { return (h & 0x7fffu) > 0x7f80u; }

/* The reference for one non-NaN fp32 pattern u (used on the named vectors'
 * failures and as the definition; the exhaustive loop below is the same
 * rule with the neighbours hoisted out of the inner loop). */
static uint16_t ref_f32_to_bf16(uint32_t u, const double *tab)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t mag = u & 0x7fffffffu;
    if (mag == 0x7f800000u)
        return sign | 0x7f80u;                                    /* infinity */
    uint16_t lo = (uint16_t)(mag >> 16), hi = (uint16_t)(lo + 1); /* |x| in [tab[lo], tab[hi]) */
    double a = fabs((double)dt_bits_f32(u));
    double dlo = a - tab[lo], dhi = tab[hi] - a; /* both exact: same binade or subnormal */
    uint16_t r = dlo < dhi ? lo : dhi < dlo ? hi : (lo & 1u) ? hi : lo;
    return sign | r;
}

/* All 65536 fp32 patterns whose top half is `top`; returns the mismatches.
 * A NaN must give a NaN with the same sign and the quiet bit set; anything
 * else must equal the reference: truncation gives the neighbours lo and
 * lo + 1 of |x|, the nearer in double wins, a tie goes to the even one. */
static long long check_top(uint32_t top, const double *tab)
{
    long long bad = 0;
    uint32_t mag = top & 0x7fffu;
    uint16_t sign = (uint16_t)(top & 0x8000u);
    if (mag >= 0x7f80u) { /* Inf (low half 0) or NaN */
        for (uint32_t low = 0; low < 65536; low++) {
            uint32_t u = top << 16 | low;
            uint16_t got = dt_f32_to_bf16(dt_bits_f32(u));
            if (mag == 0x7f80u && low == 0)
                bad += got != (sign | 0x7f80u);
            else
                bad += !(bf16_is_nan(got) && (got & 0x0040u) && (got & 0x8000u) == sign);
        }
        return bad;
    }
    const uint16_t lo = (uint16_t)mag, hi = (uint16_t)(lo + 1);
    const uint16_t even = (lo & 1u) ? hi : lo;
    const double vlo = tab[lo], vhi = tab[hi];
    uint32_t nbad = 0; /* a 32-bit count keeps the loop vectorised */
#pragma omp simd reduction(+ : nbad)
    for (uint32_t low = 0; low < 65536; low++) {
        uint32_t u = top << 16 | low;
        double a = fabs((double)dt_bits_f32(u));
        double dlo = a - vlo, dhi = vhi - a;
        uint16_t want = sign | (dlo < dhi ? lo : dhi < dlo ? hi : even);
        nbad += dt_f32_to_bf16(dt_bits_f32(u)) != want;
    }
    return nbad;
}

static void check_exhaustive(const double *tab)
{
    long long bad = 0, checked = 0;
    uint32_t first_top = 0xffffffffu; /* top half of the first failing block */
#pragma omp parallel for schedule(static) reduction(+ : bad, checked) reduction(min : first_top)
    for (uint32_t top = 0; top < 65536; top++) {
        long long b = check_top(top, tab);
        bad += b;
        checked += 65536;
        if (b && top < first_top)
            first_top = top;
    }
    char what[160];
    snprintf(what, sizeof what, "dt_f32_to_bf16 exhaustive: %lld fp32 patterns, %lld mismatches", checked, bad);
    check(bad == 0 && checked == (1ll << 32), what);
    for (uint32_t low = 0; bad && low < 65536; low++) {
        uint32_t u = first_top << 16 | low;
        uint16_t got = dt_f32_to_bf16(dt_bits_f32(u));
        if ((u & 0x7fffffffu) <= 0x7f800000u && got != ref_f32_to_bf16(u, tab)) {
            printf("      first mismatch: fp32 0x%08x -> 0x%04x, reference 0x%04x\n", u, got, ref_f32_to_bf16(u, tab));
            break;
        }
    }
}

/* Every bf16 pattern: dt_bf16_to_f32 is exact (equals the field decode),
 * and converting back gives the same pattern (a signalling NaN comes back
 * quiet, the only change allowed). */
static void check_roundtrip(const double *tab)
{
    int bad_decode = 0, bad_round = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dt_bf16_to_f32((uint16_t)h);
        uint16_t back = dt_f32_to_bf16(f);
        if (bf16_is_nan((uint16_t)h)) {
            bad_decode += !isnan(f);
            bad_round += back != (h | 0x0040u);
        } else {
            double want = (h & 0x8000u) ? -tab[h & 0x7fffu] : tab[h & 0x7fffu];
            if (h == 0x7f80u || h == 0xff80u)
                want = (h & 0x8000u) ? -INFINITY : INFINITY;
            bad_decode += (double)f != want || !signbit(f) != !(h & 0x8000u);
            bad_round += back != h || dt_f32_bits(dt_bf16_to_f32(back)) != dt_f32_bits(f);
        }
    }
    char what[160];
    snprintf(what, sizeof what, "dt_bf16_to_f32 exact on all 65536 bf16 patterns: %d mismatches", bad_decode);
    check(bad_decode == 0, what);
    snprintf(what, sizeof what,
             "bf16 -> f32 -> bf16 roundtrip on all 65536 patterns (sNaN comes back quiet): %d mismatches", bad_round);
    check(bad_round == 0, what);
}

static void check_vectors(void)
{
    static const struct {
        uint32_t in;
        uint16_t want;
        const char *what;
    } v[] = {
        {0x3f800000u, 0x3f80u, "1.0f"},
        {0x3f808000u, 0x3f80u, "1 + 2^-8 (tie, down to even)"},
        {0x3f818000u, 0x3f82u, "1 + 3*2^-8 (tie, up to even)"},
        {0x3f808001u, 0x3f81u, "1 + 2^-8 + 2^-23 (just above the tie)"},
        {0xbf808000u, 0xbf80u, "-(1 + 2^-8) (negative tie)"},
        {0x7f7fffffu, 0x7f80u, "FLT_MAX -> +Inf"},
        {0xff7fffffu, 0xff80u, "-FLT_MAX -> -Inf"},
        {0x7f7f7fffu, 0x7f7fu, "just below the overflow midpoint -> largest finite bf16"},
        {0x7f7f8000u, 0x7f80u, "overflow midpoint (tie, odd neighbour) -> +Inf"},
        {0x7f800000u, 0x7f80u, "+Inf"},
        {0xff800000u, 0xff80u, "-Inf"},
        {0x00000001u, 0x0000u, "smallest fp32 subnormal -> +0"},
        {0x80000001u, 0x8000u, "-(smallest fp32 subnormal) -> -0"},
        {0x00010000u, 0x0001u, "smallest bf16 subnormal"},
        {0x00008000u, 0x0000u, "half the smallest bf16 subnormal (tie) -> +0"},
        {0x00018000u, 0x0002u, "1.5 x smallest bf16 subnormal (tie) -> even"},
        {0x007fffffu, 0x0080u, "largest fp32 subnormal -> smallest bf16 normal"},
        {0x00000000u, 0x0000u, "+0.0f"},
        {0x80000000u, 0x8000u, "-0.0f"},
        {0x7f800001u, 0x7fc0u, "signalling NaN, payload in the low half only -> quiet NaN, not Inf"},
        {0xff800001u, 0xffc0u, "negative signalling NaN -> negative quiet NaN"},
        {0x7fbfffffu, 0x7fffu, "signalling NaN, full payload -> quiet NaN"},
        {0x7fc00000u, 0x7fc0u, "quiet NaN"},
        {0xffffffffu, 0xffffu, "all-ones NaN (the add would carry into the sign)"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint16_t got = dt_f32_to_bf16(dt_bits_f32(v[i].in));
        char what[192];
        snprintf(what, sizeof what, "0x%08x %s -> 0x%04x (want 0x%04x)", v[i].in, v[i].what, got, v[i].want);
        check(got == v[i].want, what);
    }
    /* and through the float API, not only bit patterns */
    check(dt_f32_to_bf16(FLT_MAX) == 0x7f80u, "FLT_MAX as a float constant -> 0x7f80");
    check(dt_f32_to_bf16(-0.0f) == 0x8000u, "-0.0f as a float constant -> 0x8000");
    check(isnan(dt_bf16_to_f32(dt_f32_to_bf16(NAN))), "NAN -> NaN -> NaN");
}

/* A buffer through the CPU table's casts equals the scalar helpers elementwise.
 * Inputs: the named special patterns, then xorshift bit patterns. */
static void check_ops_casts(const ops_t *ops)
{
    static const size_t lens[] = {1, 17, (1u << 20) + 7};
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x7f7fffffu,
                                       0x7f800000u, 0xff800000u, 0x7f800001u, 0xffffffffu, 0x00008000u};
    uint64_t rng = 0x2545F4914F6CDD1Dull;
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        size_t n = lens[l];
        float *x = ops->alloc(ops->ctx, n * sizeof *x), *y = ops->alloc(ops->ctx, n * sizeof *y);
        uint16_t *h = ops->alloc(ops->ctx, n * sizeof *h);
        if (!x || !y || !h) {
            check(0, "ops_cpu alloc");
            ops->free(ops->ctx, x), ops->free(ops->ctx, y), ops->free(ops->ctx, h);
            return;
        }
        for (size_t i = 0; i < n; i++) {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            uint32_t u =
                i < sizeof special / sizeof special[0] ? special[i] : (uint32_t)((rng * 2685821657736338717ull) >> 32);
            x[i] = dt_bits_f32(u);
        }
        ops->cast_f32_to_bf16(ops->ctx, h, x, n);
        ops->cast_bf16_to_f32(ops->ctx, y, h, n);
        size_t bad_to = 0, bad_from = 0;
        for (size_t i = 0; i < n; i++) {
            bad_to += h[i] != dt_f32_to_bf16(x[i]);
            bad_from += dt_f32_bits(y[i]) != dt_f32_bits(dt_bf16_to_f32(h[i]));
        }
        char what[160];
        snprintf(what, sizeof what, "ops_cpu cast_f32_to_bf16 n=%zu equals dt_f32_to_bf16: %zu mismatches", n, bad_to);
        check(bad_to == 0, what);
        snprintf(what, sizeof what, "ops_cpu cast_bf16_to_f32 n=%zu equals dt_bf16_to_f32: %zu mismatches", n,
                 bad_from);
        check(bad_from == 0, what);
        ops->free(ops->ctx, x), ops->free(ops->ctx, y), ops->free(ops->ctx, h);
    }
    /* every bf16 pattern through the table */
    uint16_t *h = ops->alloc(ops->ctx, 65536 * sizeof *h);
    float *y = ops->alloc(ops->ctx, 65536 * sizeof *y);
    if (!h || !y) {
        check(0, "ops_cpu alloc");
        ops->free(ops->ctx, h), ops->free(ops->ctx, y);
        return;
    }
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    ops->cast_bf16_to_f32(ops->ctx, y, h, 65536);
    size_t bad = 0;
    for (uint32_t i = 0; i < 65536; i++)
        bad += dt_f32_bits(y[i]) != (uint32_t)i << 16;
    char what[160];
    snprintf(what, sizeof what, "ops_cpu cast_bf16_to_f32 on all 65536 bf16 patterns: %zu mismatches", bad);
    check(bad == 0, what);
    ops->free(ops->ctx, h), ops->free(ops->ctx, y);
}

/* ---- bf16 GEMMs ------------------------------------------------------------------------ */

/* A counter-based uniform in [-1, 1): the same values on every run. */
static float rand_pm1(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((double)(*s >> 40) / (double)(1ULL << 24) * 2.0 - 1.0);
}

static void fill_bf16(uint16_t *h, size_t n, uint64_t seed)
{
    for (size_t i = 0; i < n; i++)
        h[i] = dt_f32_to_bf16(rand_pm1(&seed));
}

/* Worst |got - ref| / bound over a matrix, bound = 8 K 2^-24 sum|terms| +
 * 2^-24 |ref| (the final rounding); ref and mag in double. */
static double worst_ratio(const float *got, const double *ref, const double *mag, size_t n, int K)
{
    double w = 0.0;
    for (size_t i = 0; i < n; i++) {
        double bound = 8.0 * K * ldexp(mag[i], -24) + ldexp(fabs(ref[i]), -24) + 1e-30;
        double r = fabs((double)got[i] - ref[i]) / bound;
        if (!(r <= w)) /* NaN too */
            w = isnan(r) ? INFINITY : r;
    }
    return w;
}

static void check_gemm_shape(const ops_t *ops, int N, int IC, int OC, int with_bias)
{
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    uint16_t *in = malloc(nin * 2 + 2), *w = malloc(nw * 2 + 2), *d16 = malloc(nout * 2 + 2);
    float *b = malloc((size_t)OC * 4), *dout = malloc(nout * 4), *out = malloc(nout * 4);
    float *din = malloc(nin * 4), *dw = malloc(nw * 4), *db = malloc((size_t)OC * 4);
    size_t nmax = nin > nw ? nin : nw;
    nmax = nmax > nout ? nmax : nout;
    double *ref = malloc(nmax * sizeof(double)), *mag = malloc(nmax * sizeof(double));
    if (!in || !w || !d16 || !b || !dout || !out || !din || !dw || !db || !ref || !mag) {
        check(0, "bf16 GEMM: out of memory");
        goto done;
    }
    fill_bf16(in, nin, 11 + (uint64_t)N);
    fill_bf16(w, nw, 23 + (uint64_t)OC);
    uint64_t seed = 37;
    for (size_t i = 0; i < nout; i++) {
        dout[i] = rand_pm1(&seed);
        d16[i] = dt_f32_to_bf16(dout[i]);
    }
    for (int o = 0; o < OC; o++)
        b[o] = rand_pm1(&seed);
    char what[200];

    /* forward: out = in . w^T + b */
    ops->matmul_fwd_bf16(ops->ctx, out, in, w, with_bias ? b : NULL, N, IC, OC);
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double acc = with_bias ? b[o] : 0.0, m = with_bias ? fabs(b[o]) : 0.0;
            for (int k = 0; k < IC; k++) {
                double t = (double)dt_bf16_to_f32(in[(size_t)n * IC + k]) * dt_bf16_to_f32(w[(size_t)o * IC + k]);
                acc += t;
                m += fabs(t);
            }
            ref[(size_t)n * OC + o] = acc;
            mag[(size_t)n * OC + o] = m;
        }
    double r = worst_ratio(out, ref, mag, nout, IC + 1);
    snprintf(what, sizeof what, "matmul_fwd_bf16 %dx%dx%d%s: worst error %.3f of the bound", N, IC, OC,
             with_bias ? " +bias" : "", r);
    check(r <= 1.0, what);

    /* backward, twice: overwrite, then accumulate onto the first result */
    for (int pass = 0; pass < 2; pass++) {
        ops->matmul_bwd_bf16(ops->ctx, din, dw, db, d16, dout, in, w, N, IC, OC, pass, pass);
        for (int n = 0; n < N; n++)
            for (int k = 0; k < IC; k++) {
                double acc = 0.0, m = 0.0;
                for (int o = 0; o < OC; o++) {
                    double t = (double)dt_bf16_to_f32(d16[(size_t)n * OC + o]) * dt_bf16_to_f32(w[(size_t)o * IC + k]);
                    acc += t;
                    m += fabs(t);
                }
                ref[(size_t)n * IC + k] = (pass + 1) * acc;
                mag[(size_t)n * IC + k] = (pass + 1) * m;
            }
        r = worst_ratio(din, ref, mag, nin, OC + 1);
        snprintf(what, sizeof what, "matmul_bwd_bf16 din %dx%dx%d %s: worst error %.3f of the bound", N, IC, OC,
                 pass ? "accumulated" : "written", r);
        check(r <= 1.0, what);
        for (int o = 0; o < OC; o++)
            for (int k = 0; k < IC; k++) {
                double acc = 0.0, m = 0.0;
                for (int n = 0; n < N; n++) {
                    double t = (double)dt_bf16_to_f32(d16[(size_t)n * OC + o]) * dt_bf16_to_f32(in[(size_t)n * IC + k]);
                    acc += t;
                    m += fabs(t);
                }
                ref[(size_t)o * IC + k] = (pass + 1) * acc;
                mag[(size_t)o * IC + k] = (pass + 1) * m;
            }
        r = worst_ratio(dw, ref, mag, nw, N + 1);
        snprintf(what, sizeof what, "matmul_bwd_bf16 dw %dx%dx%d %s: worst error %.3f of the bound", N, IC, OC,
                 pass ? "accumulated" : "written", r);
        check(r <= 1.0, what);
        for (int o = 0; o < OC; o++) { /* db sums the fp32 dout */
            double acc = 0.0, m = 0.0;
            for (int n = 0; n < N; n++) {
                acc += dout[(size_t)n * OC + o];
                m += fabs(dout[(size_t)n * OC + o]);
            }
            ref[o] = (pass + 1) * acc;
            mag[o] = (pass + 1) * m;
        }
        r = worst_ratio(db, ref, mag, (size_t)OC, N + 1);
        snprintf(what, sizeof what, "matmul_bwd_bf16 db %dx%dx%d %s (fp32 dout): worst error %.3f of the bound", N, IC,
                 OC, pass ? "accumulated" : "written", r);
        check(r <= 1.0, what);
    }

    /* NULL outputs are left alone: din only must not touch dw or db */
    dw[0] = 12345.0f;
    db[0] = 54321.0f;
    ops->matmul_bwd_bf16(ops->ctx, din, NULL, NULL, d16, dout, in, w, N, IC, OC, 0, 0);
    snprintf(what, sizeof what, "matmul_bwd_bf16 %dx%dx%d: NULL outputs untouched", N, IC, OC);
    check(dw[0] == 12345.0f && db[0] == 54321.0f, what);
done:
    free(in), free(w), free(d16), free(b), free(dout), free(out), free(din), free(dw), free(db), free(ref), free(mag);
}

static void check_gemm(const ops_t *ops)
{
    check_gemm_shape(ops, 1, 1, 1, 1);
    check_gemm_shape(ops, 37, 61, 29, 0);
    check_gemm_shape(ops, 37, 61, 29, 1);
    check_gemm_shape(ops, 64, 256, 384, 1);
    /* 4500 x 1024 > the CPU's 4M-float panel: several weight panels in the
     * forward and OC panels in din; 2100 x 2048 rows > one N panel for dw */
    check_gemm_shape(ops, 8, 1024, 4500, 1);
    check_gemm_shape(ops, 2100, 2048, 3, 0);

    /* OC = 0: din is an empty sum, so 0 when written and unchanged when
     * accumulated, in both precisions */
    float din[6];
    const float one = 1.0f;
    const uint16_t one16 = dt_f32_to_bf16(one);
    for (int acc = 0; acc <= 1; acc++) {
        for (int k = 0; k < 6; k++)
            din[k] = 7.0f;
        ops->matmul_bwd(ops->ctx, din, NULL, NULL, &one, &one, &one, 2, 3, 0, acc, 0);
        int ok = 1;
        for (int k = 0; k < 6; k++)
            ok &= din[k] == (acc ? 7.0f : 0.0f);
        for (int k = 0; k < 6; k++)
            din[k] = 7.0f;
        ops->matmul_bwd_bf16(ops->ctx, din, NULL, NULL, &one16, &one, &one16, &one16, 2, 3, 0, acc, 0);
        for (int k = 0; k < 6; k++)
            ok &= din[k] == (acc ? 7.0f : 0.0f);
        check(ok, acc ? "matmul_bwd(_bf16) with OC 0, accumulating: din unchanged"
                      : "matmul_bwd(_bf16) with OC 0: din written as zeros");
    }
}

int main(void)
{
    double *tab = malloc(TAB_N * sizeof *tab);
    const ops_t *ops = ops_cpu_create();
    if (!tab || !ops) {
        fprintf(stderr, "test_bf16: out of memory\n");
        return 99;
    }
    build_table(tab);
    check_vectors();
    check_roundtrip(tab);
    check_ops_casts(ops);
    check_gemm(ops);
    check_exhaustive(tab);
    ops_release(ops);
    free(tab);
    printf("%s: %d failure(s)\n", failures ? "FAIL" : "ok  ", failures);
    return failures ? 1 : 0;
}
