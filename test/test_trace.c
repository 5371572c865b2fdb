/* The span recorder and merged trace writer (mpi/trace.c) and the
 * communication spans of mpi/comm_mpi.c. Run by test_trace.sh at np 2 and
 * 3; test/check_trace.py then checks the files on numbers.
 *
 *   test_trace OUT.json EXPECT.json SMALL.json BADPATH DIRPATH
 *
 * Every rank records, on one comm "world" with comm->trace set:
 *   spin       compute span, spins for 10 + 5*rank ms (args microbatch =
 *              rank, layer = 7); its measured duration goes to EXPECT;
 *   before_barrier, after_barrier  zero-length marks around an
 *              MPI_Barrier: on a common clock no rank leaves the barrier
 *              before every rank entered it (clock alignment);
 *   window_*   compute spans that bracket a comm call from the caller's
 *              side: the comm span must lie inside its window;
 *   and the comm calls, in this order: allreduce (12345 floats), iallreduce
 *   (777 floats, completed by test() in a loop), iallreduce A (64) and B
 *   (96) overlapping partly (wait A, spin 2 ms, wait B), reduce_scatter
 *   (10 per rank), allgather (3 per rank), bcast (50 floats, root size-1),
 *   ireduce_scatter and iallgather (the same sizes), the bf16 sums
 *   (allreduce_bf16 of 300, iallreduce_bf16 of 200, reduce_scatter_bf16
 *   and ireduce_scatter_bf16 of 10 per rank), isend/irecv ring (100 + rank floats to rank+1), send/recv ring (20 +
 *   rank floats to rank+1; even ranks send first), barrier.
 * Then it writes OUT, SMALL (a trace capped at 4 spans that recorded 7),
 * and checks here that writing to BADPATH (in a missing directory) and to
 * DIRPATH (an existing directory) fails on every rank with the same
 * one-line message and leaves no file. Exit 0 when all checks passed on
 * every rank. */
#define _POSIX_C_SOURCE 200809L

#include "mpi/comm.h"
#include "mpi/ddp.h"
#include "mpi/trace.h"
#include "src/backend/ops_cpu.h"

#include <dirent.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int g_rank, g_size, g_fails;

static void die(const char *what, const char *detail)
{
    fprintf(stderr, "test_trace: rank %d: %s: %s\n", g_rank, what, detail ? detail : "");
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Agreed over the world; rank 0 prints the line. */
static void check(int ok, const char *name, const char *detail)
{
    int all = 0;
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allreduce", "check");
    if (!ok)
        printf("FAIL np=%d rank %d %s: %s\n", g_size, g_rank, name, detail ? detail : "");
    else if (all && g_rank == 0)
        printf("ok   np=%d %s%s%s\n", g_size, name, detail ? ": " : "", detail ? detail : "");
    fflush(stdout);
    g_fails += !all;
}

static double spin(double seconds)
{
    double t0 = trace_now();
    while (trace_now() - t0 < seconds)
        ;
    return trace_now();
}

static const trace_args_t no_args = {.bytes = -1, .microbatch = -1, .layer = -1, .peer = -1};

/* cerr: the call's error buffer */
static void need(const char *cerr, int rc)
{
    if (rc != 0)
        die("comm", cerr);
}

/* The span [t0, now] named name on the compute lane. */
static void window(trace_t *tr, const char *name, double t0)
{
    trace_span(tr, TRACE_COMPUTE, name, t0, trace_now(), &no_args);
}

/* The bad-path checks: -1 on every rank, one line naming want_part, the
 * same text everywhere, no file at path and no temporary beside it. */
static void expect_failure(trace_t *tr, const char *path, int is_dir, const char *label, const char *want)
{
    char err[512] = "x";
    int rc = trace_write_merged(tr, &(MPI_Comm){MPI_COMM_WORLD}, path, err, sizeof err);
    char detail[700];
    snprintf(detail, sizeof detail, "rc %d: %s", rc, err);
    int ok = rc == -1 && strchr(err, '\n') == NULL && strstr(err, path) && strstr(err, want);
    check(ok, label, ok ? err : detail);
    /* same message on every rank: compare with rank 0's */
    char root[512];
    memcpy(root, err, sizeof root);
    if (MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Bcast", "err");
    check(strcmp(root, err) == 0, "same error line on every rank", NULL);
    struct stat st;
    int gone = is_dir ? stat(path, &st) == 0 && S_ISDIR(st.st_mode) /* still the directory */
                      : stat(path, &st) != 0;
    /* no "<name>.tmp.*" left beside path */
    char parent[4096];
    snprintf(parent, sizeof parent, "%s", path);
    char *slash = strrchr(parent, '/');
    if (slash)
        *slash = '\0';
    DIR *d = opendir(slash ? parent : ".");
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    char left[300] = "";
    for (struct dirent *e; d && (e = readdir(d));)
        if (strncmp(e->d_name, base, strlen(base)) == 0 && strstr(e->d_name, ".tmp."))
            snprintf(left, sizeof left, "%s", e->d_name);
    if (d)
        closedir(d);
    check(gone && !left[0], "no file and no temporary left", left[0] ? left : NULL);
}

int main(int argc, char **argv)
{
    char cerr[COMM_ERR_MAX] = "";
    if (MPI_Init(&argc, &argv) != MPI_SUCCESS)
        return 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    if (argc != 6)
        die("usage", "test_trace OUT.json EXPECT.json SMALL.json BADPATH DIRPATH");
    const char *out = argv[1], *expect = argv[2], *small = argv[3], *bad = argv[4], *dirpath = argv[5];
    const int W = g_size, r = g_rank, next = (r + 1) % W, prev = (r + W - 1) % W;

    /* a NULL recorder ignores everything */
    trace_span(NULL, TRACE_COMPUTE, "nothing", 0, 1, NULL);
    check(trace_count(NULL) == 0 && trace_dropped(NULL) == 0, "NULL trace is a no-op", NULL);

    char label[64];
    snprintf(label, sizeof label, "rank %d (test np %d)", r, W);
    trace_t *tr = trace_create(r, label, 0);
    comm_t *c = comm_mpi_create(&(MPI_Comm){MPI_COMM_WORLD});
    if (!tr || !c)
        die("create", "out of memory or comm_mpi_create failed");
    snprintf(c->name, sizeof c->name, "world");

    /* an untraced call records nothing */
    float one = 1;
    need(cerr, c->ops->allreduce(c, &one, 1, COMM_FP32, COMM_SUM, cerr, sizeof cerr));
    check(trace_count(tr) == 0, "untraced comm records no span", NULL);
    c->trace = tr;

    /* spin: a known compute span */
    double t0 = trace_now(), t1 = spin(0.010 + 0.005 * r);
    trace_span(tr, TRACE_COMPUTE, "spin", t0, t1,
               &(trace_args_t){.bytes = -1, .microbatch = r, .layer = 7, .peer = -1});
    double spin_us = (t1 - t0) * 1e6;

    double tb = trace_now();
    trace_span(tr, TRACE_COMPUTE, "before_barrier", tb, tb, &no_args);
    if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Barrier", "");
    tb = trace_now();
    trace_span(tr, TRACE_COMPUTE, "after_barrier", tb, tb, &no_args);

    size_t nbig = 12345;
    float *big = malloc(nbig * sizeof *big);
    float *rs = malloc((size_t)W * 100 * sizeof *rs);
    if (!big || !rs)
        die("malloc", "");
    for (size_t i = 0; i < nbig; i++)
        big[i] = 1;
    for (size_t i = 0; i < (size_t)W * 100; i++)
        rs[i] = 0;

    t0 = trace_now();
    need(cerr, c->ops->allreduce(c, big, nbig, COMM_FP32, COMM_SUM, cerr, sizeof cerr));
    window(tr, "window_allreduce", t0);

    /* iallreduce completed by test(): window_post brackets the posting call,
     * window_test the test() call that returned done */
    comm_req_t q = {0};
    t0 = trace_now();
    need(cerr, c->ops->iallreduce(c, big, 777, COMM_FP32, COMM_SUM, &q, cerr, sizeof cerr));
    window(tr, "window_post", t0);
    int done = 0, tests = 0;
    while (!done) {
        t0 = trace_now();
        need(cerr, c->ops->test(&q, &done, cerr, sizeof cerr));
        tests++;
        if (done)
            window(tr, "window_test", t0);
    }

    /* A and B overlap partly: A [a0, a1], B [b0, b1], a0 < b0 < a1 < b1 */
    comm_req_t qa = {0}, qb = {0};
    need(cerr, c->ops->iallreduce(c, big, 64, COMM_FP32, COMM_SUM, &qa, cerr, sizeof cerr));
    need(cerr, c->ops->iallreduce(c, big + 64, 96, COMM_FP32, COMM_SUM, &qb, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&qa, cerr, sizeof cerr));
    spin(0.002);
    need(cerr, c->ops->wait(&qb, cerr, sizeof cerr));

    need(cerr, c->ops->reduce_scatter(c, rs, rs, 10, COMM_FP32, cerr, sizeof cerr));
    need(cerr, c->ops->allgather(c, rs + (size_t)r * 3, rs, 3, COMM_FP32, cerr, sizeof cerr));
    need(cerr, c->ops->broadcast(c, big, 50, COMM_FP32, W - 1, cerr, sizeof cerr));
    need(cerr, c->ops->ireduce_scatter(c, rs, rs, 10, COMM_FP32, &q, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&q, cerr, sizeof cerr));
    need(cerr, c->ops->iallgather(c, rs + (size_t)r * 3, rs, 3, COMM_FP32, &q, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&q, cerr, sizeof cerr));
    /* the bf16 sums: same spans, "_bf16" names, 2 bytes per element */
    uint16_t *h = calloc((size_t)W * 300, sizeof *h);
    if (!h)
        die("calloc", "");
    need(cerr, c->ops->allreduce(c, h, 300, COMM_BF16, COMM_SUM, cerr, sizeof cerr));
    need(cerr, c->ops->iallreduce(c, h, 200, COMM_BF16, COMM_SUM, &q, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&q, cerr, sizeof cerr));
    need(cerr, c->ops->reduce_scatter(c, h, h + (size_t)W * 10, 10, COMM_BF16, cerr, sizeof cerr));
    need(cerr, c->ops->ireduce_scatter(c, h, h, 10, COMM_BF16, &q, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&q, cerr, sizeof cerr));
    free(h);

    comm_req_t qs = {0}, qr = {0};
    need(cerr, c->ops->irecv(c, rs, (size_t)(100 + prev), COMM_FP32, prev, 5, &qr, cerr, sizeof cerr));
    need(cerr, c->ops->isend(c, big, (size_t)(100 + r), COMM_FP32, next, 5, &qs, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&qs, cerr, sizeof cerr));
    need(cerr, c->ops->wait(&qr, cerr, sizeof cerr));

    if (r % 2 == 0) {
        need(cerr, c->ops->send(c, big, (size_t)(20 + r), COMM_FP32, next, 6, cerr, sizeof cerr));
        need(cerr, c->ops->recv(c, rs, (size_t)(20 + prev), COMM_FP32, prev, 6, cerr, sizeof cerr));
    } else {
        need(cerr, c->ops->recv(c, rs, (size_t)(20 + prev), COMM_FP32, prev, 6, cerr, sizeof cerr));
        need(cerr, c->ops->send(c, big, (size_t)(20 + r), COMM_FP32, next, 6, cerr, sizeof cerr));
    }
    need(cerr, c->ops->barrier(c, cerr, sizeof cerr));

    /* bucketed DDP under a simulated backward: 4 tensors of 4096 floats, one
     * bucket each; "bwd h.L" spins 3 + rank ms, then reports tensor L
     * final. Rank 0 is fastest, so its buckets stay in flight across its
     * next bwd span: the iallreduce spans must overlap bwd spans. */
    size_t starts[4] = {0, 4096, 8192, 12288};
    float *grads = calloc(4 * 4096, sizeof *grads);
    const ops_t *cpu = ops_cpu_create();
    ddp_t d;
    if (!grads || !cpu ||
        ddp_create(&d, cpu, NULL, DDP_BUCKETED, c, grads, 4 * 4096, starts, 4, 4096 * sizeof(float), COMM_FP32, cerr,
                   sizeof cerr) != 0)
        die("ddp_create", cerr);
    ddp_begin(&d);
    for (int l = 3; l >= 0; l--) {
        t0 = trace_now();
        spin(0.003 + 0.001 * r);
        trace_span(tr, TRACE_COMPUTE, "bwd", t0, trace_now(),
                   &(trace_args_t){.bytes = -1, .microbatch = 0, .layer = l, .peer = -1});
        need(cerr, ddp_grads_ready(&d, starts[l], cerr, sizeof cerr));
    }
    need(cerr, ddp_finish(&d, cerr, sizeof cerr));
    ddp_destroy(&d);
    ops_release(cpu);
    free(grads);

    size_t n_spans = trace_count(tr);
    /* 6 + 4 compute spans (spin, before_barrier, after_barrier,
     * window_allreduce, window_post, window_test, 4 bwd) and 14 + 4 bf16
     * + 4 comm spans */
    char detail[128];
    snprintf(detail, sizeof detail, "%zu spans recorded, %d test() calls", n_spans, tests);
    check(n_spans == 10 + 22 && trace_dropped(tr) == 0, "span count 32", detail);

    char err[512] = "";
    int rc = trace_write_merged(tr, &(MPI_Comm){MPI_COMM_WORLD}, out, err, sizeof err);
    check(rc == 0 && err[0] == '\0', "trace_write_merged", rc ? err : out);

    /* expectations for the checker */
    double *all_spin = malloc((size_t)W * sizeof *all_spin);
    if (!all_spin || MPI_Gather(&spin_us, 1, MPI_DOUBLE, all_spin, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Gather", "spin");
    if (r == 0) {
        FILE *f = fopen(expect, "w");
        if (!f)
            die("fopen", expect);
        fprintf(f, "{\"np\": %d, \"spin_us\": [", W);
        for (int i = 0; i < W; i++)
            fprintf(f, "%s%.3f", i ? ", " : "", all_spin[i]);
        fprintf(f, "]}\n");
        if (fclose(f) != 0)
            die("fclose", expect);
    }
    free(all_spin);

    /* the cap: 4 kept, 3 dropped, noted in the file */
    trace_t *cap = trace_create(r, label, 4);
    if (!cap)
        die("trace_create", "cap");
    for (int i = 0; i < 7; i++)
        trace_span(cap, TRACE_COMPUTE, "capped", i * 1e-3, (i + 1) * 1e-3, NULL);
    check(trace_count(cap) == 4 && trace_dropped(cap) == 3, "cap 4: 4 kept, 3 dropped", NULL);
    rc = trace_write_merged(cap, &(MPI_Comm){MPI_COMM_WORLD}, small, err, sizeof err);
    check(rc == 0, "trace_write_merged (capped)", rc ? err : NULL);

    expect_failure(tr, bad, 0, "missing directory: clear error", "No such file or directory");
    expect_failure(tr, dirpath, 1, "path is a directory: clear error", "Is a directory");

    trace_destroy(cap);
    trace_destroy(tr);
    c->ops->destroy(c);
    free(big);
    free(rs);
    if (r == 0)
        printf("%d failure(s)\n", g_fails);
    MPI_Finalize();
    return g_fails ? 1 : 0;
}
