/* Training on a Megatron-LM indexed dataset (io/megatron.h): the .idx as
 * parsed there and the .bin memory-mapped, with the token access the data
 * loader needs. Nothing is copied or cached at open: opening costs the
 * index's validation (one pass over its N sequences), so thousands of
 * files open in well under a second.
 *
 * The dataset is read as the concatenation of its sequences (the .bin in
 * file order, which is the documents in order). Document boundaries are
 * the index's documents (document_indices), not its sequences: Megatron's
 * preprocessing may split one document into several sentence sequences,
 * and those belong together.
 *
 * Functions return 0 or -1 with one line in err naming the file, the
 * problem and the fix; they never print or exit. */
#ifndef DTRAIN_MEGATRON_DATA_H
#define DTRAIN_MEGATRON_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "io/megatron.h"

typedef struct megatron_data {
    megatron_idx_t idx;
    const unsigned char *bin; /* mmap of PREFIX.bin, NULL when it is empty */
    size_t bin_len;
} megatron_data_t;

/* Open PREFIX (or PREFIX.idx / PREFIX.bin) for training a model of
 * vocab_size ids: the index is validated, the .bin mapped. Refused: a
 * multimodal index (modes array), a float dtype (not token ids) and an
 * integer dtype whose range cannot hold ids up to vocab_size - 1. The ids
 * themselves are checked by megatron_data_check_vocab. */
int megatron_data_open(megatron_data_t *m, const char *prefix, int vocab_size, char *err, size_t errlen);
void megatron_data_close(megatron_data_t *m);

/* Number of tokens (the concatenation of every sequence). */
uint64_t megatron_data_n_tokens(const megatron_data_t *m);

/* Tokens [off, off + n) of the concatenation as int32 (off + n <= the
 * number of tokens; not checked). */
void megatron_data_tokens(const megatron_data_t *m, uint64_t off, size_t n, int32_t *out);

/* Every token in [begin, end) is in 0 .. vocab_size - 1: else -1 naming
 * the file, the first bad token's index and value. Reads those tokens
 * (the page cache's cost of the bytes once). */
int megatron_data_check_vocab(const megatron_data_t *m, uint64_t begin, uint64_t end, int vocab_size, char *err,
                              size_t errlen);

/* Document positions (src/model/docmask.h) of tokens [off, off + n): 0 at the
 * first and at each token where an index document begins, counting up by
 * one otherwise. O(log documents + documents in the range). */
void megatron_data_positions(const megatron_data_t *m, uint64_t off, size_t n, int32_t *pos);

/* Hint the kernel to read the bytes of tokens [off, off + n) ahead
 * (madvise WILLNEED): the loader's read-ahead for the next microbatch. */
void megatron_data_prefetch(const megatron_data_t *m, uint64_t off, size_t n);

#endif
