/* Counter-based random numbers: a value is a pure function of
 * (seed, stream, index), so any rank can draw element i of a tensor without
 * drawing elements 0..i-1. This is what makes every parallel layout start
 * from the identical model: an element's value does not depend on which rank
 * holds it or how the tensor is sliced. */
#ifndef DTRAIN_RNG_H
#define DTRAIN_RNG_H

#include <math.h>
#include <stdint.h>

/* SplitMix64 finaliser: a bijective 64-bit mix with full avalanche. */
static inline uint64_t rng_mix64(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* 64 random bits for (seed, stream, index). */
static inline uint64_t rng_bits(uint64_t seed, uint64_t stream, uint64_t index)
{
    return rng_mix64(rng_mix64(rng_mix64(seed) ^ stream) ^ index);
}

/* Uniform in [0, 1) with 53 bits. */
static inline double rng_uniform(uint64_t seed, uint64_t stream, uint64_t index)
{
    return (double)(rng_bits(seed, stream, index) >> 11) * (1.0 / 9007199254740992.0);
}

/* Standard normal by Box-Muller on two 32-bit halves of one draw. */
static inline float rng_normal(uint64_t seed, uint64_t stream, uint64_t index)
{
    uint64_t r = rng_bits(seed, stream, index);
    double u1 = ((double)(r >> 32) + 1.0) * (1.0 / 4294967297.0); /* (0,1): log is finite */
    double u2 = (double)(r & 0xffffffffu) * (1.0 / 4294967296.0);
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* FNV-1a of a string: stream ids from tensor names, independent of the
 * order tensors appear in any table. */
static inline uint64_t rng_stream_of(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

#endif
