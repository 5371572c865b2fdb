/* The TP x PP x DP process grid (see grid.h).
 *
 * Rank order world_rank = tp + T * (dp + D * pp), TP fastest (Megatron's
 * tp-dp-pp order). Each axis is one MPI_Comm_split of MPI_COMM_WORLD, HPL
 * style: the color is the index of the group (the other two coordinates
 * folded in the same order), the key is the coordinate along the axis, so
 * the rank in the group is the coordinate. The embedding group ties the
 * first and last pipeline stage of one (tp, dp). Every split comm is
 * wrapped with comm_mpi_create (which duplicates it) and then freed.
 *
 * Layout errors are found without communication, so every rank returns the
 * same message. Failures of MPI itself are agreed over the world before
 * grid_create returns, so every rank returns -1 together and with the
 * message of the lowest failing rank. */
#include "mpi/grid.h"

#include "mpi/agree.h"
#include "mpi/watchdog.h"

_Static_assert(WATCHDOG_MAX_GROUPS >= GRID_MAX_GROUPS, "the watchdog must take every group of the grid");

#include <limits.h>
#include <mpi.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { AXIS_TP, AXIS_DP, AXIS_PP, AXIS_EMBED, N_AXES };
static const char *const axis_name[N_AXES] = {"tp", "dp", "pp", "embed"};

/* This rank's first error while the grid is built, in the caller's buffer
 * (err[0] is '\0' until then): later ones are dropped. */
typedef struct first_err {
    char *s;
    size_t len;
} first_err_t;

static void set_err(first_err_t *e, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void set_err(first_err_t *e, const char *fmt, ...)
{
    if (e->s[0])
        return; /* keep the first error */
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->s, e->len, fmt, ap);
    va_end(ap);
}

static void mpi_err(first_err_t *e, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        snprintf(msg, sizeof msg, "MPI error code %d", rc);
    set_err(e, "grid: %s failed: %s", what, msg);
}

/* The color (group index) and key (rank in the group) of world rank
 * (tp, dp, pp) on `axis`; color MPI_UNDEFINED where it is not a member.
 * grid_print enumerates groups with the same rule. */
static void axis_color_key(int axis, int T, int D, int P, int tp, int dp, int pp, int *color, int *key)
{
    switch (axis) {
    case AXIS_TP:
        *color = dp + D * pp;
        *key = tp;
        break;
    case AXIS_DP:
        *color = tp + T * pp;
        *key = dp;
        break;
    case AXIS_PP:
        *color = tp + T * dp;
        *key = pp;
        break;
    default: /* AXIS_EMBED: first and last stage; key 0 = first stage */
        *color = (pp == 0 || pp == P - 1) ? tp + T * dp : MPI_UNDEFINED;
        *key = pp;
        break;
    }
}

static int axis_group_size(int axis, int T, int D, int P)
{
    switch (axis) {
    case AXIS_TP: return T;
    case AXIS_DP: return D;
    case AXIS_PP: return P;
    default: return P > 1 ? 2 : 1;
    }
}

static int axis_group_count(int axis, int T, int D, int P)
{
    switch (axis) {
    case AXIS_TP: return D * P;
    case AXIS_DP: return T * P;
    default: return T * D; /* pp, embed */
    }
}

/* World rank of member i of group `color` on `axis`. */
static int axis_member(int axis, int T, int D, int P, int color, int i)
{
    switch (axis) {
    case AXIS_TP: return i + T * color;                         /* color = dp + D*pp */
    case AXIS_DP: return color % T + T * (i + D * (color / T)); /* color = tp + T*pp */
    case AXIS_PP: return color + T * D * i;                     /* color = tp + T*dp */
    default: return color + T * D * (i == 0 ? 0 : P - 1);       /* embed */
    }
}

static comm_t **axis_slot(grid_t *g, int axis)
{
    switch (axis) {
    case AXIS_TP: return &g->tp;
    case AXIS_DP: return &g->dp;
    case AXIS_PP: return &g->pp;
    default: return &g->embed;
    }
}

/* Checks the layout; fills g's sizes. No communication. */
static status_t check_layout(grid_t *g, int tp, int pp, int dp, first_err_t *e)
{
    int W = g->world_size;
    if (tp < 1 || pp < 1 || dp < 0) {
        set_err(e, "--tp %d, --pp %d and --dp %d: tp and pp must be >= 1 and dp >= 0 (0 = world size / (tp x pp))", tp,
                pp, dp);
        return STATUS_INPUT;
    }
    long long tpp = (long long)tp * pp;
    if (W % tpp != 0) {
        set_err(e, "world size %d is not divisible by --tp %d x --pp %d = %lld: launch a multiple of %lld ranks", W, tp,
                pp, tpp, tpp);
        return STATUS_INPUT;
    }
    if (dp == 0)
        dp = (int)(W / tpp);
    long long total = tpp * dp;
    if (total != W) {
        set_err(e, "--tp %d x --pp %d x --dp %d = %lld ranks, but the world size is %d: launch %lld ranks or drop --dp",
                tp, pp, dp, total, W, total);
        return STATUS_INPUT;
    }
    g->tp_size = tp;
    g->pp_size = pp;
    g->dp_size = dp;
    return STATUS_OK;
}

/* Wraps `mc` (if not MPI_COMM_NULL) and frees it. On a member, checks that
 * the wrapped comm has the expected rank and size. */
static void wrap_split(grid_t *g, int axis, MPI_Comm *mc, int want_rank, int want_size, first_err_t *e)
{
    if (*mc == MPI_COMM_NULL)
        return;
    comm_t *c = comm_mpi_create(mc);
    if (!c)
        set_err(e, "grid: cannot create the %s communicator (comm_mpi_create failed)", axis_name[axis]);
    else if (c->rank != want_rank || c->size != want_size)
        set_err(e, "grid: %s communicator has rank %d of %d, expected %d of %d", axis_name[axis], c->rank, c->size,
                want_rank, want_size);
    if (c)
        snprintf(c->name, sizeof c->name, "%s", axis_name[axis]); /* trace span suffix */
    *axis_slot(g, axis) = c;
    int rc = MPI_Comm_free(mc);
    if (rc != MPI_SUCCESS)
        mpi_err(e, rc, "MPI_Comm_free");
}

/* Collective over the world: if any rank has an error (e->s non-empty),
 * every rank gets the lowest failing rank's message in e (prefixed with
 * its rank when the world has more than one) and its status. */
static status_t agree_world(const grid_t *g, first_err_t *e)
{
    int first = -1;
    const status_t st = agree_mpi_rank(MPI_COMM_WORLD, e->s[0] ? STATUS_FAIL : STATUS_OK, e->s, e->len, &first);
    if (st == STATUS_OK || first < 0 || g->world_size == 1)
        return st;
    char msg[COMM_ERR_MAX];
    snprintf(msg, sizeof msg, "%s", e->s);
    return status_set(st, e->s, e->len, "rank %d: %.*s", first, (int)sizeof msg - 16, msg);
}

status_t grid_create(grid_t *g, int tp, int pp, int dp, char *err, size_t errlen)
{
    memset(g, 0, sizeof *g);
    /* this rank's first error, agreed below */
    char first[COMM_ERR_MAX] = "";
    first_err_t e = {first, sizeof first};
    int rc = MPI_Comm_rank(MPI_COMM_WORLD, &g->world_rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(MPI_COMM_WORLD, &g->world_size);
    if (rc != MPI_SUCCESS) {
        mpi_err(&e, rc, "MPI_Comm_rank/size(MPI_COMM_WORLD)");
        return status_set(STATUS_FAIL, err, errlen, "%s", first);
    }
    if (check_layout(g, tp, pp, dp, &e) != STATUS_OK)
        return status_set(STATUS_INPUT, err, errlen, "%s", first);

    const int T = g->tp_size, D = g->dp_size, P = g->pp_size, r = g->world_rank;
    g->tp_rank = r % T;
    g->dp_rank = (r / T) % D;
    g->pp_rank = r / (T * D);
    g->ep_size = 1;
    g->edp_rank = g->dp_rank; /* no --ep: the expert-DP group is the DP group */
    g->cp_size = 1;

    /* From here on every rank enters the same world collectives (the
     * splits, then agree()) in the same order whatever failed locally, so
     * every rank fails together. (A split that fails on one member
     * only would still leave its group's other members in the dup inside
     * comm_mpi_create; MPI reports such failures on all members.) */
    MPI_Comm world = MPI_COMM_WORLD;
    g->world = comm_mpi_create(&world);
    if (!g->world)
        set_err(&e, "grid: cannot create the world communicator (comm_mpi_create failed)");
    else if (g->world->rank != r || g->world->size != g->world_size)
        set_err(&e, "grid: world communicator has rank %d of %d, expected %d of %d", g->world->rank, g->world->size, r,
                g->world_size);
    if (g->world)
        snprintf(g->world->name, sizeof g->world->name, "world"); /* trace span suffix */

    for (int axis = 0; axis < N_AXES; axis++) {
        int color, key;
        axis_color_key(axis, T, D, P, g->tp_rank, g->dp_rank, g->pp_rank, &color, &key);
        MPI_Comm sub = MPI_COMM_NULL;
        rc = MPI_Comm_split(MPI_COMM_WORLD, color, key, &sub);
        if (rc != MPI_SUCCESS) {
            char what[64];
            snprintf(what, sizeof what, "MPI_Comm_split(%s)", axis_name[axis]);
            mpi_err(&e, rc, what);
            continue; /* sub stays MPI_COMM_NULL */
        }
        if (color == MPI_UNDEFINED) {
            if (sub != MPI_COMM_NULL)
                set_err(&e, "grid: MPI_Comm_split(%s) gave a communicator to a non-member", axis_name[axis]);
            continue;
        }
        /* embed: key 0 is the first stage, the last stage is rank 1 */
        int want_rank = axis == AXIS_EMBED ? (key == 0 ? 0 : 1) : key;
        wrap_split(g, axis, &sub, want_rank, axis_group_size(axis, T, D, P), &e);
    }

    if (agree_world(g, &e) != STATUS_OK) {
        grid_destroy(g);
        return status_set(STATUS_FAIL, err, errlen, "%s", first);
    }
    return STATUS_OK;
}

void grid_destroy(grid_t *g)
{
    if (!g)
        return;
    comm_t **all[] = {&g->eshard, &g->cp, &g->edp, &g->ep, &g->replica, &g->shard,
                      &g->embed,  &g->pp, &g->dp,  &g->tp, &g->world};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (*all[i])
            (*all[i])->ops->destroy(*all[i]);
        *all[i] = NULL;
    }
    memset(g, 0, sizeof *g);
}

/* Splits each line of L ranks (the ranks of one class cls, numbered x =
 * 0..L-1: a DP group, or with --etp 1 a TP x DP plane) into L/H groups of
 * H consecutive x (*inner, rank x % H) and across them into H groups of
 * the L/H ranks with the same rank inside (*outer, rank x / H), named
 * iname and oname (the spans' and the watchdog's group names). Collective
 * over the world; every rank agrees on the outcome. */
static status_t split_line(int cls, int x, int L, int H, comm_t **inner, comm_t **outer, const char *iname,
                           const char *oname, const char *what, char *err, size_t errlen)
{
    char first[COMM_ERR_MAX] = "";
    first_err_t e = {first, sizeof first};
    const int groups = L / H;
    const int color = cls * groups + x / H;
    MPI_Comm sub = MPI_COMM_NULL;
    char call[64];
    snprintf(call, sizeof call, "MPI_Comm_split(%s)", iname);
    int rc = MPI_Comm_split(MPI_COMM_WORLD, color, x % H, &sub);
    if (rc != MPI_SUCCESS) {
        mpi_err(&e, rc, call);
        return status_set(STATUS_FAIL, err, errlen, "%s", first);
    }
    *inner = comm_mpi_create(&sub);
    if (MPI_Comm_free(&sub) != MPI_SUCCESS && *inner) {
        (*inner)->ops->destroy(*inner);
        *inner = NULL;
    }
    int ok = *inner && (*inner)->size == H && (*inner)->rank == x % H;
    rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS || !ok)
        return status_set(STATUS_FAIL, err, errlen, "grid: cannot create the %s %s groups of %d ranks", what, iname, H);
    snprintf((*inner)->name, sizeof(*inner)->name, "%s", iname);
    if (!outer)
        return STATUS_OK;
    /* the outer group: same (pp, tp) and the same rank within the inner
     * group, ordered by inner group */
    const int rcolor = cls * H + x % H;
    snprintf(call, sizeof call, "MPI_Comm_split(%s)", oname);
    rc = MPI_Comm_split(MPI_COMM_WORLD, rcolor, x / H, &sub);
    if (rc != MPI_SUCCESS) {
        mpi_err(&e, rc, call);
        return status_set(STATUS_FAIL, err, errlen, "%s", first);
    }
    *outer = comm_mpi_create(&sub);
    if (MPI_Comm_free(&sub) != MPI_SUCCESS && *outer) {
        (*outer)->ops->destroy(*outer);
        *outer = NULL;
    }
    ok = *outer && (*outer)->size == groups && (*outer)->rank == x / H;
    rc = MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS || !ok)
        return status_set(STATUS_FAIL, err, errlen, "grid: cannot create the %s %s groups of %d ranks", what, oname,
                          groups);
    snprintf((*outer)->name, sizeof(*outer)->name, "%s", oname);
    return STATUS_OK;
}

status_t grid_create_shard_group(grid_t *g, int H, char *err, size_t errlen)
{
    return split_line(g->pp_rank * g->tp_size + g->tp_rank, g->dp_rank, g->dp_size, H, &g->shard, &g->replica, "shard",
                      "replica", "hybrid", err, errlen);
}

status_t grid_create_ep_groups(grid_t *g, int N, int spans_tp, char *err, size_t errlen)
{
    /* the line the EP groups are cut from: the DP group, or the stage's
     * TP x DP plane */
    const int cls = spans_tp ? g->pp_rank : g->pp_rank * g->tp_size + g->tp_rank;
    const int x = spans_tp ? g->tp_rank + g->tp_size * g->dp_rank : g->dp_rank;
    const int L = spans_tp ? g->tp_size * g->dp_size : g->dp_size;
    CHECK(split_line(cls, x, L, N, &g->ep, &g->edp, "ep", "edp", "expert", err, errlen));
    g->ep_size = N;
    g->ep_rank = x % N;
    g->edp_rank = x / N;
    return STATUS_OK;
}

status_t grid_create_cp_group(grid_t *g, int N, char *err, size_t errlen)
{
    CHECK(split_line(g->pp_rank * g->tp_size + g->tp_rank, g->dp_rank, g->dp_size, N, &g->cp, NULL, "cp", NULL,
                     "context-parallel", err, errlen));
    g->cp_size = N;
    g->cp_rank = g->dp_rank % N;
    return STATUS_OK;
}

status_t grid_create_expert_shard(grid_t *g, int n, int spans_tp, char *err, size_t errlen)
{
    /* the expert-DP line, ranks numbered by edp_rank: same (pp, tp) and
     * place in the EP group, or with spans_tp same pp and place in the EP
     * group (the plane's x = tp + tp dp in grid_create_ep_groups, so a
     * shard group's H DP ranks are the n = H tp / N consecutive edp ranks) */
    const int cls = spans_tp ? g->pp_rank * g->ep_size + g->ep_rank
                             : (g->pp_rank * g->tp_size + g->tp_rank) * g->ep_size + g->ep_rank;
    const int L = (spans_tp ? g->tp_size * g->dp_size : g->dp_size) / g->ep_size;
    return split_line(cls, g->edp_rank, L, n, &g->eshard, NULL, "eshard", NULL, "expert shard", err, errlen);
}

int grid_data_rank(const grid_t *g) { return g->dp_rank / (g->cp_size > 1 ? g->cp_size : 1); }
int grid_data_size(const grid_t *g) { return g->dp_size / (g->cp_size > 1 ? g->cp_size : 1); }

int grid_groups(const grid_t *g, comm_t **list, const char **names)
{
    comm_t *const all[GRID_MAX_GROUPS] = {g->world,   g->tp, g->dp,  g->pp, g->embed, g->shard,
                                          g->replica, g->ep, g->edp, g->cp, g->eshard};
    static const char *const kind[GRID_MAX_GROUPS] = {"world",   "tp", "dp",  "pp", "embed", "shard",
                                                      "replica", "ep", "edp", "cp", "eshard"};
    int n = 0;
    for (int i = 0; i < GRID_MAX_GROUPS; i++)
        if (all[i]) {
            list[n] = all[i];
            if (names)
                names[n] = kind[i];
            n++;
        }
    return n;
}

/* ---- grid_print ---- */

typedef struct {
    char *s;
    size_t len, cap;
} strbuf_t;

static void sb_printf(strbuf_t *b, const char *fmt, ...)
{
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->s ? b->s + b->len : NULL, b->s ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->s && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap * 2 : 256;
        while (cap <= b->len + (size_t)n)
            cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p)
            return; /* out of memory: the line is cut */
        b->s = p;
        b->cap = cap;
    }
}

/* Members form an arithmetic progression m0, m0+s, ...: "0,1", "0-7",
 * "0,8,16,24", and past 8 members "0,8,...,120 (16 ranks)". */
static void format_ranks(strbuf_t *b, int n, int first, int stride)
{
    int last = first + stride * (n - 1);
    if (n >= 3 && stride == 1)
        sb_printf(b, "%d-%d", first, last);
    else if (n <= 8)
        for (int i = 0; i < n; i++)
            sb_printf(b, "%s%d", i ? "," : "", first + stride * i);
    else
        sb_printf(b, "%d,%d,...,%d (%d ranks)", first, first + stride, last, n);
}

#define GRID_PRINT_MAX_GROUPS 64 /* per kind; beyond that a summary line */
#define GRID_PRINT_MAX_HOSTS 4   /* per group; beyond that a count */

static void print_groups(FILE *out, const grid_t *g, int axis, const char *hosts, int hostlen)
{
    const int T = g->tp_size, D = g->dp_size, P = g->pp_size;
    int n = axis_group_size(axis, T, D, P), ng = axis_group_count(axis, T, D, P);
    if (n == 1) {
        fprintf(out, "  %-5s %d group%s of 1 rank (no %s communication)\n", axis_name[axis], ng, ng == 1 ? "" : "s",
                axis_name[axis]);
        return;
    }
    int width = snprintf(NULL, 0, "%d", ng - 1);
    int shown = ng <= GRID_PRINT_MAX_GROUPS ? ng : GRID_PRINT_MAX_GROUPS - 1;
    const char **distinct = malloc((size_t)n * sizeof *distinct);
    strbuf_t b = {0};
    for (int c = 0; c < ng; c++) {
        if (c == shown && c != ng - 1) {
            fprintf(out, "  %-5s ... %d more groups ...\n", axis_name[axis], ng - shown - 1);
            c = ng - 1; /* and the last one */
        }
        b.len = 0;
        int m0 = axis_member(axis, T, D, P, c, 0);
        int stride = n > 1 ? axis_member(axis, T, D, P, c, 1) - m0 : 1;
        sb_printf(&b, "  %-5s group %*d: ranks ", axis_name[axis], width, c);
        format_ranks(&b, n, m0, stride);
        int nd = 0;
        for (int i = 0; distinct && i < n; i++) {
            const char *h = hosts + (size_t)axis_member(axis, T, D, P, c, i) * (size_t)hostlen;
            int seen = 0;
            for (int j = 0; j < nd && !seen; j++)
                seen = strcmp(distinct[j], h) == 0;
            if (!seen)
                distinct[nd++] = h;
        }
        sb_printf(&b, " on ");
        for (int j = 0; j < nd && j < GRID_PRINT_MAX_HOSTS; j++)
            sb_printf(&b, "%s%s", j ? "," : "", distinct[j]);
        if (nd > GRID_PRINT_MAX_HOSTS)
            sb_printf(&b, ",... (%d hosts)", nd);
        if (b.s)
            fprintf(out, "%s\n", b.s);
    }
    free(b.s);
    free(distinct);
}

/* The distinct hosts of group c of axis, the first max of them into
 * distinct; how many went in. */
static int group_hosts(const grid_t *g, int axis, int c, const char *hosts, int hostlen, const char **distinct, int max)
{
    const int T = g->tp_size, D = g->dp_size, P = g->pp_size;
    int nd = 0;
    for (int i = 0; i < axis_group_size(axis, T, D, P); i++) {
        const char *h = hosts + (size_t)axis_member(axis, T, D, P, c, i) * (size_t)hostlen;
        int seen = 0;
        for (int j = 0; j < nd && !seen; j++)
            seen = strcmp(distinct[j], h) == 0;
        if (!seen && nd < max)
            distinct[nd++] = h;
    }
    return nd;
}

/* TP all-reduces activations in every layer, forward and backward: over an
 * inter-node link (a tenth of NVLink's bandwidth or less) it dominates the
 * step. The run is still correct, so it goes on; one line says which group
 * crosses nodes and how many do. */
static void warn_tp_across_hosts(const grid_t *g, const char *hosts, int hostlen)
{
    const int T = g->tp_size, D = g->dp_size, P = g->pp_size;
    if (T == 1)
        return;
    const char *distinct[GRID_PRINT_MAX_HOSTS + 1];
    int first = -1, crossing = 0;
    for (int c = 0; c < axis_group_count(AXIS_TP, T, D, P); c++)
        if (group_hosts(g, AXIS_TP, c, hosts, hostlen, distinct, 2) > 1 && crossing++ == 0)
            first = c;
    if (first < 0)
        return;
    const int nd_first = group_hosts(g, AXIS_TP, first, hosts, hostlen, distinct, GRID_PRINT_MAX_HOSTS + 1);
    strbuf_t b = {0};
    sb_printf(&b, "dtrain: warning: tensor-parallel group %d (ranks ", first);
    format_ranks(&b, T, axis_member(AXIS_TP, T, D, P, first, 0), 1);
    sb_printf(&b, ") spans hosts ");
    for (int j = 0; j < nd_first && j < GRID_PRINT_MAX_HOSTS; j++)
        sb_printf(&b, "%s%s", j ? ", " : "", distinct[j]);
    if (nd_first > GRID_PRINT_MAX_HOSTS)
        sb_printf(&b, ", ...");
    sb_printf(&b,
              " (%d of %d tp groups cross nodes): TP across nodes is bandwidth-bound; place each TP group inside "
              "a node (consecutive ranks on one node: mpirun --map-by slot, srun --distribution=block)",
              crossing, axis_group_count(AXIS_TP, T, D, P));
    if (b.s)
        fprintf(stderr, "%s\n", b.s);
    fflush(stderr);
    free(b.s);
}

status_t grid_print(const grid_t *g, FILE *out, char *err, size_t errlen)
{
    enum { HOSTLEN = MPI_MAX_PROCESSOR_NAME };
    char me[HOSTLEN];
    memset(me, 0, sizeof me);
    int len = 0, rc = MPI_Get_processor_name(me, &len);
    if (rc != MPI_SUCCESS)
        snprintf(me, sizeof me, "?");
    me[HOSTLEN - 1] = '\0';

    char *hosts = NULL;
    int root = g->world_rank == 0;
    if (root && !(hosts = calloc((size_t)g->world_size, HOSTLEN))) {
        /* the others are entering the gather: end the job, never hang */
        fprintf(stderr, "grid_print: out of memory for %d host names\n", g->world_size);
        MPI_Abort(MPI_COMM_WORLD, 1);
        return STATUS_FAIL;
    }
    rc = MPI_Gather(me, HOSTLEN, MPI_CHAR, hosts, HOSTLEN, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rc != MPI_SUCCESS) {
        char first[COMM_ERR_MAX] = "";
        mpi_err(&(first_err_t){first, sizeof first}, rc, "MPI_Gather(host names)");
        free(hosts);
        return status_set(STATUS_FAIL, err, errlen, "%s", first);
    }
    if (!root)
        return STATUS_OK;
    status_t status = STATUS_OK;
    warn_tp_across_hosts(g, hosts, HOSTLEN);
    if (out) {
        int nhosts = 0;
        for (int r = 0; r < g->world_size; r++) {
            int seen = 0;
            for (int q = 0; q < r && !seen; q++)
                seen = strcmp(hosts + (size_t)q * HOSTLEN, hosts + (size_t)r * HOSTLEN) == 0;
            nhosts += !seen;
        }
        fprintf(out, "grid: %d rank%s = tp %d x dp %d x pp %d on %d host%s (rank = tp + %d*(dp + %d*pp))\n",
                g->world_size, g->world_size == 1 ? "" : "s", g->tp_size, g->dp_size, g->pp_size, nhosts,
                nhosts == 1 ? "" : "s", g->tp_size, g->dp_size);
        for (int axis = 0; axis < N_AXES; axis++)
            print_groups(out, g, axis, hosts, HOSTLEN);
        if (fflush(out) != 0 || ferror(out))
            status = status_set(STATUS_FAIL, err, errlen, "writing the layout failed");
    }
    free(hosts);
    return status;
}
