/* Per-rank span recorder and merged Chrome/Perfetto trace (doc/trace.md).
 *
 * Each rank records spans (name, lane, start, end, a few integer args)
 * into its own trace_t; trace_write_merged gathers them to rank 0, which
 * writes one JSON file with one process row per rank. A NULL trace_t *
 * makes every recording call a no-op, so call sites need no `if`.
 *
 * To record a layer span:
 *
 *     double t0 = trace_now();
 *     ... forward of layer 3, microbatch m ...
 *     trace_span(tr, TRACE_COMPUTE, "fwd h.3", t0, trace_now(),
 *                &(trace_args_t){.bytes = -1, .microbatch = m, .layer = 3, .peer = -1});
 *
 * Communication spans are recorded by the communicator itself when
 * comm->trace is set (mpi/comm.h). Lanes are thread rows of the rank's
 * process: spans on one lane should nest or follow each other; where they
 * partly overlap (several nonblocking operations in flight) the writer
 * moves the later ones to extra rows of the same lane ("communication 2"),
 * so every row nests properly and Perfetto draws every span.
 *
 * Times are CLOCK_MONOTONIC seconds of the recording rank (trace_now());
 * the writer shifts each rank's times onto rank 0's clock (see
 * trace_write_merged) and writes microseconds from the earliest span.
 *
 * Not thread-safe: one recording thread per trace_t (dtrain records from
 * the main thread; OpenMP regions are inside spans, not around them). This
 * header needs no mpi.h: communicators are passed as pointers to MPI_Comm,
 * as in comm.h. */
#ifndef DTRAIN_TRACE_H
#define DTRAIN_TRACE_H

#include <stddef.h>

typedef struct trace trace_t;

/* Lanes (Chrome "tid"). Communication has its own lane: a nonblocking
 * allreduce overlaps the compute spans it hides behind. */
enum { TRACE_COMPUTE = 0, TRACE_COMM = 1, TRACE_MAX_LANES = 8 };

/* Optional integer args of a span; -1 = absent (not written). Pass NULL
 * for none. */
typedef struct trace_args {
    long long bytes; /* bytes moved, see mpi/comm_mpi.c for collectives */
    int microbatch;
    int layer;
    int peer; /* rank in the communicator's group, or a collective's root */
} trace_args_t;

/* Span names longer than this are cut. */
#define TRACE_NAME_MAX 35

/* A recorder for world rank `world_rank` whose process row is labelled
 * `label` (e.g. "rank 3 (tp 1 pp 0 dp 1)"; cut at 95 bytes). Keeps at most
 * max_events spans (0 = TRACE_DEFAULT_MAX_EVENTS; each takes 80 bytes,
 * grown on demand); later ones are counted as dropped and the count is
 * written into the file. Returns NULL when out of memory. Not collective. */
#define TRACE_DEFAULT_MAX_EVENTS ((size_t)1 << 20)
trace_t *trace_create(int world_rank, const char *label, size_t max_events);
void trace_destroy(trace_t *t);

/* CLOCK_MONOTONIC in seconds: now_s() of clock.h, the clock spans are in. */
double trace_now(void);

/* Records the span [t0, t1] (trace_now() seconds) on `lane` (0 ..
 * TRACE_MAX_LANES-1; others are dropped). name is copied. No-op when t is
 * NULL. */
void trace_span(trace_t *t, int lane, const char *name, double t0, double t1, const trace_args_t *args);

/* Spans recorded so far, and dropped (cap reached or out of memory). */
size_t trace_count(const trace_t *t);
size_t trace_dropped(const trace_t *t);

/* Collective over *(const MPI_Comm *)mpi_comm (normally MPI_COMM_WORLD;
 * pid in the file is the rank in it): every member calls it, with its
 * trace or NULL (a NULL rank contributes a row with no spans). Rank 0
 * estimates every rank's clock offset, gathers the spans and writes
 * `path` as Chrome trace JSON through a temporary file in the same
 * directory renamed into place, so a failure never leaves a partial file.
 * Returns 0, or -1 with the same one-line message in err on every rank.
 *
 * Clock alignment: ranks on rank 0's node (MPI_COMM_TYPE_SHARED) read the
 * same CLOCK_MONOTONIC and get offset 0 exactly. For every other rank,
 * rank 0 runs 16 ping-pongs (Cristian's method): it reads a = now, the
 * rank replies with its now, rank 0 reads b; offset = remote - (a + b)/2
 * from the round with the smallest b - a, whose error is at most
 * (b - a)/2. One estimate at write time; CLOCK_MONOTONIC is slewed by NTP,
 * so nodes drift apart only by their NTP error over the run. The offsets
 * and round-trip bounds are written in the file's otherData.
 * DTRAIN_TRACE_PINGPONG=1 forces the ping-pong for every rank (tests). */
int trace_write_merged(trace_t *t, const void *mpi_comm, const char *path, char *err, size_t errlen);

#endif
