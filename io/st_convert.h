/* The safetensors reader's conversion kernels: a run of fp32, fp64, bf16
 * or fp16 widened to fp32, and the transpose that turns GPT-2's Conv1D
 * rows into dtrain's layout with non-temporal stores. Exact: every result
 * is the bits st_read_f32 promises (bit copies for fp32, a NaN's payload
 * kept). x86-64 kernels are chosen at run time by cpuid; elsewhere the
 * portable loops run. */
#ifndef DTRAIN_IO_ST_CONVERT_H
#define DTRAIN_IO_ST_CONVERT_H

#include "io/safetensors.h"

#include <stdint.h>

/* n elements of dtype d at src (any alignment) -> dst[i * stride]. */
void st_to_f32(const unsigned char *src, st_dtype_t d, int64_t n, float *dst, int64_t stride);

/* dst[j * ldd + i] = src[i * lds + j] for i < m, j < n, as
 * dt_transpose_f32 gives it, for a destination that is not read soon (an
 * import's parameters): where the CPU has AVX2 and ldd is a multiple of
 * 8, the 16-column stripes of dst that start on a 32-byte boundary are
 * written by non-temporal stores, which skip reading the destination's
 * lines before writing them (half of DRAM's traffic, twice the speed on
 * gpt2-124m's Conv1D matrices). The stores are fenced before it returns. */
void st_transpose_f32_stream(const float *src, int64_t m, int64_t n, int64_t lds, float *dst, int64_t ldd);

#endif
