/* A byte-level BPE tokenizer (the gpt2 and tiktoken kinds, and the byte
 * kind: 256 tokens, no merges, no split pattern) as Hugging Face's
 * tokenizer.json, the serialisation of the `tokenizers` library
 * that PreTrainedTokenizerFast, tokenizers.js and vLLM load:
 *
 *   added_tokens    the special tokens (special, not normalized)
 *   pre_tokenizer   Sequence [Split (the pattern, Isolated),
 *                   ByteLevel (no prefix space, no regex of its own)]
 *   model           BPE, ignore_merges (a whole piece in the vocabulary is
 *                   one token, as tiktoken does), vocab in rank order,
 *                   merges derived from the ranks
 *   decoder         ByteLevel
 *
 * Needs the tokenizers library 0.19 or later (transformers 4.40): older
 * ones do not know ignore_merges or ByteLevel's use_regex and would
 * tokenize differently without an error. No post-processor: no BOS is
 * added by the tokenizer (dtrain-prepare put doc_start before documents).
 * Tokens are written in GPT-2's byte-to-unicode alphabet (byte b is one
 * printable code point). A tiktoken rank file holds no merges: the merge
 * that makes token t is what BPE over t's bytes reaches with ranks below
 * t's own (tiktoken's own rule), which must leave exactly two parts.
 * The pattern is in the Oniguruma syntax the Rust library compiles (not
 * dtrain's PCRE2 spelling): tok_hf_pattern gives it.
 *
 * Returns 0 and a malloc'd JSON text, or -1 with one line in err. */
#ifndef DTRAIN_TOK_HF_H
#define DTRAIN_TOK_HF_H

#include "io/tokenizer.h"

int tok_hf_tokenizer_json(const tokenizer_t *tk, const char *pattern, char **json, char *err, size_t errlen);

/* The pre-tokenizer pattern of a gpt2 tokenizer (r50k_base's) or of a
 * tiktoken tokenizer's encoding (from its spec, "tiktoken:FILE:ENCODING"),
 * as tiktoken and Hugging Face write it; NULL for another kind. (It lives
 * in io/tok_tiktoken.c beside the PCRE2 spellings.) */
const char *tok_hf_pattern(const tokenizer_t *tk);

#endif
