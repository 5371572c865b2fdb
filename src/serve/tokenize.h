/* The tokenizer endpoints vLLM's server has and lm-evaluation-harness's
 * remote tokenizer backend uses (tokenizer_backend=remote, which its
 * "auto" picks when GET /tokenizer_info and POST /tokenize answer), so the
 * harness tokenizes with the server's own tokenizer, whatever its kind:
 *   GET  /tokenizer_info  {"eos_token", "bos_token", "pad_token", "model_max_length", "tokenizer_class"}
 *   POST /tokenize        {"prompt": TEXT, "add_special_tokens": BOOL} -> {"tokens", "count", "max_model_len"}
 *   POST /detokenize      {"tokens": [IDS]} -> {"prompt": TEXT}
 * Pure (no MPI): the fuzz harness calls them too. */
#ifndef DTRAIN_SERVE_TOKENIZE_H
#define DTRAIN_SERVE_TOKENIZE_H

#include <stddef.h>

#include "io/tokenizer.h"

/* The answers of /tokenize and /detokenize for body[0..len): 0 with *json
 * (malloc'd, one line; NULL when out of memory), or 400 with one line in
 * err. ctx: the context length; vocab: the model's vocabulary. */
int serve_tokenize(const char *body, size_t len, tokenizer_t *tk, int ctx, char **json, char *err, size_t errlen);
int serve_detokenize(const char *body, size_t len, tokenizer_t *tk, int vocab, char **json, char *err, size_t errlen);

/* GET /tokenizer_info's answer: the document end (else start) token's text
 * as eos_token, the document start's as bos_token (null where the
 * tokenizer has none). */
char *serve_tokenizer_info_json(const tokenizer_t *tk, int ctx);

#endif
