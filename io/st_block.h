/* Row-major blocks of a tensor file into fp32, for the safetensors and
 * llm.c readers: a run of fp32, fp64, bf16 or fp16 widened to fp32, the
 * transpose that turns GPT-2's Conv1D rows into dtrain's layout with
 * non-temporal stores, and the pread of a block that does both. Exact:
 * every result is the bits st_read_f32 promises (bit copies for fp32, a
 * NaN's payload kept). x86-64 kernels are chosen at run time by cpuid;
 * elsewhere the portable loops run. */
#ifndef DTRAIN_IO_ST_BLOCK_H
#define DTRAIN_IO_ST_BLOCK_H

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

/* The block rows [r0, r0+nr) x columns [c0, c0+nc) of a row-major array
 * of cols elements of dtype d per row, at byte at of the file at path
 * (size bytes), into dst[nr][nc] as fp32; transposed: source rows
 * [c0, c0+nc) x columns [r0, r0+nr) into dst[nr][nc]. Read with pread:
 * untransposed fp32 straight into dst (the kernel's one copy), everything
 * else about 256 KiB of source rows at a time into a buffer that stays in
 * cache. 0, or -1 when the file cannot be read so (reopened by name: a
 * file of another size is another file); the caller then reads its
 * mapping, which says what failed. The block must lie inside the file
 * (the caller checked it). */
int st_pread_block(const char *path, uint64_t size, uint64_t at, st_dtype_t d, int64_t cols, int64_t r0, int64_t nr,
                   int64_t c0, int64_t nc, int transpose, float *dst);

#endif
