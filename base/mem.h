/* Memory accounting: the categories, the process's counters and the
 * accounting allocator (base/mem.c), so the banner and --metrics can report
 * bytes per category and the peak. The layers below src/ do not call the
 * counters: mpi/'s ZeRO and DDP buffers are counted through the
 * mem_tracker_t their creator passes in (mem_process_tracker()). */
#ifndef DTRAIN_BASE_MEM_H
#define DTRAIN_BASE_MEM_H

#include <stddef.h>

typedef enum {
    MEM_PARAMS = 0,
    MEM_GRADS,
    MEM_OPTIM,
    MEM_ACTS,
    MEM_COMM,
    MEM_WORKSPACE,
    MEM_N_CATEGORIES
} mem_category_t;

/* Records bytes allocated (delta > 0) or freed (delta < 0) in cat. */
typedef struct mem_tracker {
    void (*track)(void *ctx, mem_category_t cat, long long delta);
    void *ctx;
} mem_tracker_t;

/* Counts through t; a NULL t (or one without track) counts nothing. */
static inline void mem_tracker_count(const mem_tracker_t *t, mem_category_t cat, long long delta)
{
    if (t && t->track)
        t->track(t->ctx, cat, delta);
}

/* Records bytes allocated (delta > 0) or freed (delta < 0) elsewhere, e.g.
 * by a backend's own allocator. */
void mem_track(mem_category_t cat, long long delta);
/* 64-byte aligned, zero-filled; NULL on failure. */
void *mem_alloc(mem_category_t cat, size_t bytes);
void mem_free(mem_category_t cat, void *p, size_t bytes);
size_t mem_bytes(mem_category_t cat);      /* live now */
size_t mem_peak_bytes(mem_category_t cat); /* high-water mark */
size_t mem_total_bytes(void);
size_t mem_total_peak_bytes(void);
const char *mem_category_name(mem_category_t cat);
/* A tracker that counts into these counters, for the layers that take one
 * (mpi/zero.h, mpi/ddp.h). */
mem_tracker_t mem_process_tracker(void);

#endif
