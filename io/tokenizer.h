/* Tokenizers: text bytes <-> token ids.
 *
 * One small interface, one file per kind (IOR's aiori.h is the model):
 *   io/tok_byte.c      byte       id = byte value, vocabulary 256
 *   io/tok_bpe.c       the byte-level BPE core shared by gpt2 and tiktoken
 *                      (PCRE2 pre-tokenisation, rank-ordered merges, a
 *                      pre-token -> ids cache in front of the merge loop)
 *   io/tok_gpt2.c      gpt2       OpenAI's encoder.json + vocab.bpe
 *   io/tok_tiktoken.c  tiktoken   a tiktoken rank file (base64 token, rank)
 *                      with a named encoding (pattern and special tokens)
 *   io/tok_spm.cc      spm        a SentencePiece model (C++ library behind
 *                      an extern "C" wrapper)
 *   io/tok_hfjson.c    hf         a Hugging Face tokenizer.json holding a
 *                      byte-level BPE (Llama 3, Qwen2/3, DeepSeek-V3, GPT-2)
 *
 * Spec strings, as `--tokenizer` takes them:
 *   byte | gpt2 | gpt2:DIR | tiktoken:FILE | tiktoken:FILE:ENCODING | spm:MODEL
 *   | hf:TOKENIZER_JSON | hf:DIR | hf:NAME
 * gpt2 reads DIR/encoder.json and DIR/vocab.bpe; DIR defaults to
 * $DTRAIN_TOKENIZERS/gpt2, else the directory configure was given
 * (DTRAIN_TOKENIZER_DIR). A tiktoken ENCODING (r50k_base, cl100k_base,
 * o200k_base, llama3) names the split pattern and the special tokens; it
 * defaults to the rank file's base name without ".tiktoken".
 *
 * Encoding is "ordinary": the text of a special token (say "<|endoftext|>")
 * is encoded as text, never as the special id; special ids enter the stream
 * only where the caller puts them (doc_start / doc_end around documents).
 * The hf kind is the exception, as its file says: tokenizer.json's added
 * tokens are matched in the text before BPE (as Hugging Face's tokenizers
 * and transformers.js do), and BPE never produces them otherwise.
 *
 * Errors: functions return 0, or -1 with one line in err (naming the file
 * and the fix); nothing prints or exits. Not thread-safe: one tokenizer per
 * thread (the BPE cache is mutable).
 */
#ifndef DTRAIN_TOKENIZER_H
#define DTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

/* A growable array of ids; start zeroed, free with free(v->id). */
typedef struct tok_ids {
    int32_t *id;
    size_t n, cap;
} tok_ids_t;

/* A growable byte buffer; start zeroed, free with free(b->data). */
typedef struct tok_bytes {
    char *data;
    size_t n, cap;
} tok_bytes_t;

typedef struct tokenizer tokenizer_t;

/* What each kind implements (designated initializers in its own file). */
typedef struct tokenizer_ops {
    const char *kind; /* "byte", "gpt2", "tiktoken", "spm", "hf" */
    /* Append the ids of text[0..len) to out. Any bytes are accepted
     * (invalid UTF-8, NUL included) for the byte-level kinds. */
    int (*encode)(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);
    /* Append the bytes of ids[0..n) to out; an id outside the vocabulary
     * is an error. Special tokens decode to their text. */
    int (*decode)(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen);
    void (*destroy)(tokenizer_t *tk);
} tokenizer_ops_t;

#define TOK_NO_ID (-1)
#define TOK_PATH_MAX 4096

struct tokenizer {
    const tokenizer_ops_t *ops;
    int vocab_size;                /* every id is < vocab_size (special tokens included) */
    int32_t doc_start;             /* id placed before each document (GPT-2 <|endoftext|>, spm BOS) or TOK_NO_ID */
    int32_t doc_end;               /* id placed after each document (spm EOS when asked for) or TOK_NO_ID */
    const char *doc_sep;           /* byte kind only: text appended to a document not ending in '\n' ("\n\n") */
    char spec[TOK_PATH_MAX];       /* canonical spec, e.g. "tiktoken:/abs/cl100k_base.tiktoken:cl100k_base" */
    char vocab_path[TOK_PATH_MAX]; /* absolute path of the main vocabulary/model file ("" for byte) */
    char vocab_sha256[65];         /* its sha256, lower-case hex ("" for byte) */
    char *const *special_name;     /* names of the special tokens, n_special of them */
    const int32_t *special_id;
    int n_special;
    void *impl; /* the kind's own state */
};

/* Open the tokenizer named by spec. spm_add_eos asks SentencePiece
 * tokenizers for an EOS after each document (ignored by nothing: other kinds
 * refuse it with an error). */
int tokenizer_open(tokenizer_t **tk, const char *spec, int spm_add_eos, char *err, size_t errlen);
void tokenizer_close(tokenizer_t *tk);

/* Convenience wrappers over tk->ops. */
int tokenizer_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);
int tokenizer_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out, char *err, size_t errlen);

/* Growable-array helpers; -1 on out of memory. */
int tok_ids_push(tok_ids_t *v, int32_t id);
int tok_ids_reserve(tok_ids_t *v, size_t extra);
int tok_bytes_append(tok_bytes_t *b, const void *data, size_t n);

/* The tokenizer directory configure was given (DTRAIN_TOKENIZER_DIR),
 * whatever $DTRAIN_TOKENIZERS says. */
const char *tokenizer_builtin_dir(void);

/* sha256 of a file as 64 lower-case hex digits + NUL. */
int tok_file_sha256(const char *path, char hex[65], char *err, size_t errlen);

/* Per-kind constructors, called by tokenizer_open (arg: what follows "kind:"). */
int tok_byte_open(tokenizer_t *tk, char *err, size_t errlen);
int tok_gpt2_open(tokenizer_t *tk, const char *dir, char *err, size_t errlen);
int tok_tiktoken_open(tokenizer_t *tk, const char *file, const char *encoding, char *err, size_t errlen);
int tok_spm_open(tokenizer_t *tk, const char *model, int add_eos, char *err, size_t errlen);

#endif
