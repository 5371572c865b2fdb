/* Memory categories and the accounting callback: what a lower layer needs
 * to have its allocations counted without reaching for the counters. The
 * counters themselves are the driver's (src/mem.c); mpi/'s ZeRO and DDP
 * buffers are counted through the mem_tracker_t their creator passes in. */
#ifndef DTRAIN_BASE_MEM_H
#define DTRAIN_BASE_MEM_H

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

#endif
