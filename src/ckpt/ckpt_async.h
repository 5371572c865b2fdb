/* Asynchronous checkpoints (--ckpt-async): training stalls only for the
 * copy of its state into host memory this module owns; a background
 * thread then writes the same file ckpt_save writes (same atomic protocol,
 * same checksums, `latest` and --keep's removals after the file is
 * complete) while training goes on.
 *
 *   a = ckpt_async_create(ops, world, numel)       setup, collective
 *   per checkpoint:
 *     ckpt_async_wait(a)                           the previous write, if any
 *     fill ckpt_async_buffer(a, 0..2)              params, m, v [numel]
 *       (or name the live state in job.copy: the writer copies it)
 *     ckpt_async_start(a, job)                     returns at once
 *   before anything writes what job.copy names (or, with device_copy,
 *   the sources of the copies begun with ops->to_host_begin):
 *                                                ckpt_async_copied(a)
 *   per step boundary: ckpt_async_poll(a)          collects a finished write
 *   at a stop, the end, before any other HDF5 use: ckpt_async_wait(a)
 *   ckpt_async_destroy(a)                          joins a write in flight
 *
 * Threads: the writer makes MPI calls (parallel HDF5 over MPI-IO, the
 * agreements of ckpt_save) on a duplicate of world of its own, never
 * touched by the main thread, so the process needs MPI_THREAD_MULTIPLE.
 * HDF5 (Debian's libhdf5-openmpi is not built thread-safe) is called by
 * one thread at a time: while a write is in flight the main thread makes no
 * HDF5 call; everything that would (the next checkpoint, --save-params, a
 * resume) waits first. The writer reads the host buffers, which the main
 * thread does not touch until the write is collected, and, until
 * ckpt_async_copied returns, the host memory job.copy names (the live
 * parameters and moments, which the next step's forward and backward only
 * read: the trainer waits before its optimizer update).
 *
 * Errors: a failed write is reported at the next wait or poll, on every
 * rank alike (agreed over world), as ckpt_save's one line. */
#ifndef DTRAIN_CKPT_ASYNC_H
#define DTRAIN_CKPT_ASYNC_H

#include <stddef.h>

#include "base/ops.h"
#include "mpi/comm.h"
#include "src/ckpt/ckpt.h"
#include "src/model/model_config.h"
#include "src/model/params.h"

typedef struct ckpt_async ckpt_async_t;

/* One copy the writer makes before it writes: n floats of host memory
 * src into host buffer buf (0..2, as ckpt_async_buffer) at float offset
 * off. */
typedef struct ckpt_async_copy {
    int buf;
    size_t off, n;
    const float *src;
} ckpt_async_copy_t;

#define CKPT_ASYNC_COPIES 8

/* What ckpt_save needs besides the buffers (see ckpt.h). cfg, t and the
 * meta's tokenizer strings must outlive the write. copy[0..n_copy): what
 * the writer copies into the buffers first (n_copy 0: the caller filled
 * them); their sources stay unchanged until ckpt_async_copied returns.
 * device_copy: the caller began copies into the buffers with the ops'
 * to_host_begin; ckpt_async_copied (on the caller's thread: it alone uses
 * the backend) ends them with to_host_end, and only then does the writer
 * read the buffers. */
typedef struct ckpt_async_job {
    const char *dir; /* copied */
    int keep;
    const model_config_t *cfg;
    const param_table_t *t;
    int writer, tp_size, tp_rank;
    ckpt_meta_t meta;
    ckpt_async_copy_t copy[CKPT_ASYNC_COPIES];
    int n_copy;
    int device_copy;
} ckpt_async_job_t;

/* Collective over world (an MPI communicator: its duplicate becomes the
 * writer's). Three host buffers of numel floats, pinned where ops has
 * host_alloc, touched once so the first checkpoint's copy does not pay
 * the page faults. NULL with one line in err, on the failing rank; the
 * caller agrees. */
ckpt_async_t *ckpt_async_create(const ops_t *ops, comm_t *world, size_t numel, char *err, size_t errlen);

/* Host buffer i (0 params, 1 AdamW m, 2 AdamW v), [numel]. Only between a
 * wait (or create) and the next start. */
float *ckpt_async_buffer(ckpt_async_t *a, int i);

/* Starts the write of the buffers as job describes (the copies first). A
 * write must not be in flight (wait first). Not collective, but every rank
 * starts alike. Returns 0, or -1 (a copy outside the buffers) with one line
 * in err; the caller agrees. */
int ckpt_async_start(ckpt_async_t *a, const ckpt_async_job_t *job, char *err, size_t errlen);

/* Collective over world: when a write is in flight, waits for it, and
 * agrees on its status. World rank 0 prints
 *   checkpoint: DIR/step_N.h5 (step N) written in the background in X s
 * Returns 0, or -1 with the write's one line in err on every rank. Nothing
 * in flight: 0 at once, without communication. */
int ckpt_async_wait(ckpt_async_t *a, char *err, size_t errlen);

/* Collective over world, at a step boundary: when a write is in flight
 * and has finished on every rank (one all-reduce of a flag), collects it
 * as ckpt_async_wait does; otherwise returns at once. 0, or -1 as wait. */
int ckpt_async_poll(ckpt_async_t *a, char *err, size_t errlen);

/* 1 while a write started and not yet collected by wait or poll. */
int ckpt_async_busy(const ckpt_async_t *a);

/* Returns once the copies of the write in flight are made (the chunks of
 * them the writer has not claimed yet this thread makes itself), or
 * (device_copy) once ops->to_host_end says the device copies are done (at
 * once when none is in flight or it had none): the caller may then change
 * their sources. Seconds it waited or copied. Not collective; the thread that uses
 * the backend calls it (wait and destroy call it too). The environment's
 * DTRAIN_TEST_CKPT_COPY_DELAY_MS (tests only) delays the copies, so that
 * a test can tell a missing wait from a fast copy. */
double ckpt_async_copied(ckpt_async_t *a);

/* Waits for a write in flight (its status dropped: the caller is already
 * failing or has waited), frees everything. NULL is fine. */
void ckpt_async_destroy(ckpt_async_t *a);

#endif
