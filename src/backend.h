/* The compute backend of a run: the one place src/ reaches cuda/.
 * --device cpu|cuda|auto picks the ops table; on CUDA each rank takes the
 * GPU of its local rank (local_rank % visible devices). */
#ifndef DTRAIN_BACKEND_H
#define DTRAIN_BACKEND_H

#include <stddef.h>
#include <stdio.h>

#include "ops.h"

typedef struct backend {
    const ops_t *ops;
    int cuda;        /* 1 when the CUDA backend is in use */
    int device;      /* CUDA device id, -1 on the CPU */
    char desc[320];  /* one line for the banner */
} backend_t;

/* 1 when this dtrain was built with the CUDA backend. */
int backend_have_cuda(void);

/* Resolves `device` ("auto", "cpu", "cuda") for the rank with this local
 * rank. auto = cuda when built with it and cudaGetDeviceCount finds a GPU,
 * else cpu. Returns 0, or -1 with one line in err (--device cuda without a
 * CUDA build, or without a usable GPU: the CUDA error string). Local. */
int backend_open(backend_t *b, const char *device, int local_rank, char *err, size_t errlen);
/* Releases the backend's resources (safe on a zeroed or failed one). */
void backend_close(backend_t *b);

/* --selftest: every CUDA op against the CPU op on this rank's GPU,
 * results on out. Returns the number of failed comparisons, or -1 with one
 * line in err (no CUDA build, no usable GPU, out of memory). */
int backend_selftest(int local_rank, FILE *out, char *err, size_t errlen);

#endif
