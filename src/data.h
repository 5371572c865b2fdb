/* Sample order and batches. A sample is T+1 consecutive tokens of one shard
 * starting at a multiple of T (non-overlapping windows; the +1 is the last
 * target). Training samples are visited in a deterministic permutation per
 * (seed, epoch); a fixed rule maps global sample index to
 * (step, microbatch, data-parallel rank, row):
 *
 *   g = step * GB + (micro * DP + dp_rank) * B + row,   GB = B * accum * DP
 *
 * so every layout trains on the same global batches. Validation samples are
 * taken in file order from the start. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokens.h"

typedef struct data_loader {
    token_set_t set;
    int T;
    int shuffle;
    uint64_t seed;
    size_t n_samples;
    size_t *shard_first; /* [n_shards+1] first sample index of each shard */
    uint64_t *perm;      /* [n_samples] permutation of the current epoch */
    int64_t perm_epoch;  /* epoch perm holds, -1 = none */
} data_loader_t;

int data_open(data_loader_t *d, const char *pattern, tokens_format_t fmt, int vocab_size, int T,
              int shuffle, uint64_t seed, char *err, size_t errlen);
void data_close(data_loader_t *d);

/* Tokens and targets ([T] each) of global sample g. */
void data_sample(data_loader_t *d, uint64_t g, int32_t *tok, int32_t *tgt);

/* One microbatch ([B*T] tokens and targets) by the rule above. */
void data_batch(data_loader_t *d, int64_t step, int micro, int accum, int dp_rank, int dp_size,
                int B, int32_t *tok, int32_t *tgt);

#endif
