/* --doc-mask at the model level, one process: a batch packed with several
 * documents gives the loss and every gradient of its documents run one by
 * one, each alone in a row of its own length.
 *
 * For tiny (GPT-2: learned positions) and tiny-llama (RoPE, GQA), B = 2
 * rows of T = 150 tokens (so documents cross the CPU attention's 64-row
 * query blocks, and whole blocks of keys are skipped), with a document
 * start token placed at fixed offsets; row 1 begins with a partial
 * document. Positions come from the tokens (docmask_positions), as the
 * trainer makes them.
 *   packed:    one forward (targets counted: N) and backward;
 *   one by one: each document d of L_d tokens as a 1 x L_d batch with its
 *              own targets, dloss = L_d / N, gradients accumulated; the
 *              expected loss is sum_d (L_d / N) mean_d (in double).
 * Loss and every gradient tensor agree within TOL, relative (2-norms,
 * worst tensor: see worst_tensor). Then --recompute full and selective with
 * positions give the packed run's gradients bit for bit (the recomputed
 * forward uses the same mask), and the packed run differs from the same
 * batch without positions (the mask does something).
 * Prints one line per check; exits 1 if any fails.
 *
 * test_docmask --grid tp2sp | pp2 (2 ranks) runs the same model checks at
 * tp 2 with sequence parallelism (every document of even length: a 1 x L
 * batch is cut along the sequence) or on two pipeline stages (stage 0 sends
 * its output to stage 1 and gets its gradient back, one microbatch at a
 * time); each rank compares its own shard or stage, the worst over ranks
 * is checked.
 *
 * test_docmask --bench [T [B [NH [HS]]]] instead times the CPU attention
 * (attention_fwd + attention_bwd, defaults T 1024, B 4, NH 12, HS 64: GPT-2
 * 124M's attention at micro batch 4) unmasked and with documents of mean
 * length T/4 (lengths uniform in 1 .. T/2 - 1), best of 5 calls each after
 * one warm-up (bench/README.md). */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/clock.h"
#include "mpi/comm.h"
#include "src/backend/ops_cpu.h"
#include "src/model/docmask.h"
#include "src/model/model.h"
#include "src/model/model_config.h"

#define TOL 1e-6
enum { B = 2, T = 150, N = B * T };
/* document start tokens of each row (-1 ends a list): row 1 begins with the
 * tail of a document, whose t = 0 token is not a start */
static const int starts_odd[B][6] = {{0, 37, 38, 100, 142, -1}, {20, 84, 85, 86, 120, -1}};
/* under sequence parallelism a 1 x L batch needs L a multiple of the TP
 * size: the same shapes, every length even */
static const int starts_even[B][6] = {{0, 38, 40, 100, 142, -1}, {20, 84, 86, 88, 120, -1}};
static const int (*starts)[6] = starts_odd;

/* The grid the model runs on (--grid): tp2 with sequence parallelism, or
 * two pipeline stages driven by hand (one microbatch at a time, blocking
 * sends: the schedule is test_pipeline's concern), or one rank. */
typedef struct grid {
    int tp, pp, rank;
    comm_t *tpc; /* the TP group: the world at tp 2 */
    const char *name;
} grid_t;
static grid_t grid = {.tp = 1, .pp = 1, .rank = 0, .tpc = NULL, .name = "1 rank"};

static int n_fail;

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "test_docmask: out of memory\n");
        exit(1);
    }
    return p;
}

/* Every rank's worst (max) or all (min over ok flags) */
static double agree_max(double x)
{
    double y = x;
    if (grid.tp * grid.pp > 1 && MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
        return INFINITY;
    return y;
}

static void check(const char *what, double err, double tol)
{
    err = agree_max(err);
    int ok = err <= tol;
    if (grid.rank == 0)
        printf("%-64s %.2e (tol %.0e) %s\n", what, err, tol, ok ? "ok" : "FAIL");
    n_fail += !ok;
}

static void check_true(const char *what, int ok)
{
    ok = agree_max(!ok) == 0.0;
    if (grid.rank == 0)
        printf("%-64s %s\n", what, ok ? "ok" : "FAIL");
    n_fail += !ok;
}

/* The batch: a deterministic token stream with the start token DOC at the
 * document starts (and nowhere else); targets are the next token. */
static void make_batch(int V, int32_t doc, int32_t *tok, int32_t *tgt)
{
    uint32_t s = 12345;
    for (int b = 0; b < B; b++) {
        for (int t = 0; t <= T; t++) {
            s = s * 1664525u + 1013904223u;
            int32_t x = (int32_t)((s >> 8) % (uint32_t)(V - 1)); /* never DOC */
            for (int k = 0; starts[b][k] >= 0; k++)
                if (starts[b][k] == t)
                    x = doc;
            if (t < T)
                tok[b * T + t] = x;
            if (t > 0)
                tgt[b * T + t - 1] = x;
        }
    }
}

static int create(model_t *m, const model_config_t *c, const ops_t *ops, model_recompute_t rc)
{
    char err[256];
    model_layout_t lay = model_layout_single(c);
    lay.part.tp_size = grid.tp;
    lay.part.tp_rank = grid.tp > 1 ? grid.rank : 0;
    lay.tp = grid.tpc;
    lay.sequence_parallel = grid.tp > 1;
    if (grid.pp > 1) { /* two stages: layers [0, L/2) with the embeddings, the rest with the head */
        const int half = c->n_layer / 2, last = grid.rank == grid.pp - 1;
        lay.part.run_begin[0] = last ? half : 0;
        lay.part.run_end[0] = last ? c->n_layer : half;
        lay.part.has_embed = !last;
        lay.part.has_head = last;
    }
    lay.doc_mask = 1;
    lay.recompute = rc;
    if (model_create(m, c, ops, &lay, B, T, err, sizeof err) != 0 || model_init_params(m, 7) != 0) {
        fprintf(stderr, "test_docmask: model_create: %s\n", err);
        return -1;
    }
    return 0;
}

/* One microbatch (b x t) forward and backward on the grid; the loss
 * (the last stage's) on every rank, NAN if anything failed. At pp 2 stage
 * 0 sends its output to stage 1 and receives dL/d(output) back. */
static double step(model_t *m, const int32_t *tok, const int32_t *pos, const int32_t *tgt, int b, int t, float dloss,
                   int accum, int last)
{
    const int first_stage = grid.pp == 1 || grid.rank == 0, last_stage = grid.pp == 1 || grid.rank == grid.pp - 1;
    const int n = (int)model_stage_floats(m, b, t), peer = 1 - grid.rank;
    int bad = 0;
    if (!first_stage)
        bad |=
            MPI_Recv(model_stage_input(m, 0), n, MPI_FLOAT, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS;
    char err[512];
    float lf = NAN;
    bad |= model_forward(m, 0, tok, pos, last_stage ? tgt : NULL, b, t, dloss, &lf, err, sizeof err) != STATUS_OK;
    double loss = lf;
    if (!last_stage) {
        bad |= MPI_Send(model_stage_output(m, 0), n, MPI_FLOAT, peer, 0, MPI_COMM_WORLD) != MPI_SUCCESS;
        bad |= MPI_Recv(model_stage_grad(m), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE) != MPI_SUCCESS;
    }
    bad |= model_backward(m, 0, accum, last, err, sizeof err) != STATUS_OK;
    if (!first_stage)
        bad |= MPI_Send(model_stage_grad(m), n, MPI_FLOAT, peer, 1, MPI_COMM_WORLD) != MPI_SUCCESS;
    if (grid.pp > 1 && MPI_Bcast(&loss, 1, MPI_DOUBLE, grid.pp - 1, MPI_COMM_WORLD) != MPI_SUCCESS)
        bad = 1;
    return bad ? NAN : loss;
}

/* The packed batch's loss and gradients (host [numel]) with positions pos
 * (NULL: none). */
static double packed(model_t *m, const int32_t *tok, const int32_t *pos, const int32_t *tgt, float *grads)
{
    double loss = step(m, tok, pos, tgt, B, T, 1.0f, 0, 1);
    m->ops->to_host(m->ops->ctx, grads, m->grads, m->table.numel * sizeof(float));
    return loss;
}

/* The same documents one by one (each a 1 x L batch), gradients of
 * sum_d (L_d / N) mean_d accumulated. */
static double one_by_one(model_t *m, const int32_t *tok, const int32_t *pos, const int32_t *tgt, float *grads)
{
    double loss = 0.0;
    int first = 1;
    for (int n = 0; n < N;) {
        int L = 1;
        while (n + L < N && (n + L) % T != 0 && pos[n + L] != 0)
            L++;
        /* norm gradients under sequence parallelism are TP-reduced once,
         * after the last document */
        double mean = step(m, tok + n, NULL, tgt + n, 1, L, (float)L / (float)N, !first, n + L == N);
        loss += (double)L / N * mean;
        first = 0;
        n += L;
    }
    m->ops->to_host(m->ops->ctx, grads, m->grads, m->table.numel * sizeof(float));
    return loss;
}

/* Worst tensor: ||a - b|| / ||a|| (2-norms) over each tensor of the table.
 * A tensor whose gradient is zero but for rounding (under 1e-6 of the
 * largest tensor's norm: the key bias, as softmax does not see a shift
 * shared by all of a row's scores) is measured against the largest norm. */
static double worst_tensor(const param_table_t *tab, const float *a, const float *b, char *name, size_t namelen)
{
    double worst = 0.0, top = 0.0;
    for (int k = 0; k < tab->n; k++) {
        const param_desc_t *d = &tab->p[k];
        double na = 0.0;
        for (size_t i = 0; i < d->numel; i++)
            na += (double)a[d->offset + i] * a[d->offset + i];
        top = fmax(top, sqrt(na));
    }
    for (int k = 0; k < tab->n; k++) {
        const param_desc_t *d = &tab->p[k];
        double na = 0.0, nd = 0.0;
        for (size_t i = 0; i < d->numel; i++) {
            double x = a[d->offset + i], y = b[d->offset + i];
            na += x * x;
            nd += (x - y) * (x - y);
        }
        /* zero but for rounding: against the largest tensor's norm */
        double r = sqrt(nd) / (sqrt(na) < 1e-6 * top ? top : sqrt(na));
        if (r >= worst) {
            worst = r;
            snprintf(name, namelen, "%s", d->name);
        }
    }
    return worst;
}

static void test_model(const char *preset)
{
    const model_config_t *c = &model_preset_find(preset)->cfg;
    const ops_t *ops = ops_cpu_create();
    model_t m;
    if (!ops || create(&m, c, ops, MODEL_RECOMPUTE_NONE) != 0) {
        ops_release(ops);
        n_fail++;
        return;
    }
    const size_t P = m.table.numel;
    int32_t *tok = xmalloc(N * sizeof *tok), *tgt = xmalloc(N * sizeof *tgt), *pos = xmalloc(N * sizeof *pos);
    float *g1 = xmalloc(P * sizeof *g1), *g2 = xmalloc(P * sizeof *g2);
    const int32_t doc = (int32_t)c->vocab_size - 1;
    make_batch(c->vocab_size, doc, tok, tgt);
    docmask_positions(tok, B, T, doc, -1, pos);
    char what[160], name[64];

    double lp = packed(&m, tok, pos, tgt, g1), l1 = one_by_one(&m, tok, pos, tgt, g2);
    snprintf(what, sizeof what, "%s %s: packed loss %.7f vs one by one %.7f", preset, grid.name, lp, l1);
    check(what, fabs(lp - l1) / fabs(l1), TOL);
    double w = worst_tensor(&m.table, g2, g1, name, sizeof name);
    snprintf(what, sizeof what, "%s %s: every gradient, packed vs one by one (rank 0's worst %s)", preset, grid.name,
             name);
    check(what, w, TOL);

    /* without positions the same batch attends across documents */
    float *g3 = xmalloc(P * sizeof *g3);
    double lu = packed(&m, tok, NULL, tgt, g3);
    snprintf(what, sizeof what, "%s %s: without positions the loss differs (%.7f)", preset, grid.name, lu);
    check_true(what, fabs(lu - lp) > 1e-4 * fabs(lp));
    model_destroy(&m);

    /* recomputation reuses the slot's positions: the same bits */
    for (int rc = MODEL_RECOMPUTE_SELECTIVE; rc <= MODEL_RECOMPUTE_FULL; rc++) {
        model_t r;
        if (create(&r, c, ops, (model_recompute_t)rc) != 0) {
            n_fail++;
            continue;
        }
        double lr = packed(&r, tok, pos, tgt, g3);
        snprintf(what, sizeof what, "%s %s: --recompute %s: loss and gradients bit-identical", preset, grid.name,
                 rc == MODEL_RECOMPUTE_FULL ? "full" : "selective");
        check_true(what, lr == lp && memcmp(g1, g3, P * sizeof *g1) == 0);
        model_destroy(&r);
    }
    free(tok), free(tgt), free(pos), free(g1), free(g2), free(g3);
    ops_release(ops);
}

/* Best of 5 timed attention_fwd + attention_bwd calls, in ms. */
static double time_attention(const ops_t *o, const int32_t *pos, const float *qkv, const float *dout, float *out,
                             float *lse, float *dqkv, int b, int t, int nh, int hs)
{
    double best = 1e30;
    for (int it = 0; it < 6; it++) {
        double t0 = now_s();
        o->attention_fwd(o->ctx, out, NULL, lse, qkv, pos, b, t, nh, nh, hs);
        o->attention_bwd(o->ctx, dqkv, NULL, dout, qkv, out, lse, pos, b, t, nh, nh, hs);
        double dt = now_s() - t0;
        if (it > 0 && dt < best)
            best = dt;
    }
    return 1e3 * best;
}

static int bench(int argc, char **argv)
{
    const int t = argc > 2 ? atoi(argv[2]) : 1024, b = argc > 3 ? atoi(argv[3]) : 4;
    const int nh = argc > 4 ? atoi(argv[4]) : 12, hs = argc > 5 ? atoi(argv[5]) : 64;
    if (t < 4 || b < 1 || nh < 1 || hs < 1) {
        fprintf(stderr, "usage: test_docmask --bench [T [B [NH [HS]]]]\n");
        return 2;
    }
    const size_t n = (size_t)b * t, nqkv = n * 3 * nh * hs, nout = n * nh * hs;
    float *qkv = xmalloc(nqkv * sizeof *qkv), *dqkv = xmalloc(nqkv * sizeof *dqkv);
    float *out = xmalloc(nout * sizeof *out), *dout = xmalloc(nout * sizeof *dout);
    float *lse = xmalloc((size_t)b * nh * t * sizeof *lse);
    int32_t *pos = xmalloc(n * sizeof *pos);
    uint32_t s = 7;
    for (size_t i = 0; i < nqkv; i++)
        qkv[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    for (size_t i = 0; i < nout; i++)
        dout[i] = (float)((s = s * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f;
    size_t docs = 0;
    for (int r = 0; r < b; r++) /* documents of 1 .. T/2 - 1 tokens */
        for (int i = 0, left = 0; i < t; i++) {
            const int start = left == 0;
            if (start)
                left = 1 + (int)(((s = s * 1664525u + 1013904223u) >> 8) % (uint32_t)(t / 2 - 1));
            pos[(size_t)r * t + i] = start ? 0 : pos[(size_t)r * t + i - 1] + 1;
            docs += start;
            left--;
        }
    const ops_t *o = ops_cpu_create();
    if (!o) {
        fprintf(stderr, "test_docmask: out of memory for the CPU backend\n");
        return 1;
    }
    double full = time_attention(o, NULL, qkv, dout, out, lse, dqkv, b, t, nh, hs);
    double masked = time_attention(o, pos, qkv, dout, out, lse, dqkv, b, t, nh, hs);
    ops_release(o);
    printf("attention fwd+bwd, CPU, %d threads: B %d T %d NH %d HS %d; %zu documents of mean length %.0f\n",
           ops_cpu_threads(0), b, t, nh, hs, docs, (double)n / (double)docs);
    printf("unmasked %.1f ms, --doc-mask %.1f ms: %.2fx faster\n", full, masked, full / masked);
    free(qkv), free(dqkv), free(out), free(dout), free(lse), free(pos);
    return 0;
}

/* --grid tp2sp | pp2, on 2 ranks. Returns 0 or -1 (said on stderr). */
static int grid_setup(const char *name)
{
    int size;
    if (MPI_Comm_rank(MPI_COMM_WORLD, &grid.rank) != MPI_SUCCESS ||
        MPI_Comm_size(MPI_COMM_WORLD, &size) != MPI_SUCCESS || size != 2) {
        fprintf(stderr, "test_docmask: --grid %s runs on 2 ranks\n", name);
        return -1;
    }
    if (strcmp(name, "tp2sp") == 0) {
        const MPI_Comm world = MPI_COMM_WORLD;
        grid.tp = 2;
        grid.name = "tp2 sequence-parallel";
        grid.tpc = comm_mpi_create(&world);
        starts = starts_even;
        return grid.tpc ? 0 : -1;
    }
    if (strcmp(name, "pp2") == 0) {
        grid.pp = 2;
        grid.name = "pp2";
        return 0;
    }
    fprintf(stderr, "test_docmask: --grid %s: tp2sp or pp2\n", name);
    return -1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--bench") == 0)
        return bench(argc, argv);
    MPI_Init(&argc, &argv);
    if (argc > 2 && strcmp(argv[1], "--grid") == 0 && grid_setup(argv[2]) != 0) {
        MPI_Finalize();
        return 1;
    }
    /* positions from tokens: starts at DOC tokens, after doc_end tokens,
     * and at t = 0 of every row */
    const int32_t tk[8] = {5, 9, 1, 9, 9, 2, 7, 3};
    int32_t p[8];
    docmask_positions(tk, 2, 4, 9, -1, p);
    const int32_t want_start[8] = {0, 0, 1, 0, 0, 1, 2, 3};
    check_true("docmask_positions, doc_start 9", memcmp(p, want_start, sizeof p) == 0);
    docmask_positions(tk, 2, 4, -1, 9, p);
    const int32_t want_end[8] = {0, 1, 0, 1, 0, 0, 1, 2};
    check_true("docmask_positions, doc_end 9", memcmp(p, want_end, sizeof p) == 0);
    check_true("docmask_square_sum: 1 + 4 + 9 + 4 = 18 for lengths 1, 2, 3, 2",
               docmask_square_sum((const int32_t[]){0, 0, 1, 0, 1, 2, 0, 1}, 8) == 18.0);
    test_model("tiny");
    test_model("tiny-llama");
    if (grid.rank == 0)
        printf("%s\n", n_fail ? "FAILED" : "all checks passed");
    if (grid.tpc)
        grid.tpc->ops->destroy(grid.tpc);
    MPI_Finalize();
    return n_fail ? 1 : 0;
}
