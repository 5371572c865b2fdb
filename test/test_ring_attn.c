/* Ring attention's building blocks (context parallelism, issue 34): the
 * zigzag schedule (mpi/cp_sched.h) and the ops attention_block_fwd,
 * attention_merge and attention_block_bwd (base/ops.h), in one process.
 *
 * (a) The schedule, exhaustively for cp 1..8 and 1..3 tokens a chunk:
 *     every global position held by one rank, local positions increasing;
 *     over all ranks and ring steps every (query, key) pair with key <=
 *     query computed exactly once and none with key > query (after the
 *     diagonal step's causal mask; the other steps have no mask); each
 *     off-diagonal step 2c x c pairs on every rank, and the same number of
 *     valid pairs on every rank; shapes refused with one line. The checker
 *     fails a schedule with lower and upper swapped.
 * (b) A CP group emulated in one process: random qkv of B 2, T 64..256
 *     (and T = 2cp, one token a chunk), NH 4, NKV 4/2/1, HS 16/32, cut
 *     into zigzag chunks for cp 2, 4, 8; each rank runs the ring's block
 *     forwards (K,V of rank (r - i) mod cp at step i) and merges them in
 *     step order, and its rows of out and lse are compared with
 *     attention_fwd over the whole sequence; then the block backwards,
 *     dq kept, dk and dv summed into each block's buffer in ring order
 *     (as they travel with K,V), against attention_bwd's dqkv. Without
 *     documents, with random documents, and with documents crossing chunk
 *     edges (one starting in rank 0's first chunk and ending in the last
 *     rank's, one crossing the middle of the sequence, i.e. between a
 *     rank's two halves). Error: max|got - ref| / max|ref| per tensor.
 * (c) cp 1 (one diagonal step over the whole sequence) gives attention_fwd's
 *     and attention_bwd's bits; the deferred table gives the CPU table's
 *     bits; 1 and 2 threads give the same bits.
 * (d) Mutants of the driver fail (b)'s tolerances: lower and upper
 *     sectioning swapped, partial outputs added without the log-sum-exp
 *     rescale, and each query's document start taken as its chunk's start
 *     where its document began in an earlier chunk.
 * (e) Edges: rows outside [q0, q0+nq) untouched by the block forward
 *     and the merge; a row with no valid key (its document starts after
 *     every key of the block) gets lse = -inf and out = 0 over garbage,
 *     and merging it changes nothing; two -inf merge to -inf; the block
 *     backward of keyless rows adds nothing.
 * One line per check; exit 1 if any failed. */
#include "mpi/cp_sched.h"
#include "src/backend/ops_cpu.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define TOL_FWD 1e-5 /* fp32 rounding: out and lse vs attention_fwd */
#define TOL_BWD 1e-5 /* dq, dk, dv vs attention_bwd */
#define MAX_CP 8

static int g_checks, g_fails;
static double worst_fwd, worst_bwd; /* over (b)'s cases */

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    g_checks++;
    g_fails += !ok;
}

static void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size);
    if (!p) {
        fprintf(stderr, "test_ring_attn: out of memory\n");
        exit(1);
    }
    return p;
}

static uint64_t rng_state = 0x2545f4914f6cdd1dULL;
static uint64_t next_u64(void)
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
/* uniform in [-1, 1) */
static float frand(void) { return (float)((double)(next_u64() >> 40) * (1.0 / 8388608.0) - 1.0); }

/* max|got - ref| / max|ref| over n floats; NaN gives +inf. */
static double rel_err(const float *got, const float *ref, size_t n)
{
    double md = 0.0, mr = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - (double)ref[i]);
        if (isnan(d))
            return INFINITY;
        md = d > md ? d : md;
        mr = fabs((double)ref[i]) > mr ? fabs((double)ref[i]) : mr;
    }
    return mr > 0.0 ? md / mr : md;
}

/* ------------------------------------------------------------ (a) schedule */

enum { SCHED_OK = 0, SCHED_SWAP }; /* SCHED_SWAP: lower and upper sectioning swapped */

static cp_step_t sched_step(int cp, int T, int r, int i, int mut)
{
    cp_step_t s;
    if (cp_ring_step(cp, T, r, i, &s) != 0) {
        fprintf(stderr, "test_ring_attn: cp_ring_step(%d, %d, %d, %d) refused\n", cp, T, r, i);
        exit(1);
    }
    int c = T / (2 * cp);
    if (mut == SCHED_SWAP && s.kind == CP_STEP_LOWER)
        s = (cp_step_t){CP_STEP_UPPER, s.src, c, c, 0, 2 * c, 0};
    else if (mut == SCHED_SWAP && s.kind == CP_STEP_UPPER)
        s = (cp_step_t){CP_STEP_LOWER, s.src, 0, 2 * c, 0, c, 0};
    return s;
}

/* Violations of the schedule's contract for cp ranks, c tokens a chunk
 * (0: none); what the first one is goes to why. */
static int sched_violations(int cp, int c, int mut, char *why, size_t whylen)
{
    const int T = 2 * cp * c;
    int bad = 0;
    unsigned char *cover = xcalloc((size_t)T * T, 1), *held = xcalloc((size_t)T, 1);
    long valid_r0 = -1;
#define BAD(...) (bad++ == 0 ? (void)snprintf(why, whylen, __VA_ARGS__) : (void)0)
    for (int r = 0; r < cp; r++) {
        for (int i = 0; i < 2 * c; i++) {
            int g = cp_global_pos(cp, T, r, i);
            if (g < 0 || g >= T || held[g]++)
                BAD("position %d held twice or out of range (rank %d row %d)", g, r, i);
            if (i > 0 && g <= cp_global_pos(cp, T, r, i - 1))
                BAD("rank %d: positions not increasing at row %d", r, i);
        }
        long valid = 0;
        for (int i = 0; i < cp; i++) {
            cp_step_t s = sched_step(cp, T, r, i, mut);
            if (s.src != ((r - i) % cp + cp) % cp)
                BAD("rank %d step %d: src %d", r, i, s.src);
            if ((i == 0) != (s.kind == CP_STEP_DIAG) || (i == 0) != (s.causal == 1))
                BAD("rank %d step %d: kind %s causal %d", r, i, cp_step_kind_name(s.kind), s.causal);
            if (i > 0 && (long)s.nq * s.nk != 2L * c * c)
                BAD("rank %d step %d: %d x %d pairs, not half a tile", r, i, s.nq, s.nk);
            if (s.q0 < 0 || s.nq < 0 || s.q0 + s.nq > 2 * c || s.k0 < 0 || s.nk < 0 || s.k0 + s.nk > 2 * c)
                BAD("rank %d step %d: rows out of range", r, i);
            for (int q = s.q0; q < s.q0 + s.nq; q++)
                for (int k = s.k0; k < s.k0 + s.nk; k++) {
                    int qp = cp_global_pos(cp, T, r, q), kp = cp_global_pos(cp, T, s.src, k);
                    if (s.causal && kp > qp)
                        continue;
                    if (kp > qp)
                        BAD("rank %d step %d (%s): key %d after query %d unmasked", r, i, cp_step_kind_name(s.kind), kp,
                            qp);
                    else
                        valid++;
                    cover[(size_t)qp * T + kp]++;
                }
        }
        if (r == 0)
            valid_r0 = valid;
        else if (valid != valid_r0)
            BAD("rank %d: %ld valid pairs, rank 0 %ld", r, valid, valid_r0);
    }
    for (int q = 0; q < T; q++)
        for (int k = 0; k < T; k++)
            if (cover[(size_t)q * T + k] != (k <= q))
                BAD("pair (query %d, key %d) computed %d times", q, k, cover[(size_t)q * T + k]);
#undef BAD
    free(cover);
    free(held);
    return bad;
}

static void test_schedule(void)
{
    char why[200] = "";
    int bad = 0, cases = 0;
    for (int cp = 1; cp <= MAX_CP; cp++)
        for (int c = 1; c <= 3; c++, cases++)
            if (sched_violations(cp, c, SCHED_OK, why, sizeof why)) {
                bad++;
                check(0, "schedule cp %d c %d: %s", cp, c, why);
            }
    check(bad == 0, "schedule: cp 1..8 x chunk 1..3 tokens (%d layouts): every pair k <= q once, none k > q, "
                    "off-diagonal steps 2c x c, valid pairs equal per rank",
          cases);
    int caught = 0;
    for (int cp = 2; cp <= MAX_CP; cp++)
        caught += sched_violations(cp, 2, SCHED_SWAP, why, sizeof why) > 0;
    check(caught == MAX_CP - 1, "schedule checker fails lower/upper swapped for every cp 2..8 (%d of %d; e.g. %s)",
          caught, MAX_CP - 1, why);
    char err[300];
    int refused = cp_shape_check(4, 100, err, sizeof err) == -1 && strstr(err, "100") && strstr(err, "8");
    check(refused, "shape check refuses T 100 at cp 4: %s", err);
    refused = cp_shape_check(0, 64, err, sizeof err) == -1 && cp_shape_check(2, 0, NULL, 0) == -1 &&
              cp_shape_check(2, 64, err, sizeof err) == 0 && cp_shape_check(1, 2, NULL, 0) == 0;
    cp_step_t s;
    refused = refused && cp_ring_step(2, 64, 2, 0, &s) == -1 && cp_ring_step(2, 64, 0, 2, &s) == -1 &&
              cp_ring_step(3, 64, 0, 0, &s) == -1;
    check(refused, "shape check: cp 0, T 0 refused, T 64 at cp 2 and T 2 at cp 1 accepted; steps out of range refused");
}

/* ------------------------------------------------------ (b) the CP group */

typedef struct shape {
    int B, T, NH, NKV, HS;
} shape_t;

enum { DOCS_NONE = 0, DOCS_RANDOM, DOCS_CROSS };
static const char *const doc_names[] = {"none", "random", "crossing"};

/* The driver's mutants, (d). */
enum { MUT_NONE = 0, MUT_SECTION, MUT_NO_RESCALE, MUT_DOC_START };
static const char *const mut_names[] = {"none", "lower/upper sectioning swapped", "merge without the rescale",
                                        "document start clamped to the chunk's"};

/* pos[B*T] (docmask positions) for the doc mode; NULL for DOCS_NONE.
 * DOCS_CROSS, sequence 0: documents start at 0, c/2 (in rank 0's first
 * chunk; with c >= 4 the document runs into chunk cp-1, the last rank's
 * first half), T/2 - c/2 - 1 (crossing the sequence's middle, from rank
 * cp-1's first half into its second, on to rank 0's second half) and
 * T - c/2 - 1 (c/2 rounded up to 1 where c = 1); the other sequences
 * random, a document starting at each token with probability 1/8. */
static int32_t *make_pos(int mode, int B, int T, int cp)
{
    if (mode == DOCS_NONE)
        return NULL;
    int32_t *pos = xcalloc((size_t)B * T, sizeof(int32_t));
    int c = T / (2 * cp);
    for (int b = 0; b < B; b++) {
        unsigned char *start = xcalloc((size_t)T, 1);
        start[0] = 1;
        if (mode == DOCS_CROSS && b == 0) {
            int at[3] = {c / 2 > 0 ? c / 2 : 1, T / 2 - c / 2 - 1, T - c / 2 - 1};
            for (int j = 0; j < 3; j++)
                if (at[j] > 0 && at[j] < T)
                    start[at[j]] = 1;
        } else {
            for (int t = 1; t < T; t++)
                start[t] = next_u64() % 8 == 0;
        }
        for (int t = 0; t < T; t++)
            pos[(size_t)b * T + t] = start[t] ? 0 : pos[(size_t)b * T + t - 1] + 1;
        free(start);
    }
    return pos;
}

/* One emulated CP group: every rank's local buffers. */
typedef struct group {
    shape_t s;
    int cp, c, L; /* ranks, tokens a chunk, local rows (2c) */
    float *qkv[MAX_CP], *kv[MAX_CP], *out[MAX_CP], *lse[MAX_CP], *pout, *plse, *dout[MAX_CP];
    float *dq[MAX_CP], *dkv[MAX_CP]; /* dq: [B*L, R] (q heads used); dkv: each rank's block's, [B*L, KR] */
    int32_t *lpos[MAX_CP], *qdoc[MAX_CP];
} group_t;

static size_t sz_R(const shape_t *s) { return (size_t)(s->NH + 2 * s->NKV) * s->HS; }
static size_t sz_KR(const shape_t *s) { return (size_t)2 * s->NKV * s->HS; }
static size_t sz_OC(const shape_t *s) { return (size_t)s->NH * s->HS; }

/* Cuts the whole sequence's qkv, dout and pos into the ranks' local rows.
 * qdoc: each local query's global document start, or with MUT_DOC_START
 * the start of its chunk where its document began earlier. */
static void group_make(group_t *g, const shape_t *s, int cp, const float *qkv, const float *dout, const int32_t *pos,
                       int mut)
{
    memset(g, 0, sizeof *g);
    g->s = *s;
    g->cp = cp;
    g->c = s->T / (2 * cp);
    g->L = 2 * g->c;
    const size_t R = sz_R(s), KR = sz_KR(s), OC = sz_OC(s), NL = (size_t)s->B * g->L;
    g->pout = xcalloc(NL * OC, sizeof(float));
    g->plse = xcalloc((size_t)s->B * s->NH * g->L, sizeof(float));
    for (int r = 0; r < cp; r++) {
        g->qkv[r] = xcalloc(NL * R, sizeof(float));
        g->kv[r] = xcalloc(NL * KR, sizeof(float));
        g->out[r] = xcalloc(NL * OC, sizeof(float));
        g->lse[r] = xcalloc((size_t)s->B * s->NH * g->L, sizeof(float));
        g->dout[r] = xcalloc(NL * OC, sizeof(float));
        g->dq[r] = xcalloc(NL * R, sizeof(float));
        g->dkv[r] = xcalloc(NL * KR, sizeof(float));
        g->lpos[r] = xcalloc((size_t)g->L, sizeof(int32_t));
        g->qdoc[r] = pos ? xcalloc(NL, sizeof(int32_t)) : NULL;
        cp_local_positions(cp, s->T, r, g->lpos[r]);
        for (int b = 0; b < s->B; b++)
            for (int i = 0; i < g->L; i++) {
                int t = g->lpos[r][i];
                size_t src = (size_t)b * s->T + t, dst = (size_t)b * g->L + i;
                memcpy(g->qkv[r] + dst * R, qkv + src * R, R * sizeof(float));
                memcpy(g->kv[r] + dst * KR, qkv + src * R + OC, KR * sizeof(float));
                memcpy(g->dout[r] + dst * OC, dout + src * OC, OC * sizeof(float));
                if (pos) {
                    int start = t - pos[src], chunk0 = t - t % g->c;
                    g->qdoc[r][dst] = mut == MUT_DOC_START && start < chunk0 ? chunk0 : start;
                }
            }
    }
}

static void group_free(group_t *g)
{
    free(g->pout);
    free(g->plse);
    for (int r = 0; r < g->cp; r++) {
        free(g->qkv[r]);
        free(g->kv[r]);
        free(g->out[r]);
        free(g->lse[r]);
        free(g->dout[r]);
        free(g->dq[r]);
        free(g->dkv[r]);
        free(g->lpos[r]);
        free(g->qdoc[r]);
    }
}

static att_block_t step_block(const group_t *g, const cp_step_t *st)
{
    return (att_block_t){.B = g->s.B, .NH = g->s.NH, .NKV = g->s.NKV, .HS = g->s.HS, .Tq = g->L, .q0 = st->q0,
                         .nq = st->nq, .Tk = g->L, .k0 = st->k0, .nk = st->nk, .causal = st->causal};
}

/* MUT_NO_RESCALE's merge: lse merged right, the outputs only added. */
static void merge_no_rescale(const group_t *g, float *out, float *lse, const att_block_t *k)
{
    const size_t OC = sz_OC(&g->s);
    for (int b = 0; b < k->B; b++)
        for (int h = 0; h < k->NH; h++)
            for (int t = k->q0; t < k->q0 + k->nq; t++) {
                size_t li = ((size_t)b * k->NH + h) * k->Tq + t, oi = ((size_t)b * k->Tq + t) * OC + h * k->HS;
                float a = lse[li], p = g->plse[li], mx = a > p ? a : p;
                if (mx == -INFINITY)
                    continue;
                lse[li] = mx + log1pf(expf((a > p ? p : a) - mx));
                for (int e = 0; e < k->HS; e++)
                    out[oi + e] += g->pout[oi + e];
            }
}

/* The ring's forward on every rank, steps in order: step 0 writes out and
 * lse, every later step a partial that is merged in. */
static void ring_forward(const ops_t *o, group_t *g, int mut)
{
    for (int r = 0; r < g->cp; r++)
        for (int i = 0; i < g->cp; i++) {
            cp_step_t st = sched_step(g->cp, g->s.T, r, i, mut == MUT_SECTION ? SCHED_SWAP : SCHED_OK);
            att_block_t k = step_block(g, &st);
            float *out = i == 0 ? g->out[r] : g->pout, *lse = i == 0 ? g->lse[r] : g->plse;
            o->attention_block_fwd(o->ctx, out, lse, g->qkv[r], g->kv[st.src], g->lpos[r], g->lpos[st.src],
                                   g->qdoc[r], &k);
            if (i == 0)
                continue;
            if (mut == MUT_NO_RESCALE) {
                o->sync(o->ctx);
                merge_no_rescale(g, g->out[r], g->lse[r], &k);
            } else {
                o->attention_merge(o->ctx, g->out[r], g->lse[r], g->pout, g->plse, &k);
            }
        }
    o->sync(o->ctx);
}

/* The ring's backward: at step i rank r holds block src = (r - i) mod cp
 * with its gradient buffer; rank src's buffer thus sums the contributions
 * of ranks src, src+1, ... in that order, as it travels. */
static void ring_backward(const ops_t *o, group_t *g, int mut)
{
    for (int i = 0; i < g->cp; i++)
        for (int r = 0; r < g->cp; r++) {
            cp_step_t st = sched_step(g->cp, g->s.T, r, i, mut == MUT_SECTION ? SCHED_SWAP : SCHED_OK);
            att_block_t k = step_block(g, &st);
            o->attention_block_bwd(o->ctx, g->dq[r], g->dkv[st.src], g->dout[r], g->qkv[r], g->kv[st.src], g->out[r],
                                   g->lse[r], g->lpos[r], g->lpos[st.src], g->qdoc[r], &k);
        }
    o->sync(o->ctx);
}

/* The group's results in the whole sequence's order: out[B*T, OC],
 * lse[B, NH, T], dqkv[B*T, R] (q from dq, k and v from each block's dkv). */
static void group_gather(const group_t *g, float *out, float *lse, float *dqkv)
{
    const shape_t *s = &g->s;
    const size_t R = sz_R(s), KR = sz_KR(s), OC = sz_OC(s);
    for (int r = 0; r < g->cp; r++)
        for (int b = 0; b < s->B; b++)
            for (int i = 0; i < g->L; i++) {
                int t = g->lpos[r][i];
                size_t gi = (size_t)b * s->T + t, li = (size_t)b * g->L + i;
                memcpy(out + gi * OC, g->out[r] + li * OC, OC * sizeof(float));
                for (int h = 0; h < s->NH; h++)
                    lse[((size_t)b * s->NH + h) * s->T + t] = g->lse[r][((size_t)b * s->NH + h) * g->L + i];
                if (dqkv) {
                    memcpy(dqkv + gi * R, g->dq[r] + li * R, OC * sizeof(float));
                    memcpy(dqkv + gi * R + OC, g->dkv[r] + li * KR, KR * sizeof(float));
                }
            }
}

/* The whole sequence's attention (the reference) and the inputs. */
typedef struct ref {
    shape_t s;
    float *qkv, *dout, *out, *lse, *dqkv;
    int32_t *pos;
} ref_t;

static void ref_make(ref_t *x, const shape_t *s, int docs, int cp, const ops_t *o)
{
    x->s = *s;
    const size_t N = (size_t)s->B * s->T, R = sz_R(s), OC = sz_OC(s);
    x->qkv = xcalloc(N * R, sizeof(float));
    x->dout = xcalloc(N * OC, sizeof(float));
    x->out = xcalloc(N * OC, sizeof(float));
    x->lse = xcalloc((size_t)s->B * s->NH * s->T, sizeof(float));
    x->dqkv = xcalloc(N * R, sizeof(float));
    for (size_t i = 0; i < N * R; i++)
        x->qkv[i] = 2.0f * frand(); /* scores up to a few units: peaked rows */
    for (size_t i = 0; i < N * OC; i++)
        x->dout[i] = frand();
    x->pos = make_pos(docs, s->B, s->T, cp);
    o->attention_fwd(o->ctx, x->out, NULL, x->lse, x->qkv, x->pos, s->B, s->T, s->NH, s->NKV, s->HS);
    o->attention_bwd(o->ctx, x->dqkv, NULL, x->dout, x->qkv, x->out, x->lse, x->pos, s->B, s->T, s->NH, s->NKV, s->HS);
    o->sync(o->ctx);
}

static void ref_free(ref_t *x)
{
    free(x->qkv);
    free(x->dout);
    free(x->out);
    free(x->lse);
    free(x->dqkv);
    free(x->pos);
}

/* Errors of one ring run against the reference: [0] out, [1] lse, [2] dq,
 * [3] dk and dv (max over the q columns, the k and v columns). */
typedef struct errs {
    double e[4];
} errs_t;

static errs_t ring_run(const ops_t *o, const ref_t *x, int cp, int mut, float *out, float *lse, float *dqkv)
{
    const shape_t *s = &x->s;
    const size_t N = (size_t)s->B * s->T, R = sz_R(s), OC = sz_OC(s);
    group_t g;
    group_make(&g, s, cp, x->qkv, x->dout, x->pos, mut);
    ring_forward(o, &g, mut);
    ring_backward(o, &g, mut);
    group_gather(&g, out, lse, dqkv);
    group_free(&g);
    errs_t r;
    r.e[0] = rel_err(out, x->out, N * OC);
    r.e[1] = rel_err(lse, x->lse, (size_t)s->B * s->NH * s->T);
    /* the q columns and the k|v columns of every row, apart */
    float *gq = xcalloc(N * OC, sizeof(float)), *rq = xcalloc(N * OC, sizeof(float));
    float *gk = xcalloc(N * (R - OC), sizeof(float)), *rk = xcalloc(N * (R - OC), sizeof(float));
    for (size_t n = 0; n < N; n++) {
        memcpy(gq + n * OC, dqkv + n * R, OC * sizeof(float));
        memcpy(rq + n * OC, x->dqkv + n * R, OC * sizeof(float));
        memcpy(gk + n * (R - OC), dqkv + n * R + OC, (R - OC) * sizeof(float));
        memcpy(rk + n * (R - OC), x->dqkv + n * R + OC, (R - OC) * sizeof(float));
    }
    r.e[2] = rel_err(gq, rq, N * OC);
    r.e[3] = rel_err(gk, rk, N * (R - OC));
    free(gq);
    free(rq);
    free(gk);
    free(rk);
    return r;
}

static void test_case(const ops_t *o, const shape_t *s, int cp, int docs)
{
    ref_t x;
    ref_make(&x, s, docs, cp, o);
    const size_t N = (size_t)s->B * s->T;
    float *out = xcalloc(N * sz_OC(s), sizeof(float)), *lse = xcalloc((size_t)s->B * s->NH * s->T, sizeof(float));
    float *dqkv = xcalloc(N * sz_R(s), sizeof(float));
    errs_t e = ring_run(o, &x, cp, MUT_NONE, out, lse, dqkv);
    double ef = fmax(e.e[0], e.e[1]), eb = fmax(e.e[2], e.e[3]);
    worst_fwd = fmax(worst_fwd, ef);
    worst_bwd = fmax(worst_bwd, eb);
    check(ef <= TOL_FWD && eb <= TOL_BWD,
          "cp %d B %d T %3d NH %d NKV %d HS %d docs %-8s  out %.1e lse %.1e  dq %.1e dkv %.1e", cp, s->B, s->T, s->NH,
          s->NKV, s->HS, doc_names[docs], e.e[0], e.e[1], e.e[2], e.e[3]);
    free(out);
    free(lse);
    free(dqkv);
    ref_free(&x);
}

static void test_group(const ops_t *o)
{
    static const int Ts[] = {64, 192, 256};
    static const int NKVs[] = {4, 2, 1};
    static const int HSs[] = {16, 32};
    int n = 0;
    for (int cp = 2; cp <= MAX_CP; cp *= 2)
        for (int a = 0; a < 3; a++)
            for (int h = 0; h < 2; h++)
                for (int docs = 0; docs < 3; docs++, n++) {
                    shape_t s = {2, Ts[(n + cp) % 3], 4, NKVs[a], HSs[h]};
                    test_case(o, &s, cp, docs);
                }
    for (int cp = 2; cp <= MAX_CP; cp *= 2) /* one token a chunk */
        for (int docs = 0; docs < 3; docs++) {
            shape_t s = {2, 2 * cp, 4, 2, 16};
            test_case(o, &s, cp, docs);
        }
    printf("     worst over the cases: forward %.2e (tol %.0e), backward %.2e (tol %.0e)\n", worst_fwd, TOL_FWD,
           worst_bwd, TOL_BWD);
}

/* ------------------------------------------------------- (c) same bits */

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void test_bits(const ops_t *cpu)
{
    shape_t s = {2, 192, 4, 2, 16};
    const size_t N = (size_t)s.B * s.T, NL = (size_t)s.B * s.NH * s.T;
    for (int docs = 0; docs < 3; docs += 2) {
        ref_t x;
        ref_make(&x, &s, docs, 1, cpu);
        float *out = xcalloc(N * sz_OC(&s), sizeof(float)), *lse = xcalloc(NL, sizeof(float));
        float *dqkv = xcalloc(N * sz_R(&s), sizeof(float));
        ring_run(cpu, &x, 1, MUT_NONE, out, lse, dqkv);
        check(same_bits(out, x.out, N * sz_OC(&s)) && same_bits(lse, x.lse, NL) &&
                  same_bits(dqkv, x.dqkv, N * sz_R(&s)),
              "cp 1 (docs %s): block ops give attention_fwd's out, lse and attention_bwd's dqkv bit for bit",
              doc_names[docs]);
        free(out);
        free(lse);
        free(dqkv);
        ref_free(&x);
    }

    ref_t x;
    ref_make(&x, &s, DOCS_CROSS, 4, cpu);
    float *out[3], *lse[3], *dqkv[3];
    const ops_t *d = ops_defer_create(ops_cpu_create());
    if (!d) {
        fprintf(stderr, "test_ring_attn: out of memory\n");
        exit(1);
    }
    for (int v = 0; v < 3; v++) { /* 0: CPU table; 1: deferred table; 2: CPU table, other threads */
        out[v] = xcalloc(N * sz_OC(&s), sizeof(float));
        lse[v] = xcalloc(NL, sizeof(float));
        dqkv[v] = xcalloc(N * sz_R(&s), sizeof(float));
#ifdef _OPENMP
        int saved = omp_get_max_threads();
        if (v == 2)
            omp_set_num_threads(saved > 1 ? 1 : 2);
#endif
        ring_run(v == 1 ? d : cpu, &x, 4, MUT_NONE, out[v], lse[v], dqkv[v]);
#ifdef _OPENMP
        omp_set_num_threads(saved);
#endif
    }
    long ops_run, waits;
    ops_defer_counts(d, &ops_run, &waits, NULL);
    check(same_bits(out[0], out[1], N * sz_OC(&s)) && same_bits(lse[0], lse[1], NL) &&
              same_bits(dqkv[0], dqkv[1], N * sz_R(&s)) && ops_run > 0,
          "deferred table (%ld ops queued, %ld waits): the CPU table's bits at cp 4 with documents", ops_run, waits);
    check(same_bits(out[0], out[2], N * sz_OC(&s)) && same_bits(lse[0], lse[2], NL) &&
              same_bits(dqkv[0], dqkv[2], N * sz_R(&s)),
          "another thread count: the same bits at cp 4 with documents");
    for (int v = 0; v < 3; v++) {
        free(out[v]);
        free(lse[v]);
        free(dqkv[v]);
    }
    ops_release(d);
    ref_free(&x);
}

/* ---------------------------------------------------------- (d) mutants */

static void test_mutants(const ops_t *o)
{
    shape_t s = {2, 128, 4, 2, 16};
    const size_t N = (size_t)s.B * s.T;
    ref_t x;
    ref_make(&x, &s, DOCS_CROSS, 4, o);
    float *out = xcalloc(N * sz_OC(&s), sizeof(float)), *lse = xcalloc((size_t)s.B * s.NH * s.T, sizeof(float));
    float *dqkv = xcalloc(N * sz_R(&s), sizeof(float));
    for (int m = MUT_SECTION; m <= MUT_DOC_START; m++) {
        errs_t e = ring_run(o, &x, 4, m, out, lse, dqkv);
        double ef = fmax(e.e[0], e.e[1]), eb = fmax(e.e[2], e.e[3]);
        check(ef > TOL_FWD && eb > TOL_BWD, "mutant '%s' fails at cp 4 with crossing documents: forward %.1e, "
                                            "backward %.1e",
              mut_names[m], ef, eb);
    }
    free(out);
    free(lse);
    free(dqkv);
    ref_free(&x);
}

/* ------------------------------------------------------------ (e) edges */

static void test_edges(const ops_t *o)
{
    /* one sequence, 8 query rows at global positions 10..17 against 4
     * keys at 0..3; query rows 2..5 computed, unmasked; rows 2 and 3 in
     * a document from 0, rows 4 and 5 in one from 12 (no key) */
    const int NH = 2, NKV = 1, HS = 4, Tq = 8, Tk = 4, R = (NH + 2 * NKV) * HS, KR = 2 * NKV * HS, OC = NH * HS;
    float qkv[8 * 16], kv[4 * 8], out[8 * 8], lse[2 * 8], pout[8 * 8], plse[2 * 8], dqkv[8 * 16], dkv[4 * 8],
        dout[8 * 8];
    int32_t qpos[8], kpos[4], qdoc[8];
    for (int i = 0; i < Tq * R; i++)
        qkv[i] = frand();
    for (int i = 0; i < Tk * KR; i++)
        kv[i] = frand();
    for (int i = 0; i < Tq * OC; i++)
        dout[i] = frand();
    for (int t = 0; t < Tq; t++) {
        qpos[t] = 10 + t;
        qdoc[t] = t < 4 ? 0 : 12;
    }
    for (int k = 0; k < Tk; k++)
        kpos[k] = k;
    for (int i = 0; i < Tq * OC; i++)
        out[i] = NAN;
    for (int i = 0; i < NH * Tq; i++)
        lse[i] = NAN;
    att_block_t k = {.B = 1, .NH = NH, .NKV = NKV, .HS = HS, .Tq = Tq, .q0 = 2, .nq = 4, .Tk = Tk, .k0 = 0, .nk = Tk,
                     .causal = 0};
    o->attention_block_fwd(o->ctx, out, lse, qkv, kv, qpos, kpos, qdoc, &k);
    o->sync(o->ctx);
    int untouched = 1, keyless = 1, keyed = 1;
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < Tq; t++) {
            float l = lse[h * Tq + t];
            const float *row = out + t * OC + h * HS;
            if (t < 2 || t >= 6)
                untouched &= isnan(l) && isnan(row[0]);
            else if (t >= 4)
                keyless &= l == -INFINITY && row[0] == 0.0f && row[HS - 1] == 0.0f;
            else
                keyed &= isfinite(l) && isfinite(row[0]);
        }
    check(untouched && keyless && keyed,
          "block forward: rows outside [q0, q0+nq) untouched, keyless rows lse -inf and out 0, the others finite");
    /* rows 4, 5 alone: a tile with no valid pair, skipped, still written */
    float out2[8 * 8], lse2[2 * 8];
    for (int i = 0; i < Tq * OC; i++)
        out2[i] = NAN;
    for (int i = 0; i < NH * Tq; i++)
        lse2[i] = NAN;
    att_block_t k2 = k;
    k2.q0 = 4;
    k2.nq = 2;
    o->attention_block_fwd(o->ctx, out2, lse2, qkv, kv, qpos, kpos, qdoc, &k2);
    o->sync(o->ctx);
    int skipped = 1;
    for (int h = 0; h < NH; h++)
        for (int t = 0; t < Tq; t++)
            skipped &= t >= 4 && t < 6 ? lse2[h * Tq + t] == -INFINITY && out2[t * OC + h * HS] == 0.0f
                                       : isnan(lse2[h * Tq + t]) && isnan(out2[t * OC + h * HS]);
    check(skipped, "block forward: a tile with no valid pair gives lse -inf and out 0, other rows untouched");

    /* merge: a keyed partial into keyless rows, then the rows' lse must be
     * the partial's; merging a keyless partial into them changes nothing */
    for (int i = 0; i < Tq * OC; i++)
        pout[i] = out[i];
    for (int i = 0; i < NH * Tq; i++)
        plse[i] = lse[i];
    float acc[8 * 8], accl[2 * 8];
    for (int t = 0; t < Tq; t++) /* rows outside [2, 6) NaN: the merge must not read or write them */
        for (int j = 0; j < OC; j++) {
            acc[t * OC + j] = t >= 2 && t < 6 ? 0.0f : NAN;
            accl[(j / HS) * Tq + t] = t >= 2 && t < 6 ? -INFINITY : NAN;
        }
    o->attention_merge(o->ctx, acc, accl, pout, plse, &k);
    o->sync(o->ctx);
    int same = 1;
    for (int h = 0; h < NH; h++)
        for (int t = 2; t < 6; t++) {
            same &= (accl[h * Tq + t] == plse[h * Tq + t]) || (t >= 4 && accl[h * Tq + t] == -INFINITY);
            for (int e = 0; e < HS; e++)
                same &= fabsf(acc[t * OC + h * HS + e] - pout[t * OC + h * HS + e]) <= 1e-6f;
        }
    int outside = isnan(accl[0]) && isnan(accl[Tq + 7]) && isnan(acc[0]) && isnan(acc[7 * OC + OC - 1]);
    check(same && outside, "merge: into -inf rows gives the partial (keyless ones stay -inf, out 0); rows outside "
                           "[q0, q0+nq) untouched");

    /* backward: only rows 2, 3 see keys; rows 4, 5 add nothing (dq 0) */
    for (int i = 0; i < Tq * R; i++)
        dqkv[i] = 0.0f;
    for (int i = 0; i < Tk * KR; i++)
        dkv[i] = 0.0f;
    o->attention_block_bwd(o->ctx, dqkv, dkv, dout, qkv, kv, acc, accl, qpos, kpos, qdoc, &k);
    o->sync(o->ctx);
    int zero45 = 1, nz23 = 0, kvcols = 1;
    for (int t = 0; t < Tq; t++)
        for (int j = 0; j < R; j++) {
            float d = dqkv[t * R + j];
            if (j >= OC)
                kvcols &= d == 0.0f;
            else if (t < 2 || t >= 4)
                zero45 &= d == 0.0f;
            else
                nz23 += d != 0.0f;
        }
    check(zero45 && kvcols && nz23 == 2 * OC,
          "block backward: dq only on rows with keys, dqkv's k and v columns untouched");
}

int main(void)
{
    const ops_t *o = ops_cpu_create();
    if (!o) {
        fprintf(stderr, "test_ring_attn: out of memory\n");
        return 1;
    }
    test_schedule();
    test_group(o);
    test_bits(o);
    test_mutants(o);
    test_edges(o);
    ops_release(o);
    printf("%d checks, %d failed\n", g_checks, g_fails);
    return g_fails ? 1 : 0;
}
