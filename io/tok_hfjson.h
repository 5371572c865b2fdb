/* The hf tokenizer kind: byte-level BPE from a Hugging Face tokenizer.json
 * (io/tok_hfjson.c says what is read and how). tok_hf.h is the other
 * direction: a gpt2/tiktoken/byte tokenizer written as tokenizer.json.
 */
#ifndef DTRAIN_TOK_HFJSON_H
#define DTRAIN_TOK_HFJSON_H

#include <stddef.h>

#include "io/tokenizer.h"

/* --tokenizer hf:PATH. PATH: a tokenizer.json, a directory holding one, or
 * NAME for tokdir/hf/NAME/tokenizer.json. tokenizer_config.json beside the
 * file, when there, names the document tokens. Canonical spec
 * "hf:/abs/tokenizer.json"; vocab_path and vocab_sha256 are the file's. */
int tok_hfjson_open(tokenizer_t *tk, const char *path, const char *tokdir, char *err, size_t errlen);

/* The same from memory (the fuzz harness): json[0..len) is tokenizer.json,
 * config[0..config_len) tokenizer_config.json or NULL; file names in
 * errors are label. On failure tk may hold a kind (tk->ops set): close it
 * with tk->ops->destroy. */
int tok_hfjson_open_mem(tokenizer_t *tk, const char *json, size_t len, const char *config, size_t config_len,
                        const char *label, char *err, size_t errlen);

/* What tokenizer_config.json beside the file said (dreshard --to-hf
 * writes it back and names the model's BOS/EOS from it): whether one was
 * read, and the ids of its bos_token and eos_token (TOK_NO_ID when absent
 * or null). tk must be an open tokenizer of the hf kind. */
void tok_hfjson_config(const tokenizer_t *tk, int *read, int32_t *bos, int32_t *eos);

#endif
