/* The JSON answers: completions as OpenAI's legacy completions API
 * returns them (what lm-evaluation-harness's local-completions model
 * reads: choices[i].text, choices[i].logprobs.token_logprobs and
 * top_logprobs), the model list and the one-line errors. Each returns a
 * malloc'd string of one line, or NULL when out of memory. */
#ifndef DTRAIN_SERVE_RESPONSE_H
#define DTRAIN_SERVE_RESPONSE_H

#include <stddef.h>

#include "io/tokenizer.h"
#include "src/serve/request.h"
#include "src/serve/result.h"

/* {"id", "object": "text_completion", "created", "model", "choices":
 * [{"index", "text", "logprobs", "finish_reason"}], "usage"}. */
char *serve_completion_json(const serve_req_t *r, const serve_out_t *o, tokenizer_t *tk, const char *model,
                            unsigned long long id, long long created);

/* {"error": {"message", "type", "code"}}: the type from the status. */
char *serve_error_json(int status, const char *message);

/* {"object": "list", "data": [{"id", "object": "model", "created",
 * "owned_by": "dtrain", "max_model_len"}]}. */
char *serve_models_json(const char *model, int ctx, long long created);

/* Appends the text of ids[0..n) to out: runs of the tokenizer's ids
 * decoded together (a character may span tokens), an id beyond it (a
 * model's padded vocabulary rows) as "[token N]". 0, or -1 (out of
 * memory, or the tokenizer failed). */
int serve_decode(tokenizer_t *tk, const int32_t *ids, size_t n, tok_bytes_t *out);

/* The first byte of text[0..n) where one of r's stop sequences begins (the
 * earliest), or -1. */
long serve_stop_find(const serve_req_t *r, const char *text, size_t n);

#endif
