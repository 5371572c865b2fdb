/* The CPU backend's grouped GEMMs (base/ops.h, gmm_*): the experts of a
 * mixture-of-experts layer, G weights each over its own run of rows, in
 * one call.
 *
 * Debian's OpenBLAS (0.3.21) has no batched or grouped sgemm
 * (cblas_sgemm_batch came in 0.3.27), so the grouping is ours: every
 * group's GEMMs are cut into tiles of at most TILE_R x TILE_C outputs
 * (rows x output columns; for dw, weight rows x weight columns), and one
 * OpenMP parallel region hands the tiles of all groups out to the threads
 * (dynamically, each group's worksharing loop `nowait`, so a thread done
 * with its share of one group goes on to the next). Each tile is one
 * cblas_sgemm, which inside the region runs on the calling thread (the
 * OpenMP build of OpenBLAS): small and uneven groups keep every thread
 * busy, where one multi-threaded sgemm per group parallelises each small
 * GEMM badly and waits at the end of each.
 *
 * Results. Every output element is written by one tile, and its sum runs
 * over the whole reduction dimension in one sgemm, as the dense op's does
 * (OpenBLAS splits a GEMM's outputs between threads and blocks, never an
 * element's sum), so each group's outputs are those of the dense op on
 * its rows (matmul_fwd, matmul_bwd, matmul_dgelu_bwd and their bf16
 * forms), bit for bit, for any thread count: test/test_gmm.c checks it.
 * The bf16 ops widen each tile's operands to fp32 (exact) in per-thread
 * buffers and split the sums into the same panels as the dense bf16 ops
 * (cpu_bf16_panel_rows of the group's rows), added in the same order.
 * The bias gradient sums each column over the group's rows in order, as
 * the dense op's column sums do. No atomics, and no output depends on
 * which thread ran its tile. */
#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "src/backend/ops_cpu_gmm.h"

#include "base/bf16.h"
#include "base/ops_math.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A tile: at most TILE_R rows by TILE_C columns of an output. */
#define TILE_R 64
#define TILE_C 256

static int imin(int a, int b) { return a < b ? a : b; }
static int ceil_div(int a, int b) { return (a + b - 1) / b; }

/* One call's arguments. fp32 operands (in, w, dout) or bf16 ones (in16,
 * w16, dout16; bf16 = 1); the bf16 tiles widen into pa/pb, thread t's at
 * buf + t * (na + nb), or with buf NULL (no memory) sum naively. */
typedef struct gmm {
    const int32_t *offs;
    int G, IC, OC, accum_din, accum_dw, bf16;
    const float *in, *w, *dout, *pre, *b;
    const uint16_t *in16, *w16, *dout16;
    float *out, *din, *dw, *db;
    float *buf;
    size_t na, nb;
} gmm_t;

static int rows_of(const gmm_t *p, int g) { return p->offs[g + 1] - p->offs[g]; }

/* ---- bf16 operands ---- */

/* dst[r1-r0, c1-c0] = fp32 of src[r0:r1, c0:c1] (row stride ld) */
static void widen(float *dst, const uint16_t *src, size_t ld, int r0, int r1, int c0, int c1)
{
    const int nc = c1 - c0;
    for (int r = r0; r < r1; r++) {
        const uint16_t *s = src + (size_t)r * ld + c0;
        float *d = dst + (size_t)(r - r0) * nc;
#pragma omp simd
        for (int c = 0; c < nc; c++)
            d[c] = dt_bf16_to_f32(s[c]);
    }
}

/* Without widening buffers: c[M,N] (=|+= by beta) the naive fp32 sums of
 * A[M,K] . B[K,N], element (i,k) of A at a[i*as0 + k*as1], likewise b
 * (the dense bf16 ops' own fallback, gemm_bf16_naive). */
static void naive16(float *c, int ldc, const uint16_t *a, size_t as0, size_t as1, const uint16_t *b, size_t bs0,
                    size_t bs1, int M, int N, int K, int beta)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++)
                acc += dt_bf16_to_f32(a[i * as0 + k * as1]) * dt_bf16_to_f32(b[k * bs0 + j * bs1]);
            c[(size_t)i * ldc + j] = beta ? c[(size_t)i * ldc + j] + acc : acc;
        }
}

static float *panel_a(const gmm_t *p)
{
#ifdef _OPENMP
    return p->buf + (size_t)omp_get_thread_num() * (p->na + p->nb);
#else
    return p->buf;
#endif
}

/* ---- forward tiles ---- */

/* out[r0:r1, o0:o1] of group g (global rows) */
static void fwd_tile(const gmm_t *p, int g, int r0, int r1, int o0, int o1)
{
    const int IC = p->IC, OC = p->OC, M = r1 - r0, N = o1 - o0;
    float *out = p->out + (size_t)r0 * OC + o0;
    const float *b = p->b ? p->b + (size_t)g * OC + o0 : NULL;
    for (int r = 0; r < M; r++) {
        if (b)
            memcpy(out + (size_t)r * OC, b, (size_t)N * sizeof(float));
        else if (IC <= 0)
            memset(out + (size_t)r * OC, 0, (size_t)N * sizeof(float));
    }
    if (IC <= 0)
        return;
    const float beta = b ? 1.0f : 0.0f;
    const size_t wg = (size_t)g * OC * IC;
    if (!p->bf16) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, IC, 1.0f, p->in + (size_t)r0 * IC, IC,
                    p->w + wg + (size_t)o0 * IC, IC, beta, out, OC);
    } else if (!p->buf) {
        naive16(out, OC, p->in16 + (size_t)r0 * IC, IC, 1, p->w16 + wg + (size_t)o0 * IC, 1, IC, M, N, IC, b != NULL);
    } else {
        float *pa = panel_a(p), *pb = pa + p->na;
        widen(pa, p->in16, IC, r0, r1, 0, IC);
        widen(pb, p->w16 + wg, IC, o0, o1, 0, IC);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, IC, 1.0f, pa, IC, pb, IC, beta, out, OC);
    }
}

/* ---- backward tiles ---- */

/* din[r0:r1, i0:i1] of group g: dout . w_g, then gelu' of pre */
static void din_tile(const gmm_t *p, int g, int r0, int r1, int i0, int i1)
{
    const int IC = p->IC, OC = p->OC, M = r1 - r0, N = i1 - i0;
    float *din = p->din + (size_t)r0 * IC + i0;
    const size_t wg = (size_t)g * OC * IC;
    if (OC <= 0) { /* an empty sum, as matmul_bwd */
        for (int r = 0; r < M && !p->accum_din; r++)
            memset(din + (size_t)r * IC, 0, (size_t)N * sizeof(float));
    } else if (!p->bf16) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, OC, 1.0f, p->dout + (size_t)r0 * OC, OC,
                    p->w + wg + i0, IC, p->accum_din ? 1.0f : 0.0f, din, IC);
    } else if (!p->buf) {
        naive16(din, IC, p->dout16 + (size_t)r0 * OC, OC, 1, p->w16 + wg + i0, IC, 1, M, N, OC, p->accum_din);
    } else {
        /* the dense op's panels over the summed OC, of the group's rows */
        const int rows = rows_of(p, g), kd = imin(cpu_bf16_panel_rows(rows, OC), cpu_bf16_panel_rows(IC, OC));
        float *pa = panel_a(p), *pb = pa + p->na;
        for (int k0 = 0; k0 < OC; k0 += kd) {
            const int k1 = imin(OC, k0 + kd);
            widen(pa, p->dout16, OC, r0, r1, k0, k1);
            widen(pb, p->w16 + wg, IC, k0, k1, i0, i1);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, k1 - k0, 1.0f, pa, k1 - k0, pb, N,
                        (p->accum_din || k0 > 0) ? 1.0f : 0.0f, din, IC);
        }
    }
    if (p->pre) /* the dense gelu_bwd's map, in place */
        for (int r = 0; r < M; r++) {
            float *d = din + (size_t)r * IC;
            const float *x = p->pre + (size_t)(r0 + r) * IC + i0;
#pragma omp simd
            for (int c = 0; c < N; c++)
                d[c] = d[c] * dt_gelu_grad(x[c]);
        }
}

/* dw_g[o0:o1, i0:i1]: dout^T . in over the group's rows */
static void dw_tile(const gmm_t *p, int g, int o0, int o1, int i0, int i1)
{
    const int IC = p->IC, OC = p->OC, M = o1 - o0, N = i1 - i0, R0 = p->offs[g], rows = rows_of(p, g);
    float *dw = p->dw + (size_t)g * OC * IC + (size_t)o0 * IC + i0;
    if (rows <= 0) {
        for (int r = 0; r < M && !p->accum_dw; r++)
            memset(dw + (size_t)r * IC, 0, (size_t)N * sizeof(float));
    } else if (!p->bf16) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, rows, 1.0f, p->dout + (size_t)R0 * OC + o0, OC,
                    p->in + (size_t)R0 * IC + i0, IC, p->accum_dw ? 1.0f : 0.0f, dw, IC);
    } else if (!p->buf) {
        naive16(dw, IC, p->dout16 + (size_t)R0 * OC + o0, 1, OC, p->in16 + (size_t)R0 * IC + i0, IC, 1, M, N, rows,
                p->accum_dw);
    } else {
        /* the dense op's panels over the summed rows */
        const int kw = imin(cpu_bf16_panel_rows(OC, rows), cpu_bf16_panel_rows(IC, rows));
        float *pa = panel_a(p), *pb = pa + p->na;
        for (int k0 = 0; k0 < rows; k0 += kw) {
            const int k1 = imin(rows, k0 + kw);
            widen(pa, p->dout16, OC, R0 + k0, R0 + k1, o0, o1);
            widen(pb, p->in16, IC, R0 + k0, R0 + k1, i0, i1);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, k1 - k0, 1.0f, pa, M, pb, N,
                        (p->accum_dw || k0 > 0) ? 1.0f : 0.0f, dw, IC);
        }
    }
}

/* db_g[c0:c1] (=|+= by accum_dw): the fp32 dout's column sums over the
 * group's rows, in order (the dense op's colsum) */
static void db_tile(const gmm_t *p, int g, int c0, int c1)
{
    const int OC = p->OC, nc = c1 - c0, R0 = p->offs[g], rows = rows_of(p, g);
    float *db = p->db + (size_t)g * OC + c0;
    for (int cb = 0; cb < nc; cb += 16) {
        const int n16 = imin(16, nc - cb);
        float acc[16] = {0};
        for (int n = 0; n < rows; n++) {
            const float *row = p->dout + (size_t)(R0 + n) * OC + c0 + cb;
#pragma omp simd
            for (int c = 0; c < n16; c++)
                acc[c] += row[c];
        }
        for (int c = 0; c < n16; c++)
            db[cb + c] = p->accum_dw ? db[cb + c] + acc[c] : acc[c];
    }
}

/* ---- the tiles of a group, and the parallel region ---- */

/* fwd: row blocks x column blocks of OC. bwd: din (row blocks x column
 * blocks of IC), then dw (blocks of OC rows x column blocks of IC), then
 * db (column blocks of OC). */
static int n_din(const gmm_t *p, int g)
{
    return p->din && p->IC > 0 ? ceil_div(rows_of(p, g), TILE_R) * ceil_div(p->IC, TILE_C) : 0;
}
static int n_dw(const gmm_t *p)
{
    return p->dw && p->IC > 0 && p->OC > 0 ? ceil_div(p->OC, TILE_R) * ceil_div(p->IC, TILE_C) : 0;
}
static int n_db(const gmm_t *p) { return p->db && p->OC > 0 ? ceil_div(p->OC, TILE_C) : 0; }

static int tiles_of(const gmm_t *p, int g, int fwd)
{
    if (fwd)
        return p->OC > 0 ? ceil_div(rows_of(p, g), TILE_R) * ceil_div(p->OC, TILE_C) : 0;
    return n_din(p, g) + n_dw(p) + n_db(p);
}

static void run_tile(const gmm_t *p, int g, int t, int fwd)
{
    const int R0 = p->offs[g], rows = rows_of(p, g);
    if (fwd) {
        const int nc = ceil_div(p->OC, TILE_C), rb = t / nc, cb = t % nc;
        fwd_tile(p, g, R0 + rb * TILE_R, R0 + imin(rows, (rb + 1) * TILE_R), cb * TILE_C,
                 imin(p->OC, (cb + 1) * TILE_C));
        return;
    }
    const int nx = n_din(p, g), nw = n_dw(p), nic = ceil_div(p->IC, TILE_C);
    if (t < nx) {
        const int rb = t / nic, cb = t % nic;
        din_tile(p, g, R0 + rb * TILE_R, R0 + imin(rows, (rb + 1) * TILE_R), cb * TILE_C,
                 imin(p->IC, (cb + 1) * TILE_C));
    } else if (t < nx + nw) {
        const int u = t - nx, ob = u / nic, cb = u % nic;
        dw_tile(p, g, ob * TILE_R, imin(p->OC, (ob + 1) * TILE_R), cb * TILE_C, imin(p->IC, (cb + 1) * TILE_C));
    } else {
        const int cb = t - nx - nw;
        db_tile(p, g, cb * TILE_C, imin(p->OC, (cb + 1) * TILE_C));
    }
}

/* Every tile of every group: one parallel region, each group's tiles a
 * dynamic worksharing loop without the barrier at its end. */
static void run(const gmm_t *p, int fwd)
{
#pragma omp parallel
    for (int g = 0; g < p->G; g++) {
        const int n = tiles_of(p, g, fwd);
#pragma omp for schedule(dynamic, 1) nowait
        for (int t = 0; t < n; t++)
            run_tile(p, g, t, fwd);
    }
}

/* ---- bf16 buffers ---- */

static int threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* The widening buffers' sizes per thread (floats) for the tiles of p
 * (fwd or bwd), then p->buf from ws, grown as needed; NULL (the naive
 * sums) when memory is short. */
static void bf16_buffers(gmm_t *p, cpu_gmm_ws_t *ws, int fwd)
{
    const int IC = p->IC, OC = p->OC;
    size_t na = 0, nb = 0;
#define AT_LEAST(x, v) x = (x) > (size_t)(v) ? (x) : (size_t)(v)
    for (int g = 0; g < p->G; g++) {
        const int rows = rows_of(p, g), tr = imin(TILE_R, rows);
        if (rows <= 0)
            continue;
        if (fwd) {
            AT_LEAST(na, (size_t)tr * IC);
            AT_LEAST(nb, (size_t)imin(TILE_C, OC) * IC);
            continue;
        }
        const int kd = imin(cpu_bf16_panel_rows(rows, OC), cpu_bf16_panel_rows(IC, OC));
        const int kw = imin(cpu_bf16_panel_rows(OC, rows), cpu_bf16_panel_rows(IC, rows));
        if (p->din) {
            AT_LEAST(na, (size_t)tr * kd);
            AT_LEAST(nb, (size_t)kd * imin(TILE_C, IC));
        }
        if (p->dw) {
            AT_LEAST(na, (size_t)kw * imin(TILE_R, OC));
            AT_LEAST(nb, (size_t)kw * imin(TILE_C, IC));
        }
    }
#undef AT_LEAST
    p->na = na;
    p->nb = nb;
    const size_t need = (na + nb) * (size_t)threads();
    if (need > ws->floats) {
        free(ws->buf);
        ws->buf = malloc(need * sizeof(float));
        ws->floats = ws->buf ? need : 0;
    }
    p->buf = ws->buf;
}

void cpu_gmm_ws_free(cpu_gmm_ws_t *ws)
{
    free(ws->buf);
    ws->buf = NULL;
    ws->floats = 0;
}

/* ---- the ops ---- */

void cpu_gmm_fwd(float *out, const float *in, const float *w, const float *b, const int32_t *offs, int G, int IC,
                 int OC)
{
    const gmm_t p = {.offs = offs, .G = G, .IC = IC, .OC = OC, .in = in, .w = w, .b = b, .out = out};
    run(&p, 1);
}

void cpu_gmm_bwd(float *din, float *dw, float *db, const float *dout, const float *in, const float *pre, const float *w,
                 const int32_t *offs, int G, int IC, int OC, int accum_din, int accum_dw)
{
    const gmm_t p = {.offs = offs,
                     .G = G,
                     .IC = IC,
                     .OC = OC,
                     .accum_din = accum_din,
                     .accum_dw = accum_dw,
                     .in = in,
                     .w = w,
                     .dout = dout,
                     .pre = pre,
                     .din = din,
                     .dw = dw,
                     .db = db};
    run(&p, 0);
}

void cpu_gmm_fwd_bf16(cpu_gmm_ws_t *ws, float *out, const uint16_t *in, const uint16_t *w, const float *b,
                      const int32_t *offs, int G, int IC, int OC)
{
    gmm_t p = {.offs = offs, .G = G, .IC = IC, .OC = OC, .bf16 = 1, .in16 = in, .w16 = w, .b = b, .out = out};
    bf16_buffers(&p, ws, 1);
    run(&p, 1);
}

void cpu_gmm_bwd_bf16(cpu_gmm_ws_t *ws, float *din, float *dw, float *db, const uint16_t *dout16, const float *dout,
                      const uint16_t *in, const float *pre, const uint16_t *w, const int32_t *offs, int G, int IC,
                      int OC, int accum_din, int accum_dw)
{
    gmm_t p = {.offs = offs,
               .G = G,
               .IC = IC,
               .OC = OC,
               .accum_din = accum_din,
               .accum_dw = accum_dw,
               .bf16 = 1,
               .in16 = in,
               .w16 = w,
               .dout16 = dout16,
               .dout = dout,
               .pre = pre,
               .din = din,
               .dw = dw,
               .db = db};
    bf16_buffers(&p, ws, 0);
    run(&p, 0);
}
