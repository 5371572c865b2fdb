/* Pipeline schedules and executor (mpi/pipeline.c), on a synthetic model,
 * at whatever size it is started with (test_pipeline.sh runs np 1..4; the
 * world is the pipeline, one stage per rank).
 *
 * (a) Schedule properties for P = 1..8 stages, M = 1..16 microbatches,
 *     both kinds, every stage: each microbatch's forward once, then its
 *     backward once; forwards and backwards in increasing microbatch
 *     order; 1f1b warm-up length and strict alternation after it; the most
 *     microbatches in flight equals pipe_slots() and no two in flight share
 *     a slot. Across stages, an ideal run (forward 1, backward 2 time
 *     units, each action waiting for its neighbour's) never stalls and ends
 *     at (M + P - 1) * 3, the bubble-optimal makespan.
 * (b) The executor: stage s computes y = w_s * x + b_s elementwise on n
 *     floats; the last stage's loss is sum(y * t_m). Backward: dx = w_s *
 *     dy, dw_s += dy * x, db_s += dy. Every value is a small integer, so
 *     fp32 is exact whatever the order and dw, db, loss are compared with
 *     the closed form by ==. Also checked inside the callbacks: the order
 *     of calls is pipe_schedule()'s, every received activation and
 *     gradient is the one of its microbatch. Backward poisons its output
 *     and input slot afterwards (NaN), so an overwrite of a slot before
 *     its send completed or a receive posted too early shows up as NaN.
 *     n = 65536 floats (256 KiB) is far above the shared-memory eager
 *     limit, so sends complete only when matched.
 * (d) The bubble: each kind at M = 2P and 4P runs through the executor in
 *     virtual time (every action 1/V units, messages carry their sender's
 *     clock: check_bubble_virtual); each rank's idle fraction of the step
 *     equals pipe_simulate's ideal and the schedule's formula exactly.
 *     `test_pipeline --bubble-wall UNIT_MS` measures it on the wall clock
 *     with sleeps as compute and asserts 2 points (bench/pp_bubble.sh: a
 *     benchmark, since waiting ranks poll and load delays their wake-ups).
 *
 * Each check is agreed over all ranks; rank 0 prints one line per check
 * and every rank exits with the same status. */
#define _POSIX_C_SOURCE 200809L /* nanosleep, setenv */

#include "mpi/comm.h"
#include "mpi/comm_inorder.h"
#include "mpi/pipeline.h"

#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int g_rank, g_size, g_checks, g_fails;

static void die(const char *what)
{
    fprintf(stderr, "test_pipeline: rank %d: %s\n", g_rank, what);
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* Collective over the world: ok is this rank's verdict, detail its reason
 * when !ok. Returns 1 when every rank passed. */
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

/* ------------------------------------------------------ (a) schedules */

/* Local properties of one stage's schedule; 1 or 0 with the reason. */
static int schedule_ok(pipe_kind_t k, int P, int s, int M, char *d, size_t dl)
{
    pipe_action_t a[2 * 16];
    const int S = pipe_slots(k, P, s, M);
    const int want_S = k == PIPE_GPIPE ? M : (P - s < M ? P - s : M);
    if (S != want_S) {
        snprintf(d, dl, "pipe_slots %d, want %d", S, want_S);
        return 0;
    }
    const int na = pipe_schedule(k, P, s, M, a);
    if (na != 2 * M) {
        snprintf(d, dl, "%d actions, want %d", na, 2 * M);
        return 0;
    }
    int fpos[16], bpos[16], fslot[16], holder[16];
    for (int m = 0; m < 16; m++)
        fpos[m] = bpos[m] = holder[m] = -1;
    int next_f = 0, next_b = 0, inflight = 0, peak = 0, first_bwd = -1;
    for (int i = 0; i < na; i++) {
        const int m = a[i].micro, sl = a[i].slot;
        if (m < 0 || m >= M || sl < 0 || sl >= S) {
            snprintf(d, dl, "action %d: micro %d slot %d out of range (slots %d)", i, m, sl, S);
            return 0;
        }
        if (a[i].op == PIPE_FWD) {
            if (m != next_f++) {
                snprintf(d, dl, "action %d: forward of %d out of order", i, m);
                return 0;
            }
            if (holder[sl] >= 0) {
                snprintf(d, dl, "action %d: forward of %d into slot %d held by %d", i, m, sl, holder[sl]);
                return 0;
            }
            holder[sl] = m;
            fpos[m] = i;
            fslot[m] = sl;
            if (++inflight > peak)
                peak = inflight;
            /* 1f1b after warm-up: never two forwards in a row */
            if (k == PIPE_1F1B && first_bwd >= 0 && i > 0 && a[i - 1].op == PIPE_FWD) {
                snprintf(d, dl, "action %d: two forwards in a row after warm-up", i);
                return 0;
            }
        } else {
            if (m != next_b++ || fpos[m] < 0 || bpos[m] >= 0) {
                snprintf(d, dl, "action %d: backward of %d out of order or before its forward", i, m);
                return 0;
            }
            if (sl != fslot[m] || holder[sl] != m) {
                snprintf(d, dl, "action %d: backward of %d in slot %d, forward used %d", i, m, sl, fslot[m]);
                return 0;
            }
            if (first_bwd < 0)
                first_bwd = i;
            holder[sl] = -1;
            bpos[m] = i;
            inflight--;
        }
    }
    if (next_f != M || next_b != M || inflight != 0) {
        snprintf(d, dl, "%d forwards, %d backwards", next_f, next_b);
        return 0;
    }
    if (peak != S) {
        snprintf(d, dl, "peak in flight %d, pipe_slots %d", peak, S);
        return 0;
    }
    /* the forwards before the first backward: warm-up + 1 (or all M) */
    const int want_first = k == PIPE_GPIPE ? M : (P - s < M ? P - s : M);
    if (first_bwd != want_first) {
        snprintf(d, dl, "first backward at action %d, want %d", first_bwd, want_first);
        return 0;
    }
    return 1;
}

/* The ideal run of all P stages' schedules: each action takes tf or tb
 * units and starts when its stage is free and its input exists (forward
 * of m on s-1 done; backward of m on s+1 done). Returns the makespan, or
 * -1 when no stage can proceed (a schedule-level deadlock). */
static int ideal_makespan(pipe_kind_t k, int P, int M, int tf, int tb)
{
    pipe_action_t a[8][2 * 16];
    int pc[8] = {0}, clock[8] = {0}, fend[8][16], bend[8][16];
    for (int s = 0; s < P; s++) {
        pipe_schedule(k, P, s, M, a[s]);
        for (int m = 0; m < M; m++)
            fend[s][m] = bend[s][m] = -1;
    }
    int left = 2 * M * P, end = 0;
    while (left > 0) {
        int moved = 0;
        for (int s = 0; s < P; s++) {
            while (pc[s] < 2 * M) {
                const pipe_action_t *x = &a[s][pc[s]];
                int ready;
                if (x->op == PIPE_FWD)
                    ready = s == 0 ? 0 : fend[s - 1][x->micro];
                else
                    ready = s == P - 1 ? fend[s][x->micro] : bend[s + 1][x->micro];
                if (ready < 0)
                    break;
                const int t0 = clock[s] > ready ? clock[s] : ready;
                clock[s] = t0 + (x->op == PIPE_FWD ? tf : tb);
                (x->op == PIPE_FWD ? fend : bend)[s][x->micro] = clock[s];
                if (clock[s] > end)
                    end = clock[s];
                pc[s]++;
                left--;
                moved = 1;
            }
        }
        if (!moved)
            return -1;
    }
    return end;
}

static void check_schedules(void)
{
    pipe_kind_t k = PIPE_GPIPE;
    int ok = pipe_kind_parse("1f1b", &k) == 0 && k == PIPE_1F1B && pipe_kind_parse("gpipe", &k) == 0 &&
             k == PIPE_GPIPE && pipe_kind_parse("2f2b", &k) == -1 && k == PIPE_GPIPE && pipe_kind_parse("", &k) == -1 &&
             pipe_kind_parse(NULL, &k) == -1 && strcmp(pipe_kind_name(PIPE_1F1B), "1f1b") == 0 &&
             strcmp(pipe_kind_name(PIPE_GPIPE), "gpipe") == 0;
    check(ok, "", "pipe_kind_parse: 1f1b, gpipe; 2f2b, \"\" and NULL rejected");
    ok = pipe_slots(PIPE_1F1B, 4, 4, 8) == 0 && pipe_slots(PIPE_1F1B, 4, -1, 8) == 0 &&
         pipe_slots(PIPE_1F1B, 4, 0, 0) == 0 && pipe_schedule(PIPE_1F1B, 0, 0, 8, NULL) == -1 &&
         pipe_schedule(PIPE_GPIPE, 4, 0, 0, NULL) == -1;
    check(ok, "", "pipe_slots / pipe_schedule: stage or microbatch count out of range rejected");

    for (int kk = 0; kk < 2; kk++) {
        k = kk ? PIPE_GPIPE : PIPE_1F1B;
        char d[256] = "";
        int good = 1, cases = 0;
        for (int P = 1; P <= 8 && good; P++)
            for (int M = 1; M <= 16 && good; M++)
                for (int s = 0; s < P && good; s++) {
                    cases++;
                    char why[200] = "";
                    if (!schedule_ok(k, P, s, M, why, sizeof why)) {
                        snprintf(d, sizeof d, "P %d M %d stage %d: %s", P, M, s, why);
                        good = 0;
                    }
                }
        if (good)
            for (int P = 1; P <= 8 && good; P++)
                if (k == PIPE_1F1B)
                    for (int M = 1; M <= 16; M++)
                        if (pipe_slots(k, P, 0, M) != (P < M ? P : M)) {
                            snprintf(d, sizeof d, "P %d M %d: stage 0 holds %d, want min(P, M)", P, M,
                                     pipe_slots(k, P, 0, M));
                            good = 0;
                            break;
                        }
        check(good, d,
              "%s schedules, P 1..8 x M 1..16, %d stages: each forward then backward once, in microbatch order, "
              "peak in flight = pipe_slots (1f1b stage 0: min(P, M)), no shared slot",
              pipe_kind_name(k), cases);

        good = 1;
        d[0] = '\0';
        for (int P = 1; P <= 8 && good; P++)
            for (int M = 1; M <= 16 && good; M++)
                for (int tb = 1; tb <= 2; tb++) {
                    const int got = ideal_makespan(k, P, M, 1, tb), want = (M + P - 1) * (1 + tb);
                    if (got != want) {
                        snprintf(d, sizeof d, "P %d M %d tf 1 tb %d: makespan %d, want %d%s", P, M, tb, got, want,
                                 got < 0 ? " (deadlock)" : "");
                        good = 0;
                        break;
                    }
                }
        check(good, d, "%s: the ideal run of all stages never stalls and ends at (M+P-1)*(tf+tb), tb = tf and 2tf",
              pipe_kind_name(k));
    }
}

/* ----------------------------------------------- (b) synthetic model */

/* Small integers: every product and sum below stays under 2^24 for up to
 * 8 model chunks and M <= 16, so fp32 is exact. g is a model chunk
 * (pipe_chunk_of), which for the one-chunk kinds is the stage. */
static float x0_of(int m, size_t i) { return (float)((int)((m + 2 * i) % 5) - 2); }
static float w_of(int g, size_t i) { return (float)(1 + (int)((g + i) % 2)); }
static float b_of(int g, size_t i) { return (float)((int)((g + 3 * i) % 3) - 1); }
static float t_of(int m, size_t i) { return (float)((int)((3 * m + i) % 4) - 1); }

/* The input of chunk g for microbatch m, element i. */
static double x_at(int g, int m, size_t i)
{
    double x = x0_of(m, i);
    for (int q = 0; q < g; q++)
        x = w_of(q, i) * x + b_of(q, i);
    return x;
}

/* dL/d(output of chunk g) for microbatch m, element i, of C chunks. */
static double dy_at(int C, int g, int m, size_t i)
{
    double d = t_of(m, i);
    for (int q = C - 1; q > g; q--)
        d *= w_of(q, i);
    return d;
}

typedef struct synth {
    pipe_shape_t sh;
    int s, C, S, n_act;
    size_t n;
    float *in, *out, *dys, *grad; /* [S][n] x3, [n] */
    float *w, *b, *dw, *db;       /* [V][n] each: the stage's chunks */
    double loss;
    const pipe_action_t *expect; /* pipe_stage_schedule()'s order */
    int pos;
    int fail_fwd; /* forward of this microbatch returns -1 (-1: none) */
    long sleep_f_us, sleep_b_us, sleep_w_us;
    double busy_s; /* seconds measured inside the sleeps (the stage's compute) */
    /* Virtual time (check_bubble_virtual): when set, the last float of every
     * message is the sender's clock at the action's end, each action
     * starts at max(this stage's clock, its message's) and lasts vf, vb
     * or vw; the values check the first n - 1 floats. */
    int clocked;
    double vclock, vf, vb, vw;
    char err[256]; /* first violation seen in a callback */
} synth_t;

/* Sleeps us microseconds as a stage's compute and adds the time it really
 * took (an oversubscribed machine overshoots) to the stage's busy time. */
static void sleep_us(synth_t *c, long us)
{
    if (us <= 0)
        return;
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    const double t0 = MPI_Wtime();
    nanosleep(&ts, NULL);
    c->busy_s += MPI_Wtime() - t0;
}

static void note(synth_t *c, const char *fmt, ...)
{
    if (c->err[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
}

static const char *op_str(pipe_op_t op)
{
    return op == PIPE_FWD ? "F" : op == PIPE_BWD ? "BW" : op == PIPE_BWD_INPUT ? "B" : "W";
}

/* The next action must be (op, chunk, micro, slot). */
static void expect_action(synth_t *c, pipe_op_t op, int chunk, int micro, int slot)
{
    const pipe_action_t *e = c->pos < c->n_act ? &c->expect[c->pos] : NULL;
    if (!e || e->op != op || e->chunk != chunk || e->micro != micro || e->slot != slot)
        note(c, "call %d: %s(chunk %d, micro %d, slot %d), schedule says %s(%d, %d, %d)", c->pos, op_str(op), chunk,
             micro, slot, e ? op_str(e->op) : "end", e ? e->chunk : -1, e ? e->micro : -1, e ? e->slot : -1);
    c->pos++;
}

static int synth_forward(void *ctx, int chunk, int m, int slot)
{
    synth_t *c = ctx;
    expect_action(c, PIPE_FWD, chunk, m, slot);
    if (m == c->fail_fwd)
        return -1;
    const int g = pipe_chunk_of(&c->sh, c->s, chunk);
    const float *w = c->w + (size_t)chunk * c->n, *b = c->b + (size_t)chunk * c->n;
    float *x = c->in + (size_t)slot * c->n, *y = c->out + (size_t)slot * c->n;
    const size_t nd = c->n - (size_t)c->clocked;
    if (c->clocked) {
        c->vclock = fmax(c->vclock, g == 0 ? 0.0 : (double)x[nd]) + c->vf;
        y[nd] = (float)c->vclock;
    }
    for (size_t i = 0; i < nd; i++) {
        if (g == 0)
            x[i] = x0_of(m, i); /* the first chunk makes its own input */
        else if (x[i] != (float)x_at(g, m, i))
            note(c, "fwd chunk %d micro %d: input[%zu] = %g, want %g", g, m, i, (double)x[i], x_at(g, m, i));
        y[i] = w[i] * x[i] + b[i];
        if (g == c->C - 1)
            c->loss += (double)y[i] * t_of(m, i);
    }
    sleep_us(c, c->sleep_f_us);
    return 0;
}

/* B: dL/d(input) into grad(), dy kept in the slot for W; the output is
 * dead (NaN). */
static void synth_b(synth_t *c, int chunk, int m, int slot)
{
    const int g = pipe_chunk_of(&c->sh, c->s, chunk), last = g == c->C - 1;
    const float *w = c->w + (size_t)chunk * c->n;
    float *y = c->out + (size_t)slot * c->n, *dy = c->dys + (size_t)slot * c->n;
    const size_t nd = c->n - (size_t)c->clocked;
    if (c->clocked) {
        c->vclock = fmax(c->vclock, last ? 0.0 : (double)c->grad[nd]) + c->vb;
        c->grad[nd] = (float)c->vclock;
    }
    for (size_t i = 0; i < nd; i++) {
        dy[i] = last ? t_of(m, i) : c->grad[i];
        if (!last && dy[i] != (float)dy_at(c->C, g, m, i))
            note(c, "bwd chunk %d micro %d: grad[%zu] = %g, want %g", g, m, i, (double)dy[i], dy_at(c->C, g, m, i));
        c->grad[i] = w[i] * dy[i];
        y[i] = NAN;
    }
}

/* W: the weight gradients from the slot's input and dy; the slot is dead
 * after it (a receive posted into it too early, or a send of it not yet
 * complete, sees NaN). */
static void synth_w(synth_t *c, int chunk, int slot)
{
    float *x = c->in + (size_t)slot * c->n, *dy = c->dys + (size_t)slot * c->n;
    float *dw = c->dw + (size_t)chunk * c->n, *db = c->db + (size_t)chunk * c->n;
    c->vclock += c->vw;
    for (size_t i = 0; i < c->n - (size_t)c->clocked; i++) {
        dw[i] += dy[i] * x[i];
        db[i] += dy[i];
        x[i] = NAN;
        dy[i] = NAN;
    }
}

static int synth_backward(void *ctx, int chunk, int m, int slot)
{
    synth_t *c = ctx;
    expect_action(c, PIPE_BWD, chunk, m, slot);
    synth_b(c, chunk, m, slot);
    synth_w(c, chunk, slot);
    if (c->clocked) /* the executor sends dL/d(input) when the whole backward returns */
        c->grad[c->n - 1] = (float)c->vclock;
    sleep_us(c, c->sleep_b_us + c->sleep_w_us);
    return 0;
}

static int synth_backward_input(void *ctx, int chunk, int m, int slot)
{
    synth_t *c = ctx;
    expect_action(c, PIPE_BWD_INPUT, chunk, m, slot);
    synth_b(c, chunk, m, slot);
    sleep_us(c, c->sleep_b_us);
    return 0;
}

static int synth_backward_weight(void *ctx, int chunk, int m, int slot)
{
    synth_t *c = ctx;
    expect_action(c, PIPE_BWD_WEIGHT, chunk, m, slot);
    synth_w(c, chunk, slot);
    sleep_us(c, c->sleep_w_us);
    return 0;
}

static float *synth_input(void *ctx, int slot)
{
    synth_t *c = ctx;
    return c->in + (size_t)slot * c->n;
}

static float *synth_output(void *ctx, int slot)
{
    synth_t *c = ctx;
    return c->out + (size_t)slot * c->n;
}

static float *synth_grad(void *ctx) { return ((synth_t *)ctx)->grad; }

static int synth_init(synth_t *c, const pipe_shape_t *sh, int s, size_t n)
{
    memset(c, 0, sizeof *c);
    c->sh = *sh;
    c->s = s;
    c->C = sh->stages * sh->virt;
    c->n = n;
    c->S = pipe_stage_slots(sh, s);
    c->n_act = pipe_stage_actions(sh);
    c->fail_fwd = -1;
    pipe_action_t *expect = malloc((size_t)c->n_act * sizeof *expect);
    c->expect = expect;
    const size_t S = (size_t)c->S, V = (size_t)sh->virt;
    c->in = malloc(S * n * sizeof(float));
    c->out = malloc(S * n * sizeof(float));
    c->dys = malloc(S * n * sizeof(float));
    c->grad = malloc(n * sizeof(float));
    c->w = malloc(V * n * sizeof(float));
    c->b = malloc(V * n * sizeof(float));
    c->dw = calloc(V * n, sizeof(float));
    c->db = calloc(V * n, sizeof(float));
    if (!expect || !c->in || !c->out || !c->dys || !c->grad || !c->w || !c->b || !c->dw || !c->db ||
        pipe_stage_schedule(sh, s, expect) != c->n_act)
        return -1;
    for (size_t i = 0; i < S * n; i++)
        c->in[i] = c->out[i] = c->dys[i] = NAN;
    for (size_t v = 0; v < V; v++)
        for (size_t i = 0; i < n; i++) {
            const int g = pipe_chunk_of(sh, s, (int)v);
            c->w[v * n + i] = w_of(g, i);
            c->b[v * n + i] = b_of(g, i);
        }
    for (size_t i = 0; i < n; i++)
        c->grad[i] = NAN;
    return 0;
}

static void synth_free(synth_t *c)
{
    free((void *)c->expect);
    free(c->in);
    free(c->out);
    free(c->dys);
    free(c->grad);
    free(c->w);
    free(c->b);
    free(c->dw);
    free(c->db);
}

static const pipe_stage_ops_t *synth_ops(size_t n)
{
    static pipe_stage_ops_t ops = {.forward = synth_forward,
                                   .backward = synth_backward,
                                   .backward_input = synth_backward_input,
                                   .backward_weight = synth_backward_weight,
                                   .input = synth_input,
                                   .output = synth_output,
                                   .grad = synth_grad};
    ops.n = n;
    return &ops;
}

static pipe_shape_t shape(pipe_kind_t k, int P, int V, int M)
{
    return (pipe_shape_t){.kind = k, .stages = P, .virt = V, .micro = M};
}

/* One step of the synthetic model on pp; checks dw, db, the loss and the
 * callbacks' observations against the closed form. */
static void run_exact(comm_t *pp, const char *label, const pipe_shape_t *sh, size_t n)
{
    const int s = pp->rank, V = sh->virt, M = sh->micro;
    synth_t c;
    if (synth_init(&c, sh, s, n) != 0)
        die("out of memory");
    pipe_stats_t st = {-1.0, 0};
    char d[512] = "", perr[COMM_ERR_MAX] = "";
    int ok = pipe_run(pp, sh, synth_ops(n), &c, &st, perr, sizeof perr) == 0;
    if (!ok)
        snprintf(d, sizeof d, "pipe_run: %.480s", perr);
    else if (c.err[0])
        snprintf(d, sizeof d, "%s", c.err), ok = 0;
    else if (c.pos != c.n_act)
        snprintf(d, sizeof d, "%d callbacks, want %d", c.pos, c.n_act), ok = 0;
    else if (!(st.wait_s >= 0.0))
        snprintf(d, sizeof d, "wait_s %g", st.wait_s), ok = 0;
    double want_loss = 0.0;
    for (int v = 0; ok && v < V; v++) {
        const int g = pipe_chunk_of(sh, s, v);
        for (size_t i = 0; ok && i < n; i++) {
            double dw = 0.0, db = 0.0;
            for (int m = 0; m < M; m++) {
                const double dy = dy_at(c.C, g, m, i);
                dw += dy * x_at(g, m, i);
                db += dy;
                if (g == c.C - 1)
                    want_loss += (w_of(g, i) * x_at(g, m, i) + b_of(g, i)) * t_of(m, i);
            }
            const size_t j = (size_t)v * n + i;
            if (c.dw[j] != (float)dw || c.db[j] != (float)db) {
                snprintf(d, sizeof d, "chunk %d element %zu: dw %.9g db %.9g, want %.9g %.9g", g, i, (double)c.dw[j],
                         (double)c.db[j], dw, db);
                ok = 0;
            }
        }
    }
    if (ok && c.loss != want_loss) {
        snprintf(d, sizeof d, "loss %.17g, want %.17g", c.loss, want_loss);
        ok = 0;
    }
    check(ok, d,
          "%s %s P=%d V=%d M=%d n=%zu: dw, db, loss exact on every stage; calls in schedule order; inputs and "
          "gradients those of their microbatch (%d message buffers at most)",
          label, pipe_kind_name(sh->kind), sh->stages, V, M, n, st.peak_buffers);
    synth_free(&c);
}

/* Bad arguments and a failing callback, on a group of one (no neighbour
 * to leave waiting). */
static void check_errors(comm_t *self)
{
    synth_t c;
    const pipe_shape_t one = shape(PIPE_1F1B, 1, 1, 4);
    if (synth_init(&c, &one, 0, 10) != 0)
        die("out of memory");
    char d[600] = "", err[COMM_ERR_MAX] = "";
    const pipe_shape_t zero = shape(PIPE_1F1B, 1, 1, 0);
    int rc = pipe_run(self, &zero, synth_ops(10), &c, NULL, err, sizeof err);
    int ok = rc == -1 && strstr(err, "bad arguments") != NULL;
    snprintf(d, sizeof d, "rc %d, err '%s'", rc, err);
    check(ok, d, "pipe_run with 0 microbatches: -1, '%s'", ok ? err : "");
    pipe_stage_ops_t no_fwd = *synth_ops(10);
    no_fwd.forward = NULL;
    rc = pipe_run(self, &one, &no_fwd, &c, NULL, err, sizeof err);
    ok = rc == -1 && strstr(err, "bad arguments") != NULL;
    snprintf(d, sizeof d, "rc %d, err '%s'", rc, err);
    check(ok, d, "pipe_run without a forward callback: -1");
    pipe_stage_ops_t no_split = *synth_ops(10);
    no_split.backward_weight = NULL;
    const pipe_shape_t zb = shape(PIPE_ZBH1, 1, 1, 4);
    rc = pipe_run(self, &zb, &no_split, &c, NULL, err, sizeof err);
    ok = rc == -1 && strstr(err, "bad arguments") != NULL;
    snprintf(d, sizeof d, "rc %d, err '%s'", rc, err);
    check(ok, d, "pipe_run of zb-h1 without a weight-backward callback: -1");
    const pipe_shape_t two = shape(PIPE_1F1B, 2, 1, 4);
    rc = pipe_run(self, &two, synth_ops(10), &c, NULL, err, sizeof err);
    ok = rc == -1 && strstr(err, "bad arguments") != NULL;
    snprintf(d, sizeof d, "rc %d, err '%s'", rc, err);
    check(ok, d, "pipe_run of a 2-stage shape on a group of 1: -1");
    c.fail_fwd = 2;
    rc = pipe_run(self, &one, synth_ops(10), &c, NULL, err, sizeof err);
    ok = rc == -1 && strstr(err, "forward of microbatch 2 failed") != NULL && c.pos == 5;
    snprintf(d, sizeof d, "rc %d after %d calls, err '%s'", rc, c.pos, err);
    check(ok, d, "a forward callback's -1 stops the schedule: '%s'", ok ? err : "");
    synth_free(&c);
}

/* ---------------------------------------------------- (c) overlap */

/* The bubble of an ideal machine, as a fraction of the step, for equal
 * stages whose forward, B and W each take one unit (split over the V
 * chunks): 1f1b and gpipe (P-1)/(M+P-1), interleaved (P-1)/(VM+P-1), zb-h1
 * (P-1)/(3M+P-1) (Qi et al.: (P-1)(F+B-W) of idle per stage); -1 for zbv,
 * whose published figure assumes other costs (pipe_simulate gives it). */
static double bubble_formula(const pipe_shape_t *sh)
{
    const double P = sh->stages, M = sh->micro, V = sh->virt;
    switch (sh->kind) {
    case PIPE_1F1B:
    case PIPE_GPIPE:
        return (P - 1) / (M + P - 1);
    case PIPE_INTERLEAVED:
        return (P - 1) / (V * M + P - 1);
    case PIPE_ZBH1:
        return (P - 1) / (3 * M + P - 1);
    default:
        return -1.0;
    }
}

/* pipe_simulate's bubble for sh with unit costs per stage (1/V per chunk);
 * -1 when the schedule cannot be built. */
static double bubble_ideal(const pipe_shape_t *sh)
{
    const int P = sh->stages;
    pipe_action_t **acts = calloc((size_t)P, sizeof *acts);
    int *n_acts = calloc((size_t)P, sizeof *n_acts), good = acts && n_acts;
    for (int r = 0; good && r < P; r++) {
        acts[r] = malloc((size_t)pipe_stage_actions(sh) * sizeof **acts);
        good = acts[r] && (n_acts[r] = pipe_stage_schedule(sh, r, acts[r])) > 0;
    }
    const double u = 1.0 / sh->virt;
    const pipe_cost_t cost = {u, u, u};
    pipe_sim_t sim = {0};
    double bubble = -1.0;
    if (good && pipe_simulate(sh, (const pipe_action_t *const *)acts, n_acts, &cost, &sim, NULL, 0) == 0)
        bubble = sim.bubble;
    for (int r = 0; acts && r < P; r++)
        free(acts[r]);
    free(acts);
    free(n_acts);
    return bubble;
}

/* The bubble checks' shapes: every kind at P stages and M microbatches,
 * two chunks per stage where the kind has chunks, k-th of BUBBLE_KINDS;
 * 0 when the shape cannot be scheduled. */
#define BUBBLE_KINDS 5
static int bubble_shape(int k, int P, int M, pipe_shape_t *sh)
{
    static const pipe_kind_t kinds[BUBBLE_KINDS] = {PIPE_1F1B, PIPE_GPIPE, PIPE_INTERLEAVED, PIPE_ZBH1, PIPE_ZBV};
    const int V = kinds[k] == PIPE_INTERLEAVED || kinds[k] == PIPE_ZBV ? 2 : 1;
    *sh = shape(kinds[k], P, V, M);
    return pipe_shape_check(sh, NULL, 0) == 0;
}

/* The bubble of the executor's own run in virtual time (synth_t's
 * clocked mode): every action of a stage costs 1/V units, messages carry
 * their sender's clock, so the step is the run's critical path through the
 * messages the executor really exchanged, whatever the machine's load. A
 * rank's bubble, 1 - (its V*M*3/V units of work) / (the last rank's
 * clock), must equal pipe_simulate's ideal exactly, and that the
 * schedule's formula (bubble_formula). Deterministic: the wall-clock form
 * (measure_bubble) is a benchmark, bench/pp_bubble.sh. */
static void check_bubble_virtual(comm_t *pp, const int *Ms, int n_ms)
{
    const int P = pp->size, s = pp->rank;
    for (int mi = 0; mi < n_ms; mi++)
        for (int k = 0; k < BUBBLE_KINDS; k++) {
            pipe_shape_t sh;
            if (!bubble_shape(k, P, Ms[mi], &sh) || (sh.kind == PIPE_ZBV && 2 * P > 8))
                continue;
            const int V = sh.virt;
            const double ideal = bubble_ideal(&sh), formula = bubble_formula(&sh);
            synth_t c;
            if (synth_init(&c, &sh, s, 64) != 0)
                die("out of memory");
            c.clocked = 1;
            c.vf = c.vb = c.vw = 1.0 / V;
            char perr[COMM_ERR_MAX] = "";
            const int ok = pipe_run(pp, &sh, synth_ops(64), &c, NULL, perr, sizeof perr) == 0 && !c.err[0];
            double step = 0.0;
            if (MPI_Allreduce(&c.vclock, &step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
                die("MPI_Allreduce");
            const double bubble = 1.0 - 3.0 * sh.micro / step;
            char d[200];
            snprintf(d, sizeof d, "%s; step %g units, bubble %.6f, ideal %.6f, formula %.6f", ok ? "" : perr, step,
                     bubble, ideal, formula);
            check(ok && fabs(bubble - ideal) < 1e-9 && (formula < 0 || fabs(ideal - formula) < 1e-9), d,
                  "bubble of %s P=%d V=%d M=%d in virtual time: %.2f %% = ideal = formula", pipe_kind_name(sh.kind), P,
                  V, sh.micro, 100.0 * ideal);
            synth_free(&c);
        }
}

/* The executor's bubble, measured: every schedule runs with sleeps as the
 * stages' compute (a stage's forward, B and W each `unit_us`, split over
 * its V chunks), so stages cost the same and a rank asleep leaves the cores
 * to the others. A rank's bubble is 1 - (its time inside the sleeps) /
 * (the step: barrier to the last rank's end). Of up to 4 runs after a
 * warm-up the one with the shortest step counts (noise only adds). Where
 * `assert_pp` is set each rank's bubble must be within 2 percentage points
 * of pipe_simulate's ideal for the same costs, and that ideal equal the
 * schedule's formula (bubble_formula); otherwise both are printed. */
static void measure_bubble(comm_t *pp, const int *Ms, int n_ms, long unit_us, int assert_pp)
{
    const int P = pp->size, s = pp->rank;
    for (int mi = 0; mi < n_ms; mi++)
        for (int k = 0; k < BUBBLE_KINDS; k++) {
            pipe_shape_t sh;
            if (!bubble_shape(k, P, Ms[mi], &sh))
                continue;
            const int V = sh.virt;
            const double ideal = bubble_ideal(&sh), formula = bubble_formula(&sh);
            synth_t c;
            if (synth_init(&c, &sh, s, 64) != 0)
                die("out of memory");
            c.sleep_f_us = c.sleep_b_us = c.sleep_w_us = unit_us / V;
            int ok = 1;
            double best_step = 0.0, best_bubble = 0.0, best_worst = 0.0;
            char perr[COMM_ERR_MAX] = "";
            for (int rep = 0; rep < 5 && ok; rep++) {
                c.pos = 0;
                c.busy_s = 0.0;
                if (MPI_Barrier(MPI_COMM_WORLD) != MPI_SUCCESS)
                    die("MPI_Barrier");
                const double t0 = MPI_Wtime();
                ok = pipe_run(pp, &sh, synth_ops(64), &c, NULL, perr, sizeof perr) == 0 && !c.err[0];
                double mine = MPI_Wtime() - t0, step = 0.0;
                if (MPI_Allreduce(&mine, &step, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
                    die("MPI_Allreduce");
                double bubble = 1.0 - c.busy_s / step, worst = 0.0, dev = fabs(bubble - ideal);
                if (MPI_Allreduce(&dev, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
                    die("MPI_Allreduce");
                if (rep > 0 && (rep == 1 || step < best_step)) { /* run 0 warms up the connections */
                    best_step = step;
                    best_bubble = bubble;
                    best_worst = worst;
                }
            }
            synth_free(&c);
            check(ok, ok ? "" : (c.err[0] ? c.err : perr), "bubble run %s P=%d V=%d M=%d with sleeps",
                  pipe_kind_name(sh.kind), P, V, sh.micro);
            if (g_rank == 0)
                printf("info np=%d %-11s V=%d M=%-2d: step %6.1f ms, bubble rank 0 %4.1f %%, worst rank off by %4.1f "
                       "points, ideal %4.1f %%, formula %s%4.1f %%\n",
                       P, pipe_kind_name(sh.kind), V, sh.micro, best_step * 1e3, 100.0 * best_bubble,
                       100.0 * best_worst, 100.0 * ideal, formula < 0 ? "(none) " : "",
                       100.0 * (formula < 0 ? ideal : formula));
            if (!assert_pp || !ok)
                continue;
            char d[160];
            snprintf(d, sizeof d, "ideal %.4f, formula %.4f", ideal, formula);
            check(formula < 0 || fabs(ideal - formula) < 1e-9, d, "ideal bubble of %s P=%d V=%d M=%d is its formula",
                  pipe_kind_name(sh.kind), P, V, sh.micro);
            snprintf(d, sizeof d, "a rank's measured bubble is %.1f points from the ideal %.1f %%", 100.0 * best_worst,
                     100.0 * ideal);
            check(best_worst <= 0.02, d, "measured bubble of %s P=%d V=%d M=%d within 2 points of %.1f %% on every rank",
                  pipe_kind_name(sh.kind), P, V, sh.micro, 100.0 * ideal);
        }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "test_pipeline: MPI_Init_thread failed\n");
        return 1;
    }
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g_size);
    unsetenv("DTRAIN_COMM_MAX_COUNT");

    /* bench/pp_bubble.sh: only the wall-clock bubble, asserted */
    if (argc > 1 && strcmp(argv[1], "--bubble-wall") == 0) {
        const long unit_ms = argc > 2 ? atol(argv[2]) : 20;
        MPI_Comm wm = MPI_COMM_WORLD;
        comm_t *w = comm_mpi_create(&wm);
        if (!w || unit_ms < 1)
            die(w ? "--bubble-wall UNIT_MS: UNIT_MS must be a positive integer" : "comm_mpi_create failed");
        const int Mw[] = {2 * g_size, 4 * g_size};
        measure_bubble(w, Mw, 2, unit_ms * 1000, 1);
        w->ops->destroy(w);
        if (g_rank == 0)
            printf("%d checks, %d failure(s)\n", g_checks, g_fails);
        MPI_Finalize();
        return g_fails ? 1 : 0;
    }

    check_schedules();

    MPI_Comm world_mpi = MPI_COMM_WORLD, self_mpi = MPI_COMM_SELF;
    comm_t *world = comm_mpi_create(&world_mpi), *self = comm_mpi_create(&self_mpi);
    if (!world || !self)
        die("comm_mpi_create failed");
    check_errors(self);

    const int P = g_size;
    const int Ms[] = {1, P, P + 1, 2 * P + 3, 16};
    const size_t ns[] = {1, 1000, 65536};
    for (int kk = 0; kk < 2; kk++)
        for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++)
            for (size_t i = 0; i < sizeof Ms / sizeof Ms[0]; i++) {
                if (i > 0 && Ms[i] == Ms[i - 1])
                    continue;
                if (ns[j] == 65536 && Ms[i] == 16 && kk == 1)
                    continue; /* 16 slots of 256 KiB per stage: covered by the smaller runs */
                const pipe_shape_t sh = shape(kk ? PIPE_GPIPE : PIPE_1F1B, P, 1, Ms[i]);
                run_exact(world, "world", &sh, ns[j]);
            }
    /* the kinds with chunks or a split backward; at most 8 model chunks
     * keep the synthetic values exact */
    for (size_t j = 1; j < sizeof ns / sizeof ns[0]; j++) {
        const int Mz[] = {1, P, 2 * P + 3, 16};
        for (size_t i = 0; i < sizeof Mz / sizeof Mz[0]; i++) {
            pipe_shape_t sh = shape(PIPE_ZBH1, P, 1, Mz[i]);
            run_exact(world, "world", &sh, ns[j]);
            sh = shape(PIPE_ZBV, P, 2, Mz[i]);
            if (2 * P <= 8)
                run_exact(world, "world", &sh, ns[j]);
        }
        for (int V = 2; V <= 4 && V * P <= 8; V++)
            for (int g = 1; g <= 4; g *= 2) {
                const pipe_shape_t sh = shape(PIPE_INTERLEAVED, P, V, g * P);
                if (pipe_shape_check(&sh, NULL, 0) == 0)
                    run_exact(world, "world", &sh, ns[j]);
            }
    }

    /* the pipeline in reverse world-rank order, over a communicator whose
     * sends are split into chunks of 1000 floats (several requests each) */
    MPI_Comm rev = MPI_COMM_NULL;
    if (MPI_Comm_split(MPI_COMM_WORLD, 0, g_size - g_rank, &rev) != MPI_SUCCESS)
        die("MPI_Comm_split");
    setenv("DTRAIN_COMM_MAX_COUNT", "1000", 1);
    comm_t *chunked = comm_mpi_create(&rev);
    unsetenv("DTRAIN_COMM_MAX_COUNT");
    MPI_Comm_free(&rev);
    if (!chunked)
        die("comm_mpi_create(reversed, chunked) failed");
    const pipe_shape_t rc1 = shape(PIPE_1F1B, P, 1, 2 * P + 1), rc2 = shape(PIPE_GPIPE, P, 1, P + 1),
                       rc3 = shape(PIPE_INTERLEAVED, P, 2, 2 * P), rc4 = shape(PIPE_ZBV, P, 2, 2 * P + 1);
    run_exact(chunked, "reversed+chunked", &rc1, 4500);
    run_exact(chunked, "reversed+chunked", &rc2, 4500);
    if (P > 1)
        run_exact(chunked, "reversed+chunked", &rc3, 4500);
    run_exact(chunked, "reversed+chunked", &rc4, 4500);
    chunked->ops->destroy(chunked);

    /* NCCL's point-to-point semantics (mpi/comm_inorder.h: launches in
     * posting order, each complete before the next, sends synchronous,
     * matching by order whatever the tag): the executor's in-order path
     * gives every kind the same exact values, chunked or not */
    char ierr[COMM_ERR_MAX];
    comm_t *inorder = comm_inorder_create(world, 1, ierr, sizeof ierr);
    if (!inorder)
        die(ierr);
    for (size_t j = 0; j < sizeof ns / sizeof ns[0]; j++) {
        const int Mi[] = {1, P, 2 * P + 3};
        for (size_t i = 0; i < sizeof Mi / sizeof Mi[0]; i++) {
            if (i > 0 && Mi[i] == Mi[i - 1])
                continue;
            for (int k = 0; k < PIPE_N_KINDS; k++) {
                const int V = k == PIPE_INTERLEAVED ? 2 : k == PIPE_ZBV ? 2 : 1;
                /* interleaved needs M % P == 0: its own microbatch counts */
                const pipe_shape_t sh = shape((pipe_kind_t)k, P, V, k == PIPE_INTERLEAVED ? (int)(i + 1) * P : Mi[i]);
                if (V * P <= 8 && pipe_shape_check(&sh, NULL, 0) == 0)
                    run_exact(inorder, "in-order", &sh, ns[j]);
            }
        }
    }
    for (int V = 3; V <= 4 && V * P <= 8; V++) {
        const pipe_shape_t sh = shape(PIPE_INTERLEAVED, P, V, 2 * P);
        run_exact(inorder, "in-order", &sh, 1000);
    }
    const pipe_shape_t io1 = shape(PIPE_1F1B, P, 1, 16);
    run_exact(inorder, "in-order", &io1, 1000);
    /* virtual time: the in-order posting keeps every kind's bubble */
    const int Mio[] = {2 * P};
    check_bubble_virtual(inorder, Mio, 1);
    inorder->ops->destroy(inorder);

    /* two steps back to back: nothing of one step is left for the next */
    const pipe_shape_t again = shape(PIPE_1F1B, P, 1, 2 * P);
    run_exact(world, "world (again)", &again, 65536);

    /* the bubble of the executor's run in virtual time: exact */
    const int Mb[] = {2 * P, 4 * P};
    check_bubble_virtual(world, Mb, 2);

    world->ops->destroy(world);
    self->ops->destroy(self);
    if (g_rank == 0)
        printf("%d checks, %d failure(s)\n", g_checks, g_fails);
    MPI_Finalize();
    return g_fails ? 1 : 0;
}
