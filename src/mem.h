/* The accounting allocator: every large allocation names its category, so
 * the banner and --metrics can report bytes per category and the peak. */
#ifndef DTRAIN_MEM_H
#define DTRAIN_MEM_H

#include <stddef.h>

#include "base/mem.h" /* mem_category_t, mem_tracker_t */

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
/* A tracker that counts into these counters, for the layers below that
 * take one (mpi/zero.h, mpi/ddp.h). */
mem_tracker_t mem_process_tracker(void);

#endif
