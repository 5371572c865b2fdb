/* libFuzzer harness: Hugging Face tokenizer.json files (io/tok_hfjson.c),
 * untrusted files users download, with the tokenizer_config.json beside
 * them, and the BPE core's merges-list mode and pattern chain behind them.
 *
 * Sources: fuzz/fuzz_hf_tokenizer.c io/tok_hfjson.c io/tok_bpe.c
 *   io/tokenizer.c io/tok_byte.c io/tok_gpt2.c io/tok_tiktoken.c fuzz/no_spm.c
 *   with PCRE2, Jansson, libcrypto and utf8proc:
 *   $(pkg-config --cflags --libs libpcre2-8 jansson libcrypto libutf8proc)
 *
 * Input: tokenizer.json, optionally followed by "\n\x01\n" and a
 * tokenizer_config.json.
 *   - a rejected pair gives one non-empty line of error;
 *   - an accepted one gives decode(encode(x)) == x for x = the input itself
 *     (any bytes) when its normalizer is not NFC, encodes without error
 *     otherwise, rejects the id vocab_size, decodes every special id to its
 *     name, and has document tokens inside the vocabulary. */
#define _GNU_SOURCE /* memmem */
#include "io/tok_hfjson.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_err(const char *err)
{
    if (err[0] == '\0' || strchr(err, '\n') != NULL) {
        fprintf(stderr, "error is not one non-empty line: '%s'\n", err);
        abort();
    }
}

static void round_trip(tokenizer_t *tk, const char *text, size_t len, int exact)
{
    char err[512] = "";
    tok_ids_t ids = {0};
    tok_bytes_t out = {0};
    if (tokenizer_encode(tk, text, len, &ids, err, sizeof err) != 0 ||
        tokenizer_decode(tk, ids.id, ids.n, &out, err, sizeof err) != 0) {
        fprintf(stderr, "encode/decode failed: %s\n", err);
        abort();
    }
    if (exact && (out.n != len || (len && memcmp(out.data, text, len) != 0))) {
        fprintf(stderr, "round trip: %zu bytes in, %zu out\n", len, out.n);
        abort();
    }
    for (size_t i = 0; i < ids.n; i++)
        if (ids.id[i] < 0 || ids.id[i] >= tk->vocab_size) {
            fprintf(stderr, "id %d outside the vocabulary %d\n", (int)ids.id[i], tk->vocab_size);
            abort();
        }
    out.n = 0;
    const int32_t bad = tk->vocab_size;
    if (tokenizer_decode(tk, &bad, 1, &out, err, sizeof err) == 0) {
        fprintf(stderr, "id %d outside the vocabulary decoded\n", (int)bad);
        abort();
    }
    check_err(err);
    free(ids.id);
    free(out.data);
}

static void check_specials(tokenizer_t *tk)
{
    char err[512] = "";
    for (int i = 0; i < tk->n_special; i++) {
        tok_bytes_t out = {0};
        if (tokenizer_decode(tk, &tk->special_id[i], 1, &out, err, sizeof err) != 0 || out.data == NULL) {
            fprintf(stderr, "special id %d does not decode: %s\n", (int)tk->special_id[i], err);
            abort();
        }
        free(out.data);
    }
    if (tk->doc_start >= tk->vocab_size || tk->doc_end >= tk->vocab_size) {
        fprintf(stderr, "document tokens %d %d outside the vocabulary %d\n", (int)tk->doc_start, (int)tk->doc_end,
                tk->vocab_size);
        abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *json = (const char *)data, *cfg = NULL;
    size_t json_len = size, cfg_len = 0;
    const char *sep = memmem(data, size, "\n\x01\n", 3);
    if (sep) {
        json_len = (size_t)(sep - json);
        cfg = sep + 3;
        cfg_len = size - json_len - 3;
    }
    tokenizer_t *tk = calloc(1, sizeof *tk);
    if (tk == NULL)
        return 0;
    tk->doc_start = tk->doc_end = TOK_NO_ID;
    char err[512] = "";
    if (tok_hfjson_open_mem(tk, json, json_len, cfg, cfg_len, "fuzz/tokenizer.json", err, sizeof err) != 0) {
        check_err(err);
    } else {
        check_specials(tk);
        round_trip(tk, (const char *)data, size, memmem(json, json_len, "\"NFC\"", 5) == NULL);
    }
    tokenizer_close(tk); /* destroys the kind's state even after a refusal */
    return 0;
}
