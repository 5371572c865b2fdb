/* The host AdamW: the scalar formula of base/ops_math.h, and AVX2 and
 * AVX-512 twins of it (see adamw_host.h for why they agree bit for bit). */
#include "src/optim/adamw_host.h"

#include <cpuid.h>
#include <immintrin.h>
#include <omp.h>

#include "base/bf16.h"

/* A multiply and an add must stay two roundings, as in the scalar formula:
 * with AVX-512 (which has FMA) GCC would otherwise fuse the intrinsics. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

const char *const adamw_host_isa_names[] = {
    [ADAMW_HOST_SCALAR] = "scalar", [ADAMW_HOST_AVX2] = "avx2", [ADAMW_HOST_AVX512] = "avx512"};

/* ---- what the CPU and the OS support -------------------------------------------------- */

/* cpuid for the instructions, xgetbv for the OS saving their registers
 * (XCR0: SSE and AVX state for AVX2; opmask and both ZMM halves too for
 * AVX-512), as io/st_block.c asks for F16C. */
static int detect(adamw_host_isa_t isa)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE) || !(c & bit_AVX))
        return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
        return 0;
    if (isa == ADAMW_HOST_AVX2)
        return (lo & 0x6) == 0x6 && (b & bit_AVX2);
    return (lo & 0xe6) == 0xe6 && (b & bit_AVX512F);
}

int adamw_host_supported(adamw_host_isa_t isa)
{
    static int known[ADAMW_HOST_N], has[ADAMW_HOST_N]; /* per process; a race only asks twice */
    if (isa == ADAMW_HOST_SCALAR)
        return 1;
    if ((unsigned)isa >= ADAMW_HOST_N)
        return 0;
    if (!known[isa]) {
        has[isa] = detect(isa);
        known[isa] = 1;
    }
    return has[isa];
}

adamw_host_isa_t adamw_host_best(void)
{
    return adamw_host_supported(ADAMW_HOST_AVX512) ? ADAMW_HOST_AVX512
           : adamw_host_supported(ADAMW_HOST_AVX2) ? ADAMW_HOST_AVX2
                                                   : ADAMW_HOST_SCALAR;
}

/* ---- the kernels: one range [0, n) on one thread ------------------------------------- */

static void run_scalar(float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n, const dt_adamw_coef_t *k)
{
    for (size_t i = 0; i < n; i++) {
        dt_adamw_update(&p[i], &m[i], &v[i], g[i], k);
        if (p16)
            p16[i] = dt_f32_to_bf16(p[i]);
    }
}

/* dt_f32_to_bf16 of 8 lanes: round to nearest even, a NaN made quiet. */
__attribute__((target("avx2"))) static __m128i bf16_avx2(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i rne = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    const __m256i nan =
        _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    const __m256i h = _mm256_blendv_epi8(rne, qnan, nan); /* 0..0xffff in each 32-bit lane */
    /* packus interleaves the 128-bit halves: [h0-3, 0, h4-7, 0] -> h0-7 */
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(h, _mm256_setzero_si256()), 0x08);
    return _mm256_castsi256_si128(packed);
}

__attribute__((target("avx2"))) static void run_avx2(float *p, uint16_t *p16, const float *g, float *m, float *v,
                                                     size_t n, const dt_adamw_coef_t *k)
{
    const __m256 gs = _mm256_set1_ps(k->grad_scale), b1 = _mm256_set1_ps(k->beta1),
                 c1 = _mm256_set1_ps(k->one_minus_beta1), b2 = _mm256_set1_ps(k->beta2),
                 c2 = _mm256_set1_ps(k->one_minus_beta2), bc2 = _mm256_set1_ps(k->bc2_sqrt),
                 eps = _mm256_set1_ps(k->eps), decay = _mm256_set1_ps(k->decay), step = _mm256_set1_ps(k->step_size);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 gi = _mm256_mul_ps(_mm256_loadu_ps(g + i), gs);
        const __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), b1), _mm256_mul_ps(c1, gi));
        const __m256 vi =
            _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + i), b2), _mm256_mul_ps(_mm256_mul_ps(c2, gi), gi));
        const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vi), bc2), eps);
        const __m256 pi =
            _mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(p + i), decay), _mm256_mul_ps(step, _mm256_div_ps(mi, den)));
        _mm256_storeu_ps(m + i, mi);
        _mm256_storeu_ps(v + i, vi);
        _mm256_storeu_ps(p + i, pi);
        if (p16)
            _mm_storeu_si128((__m128i *)(p16 + i), bf16_avx2(pi));
    }
    run_scalar(p + i, p16 ? p16 + i : NULL, g + i, m + i, v + i, n - i, k);
}

/* dt_f32_to_bf16 of 16 lanes. */
__attribute__((target("avx512f"))) static __m256i bf16_avx512(__m512 x)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i qnan = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan =
        _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rne, qnan));
}

__attribute__((target("avx512f"))) static void run_avx512(float *p, uint16_t *p16, const float *g, float *m, float *v,
                                                          size_t n, const dt_adamw_coef_t *k)
{
    const __m512 gs = _mm512_set1_ps(k->grad_scale), b1 = _mm512_set1_ps(k->beta1),
                 c1 = _mm512_set1_ps(k->one_minus_beta1), b2 = _mm512_set1_ps(k->beta2),
                 c2 = _mm512_set1_ps(k->one_minus_beta2), bc2 = _mm512_set1_ps(k->bc2_sqrt),
                 eps = _mm512_set1_ps(k->eps), decay = _mm512_set1_ps(k->decay), step = _mm512_set1_ps(k->step_size);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), gs);
        const __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1), _mm512_mul_ps(c1, gi));
        const __m512 vi =
            _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(c2, gi), gi));
        const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
        const __m512 pi =
            _mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(p + i), decay), _mm512_mul_ps(step, _mm512_div_ps(mi, den)));
        _mm512_storeu_ps(m + i, mi);
        _mm512_storeu_ps(v + i, vi);
        _mm512_storeu_ps(p + i, pi);
        if (p16)
            _mm256_storeu_si256((__m256i *)(p16 + i), bf16_avx512(pi));
    }
    run_scalar(p + i, p16 ? p16 + i : NULL, g + i, m + i, v + i, n - i, k);
}

/* ---- threads ------------------------------------------------------------------------- */

typedef void (*kernel_fn)(float *, uint16_t *, const float *, float *, float *, size_t, const dt_adamw_coef_t *);

void adamw_host(adamw_host_isa_t isa, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                const dt_adamw_coef_t *k)
{
    static const kernel_fn kernel[ADAMW_HOST_N] = {
        [ADAMW_HOST_SCALAR] = run_scalar, [ADAMW_HOST_AVX2] = run_avx2, [ADAMW_HOST_AVX512] = run_avx512};
    const kernel_fn run = kernel[adamw_host_supported(isa) ? isa : ADAMW_HOST_SCALAR];
#pragma omp parallel
    {
        /* contiguous ranges in whole cache lines (16 floats): each element
         * is one thread's, whatever the thread count */
        const size_t t = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
        const size_t lines = (n + 15) / 16, per = (lines + nt - 1) / nt;
        size_t lo = t * per * 16, hi = lo + per * 16;
        if (hi > n)
            hi = n;
        if (lo < hi)
            run(p + lo, p16 ? p16 + lo : NULL, g + lo, m + lo, v + lo, hi - lo, k);
    }
}
