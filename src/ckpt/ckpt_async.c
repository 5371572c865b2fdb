#include "src/ckpt/ckpt_async.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <mpi.h>

#include "mpi/agree.h"
#include "mpi/clock.h"

struct ckpt_async {
    const ops_t *ops;
    comm_t *world; /* the main thread's: waits and polls agree over it */
    comm_t *wcomm; /* the writer's duplicate of world: only the writer uses it */
    float *buf[3]; /* params, m, v [numel], host */
    size_t numel;
    pthread_t thread;
    int running;     /* a write started and not yet collected (main thread only) */
    int threaded;    /* ... by the thread (else it ran in start) */
    atomic_int done; /* the writer's job finished: set by it, read by poll */
    /* the job's copies: pending from start until they are made (under
     * lock, signalled on copied); host copies go in chunks that the writer
     * and a main thread waiting for them claim (next_chunk) */
    pthread_mutex_t lock;
    pthread_cond_t copied;
    int copy_pending;
    size_t n_chunks;
    atomic_size_t next_chunk, chunks_done;
    long test_delay_ms; /* DTRAIN_TEST_CKPT_COPY_DELAY_MS: tests only (see create) */
    /* the job and its outcome: written by start before the thread starts,
     * by the writer before it sets done, read by the main thread after it
     * joined */
    ckpt_async_job_t job;
    char dir[4096];
    char path[4096 + 64];
    /* the writer thread's status and message: kept here because the
     * thread has no caller to return them to (wait and poll hand them on) */
    int rc;
    char err[AGREE_MSG_MAX];
    double seconds;
};

ckpt_async_t *ckpt_async_create(const ops_t *ops, comm_t *world, size_t numel, char *err, size_t errlen)
{
    ckpt_async_t *a = calloc(1, sizeof *a);
    MPI_Comm mc;
    if (!a || comm_mpi_handle(world, &mc) != 0) {
        snprintf(err, errlen, "--ckpt-async: %s", a ? "the world communicator is not an MPI one" : "out of memory");
        free(a);
        return NULL;
    }
    a->ops = ops;
    a->world = world;
    a->numel = numel;
    atomic_init(&a->done, 0);
    atomic_init(&a->next_chunk, 0);
    atomic_init(&a->chunks_done, 0);
    pthread_mutex_init(&a->lock, NULL);
    pthread_cond_init(&a->copied, NULL);
    /* a test-only delay before the writer's copies, so that a test sees
     * the copy lag the next step's update (test_ckpt_overlap.sh) */
    const char *delay = getenv("DTRAIN_TEST_CKPT_COPY_DELAY_MS");
    a->test_delay_ms = delay ? strtol(delay, NULL, 10) : 0;
    /* MPI_Comm_dup: collective over world, so every rank reaches it */
    a->wcomm = comm_mpi_create(&mc);
    if (a->wcomm)
        snprintf(a->wcomm->name, sizeof a->wcomm->name, "ckpt");
    const size_t bytes = numel * sizeof(float) + 1;
    for (int i = 0; i < 3; i++) {
        a->buf[i] = ops_host_alloc(ops, bytes);
        if (a->buf[i])
            memset(a->buf[i], 0, bytes); /* the pages, now rather than in the first stall */
    }
    if (!a->wcomm || !a->buf[0] || !a->buf[1] || !a->buf[2]) {
        snprintf(err, errlen, "--ckpt-async: %s",
                 a->wcomm ? "out of host memory for the checkpoint copies" : "cannot duplicate the world communicator");
        ckpt_async_destroy(a);
        return NULL;
    }
    return a;
}

float *ckpt_async_buffer(ckpt_async_t *a, int i) { return i >= 0 && i < 3 ? a->buf[i] : NULL; }

/* Host copies go in chunks of 16 MiB (a few ms each): a main thread that
 * reaches its wait before the writer has made them all makes the rest with
 * it, so the wait is never longer than the copy at the boundary was. */
#define COPY_CHUNK ((size_t)4 << 20) /* floats */

static size_t chunks_of(size_t n) { return (n + COPY_CHUNK - 1) / COPY_CHUNK; }

/* Chunk c of the job's copies, counted over the copies in order. */
static void copy_chunk(ckpt_async_t *a, size_t c)
{
    const ckpt_async_copy_t *cp = a->job.copy;
    while (c >= chunks_of(cp->n)) {
        c -= chunks_of(cp->n);
        cp++;
    }
    const size_t off = c * COPY_CHUNK, n = cp->n - off < COPY_CHUNK ? cp->n - off : COPY_CHUNK;
    memcpy(a->buf[cp->buf] + cp->off + off, cp->src + off, n * sizeof(float));
}

/* Claims and makes chunks until none is left to claim; the thread that
 * finishes the last one signals copied. Called by the writer and by a
 * waiting main thread. */
static void copy_chunks(ckpt_async_t *a)
{
    for (;;) {
        const size_t c = atomic_fetch_add(&a->next_chunk, 1);
        if (c >= a->n_chunks)
            return;
        copy_chunk(a, c);
        if (atomic_fetch_add(&a->chunks_done, 1) + 1 == a->n_chunks) {
            pthread_mutex_lock(&a->lock);
            a->copy_pending = 0;
            pthread_cond_broadcast(&a->copied);
            pthread_mutex_unlock(&a->lock);
        }
    }
}

/* The writer's first part: the job's copies of the live state into the
 * host buffers, then the main thread may change that state again; with
 * device copies, the wait for the main thread to have ended them. */
static void writer_copy(ckpt_async_t *a)
{
    const ckpt_async_job_t *j = &a->job;
    if (!j->device_copy && a->test_delay_ms > 0) {
        const struct timespec ts = {a->test_delay_ms / 1000, (a->test_delay_ms % 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
    if (!j->device_copy)
        copy_chunks(a);
    /* the main thread may still be making a chunk, or ending device copies */
    pthread_mutex_lock(&a->lock);
    while (a->copy_pending)
        pthread_cond_wait(&a->copied, &a->lock);
    pthread_mutex_unlock(&a->lock);
}

/* The writer: the copies, then ckpt_save over the duplicate communicator.
 * Its agreements make rc and err the same on every rank. */
static void *writer_main(void *arg)
{
    ckpt_async_t *a = arg;
    const ckpt_async_job_t *j = &a->job;
    const double t0 = now_s();
    writer_copy(a);
    a->rc = ckpt_save(a->wcomm, j->dir, j->keep, j->cfg, j->t, a->buf[0], a->buf[1], a->buf[2], j->writer, j->tp_size,
                      j->tp_rank, &j->meta, a->path, sizeof a->path, a->err, sizeof a->err);
    a->seconds = now_s() - t0;
    atomic_store_explicit(&a->done, 1, memory_order_release);
    return NULL;
}

/* The job's copies stay inside the host buffers. */
static int copies_fit(const ckpt_async_t *a, const ckpt_async_job_t *job)
{
    if (job->n_copy < 0 || job->n_copy > CKPT_ASYNC_COPIES)
        return 0;
    for (int i = 0; i < job->n_copy; i++)
        if (job->copy[i].buf < 0 || job->copy[i].buf > 2 || job->copy[i].off > a->numel ||
            job->copy[i].n > a->numel - job->copy[i].off)
            return 0;
    return 1;
}

int ckpt_async_start(ckpt_async_t *a, const ckpt_async_job_t *job, char *err, size_t errlen)
{
    if (a->running) {
        snprintf(err, errlen, "checkpoint of step %d: the one of step %d is still being written", job->meta.step,
                 a->job.meta.step);
        return -1;
    }
    a->job = *job;
    snprintf(a->dir, sizeof a->dir, "%s", job->dir);
    a->job.dir = a->dir;
    a->rc = 0;
    a->err[0] = '\0';
    if (!copies_fit(a, job)) {
        snprintf(err, errlen, "checkpoint of step %d: a copy lies outside the host buffers", job->meta.step);
        return -1;
    }
    atomic_store_explicit(&a->done, 0, memory_order_relaxed);
    a->n_chunks = 0;
    for (int i = 0; i < job->n_copy; i++)
        a->n_chunks += chunks_of(job->copy[i].n);
    atomic_store(&a->next_chunk, 0);
    atomic_store(&a->chunks_done, 0);
    a->copy_pending = a->n_chunks > 0 || job->device_copy; /* no thread runs yet: no lock needed */
    a->running = 1;
    /* the writers of all ranks meet in the same collectives: a rank whose
     * thread cannot start writes in this thread instead (its device copies
     * ended first), so the others' are not left waiting for it (a slower
     * stall, the same file) */
    a->threaded = pthread_create(&a->thread, NULL, writer_main, a) == 0;
    if (!a->threaded) {
        if (job->device_copy)
            (void)ckpt_async_copied(a);
        writer_main(a);
    }
    return 0;
}

int ckpt_async_wait(ckpt_async_t *a, char *err, size_t errlen)
{
    if (!a || !a->running)
        return 0;
    int rc = 0;
    (void)ckpt_async_copied(a); /* device copies: the writer waits for their end */
    if (a->threaded && pthread_join(a->thread, NULL) != 0) {
        snprintf(err, errlen, "checkpoint of step %d: pthread_join of the writer failed", a->job.meta.step);
        rc = -1;
    }
    a->running = 0;
    if (rc == 0 && a->rc != 0) {
        snprintf(err, errlen, "%s", a->err);
        rc = -1;
    }
    rc = agree(a->world, rc, err, errlen);
    if (rc == 0 && a->world->rank == 0) {
        printf("checkpoint: %s (step %d) written in the background in %.2f s\n", a->path, a->job.meta.step, a->seconds);
        fflush(stdout);
    }
    return rc;
}

int ckpt_async_poll(ckpt_async_t *a, char *err, size_t errlen)
{
    if (!a || !a->running)
        return 0;
    int32_t done = atomic_load_explicit(&a->done, memory_order_acquire);
    char cerr[COMM_ERR_MAX];
    if (a->world->size > 1 &&
        a->world->ops->allreduce(a->world, &done, 1, COMM_INT32, COMM_MIN, cerr, sizeof cerr) != STATUS_OK) {
        snprintf(err, errlen, "checkpoint of step %d: the all-reduce of the writers' progress failed: %s",
                 a->job.meta.step, cerr);
        return -1;
    }
    return done ? ckpt_async_wait(a, err, errlen) : 0;
}

int ckpt_async_busy(const ckpt_async_t *a) { return a && a->running; }

double ckpt_async_copied(ckpt_async_t *a)
{
    if (!a || !a->running)
        return 0.0;
    const double t0 = now_s();
    if (!a->job.device_copy)
        copy_chunks(a); /* what the writer has not claimed yet */
    pthread_mutex_lock(&a->lock);
    if (a->copy_pending && a->job.device_copy) {
        /* only this thread ends them; the writer waits for the signal */
        pthread_mutex_unlock(&a->lock);
        a->ops->to_host_end(a->ops->ctx);
        pthread_mutex_lock(&a->lock);
        a->copy_pending = 0;
        pthread_cond_broadcast(&a->copied);
    }
    while (a->copy_pending)
        pthread_cond_wait(&a->copied, &a->lock);
    pthread_mutex_unlock(&a->lock);
    return now_s() - t0;
}

void ckpt_async_destroy(ckpt_async_t *a)
{
    if (!a)
        return;
    if (a->running && a->threaded) {
        (void)ckpt_async_copied(a);
        (void)pthread_join(a->thread, NULL);
    }
    for (int i = 0; i < 3; i++)
        if (a->buf[i])
            ops_host_free(a->ops, a->buf[i]);
    if (a->wcomm)
        a->wcomm->ops->destroy(a->wcomm);
    pthread_cond_destroy(&a->copied);
    pthread_mutex_destroy(&a->lock);
    free(a);
}
