/* The process grid: mpiexec -np N test_grid T P.
 *
 * With dp = N / (T*P), checks on every rank, with exact numbers:
 * coordinates from world_rank = tp + T*(dp + D*pp); group sizes; rank in
 * each group == coordinate; a SUM allreduce of world_rank over each group
 * equals the sum of the expected members, and an allgather gives exactly
 * the expected members in coordinate order; the embedding group (first and
 * last stage only); the layout error messages; grid_print's lines.
 * All ranks agree on the result. A layout that does not fit N exits 2
 * with one stderr line (rank 0's). */
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mpi/grid.h"
#include "mpi/launch.h"

static launch_env_t env;
static int n_checks, n_fail;
static char first_fail[512];

static void check(int ok, const char *fmt, ...)
{
    n_checks++;
    if (ok)
        return;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!n_fail++)
        snprintf(first_fail, sizeof first_fail, "%s", msg);
    fprintf(stderr, "test_grid: rank %d: FAIL %s\n", env.world_rank, msg);
}

static int parse_pos(const char *s)
{
    char *end = NULL;
    long v = strtol(s, &end, 10);
    return (end != s && *end == '\0' && v > 0 && v < 1 << 20) ? (int)v : -1;
}

/* Checks one group: comm c, expected members[0..n) in group-rank order,
 * this rank's expected position `pos`. Phase 0: presence, size and rank,
 * no communication. Phase 1 (entered only when phase 0 passed on every
 * rank, so every member enters each collective): membership by a SUM
 * allreduce and an allgather of world ranks. */
static void check_group(int phase, const char *kind, comm_t *c, const int *members, int n, int pos)
{
    if (phase == 0) {
        check(c != NULL, "%s: communicator is NULL", kind);
        check(!c || c->size == n, "%s: size %d, expected %d", kind, c ? c->size : -1, n);
        check(!c || c->rank == pos, "%s: rank %d, expected %d", kind, c ? c->rank : -1, pos);
        check(members[pos] == env.world_rank, "%s: test bug: member %d is %d, not world rank %d", kind, pos,
              members[pos], env.world_rank);
        return;
    }

    long long want = 0;
    for (int i = 0; i < n; i++)
        want += members[i];
    float x = (float)env.world_rank; /* exact: ranks and sums < 2^24 */
    char cerr[COMM_ERR_MAX] = "";
    int rc = c->ops->allreduce(c, &x, 1, COMM_FP32, COMM_SUM, cerr, sizeof cerr);
    check(rc == 0, "%s: allreduce failed: %s", kind, cerr);
    check(rc == 0 && (long long)x == want && x == (float)want, "%s: SUM of world ranks %.1f, expected %lld", kind,
          (double)x, want);

    float me = (float)env.world_rank, *all = malloc((size_t)n * sizeof *all);
    if (!all) {
        check(0, "%s: out of memory", kind);
        return;
    }
    rc = c->ops->allgather(c, &me, all, 1, COMM_FP32, cerr, sizeof cerr);
    check(rc == 0, "%s: allgather failed: %s", kind, cerr);
    for (int i = 0; rc == 0 && i < n; i++)
        check(all[i] == (float)members[i], "%s: group rank %d is world rank %.0f, expected %d", kind, i, (double)all[i],
              members[i]);
    free(all);
}

/* Layout errors: computed without communication, so each rank may call
 * grid_create alone. */
static void check_layout_error(int tp, int pp, int dp, const char *want)
{
    grid_t h;
    char err[COMM_ERR_MAX] = "";
    int rc = grid_create(&h, tp, pp, dp, err, sizeof err);
    check(rc == STATUS_INPUT, "grid_create(tp %d, pp %d, dp %d) returned %d, expected STATUS_INPUT (%d)", tp, pp, dp,
          rc, STATUS_INPUT);
    check(strcmp(err, want) == 0, "grid_create(tp %d, pp %d, dp %d): error '%s', expected '%s'", tp, pp, dp, err, want);
    check(!h.world && !h.tp && !h.dp && !h.pp && !h.embed, "grid_create(tp %d, pp %d, dp %d) left communicators", tp,
          pp, dp);
    grid_destroy(&h);
}

/* The expected rank list of a group with n members first, first+stride,
 * ...: a range for consecutive ranks, all ranks up to 8, else the ends. */
static void expect_ranks(char *buf, size_t size, int n, int first, int stride)
{
    int last = first + stride * (n - 1);
    size_t len = 0;
    if (n >= 3 && stride == 1)
        snprintf(buf, size, "%d-%d", first, last);
    else if (n <= 8)
        for (int i = 0; i < n && len < size; i++)
            len += (size_t)snprintf(buf + len, size - len, "%s%d", i ? "," : "", first + stride * i);
    else
        snprintf(buf, size, "%d,%d,...,%d (%d ranks)", first, first + stride, last, n);
}

/* Lines grid_print writes for ng groups of n: one summary line for groups
 * of one; else one per group, or past 64 groups the first 63, a "more"
 * line and the last. */
static int kind_lines(int n, int ng) { return n == 1 ? 1 : ng <= 64 ? ng : 65; }

/* Rank 0: the printed text has the header, one line per group kind entry,
 * and the exact first and last lines of each kind. */
static void check_print(const char *text, int T, int D, int P)
{
    const int N = T * D * P;
    /* on one host (the test setup) every line names it; else only the
     * ranks are checked */
    const char *host = env.local_size == N ? env.host : "";
    const char *nl = env.local_size == N ? "\n" : "";
    char want[512];
    int lines = 0;
    for (const char *p = text; *p; p++)
        lines += *p == '\n';
    int want_lines =
        1 + kind_lines(T, D * P) + kind_lines(D, T * P) + kind_lines(P, T * D) + kind_lines(P > 1 ? 2 : 1, T * D);
    check(lines == want_lines, "grid_print: %d lines, expected %d", lines, want_lines);

    snprintf(want, sizeof want, "grid: %d rank%s = tp %d x dp %d x pp %d on %s", N, N == 1 ? "" : "s", T, D, P,
             env.local_size == N ? "1 host " : "");
    check(strncmp(text, want, strlen(want)) == 0, "grid_print: header does not start with '%s'", want);

    /* the first group of each kind, and the last tp group */
    const char *fmt_group = "\n  %-5s group %*d: ranks %s on %s%s";
    char ranks[64];
    int w;
    if (T > 1) {
        w = snprintf(NULL, 0, "%d", D * P - 1);
        expect_ranks(ranks, sizeof ranks, T, 0, 1);
        snprintf(want, sizeof want, fmt_group, "tp", w, 0, ranks, host, nl);
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
        expect_ranks(ranks, sizeof ranks, T, N - T, 1);
        snprintf(want, sizeof want, fmt_group, "tp", w, D * P - 1, ranks, host, nl);
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
    } else {
        snprintf(want, sizeof want, "\n  tp    %d group%s of 1 rank (no tp communication)\n", D * P,
                 D * P == 1 ? "" : "s");
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
    }
    if (D > 1) {
        w = snprintf(NULL, 0, "%d", T * P - 1);
        expect_ranks(ranks, sizeof ranks, D, 0, T);
        snprintf(want, sizeof want, fmt_group, "dp", w, 0, ranks, host, nl);
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
    }
    if (P > 1) {
        w = snprintf(NULL, 0, "%d", T * D - 1);
        expect_ranks(ranks, sizeof ranks, P, 0, T * D);
        snprintf(want, sizeof want, fmt_group, "pp", w, 0, ranks, host, nl);
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
        expect_ranks(ranks, sizeof ranks, 2, 0, T * D * (P - 1));
        snprintf(want, sizeof want, fmt_group, "embed", w, 0, ranks, host, nl);
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
    } else {
        snprintf(want, sizeof want, "\n  embed %d group%s of 1 rank (no embed communication)\n", T * D,
                 T * D == 1 ? "" : "s");
        check(strstr(text, want) != NULL, "grid_print: no line '%s'", want + 1);
    }
}

int main(int argc, char **argv)
{
    launch_init(&env, &argc, &argv);
    const int N = env.world_size, r = env.world_rank;
    int T = argc == 3 ? parse_pos(argv[1]) : -1, P = argc == 3 ? parse_pos(argv[2]) : -1;
    if (T < 1 || P < 1) {
        if (r == 0)
            fprintf(stderr, "usage: mpiexec -np N test_grid TP PP\n");
        launch_exit(&env, 2);
    }

    grid_t g;
    char gerr[COMM_ERR_MAX] = "";
    int rc = grid_create(&g, T, P, 0, gerr, sizeof gerr);
    /* a layout error is the same on every rank: report it once, exit 2 */
    if (launch_any_failed(&env, "test_grid", rc != 0, gerr))
        launch_exit(&env, 2);

    const int D = N / (T * P);
    const int tp = r % T, dp = (r / T) % D, pp = r / (T * D);
    check(T * D * P == N, "test bug: T %d x D %d x P %d != N %d", T, D, P, N);
    check(g.world_rank == r && g.world_size == N, "world %d of %d, expected %d of %d", g.world_rank, g.world_size, r,
          N);
    check(g.tp_size == T && g.dp_size == D && g.pp_size == P, "sizes tp %d dp %d pp %d, expected %d %d %d", g.tp_size,
          g.dp_size, g.pp_size, T, D, P);
    check(g.tp_rank == tp && g.dp_rank == dp && g.pp_rank == pp, "coords tp %d dp %d pp %d, expected %d %d %d",
          g.tp_rank, g.dp_rank, g.pp_rank, tp, dp, pp);
    check(tp + T * (dp + D * pp) == r, "test bug: rank formula");

    /* --ep: without it ep_size 1 and the expert-DP rank is the DP rank;
     * with 2 (where it divides dp) the EP groups are pairs of consecutive
     * DP ranks and the expert-DP groups the DP ranks of one parity */
    check(g.ep_size == 1 && g.edp_rank == dp && !g.ep && !g.edp, "no --ep: ep_size %d, edp_rank %d (dp %d)", g.ep_size,
          g.edp_rank, dp);
    const int E = D % 2 == 0 ? 2 : 0;
    if (E) {
        rc = grid_create_ep_groups(&g, E, 0, gerr, sizeof gerr);
        check(rc == STATUS_OK, "grid_create_ep_groups(%d): %s", E, gerr);
        check(g.ep_size == E && g.ep_rank == dp % E && g.edp_rank == dp / E, "ep %d: ep_size %d ep_rank %d edp_rank %d",
              E, g.ep_size, g.ep_rank, g.edp_rank);
        comm_t *list[GRID_MAX_GROUPS];
        const char *names[GRID_MAX_GROUPS];
        const int ng = grid_groups(&g, list, names);
        check(ng >= 2 && strcmp(names[ng - 2], "ep") == 0 && strcmp(names[ng - 1], "edp") == 0 &&
                  strcmp(list[ng - 1]->name, "edp") == 0,
              "grid_groups: the last two groups are not ep, edp");
    }

    int *m = malloc((size_t)(N < 2 ? 2 : N) * sizeof *m); /* the embed group lists 2 even at N 1 */
    if (!m) {
        fprintf(stderr, "test_grid: rank %d: out of memory\n", r);
        MPI_Abort(MPI_COMM_WORLD, 1); /* the others are in collectives */
    }
    /* phase 0 on every rank, agree, then the collectives of phase 1 */
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) {
            int mine = n_fail, any = 0;
            if (MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD) != MPI_SUCCESS)
                any = 1;
            if (any) {
                check(0, "group collectives skipped: a group's size, rank or presence is wrong on some rank");
                break;
            }
        }
        for (int i = 0; i < N; i++)
            m[i] = i;
        check_group(phase, "world", g.world, m, N, r);
        for (int i = 0; i < T; i++)
            m[i] = i + T * (dp + D * pp);
        check_group(phase, "tp", g.tp, m, T, tp);
        for (int i = 0; i < D; i++)
            m[i] = tp + T * (i + D * pp);
        check_group(phase, "dp", g.dp, m, D, dp);
        for (int i = 0; i < P; i++)
            m[i] = tp + T * (dp + D * i);
        check_group(phase, "pp", g.pp, m, P, pp);
        if (pp == 0 || pp == P - 1) {
            m[0] = tp + T * dp;
            m[1] = tp + T * (dp + D * (P - 1));
            check_group(phase, "embed", g.embed, m, P > 1 ? 2 : 1, pp == 0 ? 0 : 1);
        } else if (phase == 0) {
            check(g.embed == NULL, "embed: middle stage %d of %d has an embedding communicator", pp, P);
        }
        if (E) {
            for (int i = 0; i < E; i++)
                m[i] = tp + T * (dp / E * E + i + D * pp);
            check_group(phase, "ep", g.ep, m, E, dp % E);
            for (int i = 0; i < D / E; i++)
                m[i] = tp + T * (dp % E + E * i + D * pp);
            check_group(phase, "edp", g.edp, m, D / E, dp / E);
        }
    }
    /* --etp 1 (spans_tp): the groups come from the TP x DP plane, ranks j
     * = tp + T dp: EP = 2 consecutive j, expert-DP = the j of one parity */
    const int plane = T * D, j = tp + T * dp, E1 = plane % 2 == 0 ? 2 : 0;
    if (E1) {
        if (g.ep)
            g.ep->ops->destroy(g.ep);
        g.ep = NULL;
        if (g.edp)
            g.edp->ops->destroy(g.edp);
        g.edp = NULL;
        rc = grid_create_ep_groups(&g, E1, 1, gerr, sizeof gerr);
        check(rc == STATUS_OK, "grid_create_ep_groups(%d, spans_tp): %s", E1, gerr);
        check(g.ep_size == E1 && g.ep_rank == j % E1 && g.edp_rank == j / E1,
              "etp 1, ep %d: ep_size %d ep_rank %d edp_rank %d (plane rank %d)", E1, g.ep_size, g.ep_rank, g.edp_rank,
              j);
        for (int phase = 0; rc == STATUS_OK && phase < 2; phase++) {
            for (int i = 0; i < E1; i++)
                m[i] = j / E1 * E1 + i + plane * pp;
            check_group(phase, "ep (etp 1)", g.ep, m, E1, j % E1);
            for (int i = 0; i < plane / E1; i++)
                m[i] = j % E1 + E1 * i + plane * pp;
            check_group(phase, "edp (etp 1)", g.edp, m, plane / E1, j / E1);
        }
    }
    free(m);

    /* layout errors, each with its exact message */
    char want[256];
    snprintf(want, sizeof want,
             "world size %d is not divisible by --tp %d x --pp %d = %d: launch a multiple of %d ranks", N, N + 1, 1,
             N + 1, N + 1);
    check_layout_error(N + 1, 1, 0, want);
    snprintf(want, sizeof want,
             "--tp %d x --pp %d x --dp %d = %d ranks, but the world size is %d: launch %d ranks or drop --dp", T, P,
             D + 1, T * P * (D + 1), N, T * P * (D + 1));
    check_layout_error(T, P, D + 1, want);
    check_layout_error(0, 1, 0,
                       "--tp 0, --pp 1 and --dp 0: tp and pp must be >= 1 and dp >= 0 (0 = world size / (tp x pp))");

    /* grid_print: rank 0 prints into memory, checks the lines, echoes them */
    char *text = NULL;
    size_t text_len = 0;
    FILE *out = r == 0 ? open_memstream(&text, &text_len) : NULL;
    if (r == 0 && !out)
        check(0, "open_memstream failed");
    rc = grid_print(&g, out, gerr, sizeof gerr);
    check(rc == 0, "grid_print returned %d", rc);
    if (out) {
        fclose(out);
        check_print(text ? text : "", T, D, P);
        fputs(text ? text : "", stdout);
        free(text);
    }

    grid_destroy(&g);
    check(!g.world && !g.tp && !g.dp && !g.pp && !g.embed && !g.ep && !g.edp, "grid_destroy left communicators");

    char msg[600];
    snprintf(msg, sizeof msg, "%d of %d checks failed, first: %s", n_fail, n_checks, first_fail);
    int failed = launch_any_failed(&env, "test_grid", n_fail != 0, msg);
    if (!failed && r == 0)
        printf("test_grid: ok: %d ranks, tp %d x dp %d x pp %d, %d checks on rank 0\n", N, T, D, P, n_checks);
    launch_exit(&env, failed ? 1 : 0);
    return 1; /* not reached */
}
