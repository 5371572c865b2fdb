/* A POST /v1/completions body (OpenAI's legacy completions request, as
 * lm-evaluation-harness's local-completions model sends it) checked and
 * turned into token ids. Pure (no MPI, no model): the libFuzzer target
 * fuzz/fuzz_serve_request.c. */
#ifndef DTRAIN_SERVE_REQUEST_H
#define DTRAIN_SERVE_REQUEST_H

#include <stddef.h>
#include <stdint.h>

#include "io/tokenizer.h"

#define SERVE_MAX_STOP 4         /* stop sequences per request, as OpenAI's */
#define SERVE_MAX_PROMPTS 65536  /* prompts per request */
#define SERVE_MAX_LOGPROBS 20    /* alternatives per position (MODEL_TOP_MAX) */
#define SERVE_DEFAULT_MAX_TOKENS 16
/* What one answer may hold: generated tokens, and log-probabilities
 * (scored positions x (logprobs + 1)); beyond them a request is refused
 * rather than an answer of gigabytes built */
#define SERVE_MAX_GENERATED (1 << 22)
#define SERVE_MAX_LOGPROB_ENTRIES (1 << 24)

typedef struct serve_limits {
    int vocab;              /* token ids are below it */
    int ctx;                /* prompt tokens + max_tokens at most */
    const char *model_name; /* "model" must be it (or absent, or null) */
} serve_limits_t;

typedef struct serve_req {
    int n;          /* prompts */
    int32_t *tok;   /* every prompt's ids, one after the other */
    int *off;       /* [n + 1]: prompt i is tok[off[i] .. off[i+1]) */
    int echo;       /* the prompt comes back in text (and logprobs) */
    int logprobs;   /* -1: none; else the alternatives per position, 0 to SERVE_MAX_LOGPROBS */
    int max_tokens; /* generated per prompt, at most */
    double temperature;
    int top_k;     /* 0: the whole vocabulary */
    int has_seed;  /* seed given; else the server's */
    uint64_t seed;
    int n_stop;
    char *stop[SERVE_MAX_STOP]; /* NUL-terminated copies; stop_len bytes each (no NUL inside) */
    size_t stop_len[SERVE_MAX_STOP];
} serve_req_t;

/* Parses body[0..len) into r (zeroed first; free it with serve_req_free
 * whatever the result). Text prompts are encoded with tk (NULL: text
 * prompts are refused). Returns 0, or the HTTP status of the refusal (400
 * malformed or out of bounds, 404 another model) with one line in err
 * naming the field and the fix. */
int serve_req_parse(serve_req_t *r, const char *body, size_t len, const serve_limits_t *lim, tokenizer_t *tk,
                    char *err, size_t errlen);
void serve_req_free(serve_req_t *r);

/* Appends the ids of text[0..len) to out as a Hugging Face tokenizer and
 * OpenAI's API read a prompt: each special token's text (GPT-2's
 * "<|endoftext|>") is that token, the rest is encoded as text. 0, or -1
 * with one line in err. */
int serve_encode(tokenizer_t *tk, const char *text, size_t len, tok_ids_t *out, char *err, size_t errlen);

#endif
