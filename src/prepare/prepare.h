/* dtrain-prepare: text corpora -> token files, on any number of MPI ranks.
 *
 *   src/dtrain_prepare.c  options (resolved once into prep_opts_t) and main
 *   prepare_docs.c  the document loop: ranks deal the documents, tokenize
 *                   their own, agree on errors, place every document
 *   prepare_out.c   the outputs: one token stream per split written with
 *                   MPI-IO at global offsets, then cut into balanced llm.c
 *                   shards or indexed as a Megatron .bin/.idx pair
 *   prepare_mc.c    --eval-mc: a JSONL of multiple-choice examples to one
 *                   eval file (io/evalmc.h), on rank 0
 *
 * The output depends only on the global document order, never on the
 * number of ranks: document d goes to validation when
 * floor((d+1) F) > floor(d F), and its tokens land at the running total of
 * the tokens of documents 0..d-1 of its split. */
#ifndef DTRAIN_PREPARE_H
#define DTRAIN_PREPARE_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "io/corpus.h"
#include "io/tokenizer.h"

#define PREP_PROG "dtrain-prepare"
#define PREP_EXIT_USAGE 2 /* bad options or bad input data */
#define PREP_EXIT_IO 1    /* the outputs could not be written */
#define PREP_ERRLEN 1024
#define PREP_PATH_MAX 4096
#define PREP_STAGE_BYTES ((size_t)1 << 20) /* per split: the largest write */
/* A round ends at --round-docs documents or this many bytes of input (all
 * ranks together), whichever comes first: with the round's tokens (4
 * bytes each while held) this bounds a rank's memory. */
#define PREP_ROUND_BYTES ((uint64_t)32 << 20)

typedef enum { PREP_FORMAT_LLMC = 0, PREP_FORMAT_MEGATRON = 1 } prep_format_t;
extern const char *const prep_format_names[]; /* indexed by prep_format_t, NULL-terminated (--format) */
typedef enum { PREP_TRAIN = 0, PREP_VAL = 1, PREP_N_SPLITS = 2 } prep_split_t;

/* The resolved command line: typed, checked, identical on every rank. */
typedef struct prep_opts {
    const char *out;       /* output path prefix */
    const char *tokenizer; /* tokenizer spec (io/tokenizer.h) */
    int add_eos;           /* spm: EOS after each document */
    corpus_opts_t corpus;  /* input format, JSONL field, separator */
    char separator[256];   /* bytes of --doc-separator (corpus.separator points here) */
    prep_format_t format;  /* llmc | megatron */
    double val_fraction;   /* 0 <= F < 1, of documents */
    size_t shard_tokens;   /* llmc: at most this many tokens per shard */
    size_t round_docs;     /* at most this many documents a round (bounds memory, with PREP_ROUND_BYTES) */
    char *const *inputs;
    int n_inputs;
    const char *eval_mc; /* --eval-mc: the JSONL of multiple-choice examples (NULL: a corpus run) */
    int eval_mc_space;   /* --eval-mc-space: 1 encodes " " + ending */
} prep_opts_t;

/* One split's output while it is being written. */
typedef struct prep_stream {
    prep_split_t split;
    char tmp_path[PREP_PATH_MAX]; /* the token stream, renamed into place at the end */
    MPI_File fh;
    int open;
    int width;         /* bytes per token on disk: 2 or 4 */
    MPI_Offset base;   /* bytes before the first token: 1024 (llm.c header) or 0 */
    uint64_t n_tokens; /* global, so far */
    uint64_t n_docs;
    int32_t *doc_len; /* rank 0, megatron: tokens of each document (n_docs) */
    size_t doc_cap;
    int32_t max_id; /* largest id the format's dtype holds */
    /* Write combining: this rank's documents that follow one another in
     * the stream go out as one MPI_File_write_at, not one each. */
    void *stage;       /* PREP_STAGE_BYTES: narrowed tokens not yet written */
    size_t staged;     /* tokens in stage */
    uint64_t stage_at; /* token offset of stage's first token */
    /* Early writeback: this rank's bytes written since the last round
     * ended, [wb_lo, wb_hi), are handed to the kernel's writeback then, so
     * the final sync waits for one round's tokens, not all of them. */
    int wb_fd; /* -1: none */
    MPI_Offset wb_lo, wb_hi;
} prep_stream_t;

/* Everything a run holds: no globals. */
typedef struct prep_run {
    const prep_opts_t *o;
    int rank, nranks;
    tokenizer_t *tk;
    prep_stream_t stream[PREP_N_SPLITS];
    uint64_t n_docs;     /* documents seen, all splits */
    uint64_t text_bytes; /* bytes of text this rank tokenized */
    double t_start;
} prep_run_t;

/* prepare_docs.c: walk the corpus, tokenize, write. 0 ok; else the exit
 * status (the error line has been printed once). Collective. */
int prep_documents(prep_run_t *r);

/* prepare_mc.c: --eval-mc, the JSONL o->eval_mc to the eval file o->out
 * (io/evalmc.h) with r->tk, on rank 0; 0 or the exit status (its error
 * line printed once). Collective. */
int prep_eval_mc(prep_run_t *r);

/* prepare_split.c: when every input can be mapped, let the ranks share
 * finding the documents (each scans 1/N of the bytes) and give c the
 * feed of their spans. 1 done, 0 the inputs are streamed (some are
 * compressed or pipes), -1 with err (the same on every rank, or on the
 * rank that failed: agree on it). Collective. */
typedef struct prep_window prep_window_t;
int prep_window_attach(const prep_run_t *r, corpus_t *c, prep_window_t **w, char *err, size_t errlen);
void prep_window_free(prep_window_t *w);

/* prepare_out.c */
const char *prep_split_name(prep_split_t s);
int prep_streams_open(prep_run_t *r, char *err, size_t errlen); /* collective */
/* This rank's document (ids[0..n)) at global token offset `at` of split
 * s: staged, and written once the stage is full or the next document is
 * not adjacent. prep_stream_flush writes what is staged (end of a round). */
int prep_stream_write(prep_stream_t *st, uint64_t at, const int32_t *ids, size_t n, char *err, size_t errlen);
int prep_stream_flush(prep_stream_t *st, char *err, size_t errlen);
/* Start the writeback of what this rank wrote since the last call (end of
 * a round; advisory: the final sync is what is checked). */
void prep_stream_writeback(prep_stream_t *st);
void prep_streams_free(prep_run_t *r);
int prep_streams_finish(prep_run_t *r);   /* collective; 0 or exit status */
void prep_streams_abandon(prep_run_t *r); /* collective: remove temporaries */

/* Collective over the world: the first failing key (smallest; a document
 * index, or the rank) wins, and its rank's message is printed once by rank
 * 0. Returns 1 when any rank failed. */
int prep_agree(const prep_run_t *r, int failed, uint64_t key, const char *msg);

/* snprintf for one-line error messages (a path may be cut short; the
 * message still names it). */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
void prep_err(char *err, size_t errlen, const char *fmt, ...);

/* Abort the job on an MPI error that leaves nothing to agree on. */
void prep_mpi_check(int rc, const char *what);

#endif
