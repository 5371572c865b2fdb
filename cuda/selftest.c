/* GPU ops against CPU ops (see selftest.h).
 *
 * Each case fills host inputs from a fixed-seed generator, copies them to
 * the GPU, runs the CPU op on the host copies and the GPU op on the device
 * copies (outputs start equal, so accumulate flags are exercised too),
 * brings the GPU outputs back and compares every output tensor with
 *   err = max_i |gpu_i - cpu_i| / max_i |cpu_i|     (0 when both are 0)
 * against the bound stated in the table below. The bounds are fp32
 * rounding-order noise: the backends sum in different orders (cuBLASLt vs
 * OpenBLAS, block reductions vs loops) and the GPU's expf/sinf/cosf differ
 * from the CPU's by an ulp or two. TF32 would break the matmul bound by
 * two orders of magnitude, so the test also proves it is off.
 *
 *   matmul fwd/bwd .................... 5e-5  (sums of up to ~800 products)
 *   layernorm, rmsnorm, qknorm, attention fwd
 *   (out; lse in absolute terms) and
 *   bwd (dqkv), rope, cross-entropy ... 1e-5
 *   gelu, swiglu, adamw, sumsq ........ 2e-6  (per element; sumsq: the CPU's
 *                                              float partials lose ~1e-7)
 *   add, scale, embedding fwd/bwd,
 *   memory round trips ................ 0     (same arithmetic, same order)
 *   MoE: routing's scores and gates ... 2e-6  (expf); lse 1e-5 absolute;
 *   the chosen experts, the dispatch
 *   plan, statistics, gather, combine,
 *   scatter, router backward without
 *   the z-loss ........................ 0     (t_moe says why)
 *
 * A norm's din is measured against max(max |cpu din|, max rstd |w dout|),
 * the largest term it sums: a row of variance ~0 (C = 1) cancels those
 * terms to ~0 in exact arithmetic, and the H200 (2026-11-26) left
 * rstd ulp(w dout) = 1.9e-5 there where the CPU left 0 (an FMA). The
 * backward outputs accumulate (+=), so both copies are made equal again
 * before each call: that residue once carried from layernorm's din into
 * rmsnorm's comparison (1.6e-5 there).
 *
 * Attention: both sides are fp32, but the CPU takes a two-pass softmax (row
 * max, then sum) and forms P = exp(s - lse), while the GPU's flash kernels
 * take an online softmax (running max and sum, the accumulator rescaled per
 * 32-key tile) and sum in other orders, so they differ by rounding only. A
 * host emulation of the GPU kernels (the same source, each block's 128
 * threads as pthreads) against a float two-pass reference gave at most
 * 2.4e-7 for out, lse and dqkv over the shapes below, so 1e-5 keeps a 40x
 * margin for the GPU's expf and FMAs. That is why dqkv is held to 1e-5, not
 * the 5e-5 of the old kernels: the backward no longer reads a stored
 * probability matrix, it recomputes the same P as the CPU from the same lse.
 * lse is a logarithm: its error is taken as max |diff| / max(1, max |lse|),
 * since an absolute error e there is a relative error e in the row's P. The
 * GPU outputs start as NaN (every element must be written) and each GPU
 * attention op runs twice, bit-identical (bound 0 ulp).
 *
 * Ring attention's blocks (context parallelism, t_ring): the block forward
 * and backward are the same fp32 flash kernels restricted to a K,V block, so
 * the same bounds (1e-5; lse in absolute terms, -inf exactly where the CPU
 * has it); the emulation (test/emu/test_ring_emu) measured at most 6e-7.
 * The merge is the CPU's per-element formula, so B_ELEM (the GPU's expf and
 * log1pf, an FMA); the K,V pack and unpack are copies and one add, 0 ulp.
 *
 * The tensor-core attention (a second CUDA table made for --dtype bf16,
 * head sizes 64 and 128) is held to bf16 bounds against the CPU's fp32
 * attention of the bf16-rounded inputs: out 2^-8 max |v|, lse 1e-5, each of
 * dq, dk, dv 2^-7 of its largest value plus a floor for dq and dk
 * (t_attention_mma derives them); run to run 0 ulp. At head size 96 the
 * same table keeps the fp32 kernels and their 1e-5 bounds.
 *
 * The bf16 GEMMs (matmul_fwd_bf16, matmul_bwd_bf16) get a bound per
 * element instead, because how close two fp32 sums can be depends on the
 * magnitudes summed. Both backends form the same products of bf16 values,
 * each exact in fp32 (8-bit significands, so 16-bit products), and sum them
 * in fp32; only the order differs (cuBLASLt's tiles, split-K and tensor-core
 * blocks; OpenBLAS's kernels and the CPU's panels). Summing K' terms in any
 * order in fp32 is within K' u S of the exact sum, u = 2^-24 and S the sum
 * of the terms' magnitudes (to first order; K' u <= 3e-4 here). Tensor
 * cores are reported to truncate instead of round when they add inside a
 * block (Fasi et al., "Numerical behavior of NVIDIA tensor cores", 2021),
 * which at most doubles that. So, per element i,
 *   |gpu_i - cpu_i| <= 4 K'_i 2^-24 S_i      (CPU 1 + GPU 2, plus 1 spare)
 * where S_i is summed in double on the host from the same bf16 values and
 * the terms are the K products plus, when present, the old value
 * (accumulate) or the bias (K' = K + 1); db sums the fp32 dout, K = N.
 * Where dw is wanted too, CUDA's db comes from the dW GEMM's BGRADB
 * epilogue, which sums the bf16 dout16 (each within 2^-8 of the fp32
 * dout), so db's |gpu_i - cpu_i| may exceed that by 2^-8 S_i, S_i the sum
 * of |dout| (subtracted before the ratio; doc/design.md). The
 * line shows err = max_i |gpu_i - cpu_i| / (K'_i S_i), bound 4 * 2^-24 =
 * 2.38e-07. It is a worst case, linear in K where random rounding errors
 * grow like sqrt(K). Tried on the CPU with stand-ins for the GPU op: sums
 * in reverse order reach 3.2e-09, reverse and rounded toward zero 4.1e-09
 * (60x below); w read transposed 2e-04 to 9e-03 (1000x above and more).
 * An output rounded to bf16 (2^-9 relative) fails it up to K = 1024 (by 2x
 * there) but fits under it at K = 2304 and 4500: the bound checks layout
 * and summation; that outputs stay fp32 rests on lt_gemm's fp32 C/D.
 *
 * The bf16 casts are compared as bit patterns, bound 0 ulp: both backends
 * call the same integer arithmetic (dt_f32_to_bf16 / dt_bf16_to_f32 in
 * ops_math.h), so any differing bit is a bug. cast_f32_to_bf16 is also
 * compared with CUDA's own __float2bfloat16_rn, bit for bit except that a
 * NaN only has to stay a NaN (CUDA returns a canonical NaN, we keep the
 * payload's top bits).
 *
 * Kept cuBLASLt plans: a GEMM repeated after another shape must reuse its
 * plan (the counters say so) and give the first call's bits exactly.
 *
 * GELU-fused GEMMs: the GEMM part at 5e-5; the GELU cuBLASLt's epilogue
 * computes at 1e-3 of the largest value (t_matmul_gelu says why).
 */
#include "base/ops_math.h"
#include "cuda/ops_cuda.h"
#include "cuda/selftest.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define B_MATMUL 5e-5
#define B_ROW 1e-5
#define B_ELEM 2e-6
#define B_EXACT 0.0
#define B_GEMM16 (4.0 / 16777216.0) /* 4 * 2^-24 per term, see the header */
#define B_EPI 1e-3                  /* cuBLASLt's GELU epilogue, see t_matmul_gelu */

typedef struct st {
    const ops_t *cpu, *gpu;
    const ops_t *graphs; /* the caller's graph table over gpu, or NULL (t_graphs) */
    FILE *out;
    uint64_t rng;
    int run, failed, oom;
} st_t;

/* A tensor on both sides: h is the CPU's (and the reference), d the GPU's. */
typedef struct tp {
    float *h, *d;
    size_t n;
} tp_t;

static float frand(st_t *s, float lo, float hi)
{
    /* xorshift64*: a fixed sequence for a fixed seed */
    s->rng ^= s->rng >> 12;
    s->rng ^= s->rng << 25;
    s->rng ^= s->rng >> 27;
    uint64_t r = s->rng * 2685821657736338717ull;
    return lo + (hi - lo) * (float)((double)(r >> 40) / (double)(1ull << 24));
}

/* n floats in [lo, hi) on both sides. */
static int tp_new(st_t *s, tp_t *t, size_t n, float lo, float hi)
{
    t->n = n;
    t->h = calloc(n ? n : 1, sizeof(float));
    t->d = s->gpu->alloc(s->gpu->ctx, n * sizeof(float));
    if (!t->h || !t->d) {
        s->oom = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        t->h[i] = frand(s, lo, hi);
    s->gpu->from_host(s->gpu->ctx, t->d, t->h, n * sizeof(float));
    return 0;
}

/* The GPU copy set to the host copy again: an output a comparison found
 * different by rounding is re-made equal before an op accumulates into it,
 * so each comparison measures that op alone. */
static void tp_sync(st_t *s, const tp_t *t) { s->gpu->from_host(s->gpu->ctx, t->d, t->h, t->n * sizeof(float)); }

static void tp_free(st_t *s, tp_t *t)
{
    free(t->h);
    if (t->d)
        s->gpu->free(s->gpu->ctx, t->d);
    memset(t, 0, sizeof *t);
}

/* int32 buffer on both sides */
static int32_t *ints_dev(st_t *s, const int32_t *h, size_t n)
{
    int32_t *d = s->gpu->alloc(s->gpu->ctx, n * sizeof(int32_t));
    if (!d) {
        s->oom = 1;
        return NULL;
    }
    s->gpu->from_host(s->gpu->ctx, d, h, n * sizeof(int32_t));
    return d;
}

/* err = max |gpu - cpu| / max(max |cpu|, scale): scale > 0 names the size
 * of the terms the op sums when they can cancel to far below it (a norm's
 * backward on a row of variance ~0, where rstd = 1/sqrt(eps) multiplies
 * the rounding of dout * w - mean(dout * w): exactly 0 in exact arithmetic,
 * rstd ulp(dout * w) on a GPU that contracts it into an FMA). */
static void check_scaled(st_t *s, const char *what, const tp_t *t, double bound, double scale);

static void check(st_t *s, const char *what, const tp_t *t, double bound) { check_scaled(s, what, t, bound, 0.0); }

static void check_scaled(st_t *s, const char *what, const tp_t *t, double bound, double scale)
{
    float *g = malloc((t->n ? t->n : 1) * sizeof(float));
    if (!g) {
        s->oom = 1;
        return;
    }
    s->gpu->to_host(s->gpu->ctx, g, t->d, t->n * sizeof(float));
    double maxref = 0.0, maxdiff = 0.0;
    int bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        double a = t->h[i], b = g[i];
        if (isnan(a) != isnan(b) || (!isnan(a) && isinf(a) != isinf(b)))
            bad = 1;
        if (isfinite(a) && fabs(a) > maxref)
            maxref = fabs(a);
        if (isfinite(a) && isfinite(b) && fabs(a - b) > maxdiff)
            maxdiff = fabs(a - b);
    }
    free(g);
    if (scale > maxref)
        maxref = scale;
    double err = maxdiff == 0.0 ? 0.0 : maxref > 0.0 ? maxdiff / maxref : INFINITY;
    int ok = !bad && err <= bound;
    s->run++;
    if (!ok)
        s->failed++;
    fprintf(s->out, "%s %-60s err %.2e (bound %.0e)%s\n", ok ? "ok  " : "FAIL", what, err, bound,
            bad ? " nan/inf mismatch" : "");
}

static void check_val(st_t *s, const char *what, double ref, double got, double bound)
{
    double err = ref == got ? 0.0 : fabs(ref - got) / (fabs(ref) > 0 ? fabs(ref) : 1.0);
    int ok = err <= bound;
    s->run++;
    if (!ok)
        s->failed++;
    fprintf(s->out, "%s %-60s err %.2e (bound %.0e)\n", ok ? "ok  " : "FAIL", what, err, bound);
}

/* A bit-exact comparison: bad of n elements differ, bound 0 ulp. */
static void check_bits(st_t *s, const char *what, size_t bad, size_t n)
{
    s->run++;
    if (bad)
        s->failed++;
    fprintf(s->out, "%s %-60s %zu of %zu differ (bound 0 ulp)\n", bad ? "FAIL" : "ok  ", what, bad, n);
}

/* Like check, for a tensor of logarithms (attention's lse): the difference is
 * divided by max(1, max_i |cpu_i|) instead of max_i |cpu_i|. An absolute error
 * e in a log-sum-exp is a relative error of about e in every probability
 * exp(s - lse) of its row, so it is what matters; and a row's lse can sit near
 * 0, where a relative measure would blow up rounding noise. */
static void check_log(st_t *s, const char *what, const tp_t *t, double bound)
{
    float *g = malloc((t->n ? t->n : 1) * sizeof(float));
    if (!g) {
        s->oom = 1;
        return;
    }
    s->gpu->to_host(s->gpu->ctx, g, t->d, t->n * sizeof(float));
    double maxref = 1.0, maxdiff = 0.0;
    int bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        double a = t->h[i], b = g[i];
        if (!isfinite(a) || !isfinite(b))
            bad |= !(a == b); /* -inf only where the CPU has it; NaN always fails */
        else {
            if (fabs(a) > maxref)
                maxref = fabs(a);
            if (fabs(a - b) > maxdiff)
                maxdiff = fabs(a - b);
        }
    }
    free(g);
    double err = maxdiff / maxref;
    int ok = !bad && err <= bound;
    s->run++;
    if (!ok)
        s->failed++;
    fprintf(s->out, "%s %-60s err %.2e (bound %.0e, abs)%s\n", ok ? "ok  " : "FAIL", what, err, bound,
            bad ? " nan/inf mismatch" : "");
}

/* The GPU copy of t filled with NaN, so that an element a GPU op fails to
 * write shows up as a NaN against the CPU's number. */
static void poison(st_t *s, const tp_t *t)
{
    float *v = malloc((t->n ? t->n : 1) * sizeof(float));
    if (!v) {
        s->oom = 1;
        return;
    }
    for (size_t i = 0; i < t->n; i++)
        v[i] = NAN;
    s->gpu->from_host(s->gpu->ctx, t->d, v, t->n * sizeof(float));
    free(v);
}

/* Run-to-run determinism: the GPU copies of a and b (same length) compared
 * bit for bit. */
static void check_same(st_t *s, const char *what, const tp_t *a, const tp_t *b)
{
    float *x = malloc((a->n ? a->n : 1) * sizeof(float)), *y = malloc((a->n ? a->n : 1) * sizeof(float));
    if (!x || !y) {
        free(x), free(y);
        s->oom = 1;
        return;
    }
    s->gpu->to_host(s->gpu->ctx, x, a->d, a->n * sizeof(float));
    s->gpu->to_host(s->gpu->ctx, y, b->d, a->n * sizeof(float));
    size_t bad = 0;
    for (size_t i = 0; i < a->n; i++)
        bad += dt_f32_bits(x[i]) != dt_f32_bits(y[i]);
    free(x), free(y);
    check_bits(s, what, bad, a->n);
}

/* ---- cases ------------------------------------------------------------------------ */

static void t_memory(st_t *s)
{
    tp_t a, b;
    memset(&a, 0, sizeof a), b = a;
    if (tp_new(s, &a, 1000, -1, 1) || tp_new(s, &b, 1000, 5, 6))
        goto out;
    s->gpu->copy(s->gpu->ctx, b.d, a.d, 600 * sizeof(float));
    memcpy(b.h, a.h, 600 * sizeof(float));
    s->gpu->zero(s->gpu->ctx, a.d + 100, 50 * sizeof(float));
    memset(a.h + 100, 0, 50 * sizeof(float));
    check(s, "memory: from_host, copy, to_host", &b, B_EXACT);
    check(s, "memory: zero", &a, B_EXACT);
out:
    tp_free(s, &a);
    tp_free(s, &b);
}

/* The side stream's copies (--ckpt-async's to_host_begin, --offload's
 * gradients down and weights up): a buffer down into pinned memory, part
 * of it up into another, and the compute stream's next op (a scale)
 * reading what came up once from_host_end has ordered it. */
static void t_side_copies(st_t *s)
{
    const ops_t *g = s->gpu;
    tp_t a, b;
    memset(&a, 0, sizeof a), b = a;
    float *pin = NULL;
    if (tp_new(s, &a, 1000, -1, 1) || tp_new(s, &b, 1000, 5, 6) || !(pin = ops_host_alloc(g, 1000 * sizeof(float))))
        goto out;
    g->to_host_begin(g->ctx, pin, a.d, 1000 * sizeof(float));
    g->to_host_end(g->ctx);
    g->from_host_begin(g->ctx, b.d + 200, pin, 500 * sizeof(float));
    g->from_host_end(g->ctx);
    g->scale(g->ctx, b.d + 200, 2.0f, 500);
    for (int i = 0; i < 500; i++)
        b.h[200 + i] = 2.0f * a.h[i];
    check(s, "memory: to_host_begin, from_host_begin, an op after from_host_end", &b, B_EXACT);
out:
    ops_host_free(g, pin);
    tp_free(s, &a);
    tp_free(s, &b);
}

/* --cuda-graphs' nine ops of a block-like sequence on o (x[N,C] in, out
 * [N,C] out), between a copy in and a wait */
typedef struct {
    tp_t x, w, b, lnw, lnb, mean, rstd, y1, y2, y3, out;
} graph_bufs_t;
static void graph_seq(const ops_t *o, const graph_bufs_t *t, int N, int C)
{
    const size_t n = (size_t)N * C;
    o->from_host(o->ctx, t->x.d, t->x.h, n * sizeof(float));
    o->layernorm_fwd(o->ctx, t->y1.d, NULL, t->mean.d, t->rstd.d, t->x.d, t->lnw.d, t->lnb.d, N, C, 1e-5f);
    o->matmul_fwd(o->ctx, t->y2.d, t->y1.d, t->w.d, t->b.d, N, C, C);
    o->gelu_fwd(o->ctx, t->y3.d, NULL, t->y2.d, n);
    o->matmul_fwd(o->ctx, t->y1.d, t->y3.d, t->w.d, t->b.d, N, C, C);
    o->add(o->ctx, t->y2.d, t->y1.d, t->x.d, n);
    o->scale(o->ctx, t->y2.d, 0.5f, n);
    o->layernorm_fwd(o->ctx, t->y3.d, NULL, t->mean.d, t->rstd.d, t->y2.d, t->lnw.d, t->lnb.d, N, C, 1e-5f);
    o->add(o->ctx, t->out.d, t->y3.d, t->y2.d, n);
    o->scale(o->ctx, t->out.d, 2.0f, n);
    o->sync(o->ctx);
}

/* --cuda-graphs: graph_seq through the caller's graph table over this
 * CUDA table on a new input each time, bit for bit the plain table's
 * result on the same input: the first time plainly, the second captured
 * and launched, the third launched (a graph reads the memory it points
 * at, not what it held at capture); then a larger layernorm_bwd on the
 * plain table grows the column-reduction buffer, which moves the table's
 * epoch, and the fourth time the graph is dropped and the sequence runs
 * plainly. The caller checks the graph table's counts (which path ran). */
static void t_graphs(st_t *s, int N, int C)
{
    const ops_t *g = s->gpu, *gt = s->graphs;
    const size_t n = (size_t)N * C, NB = 8192, CB = 1024;
    graph_bufs_t t;
    tp_t ref, bx, bd, bdx, bdw, bdb, bm, br;
    memset(&t, 0, sizeof t);
    memset(&ref, 0, sizeof ref), bx = bd = bdx = bdw = bdb = bm = br = ref;
    if (tp_new(s, &t.x, n, -1, 1) || tp_new(s, &t.w, (size_t)C * C, -0.1f, 0.1f) ||
        tp_new(s, &t.b, C, -0.1f, 0.1f) || tp_new(s, &t.lnw, C, 0.5f, 1.5f) || tp_new(s, &t.lnb, C, -0.1f, 0.1f) ||
        tp_new(s, &t.mean, N, 0, 0) || tp_new(s, &t.rstd, N, 0, 0) || tp_new(s, &t.y1, n, 0, 0) ||
        tp_new(s, &t.y2, n, 0, 0) || tp_new(s, &t.y3, n, 0, 0) || tp_new(s, &t.out, n, 0, 0) ||
        tp_new(s, &ref, n, 0, 0)) {
        s->oom = 1;
        goto out;
    }
    static const char *const what[] = {"graphs: seen once, run plainly", "graphs: seen twice, captured, launched",
                                       "graphs: launched on a new input", "graphs: after the workspace moved"};
    for (int k = 0; k < 4 && !s->oom; k++) {
        for (size_t i = 0; i < n; i++)
            t.x.h[i] = frand(s, -1, 1);
        graph_seq(g, &t, N, C);
        g->to_host(g->ctx, ref.h, t.out.d, n * sizeof(float));
        if (k == 3) { /* grow the column partials: NB rows of CB */
            if (tp_new(s, &bx, NB * CB, -1, 1) || tp_new(s, &bd, NB * CB, -1, 1) || tp_new(s, &bdx, NB * CB, 0, 0) ||
                tp_new(s, &bdw, CB, 0, 0) || tp_new(s, &bdb, CB, 0, 0) || tp_new(s, &bm, NB, 0, 0) ||
                tp_new(s, &br, NB, 1, 2))
                break;
            g->layernorm_bwd(g->ctx, bdx.d, NULL, bdw.d, bdb.d, bd.d, bx.d, t.lnw.d, bm.d, br.d, (int)NB, (int)CB, 0);
        }
        graph_seq(gt, &t, N, C);
        memcpy(t.out.h, ref.h, n * sizeof(float));
        check(s, what[k], &t.out, B_EXACT);
    }
out:
    tp_t *all[] = {&t.x, &t.w, &t.b, &t.lnw, &t.lnb, &t.mean, &t.rstd, &t.y1, &t.y2, &t.y3, &t.out,
                   &ref, &bx, &bd, &bdx, &bdw, &bdb, &bm, &br};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        tp_free(s, all[i]);
}

static void t_matmul(st_t *s, int N, int IC, int OC)
{
    char what[128];
    tp_t in, w, b, out, dout, din, dw, db;
    memset(&in, 0, sizeof in), w = b = out = dout = din = dw = db = in;
    if (tp_new(s, &in, (size_t)N * IC, -1, 1) || tp_new(s, &w, (size_t)OC * IC, -1, 1) ||
        tp_new(s, &b, (size_t)OC, -1, 1) || tp_new(s, &out, (size_t)N * OC, -1, 1) ||
        tp_new(s, &dout, (size_t)N * OC, -1, 1) || tp_new(s, &din, (size_t)N * IC, -1, 1) ||
        tp_new(s, &dw, (size_t)OC * IC, -1, 1) || tp_new(s, &db, (size_t)OC, -1, 1))
        goto out;
    for (int bias = 0; bias < 2; bias++) {
        s->cpu->matmul_fwd(s->cpu->ctx, out.h, in.h, w.h, bias ? b.h : NULL, N, IC, OC);
        s->gpu->matmul_fwd(s->gpu->ctx, out.d, in.d, w.d, bias ? b.d : NULL, N, IC, OC);
        snprintf(what, sizeof what, "matmul_fwd N=%d IC=%d OC=%d%s", N, IC, OC, bias ? " +bias" : "");
        check(s, what, &out, B_MATMUL);
    }
    for (int accum = 0; accum < 2; accum++) {
        s->cpu->matmul_bwd(s->cpu->ctx, din.h, dw.h, db.h, dout.h, in.h, w.h, N, IC, OC, accum, accum);
        s->gpu->matmul_bwd(s->gpu->ctx, din.d, dw.d, db.d, dout.d, in.d, w.d, N, IC, OC, accum, accum);
        snprintf(what, sizeof what, "matmul_bwd din N=%d IC=%d OC=%d accum=%d", N, IC, OC, accum);
        check(s, what, &din, B_MATMUL);
        snprintf(what, sizeof what, "matmul_bwd dw N=%d IC=%d OC=%d accum=%d", N, IC, OC, accum);
        check(s, what, &dw, B_MATMUL);
        snprintf(what, sizeof what, "matmul_bwd db N=%d IC=%d OC=%d accum=%d", N, IC, OC, accum);
        check(s, what, &db, B_MATMUL);
    }
out:
    tp_free(s, &in), tp_free(s, &w), tp_free(s, &b), tp_free(s, &out);
    tp_free(s, &dout), tp_free(s, &din), tp_free(s, &dw), tp_free(s, &db);
}

/* The fp32 grouped GEMMs (cuda/ops_cuda_gmm.cuh: cublasGemmGroupedBatchedEx)
 * against the CPU's: G groups of the row counts rows[] (empty ones too),
 * weights [G, OC, IC], biases [G, OC]; the forward with and without
 * biases, the backward written and accumulated, and with the GELU's pre. */
static void t_gmm(st_t *s, const int *rows, int G, int IC, int OC)
{
    char what[160];
    int32_t offs[17] = {0};
    for (int g = 0; g < G && g < 16; g++)
        offs[g + 1] = offs[g] + rows[g];
    const size_t R = (size_t)offs[G];
    tp_t in, w, b, out, dout, din, dw, db, pre;
    memset(&in, 0, sizeof in), w = b = out = dout = din = dw = db = pre = in;
    if (tp_new(s, &in, R * IC, -1, 1) || tp_new(s, &w, (size_t)G * OC * IC, -1, 1) ||
        tp_new(s, &b, (size_t)G * OC, -1, 1) || tp_new(s, &out, R * OC, -1, 1) || tp_new(s, &dout, R * OC, -1, 1) ||
        tp_new(s, &din, R * IC, -1, 1) || tp_new(s, &dw, (size_t)G * OC * IC, -1, 1) ||
        tp_new(s, &db, (size_t)G * OC, -1, 1) || tp_new(s, &pre, R * IC, -3, 3))
        goto out;
    for (int bias = 0; bias < 2; bias++) {
        s->cpu->gmm_fwd(s->cpu->ctx, out.h, in.h, w.h, bias ? b.h : NULL, offs, G, IC, OC);
        s->gpu->gmm_fwd(s->gpu->ctx, out.d, in.d, w.d, bias ? b.d : NULL, offs, G, IC, OC);
        snprintf(what, sizeof what, "gmm_fwd G=%d R=%zu IC=%d OC=%d%s", G, R, IC, OC, bias ? " +bias" : "");
        check(s, what, &out, B_MATMUL);
    }
    for (int mode = 0; mode < 3; mode++) { /* written, accumulated, with pre */
        const int accum = mode == 1;
        const float *ph = mode == 2 ? pre.h : NULL, *pd = mode == 2 ? pre.d : NULL;
        tp_sync(s, &din), tp_sync(s, &dw), tp_sync(s, &db); /* each comparison this op's alone */
        s->cpu->gmm_bwd(s->cpu->ctx, din.h, dw.h, db.h, dout.h, in.h, ph, w.h, offs, G, IC, OC, accum, accum);
        s->gpu->gmm_bwd(s->gpu->ctx, din.d, dw.d, db.d, dout.d, in.d, pd, w.d, offs, G, IC, OC, accum, accum);
        snprintf(what, sizeof what, "gmm_bwd din G=%d R=%zu IC=%d OC=%d mode=%d", G, R, IC, OC, mode);
        check(s, what, &din, B_MATMUL);
        snprintf(what, sizeof what, "gmm_bwd dw G=%d R=%zu IC=%d OC=%d mode=%d", G, R, IC, OC, mode);
        check(s, what, &dw, B_MATMUL);
        snprintf(what, sizeof what, "gmm_bwd db G=%d R=%zu IC=%d OC=%d mode=%d", G, R, IC, OC, mode);
        check(s, what, &db, B_MATMUL);
    }
out:
    tp_free(s, &in), tp_free(s, &w), tp_free(s, &b), tp_free(s, &out), tp_free(s, &dout);
    tp_free(s, &din), tp_free(s, &dw), tp_free(s, &db), tp_free(s, &pre);
}

/* Kept cuBLASLt plans (cuda/ops_cuda.cu): a GEMM, another shape, the
 * first again. The third call must reuse the first's plan and give its
 * bits exactly; the plans made and reused counters must say so. */
static void t_gemm_plans(st_t *s)
{
    const int N = 48, IC = 80, OC = 112;
    tp_t in, w, b, out1, out2, other;
    memset(&in, 0, sizeof in), w = b = out1 = out2 = other = in;
    if (tp_new(s, &in, (size_t)N * IC, -1, 1) || tp_new(s, &w, (size_t)OC * IC, -1, 1) ||
        tp_new(s, &b, (size_t)OC, -1, 1) || tp_new(s, &out1, (size_t)N * OC, -1, 1) ||
        tp_new(s, &out2, (size_t)N * OC, 5, 6) || tp_new(s, &other, (size_t)(N + 1) * OC, -1, 1))
        goto out;
    long made0, reused0, made1, reused1, blas;
    ops_cuda_gemm_plans(s->gpu, &made0, &reused0, &blas);
    s->gpu->matmul_fwd(s->gpu->ctx, out1.d, in.d, w.d, b.d, N, IC, OC);
    s->gpu->matmul_fwd(s->gpu->ctx, other.d, in.d, w.d, b.d, N - 1, IC, OC);
    s->gpu->matmul_fwd(s->gpu->ctx, out2.d, in.d, w.d, b.d, N, IC, OC);
    ops_cuda_gemm_plans(s->gpu, &made1, &reused1, &blas);
    check_same(s, "matmul_fwd +bias: kept cuBLASLt plan, same bits as its first use", &out1, &out2);
    char what[160];
    snprintf(what, sizeof what, "cuBLASLt plans: the repeated GEMM reused one (%ld made, %ld reused)", made1 - made0,
             reused1 - reused0);
    check_val(s, what, 1.0, reused1 - reused0 >= 1 ? 1.0 : 0.0, 0.0);
out:
    tp_free(s, &in), tp_free(s, &w), tp_free(s, &b), tp_free(s, &out1), tp_free(s, &out2), tp_free(s, &other);
}

/* ---- bf16 GEMMs ---------------------------------------------------------------------- */

/* A bf16 tensor on both sides: h (bit patterns) is the CPU's, d the GPU's. */
typedef struct tb {
    uint16_t *h, *d;
    size_t n;
} tb_t;

/* n bf16 values on both sides: src rounded (dt_f32_to_bf16) when given,
 * else fp32 randoms in [lo, hi) rounded. */
static int tb_new(st_t *s, tb_t *t, size_t n, const float *src, float lo, float hi)
{
    t->n = n;
    t->h = malloc((n ? n : 1) * sizeof(uint16_t));
    t->d = s->gpu->alloc(s->gpu->ctx, n * sizeof(uint16_t));
    if (!t->h || !t->d) {
        s->oom = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        t->h[i] = dt_f32_to_bf16(src ? src[i] : frand(s, lo, hi));
    s->gpu->from_host(s->gpu->ctx, t->d, t->h, n * sizeof(uint16_t));
    return 0;
}

static void tb_free(st_t *s, tb_t *t)
{
    free(t->h);
    if (t->d)
        s->gpu->free(s->gpu->ctx, t->d);
    memset(t, 0, sizeof *t);
}

/* |x| of the bf16 x[R, C] (row-major) as fp32, exact, into out[R, C], or
 * transposed into out[C, R] when tr. NULL when out of memory. */
static float *abs_bf16(const uint16_t *x, int R, int C, int tr)
{
    size_t n = (size_t)R * C;
    float *out = malloc((n ? n : 1) * sizeof(float));
    if (!out)
        return NULL;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++)
            out[tr ? (size_t)c * R + r : (size_t)r * C + c] = fabsf(dt_bf16_to_f32(x[(size_t)r * C + c]));
    return out;
}

/* S[i, j] = sum_k a[i, k] b[j, k] in double (a[M,K], b[N,K], row-major,
 * nonnegative): the sum of |products| behind element (i, j) of a GEMM.
 * NULL when out of memory. */
static double *abs_sums(const float *a, const float *b, int M, int N, int K)
{
    size_t n = (size_t)M * N;
    double *S = malloc((n ? n : 1) * sizeof(double));
    if (!S)
        return NULL;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const float *ar = a + (size_t)i * K, *br = b + (size_t)j * K;
            double acc = 0.0;
            for (int k = 0; k < K; k++)
                acc += (double)ar[k] * br[k];
            S[(size_t)i * N + j] = acc;
        }
    return S;
}

/* The per-element bf16 GEMM bound (see the header): element i has the K
 * terms summed in S[i], plus |old[i]| when old != NULL (accumulate) and
 * |bias[i % ncol]| when bias != NULL; round16 S[i] more is allowed (db by
 * the BGRADB epilogue: 2^-8, else 0). Inputs are finite, so a NaN or Inf
 * on either side fails. */
static void check_gemm16(st_t *s, const char *what, const tp_t *t, const double *S, int K, const float *old,
                         const float *bias, int ncol, double round16)
{
    float *g = malloc((t->n ? t->n : 1) * sizeof(float));
    if (!g) {
        s->oom = 1;
        return;
    }
    s->gpu->to_host(s->gpu->ctx, g, t->d, t->n * sizeof(float));
    double err = 0.0;
    int bad = 0;
    for (size_t i = 0; i < t->n; i++) {
        double a = t->h[i], b = g[i];
        if (!isfinite(a) || !isfinite(b)) {
            bad = 1;
            continue;
        }
        double sum = S[i];
        int terms = K;
        if (old)
            sum += fabs(old[i]), terms++;
        if (bias)
            sum += fabs(bias[i % (size_t)ncol]), terms++;
        double d = fmax(0.0, fabs(a - b) - round16 * S[i]);
        double e = d == 0.0 ? 0.0 : sum > 0.0 ? d / ((double)terms * sum) : INFINITY;
        if (e > err)
            err = e;
    }
    free(g);
    int ok = !bad && err <= B_GEMM16;
    s->run++;
    if (!ok)
        s->failed++;
    fprintf(s->out, "%s %-60s err %.2e (bound %.2e per term)%s\n", ok ? "ok  " : "FAIL", what, err, B_GEMM16,
            bad ? " nan/inf" : "");
}

/* The operands of one t_matmul_bf16 shape: bf16 in, w and dout16 (dout16 =
 * bf16 of the fp32 dout that db sums), the fp32 rest, the old values of an
 * accumulate (o_*) and the sums of |products| behind each output (S_*). */
typedef struct mm16 {
    int N, IC, OC;
    tb_t in, w, dout16;
    tp_t b, out, dout, din, dw, db;
    float *o_din, *o_dw, *o_db;
    double *S_out, *S_din, *S_dw, *S_db;
} mm16_t;

/* One matmul_bwd_bf16 case: which of din, dw, db are wanted, and the two
 * accumulate flags. */
typedef struct bw16 {
    int din, dw, db, acc_din, acc_dw;
} bw16_t;

/* The tensors, in the order they draw their randoms. */
static int mm16_new(st_t *s, mm16_t *m)
{
    const size_t nin = (size_t)m->N * m->IC, nw = (size_t)m->OC * m->IC, nout = (size_t)m->N * m->OC;
    return tb_new(s, &m->in, nin, NULL, -1, 1) || tb_new(s, &m->w, nw, NULL, -1, 1) ||
           tp_new(s, &m->dout, nout, -1, 1) || tb_new(s, &m->dout16, nout, m->dout.h, 0, 0) ||
           tp_new(s, &m->b, (size_t)m->OC, -1, 1) || tp_new(s, &m->out, nout, -1, 1) ||
           tp_new(s, &m->din, nin, -1, 1) || tp_new(s, &m->dw, nw, -1, 1) || tp_new(s, &m->db, (size_t)m->OC, -1, 1);
}

/* sums of |products|: out[n,o] over i of in[n,i] w[o,i]; din[n,i] over o
 * of dout[n,o] w[o,i]; dw[o,i] over n of dout[n,o] in[n,i]; db[o] over n
 * of the fp32 |dout[n,o]|. Also allocates o_*. Sets s->oom on failure. */
static int mm16_sums(st_t *s, mm16_t *m)
{
    const int N = m->N, IC = m->IC, OC = m->OC;
    const size_t nin = (size_t)N * IC, nw = (size_t)OC * IC;
    int rc = -1;
    float *a_in = abs_bf16(m->in.h, N, IC, 0), *a_inT = abs_bf16(m->in.h, N, IC, 1);
    float *a_w = abs_bf16(m->w.h, OC, IC, 0), *a_wT = abs_bf16(m->w.h, OC, IC, 1);
    float *a_dout = abs_bf16(m->dout16.h, N, OC, 0), *a_doutT = abs_bf16(m->dout16.h, N, OC, 1);
    m->o_din = malloc((nin ? nin : 1) * sizeof(float));
    m->o_dw = malloc((nw ? nw : 1) * sizeof(float));
    m->o_db = malloc((OC > 0 ? (size_t)OC : 1) * sizeof(float));
    m->S_db = calloc(OC > 0 ? (size_t)OC : 1, sizeof(double));
    if (!a_in || !a_inT || !a_w || !a_wT || !a_dout || !a_doutT || !m->o_din || !m->o_dw || !m->o_db || !m->S_db)
        goto out;
    m->S_out = abs_sums(a_in, a_w, N, OC, IC);
    m->S_din = abs_sums(a_dout, a_wT, N, IC, OC);
    m->S_dw = abs_sums(a_doutT, a_inT, OC, IC, N);
    if (!m->S_out || !m->S_din || !m->S_dw)
        goto out;
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++)
            m->S_db[o] += fabs(m->dout.h[(size_t)n * OC + o]);
    rc = 0;
out:
    if (rc != 0)
        s->oom = 1;
    free(a_in), free(a_inT), free(a_w), free(a_wT), free(a_dout), free(a_doutT);
    return rc;
}

static void mm16_free(st_t *s, mm16_t *m)
{
    free(m->o_din), free(m->o_dw), free(m->o_db);
    free(m->S_out), free(m->S_din), free(m->S_dw), free(m->S_db);
    tb_free(s, &m->in), tb_free(s, &m->w), tb_free(s, &m->dout16);
    tp_free(s, &m->b), tp_free(s, &m->out), tp_free(s, &m->dout);
    tp_free(s, &m->din), tp_free(s, &m->dw), tp_free(s, &m->db);
}

/* matmul_fwd_bf16 without and with bias. */
static void mm16_fwd(st_t *s, mm16_t *m, const char *dims)
{
    char what[192];
    for (int bias = 0; bias < 2; bias++) {
        s->cpu->matmul_fwd_bf16(s->cpu->ctx, m->out.h, m->in.h, m->w.h, bias ? m->b.h : NULL, m->N, m->IC, m->OC);
        s->gpu->matmul_fwd_bf16(s->gpu->ctx, m->out.d, m->in.d, m->w.d, bias ? m->b.d : NULL, m->N, m->IC, m->OC);
        snprintf(what, sizeof what, "matmul_fwd_bf16 %s%s", dims, bias ? " +bias" : "");
        check_gemm16(s, what, &m->out, m->S_out, m->IC, NULL, bias ? m->b.h : NULL, m->OC, 0.0);
    }
}

/* One matmul_bwd_bf16 case. Both sides start from the CPU's outputs of the
 * previous case (so its rounding differences do not carry into an
 * accumulate), and these are the old values the bound counts. */
static void mm16_bwd(st_t *s, mm16_t *m, const bw16_t *c, const char *dims)
{
    const int N = m->N, IC = m->IC, OC = m->OC;
    const size_t nin = (size_t)N * IC, nw = (size_t)OC * IC;
    char what[192], tag[128];
    snprintf(tag, sizeof tag, "%s acc %d,%d%s%s", dims, c->acc_din, c->acc_dw, c->din ? "" : " din=NULL",
             c->dw ? c->db ? "" : " db=NULL" : " dw=db=NULL");
    memcpy(m->o_din, m->din.h, nin * sizeof(float));
    memcpy(m->o_dw, m->dw.h, nw * sizeof(float));
    memcpy(m->o_db, m->db.h, (size_t)OC * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, m->din.d, m->din.h, nin * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, m->dw.d, m->dw.h, nw * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, m->db.d, m->db.h, (size_t)OC * sizeof(float));
    s->cpu->matmul_bwd_bf16(s->cpu->ctx, c->din ? m->din.h : NULL, c->dw ? m->dw.h : NULL, c->db ? m->db.h : NULL,
                            m->dout16.h, m->dout.h, m->in.h, m->w.h, N, IC, OC, c->acc_din, c->acc_dw);
    s->gpu->matmul_bwd_bf16(s->gpu->ctx, c->din ? m->din.d : NULL, c->dw ? m->dw.d : NULL, c->db ? m->db.d : NULL,
                            m->dout16.d, m->dout.d, m->in.d, m->w.d, N, IC, OC, c->acc_din, c->acc_dw);
    if (c->din) {
        snprintf(what, sizeof what, "matmul_bwd_bf16 din %s", tag);
        check_gemm16(s, what, &m->din, m->S_din, OC, c->acc_din ? m->o_din : NULL, NULL, 1, 0.0);
    }
    if (c->dw) {
        snprintf(what, sizeof what, "matmul_bwd_bf16 dw %s", tag);
        check_gemm16(s, what, &m->dw, m->S_dw, N, c->acc_dw ? m->o_dw : NULL, NULL, 1, 0.0);
    }
    if (c->db) {
        snprintf(what, sizeof what, "matmul_bwd_bf16 db %s", tag);
        check_gemm16(s, what, &m->db, m->S_db, N, c->acc_dw ? m->o_db : NULL, NULL, 1, c->dw ? 0x1p-8 : 0.0);
    }
}

/* matmul_fwd_bf16 and matmul_bwd_bf16 against the CPU on the same bf16
 * in, w and dout16 (dout16 = bf16 of the fp32 dout that db sums), with and
 * without bias, each accumulate flag, and NULL din/dw/db as the model
 * passes them (first layer: no din; no bias: no db). */
static void t_matmul_bf16(st_t *s, int N, int IC, int OC)
{
    static const bw16_t bw[] = {{1, 1, 1, 0, 0}, {1, 1, 1, 1, 1}, {1, 1, 1, 1, 0}, {1, 1, 1, 0, 1}, {0, 1, 1, 0, 0},
                                {0, 1, 1, 1, 1}, {1, 0, 0, 0, 0}, {1, 0, 0, 1, 1}, {1, 1, 0, 0, 0}, {1, 1, 0, 1, 1}};
    char dims[64];
    snprintf(dims, sizeof dims, "N=%d IC=%d OC=%d", N, IC, OC);
    mm16_t m = {.N = N, .IC = IC, .OC = OC};
    if (mm16_new(s, &m) == 0 && mm16_sums(s, &m) == 0) {
        mm16_fwd(s, &m, dims);
        for (size_t v = 0; v < sizeof bw / sizeof bw[0]; v++)
            mm16_bwd(s, &m, &bw[v], dims);
    }
    mm16_free(s, &m);
}

/* The GELU-fused GEMMs (matmul_gelu_fwd*, matmul_dgelu_bwd*) against the
 * CPU's, which are the separate ops. pre (the GEMM and bias) and dw, db
 * are plain GEMM results: B_MATMUL. out = gelu(pre) and din = gelu'(pre)
 * o (dout . w) come from cuBLASLt's GELU epilogue where it runs, its own
 * GELU implementation rather than dt_gelu: held to B_EPI of the largest
 * value, which a wrong epilogue, aux layout or missing bias misses by
 * orders of magnitude, without betting on cuBLASLt's last bits. F % 8 != 0
 * takes the separate kernels; the info line says how many GEMMs fused.
 * Under bf16, db is held to the bf16 GEMM bound with the BGRADB epilogue's
 * 2^-8 (check_gemm16 and the header), as matmul_bwd_bf16's.
 * Forward: in[N,IC] -> pre, out [N,F]; backward of out . w2^T, w2[IC,F]. */
static void t_matmul_gelu(st_t *s, int N, int IC, int F, int bf16)
{
    char what[160], dims[96];
    snprintf(dims, sizeof dims, "%s N=%d IC=%d F=%d", bf16 ? "bf16" : "fp32", N, IC, F);
    const size_t nin = (size_t)N * IC, nw = (size_t)F * IC, nf = (size_t)N * F;
    tp_t in, w, b, pre, out, w2, dy, din, dw, db;
    tb_t in16, w16, out16, w216, dy16;
    memset(&in, 0, sizeof in), w = b = pre = out = w2 = dy = din = dw = db = in;
    memset(&in16, 0, sizeof in16), w16 = out16 = w216 = dy16 = in16;
    long f0, s0, f1, s1;
    double *S_db = calloc((size_t)IC, sizeof(double)); /* sum over n of |dy[n, i]| */
    float *o_db = malloc((size_t)IC * sizeof(float));  /* db before an accumulating call */
    if (!S_db || !o_db) {
        s->oom = 1;
        goto out;
    }
    ops_cuda_gelu_epilogues(s->gpu, &f0, &s0);
    if (tp_new(s, &in, nin, -1, 1) || tp_new(s, &w, nw, -1, 1) || tp_new(s, &b, (size_t)F, -1, 1) ||
        tp_new(s, &pre, nf, 0, 0) || tp_new(s, &out, nf, 0, 0) || tp_new(s, &w2, nw, -1, 1) ||
        tp_new(s, &dy, nin, -1, 1) || tp_new(s, &din, nf, 0, 0) || tp_new(s, &dw, nw, -1, 1) ||
        tp_new(s, &db, (size_t)IC, -1, 1))
        goto out;
    if (bf16 && (tb_new(s, &in16, nin, in.h, 0, 0) || tb_new(s, &w16, nw, w.h, 0, 0) ||
                 tb_new(s, &w216, nw, w2.h, 0, 0) || tb_new(s, &dy16, nin, dy.h, 0, 0)))
        goto out;
    for (size_t i = 0; i < nin; i++)
        S_db[i % (size_t)IC] += fabs(dy.h[i]);
    poison(s, &pre), poison(s, &out), poison(s, &din);
    if (bf16) {
        s->cpu->matmul_gelu_fwd_bf16(s->cpu->ctx, out.h, NULL, pre.h, in16.h, w16.h, b.h, N, IC, F);
        s->gpu->matmul_gelu_fwd_bf16(s->gpu->ctx, out.d, NULL, pre.d, in16.d, w16.d, b.d, N, IC, F);
    } else {
        s->cpu->matmul_gelu_fwd(s->cpu->ctx, out.h, pre.h, in.h, w.h, b.h, N, IC, F);
        s->gpu->matmul_gelu_fwd(s->gpu->ctx, out.d, pre.d, in.d, w.d, b.d, N, IC, F);
    }
    snprintf(what, sizeof what, "matmul_gelu_fwd pre %s", dims);
    check(s, what, &pre, B_MATMUL);
    snprintf(what, sizeof what, "matmul_gelu_fwd out %s", dims);
    check(s, what, &out, B_EPI);
    /* the backward reads the CPU's pre and out on both sides, so only
     * the backward's own differences show */
    s->gpu->from_host(s->gpu->ctx, pre.d, pre.h, nf * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, out.d, out.h, nf * sizeof(float));
    if (bf16 && tb_new(s, &out16, nf, out.h, 0, 0))
        goto out;
    for (int accum = 0; accum < 2; accum++) {
        poison(s, &din);
        memcpy(o_db, db.h, (size_t)IC * sizeof(float));
        if (bf16) {
            s->cpu->matmul_dgelu_bwd_bf16(s->cpu->ctx, din.h, NULL, dw.h, db.h, dy16.h, dy.h, out16.h, pre.h, w216.h, N,
                                          F, IC, accum);
            s->gpu->matmul_dgelu_bwd_bf16(s->gpu->ctx, din.d, NULL, dw.d, db.d, dy16.d, dy.d, out16.d, pre.d, w216.d, N,
                                          F, IC, accum);
        } else {
            s->cpu->matmul_dgelu_bwd(s->cpu->ctx, din.h, dw.h, db.h, dy.h, out.h, pre.h, w2.h, N, F, IC, accum);
            s->gpu->matmul_dgelu_bwd(s->gpu->ctx, din.d, dw.d, db.d, dy.d, out.d, pre.d, w2.d, N, F, IC, accum);
        }
        snprintf(what, sizeof what, "matmul_dgelu_bwd din %s accum=%d", dims, accum);
        check(s, what, &din, B_EPI);
        snprintf(what, sizeof what, "matmul_dgelu_bwd dw %s accum=%d", dims, accum);
        check(s, what, &dw, B_MATMUL);
        snprintf(what, sizeof what, "matmul_dgelu_bwd db %s accum=%d", dims, accum);
        if (bf16)
            check_gemm16(s, what, &db, S_db, N, accum ? o_db : NULL, NULL, 1, 0x1p-8);
        else
            check(s, what, &db, B_MATMUL);
        /* the next round accumulates onto the CPU's values on both sides */
        s->gpu->from_host(s->gpu->ctx, dw.d, dw.h, nw * sizeof(float));
        s->gpu->from_host(s->gpu->ctx, db.d, db.h, (size_t)IC * sizeof(float));
    }
    ops_cuda_gelu_epilogues(s->gpu, &f1, &s1);
    fprintf(s->out, "info %-60s %ld of %ld GEMMs with cuBLASLt's GELU epilogue\n", dims, f1 - f0,
            (f1 - f0) + (s1 - s0));
out:
    tp_free(s, &in), tp_free(s, &w), tp_free(s, &b), tp_free(s, &pre), tp_free(s, &out);
    tp_free(s, &w2), tp_free(s, &dy), tp_free(s, &din), tp_free(s, &dw), tp_free(s, &db);
    tb_free(s, &in16), tb_free(s, &w16), tb_free(s, &out16), tb_free(s, &w216), tb_free(s, &dy16);
    free(S_db), free(o_db);
}

/* The largest term a norm's backward sums for din: max over rows of
 * rstd[r] * max_c |w[c] dout[r, c]| (host copies). */
static double norm_term_scale(const tp_t *rstd, const tp_t *w, const tp_t *dout, int N, int C)
{
    double m = 0.0;
    for (int r = 0; r < N; r++)
        for (int c = 0; c < C; c++) {
            double v = fabs((double)rstd->h[r] * w->h[c] * dout->h[(size_t)r * C + c]);
            m = v > m ? v : m;
        }
    return m;
}

static void t_norms(st_t *s, int N, int C)
{
    char what[128];
    tp_t x, w, b, out, mean, rstd, dout, din, dw, db;
    memset(&x, 0, sizeof x), w = b = out = mean = rstd = dout = din = dw = db = x;
    if (tp_new(s, &x, (size_t)N * C, -2, 2) || tp_new(s, &w, (size_t)C, 0.5f, 1.5f) ||
        tp_new(s, &b, (size_t)C, -1, 1) || tp_new(s, &out, (size_t)N * C, 0, 0) || tp_new(s, &mean, (size_t)N, 0, 0) ||
        tp_new(s, &rstd, (size_t)N, 0, 0) || tp_new(s, &dout, (size_t)N * C, -1, 1) ||
        tp_new(s, &din, (size_t)N * C, -1, 1) || tp_new(s, &dw, (size_t)C, -1, 1) || tp_new(s, &db, (size_t)C, -1, 1))
        goto out;
    const float eps = 1e-5f;
    s->cpu->layernorm_fwd(s->cpu->ctx, out.h, NULL, mean.h, rstd.h, x.h, w.h, b.h, N, C, eps);
    s->gpu->layernorm_fwd(s->gpu->ctx, out.d, NULL, mean.d, rstd.d, x.d, w.d, b.d, N, C, eps);
    snprintf(what, sizeof what, "layernorm_fwd out N=%d C=%d", N, C);
    check(s, what, &out, B_ROW);
    snprintf(what, sizeof what, "layernorm_fwd mean N=%d C=%d", N, C);
    check(s, what, &mean, B_ROW);
    snprintf(what, sizeof what, "layernorm_fwd rstd N=%d C=%d", N, C);
    check(s, what, &rstd, B_ROW);
    /* backward from the CPU's saved statistics on both sides */
    s->gpu->from_host(s->gpu->ctx, mean.d, mean.h, (size_t)N * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, rstd.d, rstd.h, (size_t)N * sizeof(float));
    for (int accum = 0; accum < 2; accum++) {
        tp_sync(s, &din), tp_sync(s, &dw), tp_sync(s, &db);
        s->cpu->layernorm_bwd(s->cpu->ctx, din.h, NULL, dw.h, db.h, dout.h, x.h, w.h, mean.h, rstd.h, N, C, accum);
        s->gpu->layernorm_bwd(s->gpu->ctx, din.d, NULL, dw.d, db.d, dout.d, x.d, w.d, mean.d, rstd.d, N, C, accum);
        snprintf(what, sizeof what, "layernorm_bwd din N=%d C=%d accum_dw=%d", N, C, accum);
        check_scaled(s, what, &din, B_ROW, norm_term_scale(&rstd, &w, &dout, N, C));
        snprintf(what, sizeof what, "layernorm_bwd dw N=%d C=%d accum_dw=%d", N, C, accum);
        check(s, what, &dw, B_ROW);
        snprintf(what, sizeof what, "layernorm_bwd db N=%d C=%d accum_dw=%d", N, C, accum);
        check(s, what, &db, B_ROW);
    }
    s->cpu->rmsnorm_fwd(s->cpu->ctx, out.h, NULL, rstd.h, x.h, w.h, N, C, eps);
    s->gpu->rmsnorm_fwd(s->gpu->ctx, out.d, NULL, rstd.d, x.d, w.d, N, C, eps);
    snprintf(what, sizeof what, "rmsnorm_fwd out N=%d C=%d", N, C);
    check(s, what, &out, B_ROW);
    snprintf(what, sizeof what, "rmsnorm_fwd rstd N=%d C=%d", N, C);
    check(s, what, &rstd, B_ROW);
    s->gpu->from_host(s->gpu->ctx, rstd.d, rstd.h, (size_t)N * sizeof(float));
    for (int accum = 0; accum < 2; accum++) {
        tp_sync(s, &din), tp_sync(s, &dw);
        s->cpu->rmsnorm_bwd(s->cpu->ctx, din.h, NULL, dw.h, dout.h, x.h, w.h, rstd.h, N, C, accum);
        s->gpu->rmsnorm_bwd(s->gpu->ctx, din.d, NULL, dw.d, dout.d, x.d, w.d, rstd.d, N, C, accum);
        snprintf(what, sizeof what, "rmsnorm_bwd din N=%d C=%d accum_dw=%d", N, C, accum);
        check_scaled(s, what, &din, B_ROW, norm_term_scale(&rstd, &w, &dout, N, C));
        snprintf(what, sizeof what, "rmsnorm_bwd dw N=%d C=%d accum_dw=%d", N, C, accum);
        check(s, what, &dw, B_ROW);
    }
out:
    tp_free(s, &x), tp_free(s, &w), tp_free(s, &b), tp_free(s, &out), tp_free(s, &mean);
    tp_free(s, &rstd), tp_free(s, &dout), tp_free(s, &din), tp_free(s, &dw), tp_free(s, &db);
}

/* Qwen3's q/k norms: in place on the q and k heads of qkv rows, then the
 * backward from the CPU's saved inputs and rstd on both sides. */
static void t_qknorm(st_t *s, int N, int NH, int NKV, int HS)
{
    char what[128];
    const size_t R = (size_t)(NH + 2 * NKV) * HS, nqk = (size_t)(NH + NKV);
    tp_t qkv, xin, rstd, wq, wk, dqkv, dwq, dwk;
    memset(&qkv, 0, sizeof qkv), xin = rstd = wq = wk = dqkv = dwq = dwk = qkv;
    if (tp_new(s, &qkv, N * R, -2, 2) || tp_new(s, &xin, N * nqk * HS, 0, 0) || tp_new(s, &rstd, N * nqk, 0, 0) ||
        tp_new(s, &wq, (size_t)HS, 0.5f, 1.5f) || tp_new(s, &wk, (size_t)HS, 0.5f, 1.5f) ||
        tp_new(s, &dqkv, N * R, -1, 1) || tp_new(s, &dwq, (size_t)HS, -1, 1) || tp_new(s, &dwk, (size_t)HS, -1, 1))
        goto out;
    const float eps = 1e-6f;
    s->cpu->qknorm_fwd(s->cpu->ctx, qkv.h, xin.h, rstd.h, wq.h, wk.h, N, NH, NKV, HS, eps);
    s->gpu->qknorm_fwd(s->gpu->ctx, qkv.d, xin.d, rstd.d, wq.d, wk.d, N, NH, NKV, HS, eps);
    snprintf(what, sizeof what, "qknorm_fwd qkv N=%d NH=%d NKV=%d HS=%d", N, NH, NKV, HS);
    check(s, what, &qkv, B_ROW);
    snprintf(what, sizeof what, "qknorm_fwd rstd N=%d NH=%d NKV=%d HS=%d", N, NH, NKV, HS);
    check(s, what, &rstd, B_ROW);
    tp_sync(s, &xin), tp_sync(s, &rstd);
    for (int accum = 0; accum < 2; accum++) {
        tp_sync(s, &dwq), tp_sync(s, &dwk);
        float *g0 = malloc(N * R * sizeof(float));
        if (!g0) {
            s->oom = 1;
            goto out;
        }
        memcpy(g0, dqkv.h, N * R * sizeof(float));
        s->cpu->qknorm_bwd(s->cpu->ctx, dqkv.h, dwq.h, dwk.h, xin.h, wq.h, wk.h, rstd.h, N, NH, NKV, HS, accum);
        s->gpu->qknorm_bwd(s->gpu->ctx, dqkv.d, dwq.d, dwk.d, xin.d, wq.d, wk.d, rstd.d, N, NH, NKV, HS, accum);
        snprintf(what, sizeof what, "qknorm_bwd dqkv N=%d HS=%d accum_dw=%d", N, HS, accum);
        check(s, what, &dqkv, B_ROW);
        snprintf(what, sizeof what, "qknorm_bwd dwq N=%d HS=%d accum_dw=%d", N, HS, accum);
        check(s, what, &dwq, B_ROW);
        snprintf(what, sizeof what, "qknorm_bwd dwk N=%d HS=%d accum_dw=%d", N, HS, accum);
        check(s, what, &dwk, B_ROW);
        /* the same incoming gradient for the accumulating pass */
        memcpy(dqkv.h, g0, N * R * sizeof(float));
        tp_sync(s, &dqkv);
        free(g0);
    }
out:
    tp_free(s, &qkv), tp_free(s, &xin), tp_free(s, &rstd), tp_free(s, &wq), tp_free(s, &wk);
    tp_free(s, &dqkv), tp_free(s, &dwq), tp_free(s, &dwk);
}

/* Document positions (base/ops.h) of n tokens in rows of T: documents of
 * 1, 37, 5, 70, 1, 37, ... tokens, restarting each row, so that they cross
 * tile edges, fill whole tiles and leave single-token documents. */
static void doc_positions(int32_t *pos, size_t n, int T)
{
    static const int len[] = {1, 37, 5, 70};
    int d = 0, p = 0;
    for (size_t i = 0; i < n; i++) {
        if (i % (size_t)T == 0 || p == len[d % 4]) {
            d = i % (size_t)T == 0 ? 0 : d + 1;
            p = 0;
        }
        pos[i] = p++;
    }
}

/* Flash-style attention (base/ops.h): the forward's out and lse, then the
 * backward's dqkv from the CPU's out and lse on both sides. The GPU outputs
 * start as NaN, so an element the GPU does not write fails (dqkv must be
 * written whole, zeros included); each GPU op runs a second time into
 * NaN-filled copies that must match the first bit for bit (no atomics, fixed
 * summation order). RoPE is checked on the way in and out, as before. docs:
 * rows packed with documents (doc_positions), masked and positioned by them. */
static void t_attention(st_t *s, int B, int T, int NH, int NKV, int HS, int docs)
{
    char what[128], dims[80];
    snprintf(dims, sizeof dims, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS, docs ? " docs" : "");
    const size_t R = (size_t)(NH + 2 * NKV) * HS, N = (size_t)B * T, NO = N * NH * HS, NL = (size_t)B * NH * T;
    tp_t qkv, out, lse, dout, dqkv, out2, lse2, dqkv2, freq;
    int32_t *pos = NULL, *dpos = NULL;
    memset(&qkv, 0, sizeof qkv), out = lse = dout = dqkv = out2 = lse2 = dqkv2 = freq = qkv;
    if (docs) {
        if (!(pos = malloc(N * sizeof *pos))) {
            s->oom = 1;
            return;
        }
        doc_positions(pos, N, T);
    }
    if ((docs && !(dpos = ints_dev(s, pos, N))) || tp_new(s, &qkv, N * R, -1, 1) || tp_new(s, &out, NO, 0, 0) ||
        tp_new(s, &lse, NL, 0, 0) || tp_new(s, &dout, NO, -1, 1) || tp_new(s, &dqkv, N * R, 0, 0) ||
        tp_new(s, &out2, NO, 0, 0) || tp_new(s, &lse2, NL, 0, 0) || tp_new(s, &dqkv2, N * R, 0, 0) ||
        tp_new(s, &freq, (size_t)HS / 2, 0, 0))
        goto out;
    /* theta 10000, the upper half of the pairs slowed down 8x as a
     * scaled table (llama3's low frequencies) would be */
    for (int i = 0; i < HS / 2; i++)
        freq.h[i] = dt_rope_inv_freq(i, HS, 10000.0f) / (2 * i >= HS / 2 ? 8.0f : 1.0f);
    tp_sync(s, &freq);
    s->cpu->rope_fwd(s->cpu->ctx, qkv.h, pos, B, T, NH, NKV, HS, freq.h);
    s->gpu->rope_fwd(s->gpu->ctx, qkv.d, dpos, B, T, NH, NKV, HS, freq.d);
    snprintf(what, sizeof what, "rope_fwd %s", dims);
    check(s, what, &qkv, B_ROW);
    s->gpu->from_host(s->gpu->ctx, qkv.d, qkv.h, N * R * sizeof(float));

    poison(s, &out), poison(s, &lse), poison(s, &out2), poison(s, &lse2);
    s->cpu->attention_fwd(s->cpu->ctx, out.h, NULL, lse.h, qkv.h, pos, B, T, NH, NKV, HS);
    s->gpu->attention_fwd(s->gpu->ctx, out.d, NULL, lse.d, qkv.d, dpos, B, T, NH, NKV, HS);
    s->gpu->attention_fwd(s->gpu->ctx, out2.d, NULL, lse2.d, qkv.d, dpos, B, T, NH, NKV, HS);
    snprintf(what, sizeof what, "attention_fwd out %s", dims);
    check(s, what, &out, B_ROW);
    snprintf(what, sizeof what, "attention_fwd lse %s", dims);
    check_log(s, what, &lse, B_ROW);
    snprintf(what, sizeof what, "attention_fwd out run to run %s", dims);
    check_same(s, what, &out, &out2);
    snprintf(what, sizeof what, "attention_fwd lse run to run %s", dims);
    check_same(s, what, &lse, &lse2);

    /* backward from the CPU's forward outputs on both sides */
    s->gpu->from_host(s->gpu->ctx, out.d, out.h, NO * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, lse.d, lse.h, NL * sizeof(float));
    poison(s, &dqkv), poison(s, &dqkv2);
    s->cpu->attention_bwd(s->cpu->ctx, dqkv.h, NULL, dout.h, qkv.h, out.h, lse.h, pos, B, T, NH, NKV, HS);
    s->gpu->attention_bwd(s->gpu->ctx, dqkv.d, NULL, dout.d, qkv.d, out.d, lse.d, dpos, B, T, NH, NKV, HS);
    s->gpu->attention_bwd(s->gpu->ctx, dqkv2.d, NULL, dout.d, qkv.d, out.d, lse.d, dpos, B, T, NH, NKV, HS);
    snprintf(what, sizeof what, "attention_bwd dqkv %s", dims);
    check(s, what, &dqkv, B_ROW);
    snprintf(what, sizeof what, "attention_bwd dqkv run to run %s", dims);
    check_same(s, what, &dqkv, &dqkv2);

    /* rope_bwd from an identical start: the CPU's attention gradient */
    s->gpu->from_host(s->gpu->ctx, dqkv.d, dqkv.h, N * R * sizeof(float));
    s->cpu->rope_bwd(s->cpu->ctx, dqkv.h, NULL, pos, B, T, NH, NKV, HS, freq.h);
    s->gpu->rope_bwd(s->gpu->ctx, dqkv.d, NULL, dpos, B, T, NH, NKV, HS, freq.d);
    snprintf(what, sizeof what, "rope_bwd %s", dims);
    check(s, what, &dqkv, B_ROW);
out:
    free(pos);
    if (dpos)
        s->gpu->free(s->gpu->ctx, dpos);
    tp_free(s, &qkv), tp_free(s, &out), tp_free(s, &lse), tp_free(s, &dout), tp_free(s, &dqkv);
    tp_free(s, &out2), tp_free(s, &lse2), tp_free(s, &dqkv2), tp_free(s, &freq);
}

/* Ring attention's blocks (base/ops.h, context parallelism): the K,V pack
 * and unpack (written and accumulated) at 0 ulp (copies and one add), then
 * one block of a zigzag layout: rank qr's queries against rank kr's K,V
 * block (T cut in 2 cp chunks, rank r holding chunks r and 2 cp - 1 - r;
 * qpos, kpos their global positions), rows [q0, q0 + nq) x keys [k0, k0 +
 * nk). Forward out and lse at the attention bounds (lse -inf exactly where
 * the CPU's, the rows with no key in the block; a full block's outputs start
 * as NaN on the GPU), twice bit-identical; the merge of two such partial
 * results at B_ELEM (the same per-element formula, the GPU's expf and
 * log1pf within an ulp or two); the backward accumulated twice into zeroed
 * dqkv and dkv (so the second call must add, not write) at B_ROW, and a
 * second GPU pair bit-identical. docs: documents over the whole sequence
 * (doc_positions), crossing the chunk edges. */
static void zigzag_positions(int32_t *p, int T, int cp, int r)
{
    const int c = T / (2 * cp);
    for (int t = 0; t < c; t++) {
        p[t] = r * c + t;
        p[c + t] = (2 * cp - 1 - r) * c + t;
    }
}

static void t_ring(st_t *s, const int *c, int docs)
{
    const int B = c[0], T = c[1], cp = c[2], qr = c[3], kr = c[4], NH = c[5], NKV = c[6], HS = c[7];
    const int L = T / cp;
    const att_block_t k = {B, NH, NKV, HS, L, c[8], c[9], L, c[10], c[11], c[12]};
    char what[160], dims[120];
    snprintf(dims, sizeof dims, "B=%d T=%d cp=%d q%d:%d+%d k%d:%d+%d NH=%d NKV=%d HS=%d%s%s", B, T, cp, qr, k.q0, k.nq,
             kr, k.k0, k.nk, NH, NKV, HS, k.causal ? " causal" : "", docs ? " docs" : "");
    const size_t R = (size_t)(NH + 2 * NKV) * HS, KR = (size_t)2 * NKV * HS, N = (size_t)B * L, NO = N * NH * HS,
                 NL = (size_t)B * NH * L;
    tp_t qkv, kvsrc, kv, out, lse, out2, lse2, pout, plse, dout, dq, dkv, dq2, dkv2, dun;
    int32_t *qpos = malloc(2 * (size_t)L * sizeof(int32_t)), *kpos = qpos ? qpos + L : NULL;
    int32_t *qdoc = NULL, *all = NULL, *dqpos = NULL, *dkpos = NULL, *dqdoc = NULL;
    memset(&qkv, 0, sizeof qkv);
    kvsrc = kv = out = lse = out2 = lse2 = pout = plse = dout = dq = dkv = dq2 = dkv2 = dun = qkv;
    if (!qpos) {
        s->oom = 1;
        return;
    }
    zigzag_positions(qpos, T, cp, qr);
    zigzag_positions(kpos, T, cp, kr);
    if (docs) {
        qdoc = malloc(N * sizeof *qdoc);
        all = malloc((size_t)B * T * sizeof *all);
        if (!qdoc || !all) {
            s->oom = 1;
            goto out;
        }
        doc_positions(all, (size_t)B * T, T);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < L; t++)
                qdoc[(size_t)b * L + t] = qpos[t] - all[(size_t)b * T + qpos[t]];
        if (!(dqdoc = ints_dev(s, qdoc, N)))
            goto out;
    }
    if (!(dqpos = ints_dev(s, qpos, (size_t)L)) || !(dkpos = ints_dev(s, kpos, (size_t)L)) ||
        tp_new(s, &qkv, N * R, -1, 1) || tp_new(s, &kvsrc, N * R, -1, 1) || tp_new(s, &kv, N * KR, 0, 0) ||
        tp_new(s, &out, NO, 0, 0) || tp_new(s, &lse, NL, 0, 0) || tp_new(s, &out2, NO, 0, 0) ||
        tp_new(s, &lse2, NL, 0, 0) || tp_new(s, &pout, NO, -1, 1) || tp_new(s, &plse, NL, -4, 4) ||
        tp_new(s, &dout, NO, -1, 1) || tp_new(s, &dq, N * R, 0, 0) || tp_new(s, &dkv, N * KR, 0, 0) ||
        tp_new(s, &dq2, N * R, 0, 0) || tp_new(s, &dkv2, N * KR, 0, 0) || tp_new(s, &dun, N * R, -1, 1))
        goto out;

    /* the travelling block: pack, and its gradient unpacked (=, then +=) */
    poison(s, &kv);
    s->cpu->attention_kv_pack(s->cpu->ctx, kv.h, kvsrc.h, (int)N, NH, NKV, HS);
    s->gpu->attention_kv_pack(s->gpu->ctx, kv.d, kvsrc.d, (int)N, NH, NKV, HS);
    snprintf(what, sizeof what, "attention_kv_pack %s", dims);
    check(s, what, &kv, B_EXACT);
    for (int accum = 0; accum < 2; accum++) {
        s->cpu->attention_kv_unpack(s->cpu->ctx, dun.h, kvsrc.h, (int)N, NH, NKV, HS, accum);
        s->gpu->attention_kv_unpack(s->gpu->ctx, dun.d, kvsrc.d, (int)N, NH, NKV, HS, accum);
        snprintf(what, sizeof what, "attention_kv_unpack accum %d %s", accum, dims);
        check(s, what, &dun, B_EXACT);
    }

    /* forward: a full block's outputs start as NaN (all written); a partial
     * one's equal on both sides (rows outside untouched) */
    const int full = k.q0 == 0 && k.nq == L;
    if (full)
        poison(s, &out), poison(s, &lse), poison(s, &out2), poison(s, &lse2);
    s->cpu->attention_block_fwd(s->cpu->ctx, out.h, lse.h, qkv.h, kv.h, qpos, kpos, qdoc, &k);
    s->gpu->attention_block_fwd(s->gpu->ctx, out.d, lse.d, qkv.d, kv.d, dqpos, dkpos, dqdoc, &k);
    s->gpu->attention_block_fwd(s->gpu->ctx, out2.d, lse2.d, qkv.d, kv.d, dqpos, dkpos, dqdoc, &k);
    snprintf(what, sizeof what, "attention_block_fwd out %s", dims);
    check(s, what, &out, B_ROW);
    snprintf(what, sizeof what, "attention_block_fwd lse %s", dims);
    check_log(s, what, &lse, B_ROW);
    snprintf(what, sizeof what, "attention_block_fwd out run to run %s", dims);
    check_same(s, what, &out, &out2);
    snprintf(what, sizeof what, "attention_block_fwd lse run to run %s", dims);
    check_same(s, what, &lse, &lse2);

    /* merge into the CPU's block result a random partial one, -inf in
     * every third row (and so both -inf where the block had no key) */
    for (size_t i = 0; i < NL; i += 3)
        plse.h[i] = -INFINITY;
    tp_sync(s, &plse), tp_sync(s, &out), tp_sync(s, &lse);
    s->cpu->attention_merge(s->cpu->ctx, out.h, lse.h, pout.h, plse.h, &k);
    s->gpu->attention_merge(s->gpu->ctx, out.d, lse.d, pout.d, plse.d, &k);
    snprintf(what, sizeof what, "attention_merge out %s", dims);
    check(s, what, &out, B_ELEM);
    snprintf(what, sizeof what, "attention_merge lse %s", dims);
    check_log(s, what, &lse, B_ELEM);

    /* backward from the merged (CPU) out and lse, twice into zeroes */
    tp_sync(s, &out), tp_sync(s, &lse);
    for (int rep = 0; rep < 2; rep++) {
        s->cpu->attention_block_bwd(s->cpu->ctx, dq.h, dkv.h, dout.h, qkv.h, kv.h, out.h, lse.h, qpos, kpos, qdoc, &k);
        s->gpu->attention_block_bwd(s->gpu->ctx, dq.d, dkv.d, dout.d, qkv.d, kv.d, out.d, lse.d, dqpos, dkpos, dqdoc,
                                    &k);
        s->gpu->attention_block_bwd(s->gpu->ctx, dq2.d, dkv2.d, dout.d, qkv.d, kv.d, out.d, lse.d, dqpos, dkpos, dqdoc,
                                    &k);
    }
    snprintf(what, sizeof what, "attention_block_bwd dq (twice) %s", dims);
    check(s, what, &dq, B_ROW);
    snprintf(what, sizeof what, "attention_block_bwd dkv (twice) %s", dims);
    check(s, what, &dkv, B_ROW);
    snprintf(what, sizeof what, "attention_block_bwd dq run to run %s", dims);
    check_same(s, what, &dq, &dq2);
    snprintf(what, sizeof what, "attention_block_bwd dkv run to run %s", dims);
    check_same(s, what, &dkv, &dkv2);
out:
    free(qpos), free(qdoc), free(all);
    if (dqpos)
        s->gpu->free(s->gpu->ctx, dqpos);
    if (dkpos)
        s->gpu->free(s->gpu->ctx, dkpos);
    if (dqdoc)
        s->gpu->free(s->gpu->ctx, dqdoc);
    tp_free(s, &qkv), tp_free(s, &kvsrc), tp_free(s, &kv), tp_free(s, &out), tp_free(s, &lse);
    tp_free(s, &out2), tp_free(s, &lse2), tp_free(s, &pout), tp_free(s, &plse), tp_free(s, &dout);
    tp_free(s, &dq), tp_free(s, &dkv), tp_free(s, &dq2), tp_free(s, &dkv2), tp_free(s, &dun);
}

/* max |gpu - ref| over the columns [c0, c1) of the rows of x[rows, R]
 * against bound * max |ref| there + floor; NaN or an element left unwritten
 * fails. One line, err = max |diff| / max |ref|. */
static void check_cols(st_t *s, const char *what, const float *ref, const float *got, size_t rows, size_t R, size_t c0,
                       size_t c1, double bound, double floor)
{
    double maxref = 0.0, maxdiff = 0.0;
    int bad = 0;
    for (size_t n = 0; n < rows; n++)
        for (size_t c = c0; c < c1; c++) {
            const double a = ref[n * R + c], b = got[n * R + c];
            bad |= !isfinite(b);
            maxref = fabs(a) > maxref ? fabs(a) : maxref;
            maxdiff = isfinite(b) && fabs(a - b) > maxdiff ? fabs(a - b) : maxdiff;
        }
    const int ok = !bad && maxdiff <= bound * maxref + floor;
    s->run++;
    if (!ok)
        s->failed++;
    fprintf(s->out, "%s %-60s err %.2e (bound %.0e + %.1e abs)%s\n", ok ? "ok  " : "FAIL", what,
            maxref > 0 ? maxdiff / maxref : maxdiff, bound, floor, bad ? " nan/inf" : "");
}

/* The tensor-core attention (--dtype bf16, head sizes 64 and 128;
 * cuda/ops_cuda_attention.cuh) on s->gpu, a table made with bf16: the ops
 * take fp32 qkv and dout (random, not bf16 values) and round them to bf16
 * themselves, so the reference is the CPU's fp32 attention of the rounded
 * values. Bounds, those test/emu/test_att_mma_emu.cpp and
 * test_att_mma_bwd_emu.cpp derive (P and dS rounded to bf16 as mma
 * operands, 2^-9 relative each): out within 2^-8 max |v| (check_scaled with
 * that scale), lse 1e-5 (fp32 order and exp2); the backward from the GPU
 * forward's out and lse on both sides, dQ, dK and dV each within 2^-7 of
 * its max |ref| plus, for dQ and dK, 2^-20 HS scale max |dout| max |v| max
 * |q, k| (the fp32 rounding of dP - D, all there is at T = 1). Each op runs
 * twice: bit-identical. */
static void t_attention_mma(st_t *s, int B, int T, int NH, int NKV, int HS, int docs)
{
    char what[128], dims[80];
    snprintf(dims, sizeof dims, "B=%d T=%d NH=%d NKV=%d HS=%d%s", B, T, NH, NKV, HS, docs ? " docs" : "");
    const size_t R = (size_t)(NH + 2 * NKV) * HS, N = (size_t)B * T, NO = N * NH * HS, NL = (size_t)B * NH * T;
    tp_t qkv, out, lse, dout, dqkv, out2, lse2, dqkv2;
    int32_t *pos = NULL, *dpos = NULL;
    float *qr = NULL, *dr = NULL, *got = NULL;
    memset(&qkv, 0, sizeof qkv), out = lse = dout = dqkv = out2 = lse2 = dqkv2 = qkv;
    if (docs) {
        if (!(pos = malloc(N * sizeof *pos))) {
            s->oom = 1;
            return;
        }
        doc_positions(pos, N, T);
    }
    if ((docs && !(dpos = ints_dev(s, pos, N))) || tp_new(s, &qkv, N * R, -2, 2) || tp_new(s, &out, NO, 0, 0) ||
        tp_new(s, &lse, NL, 0, 0) || tp_new(s, &dout, NO, -1, 1) || tp_new(s, &dqkv, N * R, 0, 0) ||
        tp_new(s, &out2, NO, 0, 0) || tp_new(s, &lse2, NL, 0, 0) || tp_new(s, &dqkv2, N * R, 0, 0) ||
        !(qr = malloc(N * R * sizeof *qr)) || !(dr = malloc(NO * sizeof *dr)) || !(got = malloc(N * R * sizeof *got))) {
        s->oom = 1;
        goto out;
    }
    double mq = 0.0, mv = 0.0, mdo = 0.0;
    for (size_t i = 0; i < N * R; i++) {
        qr[i] = dt_bf16_to_f32(dt_f32_to_bf16(qkv.h[i]));
        double *m = i % R < (size_t)(NH + NKV) * HS ? &mq : &mv;
        *m = fabs(qr[i]) > *m ? fabs(qr[i]) : *m;
    }
    for (size_t i = 0; i < NO; i++) {
        dr[i] = dt_bf16_to_f32(dt_f32_to_bf16(dout.h[i]));
        mdo = fabs(dr[i]) > mdo ? fabs(dr[i]) : mdo;
    }

    poison(s, &out), poison(s, &lse), poison(s, &out2), poison(s, &lse2);
    s->cpu->attention_fwd(s->cpu->ctx, out.h, NULL, lse.h, qr, pos, B, T, NH, NKV, HS);
    s->gpu->attention_fwd(s->gpu->ctx, out.d, NULL, lse.d, qkv.d, dpos, B, T, NH, NKV, HS);
    s->gpu->attention_fwd(s->gpu->ctx, out2.d, NULL, lse2.d, qkv.d, dpos, B, T, NH, NKV, HS);
    snprintf(what, sizeof what, "attention_fwd mma out %s", dims);
    check_scaled(s, what, &out, 1.0 / 256, mv);
    snprintf(what, sizeof what, "attention_fwd mma lse %s", dims);
    check_log(s, what, &lse, B_ROW);
    snprintf(what, sizeof what, "attention_fwd mma out run to run %s", dims);
    check_same(s, what, &out, &out2);
    snprintf(what, sizeof what, "attention_fwd mma lse run to run %s", dims);
    check_same(s, what, &lse, &lse2);

    /* backward from the GPU's forward outputs on both sides */
    s->gpu->to_host(s->gpu->ctx, out.h, out.d, NO * sizeof(float));
    s->gpu->to_host(s->gpu->ctx, lse.h, lse.d, NL * sizeof(float));
    poison(s, &dqkv), poison(s, &dqkv2);
    s->cpu->attention_bwd(s->cpu->ctx, dqkv.h, NULL, dr, qr, out.h, lse.h, pos, B, T, NH, NKV, HS);
    s->gpu->attention_bwd(s->gpu->ctx, dqkv.d, NULL, dout.d, qkv.d, out.d, lse.d, dpos, B, T, NH, NKV, HS);
    s->gpu->attention_bwd(s->gpu->ctx, dqkv2.d, NULL, dout.d, qkv.d, out.d, lse.d, dpos, B, T, NH, NKV, HS);
    s->gpu->to_host(s->gpu->ctx, got, dqkv.d, N * R * sizeof(float));
    const double floor_qk = ldexp(HS * mdo * mv * mq / sqrt((double)HS), -20);
    const size_t c0[4] = {0, (size_t)NH * HS, (size_t)(NH + NKV) * HS, R};
    static const char *const name[3] = {"dq", "dk", "dv"};
    for (int gi = 0; gi < 3; gi++) {
        snprintf(what, sizeof what, "attention_bwd mma %s %s", name[gi], dims);
        check_cols(s, what, dqkv.h, got, N, R, c0[gi], c0[gi + 1], 1.0 / 128, gi < 2 ? floor_qk : 0.0);
    }
    snprintf(what, sizeof what, "attention_bwd mma dqkv run to run %s", dims);
    check_same(s, what, &dqkv, &dqkv2);
out:
    free(pos), free(qr), free(dr), free(got);
    if (dpos)
        s->gpu->free(s->gpu->ctx, dpos);
    tp_free(s, &qkv), tp_free(s, &out), tp_free(s, &lse), tp_free(s, &dout), tp_free(s, &dqkv);
    tp_free(s, &out2), tp_free(s, &lse2), tp_free(s, &dqkv2);
}

static void t_elementwise(st_t *s, size_t n, int F)
{
    char what[128];
    tp_t x, y, dout, out, gu, dgu, o2;
    memset(&x, 0, sizeof x), y = dout = out = gu = dgu = o2 = x;
    const int N = (int)(n / (size_t)F);
    if (tp_new(s, &x, n, -6, 6) || tp_new(s, &y, n, -3, 3) || tp_new(s, &dout, n, -1, 1) || tp_new(s, &out, n, 0, 0) ||
        tp_new(s, &gu, 2 * (size_t)N * F, -6, 6) || tp_new(s, &dgu, 2 * (size_t)N * F, 0, 0) ||
        tp_new(s, &o2, (size_t)N * F, 0, 0))
        goto out;
    s->cpu->gelu_fwd(s->cpu->ctx, out.h, NULL, x.h, n);
    s->gpu->gelu_fwd(s->gpu->ctx, out.d, NULL, x.d, n);
    snprintf(what, sizeof what, "gelu_fwd n=%zu", n);
    check(s, what, &out, B_ELEM);
    s->cpu->gelu_bwd(s->cpu->ctx, out.h, x.h, dout.h, n);
    s->gpu->gelu_bwd(s->gpu->ctx, out.d, x.d, dout.d, n);
    snprintf(what, sizeof what, "gelu_bwd n=%zu", n);
    check(s, what, &out, B_ELEM);
    s->cpu->swiglu_fwd(s->cpu->ctx, o2.h, NULL, gu.h, N, F);
    s->gpu->swiglu_fwd(s->gpu->ctx, o2.d, NULL, gu.d, N, F);
    snprintf(what, sizeof what, "swiglu_fwd N=%d F=%d", N, F);
    check(s, what, &o2, B_ELEM);
    s->cpu->swiglu_bwd(s->cpu->ctx, dgu.h, NULL, gu.h, dout.h, N, F);
    s->gpu->swiglu_bwd(s->gpu->ctx, dgu.d, NULL, gu.d, dout.d, N, F);
    snprintf(what, sizeof what, "swiglu_bwd N=%d F=%d", N, F);
    check(s, what, &dgu, B_ELEM);
    s->cpu->add(s->cpu->ctx, out.h, x.h, y.h, n);
    s->gpu->add(s->gpu->ctx, out.d, x.d, y.d, n);
    snprintf(what, sizeof what, "add n=%zu", n);
    check(s, what, &out, B_EXACT);
    s->cpu->add(s->cpu->ctx, x.h, x.h, y.h, n); /* aliased output */
    s->gpu->add(s->gpu->ctx, x.d, x.d, y.d, n);
    snprintf(what, sizeof what, "add (out aliases a) n=%zu", n);
    check(s, what, &x, B_EXACT);
    s->cpu->scale(s->cpu->ctx, y.h, -0.37f, n);
    s->gpu->scale(s->gpu->ctx, y.d, -0.37f, n);
    snprintf(what, sizeof what, "scale n=%zu", n);
    check(s, what, &y, B_EXACT);
    {
        /* three vectors at once (one empty) against the CPU, and each the
         * bits the GPU gives it alone */
        const float *xh[3] = {x.h, y.h + 1, x.h}, *xd[3] = {x.d, y.d + 1, x.d};
        const size_t ns[3] = {n, n - 1, 0};
        double a[3], b[3], one;
        s->cpu->sumsq(s->cpu->ctx, a, xh, ns, 3);
        s->gpu->sumsq(s->gpu->ctx, b, xd, ns, 3);
        size_t bad = 0;
        for (int v = 0; v < 3; v++) {
            snprintf(what, sizeof what, "sumsq n=%zu (vector %d of 3)", ns[v], v);
            check_val(s, what, a[v], b[v], B_ELEM);
            s->gpu->sumsq(s->gpu->ctx, &one, &xd[v], &ns[v], 1);
            bad += memcmp(&one, &b[v], sizeof one) != 0;
        }
        snprintf(what, sizeof what, "sumsq: 3 vectors at once, each the bits of its own call");
        check_bits(s, what, bad, 3);
    }
out:
    tp_free(s, &x), tp_free(s, &y), tp_free(s, &dout), tp_free(s, &out), tp_free(s, &gu);
    tp_free(s, &dgu), tp_free(s, &o2);
}

/* Step 1 without and step 10 with the fused bf16 copy p16, which must be
 * each backend's own p rounded to bf16, bit for bit (the CPU's and the
 * GPU's p differ within B_ELEM, so their p16 may differ at a rounding
 * boundary: each is checked against its own p). */
static void t_adamw(st_t *s, size_t n)
{
    char what[128];
    tp_t p, gr, m, v;
    tb_t q;
    memset(&p, 0, sizeof p), gr = m = v = p;
    memset(&q, 0, sizeof q);
    float *gp = malloc((n ? n : 1) * sizeof *gp);
    uint16_t *gq = malloc((n ? n : 1) * sizeof *gq);
    if (!gp || !gq) {
        s->oom = 1;
        goto out;
    }
    if (tp_new(s, &p, n, -1, 1) || tp_new(s, &gr, n, -1, 1) || tp_new(s, &m, n, -0.1f, 0.1f) ||
        tp_new(s, &v, n, 0, 0.01f) || tb_new(s, &q, n, NULL, 0, 1))
        goto out;
    for (int t = 1; t <= 10; t += 9) {
        const int fused = t > 1;
        s->cpu->adamw(s->cpu->ctx, p.h, fused ? q.h : NULL, gr.h, m.h, v.h, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                      t);
        s->gpu->adamw(s->gpu->ctx, p.d, fused ? q.d : NULL, gr.d, m.d, v.d, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f,
                      t);
        snprintf(what, sizeof what, "adamw p n=%zu t=%d%s", n, t, fused ? " (with p16)" : "");
        check(s, what, &p, B_ELEM);
        snprintf(what, sizeof what, "adamw m n=%zu t=%d", n, t);
        check(s, what, &m, B_ELEM);
        snprintf(what, sizeof what, "adamw v n=%zu t=%d", n, t);
        check(s, what, &v, B_ELEM);
    }
    s->gpu->to_host(s->gpu->ctx, gp, p.d, n * sizeof(float));
    s->gpu->to_host(s->gpu->ctx, gq, q.d, n * sizeof(uint16_t));
    size_t bad_cpu = 0, bad_gpu = 0;
    for (size_t i = 0; i < n; i++) {
        bad_cpu += q.h[i] != dt_f32_to_bf16(p.h[i]);
        bad_gpu += gq[i] != dt_f32_to_bf16(gp[i]);
    }
    snprintf(what, sizeof what, "adamw p16 = bf16(p) n=%zu (cpu)", n);
    check_bits(s, what, bad_cpu, n);
    snprintf(what, sizeof what, "adamw p16 = bf16(p) n=%zu (cuda)", n);
    check_bits(s, what, bad_gpu, n);
out:
    free(gp);
    free(gq);
    tp_free(s, &p), tp_free(s, &gr), tp_free(s, &m), tp_free(s, &v);
    tb_free(s, &q);
}

/* Tokens of a vocabulary of V split at v0 (this rank holds [v0, v0+Vl)),
 * with repeats, so the backward sums several rows into one. */
static void t_embedding(st_t *s, int N, int T, int C, int V, int v0, int Vl)
{
    char what[128], dims[80];
    snprintf(dims, sizeof dims, "N=%d T=%d C=%d V=%d rows [%d,%d)", N, T, C, V, v0, v0 + Vl);
    int32_t *tok = malloc((size_t)N * sizeof *tok), *dtok = NULL, *dpos = NULL;
    int32_t *dp = malloc((size_t)N * sizeof *dp);
    tp_t wte, wpe, out, dout, dwte, dwpe;
    memset(&wte, 0, sizeof wte), wpe = out = dout = dwte = dwpe = wte;
    if (!tok || !dp) {
        free(tok);
        free(dp);
        s->oom = 1;
        return;
    }
    for (int n = 0; n < N; n++)
        tok[n] = (int32_t)(frand(s, 0, 1) * (float)V) % V;
    doc_positions(dp, (size_t)N, T);
    if (!(dtok = ints_dev(s, tok, (size_t)N)) || !(dpos = ints_dev(s, dp, (size_t)N)) ||
        tp_new(s, &wte, (size_t)Vl * C, -1, 1) || tp_new(s, &wpe, (size_t)T * C, -1, 1) ||
        tp_new(s, &out, (size_t)N * C, 0, 0) || tp_new(s, &dout, (size_t)N * C, -1, 1) ||
        tp_new(s, &dwte, (size_t)Vl * C, -1, 1) || tp_new(s, &dwpe, (size_t)T * C, -1, 1))
        goto out;
    /* pos: 0 none, 1 wpe by n % T, 2 wpe by document position */
    for (int pos = 0; pos < 3; pos++) {
        const int32_t *hp = pos == 2 ? dp : NULL, *gp = pos == 2 ? dpos : NULL;
        s->cpu->embedding_fwd(s->cpu->ctx, out.h, tok, hp, wte.h, pos ? wpe.h : NULL, N, T, C, v0, Vl);
        s->gpu->embedding_fwd(s->gpu->ctx, out.d, dtok, gp, wte.d, pos ? wpe.d : NULL, N, T, C, v0, Vl);
        snprintf(what, sizeof what, "embedding_fwd%s %s", pos == 2 ? " +wpe docs" : pos ? " +wpe" : "", dims);
        check(s, what, &out, B_EXACT);
    }
    for (int k = 0; k < 4; k++) {
        const int accum = k & 1, docs = k >> 1;
        s->cpu->embedding_bwd(s->cpu->ctx, dwte.h, dwpe.h, dout.h, tok, docs ? dp : NULL, N, T, C, v0, Vl, accum);
        s->gpu->embedding_bwd(s->gpu->ctx, dwte.d, dwpe.d, dout.d, dtok, docs ? dpos : NULL, N, T, C, v0, Vl, accum);
        snprintf(what, sizeof what, "embedding_bwd dwte accum=%d%s %s", accum, docs ? " docs" : "", dims);
        check(s, what, &dwte, B_EXACT);
        snprintf(what, sizeof what, "embedding_bwd dwpe accum=%d%s %s", accum, docs ? " docs" : "", dims);
        check(s, what, &dwpe, B_EXACT);
    }
out:
    free(tok);
    free(dp);
    if (dpos)
        s->gpu->free(s->gpu->ctx, dpos);
    if (dtok)
        s->gpu->free(s->gpu->ctx, dtok);
    tp_free(s, &wte), tp_free(s, &wpe), tp_free(s, &out), tp_free(s, &dout), tp_free(s, &dwte);
    tp_free(s, &dwpe);
}

/* The three cross-entropy passes on both sides, each compared; rows with
 * an ignored target (-1) and targets outside this rank's columns. */
static void t_xent(st_t *s, int N, int Vl, int ld, int v0, int V)
{
    char what[128], dims[64];
    snprintf(dims, sizeof dims, "N=%d Vl=%d ld=%d v0=%d", N, Vl, ld, v0);
    int32_t *tgt = malloc((size_t)N * sizeof *tgt), *dtgt = NULL;
    tp_t logits, rowmax, stats, losses, logits2;
    memset(&logits, 0, sizeof logits), rowmax = stats = losses = logits2 = logits;
    if (!tgt) {
        s->oom = 1;
        return;
    }
    for (int n = 0; n < N; n++)
        tgt[n] = n % 5 == 4 ? -1 : (int32_t)(frand(s, 0, 1) * (float)V) % V;
    if (!(dtgt = ints_dev(s, tgt, (size_t)N)) || tp_new(s, &logits, (size_t)N * ld, -8, 8) ||
        tp_new(s, &rowmax, (size_t)N, 0, 0) || tp_new(s, &stats, 2 * (size_t)N, 0, 0) ||
        tp_new(s, &losses, (size_t)N, 0, 0) || tp_new(s, &logits2, (size_t)N * ld, 0, 0))
        goto out;
    memcpy(logits2.h, logits.h, logits.n * sizeof(float));
    s->gpu->from_host(s->gpu->ctx, logits2.d, logits2.h, logits.n * sizeof(float));
    s->cpu->xent_max(s->cpu->ctx, rowmax.h, logits.h, N, Vl, ld);
    s->gpu->xent_max(s->gpu->ctx, rowmax.d, logits.d, N, Vl, ld);
    snprintf(what, sizeof what, "xent_max %s", dims);
    check(s, what, &rowmax, B_EXACT);
    /* losses only (no expbuf) */
    s->cpu->xent_sumexp(s->cpu->ctx, stats.h, NULL, logits.h, rowmax.h, tgt, v0, N, Vl, ld);
    s->gpu->xent_sumexp(s->gpu->ctx, stats.d, NULL, logits.d, rowmax.d, dtgt, v0, N, Vl, ld);
    snprintf(what, sizeof what, "xent_sumexp stats %s", dims);
    check(s, what, &stats, B_ROW);
    s->cpu->xent_finish(s->cpu->ctx, losses.h, NULL, NULL, rowmax.h, stats.h, tgt, v0, N, Vl, ld, 1.0f);
    s->gpu->xent_finish(s->gpu->ctx, losses.d, NULL, NULL, rowmax.d, stats.d, dtgt, v0, N, Vl, ld, 1.0f);
    snprintf(what, sizeof what, "xent_finish losses %s", dims);
    check(s, what, &losses, B_ROW);
    /* with gradients, exps kept in place (expbuf aliases the logits) */
    s->cpu->xent_sumexp(s->cpu->ctx, stats.h, logits2.h, logits2.h, rowmax.h, tgt, v0, N, Vl, ld);
    s->gpu->xent_sumexp(s->gpu->ctx, stats.d, logits2.d, logits2.d, rowmax.d, dtgt, v0, N, Vl, ld);
    snprintf(what, sizeof what, "xent_sumexp in place exps %s", dims);
    check(s, what, &logits2, B_ROW);
    s->gpu->from_host(s->gpu->ctx, stats.d, stats.h, stats.n * sizeof(float));
    s->cpu->xent_finish(s->cpu->ctx, losses.h, logits2.h, NULL, rowmax.h, stats.h, tgt, v0, N, Vl, ld, 0.25f);
    s->gpu->xent_finish(s->gpu->ctx, losses.d, logits2.d, NULL, rowmax.d, stats.d, dtgt, v0, N, Vl, ld, 0.25f);
    snprintf(what, sizeof what, "xent_finish dlogits %s", dims);
    check(s, what, &logits2, B_ROW);
out:
    free(tgt);
    if (dtgt)
        s->gpu->free(s->gpu->ctx, dtgt);
    tp_free(s, &logits), tp_free(s, &rowmax), tp_free(s, &stats), tp_free(s, &losses);
    tp_free(s, &logits2);
}

/* ---- mixture of experts ---------------------------------------------------------- */

/* An int32 tensor on both sides (h the CPU's, d the GPU's), the GPU's
 * copy starting as poison. */
typedef struct ti {
    int32_t *h, *d;
    size_t n;
} ti_t;

static int ti_new(st_t *s, ti_t *t, size_t n)
{
    t->n = n;
    t->h = malloc((n ? n : 1) * sizeof(int32_t));
    t->d = s->gpu->alloc(s->gpu->ctx, (n ? n : 1) * sizeof(int32_t));
    if (!t->h || !t->d) {
        s->oom = 1;
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        t->h[i] = 0x7fff7fff;
    s->gpu->from_host(s->gpu->ctx, t->d, t->h, n * sizeof(int32_t));
    return 0;
}

static void ti_free(st_t *s, ti_t *t)
{
    free(t->h);
    if (t->d)
        s->gpu->free(s->gpu->ctx, t->d);
    memset(t, 0, sizeof *t);
}

/* The first n of t compared bit for bit (n <= t->n). */
static void check_ints(st_t *s, const char *what, const ti_t *t, size_t n)
{
    int32_t *g = malloc((n ? n : 1) * sizeof *g);
    if (!g) {
        s->oom = 1;
        return;
    }
    s->gpu->to_host(s->gpu->ctx, g, t->d, n * sizeof *g);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += g[i] != t->h[i];
    free(g);
    check_bits(s, what, bad, n);
}

/* The eight MoE ops. The router runs on the same logits on both sides:
 * multiples of 1/16 in [-4, 4], so two experts' scores are equal (a tie,
 * broken by the lower expert on both) or at least 1/16 apart in logit,
 * far beyond the ulps by which the GPU's expf/logf differ: idx must then
 * be the CPU's exactly. Capacity is tried with the sigmoid router only,
 * where a score depends on its logit alone (a softmax score also on its
 * token's lse, so two tokens' scores may sit an ulp apart and the GPU
 * could drop the other one; the emulation test covers softmax capacity
 * bit for bit). Every later op gets the CPU's routing on both sides, so
 * it is compared alone: the plan, the statistics, the gather, the
 * combine, its backward, the scatter and the router's backward without
 * the z-loss repeat the CPU's operations in the CPU's order (products and
 * sums unfused), bound 0; the scores, gates and the z-loss term go through
 * expf, B_ELEM (lse: B_ROW, absolute). The routing and the plan run twice,
 * bit-identical. */
static void t_moe(st_t *s, int N, int T, int E, int K, int C, int sigmoid, int norm_topk, int cap)
{
    char what[160], dims[96];
    snprintf(dims, sizeof dims, "N=%d T=%d E=%d K=%d C=%d %s%s cap=%d", N, T, E, K, C, sigmoid ? "sigmoid" : "softmax",
             norm_topk ? " norm" : "", cap);
    const size_t NK = (size_t)N * K, NE = (size_t)N * E;
    tp_t lg, sc, ls, gt, st, x, xe, ye, out, dout, dye, dg, dxe, dx, auxw, dl, g2;
    ti_t id, id2, perm, offs, where;
    memset(&lg, 0, sizeof lg), sc = ls = gt = st = x = xe = ye = out = dout = dye = dg = dxe = dx = auxw = dl = g2 = lg;
    memset(&id, 0, sizeof id), id2 = perm = offs = where = id;
    if (tp_new(s, &lg, NE, 0, 0) || tp_new(s, &sc, NE, 0, 0) || tp_new(s, &ls, (size_t)N, 0, 0) ||
        tp_new(s, &gt, NK, 0, 0) || tp_new(s, &g2, NK, 0, 0) || tp_new(s, &st, 2 * (size_t)E + 2, 0, 0) ||
        ti_new(s, &id, NK) || ti_new(s, &id2, NK) || ti_new(s, &perm, NK + 1) || ti_new(s, &offs, (size_t)E + 1) ||
        ti_new(s, &where, NK))
        goto out;
    for (size_t i = 0; i < NE; i++)
        lg.h[i] = (float)((int)(frand(s, 0, 1) * 129.0f) - 64) / 16.0f;
    tp_sync(s, &lg);
    poison(s, &sc), poison(s, &ls), poison(s, &gt);
    /* route, twice on the GPU */
    s->cpu->moe_route_fwd(s->cpu->ctx, sc.h, ls.h, id.h, gt.h, lg.h, NULL, N, T, E, K, sigmoid, norm_topk, cap);
    s->gpu->moe_route_fwd(s->gpu->ctx, sc.d, ls.d, id.d, gt.d, lg.d, NULL, N, T, E, K, sigmoid, norm_topk, cap);
    s->gpu->moe_route_fwd(s->gpu->ctx, sc.d, ls.d, id2.d, g2.d, lg.d, NULL, N, T, E, K, sigmoid, norm_topk, cap);
    snprintf(what, sizeof what, "moe_route_fwd scores %s", dims);
    check(s, what, &sc, B_ELEM);
    snprintf(what, sizeof what, "moe_route_fwd lse %s", dims);
    check_log(s, what, &ls, B_ROW);
    snprintf(what, sizeof what, "moe_route_fwd idx %s", dims);
    check_ints(s, what, &id, NK);
    snprintf(what, sizeof what, "moe_route_fwd gate %s", dims);
    check(s, what, &gt, B_ELEM);
    snprintf(what, sizeof what, "moe_route_fwd twice: same gates %s", dims);
    check_same(s, what, &gt, &g2);
    memcpy(id2.h, id.h, NK * sizeof(int32_t));
    snprintf(what, sizeof what, "moe_route_fwd twice: same idx %s", dims);
    check_ints(s, what, &id2, NK);
    /* from here on both sides read the CPU's routing */
    s->gpu->from_host(s->gpu->ctx, id.d, id.h, NK * sizeof(int32_t));
    tp_sync(s, &sc), tp_sync(s, &ls), tp_sync(s, &gt);
    size_t dropped = 0;
    for (size_t a = 0; a < NK; a++)
        dropped += id.h[a] < 0;
    fprintf(s->out, "info moe %s: %zu of %zu assignments dropped\n", dims, dropped, NK);
    s->cpu->moe_plan(s->cpu->ctx, perm.h, offs.h, where.h, id.h, N, E, K);
    for (int rep = 0; rep < 2; rep++) {
        s->gpu->moe_plan(s->gpu->ctx, perm.d, offs.d, where.d, id.d, N, E, K);
        snprintf(what, sizeof what, "moe_plan perm%s %s", rep ? " (again)" : "", dims);
        check_ints(s, what, &perm, NK + 1);
        snprintf(what, sizeof what, "moe_plan offs%s %s", rep ? " (again)" : "", dims);
        check_ints(s, what, &offs, (size_t)E + 1);
        snprintf(what, sizeof what, "moe_plan where%s %s", rep ? " (again)" : "", dims);
        check_ints(s, what, &where, NK);
    }
    const int M = offs.h[E];
    s->cpu->moe_stats(s->cpu->ctx, st.h, id.h, sc.h, ls.h, N, E, K, sigmoid);
    s->gpu->moe_stats(s->gpu->ctx, st.d, id.d, sc.d, ls.d, N, E, K, sigmoid);
    snprintf(what, sizeof what, "moe_stats %s", dims);
    check(s, what, &st, B_EXACT);
    if (tp_new(s, &x, (size_t)N * C, -1, 1) || tp_new(s, &xe, ((size_t)M + 1) * C, 0, 0) ||
        tp_new(s, &ye, ((size_t)M + 1) * C, -2, 2) || tp_new(s, &out, (size_t)N * C, 0, 0) ||
        tp_new(s, &dout, (size_t)N * C, -1, 1) || tp_new(s, &dye, ((size_t)M + 1) * C, 0, 0) ||
        tp_new(s, &dg, NK, 0, 0) || tp_new(s, &dxe, ((size_t)M + 1) * C, -1, 1) ||
        tp_new(s, &dx, (size_t)N * C, -1, 1) || tp_new(s, &auxw, (size_t)E, 0, 0.05f) || tp_new(s, &dl, NE, 0, 0))
        goto out;
    s->cpu->moe_gather(s->cpu->ctx, xe.h, x.h, perm.h, M, K, C);
    s->gpu->moe_gather(s->gpu->ctx, xe.d, x.d, perm.d, M, K, C);
    snprintf(what, sizeof what, "moe_gather %s", dims);
    check(s, what, &xe, B_EXACT);
    poison(s, &out);
    s->cpu->moe_combine_fwd(s->cpu->ctx, out.h, ye.h, gt.h, where.h, N, K, C);
    s->gpu->moe_combine_fwd(s->gpu->ctx, out.d, ye.d, gt.d, where.d, N, K, C);
    snprintf(what, sizeof what, "moe_combine_fwd %s", dims);
    check(s, what, &out, B_EXACT);
    poison(s, &dg);
    s->cpu->moe_combine_bwd(s->cpu->ctx, dye.h, dg.h, dout.h, ye.h, gt.h, where.h, N, K, C);
    s->gpu->moe_combine_bwd(s->gpu->ctx, dye.d, dg.d, dout.d, ye.d, gt.d, where.d, N, K, C);
    snprintf(what, sizeof what, "moe_combine_bwd dye %s", dims);
    check(s, what, &dye, B_EXACT);
    snprintf(what, sizeof what, "moe_combine_bwd dgate %s", dims);
    check(s, what, &dg, B_EXACT);
    for (int accum = 0; accum < 2; accum++) {
        s->cpu->moe_scatter_bwd(s->cpu->ctx, dx.h, dxe.h, where.h, N, K, C, accum);
        s->gpu->moe_scatter_bwd(s->gpu->ctx, dx.d, dxe.d, where.d, N, K, C, accum);
        snprintf(what, sizeof what, "moe_scatter_bwd accum=%d %s", accum, dims);
        check(s, what, &dx, B_EXACT);
        tp_sync(s, &dx);
    }
    /* the router's backward from the CPU's dgate: gates, + aux, + z-loss */
    tp_sync(s, &dg);
    for (int terms = 0; terms < 3; terms++) {
        const float zw = terms == 2 ? 0.003f : 0.0f;
        poison(s, &dl);
        s->cpu->moe_route_bwd(s->cpu->ctx, dl.h, dg.h, lg.h, sc.h, ls.h, id.h, terms ? auxw.h : NULL, zw, N, E, K,
                              sigmoid, norm_topk);
        s->gpu->moe_route_bwd(s->gpu->ctx, dl.d, dg.d, lg.d, sc.d, ls.d, id.d, terms ? auxw.d : NULL, zw, N, E, K,
                              sigmoid, norm_topk);
        snprintf(what, sizeof what, "moe_route_bwd%s %s", terms == 2 ? " +aux +z" : terms ? " +aux" : "", dims);
        check(s, what, &dl, terms == 2 ? B_ELEM : B_EXACT);
    }
out:
    tp_free(s, &lg), tp_free(s, &sc), tp_free(s, &ls), tp_free(s, &gt), tp_free(s, &g2), tp_free(s, &st);
    tp_free(s, &x), tp_free(s, &xe), tp_free(s, &ye), tp_free(s, &out), tp_free(s, &dout), tp_free(s, &dye);
    tp_free(s, &dg), tp_free(s, &dxe), tp_free(s, &dx), tp_free(s, &auxw), tp_free(s, &dl);
    ti_free(s, &id), ti_free(s, &id2), ti_free(s, &perm), ti_free(s, &offs), ti_free(s, &where);
}

/* bf16 casts. Inputs are raw fp32 bit patterns, not values from frand: every
 * upper half (all signs, exponents, kept mantissas, NaNs and infinities)
 * with the low half 0, 0x7fff, 0x8000 (the ties), 0x8001 and 0xffff, then
 * n_random xorshift patterns. cast_bf16_to_f32 runs over all 65536 bf16
 * patterns. Every output is compared bit for bit. */
static void t_bf16(st_t *s, size_t n_random)
{
    static const uint32_t lows[] = {0x0000u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu};
    const size_t nl = sizeof lows / sizeof lows[0], n = nl * 65536 + n_random, nh = 65536;
    float *in = malloc(n * sizeof *in), *fref = malloc(nh * sizeof *fref), *fgot = malloc(nh * sizeof *fgot);
    uint16_t *ref = malloc(n * sizeof *ref), *got = malloc(n * sizeof *got), *hb = malloc(nh * sizeof *hb);
    float *d_in = s->gpu->alloc(s->gpu->ctx, n * sizeof(float)), *d_f = s->gpu->alloc(s->gpu->ctx, nh * sizeof(float));
    uint16_t *d_out = s->gpu->alloc(s->gpu->ctx, n * sizeof(uint16_t)),
             *d_h = s->gpu->alloc(s->gpu->ctx, nh * sizeof(uint16_t));
    if (!in || !ref || !got || !hb || !fref || !fgot || !d_in || !d_f || !d_out || !d_h) {
        s->oom = 1;
        goto out;
    }
    for (size_t k = 0; k < nl; k++)
        for (uint32_t hi = 0; hi < 65536; hi++)
            in[k * 65536 + hi] = dt_bits_f32(hi << 16 | lows[k]);
    for (size_t i = nl * 65536; i < n; i++) {
        s->rng ^= s->rng >> 12;
        s->rng ^= s->rng << 25;
        s->rng ^= s->rng >> 27;
        in[i] = dt_bits_f32((uint32_t)((s->rng * 2685821657736338717ull) >> 32));
    }
    s->cpu->cast_f32_to_bf16(s->cpu->ctx, ref, in, n);
    s->gpu->from_host(s->gpu->ctx, d_in, in, n * sizeof(float));
    s->gpu->cast_f32_to_bf16(s->gpu->ctx, d_out, d_in, n);
    s->gpu->to_host(s->gpu->ctx, got, d_out, n * sizeof(uint16_t));
    size_t bad = 0;
    for (size_t i = 0; i < n; i++)
        bad += ref[i] != got[i];
    check_bits(s, "cast_f32_to_bf16 (cuda vs cpu)", bad, n);

    ops_cuda_f32_to_bf16_cuda(s->gpu, d_out, d_in, n);
    s->gpu->to_host(s->gpu->ctx, got, d_out, n * sizeof(uint16_t));
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        int nan_ref = (ref[i] & 0x7fffu) > 0x7f80u, nan_got = (got[i] & 0x7fffu) > 0x7f80u;
        bad += nan_ref ? !nan_got : ref[i] != got[i];
    }
    check_bits(s, "cast_f32_to_bf16 vs __float2bfloat16_rn (NaN: any NaN)", bad, n);

    for (uint32_t h = 0; h < nh; h++)
        hb[h] = (uint16_t)h;
    s->cpu->cast_bf16_to_f32(s->cpu->ctx, fref, hb, nh);
    s->gpu->from_host(s->gpu->ctx, d_h, hb, nh * sizeof(uint16_t));
    s->gpu->cast_bf16_to_f32(s->gpu->ctx, d_f, d_h, nh);
    s->gpu->to_host(s->gpu->ctx, fgot, d_f, nh * sizeof(float));
    bad = 0;
    for (size_t i = 0; i < nh; i++)
        bad += dt_f32_bits(fref[i]) != dt_f32_bits(fgot[i]);
    check_bits(s, "cast_bf16_to_f32, all bf16 patterns (cuda vs cpu)", bad, nh);
out:
    free(in), free(ref), free(got), free(hb), free(fref), free(fgot);
    if (d_in)
        s->gpu->free(s->gpu->ctx, d_in);
    if (d_f)
        s->gpu->free(s->gpu->ctx, d_f);
    if (d_out)
        s->gpu->free(s->gpu->ctx, d_out);
    if (d_h)
        s->gpu->free(s->gpu->ctx, d_h);
}

int cuda_selftest(const ops_t *gpu, const ops_t *gpu16, const ops_t *cpu, const ops_t *graphs, FILE *out, char *err,
                  size_t errlen)
{
    st_t s = {.cpu = cpu, .gpu = gpu, .graphs = graphs, .out = out, .rng = 0x9E3779B97F4A7C15ull};
    /* N = 300, 1000: bias and norm-weight gradients summed in several
     * 128-row chunks (the GPU's column reductions) */
    static const int mm[][3] = {{1, 1, 1},      {7, 13, 5},    {64, 96, 160}, {33, 257, 129},
                                {128, 768, 64}, {300, 64, 96}, {0, 5, 3}};
    static const int nc[][2] = {{1, 1}, {5, 7}, {64, 768}, {3, 1030}, {1000, 257}};
    /* attention {B, T, NH, NKV, HS}: T = 1, 17, 33, 37, 45, 70, 200 are not multiples
     * of the GPU's 32-row tiles (64 is); GQA 4:2, 6:2 and MQA 2:1; HS 16, 64, 128
     * (one, one and two 64-column chunks), odd 5, 96 (a partial chunk), 256 (the
     * widest register accumulators) and 320 (two column groups, each recomputing
     * the scores); B = 2, T = 512 for many tiles per head */
    static const int at[][5] = {{1, 1, 1, 1, 4},     {2, 17, 4, 2, 8},  {1, 64, 4, 4, 16}, {2, 33, 6, 2, 32},
                                {1, 200, 2, 1, 64},  {1, 1, 4, 2, 128}, {1, 37, 4, 2, 16}, {2, 37, 4, 2, 64},
                                {1, 200, 4, 2, 128}, {1, 37, 3, 3, 5},  {1, 70, 2, 2, 96}, {1, 45, 2, 1, 256},
                                {1, 40, 2, 2, 320},  {2, 512, 4, 2, 64}};
    /* bf16 GEMMs: tiny, odd (unaligned leading dimensions), GPT-2's qkv
     * projection, one whose w (OC*IC > 4M floats) the CPU widens in two
     * panels, and the empty edges */
    static const int mb[][3] = {{1, 1, 1}, {37, 61, 29}, {128, 768, 2304}, {64, 1024, 4500}, {0, 5, 3}, {5, 0, 3}};
    t_memory(&s);
    t_side_copies(&s);
    for (size_t i = 0; i < sizeof mm / sizeof mm[0] && !s.oom; i++)
        t_matmul(&s, mm[i][0], mm[i][1], mm[i][2]);
    if (!s.oom)
        t_gemm_plans(&s);
    /* grouped GEMMs: Mixtral-like 8 experts, empty ones among them; odd shapes */
    static const int gr[][8] = {{64, 0, 200, 1, 37, 0, 128, 9}, {0, 5, 300, 0, 0, 0, 0, 0}};
    if (!s.oom)
        t_gmm(&s, gr[0], 8, 96, 160);
    if (!s.oom)
        t_gmm(&s, gr[1], 4, 61, 29);
    for (size_t i = 0; i < sizeof mb / sizeof mb[0] && !s.oom; i++)
        t_matmul_bf16(&s, mb[i][0], mb[i][1], mb[i][2]);
    /* GELU-fused GEMMs {N, IC, F}: F a multiple of 8 (the epilogue), one
     * that is not (the separate kernels), and GPT-2's fc width */
    static const int mg[][3] = {{64, 96, 160}, {37, 61, 29}, {128, 256, 3072}};
    for (size_t i = 0; i < sizeof mg / sizeof mg[0] && !s.oom; i++)
        for (int bf16 = 0; bf16 < 2 && !s.oom; bf16++)
            t_matmul_gelu(&s, mg[i][0], mg[i][1], mg[i][2], bf16);
    for (size_t i = 0; i < sizeof nc / sizeof nc[0] && !s.oom; i++)
        t_norms(&s, nc[i][0], nc[i][1]);
    /* q/k norms: Qwen3's head size 128 with GQA; rows over a column chunk */
    if (!s.oom)
        t_qknorm(&s, 37, 4, 2, 128);
    if (!s.oom)
        t_qknorm(&s, 300, 2, 1, 64);
    for (size_t i = 0; i < sizeof at / sizeof at[0] && !s.oom; i++)
        for (int docs = 0; docs < 2 && !s.oom; docs++)
            t_attention(&s, at[i][0], at[i][1], at[i][2], at[i][3], at[i][4], docs);
    /* ring attention's blocks {B, T, cp, q rank, k rank, NH, NKV, HS, q0, nq,
     * k0, nk, causal}: T 2 per rank (rank 0's query at 0 sees none of rank
     * 1's keys: lse -inf, out 0); the diagonal and off-diagonal blocks of cp
     * 2 and cp 4 over several 32-row tiles; the schedule's half blocks
     * (non-causal); GQA 4:1, 2:1, MHA; HS 16, 64, 96 (a partial chunk), 128,
     * 320 (two column groups) */
    static const int rg[][13] = {{2, 4, 2, 0, 1, 4, 1, 16, 0, 2, 0, 2, 1},
                                 {2, 400, 2, 0, 0, 4, 1, 64, 0, 200, 0, 200, 1},
                                 {1, 400, 2, 0, 1, 4, 2, 128, 0, 200, 0, 200, 1},
                                 {2, 400, 2, 1, 0, 4, 2, 64, 0, 200, 0, 100, 0},
                                 {1, 400, 2, 0, 1, 2, 2, 64, 100, 100, 0, 200, 0},
                                 {1, 512, 4, 3, 1, 4, 1, 96, 0, 128, 0, 128, 1},
                                 {1, 80, 2, 1, 1, 2, 1, 320, 0, 40, 0, 40, 1}};
    for (size_t i = 0; i < sizeof rg / sizeof rg[0] && !s.oom; i++)
        for (int docs = 0; docs < 2 && !s.oom; docs++)
            t_ring(&s, rg[i], docs);
    /* the same table under --dtype bf16: attention on the tensor cores at
     * head sizes 64 and 128 {B, T, NH, NKV, HS}: T = 1, T not a multiple
     * of the 64-row tiles, GQA 4:1 and 8:1, many tiles; another head size
     * keeps the fp32 kernels and their bounds */
    static const int am[][5] = {{1, 1, 4, 1, 64},    {1, 1, 1, 1, 128},   {2, 100, 8, 2, 64},
                                {1, 200, 8, 1, 128}, {2, 1000, 4, 4, 64}, {1, 1100, 4, 2, 128}};
    s.gpu = gpu16;
    char path[320];
    for (int hs = 64; hs <= 128; hs += 32) {
        ops_cuda_attention_path(gpu16, hs, path, sizeof path);
        fprintf(out, "info attention at head size %d under --dtype bf16: %s\n", hs, path);
    }
    for (size_t i = 0; i < sizeof am / sizeof am[0] && !s.oom; i++)
        for (int docs = 0; docs < 2 && !s.oom; docs++)
            t_attention_mma(&s, am[i][0], am[i][1], am[i][2], am[i][3], am[i][4], docs);
    if (!s.oom)
        t_attention(&s, 1, 70, 2, 2, 96, 1);
    s.gpu = gpu;
    if (!s.oom)
        t_elementwise(&s, 7, 7);
    if (!s.oom)
        t_elementwise(&s, (size_t)3 << 18, 768);
    if (!s.oom)
        t_adamw(&s, 100003);
    if (!s.oom)
        t_embedding(&s, 37, 8, 48, 50, 0, 50);
    if (!s.oom)
        t_embedding(&s, 256, 64, 129, 100, 40, 30);
    /* many tokens per row (the GPU groups them by row), a vocabulary over 2^10 */
    if (!s.oom)
        t_embedding(&s, 4096, 512, 96, 3000, 1000, 1500);
    if (!s.oom)
        t_xent(&s, 23, 50, 50, 0, 50);
    if (!s.oom)
        t_xent(&s, 64, 1000, 1008, 500, 2000);
    /* MoE {N, T, E, K, C, sigmoid, norm_topk, capacity}: one token; N not a
     * multiple of the 256-thread blocks; Mixtral's E 8 / K 2 and
     * DeepSeek's E 64 / K 6 with capacity dropping; many counting chunks
     * and GPT-2's width */
    static const int me[][8] = {{1, 1, 8, 2, 16, 0, 1, 0},      {300, 100, 8, 2, 64, 0, 1, 0},
                                {600, 200, 64, 6, 96, 1, 1, 8}, {4096, 512, 64, 6, 256, 1, 0, 40},
                                {2048, 1024, 8, 2, 768, 0, 0, 0}};
    for (size_t i = 0; i < sizeof me / sizeof me[0] && !s.oom; i++)
        t_moe(&s, me[i][0], me[i][1], me[i][2], me[i][3], me[i][4], me[i][5], me[i][6], me[i][7]);
    if (!s.oom)
        t_bf16(&s, (size_t)1 << 22);
    /* last: it grows the column partials (see t_graphs) */
    if (!s.oom && graphs)
        t_graphs(&s, 100, 96);
    if (s.oom) {
        snprintf(err, errlen, "selftest: out of memory (host or device)");
        return -1;
    }
    long made, reused, blas;
    ops_cuda_gemm_plans(gpu, &made, &reused, &blas);
    fprintf(out,
            "info cuBLASLt: %ld GEMM plans made, %ld reused; %ld plain GEMMs had no cuBLASLt algorithm and ran "
            "through cublasGemmEx\n",
            made, reused, blas);
    fprintf(out, "selftest: %d comparisons of the %s ops against the cpu ops, %d failed\n", s.run, gpu->name, s.failed);
    return s.failed;
}
