/* Checks every op of the CPU ops table against a double-precision reference
 * written here, independently of base/ops_math.h:
 *   - forward: fp32 output vs the double reference, max|got - ref| / max|ref|
 *     <= FWD_TOL;
 *   - backward: fp32 analytic gradient of L = sum(out o R) (R fixed random)
 *     vs central finite differences of the double reference (h = 1e-6),
 *     max|got - ref| / max|ref| <= BWD_TOL;
 *   - accum flags (accum = 0 overwrites NaN garbage, a second call with
 *     accum = 1 doubles), aliasing, padding columns, ignored targets;
 *   - AdamW against PyTorch 1.13's AdamW formula in double for 3 steps;
 *   - bit-identical reductions for 1..4 threads.
 * Prints one line per check; exits 1 if any check fails. */
#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define FWD_TOL 1e-5 /* fp32 forward vs double reference */
#define BWD_TOL 1e-4 /* fp32 backward vs finite differences in double */
#define ACC_TOL 1e-6 /* accum = 1 doubling; AdamW state */
#define FD_H 1e-6    /* central-difference step (inputs are O(1)) */

static const ops_t *ops;
static int n_fail;

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_state = 0x853c49e6748fea9bULL;

/* splitmix64 -> uniform float in [-1, 1) on a 2^-23 grid (exact in float) */
static float frand(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    return (float)((double)(z >> 40) * (1.0 / 8388608.0) - 1.0);
}

static void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "test_ops_grad: out of memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static float *frandv(size_t n, float lo, float hi)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = lo + (hi - lo) * 0.5f * (frand() + 1.0f);
    return x;
}

static float *fnan(size_t n)
{
    float *x = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
    return x;
}

static double *todouble(const float *x, size_t n)
{
    double *d = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++)
        d[i] = x[i];
    return d;
}

static float *fdup(const float *x, size_t n)
{
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

/* max|got - ref| / max|ref|; NaN in got gives +inf */
static double rel_err(const float *got, const double *ref, size_t n)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return mr > 0.0 ? md / mr : md;
}

static double rel_err_d(const double *got, const double *ref, size_t n)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs(got[i] - ref[i]);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(ref[i]) > mr ? fabs(ref[i]) : mr;
    }
    return mr > 0.0 ? md / mr : md;
}

/* second = 2 * first within ACC_TOL */
static double doubling_err(const float *first, const float *second, size_t n)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        double want = 2.0 * first[i], d = fabs(second[i] - want);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs(want) > mr ? fabs(want) : mr;
    }
    return mr > 0.0 ? md / mr : md;
}

static void check(const char *what, double err, double tol)
{
    int ok = err <= tol;
    printf("%-52s max rel err %9.2e  tol %.0e  %s\n", what, err, tol, ok ? "ok" : "FAIL");
    if (!ok)
        n_fail++;
}

static void check_true(const char *what, int ok)
{
    printf("%-52s %s\n", what, ok ? "ok" : "FAIL");
    if (!ok)
        n_fail++;
}

/* grad[i] = dL/dx[i] by central differences; x is perturbed and restored */
static void fd_grad(double *grad, double *x, size_t n, double (*L)(void *), void *ctx)
{
    for (size_t i = 0; i < n; i++) {
        double x0 = x[i];
        x[i] = x0 + FD_H;
        double lp = L(ctx);
        x[i] = x0 - FD_H;
        double lm = L(ctx);
        x[i] = x0;
        grad[i] = (lp - lm) / (2.0 * FD_H);
    }
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(n);
#else
    (void)n;
#endif
}

static int get_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- matmul ------------------------------------------------------------------- */

typedef struct {
    int N, IC, OC;
    double *in, *w, *b, *R, *out;
} mm_ctx;

static void ref_matmul(double *out, const double *in, const double *w, const double *b, int N, int IC, int OC)
{
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = b ? b[o] : 0.0;
            for (int i = 0; i < IC; i++)
                s += in[(size_t)n * IC + i] * w[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

static double loss_matmul(void *p)
{
    mm_ctx *c = p;
    ref_matmul(c->out, c->in, c->w, c->b, c->N, c->IC, c->OC);
    return dot(c->out, c->R, (size_t)c->N * c->OC);
}

static void test_matmul(void)
{
    const int N = 6, IC = 9, OC = 37; /* OC spans a partial column block */
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *in = frandv(nin, -1, 1), *w = frandv(nw, -1, 1), *b = frandv(OC, -1, 1);
    float *R = frandv(nout, -1, 1), *out = fnan(nout);
    mm_ctx c = {N,
                IC,
                OC,
                todouble(in, nin),
                todouble(w, nw),
                todouble(b, OC),
                todouble(R, nout),
                xmalloc(nout * sizeof(double))};

    ops->matmul_fwd(ops->ctx, out, in, w, b, N, IC, OC);
    loss_matmul(&c);
    check("matmul_fwd (bias)", rel_err(out, c.out, nout), FWD_TOL);
    float *out_nb = fnan(nout);
    double *ref_nb = xmalloc(nout * sizeof(double));
    ops->matmul_fwd(ops->ctx, out_nb, in, w, NULL, N, IC, OC);
    ref_matmul(ref_nb, c.in, c.w, NULL, N, IC, OC);
    check("matmul_fwd (no bias)", rel_err(out_nb, ref_nb, nout), FWD_TOL);

    float *din = fnan(nin), *dw = fnan(nw), *db = fnan(OC);
    ops->matmul_bwd(ops->ctx, din, dw, db, R, in, w, N, IC, OC, 0, 0);
    double *g = xmalloc(nw * sizeof(double));
    fd_grad(g, c.in, nin, loss_matmul, &c);
    check("matmul_bwd din vs FD", rel_err(din, g, nin), BWD_TOL);
    fd_grad(g, c.w, nw, loss_matmul, &c);
    check("matmul_bwd dw vs FD", rel_err(dw, g, nw), BWD_TOL);
    fd_grad(g, c.b, OC, loss_matmul, &c);
    check("matmul_bwd db vs FD", rel_err(db, g, OC), BWD_TOL);

    float *din2 = fdup(din, nin), *dw2 = fdup(dw, nw), *db2 = fdup(db, OC);
    ops->matmul_bwd(ops->ctx, din2, dw2, db2, R, in, w, N, IC, OC, 1, 1);
    check("matmul_bwd accum=1 doubles din", doubling_err(din, din2, nin), ACC_TOL);
    check("matmul_bwd accum=1 doubles dw", doubling_err(dw, dw2, nw), ACC_TOL);
    check("matmul_bwd accum=1 doubles db", doubling_err(db, db2, OC), ACC_TOL);

    /* NULL outputs are skipped; the others are still right */
    float *dw3 = fnan(nw);
    ops->matmul_bwd(ops->ctx, NULL, dw3, NULL, R, in, w, N, IC, OC, 0, 0);
    check_true("matmul_bwd din=db=NULL leaves dw identical", memcmp(dw3, dw, nw * 4) == 0);

    free(in);
    free(w);
    free(b);
    free(R);
    free(out);
    free(out_nb);
    free(ref_nb);
    free(din);
    free(dw);
    free(db);
    free(din2);
    free(dw2);
    free(db2);
    free(dw3);
    free(g);
    free(c.in);
    free(c.w);
    free(c.b);
    free(c.R);
    free(c.out);
}

/* A larger matmul, compared with the exact formulas in double (no FD): the
 * BLAS kernels OpenBLAS picks for these sizes differ from the tiny ones. */
static void test_matmul_medium(void)
{
    const int N = 64, IC = 96, OC = 80;
    size_t nin = (size_t)N * IC, nw = (size_t)OC * IC, nout = (size_t)N * OC;
    float *in = frandv(nin, -1, 1), *w = frandv(nw, -1, 1), *b = frandv(OC, -1, 1);
    float *dout = frandv(nout, -1, 1), *out = fnan(nout);
    float *din = fnan(nin), *dw = fnan(nw), *db = fnan(OC);
    double *rin = todouble(in, nin), *rw = todouble(w, nw), *rb = todouble(b, OC);
    double *rout = xmalloc(nout * sizeof(double));
    ops->matmul_fwd(ops->ctx, out, in, w, b, N, IC, OC);
    ref_matmul(rout, rin, rw, rb, N, IC, OC);
    check("matmul_fwd 64x96x80 vs double", rel_err(out, rout, nout), FWD_TOL);

    ops->matmul_bwd(ops->ctx, din, dw, db, dout, in, w, N, IC, OC, 0, 0);
    double *r = xmalloc(nw * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int o = 0; o < OC; o++)
                s += (double)dout[(size_t)n * OC + o] * rw[(size_t)o * IC + i];
            r[(size_t)n * IC + i] = s;
        }
    check("matmul_bwd 64x96x80 din vs double", rel_err(din, r, nin), FWD_TOL);
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int n = 0; n < N; n++)
                s += (double)dout[(size_t)n * OC + o] * rin[(size_t)n * IC + i];
            r[(size_t)o * IC + i] = s;
        }
    check("matmul_bwd 64x96x80 dw vs double", rel_err(dw, r, nw), FWD_TOL);
    for (int o = 0; o < OC; o++) {
        double s = 0;
        for (int n = 0; n < N; n++)
            s += dout[(size_t)n * OC + o];
        r[o] = s;
    }
    check("matmul_bwd 64x96x80 db vs double", rel_err(db, r, OC), FWD_TOL);
    free(in);
    free(w);
    free(b);
    free(dout);
    free(out);
    free(din);
    free(dw);
    free(db);
    free(rin);
    free(rw);
    free(rb);
    free(rout);
    free(r);
}

/* ---- layernorm / rmsnorm --------------------------------------------------------- */

typedef struct {
    int N, C, rms;
    double eps;
    double *x, *w, *b, *R, *out, *mean, *rstd;
} norm_ctx;

static void ref_norm(norm_ctx *c)
{
    for (int n = 0; n < c->N; n++) {
        const double *x = c->x + (size_t)n * c->C;
        double mu = 0.0, var = 0.0;
        if (!c->rms) {
            for (int i = 0; i < c->C; i++)
                mu += x[i];
            mu /= c->C;
        }
        for (int i = 0; i < c->C; i++)
            var += (x[i] - mu) * (x[i] - mu);
        var /= c->C;
        double r = 1.0 / sqrt(var + c->eps);
        for (int i = 0; i < c->C; i++)
            c->out[(size_t)n * c->C + i] = (x[i] - mu) * r * c->w[i] + (c->rms ? 0.0 : c->b[i]);
        c->mean[n] = mu;
        c->rstd[n] = r;
    }
}

static double loss_norm(void *p)
{
    norm_ctx *c = p;
    ref_norm(c);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_norm(int rms)
{
    const int N = 5, C = 37;
    const float eps = 1e-5f;
    size_t nx = (size_t)N * C;
    char name[96];
    const char *op = rms ? "rmsnorm" : "layernorm";
    float *x = frandv(nx, -1.5f, 2.5f), *w = frandv(C, 0.5f, 1.5f), *b = frandv(C, -1, 1);
    float *R = frandv(nx, -1, 1), *out = fnan(nx), *mean = fnan(N), *rstd = fnan(N);
    norm_ctx c = {N,
                  C,
                  rms,
                  eps,
                  todouble(x, nx),
                  todouble(w, C),
                  todouble(b, C),
                  todouble(R, nx),
                  xmalloc(nx * sizeof(double)),
                  xmalloc(N * sizeof(double)),
                  xmalloc(N * sizeof(double))};
    loss_norm(&c);
    if (rms)
        ops->rmsnorm_fwd(ops->ctx, out, NULL, rstd, x, w, N, C, eps);
    else
        ops->layernorm_fwd(ops->ctx, out, NULL, mean, rstd, x, w, b, N, C, eps);
    snprintf(name, sizeof name, "%s_fwd out", op);
    check(name, rel_err(out, c.out, nx), FWD_TOL);
    snprintf(name, sizeof name, "%s_fwd rstd", op);
    check(name, rel_err(rstd, c.rstd, N), FWD_TOL);
    if (!rms)
        check("layernorm_fwd mean", rel_err(mean, c.mean, N), FWD_TOL);

    /* din accumulates onto D0; dw/db overwrite NaN garbage with accum = 0 */
    float *D0 = frandv(nx, -1, 1), *din = fdup(D0, nx), *dw = fnan(C), *db = fnan(C);
    if (rms)
        ops->rmsnorm_bwd(ops->ctx, din, NULL, dw, R, x, w, rstd, N, C, 0);
    else
        ops->layernorm_bwd(ops->ctx, din, NULL, dw, db, R, x, w, mean, rstd, N, C, 0);
    double *g = xmalloc(nx * sizeof(double)), *dd = xmalloc(nx * sizeof(double));
    for (size_t i = 0; i < nx; i++)
        dd[i] = (double)din[i] - (double)D0[i];
    fd_grad(g, c.x, nx, loss_norm, &c);
    snprintf(name, sizeof name, "%s_bwd din (+= onto D0) vs FD", op);
    check(name, rel_err_d(dd, g, nx), BWD_TOL);
    fd_grad(g, c.w, C, loss_norm, &c);
    snprintf(name, sizeof name, "%s_bwd dw vs FD", op);
    check(name, rel_err(dw, g, C), BWD_TOL);
    if (!rms) {
        fd_grad(g, c.b, C, loss_norm, &c);
        check("layernorm_bwd db vs FD", rel_err(db, g, C), BWD_TOL);
    }

    float *dw2 = fdup(dw, C), *db2 = fdup(db, C), *din2 = fdup(din, nx);
    if (rms)
        ops->rmsnorm_bwd(ops->ctx, din2, NULL, dw2, R, x, w, rstd, N, C, 1);
    else
        ops->layernorm_bwd(ops->ctx, din2, NULL, dw2, db2, R, x, w, mean, rstd, N, C, 1);
    snprintf(name, sizeof name, "%s_bwd accum=1 doubles dw", op);
    check(name, doubling_err(dw, dw2, C), ACC_TOL);
    if (!rms)
        check("layernorm_bwd accum=1 doubles db", doubling_err(db, db2, C), ACC_TOL);
    double *dd2 = xmalloc(nx * sizeof(double));
    for (size_t i = 0; i < nx; i++) {
        dd[i] = (double)din[i] - (double)D0[i];
        dd2[i] = (double)din2[i] - (double)din[i];
    }
    snprintf(name, sizeof name, "%s_bwd din accumulates on 2nd call", op);
    check(name, rel_err_d(dd2, dd, nx), FWD_TOL);
    free(dd2);
    free(x);
    free(w);
    free(b);
    free(R);
    free(out);
    free(mean);
    free(rstd);
    free(D0);
    free(din);
    free(dw);
    free(db);
    free(dw2);
    free(db2);
    free(din2);
    free(g);
    free(dd);
    free(c.x);
    free(c.w);
    free(c.b);
    free(c.R);
    free(c.out);
    free(c.mean);
    free(c.rstd);
}

/* ---- q/k norms (Qwen3) ------------------------------------------------------------- */

/* The reference per head in double: q heads by wq, k heads by wk, v as is;
 * the loss is <out, R> over all of qkv, so v's gradient must come out 0
 * (qknorm_bwd leaves v's part of dqkv alone: the caller's). */
typedef struct {
    int N, NH, NKV, HS;
    double eps;
    double *qkv, *wq, *wk, *R, *out;
} qkn_ctx;

static double loss_qkn(void *p)
{
    qkn_ctx *c = p;
    const int R = (c->NH + 2 * c->NKV) * c->HS;
    memcpy(c->out, c->qkv, (size_t)c->N * R * sizeof(double));
    for (int n = 0; n < c->N; n++)
        for (int h = 0; h < c->NH + c->NKV; h++) {
            double *x = c->out + (size_t)n * R + (size_t)h * c->HS, ss = 0.0;
            const double *w = h < c->NH ? c->wq : c->wk;
            for (int i = 0; i < c->HS; i++)
                ss += x[i] * x[i];
            const double r = 1.0 / sqrt(ss / c->HS + c->eps);
            for (int i = 0; i < c->HS; i++)
                x[i] *= r * w[i];
        }
    return dot(c->out, c->R, (size_t)c->N * R);
}

static void test_qknorm(void)
{
    const int N = 3, NH = 4, NKV = 2, HS = 6, R = (NH + 2 * NKV) * HS, nqk = NH + NKV;
    const float eps = 1e-6f;
    const size_t nx = (size_t)N * R;
    float *qkv = frandv(nx, -1.5f, 2.0f), *wq = frandv(HS, 0.5f, 1.5f), *wk = frandv(HS, 0.5f, 1.5f);
    float *Rg = frandv(nx, -1, 1), *y = fdup(qkv, nx), *xin = fnan((size_t)N * nqk * HS), *rstd = fnan((size_t)N * nqk);
    qkn_ctx c = {N,
                 NH,
                 NKV,
                 HS,
                 eps,
                 todouble(qkv, nx),
                 todouble(wq, HS),
                 todouble(wk, HS),
                 todouble(Rg, nx),
                 xmalloc(nx * sizeof(double))};
    loss_qkn(&c);
    ops->qknorm_fwd(ops->ctx, y, xin, rstd, wq, wk, N, NH, NKV, HS, eps);
    check("qknorm_fwd (q by wq, k by wk; v untouched)", rel_err(y, c.out, nx), FWD_TOL);
    int saved = 1;
    for (int n = 0; n < N; n++)
        for (int k = 0; k < nqk * HS; k++)
            saved &= xin[(size_t)n * nqk * HS + k] == qkv[(size_t)n * R + k];
    check_true("qknorm_fwd saves q, k as they came in", saved);
    /* dqkv = R: q, k parts become the input gradient, v's stays R's */
    float *dy = fdup(Rg, nx), *dwq = fnan(HS), *dwk = fnan(HS);
    ops->qknorm_bwd(ops->ctx, dy, dwq, dwk, xin, wq, wk, rstd, N, NH, NKV, HS, 0);
    double *g = xmalloc(nx * sizeof(double));
    fd_grad(g, c.qkv, nx, loss_qkn, &c);
    check("qknorm_bwd dqkv vs FD", rel_err(dy, g, nx), BWD_TOL);
    fd_grad(g, c.wq, HS, loss_qkn, &c);
    check("qknorm_bwd dwq vs FD", rel_err(dwq, g, HS), BWD_TOL);
    fd_grad(g, c.wk, HS, loss_qkn, &c);
    check("qknorm_bwd dwk vs FD", rel_err(dwk, g, HS), BWD_TOL);
    float *dy2 = fdup(Rg, nx), *dwq2 = fdup(dwq, HS), *dwk2 = fdup(dwk, HS);
    ops->qknorm_bwd(ops->ctx, dy2, dwq2, dwk2, xin, wq, wk, rstd, N, NH, NKV, HS, 1);
    check("qknorm_bwd accum=1 doubles dwq", doubling_err(dwq, dwq2, HS), ACC_TOL);
    check("qknorm_bwd accum=1 doubles dwk", doubling_err(dwk, dwk2, HS), ACC_TOL);
    free(qkv), free(wq), free(wk), free(Rg), free(y), free(xin), free(rstd), free(dy), free(dwq), free(dwk);
    free(dy2), free(dwq2), free(dwk2), free(g);
    free(c.qkv), free(c.wq), free(c.wk), free(c.R), free(c.out);
}

/* ---- RoPE and attention ------------------------------------------------------------ */

typedef struct {
    int B, T, NH, NKV, HS, rope, attn;
    const float *freq; /* RoPE's inverse frequencies [HS/2] */
    double *qkv, *R, *tmp, *out, *att;
    const int32_t *pos; /* document positions [B*T], or NULL (one document per row) */
} at_ctx;

/* Position of token n: pos[n], or n % T. */
static int ref_pos(const int32_t *pos, int n, int T) { return pos ? pos[n] : n % T; }

/* Whether query t of row b may see key j: j <= t, in the same document. */
static int ref_sees(const int32_t *pos, int b, int T, int t, int j)
{
    return j <= t && (!pos || j >= t - pos[(size_t)b * T + t]);
}

/* pair i of each q and k head turns by pos * freq[i], pos = ref_pos */
static void ref_rope(double *qkv, const int32_t *pos, int B, int T, int NH, int NKV, int HS, const float *freq)
{
    int R = (NH + 2 * NKV) * HS;
    for (int n = 0; n < B * T; n++)
        for (int h = 0; h < NH + NKV; h++)
            for (int i = 0; i < HS / 2; i++) {
                double a = ref_pos(pos, n, T) * (double)freq[i];
                double *p = qkv + (size_t)n * R + h * HS + 2 * i;
                double x0 = p[0], x1 = p[1];
                p[0] = x0 * cos(a) - x1 * sin(a);
                p[1] = x0 * sin(a) + x1 * cos(a);
            }
}

static void ref_attention(double *out, double *att, const double *qkv, const int32_t *pos, int B, int T, int NH,
                          int NKV, int HS)
{
    int R = (NH + 2 * NKV) * HS;
    double scale = 1.0 / sqrt((double)HS);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            int kh = h / (NH / NKV);
            double *P = att + ((size_t)b * NH + h) * T * T;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * R + h * HS;
                double mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    double s = 0.0;
                    if (ref_sees(pos, b, T, t, j)) {
                        const double *k = qkv + ((size_t)b * T + j) * R + (NH + kh) * HS;
                        for (int d = 0; d < HS; d++)
                            s += q[d] * k[d];
                        s *= scale;
                        mx = s > mx ? s : mx;
                    }
                    P[(size_t)t * T + j] = s;
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++)
                    if (ref_sees(pos, b, T, t, j))
                        sum += (P[(size_t)t * T + j] = exp(P[(size_t)t * T + j] - mx));
                for (int j = 0; j < T; j++)
                    P[(size_t)t * T + j] = ref_sees(pos, b, T, t, j) ? P[(size_t)t * T + j] / sum : 0.0;
                double *o = out + ((size_t)b * T + t) * NH * HS + h * HS;
                for (int d = 0; d < HS; d++) {
                    double s = 0.0;
                    for (int j = 0; j <= t; j++)
                        s += P[(size_t)t * T + j] * qkv[((size_t)b * T + j) * R + (NH + NKV + kh) * HS + d];
                    o[d] = s;
                }
            }
        }
}

/* L = sum(f(qkv) o R) with f = rope, attention, or attention after rope */
static double loss_at(void *p)
{
    at_ctx *c = p;
    size_t nqkv = (size_t)c->B * c->T * (c->NH + 2 * c->NKV) * c->HS;
    memcpy(c->tmp, c->qkv, nqkv * sizeof(double));
    if (c->rope)
        ref_rope(c->tmp, c->pos, c->B, c->T, c->NH, c->NKV, c->HS, c->freq);
    if (!c->attn)
        return dot(c->tmp, c->R, nqkv);
    ref_attention(c->out, c->att, c->tmp, c->pos, c->B, c->T, c->NH, c->NKV, c->HS);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->NH * c->HS);
}

/* A RoPE table for head size HS <= 64: theta 10000, the upper half of the
 * pairs slowed 8x as a scaled table (llama3's low frequencies) is, so the
 * ops are seen to read the table rather than a theta. */
static const float *rope_table(int HS)
{
    static float f[32];
    for (int i = 0; i < HS / 2; i++)
        f[i] = dt_rope_inv_freq(i, HS, 10000.0f) / (2 * i >= HS / 2 ? 8.0f : 1.0f);
    return f;
}

/* pos: document positions of the B = 2, T = 5 rows, or NULL */
static void test_rope(const int32_t *pos)
{
    const int B = 2, T = 5, NH = 4, NKV = 2, HS = 8;
    const float *freq = rope_table(HS);
    const char *tag = pos ? " (documents)" : "";
    char name[96];
    size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * HS;
    float *qkv = frandv(nqkv, -1, 1), *R = frandv(nqkv, -1, 1);
    at_ctx c = {
        B,    T,    NH, NKV, HS, 1, 0, freq, todouble(qkv, nqkv), todouble(R, nqkv), xmalloc(nqkv * sizeof(double)),
        NULL, NULL, pos};
    float *y = fdup(qkv, nqkv);
    ops->rope_fwd(ops->ctx, y, pos, B, T, NH, NKV, HS, freq);
    loss_at(&c);
    snprintf(name, sizeof name, "rope_fwd (q, k rotated; v untouched)%s", tag);
    check(name, rel_err(y, c.tmp, nqkv), FWD_TOL);
    float *dy = fdup(R, nqkv);
    ops->rope_bwd(ops->ctx, dy, NULL, pos, B, T, NH, NKV, HS, freq);
    double *g = xmalloc(nqkv * sizeof(double));
    fd_grad(g, c.qkv, nqkv, loss_at, &c);
    snprintf(name, sizeof name, "rope_bwd vs FD%s", tag);
    check(name, rel_err(dy, g, nqkv), BWD_TOL);
    /* the backward is the inverse: rope_bwd(rope_fwd(x)) = x */
    ops->rope_bwd(ops->ctx, y, NULL, pos, B, T, NH, NKV, HS, freq);
    snprintf(name, sizeof name, "rope_bwd(rope_fwd(x)) = x%s", tag);
    check(name, rel_err(y, c.qkv, nqkv), FWD_TOL);
    free(qkv);
    free(R);
    free(y);
    free(dy);
    free(g);
    free(c.qkv);
    free(c.R);
    free(c.tmp);
}

/* pos: document positions [B*T] (--doc-mask), or NULL for plain causal */
static void test_attention(int B, int T, int NH, int NKV, int HS, int rope, int threads, const int32_t *pos)
{
    const float *freq = rope_table(HS);
    const int R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * T * R, nout = (size_t)B * T * NH * HS, natt = (size_t)B * NH * T * T,
           nlse = (size_t)B * NH * T;
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B%d T%d NH%d NKV%d HS%d%s%s%s", B, T, NH, NKV, HS, rope ? " +rope" : "",
             threads ? " 4thr" : "", pos ? " docs" : "");
    int saved = get_threads();
    if (threads)
        set_threads(4);

    float *qkv = frandv(nqkv, -1.5f, 1.5f), *dout = frandv(nout, -1, 1);
    at_ctx c = {B,
                T,
                NH,
                NKV,
                HS,
                rope,
                1,
                freq,
                todouble(qkv, nqkv),
                todouble(dout, nout),
                xmalloc(nqkv * sizeof(double)),
                xmalloc(nout * sizeof(double)),
                xmalloc(natt * sizeof(double)),
                pos};
    loss_at(&c);

    float *x = fdup(qkv, nqkv), *out = fnan(nout), *lse = fnan(nlse);
    if (rope)
        ops->rope_fwd(ops->ctx, x, pos, B, T, NH, NKV, HS, freq);
    ops->attention_fwd(ops->ctx, out, NULL, lse, x, pos, B, T, NH, NKV, HS);
    snprintf(name, sizeof name, "attention_fwd out  %s", tag);
    check(name, rel_err(out, c.out, nout), FWD_TOL);
    /* lse = log sum_{j<=t} exp(q_t . k_j / sqrt(HS)), in double from the
     * (roped) qkv the reference used */
    double *lse_ref = xmalloc(nlse * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const double *q = c.tmp + ((size_t)b * T + t) * R + h * HS;
                double mx = -INFINITY, sc[T];
                for (int j = 0; j <= t; j++) {
                    sc[j] = -INFINITY;
                    if (!ref_sees(pos, b, T, t, j))
                        continue;
                    const double *k = c.tmp + ((size_t)b * T + j) * R + (NH + h / (NH / NKV)) * HS;
                    double d = 0.0;
                    for (int e = 0; e < HS; e++)
                        d += q[e] * k[e];
                    sc[j] = d / sqrt((double)HS);
                    mx = sc[j] > mx ? sc[j] : mx;
                }
                double sum = 0.0;
                for (int j = 0; j <= t; j++)
                    sum += exp(sc[j] - mx);
                lse_ref[((size_t)b * NH + h) * T + t] = mx + log(sum);
            }
    snprintf(name, sizeof name, "attention_fwd lse  %s", tag);
    check(name, rel_err(lse, lse_ref, nlse), FWD_TOL);

    float *dqkv = fnan(nqkv);
    ops->attention_bwd(ops->ctx, dqkv, NULL, dout, x, out, lse, pos, B, T, NH, NKV, HS);
    if (rope)
        ops->rope_bwd(ops->ctx, dqkv, NULL, pos, B, T, NH, NKV, HS, freq);
    double *g = xmalloc(nqkv * sizeof(double));
    fd_grad(g, c.qkv, nqkv, loss_at, &c);
    snprintf(name, sizeof name, "attention_bwd dqkv vs FD  %s", tag);
    check(name, rel_err(dqkv, g, nqkv), BWD_TOL);

    if (threads)
        set_threads(saved);
    free(qkv);
    free(dout);
    free(x);
    free(out);
    free(lse);
    free(lse_ref);
    free(dqkv);
    free(g);
    free(c.qkv);
    free(c.R);
    free(c.tmp);
    free(c.out);
    free(c.att);
}

/* ---- GELU / SwiGLU ---------------------------------------------------------------------- */

typedef struct {
    int N, F, swiglu;
    double *x, *R, *out;
} act_ctx;

static double loss_act(void *p)
{
    act_ctx *c = p;
    const double k = sqrt(2.0 / 3.14159265358979323846);
    if (!c->swiglu) {
        for (int i = 0; i < c->N; i++) {
            double x = c->x[i];
            c->out[i] = 0.5 * x * (1.0 + tanh(k * (x + 0.044715 * x * x * x)));
        }
        return dot(c->out, c->R, (size_t)c->N);
    }
    for (int n = 0; n < c->N; n++)
        for (int f = 0; f < c->F; f++) {
            double g = c->x[(size_t)n * 2 * c->F + f], u = c->x[(size_t)n * 2 * c->F + c->F + f];
            c->out[(size_t)n * c->F + f] = g / (1.0 + exp(-g)) * u;
        }
    return dot(c->out, c->R, (size_t)c->N * c->F);
}

static void test_gelu(void)
{
    const int n = 200;
    float *x = frandv(n, -6, 6), *R = frandv(n, -1, 1), *out = fnan(n), *dx = fnan(n);
    x[0] = 0.0f;
    x[1] = -20.0f;
    x[2] = 20.0f;
    x[3] = -1e-3f; /* tails and the origin */
    act_ctx c = {n, 0, 0, todouble(x, n), todouble(R, n), xmalloc(n * sizeof(double))};
    loss_act(&c);
    ops->gelu_fwd(ops->ctx, out, NULL, x, n);
    check("gelu_fwd vs tanh formula", rel_err(out, c.out, n), FWD_TOL);
    ops->gelu_bwd(ops->ctx, dx, x, R, n);
    double *g = xmalloc(n * sizeof(double));
    fd_grad(g, c.x, n, loss_act, &c);
    check("gelu_bwd vs FD", rel_err(dx, g, n), BWD_TOL);
    /* in place (dx aliasing dout), as a fused caller may do */
    float *d2 = fdup(R, n);
    ops->gelu_bwd(ops->ctx, d2, x, d2, n);
    check_true("gelu_bwd dx aliasing dout gives same bits", memcmp(d2, dx, n * 4) == 0);
    free(x);
    free(R);
    free(out);
    free(dx);
    free(g);
    free(d2);
    free(c.x);
    free(c.R);
    free(c.out);
}

/* The fused GEMM + GELU ops are, on the CPU, the separate ops bit for bit
 * (base/ops.h), in fp32 and bf16 and for the backward's dw and db too; the
 * separate ops are checked against formulas and FD above. */
static void test_matmul_gelu(int N, int IC, int OC)
{
    float *in = frandv((size_t)N * IC, -2, 2), *w = frandv((size_t)OC * IC, -1, 1), *b = frandv(OC, -1, 1);
    float *dout = frandv((size_t)N * OC, -1, 1);
    float *pre = fnan((size_t)N * OC), *out = fnan((size_t)N * OC);
    float *pre2 = fnan((size_t)N * OC), *out2 = fnan((size_t)N * OC);
    char what[96];
    /* forward: pre = in . w^T + b, out = gelu(pre) */
    ops->matmul_gelu_fwd(ops->ctx, out, pre, in, w, b, N, IC, OC);
    ops->matmul_fwd(ops->ctx, pre2, in, w, b, N, IC, OC);
    ops->gelu_fwd(ops->ctx, out2, NULL, pre2, (size_t)N * OC);
    snprintf(what, sizeof what, "matmul_gelu_fwd %dx%dx%d = matmul_fwd, gelu_fwd (bits)", N, IC, OC);
    check_true(what, !memcmp(pre, pre2, (size_t)N * OC * 4) && !memcmp(out, out2, (size_t)N * OC * 4));
    /* backward of a matmul [N,OC] -> [N,OC2] whose input was gelu(pre) */
    const int OC2 = IC;
    float *w2 = frandv((size_t)OC2 * OC, -1, 1), *d2 = frandv((size_t)N * OC2, -1, 1);
    float *din = fnan((size_t)N * OC), *dw = frandv((size_t)OC2 * OC, -1, 1), *db = frandv(OC2, -1, 1);
    float *din2 = fnan((size_t)N * OC), *dw2 = fdup(dw, (size_t)OC2 * OC), *db2 = fdup(db, OC2);
    float *tmp = fnan((size_t)N * OC);
    for (int accum = 0; accum <= 1; accum++) {
        ops->matmul_dgelu_bwd(ops->ctx, din, dw, db, d2, out, pre, w2, N, OC, OC2, accum);
        ops->matmul_bwd(ops->ctx, tmp, dw2, db2, d2, out, w2, N, OC, OC2, 0, accum);
        ops->gelu_bwd(ops->ctx, din2, pre, tmp, (size_t)N * OC);
        snprintf(what, sizeof what, "matmul_dgelu_bwd %dx%dx%d accum %d = matmul_bwd, gelu_bwd (bits)", N, OC, OC2,
                 accum);
        check_true(what, !memcmp(din, din2, (size_t)N * OC * 4) && !memcmp(dw, dw2, (size_t)OC2 * OC * 4) &&
                             !memcmp(db, db2, (size_t)OC2 * 4));
    }
    /* din not wanted (NULL): dw and db as before, nothing else touched */
    ops->matmul_dgelu_bwd(ops->ctx, NULL, dw, db, d2, out, pre, w2, N, OC, OC2, 0);
    ops->matmul_bwd(ops->ctx, NULL, dw2, db2, d2, out, w2, N, OC, OC2, 0, 0);
    snprintf(what, sizeof what, "matmul_dgelu_bwd %dx%dx%d with din NULL: dw, db as matmul_bwd (bits)", N, OC, OC2);
    check_true(what, !memcmp(dw, dw2, (size_t)OC2 * OC * 4) && !memcmp(db, db2, (size_t)OC2 * 4));
    /* bf16 operands */
    uint16_t *in16 = xmalloc((size_t)N * IC * 2), *w16 = xmalloc((size_t)OC * IC * 2);
    uint16_t *out16 = xmalloc((size_t)N * OC * 2), *w216 = xmalloc((size_t)OC2 * OC * 2);
    uint16_t *d216 = xmalloc((size_t)N * OC2 * 2);
    ops->cast_f32_to_bf16(ops->ctx, in16, in, (size_t)N * IC);
    ops->cast_f32_to_bf16(ops->ctx, w16, w, (size_t)OC * IC);
    ops->matmul_gelu_fwd_bf16(ops->ctx, out, NULL, pre, in16, w16, b, N, IC, OC);
    ops->matmul_fwd_bf16(ops->ctx, pre2, in16, w16, b, N, IC, OC);
    ops->gelu_fwd(ops->ctx, out2, NULL, pre2, (size_t)N * OC);
    snprintf(what, sizeof what, "matmul_gelu_fwd_bf16 %dx%dx%d = matmul_fwd_bf16, gelu_fwd (bits)", N, IC, OC);
    check_true(what, !memcmp(pre, pre2, (size_t)N * OC * 4) && !memcmp(out, out2, (size_t)N * OC * 4));
    ops->cast_f32_to_bf16(ops->ctx, out16, out, (size_t)N * OC);
    ops->cast_f32_to_bf16(ops->ctx, w216, w2, (size_t)OC2 * OC);
    ops->cast_f32_to_bf16(ops->ctx, d216, d2, (size_t)N * OC2);
    for (int accum = 0; accum <= 1; accum++) {
        ops->matmul_dgelu_bwd_bf16(ops->ctx, din, NULL, dw, db, d216, d2, out16, pre, w216, N, OC, OC2, accum);
        ops->matmul_bwd_bf16(ops->ctx, tmp, dw2, db2, d216, d2, out16, w216, N, OC, OC2, 0, accum);
        ops->gelu_bwd(ops->ctx, din2, pre, tmp, (size_t)N * OC);
        snprintf(what, sizeof what, "matmul_dgelu_bwd_bf16 %dx%dx%d accum %d = matmul_bwd_bf16, gelu_bwd (bits)", N, OC,
                 OC2, accum);
        check_true(what, !memcmp(din, din2, (size_t)N * OC * 4) && !memcmp(dw, dw2, (size_t)OC2 * OC * 4) &&
                             !memcmp(db, db2, (size_t)OC2 * 4));
    }
    free(in);
    free(w);
    free(b);
    free(dout);
    free(pre);
    free(out);
    free(pre2);
    free(out2);
    free(w2);
    free(d2);
    free(din);
    free(dw);
    free(db);
    free(din2);
    free(dw2);
    free(db2);
    free(tmp);
    free(in16);
    free(w16);
    free(out16);
    free(w216);
    free(d216);
}

static void test_swiglu(void)
{
    const int N = 4, F = 19;
    size_t ngu = (size_t)N * 2 * F, nout = (size_t)N * F;
    float *gu = frandv(ngu, -5, 5), *R = frandv(nout, -1, 1), *out = fnan(nout), *dgu = fnan(ngu);
    gu[0] = -30.0f;
    gu[1] = 30.0f;
    act_ctx c = {N, F, 1, todouble(gu, ngu), todouble(R, nout), xmalloc(nout * sizeof(double))};
    loss_act(&c);
    ops->swiglu_fwd(ops->ctx, out, NULL, gu, N, F);
    check("swiglu_fwd", rel_err(out, c.out, nout), FWD_TOL);
    ops->swiglu_bwd(ops->ctx, dgu, NULL, gu, R, N, F);
    double *g = xmalloc(ngu * sizeof(double));
    fd_grad(g, c.x, ngu, loss_act, &c);
    check("swiglu_bwd (gate and up) vs FD", rel_err(dgu, g, ngu), BWD_TOL);
    free(gu);
    free(R);
    free(out);
    free(dgu);
    free(g);
    free(c.x);
    free(c.R);
    free(c.out);
}

/* ---- embedding ------------------------------------------------------------------------------ */

typedef struct {
    int N, T, C, V;
    const int32_t *tok, *pos;
    double *wte, *wpe, *R, *out;
} emb_ctx;

static double loss_emb(void *p)
{
    emb_ctx *c = p;
    for (int n = 0; n < c->N; n++)
        for (int i = 0; i < c->C; i++)
            c->out[(size_t)n * c->C + i] = c->wte[(size_t)c->tok[n] * c->C + i] +
                                           (c->wpe ? c->wpe[(size_t)ref_pos(c->pos, n, c->T) * c->C + i] : 0.0);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_embedding(void)
{
    const int B = 2, T = 5, N = B * T, C = 37, V = 11;
    const int32_t tok[10] = {3, 7, 3, 0, 10, 3, 3, 9, 7, 1}; /* repeats; rows 2,4,5,6,8 unused */
    size_t nwte = (size_t)V * C, nwpe = (size_t)T * C, nout = (size_t)N * C;
    float *wte = frandv(nwte, -1, 1), *wpe = frandv(nwpe, -1, 1), *R = frandv(nout, -1, 1);
    float *out = fnan(nout);
    emb_ctx c = {N,
                 T,
                 C,
                 V,
                 tok,
                 NULL,
                 todouble(wte, nwte),
                 todouble(wpe, nwpe),
                 todouble(R, nout),
                 xmalloc(nout * sizeof(double))};
    loss_emb(&c);
    ops->embedding_fwd(ops->ctx, out, tok, NULL, wte, wpe, N, T, C, 0, V);
    check("embedding_fwd (wte + wpe)", rel_err(out, c.out, nout), FWD_TOL);

    float *dwte = fnan(nwte), *dwpe = fnan(nwpe);
    ops->embedding_bwd(ops->ctx, dwte, dwpe, R, tok, NULL, N, T, C, 0, V, 0);
    double *g = xmalloc(nwte * sizeof(double));
    fd_grad(g, c.wte, nwte, loss_emb, &c);
    check("embedding_bwd dwte (accum=0 over NaN) vs FD", rel_err(dwte, g, nwte), BWD_TOL);
    fd_grad(g, c.wpe, nwpe, loss_emb, &c);
    check("embedding_bwd dwpe (accum=0 over NaN) vs FD", rel_err(dwpe, g, nwpe), BWD_TOL);
    float *dwte2 = fdup(dwte, nwte), *dwpe2 = fdup(dwpe, nwpe);
    ops->embedding_bwd(ops->ctx, dwte2, dwpe2, R, tok, NULL, N, T, C, 0, V, 1);
    check("embedding_bwd accum=1 doubles dwte", doubling_err(dwte, dwte2, nwte), ACC_TOL);
    check("embedding_bwd accum=1 doubles dwpe", doubling_err(dwpe, dwpe2, nwpe), ACC_TOL);

    /* without wpe */
    free(c.wpe);
    c.wpe = NULL;
    loss_emb(&c);
    float *out2 = fnan(nout), *dwte3 = fnan(nwte);
    ops->embedding_fwd(ops->ctx, out2, tok, NULL, wte, NULL, N, T, C, 0, V);
    check("embedding_fwd (wte only)", rel_err(out2, c.out, nout), FWD_TOL);
    ops->embedding_bwd(ops->ctx, dwte3, NULL, R, tok, NULL, N, T, C, 0, V, 0);
    check_true("embedding_bwd dwpe=NULL: dwte same bits", memcmp(dwte3, dwte, nwte * 4) == 0);

    /* vocabulary split over two ranks, rows [0,6) and [6,11); wpe on the
     * first: the sum of the outputs is the whole embedding, and each rank's
     * dwte is its rows of the whole gradient, bit for bit */
    const int V0 = 6, V1 = V - V0;
    float *o0 = fnan(nout), *o1 = fnan(nout), *d0 = fnan((size_t)V0 * C), *d1 = fnan((size_t)V1 * C);
    ops->embedding_fwd(ops->ctx, o0, tok, NULL, wte, wpe, N, T, C, 0, V0);
    ops->embedding_fwd(ops->ctx, o1, tok, NULL, wte + (size_t)V0 * C, NULL, N, T, C, V0, V1);
    ops->add(ops->ctx, o0, o0, o1, nout);
    check_true("embedding_fwd vocab split in 2 (wpe on one): sum == whole, same bits", memcmp(o0, out, nout * 4) == 0);
    ops->embedding_bwd(ops->ctx, d0, NULL, R, tok, NULL, N, T, C, 0, V0, 0);
    ops->embedding_bwd(ops->ctx, d1, NULL, R, tok, NULL, N, T, C, V0, V1, 0);
    check_true("embedding_bwd vocab split in 2: rows == whole's, same bits",
               memcmp(d0, dwte, (size_t)V0 * C * 4) == 0 && memcmp(d1, dwte + (size_t)V0 * C, (size_t)V1 * C * 4) == 0);
    free(o0);
    free(o1);
    free(d0);
    free(d1);

    /* document positions: wpe rows by position within the document */
    static const int32_t pos[10] = {0, 1, 2, 0, 1, 0, 0, 1, 2, 3};
    c.wpe = todouble(wpe, nwpe);
    c.pos = pos;
    loss_emb(&c);
    float *o3 = fnan(nout), *dw3 = fnan(nwte), *dp3 = fnan(nwpe);
    ops->embedding_fwd(ops->ctx, o3, tok, pos, wte, wpe, N, T, C, 0, V);
    check("embedding_fwd (wte + wpe by document position)", rel_err(o3, c.out, nout), FWD_TOL);
    ops->embedding_bwd(ops->ctx, dw3, dp3, R, tok, pos, N, T, C, 0, V, 0);
    fd_grad(g, c.wpe, nwpe, loss_emb, &c);
    check("embedding_bwd dwpe by document position vs FD", rel_err(dp3, g, nwpe), BWD_TOL);
    check_true("embedding_bwd with positions: dwte same bits", memcmp(dw3, dwte, nwte * 4) == 0);
    free(o3);
    free(dw3);
    free(dp3);
    free(c.wpe);
    free(wte);
    free(wpe);
    free(R);
    free(out);
    free(out2);
    free(dwte);
    free(dwpe);
    free(dwte2);
    free(dwpe2);
    free(dwte3);
    free(g);
    free(c.wte);
    free(c.R);
    free(c.out);
}

/* ---- cross-entropy ---------------------------------------------------------------------------- */

typedef struct {
    int N, V, ld;
    const int32_t *tgt;
    double dloss;
    double *logits, *losses;
} ce_ctx;

/* losses[n] = logsumexp(row) - row[tgt]; L = dloss * sum of the losses */
static double loss_ce(void *p)
{
    ce_ctx *c = p;
    double L = 0.0;
    for (int n = 0; n < c->N; n++) {
        const double *x = c->logits + (size_t)n * c->ld;
        if (c->tgt[n] < 0) {
            c->losses[n] = 0.0;
            continue;
        }
        double mx = -INFINITY, s = 0.0;
        for (int i = 0; i < c->V; i++)
            mx = x[i] > mx ? x[i] : mx;
        for (int i = 0; i < c->V; i++)
            s += exp(x[i] - mx);
        c->losses[n] = mx + log(s) - x[c->tgt[n]];
        L += c->dloss * c->losses[n];
    }
    return L;
}

/* The three cross-entropy passes on an unsplit vocabulary. */
static void xent_whole(float *losses, float *dlogits, const float *logits, const int32_t *tgt, int N, int V, int ld,
                       float dloss)
{
    float *mx = fnan(N), *st = fnan((size_t)2 * N);
    ops->xent_max(ops->ctx, mx, logits, N, V, ld);
    ops->xent_sumexp(ops->ctx, st, dlogits, logits, mx, tgt, 0, N, V, ld);
    ops->xent_finish(ops->ctx, losses, dlogits, NULL, mx, st, tgt, 0, N, V, ld, dloss);
    free(mx);
    free(st);
}

/* row 2 has an ignored target, row 4 has logits shifted by +90 */
static void test_cross_entropy(int N, int V, int ld, const int32_t *tgt)
{
    const float dloss = 0.37f;
    char tag[64], name[160];
    snprintf(tag, sizeof tag, "N%d V%d ld%d", N, V, ld);
    size_t nl = (size_t)N * ld;
    float *logits = frandv(nl, -3, 3);
    for (int n = 0; n < N; n++)
        for (int i = V; i < ld; i++)
            logits[(size_t)n * ld + i] = NAN; /* padding must never be read into the result */
    for (int i = 0; i < V; i++)
        logits[4 * ld + i] += 90.0f; /* exp would overflow without the max shift */
    ce_ctx c = {N, V, ld, tgt, dloss, todouble(logits, nl), xmalloc(N * sizeof(double))};
    loss_ce(&c);
    double *refloss = xmalloc(N * sizeof(double));
    memcpy(refloss, c.losses, N * sizeof(double));

    float *losses = fnan(N), *dl = fnan(nl), *losses_only = fnan(N);
    xent_whole(losses, dl, logits, tgt, N, V, ld, dloss);
    snprintf(name, sizeof name, "cross_entropy losses (NaN padding) %s", tag);
    check(name, rel_err(losses, refloss, N), FWD_TOL);
    check_true("cross_entropy ignored target: loss == 0", losses[2] == 0.0f);
    double *g = xmalloc(nl * sizeof(double));
    memset(g, 0, nl * sizeof(double));
    for (int n = 0; n < N; n++) /* FD over the real columns only; padding gradient is 0 */
        fd_grad(g + (size_t)n * ld, c.logits + (size_t)n * ld, V, loss_ce, &c);
    snprintf(name, sizeof name, "cross_entropy dlogits vs FD %s", tag);
    check(name, rel_err(dl, g, nl), BWD_TOL);
    int pad_zero = 1, ign_zero = 1;
    for (int n = 0; n < N; n++)
        for (int i = V; i < ld; i++)
            pad_zero &= dl[(size_t)n * ld + i] == 0.0f;
    for (int i = 0; i < ld; i++)
        ign_zero &= dl[2 * ld + i] == 0.0f;
    check_true("cross_entropy dlogits padding columns == 0", pad_zero);
    check_true("cross_entropy ignored target: gradient row == 0", ign_zero);

    xent_whole(losses_only, NULL, logits, tgt, N, V, ld, dloss);
    check_true("cross_entropy dlogits=NULL: same losses", memcmp(losses_only, losses, N * 4) == 0);
    float *alias = fdup(logits, nl), *losses2 = fnan(N);
    xent_whole(losses2, alias, alias, tgt, N, V, ld, dloss);
    check_true("cross_entropy dlogits aliasing logits: same bits",
               memcmp(losses2, losses, N * 4) == 0 && memcmp(alias, dl, nl * 4) == 0);

    /* the vocabulary split over 3 ranks as tensor parallelism pads it:
     * each holds ldr = ceil(ld/3) columns, the last ones padding; the max
     * and the stats reduced between passes as the allreduces would */
    const int ldr = (ld + 2) / 3;
    float *part[3], *rmax[3], *st[3], *pl[3];
    float *gmax = fnan(N), *gst = xmalloc((size_t)2 * N * 4);
    memset(gst, 0, (size_t)2 * N * 4);
    for (int r = 0; r < 3; r++) {
        int v0 = r * ldr, vl = V - v0 < 0 ? 0 : V - v0 > ldr ? ldr : V - v0;
        part[r] = fnan((size_t)N * ldr);
        for (int n = 0; n < N; n++)
            memcpy(part[r] + (size_t)n * ldr, logits + (size_t)n * ld + v0, (size_t)vl * 4);
        rmax[r] = fnan(N);
        st[r] = fnan((size_t)2 * N);
        pl[r] = fnan(N);
        ops->xent_max(ops->ctx, rmax[r], part[r], N, vl, ldr);
        for (int n = 0; n < N; n++)
            gmax[n] = r == 0 || rmax[r][n] > gmax[n] ? rmax[r][n] : gmax[n];
    }
    for (int r = 0; r < 3; r++) {
        int v0 = r * ldr, vl = V - v0 < 0 ? 0 : V - v0 > ldr ? ldr : V - v0;
        ops->xent_sumexp(ops->ctx, st[r], part[r], part[r], gmax, tgt, v0, N, vl, ldr);
        for (int k = 0; k < 2 * N; k++)
            gst[k] += st[r][k];
    }
    double gerr = 0.0;
    int lsame = 1;
    for (int r = 0; r < 3; r++) {
        int v0 = r * ldr, vl = V - v0 < 0 ? 0 : V - v0 > ldr ? ldr : V - v0;
        ops->xent_finish(ops->ctx, pl[r], part[r], NULL, gmax, gst, tgt, v0, N, vl, ldr, dloss);
        for (int n = 0; n < N; n++) {
            lsame &= fabsf(pl[r][n] - losses[n]) <= 1e-6f * (1.0f + fabsf(losses[n]));
            for (int i = 0; i < ldr; i++) {
                double want = i < vl ? g[(size_t)n * ld + v0 + i] : 0.0;
                double e = fabs(part[r][(size_t)n * ldr + i] - want);
                if (!(e <= gerr)) /* NaN propagates */
                    gerr = e;
            }
        }
        free(part[r]);
        free(rmax[r]);
        free(st[r]);
        free(pl[r]);
    }
    snprintf(name, sizeof name, "cross_entropy vocab split in 3 (padded): losses == whole's %s", tag);
    check_true(name, lsame);
    double gmaxabs = 0.0;
    for (size_t k = 0; k < nl; k++)
        gmaxabs = fabs(g[k]) > gmaxabs ? fabs(g[k]) : gmaxabs;
    snprintf(name, sizeof name, "cross_entropy vocab split in 3: dlogits vs FD, padding 0 %s", tag);
    check(name, gerr / gmaxabs, BWD_TOL);
    free(gmax);
    free(gst);
    free(logits);
    free(losses);
    free(dl);
    free(losses_only);
    free(alias);
    free(losses2);
    free(g);
    free(refloss);
    free(c.logits);
    free(c.losses);
}

/* ---- AdamW ------------------------------------------------------------------------------------ */

/* torch.optim.AdamW (1.13, single-tensor) in double, hyperparameters as the
 * op receives them (floats widened to double) */
static void test_adamw(void)
{
    const size_t n = 1000;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    float *p = frandv(n, -1, 1), *m = xmalloc(n * 4), *v = xmalloc(n * 4);
    memset(m, 0, n * 4);
    memset(v, 0, n * 4);
    /* the same steps with the fused bf16 copy (--dtype bf16's weights) */
    float *p2 = xmalloc(n * 4), *m2 = xmalloc(n * 4), *v2 = xmalloc(n * 4);
    uint16_t *p16 = xmalloc(n * sizeof *p16);
    memcpy(p2, p, n * 4);
    memset(m2, 0, n * 4);
    memset(v2, 0, n * 4);
    double *rp = todouble(p, n), *rm = xmalloc(n * 8), *rv = xmalloc(n * 8);
    memset(rm, 0, n * 8);
    memset(rv, 0, n * 8);
    double *p0 = todouble(p, n);
    for (int t = 1; t <= 3; t++) {
        float *g = frandv(n, -2, 2);
        g[0] = 0.0f; /* zero gradient: denominator is eps only on step 1 */
        ops->adamw(ops->ctx, p, NULL, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
        ops->adamw(ops->ctx, p2, p16, g, m2, v2, n, lr, b1, b2, eps, wd, gs, t);
        double bc1 = 1.0 - pow(b1, t), bc2 = 1.0 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rp[i] *= 1.0 - (double)lr * wd;
            rm[i] = b1 * rm[i] + (1.0 - b1) * gi;
            rv[i] = b2 * rv[i] + (1.0 - b2) * gi * gi;
            rp[i] -= lr / bc1 * rm[i] / (sqrt(rv[i]) / sqrt(bc2) + eps);
        }
        free(g);
    }
    check("adamw 3 steps: p vs PyTorch formula in double", rel_err(p, rp, n), ACC_TOL);
    check("adamw 3 steps: m", rel_err(m, rm, n), ACC_TOL);
    check("adamw 3 steps: v", rel_err(v, rv, n), ACC_TOL);
    double *dp = xmalloc(n * 8), *rdp = xmalloc(n * 8);
    for (size_t i = 0; i < n; i++) {
        dp[i] = (double)p[i] - p0[i];
        rdp[i] = rp[i] - p0[i];
    }
    /* limited by rounding p (|p| <= 1) to float each step: ~3 ulp / max|p - p0| ~ 6e-6 */
    check("adamw 3 steps: total update p - p0", rel_err_d(dp, rdp, n), 3e-5);
    size_t differ = 0, bad16 = 0;
    for (size_t i = 0; i < n; i++) {
        differ += memcmp(&p[i], &p2[i], 4) != 0 || memcmp(&m[i], &m2[i], 4) != 0 || memcmp(&v[i], &v2[i], 4) != 0;
        bad16 += p16[i] != dt_f32_to_bf16(p2[i]);
    }
    check_true("adamw with p16: p, m, v bit-identical to without", differ == 0);
    check_true("adamw with p16: p16 = bf16(p) bit for bit", bad16 == 0);
    free(p2);
    free(m2);
    free(v2);
    free(p16);
    free(p);
    free(m);
    free(v);
    free(rp);
    free(rm);
    free(rv);
    free(p0);
    free(dp);
    free(rdp);
}

/* ---- small ops and memory --------------------------------------------------------------------- */

static void test_misc(void)
{
    const size_t n = 100003;
    float *x = frandv(n, -2, 2), *y = frandv(n, -2, 2), *z = fnan(n);
    double ref = 0.0;
    for (size_t i = 0; i < n; i++)
        ref += (double)x[i] * x[i];
    double got;
    const float *xp = x;
    ops->sumsq(ops->ctx, &got, &xp, &n, 1);
    /* float partials over 32 squares each, folded into double */
    check("sumsq vs double", fabs(got - ref) / ref, 1e-7);
    {
        /* several vectors at once: each exactly as when asked alone */
        const float *xs[4] = {x, y, x + 17, x};
        const size_t ns[4] = {n, n - 5, 1000, 0};
        double many[4], one;
        ops->sumsq(ops->ctx, many, xs, ns, 4);
        int same = 1;
        for (int i = 0; i < 4; i++) {
            ops->sumsq(ops->ctx, &one, &xs[i], &ns[i], 1);
            same &= memcmp(&one, &many[i], sizeof one) == 0;
        }
        check_true("sumsq of 4 vectors at once: each the bits of its own call", same);
        check_true("sumsq of 0 elements == 0", many[3] == 0.0);
    }

    ops->add(ops->ctx, z, x, y, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= z[i] == x[i] + y[i];
    ops->add(ops->ctx, x, x, y, n); /* out aliasing a */
    ok &= memcmp(x, z, n * 4) == 0;
    check_true("add (and out aliasing a) exact", ok);

    memcpy(z, y, n * 4);
    ops->scale(ops->ctx, z, 0.3f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++)
        ok &= z[i] == y[i] * 0.3f;
    check_true("scale exact", ok);

    float *a = ops->alloc(ops->ctx, n * 4 + 3);
    ok = a != NULL && ((uintptr_t)a % 64) == 0;
    if (a) {
        ops->from_host(ops->ctx, a, y, n * 4);
        ops->copy(ops->ctx, a, a, 0);
        float *b = ops->alloc(ops->ctx, n * 4);
        ok &= b != NULL;
        if (b) {
            ops->copy(ops->ctx, b, a, n * 4);
            ops->to_host(ops->ctx, z, b, n * 4);
            ok &= memcmp(z, y, n * 4) == 0;
            ops->zero(ops->ctx, b, n * 4);
            for (size_t i = 0; i < n; i++)
                ok &= b[i] == 0.0f;
            ops->free(ops->ctx, b);
        }
        ops->free(ops->ctx, a);
    }
    check_true("alloc 64-byte aligned, copy/to_host/from_host/zero", ok);
    free(x);
    free(y);
    free(z);
}

/* ---- ops_math.h: the vectorisable exp every softmax/GELU/SiLU uses ------------------------------ */

static int64_t ulp_dist(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if (ia < 0)
        ia = INT32_MIN - ia; /* map to a monotone integer line */
    if (ib < 0)
        ib = INT32_MIN - ib;
    int64_t d = (int64_t)ia - ib;
    return d < 0 ? -d : d;
}

static void test_expf(void)
{
    /* 2M points spread over [-110, 90] plus the edges; the whole float range
     * there was checked exhaustively once (max 1 ulp). */
    int64_t worst = 0;
    for (int i = 0; i <= 2000000; i++) {
        float x = -110.0f + 200.0f * (float)i / 2000000.0f;
        int64_t u = ulp_dist(dt_expf(x), (float)exp((double)x));
        worst = u > worst ? u : worst;
    }
    printf("%-52s max ulp %lld  tol 1  %s\n", "dt_expf vs exp (double) on [-110, 90]", (long long)worst,
           worst <= 1 ? "ok" : "FAIL");
    if (worst > 1)
        n_fail++;
    check_true("dt_expf(+inf) = inf, (-inf) = 0, (NaN) = NaN, (88.73) = inf",
               isinf(dt_expf(INFINITY)) && dt_expf(-INFINITY) == 0.0f && isnan(dt_expf(NAN)) &&
                   isinf(dt_expf(88.73f)) && dt_expf(-104.5f) == 0.0f);
}

/* ---- determinism across thread counts ---------------------------------------------------------- */

/* The reductions must give the same bits for 1..4 threads. */
static void test_determinism(void)
{
#ifdef _OPENMP
    const int N = 300, C = 100, V = 50, T = 30, OC = 100;
    size_t nx = (size_t)N * C;
    float *x = frandv(nx, -2, 2), *w = frandv(C, 0.5f, 1.5f), *dout = frandv(nx, -1, 1);
    float *mean = xmalloc(N * 4), *rstd = xmalloc(N * 4), *rrstd = xmalloc(N * 4);
    int32_t *tok = xmalloc(N * sizeof(int32_t));
    for (int n = 0; n < N; n++)
        tok[n] = (int32_t)((n * 7 + n / 13) % V);
    ops->layernorm_fwd(ops->ctx, x, NULL, mean, rstd, x, w, w, N, C, 1e-5f); /* reuse x as a normalised input */
    ops->rmsnorm_fwd(ops->ctx, dout, NULL, rrstd, dout, w, N, C, 1e-5f);
    size_t nres = (size_t)2 * C + C + OC + (size_t)V * C + (size_t)T * C + 2;
    float *res[4];
    double ss[4];
    int saved = get_threads();
    for (int k = 0; k < 4; k++) {
        set_threads(k + 1);
        float *r = res[k] = xmalloc(nres * 4);
        float *din = xmalloc(nx * 4);
        memset(din, 0, nx * 4);
        ops->layernorm_bwd(ops->ctx, din, NULL, r, r + C, dout, x, w, mean, rstd, N, C, 0);
        ops->rmsnorm_bwd(ops->ctx, din, NULL, r + 2 * C, dout, x, w, rrstd, N, C, 0);
        ops->matmul_bwd(ops->ctx, NULL, NULL, r + 3 * C, dout, x, w, N, C, OC, 0, 0);
        ops->embedding_bwd(ops->ctx, r + 3 * C + OC, r + 3 * C + OC + (size_t)V * C, dout, tok, NULL, N, T, C, 0, V, 0);
        const float *dp = dout;
        ops->sumsq(ops->ctx, &ss[k], &dp, &nx, 1);
        float l[2];
        memcpy(l, &ss[k], sizeof l);
        memcpy(r + nres - 2, l, sizeof l);
        free(din);
    }
    set_threads(saved);
    int same = 1;
    for (int k = 1; k < 4; k++)
        same &= memcmp(res[0], res[k], nres * 4) == 0 && ss[0] == ss[k];
    check_true("bias/norm/embedding grads, sumsq: same bits 1-4 threads", same);
    for (int k = 0; k < 4; k++)
        free(res[k]);
    free(x);
    free(w);
    free(dout);
    free(mean);
    free(rstd);
    free(rrstd);
    free(tok);
#endif
}

/* --doc-mask: RoPE, attention (with and without RoPE, GQA) and positions
 * over rows packed with several documents, against the references masked
 * by document; with one document per row, pos = n % T gives the unmasked
 * ops' bits. The long rows put documents across the CPU's 64-row query
 * blocks, blocks wholly inside one document (keys skipped) and a
 * document of one token. */
static void test_doc_mask(void)
{
    static const int32_t pos_short[14] = {0, 1, 2, 0, 1, 2, 3, /* row 2: */ 0, 0, 1, 2, 3, 4, 0};
    test_rope(pos_short);
    test_attention(2, 7, 4, 2, 8, 0, 0, pos_short);
    test_attention(2, 7, 4, 2, 8, 1, 0, pos_short);
    const int T = 150, starts[] = {0, 40, 41, 100, 140}; /* documents of 40, 1, 59, 40, 10 tokens */
    int32_t pos_long[150], pos_one[2 * 7];
    for (int t = 0, d = 0; t < T; t++) {
        if (d + 1 < 5 && t == starts[d + 1])
            d++;
        pos_long[t] = t - starts[d];
    }
    test_attention(1, T, 2, 1, 4, 0, 1, pos_long);
    /* one document per row: the same bits as without positions */
    for (int n = 0; n < 14; n++)
        pos_one[n] = n % 7;
    const int B = 2, t7 = 7, NH = 4, NKV = 2, HS = 8, R = (NH + 2 * NKV) * HS;
    size_t nqkv = (size_t)B * t7 * R, nout = (size_t)B * t7 * NH * HS, nlse = (size_t)B * NH * t7;
    float *qkv = frandv(nqkv, -1.5f, 1.5f), *dout = frandv(nout, -1, 1);
    float *x1 = fdup(qkv, nqkv), *x2 = fdup(qkv, nqkv);
    float *o1 = fnan(nout), *o2 = fnan(nout), *l1 = fnan(nlse), *l2 = fnan(nlse), *d1 = fnan(nqkv), *d2 = fnan(nqkv);
    ops->rope_fwd(ops->ctx, x1, NULL, B, t7, NH, NKV, HS, rope_table(HS));
    ops->rope_fwd(ops->ctx, x2, pos_one, B, t7, NH, NKV, HS, rope_table(HS));
    ops->attention_fwd(ops->ctx, o1, NULL, l1, x1, NULL, B, t7, NH, NKV, HS);
    ops->attention_fwd(ops->ctx, o2, NULL, l2, x2, pos_one, B, t7, NH, NKV, HS);
    ops->attention_bwd(ops->ctx, d1, NULL, dout, x1, o1, l1, NULL, B, t7, NH, NKV, HS);
    ops->attention_bwd(ops->ctx, d2, NULL, dout, x2, o2, l2, pos_one, B, t7, NH, NKV, HS);
    check_true("rope, attention with one document per row: the bits of pos = NULL",
               memcmp(x1, x2, nqkv * 4) == 0 && memcmp(o1, o2, nout * 4) == 0 && memcmp(l1, l2, nlse * 4) == 0 &&
                   memcmp(d1, d2, nqkv * 4) == 0);
    free(qkv);
    free(dout);
    free(x1);
    free(x2);
    free(o1);
    free(o2);
    free(l1);
    free(l2);
    free(d1);
    free(d2);
}

int main(void)
{
    if (!(ops = ops_cpu_create())) {
        printf("out of memory for the CPU backend\n");
        return 1;
    }
    printf("ops backend '%s', %d threads\n", ops->name, get_threads());
    test_matmul();
    test_matmul_medium();
    test_norm(0);
    test_norm(1);
    test_qknorm();
    test_rope(NULL);
    test_attention(2, 7, 4, 4, 8, 0, 0, NULL);  /* MHA */
    test_attention(2, 7, 4, 2, 8, 0, 0, NULL);  /* GQA, 2 query heads per KV head */
    test_attention(2, 7, 4, 1, 8, 0, 0, NULL);  /* MQA */
    test_attention(2, 7, 4, 2, 8, 1, 0, NULL);  /* RoPE then GQA attention */
    test_attention(1, 70, 2, 1, 4, 0, 1, NULL); /* T > row block; fewer tasks than threads */
    test_doc_mask();
    test_gelu();
    test_matmul_gelu(5, 7, 12);
    test_matmul_gelu(33, 24, 40);
    test_swiglu();
    test_embedding();
    const int32_t tgt_small[6] = {4, 0, -1, 12, 7, 4};
    const int32_t tgt_wide[5] = {599, 0, -1, 300, 257}; /* V spans several sum runs */
    test_cross_entropy(6, 13, 16, tgt_small);
    test_cross_entropy(5, 600, 608, tgt_wide);
    test_adamw();
    test_misc();
    test_expf();
    test_determinism();
    if (n_fail)
        printf("%d check(s) FAILED\n", n_fail);
    else
        printf("all checks passed\n");
    ops_release(ops);
    return n_fail ? 1 : 0;
}
