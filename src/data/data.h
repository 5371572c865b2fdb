/* Sample order and batches.
 *
 * A data set (--data, --val-data) is one dataset or a weighted blend of
 * several (src/data/blend.h). A dataset is a glob of llm.c shards, a raw-u16
 * file, or Megatron indexed datasets (a prefix, or a glob of .idx files);
 * its files are taken in bytewise path order.
 *
 * A sample is T+1 consecutive tokens of one file starting at a multiple of
 * T (non-overlapping windows; the +1 is the last target). For a Megatron
 * file the tokens are the concatenation of its documents (the .bin in
 * order), so a sample may span documents, as it does in llm.c shards: the
 * same tokens in either format give the same samples. A dataset's samples
 * are visited in a deterministic permutation per (seed, dataset, epoch);
 * when the blend has drawn all of a dataset's samples it starts its next
 * epoch with a new permutation (validation data: file order, no
 * permutation, and also wrapping around).
 *
 * Global sample g is the blend's sample g (src/data/blend.h: which dataset, and
 * that dataset's how-manyth sample), and a fixed rule maps g to (step,
 * microbatch, data-parallel rank, row):
 *
 *   g = step * GB + (micro * DP + dp_rank) * B + row,   GB = B * accum * DP
 *
 * so every layout trains on the same global batches, and a resumed run on
 * the same ones as an uninterrupted run.
 *
 * Document positions (--doc-mask, src/model/docmask.h): a Megatron dataset's
 * documents come from its index (document_indices: documents, not
 * sentence sequences); other datasets' from the doc_start / doc_end
 * tokens given by data_set_doc_tokens. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "io/megatron_data.h"
#include "io/tokens.h"

typedef struct data_part {
    char *path;
    tokens_format_t fmt;
    token_set_t set;     /* llmc, raw-u16: the shards, read whole */
    megatron_data_t *mm; /* megatron: [n_files] mapped datasets */
    int n_files;
    size_t *file_first; /* [n_files+1] first sample index of each file */
    size_t n_samples, n_tokens;
    uint64_t *perm;     /* [n_samples] permutation of the current epoch */
    int64_t perm_epoch; /* epoch perm holds, -1 = none */
} data_part_t;

/* The blend's position: the samples of each dataset among the first g. */
typedef struct data_cursor {
    uint64_t g;
    uint64_t *count; /* [n_parts] */
} data_cursor_t;

typedef struct data_loader {
    int T;
    int shuffle;
    uint64_t seed;
    int n_parts;
    data_part_t *part;
    double *weight; /* [n_parts], sum 1 */
    data_cursor_t cur, mark;
    size_t n_samples, n_tokens; /* over all datasets */
    int32_t doc_start, doc_end; /* document tokens of non-Megatron data, -1 = none */
    int mapped;                 /* some dataset is Megatron (memory-mapped): read ahead */
    int dump_fd;                /* DTRAIN_TEST_DUMP_SAMPLES (tests only), -1 = off */
} data_loader_t;

/* Open / close one dataset (src/data/data_part.c). */
int data_part_open(data_part_t *p, const char *path, tokens_format_t fmt, int vocab_size, int T, char *err,
                   size_t errlen);
void data_part_close(data_part_t *p);
/* Tokens, targets and (pos != NULL) positions ([T] each) of the part's sample k. */
void data_part_window(const data_part_t *p, int T, uint64_t k, int32_t *tok, int32_t *tgt, int32_t *pos,
                      int32_t doc_start, int32_t doc_end);
/* Read-ahead hint for sample k. */
void data_part_prefetch(const data_part_t *p, int T, uint64_t k);

/* Open spec (one dataset or a blend; fmt: the format of paths without a
 * FORMAT: prefix). llm.c and raw-u16 files are read and every token
 * checked against vocab_size; Megatron files are mapped and their dtype
 * checked (data_check_vocab checks their tokens). */
int data_open(data_loader_t *d, const char *spec, tokens_format_t fmt, int vocab_size, int T, int shuffle,
              uint64_t seed, char *err, size_t errlen);
void data_close(data_loader_t *d);

/* Check that every token of the Megatron files is below vocab_size: rank
 * `share` of `shares` checks its 1/shares of each file (the callers agree
 * on the verdict), so the pass over the data is shared. */
int data_check_vocab(const data_loader_t *d, int vocab_size, int share, int shares, char *err, size_t errlen);

/* Boundary tokens for the positions of non-Megatron datasets. */
void data_set_doc_tokens(data_loader_t *d, int32_t doc_start, int32_t doc_end);

/* 1 when every dataset of spec is Megatron (its documents need no tokens);
 * 0 otherwise or when spec does not parse. No I/O. */
int data_spec_indexed(const char *spec, tokens_format_t fmt);

/* The path whose tokenizer sidecar describes spec (its first dataset's;
 * a Megatron prefix as PREFIX.idx) into out. */
void data_sidecar_path(const char *spec, tokens_format_t fmt, char *out, size_t outlen);

/* Tokens, targets and (pos != NULL) document positions ([T] each) of
 * global sample g. */
void data_sample(data_loader_t *d, uint64_t g, int32_t *tok, int32_t *tgt, int32_t *pos);

/* One microbatch ([B*T] tokens, targets, positions when pos != NULL) by
 * the rule above; then the next microbatch of this rank is read ahead. */
void data_batch(data_loader_t *d, int64_t step, int micro, int accum, int dp_rank, int dp_size, int B, int32_t *tok,
                int32_t *tgt, int32_t *pos);

/* count[i] = samples of dataset i among the blend's first n ([n_parts]). */
void data_counts(const data_loader_t *d, uint64_t n, uint64_t *count);

/* One line describing the data set (tokens, samples, datasets) into out. */
void data_describe(const data_loader_t *d, char *out, size_t outlen);

#endif
