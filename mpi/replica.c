#include "mpi/replica.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* FNV-1a over the bytes: equal bits <=> equal hash (up to collisions) */
static uint64_t hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

status_t replica_check(comm_t *c, const float *buf, const size_t *tensor_start, int n_tensors, int *first_bad,
                       char *err, size_t errlen)
{
    *first_bad = -1;
    if (c->size == 1)
        return STATUS_OK;
    /* each 64-bit hash as four 16-bit pieces: floats represent them exactly,
     * and max(x) == -max(-x) on every piece iff all ranks agree */
    size_t n = (size_t)n_tensors * 4;
    float *hi = malloc(2 * n * sizeof *hi);
    if (!hi)
        return status_set(STATUS_FAIL, err, errlen, "out of memory in the replica check");
    float *lo = hi + n;
#pragma omp parallel for schedule(dynamic, 1)
    for (int t = 0; t < n_tensors; t++) {
        uint64_t h = hash_bytes(buf + tensor_start[t], (tensor_start[t + 1] - tensor_start[t]) * sizeof(float));
        for (int k = 0; k < 4; k++) {
            hi[4 * t + k] = (float)((h >> (16 * k)) & 0xffff);
            lo[4 * t + k] = -hi[4 * t + k];
        }
    }
    status_t rc = c->ops->allreduce(c, hi, 2 * n, COMM_FP32, COMM_MAX, err, errlen);
    if (rc == STATUS_OK) {
        for (int t = 0; t < n_tensors && *first_bad < 0; t++)
            for (int k = 0; k < 4; k++)
                if (hi[4 * t + k] != -lo[4 * t + k]) {
                    *first_bad = t;
                    break;
                }
    }
    free(hi);
    return rc;
}
