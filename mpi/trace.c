/* Per-rank span recorder and merged Chrome trace writer (see trace.h and
 * doc/trace.md).
 *
 * Recording appends fixed-size records (80 bytes) to a growable array,
 * capped at max_events; nothing else happens until trace_write_merged.
 *
 * Writing, collective over a duplicate of the caller's communicator (so
 * its messages never match the caller's traffic; MPI_ERRORS_RETURN so
 * every return code is checked):
 *   1. each rank sorts its spans by (lane, start, longer first) and assigns
 *      rows: a span goes to the first row of its lane where it starts
 *      after the open spans end or nests inside the innermost open one, so
 *      every row (Chrome tid) holds properly nested spans only;
 *   2. rank 0 creates "<path>.tmp.<pid>" (O_EXCL); agreed;
 *   3. MPI_Gather of one fixed-size header per rank (span count, dropped,
 *      earliest time, label, whether it shares rank 0's node); rank 0
 *      allocates one receive buffer for the largest rank; agreed;
 *   4. clock offsets (trace.h) by ping-pong with ranks off rank 0's node;
 *      agreed;
 *   5. rank 0 writes its own spans, then receives each rank's spans in
 *      turn (MPI_Recv, one message of count*80 bytes) and writes them, so
 *      its memory is one rank's spans, not the world's (a Gatherv would
 *      need all of them at once, with int displacements); closes, renames;
 *      agreed.
 * "Agreed" = an MPI_Allreduce of the lowest failing rank and an MPI_Bcast
 * of its message, so every rank returns the same status and line.
 *
 * Records are sent as raw bytes: every rank runs the same binary on the
 * same architecture. */
#define _POSIX_C_SOURCE 200809L /* open flags */

#include "mpi/trace.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mpi/agree.h"
#include "mpi/clock.h"

#define LABEL_LEN 96
#define MAX_ROWS 32  /* rows per lane; past that spans share the last row */
#define MAX_DEPTH 64 /* nesting depth tracked per row */
#define PINGPONGS 16 /* round trips per remote rank; the shortest is used */

typedef struct span {
    double t0, t1; /* trace_now() seconds */
    long long bytes;
    int lane, tid; /* tid: lane + TRACE_MAX_LANES * row, set when written */
    int microbatch, layer, peer;
    char name[TRACE_NAME_MAX + 1];
} span_t;
_Static_assert(sizeof(span_t) == 80, "trace.h documents 80 bytes per span");

struct trace {
    int rank;
    char label[LABEL_LEN];
    span_t *ev;
    size_t n, cap, max, dropped;
};

/* Gathered to rank 0, one per rank. */
typedef struct rank_hdr {
    long long n, dropped;
    double t_min;  /* earliest span start, own clock (when n > 0) */
    int same_node; /* shares rank 0's CLOCK_MONOTONIC */
    char label[LABEL_LEN];
} rank_hdr_t;

double trace_now(void) { return now_s(); }

trace_t *trace_create(int world_rank, const char *label, size_t max_events)
{
    trace_t *t = calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->rank = world_rank;
    snprintf(t->label, sizeof t->label, "%s", label ? label : "");
    /* one rank's spans travel in one MPI message of int bytes */
    size_t limit = (size_t)INT_MAX / sizeof(span_t);
    t->max = max_events ? max_events : TRACE_DEFAULT_MAX_EVENTS;
    if (t->max > limit)
        t->max = limit;
    return t;
}

void trace_destroy(trace_t *t)
{
    if (!t)
        return;
    free(t->ev);
    free(t);
}

size_t trace_count(const trace_t *t) { return t ? t->n : 0; }

size_t trace_dropped(const trace_t *t) { return t ? t->dropped : 0; }

void trace_span(trace_t *t, int lane, const char *name, double t0, double t1, const trace_args_t *args)
{
    if (!t)
        return;
    if (lane < 0 || lane >= TRACE_MAX_LANES || t->n >= t->max) {
        t->dropped++;
        return;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1024;
        if (cap > t->max)
            cap = t->max;
        span_t *ev = realloc(t->ev, cap * sizeof *ev);
        if (!ev) {
            t->dropped++;
            return;
        }
        t->ev = ev;
        t->cap = cap;
    }
    span_t *s = &t->ev[t->n++];
    s->t0 = t0;
    s->t1 = t1 >= t0 ? t1 : t0; /* a clock never runs backwards; guard callers */
    s->lane = lane;
    s->tid = lane;
    s->bytes = args ? args->bytes : -1;
    s->microbatch = args ? args->microbatch : -1;
    s->layer = args ? args->layer : -1;
    s->peer = args ? args->peer : -1;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "");
}

/* ------------------------------------------------------------ row packing */

static int span_cmp(const void *pa, const void *pb)
{
    const span_t *a = pa, *b = pb;
    if (a->lane != b->lane)
        return a->lane < b->lane ? -1 : 1;
    if (a->t0 != b->t0)
        return a->t0 < b->t0 ? -1 : 1;
    if (a->t1 != b->t1)
        return a->t1 > b->t1 ? -1 : 1; /* the enclosing span first */
    return 0;
}

/* Sorts the spans and sets every tid (see the file comment, step 1). */
static void assign_rows(span_t *ev, size_t n)
{
    qsort(ev, n, sizeof *ev, span_cmp);
    double open[MAX_ROWS][MAX_DEPTH]; /* end times of the open spans, innermost last */
    int depth[MAX_ROWS], nrows = 0, lane = -1;
    for (size_t i = 0; i < n; i++) {
        span_t *s = &ev[i];
        if (s->lane != lane) {
            lane = s->lane;
            nrows = 0;
        }
        int row = -1;
        for (int k = 0; k < nrows && row < 0; k++) {
            /* later spans start no earlier: what ended by now stays closed */
            while (depth[k] > 0 && open[k][depth[k] - 1] <= s->t0)
                depth[k]--;
            if (depth[k] == 0 || (s->t1 <= open[k][depth[k] - 1] && depth[k] < MAX_DEPTH))
                row = k;
        }
        if (row < 0 && nrows < MAX_ROWS) {
            row = nrows++;
            depth[row] = 0;
        }
        if (row < 0)
            row = MAX_ROWS - 1; /* improper nesting there, rather than a lost span */
        if (depth[row] < MAX_DEPTH)
            open[row][depth[row]++] = s->t1;
        s->tid = lane + TRACE_MAX_LANES * row;
    }
}

/* ---------------------------------------------------------------- writing */

static void json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
    fputc('"', f);
}

/* Microseconds with nanosecond digits from integer nanoseconds. Start and
 * end are each rounded and dur is their difference, so a span nested in
 * seconds stays nested in the file. */
static void put_us(FILE *f, long long ns)
{
    if (ns < 0) {
        fputc('-', f);
        ns = -ns;
    }
    fprintf(f, "%lld.%03lld", ns / 1000, ns % 1000);
}

static const char *lane_name(int lane)
{
    switch (lane) {
    case TRACE_COMPUTE: return "compute";
    case TRACE_COMM: return "communication";
    default: return NULL;
    }
}

typedef struct writer {
    FILE *f;
    int first; /* no event written yet (no comma before the next) */
} writer_t;

static void sep(writer_t *w)
{
    fputs(w->first ? "\n" : ",\n", w->f);
    w->first = 0;
}

static void meta(writer_t *w, int pid, int tid, const char *what, const char *key, const char *sval, long long ival)
{
    sep(w);
    fprintf(w->f, "{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"%s\",\"args\":{\"%s\":", pid, tid, what, key);
    if (sval)
        json_str(w->f, sval);
    else
        fprintf(w->f, "%lld", ival);
    fputs("}}", w->f);
}

/* One rank's row: metadata, then its spans shifted by -offset - origin
 * (seconds) into microseconds. */
static void write_rank(writer_t *w, int pid, const rank_hdr_t *h, const span_t *ev, size_t n, double shift)
{
    meta(w, pid, 0, "process_name", "name", h->label, 0);
    meta(w, pid, 0, "process_sort_index", "sort_index", NULL, pid);
    if (h->dropped > 0) {
        char lab[96];
        snprintf(lab, sizeof lab, "%lld spans dropped (cap reached)", h->dropped);
        meta(w, pid, 0, "process_labels", "labels", lab, 0);
    }
    uint32_t used[TRACE_MAX_LANES] = {0}; /* bit row: that row has spans */
    used[TRACE_COMPUTE] = used[TRACE_COMM] = 1;
    for (size_t i = 0; i < n; i++) {
        const span_t *s = &ev[i];
        int lane = s->tid % TRACE_MAX_LANES, row = s->tid / TRACE_MAX_LANES;
        used[lane] |= (uint32_t)1 << row;
        long long b = llround((s->t0 - shift) * 1e9), e = llround((s->t1 - shift) * 1e9);
        sep(w);
        fprintf(w->f, "{\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"cat\":\"%s\",\"name\":", pid, s->tid,
                lane == TRACE_COMM ? "comm" : "compute");
        json_str(w->f, s->name);
        fputs(",\"ts\":", w->f);
        put_us(w->f, b);
        fputs(",\"dur\":", w->f);
        put_us(w->f, e - b);
        /* args: only the fields present */
        const char *key[4] = {"bytes", "microbatch", "layer", "peer"};
        long long val[4] = {s->bytes, s->microbatch, s->layer, s->peer};
        int nargs = 0;
        for (int k = 0; k < 4; k++)
            if (val[k] >= 0)
                fprintf(w->f, "%s\"%s\":%lld", nargs++ ? "," : ",\"args\":{", key[k], val[k]);
        fputs(nargs ? "}}" : "}", w->f);
    }
    for (int lane = 0; lane < TRACE_MAX_LANES; lane++)
        for (int row = 0; row < MAX_ROWS; row++) {
            if (!(used[lane] >> row & 1))
                continue;
            char nm[48];
            const char *ln = lane_name(lane);
            if (ln && row == 0)
                snprintf(nm, sizeof nm, "%s", ln);
            else if (ln)
                snprintf(nm, sizeof nm, "%s %d", ln, row + 1);
            else if (row == 0)
                snprintf(nm, sizeof nm, "lane %d", lane);
            else
                snprintf(nm, sizeof nm, "lane %d %d", lane, row + 1);
            int tid = lane + TRACE_MAX_LANES * row;
            meta(w, pid, tid, "thread_name", "name", nm, 0);
            meta(w, pid, tid, "thread_sort_index", "sort_index", NULL, (long long)lane * MAX_ROWS + row);
        }
}

/* ------------------------------------------------------------- collective */

typedef struct ctx {
    comm_t *c;     /* a duplicate of the caller's communicator, for agree() */
    MPI_Comm comm; /* c's MPI communicator */
    int rank, size;
    char msg[512]; /* this rank's first error */
} ctx_t;

static void set_msg(ctx_t *x, const char *fmt, ...)
{
    if (x->msg[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(x->msg, sizeof x->msg, fmt, ap);
    va_end(ap);
}

static void mpi_msg(ctx_t *x, int rc, const char *what)
{
    char s[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    if (MPI_Error_string(rc, s, &len) != MPI_SUCCESS)
        snprintf(s, sizeof s, "MPI error code %d", rc);
    set_msg(x, "trace: %s failed: %s", what, s);
}

/* 0 when no rank has an error; else -1 and the lowest failing rank's
 * message in x->msg on every rank (mpi/agree.h). */
static int ctx_agree(ctx_t *x)
{
    return agree(x->c, x->msg[0] ? STATUS_FAIL : STATUS_OK, x->msg, sizeof x->msg) == STATUS_OK ? 0 : -1;
}

/* 1 when this rank shares a node (and so CLOCK_MONOTONIC) with rank 0. */
static int on_root_node(ctx_t *x)
{
    const char *force = getenv("DTRAIN_TRACE_PINGPONG");
    MPI_Comm node = MPI_COMM_NULL;
    int rc = MPI_Comm_split_type(x->comm, MPI_COMM_TYPE_SHARED, x->rank, MPI_INFO_NULL, &node);
    if (rc != MPI_SUCCESS) {
        mpi_msg(x, rc, "MPI_Comm_split_type(shared)");
        return 0;
    }
    int root_here = x->rank == 0, flag = 0;
    rc = MPI_Allreduce(&root_here, &flag, 1, MPI_INT, MPI_MAX, node);
    if (rc != MPI_SUCCESS)
        mpi_msg(x, rc, "MPI_Allreduce(node)");
    MPI_Comm_free(&node);
    if (force && strcmp(force, "1") == 0)
        return x->rank == 0;
    return flag;
}

/* Rank 0: off[r], rtt[r] (seconds) for every rank off its node; others
 * answer. See trace.h for the method. */
static void clock_offsets(ctx_t *x, const rank_hdr_t *h, int same_node, double *off, double *rtt)
{
    if (x->rank != 0) {
        for (int i = 0; i < PINGPONGS && !same_node; i++) {
            double ping = 0, me;
            int rc = MPI_Recv(&ping, 1, MPI_DOUBLE, 0, 1, x->comm, MPI_STATUS_IGNORE);
            me = trace_now();
            if (rc == MPI_SUCCESS)
                rc = MPI_Send(&me, 1, MPI_DOUBLE, 0, 1, x->comm);
            if (rc != MPI_SUCCESS) {
                mpi_msg(x, rc, "clock ping-pong");
                return;
            }
        }
        return;
    }
    for (int r = 0; r < x->size; r++) {
        off[r] = 0;
        rtt[r] = 0;
        if (h[r].same_node)
            continue;
        double best = INFINITY;
        for (int i = 0; i < PINGPONGS; i++) {
            double a = trace_now(), remote = 0;
            int rc = MPI_Send(&a, 1, MPI_DOUBLE, r, 1, x->comm);
            if (rc == MPI_SUCCESS)
                rc = MPI_Recv(&remote, 1, MPI_DOUBLE, r, 1, x->comm, MPI_STATUS_IGNORE);
            double b = trace_now();
            if (rc != MPI_SUCCESS) {
                mpi_msg(x, rc, "clock ping-pong");
                return;
            }
            if (b - a < best) {
                best = b - a;
                off[r] = remote - 0.5 * (a + b);
            }
        }
        rtt[r] = best;
    }
}

/* Rank 0, after every span is written: the closing of traceEvents and
 * the per-rank clock and drop record. */
static void write_tail(FILE *f, const rank_hdr_t *h, const double *off, const double *rtt, int size)
{
    fputs("\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"format\": \"dtrain trace 1\", "
          "\"clock\": \"CLOCK_MONOTONIC of each rank minus its offset to rank 0 (same node: 0; else ping-pong, "
          "error <= rtt/2); ts 0 = earliest span\",\n\"ranks\": [",
          f);
    for (int r = 0; r < size; r++) {
        fprintf(f, "%s\n{\"rank\": %d, \"label\": ", r ? "," : "", r);
        json_str(f, h[r].label);
        fprintf(f, ", \"spans\": %lld, \"dropped\": %lld, \"clock\": \"%s\", \"offset_us\": %.3f, \"rtt_us\": %.3f}",
                h[r].n, h[r].dropped, h[r].same_node ? "same node" : "ping-pong", off[r] * 1e6, rtt[r] * 1e6);
    }
    fputs("\n]}}\n", f);
}

/* The output's temporary file (rank 0): tmp, opened as *f, and the tables
 * of every rank's header, clock offset and round trip. */
static void open_output(ctx_t *x, const char *path, char *tmp, size_t tmp_len, FILE **f, rank_hdr_t **hdr, double **off,
                        double **rtt)
{
    *hdr = calloc((size_t)x->size, sizeof **hdr);
    *off = calloc((size_t)x->size, sizeof **off);
    *rtt = calloc((size_t)x->size, sizeof **rtt);
    if (!*hdr || !*off || !*rtt) {
        set_msg(x, "trace: out of memory for %d ranks' headers", x->size);
        return;
    }
    if (snprintf(tmp, tmp_len, "%s.tmp.%ld", path, (long)getpid()) >= (int)tmp_len) {
        tmp[0] = '\0';
        set_msg(x, "trace: output path too long: %.200s...", path);
        return;
    }
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666);
    if (fd < 0 || !(*f = fdopen(fd, "w"))) {
        set_msg(x, "trace: cannot write %s: %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        tmp[0] = '\0';
    }
}

/* This rank's header into *mine, every rank's into hdr on rank 0, and there
 * the receive buffer for the largest other rank's spans. */
static void gather_headers(ctx_t *x, const trace_t *t, rank_hdr_t *mine, rank_hdr_t *hdr, span_t **buf)
{
    if (t) {
        mine->n = (long long)t->n;
        mine->dropped = (long long)t->dropped;
        mine->t_min = t->n ? t->ev[0].t0 : 0;
        for (size_t i = 0; i < t->n; i++)
            if (t->ev[i].t0 < mine->t_min)
                mine->t_min = t->ev[i].t0;
        snprintf(mine->label, sizeof mine->label, "%s", t->label);
    } else {
        snprintf(mine->label, sizeof mine->label, "rank %d", x->rank);
    }
    if (ctx_agree(x) != 0)
        return;
    int rc = MPI_Gather(mine, (int)sizeof *mine, MPI_BYTE, hdr, (int)sizeof *mine, MPI_BYTE, 0, x->comm);
    if (rc != MPI_SUCCESS) {
        mpi_msg(x, rc, "MPI_Gather(headers)");
        return;
    }
    if (x->rank != 0)
        return;
    long long most = 0;
    for (int r = 1; r < x->size; r++)
        most = hdr[r].n > most ? hdr[r].n : most;
    if (most > 0 && !(*buf = malloc((size_t)most * sizeof **buf)))
        set_msg(x, "trace: out of memory for %lld spans of one rank", most);
}

/* Rank 0: every rank's spans into f, in rank order, on one time axis; then
 * closes f and renames tmp to path (tmp[0] = '\0' once renamed). */
static void write_all(ctx_t *x, const trace_t *t, const rank_hdr_t *hdr, const double *off, const double *rtt,
                      span_t *buf, FILE *f, char *tmp, const char *path)
{
    double origin = INFINITY;
    for (int r = 0; r < x->size; r++)
        if (hdr[r].n > 0 && hdr[r].t_min - off[r] < origin)
            origin = hdr[r].t_min - off[r];
    if (!isfinite(origin))
        origin = 0;
    writer_t w = {.f = f, .first = 1};
    errno = 0;
    fputs("{\"traceEvents\": [", f);
    write_rank(&w, 0, &hdr[0], t ? t->ev : NULL, t ? t->n : 0, origin + off[0]);
    for (int r = 1; r < x->size; r++) {
        /* keep receiving after a failure: rank r is already sending */
        int rc = MPI_Recv(buf, (int)((size_t)hdr[r].n * sizeof *buf), MPI_BYTE, r, 2, x->comm, MPI_STATUS_IGNORE);
        if (rc != MPI_SUCCESS) {
            mpi_msg(x, rc, "MPI_Recv(spans)");
            continue;
        }
        write_rank(&w, r, &hdr[r], buf, (size_t)hdr[r].n, origin + off[r]);
    }
    write_tail(f, hdr, off, rtt, x->size);
    int werr = ferror(f);
    int cerr = fclose(f);
    if (werr || cerr != 0)
        set_msg(x, "trace: cannot write %s: %s", path, strerror(errno ? errno : EIO));
    else if (!x->msg[0] && rename(tmp, path) != 0)
        set_msg(x, "trace: cannot rename %s to %s: %s", tmp, path, strerror(errno));
    else if (!x->msg[0])
        tmp[0] = '\0'; /* renamed: nothing to remove */
}

int trace_write_merged(trace_t *t, const void *mpi_comm, const char *path, char *err, size_t errlen)
{
    if (err && errlen)
        err[0] = '\0';
    if (!mpi_comm || !path || !*path) {
        if (err && errlen)
            snprintf(err, errlen, "trace: no communicator or no output path");
        return -1;
    }
    ctx_t x = {.comm = MPI_COMM_NULL};
    if (!(x.c = comm_mpi_create(mpi_comm)) || comm_mpi_handle(x.c, &x.comm) != 0) {
        if (x.c)
            x.c->ops->destroy(x.c);
        if (err && errlen)
            snprintf(err, errlen, "trace: MPI_Comm_dup failed");
        return -1;
    }
    x.rank = x.c->rank;
    x.size = x.c->size;
    rank_hdr_t *hdr = NULL, mine = {0};
    double *off = NULL, *rtt = NULL;
    span_t *buf = NULL;
    FILE *f = NULL;
    char tmp[4096] = "";
    int status = -1;

    if (t) /* 1: rows */
        assign_rows(t->ev, t->n);
    if (x.rank == 0) /* 2: rank 0 opens the temporary file and its tables */
        open_output(&x, path, tmp, sizeof tmp, &f, &hdr, &off, &rtt);
    if (ctx_agree(&x) != 0)
        goto out;
    mine.same_node = on_root_node(&x); /* 3: headers */
    gather_headers(&x, t, &mine, hdr, &buf);
    if (ctx_agree(&x) != 0)
        goto out;
    clock_offsets(&x, hdr, mine.same_node, off, rtt); /* 4: clocks */
    if (ctx_agree(&x) != 0)
        goto out;
    if (x.rank == 0) { /* 5: spans, rank by rank */
        write_all(&x, t, hdr, off, rtt, buf, f, tmp, path);
        f = NULL;
    } else {
        int rc = MPI_Send(t ? t->ev : NULL, (int)(mine.n * (long long)sizeof(span_t)), MPI_BYTE, 0, 2, x.comm);
        if (rc != MPI_SUCCESS)
            mpi_msg(&x, rc, "MPI_Send(spans)");
    }
    status = ctx_agree(&x);

out:
    if (f)
        fclose(f);
    if (x.rank == 0 && tmp[0])
        unlink(tmp);
    free(buf);
    free(hdr);
    free(off);
    free(rtt);
    x.c->ops->destroy(x.c);
    if (status != 0 && err && errlen)
        snprintf(err, errlen, "%s", x.msg[0] ? x.msg : "trace: failed");
    return status;
}
