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
/* Ops run, host waits (sync, to_host, sumsq, free) and cast_f32_to_bf16
 * calls (casts16, may be NULL) so far by the deferred table d. */
void ops_defer_counts(const ops_t *d, long *ops, long *waits, long *casts16);

#endif
