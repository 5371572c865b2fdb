/* bf16 <-> fp32 rounding and the fp32 bit casts: the bottom layer's scalar
 * helpers (base/), for every layer that converts: the ops backends
 * (base/ops_math.h includes this), the communicators' bf16 sums (mpi/) and
 * the checkpoint formats (io/). Static inline functions of scalars, valid
 * C, C++ and CUDA (DT_HD: host and device). */
#ifndef DTRAIN_BF16_H
#define DTRAIN_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define DT_HD __host__ __device__
#else
#define DT_HD
#endif

/* ---- bf16 <-> fp32 ------------------------------------------------------------
 * bf16 is the top half of an fp32: sign, the same 8 exponent bits, 7 of the
 * 23 mantissa bits. Building blocks of issue 7's mixed precision; training
 * uses them for --dtype bf16 and --grad-reduce-dtype bf16 (mpi/comm_mpi.c);
 * the checkpoint formats convert with them (io/safetensors.c,
 * io/llmc_model.c).
 * Bit casts go through memcpy on the host (no union type punning, valid C
 * and C++) and __float_as_uint on the device. */
static inline DT_HD uint32_t dt_f32_bits(float x)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(x);
#else
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
#endif
}

static inline DT_HD float dt_bits_f32(uint32_t u)
{
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
#endif
}

/* fp32 -> bf16 bits, round to nearest, ties to even (IEEE RNE). Adding
 * 0x7fff plus the lowest kept bit to the fp32 bits and truncating rounds
 * the dropped 16 bits: above half carries into the kept part, below half
 * does not, exactly half carries only when the kept part is odd. A carry out
 * of the mantissa increments the exponent, which is also right for
 * subnormals (same exponent field as fp32) and rounds values at or past the
 * midpoint between the largest finite bf16 and 2^128 to +-Inf, as IEEE
 * overflow under RNE does. Infinities pass unchanged (low half is 0). NaN
 * would be wrong under the add (a payload only in the low half becomes Inf,
 * and the carry can flip into the sign), so a NaN keeps its sign and top
 * payload bits and gets the quiet bit set: a signalling NaN comes out quiet,
 * never Inf. The NaN case is a select, not a branch, so the CPU loop can
 * vectorise. */
static inline DT_HD uint16_t dt_f32_to_bf16(float x)
{
    uint32_t u = dt_f32_bits(x);
    uint32_t rne = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t qnan = (u >> 16) | 0x0040u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? qnan : rne);
}

/* bf16 bits -> fp32: exact (the low 16 mantissa bits are zero). */
static inline DT_HD float dt_bf16_to_f32(uint16_t h) { return dt_bits_f32((uint32_t)h << 16); }

#endif
