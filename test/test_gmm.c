/* The CPU table's grouped GEMMs (ops gmm_fwd, gmm_bwd and their bf16 forms,
 * src/backend/ops_cpu_gmm.c), the experts' matmuls of a MoE layer:
 *  - against a plain reference written here, per group in double from the
 *    definitions (out = in w_g^T + b_g; din = dout w_g, gelu'(pre) o that
 *    with pre; dw_g = dout^T in and db_g = column sums over the group's
 *    rows), on the same fp32 values (bf16 operands widened): every element
 *    within 8 K 2^-24 sum_k |a_k b_k| (fp32 sums of exact products in any
 *    order, K the summed length) plus 1e-30, and the accumulate forms
 *    within that of old + the sum;
 *  - against the dense ops (matmul_fwd, matmul_bwd, matmul_dgelu_bwd and
 *    their bf16 forms) called group by group at one thread, which is what
 *    the grouped op replaced: within the same bound, and bit for bit where
 *    every group is one tile (at most 64 rows by 256 output columns: the
 *    same single-threaded sgemm call). Larger groups differ in the last
 *    bits: OpenBLAS's sum for an output element depends on where the
 *    element falls in the call's blocking, so a tile's elements and the
 *    whole GEMM's differ by an ulp (measured: 6 % of a 128x256x64 sgemm
 *    cut into 64-row tiles; a 2-thread sgemm likewise differs from a
 *    1-thread one, so the dense ops' bits depend on the thread count and
 *    the grouped op's do not);
 *  - bit for bit at 1 and 2 threads, and through the deferred table
 *    (DTRAIN_DEFER_OPS's) with the host offsets overwritten between the
 *    call and the wait;
 *  - outputs not asked for (NULL) and rows outside the groups untouched.
 * Shapes: G = 1..8 groups with row counts 0, 1, 7, 64, 65, 300 (empty
 * groups first, last and between), odd IC and OC (37, 61, 300, 1),
 * with and without biases, overwrite and accumulate; and two bf16 shapes
 * whose sums the dense bf16 ops split into panels (OC 16400, 16500 rows),
 * each output one tile, so that their panels are checked bit for bit. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/ops_math.h"
#include "src/backend/ops_cpu.h"

static int failures, checks;

static void check(int ok, const char *fmt, const char *what)
{
    checks++;
    if (!ok) {
        printf("FAIL: %s: %s\n", what, fmt);
        failures++;
    }
}

static uint32_t rng = 12345u;
static float urand(void)
{
    rng = rng * 1664525u + 1013904223u;
    return (float)((rng >> 8) & 0xffffff) / 8388608.0f - 1.0f;
}

typedef struct {
    int G, IC, OC, bias, bf16;
    int32_t offs[16];
} shape_t;

/* operands: fp32 values, and for bf16 their bf16 patterns with the fp32
 * arrays holding the widened (exact) values the reference uses */
typedef struct {
    int R;
    float *in, *w, *b, *dout, *pre, *dsum;
    uint16_t *in16, *w16, *dout16;
} data_t;

static void fill(float *f, uint16_t *h, size_t n, int bf16, float scale)
{
    for (size_t i = 0; i < n; i++) {
        float v = scale * urand();
        if (bf16) {
            h[i] = dt_f32_to_bf16(v);
            v = dt_bf16_to_f32(h[i]);
        }
        f[i] = v;
    }
}

static void data_make(data_t *d, const shape_t *s)
{
    const int R = s->offs[s->G], IC = s->IC, OC = s->OC, G = s->G;
    d->R = R;
    /* one row past the groups on each side of in/out-shaped arrays: must stay untouched */
    d->in = malloc(sizeof(float) * ((size_t)R * IC + 1));
    d->w = malloc(sizeof(float) * ((size_t)G * OC * IC + 1));
    d->b = malloc(sizeof(float) * ((size_t)G * OC + 1));
    d->dout = malloc(sizeof(float) * ((size_t)R * OC + 1));
    d->pre = malloc(sizeof(float) * ((size_t)R * IC + 1));
    d->in16 = malloc(2 * ((size_t)R * IC + 1));
    d->w16 = malloc(2 * ((size_t)G * OC * IC + 1));
    d->dout16 = malloc(2 * ((size_t)R * OC + 1));
    fill(d->in, d->in16, (size_t)R * IC, s->bf16, 1.0f);
    fill(d->w, d->w16, (size_t)G * OC * IC, s->bf16, 1.0f);
    fill(d->b, NULL, (size_t)G * OC, 0, 1.0f); /* fp32 always */
    fill(d->dout, d->dout16, (size_t)R * OC, s->bf16, 1.0f);
    /* the fp32 dout the bias gradient sums: under bf16 values apart from
     * dout16's, so that a mix-up of the two shows */
    d->dsum = d->dout;
    if (s->bf16) {
        d->dsum = malloc(sizeof(float) * ((size_t)R * OC + 1));
        fill(d->dsum, NULL, (size_t)R * OC, 0, 1.0f);
    }
    for (size_t i = 0; i < (size_t)R * IC; i++)
        d->pre[i] = 3.0f * urand();
}

static void data_free(data_t *d)
{
    free(d->in), free(d->w), free(d->b), free(d->dout), free(d->pre);
    free(d->in16), free(d->w16), free(d->dout16);
    if (d->dsum != d->dout)
        free(d->dsum);
}

/* ---- the reference ---- */

/* |x - ref| within 8 K 2^-24 mag + 1e-30 (mag = sum |a b|, or for an
 * accumulated output |old| + that) */
static int close_to(float x, double ref, double mag, int K)
{
    return isfinite(x) && fabs((double)x - ref) <= 8.0 * (K + 1) * ldexp(mag, -24) + 1e-30;
}

/* out[R,OC] of shape s against the reference, accum: what out held before
 * (NULL: written) */
static int ref_fwd(const shape_t *s, const data_t *d, const float *out)
{
    int bad = 0;
    for (int g = 0; g < s->G; g++)
        for (int r = s->offs[g]; r < s->offs[g + 1]; r++)
            for (int o = 0; o < s->OC; o++) {
                const float *w = d->w + ((size_t)g * s->OC + o) * s->IC;
                double acc = s->bias ? d->b[(size_t)g * s->OC + o] : 0.0, mag = fabs(acc);
                for (int k = 0; k < s->IC; k++) {
                    acc += (double)d->in[(size_t)r * s->IC + k] * w[k];
                    mag += fabs((double)d->in[(size_t)r * s->IC + k] * w[k]);
                }
                bad += !close_to(out[(size_t)r * s->OC + o], acc, mag, s->IC);
            }
    return bad;
}

/* din (with pre: gelu'(pre) o dout w), dw, db against the reference;
 * old_*: the outputs before an accumulating call, NULL when written */
static int ref_bwd(const shape_t *s, const data_t *d, const float *din, const float *old_din, const float *dw,
                   const float *old_dw, const float *db, const float *old_db, int use_pre)
{
    const int IC = s->IC, OC = s->OC;
    int bad = 0;
    for (int g = 0; g < s->G; g++) {
        const int r0 = s->offs[g], r1 = s->offs[g + 1];
        const float *w = d->w + (size_t)g * OC * IC;
        for (int r = r0; r < r1 && din; r++)
            for (int i = 0; i < IC; i++) {
                double acc = old_din ? old_din[(size_t)r * IC + i] : 0.0, mag = fabs(acc);
                for (int o = 0; o < OC; o++) {
                    const double p = (double)d->dout[(size_t)r * OC + o] * w[(size_t)o * IC + i];
                    acc += p;
                    mag += fabs(p);
                }
                if (use_pre) {
                    const double gp = dt_gelu_grad(d->pre[(size_t)r * IC + i]);
                    acc *= gp;
                    mag *= fabs(gp);
                }
                bad += !close_to(din[(size_t)r * IC + i], acc, mag, OC + 1);
            }
        for (int o = 0; o < OC && dw; o++)
            for (int i = 0; i < IC; i++) {
                const size_t at = ((size_t)g * OC + o) * IC + i;
                double acc = old_dw ? old_dw[at] : 0.0, mag = fabs(acc);
                for (int r = r0; r < r1; r++) {
                    const double p = (double)d->dout[(size_t)r * OC + o] * d->in[(size_t)r * IC + i];
                    acc += p;
                    mag += fabs(p);
                }
                bad += !close_to(dw[at], acc, mag, r1 - r0);
            }
        for (int o = 0; o < OC && db; o++) {
            const size_t at = (size_t)g * OC + o;
            double acc = old_db ? old_db[at] : 0.0, mag = fabs(acc);
            for (int r = r0; r < r1; r++) {
                acc += d->dsum[(size_t)r * OC + o];
                mag += fabs(d->dsum[(size_t)r * OC + o]);
            }
            bad += !close_to(db[at], acc, mag, r1 - r0);
        }
    }
    return bad;
}

/* ---- helpers ---- */

static float *poison(size_t n, int accum)
{
    float *p = malloc(sizeof(float) * (n + 1));
    for (size_t i = 0; i <= n; i++)
        p[i] = accum && i < n ? urand() : NAN;
    return p;
}
static float *dup(const float *p, size_t n)
{
    float *q = malloc(sizeof(float) * (n + 1));
    memcpy(q, p, sizeof(float) * (n + 1));
    return q;
}
static int same(const float *a, const float *b, size_t n) { return memcmp(a, b, sizeof(float) * (n + 1)) == 0; }
/* the element past n (a guard) still NaN */
static int guard_ok(const float *p, size_t n) { return isnan(p[n]); }
static int max_rows_one_tile(const shape_t *s, int cols)
{
    int ok = cols <= 256;
    for (int g = 0; g < s->G; g++)
        ok &= s->offs[g + 1] - s->offs[g] <= 64;
    return ok;
}

/* ---- the ops ---- */

static void gmm_fwd(const ops_t *o, const shape_t *s, const data_t *d, float *out)
{
    const float *b = s->bias ? d->b : NULL;
    if (s->bf16)
        o->gmm_fwd_bf16(o->ctx, out, d->in16, d->w16, b, s->offs, s->G, s->IC, s->OC);
    else
        o->gmm_fwd(o->ctx, out, d->in, d->w, b, s->offs, s->G, s->IC, s->OC);
}

static void dense_fwd(const ops_t *o, const shape_t *s, const data_t *d, float *out)
{
    for (int g = 0; g < s->G; g++) {
        const int r0 = s->offs[g], n = s->offs[g + 1] - r0;
        const size_t wo = (size_t)g * s->OC * s->IC;
        const float *b = s->bias ? d->b + (size_t)g * s->OC : NULL;
        if (s->bf16)
            o->matmul_fwd_bf16(o->ctx, out + (size_t)r0 * s->OC, d->in16 + (size_t)r0 * s->IC, d->w16 + wo, b, n, s->IC,
                               s->OC);
        else
            o->matmul_fwd(o->ctx, out + (size_t)r0 * s->OC, d->in + (size_t)r0 * s->IC, d->w + wo, b, n, s->IC, s->OC);
    }
}

static void gmm_bwd(const ops_t *o, const shape_t *s, const data_t *d, float *din, float *dw, float *db, int pre,
                    int ad, int aw, const int32_t *offs)
{
    const float *p = pre ? d->pre : NULL;
    if (s->bf16)
        o->gmm_bwd_bf16(o->ctx, din, dw, db, d->dout16, d->dsum, d->in16, p, d->w16, offs, s->G, s->IC, s->OC, ad, aw);
    else
        o->gmm_bwd(o->ctx, din, dw, db, d->dout, d->in, p, d->w, offs, s->G, s->IC, s->OC, ad, aw);
}

static void dense_bwd(const ops_t *o, const shape_t *s, const data_t *d, float *din, float *dw, float *db, int pre,
                      int ad, int aw)
{
    const int IC = s->IC, OC = s->OC;
    for (int g = 0; g < s->G; g++) {
        const int r0 = s->offs[g], n = s->offs[g + 1] - r0;
        const size_t wo = (size_t)g * OC * IC;
        float *x = din ? din + (size_t)r0 * IC : NULL, *ww = dw ? dw + wo : NULL, *bb = db ? db + (size_t)g * OC : NULL;
        const float *pp = d->pre + (size_t)r0 * IC;
        if (s->bf16 && pre)
            o->matmul_dgelu_bwd_bf16(o->ctx, x, NULL, ww, bb, d->dout16 + (size_t)r0 * OC, d->dsum + (size_t)r0 * OC,
                                     d->in16 + (size_t)r0 * IC, pp, d->w16 + wo, n, IC, OC, aw);
        else if (s->bf16)
            o->matmul_bwd_bf16(o->ctx, x, ww, bb, d->dout16 + (size_t)r0 * OC, d->dsum + (size_t)r0 * OC,
                               d->in16 + (size_t)r0 * IC, d->w16 + wo, n, IC, OC, ad, aw);
        else if (pre)
            o->matmul_dgelu_bwd(o->ctx, x, ww, bb, d->dout + (size_t)r0 * OC, d->in + (size_t)r0 * IC, pp, d->w + wo, n,
                                IC, OC, aw);
        else
            o->matmul_bwd(o->ctx, x, ww, bb, d->dout + (size_t)r0 * OC, d->in + (size_t)r0 * IC, d->w + wo, n, IC, OC,
                          ad, aw);
    }
}

/* differences of a and b beyond the reference bound (counted in ref_*
 * already for a): elements where they differ at all, for the report */
static size_t n_diff(const float *a, const float *b, size_t n)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        k += memcmp(a + i, b + i, sizeof(float)) != 0;
    return k;
}

static const ops_t *cpu, *defer;

static void case_fwd(const shape_t *s, const char *name)
{
    data_t d;
    data_make(&d, s);
    const size_t n = (size_t)d.R * s->OC;
    float *out = poison(n, 0), *out1 = poison(n, 0), *ref = poison(n, 0), *outd = poison(n, 0);
    ops_cpu_threads(2);
    gmm_fwd(cpu, s, &d, out);
    ops_cpu_threads(1);
    dense_fwd(cpu, s, &d, ref);
    gmm_fwd(cpu, s, &d, out1);
    ops_cpu_threads(2);
    shape_t sd = *s;
    gmm_fwd(defer, &sd, &d, outd);
    for (int g = 0; g <= sd.G; g++) /* the caller's offsets change before the op runs */
        sd.offs[g] = 0;
    defer->sync(defer->ctx);
    char what[300];
    snprintf(what, sizeof what, "%s fwd", name);
    check(ref_fwd(s, &d, out) == 0, "against the double reference", what);
    check(guard_ok(out, n), "a row past the groups written", what);
    check(ref_fwd(s, &d, ref) == 0, "the dense ops against the double reference", what);
    check(same(out, out1, n), "1 and 2 threads differ", what);
    check(same(out, outd, n), "the deferred table differs", what);
    if (max_rows_one_tile(s, s->OC))
        check(same(out, ref, n), "not the dense ops' bits though every group is one tile", what);
    printf("%-60s %zu of %zu elements differ from the dense ops' bits\n", what, n_diff(out, ref, n), n);
    free(out), free(out1), free(ref), free(outd);
    data_free(&d);
}

/* mask: 1 din, 2 dw, 4 db */
static void case_bwd(const shape_t *s, const char *name, int mask, int pre, int ad, int aw)
{
    data_t d;
    data_make(&d, s);
    const int R = d.R;
    const size_t nx = (size_t)R * s->IC, nw = (size_t)s->G * s->OC * s->IC, nb = (size_t)s->G * s->OC;
    float *x0 = poison(nx, ad), *w0 = poison(nw, aw), *b0 = poison(nb, aw);
    float *x = dup(x0, nx), *w = dup(w0, nw), *b = dup(b0, nb);
    float *x1 = dup(x0, nx), *w1 = dup(w0, nw), *b1 = dup(b0, nb);
    float *xr = dup(x0, nx), *wr = dup(w0, nw), *br = dup(b0, nb);
    float *xd = dup(x0, nx), *wd = dup(w0, nw), *bd = dup(b0, nb);
#define M(p, bit) ((mask & (bit)) ? (p) : NULL)
    ops_cpu_threads(2);
    gmm_bwd(cpu, s, &d, M(x, 1), M(w, 2), M(b, 4), pre, ad, aw, s->offs);
    ops_cpu_threads(1);
    dense_bwd(cpu, s, &d, M(xr, 1), M(wr, 2), M(br, 4), pre, ad, aw);
    gmm_bwd(cpu, s, &d, M(x1, 1), M(w1, 2), M(b1, 4), pre, ad, aw, s->offs);
    ops_cpu_threads(2);
    int32_t offs[16];
    memcpy(offs, s->offs, sizeof offs);
    gmm_bwd(defer, s, &d, M(xd, 1), M(wd, 2), M(bd, 4), pre, ad, aw, offs);
    memset(offs, 0, sizeof offs);
    defer->sync(defer->ctx);
    char what[300];
    snprintf(what, sizeof what, "%s bwd din=%d dw=%d db=%d pre=%d acc_din=%d acc_dw=%d", name, mask & 1,
             (mask >> 1) & 1, (mask >> 2) & 1, pre, ad, aw);
    check(ref_bwd(s, &d, M(x, 1), ad ? x0 : NULL, M(w, 2), aw ? w0 : NULL, M(b, 4), aw ? b0 : NULL, pre) == 0,
          "against the double reference", what);
    check(ref_bwd(s, &d, M(xr, 1), ad ? x0 : NULL, M(wr, 2), aw ? w0 : NULL, M(br, 4), aw ? b0 : NULL, pre) == 0,
          "the dense ops against the double reference", what);
    check(guard_ok(x, nx) && guard_ok(w, nw) && guard_ok(b, nb), "past an output's end written", what);
    check((mask & 1) || same(x, x0, nx), "din written though NULL", what);
    check((mask & 2) || same(w, w0, nw), "dw written though NULL", what);
    check((mask & 4) || same(b, b0, nb), "db written though NULL", what);
    check(same(x, x1, nx) && same(w, w1, nw) && same(b, b1, nb), "1 and 2 threads differ", what);
    check(same(x, xd, nx) && same(w, wd, nw) && same(b, bd, nb), "the deferred table differs", what);
    check(same(b, br, nb), "db not the dense ops' bits", what);
    if (max_rows_one_tile(s, s->IC))
        check(same(x, xr, nx), "din not the dense ops' bits though every group is one tile", what);
    if (s->OC <= 64 && s->IC <= 256)
        check(same(w, wr, nw), "dw not the dense ops' bits though every group is one tile", what);
    printf("%-60s %zu + %zu of %zu + %zu elements (din + dw) differ from the dense ops' bits\n", what,
           n_diff(x, xr, nx), n_diff(w, wr, nw), nx, nw);
#undef M
    free(x0), free(w0), free(b0), free(x), free(w), free(b), free(x1), free(w1), free(b1);
    free(xr), free(wr), free(br), free(xd), free(wd), free(bd);
    data_free(&d);
}

static void shape_set(shape_t *s, int IC, int OC, int bias, int bf16, const int *rows, int G)
{
    s->G = G;
    s->IC = IC;
    s->OC = OC;
    s->bias = bias;
    s->bf16 = bf16;
    s->offs[0] = 0;
    for (int g = 0; g < G; g++)
        s->offs[g + 1] = s->offs[g] + rows[g];
}

int main(void)
{
    cpu = ops_cpu_create();
    defer = ops_defer_create(ops_cpu_create());
    if (!cpu || !defer) {
        printf("FAIL: backends\n");
        return 1;
    }
    /* row counts of the groups: empty ones first, last and between, one
     * row, fewer than a tile, exactly a tile, one over, several tiles */
    static const int rows[][8] = {{7},
                                  {0, 65},
                                  {1, 0, 300},
                                  {64, 7, 0, 1},
                                  {0, 7, 65, 1, 300},
                                  {3, 0, 0, 64, 9, 0},
                                  {65, 1, 2, 3, 0, 129, 7},
                                  {0, 300, 1, 7, 0, 64, 65, 0}};
    static const int dims[][2] = {{37, 61}, {61, 300}, {300, 37}, {1, 5}, {16, 1}};
    char name[200];
    for (int bf = 0; bf < 2; bf++)
        for (int gi = 0; gi < 8; gi++)
            for (int di = 0; di < 5; di++) {
                shape_t s;
                shape_set(&s, dims[di][0], dims[di][1], (gi + di) % 2, bf, rows[gi], gi + 1);
                snprintf(name, sizeof name, "%s G=%d IC=%d OC=%d rows=%d bias=%d", bf ? "bf16" : "fp32", s.G, s.IC,
                         s.OC, s.offs[s.G], s.bias);
                case_fwd(&s, name);
                case_bwd(&s, name, 7, 0, 0, 0);
                case_bwd(&s, name, 7, 1, 0, 1);
                if (di == 0) { /* the NULL and accumulate forms on one shape */
                    case_bwd(&s, name, 7, 0, 1, 1);
                    case_bwd(&s, name, 1, 0, 0, 0);
                    case_bwd(&s, name, 2, 0, 0, 1);
                    case_bwd(&s, name, 6, 1, 0, 0);
                    case_bwd(&s, name, 4, 0, 0, 1);
                }
            }
    /* bf16 sums split into the dense ops' panels (4M floats of widened
     * operands): din's over OC (64 rows of 256 columns, OC 16400 > 4M /
     * 256) and dw's over the rows (16500 > 4M / 256), in one tile each, so
     * the dense ops' bits, panel for panel */
    static const int big_rows[][1] = {{64}, {16500}};
    static const int big_dims[][2] = {{256, 16400}, {256, 64}};
    for (int i = 0; i < 2; i++) {
        shape_t s;
        shape_set(&s, big_dims[i][0], big_dims[i][1], 1, 1, big_rows[i], 1);
        snprintf(name, sizeof name, "bf16 panels G=1 IC=%d OC=%d rows=%d", s.IC, s.OC, s.offs[1]);
        case_fwd(&s, name);
        case_bwd(&s, name, 7, 0, 0, 0);
    }
    ops_release(defer);
    ops_release(cpu);
    printf("test_gmm: %d checks, %d failed\n", checks, failures);
    return failures ? 1 : 0;
}
