/* The fp32 transpose of the Hugging Face export and import (GPT-2's Conv1D
 * weights are stored [in, out], dtrain's [out, in]): bit copies, so a NaN's
 * payload survives. Headers only. */
#ifndef DTRAIN_BASE_TRANSPOSE_H
#define DTRAIN_BASE_TRANSPOSE_H

#include <stdint.h>
#include <string.h>
#if defined(__SSE__) || defined(_M_X64)
#include <xmmintrin.h>
#define DT_TRANSPOSE_SSE 1
#endif

/* dst[j * ldd + i] = src[i * lds + j] for i < m, j < n, in 32 x 32 blocks
 * so that both sides stay in cache (a plain double loop strides through
 * dst a row per element and ran at a third of the disk's speed), each
 * block by 4 x 4 register transposes where SSE is there (the block's
 * scalar loop took 15 % of a gpt2-124m export's CPU). */
static inline void dt_transpose_f32(const float *src, int64_t m, int64_t n, int64_t lds, float *dst, int64_t ldd)
{
    enum { BS = 32 };
    for (int64_t i0 = 0; i0 < m; i0 += BS)
        for (int64_t j0 = 0; j0 < n; j0 += BS) {
            const int64_t i1 = i0 + BS < m ? i0 + BS : m, j1 = j0 + BS < n ? j0 + BS : n;
            int64_t i4 = i0, j4 = j0; /* the 4 x 4 tiles end at (i4, j4) */
#ifdef DT_TRANSPOSE_SSE
            i4 = i0 + (i1 - i0) / 4 * 4;
            j4 = j0 + (j1 - j0) / 4 * 4;
            for (int64_t i = i0; i < i4; i += 4)
                for (int64_t j = j0; j < j4; j += 4) {
                    const float *s = src + i * lds + j;
                    __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + lds), r2 = _mm_loadu_ps(s + 2 * lds),
                           r3 = _mm_loadu_ps(s + 3 * lds);
                    _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
                    float *d = dst + j * ldd + i;
                    _mm_storeu_ps(d, r0);
                    _mm_storeu_ps(d + ldd, r1);
                    _mm_storeu_ps(d + 2 * ldd, r2);
                    _mm_storeu_ps(d + 3 * ldd, r3);
                }
#endif
            /* the edges: columns j4.. of every row, rows i4.. of the rest */
            for (int64_t j = j0; j < j1; j++)
                for (int64_t i = j < j4 ? i4 : i0; i < i1; i++)
                    memcpy(&dst[j * ldd + i], &src[i * lds + j], sizeof(float));
        }
}

#endif
