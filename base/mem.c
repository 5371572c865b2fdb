#include "base/mem.h"

#include <stdlib.h>
#include <string.h>

/* Per-process counters: part of the run context, not shared state between
 * runs (a process trains one model). */
static size_t mem_live[MEM_N_CATEGORIES];
static size_t mem_peak[MEM_N_CATEGORIES];
static size_t mem_live_total, mem_peak_total;

static const char *const mem_names[MEM_N_CATEGORIES] = {
    [MEM_PARAMS] = "parameters", [MEM_GRADS] = "gradients",    [MEM_OPTIM] = "optimizer",
    [MEM_ACTS] = "activations",  [MEM_COMM] = "communication", [MEM_WORKSPACE] = "workspace",
};

void mem_track(mem_category_t cat, long long delta)
{
    mem_live[cat] = (size_t)((long long)mem_live[cat] + delta);
    mem_live_total = (size_t)((long long)mem_live_total + delta);
    if (mem_live[cat] > mem_peak[cat])
        mem_peak[cat] = mem_live[cat];
    if (mem_live_total > mem_peak_total)
        mem_peak_total = mem_live_total;
}

static void track_cb(void *ctx, mem_category_t cat, long long delta)
{
    (void)ctx;
    mem_track(cat, delta);
}

mem_tracker_t mem_process_tracker(void) { return (mem_tracker_t){.track = track_cb, .ctx = NULL}; }

void *mem_alloc(mem_category_t cat, size_t bytes)
{
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        return NULL;
    memset(p, 0, rounded ? rounded : 64);
    mem_track(cat, (long long)bytes);
    return p;
}

void mem_free(mem_category_t cat, void *p, size_t bytes)
{
    if (!p)
        return;
    free(p);
    mem_track(cat, -(long long)bytes);
}

size_t mem_bytes(mem_category_t cat) { return mem_live[cat]; }
size_t mem_peak_bytes(mem_category_t cat) { return mem_peak[cat]; }
size_t mem_total_bytes(void) { return mem_live_total; }
size_t mem_total_peak_bytes(void) { return mem_peak_total; }
const char *mem_category_name(mem_category_t cat) { return mem_names[cat]; }
