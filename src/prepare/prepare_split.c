/* Mapped inputs split among the ranks by bytes (see corpus.h, mapped
 * reading): rather than every rank reading and scanning every byte for
 * document boundaries, the input is taken in windows of PREP_WINDOW_BYTES
 * per rank; each rank scans its 1/N of a window (corpus_scan), and one
 * MPI_Allgatherv gives every rank the window's documents (offset, length)
 * in order, from which the document loop deals them out as before. Only
 * the owner of a document touches its bytes. Line numbers are counted only
 * for an error message (corpus_doc_line). Compressed inputs and pipes
 * cannot be cut by byte ranges: with any of them every rank streams all
 * inputs, as before. */
#include "src/prepare/prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Scanned bytes per rank per exchange: bounds the span lists (16 bytes a
 * document) while keeping the exchanges few (4 on 112 MB at 2 ranks).
 * For tests only, the environment variable DTRAIN_PREPARE_WINDOW_BYTES
 * (every rank the same) makes it smaller, so that a small input spans
 * many windows (test/test_prepare.sh); it is not a user setting. */
#define PREP_WINDOW_BYTES ((uint64_t)32 << 20)
#define PREP_WINDOW_ENV "DTRAIN_PREPARE_WINDOW_BYTES"

struct prep_window {
    const prep_run_t *r;
    corpus_t *c;
    MPI_Datatype span_type; /* one corpus_span_t */
    int typed;              /* span_type is committed */
    uint64_t total, next;   /* mapped bytes; start of the next window */
    uint64_t window;        /* bytes per rank per window */
    corpus_span_t *mine, *all;
    size_t n_mine, cap_mine, cap_all;
    int *counts, *displs; /* per rank, in spans */
};

/* Rank `who`'s message to every rank. */
static void share_error(const prep_window_t *w, int who, char *err, size_t errlen)
{
    char msg[PREP_ERRLEN];
    snprintf(msg, sizeof msg, "%s", err);
    prep_mpi_check(MPI_Bcast(msg, sizeof msg, MPI_CHAR, who, MPI_COMM_WORLD), "MPI_Bcast(error)");
    msg[sizeof msg - 1] = '\0';
    snprintf(err, errlen, "%s", msg);
}

/* Every rank's spans of the window into w->all: 0, or -1 with err on
 * every rank. `failed`: this rank's scan failed (err says why). */
static int exchange(prep_window_t *w, int failed, size_t *n, char *err, size_t errlen)
{
    int nr = w->r->nranks;
    if (!failed && w->n_mine > (size_t)INT32_MAX) {
        failed = 1;
        snprintf(err, errlen, "more than %d documents in one window of the input", INT32_MAX);
    }
    int mine = failed ? -1 : (int)w->n_mine;
    prep_mpi_check(MPI_Allgather(&mine, 1, MPI_INT, w->counts, 1, MPI_INT, MPI_COMM_WORLD), "MPI_Allgather(spans)");
    uint64_t sum = 0;
    for (int i = 0; i < nr; i++) {
        if (w->counts[i] < 0) {
            share_error(w, i, err, errlen);
            return -1;
        }
        w->displs[i] = (int)sum;
        sum += (uint64_t)w->counts[i];
    }
    int oom = 0;
    if (sum > (uint64_t)INT32_MAX)
        oom = 1;
    else if (sum > w->cap_all) {
        corpus_span_t *p = realloc(w->all, (size_t)sum * sizeof *p);
        oom = p == NULL;
        if (p != NULL)
            w->all = p, w->cap_all = (size_t)sum;
    }
    prep_mpi_check(MPI_Allreduce(MPI_IN_PLACE, &oom, 1, MPI_INT, MPI_LOR, MPI_COMM_WORLD), "MPI_Allreduce(oom)");
    if (oom) {
        snprintf(err, errlen, "out of memory for the list of %llu documents in a window of the input",
                 (unsigned long long)sum);
        return -1;
    }
    prep_mpi_check(
        MPI_Allgatherv(w->mine, mine, w->span_type, w->all, w->counts, w->displs, w->span_type, MPI_COMM_WORLD),
        "MPI_Allgatherv(spans)");
    *n = (size_t)sum;
    return 0;
}

/* corpus_feed_fn: the next window with any documents in it. */
static int feed(void *ctx, const corpus_span_t **spans, size_t *n, char *err, size_t errlen)
{
    prep_window_t *w = ctx;
    const uint64_t nr = (uint64_t)w->r->nranks, rank = (uint64_t)w->r->rank;
    *n = 0;
    while (*n == 0 && w->next < w->total) {
        uint64_t lo, hi;
        w->next += corpus_window_range(w->total, w->next, w->window, nr, rank, &lo, &hi);
        w->n_mine = 0;
        int failed = corpus_scan(w->c, lo, hi, &w->mine, &w->n_mine, &w->cap_mine, err, errlen) != 0;
        if (nr == 1) {
            if (failed)
                return -1;
            *spans = w->mine;
            *n = w->n_mine;
            continue;
        }
        if (exchange(w, failed, n, err, errlen) != 0)
            return -1;
        *spans = w->all;
    }
    return 0;
}

/* PREP_WINDOW_BYTES, or the test's smaller window (see above). */
static uint64_t window_bytes(void)
{
    const char *s = getenv(PREP_WINDOW_ENV);
    char *end = NULL;
    unsigned long long v = s != NULL && *s >= '1' && *s <= '9' ? strtoull(s, &end, 10) : 0;
    return v > 0 && *end == '\0' && v < PREP_WINDOW_BYTES ? (uint64_t)v : PREP_WINDOW_BYTES;
}

int prep_window_attach(const prep_run_t *r, corpus_t *c, prep_window_t **out, char *err, size_t errlen)
{
    *out = NULL;
    int rc = corpus_map_inputs(c, err, errlen), lo = rc, hi = rc;
    prep_mpi_check(MPI_Allreduce(&rc, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD), "MPI_Allreduce(mapped)");
    prep_mpi_check(MPI_Allreduce(&rc, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce(mapped)");
    if (lo < 0) /* the rank that could not open a file says so; the run stops on every rank */
        return rc < 0 ? -1 : 0;
    if (lo != hi) {
        snprintf(err, errlen,
                 "the inputs differ between the ranks (compressed or a pipe on some): give every "
                 "rank the same files");
        return -1;
    }
    if (rc == 0)
        return 0; /* streamed: every rank reads compressed inputs whole */
    prep_window_t *w = calloc(1, sizeof *w);
    if (w != NULL) {
        w->counts = malloc((size_t)r->nranks * sizeof *w->counts);
        w->displs = malloc((size_t)r->nranks * sizeof *w->displs);
    }
    if (w == NULL || w->counts == NULL || w->displs == NULL) {
        prep_window_free(w);
        snprintf(err, errlen, "out of memory for the input windows");
        return -1;
    }
    prep_mpi_check(MPI_Type_contiguous((int)sizeof(corpus_span_t), MPI_BYTE, &w->span_type), "MPI_Type_contiguous");
    prep_mpi_check(MPI_Type_commit(&w->span_type), "MPI_Type_commit");
    w->typed = 1;
    w->r = r;
    w->c = c;
    w->total = corpus_mapped_bytes(c);
    w->window = window_bytes();
    corpus_set_feed(c, feed, w);
    *out = w;
    return 1;
}

void prep_window_free(prep_window_t *w)
{
    if (w == NULL)
        return;
    if (w->typed)
        MPI_Type_free(&w->span_type);
    free(w->mine);
    free(w->all);
    free(w->counts);
    free(w->displs);
    free(w);
}
