/* What every communicator implementation shares (comm.h): the gradient
 * reduction dtype and the fp32 <-> bf16 staging casts around the *_bf16
 * collectives. The casts are src/ops_math.h's scalar conversions, so the
 * rounding is the one the ops tables and test_bf16 check. */
#include "comm.h"

#include <string.h>

#include "ops_math.h"

int comm_dtype_parse(const char *s, comm_dtype_t *dtype)
{
    if (s && strcmp(s, "fp32") == 0) {
        *dtype = COMM_FP32;
        return 0;
    }
    if (s && strcmp(s, "bf16") == 0) {
        *dtype = COMM_BF16;
        return 0;
    }
    return -1;
}

void comm_f32_to_bf16(const float *x, uint16_t *y, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++)
        y[i] = dt_f32_to_bf16(x[i]);
}

void comm_bf16_to_f32(const uint16_t *x, float *y, size_t n)
{
#pragma omp parallel for simd schedule(static) if (n >= ((size_t)1 << 16))
    for (size_t i = 0; i < n; i++)
        y[i] = dt_bf16_to_f32(x[i]);
}
