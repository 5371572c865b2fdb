/* Ring attention over MPI (mpi/cp_ring.c), the world being the CP group
 * (test_cp_ring.sh runs np 2 and 4).
 *
 * (a) Every rank draws the same whole sequence from one seed (qkv, dout,
 *     document starts), computes attention_fwd and attention_bwd over it
 *     (the reference: one rank's attention, no ring), takes its zigzag
 *     rows (cp_sched.h), runs cp_ring_forward and cp_ring_backward, and
 *     compares its rows of out, lse and dqkv (q columns; k and v columns)
 *     with the reference's: max|got - ref| over every rank's rows /
 *     max|ref| over the sequence, tolerance 1e-5 (test_ring_attn's). GQA
 *     (NKV 4, 2, 1 of NH 4), HS 16 and 32, without documents and with
 *     documents crossing chunk edges and ranks (one from rank 0's first
 *     chunk into the last rank's first half, one across the middle of the
 *     sequence, i.e. between a rank's two halves, random ones in the other
 *     sequence). One case moves 512 KiB blocks, above the shared-memory
 *     eager limit, so sends complete only when matched.
 * (b) A rerun gives the same bits; the deferred ops table (comm
 *     device_sync = its sync) gives the CPU table's bits.
 * (c) The statistics: bytes sent = ((cp-1) + (cp-1) + cp) blocks (K,V
 *     forward and backward, gradients), time blocked <= the ring's time.
 * (d) A sequence length not divisible by 2cp is refused with one line,
 *     STATUS_INPUT, on every rank.
 * (e) attention_kv_pack and attention_kv_unpack (accum 0 and 1) on the CPU
 *     and deferred tables, exactly.
 *
 * `test_cp_ring --freeze RANK --timeout S`: a watchdog (--comm-timeout S)
 * watches the comm (named "cp"); rank RANK writes its pid to the file
 * $CP_FREEZE_PID and stops itself (SIGSTOP) before the ring: its
 * neighbour's wait must end the job with the watchdog's one line.
 *
 * Each check is agreed over all ranks; rank 0 prints one line per check
 * and every rank exits 1 if any failed. */
#define _POSIX_C_SOURCE 200809L

#include "mpi/comm.h"
#include "mpi/cp_ring.h"
#include "mpi/cp_sched.h"
#include "mpi/watchdog.h"
#include "src/backend/ops_cpu.h"

#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define TOL 1e-5

static int g_rank, g_size, g_checks, g_fails;
static double g_worst_fwd, g_worst_bwd;

static void die(const char *what)
{
    fprintf(stderr, "test_cp_ring: rank %d: %s\n", g_rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        die("out of memory");
    return p;
}

/* Collective: ok is this rank's verdict. Rank 0 prints the line. */
static int check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int check(int ok, const char *fmt, ...)
{
    int all = 0;
    if (MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allreduce(check)");
    g_checks++;
    g_fails += !all;
    if (g_rank == 0) {
        va_list ap;
        va_start(ap, fmt);
        printf("%s np=%d ", all ? "ok  " : "FAIL", g_size);
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
        fflush(stdout);
    }
    return all;
}

static double max_all(double v)
{
    double m = 0.0;
    if (MPI_Allreduce(&v, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allreduce(max)");
    return m;
}

static uint64_t rng_state;
static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static float frand(void) { return (float)((double)(next_u64() >> 40) * (1.0 / 8388608.0) - 1.0); }

typedef struct shape {
    int B, T, NH, NKV, HS, docs; /* docs: 0 none, 1 crossing */
} shape_t;

static size_t sz_R(const shape_t *s) { return (size_t)(s->NH + 2 * s->NKV) * s->HS; }
static size_t sz_OC(const shape_t *s) { return (size_t)s->NH * s->HS; }

/* The whole sequence (the same on every rank) and its attention. */
typedef struct whole {
    shape_t s;
    float *qkv, *dout, *out, *lse, *dqkv;
    int32_t *pos; /* docmask positions, NULL without documents */
} whole_t;

/* Documents of sequence 0 start at 0, c/2, T/2 - c/2 - 1 and T - c/2 - 1
 * (c = T/(2cp)): the second from rank 0's first chunk on into chunk cp-1,
 * the last rank's first half; the third across the middle (rank cp-1's
 * first half into its second, then rank 0's second half). Other sequences:
 * a document starts at each token with probability 1/8. */
static int32_t *make_pos(const shape_t *s, int cp)
{
    int32_t *pos = xcalloc((size_t)s->B * s->T, sizeof(int32_t));
    int c = s->T / (2 * cp);
    for (int b = 0; b < s->B; b++) {
        unsigned char *start = xcalloc((size_t)s->T, 1);
        start[0] = 1;
        if (b == 0) {
            int at[3] = {c / 2 > 0 ? c / 2 : 1, s->T / 2 - c / 2 - 1, s->T - c / 2 - 1};
            for (int j = 0; j < 3; j++)
                if (at[j] > 0 && at[j] < s->T)
                    start[at[j]] = 1;
        } else {
            for (int t = 1; t < s->T; t++)
                start[t] = next_u64() % 8 == 0;
        }
        for (int t = 0; t < s->T; t++)
            pos[(size_t)b * s->T + t] = start[t] ? 0 : pos[(size_t)b * s->T + t - 1] + 1;
        free(start);
    }
    return pos;
}

static void whole_make(whole_t *w, const shape_t *s, uint64_t seed, const ops_t *o)
{
    w->s = *s;
    rng_state = seed;
    const size_t N = (size_t)s->B * s->T;
    w->qkv = xcalloc(N * sz_R(s), sizeof(float));
    w->dout = xcalloc(N * sz_OC(s), sizeof(float));
    w->out = xcalloc(N * sz_OC(s), sizeof(float));
    w->lse = xcalloc((size_t)s->B * s->NH * s->T, sizeof(float));
    w->dqkv = xcalloc(N * sz_R(s), sizeof(float));
    for (size_t i = 0; i < N * sz_R(s); i++)
        w->qkv[i] = 2.0f * frand(); /* scores up to a few units: peaked rows */
    for (size_t i = 0; i < N * sz_OC(s); i++)
        w->dout[i] = frand();
    w->pos = s->docs ? make_pos(s, g_size) : NULL;
    o->attention_fwd(o->ctx, w->out, NULL, w->lse, w->qkv, w->pos, s->B, s->T, s->NH, s->NKV, s->HS);
    o->attention_bwd(o->ctx, w->dqkv, NULL, w->dout, w->qkv, w->out, w->lse, w->pos, s->B, s->T, s->NH, s->NKV, s->HS);
    o->sync(o->ctx);
}

static void whole_free(whole_t *w)
{
    free(w->qkv);
    free(w->dout);
    free(w->out);
    free(w->lse);
    free(w->dqkv);
    free(w->pos);
}

/* This rank's rows of the sequence and the ring's results. */
typedef struct local {
    int L;
    float *qkv, *dout, *out, *lse, *dqkv;
    int32_t *qdoc;
} local_t;

static void local_make(local_t *l, const whole_t *w, const cp_ring_t *ring)
{
    const shape_t *s = &w->s;
    const int32_t *gpos = cp_ring_positions(ring);
    const size_t R = sz_R(s), OC = sz_OC(s);
    l->L = cp_ring_rows(ring);
    const size_t NL = (size_t)s->B * l->L;
    l->qkv = xcalloc(NL * R, sizeof(float));
    l->dout = xcalloc(NL * OC, sizeof(float));
    l->out = xcalloc(NL * OC, sizeof(float));
    l->lse = xcalloc((size_t)s->B * s->NH * l->L, sizeof(float));
    l->dqkv = xcalloc(NL * R, sizeof(float));
    l->qdoc = w->pos ? xcalloc(NL, sizeof(int32_t)) : NULL;
    for (int b = 0; b < s->B; b++)
        for (int i = 0; i < l->L; i++) {
            size_t g = (size_t)b * s->T + gpos[i], li = (size_t)b * l->L + i;
            memcpy(l->qkv + li * R, w->qkv + g * R, R * sizeof(float));
            memcpy(l->dout + li * OC, w->dout + g * OC, OC * sizeof(float));
            if (w->pos)
                l->qdoc[li] = gpos[i] - w->pos[g];
        }
}

static void local_free(local_t *l)
{
    free(l->qkv);
    free(l->dout);
    free(l->out);
    free(l->lse);
    free(l->dqkv);
    free(l->qdoc);
}

/* Errors against the reference: [0] out, [1] lse, [2] dq, [3] dk and dv;
 * max|got - ref| over every rank's rows over max|ref| over the sequence. */
static void errors(const whole_t *w, const local_t *l, const int32_t *gpos, double e[4])
{
    const shape_t *s = &w->s;
    const size_t R = sz_R(s), OC = sz_OC(s), N = (size_t)s->B * s->T;
    double md[4] = {0, 0, 0, 0}, mr[4] = {0, 0, 0, 0};
#define UPD(k, got, ref)                                                                                               \
    do {                                                                                                               \
        double d_ = fabs((double)(got) - (double)(ref));                                                               \
        md[k] = isnan(d_) ? INFINITY : fmax(md[k], d_);                                                                \
    } while (0)
    for (int b = 0; b < s->B; b++)
        for (int i = 0; i < l->L; i++) {
            size_t g = (size_t)b * s->T + gpos[i], li = (size_t)b * l->L + i;
            for (size_t j = 0; j < OC; j++)
                UPD(0, l->out[li * OC + j], w->out[g * OC + j]);
            for (int h = 0; h < s->NH; h++)
                UPD(1, l->lse[((size_t)b * s->NH + h) * l->L + i], w->lse[((size_t)b * s->NH + h) * s->T + gpos[i]]);
            for (size_t j = 0; j < R; j++)
                UPD(j < OC ? 2 : 3, l->dqkv[li * R + j], w->dqkv[g * R + j]);
        }
#undef UPD
    for (size_t n = 0; n < N; n++) {
        for (size_t j = 0; j < OC; j++)
            mr[0] = fmax(mr[0], fabs(w->out[n * OC + j]));
        for (size_t j = 0; j < R; j++)
            mr[j < OC ? 2 : 3] = fmax(mr[j < OC ? 2 : 3], fabs(w->dqkv[n * R + j]));
    }
    for (size_t i = 0; i < (size_t)s->B * s->NH * s->T; i++)
        mr[1] = fmax(mr[1], fabs(w->lse[i]));
    for (int k = 0; k < 4; k++) {
        double d = max_all(md[k]);
        e[k] = mr[k] > 0 ? d / mr[k] : d;
    }
}

static comm_t *g_comm;

static cp_ring_t *ring_open(const shape_t *s, const ops_t *o)
{
    cp_ring_t *ring;
    char err[COMM_ERR_MAX];
    cp_ring_shape_t sh = {s->B, s->T, s->NH, s->NKV, s->HS};
    if (cp_ring_create(g_comm, o, &sh, &ring, err, sizeof err) != STATUS_OK)
        die(err);
    return ring;
}

/* Forward and backward on this rank's rows; the ring's failure ends the job. */
static void ring_run(cp_ring_t *ring, const ops_t *o, local_t *l, cp_ring_stats_t *st)
{
    char err[COMM_ERR_MAX];
    if (cp_ring_forward(ring, l->out, l->lse, l->qkv, l->qdoc, st, err, sizeof err) != STATUS_OK ||
        cp_ring_backward(ring, l->dqkv, l->dout, l->qkv, l->out, l->lse, l->qdoc, st, err, sizeof err) != STATUS_OK)
        die(err);
    o->sync(o->ctx);
}

static int same_bits(const local_t *a, const local_t *b, const shape_t *s)
{
    const size_t NL = (size_t)s->B * a->L;
    return !memcmp(a->out, b->out, NL * sz_OC(s) * sizeof(float)) &&
           !memcmp(a->lse, b->lse, (size_t)s->B * s->NH * a->L * sizeof(float)) &&
           !memcmp(a->dqkv, b->dqkv, NL * sz_R(s) * sizeof(float));
}

/* (a), and for the first case (b) and (c). */
static void test_case(const ops_t *o, const ops_t *defer, const shape_t *s, uint64_t seed, int extra)
{
    whole_t w;
    whole_make(&w, s, seed, o);
    cp_ring_t *ring = ring_open(s, o);
    local_t l;
    local_make(&l, &w, ring);
    cp_ring_stats_t st = {0};
    ring_run(ring, o, &l, &st);
    double e[4];
    errors(&w, &l, cp_ring_positions(ring), e);
    double ef = fmax(e[0], e[1]), eb = fmax(e[2], e[3]);
    g_worst_fwd = fmax(g_worst_fwd, ef);
    g_worst_bwd = fmax(g_worst_bwd, eb);
    const double kib = (double)s->B * (s->T / g_size) * 2 * s->NKV * s->HS * sizeof(float) / 1024.0;
    check(ef <= TOL && eb <= TOL,
          "cp %d B %d T %3d NH %d NKV %d HS %d docs %-8s (%4.0f KiB a block)  out %.1e lse %.1e  dq %.1e dkv %.1e",
          g_size, s->B, s->T, s->NH, s->NKV, s->HS, s->docs ? "crossing" : "none", kib, e[0], e[1], e[2], e[3]);
    if (extra) {
        local_t l2;
        local_make(&l2, &w, ring);
        ring_run(ring, o, &l2, NULL);
        check(same_bits(&l, &l2, s), "cp %d: a rerun gives the same bits (out, lse, dqkv)", g_size);
        local_free(&l2);

        cp_ring_t *rd = ring_open(s, defer);
        local_make(&l2, &w, rd);
        g_comm->device_sync = defer->sync;
        g_comm->device_ctx = defer->ctx;
        ring_run(rd, defer, &l2, NULL);
        g_comm->device_sync = NULL;
        g_comm->device_ctx = NULL;
        long n_ops, waits;
        ops_defer_counts(defer, &n_ops, &waits, NULL);
        check(same_bits(&l, &l2, s) && n_ops > 0,
              "cp %d: the deferred ops table (%ld ops queued, %ld waits; comm device_sync its sync) gives the CPU "
              "table's bits",
              g_size, n_ops, waits);
        cp_ring_destroy(rd);
        local_free(&l2);

        const long long block = (long long)s->B * (s->T / g_size) * 2 * s->NKV * s->HS * sizeof(float);
        const long long want = (long long)(3 * g_size - 2) * block;
        double wait = max_all(st.wait_fwd_s + st.wait_bwd_s), ring_s = max_all(st.ring_fwd_s + st.ring_bwd_s);
        check(st.bytes_sent == want && st.messages == 3 * g_size - 2 && st.wait_fwd_s <= st.ring_fwd_s &&
                  st.wait_bwd_s <= st.ring_bwd_s,
              "cp %d: stats: %lld bytes in %ld messages (want %lld: 3cp-2 blocks), blocked %.2f ms of the ring's "
              "%.2f ms (slowest rank)",
              g_size, st.bytes_sent, st.messages, want, wait * 1e3, ring_s * 1e3);
    }
    cp_ring_destroy(ring);
    local_free(&l);
    whole_free(&w);
}

/* The pack and unpack ops on their own: kv = qkv's k,v columns; unpack
 * with accum 0 writes dqkv's k,v columns, with accum 1 adds, q columns
 * untouched either way (exact: small integers). */
static void test_pack(const ops_t *o)
{
    const int N = 5, NH = 4, NKV = 2, HS = 3, R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS;
    float qkv[5 * 24], kv[5 * 12], d[5 * 24];
    for (int i = 0; i < N * R; i++)
        qkv[i] = (float)i;
    o->attention_kv_pack(o->ctx, kv, qkv, N, NH, NKV, HS);
    for (int i = 0; i < N * R; i++)
        d[i] = -1.0f;
    o->attention_kv_unpack(o->ctx, d, kv, N, NH, NKV, HS, 0);
    o->attention_kv_unpack(o->ctx, d, kv, N, NH, NKV, HS, 1);
    o->sync(o->ctx);
    int ok = 1;
    for (int n = 0; n < N; n++) {
        for (int j = 0; j < KR; j++)
            ok &= kv[n * KR + j] == qkv[n * R + OC + j];
        for (int j = 0; j < R; j++)
            ok &= d[n * R + j] == (j < OC ? -1.0f : 2.0f * qkv[n * R + j]);
    }
    check(ok, "pack: kv is qkv's k,v columns; unpack writes (accum 0) and adds (accum 1) dqkv's k,v columns only");
}

static void test_refusals(const ops_t *o)
{
    cp_ring_t *ring = NULL;
    char err[COMM_ERR_MAX] = "";
    cp_ring_shape_t sh = {2, 2 * g_size * 8 + 2, 4, 2, 16};
    status_t rc = cp_ring_create(g_comm, o, &sh, &ring, err, sizeof err);
    check(rc == STATUS_INPUT && !ring && !strchr(err, '\n') && strstr(err, "cp ring"),
          "cp %d: T %d refused with one line: %s", g_size, sh.T, err);
    sh = (cp_ring_shape_t){2, 4 * g_size, 4, 3, 16};
    rc = cp_ring_create(g_comm, o, &sh, &ring, err, sizeof err);
    check(rc == STATUS_INPUT && !ring, "cp %d: 4 heads over 3 KV heads refused: %s", g_size, err);
}

/* --freeze RANK --timeout S: see the top. Never returns. */
static void freeze(const ops_t *o, int victim, double timeout)
{
    char err[COMM_ERR_MAX], who[64];
    snprintf(who, sizeof who, "rank %d (cp ring test)", g_rank);
    watchdog_t *wd = watchdog_start(timeout, who, err, sizeof err);
    if (!wd)
        die(err);
    int32_t *world = xcalloc((size_t)g_size, sizeof(int32_t));
    for (int r = 0; r < g_size; r++)
        world[r] = r;
    char *hosts = xcalloc((size_t)g_size, 64), me[64] = "";
    gethostname(me, sizeof me - 1);
    if (MPI_Allgather(me, 64, MPI_CHAR, hosts, 64, MPI_CHAR, MPI_COMM_WORLD) != MPI_SUCCESS)
        die("MPI_Allgather(hosts)");
    if (watchdog_set_hosts(wd, hosts, 64, g_size) != 0 || watchdog_add_group(wd, "cp", g_size, world) != 0)
        die("watchdog_set_hosts/add_group");
    g_comm->watch = wd;
    shape_t s = {2, 32 * g_size, 4, 2, 16, 0};
    whole_t w;
    whole_make(&w, &s, 7, o);
    cp_ring_t *ring = ring_open(&s, o);
    local_t l;
    local_make(&l, &w, ring);
    if (g_rank == victim) {
        const char *f = getenv("CP_FREEZE_PID");
        FILE *fp = f ? fopen(f, "w") : NULL;
        if (fp) {
            fprintf(fp, "%ld\n", (long)getpid());
            fclose(fp);
        }
        raise(SIGSTOP);
    }
    ring_run(ring, o, &l, NULL);
    printf("test_cp_ring: rank %d: the ring returned with rank %d stopped\n", g_rank, victim);
    watchdog_stop(wd);
    MPI_Finalize();
    exit(1);
}

int main(int argc, char **argv)
{
    int provided;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "test_cp_ring: MPI_Init_thread failed\n");
        return 1;
    }
    if (MPI_Comm_rank(MPI_COMM_WORLD, &g_rank) != MPI_SUCCESS || MPI_Comm_size(MPI_COMM_WORLD, &g_size) != MPI_SUCCESS)
        die("MPI_Comm_rank/size");
    MPI_Comm world = MPI_COMM_WORLD;
    g_comm = comm_mpi_create(&world);
    if (!g_comm)
        die("comm_mpi_create");
    snprintf(g_comm->name, sizeof g_comm->name, "cp");
    const ops_t *o = ops_cpu_create(), *d = o ? ops_defer_create(ops_cpu_create()) : NULL;
    if (!o || !d)
        die("out of memory");
    if (argc == 5 && !strcmp(argv[1], "--freeze") && !strcmp(argv[3], "--timeout"))
        freeze(o, atoi(argv[2]), atof(argv[4]));
    if (argc != 1)
        die("usage: test_cp_ring [--freeze RANK --timeout S]");

    static const int NKVs[] = {4, 2, 1};
    static const int HSs[] = {16, 32};
    int n = 0;
    for (int a = 0; a < 3; a++)
        for (int h = 0; h < 2; h++)
            for (int docs = 0; docs < 2; docs++, n++) {
                shape_t s = {2, (n % 2 ? 64 : 96) * g_size / 2, 4, NKVs[a], HSs[h], docs};
                test_case(o, d, &s, 1000 + (uint64_t)n, n == 1);
            }
    shape_t one = {2, 2 * g_size, 4, 2, 16, 1}; /* one token a chunk */
    test_case(o, d, &one, 77, 0);
    shape_t big = {2, 256 * g_size, 4, 4, 32, 1}; /* 512 KiB blocks: rendezvous */
    test_case(o, d, &big, 99, 1);
    if (g_rank == 0)
        printf("     worst over the cases: forward %.2e, backward %.2e (tolerance %.0e)\n", g_worst_fwd, g_worst_bwd,
               TOL);
    test_pack(o);
    test_pack(d);
    test_refusals(o);
    if (g_rank == 0)
        printf("%d checks, %d failure(s)\n", g_checks, g_fails);
    ops_release(d);
    ops_release(o);
    g_comm->ops->destroy(g_comm);
    MPI_Finalize();
    return g_fails ? 1 : 0;
}
