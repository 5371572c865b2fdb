/* Hardware profiles for the planner: what one device (one rank) can hold
 * and do, and how fast the links between devices are. Built in: h100-sxm,
 * a100-80g, cpu (this machine); or a file of `key = value` lines (keys as
 * in hw_profile_t, units as suffixes: 80GiB, 450GB, 989e12). */
#ifndef DTRAIN_HW_H
#define DTRAIN_HW_H

#include <stddef.h>

typedef struct hw_profile {
    char name[64];
    double memory;     /* bytes of device memory per rank */
    double reserve;    /* bytes the runtime keeps (CUDA context, NCCL and
                             cuBLAS buffers, allocator fragmentation) */
    double peak_fp32;  /* dense FLOP/s per device at fp32 */
    double peak_bf16;  /* dense FLOP/s per device at bf16 (no 2:4 sparsity) */
    double efficiency; /* achievable fraction of peak in the model's kernels */
    double mem_bw;     /* device memory bytes/s (the optimizer's streaming) */
    double intra_bw;   /* achievable bus bandwidth inside a node, bytes/s per rank */
    double inter_bw;   /* achievable bus bandwidth between nodes, bytes/s per rank */
    double latency;    /* seconds per collective or message, added to each */
    int gpus_per_node; /* ranks per node */
    /* --offload optimizer (0: unknown, the planner says so) */
    double host_memory; /* bytes of host memory per node */
    double host_bw;     /* host memory bytes/s per node, STREAM-triad-like, shared by its ranks */
    double h2d_bw;      /* host-device copy bytes/s per rank, each direction */
    /* --dtype bf16's tensor-core attention (head sizes 64 and 128): the
     * FLOP/s its forward and backward together achieve (FlashAttention's
     * FLOP count, 3.5 x the forward's), an achieved rate, not a peak; 0:
     * none, attention at the fp32 peak times efficiency */
    double att_bf16;
} hw_profile_t;

/* Fills p from a built-in name or a profile file. peak_gflops > 0
 * overrides the cpu profile's peaks (otherwise measured with the sgemm
 * probe on this process's threads); mem_gib > 0 overrides the memory.
 * Returns 0, or -1 with one line in err. */
int hw_profile_load(hw_profile_t *p, const char *name_or_file, double peak_gflops, double mem_gib, char *err,
                    size_t errlen);

/* "h100-sxm|a100-80g|cpu" */
const char *hw_builtin_names(void);

#endif
