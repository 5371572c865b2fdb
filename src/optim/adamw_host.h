/* The host AdamW (issue 36, optimizer state in host memory): the update
 * base/ops_math.h's dt_adamw_update defines, one pass over each element
 * (parameter, gradient, the two moments and, when asked, the bf16 copy of
 * the parameter), vectorised with AVX-512 or AVX2 where the CPU and the OS
 * support them (chosen at run time; scalar otherwise) and split over the
 * OpenMP threads in contiguous 64-byte-aligned ranges.
 *
 * Every path performs the same IEEE operations in the same order as the
 * scalar formula (multiplies and adds never fused, sqrt and divide
 * correctly rounded), so p, m, v and p16 are bit-identical to the CPU ops
 * table's adamw whichever path and thread count runs (test_adamw_host).
 * --offload optimizer's update (optim.c) runs on it. */
#ifndef DTRAIN_ADAMW_HOST_H
#define DTRAIN_ADAMW_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "base/ops_math.h"

typedef enum { ADAMW_HOST_SCALAR = 0, ADAMW_HOST_AVX2, ADAMW_HOST_AVX512, ADAMW_HOST_N } adamw_host_isa_t;
extern const char *const adamw_host_isa_names[]; /* "scalar", "avx2", "avx512" */

/* Whether this CPU and OS run isa (scalar: always). Asked of cpuid and
 * xgetbv once per process. */
int adamw_host_supported(adamw_host_isa_t isa);

/* The widest supported isa. */
adamw_host_isa_t adamw_host_best(void);

/* One AdamW step over n elements with coefficients k (dt_adamw_coef), on
 * isa, which must be supported, and on the calling thread's OpenMP team
 * (omp_get_max_threads threads). p16: NULL, or n bf16 outputs written as
 * dt_f32_to_bf16 of the updated p. */
void adamw_host(adamw_host_isa_t isa, float *p, uint16_t *p16, const float *g, float *m, float *v, size_t n,
                const dt_adamw_coef_t *k);

#endif
