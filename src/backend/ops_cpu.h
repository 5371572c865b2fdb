/* The CPU backends of the ops table (base/ops.h): the CPU ops
 * (src/backend/ops_cpu.c) and the deferred table over another backend
 * (src/backend/ops_defer.c). Each constructor returns a table whose ctx holds the
 * backend's state; ops_release (base/ops.h) ends it. */
#ifndef DTRAIN_OPS_CPU_H
#define DTRAIN_OPS_CPU_H

#include "base/ops.h"

/* The CPU backend; NULL when out of memory. */
const ops_t *ops_cpu_create(void);
/* Sets the CPU backend's threads (its OpenMP kernels and OpenBLAS share
 * one pool, which is the process's, not a table's): requested > 0, or 0
 * to keep OMP_NUM_THREADS or all the cores this process may use. Returns
 * the threads in use. */
int ops_cpu_threads(int requested);

/* The deferred table over `base` (DTRAIN_DEFER_OPS=1): every op is queued
 * and runs only when the host waits (sync, to_host, sumsq, free), the most
 * asynchronous a GPU can be, so the CPU tests catch a missing wait as
 * wrong numbers. NULL when out of memory. Releasing it runs what is queued
 * and releases base too. */
const ops_t *ops_defer_create(const ops_t *base);
/* The graph table over `base` (--cuda-graphs; DTRAIN_DEFER_OPS=graphs
 * emulates it on the CPU): ops are queued as in the deferred table, and
 * the queue between two host waits (or flushes) is a segment, keyed by
 * its records' bytes (every op's run function, pointers and scalars).
 * A segment of at least 8 ops runs plainly the first time it is seen,
 * is captured into one of the base's graphs (graph_begin/graph_end) the
 * second, and is launched as that graph from then on; a graph captured
 * before the base's graph_epoch moved is dropped and the segment starts
 * over, and a capture that fails leaves the segment plain. Where the
 * base has no graphs (the CPU) the segment's stored records stand in for
 * the graph, and a launch runs them. The copies that cross the host
 * (from_host, the begin/end copies) and the grouped GEMMs, which stage
 * host memory when they run, issue the queue and run outside. NULL when
 * out of memory; releasing it releases base too when own_base is 1 (0:
 * the caller keeps base, as --selftest's graph case does). */
const ops_t *ops_graph_create(const ops_t *base, int own_base);
typedef struct ops_graph_counts {
    long segments;  /* queues issued */
    long captures;  /* graphs captured */
    long launches;  /* graphs launched */
    long graph_ops; /* ops run inside launched graphs */
    long plain_ops; /* ops run outside graphs */
    long stale;     /* graphs dropped because the workspace moved */
    long refused;   /* captures that failed */
} ops_graph_counts_t;
/* The counts of the graph table d so far. */
void ops_graph_counts(const ops_t *d, ops_graph_counts_t *c);
/* Issues what the deferred or graph table (its ctx) has queued, without
 * waiting: what a communicator calls before it orders itself after the
 * compute stream with an event (NCCL under --cuda-graphs). */
void ops_defer_flush(void *ctx);

/* Ops run, host waits (sync, to_host, sumsq, free) and cast_f32_to_bf16
 * calls (casts16, may be NULL) so far by the deferred table d. */
void ops_defer_counts(const ops_t *d, long *ops, long *waits, long *casts16);

#endif
