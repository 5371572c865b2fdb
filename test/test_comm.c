/* The MPI communicator (mpi/comm_mpi.c) and data-parallel gradient
 * averaging (mpi/ddp.c), on synthetic buffers, at whatever size it is
 * started with (test_comm.sh runs np 1..4).
 *
 * Values are integers small enough that every partial sum is exact in
 * fp32, so the expected results are exact whatever order MPI sums in, and
 * the checks compare with ==. The bf16 collectives and DDP with bf16
 * reductions are checked the same way on integers exact in bf16, and on
 * random values against the bound of per-step rounding (see "bf16"). Each check is agreed over all ranks (an
 * MPI_Allreduce), rank 0 prints one line with the lowest failing rank's
 * detail, and every rank exits with the same status. */
#define _POSIX_C_SOURCE 200809L /* setenv, unsetenv */

#include "base/ops_math.h"
#include "mpi/comm.h"
#include "mpi/ddp.h"
#include "src/backend/ops_cpu.h"

#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdint.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int g_rank, g_size, g_checks, g_fails;
static const ops_t *g_ops; /* the CPU backend the DDP checks run on */

static void die(const char *what)
{
    fprintf(stderr, "test_comm: rank %d: %s\n", g_rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Collective over the world: ok is this rank's verdict, detail its reason
 * when !ok. Returns 1 when every rank passed. Every rank makes the same
 * sequence of calls, whatever its group. */
static int check(int ok, const char *detail, const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    int mine = ok ? g_size : g_rank, first = 0;
    if (MPI_Allreduce(&mine, &first, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allreduce(check)");
    g_checks++;
    if (first == g_size) {
        if (g_rank == 0)
            printf("ok   np=%d %s\n", g_size, name);
        return 1;
    }
    g_fails++;
    char buf[512] = "";
    if (g_rank == first)
        snprintf(buf, sizeof buf, "%s", detail ? detail : "");
    if (MPI_Bcast(buf, sizeof buf, MPI_CHAR, first, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Bcast(check)");
    if (g_rank == 0)
        printf("FAIL np=%d %s: rank %d: %s\n", g_size, name, first, buf);
    fflush(stdout);
    return 0;
}

static void info(const char *fmt, ...)
{
    if (g_rank != 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    printf("info np=%d ", g_size);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* 1 when got[i] == want[i] for all i; else the first difference in detail. */
static int same(const float *got, const float *want, size_t n, char *detail, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (!(got[i] == want[i])) {
            snprintf(detail, len, "element %zu of %zu is %.9g, want %.9g", i, n, (double)got[i], (double)want[i]);
            return 0;
        }
    return 1;
}

static float *falloc(size_t n)
{
    float *p = malloc((n ? n : 1) * sizeof *p);
    if (!p)
        die("out of memory");
    return p;
}

/* A comm call that must succeed; its message (cerr, the call's error
 * buffer) goes into detail. */
static int call_ok(const char *cerr, int rc, char *detail, size_t len)
{
    if (rc != 0)
        snprintf(detail, len, "returned %d: %.400s", rc, cerr);
    return rc == 0;
}

/* Tests until done; counts the test calls. */
static int test_loop(comm_t *c, comm_req_t *req, long *calls, char *cerr, size_t errlen)
{
    int done = 0;
    *calls = 0;
    while (!done) {
        if (c->ops->test(req, &done, cerr, errlen) != 0)
            return -1;
        ++*calls;
    }
    return 0;
}

/* ------------------------------------------------------- the other types */

/* int32 min, int64 max, fp64 sum (exact: integers), bytes broadcast,
 * allgather and a ring of sends; n = 2500 crosses the chunked limit. bf16
 * takes the sum only. */
static void run_typed(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, r = c->rank;
    const size_t n = 2500;
    int32_t *i32 = malloc(n * sizeof *i32);
    int64_t *i64 = malloc(n * sizeof *i64);
    double *f64 = malloc(n * sizeof *f64);
    uint8_t *u8 = malloc(n * (size_t)(p + 1));
    if (!i32 || !i64 || !f64 || !u8)
        die("out of memory");
    char d[512] = "";
    for (size_t i = 0; i < n; i++) {
        i32[i] = (int32_t)(i % 97) - 40 * r;
        i64[i] = ((int64_t)1 << 40) * r + (int64_t)i;
        f64[i] = (double)i + 0.5 * r;
    }
    int ok = call_ok(cerr, c->ops->allreduce(c, i32, n, COMM_INT32, COMM_MIN, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->allreduce(c, i64, n, COMM_INT64, COMM_MAX, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->allreduce(c, f64, n, COMM_FP64, COMM_SUM, cerr, sizeof cerr), d, sizeof d);
    for (size_t i = 0; ok && i < n; i++)
        ok = i32[i] == (int32_t)(i % 97) - 40 * (p - 1) && i64[i] == ((int64_t)1 << 40) * (p - 1) + (int64_t)i &&
             f64[i] == (double)p * (double)i + 0.25 * p * (p - 1);
    check(ok, d, "%s allreduce int32 min, int64 max, fp64 sum n=%zu", label, n);
    for (size_t i = 0; i < n; i++)
        u8[i] = (uint8_t)(r == p - 1 ? i * 3 : 0);
    ok = call_ok(cerr, c->ops->broadcast(c, u8, n, COMM_BYTE, p - 1, cerr, sizeof cerr), d, sizeof d);
    for (size_t i = 0; ok && i < n; i++)
        ok = u8[i] == (uint8_t)(i * 3);
    for (size_t i = 0; i < n; i++)
        u8[i] = (uint8_t)(r + i);
    ok = ok && call_ok(cerr, c->ops->allgather(c, u8, u8 + n, n, COMM_BYTE, cerr, sizeof cerr), d, sizeof d);
    for (size_t i = 0; ok && i < n * (size_t)p; i++)
        ok = u8[n + i] == (uint8_t)(i / n + i % n);
    check(ok, d, "%s broadcast and allgather of bytes n=%zu", label, n);
    /* fp64 ring: send to the next rank, receive from the previous one */
    double *back = malloc(n * sizeof *back);
    if (!back)
        die("out of memory");
    for (size_t i = 0; i < n; i++)
        f64[i] = r * 1e6 + (double)i;
    comm_req_t rq = {0};
    ok = call_ok(cerr, c->ops->isend(c, f64, n, COMM_FP64, (r + 1) % p, 9, &rq, cerr, sizeof cerr), d, sizeof d) &&
         call_ok(cerr, c->ops->recv(c, back, n, COMM_FP64, (r + p - 1) % p, 9, cerr, sizeof cerr), d, sizeof d) &&
         call_ok(cerr, c->ops->wait(&rq, cerr, sizeof cerr), d, sizeof d);
    for (size_t i = 0; ok && i < n; i++)
        ok = back[i] == ((r + p - 1) % p) * 1e6 + (double)i;
    check(ok, d, "%s fp64 isend/recv ring n=%zu", label, n);
    free(back);
    uint16_t h = 0x3f80;
    ok = c->ops->allreduce(c, &h, 1, COMM_BF16, COMM_MAX, cerr, sizeof cerr) == -1 &&
         strstr(cerr, "bf16 reduces with the sum only");
    check(ok, cerr, "%s bf16 max refused before any communication", label);
    free(i32);
    free(i64);
    free(f64);
    free(u8);
}

/* ------------------------------------------------------------ collectives */

/* alltoallv: rank r sends n(r,q) = (r + 2q) % 3 + (r == q) elements (some
 * none) to rank q, value 1000 r + 100 q + i, and receives them with the
 * sources laid out in reverse order (the displacements matter); fp32 and
 * int32, exact. Then a count over INT_MAX fails on every rank, in one
 * line, before any MPI call. */
static size_t a2a_n(int r, int q) { return (size_t)((r + 2 * q) % 3 + (r == q)); }

static void check_alltoallv(comm_t *c, const char *label)
{
    const int P = c->size, r = c->rank;
    size_t *v = calloc(4 * (size_t)P, sizeof *v), *scnt = v, *sdsp = v + P, *rcnt = v + 2 * P, *rdsp = v + 3 * P;
    float *send = falloc(4 * (size_t)P + 1), *recv = falloc(4 * (size_t)P + 1);
    int32_t *si = calloc(4 * (size_t)P + 1, sizeof *si), *ri = calloc(4 * (size_t)P + 1, sizeof *ri);
    if (!v || !si || !ri)
        die("out of memory");
    size_t ns = 0, nr = 0;
    for (int q = 0; q < P; q++) {
        scnt[q] = a2a_n(r, q);
        sdsp[q] = ns;
        for (size_t i = 0; i < scnt[q]; i++) {
            send[ns + i] = (float)(1000 * r + 100 * q + (int)i);
            si[ns + i] = 1000 * r + 100 * q + (int)i;
        }
        ns += scnt[q];
    }
    for (int s = P - 1; s >= 0; s--) {
        rcnt[s] = a2a_n(s, r);
        rdsp[s] = nr;
        nr += rcnt[s];
    }
    char cerr[COMM_ERR_MAX] = "", d[512] = "";
    int ok = call_ok(cerr, c->ops->alltoallv(c, send, scnt, sdsp, recv, rcnt, rdsp, COMM_FP32, cerr, sizeof cerr), d,
                     sizeof d) &&
             call_ok(cerr, c->ops->alltoallv(c, si, scnt, sdsp, ri, rcnt, rdsp, COMM_INT32, cerr, sizeof cerr), d,
                     sizeof d);
    for (int s = 0; ok && s < P; s++)
        for (size_t i = 0; i < rcnt[s]; i++)
            if (recv[rdsp[s] + i] != (float)(1000 * s + 100 * r + (int)i) ||
                ri[rdsp[s] + i] != 1000 * s + 100 * r + (int)i) {
                snprintf(d, sizeof d, "from rank %d element %zu: %g / %d", s, i, (double)recv[rdsp[s] + i],
                         (int)ri[rdsp[s] + i]);
                ok = 0;
                break;
            }
    check(ok, d, "%s alltoallv fp32 and int32, %zu elements sent, %zu received", label, ns, nr);
    scnt[0] = (size_t)INT_MAX + 1;
    int rc = c->ops->alltoallv(c, send, scnt, sdsp, recv, rcnt, rdsp, COMM_FP32, cerr, sizeof cerr);
    check(rc != 0 && strstr(cerr, "MPI_Alltoallv") && strstr(cerr, "exceeds INT_MAX"), cerr,
          "%s alltoallv with a count over INT_MAX fails in one line", label);
    free(v);
    free(send);
    free(recv);
    free(si);
    free(ri);
}

static void run_collectives(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, r = c->rank;
    const size_t counts[] = {0, 1, 7, 2500, 65537};
    char d[512];
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t n = counts[k];
        float *buf = falloc(n), *want = falloc(n), *buf2 = falloc(n), *want2 = falloc(n);
        int ok;

        /* allreduce sum, in place */
        for (size_t i = 0; i < n; i++) {
            buf[i] = (float)(i % 1000) + 3.0f * (float)r;
            want[i] = (float)p * (float)(i % 1000) + 3.0f * (float)(p * (p - 1) / 2);
        }
        ok = call_ok(cerr, c->ops->allreduce(c, buf, n, COMM_FP32, COMM_SUM, cerr, sizeof cerr), d, sizeof d) &&
             same(buf, want, n, d, sizeof d);
        check(ok, d, "%s allreduce sum n=%zu", label, n);

        /* allreduce max */
        for (size_t i = 0; i < n; i++) {
            buf[i] = (float)((i * 7 + (size_t)r * 13) % 101) - 50.0f;
            float m = -1e30f;
            for (int q = 0; q < p; q++) {
                float v = (float)((i * 7 + (size_t)q * 13) % 101) - 50.0f;
                m = v > m ? v : m;
            }
            want[i] = m;
        }
        ok = call_ok(cerr, c->ops->allreduce(c, buf, n, COMM_FP32, COMM_MAX, cerr, sizeof cerr), d, sizeof d) &&
             same(buf, want, n, d, sizeof d);
        check(ok, d, "%s allreduce max n=%zu", label, n);

        /* two nonblocking allreduces in flight at once, driven by test */
        comm_req_t ra = {0}, rb = {0};
        for (size_t i = 0; i < n; i++) {
            buf[i] = (float)(i % 1000) + 3.0f * (float)r;
            want[i] = (float)p * (float)(i % 1000) + 3.0f * (float)(p * (p - 1) / 2);
            buf2[i] = (float)((i * 7 + (size_t)r * 13) % 101) - 50.0f;
        }
        for (size_t i = 0; i < n; i++) {
            float m = -1e30f;
            for (int q = 0; q < p; q++) {
                float v = (float)((i * 7 + (size_t)q * 13) % 101) - 50.0f;
                m = v > m ? v : m;
            }
            want2[i] = m;
        }
        long calls_a = 0, calls_b = 0;
        ok = call_ok(cerr, c->ops->iallreduce(c, buf, n, COMM_FP32, COMM_SUM, &ra, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->iallreduce(c, buf2, n, COMM_FP32, COMM_MAX, &rb, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, test_loop(c, &rb, &calls_b, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, test_loop(c, &ra, &calls_a, cerr, sizeof cerr), d, sizeof d);
        if (ok && (ra.active || rb.active || ra.impl || rb.impl)) {
            snprintf(d, sizeof d, "finished requests not released (active %d %d)", ra.active, rb.active);
            ok = 0;
        }
        ok = ok && same(buf, want, n, d, sizeof d) && same(buf2, want2, n, d, sizeof d);
        check(ok, d, "%s iallreduce sum+max in flight together, test loop, n=%zu", label, n);
        free(buf2);
        free(want2);

        /* reduce_scatter then allgather: the round trip is an allreduce */
        float *send = falloc((size_t)p * n), *full = falloc((size_t)p * n), *fwant = falloc((size_t)p * n);
        for (size_t j = 0; j < (size_t)p * n; j++) {
            send[j] = (float)(j % 977) + (float)r;
            fwant[j] = (float)p * (float)(j % 977) + (float)(p * (p - 1) / 2);
        }
        ok = call_ok(cerr, c->ops->reduce_scatter(c, send, buf, n, COMM_FP32, cerr, sizeof cerr), d, sizeof d) &&
             same(buf, fwant + (size_t)r * n, n, d, sizeof d);
        check(ok, d, "%s reduce_scatter n_each=%zu", label, n);
        ok = call_ok(cerr, c->ops->allgather(c, buf, full, n, COMM_FP32, cerr, sizeof cerr), d, sizeof d) &&
             same(full, fwant, (size_t)p * n, d, sizeof d);
        check(ok, d, "%s allgather of the scattered sums n_each=%zu", label, n);

        /* in place: reduce_scatter(send == recv), allgather(send == recv + rank*n) */
        memcpy(full, send, (size_t)p * n * sizeof *full);
        ok = call_ok(cerr, c->ops->reduce_scatter(c, full, full, n, COMM_FP32, cerr, sizeof cerr), d, sizeof d) &&
             same(full, fwant + (size_t)r * n, n, d, sizeof d);
        check(ok, d, "%s reduce_scatter in place n_each=%zu", label, n);
        for (size_t j = 0; j < (size_t)p * n; j++)
            full[j] = -7.0f;
        memcpy(full + (size_t)r * n, fwant + (size_t)r * n, n * sizeof *full);
        ok = call_ok(cerr, c->ops->allgather(c, full + (size_t)r * n, full, n, COMM_FP32, cerr, sizeof cerr), d,
                     sizeof d) &&
             same(full, fwant, (size_t)p * n, d, sizeof d);
        check(ok, d, "%s allgather in place n_each=%zu", label, n);

        /* nonblocking forms, out of place and in place */
        for (int inplace = 0; inplace < 2; inplace++) {
            comm_req_t rq = {0};
            long calls = 0;
            float *dst = inplace ? full : buf;
            memcpy(full, send, (size_t)p * n * sizeof *full);
            ok = call_ok(cerr,
                         c->ops->ireduce_scatter(c, inplace ? full : send, dst, n, COMM_FP32, &rq, cerr, sizeof cerr),
                         d, sizeof d) &&
                 call_ok(cerr, c->ops->wait(&rq, cerr, sizeof cerr), d, sizeof d) &&
                 same(dst, fwant + (size_t)r * n, n, d, sizeof d);
            check(ok, d, "%s ireduce_scatter%s + wait n_each=%zu", label, inplace ? " in place" : "", n);
            float *out = inplace ? full : falloc((size_t)p * n);
            for (size_t j = 0; j < (size_t)p * n; j++)
                out[j] = -7.0f;
            if (inplace)
                memcpy(full + (size_t)r * n, fwant + (size_t)r * n, n * sizeof *full);
            const float *src = inplace ? full + (size_t)r * n : buf;
            ok = call_ok(cerr, c->ops->iallgather(c, src, out, n, COMM_FP32, &rq, cerr, sizeof cerr), d, sizeof d) &&
                 call_ok(cerr, test_loop(c, &rq, &calls, cerr, sizeof cerr), d, sizeof d) &&
                 same(out, fwant, (size_t)p * n, d, sizeof d);
            check(ok, d, "%s iallgather%s + test loop n_each=%zu", label, inplace ? " in place" : "", n);
            if (!inplace)
                free(out);
        }
        free(send);
        free(full);
        free(fwant);

        /* broadcast from every root (up to the world size, so that every
         * rank makes the same checks whatever its group's size) */
        for (int root = 0; root < g_size; root++) {
            if (root >= p) {
                check(1, "", "%s broadcast root %d n=%zu: no such rank in this group", label, root, n);
                continue;
            }
            for (size_t i = 0; i < n; i++) {
                want[i] = (float)(root * 100000) + (float)(i % 1000);
                buf[i] = r == root ? want[i] : -1.0f;
            }
            ok = call_ok(cerr, c->ops->broadcast(c, buf, n, COMM_FP32, root, cerr, sizeof cerr), d, sizeof d) &&
                 same(buf, want, n, d, sizeof d);
            check(ok, d, "%s broadcast root %d n=%zu", label, root, n);
        }

        /* ring: receive from the left what the left rank sent to its right */
        const int right = (r + 1) % p, left = (r + p - 1) % p;
        float *out = falloc(n);
        for (size_t i = 0; i < n; i++) {
            out[i] = (float)(r * 1000) + (float)(i % 997);
            want[i] = (float)(left * 1000) + (float)(i % 997);
            buf[i] = -1.0f;
        }
        if (p == 1) {
            check(1, "", "%s send/recv ring n=%zu: group of one, nothing to do", label, n);
        } else { /* blocking: even ranks send first, odd ranks receive first */
            if (r % 2 == 0)
                ok = call_ok(cerr, c->ops->send(c, out, n, COMM_FP32, right, 5, cerr, sizeof cerr), d, sizeof d) &&
                     call_ok(cerr, c->ops->recv(c, buf, n, COMM_FP32, left, 5, cerr, sizeof cerr), d, sizeof d);
            else
                ok = call_ok(cerr, c->ops->recv(c, buf, n, COMM_FP32, left, 5, cerr, sizeof cerr), d, sizeof d) &&
                     call_ok(cerr, c->ops->send(c, out, n, COMM_FP32, right, 5, cerr, sizeof cerr), d, sizeof d);
            ok = ok && same(buf, want, n, d, sizeof d);
            check(ok, d, "%s send/recv ring n=%zu", label, n);
            for (size_t i = 0; i < n; i++)
                buf[i] = -1.0f;
        }
        comm_req_t rs = {0}, rr = {0};
        long calls = 0;
        ok = call_ok(cerr, c->ops->irecv(c, buf, n, COMM_FP32, left, 9, &rr, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->isend(c, out, n, COMM_FP32, right, 9, &rs, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, test_loop(c, &rr, &calls, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->wait(&rs, cerr, sizeof cerr), d, sizeof d) && same(buf, want, n, d, sizeof d);
        check(ok, d, "%s isend/irecv ring n=%zu", label, n);
        free(out);
        free(buf);
        free(want);
    }
    char d2[512] = "";
    check(call_ok(cerr, c->ops->barrier(c, cerr, sizeof cerr), d2, sizeof d2), d2, "%s barrier", label);
    check_alltoallv(c, label);
}

/* Chunking: with DTRAIN_COMM_MAX_COUNT=1000 a send of 2500 floats travels
 * as messages of 1000, 1000 and 500 floats on the duplicate MPI_Comm. */
static void check_chunked_send(comm_t *c, size_t max)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, r = c->rank;
    if (p < 2)
        return;
    const size_t n = 2500;
    float *out = falloc(n), *in = falloc(n), *want = falloc(n);
    for (size_t i = 0; i < n; i++) {
        out[i] = (float)(r * 10000) + (float)i;
        want[i] = (float)(((r + p - 1) % p) * 10000) + (float)i;
    }
    char d[512] = "";
    comm_req_t rs = {0};
    int ok = call_ok(cerr, c->ops->isend(c, out, n, COMM_FP32, (r + 1) % p, 3, &rs, cerr, sizeof cerr), d, sizeof d);
    MPI_Status st;
    int got = -1;
    if (MPI_Probe((r + p - 1) % p, 3, *(MPI_Comm *)c->impl, &st) != MPI_SUCCESS ||
        MPI_Get_count(&st, MPI_FLOAT, &got) != MPI_SUCCESS)
        die("MPI_Probe");
    if (ok && (size_t)got != max) {
        snprintf(d, sizeof d, "first message holds %d floats, want %zu", got, max);
        ok = 0;
    }
    ok = call_ok(cerr, c->ops->recv(c, in, n, COMM_FP32, (r + p - 1) % p, 3, cerr, sizeof cerr), d, sizeof d) && ok;
    ok = call_ok(cerr, c->ops->wait(&rs, cerr, sizeof cerr), d, sizeof d) && ok && same(in, want, n, d, sizeof d);
    check(ok, d, "chunked: 2500 floats sent as messages of at most %zu (probed), received whole", max);
    free(out);
    free(in);
    free(want);
}

static void check_errors(comm_t *c)
{
    char cerr[COMM_ERR_MAX] = "";
    char d[512] = "";
    float x = 1.0f;
    int rc = c->ops->send(c, &x, 1, COMM_FP32, c->size + 5, 0, cerr, sizeof cerr);
    int ok = rc == -1 && strncmp(cerr, "MPI_Send(n=1, peer ", 19) == 0 && strstr(cerr, "comm size") &&
             strstr(cerr, ") failed: MPI_ERR_RANK") && !strchr(cerr, '\n');
    snprintf(d, sizeof d, "rc %d, err '%.400s'", rc, cerr);
    check(ok, d, "send to rank size+5 fails with one line: %.400s", cerr);
    rc = c->ops->allreduce(c, &x, 1, COMM_FP32, (comm_op_t)99, cerr, sizeof cerr);
    ok = rc == -1 && strstr(cerr, "MPI_Allreduce(n=1, comm size") && strstr(cerr, "unknown reduction op");
    snprintf(d, sizeof d, "rc %d, err '%.400s'", rc, cerr);
    check(ok, d, "allreduce with an unknown op fails: %.400s", cerr);

    MPI_Comm null = MPI_COMM_NULL;
    check(comm_mpi_create(NULL) == NULL && comm_mpi_create(&null) == NULL, "",
          "comm_mpi_create(NULL / MPI_COMM_NULL) = NULL");

    ddp_mode_t m = DDP_NAIVE;
    ok = ddp_mode_parse("flat", &m) == 0 && m == DDP_FLAT && ddp_mode_parse("bucketed", &m) == 0 && m == DDP_BUCKETED &&
         ddp_mode_parse("naive", &m) == 0 && m == DDP_NAIVE && ddp_mode_parse("bucket", &m) == -1 &&
         ddp_mode_parse("", &m) == -1;
    check(ok, "", "ddp_mode_parse naive|flat|bucketed, rejects others");

    float g[10] = {0};
    size_t bad1[] = {0, 6, 4}, bad2[] = {0, 4, 11}, bad3[] = {2, 4};
    ddp_t dd;
    ok = ddp_create(&dd, g_ops, NULL, DDP_BUCKETED, c, g, 10, bad1, 3, 16, COMM_FP32, cerr, sizeof cerr) == -1 &&
         strstr(cerr, "ddp: tensor 2 starts at 4");
    snprintf(d, sizeof d, "err '%.400s'", cerr);
    ok = ok && ddp_create(&dd, g_ops, NULL, DDP_BUCKETED, c, g, 10, bad2, 3, 16, COMM_FP32, cerr, sizeof cerr) == -1 &&
         ddp_create(&dd, g_ops, NULL, DDP_FLAT, c, g, 10, bad3, 2, 16, COMM_FP32, cerr, sizeof cerr) == -1;
    check(ok, d, "ddp_create rejects descending, out-of-range and non-zero first offsets: %.400s", cerr);
    size_t one[] = {0};
    ok = ddp_create(&dd, NULL, NULL, DDP_FLAT, c, g, 10, one, 1, 16, COMM_FP32, cerr, sizeof cerr) == -1 &&
         strstr(cerr, "invalid arguments");
    check(ok, "", "ddp_create without an ops table fails: %.400s", cerr);
}

static void check_subcomm(comm_t *world)
{
    char d[512] = "";
    int res = MPI_UNEQUAL;
    if (MPI_Comm_compare(*(MPI_Comm *)world->impl, MPI_COMM_WORLD, &res) != MPI_SUCCESS)
        die("MPI_Comm_compare");
    snprintf(d, sizeof d, "compare gives %d", res);
    check(res == MPI_CONGRUENT && world->rank == g_rank && world->size == g_size &&
              strcmp(world->ops->name, "mpi") == 0,
          d, "world comm: impl is a duplicate of MPI_COMM_WORLD, rank %d size %d, name mpi", world->rank, world->size);
}

/* ------------------------------------------------------------------- DDP */

#define N_TENSORS 37

static size_t tensor_size(int t)
{
    if (t == 10)
        return 0; /* an empty tensor */
    if (t % 9 == 4)
        return 3000; /* larger than the small buckets */
    return 1 + (size_t)(t * t * 131 + t * 17) % 700;
}

/* Rank q of p holds avg + (2q - (p-1)) * h: the deviations sum to zero, so
 * the DP average is avg exactly, and every partial sum is a small integer.
 * For bf16 reductions smaller ones, h = 1: with up to 8 ranks at most 23
 * in magnitude, so every partial sum is an integer below 256, exact in
 * bf16's 8 significant bits. */
static float avg_value(size_t i, int step, comm_dtype_t dt)
{
    return dt == COMM_BF16 ? (float)((int)(i % 31) - 15 + step) : (float)((int)(i % 509) - 200 + step);
}

static float grad_value(size_t i, int step, int q, int p, comm_dtype_t dt)
{
    return avg_value(i, step, dt) + (float)(2 * q - (p - 1)) * (float)(dt == COMM_BF16 ? 1 : i % 7 + 1);
}

static const char *dtype_name(comm_dtype_t dt) { return dt == COMM_BF16 ? "bf16" : "fp32"; }

/* Buckets cover [0, n) from the top down, contiguous, start on tensor
 * boundaries, hold at most cap floats unless a single tensor, and each
 * could not take the next tensor below it without passing cap. */
static int buckets_ok(const ddp_t *dd, const size_t *starts, size_t n, size_t cap, char *d, size_t len)
{
    if (n > 0 && dd->n_buckets < 1) {
        snprintf(d, len, "no buckets");
        return 0;
    }
    for (int b = 0; b < dd->n_buckets; b++) {
        const ddp_bucket_t *k = &dd->buckets[b];
        size_t top = b == 0 ? n : dd->buckets[b - 1].start;
        if (k->n == 0 || k->start + k->n != top) {
            snprintf(d, len, "bucket %d [%zu, +%zu) does not end at %zu", b, k->start, k->n, top);
            return 0;
        }
        int boundary = 0, inside = 0;
        size_t below = 0; /* size of the next non-empty tensor below the bucket */
        for (int t = 0; t < N_TENSORS; t++) {
            size_t ts = tensor_size(t);
            boundary |= starts[t] == k->start;
            inside += ts > 0 && starts[t] >= k->start && starts[t] < k->start + k->n;
            if (ts > 0 && starts[t] < k->start)
                below = ts;
        }
        if (!boundary) {
            snprintf(d, len, "bucket %d starts at %zu, not a tensor boundary", b, k->start);
            return 0;
        }
        if (k->n > cap && inside != 1) {
            snprintf(d, len, "bucket %d holds %zu floats > %zu in %d tensors", b, k->n, cap, inside);
            return 0;
        }
        if (b < dd->n_buckets - 1 && k->n + below <= cap) {
            snprintf(d, len, "bucket %d (%zu floats) could have taken the next tensor (%zu)", b, k->n, below);
            return 0;
        }
    }
    if (dd->n_buckets > 0 && dd->buckets[dd->n_buckets - 1].start != 0) {
        snprintf(d, len, "last bucket starts at %zu, not 0", dd->buckets[dd->n_buckets - 1].start);
        return 0;
    }
    return 1;
}

static const char *mode_name(ddp_mode_t m) { return m == DDP_NAIVE ? "naive" : m == DDP_FLAT ? "flat" : "bucketed"; }

typedef struct {
    ddp_mode_t mode;
    size_t bytes;
} ddp_cfg_t;

static const ddp_cfg_t ddp_cfgs[] = {
    {DDP_NAIVE, 4096},    {DDP_FLAT, 4096},      {DDP_BUCKETED, 0},       {DDP_BUCKETED, 256},
    {DDP_BUCKETED, 4096}, {DDP_BUCKETED, 20000}, {DDP_BUCKETED, 1 << 20},
};
#define N_CFGS ((int)(sizeof ddp_cfgs / sizeof ddp_cfgs[0]))

static size_t layout(size_t *starts)
{
    size_t n = 0;
    for (int t = 0; t < N_TENSORS; t++) {
        starts[t] = n;
        n += tensor_size(t);
    }
    return n;
}

/* Exact averages; buckets launched as the simulated backward reaches them.
 * dt: the reductions' dtype (bf16 has its staging buffer exactly when the
 * group has more than one rank). */
static void ddp_exact(comm_t *c, const char *label, comm_dtype_t dt)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, q = c->rank;
    size_t starts[N_TENSORS];
    const size_t n = layout(starts);
    float *g = falloc(n), *want = falloc(n);
    char d[512] = "";
    for (int k = 0; k < N_CFGS; k++) {
        const ddp_cfg_t *cf = &ddp_cfgs[k];
        const size_t cap = cf->bytes / sizeof(float);
        ddp_t dd;
        int ok =
            ddp_create(&dd, g_ops, NULL, cf->mode, c, g, n, starts, N_TENSORS, cf->bytes, dt, cerr, sizeof cerr) == 0;
        if (!ok)
            snprintf(d, sizeof d, "ddp_create: %.400s", cerr);
        else if ((dd.half != NULL) != (dt == COMM_BF16 && p > 1)) {
            snprintf(d, sizeof d, "bf16 staging buffer %s", dd.half ? "allocated" : "missing");
            ok = 0;
        } else if (cf->mode == DDP_BUCKETED)
            ok = buckets_ok(&dd, starts, n, cap, d, sizeof d);
        else if (dd.n_buckets != 0) {
            snprintf(d, sizeof d, "%d buckets in mode %s", dd.n_buckets, mode_name(cf->mode));
            ok = 0;
        }
        if (!check(ok, d, "%s ddp %s %s %zu B: %d buckets of whole tensors, top down, greedy", label, dtype_name(dt),
                   mode_name(cf->mode), cf->bytes, ok ? dd.n_buckets : -1)) {
            ddp_destroy(&dd); /* safe after a failed create too */
            continue;
        }
        for (int step = 0; step < 2; step++) {
            for (size_t i = 0; i < n; i++) {
                g[i] = 1e30f * (float)(q + 1); /* not yet computed */
                want[i] = avg_value(i, step, dt);
            }
            ddp_begin(&dd);
            ok = 1;
            /* backward: the last tensor is finished first */
            for (int t = N_TENSORS - 1; t >= 0 && ok; t--) {
                for (size_t i = starts[t]; i < starts[t] + tensor_size(t); i++)
                    g[i] = grad_value(i, step, q, p, dt);
                if (ddp_grads_ready(&dd, starts[t], cerr, sizeof cerr) != 0) {
                    snprintf(d, sizeof d, "ddp_grads_ready: %.400s", cerr);
                    ok = 0;
                    break;
                }
                int expect = 0;
                if (cf->mode == DDP_BUCKETED && p > 1)
                    for (int b = 0; b < dd.n_buckets; b++)
                        expect += dd.buckets[b].start >= starts[t];
                int launched = 0;
                for (int b = 0; b < dd.n_buckets; b++)
                    launched += dd.buckets[b].launched != 0;
                if (dd.next_bucket != expect || launched != expect) {
                    snprintf(d, sizeof d, "after tensor %d ready: next_bucket %d, %d launched, want %d", t,
                             dd.next_bucket, launched, expect);
                    ok = 0;
                }
            }
            int before = dd.next_bucket;
            if (ok && ddp_finish(&dd, cerr, sizeof cerr) != 0) {
                snprintf(d, sizeof d, "ddp_finish: %.400s", cerr);
                ok = 0;
            }
            ok = ok && same(g, want, n, d, sizeof d);
            if (ok && !(dd.comm_wait_s >= 0.0 && dd.comm_wait_s < 60.0)) {
                snprintf(d, sizeof d, "comm_wait_s = %g", dd.comm_wait_s);
                ok = 0;
            }
            int want_before = cf->mode == DDP_BUCKETED && p > 1 ? dd.n_buckets : 0;
            if (ok && before != want_before) {
                snprintf(d, sizeof d, "%d buckets launched during backward, want %d", before, want_before);
                ok = 0;
            }
            check(ok, d,
                  "%s ddp %s %s %zu B step %d: exact average of %zu floats; %d/%d buckets launched before finish",
                  label, dtype_name(dt), mode_name(cf->mode), cf->bytes, step + 1, n, before, dd.n_buckets);
        }
        ddp_destroy(&dd);
    }
    free(g);
    free(want);
}

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Full 24-bit mantissas over magnitudes 2^-8 .. 2^8, so that sums in a
 * different order round differently. */
static float random_grad(int q, size_t i)
{
    uint64_t h = mix64(((uint64_t)q << 40) ^ i);
    return ldexpf((float)(h >> 40) * (1.0f / 16777216.0f) - 0.5f, (int)(h & 15) - 7);
}

/* Two steps of random gradients through dd, each reported ready tensor by
 * tensor from the top as a backward would; g holds the second step's result
 * and first the first's. Returns 1 when every call succeeded. */
static int ddp_two_random_steps(ddp_t *dd, float *g, float *first, size_t n, const size_t *starts, int q)
{
    char cerr[COMM_ERR_MAX] = "";
    int ok = 1;
    for (int run = 0; run < 2 && ok; run++) {
        for (size_t i = 0; i < n; i++)
            g[i] = random_grad(q, i);
        ddp_begin(dd);
        for (int t = N_TENSORS - 1; t >= 0 && ok; t--)
            ok = ddp_grads_ready(dd, starts[t], cerr, sizeof cerr) == 0;
        ok = ok && ddp_finish(dd, cerr, sizeof cerr) == 0;
        if (run == 0)
            memcpy(first, g, n * sizeof *g);
    }
    return ok;
}

/* Random gradients: all modes agree to 1e-5 of the largest contribution
 * to each element, the same mode twice is bit-identical, and every replica
 * holds the same bits. */
static void ddp_random(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int q = c->rank;
    size_t starts[N_TENSORS];
    const size_t n = layout(starts);
    float *ref = falloc(n), *g = falloc(n), *first = falloc(n), *r0 = falloc(n), *scale = falloc(n);
    char d[512] = "";
    for (size_t i = 0; i < n; i++) /* the largest |contribution| over the group */
        scale[i] = fabsf(random_grad(q, i));
    if (c->ops->allreduce(c, scale, n, COMM_FP32, COMM_MAX, cerr, sizeof cerr) != 0)
        die("allreduce(max)");
    for (int k = -1; k < N_CFGS; k++) {
        /* k = -1: flat, the reference */
        const ddp_cfg_t cf = k < 0 ? (ddp_cfg_t){DDP_FLAT, 0} : ddp_cfgs[k];
        ddp_t dd;
        int ok = ddp_create(&dd, g_ops, NULL, cf.mode, c, g, n, starts, N_TENSORS, cf.bytes, COMM_FP32, cerr,
                            sizeof cerr) == 0 &&
                 ddp_two_random_steps(&dd, g, first, n, starts, q);
        if (!ok)
            snprintf(d, sizeof d, "%.400s", cerr);
        ddp_destroy(&dd);
        if (!check(ok, d, "%s ddp %s %zu B random gradients: create, backward, finish", label, mode_name(cf.mode),
                   cf.bytes))
            continue;
        ok = same(g, first, n, d, sizeof d);
        memcpy(r0, g, n * sizeof *g);
        if (MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, *(MPI_Comm *)c->impl) != MPI_SUCCESS)
            die("MPI_Bcast");
        int replicas = same(g, r0, n, d + strlen(d), sizeof d - strlen(d));
        if (k < 0) {
            memcpy(ref, g, n * sizeof *g);
            check(ok && replicas, d, "%s ddp flat random: twice bit-identical, same bits on every replica", label);
            continue;
        }
        size_t ndiff = 0;
        double maxrel = 0.0;
        for (size_t i = 0; i < n; i++) {
            if (memcmp(&g[i], &ref[i], sizeof *g) != 0)
                ndiff++;
            double rel = fabs((double)g[i] - (double)ref[i]) / (double)scale[i];
            maxrel = rel > maxrel ? rel : maxrel;
        }
        if (ok && replicas && maxrel > 1e-5) {
            snprintf(d, sizeof d, "differs from flat by %g (relative)", maxrel);
            ok = 0;
        }
        check(ok && replicas, d, "%s ddp %s %zu B random: twice bit-identical, replicas agree, within 1e-5 of flat",
              label, mode_name(cf.mode), cf.bytes);
        info("%s ddp %s %zu B vs flat: %zu of %zu floats differ in bits, max relative difference %.3g", label,
             mode_name(cf.mode), cf.bytes, ndiff, n, maxrel);
    }
    free(ref);
    free(g);
    free(first);
    free(r0);
    free(scale);
}

/* ------------------------------------------------------------------ bf16 */

/* The *_bf16 collectives. Each addition widens to fp32 and rounds the sum
 * to bf16 (round to nearest even, unit roundoff u = 2^-8), so a sum of p
 * values in any order (any reduction tree has at most p-1 additions on a
 * path) is within gamma(p-1) * sum |x_i| of the exact sum, where
 * gamma(k) = k u / (1 - k u) (Higham, Accuracy and Stability, 4.2; a
 * first-order (p-1) 2^-8 sum |x_i| plus the second-order term). The bf16
 * inputs' exact sum is computed in double, which holds it exactly. */

static const double BF16_U = 1.0 / 256.0;

static double gamma_k(int k) { return (double)k * BF16_U / (1.0 - (double)k * BF16_U); }

static uint16_t *halloc(size_t n)
{
    uint16_t *p = malloc((n ? n : 1) * sizeof *p);
    if (!p)
        die("out of memory");
    return p;
}

/* 1 when got[i] == want[i] as bits for all i; else the first difference. */
static int same16(const uint16_t *got, const uint16_t *want, size_t n, char *detail, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (got[i] != want[i]) {
            snprintf(detail, len, "element %zu of %zu is 0x%04x (%.9g), want 0x%04x (%.9g)", i, n, got[i],
                     (double)dt_bf16_to_f32(got[i]), want[i], (double)dt_bf16_to_f32(want[i]));
            return 0;
        }
    return 1;
}

/* Integers in [-20, 20 + r]: with up to 8 ranks every partial sum is an
 * integer below 256 in magnitude, exact in bf16, so the result is exact
 * whatever order the library sums in. */
static float small_int(size_t i, int r) { return (float)((int)(i % 41) - 20 + r); }

static void fill_small(uint16_t *x, size_t n, size_t base, int r)
{
    for (size_t i = 0; i < n; i++)
        x[i] = dt_f32_to_bf16(small_int(base + i, r));
}

static void want_small(uint16_t *want, size_t n, size_t base, int p)
{
    for (size_t i = 0; i < n; i++) {
        float sum = 0.0f;
        for (int q = 0; q < p; q++)
            sum += small_int(base + i, q);
        want[i] = dt_f32_to_bf16(sum);
    }
}

static void bf16_exact(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, r = c->rank;
    const size_t counts[] = {0, 1, 7, 2500, 65537};
    char d[512];
    for (size_t k = 0; k < sizeof counts / sizeof counts[0]; k++) {
        const size_t n = counts[k];
        uint16_t *buf = halloc(n), *buf2 = halloc(n), *want = halloc(n), *want2 = halloc(n);
        int ok;

        fill_small(buf, n, 0, r);
        want_small(want, n, 0, p);
        ok = call_ok(cerr, c->ops->allreduce(c, buf, n, COMM_BF16, COMM_SUM, cerr, sizeof cerr), d, sizeof d) &&
             same16(buf, want, n, d, sizeof d);
        check(ok, d, "%s allreduce_bf16 n=%zu: small integers exact", label, n);

        /* two in flight together, driven by test; then one by wait */
        comm_req_t ra = {0}, rb = {0};
        long calls = 0;
        fill_small(buf, n, 0, r);
        fill_small(buf2, n, 17, r);
        want_small(want2, n, 17, p);
        ok = call_ok(cerr, c->ops->iallreduce(c, buf, n, COMM_BF16, COMM_SUM, &ra, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->iallreduce(c, buf2, n, COMM_BF16, COMM_SUM, &rb, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, test_loop(c, &rb, &calls, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, test_loop(c, &ra, &calls, cerr, sizeof cerr), d, sizeof d);
        if (ok && (ra.active || rb.active || ra.impl || rb.impl)) {
            snprintf(d, sizeof d, "finished requests not released (active %d %d)", ra.active, rb.active);
            ok = 0;
        }
        ok = ok && same16(buf, want, n, d, sizeof d) && same16(buf2, want2, n, d, sizeof d);
        check(ok, d, "%s iallreduce_bf16 x2 in flight together, test loop, n=%zu: exact", label, n);
        fill_small(buf, n, 0, r);
        ok = call_ok(cerr, c->ops->iallreduce(c, buf, n, COMM_BF16, COMM_SUM, &ra, cerr, sizeof cerr), d, sizeof d) &&
             call_ok(cerr, c->ops->wait(&ra, cerr, sizeof cerr), d, sizeof d) && same16(buf, want, n, d, sizeof d);
        check(ok, d, "%s iallreduce_bf16 + wait n=%zu: exact", label, n);

        /* reduce-scatter: rank r gets block r of the sums, out of place and
         * in place, blocking and not */
        const size_t pn = (size_t)p * n;
        uint16_t *send = halloc(pn), *full = halloc(pn), *piece = halloc(n);
        fill_small(send, pn, 0, r);
        want_small(piece, n, (size_t)r * n, p);
        ok = call_ok(cerr, c->ops->reduce_scatter(c, send, buf, n, COMM_BF16, cerr, sizeof cerr), d, sizeof d) &&
             same16(buf, piece, n, d, sizeof d);
        check(ok, d, "%s reduce_scatter_bf16 n_each=%zu: exact", label, n);
        memcpy(full, send, pn * sizeof *full);
        ok = call_ok(cerr, c->ops->reduce_scatter(c, full, full, n, COMM_BF16, cerr, sizeof cerr), d, sizeof d) &&
             same16(full, piece, n, d, sizeof d);
        check(ok, d, "%s reduce_scatter_bf16 in place n_each=%zu: exact", label, n);
        for (int inplace = 0; inplace < 2; inplace++) {
            comm_req_t rq = {0};
            memcpy(full, send, pn * sizeof *full);
            uint16_t *dst = inplace ? full : buf;
            ok = call_ok(cerr,
                         c->ops->ireduce_scatter(c, inplace ? full : send, dst, n, COMM_BF16, &rq, cerr, sizeof cerr),
                         d, sizeof d) &&
                 call_ok(cerr,
                         inplace ? test_loop(c, &rq, &calls, cerr, sizeof cerr) : c->ops->wait(&rq, cerr, sizeof cerr),
                         d, sizeof d) &&
                 same16(dst, piece, n, d, sizeof d);
            check(ok, d, "%s ireduce_scatter_bf16%s n_each=%zu: exact", label,
                  inplace ? " in place + test loop" : " + wait", n);
        }
        free(send);
        free(full);
        free(piece);
        free(buf);
        free(buf2);
        free(want);
        free(want2);
    }
}

/* Rank q's random value i, rounded to bf16: full 8-bit significands over
 * magnitudes 2^-8 .. 2^8 and both signs, so sums round at every step. */
static uint16_t random_bf16(int q, size_t i) { return dt_f32_to_bf16(random_grad(q, i)); }

/* got (n sums of element base+i over the group) against the exact sums:
 * within gamma(p-1) sum |x|; with 2 ranks, exactly bf16(x0 + x1), the op's
 * one addition. *worst: the largest |error| / bound; *rounded: how many
 * differ from the exact sum rounded once (what per-step rounding costs). */
static int bf16_within(const uint16_t *got, size_t n, size_t base, int p, double *worst, size_t *rounded, char *d,
                       size_t len)
{
    const double g = gamma_k(p - 1);
    for (size_t i = 0; i < n; i++) {
        double exact = 0.0, abs = 0.0;
        for (int q = 0; q < p; q++) {
            double x = (double)dt_bf16_to_f32(random_bf16(q, base + i));
            exact += x;
            abs += fabs(x);
        }
        const double v = (double)dt_bf16_to_f32(got[i]), err = fabs(v - exact), bound = g * abs;
        if (err > bound) {
            snprintf(d, len, "element %zu: %.9g, exact %.9g, error %.3g > bound %.3g", base + i, v, exact, err, bound);
            return 0;
        }
        if (p == 2) {
            uint16_t one =
                dt_f32_to_bf16(dt_bf16_to_f32(random_bf16(0, base + i)) + dt_bf16_to_f32(random_bf16(1, base + i)));
            if (got[i] != one) {
                snprintf(d, len, "element %zu: 0x%04x, want bf16(x0 + x1) = 0x%04x", base + i, got[i], one);
                return 0;
            }
        }
        if (bound > 0.0 && err / bound > *worst)
            *worst = err / bound;
        *rounded += got[i] != dt_f32_to_bf16((float)exact);
    }
    return 1;
}

/* Every rank holds the same bits as group rank 0 (MPI_Bcast of them). */
static int same_on_every_rank(comm_t *c, const uint16_t *x, size_t n, char *d, size_t len)
{
    uint16_t *r0 = halloc(n);
    memcpy(r0, x, n * sizeof *r0);
    MPI_Comm mc;
    if (comm_mpi_handle(c, &mc) != 0 || MPI_Bcast(r0, (int)n, MPI_UINT16_T, 0, mc) != MPI_SUCCESS)
        die("MPI_Bcast(bf16 result)");
    int ok = same16(x, r0, n, d, len);
    free(r0);
    return ok;
}

static void bf16_random(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, r = c->rank;
    const size_t n = 65537, n_each = 20000, pn = (size_t)p * n_each;
    uint16_t *buf = halloc(n), *first = halloc(n), *send = halloc(pn), *piece = halloc(n_each);
    char d[512] = "";
    for (int nonblocking = 0; nonblocking < 2; nonblocking++) {
        const char *how = nonblocking ? "iallreduce_bf16 + test loop" : "allreduce_bf16";
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            for (size_t i = 0; i < n; i++)
                buf[i] = random_bf16(r, i);
            comm_req_t rq = {0};
            long calls = 0;
            ok = nonblocking
                     ? call_ok(cerr, c->ops->iallreduce(c, buf, n, COMM_BF16, COMM_SUM, &rq, cerr, sizeof cerr), d,
                               sizeof d) &&
                           call_ok(cerr, test_loop(c, &rq, &calls, cerr, sizeof cerr), d, sizeof d)
                     : call_ok(cerr, c->ops->allreduce(c, buf, n, COMM_BF16, COMM_SUM, cerr, sizeof cerr), d, sizeof d);
            if (ok && run == 0)
                memcpy(first, buf, n * sizeof *buf);
        }
        double worst = 0.0;
        size_t rounded = 0;
        ok = ok && bf16_within(buf, n, 0, p, &worst, &rounded, d, sizeof d) && same16(buf, first, n, d, sizeof d) &&
             same_on_every_rank(c, buf, n, d, sizeof d);
        check(ok, d,
              "%s %s random n=%zu: within gamma(p-1) sum|x| (worst %.3f of the bound)%s, twice and on every "
              "rank bit-identical",
              label, how, n, worst, p == 2 ? ", = bf16(x0 + x1)" : "");
        info("%s %s random: %zu of %zu sums differ from the exact sum rounded once", label, how, rounded, n);
    }
    for (int nonblocking = 0; nonblocking < 2; nonblocking++) {
        const char *how = nonblocking ? "ireduce_scatter_bf16 + wait" : "reduce_scatter_bf16";
        int ok = 1;
        for (int run = 0; run < 2 && ok; run++) {
            for (size_t j = 0; j < pn; j++)
                send[j] = random_bf16(r, j);
            comm_req_t rq = {0};
            ok = nonblocking
                     ? call_ok(cerr, c->ops->ireduce_scatter(c, send, piece, n_each, COMM_BF16, &rq, cerr, sizeof cerr),
                               d, sizeof d) &&
                           call_ok(cerr, c->ops->wait(&rq, cerr, sizeof cerr), d, sizeof d)
                     : call_ok(cerr, c->ops->reduce_scatter(c, send, piece, n_each, COMM_BF16, cerr, sizeof cerr), d,
                               sizeof d);
            if (ok && run == 0)
                memcpy(first, piece, n_each * sizeof *piece);
        }
        double worst = 0.0;
        size_t rounded = 0;
        ok = ok && bf16_within(piece, n_each, (size_t)r * n_each, p, &worst, &rounded, d, sizeof d) &&
             same16(piece, first, n_each, d, sizeof d);
        double w = worst;
        if (MPI_Allreduce(&w, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
            die("MPI_Allreduce(worst)");
        check(ok, d,
              "%s %s random n_each=%zu: within gamma(p-1) sum|x| (worst %.3f of the bound)%s, twice "
              "bit-identical",
              label, how, n_each, worst, p == 2 ? ", = bf16(x0 + x1)" : "");
    }
    free(buf);
    free(first);
    free(send);
    free(piece);
}

/* DDP with bf16 reductions on random fp32 gradients: every mode is within
 * gamma(p) sum |x_i| / p of the exact average (one rounding of each input to
 * bf16, then the sum's p-1; the fp32 scaling adds 2^-24 relative, inside
 * the 1e-3 margin), twice bit-identical, the same bits on every replica;
 * with one rank the gradients are untouched. */
static void ddp_bf16_random(comm_t *c, const char *label)
{
    char cerr[COMM_ERR_MAX] = "";
    const int p = c->size, q = c->rank;
    size_t starts[N_TENSORS];
    const size_t n = layout(starts);
    float *g = falloc(n), *first = falloc(n), *r0 = falloc(n);
    char d[512] = "";
    const double bound_rel = gamma_k(p) * 1.001;
    for (int k = 0; k < N_CFGS; k++) {
        const ddp_cfg_t cf = ddp_cfgs[k];
        ddp_t dd;
        int ok = ddp_create(&dd, g_ops, NULL, cf.mode, c, g, n, starts, N_TENSORS, cf.bytes, COMM_BF16, cerr,
                            sizeof cerr) == 0 &&
                 ddp_two_random_steps(&dd, g, first, n, starts, q);
        if (!ok)
            snprintf(d, sizeof d, "%.400s", cerr);
        ddp_destroy(&dd);
        double worst = 0.0;
        for (size_t i = 0; ok && i < n; i++) {
            double exact = 0.0, abs = 0.0;
            for (int r = 0; r < p; r++) {
                exact += (double)random_grad(r, i);
                abs += fabs((double)random_grad(r, i));
            }
            const double err = fabs((double)g[i] - exact / p), bound = p > 1 ? bound_rel * abs / p : 0.0;
            if (err > bound) {
                snprintf(d, sizeof d, "element %zu: %.9g, exact average %.9g, error %.3g > bound %.3g", i, (double)g[i],
                         exact / p, err, bound);
                ok = 0;
            } else if (bound > 0.0 && err / bound > worst) {
                worst = err / bound;
            }
        }
        ok = ok && same(g, first, n, d, sizeof d);
        memcpy(r0, g, n * sizeof *g);
        if (MPI_Bcast(r0, (int)n, MPI_FLOAT, 0, *(MPI_Comm *)c->impl) != MPI_SUCCESS)
            die("MPI_Bcast");
        ok = ok && same(g, r0, n, d, sizeof d);
        check(ok, d,
              "%s ddp bf16 %s %zu B random: within gamma(p) sum|x|/p of the exact average (worst %.3f of "
              "the bound)%s, twice bit-identical, replicas agree",
              label, mode_name(cf.mode), cf.bytes, worst, p == 1 ? ", untouched at one rank" : "");
    }
    free(g);
    free(first);
    free(r0);
}

int main(int argc, char **argv)
{
    char cerr[COMM_ERR_MAX] = "";
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "test_comm: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    unsetenv("DTRAIN_COMM_MAX_COUNT");

    MPI_Comm world_mpi = MPI_COMM_WORLD;
    comm_t *world = comm_mpi_create(&world_mpi);
    if (!world)
        die("comm_mpi_create(MPI_COMM_WORLD) failed");
    if (!(g_ops = ops_cpu_create()))
        die("out of memory for the CPU backend");
    check_subcomm(world);
    run_collectives(world, "world");
    run_typed(world, "world");
    check_errors(world);

    /* a group per parity of the world rank, ordered by descending world rank */
    MPI_Comm split = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, g_rank % 2, g_size - g_rank, &split) != MPI_SUCCESS)
        die("MPI_Comm_split");
    comm_t *sub = comm_mpi_create(&split);
    if (!sub)
        die("comm_mpi_create(split) failed");
    MPI_Comm_free(&split); /* the communicator holds its own duplicate */
    int want_size = 0, want_rank = 0;
    float want_sum = 0.0f, x = (float)g_rank;
    for (int r = 0; r < g_size; r++)
        if (r % 2 == g_rank % 2) {
            want_size++;
            want_rank += r > g_rank;
            want_sum += (float)r;
        }
    char d[512] = "";
    int ok = sub->size == want_size && sub->rank == want_rank;
    snprintf(d, sizeof d, "rank %d size %d, want %d %d", sub->rank, sub->size, want_rank, want_size);
    ok = ok && call_ok(cerr, sub->ops->allreduce(sub, &x, 1, COMM_FP32, COMM_SUM, cerr, sizeof cerr), d, sizeof d) &&
         x == want_sum;
    if (ok == 0 && d[0] == '\0')
        snprintf(d, sizeof d, "sum %g, want %g", (double)x, (double)want_sum);
    check(ok, d, "MPI_Comm_split by parity: rank/size in group, allreduce of world ranks");
    run_collectives(sub, "split");

    /* every chunked path: at most 1000 floats per MPI call */
    setenv("DTRAIN_COMM_MAX_COUNT", "1000", 1);
    comm_t *chunked = comm_mpi_create(&world_mpi);
    unsetenv("DTRAIN_COMM_MAX_COUNT");
    if (!chunked)
        die("comm_mpi_create(chunked) failed");
    check_chunked_send(chunked, 1000);
    run_collectives(chunked, "chunked");
    run_typed(chunked, "chunked");

    ddp_exact(world, "world", COMM_FP32);
    ddp_exact(sub, "split", COMM_FP32);
    ddp_exact(chunked, "chunked", COMM_FP32);
    ddp_random(world, "world");

    bf16_exact(world, "world");
    bf16_exact(sub, "split");
    bf16_exact(chunked, "chunked");
    bf16_random(world, "world");
    bf16_random(chunked, "chunked");
    ddp_exact(world, "world", COMM_BF16);
    ddp_exact(sub, "split", COMM_BF16);
    ddp_exact(chunked, "chunked", COMM_BF16);
    ddp_bf16_random(world, "world");

    chunked->ops->destroy(chunked);
    sub->ops->destroy(sub);
    world->ops->destroy(world);
    ops_release(g_ops);
    if (g_rank == 0)
        printf("np=%d: %d checks, %d failure(s)\n", g_size, g_checks, g_fails);
    fflush(stdout);
    MPI_Finalize();
    return g_fails ? 1 : 0;
}
