/* dtrain-bench-gemm: throughput of the ops table's GEMMs (base/ops.h) on one
 * device, in the layout of dtrain-bench-comm, and of its attention ops.
 *
 *   dtrain-bench-gemm [--device auto|cpu|cuda] [--dtype bf16|fp32|both]
 *       [--op gemm|gelu|all] [--shapes NxICxOC[,NxICxOC...]] [--iters 20]
 *       [--warmup 5] [--threads N]
 *   dtrain-bench-gemm --op attention [--seqs S[,S...]] [--head-dims 64,128]
 *       [--tokens N] [--device ...] [--dtype ...] [--iters ...] [--warmup ...]
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
 * --op attention times the ops table's causal attention_fwd and
 * attention_bwd instead (the attention part below says how), in
 * FlashAttention's benchmark convention: hidden size 2048 (NH = 2048 / HS
 * heads, NKV = NH), B = --tokens / S sequences, TFLOP/s from 4 B S^2 NH HS
 * / 2 forward (causal) and 2.5 times that backward. The backend is opened
 * once per dtype, as training opens it: under bf16 the CUDA table takes the
 * tensor-core kernels at head sizes 64 and 128.
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
enum { OP_GEMM = 1, OP_GELU = 2, OP_ALL = 3, OP_ATT = 4 };
static const char *const dtype_names[] = {"bf16", "fp32", "both", NULL};
static const char *const op_names[] = {"gemm", "gelu", "all", "attention", NULL};
#define MAX_LIST 16         /* --seqs, --head-dims */
#define ATT_HIDDEN 2048     /* NH x HS, FlashAttention's benchmark grid */
#define ATT_MAX_SEQ 1048576 /* keeps B S NH HS and B NH S S far from overflow in size_t and double */
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
    long threads;                   /* 0: OMP_NUM_THREADS or all cores; -1: not given */
    int seqs[MAX_LIST], n_seqs;     /* --op attention: sequence lengths (0: the device's defaults) */
    int hdims[MAX_LIST], n_hdims;   /* head sizes */
    long tokens;                    /* B S per row (0: the device's default) */
    int shapes_given, att_given[3]; /* --shapes; --seqs, --head-dims, --tokens */
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

/* "A[,B...]", integers from lo to hi, into out[MAX_LIST], *n of them. 0, or
 * -1 with one line in err naming the option. */
static int parse_int_list(const char *val, int *out, int *n, long lo, long hi, const char *opt, char *err,
                          size_t errlen)
{
    const char *p = val;
    *n = 0;
    for (;;) {
        char *end = NULL;
        errno = 0;
        const long v = *p >= '0' && *p <= '9' ? strtol(p, &end, 10) : -1;
        if (v < lo || v > hi || errno || (*end != ',' && *end != '\0') || *n == MAX_LIST) {
            snprintf(err, errlen, "--%s '%s': a list of at most %d integers from %ld to %ld joined by commas", opt, val,
                     MAX_LIST, lo, hi);
            return -1;
        }
        out[(*n)++] = (int)v;
        if (*end == '\0')
            return 0;
        p = end + 1;
    }
}

static int parse_seqs(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    bench_opts_t *o = dst;
    (void)field;
    return parse_int_list(val, o->seqs, &o->n_seqs, 1, ATT_MAX_SEQ, "seqs", err, errlen);
}

/* head sizes that divide the hidden size 2048 (so NH is whole) */
static int parse_hdims(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    bench_opts_t *o = dst;
    (void)field;
    if (parse_int_list(val, o->hdims, &o->n_hdims, 1, ATT_HIDDEN, "head-dims", err, errlen) != 0)
        return -1;
    for (int i = 0; i < o->n_hdims; i++)
        if (ATT_HIDDEN % o->hdims[i] != 0) {
            snprintf(err, errlen, "--head-dims %d: a head size must divide the hidden size %d (NH = %d / HS heads)",
                     o->hdims[i], ATT_HIDDEN, ATT_HIDDEN);
            return -1;
        }
    return 0;
}

#define F(field) offsetof(bench_opts_t, field)
/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"device", OPT_ENUM, F(device), 0, "auto", 0, 0, backend_device_names,
     "auto|cpu|cuda (default auto: cuda when built with it and a GPU is visible)", "NAME", NULL, 0},
    {"dtype", OPT_ENUM, F(dtype), 0, "both", 0, 0, dtype_names,
     "bf16|fp32|both (default both): bf16 operands with fp32 sums, or fp32", "NAME", NULL, 0},
    {"op", OPT_ENUM, F(op), 0, "gemm", 0, 0, op_names,
     "gemm|gelu|all|attention (default gemm): the plain GEMM, or GPT-2's fc\n"
     "with bias and GELU as one fused op (gemm+gelu) and as two ops\n"
     "(gemm,gelu), all = the three; attention: the causal attention ops\n"
     "forward and backward",
     "NAME", NULL, 0},
    {"shapes", OPT_ARG, F(shapes), 0, NULL, 0, 0, NULL,
     "NxICxOC[,NxICxOC...], each from 1 to 1048576 (default on cpu\n"
     "512x512x512,1024x1024x1024,1024x768x3072,1024x3072x768; on cuda\n"
     "4096x4096x4096,8192x8192x8192,16384x768x3072,16384x3072x768); not with\n"
     "--op attention",
     "LIST", parse_shapes, F(shapes_given) + 1},
    {"seqs", OPT_ARG, F(seqs), 0, NULL, 0, 0, NULL,
     "--op attention: sequence lengths S, 1 to 1048576 (default on cpu\n"
     "128,256; on cuda 1024,2048,4096,8192)",
     "LIST", parse_seqs, F(att_given) + 1},
    {"head-dims", OPT_ARG, F(hdims), 0, NULL, 0, 0, NULL,
     "--op attention: head sizes HS, each dividing 2048 (default 64,128);\n"
     "NH = 2048 / HS heads",
     "LIST", parse_hdims, F(att_given) + sizeof(int) + 1},
    {"tokens", OPT_LONG, F(tokens), 0, NULL, 1, 1048576, NULL,
     "--op attention: tokens B S per row, B = max(1, N / S) sequences\n"
     "(default on cpu 512, on cuda 16384)",
     "N", NULL, F(att_given) + 2 * sizeof(int) + 1},
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
               "With --op attention, its causal attention forward and backward instead.\n"
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
    o->op += 1;    /* attention (index 3) is OP_ATT */
    const int att_given = o->att_given[0] || o->att_given[1] || o->att_given[2];
    if (o->op == OP_ATT && o->shapes_given) {
        snprintf(err, errlen,
                 "--shapes gives GEMM shapes, but --op attention times attention: use --seqs, "
                 "--head-dims and --tokens");
        return 2;
    }
    if (o->op != OP_ATT && att_given) {
        snprintf(err, errlen, "--%s sets the attention rows, which only --op attention times",
                 o->att_given[0]   ? "seqs"
                 : o->att_given[1] ? "head-dims"
                                   : "tokens");
        return 2;
    }
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
            ops->matmul_gelu_fwd_bf16(ops->ctx, m->out, NULL, m->pre, m->in16, m->w16, m->b, s->n, s->ic, s->oc);
        else
            ops->matmul_gelu_fwd(ops->ctx, m->out, m->pre, m->in, m->w, m->b, s->n, s->ic, s->oc);
        break;
    case ROW_SEPARATE:
        if (bf16)
            ops->matmul_fwd_bf16(ops->ctx, m->pre, m->in16, m->w16, m->b, s->n, s->ic, s->oc);
        else
            ops->matmul_fwd(ops->ctx, m->pre, m->in, m->w, m->b, s->n, s->ic, s->oc);
        ops->gelu_fwd(ops->ctx, m->out, NULL, m->pre, n_out);
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

/* ------------------------------------------------------------ attention */

/* Attention rows: for each head size HS and length S, B = max(1, tokens /
 * S) sequences of NH = 2048 / HS heads (NKV = NH), qkv and dout uniform in
 * [-1, 1). attention_fwd is timed (--warmup untimed calls, then --iters),
 * then attention_bwd from the last forward's out and lse, the same way.
 *
 * Then 8 sampled (sequence, head, row) triples (the last row of the last
 * head of the last sequence, row 0, and 6 at random) are checked against a
 * double-precision attention on the host, from the device's qkv and dout
 * (rounded to bf16 first where the backend's attention rounds them: the
 * tensor-core path) and, for the backward, the op's own out and lse: the
 * row's out and lse, its dq, and dk and dv of the key at that row (every
 * query head of its group, every later row). Per element the bound is
 * rel times the sum of the magnitudes of the terms behind it (sum_j P |v|
 * for out, scale sum_j |dS k| for dq, ...) plus, for dq and dk, 2^-20 HS
 * scale max|dout| max|v| max|q, k| (fp32 rounding of dP - D); rel = 2^-7
 * on the tensor cores (P and dS rounded to bf16: 2^-9 each, test/emu's
 * derivation), 1e-4 in fp32 (summation order over up to S terms); lse
 * within 1e-5 max(1, |lse|). err/bound is the worst ratio. */
typedef struct att_bufs {
    float *qkv, *out, *lse, *dout, *dqkv;
} att_bufs_t;

typedef struct att_dims {
    int B, S, NH, HS;
    size_t R, N; /* row width (NH + 2 NH) HS, tokens B S */
} att_dims_t;

static void att_free(const ops_t *ops, att_bufs_t *m)
{
    ops->free(ops->ctx, m->qkv);
    ops->free(ops->ctx, m->out);
    ops->free(ops->ctx, m->lse);
    ops->free(ops->ctx, m->dout);
    ops->free(ops->ctx, m->dqkv);
    memset(m, 0, sizeof *m);
}

/* The host copies the check reads (all of each tensor). */
typedef struct att_host {
    float *qkv, *out, *lse, *dout, *dqkv;
} att_host_t;

static void att_host_free(att_host_t *h)
{
    free(h->qkv), free(h->out), free(h->lse), free(h->dout), free(h->dqkv);
    memset(h, 0, sizeof *h);
}

static double att_round(float x, int bf16) { return bf16 ? (double)dt_bf16_to_f32(dt_f32_to_bf16(x)) : (double)x; }

/* The per-sample worst ratio |got - ref| / bound of out, lse and of dq, dk,
 * dv at (b, h, t), folded into row_f and row_b (wrong counts elements). */
static void att_check_sample(const att_host_t *h, const att_dims_t *d, int b, int hd, int t, int bf16, double floor,
                             row_t *rf, row_t *rb)
{
    const int HS = d->HS, NH = d->NH, S = d->S;
    const size_t R = d->R, OC = (size_t)NH * HS;
    const double scale = 1.0 / sqrt((double)HS), rel = bf16 ? ldexp(1.0, -7) : 1e-4;
    const float *rows = h->qkv + (size_t)b * S * R, *dorows = h->dout + (size_t)b * S * OC;
#define Q(tt, hh, e) att_round(rows[(size_t)(tt)*R + (size_t)(hh)*HS + (e)], bf16)
#define K(tt, hh, e) att_round(rows[(size_t)(tt)*R + (size_t)(NH + (hh)) * HS + (e)], bf16)
#define V(tt, hh, e) att_round(rows[(size_t)(tt)*R + (size_t)(2 * NH + (hh)) * HS + (e)], bf16)
#define DO(tt, hh, e) att_round(dorows[(size_t)(tt)*OC + (size_t)(hh)*HS + (e)], bf16)
#define OUT(tt, hh, e) ((double)h->out[((size_t)b * S + (tt)) * OC + (size_t)(hh)*HS + (e)])
#define LSE(tt, hh) ((double)h->lse[((size_t)b * NH + (hh)) * S + (tt)])
    double *s = malloc((size_t)S * sizeof *s), *ref = calloc((size_t)HS * 2, sizeof *ref), *mag = ref + HS;
    if (!s || !ref) {
        free(s), free(ref);
        rf->wrong++;
        return;
    }
    /* forward: out and lse of row t */
    double mx = -INFINITY, sum = 0.0;
    for (int j = 0; j <= t; j++) {
        double x = 0.0;
        for (int e = 0; e < HS; e++)
            x += Q(t, hd, e) * K(j, hd, e);
        s[j] = x * scale;
        mx = s[j] > mx ? s[j] : mx;
    }
    for (int j = 0; j <= t; j++)
        sum += exp(s[j] - mx);
    for (int j = 0; j <= t; j++) {
        const double p = exp(s[j] - mx) / sum;
        for (int e = 0; e < HS; e++)
            ref[e] += p * V(j, hd, e), mag[e] += p * fabs(V(j, hd, e));
    }
    double worst_f = 0.0;
    for (int e = 0; e < HS; e++) {
        const double r = fabs(OUT(t, hd, e) - ref[e]) / (rel * mag[e] + 1e-30);
        rf->wrong += !(r <= 1.0);
        worst_f = !(r <= worst_f) ? r : worst_f;
    }
    const double lse_ref = mx + log(sum), rl = fabs(LSE(t, hd) - lse_ref) / (1e-5 * fmax(1.0, fabs(lse_ref)));
    rf->wrong += !(rl <= 1.0);
    worst_f = !(rl <= worst_f) ? rl : worst_f;
    if (!isnan(rf->worst) && !(worst_f <= rf->worst))
        rf->worst = worst_f;

    /* backward: P from the op's lse, D from the op's out and the dout the op
     * uses; dq of row t */
    double worst_b = 0.0;
    double Dt = 0.0;
    for (int e = 0; e < HS; e++)
        Dt += DO(t, hd, e) * OUT(t, hd, e);
    memset(ref, 0, (size_t)HS * 2 * sizeof *ref);
    for (int j = 0; j <= t; j++) {
        double dp = 0.0;
        for (int e = 0; e < HS; e++)
            dp += DO(t, hd, e) * V(j, hd, e);
        const double ds = exp(s[j] - LSE(t, hd)) * (dp - Dt);
        for (int e = 0; e < HS; e++)
            ref[e] += scale * ds * K(j, hd, e), mag[e] += scale * fabs(ds * K(j, hd, e));
    }
    for (int e = 0; e < HS; e++) {
        const double got = h->dqkv[((size_t)b * S + t) * R + (size_t)hd * HS + e];
        const double r = fabs(got - ref[e]) / (rel * mag[e] + floor);
        rb->wrong += !(r <= 1.0);
        worst_b = !(r <= worst_b) ? r : worst_b;
    }
    /* dk and dv of key row t of head hd (NKV = NH: its own group) */
    for (int pass = 0; pass < 2; pass++) { /* 0: dk, 1: dv */
        memset(ref, 0, (size_t)HS * 2 * sizeof *ref);
        for (int q = t; q < S; q++) {
            double sc = 0.0, dp = 0.0, D = 0.0;
            for (int e = 0; e < HS; e++) {
                sc += Q(q, hd, e) * K(t, hd, e);
                dp += DO(q, hd, e) * V(t, hd, e);
                D += DO(q, hd, e) * OUT(q, hd, e);
            }
            const double p = exp(sc * scale - LSE(q, hd)), ds = p * (dp - D);
            for (int e = 0; e < HS; e++) {
                const double term = pass ? p * DO(q, hd, e) : scale * ds * Q(q, hd, e);
                ref[e] += term, mag[e] += fabs(term);
            }
        }
        const size_t col = (size_t)(pass ? 2 * NH : NH) * HS + (size_t)hd * HS;
        for (int e = 0; e < HS; e++) {
            const double got = h->dqkv[((size_t)b * S + t) * R + col + e];
            const double r = fabs(got - ref[e]) / (rel * mag[e] + (pass ? 1e-30 : floor));
            rb->wrong += !(r <= 1.0);
            worst_b = !(r <= worst_b) ? r : worst_b;
        }
    }
    if (!isnan(rb->worst) && !(worst_b <= rb->worst))
        rb->worst = worst_b;
#undef Q
#undef K
#undef V
#undef DO
#undef OUT
#undef LSE
    free(s), free(ref);
}

/* Copies the device tensors to the host and checks the 8 samples. 0, or -1
 * (out of host memory, in err). */
static int att_check(const ops_t *ops, const att_bufs_t *m, const att_dims_t *d, int bf16, row_t *rf, row_t *rb,
                     char *err, size_t errlen)
{
    const size_t nq = d->N * d->R, no = d->N * (size_t)d->NH * d->HS, nl = (size_t)d->B * d->NH * d->S;
    att_host_t h = {malloc(nq * sizeof(float)), malloc(no * sizeof(float)), malloc(nl * sizeof(float)),
                    malloc(no * sizeof(float)), malloc(nq * sizeof(float))};
    if (!h.qkv || !h.out || !h.lse || !h.dout || !h.dqkv) {
        att_host_free(&h);
        snprintf(err, errlen, "out of host memory for the attention check's copies");
        return -1;
    }
    ops->to_host(ops->ctx, h.qkv, m->qkv, nq * sizeof(float));
    ops->to_host(ops->ctx, h.out, m->out, no * sizeof(float));
    ops->to_host(ops->ctx, h.lse, m->lse, nl * sizeof(float));
    ops->to_host(ops->ctx, h.dout, m->dout, no * sizeof(float));
    ops->to_host(ops->ctx, h.dqkv, m->dqkv, nq * sizeof(float));
    /* |q|, |k|, |v| < 1 and |dout| < 1 (uniform in [-1, 1)) */
    const double floor = ldexp((double)d->HS / sqrt((double)d->HS), -20);
    rf->wrong = rb->wrong = 0;
    rf->worst = rb->worst = 0.0;
    for (int i = 0; i < 8; i++) {
        int b, hd, t;
        if (i < 2) { /* the last row of the last head and sequence; row 0 of the first */
            b = i == 0 ? d->B - 1 : 0, hd = i == 0 ? d->NH - 1 : 0, t = i == 0 ? d->S - 1 : 0;
        } else {
            const uint64_t bits = rng_bits(SEED, 7, (uint64_t)i);
            b = (int)((bits & 0xffff) % (uint64_t)d->B);
            hd = (int)(((bits >> 16) & 0xffff) % (uint64_t)d->NH);
            t = (int)((bits >> 32) % (uint64_t)d->S);
        }
        att_check_sample(&h, d, b, hd, t, bf16, floor, rf, rb);
    }
    att_host_free(&h);
    return 0;
}

/* Times one (S, HS) shape on ops, prints its two rows. 0, or -1 with one line
 * in err (out of memory). */
static int att_row(const ops_t *ops, const bench_opts_t *o, const char *dt, int bf16, int S, int HS, long tokens,
                   long *wrong, char *err, size_t errlen)
{
    att_dims_t d = {.B = tokens / S > 0 ? (int)(tokens / S) : 1, .S = S, .NH = ATT_HIDDEN / HS, .HS = HS};
    d.R = (size_t)3 * d.NH * HS;
    d.N = (size_t)d.B * S;
    const size_t nq = d.N * d.R, no = d.N * (size_t)d.NH * HS, nl = (size_t)d.B * d.NH * S;
    att_bufs_t m = {ops->alloc(ops->ctx, nq * sizeof(float)), ops->alloc(ops->ctx, no * sizeof(float)),
                    ops->alloc(ops->ctx, nl * sizeof(float)), ops->alloc(ops->ctx, no * sizeof(float)),
                    ops->alloc(ops->ctx, nq * sizeof(float))};
    float *stage = malloc((nq > no ? nq : no) * sizeof(float));
    if (!m.qkv || !m.out || !m.lse || !m.dout || !m.dqkv || !stage) {
        snprintf(err, errlen,
                 "attention S %d HS %d: out of %s or host memory for %.2f GiB of tensors (pass smaller "
                 "--tokens or --seqs)",
                 S, HS, ops->name, (double)((2 * nq + 2 * no + nl) * sizeof(float)) / 1073741824.0);
        att_free(ops, &m);
        free(stage);
        return -1;
    }
    fill_uniform(stage, nq, 5);
    ops->from_host(ops->ctx, m.qkv, stage, nq * sizeof(float));
    fill_uniform(stage, no, 6);
    ops->from_host(ops->ctx, m.dout, stage, no * sizeof(float));
    free(stage);
    const int B = d.B, NH = d.NH;
    const double fwd_flop = 4.0 * B * (double)S * S * NH * HS / 2.0; /* causal */
    row_t rf = {0}, rb = {0};
    for (int pass = 0; pass < 2; pass++) { /* 0: forward, 1: backward from the last forward */
        double t0 = 0.0;
        for (long it = 0; it < o->warmup + o->iters; it++) {
            if (it == o->warmup) {
                ops->sync(ops->ctx);
                t0 = now_s();
            }
            if (pass == 0)
                ops->attention_fwd(ops->ctx, m.out, NULL, m.lse, m.qkv, NULL, B, S, NH, NH, HS);
            else
                ops->attention_bwd(ops->ctx, m.dqkv, NULL, m.dout, m.qkv, m.out, m.lse, NULL, B, S, NH, NH, HS);
        }
        ops->sync(ops->ctx);
        const double t = (now_s() - t0) / (double)o->iters;
        row_t *r = pass ? &rb : &rf;
        r->us = t * 1e6;
        r->tflops = (pass ? 2.5 : 1.0) * fwd_flop / t / 1e12;
    }
    if (att_check(ops, &m, &d, bf16, &rf, &rb, err, errlen) != 0) {
        att_free(ops, &m);
        return -1;
    }
    for (int pass = 0; pass < 2; pass++) {
        const row_t *r = pass ? &rb : &rf;
        printf("  %5s %-8s %5d %6d %4d %4d %12.2f %9.4g %7ld %9.1e\n", dt, pass ? "attn-bwd" : "attn-fwd", B, S, NH, HS,
               r->us, r->tflops, r->wrong, r->worst);
        *wrong += r->wrong;
    }
    fflush(stdout);
    att_free(ops, &m);
    return 0;
}

static const int cpu_seqs[] = {128, 256}, cuda_seqs[] = {1024, 2048, 4096, 8192}, default_hdims[] = {64, 128};

/* --op attention: each requested dtype on a backend opened for it. Exit
 * status as main's. */
static int bench_attention(bench_opts_t *o)
{
    char err[512] = "";
    long wrong = 0;
    int first = 1;
    if (o->n_hdims == 0) {
        o->n_hdims = 2;
        memcpy(o->hdims, default_hdims, sizeof default_hdims);
    }
    for (int bf16 = 1; bf16 >= 0; bf16--) {
        if (!(o->dtype & (bf16 ? DT_BF16 : DT_FP32)))
            continue;
        backend_t b;
        if (backend_open(&b, o->device, bf16 ? BACKEND_DTYPE_BF16 : BACKEND_DTYPE_FP32, 0, err, sizeof err) != 0) {
            fprintf(stderr, PROG ": %s%s\n", err, backend_have_cuda() ? " (--device cpu times the CPU instead)" : "");
            return 2;
        }
        if (b.cuda && o->threads >= 0) {
            fprintf(stderr,
                    PROG ": --threads sets the CPU backend's threads, but attention runs on %s: drop --threads, "
                         "or pass --device cpu\n",
                    b.desc);
            backend_close(&b);
            return 2;
        }
        if (o->n_seqs == 0) {
            o->n_seqs = b.cuda ? 4 : 2;
            memcpy(o->seqs, b.cuda ? cuda_seqs : cpu_seqs, (size_t)o->n_seqs * sizeof(int));
        }
        const long tokens = o->tokens ? o->tokens : b.cuda ? 16384 : 512;
        if (first) {
            char where[sizeof b.desc + 32];
            if (b.cuda)
                snprintf(where, sizeof where, "%s", b.desc);
            else {
                const int threads = ops_cpu_threads(o->threads < 0 ? 0 : (int)o->threads);
                snprintf(where, sizeof where, "%s, %d thread%s", b.desc, threads, threads == 1 ? "" : "s");
            }
            printf("# %s: %s; causal attention, hidden %d (NH = %d / HS), B = max(1, %ld / S); TFLOP/s: 4 B S^2 NH "
                   "HS / 2 forward, 2.5x that backward; %ld timed call%s after %ld warm-up, time = mean per call\n",
                   PROG, where, ATT_HIDDEN, ATT_HIDDEN, tokens, o->iters, o->iters == 1 ? "" : "s", o->warmup);
            printf("#\n# %5s %-8s %5s %6s %4s %4s %12s %9s %7s %9s\n", "dtype", "op", "B", "S", "NH", "HS", "time",
                   "TFLOP/s", "#wrong", "err/bound");
            printf("# %5s %-8s %5s %6s %4s %4s %12s %9s %7s %9s\n", "", "", "", "", "", "", "(us)", "", "", "");
            first = 0;
        }
        for (int i = 0; i < o->n_hdims; i++) {
            char path[320];
            const int rounds = backend_attention_desc(&b, o->hdims[i], path, sizeof path);
            printf("# --dtype %s, head size %d: %s\n", bf16 ? "bf16" : "fp32", o->hdims[i], path);
            fflush(stdout);
            for (int j = 0; j < o->n_seqs; j++)
                if (att_row(b.ops, o, bf16 ? "bf16" : "fp32", rounds, o->seqs[j], o->hdims[i], tokens, &wrong, err,
                            sizeof err) != 0) {
                    fprintf(stderr, PROG ": %s\n", err);
                    backend_close(&b);
                    return 2;
                }
        }
        backend_close(&b);
    }
    printf("# Wrong values : %ld %s (8 sampled rows per shape: out, lse, dq, dk, dv against a double-precision "
           "attention; bound 2^-7 (tensor cores, bf16) or 1e-4 (fp32) of the summed magnitudes, lse 1e-5)\n#\n",
           wrong, wrong ? "FAILED" : "OK");
    fflush(stdout);
    return wrong ? 1 : 0;
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
    if (o.op == OP_ATT)
        return bench_attention(&o);
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
