#include "mpi/clock.h"
#include "src/model/flops.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* An MLP of width F: fc (gate and up for SwiGLU) and proj. */
static double mlp_params(const model_config_t *c, double F)
{
    return (c->arch == ARCH_LLAMA ? 3.0 : 2.0) * c->d_model * F;
}

double flops_layer_params(const model_config_t *c, int l)
{
    const double C = c->d_model, HS = model_head_size(c), QD = c->n_head * HS, KVD = c->n_kv_head * HS;
    const double attn = C * (QD + 2.0 * KVD) + QD * C;
    if (!model_layer_moe(c, l))
        return attn + mlp_params(c, c->d_ff);
    const moe_config_t *e = &c->moe;
    return attn + C * e->experts + e->top_k * mlp_params(c, e->ffn) + mlp_params(c, e->shared_ffn);
}

double flops_per_token(const model_config_t *c, double T)
{
    const double HS = model_head_size(c), L = c->n_layer, QD = c->n_head * HS;
    double n_matmul = (double)c->vocab_size * c->d_model;
    for (int l = 0; l < c->n_layer; l++)
        n_matmul += flops_layer_params(c, l);
    return 6.0 * n_matmul + 12.0 * L * QD * T;
}

/* One probe size: N x N x N, in . w^T as the ops table's forward matmuls
 * call it. */
static double time_one(int n, const float *a, const float *b, float *c)
{
    double t0 = now_s();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
    return now_s() - t0;
}

int flops_probe(flops_probe_t *p, double budget_s)
{
    static const int sizes[] = {512, 1024, 1536};
    const int n_sizes = (int)(sizeof sizes / sizeof sizes[0]), nmax = sizes[n_sizes - 1];
    memset(p, 0, sizeof *p);
    p->threads = 1;
#ifdef _OPENMP
    p->threads = omp_get_max_threads();
#endif
    double t_start = now_s();
    size_t nn = (size_t)nmax * nmax;
    float *a = malloc(nn * sizeof *a), *b = malloc(nn * sizeof *b), *c = malloc(nn * sizeof *c);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return -1;
    }
    for (size_t i = 0; i < nn; i++) {
        a[i] = (float)(i % 7) * 0.1f;
        b[i] = (float)(i % 5) * 0.1f;
        c[i] = 0.0f;
    }
    /* warm-up, untimed: wakes the BLAS threads, faults the pages in and
     * lets the cores reach their clock before anything is timed */
    double warm_s = 0.25 * budget_s;
    while (now_s() - t_start < warm_s)
        time_one(1024, a, b, c);
    /* each size for its share of what is left, 2 calls at least while
     * the budget lasts; the best single call of any size is the peak */
    for (int k = 0; k < n_sizes; k++) {
        const int n = sizes[k];
        const double gflop = 2.0 * n * n * (double)n * 1e-9;
        double left = budget_s - (now_s() - t_start);
        /* a size one call of which would not fit at the best rate so far
         * (a slow machine) is skipped */
        if (k > 0 && (left <= 0 || gflop / p->gflops > left))
            continue;
        double share = left / (n_sizes - k), t_size = now_s();
        for (int calls = 0;; calls++) {
            double t = now_s();
            if (calls > 0 && (t - t_start >= budget_s || (calls >= 2 && t - t_size >= share)))
                break;
            double gf = gflop / time_one(n, a, b, c);
            p->calls++;
            if (gf > p->gflops) {
                p->gflops = gf;
                p->best_n = n;
            }
        }
        p->sizes[p->n_sizes++] = n;
    }
    free(a);
    free(b);
    free(c);
    p->seconds = now_s() - t_start;
    return p->gflops > 0 ? 0 : -1;
}

double flops_measure_peak_gflops(void)
{
    flops_probe_t p;
    return flops_probe(&p, FLOPS_PROBE_BUDGET_S) == 0 ? p.gflops : 0.0;
}

int flops_probe_describe(const flops_probe_t *p, char *buf, size_t len)
{
    int off = snprintf(buf, len, "sgemm probe: best of");
    for (int k = 0; k < p->n_sizes && off >= 0 && (size_t)off < len; k++)
        off += snprintf(buf + off, len - (size_t)off, "%s %d^3", k ? "," : "", p->sizes[k]);
    if (off >= 0 && (size_t)off < len)
        off +=
            snprintf(buf + off, len - (size_t)off, " (%d calls, best at %d^3) on %d thread%s after a warm-up, %.2f s",
                     p->calls, p->best_n, p->threads, p->threads == 1 ? "" : "s", p->seconds);
    return off;
}
