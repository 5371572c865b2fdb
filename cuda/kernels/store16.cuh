/* The bf16 outputs of base/ops.h, as the kernels write them: with
 * dst16 != NULL, dst16[i] = the bf16 of v, the fp32 value the kernel
 * computed (and writes, where it does), rounded as cast_f32_to_bf16 rounds
 * (base/bf16.h), in the same pass. A macro of its own file so that kernel
 * families not built on common.cuh (the tensor-core attention) share it. */
#ifndef DTRAIN_CUDA_KERNELS_STORE16_CUH
#define DTRAIN_CUDA_KERNELS_STORE16_CUH

#include "base/bf16.h"

#define DT_STORE16(dst16, i, v)                                                                                        \
    do {                                                                                                               \
        if (dst16)                                                                                                     \
            (dst16)[i] = dt_f32_to_bf16(v);                                                                            \
    } while (0)

#endif
