/* Multiple-choice evaluation files (--eval-mc): llm.c's eval format
 * (dev/data/data_common.py write_evalfile, read by llmc/dataloader.h's
 * EvalLoader), and a 32-bit variant for vocabularies above 65,535.
 *
 * Header: 256 little-endian int32
 *   [0] 20240522 (magic), [1] version, [2] examples, [3] the longest
 *   example's bytes, rest 0
 * then the examples, each a run of words (version 1: uint16, llm.c's;
 * version 2: uint32, dtrain's):
 *   START (all ones: 65535 / 4294967295), EXAMPLE_BYTES (the example's
 *   words x the word size, START and this field included), EXAMPLE_INDEX,
 *   LABEL (the correct completion, 0-based), NUM_COMPLETIONS,
 *   CTX_LEN and CTX_LEN context tokens,
 *   NUM_COMPLETIONS x (LEN and LEN completion tokens).
 * llm.c writes exactly 4 completions; this reader takes 2 to
 * EVALMC_MAX_COMPLETIONS (ARC has 3-5, PIQA 2).
 *
 * Readers return 0 or -1 with one line in err naming the file, the
 * example and the problem; they never print or exit. */
#ifndef DTRAIN_EVALMC_H
#define DTRAIN_EVALMC_H

#include <stddef.h>
#include <stdint.h>

#define EVALMC_MAGIC 20240522
#define EVALMC_VERSION_U16 1
#define EVALMC_VERSION_U32 2
#define EVALMC_HEADER_INTS 256
#define EVALMC_MAX_COMPLETIONS 32

/* One example; the token pointers point into its file's token array. */
typedef struct evalmc_example {
    int index, label, n_comp;
    int ctx_len;
    const int32_t *ctx;
    int comp_len[EVALMC_MAX_COMPLETIONS];
    const int32_t *comp[EVALMC_MAX_COMPLETIONS];
} evalmc_example_t;

typedef struct evalmc_file {
    int version, n;
    evalmc_example_t *ex; /* [n] */
    int32_t *tokens;      /* every context and completion token, widened */
    int max_token;        /* the largest token id (-1: none) */
} evalmc_file_t;

/* Reads and checks the whole file at path. */
int evalmc_load(evalmc_file_t *f, const char *path, char *err, size_t errlen);

/* The same from bytes in memory (the fuzzer's entry; name only labels
 * messages). */
int evalmc_parse(evalmc_file_t *f, const unsigned char *buf, size_t len, const char *name, char *err, size_t errlen);

void evalmc_free(evalmc_file_t *f);

/* Writes ex[0..n-1] to path as version (EVALMC_VERSION_U16 or _U32; the
 * examples are numbered 0..n-1 in the file), through a temporary file
 * renamed into place: the file is complete or absent. */
int evalmc_write(const char *path, const evalmc_example_t *ex, int n, int version, char *err, size_t errlen);

#endif
