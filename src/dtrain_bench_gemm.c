/* dtrain-bench-gemm: throughput of the ops table's GEMMs (base/ops.h) on one
 * device, in the layout of dtrain-bench-comm.
 *
 *   dtrain-bench-gemm [--device auto|cpu|cuda] [--dtype bf16|fp32|both]
 *       [--op gemm|gelu|all] [--shapes NxICxOC[,NxICxOC...]] [--iters 20]
 *       [--warmup 5] [--threads N]
 *
 * Each row times out[N,OC] = in[N,IC] . w[OC,IC]^T (a linear layer's
 * forward on N tokens, no bias): matmul_fwd_bf16 (bf16 in and w from
 * cast_f32_to_bf16, fp32 sums and out) or matmul_fwd (fp32); that is op
 * "gemm". --op gelu times GPT-2's fc instead, with bias and GELU, in two
 * rows: "gemm+gelu" is the one fused op (matmul_gelu_fwd*, one cuBLASLt
 * GEMM with the GELU_AUX_BIAS epilogue on CUDA) and "gemm,gelu" the
 * separate matmul_fwd* and gelu_fwd (a GEMM with the bias epilogue, then
 * the elementwise kernel); TFLOP/s counts the GEMM's flops only. --warmup
 * untimed calls, then --iters calls between two readings of a monotonic
 * host clock; time is the mean per call and TFLOP/s = 2 N IC OC / time.
 * The host clock is valid on both backends: ops->sync before each reading
 * waits for everything issued (CUDA ops run ahead of the host on their
 * stream), so the interval covers the GPU's work, back to back as in
 * training. The CUDA backend plans each GEMM shape once (cuBLASLt
 * descriptors and algorithm, kept), so the warm-up pays that and the timed
 * calls pay only their launches, as training's steps do.
 *
 * After the timed calls, 64 output elements (two corners, 62 random) are
 * read back with the input and weight rows that made them, straight from
 * the device buffers the GEMM read, and compared with a double-precision
 * sum on the host: wrong when |out - ref| > 8 K 2^-24 sum_k |a_k b_k| +
 * 2^-24 |ref| (fp32 sums in any order of products that are exact for bf16
 * operands and within 2^-24 relative for fp32 ones; test/test_bf16.c uses
 * the same bound). err/bound is the worst sample's |out - ref| / bound.
 * The gelu rows check the GEMM output pre (bias included in ref and in
 * the magnitudes) that way, and out against dt_gelu(pre) within 1e-3 of
 * max(1, |out|): cuBLASLt evaluates the epilogue's GELU itself.
 *
 * Single process, no MPI: backend_open needs none. Exit status 0 when every
 * row has 0 wrong, 1 otherwise, 2 for bad input, no usable device or a
 * shape that does not fit in memory. */
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#include "base/ops_math.h"
#include "mpi/clock.h"
#include "src/backend/backend.h"
#include "src/backend/ops_cpu.h"
#include "src/cli/optable.h"
#include "src/cli/strparse.h"
#include "src/model/rng.h"

#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-bench-gemm"
#define MAX_SHAPES 64
#define MAX_DIM 1048576 /* 2^20: keeps every int dimension and byte count far from overflow */
#define N_SAMPLES 64    /* output elements checked per row */
#define SEED 20261123ull

/* masks; --dtype and --op give a name's index, the mask is index + 1 */
enum { DT_BF16 = 1, DT_FP32 = 2, DT_BOTH = 3 };
enum { OP_GEMM = 1, OP_GELU = 2, OP_ALL = 3 };
static const char *const dtype_names[] = {"bf16", "fp32", "both", NULL};
static const char *const op_names[] = {"gemm", "gelu", "all", NULL};
/* what one row times: the plain GEMM, the GELU-fused op, or the GEMM
 * and the GELU as separate ops */
typedef enum { ROW_GEMM, ROW_FUSED, ROW_SEPARATE } row_kind_t;
static const char *const row_names[] = {"gemm", "gemm+gelu", "gemm,gelu"};

typedef struct shape {
    int n, ic, oc;
} shape_t;

typedef struct bench_opts {
    backend_device_t device;
    int dtype;
    int op;
    shape_t shapes[MAX_SHAPES];
    int n_shapes; /* 0: the device's defaults */
    long iters, warmup;
    long threads; /* 0: OMP_NUM_THREADS or all cores; -1: not given */
} bench_opts_t;

/* Defaults: square GEMMs and GPT-2 124M's (C 768) linear layers at micro
 * batch 1 x 1024 tokens on the CPU, 16 x 1024 on a GPU. */
static const shape_t cpu_shapes[] = {{512, 512, 512}, {1024, 1024, 1024}, {1024, 768, 3072}, {1024, 3072, 768}};
static const shape_t cuda_shapes[] = {{4096, 4096, 4096}, {8192, 8192, 8192}, {16384, 768, 3072}, {16384, 3072, 768}};

/* One dimension of a shape: digits only, 1 to MAX_DIM; *s moves past it. */
static int parse_dim(const char **s, int *out)
{
    const char *p = *s;
    long v = 0;
    if (*p < '0' || *p > '9')
        return -1;
    for (; *p >= '0' && *p <= '9'; p++) {
        v = v * 10 + (*p - '0');
        if (v > MAX_DIM)
            return -1;
    }
    if (v < 1)
        return -1;
    *out = (int)v;
    *s = p;
    return 0;
}

/* "NxICxOC[,NxICxOC...]" into o->shapes. 0, or -1 with one line in err. */
static int parse_shapes(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    bench_opts_t *o = dst;
    (void)field;
    const char *p = val;
    o->n_shapes = 0;
    for (;;) {
        shape_t s;
        const char *start = p;
        if (o->n_shapes == MAX_SHAPES) {
            snprintf(err, errlen, "--shapes: more than %d shapes", MAX_SHAPES);
            return -1;
        }
        if (parse_dim(&p, &s.n) != 0 || *p++ != 'x' || parse_dim(&p, &s.ic) != 0 || *p++ != 'x' ||
            parse_dim(&p, &s.oc) != 0 || (*p != ',' && *p != '\0')) {
            size_t len = strcspn(start, ",");
            snprintf(err, errlen,
                     "--shapes '%.*s': each shape is NxICxOC, three integers from 1 to %d joined by x "
                     "(e.g. 4096x4096x4096), shapes separated by commas",
                     (int)(len > 64 ? 64 : len), start, MAX_DIM);
            return -1;
        }
        o->shapes[o->n_shapes++] = s;
        if (*p == '\0')
            return 0;
        p++; /* the comma */
    }
}

#define F(field) offsetof(bench_opts_t, field)
/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"device", OPT_ENUM, F(device), 0, "auto", 0, 0, backend_device_names,
     "auto|cpu|cuda (default auto: cuda when built with it and a GPU is visible)", "NAME", NULL, 0},
    {"dtype", OPT_ENUM, F(dtype), 0, "both", 0, 0, dtype_names,
     "bf16|fp32|both (default both): bf16 operands with fp32 sums, or fp32", "NAME", NULL, 0},
    {"op", OPT_ENUM, F(op), 0, "gemm", 0, 0, op_names,
     "gemm|gelu|all (default gemm): the plain GEMM, or GPT-2's fc with bias\n"
     "and GELU as one fused op (gemm+gelu) and as two ops (gemm,gelu)",
     "NAME", NULL, 0},
    {"shapes", OPT_ARG, F(shapes), 0, NULL, 0, 0, NULL,
     "NxICxOC[,NxICxOC...], each from 1 to 1048576 (default on cpu\n"
     "512x512x512,1024x1024x1024,1024x768x3072,1024x3072x768; on cuda\n"
     "4096x4096x4096,8192x8192x8192,16384x768x3072,16384x3072x768)",
     "LIST", parse_shapes, 0},
    {"iters", OPT_LONG, F(iters), 0, "20", 1, 1000000000, NULL, "timed calls per row (default 20)", "N", NULL, 0},
    {"warmup", OPT_LONG, F(warmup), 0, "5", 0, 1000000000, NULL, "untimed calls per row before timing (default 5)", "N",
     NULL, 0},
    /* no default: -1 says it was not given (refused with the cuda device) */
    {"threads", OPT_LONG, F(threads), 0, NULL, 0, 4096, NULL,
     "OpenMP/OpenBLAS threads of the CPU backend (default 0 = OMP_NUM_THREADS\n"
     "or all cores); not with the cuda device",
     "N", NULL, 0},
};
/* clang-format on */
#undef F
static const opt_table_t opt_table = {.prog = PROG, .defs = opt_defs, .n = sizeof opt_defs / sizeof opt_defs[0]};

static void usage(FILE *f)
{
    fprintf(f, "Usage: " PROG " [OPTION]...\n"
               "Time the ops table's GEMMs out[N,OC] = in[N,IC] . w[OC,IC]^T on one device: time, TFLOP/s, #wrong.\n"
               "\n");
    opt_print_help(&opt_table, f, 18, 0);
}

/* Returns 0 to run, 1 for --help/--version (done), 2 with one line in err. */
static int parse_args(int argc, char **argv, bench_opts_t *o, char *err, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->threads = -1;
    if (opt_answer_help(argc, argv, 1, usage, PROG " " PACKAGE_VERSION))
        return 1;
    if (opt_defaults(&opt_table, o, err, errlen) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, o, NULL, NULL, NULL, err, errlen) != 0)
        return 2;
    o->dtype += 1; /* the names' index to the mask */
    o->op += 1;
    return 0;
}

/* ------------------------------------------------------------ one shape */

/* The device buffers of one shape: fp32 in[N,IC] and w[OC,IC] (the
 * operands of the fp32 GEMM and the sources of the casts), their bf16
 * copies when a bf16 row runs, and out[N,OC]; for the gelu rows also the
 * bias b[OC] and the GEMM output pre[N,OC] (out is then gelu(pre)). */
typedef struct bufs {
    float *in, *w, *out, *b, *pre;
    uint16_t *in16, *w16;
} bufs_t;

typedef struct row {
    double us, tflops, worst; /* time per call, TFLOP/s, worst err/bound */
    long wrong;               /* sampled elements outside the bound */
} row_t;

static void free_bufs(const ops_t *ops, bufs_t *m)
{
    ops->free(ops->ctx, m->in);
    ops->free(ops->ctx, m->w);
    ops->free(ops->ctx, m->out);
    ops->free(ops->ctx, m->b);
    ops->free(ops->ctx, m->pre);
    ops->free(ops->ctx, m->in16);
    ops->free(ops->ctx, m->w16);
    memset(m, 0, sizeof *m);
}

/* Uniform values in [-1, 1): element i of a tensor depends only on
 * (seed, stream, i). */
static void fill_uniform(float *x, size_t n, uint64_t stream)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        x[i] = (float)(2.0 * rng_uniform(SEED, stream, i) - 1.0);
}

/* Allocates and fills the buffers for shape s; stage is a host buffer of
 * max(N, OC) * IC floats. 0, or -1 with one line in err (out of memory). */
static int setup_bufs(const ops_t *ops, const shape_t *s, int bf16, int gelu, float *stage, bufs_t *m, char *err,
                      size_t errlen)
{
    const size_t n_in = (size_t)s->n * (size_t)s->ic, n_w = (size_t)s->oc * (size_t)s->ic,
                 n_out = (size_t)s->n * (size_t)s->oc;
    memset(m, 0, sizeof *m);
    m->in = ops->alloc(ops->ctx, n_in * sizeof(float));
    m->w = ops->alloc(ops->ctx, n_w * sizeof(float));
    m->out = ops->alloc(ops->ctx, n_out * sizeof(float));
    if (bf16) {
        m->in16 = ops->alloc(ops->ctx, n_in * sizeof(uint16_t));
        m->w16 = ops->alloc(ops->ctx, n_w * sizeof(uint16_t));
    }
    if (gelu) {
        m->b = ops->alloc(ops->ctx, (size_t)s->oc * sizeof(float));
        m->pre = ops->alloc(ops->ctx, n_out * sizeof(float));
    }
    if (!m->in || !m->w || !m->out || (bf16 && (!m->in16 || !m->w16)) || (gelu && (!m->b || !m->pre))) {
        const size_t bytes = (n_in + n_w) * (sizeof(float) + (bf16 ? sizeof(uint16_t) : 0)) +
                             n_out * sizeof(float) * (gelu ? 2 : 1) + (gelu ? (size_t)s->oc * sizeof(float) : 0);
        snprintf(err, errlen, "%dx%dx%d: out of %s memory for %.2f GiB of operands (pass smaller --shapes)", s->n,
                 s->ic, s->oc, ops->name, (double)bytes / 1073741824.0);
        free_bufs(ops, m);
        return -1;
    }
    fill_uniform(stage, n_in, 1);
    ops->from_host(ops->ctx, m->in, stage, n_in * sizeof(float));
    fill_uniform(stage, n_w, 2);
    ops->from_host(ops->ctx, m->w, stage, n_w * sizeof(float));
    if (gelu) {
        fill_uniform(stage, (size_t)s->oc, 4);
        ops->from_host(ops->ctx, m->b, stage, (size_t)s->oc * sizeof(float));
    }
    if (bf16) {
        ops->cast_f32_to_bf16(ops->ctx, m->in16, m->in, n_in);
        ops->cast_f32_to_bf16(ops->ctx, m->w16, m->w, n_w);
    }
    return 0;
}

static void gemm(const ops_t *ops, const bufs_t *m, const shape_t *s, int bf16, row_kind_t kind)
{
    const size_t n_out = (size_t)s->n * (size_t)s->oc;
    switch (kind) {
    case ROW_GEMM:
        if (bf16)
            ops->matmul_fwd_bf16(ops->ctx, m->out, m->in16, m->w16, NULL, s->n, s->ic, s->oc);
        else
            ops->matmul_fwd(ops->ctx, m->out, m->in, m->w, NULL, s->n, s->ic, s->oc);
        break;
    case ROW_FUSED:
        if (bf16)
            ops->matmul_gelu_fwd_bf16(ops->ctx, m->out, m->pre, m->in16, m->w16, m->b, s->n, s->ic, s->oc);
        else
            ops->matmul_gelu_fwd(ops->ctx, m->out, m->pre, m->in, m->w, m->b, s->n, s->ic, s->oc);
        break;
    case ROW_SEPARATE:
        if (bf16)
            ops->matmul_fwd_bf16(ops->ctx, m->pre, m->in16, m->w16, m->b, s->n, s->ic, s->oc);
        else
            ops->matmul_fwd(ops->ctx, m->pre, m->in, m->w, m->b, s->n, s->ic, s->oc);
        ops->gelu_fwd(ops->ctx, m->out, m->pre, n_out);
        break;
    }
}

/* Row r of a [rows, ic] operand on the device as fp32 on the host: the
 * fp32 values, or the bf16 patterns widened (exact). tmp16 holds ic. */
static void fetch_row(const ops_t *ops, float *dst, uint16_t *tmp16, const float *x32, const uint16_t *x16, int r,
                      int ic)
{
    const size_t off = (size_t)r * (size_t)ic;
    if (x16) {
        ops->to_host(ops->ctx, tmp16, x16 + off, (size_t)ic * sizeof(uint16_t));
        for (int k = 0; k < ic; k++)
            dst[k] = dt_bf16_to_f32(tmp16[k]);
    } else {
        ops->to_host(ops->ctx, dst, x32 + off, (size_t)ic * sizeof(float));
    }
}

/* Checks N_SAMPLES elements of out against double sums over the operands
 * the GEMM read; host holds 2 * IC floats and IC uint16_t. */
static void check_samples(const ops_t *ops, const bufs_t *m, const shape_t *s, int bf16, row_kind_t kind, float *a,
                          float *b, uint16_t *tmp16, row_t *row)
{
    const double eps = ldexp(1.0, -24);
    row->wrong = 0;
    row->worst = 0.0;
    for (int i = 0; i < N_SAMPLES; i++) {
        int r, c;
        if (i < 2) { /* the corners: the first and last row and column */
            r = i == 0 ? 0 : s->n - 1;
            c = i == 0 ? 0 : s->oc - 1;
        } else {
            uint64_t bits = rng_bits(SEED, 3, (uint64_t)i);
            r = (int)((bits & 0xffffffffu) % (uint64_t)s->n);
            c = (int)((bits >> 32) % (uint64_t)s->oc);
        }
        fetch_row(ops, a, tmp16, m->in, bf16 ? m->in16 : NULL, r, s->ic);
        fetch_row(ops, b, tmp16, m->w, bf16 ? m->w16 : NULL, c, s->ic);
        const size_t at = (size_t)r * (size_t)s->oc + (size_t)c;
        float got = 0.0f, act = 0.0f, bias = 0.0f;
        ops->to_host(ops->ctx, &got, (kind == ROW_GEMM ? m->out : m->pre) + at, sizeof got);
        double ref = 0.0, mag = 0.0;
        for (int k = 0; k < s->ic; k++) {
            const double t = (double)a[k] * (double)b[k];
            ref += t;
            mag += fabs(t);
        }
        if (kind != ROW_GEMM) {
            ops->to_host(ops->ctx, &bias, m->b + c, sizeof bias);
            ops->to_host(ops->ctx, &act, m->out + at, sizeof act);
            ref += bias;
            mag += fabs(bias);
        }
        const double bound = 8.0 * s->ic * eps * mag + eps * fabs(ref) + 1e-30;
        double ratio = fabs((double)got - ref) / bound;
        if (kind != ROW_GEMM) { /* out = gelu(pre), see the header */
            const double g = dt_gelu(got), r_act = fabs((double)act - g) / (1e-3 * (fabs(g) > 1.0 ? fabs(g) : 1.0));
            if (!(r_act <= ratio)) /* NaN stays */
                ratio = r_act;
        }
        if (!(ratio <= 1.0)) /* NaN counts as wrong */
            row->wrong++;
        if (!isnan(row->worst) && !(ratio <= row->worst)) /* a NaN, once seen, stays */
            row->worst = ratio;
    }
}

/* Benchmarks shape s in the requested dtypes, printing a row each; adds
 * the wrong samples to *wrong. 0, or -1 with one line in err. */
static int bench_shape(const ops_t *ops, const shape_t *s, const bench_opts_t *o, long *wrong, char *err, size_t errlen)
{
    const int want_bf16 = (o->dtype & DT_BF16) != 0;
    const size_t rows = (size_t)(s->n > s->oc ? s->n : s->oc);
    float *stage = malloc(rows * (size_t)s->ic * sizeof(float));
    float *host = malloc(2 * (size_t)s->ic * sizeof(float));
    uint16_t *tmp16 = malloc((size_t)s->ic * sizeof(uint16_t));
    if (!stage || !host || !tmp16) {
        snprintf(err, errlen, "%dx%dx%d: out of host memory for %.2f GiB of staging (pass smaller --shapes)", s->n,
                 s->ic, s->oc, (double)(rows * (size_t)s->ic * sizeof(float)) / 1073741824.0);
        free(stage);
        free(host);
        free(tmp16);
        return -1;
    }
    bufs_t m;
    int rc = setup_bufs(ops, s, want_bf16, (o->op & OP_GELU) != 0, stage, &m, err, errlen);
    free(stage);
    for (int bf16 = 1; rc == 0 && bf16 >= 0; bf16--) {
        if (!(o->dtype & (bf16 ? DT_BF16 : DT_FP32)))
            continue;
        for (int k = ROW_GEMM; k <= ROW_SEPARATE; k++) {
            const row_kind_t kind = (row_kind_t)k;
            if (!(o->op & (kind == ROW_GEMM ? OP_GEMM : OP_GELU)))
                continue;
            /* a stale result of another row must not pass the check */
            ops->zero(ops->ctx, m.out, (size_t)s->n * (size_t)s->oc * sizeof(float));
            if (m.pre)
                ops->zero(ops->ctx, m.pre, (size_t)s->n * (size_t)s->oc * sizeof(float));
            for (long it = 0; it < o->warmup; it++)
                gemm(ops, &m, s, bf16, kind);
            ops->sync(ops->ctx);
            const double t0 = now_s();
            for (long it = 0; it < o->iters; it++)
                gemm(ops, &m, s, bf16, kind);
            ops->sync(ops->ctx);
            const double t = (now_s() - t0) / (double)o->iters;
            row_t row = {.us = t * 1e6, .tflops = 2.0 * s->n * (double)s->ic * (double)s->oc / t / 1e12};
            check_samples(ops, &m, s, bf16, kind, host, host + s->ic, tmp16, &row);
            printf("  %5s %-9s %7d %7d %7d %12.2f %9.4g %7ld %9.1e\n", bf16 ? "bf16" : "fp32", row_names[kind], s->n,
                   s->ic, s->oc, row.us, row.tflops, row.wrong, row.worst);
            fflush(stdout);
            *wrong += row.wrong;
        }
    }
    if (rc == 0)
        free_bufs(ops, &m);
    free(host);
    free(tmp16);
    return rc;
}

int main(int argc, char **argv)
{
    bench_opts_t o;
    char err[512] = "";
    int rc = parse_args(argc, argv, &o, err, sizeof err);
    if (rc != 0) {
        if (rc == 2)
            fprintf(stderr, PROG ": %s\n", err);
        return rc == 1 ? 0 : 2;
    }
    backend_t b;
    if (backend_open(&b, o.device, BACKEND_DTYPE_AUTO, 0, err, sizeof err) != 0) {
        /* with a CUDA build the line names the CUDA error; say the way out */
        fprintf(stderr, PROG ": %s%s\n", err, backend_have_cuda() ? " (--device cpu times the CPU instead)" : "");
        return 2;
    }
    if (b.cuda && o.threads >= 0) {
        fprintf(stderr,
                PROG ": --threads sets the CPU backend's threads, but the GEMMs run on %s: drop --threads, "
                     "or pass --device cpu\n",
                b.desc);
        backend_close(&b);
        return 2;
    }
    if (o.n_shapes == 0) {
        const shape_t *d = b.cuda ? cuda_shapes : cpu_shapes;
        o.n_shapes = (int)((b.cuda ? sizeof cuda_shapes : sizeof cpu_shapes) / sizeof(shape_t));
        memcpy(o.shapes, d, (size_t)o.n_shapes * sizeof(shape_t));
    }
    char where[sizeof((backend_t *)0)->desc + 32];
    if (b.cuda)
        snprintf(where, sizeof where, "%s", b.desc);
    else {
        const int threads = ops_cpu_threads(o.threads < 0 ? 0 : (int)o.threads);
        snprintf(where, sizeof where, "%s, %d thread%s", b.desc, threads, threads == 1 ? "" : "s");
    }
    printf("# %s: %s; out[N,OC] = in[N,IC] . w[OC,IC]^T, fp32 sums and out; %ld timed call%s after %ld warm-up, "
           "time = mean per call\n",
           PROG, where, o.iters, o.iters == 1 ? "" : "s", o.warmup);
    printf("#\n# %5s %-9s %7s %7s %7s %12s %9s %7s %9s\n", "dtype", "op", "N", "IC", "OC", "time", "TFLOP/s", "#wrong",
           "err/bound");
    printf("# %5s %-9s %7s %7s %7s %12s %9s %7s %9s\n", "", "", "", "", "", "(us)", "", "", "");
    fflush(stdout);
    long wrong = 0;
    for (int i = 0; i < o.n_shapes; i++)
        if (bench_shape(b.ops, &o.shapes[i], &o, &wrong, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s\n", err);
            backend_close(&b);
            return 2;
        }
    printf("# Wrong values : %ld %s (%d sampled elements per row, bound 8 K 2^-24 sum|a b| + 2^-24 |ref|%s)\n#\n",
           wrong, wrong ? "FAILED" : "OK", N_SAMPLES,
           (o.op & OP_GELU) ? "; gelu rows: out within 1e-3 max(1, |out|) of dt_gelu(pre)" : "");
    fflush(stdout);
    backend_close(&b);
    return wrong ? 1 : 0;
}
