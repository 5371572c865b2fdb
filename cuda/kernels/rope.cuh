/* Rotary position embedding, in place on the q and k heads of qkv rows (v
 * untouched), one thread per (row, q/k head, pair (2i, 2i + 1)) in a
 * grid-stride loop: grid_for(total, THREADS) blocks of THREADS threads.
 * dir = 1 rotates by the position's angles (rope_fwd), dir = -1 by their
 * negatives (rope_bwd, on the gradient). A row's position is pos[n] (its
 * document position), or n % T without pos; pair i's inverse frequency is
 * inv_freq[i] (device memory, the model's table, as the CPU reads it).
 * Angle and rotation are base/ops_math.h's. */
#ifndef DTRAIN_CUDA_KERNELS_ROPE_CUH
#define DTRAIN_CUDA_KERNELS_ROPE_CUH

#include "cuda/kernels/common.cuh"

/* With qkv16 != NULL (rope_bwd's bf16 output) the grid covers the v heads'
 * pairs too, nh = NH + 2 NKV heads a row (else nh = NH + NKV): their
 * pairs are only rounded into qkv16, the q and k pairs rotated, then
 * rounded (DT_STORE16). */
__global__ void k_rope(float *qkv, uint16_t *qkv16, const int32_t *pos, int N, int T, int NH, int NKV, int HS,
                       const float *inv_freq, float dir)
{
    const int R = (NH + 2 * NKV) * HS, nqk = NH + NKV, nh = qkv16 ? NH + 2 * NKV : nqk, half = HS / 2;
    size_t total = (size_t)N * nh * half;
    GRID_STRIDE (idx, total) {
        int i = (int)(idx % (size_t)half);
        size_t rest = idx / (size_t)half;
        int h = (int)(rest % (size_t)nh);
        size_t n = rest / (size_t)nh;
        const size_t at = n * R + (size_t)h * HS + 2 * i;
        float *p = qkv + at;
        if (h < nqk) {
            float a = dt_rope_angle(pos ? pos[n] : (int)(n % (size_t)T), inv_freq[i]);
            float c = cosf(a), s = dir * sinf(a);
            dt_rope_rotate(p, p + 1, c, s);
        }
        DT_STORE16(qkv16, at, p[0]);
        DT_STORE16(qkv16, at + 1, p[1]);
    }
}

#endif
