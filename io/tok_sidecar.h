/* The tokenizer sidecar: PREFIX.tokenizer.json beside the token files
 * dtrain-prepare writes (PREFIX_train_NNNNNN.bin, PREFIX_val.idx, ...). It
 * records which tokenizer made them, so dtrain can check that the model's
 * vocabulary covers the data and decode samples without being told again.
 *
 * Layout (JSON, one object, keys in this order; deterministic, so serial
 * and parallel preparation write the same bytes):
 *   {
 *     "format": "dtrain-tokenizer", "version": 1,
 *     "kind": "gpt2",                         byte | gpt2 | tiktoken | spm | hf
 *     "spec": "gpt2:/abs/tokenizers/gpt2",     what --tokenizer takes
 *     "vocab_path": "/abs/tokenizers/gpt2/encoder.json",   "" for byte
 *     "vocab_sha256": "196139...",             "" for byte
 *     "vocab_size": 50257,
 *     "doc_start": 50256, "doc_end": null,     null: none
 *     "special_tokens": [{"name": "<|endoftext|>", "id": 50256}],
 *     "data_format": "llmc", "token_bytes": 2,  llmc | megatron; 2 | 4
 *     "train": {"documents": 4, "tokens": 200000},
 *     "val": {"documents": 4, "tokens": 22000}
 *   }
 *
 * Errors: 0, or -1 with one line in err naming the file, the field and the
 * fix; nothing prints or exits.
 */
#ifndef DTRAIN_TOK_SIDECAR_H
#define DTRAIN_TOK_SIDECAR_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"

#define TOK_SIDECAR_SUFFIX ".tokenizer.json"
#define TOK_SIDECAR_VERSION 1

typedef struct tok_sidecar {
    char kind[16];                 /* byte | gpt2 | tiktoken | spm | hf */
    char spec[TOK_PATH_MAX];       /* canonical tokenizer spec (tokenizer_t.spec) */
    char vocab_path[TOK_PATH_MAX]; /* absolute path at prepare time ("" for byte): the last place looked */
    char vocab_sha256[65];
    int vocab_size;
    int32_t doc_start, doc_end;  /* TOK_NO_ID when none */
    char data_format[16];        /* "llmc" | "megatron" */
    int token_bytes;             /* 2 or 4 on disk */
    uint64_t docs[2], tokens[2]; /* [0] train, [1] val */
} tok_sidecar_t;

/* Zeroes s and fills its tokenizer fields from tk (kind, spec, vocabulary
 * path, sha256 and size, doc_start/doc_end); the caller sets the data fields. */
void tok_sidecar_from_tokenizer(tok_sidecar_t *s, const tokenizer_t *tk);

/* s as JSON text (the layout above), the special tokens' names and ids
 * taken from tk (none when tk is NULL). malloc'd, NUL-terminated; NULL
 * with err on failure (a path that is not valid UTF-8, out of memory). */
char *tok_sidecar_format(const tok_sidecar_t *s, const tokenizer_t *tk, char *err, size_t errlen);

/* Writes tok_sidecar_format's text to path atomically: path.tmp, fsync,
 * rename, fsync of the directory. */
int tok_sidecar_write(const char *path, const tok_sidecar_t *s, const tokenizer_t *tk, char *err, size_t errlen);

/* Parses and validates len bytes of JSON (no NUL needed) into s. err names
 * the field; the caller adds the file. Pure: the libFuzzer target. */
int tok_sidecar_parse(const char *json, size_t len, tok_sidecar_t *s, char *err, size_t errlen);

/* Reads and parses path; err names the file and the field. */
int tok_sidecar_read(const char *path, tok_sidecar_t *s, char *err, size_t errlen);

/* PREFIX.tokenizer.json into out; -1 if it does not fit. */
int tok_sidecar_path(const char *prefix, char *out, size_t outlen);

/* The sidecar of one data file: its prefix is the name less
 * _train_NNNNNN.bin, _val_NNNNNN.bin, _train.bin, _val.bin, _train.idx or
 * _val.idx (else less .bin). 0 when that sidecar exists (path in out), 1
 * when there is none, -1 when the name does not fit out. */
int tok_sidecar_find(const char *data_file, char *out, size_t outlen);

/* The same for a data glob (as --data takes it): the sidecar of the
 * bytewise-first file it matches (a pattern matching nothing is taken as
 * a plain path). */
int tok_sidecar_find_glob(const char *pattern, char *out, size_t outlen);

/* Opens the tokenizer s names, found by identity: the first file of the
 * recorded base name and sha256 beside the sidecar, in
 * $DTRAIN_TOKENIZERS/KIND/, in the build's DTRAIN_TOKENIZER_DIR/KIND/, or
 * at the recorded vocab_path (so data made on one machine trains on
 * another, and in a bundle). Its size and document start must equal the
 * recorded ones; a mismatch or no such file is one line naming where it
 * looked and the fix (--tokenizer SPEC). */
int tok_sidecar_open_tokenizer(const tok_sidecar_t *s, const char *sidecar_path, tokenizer_t **tk, char *err,
                               size_t errlen);

#endif
