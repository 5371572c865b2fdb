/* The pipeline schedules as pure functions (mpi/pipeline_sched.c), checked
 * by the ideal-machine simulator pipe_simulate, with no MPI:
 *
 * (a) 1f1b and gpipe lists are those of the code before virtual stages and
 *     split backwards (legacy_schedule below is that code, verbatim): every
 *     stage of P 1..8 x M 1..32, op, microbatch, slot, and chunk 0.
 * (b) Shapes refused with one line: interleaved with M % P != 0 or V < 2,
 *     V != 1 for the others, no stages or microbatches.
 * (c) Properties, for 1f1b, gpipe, zb-h1 (V = 1), zbv (V = 2) and
 *     interleaved (V = 2..4, M a multiple of P), P 1..8, M 1..32, every
 *     stage, under
 *     four sets of costs (f, b, w): pipe_simulate accepts the lists (every
 *     chunk-microbatch's F, B and W, or F and whole backward, exactly once;
 *     F before B before W; cross-stage inputs consumed in the FIFO order
 *     of their links; slots in range and never shared; no deadlock); the
 *     most slots held on stage r (F to W) equals pipe_stage_slots and
 *       1f1b min(P-r, M), gpipe M, zb-h1 min(P, M),
 *       interleaved min(2(P-r-1) + (V-1)P + 1, V*M) chunk-microbatches,
 *       zbv min(2P, 2M, M+r+1) chunk-microbatches,
 *     the most between F and B is the same except zb-h1's min(P-r, M);
 *     and the makespan, with T = f + b + w per chunk-microbatch, is
 *       1f1b, gpipe (M+P-1) T; interleaved (V M + P-1) T;
 *       zb-h1, M >= P: M T + (P-1)(f + b - w) (costs with w <= f, b);
 *       zbv, f = b = w, M >= 3P/2: (6M + P-1) f;
 *       otherwise (zb-h1 M < P, zbv): at most 1f1b's on V chunks a stage,
 *       (M+P-1) V T,
 *     so with unit costs the bubble is (P-1)/(M+P-1), (P-1)/(VM+P-1),
 *     (P-1)/(3M+P-1) (a third of 1f1b's idle time) and (P-1)/(6M+P-1).
 * (d) The checker catches broken lists: interleaved with Megatron's
 *     warm-up count off (+1: a slot still held, more activations than the
 *     stage has; -1 everywhere: the last stage runs the loss chunk's
 *     backward before its forward; -3 on stage 0: deadlock; -2 on stage 1:
 *     slower than the stated makespan), forwards swapped (message order),
 *     zbv's turn on the last stage run backwards (an input on the same
 *     stage later in its list),
 *     a W dropped (count), a W before its B, a backward before its F, and
 *     backwards in reverse order (message order).
 * One line per check; exit 1 if any failed. */
#include "mpi/pipeline.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_P 8
#define MAX_M 32
#define MAX_V 4
#define MAX_ACTS (3 * MAX_V * MAX_M) /* zbv: 3 * 2 * M */

static int g_checks, g_fails;

static void check(int ok, const char *detail, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void check(int ok, const char *detail, const char *fmt, ...)
{
    char name[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    g_checks++;
    if (ok) {
        printf("ok   %s\n", name);
        return;
    }
    g_fails++;
    printf("FAIL %s: %s\n", name, detail);
}

static int imin(int a, int b) { return a < b ? a : b; }

/* ------------------------------------------------ (a) the lists of before */

/* pipe_slots and pipe_schedule as they were for 1f1b and gpipe. */
static int legacy_slots(pipe_kind_t k, int n_stages, int stage, int n_micro)
{
    if (n_stages < 1 || stage < 0 || stage >= n_stages || n_micro < 1)
        return 0;
    if (k == PIPE_GPIPE)
        return n_micro;
    const int in_flight = n_stages - stage;
    return in_flight < n_micro ? in_flight : n_micro;
}

static int legacy_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out)
{
    const int slots = legacy_slots(k, n_stages, stage, n_micro);
    if (slots < 1 || (k != PIPE_1F1B && k != PIPE_GPIPE))
        return -1;
    int warm = k == PIPE_GPIPE ? n_micro : n_stages - stage - 1;
    if (warm > n_micro)
        warm = n_micro;
    int n = 0, fwd = 0, bwd = 0;
    while (fwd < warm) {
        out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = fwd, .slot = fwd % slots};
        fwd++;
    }
    while (fwd < n_micro) {
        out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = fwd, .slot = fwd % slots};
        fwd++;
        out[n++] = (pipe_action_t){.op = PIPE_BWD, .micro = bwd, .slot = bwd % slots};
        bwd++;
    }
    while (bwd < n_micro) {
        out[n++] = (pipe_action_t){.op = PIPE_BWD, .micro = bwd, .slot = bwd % slots};
        bwd++;
    }
    return n;
}

static void check_legacy(void)
{
    for (int kk = 0; kk < 2; kk++) {
        const pipe_kind_t k = kk ? PIPE_GPIPE : PIPE_1F1B;
        char d[200] = "";
        int ok = 1, lists = 0;
        for (int P = 1; P <= MAX_P && ok; P++)
            for (int M = 1; M <= MAX_M && ok; M++)
                for (int s = 0; s < P && ok; s++) {
                    pipe_action_t got[2 * MAX_M], want[2 * MAX_M];
                    const int ng = pipe_schedule(k, P, s, M, got), nw = legacy_schedule(k, P, s, M, want);
                    ok = ng == nw && pipe_slots(k, P, s, M) == legacy_slots(k, P, s, M);
                    for (int i = 0; ok && i < nw; i++)
                        ok = got[i].op == want[i].op && got[i].micro == want[i].micro && got[i].slot == want[i].slot &&
                             got[i].chunk == 0;
                    if (!ok)
                        snprintf(d, sizeof d, "P %d M %d stage %d differs", P, M, s);
                    lists++;
                }
        check(ok, d, "%s: %d lists (P 1..%d x M 1..%d x stages) identical to the code before virtual stages",
              pipe_kind_name(k), lists, MAX_P, MAX_M);
    }
}

/* ------------------------------------------------------- (b) shapes */

static void check_shape(pipe_shape_t sh, const char *want)
{
    char err[256] = "";
    const int rc = pipe_shape_check(&sh, err, sizeof err);
    const int ok = want ? rc == -1 && strstr(err, want) != NULL : rc == 0;
    check(ok, err, "%s P %d V %d M %d: %s%s", pipe_kind_name(sh.kind), sh.stages, sh.virt, sh.micro,
          want ? "refused: " : "accepted", want ? err : "");
}

static void check_shapes(void)
{
    pipe_kind_t k = PIPE_1F1B;
    int ok = pipe_kind_parse("interleaved", &k) == 0 && k == PIPE_INTERLEAVED && pipe_kind_parse("zb-h1", &k) == 0 &&
             k == PIPE_ZBH1 && pipe_kind_parse("zbv", &k) == 0 && k == PIPE_ZBV && pipe_kind_parse("zb-h2", &k) == -1 &&
             strcmp(pipe_kind_name(PIPE_INTERLEAVED), "interleaved") == 0 &&
             strcmp(pipe_kind_names[2], "interleaved") == 0 && strcmp(pipe_kind_names[3], "zb-h1") == 0 &&
             pipe_kind_names[4] == NULL;
    check(ok, "",
          "pipe_kind_parse knows every kind; pipe_kind_names (--pp-schedule) lists those the trainer runs: 1f1b, "
          "gpipe, interleaved, zb-h1");
    check_shape((pipe_shape_t){PIPE_INTERLEAVED, 4, 2, 6}, "6 microbatches is not a multiple of the 4");
    check_shape((pipe_shape_t){PIPE_INTERLEAVED, 4, 1, 8}, "needs at least 2");
    check_shape((pipe_shape_t){PIPE_ZBH1, 4, 2, 8}, "one chunk per stage");
    check_shape((pipe_shape_t){PIPE_1F1B, 0, 1, 8}, "at least 1");
    check_shape((pipe_shape_t){PIPE_ZBV, 4, 3, 8}, "two chunks per stage");
    check_shape((pipe_shape_t){PIPE_INTERLEAVED, 4, 3, 12}, NULL);
    pipe_action_t a[8];
    const pipe_shape_t bad = {PIPE_INTERLEAVED, 4, 2, 6};
    check(pipe_stage_schedule(&bad, 0, a) == -1 && pipe_stage_slots(&bad, 0) == 0 && pipe_stage_actions(&bad) == 0, "",
          "a refused shape has no schedule, slots or actions");
}

/* --------------------------------------------------- (c) properties */

typedef struct lists {
    pipe_action_t a[MAX_P][MAX_ACTS];
    const pipe_action_t *ptr[MAX_P];
    int n[MAX_P];
} lists_t;

static int build(const pipe_shape_t *sh, lists_t *L)
{
    for (int r = 0; r < sh->stages; r++) {
        L->n[r] = pipe_stage_schedule(sh, r, L->a[r]);
        L->ptr[r] = L->a[r];
        if (L->n[r] < 0)
            return -1;
    }
    return 0;
}

/* The stated bounds: slots held from F to W (or whole backward), and
 * chunk-microbatches between F and B. */
static int want_held(const pipe_shape_t *sh, int r)
{
    const int P = sh->stages, V = sh->virt, M = sh->micro;
    switch (sh->kind) {
    case PIPE_GPIPE: return M;
    case PIPE_INTERLEAVED: return imin(2 * (P - r - 1) + (V - 1) * P + 1, V * M);
    case PIPE_ZBH1: return imin(P, M);
    case PIPE_ZBV: return imin(imin(2 * P, 2 * M), M + r + 1);
    default: return imin(P - r, M);
    }
}

static int want_fb(const pipe_shape_t *sh, int r)
{
    return sh->kind == PIPE_ZBH1 ? imin(sh->stages - r, sh->micro) : want_held(sh, r);
}

/* The exact makespan the simulation must match, or -1 where only 1f1b's
 * on the same work bounds it: zb-h1 with M < P; zbv unless f = b = w and
 * M >= 3P/2 (PyTorch: "zero bubble" only with equal times). */
static double want_makespan(const pipe_shape_t *sh, const pipe_cost_t *c)
{
    const int P = sh->stages, V = sh->virt, M = sh->micro;
    const double T = c->f + c->b + c->w;
    if (sh->kind == PIPE_ZBH1)
        return M >= P ? M * T + (P - 1) * (c->f + c->b - c->w) : -1.0;
    if (sh->kind == PIPE_ZBV)
        return c->f == c->b && c->b == c->w && M >= 3 * P / 2 ? (6 * M + P - 1) * c->f : -1.0;
    return (V * M + P - 1) * T;
}

/* One shape under one cost: 1, or 0 with the reason in d. */
static int shape_ok(const pipe_shape_t *sh, const pipe_cost_t *cost, lists_t *L, char *d, size_t dl)
{
    const int P = sh->stages, M = sh->micro;
    if (build(sh, L) != 0) {
        snprintf(d, dl, "pipe_stage_schedule failed");
        return 0;
    }
    int held[MAX_P], fb[MAX_P];
    pipe_sim_t res = {.held_peak = held, .fb_peak = fb};
    char err[512] = "";
    if (pipe_simulate(sh, L->ptr, L->n, cost, &res, err, sizeof err) != 0) {
        snprintf(d, dl, "%.400s", err);
        return 0;
    }
    for (int r = 0; r < P; r++)
        if (held[r] != want_held(sh, r) || held[r] != pipe_stage_slots(sh, r) || fb[r] != want_fb(sh, r)) {
            snprintf(d, dl, "stage %d: held %d (want %d, slots %d), F..B %d (want %d)", r, held[r], want_held(sh, r),
                     pipe_stage_slots(sh, r), fb[r], want_fb(sh, r));
            return 0;
        }
    const double want = want_makespan(sh, cost);
    const double bound = (M + P - 1) * sh->virt * (cost->f + cost->b + cost->w); /* 1f1b's, V chunks a stage */
    if ((want >= 0 && res.makespan != want) || (want < 0 && res.makespan > bound)) {
        snprintf(d, dl, "makespan %g, want %g", res.makespan, want >= 0 ? want : bound);
        return 0;
    }
    return 1;
}

static const pipe_cost_t costs[] = {{1, 1, 1}, {1, 2, 1}, {2, 3, 1}, {3, 3, 2}};
#define N_COSTS (int)(sizeof costs / sizeof costs[0])

/* Every shape of the kind in range, under every cost. */
static void check_kind(pipe_kind_t k, lists_t *L)
{
    char d[600] = "";
    int ok = 1, shapes = 0;
    const int v0 = k == PIPE_INTERLEAVED || k == PIPE_ZBV ? 2 : 1;
    const int v1 = k == PIPE_INTERLEAVED ? MAX_V : v0;
    for (int V = v0; V <= v1 && ok; V++)
        for (int P = 1; P <= MAX_P && ok; P++)
            for (int M = 1; M <= MAX_M && ok; M++) {
                const pipe_shape_t sh = {k, P, V, M};
                if (pipe_shape_check(&sh, NULL, 0) != 0)
                    continue;
                shapes++;
                for (int c = 0; c < N_COSTS && ok; c++) {
                    char why[500] = "";
                    ok = shape_ok(&sh, &costs[c], L, why, sizeof why);
                    if (!ok)
                        snprintf(d, sizeof d, "P %d V %d M %d cost (%g, %g, %g): %.450s", P, V, M, costs[c].f,
                                 costs[c].b, costs[c].w, why);
                }
            }
    char what[64];
    snprintf(what, sizeof what, ok ? "%d shapes" : "shape %d of those", shapes);
    check(ok, d,
          "%s: %s (P 1..%d, M 1..%d, V %d..%d) x %d costs: simulated without deadlock or broken rule, "
          "peak activations and makespan as stated",
          pipe_kind_name(k), what, MAX_P, MAX_M, v0, v1, N_COSTS);
}

/* The bubble with unit costs, against the closed forms, for a few shapes;
 * printed as a table for the record. */
static void check_bubbles(lists_t *L)
{
    const pipe_cost_t unit = {1, 1, 1};
    const int shapes[][3] = {{4, 1, 8}, {4, 2, 8}, {4, 4, 8}, {8, 1, 32}, {8, 2, 32}, {8, 4, 32}};
    int ok = 1;
    char d[200] = "";
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const int P = shapes[i][0], V = shapes[i][1], M = shapes[i][2];
        const pipe_shape_t sh[4] = {
            {PIPE_1F1B, P, 1, M}, {PIPE_ZBH1, P, 1, M}, {PIPE_ZBV, P, 2, M}, {PIPE_INTERLEAVED, P, V, M}};
        const double want[4] = {(P - 1.0) / (M + P - 1), (P - 1.0) / (3 * M + P - 1), (P - 1.0) / (6 * M + P - 1),
                                (P - 1.0) / (V * M + P - 1)};
        double got[4] = {-1, -1, -1, -1};
        for (int j = 0; j < (V > 1 ? 4 : 3); j++) {
            pipe_sim_t res = {0};
            if (build(&sh[j], L) == 0 && pipe_simulate(&sh[j], L->ptr, L->n, &unit, &res, NULL, 0) == 0)
                got[j] = res.bubble;
            if (fabs(got[j] - want[j]) > 1e-12) {
                ok = 0;
                snprintf(d, sizeof d, "%s P %d V %d M %d: bubble %.6f, want %.6f", pipe_kind_name(sh[j].kind), P,
                         sh[j].virt, M, got[j], want[j]);
            }
        }
        printf("info P %d M %2d: bubble 1f1b %.4f  zb-h1 %.4f  zbv %.4f", P, M, got[0], got[1], got[2]);
        if (V > 1)
            printf("  interleaved V %d %.4f", V, got[3]);
        printf("\n");
    }
    check(ok, d,
          "unit-cost bubbles: 1f1b (P-1)/(M+P-1), zb-h1 (P-1)/(3M+P-1), zbv (P-1)/(6M+P-1), interleaved "
          "(P-1)/(VM+P-1)");
}

/* ------------------------------------------------ (d) broken lists */

/* Rebuilds a non-split list with `delta` more warm-up forwards, keeping
 * the order of the forwards and of the backwards and every action's slot:
 * the 1f1b pattern with Megatron's warm-up count off by delta. */
static void rewarm(pipe_action_t *a, int n, int warm, int delta)
{
    pipe_action_t f[MAX_ACTS], b[MAX_ACTS];
    int nf = 0, nb = 0;
    for (int i = 0; i < n; i++) {
        if (a[i].op == PIPE_FWD)
            f[nf++] = a[i];
        else
            b[nb++] = a[i];
    }
    warm += delta;
    warm = warm < 0 ? 0 : warm > nf ? nf : warm;
    int k = 0, fi = 0, bi = 0;
    while (fi < warm)
        a[k++] = f[fi++];
    while (fi < nf) {
        a[k++] = f[fi++];
        a[k++] = b[bi++];
    }
    while (bi < nb)
        a[k++] = b[bi++];
}

/* Megatron's warm-up count, as the schedule has it. */
static int il_warm(const pipe_shape_t *sh, int r)
{
    return imin(2 * (sh->stages - r - 1) + (sh->virt - 1) * sh->stages, sh->virt * sh->micro);
}

static void swap(pipe_action_t *x, pipe_action_t *y)
{
    const pipe_action_t t = *x;
    *x = *y;
    *y = t;
}

/* Feeds the broken lists in L to the checker, which must refuse them
 * with a message containing `want`. */
static void expect_refused(const pipe_shape_t *sh, lists_t *L, const char *what, const char *want)
{
    const pipe_cost_t unit = {1, 1, 1};
    pipe_sim_t res = {0};
    char err[512] = "";
    const int rc = pipe_simulate(sh, L->ptr, L->n, &unit, &res, err, sizeof err);
    const int ok = rc == -1 && strstr(err, want) != NULL;
    check(ok, rc == 0 ? "accepted" : err, "checker refuses %s %s P %d V %d M %d: '%.200s'", pipe_kind_name(sh->kind),
          what, sh->stages, sh->virt, sh->micro, err);
}

static void check_broken(lists_t *L)
{
    /* Megatron's warm-up count off: one forward more holds more
     * activations than the stage's slots; one fewer on every stage makes
     * the last one reach the loss chunk's backward before its forward;
     * three fewer on stage 0 leave it waiting for a gradient whose forward
     * it has not sent (two fewer on stage 1 only lose time: see below) */
    const pipe_shape_t il = {PIPE_INTERLEAVED, 4, 2, 8};
    build(&il, L);
    for (int r = 0; r < il.stages; r++)
        rewarm(L->a[r], L->n[r], il_warm(&il, r), +1);
    expect_refused(&il, L, "with warm-up + 1 on every stage", "still held");
    build(&il, L);
    for (int r = 0; r < il.stages; r++)
        rewarm(L->a[r], L->n[r], il_warm(&il, r), -1);
    expect_refused(&il, L, "with warm-up - 1 on every stage", "before its F");
    build(&il, L);
    rewarm(L->a[0], L->n[0], il_warm(&il, 0), -3);
    expect_refused(&il, L, "with warm-up - 3 on stage 0", "deadlock");
    build(&il, L);
    rewarm(L->a[1], L->n[1], il_warm(&il, 1), -2);
    const pipe_cost_t unit = {1, 1, 1};
    pipe_sim_t res = {0};
    const int rc = pipe_simulate(&il, L->ptr, L->n, &unit, &res, NULL, 0);
    check(rc == 0 && res.makespan > want_makespan(&il, &unit), "",
          "interleaved with warm-up - 2 on stage 1: runs, "
          "but in %g > %g units (the makespan property fails it)",
          res.makespan, want_makespan(&il, &unit));

    const pipe_shape_t one = {PIPE_1F1B, 3, 1, 4};
    build(&one, L);
    swap(&L->a[0][0], &L->a[0][1]); /* stage 0: F1 before F0 */
    expect_refused(&one, L, "with stage 0's first two forwards swapped", "message order");
    build(&one, L);
    swap(&L->a[2][0], &L->a[2][1]); /* last stage: backward 0 before forward 0 */
    expect_refused(&one, L, "with the last stage's first backward before its forward", "before its F");

    const pipe_shape_t zb = {PIPE_ZBH1, 4, 1, 8};
    build(&zb, L);
    L->n[1]--; /* stage 1's final W dropped */
    expect_refused(&zb, L, "with a W dropped", "has 23 actions");
    build(&zb, L);
    /* stage 0 (lag 0): ... F, B(k), W(k) ...; W(k) first */
    for (int i = 1; i < L->n[0]; i++)
        if (L->a[0][i].op == PIPE_BWD_WEIGHT && L->a[0][i - 1].op == PIPE_BWD_INPUT) {
            swap(&L->a[0][i], &L->a[0][i - 1]);
            break;
        }
    expect_refused(&zb, L, "with a W before its B", "before its B");

    const pipe_shape_t zv = {PIPE_ZBV, 4, 2, 8};
    build(&zv, L);
    swap(&L->a[3][0], &L->a[3][1]); /* stage 3 turns the V: chunk 4's F before chunk 3's */
    expect_refused(&zv, L, "with the turn of the V run backwards", "before the output of chunk 3 on the same stage");

    const pipe_shape_t gp = {PIPE_GPIPE, 2, 1, 4};
    build(&gp, L);
    for (int i = 0; i < 2; i++) /* last stage: backwards 3, 2, 1, 0 */
        swap(&L->a[1][4 + i], &L->a[1][7 - i]);
    expect_refused(&gp, L, "with the last stage's backwards in reverse order", "message order");
}

int main(void)
{
    static lists_t L; /* 8 x 384 actions */
    check_legacy();
    check_shapes();
    for (int k = 0; k < PIPE_N_KINDS; k++)
        check_kind((pipe_kind_t)k, &L);
    check_bubbles(&L);
    check_broken(&L);
    printf("%d checks, %d failure(s)\n", g_checks, g_fails);
    return g_fails ? 1 : 0;
}
