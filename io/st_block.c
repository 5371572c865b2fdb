/* Row-major blocks of tensor files into fp32 (see st_block.h): pread,
 * widening and the streamed transpose; x86-64 vector paths chosen at run
 * time, portable loops for the rest. */
#define _GNU_SOURCE /* pread */
#include "io/st_block.h"

#include "base/bf16.h" /* dt_bf16_to_f32 */
#include "base/transpose.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

/* n bf16 at src (any alignment) -> dst[n]: each the high half of its
 * fp32, 8 at a time by interleaving with zeros where SSE2 is there (the
 * scalar loop held a bf16 import to a third of the file's read speed). */
static void bf16_run_to_f32(const unsigned char *src, int64_t n, float *dst)
{
    int64_t i = 0;
#ifdef __SSE2__
    const __m128i zero = _mm_setzero_si128();
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        _mm_storeu_si128((__m128i *)(void *)(dst + i), _mm_unpacklo_epi16(zero, h));
        _mm_storeu_si128((__m128i *)(void *)(dst + i + 4), _mm_unpackhi_epi16(zero, h));
    }
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = dt_bf16_to_f32(h);
    }
}

/* n fp16 at src (any alignment) -> dst[n], 8 at a time by the F16C
 * instruction on x86-64 CPUs that have it (chosen at run time; the scalar
 * conversion held an fp16 import to a fifth of the file's read speed);
 * exact like st_f16_to_f32, whose bits it gives for every input: a group
 * holding a NaN is converted by st_f16_to_f32 (the instruction would set
 * a signalling NaN's quiet bit). */
#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx,f16c"))) static int64_t f16_run_f16c(const unsigned char *src, int64_t n, float *dst)
{
    const __m128i exp = _mm_set1_epi16(0x7c00), man = _mm_set1_epi16(0x03ff), zero = _mm_setzero_si128();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(src + 2 * i));
        const __m128i nan =
            _mm_andnot_si128(_mm_cmpeq_epi16(_mm_and_si128(h, man), zero), _mm_cmpeq_epi16(_mm_and_si128(h, exp), exp));
        if (_mm_movemask_epi8(nan) != 0)
            break;
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
    }
    return i;
}

enum { CPU_F16C = 1, CPU_AVX2 = 2, CPU_KNOWN = 4 };

/* CPU_F16C and CPU_AVX2 where the CPU has them and the OS saves the YMM
 * registers, asked of cpuid and xgetbv directly: clang before 16 rejects
 * "f16c" in __builtin_cpu_supports. Asked once (the answer cannot change;
 * a race between threads only asks twice): cpuid traps to the hypervisor
 * in a VM, and this runs once per row. */
static int cpu_features(void)
{
    static int known; /* CPU_KNOWN once asked */
    int k = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (k == 0) {
        unsigned a, b, c, d, xcr0 = 0, xcr0_hi = 0;
        const unsigned avx = bit_OSXSAVE | bit_AVX;
        const int ymm = __get_cpuid(1, &a, &b, &c, &d) && (c & avx) == avx;
        if (ymm)
            __asm__ volatile("xgetbv" : "=a"(xcr0), "=d"(xcr0_hi) : "c"(0));
        k = CPU_KNOWN;
        if (ymm && (xcr0 & 0x6) == 0x6) { /* XMM and YMM state enabled */
            k |= (c & bit_F16C) ? CPU_F16C : 0;
            if (__get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_AVX2))
                k |= CPU_AVX2;
        }
        __atomic_store_n(&known, k, __ATOMIC_RELAXED);
    }
    return k;
}
#endif

static void f16_run_to_f32(const unsigned char *src, int64_t n, float *dst)
{
    int64_t i = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    const int f16c = (cpu_features() & CPU_F16C) != 0;
    while (f16c && i < n) {
        i += f16_run_f16c(src + 2 * i, n - i, dst + i);
        for (const int64_t end = i + 8 < n ? i + 8 : n; i < end; i++) { /* a group with a NaN, or the tail */
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = st_f16_to_f32(h);
        }
    }
#endif
    for (; i < n; i++) {
        uint16_t h;
        memcpy(&h, src + 2 * i, 2);
        dst[i] = st_f16_to_f32(h);
    }
}

/* The dtype is chosen once per call, not per element, and a contiguous fp32 run
 * is one memcpy (the per-element branch kept the import's copy from
 * vectorizing). */
void st_to_f32(const unsigned char *src, st_dtype_t d, int64_t n, float *dst, int64_t stride)
{
    if (d == ST_F32 && stride == 1) {
        memcpy(dst, src, (size_t)n * 4);
        return;
    }
    if (d == ST_F32) {
        for (int64_t i = 0; i < n; i++)
            memcpy(&dst[i * stride], src + 4 * i, 4);
    } else if (d == ST_F64) {
        for (int64_t i = 0; i < n; i++) {
            double v;
            memcpy(&v, src + 8 * i, 8);
            dst[i * stride] = (float)v;
        }
    } else if (d == ST_BF16 && stride == 1) {
        bf16_run_to_f32(src, n, dst);
    } else if (d == ST_BF16) {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i * stride] = dt_bf16_to_f32(h);
        }
    } else if (stride == 1) {
        f16_run_to_f32(src, n, dst);
    } else {
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i * stride] = st_f16_to_f32(h);
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
/* r[0..7] (8 rows of 8) -> their transpose, in place. */
__attribute__((target("avx2"))) static inline void transpose8(__m256 r[8])
{
    const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
    const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
    const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xee);
    const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xee);
    const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xee);
    const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xee);
    r[0] = _mm256_permute2f128_ps(s0, s4, 0x20), r[4] = _mm256_permute2f128_ps(s0, s4, 0x31);
    r[1] = _mm256_permute2f128_ps(s1, s5, 0x20), r[5] = _mm256_permute2f128_ps(s1, s5, 0x31);
    r[2] = _mm256_permute2f128_ps(s2, s6, 0x20), r[6] = _mm256_permute2f128_ps(s2, s6, 0x31);
    r[3] = _mm256_permute2f128_ps(s3, s7, 0x20), r[7] = _mm256_permute2f128_ps(s3, s7, 0x31);
}

/* The transpose for m a multiple of 16 and dst's rows 32-byte aligned:
 * 16 source rows x 8 columns at a time, each of the 8 destination rows
 * getting one whole 64-byte stripe of two streamed stores; the last n % 8
 * destination rows by plain stores. */
__attribute__((target("avx2"))) static void transpose_stream16(const float *src, int64_t m, int64_t n, int64_t lds,
                                                               float *dst, int64_t ldd)
{
    const int64_t n8 = n / 8 * 8;
    for (int64_t i = 0; i < m; i += 16) {
        for (int64_t j = 0; j < n8; j += 8) {
            __m256 a[8], b[8];
            for (int k = 0; k < 8; k++) {
                a[k] = _mm256_loadu_ps(src + (i + k) * lds + j);
                b[k] = _mm256_loadu_ps(src + (i + 8 + k) * lds + j);
            }
            transpose8(a);
            transpose8(b);
            for (int k = 0; k < 8; k++) {
                float *d = dst + (j + k) * ldd + i;
                _mm256_stream_ps(d, a[k]);
                _mm256_stream_ps(d + 8, b[k]);
            }
        }
        for (int64_t j = n8; j < n; j++)
            for (int64_t k = 0; k < 16; k++)
                memcpy(&dst[j * ldd + i + k], &src[(i + k) * lds + j], sizeof(float));
    }
    _mm_sfence();
}
#endif

void st_transpose_f32_stream(const float *src, int64_t m, int64_t n, int64_t lds, float *dst, int64_t ldd)
{
#if defined(__x86_64__) && defined(__GNUC__)
    if ((cpu_features() & CPU_AVX2) && ldd % 8 == 0 && (uintptr_t)dst % sizeof(float) == 0) {
        /* columns of dst before its first 32-byte boundary, then 16 at a
         * time, then the rest (every row has the same alignment) */
        int64_t lead = (int64_t)((32 - (uintptr_t)dst % 32) % 32 / sizeof(float));
        lead = lead < m ? lead : m;
        const int64_t body = (m - lead) / 16 * 16;
        dt_transpose_f32(src, lead, n, lds, dst, ldd);
        if (body > 0)
            transpose_stream16(src + lead * lds, body, n, lds, dst + lead, ldd);
        dt_transpose_f32(src + (lead + body) * lds, m - lead - body, n, lds, dst + lead + body, ldd);
        return;
    }
#endif
    dt_transpose_f32(src, m, n, lds, dst, ldd);
}

/* n bytes at off of fd into p: 0, or -1 on an error or a file shorter
 * than its size said. */
static int pread_full(int fd, void *p, size_t n, uint64_t off)
{
    for (unsigned char *q = p; n > 0;) {
        ssize_t k = pread(fd, q, n, (off_t)off);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return -1;
        q += k;
        off += (uint64_t)k;
        n -= (size_t)k;
    }
    return 0;
}

/* Reading with pread (see st_block.h): untransposed fp32 straight into
 * dst (the kernel's one copy), everything else about 256 KiB of source
 * rows at a time into a buffer that stays in cache, then converted to
 * fp32 and, transposed, turned into columns of dst[nr][nc]. Reading the
 * mapping instead faulted every source page in (and src_drop_pages
 * dropped them again): gpt2-124m's fp32 Conv1D matrices loaded at 0.9-1.6
 * GB/s against 4.1 GB/s for wte's pread, and a bf16 Llama at a third of
 * dd's speed. A block of whole rows is one read per group, a block of
 * part of each row a read per row: only the block's bytes, so a
 * tensor-parallel rank reads its own columns of a transposed matrix and
 * not its peers' (reading whole rows from a quarter of one up made GPT-2's
 * q, k and v a little faster from the page cache, and read c_attn three
 * times). 0, or -1 when the file cannot be read so (reopened by name:
 * another size is another file); the caller then reads the mapping. */
int st_pread_block(const char *path, uint64_t size, uint64_t at, st_dtype_t d, int64_t cols, int64_t r0, int64_t nr,
                   int64_t c0, int64_t nc, int transpose, float *dst)
{
    const size_t isz = st_dtype_size(d), row = (size_t)cols * isz;
    const int64_t s0 = transpose ? c0 : r0, sn = transpose ? nc : nr; /* source rows */
    const int64_t k0 = transpose ? r0 : c0, kn = transpose ? nr : nc; /* their columns read */
    const int direct = d == ST_F32 && !transpose;                     /* read into dst, all rows at once */
    int64_t group = direct || kn == 0 ? sn : (1 << 18) / ((int64_t)isz * kn) + 1;
    /* a transposed group fills whole 64-byte stripes of dst's rows, and
     * every group after the first starts on one (st_transpose_f32_stream) */
    const int64_t skew = transpose ? (int64_t)((uintptr_t)dst / sizeof(float) % 16) : 0;
    if (transpose)
        group = (group + 15) / 16 * 16;
    unsigned char *raw = direct ? NULL : malloc((size_t)group * (size_t)kn * isz);
    float *wide = d == ST_F32 || !transpose ? (float *)(void *)raw : malloc((size_t)group * (size_t)kn * 4);
    int fd = direct || (raw != NULL && wide != NULL) ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    struct stat st;
    int rc = fd >= 0 && fstat(fd, &st) == 0 && (uint64_t)st.st_size == size ? 0 : -1;
    /* no POSIX_FADV_WILLNEED here, nor for the next tensor: from a cold
     * disk, ranks advising the rows they share (tp splits a row's columns
     * between them) cut the kernel's reads into pieces (gpt2-350m at tp2:
     * 28,000 reads of 54 KB, 1.5-1.8 s; the kernel's own read-ahead of
     * sequential preads: 1,300-4,000 reads, 0.77-0.87 s) */
    for (int64_t j0 = 0, g = 0; rc == 0 && j0 < sn; j0 += g) {
        g = j0 == 0 ? group - skew : group;
        g = sn - j0 < g ? sn - j0 : g;
        unsigned char *in = direct ? (unsigned char *)(dst + j0 * nc) : raw; /* g rows of kn */
        if (kn == cols)                                                      /* whole rows: one read */
            rc = pread_full(fd, in, (size_t)g * row, at + (size_t)(s0 + j0) * row);
        for (int64_t j = 0; kn != cols && rc == 0 && j < g; j++)
            rc = pread_full(fd, in + (size_t)(j * kn) * isz, (size_t)kn * isz,
                            at + (size_t)(s0 + j0 + j) * row + (size_t)k0 * isz);
        for (int64_t j = 0; rc == 0 && !direct && !transpose && j < g; j++)
            st_to_f32(raw + (size_t)(j * kn) * isz, d, kn, dst + (j0 + j) * nc, 1);
        if (rc == 0 && transpose) {
            if (d != ST_F32)
                st_to_f32(raw, d, g * kn, wide, 1);
            st_transpose_f32_stream(wide, g, nr, kn, dst + j0, nc);
        }
    }
    if (fd >= 0)
        close(fd);
    if (wide != (float *)(void *)raw)
        free(wide);
    free(raw);
    return rc;
}
