/* Per-element arithmetic shared by the CPU backend (src/backend/ops_cpu.c) and the
 * CUDA backend (cuda/ops_cuda.cu), so that the CPU tests also exercise the
 * GPU's formulas.
 * Everything here is a static inline function of scalars: no loops, no
 * memory layout, no threading. Those belong to the backends. */
#ifndef DTRAIN_OPS_MATH_H
#define DTRAIN_OPS_MATH_H

#include <math.h>
#include <stdint.h>

#include "base/bf16.h" /* DT_HD, dt_f32_bits, dt_bits_f32, the bf16 conversions */

/* ---- exp -------------------------------------------------------------------
 * e^x in float without a libm call, so loops over it vectorise (glibc's expf
 * is scalar unless -ffast-math). Cody-Waite reduction x = n ln2 + r with
 * |r| <= ln2/2, Cephes' degree-6 polynomial for e^r, then 2^n applied as two
 * exact power-of-two factors so the result over/underflows exactly as expf
 * does (inf above 88.72, denormals, then 0 below -103.97). NaN propagates.
 * Error <= 1 ulp against correctly rounded e^x. On the GPU, expf itself. */
static inline DT_HD float dt_expf(float x)
{
#ifdef __CUDA_ARCH__
    return expf(x);
#else
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    /* Clamp to [-104, 89] so n stays in [-150, 129]; NaN fails both compares
     * and comes out as NaN. The clamp is a bit select, not a branch: with a
     * branch GCC folds the constant arms and the loop no longer vectorises. */
    union {
        float f;
        uint32_t u;
    } xb = {x}, lob = {-104.0f}, hib = {89.0f};
    uint32_t mlo = 0u - (uint32_t)(x < -104.0f), mhi = 0u - (uint32_t)(x > 89.0f);
    xb.u = (xb.u & ~(mlo | mhi)) | (lob.u & mlo) | (hib.u & mhi);
    float xc = xb.f;
    float t = xc * 1.44269504088896341f + magic;
    float n = t - magic;
    union {
        float f;
        uint32_t u;
    } tb = {t}, mb = {magic};
    int32_t ni = (int32_t)(tb.u - mb.u);
    float r = xc - n * 0.693359375f; /* ln2 split in two: the first */
    r = r - n * -2.12194440e-4f;     /* product is exact */
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    float y = p * r * r + r + 1.0f;
    int32_t n1 = ni / 2, n2 = ni - n1; /* each in [-75, 65]: normal floats */
    union {
        uint32_t u;
        float f;
    } s1 = {(uint32_t)(n1 + 127) << 23}, s2 = {(uint32_t)(n2 + 127) << 23};
    return y * s1.f * s2.f;
#endif
}

/* ---- GELU, tanh approximation (GPT-2) ------------------------------------
 * gelu(x) = 0.5 x (1 + tanh(u)), u = k (x + c x^3), k = sqrt(2/pi).
 * We use the identity 0.5 (1 + tanh(u)) = sigmoid(2u): one expf instead of a
 * tanhf (about 3x cheaper on glibc) and no cancellation in 1 + tanh(u) for
 * u << 0. The result equals the tanh form to float rounding. */
#define DT_GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define DT_GELU_C 0.044715f

/* 1/(1+e^-x); for x << 0 expf overflows to inf and the result is 0, not NaN. */
static inline DT_HD float dt_sigmoid(float x) { return 1.0f / (1.0f + dt_expf(-x)); }

static inline DT_HD float dt_gelu(float x)
{
    float u = DT_GELU_K * (x + DT_GELU_C * x * x * x);
    return x * dt_sigmoid(2.0f * u);
}

/* d gelu / dx = s + 2 x s (1-s) du/dx with s = sigmoid(2u), since
 * 1 - tanh(u)^2 = 4 s (1-s). */
static inline DT_HD float dt_gelu_grad(float x)
{
    float u = DT_GELU_K * (x + DT_GELU_C * x * x * x);
    float du = DT_GELU_K * (1.0f + 3.0f * DT_GELU_C * x * x);
    float s = dt_sigmoid(2.0f * u);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

/* ---- SiLU (SwiGLU gate) --------------------------------------------------- */
static inline DT_HD float dt_silu(float x) { return x * dt_sigmoid(x); }

/* d silu / dx = s (1 + x (1 - s)) */
static inline DT_HD float dt_silu_grad(float x)
{
    float s = dt_sigmoid(x);
    return s * (1.0f + x * (1.0f - s));
}

/* out = silu(g) * u. Backward of one (gate g, up u) pair given d out = d,
 * sharing one sigmoid between silu and its derivative. */
static inline DT_HD void dt_swiglu_grad(float g, float u, float d, float *dg, float *du)
{
    float s = dt_sigmoid(g);
    *dg = d * u * s * (1.0f + g * (1.0f - s));
    *du = d * g * s;
}

/* ---- Rotary position embedding -------------------------------------------
 * Pair i of a head (elements 2i, 2i+1) turns by angle pos * inv_freq[i]
 * radians, inv_freq[i] = theta^(-2i/HS) before any scaling (the model's
 * table: model_rope_inv_freq). Computed in float exactly as Meta's Llama and
 * Hugging Face do (inv_freq = 1 / theta^((2i)/HS) in float, angle =
 * float(pos) * inv_freq), so the rounding of large angles matches theirs. */
static inline DT_HD float dt_rope_inv_freq(int i, int HS, float theta)
{
    return 1.0f / powf(theta, (float)(2 * i) / (float)HS);
}

static inline DT_HD float dt_rope_angle(int pos, float inv_freq) { return (float)pos * inv_freq; }

/* Rotate (x0, x1) by the angle whose cosine/sine are (c, s). The backward
 * pass rotates the gradient by the inverse angle: call it with -s. */
static inline DT_HD void dt_rope_rotate(float *x0, float *x1, float c, float s)
{
    float a = *x0, b = *x1;
    *x0 = a * c - b * s;
    *x1 = a * s + b * c;
}

/* ---- Numerically stable log-sum-exp ---------------------------------------
 * Online form: fold one value x into a running (max m, sum s of exp(v - m)).
 * Start from m = -INFINITY, s = 0; the result is m + logf(s). Used where a
 * single pass over a row is wanted (one row per warp on the GPU). */
static inline DT_HD void dt_lse_push(float *m, float *s, float x)
{
    if (x > *m) {
        *s = *s * dt_expf(*m - x) + 1.0f;
        *m = x;
    } else {
        *s += dt_expf(x - *m);
    }
}

/* Merge of two log-sum-exps (ring attention's partial results, base/ops.h
 * attention_merge): log(e^a + e^b) = max + log1p(exp(min - max)), which
 * neither overflows nor loses the smaller term; -inf (a block with no key)
 * is the identity, and two -inf give -inf. The partial outputs then weigh
 * exp(a - l) and exp(b - l). TransformerEngine's
 * flash_attn_fwd_softmax_lse_correction uses the same form. */
static inline DT_HD float dt_lse_merge(float a, float b)
{
    float mx = a > b ? a : b, mn = a > b ? b : a;
    if (mx == -INFINITY)
        return -INFINITY;
    return mx + log1pf(dt_expf(mn - mx));
}

/* ---- LayerNorm / RMSNorm ---------------------------------------------------
 * rstd from a row's sum of squares (of deviations, for LayerNorm) over C. */
static inline DT_HD float dt_norm_rstd(float ss, int C, float eps) { return 1.0f / sqrtf(ss / (float)C + eps); }

static inline DT_HD float dt_layernorm_out(float x, float mu, float r, float w, float b)
{
    return (x - mu) * r * w + b;
}

/* d/dx of LayerNorm for one element: g = dout, sg = mean(g*w),
 * sgx = mean(g*w*xhat) over the row. */
static inline DT_HD float dt_layernorm_dx(float g, float w, float xhat, float sg, float sgx, float r)
{
    return (g * w - sg - xhat * sgx) * r;
}

/* RMSNorm backward: k = r^3 * sum_c(w g x) / C per row, then per element
 * d x = r w g - x k. */
static inline DT_HD float dt_rmsnorm_k(float r, float s, int C) { return r * r * r * s / (float)C; }

static inline DT_HD float dt_rmsnorm_dx(float r, float w, float g, float x, float k) { return r * w * g - x * k; }

/* ---- softmax backward ------------------------------------------------------
 * dS = P o (dP - rowsum(dP o P)) per element, dot = rowsum(dP o P). */
static inline DT_HD float dt_softmax_grad(float p, float dp, float dot) { return p * (dp - dot); }

/* ---- cross-entropy -----------------------------------------------------------
 * Per row, after the group sums: loss = rowmax + log(sum exp) - x_target in
 * double, and the factor turning the kept exps into dloss * softmax. */
static inline DT_HD float dt_xent_loss(float rowmax, double sumexp, float target_logit)
{
    return (float)((double)rowmax + log(sumexp) - (double)target_logit);
}

static inline DT_HD float dt_xent_gscale(float dloss, double sumexp) { return (float)((double)dloss / sumexp); }

/* ---- AdamW (torch.optim.AdamW, single-tensor path, PyTorch 1.13) ----------
 * Per-step scalars are computed once in double on the host, as PyTorch does
 * in Python, then rounded to float; the per-element update then follows
 * PyTorch's sequence of float operations:
 *   p *= 1 - lr*wd;  m = m*b1 + (1-b1) g;  v = v*b2 + (1-b2) g g;
 *   p -= (lr / (1-b1^t)) * m / (sqrt(v) / sqrt(1-b2^t) + eps). */
typedef struct dt_adamw_coef {
    float beta1, beta2;
    float one_minus_beta1, one_minus_beta2;
    float decay;     /* 1 - lr*wd */
    float step_size; /* lr / (1 - beta1^t) */
    float bc2_sqrt;  /* sqrt(1 - beta2^t) */
    float eps;
    float grad_scale; /* clipping x averaging factor applied to g first */
} dt_adamw_coef_t;

static inline dt_adamw_coef_t dt_adamw_coef(float lr, float beta1, float beta2, float eps, float wd, float grad_scale,
                                            int t)
{
    dt_adamw_coef_t k;
    k.beta1 = beta1;
    k.beta2 = beta2;
    k.one_minus_beta1 = (float)(1.0 - (double)beta1);
    k.one_minus_beta2 = (float)(1.0 - (double)beta2);
    k.decay = (float)(1.0 - (double)lr * (double)wd);
    k.step_size = (float)((double)lr / (1.0 - pow((double)beta1, (double)t)));
    k.bc2_sqrt = (float)sqrt(1.0 - pow((double)beta2, (double)t));
    k.eps = eps;
    k.grad_scale = grad_scale;
    return k;
}

static inline DT_HD void dt_adamw_update(float *p, float *m, float *v, float g, const dt_adamw_coef_t *k)
{
    g *= k->grad_scale;
    float mi = *m * k->beta1 + k->one_minus_beta1 * g;
    float vi = *v * k->beta2 + k->one_minus_beta2 * g * g;
    float denom = sqrtf(vi) / k->bc2_sqrt + k->eps;
    *m = mi;
    *v = vi;
    *p = *p * k->decay - k->step_size * (mi / denom);
}

#endif
