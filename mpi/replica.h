/* Replica consistency: do all members of a group hold bit-identical copies
 * of a flat buffer? Each tensor is hashed locally and the hashes compared
 * with two allreduces (max and min) of 8 floats per tensor, so the check
 * costs one pass over the buffer and O(tensors) communication. */
#ifndef DTRAIN_REPLICA_H
#define DTRAIN_REPLICA_H

#include <stddef.h>

#include "mpi/comm.h"

/* buf: host memory (the hashes are host loops; a backend's buffer is
 * copied out first). tensor_start: [n_tensors+1] ascending offsets into
 * buf. Returns STATUS_OK with *first_bad = -1 when all replicas agree, or
 * the lowest tensor index that differs (the same on every rank); a failed
 * status (a communication error, out of memory) with its message in err.
 * Collective over c. */
status_t replica_check(comm_t *c, const float *buf, const size_t *tensor_start, int n_tensors, int *first_bad,
                       char *err, size_t errlen);

#endif
