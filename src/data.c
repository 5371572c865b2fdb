#include "src/data.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "src/rng.h"

/* Separates the permutation streams from the initialisation streams
 * (which are keyed by tensor-name hashes). */
#define DATA_STREAM 0x64617461ull /* "data" */

int data_open(data_loader_t *d, const char *pattern, tokens_format_t fmt, int vocab_size, int T,
              int shuffle, uint64_t seed, char *err, size_t errlen)
{
    memset(d, 0, sizeof *d);
    d->T = T;
    d->shuffle = shuffle;
    d->seed = seed;
    d->perm_epoch = -1;
    if (tokens_open(&d->set, pattern, fmt, vocab_size, err, errlen) != 0)
        return -1;
    d->shard_first = calloc((size_t)d->set.n_shards + 1, sizeof *d->shard_first);
    if (!d->shard_first) {
        snprintf(err, errlen, "out of memory indexing %s", pattern);
        data_close(d);
        return -1;
    }
    for (int s = 0; s < d->set.n_shards; s++) {
        size_t n = d->set.shard[s].n;
        d->shard_first[s + 1] = d->shard_first[s] + (n > 0 ? (n - 1) / (size_t)T : 0);
    }
    d->n_samples = d->shard_first[d->set.n_shards];
    if (d->n_samples == 0) {
        snprintf(err, errlen, "%s: %zu tokens hold no sample of --seq-len %d + 1 tokens; use more data or a shorter --seq-len",
                 pattern, d->set.n_tokens, T);
        data_close(d);
        return -1;
    }
    if (shuffle) {
        d->perm = malloc(d->n_samples * sizeof *d->perm);
        if (!d->perm) {
            snprintf(err, errlen, "out of memory for the sample permutation of %s", pattern);
            data_close(d);
            return -1;
        }
    }
    return 0;
}

void data_close(data_loader_t *d)
{
    tokens_close(&d->set);
    free(d->shard_first);
    free(d->perm);
    memset(d, 0, sizeof *d);
}

/* Fisher-Yates with draws keyed by (seed, epoch, position): the same
 * permutation on every rank and every rerun. */
static void make_permutation(data_loader_t *d, int64_t epoch)
{
    size_t n = d->n_samples;
    for (size_t i = 0; i < n; i++)
        d->perm[i] = i;
    uint64_t stream = DATA_STREAM ^ rng_mix64((uint64_t)epoch);
    for (size_t i = n - 1; i > 0; i--) {
        size_t j = (size_t)(rng_bits(d->seed, stream, i) % (uint64_t)(i + 1));
        uint64_t t = d->perm[i];
        d->perm[i] = d->perm[j];
        d->perm[j] = t;
    }
    d->perm_epoch = epoch;
}

void data_sample(data_loader_t *d, uint64_t g, int32_t *tok, int32_t *tgt)
{
    int64_t epoch = (int64_t)(g / d->n_samples);
    uint64_t k = g % d->n_samples;
    if (d->shuffle) {
        if (epoch != d->perm_epoch)
            make_permutation(d, epoch);
        k = d->perm[k];
    }
    int s = 0;
    while (k >= d->shard_first[s + 1]) /* few shards: a scan is fine */
        s++;
    const int32_t *src = d->set.shard[s].tok + (k - d->shard_first[s]) * (size_t)d->T;
    memcpy(tok, src, (size_t)d->T * sizeof *tok);
    memcpy(tgt, src + 1, (size_t)d->T * sizeof *tgt);
}

void data_batch(data_loader_t *d, int64_t step, int micro, int accum, int dp_rank, int dp_size,
                int B, int32_t *tok, int32_t *tgt)
{
    uint64_t gb = (uint64_t)B * (uint64_t)accum * (uint64_t)dp_size;
    uint64_t first = (uint64_t)step * gb + ((uint64_t)micro * (uint64_t)dp_size + (uint64_t)dp_rank) * (uint64_t)B;
    for (int b = 0; b < B; b++)
        data_sample(d, first + (uint64_t)b, tok + (size_t)b * d->T, tgt + (size_t)b * d->T);
}
