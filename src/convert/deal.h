/* Dealing pieces of work out to ranks by size: largest first, each to the
 * rank with the least so far (ties: the lower rank; equal sizes keep list
 * order). A pure function of its arguments, so every rank computes the same
 * deal without communicating. Used by dreshard for the slices of a
 * resharding and the tiles of an export. */
#ifndef DTRAIN_DEAL_H
#define DTRAIN_DEAL_H

#include <stdint.h>

/* owner[i] in [0, nranks) for the n pieces of bytes[i]. Returns 0, or -1
 * when out of memory. */
int deal_by_size(const int64_t *bytes, int n, int nranks, int *owner);

#endif
