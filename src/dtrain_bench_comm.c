/* dtrain-bench-comm: collective bandwidth of the communicator (mpi/comm.h)
 * in the style of nccl-tests.
 *
 *   mpirun -np N dtrain-bench-comm [--op allreduce|reduce_scatter|allgather|sendrecv|all]
 *       [--min-bytes 1K] [--max-bytes 1G] [--step-factor 2] [--iters 20] [--warmup 5]
 *
 * For each size: the first call is checked against exactly known values
 * (#wrong, summed over ranks), then --warmup untimed calls, then --iters
 * timed calls; time is the mean per call, the maximum over ranks. algbw is
 * size / time; busbw scales it by nccl-tests' factors (allreduce 2(n-1)/n,
 * reduce_scatter and allgather (n-1)/n, sendrecv 1), so that it is
 * comparable with the hardware's link bandwidth whatever n is. Size is the
 * buffer of one rank for allreduce and sendrecv, and the whole gathered
 * (or scattered) buffer for allgather and reduce_scatter, as in nccl-tests.
 * GB = 1e9 bytes. */
#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/comm.h"
#include "mpi/launch.h"
#include "src/cli/optable.h"
#include "src/cli/strparse.h"

#ifdef HAVE_CONFIG_H
#include "config.h"
#endif
#ifndef PACKAGE_VERSION
#define PACKAGE_VERSION "0.1.0"
#endif

#define PROG "dtrain-bench-comm"

typedef enum { OP_ALLREDUCE = 0, OP_REDUCE_SCATTER, OP_ALLGATHER, OP_SENDRECV, N_OPS, OP_ALL = N_OPS } op_t;
static const char *const op_names[] = {"allreduce", "reduce_scatter", "allgather", "sendrecv", "all", NULL};

typedef struct bench_opts {
    op_t op;
    size_t min_bytes, max_bytes;
    const char *min_text, *max_text; /* as given, for the error naming both */
    double factor;
    long iters, warmup;
} bench_opts_t;

/* Bytes: digits with an optional K, M or G (powers of 1024). */
static int parse_size(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -1;
    unsigned long long mul = 1;
    switch (*end) {
    case '\0': break;
    case 'K':
    case 'k':
        mul = 1ull << 10;
        end++;
        break;
    case 'M':
    case 'm':
        mul = 1ull << 20;
        end++;
        break;
    case 'G':
    case 'g':
        mul = 1ull << 30;
        end++;
        break;
    default: return -1;
    }
    if (*end != '\0' || v > (unsigned long long)SIZE_MAX / mul)
        return -1;
    *out = (size_t)(v * mul);
    return 0;
}

/* --min-bytes / --max-bytes: a size from 4 bytes to 1024G. */
static int set_bytes(const char *name, const char *val, size_t *out, const char **text, char *err, size_t errlen)
{
    size_t v = 0;
    if (parse_size(val, &v) != 0) {
        snprintf(err, errlen, "%s '%s': not a size (an integer with an optional K, M or G suffix)", name, val);
        return -1;
    }
    if (v < sizeof(float) || v > ((size_t)1 << 40)) {
        snprintf(err, errlen, "%s %s: out of range (4 bytes to 1024G)", name, val);
        return -1;
    }
    *out = v;
    *text = val;
    return 0;
}

static int min_bytes_arg(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    return set_bytes("--min-bytes", val, field, &((bench_opts_t *)dst)->min_text, err, errlen);
}

static int max_bytes_arg(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    return set_bytes("--max-bytes", val, field, &((bench_opts_t *)dst)->max_text, err, errlen);
}

/* --step-factor: above 1 (the sizes must grow), at most 1024. */
static int factor_arg(const char *val, void *dst, void *field, char *err, size_t errlen)
{
    char *end = NULL;
    (void)dst;
    errno = 0;
    double f = strtod(val, &end);
    if (errno || end == val || *end != '\0') {
        snprintf(err, errlen, "--step-factor '%s': not a number", val);
        return -1;
    }
    if (!(f > 1.0 && f <= 1024.0)) {
        snprintf(err, errlen, "--step-factor %s: out of range (above 1, at most 1024)", val);
        return -1;
    }
    *(double *)field = f;
    return 0;
}

#define F(field) offsetof(bench_opts_t, field)
/* clang-format off: one option a line, as --help lists them */
static const opt_def_t opt_defs[] = {
    {"op", OPT_ENUM, F(op), 0, "allreduce", 0, 0, op_names,
     "allreduce|reduce_scatter|allgather|sendrecv|all (default allreduce)", "NAME", NULL, 0},
    {"min-bytes", OPT_ARG, F(min_bytes), 0, "1K", 0, 0, NULL,
     "smallest size (default 1K); suffixes K, M, G are powers of 1024", "SIZE", min_bytes_arg, 0},
    {"max-bytes", OPT_ARG, F(max_bytes), 0, "1G", 0, 0, NULL, "largest size (default 1G)", "SIZE", max_bytes_arg, 0},
    {"step-factor", OPT_ARG, F(factor), 0, "2", 0, 0, NULL,
     "multiply the size by F from one row to the next (default 2)", "F", factor_arg, 0},
    {"iters", OPT_LONG, F(iters), 0, "20", 1, 1000000000, NULL, "timed calls per size (default 20)", "N", NULL, 0},
    {"warmup", OPT_LONG, F(warmup), 0, "5", 0, 1000000000, NULL, "untimed calls per size before timing (default 5)",
     "N", NULL, 0},
};
/* clang-format on */
#undef F
static const opt_table_t opt_table = {.prog = PROG, .defs = opt_defs, .n = sizeof opt_defs / sizeof opt_defs[0]};

static void usage(FILE *f)
{
    fprintf(f, "Usage: mpirun -np N " PROG " [OPTION]...\n"
               "Measure the communicator's collectives (nccl-tests style): time, algbw, busbw, #wrong.\n"
               "\n");
    opt_print_help(&opt_table, f, 18, 0);
}

/* Returns 0 to run, 1 for --help/--version (done), 2 with one line in err. */
static int parse_args(int argc, char **argv, bench_opts_t *o, char *err, size_t errlen, int print)
{
    memset(o, 0, sizeof *o);
    if (opt_answer_help(argc, argv, print, usage, PROG " " PACKAGE_VERSION))
        return 1;
    if (opt_defaults(&opt_table, o, err, errlen) != 0 ||
        opt_parse_argv(&opt_table, argc, argv, o, NULL, NULL, NULL, err, errlen) != 0)
        return 2;
    if (o->min_bytes > o->max_bytes) {
        snprintf(err, errlen, "--min-bytes %s exceeds --max-bytes %s", o->min_text, o->max_text);
        return 2;
    }
    return 0;
}

/* ------------------------------------------------------------ one op */

typedef struct bench {
    op_t op;
    comm_t *c;
    float *a, *b; /* allreduce: a; others: a = send, b = recv */
} bench_t;

/* Elements in the call's "count" for a size in bytes (0: size too small). */
static size_t op_count(op_t op, size_t bytes, int p)
{
    size_t n = bytes / sizeof(float);
    if (op == OP_REDUCE_SCATTER || op == OP_ALLGATHER)
        n = n / (size_t)p * (size_t)p;
    return n;
}

static double bus_factor(op_t op, int p)
{
    switch (op) {
    case OP_ALLREDUCE: return 2.0 * (p - 1) / p;
    case OP_REDUCE_SCATTER:
    case OP_ALLGATHER: return (double)(p - 1) / p;
    default: return 1.0;
    }
}

/* Exactly representable inputs whose results are known in closed form. */
static float val(size_t i, int rank) { return (float)(i % 61) + (float)(rank * 64); }

static void fill(const bench_t *bt, size_t count)
{
    const int p = bt->c->size, r = bt->c->rank;
    switch (bt->op) {
    case OP_ALLREDUCE:
    case OP_REDUCE_SCATTER:
        for (size_t i = 0; i < count; i++)
            bt->a[i] = (float)(i % 61) + (float)r;
        break;
    case OP_ALLGATHER:
        for (size_t i = 0; i < count / (size_t)p; i++)
            bt->a[i] = val(i, r);
        break;
    default:
        for (size_t i = 0; i < count; i++)
            bt->a[i] = val(i, r);
    }
}

static long check(const bench_t *bt, size_t count)
{
    const int p = bt->c->size, r = bt->c->rank;
    const float tri = (float)(p * (p - 1) / 2);
    long wrong = 0;
    switch (bt->op) {
    case OP_ALLREDUCE:
        for (size_t i = 0; i < count; i++)
            wrong += bt->a[i] != (float)p * (float)(i % 61) + tri;
        break;
    case OP_REDUCE_SCATTER: {
        size_t each = count / (size_t)p;
        for (size_t i = 0; i < each; i++)
            wrong += bt->b[i] != (float)p * (float)(((size_t)r * each + i) % 61) + tri;
        break;
    }
    case OP_ALLGATHER: {
        size_t each = count / (size_t)p;
        for (int q = 0; q < p; q++)
            for (size_t i = 0; i < each; i++)
                wrong += bt->b[(size_t)q * each + i] != val(i, q);
        break;
    }
    default:
        for (size_t i = 0; i < count; i++)
            wrong += bt->b[i] != val(i, (r + p - 1) % p);
    }
    return wrong;
}

/* One operation; the communicator's message in err on failure. */
static status_t run_once(const bench_t *bt, size_t count, char *err, size_t errlen)
{
    comm_t *c = bt->c;
    const int p = c->size;
    switch (bt->op) {
    case OP_ALLREDUCE: return c->ops->allreduce(c, bt->a, count, COMM_FP32, COMM_SUM, err, errlen);
    case OP_REDUCE_SCATTER: return c->ops->reduce_scatter(c, bt->a, bt->b, count / (size_t)p, COMM_FP32, err, errlen);
    case OP_ALLGATHER: return c->ops->allgather(c, bt->a, bt->b, count / (size_t)p, COMM_FP32, err, errlen);
    default: {
        comm_req_t rs = {0}, rr = {0};
        CHECK(c->ops->irecv(c, bt->b, count, COMM_FP32, (c->rank + p - 1) % p, 0, &rr, err, errlen));
        CHECK(c->ops->isend(c, bt->a, count, COMM_FP32, (c->rank + 1) % p, 0, &rs, err, errlen));
        CHECK(c->ops->wait(&rs, err, errlen));
        return c->ops->wait(&rr, err, errlen);
    }
    }
}

/* Both buffers for op's largest size, agreed over all ranks. 0, or -1
 * after an agreed failure (nothing left allocated). */
static int alloc_buffers(const launch_env_t *env, bench_t *bt, const bench_opts_t *o)
{
    const op_t op = bt->op;
    const int p = bt->c->size;
    const size_t maxn = op_count(op, o->max_bytes, p);
    size_t na = maxn, nb = 0;
    if (op == OP_REDUCE_SCATTER)
        nb = maxn / (size_t)p;
    else if (op == OP_ALLGATHER)
        na = maxn / (size_t)p, nb = maxn;
    else if (op == OP_SENDRECV)
        nb = maxn;
    bt->a = malloc((na ? na : 1) * sizeof(float));
    bt->b = malloc((nb ? nb : 1) * sizeof(float));
    char msg[600] = "";
    if (!bt->a || !bt->b)
        snprintf(msg, sizeof msg, "%s: out of memory for %zu bytes of buffers (lower --max-bytes)", op_names[op],
                 (na + nb) * sizeof(float));
    if (launch_any_failed(env, PROG, !bt->a || !bt->b, msg)) {
        free(bt->a);
        free(bt->b);
        return -1;
    }
    return 0;
}

/* The op's title and the column heads (rank 0 only). */
static void print_header(const comm_t *c, op_t op, const bench_opts_t *o)
{
    const int p = c->size;
    printf("# %s: %s, %d rank%s, comm %s, float%s, %ld timed call%s after %ld warm-up, "
           "time = mean per call (max over ranks)\n",
           PROG, op_names[op], p, p == 1 ? "" : "s", c->ops->name,
           op == OP_ALLREDUCE        ? " sum in place"
           : op == OP_REDUCE_SCATTER ? " sum"
                                     : "",
           o->iters, o->iters == 1 ? "" : "s", o->warmup);
    printf("#\n# %12s %12s %6s %6s %11s %8s %8s %7s\n", "size", "count", "type", "redop", "time", "algbw", "busbw",
           "#wrong");
    printf("# %12s %12s %6s %6s %11s %8s %8s %7s\n", "(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "");
}

/* One size of count elements: the checked call, the warm-up, the timed
 * calls, and rank 0's row. Returns the wrong values summed over ranks and
 * sets *busbw (GB/s), or -1 after an agreed failure. */
static long bench_size(const launch_env_t *env, const bench_t *bt, size_t count, const bench_opts_t *o, double *busbw)
{
    const op_t op = bt->op;
    const int p = bt->c->size;
    fill(bt, count);
    char cerr[COMM_ERR_MAX] = "";
    int failed = run_once(bt, count, cerr, sizeof cerr) != STATUS_OK;
    long wrong = failed ? 0 : check(bt, count), wrong_all = 0;
    if (op == OP_ALLREDUCE) /* in place: keep the timed calls' values finite */
        memset(bt->a, 0, count * sizeof(float));
    for (long it = 0; it < o->warmup && !failed; it++)
        failed = run_once(bt, count, cerr, sizeof cerr) != STATUS_OK;
    launch_mpi_check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
    double t0 = MPI_Wtime();
    for (long it = 0; it < o->iters && !failed; it++)
        failed = run_once(bt, count, cerr, sizeof cerr) != STATUS_OK;
    double t = (MPI_Wtime() - t0) / (double)o->iters, tmax = 0.0;
    if (launch_any_failed(env, PROG, failed, cerr))
        return -1;
    launch_mpi_check(MPI_Allreduce(&t, &tmax, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    launch_mpi_check(MPI_Allreduce(&wrong, &wrong_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
    const size_t size = count * sizeof(float);
    const double algbw = (double)size / 1e9 / tmax;
    *busbw = algbw * bus_factor(op, p);
    if (bt->c->rank == 0)
        printf("  %12zu %12zu %6s %6s %11.2f %8.3f %8.3f %7ld\n", size, count, "float",
               op == OP_ALLREDUCE || op == OP_REDUCE_SCATTER ? "sum" : "none", tmax * 1e6, algbw, *busbw, wrong_all);
    fflush(stdout);
    return wrong_all;
}

/* The op's verdict and mean bus bandwidth over its rows (rank 0 only). */
static void print_summary(long wrong_total, double bus_sum, int rows)
{
    printf("# Wrong values   : %ld %s\n", wrong_total, wrong_total ? "FAILED" : "OK");
    if (rows)
        printf("# Avg bus bandwidth : %.3f GB/s\n#\n", bus_sum / rows);
    else
        printf("# no size in [--min-bytes, --max-bytes] holds a float per rank\n#\n");
    fflush(stdout);
}

/* Runs one op over all sizes; returns the number of wrong values (>= 0),
 * or -1 after an error that every rank has agreed on. */
static long bench_op(const launch_env_t *env, comm_t *c, op_t op, const bench_opts_t *o)
{
    const int p = c->size, rank0 = c->rank == 0;
    bench_t bt = {.op = op, .c = c};
    if (alloc_buffers(env, &bt, o) != 0)
        return -1;
    if (rank0)
        print_header(c, op, o);
    long wrong_total = 0;
    double bus_sum = 0.0;
    int rows = 0;
    for (size_t bytes = o->min_bytes;;) {
        const size_t count = op_count(op, bytes, p);
        if (count > 0) {
            double busbw = 0.0;
            long wrong_all = bench_size(env, &bt, count, o, &busbw);
            if (wrong_all < 0) {
                free(bt.a);
                free(bt.b);
                return -1;
            }
            wrong_total += wrong_all;
            bus_sum += busbw;
            rows++;
        }
        if ((double)bytes * o->factor > (double)o->max_bytes)
            break;
        size_t next = (size_t)((double)bytes * o->factor);
        bytes = next > bytes ? next : bytes + 1;
    }
    if (rank0)
        print_summary(wrong_total, bus_sum, rows);
    free(bt.a);
    free(bt.b);
    return wrong_total;
}

int main(int argc, char **argv)
{
    launch_env_t env;
    launch_init(&env, &argc, &argv);
    bench_opts_t o;
    char err[512] = "";
    int rc = parse_args(argc, argv, &o, err, sizeof err, env.world_rank == 0);
    if (rc != 0) {
        /* every rank parsed the same arguments: all leave alike */
        if (rc == 2 && env.world_rank == 0)
            fprintf(stderr, PROG ": %s\n", err);
        launch_exit(&env, rc == 1 ? 0 : 2);
    }
    MPI_Comm world = MPI_COMM_WORLD;
    comm_t *c = comm_mpi_create(&world);
    if (launch_any_failed(&env, PROG, c == NULL, "cannot create the communicator (comm_mpi_create failed)"))
        launch_exit(&env, 1);
    if (env.world_rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING] = "";
        int len = 0;
        if (MPI_Get_library_version(lib, &len) == MPI_SUCCESS) {
            char *nl = strchr(lib, '\n');
            if (nl)
                *nl = '\0';
            printf("# %s\n", lib);
        }
    }
    int status = 0;
    for (int op = 0; op < N_OPS; op++) {
        if (o.op != OP_ALL && o.op != (op_t)op)
            continue;
        long wrong = bench_op(&env, c, (op_t)op, &o);
        if (wrong != 0)
            status = 1; /* wrong values: go on with the other ops */
        if (wrong < 0)
            break; /* an error every rank agreed on, printed once */
    }
    c->ops->destroy(c);
    launch_exit(&env, status);
    return status;
}
