/* Pipeline schedules as pure functions (a list of actions per stage) and
 * the ideal-machine simulator that checks them and prices them (bubble,
 * activations held). See pipeline.h for the schedules and the contract;
 * pipeline.c runs a schedule over MPI.
 *
 * Bubble on the ideal machine (messages free), per the simulator and
 * test/test_pipe_sched.c, with per-chunk costs f, b, w and T = f + b + w:
 *   1f1b, gpipe    makespan (M + P - 1) T         bubble (P-1) / (M + P - 1)
 *   interleaved    makespan (V M + P - 1) T       bubble (P-1) / (V M + P - 1)
 *                  (a chunk is 1/V of a stage: the same work in V*M chunk
 *                  steps, the fill and drain still P - 1 of them)
 *   zb-h1, M >= P  makespan M T + (P-1)(f + b - w)  (w <= f, w <= b; the
 *                  paper's (P-1)(T_F + T_B - T_W) bubble, a third of
 *                  1f1b's when f = b = w)
 *   zbv, M >= 3P/2 makespan (6M + P - 1) f when f = b = w (two chunks of
 *                  half a stage: P - 1 idle chunk steps) */
#include "mpi/pipeline.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every kind's name, indexed by pipe_kind_t. */
static const char *const kind_names[PIPE_N_KINDS] = {[PIPE_1F1B] = "1f1b",
                                                     [PIPE_GPIPE] = "gpipe",
                                                     [PIPE_INTERLEAVED] = "interleaved",
                                                     [PIPE_ZBH1] = "zb-h1",
                                                     [PIPE_ZBV] = "zbv"};
const char *const pipe_kind_names[] = {[PIPE_1F1B] = "1f1b", [PIPE_GPIPE] = "gpipe", [PIPE_INTERLEAVED] = "interleaved",
                                       [PIPE_ZBH1] = "zb-h1", NULL};

int pipe_kind_parse(const char *s, pipe_kind_t *k)
{
    for (int i = 0; s && i < PIPE_N_KINDS; i++)
        if (strcmp(s, kind_names[i]) == 0) {
            *k = (pipe_kind_t)i;
            return 0;
        }
    return -1;
}

const char *pipe_kind_name(pipe_kind_t k) { return kind_names[(unsigned)k < PIPE_N_KINDS ? k : PIPE_1F1B]; }

static int imin(int a, int b) { return a < b ? a : b; }
static int imax(int a, int b) { return a > b ? a : b; }

static void say(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

int pipe_shape_check(const pipe_shape_t *sh, char *err, size_t errlen)
{
    if (!sh || (unsigned)sh->kind >= PIPE_N_KINDS) {
        say(err, errlen, "pipeline: unknown schedule kind %d", sh ? (int)sh->kind : -1);
        return -1;
    }
    const char *name = kind_names[sh->kind];
    if (sh->stages < 1 || sh->micro < 1) {
        say(err, errlen, "%s schedule: %d stages and %d microbatches; both must be at least 1", name, sh->stages,
            sh->micro);
        return -1;
    }
    if (sh->kind == PIPE_ZBV) {
        if (sh->virt != 2) {
            say(err, errlen, "zbv schedule: two chunks per stage (the V), not %d", sh->virt);
            return -1;
        }
        return 0;
    }
    if (sh->kind != PIPE_INTERLEAVED) {
        if (sh->virt != 1) {
            say(err, errlen, "%s schedule: one chunk per stage, not %d (only interleaved has virtual stages)", name,
                sh->virt);
            return -1;
        }
        return 0;
    }
    if (sh->virt < 2) {
        say(err, errlen, "interleaved schedule: %d chunk(s) per stage; it needs at least 2 (one is 1f1b)", sh->virt);
        return -1;
    }
    if (sh->micro % sh->stages != 0) {
        say(err, errlen,
            "interleaved schedule: %d microbatches is not a multiple of the %d pipeline stages (Megatron's "
            "microbatch groups)",
            sh->micro, sh->stages);
        return -1;
    }
    return 0;
}

static int split_backward(pipe_kind_t k) { return k == PIPE_ZBH1 || k == PIPE_ZBV; }

int pipe_stage_actions(const pipe_shape_t *sh)
{
    if (pipe_shape_check(sh, NULL, 0) != 0)
        return 0;
    return (split_backward(sh->kind) ? 3 : 2) * sh->virt * sh->micro;
}

int pipe_chunk_of(const pipe_shape_t *sh, int stage, int local)
{
    if (sh->kind == PIPE_ZBV) /* down the stages, then back up */
        return local == 0 ? stage : 2 * sh->stages - 1 - stage;
    return local * sh->stages + stage;
}

int pipe_stage_of(const pipe_shape_t *sh, int c)
{
    const int P = sh->stages;
    if (sh->kind == PIPE_ZBV)
        return c < P ? c : 2 * P - 1 - c;
    return c % P;
}

/* Forwards before the first backward's partner forward (Megatron's
 * num_warmup_microbatches), in chunk-microbatches. */
static int warmup(const pipe_shape_t *sh, int stage)
{
    const int P = sh->stages, V = sh->virt, M = sh->micro;
    switch (sh->kind) {
    case PIPE_GPIPE: return M;
    case PIPE_INTERLEAVED: return imin(2 * (P - stage - 1) + (V - 1) * P, V * M);
    default: return imin(P - stage - 1, M); /* 1f1b, zb-h1 */
    }
}

int pipe_stage_slots(const pipe_shape_t *sh, int stage)
{
    if (pipe_shape_check(sh, NULL, 0) != 0 || stage < 0 || stage >= sh->stages)
        return 0;
    const int P = sh->stages, V = sh->virt, M = sh->micro;
    switch (sh->kind) {
    case PIPE_GPIPE: return M;
    case PIPE_INTERLEAVED: return imin(warmup(sh, stage) + 1, V * M);
    case PIPE_ZBH1: return imin(P, M); /* F..W: s deferred Ws on top of 1f1b's P - s */
    case PIPE_ZBV: return imin(imin(2 * P, 2 * M), M + stage + 1);
    default: return imin(P - stage, M);
    }
}

/* The one-chunk warm-up / steady / cool-down order of 1f1b and gpipe;
 * microbatch m in slot m % slots. Returns the number of actions, 2M. */
static int one_f_one_b(int warm, int n_micro, int slots, pipe_action_t *out)
{
    int n = 0, fwd = 0, bwd = 0;
    while (fwd < warm) {
        out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = fwd, .slot = fwd % slots};
        fwd++;
    }
    /* steady state: one forward, one backward */
    while (fwd < n_micro) {
        out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = fwd, .slot = fwd % slots};
        fwd++;
        out[n++] = (pipe_action_t){.op = PIPE_BWD, .micro = bwd, .slot = bwd % slots};
        bwd++;
    }
    /* cool-down */
    while (bwd < n_micro) {
        out[n++] = (pipe_action_t){.op = PIPE_BWD, .micro = bwd, .slot = bwd % slots};
        bwd++;
    }
    return n;
}

/* Megatron's k-th forward or backward of a stage (get_model_chunk_id and
 * the microbatch id): groups of P microbatches per chunk; forwards take
 * the chunks ascending, backwards descending. */
static pipe_action_t interleaved_step(int P, int V, int k, pipe_op_t op)
{
    const int in_group = k % (P * V), local = in_group / P;
    return (pipe_action_t){.op = op, .micro = k / (P * V) * P + k % P, .chunk = op == PIPE_FWD ? local : V - 1 - local};
}

/* Gives each forward the lowest slot free then, and each backward (B, W
 * or whole) its forward's slot, freed by W or the whole backward; -1 when
 * a forward finds none of the n_slots free. */
static int assign_lowest_free(pipe_action_t *a, int n, int n_slots, int n_micro)
{
    int *holder = malloc((size_t)n_slots * sizeof *holder); /* chunk * M + micro, or -1 */
    if (!holder)
        return -1;
    for (int q = 0; q < n_slots; q++)
        holder[q] = -1;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        const int key = a[i].chunk * n_micro + a[i].micro;
        int q = 0;
        const int want = a[i].op == PIPE_FWD ? -1 : key;
        while (q < n_slots && holder[q] != want)
            q++;
        if (q == n_slots) {
            rc = -1;
            break;
        }
        a[i].slot = q;
        if (a[i].op != PIPE_BWD_INPUT)
            holder[q] = a[i].op == PIPE_FWD ? key : -1;
    }
    free(holder);
    return rc;
}

/* Megatron's interleaved 1F1B: warm-up forwards, then one forward one
 * backward, then the backwards left, each in interleaved_step's order. */
static int interleaved(const pipe_shape_t *sh, int stage, pipe_action_t *out)
{
    const int P = sh->stages, V = sh->virt, total = V * sh->micro, warm = warmup(sh, stage);
    int n = 0;
    for (int k = 0; k < warm; k++)
        out[n++] = interleaved_step(P, V, k, PIPE_FWD);
    for (int k = 0; k < total - warm; k++) {
        out[n++] = interleaved_step(P, V, warm + k, PIPE_FWD);
        out[n++] = interleaved_step(P, V, k, PIPE_BWD);
    }
    for (int k = total - warm; k < total; k++)
        out[n++] = interleaved_step(P, V, k, PIPE_BWD);
    return assign_lowest_free(out, n, pipe_stage_slots(sh, stage), sh->micro) == 0 ? n : -1;
}

/* ZB-H1: 1f1b with B for the backward, and the W of the oldest microbatch
 * after each B once `lag` = stage Bs are pending (the later stages start
 * their Ws later, which keeps every stage at min(P, M) microbatches between
 * F and W); the Ws left fill the drain. */
static int zb_h1(const pipe_shape_t *sh, int stage, pipe_action_t *out)
{
    const int M = sh->micro, warm = warmup(sh, stage), lag = stage, S = pipe_stage_slots(sh, stage);
    int n = 0, f = 0, b = 0, w = 0;
    while (f < warm) {
        out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = f, .slot = f % S};
        f++;
    }
    while (b < M) {
        if (f < M) {
            out[n++] = (pipe_action_t){.op = PIPE_FWD, .micro = f, .slot = f % S};
            f++;
        }
        out[n++] = (pipe_action_t){.op = PIPE_BWD_INPUT, .micro = b, .slot = b % S};
        b++;
        if (b - w > lag) {
            out[n++] = (pipe_action_t){.op = PIPE_BWD_WEIGHT, .micro = w, .slot = w % S};
            w++;
        }
    }
    while (w < M) {
        out[n++] = (pipe_action_t){.op = PIPE_BWD_WEIGHT, .micro = w, .slot = w % S};
        w++;
    }
    return n;
}

/* ZBV's builder: appends (op, local chunk, the chunk's next microbatch of
 * that op) and drops microbatches past M (the order is built for at least
 * 2P - 1 of them, the fewest that fill the V). */
typedef struct zbv_builder {
    pipe_action_t *out;
    int n, M;
    int next[3][2]; /* [F, B, W][local chunk]: the next microbatch */
} zbv_builder_t;

static void zbv_add(zbv_builder_t *z, pipe_op_t op, int local)
{
    const int e = op == PIPE_FWD ? 0 : op == PIPE_BWD_INPUT ? 1 : 2;
    const int m = z->next[e][local]++;
    if (m < z->M)
        z->out[z->n++] = (pipe_action_t){.op = op, .micro = m, .chunk = local};
}

/* ZB-V (Qi et al., section 6; the order of PyTorch's ScheduleZBVZeroBubble):
 * stage s holds chunk s (local 0, on the way down) and chunk 2P-1-s
 * (local 1, on the way up), so the last stage turns the V around with no
 * message and the first stage computes the loss. Warm-up: 2(P-s)-1
 * forwards of chunk 0, s pairs F1 F0, then P-s triples F1 B1 W1; steady:
 * F0 B0 W0 F1 B1 W1 until both chunks' forwards are done; cool-down: s
 * pairs B0 B1, P-s pairs B0 W0, then the Ws left, chunk 1's first. */
static int zbv_order(const pipe_shape_t *sh, int stage, pipe_action_t *out)
{
    const int P = sh->stages, n = imax(2 * P - 1, sh->micro);
    zbv_builder_t z = {.out = out, .M = sh->micro};
    int(*nx)[2] = z.next;
    for (int i = 0; i < 2 * (P - stage) - 1; i++)
        zbv_add(&z, PIPE_FWD, 0);
    for (int i = 0; i < stage; i++) {
        zbv_add(&z, PIPE_FWD, 1);
        zbv_add(&z, PIPE_FWD, 0);
    }
    for (int i = 0; i < P - stage; i++) {
        zbv_add(&z, PIPE_FWD, 1);
        zbv_add(&z, PIPE_BWD_INPUT, 1);
        zbv_add(&z, PIPE_BWD_WEIGHT, 1);
    }
    while (nx[0][1] < nx[0][0] || nx[0][0] < n) {
        if (nx[0][0] < n)
            zbv_add(&z, PIPE_FWD, 0);
        zbv_add(&z, PIPE_BWD_INPUT, 0);
        zbv_add(&z, PIPE_BWD_WEIGHT, 0);
        zbv_add(&z, PIPE_FWD, 1);
        zbv_add(&z, PIPE_BWD_INPUT, 1);
        zbv_add(&z, PIPE_BWD_WEIGHT, 1);
    }
    for (int i = 0; i < stage; i++) {
        zbv_add(&z, PIPE_BWD_INPUT, 0);
        zbv_add(&z, PIPE_BWD_INPUT, 1);
    }
    for (int i = 0; i < P - stage; i++) {
        zbv_add(&z, PIPE_BWD_INPUT, 0);
        zbv_add(&z, PIPE_BWD_WEIGHT, 0);
    }
    while (nx[2][1] < nx[1][1])
        zbv_add(&z, PIPE_BWD_WEIGHT, 1);
    while (nx[2][0] < nx[1][0])
        zbv_add(&z, PIPE_BWD_WEIGHT, 0);
    return assign_lowest_free(out, z.n, pipe_stage_slots(sh, stage), sh->micro) == 0 ? z.n : -1;
}

int pipe_stage_schedule(const pipe_shape_t *sh, int stage, pipe_action_t *out)
{
    const int slots = pipe_stage_slots(sh, stage);
    if (slots < 1)
        return -1;
    switch (sh->kind) {
    case PIPE_INTERLEAVED: return interleaved(sh, stage, out);
    case PIPE_ZBH1: return zb_h1(sh, stage, out);
    case PIPE_ZBV: return zbv_order(sh, stage, out);
    default: return one_f_one_b(warmup(sh, stage), sh->micro, slots, out);
    }
}

int pipe_slots(pipe_kind_t k, int n_stages, int stage, int n_micro)
{
    const pipe_shape_t sh = {k, n_stages, 1, n_micro};
    return pipe_stage_slots(&sh, stage);
}

int pipe_schedule(pipe_kind_t k, int n_stages, int stage, int n_micro, pipe_action_t *out)
{
    const pipe_shape_t sh = {k, n_stages, 1, n_micro};
    return pipe_stage_schedule(&sh, stage, out);
}

/* ---------------------------------------------------------------- simulator */

enum { E_F = 0, E_B, E_W };       /* which end time: forward, B (or whole backward), W */
enum { LINK_ACT = 0, LINK_GRAD }; /* activations downstream, gradients upstream */

typedef struct sim {
    const pipe_shape_t *sh;
    int P, V, M, C; /* C = P*V model chunks */
    pipe_cost_t cost;
    int split;
    double *end[3];          /* [C*M] each, by chunk*M + micro: when it ended; -1 not run */
    int *seq[2];             /* [C*M]: the message's place on its link (after F, after B) */
    int *sent[2], *taken[2]; /* [P*P] by sender*P + receiver: messages sent, received */
    int *holder;             /* [P][V*M]: slot -> chunk*M + micro, or -1 */
    const int *slots;        /* [P] pipe_stage_slots */
    int *pc, *held, *fb;     /* [P]: next action; slots held; between F and B */
    int *held_peak, *fb_peak;
    double *clock; /* [P] */
    double busy;
    char *err;
    size_t errlen;
} sim_t;

static const char *op_name(pipe_op_t op)
{
    switch (op) {
    case PIPE_FWD: return "F";
    case PIPE_BWD: return "backward";
    case PIPE_BWD_INPUT: return "B";
    default: return "W";
    }
}

/* Fails the run with "stage s action i (F of chunk c microbatch m): why". */
static int sim_fail(sim_t *S, int r, const pipe_action_t *a, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int sim_fail(sim_t *S, int r, const pipe_action_t *a, const char *fmt, ...)
{
    char why[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    say(S->err, S->errlen, "stage %d action %d (%s of chunk %d microbatch %d): %s", r, S->pc[r], op_name(a->op),
        pipe_chunk_of(S->sh, r, a->chunk), a->micro, why);
    return -1;
}

/* The input chunk `from` (its F's output, or its B's dL/d(input)) for the
 * action on stage r: raises *ready to when it is there. 1, 0 when its
 * message is not sent yet, -1 when the link's next message is another
 * or a same-stage input comes later in the list. */
static int sim_input(sim_t *S, int r, const pipe_action_t *a, int dir, int from, double *ready)
{
    const int key = from * S->M + a->micro, q = pipe_stage_of(S->sh, from);
    const double t = S->end[dir == LINK_ACT ? E_F : E_B][key];
    const char *what = dir == LINK_ACT ? "output" : "input gradient";
    if (q == r && t < 0)
        return sim_fail(S, r, a, "before the %s of chunk %d on the same stage", what, from);
    if (q != r && t < 0)
        return 0; /* a receive waiting for its send */
    if (q != r) {
        const int link = q * S->P + r;
        if (S->seq[dir][key] != S->taken[dir][link])
            return sim_fail(S, r, a,
                            "message order: the %s of chunk %d is message %d on the link from stage %d, "
                            "the receive takes message %d",
                            what, from, S->seq[dir][key], q, S->taken[dir][link]);
        S->taken[dir][link]++;
    }
    if (t > *ready)
        *ready = t;
    return 1;
}

/* The slot rules: in range; free at F; the microbatch's own at B and W. */
static int sim_slot(sim_t *S, int r, const pipe_action_t *a, int key)
{
    if (a->slot < 0 || a->slot >= S->slots[r])
        return sim_fail(S, r, a, "slot %d out of range (the stage has %d)", a->slot, S->slots[r]);
    int *h = &S->holder[(size_t)r * S->V * S->M + a->slot];
    if (a->op == PIPE_FWD) {
        if (*h >= 0)
            return sim_fail(S, r, a, "slot %d still held by chunk %d microbatch %d", a->slot, *h / S->M, *h % S->M);
        *h = key;
        return 0;
    }
    if (*h != key)
        return sim_fail(S, r, a, "slot %d does not hold this microbatch", a->slot);
    if (a->op != PIPE_BWD_INPUT)
        *h = -1;
    return 0;
}

/* After an action: its message, if its consumer is on another stage. */
static void sim_send(sim_t *S, int r, int dir, int to, int key)
{
    if (to < 0 || to >= S->C)
        return;
    const int q = pipe_stage_of(S->sh, to);
    if (q != r)
        S->seq[dir][key] = S->sent[dir][r * S->P + q]++;
}

static void sim_count(sim_t *S, int r, pipe_op_t op)
{
    if (op == PIPE_FWD) {
        if (++S->held[r] > S->held_peak[r])
            S->held_peak[r] = S->held[r];
        if (++S->fb[r] > S->fb_peak[r])
            S->fb_peak[r] = S->fb[r];
        return;
    }
    if (op != PIPE_BWD_WEIGHT)
        S->fb[r]--;
    if (op != PIPE_BWD_INPUT)
        S->held[r]--;
}

/* Runs stage r's next action a: 1, 0 when it waits for a message, -1 on a
 * broken rule (err says which). */
static int sim_step(sim_t *S, int r, const pipe_action_t *a)
{
    const int ok_op =
        a->op == PIPE_FWD || (S->split ? a->op == PIPE_BWD_INPUT || a->op == PIPE_BWD_WEIGHT : a->op == PIPE_BWD);
    if (!ok_op || a->chunk < 0 || a->chunk >= S->V || a->micro < 0 || a->micro >= S->M)
        return sim_fail(S, r, a, "op %d, chunk or microbatch out of range for this schedule", (int)a->op);
    const int c = pipe_chunk_of(S->sh, r, a->chunk), key = c * S->M + a->micro;
    const int e = a->op == PIPE_FWD ? E_F : a->op == PIPE_BWD_WEIGHT ? E_W : E_B;
    if (S->end[e][key] >= 0)
        return sim_fail(S, r, a, "runs twice");
    double ready = S->clock[r];
    int in = 1;
    if (a->op == PIPE_FWD && c > 0)
        in = sim_input(S, r, a, LINK_ACT, c - 1, &ready);
    else if (a->op != PIPE_FWD && a->op != PIPE_BWD_WEIGHT) {
        if (S->end[E_F][key] < 0)
            return sim_fail(S, r, a, "before its F");
        if (c < S->C - 1) /* the last chunk's backward starts from its own loss */
            in = sim_input(S, r, a, LINK_GRAD, c + 1, &ready);
    } else if (a->op == PIPE_BWD_WEIGHT && S->end[E_B][key] < 0)
        return sim_fail(S, r, a, "before its B");
    if (in <= 0)
        return in;
    if (sim_slot(S, r, a, key) != 0)
        return -1;
    const double dur = a->op == PIPE_FWD          ? S->cost.f
                       : a->op == PIPE_BWD_INPUT  ? S->cost.b
                       : a->op == PIPE_BWD_WEIGHT ? S->cost.w
                                                  : S->cost.b + S->cost.w;
    S->clock[r] = ready + dur;
    S->busy += dur;
    S->end[e][key] = S->clock[r];
    if (a->op == PIPE_BWD)
        S->end[E_W][key] = S->clock[r];
    if (a->op == PIPE_FWD)
        sim_send(S, r, LINK_ACT, c + 1, key);
    else if (a->op != PIPE_BWD_WEIGHT)
        sim_send(S, r, LINK_GRAD, c - 1, key);
    sim_count(S, r, a->op);
    return 1;
}

/* One line naming what each stage waits for, after no stage could move. */
static int sim_deadlock(sim_t *S, const pipe_action_t *const *acts, const int *n_acts)
{
    size_t len = 0;
    say(S->err, S->errlen, "deadlock: no stage can start its next action;");
    for (int r = 0; r < S->P && S->err && (len = strlen(S->err)) + 1 < S->errlen; r++)
        if (S->pc[r] < n_acts[r]) {
            const pipe_action_t *a = &acts[r][S->pc[r]];
            say(S->err + len, S->errlen - len, " stage %d at action %d (%s of chunk %d microbatch %d) waits for %s;", r,
                S->pc[r], op_name(a->op), pipe_chunk_of(S->sh, r, a->chunk), a->micro,
                a->op == PIPE_FWD ? "an activation" : "a gradient");
        }
    return -1;
}

static int sim_alloc(sim_t *S)
{
    const size_t cm = (size_t)S->C * S->M, pp = (size_t)S->P * S->P, P = (size_t)S->P;
    for (int e = 0; e < 3; e++)
        S->end[e] = malloc(cm * sizeof(double));
    for (int d = 0; d < 2; d++) {
        S->seq[d] = malloc(cm * sizeof(int));
        S->sent[d] = calloc(pp, sizeof(int));
        S->taken[d] = calloc(pp, sizeof(int));
    }
    S->holder = malloc(P * S->V * S->M * sizeof(int));
    S->pc = calloc(5 * P, sizeof(int)); /* pc, held, fb, held_peak, fb_peak */
    S->clock = calloc(P, sizeof(double));
    if (!S->end[0] || !S->end[1] || !S->end[2] || !S->seq[0] || !S->seq[1] || !S->sent[0] || !S->sent[1] ||
        !S->taken[0] || !S->taken[1] || !S->holder || !S->pc || !S->clock)
        return -1;
    S->held = S->pc + P;
    S->fb = S->pc + 2 * P;
    S->held_peak = S->pc + 3 * P;
    S->fb_peak = S->pc + 4 * P;
    for (size_t i = 0; i < cm; i++)
        S->end[E_F][i] = S->end[E_B][i] = S->end[E_W][i] = -1.0;
    for (size_t i = 0; i < P * S->V * S->M; i++)
        S->holder[i] = -1;
    return 0;
}

static void sim_free(sim_t *S)
{
    for (int e = 0; e < 3; e++)
        free(S->end[e]);
    for (int d = 0; d < 2; d++) {
        free(S->seq[d]);
        free(S->sent[d]);
        free(S->taken[d]);
    }
    free(S->holder);
    free(S->pc);
    free(S->clock);
    free((void *)S->slots);
}

/* Every stage's list of the expected length, slots per stage into S. */
static int sim_prepare(sim_t *S, const pipe_shape_t *sh, const int *n_acts)
{
    const int want = pipe_stage_actions(sh);
    int *slots = malloc((size_t)S->P * sizeof *slots);
    S->slots = slots;
    if (!slots || sim_alloc(S) != 0) {
        say(S->err, S->errlen, "pipeline simulator: out of memory for %d stages x %d chunks x %d microbatches", S->P,
            S->V, S->M);
        return -1;
    }
    for (int r = 0; r < S->P; r++) {
        slots[r] = pipe_stage_slots(sh, r);
        if (n_acts[r] != want) {
            say(S->err, S->errlen, "stage %d has %d actions; %s with V %d, M %d has %d (each F and %s once)", r,
                n_acts[r], pipe_kind_name(sh->kind), S->V, S->M, want, S->split ? "B and W" : "backward");
            return -1;
        }
    }
    return 0;
}

/* Sweeps the stages, each as far as its inputs allow, until all are done
 * or none can move. */
static int sim_run(sim_t *S, const pipe_action_t *const *acts, const int *n_acts)
{
    long left = 0;
    for (int r = 0; r < S->P; r++)
        left += n_acts[r];
    while (left > 0) {
        int moved = 0;
        for (int r = 0; r < S->P; r++)
            while (S->pc[r] < n_acts[r]) {
                const int rc = sim_step(S, r, &acts[r][S->pc[r]]);
                if (rc < 0)
                    return -1;
                if (rc == 0)
                    break;
                S->pc[r]++;
                left--;
                moved = 1;
            }
        if (!moved)
            return sim_deadlock(S, acts, n_acts);
    }
    return 0;
}

int pipe_simulate(const pipe_shape_t *sh, const pipe_action_t *const *acts, const int *n_acts, const pipe_cost_t *cost,
                  pipe_sim_t *res, char *err, size_t errlen)
{
    if (pipe_shape_check(sh, err, errlen) != 0)
        return -1;
    if (!acts || !n_acts || !cost || !res || cost->f < 0 || cost->b < 0 || cost->w < 0) {
        say(err, errlen, "pipeline simulator: missing lists or result, or a negative cost");
        return -1;
    }
    sim_t S = {.sh = sh,
               .P = sh->stages,
               .V = sh->virt,
               .M = sh->micro,
               .C = sh->stages * sh->virt,
               .cost = *cost,
               .split = split_backward(sh->kind),
               .err = err,
               .errlen = errlen};
    int rc = sim_prepare(&S, sh, n_acts);
    if (rc == 0)
        rc = sim_run(&S, acts, n_acts);
    if (rc == 0) {
        double makespan = 0.0;
        for (int r = 0; r < S.P; r++) {
            if (S.clock[r] > makespan)
                makespan = S.clock[r];
            if (res->held_peak)
                res->held_peak[r] = S.held_peak[r];
            if (res->fb_peak)
                res->fb_peak[r] = S.fb_peak[r];
        }
        res->makespan = makespan;
        res->bubble = makespan > 0 ? 1.0 - S.busy / (S.P * makespan) : 0.0;
    }
    sim_free(&S);
    return rc;
}

/* ------------------------------------------------- in-order transfers */

/* The ideal run's order of messages: by the time they are sent (their
 * producing action's end), then by sender. One action sends at most one
 * message and a stage's actions end at distinct times (every cost is
 * positive), so no two messages compare equal. */
static int xfer_cmp(const void *pa, const void *pb)
{
    const pipe_xfer_t *a = pa, *b = pb;
    if (a->time != b->time)
        return a->time < b->time ? -1 : 1;
    return (a->sender > b->sender) - (a->sender < b->sender);
}

/* Adds the message of model chunk `from` to chunk `to` (act: F's output
 * downstream, else B's gradient upstream) for microbatch m to stage r's
 * list if r sends or receives it (a boundary inside one stage is no
 * message). */
static void xfer_add(const sim_t *S, int r, int act, int from, int to, int m, int action, pipe_xfer_t *out, int *n)
{
    const int p = pipe_stage_of(S->sh, from), q = pipe_stage_of(S->sh, to);
    if (p == q || (p != r && q != r))
        return;
    out[(*n)++] = (pipe_xfer_t){.send = p == r,
                                .peer = p == r ? q : p,
                                .grad = !act,
                                .micro = m,
                                .action = action,
                                .sender = p,
                                .time = S->end[act ? E_F : E_B][(size_t)from * S->M + m]};
}

int pipe_stage_transfers(const pipe_shape_t *sh, int stage, pipe_xfer_t **out, char *err, size_t errlen)
{
    *out = NULL;
    if (pipe_shape_check(sh, err, errlen) != 0)
        return -1;
    if (stage < 0 || stage >= sh->stages) {
        say(err, errlen, "pipeline transfers: stage %d of %d", stage, sh->stages);
        return -1;
    }
    const int P = sh->stages, na = pipe_stage_actions(sh);
    pipe_action_t *all = malloc((size_t)P * na * sizeof *all);
    const pipe_action_t **acts = malloc((size_t)P * sizeof *acts);
    int *n_acts = malloc((size_t)P * sizeof *n_acts);
    pipe_xfer_t *x = malloc((size_t)2 * na * sizeof *x + 1);
    int rc = all && acts && n_acts && x ? 0 : -1;
    if (rc != 0)
        say(err, errlen, "pipeline transfers: out of memory for %d stages x %d actions", P, na);
    for (int r = 0; rc == 0 && r < P; r++) {
        acts[r] = all + (size_t)r * na;
        n_acts[r] = pipe_stage_schedule(sh, r, all + (size_t)r * na);
        if (n_acts[r] != na) {
            say(err, errlen, "pipeline transfers: no schedule for stage %d", r);
            rc = -1;
        }
    }
    sim_t S = {.sh = sh,
               .P = P,
               .V = sh->virt,
               .M = sh->micro,
               .C = P * sh->virt,
               .cost = {1.0, 1.0, 1.0},
               .split = split_backward(sh->kind),
               .err = err,
               .errlen = errlen};
    if (rc == 0)
        rc = sim_prepare(&S, sh, n_acts);
    if (rc == 0)
        rc = sim_run(&S, acts, n_acts);
    int n = 0;
    for (int i = 0; rc == 0 && i < na; i++) {
        const pipe_action_t *a = &acts[stage][i];
        const int c = pipe_chunk_of(sh, stage, a->chunk);
        if (a->op == PIPE_FWD) {
            if (c > 0)
                xfer_add(&S, stage, 1, c - 1, c, a->micro, i, x, &n);
            if (c < S.C - 1)
                xfer_add(&S, stage, 1, c, c + 1, a->micro, i, x, &n);
        } else if (a->op != PIPE_BWD_WEIGHT) {
            if (c < S.C - 1)
                xfer_add(&S, stage, 0, c + 1, c, a->micro, i, x, &n);
            if (c > 0)
                xfer_add(&S, stage, 0, c, c - 1, a->micro, i, x, &n);
        }
    }
    sim_free(&S);
    free(all);
    free(acts);
    free(n_acts);
    if (rc != 0) {
        free(x);
        return -1;
    }
    qsort(x, (size_t)n, sizeof *x, xfer_cmp);
    *out = x;
    return n;
}
