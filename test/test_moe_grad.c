/* A MoE layer (src/model/moe.h: router, dispatch, experts, combine, the
 * load-balancing and z losses) on the CPU backend against a double
 * reference written here from the formulas:
 *   logits = x . router^T; scores = softmax(logits) | sigmoid(logits);
 *   top-k by score (the lower expert on a tie), gates = the chosen
 *   scores (over their sum with norm_topk); capacity: per sequence each
 *   expert keeps its cap best-scored assignments;
 *   out[n] = sum_j gate_j (W2_e act(W1_e x_n + b1_e) + b2_e);
 *   aux = E sum_e f_e P_e (f_e: the expert's share of the N*K
 *   assignments, P_e the mean over tokens of p[n,e], p the softmax
 *   scores or the sigmoid scores over their sum); z = mean lse(logits)^2;
 *   with a gated shared expert (--moe-shared-gate, Qwen2-MoE's):
 *   out[n] += sigmoid(x_n . wg) (Ws2 act(Ws1 x_n + bs1) + bs2);
 *   L = sum(out o R) + dloss (aux_coef aux + z_coef z).
 * Checks the forward output and the two losses (relative 1e-5), and the
 * gradients of L with respect to the tokens, the router and every expert
 * tensor against central finite differences of the reference (relative
 * 1e-4), for GPT-2 (GELU, biases) and Llama (SwiGLU) experts, softmax and
 * sigmoid routers, with and without renormalisation and capacity, and
 * the shared expert's gate and weights (their backward composed as
 * src/model/model.c composes it: the gate's output gradient into the
 * shared MLP's backward, the gate's weight from its logits' gradient).
 * With a file argument it also writes one case's tokens, router and the
 * losses moe_fwd reported, for test/moe_losses.py's float64 check.
 * Exits 1 if any check fails. */
#include "src/backend/ops_cpu.h"
#include "src/model/moe.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FWD_TOL 1e-5
#define BWD_TOL 1e-4
#define FD_H 1e-6

static int n_fail;
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static float frand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)((double)(z >> 40) * (1.0 / 8388608.0) - 1.0);
}

/* Every buffer of a case, freed together at its end (free_case), so the
 * sanitizer build sees no leak. */
#define MAX_ALLOCS 256
static void *allocs[MAX_ALLOCS];
static int n_allocs;

static void *xcalloc(size_t n, size_t size)
{
    void *p = n_allocs < MAX_ALLOCS ? calloc(n ? n : 1, size) : NULL;
    if (!p) {
        fprintf(stderr, "test_moe_grad: out of memory (or more than %d buffers)\n", MAX_ALLOCS);
        exit(1);
    }
    allocs[n_allocs++] = p;
    return p;
}

static void free_case(void)
{
    while (n_allocs > 0)
        free(allocs[--n_allocs]);
}

static float *frandv(size_t n, float scale)
{
    float *x = xcalloc(n, sizeof *x);
    for (size_t i = 0; i < n; i++)
        x[i] = scale * frand();
    return x;
}

typedef struct cfg {
    int gpt, sigmoid, norm_topk;
    float capacity;
    int sgate; /* a shared expert of width FS with its sigmoid gate */
} case_t;

enum { B = 2, T = 6, N = B * T, C = 5, E = 4, K = 2, FE = 3, FS = 4 };
static const double AUX = 0.3, ZC = 0.2, DLOSS = 0.7;

/* The reference's inputs in double: x [N,C] then the tensors */
typedef struct ref {
    case_t k;
    double *x, *router, *w1, *b1, *w2, *b2, *R;
    double *ws1, *bs1, *ws2, *bs2, *wg; /* the gated shared expert (sgate) */
    double out[N * C], aux, z;
} ref_t;

static double gelu(double x) { return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))); }
static double silu(double x) { return x / (1.0 + exp(-x)); }

/* The expert e's output for token row x into y[C]. */
static void ref_expert(const ref_t *r, int e, const double *x, double *y)
{
    const int FW = r->k.gpt ? FE : 2 * FE;
    double h[2 * FE], a[FE];
    for (int f = 0; f < FW; f++) {
        double s = r->k.gpt ? r->b1[e * FE + f] : 0.0;
        for (int c = 0; c < C; c++)
            s += r->w1[((size_t)e * FW + f) * C + c] * x[c];
        h[f] = s;
    }
    for (int f = 0; f < FE; f++)
        a[f] = r->k.gpt ? gelu(h[f]) : silu(h[f]) * h[FE + f];
    for (int c = 0; c < C; c++) {
        double s = r->k.gpt ? r->b2[e * C + c] : 0.0;
        for (int f = 0; f < FE; f++)
            s += r->w2[((size_t)e * C + c) * FE + f] * a[f];
        y[c] = s;
    }
}

/* The gated shared expert's output for token row x, added to y[C]. */
static void ref_shared(const ref_t *r, const double *x, double *y)
{
    const int FW = r->k.gpt ? FS : 2 * FS;
    double h[2 * FS], a[FS], z = 0.0;
    for (int c = 0; c < C; c++)
        z += r->wg[c] * x[c];
    const double g = 1.0 / (1.0 + exp(-z));
    for (int f = 0; f < FW; f++) {
        double s = r->k.gpt ? r->bs1[f] : 0.0;
        for (int c = 0; c < C; c++)
            s += r->ws1[(size_t)f * C + c] * x[c];
        h[f] = s;
    }
    for (int f = 0; f < FS; f++)
        a[f] = r->k.gpt ? gelu(h[f]) : silu(h[f]) * h[FS + f];
    for (int c = 0; c < C; c++) {
        double s = r->k.gpt ? r->bs2[c] : 0.0;
        for (int f = 0; f < FS; f++)
            s += r->ws2[(size_t)c * FS + f] * a[f];
        y[c] += g * s;
    }
}

/* The whole layer; returns L. */
static double ref_loss(void *p)
{
    ref_t *r = p;
    double s[N][E], lse[N];
    int idx[N][K], kept[N][K];
    for (int n = 0; n < N; n++) {
        double l[E], mx = -INFINITY, sum = 0.0;
        for (int e = 0; e < E; e++) {
            l[e] = 0.0;
            for (int c = 0; c < C; c++)
                l[e] += r->x[n * C + c] * r->router[e * C + c];
            mx = l[e] > mx ? l[e] : mx;
        }
        for (int e = 0; e < E; e++)
            sum += exp(l[e] - mx);
        lse[n] = mx + log(sum);
        for (int e = 0; e < E; e++)
            s[n][e] = r->k.sigmoid ? 1.0 / (1.0 + exp(-l[e])) : exp(l[e] - lse[n]);
        int taken[E] = {0};
        for (int j = 0; j < K; j++) {
            int best = -1;
            for (int e = 0; e < E; e++)
                if (!taken[e] && (best < 0 || s[n][e] > s[n][best]))
                    best = e;
            taken[best] = 1;
            idx[n][j] = best;
            kept[n][j] = 1;
        }
    }
    if (r->k.capacity > 0) { /* per sequence and expert: the cap best scores, earlier token on a tie */
        const int cap = (int)ceil((double)r->k.capacity * T * K / E);
        for (int b = 0; b < B; b++)
            for (int e = 0; e < E; e++)
                for (int t = 0; t < T; t++)
                    for (int j = 0; j < K; j++) {
                        const int n = b * T + t;
                        if (idx[n][j] != e)
                            continue;
                        int better = 0; /* assignments of e in this sequence ranked above (n, j) */
                        for (int t2 = 0; t2 < T; t2++)
                            for (int j2 = 0; j2 < K; j2++) {
                                const int n2 = b * T + t2;
                                if (idx[n2][j2] != e || (n2 == n && j2 == j))
                                    continue;
                                better += s[n2][e] > s[n][e] ||
                                          (s[n2][e] == s[n][e] && (n2 < n || (n2 == n && j2 < j)));
                            }
                        kept[n][j] = better < cap;
                    }
    }
    double L = 0.0, f[E] = {0}, P[E] = {0}, z = 0.0;
    for (int n = 0; n < N; n++) {
        double chosen = 0.0, y[C];
        for (int j = 0; j < K; j++)
            chosen += s[n][idx[n][j]];
        for (int c = 0; c < C; c++)
            r->out[n * C + c] = 0.0;
        for (int j = 0; j < K; j++) {
            f[idx[n][j]] += 1.0 / (N * K);
            if (!kept[n][j])
                continue;
            const double g = r->k.norm_topk ? s[n][idx[n][j]] / chosen : s[n][idx[n][j]];
            ref_expert(r, idx[n][j], r->x + n * C, y);
            for (int c = 0; c < C; c++)
                r->out[n * C + c] += g * y[c];
        }
        if (r->k.sgate)
            ref_shared(r, r->x + n * C, r->out + n * C);
        double ssum = 0.0;
        for (int e = 0; e < E; e++)
            ssum += s[n][e];
        for (int e = 0; e < E; e++)
            P[e] += (r->k.sigmoid ? s[n][e] / ssum : s[n][e]) / N;
        z += lse[n] * lse[n] / N;
        for (int c = 0; c < C; c++)
            L += r->out[n * C + c] * r->R[n * C + c];
    }
    r->aux = 0.0;
    for (int e = 0; e < E; e++)
        r->aux += E * f[e] * P[e];
    r->z = z;
    return L + DLOSS * (AUX * r->aux + ZC * r->z);
}

static double *todouble(const float *x, size_t n)
{
    double *d = xcalloc(n, sizeof *d);
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static double rel_err(const float *got, const double *ref, size_t n)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double d = fabs((double)got[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return mr > 0.0 ? md / mr : md;
}

static void check(const char *what, double err, double tol)
{
    const int ok = err <= tol;
    printf("%-60s max rel err %9.2e  tol %.0e  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    n_fail += !ok;
}

/* --dtype bf16: the experts' GEMMs round their operands to bf16 (the
 * router stays fp32, so the routing is the same): the forward then sits
 * off the float64 reference by bf16's rounding, well above fp32's 1e-5
 * and below 2e-2. A path that kept the experts in fp32 lands at 1e-7. */
static void check_bf16(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *x, const ref_t *r,
                       const char *label)
{
    const size_t NK = (size_t)N * K, FW = (size_t)moe_fcw_local(m), Fe = (size_t)moe_ffn_local(m);
    const size_t wide = FW > (size_t)C ? FW : (size_t)C;
    m->lay.bf16 = 1;
    m->a16 = xcalloc(NK * wide, sizeof(uint16_t));
    m->d16 = xcalloc(NK * wide, sizeof(uint16_t));
    /* no params16: every weight rounded here, all E experts' at once (one grouped GEMM) */
    m->w16 = xcalloc((size_t)m->cfg.moe.experts * (FW * C > C * Fe ? FW * C : C * Fe), sizeof(uint16_t));
    float *out = xcalloc((size_t)N * C, sizeof(float));
    model_moe_stats_t *st = m->moe_stats, scratch = {0}; /* the fp32 forward's stay for the losses' file */
    m->moe_stats = &scratch;
    char err[256], name[160];
    const int ok = moe_fwd(m, a, w, x, out, N, T, 0.0f, 0, err, sizeof err) == STATUS_OK;
    m->moe_stats = st;
    const double e = ok ? rel_err(out, r->out, (size_t)N * C) : INFINITY;
    snprintf(name, sizeof name, "%s bf16 experts' forward", label);
    printf("%-60s max rel err %9.2e  in (1e-5, 2e-2)  %s\n", name, e, e > 1e-5 && e < 2e-2 ? "ok" : "FAIL");
    n_fail += !(e > 1e-5 && e < 2e-2);
    m->lay.bf16 = 0;
}

/* dL/dv by central differences of the reference, v one of its tensors */
static void fd(ref_t *r, double *v, size_t n, double *grad)
{
    for (size_t i = 0; i < n; i++) {
        const double v0 = v[i];
        v[i] = v0 + FD_H;
        const double lp = ref_loss(r);
        v[i] = v0 - FD_H;
        const double lm = ref_loss(r);
        v[i] = v0;
        grad[i] = (lp - lm) / (2.0 * FD_H);
    }
    ref_loss(r);
}

static void check_grad(const char *label, const char *what, ref_t *r, double *v, const float *got, size_t n)
{
    double *g = xcalloc(n, sizeof *g);
    fd(r, v, n, g);
    char name[128];
    snprintf(name, sizeof name, "%s %s vs FD", label, what);
    check(name, rel_err(got, g, n), BWD_TOL);
}

/* The gated shared expert as src/model/model.c runs a MoE layer's (its
 * forward into a->sy, gated into the layer's output out[N,C]; its
 * backward from the gated output gradient), on the ops: */
static void shared_fwd(model_t *m, moe_acts_t *a, const block_tensors_t *w, const float *x, float *out, int FSW)
{
    const ops_t *o = m->ops;
    float *h = xcalloc((size_t)N * FSW, 4), *act = xcalloc((size_t)N * FS, 4), *gated = xcalloc((size_t)N * C, 4);
    o->matmul_fwd(o->ctx, h, x, w->wfc, w->bfc, N, C, FSW);
    if (m->cfg.arch == ARCH_GPT2)
        o->gelu_fwd(o->ctx, act, NULL, h, (size_t)N * FS);
    else
        o->swiglu_fwd(o->ctx, act, NULL, h, N, FS);
    o->matmul_fwd(o->ctx, a->sy, act, w->wproj, w->bproj, N, FS, C);
    moe_shared_gate_fwd(m, a, w, x, a->sy, gated, N);
    o->add(o->ctx, out, out, gated, (size_t)N * C);
}

/* dx (+)= its part of dL/dx from dout = R, the weight gradients into g */
static void shared_bwd(model_t *m, const moe_acts_t *a, const block_tensors_t *w, const block_tensors_t *g,
                       const float *x, const float *dout, float *dx, int FSW)
{
    const ops_t *o = m->ops;
    const int gpt = m->cfg.arch == ARCH_GPT2;
    float *h = xcalloc((size_t)N * FSW, 4), *act = xcalloc((size_t)N * FS, 4), *dact = xcalloc((size_t)N * FS, 4);
    float *dh = xcalloc((size_t)N * FSW, 4);
    o->matmul_fwd(o->ctx, h, x, w->wfc, w->bfc, N, C, FSW);
    if (gpt)
        o->gelu_fwd(o->ctx, act, NULL, h, (size_t)N * FS);
    else
        o->swiglu_fwd(o->ctx, act, NULL, h, N, FS);
    moe_shared_gate_bwd(m, a, dout, N);
    o->matmul_bwd(o->ctx, dact, g->wproj, gpt ? g->bproj : NULL, m->msdy, act, w->wproj, N, FS, C, 0, 0);
    if (gpt)
        o->gelu_bwd(o->ctx, dh, h, dact, (size_t)N * FS);
    else
        o->swiglu_bwd(o->ctx, dh, NULL, h, dact, N, FS);
    o->matmul_bwd(o->ctx, dx, g->wfc, gpt ? g->bfc : NULL, dh, x, w->wfc, N, C, FSW, 1, 0);
    moe_shared_gate_bwd_weight(m, w, g, x, dx, 1, 0, N);
}

static void run_case(const ops_t *ops, case_t k, const char *dump)
{
    const int FW = k.gpt ? FE : 2 * FE, NK = N * K, wide = FW > C ? FW : C, FSW = k.gpt ? FS : 2 * FS;
    char label[96];
    snprintf(label, sizeof label, "%s %s%s%s%s", k.gpt ? "gpt2" : "llama", k.sigmoid ? "sigmoid" : "softmax",
             k.norm_topk ? " norm" : "", k.capacity > 0 ? " capacity" : "", k.sgate ? " gated-shared" : "");
    model_t m;
    memset(&m, 0, sizeof m);
    m.ops = ops;
    m.cfg.arch = k.gpt ? ARCH_GPT2 : ARCH_LLAMA;
    m.cfg.d_model = C;
    m.cfg.moe = (moe_config_t){.experts = E,
                               .top_k = K,
                               .ffn = FE,
                               .every = 1,
                               .router = k.sigmoid ? MOE_ROUTER_SIGMOID : MOE_ROUTER_SOFTMAX,
                               .norm_topk = k.norm_topk,
                               .aux_coef = (float)AUX,
                               .z_coef = (float)ZC,
                               .capacity = k.capacity,
                               .shared_ffn = k.sgate ? FS : 0,
                               .shared_gate = k.sgate};
    m.lay.part.tp_size = 1;
    m.mx = xcalloc((size_t)NK * C, sizeof(float));
    m.md1 = xcalloc((size_t)NK * wide, sizeof(float));
    m.md2 = xcalloc((size_t)NK * wide, sizeof(float));
    m.mdgate = xcalloc((size_t)NK, sizeof(float));
    m.mdlogits = xcalloc((size_t)N * E, sizeof(float));
    m.mstats = xcalloc(2 * E + 2, sizeof(float));
    m.mstats_host = xcalloc(2 * E + 2, sizeof(float));
    m.msdy = xcalloc((size_t)N * C, sizeof(float));
    m.msdz = xcalloc(N, sizeof(float));
    moe_acts_t a = {.logits = xcalloc((size_t)N * E, 4),
                    .scores = xcalloc((size_t)N * E, 4),
                    .lse = xcalloc(N, 4),
                    .gate = xcalloc(NK, 4),
                    .idx = xcalloc(NK, 4),
                    .perm = xcalloc(NK, 4),
                    .where = xcalloc(NK, 4),
                    .offs = xcalloc(E + 1, 4),
                    .he = xcalloc((size_t)NK * FW, 4),
                    .ae = xcalloc((size_t)NK * FE, 4),
                    .ye = xcalloc((size_t)NK * C, 4),
                    .auxw = xcalloc(E, 4),
                    .hoffs = xcalloc(E + 1, 4),
                    .sgate = xcalloc(N, 4),
                    .sy = xcalloc((size_t)N * C, 4)};
    float *x = frandv((size_t)N * C, 1.0f), *R = frandv((size_t)N * C, 1.0f);
    block_tensors_t w = {.router = frandv((size_t)E * C, 1.5f),
                         .ewfc = frandv((size_t)E * FW * C, 0.8f),
                         .ebfc = k.gpt ? frandv((size_t)E * FE, 0.5f) : NULL,
                         .ewproj = frandv((size_t)E * C * FE, 0.8f),
                         .ebproj = k.gpt ? frandv((size_t)E * C, 0.5f) : NULL,
                         .wfc = k.sgate ? frandv((size_t)FSW * C, 0.8f) : NULL,
                         .bfc = k.sgate && k.gpt ? frandv(FS, 0.5f) : NULL,
                         .wproj = k.sgate ? frandv((size_t)C * FS, 0.8f) : NULL,
                         .bproj = k.sgate && k.gpt ? frandv(C, 0.5f) : NULL,
                         .sgate = k.sgate ? frandv(C, 1.0f) : NULL};
    block_tensors_t g = {.router = xcalloc((size_t)E * C, 4),
                         .ewfc = xcalloc((size_t)E * FW * C, 4),
                         .ebfc = k.gpt ? xcalloc((size_t)E * FE, 4) : NULL,
                         .ewproj = xcalloc((size_t)E * C * FE, 4),
                         .ebproj = k.gpt ? xcalloc((size_t)E * C, 4) : NULL,
                         .wfc = xcalloc((size_t)FSW * C, 4),
                         .bfc = xcalloc(FS, 4),
                         .wproj = xcalloc((size_t)C * FS, 4),
                         .bproj = xcalloc(C, 4),
                         .sgate = xcalloc(C, 4)};
    float *out = xcalloc((size_t)N * C, 4), *dx = xcalloc((size_t)N * C, 4);
    model_moe_stats_t st = {0};
    m.moe_stats = &st; /* the one layer's (local block 0) */
    m.mload_host = xcalloc(E, sizeof(double));
    char err[256];
    if (moe_fwd(&m, &a, &w, x, out, N, T, (float)DLOSS, 0, err, sizeof err) != STATUS_OK) {
        printf("%s: moe_fwd failed\n", label);
        n_fail++;
        return;
    }
    if (moe_bwd_experts(&m, &a, &w, &g, x, R, dx, 0, 0, N, err, sizeof err) != STATUS_OK) {
        printf("%s: moe_bwd_experts failed: %s\n", label, err);
        n_fail++;
        return;
    }
    moe_bwd_router(&m, &a, &w, &g, x, dx, 1, 0, N);
    if (k.sgate) {
        shared_fwd(&m, &a, &w, x, out, FSW);
        shared_bwd(&m, &a, &w, &g, x, R, dx, FSW);
    }
    ref_t r = {.k = k,
               .x = todouble(x, (size_t)N * C),
               .router = todouble(w.router, (size_t)E * C),
               .w1 = todouble(w.ewfc, (size_t)E * FW * C),
               .b1 = k.gpt ? todouble(w.ebfc, (size_t)E * FE) : NULL,
               .w2 = todouble(w.ewproj, (size_t)E * C * FE),
               .b2 = k.gpt ? todouble(w.ebproj, (size_t)E * C) : NULL,
               .R = todouble(R, (size_t)N * C),
               .ws1 = k.sgate ? todouble(w.wfc, (size_t)FSW * C) : NULL,
               .bs1 = k.sgate && k.gpt ? todouble(w.bfc, FS) : NULL,
               .ws2 = k.sgate ? todouble(w.wproj, (size_t)C * FS) : NULL,
               .bs2 = k.sgate && k.gpt ? todouble(w.bproj, C) : NULL,
               .wg = k.sgate ? todouble(w.sgate, C) : NULL};
    ref_loss(&r);
    char name[128];
    snprintf(name, sizeof name, "%s forward output", label);
    check(name, rel_err(out, r.out, (size_t)N * C), FWD_TOL);
    const float aux = (float)st.aux, z = (float)st.z;
    snprintf(name, sizeof name, "%s load-balancing loss %.6f", label, r.aux);
    check(name, rel_err(&aux, &r.aux, 1), FWD_TOL);
    snprintf(name, sizeof name, "%s z-loss %.6f", label, r.z);
    check(name, rel_err(&z, &r.z, 1), FWD_TOL);
    if (k.capacity > 0)
        printf("%s: %g of %d assignments dropped\n", label, st.dropped, NK);
    if (!k.sgate)
        check_bf16(&m, &a, &w, x, &r, label);
    check_grad(label, "dx", &r, r.x, dx, (size_t)N * C);
    check_grad(label, "router", &r, r.router, g.router, (size_t)E * C);
    check_grad(label, "expert fc", &r, r.w1, g.ewfc, (size_t)E * FW * C);
    check_grad(label, "expert proj", &r, r.w2, g.ewproj, (size_t)E * C * FE);
    if (k.gpt) {
        check_grad(label, "expert fc bias", &r, r.b1, g.ebfc, (size_t)E * FE);
        check_grad(label, "expert proj bias", &r, r.b2, g.ebproj, (size_t)E * C);
    }
    if (k.sgate) {
        check_grad(label, "shared gate", &r, r.wg, g.sgate, C);
        check_grad(label, "shared fc", &r, r.ws1, g.wfc, (size_t)FSW * C);
        check_grad(label, "shared proj", &r, r.ws2, g.wproj, (size_t)C * FS);
        if (k.gpt) {
            check_grad(label, "shared fc bias", &r, r.bs1, g.bfc, FS);
            check_grad(label, "shared proj bias", &r, r.bs2, g.bproj, C);
        }
    }
    FILE *f = dump ? fopen(dump, "w") : NULL;
    if (f) { /* N C E K sigmoid, x, router, then moe_fwd's two losses */
        fprintf(f, "%d %d %d %d %d\n", N, C, E, K, k.sigmoid);
        for (int i = 0; i < N * C; i++)
            fprintf(f, "%.9g%c", x[i], i + 1 < N * C ? ' ' : '\n');
        for (int i = 0; i < E * C; i++)
            fprintf(f, "%.9g%c", w.router[i], i + 1 < E * C ? ' ' : '\n');
        fprintf(f, "%.9g %.9g\n", st.aux, st.z);
        fclose(f);
    }
    free_case();
}

int main(int argc, char **argv)
{
    const ops_t *ops = ops_cpu_create();
    if (!ops)
        return 1;
    const case_t cases[] = {
        {.gpt = 1, .norm_topk = 1},
        {.gpt = 1, .norm_topk = 0},
        {.gpt = 0, .norm_topk = 1},
        {.gpt = 0, .sigmoid = 1, .norm_topk = 1},
        {.gpt = 1, .sigmoid = 1, .norm_topk = 0},
        {.gpt = 1, .norm_topk = 1, .capacity = 0.5f},
        {.gpt = 0, .sigmoid = 1, .norm_topk = 1, .capacity = 0.5f},
        {.gpt = 0, .norm_topk = 0, .sgate = 1},
        {.gpt = 1, .norm_topk = 1, .sgate = 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        run_case(ops, cases[i], i == 0 && argc > 1 ? argv[1] : NULL);
    if (argc > 2) /* the sigmoid router's losses too */
        run_case(ops, cases[3], argv[2]);
    printf(n_fail ? "%d check(s) FAILED\n" : "all checks passed\n", n_fail);
    ops_release(ops);
    return n_fail ? 1 : 0;
}
